"""Helpers for the CUDA kernel tests: the library with the CUDA entry points, random quantized rows."""

from __future__ import annotations

import ctypes
import os
from pathlib import Path

import numpy as np
import pytest

_ROOT = Path(__file__).resolve().parents[2]


def cuda_lib() -> ctypes.CDLL:
    """libstrata with its CUDA test entry points declared; skips when no CUDA device is usable."""
    path = os.environ.get("STRATA_LIB") or str(_ROOT / "strata" / "lib" / "libstrata.so")
    lib = ctypes.CDLL(path)
    for name, args in {
        "strata_cuda_matvec": [
            ctypes.c_int32,
            ctypes.c_void_p,
            ctypes.c_int64,
            ctypes.c_int64,
            ctypes.c_void_p,
            ctypes.c_int64,
            ctypes.c_void_p,
        ],
        "strata_cuda_mirror_matvec": [
            ctypes.c_int32,
            ctypes.c_void_p,
            ctypes.c_int64,
            ctypes.c_int64,
            ctypes.c_void_p,
            ctypes.c_void_p,
        ],
        "strata_cuda_bench_matvec": [
            ctypes.c_int32,
            ctypes.c_void_p,
            ctypes.c_int64,
            ctypes.c_int64,
            ctypes.c_int64,
            ctypes.c_int32,
            ctypes.POINTER(ctypes.c_double),
        ],
    }.items():
        fn = getattr(lib, name)
        fn.argtypes = args
        fn.restype = ctypes.c_int
    lib.strata_cuda_available.restype = ctypes.c_int32
    if not lib.strata_cuda_available():
        pytest.skip("no CUDA device")
    return lib


def attention(
    lib: ctypes.CDLL,
    name: str,
    kv_type: int,
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    T: int,
    H: int,
    Hkv: int,
    hd: int,
    on_device: int = 0,
) -> tuple[int, np.ndarray]:
    """Run ``strata_cuda_attention`` or ``strata_cuda_flash_attention`` (``name``): the last T of k's positions
    attending over the cache made of k and v. Returns (status, out [T, H * hd]; NaN where not written)."""
    out = np.full((T, H * hd), np.nan, dtype=np.float32)
    fn = getattr(lib, name)
    fn.argtypes = [ctypes.c_int32] + [ctypes.c_void_p] * 3 + [ctypes.c_int32] * 6 + [ctypes.c_void_p]
    fn.restype = ctypes.c_int
    ptr = lambda a: a.ctypes.data_as(ctypes.c_void_p)  # noqa: E731
    st = fn(kv_type, ptr(q), ptr(k), ptr(v), k.shape[0], T, H, Hkv, hd, on_device, ptr(out))
    return st, out


def _f16_bytes(v: np.ndarray) -> np.ndarray:
    return v.astype(np.float16).view(np.uint8).reshape(-1, 2)


# f16 scale fields (byte offsets in a block) of the block types, for random_rows: a random f16 there could be
# inf or NaN. The first gets either sign, the others (minimums) are positive.
SCALE_AT = {
    "Q4_1": [0, 2],
    "Q5_0": [0],
    "Q5_1": [0, 2],
    "IQ4_NL": [0],
    "Q2_K": [80, 82],
    "Q3_K": [108],
    "Q5_K": [0, 2],
    "IQ4_XS": [0],
    "IQ3_XXS": [0],
    "IQ3_S": [0],
    "IQ2_XS": [0],
    "IQ2_XXS": [0],
    "IQ2_S": [0],
    "IQ1_S": [0],
}
# the types added to the CUDA kernels after the first seven (GQ_NEW_TYPES in native/src/group_dequant.h)
NEW_TYPES = {
    "Q4_1": 3,
    "Q5_0": 6,
    "Q5_1": 7,
    "IQ4_NL": 20,
    "MXFP4": 39,
    "Q2_K": 10,
    "Q3_K": 11,
    "Q5_K": 13,
    "IQ4_XS": 23,
    "IQ3_XXS": 18,
    "IQ3_S": 21,
    "IQ2_XS": 17,
    "IQ2_XXS": 16,
    "IQ2_S": 22,
    "IQ1_S": 19,
    "IQ1_M": 29,
}


def random_rows(name: str, rows: int, cols: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Random rows of a type as raw bytes [rows, row_bytes] and their values [rows, cols] (float32).

    The values come from gguf-py's dequantize, written independently of strata's kernels.
    """
    import gguf
    from gguf.quants import dequantize

    qt = getattr(gguf.GGMLQuantizationType, name)
    if name in ("F32", "F16", "BF16"):
        dense = rng.standard_normal((rows, cols)).astype(np.float32)
        if name == "F32":
            return dense.view(np.uint8).reshape(rows, -1).copy(), dense
        if name == "F16":
            h = dense.astype(np.float16)
            return h.view(np.uint8).reshape(rows, -1).copy(), h.astype(np.float32)
        b = (dense.view(np.uint32) >> 16).astype(np.uint16)
        return b.view(np.uint8).reshape(rows, -1).copy(), (b.astype(np.uint32) << 16).view(np.float32)
    blk, bb = gguf.GGML_QUANT_SIZES[qt]
    nb = rows * cols // blk
    raw = rng.integers(0, 256, size=(nb, bb), dtype=np.uint8)
    scale = lambda n: _f16_bytes(rng.uniform(0.001, 0.05, n) * rng.choice([-1, 1], n))  # noqa: E731
    if name in ("Q8_0", "Q4_0"):
        raw[:, 0:2] = scale(nb)
    elif name == "Q4_K":
        raw[:, 0:2] = _f16_bytes(rng.uniform(0.001, 0.05, nb))
        raw[:, 2:4] = _f16_bytes(rng.uniform(0.001, 0.05, nb))
    elif name == "Q6_K":
        raw[:, 208:210] = scale(nb)
    elif name == "MXFP4":
        raw[:, 0] = rng.integers(118, 130, nb)  # scales 2^-10 .. 2^1
    elif name == "IQ1_M":
        # the f16 d is spread over the top nibbles of the four scale words (bytes 49, 51, 53, 55)
        d = np.abs(rng.uniform(0.001, 0.05, nb)).astype(np.float16).view(np.uint16)
        for i in range(4):
            nib = ((d >> (4 * i)) & 0xF).astype(np.uint8)
            raw[:, 49 + 2 * i] = (raw[:, 49 + 2 * i] & 0x0F) | (nib << 4)
    else:
        for off in SCALE_AT[name]:
            raw[:, off : off + 2] = (
                scale(nb) if off == SCALE_AT[name][0] else _f16_bytes(rng.uniform(0.001, 0.05, nb))
            )
    w = raw.reshape(rows, -1)
    dense = dequantize(w, qt).reshape(rows, cols).astype(np.float32)
    return w, dense
