"""compare: rows matched by key, ratios, and gates that fail on a planted regression and pass an equal pair."""

from __future__ import annotations

import copy

import pytest

from strata_bench._compare import compare, parse_gate
from strata_bench._records import RecordWriter
from strata_bench.cli import main


def _rec(test: str, mean: float, cache: str = "64", **extra) -> dict:
    n_prompt = int(test[2:]) if test.startswith("pp") else 0
    n_gen = int(test[2:]) if test.startswith("tg") else 0
    return {
        "target": "strata",
        "model": "tiny.gguf",
        "quant": "Q8_0",
        "test": test,
        "n_prompt": n_prompt,
        "n_gen": n_gen,
        "unit": "t/s",
        "mean": mean,
        "stddev": mean * 0.01,
        "knobs": {"expert_cache": cache, "threads": 2},
        **extra,
    }


OLD = [_rec("pp512", 400.0), _rec("tg128", 30.0), _rec("pp512", 420.0, "128"), _rec("tg128", 33.0, "128")]


def _write(path, records) -> str:
    w = RecordWriter(path)
    for r in records:
        w.append(r)
    return str(path)


def test_gate_syntax() -> None:
    g = parse_gate("tg128:-5%")
    assert (g.field, g.pattern, g.threshold) == ("mean", "tg128", -0.05)
    g = parse_gate("metrics.ttft_ms.p90@short:+10%")
    assert (g.field, g.pattern, g.threshold) == ("metrics.ttft_ms.p90", "short", pytest.approx(0.10))
    with pytest.raises(ValueError, match="TEST:-X%"):
        parse_gate("tg128 down 5")


def test_equal_pair_passes() -> None:
    res = compare(OLD, copy.deepcopy(OLD), gates=[parse_gate("tg128:-5%"), parse_gate("pp*:-5%")])
    assert res.ok, res.failures
    assert res.matched == 4 and res.only_old == 0 and res.only_new == 0
    ratio_col = res.headers.index("new/old")
    assert {row[ratio_col] for row in res.rows} == {"1.000"}


def test_planted_regression_is_flagged() -> None:
    new = copy.deepcopy(OLD)
    new[3]["mean"] = 33.0 * 0.90  # tg128 at cache 128 lost 10%
    res = compare(OLD, new, gates=[parse_gate("tg128:-5%")])
    assert not res.ok
    assert len(res.failures) == 1
    assert "expert_cache=128" in res.failures[0] and "-10.0%" in res.failures[0]
    # a looser gate lets the same change through, and a gate on other tests is not affected
    assert compare(OLD, new, gates=[parse_gate("tg128:-15%")]).ok
    assert compare(OLD, new, gates=[parse_gate("pp512:-5%")]).ok


def test_rise_gate_for_latencies() -> None:
    old = [_rec("short", 20.0, metrics={"ttft_ms": {"p90": 100.0}})]
    new = [_rec("short", 20.0, metrics={"ttft_ms": {"p90": 125.0}})]
    assert not compare(old, new, gates=[parse_gate("metrics.ttft_ms.p90@short:+10%")]).ok
    assert compare(old, new, gates=[parse_gate("metrics.ttft_ms.p90@short:+30%")]).ok


def test_missing_rows_and_gates_that_match_nothing() -> None:
    res = compare(OLD, OLD[:3], gates=[parse_gate("tg128:-5%")])
    assert res.only_old == 1 and not res.ok and "missing in NEW" in res.failures[0]
    res = compare(OLD, OLD, gates=[parse_gate("tg512:-5%")])
    assert not res.ok and "matches no test" in res.failures[0]


def test_key_declares_what_a_row_is() -> None:
    # keyed without the knobs, the two cache sizes collapse to one row each (the last one of each file counts)
    res = compare(OLD, OLD, key=["target", "model", "test"])
    assert res.matched == 2


def test_cli_exit_codes(tmp_path, capsys) -> None:
    old = _write(tmp_path / "old.jsonl", OLD)
    same = _write(tmp_path / "same.jsonl", OLD)
    worse = copy.deepcopy(OLD)
    worse[1]["mean"] = 25.0
    bad = _write(tmp_path / "bad.jsonl", worse)
    assert main(["compare", old, same, "--fail-if", "tg128:-5%"]) == 0
    assert "all gates passed" in capsys.readouterr().out
    assert main(["compare", old, bad, "--fail-if", "tg128:-5%", "--format", "md"]) == 1
    out = capsys.readouterr().out
    assert "FAIL tg128:-5%" in out and "-16.7%" in out
    assert main(["compare", old, str(tmp_path / "nope.jsonl")]) == 1
    assert "no such records file" in capsys.readouterr().err


def test_a_knob_only_one_side_has_leaves_the_key() -> None:
    new = copy.deepcopy(OLD)
    for r in new:
        r["knobs"]["prefetch"] = "on"  # a knob added after OLD was recorded
    res = compare(OLD, new, gates=[parse_gate("tg128:-5%")])
    assert res.ok and res.matched == 4
    assert res.ignored_fields == ["knobs.prefetch"]


def test_a_configuration_that_failed_in_new_fails_its_gate() -> None:
    new = copy.deepcopy(OLD)
    new[3].update(mean=None, stddev=None, status="failed", error={"phase": "open", "message": "no device"})
    res = compare(OLD, new, gates=[parse_gate("tg128:-5%")])
    assert res.matched == 4
    assert len(res.failures) == 1 and "expert_cache=128" in res.failures[0] and "no mean" in res.failures[0]
    assert [row[-1] for row in res.rows if row[-1].startswith("FAIL")] == ["FAIL (no value)"]
