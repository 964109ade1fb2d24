"""Prompt and decode speed of the engine on the CPU (``make bench``; not part of ``make test``).

For the tiny and small presets: prompt tokens/s (a 512-token prompt) and decode tokens/s (64 greedy
steps), each with the GB/s of weight bytes the step had to read — the roofline figure of a decode step,
which is bound by memory. Bytes per decode token: every non-expert matrix (the output head whole, one
row of the embedding) plus K experts per layer. Bytes per prompt chunk: the same matrices plus every
expert the chunk's tokens route to (nearly all of them for chunks of 256 tokens).
"""

from __future__ import annotations

import os

import numpy as np
import pytest

import strata._engine as engine
import strata.model as model

pytestmark = pytest.mark.bench


PROMPT = 512
DECODE = 64


def _weight_bytes(path: str) -> tuple[int, int, int]:
    """(bytes of non-expert matrices read per token, bytes of one layer's experts, embedding row bytes)."""
    from gguf import GGUFReader

    r = GGUFReader(path)
    dense = experts = embd_row = 0
    for t in r.tensors:
        if "_exps" in t.name:
            experts += int(t.n_bytes)
        elif t.name == "token_embd.weight":
            embd_row = int(t.n_bytes) // int(t.shape[1])
        else:
            dense += int(t.n_bytes)
    n_layer = sum(1 for t in r.tensors if t.name.endswith("ffn_down_exps.weight"))
    return dense, experts // max(1, n_layer), embd_row


@pytest.fixture(scope="module", params=["tiny", "small"])
def opened(request):  # type: ignore[no-untyped-def]
    path = str(model.ensure_model(request.param))
    threads = int(os.environ.get("STRATA_BENCH_THREADS", "0")) or None
    eng = engine.Engine(path, engine.EngineConfig(threads=threads))
    yield request.param, path, eng
    eng.close()


def test_prompt(benchmark, opened) -> None:  # type: ignore[no-untyped-def]
    preset, path, eng = opened
    prompt = np.random.default_rng(0).integers(3, eng.info.n_vocab, PROMPT).tolist()

    def run() -> None:
        eng.kv_reset()
        eng.prefill(prompt)

    benchmark.pedantic(run, rounds=5, warmup_rounds=1)
    dense, layer_experts, embd_row = _weight_bytes(path)
    chunks = -(-PROMPT // eng.plan.auto_chunk)
    nbytes = chunks * (dense + eng.info.n_layer * layer_experts) + PROMPT * embd_row
    t = benchmark.stats.stats.median
    benchmark.extra_info.update(
        preset=preset,
        threads=eng.plan.n_threads,
        tokens_per_second=PROMPT / t,
        weights_gb_per_second=nbytes / t / 1e9,
    )


def test_decode(benchmark, opened) -> None:  # type: ignore[no-untyped-def]
    preset, path, eng = opened
    prompt = np.random.default_rng(1).integers(3, eng.info.n_vocab, 32).tolist()

    def run() -> None:
        eng.kv_reset()
        eng.prefill(prompt)
        eng.reset_stats()
        tok = int(np.argmax(eng.logits()))
        for _ in range(DECODE):
            eng.decode(tok)
            tok = int(np.argmax(eng.logits()))

    benchmark.pedantic(run, rounds=5, warmup_rounds=1)
    dense, layer_experts, embd_row = _weight_bytes(path)
    per_token = (
        dense + embd_row + eng.info.n_layer * eng.info.n_expert_used * layer_experts // eng.info.n_expert
    )
    ms = eng.stats().decode_ms / DECODE  # the last round's decode time per token
    benchmark.extra_info.update(
        preset=preset,
        threads=eng.plan.n_threads,
        tokens_per_second=1e3 / ms,
        weights_gb_per_second=per_token / (ms / 1e3) / 1e9,
        bytes_per_token=per_token,
    )
