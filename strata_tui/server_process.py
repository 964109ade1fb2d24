"""Start ``strata serve`` as a child process on a free port and stop it again.

The server prints ``strata: listening on http://HOST:PORT`` once it accepts connections; everything it
prints is kept (the last lines) so that a failure to start can be shown with its own words.
"""

from __future__ import annotations

import collections
import os
import sys
from collections.abc import Callable
from pathlib import Path

from strata.server.spawn import ServeProcess

__all__ = ["ServerProcess", "ServerStartError"]


class ServerStartError(RuntimeError):
    """The server exited or never said it was listening."""


class ServerProcess:
    """One ``strata serve`` child."""

    def __init__(
        self,
        model: Path | None,
        engine_args: list[str] | None = None,
        *,
        api_key: str | None = None,
        host: str = "127.0.0.1",
        port: int = 0,
    ) -> None:
        self.model = model
        self.engine_args = list(engine_args or [])
        self.api_key = api_key
        self.host = host
        self.port = port  # 0: a free port, chosen by the server
        self.url: str | None = None
        self.made_default = False  # True when no model was given and the built-in tiny one was made
        self.log: collections.deque[str] = collections.deque(maxlen=200)
        self._sp: ServeProcess | None = None

    @property
    def pid(self) -> int | None:
        return self._sp.pid if self._sp else None

    def command(self, model: Path) -> list[str]:
        cmd = [
            sys.executable,
            "-m",
            "strata.cli",
            "serve",
            "--model",
            str(model),
            "--host",
            self.host,
            "--port",
            str(self.port),
        ]
        return cmd + self.engine_args

    def environment(self) -> dict[str, str]:
        """The server's environment: the API key travels here (``STRATA_API_KEY``), never on the command
        line, which every user of the machine can read."""
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        env.pop("STRATA_API_KEY", None)
        if self.api_key:
            env["STRATA_API_KEY"] = self.api_key
        return env

    def start(self, on_line: Callable[[str], None] | None = None, timeout: float | None = None) -> str:
        """Make the default model when none was given, start the server, wait until it listens.

        Blocking: call it from a worker thread. Returns the server's URL.
        """
        if self._sp is not None:
            if self._sp.exited() is None:
                raise ServerStartError("strata serve is already running")
            self._sp.stop()  # reads what is left of its output
        self.url = None
        model = self.model
        if model is None:
            if on_line:
                on_line("making the default model (strata model make tiny)…")
            from strata.model import ensure_model

            model = Path(ensure_model("tiny"))
            self.model = model
            self.made_default = True
        if not Path(model).exists():
            raise ServerStartError(
                f"model file not found: {model} (pass --model FILE, or leave it out for the default)"
            )
        # a session of its own: Ctrl+C in the terminal goes to the chat, which stops the server itself
        sp = ServeProcess(
            self.command(Path(model)), env=self.environment(), new_session=True, on_line=on_line
        )
        self._sp, self.log = sp, sp.log
        url = sp.wait_listening(timeout)
        if url is None:
            if sp.exited() is None and not sp.settled():
                self.stop()
                raise ServerStartError(f"strata serve did not say it was listening within {timeout:.0f} s")
            code = sp.stop()
            raise ServerStartError(
                f"strata serve exited with code {code} before it was ready:\n{sp.tail(15)}"
            )
        self.url = url
        return url

    def exited(self) -> int | None:
        """The exit code when the server has stopped, else None."""
        return None if self._sp is None else self._sp.exited()

    def stop(self, grace: float = 5.0) -> None:
        """Ask the server to stop (SIGTERM), then kill it if it takes longer than ``grace`` seconds."""
        if self._sp is not None:
            self._sp.stop(grace, group=True)
