"""Prompt building: a request's messages (or completion prompt) to token ids, and the reply's length
fitted to the context.

Chat messages go through the model's template with their text kept apart from the template's markers
(``ChatTemplate.render_prompt``), so a message that contains ``<|im_end|>`` stays text and cannot end
its turn or open a forged system turn. A completion prompt is the client's raw text, written in the
model's own format, so its control-token texts are read as the tokens they spell.

Everything here is plain computation, called in a worker thread (``asyncio.to_thread``): tokenizing a
long prompt takes seconds, and the event loop keeps answering meanwhile.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .._config import generation_room
from ..chat_template import ChatTemplate, ChatTemplateError
from ..grammar import grammars_for
from ..think import THINK_OPEN
from ..tokenizer import Tokenizer
from .errors import ApiError, bad
from .requests import is_token_ids
from .tools import ToolSpec, format_for, grammar_for, prepare_messages, tool_spec

__all__ = ["BuiltPrompt", "chat_prompt", "completion_prompt", "fit_max_tokens"]


@dataclass
class BuiltPrompt:
    ids: list[int]  # the prompt's token ids
    param: str  # the request field it came from ("messages" or "prompt"), for errors
    think_open: bool = False  # the prompt ends inside an open <think> block
    tools: ToolSpec | None = None  # the request's tools (the reply is parsed for calls when active)
    grammar: str = ""  # the grammar the reply follows (tool_choice required or named, response_format)


def _too_long(n: int, ctx: int, param: str, *, at_least: bool = False) -> ApiError:
    return ApiError(
        400,
        f"the prompt has {'at least ' if at_least else ''}{n} tokens; the context holds {ctx} "
        f"(shorten the prompt)",
        code="context_length_exceeded",
        param=param,
    )


def _check_bound(tok: Tokenizer, text: str, ctx: int, max_tokens: int | None, param: str) -> None:
    """Refuse a prompt that cannot fit before tokenizing it (``Tokenizer.min_tokens``)."""
    if ctx > 0:
        fit_max_tokens(tok.min_tokens(text), max_tokens, ctx, param, at_least=True)


def chat_prompt(
    tok: Tokenizer, template: ChatTemplate, body: dict[str, Any], *, ctx: int, max_tokens: int | None
) -> BuiltPrompt:
    kwargs = body.get("chat_template_kwargs")
    if kwargs is not None and not isinstance(kwargs, dict):
        raise bad("chat_template_kwargs", "must be an object")
    kwargs = dict(kwargs or {})
    effort = body.get("reasoning_effort")
    if effort is not None and not isinstance(effort, str):
        raise bad("reasoning_effort", "must be a string (none, low, medium, high)")
    thinking = kwargs.pop("enable_thinking", None)
    if thinking is not None and not isinstance(thinking, bool):
        raise bad("chat_template_kwargs.enable_thinking", "must be true or false")
    spec = tool_spec(body, format_for(template))
    grammar = grammar_for(body, spec)
    if grammar:
        problem = grammars_for(tok).check(grammar)
        if problem:
            param = (
                "tools" if spec is not None and spec.choice in ("required", "function") else "response_format"
            )
            raise bad(param, f"the grammar library rejects this schema: {problem}")
    if "messages" not in body:
        raise bad("messages", "missing: send a list of {role, content} messages")
    messages, tools = prepare_messages(body["messages"], spec, template)
    try:
        prompt = template.render_prompt(
            messages, tools=tools, enable_thinking=thinking, reasoning_effort=effort, extra=kwargs
        )
    except ChatTemplateError as e:
        msg = str(e)
        param = msg.split(":", 1)[0] if msg.startswith("messages") else "messages"
        raise ApiError(
            400,
            msg if msg.startswith("messages") else f"messages: {msg}",
            code="invalid_request",
            param=param,
        ) from None
    text = prompt.text
    _check_bound(tok, text, ctx, max_tokens, "messages")
    ids = tok.encode(prompt.masked, add_special=False, parse_special=True, placeholders=prompt.placeholders)
    if tok.add_bos and tok.bos_id >= 0 and (not ids or ids[0] != tok.bos_id):
        ids.insert(0, tok.bos_id)
    if not ids:
        raise bad("messages", "the rendered prompt is empty")
    return BuiltPrompt(ids, "messages", text.rstrip().endswith(THINK_OPEN), spec, grammar)


def completion_prompt(
    tok: Tokenizer, body: dict[str, Any], *, ctx: int, max_tokens: int | None
) -> BuiltPrompt:
    if "prompt" not in body:
        raise bad("prompt", "missing: send a string or a list of token ids")
    p = body["prompt"]
    if isinstance(p, list) and len(p) == 1 and isinstance(p[0], (str, list)):
        p = p[0]  # a batch of one
    if isinstance(p, str):
        if not p:
            raise bad("prompt", "is empty")
        _check_bound(tok, p, ctx, max_tokens, "prompt")
        return BuiltPrompt(tok.encode(p, add_special=True, parse_special=True), "prompt")
    if isinstance(p, list):
        if not p:
            raise bad("prompt", "is empty")
        if not is_token_ids(p):
            raise bad(
                "prompt",
                "must be a string or a list of token ids (integers); batches of several "
                "prompts are not supported",
            )
        out_of_range = next((t for t in p if not 0 <= t < tok.n_vocab), None)
        if out_of_range is not None:
            raise bad("prompt", f"token id {out_of_range} is outside the vocabulary (0..{tok.n_vocab - 1})")
        return BuiltPrompt([int(t) for t in p], "prompt")
    raise bad("prompt", f"must be a string or a list of token ids (got {type(p).__name__})")


def fit_max_tokens(
    n_prompt: int, max_tokens: int | None, ctx: int, param: str, *, at_least: bool = False
) -> int:
    """The reply's length limit: ``max_tokens`` as asked, or all the context leaves after the prompt
    (``strata._config.generation_room``, the engine's own rule); a 400 when the two do not fit.
    ``at_least``: ``n_prompt`` is a lower bound on the prompt's length, and the messages say so."""
    if ctx <= 0:
        if max_tokens is None:
            raise ApiError(500, "the engine did not say how long its context is", code="engine_error")
        return max_tokens
    room = generation_room(ctx, 0, n_prompt)
    if room < 1:
        raise _too_long(n_prompt, ctx, param, at_least=at_least)
    if max_tokens is None:
        return room
    if max_tokens > room:
        raise ApiError(
            400,
            f"the prompt ({'at least ' if at_least else ''}{n_prompt} tokens) plus max_tokens ({max_tokens}) needs "
            f"{n_prompt + max_tokens - 1} tokens of context; the context holds {ctx}. Shorten the "
            f"prompt or ask for at most {room} tokens",
            code="context_length_exceeded",
            param=param,
        )
    return max_tokens
