/*
 * cuda_mirror.h — the host mirror of the CUDA decode product (cuda_mirror.c) and its SIMD levels
 * (cpu/mirror_avx2.c, cpu/mirror_avx512.c).
 *
 * The device's warp gives lane l (0..31) slice l % 4 (8 values) of the groups of 32 values l / 4,
 * l / 4 + 8, ... of a row. So one step of the 32 lanes takes 256 consecutive values, lane l the 8 at
 * 8 l .. 8 l + 7 of them, and the SIMD kernels run the 32 lanes side by side: one vector element per
 * lane, the lane's own sequence of float operations unchanged, hence the same bits.
 *
 * An activation vector is prepared once (mirror_prepare) for a weight type and a kernel level, then
 * used for any number of rows: 8-bit types get the device's 8-bit quantization (and the level's
 * arrangement of it), float types a copy of x laid out per step as the kernel's vectors want it.
 */
#ifndef STRATA_CUDA_MIRROR_H
#define STRATA_CUDA_MIRROR_H

#include <stddef.h>
#include <stdint.h>

/* One token's activations prepared for weights of `type` at level `simd` (STRATA_SIMD_SCALAR, _AVX2,
 * _AVX512). Every pointer is into the workspace given to mirror_prepare; nothing is owned. */
typedef struct mirror_x {
    int32_t type;    /* weight type it was prepared for */
    int32_t simd;    /* level whose kernels read it (SCALAR when that level has no kernel for type) */
    int32_t int8;    /* 1: 8-bit activations (Q8_0, Q4_0 weights); 0: float activations */
    int32_t deq;     /* 1: a block type whose level kernel dequantizes each step with gq_dequant8 */
    int64_t cols;
    const float *x;  /* [cols] the activations (float types, scalar kernel) */
    int8_t *q;       /* [cols] the device's 8-bit activations, value order (int8 types) */
    float *d;        /* [cols / 32] their block scales */
    /* arranged for the level's kernel (cols / 256 whole steps; a partial last step runs scalar) */
    int8_t *qp;      /* [cols] 8-bit values in the order the kernel multiplies them with weight bytes */
    int32_t *corr;   /* [cols / 4] per 4 arranged values: -(weight offset) * their sum */
    float *dl;       /* [cols / 8] per step and lane: the scale of the lane's activation block */
    float *xt;       /* [cols] per step, per value index v (0..7), per vector element: x of its lane */
    int32_t lane_of[32]; /* float types: lane of vector element e (e = 0..31 over the level's vectors) */
    int32_t sidx[32];    /* float types: index of element e's weight scale within its super-block */
} mirror_x;

/* Bytes of workspace mirror_prepare needs for cols values (64-byte aligned pieces included). */
size_t mirror_x_bytes(int64_t cols);
/* Prepare x[cols] for rows of `type` at level simd into ws (mirror_x_bytes(cols) bytes). */
void mirror_prepare(mirror_x *px, void *ws, int32_t simd, int32_t type, const float *x, int64_t cols);
/* y[r] = row r of w (rows rows of px->type, px->cols values) . x, with the device's bits. */
void mirror_rows(const mirror_x *px, const void *w, int64_t rows, float *y);

/* The scalar kernel (the reference): whole rows, any type the device runs. */
void mirror_rows_scalar(const mirror_x *px, const void *w, int64_t rows, float *y);

/* Level kernels (cpu/mirror_avx2.c, cpu/mirror_avx512.c): rows of a vector prepared for that level
 * (mirror_prepare falls back to SCALAR for the types a level has no kernel for). */
void mirror_rows_avx2(const mirror_x *px, const void *w, int64_t rows, float *y);
void mirror_rows_avx512(const mirror_x *px, const void *w, int64_t rows, float *y);
/* The scalar steps' bits, vectorized: the device's 8-bit quantization of x (q[cols], scales[cols / 32])
 * and g[i] = gq_swiglu(g[i], u[i]). */
void mirror_quantize_avx2(const float *x, int64_t cols, int8_t *q, float *scales);
void mirror_quantize_avx512(const float *x, int64_t cols, int8_t *q, float *scales);
void mirror_swiglu_avx2(float *g, const float *u, int64_t n);
void mirror_swiglu_avx512(float *g, const float *u, int64_t n);

/* Add the device's partial last step (groups from g0 on, when cols is not a multiple of 256) to the
 * lane sums acc[32] of one row, then combine the lanes as the warp does. */
float mirror_finish_row(const mirror_x *px, const uint8_t *row, int64_t g0, float acc[32]);

#endif
