"""The sidebar: a search box over every conversation's text and the list of conversations."""

from __future__ import annotations

from dataclasses import dataclass

from textual import on
from textual.app import ComposeResult
from textual.containers import Vertical
from textual.message import Message
from textual.widgets import Input, Label, ListItem, ListView

from .._text import printable
from ..store import Conversation

__all__ = ["ConversationList"]


class _Item(ListItem):
    def __init__(self, conv: Conversation) -> None:
        super().__init__(Label(printable(conv.title), markup=False))
        self.conversation = conv


class ConversationList(Vertical):
    """Conversations, most recent first."""

    @dataclass
    class Picked(Message):
        conversation_id: int

    @dataclass
    class SearchChanged(Message):
        text: str

    def compose(self) -> ComposeResult:
        yield Input(placeholder="search conversations", id="search")
        yield ListView(id="conversations")

    @property
    def search_text(self) -> str:
        return self.query_one("#search", Input).value

    async def show(self, conversations: list[Conversation], current: int | None) -> None:
        lv = self.query_one(ListView)
        await lv.clear()
        await lv.extend(_Item(c) for c in conversations)
        for i, c in enumerate(conversations):
            if c.id == current:
                lv.index = i
                break

    def set_title(self, conversation_id: int, title: str) -> None:
        for item in self.query(_Item):
            if item.conversation.id == conversation_id:
                item.conversation.title = title
                item.query_one(Label).update(printable(title))

    def titles(self) -> list[str]:
        return [item.conversation.title for item in self.query(_Item)]

    @on(ListView.Selected)
    def _selected(self, event: ListView.Selected) -> None:
        event.stop()
        if isinstance(event.item, _Item):
            self.post_message(self.Picked(event.item.conversation.id))

    @on(Input.Changed, "#search")
    def _search(self, event: Input.Changed) -> None:
        event.stop()
        self.post_message(self.SearchChanged(event.value))

    @on(Input.Submitted, "#search")
    def _search_done(self, event: Input.Submitted) -> None:
        event.stop()
        self.query_one(ListView).focus()
