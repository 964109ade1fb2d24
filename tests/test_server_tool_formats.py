"""The tool-call syntaxes beyond Qwen3's: gpt-oss (harmony channels), DeepSeek V3/R1 (and V3.1), GLM-4.5
and Mistral/Mixtral, each chosen from the chat template by its markers, parsed whole and while streaming,
and served: a real ``strata serve`` whose model carries the family's template, driven by the ``openai``
client.

The templates here are small jinja2 templates that write the same markers as each family's published
chat template (assistant tool calls, tool results, the generation prompt); a call the template renders
for a past turn is exactly what the model writes, so each parser is checked on the template's own output.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import openai
import pytest
from _strata_server import Served
from gguf import GGUFReader, GGUFValueType, GGUFWriter

from strata.chat_template import ChatTemplate
from strata.model import ensure_model
from strata.server.tools import FORMATS, ToolStream, format_for, grammar_for, parse_calls, tool_spec

pytestmark = pytest.mark.timeout(300)

WEATHER = {
    "type": "object",
    "properties": {"city": {"type": "string"}, "days": {"type": "integer", "minimum": 1, "maximum": 7}},
    "required": ["city", "days"],
    "additionalProperties": False,
}
TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "parameters": WEATHER}},
    {
        "type": "function",
        "function": {
            "name": "add",
            "parameters": {
                "type": "object",
                "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                "required": ["a", "b"],
            },
        },
    },
]
CALLS = [("get_weather", {"city": "Paris", "days": 2}), ("add", {"a": 1, "b": 22})]

# ---- each family's markers, as its chat template writes them --------------------------------------

HARMONY = (
    "{%- for m in messages -%}"
    "{%- if m.role == 'user' -%}<|start|>user<|message|>{{ m.content }}<|end|>"
    "{%- elif m.role == 'tool' -%}<|start|>functions.{{ m.name }} to=assistant<|channel|>commentary<|message|>"
    "{{ m.content | tojson }}<|end|>"
    "{%- elif m.role == 'assistant' and m.tool_calls -%}"
    "{%- for c in m.tool_calls -%}<|start|>assistant<|channel|>commentary to=functions.{{ c.function.name }}"
    " <|constrain|>json<|message|>{{ c.function.arguments }}<|call|>{%- endfor -%}"
    "{%- elif m.role == 'assistant' -%}<|start|>assistant<|channel|>final<|message|>{{ m.content }}<|end|>"
    "{%- endif -%}{%- endfor -%}"
    "{%- if add_generation_prompt -%}<|start|>assistant{%- endif -%}"
)
DEEPSEEK = (
    "{{ bos_token }}{%- for m in messages -%}"
    "{%- if m.role == 'user' -%}<｜User｜>{{ m.content }}"
    "{%- elif m.role == 'tool' -%}<｜tool▁outputs▁begin｜><｜tool▁output▁begin｜>{{ m.content }}"
    "<｜tool▁output▁end｜><｜tool▁outputs▁end｜>"
    "{%- elif m.role == 'assistant' and m.tool_calls -%}<｜Assistant｜><｜tool▁calls▁begin｜>"
    "{%- for c in m.tool_calls -%}{%- if not loop.first %}\n{% endif -%}"
    "<｜tool▁call▁begin｜>{{ c.type }}<｜tool▁sep｜>{{ c.function.name }}\n```json\n{{ c.function.arguments }}"
    "\n```<｜tool▁call▁end｜>{%- endfor -%}<｜tool▁calls▁end｜><｜end▁of▁sentence｜>"
    "{%- elif m.role == 'assistant' -%}<｜Assistant｜>{{ m.content }}<｜end▁of▁sentence｜>"
    "{%- endif -%}{%- endfor -%}{%- if add_generation_prompt -%}<｜Assistant｜>{%- endif -%}"
)
GLM45 = (
    "[gMASK]<sop>{%- if tools -%}<|system|>\n# Tools\n<tools>\n{% for t in tools %}{{ t | tojson }}\n"
    "{% endfor %}</tools>{%- endif -%}"
    "{%- for m in messages -%}"
    "{%- if m.role == 'user' -%}<|user|>\n{{ m.content }}"
    "{%- elif m.role == 'tool' -%}<|observation|><tool_response>\n{{ m.content }}\n</tool_response>"
    "{%- elif m.role == 'assistant' -%}<|assistant|>\n{{ m.content or '' }}"
    "{%- for c in m.tool_calls or [] -%}{%- set args = c.function.arguments -%}"
    "\n<tool_call>{{ c.function.name }}\n{% for k, v in args.items() %}<arg_key>{{ k }}</arg_key>\n"
    "<arg_value>{{ v | tojson(ensure_ascii=False) if v is not string else v }}</arg_value>\n"
    "{% endfor %}</tool_call>{%- endfor -%}"
    "{%- endif -%}{%- endfor -%}{%- if add_generation_prompt -%}<|assistant|>{%- endif -%}"
)
MISTRAL = (
    "{{ bos_token }}{%- for m in messages -%}"
    "{%- if m.role == 'user' -%}{%- if tools and loop.last -%}[AVAILABLE_TOOLS] {{ tools | tojson }}"
    "[/AVAILABLE_TOOLS]{%- endif -%}[INST] {{ m.content }}[/INST]"
    "{%- elif m.role == 'tool' -%}[TOOL_RESULTS] {\"content\": {{ m.content | tojson }}}[/TOOL_RESULTS]"
    "{%- elif m.role == 'assistant' and m.tool_calls -%}[TOOL_CALLS] ["
    '{%- for c in m.tool_calls -%}{"name": "{{ c.function.name }}", "arguments": '
    "{{ c.function.arguments }}}{%- if not loop.last %}, {% endif -%}{%- endfor -%}]{{ eos_token }}"
    "{%- elif m.role == 'assistant' -%}{{ m.content }}{{ eos_token }}"
    "{%- endif -%}{%- endfor -%}"
)
TEMPLATES = {"harmony": HARMONY, "deepseek": DEEPSEEK, "glm45": GLM45, "mistral": MISTRAL}


def _history(family: str) -> list[dict[str, Any]]:
    calls = [
        {
            "id": f"call_{i}",
            "type": "function",
            # GLM's template iterates the arguments as a mapping; the others write the JSON text
            "function": {"name": n, "arguments": a if family == "glm45" else json.dumps(a)},
        }
        for i, (n, a) in enumerate(CALLS)
    ]
    return [
        {"role": "user", "content": "Weather in Paris, and 1 + 22?"},
        {"role": "assistant", "content": None, "tool_calls": calls},
    ]


def _rendered_calls(family: str) -> str:
    """What the family's template writes for the assistant turn that made CALLS."""
    t = ChatTemplate(TEMPLATES[family], bos_token="<s>", eos_token="</s>")
    msgs = _history(family)
    before = t.render(msgs[:1], add_generation_prompt=True)
    whole = t.render(msgs, add_generation_prompt=False)
    assert whole.startswith(before), (before, whole)
    text = whole[len(before) :]
    for end in ("<｜end▁of▁sentence｜>", "</s>"):  # the end-of-turn token is the engine's stop, not text
        text = text.removesuffix(end)
    return text


@pytest.mark.parametrize("family", list(TEMPLATES))
def test_the_family_is_chosen_by_its_template_and_its_calls_parse(family: str) -> None:
    t = ChatTemplate(TEMPLATES[family], bos_token="<s>", eos_token="</s>")
    fmt = format_for(t)
    assert fmt.family == family
    text = "Let me check. " + _rendered_calls(family)
    spec = tool_spec({"tools": TOOLS}, fmt)
    content, calls = parse_calls(text, spec)
    assert [(c.name, json.loads(c.arguments)) for c in calls] == CALLS
    assert content == "Let me check."
    # in any pieces the stream parser gives the same calls and content
    for size in (1, 2, 5, 13, 1000):
        s = ToolStream(spec)
        events = []
        for i in range(0, len(text), size):
            events += s.feed(text[i : i + size])
        events += s.flush()
        got = "".join(x for k, x in events if k == "content" and isinstance(x, str))
        assert got.strip() == content and [(c.name, c.arguments) for c in s.calls] == [
            (c.name, c.arguments) for c in calls
        ]
    # parallel calls off: only the first
    _, one = parse_calls(text, tool_spec({"tools": TOOLS, "parallel_tool_calls": False}, fmt))
    assert [c.name for c in one] == ["get_weather"]


@pytest.mark.parametrize("family", list(TEMPLATES))
def test_a_call_that_does_not_parse_stays_content(family: str) -> None:
    fmt = FORMATS[family]
    spec = tool_spec({"tools": TOOLS}, fmt)
    good = _rendered_calls(family)
    # (the reply, a piece of the call that does not parse, which must come back as content)
    broken = [
        (good.replace('"city": "Paris"', '"city": "Paris" oops'), "oops"),  # not JSON
        (good.replace("get_weather", "rm_rf"), "rm_rf"),  # a function the request did not offer
    ]
    if family == "glm45":  # text after the arguments
        broken[0] = (
            good.replace("</arg_value>\n</tool_call>", "</arg_value>\nstray</tool_call>", 1),
            "stray",
        )
    for text, piece in broken:
        content, calls = parse_calls("ok " + text, spec)
        assert piece in content and content.startswith("ok")
        assert all(c.name == "add" for c in calls)  # the other call still parses (DeepSeek, GLM, harmony)


def test_formats_read_their_other_forms() -> None:
    def one(family: str, text: str) -> list[tuple[str, Any]]:
        _, calls = parse_calls(text, tool_spec({"tools": TOOLS}, FORMATS[family]))
        return [(c.name, json.loads(c.arguments)) for c in calls]

    # harmony: the recipient before the channel (the form gpt-oss's template renders for past calls)
    assert one(
        "harmony",
        "<|channel|>analysis<|message|>think<|end|><|start|>assistant to=functions.add<|channel|>commentary json"
        '<|message|>{"a": 1, "b": 2}<|call|>',
    ) == [("add", {"a": 1, "b": 2})]
    # DeepSeek V3.1: NAME<｜tool▁sep｜>{...}
    assert one(
        "deepseek",
        '<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>add<｜tool▁sep｜>{"a": 3, "b": 4}<｜tool▁call▁end｜><｜tool▁calls▁end｜>',
    ) == [("add", {"a": 3, "b": 4})]
    # newer Mistral releases: [TOOL_CALLS]NAME[ARGS]{...}
    assert one(
        "mistral", '[TOOL_CALLS]add[ARGS]{"a": 5, "b": 6}[TOOL_CALLS]get_weather[ARGS]{"city": "x"}'
    ) == [
        ("add", {"a": 5, "b": 6}),
        ("get_weather", {"city": "x"}),
    ]
    # GLM: a string parameter stays a string even when it looks like JSON
    assert one(
        "glm45", "<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>42</arg_value>\n</tool_call>"
    ) == [("get_weather", {"city": "42"})]


def test_harmony_content_loses_its_framing() -> None:
    spec = tool_spec({"tools": TOOLS}, FORMATS["harmony"])
    content, calls = parse_calls("<|channel|>final<|message|>It is sunny.<|end|>", spec)
    assert content == "It is sunny." and calls == []


@pytest.mark.parametrize("family", list(TEMPLATES))
def test_eager_streaming_sends_the_name_then_argument_pieces(family: str) -> None:
    fmt = FORMATS[family]
    spec = tool_spec({"tools": TOOLS, "tool_choice": "required"}, fmt)
    text = _rendered_calls(family)
    _, whole = parse_calls(text, spec)
    s = ToolStream(spec, eager=True)
    events = []
    for i in range(0, len(text), 3):
        events += s.feed(text[i : i + 3])
    events += s.flush()
    if fmt.head is None:  # arguments that are not JSON as written: each call once it is whole
        assert [k for k, _ in events if k != "content"] == ["call", "call"]
        return
    kinds = [k for k, _ in events if k != "content"]
    assert kinds[0] == "start" and kinds.count("start") == 2 and kinds.count("args") > 2
    assert [(c.name, c.arguments) for c in s.calls] == [(c.name, c.arguments) for c in whole]


@pytest.mark.parametrize("family", list(TEMPLATES))
def test_each_family_has_a_grammar_for_required_calls(family: str) -> None:
    from strata.grammar import grammars_for
    from strata.tokenizer import Tokenizer

    g = grammars_for(Tokenizer.from_gguf(ensure_model("tiny")))
    for choice in ("required", {"type": "function", "function": {"name": "add"}}):
        spec = tool_spec({"tools": TOOLS, "tool_choice": choice}, FORMATS[family])
        assert g.check(grammar_for({}, spec)) == ""


# ---- a real server, with each family's template in the model ---------------------------------------


def _with_template(src: Path, dst: Path, template: str) -> Path:
    """A copy of the model file with another chat template (metadata changed, tensors as they are)."""
    r = GGUFReader(str(src))
    w = GGUFWriter(dst, r.fields["general.architecture"].contents())
    for name, field in r.fields.items():
        if name.startswith("GGUF.") or name in ("general.architecture", "tokenizer.chat_template"):
            continue
        vt = field.types[0]
        w.add_key_value(
            name, field.contents(), vt, sub_type=field.types[-1] if vt == GGUFValueType.ARRAY else None
        )
    w.add_string("tokenizer.chat_template", template)
    for t in r.tensors:
        w.add_tensor_info(t.name, t.data.shape, t.data.dtype, int(t.n_bytes), raw_dtype=t.tensor_type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    for t in r.tensors:
        w.write_tensor_data(t.data)
    w.close()
    return dst


@pytest.fixture(scope="module", params=list(TEMPLATES))
def served(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[str, Served]]:
    model = _with_template(
        ensure_model("tiny"),
        tmp_path_factory.mktemp("fmt") / f"{request.param}.gguf",
        TEMPLATES[request.param],
    )
    s = Served(model, "--max-context", "1024", "--threads", "2", "--quiet")
    yield request.param, s
    assert s.stop() == 0


def test_the_openai_client_gets_each_familys_calls_streamed_and_not(served: tuple[str, Served]) -> None:
    family, server = served
    schemas = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
    msgs = [{"role": "user", "content": "What is the weather in Paris?"}]
    with openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0, timeout=120) as client:
        for choice in ("required", {"type": "function", "function": {"name": "add"}}):
            kw: dict[str, Any] = {
                "tools": TOOLS,
                "tool_choice": choice,
                "parallel_tool_calls": False,
                "max_tokens": 300,
            }
            r = client.chat.completions.create(model="m", messages=msgs, temperature=0, **kw)  # type: ignore[arg-type]
            ch = r.choices[0]
            assert ch.finish_reason == "tool_calls", (family, ch)
            assert ch.message.tool_calls and len(ch.message.tool_calls) == 1
            call = ch.message.tool_calls[0]
            assert call.id.startswith("call_") and (
                not isinstance(choice, dict) or call.function.name == "add"
            )
            jsonschema.validate(json.loads(call.function.arguments), schemas[call.function.name])
            # streamed: the id and name first, then the arguments in deltas; the same call
            first, name, args, finish, n_deltas = None, None, "", None, 0
            stream = client.chat.completions.create(
                model="m", messages=msgs, temperature=0, stream=True, **kw
            )  # type: ignore[arg-type]
            for chunk in stream:
                for c in chunk.choices:
                    finish = c.finish_reason or finish
                    assert not (c.delta.content or "").strip(), c.delta.content
                    for tc in c.delta.tool_calls or []:
                        if tc.id is not None:
                            assert first is None and tc.function.name and not tc.function.arguments
                            first, name = tc.id, tc.function.name
                        else:
                            assert first is not None and tc.index == 0
                            args += tc.function.arguments or ""
                            n_deltas += 1
            assert finish == "tool_calls" and n_deltas >= 1
            assert (name, json.loads(args)) == (call.function.name, json.loads(call.function.arguments))
        # a past call and its result go back through the family's template
        history = [
            *msgs,
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "call_1",
                        "type": "function",
                        "function": {"name": "add", "arguments": '{"a": 1, "b": 2}'},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": "call_1", "name": "add", "content": "3"},
        ]
        if family == "glm45":  # GLM's template reads the arguments as a mapping
            history[1]["tool_calls"][0]["function"]["arguments"] = {"a": 1, "b": 2}  # type: ignore[index]
        r = client.chat.completions.create(
            model="m", messages=history, tools=TOOLS, temperature=0, max_tokens=4
        )  # type: ignore[arg-type]
        assert r.choices[0].finish_reason in ("stop", "length", "tool_calls")
