"""The scrolling list of messages of one conversation."""

from __future__ import annotations

from textual.containers import VerticalScroll

from ._one_layout import OneLayout
from .message_view import MessageView

__all__ = ["ChatLog"]


class ChatLog(VerticalScroll, OneLayout):
    """Messages, oldest first. While it is scrolled to the end it stays there as replies grow;
    scrolling up (to read) stops that until it is scrolled back to the end.

    Following is Textual's anchor: the layout pass itself keeps the end in view, so a reply that
    grows is laid out, scrolled and painted in one frame (a scroll after the layout, in a later turn,
    would paint the whole conversation a second time for every draw; OneLayout spares the second
    layout). Scrolling up releases the anchor and scrolling back to the end takes it again (Textual
    does both). The anchor is only held while the messages overflow the view: an anchored log that
    is not full would push its messages to the bottom."""

    def _size_settled(self) -> None:
        self._hold_anchor_while_full()

    def watch_virtual_size(self) -> None:  # where OneLayout does not apply
        self._hold_anchor_while_full()

    def on_resize(self) -> None:
        self._hold_anchor_while_full()

    def _hold_anchor_while_full(self) -> None:
        overflows = self.max_scroll_y > 0
        if overflows and not self._anchored:
            self._anchored = True
            if not self._anchor_released:
                self.scroll_end(animate=False, immediate=True)
        elif not overflows and self._anchored:
            self._anchored = False
            self._anchor_released = False
            # the anchor sets the offset without bounds: one that is not full must start at its top
            self.scroll_target_y = 0
            self.scroll_y = 0

    def release_anchor(self) -> None:
        # a log that is not full has nothing to scroll up to: a wheel turn there (Textual releases on any
        # scroll) must not stop the following for good, once the messages fill the view
        if self.max_scroll_y > 0:
            super().release_anchor()

    @property
    def sticky(self) -> bool:
        """True while the log follows its end (the user has not scrolled up to read)."""
        return not self._anchor_released

    @sticky.setter
    def sticky(self, value: bool) -> None:
        if not value:
            self.release_anchor()
        elif self._anchored:
            self.anchor()  # back to the end, following it again
        else:
            self._anchor_released = False

    def messages(self) -> list[MessageView]:
        return list(self.query(MessageView))

    async def add(self, view: MessageView) -> MessageView:
        await self.mount(view)
        return view

    def follow(self) -> None:
        """Go to the end if the log follows it and is not there (the anchor keeps it there as it grows)."""
        if self.sticky and self.scroll_y < self.max_scroll_y:
            self.scroll_end(animate=False, immediate=False)
