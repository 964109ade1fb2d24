"""Tool calls and structured output: the parser and the grammar on their own, the grammar on the
engine's logits, and a real ``strata serve`` on loopback driven by the ``openai`` client, streamed and
not, on the random-weight tiny model (which writes valid JSON for a schema only because the grammar
makes it)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import jsonschema
import openai
import pytest
from _strata_server import Served

from strata import Engine, EngineConfig
from strata.chat_template import ChatTemplate
from strata.grammar import grammars_for, json_schema_grammar
from strata.model import ensure_model
from strata.server.errors import ApiError
from strata.server.tools import (
    FORMATS,
    ToolFormat,
    ToolStream,
    format_for,
    grammar_for,
    parse_calls,
    prepare_messages,
    tool_spec,
)
from strata.tokenizer import Tokenizer

pytestmark = pytest.mark.timeout(300)

WEATHER = {
    "type": "object",
    "properties": {"city": {"type": "string"}, "days": {"type": "integer", "minimum": 1, "maximum": 7}},
    "required": ["city", "days"],
    "additionalProperties": False,
}
TOOLS = [
    {
        "type": "function",
        "function": {"name": "get_weather", "description": "The forecast", "parameters": WEATHER},
    },
    {
        "type": "function",
        "function": {
            "name": "add",
            "parameters": {
                "type": "object",
                "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                "required": ["a", "b"],
                "additionalProperties": False,
            },
        },
    },
]
MSGS = [{"role": "user", "content": "What is the weather in Paris?"}]
QWEN = FORMATS["qwen3"]


def _spec(**body: Any) -> Any:
    return tool_spec({"tools": TOOLS, **body}, QWEN)


# ---- the parser ---------------------------------------------------------------------------------


def test_calls_parse_and_what_does_not_parse_stays_content() -> None:
    text = (
        'Let me look.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "days": 2}}\n'
        '</tool_call>\n<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n</tool_call>'
    )
    content, calls = parse_calls(text, _spec())
    assert content == "Let me look."
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [
        ("get_weather", {"city": "Paris", "days": 2}),
        ("add", {"a": 1, "b": 2}),
    ]
    assert len({c.id for c in calls}) == 2 and all(c.id.startswith("call_") for c in calls)
    # broken JSON, an unknown function and an unclosed block are content, as written
    for bad_block in (
        '<tool_call>\n{"name": "add", "arguments": {"a": 1,\n</tool_call>',
        '<tool_call>\n{"name": "rm_rf", "arguments": {}}\n</tool_call>',
        '<tool_call>\n{"name": "add", "argu',
    ):
        content, calls = parse_calls("ok " + bad_block, _spec())
        assert calls == [] and content == ("ok " + bad_block).strip()
    # parallel calls off: the first call is the call, the second stays text
    content, calls = parse_calls(text, _spec(parallel_tool_calls=False))
    assert [c.name for c in calls] == ["get_weather"] and '"name": "add"' in content


def test_the_stream_parser_gives_the_whole_parse_in_any_pieces() -> None:
    text = (
        'Hi <tool_c <tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n</tool_call>\n'
        '<tool_call>{"bad"}</tool_call> bye'
    )
    whole_content, whole = parse_calls(text, _spec())
    for size in (1, 2, 3, 7, 50):
        s = ToolStream(_spec())
        events = []
        for i in range(0, len(text), size):
            events += s.feed(text[i : i + size])
        events += s.flush()
        content = "".join(x for k, x in events if k == "content" and isinstance(x, str))
        assert content.strip() == whole_content
        assert [(c.name, c.arguments) for c in s.calls] == [(c.name, c.arguments) for c in whole]
    # eager (a grammar makes every call parse): the name as soon as it is known, then argument pieces
    text = '<tool_call>\n{"name": "add", "arguments": {"a": 12, "b": {"c": "}"}}}\n</tool_call>'
    _, whole = parse_calls(text, _spec())
    assert whole[0].arguments == '{"a": 12, "b": {"c": "}"}}'  # as the model wrote it
    for size in (1, 2, 5, 100):
        s = ToolStream(_spec(), eager=True)
        events = []
        for i in range(0, len(text), size):
            events += s.feed(text[i : i + size])
        events += s.flush()
        kinds = [k for k, _ in events]
        assert kinds[0] == "start" and set(kinds[1:]) <= {"args"} and (size == 100 or len(kinds) > 2)
        assert "".join(x for k, x in events if k == "args") == whole[0].arguments


def test_tool_fields_are_checked() -> None:
    for body, param in [
        ({"tools": "f"}, "tools"),
        ({"tools": [{"type": "function"}]}, "tools[0]"),
        ({"tools": TOOLS, "tool_choice": "always"}, "tool_choice"),
        ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice"),
        ({"tool_choice": "required"}, "tool_choice"),
        ({"tools": TOOLS, "parallel_tool_calls": "yes"}, "parallel_tool_calls"),
        ({"tools": TOOLS + TOOLS[:1]}, "tools[2].function.name"),
    ]:
        with pytest.raises(ApiError) as e:
            tool_spec(body, QWEN)
        assert e.value.status == 400 and e.value.param == param, (body, e.value.param)
    with pytest.raises(ApiError) as e:
        grammar_for({"response_format": {"type": "xml"}}, None)
    assert e.value.param == "response_format"


def test_tools_calls_and_results_go_through_the_template() -> None:
    tok = Tokenizer.from_gguf(ensure_model("tiny"))
    t = ChatTemplate(tok.chat_template, bos_token=tok.bos_token, eos_token=tok.eos_token)
    msgs = [
        *MSGS,
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Paris", "days": 1}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny, 21 C"},
    ]
    messages, tools = prepare_messages(msgs, _spec(), t)
    text = t.render(messages, tools=tools)
    assert '"name": "get_weather"' in text and "<tools>" in text  # the tool list, in the system turn
    assert (
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "days": 1}}\n</tool_call>'
        in text
    )
    assert "<tool_response>\nsunny, 21 C\n</tool_response>" in text
    # tool_choice none: no tools in the prompt
    messages, tools = prepare_messages(MSGS, _spec(tool_choice="none"), t)
    assert "<tools>" not in t.render(messages, tools=tools)


def test_the_format_is_chosen_by_the_template_family(monkeypatch: pytest.MonkeyPatch) -> None:
    tok = Tokenizer.from_gguf(ensure_model("tiny"))
    assert format_for(ChatTemplate(tok.chat_template)) is QWEN  # ChatML turns
    assert format_for(ChatTemplate(None)) is QWEN  # the fallback template
    # another family is one more entry in the table, found by its own marks
    other = ToolFormat(
        "other",
        "[CALL]",
        "[/CALL]",
        "",
        QWEN.system,
        QWEN.call,
        QWEN.parse,
        QWEN.head,
        QWEN.tail,
        ("[CALL]",),
    )
    monkeypatch.setitem(FORMATS, "other", other)
    t = ChatTemplate("{{ '<|im_start|>' }}{% if tools %}[CALL]{% endif %}")
    assert format_for(t) is other
    content, calls = parse_calls(
        'x [CALL]{"name": "add", "arguments": {"a": 1, "b": 2}}[/CALL]', tool_spec({"tools": TOOLS}, other)
    )
    assert content == "x" and [c.name for c in calls] == ["add"]


# ---- the grammar on the engine's logits ---------------------------------------------------------


@pytest.fixture(scope="module")
def tok(tiny_tok: Tokenizer) -> Tokenizer:
    return tiny_tok  # conftest's


def test_a_constraint_on_the_engine_gives_schema_valid_json_deterministically(tok: Tokenizer) -> None:
    g = grammars_for(tok)
    prompt = tok.encode("<|im_start|>user\nhello<|im_end|>\n<|im_start|>assistant\n", parse_special=True)
    stops = sorted(tok.eog_ids)
    with Engine(ensure_model("tiny"), EngineConfig(threads=2, max_context=256)) as e:
        free = e.generate(prompt, max_tokens=24, stop_tokens=stops)
        e.kv_reset()
        same = e.generate(prompt, max_tokens=24, stop_tokens=stops, logits_processor=lambda x: None)
        e.kv_reset()
        assert same.tokens == free.tokens  # the hook's own loop is the engine's loop
        replies = []
        for _ in range(2):
            c = g.constraint(json_schema_grammar(WEATHER), 60)
            r = e.generate(
                prompt,
                max_tokens=60,
                stop_tokens=stops,
                logits_processor=c.mask,
                on_token=lambda t, x, c=c: not c.accept(t),
            )
            e.kv_reset()
            replies.append(r.tokens)
        value = json.loads(tok.decode(replies[0]))
        jsonschema.validate(value, WEATHER)
        assert replies[0] == replies[1]
        assert not free.tokens or tok.decode(free.tokens) != tok.decode(replies[0])  # the grammar did it


# ---- a real server --------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def server() -> Iterator[Served]:
    s = Served(ensure_model("tiny"), "--max-context", "512", "--threads", "2", "--quiet")
    yield s
    assert s.stop() == 0


@pytest.fixture
def client(server: Served) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0, timeout=120) as c:
        yield c


def _stream(client: openai.OpenAI, **kw: Any) -> tuple[str, dict[int, dict[str, Any]], str | None]:
    content, calls, finish = "", {}, None
    for ch in client.chat.completions.create(model="m", messages=MSGS, temperature=0, stream=True, **kw):
        for c in ch.choices:
            finish = c.finish_reason or finish
            content += c.delta.content or ""
            for tc in c.delta.tool_calls or []:
                if tc.id is not None:  # the first delta of a call: its id and name, arguments empty
                    assert tc.index not in calls and tc.function.name and not tc.function.arguments
                    calls[tc.index] = {"id": tc.id, "name": tc.function.name, "arguments": ""}
                else:
                    calls[tc.index]["arguments"] += tc.function.arguments or ""
    return content, calls, finish


@pytest.mark.parametrize(
    "fmt",
    [
        {"type": "json_schema", "json_schema": {"name": "weather", "strict": True, "schema": WEATHER}},
        {"type": "json_object"},
    ],
)
def test_response_format_gives_valid_json_streamed_and_not(
    client: openai.OpenAI, fmt: dict[str, Any]
) -> None:
    r = client.chat.completions.create(
        model="m", messages=MSGS, temperature=0, max_tokens=60, response_format=fmt
    )
    text = r.choices[0].message.content or ""
    value = json.loads(text)
    jsonschema.validate(value, fmt.get("json_schema", {}).get("schema", {"type": "object"}))
    assert r.choices[0].finish_reason in ("stop", "length")
    content, calls, finish = _stream(client, max_tokens=60, response_format=fmt)
    assert content == text and not calls and finish == r.choices[0].finish_reason  # deterministic at 0
    # sampled: still valid, and the same seed gives the same reply
    sampled = [
        client.chat.completions.create(
            model="m", messages=MSGS, temperature=1.0, seed=7, max_tokens=60, response_format=fmt
        )
        .choices[0]
        .message.content
        or ""
        for _ in range(2)
    ]
    jsonschema.validate(json.loads(sampled[0]), fmt.get("json_schema", {}).get("schema", {"type": "object"}))
    assert sampled[0] == sampled[1]


def test_tool_choice_required_and_named_give_tool_calls_streamed_and_not(client: openai.OpenAI) -> None:
    schemas = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
    for choice, parallel in [("required", False), ({"type": "function", "function": {"name": "add"}}, True)]:
        kw = {"tools": TOOLS, "tool_choice": choice, "parallel_tool_calls": parallel, "max_tokens": 80}
        r = client.chat.completions.create(model="m", messages=MSGS, temperature=0, **kw)
        ch = r.choices[0]
        assert ch.finish_reason == "tool_calls" and ch.message.tool_calls and len(ch.message.tool_calls) == 1
        call = ch.message.tool_calls[0]
        assert call.type == "function" and call.id.startswith("call_")
        if isinstance(choice, dict):
            assert call.function.name == "add"
        jsonschema.validate(json.loads(call.function.arguments), schemas[call.function.name])
        content, calls, finish = _stream(client, **kw)
        assert finish == "tool_calls" and list(calls) == [0]
        assert (calls[0]["name"], calls[0]["arguments"]) == (call.function.name, call.function.arguments)


def test_a_conversation_with_tool_results_is_served(client: openai.OpenAI) -> None:
    msgs = [
        *MSGS,
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Paris", "days": 1}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny, 21 C"},
    ]
    r = client.chat.completions.create(model="m", messages=msgs, tools=TOOLS, temperature=0, max_tokens=8)
    assert r.choices[0].finish_reason in ("stop", "length", "tool_calls")


def test_a_schema_the_library_rejects_is_a_400_naming_it(client: openai.OpenAI) -> None:
    bad_schema = {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "strin"}}}
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="m", messages=MSGS, max_tokens=8, response_format=bad_schema)
    assert "strin" in str(e.value) and "response_format" in str(e.value)
    bad_tool = [
        {
            "type": "function",
            "function": {"name": "f", "parameters": {"type": "object", "minProperties": "x"}},
        }
    ]
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(
            model="m", messages=MSGS, max_tokens=8, tools=bad_tool, tool_choice="required"
        )
    assert "tools" in str(e.value)
    # and the server keeps serving
    assert (
        client.chat.completions.create(model="m", messages=MSGS, max_tokens=2).choices[0].message is not None
    )


def test_tools_with_tool_choice_auto_reach_the_prompt_and_logprobs_work_under_a_grammar(
    client: openai.OpenAI, server: Served
) -> None:
    tok = Tokenizer.from_gguf(ensure_model("tiny"))
    r = client.chat.completions.create(model="m", messages=MSGS, tools=TOOLS, temperature=0, max_tokens=4)
    prompt = tok.decode((r.model_extra or {})["strata"]["prompt_token_ids"], skip_special=False)
    assert "<tools>" in prompt and '"name": "get_weather"' in prompt
    assert r.choices[0].finish_reason in ("stop", "length", "tool_calls")
    fmt = {"type": "json_schema", "json_schema": {"name": "weather", "schema": WEATHER}}
    r = client.chat.completions.create(
        model="m",
        messages=MSGS,
        temperature=0,
        max_tokens=40,
        response_format=fmt,
        logprobs=True,
        top_logprobs=5,
    )
    json.loads(r.choices[0].message.content or "")
    lp = r.choices[0].logprobs
    assert lp is not None and lp.content
    for entry in lp.content:  # only tokens the grammar allowed have a probability
        assert entry.logprob <= 0 and all(t.logprob <= 0 for t in entry.top_logprobs) and entry.top_logprobs
