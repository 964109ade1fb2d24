"""GPU facts and samples through NVML (``pynvml``): the name and driver for records, and memory and
utilization sampled on a background thread while a test runs. Without an NVIDIA driver every
function returns None and the sampler records nothing, so the harness runs the same on any machine.
"""

from __future__ import annotations

import threading
from types import TracebackType
from typing import Any

__all__ = ["GpuSampler", "gpu_info"]

_init_lock = threading.Lock()
_initialized: bool | None = None


def _nvml() -> Any | None:
    """The pynvml module, initialized once; None when there is no driver or no device."""
    global _initialized
    with _init_lock:
        if _initialized is False:
            return None
        try:
            import pynvml

            if not _initialized:
                pynvml.nvmlInit()
                _initialized = True
                if pynvml.nvmlDeviceGetCount() < 1:
                    _initialized = False
                    return None
            return pynvml
        except Exception:  # NVMLError_LibraryNotFound, DriverNotLoaded, ... all mean "no GPU here"
            _initialized = False
            return None


def _text(x: Any) -> str:
    return x.decode() if isinstance(x, bytes) else str(x)


def gpu_info(index: int = 0) -> dict[str, Any] | None:
    """``{"name", "driver", "memory_total"}`` of GPU ``index``, or None without one."""
    nv = _nvml()
    if nv is None:
        return None
    try:
        h = nv.nvmlDeviceGetHandleByIndex(index)
        return {
            "name": _text(nv.nvmlDeviceGetName(h)),
            "driver": _text(nv.nvmlSystemGetDriverVersion()),
            "memory_total": int(nv.nvmlDeviceGetMemoryInfo(h).total),
        }
    except Exception:
        return None


class GpuSampler:
    """Samples memory used and utilization of one GPU every ``interval`` seconds while it is open.

    ``with GpuSampler() as s: ...`` then ``s.summary()`` -> ``{"memory_used_max", "memory_used_mean",
    "utilization_mean", "utilization_max", "samples"}`` or None when nothing could be sampled.
    """

    def __init__(self, index: int = 0, interval: float = 0.1) -> None:
        self.index = index
        self.interval = interval
        self.memory: list[int] = []
        self.utilization: list[int] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> GpuSampler:
        nv = _nvml()
        if nv is not None:
            try:
                handle = nv.nvmlDeviceGetHandleByIndex(self.index)
            except Exception:
                return self
            self._thread = threading.Thread(
                target=self._run, args=(nv, handle), name="strata-bench-nvml", daemon=True
            )
            self._thread.start()
        return self

    def _run(self, nv: Any, handle: Any) -> None:
        while True:
            try:
                self.memory.append(int(nv.nvmlDeviceGetMemoryInfo(handle).used))
                self.utilization.append(int(nv.nvmlDeviceGetUtilizationRates(handle).gpu))
            except Exception:
                return
            if self._stop.wait(self.interval):
                return

    def __exit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2)

    def summary(self) -> dict[str, Any] | None:
        if not self.memory:
            return None
        return {
            "memory_used_max": max(self.memory),
            "memory_used_mean": sum(self.memory) / len(self.memory),
            "utilization_mean": sum(self.utilization) / len(self.utilization),
            "utilization_max": max(self.utilization),
            "samples": len(self.memory),
        }
