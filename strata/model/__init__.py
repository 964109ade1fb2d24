"""Synthetic GGUF models: ``make_model`` writes one, ``ensure_model`` keeps one in the cache.

The default model (``make run``, ``strata chat`` without ``--model``) is ``ensure_model("tiny")``:
the ``tiny`` preset at its default quant, Q8_0, seed 0.
"""

from __future__ import annotations

from ._presets import PRESETS, Preset, get_preset
from ._weights import tensor_specs
from ._writer import (
    MAKER_VERSION,
    QUANTS,
    RoutingCollapsedError,
    ensure_model,
    make_model,
    model_cache_path,
    write_weights,
)

__all__ = [
    "MAKER_VERSION",
    "PRESETS",
    "QUANTS",
    "Preset",
    "RoutingCollapsedError",
    "default_model",
    "ensure_model",
    "get_preset",
    "make_model",
    "model_cache_path",
    "tensor_specs",
    "write_weights",
]


def default_model():  # type: ignore[no-untyped-def]
    """The model used when none is given: ``ensure_model("tiny")`` (Q8_0, seed 0)."""
    return ensure_model("tiny")
