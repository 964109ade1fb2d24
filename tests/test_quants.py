"""The quantized weight types: the engine's kernels against gguf-py, and strata's own quantizers.

- Dequantization through the engine equals gguf-py's ``dequantize`` bit for bit, on random blocks
  whose f16 scales include the extremes (zero, subnormals, the largest finite, infinities, NaN), at
  every kernel level this CPU runs. A mismatch names the worst block and its bytes. One rule for NaN:
  where gguf-py gives a NaN the engine must give a NaN, but its payload bits are not compared (when
  both operands of an addition are NaN, IEEE 754 leaves open which one the result carries, and the
  compiler may swap the operands of a commutative operation).
- ``strata.model.quants.quantize`` writes blocks that gguf-py reads back within a declared error.
- matvec / matmul: every kernel level gives the same bits (the block sums are exact integers and the
  float steps are one fixed expression per block), is deterministic across thread counts, gives each
  token of a matmul exactly its matvec (batch invariance), and is close to the float product of the
  dequantized weights (the only difference is the 8-bit quantization of the activations).
"""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
from gguf import quants as gq
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from strata import _engine
from strata.model import quants

pytestmark = pytest.mark.asan

TYPES = ["Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K",
         "IQ4_NL", "IQ4_XS", "IQ3_XXS", "IQ3_S", "IQ2_XS",
         "IQ2_XXS", "IQ2_S", "IQ1_S", "IQ1_M", "MXFP4"]  # fmt: skip

# Byte offsets of the f16 scales inside one block (facts of the format).
SCALE_OFFSETS = {
    "Q4_0": [0], "Q4_1": [0, 2], "Q5_0": [0], "Q5_1": [0, 2],
    "Q2_K": [80, 82], "Q3_K": [108], "Q4_K": [0, 2], "Q5_K": [0, 2], "Q6_K": [208],
    "IQ4_NL": [0], "IQ4_XS": [0], "IQ3_XXS": [0], "IQ3_S": [0], "IQ2_XS": [0],
    "IQ2_XXS": [0], "IQ2_S": [0], "IQ1_S": [0],
    "IQ1_M": [],  # its f16 is spread over the top nibbles of the four scale words (bytes 48..55)
    "MXFP4": [],  # an E8M0 exponent byte at 0, no f16
}  # fmt: skip

# f16 bit patterns at the edges: +-0, smallest subnormal, largest subnormal, smallest normal, 1.0,
# largest finite, +-inf, quiet and signalling NaN.
EXTREME_F16 = [0x0000, 0x8000, 0x0001, 0x03FF, 0x0400, 0x3C00, 0x7BFF, 0xFBFF, 0x7C00, 0xFC00, 0x7E00, 0x7C01]

# Normalized MSE (sum (y - x)^2 / sum x^2) of round-to-nearest quantization of Gaussian rows.
# Declared from the formats' bits per weight, with headroom; a broken packing lands far above.
NMSE_BOUND = {
    "Q4_0": 0.012, "Q4_1": 0.010, "Q5_0": 0.0035, "Q5_1": 0.003, "Q8_0": 1e-4,
    "Q2_K": 0.16, "Q3_K": 0.045, "Q4_K": 0.010, "Q5_K": 0.003, "Q6_K": 8e-4,
    "IQ4_NL": 0.010, "IQ4_XS": 0.010, "IQ3_XXS": 0.07, "IQ3_S": 0.045, "IQ2_XS": 0.18,
    "IQ2_XXS": 0.23, "IQ2_S": 0.14, "IQ1_S": 0.36, "IQ1_M": 0.32, "MXFP4": 0.02,
}  # fmt: skip

# MXFP4's exponent bytes at the edges: the two subnormal scales 2^-128 and 2^-127, 2^-126, 1/2, 1, and
# the largest (2^126: the largest value 12 * 2^126 overflows to infinity in float32).
EXTREME_E8M0 = [0, 1, 2, 127, 128, 254, 255]


def _levels() -> list[str]:
    out = []
    for lv in ("scalar", "avx2", "avx512"):
        try:
            _engine.simd_set(lv)
        except Exception:
            continue
        out.append(lv)
    _engine.simd_set("auto")
    return out


SIMD_LEVELS = _levels()


def _geom(name: str) -> tuple[int, int]:
    return GGML_QUANT_SIZES[GGMLQuantizationType[name]]


def _same_bits(ref: np.ndarray, got: np.ndarray) -> np.ndarray:
    """Elementwise: identical bits, or both NaN (see the module's note on NaN payloads)."""
    return (ref.view(np.uint32) == got.view(np.uint32)) | (np.isnan(ref) & np.isnan(got))


def _worst_block(ref: np.ndarray, got: np.ndarray, bs: int) -> tuple[int, float]:
    r = ref.reshape(-1, bs).astype(np.float64)
    g = got.reshape(-1, bs).astype(np.float64)
    same = _same_bits(ref, got).reshape(-1, bs)
    with np.errstate(invalid="ignore"):
        diff = np.where(same, 0.0, np.nan_to_num(np.abs(r - g), nan=np.inf))
    per_block = diff.max(axis=1)
    worst = int(per_block.argmax())
    return worst, float(per_block[worst])


def _set_iq1m_d(raw: np.ndarray, rows: np.ndarray | int, h: np.ndarray | int) -> None:
    """IQ1_M: f16 bits h into the top nibbles of the scale words (bits 4 w .. 4 w + 3 in word w)."""
    words = raw[:, 48:56].copy().view(np.uint16)  # [n, 4]
    h16 = np.asarray(h, np.uint16)
    for w in range(4):
        words[rows, w] = (words[rows, w] & np.uint16(0x0FFF)) | (
            ((h16 >> np.uint16(4 * w)) & np.uint16(0xF)) << np.uint16(12)
        )
    raw[:, 48:56] = words.view(np.uint8)


def _random_blocks(name: str, seed: int, n_blocks: int, extremes: list[int]) -> np.ndarray:
    bs, ts = _geom(name)
    rng = np.random.default_rng(seed)
    raw = rng.integers(0, 256, size=(n_blocks, ts), dtype=np.uint8)
    if name == "MXFP4":
        raw[:, 0] = rng.integers(100, 156, size=n_blocks)
        for i, h in enumerate(extremes):
            raw[i % n_blocks, 0] = EXTREME_E8M0[h % len(EXTREME_E8M0)]
        return raw
    if name == "IQ1_M":
        moderate = rng.integers(0x2000, 0x5000, size=n_blocks).astype(np.uint16)
        moderate |= rng.integers(0, 2, size=n_blocks).astype(np.uint16) << 15
        _set_iq1m_d(raw, np.arange(n_blocks), moderate)
        for i, h in enumerate(extremes):
            _set_iq1m_d(raw, i % n_blocks, h)
        return raw
    # Most scales finite and moderate, so the values themselves are compared; then the extremes.
    for off in SCALE_OFFSETS[name]:
        moderate = rng.integers(0x2000, 0x5000, size=n_blocks).astype(np.uint16)
        moderate |= rng.integers(0, 2, size=n_blocks).astype(np.uint16) << 15
        raw[:, off : off + 2] = moderate.view(np.uint8).reshape(n_blocks, 2)
    for i, h in enumerate(extremes):
        off = SCALE_OFFSETS[name][i % len(SCALE_OFFSETS[name])]
        raw[i % n_blocks, off : off + 2] = np.array([h], np.uint16).view(np.uint8)
    return raw


@pytest.mark.parametrize("name", TYPES)
@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    seed=st.integers(0, 2**32 - 1),
    n_blocks=st.integers(1, 24),
    extremes=st.lists(st.sampled_from(EXTREME_F16), max_size=6),
)
def test_dequantize_bit_exact(name: str, seed: int, n_blocks: int, extremes: list[int]) -> None:
    bs, ts = _geom(name)
    raw = _random_blocks(name, seed, n_blocks, extremes)
    with np.errstate(all="ignore"):
        ref = np.asarray(gq.dequantize(raw, GGMLQuantizationType[name]), dtype=np.float32).reshape(-1)
    try:
        for level in SIMD_LEVELS:
            _engine.simd_set(level)
            got = _engine.dequantize(int(GGMLQuantizationType[name]), raw, n_blocks * bs)
            if not _same_bits(ref, got).all():
                b, err = _worst_block(ref, got, bs)
                j = int(np.argmin(_same_bits(ref[b * bs : (b + 1) * bs], got[b * bs : (b + 1) * bs])))
                pytest.fail(
                    f"{name} at {level}: block {b} of {n_blocks} differs from gguf-py (max |diff| {err}); "
                    f"first differing value {j}: gguf-py {ref[b * bs + j]!r} engine {got[b * bs + j]!r}; "
                    f"block bytes {raw[b].tobytes().hex()}"
                )
    finally:
        _engine.simd_set("auto")


@pytest.mark.parametrize("name", [*TYPES, "Q8_0"])
@settings(max_examples=12, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    log_scale=st.floats(-3, 3),
    rows=st.integers(1, 3),
    blocks_per_row=st.integers(1, 3),
)
def test_quantizer_round_trip(name: str, seed: int, log_scale: float, rows: int, blocks_per_row: int) -> None:
    bs, ts = _geom(name)
    cols = bs * blocks_per_row * (1 if bs == 256 else 8)
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal((rows, cols)) * 10.0**log_scale).astype(np.float32)
    q = quants.quantize(x, name)
    assert q.dtype == np.uint8 and q.shape == (rows, cols // bs * ts)
    y = np.asarray(gq.dequantize(q, GGMLQuantizationType[name]), dtype=np.float32).reshape(rows, cols)
    nmse = float(((y.astype(np.float64) - x) ** 2).sum() / (x.astype(np.float64) ** 2).sum())
    assert nmse <= NMSE_BOUND[name], f"{name}: normalized MSE {nmse:.4g} above {NMSE_BOUND[name]}"
    # The engine reads the same blocks as gguf-py does.
    got = _engine.dequantize(int(GGMLQuantizationType[name]), q, rows * cols).reshape(rows, cols)
    assert np.array_equal(got.view(np.uint32), y.view(np.uint32))


@pytest.mark.parametrize("name", TYPES)
def test_quantizer_zero_rows_and_bad_shapes(name: str) -> None:
    bs, _ = _geom(name)
    cols = 256 if bs == 256 else 64
    z = quants.quantize(np.zeros((2, cols), np.float32), name)
    y = np.asarray(gq.dequantize(z, GGMLQuantizationType[name]), dtype=np.float32)
    assert np.all(y == 0)
    with pytest.raises(ValueError, match="whole number"):
        quants.quantize(np.zeros((1, cols + 16), np.float32), name)
    with pytest.raises(ValueError, match="NaN"):
        quants.quantize(np.full((1, cols), np.nan, np.float32), name)
    # Any leading shape: experts stacked in front of rows.
    e = quants.quantize(np.ones((3, 2, cols), np.float32), int(GGMLQuantizationType[name]))
    assert e.shape[:2] == (3, 2)


def _weights(name: str, rows: int, cols: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    w = rng.standard_normal((rows, cols)).astype(np.float32)
    q = quants.quantize(w, name)
    wd = np.asarray(gq.dequantize(q, GGMLQuantizationType[name]), dtype=np.float32).reshape(rows, cols)
    return q, wd


@pytest.mark.parametrize("wide", [False, True], ids=["narrow", "wide"])
@pytest.mark.parametrize("name", [*TYPES, "Q8_0"])
def test_products_levels_threads_batch(name: str, wide: bool) -> None:
    bs, _ = _geom(name)
    # wide rows span several chunks of blocks in the many-token kernels
    blocks = (19 if wide else 3) if bs == 256 else (75 if wide else 26)
    # 70 tokens: more than a token tile (64); 18: one tile, enough for the kernels that decode a row once
    rows, cols, n_tok = 37, blocks * bs, 70 if wide else 18
    q, wd = _weights(name, rows, cols, 7)
    rng = np.random.default_rng(8)
    x = rng.standard_normal((n_tok, cols)).astype(np.float32)
    x[1] *= 1e-3  # tiny activations
    x[2, : cols // 2] = 0  # blocks of zeros
    t = int(GGMLQuantizationType[name])
    results = {}
    try:
        for level in SIMD_LEVELS:
            _engine.simd_set(level)
            mm = {th: _engine.matmul(t, q, rows, cols, x, threads=th) for th in (1, 2, 3)}
            mv = np.stack([_engine.matvec(t, q, rows, cols, x[i], threads=2) for i in range(n_tok)])
            for th in (2, 3):
                assert np.array_equal(mm[1], mm[th]), f"{name} {level}: matmul differs with {th} threads"
            assert np.array_equal(mm[1], mv), f"{name} {level}: a matmul token differs from its matvec"
            # The prompt path processes any subset of tokens together: each gets the same bits.
            part = _engine.matmul(t, q, rows, cols, x[1:4], threads=2)
            assert np.array_equal(part, mm[1][1:4]), f"{name} {level}: results depend on the batch"
            results[level] = mm[1]
    finally:
        _engine.simd_set("auto")
    base = results["scalar"]
    # Q8_0 (the base family's kernels) has its own lane order per level: its levels are compared with
    # the float product below, not with each other.
    for level, y in results.items() if name != "Q8_0" else ():
        # Declared tolerance between levels: none. The kernels share the exact per-block integer sums.
        bad = np.argwhere(y.view(np.uint32) != base.view(np.uint32))
        assert bad.size == 0, f"{name}: {level} differs from scalar at (token, row) {bad[:4].tolist()}"
    ref = x.astype(np.float64) @ wd.T.astype(np.float64)
    for i in range(n_tok):
        err = np.abs(base[i] - ref[i]).max() / max(np.abs(ref[i]).max(), 1e-30)
        # The activations are quantized to 8 bits per block: about 1% of the largest output.
        assert err < 0.03, f"{name}: token {i} differs from the float product by {err:.3g} of its max"


def test_unsupported_type_is_refused_by_kernels() -> None:
    # TQ1_0 has blocks in GGUF but no kernels in strata: the binding says so instead of reading garbage.
    t = int(GGMLQuantizationType.TQ1_0)
    bs, ts = _geom("TQ1_0")
    with pytest.raises(Exception, match="TQ1_0"):
        _engine.dequantize(t, np.zeros(ts, np.uint8), bs)


def test_mixes_follow_llama_cpp_q4_k_m() -> None:
    mix = quants.MIXES["q4_k_m"]
    n = 8
    assert mix("output.weight", -1, n) == "Q6_K"
    assert mix("token_embd.weight", -1, n) == "Q4_K"
    assert mix("blk.0.attn_norm.weight", 0, n) == "F32"
    assert mix("blk.3.ffn_gate_inp.weight", 3, n) == "F32"
    assert mix("blk.3.attn_q.weight", 3, n) == "Q4_K"
    assert mix("blk.3.ffn_gate_exps.weight", 3, n) == "Q4_K"
    more = [layer for layer in range(n) if mix(f"blk.{layer}.ffn_down_exps.weight", layer, n) == "Q6_K"]
    assert more == [layer for layer in range(n) if quants.more_bits(layer, n)]
    assert 0 in more and n - 1 in more and len(more) < n
    assert [mix(f"blk.{i}.attn_v.weight", i, n) for i in range(n)] == [
        "Q6_K" if quants.more_bits(i, n) else "Q4_K" for i in range(n)
    ]
    # Mixtral-like files (8 experts) keep attn_k / attn_v at Q8_0.
    assert mix("blk.1.attn_k.weight", 1, n, n_expert=8) == "Q8_0"
    assert quants.fallback_type("Q4_K", 128) == "Q5_0"
    assert quants.fallback_type("Q6_K", 96) == "Q8_0"
    assert quants.fallback_type("IQ4_XS", 64) == "IQ4_NL"
    for name, pick in quants.MIXES.items():
        t = pick("blk.0.ffn_up_exps.weight", 0, n)
        assert t in quants.QUANTIZABLE, (name, t)


# (mix, tensor, layer of 8, n_expert, head ratio) -> the type llama.cpp's quantizer gives it (no
# importance matrix): its rules, one case each.
LLAMA_CPP_TYPES = [
    ("q2_k", "blk.3.attn_v.weight", 3, 128, 4, "Q4_K"), ("q2_k", "blk.3.attn_v.weight", 3, 128, 2, "Q3_K"),
    ("q2_k", "blk.3.ffn_down_exps.weight", 3, 128, 4, "Q3_K"), ("q2_k", "blk.3.attn_output.weight", 3, 128, 4, "Q3_K"),
    ("q2_k", "token_embd.weight", -1, 128, 4, "Q2_K"), ("q2_k", "output.weight", -1, 128, 4, "Q6_K"),
    ("q3_k_s", "blk.0.attn_v.weight", 0, 128, 4, "Q3_K"), ("q3_k_s", "blk.0.ffn_down_exps.weight", 0, 128, 4, "Q3_K"),
    ("q3_k_m", "blk.1.attn_v.weight", 1, 128, 4, "Q5_K"), ("q3_k_m", "blk.2.attn_v.weight", 2, 128, 4, "Q4_K"),
    ("q3_k_m", "blk.5.ffn_down_exps.weight", 5, 128, 4, "Q4_K"), ("q3_k_m", "blk.5.attn_output.weight", 5, 128, 4, "Q4_K"),
    ("q3_k_l", "blk.5.attn_v.weight", 5, 128, 4, "Q5_K"), ("q3_k_l", "blk.5.ffn_down_exps.weight", 5, 128, 4, "Q5_K"),
    ("q3_k_l", "blk.5.attn_output.weight", 5, 128, 4, "Q5_K"), ("q3_k_l", "blk.5.ffn_up_exps.weight", 5, 128, 4, "Q3_K"),
    ("q4_k_s", "blk.3.attn_v.weight", 3, 128, 4, "Q5_K"), ("q4_k_s", "blk.4.attn_v.weight", 4, 128, 4, "Q4_K"),
    ("q5_k_s", "blk.0.ffn_down_exps.weight", 0, 128, 4, "Q5_K"), ("q5_k_m", "blk.7.ffn_down_exps.weight", 7, 128, 4, "Q6_K"),
    ("q5_k_m", "blk.2.ffn_down_exps.weight", 2, 128, 4, "Q5_K"),
    ("iq4_xs", "blk.0.ffn_down_exps.weight", 0, 128, 4, "Q5_K"), ("iq4_xs", "blk.0.attn_v.weight", 0, 128, 4, "Q5_K"),
    ("iq4_xs", "blk.0.attn_v.weight", 0, 128, 2, "IQ4_XS"), ("iq4_xs", "output.weight", -1, 128, 4, "Q6_K"),
    ("iq3_xxs", "blk.4.attn_q.weight", 4, 128, 4, "IQ2_S"), ("iq3_xxs", "blk.4.attn_k.weight", 4, 128, 4, "IQ2_S"),
    ("iq3_xxs", "blk.4.attn_v.weight", 4, 128, 2, "IQ3_S"), ("iq3_xxs", "blk.0.ffn_down_exps.weight", 0, 128, 4, "Q4_K"),
    ("iq3_xxs", "blk.4.ffn_down_exps.weight", 4, 128, 4, "Q3_K"), ("iq3_xxs", "token_embd.weight", -1, 128, 4, "IQ3_S"),
    ("iq3_xxs", "output.weight", -1, 128, 4, "Q5_K"), ("iq3_s", "blk.4.attn_v.weight", 4, 128, 4, "Q4_K"),
    ("iq2_xs", "blk.0.ffn_down_exps.weight", 0, 128, 4, "Q2_K"), ("iq2_xs", "blk.4.ffn_down_exps.weight", 4, 128, 4, "IQ2_XS"),
    ("iq2_xxs", "blk.4.attn_v.weight", 4, 1, 1, "Q2_K"), ("iq2_xxs", "blk.4.attn_v.weight", 4, 128, 1, "Q4_K"),
    ("iq2_xxs", "token_embd.weight", -1, 128, 4, "Q2_K"), ("iq2_xxs", "blk.4.ffn_up_exps.weight", 4, 128, 4, "IQ2_XXS"),
    ("iq2_s", "blk.4.ffn_up_exps.weight", 4, 128, 4, "IQ2_XS"), ("iq2_s", "blk.4.attn_output.weight", 4, 128, 4, "IQ3_S"),
    ("iq2_m", "blk.4.ffn_up_exps.weight", 4, 128, 4, "IQ2_S"), ("iq2_m", "blk.0.ffn_down_exps.weight", 0, 128, 4, "IQ3_S"),
    ("iq2_m", "token_embd.weight", -1, 128, 4, "IQ3_S"), ("iq1_s", "blk.4.attn_output.weight", 4, 128, 4, "IQ2_XXS"),
    ("iq1_s", "blk.4.attn_output.weight", 4, 8, 4, "Q5_K"), ("iq1_m", "blk.4.attn_k.weight", 4, 8, 4, "Q4_K"),
    ("iq1_m", "blk.4.ffn_gate_exps.weight", 4, 128, 4, "IQ1_M"), ("iq1_m", "output.weight", -1, 128, 4, "Q5_K"),
    ("mxfp4_moe", "blk.4.ffn_down_exps.weight", 4, 128, 4, "MXFP4"), ("mxfp4_moe", "blk.4.attn_q.weight", 4, 128, 4, "Q8_0"),
    ("mxfp4_moe", "output.weight", -1, 128, 4, "Q8_0"), ("mxfp4_moe", "token_embd.weight", -1, 128, 4, "Q8_0"),
    ("q4_k_m", "blk.4.attn_output.weight", 4, 8, 4, "Q5_K"), ("q4_k_m", "blk.4.attn_v.weight", 4, 8, 4, "Q8_0"),
    ("q8_0", "output.weight", -1, 128, 4, "Q8_0"), ("q4_0", "output.weight", -1, 128, 4, "Q6_K"),
]  # fmt: skip


@pytest.mark.parametrize(("mix", "tensor", "layer", "n_expert", "n_gqa", "want"), LLAMA_CPP_TYPES)
def test_mixes_follow_llama_cpps_rules(
    mix: str, tensor: str, layer: int, n_expert: int, n_gqa: int, want: str
) -> None:
    got = quants.MIXES[mix](tensor, layer, 8, n_expert=n_expert, n_gqa=n_gqa)
    assert got == want, (
        f"{mix}: {tensor} (layer {layer} of 8, {n_expert} experts, head ratio {n_gqa}) is {got}"
    )
    assert got in quants.QUANTIZABLE


def test_output_rows_without_whole_blocks_are_q8_0() -> None:
    # llama.cpp's output rule: rows of 128 cannot hold IQ2_XXS (256) blocks, so Q8_0, not Q5_K's fallback
    assert quants.MIXES["iq2_xxs"]("output.weight", -1, 8, cols=128) == "Q8_0"
    assert quants.MIXES["q4_k_m"]("output.weight", -1, 8, cols=128) == "Q8_0"
    assert quants.MIXES["q4_k_m"]("output.weight", -1, 8, cols=256) == "Q6_K"
    assert quants.MIXES["q4_0"]("output.weight", -1, 8, cols=96) == "Q6_K"  # 96 holds Q4_0's blocks


def test_new_types_fall_back_like_llama_cpp() -> None:
    for t in ("IQ2_XXS", "IQ2_S", "IQ1_S", "IQ1_M"):
        assert quants.fallback_type(t, 128) == "IQ4_NL"
    assert quants.fallback_type("IQ1_M", 48) == "F16"
    assert quants.fallback_type("MXFP4", 64) == "MXFP4"


@pytest.mark.parametrize("name", TYPES)
def test_products_on_raw_blocks_agree_across_levels(name: str) -> None:
    # Random block bytes reach value and scale combinations a quantizer seldom writes (every bit
    # pattern, all-zero and all-one blocks: the largest |value x scale|), against activations that
    # quantize to +-127: the integer sums must still be exact at every level.
    bs, ts = _geom(name)
    # two groups of four rows and one alone; 18 tokens: a tile of the many-token kernels
    rows, n_blocks, n_tok = 9, 5, 18
    raw = _random_blocks(name, 11, rows * n_blocks, []).reshape(rows, n_blocks * ts)
    for r, fill in ((0, 0x00), (1, 0xFF)):
        keep = raw[r].reshape(n_blocks, ts).copy()
        blocks = np.full_like(keep, fill)
        for off in SCALE_OFFSETS[name]:
            blocks[:, off : off + 2] = keep[:, off : off + 2]
        if name == "MXFP4":
            blocks[:, 0] = keep[:, 0]
        elif name == "IQ1_M":  # keep the f16 nibbles, fill the 3-bit scales
            words = blocks[:, 48:56].copy().view(np.uint16)
            kw = keep[:, 48:56].copy().view(np.uint16)
            blocks[:, 48:56] = ((words & np.uint16(0x0FFF)) | (kw & np.uint16(0xF000))).view(np.uint8)
        raw[r] = blocks.reshape(-1)
    cols = n_blocks * bs
    rng = np.random.default_rng(12)
    x = rng.standard_normal((n_tok, cols)).astype(np.float32)
    x[0] = np.where(np.arange(cols) % 2 == 0, 1.0, -1.0)  # every activation at +-127
    x[1] = 1.0
    t = int(GGMLQuantizationType[name])
    w = np.ascontiguousarray(raw)
    results = {}
    try:
        for level in SIMD_LEVELS:
            _engine.simd_set(level)
            mm = _engine.matmul(t, w, rows, cols, x, threads=1)
            mv = np.stack([_engine.matvec(t, w, rows, cols, x[i], threads=1) for i in range(n_tok)])
            assert np.array_equal(mm, mv), f"{name} {level}: a matmul token differs from its matvec"
            results[level] = mm
    finally:
        _engine.simd_set("auto")
    for level, y in results.items():
        bad = np.argwhere(y.view(np.uint32) != results["scalar"].view(np.uint32))
        assert bad.size == 0, f"{name}: {level} differs from scalar at (token, row) {bad[:4].tolist()}"


@pytest.mark.parametrize("name", ["Q4_K", "Q6_K"])
def test_tiny_activation_blocks_agree_across_levels(name: str) -> None:
    # Activation blocks whose largest value is so small that 127 / max overflows to infinity (below
    # about 3.7e-37, subnormals included) next to zeros: 0 x inf is NaN in the quantizer, which every
    # level must turn into the scalar kernel's 0, and the products must stay bit-identical.
    rows, cols = 8, 3 * 256
    q, _ = _weights(name, rows, cols, 21)
    rng = np.random.default_rng(22)
    x = rng.standard_normal((5, cols)).astype(np.float32)
    x[0] *= np.float32(1e-39)  # subnormal
    x[1] *= np.float32(1e-37)
    x[2, ::2] = 0.0
    x[2] *= np.float32(2e-38)
    x[3, :256] = np.float32(1e-45)  # the smallest subnormal in one block, normal values after it
    t = int(GGMLQuantizationType[name])
    results = {}
    try:
        for level in SIMD_LEVELS:
            _engine.simd_set(level)
            results[level] = _engine.matmul(t, q, rows, cols, x, threads=1)
    finally:
        _engine.simd_set("auto")
    for level, y in results.items():
        bad = np.argwhere(y.view(np.uint32) != results["scalar"].view(np.uint32))
        assert bad.size == 0, f"{name}: {level} differs from scalar at (token, row) {bad[:4].tolist()}"
