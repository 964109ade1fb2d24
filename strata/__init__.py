"""strata: run Mixture-of-Experts models that are bigger than the GPU.

``strata.Engine`` is the owning wrapper around libstrata (loaded with ctypes on first use, so that
importing strata never loads the native library: the server keeps it in worker processes).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ._config import EngineConfig, add_engine_args, config_from_args, parse_size
from ._exceptions import (
    BudgetError,
    CancelledError,
    ContextError,
    DeviceError,
    EngineStateError,
    InternalError,
    InvalidArgumentError,
    LendError,
    LibraryNotFoundError,
    ModelFileError,
    OutOfMemoryError,
    StrataError,
    UnsupportedModelError,
)
from ._version import __version__

if TYPE_CHECKING:
    from ._batch import Batch, BatchRequest
    from ._engine import Engine


__all__ = [
    "Batch",
    "BatchRequest",
    "BudgetError",
    "CancelledError",
    "ContextError",
    "DeviceError",
    "Engine",
    "EngineConfig",
    "EngineStateError",
    "InternalError",
    "InvalidArgumentError",
    "LendError",
    "LibraryNotFoundError",
    "ModelFileError",
    "OutOfMemoryError",
    "StrataError",
    "UnsupportedModelError",
    "__version__",
    "add_engine_args",
    "config_from_args",
    "parse_size",
]


def __getattr__(name: str) -> Any:
    if name == "Engine":
        from ._engine import Engine

        return Engine
    if name in ("Batch", "BatchRequest"):
        from . import _batch

        return getattr(_batch, name)
    raise AttributeError(f"module 'strata' has no attribute {name!r}")
