"""Start ``strata serve`` as a child process on a free port and stop it again.

The server prints ``strata: listening on http://HOST:PORT`` once it accepts connections; everything it
prints is kept (the last lines) so that a failure to start can be shown with its own words.
"""

from __future__ import annotations

import collections
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

__all__ = ["ServerProcess", "ServerStartError"]

_READY = re.compile(r"strata: listening on (http://\S+)")


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
        self._proc: subprocess.Popen[str] | None = None
        self._ready = threading.Event()
        self._reader: threading.Thread | None = None

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc else None

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
        if self._proc is not None:
            if self._proc.poll() is None:
                raise ServerStartError("strata serve is already running")
            self._close_pipe()
        self.url = None
        self._ready.clear()
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
        env = self.environment()
        self._proc = subprocess.Popen(
            self.command(Path(model)),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            text=True,
            bufsize=1,
            env=env,
            start_new_session=True,  # Ctrl+C in the terminal goes to the chat, which stops the server itself
        )
        self._reader = threading.Thread(
            target=self._read, args=(on_line,), name="strata-serve-log", daemon=True
        )
        self._reader.start()
        t0 = time.monotonic()
        while not self._ready.wait(0.1):
            if self._proc.poll() is not None:
                self._close_pipe()
                tail = "\n".join(list(self.log)[-15:])
                raise ServerStartError(
                    f"strata serve exited with code {self._proc.returncode} before it was ready:\n{tail}"
                )
            if timeout is not None and time.monotonic() - t0 > timeout:
                self.stop()
                raise ServerStartError(f"strata serve did not say it was listening within {timeout:.0f} s")
        assert self.url is not None
        return self.url

    def _read(self, on_line: Callable[[str], None] | None) -> None:
        assert self._proc is not None and self._proc.stdout is not None
        for line in self._proc.stdout:
            line = line.rstrip("\n")
            self.log.append(line)
            if not self._ready.is_set():
                m = _READY.search(line)
                if m:
                    self.url = m.group(1)
                    self._ready.set()
                elif on_line:
                    on_line(line)

    def exited(self) -> int | None:
        """The exit code when the server has stopped, else None."""
        return None if self._proc is None else self._proc.poll()

    def stop(self, grace: float = 5.0) -> None:
        """Ask the server to stop (SIGTERM), then kill it if it takes longer than ``grace`` seconds."""
        p = self._proc
        if p is None:
            return
        if p.poll() is None:
            try:
                os.killpg(p.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
            try:
                p.wait(grace)
            except subprocess.TimeoutExpired:
                try:
                    os.killpg(p.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                p.wait(grace)
        self._close_pipe()

    def _close_pipe(self) -> None:
        if self._reader is not None:
            self._reader.join(2.0)
        if self._proc is not None and self._proc.stdout is not None and not self._proc.stdout.closed:
            self._proc.stdout.close()
