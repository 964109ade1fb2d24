"""Streaming: one request's run through the FIFO, as server-sent events or one JSON reply.

``Generation`` submits the command and turns the worker's events into text pieces (stop strings cut,
UTF-8 kept whole), usage and timings. ``stream_chat`` and ``stream_completion`` write OpenAI's chunks;
``reply`` writes the whole answer. With tools, a chat reply's content goes through the tool-call
parser (``strata.server.tools``): calls leave as ``tool_calls`` (streamed: the id and name, then the
arguments) and the reply ends with ``finish_reason: "tool_calls"``. Whatever ends a reply early (the
engine failing, the server shutting down, an engine that stopped answering) ends a stream with an error
event and ``[DONE]``, never with a cut connection. ``Watched`` is the ASGI response that stops the generation as soon as the
client disconnects.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
import uuid
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from starlette.types import Receive, Scope, Send

from ..think import ThinkSplitter
from ..tokenizer import Tokenizer
from .errors import ApiError, engine_error, json_response
from .protocol import GenerateCommand
from .requests import GenParams
from .state import ServerState
from .supervisor import Job
from .tools import ToolCall, ToolSpec, ToolStream, parse_calls

__all__ = [
    "Choices",
    "Generation",
    "StopMatcher",
    "Watched",
    "reply",
    "reply_choices",
    "stream_chat",
    "stream_choices",
    "stream_completion",
]


class StopMatcher:
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
class Piece:
    text: str
    token: int  # -1: text held back until the end (no token of its own)
    logprob: float | None = None
    top: list[list[Any]] | None = None


class Generation:
    """One request's run through the FIFO: text pieces as they come, then the result."""

    def __init__(
        self,
        state: ServerState,
        client: str,
        prompt: list[int],
        max_tokens: int,
        gen: GenParams,
        think_open: bool = False,
        tools: ToolSpec | None = None,
        grammar: str = "",
        index: int = 0,
    ) -> None:
        self.state = state
        self.index = index  # the choice this generation is (n > 1: one Generation per choice)
        self.tools = tools if tools is not None and tools.active else None
        self.n_calls = 0  # tool calls found in the reply (set by the writer)
        self.client = client
        self.prompt = prompt
        self.gen = gen
        self.think_open = think_open
        tok = state.tokenizer
        command = GenerateCommand(
            prompt=prompt,
            max_tokens=max_tokens,
            temperature=gen.temperature,
            top_k=gen.top_k,
            top_p=gen.top_p,
            min_p=gen.min_p,
            seed=gen.seed,
            stop_tokens=[] if gen.ignore_eos else sorted(tok.eog_ids),
            stop_at_eos=not gen.ignore_eos,
            logprobs=gen.logprobs,
            top_logprobs=gen.top_logprobs,
            cache_prompt=gen.cache_prompt,
            cache_scope=f"{client}/{gen.prompt_cache_key}",
            grammar=grammar,
        )
        self.job: Job = state.supervisor.submit(command)
        self.decoder = tok.stream_decoder()
        # a family whose tool-call tags are control tokens: their text is kept for the parser
        marks = self.tools.fmt.kept if self.tools is not None else ()
        self.keep_ids = {i for i in (tok.token_id(m) for m in marks) if i is not None and tok.is_special(i)}
        self.stopper = StopMatcher(gen.stop)
        self.tokens: list[int] = []
        self.result: dict[str, Any] | None = None
        self.failed = False
        self.client_gone = False
        self.t0 = time.monotonic()
        self._drainer: asyncio.Task[None] | None = None

    def client_disconnected(self) -> None:
        if not self.job.finished.is_set() and not self.client_gone:
            self.client_gone = True
            self.state.metrics.cancelled += 1
            self.job.cancel()

    async def pieces(self) -> AsyncIterator[Piece | dict[str, Any]]:
        """Text pieces (``Piece``) and progress/queue notes (dicts); sets ``self.result`` at the end.
        Raises ApiError when the engine fails."""
        try:
            pos = self.job.position
            sup = self.state.supervisor
            if pos > 1 or (pos == 1 and len(sup.running_jobs()) >= sup.parallel):
                yield {"queued": pos}
            while True:
                ev = await self.job.events.get()
                kind = ev.get("ev")
                if kind == "token":
                    tid = int(ev["id"])
                    self.tokens.append(tid)
                    if self.stopper.hit:
                        continue
                    if tid in self.keep_ids:  # a control token that spells the tool-call syntax stays text
                        raw = self.decoder.flush() + self.state.tokenizer.token_bytes(tid).decode(
                            "utf-8", "replace"
                        )
                        text = self.stopper.feed(raw)
                    else:
                        text = self.stopper.feed(self.decoder.feed(tid))
                    if self.stopper.hit:
                        self.job.cancel()  # the rest is not wanted; the worker stops within a token
                    yield Piece(text, tid, ev.get("logprob"), ev.get("top_logprobs"))
                elif kind == "progress":
                    yield {"progress": (ev.get("done"), ev.get("total"))}
                elif kind == "started":
                    yield {"started": True}
                elif kind == "done":
                    if not self.stopper.hit:
                        tail = self.stopper.feed(self.decoder.flush())
                        tail += "" if self.stopper.hit else self.stopper.flush()
                        if tail:
                            yield Piece(tail, -1)
                    self.result = ev
                    self._account(ev)
                    return
                elif kind == "error":
                    self.failed = True
                    raise engine_error(ev, self.state.model_path)
        finally:
            if self.result is None and not self.failed:
                # the client went away mid-reply: stop the engine (unless it is done already), then let
                # the rest drain in the background so that the request is still accounted for
                self.client_disconnected()
                if not (self.job.finished.is_set() and self.job.events.empty()):
                    self._drainer = asyncio.get_running_loop().create_task(self._drain())

    async def _drain(self) -> None:
        while True:
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

    @property
    def finish_reason(self) -> str:
        r = self.result or {}
        if self.n_calls:
            return "tool_calls"
        if self.stopper.hit:
            return "stop"
        if r.get("closed_early"):
            return "length"  # the grammar closed the reply early to fit max_tokens
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
        # the worker reuses only a prefix that this client's scope wrote (see strata.server.state)
        cached = int((self.result or {}).get("cached_tokens") or 0)
        n = len(self.prompt)
        return {
            "prompt_tokens": n,
            "completion_tokens": t["predicted_n"],
            "total_tokens": n + t["predicted_n"],
            "prompt_tokens_details": {"cached_tokens": cached},
        }

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
        self.state.record(
            self.client,
            {
                "timings": t,
                "finish_reason": ev.get("finish_reason"),
                "seq": self.job.seq,
                "strata": {k: v for k, v in self.extension().items() if k != "prompt_token_ids"},
            },
        )


# ---- the answer --------------------------------------------------------------------------------


def _sse(data: dict[str, Any] | str) -> bytes:
    payload = data if isinstance(data, str) else json.dumps(data, ensure_ascii=False)
    return f"data: {payload}\n\n".encode()


def _note(p: dict[str, Any]) -> bytes | None:
    if "progress" in p:
        done, total = p["progress"]
        return f": reading {done}/{total}\n\n".encode()
    if "queued" in p:
        return f": queued at position {p['queued']}\n\n".encode()
    return None


def _split_delta(reasoning: str, content: str) -> dict[str, Any]:
    d: dict[str, Any] = {}
    if reasoning:
        d["reasoning_content"] = reasoning
    if content or not reasoning:
        d["content"] = content
    return d


@dataclass
class _Chunks:
    """The fields every chunk of one stream shares."""

    object: str
    model: str
    id: str
    created: int = field(default_factory=lambda: int(time.time()))

    def sse(self, choices: list[dict[str, Any]], **extra: Any) -> bytes:
        return _sse(
            {
                "id": self.id,
                "object": self.object,
                "created": self.created,
                "model": self.model,
                "choices": choices,
                **extra,
            }
        )


async def _ended(g: Generation, c: _Chunks, body: AsyncGenerator[bytes, None]) -> AsyncIterator[bytes]:
    """``body``, then the usage chunk (when asked for) and ``[DONE]``; a failure ends the stream with
    its error event and ``[DONE]`` instead."""
    async with contextlib.aclosing(body):
        try:
            async for chunk in body:
                yield chunk
        except ApiError as e:
            yield _sse(e.body())
            yield _sse("[DONE]")
            return
    if g.gen.include_usage:
        yield c.sse([], usage=g.usage(), timings=g.timings(), strata=g.extension())
    yield _sse("[DONE]")


def stream_chat(g: Generation) -> AsyncIterator[bytes]:
    c = _Chunks("chat.completion.chunk", g.state.model_name, "chatcmpl-" + uuid.uuid4().hex[:24])
    return _ended(g, c, _chat_chunks(g, c))


def stream_completion(g: Generation) -> AsyncIterator[bytes]:
    c = _Chunks("text_completion", g.state.model_name, "cmpl-" + uuid.uuid4().hex[:24])
    return _ended(g, c, _completion_chunks(g, c))


async def _chat_chunks(g: Generation, c: _Chunks) -> AsyncGenerator[bytes, None]:
    tok = g.state.tokenizer

    def chunk(delta: dict[str, Any], finish: str | None = None, logprobs: Any = None, **extra: Any) -> bytes:
        return c.sse(
            [{"index": g.index, "delta": delta, "logprobs": logprobs, "finish_reason": finish}], **extra
        )

    yield chunk({"role": "assistant", "content": ""})
    splitter = ThinkSplitter(g.think_open) if g.gen.split_reasoning else None
    calls = (
        ToolStream(g.tools, eager=g.tools.choice in ("required", "function")) if g.tools is not None else None
    )

    def deltas(d: dict[str, Any], events: list[tuple[str, str | ToolCall]]) -> list[dict[str, Any]]:
        # the content of ``d`` goes through the tool-call parser: content deltas and call deltas
        out: list[dict[str, Any]] = (
            [{k: v for k, v in d.items() if k != "content"}] if "reasoning_content" in d else []
        )
        for kind, x in events:
            if isinstance(x, ToolCall):
                out.extend(_call_deltas(g.n_calls, x) if kind == "call" else _call_deltas(g.n_calls, x)[:1])
                g.n_calls += 1
            elif kind == "args":
                out.append({"tool_calls": [{"index": g.n_calls - 1, "function": {"arguments": x}}]})
            elif x and not (g.n_calls and not x.strip()):  # the separator between calls is no content
                out.append({"content": x})
        return out

    async for p in g.pieces():
        if isinstance(p, Piece):
            if not p.text and p.logprob is None:
                continue
            d = _split_delta(*splitter.feed(p.text)) if splitter is not None else {"content": p.text}
            if splitter is not None and d == {"content": ""} and p.logprob is None:
                continue  # all of it held back (a possible tag)
            lp = chat_logprobs(tok, [p]) if g.gen.logprobs else None
            if calls is None:
                yield chunk(d, None, lp)
                continue
            ds = deltas(d, calls.feed(d.get("content") or ""))
            if not ds and lp is not None:
                ds = [{}]
            for k, x in enumerate(ds):
                yield chunk(x, None, lp if k == 0 else None)
        elif (note := _note(p)) is not None:
            yield note
    if splitter is not None:
        rest = splitter.flush()
        if any(rest):
            if calls is None:
                yield chunk(_split_delta(*rest))
            else:
                for x in deltas(_split_delta(*rest), calls.feed(rest[1])):
                    yield chunk(x)
    if calls is not None:
        for x in deltas({}, calls.flush()):
            yield chunk(x)
    extra: dict[str, Any] = {"timings": g.timings(), "strata": g.extension()}
    if g.gen.include_usage:
        extra["usage"] = None
    yield chunk({}, g.finish_reason, **extra)


def _call_deltas(index: int, call: ToolCall, piece: int = 32) -> list[dict[str, Any]]:
    """One call as OpenAI streams it: the id and name first, then the arguments in pieces."""
    head = {
        "tool_calls": [
            {
                "index": index,
                "id": call.id,
                "type": "function",
                "function": {"name": call.name, "arguments": ""},
            }
        ]
    }
    args = call.arguments
    return [head] + [
        {"tool_calls": [{"index": index, "function": {"arguments": args[i : i + piece]}}]}
        for i in range(0, len(args), piece)
    ]


async def _completion_chunks(g: Generation, c: _Chunks) -> AsyncGenerator[bytes, None]:
    def chunk(text: str, finish: str | None = None, logprobs: Any = None, **extra: Any) -> bytes:
        return c.sse(
            [{"index": g.index, "text": text, "logprobs": logprobs, "finish_reason": finish}], **extra
        )

    async for p in g.pieces():
        if isinstance(p, Piece):
            if p.text or p.logprob is not None:
                yield chunk(
                    p.text, None, completion_logprobs(g.state.tokenizer, [p]) if g.gen.logprobs else None
                )
        elif (note := _note(p)) is not None:
            yield note
    yield chunk("", g.finish_reason, timings=g.timings(), strata=g.extension())


async def reply(g: Generation, *, chat: bool) -> tuple[int, dict[str, Any]]:
    """The whole answer as one JSON body: (status, body)."""
    pieces: list[Piece] = []
    try:
        async for p in g.pieces():
            if isinstance(p, Piece):
                pieces.append(p)
    except ApiError as e:
        return e.status, e.body()
    text = "".join(p.text for p in pieces)
    tok = g.state.tokenizer
    choice: dict[str, Any] = {"index": g.index, "finish_reason": g.finish_reason}
    if chat:
        choice["message"] = {"role": "assistant", "content": text}
        if g.gen.split_reasoning:
            sp = ThinkSplitter(g.think_open)
            r1, c1 = sp.feed(text)
            r2, c2 = sp.flush()
            choice["message"] = {
                "role": "assistant",
                "content": c1 + c2,
                "reasoning_content": (r1 + r2) or None,
            }
        if g.tools is not None:
            content, calls = parse_calls(choice["message"]["content"], g.tools)
            if calls:
                g.n_calls = len(calls)
                choice["message"].update(content=content or None, tool_calls=[c.message() for c in calls])
                choice["finish_reason"] = g.finish_reason
        choice["logprobs"] = chat_logprobs(tok, pieces) if g.gen.logprobs else None
    else:
        choice["text"] = text
        choice["logprobs"] = completion_logprobs(tok, pieces) if g.gen.logprobs else None
    return 200, {
        "id": ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex[:24],
        "object": "chat.completion" if chat else "text_completion",
        "created": int(time.time()),
        "model": g.state.model_name,
        "choices": [choice],
        "usage": g.usage(),
        "timings": g.timings(),
        "strata": g.extension(),
    }


# ---- n > 1: one generation per choice -----------------------------------------------------------


class Choices:
    """The n generations of one request (``n`` > 1), each a job of its own: with ``--parallel`` they run
    side by side. A client that goes away cancels them all."""

    def __init__(self, gens: list[Generation]) -> None:
        self.gens = gens
        self.job = gens[0].job

    def client_disconnected(self) -> None:
        for g in self.gens:
            g.client_disconnected()

    def usage(self) -> dict[str, Any]:
        """The prompt once, the completions of every choice."""
        u = self.gens[0].usage()
        done = sum(g.usage()["completion_tokens"] for g in self.gens)
        return {**u, "completion_tokens": done, "total_tokens": u["prompt_tokens"] + done}


async def reply_choices(ch: Choices, *, chat: bool) -> tuple[int, dict[str, Any]]:
    """``reply`` of every choice, as one body with ``choices`` in index order (the first failure, if any)."""
    answers = await asyncio.gather(*(reply(g, chat=chat) for g in ch.gens))
    for status, body in answers:
        if status != 200:
            for g in ch.gens:
                g.job.cancel()
            return status, body
    body = answers[0][1]
    body["choices"] = [b["choices"][0] for _, b in answers]
    body["usage"] = ch.usage()
    body["strata"] = {**body["strata"], "choices": [b["strata"] for _, b in answers]}
    return 200, body


def stream_choices(ch: Choices, *, chat: bool) -> AsyncIterator[bytes]:
    """One stream of every choice's chunks as they come (each names its ``index``), then the usage of all
    (when asked for) and ``[DONE]``."""
    if chat:
        c = _Chunks("chat.completion.chunk", ch.gens[0].state.model_name, "chatcmpl-" + uuid.uuid4().hex[:24])
        bodies = [_chat_chunks(g, c) for g in ch.gens]
    else:
        c = _Chunks("text_completion", ch.gens[0].state.model_name, "cmpl-" + uuid.uuid4().hex[:24])
        bodies = [_completion_chunks(g, c) for g in ch.gens]
    return _merged(ch, c, bodies)


async def _merged(ch: Choices, c: _Chunks, bodies: list[AsyncGenerator[bytes, None]]) -> AsyncIterator[bytes]:
    out: asyncio.Queue[bytes | ApiError | None] = asyncio.Queue()

    async def pump(body: AsyncGenerator[bytes, None]) -> None:
        try:
            async with contextlib.aclosing(body):
                async for chunk in body:
                    await out.put(chunk)
        except ApiError as e:
            await out.put(e)
        finally:
            await out.put(None)

    pumps = [asyncio.create_task(pump(b)) for b in bodies]
    failed: ApiError | None = None
    try:
        left = len(pumps)
        while left:
            x = await out.get()
            if x is None:
                left -= 1
            elif isinstance(x, ApiError):
                failed = x
                for g in ch.gens:
                    g.job.cancel()
                break
            else:
                yield x
    finally:
        for t in pumps:
            t.cancel()
        for t in pumps:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await t
    if failed is not None:
        yield _sse(failed.body())
        yield _sse("[DONE]")
        return
    g0 = ch.gens[0]
    if g0.gen.include_usage:
        yield c.sse([], usage=ch.usage(), timings=g0.timings(), strata=g0.extension())
    yield _sse("[DONE]")


class Watched:
    """An ASGI response that cancels the generation as soon as the client disconnects: a stream
    (``body``) or one JSON answer (``make_json``); ``on_status`` is told the status it ends with."""

    def __init__(
        self,
        g: Generation | Choices,
        body: AsyncIterator[bytes] | None,
        make_json: Callable[[], Awaitable[tuple[int, dict[str, Any]]]] | None = None,
    ) -> None:
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
                assert self.make_json is not None
                status, data = await self.make_json()
                with contextlib.suppress(OSError):
                    await json_response(data, status)(scope, receive, send)
        finally:
            watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await watcher

    async def _stream(self, send: Send) -> None:
        assert self.body is not None
        headers = [
            (b"content-type", b"text/event-stream; charset=utf-8"),
            (b"cache-control", b"no-cache"),
            (b"x-strata-server", b"1"),
            (b"x-strata-request-seq", str(self.g.job.seq).encode()),
        ]
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


# ---- logprobs ----------------------------------------------------------------------------------


def _lp_entry(tok: Tokenizer, tid: int, lp: float) -> dict[str, Any]:
    b = tok.token_bytes(tid)
    return {"token": b.decode("utf-8", "replace"), "logprob": lp, "bytes": list(b)}


def chat_logprobs(tok: Tokenizer, pieces: list[Piece]) -> dict[str, Any]:
    content = []
    for p in pieces:
        if p.token < 0 or p.logprob is None:
            continue
        e = _lp_entry(tok, p.token, p.logprob)
        e["top_logprobs"] = [_lp_entry(tok, int(i), float(lp)) for i, lp in (p.top or [])]
        content.append(e)
    return {"content": content}


def completion_logprobs(tok: Tokenizer, pieces: list[Piece]) -> dict[str, Any]:
    out: dict[str, Any] = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
    offset = 0
    for p in pieces:
        if p.token < 0 or p.logprob is None:
            continue
        text = tok.token_bytes(p.token).decode("utf-8", "replace")
        out["tokens"].append(text)
        out["token_logprobs"].append(p.logprob)
        out["top_logprobs"].append(
            {tok.token_bytes(int(i)).decode("utf-8", "replace"): float(lp) for i, lp in (p.top or [])}
        )
        out["text_offset"].append(offset)
        offset += len(p.text)
    return out
