"""transformers' eager attention with the keys and values rounded to float16, as the engine keeps its KV cache.

Registered once, under ``F16_KV``, in transformers' ``AttentionInterface`` (with eager attention's causal mask),
so that a model configured with ``attn_implementation=F16_KV`` sees the cache format the engine uses; without it
the difference is about 1.6e-4 * max|logit|, all of it from that rounding.
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
