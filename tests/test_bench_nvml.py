"""GPU sampling through NVML: the real path without a GPU gives nothing and costs nothing; the
sampler's windows (per test, per llama-bench row) through an injected reader; rows and tables
carry the device memory and utilization; on a GPU, the real NVML is read."""

from __future__ import annotations

import itertools
import json
import os
import threading
import time

import pytest

from strata_bench import _nvml
from strata_bench._nvml import GpuSample, GpuSampler, gpu_info
from strata_bench.cli import main

HAVE_GPU = gpu_info() is not None


@pytest.mark.skipif(HAVE_GPU, reason="a GPU is present")
def test_without_a_gpu_nvml_gives_nothing() -> None:
    import pynvml  # noqa: F401  (the real library, a dependency, failing to find a driver)

    from strata import _nvml as shared

    assert shared.nvml() is None and shared.device_count() == 0 and shared.all_gpus() == []
    assert shared.gpu_info() is None and shared.driver_versions() is None and shared.usage() is None
    assert shared.process_memory(0, [os.getpid()]) is None
    assert _nvml.nvml_reader() is None
    with GpuSampler(interval=0.01) as s:
        time.sleep(0.05)
        assert s.take() is None
    assert s.summary() is None and s._thread is None and s.baseline is None


class Script:
    """A reader that returns a known sequence and remembers what it returned, in order."""

    def __init__(self, fail_after: int | None = None) -> None:
        self.given: list[GpuSample] = []
        self.lock = threading.Lock()
        self.n = itertools.count()
        self.fail_after = fail_after

    def __call__(self) -> GpuSample:
        i = next(self.n)
        if self.fail_after is not None and i >= self.fail_after:
            raise RuntimeError("driver gone")
        s = GpuSample(memory_used=(1 << 30) + 4096 * ((i * 7) % 11), utilization=(i * 13) % 101,
                      process_memory=None if i % 3 == 0 else 1000 * i)  # fmt: skip
        with self.lock:
            self.given.append(s)
        return s


def _expect(window: list[GpuSample], baseline: int) -> dict:
    procs = [s.process_memory for s in window if s.process_memory is not None]
    return {
        "memory_used_max": max(s.memory_used for s in window),
        "memory_used_mean": sum(s.memory_used for s in window) / len(window),
        "memory_baseline": baseline,
        "process_memory_max": max(procs) if procs else None,
        "utilization_mean": sum(s.utilization for s in window) / len(window),
        "utilization_max": max(s.utilization for s in window),
        "samples": len(window),
    }


def test_sampler_windows_cover_every_sample_once() -> None:
    script = Script()
    windows = []
    with GpuSampler(interval=0.005, reader=script) as s:
        for _ in range(4):
            time.sleep(0.03)
            windows.append(s.take())
    total = s.summary()
    given = script.given
    baseline = given[0].memory_used
    # each window is the samples read since the previous take, in order, none twice; what was read after
    # the last take (at least the sample at the end) is in the whole-run summary only
    sizes = [w["samples"] for w in windows]
    assert all(n >= 1 for n in sizes) and sum(sizes) < len(given)
    start = 0
    for w, n in zip(windows, sizes, strict=True):
        assert w == _expect(given[start : start + n], baseline)
        start += n
    assert total == _expect(given, baseline)


def test_a_reader_that_fails_keeps_what_was_sampled() -> None:
    script = Script(fail_after=3)
    with GpuSampler(interval=0.005, reader=script) as s:
        deadline = time.monotonic() + 30
        while len(script.given) < 3 and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(0.05)  # the fourth read fails; nothing after it is read
        assert s.take() == _expect(script.given, script.given[0].memory_used)
    assert len(script.given) == 3
    assert s.summary() == _expect(script.given, script.given[0].memory_used)


def test_rows_carry_gpu_memory_and_utilization(tiny, tmp_path, monkeypatch, capsys) -> None:
    script = Script()
    if not HAVE_GPU:
        # no device here: the engine's rows are sampled through the scripted reader instead of NVML
        monkeypatch.setattr(_nvml, "nvml_reader", lambda index=0, pids=(): script)
    out = tmp_path / "r.jsonl"
    assert main(f"run --model {tiny} -p 16 -n 4 -r 5 --threads 1 --output {out} --format md".split()) == 0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["test"] for r in rows] == ["pp16", "tg4"]
    for r in rows:
        nv = r["nvml"]
        assert nv["samples"] >= 1 and nv["memory_used_max"] >= nv["memory_baseline"] >= 0
        assert 0 <= nv["utilization_mean"] <= nv["utilization_max"] <= 100
    if not HAVE_GPU:
        # the sampler opened before the engine: its first sample is the baseline of both rows
        assert rows[0]["nvml"]["memory_baseline"] == rows[1]["nvml"]["memory_baseline"]
        assert rows[0]["nvml"]["memory_baseline"] == script.given[0].memory_used
    md = capsys.readouterr().out
    assert "VRAM peak" in md and "GPU util" in md


@pytest.mark.gpu
@pytest.mark.skipif(not HAVE_GPU, reason="no NVIDIA GPU")
def test_real_nvml_on_a_gpu() -> None:
    from strata import _nvml as shared

    info = gpu_info()
    assert info is not None and info["name"] and info["memory_total"] > 0 and info["driver"]
    assert info == {
        **shared.gpu_info(0),
        "memory_used": info["memory_used"],
        "utilization": info["utilization"],
    }
    gpus = shared.all_gpus()
    assert len(gpus) == shared.device_count() >= 1 and [g["index"] for g in gpus] == list(range(len(gpus)))
    drv = shared.driver_versions()
    assert drv is not None and drv["driver"] == info["driver"] and drv["cuda"] and "." in drv["cuda"]
    used, util = shared.usage(0)
    assert 0 < used <= info["memory_total"] and (util is None or 0 <= util <= 100)
    assert shared.process_memory(0, [2**22 + 12345]) is None  # no such process holds the device
    with GpuSampler(interval=0.02) as s:
        time.sleep(0.2)
        w = s.take()
    assert w is not None and w["samples"] >= 2
    assert 0 <= w["memory_baseline"] <= w["memory_used_max"] <= info["memory_total"]
    assert 0 <= w["utilization_mean"] <= w["utilization_max"] <= 100
