"""compare: rows paired by a key that holds every setting of the work, changes judged against the noise of
the raw samples (a seeded bootstrap of the median), gates that pass two noisy runs of one build and fail a
real slowdown."""

from __future__ import annotations

import copy

import numpy as np
import pytest

from strata_bench._compare import compare, parse_assume, parse_gate
from strata_bench._records import RecordWriter, work_of
from strata_bench._stats import bootstrap_change
from strata_bench.cli import main

# five repetitions of one decode test of one build, back to back: tight, but the second run had two
# repetitions that shared the machine with something else
STEADY = [201.3, 198.7, 203.9, 199.5, 202.2]
NOISY = [204.1, 62.0, 199.0, 55.1, 200.6]  # the same build: its mean is 28% lower, its median is not
SLOWER = [round(x * 0.70, 2) for x in (200.4, 199.1, 202.8, 198.2, 201.5)]  # a real 30% slowdown


def _rec(test: str, samples: list[float], cache: str = "64", **extra) -> dict:
    n_prompt = int(test[2:]) if test.startswith("pp") else 0
    n_gen = int(test[2:]) if test.startswith("tg") else 0
    a = np.asarray(samples, dtype=float)
    rec = {
        "target": "strata",
        "model": "tiny.gguf",
        "quant": "Q8_0",
        "test": test,
        "n_prompt": n_prompt,
        "n_gen": n_gen,
        "unit": "t/s",
        "samples": list(samples),
        "mean": float(a.mean()),
        "median": float(np.median(a)),
        "stddev": float(a.std(ddof=1)),
        "knobs": {"expert_cache": cache, "threads": 2},
        "work": {"n_prompt": n_prompt, "n_gen": n_gen, "n_depth": 0, "seed": 0, "max_context": 4096},
    }
    rec.update(extra)
    return rec


def _scaled(xs: list[float], f: float) -> list[float]:
    return [x * f for x in xs]


PP = [401.0, 398.5, 404.2, 399.9, 402.7]
OLD = [
    _rec("pp512", PP),
    _rec("tg128", STEADY),
    _rec("pp512", _scaled(PP, 1.05), "128"),
    _rec("tg128", _scaled(STEADY, 1.1), "128"),
]


def _write(path, records) -> str:
    w = RecordWriter(path)
    for r in records:
        w.append(r)
    return str(path)


def _verdicts(res) -> list[str]:
    return [row[-1] for row in res.rows]


def test_gate_syntax() -> None:
    g = parse_gate("tg128:-5%")
    assert (g.field, g.pattern, g.threshold) == ("median", "tg128", -0.05)
    assert str(g) == "tg128:-5%"
    g = parse_gate("metrics.ttft_ms.p90@short:+10%")
    assert (g.field, g.pattern, g.threshold) == ("metrics.ttft_ms.p90", "short", pytest.approx(0.10))
    with pytest.raises(ValueError, match="TEST:-X%"):
        parse_gate("tg128 down 5")
    assert parse_assume("work.max_tokens=64") == ("work.max_tokens", "64")
    with pytest.raises(ValueError, match="FIELD=VALUE"):
        parse_assume("work.max_tokens")


def test_bootstrap_interval() -> None:
    # a real 30% slowdown with tight samples: the interval is narrow, around -30%, and holds no 0
    c = bootstrap_change(STEADY, SLOWER)
    assert c.significant and c.change == pytest.approx(np.median(SLOWER) / np.median(STEADY) - 1)
    assert -0.33 < c.lo < c.change < c.hi < -0.27
    # seeded: the same samples give the same interval; another seed gives a close one
    assert bootstrap_change(STEADY, SLOWER) == c
    other = bootstrap_change(STEADY, SLOWER, seed=1)
    assert other.lo == pytest.approx(c.lo, abs=0.01) and other.hi == pytest.approx(c.hi, abs=0.01)
    # two runs of one build, one with two slow repetitions: the means differ by 28%, the interval holds 0
    c = bootstrap_change(STEADY, NOISY)
    assert np.mean(NOISY) / np.mean(STEADY) - 1 < -0.27
    assert not c.significant and c.lo < -0.5 and c.hi > 0
    # many samples of one distribution shifted by 10%: the interval holds the shift and is narrow
    rng = np.random.default_rng(7)
    base = rng.normal(100, 2, 400)
    c = bootstrap_change(base, rng.normal(90, 2, 400))
    assert c.lo < -0.1 < c.hi and c.hi - c.lo < 0.02
    with pytest.raises(ValueError, match="at least 3 on each side"):
        bootstrap_change([1.0, 2.0], STEADY)


def test_equal_pair_passes() -> None:
    res = compare(OLD, copy.deepcopy(OLD), gates=[parse_gate("tg128:-5%"), parse_gate("pp*:-5%")])
    assert res.ok, res.failures
    assert res.matched == 4 and res.only_old == 0 and res.only_new == 0
    assert {row[res.headers.index("change")] for row in res.rows} == {"+0.0%"}
    assert set(_verdicts(res)) == {"no significant change"}


def test_two_runs_of_one_build_are_no_significant_change() -> None:
    """The complaint: a -5% gate on the mean failed two identical back-to-back runs (-28%)."""
    new = copy.deepcopy(OLD)
    new[1] = _rec("tg128", NOISY)
    assert new[1]["mean"] / OLD[1]["mean"] - 1 < -0.27
    res = compare(OLD, new, gates=[parse_gate("tg128:-5%")])
    assert res.ok, res.failures
    row = res.rows[1]
    assert row[-1] == "no significant change (noise exceeds the gate)"
    lo, hi = (float(x.strip("[]%")) for x in row[res.headers.index("95% interval")].split(", "))
    assert lo < -5 < 0 < hi  # the noise is larger than the gate
    # a gate judged on the mean sees the same noise and says so; without a gate the change is still judged
    res = compare(OLD, new, gates=[parse_gate("mean@tg128:-5%")])
    assert res.ok and res.rows[1][-1] == "no significant change (noise exceeds the gate)"
    assert compare(OLD, new).rows[1][-1] == "no significant change"


def test_a_real_slowdown_is_flagged() -> None:
    new = copy.deepcopy(OLD)
    new[3] = _rec("tg128", _scaled(SLOWER, 1.1), "128")  # tg128 at cache 128 lost 30%, tight samples
    res = compare(OLD, new, gates=[parse_gate("tg128:-5%")])
    assert not res.ok and len(res.failures) == 1
    f = res.failures[0]
    assert "expert_cache=128" in f and "median 221.4 -> 154.3 (-30.3%, interval [-31." in f
    assert _verdicts(res) == [
        "no significant change",
        "no significant change",
        "no significant change",
        "FAIL",
    ]
    # a looser gate lets the same change through (significant, within the gate), and other tests are unaffected
    res = compare(OLD, new, gates=[parse_gate("tg128:-35%")])
    assert res.ok and res.rows[3][-1] == "ok (within the gate)"
    assert compare(OLD, new, gates=[parse_gate("pp512:-5%")]).ok
    # without gates the change is still judged
    assert compare(OLD, new).rows[3][-1] == "slower"


def test_too_few_samples_cannot_pass_a_gate() -> None:
    new = copy.deepcopy(OLD)
    new[1] = _rec("tg128", STEADY[:2])
    res = compare(OLD, new, gates=[parse_gate("tg128:-5%")])
    assert (
        not res.ok and "at least 3 on each side" in res.failures[0] and "-r/--repetitions" in res.failures[0]
    )


def _server(ttft: list[float], max_tokens: int = 8, **work) -> dict:
    rec = _rec("short", [20.0 + i % 3 for i in range(len(ttft))], kind="server", unit="tok/s")
    rec["work"] = {"max_tokens": max_tokens, "requests": len(ttft), "seed": 0, "prompt_set": "v1",
                   "max_concurrency": 1, "request_rate": None, **work}  # fmt: skip
    rec["requests"] = [{"ttft_ms": t, "e2e_ms": t + 100} for t in ttft]
    rec["metrics"] = {"ttft_ms": {"p90": float(np.percentile(ttft, 90))}}
    return rec


def test_rise_gate_for_latencies_over_the_requests() -> None:
    ttft = [100.0, 101.0, 99.0, 102.0, 98.0, 100.5, 99.5, 101.5]
    old, slow = [_server(ttft)], [_server(_scaled(ttft, 1.25))]
    assert not compare(old, slow, gates=[parse_gate("metrics.ttft_ms.p90@short:+10%")]).ok
    assert compare(old, slow, gates=[parse_gate("metrics.ttft_ms.p90@short:+30%")]).ok
    # a field with one value per run is judged on that value, and the verdict says so
    res = compare(old, slow, gates=[parse_gate("metrics.ttft_ms.p90@short:+10%")], key=("target", "test"))
    assert not res.ok
    old[0].pop("requests"), slow[0].pop("requests")
    res = compare(old, slow, gates=[parse_gate("metrics.ttft_ms.p90@short:+10%")])
    assert res.rows[0][-1] == "FAIL (one value)" and "no samples to judge noise by" in res.failures[0]


def test_missing_rows_and_gates_that_match_nothing() -> None:
    res = compare(OLD, OLD[:3], gates=[parse_gate("tg128:-5%")])
    assert res.only_old == 1 and not res.ok and "missing in NEW" in res.failures[0]
    res = compare(OLD, OLD, gates=[parse_gate("tg512:-5%")])
    assert not res.ok and "matches no test" in res.failures[0]


def test_key_declares_what_a_row_is() -> None:
    # keyed without the knobs, the two cache sizes collapse to one row each (the last one of each file counts)
    res = compare(OLD, OLD, key=["target", "model", "test"])
    assert res.matched == 2


def test_runs_of_different_max_tokens_are_not_paired() -> None:
    """Server rows of 8 and 16 generated tokens are different work, however alike their names."""
    ttft = [100.0, 101.0, 99.0, 102.0]
    res = compare([_server(ttft, 8)], [_server(ttft, 16)], gates=[parse_gate("short:-5%")])
    assert res.matched == 0 and res.only_old == 1 and res.only_new == 1
    assert not res.ok and "missing in NEW" in res.failures[0]
    assert "work.max_tokens" in res.headers
    # concurrency is part of the work too
    res = compare([_server(ttft, max_concurrency=1)], [_server(ttft, max_concurrency=4)])
    assert res.matched == 0


def test_old_records_without_a_field_are_not_paired_silently(tmp_path, capsys) -> None:
    # a server row written before `work` existed: its n_gen was its max tokens, and that is all it said
    legacy = _server([100.0, 101.0, 99.0, 102.0])
    legacy.pop("work")
    legacy["n_gen"] = 8
    assert work_of(legacy) == {"max_tokens": 8}
    new = _server([100.0, 101.0, 99.0, 102.0])
    res = compare([legacy], [new])
    assert res.matched == 0
    lacking = {n.split(" lack ")[1].split(" ")[0] for n in res.notes}
    assert lacking == {"work.max_concurrency", "work.prompt_set", "work.requests", "work.seed"}
    assert all("--assume" in n for n in res.notes)
    # a knob added after OLD was recorded: not paired, with a note that says how to pair them
    added = copy.deepcopy(OLD)
    for r in added:
        r["knobs"]["prefetch"] = "on"
    res = compare(OLD, added, gates=[parse_gate("tg128:-5%")])
    assert res.matched == 0 and not res.ok
    assert res.notes == [
        "rows of OLD lack knobs.prefetch (the other side has on): they are not paired; if OLD was measured "
        "with a known value, pair them with --assume knobs.prefetch=VALUE"
    ]
    # said so, they pair; or the field leaves the key
    assert compare(OLD, added, gates=[parse_gate("tg128:-5%")], assume={"prefetch": "on"}).matched == 4
    assert compare(OLD, added, ignore=["knobs.prefetch"]).matched == 4
    old, new_path = _write(tmp_path / "old.jsonl", OLD), _write(tmp_path / "new.jsonl", added)
    assert main(["compare", old, new_path, "--fail-if", "tg128:-5%"]) == 1
    out = capsys.readouterr().out
    assert "0 rows matched" in out and "note: rows of OLD lack knobs.prefetch" in out
    assert main(["compare", old, new_path, "--fail-if", "tg128:-5%", "--assume", "knobs.prefetch=on"]) == 0
    assert main(["compare", old, new_path, "--assume", "nope=1"]) == 1
    assert "not a key field" in capsys.readouterr().err


def test_cli_exit_codes(tmp_path, capsys) -> None:
    old = _write(tmp_path / "old.jsonl", OLD)
    noisy = copy.deepcopy(OLD)
    noisy[1] = _rec("tg128", NOISY)
    same = _write(tmp_path / "same.jsonl", noisy)
    worse = copy.deepcopy(OLD)
    worse[1] = _rec("tg128", SLOWER)
    bad = _write(tmp_path / "bad.jsonl", worse)
    assert main(["compare", old, same, "--fail-if", "tg128:-5%", "--format", "md"]) == 0
    out = capsys.readouterr().out
    assert "all gates passed" in out and "no significant change" in out
    assert main(["compare", old, bad, "--fail-if", "tg128:-5%", "--format", "md"]) == 1
    out = capsys.readouterr().out
    assert "FAIL tg128:-5%" in out and "-30." in out and "| FAIL" in out
    assert main(["compare", old, str(tmp_path / "nope.jsonl")]) == 1
    assert "no such records file" in capsys.readouterr().err


def test_a_configuration_that_failed_in_new_fails_its_gate() -> None:
    new = copy.deepcopy(OLD)
    new[3].update(mean=None, median=None, stddev=None, samples=[], status="failed",
                  error={"phase": "open", "message": "no device"})  # fmt: skip
    res = compare(OLD, new, gates=[parse_gate("tg128:-5%")])
    assert res.matched == 4
    assert len(res.failures) == 1 and "expert_cache=128" in res.failures[0] and "no device" in res.failures[0]
    assert [v for v in _verdicts(res) if v.startswith("FAIL")] == ["FAIL (failed)"]
