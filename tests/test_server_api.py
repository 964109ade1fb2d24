"""The OpenAI-compatible API of a real ``strata serve`` on loopback, driven by the ``openai`` package.

One server for the module (tiny model, 256-token context, API key, 1 MiB body limit). Replies are
checked against the engine itself (the same prompt generated in this process) and against the
server's own counters; bad requests get the right status and a message naming the field, and the
server keeps serving.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from _strata_server import Served

from strata import Engine, EngineConfig
from strata.chat_template import ChatTemplate
from strata.model import ensure_model
from strata.tokenizer import Tokenizer

pytestmark = pytest.mark.timeout(300)

KEY = "sk-test-0123456789"
CTX = 256
MSGS = [{"role": "user", "content": "Tell me about the expert cache."}]


@pytest.fixture(scope="module")
def server() -> Iterator[Served]:
    s = Served(
        ensure_model("tiny"),
        "--api-key",
        KEY,
        "--max-context",
        str(CTX),
        "--max-body-mib",
        "1",
        "--threads",
        "2",
        "--quiet",
    )
    yield s
    assert s.stop() == 0


@pytest.fixture(scope="module")
def engine() -> Iterator[Engine]:
    with Engine(ensure_model("tiny"), EngineConfig(threads=2, max_context=CTX)) as e:
        yield e


@pytest.fixture
def client(server: Served) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=f"{server.url}/v1", api_key=KEY, max_retries=0, timeout=120) as c:
        yield c


def _extra(obj: Any, key: str) -> Any:
    return (obj.model_extra or {})[key]


def test_chat_reply_is_the_engines_and_the_numbers_agree(
    server: Served, client: openai.OpenAI, tiny_tok: Tokenizer, engine: Engine
) -> None:
    before = server.status(KEY)["stats"]
    r = client.chat.completions.create(model="any-name-at-all", messages=MSGS, max_tokens=12, temperature=0)
    after = server.status(KEY)["stats"]
    st, timings = _extra(r, "strata"), _extra(r, "timings")
    # the prompt is the model's template, tokenized; the reply is what the engine generates for it
    template = ChatTemplate(tiny_tok.chat_template)
    prompt = tiny_tok.encode(template.render(MSGS))
    assert st["prompt_token_ids"] == prompt
    engine.kv_reset()
    assert st["token_ids"] == engine.generate(prompt, max_tokens=12, temperature=0.0).tokens
    assert r.choices[0].message.content == tiny_tok.decode(st["token_ids"])
    assert r.choices[0].finish_reason == "length" and r.object == "chat.completion"
    # usage, timings and the engine's counters say the same
    assert r.usage is not None
    assert r.usage.prompt_tokens == timings["prompt_n"] == len(prompt)
    assert r.usage.completion_tokens == timings["predicted_n"] == len(st["token_ids"]) == 12
    assert r.usage.total_tokens == len(prompt) + 12
    assert after["prompt_tokens"] - before["prompt_tokens"] == len(prompt)
    assert timings["prompt_ms"] == pytest.approx(after["prompt_ms"] - before["prompt_ms"], rel=1e-6, abs=1e-6)
    assert timings["predicted_ms"] == pytest.approx(
        after["decode_ms"] - before["decode_ms"], rel=1e-6, abs=1e-6
    )
    assert timings["predicted_per_second"] == pytest.approx(12 * 1000 / timings["predicted_ms"])
    assert len(st["top2_margins"]) == 12 and all(m >= 0 for m in st["top2_margins"])
    assert st["chunk"] == after["last_chunk"] and st["lookups"] == after["lookups"] - before["lookups"]


def test_streaming_chat_equals_the_whole_reply(client: openai.OpenAI) -> None:
    whole = client.chat.completions.create(model="m", messages=MSGS, max_tokens=10, temperature=0)
    chunks = list(
        client.chat.completions.create(
            model="m",
            messages=MSGS,
            max_tokens=10,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishes == ["length"]
    last = chunks[-1]
    assert last.choices == [] and last.usage is not None
    assert last.usage.model_dump() == whole.usage.model_dump()  # type: ignore[union-attr]
    assert _extra(last, "timings")["predicted_n"] == 10
    assert _extra(last, "strata")["token_ids"] == _extra(whole, "strata")["token_ids"]
    # without include_usage there is no usage chunk, and the finishing chunk still carries the timings
    plain = list(
        client.chat.completions.create(model="m", messages=MSGS, max_tokens=3, temperature=0, stream=True)
    )
    assert all(c.usage is None for c in plain)
    assert _extra(plain[-1], "timings")["predicted_n"] == 3


def test_completions_token_ids_strings_and_stop(
    client: openai.OpenAI, tiny_tok: Tokenizer, engine: Engine
) -> None:
    ids = tiny_tok.encode("The expert cache keeps")
    r = client.completions.create(model="m", prompt=ids, max_tokens=16, temperature=0)
    st = _extra(r, "strata")
    engine.kv_reset()
    assert st["token_ids"] == engine.generate(ids, max_tokens=16, temperature=0.0).tokens
    text = r.choices[0].text
    assert text == tiny_tok.decode(st["token_ids"])
    same = client.completions.create(model="m", prompt="The expert cache keeps", max_tokens=16, temperature=0)
    assert same.choices[0].text == text
    # a stop string cuts the text before it and ends with finish_reason "stop"
    cut = next(k for k in range(3, len(text) - 2) if text[k : k + 2].strip())
    stop = text[cut : cut + 2]
    s = client.completions.create(model="m", prompt=ids, max_tokens=16, temperature=0, stop=[stop])
    assert s.choices[0].text == text[: text.index(stop)]
    assert s.choices[0].finish_reason == "stop"


def test_cached_prompt_prefix_gives_the_same_reply(client: openai.OpenAI) -> None:
    first = [{"role": "user", "content": "Tell me about the expert cache."}]
    r1 = client.chat.completions.create(model="m", messages=first, max_tokens=8, temperature=0)
    follow = [
        *first,
        {"role": "assistant", "content": r1.choices[0].message.content},
        {"role": "user", "content": "And what about the loan?"},
    ]
    cold = client.chat.completions.create(model="m", messages=follow, max_tokens=8, temperature=0)
    assert cold.usage is not None and cold.usage.prompt_tokens_details.cached_tokens == 0  # type: ignore[union-attr]
    # the first turn again, then the follow-up reuses what the KV cache holds of it
    client.chat.completions.create(model="m", messages=first, max_tokens=8, temperature=0)
    warm = client.chat.completions.create(
        model="m", messages=follow, max_tokens=8, temperature=0, extra_body={"cache_prompt": True}
    )
    assert warm.usage is not None
    cached = warm.usage.prompt_tokens_details.cached_tokens  # type: ignore[union-attr]
    assert cached > 10 and cached == _extra(warm, "strata")["cached_tokens"]
    assert warm.usage.prompt_tokens == cold.usage.prompt_tokens
    assert _extra(warm, "timings")["prompt_n"] == warm.usage.prompt_tokens - cached
    assert _extra(warm, "strata")["token_ids"] == _extra(cold, "strata")["token_ids"]


def test_reasoning_format(client: openai.OpenAI) -> None:
    plain = client.chat.completions.create(model="m", messages=MSGS, max_tokens=12, temperature=0)
    split = client.chat.completions.create(
        model="m", messages=MSGS, max_tokens=12, temperature=0, extra_body={"reasoning_format": "deepseek"}
    )
    raw = plain.choices[0].message.content or ""
    msg = split.choices[0].message
    reasoning = (msg.model_extra or {}).get("reasoning_content") or ""
    # the same tokens; the text outside <think>...</think> is the content, the text inside the reasoning
    assert _extra(split, "strata")["token_ids"] == _extra(plain, "strata")["token_ids"]
    if "<think>" not in raw:
        assert msg.content == raw and reasoning == ""
    assert (msg.content or "") + reasoning == raw.replace("<think>", "").replace(
        "</think>", ""
    ) or "<think>" in raw
    chunks = list(
        client.chat.completions.create(
            model="m",
            messages=MSGS,
            max_tokens=12,
            temperature=0,
            stream=True,
            extra_body={"reasoning_format": "deepseek"},
        )
    )
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert streamed == msg.content


def test_seeded_sampling_is_reproducible(client: openai.OpenAI) -> None:
    def sample(seed: int) -> list[int]:
        r = client.chat.completions.create(
            model="m",
            messages=MSGS,
            max_tokens=12,
            temperature=1.0,
            top_p=0.95,
            seed=seed,
            extra_body={"top_k": 50, "min_p": 0.01},
        )
        return list(_extra(r, "strata")["token_ids"])

    a, b, c = sample(7), sample(7), sample(8)
    assert a == b and a != c


def test_logprobs(client: openai.OpenAI) -> None:
    r = client.chat.completions.create(
        model="m", messages=MSGS, max_tokens=5, temperature=0, logprobs=True, top_logprobs=3
    )
    lp = r.choices[0].logprobs
    assert lp is not None and lp.content is not None and len(lp.content) == 5
    for entry in lp.content:
        assert entry.logprob <= 0 and len(entry.top_logprobs) == 3
        tops = [t.logprob for t in entry.top_logprobs]
        assert tops == sorted(tops, reverse=True)
        assert entry.logprob == pytest.approx(tops[0])  # greedy: the chosen token is the most likely


def test_models_health_metrics_status(server: Served, client: openai.OpenAI) -> None:
    models = client.models.list()
    model_name = Path(ensure_model("tiny")).name  # the made model's file name (its maker version included)
    assert model_name.startswith("tiny-q8_0-seed0-") and [m.id for m in models.data] == [model_name]
    h = httpx.get(f"{server.url}/health")
    assert h.status_code == 200 and h.json() == {"status": "ok"}
    assert httpx.get(f"{server.url}/metrics").status_code == 401  # with --api-key, the key is needed
    m = httpx.get(f"{server.url}/metrics", headers={"Authorization": f"Bearer {KEY}"})
    assert m.status_code == 200 and m.headers["x-strata-server"] == "1"
    for name in (
        "strata_requests_total",
        "strata_prompt_tokens_total",
        "strata_generated_tokens_total",
        "strata_prompt_seconds_total",
        "strata_decode_seconds_total",
        "strata_expert_hits_total",
        "strata_expert_lookups_total",
        "strata_expert_swaps_total",
        "strata_slots_lent",
        "strata_engine_restarts_total",
    ):
        assert f"\n{name}" in m.text or m.text.startswith(name) or f"\n{name}{{" in m.text, name
    st = server.status(KEY)
    assert st["state"] == "idle" and st["model"] == model_name
    assert st["plan"]["max_context"] == st["max_context"] == CTX
    assert st["info"]["arch"] == "qwen3moe" and st["config"]["max_context"] == CTX
    assert st["engine"]["pid"] and st["engine"]["restarts"] == 0 and st["engine"]["last_exit_code"] is None
    assert st["queue"]["length"] == 0 and st["prompt"] is None
    assert st["budget"]["device"] == "cpu" and st["budget"]["slots"] == st["plan"]["n_slots"]
    assert st["last_request"]["timings"]["predicted_n"] > 0
    assert set(st) >= {"gpu", "stats"}


def test_api_key_is_required_on_v1_only(server: Served) -> None:
    with (
        openai.OpenAI(base_url=f"{server.url}/v1", api_key="wrong", max_retries=0) as bad,
        pytest.raises(openai.AuthenticationError) as e,
    ):
        bad.chat.completions.create(model="m", messages=MSGS, max_tokens=2)
    assert e.value.status_code == 401 and e.value.code == "invalid_api_key"
    for path in ("/v1/models", "/v1/status"):
        r = httpx.get(f"{server.url}{path}")
        assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
        assert "Authorization: Bearer" in r.json()["error"]["message"]
    r = httpx.post(
        f"{server.url}/v1/completions", json={"prompt": "x"}, headers={"Authorization": "Bearer nope"}
    )
    assert r.status_code == 401 and "not valid" in r.json()["error"]["message"]
    assert httpx.get(f"{server.url}/health").status_code == 200


BAD = [
    ("chat", {"messages": "hi"}, 400, "invalid_request", "messages", "list"),
    ("chat", {}, 400, "invalid_request", "messages", "missing"),
    (
        "chat",
        {"messages": [{"role": "robot", "content": "x"}]},
        400,
        "invalid_request",
        "messages[0].role",
        "robot",
    ),
    (
        "chat",
        {"messages": [{"role": "user", "content": 3}]},
        400,
        "invalid_request",
        "messages[0].content",
        "string",
    ),
    ("chat", {"messages": MSGS, "temperature": "hot"}, 400, "invalid_request", "temperature", "number"),
    ("chat", {"messages": MSGS, "temperature": -1}, 400, "invalid_request", "temperature", "between"),
    ("chat", {"messages": MSGS, "max_tokens": 0}, 400, "invalid_request", "max_tokens", "between"),
    ("chat", {"messages": MSGS, "max_tokens": 1.5}, 400, "invalid_request", "max_tokens", "integer"),
    ("chat", {"messages": MSGS, "top_p": 2}, 400, "invalid_request", "top_p", "between"),
    ("chat", {"messages": MSGS, "seed": "x"}, 400, "invalid_request", "seed", "integer"),
    ("chat", {"messages": MSGS, "n": 65}, 400, "invalid_request", "n", "at most 64"),
    ("chat", {"messages": MSGS, "stream": "yes"}, 400, "invalid_request", "stream", "true or false"),
    ("chat", {"messages": MSGS, "stop": 5}, 400, "invalid_request", "stop", "string"),
    ("chat", {"messages": MSGS, "stream_options": 1}, 400, "invalid_request", "stream_options", "object"),
    ("chat", {"messages": MSGS, "model": 5}, 400, "invalid_request", "model", "string"),
    (
        "chat",
        {"messages": MSGS, "reasoning_format": "xml"},
        400,
        "invalid_request",
        "reasoning_format",
        "deepseek",
    ),
    (
        "chat",
        {"messages": MSGS, "chat_template_kwargs": {"enable_thinking": "no"}},
        400,
        "invalid_request",
        "chat_template_kwargs.enable_thinking",
        "true or false",
    ),
    ("completions", {}, 400, "invalid_request", "prompt", "missing"),
    ("completions", {"prompt": [1, 99999]}, 400, "invalid_request", "prompt", "99999"),
    ("completions", {"prompt": [[1, 2], [3, 4]]}, 400, "invalid_request", "prompt", "batches"),
    ("completions", {"prompt": {"file": "/etc/passwd"}}, 400, "invalid_request", "prompt", "string"),
    ("completions", {"prompt": "x", "max_tokens": 1000}, 400, "context_length_exceeded", "prompt", "1000"),
    ("completions", {"prompt": [5] * 300, "max_tokens": 4}, 400, "context_length_exceeded", "prompt", "300"),
    ("completions", {"prompt": [5] * 300}, 400, "context_length_exceeded", "prompt", "300 tokens"),
]


@pytest.mark.parametrize(
    ("endpoint", "body", "status", "code", "param", "words"),
    BAD,
    ids=[f"{b[0]}-{b[4]}-{i}" for i, b in enumerate(BAD)],
)
def test_bad_requests_are_named(
    server: Served, endpoint: str, body: dict, status: int, code: str, param: str, words: str
) -> None:
    path = "/v1/chat/completions" if endpoint == "chat" else "/v1/completions"
    r = httpx.post(f"{server.url}{path}", json=body, headers={"Authorization": f"Bearer {KEY}"}, timeout=60)
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert err["code"] == code and err["param"] == param and words in err["message"], err
    assert err["type"] == "invalid_request_error"
    if code == "context_length_exceeded":
        assert str(CTX) in err["message"]  # both numbers: the request's and the context's


def test_malformed_and_huge_bodies_then_still_serving(server: Served, client: openai.OpenAI) -> None:
    auth = {"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"}
    url = f"{server.url}/v1/chat/completions"
    r = httpx.post(url, content=b"{not json", headers=auth)
    assert r.status_code == 400 and "not valid JSON" in r.json()["error"]["message"]
    r = httpx.post(url, content=b"[1, 2]", headers=auth)
    assert r.status_code == 400 and "JSON object" in r.json()["error"]["message"]
    big = json.dumps({"messages": [{"role": "user", "content": "x" * (2 << 20)}]}).encode()
    r = httpx.post(url, content=big, headers=auth, timeout=60)
    assert r.status_code == 413 and r.json()["error"]["code"] == "request_too_large"
    assert str(1 << 20) in r.json()["error"]["message"]

    def chunks() -> Iterator[bytes]:  # no Content-Length: the limit holds while the body streams in
        yield b'{"messages": [{"role": "user", "content": "'
        for _ in range(40):
            yield b"y" * 65536
        yield b'"}]}'

    r = httpx.post(url, content=chunks(), headers=auth, timeout=60)
    assert r.status_code == 413 and r.json()["error"]["code"] == "request_too_large"
    r = httpx.get(f"{server.url}/v1/nothing-here", headers=auth)
    assert r.status_code == 404 and r.json()["error"]["code"] == "not_found"
    ok = client.chat.completions.create(model="m", messages=MSGS, max_tokens=4, temperature=0)
    assert ok.usage is not None and ok.usage.completion_tokens == 4
    assert server.proc.poll() is None


def test_the_context_bounds_the_reply_by_the_engines_rule(client: openai.OpenAI) -> None:
    # prompt + reply - 1 <= context: the last token is sampled, never stored
    r = client.completions.create(
        model="m", prompt=[5] * (CTX - 6), temperature=0, extra_body={"ignore_eos": True}
    )
    assert r.usage is not None and r.usage.completion_tokens == 7 and r.choices[0].finish_reason == "length"
    full = client.completions.create(
        model="m", prompt=[5] * CTX, temperature=0, extra_body={"ignore_eos": True}
    )
    assert full.usage is not None and full.usage.completion_tokens == 1
