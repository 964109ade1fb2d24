"""The HTTP API: OpenAI-compatible endpoints plus strata's status, health and metrics.

``create_app(state)`` builds the Starlette application from these parts:

- ``requests``: the body read within its limit and decoded off the event loop, the fields checked;
- ``prompts``: messages through the chat template to token ids (the request's text stays text), the
  reply's length fitted to the context;
- ``streaming``: the run through the supervisor's FIFO, as server-sent events or one JSON answer;
- ``state``: what the handlers share, who a client is and what it may see;
- ``errors``: OpenAI's error body and strata's codes.

Every request that generates goes through the supervisor's FIFO; the server process itself never loads
the native library. ``/health`` is open and says only whether the engine serves; with ``--api-key``
every other endpoint needs the key, ``/metrics`` included.
"""

from __future__ import annotations

import asyncio
import dataclasses
import sys
import traceback
import uuid
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from .._enums import Device
from .._nvml import gpu_info
from .errors import ApiError, error_response, json_response
from .metrics import CONTENT_TYPE, EngineView, Metrics
from .prompts import chat_prompt, completion_prompt, fit_max_tokens
from .requests import gen_params, read_json
from .state import ServerState
from .streaming import (
    Choices,
    Generation,
    Watched,
    reply,
    reply_choices,
    stream_chat,
    stream_choices,
    stream_completion,
)
from .supervisor import EngineStartError

__all__ = ["ServerState", "create_app"]


class _Api:
    """The endpoints, over one ``ServerState``."""

    def __init__(self, state: ServerState) -> None:
        self.state = state
        self.sup = state.supervisor
        self.registry = state.metrics.registry(self._engine_view)

    def _engine_view(self) -> EngineView:
        sup = self.sup
        return EngineView(
            stats=sup.stats,
            restarts=sup.restarts,
            queue_length=sup.queue_length,
            running=len(sup.running_jobs()),
            ready=sup.ready,
        )

    async def health(self, request: Request) -> Response:
        sup = self.sup
        if sup.healthy:
            return json_response({"status": "ok"})
        if sup.unresponsive_since is not None:
            return json_response({"status": "unresponsive", "error": sup.unresponsive_message()}, 503)
        body: dict[str, Any] = {"status": sup.state if sup.state != "idle" else "loading"}
        if sup.public_error:
            body["error"] = sup.public_error
        return json_response(body, 503)

    async def models(self, request: Request) -> Response:
        self.state.authenticate(request)
        sup = self.sup
        meta: dict[str, Any] = {"n_vocab": self.state.tokenizer.n_vocab}
        if sup.info:
            meta.update({k: sup.info.get(k) for k in ("arch", "n_ctx_train", "n_params", "file_bytes")})
        if sup.plan:
            meta["max_context"] = sup.plan.get("max_context")
        return json_response(
            {
                "object": "list",
                "data": [
                    {
                        "id": self.state.model_name,
                        "object": "model",
                        "created": self.state.created,
                        "owned_by": "strata",
                        "meta": meta,
                    }
                ],
            }
        )

    async def status(self, request: Request) -> Response:
        client = self.state.authenticate(request)
        sup = self.sup
        plan, stats, running = sup.plan, sup.stats, sup.running
        budget = None
        if plan:
            budget = {
                "device": "cuda" if plan.get("device") == Device.CUDA else "cpu",
                "budget_bytes": plan.get("budget_bytes"),
                "slots": plan.get("n_slots"),
                "slots_lent_now": (stats or {}).get("slots_lent_now", 0),
            }
        return json_response(
            {
                "model": self.state.model_name,
                "state": sup.state,
                "prompt": sup.prompt_progress if sup.state == "reading" else None,
                "queue": {
                    "length": sup.queue_length,
                    "waiting": [{"seq": j.seq, "position": k + 1} for k, j in enumerate(sup.waiting())],
                    "running": running.seq if running is not None else None,
                    # every request the engine runs now, one per sequence (--parallel), first started first
                    "parallel": sup.parallel,
                    "sequences": [
                        {
                            "seq": j.seq,
                            "state": j.phase,
                            "prompt": j.progress if j.phase == "reading" else None,
                            "tokens": j.n_tokens,
                        }
                        for j in sup.running_jobs()
                    ],
                },
                "plan": plan,
                # each device of a layer split: its layers and its own plan (the counters are as at open)
                "devices": [
                    {k: d.get(k) for k in ("device", "layer_begin", "layer_end", "plan")} for d in sup.devices
                ],
                "stats": stats,
                "info": sup.info,
                "config": sup.config.to_dict(),
                "max_context": int((plan or {}).get("max_context") or sup.config.max_context or 0),
                "last_request": self.state.last_request_for(client),
                "engine": {
                    "pid": sup.pid,
                    "restarts": sup.restarts,
                    "last_exit_code": sup.last_exit_code,
                    "error": sup.public_error,
                },
                "gpu": await asyncio.to_thread(gpu_info),
                "budget": budget,
            }
        )

    async def metrics(self, request: Request) -> Response:
        self.state.authenticate(request)
        return Response(
            Metrics.render(self.registry), media_type=CONTENT_TYPE, headers={"x-strata-server": "1"}
        )

    async def chat(self, request: Request) -> Response:
        return await self._complete(request, chat=True)

    async def completions(self, request: Request) -> Response:
        return await self._complete(request, chat=False)

    async def _complete(self, request: Request, *, chat: bool) -> Response:
        state = self.state
        endpoint = "chat" if chat else "completions"
        try:
            client = state.authenticate(request)
            body = await read_json(request, state.max_body)
            gen = gen_params(body, chat=chat, cache_prompt=state.cache_prompt)
            ctx = await self._max_context()
            if chat:
                built = await asyncio.to_thread(
                    chat_prompt, state.tokenizer, state.template, body, ctx=ctx, max_tokens=gen.max_tokens
                )
            else:
                built = await asyncio.to_thread(
                    completion_prompt, state.tokenizer, body, ctx=ctx, max_tokens=gen.max_tokens
                )
            max_tokens = fit_max_tokens(len(built.ids), gen.max_tokens, ctx, built.param)
        except ApiError as e:
            state.metrics.request(endpoint, e.status)
            return error_response(e)
        if gen.n > 1:  # a generation per choice, choice i sampled with seed + i
            gens = [
                Generation(
                    state,
                    client,
                    built.ids,
                    max_tokens,
                    dataclasses.replace(gen, seed=(gen.seed + i) & ((1 << 64) - 1)),
                    built.think_open,
                    built.tools,
                    built.grammar,
                    index=i,
                )
                for i in range(gen.n)
            ]
            ch = Choices(gens)
            if gen.stream:
                state.metrics.request(endpoint, 200)
                return Watched(ch, stream_choices(ch, chat=chat))  # type: ignore[return-value]

            async def make_n() -> tuple[int, dict[str, Any]]:
                status, data = await reply_choices(ch, chat=chat)
                state.metrics.request(endpoint, status)
                return status, data

            return Watched(ch, None, make_n)  # type: ignore[return-value]
        g = Generation(
            state, client, built.ids, max_tokens, gen, built.think_open, built.tools, built.grammar
        )
        if gen.stream:
            state.metrics.request(endpoint, 200)
            return Watched(g, stream_chat(g) if chat else stream_completion(g))  # type: ignore[return-value]

        async def make() -> tuple[int, dict[str, Any]]:
            status, data = await reply(g, chat=chat)
            state.metrics.request(endpoint, status)
            return status, data

        return Watched(g, None, make)  # type: ignore[return-value]

    async def _max_context(self) -> int:
        sup = self.sup
        if sup.plan is None:
            try:
                await sup.ensure_worker()
            except EngineStartError as e:
                raise ApiError(503, sup.public_error or e.message, code="engine_start_failed") from None
        return int((sup.plan or {}).get("max_context") or 0)


_ROUTES = (
    ("/health", "health", "GET"),
    ("/metrics", "metrics", "GET"),
    ("/v1/models", "models", "GET"),
    ("/v1/status", "status", "GET"),
    ("/v1/chat/completions", "chat", "POST"),
    ("/v1/completions", "completions", "POST"),
)


def create_app(state: ServerState) -> Starlette:
    api = _Api(state)
    allowed = {path: method for path, _, method in _ROUTES}

    async def unknown(request: Request) -> Response:
        path = request.url.path.rstrip("/") or "/"
        if path in allowed:
            return error_response(
                ApiError(
                    405,
                    f"{request.method} is not allowed on {path}: use {allowed[path]}",
                    code="method_not_allowed",
                    headers={"Allow": allowed[path]},
                )
            )
        return error_response(
            ApiError(404, f"no such endpoint: {request.method} {request.url.path}", code="not_found")
        )

    async def api_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, ApiError)
        return error_response(exc)

    async def internal_error(request: Request, exc: Exception) -> Response:
        ref = uuid.uuid4().hex[:12]
        print(
            f"strata serve: request {ref} failed:\n"
            + "".join(traceback.format_exception(type(exc), exc, exc.__traceback__)),
            file=sys.stderr,
            flush=True,
        )
        return error_response(
            ApiError(
                500, f"the server failed on this request (reference {ref} in its log)", code="internal_error"
            )
        )

    routes = [Route(path, getattr(api, name), methods=[method]) for path, name, method in _ROUTES]
    routes.append(
        Route("/{path:path}", unknown, methods=["GET", "HEAD", "POST", "PUT", "DELETE", "PATCH", "OPTIONS"])
    )
    return Starlette(routes=routes, exception_handlers={ApiError: api_error, Exception: internal_error})
