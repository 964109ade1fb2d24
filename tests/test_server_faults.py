"""Faults through a real ``strata serve``: a killed engine, clients that go away, a crowd of clients,
and engines that cannot start."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest
from _strata_server import Served, run_serve

from strata.model import ensure_model

pytestmark = pytest.mark.timeout(300)

MSGS = [{"role": "user", "content": "Keep talking about experts."}]
LONG = {"ignore_eos": True}  # a reply that only max_tokens ends


@pytest.fixture(scope="module")
def server() -> Iterator[Served]:
    s = Served(ensure_model("tiny"), "--max-context", "4096", "--prefill", "256", "--threads", "2", "--quiet")
    yield s
    assert s.stop() == 0


@pytest.fixture
def client(server: Served) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0, timeout=120) as c:
        yield c


def _wait(cond, what: str, timeout: float = 60.0):  # type: ignore[no-untyped-def]
    t_end = time.monotonic() + timeout
    while True:
        v = cond()
        if v:
            return v
        if time.monotonic() > t_end:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


def _metric(server: Served, name: str) -> float:
    for line in httpx.get(f"{server.url}/metrics").text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise AssertionError(f"{name} not in /metrics")


def test_prompt_progress_is_streamed_and_the_server_never_loads_the_engine(server: Served) -> None:
    body = {
        "model": "m",
        "prompt": [(7 * i) % 1500 + 100 for i in range(1000)],
        "max_tokens": 2,
        "temperature": 0,
        "stream": True,
    }
    reading: list[tuple[int, int]] = []
    with httpx.stream("POST", f"{server.url}/v1/completions", json=body, timeout=60) as r:
        for line in r.iter_lines():
            if line.startswith(": reading "):
                done, total = line[len(": reading ") :].split("/")
                reading.append((int(done), int(total)))
    # chunks of 256 tokens: the engine reports each one, and the client sees it
    assert reading[-1] == (1000, 1000)
    assert [d for d, _ in reading] == sorted(d for d, _ in reading) and len(reading) >= 4
    # libstrata lives in the worker process only
    pid = server.status()["engine"]["pid"]
    assert "libstrata" in Path(f"/proc/{pid}/maps").read_text()
    assert "libstrata" not in Path(f"/proc/{server.proc.pid}/maps").read_text()


def test_engine_killed_mid_stream(server: Served, client: openai.OpenAI) -> None:
    before = server.status()["engine"]
    stream = client.chat.completions.create(
        model="m", messages=MSGS, max_tokens=4000, temperature=0, stream=True, extra_body=LONG
    )
    pieces = 0
    with pytest.raises(openai.APIError) as e:
        for c in stream:
            if c.choices and c.choices[0].delta.content:
                pieces += 1
                if pieces == 3:
                    os.kill(before["pid"], signal.SIGKILL)
    stream.close()
    assert pieces >= 3
    assert "the engine stopped unexpectedly (exit code -9)" in e.value.message
    assert "SIGKILL" in e.value.message
    assert (e.value.body or {}).get("code") == "engine_exited"  # type: ignore[union-attr]
    # the next request gets a fresh engine
    r = client.chat.completions.create(model="m", messages=MSGS, max_tokens=4, temperature=0)
    assert r.usage is not None and r.usage.completion_tokens == 4
    after = server.status()["engine"]
    assert after["restarts"] == before["restarts"] + 1 and after["last_exit_code"] == -9
    assert after["pid"] and after["pid"] != before["pid"]
    assert _metric(server, "strata_engine_restarts_total") == after["restarts"]
    h = httpx.get(f"{server.url}/health")
    assert h.status_code == 200


def test_client_disconnect_stops_generation_within_one_token(server: Served, client: openai.OpenAI) -> None:
    cancelled_before = _metric(server, "strata_requests_cancelled_total")
    pid = server.status()["engine"]["pid"]
    body = {"model": "m", "messages": MSGS, "max_tokens": 4000, "temperature": 0, "stream": True, **LONG}
    try:
        with httpx.stream("POST", f"{server.url}/v1/chat/completions", json=body, timeout=60) as r:
            seq = int(r.headers["x-strata-request-seq"])
            n = 0
            for line in r.iter_lines():
                if line.startswith("data:") and '"content": "' in line and '"role"' not in line:
                    n += 1
                    if n == 3:
                        # hold the engine mid-reply (however fast it is), then leave: closing the block
                        # closes the connection
                        os.kill(pid, signal.SIGSTOP)
                        break
        _wait(
            lambda: _metric(server, "strata_requests_cancelled_total") == cancelled_before + 1,
            "the server to notice the client left",
        )
    finally:
        os.kill(pid, signal.SIGCONT)
    last = _wait(
        lambda: (server.status()["last_request"] or {}).get("seq") == seq and server.status()["last_request"],
        "the cancelled request to be accounted",
    )
    assert last["finish_reason"] == "cancelled"
    ext = last["strata"]
    generated, seen = len(ext["token_ids"]), ext["cancel_seen_at"]
    assert seen is not None and seen >= 3
    assert generated - seen <= 1  # the engine stopped within one token of hearing about it
    assert generated < 4000
    assert _metric(server, "strata_requests_cancelled_total") == cancelled_before + 1
    # nothing is left running or queued: the next request is served at once
    st = server.status()
    assert st["queue"]["length"] == 0 and st["queue"]["running"] is None and st["state"] == "idle"
    ok = client.chat.completions.create(model="m", messages=MSGS, max_tokens=3, temperature=0)
    assert ok.usage is not None and ok.usage.completion_tokens == 3


def test_queued_client_that_leaves_is_dropped(server: Served) -> None:
    body = {"model": "m", "messages": MSGS, "max_tokens": 4000, "temperature": 0, "stream": True, **LONG}
    pid = server.status()["engine"]["pid"]

    async def main() -> None:
        leave = asyncio.Event()
        async with httpx.AsyncClient(base_url=server.url, timeout=60) as http:

            async def first() -> int:
                async with http.stream("POST", "/v1/chat/completions", json=body) as r:
                    seq = int(r.headers["x-strata-request-seq"])
                    async for _ in r.aiter_lines():
                        if leave.is_set():
                            break
                return seq

            os.kill(pid, signal.SIGSTOP)  # the engine holds the first request while the second queues
            try:
                t1 = asyncio.create_task(first())
                await asyncio.to_thread(
                    _wait, lambda: server.status()["queue"]["running"] is not None, "first"
                )
                async with http.stream("POST", "/v1/chat/completions", json={**body, "max_tokens": 5}) as r2:
                    seq2 = int(r2.headers["x-strata-request-seq"])
                    st = await asyncio.to_thread(server.status)
                    assert [w["position"] for w in st["queue"]["waiting"] if w["seq"] == seq2] == [1]
                # gone before its turn: it leaves the queue at once and is never run
                await asyncio.to_thread(
                    _wait, lambda: server.status()["queue"]["length"] == 0, "the queue to empty"
                )
                assert server.status()["queue"]["running"] is not None  # the first is still the engine's
                leave.set()  # and its client leaves too, before the engine can finish it
            finally:
                os.kill(pid, signal.SIGCONT)
            seq1 = await t1
            last = await asyncio.to_thread(
                _wait,
                lambda: (server.status()["last_request"] or {}).get("seq") == seq1 and server.status(),
                "the first request to end",
            )
            assert last["last_request"]["finish_reason"] == "cancelled" and last["state"] == "idle"
            assert seq2 > seq1 and last["queue"]["length"] == 0

    asyncio.run(main())


def test_twenty_streaming_clients_complete_in_fifo_order(server: Served) -> None:
    n_clients, max_tokens = 20, 8
    pid = server.status()["engine"]["pid"]

    def taken_in() -> int:  # while the engine is paused: the one handed to it plus those waiting
        q = server.status()["queue"]
        return (q["running"] is not None) + len(q["waiting"])

    async def one(ac: openai.AsyncOpenAI, k: int, out: dict[int, tuple[str, int, int, int]]) -> None:
        stream = await ac.chat.completions.create(
            model="m",
            messages=[{"role": "user", "content": f"Client {k} says hello."}],
            max_tokens=max_tokens,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
            extra_body=LONG,
        )
        parts, usage, ext = [], 0, {}
        async for c in stream:
            if c.choices and c.choices[0].delta.content:
                parts.append(c.choices[0].delta.content)
            if c.usage is not None:
                usage, ext = c.usage.completion_tokens, (c.model_extra or {})["strata"]
        out[k] = ("".join(parts), usage, ext["request_seq"], ext["run_index"])

    async def main() -> None:
        out: dict[int, tuple[str, int, int, int]] = {}
        async with openai.AsyncOpenAI(
            base_url=f"{server.url}/v1", api_key="unused", max_retries=0, timeout=300
        ) as ac:
            # the engine is paused while the clients arrive, so that they all wait in the queue
            os.kill(pid, signal.SIGSTOP)
            try:
                tasks = []
                for k in range(n_clients):
                    tasks.append(asyncio.create_task(one(ac, k, out)))
                    # the next client is sent once the server has taken this one in: arrival order is k
                    await asyncio.to_thread(_wait, lambda k=k: taken_in() >= k + 1, f"client {k}")
                st = await asyncio.to_thread(server.status)
            finally:
                os.kill(pid, signal.SIGCONT)
            await asyncio.gather(*tasks)
        # one was handed to the paused engine, nineteen waited behind it in arrival order
        first_seq = st["queue"]["running"]
        assert [w["position"] for w in st["queue"]["waiting"]] == list(range(1, n_clients))
        assert [w["seq"] for w in st["queue"]["waiting"]] == list(range(first_seq + 1, first_seq + n_clients))
        # every one got its whole reply, and the engine ran them first come, first served
        assert sorted(out) == list(range(n_clients))
        assert all(out[k][0] and out[k][1] == max_tokens for k in range(n_clients))
        assert [out[k][2] for k in range(n_clients)] == list(range(first_seq, first_seq + n_clients))
        first = out[0][3]
        assert [out[k][3] for k in range(n_clients)] == list(range(first, first + n_clients))

    asyncio.run(main())


def test_start_up_failures_exit_with_the_engines_message(tmp_path: Path) -> None:
    bad = tmp_path / "broken.gguf"
    good = ensure_model("tiny").read_bytes()
    bad.write_bytes(good[: len(good) // 2])  # the tensors run past the end of the file
    p = run_serve("--model", str(bad))
    assert p.returncode != 0 and "listening" not in p.stdout
    assert "broken.gguf" in p.stderr
    p = run_serve("--model", str(ensure_model("tiny")), "--vram-budget", "1MiB")
    assert p.returncode == 1 and "listening" not in p.stdout
    assert "the engine could not start" in p.stderr and "budget" in p.stderr.lower()
    p = run_serve("--model", str(tmp_path / "missing.gguf"))
    assert p.returncode == 2 and "model file not found" in p.stderr


def test_a_folder_or_a_pipe_as_the_model_is_named_for_what_it_is(tmp_path: Path) -> None:
    (tmp_path / "a.gguf").write_bytes(b"")
    p = run_serve("--model", str(tmp_path))
    assert p.returncode == 2 and "is a folder (it holds a.gguf)" in p.stderr and "Traceback" not in p.stderr
    fifo = tmp_path / "model.fifo"
    os.mkfifo(fifo)
    p = run_serve("--model", str(fifo), timeout=60)  # nothing opens it: no reader waits for a writer
    assert p.returncode == 2 and "not a regular file" in p.stderr


def test_a_damaged_vocabulary_is_a_message_not_a_traceback(tmp_path: Path) -> None:
    from strata._gguf_meta import read_gguf_metadata

    good = ensure_model("tiny")
    first = read_gguf_metadata(good)["tokenizer.ggml.merges"][0].encode()
    data = good.read_bytes()
    # the first merge names two pieces that are not tokens (same length, so the file stays well formed)
    bad = tmp_path / "damaged-vocab.gguf"
    bad.write_bytes(data.replace(first, b"\x01" * (len(first) - 2) + b" \x01", 1))
    p = run_serve("--model", str(bad))
    assert p.returncode == 1 and "Traceback" not in p.stderr, p.stderr
    assert "the vocabulary is damaged" in p.stderr and "out of vocabulary" in p.stderr
