/*
 * quant_low_avx2.c — AVX2 dot products of IQ2_XXS, IQ2_S, IQ1_S, IQ1_M and MXFP4: the blocks are
 * unpacked by quant_low.h's portable code, the products summed exactly with maddubs (|q| times the
 * activation carrying q's sign: pairs at most 2 * 43 * 127) and madd by the int16 factors, so the
 * integer sums, and the float steps after them, are the scalar kernel's.
 */
#include <immintrin.h>

#include "common.h"
#include "quant_low.h"
#include "strata.h"

static inline int32_t hsum_i32(__m256i v) {
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, _MM_SHUFFLE(1, 0, 3, 2)));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, _MM_SHUFFLE(2, 3, 0, 1)));
    return _mm_cvtsi128_si32(s);
}

static inline __m256i pairs(const int8_t *q, const int8_t *a) {
    const __m256i v = _mm256_loadu_si256((const __m256i *)q), x = _mm256_loadu_si256((const __m256i *)a);
    return _mm256_maddubs_epi16(_mm256_sign_epi8(v, v), _mm256_sign_epi8(x, v));
}

static inline int32_t low_idot_avx2(const low_unpacked *u, const int8_t *a) {
    __m256i acc = _mm256_setzero_si256();
    for (int p = 0; p < 8; p++)
        acc = _mm256_add_epi32(acc, _mm256_madd_epi16(pairs(u->q + 32 * p, a + 32 * p),
                                                      _mm256_loadu_si256((const __m256i *)(u->fl + 16 * p))));
    return hsum_i32(acc);
}

/* MXFP4: the 32 values by one byte shuffle of the nibbles (low nibbles are values 0..15). */
static inline int32_t mxdot_avx2(const block_mxfp4 *b, const int8_t *a) {
    const __m128i lut = _mm_loadu_si128((const __m128i *)mxfp4_values), m4 = _mm_set1_epi8(0x0F);
    const __m128i qs = _mm_loadu_si128((const __m128i *)b->qs);
    const __m256i idx = _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(qs, 4), m4), _mm_and_si128(qs, m4));
    const __m256i v = _mm256_shuffle_epi8(_mm256_broadcastsi128_si256(lut), idx);
    const __m256i x = _mm256_loadu_si256((const __m256i *)a);
    return hsum_i32(
        _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_sign_epi8(v, v), _mm256_sign_epi8(x, v)), _mm256_set1_epi16(1)));
}

LOW_LEVEL_KERNELS(avx2, low_idot_avx2, mxdot_avx2)

void quant_low_avx2(quant_traits t[]) { low_set_avx2(t); }
