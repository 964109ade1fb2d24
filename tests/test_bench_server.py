"""Server benchmarks: a server that is down is a clear error; against a real strata server on loopback,
the suites produce latency rows."""

from __future__ import annotations

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
    assert main(["run", "--target", f"openai:{url}/v1", "--suite", "short", "--output", str(out)]) == 1
    assert "cannot reach the server" in capsys.readouterr().err
    assert not out.exists() or out.read_text() == ""


def test_unknown_suite_and_target(capsys) -> None:
    with pytest.raises(ValueError, match="not one of short, long, agentic"):
        run_suites("http://127.0.0.1:1", ["medium"], lambda r: None)
    assert main(["run", "--target", "vllm"]) == 1
    assert "use strata, llama.cpp or openai:URL" in capsys.readouterr().err
