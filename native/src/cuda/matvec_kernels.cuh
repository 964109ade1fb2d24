/*
 * matvec_kernels.cuh — the matrix-vector kernels of matvec.cu as templates over the weight type, shared by
 * matvec.cu (F32, F16, BF16, Q8_0, Q4_0, Q4_K, Q6_K) and matvec_types.cu (the types of
 * group_dequant_types.h), and the table of one type's kernels (mv_kernels) through which matvec.cu
 * dispatches. See matvec.cu for the kernels' order of operations.
 */
#ifndef STRATA_CUDA_MATVEC_KERNELS_CUH
#define STRATA_CUDA_MATVEC_KERNELS_CUH

#include "common.cuh"
#include "../group_dequant.h"

#define MV_WARPS 4 /* rows per block */

/* The sum of v over the warp, left in every lane: the butterfly every kernel below ends a row with. */
__device__ __forceinline__ float mv_warp_sum(float v) {
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) v = __fadd_rn(v, __shfl_xor_sync(0xffffffffu, v, off));
    return v;
}

/* The x row and y row of each of the TOK tokens of a unit of k_matvec / k_matvec_q8 (-1 = none).
 * plain (segments false): tokens unit*TOK .. of x into the same rows of y.
 * segments: unit u has its own weights w_ptrs[u] and up to TOK tokens tok[u*TOK + t] (-1 = none)
 * whose results go to rows outr[u*TOK + t] of y. */
template <int TOK>
__device__ __forceinline__ void mv_token_rows(bool segments, const int32_t *__restrict__ tok,
                                              const int32_t *__restrict__ outr, int64_t unit, int T,
                                              int64_t (&xrow)[TOK], int64_t (&yrow)[TOK]) {
#pragma unroll
    for (int t = 0; t < TOK; t++) {
        if (segments) {
            xrow[t] = tok[unit * TOK + t];
            yrow[t] = xrow[t] < 0 ? -1 : outr[unit * TOK + t];
        } else {
            const int64_t tt = unit * TOK + t;
            xrow[t] = tt < T ? tt : -1;
            yrow[t] = xrow[t];
        }
    }
}

/* The end of k_matvec / k_matvec_q8: each token's total over the warp, which lane t writes to row r of
 * token t's y row (every lane holds every total after the butterfly); y += with accumulate, else y =. */
template <int TOK>
__device__ __forceinline__ void mv_store(float (&acc)[TOK], int lane, float *__restrict__ y, int64_t ys,
                                         const int64_t (&yrow)[TOK], int64_t r, int accumulate) {
#pragma unroll
    for (int t = 0; t < TOK; t++) acc[t] = mv_warp_sum(acc[t]);
#pragma unroll
    for (int t = 0; t < TOK; t++) {
        if (lane == t && yrow[t] >= 0) {
            float *yp = y + yrow[t] * ys + r;
            *yp = accumulate ? __fadd_rn(*yp, acc[t]) : acc[t];
        }
    }
}

/* s + w[0] x[0] + .. + w[7] x[7], in that order, each operation rounded on its own: a lane's slice of a
 * group against 8 float activations (16-byte aligned). */
__device__ __forceinline__ float mv_dot8(float s, const float (&w)[8], const float *__restrict__ x8) {
    const float4 *xp = (const float4 *)x8;
    const float4 a = __ldg(xp), b = __ldg(xp + 1);
    s = __fadd_rn(s, __fmul_rn(w[0], a.x));
    s = __fadd_rn(s, __fmul_rn(w[1], a.y));
    s = __fadd_rn(s, __fmul_rn(w[2], a.z));
    s = __fadd_rn(s, __fmul_rn(w[3], a.w));
    s = __fadd_rn(s, __fmul_rn(w[4], b.x));
    s = __fadd_rn(s, __fmul_rn(w[5], b.y));
    s = __fadd_rn(s, __fmul_rn(w[6], b.z));
    s = __fadd_rn(s, __fmul_rn(w[7], b.w));
    return s;
}

template <int TYPE, int TOK>
__global__ void __launch_bounds__(MV_WARPS * 32)
k_matvec(const uint8_t *__restrict__ W, const uint8_t *const *__restrict__ w_ptrs, int64_t row_bytes, int64_t rows,
         int64_t cols, const float *__restrict__ x, int64_t xs, const int32_t *__restrict__ tok,
         const int32_t *__restrict__ outr, float *__restrict__ y, int64_t ys, int T, int accumulate) {
    const int lane = threadIdx.x & 31;
    const int64_t r = (int64_t)blockIdx.x * MV_WARPS + (threadIdx.x >> 5);
    if (r >= rows) return;
    /* plain (w_ptrs == NULL) or segments: see mv_token_rows */
    const int64_t unit = blockIdx.y;
    const uint8_t *row = (w_ptrs ? w_ptrs[unit] : W) + r * row_bytes;
    int64_t xrow[TOK], yrow[TOK];
    mv_token_rows<TOK>(w_ptrs != NULL, tok, outr, unit, T, xrow, yrow);

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
            if (xrow[t] >= 0) acc[t] = mv_dot8(acc[t], w, x + xrow[t] * xs + g * 32 + sl * 8);
        }
    }
    mv_store<TOK>(acc, lane, y, ys, yrow, r, accumulate);
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

/* acc + (dw * dx) * isum: lane slice sl of group g (weights w0, w1, scale dw from q8w_load) against the
 * 8-bit activation row xr (cols int8 values, then cols / 32 float scales): an exact integer dot of 8. */
__device__ __forceinline__ float q8_add(float acc, int w0, int w1, float dw, const uint8_t *__restrict__ xr,
                                        int64_t cols, int64_t g, int sl) {
    const int2 xv = *(const int2 *)(xr + g * 32 + 8 * sl);
    const float dx = ((const float *)(xr + cols))[g];
    const int isum = __dp4a(w1, xv.y, __dp4a(w0, xv.x, 0));
    return __fadd_rn(acc, __fmul_rn(__fmul_rn(dw, dx), (float)isum));
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
    mv_token_rows<TOK>(w_ptrs != NULL, tok, outr, unit, T, xrow, yrow);
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
            if (xrow[t] >= 0) acc[t] = q8_add(acc[t], w0, w1, dw, xq + xrow[t] * xs, cols, g, sl);
        }
    }
    mv_store<TOK>(acc, lane, y, ys, yrow, r, accumulate);
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
        acc = mv_dot8(acc, w, x + g * 32 + sl * 8);
    }
    return mv_warp_sum(acc);
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
        acc = q8_add(acc, w0, w1, dw, xr, cols, g, sl);
    }
    return mv_warp_sum(acc);
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
    for (int r = 0; r < NR; r++) out[r] = mv_warp_sum(acc[r]);
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
    for (int r = 0; r < DC_ROWS; r++) acc[r] = mv_warp_sum(acc[r]);
    if (lane == 0)
#pragma unroll
        for (int i = 0; i < DC_ROWS; i++) part[i * K + k] = acc[i];
    __syncthreads();
    dc_combine(part, wts, y, r0, D, K);
}

/* ---- one type's kernels, for table-driven dispatch ---------------------------------------------- */

static_assert(CUDA_SEG_TOKENS == 8, "launch<TOK> takes the kernels of 1 and 8 tokens");
typedef void (*mv_plain_fn)(const uint8_t *, const uint8_t *const *, int64_t, int64_t, int64_t, const float *, int64_t,
                            const int32_t *, const int32_t *, float *, int64_t, int, int);
typedef void (*mv_q8_fn)(const uint8_t *, const uint8_t *const *, int64_t, int64_t, int64_t, const uint8_t *, int64_t,
                         const int32_t *, const int32_t *, float *, int64_t, int, int);
typedef void (*mv3_fn)(mv3, int64_t, int64_t, const void *);
typedef void (*mv_gu_fn)(const uint8_t *const *, const uint8_t *const *, int64_t, int64_t, int64_t, const void *,
                         float *);
typedef void (*mv_dc_fn)(const uint8_t *const *, int64_t, int64_t, int64_t, const uint8_t *, int64_t, const float *,
                         float *, int);
/* The kernels of one weight type: float activations (mv1 / mv8: 1 and 8 tokens) or 8-bit ones (mq1 / mq8),
 * the three-matrix decode product, expert gate and up, expert down and combine; *_fast: the
 * latency-tuned forms (ctx->fast), the same bits. */
struct mv_kernels {
    int32_t type;
    mv_plain_fn mv1, mv8;
    mv_q8_fn mq1, mq8;
    mv3_fn m3, m3_fast;
    mv_gu_fn gu, gu_fast;
    mv_dc_fn dc, dc_fast;
};
#define MV_KERNELS_COMMON(TY)                                                                                \
    k_matvec3<TY>, k_matvec3_fast<TY>, k_expert_gate_up<TY>, k_expert_gate_up_fast<TY>, k_expert_down_combine<TY>, \
        k_expert_down_combine_fast<TY>
/* a type with float activations / with 8-bit activations */
#define MV_KERNELS_F(TY) {TY, k_matvec<TY, 1>, k_matvec<TY, 8>, NULL, NULL, MV_KERNELS_COMMON(TY)}
#define MV_KERNELS_Q8(TY) {TY, NULL, NULL, k_matvec_q8<TY, 1>, k_matvec_q8<TY, 8>, MV_KERNELS_COMMON(TY)}

/* matvec_types.cu's table: the types of GQ_NEW_TYPES */
extern const mv_kernels cuda_mv_types[];
extern const int cuda_mv_types_n;

#endif
