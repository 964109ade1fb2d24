/*
 * strata_kernels.h — the kernel-level surface of libstrata, for tests and benchmarks.
 *
 * This is not the engine's contract (that is strata.h, which this header includes): it is what the
 * test suite calls to check each kernel against an independent NumPy reference through ctypes, and what
 * the benchmarks call to time one kernel on its own. The functions work on host buffers, outside any
 * engine: the CPU kernels run at the level strata_simd_set chose for this process, the CUDA kernels on
 * device 0 (DEVICE when there is none), the host's bit-exact mirrors of the CUDA kernels everywhere.
 * An application drives an engine through strata.h instead. These functions are exported from
 * libstrata.so as the engine's are (STRATA_API) and, like them, never exit: every failure is a
 * strata_status.
 */
#ifndef STRATA_KERNELS_H
#define STRATA_KERNELS_H

#include <stdint.h>

#include "strata.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- CPU kernels ------------------------------------------------------------------------------- */

/* Bytes of a row of n values of type; -1 when n is not a multiple of the type's block or type unknown. */
STRATA_API int64_t strata_type_row_bytes(int32_t type, int64_t n);
/* Name of a type ("Q4_K"), or NULL. */
STRATA_API const char *strata_type_name(int32_t type);
/* Dequantize n values (a whole number of blocks). */
STRATA_API strata_status strata_dequantize(int32_t type, const void *src, float *dst, int64_t n);
/* y[rows] = W[rows, cols] x[cols] with the engine's CPU kernels (activations quantized as the engine does). */
STRATA_API strata_status strata_matvec(int32_t type, const void *w, int64_t rows, int64_t cols,
                                       const float *x, float *y, int32_t n_threads);
/* Y[n, rows] = X[n, cols] W^T with the engine's CPU kernels for prompt chunks. */
STRATA_API strata_status strata_matmul(int32_t type, const void *w, int64_t rows, int64_t cols,
                                       const float *x, int64_t n, float *y, int32_t n_threads);
/* Kernel level used by strata_dequantize/matvec/matmul in this process; returns the level in use. */
STRATA_API int32_t strata_simd_set(int32_t simd);

/* ---- CUDA kernels and their host mirrors ------------------------------------------------------- */

/* y[n, rows] = X[n, cols] W^T with the CUDA matrix-vector kernel (host buffers in and out; the weights
 * are copied to the device on each call). DEVICE when there is no CUDA device. */
STRATA_API strata_status strata_cuda_matvec(int32_t type, const void *w, int64_t rows, int64_t cols,
                                            const float *x, int64_t n, float *y);
/* The host's bit-exact mirror of that kernel for one token (runs everywhere). */
STRATA_API strata_status strata_cuda_mirror_matvec(int32_t type, const void *w, int64_t rows, int64_t cols,
                                                   const float *x, float *y);
/* Time the device kernel: median microseconds of `reps` runs of y = W x over n tokens, with the
 * weights resident on the device. */
STRATA_API strata_status strata_cuda_bench_matvec(int32_t type, const void *w, int64_t rows, int64_t cols,
                                                  int64_t n, int32_t reps, double *median_us);
/* The device router on host buffers: logits [T, E] -> ids [T, K] (greater logit first, lower id on a
 * tie) and weights [T, K] (softmax over the chosen K). With_segments 1 runs the decode variant that
 * also writes segment tables (same ids and weights). DEVICE when there is no CUDA device. */
STRATA_API strata_status strata_cuda_router_topk(const float *logits, int32_t T, int32_t E, int32_t K, int32_t *ids,
                                                 float *weights, int32_t with_segments);
/* The device attention on host buffers: k, v [n_pos, Hkv*hd] f32 are stored into a KV cache of kv_type
 * (STRATA_KV_*), then the T queries q [T, H*hd] at positions n_pos-T .. n_pos-1 attend over it into
 * out [T, H*hd]. pos_on_device 1 passes the position through device memory (as a CUDA Graph does).
 * DEVICE when there is no CUDA device. */
STRATA_API strata_status strata_cuda_attention(int32_t kv_type, const float *q, const float *k, const float *v,
                                               int32_t n_pos, int32_t T, int32_t H, int32_t Hkv, int32_t hd,
                                               int32_t pos_on_device, float *out);
/* The prompt-chunk product on the tensor cores (any quantized weight type). w holds n_mat matrices of
 * [rows, cols] back to back. mat == NULL: y[n_x, rows] = X W[0]^T (dense). Otherwise pair p < n_pairs
 * with mat[p] >= 0 gives y[p, :] = W[mat[p]] x[p / xdiv] (y rows of pairs with mat[p] < 0 are left
 * as they are); pairs are grouped by matrix in order of p into segments of at most seg_tokens (1..64)
 * tokens, as the engine groups a prompt chunk's tokens by expert. DEVICE without a CUDA device. */
STRATA_API strata_status strata_cuda_mmq(int32_t type, const void *w, int32_t n_mat, int64_t rows, int64_t cols,
                                         const float *x, int64_t n_x, const int32_t *mat, int64_t n_pairs,
                                         int32_t xdiv, int32_t seg_tokens, float *y);
/* The host's bit-exact mirror of that product for one token (runs everywhere). */
STRATA_API strata_status strata_cuda_mirror_mmq(int32_t type, const void *w, int64_t rows, int64_t cols,
                                                const float *x, float *y);
/* Decode misses on the host, as --miss host runs them: for each of n_experts experts k,
 * out[k, :D] = down_k(swiglu(gate_k x, up_k x)) with the device's bits, at the kernel level of
 * strata_simd_set, rows split over n_threads threads. gate and up hold n_experts matrices [F, D] of
 * their types back to back, down n_experts matrices [D, F]; D and F whole blocks of the types. It runs
 * reps times (>= 1); *median_us (may be NULL) gets the median microseconds of one run (runs everywhere). */
STRATA_API strata_status strata_cuda_mirror_expert(int32_t gate_type, const void *gate, int32_t up_type,
                                                   const void *up, int32_t down_type, const void *down, int64_t D,
                                                   int64_t F, int32_t n_experts, const float *x, float *out,
                                                   int32_t n_threads, int32_t reps, double *median_us);
/* g[i] = silu(g[i]) * u[i] over n values with the device's bits (its own e^x), at the kernel level of
 * strata_simd_set: the host mirror's SwiGLU between an expert's gate/up and down (runs everywhere). */
STRATA_API strata_status strata_cuda_mirror_swiglu(float *g, const float *u, int64_t n);

/* The prompt-chunk attention on the tensor cores, on host buffers, as strata_cuda_attention: k, v [n_pos,
 * Hkv*hd] f32 are stored into a cache of kv_type whose rows after n_pos hold NaNs (which must not be
 * read), then the T queries q [T, H*hd] at positions n_pos-T .. n_pos-1 attend over it into out [T, H*hd].
 * UNSUPPORTED for what the kernel does not cover (it runs an f16 cache with head dim 32, 64 or 128);
 * DEVICE when there is no CUDA device. */
STRATA_API strata_status strata_cuda_flash_attention(int32_t kv_type, const float *q, const float *k, const float *v,
                                                     int32_t n_pos, int32_t T, int32_t H, int32_t Hkv, int32_t hd,
                                                     int32_t pos_on_device, float *out);

#ifdef __cplusplus
}
#endif

#endif /* STRATA_KERNELS_H */
