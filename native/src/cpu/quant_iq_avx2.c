/*
 * quant_iq_avx2.c — AVX2 dot products of the i-quants against Q8_K activations (IQ4_NL's, a
 * 32-value type, is in quant_legacy_avx2.c).
 *
 * Same arithmetic as quant_iq.c: exact int32 sums per block (bounds noted there), one float
 * expression per block, blocks in order: bit-identical to the scalar kernels.
 *   IQ4_XS: the 4-bit indices select the table values with one byte shuffle.
 *   IQ3_XXS, IQ3_S, IQ2_XS: grid entries are gathered by index (scalar loads of 4 or 8 bytes), the
 *   signs are applied to the activations (sign_epi8), and the magnitudes (unsigned) are multiplied
 *   by them with maddubs: pairs at most 2 * 62 * 127, no saturation.
 */
#include <immintrin.h>
#include <string.h>

#include "common.h"
#include "iq_tables.h"
#include "quant_blocks.h"
#include "strata.h"

static inline __m256i load256(const void *p) { return _mm256_loadu_si256((const __m256i *)p); }

static inline int32_t hsum_i32(__m256i v) {
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, _MM_SHUFFLE(1, 0, 3, 2)));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, _MM_SHUFFLE(2, 3, 0, 1)));
    return _mm_cvtsi128_si32(s);
}

/* ---- IQ4_XS ------------------------------------------------------------------------------------ */

static float iq4xs_vec_dot_avx2(int64_t n, const void *w, const void *act) {
    const block_iq4_xs *x = w;
    const block_q8_K *y = act;
    const __m256i lut = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)iq4nl_values));
    const __m256i m4 = _mm256_set1_epi8(0x0F), one16 = _mm256_set1_epi16(1);
    float sum = 0.0f;
    for (int64_t i = 0; i < n / QK_K; i++) {
        const int8_t *q8 = y[i].qs;
        __m256i acc = _mm256_setzero_si256();
        for (int p = 0; p < 4; p++) { /* sub-blocks 2p and 2p + 1: 32 bytes of indices */
            const __m256i bits = load256(x[i].qs + 32 * p);
            const __m256i lo = _mm256_and_si256(bits, m4);
            const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(bits, 4), m4);
            /* sub-block 2p: low nibbles of bytes 0..15 then their high nibbles; 2p + 1: bytes 16..31 */
            const __m256i v0 = _mm256_shuffle_epi8(lut, _mm256_permute2x128_si256(lo, hi, 0x20));
            const __m256i v1 = _mm256_shuffle_epi8(lut, _mm256_permute2x128_si256(lo, hi, 0x31));
            const __m256i a0 = load256(q8 + 64 * p), a1 = load256(q8 + 64 * p + 32);
            __m256i s0 =
                _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_sign_epi8(v0, v0), _mm256_sign_epi8(a0, v0)), one16);
            __m256i s1 =
                _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_sign_epi8(v1, v1), _mm256_sign_epi8(a1, v1)), one16);
            const int ls0 = (((x[i].scales_l[p] & 0xF) | (((x[i].scales_h >> (4 * p)) & 3) << 4))) - 32;
            const int ls1 = (((x[i].scales_l[p] >> 4) | (((x[i].scales_h >> (4 * p + 2)) & 3) << 4))) - 32;
            s0 = _mm256_mullo_epi32(s0, _mm256_set1_epi32(ls0));
            s1 = _mm256_mullo_epi32(s1, _mm256_set1_epi32(ls1));
            acc = _mm256_add_epi32(acc, _mm256_add_epi32(s0, s1));
        }
        const int32_t A = hsum_i32(acc);
        sum += (quant_f16_lut[x[i].d] * y[i].d) * (float)A;
    }
    return sum;
}

/* ---- grid types --------------------------------------------------------------------------------- */

/* Four bytes of sign bits -> 32 bytes of +1 / -1 (byte 8k + j is -1 when bit j of s_k is set), to be
 * applied to the activations with sign_epi8. The byte shuffle works inside each 128-bit lane, so s0, s1
 * go to bytes 0 and 4 of the low lane and s2, s3 to bytes 0 and 4 of the high one. */
static inline __m256i signs32(uint32_t s0, uint32_t s1, uint32_t s2, uint32_t s3) {
    const __m256i shuf = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 4, 4, 4, 4, 4, 4, 4, 4, 0, 0, 0, 0, 0, 0, 0, 0, 4, 4,
                                          4, 4, 4, 4, 4, 4);
    const __m256i bit = _mm256_set1_epi64x((long long)0x8040201008040201ULL);
    __m256i v = _mm256_shuffle_epi8(_mm256_setr_epi32((int)s0, (int)s1, 0, 0, (int)s2, (int)s3, 0, 0), shuf);
    v = _mm256_cmpeq_epi8(_mm256_and_si256(v, bit), bit);
    return _mm256_or_si256(v, _mm256_set1_epi8(1));
}

static float iq3xxs_vec_dot_avx2(int64_t n, const void *w, const void *act) {
    const block_iq3_xxs *x = w;
    const block_q8_K *y = act;
    const __m256i one16 = _mm256_set1_epi16(1);
    float sum = 0.0f;
    for (int64_t i = 0; i < n / QK_K; i++) {
        const uint8_t *qs = x[i].qs;
        const int8_t *q8 = y[i].qs;
        __m256i acc = _mm256_setzero_si256();
        for (int ib = 0; ib < 8; ib++) {
            uint32_t aux;
            memcpy(&aux, x[i].sas + 4 * ib, 4);
            const __m256i g = _mm256_setr_epi32((int)iq3xxs_grid[qs[8 * ib + 0]], (int)iq3xxs_grid[qs[8 * ib + 1]],
                                                (int)iq3xxs_grid[qs[8 * ib + 2]], (int)iq3xxs_grid[qs[8 * ib + 3]],
                                                (int)iq3xxs_grid[qs[8 * ib + 4]], (int)iq3xxs_grid[qs[8 * ib + 5]],
                                                (int)iq3xxs_grid[qs[8 * ib + 6]], (int)iq3xxs_grid[qs[8 * ib + 7]]);
            const __m256i sg = signs32(iq_ksigns[aux & 127], iq_ksigns[(aux >> 7) & 127], iq_ksigns[(aux >> 14) & 127],
                                       iq_ksigns[(aux >> 21) & 127]);
            const __m256i a = _mm256_sign_epi8(load256(q8 + 32 * ib), sg);
            __m256i s = _mm256_madd_epi16(_mm256_maddubs_epi16(g, a), one16);
            s = _mm256_mullo_epi32(s, _mm256_set1_epi32(2 * (int32_t)(aux >> 28) + 1));
            acc = _mm256_add_epi32(acc, s);
        }
        const int32_t A = hsum_i32(acc);
        sum += ((quant_f16_lut[x[i].d] * y[i].d) * 0.25f) * (float)A;
    }
    return sum;
}

static float iq3s_vec_dot_avx2(int64_t n, const void *w, const void *act) {
    const block_iq3_s *x = w;
    const block_q8_K *y = act;
    const __m256i one16 = _mm256_set1_epi16(1);
    float sum = 0.0f;
    for (int64_t i = 0; i < n / QK_K; i++) {
        const uint8_t *qs = x[i].qs;
        const int8_t *q8 = y[i].qs;
        __m256i acc = _mm256_setzero_si256();
        for (int ib = 0; ib < 8; ib++) {
            const uint32_t h = x[i].qh[ib];
            int32_t gi[8];
            for (int t = 0; t < 8; t++) gi[t] = (int32_t)iq3s_grid[qs[8 * ib + t] | (((h >> t) & 1) << 8)];
            const __m256i g = _mm256_loadu_si256((const __m256i *)gi);
            const uint8_t *sb = x[i].signs + 4 * ib;
            const __m256i sg = signs32(sb[0], sb[1], sb[2], sb[3]);
            const __m256i a = _mm256_sign_epi8(load256(q8 + 32 * ib), sg);
            __m256i s = _mm256_madd_epi16(_mm256_maddubs_epi16(g, a), one16);
            const int f = 1 + 2 * ((x[i].scales[ib / 2] >> (4 * (ib % 2))) & 0xF);
            acc = _mm256_add_epi32(acc, _mm256_mullo_epi32(s, _mm256_set1_epi32(f)));
        }
        const int32_t A = hsum_i32(acc);
        sum += (quant_f16_lut[x[i].d] * y[i].d) * (float)A;
    }
    return sum;
}

static float iq2xs_vec_dot_avx2(int64_t n, const void *w, const void *act) {
    const block_iq2_xs *x = w;
    const block_q8_K *y = act;
    float sum = 0.0f;
    for (int64_t i = 0; i < n / QK_K; i++) {
        const uint16_t *qs = x[i].qs;
        const int8_t *q8 = y[i].qs;
        __m256i acc = _mm256_setzero_si256();
        for (int p = 0; p < 8; p++) { /* 32 values: groups 2p and 2p + 1 of 16 */
            const __m256i g = _mm256_setr_epi64x(
                (long long)iq2xs_grid[qs[4 * p] & 511], (long long)iq2xs_grid[qs[4 * p + 1] & 511],
                (long long)iq2xs_grid[qs[4 * p + 2] & 511], (long long)iq2xs_grid[qs[4 * p + 3] & 511]);
            const __m256i sg = signs32(iq_ksigns[qs[4 * p] >> 9], iq_ksigns[qs[4 * p + 1] >> 9],
                                       iq_ksigns[qs[4 * p + 2] >> 9], iq_ksigns[qs[4 * p + 3] >> 9]);
            const __m256i a = _mm256_sign_epi8(load256(q8 + 32 * p), sg);
            const int16_t f0 = (int16_t)(2 * (x[i].scales[p] & 0xF) + 1), f1 = (int16_t)(2 * (x[i].scales[p] >> 4) + 1);
            const __m256i f = _mm256_setr_epi16(f0, f0, f0, f0, f0, f0, f0, f0, f1, f1, f1, f1, f1, f1, f1, f1);
            acc = _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(g, a), f));
        }
        const int32_t A = hsum_i32(acc);
        sum += ((quant_f16_lut[x[i].d] * y[i].d) * 0.125f) * (float)A;
    }
    return sum;
}

void quant_iq_avx2(quant_traits t[]) {
    t[STRATA_TYPE_IQ4_NL].vec_dot = quant_iq4nl_vec_dot_avx2;
    t[STRATA_TYPE_IQ4_XS].vec_dot = iq4xs_vec_dot_avx2;
    t[STRATA_TYPE_IQ3_XXS].vec_dot = iq3xxs_vec_dot_avx2;
    t[STRATA_TYPE_IQ3_S].vec_dot = iq3s_vec_dot_avx2;
    t[STRATA_TYPE_IQ2_XS].vec_dot = iq2xs_vec_dot_avx2;
}
