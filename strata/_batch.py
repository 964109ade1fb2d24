"""Several generations in one engine at once (``EngineConfig.parallel``): continuous batching.

``Batch`` runs up to ``engine.n_seq`` generations, each in a sequence of its own (its own KV cache). One
``step()`` reads one prompt chunk of every newcomer (a newcomer joins between steps; the whole prompt when
no other sequence is generating), samples the next token of every sequence that has logits, and appends
those tokens to their sequences in one ``decode_batch`` forward pass. A generation that ends leaves at once
and its sequence is free for the next one. The rules of each generation are ``Engine.generate``'s (the
sampler, the stop tokens, the context room, the finish reason), and the engine gives every row of a batch
the bits it gets decoded alone, so a reply does not depend on what ran beside it:

    with Engine(model, EngineConfig(parallel=4)) as eng:
        b = Batch(eng)
        b.start(BatchRequest("a", prompt_a, max_tokens=32), seq=0)
        b.start(BatchRequest("b", prompt_b, max_tokens=32), seq=1)
        while b.active:
            for key, result, error in b.step():
                ...

The callbacks are ``generate``'s: ``on_token(token, logits)`` (truthy stops), ``on_prompt(done, total)``
(truthy cancels the prompt), ``logits_processor(logits)`` (a writable copy, changed in place).
"""

from __future__ import annotations

import ctypes
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

from . import _cdefs as C
from ._config import generation_room
from ._engine import Engine, GenerateResult, _top
from ._exceptions import error_for_status

__all__ = ["Batch", "BatchRequest"]


@dataclass
class BatchRequest:
    """One generation for a ``Batch``: ``Engine.generate``'s arguments, and ``key`` to know it by."""

    key: Any
    prompt: Sequence[int]
    max_tokens: int = 128
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0
    seed: int = 0
    stop_tokens: Sequence[int] = ()
    stop_at_eos: bool = True
    top_logits: int = 0
    on_token: Callable[[int, np.ndarray], Any] | None = None
    on_prompt: Callable[[int, int], Any] | None = None
    logits_processor: Callable[[np.ndarray], Any] | None = None
    keep: int = 0  # tokens of the sequence's KV cache to keep (a prompt-cache hit): prompt follows them


@dataclass
class _Run:
    req: BatchRequest
    seq: int
    sampler: int
    prompt: list[int]
    limit: int
    stops: set[int]
    done: int = 0  # prompt tokens read
    tokens: list[int] = field(default_factory=list)
    top: list[list[tuple[int, float]]] = field(default_factory=list)
    prompt_ms: float = 0.0
    decode_ms: float = 0.0
    reading: bool = True


# what step() hands back for each generation that ended: its key, its result or the error that ended it
Finished = tuple[Any, GenerateResult | None, BaseException | None]


class Batch:
    """Up to ``engine.n_seq`` generations stepped together (see the module docstring)."""

    def __init__(self, engine: Engine, chunk: int | None = None) -> None:
        self.eng = engine
        self.n_seq = engine.n_seq
        plan = engine.plan
        self.n_ctx = int(plan.max_context)
        self.chunk = int(chunk or plan.auto_chunk or 512)  # prompt tokens a newcomer reads per step
        self._runs: dict[int, _Run] = {}  # sequence -> its generation
        self.held: list[list[int]] = [[] for _ in range(self.n_seq)]  # each sequence's KV cache, in tokens

    @property
    def active(self) -> bool:
        return bool(self._runs)

    def busy(self, seq: int) -> bool:
        return seq in self._runs

    def free_sequences(self) -> list[int]:
        return [q for q in range(self.n_seq) if q not in self._runs]

    def reading(self, key: Any) -> tuple[int, int] | None:
        """(done, total) of a generation whose prompt is being read, else None."""
        for r in self._runs.values():
            if r.req.key == key and r.reading:
                return r.done, len(r.prompt)
        return None

    def start(self, req: BatchRequest, seq: int) -> None:
        """Give a generation sequence ``seq`` (free); it reads its prompt from the next step on."""
        if seq in self._runs or not 0 <= seq < self.n_seq:
            raise ValueError(f"sequence {seq} is not a free sequence of 0..{self.n_seq - 1}")
        keep = max(0, min(int(req.keep), len(self.held[seq])))
        self.eng.seq_kv_truncate(seq, keep)
        self.held[seq] = self.held[seq][:keep]
        prompt = [int(t) for t in req.prompt]
        sp = C.StrataSampling(
            float(req.temperature),
            int(req.top_k),
            float(req.top_p),
            float(req.min_p),
            int(req.seed) & (2**64 - 1),
        )
        smp = ctypes.c_void_p()
        if C.strata_sampler_init(ctypes.byref(sp), ctypes.byref(smp)) != 0:
            raise error_for_status(
                1,
                "generate: sampling settings out of range (temperature >= 0, 0 < top_p <= 1, "
                "0 <= min_p <= 1, top_k >= 0)",
            )
        room = generation_room(self.n_ctx, keep, len(prompt))
        limit = max(0, min(int(req.max_tokens), room)) if room > 0 else int(req.max_tokens)
        stops = {int(t) for t in req.stop_tokens}
        if req.stop_at_eos and self.eng.info.eos_id >= 0:
            stops.add(int(self.eng.info.eos_id))
        self._runs[seq] = _Run(req, seq, smp.value or 0, prompt, limit, stops)

    def cancel_all(self) -> list[Finished]:
        """End every generation (finish reason "cancelled")."""
        return [self._end(r, "cancelled") for r in list(self._runs.values())]

    def _end(
        self, r: _Run, finish: Literal["stop", "length", "cancelled"] | None, err: BaseException | None = None
    ) -> Finished:
        del self._runs[r.seq]
        C.strata_sampler_free(r.sampler)
        if err is not None:
            return r.req.key, None, err
        assert finish is not None
        read = r.done if finish == "cancelled" else len(r.prompt)
        return r.req.key, GenerateResult(r.tokens, finish, read, r.prompt_ms, r.decode_ms, r.top), None

    # ---- one step --------------------------------------------------------------------------------------

    def step(self) -> list[Finished]:
        ended: list[Finished] = []
        eng = self.eng
        generating = any(not r.reading for r in self._runs.values())
        # 1. newcomers read their prompts: one chunk each between steps, all of it when nothing else waits
        for r in [r for r in self._runs.values() if r.reading]:
            n = len(r.prompt)
            piece = r.prompt[r.done : r.done + self.chunk] if generating else r.prompt[r.done :]
            t0 = time.perf_counter()
            # a cancel is also seen inside the piece, between its chunks and layers (the engine asks)
            asked: list[bool] = []

            def inside(d: int, _total: int, r: _Run = r, n: int = n, asked: list[bool] = asked) -> bool:
                if r.req.on_prompt is None or r.done + d >= n:
                    return False
                stop = bool(r.req.on_prompt(r.done + d, n))
                asked.append(stop)
                return stop

            try:
                if piece:
                    eng.seq_prefill(r.seq, piece, inside if r.req.on_prompt is not None else None)
            except BaseException as e:
                r.prompt_ms += (time.perf_counter() - t0) * 1000.0
                eng.seq_kv_truncate(r.seq, len(self.held[r.seq]))
                ended.append(self._end(r, "cancelled") if asked and asked[-1] else self._end(r, None, e))
                continue
            r.prompt_ms += (time.perf_counter() - t0) * 1000.0
            r.done += len(piece)
            self.held[r.seq] += piece
            if r.req.on_prompt is not None and piece:
                try:
                    stop = r.req.on_prompt(r.done, n)
                except BaseException as e:
                    ended.append(self._end(r, None, e))
                    continue
                if stop and r.done < n:
                    ended.append(self._end(r, "cancelled"))
                    continue
            r.reading = r.done < n
        # 2. every sequence with logits picks its next token (generate's loop, one turn)
        seqs: list[int] = []
        toks: list[int] = []
        for r in [r for r in self._runs.values() if not r.reading]:
            try:
                finish = self._pick(r)
            except BaseException as e:
                ended.append(self._end(r, None, e))
                continue
            if finish is not None:
                ended.append(self._end(r, finish))
            else:
                seqs.append(r.seq)
                toks.append(r.tokens[-1])
        # 3. one forward pass appends them all
        if seqs:
            t0 = time.perf_counter()
            try:
                eng.decode_batch(seqs, toks)
            except BaseException as e:
                for q in seqs:
                    ended.append(self._end(self._runs[q], None, e))
                return ended
            ms = (time.perf_counter() - t0) * 1000.0
            for q, t in zip(seqs, toks, strict=True):
                self._runs[q].decode_ms += ms
                self.held[q].append(t)
        return ended

    def _pick(self, r: _Run) -> Literal["stop", "length"] | None:
        """Sample r's next token; the finish reason when the generation ends here, else None."""
        if len(r.tokens) >= r.limit:  # max_tokens 0
            return "length"
        x = self.eng.seq_logits_view(r.seq)
        if r.req.logits_processor is not None:
            x = x.copy()
            r.req.logits_processor(x)
        tok = int(
            C.strata_sampler_sample(r.sampler, x.ctypes.data_as(ctypes.POINTER(ctypes.c_float)), x.size)
        )
        if tok < 0 or tok in r.stops:
            return "stop"
        r.tokens.append(tok)
        if r.req.top_logits > 0:
            r.top.append(_top(x, r.req.top_logits))
        if r.req.on_token is not None and r.req.on_token(tok, x):
            return "stop"
        if len(r.tokens) >= r.limit:
            return "length"
        if self.eng.seq_n_past(r.seq) >= self.n_ctx:
            return "stop"  # the context is full: the last token cannot be appended
        return None
