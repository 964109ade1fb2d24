"""CUDA kernels against their host mirror (bit for bit) and against gguf-py's dequantization.

The device matrix-vector kernel must give the same bits as the host mirror (that is what lets a
decode miss run on the host without changing the reply) and the right values (checked against
gguf-py's dequantize in float64).
"""

from __future__ import annotations

import ctypes

import numpy as np
import pytest

from tests.gpu._cuda_util import attention, cuda_lib, random_rows

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
# K-quants one token: k_matvec_kq, 2 rows per warp (1 and 7 rows: a warp's second row past the end), Q6_K
# rows of 210 and 630 bytes (2-byte aligned) and 1680 (4-byte aligned)
@pytest.mark.parametrize("rows,cols", [(64, 256), (300, 2048), (7, 768), (1, 512)])
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


def _router_reference(logits: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Top-k by a serial scan (a strictly greater logit replaces the best, so a tie keeps the lower id),
    weights = exp(l - max) over the chosen k, summed in k order, then divided."""
    T, E = logits.shape
    ids = np.zeros((T, k), dtype=np.int32)
    wts = np.zeros((T, k), dtype=np.float32)
    for t in range(T):
        taken: list[int] = []
        for _ in range(k):
            best = -1
            for e in range(E):
                if e not in taken and (best < 0 or logits[t, e] > logits[t, best]):
                    best = e
            taken.append(best)
        ids[t] = taken
        v = logits[t, taken].astype(np.float32)
        ex = np.exp(v - v[0]).astype(np.float32)
        s = np.float32(0)
        for x in ex:
            s = np.float32(s + x)
        wts[t] = ex / s
    return ids, wts


@pytest.mark.parametrize("with_segments", [0, 1])
@pytest.mark.parametrize("E,K,T", [(128, 8, 37), (60, 4, 5), (8, 2, 3), (256, 8, 1)])
def test_router_topk_matches_serial_scan(E, K, T, with_segments):
    lib = cuda_lib()
    rng = np.random.default_rng(E * 100 + K * 10 + T)
    # few distinct values, so ties are common; some -inf, and one row with every logit equal
    logits = rng.integers(-3, 4, size=(T, E)).astype(np.float32) * np.float32(0.5)
    logits[rng.random((T, E)) < 0.05] = -np.inf
    logits[0, :] = 1.25
    ids = np.full((T, K), -7, dtype=np.int32)
    wts = np.full((T, K), np.nan, dtype=np.float32)
    fn = lib.strata_cuda_router_topk
    fn.argtypes = [
        ctypes.c_void_p,
        ctypes.c_int32,
        ctypes.c_int32,
        ctypes.c_int32,
        ctypes.c_void_p,
        ctypes.c_void_p,
        ctypes.c_int32,
    ]
    fn.restype = ctypes.c_int
    st = fn(
        logits.ctypes.data_as(ctypes.c_void_p),
        T,
        E,
        K,
        ids.ctypes.data_as(ctypes.c_void_p),
        wts.ctypes.data_as(ctypes.c_void_p),
        with_segments,
    )
    assert st == 0, f"strata_cuda_router_topk failed with status {st}"
    ref_ids, ref_w = _router_reference(logits, K)
    bad = np.argwhere(ids != ref_ids)
    assert bad.size == 0, (
        f"token {bad[0][0]}: device picked {ids[bad[0][0]].tolist()}, serial scan {ref_ids[bad[0][0]].tolist()}"
    )
    assert np.allclose(wts, ref_w, rtol=2e-6, atol=0), f"weights {wts[0]} vs {ref_w[0]}"
    assert np.allclose(wts.sum(axis=1), 1.0, rtol=1e-5)


def _attention(lib, kv_type, q, k, v, T, H, Hkv, hd, on_device=0):
    st, out = attention(lib, "strata_cuda_attention", kv_type, q, k, v, T, H, Hkv, hd, on_device)
    assert st == 0, f"strata_cuda_attention failed with status {st}"
    return out


def _stored(x: np.ndarray, kv_type: int) -> np.ndarray:
    """What the KV cache holds: f16, or int8 per block of 32 with scale max|x|/127 (round half to even)."""
    if kv_type == 0:
        return x.astype(np.float16).astype(np.float64)
    b = x.reshape(x.shape[0], -1, 32).astype(np.float32)
    d = np.abs(b).max(axis=2, keepdims=True) / np.float32(127)
    inv = np.where(d > 0, np.float32(1) / np.where(d > 0, d, 1), 0).astype(np.float32)
    return (np.rint(b * inv) * d).reshape(x.shape).astype(np.float64)


@pytest.mark.parametrize("kv_type", [0, 1])
@pytest.mark.parametrize(
    "hd,H,Hkv,n_pos,T", [(128, 8, 2, 100, 9), (64, 4, 4, 300, 5), (256, 2, 1, 40, 40), (32, 2, 1, 1, 1)]
)
def test_attention_matches_reference_and_ignores_batch(kv_type, hd, H, Hkv, n_pos, T):
    lib = cuda_lib()
    rng = np.random.default_rng(hd + n_pos + T)
    q = rng.standard_normal((T, H * hd)).astype(np.float32)
    k = rng.standard_normal((n_pos, Hkv * hd)).astype(np.float32)
    v = rng.standard_normal((n_pos, Hkv * hd)).astype(np.float32)
    out = _attention(lib, kv_type, q, k, v, T, H, Hkv, hd)
    ks, vs = _stored(k, kv_type), _stored(v, kv_type)
    ref = np.zeros((T, H * hd))
    for t in range(T):
        p = n_pos - T + t
        for h in range(H):
            kh = h // (H // Hkv)
            s = (
                ks[: p + 1, kh * hd : (kh + 1) * hd]
                @ q[t, h * hd : (h + 1) * hd].astype(np.float64)
                / np.sqrt(hd)
            )
            w = np.exp(s - s.max())
            ref[t, h * hd : (h + 1) * hd] = (w / w.sum()) @ vs[: p + 1, kh * hd : (kh + 1) * hd]
    err = np.abs(out - ref).max() / np.abs(ref).max()
    assert err < 1e-5, f"relative error {err:.2e} against the float64 reference"
    # a query's output depends on its position and the cache only: alone (as in decode) == in the chunk,
    # and with the position read from device memory (as a captured graph does)
    for t in range(T):
        p = n_pos - T + t
        one = _attention(
            lib, kv_type, np.ascontiguousarray(q[t : t + 1]), k[: p + 1], v[: p + 1], 1, H, Hkv, hd
        )
        assert (one.view(np.uint32) == out[t : t + 1].view(np.uint32)).all(), f"query {t} alone differs"
    dev = _attention(lib, kv_type, q, k, v, T, H, Hkv, hd, on_device=1)
    assert (dev.view(np.uint32) == out.view(np.uint32)).all(), "position through device memory differs"
