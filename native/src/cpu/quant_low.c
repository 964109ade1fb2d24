/*
 * quant_low.c — portable kernels of IQ2_XXS, IQ2_S, IQ1_S, IQ1_M (against Q8_K activations) and
 * MXFP4 (against Q8_0): dequantization with gguf-py's float32 expressions, and the dot products of
 * quant_low.h (the unpacking and the reduction order are shared with the AVX2 / AVX-512 files).
 */
#include "quant_low.h"

#include "common.h"
#include "strata.h"

/* ---- dequantization (gguf-py's float32 expressions, signs applied by multiplying with +-1) ------- */

static const float k_sign[2] = {1.0f, -1.0f};

static void iq2xxs_dequant(const void *src, float *dst, int64_t n) {
    const block_iq2_xxs *b = src;
    for (int64_t i = 0; i < n / QK_K; i++, dst += QK_K) {
        const float d = quant_f16_lut[b[i].d];
        for (int ib = 0; ib < 8; ib++) {
            const uint32_t a1 = low_u32(b[i].qs + 8 * ib + 4);
            const float db = d * (0.5f + (float)(a1 >> 28)) * 0.25f;
            for (int l = 0; l < 4; l++) {
                const uint64_t g = iq2xxs_grid[b[i].qs[8 * ib + l]];
                const uint8_t s = iq_ksigns[(a1 >> (7 * l)) & 127];
                for (int j = 0; j < 8; j++)
                    dst[32 * ib + 8 * l + j] = db * (float)((g >> (8 * j)) & 0xFF) * k_sign[(s >> j) & 1];
            }
        }
    }
}

static void iq2s_dequant(const void *src, float *dst, int64_t n) {
    const block_iq2_s *b = src;
    for (int64_t i = 0; i < n / QK_K; i++, dst += QK_K) {
        const float d = quant_f16_lut[b[i].d];
        for (int t = 0; t < 32; t++) {
            const int g = t / 2; /* group of 16 values */
            const float db = d * (0.5f + (float)((b[i].scales[g / 2] >> (4 * (g % 2))) & 0xF)) * 0.25f;
            const uint64_t gr = iq2s_grid[iq2s_index(&b[i], t)];
            for (int j = 0; j < 8; j++)
                dst[8 * t + j] = db * (float)((gr >> (8 * j)) & 0xFF) * k_sign[(b[i].signs[t] >> j) & 1];
        }
    }
}

static void iq1s_dequant(const void *src, float *dst, int64_t n) {
    const block_iq1_s *b = src;
    for (int64_t i = 0; i < n / QK_K; i++, dst += QK_K) {
        const float d = quant_f16_lut[b[i].d];
        for (int ib = 0; ib < 8; ib++) {
            const int h = b[i].qh[ib];
            const float dl = d * (float)(2 * ((h >> 12) & 7) + 1);
            const float delta = (h & 0x8000) ? -0.125f : 0.125f;
            for (int l = 0; l < 4; l++) {
                const uint64_t g = iq1s_grid[b[i].qs[4 * ib + l] | (((h >> (3 * l)) & 7) << 8)];
                for (int j = 0; j < 8; j++) dst[32 * ib + 8 * l + j] = dl * ((float)(int8_t)(g >> (8 * j)) + delta);
            }
        }
    }
}

static void iq1m_dequant(const void *src, float *dst, int64_t n) {
    const block_iq1_m *b = src;
    for (int64_t i = 0; i < n / QK_K; i++, dst += QK_K) {
        uint16_t sc[4];
        const float d = quant_f16_lut[iq1m_d(&b[i], sc)];
        for (int t = 0; t < 32; t++) {
            const int j = t / 2; /* scale of 16 values */
            const float dl = d * (float)(2 * ((sc[j / 4] >> (3 * (j % 4))) & 7) + 1);
            const int h = (b[i].qh[t / 2] >> (4 * (t % 2))) & 0xF;
            const float delta = (h & 8) ? -0.125f : 0.125f;
            const uint64_t g = iq1s_grid[b[i].qs[t] | ((h & 7) << 8)];
            for (int k = 0; k < 8; k++) dst[8 * t + k] = dl * ((float)(int8_t)(g >> (8 * k)) + delta);
        }
    }
}

static void mxfp4_dequant(const void *src, float *dst, int64_t n) {
    const block_mxfp4 *b = src;
    for (int64_t i = 0; i < n / 32; i++, dst += 32) {
        const float d = mxfp4_scale(b[i].e);
        for (int j = 0; j < 16; j++) {
            dst[j] = d * (float)mxfp4_values[b[i].qs[j] & 0xF];
            dst[j + 16] = d * (float)mxfp4_values[b[i].qs[j] >> 4];
        }
    }
}

/* ---- exact integer dots ------------------------------------------------------------------------ */

static inline int32_t low_idot_scalar(const low_unpacked *u, const int8_t *a) {
    int32_t A = 0;
    for (int g = 0; g < 16; g++) {
        int32_t s = 0;
        for (int k = 0; k < 16; k++) s += (int32_t)u->q[16 * g + k] * a[16 * g + k];
        A += u->fl[8 * g] * s;
    }
    return A;
}

static inline int32_t mxdot_scalar(const block_mxfp4 *b, const int8_t *a) {
    int8_t q[32];
    mxfp4_unpack(b, q);
    int32_t s = 0;
    for (int k = 0; k < 32; k++) s += (int32_t)q[k] * a[k];
    return s;
}

LOW_LEVEL_KERNELS(scalar, low_idot_scalar, mxdot_scalar)

/* ---- derived tables ------------------------------------------------------------------------------ */

uint64_t low_sign_mask[256];
uint64_t low_iq1_values[2][2048];

/* Called from quant.c's one-time table build (pthread_once), before any kernel runs. */
static void low_tables_fill(void) {
    for (int s = 0; s < 256; s++) {
        uint64_t m = 0;
        for (int j = 0; j < 8; j++)
            if ((s >> j) & 1) m |= (uint64_t)0xFF << (8 * j);
        low_sign_mask[s] = m;
    }
    for (int n = 0; n < 2; n++)
        for (int i = 0; i < 2048; i++) {
            uint64_t v = 0;
            for (int j = 0; j < 8; j++) {
                const int q = 8 * (int8_t)(iq1s_grid[i] >> (8 * j)) + (n ? -1 : 1);
                v |= (uint64_t)(uint8_t)(int8_t)q << (8 * j);
            }
            low_iq1_values[n][i] = v;
        }
}

/* ---- registration ------------------------------------------------------------------------------- */

void quant_register_low(quant_traits t[], int32_t simd) {
    if (simd == STRATA_SIMD_SCALAR) low_tables_fill(); /* the first level registered */
#define LOW(T, name, blk, deq) t[T] = (quant_traits){name, T, QK_K, sizeof(blk), STRATA_TYPE_Q8_K, deq, NULL, NULL}
    LOW(STRATA_TYPE_IQ2_XXS, "IQ2_XXS", block_iq2_xxs, iq2xxs_dequant);
    LOW(STRATA_TYPE_IQ2_S, "IQ2_S", block_iq2_s, iq2s_dequant);
    LOW(STRATA_TYPE_IQ1_S, "IQ1_S", block_iq1_s, iq1s_dequant);
    LOW(STRATA_TYPE_IQ1_M, "IQ1_M", block_iq1_m, iq1m_dequant);
#undef LOW
    t[STRATA_TYPE_MXFP4] = (quant_traits){"MXFP4",          STRATA_TYPE_MXFP4, 32,   sizeof(block_mxfp4),
                                          STRATA_TYPE_Q8_0, mxfp4_dequant,     NULL, NULL};
    low_set_scalar(t);
    if (simd >= STRATA_SIMD_AVX2) quant_low_avx2(t);
    if (simd >= STRATA_SIMD_AVX512) quant_low_avx512(t);
}
