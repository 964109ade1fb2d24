"""The chat with no server to talk to: it says so, counts down to the next try, and everything that
needs no server (conversations, settings, commands, help) works."""

from __future__ import annotations

import asyncio
import io
import socket
from collections.abc import Callable
from pathlib import Path

from rich.console import Console
from textual.pilot import Pilot
from textual.widgets import Input, Static

from strata_tui.app import StrataChat
from strata_tui.commands import KEYS, SLASH_COMMANDS
from strata_tui.screens import ChatScreen, ConfirmScreen, HelpScreen, PromptScreen, SettingsScreen
from strata_tui.store import Store
from strata_tui.widgets import ConnectionBanner, ConversationList, MessageView


def closed_port_url() -> str:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()  # nothing listens there now
    return f"http://127.0.0.1:{port}"


async def wait_for(pilot: Pilot[None], cond: Callable[[], bool], what: str, timeout: float = 10.0) -> None:
    loop = asyncio.get_running_loop()
    t_end = loop.time() + timeout
    while not cond():
        if loop.time() > t_end:
            raise AssertionError(f"timed out waiting for: {what}")
        await pilot.pause(0.05)
    await pilot.pause()


def test_unreachable_server_is_retried_with_a_countdown(tmp_path: Path) -> None:
    async def run() -> None:
        app = StrataChat(server_url=closed_port_url(), db_path=tmp_path / "c.sqlite3")
        async with app.run_test(size=(120, 36)) as pilot:
            chat = app.chat
            assert chat is not None
            banner = chat.query_one("#banner", ConnectionBanner)
            await wait_for(pilot, lambda: banner.display and "retrying" in str(banner.render()), "the banner")
            assert "cannot reach" in str(banner.render())
            # a message typed while the server is away is not lost
            await wait_for(pilot, lambda: chat.conv is not None, "a conversation")
            chat.input.load_text("are you there?")
            await pilot.press("enter")
            await wait_for(
                pilot,
                lambda: chat.reply is None and any(v.role == "error" for v in chat.log_view.messages()),
                "the error",
            )
            assert chat.input.text == "are you there?"
            assert not chat.connected

    asyncio.run(run())


def test_conversations_settings_and_commands_work_offline(tmp_path: Path) -> None:
    db = tmp_path / "c.sqlite3"

    async def run() -> None:
        app = StrataChat(server_url=closed_port_url(), db_path=db)
        async with app.run_test(size=(120, 36)) as pilot:
            chat = app.chat
            assert chat is not None
            await wait_for(pilot, lambda: chat.conv is not None, "a conversation")
            first = chat.conv
            assert first is not None

            async def slash(text: str) -> None:
                chat.input.load_text(text)
                await pilot.press("enter")
                await pilot.pause()

            await slash("/temp 0.4")
            await slash("/top-p 0.9")
            await slash("/max-tokens 99")
            await slash("/seed 5")
            await slash("/think off")
            await slash("/system You answer in French.")
            await slash("/rename Offline one")
            assert (
                first.settings.temperature,
                first.settings.top_p,
                first.settings.max_tokens,
                first.settings.seed,
                first.settings.thinking,
            ) == (0.4, 0.9, 99, 5, False)
            await slash("/temp hot")
            errors = [v.content for v in chat.log_view.messages() if v.role == "error"]
            assert errors and "temperature: 'hot' is not a number" in errors[-1]
            await slash("/nonsense")
            assert "unknown command /nonsense" in [v.content for v in chat.log_view.messages()][-1]

            # a second conversation from the command palette
            await pilot.press("ctrl+p")
            await pilot.pause()
            await pilot.press(*"New conversation")
            await pilot.pause(0.3)
            await pilot.press("enter")
            sidebar = chat.query_one("#sidebar", ConversationList)
            await wait_for(
                pilot,
                lambda: chat.conv is not None and chat.conv.id != first.id and len(sidebar.titles()) == 2,
                "the new conversation",
            )
            assert isinstance(app.screen, ChatScreen)

            # search narrows the list by title
            await pilot.press("ctrl+f")
            assert isinstance(app.focused, Input)
            await pilot.press(*"Offline")
            await wait_for(pilot, lambda: sidebar.titles() == ["Offline one"], "search results")
            await pilot.press("escape")  # back to the message box
            sidebar.query_one("#search", Input).value = ""
            await wait_for(pilot, lambda: len(sidebar.titles()) == 2, "the full list")

            # rename through the dialog, delete through the confirmation
            await pilot.press("f2")
            assert isinstance(app.screen, PromptScreen)
            app.screen.query_one(Input).value = "Second"
            await pilot.press("enter")
            await wait_for(pilot, lambda: "Second" in sidebar.titles(), "the renamed conversation")
            await pilot.press("f8")
            assert isinstance(app.screen, ConfirmScreen)
            await pilot.press("y")
            await wait_for(
                pilot, lambda: chat.conv is not None and chat.conv.id == first.id, "back to the first"
            )
            await wait_for(pilot, lambda: sidebar.titles() == ["Offline one"], "one left")

            # the settings dialog shows the conversation's settings and refuses bad values
            await pilot.press("f3")
            assert isinstance(app.screen, SettingsScreen)
            assert app.screen.query_one("#temperature", Input).value == "0.4"
            app.screen.query_one("#temperature", Input).value = "-1"
            await pilot.press("ctrl+s")
            assert isinstance(app.screen, SettingsScreen)  # still open, saying why
            app.screen.query_one("#temperature", Input).value = "0.6"
            await pilot.press("ctrl+s")
            await pilot.pause()
            assert isinstance(app.screen, ChatScreen) and chat.conv.settings.temperature == 0.6

            # export writes the file and says where
            out = tmp_path / "offline.md"
            await slash(f"/export {out}")
            await wait_for(pilot, lambda: out.exists(), "the export")
            assert out.read_text().startswith("# Offline one\n")
            assert "You answer in French." in out.read_text()

        store = Store(db)
        [conv] = store.list()
        assert conv.title == "Offline one" and conv.system_prompt == "You answer in French."
        assert (conv.settings.temperature, conv.settings.seed, conv.settings.thinking) == (0.6, 5, False)
        store.close()

    asyncio.run(run())


def test_help_lists_every_key_and_command(tmp_path: Path) -> None:
    async def run() -> None:
        app = StrataChat(server_url=closed_port_url(), db_path=tmp_path / "c.sqlite3")
        async with app.run_test(size=(120, 50)) as pilot:
            await pilot.press("f1")
            assert isinstance(app.screen, HelpScreen)
            listed = {k for k, _ in KEYS}
            bound = {b.key for b in ChatScreen.BINDINGS} | {b.key for b in MessageView.BINDINGS}  # type: ignore[union-attr]
            for key in bound:
                assert any(key in entry for entry in listed), f"{key} is bound but not in the help"
            console = Console(record=True, width=100, file=io.StringIO())
            for static in app.screen.query(Static):
                console.print(static.content)
            text = console.export_text()
            for c in SLASH_COMMANDS:
                assert c.name in text
            # how to close it is said where it is seen without scrolling, on the frame of the box
            assert "Esc closes" in str(app.screen.query_one("#help-body").border_subtitle)
            await pilot.press("escape")
            assert isinstance(app.screen, ChatScreen)

    asyncio.run(run())
