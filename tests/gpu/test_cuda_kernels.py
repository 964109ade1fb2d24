"""CUDA kernels against their host mirror (bit for bit) and against gguf-py's dequantization.

The device matrix-vector kernel must give the same bits as the host mirror (that is what lets a
decode miss run on the host without changing the reply) and the right values (checked against
gguf-py's dequantize in float64).
"""

from __future__ import annotations

import ctypes

import numpy as np
import pytest

from tests.gpu._cuda_util import cuda_lib, random_rows

pytestmark = pytest.mark.gpu

TYPES = {"F32": 0, "F16": 1, "BF16": 30, "Q8_0": 8, "Q4_0": 2, "Q4_K": 12, "Q6_K": 14}


def _run(lib, type_id, w, rows, cols, x):
    n = x.shape[0]
    y = np.full((n, rows), np.nan, dtype=np.float32)
    st = lib.strata_cuda_matvec(
        type_id,
        w.ctypes.data_as(ctypes.c_void_p),
        rows,
        cols,
        x.ctypes.data_as(ctypes.c_void_p),
        n,
        y.ctypes.data_as(ctypes.c_void_p),
    )
    assert st == 0, f"strata_cuda_matvec failed with status {st}"
    return y


def _mirror(lib, type_id, w, rows, cols, x1):
    y = np.full(rows, np.nan, dtype=np.float32)
    st = lib.strata_cuda_mirror_matvec(
        type_id,
        w.ctypes.data_as(ctypes.c_void_p),
        rows,
        cols,
        x1.ctypes.data_as(ctypes.c_void_p),
        y.ctypes.data_as(ctypes.c_void_p),
    )
    assert st == 0
    return y


def _quantized_activations(x: np.ndarray) -> np.ndarray:
    """What Q8_0/Q4_0 weights are multiplied with: x rounded to 8 bits per block of 32, as the engine does
    (scale max|x|/127 stored as f16, values rounded half away from zero)."""
    b = x.reshape(x.shape[0], -1, 32).astype(np.float32)
    d = np.abs(b).max(axis=2, keepdims=True) / np.float32(127)
    inv = np.where(d != 0, np.float32(1) / np.where(d != 0, d, 1), 0).astype(np.float32)
    v = b * inv
    q = np.sign(v) * np.floor(np.abs(v) + 0.5)
    return (q * d.astype(np.float16).astype(np.float32)).reshape(x.shape)


@pytest.mark.parametrize("name", list(TYPES))
@pytest.mark.parametrize("rows,cols", [(64, 256), (300, 2048), (7, 768)])
def test_matvec_matches_mirror_and_reference(name, rows, cols):
    lib = cuda_lib()
    if name in ("Q4_K", "Q6_K") and cols % 256:
        pytest.skip("K-quants need rows of whole 256-value blocks")
    rng = np.random.default_rng(rows * 7 + cols)
    w, dense = random_rows(name, rows, cols, rng)
    x = rng.standard_normal((11, cols)).astype(np.float32)
    y = _run(lib, TYPES[name], w, rows, cols, x)
    assert np.isfinite(y).all(), "every output written and finite"
    # bit-exact against the host mirror, token by token (so also independent of the batch size)
    for t in range(x.shape[0]):
        ym = _mirror(lib, TYPES[name], w, rows, cols, np.ascontiguousarray(x[t]))
        bad = np.nonzero(y[t].view(np.uint32) != ym.view(np.uint32))[0]
        assert bad.size == 0, f"{name}: token {t} row {bad[0]} device {y[t, bad[0]]!r} mirror {ym[bad[0]]!r}"
    # one token alone gives the same bits as inside a batch
    y1 = _run(lib, TYPES[name], w, rows, cols, np.ascontiguousarray(x[3:4]))
    assert (y1[0].view(np.uint32) == y[3].view(np.uint32)).all()
    xr = _quantized_activations(x) if name in ("Q8_0", "Q4_0") else x
    ref = xr.astype(np.float64) @ dense.astype(np.float64).T
    err = np.linalg.norm(y - ref) / np.linalg.norm(ref)
    assert err < 1e-5, f"{name}: relative error {err:.2e} against the float64 reference"
