"""Starting ``strata serve`` as a child process and reading its output: the one way the chat
(strata_tui/server_process.py), the regression matrix (repro_matrix/_cell.py) and the tests
(tests/_strata_server.py) start a server.

The server prints ``strata: listening on http://HOST:PORT`` once it accepts connections. Every line it
prints is kept (the last ``log_lines``) so that a failure to start can be told in the server's own words.
"""

from __future__ import annotations

import collections
import os
import re
import signal
import subprocess
import threading
from collections.abc import Callable, Sequence

__all__ = ["LISTENING", "ServeProcess", "die_with_parent"]

LISTENING = re.compile(r"strata: listening on (http://\S+)")


def die_with_parent() -> None:
    """In the child before exec: SIGTERM when the thread that started it goes away (Linux's
    PR_SET_PDEATHSIG), so a harness that is killed leaves no server behind. Where prctl is missing,
    nothing."""
    try:
        import ctypes

        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


class ServeProcess:
    """One ``strata serve`` child, its output read by a thread of its own.

    ``cmd`` is the whole command line. ``new_session``: the child leads a process group of its own
    (Ctrl+C in a terminal, or a signal to the caller's group, does not reach it; :meth:`stop` can signal
    its group). ``parent_death``: :func:`die_with_parent` (the child must then outlive no thread of the
    caller's: start it from a thread that lives as long as the server should). ``on_line`` sees each line
    printed before the server listens, the listening line excepted.
    """

    def __init__(
        self,
        cmd: Sequence[str],
        *,
        env: dict[str, str] | None = None,
        cwd: str | None = None,
        new_session: bool = False,
        parent_death: bool = False,
        on_line: Callable[[str], None] | None = None,
        log_lines: int = 200,
    ) -> None:
        self.log: collections.deque[str] = collections.deque(maxlen=log_lines)
        self.url: str | None = None
        self._on_line = on_line
        self._ready = threading.Event()  # set when it listens, or when its output ends
        self._new_session = new_session
        self.proc = subprocess.Popen(
            list(cmd),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            text=True,
            bufsize=1,
            env=env,
            cwd=cwd,
            start_new_session=new_session,
            preexec_fn=die_with_parent if parent_death else None,
        )
        self._reader = threading.Thread(target=self._read, name="strata-serve-log", daemon=True)
        self._reader.start()

    @property
    def pid(self) -> int:
        return self.proc.pid

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            line = line.rstrip("\n")
            self.log.append(line)
            if self.url is None:
                m = LISTENING.search(line)
                if m:
                    self.url = m.group(1).rstrip("/")
                    self._ready.set()
                elif self._on_line is not None:
                    self._on_line(line)
        self._ready.set()

    def wait_listening(self, timeout: float | None = None) -> str | None:
        """The server's URL once it listens; None when it ended its output first or ``timeout`` passed."""
        self._ready.wait(timeout)
        return self.url

    def settled(self) -> bool:
        """It listens, or its output has ended (it is going away)."""
        return self._ready.is_set()

    def join_output(self, timeout: float) -> None:
        """Wait up to ``timeout`` seconds for the reader to reach the end of the output."""
        self._reader.join(timeout)

    def exited(self) -> int | None:
        """The exit code once the server has stopped, else None."""
        return self.proc.poll()

    def tail(self, n: int = 30) -> str:
        return "\n".join(list(self.log)[-n:])

    def stop(self, grace: float = 15.0, *, group: bool = False) -> int:
        """SIGTERM (to its process group with ``group``, which needs ``new_session``), SIGKILL after
        ``grace`` seconds; then the output is read to its end. The exit code."""
        p = self.proc
        if p.poll() is None:
            self._signal(signal.SIGTERM, group)
            try:
                p.wait(grace)
            except subprocess.TimeoutExpired:
                self._signal(signal.SIGKILL, group)
                p.wait()
        self._reader.join(5)
        if p.stdout is not None and not p.stdout.closed:
            p.stdout.close()
        return int(p.returncode)

    def _signal(self, sig: int, group: bool) -> None:
        try:
            if group and self._new_session:
                os.killpg(self.proc.pid, sig)
            else:
                self.proc.send_signal(sig)
        except ProcessLookupError:
            pass
