"""One message: who said it, the reasoning (dimmed, collapsible) and the text as Markdown."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.message import Message
from textual.widgets import Collapsible, Markdown, Static

from .._text import printable
from ..client import Delta
from ..store import StoredMessage
from ._one_layout import OneLayout, OneLayoutMarkdown, OneLayoutStatic

__all__ = ["MessageView"]

_SEAL_CHARS = 1200  # a streaming segment ends at the next block boundary after this many characters
_FORCE_CHARS = 4 * _SEAL_CHARS  # ... or here, wherever that is

_LABELS = {"user": "You", "assistant": "Assistant", "error": "Error", "note": "strata"}


class _ReasoningBox(Collapsible):
    """The reasoning's box. Textual's Collapsible scrolls itself into view after every change; for the
    fold that happens when the answer starts (nobody asked for it), that scrolled a log that follows the
    reply back up to the reasoning and stopped the following, so the answer went on below the view.
    ``fold()`` leaves the view alone; a toggle the reader asks for still brings the box into view."""

    _quiet = False

    def fold(self) -> None:
        if not self.collapsed:
            self._quiet = self.is_mounted  # the change's scroll_visible runs after the next refresh
            self.collapsed = True

    def scroll_visible(self, *args: Any, **kwargs: Any) -> None:
        if self._quiet:
            self._quiet = False
            return
        super().scroll_visible(*args, **kwargs)


class MessageView(Vertical, OneLayout, can_focus=True):
    """A message in the conversation. Focus it (Tab, or click) to copy, edit or regenerate it."""

    DEFAULT_CSS = "MessageView { height: auto; }"

    BINDINGS = [
        Binding("c", "copy", "Copy"),
        Binding("e", "edit", "Edit & resend", show=False),
        Binding("r", "regenerate", "Regenerate", show=False),
        Binding("t", "toggle_reasoning", "Show/hide reasoning", show=False),
    ]

    @dataclass
    class Action(Message):
        view: MessageView
        action: str  # "copy" | "edit" | "regenerate"

    def __init__(
        self,
        role: str,
        content: str = "",
        reasoning: str = "",
        *,
        message_id: int | None = None,
        footer: str = "",
        streaming: bool = False,
        stored: StoredMessage | None = None,
    ) -> None:
        super().__init__(classes=f"message -{role}")
        self.role = role
        self.content = content
        self.reasoning = reasoning
        self.message_id = message_id
        self._footer_text = footer
        self._streaming = streaming
        self.stored = stored  # the history entry this view shows (None for notes and errors)
        self._live_text = ""  # text of the segment being streamed into
        self._live_reasoning = ""
        self._forced = False  # a segment was cut inside a block: merge them at the end
        self._folded = False  # the reasoning was folded when the answer started
        self.pieces = 0  # streamed pieces this reply arrived in (0 when loaded from the store)

    def compose(self) -> ComposeResult:
        yield Static(_LABELS.get(self.role, self.role), classes="role")
        with _ReasoningBox(
            title=self._reasoning_title(), collapsed=not self._streaming, classes="reasoning-box"
        ) as c:
            c.display = bool(self.reasoning)
            yield OneLayoutStatic(printable(self.reasoning), classes="reasoning", markup=False)
        if self.role in ("user", "error", "note"):
            yield Static(printable(self.content), classes="body", markup=False)
        else:
            yield OneLayoutMarkdown(printable(self.content), classes="body")
        footer = Static(printable(self._footer_text), classes="footer", markup=False)
        footer.display = bool(self._footer_text)
        yield footer

    def _reasoning_title(self) -> str:
        words = len(self.reasoning.split())
        return f"Reasoning ({words} words)" if words else "Reasoning"

    async def append(self, delta: Delta) -> None:
        """Add a streamed piece (called by the screen with what arrived since its last draw)."""
        if delta.reasoning:
            await self._append_reasoning(delta.reasoning)
        if delta.content:
            if self.reasoning and not self._folded and delta.content.strip():
                # the answer has started: fold the reasoning away, once (it stays one click away)
                self._folded = True
                self.query_one(".reasoning-box", _ReasoningBox).fold()
            self.content += delta.content
            await self._append_content(printable(delta.content))

    # While a reply streams, its text is drawn in segments of about _SEAL_CHARS: a finished segment
    # never changes again, so its size and lines stay cached, and each draw costs the same however
    # long the reply has grown. Segments end at a blank line outside code, where Markdown blocks end
    # anyway, so they read as one document. Only text with no such place for _FORCE_CHARS is cut
    # elsewhere (a code fence is closed and reopened around the cut); then, when the stream ends,
    # the segments are replaced by one document.

    def _live_md(self) -> Markdown:
        return list(self.query(".body").results(Markdown))[-1]

    async def _write_live(self, text: str) -> None:
        if not text:
            return
        self._live_text += text
        # parsed and mounted now, in the caller's turn (a MarkdownStream would do it in a task of its own,
        # later): the draw is laid out in the frame that follows, at the moment the screen chose to draw
        await self._live_md().append(text)

    async def _new_segment(self, head: str = "") -> None:
        md = self._live_md()
        await self.mount(OneLayoutMarkdown(head, classes="body"), after=md)
        self._live_text = head

    async def _append_content(self, text: str) -> None:
        if len(self._live_text) + len(text) >= _SEAL_CHARS:
            cut = _block_boundary(self._live_text, text)
            if cut is not None:
                await self._write_live(text[:cut])
                await self._new_segment()
                await self._write_live(text[cut:])
                return
        await self._write_live(text)
        if len(self._live_text) >= _FORCE_CHARS:
            fence = _open_fence(self._live_text)
            if fence is not None:
                await self._live_md().append("\n" + _closer(fence) + "\n")
            await self._new_segment(fence + "\n" if fence is not None else "")
            self._forced = True

    async def _append_reasoning(self, text: str) -> None:
        self.reasoning += text
        box = self.query_one(".reasoning-box", Collapsible)
        box.display = True
        box.title = self._reasoning_title()
        parts = list(box.query(".reasoning").results(Static))
        live = parts[-1]
        self._live_reasoning += printable(text)
        live.update(self._live_reasoning)
        if len(self._live_reasoning) >= _SEAL_CHARS:
            self._live_reasoning = ""
            await parts[-1].parent.mount(OneLayoutStatic("", classes="reasoning", markup=False), after=live)  # type: ignore[union-attr]

    async def end_stream(self) -> None:
        if self._forced:
            bodies = list(self.query(".body").results(Markdown))
            await self.mount(OneLayoutMarkdown(printable(self.content), classes="body"), after=bodies[-1])
            for b in bodies:
                await b.remove()
            self._forced = False
        parts = list(self.query(".reasoning").results(Static))
        if len(parts) > 1:
            parts[0].update(printable(self.reasoning))
            for p in parts[1:]:
                await p.remove()
        self._live_text = ""
        self._live_reasoning = ""

    @property
    def footer_text(self) -> str:
        return self._footer_text

    def set_footer(self, text: str) -> None:
        self._footer_text = text
        for f in self.query(".footer").results(Static):  # none yet before compose: compose uses the text
            f.update(printable(text))
            f.display = bool(text)

    def action_copy(self) -> None:
        self.post_message(self.Action(self, "copy"))

    def action_edit(self) -> None:
        self.post_message(self.Action(self, "edit"))

    def action_regenerate(self) -> None:
        self.post_message(self.Action(self, "regenerate"))

    def action_toggle_reasoning(self) -> None:
        box = self.query_one(".reasoning-box", Collapsible)
        box.collapsed = not box.collapsed


def _block_boundary(before: str, text: str) -> int | None:
    """Where in ``text`` (appended to ``before``) a Markdown block ends: just after the last blank
    line that is outside a code fence. None when there is none."""
    i = text.rfind("\n\n")
    while i >= 0:
        if _open_fence(before + text[: i + 2]) is None:
            return i + 2
        i = text.rfind("\n\n", 0, i)
    return None


def _closer(opener: str) -> str:
    """The line that closes the fence ``opener`` opens: same indent, same run of ` or ~."""
    m = re.match(r"(\s*)(`{3,}|~{3,})", opener)
    return (m.group(1) + m.group(2)) if m else "```"


def _open_fence(text: str) -> str | None:
    """The opening line of a code fence that ``text`` leaves open, or None."""
    opener: str | None = None
    for line in text.split("\n"):
        stripped = line.lstrip()
        if opener is None:
            if stripped.startswith("```") or stripped.startswith("~~~"):
                opener = line
        elif stripped.startswith(opener.lstrip()[:3]) and not stripped[3:].strip():
            opener = None
    return opener
