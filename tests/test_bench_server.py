"""Server benchmarks: a server that is down is a clear error; against a real `strata serve` on loopback, the
suites produce latency rows at each load (concurrency 1 and 4, a Poisson request rate), through httpx's
asynchronous client; every setting of the work is in the row, so rows of different loads never pair."""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import time

import httpx
import numpy as np
import pytest
from _strata_server import Served

from strata_bench._compare import compare
from strata_bench._server_bench import PROMPT_SET, Load, ServerBenchError, run_suites
from strata_bench.cli import main


def _closed_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()  # nothing listens there now
    return port


def test_server_down_is_a_clear_error(tmp_path, capsys) -> None:
    url = f"http://127.0.0.1:{_closed_port()}"
    with pytest.raises(ServerBenchError, match="cannot reach the server at") as e:
        run_suites(url, ["short"], lambda r: None)
    assert "strata serve" in str(e.value)
    out = tmp_path / "r.jsonl"
    assert main(["serve-bench", "--url", url, "--output", str(out)]) == 1
    err = capsys.readouterr().err
    assert f"cannot reach the server at {url}" in err and "Traceback" not in err
    assert not out.exists() or out.read_text() == ""
    # as one target of `run`, a server that is down is a failed row (the other targets would still run)
    assert main(["run", "--target", f"openai:{url}/v1", "--suite", "short", "--output", str(out)]) == 1
    assert "cannot reach the server" in capsys.readouterr().err
    (row,) = [json.loads(line) for line in out.read_text().splitlines()]
    assert row["status"] == "failed" and row["target"] == "openai" and row["test"] == "short"
    assert row["error"]["message"].startswith(f"cannot reach the server at {url}")


def test_unknown_suite_target_and_load(capsys) -> None:
    with pytest.raises(ValueError, match="not one of short, long, agentic"):
        run_suites("http://127.0.0.1:1", ["medium"], lambda r: None)
    assert main(["run", "--target", "vllm"]) == 1
    assert "use strata, llama.cpp or openai:URL" in capsys.readouterr().err
    for bad in (["--max-concurrency", "0"], ["--max-concurrency", "two"], ["--request-rate", "-1"]):
        with pytest.raises(SystemExit) as e:
            main(["serve-bench", "--url", "http://127.0.0.1:1", *bad])
        assert e.value.code == 2
        err = capsys.readouterr().err
        assert bad[0] in err and "Traceback" not in err
    with pytest.raises(ValueError, match="at least 1 request in flight"):
        Load(0)


@pytest.fixture(scope="module")
def strata_server():  # type: ignore[no-untyped-def]
    """`strata serve` on the tiny model, on a free loopback port."""
    from strata.model import ensure_model

    served = Served(ensure_model(preset="tiny", seed=0))
    try:
        yield served.url
    finally:
        served.stop()


def test_suites_against_a_real_server(strata_server, tmp_path) -> None:
    rows: list[dict] = []
    # a 600-token context caps the long suite's documents at 600 - 8 (reply) - 64 (template) = 528 tokens
    n = run_suites(strata_server, ["short", "long", "agentic"], rows.append, requests=2, max_tokens=8,
                   max_context=600, turns=2)  # fmt: skip
    assert n == 3 and [r["test"] for r in rows] == ["short", "long 528", "agentic"]
    short, long, agentic = rows
    assert short["metrics"]["requests"] == 2 and long["metrics"]["requests"] == 2
    assert agentic["metrics"]["requests"] == 4  # two conversations of two turns
    for r in rows:
        assert r["target"] == "openai" and r["url"] == strata_server and r["server"]["strata"] is True
        assert r["server"]["kind"] == "strata"
        assert r["knobs"]["expert_cache"] == "auto"  # the server's own engine config, from /v1/status
        w = r["work"]
        assert (w["max_tokens"], w["requests"], w["seed"], w["prompt_set"]) == (8, 2, 0, PROMPT_SET)
        assert (w["max_concurrency"], w["request_rate"], w["max_context"]) == (1, None, 600)
        for req in r["requests"]:
            assert 0 < req["ttft_ms"] <= req["e2e_ms"]
            assert 1 <= req["output_tokens"] <= 8
            assert len(req["itl_ms"]) <= req["output_tokens"] - 1 and all(x >= 0 for x in req["itl_ms"])
        m = r["metrics"]
        for name in ("ttft_ms", "e2e_ms"):
            s = m[name]
            assert s["p50"] == s["median"] <= s["p90"] <= s["p99"] and s["n"] == m["requests"]
            assert s["p90"] == pytest.approx(np.percentile([q[name] for q in r["requests"]], 90))
        assert m["throughput_tok_s"] == pytest.approx(m["output_tokens"] / m["wall_s"])
        assert r["mean"] > 0 and len(r["samples"]) == m["requests"]
    assert long["work"]["document_tokens"] == 528 and agentic["work"]["turns"] == 2
    # documents were sized in the server's own tokens: close to the target, never over the context
    for p in long["metrics"]["prompt_tokens"]:
        assert 0.8 * 528 <= p <= 600 - 8
    # the agentic context grows turn by turn (same conversation, more history)
    turns = [req["prompt_tokens"] for req in agentic["requests"]]
    assert turns[1] > turns[0] and turns[3] > turns[2]


def _spans(rec: dict) -> list[tuple[float, float]]:
    return sorted((q["sent_ms"], q["sent_ms"] + q["e2e_ms"]) for q in rec["requests"])


def test_concurrency_one_and_four(strata_server, tmp_path, capsys) -> None:
    """At concurrency 4 four requests are in flight at once (the server queues them); at 1 each is sent after
    the one before it ended. One row per load, each with its percentiles; the loads never pair in compare."""
    out = tmp_path / "load.jsonl"
    cmd = ["serve-bench", "--url", strata_server, "--suite", "short,agentic", "--requests", "8", "--turns", "2",
           "--max-tokens", "4", "--max-concurrency", "1,4", "--output", str(out), "--format", "md"]  # fmt: skip
    assert main(cmd) == 0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [(r["test"], r["work"]["max_concurrency"]) for r in rows] == [
        ("short", 1), ("short", 4), ("agentic", 1), ("agentic", 4)
    ]  # fmt: skip
    one, four = rows[0], rows[1]
    assert one["metrics"]["peak_in_flight"] == 1 and four["metrics"]["peak_in_flight"] == 4
    spans = _spans(one)
    assert all(
        b[0] >= a[1] - 1.0 for a, b in zip(spans, spans[1:], strict=False)
    )  # one after another (1 ms slack)
    spans = _spans(four)
    first_end = min(end for _, end in spans)
    assert sum(1 for start, _ in spans if start < first_end) == 4  # four sent before the first one ended
    for r in rows:
        assert r["metrics"]["requests"] == (8 if r["test"] == "short" else 16)
        for name in ("ttft_ms", "tpot_ms", "itl_ms", "e2e_ms"):
            s = r["metrics"][name]
            assert s["p50"] <= s["p90"] <= s["p99"]
    # agentic at concurrency 4: four conversations side by side, each conversation's turns in order
    assert rows[3]["metrics"]["peak_in_flight"] == 4
    md = capsys.readouterr().out
    table = md.split("**server")[1]
    lines = [line for line in table.splitlines() if line.startswith("| openai")]
    assert [[c.strip() for c in line.strip("|").split("|")][1:4] for line in lines] == [
        ["short", "1", "inf"], ["short", "4", "inf"], ["agentic", "1", "inf"], ["agentic", "4", "inf"]
    ]  # fmt: skip
    # compared with itself, each load pairs only with itself
    recs = rows
    res = compare(recs, recs)
    assert res.matched == 4 and res.only_old == res.only_new == 0
    assert "work.max_concurrency" in res.headers


def test_poisson_arrivals_are_seeded(strata_server) -> None:
    """Requests arrive at the rate asked for, with exponential gaps from a seeded generator: the same
    arrival times every run; none is sent before it arrives."""
    runs = []
    for _ in range(2):
        rows: list[dict] = []
        run_suites(strata_server, ["short"], rows.append, requests=6, max_tokens=2,
                   loads=[Load(max_concurrency=None, request_rate=25.0)])  # fmt: skip
        (r,) = rows
        assert (r["work"]["max_concurrency"], r["work"]["request_rate"]) == (None, 25.0)
        arrived = sorted(q["arrived_ms"] for q in r["requests"])
        assert arrived[0] == 0 and all(b > a for a, b in zip(arrived, arrived[1:], strict=False))
        assert all(q["sent_ms"] >= q["arrived_ms"] - 1e-6 for q in r["requests"])
        runs.append(arrived)
    assert runs[0] == pytest.approx(runs[1])
    gaps = np.diff(runs[0]) / 1000
    assert np.all(gaps > 0) and len(set(np.round(gaps, 6))) == len(gaps)  # exponential gaps, not a fixed step


@pytest.mark.skipif(shutil.which("llama-server") is None, reason="no llama-server on PATH")
def test_against_llama_server(tmp_path) -> None:
    """The same suites against llama.cpp's own server, on the same file."""
    from strata.model import ensure_model

    port = _closed_port()
    proc = subprocess.Popen(
        ["llama-server", "-m", str(ensure_model(preset="tiny", seed=0)), "--port", str(port), "-c", "2048",
         "-np", "4"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert proc.poll() is None and time.monotonic() < deadline, "llama-server did not start"
            time.sleep(0.2)
        rows: list[dict] = []
        run_suites(url, ["short"], rows.append, requests=4, max_tokens=4, loads=[Load(1), Load(4)])
        assert [r["work"]["max_concurrency"] for r in rows] == [1, 4]
        assert all(r["server"]["kind"] == "llama.cpp" and r["work"]["max_context"] == 2048 for r in rows)
    finally:
        proc.terminate()
        proc.wait(timeout=20)
