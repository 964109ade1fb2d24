"""The HTTP API: OpenAI-compatible endpoints plus strata's status, health and metrics.

``create_app(state)`` builds the Starlette application. Every request that generates goes through
the supervisor's FIFO; the server process itself never loads the native library. Errors use
OpenAI's body, ``{"error": {"message", "type", "param", "code"}}``, with strata's codes:
``invalid_request`` (400, ``param`` names the field), ``context_length_exceeded`` (400),
``invalid_api_key`` (401), ``request_too_large`` (413), ``not_found`` (404), ``lend_failed`` (500),
``engine_exited`` (500), ``engine_start_failed`` (503), ``engine_error`` (500).
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import math
import secrets
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from ..chat_template import ChatTemplate, ChatTemplateError
from ..tokenizer import Tokenizer
from ._gpu import gpu_info
from .metrics import Metrics
from .supervisor import EngineStartError, Job, Supervisor

__all__ = ["ApiError", "ServerState", "create_app"]

DEFAULT_MAX_BODY = 16 << 20
_MAX_STOP = 16
_MAX_TOP_LOGPROBS = 20


class ApiError(Exception):
    """An error answered with OpenAI's error body."""

    def __init__(self, status: int, message: str, *, code: str, param: str | None = None,
                 type_: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.code = code
        self.param = param
        self.type = type_ or ("invalid_request_error" if status < 500 else "server_error")

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


def _bad(param: str, message: str) -> ApiError:
    return ApiError(400, f"{param}: {message}", code="invalid_request", param=param)


@dataclass
class ServerState:
    """Everything the handlers share."""

    supervisor: Supervisor
    tokenizer: Tokenizer
    template: ChatTemplate
    model_name: str
    api_key: str | None = None
    max_body: int = DEFAULT_MAX_BODY
    metrics: Metrics = field(default_factory=Metrics)
    last_request: dict[str, Any] | None = None
    cache_prompt: bool = False  # the default of the request field cache_prompt
    created: int = field(default_factory=lambda: int(time.time()))


# ---- request parsing ---------------------------------------------------------------------------


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_num(v: Any) -> bool:
    return (isinstance(v, (int, float)) and not isinstance(v, bool)) and math.isfinite(float(v))


def _number(body: dict[str, Any], name: str, default: float, lo: float, hi: float) -> float:
    v = body.get(name)
    if v is None:
        return default
    if not _is_num(v):
        raise _bad(name, f"must be a number (got {type(v).__name__})")
    if not lo <= float(v) <= hi:
        raise _bad(name, f"must be between {lo:g} and {hi:g} (got {v})")
    return float(v)


def _integer(body: dict[str, Any], name: str, default: int | None, lo: int, hi: int) -> int | None:
    v = body.get(name)
    if v is None:
        return default
    if not _is_int(v):
        raise _bad(name, f"must be an integer (got {type(v).__name__})")
    if not lo <= v <= hi:
        raise _bad(name, f"must be between {lo} and {hi} (got {v})")
    return int(v)


def _boolean(body: dict[str, Any], name: str, default: bool) -> bool:
    v = body.get(name)
    if v is None:
        return default
    if not isinstance(v, bool):
        raise _bad(name, f"must be true or false (got {type(v).__name__})")
    return v


@dataclass
class GenParams:
    max_tokens: int | None
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
    split_reasoning: bool = False  # reasoning_format "deepseek": <think>...</think> -> reasoning_content
    think_open: bool = False  # the prompt itself opened a think block


def _gen_params(body: dict[str, Any], *, chat: bool, cache_prompt: bool = False) -> GenParams:
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise _bad("model", f"must be a string (got {type(model).__name__})")
    max_tokens = _integer(body, "max_completion_tokens", None, 1, 1 << 30) if chat else None
    if max_tokens is None:
        max_tokens = _integer(body, "max_tokens", None, 1, 1 << 30)
    n = _integer(body, "n", 1, 1, 1 << 30)
    if n != 1:
        raise _bad("n", "only one choice per request is supported (n must be 1)")
    seed = _integer(body, "seed", None, -(1 << 63), (1 << 64) - 1)
    if seed is None or seed == -1:
        seed = secrets.randbits(63)
    stop_v = body.get("stop")
    if stop_v is None:
        stop: list[str] = []
    elif isinstance(stop_v, str):
        stop = [stop_v] if stop_v else []
    elif isinstance(stop_v, list) and all(isinstance(s, str) for s in stop_v):
        if len(stop_v) > _MAX_STOP:
            raise _bad("stop", f"at most {_MAX_STOP} stop strings (got {len(stop_v)})")
        stop = [s for s in stop_v if s]
    else:
        raise _bad("stop", "must be a string or a list of strings")
    opts = body.get("stream_options")
    if opts is not None and not isinstance(opts, dict):
        raise _bad("stream_options", "must be an object")
    include_usage = _boolean(opts or {}, "include_usage", False)
    if chat:
        logprobs = _boolean(body, "logprobs", False)
        top_logprobs = _integer(body, "top_logprobs", 0, 0, _MAX_TOP_LOGPROBS) or 0
        if top_logprobs and not logprobs:
            raise _bad("top_logprobs", "needs logprobs: true")
    else:
        lp = _integer(body, "logprobs", None, 0, _MAX_TOP_LOGPROBS)
        logprobs, top_logprobs = lp is not None, int(lp or 0)
    return GenParams(
        max_tokens=max_tokens,
        temperature=_number(body, "temperature", 1.0, 0.0, 100.0),
        top_p=_number(body, "top_p", 1.0, 0.0, 1.0),
        top_k=int(_integer(body, "top_k", 0, 0, 1 << 30) or 0),
        min_p=_number(body, "min_p", 0.0, 0.0, 1.0),
        seed=int(seed) & ((1 << 64) - 1),
        stop=stop,
        stream=_boolean(body, "stream", False),
        include_usage=include_usage,
        logprobs=logprobs,
        top_logprobs=top_logprobs,
        ignore_eos=_boolean(body, "ignore_eos", False),
        cache_prompt=_boolean(body, "cache_prompt", cache_prompt),
        split_reasoning=_reasoning_format(body) == "deepseek" if chat else False,
    )


def _reasoning_format(body: dict[str, Any]) -> str:
    v = body.get("reasoning_format", "none")
    if v not in ("none", "deepseek"):
        raise _bad("reasoning_format", "must be 'none' (reasoning stays in the content) or 'deepseek' "
                                       "(it goes to reasoning_content)")
    return str(v)


class _ThinkSplitter:
    """Splits reply text into reasoning (inside ``<think>...</think>``) and content; a tail that could
    be the start of a tag is held back until the next piece decides it."""

    def __init__(self, inside: bool = False) -> None:
        self.inside = inside
        self.held = ""

    def feed(self, text: str) -> tuple[str, str]:
        text, self.held = self.held + text, ""
        reasoning = content = ""
        while text:
            tag = "</think>" if self.inside else "<think>"
            i = text.find(tag)
            if i >= 0:
                if self.inside:
                    reasoning += text[:i]
                else:
                    content += text[:i]
                text = text[i + len(tag) :]
                self.inside = not self.inside
                continue
            keep = next((n for n in range(min(len(tag) - 1, len(text)), 0, -1) if tag.startswith(text[-n:])), 0)
            out, self.held = text[: len(text) - keep], text[len(text) - keep :]
            if self.inside:
                reasoning += out
            else:
                content += out
            break
        return reasoning, content

    def flush(self) -> tuple[str, str]:
        out, self.held = self.held, ""
        return (out, "") if self.inside else ("", out)


# ---- generation --------------------------------------------------------------------------------


class _StopMatcher:
    """Cuts the text at the first stop string; holds back a tail that could start one."""

    def __init__(self, stops: list[str]) -> None:
        self.stops = stops
        self.held = ""
        self.hit = False

    def feed(self, text: str) -> str:
        if not self.stops:
            return text
        text = self.held + text
        self.held = ""
        first = -1
        for s in self.stops:
            i = text.find(s)
            if i >= 0 and (first < 0 or i < first):
                first = i
        if first >= 0:
            self.hit = True
            return text[:first]
        keep = 0
        for s in self.stops:
            for n in range(min(len(s) - 1, len(text)), 0, -1):
                if s.startswith(text[-n:]):
                    keep = max(keep, n)
                    break
        self.held = text[len(text) - keep :]
        return text[: len(text) - keep]

    def flush(self) -> str:
        out, self.held = self.held, ""
        return out


@dataclass
class _Piece:
    text: str
    token: int
    logprob: float | None = None
    top: list[list[Any]] | None = None


class _Generation:
    """One request's run through the FIFO: text pieces as they come, then the result."""

    def __init__(self, state: ServerState, prompt: list[int], gen: GenParams) -> None:
        self.state = state
        self.prompt = prompt
        self.gen = gen
        tok = state.tokenizer
        params = {
            "prompt": prompt,
            "max_tokens": gen.max_tokens,
            "temperature": gen.temperature,
            "top_k": gen.top_k,
            "top_p": gen.top_p,
            "min_p": gen.min_p,
            "seed": gen.seed,
            "stop_tokens": [] if gen.ignore_eos else sorted(tok.eog_ids),
            "stop_at_eos": not gen.ignore_eos,
            "cache_prompt": gen.cache_prompt,
            "top_logits": 2,
            "want_logprobs": gen.logprobs,
            "logprobs": gen.top_logprobs,
        }
        self.job: Job = state.supervisor.submit(params)
        self.decoder = tok.stream_decoder()
        self.stopper = _StopMatcher(gen.stop)
        self.tokens: list[int] = []
        self.result: dict[str, Any] | None = None
        self.client_gone = False
        self.t0 = time.monotonic()
        self._drainer: asyncio.Task[None] | None = None

    def client_disconnected(self) -> None:
        if not self.job.finished.is_set() and not self.client_gone:
            self.client_gone = True
            self.state.metrics.cancelled += 1
            self.job.cancel()

    async def pieces(self) -> AsyncIterator[_Piece | dict[str, Any]]:
        """Text pieces (``_Piece``) and progress/queue notes (dicts); sets ``self.result`` at the end.
        Raises ApiError when the engine fails."""
        try:
            pos = self.job.position
            if pos > 1 or (pos == 1 and self.state.supervisor.running is not None):
                yield {"queued": pos}
            while True:
                ev = await self.job.events.get()
                kind = ev.get("ev")
                if kind == "token":
                    tid = int(ev["id"])
                    self.tokens.append(tid)
                    if self.stopper.hit:
                        continue
                    text = self.stopper.feed(self.decoder.feed(tid))
                    if self.stopper.hit:
                        self.job.cancel()  # the rest is not wanted; the worker stops within a token
                    yield _Piece(text, tid, ev.get("logprob"), ev.get("top_logprobs"))
                elif kind == "progress":
                    yield {"progress": (ev.get("done"), ev.get("total"))}
                elif kind == "started":
                    yield {"started": True}
                elif kind == "done":
                    if not self.stopper.hit:
                        tail = self.stopper.feed(self.decoder.flush())
                        tail += "" if self.stopper.hit else self.stopper.flush()
                        if tail:
                            yield _Piece(tail, -1)
                    self.result = ev
                    self._account(ev)
                    return
                elif kind == "error":
                    raise self._error(ev)
        finally:
            if self.result is None:
                # the client went away mid-reply: stop the engine (unless it is done already), then let
                # the rest drain in the background so that the request is still accounted for
                self.client_disconnected()
                if not (self.job.finished.is_set() and self.job.events.empty()):
                    self._drainer = asyncio.get_running_loop().create_task(self._drain())

    async def _drain(self) -> None:
        while not (self.job.finished.is_set() and self.job.events.empty()):
            ev = await self.job.events.get()
            kind = ev.get("ev")
            if kind == "token":
                self.tokens.append(int(ev["id"]))
            elif kind == "done":
                self.result = ev
                self._account(ev)
                return
            elif kind == "error":
                return

    def _error(self, ev: dict[str, Any]) -> ApiError:
        code = ev.get("code")
        msg = str(ev.get("message") or "the engine failed")
        if code == "engine_exited":
            return ApiError(500, msg, code="engine_exited")
        if code == "engine_start_failed":
            return ApiError(503, msg, code="engine_start_failed")
        if code == "cancelled":
            return ApiError(400, msg, code="cancelled")
        err = ev.get("error")
        if err == "LendError":
            return ApiError(500, msg, code="lend_failed")
        if err == "ContextError":
            return ApiError(400, msg, code="context_length_exceeded", param="messages")
        if err == "InvalidArgumentError":
            return ApiError(400, msg, code="invalid_request")
        return ApiError(500, msg, code="engine_error")

    @property
    def finish_reason(self) -> str:
        r = self.result or {}
        if self.stopper.hit:
            return "stop"
        reason = str(r.get("finish_reason") or "stop")
        return "stop" if reason == "cancelled" and not self.client_gone else reason

    def timings(self) -> dict[str, Any]:
        r = self.result or {}
        pn, pms = int(r.get("prompt_tokens", len(self.prompt))), float(r.get("prompt_ms", 0.0))
        dn, dms = len(r.get("tokens", self.tokens)), float(r.get("decode_ms", 0.0))
        return {
            "prompt_n": pn,
            "prompt_ms": pms,
            "prompt_per_second": pn * 1000.0 / pms if pms > 0 else 0.0,
            "predicted_n": dn,
            "predicted_ms": dms,
            "predicted_per_second": dn * 1000.0 / dms if dms > 0 else 0.0,
        }

    def usage(self) -> dict[str, Any]:
        t = self.timings()
        cached = int((self.result or {}).get("cached_tokens") or 0)
        n = len(self.prompt)
        return {"prompt_tokens": n, "completion_tokens": t["predicted_n"], "total_tokens": n + t["predicted_n"],
                "prompt_tokens_details": {"cached_tokens": cached}}

    def extension(self) -> dict[str, Any]:
        r = self.result or {}
        st = r.get("stats") or {}
        d = r.get("delta") or {}
        return {
            "prompt_token_ids": self.prompt,
            "token_ids": list(r.get("tokens", self.tokens)),
            "top2_margins": r.get("margins", []),
            "chunk": st.get("last_chunk"),
            "loan_slots": st.get("last_loan_slots"),
            "halvings": d.get("halvings", 0),
            "hits": d.get("hits", 0),
            "lookups": d.get("lookups", 0),
            "seed": self.gen.seed,
            "queue_ms": ((self.job.started or self.t0) - self.job.submitted) * 1000.0,
            "engine_finish_reason": r.get("finish_reason"),
            "cancel_seen_at": r.get("cancel_seen_at"),
            "cached_tokens": int(r.get("cached_tokens") or 0),
            "request_seq": self.job.seq,
            "run_index": self.job.run_index,
        }

    def _account(self, ev: dict[str, Any]) -> None:
        t = self.timings()
        self.state.metrics.completed(t["prompt_n"], t["predicted_n"], t["prompt_ms"], t["predicted_ms"])
        self.state.last_request = {"timings": t, "finish_reason": ev.get("finish_reason"),
                                   "seq": self.job.seq, "strata": {k: v for k, v in self.extension().items()
                                                                   if k not in ("prompt_token_ids",)}}


# ---- plumbing ----------------------------------------------------------------------------------


def _json(data: Any, status: int = 200) -> JSONResponse:
    return JSONResponse(data, status_code=status, headers={"x-strata-server": "1"})


def _error(e: ApiError) -> JSONResponse:
    return _json(e.body(), e.status)


def _check_auth(state: ServerState, request: Request) -> None:
    if not state.api_key:
        return
    header = request.headers.get("authorization", "")
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not token:
        raise ApiError(401, "this server needs an API key: send 'Authorization: Bearer KEY'",
                       code="invalid_api_key", type_="authentication_error")
    if not hmac.compare_digest(token.strip().encode(), state.api_key.encode()):
        raise ApiError(401, "the API key is not valid for this server", code="invalid_api_key",
                       type_="authentication_error")


async def _read_json(state: ServerState, request: Request) -> dict[str, Any]:
    limit = state.max_body
    cl = request.headers.get("content-length")
    if cl is not None and cl.isdigit() and int(cl) > limit:
        raise ApiError(413, f"the request body is {int(cl)} bytes; this server accepts at most {limit}",
                       code="request_too_large")
    buf = bytearray()
    async for chunk in request.stream():
        buf += chunk
        if len(buf) > limit:
            raise ApiError(413, f"the request body is larger than {limit} bytes, the most this server accepts",
                           code="request_too_large")
    if not buf:
        raise ApiError(400, "the request has no body: send a JSON object", code="invalid_request")
    try:
        body = json.loads(bytes(buf))
    except ValueError as e:
        raise ApiError(400, f"the request body is not valid JSON ({e})", code="invalid_request") from None
    if not isinstance(body, dict):
        raise ApiError(400, "the request body must be a JSON object", code="invalid_request")
    return body


async def _max_context(state: ServerState) -> int:
    sup = state.supervisor
    if sup.plan is None:
        try:
            await sup._ensure_worker()
        except EngineStartError as e:
            raise ApiError(503, str(e), code="engine_start_failed") from None
    plan = sup.plan or {}
    return int(plan.get("max_context") or 0)


def _check_context(prompt_len: int, gen: GenParams, ctx: int, param: str) -> None:
    if ctx <= 0:
        return
    if gen.max_tokens is None:
        if prompt_len >= ctx:
            raise ApiError(400, f"the prompt has {prompt_len} tokens; the context holds {ctx} "
                                f"(the prompt must leave room for at least one generated token)",
                           code="context_length_exceeded", param=param)
        gen.max_tokens = ctx - prompt_len
    elif prompt_len + gen.max_tokens > ctx:
        raise ApiError(400, f"the prompt ({prompt_len} tokens) plus max_tokens ({gen.max_tokens}) is "
                            f"{prompt_len + gen.max_tokens} tokens; the context holds {ctx}. Shorten the prompt "
                            f"or ask for fewer tokens",
                       code="context_length_exceeded", param=param)


class _Watched:
    """An ASGI response that cancels the generation as soon as the client disconnects."""

    def __init__(self, g: _Generation, body: AsyncIterator[bytes] | None, make_json: Any = None) -> None:
        self.g = g
        self.body = body
        self.make_json = make_json

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        async def watch() -> None:
            while True:
                msg = await receive()
                if msg["type"] == "http.disconnect":
                    self.g.client_disconnected()
                    return

        watcher = asyncio.create_task(watch())
        try:
            if self.body is not None:
                await self._stream(send)
            else:
                status, data = await self.make_json()
                resp = _json(data, status)
                with contextlib.suppress(OSError):
                    await resp(scope, receive, send)
        finally:
            watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await watcher

    async def _stream(self, send: Send) -> None:
        assert self.body is not None
        headers = [(b"content-type", b"text/event-stream; charset=utf-8"), (b"cache-control", b"no-cache"),
                   (b"x-strata-server", b"1"), (b"x-strata-request-seq", str(self.g.job.seq).encode())]
        body = self.body
        try:
            await send({"type": "http.response.start", "status": 200, "headers": headers})
            async for chunk in body:
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        except OSError:
            self.g.client_disconnected()
        finally:
            with contextlib.suppress(Exception):
                await body.aclose()  # type: ignore[attr-defined]


def _sse(data: dict[str, Any] | str) -> bytes:
    payload = data if isinstance(data, str) else json.dumps(data, ensure_ascii=False)
    return f"data: {payload}\n\n".encode()


# ---- logprobs ----------------------------------------------------------------------------------


def _lp_entry(tok: Tokenizer, tid: int, lp: float) -> dict[str, Any]:
    b = tok.token_bytes(tid)
    return {"token": b.decode("utf-8", "replace"), "logprob": lp, "bytes": list(b)}


def _chat_logprobs(tok: Tokenizer, pieces: list[_Piece]) -> dict[str, Any]:
    content = []
    for p in pieces:
        if p.token < 0 or p.logprob is None:
            continue
        e = _lp_entry(tok, p.token, p.logprob)
        e["top_logprobs"] = [_lp_entry(tok, int(i), float(lp)) for i, lp in (p.top or [])]
        content.append(e)
    return {"content": content}


def _completion_logprobs(tok: Tokenizer, pieces: list[_Piece]) -> dict[str, Any]:
    out: dict[str, Any] = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
    offset = 0
    for p in pieces:
        if p.token < 0 or p.logprob is None:
            continue
        text = tok.token_bytes(p.token).decode("utf-8", "replace")
        out["tokens"].append(text)
        out["token_logprobs"].append(p.logprob)
        out["top_logprobs"].append({tok.token_bytes(int(i)).decode("utf-8", "replace"): float(lp)
                                    for i, lp in (p.top or [])})
        out["text_offset"].append(offset)
        offset += len(p.text)
    return out


# ---- handlers ----------------------------------------------------------------------------------


def create_app(state: ServerState) -> Starlette:
    sup = state.supervisor

    async def health(request: Request) -> Response:
        if sup.ready:
            return _json({"status": "ok"})
        body: dict[str, Any] = {"status": sup.state if sup.state != "idle" else "loading"}
        if sup.start_error:
            body["error"] = sup.start_error
        return _json(body, 503)

    async def models(request: Request) -> Response:
        try:
            _check_auth(state, request)
        except ApiError as e:
            return _error(e)
        meta = {"n_vocab": state.tokenizer.n_vocab}
        if sup.info:
            meta.update({k: sup.info.get(k) for k in ("arch", "n_ctx_train", "n_params", "file_bytes")})
        if sup.plan:
            meta["max_context"] = sup.plan.get("max_context")
        return _json({"object": "list", "data": [
            {"id": state.model_name, "object": "model", "created": state.created, "owned_by": "strata", "meta": meta}
        ]})

    async def status(request: Request) -> Response:
        try:
            _check_auth(state, request)
        except ApiError as e:
            return _error(e)
        plan = sup.plan
        stats = sup.stats
        waiting = [{"seq": j.seq, "position": k + 1} for k, j in enumerate(list(sup._queue))]
        running = sup.running
        budget = None
        if plan:
            budget = {"device": "cuda" if plan.get("device") == 1 else "cpu",
                      "budget_bytes": plan.get("budget_bytes"), "slots": plan.get("n_slots"),
                      "slots_lent_now": (stats or {}).get("slots_lent_now", 0)}
        data = {
            "model": state.model_name,
            "state": sup.state,
            "prompt": sup.prompt_progress if sup.state == "reading" else None,
            "queue": {"length": sup.queue_length, "waiting": waiting,
                      "running": running.seq if running is not None else None},
            "plan": plan,
            "stats": stats,
            "info": sup.info,
            "config": sup.config.to_dict(),
            "max_context": int((plan or {}).get("max_context") or sup.config.max_context or 0),
            "last_request": state.last_request,
            "engine": {"pid": sup.pid, "restarts": sup.restarts, "last_exit_code": sup.last_exit_code,
                       "error": sup.start_error},
            "gpu": await asyncio.to_thread(gpu_info),
            "budget": budget,
        }
        return _json(data)

    async def metrics(request: Request) -> Response:
        text = state.metrics.render(stats=sup.stats, restarts=sup.restarts, queue_length=sup.queue_length,
                                    running=sup.running is not None, ready=sup.ready)
        return PlainTextResponse(text, media_type="text/plain; version=0.0.4", headers={"x-strata-server": "1"})

    async def chat(request: Request) -> Response:
        return await _complete(request, chat=True)

    async def completions(request: Request) -> Response:
        return await _complete(request, chat=False)

    async def _complete(request: Request, *, chat: bool) -> Response:
        endpoint = "chat" if chat else "completions"
        try:
            _check_auth(state, request)
            body = await _read_json(state, request)
            gen = _gen_params(body, chat=chat, cache_prompt=state.cache_prompt)
            if chat:
                prompt, param, gen.think_open = _prompt_of(body)
            else:
                prompt, param = _completion_prompt(body)
            ctx = await _max_context(state)
            _check_context(len(prompt), gen, ctx, param)
        except ApiError as e:
            state.metrics.request(endpoint, e.status)
            return _error(e)
        g = _Generation(state, prompt, gen)
        if gen.stream:
            state.metrics.request(endpoint, 200)
            return _Watched(g, _stream_chat(g) if chat else _stream_completion(g))  # type: ignore[return-value]

        async def make() -> tuple[int, dict[str, Any]]:
            pieces: list[_Piece] = []
            try:
                async for p in g.pieces():
                    if isinstance(p, _Piece):
                        pieces.append(p)
            except ApiError as e:
                state.metrics.request(endpoint, e.status)
                return e.status, e.body()
            state.metrics.request(endpoint, 200)
            text = "".join(p.text for p in pieces)
            cid = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex[:24]
            choice: dict[str, Any] = {"index": 0, "finish_reason": g.finish_reason}
            if chat:
                choice["message"] = {"role": "assistant", "content": text}
                if gen.split_reasoning:
                    sp = _ThinkSplitter(gen.think_open)
                    r1, c1 = sp.feed(text)
                    r2, c2 = sp.flush()
                    choice["message"] = {"role": "assistant", "content": c1 + c2,
                                         "reasoning_content": (r1 + r2) or None}
                choice["logprobs"] = _chat_logprobs(state.tokenizer, pieces) if gen.logprobs else None
            else:
                choice["text"] = text
                choice["logprobs"] = _completion_logprobs(state.tokenizer, pieces) if gen.logprobs else None
            return 200, {
                "id": cid,
                "object": "chat.completion" if chat else "text_completion",
                "created": int(time.time()),
                "model": state.model_name,
                "choices": [choice],
                "usage": g.usage(),
                "timings": g.timings(),
                "strata": g.extension(),
            }

        return _Watched(g, None, make)  # type: ignore[return-value]

    def _prompt_of(body: dict[str, Any]) -> tuple[list[int], str, bool]:
        tok = state.tokenizer
        kwargs = body.get("chat_template_kwargs")
        if kwargs is not None and not isinstance(kwargs, dict):
            raise _bad("chat_template_kwargs", "must be an object")
        kwargs = dict(kwargs or {})
        effort = body.get("reasoning_effort")
        if effort is not None and not isinstance(effort, str):
            raise _bad("reasoning_effort", "must be a string (none, low, medium, high)")
        thinking = kwargs.pop("enable_thinking", None)
        if thinking is not None and not isinstance(thinking, bool):
            raise _bad("chat_template_kwargs.enable_thinking", "must be true or false")
        tools = body.get("tools")
        if tools is not None and not isinstance(tools, list):
            raise _bad("tools", "must be a list")
        if "messages" not in body:
            raise _bad("messages", "missing: send a list of {role, content} messages")
        try:
            text = state.template.render(body["messages"], tools=tools, enable_thinking=thinking,
                                         reasoning_effort=effort, extra=kwargs)
        except ChatTemplateError as e:
            msg = str(e)
            param = msg.split(":", 1)[0] if msg.startswith("messages") else "messages"
            raise ApiError(400, msg if msg.startswith("messages") else f"messages: {msg}",
                           code="invalid_request", param=param) from None
        ids = tok.encode(text, add_special=False, parse_special=True)
        if tok.add_bos and tok.bos_id >= 0 and (not ids or ids[0] != tok.bos_id):
            ids.insert(0, tok.bos_id)
        if not ids:
            raise _bad("messages", "the rendered prompt is empty")
        tail = text.rstrip()
        return ids, "messages", tail.endswith("<think>")

    def _completion_prompt(body: dict[str, Any]) -> tuple[list[int], str]:
        tok = state.tokenizer
        if "prompt" not in body:
            raise _bad("prompt", "missing: send a string or a list of token ids")
        p = body["prompt"]
        if isinstance(p, list) and len(p) == 1 and isinstance(p[0], (str, list)):
            p = p[0]  # a batch of one
        if isinstance(p, str):
            if not p:
                raise _bad("prompt", "is empty")
            return tok.encode(p, add_special=True, parse_special=True), "prompt"
        if isinstance(p, list):
            if not p:
                raise _bad("prompt", "is empty")
            if not all(_is_int(t) for t in p):
                raise _bad("prompt", "must be a string or a list of token ids (integers); batches of several "
                                     "prompts are not supported")
            bad = next((t for t in p if not 0 <= t < tok.n_vocab), None)
            if bad is not None:
                raise _bad("prompt", f"token id {bad} is outside the vocabulary (0..{tok.n_vocab - 1})")
            return [int(t) for t in p], "prompt"
        raise _bad("prompt", f"must be a string or a list of token ids (got {type(p).__name__})")

    async def _stream_chat(g: _Generation) -> AsyncIterator[bytes]:
        cid = "chatcmpl-" + uuid.uuid4().hex[:24]
        created = int(time.time())

        def chunk(delta: dict[str, Any], finish: str | None = None, **extra: Any) -> bytes:
            c = {"id": cid, "object": "chat.completion.chunk", "created": created, "model": state.model_name,
                 "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}], **extra}
            return _sse(c)

        yield chunk({"role": "assistant", "content": ""})
        splitter = _ThinkSplitter(g.gen.think_open) if g.gen.split_reasoning else None

        def delta(reasoning: str, content: str) -> dict[str, Any]:
            d: dict[str, Any] = {}
            if reasoning:
                d["reasoning_content"] = reasoning
            if content or not reasoning:
                d["content"] = content
            return d

        try:
            async for p in g.pieces():
                if isinstance(p, _Piece):
                    if not p.text and p.logprob is None:
                        continue
                    d = delta(*splitter.feed(p.text)) if splitter is not None else {"content": p.text}
                    if splitter is not None and d == {"content": ""} and p.logprob is None:
                        continue  # all of it held back (a possible tag)
                    c = {"id": cid, "object": "chat.completion.chunk", "created": created,
                         "model": state.model_name,
                         "choices": [{"index": 0, "delta": d, "finish_reason": None,
                                      "logprobs": _chat_logprobs(state.tokenizer, [p]) if g.gen.logprobs else None}]}
                    yield _sse(c)
                elif "progress" in p:
                    done, total = p["progress"]
                    yield f": reading {done}/{total}\n\n".encode()
                elif "queued" in p:
                    yield f": queued at position {p['queued']}\n\n".encode()
        except ApiError as e:
            yield _sse(e.body())
            yield _sse("[DONE]")
            return
        if splitter is not None:
            rest = splitter.flush()
            if any(rest):
                yield chunk(delta(*rest))
        extra: dict[str, Any] = {"timings": g.timings(), "strata": g.extension()}
        if g.gen.include_usage:
            extra["usage"] = None
        yield chunk({}, g.finish_reason, **extra)
        if g.gen.include_usage:
            yield _sse({"id": cid, "object": "chat.completion.chunk", "created": created, "model": state.model_name,
                        "choices": [], "usage": g.usage(), "timings": g.timings(), "strata": g.extension()})
        yield _sse("[DONE]")

    async def _stream_completion(g: _Generation) -> AsyncIterator[bytes]:
        cid = "cmpl-" + uuid.uuid4().hex[:24]
        created = int(time.time())

        def chunk(text: str, finish: str | None = None, logprobs: Any = None, **extra: Any) -> bytes:
            return _sse({"id": cid, "object": "text_completion", "created": created, "model": state.model_name,
                         "choices": [{"index": 0, "text": text, "logprobs": logprobs, "finish_reason": finish}],
                         **extra})

        try:
            async for p in g.pieces():
                if isinstance(p, _Piece):
                    if p.text or p.logprob is not None:
                        lp = _completion_logprobs(state.tokenizer, [p]) if g.gen.logprobs else None
                        yield chunk(p.text, None, lp)
                elif "progress" in p:
                    done, total = p["progress"]
                    yield f": reading {done}/{total}\n\n".encode()
                elif "queued" in p:
                    yield f": queued at position {p['queued']}\n\n".encode()
        except ApiError as e:
            yield _sse(e.body())
            yield _sse("[DONE]")
            return
        extra: dict[str, Any] = {"timings": g.timings(), "strata": g.extension()}
        yield chunk("", g.finish_reason, **extra)
        if g.gen.include_usage:
            yield _sse({"id": cid, "object": "text_completion", "created": created, "model": state.model_name,
                        "choices": [], "usage": g.usage(), "timings": g.timings(), "strata": g.extension()})
        yield _sse("[DONE]")

    async def not_found(request: Request) -> Response:
        return _error(ApiError(404, f"no such endpoint: {request.method} {request.url.path}", code="not_found"))

    routes = [
        Route("/health", health, methods=["GET"]),
        Route("/metrics", metrics, methods=["GET"]),
        Route("/v1/models", models, methods=["GET"]),
        Route("/v1/status", status, methods=["GET"]),
        Route("/v1/chat/completions", chat, methods=["POST"]),
        Route("/v1/completions", completions, methods=["POST"]),
        Route("/{path:path}", not_found, methods=["GET", "POST", "PUT", "DELETE", "PATCH"]),
    ]
    async def internal_error(request: Request, exc: Exception) -> Response:
        return _error(ApiError(500, f"the server failed on this request: {type(exc).__name__}: {exc}",
                               code="internal_error"))

    return Starlette(routes=routes, exception_handlers={Exception: internal_error})
