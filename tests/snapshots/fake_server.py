"""A deterministic stand-in for ``strata serve``, for snapshot tests only.

A tiny Starlette app on loopback that serves canned SSE replies and a ``/v1/status`` chosen by the
test, so that screenshots do not depend on a model's output or on timing.
"""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from collections.abc import AsyncIterator
from typing import Any

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

__all__ = ["FakeServer", "idle_status", "reading_status"]


def idle_status(**over: Any) -> dict[str, Any]:
    s: dict[str, Any] = {
        "model": "fake-moe",
        "state": "idle",
        "prompt": None,
        "queue": {"length": 0},
        "plan": {"n_slots": 96, "auto_chunk": 512, "max_context": 4096},
        "stats": {
            "lookups": 2000,
            "hits": 1744,
            "misses": 256,
            "slots_lent_now": 0,
            "last_chunk": 512,
            "n_past": 311,
            "state": 0,
        },
        "info": {"name": "fake-moe"},
        "config": {},
        "max_context": 4096,
        "last_request": {"timings": {"predicted_per_second": 42.5, "prompt_per_second": 850.0}},
        "engine": {"pid": None, "restarts": 0, "last_exit_code": None},
        "gpu": None,
        "budget": {"device": "cpu", "budget_bytes": 512 << 20, "slots": 96, "slots_lent_now": 0},
    }
    s.update(over)
    return s


def reading_status() -> dict[str, Any]:
    s = idle_status(state="reading", prompt={"done": 1536, "total": 4096, "tokens_per_second": 640.0})
    s["stats"] = dict(s["stats"], slots_lent_now=40, state=1, prompt_done=1536, prompt_total=4096)
    s["budget"] = dict(s["budget"], slots_lent_now=40)
    return s


class FakeServer:
    """Serve canned answers; change ``status``, ``reply``, ``error`` between steps of a test."""

    def __init__(
        self,
        *,
        strata: bool = True,
        reply: list[str] | None = None,
        reasoning: list[str] | None = None,
        chunk_delay: float = 0.0,
        status: dict[str, Any] | None = None,
        error: tuple[int, dict[str, Any]] | None = None,
        hold: bool = False,
    ) -> None:
        self.strata = strata
        self.reply = (
            reply
            if reply is not None
            else ["Hello", "! Here is ", "**bold** text and code:\n\n", "```python\nprint('hi')\n```\n"]
        )
        self.reasoning = reasoning or []
        self.chunk_delay = chunk_delay
        self.status = status or idle_status()
        self.error = error
        self.hold = hold  # keep the stream open after the reply until the client closes it
        self.requests: list[dict[str, Any]] = []
        self.closed_early = threading.Event()
        self.finished = threading.Event()
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None
        self.url = ""

    def _headers(self) -> dict[str, str]:
        return {"x-strata-server": "1"} if self.strata else {}

    async def _models(self, request: Request) -> Response:
        return JSONResponse(
            {"object": "list", "data": [{"id": "fake-moe", "object": "model"}]}, headers=self._headers()
        )

    async def _status(self, request: Request) -> Response:
        return JSONResponse(self.status, headers=self._headers())

    async def _health(self, request: Request) -> Response:
        return JSONResponse({"status": "ok"})

    async def _chat(self, request: Request) -> Response:
        body = await request.json()
        self.requests.append(body)
        if self.error is not None:
            code, err = self.error
            return JSONResponse({"error": err}, status_code=code, headers=self._headers())

        async def events() -> AsyncIterator[str]:
            def chunk(delta: dict[str, Any], finish: str | None = None, **extra: Any) -> str:
                c = {
                    "id": "chatcmpl-fake",
                    "object": "chat.completion.chunk",
                    "created": 0,
                    "model": "fake-moe",
                    "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
                    **extra,
                }
                return f"data: {json.dumps(c)}\n\n"

            try:
                yield chunk({"role": "assistant", "content": ""})
                for piece in self.reasoning:
                    if self.chunk_delay:
                        await asyncio.sleep(self.chunk_delay)
                    yield chunk({"reasoning_content": piece})
                for piece in self.reply:
                    if self.chunk_delay:
                        await asyncio.sleep(self.chunk_delay)
                    yield chunk({"content": piece})
                while self.hold:
                    await asyncio.sleep(0.05)
                n = len(self.reply)
                yield chunk(
                    {},
                    "stop",
                    usage={"prompt_tokens": 20, "completion_tokens": n, "total_tokens": 20 + n},
                    timings={
                        "prompt_n": 20,
                        "prompt_ms": 20.0,
                        "prompt_per_second": 1000.0,
                        "predicted_n": n,
                        "predicted_ms": 100.0,
                        "predicted_per_second": 40.0,
                    },
                )
                yield "data: [DONE]\n\n"
                self.finished.set()
            except asyncio.CancelledError:
                self.closed_early.set()
                raise

        return StreamingResponse(events(), media_type="text/event-stream", headers=self._headers())

    def start(self) -> FakeServer:
        app = Starlette(
            routes=[
                Route("/v1/models", self._models),
                Route("/v1/status", self._status),
                Route("/health", self._health),
                Route("/v1/chat/completions", self._chat, methods=["POST"]),
            ]
        )
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{sock.getsockname()[1]}"
        config = uvicorn.Config(app, log_level="error", lifespan="off")
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, kwargs={"sockets": [sock]}, daemon=True)
        self._thread.start()
        t0 = time.monotonic()
        while not self._server.started:
            if time.monotonic() - t0 > 10:
                raise RuntimeError("the fake server did not start")
            time.sleep(0.01)
        return self

    def stop(self) -> None:
        self.hold = False
        if self._server is not None:
            self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(5)

    def __enter__(self) -> FakeServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
