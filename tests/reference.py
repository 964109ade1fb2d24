"""An independent NumPy forward pass of ``qwen3moe``, written from the architecture.

Weights are read from the GGUF file with gguf-py and dequantized with gguf-py; the arithmetic is
float64 by default. The model, per token position ``p``::

    x = token_embd[token]
    for each layer:
        h = rmsnorm(x) * attn_norm
        q, k, v = h @ Wq, h @ Wk, h @ Wv                  (H query heads, Hkv key/value heads)
        q, k = rmsnorm(q per head) * q_norm, rmsnorm(k per head) * k_norm
        q, k = rope_neox(q, p), rope_neox(k, p)            (theta = rope.freq_base)
        a = softmax(q k^T / sqrt(head_dim), causal) v      (query head i reads kv head i // (H/Hkv))
        x = x + a @ Wo
        h = rmsnorm(x) * ffn_norm
        prob = softmax(h @ Wrouter); top-k experts; weights = prob[top-k] / sum(prob[top-k])
        x = x + sum_k weight_k * (silu(h @ Wgate_k) * (h @ Wup_k)) @ Wdown_k
    logits = (rmsnorm(x) * output_norm) @ Woutput          (or token_embd when output is absent)

``kv_dtype`` rounds the cached keys and values the way the engine stores them (float16 by default,
the engine's KV cache format); ``None`` keeps them at full precision. ``kv_steps`` moves chosen
cached values a number of representable steps away from that rounding: ``{(layer, "v", position,
index): 1}`` stores the next float16 above the nearest one (``index`` into the row of ``n_head_kv *
head_dim`` values); it measures what one rounding that goes the other way costs.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from gguf import GGUFReader, dequantize

__all__ = ["Reference"]


class Reference:
    """A qwen3moe model in NumPy with a KV cache: ``forward(tokens)`` appends and returns logits."""

    def __init__(
        self, path: str | Path, *, dtype: type = np.float64, kv_dtype: type | None = np.float16
    ) -> None:
        self.reader = GGUFReader(str(path))
        self.tensors = {t.name: t for t in self.reader.tensors}
        self.dtype = dtype
        self.kv_dtype = kv_dtype
        self._cache: dict[str, np.ndarray] = {}
        self.kv_steps: dict[tuple[int, str, int, int], int] = {}
        arch = self._field("general.architecture")
        if arch != "qwen3moe":
            raise ValueError(f"the reference implements qwen3moe, not {arch}")

        def hp(key: str):  # type: ignore[no-untyped-def]
            return self._field(f"{arch}.{key}")

        self.n_layer = int(hp("block_count"))
        self.d_model = int(hp("embedding_length"))
        self.n_head = int(hp("attention.head_count"))
        self.n_head_kv = int(hp("attention.head_count_kv"))
        self.head_dim = int(hp("attention.key_length"))
        self.n_expert = int(hp("expert_count"))
        self.n_used = int(hp("expert_used_count"))
        self.eps = float(hp("attention.layer_norm_rms_epsilon"))
        self.theta = float(hp("rope.freq_base"))
        self.n_vocab = len(self.reader.fields["tokenizer.ggml.tokens"].contents())
        self.routing: list[list[np.ndarray]] = []  # per forward call: per layer [T, K] expert ids
        # per forward call: the smallest gap, over layers, between the router logits of the last
        # chosen and the first unchosen expert of the call's last token (a near-tie when small)
        self.margins: list[float] = []
        self._margins: list[np.ndarray] = []
        self.reset()

    # ---- weights -------------------------------------------------------------------------------

    def _field(self, key: str):  # type: ignore[no-untyped-def]
        f = self.reader.fields.get(key)
        if f is None:
            raise KeyError(f"{key} is missing from the file")
        return f.contents()

    def w(self, name: str) -> np.ndarray:
        """A whole tensor, dequantized, in NumPy's shape (the reverse of GGUF's ne)."""
        if name not in self._cache:
            t = self.tensors[name]
            self._cache[name] = np.asarray(dequantize(np.asarray(t.data), t.tensor_type)).astype(self.dtype)
        return self._cache[name]

    def head(self) -> np.ndarray:
        return self.w("output.weight") if "output.weight" in self.tensors else self.w("token_embd.weight")

    # ---- state ---------------------------------------------------------------------------------

    def reset(self) -> None:
        L, Hkv, hd = self.n_layer, self.n_head_kv, self.head_dim
        self.k_cache = [np.zeros((0, Hkv, hd), self.dtype) for _ in range(L)]
        self.v_cache = [np.zeros((0, Hkv, hd), self.dtype) for _ in range(L)]
        self.n_past = 0

    # ---- math ----------------------------------------------------------------------------------

    def _rmsnorm(self, x: np.ndarray, weight: np.ndarray) -> np.ndarray:
        ms = np.mean(np.square(x), axis=-1, keepdims=True)
        return x / np.sqrt(ms + self.eps) * weight

    def _rope(self, x: np.ndarray, positions: np.ndarray) -> np.ndarray:
        """NeoX rotation: element i of the first half pairs with element i of the second half."""
        half = self.head_dim // 2
        freq = 1.0 / self.theta ** (np.arange(half, dtype=np.float64) / half)
        angle = positions[:, None].astype(np.float64) * freq[None, :]  # [T, half]
        c = np.cos(angle)[:, None, :].astype(self.dtype)
        s = np.sin(angle)[:, None, :].astype(self.dtype)
        lo, hi = x[..., :half], x[..., half:]
        return np.concatenate([lo * c - hi * s, hi * c + lo * s], axis=-1)

    def _store(self, layer: int, kind: str, x: np.ndarray, positions: np.ndarray) -> np.ndarray:
        """x [T, Hkv, hd] as the cache holds it: rounded to kv_dtype, then any kv_steps applied."""
        r = x.astype(self.kv_dtype)
        for (lay, kd, pos, idx), n in self.kv_steps.items():
            if lay == layer and kd == kind and positions[0] <= pos <= positions[-1]:
                row = r[pos - positions[0]].reshape(-1)  # a view: writes go into r
                toward = r.dtype.type(np.inf if n > 0 else -np.inf)
                for _ in range(abs(n)):
                    row[idx] = np.nextafter(row[idx], toward)
        return r.astype(self.dtype)

    def _attention(self, layer: int, h: np.ndarray, positions: np.ndarray) -> np.ndarray:
        T, H, Hkv, hd = h.shape[0], self.n_head, self.n_head_kv, self.head_dim
        b = f"blk.{layer}."
        q = (h @ self.w(b + "attn_q.weight").T).reshape(T, H, hd)
        k = (h @ self.w(b + "attn_k.weight").T).reshape(T, Hkv, hd)
        v = (h @ self.w(b + "attn_v.weight").T).reshape(T, Hkv, hd)
        q = self._rmsnorm(q, self.w(b + "attn_q_norm.weight"))
        k = self._rmsnorm(k, self.w(b + "attn_k_norm.weight"))
        q = self._rope(q, positions)
        k = self._rope(k, positions)
        if self.kv_dtype is not None:
            k = self._store(layer, "k", k, positions)
            v = self._store(layer, "v", v, positions)
        K = self.k_cache[layer] = np.concatenate([self.k_cache[layer], k])
        V = self.v_cache[layer] = np.concatenate([self.v_cache[layer], v])
        S = K.shape[0]
        group = H // Hkv
        out = np.empty((T, H, hd), self.dtype)
        key_pos = np.arange(S)
        for i in range(H):
            j = i // group
            scores = q[:, i, :] @ K[:, j, :].T / np.sqrt(hd)  # [T, S]
            scores = np.where(key_pos[None, :] <= positions[:, None], scores, -np.inf)
            scores = np.exp(scores - scores.max(axis=-1, keepdims=True))
            out[:, i, :] = (scores / scores.sum(axis=-1, keepdims=True)) @ V[:, j, :]
        return out.reshape(T, H * hd) @ self.w(b + "attn_output.weight").T

    def _moe(self, layer: int, h: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        b = f"blk.{layer}."
        logits = h @ self.w(b + "ffn_gate_inp.weight").T  # [T, E]
        p = np.exp(logits - logits.max(axis=-1, keepdims=True))
        p /= p.sum(axis=-1, keepdims=True)
        top = np.argsort(-p, axis=-1, kind="stable")[:, : self.n_used]  # [T, K], best first
        if self.n_used < self.n_expert:
            ranked = np.sort(logits, axis=-1)[:, ::-1]
            self._margins.append(ranked[:, self.n_used - 1] - ranked[:, self.n_used])
        gate, up, down = (
            self.w(b + n) for n in ("ffn_gate_exps.weight", "ffn_up_exps.weight", "ffn_down_exps.weight")
        )
        out = np.zeros_like(h)
        for t in range(h.shape[0]):
            weights = p[t, top[t]] / p[t, top[t]].sum()
            for e, wgt in zip(top[t], weights, strict=True):
                g = gate[e] @ h[t]
                u = up[e] @ h[t]
                out[t] += wgt * (down[e] @ (g / (1.0 + np.exp(-g)) * u))
        return out, top

    def forward(self, tokens: list[int] | np.ndarray) -> np.ndarray:
        """Run ``tokens`` at the next positions; returns their logits ``[T, n_vocab]``."""
        tok = np.asarray(tokens, dtype=np.int64)
        if tok.ndim != 1 or len(tok) == 0:
            raise ValueError("forward takes a non-empty 1-D list of token ids")
        positions = np.arange(self.n_past, self.n_past + len(tok))
        x = self.w("token_embd.weight")[tok]
        routes = []
        self._margins = []
        for i in range(self.n_layer):
            b = f"blk.{i}."
            x = x + self._attention(i, self._rmsnorm(x, self.w(b + "attn_norm.weight")), positions)
            moe, top = self._moe(i, self._rmsnorm(x, self.w(b + "ffn_norm.weight")))
            x = x + moe
            routes.append(top)
        self.routing.append(routes)
        self.margins.append(float(min(m[-1] for m in self._margins)) if self._margins else float("inf"))
        self.n_past += len(tok)
        return self._rmsnorm(x, self.w("output_norm.weight")) @ self.head().T
