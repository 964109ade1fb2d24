"""Model presets: the dimensions and routing shape of each synthetic model strata can make.

A preset is a ``qwen3moe`` model unless its ``family`` names another architecture strata runs. ``tiny``
is what tests and ``make run`` use; ``small`` is sized for CPU benchmarks; ``qwen3-30b-a3b`` has the real
model's dimensions, for GPU benchmarks, and is written from pre-quantized random rows so that the whole
file takes about a minute. ``tiny-qwen2moe``, ``tiny-mixtral``, ``tiny-olmoe`` and ``tiny-granitemoe`` are
``tiny`` in each other family's layout (its tensors, metadata and blocks), with the same shaped routing;
``tiny-deepseek2`` is DeepSeek V3's layout (multi-head latent attention, sigmoid routing with the
correction bias, a shared expert, a dense first layer).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

__all__ = [
    "DEEPSEEK2_MLA",
    "FAMILIES",
    "GLM4MOE_DENSE_LEAD",
    "GLM4MOE_ROUTED_SCALE",
    "GRANITE_SCALES",
    "PRESETS",
    "Preset",
    "get_preset",
]

#: the GGUF architectures the maker writes, with the family each is
FAMILIES = {
    "qwen3moe": "Qwen3-MoE",
    "qwen2moe": "Qwen2-MoE",
    "llama": "Mixtral",
    "olmoe": "OLMoE",
    "granitemoe": "Granite-MoE",
    "glm4moe": "GLM-4.5 MoE",
    "deepseek2": "DeepSeek-V2/V3",
}

# glm4moe files the maker writes: the first layer dense, one shared expert of the experts' width, half the
# head rotated, routed weights scaled as GLM-4.5's are
GLM4MOE_DENSE_LEAD = 1
GLM4MOE_ROUTED_SCALE = 2.5


# deepseek2 files the maker writes (DeepSeek V3's blocks at tiny scale): besides glm4moe's dense first layer,
# shared expert, sigmoid routing and routed scale, multi-head latent attention with these ranks; each head's
# keys are head_dim unrotated dims plus the rotated ones (shared by the heads), its values head_dim wide
DEEPSEEK2_MLA = {"q_lora_rank": 64, "kv_lora_rank": 64, "qk_rope_head_dim": 32}


# granitemoe's multipliers in the files the maker writes (granite's own choices for their roles: a
# larger embedding, 1/head_dim attention, damped residual updates, logits divided down), by metadata key
GRANITE_SCALES = {
    "embedding_scale": 6.0,
    "attention.scale": 1.0 / 32,
    "residual_scale": 0.5,
    "logit_scale": 4.0,
}


@dataclass(frozen=True)
class Preset:
    """Dimensions and generation knobs of one synthetic model."""

    name: str
    n_vocab: int  # tokens in the vocabulary (BPE + special tokens + padding)
    n_ctx: int  # qwen3moe.context_length
    d_model: int  # embedding_length (D)
    n_layer: int  # block_count
    n_head: int  # attention.head_count
    n_head_kv: int  # attention.head_count_kv
    head_dim: int  # attention.key_length == value_length
    n_expert: int  # expert_count (E)
    n_expert_used: int  # expert_used_count (K)
    d_ff_expert: int  # expert_feed_forward_length (F)
    d_ff: int  # feed_forward_length (the dense width; qwen3moe files carry it, MoE layers ignore it)
    rope_theta: float = 1_000_000.0
    rms_eps: float = 1e-6
    default_quant: str = "q8_0"
    tie_embeddings: bool = False  # no output.weight: the head reuses token_embd
    # Routing shape. Expert popularity in each layer follows p(rank r) ~ 1 / r**zipf_alpha (ranks
    # permuted per layer); route_noise is the std of the token-dependent part of the router logits.
    zipf_alpha: float = 0.8
    route_noise: float = 1.25
    # std of the token embeddings; a small value reproduces the collapse trap (docs/design.md, "Models")
    embd_std: float = 1.0
    # Routing check: how many leading layers the maker checks (None: all) and the prompt length.
    check_layers: int | None = None
    check_tokens: int = 256
    # True: tensors are assembled from pools of pre-quantized random rows (fast, for huge presets).
    pooled: bool = False
    # The architecture written (a key of FAMILIES) and, for qwen2moe, the shared expert's width.
    family: str = "qwen3moe"
    d_ff_shared: int = 0

    def with_overrides(self, **kw: Any) -> Preset:
        """A copy with some fields changed; unknown names raise ValueError."""
        names = {f.name for f in dataclasses.fields(self)}
        bad = sorted(set(kw) - names)
        if bad:
            raise ValueError(f"unknown preset field(s) {', '.join(bad)}; known: {', '.join(sorted(names))}")
        return dataclasses.replace(self, **kw)

    def param_counts(self) -> dict[str, int]:
        """Parameters: total, resident (everything but routed experts), per expert (gate+up+down)."""
        D, L, E, F = self.d_model, self.n_layer, self.n_expert, self.d_ff_expert
        q = self.n_head * self.head_dim
        kv = self.n_head_kv * self.head_dim
        qk_norms = {"qwen3moe": 2 * self.head_dim, "olmoe": q + kv}.get(self.family, 0)
        biases = q + 2 * kv if self.family == "qwen2moe" else 0
        attn = (
            D * q + 2 * D * kv + q * D + qk_norms + biases + 2 * D
        )  # projections, q/k norms, biases, 2 norms
        router = E * D + (3 * D * self.d_ff_shared + D if self.family == "qwen2moe" else 0)  # + shared expert
        embd = self.n_vocab * D
        head = 0 if self.tie_embeddings else self.n_vocab * D
        per_expert = 3 * D * F
        resident = embd + head + D + L * (attn + router)
        return {
            "total": resident + L * E * per_expert,
            "resident": resident,
            "per_expert": per_expert,
        }

    def validate(self) -> Preset:
        """Raise ValueError when the dimensions cannot make a model."""
        problems = []
        if self.n_head % self.n_head_kv:
            problems.append(f"head_count {self.n_head} is not a multiple of head_count_kv {self.n_head_kv}")
        if self.head_dim % 2:
            problems.append(f"head_dim {self.head_dim} must be even for RoPE")
        if not 0 < self.n_expert_used <= self.n_expert:
            problems.append(f"expert_used_count {self.n_expert_used} must be in 1..{self.n_expert}")
        if self.d_model % 32 or self.d_ff_expert % 32:
            problems.append("embedding_length and expert_feed_forward_length must be multiples of 32")
        if self.n_vocab < 512:
            problems.append(f"vocabulary of {self.n_vocab} is too small (at least 512)")
        if self.family not in FAMILIES:
            problems.append(f"family {self.family!r} is not one the maker writes ({', '.join(FAMILIES)})")
        if self.family == "qwen2moe" and (self.d_ff_shared <= 0 or self.d_ff_shared % 32):
            problems.append("a qwen2moe preset needs d_ff_shared, a positive multiple of 32")
        if problems:
            raise ValueError(f"preset {self.name!r}: " + "; ".join(problems))
        return self


PRESETS: dict[str, Preset] = {
    p.name: p
    for p in (
        Preset(
            name="tiny",
            n_vocab=2048,
            n_ctx=8192,
            d_model=128,
            n_layer=4,
            n_head=4,
            n_head_kv=2,
            head_dim=32,
            n_expert=32,
            n_expert_used=4,
            d_ff_expert=64,
            d_ff=512,
        ),
        Preset(
            name="small",
            n_vocab=16384,
            n_ctx=16384,
            d_model=512,
            n_layer=8,
            n_head=8,
            n_head_kv=4,
            head_dim=64,
            n_expert=32,
            n_expert_used=4,
            d_ff_expert=256,
            d_ff=2048,
        ),
        Preset(
            name="qwen3-30b-a3b",
            n_vocab=151936,
            n_ctx=40960,
            d_model=2048,
            n_layer=48,
            n_head=32,
            n_head_kv=4,
            head_dim=128,
            n_expert=128,
            n_expert_used=8,
            d_ff_expert=768,
            d_ff=6144,
            check_layers=3,
            check_tokens=48,
            pooled=True,
        ),
    )
}


# tiny in each other family's layout
for _fam, _extra in (
    ("qwen2moe", {"d_ff_shared": 128}),
    ("mixtral", {}),
    ("olmoe", {}),
    ("granitemoe", {}),
    ("glm4moe", {}),
    ("deepseek2", {"n_head_kv": 1}),  # one KV head: the latent every head reads
):
    PRESETS[f"tiny-{_fam}"] = PRESETS["tiny"].with_overrides(
        name=f"tiny-{_fam}", family="llama" if _fam == "mixtral" else _fam, **_extra
    )


def get_preset(name: str) -> Preset:
    """The preset called ``name``; a ValueError lists the known ones otherwise."""
    try:
        return PRESETS[name]
    except KeyError:
        raise ValueError(f"unknown preset {name!r}; choose one of: {', '.join(PRESETS)}") from None
