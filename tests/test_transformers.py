"""Hugging Face transformers' Qwen3-MoE against strata: the same random weights, the same logits.

A random small Qwen3-MoE is built in transformers, its weights are written to GGUF by strata's
writer, and the logits of transformers (float64) are compared with the NumPy reference and with
the engine. Agreement with an implementation that strata did not write is what shows that the
reference and the engine do not share a misunderstanding of the architecture.

The engine keeps its KV cache in float16. For the engine comparison transformers runs with an
attention function (registered through its ``AttentionInterface``) that rounds keys and values to
float16 before the usual eager attention, so that both sides use the same cache format; without it
the difference is about 1.6e-4 * max|logit|, all of it from that rounding.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

# the `reference` extra (make test installs it: pip install -e '.[reference]')
import torch
import transformers
from _hf_attention import F16_KV
from reference import Reference

from strata.model import PRESETS, write_weights
from strata.model._tokenizer import build_vocab

TOL_F32 = 1e-4  # max |engine - ref| <= TOL_F32 * max |ref|


CFG = dict(
    vocab_size=1024,
    hidden_size=64,
    num_hidden_layers=3,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=32,
    moe_intermediate_size=32,
    intermediate_size=128,
    num_experts=8,
    num_experts_per_tok=3,
    norm_topk_prob=True,
    rms_norm_eps=1e-6,
    max_position_embeddings=4096,
    tie_word_embeddings=False,
)
THETA = 50_000.0  # not the preset default, so the file's rope.freq_base must be read


def _hf_model(tied: bool, attn: str = "eager") -> torch.nn.Module:
    cfg = transformers.Qwen3MoeConfig(
        **{**CFG, "tie_word_embeddings": tied},
        rope_parameters={"rope_theta": THETA, "rope_type": "default"},
        experts_implementation="eager",  # the plain per-expert loop, which also runs in float64
        attn_implementation=attn,
    )
    model = transformers.Qwen3MoeForCausalLM(cfg).double().eval()
    g = torch.Generator().manual_seed(1234)
    # Values are drawn in float64 and rounded to float32 (what the file stores), so that both
    # sides compute with exactly the same weights.
    with torch.no_grad():
        for name, prm in model.named_parameters():
            if name.endswith("norm.weight") or "layernorm" in name:
                prm.copy_(torch.rand(prm.shape, generator=g, dtype=torch.float64) + 0.5)
            elif "embed_tokens" in name:
                prm.copy_(torch.randn(prm.shape, generator=g, dtype=torch.float64))
            else:
                fan_in = prm.shape[-1]
                prm.copy_(torch.randn(prm.shape, generator=g, dtype=torch.float64) / fan_in**0.5)
            prm.copy_(prm.float().double())
        if tied:
            model.tie_weights()
    return model


def _to_gguf(model: torch.nn.Module, path: Path, tied: bool) -> Path:
    c = CFG
    sd = {k: v.detach().numpy().astype(np.float32) for k, v in model.state_dict().items()}
    F = c["moe_intermediate_size"]
    w: dict[str, np.ndarray] = {"token_embd.weight": sd["model.embed_tokens.weight"]}
    for i in range(c["num_hidden_layers"]):
        h, b = f"model.layers.{i}.", f"blk.{i}."
        gate_up = sd[h + "mlp.experts.gate_up_proj"]  # [E, 2F, D]: gate rows, then up rows
        w |= {
            b + "attn_norm.weight": sd[h + "input_layernorm.weight"],
            b + "attn_q.weight": sd[h + "self_attn.q_proj.weight"],
            b + "attn_k.weight": sd[h + "self_attn.k_proj.weight"],
            b + "attn_v.weight": sd[h + "self_attn.v_proj.weight"],
            b + "attn_q_norm.weight": sd[h + "self_attn.q_norm.weight"],
            b + "attn_k_norm.weight": sd[h + "self_attn.k_norm.weight"],
            b + "attn_output.weight": sd[h + "self_attn.o_proj.weight"],
            b + "ffn_norm.weight": sd[h + "post_attention_layernorm.weight"],
            b + "ffn_gate_inp.weight": sd[h + "mlp.gate.weight"],
            b + "ffn_gate_exps.weight": np.ascontiguousarray(gate_up[:, :F, :]),
            b + "ffn_up_exps.weight": np.ascontiguousarray(gate_up[:, F:, :]),
            b + "ffn_down_exps.weight": sd[h + "mlp.experts.down_proj"],
        }
    w["output_norm.weight"] = sd["model.norm.weight"]
    if not tied:
        w["output.weight"] = sd["lm_head.weight"]
    preset = PRESETS["tiny"].with_overrides(
        name="hf-random",
        n_vocab=c["vocab_size"],
        d_model=c["hidden_size"],
        n_layer=c["num_hidden_layers"],
        n_head=c["num_attention_heads"],
        n_head_kv=c["num_key_value_heads"],
        head_dim=c["head_dim"],
        n_expert=c["num_experts"],
        n_expert_used=c["num_experts_per_tok"],
        d_ff_expert=F,
        d_ff=c["intermediate_size"],
        n_ctx=c["max_position_embeddings"],
        rope_theta=THETA,
        rms_eps=c["rms_norm_eps"],
        tie_embeddings=tied,
    )
    return write_weights(path, preset, w, "f32")


def _prompt(n: int) -> list[int]:
    text = "A harbour town, a lighthouse and a clock maker who explains pendulums to anyone. " * 40
    ids = build_vocab(CFG["vocab_size"]).tokenizer.encode(text).ids  # type: ignore[attr-defined]
    assert len(ids) >= n
    return ids[:n]


def _hf_logits(model: torch.nn.Module, ids: list[int]) -> np.ndarray:
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0].numpy()


@pytest.fixture(scope="module", params=[False, True], ids=["output-head", "tied-embedding"])
def hf_case(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    tied = request.param
    model = _hf_model(tied)
    path = _to_gguf(model, tmp_path_factory.mktemp("hf") / f"hf-{'tied' if tied else 'head'}.gguf", tied)
    return model, path, _hf_model(tied, F16_KV)


def test_reference_equals_transformers(hf_case) -> None:  # type: ignore[no-untyped-def]
    model, path, model_f16kv = hf_case
    ids = _prompt(80)
    want = _hf_logits(model, ids)
    ref = Reference(path, kv_dtype=None)
    got = np.concatenate([ref.forward(ids[:50]), *(ref.forward([t]) for t in ids[50:])])
    # The same float32 weights on both sides; transformers computes its softmaxes and rotary angles
    # in float32 even in a float64 model, hence float32-epsilon-sized differences.
    err = np.abs(got - want).max() / np.abs(want).max()
    assert err < 1e-5, f"reference vs transformers: max|d|/max|ref| = {err:.2e}"
    assert (got.argmax(-1) == want.argmax(-1)).all()
    # and with the engine's float16 KV cache format on both sides
    ref16 = Reference(path, kv_dtype=np.float16)
    got16 = ref16.forward(ids)
    want16 = _hf_logits(model_f16kv, ids)
    err16 = np.abs(got16 - want16).max() / np.abs(want16).max()
    assert err16 < 1e-5, f"reference vs transformers, float16 KV: max|d|/max|ref| = {err16:.2e}"


def test_engine_equals_transformers(hf_case) -> None:  # type: ignore[no-untyped-def]
    import strata._engine as engine_mod

    _, path, model = hf_case
    ids = _prompt(64)
    with engine_mod.Engine(path) as eng:
        eng.prefill(ids)
        seq = list(ids)
        worst = 0.0
        for step in range(17):
            want = _hf_logits(model, seq)[-1]
            got = eng.logits()
            err = float(np.abs(got - want).max() / np.abs(want).max())
            worst = max(worst, err)
            assert err <= TOL_F32, (
                f"step {step}: max|engine - transformers| / max|ref| = {err:.2e} > {TOL_F32}"
            )
            if step == 16:
                break
            nxt = int(np.argmax(want))
            eng.decode(nxt)
            seq.append(nxt)
    print(f"engine vs transformers, f32 weights: worst max|d|/max|ref| = {worst:.2e}")
