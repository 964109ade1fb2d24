/*
 * trace.h — the engine's trace lines (STRATA_TRACE=1, or a sink given in strata_params).
 */
#ifndef STRATA_TRACE_H
#define STRATA_TRACE_H

#include "strata.h"

typedef struct trace_sink {
    strata_trace_fn fn; /* NULL = stderr */
    void *user;
    int enabled; /* a sink was given, or STRATA_TRACE is set */
} trace_sink;

/* A sink from the params' trace hook, falling back to the environment (see trace.c). */
void trace_init(trace_sink *t, strata_trace_fn fn, void *user);
/* Emit one line (printf format, no newline) when enabled. */
void trace_emit(const trace_sink *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* 0 when STRATA_CUDA_DECODE=host asks the CUDA backend to route decode steps on the host (trace.c). */
int env_cuda_device_routing(void);
/* 0 when STRATA_CUDA_GRAPH=0 asks the CUDA backend not to capture the decode step as a graph. */
int env_cuda_graph(void);
/* 0 when STRATA_CUDA_DECODE=unfused asks for decode without its fused launches. */
int env_cuda_fused(void);
/* 0 when STRATA_CUDA_STAGING=0 asks for expert copies straight from the mapped file. */
int env_cuda_staging(void);
/* STRATA_CUDA_STORE: 0 the staging ring (default), 1 "register" (the mapped file page-locked), 2 "arena". */
int env_cuda_store(void);
/* 0 when STRATA_CUDA_OVERLAP=0 asks for expert copies on the compute stream (no overlap with products). */
int env_cuda_overlap(void);
/* STRATA_CUDA_MISS_SPLIT in [0, 1]: the host's share of decode misses under --miss auto; -1 when unset. */
double env_cuda_miss_split(void);
/* 0 when STRATA_CUDA_MMQ=0 asks for the matrix-vector kernel in prompt chunks, else 1 (see trace.c). */
int trace_env_cuda_mmq(void);
/* STRATA_CUDA_FAST: the mask of latency-tuned decode kernel families (CUDA_FAST_*; unset: all, 63). */
int env_cuda_fast(void);
/* 0 when STRATA_CUDA_PDL=0 asks for decode kernels without programmatic dependent launch. */
int env_cuda_pdl(void);
/* STRATA_CUDA_FUSE: the mask of the second round of decode fusions (unset: all, 31; trace.c). */
int env_cuda_fuse2(void);
/* 0 when STRATA_CUDA_ATT_SPLIT=0 asks for decode attention in one block per head (trace.c). */
int env_cuda_att_split(void);
/* 0 when STRATA_CUDA_FLASH=0 asks for the decode attention kernel in prompt chunks, else 1 (see trace.c). */
int trace_env_cuda_flash(void);
/* 1 when STRATA_CUDA_PORTABLE=1 asks the CUDA kernels for their portable forms on every card (trace.c). */
int env_cuda_portable(void);

/* Monotonic wall time in milliseconds (traces and timings). */
double engine_now_ms(void);

/* STRATA_SIMD: the highest level --simd auto may pick (STRATA_SIMD_*), or -1 when unset or unknown. */
int32_t env_simd_cap(void);

#endif
