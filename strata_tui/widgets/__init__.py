"""The chat's widgets, one per module."""

from __future__ import annotations

from .chat_input import ChatInput
from .chat_log import ChatLog
from .connection_banner import ConnectionBanner
from .conversation_list import ConversationList
from .engine_panel import EnginePanel
from .message_view import MessageView

__all__ = ["ChatInput", "ChatLog", "ConnectionBanner", "ConversationList", "EnginePanel", "MessageView"]
