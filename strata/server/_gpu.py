"""GPU name, memory and utilization through NVML (``pynvml``); None when there is no NVIDIA GPU."""

from __future__ import annotations

import threading
from typing import Any

__all__ = ["gpu_info"]

_lock = threading.Lock()
_state: dict[str, Any] = {"init": None}


def _init() -> bool:
    if _state["init"] is None:
        try:
            import pynvml

            pynvml.nvmlInit()
            _state["init"] = pynvml.nvmlDeviceGetCount() > 0
        except Exception:
            _state["init"] = False
    return bool(_state["init"])


def gpu_info(index: int = 0) -> dict[str, Any] | None:
    """``{"name", "memory_used", "memory_total", "utilization"}`` (bytes, percent) of GPU ``index``."""
    with _lock:
        if not _init():
            return None
        try:
            import pynvml

            h = pynvml.nvmlDeviceGetHandleByIndex(index)
            name = pynvml.nvmlDeviceGetName(h)
            mem = pynvml.nvmlDeviceGetMemoryInfo(h)
            try:
                util = int(pynvml.nvmlDeviceGetUtilizationRates(h).gpu)
            except Exception:
                util = None
            return {
                "name": name.decode() if isinstance(name, bytes) else str(name),
                "memory_used": int(mem.used),
                "memory_total": int(mem.total),
                "utilization": util,
            }
        except Exception:
            return None
