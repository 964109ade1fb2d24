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
                    if not self.cancel.is_set():
                        self.cancel_seen_at = self.n_generated
                    self.cancel.set()
                else:
                    self.commands.put(msg)
                    if msg.get("op") == "shutdown":
                        break
        except Exception as e:  # a corrupt stream ends the worker like a closed one
            print(f"worker: command stream failed: {type(e).__name__}: {e}", file=sys.stderr, flush=True)
        self.closed.set()
        self.cancel.set()
        self.commands.put(None)


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


def _generate(eng: Any, ch: _Channel, cmd: GenerateCommand, model: str = "") -> None:
    import numpy as np

    ch.cancel.clear()
    ch.cancel_seen_at = None
    ch.n_generated = 0
    n_logprobs = cmd.top_logprobs
    want_logprobs = cmd.logprobs
    last_stats = [time.monotonic()]

    def on_token(tok: int, logits: Any) -> bool:
        ch.n_generated += 1
        ev: dict[str, Any] = {"ev": "token", "id": int(tok)}
        if want_logprobs:
            x = np.asarray(logits, dtype=np.float64)
            m = float(x.max())
            lse = m + math.log(float(np.exp(x - m).sum()))
            ev["logprob"] = float(x[tok]) - lse
            if n_logprobs > 0:
                k = min(n_logprobs, x.shape[0])
                idx = np.argpartition(-x, k - 1)[:k]
                idx = idx[np.argsort(-x[idx], kind="stable")]
                # under a grammar the forbidden tokens have no probability (-inf): they are left out
                ev["top_logprobs"] = [[int(i), float(x[i]) - lse] for i in idx if math.isfinite(float(x[i]))]
        now = time.monotonic()
        if now - last_stats[0] >= _STATS_EVERY_S:
            last_stats[0] = now
            ev["stats"] = _asdict(eng.stats())
        ch.send(ev)
        return ch.cancel.is_set()

    def on_prompt(done: int, total: int) -> bool:
        ch.send({"ev": "progress", "done": int(done), "total": int(total), "stats": _asdict(eng.stats())})
        return ch.cancel.is_set()

    constraint = None
    if cmd.grammar:
        try:
            from strata.grammar import grammars_for
            from strata.tokenizer import Tokenizer

            tok = _TOKENIZER.get(model) or _TOKENIZER.setdefault(model, Tokenizer.from_gguf(model))
            constraint = grammars_for(tok).constraint(cmd.grammar, cmd.max_tokens)
        except Exception as e:
            ch.send({"ev": "error", **_error_event(e), "stats": _asdict(eng.stats())})
            return
        free_on_token = on_token

        def on_token(tok: int, logits: Any) -> bool:  # noqa: F811 (the grammar follows each token)
            assert constraint is not None
            constraint.accept(tok)
            return free_on_token(tok, logits)

    prompt = [int(t) for t in cmd.prompt]
    # with cache_prompt, the longest prefix the KV cache already holds is kept, if the same client scope
    # wrote it (at least one prompt token is always read again: its logits pick the first reply token)
    reuse = 0
    if cmd.cache_prompt and cmd.cache_scope == ch.context_scope:
        held, limit = ch.context, min(len(ch.context), len(prompt) - 1)
        while reuse < limit and held[reuse] == prompt[reuse]:
            reuse += 1
    before = _asdict(eng.stats())
    try:
        if reuse > 0:
            eng.kv_truncate(reuse)
        else:
            eng.kv_reset()
        ch.context = []
        ch.context_scope = cmd.cache_scope
        r = eng.generate(
            prompt[reuse:],
            max_tokens=cmd.max_tokens,
            temperature=cmd.temperature,
            top_k=cmd.top_k,
            top_p=cmd.top_p,
            min_p=cmd.min_p,
            seed=cmd.seed,
            stop_tokens=cmd.stop_tokens,
            stop_at_eos=cmd.stop_at_eos,
            on_token=on_token,
            on_prompt=on_prompt,
            top_logits=cmd.top_logits,
            logits_processor=constraint.mask if constraint is not None else None,
        )
    except Exception as e:
        after = _asdict(eng.stats())
        ch.send({"ev": "error", **_error_event(e), "stats": after})
        return
    after = _asdict(eng.stats())
    ch.context = (prompt + list(r.tokens))[: eng.n_past]  # what the KV cache now holds
    finish = r.finish_reason
    if ch.cancel.is_set():
        finish = "cancelled"
    # under a grammar the runner-up may be a forbidden token (-inf): no margin then
    margins = [
        float(t[0][1] - t[1][1]) if len(t) >= 2 and math.isfinite(t[0][1] - t[1][1]) else None for t in r.top
    ]
    ch.send(
        {
            "ev": "done",
            "tokens": r.tokens,
            "finish_reason": finish,
            "prompt_tokens": r.prompt_tokens,
            "prompt_ms": r.prompt_ms,
            "decode_ms": r.decode_ms,
            "margins": margins,
            "stats": after,
            "delta": {k: after[k] - before[k] for k in _DELTA_FIELDS if k in after and k in before},
            "cancel_seen_at": ch.cancel_seen_at,
            "cached_tokens": reuse,
            "closed_early": bool(constraint is not None and constraint.closed_early),
        }
    )


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
        while True:
            cmd = ch.commands.get()
            if cmd is None or cmd.get("op") == "shutdown":
                break
            if cmd.get("op") == "generate":
                try:
                    command = GenerateCommand.from_message(cmd)
                except ProtocolError as e:
                    ch.send({"ev": "error", "error": "ProtocolError", "status": 0, "message": str(e)})
                    continue
                _generate(eng, ch, command, model)
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
