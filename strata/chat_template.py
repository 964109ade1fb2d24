"""Chat messages -> prompt text, with the model's own template (``tokenizer.chat_template``).

Templates are Jinja2, rendered in an immutable sandbox (a template cannot reach Python objects or
files). They see what Hugging Face's chat templates expect: ``messages``, ``add_generation_prompt``,
``bos_token``, ``eos_token``, ``tools``, ``raise_exception(msg)``, ``strftime_now(fmt)``, a ``tojson``
filter that keeps non-ASCII text as it is, plus the request's ``chat_template_kwargs`` (for instance
``enable_thinking``) and ``reasoning_effort``. A file without a template gets ``FALLBACK_TEMPLATE``
(ChatML turns).
"""

from __future__ import annotations

import json
from datetime import datetime
from functools import lru_cache
from typing import Any

__all__ = ["FALLBACK_TEMPLATE", "ChatTemplate", "ChatTemplateError", "normalize_messages"]

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
            if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise ChatTemplateError(f"{where}.content[{k}]: only text parts are supported "
                                        '({"type": "text", "text": "..."})')
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


class ChatTemplate:
    """One model's chat template."""

    def __init__(self, source: str | None, *, bos_token: str = "", eos_token: str = "") -> None:
        self.is_fallback = not source
        self.source = source or FALLBACK_TEMPLATE
        self.bos_token = bos_token
        self.eos_token = eos_token
        self._template = _compile(self.source)

    @property
    def supports_thinking(self) -> bool:
        """Whether the template switches reasoning on and off (``enable_thinking``)."""
        return "enable_thinking" in self.source

    def render(
        self,
        messages: Any,
        *,
        add_generation_prompt: bool = True,
        tools: list[Any] | None = None,
        enable_thinking: bool | None = None,
        reasoning_effort: str | None = None,
        extra: dict[str, Any] | None = None,
    ) -> str:
        """The prompt text for ``messages`` (OpenAI format; checked by ``normalize_messages``)."""
        from jinja2.exceptions import TemplateError

        ctx: dict[str, Any] = dict(extra or {})
        if reasoning_effort is not None:
            ctx["reasoning_effort"] = reasoning_effort
            if enable_thinking is None and "enable_thinking" not in ctx and reasoning_effort in ("none", "minimal"):
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
            raise ChatTemplateError(f"the model's chat template failed on these messages: {type(e).__name__}: {e}") from e
