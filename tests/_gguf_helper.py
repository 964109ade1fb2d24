"""Small qwen3moe GGUF files with random weights, written with gguf-py's GGUFWriter.

The files use the tensor names and metadata keys of real qwen3moe files. They are for the engine's
own tests (fuzzing, determinism, sampling); ``strata.model.ensure_model`` makes the project's
default models.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType, GGUFWriter
from gguf.quants import quantize

__all__ = ["TinyConfig", "write_qwen3moe"]


@dataclass(frozen=True)
class TinyConfig:
    n_embd: int = 64
    n_layer: int = 2
    n_head: int = 4
    n_head_kv: int = 2
    head_dim: int = 32
    n_expert: int = 8
    n_expert_used: int = 2
    n_ff_exp: int = 64
    n_vocab: int = 320
    n_ctx: int = 512
    rope_theta: float = 1e6
    rms_eps: float = 1e-6
    tied: bool = False
    wtype: str = "f32"  # f32 | f16 | bf16 | q8_0: type of the matrices (norms stay f32)
    bos_id: int = 1
    eos_id: int = 2


_TYPES = {
    "f32": GGMLQuantizationType.F32,
    "f16": GGMLQuantizationType.F16,
    "bf16": GGMLQuantizationType.BF16,
    "q8_0": GGMLQuantizationType.Q8_0,
}


def _add(w: GGUFWriter, name: str, arr: np.ndarray, wtype: str) -> None:
    arr = np.ascontiguousarray(arr, dtype=np.float32)
    t = _TYPES[wtype]
    if t == GGMLQuantizationType.F32:
        w.add_tensor(name, arr)
    elif t == GGMLQuantizationType.F16:
        w.add_tensor(name, arr.astype(np.float16))
    else:
        w.add_tensor(name, quantize(arr, t), raw_dtype=t)


def write_qwen3moe(path: str | Path, cfg: TinyConfig = TinyConfig(), seed: int = 0) -> Path:
    """Write a random qwen3moe model to path and return the path."""
    rng = np.random.default_rng(seed)
    path = Path(path)
    D, HD, H, HKV = cfg.n_embd, cfg.head_dim, cfg.n_head, cfg.n_head_kv
    E, F, V = cfg.n_expert, cfg.n_ff_exp, cfg.n_vocab
    w = GGUFWriter(str(path), "qwen3moe")
    w.add_name("strata-test")
    w.add_context_length(cfg.n_ctx)
    w.add_embedding_length(D)
    w.add_block_count(cfg.n_layer)
    w.add_head_count(H)
    w.add_head_count_kv(HKV)
    w.add_key_length(HD)
    w.add_value_length(HD)
    w.add_rope_freq_base(cfg.rope_theta)
    w.add_layer_norm_rms_eps(cfg.rms_eps)
    w.add_expert_count(E)
    w.add_expert_used_count(cfg.n_expert_used)
    w.add_expert_feed_forward_length(F)
    w.add_bos_token_id(cfg.bos_id)
    w.add_eos_token_id(cfg.eos_id)

    def mat(rows: int, cols: int, std: float) -> np.ndarray:
        return (rng.standard_normal((rows, cols)) * std).astype(np.float32)

    _add(w, "token_embd.weight", mat(V, D, 1.0), cfg.wtype)
    _add(w, "output_norm.weight", 1.0 + 0.1 * rng.standard_normal(D), "f32")
    if not cfg.tied:
        _add(w, "output.weight", mat(V, D, D**-0.5), cfg.wtype)
    for i in range(cfg.n_layer):
        p = f"blk.{i}."
        _add(w, p + "attn_norm.weight", 1.0 + 0.1 * rng.standard_normal(D), "f32")
        _add(w, p + "attn_q.weight", mat(H * HD, D, D**-0.5), cfg.wtype)
        _add(w, p + "attn_k.weight", mat(HKV * HD, D, D**-0.5), cfg.wtype)
        _add(w, p + "attn_v.weight", mat(HKV * HD, D, D**-0.5), cfg.wtype)
        _add(w, p + "attn_output.weight", mat(D, H * HD, 0.5 * (H * HD) ** -0.5), cfg.wtype)
        _add(w, p + "attn_q_norm.weight", 1.0 + 0.1 * rng.standard_normal(HD), "f32")
        _add(w, p + "attn_k_norm.weight", 1.0 + 0.1 * rng.standard_normal(HD), "f32")
        _add(w, p + "ffn_norm.weight", 1.0 + 0.1 * rng.standard_normal(D), "f32")
        _add(w, p + "ffn_gate_inp.weight", mat(E, D, 1.0), "f32")
        _add(w, p + "ffn_gate_exps.weight", rng.standard_normal((E, F, D)) * D**-0.5, cfg.wtype)
        _add(w, p + "ffn_up_exps.weight", rng.standard_normal((E, F, D)) * D**-0.5, cfg.wtype)
        _add(w, p + "ffn_down_exps.weight", rng.standard_normal((E, D, F)) * 0.5 * F**-0.5, cfg.wtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path
