"""Several sequences at once (EngineConfig.parallel): every sequence's reply, and every logit it was picked
from, is bit-identical to the same prompt decoded alone, at N = 1, 4 and 8, with sequences joining and
leaving at different steps and a finished sequence's KV cache reused by the next prompt."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from _gguf_helper import TinyConfig, write_qwen3moe

from strata import EngineConfig, InvalidArgumentError
from strata._engine import Engine
from strata._memplan import predict

pytestmark = pytest.mark.asan


def _prompts(n_vocab: int, count: int) -> list[list[int]]:
    rng = np.random.default_rng(7)
    # lengths from 1 token to a few chunks of the small prefill used below
    return [[int(t) for t in rng.integers(3, n_vocab, size=int(rng.integers(1, 40)))] for _ in range(count)]


def alone(eng: Engine, prompt: list[int], n: int) -> tuple[list[int], list[np.ndarray]]:
    """Greedy reply of prompt decoded alone in sequence 0, with the logits of every step."""
    eng.kv_reset()
    eng.prefill(prompt)
    out, logits = [], [eng.logits()]
    for _ in range(n):
        tok = int(np.argmax(logits[-1]))
        out.append(tok)
        eng.decode(tok)
        logits.append(eng.logits())
    return out, logits


def together(
    eng: Engine, prompts: list[list[int]], lengths: list[int], n_seq: int
) -> list[tuple[list[int], list[np.ndarray]]]:
    """The same prompts, run n_seq at a time in one engine: prompt i joins when a sequence is free (a
    newcomer's prompt read between steps), every running sequence steps in one decode_batch, and a
    sequence leaves after lengths[i] tokens, its KV cache emptied for the next prompt."""
    results: list[tuple[list[int], list[np.ndarray]]] = [([], []) for _ in prompts]
    running: dict[int, int] = {}  # sequence -> prompt index
    pending = list(range(len(prompts)))
    step = 0
    while pending or running:
        # one newcomer per step at most, so that sequences are at different positions
        free = [q for q in range(n_seq) if q not in running]
        if pending and free and (step % 2 == 0 or not running):
            i, q = pending.pop(0), free[-1]
            eng.seq_kv_truncate(q, 0)
            eng.seq_prefill(q, prompts[i])
            running[q] = i
            results[i][1].append(eng.seq_logits(q))
        seqs, toks = [], []
        for q, i in sorted(running.items()):
            tok = int(np.argmax(results[i][1][-1]))
            results[i][0].append(tok)
            seqs.append(q)
            toks.append(tok)
        eng.decode_batch(seqs, toks)
        for q in seqs:
            i = running[q]
            results[i][1].append(eng.seq_logits(q))
            if len(results[i][0]) == lengths[i]:
                del running[q]
        step += 1
    return results


@pytest.fixture(scope="module")
def q8_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_qwen3moe(tmp_path_factory.mktemp("par") / "m-q8_0.gguf", TinyConfig(wtype="q8_0"))


@pytest.mark.parametrize("n_seq", [1, 4, 8])
@pytest.mark.parametrize("simd", ["auto", "scalar"])
def test_batched_decode_is_bit_identical_to_alone(tiny: Path, q8_model: Path, n_seq: int, simd: str) -> None:
    for model in (tiny, q8_model):
        cfg = EngineConfig(threads=2, simd=simd, prefill="16", max_context=128)
        with Engine(model, cfg) as one:
            prompts = _prompts(one.info.n_vocab, n_seq + 3)  # more prompts than sequences: slots are reused
            lengths = [5 + (3 * i) % 11 for i in range(len(prompts))]
            ref = [alone(one, p, n) for p, n in zip(prompts, lengths, strict=True)]
        with Engine(
            model, EngineConfig(threads=2, simd=simd, prefill="16", max_context=128, parallel=n_seq)
        ) as eng:
            assert eng.n_seq == n_seq
            got = together(eng, prompts, lengths, n_seq)
        for i, ((rt, rl), (gt, gl)) in enumerate(zip(ref, got, strict=True)):
            assert gt == rt, f"{model.name}: prompt {i}'s reply differs beside others: {gt} != {rt}"
            assert len(gl) == len(rl)
            for k, (a, b) in enumerate(zip(rl, gl, strict=True)):
                assert np.array_equal(a, b), (
                    f"{model.name}: prompt {i}, step {k}: logits differ by up to {np.abs(a - b).max()}"
                )


def test_plan_counts_the_kv_of_every_sequence(tiny: Path) -> None:
    budget = 64 << 20
    base = EngineConfig(threads=2, vram_budget=budget, max_context=512)
    with Engine(tiny, base) as one, Engine(tiny, EngineConfig(**{**base.to_dict(), "parallel": 4})) as four:
        p1, p4 = one.plan, four.plan
        assert (p1.n_seq, p4.n_seq) == (1, 4)
        assert p4.kv_bytes == 4 * p1.kv_bytes
        assert p4.scratch_bytes == four.layout(4).buffer_bytes  # the decode scratch holds a step of 4 rows
        assert p4.scratch_bytes > p1.scratch_bytes
        # the larger fixed part leaves fewer slots for the cache, from the same budget
        assert p4.budget_bytes == p1.budget_bytes and p4.n_slots < p1.n_slots
        # the loan of a prompt read into any sequence is the one predict gives
        prompt = list(range(3, 3 + 300))
        for q in (0, 3):
            four.seq_kv_truncate(q, 0)
            four.seq_prefill(q, prompt)
            st = four.stats()
            pr = predict(four, len(prompt))
            assert (st.last_chunk, st.last_loan_slots) == (pr.chunk_used, pr.loan_slots)
            assert pr.loan_slots > 0


def test_bad_batches_are_refused_with_the_reason(tiny: Path) -> None:
    with Engine(tiny, EngineConfig(threads=2, max_context=64, parallel=2)) as eng:
        eng.seq_prefill(0, [5, 6, 7])
        with pytest.raises(InvalidArgumentError, match="sequence 2 is not in 0..1"):
            eng.seq_prefill(2, [5])
        with pytest.raises(InvalidArgumentError, match="appears twice"):
            eng.decode_batch([0, 0], [5, 6])
        with pytest.raises(Exception, match="sequence 1 has no prompt yet"):
            eng.decode_batch([0, 1], [5, 6])
        eng.seq_prefill(1, [9])
        eng.decode_batch([0, 1], [5, 6])
        assert (eng.seq_n_past(0), eng.seq_n_past(1)) == (4, 2)
    with pytest.raises(ValueError, match="--parallel"):
        EngineConfig(parallel=0).validate()


@pytest.mark.parametrize("n_seq", [1, 4, 8])
def test_batch_generations_equal_generate_alone(tiny: Path, n_seq: int) -> None:
    """strata._batch.Batch, the server's scheduler: each generation (greedy and sampled, stop tokens, a
    max_tokens of 0, a context that fills) returns what Engine.generate returns for it alone."""
    from strata import Batch, BatchRequest

    cfg = EngineConfig(threads=2, prefill="16", max_context=96)
    with Engine(tiny, cfg) as one:
        prompts = _prompts(one.info.n_vocab, n_seq + 4)
        reqs = []
        for i, p in enumerate(prompts):
            kw: dict[str, Any] = {"max_tokens": [12, 0, 7, 90][i % 4], "seed": 100 + i}
            if i % 3 == 1:
                kw.update(temperature=0.9, top_k=40, top_p=0.95)
            if i % 5 == 2:
                kw.update(stop_tokens=[int(t) for t in range(3, one.info.n_vocab, 7)])
            reqs.append((p, kw))
        ref = []
        for p, kw in reqs:
            one.kv_reset()
            ref.append(one.generate(p, top_logits=2, **kw))
    with Engine(tiny, EngineConfig(**{**cfg.to_dict(), "parallel": n_seq})) as eng:
        b = Batch(eng, chunk=16)
        got: dict[int, Any] = {}
        todo = list(enumerate(reqs))
        while todo or b.active:
            free = b.free_sequences()
            if todo and free:
                i, (p, kw) = todo.pop(0)
                b.start(BatchRequest(i, p, top_logits=2, **kw), free[0])
            for key, res, err in b.step():
                assert err is None, err
                got[key] = res
    for i, r in enumerate(ref):
        g = got[i]
        assert (g.tokens, g.finish_reason, g.prompt_tokens) == (r.tokens, r.finish_reason, r.prompt_tokens), i
        assert g.top == r.top, i


def test_a_cancel_inside_a_prompt_ends_only_that_generation(tiny: Path) -> None:
    """A newcomer whose on_prompt says stop while its prompt is read (inside the piece, between layers) ends
    "cancelled" with nothing generated; the sequence beside it gets the reply it gets alone."""
    from strata import Batch, BatchRequest

    cfg = EngineConfig(threads=2, prefill="64", max_context=96)
    with Engine(tiny, cfg) as one:
        keep, stop = _prompts(one.info.n_vocab, 2)
        ref = one.generate(keep, max_tokens=10, stop_at_eos=False)
    with Engine(tiny, EngineConfig(**{**cfg.to_dict(), "parallel": 2})) as eng:
        b = Batch(eng, chunk=64)
        asked: list[tuple[int, int]] = []
        b.start(BatchRequest("keep", keep, max_tokens=10, stop_at_eos=False), 0)
        b.start(BatchRequest("stop", stop, on_prompt=lambda d, t: asked.append((d, t)) or True), 1)
        got: dict[str, Any] = {}
        while b.active:
            for key, res, err in b.step():
                assert err is None, err
                got[key] = res
    assert asked[0] == (0, len(stop))  # asked before any of its tokens were done: inside the piece
    assert (got["stop"].finish_reason, got["stop"].tokens) == ("cancelled", [])
    assert (got["keep"].tokens, got["keep"].finish_reason) == (ref.tokens, ref.finish_reason)
