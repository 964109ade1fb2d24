"""Records: summaries, JSONL that survives a torn line, flat rows, CSV and Markdown tables."""

from __future__ import annotations

import csv
import io
import json

import numpy as np
import pytest

from strata_bench._records import (
    RecordWriter,
    base_record,
    flatten,
    git_state,
    llama_test_name,
    read_records,
    summarize,
    to_csv,
    to_markdown,
)


def test_test_names_follow_llama_bench() -> None:
    assert llama_test_name(512, 0) == "pp512"
    assert llama_test_name(0, 128) == "tg128"
    assert llama_test_name(512, 0, 4096) == "pp512 @ d4096"
    assert llama_test_name(0, 128, 4096) == "tg128 @ d4096"


def test_summary_matches_numpy() -> None:
    xs = [10.0, 12.5, 11.0, 9.5, 13.0]
    s = summarize(xs)
    assert s["mean"] == pytest.approx(np.mean(xs))
    assert s["median"] == pytest.approx(np.median(xs))
    assert s["stddev"] == pytest.approx(np.std(xs, ddof=1))  # sample stddev, as llama-bench reports
    assert (s["min"], s["max"]) == (9.5, 13.0)


def test_record_is_self_describing() -> None:
    rec = base_record(target="strata", test="tg128", knobs={"threads": 2})
    for key in (
        "schema",
        "time_utc",
        "commit",
        "dirty",
        "cpu",
        "n_cpu",
        "gpu",
        "gpu_driver",
        "host",
        "load_avg_1m",
    ):
        assert key in rec
    assert rec["time_utc"].endswith("Z")
    assert rec["commit"] is None or len(rec["commit"]) == 40


def test_commit_given_by_the_sender_wins_over_git(monkeypatch, tmp_path) -> None:
    # a tree copied to another machine with someone else's .git: the sender names the commit
    monkeypatch.setenv("STRATA_BENCH_COMMIT", "0123abcd+dirty")
    assert git_state() == ("0123abcd", True)
    monkeypatch.setenv("STRATA_BENCH_COMMIT", "fedc9876")
    assert git_state(tmp_path) == ("fedc9876", False)
    monkeypatch.delenv("STRATA_BENCH_COMMIT")
    assert git_state(tmp_path) == (None, None)  # not a git tree


def test_writer_appends_and_reader_skips_a_torn_last_line(tmp_path) -> None:
    path = tmp_path / "sub" / "r.jsonl"
    w = RecordWriter(path)
    w.append({"test": "pp512", "mean": 1.0, "bad": float("nan")})
    w.append({"test": "tg128", "mean": 2.0})
    assert [json.loads(x)["test"] for x in path.read_text().splitlines()] == ["pp512", "tg128"]
    with open(path, "a") as f:
        f.write('{"test": "pp4096", "me')  # a run killed in the middle of a write
    recs = read_records(path)
    assert [r["test"] for r in recs] == ["pp512", "tg128"]
    assert recs[0]["bad"] is None  # NaN is written as null, so the file stays valid JSON


def test_reader_rejects_garbage_in_the_middle(tmp_path) -> None:
    path = tmp_path / "r.jsonl"
    path.write_text('{"test": "a"}\nnot json\n{"test": "b"}\n')
    with pytest.raises(ValueError, match=r"r.jsonl:2"):
        read_records(path)
    with pytest.raises(FileNotFoundError, match="strata-bench run"):
        read_records(tmp_path / "missing.jsonl")


def test_flatten_and_csv() -> None:
    recs = [
        {"test": "pp512", "knobs": {"expert_cache": "64", "threads": 2}, "samples": [1.0, 2.0]},
        {"test": "tg128", "knobs": {"expert_cache": "128", "threads": 2}, "metrics": {"hit_rate": 0.5}},
    ]
    assert flatten(recs[1]) == {
        "test": "tg128",
        "knobs.expert_cache": "128",
        "knobs.threads": 2,
        "metrics.hit_rate": 0.5,
    }
    rows = list(csv.DictReader(io.StringIO(to_csv(recs))))
    assert [r["knobs.expert_cache"] for r in rows] == ["64", "128"]
    assert rows[0]["samples"] == "1.0 2.0"
    assert rows[0]["metrics.hit_rate"] == "" and rows[1]["metrics.hit_rate"] == "0.5"


def test_markdown_table_shape() -> None:
    md = to_markdown(["test", "t/s"], [["pp512", "10.00 ± 0.10"], ["tg128", "2.00 ± 0.01"]])
    lines = md.strip().splitlines()
    assert len(lines) == 4
    assert lines[1].startswith("| ---") and lines[1].endswith(": |")  # text left, numbers right
    assert all(line.count("|") == 3 for line in lines)
    assert lines[2].startswith("| pp512")
