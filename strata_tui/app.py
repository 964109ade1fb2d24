"""``StrataChat``: the Textual app behind ``strata chat``.

The app owns what outlives a screen: the connection (the HTTP client, and the server it started, if
any), the conversation store (used from one worker thread, so writes keep their order and never block
drawing) and the quiet-time collector. It hands the chat screen a ``ChatContext`` with them; the screen
changes none of the app's state.
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
from .connection import ChatContext, Connection
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
        self.connection = Connection(
            server_url=server_url, server_process=server_process, api_key=api_key, model_name=model_name
        )
        self.store = Store(db_path)
        self._db_thread = concurrent.futures.ThreadPoolExecutor(
            max_workers=1, thread_name_prefix="strata-chat-db"
        )
        self.collector = QuietCollector()
        self.context = ChatContext(
            connection=self.connection,
            store=self.store,
            run_db=self.run_db,
            newline_keys=newline_keys,
            collector=self.collector,
        )

    async def run_db(self, fn: Callable[..., T], *args: Any) -> T:
        """Run a store call on the database thread."""
        return await asyncio.get_running_loop().run_in_executor(self._db_thread, fn, *args)

    def on_mount(self) -> None:
        self.push_screen(ChatScreen(self.context))  # which runs the collections when it is quiet
        self.call_after_refresh(self.collector.start)

    async def on_unmount(self) -> None:
        self.collector.stop()
        await self.connection.aclose()
        self._db_thread.submit(self.store.close).result()
        self._db_thread.shutdown(wait=True)

    @property
    def chat(self) -> ChatScreen | None:
        """The chat screen, while it is on the stack."""
        for s in self.screen_stack:
            if isinstance(s, ChatScreen):
                return s
        return None

    def get_system_commands(self, screen: Screen[Any]) -> Iterable[SystemCommand]:
        yield from super().get_system_commands(screen)
        chat = self.chat
        if chat is not None:
            yield from chat.system_commands()
