/*
 * quant_low_avx512.c — AVX-512 (BW + VNNI) dot products of IQ2_XXS, IQ2_S, IQ1_S, IQ1_M and MXFP4:
 * quant_low.h's portable unpacking, then per 64 values |q| times the activation with q's sign
 * (masked negate; |a| <= 127 never overflows) by maddubs, and dpwssd by the int16 factors: exact
 * int32 sums, the scalar kernel's A, the same float steps.
 */
#include <immintrin.h>

#include "common.h"
#include "quant_low.h"
#include "strata.h"

static inline int32_t low_idot_avx512(const low_unpacked *u, const int8_t *a) {
    __m512i acc = _mm512_setzero_si512();
    for (int p = 0; p < 4; p++) {
        const __m512i v = _mm512_loadu_si512((const void *)(u->q + 64 * p));
        const __m512i x = _mm512_loadu_si512((const void *)(a + 64 * p));
        const __m512i sx = _mm512_mask_sub_epi8(x, _mm512_movepi8_mask(v), _mm512_setzero_si512(), x);
        acc = _mm512_dpwssd_epi32(acc, _mm512_maddubs_epi16(_mm512_abs_epi8(v), sx),
                                  _mm512_loadu_si512((const void *)(u->fl + 32 * p)));
    }
    return _mm512_reduce_add_epi32(acc);
}

/* MXFP4: the 32 values by one byte shuffle of the nibbles (low nibbles are values 0..15). */
static inline int32_t mxdot_avx512(const block_mxfp4 *b, const int8_t *a) {
    const __m128i lut = _mm_loadu_si128((const __m128i *)mxfp4_values), m4 = _mm_set1_epi8(0x0F);
    const __m128i qs = _mm_loadu_si128((const __m128i *)b->qs);
    const __m256i idx = _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(qs, 4), m4), _mm_and_si128(qs, m4));
    const __m256i v = _mm256_shuffle_epi8(_mm256_broadcastsi128_si256(lut), idx);
    const __m256i x = _mm256_loadu_si256((const __m256i *)a);
    const __m256i s = _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_abs_epi8(v), _mm256_sign_epi8(x, v)),
                                        _mm256_set1_epi16(1));
    __m128i r = _mm_add_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
    r = _mm_add_epi32(r, _mm_shuffle_epi32(r, _MM_SHUFFLE(1, 0, 3, 2)));
    r = _mm_add_epi32(r, _mm_shuffle_epi32(r, _MM_SHUFFLE(2, 3, 0, 1)));
    return _mm_cvtsi128_si32(r);
}

LOW_LEVEL_KERNELS(avx512, low_idot_avx512, mxdot_avx512)

void quant_low_avx512(quant_traits t[]) { low_set_avx512(t); }
