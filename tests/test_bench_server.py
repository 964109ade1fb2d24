"""Server benchmarks: a server that is down is a clear error; against a real strata server on loopback,
the suites produce latency rows."""

from __future__ import annotations

import json
import socket

import pytest

from strata_bench._server_bench import ServerBenchError, run_suites
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


def test_unknown_suite_and_target(capsys) -> None:
    with pytest.raises(ValueError, match="not one of short, long, agentic"):
        run_suites("http://127.0.0.1:1", ["medium"], lambda r: None)
    assert main(["run", "--target", "vllm"]) == 1
    assert "use strata, llama.cpp or openai:URL" in capsys.readouterr().err


@pytest.fixture(scope="module")
def strata_server():  # type: ignore[no-untyped-def]
    """`strata serve` on the tiny model, on a free loopback port."""
    import importlib.util
    import subprocess
    import sys
    import time

    import httpx

    if importlib.util.find_spec("strata.server.cli") is None:
        pytest.skip("strata serve is not in this tree yet")
    from strata.model import ensure_model

    model = ensure_model(preset="tiny", seed=0)
    port = _closed_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "strata.cli", "serve", "--model", str(model), "--port", str(port)],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            if proc.poll() is not None:
                pytest.fail(f"strata serve exited: {proc.stderr.read()[-2000:] if proc.stderr else ''}")
            try:
                if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                pytest.fail("strata serve did not become ready in 120 s")
            time.sleep(0.2)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        if proc.stderr:
            proc.stderr.close()


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
        assert r["knobs"]["expert_cache"] == "auto"  # the server's own engine config, from /v1/status
        for req in r["requests"]:
            assert 0 < req["ttft_ms"] <= req["e2e_ms"]
            assert 1 <= req["output_tokens"] <= 8
        m = r["metrics"]
        for name in ("ttft_ms", "e2e_ms"):
            s = m[name]
            assert s["median"] <= s["p90"] <= s["p99"] and s["n"] == m["requests"]
        assert r["mean"] > 0 and len(r["samples"]) == m["requests"]
    # documents were sized in the server's own tokens: close to the target, never over the context
    for p in long["metrics"]["prompt_tokens"]:
        assert 0.8 * 528 <= p <= 600 - 8
    # the agentic context grows turn by turn (same conversation, more history)
    turns = [req["prompt_tokens"] for req in agentic["requests"]]
    assert turns[1] > turns[0] and turns[3] > turns[2]
