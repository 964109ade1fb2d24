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
    status = 1


class ModelFileError(StrataError):
    status = 3


class UnsupportedModelError(ModelFileError):
    status = 4


class OutOfMemoryError(StrataError):
    status = 5


class BudgetError(StrataError):
    status = 6


class ContextError(StrataError):
    status = 7


class LendError(StrataError):
    status = 8


class CancelledError(StrataError):
    status = 9


class DeviceError(StrataError):
    status = 10


class InternalError(StrataError):
    status = 11


class EngineStateError(StrataError):
    status = 12


_BY_STATUS: dict[int, type[StrataError]] = {
    1: InvalidArgumentError,
    2: ModelFileError,
    3: ModelFileError,
    4: UnsupportedModelError,
    5: OutOfMemoryError,
    6: BudgetError,
    7: ContextError,
    8: LendError,
    9: CancelledError,
    10: DeviceError,
    11: InternalError,
    12: EngineStateError,
}


def error_for_status(status: int, message: str) -> StrataError:
    """The exception for a C status code, carrying the engine's message."""
    cls = _BY_STATUS.get(status, StrataError)
    return cls(message or f"strata status {status}", status)
