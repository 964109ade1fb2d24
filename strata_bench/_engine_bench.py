"""The strata target: llama-bench's tests run through the Python binding.

Tests, named as llama-bench names them:

- ``ppN``: N random prompt tokens prefilled into an empty context; t/s = N / time;
- ``tgN``: N tokens decoded one at a time after a one-token context; t/s = N / time;
- ``... @ dD``: the same after D random tokens were prefilled (not timed).

The tokens are drawn from a generator seeded by the seed and the test's own token counts, so a test
reads the same tokens whichever other tests share its run. Every setting of the harness that changes
the work is in the record's ``work`` (the tokens, the effective context and thread count, the warm-up
runs); the engine's flags as given are its ``knobs``, and what the engine made of them its ``plan``.

Each test runs once to warm up (not recorded), then ``repetitions`` times. The engine's counters are
reset before each timed part and read after it, so hit rate, bytes streamed and slots lent describe
exactly what was timed. The tokens are random but fixed by the seed, so two runs read the same ones.
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from strata._config import EngineConfig

from ._model import bytes_moved, weight_bytes
from ._nvml import GpuSampler
from ._records import base_record, failed_record, llama_test_name, summarize

__all__ = ["PROMPT_SET", "BenchTest", "plan_tests", "run_strata"]

# the token ids a test reads: uniform over the vocabulary, from numpy's default generator seeded by
# [seed, n_prompt, n_gen, n_depth]; a change to how they are drawn gets a new name
PROMPT_SET = "uniform-ids/2"


@dataclasses.dataclass(frozen=True)
class BenchTest:
    n_prompt: int
    n_gen: int
    n_depth: int

    @property
    def name(self) -> str:
        return llama_test_name(self.n_prompt, self.n_gen, self.n_depth)

    @property
    def context(self) -> int:
        """Tokens of context the test needs."""
        return self.n_depth + (self.n_prompt if self.n_prompt else self.n_gen + 1)


def plan_tests(n_prompt: Sequence[int], n_gen: Sequence[int], n_depth: Sequence[int]) -> list[BenchTest]:
    """llama-bench's order: for each depth, the prompt tests and then the generation tests."""
    tests: list[BenchTest] = []
    for d in list(n_depth) or [0]:
        tests += [BenchTest(p, 0, d) for p in n_prompt if p > 0]
        tests += [BenchTest(0, g, d) for g in n_gen if g > 0]
    return tests


def _stats_dict(stats: Any) -> dict[str, Any]:
    if dataclasses.is_dataclass(stats):
        return dataclasses.asdict(stats)  # type: ignore[arg-type]
    return dict(vars(stats))


def _run_once(
    eng: Any, test: BenchTest, rng: np.random.Generator, n_vocab: int
) -> tuple[int, dict[str, Any]]:
    """One timed run of a test; returns (nanoseconds, the engine's counters for the timed part)."""
    eng.kv_reset()
    if test.n_depth:
        eng.prefill(rng.integers(0, n_vocab, test.n_depth).tolist())
    if test.n_prompt:
        tokens = rng.integers(0, n_vocab, test.n_prompt).tolist()
        eng.reset_stats()
        t0 = time.perf_counter_ns()
        eng.prefill(tokens)
        ns = time.perf_counter_ns() - t0
    else:
        if not test.n_depth:
            eng.prefill(rng.integers(0, n_vocab, 1).tolist())
        tokens = rng.integers(0, n_vocab, test.n_gen).tolist()
        eng.reset_stats()
        t0 = time.perf_counter_ns()
        for tok in tokens:
            eng.decode(tok)
        ns = time.perf_counter_ns() - t0
    return ns, _stats_dict(eng.stats())


def _metrics(
    runs: list[dict[str, Any]], test: BenchTest, seconds: float, weights: dict[str, Any] | None, kv: str
) -> dict[str, Any]:
    """Engine counters averaged over the timed runs, and the achieved GB/s."""

    def mean(key: str) -> float:
        vals = [float(r.get(key, 0) or 0) for r in runs]
        return sum(vals) / len(vals) if vals else 0.0

    lookups, hits = mean("lookups"), mean("hits")
    chunk = int(max((r.get("last_chunk", 0) or 0) for r in runs)) if runs else 0
    out: dict[str, Any] = {
        "lookups": lookups,
        "hits": hits,
        "hit_rate": hits / lookups if lookups else None,
        "swaps": mean("swaps"),
        "bytes_streamed": mean("bytes_streamed"),
        "bytes_copied": mean("bytes_copied"),
        "host_expert_runs": mean("host_expert_runs"),
        "slots_lent": int(max((r.get("last_loan_slots", 0) or 0) for r in runs))
        if test.n_prompt and runs
        else 0,
        "chunk": chunk if test.n_prompt else None,
        "halvings": int(max((r.get("halvings", 0) or 0) for r in runs)) if runs else 0,
        "bytes_moved": None,
        "gbps": None,
    }
    if weights is not None and seconds > 0:
        moved = bytes_moved(weights, test.n_prompt, test.n_gen, test.n_depth, chunk or test.n_prompt, kv)
        out["bytes_moved"] = moved
        out["gbps"] = moved / seconds / 1e9
    return out


_baseline: int | None = None  # device memory in use before this process opened its first engine


def _error(phase: str, exc: BaseException, flags: str) -> dict[str, Any]:
    return {
        "phase": phase,
        "type": type(exc).__name__,
        "status": getattr(exc, "status", None),
        "message": str(exc),
        "flags": flags,
    }


def run_strata(
    model_path: str,
    model: dict[str, Any],
    configs: Sequence[EngineConfig],
    tests: Sequence[BenchTest],
    repetitions: int,
    on_record: Callable[[dict[str, Any]], None],
    *,
    warmup: int = 1,
    seed: int = 0,
    advance: Callable[[int], None] | None = None,
) -> int:
    """Run every test under every configuration; each finished test becomes a record. Returns the row count.

    A configuration that fails does not stop the others: when the engine cannot open (a budget too
    small for the plan, no device, out of memory), each of its tests gets a failed record naming the
    flags and the engine's words; when one test fails (a loan that cannot be lent, a device error), that
    test gets a failed record and the next test runs on the same engine. Only a missing library, which
    no configuration could get past, stops the run.
    """
    from strata import Engine, StrataError
    from strata._exceptions import LibraryNotFoundError

    weights = weight_bytes(model_path)
    need = max((t.context for t in tests), default=1)
    steps = warmup + repetitions
    n = 0
    for cfg in configs:
        run_cfg = dataclasses.replace(cfg)
        if run_cfg.max_context is None:
            run_cfg.max_context = need  # like llama-bench, a context exactly as long as the tests need
        flags = " ".join(cfg.to_cli_args()) or "(default flags)"

        def common(
            test: BenchTest, cfg: EngineConfig = cfg, ctx: int = run_cfg.max_context
        ) -> dict[str, Any]:
            return {
                "target": "strata",
                "test": test.name,
                "kind": "pp" if test.n_prompt else "tg",
                "n_prompt": test.n_prompt,
                "n_gen": test.n_gen,
                "n_depth": test.n_depth,
                "unit": "t/s",
                "repetitions": repetitions,
                "warmup": warmup,
                "seed": seed,
                **model,
                "knobs": cfg.to_dict(),  # as given; what the engine made of them is in "plan"
                "work": {
                    "n_prompt": test.n_prompt,
                    "n_gen": test.n_gen,
                    "n_depth": test.n_depth,
                    "prompt_set": PROMPT_SET,
                    "seed": seed,
                    "warmup": warmup,
                    "max_context": ctx,  # the engine's context: it sizes the KV cache, so the plan
                    "threads": cfg.threads or os.cpu_count(),
                },
            }

        # one sampler per engine; its baseline is the device before the first engine of this process
        # opened, so that what an earlier engine leaves behind (the CUDA context) counts as strata's
        with GpuSampler(pids=[os.getpid()]) as gpu:
            global _baseline
            if _baseline is None:
                _baseline = gpu.baseline
            elif gpu.baseline is not None:
                gpu.baseline = min(gpu.baseline, _baseline)
            try:
                eng = Engine(model_path, run_cfg)
            except LibraryNotFoundError:
                raise
            except StrataError as e:
                for test in tests:
                    on_record(failed_record(_error("open", e, flags), **common(test)))
                    if advance:
                        advance(steps)
                continue
            with eng:
                info, plan = eng.info, eng.plan
                n_vocab = int(info.n_vocab)
                for test in tests:
                    rng = np.random.default_rng([seed, test.n_prompt, test.n_gen, test.n_depth])
                    samples_ns: list[int] = []
                    runs: list[dict[str, Any]] = []
                    gpu.take()  # the window of this test starts here
                    rep = 0
                    try:
                        for rep in range(steps):
                            ns, stats = _run_once(eng, test, rng, n_vocab)
                            if rep >= warmup:
                                samples_ns.append(ns)
                                runs.append(stats)
                            if advance:
                                advance(1)
                    except StrataError as e:
                        where = (
                            f"{test.name}, warm-up {rep + 1} of {warmup}"
                            if rep < warmup
                            else f"{test.name}, repetition {rep - warmup + 1} of {repetitions}"
                        )
                        on_record(
                            failed_record(
                                _error(where, e, flags),
                                **common(test),
                                plan=_stats_dict(plan),
                                nvml=gpu.take(),
                            )
                        )
                        if advance:
                            advance(steps - rep - 1)
                        continue
                    n_tokens = test.n_prompt or test.n_gen
                    samples = [n_tokens * 1e9 / ns for ns in samples_ns]
                    seconds = sum(samples_ns) / len(samples_ns) / 1e9
                    on_record(
                        base_record(
                            **common(test),
                            status="ok",
                            samples=samples,
                            samples_ns=samples_ns,
                            **summarize(samples),
                            metrics=_metrics(runs, test, seconds, weights, run_cfg.kv),
                            plan=_stats_dict(plan),
                            nvml=gpu.take(),
                        )
                    )
                    n += 1
    return n
