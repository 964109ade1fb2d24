"""The base weight types' kernels (F32, F16, BF16, Q8_0) at every SIMD level this CPU has.

Dequantization is compared bit for bit with gguf-py's; products with a NumPy computation (weights
dequantized by gguf-py, activations quantized to Q8_0 as the format defines for Q8_0 weights) under a
declared tolerance; and a row's result must not depend on how many rows or tokens are computed with
it, nor on the thread count (the determinism that the engine's logits rely on).
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest
from gguf import GGMLQuantizationType as QT
from gguf.quants import dequantize as gg_dequantize
from gguf.quants import quantize as gg_quantize

from strata import StrataError
from strata import _engine as K

pytestmark = pytest.mark.asan

TYPES = [QT.F32, QT.F16, QT.BF16, QT.Q8_0]
LEVELS = ["scalar", "avx2", "avx512"]


def supported(level: str) -> bool:
    feats = K.cpu_features().split()
    if level == "avx2":
        return {"avx2", "fma", "f16c"} <= set(feats)
    if level == "avx512":
        return {"avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512vnni"} <= set(feats)
    return True


@pytest.fixture(params=LEVELS)
def level(request: pytest.FixtureRequest) -> Iterator[str]:
    if not supported(request.param):
        pytest.skip(f"this CPU has no {request.param}")
    K.simd_set(request.param)
    yield request.param
    K.simd_set("auto")


def weights(t: QT, rows: int, cols: int, seed: int = 0) -> tuple[bytes, np.ndarray]:
    """Random weights of type t as file bytes, and their exact float values."""
    w = np.random.default_rng(seed).standard_normal((rows, cols)).astype(np.float32)
    if t == QT.F32:
        raw = w.tobytes()
    elif t == QT.F16:
        raw = w.astype(np.float16).tobytes()
    else:
        raw = gg_quantize(w, t).tobytes()
    deq = gg_dequantize(np.frombuffer(raw, dtype=np.uint8).reshape(rows, -1), t) if t != QT.F32 else w
    if t == QT.F16:
        deq = w.astype(np.float16).astype(np.float32)
    return raw, np.asarray(deq, dtype=np.float32).reshape(rows, cols)


def q8_0_act(x: np.ndarray) -> np.ndarray:
    """Activations as Q8_0 defines them: per 32 values, d = max|x| / 127 stored as f16, q = round(x / d)."""
    b = x.reshape(-1, 32).astype(np.float32)
    d = (np.abs(b).max(axis=1, keepdims=True) / np.float32(127)).astype(np.float32)
    inv = np.where(d != 0, np.float32(1) / np.where(d != 0, d, 1), 0).astype(np.float32)
    v = b * inv
    q = np.trunc(v)
    q = q + np.sign(v) * (np.abs(v - q) >= 0.5)  # round half away from zero (C's roundf)
    return (q * d.astype(np.float16).astype(np.float32)).reshape(x.shape)


@pytest.mark.parametrize("t", TYPES, ids=lambda t: t.name)
def test_dequantize_matches_gguf_py(level: str, t: QT) -> None:
    raw, deq = weights(t, 3, 256)
    got = K.dequantize(int(t), raw, 3 * 256).reshape(3, 256)
    assert np.array_equal(got, deq), f"worst row {int(np.abs(got - deq).max(axis=1).argmax())}"


@pytest.mark.parametrize("t", TYPES, ids=lambda t: t.name)
@pytest.mark.parametrize("cols", [32, 96, 544])
def test_matvec_matches_numpy(level: str, t: QT, cols: int) -> None:
    rows = 37
    raw, deq = weights(t, rows, cols, seed=cols)
    x = np.random.default_rng(1).standard_normal(cols).astype(np.float32)
    xa = q8_0_act(x) if t == QT.Q8_0 else x
    ref = deq.astype(np.float64) @ xa.astype(np.float64)
    got = K.matvec(int(t), raw, rows, cols, x)
    # normalized error: float types accumulate in f32; Q8_0 adds the f16 rounding of the product scale
    tol = 2e-6 if t != QT.Q8_0 else 2e-4
    err = np.abs(got - ref) / (np.abs(deq) @ np.abs(xa) + 1e-30)
    assert err.max() < tol, f"worst row {int(err.argmax())}: normalized error {err.max():.3g}"


@pytest.mark.parametrize("t", TYPES, ids=lambda t: t.name)
def test_rows_tokens_and_threads_do_not_change_a_result(level: str, t: QT) -> None:
    rows, cols, n = 23, 320, 18  # a tile of the many-token kernels (matmul.c MM_XN_MIN)
    raw, _ = weights(t, rows, cols, seed=5)
    row_bytes = K.type_row_bytes(int(t), cols)
    x = np.random.default_rng(2).standard_normal((n, cols)).astype(np.float32)
    full = K.matmul(int(t), raw, rows, cols, x, threads=1)
    assert np.array_equal(full, K.matmul(int(t), raw, rows, cols, x, threads=2))
    for i in range(n):
        assert np.array_equal(full[i], K.matvec(int(t), raw, rows, cols, x[i]))
    for r in (0, 5, 22):  # a row alone gives the same value as inside a group of four
        one = K.matvec(int(t), raw[r * row_bytes : (r + 1) * row_bytes], 1, cols, x[3])
        assert one[0] == full[3, r]


def test_q8_0_activations_are_quantized_exactly_as_defined(level: str) -> None:
    """One-hot Q8_0 weight rows (scale 1, a single 1) read back each quantized activation exactly."""
    cols = 128
    one_hot = np.zeros((cols, cols // 32, 34), dtype=np.uint8)
    for j in range(cols):
        one_hot[j, j // 32, :2] = np.frombuffer(np.float16(1.0).tobytes(), dtype=np.uint8)
        one_hot[j, j // 32, 2 + j % 32] = 1
    rng = np.random.default_rng(3)
    for trial in range(40):
        x = (rng.standard_normal(cols) * 10.0 ** rng.uniform(-4, 4)).astype(np.float32)
        if trial % 4 == 0:  # exact halves after scaling: the rounding ties
            x = (np.round(rng.uniform(-126, 126, cols)) + 0.5).astype(np.float32)  # scale 1: v = x
            x[::32] = 127.0
        if trial == 1:
            x[:32] = 0.0  # an all-zero block: scale 0
        got = K.matvec(int(QT.Q8_0), one_hot.tobytes(), cols, cols, x)
        assert np.array_equal(got, q8_0_act(x)), (
            f"trial {trial}: first difference at {np.flatnonzero(got != q8_0_act(x))[:4]}"
        )


def test_bad_arguments_raise() -> None:
    with pytest.raises(StrataError):
        K.dequantize(int(QT.Q8_0), b"\0" * 34, 33)
    with pytest.raises(StrataError):
        K.matvec(int(QT.Q8_0), b"\0" * 10, 1, 32, np.zeros(32, np.float32))
    assert K.type_row_bytes(int(QT.Q8_0), 64) == 68 and K.type_row_bytes(int(QT.Q8_0), 65) == -1
    assert K.type_name(int(QT.Q8_0)) == "Q8_0" and K.type_name(99) is None
