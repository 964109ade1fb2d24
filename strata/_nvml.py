"""NVIDIA GPU facts through NVML (``pynvml``, from the nvidia-ml-py package): the one place that talks to it.

NVML is initialized once per process, on first use, and never shut down (another caller may still be
sampling). Without the library, without a driver or without a device every function returns None
(or 0 devices, or an empty list): a machine without an NVIDIA GPU is a normal machine, not an error.

What is read: a device's name, memory (total, in use by every process) and utilization (the percent
of time a kernel ran over NVML's own averaging period); the driver and the CUDA version it supports;
and the device memory held by given processes, which NVML can only report where it sees them (not
from inside a container with its own PID namespace: then None).
"""

from __future__ import annotations

import threading
from collections.abc import Collection
from typing import Any

__all__ = ["all_gpus", "device_count", "driver_versions", "gpu_info", "nvml", "process_memory", "usage"]

_lock = threading.Lock()
_ready: bool | None = None  # None: not tried yet


def nvml() -> Any | None:
    """The pynvml module, initialized; None when there is no NVML, no driver or no device."""
    global _ready
    with _lock:
        if _ready is None:
            try:
                import pynvml

                pynvml.nvmlInit()
                _ready = pynvml.nvmlDeviceGetCount() > 0
            except Exception:  # NVMLError_LibraryNotFound, DriverNotLoaded, ImportError: no GPU here
                _ready = False
        if not _ready:
            return None
    import pynvml

    return pynvml


def _text(x: Any) -> str:
    return x.decode() if isinstance(x, bytes) else str(x)


def device_count() -> int:
    nv = nvml()
    if nv is None:
        return 0
    try:
        return int(nv.nvmlDeviceGetCount())
    except Exception:
        return 0


def driver_versions() -> dict[str, str | None] | None:
    """``{"driver": "580.159.04", "cuda": "13.0"}`` (the CUDA version the driver supports), or None."""
    nv = nvml()
    if nv is None:
        return None
    out: dict[str, str | None] = {"driver": None, "cuda": None}
    try:
        out["driver"] = _text(nv.nvmlSystemGetDriverVersion())
    except Exception:
        pass
    try:
        v = int(nv.nvmlSystemGetCudaDriverVersion())
        out["cuda"] = f"{v // 1000}.{(v % 1000) // 10}"
    except Exception:
        pass
    return out


def usage(index: int = 0) -> tuple[int, int | None] | None:
    """(bytes in use on device ``index`` by every process, utilization percent or None), or None."""
    nv = nvml()
    if nv is None:
        return None
    try:
        h = nv.nvmlDeviceGetHandleByIndex(index)
        used = int(nv.nvmlDeviceGetMemoryInfo(h).used)
    except Exception:
        return None
    try:
        util: int | None = int(nv.nvmlDeviceGetUtilizationRates(h).gpu)
    except Exception:
        util = None
    return used, util


def process_memory(index: int, pids: Collection[int]) -> int | None:
    """Bytes of device ``index`` that the processes ``pids`` hold; None when NVML lists none of them."""
    nv = nvml()
    if nv is None or not pids:
        return None
    try:
        h = nv.nvmlDeviceGetHandleByIndex(index)
        procs = nv.nvmlDeviceGetComputeRunningProcesses(h)
    except Exception:
        return None
    held = [p.usedGpuMemory for p in procs if p.pid in pids and p.usedGpuMemory is not None]
    return int(sum(held)) if held else None


def gpu_info(index: int = 0) -> dict[str, Any] | None:
    """``{"index", "name", "driver", "memory_total", "memory_used", "utilization"}`` of GPU ``index``, or None."""
    nv = nvml()
    if nv is None:
        return None
    try:
        h = nv.nvmlDeviceGetHandleByIndex(index)
        name = _text(nv.nvmlDeviceGetName(h))
        mem = nv.nvmlDeviceGetMemoryInfo(h)
    except Exception:
        return None
    u = usage(index)
    drv = driver_versions() or {}
    return {
        "index": index,
        "name": name,
        "driver": drv.get("driver"),
        "memory_total": int(mem.total),
        "memory_used": int(mem.used),
        "utilization": u[1] if u else None,
    }


def all_gpus() -> list[dict[str, Any]]:
    """``gpu_info`` of every device NVML sees, in its order."""
    return [g for i in range(device_count()) if (g := gpu_info(i)) is not None]
