"""Speed of a decode miss run on the host (``--miss host`` on the GPU backend): one expert of the 30B
preset's shape (D=2048, F=768), gate + up + down through the CUDA kernel's bit-exact host mirror, at each
SIMD level this CPU has and on 1 and 2 threads (``make bench``; not part of ``make test``).

Two figures per setting, each with the GB/s of expert weights read:
- ``hot``: the same expert again and again (strata_cuda_mirror_expert's median of 10 runs, one pool);
  the weights come from the CPU's caches when they fit.
- ``cold``: a different expert on every call, 96 MB or more in all, as misses from host RAM are;
  timed from Python, so each call also starts and joins its pool's threads.
"""

from __future__ import annotations

import ctypes
import time

import numpy as np
import pytest

from strata import _cdefs as C
from strata import _engine
from tests.gpu._cuda_util import random_rows
from tests.gpu.test_cuda_kernels import TYPES

pytestmark = pytest.mark.bench

D, F = 2048, 768
SHAPES = {"Q8_0": ("Q8_0",) * 3, "Q4_K": ("Q4_K",) * 3, "Q4_K_M": ("Q4_K", "Q4_K", "Q6_K")}


def _levels() -> list[str]:
    """The SIMD levels this CPU runs."""
    return _engine.simd_levels()


@pytest.fixture(scope="module", params=list(SHAPES))
def experts(request):  # type: ignore[no-untyped-def]
    types = SHAPES[request.param]
    rng = np.random.default_rng(0)

    def expert() -> tuple[np.ndarray, ...]:
        shapes = ((F, D), (F, D), (D, F))
        return tuple(
            np.ascontiguousarray(random_rows(t, r, c, rng)[0])
            for t, (r, c) in zip(types, shapes, strict=True)
        )

    mats = [expert()]
    one = sum(a.nbytes for a in mats[0])
    mats += [expert() for _ in range(max(3, -(-96_000_000 // one) - 1))]  # enough experts to leave the caches
    yield request.param, types, mats, one
    _engine.simd_set("auto")


def _call(types, m, x, out, threads: int, reps: int) -> float:  # type: ignore[no-untyped-def]
    fp = ctypes.POINTER(ctypes.c_float)
    us = ctypes.c_double(0.0)
    st = C.strata_cuda_mirror_expert(
        TYPES[types[0]], m[0].ctypes.data_as(ctypes.c_void_p), TYPES[types[1]], m[1].ctypes.data_as(ctypes.c_void_p),
        TYPES[types[2]], m[2].ctypes.data_as(ctypes.c_void_p), D, F, 1, x.ctypes.data_as(fp), out.ctypes.data_as(fp),
        threads, reps, ctypes.byref(us),
    )  # fmt: skip
    assert st == 0
    return us.value


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("level", _levels())
def test_host_expert(benchmark, experts, level: str, threads: int) -> None:  # type: ignore[no-untyped-def]
    name, types, mats, one = experts
    _engine.simd_set(level)
    x = np.random.default_rng(1).standard_normal(D).astype(np.float32)
    out = np.zeros(D, dtype=np.float32)
    hot_us = _call(types, mats[0], x, out, threads, 10)
    assert np.isfinite(out).all()
    i = iter(range(1 << 30))

    def cold() -> None:
        _call(types, mats[next(i) % len(mats)], x, out, threads, 1)

    rounds = 3 * len(mats) if level != "scalar" else len(mats)
    benchmark.pedantic(cold, rounds=rounds, warmup_rounds=1)
    cold_s = benchmark.stats.stats.median
    benchmark.extra_info.update(
        shape=name, level=level, threads=threads, expert_bytes=one, hot_ms=round(hot_us / 1e3, 3),
        hot_gbps=round(one / hot_us / 1e3, 2), cold_ms=round(cold_s * 1e3, 3), cold_gbps=round(one / cold_s / 1e9, 2),
        t0=time.strftime("%H:%M:%S", time.gmtime()),
    )  # fmt: skip
