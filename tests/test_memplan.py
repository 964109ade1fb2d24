"""The memory plan through the engine: the plan and layout(T), the loan and its refill, the legacy lend
failure, decode hits and misses, profiles, and bad input. Tiny preset, CPU backend, emulated budget.

What is asserted comes from the rules (docs/design.md, "The loan"; issue 4), not from the engine's own output: a loan
holds its request's layout, the residency table after a prompt is the one before it, a halving is
traced, and the legacy policy fails exactly where the loan sized for the auto chunk is smaller than the
request's own layout.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from strata import Engine, EngineConfig
from strata._exceptions import BudgetError, ContextError, LendError, ModelFileError, StrataError
from strata._memplan import predict

LEND_MSG = re.compile(
    r"^lending the prompt path its slots failed: prefill: device buffers for a chunk of (\d+) tokens do not fit "
    r"\(([\d.]+) of ([\d.]+) MiB free at the failure; ([\d.]+) MiB taken, the failing buffer wanted ([\d.]+) MiB\)$"
)
LENT = re.compile(r"^lent (\d+) slots for (\d+) tokens$")
HALVED = re.compile(r"^chunk (\d+) halved to (\d+): ")

# A configuration of the tiny preset in the legacy failure window (see plan.c's header): the auto chunk
# is 4096 and a 2048-token chunk, at or below the small pick, needs the deep ring.
LEGACY_CACHE = 4500


def prompt(n: int, seed: int = 0) -> list[int]:
    rng = np.random.default_rng(seed)
    return rng.integers(3, 2000, n).tolist()


def open_traced(model: Path, **cfg: object) -> tuple[Engine, list[str]]:
    lines: list[str] = []
    cfg.setdefault("threads", 1)
    return Engine(model, EngineConfig(**cfg), trace=lines.append), lines  # type: ignore[arg-type]


# ---- the plan ------------------------------------------------------------------------------------


@pytest.mark.asan
def test_plan_lines_and_non_monotonic_layout(tiny: Path) -> None:
    eng, lines = open_traced(tiny, expert_cache=str(LEGACY_CACHE))
    with eng:
        p = eng.plan
        # one line per start-up step, each with the memory left, then the plan line
        for step in ("resident weights", "KV cache", "decode scratch", "reserve", "expert cache"):
            assert any(step in ln and "MiB left" in ln for ln in lines), (step, lines)
        plan_line = [ln for ln in lines if ln.startswith("plan: budget") and "auto chunk" in ln]
        assert len(plan_line) == 1 and f"{p.n_slots} slots" in plan_line[0]
        # the fixed part and the cache add up to the budget
        assert (
            p.resident_bytes + p.kv_bytes + p.scratch_bytes + p.reserve_bytes + p.n_slots * p.slot_bytes
            <= p.budget_bytes
        )
        assert p.slot_bytes % 256 == 0 and p.slot_bytes >= eng.info.expert_bytes
        assert p.max_lend_slots <= min(p.n_slots - p.lend_floor, p.n_slots // 2)
        # the small pick gets the deep ring, the auto chunk the shallow one: a smaller chunk needs more
        assert 0 < p.small_chunk < p.auto_chunk
        small, auto = eng.layout(p.small_chunk), eng.layout(p.auto_chunk)
        assert small.ring_slots > auto.ring_slots == p.auto_ring_slots
        assert small.slots_needed > auto.slots_needed == p.auto_loan_slots
        # layout(T) is what its parts say, and its buffers grow with T
        for t in (1, 256, 2048, 4096):
            lay = eng.layout(t)
            assert lay.slots_needed == -(-lay.buffer_bytes // p.slot_bytes) + lay.ring_slots
        assert eng.layout(2048).buffer_bytes < eng.layout(4096).buffer_bytes


def test_default_budget_holds_every_expert(tiny: Path) -> None:
    with Engine(tiny, EngineConfig(threads=1)) as eng:
        p = eng.plan
        assert p.n_slots >= p.n_experts_total + p.auto_loan_slots
        assert (eng.residency() >= 0).all()
        assert p.auto_chunk == p.max_context  # the largest chunk is affordable


# ---- the loan --------------------------------------------------------------------------------------


@pytest.mark.asan
def test_legacy_fails_below_the_auto_chunk_and_the_engine_stays_usable(tiny: Path) -> None:
    eng, lines = open_traced(tiny, expert_cache=str(LEGACY_CACHE), lend_policy="legacy")
    with eng:
        p = eng.plan
        t = predict(eng, 2000).chunk
        assert t == 2048 < p.auto_chunk and t <= p.small_chunk
        assert eng.layout(t).slots_needed > p.auto_loan_slots  # the bug's precondition
        before = eng.residency()
        lines.clear()
        with pytest.raises(LendError) as ei:
            eng.prefill(prompt(2000))
        m = LEND_MSG.match(str(ei.value))
        assert m, str(ei.value)
        assert int(m.group(1)) == 2048
        free, total, taken, wanted = map(float, m.group(2, 3, 4, 5))
        assert total == pytest.approx(p.auto_loan_slots * p.slot_bytes / 2**20, abs=0.06)
        assert taken + free == pytest.approx(total, abs=0.11) and wanted > free
        assert predict(eng, 2000).verdict == "lend failed"
        # the loan was given back: same residency, nothing in the context, nothing lent
        assert f"lent {p.auto_loan_slots} slots for 2048 tokens" in lines
        assert any(ln.startswith(f"refilled {p.auto_loan_slots} slots") for ln in lines)
        assert (eng.residency() == before).all()
        assert eng.n_past == 0 and eng.stats().slots_lent_now == 0
        # and it keeps serving: a prompt at the auto chunk's size class works
        eng.prefill(prompt(300, seed=1))
        assert eng.n_past == 300


def test_current_serves_the_same_request_with_its_own_layout(tiny: Path) -> None:
    eng, lines = open_traced(tiny, expert_cache=str(LEGACY_CACHE))
    with eng:
        before = eng.residency()
        lines.clear()
        eng.prefill(prompt(2000))
        need = eng.layout(2048).slots_needed
        assert f"lent {need} slots for 2048 tokens" in lines
        assert need <= eng.plan.max_lend_slots and need > eng.plan.auto_loan_slots
        st = eng.stats()
        assert (st.last_chunk, st.last_loan_slots, st.halvings, st.refills) == (2048, need, 0, 1)
        assert not any(HALVED.match(ln) for ln in lines)
        assert (eng.residency() == before).all()


@pytest.mark.asan
def test_refill_restores_the_residency_table_exactly(tiny: Path) -> None:
    # a cache smaller than the model: the loan displaces experts, which are streamed, then copied back
    eng, lines = open_traced(tiny, expert_cache="150", miss="copy")
    with eng:
        p = eng.plan
        assert p.n_slots - p.max_lend_slots < p.n_experts_total  # a full loan reaches resident experts
        eng.generate(prompt(40, seed=2), max_tokens=24)  # decode copies misses in: a shuffled table
        for n in (100, 700):
            before = eng.residency()
            eng.kv_reset()
            eng.reset_stats()
            lines.clear()
            eng.prefill(prompt(n, seed=n))
            lent = [LENT.match(ln) for ln in lines if LENT.match(ln)]
            assert len(lent) == 1
            k, t = int(lent[0].group(1)), int(lent[0].group(2))
            # a request's chunk: its length rounded up to 256 tokens, at most the auto chunk
            assert t == min(p.auto_chunk, -(-n // 256) * 256) == predict(eng, n).chunk
            assert k == eng.layout(t).slots_needed
            displaced = int((before >= p.n_slots - k).sum())
            assert displaced > 0
            assert f"refilled {k} slots ({displaced} experts copied back)" in lines
            st = eng.stats()
            assert st.bytes_streamed > 0 and st.refills == 1 and st.slots_lent_now == 0
            assert (eng.residency() == before).all()


# ---- decode ---------------------------------------------------------------------------------------


def test_decode_counts_hits_and_misses(tiny: Path) -> None:
    n_gen = 32
    for miss, cache in (("host", "60"), ("copy", "60"), ("host", "auto")):
        with Engine(tiny, EngineConfig(threads=1, expert_cache=cache, miss=miss, adapt_every=8)) as eng:
            eng.prefill(prompt(64, seed=5))
            eng.reset_stats()
            tok = 7
            for _ in range(n_gen):
                eng.decode(tok)
                tok = int(np.argmax(eng.logits()))
            st = eng.stats()
            info = eng.info
            assert st.lookups == info.n_layer * info.n_expert_used * n_gen
            assert st.hits + st.misses == st.lookups
            if cache == "auto":
                assert st.misses == 0 and st.hits == st.lookups
            else:
                assert st.misses > 0
                if miss == "host":
                    assert st.host_expert_runs == st.misses
                else:  # copied into a victim slot, run there
                    assert st.host_expert_runs == 0 and st.swaps >= st.misses and st.bytes_copied > 0


def test_miss_read_on_the_cpu_is_host(tiny: Path) -> None:
    """--miss read (the device reads a miss from pinned host RAM) is what the CPU backend does for any
    miss: the plan says host, the misses run from host RAM, and the reply is --miss host's."""
    runs = {}
    for miss in ("host", "read"):
        with Engine(tiny, EngineConfig(threads=1, expert_cache="60", miss=miss)) as eng:
            assert eng.plan.miss_policy == 1  # STRATA_MISS_HOST
            eng.prefill(prompt(64, seed=5))
            eng.reset_stats()
            tok, toks = 7, []
            for _ in range(16):
                eng.decode(tok)
                tok = int(np.argmax(eng.logits()))
                toks.append(tok)
            st = eng.stats()
            assert st.misses > 0 and st.host_expert_runs == st.misses and st.bus_reads == 0
            runs[miss] = toks
    assert runs["read"] == runs["host"]


@pytest.mark.asan
def test_profile_save_and_load(tiny: Path, tmp_path: Path) -> None:
    path = tmp_path / "profile.txt"
    with Engine(tiny, EngineConfig(threads=1, expert_cache="64", adapt_every=4)) as eng:
        eng.generate(prompt(32, seed=3), max_tokens=32)
        eng.save_profile(path)
    rows = [tuple(map(float, ln.split())) for ln in path.read_text().splitlines() if not ln.startswith("#")]
    info_layers, info_experts = 4, 32
    assert len(rows) == info_layers * info_experts
    scores = [r[2] for r in rows]
    assert scores == sorted(scores, reverse=True)  # ranked, best first
    top = [(int(r[0]), int(r[1])) for r in rows[:16]]
    with Engine(tiny, EngineConfig(threads=1, expert_cache="16", expert_profile=str(path))) as eng2:
        res = eng2.residency()
        layers, experts = np.nonzero(res >= 0)
        assert sorted(zip(layers.tolist(), experts.tolist(), strict=True)) == sorted(top)
        assert [res[ly, ex] for ly, ex in top] == list(range(16))  # in rank order, slot 0 first


# ---- bad input ------------------------------------------------------------------------------------


@pytest.mark.asan
def test_bad_input_is_a_clear_error_and_the_engine_stays_usable(tiny: Path, tmp_path: Path) -> None:
    with pytest.raises(BudgetError, match=r"missing.*--vram-budget"):
        Engine(tiny, EngineConfig(threads=1, vram_budget=1 << 20))
    with pytest.raises(BudgetError, match=r"context is too long.*--max-context"):
        Engine(tiny, EngineConfig(threads=1, vram_budget=16 << 20, max_context=65536))
    with pytest.raises(
        BudgetError, match=r"--expert-cache 100000 slots.*lower --expert-cache to at most \d+"
    ):
        Engine(tiny, EngineConfig(threads=1, vram_budget=64 << 20, expert_cache="100000"))
    with pytest.raises(ModelFileError, match=r"cannot read .*nope\.txt"):
        Engine(tiny, EngineConfig(threads=1, expert_profile=str(tmp_path / "nope.txt")))
    bad = tmp_path / "bad.txt"
    bad.write_text("0 1 3.0\n2 99 1.0\n")
    with pytest.raises(ModelFileError, match=r"line 2: layer 2 expert 99 is out of range"):
        Engine(tiny, EngineConfig(threads=1, expert_profile=str(bad)))
    # a prompt longer than the context: both numbers, nothing appended, and the engine goes on
    with Engine(tiny, EngineConfig(threads=1, max_context=512)) as eng:
        eng.prefill(prompt(100))
        with pytest.raises(ContextError, match=r"100 tokens already in it \+ 500 new > 512"):
            eng.prefill(prompt(500))
        assert eng.n_past == 100 and eng.stats().slots_lent_now == 0
        eng.prefill(prompt(400))
        assert eng.n_past == 500


def test_every_failure_is_a_strata_error(tiny: Path) -> None:
    with pytest.raises(StrataError):
        Engine(tiny, EngineConfig(threads=1, expert_cache="2"))


@pytest.mark.asan
def test_host_ram_plan_picks_the_chunk_and_names_the_flag(tiny: Path) -> None:
    with Engine(tiny, EngineConfig(threads=1)) as roomy:
        full = roomy.plan
    assert full.auto_chunk == 4096
    lines: list[str] = []
    budget = 1 << 20  # less than a 4096-token chunk borrows on the host
    with Engine(tiny, EngineConfig(threads=1, host_ram_budget=budget), trace=lines.append) as eng:
        p = eng.plan
        assert p.host_avail_bytes == budget
        assert p.host_borrow_bytes <= budget < eng.layout(p.auto_chunk + 256).host_bytes
        assert p.auto_chunk < full.auto_chunk  # the chunk was picked with the host in mind
        assert any("mapped from the file" in ln for ln in lines)  # experts + borrow do not fit: mapped
        eng.prefill(prompt(300))
    with pytest.raises(BudgetError, match=r"host RAM.*--host-ram-budget"):
        Engine(tiny, EngineConfig(threads=1, host_ram_budget=100))


def test_int8_kv_is_close_to_f16_and_identical_across_cache_settings(tiny: Path) -> None:
    toks = prompt(300, seed=9)
    with Engine(tiny, EngineConfig(threads=1, kv="f16")) as e16:
        e16.prefill(toks)
        ref16 = e16.logits()
        kv16 = e16.plan.kv_bytes
    runs = []
    for cache, prefill in (("0", "auto"), ("40", "64"), ("auto", "100")):
        with Engine(tiny, EngineConfig(threads=1, kv="int8", expert_cache=cache, prefill=prefill)) as e8:
            assert e8.plan.kv_bytes < kv16 * 0.6  # 1 byte + 4/32 per value instead of 2
            r = e8.generate(toks, max_tokens=16, stop_at_eos=False)
            e8.kv_reset()
            e8.prefill(toks)
            runs.append((r.tokens, e8.logits()))
    # int8 keys and values (a scale per 32) move the logits a little, not a lot
    assert np.abs(runs[0][1] - ref16).max() < 0.05 * np.abs(ref16).max()
    assert int(np.argmax(runs[0][1])) == int(np.argmax(ref16))
    for toks_i, logits_i in runs[1:]:
        assert toks_i == runs[0][0]
        assert (logits_i.view(np.uint32) == runs[0][1].view(np.uint32)).all()


def test_layout_rejects_an_empty_chunk(tiny: Path) -> None:
    from strata._exceptions import InvalidArgumentError

    with Engine(tiny, EngineConfig(threads=1)) as eng:
        with pytest.raises(InvalidArgumentError, match="at least 1 token"):
            eng.layout(0)
        assert eng.layout(1).slots_needed >= 1


def test_fixed_prefill_is_halved_at_open_until_it_fits(tiny: Path) -> None:
    eng, lines = open_traced(tiny, expert_cache="100", prefill="2048")
    with eng:
        p = eng.plan
        halved = [
            re.match(
                r"^plan: --prefill (\d+) halved to (\d+): it needs (\d+) slots, the cache lends at most (\d+)$",
                ln,
            )
            for ln in lines
            if "halved" in ln
        ]
        assert halved and all(halved)
        steps = [(int(m.group(1)), int(m.group(2))) for m in halved]  # type: ignore[union-attr]
        assert steps[0][0] == 2048 and all(b == a // 2 for a, b in steps)
        assert all(int(m.group(3)) > int(m.group(4)) == p.max_lend_slots for m in halved)  # type: ignore[union-attr]
        assert p.auto_chunk == steps[-1][1] and eng.layout(p.auto_chunk).slots_needed <= p.max_lend_slots
        eng.prefill(prompt(500))  # served in chunks of the halved size
        assert eng.stats().last_chunk == p.auto_chunk


def test_device_bytes_held_stay_within_the_budget(tiny: Path) -> None:
    with Engine(tiny, EngineConfig(threads=1, expert_cache="40", max_context=1024)) as eng:
        p = eng.plan
        before = eng.stats()
        assert 0 < before.device_bytes == before.device_peak_bytes <= p.budget_bytes
        eng.prefill(np.random.default_rng(0).integers(3, 2000, 700).tolist())
        after = eng.stats()
        assert after.device_peak_bytes <= p.budget_bytes
        assert after.device_bytes >= before.device_bytes
