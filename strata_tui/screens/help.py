"""Every key and every slash command."""

from __future__ import annotations

from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.widgets import Static

from .._compositor import RepaintingModalScreen
from ..commands import KEYS, SLASH_COMMANDS

__all__ = ["HelpScreen"]


class HelpScreen(RepaintingModalScreen[None]):
    BINDINGS = [Binding("escape,f1,q", "dismiss", "Close")]

    def compose(self) -> ComposeResult:
        keys = Table(box=None, show_header=False, padding=(0, 2, 0, 0), expand=True)
        keys.add_column(style="bold", no_wrap=True)
        keys.add_column()
        # Text, not str: a table cell would read "[on|off]" or "[FILE]" as Rich markup and drop it
        for k, d in KEYS:
            keys.add_row(Text(k), Text(d))
        cmds = Table(box=None, show_header=False, padding=(0, 2, 0, 0), expand=True)
        cmds.add_column(style="bold", no_wrap=True)
        cmds.add_column()
        for c in SLASH_COMMANDS:
            cmds.add_row(Text(f"{c.name} {c.args}".strip()), Text(c.help))
        with VerticalScroll(id="help-body") as body:
            # said at the top: the last line is below the fold on most terminals
            body.border_title = "Help"
            body.border_subtitle = "Esc closes · scroll for the slash commands"
            yield Static("Keys", classes="help-title")
            yield Static(keys)
            yield Static("Commands (type them in the message box)", classes="help-title")
            yield Static(cmds)
            yield Static("Esc closes this help.", classes="help-hint")

    async def action_dismiss(self, result: None = None) -> None:
        self.dismiss(None)
