"""What the server adds on top of the engine (``make bench``; not part of ``make test``).

On the tiny preset, greedy, the same prompt: a one-token completion through ``strata serve`` (HTTP on
loopback, the FIFO, the worker's pipe) against ``Engine.generate`` in this process, and 256 generated
tokens through the server (whole reply, and streamed over SSE) against the engine. The difference of
the one-token medians is the request overhead; the 256-token rows give tokens/s both ways.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

pytestmark = pytest.mark.bench

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from _strata_server import Served  # noqa: E402

from strata import Engine, EngineConfig  # noqa: E402
from strata.model import ensure_model  # noqa: E402
from strata.tokenizer import Tokenizer  # noqa: E402

N = 256
TEXT = "The expert cache keeps the experts that are used most in device memory."


@pytest.fixture(scope="module")
def prompt() -> list[int]:
    return Tokenizer.from_gguf(ensure_model("tiny")).encode(TEXT)


@pytest.fixture(scope="module")
def engine() -> Iterator[Engine]:
    with Engine(ensure_model("tiny"), EngineConfig(threads=2)) as e:
        yield e


@pytest.fixture(scope="module")
def http() -> Iterator[httpx.Client]:
    s = Served(ensure_model("tiny"), "--threads", "2", "--quiet")
    with httpx.Client(base_url=s.url, timeout=120) as c:
        yield c
    s.stop()


def test_one_token_engine(benchmark, engine: Engine, prompt: list[int]) -> None:  # type: ignore[no-untyped-def]
    def run() -> None:
        engine.kv_reset()
        engine.generate(prompt, max_tokens=1, temperature=0.0)

    benchmark.pedantic(run, rounds=30, warmup_rounds=3)
    benchmark.extra_info.update(path="engine", tokens=1)


def test_one_token_server(benchmark, http: httpx.Client, prompt: list[int]) -> None:  # type: ignore[no-untyped-def]
    def run() -> None:
        r = http.post("/v1/completions", json={"prompt": prompt, "max_tokens": 1, "temperature": 0})
        assert r.status_code == 200

    benchmark.pedantic(run, rounds=30, warmup_rounds=3)
    benchmark.extra_info.update(path="server", tokens=1)


def test_generate_engine(benchmark, engine: Engine, prompt: list[int]) -> None:  # type: ignore[no-untyped-def]
    def run() -> None:
        engine.kv_reset()
        engine.generate(prompt, max_tokens=N, temperature=0.0, stop_at_eos=False, top_logits=2)

    benchmark.pedantic(run, rounds=7, warmup_rounds=1)
    benchmark.extra_info.update(path="engine", tokens=N, tokens_per_second=N / benchmark.stats.stats.median)


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "sse"])
def test_generate_server(benchmark, http: httpx.Client, prompt: list[int], stream: bool) -> None:  # type: ignore[no-untyped-def]
    body = {"prompt": prompt, "max_tokens": N, "temperature": 0, "ignore_eos": True, "stream": stream}

    def run() -> None:
        if stream:
            with http.stream("POST", "/v1/completions", json=body) as r:
                data = [line[5:].strip() for line in r.iter_lines() if line.startswith("data:")]
            assert data[-1] == "[DONE]" and json.loads(data[-2])["timings"]["predicted_n"] == N
        else:
            r = http.post("/v1/completions", json=body)
            assert r.json()["usage"]["completion_tokens"] == N

    benchmark.pedantic(run, rounds=7, warmup_rounds=1)
    benchmark.extra_info.update(
        path="server-sse" if stream else "server",
        tokens=N,
        tokens_per_second=N / benchmark.stats.stats.median,
    )
