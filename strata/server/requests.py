"""Request parsing: the body read within its size limit, decoded and checked, and the generation
fields turned into ``GenParams`` with a 400 that names the field for anything wrong.

Decoding runs in a worker thread (``read_json``), never on the event loop. A body is refused with
413 when its ``Content-Length`` (or, without one, what has arrived) passes the limit, before any of
it is decoded; a decoded body must be a JSON object nested at most ``MAX_DEPTH`` levels whose text is
Unicode (a lone surrogate such as ``"\\ud800"`` decodes in JSON but is not text a model can read).
"""

from __future__ import annotations

import asyncio
import json
import math
import secrets
from dataclasses import dataclass
from typing import Any

from starlette.requests import Request

from .errors import ApiError, bad

__all__ = ["DEFAULT_MAX_BODY", "MAX_DEPTH", "GenParams", "gen_params", "parse_body", "read_json"]

DEFAULT_MAX_BODY = 8 << 20
MAX_DEPTH = 64
_MAX_STOP = 16
_MAX_N = 64  # choices per request (n): each is a generation of its own, run side by side with --parallel
_MAX_TOP_LOGPROBS = 20
_MAX_CACHE_KEY = 256


# ---- the body ----------------------------------------------------------------------------------


async def read_json(request: Request, limit: int) -> dict[str, Any]:
    """The request's JSON object (raises ApiError: 413 past ``limit`` bytes, 400 for anything else)."""
    cl = request.headers.get("content-length")
    if cl is not None and cl.isdigit() and int(cl) > limit:
        raise ApiError(
            413,
            f"the request body is {int(cl)} bytes; this server accepts at most {limit} "
            f"(strata serve --max-body-mib raises the limit)",
            code="request_too_large",
        )
    buf = bytearray()
    async for chunk in request.stream():
        buf += chunk
        if len(buf) > limit:
            raise ApiError(
                413,
                f"the request body is larger than {limit} bytes, the most this server accepts "
                f"(strata serve --max-body-mib raises the limit)",
                code="request_too_large",
            )
    return await asyncio.to_thread(parse_body, bytes(buf))


def parse_body(data: bytes) -> dict[str, Any]:
    """Decode and check a request body (see the module docstring)."""
    if not data:
        raise ApiError(400, "the request has no body: send a JSON object", code="invalid_request")
    try:
        body = json.loads(data)
    except RecursionError:
        raise ApiError(
            400, f"the request body is nested too deeply (at most {MAX_DEPTH} levels)", code="invalid_request"
        ) from None
    except ValueError as e:
        raise ApiError(400, f"the request body is not valid JSON ({e})", code="invalid_request") from None
    if not isinstance(body, dict):
        raise ApiError(400, "the request body must be a JSON object", code="invalid_request")
    _check_tree(body)
    return body


def _check_tree(body: dict[str, Any]) -> None:
    stack: list[tuple[Any, str, int]] = [(body, "", 0)]
    while stack:
        v, where, depth = stack.pop()
        if depth > MAX_DEPTH:
            raise ApiError(
                400,
                f"the request body is nested more than {MAX_DEPTH} levels deep (at {where})",
                code="invalid_request",
                param=where.split(".")[0].split("[")[0] or None,
            )
        if isinstance(v, str):
            _check_text(v, where)
        elif isinstance(v, dict):
            for k, x in v.items():
                path = f"{where}.{k}" if where else str(k)
                _check_text(k, path)
                stack.append((x, path, depth + 1))
        elif isinstance(v, list):
            stack.extend((x, f"{where}[{i}]", depth + 1) for i, x in enumerate(v))


def _check_text(s: str, where: str) -> None:
    if s.isascii():
        return
    try:
        s.encode("utf-8")
    except UnicodeEncodeError as e:
        where = where.encode("utf-8", "backslashreplace").decode("utf-8")  # a key can hold one too
        param = where.split(".")[0].split("[")[0] or None
        raise ApiError(
            400,
            f"{where or 'the request body'}: holds a lone surrogate (U+{ord(s[e.start]):04X}) "
            f"at character {e.start}, which is not text: send valid UTF-8 (or a complete "
            f"\\uXXXX\\uXXXX pair)",
            code="invalid_request",
            param=param,
        ) from None


# ---- the generation fields ---------------------------------------------------------------------


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_num(v: Any) -> bool:
    return (isinstance(v, (int, float)) and not isinstance(v, bool)) and math.isfinite(float(v))


def number(body: dict[str, Any], name: str, default: float, lo: float, hi: float) -> float:
    v = body.get(name)
    if v is None:
        return default
    if not _is_num(v):
        raise bad(name, f"must be a number (got {type(v).__name__})")
    if not lo <= float(v) <= hi:
        raise bad(name, f"must be between {lo:g} and {hi:g} (got {v})")
    return float(v)


def integer(body: dict[str, Any], name: str, default: int | None, lo: int, hi: int) -> int | None:
    v = body.get(name)
    if v is None:
        return default
    if not _is_int(v):
        raise bad(name, f"must be an integer (got {type(v).__name__})")
    if not lo <= v <= hi:
        raise bad(name, f"must be between {lo} and {hi} (got {v})")
    return int(v)


def boolean(body: dict[str, Any], name: str, default: bool) -> bool:
    v = body.get(name)
    if v is None:
        return default
    if not isinstance(v, bool):
        raise bad(name, f"must be true or false (got {type(v).__name__})")
    return v


def is_token_ids(v: Any) -> bool:
    return isinstance(v, list) and all(_is_int(t) for t in v)


@dataclass
class GenParams:
    """The request's generation fields, checked."""

    max_tokens: int | None  # as asked; None: as many as the context leaves (see prompts.fit_max_tokens)
    temperature: float
    top_p: float
    top_k: int
    min_p: float
    seed: int
    stop: list[str]
    stream: bool
    include_usage: bool
    logprobs: bool
    top_logprobs: int
    ignore_eos: bool = False
    cache_prompt: bool = False
    prompt_cache_key: str = ""  # the client's own name for a cache scope (OpenAI's prompt_cache_key)
    split_reasoning: bool = False  # reasoning_format "deepseek": <think>...</think> -> reasoning_content
    n: int = 1  # choices: n generations of the prompt, choice i sampled with seed + i


def gen_params(body: dict[str, Any], *, chat: bool, cache_prompt: bool = False) -> GenParams:
    """The generation fields of a chat (``chat``) or completion request; ``cache_prompt`` is the
    server's default for the field of that name."""
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise bad("model", f"must be a string (got {type(model).__name__})")
    max_tokens = integer(body, "max_completion_tokens", None, 1, 1 << 30) if chat else None
    if max_tokens is None:
        max_tokens = integer(body, "max_tokens", None, 1, 1 << 30)
    n = integer(body, "n", 1, 1, 1 << 30) or 1
    if n > _MAX_N:
        raise bad("n", f"at most {_MAX_N} choices per request (got {n})")
    seed = integer(body, "seed", None, -(1 << 63), (1 << 64) - 1)
    if seed is None or seed == -1:
        seed = secrets.randbits(63)
    stop_v = body.get("stop")
    if stop_v is None:
        stop: list[str] = []
    elif isinstance(stop_v, str):
        stop = [stop_v] if stop_v else []
    elif isinstance(stop_v, list) and all(isinstance(s, str) for s in stop_v):
        if len(stop_v) > _MAX_STOP:
            raise bad("stop", f"at most {_MAX_STOP} stop strings (got {len(stop_v)})")
        stop = [s for s in stop_v if s]
    else:
        raise bad("stop", "must be a string or a list of strings")
    opts = body.get("stream_options")
    if opts is not None and not isinstance(opts, dict):
        raise bad("stream_options", "must be an object")
    include_usage = boolean(opts or {}, "include_usage", False)
    if chat:
        logprobs = boolean(body, "logprobs", False)
        top_logprobs = integer(body, "top_logprobs", 0, 0, _MAX_TOP_LOGPROBS) or 0
        if top_logprobs and not logprobs:
            raise bad("top_logprobs", "needs logprobs: true")
    else:
        lp = integer(body, "logprobs", None, 0, _MAX_TOP_LOGPROBS)
        logprobs, top_logprobs = lp is not None, int(lp or 0)
    key = body.get("prompt_cache_key")
    if key is not None and (not isinstance(key, str) or len(key) > _MAX_CACHE_KEY):
        raise bad("prompt_cache_key", f"must be a string of at most {_MAX_CACHE_KEY} characters")
    return GenParams(
        max_tokens=max_tokens,
        temperature=number(body, "temperature", 1.0, 0.0, 100.0),
        top_p=number(body, "top_p", 1.0, 0.0, 1.0),
        top_k=int(integer(body, "top_k", 0, 0, 1 << 30) or 0),
        min_p=number(body, "min_p", 0.0, 0.0, 1.0),
        seed=int(seed) & ((1 << 64) - 1),
        stop=stop,
        stream=boolean(body, "stream", False),
        include_usage=include_usage,
        logprobs=logprobs,
        top_logprobs=top_logprobs,
        ignore_eos=boolean(body, "ignore_eos", False),
        cache_prompt=boolean(body, "cache_prompt", cache_prompt),
        prompt_cache_key=key or "",
        split_reasoning=_reasoning_format(body) == "deepseek" if chat else False,
        n=int(n),
    )


def _reasoning_format(body: dict[str, Any]) -> str:
    v = body.get("reasoning_format", "none")
    if v not in ("none", "deepseek"):
        raise bad(
            "reasoning_format",
            "must be 'none' (reasoning stays in the content) or 'deepseek' (it goes to reasoning_content)",
        )
    return str(v)
