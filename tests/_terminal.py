"""A test terminal for a Textual app: every update the app writes is replayed into a grid of cells
(cursor moves and text; colours ignored), to compare with a full render of the screen. A region the
app forgets to repaint keeps old text in the grid, as it would on a real terminal;
``App.export_screenshot`` renders the screen afresh and cannot show that."""

from __future__ import annotations

import io
import re
from typing import Any

from rich.cells import cell_len
from rich.console import Console
from textual.app import App
from textual.geometry import Region

__all__ = ["Terminal", "now_drawn", "record"]

_MOVE = re.compile(r"\x1b\[(\d+);(\d+)H")
_OTHER = re.compile(r"\x1b\[[0-9;:?<>=]*[A-Za-z]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)")


class Terminal:
    """The cells of a terminal that was sent the app's updates."""

    def __init__(self, width: int, height: int) -> None:
        self.width, self.height = width, height
        self.cells = [[" "] * width for _ in range(height)]
        self._console = Console(
            file=io.StringIO(),
            width=width,
            height=height,
            force_terminal=True,
            color_system="truecolor",
            legacy_windows=False,
            safe_box=False,
        )

    def write(self, update: Any) -> None:
        text = update.render_segments(self._console)
        x = y = start = 0
        for m in _MOVE.finditer(text + "\x1b[1;1H"):
            for ch in _OTHER.sub("", text[start : m.start()]):
                if ch.isprintable():
                    if 0 <= y < self.height and 0 <= x < self.width:
                        self.cells[y][x] = ch
                    x += cell_len(ch)
            y, x = int(m.group(1)) - 1, int(m.group(2)) - 1
            start = m.end()

    def text(self, region: Region) -> list[str]:
        return ["".join(self.cells[y][region.x : region.right]) for y in range(region.y, region.bottom)]


def record(app: App[Any]) -> Terminal:
    """A terminal fed with what the app writes from now on (as App._display does: not while batched)."""
    terminal = Terminal(*app.size)
    display = app._display

    def write(screen: Any, renderable: Any) -> None:
        if renderable is not None and not app._batch_count and hasattr(renderable, "render_segments"):
            terminal.write(renderable)
        display(screen, renderable)

    app._display = write  # type: ignore[method-assign]
    return terminal


def now_drawn(app: App[Any]) -> Terminal:
    terminal = Terminal(*app.size)
    terminal.write(app.screen._compositor.render_update(full=True, screen_stack=app._background_screens))
    return terminal
