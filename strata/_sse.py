"""Reading an OpenAI-style server-sent event stream: the one reader of the chat's client
(strata_tui/client.py) and of the server benchmark (strata_bench/_server_bench.py)."""

from __future__ import annotations

from collections.abc import AsyncIterable, AsyncIterator

__all__ = ["sse_data"]


async def sse_data(lines: AsyncIterable[str]) -> AsyncIterator[str]:
    """The payload of each ``data:`` line, in order, up to (not including) ``data: [DONE]``; other lines
    (comments, blank separators, ``event:``) are passed over. What a payload holds is the caller's."""
    async for line in lines:
        if not line.startswith("data:"):
            continue
        data = line[5:].strip()
        if data == "[DONE]":
            return
        yield data
