"""The chat's screens."""

from __future__ import annotations

from .chat import ChatScreen
from .confirm import ConfirmScreen
from .help import HelpScreen
from .prompt import PromptScreen
from .settings import SettingsScreen

__all__ = ["ChatScreen", "ConfirmScreen", "HelpScreen", "PromptScreen", "SettingsScreen"]
