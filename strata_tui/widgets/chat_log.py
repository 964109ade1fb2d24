"""The scrolling list of messages of one conversation."""

from __future__ import annotations

from textual.containers import VerticalScroll

from .message_view import MessageView

__all__ = ["ChatLog"]


class ChatLog(VerticalScroll):
    """Messages, oldest first; stays scrolled to the end while a reply streams unless scrolled up."""

    def messages(self) -> list[MessageView]:
        return list(self.query(MessageView))

    async def add(self, view: MessageView) -> MessageView:
        follow = self.is_vertical_scroll_end or self.max_scroll_y == 0
        await self.mount(view)
        if follow:
            self.scroll_end(animate=False)
        return view

    def follow(self) -> None:
        if self.is_vertical_scroll_end or self.max_scroll_y - self.scroll_y <= 3:
            self.scroll_end(animate=False, immediate=False)
