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
#include "matvec_kernels.cuh"
#include "rms.cuh"
#include "router_topk.cuh"
#include "../group_dequant.h"

/* x [T, cols] f32 -> [T, cols int8 | cols/32 f32] with the host engine's Q8_0 activation rounding */
__global__ void k_quantize_q8(const float *x, int64_t xs, uint8_t *q, int64_t qs_stride, int64_t cols) {
    const int64_t t = blockIdx.y;
    const int lane = threadIdx.x & 31;
    const int64_t b = (int64_t)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (b >= cols / 32) return;
    cu_q8_block(x[t * xs + b * 32 + lane], q + t * qs_stride, b, lane, cols);
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
    acc = mv_warp_sum(acc);
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

/* The kernels of the types this file instantiates; with matvec_types.cu's, every type of GQ_DEVICE_TYPES. */
static const mv_kernels k_mv_base[] = {
    MV_KERNELS_F(STRATA_TYPE_F32),  MV_KERNELS_F(STRATA_TYPE_F16),  MV_KERNELS_F(STRATA_TYPE_BF16),
    MV_KERNELS_Q8(STRATA_TYPE_Q8_0), MV_KERNELS_Q8(STRATA_TYPE_Q4_0), MV_KERNELS_F(STRATA_TYPE_Q4_K),
    MV_KERNELS_F(STRATA_TYPE_Q6_K),
};

/* The kernels of a weight type; NULL for a type the device does not run. */
static const mv_kernels *mv_find(int32_t type) {
    for (size_t i = 0; i < sizeof k_mv_base / sizeof k_mv_base[0]; i++)
        if (k_mv_base[i].type == type) return &k_mv_base[i];
    for (int i = 0; i < cuda_mv_types_n; i++)
        if (cuda_mv_types[i].type == type) return &cuda_mv_types[i];
    return NULL;
}

static strata_status not_run(cuda_ctx *ctx, int32_t type) {
    snprintf(ctx->err, sizeof ctx->err, "CUDA: the device kernels do not run tensor type %d", type);
    return STRATA_ERR_UNSUPPORTED;
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
    const mv_kernels *k = mv_find(type);
    if (!k) return not_run(ctx, type);
    const mv_plain_fn kf = TOK == 1 ? k->mv1 : k->mv8;
    const mv_q8_fn kq = TOK == 1 ? k->mq1 : k->mq8;
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
        if (kq)
            kq<<<grid, MV_WARPS * 32, 0, s>>>(W, Pu, rb, rows, cols, (const uint8_t *)xu, xs, tu, ou, yu, ys, Tu, accumulate);
        else
            kf<<<grid, MV_WARPS * 32, 0, s>>>(W, Pu, rb, rows, cols, (const float *)xu, xs, tu, ou, yu, ys, Tu, accumulate);
        CU_LAUNCHED(ctx, "matvec");
    }
    return STRATA_OK;
}

static int shape_ok(int32_t type, int64_t cols) { return gq_shape_ok(type, cols); }

extern "C" {

int32_t cuda_type_supported(int32_t type) { return mv_find(type) != NULL; }

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
    const mv_kernels *k = mv_find(type);
    if (!k) return STRATA_ERR_UNSUPPORTED;
    if (fast)
        CU_TRY(ctx, cu_launch(ctx, k->m3_fast, dim3(cu_blocks(total, MV_WARPS)), dim3(MV_WARPS * 32), 0, m, rb, cols, x),
               "launching matvec of three matrices");
    else
        k->m3<<<cu_blocks(total, MV_WARPS), MV_WARPS * 32, 0, s>>>(m, rb, cols, x);
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
    const mv_kernels *k = mv_find(type);
    if (!k) return STRATA_ERR_UNSUPPORTED;
    if (fast)
        CU_TRY(ctx, cu_launch(ctx, k->gu_fast, grid, dim3(MV_WARPS * 32), 0, G, U, rb, F, D, x, h),
               "launching expert gate and up");
    else
        k->gu<<<grid, MV_WARPS * 32, 0, s>>>(G, U, rb, F, D, x, h);
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
    const mv_kernels *k = mv_find(type);
    if (!k) return STRATA_ERR_UNSUPPORTED;
    if (fast)
        CU_TRY(ctx, cu_launch(ctx, k->dc_fast, dim3(cu_blocks(D, DC_ROWS)), dim3(32 * K), shm, W, rb, D, F,
                              (const uint8_t *)h, hs, weights, y, (int)K),
               "launching expert down and combine");
    else
        k->dc<<<cu_blocks(D, DC_ROWS), 32 * K, shm, s>>>(W, rb, D, F, (const uint8_t *)h, hs, weights, y, (int)K);
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
