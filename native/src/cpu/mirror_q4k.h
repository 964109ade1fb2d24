/*
 * mirror_q4k.h — Q4_K's eight sub-block scales and mins as floats, for the AVX2 and AVX-512 mirror
 * kernels (cpu/mirror_avx2.c, cpu/mirror_avx512.c; both are built with AVX2).
 *
 * The 12 scale bytes s[0..11] hold, for sub-block j (gq_q4k_scale_min):
 *   j < 4:  sc = s[j] & 63,                          m = s[j + 4] & 63
 *   j >= 4: sc = (s[j + 4] & 15) | (s[j - 4] >> 6) << 4,  m = (s[j + 4] >> 4) | (s[j] >> 6) << 4
 * One lane per sub-block; then d * sc and dmin * m, each rounded once as in gq_dequant8.
 */
#ifndef STRATA_MIRROR_Q4K_H
#define STRATA_MIRROR_Q4K_H

#include <immintrin.h>
#include <stdint.h>

#include "../group_dequant.h"

static inline void mirror_q4k_scales(const uint8_t *b, __m256 *dsc, __m256 *dm) {
    /* bytes 4..19 of the block: the 12 scale bytes (and 4 quant bytes, not used) */
    const __m128i s = _mm_loadu_si128((const __m128i *)(b + 4));
    const __m128i lo = _mm_setr_epi8(0, 1, 2, 3, 8, 9, 10, 11, -1, -1, -1, -1, -1, -1, -1, -1);   /* s[j] / s[j+4] */
    const __m128i mi = _mm_setr_epi8(4, 5, 6, 7, 8, 9, 10, 11, -1, -1, -1, -1, -1, -1, -1, -1);   /* s[j+4] */
    const __m128i hs = _mm_setr_epi8(-1, -1, -1, -1, 0, 1, 2, 3, -1, -1, -1, -1, -1, -1, -1, -1); /* s[j-4] */
    const __m128i hm = _mm_setr_epi8(-1, -1, -1, -1, 4, 5, 6, 7, -1, -1, -1, -1, -1, -1, -1, -1); /* s[j] */
    const __m256i a = _mm256_cvtepu8_epi32(_mm_shuffle_epi8(s, lo));
    const __m256i m4 = _mm256_cvtepu8_epi32(_mm_shuffle_epi8(s, mi));
    const __m256i c = _mm256_cvtepu8_epi32(_mm_shuffle_epi8(s, hs));
    const __m256i e = _mm256_cvtepu8_epi32(_mm_shuffle_epi8(s, hm));
    const __m256i low6 = _mm256_setr_epi32(63, 63, 63, 63, 15, 15, 15, 15);
    const __m256i shm = _mm256_setr_epi32(0, 0, 0, 0, 4, 4, 4, 4);
    const __m256i sc = _mm256_or_si256(_mm256_and_si256(a, low6), _mm256_slli_epi32(_mm256_srli_epi32(c, 6), 4));
    const __m256i mn = _mm256_or_si256(_mm256_and_si256(_mm256_srlv_epi32(m4, shm), low6),
                                       _mm256_slli_epi32(_mm256_srli_epi32(e, 6), 4));
    *dsc = _mm256_mul_ps(_mm256_set1_ps(gq_f16(b)), _mm256_cvtepi32_ps(sc));
    *dm = _mm256_mul_ps(_mm256_set1_ps(gq_f16(b + 2)), _mm256_cvtepi32_ps(mn));
}

#endif
