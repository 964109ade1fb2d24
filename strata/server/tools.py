"""Tool calls and structured output: the request's ``tools``, ``tool_choice``, ``parallel_tool_calls``
and ``response_format`` checked, the grammar that enforces them, and the model's tool-call syntax parsed
back into OpenAI's ``tool_calls``.

A model family writes its calls in a syntax of its own; ``FORMATS`` holds one ``ToolFormat`` per family
and ``format_for`` picks it from the chat template. Qwen3 (and every ChatML template) writes each call as
``<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>``; gpt-oss as a harmony message to
``functions.NAME`` on the commentary channel; DeepSeek V3/R1 between ``<｜tool▁call▁begin｜>`` and
``<｜tool▁call▁end｜>`` with the arguments in a fenced json block; GLM-4.5 as ``<tool_call>NAME`` with
``<arg_key>``/``<arg_value>`` pairs; Mistral/Mixtral as ``[TOOL_CALLS]`` and a JSON list. A template
that does not render tools itself (no ``tools`` in its source, as in the made models' template) gets the
tool list in its system message and past calls in the assistant turns, written by the format here.

What the model writes is parsed after the fact (``parse_calls``) or while it streams (``ToolStream``).
A block that is not a JSON object with a ``name`` of one of the request's tools and object (or string)
``arguments`` stays in the reply's content, as written: a call is never dropped. With ``tool_choice``
``required`` or a named function the grammar (``strata.grammar``) makes the model write calls that
parse, with arguments that fit each tool's ``parameters`` schema; ``response_format`` does the same for
a JSON reply.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..chat_template import ChatTemplate
from ..grammar import GrammarError, json_lark, json_schema_grammar, lark_grammar
from .errors import bad

__all__ = [
    "DEFAULT_FORMAT",
    "FORMATS",
    "ToolCall",
    "ToolFormat",
    "ToolSpec",
    "ToolStream",
    "format_for",
    "grammar_for",
    "parse_calls",
    "prepare_messages",
    "tool_spec",
]


# parse(text between open and close, the request's parameter schemas by tool name) -> the calls in it
# (most formats hold one call per block), or None when it is not a call
Parse = Callable[[str, dict[str, Any]], "list[tuple[str, Any]] | None"]


@dataclass(frozen=True)
class ToolFormat:
    """One family's tool-call syntax."""

    family: str
    open: str  # what opens one call
    close: str  # what closes it ('' for a call that runs to the end of the reply)
    separator: str  # between two calls
    system: Callable[[list[dict[str, Any]]], str]  # the tool list, as the system message's addition
    call: Callable[[str, Any], str]  # one call (name, arguments) as the model writes it
    parse: Parse
    # a call's text from after ``open`` up to its arguments (group 1: the name), where the arguments are
    # JSON written as they come (so that they can stream); None: a call is sent once it is whole
    head: re.Pattern[str] | None
    tail: re.Pattern[str]  # what follows the arguments up to ``close``
    marks: tuple[str, ...] = ()  # texts in a chat template that say it is this family's
    keep: tuple[str, ...] = ()  # control tokens whose text the parser reads (default: open and close)
    drop: tuple[str, ...] = ()  # framing the model writes around calls, which is not content
    # the Lark rule body of one whole call of a tool (name, parameters schema, rule prefix for helpers)
    # -> lines of rules, the first named ``prefix``; None: open, the call as JSON, close
    lark: Callable[[str, dict[str, Any], str], list[str]] | None = None
    wrap: tuple[str, str] = ("", "")  # what a reply's calls are written inside, for the grammar

    def block(self, name: str, arguments: Any) -> str:
        return self.open + self.call(name, arguments) + self.close

    @property
    def kept(self) -> tuple[str, ...]:
        return self.keep or tuple(x for x in (self.open, self.close) if x)


def _as_json(arguments: Any) -> Any:
    if isinstance(arguments, str):
        try:
            return json.loads(arguments)
        except ValueError:
            pass
    return arguments


def _args_text(arguments: Any) -> str:
    a = _as_json(arguments)
    return a if isinstance(a, str) else json.dumps(a, ensure_ascii=False)


def _json_call(name: str, arguments: Any) -> str:
    return "\n" + json.dumps({"name": name, "arguments": _as_json(arguments)}, ensure_ascii=False) + "\n"


def _name_args(obj: Any) -> tuple[str, Any] | None:
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return None
    args = obj.get("arguments", obj.get("parameters", {}))
    if not isinstance(args, (dict, str)):
        return None
    return obj["name"], args


def _json_parse(inner: str, params: dict[str, Any] | None = None) -> list[tuple[str, Any]] | None:
    try:
        got = _name_args(json.loads(inner))
    except ValueError:
        return None
    return None if got is None else [got]


def _json_system(tools: list[dict[str, Any]]) -> str:
    lines = "\n".join(json.dumps(t, ensure_ascii=False) for t in tools)
    return (
        "# Tools\n\nThese functions are available; call any of them when it helps to answer. Their "
        "signatures are inside <tools></tools>:\n<tools>\n" + lines + "\n</tools>\n\nTo call one, write "
        "a JSON object with its name and arguments between <tool_call></tool_call> tags:\n<tool_call>\n"
        '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>'
    )


def _system_with(example: str) -> Callable[[list[dict[str, Any]]], str]:
    """The tool list and one example call in a family's own syntax (for templates that do not render
    tools themselves)."""

    def system(tools: list[dict[str, Any]]) -> str:
        lines = "\n".join(json.dumps(t, ensure_ascii=False) for t in tools)
        return (
            "# Tools\n\nThese functions are available; call any of them when it helps to answer:\n"
            + lines
            + "\n\nTo call one, write:\n"
            + example
        )

    return system


_NAME = r"([A-Za-z0-9_.\-]+)"
_JSON_TAIL = re.compile(r"\s*$")

# gpt-oss (harmony): a call is a message on the commentary channel to the recipient functions.NAME, with
# the recipient in the channel's header or before it: `<|channel|>commentary to=functions.NAME
# <|constrain|>json<|message|>{...}<|call|>` or `<|start|>assistant to=functions.NAME<|channel|>commentary
# json<|message|>{...}<|call|>`. The framing tokens around it are dropped from the content.
_HARMONY_HEAD = re.compile(
    _NAME + r"\s*(?:<\|channel\|>\s*commentary)?\s*(?:<\|constrain\|>)?\s*(?:json)?\s*<\|message\|>"
)


def _harmony_parse(inner: str, params: dict[str, Any]) -> list[tuple[str, Any]] | None:
    m = _HARMONY_HEAD.match(inner)
    if m is None:
        return None
    try:
        args = json.loads(inner[m.end() :])
    except ValueError:
        return None
    return [(m.group(1), args)] if isinstance(args, dict) else None


def _harmony_lark(name: str, params: dict[str, Any], p: str) -> list[str]:
    head = json.dumps(f"<|channel|>commentary to=functions.{name} <|constrain|>json<|message|>")
    return [f'{p}: {head} {p}_j "<|call|>"', f"{p}_j: {json_lark(params)}"]


# DeepSeek V3 / R1: `<｜tool▁calls▁begin｜>` then per call `<｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME\n
# ```json\n{...}\n```<｜tool▁call▁end｜>`, then `<｜tool▁calls▁end｜>`; V3.1 writes `NAME<｜tool▁sep｜>{...}`
# inside the same call markers. Both are read.
_DS = {
    "calls_begin": "<｜tool▁calls▁begin｜>",
    "calls_end": "<｜tool▁calls▁end｜>",
    "begin": "<｜tool▁call▁begin｜>",
    "end": "<｜tool▁call▁end｜>",
    "sep": "<｜tool▁sep｜>",
}
_DS_HEAD = re.compile(
    r"(?:function\s*<｜tool▁sep｜>\s*" + _NAME + r"\s*```(?:json)?\s*|" + _NAME + r"<｜tool▁sep｜>\s*)"
)
# for streaming: the name, up to where the arguments start (the fence's "json" must be there to know that)
_DS_HEAD_ONE = re.compile(
    r"(?:function\s*<｜tool▁sep｜>\s*)?" + _NAME + r"(?:\s*```json\s*|<｜tool▁sep｜>\s*)"
)


def _deepseek_parse(inner: str, params: dict[str, Any]) -> list[tuple[str, Any]] | None:
    m = _DS_HEAD.match(inner)
    if m is None:
        return None
    body = inner[m.end() :].strip()
    if m.group(1) is not None:  # V3: the arguments in a fenced json block
        if not body.endswith("```"):
            return None
        body = body[:-3]
    try:
        args = json.loads(body)
    except ValueError:
        return None
    return [(m.group(1) or m.group(2), args)] if isinstance(args, dict) else None


def _deepseek_call(name: str, arguments: Any) -> str:
    return f"function{_DS['sep']}{name}\n```json\n{_args_text(arguments)}\n```"


def _deepseek_lark(name: str, params: dict[str, Any], p: str) -> list[str]:
    head = json.dumps(f"{_DS['begin']}function{_DS['sep']}{name}\n```json\n")
    return [f"{p}: {head} {p}_j {json.dumps(chr(10) + '```' + _DS['end'])}", f"{p}_j: {json_lark(params)}"]


# GLM-4.5: `<tool_call>NAME\n<arg_key>K</arg_key>\n<arg_value>V</arg_value>\n...</tool_call>`; a string
# value is written as it is, any other as JSON. A value is read back as JSON unless the tool's schema
# says the parameter is a string (or it is not JSON).
_GLM_ARG = re.compile(r"<arg_key>(.*?)</arg_key>\s*<arg_value>(.*?)</arg_value>", re.DOTALL)


def _glm_parse(inner: str, params: dict[str, Any]) -> list[tuple[str, Any]] | None:
    m = re.match(r"\s*" + _NAME + r"\s*", inner)
    if m is None:
        return None
    props = (params.get(m.group(1)) or {}).get("properties") or {}
    args: dict[str, Any] = {}
    pos = m.end()
    for a in _GLM_ARG.finditer(inner, pos):
        if inner[pos : a.start()].strip():
            return None  # text between the arguments: not a call
        key, raw = a.group(1).strip(), a.group(2)
        if (props.get(key) or {}).get("type") == "string":
            args[key] = raw
        else:
            try:
                args[key] = json.loads(raw)
            except ValueError:
                args[key] = raw
        pos = a.end()
    if inner[pos:].strip():
        return None
    return [(m.group(1), args)]


def _glm_call(name: str, arguments: Any) -> str:
    a = _as_json(arguments)
    if not isinstance(a, dict):
        a = {}
    kv = "".join(
        f"<arg_key>{k}</arg_key>\n<arg_value>{v if isinstance(v, str) else json.dumps(v, ensure_ascii=False)}"
        "</arg_value>\n"
        for k, v in a.items()
    )
    return f"{name}\n{kv}"


def _glm_lark(name: str, params: dict[str, Any], p: str) -> list[str]:
    """The required parameters first, each once and in the schema's order, then any optional ones; a
    string value is free text without '<', any other the JSON its schema allows."""
    props = params.get("properties") or {}
    required = [k for k in props if k in set(params.get("required") or [])]
    rules, arg = [], {}
    for i, (k, sch) in enumerate(props.items()):
        v = "/[^<]*/" if (sch or {}).get("type") == "string" else f"{p}_v{i}"
        if v != "/[^<]*/":
            rules.append(f"{p}_v{i}: {json_lark(sch or {})}")
        arg[k] = json.dumps(f"<arg_key>{k}</arg_key>\n<arg_value>") + f" {v} " + json.dumps("</arg_value>\n")
    body = "".join(f" {arg[k]}" for k in required)
    optional = [arg[k] for k in props if k not in required]
    body += f" ({' | '.join(optional)})*" if optional else ""
    return [f'{p}: {json.dumps("<tool_call>" + name + chr(10))}{body} "</tool_call>"', *rules]


# Mistral / Mixtral: `[TOOL_CALLS]` then a JSON list of {"name", "arguments"} objects up to the end of the
# reply (Mixtral 8x22B, Mistral v0.3); newer releases write `[TOOL_CALLS]NAME[ARGS]{...}` per call.
def _mistral_parse(inner: str, params: dict[str, Any]) -> list[tuple[str, Any]] | None:
    out: list[tuple[str, Any]] = []
    for part in (x.strip() for x in inner.split("[TOOL_CALLS]")):
        if not part:
            continue
        m = re.match(_NAME + r"\[ARGS\]", part)
        try:
            if m is not None:
                args = json.loads(part[m.end() :])
                if not isinstance(args, dict):
                    return None
                out.append((m.group(1), args))
                continue
            items = json.loads(part)
        except ValueError:
            return None
        for item in items if isinstance(items, list) else [items]:
            got = _name_args(item)
            if got is None:
                return None
            out.append(got)
    return out or None


def _mistral_call(name: str, arguments: Any) -> str:
    return " " + json.dumps([{"name": name, "arguments": _as_json(arguments)}], ensure_ascii=False)


def _mistral_lark(name: str, params: dict[str, Any], p: str) -> list[str]:
    return [f'{p}: "[TOOL_CALLS] [" {p}_j "]"', f"{p}_j: {json_lark(_call_schema_for(name, params))}"]


FORMATS: dict[str, ToolFormat] = {
    # families whose own tags are checked before qwen3's: GLM's calls open with qwen3's tag too
    "glm45": ToolFormat(
        "glm45",
        "<tool_call>",
        "</tool_call>",
        "\n",
        _system_with("<tool_call>NAME\n<arg_key>KEY</arg_key>\n<arg_value>VALUE</arg_value>\n</tool_call>"),
        _glm_call,
        _glm_parse,
        None,
        re.compile(r"\s*$"),
        ("<arg_key>",),
        keep=("<tool_call>", "</tool_call>", "<arg_key>", "</arg_key>", "<arg_value>", "</arg_value>"),
        lark=_glm_lark,
    ),
    "harmony": ToolFormat(
        "harmony",
        "to=functions.",
        "<|call|>",
        "",
        _system_with(
            "<|channel|>commentary to=functions.NAME <|constrain|>json<|message|>{ARGUMENTS}<|call|>"
        ),
        lambda name, arguments: f"{name} <|constrain|>json<|message|>{_args_text(arguments)}",
        _harmony_parse,
        _HARMONY_HEAD,
        _JSON_TAIL,
        ("to=functions.", "<|channel|>"),
        keep=("<|start|>", "<|channel|>", "<|constrain|>", "<|message|>", "<|call|>", "<|end|>"),
        drop=(
            "<|start|>assistant",
            "<|channel|>analysis",
            "<|channel|>commentary",
            "<|channel|>final",
            "<|message|>",
            "<|end|>",
        ),
        lark=_harmony_lark,
    ),
    "deepseek": ToolFormat(
        "deepseek",
        _DS["begin"],
        _DS["end"],
        "\n",
        _system_with(
            _DS["calls_begin"]
            + _DS["begin"]
            + _deepseek_call("NAME", "{ARGUMENTS}")
            + _DS["end"]
            + _DS["calls_end"]
        ),
        _deepseek_call,
        _deepseek_parse,
        _DS_HEAD_ONE,
        re.compile(r"\s*(?:```)?\s*$"),
        (_DS["calls_begin"],),
        keep=tuple(_DS.values()),
        drop=(_DS["calls_begin"], _DS["calls_end"]),
        lark=_deepseek_lark,
        wrap=(_DS["calls_begin"], _DS["calls_end"]),
    ),
    "mistral": ToolFormat(
        "mistral",
        "[TOOL_CALLS]",
        "",
        "",
        _system_with('[TOOL_CALLS] [{"name": NAME, "arguments": {ARGUMENTS}}]'),
        _mistral_call,
        _mistral_parse,
        None,
        _JSON_TAIL,
        ("[TOOL_CALLS]",),
        lark=_mistral_lark,
    ),
    "qwen3": ToolFormat(
        "qwen3",
        "<tool_call>",
        "</tool_call>",
        "\n",
        _json_system,
        _json_call,
        _json_parse,
        re.compile(r'\s*\{\s*"name"\s*:\s*"((?:[^"\\]|\\.)*)"\s*,\s*"arguments"\s*:\s*'),
        re.compile(r"\s*\}\s*(</tool_call>)?\s*$"),
        ("<tool_call>", "<|im_start|>"),
    ),
}
DEFAULT_FORMAT = (
    "qwen3"  # for a template that names no family's marks (the made models' ChatML, the fallback)
)


def format_for(template: ChatTemplate) -> ToolFormat:
    """The tool-call syntax of the template's family: the first format in ``FORMATS`` whose marks the
    template's source holds (a family's own tag before a shared turn marker), else ``DEFAULT_FORMAT``."""
    for mark_index in range(max((len(f.marks) for f in FORMATS.values()), default=0)):
        for f in FORMATS.values():
            if mark_index < len(f.marks) and f.marks[mark_index] in template.source:
                return f
    return FORMATS[DEFAULT_FORMAT]


# ---- the request -------------------------------------------------------------------------------


@dataclass
class ToolSpec:
    """The request's tool fields, checked."""

    tools: list[dict[str, Any]]  # OpenAI's tool objects, as sent
    choice: str  # auto, none, required, or "function" (a named one: ``named``)
    parallel: bool
    named: str = ""
    fmt: ToolFormat = field(default_factory=lambda: FORMATS["qwen3"])

    @property
    def names(self) -> list[str]:
        return [t["function"]["name"] for t in self.tools]

    @property
    def active(self) -> bool:
        """Whether the reply is parsed for calls."""
        return bool(self.tools) and self.choice != "none"


def tool_spec(body: dict[str, Any], fmt: ToolFormat) -> ToolSpec | None:
    """The request's tools (None without any); 400 for anything OpenAI's API would refuse."""
    tools = body.get("tools")
    choice_v = body.get("tool_choice")
    if tools is None or tools == []:
        if choice_v not in (None, "none", "auto"):
            raise bad("tool_choice", "needs tools: send the functions in 'tools'")
        return None
    if not isinstance(tools, list):
        raise bad("tools", "must be a list of {type: function, function: {name, parameters}} objects")
    seen: set[str] = set()
    for i, t in enumerate(tools):
        where = f"tools[{i}]"
        if (
            not isinstance(t, dict)
            or t.get("type", "function") != "function"
            or not isinstance(t.get("function"), dict)
        ):
            raise bad(where, 'must be {"type": "function", "function": {"name": ..., "parameters": {...}}}')
        fn = t["function"]
        name = fn.get("name")
        if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z0-9_.\-]{1,64}", name):
            raise bad(f"{where}.function.name", "must be 1 to 64 letters, digits, '_', '.' or '-'")
        if name in seen:
            raise bad(f"{where}.function.name", f"{name!r} is defined twice")
        seen.add(name)
        params = fn.get("parameters")
        if params is not None and not isinstance(params, dict):
            raise bad(f"{where}.function.parameters", "must be a JSON schema object")
    parallel = body.get("parallel_tool_calls", True)
    if not isinstance(parallel, bool):
        raise bad("parallel_tool_calls", "must be true or false")
    named = ""
    if choice_v is None:
        choice = "auto"
    elif choice_v in ("auto", "none", "required"):
        choice = str(choice_v)
    elif (
        isinstance(choice_v, dict)
        and choice_v.get("type") == "function"
        and isinstance(choice_v.get("function"), dict)
    ):
        named = choice_v["function"].get("name")
        if named not in seen:
            raise bad(
                "tool_choice",
                f"names the function {named!r}, which is not in tools ({', '.join(sorted(seen))})",
            )
        choice = "function"
    else:
        raise bad(
            "tool_choice",
            'must be \'auto\', \'none\', \'required\' or {"type": "function", "function": {"name": ...}}',
        )
    return ToolSpec([dict(t, type="function") for t in tools], choice, parallel, named, fmt)


def prepare_messages(
    messages: Any, spec: ToolSpec | None, template: ChatTemplate
) -> tuple[Any, list[Any] | None]:
    """The messages and tool list the template gets: written into the turns by the format where the
    template does not render tools (or past calls) itself."""
    if not isinstance(messages, list):
        return messages, (spec.tools if spec else None)
    tools = spec.tools if spec is not None and spec.choice != "none" else None
    fmt = spec.fmt if spec is not None else FORMATS["qwen3"]
    renders_tools = "tools" in template.source and not template.is_fallback
    renders_calls = "tool_calls" in template.source and not template.is_fallback
    out = list(messages)
    if not renders_calls:
        for i, m in enumerate(out):
            if isinstance(m, dict) and m.get("role") == "assistant" and isinstance(m.get("tool_calls"), list):
                blocks = []
                for c in m["tool_calls"]:
                    fn = c.get("function") if isinstance(c, dict) else None
                    if isinstance(fn, dict) and isinstance(fn.get("name"), str):
                        blocks.append(fmt.block(fn["name"], fn.get("arguments", {})))
                text = m.get("content") if isinstance(m.get("content"), str) else ""
                out[i] = {k: v for k, v in m.items() if k != "tool_calls"}
                out[i]["content"] = "\n".join(x for x in [text, *blocks] if x)
    if tools and not renders_tools:
        addition = fmt.system(tools)
        if (
            out
            and isinstance(out[0], dict)
            and out[0].get("role") in ("system", "developer")
            and isinstance(out[0].get("content"), str)
        ):
            out[0] = dict(out[0], content=out[0]["content"] + "\n\n" + addition)
        else:
            out.insert(0, {"role": "system", "content": addition})
        tools = None
    return out, tools


# ---- the grammar -------------------------------------------------------------------------------


def _call_schema_for(name: str, params: dict[str, Any]) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": {"name": {"const": name}, "arguments": params},
        "required": ["name", "arguments"],
        "additionalProperties": False,
    }


def _params(t: dict[str, Any]) -> dict[str, Any]:
    return t["function"].get("parameters") or {"type": "object", "properties": {}}


def grammar_for(body: dict[str, Any], spec: ToolSpec | None) -> str:
    """The grammar the reply must follow ('' for none): tool calls for tool_choice required or named,
    else the response_format's JSON. 400 for a response_format that is not one."""
    if spec is not None and spec.choice in ("required", "function"):
        fmt = spec.fmt
        tools = [t for t in spec.tools if spec.choice == "required" or t["function"]["name"] == spec.named]
        many = spec.parallel and spec.choice == "required"
        sep = json.dumps(fmt.separator) + " " if fmt.separator else ""
        o, c = (json.dumps(x) + " " if x else "" for x in fmt.wrap)
        lines = [f"start: {o}call{f' ({sep}call)*' if many else ''}{' ' + c.strip() if c else ''}"]
        if fmt.lark is None:  # open, the call as one JSON object, close
            schemas = [_call_schema_for(t["function"]["name"], _params(t)) for t in tools]
            schema = schemas[0] if len(schemas) == 1 else {"anyOf": schemas}
            oc = (json.dumps(x) for x in (fmt.open + "\n", "\n" + fmt.close))
            lines += [f"call: {next(oc)} body {next(oc)}", f"body: {json_lark(schema)}"]
        else:
            lines.append("call: " + " | ".join(f"call{i}" for i in range(len(tools))))
            for i, t in enumerate(tools):
                lines += fmt.lark(t["function"]["name"], _params(t), f"call{i}")
        return lark_grammar("\n".join(lines) + "\n")
    rf = body.get("response_format")
    if rf is None:
        return ""
    if not isinstance(rf, dict) or rf.get("type") not in ("text", "json_object", "json_schema"):
        raise bad(
            "response_format",
            'must be {"type": "text"}, {"type": "json_object"} or '
            '{"type": "json_schema", "json_schema": {"name": ..., "schema": {...}}}',
        )
    if rf["type"] == "text":
        return ""
    if rf["type"] == "json_object":
        return json_schema_grammar({"type": "object"})
    js = rf.get("json_schema")
    if not isinstance(js, dict) or not isinstance(js.get("schema", {}), dict):
        raise bad("response_format.json_schema", "must be an object with a 'schema' (a JSON schema object)")
    try:
        return json_schema_grammar(js.get("schema") or {"type": "object"})
    except GrammarError as e:
        raise bad(
            "response_format.json_schema.schema", f"is not a schema the grammar library accepts: {e}"
        ) from None


# ---- the reply ---------------------------------------------------------------------------------


@dataclass
class ToolCall:
    name: str
    arguments: str  # JSON text, as OpenAI sends it
    id: str = field(default_factory=lambda: "call_" + uuid.uuid4().hex[:24])

    def message(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "type": "function",
            "function": {"name": self.name, "arguments": self.arguments},
        }


def _to_calls(spec: ToolSpec, inner: str) -> list[ToolCall] | None:
    params = {t["function"]["name"]: _params(t) for t in spec.tools}
    got = spec.fmt.parse(inner.strip(), params)
    if not got or any(name not in spec.names for name, _ in got):
        return None
    if len(got) > 1:
        return [ToolCall(name, _args_text(args) if not isinstance(args, str) else args) for name, args in got]
    name, args = got[0]
    if isinstance(args, str):
        return [ToolCall(name, args)]
    # the arguments as the model wrote them, where they can be cut out of the call (as a stream sends them)
    inner = inner.strip()
    head = spec.fmt.head
    m, t = (head.match(inner) if head else None), spec.fmt.tail.search(inner)
    if m is not None and t is not None and m.end() <= t.start():
        raw = inner[m.end() : t.start()]
        try:
            if json.loads(raw) == args:
                return [ToolCall(name, raw)]
        except ValueError:
            pass
    return [ToolCall(name, json.dumps(args, ensure_ascii=False))]


def parse_calls(text: str, spec: ToolSpec) -> tuple[str, list[ToolCall]]:
    """(content, calls) of a whole reply: every block that parses becomes a call (only the first when
    parallel calls are off); the rest of the text, unparsed blocks included, is the content."""
    s = ToolStream(spec)
    content = "".join(x for kind, x in s.feed(text) + s.flush() if kind == "content" and isinstance(x, str))
    return content.strip(), s.calls


class ToolStream:
    """Splits streamed text into content and calls. ``feed`` and ``flush`` return events: ("content",
    text), ("call", ToolCall) for a whole call, and, when ``eager``, ("start", ToolCall) as soon as a
    call's name is known and ("args", text) for each piece of its arguments after it.

    Text that could open a call (or be the format's framing, ``drop``, which is removed) is held until it
    is known. Without ``eager`` a call is held until it closes (or the reply ends) and then parsed, so that
    one that does not parse can go out as content. ``eager`` is for replies whose grammar makes every call
    parse (tool_choice required or named): the arguments then stream as the model writes them, as OpenAI
    streams them, in formats whose arguments are JSON as written (``ToolFormat.head``); in the others a
    call goes out once it is whole."""

    def __init__(self, spec: ToolSpec, *, eager: bool = False) -> None:
        self.spec = spec
        self.eager = eager and spec.fmt.head is not None
        self.buf = ""
        self.inside = False
        self.started: ToolCall | None = None  # eager: the call whose arguments are streaming
        self.sent = 0  # eager: how much of buf has gone out as arguments
        self.calls: list[ToolCall] = []

    def _done_calling(self) -> bool:
        return bool(self.calls) and not self.spec.parallel

    def _next_mark(self) -> tuple[int, str]:
        """The first opening or framing text in buf (-1 and '' when none)."""
        marks = (() if self._done_calling() else (self.spec.fmt.open,)) + self.spec.fmt.drop
        best = (-1, "")
        for m in marks:
            i = self.buf.find(m)
            if i >= 0 and (best[0] < 0 or i < best[0] or (i == best[0] and len(m) > len(best[1]))):
                best = (i, m)
        return best

    def _held(self) -> int:
        """How much of buf's end could be the start of an opening or framing text."""
        marks = (() if self._done_calling() else (self.spec.fmt.open,)) + self.spec.fmt.drop
        n_max = min(max((len(m) for m in marks), default=1) - 1, len(self.buf))
        return next((n for n in range(n_max, 0, -1) if any(m.startswith(self.buf[-n:]) for m in marks)), 0)

    def feed(self, text: str) -> list[tuple[str, str | ToolCall]]:
        out: list[tuple[str, str | ToolCall]] = []
        self.buf += text
        o, c = self.spec.fmt.open, self.spec.fmt.close
        while self.buf:
            if not self.inside:
                i, mark = self._next_mark()
                if i < 0:
                    keep = self._held()
                    if len(self.buf) > keep:
                        out.append(("content", self.buf[: len(self.buf) - keep]))
                    self.buf = self.buf[len(self.buf) - keep :]
                    return out
                if i > 0:
                    out.append(("content", self.buf[:i]))
                if mark != o:  # framing: not content
                    self.buf = self.buf[i + len(mark) :]
                    continue
                self.buf = self.buf[i:]
                self.inside = True
            j = self.buf.find(c, len(o)) if c else -1  # no closing text: the call runs to the end
            if self.eager:
                out.extend(self._eager(j))
            if j < 0:
                return out
            block, self.buf = self.buf[: j + len(c)], self.buf[j + len(c) :]
            self.inside = False
            if self.started is not None:
                self.started, self.sent = None, 0
            else:
                out.extend(self._finish(block))
        return out

    def _eager(self, j: int) -> list[tuple[str, str | ToolCall]]:
        """Start the call once its name is known; send its arguments up to what could be its end."""
        fmt = self.spec.fmt
        assert fmt.head is not None
        out: list[tuple[str, str | ToolCall]] = []
        if self.started is None:
            m = fmt.head.match(self.buf, len(fmt.open))
            if m is None or m.end() >= len(self.buf):
                return []
            try:
                name = json.loads('"' + m.group(1) + '"')
            except ValueError:
                return []
            if name not in self.spec.names:
                return []
            self.started = ToolCall(name, "")
            self.calls.append(self.started)
            self.sent = m.end()
            out.append(("start", self.started))
        end = j if j >= 0 else max(self.sent, len(self.buf) - len(fmt.close) - 8)
        piece = self.buf[self.sent : end]
        if j >= 0:
            t = fmt.tail.search(piece)
            piece = piece[: t.start()] if t else piece
        if piece:
            self.started.arguments += piece
            out.append(("args", piece))
        self.sent = max(self.sent, end)
        return out

    def _finish(self, block: str) -> list[tuple[str, str | ToolCall]]:
        o, c = self.spec.fmt.open, self.spec.fmt.close
        inner = block[len(o) :]
        inner = inner[: -len(c)] if c and inner.endswith(c) else inner
        calls = _to_calls(self.spec, inner)
        if calls is None:
            return [("content", block)]
        if not self.spec.parallel:  # one call: the first of a block that holds several
            calls = calls[:1]
        self.calls.extend(calls)
        return [("call", x) for x in calls]

    def flush(self) -> list[tuple[str, str | ToolCall]]:
        """What is held at the end: an unclosed call is parsed too (the model may end its turn there)."""
        if not self.buf:
            return []
        if self.started is not None:  # the reply ended inside a streaming call: the rest of its arguments
            piece = self.buf[self.sent :]
            t = self.spec.fmt.tail.search(piece)
            piece = piece[: t.start()] if t else piece
            self.buf, self.inside, self.started = "", False, None
            return [("args", piece)] if piece else []
        block, self.buf = self.buf, ""
        if self.inside:
            self.inside = False
            return self._finish(block)
        return [("content", block)]
