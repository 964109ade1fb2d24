"""The llama.cpp target: llama-bench's JSONL read into records (a stand-in that prints its real format,
and the real llama-bench when one is on PATH), a run interrupted with SIGINT, a missing binary."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from strata_bench.cli import main

FAKE = Path(__file__).parent / "bench_support" / "fake_llama_bench.py"


def bench(cmd: str) -> int:
    return main(cmd.split())


@pytest.fixture
def fake_bin(tmp_path, monkeypatch) -> Path:
    """A folder on PATH holding an executable `llama-bench` that is the stand-in."""
    d = tmp_path / "bin"
    d.mkdir()
    exe = d / "llama-bench"
    exe.write_text(f"#!{sys.executable}\n" + FAKE.read_text())
    exe.chmod(0o755)
    monkeypatch.setenv("PATH", f"{d}{os.pathsep}{os.environ['PATH']}")
    return d


@pytest.fixture(scope="module")
def model_file() -> Path:
    from strata.model import ensure_model

    return Path(ensure_model(preset="tiny", seed=0))


def _rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_rows_from_llama_bench_jsonl(fake_bin, model_file, tmp_path, capsys) -> None:
    out = tmp_path / "r.jsonl"
    rc = bench(
        f"run --target llama.cpp --model {model_file} -p 64,128 -n 16 -d 0,256 -r 5 --threads 2 "
        f"--output {out} --format md"
    )
    assert rc == 0
    rows = _rows(out)
    # llama-bench's order: for each depth, the prompt tests and then the generation tests
    assert [r["test"] for r in rows] == [
        "pp64",
        "pp128",
        "tg16",
        "pp64 @ d256",
        "pp128 @ d256",
        "tg16 @ d256",
    ]
    for r in rows:
        assert r["target"] == "llama.cpp" and r["unit"] == "t/s"
        assert len(r["samples"]) == 5 and r["repetitions"] == 5
        assert r["mean"] == pytest.approx(sum(r["samples"]) / 5)
        assert r["peer"]["avg_ts"] == pytest.approx(r["mean"])  # our summary agrees with llama-bench's own
        assert r["peer"]["n_threads"] == 2 and r["peer"]["n_gpu_layers"] == 0  # the flags were passed through
        assert r["knobs"] == {"threads": 2, "device": "cpu", "kv": "f16"}
        assert r["model"] == model_file.name and r["quant"]
    # the stand-in's speeds: 900 t/s for prompts and 40 for generation, divided by 1 + depth/4096
    by = {r["test"]: r["mean"] for r in rows}
    assert by["pp64"] == pytest.approx(900, rel=0.02)
    assert by["tg16 @ d256"] == pytest.approx(40 / (1 + 256 / 4096), rel=0.02)
    md = capsys.readouterr().out
    assert "| llama.cpp" in md and "pp128 @ d256" in md


def test_one_llama_bench_run_per_shared_knob_set(fake_bin, model_file, tmp_path) -> None:
    out = tmp_path / "r.jsonl"
    # --expert-cache means nothing to llama.cpp: two strata configs, one llama-bench run; --threads 1,2: two runs
    rc = bench(
        f"run --target llama.cpp --model {model_file} -p 32 -n 0 -r 5 --expert-cache 4,8 --threads 1,2 "
        f"--output {out} --format csv"
    )
    assert rc == 0
    assert sorted(r["knobs"]["threads"] for r in _rows(out)) == [1, 2]


def test_missing_llama_bench_is_a_clear_error(model_file, tmp_path, monkeypatch, capsys) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    assert bench(f"run --target llama.cpp --model {model_file} --output {tmp_path / 'r.jsonl'}") == 1
    err = capsys.readouterr().err
    assert "none is on PATH" in err and "--llama-bench PATH" in err
    cmd = f"run --target llama.cpp --llama-bench {tmp_path / 'nope'} --model {model_file} --output {tmp_path / 'r.jsonl'}"
    assert bench(cmd) == 1
    assert "not an executable" in capsys.readouterr().err


def test_failing_llama_bench_keeps_finished_rows(fake_bin, model_file, tmp_path, monkeypatch, capsys) -> None:
    monkeypatch.setenv("FAKE_LLAMA_BENCH_FAIL", "2")
    out = tmp_path / "r.jsonl"
    assert bench(f"run --target llama.cpp --model {model_file} -p 16,32,64 -n 8 -r 5 --output {out}") == 1
    err = capsys.readouterr().err
    assert "exited with status 1" in err and "failed to create context" in err
    # the finished rows are kept, the tests llama-bench did not finish are failed rows with its words
    rows = _rows(out)
    assert [(r["test"], r["status"]) for r in rows] == [
        ("pp16", "ok"),
        ("pp32", "ok"),
        ("pp64", "failed"),
        ("tg8", "failed"),
    ]
    assert all("failed to create context" in r["error"]["message"] for r in rows[2:])


def test_sigint_keeps_finished_rows(fake_bin, model_file, tmp_path) -> None:
    out = tmp_path / "r.jsonl"
    env = {**os.environ, "FAKE_LLAMA_BENCH_DELAY": "0.4"}
    cmd = f"run --target llama.cpp --model {model_file} -p 16,32,64,128,256 -n 8,16,32 -r 5 --output {out}"
    proc = subprocess.Popen(
        [sys.executable, "-m", "strata_bench.cli", *cmd.split()],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if out.exists() and len(out.read_text().splitlines()) >= 2:
                break
            time.sleep(0.05)
        else:
            pytest.fail("no rows were written")
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130
    rows = _rows(out)  # every line is a whole JSON record
    assert 2 <= len(rows) < 8
    assert [r["test"] for r in rows] == ["pp16", "pp32", "pp64", "pp128", "pp256", "tg8", "tg16"][: len(rows)]
    assert f"{len(rows)} finished rows kept in {out}" in err


@pytest.mark.skipif(shutil.which("llama-bench") is None, reason="no llama-bench on PATH")
def test_real_llama_bench(model_file, tmp_path) -> None:
    out = tmp_path / "r.jsonl"
    assert (
        bench(f"run --target llama.cpp --model {model_file} -p 32 -n 8 -r 5 --threads 2 --output {out}") == 0
    )
    rows = _rows(out)
    assert [r["test"] for r in rows] == ["pp32", "tg8"]
    for r in rows:
        assert len(r["samples"]) == 5 and all(x > 0 for x in r["samples"])
        assert r["peer"]["n_threads"] == 2 and r["peer"]["build_commit"]
