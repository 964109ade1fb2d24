/*
 * quant_reduce16.h — helpers of the AVX-512 four-row kernels: the horizontal sums of sixteen int32
 * accumulators at once (16 (row, token) pairs in registers), and the decode prefetch. Integer adds
 * are exact, so the order of the tree changes nothing; it only has to put pair p's sum in lane p.
 */
#ifndef STRATA_QUANT_REDUCE16_H
#define STRATA_QUANT_REDUCE16_H

#include <immintrin.h>
#include <stdint.h>

#include "quant_blocks.h"

/* From the first level: a[p] holds in lanes 0-7 partials of pair p and in lanes 8-15 partials of
 * pair p + 8 (p < 8). Returns lane p = the sum of pair p's partials. */
static inline __m512i reduce16_from8(const __m512i a[8]) {
    __m512i b[4], c[2];
    for (int p = 0; p < 4; p++)
        b[p] = _mm512_add_epi32(_mm512_shuffle_i32x4(a[p], a[p + 4], 0x88), _mm512_shuffle_i32x4(a[p], a[p + 4], 0xDD));
    /* b[p]: 128-bit lanes hold p, p + 8, p + 4, p + 12 */
    for (int p = 0; p < 2; p++)
        c[p] = _mm512_add_epi32(_mm512_unpacklo_epi64(b[p], b[p + 2]), _mm512_unpackhi_epi64(b[p], b[p + 2]));
    /* c[p]: in 128-bit lane k, two partials of (off_k + p), two of (off_k + p + 2); off = 0, 8, 4, 12 */
    const __m512 c0 = _mm512_castsi512_ps(c[0]), c1 = _mm512_castsi512_ps(c[1]);
    const __m512i d = _mm512_add_epi32(_mm512_castps_si512(_mm512_shuffle_ps(c0, c1, _MM_SHUFFLE(2, 0, 2, 0))),
                                       _mm512_castps_si512(_mm512_shuffle_ps(c0, c1, _MM_SHUFFLE(3, 1, 3, 1))));
    /* d lane 4k + e holds off_k + (0, 2, 1, 3)[e] */
    return _mm512_permutexvar_epi32(_mm512_setr_epi32(0, 2, 1, 3, 8, 10, 9, 11, 4, 6, 5, 7, 12, 14, 13, 15), d);
}

/* Sixteen accumulators -> lane p = the sum of v[p]'s lanes. */
static inline __m512i reduce16(const __m512i v[16]) {
    __m512i a[8];
    for (int p = 0; p < 8; p++)
        a[p] = _mm512_add_epi32(_mm512_shuffle_i32x4(v[p], v[p + 8], 0x44), _mm512_shuffle_i32x4(v[p], v[p + 8], 0xEE));
    return reduce16_from8(a);
}

/* Lane 4 r + k of the (row, token) pair vectors: the row's and the token's value. */
static inline __m512 pairs_by_row(const float v[4]) {
    return _mm512_permutexvar_ps(_mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3),
                                 _mm512_castps128_ps512(_mm_loadu_ps(v)));
}
static inline __m512 pairs_by_token(__m128 v) {
    const __m512i idx = _mm512_setr_epi32(0, 1, 2, 3, 0, 1, 2, 3, 0, 1, 2, 3, 0, 1, 2, 3);
    return _mm512_permutexvar_ps(idx, _mm512_castps128_ps512(v));
}

/* The 16 pair sums (lane 4 r + k) of tokens k < kn into out token-major: out[4 k + r]. */
static inline void store_pairs(float *out, __m512 sums, int32_t kn) {
    const __m512i idx = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
    const __m512 t = _mm512_permutexvar_ps(idx, sums);
    _mm512_mask_storeu_ps(out, (__mmask16)(kn >= 4 ? 0xFFFF : (1u << (4 * kn)) - 1u), t);
}

/* The Q8_K blocks from c0 on of four activation rows act[0..3] for the four-token steps of the
 * many-token kernels; with n < 4 real rows, the first stands in for the rest (their sums are never
 * stored). */
static inline void q8k_rows4(const void *const *act, int32_t n, int64_t c0, const block_q8_K *y[4]) {
    for (int k = 0; k < 4; k++) y[k] = (const block_q8_K *)act[k < n ? k : 0] + c0;
}

/* Lane 4 r + k: the activation scale y.d of block c of token k. */
static inline __m512 token_scales(const block_q8_K *const y[4], int64_t c) {
    return pairs_by_token(_mm_setr_ps(y[0][c].d, y[1][c].d, y[2][c].d, y[3][c].d));
}

/* The first reduction level (for reduce16_from8) of the 16 (row, token) sums of f[r] . bsums: f[r] holds
 * row r's 16 int16 multipliers of the 16 block sums of block c (the minimums of Q4_K/Q5_K, the scales of
 * Q3_K/Q6_K); out[4 r + k] (r < 2) has row r in lanes 0-7 and row r + 2 in lanes 8-15, token k. */
static inline void bsum_pairs(const __m256i f[4], const block_q8_K *const y[4], int64_t c, __m512i out[8]) {
    for (int k = 0; k < 4; k++) {
        const __m512i bs = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)y[k][c].bsums));
        for (int r = 0; r < 2; r++)
            out[4 * r + k] = _mm512_madd_epi16(bs, _mm512_inserti64x4(_mm512_castsi256_si512(f[r]), f[r + 2], 1));
    }
}

/* Prefetch the block of `bytes` at p (every cache line it touches) for the decode kernels: they
 * stream whole matrices once per token and are bound by memory latency; a prefetch past the end of a
 * matrix is a hint that never faults. */
#define QUANT_PREFETCH_ROWS 16
static inline __attribute__((always_inline)) void prefetch_block(const void *p, int bytes) {
    const char *c = (const char *)p;
    for (int o = 0; o < bytes; o += 64) _mm_prefetch(c + o, _MM_HINT_T0);
    _mm_prefetch(c + bytes - 1, _MM_HINT_T0);
}

#endif
