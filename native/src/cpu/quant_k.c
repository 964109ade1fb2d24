/*
 * quant_k.c — portable kernels of the K-quants Q2_K, Q3_K, Q4_K, Q5_K, Q6_K and of their
 * activation type Q8_K.
 *
 * A 256-value super-block has one or two f16 scales and 8 or 16 sub-block scales. Dot products run
 * against Q8_K activations: per block, the integer sums A = sum_j sc_j * sum(q a) and (for the types
 * with minimums) B = sum_j m_j * sum(a) are exact in int32 (bounds noted per type), and the block adds
 * (dw * da) * A - (dminw * da) * B to one float sum, blocks in order. The SIMD files compute the same
 * A and B and the same float expression, so every level returns the same bits.
 *
 * Value order inside a block (facts of the format):
 *   Q2_K/Q3_K: value 128 g + 32 k + b is bits 2k..2k+1 of qs[32 g + b]; Q3_K's third bit is bit k' of
 *              hmask[b] for value 32 k' + b.
 *   Q4_K/Q5_K: value 64 g + 32 h + b is nibble h of qs[32 g + b]; Q5_K's fifth bit is bit k of qh[b]
 *              for value 32 k + b.
 *   Q6_K:      value 128 g + 64 h + c is nibble h of ql[64 g + c]; its two high bits are bits 2k of
 *              qh[32 g + b] for value 128 g + 32 k + b.
 */
#include <math.h>
#include <string.h>

#include "common.h"
#include "quant_blocks.h"
#include "strata.h"

/* ---- unpacking to plain values ------------------------------------------------------------------- */

static void q2k_values(const block_q2_K *b, int8_t q[QK_K]) {
    for (int g = 0; g < 2; g++)
        for (int k = 0; k < 4; k++)
            for (int c = 0; c < 32; c++) q[128 * g + 32 * k + c] = (int8_t)((b->qs[32 * g + c] >> (2 * k)) & 3);
}

static void q3k_values(const block_q3_K *b, int8_t q[QK_K]) {
    for (int g = 0; g < 2; g++)
        for (int k = 0; k < 4; k++)
            for (int c = 0; c < 32; c++) {
                int v = 128 * g + 32 * k + c;
                int lo = (b->qs[32 * g + c] >> (2 * k)) & 3;
                int hb = (b->hmask[c] >> (v / 32)) & 1;
                q[v] = (int8_t)(lo - (hb ? 0 : 4));
            }
}

static void q4k_values(const uint8_t *qs, int8_t q[QK_K]) {
    for (int g = 0; g < 4; g++)
        for (int c = 0; c < 32; c++) {
            q[64 * g + c] = (int8_t)(qs[32 * g + c] & 0xF);
            q[64 * g + 32 + c] = (int8_t)(qs[32 * g + c] >> 4);
        }
}

static void q5k_values(const block_q5_K *b, int8_t q[QK_K]) {
    q4k_values(b->qs, q);
    for (int v = 0; v < QK_K; v++) q[v] = (int8_t)(q[v] | (((b->qh[v % 32] >> (v / 32)) & 1) << 4));
}

static void q6k_values(const block_q6_K *b, int8_t q[QK_K]) {
    for (int g = 0; g < 2; g++)
        for (int c = 0; c < 64; c++) {
            q[128 * g + c] = (int8_t)(b->ql[64 * g + c] & 0xF);
            q[128 * g + 64 + c] = (int8_t)(b->ql[64 * g + c] >> 4);
        }
    for (int g = 0; g < 2; g++)
        for (int k = 0; k < 4; k++)
            for (int c = 0; c < 32; c++) {
                int v = 128 * g + 32 * k + c;
                q[v] = (int8_t)((q[v] | (((b->qh[32 * g + c] >> (2 * k)) & 3) << 4)) - 32);
            }
}

/* ---- Q8_K: the activation type --------------------------------------------------------------- */

/* Scale max|x| / 127; values rounded to nearest, ties to even, by adding and removing 1.5 * 2^23
 * (exact for |v| <= 2^22; here |v| <= 127): plain float adds, which vectorize and need no libm call,
 * unlike roundf on the generic x86-64 target. So |qs| <= 127. */
void quant_q8k_quantize_act_scalar(const float *x, void *dst, int64_t n) {
    const float magic = 12582912.0f;
    block_q8_K *b = dst;
    for (int64_t i = 0; i < n / QK_K; i++, x += QK_K) {
        float amax = 0.0f;
        for (int j = 0; j < QK_K; j++) {
            const float a = fabsf(x[j]);
            amax = a > amax ? a : amax;
        }
        if (amax == 0.0f) {
            memset(&b[i], 0, sizeof b[i]);
            continue;
        }
        const float id = 127.0f / amax;
        b[i].d = amax / 127.0f;
        for (int j = 0; j < QK_K; j++) {
            const float v = (x[j] * id + magic) - magic;
            b[i].qs[j] = (int8_t)(v > 127.0f ? 127 : v < -127.0f ? -127 : v == v ? (int)v : 0);
        }
        for (int g = 0; g < QK_K / 16; g++) {
            int s = 0;
            for (int j = 0; j < 16; j++) s += b[i].qs[16 * g + j];
            b[i].bsums[g] = (int16_t)s;
        }
    }
}

static void q8k_dequant(const void *src, float *dst, int64_t n) {
    const block_q8_K *b = src;
    for (int64_t i = 0; i < n / QK_K; i++, dst += QK_K)
        for (int j = 0; j < QK_K; j++) dst[j] = b[i].d * (float)b[i].qs[j];
}

static float q8k_vec_dot(int64_t n, const void *w, const void *act) {
    const block_q8_K *x = w, *y = act;
    float sum = 0.0f;
    for (int64_t i = 0; i < n / QK_K; i++) {
        int32_t s = 0;
        for (int j = 0; j < QK_K; j++) s += (int32_t)x[i].qs[j] * y[i].qs[j];
        sum += (x[i].d * y[i].d) * (float)s;
    }
    return sum;
}

/* ---- dequantization (gguf-py's float32 expressions) --------------------------------------------- */

static void q2k_dequant(const void *src, float *dst, int64_t n) {
    const block_q2_K *b = src;
    for (int64_t i = 0; i < n / QK_K; i++, dst += QK_K) {
        const float d = quant_f16_lut[b[i].d], dmin = quant_f16_lut[b[i].dmin];
        int8_t q[QK_K];
        q2k_values(&b[i], q);
        for (int j = 0; j < 16; j++) {
            const float dl = d * (float)(b[i].scales[j] & 0xF), ml = dmin * (float)(b[i].scales[j] >> 4);
            for (int k = 0; k < 16; k++) dst[16 * j + k] = dl * (float)q[16 * j + k] - ml;
        }
    }
}

static void q3k_dequant(const void *src, float *dst, int64_t n) {
    const block_q3_K *b = src;
    for (int64_t i = 0; i < n / QK_K; i++, dst += QK_K) {
        const float d = quant_f16_lut[b[i].d];
        int8_t q[QK_K], sc[16];
        q3k_values(&b[i], q);
        q3k_scales(b[i].scales, sc);
        for (int j = 0; j < 16; j++) {
            const float dl = d * (float)sc[j];
            for (int k = 0; k < 16; k++) dst[16 * j + k] = dl * (float)q[16 * j + k];
        }
    }
}

static void q4k_dequant(const void *src, float *dst, int64_t n) {
    const block_q4_K *b = src;
    for (int64_t i = 0; i < n / QK_K; i++, dst += QK_K) {
        const float d = quant_f16_lut[b[i].d], dmin = quant_f16_lut[b[i].dmin];
        int8_t q[QK_K];
        q4k_values(b[i].qs, q);
        for (int j = 0; j < 8; j++) {
            uint8_t sc, m;
            q4k_scale_min(j, b[i].scales, &sc, &m);
            const float dl = d * (float)sc, ml = dmin * (float)m;
            for (int k = 0; k < 32; k++) dst[32 * j + k] = dl * (float)q[32 * j + k] - ml;
        }
    }
}

static void q5k_dequant(const void *src, float *dst, int64_t n) {
    const block_q5_K *b = src;
    for (int64_t i = 0; i < n / QK_K; i++, dst += QK_K) {
        const float d = quant_f16_lut[b[i].d], dmin = quant_f16_lut[b[i].dmin];
        int8_t q[QK_K];
        q5k_values(&b[i], q);
        for (int j = 0; j < 8; j++) {
            uint8_t sc, m;
            q4k_scale_min(j, b[i].scales, &sc, &m);
            const float dl = d * (float)sc, ml = dmin * (float)m;
            for (int k = 0; k < 32; k++) dst[32 * j + k] = dl * (float)q[32 * j + k] - ml;
        }
    }
}

static void q6k_dequant(const void *src, float *dst, int64_t n) {
    const block_q6_K *b = src;
    for (int64_t i = 0; i < n / QK_K; i++, dst += QK_K) {
        const float d = quant_f16_lut[b[i].d];
        int8_t q[QK_K];
        q6k_values(&b[i], q);
        for (int j = 0; j < 16; j++) {
            const float dl = d * (float)b[i].scales[j];
            for (int k = 0; k < 16; k++) dst[16 * j + k] = dl * (float)q[16 * j + k];
        }
    }
}

/* ---- dot products against Q8_K ---------------------------------------------------------------- */

/* sum over a group of `len` values of q * a */
static inline int32_t idot(const int8_t *q, const int8_t *a, int len) {
    int32_t s = 0;
    for (int k = 0; k < len; k++) s += (int32_t)q[k] * a[k];
    return s;
}

/* Q2_K: |q| <= 3, sc, m <= 15: |A| <= 16 * 15 * 16 * 3 * 127, |B| <= 16 * 15 * 2032. */
static float q2k_vec_dot(int64_t n, const void *w, const void *act) {
    const block_q2_K *x = w;
    const block_q8_K *y = act;
    float sum = 0.0f;
    for (int64_t i = 0; i < n / QK_K; i++) {
        int8_t q[QK_K];
        q2k_values(&x[i], q);
        int32_t A = 0, B = 0;
        for (int j = 0; j < 16; j++) {
            A += (x[i].scales[j] & 0xF) * idot(q + 16 * j, y[i].qs + 16 * j, 16);
            B += (x[i].scales[j] >> 4) * y[i].bsums[j];
        }
        sum += (quant_f16_lut[x[i].d] * y[i].d) * (float)A - (quant_f16_lut[x[i].dmin] * y[i].d) * (float)B;
    }
    return sum;
}

/* Q3_K: |q| <= 4, |sc| <= 32: |A| <= 16 * 32 * 16 * 4 * 127. */
static float q3k_vec_dot(int64_t n, const void *w, const void *act) {
    const block_q3_K *x = w;
    const block_q8_K *y = act;
    float sum = 0.0f;
    for (int64_t i = 0; i < n / QK_K; i++) {
        int8_t q[QK_K], sc[16];
        q3k_values(&x[i], q);
        q3k_scales(x[i].scales, sc);
        int32_t A = 0;
        for (int j = 0; j < 16; j++) A += sc[j] * idot(q + 16 * j, y[i].qs + 16 * j, 16);
        sum += (quant_f16_lut[x[i].d] * y[i].d) * (float)A;
    }
    return sum;
}

/* One block of Q4_K or Q5_K (unpacked values q[QK_K], 8 sub-blocks with 6-bit scale and min) against a
 * Q8_K block: exact integer sums A (scaled values) and B (mins times activation sums), one float
 * expression. Q4_K: q <= 15, sc, m <= 63: |A| <= 8 * 63 * 32 * 15 * 127, |B| <= 8 * 63 * 4064;
 * Q5_K: q <= 31: |A| <= 8 * 63 * 32 * 31 * 127. */
static float k_scale_min_block_dot(const int8_t *q, const uint8_t *scales, uint16_t d, uint16_t dmin,
                                   const block_q8_K *y) {
    int32_t A = 0, B = 0;
    for (int j = 0; j < 8; j++) {
        uint8_t sc, m;
        q4k_scale_min(j, scales, &sc, &m);
        A += sc * idot(q + 32 * j, y->qs + 32 * j, 32);
        B += m * (y->bsums[2 * j] + y->bsums[2 * j + 1]);
    }
    return (quant_f16_lut[d] * y->d) * (float)A - (quant_f16_lut[dmin] * y->d) * (float)B;
}

static float q4k_vec_dot(int64_t n, const void *w, const void *act) {
    const block_q4_K *x = w;
    const block_q8_K *y = act;
    float sum = 0.0f;
    for (int64_t i = 0; i < n / QK_K; i++) {
        int8_t q[QK_K];
        q4k_values(x[i].qs, q);
        sum += k_scale_min_block_dot(q, x[i].scales, x[i].d, x[i].dmin, &y[i]);
    }
    return sum;
}

static float q5k_vec_dot(int64_t n, const void *w, const void *act) {
    const block_q5_K *x = w;
    const block_q8_K *y = act;
    float sum = 0.0f;
    for (int64_t i = 0; i < n / QK_K; i++) {
        int8_t q[QK_K];
        q5k_values(&x[i], q);
        sum += k_scale_min_block_dot(q, x[i].scales, x[i].d, x[i].dmin, &y[i]);
    }
    return sum;
}

/* Q6_K: |q| <= 32, |sc| <= 128: |A| <= 16 * 128 * 16 * 32 * 127. */
static float q6k_vec_dot(int64_t n, const void *w, const void *act) {
    const block_q6_K *x = w;
    const block_q8_K *y = act;
    float sum = 0.0f;
    for (int64_t i = 0; i < n / QK_K; i++) {
        int8_t q[QK_K];
        q6k_values(&x[i], q);
        int32_t A = 0;
        for (int j = 0; j < 16; j++) A += x[i].scales[j] * idot(q + 16 * j, y[i].qs + 16 * j, 16);
        sum += (quant_f16_lut[x[i].d] * y[i].d) * (float)A;
    }
    return sum;
}

/* ---- registration ------------------------------------------------------------------------------- */

void quant_register_k(quant_traits t[], int32_t simd) {
#define KQ(T, name, blk, deq, dot) t[T] = (quant_traits){name, T, QK_K, sizeof(blk), STRATA_TYPE_Q8_K, deq, NULL, dot}
    KQ(STRATA_TYPE_Q2_K, "Q2_K", block_q2_K, q2k_dequant, q2k_vec_dot);
    KQ(STRATA_TYPE_Q3_K, "Q3_K", block_q3_K, q3k_dequant, q3k_vec_dot);
    KQ(STRATA_TYPE_Q4_K, "Q4_K", block_q4_K, q4k_dequant, q4k_vec_dot);
    KQ(STRATA_TYPE_Q5_K, "Q5_K", block_q5_K, q5k_dequant, q5k_vec_dot);
    KQ(STRATA_TYPE_Q6_K, "Q6_K", block_q6_K, q6k_dequant, q6k_vec_dot);
#undef KQ
    t[STRATA_TYPE_Q8_K] = (quant_traits){"Q8_K",
                                         STRATA_TYPE_Q8_K,
                                         QK_K,
                                         sizeof(block_q8_K),
                                         STRATA_TYPE_Q8_K,
                                         q8k_dequant,
                                         quant_q8k_quantize_act_scalar,
                                         q8k_vec_dot};
    if (simd >= STRATA_SIMD_AVX2) quant_k_avx2(t);
    if (simd >= STRATA_SIMD_AVX512) quant_k_avx512(t);
}
