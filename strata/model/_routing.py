"""Routing of a made model over a real prompt: which experts each token picks, layer by layer.

The maker runs this on the file it has just written (read back with gguf-py and dequantized with
gguf-py) and refuses to publish a model whose routing has collapsed. The same selections give the
LRU hit-rate curve quoted in the README. The forward pass here is batched float32 over the whole
prompt and stops after the last layer it is asked about.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path

import numpy as np

__all__ = [
    "PROMPT_TEXT",
    "LayerSpread",
    "expected_spread",
    "lru_hit_rates",
    "route_file",
    "spread",
]

# A real prompt: plain prose of the kind a chat model is asked about.
PROMPT_TEXT = """\
The harbour town woke slowly. Fishing boats came back before dawn with crates of mackerel and
herring, and by seven the market hall was full of people arguing about prices, the weather and the
football. A baker on the corner sold bread rolls still warm from the oven; the queue outside reached
the post office. Children walked to school past the lighthouse, where a retired engineer repaired
clocks in a small workshop and explained to anyone who asked why a pendulum keeps time: its period
depends on its length and on gravity, not on how far it swings, as long as the swing stays small.
In the afternoon the wind turned, clouds gathered over the hills, and the ferry to the islands was
cancelled. The harbour master wrote the times of the tides on a blackboard, and the owner of the
café moved the tables inside. Someone asked how to make a good fish soup, and three people answered
at once: start with onions, fennel and garlic softened in olive oil; add tomatoes, a little saffron,
orange peel and the bones for stock; simmer for twenty minutes, strain it, then poach the fish in
the broth for only a few minutes so that it stays firm. Serve it with toasted bread and a sharp
garlic sauce. Later that evening a student wrote a short program to predict the tides from the last
month of measurements, fitting a sum of sine waves with periods close to twelve hours and
twenty-five minutes, and compared the predictions with the blackboard the next morning.
"""


def _rms_norm(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w


class _File:
    """Tensors of a GGUF file, dequantized on demand with gguf-py."""

    def __init__(self, path: Path) -> None:
        from gguf import GGUFReader

        self.r = GGUFReader(str(path))
        self.t = {t.name: t for t in self.r.tensors}
        self.arch = self.field("general.architecture")

    def field(self, key: str):  # type: ignore[no-untyped-def]
        f = self.r.fields.get(key)
        if f is None:
            raise KeyError(f"{key} missing from the GGUF metadata")
        return f.contents()

    def hp(self, key: str):  # type: ignore[no-untyped-def]
        return self.field(f"{self.arch}.{key}")

    def get(self, name: str, index: int | np.ndarray | None = None) -> np.ndarray:
        from gguf import dequantize

        t = self.t[name]
        data = t.data if index is None else t.data[index]
        return np.asarray(dequantize(np.asarray(data), t.tensor_type), dtype=np.float32)


def route_file(path: Path | str, tokens: list[int], n_layers: int | None = None) -> list[np.ndarray]:
    """Expert ids chosen by each token, per layer: a list of int arrays ``[T, K]`` (best first).

    The blocks are those of the file's family as the maker writes it (FAMILIES): q/k norms per head
    (qwen3moe) or over the projection (olmoe), q/k/v biases and a gated shared expert (qwen2moe), the
    llama layout's adjacent rotary pairs (llama, granitemoe), granite's multipliers, and glm4moe's dense
    leading layers (which route nothing: the list holds MoE layers only), half-head rotary, sigmoid routing
    with the correction bias, routed scaling and plain shared expert; deepseek2 has glm4moe's MoE blocks and
    multi-head latent attention (computed here decompressed, as the reference implementation does)."""
    f = _File(Path(path))
    fam = f.arch
    L = int(f.hp("block_count"))
    n_layers = L if n_layers is None else min(n_layers, L)
    H, Hkv = int(f.hp("attention.head_count")), int(f.hp("attention.head_count_kv"))
    try:
        hd = int(f.hp("attention.key_length"))
    except KeyError:  # converted files leave it to embedding_length / head_count
        hd = int(f.hp("embedding_length")) // H
    K = int(f.hp("expert_used_count"))
    eps = float(f.hp("attention.layer_norm_rms_epsilon"))
    theta = float(f.hp("rope.freq_base"))
    granite = fam == "granitemoe"
    scale = float(f.hp("attention.scale")) if granite else 1.0 / math.sqrt(hd)
    res_scale = float(f.hp("residual_scale")) if granite else 1.0
    norm_topk = fam not in ("qwen2moe", "olmoe")
    glm = fam == "glm4moe"
    ds = fam == "deepseek2"  # glm4moe's MoE blocks, multi-head latent attention
    sig = glm or ds  # sigmoid routing with the correction bias, routed scale, plain shared expert, dense lead
    n_dense = int(f.hp("leading_dense_block_count")) if sig else 0
    n_rot = int(f.hp("rope.dimension_count")) if sig else None
    routed_scale = float(f.hp("expert_weights_scale")) if sig else 1.0
    if ds:  # the heads' dims (the key_length / value_length keys are the cache's view)
        hd, hv = int(f.hp("attention.key_length_mla")), int(f.hp("attention.value_length_mla"))
        Lk = int(f.hp("attention.kv_lora_rank"))
        scale = 1.0 / math.sqrt(hd)
    T = len(tokens)
    tok = np.asarray(tokens, dtype=np.int64)
    x = f.get("token_embd.weight", tok)  # [T, D]
    if granite:
        x = x * np.float32(f.hp("embedding_scale"))
    # NeoX rotary embedding: dimension i pairs with i + hd/2; the llama layout pairs 2i with 2i + 1.
    nr = n_rot or hd  # glm4moe rotates the first half of each head
    inv = theta ** (-np.arange(0, nr // 2, dtype=np.float64) * 2.0 / nr)
    ang = np.arange(T, dtype=np.float64)[:, None] * inv[None, :]  # [T, hd/2]
    cos, sin = np.cos(ang).astype(np.float32)[:, None, :], np.sin(ang).astype(np.float32)[:, None, :]
    adjacent = fam in ("llama", "granitemoe", "deepseek2")
    causal = np.triu(np.full((T, T), -np.inf, dtype=np.float32), k=1)
    out: list[np.ndarray] = []
    for i in range(n_layers):
        b = f"blk.{i}."
        h = _rms_norm(x, f.get(b + "attn_norm.weight"), eps)

        def rope(a: np.ndarray) -> np.ndarray:
            if adjacent:
                a1, a2 = a[..., 0::2], a[..., 1::2]
                r = np.empty_like(a)
                r[..., 0::2], r[..., 1::2] = a1 * cos - a2 * sin, a1 * sin + a2 * cos
                return r
            a1, a2, rest = a[..., : nr // 2], a[..., nr // 2 : nr], a[..., nr:]
            return np.concatenate([a1 * cos - a2 * sin, a1 * sin + a2 * cos, rest], axis=-1)

        if ds:  # latent attention, decompressed: the heads' keys and values from the normed latent
            qa = _rms_norm(h @ f.get(b + "attn_q_a.weight").T, f.get(b + "attn_q_a_norm.weight"), eps)
            q = (qa @ f.get(b + "attn_q_b.weight").T).reshape(T, H, hd)
            kva = h @ f.get(b + "attn_kv_a_mqa.weight").T
            lat = _rms_norm(kva[:, :Lk], f.get(b + "attn_kv_a_norm.weight"), eps)  # [T, Lk]
            kpe = rope(kva[:, None, Lk:])  # [T, 1, R]
            kb = f.get(b + "attn_k_b.weight")  # [H, Lk, nope]
            k_nope = np.einsum("tc,hcn->thn", lat, kb)
            v = np.einsum("tc,hvc->thv", lat, f.get(b + "attn_v_b.weight"))  # [T, H, hv]
            k = np.concatenate([k_nope, np.repeat(kpe, H, axis=1)], axis=-1)
            q = np.concatenate([q[..., : hd - nr], rope(q[..., hd - nr :])], axis=-1)
            qh, kh, vh = q.transpose(1, 0, 2), k.transpose(1, 0, 2), v.transpose(1, 0, 2)
            s = qh @ kh.transpose(0, 2, 1) * np.float32(scale) + causal
            s = np.exp(s - s.max(axis=-1, keepdims=True))
            s /= s.sum(axis=-1, keepdims=True)
            a = (s @ vh).transpose(1, 0, 2).reshape(T, H * hv)
            x = x + a @ f.get(b + "attn_output.weight").T
        else:
            q, k, v = (h @ f.get(b + f"attn_{n}.weight").T for n in "qkv")
            if fam in ("qwen2moe", "glm4moe"):
                q, k, v = (
                    q + f.get(b + "attn_q.bias"),
                    k + f.get(b + "attn_k.bias"),
                    v + f.get(b + "attn_v.bias"),
                )
            if fam == "olmoe":
                q, k = (
                    _rms_norm(q, f.get(b + "attn_q_norm.weight"), eps),
                    _rms_norm(k, f.get(b + "attn_k_norm.weight"), eps),
                )
            q, k, v = q.reshape(T, H, hd), k.reshape(T, Hkv, hd), v.reshape(T, Hkv, hd)
            if fam == "qwen3moe":
                q = _rms_norm(q, f.get(b + "attn_q_norm.weight"), eps)
                k = _rms_norm(k, f.get(b + "attn_k_norm.weight"), eps)

            q, k = rope(q), rope(k)
            rep = H // Hkv
            k = np.repeat(k, rep, axis=1)
            v = np.repeat(v, rep, axis=1)
            qh, kh, vh = q.transpose(1, 0, 2), k.transpose(1, 0, 2), v.transpose(1, 0, 2)  # [H, T, hd]
            s = qh @ kh.transpose(0, 2, 1) * np.float32(scale) + causal  # [H, T, T]
            s = np.exp(s - s.max(axis=-1, keepdims=True))
            s /= s.sum(axis=-1, keepdims=True)
            a = (s @ vh).transpose(1, 0, 2).reshape(T, H * hd)
            x = x + (a @ f.get(b + "attn_output.weight").T) * np.float32(res_scale)
        h = _rms_norm(x, f.get(b + ("post_attention_norm" if glm else "ffn_norm") + ".weight"), eps)
        if i < n_dense:  # a dense leading layer: no routing to report
            g, u = h @ f.get(b + "ffn_gate.weight").T, h @ f.get(b + "ffn_up.weight").T
            x = x + (g / (1.0 + np.exp(-g)) * u) @ f.get(b + "ffn_down.weight").T
            continue
        logits = h @ f.get(b + "ffn_gate_inp.weight").T  # [T, E]
        if sig:  # sigmoid scores; experts picked by score + correction bias, weighted by the score
            p = 1.0 / (1.0 + np.exp(-logits))
            sel = np.argsort(-(p + f.get(b + "exp_probs_b.bias")), axis=-1, kind="stable")[:, :K]
        else:
            sel = np.argsort(-logits, axis=-1, kind="stable")[:, :K]
        out.append(sel)
        if i == n_layers - 1:
            break
        if not sig:
            p = np.exp(logits - logits.max(axis=-1, keepdims=True))
            p /= p.sum(axis=-1, keepdims=True)
        w = np.take_along_axis(p, sel, axis=-1)
        if norm_topk:
            w /= w.sum(axis=-1, keepdims=True)
        moe = np.zeros_like(x)
        for e in np.unique(sel):
            rows, slot = np.nonzero(sel == e)
            he = h[rows]
            g = he @ f.get(b + "ffn_gate_exps.weight", int(e)).T
            u = he @ f.get(b + "ffn_up_exps.weight", int(e)).T
            y = (g / (1.0 + np.exp(-g)) * u) @ f.get(b + "ffn_down_exps.weight", int(e)).T
            moe[rows] += w[rows, slot][:, None] * y
        if sig:
            moe *= np.float32(routed_scale)
            g, u = h @ f.get(b + "ffn_gate_shexp.weight").T, h @ f.get(b + "ffn_up_shexp.weight").T
            moe += (g / (1.0 + np.exp(-g)) * u) @ f.get(b + "ffn_down_shexp.weight").T
        if fam == "qwen2moe":  # the shared expert, scaled by its sigmoid gate
            g, u = h @ f.get(b + "ffn_gate_shexp.weight").T, h @ f.get(b + "ffn_up_shexp.weight").T
            y = (g / (1.0 + np.exp(-g)) * u) @ f.get(b + "ffn_down_shexp.weight").T
            gate = h @ f.get(b + "ffn_gate_inp_shexp.weight").reshape(-1)
            moe += y / (1.0 + np.exp(-gate))[:, None]
        x = x + moe * np.float32(res_scale)
    return out


@dataclass
class LayerSpread:
    """How one layer's selections spread over the experts."""

    top1_share: float  # share of all selections that went to the most chosen expert
    entropy: float  # entropy of the selection histogram over log(E): 1 = uniform
    coverage: float  # fraction of experts chosen at least once

    def __str__(self) -> str:
        return f"top-1 share {self.top1_share:.3f}, entropy {self.entropy:.3f}, coverage {self.coverage:.2f}"


def spread(sel: np.ndarray, n_expert: int) -> LayerSpread:
    counts = np.bincount(np.asarray(sel).ravel(), minlength=n_expert).astype(np.float64)
    p = counts / counts.sum()
    nz = p[p > 0]
    return LayerSpread(
        top1_share=float(p.max()),
        entropy=float(-(nz * np.log(nz)).sum() / math.log(n_expert)),
        coverage=float((counts > 0).mean()),
    )


def expected_spread(
    n_expert: int, n_used: int, zipf_alpha: float, route_noise: float, n_tokens: int, seed: int = 0
) -> LayerSpread:
    """What the preset asks for: the spread of top-k over ``log p + N(0, noise)`` logits.

    Averaged over several random draws of ``n_tokens`` tokens, so that it is comparable with the
    spread measured on a prompt of that length.
    """
    rng = np.random.default_rng(seed)
    lp = -zipf_alpha * np.log(np.arange(1, n_expert + 1, dtype=np.float64))
    stats = []
    for _ in range(16):
        z = lp[None, :] + rng.standard_normal((n_tokens, n_expert)) * route_noise
        stats.append(spread(np.argsort(-z, axis=-1)[:, :n_used], n_expert))
    return LayerSpread(
        top1_share=float(np.mean([s.top1_share for s in stats])),
        entropy=float(np.mean([s.entropy for s in stats])),
        coverage=float(np.mean([s.coverage for s in stats])),
    )


def lru_hit_rates(selections: list[np.ndarray], n_expert: int, fractions: list[float]) -> dict[float, float]:
    """Hit rate of a per-layer LRU expert cache holding ``fraction * E`` experts of each layer.

    Tokens are looked up in order (as decode would); the K experts of one token are looked up, then
    all K are made most recent. Misses fill the cache, evicting the least recently used.
    """
    rates = {}
    for frac in fractions:
        cap = max(1, round(frac * n_expert))
        hits = lookups = 0
        for sel in selections:
            lru: OrderedDict[int, None] = OrderedDict()
            for row in np.asarray(sel):
                for e in row.tolist():
                    lookups += 1
                    if e in lru:
                        hits += 1
                        lru.move_to_end(e)
                    else:
                        lru[e] = None
                        if len(lru) > cap:
                            lru.popitem(last=False)
        rates[frac] = hits / max(1, lookups)
    return rates
