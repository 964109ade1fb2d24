"""Every way a real ``strata serve`` stops or stalls: SIGTERM to the server, SIGTERM to its whole
process group in the middle of a stream, and an engine worker that is stopped (SIGSTOP) and resumed.

Each test has a server of its own (it ends it), with the engine log on, which is what is checked: no
abort of the worker at exit, no engine restarted during a shutdown.
"""

from __future__ import annotations

import json
import os
import signal
import time
from typing import Any

import httpx
import pytest
from _strata_server import Served

from strata.model import ensure_model

pytestmark = pytest.mark.timeout(240)

MSGS = [{"role": "user", "content": "Keep talking about experts."}]
LONG = {
    "model": "m",
    "messages": MSGS,
    "max_tokens": 4000,
    "temperature": 0,
    "stream": True,
    "ignore_eos": True,
}


def _wait(cond: Any, what: str, timeout: float = 60.0) -> Any:
    t_end = time.monotonic() + timeout
    while not (v := cond()):
        if time.monotonic() > t_end:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)
    return v


def _events(lines: Any, after: int, then: Any) -> tuple[list[dict[str, Any]], bool]:
    """The stream's JSON events; ``then()`` is called once ``after`` content chunks have come."""
    events: list[dict[str, Any]] = []
    done = False
    n = 0
    for line in lines:
        if not line.startswith("data:"):
            continue
        data = line[5:].strip()
        if data == "[DONE]":
            done = True
            break
        ev = json.loads(data)
        events.append(ev)
        if ev.get("choices") and ev["choices"][0]["delta"].get("content"):
            n += 1
            if n == after:
                then()
    return events, done


def _engine_lines(s: Served) -> list[str]:
    return [line for line in s.log if line.startswith("engine:")]


def test_sigterm_stops_the_server_and_its_worker_cleanly() -> None:
    s = Served(ensure_model("tiny"), "--threads", "1")
    r = httpx.post(f"{s.url}/v1/completions", json={"prompt": "The cache", "max_tokens": 3}, timeout=60)
    assert r.status_code == 200
    assert s.stop() == 0
    log = "\n".join(s.log)
    assert "Fatal Python error" not in log and "_enter_buffered_busy" not in log, log
    assert "exited with code" not in log
    assert sum("engine worker started" in line for line in s.log) == 1


def test_sigterm_to_the_process_group_mid_stream() -> None:
    s = Served(ensure_model("tiny"), "--threads", "1", new_session=True)
    try:
        with httpx.stream("POST", f"{s.url}/v1/chat/completions", json=LONG, timeout=60) as r:
            events, done = _events(r.iter_lines(), 3, lambda: os.killpg(s.proc.pid, signal.SIGTERM))
        assert s.proc.wait(60) == 0
    finally:
        s.stop()
    # the stream ends with an error that says why, then [DONE]; it is not cut
    assert done and "error" in events[-1], events[-3:]
    assert events[-1]["error"]["code"] == "server_shutting_down"
    assert "shutting down" in events[-1]["error"]["message"]
    # the worker was not in the group: the server stopped it, nothing took its exit for a crash
    log = "\n".join(s.log)
    assert sum("engine worker started" in line for line in s.log) == 1, log
    assert "exited with code" not in log and "Fatal Python error" not in log, log


def test_a_stopped_worker_is_noticed_and_a_resumed_one_serves_again() -> None:
    s = Served(ensure_model("tiny"), "--threads", "1", "--engine-timeout", "2", "--quiet")
    pid = httpx.get(f"{s.url}/v1/status", timeout=30).json()["engine"]["pid"]
    try:
        with httpx.stream("POST", f"{s.url}/v1/chat/completions", json=LONG, timeout=60) as r:
            events, done = _events(r.iter_lines(), 3, lambda: os.kill(pid, signal.SIGSTOP))
        # the stream did not wait for ever: it ended with an error that says what is wrong
        assert done and events[-1]["error"]["code"] == "engine_unresponsive", events[-3:]
        assert "has not answered" in events[-1]["error"]["message"]
        h = httpx.get(f"{s.url}/health", timeout=30)
        assert h.status_code == 503 and h.json()["status"] == "unresponsive"
        # a new request is answered at once, not queued behind the stopped engine
        r2 = httpx.post(f"{s.url}/v1/completions", json={"prompt": "x", "max_tokens": 2}, timeout=30)
        assert r2.status_code == 503 and r2.json()["error"]["code"] == "engine_unresponsive"
    finally:
        os.kill(pid, signal.SIGCONT)
    try:
        _wait(
            lambda: httpx.get(f"{s.url}/health", timeout=30).status_code == 200, "the engine to answer again"
        )
        # the same engine (not a restart) serves the next request
        r3 = httpx.post(
            f"{s.url}/v1/completions", json={"prompt": "x", "max_tokens": 2, "temperature": 0}, timeout=60
        )
        assert r3.status_code == 200 and r3.json()["usage"]["completion_tokens"] == 2
        st = httpx.get(f"{s.url}/v1/status", timeout=30).json()
        assert st["engine"]["pid"] == pid and st["engine"]["restarts"] == 0 and st["state"] == "idle"
    finally:
        assert s.stop() == 0
