"""Properties of the memory plan over random settings, and identical replies across cache settings.

1. Hypothesis draws budgets, cache sizes, contexts, KV types, prefill modes, lend policies and prompt
   lengths. Under the current policy every request is served, its loan is exactly its own layout and
   within the loan limit, a halving happens only with its trace line, and the residency table after the
   prompt is the one before it. Under the legacy policy a request fails, with the one message, exactly
   when its layout needs more slots than the loan sized for the auto chunk.
2. Greedy replies (64 tokens; 4 prompts of 200 to 3000 tokens) are bit-identical, token ids and logits,
   across 6 expert-cache sizes x 3 prefill modes x both miss policies, and equal to the engine without an
   expert cache.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from strata import Engine, EngineConfig
from strata._exceptions import BudgetError, LendError
from strata._memplan import predict

LEND_MSG = re.compile(
    r"^lending the prompt path its slots failed: prefill: device buffers for a chunk of (\d+) tokens do not fit "
    r"\([\d.]+ of [\d.]+ MiB free at the failure; [\d.]+ MiB taken, the failing buffer wanted [\d.]+ MiB\)$"
)
LENT = re.compile(r"^lent (\d+) slots for (\d+) tokens$")
HALVED = re.compile(r"^chunk (\d+) halved to (\d+): it needs (\d+) slots, the cache lends at most (\d+)$")


def _prompt(n: int, seed: int) -> list[int]:
    return np.random.default_rng(seed).integers(3, 2000, n).tolist()


# Cache sizes around which, by the plan's figures (plan.c), the small pick falls between a short
# prompt's chunk and the auto chunk at each context; draws are steered there one time in three so that
# legacy failures are common enough to be checked. Nothing below asserts these ranges.
_STEER = {512: (700, 1700), 1024: (1400, 3300), 2048: (3000, 4300), 4096: (3000, 5900)}


@st.composite
def engine_settings(draw: st.DrawFn) -> tuple[dict[str, object], list[int]]:
    ctx = draw(st.sampled_from([256, 512, 1024, 2048, 4096]))
    if ctx in _STEER and draw(st.integers(0, 2)) == 0:
        lo, hi = _STEER[ctx]
        cfg0: dict[str, object] = {
            "threads": 1,
            "max_context": ctx,
            "kv": draw(st.sampled_from(["f16", "int8"])),
            "lend_policy": draw(st.sampled_from(["legacy", "legacy", "current"])),
            "expert_cache": str(draw(st.integers(lo, hi))),
        }
        return cfg0, draw(st.lists(st.integers(1, min(ctx // 2, 1200)), min_size=1, max_size=3))
    cfg: dict[str, object] = {
        "threads": 1,
        "max_context": ctx,
        "kv": draw(st.sampled_from(["f16", "int8"])),
        "prefill": draw(
            st.sampled_from(["auto", "auto", "auto", "auto:512", "auto:1024", "64", "200", "1000"])
        ),
        "lend_policy": draw(st.sampled_from(["current", "legacy"])),
        "expert_cache": draw(st.sampled_from(["auto", "n", "n", "n", "n"])),
    }
    if cfg["expert_cache"] == "n":
        cfg["expert_cache"] = str(draw(st.integers(4, 6000)))
    # each of these 1 time in 4, so that the defaults (where the legacy windows are) get most draws
    if draw(st.integers(0, 3)) == 0:
        cfg["vram_budget"] = draw(st.integers(1, 160)) << 20
    if draw(st.integers(0, 3)) == 0:
        cfg["lend_pct"] = draw(st.sampled_from([0.25, 0.5, 0.75, 1.0]))
    if draw(st.integers(0, 3)) == 0:
        cfg["lend_floor"] = draw(st.integers(0, 300))
    # prompts are kept short enough for CI; the long ones are in the identity test below
    lengths = draw(st.lists(st.integers(1, min(ctx, 1200)), min_size=1, max_size=3))
    return cfg, lengths


def open_engine(model: Path, cfg: EngineConfig, trace: Callable[[str], None] | None = None) -> Engine | None:
    """The engine of a drawn setting, or None when the setting's budget cannot hold the plan: then the
    error says which flag to change (checked here)."""
    try:
        return Engine(model, cfg, trace=trace)
    except BudgetError as e:
        assert re.search(r"--(vram-budget|expert-cache|max-context|lend-pct|host-ram-budget)", str(e)), str(e)
        event("budget error")
        return None


def check_requests(eng: Engine, lengths: list[int], lines: list[str]) -> None:
    """Prompts of the given lengths through a drawn engine: under the current policy every request is
    served with a loan of exactly its own layout (halved, with its trace line, only when it did not fit);
    under the legacy policy a request fails, with the one message, exactly when its layout needs more
    slots than the loan sized for the auto chunk; _memplan.predict says which beforehand; the refill
    restores the residency table. Shared by the GPU suite (tests/gpu/test_memplan_gpu.py)."""
    p = eng.plan
    assert p.auto_loan_slots <= p.max_lend_slots
    for i, n in enumerate(lengths):
        eng.kv_reset()
        before = eng.residency()
        halvings0 = eng.stats().halvings
        pred = predict(eng, n)
        lines.clear()
        t = min(
            p.auto_chunk, -(-n // 256) * 256
        )  # its length rounded up to 256 tokens, at most the auto chunk
        assert t == pred.chunk
        if p.lend_policy == 0:
            eng.prefill(_prompt(n, i))  # every request is served
            lent = [LENT.match(ln) for ln in lines if LENT.match(ln)]
            assert len(lent) == 1, lines
            k, used = int(lent[0].group(1)), int(lent[0].group(2))
            lay = eng.layout(used)
            assert k == lay.slots_needed <= p.max_lend_slots  # the loan holds the request's own layout
            assert eng.stats().last_loan_slots == k
            halved = [HALVED.match(ln) for ln in lines if HALVED.match(ln)]
            assert len(halved) == eng.stats().halvings - halvings0
            if halved:  # each halving is traced, and only a chunk that did not fit is halved
                assert int(halved[0].group(1)) == t and int(halved[-1].group(2)) == used
                assert all(int(h.group(3)) > int(h.group(4)) for h in halved)
            else:
                assert used == t
            assert (used, k, len(halved)) == (pred.chunk_used, pred.loan_slots, pred.halvings)
            assert eng.n_past == n
            event("current: halved" if halved else "current: served at its chunk")
        else:
            fails = t < p.auto_chunk and eng.layout(t).slots_needed > p.auto_loan_slots
            assert (pred.verdict == "lend failed") == fails
            if fails:
                with pytest.raises(LendError) as ei:
                    eng.prefill(_prompt(n, i))
                m = LEND_MSG.match(str(ei.value))
                assert m and int(m.group(1)) == t, str(ei.value)
                assert eng.n_past == 0
                event("legacy: lend failed")
            else:
                eng.prefill(_prompt(n, i))
                assert f"lent {p.auto_loan_slots} slots for {t} tokens" in lines
                assert eng.n_past == n
                event("legacy: served")
        assert (eng.residency() == before).all()  # the refill restored the cache exactly
        assert eng.stats().slots_lent_now == 0
        if any(ln.startswith("lent ") for ln in lines):
            assert any(ln.startswith(f"refilled {eng.stats().last_loan_slots} slots") for ln in lines), lines


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True)
@given(engine_settings())
def test_every_request_is_served_with_its_own_layout(
    tiny: Path, setting: tuple[dict[str, object], list[int]]
) -> None:
    cfg, lengths = setting
    lines: list[str] = []
    eng = open_engine(tiny, EngineConfig(**cfg), lines.append)  # type: ignore[arg-type]
    if eng is None:
        return
    with eng:
        check_requests(eng, lengths, lines)


# ---- identity --------------------------------------------------------------------------------------

PROMPTS = (200, 900, 1800, 3000)
N_GEN = 64
CACHES = ("32", "64", "100", "160", "700", "4500")  # from a quarter of the model's 128 experts to far above
PREFILLS = ("auto", "64", "512")
MISSES = ("host", "copy")


def _replies(eng: Engine) -> list[tuple[list[int], np.ndarray]]:
    out = []
    for i, n in enumerate(PROMPTS):
        eng.kv_reset()
        steps: list[np.ndarray] = []
        r = eng.generate(
            _prompt(n, 100 + i),
            max_tokens=N_GEN,
            stop_at_eos=False,
            on_token=lambda _t, lg, s=steps: s.append(lg.copy()),
        )
        out.append((r.tokens, np.stack(steps)))
    return out


@pytest.mark.slow
def test_replies_are_identical_across_cache_sizes_chunks_and_miss_policies(tiny: Path) -> None:
    base = {"threads": 1, "max_context": 3072}
    with Engine(tiny, EngineConfig(expert_cache="0", **base)) as ref_eng:  # type: ignore[arg-type]
        ref = _replies(ref_eng)
    assert all(len(toks) == N_GEN for toks, _ in ref)
    seen_chunks: set[int] = set()
    for cache in CACHES:
        for prefill in PREFILLS:
            for miss in MISSES:
                cfg = EngineConfig(expert_cache=cache, prefill=prefill, miss=miss, **base)  # type: ignore[arg-type]
                with Engine(tiny, cfg) as eng:
                    got = _replies(eng)
                    st_ = eng.stats()
                    seen_chunks.add(eng.plan.auto_chunk)
                    if int(cache) < 128:  # a cache smaller than the model really missed and streamed
                        assert st_.misses > 0 and st_.bytes_streamed > 0
                for i, ((rt, rl), (gt, gl)) in enumerate(zip(ref, got, strict=True)):
                    where = f"cache {cache}, prefill {prefill}, miss {miss}, prompt {PROMPTS[i]} tokens"
                    assert gt == rt, f"{where}: tokens differ"
                    diff = np.nonzero((gl.view(np.uint32) != rl.view(np.uint32)).any(axis=1))[0]
                    assert diff.size == 0, f"{where}: logits differ first at step {diff[0]}"
    assert len(seen_chunks) >= 4  # the sizes really gave different chunkings
