"""Screenshots of the chat at a fixed terminal size, against a deterministic fake server.

Update them after a deliberate change of the look with ``pytest tests/snapshots --snapshot-update``
and look at the SVGs before committing them.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from fake_server import FakeServer, reading_status
from textual.pilot import Pilot

from strata_tui.app import StrataChat
from strata_tui.store import Settings, Store, StoredMessage
from strata_tui.widgets import ConversationList, MessageView

SIZE = (120, 36)


async def wait_for(pilot: Pilot[None], cond: Callable[[], bool], timeout: float = 10.0) -> None:
    loop = asyncio.get_running_loop()
    t_end = loop.time() + timeout
    while not cond():
        if loop.time() > t_end:
            raise AssertionError("condition not reached in time")
        await pilot.pause(0.05)
    await pilot.pause()


@pytest.fixture
def fake() -> Iterator[FakeServer]:
    fs = FakeServer().start()
    yield fs
    fs.stop()


def make_app(fs: FakeServer, tmp_path: Path) -> StrataChat:
    return StrataChat(server_url=fs.url, db_path=tmp_path / "chat.sqlite3")


def roles(app: StrataChat) -> list[str]:
    assert app.chat is not None
    return [v.role for v in app.chat.log_view.messages()]


def test_main_screen(snap_compare, fake: FakeServer, tmp_path: Path) -> None:
    # a stored conversation (its timings fixed, unlike a live reply's), opened from the sidebar
    store = Store(tmp_path / "chat.sqlite3")
    conv = store.create("Show me some code", settings=Settings(temperature=0.2, max_tokens=256))
    store.add_message(conv.id, StoredMessage("user", "Show me some code"))
    store.add_message(
        conv.id,
        StoredMessage(
            "assistant",
            "Here is **bold** text and code:\n\n```python\nfor i in range(3):\n    print(i)\n```\n",
            reasoning="The user wants a short example.",
            meta={
                "ttft_s": 0.21,
                "timings": {"predicted_n": 18, "predicted_per_second": 40.0},
                "usage": {"total_tokens": 38},
                "finish_reason": "stop",
            },
        ),
    )
    store.close()
    app = make_app(fake, tmp_path)

    async def run_before(pilot: Pilot[None]) -> None:
        await wait_for(
            pilot, lambda: app.chat is not None and app.chat.connected and app.chat.conv is not None
        )
        sidebar = app.chat.query_one("#sidebar", ConversationList)
        await wait_for(pilot, lambda: len(sidebar.titles()) == 2)
        sidebar.query_one("#conversations").focus()
        await pilot.press("down", "enter")
        await wait_for(pilot, lambda: roles(app) == ["user", "assistant"])

    assert snap_compare(app, terminal_size=SIZE, run_before=run_before)


def test_engine_panel_reading_prompt(snap_compare, tmp_path: Path) -> None:
    fs = FakeServer(reply=[], hold=True, status=reading_status()).start()
    app = make_app(fs, tmp_path)

    async def run_before(pilot: Pilot[None]) -> None:
        await wait_for(
            pilot, lambda: app.chat is not None and app.chat.connected and app.chat.conv is not None
        )
        await pilot.press(*"Summarise this long document", "enter")
        await wait_for(
            pilot,
            lambda: (
                app.chat is not None
                and app.chat.reply is not None
                and "reading the prompt" in app.chat.reply.view.footer_text
            ),
        )

    try:
        assert snap_compare(app, terminal_size=SIZE, run_before=run_before)
    finally:
        fs.stop()


def test_error_in_conversation(snap_compare, tmp_path: Path) -> None:
    err = {
        "message": "the engine stopped unexpectedly (exit code 1)",
        "type": "server_error",
        "param": None,
        "code": "engine_exited",
    }
    fs = FakeServer(error=(500, err)).start()
    app = make_app(fs, tmp_path)

    async def run_before(pilot: Pilot[None]) -> None:
        await wait_for(
            pilot, lambda: app.chat is not None and app.chat.connected and app.chat.conv is not None
        )
        await pilot.press(*"Hello?", "enter")
        await wait_for(pilot, lambda: "error" in roles(app))
        # the words a person can act on, and the text given back to the input
        assert app.chat is not None
        errors = [v for v in app.chat.log_view.query(MessageView) if v.role == "error"]
        assert "restarts with your next message" in errors[0].content
        assert app.chat.input.text == "Hello?"

    try:
        assert snap_compare(app, terminal_size=SIZE, run_before=run_before)
    finally:
        fs.stop()


def test_help_screen(snap_compare, fake: FakeServer, tmp_path: Path) -> None:
    app = make_app(fake, tmp_path)

    async def run_before(pilot: Pilot[None]) -> None:
        await wait_for(
            pilot, lambda: app.chat is not None and app.chat.connected and app.chat.conv is not None
        )
        await pilot.press("f1")
        await pilot.pause()

    assert snap_compare(app, terminal_size=SIZE, run_before=run_before)
