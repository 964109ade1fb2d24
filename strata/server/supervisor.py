"""Runs the engine in a worker process, up to ``--parallel`` requests at a time, and restarts it when it dies.

Requests wait in a FIFO (``Job``s); the engine runs as many as it has sequences (``EngineConfig.parallel``,
1 by default), the others see their position. A job leaves the queue for the worker as soon as a sequence
is free, so a newcomer joins the running ones at the engine's next step. Every command and event carries
its job's id (``job``), and the run loop hands each job its own events (prompt progress, tokens, the
result). A job whose client went away is cancelled: a queued one leaves the queue, a running one tells the
worker to stop it, which it does after at most one more token (the others run on).

When the worker exits while a job runs, that job ends with ``engine_exited`` ("the engine stopped
unexpectedly (exit code N)") and a fresh worker is started for the requests that follow; the tail of
the engine's log goes to the server's own output, never to a client. A worker that cannot open the
engine reports why (``start_failed``) and exits; that message is what ``start()`` raises and what a
request gets as ``engine_start_failed``.

The worker runs in a session of its own: a signal to the server's process group (Ctrl+C, a service
manager's SIGTERM) reaches the server only, which then stops in order (``shutdown()``: the running
and waiting requests end with ``server_shutting_down``, the worker is told to exit). The worker sends a
heartbeat every ``engine_timeout / 4`` seconds; when none has come for ``engine_timeout`` seconds
(the process is stopped or frozen), the supervisor says ``unresponsive``, ends the running and waiting
requests with ``engine_unresponsive`` and refuses new ones until the worker is heard from again.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import itertools
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from typing import Any

from .._config import EngineConfig
from .errors import public_message
from .protocol import GenerateCommand, decode_frame, encode_frame, frame_length

__all__ = ["DEFAULT_ENGINE_TIMEOUT", "EngineStartError", "Job", "Supervisor"]

_LOG_LINES = 200
_TAIL_LINES = 20
DEFAULT_ENGINE_TIMEOUT = 30.0


class EngineStartError(RuntimeError):
    """The engine could not be started. ``str()`` is for the server's operator (the engine's message
    and the last lines of its log); ``message`` alone is what a client may see."""

    def __init__(self, message: str, log_tail: str = "") -> None:
        super().__init__(message + (f"\n{log_tail}" if log_tail else ""))
        self.message = message


def _signal_name(code: int) -> str:
    try:
        return signal.Signals(-code).name
    except ValueError:
        return f"signal {-code}"


def _set_pdeathsig() -> None:
    # the worker goes away with the server, even when the server is killed
    try:
        import ctypes

        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except OSError:
        pass


def _consume(task: asyncio.Task[Any]) -> None:
    if not task.cancelled():
        task.exception()


@dataclass
class Job:
    """One request in the FIFO: its command for the worker and the events it receives.

    ``events`` ends with a ``done`` or ``error`` event; ``finished`` is set when the worker is done
    with the job (or never got it). A job answered with an error while the worker still has it
    (``abandoned``: the engine stopped answering) receives no further events."""

    seq: int
    command: GenerateCommand
    events: asyncio.Queue[dict[str, Any]] = field(default_factory=asyncio.Queue)
    submitted: float = field(default_factory=time.monotonic)
    started: float | None = None
    finished: asyncio.Event = field(default_factory=asyncio.Event)
    cancelled: bool = False
    abandoned: bool = False
    run_index: int | None = None  # 1 for the first job the engine ran, 2 for the next, ...
    phase: str = "queued"  # then "reading" (its prompt), "generating"
    progress: dict[str, Any] | None = None  # while reading: {"done", "total", "tokens_per_second"}
    n_tokens: int = 0  # tokens generated so far
    _sup: Supervisor | None = None

    def cancel(self) -> None:
        """The client is gone: leave the queue, or stop the generation within one token."""
        if self.cancelled or self.finished.is_set():
            return
        self.cancelled = True
        if self._sup is not None:
            self._sup._cancel(self)

    @property
    def position(self) -> int:
        """0 while running, k for the k-th job in the queue, -1 when finished."""
        if self._sup is None or self.finished.is_set():
            return -1
        return self._sup.position_of(self)


class _Worker:
    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc
        self.ready: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self.exit_code: int | None = None
        self.reader: asyncio.Task[None] | None = None
        self.log_reader: asyncio.Task[None] | None = None
        self.watchdog: asyncio.Task[None] | None = None
        self.stopping = False
        self.last_heard = time.monotonic()

    def send(self, msg: dict[str, Any]) -> bool:
        if self.proc.stdin is None or self.proc.stdin.is_closing() or self.exit_code is not None:
            return False
        try:
            self.proc.stdin.write(encode_frame(msg))
        except (BrokenPipeError, ConnectionResetError, RuntimeError):
            return False
        return True


class Supervisor:
    """The engine worker's lifecycle and the FIFO of requests (see the module docstring)."""

    def __init__(
        self,
        model_path: str,
        config: EngineConfig,
        *,
        echo_log: bool = True,
        env: dict[str, str] | None = None,
        python: str = sys.executable,
        engine_timeout: float = DEFAULT_ENGINE_TIMEOUT,
    ) -> None:
        self.model_path = str(model_path)
        self.config = config
        self.echo_log = echo_log
        self.env = env
        self.python = python
        self.engine_timeout = float(engine_timeout)  # 0: no heartbeat, no timeout
        self.log: collections.deque[str] = collections.deque(maxlen=_LOG_LINES)
        self.state = "loading"
        self.start_error: str | None = None  # for the operator: with the log's tail
        self.public_error: str | None = None  # for clients: the engine's words, no path, no log
        self.info: dict[str, Any] | None = None
        self.plan: dict[str, Any] | None = None
        self.devices: list[dict[str, Any]] = []  # each device's layers and plan (ready), in layer order
        self.stats: dict[str, Any] | None = None
        self.restarts = 0
        self.last_exit_code: int | None = None
        self.prompt_progress: dict[str, Any] | None = None
        self.parallel = max(1, int(config.parallel or 1))  # jobs the engine runs at once
        self.unresponsive_since: float | None = None
        self._worker: _Worker | None = None
        self._spawning: asyncio.Task[_Worker] | None = None
        self._queue: collections.deque[Job] = collections.deque()
        self._wakeup = asyncio.Event()
        self._running: dict[int, Job] = {}  # job.seq -> job, in the order they started
        self._seq = itertools.count(1)
        self._runs = itertools.count(1)
        self._run_task: asyncio.Task[None] | None = None
        self._closing = False

    # ---- lifecycle ---------------------------------------------------------------------------------

    async def start(self) -> None:
        """Start the worker and the run loop; raises EngineStartError with the engine's message."""
        if self._run_task is None:
            self._run_task = asyncio.create_task(self._run(), name="strata-supervisor")
        await self.ensure_worker()

    @property
    def ready(self) -> bool:
        w = self._worker
        return w is not None and w.ready.done() and not w.ready.exception() and w.exit_code is None

    @property
    def healthy(self) -> bool:
        """Ready, answering, and not stopping: what ``/health`` reports as ok."""
        return self.ready and self.unresponsive_since is None and not self._closing

    @property
    def pid(self) -> int | None:
        w = self._worker
        return w.proc.pid if w is not None and w.exit_code is None else None

    def shutdown(self) -> None:
        """Begin an orderly stop: no new requests; the running and waiting ones end with an error
        that says why; the worker is asked to stop its generation. ``close()`` finishes the stop."""
        if self._closing:
            return
        self._closing = True
        self.state = "stopping"
        self._fail_all("server_shutting_down", "the server is shutting down; the request was not finished")
        w = self._worker
        if w is not None:
            w.send({"op": "cancel"})

    async def close(self) -> None:
        self.shutdown()
        if self._run_task is not None:
            self._run_task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._run_task
        w = self._worker
        if w is not None and w.exit_code is None:
            w.stopping = True
            w.send({"op": "shutdown"})
            try:
                await asyncio.wait_for(w.proc.wait(), 10)
            except asyncio.TimeoutError:
                with contextlib.suppress(ProcessLookupError):
                    w.proc.kill()
                await w.proc.wait()
        if w is not None:
            for t in (w.reader, w.log_reader):
                if t is not None:
                    with contextlib.suppress(asyncio.CancelledError, Exception):
                        await asyncio.wait_for(t, 5)
            if w.watchdog is not None:
                w.watchdog.cancel()

    async def ensure_worker(self) -> None:
        """Wait for a ready worker, starting one if there is none (raises EngineStartError)."""
        await self._ensure_worker()

    async def _ensure_worker(self) -> _Worker:
        if self.ready:
            assert self._worker is not None
            return self._worker
        if self._spawning is None or self._spawning.done():
            self._spawning = asyncio.create_task(self._spawn(), name="strata-worker-start")
        return await asyncio.shield(self._spawning)

    async def _spawn(self) -> _Worker:
        self.state = "loading" if self.restarts == 0 and self.last_exit_code is None else "restarting"
        self.start_error = self.public_error = None
        env = dict(os.environ if self.env is None else self.env)
        env.setdefault("PYTHONUNBUFFERED", "1")
        beat = min(1.0, self.engine_timeout / 4) if self.engine_timeout > 0 else 0.0
        cmd = [
            self.python,
            "-m",
            "strata.server.worker",
            "--model",
            self.model_path,
            "--config",
            json.dumps(self.config.to_dict()),
            "--heartbeat",
            repr(beat),
        ]
        try:
            proc = await asyncio.create_subprocess_exec(
                *cmd,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                env=env,
                preexec_fn=_set_pdeathsig,
                start_new_session=True,
            )
        except OSError as e:
            self.state = "failed"
            self.start_error = self.public_error = (
                f"cannot start the engine worker ({self.python}): {e.strerror or e}"
            )
            raise EngineStartError(self.start_error) from e
        w = _Worker(proc)
        self._worker = w
        self._log(f"engine worker started (pid {proc.pid})")
        w.log_reader = asyncio.create_task(self._read_log(w), name="strata-worker-log")
        w.reader = asyncio.create_task(self._read_frames(w), name="strata-worker-frames")
        try:
            msg = await w.ready
        except EngineStartError as e:
            self.state = "failed"
            self.start_error = str(e)
            self.public_error = public_message(e.message, self.model_path)
            if not self.echo_log:
                print(f"engine: {self.start_error}", file=sys.stderr, flush=True)
            raise
        self.info, self.plan, self.stats = msg.get("info"), msg.get("plan"), msg.get("stats")
        self.devices = msg.get("devices") or []
        self.state = "idle" if not self._running else self.state
        if beat > 0:
            w.watchdog = asyncio.create_task(self._watch(w, beat), name="strata-worker-watchdog")
        return w

    # ---- worker I/O --------------------------------------------------------------------------------

    def _log(self, line: str) -> None:
        self.log.append(line)
        if self.echo_log:
            print(f"engine: {line}", file=sys.stderr, flush=True)

    def log_tail(self, n: int = _TAIL_LINES) -> str:
        return "\n".join(list(self.log)[-n:])

    async def _read_log(self, w: _Worker) -> None:
        assert w.proc.stderr is not None
        while True:
            line = await w.proc.stderr.readline()
            if not line:
                break
            self._log(line.decode("utf-8", "replace").rstrip("\n"))

    async def _read_frames(self, w: _Worker) -> None:
        assert w.proc.stdout is not None
        try:
            while True:
                header = await w.proc.stdout.readexactly(4)
                data = await w.proc.stdout.readexactly(frame_length(header))
                w.last_heard = time.monotonic()
                self._on_event(w, decode_frame(data))
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        except Exception as e:  # a corrupt stream: stop this worker, the exit path takes over
            self._log(f"engine worker sent a bad frame: {type(e).__name__}: {e}")
            with contextlib.suppress(ProcessLookupError):
                w.proc.kill()
        code = await w.proc.wait()
        if w.log_reader is not None:
            with contextlib.suppress(asyncio.TimeoutError, asyncio.CancelledError):
                await asyncio.wait_for(asyncio.shield(w.log_reader), 2)
        self._on_exit(w, code)

    async def _watch(self, w: _Worker, every: float) -> None:
        """Notice a worker that has stopped answering (see the module docstring)."""
        last_tick = time.monotonic()
        while w.exit_code is None:
            await asyncio.sleep(every)
            now = time.monotonic()
            late, last_tick = now - last_tick > 2 * every, now
            if late:
                continue  # this loop was held up itself: frames may be waiting to be read
            silent = now - w.last_heard
            if silent > self.engine_timeout and self.unresponsive_since is None and w is self._worker:
                self.unresponsive_since = w.last_heard
                self.state = "unresponsive"
                self._log(f"engine worker (pid {w.proc.pid}) has not answered for {silent:.0f} s")
                self._fail_all("engine_unresponsive", self.unresponsive_message())
                w.send({"op": "cancel"})

    def unresponsive_message(self) -> str:
        since = self.unresponsive_since or time.monotonic()
        return (
            f"the engine has not answered for {time.monotonic() - since:.0f} s (its process is stopped or "
            f"frozen); the request was not served. The server keeps waiting for it: when it answers again, "
            f"requests are served; when it exits, a fresh engine is started"
        )

    def _on_event(self, w: _Worker, msg: dict[str, Any]) -> None:
        ev = msg.get("ev")
        if self.unresponsive_since is not None and w is self._worker:
            self.unresponsive_since = None
            self._log("engine worker is answering again")
            self.state = "idle"
            self._update_state()
        if ev == "heartbeat":
            return
        if ev == "ready":
            if not w.ready.done():
                w.ready.set_result(msg)
            return
        if ev == "start_failed":
            if not w.ready.done():
                w.ready.set_exception(EngineStartError(str(msg.get("message") or "the engine did not start")))
            return
        if msg.get("stats"):
            self.stats = msg["stats"]
        job = self._running.get(msg["job"]) if "job" in msg else None
        if job is None:
            return
        if ev == "progress":
            elapsed = time.monotonic() - (job.started or time.monotonic())
            done = int(msg.get("done", 0))
            job.phase = "reading"
            job.progress = {
                "done": done,
                "total": int(msg.get("total", 0)),
                "tokens_per_second": done / elapsed if elapsed > 0 else 0.0,
            }
            self._update_state()
        elif ev == "token":
            job.n_tokens += 1
            if job.phase != "generating":
                job.phase, job.progress = "generating", None
                self._update_state()
        elif ev not in ("done", "error"):
            return
        if not job.abandoned:
            job.events.put_nowait(msg)
        if ev in ("done", "error"):
            self._finish(job, None)

    def _on_exit(self, w: _Worker, code: int) -> None:
        w.exit_code = code
        if w.watchdog is not None:
            w.watchdog.cancel()
        was_ready = w.ready.done() and w.ready.exception() is None
        if not w.ready.done():
            w.ready.set_exception(
                EngineStartError(
                    f"the engine stopped while starting (exit code {code}); the server's log says why",
                    self.log_tail(),
                )
            )
        if w is not self._worker:
            return
        self.last_exit_code = code
        self.unresponsive_since = None
        if w.stopping or self._closing:
            return
        self._log(f"engine worker exited with code {code}")
        if not self.echo_log and was_ready:
            print(
                f"engine: the worker exited with code {code}; the last lines of its log:\n{self.log_tail()}",
                file=sys.stderr,
                flush=True,
            )
        if was_ready:
            how = f" It was killed by {_signal_name(code)}." if code < 0 else ""
            message = (
                f"the engine stopped unexpectedly (exit code {code}).{how} The server's log says more; "
                f"the next request gets a fresh engine"
            )
            for job in list(self._running.values()):  # every sequence it was running
                self._finish(
                    job, {"ev": "error", "code": "engine_exited", "message": message, "exit_code": code}
                )
        if was_ready:
            # it had been running: start a fresh one for the requests that follow
            self.restarts += 1
            self.state = "restarting"
            self._spawning = asyncio.create_task(self._spawn(), name="strata-worker-restart")
            self._spawning.add_done_callback(_consume)  # a failure is reported through the state

    # ---- the queue ---------------------------------------------------------------------------------

    def submit(self, command: GenerateCommand) -> Job:
        """Queue a generation; read its events from ``job.events`` until ``done`` or ``error``."""
        job = Job(seq=next(self._seq), command=command, _sup=self)
        if self._closing:
            self._finish(
                job, {"ev": "error", "code": "server_shutting_down", "message": "the server is shutting down"}
            )
        elif self.unresponsive_since is not None:
            self._finish(
                job, {"ev": "error", "code": "engine_unresponsive", "message": self.unresponsive_message()}
            )
        else:
            self._queue.append(job)
            self._wakeup.set()
        return job

    @property
    def queue_length(self) -> int:
        return len(self._queue)

    @property
    def running(self) -> Job | None:
        """The job that started first of those running (None when none runs)."""
        return next(iter(self._running.values()), None)

    def running_jobs(self) -> list[Job]:
        """Every job the engine runs now, in the order they started."""
        return list(self._running.values())

    def _update_state(self) -> None:
        """The engine's state from its jobs': generating when one is, else reading, else idle."""
        phases = [j.phase for j in self._running.values()]
        if self.unresponsive_since is not None or self._closing:
            return
        reading = [j for j in self._running.values() if j.phase == "reading"]
        self.prompt_progress = reading[0].progress if reading else None
        if "generating" in phases:
            self.state = "generating"
        elif reading:
            self.state = "reading"
        elif self.state in ("reading", "generating"):
            self.state = "idle"

    def waiting(self) -> list[Job]:
        """The jobs in the queue, first to run first."""
        return list(self._queue)

    def position_of(self, job: Job) -> int:
        if self._running.get(job.seq) is job:
            return 0
        try:
            return self._queue.index(job) + 1
        except ValueError:
            return -1

    def _cancel(self, job: Job) -> None:
        if self._running.get(job.seq) is job:
            w = self._worker
            if w is not None:
                w.send({"op": "cancel", "job": job.seq})
        elif job in self._queue:
            self._queue.remove(job)
            self._finish(
                job,
                {
                    "ev": "error",
                    "code": "cancelled",
                    "message": "the request was cancelled before the engine started it",
                },
            )

    def _finish(self, job: Job, event: dict[str, Any] | None) -> None:
        if event is not None and not job.abandoned:
            job.events.put_nowait(event)
        job.finished.set()
        if self._running.get(job.seq) is job:  # its sequence is free for the next job
            del self._running[job.seq]
            self._update_state()
            self._wakeup.set()

    def _fail_all(self, code: str, message: str) -> None:
        """End the waiting jobs, and answer the running one (which the worker may still have)."""
        event = {"ev": "error", "code": code, "message": message}
        for waiting in list(self._queue):
            self._finish(waiting, dict(event))
        self._queue.clear()
        for job in self._running.values():
            if not job.abandoned and not job.finished.is_set():
                job.events.put_nowait(dict(event))
                job.abandoned = True

    async def _run(self) -> None:
        while True:
            while not self._queue or len(self._running) >= self.parallel:
                self._wakeup.clear()
                await self._wakeup.wait()
            job = self._queue.popleft()
            self._running[job.seq] = job
            try:
                w = await self._ensure_worker()
            except EngineStartError as e:
                self._finish(
                    job,
                    {
                        "ev": "error",
                        "code": "engine_start_failed",
                        "message": public_message(e.message, self.model_path),
                    },
                )
                continue
            except Exception as e:
                self._finish(
                    job,
                    {
                        "ev": "error",
                        "code": "engine_start_failed",
                        "message": f"the engine worker did not start ({type(e).__name__})",
                    },
                )
                continue
            if (
                job.finished.is_set()
            ):  # ended while the engine started (shutdown, the engine stopped answering)
                self._running.pop(job.seq, None)
                continue
            job.started = time.monotonic()
            job.run_index = next(self._runs)
            job.events.put_nowait({"ev": "started"})
            job.phase = "reading"
            job.progress = {"done": 0, "total": len(job.command.prompt), "tokens_per_second": 0.0}
            self._update_state()
            if not w.send({**job.command.to_message(), "job": job.seq}):
                # the worker is going away; its exit path ends the job (or it is already gone)
                if w.exit_code is not None:
                    self._finish(
                        job,
                        {
                            "ev": "error",
                            "code": "engine_exited",
                            "message": f"the engine stopped unexpectedly (exit code {w.exit_code})",
                        },
                    )
            elif job.cancelled:
                w.send({"op": "cancel", "job": job.seq})
