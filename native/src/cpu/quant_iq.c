/*
 * quant_iq.c — portable kernels of the i-quants IQ4_NL, IQ4_XS, IQ3_XXS, IQ3_S, IQ2_XS.
 *
 * IQ4_NL (32-value blocks) is dotted against Q8_0 activations, the others (256-value blocks) against
 * Q8_K. The lookup tables come from iq_tables.h, generated at build time from gguf-py's tables.
 *
 * The sub-block scales of the grid types are odd multiples of a power of two of d:
 *   IQ3_XXS: d (0.5 + s) / 2 = d (2 s + 1) / 4,   IQ2_XS: d (0.5 + s) / 4 = d (2 s + 1) / 8,
 *   IQ3_S:   d (1 + 2 s),
 * so a block's dot is the exact integer A = sum_j (2 s_j + 1) * sum(grid * sign * a) times one float
 * factor; the power of two is folded into the scale product ((dw * da) * 2^-k is exact).
 */
#include <string.h>

#include "common.h"
#include "iq_tables.h"
#include "quant_blocks.h"
#include "strata.h"

/* ---- unpacking to signed values and per-sub-block scale factors ------------------------------- */

static inline int iq4xs_ls(const block_iq4_xs *b, int j) {
    int lo = (b->scales_l[j / 2] >> (4 * (j % 2))) & 0xF;
    int hi = (b->scales_h >> (2 * j)) & 3;
    return (lo | (hi << 4)) - 32;
}

/* IQ3_XXS: magnitudes times signs, and the 8 odd scale factors 2 s + 1. */
static void iq3xxs_values(const block_iq3_xxs *b, int8_t q[QK_K], int32_t f[8]) {
    for (int ib = 0; ib < 8; ib++) {
        uint32_t aux;
        memcpy(&aux, b->sas + 4 * ib, 4);
        f[ib] = 2 * (int32_t)(aux >> 28) + 1;
        for (int l = 0; l < 4; l++) {
            const uint8_t signs = iq_ksigns[(aux >> (7 * l)) & 127];
            const uint32_t g1 = iq3xxs_grid[b->qs[8 * ib + 2 * l]], g2 = iq3xxs_grid[b->qs[8 * ib + 2 * l + 1]];
            for (int j = 0; j < 4; j++) {
                int v1 = (g1 >> (8 * j)) & 0xFF, v2 = (g2 >> (8 * j)) & 0xFF;
                q[32 * ib + 8 * l + j] = (int8_t)((signs >> j) & 1 ? -v1 : v1);
                q[32 * ib + 8 * l + 4 + j] = (int8_t)((signs >> (j + 4)) & 1 ? -v2 : v2);
            }
        }
    }
}

static void iq3s_values(const block_iq3_s *b, int8_t q[QK_K], int32_t f[8]) {
    for (int j = 0; j < 8; j++) f[j] = 1 + 2 * ((b->scales[j / 2] >> (4 * (j % 2))) & 0xF);
    for (int t = 0; t < 64; t++) {
        const uint32_t g = iq3s_grid[b->qs[t] | (((b->qh[t / 8] >> (t % 8)) & 1) << 8)];
        for (int j = 0; j < 4; j++) {
            int v = 4 * t + j, m = (g >> (8 * j)) & 0xFF;
            q[v] = (int8_t)((b->signs[v / 8] >> (v % 8)) & 1 ? -m : m);
        }
    }
}

static void iq2xs_values(const block_iq2_xs *b, int8_t q[QK_K], int32_t f[16]) {
    for (int g = 0; g < 16; g++) f[g] = 2 * ((b->scales[g / 2] >> (4 * (g % 2))) & 0xF) + 1;
    for (int t = 0; t < 32; t++) {
        const uint64_t g = iq2xs_grid[b->qs[t] & 511];
        const uint8_t signs = iq_ksigns[b->qs[t] >> 9];
        for (int j = 0; j < 8; j++) {
            int m = (int)((g >> (8 * j)) & 0xFF);
            q[8 * t + j] = (int8_t)((signs >> j) & 1 ? -m : m);
        }
    }
}

/* ---- dequantization (gguf-py's float32 expressions) --------------------------------------------- */

/* Signs are applied by multiplying with +-1 as gguf-py does: a multiply keeps a NaN's sign bit where a
 * negation (what the compiler makes of a select between x and -x) would flip it. */
static const float k_sign[2] = {1.0f, -1.0f};

static void iq4nl_dequant(const void *src, float *dst, int64_t n) {
    const block_iq4_nl *b = src;
    for (int64_t i = 0; i < n / QK4_0; i++, dst += QK4_0) {
        const float d = quant_f16_lut[b[i].d];
        for (int j = 0; j < 16; j++) {
            dst[j] = d * (float)iq4nl_values[b[i].qs[j] & 0xF];
            dst[j + 16] = d * (float)iq4nl_values[b[i].qs[j] >> 4];
        }
    }
}

static void iq4xs_dequant(const void *src, float *dst, int64_t n) {
    const block_iq4_xs *b = src;
    for (int64_t i = 0; i < n / QK_K; i++) {
        const float d = quant_f16_lut[b[i].d];
        for (int j = 0; j < 8; j++, dst += 32) {
            const float dl = d * (float)iq4xs_ls(&b[i], j);
            const uint8_t *qs = b[i].qs + 16 * j;
            for (int k = 0; k < 16; k++) {
                dst[k] = dl * (float)iq4nl_values[qs[k] & 0xF];
                dst[k + 16] = dl * (float)iq4nl_values[qs[k] >> 4];
            }
        }
    }
}

static void iq3xxs_dequant(const void *src, float *dst, int64_t n) {
    const block_iq3_xxs *b = src;
    for (int64_t i = 0; i < n / QK_K; i++, dst += QK_K) {
        const float d = quant_f16_lut[b[i].d];
        for (int ib = 0; ib < 8; ib++) {
            uint32_t aux;
            memcpy(&aux, b[i].sas + 4 * ib, 4);
            const float db = d * (0.5f + (float)(aux >> 28)) * 0.5f;
            for (int l = 0; l < 4; l++) {
                const uint8_t signs = iq_ksigns[(aux >> (7 * l)) & 127];
                const uint32_t g1 = iq3xxs_grid[b[i].qs[8 * ib + 2 * l]], g2 = iq3xxs_grid[b[i].qs[8 * ib + 2 * l + 1]];
                for (int j = 0; j < 4; j++) {
                    dst[32 * ib + 8 * l + j] = db * (float)((g1 >> (8 * j)) & 0xFF) * k_sign[(signs >> j) & 1];
                    dst[32 * ib + 8 * l + 4 + j] =
                        db * (float)((g2 >> (8 * j)) & 0xFF) * k_sign[(signs >> (j + 4)) & 1];
                }
            }
        }
    }
}

static void iq3s_dequant(const void *src, float *dst, int64_t n) {
    const block_iq3_s *b = src;
    for (int64_t i = 0; i < n / QK_K; i++, dst += QK_K) {
        const float d = quant_f16_lut[b[i].d];
        for (int t = 0; t < 64; t++) {
            const int j = t / 8; /* sub-block of 32 values */
            const float db = d * (float)(1 + 2 * ((b[i].scales[j / 2] >> (4 * (j % 2))) & 0xF));
            const uint32_t g = iq3s_grid[b[i].qs[t] | (((b[i].qh[t / 8] >> (t % 8)) & 1) << 8)];
            for (int k = 0; k < 4; k++) {
                const int v = 4 * t + k;
                dst[v] = db * (float)((g >> (8 * k)) & 0xFF) * k_sign[(b[i].signs[v / 8] >> (v % 8)) & 1];
            }
        }
    }
}

static void iq2xs_dequant(const void *src, float *dst, int64_t n) {
    const block_iq2_xs *b = src;
    for (int64_t i = 0; i < n / QK_K; i++, dst += QK_K) {
        const float d = quant_f16_lut[b[i].d];
        for (int t = 0; t < 32; t++) {
            const int g = t / 2; /* group of 16 values */
            const float db = d * (0.5f + (float)((b[i].scales[g / 2] >> (4 * (g % 2))) & 0xF)) * 0.25f;
            const uint64_t gr = iq2xs_grid[b[i].qs[t] & 511];
            const uint8_t signs = iq_ksigns[b[i].qs[t] >> 9];
            for (int j = 0; j < 8; j++)
                dst[8 * t + j] = db * (float)((gr >> (8 * j)) & 0xFF) * k_sign[(signs >> j) & 1];
        }
    }
}

/* ---- dot products ----------------------------------------------------------------------------- */

static inline int32_t idot(const int8_t *q, const int8_t *a, int len) {
    int32_t s = 0;
    for (int k = 0; k < len; k++) s += (int32_t)q[k] * a[k];
    return s;
}

/* IQ4_NL against Q8_0: |v| <= 127, so a block's sum is at most 32 * 127 * 127. Lanes mod 8. */
static float iq4nl_vec_dot(int64_t n, const void *w, const void *act) {
    const block_iq4_nl *x = w;
    const block_q8_0_act *y = act;
    float acc[8] = {0};
    for (int64_t i = 0; i < n / QK4_0; i++) {
        int32_t s = 0;
        for (int j = 0; j < 16; j++)
            s += iq4nl_values[x[i].qs[j] & 0xF] * y[i].qs[j] + iq4nl_values[x[i].qs[j] >> 4] * y[i].qs[j + 16];
        acc[i & 7] += (quant_f16_lut[x[i].d] * quant_f16_lut[y[i].d]) * (float)s;
    }
    return quant_sum8(acc);
}

/* IQ4_XS: |ls| <= 32: |A| <= 8 * 32 * 32 * 127 * 127. */
static float iq4xs_vec_dot(int64_t n, const void *w, const void *act) {
    const block_iq4_xs *x = w;
    const block_q8_K *y = act;
    float sum = 0.0f;
    for (int64_t i = 0; i < n / QK_K; i++) {
        int32_t A = 0;
        for (int j = 0; j < 8; j++) {
            const uint8_t *qs = x[i].qs + 16 * j;
            const int8_t *a = y[i].qs + 32 * j;
            int32_t s = 0;
            for (int k = 0; k < 16; k++) s += iq4nl_values[qs[k] & 0xF] * a[k] + iq4nl_values[qs[k] >> 4] * a[k + 16];
            A += iq4xs_ls(&x[i], j) * s;
        }
        sum += (quant_f16_lut[x[i].d] * y[i].d) * (float)A;
    }
    return sum;
}

/* IQ3_XXS: grid <= 62, 2 s + 1 <= 31: |A| <= 8 * 31 * 32 * 62 * 127. */
static float iq3xxs_vec_dot(int64_t n, const void *w, const void *act) {
    const block_iq3_xxs *x = w;
    const block_q8_K *y = act;
    float sum = 0.0f;
    for (int64_t i = 0; i < n / QK_K; i++) {
        int8_t q[QK_K];
        int32_t f[8], A = 0;
        iq3xxs_values(&x[i], q, f);
        for (int j = 0; j < 8; j++) A += f[j] * idot(q + 32 * j, y[i].qs + 32 * j, 32);
        sum += ((quant_f16_lut[x[i].d] * y[i].d) * 0.25f) * (float)A;
    }
    return sum;
}

/* IQ3_S: grid <= 15, 1 + 2 s <= 31: |A| <= 8 * 31 * 32 * 15 * 127. */
static float iq3s_vec_dot(int64_t n, const void *w, const void *act) {
    const block_iq3_s *x = w;
    const block_q8_K *y = act;
    float sum = 0.0f;
    for (int64_t i = 0; i < n / QK_K; i++) {
        int8_t q[QK_K];
        int32_t f[8], A = 0;
        iq3s_values(&x[i], q, f);
        for (int j = 0; j < 8; j++) A += f[j] * idot(q + 32 * j, y[i].qs + 32 * j, 32);
        sum += (quant_f16_lut[x[i].d] * y[i].d) * (float)A;
    }
    return sum;
}

/* IQ2_XS: grid <= 43, 2 s + 1 <= 31: |A| <= 16 * 31 * 16 * 43 * 127. */
static float iq2xs_vec_dot(int64_t n, const void *w, const void *act) {
    const block_iq2_xs *x = w;
    const block_q8_K *y = act;
    float sum = 0.0f;
    for (int64_t i = 0; i < n / QK_K; i++) {
        int8_t q[QK_K];
        int32_t f[16], A = 0;
        iq2xs_values(&x[i], q, f);
        for (int j = 0; j < 16; j++) A += f[j] * idot(q + 16 * j, y[i].qs + 16 * j, 16);
        sum += ((quant_f16_lut[x[i].d] * y[i].d) * 0.125f) * (float)A;
    }
    return sum;
}

/* ---- registration ------------------------------------------------------------------------------- */

void quant_register_iq(quant_traits t[], int32_t simd) {
    t[STRATA_TYPE_IQ4_NL] = (quant_traits){"IQ4_NL",         STRATA_TYPE_IQ4_NL, QK4_0, sizeof(block_iq4_nl),
                                           STRATA_TYPE_Q8_0, iq4nl_dequant,      NULL,  iq4nl_vec_dot};
#define IQ(T, name, blk, deq, dot) t[T] = (quant_traits){name, T, QK_K, sizeof(blk), STRATA_TYPE_Q8_K, deq, NULL, dot}
    IQ(STRATA_TYPE_IQ4_XS, "IQ4_XS", block_iq4_xs, iq4xs_dequant, iq4xs_vec_dot);
    IQ(STRATA_TYPE_IQ3_XXS, "IQ3_XXS", block_iq3_xxs, iq3xxs_dequant, iq3xxs_vec_dot);
    IQ(STRATA_TYPE_IQ3_S, "IQ3_S", block_iq3_s, iq3s_dequant, iq3s_vec_dot);
    IQ(STRATA_TYPE_IQ2_XS, "IQ2_XS", block_iq2_xs, iq2xs_dequant, iq2xs_vec_dot);
#undef IQ
    if (simd >= STRATA_SIMD_AVX2) quant_iq_avx2(t);
    if (simd >= STRATA_SIMD_AVX512) quant_iq_avx512(t);
}
