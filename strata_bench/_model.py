"""What a record says about the model: file, size, architecture and quantization, read from the GGUF header."""

from __future__ import annotations

import functools
import os
from pathlib import Path
from typing import Any

__all__ = ["bytes_moved", "model_fields", "weight_bytes"]


@functools.lru_cache(maxsize=16)
def _read(path: str, size: int, mtime: float) -> dict[str, Any]:
    import gguf

    fields: dict[str, Any] = {"arch": None, "quant": None, "model_name": None}
    try:
        r = gguf.GGUFReader(path, "r")
    except Exception as e:  # a file gguf-py cannot read: say so in the record rather than guessing
        fields["model_error"] = f"{type(e).__name__}: {e}"
        return fields

    def scalar(key: str) -> Any:
        f = r.get_field(key)
        if f is None:
            return None
        try:
            return f.contents()
        except Exception:
            return None

    fields["arch"] = scalar(gguf.Keys.General.ARCHITECTURE)
    fields["model_name"] = scalar(gguf.Keys.General.NAME)
    ft = scalar(gguf.Keys.General.FILE_TYPE)
    if ft is not None:
        try:
            fields["quant"] = gguf.LlamaFileType(int(ft)).name.removeprefix("MOSTLY_")
        except ValueError:
            fields["quant"] = f"file_type {ft}"
    if fields["quant"] is None:
        for t in r.tensors:
            if "ffn_gate_exps" in t.name:
                fields["quant"] = t.tensor_type.name
                break
    return fields


def model_fields(path: str | os.PathLike[str]) -> dict[str, Any]:
    """``{"model", "model_path", "model_bytes", "arch", "quant", "model_name"}`` of a GGUF file."""
    p = Path(path).resolve()
    if not p.is_file():
        raise FileNotFoundError(
            f"{path}: no such model file (make one with `strata model make`, or give a GGUF path)"
        )
    st = p.stat()
    out: dict[str, Any] = {"model": p.name, "model_path": str(p), "model_bytes": st.st_size}
    out.update(_read(str(p), st.st_size, st.st_mtime))
    return out


@functools.lru_cache(maxsize=16)
def _weights(path: str, size: int, mtime: float) -> dict[str, Any] | None:
    import gguf

    try:
        r = gguf.GGUFReader(path, "r")
    except Exception:
        return None

    def meta(key: str) -> Any:
        f = r.get_field(key)
        return None if f is None else f.contents()

    arch = meta(gguf.Keys.General.ARCHITECTURE)
    n_layer = meta(f"{arch}.block_count")
    n_expert = meta(f"{arch}.expert_count")
    k_used = meta(f"{arch}.expert_used_count")
    n_head = meta(f"{arch}.attention.head_count")
    n_head_kv = meta(f"{arch}.attention.head_count_kv") or n_head
    n_embd = meta(f"{arch}.embedding_length")
    n_ff_exp = meta(f"{arch}.expert_feed_forward_length")
    head_dim = meta(f"{arch}.attention.key_length") or (n_embd // n_head if n_embd and n_head else None)
    if n_layer is None or n_expert is None or k_used is None or n_head_kv is None or head_dim is None:
        return None
    names = {t.name for t in r.tensors}
    tied = "output.weight" not in names
    dense = 0
    expert = [0] * int(n_layer)
    for t in r.tensors:
        nbytes = int(t.n_bytes)
        if "_exps." in t.name:
            layer = int(t.name.split(".")[1])
            expert[layer] += nbytes // int(n_expert)
        elif t.name == "token_embd.weight" and not tied:
            continue  # a decode step reads one row of it, not the table
        else:
            dense += nbytes
    return {
        "dense_bytes": dense,
        "expert_bytes": expert,  # one expert (gate + up + down) per layer
        "n_expert": int(n_expert),
        "n_expert_used": int(k_used),
        "kv_values_per_token": 2 * int(n_layer) * int(n_head_kv) * int(head_dim),  # K and V
        "n_embd": int(n_embd) if n_embd else None,
        "n_ff_exp": int(n_ff_exp) if n_ff_exp else None,
    }


def weight_bytes(path: str | os.PathLike[str]) -> dict[str, Any] | None:
    """Byte counts for the roofline figure: the weights every token reads, one expert per layer, KV per token."""
    p = Path(path).resolve()
    st = p.stat()
    return _weights(str(p), st.st_size, st.st_mtime)


def bytes_moved(
    w: dict[str, Any], n_prompt: int, n_gen: int, n_depth: int, chunk: int, kv: str = "f16"
) -> int:
    """Weight and KV bytes a test had to read: each decode step reads the dense weights, K experts per
    layer and the KV so far; each prompt chunk of T tokens reads the dense weights once and each of
    min(E, T*K) experts per layer once, plus the KV so far."""
    kv_bytes = w["kv_values_per_token"] * (2.0 if kv == "f16" else 1.125)  # int8: 1 byte + f32 scale per 32
    total = 0.0
    if n_prompt > 0:
        chunk = max(1, min(chunk or n_prompt, n_prompt))
        done = 0
        while done < n_prompt:
            t = min(chunk, n_prompt - done)
            done += t
            touched = min(w["n_expert"], t * w["n_expert_used"])
            total += w["dense_bytes"] + touched * sum(w["expert_bytes"]) + kv_bytes * (n_depth + done)
    for i in range(n_gen):
        total += w["dense_bytes"] + w["n_expert_used"] * sum(w["expert_bytes"]) + kv_bytes * (n_depth + i + 1)
    return int(total)
