"""``StrataChat``: the Textual app behind ``strata chat``.

The app owns what outlives a screen: the HTTP client, the conversation store (used from one worker
thread, so writes keep their order and never block drawing), and the server it started, if any.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, TypeVar

from textual.app import App, SystemCommand
from textual.binding import Binding
from textual.screen import Screen

from ._gc import QuietCollector
from .client import ChatClient
from .screens import ChatScreen
from .server_process import ServerProcess
from .store import Store

__all__ = ["StrataChat"]

T = TypeVar("T")


class StrataChat(App[None]):
    CSS_PATH = "strata_tui.tcss"
    TITLE = "strata chat"
    BINDINGS = [Binding("ctrl+q", "quit", "Quit", priority=True)]
    ENABLE_COMMAND_PALETTE = True

    def __init__(
        self,
        *,
        server_url: str | None = None,
        server_process: ServerProcess | None = None,
        api_key: str | None = None,
        db_path: Path | str | None = None,
        model_name: str | None = None,
        newline_keys: tuple[str, ...] = ("ctrl+j", "shift+enter", "alt+enter"),
    ) -> None:
        super().__init__()
        if (server_url is None) == (server_process is None):
            raise ValueError("give exactly one of server_url and server_process")
        self.server_process = server_process
        self.api_key = api_key
        self.model_name = model_name
        self.newline_keys = newline_keys
        self.client: ChatClient | None = ChatClient(server_url, api_key) if server_url else None
        self.store = Store(db_path)
        self._db_thread = concurrent.futures.ThreadPoolExecutor(
            max_workers=1, thread_name_prefix="strata-chat-db"
        )
        self.collector = QuietCollector()

    def set_server_url(self, url: str) -> None:
        self.client = ChatClient(url, self.api_key)

    async def run_db(self, fn: Callable[..., T], *args: Any) -> T:
        """Run a store call on the database thread."""
        return await asyncio.get_running_loop().run_in_executor(self._db_thread, fn, *args)

    def on_mount(self) -> None:
        self.push_screen(ChatScreen())  # which runs the collections when it is quiet
        self.call_after_refresh(self.collector.start)

    async def on_unmount(self) -> None:
        self.collector.stop()
        if self.client is not None:
            await self.client.aclose()
        self._db_thread.submit(self.store.close).result()
        self._db_thread.shutdown(wait=True)

    @property
    def chat(self) -> ChatScreen | None:
        for s in self.screen_stack:
            if isinstance(s, ChatScreen):
                return s
        return None

    def get_system_commands(self, screen: Screen[Any]) -> Iterable[SystemCommand]:
        yield from super().get_system_commands(screen)
        chat = self.chat
        if chat is None:
            return
        yield SystemCommand(
            "New conversation", "Start a new conversation (/new)", chat.action_new_conversation
        )
        yield SystemCommand("Regenerate", "Regenerate the last reply (/regen)", chat.action_regenerate)
        yield SystemCommand(
            "Edit last message", "Edit the last message and send it again (/edit)", chat.action_edit_last
        )
        yield SystemCommand("Cancel reply", "Stop the reply in flight (Esc)", chat.action_cancel)
        yield SystemCommand(
            "Copy last reply", "Copy the last reply to the clipboard (/copy)", chat.action_copy_last
        )
        yield SystemCommand(
            "Export to Markdown", "Write the conversation as Markdown (/export)", chat.action_export
        )
        yield SystemCommand(
            "Rename conversation", "Give the conversation a title (/rename)", chat.action_rename
        )
        yield SystemCommand("Delete conversation", "Delete the conversation (/delete)", chat.action_delete)
        yield SystemCommand(
            "System prompt and sampling",
            "System prompt, temperature, top-p, max tokens, seed, thinking (/settings)",
            chat.action_settings,
        )
        yield SystemCommand(
            "Thinking on/off", "Toggle thinking for this conversation (/think)", chat.action_toggle_thinking
        )
        yield SystemCommand(
            "Search conversations", "Search titles and messages (/search)", chat.action_search
        )
        yield SystemCommand(
            "Model and server", "Show the server and model (/model)", lambda: self._slash("/model")
        )
        yield SystemCommand("Reconnect", "Try the server again now (/reconnect)", chat.action_reconnect)
        yield SystemCommand(
            "Toggle sidebar", "Show or hide the conversation list", chat.action_toggle_sidebar
        )
        yield SystemCommand("Toggle engine panel", "Show or hide the engine panel", chat.action_toggle_engine)
        yield SystemCommand("Help", "Every key and command (F1)", chat.action_help)

    def _slash(self, text: str) -> None:
        chat = self.chat
        if chat is not None:
            name, _, arg = text.partition(" ")
            self.run_worker(chat.run_slash(name, arg), group="ui")
