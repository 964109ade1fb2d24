"""One plan, one cache, one loan on the GPU: the CPU suite's memory-plan properties run against real
device memory, and every cache flag does on CUDA what it does on the CPU.

1. The settings tests/test_memplan_props.py draws (budgets, cache sizes, contexts, KV types, prefill
   modes, lend policies, prompt lengths), on the device, through the same checker: under the current
   policy every request is served with a loan of its own layout; under the legacy policy a request fails
   with the one message exactly when _memplan.predict says so, and the engine stays usable; the refill
   restores the residency table; what the engine really holds on the device stays within its budget.
2. The loan is real device memory: a prompt borrows slots, streams the displaced and uncached experts
   through the ring in them (bytes streamed), gives them back (refilled), and the reply equals the
   all-resident engine's bit for bit, whatever the cache size and chunk.
3. --cache-policy, --miss, the adaptive counts, profiles (save and --expert-profile) work on CUDA.
4. --host-ram-budget smaller than the expert store: the store falls back to the pinned staging ring, the
   plan says "mapped", the reply is unchanged.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings

from strata import Engine, EngineConfig
from strata._enums import Device
from strata._exceptions import LendError
from tests.test_memplan_props import LEND_MSG, _prompt, check_requests, engine_settings, open_engine

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def tiny(tiny: Path) -> Path:
    """conftest's tiny model, where there is a CUDA device."""
    from strata import _engine

    if not _engine.cuda_available():
        pytest.skip("no CUDA device")
    return tiny


def _cuda(tiny: Path, lines: list[str] | None = None, **kw: object) -> Engine:
    kw.setdefault("threads", 2)
    return Engine(tiny, EngineConfig(device="cuda", **kw), trace=lines.append if lines is not None else None)  # type: ignore[arg-type]


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True)
@given(engine_settings())
def test_every_request_is_served_with_its_own_layout_on_the_device(
    tiny: Path, setting: tuple[dict[str, object], list[int]]
) -> None:
    cfg, lengths = setting
    lines: list[str] = []
    eng = open_engine(tiny, EngineConfig(device="cuda", **cfg), lines.append)  # type: ignore[arg-type]
    if eng is None:
        return
    with eng:
        p = eng.plan
        assert p.device == Device.CUDA  # planned for the CUDA device
        check_requests(eng, lengths, lines)
        st = eng.stats()
        # what the engine really allocated on the device fits the budget it planned for
        assert 0 < st.device_peak_bytes <= p.budget_bytes, (st.device_peak_bytes, p.budget_bytes)
        # usable after any failed loan: a prompt at the auto chunk fits its own loan under either policy
        n = max(1, p.auto_chunk - 1)
        eng.kv_reset()
        eng.prefill(_prompt(n, 0))
        eng.decode(7)
        assert eng.n_past == n + 1


def _reply(eng: Engine, n: int, gen: int = 24) -> tuple[list[int], np.ndarray]:
    eng.kv_reset()
    steps: list[np.ndarray] = []
    r = eng.generate(
        _prompt(n, 5), max_tokens=gen, stop_at_eos=False, on_token=lambda _t, lg, s=steps: s.append(lg.copy())
    )
    return r.tokens, np.stack(steps)


def test_the_loan_is_device_memory_and_replies_do_not_depend_on_it(tiny: Path) -> None:
    with _cuda(tiny, max_context=4096) as ref_eng:
        assert ref_eng.plan.n_slots >= 128  # every expert of the tiny model and the largest loan
        ref = [_reply(ref_eng, n) for n in (300, 2500)]
    for cache, prefill in (("150", "auto"), ("400", "auto"), ("1500", "64"), ("3000", "auto:1024")):
        lines: list[str] = []
        with _cuda(tiny, lines, max_context=4096, expert_cache=cache, prefill=prefill, miss="copy") as eng:
            for i, n in enumerate((300, 2500)):
                lines.clear()
                before = eng.residency()
                eng.reset_stats()
                toks, logits = _reply(eng, n)
                st = eng.stats()
                lent = [ln for ln in lines if re.match(r"^lent \d+ slots for \d+ tokens$", ln)]
                assert len(lent) == 1, lines
                k = int(lent[0].split()[1])
                assert k == st.last_loan_slots > 0
                assert any(ln.startswith(f"refilled {k} slots") for ln in lines), lines
                assert st.slots_lent_now == 0
                if int(cache) < 128 + k:  # experts were displaced or never cached: they went through the ring
                    assert st.bytes_streamed > 0
                assert toks == ref[i][0], (cache, prefill, n)
                assert np.array_equal(logits, ref[i][1]), (cache, prefill, n)
                if st.swaps == 0:
                    assert (eng.residency() == before).all()


def test_legacy_fails_with_the_device_figures_and_the_engine_stays_usable(tiny: Path) -> None:
    """The tiny model's legacy band: a 2048-token chunk needs the deep ring, the loan was sized for the
    auto chunk of 4096. The device's layout is not the CPU's, so its band lies elsewhere: searched."""
    from strata._memplan import predict

    found = False
    for cache in range(1000, 9000, 50):
        with _cuda(tiny, threads=1, max_context=4096, expert_cache=str(cache), lend_policy="legacy") as eng:
            if predict(eng, 2000).verdict != "lend failed":
                continue
            found = True
            with pytest.raises(LendError) as ei:
                eng.prefill(_prompt(2000, 1))
            assert LEND_MSG.match(str(ei.value)), str(ei.value)
            # X of Y are the device's own free and total memory: Y is the card, not the loan
            total = float(re.search(r"of ([\d.]+) MiB free", str(ei.value)).group(1))  # type: ignore[union-attr]
            assert total * 2**20 > eng.plan.budget_bytes
            assert eng.n_past == 0 and eng.stats().slots_lent_now == 0
            eng.prefill(_prompt(4000, 2))  # a chunk of 4096, the auto chunk: its own loan, served
            eng.decode(3)
            assert eng.n_past == 4001
            break
    assert found, "no cache size in the tiny model's legacy band failed on the device"


def test_cache_policies_and_profiles_work_on_the_device(tiny: Path, tmp_path: Path) -> None:
    prompt = _prompt(200, 9)
    replies = {}
    stats = {}
    for policy in ("adaptive", "lru"):
        with _cuda(
            tiny,
            max_context=1024,
            expert_cache="40",
            cache_policy=policy,
            miss="copy",
            adapt_every=4,
            adapt_swaps=4,
        ) as eng:
            r = eng.generate(prompt, max_tokens=48, stop_at_eos=False)
            replies[policy] = r.tokens
            stats[policy] = eng.stats()
            if policy == "adaptive":
                prof = tmp_path / "p.txt"
                eng.save_profile(prof)
                learned = eng.residency().copy()
    # the policies differ in what they keep, never in the reply
    assert replies["adaptive"] == replies["lru"]
    assert stats["adaptive"].swaps > 0 and stats["lru"].swaps > 0  # both bring experts in on the device
    assert stats["lru"].bytes_copied > 0
    lines = prof.read_text().splitlines()
    assert lines[0].startswith("# strata expert profile") and len(lines) == 1 + 4 * 32
    # the profile fills the cache at open: its best 40 experts are the ones resident
    with _cuda(tiny, max_context=1024, expert_cache="40", expert_profile=str(prof)) as eng:
        res = eng.residency()
        best = [tuple(map(int, ln.split()[:2])) for ln in lines[1:41]]
        assert all(res[layer, ex] >= 0 for layer, ex in best)
        assert int((res >= 0).sum()) == 40
    assert int((learned >= 0).sum()) == 40
    # --miss host: misses run on the host with the device's bits
    with _cuda(tiny, max_context=1024, expert_cache="40", miss="host") as eng:
        r = eng.generate(prompt, max_tokens=48, stop_at_eos=False)
        assert r.tokens == replies["adaptive"]
        assert eng.stats().host_expert_runs > 0


def test_a_host_ram_budget_below_the_store_falls_back_to_the_staging_ring(tiny: Path) -> None:
    prompt = _prompt(700, 4)
    with _cuda(tiny, max_context=1024, expert_cache="60") as eng:
        ref = eng.generate(prompt, max_tokens=24, stop_at_eos=False).tokens
        store = eng.plan.host_expert_bytes
    lines: list[str] = []
    with _cuda(tiny, lines, max_context=1024, expert_cache="60", host_ram_budget=store // 2) as eng:
        assert any("expert store" in ln and "more than the host RAM" in ln for ln in lines), lines
        plan_line = next(ln for ln in lines if ln.startswith("plan: budget") and "host experts" in ln)
        assert "mapped" in plan_line
        assert eng.generate(prompt, max_tokens=24, stop_at_eos=False).tokens == ref
