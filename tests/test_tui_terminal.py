"""What reaches the terminal (tests/_terminal.py), in a bare Textual app: a screen with the chat's
compositor repaints where a toast was, also when the last layout before it went was a scroll."""

from __future__ import annotations

import asyncio
from pathlib import Path

from _terminal import now_drawn, record
from textual.app import App, ComposeResult
from textual.containers import VerticalScroll
from textual.widgets import Input, Static
from textual.widgets._toast import Toast

from strata_tui._compositor import RepaintingCompositor, RepaintingScreen


class _Screen(RepaintingScreen[None]):
    def compose(self) -> ComposeResult:
        with VerticalScroll(id="log"):
            for i in range(60):
                yield Static(f"line {i}")
        yield Input()


class _App(App[None]):
    def on_mount(self) -> None:
        self.push_screen(_Screen())


def test_an_expired_toast_is_wiped_after_a_scroll() -> None:
    async def run() -> None:
        app = _App()
        async with app.run_test(size=(80, 24), notifications=True) as pilot:
            await pilot.pause()
            terminal = record(app)
            app.screen.refresh()  # one full paint, then only updates
            await pilot.pause()
            app.notify("temp default · max 3000 · seed default · think on", timeout=1.0)
            await pilot.pause(0.3)
            region = app.screen.query_one(Toast).region
            assert "max 3000" in "".join(terminal.text(region))  # shown
            # a scroll lays out only what is visible (Textual's compositor then forgot the toast's place)
            app.screen.query_one("#log").scroll_to(y=10, animate=False)
            await pilot.pause(0.1)
            loop = asyncio.get_running_loop()
            t_end = loop.time() + 10
            while app.screen.query(Toast):
                assert loop.time() < t_end, "the toast did not expire"
                await pilot.pause(0.1)
            await pilot.pause(0.2)
            assert terminal.text(region) == now_drawn(app).text(region)
            assert "max 3000" not in "".join(terminal.text(region))
            assert "▔" * 20 in "".join(terminal.text(region))  # the input's frame is back where the toast was

    asyncio.run(run())


def test_every_screen_of_the_chat_repaints_where_a_widget_went(tmp_path: Path) -> None:
    """Toasts show on whichever screen is on top, and the help and settings screens scroll too."""
    from strata_tui.app import StrataChat
    from strata_tui.screens.chat import ChatScreen
    from strata_tui.screens.confirm import ConfirmScreen
    from strata_tui.screens.help import HelpScreen
    from strata_tui.screens.prompt import PromptScreen
    from strata_tui.screens.settings import SettingsScreen
    from strata_tui.store import Settings

    screens = [
        ChatScreen(StrataChat(server_url="http://127.0.0.1:9", db_path=tmp_path / "c.sqlite3").context),
        ConfirmScreen("?"),
        HelpScreen(),
        PromptScreen("?"),
        SettingsScreen("", Settings()),
    ]
    for screen in screens:
        assert isinstance(screen._compositor, RepaintingCompositor), type(screen).__name__
