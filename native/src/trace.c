/*
 * trace.c — trace lines, and the one place where the engine reads environment variables.
 *
 * Environment variables read by libstrata (nowhere else):
 *
 *   STRATA_TRACE   "1" (or any value but "" and "0"): write one line per start-up step, the plan,
 *                  and per request the loan, refill and any chunk halving to stderr, each line
 *                  prefixed "strata: ". A trace function in strata_params receives the same lines
 *                  instead, whatever this variable says.
 *
 *   STRATA_CUDA_DECODE  "host": on --device cuda with every expert resident, bring the router's choices
 *                  to the host every layer as with a partial cache, instead of routing on the device
 *                  (the replies are the same; for comparing the two paths). "unfused": decode
 *                  without its fused launches (norm + quantization, q/k/v in one product, an
 *                  expert's gate + up + SwiGLU, down + weighted sum): the separate kernels, the same
 *                  replies. Read when the device cache is filled.
 *
 *   STRATA_CUDA_GRAPH   "0": on --device cuda, run the decode step launch by launch instead of capturing
 *                  it once as a CUDA Graph (same replies; for comparison and as a way around a driver
 *                  that refuses the capture). Read when the device cache is filled.
 *
 *   STRATA_CUDA_STAGING "0": on --device cuda, copy experts into device slots straight from the mapped
 *                  file (pageable copies) instead of through the ring of pinned staging buffers.
 *                  Read when the device cache is made.
 *
 *   STRATA_CUDA_MMQ "0": on --device cuda, run prompt chunks' Q8_0 / Q4_0 / Q4_K / Q6_K products with the
 *                  matrix-vector kernel (8 tokens per weight read) instead of the grouped tensor-core
 *                  product (cuda/mmq.cu). Any other value, or unset: the tensor-core product.
 *
 *   STRATA_CUDA_FAST "0": on --device cuda, use the first decode kernels (RMSNorm, router top-k, the
 *                  one-token products, attention) instead of their latency-tuned versions, which give
 *                  the same bits with more loads in flight. Read when the device cache is filled.
 *
 *   STRATA_CUDA_PDL "0": on --device cuda, launch decode kernels plainly instead of with programmatic
 *                  dependent launch (each may start, and load its weights, while the one before it
 *                  finishes). Same replies. Read when the device cache is filled.
 *
 *   STRATA_CUDA_FUSE "0": on --device cuda, decode without the second round of fused launches (the
 *                  ffn norm inside an F32 router product, which also quantizes the normed token for
 *                  the experts; q/k norm, RoPE and the KV-cache store in one launch; attention writing
 *                  the 8-bit row for the output projection). Same replies. Read when the device cache
 *                  is filled.
 *
 * STRATA_TRACE and the STRATA_CUDA_* switches of the decode path are read when an engine is opened, not
 * per line; STRATA_CUDA_MMQ at the first prompt.
 */
#include "trace.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void trace_init(trace_sink *t, strata_trace_fn fn, void *user) {
    t->fn = fn;
    t->user = user;
    if (fn) {
        t->enabled = 1;
        return;
    }
    const char *v = getenv("STRATA_TRACE");
    t->enabled = v && v[0] && strcmp(v, "0") != 0;
}

void trace_emit(const trace_sink *t, const char *fmt, ...) {
    if (!t || !t->enabled) return;
    char line[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    if (t->fn) t->fn(t->user, line);
    else fprintf(stderr, "strata: %s\n", line);
}

int env_cuda_device_routing(void) {
    const char *v = getenv("STRATA_CUDA_DECODE");
    return !(v && strcmp(v, "host") == 0);
}

int env_cuda_graph(void) {
    const char *v = getenv("STRATA_CUDA_GRAPH");
    return !(v && strcmp(v, "0") == 0);
}

int env_cuda_fused(void) {
    const char *v = getenv("STRATA_CUDA_DECODE");
    return !(v && strcmp(v, "unfused") == 0);
}

int env_cuda_staging(void) {
    const char *v = getenv("STRATA_CUDA_STAGING");
    return !(v && strcmp(v, "0") == 0);
}

int trace_env_cuda_mmq(void) {
    const char *v = getenv("STRATA_CUDA_MMQ");
    return !(v && strcmp(v, "0") == 0);
}

int env_cuda_fast(void) {
    const char *v = getenv("STRATA_CUDA_FAST");
    return !(v && strcmp(v, "0") == 0);
}

int env_cuda_pdl(void) {
    const char *v = getenv("STRATA_CUDA_PDL");
    return !(v && strcmp(v, "0") == 0);
}

int env_cuda_fuse2(void) {
    const char *v = getenv("STRATA_CUDA_FUSE");
    return !(v && strcmp(v, "0") == 0);
}
