"""The chat's link to its server: the HTTP client, and the ``strata serve`` this chat started, if any.

The app owns one ``Connection`` for its whole life and hands it to the chat screen in a
``ChatContext``; the screen asks it to open (which starts the server when this chat runs its own,
then makes the client) and reads what the server said about itself, but never builds a client or
touches the server process itself.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from ._gc import QuietCollector
from .client import ChatClient
from .server_process import ServerProcess
from .store import Store

__all__ = ["ChatContext", "Connection"]

T = TypeVar("T")


class Connection:
    """A server given by URL, or one this chat starts (``server_process``) and stops."""

    def __init__(
        self,
        *,
        server_url: str | None = None,
        server_process: ServerProcess | None = None,
        api_key: str | None = None,
        model_name: str | None = None,
    ) -> None:
        if (server_url is None) == (server_process is None):
            raise ValueError("give exactly one of server_url and server_process")
        self._proc = server_process
        self.api_key = api_key
        self.model_name = model_name  # the model asked for (the first the server lists when None)
        self.client: ChatClient | None = ChatClient(server_url, api_key) if server_url else None

    # ---- the server this chat runs ----

    @property
    def runs_server(self) -> bool:
        """True when this chat started (or will start) the server itself."""
        return self._proc is not None

    @property
    def made_default(self) -> bool:
        """True when the server runs the built-in tiny model (made because no model was given)."""
        return self._proc is not None and self._proc.made_default

    @property
    def model_file(self) -> Path | None:
        return self._proc.model if self._proc is not None else None

    def server_exit(self) -> int | None:
        """The exit code of this chat's server once it has stopped (None while it runs, or when none)."""
        return self._proc.exited() if self._proc is not None else None

    def server_log(self, n: int = 10) -> str:
        return "\n".join(list(self._proc.log)[-n:]) if self._proc is not None else ""

    def needs_start(self) -> bool:
        p = self._proc
        return p is not None and (p.url is None or p.exited() is not None)

    async def start(self, on_line: Callable[[str], None]) -> None:
        """Start this chat's server (in a thread: it waits for the server's line) and connect to it.
        Raises ServerStartError, or whatever making the default model raised."""
        assert self._proc is not None
        url = await asyncio.to_thread(self._proc.start, on_line)
        old, self.client = self.client, ChatClient(url, self.api_key)
        if old is not None:
            await old.aclose()

    def forget_stopped_server(self) -> None:
        """A server of this chat that stopped is started again by the next ``start``."""
        if self._proc is not None and self._proc.exited() is not None:
            self._proc.url = None

    @property
    def url(self) -> str | None:
        return self.client.base_url if self.client is not None else None

    async def aclose(self) -> None:
        """Close the client and stop the server this chat started."""
        if self.client is not None:
            await self.client.aclose()
        if self._proc is not None:
            await asyncio.to_thread(self._proc.stop)


@dataclass(frozen=True)
class ChatContext:
    """What the chat screen is given by the app: the connection, the store and how to reach it (one
    database thread), the keys that insert a newline, and the quiet-time garbage collector."""

    connection: Connection
    store: Store
    run_db: Callable[..., Awaitable[Any]]
    newline_keys: tuple[str, ...]
    collector: QuietCollector
