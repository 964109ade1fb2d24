"""Start a real ``strata serve`` on a free loopback port for a test module, and stop it again."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import httpx

from strata.server.spawn import ServeProcess

__all__ = ["Served", "run_serve"]


class Served:
    """One ``strata serve`` process (strata.server.spawn); ``url`` once it listens, ``log`` its last lines."""

    def __init__(
        self,
        model: Path,
        *args: str,
        timeout: float = 180.0,
        env: dict[str, str] | None = None,
        new_session: bool = False,
    ) -> None:
        cmd = [sys.executable, "-m", "strata.cli", "serve", "--model", str(model), "--port", "0", *args]
        # new_session: the server leads a process group of its own (a test can signal the whole group)
        self._sp = ServeProcess(cmd, env=env, new_session=new_session, log_lines=400)
        self.proc = self._sp.proc
        self.log = self._sp.log
        self.url = self._sp.wait_listening(timeout)
        if self.url is None:
            self.stop()
            raise RuntimeError("strata serve did not start:\n" + "\n".join(self.log))

    def status(self, api_key: str | None = None) -> dict:
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        r = httpx.get(f"{self.url}/v1/status", headers=headers, timeout=30)
        r.raise_for_status()
        return r.json()

    def stop(self) -> int:
        return self._sp.stop(30)


def run_serve(*args: str, timeout: float = 180.0) -> subprocess.CompletedProcess[str]:
    """``strata serve ARGS`` to completion (for start-up failures)."""
    cmd = [sys.executable, "-m", "strata.cli", "serve", "--port", "0", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
