"""An async client for OpenAI-compatible chat servers, with strata's extensions.

``ChatClient.stream_chat`` yields ``Delta`` events as the reply streams in (answer text and reasoning
separated, whether the server sends ``reasoning_content`` or inline ``<think>`` tags) and a final
``Finished`` event with the usage and timings. Closing the iterator early closes the HTTP stream, which is
how a reply is cancelled: the server notices the closed connection and stops generating.

Failures raise ``ApiError`` (the server answered with an error; ``code`` is the OpenAI error code) or
``Unreachable`` (no answer at all), each with a message a person can act on.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import httpx

from strata._sse import sse_data
from strata.think import ThinkSplitter

__all__ = [
    "ApiError",
    "ChatClient",
    "Delta",
    "Finished",
    "ServerInfo",
    "ThinkSplitter",
    "Unreachable",
    "friendly_error",
]


class ApiError(Exception):
    """The server answered with an error body."""

    def __init__(self, message: str, *, code: str | None = None, status: int = 0) -> None:
        super().__init__(message)
        self.message = message
        self.code = code
        self.status = status


class Unreachable(Exception):
    """The server could not be reached (refused, timed out, or the connection dropped)."""


@dataclass
class Delta:
    """A piece of the reply: answer text, reasoning text, or both."""

    content: str = ""
    reasoning: str = ""


@dataclass
class Finished:
    """The end of a reply."""

    finish_reason: str | None = None
    usage: dict[str, Any] | None = None
    timings: dict[str, Any] | None = None
    strata: dict[str, Any] | None = None
    ttft_s: float | None = None  # seconds from the request to the first piece of the reply
    elapsed_s: float = 0.0
    n_chunks: int = 0  # streamed pieces that carried text


@dataclass
class ServerInfo:
    """What a probe of the server found."""

    is_strata: bool
    models: list[str] = field(default_factory=list)


def _error_from_body(status: int, body: bytes) -> ApiError:
    try:
        err = json.loads(body)["error"]
        if isinstance(err, dict):
            return ApiError(str(err.get("message") or f"HTTP {status}"), code=err.get("code"), status=status)
        return ApiError(str(err), status=status)
    except (ValueError, KeyError, TypeError):
        text = body.decode("utf-8", "replace").strip()[:300]
        return ApiError(f"HTTP {status}: {text or 'no details'}", status=status)


def friendly_error(exc: BaseException) -> str:
    """Words for a failure that tell a person what happened and what to do next."""
    if isinstance(exc, Unreachable):
        return f"{exc}"
    if isinstance(exc, ApiError):
        code = exc.code or ""
        if code == "engine_exited":
            return f"{exc.message} — it restarts with your next message."
        if code == "context_length_exceeded":
            return f"{exc.message} — start a new conversation (/new) or shorten the message."
        if code == "invalid_api_key":
            return f"{exc.message} — pass the right key with --api-key."
        if code == "engine_start_failed":
            return f"The engine could not start: {exc.message}"
        if code == "lend_failed":
            return f"The engine could not lend memory for the prompt: {exc.message}"
        if code == "invalid_request":
            return f"The server refused the request: {exc.message} — check /temp, /top-p, /max-tokens, /seed."
        return exc.message
    return f"{type(exc).__name__}: {exc}"


class ChatClient:
    """One server, one ``httpx.AsyncClient``."""

    def __init__(self, base_url: str, api_key: str | None = None, *, timeout: float = 10.0) -> None:
        self.base_url = base_url.rstrip("/")
        if self.base_url.endswith("/v1"):
            self.base_url = self.base_url[:-3]
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        # reading a long prompt can take minutes before the first byte of a reply: no read timeout there
        self._http = httpx.AsyncClient(
            base_url=self.base_url, headers=headers, timeout=httpx.Timeout(timeout, read=None)
        )
        self._timeout = timeout

    async def aclose(self) -> None:
        await self._http.aclose()

    async def _get(self, path: str) -> httpx.Response:
        try:
            return await self._http.get(path, timeout=self._timeout)
        except httpx.HTTPError as e:
            raise Unreachable(f"cannot reach {self.base_url} ({type(e).__name__}: {e or 'no answer'})") from e

    async def probe(self) -> ServerInfo:
        """Ask for the model list; the ``x-strata-server`` header tells whether the server is strata."""
        r = await self._get("/v1/models")
        if r.status_code != 200:
            raise _error_from_body(r.status_code, r.content)
        is_strata = r.headers.get("x-strata-server") == "1"
        try:
            models = [m["id"] for m in r.json().get("data", [])]
        except (ValueError, KeyError, TypeError, AttributeError):
            models = []
        return ServerInfo(is_strata=is_strata, models=models)

    async def status(self) -> dict[str, Any]:
        r = await self._get("/v1/status")
        if r.status_code != 200:
            raise _error_from_body(r.status_code, r.content)
        return dict(r.json())

    async def stream_chat(
        self, messages: list[dict[str, str]], *, model: str, params: dict[str, Any]
    ) -> AsyncIterator[Delta | Finished]:
        """Stream one reply. ``params`` are extra request fields (temperature, top_p, max_tokens, ...)."""
        body: dict[str, Any] = {
            "model": model,
            "messages": messages,
            "stream": True,
            "stream_options": {"include_usage": True},
            **params,
        }
        t0 = time.perf_counter()
        fin = Finished()
        splitter = ThinkSplitter()
        try:
            async with self._http.stream("POST", "/v1/chat/completions", json=body) as r:
                if r.status_code != 200:
                    raise _error_from_body(r.status_code, await r.aread())
                async for data in sse_data(r.aiter_lines()):
                    try:
                        chunk = json.loads(data)
                    except ValueError:
                        continue
                    if "error" in chunk:
                        err = chunk["error"]
                        if isinstance(err, dict):
                            raise ApiError(
                                str(err.get("message")), code=err.get("code"), status=r.status_code
                            )
                        raise ApiError(str(err), status=r.status_code)
                    for key in ("usage", "timings", "strata"):
                        if chunk.get(key):
                            setattr(fin, key, chunk[key])
                    for choice in chunk.get("choices") or []:
                        delta = choice.get("delta") or {}
                        split = splitter.feed(delta.get("content") or "")
                        piece = Delta(
                            content=split.content,
                            reasoning=(delta.get("reasoning_content") or delta.get("reasoning") or "")
                            + split.reasoning,
                        )
                        if choice.get("finish_reason"):
                            fin.finish_reason = choice["finish_reason"]
                        if piece.content or piece.reasoning:
                            if fin.ttft_s is None:
                                fin.ttft_s = time.perf_counter() - t0
                            fin.n_chunks += 1
                            yield piece
        except httpx.HTTPError as e:
            raise Unreachable(
                f"lost the connection to {self.base_url} ({type(e).__name__}: {e or 'no answer'})"
            ) from e
        tail = splitter.flush()
        if tail.content or tail.reasoning:
            yield Delta(content=tail.content, reasoning=tail.reasoning)
        fin.elapsed_s = time.perf_counter() - t0
        yield fin
