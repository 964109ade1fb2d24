/*
 * group_dequant.h — the values of one group of 32 consecutive weights of a row, for the CUDA
 * matrix-vector kernels and their bit-exact host mirror. Included by C (cuda_mirror.c) and by CUDA
 * (cuda/matvec.cu): the same source gives the same sequence of float operations on both sides
 * (the build turns off fused multiply-add for both).
 *
 * Block layouts (GGUF facts):
 *   Q8_0  32 values, 34 bytes:  f16 d, int8 q[32]                     w = d * q
 *   Q4_0  32 values, 18 bytes:  f16 d, u8 qs[16] (low nibbles: values 0..15, high: 16..31)
 *                                                                      w = d * (q - 8)
 *   Q4_K 256 values, 144 bytes: f16 d, f16 dmin, u8 scales[12] (8 x 6-bit scale + 6-bit min),
 *                               u8 qs[128] (64-value chunks: low nibbles sub-block 2i, high 2i+1)
 *                                                                      w = (d * sc) * q - dmin * m
 *   Q6_K 256 values, 210 bytes: u8 ql[128], u8 qh[64], i8 scales[16], f16 d
 *                                                                      w = (d * sc) * (q - 32)
 *
 * A group is read in four slices of 8 values (one per lane of a quartet), so that a warp's loads of
 * weights and activations are contiguous. The other block types the device runs (Q4_1, Q5_0, Q5_1,
 * Q2_K, Q3_K, Q5_K, IQ4_NL, IQ4_XS, IQ3_XXS, IQ3_S, IQ2_XS, IQ2_XXS, IQ2_S, IQ1_S, IQ1_M, MXFP4) are in
 * group_dequant_types.h, listed with their block geometry in GQ_DEVICE_TYPES below.
 */
#ifndef STRATA_GROUP_DEQUANT_H
#define STRATA_GROUP_DEQUANT_H

#include <stdint.h>

#include "strata.h"

#ifdef __CUDACC__
#include <cuda_fp16.h>
#define GQ_FN static __host__ __device__ __forceinline__
GQ_FN float gq_f16(const uint8_t *p) {
    uint16_t h = (uint16_t)(p[0] | (p[1] << 8));
#ifdef __CUDA_ARCH__
    return __half2float(__ushort_as_half(h));
#else
    return __half2float(*(const __half *)&h);
#endif
}
#else
#include <math.h>

#include "common.h"
#define GQ_FN static inline
GQ_FN float gq_f16(const uint8_t *p) { return strata_f16_to_f32((uint16_t)(p[0] | (p[1] << 8))); }
#endif

GQ_FN float gq_bf16(const uint8_t *p) {
    uint32_t bits = (uint32_t)(p[0] | (p[1] << 8)) << 16;
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

/* 6-bit scale and min of sub-block j (0..7) of a Q4_K block. */
GQ_FN void gq_q4k_scale_min(const uint8_t *s, int j, int *sc, int *m) {
    if (j < 4) {
        *sc = s[j] & 63;
        *m = s[j + 4] & 63;
    } else {
        *sc = (s[j + 4] & 0xF) | ((s[j - 4] >> 6) << 4);
        *m = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
    }
}

#include "group_dequant_types.h"

/* Every type the device runs: X(type, values per block, bytes per block, name, tensor-core form). name: the
 * suffix of the type's functions in group_dequant_types.h (gq_dq8_<name>, gq_w4_<name>, gq_ws_<name>; "-"
 * for the types whose slice gq_dequant8 computes inline); the form: GQ_MQ_* flags of cuda/mmq_types.cu
 * (-1: no such form; 0: one scale per 32 values). The kernels' dispatch, the row sizes and the shape checks
 * come from this one list. */
#define GQ_DEVICE_TYPES(X)                                                                                   \
    X(STRATA_TYPE_F32, 1, 4, -, -1)                                                                           \
    X(STRATA_TYPE_F16, 1, 2, -, -1)                                                                           \
    X(STRATA_TYPE_BF16, 1, 2, -, -1)                                                                          \
    X(STRATA_TYPE_Q8_0, 32, 34, -, -1)                                                                        \
    X(STRATA_TYPE_Q4_0, 32, 18, -, -1)                                                                        \
    X(STRATA_TYPE_Q4_K, 256, 144, -, -1)                                                                      \
    X(STRATA_TYPE_Q6_K, 256, 210, -, -1)                                                                      \
    GQ_NEW_TYPES(X)
/* The types of group_dequant_types.h (their kernels are instantiated in cuda/matvec_types.cu and
 * cuda/mmq_types.cu). */
#define GQ_NEW_TYPES(X)                                                                                      \
    X(STRATA_TYPE_Q4_1, 32, 20, q4_1, GQ_MQ_MIN)                                                             \
    X(STRATA_TYPE_Q5_0, 32, 22, q5_0, 0)                                                                      \
    X(STRATA_TYPE_Q5_1, 32, 24, q5_1, GQ_MQ_MIN)                                                             \
    X(STRATA_TYPE_IQ4_NL, 32, 18, iq4_nl, 0)                                                                  \
    X(STRATA_TYPE_MXFP4, 32, 17, mxfp4, 0)                                                                    \
    X(STRATA_TYPE_Q2_K, 256, 84, q2_k, GQ_MQ_SPLIT | GQ_MQ_MIN)                                               \
    X(STRATA_TYPE_Q3_K, 256, 110, q3_k, GQ_MQ_SPLIT)                                                          \
    X(STRATA_TYPE_Q5_K, 256, 176, q5_k, GQ_MQ_MIN)                                                            \
    X(STRATA_TYPE_IQ4_XS, 256, 136, iq4_xs, 0)                                                                \
    X(STRATA_TYPE_IQ3_XXS, 256, 98, iq3_xxs, 0)                                                               \
    X(STRATA_TYPE_IQ3_S, 256, 110, iq3_s, 0)                                                                  \
    X(STRATA_TYPE_IQ2_XS, 256, 74, iq2_xs, GQ_MQ_SPLIT)                                                       \
    X(STRATA_TYPE_IQ2_XXS, 256, 66, iq2_xxs, 0)                                                               \
    X(STRATA_TYPE_IQ2_S, 256, 82, iq2_s, GQ_MQ_SPLIT)                                                         \
    X(STRATA_TYPE_IQ1_S, 256, 50, iq1_s, 0)                                                                   \
    X(STRATA_TYPE_IQ1_M, 256, 56, iq1_m, GQ_MQ_SPLIT)

/* w[0..7] = values 8*s .. 8*s+7 (s = 0..3) of group g (the 32 values from column 32*g) of a row. */
GQ_FN void gq_dequant8(int32_t type, const uint8_t *row, int64_t g, int s, float *w) {
    const int e0 = 8 * s;
    switch (type) {
    case STRATA_TYPE_F32: {
        const uint8_t *p = row + (g * 32 + e0) * 4;
        for (int l = 0; l < 8; l++) memcpy(&w[l], p + 4 * l, 4);
        break;
    }
    case STRATA_TYPE_F16: {
        const uint8_t *p = row + (g * 32 + e0) * 2;
        for (int l = 0; l < 8; l++) w[l] = gq_f16(p + 2 * l);
        break;
    }
    case STRATA_TYPE_BF16: {
        const uint8_t *p = row + (g * 32 + e0) * 2;
        for (int l = 0; l < 8; l++) w[l] = gq_bf16(p + 2 * l);
        break;
    }
    case STRATA_TYPE_Q8_0: {
        const uint8_t *b = row + g * 34;
        const float d = gq_f16(b);
        for (int l = 0; l < 8; l++) w[l] = d * (float)(int8_t)b[2 + e0 + l];
        break;
    }
    case STRATA_TYPE_Q4_0: {
        /* values 0..15 are the low nibbles of qs[0..15], values 16..31 the high nibbles */
        const uint8_t *b = row + g * 18;
        const float d = gq_f16(b);
        const uint8_t *qs = b + 2 + (e0 & 15);
        const int shift = e0 >= 16 ? 4 : 0;
        for (int l = 0; l < 8; l++) w[l] = d * (float)(((qs[l] >> shift) & 0xF) - 8);
        break;
    }
    case STRATA_TYPE_Q4_K: {
        const uint8_t *b = row + (g >> 3) * 144;
        const int j = (int)(g & 7);
        const float d = gq_f16(b), dmin = gq_f16(b + 2);
        int sc, m;
        gq_q4k_scale_min(b + 4, j, &sc, &m);
        const float dsc = d * (float)sc, dm = dmin * (float)m;
        const uint8_t *qs = b + 16 + 32 * (j >> 1) + e0;
        const int shift = 4 * (j & 1);
        for (int l = 0; l < 8; l++) w[l] = dsc * (float)((qs[l] >> shift) & 0xF) - dm;
        break;
    }
    case STRATA_TYPE_Q6_K: {
        const uint8_t *b = row + (g >> 3) * 210;
        const int j = (int)(g & 7), h = j >> 2, qq = j & 3;
        const uint8_t *ql = b + 64 * h + ((qq & 1) ? 32 : 0) + e0, *qh = b + 128 + 32 * h + e0;
        const float dsc = gq_f16(b + 208) * (float)((const int8_t *)(b + 192 + 8 * h))[(e0 >> 4) + 2 * qq];
        const int lshift = (qq & 2) ? 4 : 0, hshift = 2 * qq;
        for (int l = 0; l < 8; l++) {
            const int q = ((ql[l] >> lshift) & 0xF) | (((qh[l] >> hshift) & 3) << 4);
            w[l] = dsc * (float)(q - 32);
        }
        break;
    }
#define GQ_CASE(T, V, B, N, MQ)                                                                               \
    case T: gq_dq8_##N(row, g, e0, w); break;
        GQ_NEW_TYPES(GQ_CASE)
#undef GQ_CASE
    default:
        for (int l = 0; l < 8; l++) w[l] = 0.0f;
        break;
    }
}

/* e^x from additions, multiplications and exponent bits only, so that the device and the host give
 * the same bits (the libraries' expf differ in their last bits). Relative error below 2e-7 over the
 * range that matters; saturates to 0 / inf outside [-87, 88]. */
GQ_FN float gq_expf(float x) {
    if (x != x) return x; /* NaN: kept away from the float-to-int conversion below, undefined for it */
    if (x < -87.0f) return 0.0f;
    if (x > 88.0f) x = 88.0f;
    /* x = n ln2 + r, |r| <= ln2 / 2, with ln2 split in two parts for an exact-ish reduction */
    const float n = floorf(x * 1.44269504f + 0.5f);
    float r = x - n * 0.693145752f;
    r = r - n * 1.42860677e-06f;
    /* e^r by its Taylor polynomial to degree 7 (Horner) */
    float p = 1.98412698e-4f;
    p = p * r + 1.38888889e-3f;
    p = p * r + 8.33333333e-3f;
    p = p * r + 4.16666667e-2f;
    p = p * r + 1.66666667e-1f;
    p = p * r + 0.5f;
    p = p * r + 1.0f;
    p = p * r + 1.0f;
    const int32_t bits = ((int32_t)n + 127) << 23;
    float scale;
    memcpy(&scale, &bits, 4);
    return p * scale;
}

/* SwiGLU of one value: silu(g) * u. */
GQ_FN float gq_swiglu(float g, float u) { return g / (1.0f + gq_expf(-g)) * u; }

/* Bytes of a row of n values of a device type (0 for types the device does not run). */
GQ_FN int64_t gq_row_bytes(int32_t type, int64_t n) {
    switch (type) {
#define GQ_CASE(T, V, B, N, MQ)                                                                               \
    case T: return n / (V) * (B);
        GQ_DEVICE_TYPES(GQ_CASE)
#undef GQ_CASE
    default: return 0;
    }
}

/* Values per block of a device type (a row's length must be a multiple); 0 for other types. */
GQ_FN int gq_block_values(int32_t type) {
    switch (type) {
#define GQ_CASE(T, V, B, N, MQ)                                                                               \
    case T: return (V);
        GQ_DEVICE_TYPES(GQ_CASE)
#undef GQ_CASE
    default: return 0;
    }
}

/* The tensor-core form of a type: GQ_MQ_* flags of the types of GQ_NEW_TYPES, 0 for Q8_0, Q4_0, Q4_K and
 * Q6_K (mmq.cu's own kernels), -1 for the types without one (the float types). */
GQ_FN int gq_mmq_form(int32_t type) {
    switch (type) {
    case STRATA_TYPE_Q8_0:
    case STRATA_TYPE_Q4_0:
    case STRATA_TYPE_Q4_K:
    case STRATA_TYPE_Q6_K: return 0;
#define GQ_CASE(T, V, B, N, MQ)                                                                               \
    case T: return (MQ);
        GQ_NEW_TYPES(GQ_CASE)
#undef GQ_CASE
    default: return -1;
    }
}

/* Whether rows of cols values of type are whole blocks (and the type one the device runs); a group of 32
 * is the kernels' unit, so every row is whole groups too. */
GQ_FN int gq_shape_ok(int32_t type, int64_t cols) {
    const int blk = gq_block_values(type);
    return blk > 0 && cols > 0 && cols % (blk > 32 ? blk : 32) == 0;
}

#endif
