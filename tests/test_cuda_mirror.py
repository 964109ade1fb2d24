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
from strata import _engine
from tests.gpu._cuda_util import NEW_TYPES, random_rows
from tests.gpu.test_cuda_kernels import TYPES as _OLD_TYPES
from tests.gpu.test_cuda_kernels import _quantized_activations

TYPES = {**_OLD_TYPES, **NEW_TYPES}


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


@pytest.mark.parametrize("name", list(NEW_TYPES))
def test_mirror_dequantizes_as_gguf_py(name):
    """The mirror's weights are gguf-py's, bit for bit: with x = e_k, each lane adds w * 0 (zeros) and
    w[k] * 1, so y[r] is row r's value k exactly (a -0 comes out as +0: compared as numbers)."""
    rows, cols = 6, 512
    rng = np.random.default_rng(21)
    w, dense = random_rows(name, rows, cols, rng)
    w = np.ascontiguousarray(w)
    got = np.zeros((cols, rows), dtype=np.float32)
    for k in range(cols):
        x = np.zeros(cols, dtype=np.float32)
        x[k] = 1.0
        st, got[k] = _mirror(C.strata_cuda_mirror_matvec, TYPES[name], w, rows, cols, x)
        assert st == 0
    got = got.T
    same = (got == dense) | (np.isnan(got) & np.isnan(dense))
    assert same.all(), (
        f"{name}: {np.count_nonzero(~same)} values differ; first at {tuple(np.argwhere(~same)[0])}: "
        f"{got[~same][0]!r} vs gguf-py {dense[~same][0]!r}"
    )


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
    # so must IQ2_XS rows (128 values: whole groups of 32, not whole blocks); Q8_1 is not a weight type
    for type_, cols in ((17, 128), (9, 128)):
        st = C.strata_cuda_mirror_matvec(
            type_, w.ctypes.data_as(ctypes.c_void_p), 1, cols, x.ctypes.data_as(fp), y.ctypes.data_as(fp)
        )
        assert st == 1, (type_, cols)


@pytest.mark.parametrize("name", ["Q8_0", "Q4_0", "Q4_K", "Q6_K", *NEW_TYPES])
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
    # only the weight types whose activations are 8-bit blocks
    assert _mirror(C.strata_cuda_mirror_mmq, TYPES["F16"], w, rows, cols, x)[0] == 1
    if name not in ("Q8_0", "Q4_0"):
        return  # the matrix-vector mirror multiplies the other types with float activations
    st, ym = _mirror(C.strata_cuda_mirror_matvec, TYPES[name], w, rows, cols, x)
    assert st == 0
    assert np.abs(y - ym).max() <= 1e-5 * np.abs(ym).max()


# ---- the SIMD levels of the mirror (--miss host runs the engine's level) ----------------------------

_SIMD_TYPES = ["Q8_0", "Q4_0", "Q4_K", "Q6_K", "F32", "F16", "BF16", *NEW_TYPES]
_BITS = np.uint32


def _levels() -> list[str]:
    """The SIMD levels this CPU runs, besides scalar."""
    feats = set(_engine.cpu_features().split())
    out = []
    if {"avx2", "fma", "f16c"} <= feats:
        out.append("avx2")
        if {"avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512vnni"} <= feats:
            out.append("avx512")
    return out


@pytest.fixture
def level_reset():
    yield
    _engine.simd_set("auto")


def _at_level(level: str, type_: int, w: np.ndarray, rows: int, cols: int, x: np.ndarray) -> np.ndarray:
    _engine.simd_set(level)
    st, y = _mirror(C.strata_cuda_mirror_matvec, type_, w, rows, cols, x)
    assert st == 0
    return y


def _assert_same_bits(got: np.ndarray, want: np.ndarray, what: str) -> None:
    """Bit for bit; a NaN only has to be a NaN where the reference has one (payloads are not kept)."""
    nan = np.isnan(want)
    assert np.array_equal(np.isnan(got), nan), f"{what}: NaN rows differ"
    bad = np.nonzero(got.view(_BITS)[~nan] != want.view(_BITS)[~nan])[0]
    assert bad.size == 0, (
        f"{what}: {bad.size} rows differ in their bits; first row {np.arange(len(want))[~nan][bad[0]]}: "
        f"{got[~nan][bad[0]]!r} vs {want[~nan][bad[0]]!r}"
    )


def _cols_for(name: str) -> list[int]:
    # a partial last step (288 = one step of 256 values + one block; 800 = 3 steps + 1) and whole steps
    import gguf

    blk = gguf.GGML_QUANT_SIZES[getattr(gguf.GGMLQuantizationType, name)][0]
    return [768, 2048] if blk == 256 else [288, 800, 2048]


@pytest.mark.asan
@pytest.mark.parametrize("level", _levels())
@pytest.mark.parametrize("name", _SIMD_TYPES)
def test_levels_equal_scalar_bits(name, level, level_reset):
    """Each SIMD level gives the scalar mirror's bits (so the device's), odd row counts, partial steps."""
    rng = np.random.default_rng(11)
    for cols in _cols_for(name):
        rows = 13
        w, _ = random_rows(name, rows, cols, rng)
        w = np.ascontiguousarray(w)
        x = (rng.standard_normal(cols) * rng.uniform(0.01, 30.0)).astype(np.float32)
        want = _at_level("scalar", TYPES[name], w, rows, cols, x)
        got = _at_level(level, TYPES[name], w, rows, cols, x)
        _assert_same_bits(got, want, f"{name} {level} cols={cols}")


def _extreme_cases(name: str, rows: int, cols: int, rng: np.random.Generator):
    """(label, weight bytes, x): all-zero rows, quant bytes all 0xFF / 0x80 with finite scales,
    largest scales, +-127 activations, scale fields that are NaN, activations at rounding ties, inf, NaN."""
    w, _ = random_rows(name, rows, cols, rng)
    w = np.ascontiguousarray(w)
    nb = w.size // ({"Q8_0": 34, "Q4_0": 18, "Q4_K": 144, "Q6_K": 210}[name])
    blocks = w.reshape(nb, -1)
    scale_at = {"Q8_0": [0], "Q4_0": [0], "Q4_K": [0, 2], "Q6_K": [208]}[name]
    ones = np.where(rng.random(cols) < 0.5, -1.0, 1.0).astype(np.float32)  # every 8-bit value is +-127
    wide = (rng.standard_normal(cols) * 1e3).astype(np.float32)

    def with_bytes(fill: int, scale: float | None) -> np.ndarray:
        b = np.full_like(blocks, fill)
        for s in scale_at:
            if scale is None:
                b[:, s : s + 2] = blocks[:, s : s + 2]
            else:
                b[:, s : s + 2] = np.frombuffer(np.float16(scale).tobytes(), dtype=np.uint8)
        return b.reshape(w.shape)

    yield "zero rows", np.zeros_like(w), wide
    yield "zero x", w, np.zeros(cols, dtype=np.float32)
    yield "bytes 0xFF", with_bytes(0xFF, None), ones
    yield "bytes 0x80", with_bytes(0x80, None), ones
    yield "largest scales", with_bytes(0x80, 65504.0), wide
    yield "negative scales", with_bytes(0x7F, -0.02), ones
    yield "NaN scales", with_bytes(0xFF, float("nan")), wide
    yield "random, +-127 x", w, ones
    # 8-bit activations at a tie: a block whose largest |x| is 127 has scale 1, so x * (1/d) is x itself
    ties = rng.standard_normal(cols).astype(np.float32)
    for i, v in enumerate(
        [127.0, 2.5, -3.5, 0.5, -0.5, np.nextafter(np.float32(0.5), np.float32(0)), -126.5]
    ):
        ties[i::32] = v
    yield "half-way x", w, ties
    for label, v in (("inf in x", np.inf), ("NaN in x", np.nan)):
        bad = wide.copy()
        bad[37] = v
        yield label, w, bad


@pytest.mark.asan
@pytest.mark.parametrize("level", _levels())
@pytest.mark.parametrize("name", ["Q8_0", "Q4_0", "Q4_K", "Q6_K"])
def test_levels_extreme_blocks(name, level, level_reset):
    rng = np.random.default_rng(12)
    rows, cols = 5, (512 if name in ("Q4_K", "Q6_K") else 288)
    for label, w, x in _extreme_cases(name, rows, cols, rng):
        want = _at_level("scalar", TYPES[name], w, rows, cols, x)
        got = _at_level(level, TYPES[name], w, rows, cols, x)
        _assert_same_bits(got, want, f"{name} {level} {label}")


def _device_order(wx: np.ndarray, n_groups: int) -> np.ndarray:
    """The device's order of a row's float32 sums. wx(g, s) -> [rows] is lane (4 (g % 8) + s)'s addend
    for block g; lanes accumulate their blocks g = l / 4, l / 4 + 8, ... in order, then the butterfly."""
    rows = wx(0, 0).shape[0]
    a = np.zeros((rows, 32), dtype=np.float32)
    for g in range(n_groups):
        for s in range(4):
            lane = 4 * (g % 8) + s
            a[:, lane] = wx(g, s, a[:, lane])
    for off in (16, 8, 4, 2, 1):
        a = a + a[:, np.arange(32) ^ off]
    return a[:, 0]


def _q8_act(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The device's 8-bit activations: values (rounded half away from zero) and f16-rounded scales."""
    b = x.reshape(-1, 32).astype(np.float32)
    d = (np.abs(b).max(axis=1) / np.float32(127)).astype(np.float32)
    inv = np.where(d != 0, np.float32(1) / np.where(d != 0, d, 1), 0).astype(np.float32)
    v = (b * inv[:, None]).astype(np.float64)
    q = np.sign(v) * (np.floor(np.abs(v)) + (np.abs(v) - np.floor(np.abs(v)) >= 0.5))
    return q.astype(np.int64), d.astype(np.float16).astype(np.float32)


def _reference(
    name: str, w: np.ndarray, dense: np.ndarray, x: np.ndarray, order: str = "device"
) -> np.ndarray:
    """NumPy float32 copy of the device kernel, written from its description (not from the C code).
    order="rowwise" is the same arithmetic summed block after block in one accumulator: a wrong order."""
    rows, cols = dense.shape
    G = cols // 32
    if name in ("Q8_0", "Q4_0"):
        q, dx = _q8_act(x)
        bb = 34 if name == "Q8_0" else 18
        dw = w.reshape(rows, G, bb)[:, :, :2].copy().view(np.float16)[:, :, 0].astype(np.float32)
        # integer weights recovered exactly from the dequantized values (gguf-py's) and the scale
        wi = np.rint(dense.reshape(rows, G, 32).astype(np.float64) / dw[:, :, None].astype(np.float64))
        wi = np.where(dw[:, :, None] != 0, wi, 0).astype(np.int64)
        qg = q.reshape(G, 32)

        def add(g, s, a=None):
            isum = (wi[:, g, 8 * s : 8 * s + 8] * qg[g, 8 * s : 8 * s + 8]).sum(axis=1).astype(np.float32)
            t = (dw[:, g] * dx[g]).astype(np.float32) * isum
            return t if a is None else (a + t).astype(np.float32)
    else:
        dv = dense.reshape(rows, G, 4, 8)
        xv = x.reshape(G, 4, 8)

        def add(g, s, a=None):
            acc = np.zeros(rows, dtype=np.float32) if a is None else a
            for v in range(8):
                acc = (acc + dv[:, g, s, v] * xv[g, s, v]).astype(np.float32)
            return acc

    if order == "device":
        return _device_order(add, G)
    acc = np.zeros(rows, dtype=np.float32)
    for g in range(G):
        for s in range(4):
            acc = add(g, s, acc)
    return acc


@pytest.mark.parametrize("name", _SIMD_TYPES)
def test_mirror_order_is_the_devices(name, level_reset):
    """The mirror (every level) equals an independent NumPy copy of the device's order bit for bit, and
    the data tells orders apart: summing the same addends row-wise gives other bits."""
    rng = np.random.default_rng(13)
    rows, cols = 24, 1024
    w, dense = random_rows(name, rows, cols, rng)
    w = np.ascontiguousarray(w)
    x = rng.standard_normal(cols).astype(np.float32)
    want = _reference(name, w, dense, x)
    for level in ["scalar", *_levels()]:
        _assert_same_bits(_at_level(level, TYPES[name], w, rows, cols, x), want, f"{name} {level}")
    wrong = _reference(name, w, dense, x, order="rowwise")
    assert np.abs(wrong - want).max() <= 1e-4 * np.abs(want).max()  # the same sum ...
    assert (wrong.view(_BITS) != want.view(_BITS)).sum() >= rows // 4  # ... in other bits


def _experts(types: tuple[str, str, str], D: int, F: int, n: int, rng: np.random.Generator):
    """n experts' matrices back to back (raw bytes) and each one's values."""
    raw: list[list[np.ndarray]] = [[], [], []]
    dense: list[list[np.ndarray]] = [[], [], []]
    for _ in range(n):
        for i, (rows, cols) in enumerate(((F, D), (F, D), (D, F))):
            w, d = random_rows(types[i], rows, cols, rng)
            raw[i].append(w)
            dense[i].append(d)
    return [np.ascontiguousarray(np.concatenate(r)) for r in raw], dense


def _run_experts(types, mats, D, F, n, x, threads, reps=1):  # type: ignore[no-untyped-def]
    fp = ctypes.POINTER(ctypes.c_float)
    out = np.full((n, D), np.nan, dtype=np.float32)
    us = ctypes.c_double(0.0)
    vp = [m.ctypes.data_as(ctypes.c_void_p) for m in mats]
    st = C.strata_cuda_mirror_expert(
        TYPES[types[0]], vp[0], TYPES[types[1]], vp[1], TYPES[types[2]], vp[2], D, F, n,
        x.ctypes.data_as(fp), out.ctypes.data_as(fp), threads, reps, ctypes.byref(us),
    )  # fmt: skip
    return st, out, us.value


@pytest.mark.asan
@pytest.mark.parametrize(
    "types",
    [
        ("Q8_0",) * 3,
        ("Q4_K", "Q4_K", "Q6_K"),
        ("Q4_0", "Q8_0", "Q4_0"),
        ("Q5_K", "IQ4_XS", "Q3_K"),
        ("IQ2_XXS", "IQ1_M", "MXFP4"),
    ],
)
def test_experts_levels_and_threads(types, level_reset):
    """A layer's decode misses as --miss host runs them (3 experts in two pool runs): the same bits at every
    level and thread count, each expert's the same as when it runs alone, and the right values (float64
    reference of down(silu(gate x) * up x), 8-bit activations where the types use them)."""
    rng = np.random.default_rng(14)
    D, F, n = 512, 256, 3
    mats, dense = _experts(types, D, F, n, rng)
    x = rng.standard_normal(D).astype(np.float32)
    _engine.simd_set("scalar")
    st, want, _ = _run_experts(types, mats, D, F, n, x, 1)
    assert st == 0
    for level in ["scalar", *_levels()]:
        _engine.simd_set(level)
        for threads in (1, 2):
            st, got, _ = _run_experts(types, mats, D, F, n, x, threads)
            assert st == 0
            _assert_same_bits(got.ravel(), want.ravel(), f"{types} {level} {threads} threads")
        k = 1  # the middle expert alone
        one = [m.reshape(n, -1)[k].copy() for m in mats]
        st, alone, _ = _run_experts(types, one, D, F, 1, x, 2)
        assert st == 0
        _assert_same_bits(alone[0], want[k], f"{types} {level} expert {k} alone")
    q8 = [t in ("Q8_0", "Q4_0") for t in types]

    def act(v: np.ndarray, quant: bool) -> np.ndarray:
        return (_quantized_activations(v[None, :])[0] if quant else v).astype(np.float64)

    for k in range(n):
        gv = dense[0][k].astype(np.float64) @ act(x, q8[0])
        uv = dense[1][k].astype(np.float64) @ act(x, q8[1])
        with np.errstate(over="ignore"):  # silu's e^-g overflows for g << 0: h is then -0 or 0
            h = (gv / (1 + np.exp(-gv)) * uv).astype(np.float32)
        ref = dense[2][k].astype(np.float64) @ act(h, q8[2])
        err = np.linalg.norm(want[k] - ref) / np.linalg.norm(ref)
        assert err < 1e-3, f"{types} expert {k}: relative error {err:.2e}"


def test_experts_reject_bad_shapes():
    rng = np.random.default_rng(15)
    types = ("Q4_K", "Q4_K", "Q4_K")
    mats, _ = _experts(types, 512, 256, 1, rng)
    x = np.zeros(512, dtype=np.float32)
    assert _run_experts(types, mats, 512, 256, 1, x, 1)[0] == 0
    assert _run_experts(types, mats, 512, 96, 1, x, 1)[0] == 1  # F is not whole Q4_K blocks of 256
    assert _run_experts(types, mats, 512, 256, 1, x, 0)[0] == 1  # no threads
    assert _run_experts(types, mats, 512, 256, 0, x, 1)[0] == 1  # no experts


def _swiglu(level: str, g: np.ndarray, u: np.ndarray) -> np.ndarray:
    fp = ctypes.POINTER(ctypes.c_float)
    _engine.simd_set(level)
    out = g.copy()
    assert C.strata_cuda_mirror_swiglu(out.ctypes.data_as(fp), u.ctypes.data_as(fp), len(out)) == 0
    return out


@pytest.mark.asan
@pytest.mark.parametrize("level", _levels())
def test_swiglu_levels(level, level_reset):
    """The expert's SwiGLU (with the device's own e^x) at each level: the scalar bits over the whole range,
    the clamps at -87 / 88 of e^x's argument, signed zeros, subnormals, inf and NaN."""
    rng = np.random.default_rng(16)
    edges = [87.0, 88.0, -87.0, -88.0, 0.0, -0.0, 1e-40, -1e-40, np.inf, -np.inf, np.nan, 3.4e38, -3.4e38]
    near = [np.nextafter(np.float32(e), np.float32(t)) for e in (87, 88, -87, -88) for t in (-1e3, 1e3)]
    g = np.concatenate(
        [
            np.linspace(-100, 100, 4001),
            rng.standard_normal(997) * 30,
            edges,
            near,
            np.linspace(86.5, 88.5, 333),
        ]
    ).astype(np.float32)
    u = rng.standard_normal(len(g)).astype(np.float32)
    want = _swiglu("scalar", g, u)
    with np.errstate(over="ignore", invalid="ignore"):
        ref = g.astype(np.float64) / (1 + np.exp(-g.astype(np.float64))) * u
    ok = np.isfinite(g) & (np.abs(g) < 80)
    assert np.abs(want[ok] - ref[ok]).max() <= 1e-5 * np.abs(ref[ok]).max()
    _assert_same_bits(_swiglu(level, g, u), want, f"swiglu {level}")
    assert C.strata_cuda_mirror_swiglu(g.ctypes.data_as(ctypes.POINTER(ctypes.c_float)), None, 4) == 1


@pytest.mark.asan
@pytest.mark.parametrize("level", _levels())
@pytest.mark.parametrize("name", ["F32", "F16", "BF16"])
def test_levels_float_weight_extremes(name, level, level_reset):
    """Float weights with infinities, NaN, the largest and subnormal values of their type: each level gives
    the scalar bits (NaN where the scalar has NaN), with a partial last step."""
    rng = np.random.default_rng(17)
    rows, cols = 7, 288
    dense = rng.standard_normal((rows, cols)).astype(np.float32)
    finite = {"F32": [3.4e38, 1e-45, -0.0], "F16": [65504.0, 6e-8, -0.0], "BF16": [3.38e38, 1e-40, -0.0]}[
        name
    ]
    mask = rng.random((rows, cols)) < 0.05
    dense[mask] = rng.choice(np.array(finite, dtype=np.float32), mask.sum())
    dense[0] = 0.0
    dense[1, 100], dense[2, 37], dense[3, 280] = np.inf, -np.inf, np.nan  # 280: in the partial last step
    if name == "F32":
        w = dense.view(np.uint8).reshape(rows, -1).copy()
    elif name == "F16":
        w = dense.astype(np.float16).view(np.uint8).reshape(rows, -1).copy()
    else:
        w = (dense.view(np.uint32) >> 16).astype(np.uint16).view(np.uint8).reshape(rows, -1).copy()
    x = rng.standard_normal(cols).astype(np.float32)
    want = _at_level("scalar", TYPES[name], w, rows, cols, x)
    _assert_same_bits(_at_level(level, TYPES[name], w, rows, cols, x), want, f"{name} {level}")
