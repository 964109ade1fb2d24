/*
 * matvec.cu — matrix-vector products for decode and for prompt chunks, on quantized rows.
 *
 * Legend: R rows, C cols (a multiple of 32), T tokens, G = C / 32 groups of 32 values per row.
 *
 * One warp computes one row for up to TOK tokens. Lane l owns slice s = l % 4 (8 values) of groups
 * g = l / 4, l / 4 + 8, ...: it dequantizes its 8 values once and multiplies them into each token's
 * accumulator (acc = acc + w * x, a multiply and an add, each rounded: no fusion), so that 32 lanes
 * read 1 KiB of contiguous activations per step. The lanes are then combined by a butterfly
 * (xor 16, 8, 4, 2, 1). The order depends on C alone: a token gets the same bits whether it is
 * processed alone or with others, and cuda_mirror_matvec reproduces it on the host.
 */
#include "common.cuh"
#include "rms.cuh"
#include "router_topk.cuh"
#include "../group_dequant.h"

#define MV_WARPS 4 /* rows per block */

template <int TYPE, int TOK>
__global__ void __launch_bounds__(MV_WARPS * 32)
k_matvec(const uint8_t *__restrict__ W, const uint8_t *const *__restrict__ w_ptrs, int64_t row_bytes, int64_t rows,
         int64_t cols, const float *__restrict__ x, int64_t xs, const int32_t *__restrict__ tok,
         const int32_t *__restrict__ outr, float *__restrict__ y, int64_t ys, int T, int accumulate) {
    const int lane = threadIdx.x & 31;
    const int64_t r = (int64_t)blockIdx.x * MV_WARPS + (threadIdx.x >> 5);
    if (r >= rows) return;
    /* plain (w_ptrs == NULL): tokens unit*TOK .. of x into the same rows of y.
     * segments: unit u has its own weights w_ptrs[u] and up to TOK tokens tok[u*TOK + t] (-1 = none)
     * whose results go to rows outr[u*TOK + t] of y. */
    const int64_t unit = blockIdx.y;
    const uint8_t *row = (w_ptrs ? w_ptrs[unit] : W) + r * row_bytes;
    int64_t xrow[TOK], yrow[TOK];
#pragma unroll
    for (int t = 0; t < TOK; t++) {
        if (w_ptrs) {
            xrow[t] = tok[unit * TOK + t];
            yrow[t] = xrow[t] < 0 ? -1 : outr[unit * TOK + t];
        } else {
            const int64_t tt = unit * TOK + t;
            xrow[t] = tt < T ? tt : -1;
            yrow[t] = xrow[t];
        }
    }

    float acc[TOK];
#pragma unroll
    for (int t = 0; t < TOK; t++) acc[t] = 0.0f;

    const int64_t G = cols >> 5;
    const int sl = lane & 3;
    for (int64_t g = lane >> 2; g < G; g += 8) {
        float w[8];
        gq_dequant8(TYPE, row, g, sl, w);
#pragma unroll
        for (int t = 0; t < TOK; t++) {
            if (xrow[t] >= 0) {
                const float4 *xp = (const float4 *)(x + xrow[t] * xs + g * 32 + sl * 8);
                const float4 a = __ldg(xp), b = __ldg(xp + 1);
                float s = acc[t];
                s = __fadd_rn(s, __fmul_rn(w[0], a.x));
                s = __fadd_rn(s, __fmul_rn(w[1], a.y));
                s = __fadd_rn(s, __fmul_rn(w[2], a.z));
                s = __fadd_rn(s, __fmul_rn(w[3], a.w));
                s = __fadd_rn(s, __fmul_rn(w[4], b.x));
                s = __fadd_rn(s, __fmul_rn(w[5], b.y));
                s = __fadd_rn(s, __fmul_rn(w[6], b.z));
                s = __fadd_rn(s, __fmul_rn(w[7], b.w));
                acc[t] = s;
            }
        }
    }
#pragma unroll
    for (int t = 0; t < TOK; t++) {
#pragma unroll
        for (int off = 16; off > 0; off >>= 1) acc[t] = __fadd_rn(acc[t], __shfl_xor_sync(0xffffffffu, acc[t], off));
    }
    /* lane t writes token t (every lane holds every total after the butterfly) */
#pragma unroll
    for (int t = 0; t < TOK; t++) {
        if (lane == t && yrow[t] >= 0) {
            float *yp = y + yrow[t] * ys + r;
            *yp = accumulate ? __fadd_rn(*yp, acc[t]) : acc[t];
        }
    }
}

/* Lane slice sl of Q8_0 / Q4_0 block g of a row: its 8 weights as two words of 4 int8 (w0, w1) and the
 * block's scale dw. Q4_0: slices 0, 1 are the low nibbles of qs[0..15], slices 2, 3 the high nibbles. */
template <int TYPE>
__device__ __forceinline__ void q8w_load(const uint8_t *__restrict__ row, int64_t g, int sl, int &w0, int &w1,
                                         float &dw) {
    if (TYPE == STRATA_TYPE_Q8_0) {
        const uint8_t *b = row + g * 34;
        dw = gq_f16(b);
        const uint16_t *p = (const uint16_t *)(b + 2 + 8 * sl); /* blocks are 2-byte aligned */
        w0 = (int)((uint32_t)p[0] | ((uint32_t)p[1] << 16));
        w1 = (int)((uint32_t)p[2] | ((uint32_t)p[3] << 16));
    } else {
        const uint8_t *b = row + g * 18;
        dw = gq_f16(b);
        const uint16_t *p = (const uint16_t *)(b + 2 + 8 * (sl & 1));
        const uint32_t lo = (uint32_t)p[0] | ((uint32_t)p[1] << 16), hi = (uint32_t)p[2] | ((uint32_t)p[3] << 16);
        const int shift = (sl & 2) ? 4 : 0;
        w0 = (int)__vsub4((lo >> shift) & 0x0F0F0F0Fu, 0x08080808u);
        w1 = (int)__vsub4((hi >> shift) & 0x0F0F0F0Fu, 0x08080808u);
    }
}

/* Q8_0 / Q4_0 weights against activations quantized to 8 bits per block of 32 (the host engine's
 * scheme: d = max|x| / 127 stored as f16, q = round(x / d)). Activation row layout: cols int8 values,
 * then cols / 32 float scales. Lane l owns slice l % 4 of blocks l / 4, l / 4 + 8, ...: an exact
 * integer dot of 8 values, then acc = acc + (dw * dx) * isum. */
template <int TYPE, int TOK>
__global__ void __launch_bounds__(MV_WARPS * 32)
k_matvec_q8(const uint8_t *__restrict__ W, const uint8_t *const *__restrict__ w_ptrs, int64_t row_bytes, int64_t rows,
            int64_t cols, const uint8_t *__restrict__ xq, int64_t xs, const int32_t *__restrict__ tok,
            const int32_t *__restrict__ outr, float *__restrict__ y, int64_t ys, int T, int accumulate) {
    const int lane = threadIdx.x & 31;
    const int64_t r = (int64_t)blockIdx.x * MV_WARPS + (threadIdx.x >> 5);
    if (r >= rows) return;
    const int64_t unit = blockIdx.y;
    const uint8_t *row = (w_ptrs ? w_ptrs[unit] : W) + r * row_bytes;
    int64_t xrow[TOK], yrow[TOK];
#pragma unroll
    for (int t = 0; t < TOK; t++) {
        if (w_ptrs) {
            xrow[t] = tok[unit * TOK + t];
            yrow[t] = xrow[t] < 0 ? -1 : outr[unit * TOK + t];
        } else {
            const int64_t tt = unit * TOK + t;
            xrow[t] = tt < T ? tt : -1;
            yrow[t] = xrow[t];
        }
    }
    float acc[TOK];
#pragma unroll
    for (int t = 0; t < TOK; t++) acc[t] = 0.0f;
    const int64_t G = cols >> 5;
    const int sl = lane & 3;
    for (int64_t g = lane >> 2; g < G; g += 8) {
        int w0, w1;
        float dw;
        q8w_load<TYPE>(row, g, sl, w0, w1, dw);
#pragma unroll
        for (int t = 0; t < TOK; t++) {
            if (xrow[t] >= 0) {
                const uint8_t *xr = xq + xrow[t] * xs;
                const int2 xv = *(const int2 *)(xr + g * 32 + 8 * sl);
                const float dx = ((const float *)(xr + cols))[g];
                const int isum = __dp4a(w1, xv.y, __dp4a(w0, xv.x, 0));
                acc[t] = __fadd_rn(acc[t], __fmul_rn(__fmul_rn(dw, dx), (float)isum));
            }
        }
    }
#pragma unroll
    for (int t = 0; t < TOK; t++) {
#pragma unroll
        for (int off = 16; off > 0; off >>= 1) acc[t] = __fadd_rn(acc[t], __shfl_xor_sync(0xffffffffu, acc[t], off));
    }
#pragma unroll
    for (int t = 0; t < TOK; t++) {
        if (lane == t && yrow[t] >= 0) {
            float *yp = y + yrow[t] * ys + r;
            *yp = accumulate ? __fadd_rn(*yp, acc[t]) : acc[t];
        }
    }
}

/* x [T, cols] f32 -> [T, cols int8 | cols/32 f32] with the host engine's Q8_0 activation rounding */
__global__ void k_quantize_q8(const float *x, int64_t xs, uint8_t *q, int64_t qs_stride, int64_t cols) {
    const int64_t t = blockIdx.y;
    const int lane = threadIdx.x & 31;
    const int64_t b = (int64_t)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (b >= cols / 32) return;
    cu_q8_block(x[t * xs + b * 32 + lane], q + t * qs_stride, b, lane, cols);
}

/* ---- decode experts: one token, K experts, fused ------------------------------------------------
 * The two functions below are one output of k_matvec<TYPE, 1> and k_matvec_q8<TYPE, 1> for one token
 * (the same operations in the same order, butterfly included), so the fused kernels built on them give
 * the bits of the segment products they replace. */

template <int TYPE>
__device__ __forceinline__ float dot_row_f(const uint8_t *__restrict__ row, const float *__restrict__ x, int64_t cols,
                                           int lane) {
    float acc = 0.0f;
    const int64_t G = cols >> 5;
    const int sl = lane & 3;
    /* unrolled so that several groups' loads are in flight together (the sum's order is unchanged) */
#pragma unroll 4
    for (int64_t g = lane >> 2; g < G; g += 8) {
        float w[8];
        if (TYPE == STRATA_TYPE_F32) { /* 16-byte loads (rows are 128-byte multiples): the same values */
            const float4 *wp = (const float4 *)(row + (g * 32 + sl * 8) * 4);
            const float4 w0 = __ldg(wp), w1 = __ldg(wp + 1);
            w[0] = w0.x, w[1] = w0.y, w[2] = w0.z, w[3] = w0.w, w[4] = w1.x, w[5] = w1.y, w[6] = w1.z, w[7] = w1.w;
        } else {
            gq_dequant8(TYPE, row, g, sl, w);
        }
        const float4 *xp = (const float4 *)(x + g * 32 + sl * 8);
        const float4 a = __ldg(xp), b = __ldg(xp + 1);
        float s = acc;
        s = __fadd_rn(s, __fmul_rn(w[0], a.x));
        s = __fadd_rn(s, __fmul_rn(w[1], a.y));
        s = __fadd_rn(s, __fmul_rn(w[2], a.z));
        s = __fadd_rn(s, __fmul_rn(w[3], a.w));
        s = __fadd_rn(s, __fmul_rn(w[4], b.x));
        s = __fadd_rn(s, __fmul_rn(w[5], b.y));
        s = __fadd_rn(s, __fmul_rn(w[6], b.z));
        s = __fadd_rn(s, __fmul_rn(w[7], b.w));
        acc = s;
    }
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) acc = __fadd_rn(acc, __shfl_xor_sync(0xffffffffu, acc, off));
    return acc;
}

template <int TYPE>
__device__ __forceinline__ float dot_row_q8(const uint8_t *__restrict__ row, const uint8_t *__restrict__ xr,
                                            int64_t cols, int lane) {
    float acc = 0.0f;
    const int64_t G = cols >> 5;
    const int sl = lane & 3;
#pragma unroll 4
    for (int64_t g = lane >> 2; g < G; g += 8) {
        int w0, w1;
        float dw;
        q8w_load<TYPE>(row, g, sl, w0, w1, dw);
        const int2 xv = *(const int2 *)(xr + g * 32 + 8 * sl);
        const float dx = ((const float *)(xr + cols))[g];
        const int isum = __dp4a(w1, xv.y, __dp4a(w0, xv.x, 0));
        acc = __fadd_rn(acc, __fmul_rn(__fmul_rn(dw, dx), (float)isum));
    }
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) acc = __fadd_rn(acc, __shfl_xor_sync(0xffffffffu, acc, off));
    return acc;
}

template <int TYPE>
__device__ __forceinline__ float dot_row(const uint8_t *row, const void *x, int64_t cols, int lane) {
    if (TYPE == STRATA_TYPE_Q8_0 || TYPE == STRATA_TYPE_Q4_0)
        return dot_row_q8<TYPE>(row, (const uint8_t *)x, cols, lane);
    return dot_row_f<TYPE>(row, (const float *)x, cols, lane);
}

/* Decode: up to three matrices of one type and width (q, k and v) against one token in one launch. Warp
 * w of the grid takes row w of the rows of m0, then m1, then m2 stacked. */
struct mv3 {
    const uint8_t *w[3];
    float *y[3];
    int64_t rows[3];
    int accumulate; /* y += instead of y = */
};
/* The matrix of stacked row r: its weights w and output y, r made relative to it; false past the last.
 * Selects, not an indexed parameter array (which would go through local memory). */
__device__ __forceinline__ bool mv3_row(const mv3 &m, int64_t &r, const uint8_t *&w, float *&y) {
    w = m.w[0];
    y = m.y[0];
    if (r >= m.rows[0]) {
        r -= m.rows[0];
        w = m.w[1];
        y = m.y[1];
        if (r >= m.rows[1]) {
            r -= m.rows[1];
            w = m.w[2];
            y = m.y[2];
            if (r >= m.rows[2]) return false;
        }
    }
    return true;
}

template <int TYPE>
__global__ void __launch_bounds__(MV_WARPS * 32)
k_matvec3(mv3 m, int64_t row_bytes, int64_t cols, const void *x) {
    const int lane = threadIdx.x & 31;
    int64_t r = (int64_t)blockIdx.x * MV_WARPS + (threadIdx.x >> 5);
    const uint8_t *w;
    float *y;
    if (!mv3_row(m, r, w, y)) return;
    const float v = dot_row<TYPE>(w + r * row_bytes, x, cols, lane);
    if (lane == 0) y[r] = m.accumulate ? __fadd_rn(y[r], v) : v; /* k_matvec's expression */
}

/* grid (F / MV_WARPS, K): warp = row r of expert k: h[k, r] = swiglu(gate_k[r] . x, up_k[r] . x) */
template <int TYPE>
__global__ void __launch_bounds__(MV_WARPS * 32)
k_expert_gate_up(const uint8_t *const *__restrict__ wg, const uint8_t *const *__restrict__ wu, int64_t row_bytes,
                 int64_t F, int64_t D, const void *x, float *h) {
    const int lane = threadIdx.x & 31;
    const int64_t r = (int64_t)blockIdx.x * MV_WARPS + (threadIdx.x >> 5);
    if (r >= F) return;
    const int k = blockIdx.y;
    const float gv = dot_row<TYPE>(wg[k] + r * row_bytes, x, D, lane);
    const float uv = dot_row<TYPE>(wu[k] + r * row_bytes, x, D, lane);
    if (lane == 0) h[(int64_t)k * F + r] = gq_swiglu(gv, uv); /* k_swiglu's expression */
}

/* block = DC_ROWS rows x K warps: warp k computes (down_k h_k)[r] for the block's rows; then one thread
 * per row adds sum_k w_k * y_k (k order, k_moe_combine's expression) to y[r] */
#define DC_ROWS 4

/* After the block's barrier: thread i < DC_ROWS adds sum_k w_k * part[i][k] (k order, k_moe_combine's
 * expression) to y[r0 + i]. */
__device__ __forceinline__ void dc_combine(const float *part, const float *__restrict__ wts, float *y, int64_t r0,
                                           int64_t D, int K) {
    if ((int)threadIdx.x < DC_ROWS && r0 + threadIdx.x < D) {
        const int i = threadIdx.x;
        float acc = 0.0f;
        for (int j = 0; j < K; j++) acc = __fadd_rn(acc, __fmul_rn(wts[j], part[i * K + j]));
        y[r0 + i] = __fadd_rn(y[r0 + i], acc);
    }
}
template <int TYPE>
__global__ void k_expert_down_combine(const uint8_t *const *__restrict__ wd, int64_t row_bytes, int64_t D, int64_t F,
                                      const uint8_t *h, int64_t hs_bytes, const float *__restrict__ wts, float *y, int K) {
    extern __shared__ float part[]; /* [DC_ROWS][K] */
    const int lane = threadIdx.x & 31, k = threadIdx.x >> 5;
    const int64_t r0 = (int64_t)blockIdx.x * DC_ROWS;
    const void *hk = h + (int64_t)k * hs_bytes;
    for (int i = 0; i < DC_ROWS; i++) {
        const int64_t r = r0 + i;
        if (r >= D) break;
        const float v = dot_row<TYPE>(wd[k] + r * row_bytes, hk, F, lane);
        if (lane == 0) part[i * K + k] = v;
    }
    __syncthreads();
    dc_combine(part, wts, y, r0, D, K);
}

/* ---- latency-tuned decode kernels (ctx->fast): the same bits as the three above ------------------
 * A lane's groups of a row are summed in the same order (g = lane / 4, + 8, ...), but their loads are
 * issued PF groups at a time for NR rows together (the plain kernels have 4 groups of one row in flight),
 * so a row of 2048 values costs one round trip to memory, and gate and up, or the DC_ROWS rows of down,
 * share it. With programmatic dependent launch (cu_launch), a product whose weights are fixed (not an
 * expert chosen by the router) loads its first groups before waiting for the kernel before it. */
/* The weights of groups g0, g0 + 8, .. g0 + 8 (PF - 1) (slice sl) of NR rows, zeros past the row's G groups:
 * PF groups of every row in flight together. */
template <int TYPE, int NR, int PF>
__device__ __forceinline__ void q8w_load_batch(const uint8_t *const *rows, int64_t g0, int64_t G, int sl,
                                               int (&w0)[NR][PF], int (&w1)[NR][PF], float (&dw)[NR][PF]) {
#pragma unroll
    for (int i = 0; i < PF; i++) {
#pragma unroll
        for (int r = 0; r < NR; r++) {
            w0[r][i] = w1[r][i] = 0;
            dw[r][i] = 0.0f;
            if (g0 + 8 * i < G) q8w_load<TYPE>(rows[r], g0 + 8 * i, sl, w0[r][i], w1[r][i], dw[r][i]);
        }
    }
}

/* acc[r] += those groups' products with the activations' (xv, dx), group by group: dot_row_q8's order. */
template <int NR, int PF>
__device__ __forceinline__ void q8_accumulate(int64_t g0, int64_t G, const int (&w0)[NR][PF], const int (&w1)[NR][PF],
                                              const float (&dw)[NR][PF], const int2 (&xv)[PF], const float (&dx)[PF],
                                              float (&acc)[NR]) {
#pragma unroll
    for (int i = 0; i < PF; i++) {
        if (g0 + 8 * i < G) {
#pragma unroll
            for (int r = 0; r < NR; r++) {
                const int isum = __dp4a(w1[r][i], xv[i].y, __dp4a(w0[r][i], xv[i].x, 0));
                acc[r] = __fadd_rn(acc[r], __fmul_rn(__fmul_rn(dw[r][i], dx[i]), (float)isum));
            }
        }
    }
}

/* out[i] = row i . xr (8-bit activation row) for NR rows, each in dot_row_q8's order. wait_after_first:
 * call cu_pdl_wait after the first weight loads (else the caller has waited already). */
template <int TYPE, int NR, int PF>
__device__ __forceinline__ void dot_rows_q8(const uint8_t *const *rows, const uint8_t *__restrict__ xr, int64_t cols,
                                            int lane, float *out, bool wait_after_first) {
    const int64_t G = cols >> 5;
    const int sl = lane & 3;
    float acc[NR];
#pragma unroll
    for (int r = 0; r < NR; r++) acc[r] = 0.0f;
    bool waited = !wait_after_first;
    for (int64_t g0 = lane >> 2; g0 < G; g0 += 8 * PF) {
        int w0[NR][PF], w1[NR][PF];
        float dw[NR][PF];
        q8w_load_batch<TYPE, NR, PF>(rows, g0, G, sl, w0, w1, dw);
        if (!waited) {
            cu_pdl_wait();
            waited = true;
        }
        int2 xv[PF];
        float dx[PF];
#pragma unroll
        for (int i = 0; i < PF; i++) {
            const int64_t g = g0 + 8 * i;
            xv[i] = make_int2(0, 0);
            dx[i] = 0.0f;
            if (g < G) {
                xv[i] = *(const int2 *)(xr + g * 32 + 8 * sl);
                dx[i] = ((const float *)(xr + cols))[g];
            }
        }
        q8_accumulate<NR, PF>(g0, G, w0, w1, dw, xv, dx, acc);
    }
    if (!waited) cu_pdl_wait();
#pragma unroll
    for (int r = 0; r < NR; r++) {
#pragma unroll
        for (int off = 16; off > 0; off >>= 1) acc[r] = __fadd_rn(acc[r], __shfl_xor_sync(0xffffffffu, acc[r], off));
        out[r] = acc[r];
    }
}

#define IS_Q8ACT(TYPE) ((TYPE) == STRATA_TYPE_Q8_0 || (TYPE) == STRATA_TYPE_Q4_0)

template <int TYPE>
__global__ void __launch_bounds__(MV_WARPS * 32)
k_matvec3_fast(mv3 m, int64_t row_bytes, int64_t cols, const void *x) {
    cu_pdl_trigger();
    const int lane = threadIdx.x & 31;
    int64_t r = (int64_t)blockIdx.x * MV_WARPS + (threadIdx.x >> 5);
    const uint8_t *w;
    float *y;
    if (!mv3_row(m, r, w, y)) {
        cu_pdl_wait();
        return;
    }
    const uint8_t *row = w + r * row_bytes;
    float v;
    if (IS_Q8ACT(TYPE)) {
        dot_rows_q8<TYPE, 1, 8>(&row, (const uint8_t *)x, cols, lane, &v, true);
    } else {
        cu_pdl_wait();
        v = dot_row<TYPE>(row, x, cols, lane);
    }
    if (lane == 0) y[r] = m.accumulate ? __fadd_rn(y[r], v) : v;
}

template <int TYPE>
__global__ void __launch_bounds__(MV_WARPS * 32)
k_expert_gate_up_fast(const uint8_t *const *__restrict__ wg, const uint8_t *const *__restrict__ wu, int64_t row_bytes,
                      int64_t F, int64_t D, const void *x, float *h) {
    cu_pdl_trigger();
    cu_pdl_wait(); /* the router kernel wrote wg and wu */
    const int lane = threadIdx.x & 31;
    const int64_t r = (int64_t)blockIdx.x * MV_WARPS + (threadIdx.x >> 5);
    if (r >= F) return;
    const int k = blockIdx.y;
    float gv, uv;
    if (IS_Q8ACT(TYPE)) {
        const uint8_t *rows[2] = {wg[k] + r * row_bytes, wu[k] + r * row_bytes};
        float o[2];
        dot_rows_q8<TYPE, 2, 4>(rows, (const uint8_t *)x, D, lane, o, false);
        gv = o[0];
        uv = o[1];
    } else {
        gv = dot_row<TYPE>(wg[k] + r * row_bytes, x, D, lane);
        uv = dot_row<TYPE>(wu[k] + r * row_bytes, x, D, lane);
    }
    if (lane == 0) h[(int64_t)k * F + r] = gq_swiglu(gv, uv);
}

template <int TYPE>
__global__ void k_expert_down_combine_fast(const uint8_t *const *__restrict__ wd, int64_t row_bytes, int64_t D,
                                           int64_t F, const uint8_t *h, int64_t hs_bytes,
                                           const float *__restrict__ wts, float *y, int K) {
    extern __shared__ float part[]; /* [DC_ROWS][K] */
    cu_pdl_trigger();
    cu_pdl_wait();
    const int lane = threadIdx.x & 31, k = threadIdx.x >> 5;
    const int64_t r0 = (int64_t)blockIdx.x * DC_ROWS;
    const void *hk = h + (int64_t)k * hs_bytes;
    if (IS_Q8ACT(TYPE) && r0 + DC_ROWS <= D) {
        const uint8_t *w = wd[k];
        const uint8_t *rows[DC_ROWS];
#pragma unroll
        for (int i = 0; i < DC_ROWS; i++) rows[i] = w + (r0 + i) * row_bytes;
        float o[DC_ROWS];
        dot_rows_q8<TYPE, DC_ROWS, 4>(rows, (const uint8_t *)hk, F, lane, o, false);
        if (lane == 0)
#pragma unroll
            for (int i = 0; i < DC_ROWS; i++) part[i * K + k] = o[i];
    } else {
        for (int i = 0; i < DC_ROWS; i++) {
            const int64_t r = r0 + i;
            if (r >= D) break;
            const float v = dot_row<TYPE>(wd[k] + r * row_bytes, hk, F, lane);
            if (lane == 0) part[i * K + k] = v;
        }
    }
    __syncthreads();
    dc_combine(part, wts, y, r0, D, K);
}

/* k_expert_down_combine_fast for 8-bit activations, reading h as floats (h: [K, hs] f32): each lane
 * quantizes the slices of h it multiplies (slice sl of group g: 8 values; the block's max over the 4
 * lanes of the quartet), with cu_q8_block's expression, so the products get the bits of
 * cuda_quantize_act followed by the kernel above, with one launch fewer. */
template <int TYPE>
__global__ void k_expert_down_combine_hq(const uint8_t *const *__restrict__ wd, int64_t row_bytes, int64_t D,
                                         int64_t F, const float *__restrict__ h, int64_t hs,
                                         const float *__restrict__ wts, float *y, int K) {
    extern __shared__ float part[]; /* [DC_ROWS][K] */
    cu_pdl_trigger();
    cu_pdl_wait();
    const int lane = threadIdx.x & 31, k = threadIdx.x >> 5;
    const int64_t r0 = (int64_t)blockIdx.x * DC_ROWS;
    const float *hk = h + (int64_t)k * hs;
    const uint8_t *w = wd[k];
    const uint8_t *rows[DC_ROWS];
#pragma unroll
    for (int i = 0; i < DC_ROWS; i++) rows[i] = w + (r0 + i < D ? r0 + i : D - 1) * row_bytes;
    const int64_t G = F >> 5;
    const int sl = lane & 3;
    constexpr int PF = 4;
    float acc[DC_ROWS];
#pragma unroll
    for (int r = 0; r < DC_ROWS; r++) acc[r] = 0.0f;
    /* every lane runs every pass (the quartets' shuffles), a lane's groups past the row's end hold zeros */
    for (int64_t base = 0; base < G; base += 8 * PF) {
        const int64_t g0 = base + (lane >> 2);
        int w0[DC_ROWS][PF], w1[DC_ROWS][PF];
        float dw[DC_ROWS][PF];
        q8w_load_batch<TYPE, DC_ROWS, PF>(rows, g0, G, sl, w0, w1, dw);
        float4 ha[PF], hb[PF];
#pragma unroll
        for (int i = 0; i < PF; i++) {
            ha[i] = hb[i] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            if (g0 + 8 * i < G) {
                const float4 *hp = (const float4 *)(hk + (g0 + 8 * i) * 32 + sl * 8);
                ha[i] = hp[0];
                hb[i] = hp[1];
            }
        }
        int2 xv[PF];
        float dx[PF];
#pragma unroll
        for (int i = 0; i < PF; i++) {
            const float v[8] = {ha[i].x, ha[i].y, ha[i].z, ha[i].w, hb[i].x, hb[i].y, hb[i].z, hb[i].w};
            float amax = 0.0f;
#pragma unroll
            for (int j = 0; j < 8; j++) amax = fmaxf(amax, fabsf(v[j]));
            /* every lane takes part (a quartet past the row's end holds zeros) */
            amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, 1));
            amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, 2));
            const float d = amax / 127.0f;
            const float id = d != 0.0f ? 1.0f / d : 0.0f;
            uint32_t b[8];
#pragma unroll
            for (int j = 0; j < 8; j++) b[j] = (uint32_t)(uint8_t)(int8_t)roundf(__fmul_rn(v[j], id));
            xv[i].x = (int)(b[0] | (b[1] << 8) | (b[2] << 16) | (b[3] << 24));
            xv[i].y = (int)(b[4] | (b[5] << 8) | (b[6] << 16) | (b[7] << 24));
            dx[i] = __half2float(__float2half_rn(d));
        }
        q8_accumulate<DC_ROWS, PF>(g0, G, w0, w1, dw, xv, dx, acc);
    }
#pragma unroll
    for (int r = 0; r < DC_ROWS; r++) {
#pragma unroll
        for (int off = 16; off > 0; off >>= 1) acc[r] = __fadd_rn(acc[r], __shfl_xor_sync(0xffffffffu, acc[r], off));
    }
    if (lane == 0)
#pragma unroll
        for (int i = 0; i < DC_ROWS; i++) part[i * K + k] = acc[i];
    __syncthreads();
    dc_combine(part, wts, y, r0, D, K);
}

/* Decode, F32 router (cuda_norm_matvec_f32): xn = rmsnorm(x) * nw in every block (k_rmsnorm's bits, the
 * reduction of k_rmsnorm_fast), kept in shared memory, then warp w of block b takes row 8 b + w of W (F32,
 * dot_row_f's order). Block b also writes the blocks of 32 values c with c % gridDim.x == b of xn, and
 * of their 8-bit quantization into q when q is given (cu_q8_block: k_quantize_q8's bits), for the
 * experts. The weights' first groups are loaded before waiting for the kernel before. */
#define NRM_PF 8
/* TOPK: the router's top-k too, in the launch's last block to finish (cnt: a device counter at 0, put
 * back to 0 by that block): cu_router_topk_warp on the logits, the bits of k_router_topk_fast. */
template <bool TOPK>
__global__ void __launch_bounds__(RMS_THREADS)
k_norm_matvec_f32(const float *x, const float *nw, float *xn, uint8_t *q, const float *W, int64_t rows, int D,
                  float eps, float *y, int K, int32_t *ids, float *weights, const void *const *table,
                  const void **seg_w, int seg_cap, int32_t *seg_tok, int32_t *seg_out, int64_t seg_half, int *cnt) {
    __shared__ __align__(16) float xs[RMS_THREADS * RMS_MAXV];
    __shared__ float sh[RMS_THREADS];
    cu_pdl_trigger();
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int64_t r = (int64_t)blockIdx.x * (RMS_THREADS / 32) + warp;
    const int64_t G = D >> 5;
    const int sl = lane & 3;
    const float *row = W + (r < rows ? r : 0) * (int64_t)D;
    /* first batch of the row's weights, and the norm's weights */
    float4 wa[NRM_PF], wb[NRM_PF];
#pragma unroll
    for (int i = 0; i < NRM_PF; i++) {
        const int64_t g = (lane >> 2) + 8 * i;
        wa[i] = wb[i] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        if (r < rows && g < G) {
            const float4 *wp = (const float4 *)(row + g * 32 + sl * 8);
            wa[i] = __ldg(wp);
            wb[i] = __ldg(wp + 1);
        }
    }
    float nv[RMS_MAXV];
    rms_load_weights(nw, D, nv);
    cu_pdl_wait();
    float xv[RMS_MAXV];
    const float scale = rms_load_scale(x, D, eps, xv, sh);
#pragma unroll
    for (int j = 0; j < RMS_MAXV; j++) {
        const int i = tid + j * RMS_THREADS;
        const int c = warp + j * (RMS_THREADS / 32); /* block of 32 of value i; warp-uniform */
        if (c < D / 32) {
            const float v = __fmul_rn(__fmul_rn(xv[j], scale), nv[j]);
            xs[i] = v;
            if (c % (int)gridDim.x == (int)blockIdx.x) {
                xn[i] = v;
                if (q) cu_q8_block(v, q, c, lane, D);
            }
        }
    }
    __syncthreads();
    if (r < rows) {
    float acc = 0.0f;
    for (int64_t g0 = lane >> 2; g0 < G; g0 += 8 * NRM_PF) {
        if (g0 != (lane >> 2)) { /* later batches (rows longer than 8 * NRM_PF groups) */
#pragma unroll
            for (int i = 0; i < NRM_PF; i++) {
                const int64_t g = g0 + 8 * i;
                if (g < G) {
                    const float4 *wp = (const float4 *)(row + g * 32 + sl * 8);
                    wa[i] = __ldg(wp);
                    wb[i] = __ldg(wp + 1);
                }
            }
        }
#pragma unroll
        for (int i = 0; i < NRM_PF; i++) {
            const int64_t g = g0 + 8 * i;
            if (g < G) {
                const float4 a = *(const float4 *)(xs + g * 32 + sl * 8), b = *(const float4 *)(xs + g * 32 + sl * 8 + 4);
                float s = acc;
                s = __fadd_rn(s, __fmul_rn(wa[i].x, a.x));
                s = __fadd_rn(s, __fmul_rn(wa[i].y, a.y));
                s = __fadd_rn(s, __fmul_rn(wa[i].z, a.z));
                s = __fadd_rn(s, __fmul_rn(wa[i].w, a.w));
                s = __fadd_rn(s, __fmul_rn(wb[i].x, b.x));
                s = __fadd_rn(s, __fmul_rn(wb[i].y, b.y));
                s = __fadd_rn(s, __fmul_rn(wb[i].z, b.z));
                s = __fadd_rn(s, __fmul_rn(wb[i].w, b.w));
                acc = s;
            }
        }
    }
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) acc = __fadd_rn(acc, __shfl_xor_sync(0xffffffffu, acc, off));
    if (lane == 0) y[r] = acc;
    }
    if (TOPK) {
        __shared__ int last;
        __threadfence(); /* this block's logits are visible before the counter says so */
        __syncthreads();
        if (tid == 0) last = atomicAdd(cnt, 1) == (int)gridDim.x - 1;
        __syncthreads();
        if (!last) return;
        __threadfence();
        if (warp == 0) {
            cu_router_topk_warp<true>(y, 0, (int)rows, K, lane, ids, weights, table, seg_w, seg_cap, seg_tok, seg_out,
                                      seg_half);
            if (lane == 0) *cnt = 0; /* for the next launch (stream-ordered after this one) */
        }
    }
}

template <int TOK>
static strata_status launch(cuda_ctx *ctx, int32_t type, const void *w, const void *const *w_ptrs, int64_t rows,
                            int64_t cols, const void *x, int64_t xs, const int32_t *tok, const int32_t *outr,
                            float *y, int64_t ys, int64_t units, int32_t T, int32_t accumulate) {
    /* xs counts floats for float activations, bytes for quantized ones */
    const int64_t xrow_bytes = cuda_act_type(type) == STRATA_TYPE_F32 ? xs * 4 : xs;
    const int64_t rb = gq_row_bytes(type, cols);
    const uint8_t *W = (const uint8_t *)w;
    const uint8_t *const *P = (const uint8_t *const *)w_ptrs;
    cudaStream_t s = CU_COMPUTE(ctx);
    /* grid.y is limited to 65535: launch in slices of units */
    for (int64_t u0 = 0; u0 < units; u0 += 65535) {
        const int64_t nu = units - u0 < 65535 ? units - u0 : 65535;
        dim3 grid(cu_blocks(rows, MV_WARPS), (unsigned)nu);
        const uint8_t *const *Pu = P ? P + u0 : NULL;
        const int32_t *tu = tok ? tok + u0 * TOK : NULL;
        const int32_t *ou = outr ? outr + u0 * TOK : NULL;
        /* plain mode: shift x and y by the tokens of earlier slices */
        const void *xu = P ? x : (const void *)((const uint8_t *)x + u0 * TOK * xrow_bytes);
        float *yu = P ? y : y + u0 * TOK * ys;
        const int Tu = P ? T : (int)(T - u0 * TOK);
#define MV_CASE(TY)                                                                                          \
    case TY:                                                                                                 \
        k_matvec<TY, TOK><<<grid, MV_WARPS * 32, 0, s>>>(W, Pu, rb, rows, cols, (const float *)xu, xs, tu, ou, yu, \
                                                         ys, Tu, accumulate);                                \
        break;
#define MV_CASE_Q8(TY)                                                                                       \
    case TY:                                                                                                 \
        k_matvec_q8<TY, TOK><<<grid, MV_WARPS * 32, 0, s>>>(W, Pu, rb, rows, cols, (const uint8_t *)xu, xs, tu, \
                                                            ou, yu, ys, Tu, accumulate);                     \
        break;
        switch (type) {
            MV_CASE(STRATA_TYPE_F32)
            MV_CASE(STRATA_TYPE_F16)
            MV_CASE(STRATA_TYPE_BF16)
            MV_CASE_Q8(STRATA_TYPE_Q8_0)
            MV_CASE_Q8(STRATA_TYPE_Q4_0)
            MV_CASE(STRATA_TYPE_Q4_K)
            MV_CASE(STRATA_TYPE_Q6_K)
        default:
            snprintf(ctx->err, sizeof ctx->err,
                     "CUDA: the device kernels do not run tensor type %d (they run F32, F16, BF16, Q8_0, Q4_0, "
                     "Q4_K and Q6_K)", type);
            return STRATA_ERR_UNSUPPORTED;
        }
#undef MV_CASE
#undef MV_CASE_Q8
        CU_LAUNCHED(ctx, "matvec");
    }
    return STRATA_OK;
}

static int shape_ok(int32_t type, int64_t cols) {
    const int blk = (type == STRATA_TYPE_Q4_K || type == STRATA_TYPE_Q6_K) ? 256 : 32;
    return cols > 0 && cols % blk == 0;
}

extern "C" {

int32_t cuda_type_supported(int32_t type) { return gq_row_bytes(type, 256) > 0; }

int32_t cuda_act_type(int32_t type) {
    return (type == STRATA_TYPE_Q8_0 || type == STRATA_TYPE_Q4_0) ? STRATA_TYPE_Q8_0 : STRATA_TYPE_F32;
}

int64_t cuda_act_row_bytes(int32_t type, int64_t cols) {
    return cuda_act_type(type) == STRATA_TYPE_Q8_0 ? cols + cols / 8 : cols * 4;
}

strata_status cuda_quantize_act(cuda_ctx *ctx, int32_t type, const float *x, int64_t x_stride, void *q,
                                int64_t q_stride, int64_t cols, int32_t T) {
    if (T <= 0) return STRATA_OK;
    if (cuda_act_type(type) != STRATA_TYPE_Q8_0) return STRATA_ERR_INVALID_ARGUMENT;
    if (cols % 32) return STRATA_ERR_INVALID_ARGUMENT;
    /* grid.y is limited to 65535 rows (a chunk's T * K expert rows can exceed it): slices of rows */
    for (int32_t t0 = 0; t0 < T; t0 += 65535) {
        const int32_t n = T - t0 < 65535 ? T - t0 : 65535;
        dim3 grid(cu_blocks(cols / 32, 8), (unsigned)n);
        k_quantize_q8<<<grid, 256, 0, CU_COMPUTE(ctx)>>>(x + (int64_t)t0 * x_stride, x_stride,
                                                         (uint8_t *)q + (int64_t)t0 * q_stride, q_stride, cols);
        CU_LAUNCHED(ctx, "activation quantization");
    }
    return STRATA_OK;
}

strata_status cuda_matvec(cuda_ctx *ctx, int32_t type, const void *w, int64_t rows, int64_t cols, const void *x,
                          int64_t x_stride, float *y, int64_t y_stride, int32_t T, int32_t accumulate) {
    if (T <= 0 || rows <= 0) return STRATA_OK;
    if (!shape_ok(type, cols)) return STRATA_ERR_INVALID_ARGUMENT;
    if (T == 1) return launch<1>(ctx, type, w, NULL, rows, cols, x, x_stride, NULL, NULL, y, y_stride, 1, T, accumulate);
    return launch<8>(ctx, type, w, NULL, rows, cols, x, x_stride, NULL, NULL, y, y_stride, (T + 7) / 8, T,
                     accumulate);
}

strata_status cuda_matvec3(cuda_ctx *ctx, int32_t type, const void *const w[3], const int64_t rows[3], int64_t cols,
                           const void *x, float *const y[3], int32_t accumulate) {
    if (!shape_ok(type, cols)) return STRATA_ERR_INVALID_ARGUMENT;
    mv3 m;
    m.accumulate = accumulate;
    int64_t total = 0;
    for (int i = 0; i < 3; i++) {
        m.w[i] = (const uint8_t *)w[i];
        m.y[i] = y[i];
        m.rows[i] = w[i] ? rows[i] : 0;
        total += m.rows[i];
    }
    if (total <= 0) return STRATA_OK;
    const int64_t rb = gq_row_bytes(type, cols);
    cudaStream_t s = CU_COMPUTE(ctx);
    const int fast = ctx->fast & CUDA_FAST_MATVEC3;
#define M3_CASE(TY)                                                                                          \
    case TY:                                                                                                 \
        if (fast)                                                                                            \
            CU_TRY(ctx, cu_launch(ctx, k_matvec3_fast<TY>, dim3(cu_blocks(total, MV_WARPS)), dim3(MV_WARPS * 32), 0, \
                                  m, rb, cols, x),                                                           \
                   "launching matvec of three matrices");                                                   \
        else                                                                                                 \
            k_matvec3<TY><<<cu_blocks(total, MV_WARPS), MV_WARPS * 32, 0, s>>>(m, rb, cols, x);              \
        break;
    switch (type) {
        M3_CASE(STRATA_TYPE_F32)
        M3_CASE(STRATA_TYPE_F16)
        M3_CASE(STRATA_TYPE_BF16)
        M3_CASE(STRATA_TYPE_Q8_0)
        M3_CASE(STRATA_TYPE_Q4_0)
        M3_CASE(STRATA_TYPE_Q4_K)
        M3_CASE(STRATA_TYPE_Q6_K)
    default:
        return STRATA_ERR_UNSUPPORTED;
    }
#undef M3_CASE
    CU_LAUNCHED(ctx, "matvec of three matrices");
    return STRATA_OK;
}

strata_status cuda_expert_gate_up(cuda_ctx *ctx, int32_t type, const void *const *wg, const void *const *wu,
                                  int64_t F, int64_t D, const void *x, float *h, int32_t K) {
    if (K <= 0 || F <= 0) return STRATA_OK;
    if (!shape_ok(type, D) || K > 65535) return STRATA_ERR_INVALID_ARGUMENT;
    const int64_t rb = gq_row_bytes(type, D);
    dim3 grid(cu_blocks(F, MV_WARPS), (unsigned)K);
    const uint8_t *const *G = (const uint8_t *const *)wg, *const *U = (const uint8_t *const *)wu;
    cudaStream_t s = CU_COMPUTE(ctx);
    const int fast = ctx->fast & CUDA_FAST_GATE_UP;
#define GU_CASE(TY)                                                                                    \
    case TY:                                                                                           \
        if (fast)                                                                                      \
            CU_TRY(ctx, cu_launch(ctx, k_expert_gate_up_fast<TY>, grid, dim3(MV_WARPS * 32), 0, G, U, rb, F, D, x, h), \
                   "launching expert gate and up");                                                   \
        else                                                                                           \
            k_expert_gate_up<TY><<<grid, MV_WARPS * 32, 0, s>>>(G, U, rb, F, D, x, h);                \
        break;
    switch (type) {
        GU_CASE(STRATA_TYPE_F32)
        GU_CASE(STRATA_TYPE_F16)
        GU_CASE(STRATA_TYPE_BF16)
        GU_CASE(STRATA_TYPE_Q8_0)
        GU_CASE(STRATA_TYPE_Q4_0)
        GU_CASE(STRATA_TYPE_Q4_K)
        GU_CASE(STRATA_TYPE_Q6_K)
    default:
        return STRATA_ERR_UNSUPPORTED;
    }
#undef GU_CASE
    CU_LAUNCHED(ctx, "expert gate and up");
    return STRATA_OK;
}

strata_status cuda_expert_down_combine(cuda_ctx *ctx, int32_t type, const void *const *wd, int64_t D, int64_t F,
                                       const void *h, int64_t h_stride, const float *weights, float *y, int32_t K) {
    if (K <= 0 || D <= 0) return STRATA_OK;
    if (!shape_ok(type, F) || K > 32) return STRATA_ERR_INVALID_ARGUMENT;
    const int64_t rb = gq_row_bytes(type, F);
    /* h_stride counts floats for float activations, bytes for quantized ones */
    const int64_t hs = cuda_act_type(type) == STRATA_TYPE_F32 ? h_stride * 4 : h_stride;
    const uint8_t *const *W = (const uint8_t *const *)wd;
    const size_t shm = (size_t)DC_ROWS * K * sizeof(float);
    cudaStream_t s = CU_COMPUTE(ctx);
    const int fast = ctx->fast & CUDA_FAST_DOWN;
#define DC_CASE(TY)                                                                                              \
    case TY:                                                                                                     \
        if (fast)                                                                                                \
            CU_TRY(ctx, cu_launch(ctx, k_expert_down_combine_fast<TY>, dim3(cu_blocks(D, DC_ROWS)), dim3(32 * K), shm, \
                                  W, rb, D, F, (const uint8_t *)h, hs, weights, y, (int)K),                      \
                   "launching expert down and combine");                                                        \
        else                                                                                                     \
            k_expert_down_combine<TY><<<cu_blocks(D, DC_ROWS), 32 * K, shm, s>>>(W, rb, D, F, (const uint8_t *)h, hs, \
                                                                                 weights, y, K);                 \
        break;
    switch (type) {
        DC_CASE(STRATA_TYPE_F32)
        DC_CASE(STRATA_TYPE_F16)
        DC_CASE(STRATA_TYPE_BF16)
        DC_CASE(STRATA_TYPE_Q8_0)
        DC_CASE(STRATA_TYPE_Q4_0)
        DC_CASE(STRATA_TYPE_Q4_K)
        DC_CASE(STRATA_TYPE_Q6_K)
    default:
        return STRATA_ERR_UNSUPPORTED;
    }
#undef DC_CASE
    CU_LAUNCHED(ctx, "expert down and combine");
    return STRATA_OK;
}

strata_status cuda_expert_down_combine_hq(cuda_ctx *ctx, int32_t type, const void *const *wd, int64_t D, int64_t F,
                                          const float *h, int64_t h_stride, const float *weights, float *y, int32_t K) {
    if (K <= 0 || D <= 0) return STRATA_OK;
    if (cuda_act_type(type) != STRATA_TYPE_Q8_0 || F % 32 || K > 32 || h_stride % 4) return STRATA_ERR_INVALID_ARGUMENT;
    const int64_t rb = gq_row_bytes(type, F);
    const uint8_t *const *W = (const uint8_t *const *)wd;
    const size_t shm = (size_t)DC_ROWS * K * sizeof(float);
    const dim3 grid(cu_blocks(D, DC_ROWS)), block(32 * K);
    cudaError_t e = type == STRATA_TYPE_Q8_0
                        ? cu_launch(ctx, k_expert_down_combine_hq<STRATA_TYPE_Q8_0>, grid, block, shm, W, rb, D, F, h,
                                    h_stride, weights, y, (int)K)
                        : cu_launch(ctx, k_expert_down_combine_hq<STRATA_TYPE_Q4_0>, grid, block, shm, W, rb, D, F, h,
                                    h_stride, weights, y, (int)K);
    CU_TRY(ctx, e, "launching expert down and combine");
    return STRATA_OK;
}

strata_status cuda_norm_matvec_f32(cuda_ctx *ctx, const float *x, const float *nw, float *xn, void *q, const float *w,
                                  int64_t rows, int32_t D, float eps, float *y) {
    if (rows <= 0) return STRATA_OK;
    if (D % 32 || D > RMS_THREADS * RMS_MAXV) return STRATA_ERR_INVALID_ARGUMENT;
    const unsigned blocks = cu_blocks(rows, RMS_THREADS / 32);
    CU_TRY(ctx, cu_launch(ctx, k_norm_matvec_f32<false>, dim3(blocks), dim3(RMS_THREADS), 0, x, nw, xn, (uint8_t *)q, w,
                          rows, (int)D, eps, y, 0, (int32_t *)NULL, (float *)NULL, (const void *const *)NULL,
                          (const void **)NULL, 0, (int32_t *)NULL, (int32_t *)NULL, (int64_t)0, (int *)NULL),
           "launching rmsnorm and router product");
    return STRATA_OK;
}

strata_status cuda_norm_router_topk_f32(cuda_ctx *ctx, const float *x, const float *nw, float *xn, void *q,
                                        const float *w, int32_t E, int32_t D, float eps, float *logits, int32_t K,
                                        int32_t *ids, float *weights, const void *const *table, const void **seg_w,
                                        int32_t seg_cap, int32_t *seg_tok, int32_t *seg_out, int64_t seg_half,
                                        int32_t *cnt) {
    if (D % 32 || D > RMS_THREADS * RMS_MAXV || E <= 0 || E > 32 * RT_MAXE || K <= 0 || K > 32 || K > E ||
        K > seg_cap || K > seg_half)
        return STRATA_ERR_INVALID_ARGUMENT;
    const unsigned blocks = cu_blocks(E, RMS_THREADS / 32);
    CU_TRY(ctx, cu_launch(ctx, k_norm_matvec_f32<true>, dim3(blocks), dim3(RMS_THREADS), 0, x, nw, xn, (uint8_t *)q, w,
                          (int64_t)E, (int)D, eps, logits, (int)K, ids, weights, table, seg_w, (int)seg_cap, seg_tok,
                          seg_out, seg_half, (int *)cnt),
           "launching rmsnorm, router product and top-k");
    return STRATA_OK;
}

strata_status cuda_matvec_segments(cuda_ctx *ctx, int32_t type, const void *const *w_ptrs, int64_t rows,
                                   int64_t cols, const void *x, int64_t x_stride, const int32_t *tok,
                                   const int32_t *out_rows, float *y, int64_t y_stride, int32_t n_segments,
                                   int32_t seg_tokens) {
    if (n_segments <= 0 || rows <= 0) return STRATA_OK;
    if (!shape_ok(type, cols)) return STRATA_ERR_INVALID_ARGUMENT;
    if (seg_tokens == 1)
        return launch<1>(ctx, type, NULL, w_ptrs, rows, cols, x, x_stride, tok, out_rows, y, y_stride, n_segments, 0, 0);
    if (seg_tokens == CUDA_SEG_TOKENS)
        return launch<CUDA_SEG_TOKENS>(ctx, type, NULL, w_ptrs, rows, cols, x, x_stride, tok, out_rows, y, y_stride,
                                       n_segments, 0, 0);
    return STRATA_ERR_INVALID_ARGUMENT;
}

} /* extern "C" */
