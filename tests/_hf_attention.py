"""transformers' eager attention with the keys and values rounded to float16, as the engine keeps its KV cache.

Registered once, under ``F16_KV``, in transformers' ``AttentionInterface`` (with eager attention's causal mask),
so that a model configured with ``attn_implementation=F16_KV`` sees the cache format the engine uses; without it
the difference is about 1.6e-4 * max|logit|, all of it from that rounding.

Multi-head latent attention (DeepSeek V2/V3) caches the normalized latent and the roped k_pe, not the
heads' keys and values: ``round_latent_kv(model)`` rounds those two to float16 where transformers expands
them into keys and values (its ``expand_kv``), so that the model, run with plain eager attention, sees what
the engine's compressed cache holds.
"""

from __future__ import annotations

import torch
import transformers

F16_KV = "strata_f16_kv"


def _f16_kv_attention(module, query, key, value, attention_mask, **kwargs):  # type: ignore[no-untyped-def]
    if hasattr(module, "sinks"):  # gpt-oss: its eager attention adds the sinks to the softmax
        from transformers.models.gpt_oss.modeling_gpt_oss import eager_attention_forward
    else:
        from transformers.models.qwen3_moe.modeling_qwen3_moe import eager_attention_forward

    def f16(t: torch.Tensor) -> torch.Tensor:
        return t.to(torch.float16).to(query.dtype)

    return eager_attention_forward(module, query, f16(key), f16(value), attention_mask, **kwargs)


transformers.AttentionInterface.register(F16_KV, _f16_kv_attention)
transformers.masking_utils.AttentionMaskInterface.register(
    F16_KV, transformers.masking_utils.ALL_MASK_ATTENTION_FUNCTIONS["eager"]
)


def int8_blocks(row: torch.Tensor) -> torch.Tensor:
    """``row`` as the engine's ``--kv int8`` stores it: blocks of 32 values, each a scale max|x| / 127 and
    values rounded to the nearest multiple of it."""
    x = row.reshape(-1, 32)
    s = x.abs().amax(-1, keepdim=True) / 127
    safe = torch.where(s > 0, s, torch.ones_like(s))
    q = torch.where(s > 0, torch.round(x / safe), torch.zeros_like(x)).clamp(-127, 127)
    return (q * s).reshape(row.shape)


def round_latent_kv(model: torch.nn.Module, kv: str = "f16") -> torch.nn.Module:
    """The model with every MLA layer's cached row (latent, k_pe) rounded as the engine's cache of type ``kv``
    (f16 or int8) stores it, before it is expanded into keys and values."""

    def f16(t: torch.Tensor) -> torch.Tensor:
        return t.to(torch.float16).to(t.dtype)

    for module in model.modules():
        expand = getattr(module, "expand_kv", None)
        if expand is None:
            continue

        def rounded(latent: torch.Tensor, k_pe: torch.Tensor, expand=expand):  # type: ignore[no-untyped-def]
            if kv == "f16":
                return expand(f16(latent), f16(k_pe))
            row = int8_blocks(torch.cat([latent, k_pe], dim=-1))
            return expand(row[..., : latent.shape[-1]], row[..., latent.shape[-1] :])

        module.expand_kv = rounded  # type: ignore[method-assign]
    return model
