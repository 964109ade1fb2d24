"""GPU samples for benchmark rows: memory and utilization read on a background thread while a test runs.

NVML itself is read through ``strata._nvml`` (the one module that talks to it); without an NVIDIA
driver the reader is None and the sampler records nothing, so the harness runs the same on any machine.

What a sample holds: the device's memory in use (every process), its utilization (percent of time a
kernel ran, as NVML reports it over its own averaging period), and the memory the watched processes
hold (``pids``: strata's own process, or the llama-bench child). The per-process figure is what a
target itself uses; NVML cannot always see processes (a container with its own PID namespace), and
then only the device figures are there.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Any

from strata import _nvml as nvml

__all__ = ["GpuSample", "GpuSampler", "gpu_info", "nvml_reader", "summarize_samples"]


def gpu_info(index: int = 0) -> dict[str, Any] | None:
    """``{"name", "driver", "memory_total", ...}`` of GPU ``index`` (``strata._nvml.gpu_info``), or None."""
    return nvml.gpu_info(index)


@dataclass(frozen=True)
class GpuSample:
    memory_used: int  # bytes in use on the device, all processes
    utilization: int  # percent
    process_memory: int | None  # bytes the watched processes hold; None when NVML does not list them


def nvml_reader(index: int = 0, pids: Sequence[int] = ()) -> Callable[[], GpuSample] | None:
    """A function that reads one sample of GPU ``index`` through NVML, or None without a GPU."""
    if nvml.usage(index) is None:
        return None
    watched = pids  # read at every sample: a caller may add a child's pid once it has started it

    def read() -> GpuSample:
        u = nvml.usage(index)
        if u is None:
            raise RuntimeError(f"NVML stopped answering for GPU {index}")
        return GpuSample(u[0], u[1] or 0, nvml.process_memory(index, watched) if watched else None)

    return read


def summarize_samples(samples: Sequence[GpuSample], baseline: int | None = None) -> dict[str, Any] | None:
    """Peak and mean of a window of samples; None for an empty window.

    ``baseline`` is the device memory in use before the target started (other processes, and for a
    second target in one process what the first left behind); ``memory_used_max - baseline`` is then
    the target's own peak when NVML cannot list processes.
    """
    if not samples:
        return None
    mem = [s.memory_used for s in samples]
    util = [s.utilization for s in samples]
    proc = [s.process_memory for s in samples if s.process_memory is not None]
    return {
        "memory_used_max": max(mem),
        "memory_used_mean": sum(mem) / len(mem),
        "memory_baseline": baseline,
        "process_memory_max": max(proc) if proc else None,
        "utilization_mean": sum(util) / len(util),
        "utilization_max": max(util),
        "samples": len(samples),
    }


class GpuSampler:
    """Samples a GPU every ``interval`` seconds while it is open, in windows.

    ``with GpuSampler(pids=[os.getpid()]) as s: ...; s.take()`` -> the summary of the samples since the
    previous ``take`` (or since the start), or None when nothing could be sampled; ``summary()`` covers
    everything since the start. A sample is also read at the start, at each ``take`` and at the end,
    so a window shorter than ``interval`` still has one. ``reader`` replaces NVML (a function returning a
    ``GpuSample``); without a reader and without a GPU the sampler starts no thread and records nothing.
    """

    def __init__(
        self,
        index: int = 0,
        interval: float = 0.1,
        *,
        pids: Sequence[int] | None = None,
        reader: Callable[[], GpuSample] | None = None,
    ) -> None:
        self.index = index
        self.interval = interval
        self.pids = list(pids) if pids is not None else [os.getpid()]
        self._reader = reader
        self._lock = threading.Lock()
        self._all: list[GpuSample] = []
        self._window: list[GpuSample] = []
        self.baseline: int | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # kept for callers that read the raw series
    @property
    def memory(self) -> list[int]:
        with self._lock:
            return [s.memory_used for s in self._all]

    @property
    def utilization(self) -> list[int]:
        with self._lock:
            return [s.utilization for s in self._all]

    def _sample(self) -> bool:
        if self._reader is None:
            return False
        try:
            s = self._reader()
        except Exception:  # the driver went away mid-run: keep what was sampled, stop sampling
            self._reader = None
            return False
        with self._lock:
            self._all.append(s)
            self._window.append(s)
        return True

    def __enter__(self) -> GpuSampler:
        if self._reader is None:
            self._reader = nvml_reader(self.index, self.pids)
        if self._sample():
            self.baseline = self._all[0].memory_used
            self._thread = threading.Thread(target=self._run, name="strata-bench-nvml", daemon=True)
            self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            if not self._sample():
                return

    def __exit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2)
            self._sample()

    def take(self) -> dict[str, Any] | None:
        """The summary of the samples since the previous ``take``; starts a new window."""
        if self._thread is not None and not self._stop.is_set():
            self._sample()
        with self._lock:
            window, self._window = self._window, []
        return summarize_samples(window, self.baseline)

    def summary(self) -> dict[str, Any] | None:
        with self._lock:
            return summarize_samples(list(self._all), self.baseline)
