"""strata._sse.sse_data: the payloads of an event stream's data lines, up to [DONE]."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from strata._sse import sse_data


async def _lines(*lines: str) -> AsyncIterator[str]:
    for line in lines:
        yield line


def _read(*lines: str) -> list[str]:
    async def run() -> list[str]:
        return [d async for d in sse_data(_lines(*lines))]

    return asyncio.run(run())


def test_payloads_in_order_up_to_done() -> None:
    got = _read(
        ": keep-alive", 'data: {"a": 1}', "", "event: x", 'data:{"b": 2}  ', "data: [DONE]", 'data: {"c": 3}'
    )
    assert got == ['{"a": 1}', '{"b": 2}']


def test_a_stream_without_done_ends_with_its_lines() -> None:
    assert _read("data: one", "data: two") == ["one", "two"]
    assert _read() == []
