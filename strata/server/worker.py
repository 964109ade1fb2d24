"""The engine worker: one process that owns one engine and serves the supervisor over pipes.

This is the only module of the server that loads libstrata. A crash in native code ends this process,
never the server; the supervisor sees the exit code and starts a new worker.

Run as ``python -m strata.server.worker --model FILE --config JSON [--heartbeat S]``. Commands arrive
on stdin and events leave on the original stdout, both as frames (``strata.server.protocol``).
Everything else the process prints, the native library included, goes to stderr: the engine log.
While the engine is open a thread sends a ``heartbeat`` every S seconds, so that the server can tell
a stopped or frozen process from a long prompt.

Both pipes are used unbuffered (raw file descriptors): the command reader is a daemon thread that sits
in ``read()`` until the server closes the pipe, and a buffered ``sys.stdin`` would leave the lock of its
buffer held by that thread when the interpreter shuts down, which aborts the process ("Fatal Python
error: _enter_buffered_busy").
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import queue
import signal
import sys
import threading
import time
from typing import IO, Any

from .protocol import GenerateCommand, ProtocolError, read_frame, write_frame

__all__ = ["main"]

_STATS_EVERY_S = 0.25  # while generating, how often counters are sent along


class _Channel:
    """Frames out (thread-safe) and commands in (a reader thread; ``cancel`` is handled at once)."""

    def __init__(self, out: IO[bytes], inp: IO[bytes]) -> None:
        self._out = out
        self._inp = inp
        self._lock = threading.Lock()
        self.commands: queue.Queue[dict[str, Any] | None] = queue.Queue()
        self.cancel = threading.Event()
        self.closed = (
            threading.Event()
        )  # no more commands: the pipe closed (the server is gone) or shutdown came
        self.n_generated = 0
        self.cancel_seen_at: int | None = None
        self.context: list[int] = []  # the tokens in the engine's KV cache, in order
        self.context_scope = ""  # the client scope of the request that wrote them
        self.current_job: int | None = None  # the job of the one-sequence loop
        self.known_jobs: set[int] = set()  # jobs received and not finished
        self.cancelled_jobs: set[int] = set()  # jobs told to stop (a cancel without a job: all known ones)
        self.cancel_all = threading.Event()  # the server is gone: every job stops

    def send(self, msg: dict[str, Any]) -> None:
        with self._lock:
            try:
                write_frame(self._out, msg)
            except (BrokenPipeError, OSError):
                self.closed.set()
                self.cancel.set()

    def heartbeat_loop(self, every_s: float) -> None:
        while not self.closed.wait(every_s):
            self.send({"ev": "heartbeat"})

    def read_loop(self) -> None:
        try:
            while True:
                msg = read_frame(self._inp)
                if msg is None:
                    break
                if msg.get("op") == "cancel":
                    job = msg.get("job")
                    with self._lock:
                        if job is None:
                            self.cancelled_jobs |= self.known_jobs
                        else:
                            self.cancelled_jobs.add(int(job))
                        mine = job is None or job == self.current_job
                    if mine:
                        if not self.cancel.is_set():
                            self.cancel_seen_at = self.n_generated
                        self.cancel.set()
                else:
                    if msg.get("op") == "generate" and isinstance(msg.get("job"), int):
                        with self._lock:
                            self.known_jobs.add(msg["job"])
                    self.commands.put(msg)
                    if msg.get("op") == "shutdown":
                        break
        except Exception as e:  # a corrupt stream ends the worker like a closed one
            print(f"worker: command stream failed: {type(e).__name__}: {e}", file=sys.stderr, flush=True)
        self.closed.set()
        self.cancel.set()
        self.cancel_all.set()
        self.commands.put(None)

    def is_cancelled(self, job: int) -> bool:
        return self.cancel_all.is_set() or job in self.cancelled_jobs

    def job_done(self, job: int | None) -> None:
        with self._lock:
            self.known_jobs.discard(job)  # type: ignore[arg-type]
            self.cancelled_jobs.discard(job)  # type: ignore[arg-type]


def _asdict(obj: Any) -> dict[str, Any]:
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return dataclasses.asdict(obj)
    return dict(obj)


def _error_event(e: BaseException) -> dict[str, Any]:
    return {
        "error": type(e).__name__,
        "status": int(getattr(e, "status", 0) or 0),
        "message": str(e) or type(e).__name__,
    }


_TOKENIZER: dict[str, Any] = {}  # the model's tokenizer, for grammars (built on the first that needs it)

_DELTA_FIELDS = (
    "lookups",
    "hits",
    "misses",
    "swaps",
    "halvings",
    "refills",
    "bytes_streamed",
    "bytes_copied",
    "host_expert_runs",
    "prompt_tokens",
    "decode_tokens",
)


class _Job:
    """One generate command's side of the worker: its callbacks (tokens, log-probabilities, the grammar,
    prompt progress, cancel) and its events, all tagged with the job's id. The one-sequence loop runs it
    through ``Engine.generate``, the several-sequence loop through ``strata._batch.Batch``."""

    def __init__(self, eng: Any, ch: _Channel, cmd: GenerateCommand, job: int | None, model: str) -> None:
        self.eng, self.ch, self.cmd, self.job = eng, ch, cmd, job
        self.n_generated = 0
        self.cancel_seen_at: int | None = None
        self.prompt_done = -1  # the last prompt progress sent
        self.last_stats = time.monotonic()
        self.constraint: Any = None
        self.before: dict[str, Any] = {}
        self.reuse = 0
        if cmd.grammar:
            from strata.grammar import grammars_for
            from strata.tokenizer import Tokenizer

            tok = _TOKENIZER.get(model) or _TOKENIZER.setdefault(model, Tokenizer.from_gguf(model))
            self.constraint = grammars_for(tok).constraint(cmd.grammar, cmd.max_tokens)

    def send(self, ev: dict[str, Any]) -> None:
        if self.job is not None:
            ev["job"] = self.job
        self.ch.send(ev)

    def cancelled(self) -> bool:
        if self.job is None or self.ch.current_job == self.job:
            return self.ch.cancel.is_set()
        gone = self.ch.is_cancelled(self.job)
        if gone and self.cancel_seen_at is None:
            self.cancel_seen_at = self.n_generated
        return gone

    def on_token(self, tok: int, logits: Any) -> bool:
        import numpy as np

        if self.constraint is not None:
            self.constraint.accept(tok)
        self.n_generated += 1
        if self.ch.current_job == self.job:
            self.ch.n_generated = self.n_generated
        ev: dict[str, Any] = {"ev": "token", "id": int(tok)}
        if self.cmd.logprobs:
            x = np.asarray(logits, dtype=np.float64)
            m = float(x.max())
            lse = m + math.log(float(np.exp(x - m).sum()))
            ev["logprob"] = float(x[tok]) - lse
            n_logprobs = self.cmd.top_logprobs
            if n_logprobs > 0:
                k = min(n_logprobs, x.shape[0])
                idx = np.argpartition(-x, k - 1)[:k]
                idx = idx[np.argsort(-x[idx], kind="stable")]
                # under a grammar the forbidden tokens have no probability (-inf): they are left out
                ev["top_logprobs"] = [[int(i), float(x[i]) - lse] for i in idx if math.isfinite(float(x[i]))]
        now = time.monotonic()
        if now - self.last_stats >= _STATS_EVERY_S:
            self.last_stats = now
            ev["stats"] = _asdict(self.eng.stats())
        self.send(ev)
        return self.cancelled()

    def on_prompt(self, done: int, total: int) -> bool:
        # the engine also asks between the layers of a chunk (done unchanged): only news is sent
        if done != self.prompt_done:
            self.prompt_done = done
            self.send(
                {"ev": "progress", "done": int(done), "total": int(total), "stats": _asdict(self.eng.stats())}
            )
        return self.cancelled()

    def reuse_of(self, held: list[int], scope: str) -> int:
        """With cache_prompt, the longest prefix of held (a KV cache's tokens) the prompt shares, if the same
        client scope wrote it; at least one prompt token is always read again (its logits pick the first
        reply token)."""
        prompt = self.cmd.prompt
        reuse = 0
        if self.cmd.cache_prompt and self.cmd.cache_scope == scope:
            limit = min(len(held), len(prompt) - 1)
            while reuse < limit and held[reuse] == prompt[reuse]:
                reuse += 1
        return reuse

    def error(self, e: BaseException) -> None:
        self.send({"ev": "error", **_error_event(e), "stats": _asdict(self.eng.stats())})

    def done(self, r: Any) -> None:
        after = _asdict(self.eng.stats())
        finish = r.finish_reason
        if self.cancelled():
            finish = "cancelled"
        # under a grammar the runner-up may be a forbidden token (-inf): no margin then
        margins = [
            float(t[0][1] - t[1][1]) if len(t) >= 2 and math.isfinite(t[0][1] - t[1][1]) else None
            for t in r.top
        ]
        before = self.before
        self.send(
            {
                "ev": "done",
                "tokens": r.tokens,
                "finish_reason": finish,
                "prompt_tokens": r.prompt_tokens,
                "prompt_ms": r.prompt_ms,
                "decode_ms": r.decode_ms,
                "margins": margins,
                "stats": after,
                # several sequences share the engine: its counters moved for all of them meanwhile
                "delta": {k: after[k] - before[k] for k in _DELTA_FIELDS if k in after and k in before},
                "cancel_seen_at": self.cancel_seen_at,
                "cached_tokens": self.reuse,
                "closed_early": bool(self.constraint is not None and self.constraint.closed_early),
            }
        )

    def request(self, seq_key: Any) -> Any:
        """The generation as a strata._batch.BatchRequest (the prompt after the reused prefix)."""
        from strata._batch import BatchRequest

        return BatchRequest(
            seq_key, [int(t) for t in self.cmd.prompt[self.reuse :]], **self.generate_args(), keep=self.reuse
        )

    def generate_args(self) -> dict[str, Any]:
        """The keyword arguments of Engine.generate (and of a BatchRequest) that the command and this
        job give: the sampling, the stops, and the job's callbacks and grammar."""
        c = self.cmd
        return {
            "max_tokens": c.max_tokens,
            "temperature": c.temperature,
            "top_k": c.top_k,
            "top_p": c.top_p,
            "min_p": c.min_p,
            "seed": c.seed,
            "stop_tokens": c.stop_tokens,
            "stop_at_eos": c.stop_at_eos,
            "top_logits": c.top_logits,
            "on_token": self.on_token,
            "on_prompt": self.on_prompt,
            "logits_processor": self.constraint.mask if self.constraint is not None else None,
        }


def _refuse(eng: Any, ch: _Channel, job_id: int | None, e: Exception) -> None:
    """A job that could not start: its error event, with the engine's counters, and the job is done."""
    ev = {"ev": "error", **_error_event(e), "stats": _asdict(eng.stats())}
    ch.send({**ev, "job": job_id} if job_id is not None else ev)
    ch.job_done(job_id)


def _generate(
    eng: Any, ch: _Channel, cmd: GenerateCommand, model: str = "", job_id: int | None = None
) -> None:
    """One generation on a one-sequence engine (the engine's own loop)."""
    with ch._lock:
        ch.current_job = job_id
        ch.cancel.clear()
        if ch.cancel_all.is_set() or (job_id is not None and job_id in ch.cancelled_jobs):
            ch.cancel.set()
    ch.cancel_seen_at = None
    ch.n_generated = 0
    try:
        job = _Job(eng, ch, cmd, job_id, model)
    except Exception as e:
        _refuse(eng, ch, job_id, e)
        return
    prompt = [int(t) for t in cmd.prompt]
    reuse = job.reuse = job.reuse_of(ch.context, ch.context_scope)
    job.before = _asdict(eng.stats())
    try:
        if reuse > 0:
            eng.kv_truncate(reuse)
        else:
            eng.kv_reset()
        ch.context = []
        ch.context_scope = cmd.cache_scope
        r = eng.generate(prompt[reuse:], **job.generate_args())
    except Exception as e:
        job.error(e)
        return
    finally:
        with ch._lock:
            ch.current_job = None
        ch.job_done(job_id)
    job.cancel_seen_at = ch.cancel_seen_at
    ch.context = (prompt + list(r.tokens))[: eng.n_past]  # what the KV cache now holds
    if ch.cancel.is_set():
        r.finish_reason = "cancelled"
    job.done(r)


def _serve_batch(eng: Any, ch: _Channel, model: str) -> None:
    """Several sequences at once: generate commands join the batch as they come (the supervisor sends at
    most n_seq at a time), every running one is stepped together, and each one's events go out as they
    happen. A sequence keeps its KV cache after its job, for a later prompt of the same client scope."""
    from strata._batch import Batch

    batch = Batch(eng)
    jobs: dict[int, tuple[_Job, int]] = {}  # job id -> (job, sequence)
    scopes = [""] * batch.n_seq  # the client scope that wrote each sequence's cache
    last_used = [0.0] * batch.n_seq
    stopping = False
    while not stopping or batch.active:
        # commands: wait for one when nothing runs, else take what has come and step
        while True:
            try:
                cmd = ch.commands.get(block=not batch.active and not stopping)
            except queue.Empty:
                break
            if cmd is None or cmd.get("op") == "shutdown":
                stopping = True
                break
            if cmd.get("op") != "generate":
                ch.send({"ev": "error", "error": "ProtocolError", "status": 0,
                         "message": f"unknown command {cmd.get('op')!r}"})  # fmt: skip
                continue
            job_id = cmd.pop("job", None)
            try:
                command = GenerateCommand.from_message(cmd)
                job = _Job(eng, ch, command, job_id, model)
            except Exception as e:
                _refuse(eng, ch, job_id, e)
                continue
            free = batch.free_sequences()
            if not free:
                job.error(RuntimeError(f"all {batch.n_seq} sequences are busy"))
                ch.job_done(job_id)
                continue
            # the free sequence whose cache this prompt reuses most, else the one unused longest
            seq = max(free, key=lambda q: (job.reuse_of(batch.held[q], scopes[q]), -last_used[q]))
            job.reuse = job.reuse_of(batch.held[seq], scopes[seq])
            job.before = _asdict(eng.stats())
            scopes[seq] = command.cache_scope
            try:
                batch.start(job.request(job_id), seq)
            except Exception as e:
                job.error(e)
                ch.job_done(job_id)
                continue
            jobs[job_id if job_id is not None else -1] = (job, seq)
        if stopping and batch.active:
            ended = batch.cancel_all()
        elif batch.active:
            ended = batch.step()  # a job cancelled while its prompt is read stops after the chunk it reads
        else:
            ended = []
        for key, result, err in ended:
            job, seq = jobs.pop(key if key is not None else -1)
            last_used[seq] = time.monotonic()
            ch.job_done(key)
            if err is not None:
                batch.held[seq] = batch.held[seq][: eng.seq_n_past(seq)]
                job.error(err)
            else:
                job.done(result)


def serve(
    model: str, config: dict[str, Any], out: IO[bytes], inp: IO[bytes], heartbeat_s: float = 1.0
) -> int:
    ch = _Channel(out, inp)
    try:
        from strata import Engine, EngineConfig

        cfg = EngineConfig.from_dict(config)
        eng = Engine(model, cfg, trace=lambda line: print(line, file=sys.stderr, flush=True))
    except Exception as e:
        print(f"engine start failed: {type(e).__name__}: {e}", file=sys.stderr, flush=True)
        ch.send({"ev": "start_failed", **_error_event(e)})
        return 3
    ch.send(
        {
            "ev": "ready",
            "pid": os.getpid(),
            "info": _asdict(eng.info),
            "plan": _asdict(eng.plan),
            "devices": [_asdict(d) for d in eng.devices()],
            "stats": _asdict(eng.stats()),
        }
    )
    reader = threading.Thread(target=ch.read_loop, name="strata-worker-commands", daemon=True)
    reader.start()
    if heartbeat_s > 0:
        threading.Thread(
            target=ch.heartbeat_loop, args=(heartbeat_s,), name="strata-worker-heartbeat", daemon=True
        ).start()
    try:
        if eng.n_seq > 1:
            _serve_batch(eng, ch, model)
            return 0
        while True:
            cmd = ch.commands.get()
            if cmd is None or cmd.get("op") == "shutdown":
                break
            if cmd.get("op") == "generate":
                job_id = cmd.pop("job", None)
                try:
                    command = GenerateCommand.from_message(cmd)
                except ProtocolError as e:
                    ev = {"ev": "error", "error": "ProtocolError", "status": 0, "message": str(e)}
                    ch.send({**ev, "job": job_id} if job_id is not None else ev)
                    continue
                _generate(eng, ch, command, model, job_id)
            else:
                ch.send(
                    {
                        "ev": "error",
                        "error": "ProtocolError",
                        "status": 0,
                        "message": f"unknown command {cmd.get('op')!r}",
                    }
                )
    finally:
        ch.closed.set()  # stops the heartbeat
        eng.close()
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m strata.server.worker")
    p.add_argument("--model", required=True)
    p.add_argument("--config", default="{}", help="EngineConfig as JSON")
    p.add_argument("--heartbeat", type=float, default=1.0, help="seconds between heartbeats (0: none)")
    args = p.parse_args(argv)
    # the server starts the worker in a session of its own, so that a signal to the server's process
    # group does not reach it; should one come from a terminal anyway, the server decides when it stops
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    out = os.fdopen(os.dup(1), "wb", buffering=0)
    os.dup2(2, 1)  # stray prints (native or Python) go to the engine log, not into the frame stream
    sys.stdout = sys.stderr
    inp = os.fdopen(os.dup(0), "rb", buffering=0)  # raw: see the module docstring
    return serve(args.model, json.loads(args.config), out, inp, args.heartbeat)


if __name__ == "__main__":
    sys.exit(main())
