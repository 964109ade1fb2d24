/* moe.cu — router top-k, SwiGLU, the weighted combine of expert outputs, residual add.
 * Legend: T tokens, E experts, K experts used per token, D model dim. */
#include "common.cuh"
#include "router_topk.cuh"
#include "../group_dequant.h"

#define RT_WARPS 4 /* tokens per block of the router */

/* One warp per token: top-K of the logits by the order "greater logit first, lower expert id on a tie"
 * (the same choice as a serial scan where a strictly greater logit replaces the best), then
 * weights = softmax over the chosen K (the full softmax's denominator cancels when the weights are
 * renormalized), computed by lane 0 with the same float expression in k order as the serial form.
 *
 * Round k: the eligible experts are those after pick k-1 in that order (a strict total order for
 * finite or infinite logits, so "after the previous pick" is exactly "not taken yet"); each lane keeps
 * the best of its experts lane, lane+32, ... and a butterfly picks the best of the lanes. The pairwise
 * choice is commutative and associative, so every lane ends with the same pick.
 *
 * With a segment table (decode with every expert resident), lane 0 also writes the segments of
 * cuda_matvec_segments for the token's K pairs: segment t*K+k is expert ids[k] (weights from
 * table[ids[k]] = gate, up, down), token t into row t*K+k. */
__global__ void __launch_bounds__(RT_WARPS * 32)
    k_router_topk(const float *logits, int T, int E, int K, int32_t *ids, float *weights, const void *const *table,
                  const void **seg_w, int seg_cap, int32_t *seg_tok, int32_t *seg_out, int64_t seg_half) {
    const int lane = threadIdx.x & 31;
    const int t = blockIdx.x * RT_WARPS + (threadIdx.x >> 5);
    if (t >= T) return;
    const float *lg = logits + (int64_t)t * E;
    int32_t *id = ids + (int64_t)t * K;
    float *wt = weights + (int64_t)t * K;
    int pi = -1;     /* previous pick */
    float pv = 0.0f; /* its logit */
    float mx = 0.0f, sum = 0.0f;
    for (int k = 0; k < K; k++) {
        int best = -1;
        float bv = -INFINITY;
        for (int e = lane; e < E; e += 32) {
            const float v = lg[e];
            if (cu_router_takes(e, v, pi, pv, best, bv)) {
                best = e;
                bv = v;
            }
        }
        cu_router_warp_best(best, bv);
        pi = best;
        pv = bv;
        if (lane == 0) {
            id[k] = best;
            if (k == 0) mx = bv;
            wt[k] = expf(bv - mx); /* bv is lg[id[k]] */
            sum = __fadd_rn(sum, wt[k]);
            if (table)
                cu_router_segment(table, best, (int64_t)t * K + k, t, seg_w, seg_cap, seg_tok, seg_out, seg_half);
        }
    }
    if (lane == 0)
        for (int k = 0; k < K; k++) wt[k] = wt[k] / sum;
}

/* Latency-tuned k_router_topk (ctx->fast, E <= 32 * RT_MAXE, K <= 32): the same picks and the same
 * weight bits (cu_router_topk_warp, router_topk.cuh). */
__global__ void __launch_bounds__(RT_WARPS * 32)
    k_router_topk_fast(const float *logits, int T, int E, int K, int32_t *ids, float *weights, const void *const *table,
                       const void **seg_w, int seg_cap, int32_t *seg_tok, int32_t *seg_out, int64_t seg_half) {
    cu_pdl_trigger();
    cu_pdl_wait();
    const int lane = threadIdx.x & 31;
    const int t = blockIdx.x * RT_WARPS + (threadIdx.x >> 5);
    if (t >= T) return;
    cu_router_topk_warp<false>(logits + (int64_t)t * E, t, E, K, lane, ids, weights, table, seg_w, seg_cap, seg_tok,
                               seg_out, seg_half);
}

__global__ void k_swiglu(const float *g, const float *u, float *h, int64_t n) {
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) h[i] = gq_swiglu(g[i], u[i]); /* the host mirror computes the same bits */
}

__global__ void k_moe_combine(const float *e, const float *w, float *y, int T, int K, int D) {
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (int64_t)T * D) return;
    const int64_t t = i / D, d = i % D;
    float acc = 0.0f;
    for (int k = 0; k < K; k++) acc = __fadd_rn(acc, __fmul_rn(w[t * K + k], e[(t * K + k) * D + d]));
    y[i] = __fadd_rn(y[i], acc);
}

__global__ void k_add(float *y, const float *x, int64_t n) {
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = __fadd_rn(y[i], x[i]);
}

extern "C" {

strata_status cuda_router_topk(cuda_ctx *ctx, const float *logits, int32_t T, int32_t E, int32_t K, int32_t *ids,
                               float *weights) {
    if (T <= 0) return STRATA_OK;
    if (K <= 0 || K > E) return STRATA_ERR_INVALID_ARGUMENT;
    if ((ctx->fast & CUDA_FAST_ROUTER) && E <= 32 * RT_MAXE && K <= 32) {
        CU_TRY(ctx,
               cu_launch(ctx, k_router_topk_fast, dim3(cu_blocks(T, RT_WARPS)), dim3(RT_WARPS * 32), 0, logits, (int)T,
                         (int)E, (int)K, ids, weights, (const void *const *)NULL, (const void **)NULL, 0,
                         (int32_t *)NULL, (int32_t *)NULL, (int64_t)0),
               "launching router top-k");
        return STRATA_OK;
    }
    k_router_topk<<<cu_blocks(T, RT_WARPS), RT_WARPS * 32, 0, CU_COMPUTE(ctx)>>>(logits, T, E, K, ids, weights, NULL,
                                                                                 NULL, 0, NULL, NULL, 0);
    CU_LAUNCHED(ctx, "router top-k");
    return STRATA_OK;
}

strata_status cuda_router_topk_segments(cuda_ctx *ctx, const float *logits, int32_t T, int32_t E, int32_t K,
                                        int32_t *ids, float *weights, const void *const *table, const void **seg_w,
                                        int32_t seg_cap, int32_t *seg_tok, int32_t *seg_out, int64_t seg_half) {
    if (T <= 0) return STRATA_OK;
    if (K <= 0 || K > E || (int64_t)T * K > seg_cap || (int64_t)T * K > seg_half) return STRATA_ERR_INVALID_ARGUMENT;
    if ((ctx->fast & CUDA_FAST_ROUTER) && E <= 32 * RT_MAXE && K <= 32) {
        CU_TRY(ctx,
               cu_launch(ctx, k_router_topk_fast, dim3(cu_blocks(T, RT_WARPS)), dim3(RT_WARPS * 32), 0, logits, (int)T,
                         (int)E, (int)K, ids, weights, table, seg_w, (int)seg_cap, seg_tok, seg_out, seg_half),
               "launching router top-k");
        return STRATA_OK;
    }
    k_router_topk<<<cu_blocks(T, RT_WARPS), RT_WARPS * 32, 0, CU_COMPUTE(ctx)>>>(
        logits, T, E, K, ids, weights, table, seg_w, seg_cap, seg_tok, seg_out, seg_half);
    CU_LAUNCHED(ctx, "router top-k");
    return STRATA_OK;
}

strata_status cuda_swiglu(cuda_ctx *ctx, const float *g, const float *u, float *h, int64_t n) {
    if (n <= 0) return STRATA_OK;
    k_swiglu<<<cu_blocks(n, 256), 256, 0, CU_COMPUTE(ctx)>>>(g, u, h, n);
    CU_LAUNCHED(ctx, "swiglu");
    return STRATA_OK;
}

strata_status cuda_moe_combine(cuda_ctx *ctx, const float *e, const float *weights, float *y, int32_t T, int32_t K,
                               int32_t D) {
    if (T <= 0) return STRATA_OK;
    k_moe_combine<<<cu_blocks((int64_t)T * D, 256), 256, 0, CU_COMPUTE(ctx)>>>(e, weights, y, T, K, D);
    CU_LAUNCHED(ctx, "expert combine");
    return STRATA_OK;
}

strata_status cuda_add(cuda_ctx *ctx, float *y, const float *x, int64_t n) {
    if (n <= 0) return STRATA_OK;
    k_add<<<cu_blocks(n, 256), 256, 0, CU_COMPUTE(ctx)>>>(y, x, n);
    CU_LAUNCHED(ctx, "add");
    return STRATA_OK;
}

} /* extern "C" */
