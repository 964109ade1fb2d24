"""Tool calls and structured output: the request's ``tools``, ``tool_choice``, ``parallel_tool_calls``
and ``response_format`` checked, the grammar that enforces them, and the model's tool-call syntax parsed
back into OpenAI's ``tool_calls``.

A model family writes its calls in a syntax of its own; ``FORMATS`` holds one ``ToolFormat`` per family
and ``format_for`` picks it from the chat template. Qwen3 (and every ChatML template) writes each call as
``<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>``. A template that does not render tools
itself (no ``tools`` in its source, as in the made models' template) gets the tool list in its system
message and past calls in the assistant turns, written by the format here.

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


@dataclass(frozen=True)
class ToolFormat:
    """One family's tool-call syntax."""

    family: str
    open: str  # what opens one call
    close: str  # what closes it
    separator: str  # between two calls
    system: Callable[[list[dict[str, Any]]], str]  # the tool list, as the system message's addition
    call: Callable[[str, Any], str]  # one call (name, arguments) as the model writes it
    parse: Callable[[str], tuple[str, Any] | None]  # the text between open and close -> (name, arguments)
    head: re.Pattern[str]  # a call's text from after ``open`` up to its arguments (group 1: the name)
    tail: re.Pattern[str]  # what follows the arguments up to ``close``
    marks: tuple[str, ...] = ()  # texts in a chat template that say it is this family's

    def block(self, name: str, arguments: Any) -> str:
        return self.open + self.call(name, arguments) + self.close


def _json_call(name: str, arguments: Any) -> str:
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except ValueError:
            pass
    return "\n" + json.dumps({"name": name, "arguments": arguments}, ensure_ascii=False) + "\n"


def _json_parse(inner: str) -> tuple[str, Any] | None:
    try:
        obj = json.loads(inner)
    except ValueError:
        return None
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return None
    args = obj.get("arguments", obj.get("parameters", {}))
    if not isinstance(args, (dict, str)):
        return None
    return obj["name"], args


def _json_system(tools: list[dict[str, Any]]) -> str:
    lines = "\n".join(json.dumps(t, ensure_ascii=False) for t in tools)
    return (
        "# Tools\n\nThese functions are available; call any of them when it helps to answer. Their "
        "signatures are inside <tools></tools>:\n<tools>\n" + lines + "\n</tools>\n\nTo call one, write "
        "a JSON object with its name and arguments between <tool_call></tool_call> tags:\n<tool_call>\n"
        '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>'
    )


FORMATS: dict[str, ToolFormat] = {
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


def _call_schema(t: dict[str, Any]) -> dict[str, Any]:
    fn = t["function"]
    params = fn.get("parameters") or {"type": "object", "properties": {}}
    return {
        "type": "object",
        "properties": {"name": {"const": fn["name"]}, "arguments": params},
        "required": ["name", "arguments"],
        "additionalProperties": False,
    }


def grammar_for(body: dict[str, Any], spec: ToolSpec | None) -> str:
    """The grammar the reply must follow ('' for none): tool calls for tool_choice required or named,
    else the response_format's JSON. 400 for a response_format that is not one."""
    if spec is not None and spec.choice in ("required", "function"):
        tools = [t for t in spec.tools if spec.choice == "required" or t["function"]["name"] == spec.named]
        schemas = [_call_schema(t) for t in tools]
        schema = schemas[0] if len(schemas) == 1 else {"anyOf": schemas}
        o, c, sep = (json.dumps(x) for x in (spec.fmt.open + "\n", "\n" + spec.fmt.close, spec.fmt.separator))
        many = spec.parallel and spec.choice == "required"
        lark = (
            f"start: call{f' ({sep} call)*' if many else ''}\ncall: {o} body {c}\nbody: {json_lark(schema)}\n"
        )
        return lark_grammar(lark)
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


def _to_call(spec: ToolSpec, inner: str) -> ToolCall | None:
    got = spec.fmt.parse(inner.strip())
    if got is None or got[0] not in spec.names:
        return None
    name, args = got
    if isinstance(args, str):
        return ToolCall(name, args)
    # the arguments as the model wrote them, where they can be cut out of the call (as a stream sends them)
    inner = inner.strip()
    m, t = spec.fmt.head.match(inner), spec.fmt.tail.search(inner)
    if m is not None and t is not None and m.end() <= t.start():
        raw = inner[m.end() : t.start()]
        try:
            if json.loads(raw) == args:
                return ToolCall(name, raw)
        except ValueError:
            pass
    return ToolCall(name, json.dumps(args, ensure_ascii=False))


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

    Text that could open a call is held until it is known. Without ``eager`` a call is held until it
    closes (or the reply ends) and then parsed, so that one that does not parse can go out as content.
    ``eager`` is for replies whose grammar makes every call parse (tool_choice required or named): the
    arguments then stream as the model writes them, as OpenAI streams them."""

    def __init__(self, spec: ToolSpec, *, eager: bool = False) -> None:
        self.spec = spec
        self.eager = eager
        self.buf = ""
        self.inside = False
        self.started: ToolCall | None = None  # eager: the call whose arguments are streaming
        self.sent = 0  # eager: how much of buf has gone out as arguments
        self.calls: list[ToolCall] = []

    def _done_calling(self) -> bool:
        return bool(self.calls) and not self.spec.parallel

    def feed(self, text: str) -> list[tuple[str, str | ToolCall]]:
        out: list[tuple[str, str | ToolCall]] = []
        self.buf += text
        o, c = self.spec.fmt.open, self.spec.fmt.close
        while self.buf:
            if not self.inside:
                i = -1 if self._done_calling() else self.buf.find(o)
                if i < 0:
                    keep = (
                        0
                        if self._done_calling()
                        else next(
                            (
                                n
                                for n in range(min(len(o) - 1, len(self.buf)), 0, -1)
                                if o.startswith(self.buf[-n:])
                            ),
                            0,
                        )
                    )
                    if len(self.buf) > keep:
                        out.append(("content", self.buf[: len(self.buf) - keep]))
                    self.buf = self.buf[len(self.buf) - keep :]
                    return out
                if i > 0:
                    out.append(("content", self.buf[:i]))
                self.buf = self.buf[i:]
                self.inside = True
            j = self.buf.find(c, len(o))
            if self.eager:
                out.extend(self._eager(j))
            if j < 0:
                return out
            block, self.buf = self.buf[: j + len(c)], self.buf[j + len(c) :]
            self.inside = False
            if self.started is not None:
                self.started, self.sent = None, 0
            else:
                out.append(self._finish(block))
        return out

    def _eager(self, j: int) -> list[tuple[str, str | ToolCall]]:
        """Start the call once its name is known; send its arguments up to what could be its end."""
        fmt = self.spec.fmt
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

    def _finish(self, block: str) -> tuple[str, str | ToolCall]:
        o, c = self.spec.fmt.open, self.spec.fmt.close
        inner = block[len(o) :]
        inner = inner[: -len(c)] if inner.endswith(c) else inner
        call = _to_call(self.spec, inner)
        if call is None:
            return ("content", block)
        self.calls.append(call)
        return ("call", call)

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
            return [self._finish(block)]
        return [("content", block)]
