# mypy: disable-error-code="empty-body"
"""1:1 ctypes declarations of ``native/include/strata.h`` and ``native/include/strata_kernels.h``.

The engine's contract (strata.h) comes first; the kernel-level entry points that only tests and
benchmarks call (strata_kernels.h) come last, under banners that name that header. Each function quotes
its C prototype above it; the ``c_function`` decorator records its argument and return types (applied
to the library by ``declare`` when it is loaded) and turns the stub into a call into libstrata. Structs
mirror the header field by field, in order. (The stubs' bodies are never run: the decorator replaces
them, hence the mypy setting above.)
"""

from __future__ import annotations

import ctypes
import functools
from collections.abc import Callable
from ctypes import (
    CFUNCTYPE,
    POINTER,
    Structure,
    c_char,
    c_char_p,
    c_double,
    c_float,
    c_int32,
    c_int64,
    c_size_t,
    c_uint64,
    c_void_p,
)
from typing import Any, TypeVar

__all__ = [
    "DECLARATIONS",
    "PROGRESS_FN",
    "TOKEN_FN",
    "TRACE_FN",
    "MAX_DEVICES",
    "StrataDeviceInfo",
    "StrataGenerateParams",
    "StrataLayout",
    "StrataLoanPrediction",
    "StrataModelInfo",
    "StrataParams",
    "StrataPlan",
    "StrataSampling",
    "StrataStats",
    "declare",
    "strata_cache_residency",
    "strata_chunk_layout",
    "strata_cpu_features",
    "strata_device_count",
    "strata_device_info_get",
    "strata_predict_loan",
    "strata_predict_loan_device",
    "strata_cuda_attention",
    "strata_cuda_available",
    "strata_cuda_bench_matvec",
    "strata_cuda_flash_attention",
    "strata_cuda_matvec",
    "strata_cuda_mirror_expert",
    "strata_cuda_mirror_matvec",
    "strata_cuda_mirror_mmq",
    "strata_cuda_mirror_swiglu",
    "strata_cuda_mmq",
    "strata_cuda_router_topk",
    "strata_decode",
    "strata_decode_batch",
    "strata_default_generate_params",
    "strata_default_params",
    "strata_default_sampling",
    "strata_dequantize",
    "strata_engine_close",
    "strata_engine_open",
    "strata_generate",
    "strata_kv_reset",
    "strata_kv_truncate",
    "strata_last_error",
    "strata_logits",
    "strata_matmul",
    "strata_matvec",
    "strata_model_describe",
    "strata_model_info_get",
    "strata_n_past",
    "strata_plan_get",
    "strata_prefill",
    "strata_profile_save",
    "strata_sampler_free",
    "strata_sampler_init",
    "strata_sampler_sample",
    "strata_seq_kv_truncate",
    "strata_seq_logits",
    "strata_seq_n_past",
    "strata_seq_prefill",
    "strata_simd_set",
    "strata_stats_get",
    "strata_stats_reset",
    "strata_status_str",
    "strata_type_name",
    "strata_type_row_bytes",
    "strata_version",
]

# ---- callbacks ----------------------------------------------------------------------------------

# typedef void (*strata_trace_fn)(void *user, const char *line);
TRACE_FN = CFUNCTYPE(None, c_void_p, c_char_p)
# typedef int32_t (*strata_progress_fn)(void *user, int32_t n_done, int32_t n_total);
PROGRESS_FN = CFUNCTYPE(c_int32, c_void_p, c_int32, c_int32)
# typedef int32_t (*strata_token_fn)(void *user, int32_t token, const float *logits, int32_t n_vocab);
TOKEN_FN = CFUNCTYPE(c_int32, c_void_p, c_int32, POINTER(c_float), c_int32)

# ---- structs ------------------------------------------------------------------------------------


# STRATA_MAX_DEVICES: the most devices a layer split may use
MAX_DEVICES = 8


class StrataParams(Structure):
    _fields_ = [
        ("n_threads", c_int32),
        ("device", c_int32),
        ("vram_budget", c_int64),
        ("vram_reserve_mib", c_int32),
        ("max_context", c_int32),
        ("kv_type", c_int32),
        ("expert_cache", c_int32),
        ("prefill_chunk", c_int32),
        ("prefill_max", c_int32),
        ("lend_policy", c_int32),
        ("lend_floor", c_int32),
        ("lend_pct", c_float),
        ("miss_policy", c_int32),
        ("cache_policy", c_int32),
        ("adapt_every", c_int32),
        ("adapt_swaps", c_int32),
        ("adapt_decay", c_float),
        ("expert_profile", c_char_p),
        ("host_ram_budget", c_int64),
        ("simd", c_int32),
        ("trace", TRACE_FN),
        ("trace_user", c_void_p),
        ("n_seq", c_int32),
        ("split", c_int32),
        ("n_devices", c_int32),
        ("devices", c_int32 * MAX_DEVICES),
        ("tensor_split", c_float * MAX_DEVICES),
        ("vram_budgets", c_int64 * MAX_DEVICES),
    ]


class StrataModelInfo(Structure):
    _fields_ = [
        ("arch", c_char * 32),
        ("name", c_char * 128),
        ("n_vocab", c_int32),
        ("n_ctx_train", c_int32),
        ("n_embd", c_int32),
        ("n_layer", c_int32),
        ("n_head", c_int32),
        ("n_head_kv", c_int32),
        ("head_dim", c_int32),
        ("n_expert", c_int32),
        ("n_expert_used", c_int32),
        ("n_ff_exp", c_int32),
        ("rope_theta", c_float),
        ("rms_eps", c_float),
        ("bos_id", c_int32),
        ("eos_id", c_int32),
        ("n_params", c_int64),
        ("file_bytes", c_int64),
        ("resident_bytes", c_int64),
        ("expert_bytes", c_int64),
        ("expert_type", c_int32),
        ("tied_embeddings", c_int32),
    ]


class StrataPlan(Structure):
    _fields_ = [
        ("device", c_int32),
        ("budget_bytes", c_int64),
        ("resident_bytes", c_int64),
        ("kv_bytes", c_int64),
        ("scratch_bytes", c_int64),
        ("reserve_bytes", c_int64),
        ("slot_bytes", c_int64),
        ("n_slots", c_int32),
        ("n_experts_total", c_int32),
        ("max_context", c_int32),
        ("kv_type", c_int32),
        ("auto_chunk", c_int32),
        ("auto_ring_slots", c_int32),
        ("auto_loan_slots", c_int32),
        ("small_chunk", c_int32),
        ("lend_floor", c_int32),
        ("max_lend_slots", c_int32),
        ("lend_policy", c_int32),
        ("miss_policy", c_int32),
        ("cache_policy", c_int32),
        ("host_expert_bytes", c_int64),
        ("host_borrow_bytes", c_int64),
        ("host_avail_bytes", c_int64),
        ("n_threads", c_int32),
        ("simd", c_int32),
        ("n_seq", c_int32),
    ]


class StrataLayout(Structure):
    _fields_ = [
        ("n_tokens", c_int32),
        ("buffer_bytes", c_int64),
        ("ring_slots", c_int32),
        ("slots_needed", c_int32),
        ("host_bytes", c_int64),
    ]


class StrataLoanPrediction(Structure):
    _fields_ = [
        ("n_tokens", c_int32),
        ("chunk", c_int32),
        ("chunk_used", c_int32),
        ("slots_needed", c_int32),
        ("loan_slots", c_int32),
        ("halvings", c_int32),
        ("verdict", c_int32),
    ]


class StrataDeviceInfo(Structure):
    _fields_ = [
        ("device", c_int32),
        ("layer_begin", c_int32),
        ("layer_end", c_int32),
        ("plan", StrataPlan),
        ("slots_lent_now", c_int32),
        ("last_loan_slots", c_int32),
        ("lookups", c_uint64),
        ("hits", c_uint64),
        ("misses", c_uint64),
        ("swaps", c_uint64),
        ("device_bytes", c_int64),
        ("device_peak_bytes", c_int64),
    ]


class StrataStats(Structure):
    _fields_ = [
        ("lookups", c_uint64),
        ("hits", c_uint64),
        ("misses", c_uint64),
        ("swaps", c_uint64),
        ("bytes_streamed", c_uint64),
        ("bytes_copied", c_uint64),
        ("host_expert_runs", c_uint64),
        ("slots_lent_now", c_int32),
        ("last_loan_slots", c_int32),
        ("last_chunk", c_int32),
        ("halvings", c_int32),
        ("refills", c_int32),
        ("n_past", c_int32),
        ("prompt_tokens", c_int64),
        ("decode_tokens", c_int64),
        ("prompt_ms", c_double),
        ("decode_ms", c_double),
        ("state", c_int32),
        ("prompt_done", c_int32),
        ("prompt_total", c_int32),
        ("device_bytes", c_int64),
        ("device_peak_bytes", c_int64),
        ("bus_reads", c_uint64),
    ]


class StrataSampling(Structure):
    _fields_ = [
        ("temperature", c_float),
        ("top_k", c_int32),
        ("top_p", c_float),
        ("min_p", c_float),
        ("seed", c_uint64),
    ]


class StrataGenerateParams(Structure):
    _fields_ = [
        ("sampling", StrataSampling),
        ("max_tokens", c_int32),
        ("stop_tokens", POINTER(c_int32)),
        ("n_stop_tokens", c_int32),
        ("stop_at_eos", c_int32),
        ("on_prompt", PROGRESS_FN),
    ]


# ---- declaration machinery ----------------------------------------------------------------------

#: name -> (argtypes, restype) of every declared C function
DECLARATIONS: dict[str, tuple[list[Any], Any]] = {}

_F = TypeVar("_F", bound=Callable[..., Any])


def declare(lib: ctypes.CDLL) -> None:
    """Set argtypes/restype on every declared function of a freshly loaded library."""
    for name, (argtypes, restype) in DECLARATIONS.items():
        fn = getattr(lib, name)
        fn.argtypes = argtypes
        fn.restype = restype


def c_function(name: str, argtypes: list[Any], restype: Any) -> Callable[[_F], _F]:
    """Record a C function's signature and make the decorated stub call it."""

    def deco(stub: _F) -> _F:
        DECLARATIONS[name] = (argtypes, restype)
        cached: list[Any] = []

        @functools.wraps(stub)
        def call(*args: Any) -> Any:
            if not cached:
                from ._lib import load_library

                cached.append(getattr(load_library(), name))
            return cached[0](*args)

        return call  # type: ignore[return-value]

    return deco


_engine_p = c_void_p
_sampler_p = c_void_p

# ---- library ------------------------------------------------------------------------------------


# STRATA_API const char *strata_version(void);
@c_function("strata_version", [], c_char_p)
def strata_version() -> bytes: ...


# STRATA_API const char *strata_status_str(strata_status s);
@c_function("strata_status_str", [c_int32], c_char_p)
def strata_status_str(s: int) -> bytes: ...


# STRATA_API const char *strata_cpu_features(void);
@c_function("strata_cpu_features", [], c_char_p)
def strata_cpu_features() -> bytes: ...


# STRATA_API int32_t strata_cuda_available(void);
@c_function("strata_cuda_available", [], c_int32)
def strata_cuda_available() -> int: ...


# STRATA_API strata_params strata_default_params(void);
@c_function("strata_default_params", [], StrataParams)
def strata_default_params() -> StrataParams: ...


# STRATA_API strata_sampling strata_default_sampling(void);
@c_function("strata_default_sampling", [], StrataSampling)
def strata_default_sampling() -> StrataSampling: ...


# STRATA_API strata_generate_params strata_default_generate_params(void);
@c_function("strata_default_generate_params", [], StrataGenerateParams)
def strata_default_generate_params() -> StrataGenerateParams: ...


# ---- engine -------------------------------------------------------------------------------------


# STRATA_API strata_status strata_engine_open(const char *path, const strata_params *params,
#                                             strata_engine **out, char *err, size_t err_len);
@c_function(
    "strata_engine_open", [c_char_p, POINTER(StrataParams), POINTER(c_void_p), c_char_p, c_size_t], c_int32
)
def strata_engine_open(path: bytes, params: Any, out: Any, err: Any, err_len: int) -> int: ...


# STRATA_API void strata_engine_close(strata_engine *eng);
@c_function("strata_engine_close", [_engine_p], None)
def strata_engine_close(eng: int) -> None: ...


# STRATA_API strata_status strata_model_describe(const char *path, char *buf, size_t len);
@c_function("strata_model_describe", [c_char_p, c_char_p, c_size_t], c_int32)
def strata_model_describe(path: bytes, buf: Any, len: int) -> int: ...


# STRATA_API const char *strata_last_error(const strata_engine *eng);
@c_function("strata_last_error", [_engine_p], c_char_p)
def strata_last_error(eng: int) -> bytes: ...


# STRATA_API strata_status strata_model_info_get(const strata_engine *eng, strata_model_info *out);
@c_function("strata_model_info_get", [_engine_p, POINTER(StrataModelInfo)], c_int32)
def strata_model_info_get(eng: int, out: Any) -> int: ...


# STRATA_API strata_status strata_plan_get(const strata_engine *eng, strata_plan *out);
@c_function("strata_plan_get", [_engine_p, POINTER(StrataPlan)], c_int32)
def strata_plan_get(eng: int, out: Any) -> int: ...


# STRATA_API strata_status strata_chunk_layout(const strata_engine *eng, int32_t n_tokens, strata_layout *out);
@c_function("strata_chunk_layout", [_engine_p, c_int32, POINTER(StrataLayout)], c_int32)
def strata_chunk_layout(eng: int, n_tokens: int, out: Any) -> int: ...


# STRATA_API strata_status strata_predict_loan(const strata_engine *eng, int32_t n_tokens,
#                                              strata_loan_prediction *out);
@c_function("strata_predict_loan", [_engine_p, c_int32, POINTER(StrataLoanPrediction)], c_int32)
def strata_predict_loan(eng: int, n_tokens: int, out: Any) -> int: ...


# STRATA_API int32_t strata_device_count(const strata_engine *eng);
@c_function("strata_device_count", [_engine_p], c_int32)
def strata_device_count(eng: int) -> int: ...


# STRATA_API strata_status strata_device_info_get(const strata_engine *eng, int32_t i, strata_device_info *out);
@c_function("strata_device_info_get", [_engine_p, c_int32, POINTER(StrataDeviceInfo)], c_int32)
def strata_device_info_get(eng: int, i: int, out: Any) -> int: ...


# STRATA_API strata_status strata_predict_loan_device(const strata_engine *eng, int32_t i, int32_t n_tokens,
#                                                     strata_loan_prediction *out);
@c_function(
    "strata_predict_loan_device", [_engine_p, c_int32, c_int32, POINTER(StrataLoanPrediction)], c_int32
)
def strata_predict_loan_device(eng: int, i: int, n_tokens: int, out: Any) -> int: ...


# STRATA_API strata_status strata_prefill(strata_engine *eng, const int32_t *tokens, int32_t n_tokens,
#                                         strata_progress_fn progress, void *user);
@c_function("strata_prefill", [_engine_p, POINTER(c_int32), c_int32, PROGRESS_FN, c_void_p], c_int32)
def strata_prefill(eng: int, tokens: Any, n_tokens: int, progress: Any, user: Any) -> int: ...


# STRATA_API strata_status strata_decode(strata_engine *eng, int32_t token);
@c_function("strata_decode", [_engine_p, c_int32], c_int32)
def strata_decode(eng: int, token: int) -> int: ...


# STRATA_API const float *strata_logits(const strata_engine *eng);
@c_function("strata_logits", [_engine_p], POINTER(c_float))
def strata_logits(eng: int) -> Any: ...


# STRATA_API int32_t strata_n_past(const strata_engine *eng);
@c_function("strata_n_past", [_engine_p], c_int32)
def strata_n_past(eng: int) -> int: ...


# STRATA_API strata_status strata_kv_truncate(strata_engine *eng, int32_t n_keep);
@c_function("strata_kv_truncate", [_engine_p, c_int32], c_int32)
def strata_kv_truncate(eng: int, n_keep: int) -> int: ...


# STRATA_API strata_status strata_seq_prefill(strata_engine *eng, int32_t seq, const int32_t *tokens,
#                                             int32_t n_tokens, strata_progress_fn progress, void *user);
@c_function(
    "strata_seq_prefill", [_engine_p, c_int32, POINTER(c_int32), c_int32, PROGRESS_FN, c_void_p], c_int32
)
def strata_seq_prefill(eng: int, seq: int, tokens: Any, n_tokens: int, progress: Any, user: Any) -> int: ...


# STRATA_API strata_status strata_decode_batch(strata_engine *eng, int32_t n, const int32_t *seqs,
#                                              const int32_t *tokens);
@c_function("strata_decode_batch", [_engine_p, c_int32, POINTER(c_int32), POINTER(c_int32)], c_int32)
def strata_decode_batch(eng: int, n: int, seqs: Any, tokens: Any) -> int: ...


# STRATA_API const float *strata_seq_logits(const strata_engine *eng, int32_t seq);
@c_function("strata_seq_logits", [_engine_p, c_int32], POINTER(c_float))
def strata_seq_logits(eng: int, seq: int) -> Any: ...


# STRATA_API int32_t strata_seq_n_past(const strata_engine *eng, int32_t seq);
@c_function("strata_seq_n_past", [_engine_p, c_int32], c_int32)
def strata_seq_n_past(eng: int, seq: int) -> int: ...


# STRATA_API strata_status strata_seq_kv_truncate(strata_engine *eng, int32_t seq, int32_t n_keep);
@c_function("strata_seq_kv_truncate", [_engine_p, c_int32, c_int32], c_int32)
def strata_seq_kv_truncate(eng: int, seq: int, n_keep: int) -> int: ...


# STRATA_API void strata_kv_reset(strata_engine *eng);
@c_function("strata_kv_reset", [_engine_p], None)
def strata_kv_reset(eng: int) -> None: ...


# STRATA_API strata_status strata_generate(strata_engine *eng, const int32_t *prompt, int32_t n_prompt,
#                                          const strata_generate_params *gp, strata_token_fn on_token,
#                                          void *user, int32_t *out, int32_t out_cap, int32_t *n_out);
@c_function(
    "strata_generate",
    [
        _engine_p,
        POINTER(c_int32),
        c_int32,
        POINTER(StrataGenerateParams),
        TOKEN_FN,
        c_void_p,
        POINTER(c_int32),
        c_int32,
        POINTER(c_int32),
    ],
    c_int32,
)
def strata_generate(
    eng: int,
    prompt: Any,
    n_prompt: int,
    gp: Any,
    on_token: Any,
    user: Any,
    out: Any,
    out_cap: int,
    n_out: Any,
) -> int: ...


# ---- sampling -----------------------------------------------------------------------------------


# STRATA_API strata_status strata_sampler_init(const strata_sampling *s, strata_sampler **out);
@c_function("strata_sampler_init", [POINTER(StrataSampling), POINTER(c_void_p)], c_int32)
def strata_sampler_init(s: Any, out: Any) -> int: ...


# STRATA_API void strata_sampler_free(strata_sampler *smp);
@c_function("strata_sampler_free", [_sampler_p], None)
def strata_sampler_free(smp: int) -> None: ...


# STRATA_API int32_t strata_sampler_sample(strata_sampler *smp, const float *logits, int32_t n_vocab);
@c_function("strata_sampler_sample", [_sampler_p, POINTER(c_float), c_int32], c_int32)
def strata_sampler_sample(smp: int, logits: Any, n_vocab: int) -> int: ...


# ---- observability ------------------------------------------------------------------------------


# STRATA_API strata_status strata_stats_get(const strata_engine *eng, strata_stats *out);
@c_function("strata_stats_get", [_engine_p, POINTER(StrataStats)], c_int32)
def strata_stats_get(eng: int, out: Any) -> int: ...


# STRATA_API void strata_stats_reset(strata_engine *eng);
@c_function("strata_stats_reset", [_engine_p], None)
def strata_stats_reset(eng: int) -> None: ...


# STRATA_API strata_status strata_cache_residency(const strata_engine *eng, int32_t *slot_of, int32_t cap);
@c_function("strata_cache_residency", [_engine_p, POINTER(c_int32), c_int32], c_int32)
def strata_cache_residency(eng: int, slot_of: Any, cap: int) -> int: ...


# STRATA_API strata_status strata_profile_save(strata_engine *eng, const char *path);
@c_function("strata_profile_save", [_engine_p, c_char_p], c_int32)
def strata_profile_save(eng: int, path: bytes) -> int: ...


# ---- strata_kernels.h: CPU kernels ---------------------------------------------------------------


# STRATA_API int64_t strata_type_row_bytes(int32_t type, int64_t n);
@c_function("strata_type_row_bytes", [c_int32, c_int64], c_int64)
def strata_type_row_bytes(type: int, n: int) -> int: ...


# STRATA_API const char *strata_type_name(int32_t type);
@c_function("strata_type_name", [c_int32], c_char_p)
def strata_type_name(type: int) -> bytes | None: ...


# STRATA_API strata_status strata_dequantize(int32_t type, const void *src, float *dst, int64_t n);
@c_function("strata_dequantize", [c_int32, c_void_p, POINTER(c_float), c_int64], c_int32)
def strata_dequantize(type: int, src: Any, dst: Any, n: int) -> int: ...


# STRATA_API strata_status strata_matvec(int32_t type, const void *w, int64_t rows, int64_t cols,
#                                        const float *x, float *y, int32_t n_threads);
@c_function(
    "strata_matvec",
    [c_int32, c_void_p, c_int64, c_int64, POINTER(c_float), POINTER(c_float), c_int32],
    c_int32,
)
def strata_matvec(type: int, w: Any, rows: int, cols: int, x: Any, y: Any, n_threads: int) -> int: ...


# STRATA_API strata_status strata_matmul(int32_t type, const void *w, int64_t rows, int64_t cols,
#                                        const float *x, int64_t n, float *y, int32_t n_threads);
@c_function(
    "strata_matmul",
    [c_int32, c_void_p, c_int64, c_int64, POINTER(c_float), c_int64, POINTER(c_float), c_int32],
    c_int32,
)
def strata_matmul(type: int, w: Any, rows: int, cols: int, x: Any, n: int, y: Any, n_threads: int) -> int: ...


# STRATA_API int32_t strata_simd_set(int32_t simd);
@c_function("strata_simd_set", [c_int32], c_int32)
def strata_simd_set(simd: int) -> int: ...


# ---- strata_kernels.h: CUDA kernels and their host mirrors ---------------------------------------


# STRATA_API strata_status strata_cuda_matvec(int32_t type, const void *w, int64_t rows, int64_t cols,
#                                             const float *x, int64_t n, float *y);
@c_function(
    "strata_cuda_matvec",
    [c_int32, c_void_p, c_int64, c_int64, POINTER(c_float), c_int64, POINTER(c_float)],
    c_int32,
)
def strata_cuda_matvec(type: int, w: Any, rows: int, cols: int, x: Any, n: int, y: Any) -> int: ...


# STRATA_API strata_status strata_cuda_mirror_matvec(int32_t type, const void *w, int64_t rows, int64_t cols,
#                                                    const float *x, float *y);
@c_function(
    "strata_cuda_mirror_matvec",
    [c_int32, c_void_p, c_int64, c_int64, POINTER(c_float), POINTER(c_float)],
    c_int32,
)
def strata_cuda_mirror_matvec(type: int, w: Any, rows: int, cols: int, x: Any, y: Any) -> int: ...


# STRATA_API strata_status strata_cuda_bench_matvec(int32_t type, const void *w, int64_t rows, int64_t cols,
#                                                   int64_t n, int32_t reps, double *median_us);
@c_function(
    "strata_cuda_bench_matvec",
    [c_int32, c_void_p, c_int64, c_int64, c_int64, c_int32, POINTER(c_double)],
    c_int32,
)
def strata_cuda_bench_matvec(
    type: int, w: Any, rows: int, cols: int, n: int, reps: int, median_us: Any
) -> int: ...


# STRATA_API strata_status strata_cuda_mmq(int32_t type, const void *w, int32_t n_mat, int64_t rows, int64_t cols,
#                                          const float *x, int64_t n_x, const int32_t *mat, int64_t n_pairs,
#                                          int32_t xdiv, int32_t seg_tokens, float *y);
@c_function(
    "strata_cuda_mmq",
    [
        c_int32,
        c_void_p,
        c_int32,
        c_int64,
        c_int64,
        POINTER(c_float),
        c_int64,
        POINTER(c_int32),
        c_int64,
        c_int32,
        c_int32,
        POINTER(c_float),
    ],
    c_int32,
)
def strata_cuda_mmq(
    type: int,
    w: Any,
    n_mat: int,
    rows: int,
    cols: int,
    x: Any,
    n_x: int,
    mat: Any,
    n_pairs: int,
    xdiv: int,
    seg_tokens: int,
    y: Any,
) -> int: ...


# STRATA_API strata_status strata_cuda_mirror_mmq(int32_t type, const void *w, int64_t rows, int64_t cols,
#                                                 const float *x, float *y);
@c_function(
    "strata_cuda_mirror_mmq",
    [c_int32, c_void_p, c_int64, c_int64, POINTER(c_float), POINTER(c_float)],
    c_int32,
)
def strata_cuda_mirror_mmq(type: int, w: Any, rows: int, cols: int, x: Any, y: Any) -> int: ...


# STRATA_API strata_status strata_cuda_router_topk(const float *logits, int32_t T, int32_t E, int32_t K, int32_t *ids,
#                                                  float *weights, int32_t with_segments);
@c_function(
    "strata_cuda_router_topk",
    [POINTER(c_float), c_int32, c_int32, c_int32, POINTER(c_int32), POINTER(c_float), c_int32],
    c_int32,
)
def strata_cuda_router_topk(
    logits: Any, T: int, E: int, K: int, ids: Any, weights: Any, with_segments: int
) -> int: ...


# the argument types of strata_cuda_attention and strata_cuda_flash_attention (the same prototype)
_ATTENTION_ARGS = [
    c_int32,
    POINTER(c_float),
    POINTER(c_float),
    POINTER(c_float),
    c_int32,
    c_int32,
    c_int32,
    c_int32,
    c_int32,
    c_int32,
    POINTER(c_float),
]


# STRATA_API strata_status strata_cuda_attention(int32_t kv_type, const float *q, const float *k, const float *v,
#                                                int32_t n_pos, int32_t T, int32_t H, int32_t Hkv, int32_t hd,
#                                                int32_t pos_on_device, float *out);
@c_function(
    "strata_cuda_attention",
    _ATTENTION_ARGS,
    c_int32,
)
def strata_cuda_attention(
    kv_type: int,
    q: Any,
    k: Any,
    v: Any,
    n_pos: int,
    T: int,
    H: int,
    Hkv: int,
    hd: int,
    pos_on_device: int,
    out: Any,
) -> int: ...


# STRATA_API strata_status strata_cuda_mirror_expert(int32_t gate_type, const void *gate, int32_t up_type,
#                                                    const void *up, int32_t down_type, const void *down, int64_t D,
#                                                    int64_t F, int32_t n_experts, const float *x, float *out,
#                                                    int32_t n_threads, int32_t reps, double *median_us);
@c_function(
    "strata_cuda_mirror_expert",
    [
        c_int32,
        c_void_p,
        c_int32,
        c_void_p,
        c_int32,
        c_void_p,
        c_int64,
        c_int64,
        c_int32,
        POINTER(c_float),
        POINTER(c_float),
        c_int32,
        c_int32,
        POINTER(c_double),
    ],
    c_int32,
)
def strata_cuda_mirror_expert(
    gate_type: int,
    gate: Any,
    up_type: int,
    up: Any,
    down_type: int,
    down: Any,
    D: int,
    F: int,
    n_experts: int,
    x: Any,
    out: Any,
    n_threads: int,
    reps: int,
    median_us: Any,
) -> int: ...


# STRATA_API strata_status strata_cuda_mirror_swiglu(float *g, const float *u, int64_t n);
@c_function("strata_cuda_mirror_swiglu", [POINTER(c_float), POINTER(c_float), c_int64], c_int32)
def strata_cuda_mirror_swiglu(g: Any, u: Any, n: int) -> int: ...


# STRATA_API strata_status strata_cuda_flash_attention(int32_t kv_type, const float *q, const float *k,
#                                                      const float *v, int32_t n_pos, int32_t T, int32_t H,
#                                                      int32_t Hkv, int32_t hd, int32_t pos_on_device, float *out);
@c_function(
    "strata_cuda_flash_attention",
    _ATTENTION_ARGS,
    c_int32,
)
def strata_cuda_flash_attention(
    kv_type: int,
    q: Any,
    k: Any,
    v: Any,
    n_pos: int,
    T: int,
    H: int,
    Hkv: int,
    hd: int,
    pos_on_device: int,
    out: Any,
) -> int: ...
