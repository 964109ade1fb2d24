"""A screen compositor that repaints where a widget was drawn when that widget goes away.

Textual finds what to repaint after a layout by comparing the new map of widgets with the previous
one. After a scroll, only the visible part of the map is laid out, and the full map is rebuilt lazily
the next time something looks a widget up. A removal is such a time: the removed widget's parent looks
up its own region, so the "previous" full map is built from the tree *after* the removal, and the next
layout sees no difference where the removed widget was. Its cells stay on the terminal until something
else happens to paint there. Seen with a toast that expired after the log had scrolled: its text stayed
over the message box and the engine panel.

This compositor remembers the map that was last laid out (the visible one after a scroll, the full one
after a layout) and marks the region of every widget that a layout hides as dirty.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, TypeVar

from textual._compositor import Compositor, CompositorMap, ReflowResult
from textual.screen import ModalScreen, Screen

if TYPE_CHECKING:
    from textual.geometry import Size
    from textual.widget import Widget

__all__ = ["RepaintingCompositor", "RepaintingModalScreen", "RepaintingScreen"]

ResultType = TypeVar("ResultType")


class RepaintingCompositor(Compositor):
    """Textual's compositor; a widget that a layout hides has its last drawn region repainted."""

    def __init__(self) -> None:
        super().__init__()
        self._drawn: CompositorMap = {}  # the map laid out last (dicts are replaced, never changed)

    def reflow(self, parent: Widget, size: Size) -> ReflowResult:
        drawn = self._drawn
        result = super().reflow(parent, size)
        self._drawn = self._full_map
        if size.region not in self._dirty_regions:
            for widget in result.hidden:
                geometry = drawn.get(widget)
                if geometry is not None:
                    region = geometry.clip.intersection(geometry.region)
                    if region:
                        self._dirty_regions.add(region)
        return result

    def reflow_visible(self, parent: Widget, size: Size) -> set[Widget]:
        exposed = super().reflow_visible(parent, size)
        self._drawn = self._visible_map or {}
        return exposed


class RepaintingScreen(Screen[ResultType]):
    """A screen laid out by RepaintingCompositor (set before anything is laid out): every screen of the chat
    shows toasts, and any of them that scrolls could leave one's text behind."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._compositor = RepaintingCompositor()


class RepaintingModalScreen(ModalScreen[ResultType]):
    """A modal screen laid out by RepaintingCompositor, as RepaintingScreen."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._compositor = RepaintingCompositor()
