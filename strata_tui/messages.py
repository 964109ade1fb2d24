"""Messages that carry results from workers to the screen (all UI changes happen in their handlers)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from textual.message import Message

from .client import Delta, Finished, ServerInfo
from .store import Conversation, StoredMessage

__all__ = [
    "ConversationLoaded",
    "ConversationsListed",
    "EngineStatus",
    "Exported",
    "ReplyDelta",
    "ReplyEnded",
    "ReplyFailed",
    "ServerConnected",
    "ServerDown",
    "ServerStarting",
    "UserMessageSaved",
    "WorkFailed",
]


@dataclass
class ServerStarting(Message):
    """The embedded server is being started; ``detail`` is its latest log line."""

    detail: str


@dataclass
class ServerConnected(Message):
    url: str
    info: ServerInfo


@dataclass
class ServerDown(Message):
    """The server cannot be reached; the next try is in ``retry_in`` seconds (None: no retry)."""

    error: str
    retry_in: float | None


@dataclass
class EngineStatus(Message):
    status: dict[str, Any]


@dataclass
class ConversationsListed(Message):
    conversations: list[Conversation]
    select: int | None = None


@dataclass
class ConversationLoaded(Message):
    conversation: Conversation
    messages: list[StoredMessage] = field(default_factory=list)


@dataclass
class UserMessageSaved(Message):
    reply_id: int
    message: StoredMessage


@dataclass
class ReplyDelta(Message):
    """Text of a reply that arrived since the last ReplyDelta, in ``n_pieces`` streamed pieces."""

    reply_id: int
    delta: Delta
    n_pieces: int = 1


@dataclass
class ReplyEnded(Message):
    """A reply finished or was cancelled; ``message`` is what was stored (None when nothing arrived)."""

    reply_id: int
    finished: Finished | None
    message: StoredMessage | None
    cancelled: bool = False


@dataclass
class ReplyFailed(Message):
    """A reply failed; ``text`` is the user's message, given back to the input."""

    reply_id: int
    error: str
    text: str
    unreachable: bool = False


@dataclass
class Exported(Message):
    path: str


@dataclass
class WorkFailed(Message):
    """A background step failed; ``error`` says what and what to do."""

    error: str
