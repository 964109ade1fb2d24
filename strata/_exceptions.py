"""Exceptions raised by strata.

Every engine status code maps to one class::

    StrataError                      any failure reported by libstrata or the binding
    ├── LibraryNotFoundError         libstrata.so could not be loaded (names every path tried)
    ├── InvalidArgumentError         STRATA_ERR_INVALID_ARGUMENT
    ├── ModelFileError               STRATA_ERR_IO, STRATA_ERR_FORMAT
    │   └── UnsupportedModelError    STRATA_ERR_UNSUPPORTED
    ├── OutOfMemoryError             STRATA_ERR_OUT_OF_MEMORY
    ├── BudgetError                  STRATA_ERR_BUDGET
    ├── ContextError                 STRATA_ERR_CONTEXT
    ├── LendError                    STRATA_ERR_LEND
    ├── CancelledError               STRATA_ERR_CANCELLED
    ├── DeviceError                  STRATA_ERR_DEVICE
    ├── EngineStateError             STRATA_ERR_STATE
    └── InternalError                STRATA_ERR_INTERNAL
"""

from __future__ import annotations

from ._enums import Status

__all__ = [
    "BudgetError",
    "CancelledError",
    "ContextError",
    "DeviceError",
    "EngineStateError",
    "InternalError",
    "InvalidArgumentError",
    "LendError",
    "LibraryNotFoundError",
    "ModelFileError",
    "OutOfMemoryError",
    "StrataError",
    "UnsupportedModelError",
    "error_for_status",
]


class StrataError(Exception):
    """A failure reported by the engine; ``status`` is the C status code (0 when none)."""

    status: int = 0

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        if status is not None:
            self.status = status


class LibraryNotFoundError(StrataError):
    pass


class InvalidArgumentError(StrataError):
    status = Status.ERR_INVALID_ARGUMENT.value


class ModelFileError(StrataError):
    status = Status.ERR_FORMAT.value


class UnsupportedModelError(ModelFileError):
    status = Status.ERR_UNSUPPORTED.value


class OutOfMemoryError(StrataError):
    status = Status.ERR_OUT_OF_MEMORY.value


class BudgetError(StrataError):
    status = Status.ERR_BUDGET.value


class ContextError(StrataError):
    status = Status.ERR_CONTEXT.value


class LendError(StrataError):
    status = Status.ERR_LEND.value


class CancelledError(StrataError):
    status = Status.ERR_CANCELLED.value


class DeviceError(StrataError):
    status = Status.ERR_DEVICE.value


class InternalError(StrataError):
    status = Status.ERR_INTERNAL.value


class EngineStateError(StrataError):
    status = Status.ERR_STATE.value


_BY_STATUS: dict[int, type[StrataError]] = {
    Status.ERR_INVALID_ARGUMENT: InvalidArgumentError,
    Status.ERR_IO: ModelFileError,
    Status.ERR_FORMAT: ModelFileError,
    Status.ERR_UNSUPPORTED: UnsupportedModelError,
    Status.ERR_OUT_OF_MEMORY: OutOfMemoryError,
    Status.ERR_BUDGET: BudgetError,
    Status.ERR_CONTEXT: ContextError,
    Status.ERR_LEND: LendError,
    Status.ERR_CANCELLED: CancelledError,
    Status.ERR_DEVICE: DeviceError,
    Status.ERR_INTERNAL: InternalError,
    Status.ERR_STATE: EngineStateError,
}


def error_for_status(status: int, message: str) -> StrataError:
    """The exception for a C status code, carrying the engine's message."""
    cls = _BY_STATUS.get(status, StrataError)
    return cls(message or f"strata status {status}", status)
