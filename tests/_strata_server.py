"""Start a real ``strata serve`` on a free loopback port for a test module, and stop it again."""

from __future__ import annotations

import collections
import re
import signal
import subprocess
import sys
import threading
from pathlib import Path

import httpx

__all__ = ["Served", "run_serve"]

_LISTENING = re.compile(r"strata: listening on (http://\S+)")


class Served:
    """One ``strata serve`` process; ``url`` once it listens, ``log`` its last lines."""

    def __init__(
        self,
        model: Path,
        *args: str,
        timeout: float = 180.0,
        env: dict[str, str] | None = None,
        new_session: bool = False,
    ) -> None:
        cmd = [sys.executable, "-m", "strata.cli", "serve", "--model", str(model), "--port", "0", *args]
        self.log: collections.deque[str] = collections.deque(maxlen=400)
        self.url: str | None = None
        self._ready = threading.Event()
        # new_session: the server leads a process group of its own (a test can signal the whole group)
        self.proc = subprocess.Popen(
            cmd,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            bufsize=1,
            env=env,
            start_new_session=new_session,
        )
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        self._ready.wait(timeout)
        if self.url is None:
            self.stop()
            raise RuntimeError("strata serve did not start:\n" + "\n".join(self.log))

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            line = line.rstrip("\n")
            self.log.append(line)
            m = _LISTENING.search(line)
            if m and self.url is None:
                self.url = m.group(1)
                self._ready.set()
        self._ready.set()

    def status(self, api_key: str | None = None) -> dict:
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        r = httpx.get(f"{self.url}/v1/status", headers=headers, timeout=30)
        r.raise_for_status()
        return r.json()

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._reader.join(5)
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        return int(self.proc.returncode)


def run_serve(*args: str, timeout: float = 180.0) -> subprocess.CompletedProcess[str]:
    """``strata serve ARGS`` to completion (for start-up failures)."""
    cmd = [sys.executable, "-m", "strata.cli", "serve", "--port", "0", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
