"""The owning wrapper around one libstrata engine, plus the kernel entry points.

``Engine`` opens a GGUF model with an ``EngineConfig``, runs prompts and decode steps, samples with
``generate``, and maps every failing status to the exception of ``error_for_status``. ``close()`` may
be called any number of times; the engine is also a context manager. One engine is used by one
thread at a time (``stats()`` excepted: it may be read while another thread generates).
"""

from __future__ import annotations

import ctypes
import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from enum import IntEnum
from os import PathLike, fspath
from typing import Any, Literal

import numpy as np

from . import _cdefs as C
from ._config import EngineConfig, generation_room
from ._enums import CachePolicy, Device, KvType, LendPolicy, MissPolicy, Simd, Split, Status, choice
from ._exceptions import InvalidArgumentError, ModelFileError, StrataError, error_for_status
from ._model_path import model_path_problem

__all__ = [
    "DeviceInfo",
    "Engine",
    "GenerateResult",
    "Layout",
    "ModelInfo",
    "Plan",
    "Stats",
    "config_to_params",
    "cpu_features",
    "cuda_available",
    "dequantize",
    "matmul",
    "matvec",
    "simd_levels",
    "simd_set",
    "type_name",
    "type_row_bytes",
]

STATUS_CANCELLED = Status.ERR_CANCELLED.value


def _struct_to_dataclass(cls: type[Any], s: ctypes.Structure) -> Any:
    values = {}
    for f in dataclasses.fields(cls):
        v = getattr(s, f.name)
        values[f.name] = v.decode("utf-8", "replace") if isinstance(v, bytes) else v
    return cls(**values)


@dataclass(frozen=True)
class ModelInfo:
    """What the model file describes (strata_model_info)."""

    arch: str
    name: str
    n_vocab: int
    n_ctx_train: int
    n_embd: int
    n_layer: int
    n_head: int
    n_head_kv: int
    head_dim: int
    n_expert: int
    n_expert_used: int
    n_ff_exp: int
    rope_theta: float
    rms_eps: float
    bos_id: int
    eos_id: int
    n_params: int
    file_bytes: int
    resident_bytes: int
    expert_bytes: int
    expert_type: int
    tied_embeddings: int


@dataclass(frozen=True)
class Plan:
    """The memory plan, fixed at open (strata_plan). Sizes in bytes."""

    device: int
    budget_bytes: int
    resident_bytes: int
    kv_bytes: int
    scratch_bytes: int
    reserve_bytes: int
    slot_bytes: int
    n_slots: int
    n_experts_total: int
    max_context: int
    kv_type: int
    auto_chunk: int
    auto_ring_slots: int
    auto_loan_slots: int
    small_chunk: int
    lend_floor: int
    max_lend_slots: int
    lend_policy: int
    miss_policy: int
    cache_policy: int
    host_expert_bytes: int
    host_borrow_bytes: int
    host_avail_bytes: int
    n_threads: int
    simd: int
    n_seq: int


@dataclass(frozen=True)
class DeviceInfo:
    """One device of the engine (strata_device_info): the layers it holds, its own plan, its cache's counters.
    A layer split has one per device, in layer order; every other engine has one."""

    device: int
    layer_begin: int
    layer_end: int
    plan: Plan
    slots_lent_now: int
    last_loan_slots: int
    lookups: int
    hits: int
    misses: int
    swaps: int
    device_bytes: int
    device_peak_bytes: int


@dataclass(frozen=True)
class Layout:
    """One prompt chunk's layout (strata_layout)."""

    n_tokens: int
    buffer_bytes: int
    ring_slots: int
    slots_needed: int
    host_bytes: int


@dataclass(frozen=True)
class Stats:
    """Counters since open or the last reset (strata_stats)."""

    lookups: int
    hits: int
    misses: int
    swaps: int
    bytes_streamed: int
    bytes_copied: int
    host_expert_runs: int
    slots_lent_now: int
    last_loan_slots: int
    last_chunk: int
    halvings: int
    refills: int
    n_past: int
    prompt_tokens: int
    decode_tokens: int
    prompt_ms: float
    decode_ms: float
    state: int
    prompt_done: int
    prompt_total: int
    device_bytes: int
    device_peak_bytes: int
    bus_reads: int  # decode misses the device read from the pinned host store (--miss read)


@dataclass
class GenerateResult:
    """What ``Engine.generate`` produced."""

    tokens: list[int]
    finish_reason: Literal["stop", "length", "cancelled"]
    prompt_tokens: int  # prompt tokens read (fewer when the prompt was cancelled part way)
    prompt_ms: float
    decode_ms: float
    top: list[list[tuple[int, float]]] = field(default_factory=list)


def _result(
    tokens: list[int],
    finish: Literal["stop", "length", "cancelled"],
    n: int,
    before: Stats,
    after: Stats,
    top: list[list[tuple[int, float]]],
) -> GenerateResult:
    """A generation's result from its tokens and the counters around it. A generation cancelled while its
    prompt of n tokens was read counts the tokens read before the cancel (then forgotten)."""
    read = n
    if finish == "cancelled" and after.prompt_tokens - before.prompt_tokens < n:
        read = min(n, after.prompt_done)
    return GenerateResult(
        tokens=tokens,
        finish_reason=finish,
        prompt_tokens=read,
        prompt_ms=after.prompt_ms - before.prompt_ms,
        decode_ms=after.decode_ms - before.decode_ms,
        top=top,
    )


# EngineConfig fields copied to strata_params as they are when set (None keeps the library's default)
_PLAIN_PARAMS = {
    "threads": "n_threads",
    "vram_budget": "vram_budget",
    "vram_reserve_mib": "vram_reserve_mib",
    "max_context": "max_context",
    "lend_floor": "lend_floor",
    "lend_pct": "lend_pct",
    "adapt_every": "adapt_every",
    "adapt_swaps": "adapt_swaps",
    "adapt_decay": "adapt_decay",
    "host_ram_budget": "host_ram_budget",
    "parallel": "n_seq",
}
# EngineConfig fields named by a word of strata.h's enumerations: (params field, enum, flag)
_ENUM_PARAMS: dict[str, tuple[str, type[IntEnum], str]] = {
    "device": ("device", Device, "device"),
    "kv": ("kv_type", KvType, "kv"),
    "lend_policy": ("lend_policy", LendPolicy, "lend-policy"),
    "miss": ("miss_policy", MissPolicy, "miss"),
    "cache_policy": ("cache_policy", CachePolicy, "cache-policy"),
    "simd": ("simd", Simd, "simd"),
    "split": ("split", Split, "split"),
}


def config_to_params(config: EngineConfig) -> C.StrataParams:
    """The strata_params of an EngineConfig (None fields keep the library's defaults)."""
    cfg = config.validate()
    p = C.strata_default_params()
    for name, field_ in _PLAIN_PARAMS.items():
        if (value := getattr(cfg, name)) is not None:
            setattr(p, field_, value)
    for name, (field_, enum, flag) in _ENUM_PARAMS.items():
        setattr(p, field_, choice(enum, getattr(cfg, name), flag))
    p.expert_cache = -1 if cfg.expert_cache == "auto" else int(cfg.expert_cache)
    if cfg.prefill == "auto":
        p.prefill_chunk, p.prefill_max = 0, 0
    elif cfg.prefill.startswith("auto:"):
        p.prefill_chunk, p.prefill_max = 0, int(cfg.prefill[5:])
    else:
        p.prefill_chunk, p.prefill_max = int(cfg.prefill), 0
    if cfg.expert_profile is not None:
        p.expert_profile = fspath(cfg.expert_profile).encode()
    if cfg.split != "none":  # gpus, tensor_split and the per-device budgets: one entry per device
        devices = cfg.split_devices()
        p.n_devices = len(devices)
        for i, d in enumerate(devices):
            p.devices[i] = d
        for i, share in enumerate(cfg.split_shares() or []):
            p.tensor_split[i] = share
        for i, b in enumerate(cfg.vram_budgets or []):
            p.vram_budgets[i] = b
    return p


def _top(logits: np.ndarray, n: int) -> list[tuple[int, float]]:
    """The n best (id, logit), best first, lower id first among equals."""
    n = min(n, logits.shape[0])
    part = np.argpartition(-logits, n - 1)[:n] if n < logits.shape[0] else np.arange(logits.shape[0])
    order = sorted(part.tolist(), key=lambda i: (-float(logits[i]), i))
    return [(int(i), float(logits[i])) for i in order]


class Engine:
    """One model opened by libstrata (see the module docstring)."""

    def __init__(
        self,
        model_path: str | PathLike[str],
        config: EngineConfig | None = None,
        *,
        trace: Callable[[str], None] | None = None,
    ) -> None:
        self._h: int | None = None
        self.config = config or EngineConfig()
        params = config_to_params(self.config)
        self._trace_cb = None
        if trace is not None:

            def _on_trace(_user: Any, line: bytes) -> None:
                try:
                    trace(line.decode("utf-8", "replace"))
                except Exception:  # a failing trace sink must not break the engine
                    pass

            self._trace_cb = C.TRACE_FN(_on_trace)
            params.trace = self._trace_cb
        self._params = params  # keeps expert_profile's bytes alive while open
        handle = ctypes.c_void_p()
        err = ctypes.create_string_buffer(1024)
        self.model_path = fspath(model_path)
        problem = model_path_problem(self.model_path, "give the path of a GGUF file")
        if problem is not None:  # before the C side sees it: a pipe would block, a NUL cut the path
            if "\x00" in self.model_path:
                raise InvalidArgumentError(problem)
            raise ModelFileError(problem, Status.ERR_IO.value)  # as the engine says of a file it cannot open
        status = C.strata_engine_open(
            self.model_path.encode(), ctypes.byref(params), ctypes.byref(handle), err, 1024
        )
        if status != 0:
            raise error_for_status(status, err.value.decode("utf-8", "replace"))
        self._h = handle.value
        info = C.StrataModelInfo()
        self._check(C.strata_model_info_get(self.handle, ctypes.byref(info)))
        self.info: ModelInfo = _struct_to_dataclass(ModelInfo, info)

    # ---- lifetime ----------------------------------------------------------------------------------

    def close(self) -> None:
        """Free the engine; safe to call more than once."""
        h, self._h = self._h, None
        if h:
            C.strata_engine_close(h)

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass

    @property
    def handle(self) -> int:
        if not self._h:
            raise StrataError("the engine is closed")
        return self._h

    @property
    def last_error(self) -> str:
        if not self._h:
            return ""
        return (C.strata_last_error(self._h) or b"").decode("utf-8", "replace")

    def _check(self, status: int) -> None:
        if status != 0:
            raise error_for_status(status, self.last_error)

    # ---- descriptions ------------------------------------------------------------------------------

    @property
    def plan(self) -> Plan:
        p = C.StrataPlan()
        self._check(C.strata_plan_get(self.handle, ctypes.byref(p)))
        return _struct_to_dataclass(Plan, p)

    def devices(self) -> list[DeviceInfo]:
        """Each device the layers run on, in layer order (one without a split), with its own plan."""
        out = []
        for i in range(C.strata_device_count(self.handle)):
            d = C.StrataDeviceInfo()
            self._check(C.strata_device_info_get(self.handle, i, ctypes.byref(d)))
            fields = {f.name: getattr(d, f.name) for f in dataclasses.fields(DeviceInfo) if f.name != "plan"}
            out.append(DeviceInfo(plan=_struct_to_dataclass(Plan, d.plan), **fields))
        return out

    def layout(self, n_tokens: int) -> Layout:
        out = C.StrataLayout()
        self._check(C.strata_chunk_layout(self.handle, int(n_tokens), ctypes.byref(out)))
        return _struct_to_dataclass(Layout, out)

    # ---- running -----------------------------------------------------------------------------------

    @staticmethod
    def _token_array(tokens: Sequence[int] | np.ndarray) -> tuple[Any, int]:
        arr = np.ascontiguousarray(np.asarray(tokens, dtype=np.int64))
        if arr.ndim != 1:
            raise ValueError("tokens must be a flat sequence of token ids")
        if arr.size and (arr.min() < -(2**31) or arr.max() >= 2**31):
            raise ValueError("token ids must fit in 32 bits")
        buf = (ctypes.c_int32 * max(1, arr.size))(*arr.tolist())
        return buf, int(arr.size)

    def _progress_cb(self, progress: Callable[[int, int], Any] | None, errors: list[BaseException]) -> Any:
        if progress is None:
            return C.PROGRESS_FN()

        def _on_progress(_user: Any, done: int, total: int) -> int:
            try:
                return 1 if progress(done, total) else 0
            except BaseException as e:  # re-raised after the C call returns
                errors.append(e)
                return 1

        return C.PROGRESS_FN(_on_progress)

    def prefill(
        self, tokens: Sequence[int] | np.ndarray, progress: Callable[[int, int], Any] | None = None
    ) -> None:
        """Append tokens to the context and compute the logits of the last one."""
        buf, n = self._token_array(tokens)
        errors: list[BaseException] = []
        cb = self._progress_cb(progress, errors)
        status = C.strata_prefill(self.handle, buf, n, cb, None)
        if errors:
            raise errors[0]
        self._check(status)

    def decode(self, token: int) -> None:
        """Append one token and compute its logits."""
        self._check(C.strata_decode(self.handle, int(token)))

    # ---- several sequences (EngineConfig.parallel) -------------------------------------------------

    @property
    def n_seq(self) -> int:
        """Sequences this engine holds, each with its own KV cache."""
        return int(self.plan.n_seq)

    def seq_prefill(
        self, seq: int, tokens: Sequence[int] | np.ndarray, progress: Callable[[int, int], Any] | None = None
    ) -> None:
        """``prefill`` into sequence ``seq``."""
        buf, n = self._token_array(tokens)
        errors: list[BaseException] = []
        cb = self._progress_cb(progress, errors)
        status = C.strata_seq_prefill(self.handle, int(seq), buf, n, cb, None)
        if errors:
            raise errors[0]
        self._check(status)

    def decode_batch(self, seqs: Sequence[int], tokens: Sequence[int]) -> None:
        """Append ``tokens[i]`` to sequence ``seqs[i]``, all in one forward pass; each row gets the bits it
        would get decoded alone."""
        if len(seqs) != len(tokens):
            raise ValueError(f"decode_batch: {len(seqs)} sequences but {len(tokens)} tokens")
        n = len(seqs)
        sb = (ctypes.c_int32 * max(1, n))(*[int(q) for q in seqs])
        tb = (ctypes.c_int32 * max(1, n))(*[int(t) for t in tokens])
        self._check(C.strata_decode_batch(self.handle, n, sb, tb))

    def seq_logits_view(self, seq: int) -> np.ndarray:
        """Sequence ``seq``'s last logits [n_vocab], a view valid until the engine runs again."""
        ptr = C.strata_seq_logits(self.handle, int(seq))
        if not ptr:
            raise error_for_status(12, f"sequence {seq} has no logits yet: prefill or decode a token first")
        return np.ctypeslib.as_array(ptr, shape=(self.info.n_vocab,))

    def seq_logits(self, seq: int) -> np.ndarray:
        """A copy of sequence ``seq``'s last logits [n_vocab]."""
        return self.seq_logits_view(seq).copy()

    def seq_n_past(self, seq: int) -> int:
        return int(C.strata_seq_n_past(self.handle, int(seq)))

    def seq_kv_truncate(self, seq: int, n_keep: int) -> None:
        """Keep the first ``n_keep`` tokens of sequence ``seq`` (0 empties it)."""
        self._check(C.strata_seq_kv_truncate(self.handle, int(seq), int(n_keep)))

    def logits(self) -> np.ndarray:
        """A copy of the last token's logits [n_vocab]."""
        ptr = C.strata_logits(self.handle)
        if not ptr:
            raise error_for_status(12, "no logits yet: prefill or decode a token first")
        return np.ctypeslib.as_array(ptr, shape=(self.info.n_vocab,)).copy()

    @property
    def n_past(self) -> int:
        return int(C.strata_n_past(self.handle))

    def kv_truncate(self, n_keep: int) -> None:
        self._check(C.strata_kv_truncate(self.handle, int(n_keep)))

    def kv_reset(self) -> None:
        C.strata_kv_reset(self.handle)

    def generate(
        self,
        prompt_ids: Sequence[int] | np.ndarray,
        *,
        max_tokens: int = 128,
        temperature: float = 0.0,
        top_k: int = 0,
        top_p: float = 1.0,
        min_p: float = 0.0,
        seed: int = 0,
        stop_tokens: Sequence[int] = (),
        stop_at_eos: bool = True,
        on_token: Callable[[int, np.ndarray], Any] | None = None,
        on_prompt: Callable[[int, int], Any] | None = None,
        top_logits: int = 0,
        logits_processor: Callable[[np.ndarray], Any] | None = None,
    ) -> GenerateResult:
        """Prefill prompt_ids (appended to the context), then sample up to max_tokens.

        ``on_token(token_id, logits_view)`` sees each token with a view of the logits it was sampled
        from (valid only during the call); a truthy return stops. ``on_prompt(n_done, n_total)``
        reports prompt progress after each chunk, and is asked again between the layers of a chunk (n_done
        unchanged) so that a cancel takes effect within a layer; a truthy return cancels (finish_reason
        "cancelled").

        ``logits_processor(logits)``, when given, is called before each token is sampled with a writable
        copy of the step's logits and may change it in place (constrained decoding sets forbidden tokens
        to -inf: ``strata.grammar``); the engine's own sampler then picks from the copy, which is also
        what ``on_token`` sees. The steps are then driven from here (prefill, sample, decode) with the
        same rules as the engine's own loop, so an identity processor gives the same reply.
        """
        if logits_processor is not None:
            return self._generate_processed(
                prompt_ids,
                logits_processor,
                max_tokens=max_tokens,
                temperature=temperature,
                top_k=top_k,
                top_p=top_p,
                min_p=min_p,
                seed=seed,
                stop_tokens=stop_tokens,
                stop_at_eos=stop_at_eos,
                on_token=on_token,
                on_prompt=on_prompt,
                top_logits=top_logits,
            )
        buf, n = self._token_array(prompt_ids)
        gp = C.strata_default_generate_params()
        gp.sampling.temperature = float(temperature)
        gp.sampling.top_k = int(top_k)
        gp.sampling.top_p = float(top_p)
        gp.sampling.min_p = float(min_p)
        gp.sampling.seed = int(seed) & (2**64 - 1)
        gp.max_tokens = int(max_tokens)
        stops = (ctypes.c_int32 * max(1, len(stop_tokens)))(*[int(t) for t in stop_tokens])
        gp.stop_tokens = stops
        gp.n_stop_tokens = len(stop_tokens)
        gp.stop_at_eos = 1 if stop_at_eos else 0
        errors: list[BaseException] = []
        gp.on_prompt = self._progress_cb(on_prompt, errors)
        top: list[list[tuple[int, float]]] = []
        stopped = [False]

        def _on_token(_user: Any, token: int, logits_p: Any, n_vocab: int) -> int:
            try:
                if top_logits > 0 or on_token is not None:
                    view = np.ctypeslib.as_array(logits_p, shape=(n_vocab,))
                    if top_logits > 0:
                        top.append(_top(view, top_logits))
                    if on_token is not None and on_token(int(token), view):
                        stopped[0] = True
                        return 1
                return 0
            except BaseException as e:
                errors.append(e)
                return 1

        cb = C.TOKEN_FN(_on_token)
        # the context bounds what can be generated: n_past + prompt + generated - 1 <= max_context
        room = generation_room(self.plan.max_context, self.n_past, n)
        limit = max(0, min(int(max_tokens), room)) if room > 0 else int(max_tokens)
        gp.max_tokens = limit
        cap = max(1, limit)
        out = (ctypes.c_int32 * cap)()
        n_out = ctypes.c_int32(0)
        before = self.stats()
        status = C.strata_generate(
            self.handle, buf, n, ctypes.byref(gp), cb, None, out, cap, ctypes.byref(n_out)
        )
        after = self.stats()
        if errors:
            raise errors[0]
        tokens = [int(out[i]) for i in range(min(n_out.value, cap))]
        finish: Literal["stop", "length", "cancelled"]
        if status == STATUS_CANCELLED:
            finish = "cancelled"
        elif status != 0:
            raise error_for_status(status, self.last_error)
        elif stopped[0] or len(tokens) < limit:
            finish = "stop"
        else:
            finish = "length"  # max_tokens, or the context is full
        return _result(tokens, finish, n, before, after, top)

    def _generate_processed(
        self,
        prompt_ids: Sequence[int] | np.ndarray,
        processor: Callable[[np.ndarray], Any],
        *,
        max_tokens: int,
        temperature: float,
        top_k: int,
        top_p: float,
        min_p: float,
        seed: int,
        stop_tokens: Sequence[int],
        stop_at_eos: bool,
        on_token: Callable[[int, np.ndarray], Any] | None,
        on_prompt: Callable[[int, int], Any] | None,
        top_logits: int,
    ) -> GenerateResult:
        """``generate`` with a logits processor: strata_generate's loop, one C call per step."""
        buf, n = self._token_array(prompt_ids)
        sp = C.StrataSampling(
            float(temperature), int(top_k), float(top_p), float(min_p), int(seed) & (2**64 - 1)
        )
        smp = ctypes.c_void_p()
        if C.strata_sampler_init(ctypes.byref(sp), ctypes.byref(smp)) != 0:
            raise error_for_status(
                1,
                "generate: sampling settings out of range (temperature >= 0, 0 < top_p <= 1, "
                "0 <= min_p <= 1, top_k >= 0)",
            )
        room = generation_room(self.plan.max_context, self.n_past, n)
        limit = max(0, min(int(max_tokens), room)) if room > 0 else int(max_tokens)
        stops = {int(t) for t in stop_tokens}
        if stop_at_eos and self.info.eos_id >= 0:
            stops.add(int(self.info.eos_id))
        n_ctx = self.plan.max_context
        before = self.stats()
        tokens: list[int] = []
        top: list[list[tuple[int, float]]] = []
        finish: Literal["stop", "length", "cancelled"] = "length"
        try:
            if n > 0:
                errors: list[BaseException] = []
                status = C.strata_prefill(self.handle, buf, n, self._progress_cb(on_prompt, errors), None)
                if errors:
                    raise errors[0]
                if status == STATUS_CANCELLED:
                    finish = "cancelled"
                else:
                    self._check(status)
            else:
                self.logits()  # raises when no token was processed yet
            while finish != "cancelled" and len(tokens) < limit:
                x = self.logits()
                processor(x)
                tok = int(
                    C.strata_sampler_sample(
                        smp.value or 0, x.ctypes.data_as(ctypes.POINTER(ctypes.c_float)), x.size
                    )
                )
                if tok < 0 or tok in stops:
                    finish = "stop"
                    break
                tokens.append(tok)
                if top_logits > 0:
                    top.append(_top(x, top_logits))
                if on_token is not None and on_token(tok, x):
                    finish = "stop"
                    break
                if len(tokens) >= limit or self.n_past >= n_ctx:
                    break
                self.decode(tok)
            if finish == "length" and len(tokens) < limit:
                finish = "stop"  # as the engine's loop says it: the context filled before max_tokens
        finally:
            C.strata_sampler_free(smp.value or 0)
        return _result(tokens, finish, n, before, self.stats(), top)

    # ---- observability -----------------------------------------------------------------------------

    def stats(self) -> Stats:
        s = C.StrataStats()
        self._check(C.strata_stats_get(self.handle, ctypes.byref(s)))
        return _struct_to_dataclass(Stats, s)

    def reset_stats(self) -> None:
        C.strata_stats_reset(self.handle)

    def residency(self) -> np.ndarray:
        """slot of (layer, expert), or -1: int32 [n_layer, n_expert]."""
        n = self.info.n_layer * self.info.n_expert
        arr = np.empty(n, dtype=np.int32)
        self._check(
            C.strata_cache_residency(self.handle, arr.ctypes.data_as(ctypes.POINTER(ctypes.c_int32)), n)
        )
        return arr.reshape(self.info.n_layer, self.info.n_expert)

    def save_profile(self, path: str | PathLike[str]) -> None:
        self._check(C.strata_profile_save(self.handle, fspath(path).encode()))


# ---- kernels (tests and benchmarks) -------------------------------------------------------------


def cpu_features() -> str:
    return (C.strata_cpu_features() or b"").decode()


def cuda_available() -> bool:
    return bool(C.strata_cuda_available())


def simd_set(level: str | int) -> int:
    """Select the kernel level used by dequantize/matvec/matmul; returns the level in use."""
    lv = Simd[level.upper()] if isinstance(level, str) else int(level)
    got = C.strata_simd_set(lv)
    if got < 0:
        raise error_for_status(
            Status.ERR_INVALID_ARGUMENT,
            f"SIMD level {level!r} is not supported by this CPU ({cpu_features()})",
        )
    return int(got)


def simd_levels() -> list[str]:
    """The kernel levels this CPU runs, lowest first, as the engine itself checks them (it leaves the
    process-wide level of the kernel entry points at auto)."""
    out = [name for name in ("scalar", "avx2", "avx512") if C.strata_simd_set(Simd[name.upper()]) >= 0]
    C.strata_simd_set(Simd.AUTO)
    return out


def type_row_bytes(type: int, n: int) -> int:
    return int(C.strata_type_row_bytes(int(type), int(n)))


def type_name(type: int) -> str | None:
    name = C.strata_type_name(int(type))
    return name.decode() if name else None


def _as_bytes(buf: bytes | bytearray | memoryview | np.ndarray) -> Any:
    arr = np.frombuffer(bytes(buf) if not isinstance(buf, np.ndarray) else buf.tobytes(), dtype=np.uint8)
    return arr, arr.ctypes.data_as(ctypes.c_void_p)


def _fptr(a: np.ndarray) -> Any:
    return a.ctypes.data_as(ctypes.POINTER(ctypes.c_float))


def dequantize(type: int, buf: bytes | bytearray | memoryview | np.ndarray, n: int) -> np.ndarray:
    """n values of a tensor of `type` as float32."""
    need = type_row_bytes(type, n)
    if need < 0:
        raise error_for_status(
            1, f"{n} values are not a whole number of blocks of type {type_name(type) or type}"
        )
    arr, ptr = _as_bytes(buf)
    if arr.size < need:
        raise error_for_status(
            1, f"dequantize: {n} values of {type_name(type)} need {need} bytes, got {arr.size}"
        )
    out = np.empty(n, dtype=np.float32)
    status = C.strata_dequantize(int(type), ptr, _fptr(out), int(n))
    if status != 0:
        raise error_for_status(
            status, f"dequantize: type {type_name(type) or type} has no kernels in this build"
        )
    return out


def _product(type: int, w: Any, rows: int, cols: int, x: np.ndarray, n: int, threads: int) -> np.ndarray:
    need = type_row_bytes(type, cols)
    if need < 0:
        raise error_for_status(
            1, f"{cols} columns are not a whole number of blocks of type {type_name(type) or type}"
        )
    arr, ptr = _as_bytes(w)
    if arr.size < need * rows:
        raise error_for_status(
            1, f"weights of {rows}x{cols} {type_name(type)} need {need * rows} bytes, got {arr.size}"
        )
    xs = np.ascontiguousarray(x, dtype=np.float32).reshape(n, cols)
    y = np.empty((n, rows), dtype=np.float32)
    status = C.strata_matmul(int(type), ptr, int(rows), int(cols), _fptr(xs), int(n), _fptr(y), int(threads))
    if status != 0:
        raise error_for_status(status, f"matmul: type {type_name(type) or type} has no kernels in this build")
    return y


def matvec(type: int, w_bytes: Any, rows: int, cols: int, x: np.ndarray, threads: int = 1) -> np.ndarray:
    """y[rows] = W x with the engine's kernels (x quantized as the engine does)."""
    return _product(type, w_bytes, rows, cols, x, 1, threads)[0]


def matmul(type: int, w_bytes: Any, rows: int, cols: int, x: np.ndarray, threads: int = 1) -> np.ndarray:
    """Y[n, rows] = X[n, cols] W^T with the engine's kernels."""
    x2 = np.asarray(x, dtype=np.float32)
    n = x2.shape[0] if x2.ndim == 2 else 1
    return _product(type, w_bytes, rows, cols, x2, n, threads)
