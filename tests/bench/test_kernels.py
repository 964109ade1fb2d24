"""Micro-benchmarks of the engine's CPU kernels through the binding (``make bench``; not part of ``make test``).

Each benchmark reports, next to pytest-benchmark's timings, the GB/s of weight bytes the kernel
read (``extra_info``): a matvec is bound by memory, so that is the figure to hold against the
machine's bandwidth. Weights are real quantized blocks: gguf-py quantizes Q8_0 and Q4_0, and
strata's own quantizer (``strata.model.quants``) the K types when it is installed.
"""

from __future__ import annotations

import numpy as np
import pytest

import strata._engine as engine
from strata._enums import TensorType

pytestmark = pytest.mark.bench


# (name, ggml type id)
TYPES = [
    (t.name, t.value)
    for t in (TensorType.F16, TensorType.Q4_0, TensorType.Q8_0, TensorType.Q4_K, TensorType.Q6_K)
]
ROWS, COLS = 1024, 2048  # one expert projection of a small model
N_TOKENS = 64  # a prompt chunk for matmul


def _weights(type_name: str, rows: int, cols: int) -> bytes:
    import gguf
    from gguf import quants as gq

    a = np.random.default_rng(0).standard_normal((rows, cols)).astype(np.float32) * 0.05
    qt = gguf.GGMLQuantizationType[type_name]
    if type_name == "F16":
        return a.astype(np.float16).tobytes()
    try:
        return np.asarray(gq.quantize(a, qt)).tobytes()
    except NotImplementedError:
        from strata.model import quants

        return np.asarray(quants.quantize(a, qt)).tobytes()


@pytest.fixture(scope="module", params=TYPES, ids=[t[0] for t in TYPES])
def weights(request):  # type: ignore[no-untyped-def]
    from strata import StrataError

    name, type_id = request.param
    w = _weights(name, ROWS, COLS)
    try:
        engine.dequantize(type_id, w, COLS)
    except StrataError as e:
        pytest.skip(f"{name}: {e}")  # a type this build has no kernels for yet
    return name, type_id, w


def _gbps(nbytes: int, benchmark) -> float:  # type: ignore[no-untyped-def]
    return nbytes / benchmark.stats.stats.min / 1e9


def test_dequantize(benchmark, weights) -> None:  # type: ignore[no-untyped-def]
    name, type_id, w = weights
    out = benchmark(engine.dequantize, type_id, w, ROWS * COLS)
    assert out.shape == (ROWS * COLS,) and np.isfinite(out).all()
    benchmark.extra_info.update(type=name, bytes=len(w), gbps=round(_gbps(len(w), benchmark), 2))


@pytest.mark.parametrize("threads", [1, 2])
def test_matvec(benchmark, weights, threads: int) -> None:  # type: ignore[no-untyped-def]
    name, type_id, w = weights
    x = np.random.default_rng(1).standard_normal(COLS).astype(np.float32)
    y = benchmark(engine.matvec, type_id, w, ROWS, COLS, x, threads=threads)
    assert np.asarray(y).shape == (ROWS,) and np.isfinite(y).all()
    benchmark.extra_info.update(type=name, threads=threads, gbps=round(_gbps(len(w), benchmark), 2))


def test_matmul(benchmark, weights) -> None:  # type: ignore[no-untyped-def]
    name, type_id, w = weights
    x = np.random.default_rng(2).standard_normal((N_TOKENS, COLS)).astype(np.float32)
    y = benchmark(engine.matmul, type_id, w, ROWS, COLS, x, threads=2)
    assert np.asarray(y).reshape(N_TOKENS, ROWS).shape == (N_TOKENS, ROWS)
    flops = 2 * N_TOKENS * ROWS * COLS
    benchmark.extra_info.update(type=name, gflops=round(flops / benchmark.stats.stats.min / 1e9, 2))
