/*
 * quant_legacy.c — portable kernels of the 32-value block types Q4_0, Q4_1, Q5_0, Q5_1.
 *
 * Weights are dotted against activations quantized to Q8_0 (the engine's activation type for
 * 32-blocks). Per block the integer products are summed exactly (|q| <= 31, |a| <= 127: at most
 * 32 * 31 * 127 per block); the block's float contribution goes to lane (block mod 8) of eight
 * sums (see quant_blocks.h). Dequantization computes exactly gguf-py's expressions in float32.
 */
#include <string.h>

#include "common.h"
#include "quant_blocks.h"
#include "strata.h"

/* ---- unpacking ---------------------------------------------------------------------------------- */

/* The 32 4-bit indices of a block (value j: low nibble of byte j for j < 16, else high nibble of j-16). */
static inline void unpack4(const uint8_t *qs, uint8_t q[32]) {
    for (int j = 0; j < 16; j++) {
        q[j] = qs[j] & 0xF;
        q[j + 16] = qs[j] >> 4;
    }
}

/* With the fifth bit from qh (bit j of the little-endian u32 for value j). */
static inline void unpack5(const uint8_t *qs, const uint8_t *qh4, uint8_t q[32]) {
    uint32_t qh;
    memcpy(&qh, qh4, 4);
    unpack4(qs, q);
    for (int j = 0; j < 32; j++) q[j] |= (uint8_t)(((qh >> j) & 1u) << 4);
}

/* ---- dequantization ----------------------------------------------------------------------------- */

static void q4_0_dequant(const void *src, float *dst, int64_t n) {
    const block_q4_0 *b = src;
    for (int64_t i = 0; i < n / QK4_0; i++, dst += QK4_0) {
        const float d = quant_f16_lut[b[i].d];
        uint8_t q[32];
        unpack4(b[i].qs, q);
        for (int j = 0; j < 32; j++) dst[j] = d * (float)((int)q[j] - 8);
    }
}

static void q4_1_dequant(const void *src, float *dst, int64_t n) {
    const block_q4_1 *b = src;
    for (int64_t i = 0; i < n / QK4_0; i++, dst += QK4_0) {
        const float d = quant_f16_lut[b[i].d], m = quant_f16_lut[b[i].m];
        uint8_t q[32];
        unpack4(b[i].qs, q);
        for (int j = 0; j < 32; j++) dst[j] = d * (float)q[j] + m;
    }
}

static void q5_0_dequant(const void *src, float *dst, int64_t n) {
    const block_q5_0 *b = src;
    for (int64_t i = 0; i < n / QK4_0; i++, dst += QK4_0) {
        const float d = quant_f16_lut[b[i].d];
        uint8_t q[32];
        unpack5(b[i].qs, b[i].qh, q);
        for (int j = 0; j < 32; j++) dst[j] = d * (float)((int)q[j] - 16);
    }
}

static void q5_1_dequant(const void *src, float *dst, int64_t n) {
    const block_q5_1 *b = src;
    for (int64_t i = 0; i < n / QK4_0; i++, dst += QK4_0) {
        const float d = quant_f16_lut[b[i].d], m = quant_f16_lut[b[i].m];
        uint8_t q[32];
        unpack5(b[i].qs, b[i].qh, q);
        for (int j = 0; j < 32; j++) dst[j] = d * (float)q[j] + m;
    }
}

/* ---- dot products against Q8_0 activations ---------------------------------------------------- */

/* Symmetric types: r = (dw * da) * sum((q - off) * a). */
static float q4_0_vec_dot(int64_t n, const void *w, const void *act) {
    const block_q4_0 *x = w;
    const block_q8_0_act *y = act;
    float acc[8] = {0};
    for (int64_t i = 0; i < n / QK4_0; i++) {
        uint8_t q[32];
        unpack4(x[i].qs, q);
        int32_t s = 0;
        for (int j = 0; j < 32; j++) s += ((int32_t)q[j] - 8) * y[i].qs[j];
        acc[i & 7] += (quant_f16_lut[x[i].d] * quant_f16_lut[y[i].d]) * (float)s;
    }
    return quant_sum8(acc);
}

static float q5_0_vec_dot(int64_t n, const void *w, const void *act) {
    const block_q5_0 *x = w;
    const block_q8_0_act *y = act;
    float acc[8] = {0};
    for (int64_t i = 0; i < n / QK4_0; i++) {
        uint8_t q[32];
        unpack5(x[i].qs, x[i].qh, q);
        int32_t s = 0;
        for (int j = 0; j < 32; j++) s += ((int32_t)q[j] - 16) * y[i].qs[j];
        acc[i & 7] += (quant_f16_lut[x[i].d] * quant_f16_lut[y[i].d]) * (float)s;
    }
    return quant_sum8(acc);
}

/* Affine types: r = (dw * da) * sum(q * a) + (mw * da) * sum(a). */
static float q4_1_vec_dot(int64_t n, const void *w, const void *act) {
    const block_q4_1 *x = w;
    const block_q8_0_act *y = act;
    float acc[8] = {0};
    for (int64_t i = 0; i < n / QK4_0; i++) {
        uint8_t q[32];
        unpack4(x[i].qs, q);
        int32_t s = 0, sa = 0;
        for (int j = 0; j < 32; j++) {
            s += (int32_t)q[j] * y[i].qs[j];
            sa += y[i].qs[j];
        }
        const float da = quant_f16_lut[y[i].d];
        acc[i & 7] += (quant_f16_lut[x[i].d] * da) * (float)s + (quant_f16_lut[x[i].m] * da) * (float)sa;
    }
    return quant_sum8(acc);
}

static float q5_1_vec_dot(int64_t n, const void *w, const void *act) {
    const block_q5_1 *x = w;
    const block_q8_0_act *y = act;
    float acc[8] = {0};
    for (int64_t i = 0; i < n / QK4_0; i++) {
        uint8_t q[32];
        unpack5(x[i].qs, x[i].qh, q);
        int32_t s = 0, sa = 0;
        for (int j = 0; j < 32; j++) {
            s += (int32_t)q[j] * y[i].qs[j];
            sa += y[i].qs[j];
        }
        const float da = quant_f16_lut[y[i].d];
        acc[i & 7] += (quant_f16_lut[x[i].d] * da) * (float)s + (quant_f16_lut[x[i].m] * da) * (float)sa;
    }
    return quant_sum8(acc);
}

/* ---- registration ------------------------------------------------------------------------------- */

void quant_register_legacy(quant_traits t[], int32_t simd) {
    t[STRATA_TYPE_Q4_0] = (quant_traits){"Q4_0",           STRATA_TYPE_Q4_0, QK4_0, sizeof(block_q4_0),
                                         STRATA_TYPE_Q8_0, q4_0_dequant,     NULL,  q4_0_vec_dot};
    t[STRATA_TYPE_Q4_1] = (quant_traits){"Q4_1",           STRATA_TYPE_Q4_1, QK4_0, sizeof(block_q4_1),
                                         STRATA_TYPE_Q8_0, q4_1_dequant,     NULL,  q4_1_vec_dot};
    t[STRATA_TYPE_Q5_0] = (quant_traits){"Q5_0",           STRATA_TYPE_Q5_0, QK4_0, sizeof(block_q5_0),
                                         STRATA_TYPE_Q8_0, q5_0_dequant,     NULL,  q5_0_vec_dot};
    t[STRATA_TYPE_Q5_1] = (quant_traits){"Q5_1",           STRATA_TYPE_Q5_1, QK4_0, sizeof(block_q5_1),
                                         STRATA_TYPE_Q8_0, q5_1_dequant,     NULL,  q5_1_vec_dot};
    if (simd >= STRATA_SIMD_AVX2) quant_legacy_avx2(t);
    if (simd >= STRATA_SIMD_AVX512) quant_legacy_avx512(t);
}
