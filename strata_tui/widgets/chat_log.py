"""The scrolling list of messages of one conversation."""

from __future__ import annotations

from textual.containers import VerticalScroll

from .message_view import MessageView

__all__ = ["ChatLog"]


class ChatLog(VerticalScroll):
    """Messages, oldest first. While it is scrolled to the end it stays there as replies grow;
    scrolling up (to read) stops that until it is scrolled back to the end."""

    def __init__(self, **kw: object) -> None:
        super().__init__(**kw)  # type: ignore[arg-type]
        self.sticky = True

    def watch_scroll_y(self, old: float, new: float) -> None:
        super().watch_scroll_y(old, new)
        # growth of the content moves max_scroll_y, not scroll_y: only the user (or scroll_end) lands here
        self.sticky = new >= self.max_scroll_y - 1

    def watch_virtual_size(self) -> None:
        # the content grew (also after the last draw, when Markdown mounts its blocks in a later turn):
        # while following, go to the new end once it is laid out
        if self.sticky:
            self.call_after_refresh(self._to_end)

    def messages(self) -> list[MessageView]:
        return list(self.query(MessageView))

    async def add(self, view: MessageView) -> MessageView:
        await self.mount(view)
        self.follow()
        return view

    def follow(self) -> None:
        if self.sticky:
            # after the next layout, so that a view mounted or grown just now counts
            self.call_after_refresh(self._to_end)

    def _to_end(self) -> None:
        if self.sticky:
            self.scroll_end(animate=False, immediate=True)
