"""Random weights that do not collapse, with shaped routing.

Shapes are NumPy's (row-major, the reverse of GGUF's ``ne``): a matrix that maps D inputs to N outputs
is ``[N, D]``; expert tensors are ``[E, F, D]`` (gate, up) and ``[E, D, F]`` (down).

Why the distributions are what they are:

- Embeddings have std 1, so a token's hidden state is dominated by its own embedding; attention
  output and expert down projections have a small std (shrinking with depth), so the residual stream
  does not drift onto one shared direction after a few layers (which would send every token to the
  same experts). Normal draws are symmetric, so quantized blocks get scales of both signs' values.
- Routing is shaped through coordinate 0 of the residual stream: every embedding holds the constant
  ``ANCHOR`` there and no layer writes to it (row 0 of ``attn_output`` and ``ffn_down_exps`` is zero),
  so after ``ffn_norm`` every token carries about the same value in it. Column 0 of each router row
  holds that expert's log-popularity, so the router logits are ``log p(e) + noise(token)``, with
  ``p`` Zipf-like over a per-layer permutation of the experts and the noise std ``route_noise``.
"""

from __future__ import annotations

import math
import zlib

import numpy as np

from ._presets import DEEPSEEK2_MLA, GLM4MOE_DENSE_LEAD, Preset

__all__ = ["ANCHOR", "WeightGen", "log_popularity", "stream_rng", "tensor_specs"]

ANCHOR = 1.0  # the constant in coordinate 0 of every embedding


def tensor_specs(p: Preset) -> list[tuple[str, tuple[int, ...]]]:
    """(name, NumPy shape) of every tensor, in file order."""
    D, E, F = p.d_model, p.n_expert, p.d_ff_expert
    q, kv = p.n_head * p.head_dim, p.n_head_kv * p.head_dim
    # the family's q/k norms: per head (qwen3moe), over the whole projection (olmoe), or none
    qk_norm = {"qwen3moe": (p.head_dim, p.head_dim), "olmoe": (q, kv)}.get(p.family)
    specs: list[tuple[str, tuple[int, ...]]] = [("token_embd.weight", (p.n_vocab, D))]
    glm = p.family == "glm4moe"
    ds = p.family == "deepseek2"  # glm4moe's MoE blocks (dense first layer, sigmoid, shared expert), MLA
    for i in range(p.n_layer):
        b = f"blk.{i}."
        specs.append((b + "attn_norm.weight", (D,)))
        if ds:  # multi-head latent attention, as the converter writes it (kv_b split into k_b and v_b)
            Lq, Lk, R = (
                DEEPSEEK2_MLA["q_lora_rank"],
                DEEPSEEK2_MLA["kv_lora_rank"],
                DEEPSEEK2_MLA["qk_rope_head_dim"],
            )
            specs += [
                (b + "attn_q_a.weight", (Lq, D)),
                (b + "attn_q_a_norm.weight", (Lq,)),
                (b + "attn_q_b.weight", (p.n_head * (p.head_dim + R), Lq)),
                (b + "attn_kv_a_mqa.weight", (Lk + R, D)),
                (b + "attn_kv_a_norm.weight", (Lk,)),
                (b + "attn_k_b.weight", (p.n_head, Lk, p.head_dim)),
                (b + "attn_v_b.weight", (p.n_head, p.head_dim, Lk)),
            ]
        else:
            specs += [
                (b + "attn_q.weight", (q, D)),
                (b + "attn_k.weight", (kv, D)),
                (b + "attn_v.weight", (kv, D)),
            ]
        if p.family in ("qwen2moe", "glm4moe"):
            specs += [(b + "attn_q.bias", (q,)), (b + "attn_k.bias", (kv,)), (b + "attn_v.bias", (kv,))]
        if qk_norm is not None:
            specs += [(b + "attn_q_norm.weight", (qk_norm[0],)), (b + "attn_k_norm.weight", (qk_norm[1],))]
        specs += [
            (b + "attn_output.weight", (D, q)),
            (b + ("post_attention_norm" if glm else "ffn_norm") + ".weight", (D,)),
        ]
        if (glm or ds) and i < GLM4MOE_DENSE_LEAD:  # a dense leading layer
            specs += [
                (b + "ffn_gate.weight", (p.d_ff, D)),
                (b + "ffn_up.weight", (p.d_ff, D)),
                (b + "ffn_down.weight", (D, p.d_ff)),
            ]
            continue
        if glm or ds:
            specs.append((b + "exp_probs_b.bias", (E,)))
        specs += [
            (b + "ffn_gate_inp.weight", (E, D)),
            (b + "ffn_gate_exps.weight", (E, F, D)),
            (b + "ffn_up_exps.weight", (E, F, D)),
            (b + "ffn_down_exps.weight", (E, D, F)),
        ]
        if p.family == "qwen2moe":
            FS = p.d_ff_shared
            specs += [
                (b + "ffn_gate_inp_shexp.weight", (1, D)),
                (b + "ffn_gate_shexp.weight", (FS, D)),
                (b + "ffn_up_shexp.weight", (FS, D)),
                (b + "ffn_down_shexp.weight", (D, FS)),
            ]
        if glm or ds:  # one shared expert of the experts' width
            specs += [
                (b + "ffn_gate_shexp.weight", (F, D)),
                (b + "ffn_up_shexp.weight", (F, D)),
                (b + "ffn_down_shexp.weight", (D, F)),
            ]
    specs.append(("output_norm.weight", (D,)))
    if not p.tie_embeddings:
        specs.append(("output.weight", (p.n_vocab, D)))
    return specs


def stream_rng(seed: int, *key: object) -> np.random.Generator:
    """An independent random stream for (seed, key...): each tensor draws from its own."""
    words = [seed & 0xFFFFFFFF] + [zlib.crc32(str(k).encode()) for k in key]
    return np.random.default_rng(words)


def log_popularity(p: Preset, seed: int, layer: int) -> np.ndarray:
    """Per-expert log-popularity of one layer, mean zero: ``-alpha * log(rank)`` over a permutation."""
    rng = stream_rng(seed, "popularity", layer)
    ranks = rng.permutation(p.n_expert) + 1
    lp = -p.zipf_alpha * np.log(ranks.astype(np.float64))
    return (lp - lp.mean()).astype(np.float32)


class WeightGen:
    """Deterministic float32 weights for a preset and seed; each tensor from its own stream."""

    def __init__(self, preset: Preset, seed: int) -> None:
        self.p = preset
        self.seed = seed
        # Output projections shrink with depth so that the residual stream's rms stays near 1.
        self.out_gain = 0.5 * math.sqrt(4.0 / max(4, preset.n_layer))

    def kind(self, name: str) -> str:
        """The tensor's role: the part of the name after ``blk.N.`` without ``.weight``."""
        base = name.removesuffix(".weight")
        return base.split(".", 2)[2] if base.startswith("blk.") else base

    def std(self, kind: str) -> float:
        p = self.p
        D, F, q = p.d_model, p.d_ff_expert, p.n_head * p.head_dim
        return {
            "token_embd": p.embd_std,
            "attn_q": 1.0 / math.sqrt(D),
            "attn_k": 1.0 / math.sqrt(D),
            "attn_v": 1.0 / math.sqrt(D),
            "attn_q_a": 1.0 / math.sqrt(D),
            "attn_q_b": 1.0 / math.sqrt(DEEPSEEK2_MLA["q_lora_rank"]),
            "attn_kv_a_mqa": 1.0 / math.sqrt(D),
            "attn_k_b": 1.0 / math.sqrt(p.head_dim),
            "attn_v_b": 1.0 / math.sqrt(DEEPSEEK2_MLA["kv_lora_rank"]),
            "attn_output": self.out_gain / math.sqrt(q),
            "ffn_gate_exps": 1.0 / math.sqrt(D),
            "ffn_up_exps": 1.0 / math.sqrt(D),
            "ffn_down_exps": 2.0 * self.out_gain / math.sqrt(F),
            "ffn_gate_inp_shexp": 1.0 / math.sqrt(D),
            "ffn_gate_shexp": 1.0 / math.sqrt(D),
            "ffn_up_shexp": 1.0 / math.sqrt(D),
            "ffn_down_shexp": self.out_gain / math.sqrt(max(1, p.d_ff_shared or F)),
            "ffn_gate": 1.0 / math.sqrt(D),
            "ffn_up": 1.0 / math.sqrt(D),
            "ffn_down": self.out_gain / math.sqrt(p.d_ff),
            "output": 2.0 / math.sqrt(D),
        }[kind]

    def tensor(self, name: str, shape: tuple[int, ...]) -> np.ndarray:
        """The float32 values of one tensor."""
        rng = stream_rng(self.seed, name)
        kind = self.kind(name)
        if name.endswith(".bias"):  # attention biases: small, of both signs
            return self.normal(rng, shape, 0.1)
        if len(shape) == 1:  # norm weights: positive, around 1
            return rng.uniform(0.8, 1.2, size=shape).astype(np.float32)
        if kind == "ffn_gate_inp":
            layer = int(name.split(".")[1])
            return self.router(rng, layer, shape)
        a = self.normal(rng, shape, self.std(kind))
        self.fix_rows(kind, a)
        return a

    @staticmethod
    def normal(rng: np.random.Generator, shape: tuple[int, ...], std: float) -> np.ndarray:
        return (rng.standard_normal(size=shape, dtype=np.float32) * np.float32(std)).astype(np.float32)

    @staticmethod
    def fix_rows(kind: str, a: np.ndarray) -> None:
        """Keep coordinate 0 of the residual stream constant (see the module docstring)."""
        if kind == "token_embd":
            a[..., 0] = ANCHOR
        elif kind == "attn_output":
            a[0, :] = 0.0
        elif kind == "ffn_down_exps":
            a[:, 0, :] = 0.0
        elif kind in ("ffn_down_shexp", "ffn_down"):
            a[0, :] = 0.0

    def router(self, rng: np.random.Generator, layer: int, shape: tuple[int, ...]) -> np.ndarray:
        E, D = shape
        # The token-dependent part: rows of std route_noise/sqrt(D) against a normed input of norm ~sqrt(D).
        r = self.normal(rng, shape, self.p.route_noise / math.sqrt(D))
        # ffn_norm's coordinate 0 scales what the router reads there; divide it out.
        norm = "post_attention_norm" if self.p.family == "glm4moe" else "ffn_norm"
        ffn_norm = self.tensor(f"blk.{layer}.{norm}.weight", (D,))
        r[:, 0] = log_popularity(self.p, self.seed, layer) / (ANCHOR * ffn_norm[0])
        return r
