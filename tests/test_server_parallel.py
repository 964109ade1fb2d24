"""``strata serve --parallel N`` driven by real concurrent clients (the ``openai`` package, threads).

Every reply, greedy or seeded, streamed or not, is identical to the same request's reply from a server
that runs one request at a time (``--parallel 1``), at N = 1, 4 and 8 with more clients than sequences
(the queue holds the rest); a client that goes away mid-reply frees its sequence without touching its
neighbours; a worker killed while N requests run ends all of them with ``engine_exited`` and the fresh
engine serves the same replies; ``/v1/status`` lists the running sequences.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import openai
import pytest
from _strata_server import Served

from strata.model import ensure_model

pytestmark = pytest.mark.timeout(600)

ARGS = ("--max-context", "256", "--threads", "2", "--quiet", "--prefill", "32")
TOPICS = ["the expert cache", "a loan of slots", "prompt chunks", "the ring", "decode misses", "routing",
          "a KV cache", "the plan", "refills", "batches", "sequences", "bits"]  # fmt: skip


def _request(i: int) -> dict[str, Any]:
    body: dict[str, Any] = {
        "messages": [{"role": "user", "content": f"Tell me about {TOPICS[i % len(TOPICS)]}, take {i}."}],
        "max_tokens": 10 + (7 * i) % 23,  # sequences leave at different steps
        "temperature": 0.0,
    }
    if i % 3 == 1:
        body.update(temperature=0.8, seed=1000 + i)
    if i % 4 == 2:
        body.update(logprobs=True, top_logprobs=2)
    if i % 5 == 3:
        body.update(response_format={"type": "json_object"})  # the grammar's mask in the batch's sampler
    return body


def _ask(url: str, body: dict[str, Any], stream: bool = False) -> Reply:
    with openai.OpenAI(base_url=f"{url}/v1", api_key="x", max_retries=0, timeout=300) as c:
        if not stream:
            r = c.chat.completions.create(model="m", **body)
            assert r.usage is not None
            lp = r.choices[0].logprobs
            lps = (
                [
                    (t.token, t.logprob, [(x.token, x.logprob) for x in t.top_logprobs])
                    for t in lp.content or []
                ]
                if lp
                else []
            )
            return (
                r.choices[0].message.content or "",
                r.choices[0].finish_reason,
                r.usage.completion_tokens,
                lps,
            )
        text, finish, n, lps = "", "", 0, []
        for ch in c.chat.completions.create(
            model="m", stream=True, stream_options={"include_usage": True}, **body
        ):
            if ch.choices:
                text += ch.choices[0].delta.content or ""
                finish = ch.choices[0].finish_reason or finish
                lp = ch.choices[0].logprobs
                if lp is not None:
                    lps += [
                        (t.token, t.logprob, [(x.token, x.logprob) for x in t.top_logprobs])
                        for t in lp.content or []
                    ]
            if ch.usage is not None:
                n = ch.usage.completion_tokens
        return text, finish, n, lps


N_REQ = 12
Reply = tuple[str, str, int, list[Any]]  # content, finish reason, completion tokens, logprobs


@pytest.fixture(scope="module")
def model() -> str:
    return str(ensure_model("tiny"))


N_CHOICES = 3
SAMPLED = {
    "messages": [{"role": "user", "content": "Pick a few words."}],
    "max_tokens": 16,
    "temperature": 0.9,
}


FIRST = {"messages": [{"role": "user", "content": "Name a colour."}], "max_tokens": 12, "temperature": 0}
FOLLOW_UP = {
    "messages": [
        *FIRST["messages"],
        {"role": "assistant", "content": "Blue."},
        {"role": "user", "content": "And another one?"},
    ],
    "max_tokens": 12,
    "temperature": 0,
}


@pytest.fixture(scope="module")
def alone(model: str) -> dict[str, list[Reply]]:
    """Each request alone: a server of one sequence, one client at a time; and the single replies that the
    choices of an n > 1 request are (seed + i)."""
    s = Served(model, *ARGS)
    try:
        return {
            "requests": [_ask(s.url, _request(i)) for i in range(N_REQ)],
            "choices": [_ask(s.url, {**SAMPLED, "seed": 77 + i}) for i in range(N_CHOICES)],
            "follow_up": [_ask(s.url, FOLLOW_UP)],
        }
    finally:
        assert s.stop() == 0


@pytest.fixture(scope="module")
def reference(alone: dict[str, list[Reply]]) -> list[Reply]:
    return alone["requests"]


@pytest.fixture(scope="module", params=[1, 4, 8])
def server(request: pytest.FixtureRequest, model: str) -> Iterator[Served]:
    s = Served(model, *ARGS, "--parallel", str(request.param))
    yield s
    assert s.stop() == 0


def test_concurrent_replies_equal_the_replies_alone(server: Served, reference: list[Reply]) -> None:
    n = server.status()["queue"]["parallel"]
    with ThreadPoolExecutor(max_workers=N_REQ) as pool:  # more clients than sequences: the rest queue
        got = list(pool.map(lambda i: _ask(server.url, _request(i), stream=i % 2 == 0), range(N_REQ)))
    for i, (g, r) in enumerate(zip(got, reference, strict=True)):
        assert g == r, f"--parallel {n}: request {i} differs beside others"
    st = server.status()
    assert st["queue"]["sequences"] == [] and st["queue"]["length"] == 0 and st["state"] == "idle"
    assert st["config"]["parallel"] == n


def test_a_client_that_leaves_frees_its_sequence(server: Served, reference: list[Reply]) -> None:
    n = server.status()["queue"]["parallel"]
    long = {
        "messages": [{"role": "user", "content": "Go on and on."}],
        "max_tokens": 200,
        "stream": True,
        "temperature": 0,
    }

    def leave() -> None:
        with (
            httpx.Client(timeout=120) as c,
            c.stream("POST", f"{server.url}/v1/chat/completions", json=long) as r,
        ):
            for line in r.iter_lines():
                if '"content"' in line:
                    return  # the client goes away mid-reply

    t = threading.Thread(target=leave)
    t.start()
    other = _ask(server.url, _request(3))
    t.join()
    assert other == reference[3]
    # every sequence is free again: n + 1 requests at once all finish, each as alone
    with ThreadPoolExecutor(max_workers=n + 1) as pool:
        got = list(pool.map(lambda i: _ask(server.url, _request(i)), range(n + 1)))
    assert got == reference[: n + 1]


def test_a_killed_engine_ends_every_sequence_and_the_next_engine_serves(
    server: Served, reference: list[Reply]
) -> None:
    n = server.status()["queue"]["parallel"]
    pid = server.status()["engine"]["pid"]
    os.kill(pid, signal.SIGSTOP)  # the worker holds still: n requests are handed to it and wait there
    codes: list[str] = []

    def run(i: int) -> None:
        r = httpx.post(f"{server.url}/v1/chat/completions", json=_request(i), timeout=120)
        codes.append(r.json()["error"]["code"])

    threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 60
    while len(server.status()["queue"]["sequences"]) < n and time.monotonic() < deadline:
        time.sleep(0.05)
    seqs = server.status()["queue"]["sequences"]  # one per sequence, each given to the engine
    assert len(seqs) == n and all(q["state"] == "reading" and q["tokens"] == 0 for q in seqs), seqs
    os.kill(pid, signal.SIGKILL)
    for t in threads:
        t.join()
    assert codes == ["engine_exited"] * n
    while server.status()["engine"]["pid"] in (None, pid) and time.monotonic() < deadline + 60:
        time.sleep(0.2)
    with ThreadPoolExecutor(max_workers=n) as pool:
        got = list(pool.map(lambda i: _ask(server.url, _request(i)), range(n)))
    assert got == reference[:n]
    assert server.status()["engine"]["restarts"] >= 1


def test_n_choices_are_the_single_replies_of_their_seeds(
    server: Served, alone: dict[str, list[Reply]]
) -> None:
    with openai.OpenAI(base_url=f"{server.url}/v1", api_key="x", max_retries=0, timeout=300) as c:
        r = c.chat.completions.create(model="m", n=N_CHOICES, seed=77, **SAMPLED)
        assert [ch.index for ch in r.choices] == list(range(N_CHOICES))
        got = [(ch.message.content or "", ch.finish_reason) for ch in r.choices]
        assert got == [(t, f) for t, f, _n, _lp in alone["choices"]]
        assert r.usage is not None
        assert r.usage.completion_tokens == sum(n for _t, _f, n, _lp in alone["choices"])
        # streamed: the chunks of every choice, each naming its index, add up to the same choices
        text = [""] * N_CHOICES
        finish = [""] * N_CHOICES
        for chunk in c.chat.completions.create(model="m", n=N_CHOICES, seed=77, stream=True, **SAMPLED):
            for ch in chunk.choices:
                text[ch.index] += ch.delta.content or ""
                finish[ch.index] = ch.finish_reason or finish[ch.index]
        assert list(zip(text, finish, strict=True)) == got
        # greedy: n equal choices, each the reply alone
        g = c.chat.completions.create(model="m", n=N_CHOICES, **_request(0))
        assert [ch.message.content for ch in g.choices] == [alone["requests"][0][0]] * N_CHOICES
        # completions too, with the choices in index order
        t = c.completions.create(model="m", prompt="Once upon", n=2, max_tokens=8, temperature=0)
        assert [ch.index for ch in t.choices] == [0, 1] and t.choices[0].text == t.choices[1].text


def test_a_follow_up_reuses_its_sequences_cache(server: Served, alone: dict[str, list[Reply]]) -> None:
    with openai.OpenAI(base_url=f"{server.url}/v1", api_key="x", max_retries=0, timeout=300) as c:
        c.chat.completions.create(model="m", extra_body={"cache_prompt": True}, **FIRST)
        r = c.chat.completions.create(model="m", extra_body={"cache_prompt": True}, **FOLLOW_UP)
    assert r.usage is not None and r.usage.prompt_tokens_details is not None
    assert r.usage.prompt_tokens_details.cached_tokens > 0  # the first request's prompt, kept in its sequence
    assert (r.choices[0].message.content, r.choices[0].finish_reason) == alone["follow_up"][0][:2]
