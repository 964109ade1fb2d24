"""Expert-cache benchmarks on the small preset (``make bench``; not part of ``make test``).

1. Decode with budgets that hold 25%, 50% and 100% of the model's experts, for the adaptive policy and
   for LRU: tokens/s and hit rate after a warm-up (the first WARMUP generated tokens are excluded).
2. Prompt tokens/s against the chunk (``--prefill N``) with every expert cached.

Each row is printed and attached to the pytest-benchmark record (extra_info), with the knobs it ran.
"""

from __future__ import annotations

import time

import numpy as np
import pytest

import strata._engine as engine_mod
import strata.model as model_mod

pytestmark = pytest.mark.bench


PROMPT = 256
WARMUP = 64
MEASURE = 192
THREADS = 2


@pytest.fixture(scope="module")
def small() -> str:
    return str(model_mod.ensure_model("small"))


def _decode_run(path: str, cache: str, policy: str, miss: str) -> dict[str, float]:
    from strata import EngineConfig

    cfg = EngineConfig(threads=THREADS, expert_cache=cache, cache_policy=policy, miss=miss)
    with engine_mod.Engine(path, cfg) as eng:
        prompt = np.random.default_rng(1).integers(0, eng.info.n_vocab, PROMPT).tolist()
        eng.prefill(prompt)
        tok = int(np.argmax(eng.logits()))
        for _ in range(WARMUP):
            eng.decode(tok)
            tok = int(np.argmax(eng.logits()))
        eng.reset_stats()
        t0 = time.perf_counter()
        for _ in range(MEASURE):
            eng.decode(tok)
            tok = int(np.argmax(eng.logits()))
        dt = time.perf_counter() - t0
        st = eng.stats()
        return {
            "slots": eng.plan.n_slots,
            "experts": eng.plan.n_experts_total,
            "tok_s": MEASURE / dt,
            "hit_rate": st.hits / st.lookups,
            "swaps": float(st.swaps),
        }


@pytest.mark.parametrize("miss", ["host", "copy"])
def test_decode_hit_rate_adaptive_vs_lru(benchmark, small: str, miss: str) -> None:
    rows = []
    with engine_mod.Engine(small, engine_mod.EngineConfig(threads=1)) as probe:
        total = probe.plan.n_experts_total
    for share in (0.25, 0.5, 1.0):
        for policy in ("adaptive", "lru"):
            r = _decode_run(small, str(int(total * share)), policy, miss)
            rows.append({"share": share, "policy": policy, "miss": miss, **r})
    benchmark.extra_info["rows"] = rows
    benchmark.pedantic(lambda: None, rounds=1)
    print(
        f"\ndecode on the small preset, {THREADS} threads, miss={miss}, {MEASURE} tokens after {WARMUP} warm-up"
    )
    print("| experts cached | policy | slots | tok/s | hit rate | swaps |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['share']:.0%} | {r['policy']} | {r['slots']} | {r['tok_s']:.1f} | {r['hit_rate']:.1%} | {r['swaps']:.0f} |"
        )
    for share in (0.25, 0.5):
        a = next(r for r in rows if r["share"] == share and r["policy"] == "adaptive")
        lru = next(r for r in rows if r["share"] == share and r["policy"] == "lru")
        print(f"{share:.0%}: adaptive - lru hit rate = {a['hit_rate'] - lru['hit_rate']:+.1%}")


def test_prefill_speed_against_chunk(benchmark, small: str) -> None:
    from strata import EngineConfig

    rows = []
    n = 2048
    for chunk in (64, 128, 256, 512, 1024, 2048):
        with engine_mod.Engine(
            small, EngineConfig(threads=THREADS, prefill=str(chunk), max_context=4096)
        ) as eng:
            prompt = np.random.default_rng(2).integers(0, eng.info.n_vocab, n).tolist()
            eng.prefill(prompt[:64])  # warm-up
            samples = []
            for _ in range(3):
                eng.kv_reset()
                t0 = time.perf_counter()
                eng.prefill(prompt)
                samples.append(n / (time.perf_counter() - t0))
            rows.append(
                {"chunk": eng.stats().last_chunk, "tok_s": float(np.median(samples)), "samples": samples}
            )
    benchmark.extra_info["rows"] = rows
    benchmark.pedantic(lambda: None, rounds=1)
    print(f"\nprompt of {n} tokens on the small preset, {THREADS} threads, every expert cached (median of 3)")
    print("| chunk | prompt tok/s |")
    print("|---|---|")
    for r in rows:
        print(f"| {r['chunk']} | {r['tok_s']:.0f} |")
