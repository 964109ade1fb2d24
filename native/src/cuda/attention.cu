/*
 * attention.cu — causal attention over the KV cache, one kernel for prompt chunks and decode.
 *
 * Legend: T queries at positions pos0.., H query heads, Hkv key/value heads, hd head dim (E = hd/32
 * values per lane), NW warps per block, P = ATT_TILE positions per tile.
 *
 * One block per (query, head). The positions 0..pos are cut into tiles of P by absolute position;
 * warp w takes tiles w, w + NW, ... For a tile it first computes all P scores (the K rows' loads are
 * independent, batched ATT_BATCH at a time, so their latencies overlap), then the tile's max, weights
 * and weighted V sum (again P independent loads), and only then merges the tile into its running
 * state (max, sum, output) with one rescale. The warps are merged in order 0..NW-1 at the end.
 * Lane l owns the E contiguous values l*E .. l*E+E-1 of a head (one vector load per row).
 *
 * Every order above (values within a dot product, lanes in the butterfly, positions within a tile,
 * tiles within a warp, warps) depends on the query's position only, so a token's attention output is
 * the same in a chunk of any size and in decode.
 */
#include <cuda_fp16.h>

#include "common.cuh"

#define ATT_WARPS 8
#define ATT_TILE 32  /* positions per tile: one per lane for the weights */
#define ATT_BATCH 8  /* rows whose loads are in flight together */

/* The E values of row p that lane owns (offset `off` = kv head's first value + lane * E). */
template <int E, int KVT>
__device__ __forceinline__ void load_vec(const uint8_t *__restrict__ cache, int64_t p, int kv_dim, int off,
                                         float *out) {
    if (KVT == STRATA_KV_F16) {
        /* rows are kv_dim * 2 bytes (a multiple of 64) and off a multiple of E: E halves are aligned */
        const __half *src = (const __half *)(cache + p * (int64_t)kv_dim * 2) + off;
        __align__(16) __half h[E];
        if (E == 8) *(uint4 *)h = __ldg((const uint4 *)src);
        else if (E == 4) *(uint2 *)h = __ldg((const uint2 *)src);
        else if (E == 2) *(unsigned *)h = __ldg((const unsigned *)src);
        else h[0] = src[0];
#pragma unroll
        for (int e = 0; e < E; e++) out[e] = __half2float(h[e]);
    } else {
        /* row: kv_dim int8 then kv_dim / 32 float scales; rows are a multiple of 4 bytes (kv_dim % 32 == 0) */
        const int64_t rb = kv_dim + kv_dim / 8;
        const uint8_t *row = cache + p * rb;
        const float sc = __ldg((const float *)(row + kv_dim) + (off >> 5)); /* E <= 8 values share a block */
        __align__(8) int8_t b[E < 4 ? 4 : E];
        if (E >= 4) {
#pragma unroll
            for (int i = 0; i < E / 4; i++) ((int *)b)[i] = __ldg((const int *)(row + off) + i);
        } else {
#pragma unroll
            for (int e = 0; e < E; e++) b[e] = (int8_t)row[off + e];
        }
#pragma unroll
        for (int e = 0; e < E; e++) out[e] = __fmul_rn((float)b[e], sc);
    }
}

/* One warp's tiles first, first + step, ... (< ntile) of one query over the cache, merged into its state
 * (m, l, o): the scores of a tile (the K rows' loads B at a time), its max, weights and weighted V sum,
 * then one rescale. B does not change the sums' order. PREF: at a tile's start every lane asks L2 for
 * the K and V lines of its position (the loads that follow then wait for L2, not for memory). */
template <int E, int KVT, int B, bool PREF>
__device__ __forceinline__ void att_tiles(const float *qv, const uint8_t *__restrict__ kc, const uint8_t *__restrict__ vc,
                                          int kv_dim, int off, int npos, int first, int step, int lane, float &m,
                                          float &l, float *o) {
    const int ntile = (npos + ATT_TILE - 1) / ATT_TILE;
    for (int tile = first; tile < ntile; tile += step) {
        const int p0 = tile * ATT_TILE;
        const int n = min(ATT_TILE, npos - p0); /* warp-uniform */
        if (PREF && lane < n) {
            const int hd = 32 * E, head0 = off - lane * E; /* the kv head's first value */
            const int64_t p = p0 + lane;
            if (KVT == STRATA_KV_F16) {
                for (int b = 0; b < hd * 2; b += 128) {
                    asm volatile("prefetch.global.L2 [%0];" ::"l"(kc + p * kv_dim * 2 + head0 * 2 + b));
                    asm volatile("prefetch.global.L2 [%0];" ::"l"(vc + p * kv_dim * 2 + head0 * 2 + b));
                }
            } else {
                const int64_t rb = kv_dim + kv_dim / 8;
                for (int b = 0; b < hd; b += 128) {
                    asm volatile("prefetch.global.L2 [%0];" ::"l"(kc + p * rb + head0 + b));
                    asm volatile("prefetch.global.L2 [%0];" ::"l"(vc + p * rb + head0 + b));
                }
                asm volatile("prefetch.global.L2 [%0];" ::"l"(kc + p * rb + kv_dim + head0 / 8));
                asm volatile("prefetch.global.L2 [%0];" ::"l"(vc + p * rb + kv_dim + head0 / 8));
            }
        }
        /* scores: lane i keeps the score of position p0 + i */
        float s_mine = -INFINITY;
        for (int i0 = 0; i0 < n; i0 += B) {
            float kv[B][E];
#pragma unroll
            for (int j = 0; j < B; j++)
                if (i0 + j < n) load_vec<E, KVT>(kc, p0 + i0 + j, kv_dim, off, kv[j]);
#pragma unroll
            for (int j = 0; j < B; j++) {
                if (i0 + j < n) {
                    float s = 0.0f;
#pragma unroll
                    for (int e = 0; e < E; e++) s = __fadd_rn(s, __fmul_rn(qv[e], kv[j][e]));
#pragma unroll
                    for (int x = 16; x > 0; x >>= 1) s = __fadd_rn(s, __shfl_xor_sync(0xffffffffu, s, x));
                    if (lane == i0 + j) s_mine = s;
                }
            }
        }
        float mt = s_mine;
#pragma unroll
        for (int x = 16; x > 0; x >>= 1) mt = fmaxf(mt, __shfl_xor_sync(0xffffffffu, mt, x));
        const float pe = lane < n ? expf(s_mine - mt) : 0.0f;
        float lt = pe;
#pragma unroll
        for (int x = 16; x > 0; x >>= 1) lt = __fadd_rn(lt, __shfl_xor_sync(0xffffffffu, lt, x));
        float ot[E];
#pragma unroll
        for (int e = 0; e < E; e++) ot[e] = 0.0f;
        for (int i0 = 0; i0 < n; i0 += B) {
            float vv[B][E];
#pragma unroll
            for (int j = 0; j < B; j++)
                if (i0 + j < n) load_vec<E, KVT>(vc, p0 + i0 + j, kv_dim, off, vv[j]);
#pragma unroll
            for (int j = 0; j < B; j++) {
                if (i0 + j < n) {
                    const float pj = __shfl_sync(0xffffffffu, pe, i0 + j);
#pragma unroll
                    for (int e = 0; e < E; e++) ot[e] = __fadd_rn(ot[e], __fmul_rn(pj, vv[j][e]));
                }
            }
        }
        /* merge the tile into the warp's state (the first tile: m = -inf, so c_old = 0) */
        const float mn = fmaxf(m, mt);
        const float c_old = expf(m - mn), c_new = expf(mt - mn);
        l = __fadd_rn(__fmul_rn(l, c_old), __fmul_rn(lt, c_new));
#pragma unroll
        for (int e = 0; e < E; e++) o[e] = __fadd_rn(__fmul_rn(o[e], c_old), __fmul_rn(ot[e], c_new));
        m = mn;
    }
}

/* Merge n states (m, l, o) in order 0..n-1 (o's value e of lane at o + i * o_stride + lane * E + e), the
 * block's warps or a query's splits. A state with l = 0 (no tiles) adds nothing. L2: read o through L2
 * (__ldcg: the splits' partials, written by other blocks of the launch). */
template <int E, bool L2 = false>
__device__ __forceinline__ void att_merge(const float *ms, const float *ls, const float *os, int o_stride, int n,
                                          int lane, float &M, float &L, float *O) {
    M = ms[0];
    for (int w = 1; w < n; w++) M = fmaxf(M, ms[w]);
    L = 0.0f;
#pragma unroll
    for (int e = 0; e < E; e++) O[e] = 0.0f;
    for (int w = 0; w < n; w++) {
        const float c = ls[w] > 0.0f ? expf(ms[w] - M) : 0.0f;
        L = __fadd_rn(L, __fmul_rn(ls[w], c));
#pragma unroll
        for (int e = 0; e < E; e++) {
            const float *op = os + (int64_t)w * o_stride + lane * E + e;
            O[e] = __fadd_rn(O[e], __fmul_rn(L2 ? __ldcg(op) : *op, c));
        }
    }
}

/* The lane's E values of a query head (qr), times 1 / sqrt(hd). */
template <int E>
__device__ __forceinline__ void att_load_q(const float *qr, float *qv) {
    const float scale = 1.0f / sqrtf((float)(32 * E));
#pragma unroll
    for (int e = 0; e < E; e++) qv[e] = __fmul_rn(qr[e], scale);
}

/* The block's warps' states (m, l, o) to shared memory (sm, sl: ATT_WARPS floats, so: ATT_WARPS x hd), a
 * barrier, then warp 0 merges them in order 0..ATT_WARPS-1 into (M, L, O); the other warps' M, L, O are not
 * set. */
template <int E>
__device__ __forceinline__ void att_warps_merge(float m, float l, const float *o, float *sm, float *sl, float *so,
                                                int warp, int lane, float &M, float &L, float *O) {
    if (lane == 0) {
        sm[warp] = m;
        sl[warp] = l;
    }
#pragma unroll
    for (int e = 0; e < E; e++) so[warp * 32 * E + lane * E + e] = o[e];
    __syncthreads();
    if (warp == 0) att_merge<E>(sm, sl, so, 32 * E, ATT_WARPS, lane, M, L, O);
}

/* Warp 0 writes the query's output O / L (row t, head h), and with Q8OUT its 8-bit row (cuda_quantize_act's
 * layout and bits for Q8_0 over H * hd values; the 32 / E lanes of a block of 32 values share its scale). */
template <int E, bool Q8OUT>
__device__ __forceinline__ void att_write(const float *O, float L, float *out, uint8_t *q8, int64_t q8_stride, int t,
                                          int h, int H, int lane) {
    const int hd = 32 * E;
    float *orow = out + ((int64_t)t * H + h) * hd + lane * E;
    float res[E];
#pragma unroll
    for (int e = 0; e < E; e++) {
        res[e] = O[e] / L;
        orow[e] = res[e];
    }
    if (Q8OUT) { /* cu_q8_block's expression */
        float amax = 0.0f;
#pragma unroll
        for (int e = 0; e < E; e++) amax = fmaxf(amax, fabsf(res[e]));
#pragma unroll
        for (int x = 1; x < 32 / E; x <<= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, x));
        const float d = amax / 127.0f;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        const int64_t cols = (int64_t)H * hd, col0 = (int64_t)h * hd + lane * E;
        uint8_t *qr = q8 + (int64_t)t * q8_stride;
#pragma unroll
        for (int e = 0; e < E; e++) qr[col0 + e] = (uint8_t)(int8_t)roundf(__fmul_rn(res[e], id));
        if (lane % (32 / E) == 0) ((float *)(qr + cols))[col0 >> 5] = __half2float(__float2half_rn(d));
    }
}

template <int E, int KVT, int B>
__global__ void __launch_bounds__(ATT_WARPS * 32)
k_attention(const float *q, const uint8_t *kc, const uint8_t *vc, float *out, int H, int Hkv, int pos0,
            const int32_t *pos_dev) {
    if (pos_dev) pos0 = *pos_dev;
    const int hd = 32 * E, kv_dim = Hkv * hd;
    const int t = blockIdx.x / H, h = blockIdx.x % H;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int off = (h / (H / Hkv)) * hd + lane * E;
    float qv[E];
    att_load_q<E>(q + ((int64_t)t * H + h) * hd + lane * E, qv);
    float m = -INFINITY, l = 0.0f, o[E];
#pragma unroll
    for (int e = 0; e < E; e++) o[e] = 0.0f;
    att_tiles<E, KVT, B, false>(qv, kc, vc, kv_dim, off, pos0 + t + 1, warp, ATT_WARPS, lane, m, l, o);
    __shared__ float sm[ATT_WARPS], sl[ATT_WARPS], so[ATT_WARPS][32 * E];
    float M, L, O[E];
    att_warps_merge<E>(m, l, o, sm, sl, &so[0][0], warp, lane, M, L, O);
    if (warp == 0) att_write<E, false>(O, L, out, NULL, 0, t, h, H, lane);
}

/* Decode (one query, cuda_attention_decode), grid H * S blocks (query head h, split s), with cu_launch.
 * Up to ATT_WARPS tiles (256 positions), or with S = 1: block s = 0 alone, warp w on tile w, merged as k_attention does
 * (the same bits); the other blocks return. Beyond: warp w of split s takes tiles s * NW + w + k * S * NW,
 * each block merges its warps in order into a partial state (part[h][s]: m, l, o[hd]), and the last
 * block of the head to finish (a counter per head, cnt[h], put back to 0 by that block) merges the S
 * partials in order 0..S-1. Every order depends only on the position. */
template <int E, int KVT, int B, bool Q8OUT>
__global__ void __launch_bounds__(ATT_WARPS * 32)
k_attention_dec(const float *q, const uint8_t *kc, const uint8_t *vc, float *out, int H, int Hkv, int pos0,
                const int32_t *pos_dev, uint8_t *q8, int64_t q8_stride, float *part, int *cnt, int S) {
    cu_pdl_trigger();
    cu_pdl_wait();
    if (pos_dev) pos0 = *pos_dev;
    const int hd = 32 * E, kv_dim = Hkv * hd;
    const int h = blockIdx.x / S, sp = blockIdx.x % S;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int npos = pos0 + 1;
    const int ntile = (npos + ATT_TILE - 1) / ATT_TILE;
    const bool split = ntile > ATT_WARPS && S > 1; /* block-uniform */
    if (!split && sp > 0) return;
    const int off = (h / (H / Hkv)) * hd + lane * E;
    float qv[E];
    att_load_q<E>(q + (int64_t)h * hd + lane * E, qv);
    float m = -INFINITY, l = 0.0f, o[E];
#pragma unroll
    for (int e = 0; e < E; e++) o[e] = 0.0f;
    if (split) att_tiles<E, KVT, B, true>(qv, kc, vc, kv_dim, off, npos, sp * ATT_WARPS + warp, S * ATT_WARPS, lane, m, l, o);
    else att_tiles<E, KVT, B, true>(qv, kc, vc, kv_dim, off, npos, warp, ATT_WARPS, lane, m, l, o);
    __shared__ float sm[ATT_WARPS], sl[ATT_WARPS], so[ATT_WARPS][32 * E];
    __shared__ int last;
    float M, L, O[E];
    att_warps_merge<E>(m, l, o, sm, sl, &so[0][0], warp, lane, M, L, O);
    if (!split) {
        if (warp == 0) att_write<E, Q8OUT>(O, L, out, q8, q8_stride, 0, h, H, lane);
        return;
    }
    const int ps = hd + 2; /* floats of a partial state: m, l, o[hd] */
    float *mine = part + ((int64_t)h * S + sp) * ps;
    if (warp == 0) {
        if (lane == 0) {
            mine[0] = M;
            mine[1] = L;
        }
#pragma unroll
        for (int e = 0; e < E; e++) mine[2 + lane * E + e] = O[e];
        __threadfence(); /* the partial is visible before the counter says so */
        __syncwarp();
        if (lane == 0) last = atomicAdd(cnt + h, 1) == S - 1;
    }
    __syncthreads();
    if (!last || warp != 0) return;
    __threadfence();
    /* the S partials through L2 (__ldcg: not a stale L1 line), then merged in order */
    __shared__ float pm[64], pl[64];
    const float *hp = part + (int64_t)h * S * ps;
    for (int i = lane; i < S; i += 32) {
        pm[i] = __ldcg(hp + (int64_t)i * ps);
        pl[i] = __ldcg(hp + (int64_t)i * ps + 1);
    }
    __syncwarp();
    float Mx, Lx, Ox[E];
    att_merge<E, true>(pm, pl, hp + 2, ps, S, lane, Mx, Lx, Ox);
    att_write<E, Q8OUT>(Ox, Lx, out, q8, q8_stride, 0, h, H, lane);
    if (lane == 0) cnt[h] = 0; /* for the next launch (stream-ordered after this one) */
}

extern "C" strata_status cuda_attention(cuda_ctx *ctx, int32_t kv_type, const float *q, const void *k_cache,
                                        const void *v_cache, float *out, int32_t T, int32_t H, int32_t Hkv, int32_t hd,
                                        int32_t pos0, const int32_t *pos_dev) {
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
            k_attention<EE, STRATA_KV_F16, ATT_BATCH><<<(unsigned)blocks, ATT_WARPS * 32, 0, s>>>(q, kc, vc, out, H, Hkv, pos0, pos_dev); \
        else                                                                                                    \
            k_attention<EE, STRATA_KV_INT8, ATT_BATCH><<<(unsigned)blocks, ATT_WARPS * 32, 0, s>>>(q, kc, vc, out, H, Hkv, pos0, pos_dev); \
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

/* Decode attention (ctx->fast): k_attention_dec, S splits per head (part: H * S * (hd + 2) floats, cnt: H
 * ints at 0), the output also quantized for the output projection when q8 is given. */
extern "C" strata_status cuda_attention_decode(cuda_ctx *ctx, int32_t kv_type, const float *q, const void *k_cache,
                                               const void *v_cache, float *out, void *q8, int64_t q8_stride,
                                               int32_t H, int32_t Hkv, int32_t hd, int32_t pos0,
                                               const int32_t *pos_dev, float *part, int32_t *cnt, int32_t S) {
    if (hd % 32 || hd > 256 || Hkv <= 0 || H % Hkv || S < 1 || S > 64) {
        snprintf(ctx->err, sizeof ctx->err, "CUDA: decode attention with head dim %d, %d heads, %d kv heads, %d splits "
                 "is not supported", hd, H, Hkv, S);
        return STRATA_ERR_UNSUPPORTED;
    }
    const dim3 grid((unsigned)((int64_t)H * S)), block(ATT_WARPS * 32);
    const uint8_t *kc = (const uint8_t *)k_cache, *vc = (const uint8_t *)v_cache;
    uint8_t *qq = (uint8_t *)q8;
    int *cn = (int *)cnt;
    cudaError_t e = cudaSuccess;
#define ATD(EE, BB)                                                                                               \
    if (kv_type == STRATA_KV_F16)                                                                                 \
        e = qq ? cu_launch(ctx, k_attention_dec<EE, STRATA_KV_F16, BB, true>, grid, block, 0, q, kc, vc, out, (int)H, \
                           (int)Hkv, (int)pos0, pos_dev, qq, q8_stride, part, cn, (int)S)                          \
               : cu_launch(ctx, k_attention_dec<EE, STRATA_KV_F16, BB, false>, grid, block, 0, q, kc, vc, out,      \
                           (int)H, (int)Hkv, (int)pos0, pos_dev, qq, q8_stride, part, cn, (int)S);                 \
    else                                                                                                          \
        e = qq ? cu_launch(ctx, k_attention_dec<EE, STRATA_KV_INT8, BB, true>, grid, block, 0, q, kc, vc, out,      \
                           (int)H, (int)Hkv, (int)pos0, pos_dev, qq, q8_stride, part, cn, (int)S)                  \
               : cu_launch(ctx, k_attention_dec<EE, STRATA_KV_INT8, BB, false>, grid, block, 0, q, kc, vc, out,     \
                           (int)H, (int)Hkv, (int)pos0, pos_dev, qq, q8_stride, part, cn, (int)S);
    switch (hd / 32) {
    case 1: ATD(1, 32) break;
    case 2: ATD(2, 16) break;
    case 4: ATD(4, 16) break;
    case 8: ATD(8, 8) break;
    default:
        snprintf(ctx->err, sizeof ctx->err, "CUDA: head dimension %d is not supported (32, 64, 128 or 256)", hd);
        return STRATA_ERR_UNSUPPORTED;
    }
#undef ATD
    CU_TRY(ctx, e, "launching decode attention");
    return STRATA_OK;
}
