"""Each MoE family strata runs, against Hugging Face transformers' own implementation of it.

For every family a random tiny model is built in transformers (torch CPU), saved with
``save_pretrained`` and converted to GGUF by llama.cpp's ``convert_hf_to_gguf.py`` (tests/_hf_convert.py
fetches it from the llama-cpp-python source package). Neither the weights' layout nor the metadata is
written by strata, so a misreading of the family (rotary layout, norms, routing, shared experts,
multipliers) shows as a difference from transformers. The files are cached by their recipe.

Per family and file type (f32, f16), over several prompts, the engine reads the prompt and decodes
greedily; transformers computes the logits of the same tokens in float64, with its weights rounded as
the file stores them (f16 files: every matrix but the routers, which the converter keeps in f32) and its
cached keys and values rounded to float16 (the engine's KV cache format), so both sides compute with the
same numbers. At every step max |engine - transformers| <= TOL * max |transformers|: the engine's f32
arithmetic against float64 (about 1e-6 of max |logit| here) plus the cached values that round to the
other float16 neighbour (tests/test_reference.py derives what one such flip costs: up to about 2e-4 of
max |logit|; the bound allows two). The engine's greedy token equals transformers' argmax at every step,
except where transformers' top two logits are closer than twice that bound (a near-tie), which the
test counts.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest

# the `reference` extra (make test installs it: pip install -e '.[reference]')
import torch
import transformers
from _hf_attention import F16_KV, round_latent_kv
from _hf_convert import convert
from _llama_vocab import VERSION

import strata._engine as engine_mod
from strata import EngineConfig, ModelFileError
from strata.model._cache import cache_dir, file_lock
from strata.model._tokenizer import build_vocab

TOL = 4e-4  # max |engine - transformers| <= TOL * max |transformers| (two float16 flips of the KV cache)
DECODE_STEPS = 12
PROMPT_LENGTHS = (1, 9, 40)
SEED = 1234
RECIPE = 1  # bump when the weights' recipe below changes: the cached files are keyed by it


COMMON: dict[str, Any] = dict(
    vocab_size=1024,
    hidden_size=64,
    num_hidden_layers=3,
    num_attention_heads=4,
    num_key_value_heads=2,
    rms_norm_eps=1e-6,
    max_position_embeddings=4096,
    tie_word_embeddings=False,
    rope_parameters={"rope_theta": 50_000.0, "rope_type": "default"},
)


@dataclass(frozen=True)
class Family:
    arch: str  # general.architecture of the converted file
    config: str  # transformers config class
    model: str  # transformers causal-LM class
    options: dict[str, Any] = field(default_factory=dict)
    # parameters the converter keeps in f32 in an f16 file (besides vectors): the routers and gates
    f32_names: tuple[str, ...] = ("mlp.gate.weight",)
    # multi-head latent attention: the engine caches the latent and k_pe, not keys and values
    latent_kv: bool = False


# glm4moe: sigmoid routing with the correction bias, routed scale, a shared expert, a dense leading
# layer, partial rotary (half the head), q/k/v biases; the variant below changes what it names
# the routed and shared experts of glm4moe and deepseek2 (V3): 8 routed (top 3), one shared, a routed scale,
# a dense leading layer
_ROUTED_AND_SHARED: dict[str, Any] = dict(
    intermediate_size=96,
    moe_intermediate_size=32,
    n_routed_experts=8,
    num_experts_per_tok=3,
    n_shared_experts=1,
    routed_scaling_factor=2.5,
    first_k_dense_replace=1,
    norm_topk_prob=True,
)

_GLM4MOE: dict[str, Any] = dict(
    **_ROUTED_AND_SHARED,
    n_group=1,
    topk_group=1,
    use_qk_norm=False,
    attention_bias=True,
    num_mtp_layers=0,
    rope_parameters={"rope_theta": 50_000.0, "rope_type": "default", "partial_rotary_factor": 0.5},
)
# qwen3moe's blocks, for the rope-scaling cases
_QWEN3MOE: dict[str, Any] = dict(
    head_dim=16,
    intermediate_size=96,
    moe_intermediate_size=32,
    num_experts=8,
    num_experts_per_tok=3,
    norm_topk_prob=True,
)

# gpt-oss: attention sinks, sliding-window layers (even ones) with a window shorter than the longest prompt,
# biases on q/k/v/o, the router and the experts, YaRN without truncation of the ramp, the clamped SwiGLU
_GPT_OSS: dict[str, Any] = dict(
    num_hidden_layers=4,
    head_dim=16,
    intermediate_size=32,
    num_local_experts=8,
    num_experts_per_tok=3,
    sliding_window=7,
    rms_norm_eps=1e-5,
    rope_parameters={
        "rope_theta": 50_000.0,
        "rope_type": "yarn",
        "factor": 8.0,
        "beta_fast": 32.0,
        "beta_slow": 1.0,
        "truncate": False,
        "original_max_position_embeddings": 512,
    },
)

# deepseek2 (DeepSeek V3's blocks): multi-head latent attention with a low-rank q, sigmoid routing with the
# correction bias, group-limited top-k (the 2 best of 4 groups), routed scale, a shared expert, a dense
# leading layer; the variant below is V2-Lite's
_DEEPSEEK_V3: dict[str, Any] = dict(
    **_ROUTED_AND_SHARED,
    n_group=4,
    topk_group=2,
    q_lora_rank=24,
    kv_lora_rank=32,
    qk_nope_head_dim=16,
    qk_rope_head_dim=8,
    v_head_dim=12,
    scoring_func="sigmoid",  # as DeepSeek V3's config.json says it (the converter reads it)
    num_key_value_heads=4,  # as many as the heads, as the published configs say (the converter expects it)
)

FAMILIES = {
    # shared expert with a sigmoid gate, q/k/v biases, raw (not renormalized) top-k weights
    "qwen2moe": Family(
        "qwen2moe",
        "Qwen2MoeConfig",
        "Qwen2MoeForCausalLM",
        dict(
            intermediate_size=96,
            moe_intermediate_size=32,
            shared_expert_intermediate_size=48,
            num_experts=8,
            num_experts_per_tok=3,
        ),
        ("mlp.gate.weight", "shared_expert_gate.weight"),
    ),
    # the llama architecture with experts: q and k rows permuted by the converter (adjacent rotary pairs)
    "mixtral": Family(
        "llama",
        "MixtralConfig",
        "MixtralForCausalLM",
        dict(intermediate_size=32, num_local_experts=8, num_experts_per_tok=2),
    ),
    # q and k norms over the whole projection, raw top-k weights
    "olmoe": Family(
        "olmoe",
        "OlmoeConfig",
        "OlmoeForCausalLM",
        dict(intermediate_size=32, num_experts=8, num_experts_per_tok=3),
    ),
    # embedding, attention, residual and logit multipliers (none of them the neutral value)
    "granitemoe": Family(
        "granitemoe",
        "GraniteMoeConfig",
        "GraniteMoeForCausalLM",
        dict(
            intermediate_size=32,
            num_local_experts=8,
            num_experts_per_tok=2,
            embedding_multiplier=3.0,
            attention_multiplier=0.1,
            residual_multiplier=0.5,
            logits_scaling=2.5,
        ),
        ("router.layer.weight",),
    ),
    # _GLM4MOE's blocks
    "glm4moe": Family("glm4moe", "Glm4MoeConfig", "Glm4MoeForCausalLM", _GLM4MOE),
    # and with its optional per-head q/k norms (use_qk_norm), no dense layer, two shared experts, raw weights
    "glm4moe-qknorm": Family(
        "glm4moe",
        "Glm4MoeConfig",
        "Glm4MoeForCausalLM",
        {
            **_GLM4MOE,
            "num_experts_per_tok": 2,
            "n_shared_experts": 2,
            "routed_scaling_factor": 1.0,
            "first_k_dense_replace": 0,
            "norm_topk_prob": False,
            "use_qk_norm": True,
            "attention_bias": False,
        },
    ),
    # _DEEPSEEK_V3's blocks
    "deepseek2-v3": Family(
        "deepseek2", "DeepseekV3Config", "DeepseekV3ForCausalLM", _DEEPSEEK_V3, latent_kv=True
    ),
    # DeepSeek V2-Lite's: q projected directly (no q_lora), softmax routing without groups, raw top-k
    # weights, two shared experts, values as wide as the keys' unrotated part
    "deepseek2-lite": Family(
        "deepseek2",
        "DeepseekV2Config",
        "DeepseekV2ForCausalLM",
        {
            **{k: v for k, v in _DEEPSEEK_V3.items() if k not in ("n_group", "topk_group")},
            "num_experts_per_tok": 2,
            "n_shared_experts": 2,
            "routed_scaling_factor": 1.0,
            "norm_topk_prob": False,
            "q_lora_rank": None,
            "v_head_dim": 16,
            "topk_method": "greedy",
            "scoring_func": "softmax",
        },
        latent_kv=True,
    ),
    # DeepSeek V2's: V2-Lite's with a low-rank q, softmax routing limited to the 2 best of 4 groups (a
    # group scores its best expert) and a routed scale
    "deepseek2-v2": Family(
        "deepseek2",
        "DeepseekV2Config",
        "DeepseekV2ForCausalLM",
        {
            **_DEEPSEEK_V3,
            "n_shared_experts": 2,
            "norm_topk_prob": False,
            "topk_method": "group_limited_greedy",
            "scoring_func": "softmax",
        },
        latent_kv=True,
    ),
    # and with YaRN rope scaling as DeepSeek V3 files have it: mscale_all_dim scales the softmax (the file's
    # rope.scaling.yarn_log_mul), mscale the same, so cos and sin keep their magnitude
    "deepseek2-yarn": Family(
        "deepseek2",
        "DeepseekV3Config",
        "DeepseekV3ForCausalLM",
        {
            **_DEEPSEEK_V3,
            "rope_parameters": {
                "rope_theta": 50_000.0,
                "rope_type": "yarn",
                "factor": 4.0,
                "original_max_position_embeddings": 1024,
                "mscale": 1.0,
                "mscale_all_dim": 1.0,
                "beta_fast": 32,
                "beta_slow": 1,
            },
        },
        latent_kv=True,
    ),
    # and with as many rotated dims as the latent has values: a cached row of 64, which --kv int8 holds
    "deepseek2-rope32": Family(
        "deepseek2",
        "DeepseekV3Config",
        "DeepseekV3ForCausalLM",
        {**_DEEPSEEK_V3, "qk_rope_head_dim": 32},
        latent_kv=True,
    ),
    # qwen3moe's blocks with YaRN rope scaling read from the file (rope.scaling.*: long-context files)
    "qwen3moe-yarn": Family(
        "qwen3moe",
        "Qwen3MoeConfig",
        "Qwen3MoeForCausalLM",
        {
            **_QWEN3MOE,
            "rope_parameters": {
                "rope_theta": 50_000.0,
                "rope_type": "yarn",
                "factor": 4.0,
                "original_max_position_embeddings": 1024,
            },
        },
    ),
    # and with linear scaling (positions divided by the factor)
    "qwen3moe-linear": Family(
        "qwen3moe",
        "Qwen3MoeConfig",
        "Qwen3MoeForCausalLM",
        {**_QWEN3MOE, "rope_parameters": {"rope_theta": 50_000.0, "rope_type": "linear", "factor": 3.0}},
    ),
    "gpt-oss": Family(
        "gpt-oss",
        "GptOssConfig",
        "GptOssForCausalLM",
        _GPT_OSS,
        ("mlp.router.weight", "experts.gate_up_proj_bias", "experts.down_proj_bias"),
    ),
    # and with a head dim the tiled attention kernels take (32), a window of 20 that spans 16-position tiles
    "gpt-oss-hd32": Family(
        "gpt-oss",
        "GptOssConfig",
        "GptOssForCausalLM",
        {**_GPT_OSS, "head_dim": 32, "sliding_window": 20},
        ("mlp.router.weight", "experts.gate_up_proj_bias", "experts.down_proj_bias"),
    ),
}


def _config(fam: Family, attn: str = "eager") -> Any:
    cls = getattr(transformers, fam.config)
    return cls(**{**COMMON, **fam.options}, experts_implementation="eager", attn_implementation=attn)


def _random_model(fam: Family) -> torch.nn.Module:
    """The family's model with random weights in float32 (as the converter will read them)."""
    model = getattr(transformers, fam.model)(_config(fam)).double().eval()
    g = torch.Generator().manual_seed(SEED)
    with torch.no_grad():
        for name, prm in model.named_parameters():
            if name.endswith("norm.weight") or "layernorm" in name:
                prm.copy_(torch.rand(prm.shape, generator=g, dtype=torch.float64) + 0.5)
            elif "embed_tokens" in name:
                prm.copy_(torch.randn(prm.shape, generator=g, dtype=torch.float64))
            elif prm.ndim == 1:  # biases
                prm.copy_(torch.randn(prm.shape, generator=g, dtype=torch.float64) * 0.3)
            else:
                prm.copy_(torch.randn(prm.shape, generator=g, dtype=torch.float64) / prm.shape[-1] ** 0.5)
            # gpt-oss: gate and up large enough that its SwiGLU's clamps bite
            if name.endswith("experts.gate_up_proj"):
                prm.mul_(4.0)
        for name, buf in model.named_buffers():
            if name.endswith("e_score_correction_bias"):  # the routing bias: a buffer, saved with the weights
                buf.copy_(torch.randn(buf.shape, generator=g, dtype=torch.float64) * 0.1)
    return model.float()


def _save_tokenizer(folder: Path) -> None:
    tok = build_vocab(COMMON["vocab_size"]).tokenizer
    fast = transformers.PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<|endoftext|>", eos_token="<|im_end|>", pad_token="<|endoftext|>"
    )
    fast.save_pretrained(folder)


def _files(name: str) -> Path:
    """The family's saved model (hf/) and its two conversions, made once per recipe and cached."""
    fam = FAMILIES[name]
    key = json.dumps([RECIPE, SEED, VERSION, transformers.__version__, COMMON, fam.options], sort_keys=True)
    d = cache_dir(f"hf-families/{name}-{hashlib.sha256(key.encode()).hexdigest()[:12]}")
    done = d / "model-f16.gguf"
    if done.is_file():
        return d
    with file_lock(d / ".lock"):
        if not done.is_file():
            _random_model(fam).save_pretrained(d / "hf")
            _save_tokenizer(d / "hf")
            part = d / ".model-f16.part.gguf"
            convert(d / "hf", {"f32": d / "model-f32.gguf", "f16": part})
            part.replace(done)
    return d


def _reference(fam: Family, folder: Path, f16_weights: bool, kv: str = "f16") -> torch.nn.Module:
    """transformers' model of the saved weights in float64, rounded as an f16 file stores them when asked, its
    cache rounded as the engine's of type kv (int8: latent-caching families only)."""
    model = getattr(transformers, fam.model).from_pretrained(
        folder / "hf", config=_config(fam, "eager" if fam.latent_kv else F16_KV), dtype=torch.float32
    )
    model = model.double().eval()
    if fam.latent_kv:
        round_latent_kv(model, kv)
    if f16_weights:
        with torch.no_grad():
            for name, prm in model.named_parameters():
                if prm.ndim >= 2 and not any(name.endswith(s) for s in fam.f32_names):
                    prm.copy_(prm.to(torch.float16).double())
    return model


def _prompt(n: int, salt: int) -> list[int]:
    text = "A harbour town, a lighthouse and a clock maker who explains pendulums to anyone. " * 8
    ids = build_vocab(COMMON["vocab_size"]).tokenizer.encode(text).ids  # type: ignore[attr-defined]
    return ids[salt : salt + n]


@pytest.fixture(scope="module", params=list(FAMILIES))
def family(request: pytest.FixtureRequest) -> tuple[str, Path]:
    return request.param, _files(request.param)


def test_converted_file_is_the_family(family: tuple[str, Path]) -> None:
    """The converter wrote the architecture the family's row is keyed by (not a look-alike)."""
    import gguf

    name, d = family
    r = gguf.GGUFReader(d / "model-f32.gguf")
    arch = r.fields["general.architecture"]
    assert bytes(arch.parts[arch.data[0]]).decode() == FAMILIES[name].arch


@pytest.mark.parametrize("ftype", ["f32", "f16"])
def test_engine_equals_transformers(family: tuple[str, Path], ftype: str) -> None:
    name, d = family
    fam = FAMILIES[name]
    ref = _reference(fam, d, ftype == "f16")
    worst, near_ties, steps = 0.0, 0, 0
    with engine_mod.Engine(d / f"model-{ftype}.gguf") as eng:
        for salt, n in enumerate(PROMPT_LENGTHS):
            eng.kv_reset()
            ids = _prompt(n, 3 * salt)
            eng.prefill(ids)
            seq = list(ids)
            got = []
            for _ in range(DECODE_STEPS):
                lg = np.array(eng.logits(), dtype=np.float64)
                got.append(lg)
                nxt = int(np.argmax(lg))
                eng.decode(nxt)
                seq.append(nxt)
            with torch.no_grad():
                want = ref(torch.tensor([seq[:-1]])).logits[0].numpy()[len(ids) - 1 :]
            for step, (g, w) in enumerate(zip(got, want, strict=True)):
                scale = float(np.abs(w).max())
                err = float(np.abs(g - w).max()) / scale
                worst = max(worst, err)
                steps += 1
                assert err <= TOL, (
                    f"{name} {ftype}, prompt of {n}, step {step}: max|engine - transformers| / max|ref| = "
                    f"{err:.2e} > {TOL}"
                )
                top2 = np.sort(w)[-2:]
                if int(np.argmax(g)) != int(np.argmax(w)):
                    margin = float(top2[1] - top2[0]) / scale
                    assert margin < 2 * TOL, (
                        f"{name} {ftype}, prompt of {n}, step {step}: the engine picked {int(np.argmax(g))}, "
                        f"transformers {int(np.argmax(w))} by a margin of {margin:.2e} of max|logit| (not a near-tie)"
                    )
                    near_ties += 1
    print(f"{name} {ftype}: worst max|d|/max|ref| = {worst:.2e} over {steps} steps, {near_ties} near-ties")
    assert near_ties <= 2, f"{name} {ftype}: {near_ties} near-tie divergences"


@pytest.mark.parametrize("name", ["qwen2moe", "mixtral", "olmoe", "granitemoe", "glm4moe", "deepseek2"])
def test_maker_writes_the_converters_layout(name: str) -> None:
    """strata's maker (preset tiny-<family>) writes the tensors and the family's metadata keys that
    llama.cpp's converter writes for the same family (so benchmarks on made files run real files' path)."""
    import gguf

    from strata.model import ensure_model

    def layout(path: Path) -> tuple[str, set[str], set[str]]:
        r = gguf.GGUFReader(path)
        arch = str(r.fields["general.architecture"].contents())
        names = {".".join(p for p in t.name.split(".") if not p.isdigit()) for t in r.tensors}
        keys = {k for k in r.fields if k.startswith(arch + ".")}
        return arch, names, keys

    # the maker's deepseek2 is DeepSeek V3's layout
    arch, conv_names, conv_keys = layout(
        _files({"deepseek2": "deepseek2-v3"}.get(name, name)) / "model-f32.gguf"
    )
    made_arch, made_names, made_keys = layout(ensure_model(f"tiny-{name}", "f32", 0))
    assert made_arch == arch
    assert made_names == conv_names, (
        f"only converter: {conv_names - made_names}; only maker: {made_names - conv_names}"
    )
    # every key the converter wrote for the family is in the made file (the maker writes more: key_length...)
    assert conv_keys - {f"{arch}.vocab_size", f"{arch}.rope.dimension_count"} <= made_keys, (
        conv_keys - made_keys
    )


def test_expert_cache_and_chunks_change_nothing(family: tuple[str, Path]) -> None:
    """Each family keeps the engine's determinism: 8 slots of the expert cache (so most experts are
    misses, streamed through the prompt's ring or run from host memory) and prompts read in small chunks
    give the same bits as every expert cached; dense leading layers hold no experts (residency -1)."""
    name, d = family
    path = d / "model-f32.gguf"
    ids = _prompt(40, 0)
    runs = []
    for cfg in (
        EngineConfig(threads=1),
        EngineConfig(threads=2, expert_cache="8", prefill="8", lend_pct=0.75),
    ):
        with engine_mod.Engine(path, cfg) as eng:
            eng.prefill(ids)
            out = [eng.logits().copy()]
            for _ in range(6):
                eng.decode(int(np.argmax(out[-1])))
                out.append(eng.logits().copy())
            res = eng.residency()
            n_dense = FAMILIES[name].options.get("first_k_dense_replace", 0)
            assert (res[:n_dense] == -1).all() and (res[n_dense:] >= 0).sum() == min(
                eng.plan.n_slots, res[n_dense:].size
            )
            runs.append(np.stack(out))
    assert np.array_equal(runs[0], runs[1]), (
        f"{name}: logits differ with a small expert cache and small chunks"
    )


def test_several_sequences_decode_as_each_alone(family: tuple[str, Path]) -> None:
    """Each family's decode step of several sequences (--parallel) gives every row the bits of that
    sequence decoded alone: its blocks (multipliers, biases, shared experts, dense layers) run per row."""
    name, d = family
    path = d / "model-f32.gguf"
    prompts = [_prompt(n, salt) for salt, n in enumerate((1, 9, 40, 17))]
    alone = []
    with engine_mod.Engine(path, EngineConfig(threads=2)) as eng:
        for p in prompts:
            eng.kv_reset()
            eng.prefill(p)
            out = [eng.logits()]
            for _ in range(5):
                eng.decode(int(np.argmax(out[-1])))
                out.append(eng.logits())
            alone.append(np.stack(out))
    with engine_mod.Engine(path, EngineConfig(threads=2, parallel=len(prompts))) as eng:
        for q, p in enumerate(prompts):
            eng.seq_prefill(q, p)
        got = [[eng.seq_logits(q)] for q in range(len(prompts))]
        for _ in range(5):
            seqs = list(range(len(prompts)))
            eng.decode_batch(seqs, [int(np.argmax(got[q][-1])) for q in seqs])
            for q in seqs:
                got[q].append(eng.seq_logits(q))
    for q, (a, g) in enumerate(zip(alone, got, strict=True)):
        assert np.array_equal(a, np.stack(g)), f"{name}: sequence {q} differs decoded beside others"


# ---- gpt-oss with MXFP4 experts ------------------------------------------------------------------------

# The converter writes MXFP4 experts only from a quantized checkpoint; a random float model converts to f32,
# so the f32 file's expert matrices are requantized here with gguf-py's MXFP4 quantizer, and transformers
# computes with the same values (gguf-py's dequantization of them). What is left between the two is the
# engine's 8-bit activations in the MXFP4 products (Q8_0 blocks, integer dot products, as in
# tests/test_quant_models.py): measured, the MXFP4 file's logits differ from those of an f32 file of the same
# dequantized values by what they differ from transformers', NMSE 1e-4 .. 3e-3 here (this model's clamped,
# 4x gates amplify the activations' rounding), under a bound a factor of 3 or more above; except at a step
# where some layer's router had a near tie in transformers (its K-th and (K+1)-th logits closer than
# MXFP4_NEAR_TIE): there the rounding may pick the other expert, and such steps are counted, at most
# MXFP4_MAX_NEAR_TIES, not failed (measured: 2 of 36, at margins of 0.004 and 0.005).
MXFP4_NMSE_TOL = 1e-2
MXFP4_NEAR_TIE = 0.05
MXFP4_MAX_NEAR_TIES = 3
_EXPERTS = ("ffn_gate_exps.weight", "ffn_up_exps.weight", "ffn_down_exps.weight")


def _rewrite(src: Path, out: Path, drop: tuple[str, ...] = (), mxfp4: bool = False) -> dict[str, np.ndarray]:
    """src written again without the metadata keys in drop and, with mxfp4, its routed experts' matrices in
    MXFP4; returns those matrices' dequantized values by tensor name."""
    import gguf
    from gguf import quants

    r = gguf.GGUFReader(src)
    arch = str(r.fields["general.architecture"].contents())
    w = gguf.GGUFWriter(str(out), arch)
    for key, f in r.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture" or key in drop:
            continue
        sub = f.types[-1] if f.types[0] == gguf.GGUFValueType.ARRAY else None
        w.add_key_value(key, f.contents(), f.types[0], sub_type=sub)
    deq: dict[str, np.ndarray] = {}
    for t in r.tensors:
        data = np.asarray(t.data)
        if mxfp4 and t.name.endswith(_EXPERTS):
            q = quants.quantize(data.astype(np.float32), gguf.GGMLQuantizationType.MXFP4)
            deq[t.name] = quants.dequantize(q, gguf.GGMLQuantizationType.MXFP4).reshape(data.shape)
            w.add_tensor(t.name, q, raw_dtype=gguf.GGMLQuantizationType.MXFP4)
        else:
            w.add_tensor(t.name, data)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return deq


def test_gpt_oss_mxfp4_experts_equal_transformers(tmp_path: Path) -> None:
    """A gpt-oss file whose experts are MXFP4 (the type real gpt-oss files carry) runs through the expert
    path's kernels and equals transformers given the dequantized experts."""
    import gguf

    name = "gpt-oss"
    fam, d = FAMILIES[name], _files(name)
    path = tmp_path / "model-mxfp4.gguf"
    deq = _rewrite(d / "model-f32.gguf", path, mxfp4=True)
    r = gguf.GGUFReader(path)
    assert {t.tensor_type.name for t in r.tensors if t.name.endswith(_EXPERTS)} == {"MXFP4"}
    ref = _reference(fam, d, False)
    k = fam.options["num_experts_per_tok"]
    margins: list[torch.Tensor] = []  # per layer: each token's K-th minus (K+1)-th router logit

    def router_margin(_mod: torch.nn.Module, _inp: Any, out: Any) -> None:
        top = torch.topk(out[0], k + 1, dim=-1).values
        margins.append(top[:, k - 1] - top[:, k])

    with torch.no_grad():
        for il, layer in enumerate(ref.model.layers):
            layer.mlp.router.register_forward_hook(router_margin)
            ex = layer.mlp.experts
            gate = torch.from_numpy(deq[f"blk.{il}.ffn_gate_exps.weight"]).double()  # [E, F, D]
            up = torch.from_numpy(deq[f"blk.{il}.ffn_up_exps.weight"]).double()
            down = torch.from_numpy(deq[f"blk.{il}.ffn_down_exps.weight"]).double()  # [E, D, F]
            ex.gate_up_proj[:, :, 0::2] = gate.transpose(1, 2)  # the converter's split of gate and up, undone
            ex.gate_up_proj[:, :, 1::2] = up.transpose(1, 2)
            ex.down_proj.copy_(down.transpose(1, 2))
    worst, steps, near_ties = 0.0, 0, 0
    with engine_mod.Engine(path) as eng:
        for salt, n in enumerate(PROMPT_LENGTHS):
            eng.kv_reset()
            ids = _prompt(n, 3 * salt)
            eng.prefill(ids)
            seq, got = list(ids), []
            for _ in range(DECODE_STEPS):
                lg = np.array(eng.logits(), dtype=np.float64)
                got.append(lg)
                seq.append(int(np.argmax(lg)))
                eng.decode(seq[-1])
            margins.clear()
            with torch.no_grad():
                want = ref(torch.tensor([seq[:-1]])).logits[0].numpy()[len(ids) - 1 :]
            tie = torch.stack(margins).min(0).values.numpy()[len(ids) - 1 :]  # the closest layer, per token
            for step, (g, w) in enumerate(zip(got, want, strict=True)):
                nmse = float(((g - w) ** 2).sum() / (w**2).sum())
                steps += 1
                if nmse > MXFP4_NMSE_TOL and tie[step] < MXFP4_NEAR_TIE:
                    near_ties += 1
                    continue
                worst = max(worst, nmse)
                assert nmse <= MXFP4_NMSE_TOL, (
                    f"{name} MXFP4, prompt of {n}, step {step}: NMSE {nmse:.2e} > {MXFP4_NMSE_TOL} "
                    f"(closest router margin {tie[step]:.3f})"
                )
    print(f"{name} MXFP4 experts: worst NMSE = {worst:.2e} over {steps} steps, {near_ties} near-ties")
    assert near_ties <= MXFP4_MAX_NEAR_TIES, (
        f"{name} MXFP4: {near_ties} steps over the bound at router near-ties"
    )


def test_model_info_names_gpt_oss_blocks() -> None:
    """strata model info names gpt-oss and the blocks its file composes."""
    from strata.model.cli import describe

    d = describe(_files("gpt-oss") / "model-f32.gguf")
    assert d["unsupported"] is None
    assert d["blocks"] == (
        "gpt-oss: attention GQA 4/2, q/k/v biases, rope neox yarn x8, output bias, sinks, sliding window 7 on "
        "1 of every 2 layers; moe softmax with router bias top-3 of 8 normalized, expert biases, clamped swiglu"
    )


def test_gpt_oss_without_its_sliding_window_is_refused(tmp_path: Path) -> None:
    """gpt-oss's sliding layers need attention.sliding_window: a file without it fails at open naming the
    key (never runs them as full attention)."""
    path = tmp_path / "no-window.gguf"
    _rewrite(_files("gpt-oss") / "model-f32.gguf", path, drop=("gpt-oss.attention.sliding_window",))
    with pytest.raises(ModelFileError) as exc:
        engine_mod.Engine(path)
    assert "gpt-oss.attention.sliding_window" in str(exc.value)


@pytest.mark.parametrize("name", ["deepseek2-v3", "deepseek2-lite"])
def test_mla_caches_the_latent(name: str) -> None:
    """Multi-head latent attention's cache holds, per layer and position, the latent (kv_lora_rank values)
    and the shared k_pe (rope dims) in float16 and nothing else, and the memory plan counts exactly that;
    `strata model info` names the attention and its routing."""
    from strata.model.cli import describe

    opts = FAMILIES[name].options
    path = _files(name) / "model-f32.gguf"
    row = opts["kv_lora_rank"] + opts["qk_rope_head_dim"]
    for ctx, par in ((256, 1), (512, 3)):
        with engine_mod.Engine(path, EngineConfig(max_context=ctx, parallel=par)) as eng:
            plan = eng.plan
            assert plan.kv_bytes == par * COMMON["num_hidden_layers"] * plan.max_context * row * 2
    blocks = describe(path)["blocks"]
    assert blocks.startswith("DeepSeek-V2/V3: attention MLA 4 heads (")
    assert f"kv lora {opts['kv_lora_rank']}" in blocks and "cache: latent + k_pe" in blocks
    if opts.get("q_lora_rank"):
        assert f"q lora {opts['q_lora_rank']}" in blocks and "in 2 of 4 groups" in blocks
    else:
        assert "q direct" in blocks and "groups" not in blocks


def test_mla_int8_cache_equals_transformers() -> None:
    """--kv int8 on the latent cache: a row of the latent and k_pe in blocks of 32 (values read back from the
    key row's first blocks) gives transformers' logits with the cached row rounded the same way."""
    name = "deepseek2-rope32"
    fam, d = FAMILIES[name], _files(name)
    ref = _reference(fam, d, False, kv="int8")
    worst = 0.0
    with engine_mod.Engine(d / "model-f32.gguf", EngineConfig(kv="int8")) as eng:
        for salt, n in enumerate(PROMPT_LENGTHS):
            eng.kv_reset()
            ids = _prompt(n, 3 * salt)
            eng.prefill(ids)
            seq, got = list(ids), []
            for _ in range(4):
                got.append(np.array(eng.logits(), dtype=np.float64))
                seq.append(int(np.argmax(got[-1])))
                eng.decode(seq[-1])
            with torch.no_grad():
                want = ref(torch.tensor([seq[:-1]])).logits[0].numpy()[len(ids) - 1 :]
            for g, w in zip(got, want, strict=True):
                worst = max(worst, float(np.abs(g - w).max()) / float(np.abs(w).max()))
    print(f"{name} int8: worst max|d|/max|ref| = {worst:.2e}")
    # the same numbers on both sides: only f32 against float64 (and a rare value on the other side of a
    # rounding step, which the bound allows as for float16)
    assert worst <= TOL, f"{name} int8: max|engine - transformers| / max|ref| = {worst:.2e}"
