/* moe.cu — router top-k, SwiGLU, the weighted combine of expert outputs, residual add.
 * Legend: T tokens, E experts, K experts used per token, D model dim. */
#include "common.cuh"
#include "../group_dequant.h"

/* one thread per token: top-K of the logits (ties: lower expert id first), weights = softmax over the
 * chosen K (the full softmax's denominator cancels when the weights are renormalized) */
__global__ void k_router_topk(const float *logits, int T, int E, int K, int32_t *ids, float *weights) {
    const int t = blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= T) return;
    const float *lg = logits + (int64_t)t * E;
    int32_t *id = ids + (int64_t)t * K;
    float *wt = weights + (int64_t)t * K;
    for (int k = 0; k < K; k++) {
        int best = -1;
        float bv = -INFINITY;
        for (int e = 0; e < E; e++) {
            bool taken = false;
            for (int j = 0; j < k; j++) taken |= (id[j] == e);
            if (!taken && (best < 0 || lg[e] > bv)) {
                best = e;
                bv = lg[e];
            }
        }
        id[k] = best;
    }
    const float mx = lg[id[0]];
    float sum = 0.0f;
    for (int k = 0; k < K; k++) {
        wt[k] = expf(lg[id[k]] - mx);
        sum = __fadd_rn(sum, wt[k]);
    }
    for (int k = 0; k < K; k++) wt[k] = wt[k] / sum;
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
    k_router_topk<<<cu_blocks(T, 64), 64, 0, CU_COMPUTE(ctx)>>>(logits, T, E, K, ids, weights);
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
