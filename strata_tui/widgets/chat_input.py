"""The message box: Enter sends, a configurable key inserts a newline, Up recalls the last message."""

from __future__ import annotations

import time
from dataclasses import dataclass

from textual import events
from textual.message import Message
from textual.widgets import TextArea

__all__ = ["ChatInput"]


class ChatInput(TextArea):
    """A multi-line input that sends on Enter."""

    @dataclass
    class Submitted(Message):
        chat_input: ChatInput
        text: str

    def __init__(
        self, *, newline_keys: tuple[str, ...] = ("ctrl+j", "shift+enter", "alt+enter"), **kw: object
    ) -> None:
        super().__init__(soft_wrap=True, show_line_numbers=False, tab_behavior="focus", **kw)  # type: ignore[arg-type]
        self.newline_keys = newline_keys
        self.last_sent = ""
        self.last_key_at = 0.0  # time.monotonic() of the last key typed here

    def give_back(self, text: str) -> None:
        """Put a message that was not sent back in the box, before anything typed since."""
        rest = self.text
        self.load_text(text + ("\n" + rest if rest.strip() else ""))
        self.move_cursor(self.document.end)

    def on_mount(self) -> None:
        if self.app.is_headless:
            self.cursor_blink = False  # screenshots in tests must not depend on the blink phase

    async def _on_key(self, event: events.Key) -> None:
        if event.key == "enter":
            event.stop()
            event.prevent_default()
            text = self.text
            if text.strip():
                # empty the box now, not when the message is handled: keys typed in between stay
                self.clear()
                self.post_message(self.Submitted(self, text))
            return
        if event.key in self.newline_keys:
            event.stop()
            event.prevent_default()
            start, end = self.selection
            self._replace_via_keyboard("\n", start, end)
            return
        if event.key == "up" and not self.text and self.last_sent:
            event.stop()
            event.prevent_default()
            self.load_text(self.last_sent)
            self.move_cursor(self.document.end)
            return
        # the time of the last key that edits the text (not Enter: sending is not typing)
        self.last_key_at = time.monotonic()
        await super()._on_key(event)
        if event.is_printable or event.key in ("backspace", "delete"):
            # once this key is on the screen, the screen may draw what it held back for it
            self.call_after_refresh(self._key_drawn)

    def _key_drawn(self) -> None:
        hook = getattr(self.screen, "after_key", None)
        if hook is not None:
            self.screen.call_next(hook)  # in the screen's turn, not inside its refresh
