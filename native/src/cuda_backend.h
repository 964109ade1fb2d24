/*
 * cuda_backend.h — the CUDA backend as the C side of the engine sees it.
 *
 * Legend: T tokens, D model dim, F expert ffn dim, E experts, K experts used per token,
 *         H query heads, Hkv key/value heads, hd head dim.
 *
 * Every function returns a strata_status; on failure the context's message (cuda_ctx_error) says
 * which call failed and why, in words (CUDA's own error string plus what strata was doing). Nothing
 * here exits. When the library is built without CUDA, every function returns STRATA_ERR_DEVICE with
 * "this build of strata has no CUDA backend" (cuda_stub.c), so callers need no #ifdefs.
 *
 * Numerics: the matrix-vector kernels compute each output as a fixed sequence of IEEE float
 * operations (no fused multiply-add; the reduction order depends on the row length only), so that
 * (a) a token's result does not depend on how many tokens are processed together, and (b) the host
 * can reproduce a device result bit for bit (cuda_mirror_matvec), which is what makes a decode miss
 * run on the host give the same reply as a miss copied to the device.
 */
#ifndef STRATA_CUDA_BACKEND_H
#define STRATA_CUDA_BACKEND_H

#include <stddef.h>
#include <stdint.h>

#include "strata.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct cuda_ctx cuda_ctx;

/* streams of a context */
enum { CUDA_STREAM_COMPUTE = 0, CUDA_STREAM_COPY = 1 };

/* 1 when built with CUDA and device 0 (the one the engine uses) is usable: Turing (compute 7.5) or newer. */
int32_t cuda_device_present(void);
strata_status cuda_ctx_create(int32_t device, cuda_ctx **out, char *err, size_t err_len);
void cuda_ctx_destroy(cuda_ctx *ctx);
/* Make the context's device the current one of this thread (the calls below run on the current device: an
 * engine whose layers are split over several cards switches between them). */
strata_status cuda_ctx_use(cuda_ctx *ctx);
const char *cuda_ctx_error(const cuda_ctx *ctx);
/* Decode options of a context (a new one has fast = CUDA_FAST_ALL, pdl = 0): fast, a mask of the
 * CUDA_FAST_* below, picks latency-tuned kernels (the same bits as the plain ones); pdl launches the
 * decode kernels with programmatic dependent launch (each may start while the one before it finishes)
 * where the card and the loaded code have it (sm_90 and newer, not STRATA_CUDA_PORTABLE=1), else plainly. */
void cuda_ctx_set_decode(cuda_ctx *ctx, int32_t fast, int32_t pdl);
enum {
    CUDA_FAST_NORM = 1,       /* RMSNorm */
    CUDA_FAST_ROUTER = 2,     /* router top-k */
    CUDA_FAST_MATVEC3 = 4,    /* one-token products (q/k/v, Wo, the output head) */
    CUDA_FAST_GATE_UP = 8,    /* the experts' gate, up and SwiGLU */
    CUDA_FAST_DOWN = 16,      /* the experts' down and weighted sum */
    CUDA_FAST_ATTENTION = 32, /* decode attention (cuda_attention_decode, used by the engine) */
    CUDA_FAST_ALL = 63
};
/* name of the device, e.g. "NVIDIA H200" */
const char *cuda_ctx_device_name(const cuda_ctx *ctx);
/* The device, the architecture its loaded kernels were compiled for and the paths they take (cp.async,
 * integer MMA form, programmatic launches, shared memory; cuda/arch.cuh), in words, for the trace. */
const char *cuda_ctx_code_path(const cuda_ctx *ctx);
strata_status cuda_mem_info(cuda_ctx *ctx, int64_t *free_bytes, int64_t *total_bytes);

strata_status cuda_alloc(cuda_ctx *ctx, size_t bytes, void **dptr, const char *what);
void cuda_free(cuda_ctx *ctx, void *dptr);
/* Device memory held through cuda_alloc now, and the most held since the context was created. */
void cuda_mem_held(const cuda_ctx *ctx, int64_t *now, int64_t *peak);
/* Page-lock host memory (e.g. the mapped model file) as read-only for the device, so that copies from
 * it run at full PCIe speed without a staging copy. Fails (a status and a message, the context still
 * usable) when the device cannot register read-only memory or the pages cannot be locked. */
strata_status cuda_host_register(cuda_ctx *ctx, void *ptr, size_t bytes);
void cuda_host_unregister(cuda_ctx *ctx, void *ptr);
strata_status cuda_host_alloc(cuda_ctx *ctx, size_t bytes, void **ptr);
void cuda_host_free(cuda_ctx *ctx, void *ptr);

/* Asynchronous copies on a stream (CUDA_STREAM_*). */
strata_status cuda_h2d(cuda_ctx *ctx, void *dst, const void *src, size_t bytes, int32_t stream);
strata_status cuda_d2h(cuda_ctx *ctx, void *dst, const void *src, size_t bytes, int32_t stream);
strata_status cuda_d2d(cuda_ctx *ctx, void *dst, const void *src, size_t bytes, int32_t stream);
strata_status cuda_memset(cuda_ctx *ctx, void *dst, int value, size_t bytes);
/* An event recorded on `from` that `to` waits for (copies overlapping compute). */
strata_status cuda_stream_order(cuda_ctx *ctx, int32_t from, int32_t to);
strata_status cuda_sync(cuda_ctx *ctx);
/* The host waits for one stream's work (CUDA_STREAM_COMPUTE or CUDA_STREAM_COPY). */
strata_status cuda_stream_sync(cuda_ctx *ctx, int32_t stream);

/* Events (opaque): recorded on a stream; the host waits for one with cuda_event_wait (an event never
 * recorded counts as done). */
strata_status cuda_event_create(cuda_ctx *ctx, void **ev);
strata_status cuda_event_record(cuda_ctx *ctx, void *ev, int32_t stream);
strata_status cuda_event_wait(cuda_ctx *ctx, void *ev);
/* *done = 1 when the event's last record has passed (the host does not wait). */
strata_status cuda_event_done(cuda_ctx *ctx, void *ev, int32_t *done);
/* Work enqueued on `stream` after this call waits until the event's last record has passed (the host
 * does not wait). */
strata_status cuda_stream_wait(cuda_ctx *ctx, void *ev, int32_t stream);
void cuda_event_free(void *ev);

/* CUDA Graphs: record what is enqueued on the compute stream between begin and end (nothing runs),
 * then replay it with one launch. A failed capture returns an error and leaves the stream usable. */
strata_status cuda_capture_begin(cuda_ctx *ctx);
/* End the capture; on success *exec is the instantiated graph (cuda_graph_free frees it). */
strata_status cuda_capture_end(cuda_ctx *ctx, void **exec);
strata_status cuda_graph_launch(cuda_ctx *ctx, void *exec);
void cuda_graph_free(void *exec);

/* ---- kernels (all on the compute stream) ---------------------------------------------------- */

/* Types the device kernels run: those of GQ_DEVICE_TYPES (group_dequant.h), every weight type the CPU runs. */
int32_t cuda_type_supported(int32_t type);

/* The activations a weight type is multiplied with: Q8_0 (8-bit blocks of 32, the host engine's
 * rounding) for Q8_0 and Q4_0 weights, F32 for the others. A quantized activation row of cols values is
 * cols int8 values followed by cols / 32 float scales (cuda_act_row_bytes). */
int32_t cuda_act_type(int32_t type);
int64_t cuda_act_row_bytes(int32_t type, int64_t cols);
/* q[t] = x[t] quantized for weights of `type` (only when cuda_act_type(type) is not F32).
 * x_stride in floats, q_stride in bytes. */
strata_status cuda_quantize_act(cuda_ctx *ctx, int32_t type, const float *x, int64_t x_stride, void *q,
                                int64_t q_stride, int64_t cols, int32_t T);

/* y[t, r] = sum_c W[r, c] * x[t, c] for t < T.  W: [rows, cols] in `type`, row stride = row bytes.
 * x: [T, x_stride] activations of cuda_act_type(type) (stride in floats for F32, in bytes for
 * quantized rows; float rows 16-byte aligned), y: [T, y_stride] f32. accumulate: y += instead of y =. */
strata_status cuda_matvec(cuda_ctx *ctx, int32_t type, const void *w, int64_t rows, int64_t cols,
                          const void *x, int64_t x_stride, float *y, int64_t y_stride, int32_t T,
                          int32_t accumulate);

/* Tokens per segment of cuda_matvec_segments (prefill groups). */
#define CUDA_SEG_TOKENS 8

/* Expert matvec over segments: segment s has its own weights w_ptrs[s] (device pointer to a [rows, cols]
 * matrix) and seg_tokens (1 or CUDA_SEG_TOKENS) token slots: for slot j = s*seg_tokens + t with
 * tok[j] >= 0, y[out_rows[j], r] = W_s[r, :] . x[tok[j], :].  Decode: one segment per selected expert;
 * prefill: the tokens routed to an expert, CUDA_SEG_TOKENS at a time, so its weights are read and
 * dequantized once per segment. w_ptrs, tok, out_rows are device arrays. */
strata_status cuda_matvec_segments(cuda_ctx *ctx, int32_t type, const void *const *w_ptrs, int64_t rows,
                                   int64_t cols, const void *x, int64_t x_stride, const int32_t *tok,
                                   const int32_t *out_rows, float *y, int64_t y_stride, int32_t n_segments,
                                   int32_t seg_tokens);

/* Decode: y[i] (+)= W_i x for up to three matrices of one type and width cols (w[i] NULL: none), rows[i]
 * rows each, one token x of cuda_act_type(type); one launch, the same bits as cuda_matvec with T = 1. */
strata_status cuda_matvec3(cuda_ctx *ctx, int32_t type, const void *const w[3], const int64_t rows[3], int64_t cols,
                           const void *x, float *const y[3], int32_t accumulate);
/* Decode, one token and its K experts (weights wg[k], wu[k] of one type, [F, D] each):
 * h[k, :] = swiglu(Wg_k x, Wu_k x), h: [K, F]; x: one row of cuda_act_type(type). The same bits as two
 * cuda_matvec_segments calls (one token per segment) followed by cuda_swiglu. */
strata_status cuda_expert_gate_up(cuda_ctx *ctx, int32_t type, const void *const *wg, const void *const *wu,
                                  int64_t F, int64_t D, const void *x, float *h, int32_t K);
/* Decode: y[:] += sum_k weights[k] * (Wd_k h_k) in k order, Wd_k = wd[k] [D, F]; h: K rows of
 * cuda_act_type(type), stride h_stride (floats for F32 rows, bytes for quantized rows); K <= 32. The same
 * bits as cuda_matvec_segments followed by cuda_moe_combine. */
strata_status cuda_expert_down_combine(cuda_ctx *ctx, int32_t type, const void *const *wd, int64_t D, int64_t F,
                                       const void *h, int64_t h_stride, const float *weights, float *y, int32_t K);
/* cuda_quantize_act of h (K rows of F floats, stride h_stride floats, a multiple of 4) followed by
 * cuda_expert_down_combine, in one launch with the same bits; for weights with 8-bit activations (Q8_0,
 * Q4_0; else STRATA_ERR_INVALID_ARGUMENT). */
strata_status cuda_expert_down_combine_hq(cuda_ctx *ctx, int32_t type, const void *const *wd, int64_t D, int64_t F,
                                          const float *h, int64_t h_stride, const float *weights, float *y, int32_t K);
/* Decode, one token, F32 weights W [rows, D] (the router): xn = rmsnorm(x) * nw (cuda_rmsnorm's bits),
 * q = xn quantized as cuda_quantize_act does for Q8_0 (skipped when q is NULL), y = W xn (cuda_matvec3's
 * bits), in one launch. D a multiple of 32, at most 4096 (else STRATA_ERR_INVALID_ARGUMENT). */
strata_status cuda_norm_matvec_f32(cuda_ctx *ctx, const float *x, const float *nw, float *xn, void *q, const float *w,
                                  int64_t rows, int32_t D, float eps, float *y);
/* Decode, one token, every expert resident: cuda_norm_matvec_f32 (logits [E]) followed by
 * cuda_router_topk_segments for T = 1, in one launch (the last of its blocks to finish routes), the same
 * bits. cnt: a device int at 0 (left at 0). E <= 256, K <= 32, D as for cuda_norm_matvec_f32. */
strata_status cuda_norm_router_topk_f32(cuda_ctx *ctx, const float *x, const float *nw, float *xn, void *q,
                                        const float *w, int32_t E, int32_t D, float eps, float *logits, int32_t K,
                                        int32_t *ids, float *weights, const void *const *table, const void **seg_w,
                                        int32_t seg_cap, int32_t *seg_tok, int32_t *seg_out, int64_t seg_half,
                                        int32_t *cnt);
/* Decode: cuda_qk_norm_rope followed by cuda_kv_store (of the rotated k and of v) in one launch, the same
 * bits; head dims 32, 64, 128 or 256 (else STRATA_ERR_UNSUPPORTED). */
strata_status cuda_qk_norm_rope_store(cuda_ctx *ctx, float *q, float *k, const float *v, const float *q_norm,
                                      const float *k_norm, int32_t T, int32_t H, int32_t Hkv, int32_t hd, int32_t pos0,
                                      float theta, float eps, const int32_t *pos_dev, int32_t kv_type, void *k_cache,
                                      void *v_cache);
/* ---- prompt products on the tensor cores (mmq.cu) ------------------------------------------------
 * For quantized weights (Q8_0, Q4_0, Q4_K, Q6_K in mmq.cu, the others in mmq_types.cu) against activations
 * quantized to 8-bit blocks of 32 (cuda_quantize_act
 * with type Q8_0, whatever the weights' type). Every output is acc = 0; for each block g in order:
 * acc = acc + (dw * dx) * (exact integer dot of the block) (Q4_K: minus (dmin * m * dx) * (sum of the
 * block's activations); Q6_K: two halves of 16 with their own scales), so a token's result does
 * not depend on the tokens processed with it
 * (cuda_mirror_mmq is the host copy).
 * It is not the matvec's expression: the engine uses these for every prompt chunk and the matvec for
 * decode. Activation rows must be 16-byte aligned (x_stride and the base). */

/* Tokens per segment of cuda_mmq_segments (at most). */
#define CUDA_MMQ_TOKENS 64

/* 1 for the weight types the grouped product runs (every quantized type: gq_mmq_form >= 0). */
int32_t cuda_mmq_supported(int32_t type);
/* y[t, r] (+)= W[r, :] . xq[t, :] for t < T (dense weights, e.g. attention). */
strata_status cuda_mmq(cuda_ctx *ctx, int32_t type, const void *w, int64_t rows, int64_t cols, const void *xq,
                       int64_t x_stride, float *y, int64_t y_stride, int32_t T, int32_t accumulate);
/* Grouped: segment s has weights w_ptrs[s] and the pairs p = pairs[seg_start[s] .. seg_start[s + 1])
 * (at most CUDA_MMQ_TOKENS): y[p, r] = W_s[r, :] . xq[p / xdiv, :]. Device arrays. */
strata_status cuda_mmq_segments(cuda_ctx *ctx, int32_t type, const void *const *w_ptrs, int64_t rows, int64_t cols,
                                const void *xq, int64_t x_stride, const int32_t *pairs, const int32_t *seg_start,
                                int32_t xdiv, float *y, int64_t y_stride, int32_t n_segments);

/* y[t] = x[t] / rms(x[t]) * w,  x, y: [T, D] (may alias). */
strata_status cuda_rmsnorm(cuda_ctx *ctx, const float *x, const float *w, float *y, int32_t T, int32_t D,
                           float eps);
/* cuda_rmsnorm, plus y quantized into q as cuda_quantize_act does for weights whose activations are
 * Q8_0 (the same bits as the two calls; D a multiple of 32). */
strata_status cuda_rmsnorm_q8(cuda_ctx *ctx, const float *x, const float *w, float *y, void *q, int64_t q_stride,
                             int32_t T, int32_t D, float eps);
/* Position arguments: pos_dev, when not NULL, is a device int32 read by the kernel in place of pos0,
 * so that a captured CUDA Graph can run at any position. */

/* Per-head RMSNorm of q and k, then NeoX RoPE at positions pos0 + t.
 * q: [T, H*hd], k: [T, Hkv*hd]. */
strata_status cuda_qk_norm_rope(cuda_ctx *ctx, float *q, float *k, const float *q_norm, const float *k_norm,
                                int32_t T, int32_t H, int32_t Hkv, int32_t hd, int32_t pos0, float theta,
                                float eps, const int32_t *pos_dev);
/* Store k, v ([T, Hkv*hd] f32) into the layer's cache at positions pos0.. (f16, or int8 with a
 * scale per block of 32 values). */
strata_status cuda_kv_store(cuda_ctx *ctx, int32_t kv_type, const float *k, const float *v, void *k_cache,
                            void *v_cache, int32_t T, int32_t kv_dim, int32_t pos0, const int32_t *pos_dev);
/* Causal attention of T queries at positions pos0.. over the cache: out [T, H*hd]. The result of a
 * query depends only on its position and the cache, never on T. */
strata_status cuda_attention(cuda_ctx *ctx, int32_t kv_type, const float *q, const void *k_cache,
                             const void *v_cache, float *out, int32_t T, int32_t H, int32_t Hkv, int32_t hd,
                             int32_t pos0, const int32_t *pos_dev);
/* Decode, one query (at position pos0, or *pos_dev): causal attention over the cache into out [H * hd], and
 * when q8 is not NULL its row quantized as cuda_quantize_act does for Q8_0 (q8_stride unused for one row).
 * Up to 256 positions the result has cuda_attention's bits; beyond, the positions are split over S blocks
 * per head (S from 1 to 64, fixed by the caller) whose states are merged in split order, so the bits
 * depend on the position and S only. part: device scratch of H * S * (hd + 2) floats; cnt: H device ints,
 * 0 before the first call (each call leaves them at 0). Launched with cu_launch (programmatic launch). */
strata_status cuda_attention_decode(cuda_ctx *ctx, int32_t kv_type, const float *q, const void *k_cache,
                                    const void *v_cache, float *out, void *q8, int64_t q8_stride, int32_t H,
                                    int32_t Hkv, int32_t hd, int32_t pos0, const int32_t *pos_dev, float *part,
                                    int32_t *cnt, int32_t S);
/* Router: softmax over E logits, top-K, weights renormalized to sum 1.
 * logits [T, E] -> ids [T, K] (best first), weights [T, K]. */
strata_status cuda_router_topk(cuda_ctx *ctx, const float *logits, int32_t T, int32_t E, int32_t K,
                               int32_t *ids, float *weights);
/* The same top-K and weights, plus the segment tables of cuda_matvec_segments (one token per segment)
 * for the T * K pairs, made on the device: segment j = t * K + k runs expert ids[t, k], whose gate, up
 * and down device addresses are table[3 * id + 0..2]; w_ptrs are seg_w[0..], seg_w[seg_cap..],
 * seg_w[2 * seg_cap..]; token rows seg_tok[j] = t and seg_out[j] = j (gate and up), seg_tok[seg_half + j]
 * = seg_out[seg_half + j] = j (down). Used when every expert is resident, so that a decode step needs
 * no host round trip. */
strata_status cuda_router_topk_segments(cuda_ctx *ctx, const float *logits, int32_t T, int32_t E, int32_t K,
                                        int32_t *ids, float *weights, const void *const *table, const void **seg_w,
                                        int32_t seg_cap, int32_t *seg_tok, int32_t *seg_out, int64_t seg_half);
/* h[i] = silu(g[i]) * u[i] over n values. */
strata_status cuda_swiglu(cuda_ctx *ctx, const float *g, const float *u, float *h, int64_t n);
/* y[t] += sum_k weights[t, k] * e[t, k, :] in k order.  e: [T, K, D]. */
strata_status cuda_moe_combine(cuda_ctx *ctx, const float *e, const float *weights, float *y, int32_t T,
                               int32_t K, int32_t D);
/* y += x over n values. */
strata_status cuda_add(cuda_ctx *ctx, float *y, const float *x, int64_t n);

/* Causal attention of a prompt chunk on the tensor cores (flash_attn.cu): the same contract as
 * cuda_attention (T queries at positions pos0.. over the cache, out [T, H*hd]), for an f16 or int8 cache
 * and head dims 32, 64, 128 (cuda_flash_attention_supported; int8: the values rounded to f16 once). A query's result depends only on its position and
 * the cache, never on T or pos0; it is not cuda_attention's float expression, so the engine uses it for
 * every prompt chunk and cuda_attention for decode. */
int32_t cuda_flash_attention_supported(int32_t kv_type, int32_t H, int32_t Hkv, int32_t hd);
strata_status cuda_flash_attention(cuda_ctx *ctx, int32_t kv_type, const float *q, const void *k_cache,
                                   const void *v_cache, float *out, int32_t T, int32_t H, int32_t Hkv, int32_t hd,
                                   int32_t pos0, const int32_t *pos_dev);

/* ---- host mirror ------------------------------------------------------------------------------- */

/* Bit-exact host copy of the device matvec for one token: y[r] = W[r, :] . x (same operation
 * sequence as the device kernel), at the kernel level of strata_simd_set (tests; allocates). */
void cuda_mirror_matvec(int32_t type, const void *w, int64_t rows, int64_t cols, const float *x, float *y);
/* Experts run on the host together by cuda_mirror_experts (more are run in groups of this many). */
#define CUDA_MIRROR_MAX_EXPERTS 32
/* Floats of scratch cuda_mirror_experts needs for n experts: gate/up outputs [n, 2F] and the prepared
 * activations. */
int64_t cuda_mirror_scratch_floats(int64_t D, int64_t F, int32_t n);
/* n experts of one token on the host, bit-exact with the device: out[k][0..D) =
 * down_k(swiglu(gate_k x, up_k x)), at kernel level simd (SCALAR, AVX2 or AVX512; the CPU must have it).
 * x is prepared once for all gates and ups, whose rows the pool splits together in one run (pool
 * NULL: this thread), then all downs in a second. gate[k], up[k]: [F, D] of their types, down[k]:
 * [D, F]. No allocation; scratch: cuda_mirror_scratch_floats(D, F, n) floats. */
struct pool;
void cuda_mirror_experts(struct pool *p, int32_t simd, int32_t n, const void *const *gate, int32_t gate_type,
                         const void *const *up, int32_t up_type, const void *const *down, int32_t down_type, int64_t D,
                         int64_t F, const float *x, float *const *out, float *scratch);
/* Bit-exact host copy of cuda_mmq for one token (any quantized weight type): y[r] = W[r, :] . x. */
void cuda_mirror_mmq(int32_t type, const void *w, int64_t rows, int64_t cols, const float *x, float *y);
/* The host engine's Q8_0 activation quantization into the device layout (cols int8, cols/32 floats). */
void cuda_mirror_quantize_q8(const float *x, int64_t cols, uint8_t *q);

#ifdef __cplusplus
}
#endif

#endif
