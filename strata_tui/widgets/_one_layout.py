"""Widgets that are laid out once per change of size, not twice.

When a layout gives a widget a new size, Textual stores it in the widget's ``virtual_size``, a reactive
that asks for a layout of its own: a second full layout pass in a later frame, which finds what the
first one found. For a reply that grows at every draw, every draw became two frames (a reflow and
repaint of the screen each), the second one or two frame periods after the first (Textual's frame timer
skips ahead after a frame longer than a period): where the next key typed lands. The widgets here take
their new size quietly. The one case where a second pass is needed, a scrollbar that appeared or went
away (the content area changed width), still gets one. (A block mounted in a draw still asks for a
layout of its own once it is mounted; draws that add no block are one frame.)

The mixin goes after the Textual class in the bases: Textual takes a widget's stylesheet rules from the
first base only, and the mixin still comes before ``Widget`` in the method order. The Textual version in
use must have ``Widget._size_updated(size, virtual_size, container_size, layout)``; where it does not,
these widgets behave exactly like Textual's.
"""

from __future__ import annotations

import inspect
from typing import TYPE_CHECKING

from textual.widget import Widget
from textual.widgets import Markdown, Static
from textual.widgets.markdown import MarkdownBlock

if TYPE_CHECKING:
    from textual.geometry import Size

__all__ = ["OneLayout", "OneLayoutMarkdown", "OneLayoutStatic"]

_SUPPORTED = "layout" in inspect.signature(Widget._size_updated).parameters


class OneLayout(Widget):
    """Mixin (after the widget class in the bases): a new size found by a layout asks for no second one."""

    if _SUPPORTED:

        def _size_updated(
            self, size: Size, virtual_size: Size, container_size: Size, layout: bool = True
        ) -> bool:
            bars = (self.show_vertical_scrollbar, self.show_horizontal_scrollbar)
            changed = super()._size_updated(size, virtual_size, container_size, layout=False)
            if changed and (self.show_vertical_scrollbar, self.show_horizontal_scrollbar) != bars:
                self.refresh(layout=True)  # the content area changed width: lay the children out again
            if changed:
                self._size_settled()
            return changed

    def _size_settled(self) -> None:
        """Called after a layout changed the widget's size or virtual size (instead of the watchers)."""


class OneLayoutStatic(Static, OneLayout):
    pass


_BLOCKS: dict[type[MarkdownBlock], type[MarkdownBlock]] = {}


def _one_layout_block(cls: type[MarkdownBlock]) -> type[MarkdownBlock]:
    # same name as Textual's class: the stylesheets (Textual's and ours) select blocks by that name
    block = _BLOCKS.get(cls)
    if block is None:
        block = _BLOCKS[cls] = type(cls.__name__, (cls, OneLayout), {"__module__": __name__})
    return block


class OneLayoutMarkdown(Markdown, OneLayout):
    """Textual's Markdown, drawn by the same block widgets, each laid out once per change of size."""

    def get_block_class(self, block_name: str) -> type[MarkdownBlock]:
        return _one_layout_block(super().get_block_class(block_name))
