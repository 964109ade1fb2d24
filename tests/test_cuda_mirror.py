"""The host mirror of the CUDA matrix-vector kernel, checked on any machine.

On an H200 the device kernel equals this mirror bit for bit (tests/gpu/test_cuda_kernels.py); here the
mirror itself is checked against gguf-py's dequantization in float64, so a decode miss run on the host
(--miss host on the GPU backend) computes the right thing even where no GPU is present.
"""

from __future__ import annotations

import ctypes

import numpy as np
import pytest

from strata import _cdefs as C
from tests.gpu._cuda_util import random_rows
from tests.gpu.test_cuda_kernels import TYPES, _quantized_activations


def _mirror(fn, type_: int, w: np.ndarray, rows: int, cols: int, x: np.ndarray) -> tuple[int, np.ndarray]:
    """Status and y of a host mirror entry point (strata_cuda_mirror_matvec or _mmq) for one token x."""
    fp = ctypes.POINTER(ctypes.c_float)
    y = np.full(rows, np.nan, dtype=np.float32)
    st = fn(type_, w.ctypes.data_as(ctypes.c_void_p), rows, cols, x.ctypes.data_as(fp), y.ctypes.data_as(fp))
    return st, y


@pytest.mark.parametrize("name", list(TYPES))
def test_mirror_matches_reference(name):
    rows, cols = 48, 512
    rng = np.random.default_rng(7)
    w, dense = random_rows(name, rows, cols, rng)
    x = rng.standard_normal(cols).astype(np.float32)
    st, y = _mirror(C.strata_cuda_mirror_matvec, TYPES[name], w, rows, cols, x)
    assert st == 0
    xr = _quantized_activations(x[None, :])[0] if name in ("Q8_0", "Q4_0") else x
    ref = dense.astype(np.float64) @ xr.astype(np.float64)
    err = np.linalg.norm(y - ref) / np.linalg.norm(ref)
    assert err < 1e-5, f"{name}: relative error {err:.2e}; worst row {int(np.argmax(np.abs(y - ref)))}"


def test_mirror_rejects_bad_shapes():
    w = np.zeros(100, dtype=np.uint8)
    x = np.zeros(100, dtype=np.float32)
    y = np.zeros(4, dtype=np.float32)
    fp = ctypes.POINTER(ctypes.c_float)
    # Q4_K rows must be whole 256-value blocks
    st = C.strata_cuda_mirror_matvec(
        12, w.ctypes.data_as(ctypes.c_void_p), 4, 100, x.ctypes.data_as(fp), y.ctypes.data_as(fp)
    )
    assert st == 1


@pytest.mark.parametrize("name", ["Q8_0", "Q4_0", "Q4_K", "Q6_K"])
def test_mmq_mirror_matches_reference(name):
    """The host copy of the prompt product (cuda/mmq.cu): right values, and the same exact block
    products as the matrix-vector mirror, summed in another order (so close, not equal)."""
    rows, cols = 40, 768
    rng = np.random.default_rng(5)
    w, dense = random_rows(name, rows, cols, rng)
    w = np.ascontiguousarray(w)
    x = rng.standard_normal(cols).astype(np.float32)
    st, y = _mirror(C.strata_cuda_mirror_mmq, TYPES[name], w, rows, cols, x)
    assert st == 0
    ref = dense.astype(np.float64) @ _quantized_activations(x[None, :])[0].astype(np.float64)
    err = np.linalg.norm(y - ref) / np.linalg.norm(ref)
    assert err < 1e-5, f"{name}: relative error {err:.2e}; worst row {int(np.argmax(np.abs(y - ref)))}"
    if name in ("Q4_K", "Q6_K"):
        return  # the matrix-vector mirror multiplies K-quants with float activations
    st, ym = _mirror(C.strata_cuda_mirror_matvec, TYPES[name], w, rows, cols, x)
    assert st == 0
    assert np.abs(y - ym).max() <= 1e-5 * np.abs(ym).max()
    # only the weight types whose activations are 8-bit blocks
    assert _mirror(C.strata_cuda_mirror_mmq, TYPES["F16"], w, rows, cols, x)[0] == 1
