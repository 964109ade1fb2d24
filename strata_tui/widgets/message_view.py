"""One message: who said it, the reasoning (dimmed, collapsible) and the text as Markdown."""

from __future__ import annotations

from dataclasses import dataclass

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.message import Message
from textual.widgets import Collapsible, Markdown, Static
from textual.widgets.markdown import MarkdownStream

from ..client import Delta
from ..store import StoredMessage

__all__ = ["MessageView"]

_LABELS = {"user": "You", "assistant": "Assistant", "error": "Error", "note": "strata"}


class MessageView(Vertical, can_focus=True):
    """A message in the conversation. Focus it (Tab, or click) to copy, edit or regenerate it."""

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
        self._stream: MarkdownStream | None = None
        self.stored = stored  # the history entry this view shows (None for notes and errors)

    def compose(self) -> ComposeResult:
        yield Static(_LABELS.get(self.role, self.role), classes="role")
        with Collapsible(
            title=self._reasoning_title(), collapsed=not self._streaming, classes="reasoning-box"
        ) as c:
            c.display = bool(self.reasoning)
            yield Static(self.reasoning, classes="reasoning", markup=False)
        if self.role in ("user", "error", "note"):
            yield Static(self.content, classes="body", markup=False)
        else:
            yield Markdown(self.content, classes="body")
        footer = Static(self._footer_text, classes="footer", markup=False)
        footer.display = bool(self._footer_text)
        yield footer

    def _reasoning_title(self) -> str:
        words = len(self.reasoning.split())
        return f"Reasoning ({words} words)" if words else "Reasoning"

    async def append(self, delta: Delta) -> None:
        """Add a streamed piece (called by the screen for each ReplyDelta)."""
        if delta.reasoning:
            self.reasoning += delta.reasoning
            box = self.query_one(".reasoning-box", Collapsible)
            box.display = True
            box.title = self._reasoning_title()
            self.query_one(".reasoning", Static).update(self.reasoning)
        if delta.content:
            if not self.content and self.reasoning:
                # the answer has started: fold the reasoning away (it stays one click away)
                self.query_one(".reasoning-box", Collapsible).collapsed = True
            self.content += delta.content
            md = self.query_one(".body", Markdown)
            if self._stream is None:
                self._stream = Markdown.get_stream(md)
            await self._stream.write(delta.content)

    async def end_stream(self) -> None:
        if self._stream is not None:
            await self._stream.stop()
            self._stream = None

    @property
    def footer_text(self) -> str:
        return self._footer_text

    def set_footer(self, text: str) -> None:
        self._footer_text = text
        f = self.query_one(".footer", Static)
        f.update(text)
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
