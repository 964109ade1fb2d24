"""Greedy decoding is bit-identical across thread counts, across runs, and between a prompt read at
once (in chunks) and the same prompt fed one token at a time."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from _gguf_helper import TinyConfig, write_qwen3moe

from strata import EngineConfig
from strata._engine import Engine

pytestmark = pytest.mark.asan

PROMPT = [1, 17, 33, 200, 5, 9, 77, 150, 3, 64, 12, 250, 31, 8, 99, 100, 4, 45, 46, 47]


@pytest.fixture(scope="module", params=["f32", "q8_0"])
def model(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_qwen3moe(
        tmp_path_factory.mktemp("det") / f"m-{request.param}.gguf", TinyConfig(wtype=request.param)
    )


def run_greedy(path: Path, cfg: EngineConfig, one_by_one: bool = False) -> tuple[list[int], list[np.ndarray]]:
    with Engine(path, cfg) as eng:
        logits = []
        if one_by_one:
            for t in PROMPT:
                eng.decode(t)
        else:
            eng.prefill(PROMPT)
        logits.append(eng.logits())
        out: list[int] = []
        for _ in range(12):
            tok = int(np.argmax(logits[-1]))
            out.append(tok)
            eng.decode(tok)
            logits.append(eng.logits())
        return out, logits


def assert_same(a: tuple[list[int], list[np.ndarray]], b: tuple[list[int], list[np.ndarray]]) -> None:
    assert a[0] == b[0]
    for i, (x, y) in enumerate(zip(a[1], b[1], strict=True)):
        assert np.array_equal(x, y), f"logits differ at step {i}: max |d| = {np.abs(x - y).max()}"


@pytest.mark.parametrize("simd", ["scalar", "auto"])
def test_threads_runs_and_chunking_agree(model: Path, simd: str) -> None:
    base = run_greedy(model, EngineConfig(threads=1, simd=simd))
    assert_same(base, run_greedy(model, EngineConfig(threads=2, simd=simd)))
    assert_same(base, run_greedy(model, EngineConfig(threads=2, simd=simd)))
    assert_same(base, run_greedy(model, EngineConfig(threads=2, simd=simd, prefill="7")))
    assert_same(
        base, run_greedy(model, EngineConfig(threads=4, simd=simd, prefill="5"))
    )  # more threads than cores
    assert_same(base, run_greedy(model, EngineConfig(threads=2, simd=simd), one_by_one=True))


def test_generate_matches_manual_greedy(model: Path) -> None:
    manual = run_greedy(model, EngineConfig(threads=2))
    with Engine(model, EngineConfig(threads=2)) as eng:
        res = eng.generate(PROMPT, max_tokens=12, stop_at_eos=False)
    assert res.tokens == manual[0]
    assert res.finish_reason == "length"


def test_truncate_then_refeed_reproduces_logits(model: Path) -> None:
    with Engine(model, EngineConfig(threads=2, prefill="8")) as eng:
        eng.prefill(PROMPT)
        full = eng.logits()
        eng.kv_truncate(10)
        assert eng.n_past == 10
        eng.prefill(PROMPT[10:])
        assert np.array_equal(full, eng.logits())
        eng.kv_reset()
        assert eng.n_past == 0
        eng.prefill(PROMPT)
        assert np.array_equal(full, eng.logits())
