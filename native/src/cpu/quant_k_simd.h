/*
 * quant_k_simd.h — helpers of the Q4_K/Q5_K SIMD kernels shared by the AVX2 and AVX-512 files. They use
 * only SSE4.1-level instructions, so each file compiles them with its own instruction set.
 */
#ifndef STRATA_QUANT_K_SIMD_H
#define STRATA_QUANT_K_SIMD_H

#include <immintrin.h>
#include <stdint.h>
#include <string.h>

/* The 8 6-bit scales (sc) and mins (m) of a Q4_K/Q5_K block, one per byte, from its 12 bytes:
 * bytes 0..3 hold sc0..3 (low 6 bits) and the top bits of sc4..7; 4..7 the same for the mins;
 * 8..11 the low nibbles of sc4..7 and (high nibbles) of m4..7. */
static inline uint64_t k_scale_words(const uint8_t *s, uint8_t sc[8]) {
    uint32_t w[3];
    memcpy(w, s, 12);
    const uint32_t s_lo = w[0] & 0x3f3f3f3fu, s_hi = (w[2] & 0x0f0f0f0fu) | ((w[0] >> 2) & 0x30303030u);
    const uint32_t m_lo = w[1] & 0x3f3f3f3fu, m_hi = ((w[2] >> 4) & 0x0f0f0f0fu) | ((w[1] >> 2) & 0x30303030u);
    memcpy(sc, &s_lo, 4);
    memcpy(sc + 4, &s_hi, 4);
    /* the mins stay in a register: an 8-byte load of two 4-byte stores just made would stall */
    return (uint64_t)m_lo | ((uint64_t)m_hi << 32);
}

/* B = sum_j m_j * (bsums[2j] + bsums[2j+1]) */
static inline int32_t k_min_sum(uint64_t m, const int16_t *bsums) {
    const __m128i b0 = _mm_loadu_si128((const __m128i *)bsums), b1 = _mm_loadu_si128((const __m128i *)(bsums + 8));
    const __m128i pairs = _mm_hadd_epi16(b0, b1); /* |pair| <= 2 * 16 * 127 */
    const __m128i mm = _mm_cvtepu8_epi16(_mm_cvtsi64_si128((long long)m));
    __m128i s = _mm_madd_epi16(pairs, mm);
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, _MM_SHUFFLE(1, 0, 3, 2)));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, _MM_SHUFFLE(2, 3, 0, 1)));
    return _mm_cvtsi128_si32(s);
}

#endif
