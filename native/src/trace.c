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
 *   STRATA_SIMD    "scalar", "avx2" or "avx512": the highest kernel level --simd auto (and the kernel entry
 *                  points' auto) may pick, so that a whole test suite runs on the kernels a CPU without
 *                  AVX-512 (or without AVX2) would use; a level the CPU lacks changes nothing. An
 *                  explicit --simd is used as given. Read whenever auto is resolved.
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
 *   STRATA_CUDA_STORE  where --device cuda copies missed experts from. "arena" (default): every routed
 *                  expert is copied once at open into pinned host memory (about 10 s for 29 GiB on the
 *                  H200's host), and each copy is one DMA at full PCIe speed with no host work. "ring": the
 *                  pool copies each expert from the mapped file into one of a few pinned staging buffers,
 *                  then one DMA (or pageable copies with STRATA_CUDA_STAGING=0). "register": the mapped file
 *                  is page-locked for the device (read-only) and experts are DMA'd straight from it (slow
 *                  to open for a large file). arena and register are used only when the store fits in the
 *                  host RAM the plan may use and not every expert is resident; if either fails the ring is
 *                  used; the trace says which store is in use and what it cost at open. Read when the
 *                  device cache is made.
 *
 *   STRATA_CUDA_OVERLAP "0": on --device cuda, copy missed experts on the compute stream and run a layer's
 *                  hits and misses together after every copy (same replies). Unset or any other value:
 *                  copies run on their own stream, ordered by events, and a layer's hits run as their own
 *                  launch while its misses are copied. Read when the device cache is made.
 *
 *   STRATA_CUDA_MISS_SPLIT  under --miss auto on --device cuda, the share of a decode step's misses run on the
 *                  host, from 0 to 1 ("0": copy them all, "1": run them all on the host), instead of the
 *                  share computed from the measured copy and host rates. Read when the device cache is made.
 *
 *   STRATA_CUDA_MMQ "0": on --device cuda, run prompt chunks' Q8_0 / Q4_0 / Q4_K / Q6_K products with the
 *                  matrix-vector kernel (8 tokens per weight read) instead of the grouped tensor-core
 *                  product (cuda/mmq.cu). Any other value, or unset: the tensor-core product.
 *
 *   STRATA_CUDA_FAST "0": on --device cuda, use the first decode kernels (RMSNorm, router top-k, the
 *                  one-token products, attention) instead of their latency-tuned versions, which give
 *                  the same bits with more loads in flight (attention beyond 256 positions: see
 *                  STRATA_CUDA_ATT_SPLIT). A number keeps the families of its bits: 1 RMSNorm, 2 router
 *                  top-k, 4 one-token products, 8 experts' gate/up, 16 experts' down, 32 attention
 *                  (unset: 63, all). Read when the device cache is filled.
 *
 *   STRATA_CUDA_PDL "0": on --device cuda, launch decode kernels plainly instead of with programmatic
 *                  dependent launch (each may start, and load its weights, while the one before it
 *                  finishes; only sm_90 code on an sm_90 or newer card has it, see cuda/arch.cuh). Same
 *                  replies. Read when the device cache is filled.
 *
 *   STRATA_CUDA_FUSE "0": on --device cuda, decode without the second round of fused launches (the
 *                  ffn norm inside an F32 router product, which also quantizes the normed token for
 *                  the experts; q/k norm, RoPE and the KV-cache store in one launch; attention writing
 *                  the 8-bit row for the output projection; the experts' hidden state quantized inside
 *                  the down product; with every expert resident, the router's top-k in the same launch
 *                  as its product). Same replies. A number keeps the fusions of its bits: 1 router and
 *                  norm, 2 RoPE + store, 4 attention's 8-bit row, 8 down, 16 router top-k (unset: 31,
 *                  all). Read when the device cache is filled.
 *
 *   STRATA_CUDA_ATT_SPLIT "0": on --device cuda, decode attention beyond 256 positions in one block per
 *                  head (the prompt kernel's order) instead of split over several blocks per head
 *                  merged in a fixed order. The replies then differ in the last bits beyond 256 positions.
 *                  Read when the device cache is filled.
 *
 *   STRATA_CUDA_FLASH "0": on --device cuda, run prompt chunks' attention with the decode kernel
 *                  (cuda/attention.cu, one query per block) instead of the tensor-core kernel
 *                  (cuda/flash_attn.cu, f16 or int8 KV with head dim 32, 64 or 128; other head dims
 *                  always take the decode kernel). Any other value, or unset: the tensor-core kernel. Read at the first
 *                  prompt.
 *
 *   STRATA_CUDA_PORTABLE "1": on --device cuda, run every kernel in the form a card without sm_80 and
 *                  sm_90 features takes (cuda/arch.cuh): plain copies instead of cp.async, four mma
 *                  m8n8k16 per integer m16n8k32, one flash attention stage, no programmatic launches.
 *                  Same replies (how a Turing card's path is tested on a newer one; the driver's
 *                  CUDA_FORCE_PTX_JIT=1 runs the compute_75 PTX, sm_75's code, as well). Read when a
 *                  CUDA context is made.
 *
 * STRATA_TRACE and the STRATA_CUDA_* switches of the decode path are read when an engine is opened, not
 * per line; STRATA_CUDA_MMQ and STRATA_CUDA_FLASH at the first prompt.
 */
#include "trace.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

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

/* Whether the variable `name` is set to `value` (most switches below are on unless set to their off word). */
static int env_is(const char *name, const char *value) {
    const char *v = getenv(name);
    return v && strcmp(v, value) == 0;
}

int env_cuda_device_routing(void) { return !env_is("STRATA_CUDA_DECODE", "host"); }

int env_cuda_graph(void) { return !env_is("STRATA_CUDA_GRAPH", "0"); }

int env_cuda_fused(void) { return !env_is("STRATA_CUDA_DECODE", "unfused"); }

int env_cuda_staging(void) { return !env_is("STRATA_CUDA_STAGING", "0"); }

int trace_env_cuda_mmq(void) { return !env_is("STRATA_CUDA_MMQ", "0"); }

/* unset: all = 63; else a number (0 = none) */
static int env_mask(const char *name, int all) {
    const char *v = getenv(name);
    if (!v || !v[0]) return all;
    return (int)strtol(v, NULL, 0) & all;
}

int env_cuda_fast(void) { return env_mask("STRATA_CUDA_FAST", 63); }

int env_cuda_pdl(void) { return !env_is("STRATA_CUDA_PDL", "0"); }

int env_cuda_fuse2(void) { return env_mask("STRATA_CUDA_FUSE", 31); }

int env_cuda_att_split(void) { return !env_is("STRATA_CUDA_ATT_SPLIT", "0"); }

int env_cuda_store(void) {
    if (env_is("STRATA_CUDA_STORE", "register")) return 1;
    if (env_is("STRATA_CUDA_STORE", "ring")) return 0;
    return 2;
}

int env_cuda_overlap(void) { return !env_is("STRATA_CUDA_OVERLAP", "0"); }

double env_cuda_miss_split(void) {
    const char *v = getenv("STRATA_CUDA_MISS_SPLIT");
    if (!v || !v[0]) return -1.0;
    char *end = NULL;
    const double x = strtod(v, &end);
    return end && *end == '\0' && x >= 0.0 && x <= 1.0 ? x : -1.0;
}

int env_cuda_portable(void) { return env_is("STRATA_CUDA_PORTABLE", "1"); }

int trace_env_cuda_flash(void) { return !env_is("STRATA_CUDA_FLASH", "0"); }

/* Monotonic wall time in milliseconds (traces, timings). */
double engine_now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec * 1e-6;
}

int32_t env_simd_cap(void) {
    const char *v = getenv("STRATA_SIMD");
    if (!v) return -1;
    if (strcmp(v, "scalar") == 0) return STRATA_SIMD_SCALAR;
    if (strcmp(v, "avx2") == 0) return STRATA_SIMD_AVX2;
    if (strcmp(v, "avx512") == 0) return STRATA_SIMD_AVX512;
    return -1;
}
