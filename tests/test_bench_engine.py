"""The strata target on the tiny model: a grid of knobs gives the expected rows and columns, the
counters describe the timed part, an interrupted run keeps its rows, and strata and llama.cpp
share one table with their ratio."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from strata_bench.cli import main

FAKE = Path(__file__).parent / "bench_support" / "fake_llama_bench.py"


def _sigint_default() -> None:
    """In the child before exec: SIGINT back to its default. A runner that starts the tests in the background
    of a non-interactive shell has SIGINT ignored, the child would inherit that, and Python installs no
    KeyboardInterrupt handler where SIGINT is ignored at start."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def bench(cmd: str) -> int:
    return main(cmd.split())


def _rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_grid_rows_and_columns(tiny, tmp_path, capsys) -> None:
    import gguf

    r = gguf.GGUFReader(str(tiny))
    n_layer = int(r.get_field("qwen3moe.block_count").contents())
    k_used = int(r.get_field("qwen3moe.expert_used_count").contents())

    out = tmp_path / "grid.jsonl"
    rc = bench(
        f"run --model {tiny} -p 16,32 -n 8 -r 5 --threads 1 --expert-cache 32,96 --output {out} --format md"
    )
    assert rc == 0
    rows = _rows(out)
    # two configurations (the grid) x three tests, in llama-bench's order within each configuration
    assert [(r["knobs"]["expert_cache"], r["test"]) for r in rows] == [
        ("32", "pp16"),
        ("32", "pp32"),
        ("32", "tg8"),
        ("96", "pp16"),
        ("96", "pp32"),
        ("96", "tg8"),
    ]
    for r in rows:
        assert r["target"] == "strata" and r["model"] == tiny.name and r["quant"]
        assert r["repetitions"] == 5 and len(r["samples"]) == 5 and len(r["samples_ns"]) == 5
        n_tok = r["n_prompt"] or r["n_gen"]
        # t/s of each sample is tokens over its own time
        assert r["samples"] == pytest.approx([n_tok * 1e9 / ns for ns in r["samples_ns"]])
        assert r["mean"] == pytest.approx(sum(r["samples"]) / 5) and r["stddev"] >= 0
        assert r["knobs"]["threads"] == 1 and r["plan"]["n_slots"] == int(r["knobs"]["expert_cache"])
        # every setting of the harness that changes the work, the effective context included (the longest test)
        assert r["work"] == {"n_prompt": r["n_prompt"], "n_gen": r["n_gen"], "n_depth": 0,
                             "prompt_set": "uniform-ids/2", "seed": 0, "warmup": 1, "max_context": 32,
                             "threads": 1}  # fmt: skip
        assert r["plan"]["max_context"] >= 32
        m = r["metrics"]
        assert 0.0 <= m["hit_rate"] <= 1.0 and m["gbps"] > 0
        if r["n_gen"]:
            # each decoded token looks up K experts in every layer, and only the timed tokens count
            assert m["lookups"] == n_layer * k_used * r["n_gen"]
        else:
            # a request chunk is the prompt length rounded up to 256 tokens, capped by the auto chunk
            assert m["chunk"] and m["chunk"] <= -(-r["n_prompt"] // 256) * 256
    md = capsys.readouterr().out
    speed = md.split("**engine")[0]
    header = next(line for line in speed.splitlines() if line.startswith("| target"))
    assert [c.strip() for c in header.strip("|").split("|")] == [
        "target",
        "quant",
        "expert_cache",
        "pp16",
        "pp32",
        "tg8",
    ]
    assert sum(1 for line in speed.splitlines() if line.startswith("| strata ")) == 2
    assert "hit rate" in md and "GB/s" in md


def test_strata_and_llama_cpp_with_ratio(tiny, tmp_path, monkeypatch, capsys) -> None:
    d = tmp_path / "bin"
    d.mkdir()
    (d / "llama-bench").write_text(f"#!{sys.executable}\n" + FAKE.read_text())
    (d / "llama-bench").chmod(0o755)
    monkeypatch.setenv("PATH", f"{d}{os.pathsep}{os.environ['PATH']}")
    out = tmp_path / "both.jsonl"
    cmd = f"run --target strata --target llama.cpp --model {tiny} -p 32 -n 8 -r 5 --threads 1 --output {out} --format md"
    assert bench(cmd) == 0
    rows = _rows(out)
    by = {(r["target"], r["test"]): r["mean"] for r in rows}
    assert set(by) == {("strata", "pp32"), ("strata", "tg8"), ("llama.cpp", "pp32"), ("llama.cpp", "tg8")}
    md = capsys.readouterr().out
    ratio = next(line for line in md.splitlines() if line.startswith("| strata / llama.cpp"))
    cells = [c.strip() for c in ratio.strip("|").split("|")]
    assert cells[-2:] == [
        f"{by['strata', 'pp32'] / by['llama.cpp', 'pp32']:.2f}x",
        f"{by['strata', 'tg8'] / by['llama.cpp', 'tg8']:.2f}x",
    ]


def test_sigint_keeps_finished_engine_rows(tiny, tmp_path) -> None:
    out = tmp_path / "r.jsonl"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "strata_bench.cli",
            "run",
            "--model",
            str(tiny),
            "-p",
            "16",
            "-n",
            "1024",  # tiny decodes at ~24k t/s: short rows let a starved test see the grid already done
            "-r",
            "5",
            "--threads",
            "1",
            "--expert-cache",
            "16,32,48,64,80,96,112,128",
            "--output",
            str(out),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        preexec_fn=_sigint_default,
    )
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and proc.poll() is None:
            if out.exists() and len(out.read_text().splitlines()) >= 1:
                break
            time.sleep(0.02)
        assert proc.poll() is None, "the run ended before it could be interrupted"
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, err
    rows = _rows(out)
    assert 1 <= len(rows) < 16
    assert all(len(r["samples"]) == 5 for r in rows)
    assert f"{len(rows)} finished rows kept" in err


def test_a_failing_configuration_is_a_row_and_the_grid_goes_on(tiny, tmp_path, capsys) -> None:
    out = tmp_path / "r.jsonl"
    # 64 KiB cannot hold even the resident weights: the middle configuration fails when it opens,
    # and the one after it is still measured
    rc = bench(
        f"run --model {tiny} -p 16 -n 4 -r 5 --vram-budget 256MiB,64KiB,128MiB --output {out} --format md"
    )
    assert rc == 1
    cap = capsys.readouterr()
    rows = _rows(out)
    assert [(r["knobs"]["vram_budget"], r["test"], r["status"]) for r in rows] == [
        (256 << 20, "pp16", "ok"),
        (256 << 20, "tg4", "ok"),
        (64 << 10, "pp16", "failed"),
        (64 << 10, "tg4", "failed"),
        (128 << 20, "pp16", "ok"),
        (128 << 20, "tg4", "ok"),
    ]
    for r in rows[2:4]:
        e = r["error"]
        # the engine's own words (what is missing and the flag to change), where, and every knob
        assert e["phase"] == "open" and e["type"] == "BudgetError" and e["status"] == 6
        assert "--vram-budget" in e["message"] and e["flags"] == "--vram-budget 64KiB"
        assert r["knobs"]["threads"] is None and r["knobs"]["expert_cache"] == "auto" and r["samples"] == []
        assert r["mean"] is None  # no figure for what was not measured
    assert all(len(r["samples"]) == 5 for r in rows if r["status"] == "ok")
    # each list element reached the engine: its plan is made for that budget
    assert [r["plan"]["budget_bytes"] for r in rows if r["status"] == "ok"] == [256 << 20] * 2 + [
        128 << 20
    ] * 2
    md = cap.out
    speed = md.split("**engine")[0]
    assert [line.split("|")[3].strip() for line in speed.splitlines() if line.startswith("| strata ")] == [
        "256MiB",
        "64KiB",
        "128MiB",
    ]
    failed_line = next(line for line in speed.splitlines() if "64KiB" in line)
    assert failed_line.count("failed") == 2
    assert "**failed" in md and "BudgetError" not in md.split("**failed")[0]
    # the end of the run names the failed configuration and what the engine said
    assert "1 configuration(s)" in cap.err
    summary = cap.err.split("configuration(s)")[1]
    assert "--vram-budget 64KiB [pp16, tg4]" in summary and rows[2]["error"]["message"] in summary


def test_a_failing_test_keeps_the_engine_for_the_next(tiny, tmp_path, capsys) -> None:
    # lend_policy=legacy cannot lend a 2048-token chunk its slots at 5000 cached experts (tiny, context 4096);
    # the engine stays usable, so the shorter prompt and the decode of that configuration are still measured
    out = tmp_path / "r.jsonl"
    rc = bench(
        f"run --model {tiny} -p 2048,16 -n 4 -r 5 --threads 1 --max-context 4096 --lend-policy legacy "
        f"--expert-cache 5000 --output {out}"
    )
    assert rc == 1
    rows = _rows(out)
    assert [(r["test"], r["status"]) for r in rows] == [("pp2048", "failed"), ("pp16", "ok"), ("tg4", "ok")]
    e = rows[0]["error"]
    assert e["type"] == "LendError" and e["phase"] == "pp2048, warm-up 1 of 1"
    assert "lending the prompt path its slots failed" in e["message"]
    assert rows[0]["plan"]["n_slots"] == 5000  # the engine had opened: its plan is in the row
    assert "[pp2048]" in capsys.readouterr().err
