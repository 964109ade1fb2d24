"""Whole models in every quantized type: the engine against the NumPy reference, determinism, and a
clear refusal of types strata cannot run.

- Engine logits equal those of tests/reference.py run on the gguf-py-dequantized weights, within a
  normalized MSE declared per type. The only differences allowed are the engine's 8-bit activations
  (integer dot products) and float summation order; a wrong block layout or scale lands orders of
  magnitude above the bounds. A step whose router has a near tie in the reference (the last chosen
  and first unchosen expert closer than NEAR_TIE) may pick the other expert: such steps are counted
  (at most MAX_NEAR_TIES), not failed.
- Greedy decodes and their logits are bit-identical across thread counts and prompt chunkings (that
  the quantized kernels give the same bits at every SIMD level is tests/test_quants.py's; the float
  parts of the engine, such as attention, have their own orders per level).
- A file with a tensor of a type strata has no kernels for fails at open, naming the tensor and type.

The models are small qwen3moe files written here with gguf-py's GGUFWriter and strata's quantizers,
with dimensions that are multiples of 256 so that every matrix really is of the type under test; plus
the model maker's tiny Q4_K_M file, whose 128-wide rows fall back to 32-value types (a mixed file).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from gguf import GGMLQuantizationType, GGUFReader, GGUFWriter
from reference import Reference

from strata import Engine, EngineConfig
from strata._exceptions import StrataError
from strata.model import make_model, quants

pytestmark = pytest.mark.asan

# Normalized MSE of the final logits, sum (engine - ref)^2 / sum ref^2, per type of the matrices.
# Measured values are 1e-5 .. 1e-4 (the 8-bit activations); the bounds leave a factor of ~10.
NMSE_TOL = {
    "Q4_0": 2e-3, "Q4_1": 2e-3, "Q5_0": 2e-3, "Q5_1": 2e-3,
    "Q2_K": 2e-3, "Q3_K": 2e-3, "Q4_K": 2e-3, "Q5_K": 2e-3, "Q6_K": 2e-3,
    "IQ4_NL": 2e-3, "IQ4_XS": 2e-3, "IQ3_XXS": 2e-3, "IQ3_S": 2e-3, "IQ2_XS": 2e-3,
    "IQ2_XXS": 2e-3, "IQ2_S": 2e-3, "IQ1_S": 2e-3, "IQ1_M": 2e-3, "MXFP4": 2e-3,
    "q4_k_m": 2e-3, "mxfp4_moe": 2e-3, "iq1_m": 2e-3,
}  # fmt: skip
# The types llama.cpp's mixes put in these files (8 experts: its rules for Mixtral-like models apply).
MIX_TYPES = {
    "q4_k_m": {"Q4_K", "Q6_K", "Q8_0", "Q5_K"},  # attn_k / attn_v Q8_0, attn_output Q5_K
    "mxfp4_moe": {"MXFP4", "Q8_0"},
    "iq1_m": {"IQ1_M", "Q2_K", "Q4_K", "Q5_K"},  # token_embd Q2_K, attn_k / attn_v Q4_K, attn_output Q5_K
}
NEAR_TIE = 0.05
MAX_NEAR_TIES = 2
PROMPT = [5, 17, 101, 33, 260, 7, 400, 12, 99, 350, 41, 8]
DECODE_STEPS = 4

D, HD, H, HKV, E, K, F, V, L = 256, 64, 4, 2, 8, 2, 256, 512, 2


def _write_model(path: Path, pick: str, seed: int = 0) -> Path:
    """A qwen3moe file whose matrices are all of type `pick` (or of the mix `pick`)."""
    rng = np.random.default_rng(seed)
    w = GGUFWriter(str(path), "qwen3moe")
    w.add_name("strata-quant-test")
    w.add_context_length(512)
    w.add_embedding_length(D)
    w.add_block_count(L)
    w.add_head_count(H)
    w.add_head_count_kv(HKV)
    w.add_key_length(HD)
    w.add_value_length(HD)
    w.add_rope_freq_base(1e6)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_expert_count(E)
    w.add_expert_used_count(K)
    w.add_expert_feed_forward_length(F)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_tokenizer_model("gpt2")
    w.add_token_list([f"<t{i}>" for i in range(V)])

    def add(name: str, arr: np.ndarray, layer: int = -1) -> None:
        arr = np.ascontiguousarray(arr, dtype=np.float32)
        if arr.ndim == 1:
            w.add_tensor(name, arr)
            return
        t = quants.MIXES[pick](name, layer, L, n_expert=E, n_gqa=H // HKV) if pick in quants.MIXES else pick
        if t == "F32":
            w.add_tensor(name, arr)
            return
        qt = GGMLQuantizationType[t]
        w.add_tensor(name, quants.quantize(arr, t), raw_dtype=qt)

    def mat(*shape: int, std: float) -> np.ndarray:
        # random signs and scales: no shared direction for the hidden states to collapse onto
        return (rng.standard_normal(shape) * std).astype(np.float32)

    add("token_embd.weight", mat(V, D, std=1.0))
    add("output_norm.weight", 1.0 + 0.1 * rng.standard_normal(D))
    add("output.weight", mat(V, D, std=D**-0.5))
    for i in range(L):
        p = f"blk.{i}."
        add(p + "attn_norm.weight", 1.0 + 0.1 * rng.standard_normal(D))
        add(p + "attn_q.weight", mat(H * HD, D, std=D**-0.5), i)
        add(p + "attn_k.weight", mat(HKV * HD, D, std=D**-0.5), i)
        add(p + "attn_v.weight", mat(HKV * HD, D, std=D**-0.5), i)
        add(p + "attn_output.weight", mat(D, H * HD, std=0.5 * (H * HD) ** -0.5), i)
        add(p + "attn_q_norm.weight", 1.0 + 0.1 * rng.standard_normal(HD))
        add(p + "attn_k_norm.weight", 1.0 + 0.1 * rng.standard_normal(HD))
        add(p + "ffn_norm.weight", 1.0 + 0.1 * rng.standard_normal(D))
        w.add_tensor(p + "ffn_gate_inp.weight", mat(E, D, std=1.0))
        add(p + "ffn_gate_exps.weight", mat(E, F, D, std=D**-0.5), i)
        add(p + "ffn_up_exps.weight", mat(E, F, D, std=D**-0.5), i)
        add(p + "ffn_down_exps.weight", mat(E, D, F, std=0.5 * F**-0.5), i)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("quant-models")


def _model(model_dir: Path, pick: str) -> Path:
    path = model_dir / f"{pick}.gguf"
    if not path.exists():
        _write_model(path, pick)
    return path


def _nmse(got: np.ndarray, want: np.ndarray) -> float:
    return float(((got.astype(np.float64) - want) ** 2).sum() / (want.astype(np.float64) ** 2).sum())


@pytest.mark.parametrize("pick", list(NMSE_TOL))
def test_logits_match_the_reference(model_dir: Path, pick: str) -> None:
    path = _model(model_dir, pick)
    types = {t.tensor_type.name for t in GGUFReader(str(path)).tensors if len(t.shape) > 1}
    if pick.isupper():
        assert types - {"F32"} == {pick}, types
    else:
        assert types - {"F32"} == MIX_TYPES[pick], types
    ref = Reference(path)
    tol = NMSE_TOL[pick]
    near_ties, errors = [], []
    with Engine(path, EngineConfig(threads=2)) as eng:
        want = ref.forward(PROMPT)[-1]
        eng.prefill(PROMPT)
        for step in range(DECODE_STEPS + 1):
            got = eng.logits()
            err = _nmse(got, want)
            errors.append(err)
            if err > tol:
                assert ref.margins[-1] < NEAR_TIE, (
                    f"{pick}, step {step}: logits' normalized MSE {err:.2e} > {tol:.0e} "
                    f"(worst token {int(np.abs(got - want).argmax())}; router margin {ref.margins[-1]:.3f})"
                )
                near_ties.append(step)
                assert len(near_ties) <= MAX_NEAR_TIES, f"{pick}: too many near-tie steps {near_ties}"
            if step == DECODE_STEPS:
                break
            tok = int(np.argmax(want))
            want = ref.forward([tok])[-1]
            eng.decode(tok)
    assert min(errors) < tol / 5, f"{pick}: no step came close to the reference: {errors}"


def _greedy(path: Path, cfg: EngineConfig, chunked: bool) -> tuple[list[int], np.ndarray]:
    with Engine(path, cfg) as eng:
        if chunked:
            for t in PROMPT:
                eng.prefill([t])
        else:
            eng.prefill(PROMPT)
        out, logits = [], []
        for _ in range(6):
            lg = eng.logits()
            logits.append(lg)
            tok = int(np.argmax(lg))
            out.append(tok)
            eng.decode(tok)
        return out, np.stack(logits)


@pytest.mark.parametrize("pick", ["q4_k_m", "IQ4_XS", "Q5_K", "Q4_1", "IQ3_S", "IQ2_XS", "IQ1_M", "MXFP4"])
def test_greedy_decode_is_bit_identical(model_dir: Path, pick: str) -> None:
    path = _model(model_dir, pick)
    base_tokens, base_logits = _greedy(path, EngineConfig(threads=1), chunked=False)
    variants = {
        "2 threads": (EngineConfig(threads=2), False),
        "3 threads": (EngineConfig(threads=3), False),
        "token by token": (EngineConfig(threads=2), True),
        "chunks of 4": (EngineConfig(threads=2, prefill="4"), False),
    }
    for what, (cfg, chunked) in variants.items():
        tokens, logits = _greedy(path, cfg, chunked)
        assert tokens == base_tokens, f"{pick}: {what} decodes {tokens}, 1 thread {base_tokens}"
        bad = np.argwhere(logits.view(np.uint32) != base_logits.view(np.uint32))
        assert bad.size == 0, (
            f"{pick}: {what}: logits differ from 1 thread at (step, token) {bad[:3].tolist()}"
        )


def test_maker_q4_k_m_mixed_file(model_dir: Path) -> None:
    # The maker's tiny preset widened to 256: its 128-wide attention output rows fall back to Q5_0.
    path = make_model("tiny", "q4_k_m", 0, model_dir / "maker-q4_k_m.gguf", d_model=256, n_layer=2)
    types = {t.tensor_type.name for t in GGUFReader(str(path)).tensors if len(t.shape) > 1}
    assert {"Q4_K", "Q6_K"} & types and types - {"Q4_K", "Q6_K", "F32"}, types  # fallbacks mixed in
    ref = Reference(path)
    with Engine(path, EngineConfig(threads=2)) as eng:
        want = ref.forward(PROMPT)[-1]
        eng.prefill(PROMPT)
        err = _nmse(eng.logits(), want)
    assert err < 2e-3 or ref.margins[-1] < NEAR_TIE, f"tiny q4_k_m: logits' normalized MSE {err:.2e}"


@pytest.mark.parametrize("bad_type", ["TQ1_0", "TQ2_0"])
def test_unsupported_type_fails_at_open_naming_tensor_and_type(model_dir: Path, bad_type: str) -> None:
    src = _model(model_dir, "Q4_K")
    dst = model_dir / f"bad-{bad_type}.gguf"
    r = GGUFReader(str(src))
    w = GGUFWriter(str(dst), "qwen3moe")
    for f in r.fields.values():
        if f.name.startswith("GGUF.") or f.name == "general.architecture":
            continue
        w.add_key_value(f.name, f.contents(), f.types[0], f.types[-1] if len(f.types) > 1 else None)
    victim = "blk.1.attn_output.weight"
    bt = GGMLQuantizationType[bad_type]
    for t in r.tensors:
        shape = tuple(int(s) for s in reversed(t.shape))  # numpy order
        if t.name == victim:
            from gguf import GGML_QUANT_SIZES

            bs, ts = GGML_QUANT_SIZES[bt]
            raw = np.zeros((shape[0], shape[1] // bs * ts), np.uint8)
            w.add_tensor(t.name, raw, raw_dtype=bt)
        else:
            w.add_tensor(t.name, np.asarray(t.data), raw_dtype=t.tensor_type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(StrataError) as e:
        Engine(dst)
    msg = str(e.value)
    assert victim in msg and bad_type in msg, msg
