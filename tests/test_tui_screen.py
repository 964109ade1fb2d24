"""The chat screen's keys, layout and drawing, driven by Pilot with no server (the conversations come
from the database): PageUp/PageDown from the message box, the help's markup, export asking where,
the side panels at 80 columns, no control character reaching the terminal, and a conversation opened
from search following its end."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from _terminal import now_drawn, record
from test_tui_offline import closed_port_url, wait_for
from textual.widgets import Input

from strata_tui.app import StrataChat
from strata_tui.screens import HelpScreen, PromptScreen
from strata_tui.store import Store, StoredMessage
from strata_tui.widgets import ConversationList, MessageView
from strata_tui.widgets.conversation_list import _Item


def fill(db: Path, title: str, n: int, text: str = "line one\n\nline two") -> int:
    store = Store(db)
    conv = store.create(title)
    for i in range(n):
        store.add_message(
            conv.id, StoredMessage("user" if i % 2 == 0 else "assistant", f"{title} {i}: {text}")
        )
    store.close()
    return conv.id


async def opened(pilot: Any, app: StrataChat) -> None:
    await wait_for(pilot, lambda: app.chat is not None and app.chat.conv is not None, "a conversation")


def test_pageup_and_pagedown_scroll_the_conversation_from_the_message_box(tmp_path: Path) -> None:
    db = tmp_path / "c.sqlite3"
    conv_id = fill(db, "long", 40)

    async def run() -> None:
        app = StrataChat(server_url=closed_port_url(), db_path=db)
        async with app.run_test(size=(120, 36)) as pilot:
            await opened(pilot, app)
            chat = app.chat
            assert chat is not None
            chat._open(conv_id)
            await wait_for(
                pilot, lambda: chat.conv is not None and chat.conv.id == conv_id, "the conversation"
            )
            log = chat.log_view
            chat.input.load_text("a draft\nof two lines")
            chat.input.focus()
            await pilot.pause()
            end = log.scroll_y
            assert end == log.max_scroll_y > 0
            await pilot.press("pageup")
            await pilot.pause()
            assert log.scroll_y < end and app.focused is chat.input
            assert chat.input.text == "a draft\nof two lines"
            await pilot.press("pagedown")
            await pilot.pause()
            assert log.scroll_y == end

    asyncio.run(run())


def test_help_shows_bracketed_arguments(tmp_path: Path) -> None:
    async def run() -> None:
        app = StrataChat(server_url=closed_port_url(), db_path=tmp_path / "c.sqlite3")
        async with app.run_test(size=(120, 60)) as pilot:
            await pilot.press("f1")
            await pilot.pause()
            assert isinstance(app.screen, HelpScreen)
            shown = "\n".join(now_drawn(app).text(app.screen.region))
            for words in ("/think [on|off]", "/export [FILE]", "/new [TITLE]", "/system [TEXT|off]"):
                assert words in shown, words

    asyncio.run(run())


def test_ctrl_o_asks_where_and_offers_the_data_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    data = tmp_path / "data"
    monkeypatch.setenv("STRATA_DATA_DIR", str(data))
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    db = tmp_path / "c.sqlite3"
    fill(db, "to export", 2)

    async def run() -> None:
        app = StrataChat(server_url=closed_port_url(), db_path=db)
        async with app.run_test(size=(120, 36)) as pilot:
            await opened(pilot, app)
            chat = app.chat
            assert chat is not None
            chat._open(1)
            await wait_for(
                pilot, lambda: chat.conv is not None and chat.conv.id == 1 and chat.history, "opened"
            )
            await pilot.press("ctrl+o")
            await pilot.pause()
            assert isinstance(app.screen, PromptScreen)  # asked, nothing written yet
            assert not any(cwd.iterdir()) and not (data / "exports").exists()
            offered = Path(app.screen.query_one(Input).value)
            assert offered.parent == data / "exports" and offered.suffix == ".md"
            await pilot.press("enter")
            await wait_for(pilot, offered.exists, "the export")
            assert offered.read_text().startswith("# to export\n")
            assert oct(offered.stat().st_mode & 0o777) == "0o600"
            notes = [v.content for v in chat.log_view.messages() if v.role == "note"]
            assert notes and str(offered) in notes[-1]  # says where
            await pilot.press("ctrl+o")
            await pilot.pause()
            await pilot.press("escape")  # Esc: no export
            await pilot.pause()
            assert sorted(p.name for p in (data / "exports").iterdir()) == [offered.name]
        assert not any(cwd.iterdir())

    asyncio.run(run())


def test_side_panels_give_way_at_80_columns(tmp_path: Path) -> None:
    async def run() -> None:
        app = StrataChat(server_url=closed_port_url(), db_path=tmp_path / "c.sqlite3")
        async with app.run_test(size=(80, 24)) as pilot:
            await opened(pilot, app)
            chat = app.chat
            assert chat is not None
            sidebar = chat.query_one("#sidebar", ConversationList)
            column = chat.query_one("#chat")
            assert not sidebar.display and column.size.width >= 76
            await pilot.press("ctrl+b")  # asked for: shown, also at 80
            await pilot.pause()
            assert sidebar.display
            await pilot.resize_terminal(140, 40)
            await pilot.pause()
            assert sidebar.display and column.size.width >= 60
            await pilot.press("ctrl+b")
            await pilot.pause()
            assert not sidebar.display  # hidden by hand: stays hidden while the width stays
            await pilot.resize_terminal(139, 40)
            await pilot.pause()
            assert not sidebar.display
            await pilot.resize_terminal(80, 24)
            await pilot.resize_terminal(120, 36)
            await pilot.pause()
            assert sidebar.display  # crossing the width again shows it

    asyncio.run(run())


def test_control_characters_never_reach_the_terminal_raw(tmp_path: Path) -> None:
    db = tmp_path / "c.sqlite3"
    evil = "before\x9b31mred\x1b]0;title\x07 \x85next\x1b[2Jafter"
    fill(db, "ctl\x9btitle", 2, evil)

    async def run() -> None:
        app = StrataChat(server_url=closed_port_url(), db_path=db)
        written: list[str] = []
        async with app.run_test(size=(120, 36)) as pilot:
            terminal = record(app)
            display = app._display

            def capture(screen: Any, renderable: Any) -> None:
                if renderable is not None and hasattr(renderable, "render_segments"):
                    written.append(renderable.render_segments(terminal._console))
                display(screen, renderable)

            app._display = capture  # type: ignore[method-assign]
            await opened(pilot, app)
            chat = app.chat
            assert chat is not None
            chat._open(1)
            await wait_for(
                pilot, lambda: chat.conv is not None and chat.conv.id == 1 and chat.history, "opened"
            )
            app.screen.refresh()
            await pilot.pause(0.2)
            view = chat.log_view.messages()[0]
            assert view.content.endswith(evil)  # the stored text is unchanged (copy and export)
            shown = "\n".join(terminal.text(app.screen.region))
        out = "".join(written)
        assert out
        assert not [c for c in out if 0x80 <= ord(c) <= 0x9F], "a C1 control was written"
        assert "\x1b]0;title" not in out and "\x1b[2J" not in out
        assert "\\x9b31mred" in shown and "\\x1b[2Jafter" in shown

    asyncio.run(run())


def test_a_conversation_opened_from_search_follows_new_messages(tmp_path: Path) -> None:
    db = tmp_path / "c.sqlite3"
    fill(db, "first", 2)
    fill(db, "apples", 2)

    async def run() -> None:
        app = StrataChat(server_url=closed_port_url(), db_path=db)
        async with app.run_test(size=(120, 36)) as pilot:
            await opened(pilot, app)
            chat = app.chat
            assert chat is not None
            chat._open(1)
            await wait_for(pilot, lambda: chat.conv is not None and chat.conv.id == 1, "the first")
            log = chat.log_view
            log.scroll_to(y=0, animate=False)  # a wheel turn over a short conversation
            await pilot.press("ctrl+f")
            await pilot.press(*"apples")
            sidebar = chat.query_one("#sidebar", ConversationList)
            await wait_for(pilot, lambda: sidebar.titles() == ["apples"], "the search result")
            await pilot.click(sidebar.query(_Item).first())
            await pilot.click(sidebar.query(_Item).first())
            await wait_for(pilot, lambda: chat.conv is not None and chat.conv.title == "apples", "opened")
            for i in range(12):
                await log.add(MessageView("user", f"new message {i}\nsecond line\nthird line"))
                await pilot.pause()
            assert log.max_scroll_y > 0
            assert log.scroll_y == log.max_scroll_y, "the log stopped following"

    asyncio.run(run())


def test_search_escape_send_draws_what_is_there(tmp_path: Path) -> None:
    """The screen once showed corrupted after search -> Esc -> send: what reaches the terminal matches a
    fresh render of the screen after each step."""
    db = tmp_path / "c.sqlite3"
    fill(db, "apples", 30)

    async def run() -> None:
        app = StrataChat(server_url=closed_port_url(), db_path=db)
        async with app.run_test(size=(100, 30), notifications=True) as pilot:
            await opened(pilot, app)
            chat = app.chat
            assert chat is not None
            terminal = record(app)
            app.screen.refresh()
            await pilot.pause()
            await pilot.press("ctrl+f")
            await pilot.press(*"apples")
            await pilot.pause(0.3)
            await pilot.press("escape")
            chat.input.load_text("hello")
            await pilot.press("enter")
            await wait_for(
                pilot, lambda: any(v.role == "error" for v in chat.log_view.messages()), "the error"
            )
            await pilot.pause(0.5)
            region = app.screen.region
            assert terminal.text(region) == now_drawn(app).text(region)

    asyncio.run(run())


def test_the_chat_screen_runs_on_what_it_is_handed(tmp_path: Path) -> None:
    """The screen needs only its ChatContext (connection, store, keys, collector), not the StrataChat app:
    here it runs in a bare Textual app, and what it learns of the server is the connection's."""
    import concurrent.futures

    from textual.app import App

    from strata_tui._gc import QuietCollector
    from strata_tui.connection import ChatContext, Connection
    from strata_tui.screens import ChatScreen
    from strata_tui.widgets import ConnectionBanner

    store = Store(tmp_path / "c.sqlite3")
    db_thread = concurrent.futures.ThreadPoolExecutor(max_workers=1)

    async def run_db(fn: Any, *args: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(db_thread, fn, *args)

    conn = Connection(server_url=closed_port_url(), model_name="m")
    ctx = ChatContext(conn, store, run_db, ("ctrl+j",), QuietCollector())

    class Bare(App[None]):
        def on_mount(self) -> None:
            self.push_screen(ChatScreen(ctx))

    async def run() -> None:
        app = Bare()
        async with app.run_test(size=(120, 36)) as pilot:
            screen = app.screen
            assert isinstance(screen, ChatScreen)
            await wait_for(pilot, lambda: screen.conv is not None, "a conversation")
            banner = screen.query_one("#banner", ConnectionBanner)
            await wait_for(
                pilot, lambda: banner.display and "cannot reach" in str(banner.render()), "the banner"
            )
            screen.input.load_text("/model")
            await pilot.press("enter")
            await pilot.pause()
            assert f"server: {conn.url}" in screen.log_view.messages()[-1].content
            assert "New conversation" in [c.title for c in screen.system_commands()]
        if conn.client is not None:
            await conn.client.aclose()

    try:
        asyncio.run(run())
    finally:
        db_thread.submit(store.close).result()
        db_thread.shutdown()
