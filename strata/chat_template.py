"""Chat messages -> prompt text, with the model's own template (``tokenizer.chat_template``).

Templates are Jinja2, rendered in an immutable sandbox (a template cannot reach Python objects or
files). They see what Hugging Face's chat templates expect: ``messages``, ``add_generation_prompt``,
``bos_token``, ``eos_token``, ``tools``, ``raise_exception(msg)``, ``strftime_now(fmt)``, a ``tojson``
filter that keeps non-ASCII text as it is, plus the request's ``chat_template_kwargs`` (for instance
``enable_thinking``) and ``reasoning_effort``. A file without a template gets ``FALLBACK_TEMPLATE``
(ChatML turns).

The request's text never becomes a control token: ``render_prompt`` swaps every control-token text
found in the request (message content, names, tool definitions, template arguments) for a character
that appears nowhere else before the template runs, and gives the tokenizer the table to put the text
back after it has found the template's own markers (``Tokenizer.encode(..., placeholders=...)``).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import datetime
from functools import lru_cache
from typing import Any

__all__ = ["FALLBACK_TEMPLATE", "ChatTemplate", "ChatTemplateError", "Prompt", "normalize_messages"]

FALLBACK_TEMPLATE = (
    "{%- for m in messages -%}"
    "{{ '<|im_start|>' + m['role'] + '\\n' + (m['content'] if m['content'] is string else '') + '<|im_end|>\\n' }}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<|im_start|>assistant\\n' }}{%- endif -%}"
)

_ROLES = ("system", "developer", "user", "assistant", "tool")


class ChatTemplateError(ValueError):
    """The messages cannot be rendered (the template refused them, or the template is broken)."""


def _raise(message: str) -> None:
    raise ChatTemplateError(message)


def _tojson(value: Any, indent: int | None = None, ensure_ascii: bool = False, **_: Any) -> str:
    return json.dumps(value, indent=indent, ensure_ascii=ensure_ascii)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


@lru_cache(maxsize=8)
def _compile(source: str) -> Any:
    from jinja2.exceptions import TemplateSyntaxError
    from jinja2.ext import loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise
    env.globals["strftime_now"] = _strftime_now
    try:
        return env.from_string(source)
    except TemplateSyntaxError as e:
        raise ChatTemplateError(f"the model's chat template does not compile: {e}") from e


def _text_of(content: Any, where: str) -> str:
    """A message's content as text: a string, or the text parts of an OpenAI content list."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for k, part in enumerate(content):
            if (
                not isinstance(part, dict)
                or part.get("type") != "text"
                or not isinstance(part.get("text"), str)
            ):
                raise ChatTemplateError(
                    f'{where}.content[{k}]: only text parts are supported ({{"type": "text", "text": "..."}})'
                )
            parts.append(part["text"])
        return "".join(parts)
    raise ChatTemplateError(f"{where}.content: must be a string or a list of text parts")


def normalize_messages(messages: Any) -> list[dict[str, Any]]:
    """Check OpenAI-style messages and give each a string ``content`` (raises ChatTemplateError)."""
    if not isinstance(messages, list) or not messages:
        raise ChatTemplateError("messages: must be a non-empty list of {role, content} objects")
    out = []
    for i, m in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(m, dict):
            raise ChatTemplateError(f"{where}: must be an object with 'role' and 'content'")
        role = m.get("role")
        if role not in _ROLES:
            raise ChatTemplateError(f"{where}.role: must be one of {', '.join(_ROLES)} (got {role!r})")
        if "content" not in m and not m.get("tool_calls"):
            raise ChatTemplateError(f"{where}.content: missing")
        msg = dict(m)
        msg["content"] = _text_of(m.get("content"), where)
        if role == "developer":
            msg["role"] = "system"
        out.append(msg)
    return out


# placeholders come from a Unicode private-use plane: no model writes them and no template uses them
_PLACEHOLDER_FIRST = 0xF0000
_PLACEHOLDER_LAST = 0xFFFFD
_PLANE = re.compile(f"[{chr(_PLACEHOLDER_FIRST)}-{chr(_PLACEHOLDER_LAST)}]")


@dataclass(frozen=True)
class Prompt:
    """A rendered prompt whose request text is kept apart from the template's markers.

    ``masked`` is the template's output in which each control-token text that came from the request
    is one placeholder character; ``placeholders`` maps each of those characters back to its text."""

    masked: str
    placeholders: dict[str, str]

    @property
    def text(self) -> str:
        """The prompt as the model reads it, the request's text verbatim."""
        if not self.placeholders:
            return self.masked
        return self.masked.translate({ord(k): v for k, v in self.placeholders.items()})


def _strings(value: Any) -> Iterator[str]:
    """Every string in a JSON-like value, keys included (iteratively: depth is the caller's limit)."""
    stack = [value]
    while stack:
        v = stack.pop()
        if isinstance(v, str):
            yield v
        elif isinstance(v, dict):
            for k, x in v.items():
                if isinstance(k, str):
                    yield k
                stack.append(x)
        elif isinstance(v, (list, tuple)):
            stack.extend(v)


def _mask(value: Any, pattern: re.Pattern[str], table: dict[str, str]) -> Any:
    if isinstance(value, str):
        return pattern.sub(lambda m: table[m.group(0)], value)
    if isinstance(value, dict):
        return {_mask(k, pattern, table): _mask(v, pattern, table) for k, v in value.items()}
    if isinstance(value, list):
        return [_mask(v, pattern, table) for v in value]
    if isinstance(value, tuple):
        return tuple(_mask(v, pattern, table) for v in value)
    return value


class ChatTemplate:
    """One model's chat template.

    ``control_tokens`` are the texts that the tokenizer turns into control tokens
    (``Tokenizer.control_texts``); ``render_prompt`` keeps the request from writing them."""

    def __init__(
        self,
        source: str | None,
        *,
        bos_token: str = "",
        eos_token: str = "",
        control_tokens: Iterable[str] = (),
    ) -> None:
        self.is_fallback = not source
        self.source = source or FALLBACK_TEMPLATE
        self.bos_token = bos_token
        self.eos_token = eos_token
        self._template = _compile(self.source)
        texts = sorted({t for t in control_tokens if t}, key=lambda t: (-len(t), t))
        self._control = re.compile("|".join(map(re.escape, texts))) if texts else None

    @property
    def supports_thinking(self) -> bool:
        """Whether the template switches reasoning on and off (``enable_thinking``)."""
        return "enable_thinking" in self.source

    def render(self, messages: Any, **options: Any) -> str:
        """The prompt text for ``messages`` (OpenAI format; checked by ``normalize_messages``); the
        options are ``render_prompt``'s."""
        return self.render_prompt(messages, **options).text

    def render_prompt(
        self,
        messages: Any,
        *,
        add_generation_prompt: bool = True,
        tools: list[Any] | None = None,
        enable_thinking: bool | None = None,
        reasoning_effort: str | None = None,
        extra: dict[str, Any] | None = None,
    ) -> Prompt:
        """``render``, with the request's control-token texts masked (see ``Prompt``)."""
        table: dict[str, str] = {}
        request = (messages, tools, extra, reasoning_effort)
        if self._control is not None:
            found = sorted({m.group(0) for s in _strings(request) for m in self._control.finditer(s)})
            if found:
                used = {
                    ord(c)
                    for s in (*_strings(request), self.source, self.bos_token, self.eos_token)
                    for c in _PLANE.findall(s)
                }
                free = (c for c in range(_PLACEHOLDER_FIRST, _PLACEHOLDER_LAST + 1) if c not in used)
                table = {t: chr(next(free)) for t in found}
                messages, tools, extra, reasoning_effort = _mask(request, self._control, table)
        text = self._render(
            messages,
            add_generation_prompt=add_generation_prompt,
            tools=tools,
            enable_thinking=enable_thinking,
            reasoning_effort=reasoning_effort,
            extra=extra,
        )
        return Prompt(text, {c: t for t, c in table.items()})

    def _render(
        self,
        messages: Any,
        *,
        add_generation_prompt: bool,
        tools: list[Any] | None,
        enable_thinking: bool | None,
        reasoning_effort: str | None,
        extra: dict[str, Any] | None,
    ) -> str:
        from jinja2.exceptions import TemplateError

        ctx: dict[str, Any] = dict(extra or {})
        if reasoning_effort is not None:
            ctx["reasoning_effort"] = reasoning_effort
            if (
                enable_thinking is None
                and "enable_thinking" not in ctx
                and reasoning_effort in ("none", "minimal")
            ):
                enable_thinking = False
        if enable_thinking is not None:
            ctx["enable_thinking"] = bool(enable_thinking)
        ctx.update(
            messages=normalize_messages(messages),
            add_generation_prompt=add_generation_prompt,
            bos_token=self.bos_token,
            eos_token=self.eos_token,
        )
        if tools:
            ctx["tools"] = tools
        try:
            return str(self._template.render(**ctx))
        except ChatTemplateError:
            raise
        except TemplateError as e:
            raise ChatTemplateError(f"the model's chat template failed on these messages: {e}") from e
        except (TypeError, KeyError, AttributeError, ValueError, IndexError) as e:
            raise ChatTemplateError(
                f"the model's chat template failed on these messages: {type(e).__name__}: {e}"
            ) from e
