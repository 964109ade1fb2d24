/*
 * quant_legacy_avx512.c — AVX-512 many-token kernel of Q8_0 weights (the prompt path).
 *
 * Q8_0's one-row kernel is the base family's (cpu/quant_avx512.c, q8_0_rows_avx512). This kernel
 * runs exactly its operations for every activation row — the same pairs of blocks in 512-bit halves,
 * the same fused multiply-adds into the same lanes, the same tail block and final tree — only with
 * each weight block loaded and sign-split once for four rows. So out[k] is bit for bit
 * vec_dot(n, w, act[k]); tests/test_quants.py checks that matmul equals matvec for Q8_0 too.
 * The other 32-value types keep their AVX2 kernels.
 */
#include <immintrin.h>
#include <string.h>

#include "common.h"
#include "quant_blocks.h"
#include "strata.h"

static inline float f16_at(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, 2);
    return quant_f16_lut[h];
}

static void q8_0_vec_dot_n_avx512(int64_t n, const void *w, const void *const *act, int32_t n_act, float *out) {
    const uint8_t *a = w;
    const int64_t nb = n / 32;
    for (int32_t k0 = 0; k0 < n_act; k0 += 4) {
        const int32_t kn = n_act - k0 < 4 ? n_act - k0 : 4;
        const uint8_t *b[4];
        for (int k = 0; k < 4; k++) b[k] = act[k0 + (k < kn ? k : 0)];
        __m512 acc2[4];
        for (int k = 0; k < 4; k++) acc2[k] = _mm512_setzero_ps();
        int64_t i = 0;
        for (; i + 2 <= nb; i += 2) {
            const uint8_t *ai = a + i * 34;
            const __m512i qa = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)(ai + 2))),
                                                  _mm256_loadu_si256((const __m256i *)(ai + 36)), 1);
            const __m512i ua = _mm512_abs_epi8(qa);
            const __mmask64 neg = _mm512_movepi8_mask(qa);
            const float da0 = f16_at(ai), da1 = f16_at(ai + 34);
            for (int k = 0; k < 4; k++) {
                const uint8_t *bb = b[k] + i * 34;
                const __m512i qb = _mm512_inserti64x4(
                    _mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)(bb + 2))),
                    _mm256_loadu_si256((const __m256i *)(bb + 36)), 1);
                const __m512i sb = _mm512_mask_sub_epi8(qb, neg, _mm512_setzero_si512(), qb);
                const __m512i p = _mm512_dpbusd_epi32(_mm512_setzero_si512(), ua, sb);
                const __m512 d = _mm512_insertf32x8(_mm512_set1_ps(da0 * f16_at(bb)), _mm256_set1_ps(da1 * f16_at(bb + 34)), 1);
                acc2[k] = _mm512_fmadd_ps(d, _mm512_cvtepi32_ps(p), acc2[k]);
            }
        }
        for (int k = 0; k < kn; k++) {
            const uint8_t *ai = a + i * 34, *bb = b[k] + i * 34;
            __m256 acc = _mm256_add_ps(_mm512_castps512_ps256(acc2[k]), _mm512_extractf32x8_ps(acc2[k], 1));
            if (i < nb) {
                const __m256i qa = _mm256_loadu_si256((const __m256i *)(ai + 2));
                const __m256i qb = _mm256_loadu_si256((const __m256i *)(bb + 2));
                const __m256i p =
                    _mm256_dpbusd_epi32(_mm256_setzero_si256(), _mm256_sign_epi8(qa, qa), _mm256_sign_epi8(qb, qa));
                acc = _mm256_fmadd_ps(_mm256_set1_ps(f16_at(ai) * f16_at(bb)), _mm256_cvtepi32_ps(p), acc);
            }
            __m128 lo = _mm256_castps256_ps128(acc), hi = _mm256_extractf128_ps(acc, 1);
            lo = _mm_add_ps(lo, hi);
            lo = _mm_add_ps(lo, _mm_movehl_ps(lo, lo));
            lo = _mm_add_ss(lo, _mm_movehdup_ps(lo));
            out[k0 + k] = _mm_cvtss_f32(lo);
        }
    }
}

/* [lo x 8 | hi x 8]: the per-lane scale of a pair of blocks */
static inline __m512 pair_scale(float lo, float hi) {
    return _mm512_insertf32x8(_mm512_set1_ps(lo), _mm256_set1_ps(hi), 1);
}

static inline __m512i load_pair(const uint8_t *blk) {
    return _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)(blk + 2))),
                              _mm256_loadu_si256((const __m256i *)(blk + 36)), 1);
}

/* Q8_0, four weight rows x up to four activation rows per pass, 16 accumulators in registers.
 * The integer lanes are vec_dot's (each int32 lane the exact sum of four products) but made with one
 * dpbusd per row and token: the activation goes in unsigned (b + 128, once per token and block) and
 * the accumulator starts at -128 x (the weights' four-value sums, once per row and block), so
 * dpbusd(-128 sum a, b + 128, a) = sum a b exactly. Then per lane the same scale product
 * (da * db), conversion and fused multiply-add as q8_0_rows_avx512, the same odd tail block and
 * final tree: out[4 k + r] is bit for bit vec_dot(n, row r, act[k]). */
static void q8_0_vec_dot_4xn_avx512(int64_t n, const void *w, size_t ws, const void *const *act, int32_t n_act,
                                    float *out) {
    const uint8_t *a = w;
    const int64_t nb = n / 32;
    const __m512i x80 = _mm512_set1_epi8((char)0x80);
    for (int32_t k0 = 0; k0 < n_act; k0 += 4) {
        const int32_t kn = n_act - k0 < 4 ? n_act - k0 : 4;
        const uint8_t *b[4];
        for (int k = 0; k < 4; k++) b[k] = act[k0 + (k < kn ? k : 0)];
        __m512 acc[4][4];
        for (int r = 0; r < 4; r++)
            for (int k = 0; k < 4; k++) acc[r][k] = _mm512_setzero_ps();
        int64_t i = 0;
        for (; i + 2 <= nb; i += 2) {
            __m512i bu[4];
            __m512 db[4];
            for (int k = 0; k < 4; k++) {
                const uint8_t *bb = b[k] + i * 34;
                bu[k] = _mm512_xor_si512(load_pair(bb), x80);
                db[k] = pair_scale(f16_at(bb), f16_at(bb + 34));
            }
            for (int r = 0; r < 4; r++) {
                const uint8_t *ai = a + (size_t)r * ws + i * 34;
                const __m512i qa = load_pair(ai);
                const __m512i zero = _mm512_setzero_si512();
                const __m512i corr = _mm512_sub_epi32(zero, _mm512_dpbusd_epi32(zero, x80, qa));
                const __m512 da = pair_scale(f16_at(ai), f16_at(ai + 34));
                for (int k = 0; k < 4; k++) {
                    const __m512i p = _mm512_dpbusd_epi32(corr, bu[k], qa);
                    acc[r][k] = _mm512_fmadd_ps(_mm512_mul_ps(da, db[k]), _mm512_cvtepi32_ps(p), acc[r][k]);
                }
            }
        }
        for (int r = 0; r < 4; r++) {
            for (int k = 0; k < kn; k++) {
                const uint8_t *ai = a + (size_t)r * ws + i * 34, *bb = b[k] + i * 34;
                __m256 s = _mm256_add_ps(_mm512_castps512_ps256(acc[r][k]), _mm512_extractf32x8_ps(acc[r][k], 1));
                if (i < nb) {
                    const __m256i qa = _mm256_loadu_si256((const __m256i *)(ai + 2));
                    const __m256i qb = _mm256_loadu_si256((const __m256i *)(bb + 2));
                    const __m256i p =
                        _mm256_dpbusd_epi32(_mm256_setzero_si256(), _mm256_sign_epi8(qa, qa), _mm256_sign_epi8(qb, qa));
                    s = _mm256_fmadd_ps(_mm256_set1_ps(f16_at(ai) * f16_at(bb)), _mm256_cvtepi32_ps(p), s);
                }
                __m128 lo = _mm256_castps256_ps128(s), hi = _mm256_extractf128_ps(s, 1);
                lo = _mm_add_ps(lo, hi);
                lo = _mm_add_ps(lo, _mm_movehl_ps(lo, lo));
                lo = _mm_add_ss(lo, _mm_movehdup_ps(lo));
                out[(size_t)(k0 + k) * 4 + r] = _mm_cvtss_f32(lo);
            }
        }
    }
}

void quant_legacy_avx512(quant_traits t[]) {
    quant_set_xn(t, STRATA_TYPE_Q8_0, q8_0_vec_dot_n_avx512);
    quant_set_4xn(t, STRATA_TYPE_Q8_0, q8_0_vec_dot_4xn_avx512);
}
