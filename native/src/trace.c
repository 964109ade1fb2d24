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
 *   STRATA_CUDA_REGISTER "0": on --device cuda, do not page-lock the mapped model file; expert copies go
 *                  through the staging ring (above) instead of straight from the mapping. Unset or any
 *                  other value: the file is registered with the device (read-only) when the device
 *                  supports it and the file fits in RAM, else the ring is used (the trace says which).
 *                  Read when the device cache is made.
 *
 *   STRATA_CUDA_OVERLAP "0": on --device cuda, copy missed experts on the compute stream and run a layer's
 *                  hits and misses together after every copy, as before the copy stream (same replies).
 *                  Unset or any other value: copies run on their own stream; the hits' products start
 *                  while the misses are copied, and a prompt's misses are copied in groups, each group's
 *                  products running under the next group's copies. Read when the device cache is made.
 *
 *   STRATA_CUDA_MISS_SPLIT  under --miss auto on --device cuda, the share of a decode step's misses run on the
 *                  host, from 0 to 1 ("0": copy them all, "1": run them all on the host), instead of the
 *                  share computed from the measured copy and host rates. Read when the device cache is made.
 *
 *   STRATA_CUDA_MMQ "0": on --device cuda, run prompt chunks' Q8_0 / Q4_0 / Q4_K / Q6_K products with the
 *                  matrix-vector kernel (8 tokens per weight read) instead of the grouped tensor-core
 *                  product (cuda/mmq.cu). Any other value, or unset: the tensor-core product.
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

int env_cuda_register(void) {
    const char *v = getenv("STRATA_CUDA_REGISTER");
    return !(v && strcmp(v, "0") == 0);
}

int env_cuda_overlap(void) {
    const char *v = getenv("STRATA_CUDA_OVERLAP");
    return !(v && strcmp(v, "0") == 0);
}

double env_cuda_miss_split(void) {
    const char *v = getenv("STRATA_CUDA_MISS_SPLIT");
    if (!v || !v[0]) return -1.0;
    char *end = NULL;
    const double x = strtod(v, &end);
    return end && *end == '\0' && x >= 0.0 && x <= 1.0 ? x : -1.0;
}
