/*
 * attention.cu — causal attention over the KV cache, one kernel for prompt chunks and decode.
 *
 * Legend: T queries at positions pos0.., H query heads, Hkv key/value heads, hd head dim (E = hd/32
 * values per lane), NW warps per block.
 *
 * One block per (query, head). Warp w visits positions w, w + NW, ... up to the query's own position
 * with an online softmax; the warps are then merged in order 0..NW-1. The visiting order depends on
 * the query's position only, so a token's attention output is the same in a chunk of any size and in
 * decode.
 */
#include <cuda_fp16.h>

#include "common.cuh"

#define ATT_WARPS 4

template <int E, int KVT>
__device__ __forceinline__ void load_row(const uint8_t *cache, int64_t p, int kv_dim, int off, int lane, float *out) {
    if (KVT == STRATA_KV_F16) {
        const __half *row = (const __half *)(cache + p * (int64_t)kv_dim * 2) + off;
#pragma unroll
        for (int e = 0; e < E; e++) out[e] = __half2float(row[lane + 32 * e]);
    } else {
        const int64_t rb = kv_dim + kv_dim / 8;
        const int8_t *row = (const int8_t *)(cache + p * rb);
        const float *scales = (const float *)(cache + p * rb + kv_dim);
#pragma unroll
        for (int e = 0; e < E; e++) {
            const int i = off + lane + 32 * e;
            out[e] = __fmul_rn((float)row[i], scales[i >> 5]);
        }
    }
}

template <int E, int KVT>
__global__ void __launch_bounds__(ATT_WARPS * 32)
k_attention(const float *q, const uint8_t *kc, const uint8_t *vc, float *out, int H, int Hkv, int pos0) {
    const int hd = 32 * E, kv_dim = Hkv * hd;
    const int t = blockIdx.x / H, h = blockIdx.x % H;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int off = (h / (H / Hkv)) * hd;
    const float scale = 1.0f / sqrtf((float)hd);
    float qv[E];
    const float *qr = q + ((int64_t)t * H + h) * hd;
#pragma unroll
    for (int e = 0; e < E; e++) qv[e] = __fmul_rn(qr[lane + 32 * e], scale);

    const int npos = pos0 + t + 1;
    float m = -INFINITY, l = 0.0f, o[E];
#pragma unroll
    for (int e = 0; e < E; e++) o[e] = 0.0f;
    for (int p = warp; p < npos; p += ATT_WARPS) {
        float kv[E];
        load_row<E, KVT>(kc, p, kv_dim, off, lane, kv);
        float s = 0.0f;
#pragma unroll
        for (int e = 0; e < E; e++) s = __fadd_rn(s, __fmul_rn(qv[e], kv[e]));
#pragma unroll
        for (int x = 16; x > 0; x >>= 1) s = __fadd_rn(s, __shfl_xor_sync(0xffffffffu, s, x));
        const float mn = fmaxf(m, s);
        const float corr = expf(m - mn), pe = expf(s - mn);
        l = __fadd_rn(__fmul_rn(l, corr), pe);
        load_row<E, KVT>(vc, p, kv_dim, off, lane, kv);
#pragma unroll
        for (int e = 0; e < E; e++) o[e] = __fadd_rn(__fmul_rn(o[e], corr), __fmul_rn(pe, kv[e]));
        m = mn;
    }
    __shared__ float sm[ATT_WARPS], sl[ATT_WARPS], so[ATT_WARPS][32 * E];
    if (lane == 0) {
        sm[warp] = m;
        sl[warp] = l;
    }
#pragma unroll
    for (int e = 0; e < E; e++) so[warp][lane + 32 * e] = o[e];
    __syncthreads();
    if (warp == 0) {
        float M = sm[0];
        for (int w = 1; w < ATT_WARPS; w++) M = fmaxf(M, sm[w]);
        float L = 0.0f, O[E];
#pragma unroll
        for (int e = 0; e < E; e++) O[e] = 0.0f;
        for (int w = 0; w < ATT_WARPS; w++) {
            const float c = sl[w] > 0.0f ? expf(sm[w] - M) : 0.0f;
            L = __fadd_rn(L, __fmul_rn(sl[w], c));
#pragma unroll
            for (int e = 0; e < E; e++) O[e] = __fadd_rn(O[e], __fmul_rn(so[w][lane + 32 * e], c));
        }
        float *orow = out + ((int64_t)t * H + h) * hd;
#pragma unroll
        for (int e = 0; e < E; e++) orow[lane + 32 * e] = O[e] / L;
    }
}

extern "C" strata_status cuda_attention(cuda_ctx *ctx, int32_t kv_type, const float *q, const void *k_cache,
                                        const void *v_cache, float *out, int32_t T, int32_t H, int32_t Hkv, int32_t hd,
                                        int32_t pos0) {
    if (T <= 0) return STRATA_OK;
    if (hd % 32 || hd > 256 || Hkv <= 0 || H % Hkv) {
        snprintf(ctx->err, sizeof ctx->err,
                 "CUDA: attention with head dim %d, %d heads, %d kv heads is not supported (head dim a multiple "
                 "of 32 up to 256, heads a multiple of kv heads)", hd, H, Hkv);
        return STRATA_ERR_UNSUPPORTED;
    }
    const int64_t blocks = (int64_t)T * H;
    const uint8_t *kc = (const uint8_t *)k_cache, *vc = (const uint8_t *)v_cache;
    cudaStream_t s = CU_COMPUTE(ctx);
#define ATT_CASE(EE)                                                                                            \
    case EE:                                                                                                    \
        if (kv_type == STRATA_KV_F16)                                                                           \
            k_attention<EE, STRATA_KV_F16><<<(unsigned)blocks, ATT_WARPS * 32, 0, s>>>(q, kc, vc, out, H, Hkv, pos0); \
        else                                                                                                    \
            k_attention<EE, STRATA_KV_INT8><<<(unsigned)blocks, ATT_WARPS * 32, 0, s>>>(q, kc, vc, out, H, Hkv, pos0); \
        break;
    switch (hd / 32) {
        ATT_CASE(1)
        ATT_CASE(2)
        ATT_CASE(4)
        ATT_CASE(8)
    default:
        snprintf(ctx->err, sizeof ctx->err, "CUDA: head dimension %d is not supported (32, 64, 128 or 256)", hd);
        return STRATA_ERR_UNSUPPORTED;
    }
#undef ATT_CASE
    CU_LAUNCHED(ctx, "attention");
    return STRATA_OK;
}
