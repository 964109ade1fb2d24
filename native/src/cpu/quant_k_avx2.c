/*
 * quant_k_avx2.c — AVX2 dot products of the K-quants against Q8_K activations.
 *
 * Same arithmetic as quant_k.c: per block the exact integer sums A (and B for the types with
 * minimums) are built in int32 lanes — maddubs multiplies unsigned weight values by signed 8-bit
 * activations into int16 pairs (bounds per type below: no saturation), madd scales the pairs by the
 * sub-block scale into int32 — then reduced horizontally, and the block adds the same float
 * expression as the scalar code. So the results are bit-identical to the scalar kernels.
 */
#include <immintrin.h>
#include <string.h>

#include "common.h"
#include "quant_blocks.h"
#include "quant_k_simd.h"
#include "strata.h"

static inline int32_t hsum_i32(__m256i v) {
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, _MM_SHUFFLE(1, 0, 3, 2)));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, _MM_SHUFFLE(2, 3, 0, 1)));
    return _mm_cvtsi128_si32(s);
}

static inline __m256i load256(const void *p) { return _mm256_loadu_si256((const __m256i *)p); }

/* int16 lanes 0-7 = scale byte j, lanes 8-15 = scale byte j + 1 of `sc` (16 signed scale bytes in both
 * 128-bit halves); index bytes with the top bit set give 0, the sign is restored by a shift pair. */
static inline __m256i scales_for(__m256i sc, int j) {
    const __m256i base = _mm256_setr_epi8(0, -128, 0, -128, 0, -128, 0, -128, 0, -128, 0, -128, 0, -128, 0, -128, 1, -128,
                                          1, -128, 1, -128, 1, -128, 1, -128, 1, -128, 1, -128, 1, -128);
    const __m256i v = _mm256_shuffle_epi8(sc, _mm256_add_epi8(base, _mm256_set1_epi8((char)j)));
    return _mm256_srai_epi16(_mm256_slli_epi16(v, 8), 8);
}

/* ---- Q4_K: q <= 15, so a maddubs pair is at most 2 * 15 * 127 --------------------------------- */

static float q4k_vec_dot_avx2(int64_t n, const void *w, const void *act) {
    const block_q4_K *x = w;
    const block_q8_K *y = act;
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    float sum = 0.0f;
    for (int64_t i = 0; i < n / QK_K; i++) {
        uint8_t sc[8];
        const uint64_t m = k_scale_words(x[i].scales, sc);
        const int32_t B = k_min_sum(m, y[i].bsums);
        const uint8_t *q4 = x[i].qs;
        const int8_t *q8 = y[i].qs;
        __m256i acc = _mm256_setzero_si256();
        for (int g = 0; g < 4; g++) {
            const __m256i bits = load256(q4 + 32 * g);
            const __m256i lo = _mm256_and_si256(bits, m4);
            const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(bits, 4), m4);
            __m256i p0 = _mm256_maddubs_epi16(lo, load256(q8 + 64 * g));
            __m256i p1 = _mm256_maddubs_epi16(hi, load256(q8 + 64 * g + 32));
            p0 = _mm256_madd_epi16(p0, _mm256_set1_epi16(sc[2 * g]));
            p1 = _mm256_madd_epi16(p1, _mm256_set1_epi16(sc[2 * g + 1]));
            acc = _mm256_add_epi32(acc, _mm256_add_epi32(p0, p1));
        }
        const int32_t A = hsum_i32(acc);
        sum += (quant_f16_lut[x[i].d] * y[i].d) * (float)A - (quant_f16_lut[x[i].dmin] * y[i].d) * (float)B;
    }
    return sum;
}

/* ---- Q5_K: q <= 31: pairs at most 2 * 31 * 127 -------------------------------------------------- */

static float q5k_vec_dot_avx2(int64_t n, const void *w, const void *act) {
    const block_q5_K *x = w;
    const block_q8_K *y = act;
    const __m256i m4 = _mm256_set1_epi8(0x0F), one = _mm256_set1_epi8(1);
    float sum = 0.0f;
    for (int64_t i = 0; i < n / QK_K; i++) {
        uint8_t sc[8];
        const uint64_t m = k_scale_words(x[i].scales, sc);
        const int32_t B = k_min_sum(m, y[i].bsums);
        const uint8_t *q4 = x[i].qs;
        const int8_t *q8 = y[i].qs;
        const __m256i qh = load256(x[i].qh); /* bit k of byte c: fifth bit of value 32 k + c */
        __m256i acc = _mm256_setzero_si256();
        for (int g = 0; g < 4; g++) {
            const __m256i bits = load256(q4 + 32 * g);
            /* values 64 g + c (sub-block 2g) and 64 g + 32 + c (sub-block 2g + 1) */
            const __m256i h0 = _mm256_and_si256(_mm256_srli_epi16(qh, 2 * g), one);
            const __m256i h1 = _mm256_and_si256(_mm256_srli_epi16(qh, 2 * g + 1), one);
            const __m256i lo = _mm256_or_si256(_mm256_and_si256(bits, m4), _mm256_slli_epi16(h0, 4));
            const __m256i hi =
                _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(bits, 4), m4), _mm256_slli_epi16(h1, 4));
            __m256i p0 = _mm256_maddubs_epi16(lo, load256(q8 + 64 * g));
            __m256i p1 = _mm256_maddubs_epi16(hi, load256(q8 + 64 * g + 32));
            p0 = _mm256_madd_epi16(p0, _mm256_set1_epi16(sc[2 * g]));
            p1 = _mm256_madd_epi16(p1, _mm256_set1_epi16(sc[2 * g + 1]));
            acc = _mm256_add_epi32(acc, _mm256_add_epi32(p0, p1));
        }
        const int32_t A = hsum_i32(acc);
        sum += (quant_f16_lut[x[i].d] * y[i].d) * (float)A - (quant_f16_lut[x[i].dmin] * y[i].d) * (float)B;
    }
    return sum;
}

/* ---- Q6_K: q + 32 <= 63: pairs at most 2 * 63 * 127; the -32 offset comes from the bsums ------- */

static float q6k_vec_dot_avx2(int64_t n, const void *w, const void *act) {
    const block_q6_K *x = w;
    const block_q8_K *y = act;
    const __m256i m4 = _mm256_set1_epi8(0x0F), m2 = _mm256_set1_epi8(3);
    float sum = 0.0f;
    for (int64_t i = 0; i < n / QK_K; i++) {
        const __m128i sc8 = _mm_loadu_si128((const __m128i *)x[i].scales);
        const __m256i scv = _mm256_broadcastsi128_si256(sc8);
        /* C = sum_j sc_j * bsum_j: the part of A that the offset -32 removes */
        const int32_t C = hsum_i32(_mm256_madd_epi16(_mm256_cvtepi8_epi16(sc8), _mm256_loadu_si256((const __m256i *)y[i].bsums)));
        const int8_t *q8 = y[i].qs;
        __m256i acc = _mm256_setzero_si256();
        for (int g = 0; g < 2; g++) {
            const __m256i l0 = load256(x[i].ql + 64 * g), l1 = load256(x[i].ql + 64 * g + 32);
            const __m256i h = load256(x[i].qh + 32 * g);
            __m256i q[4];
            q[0] = _mm256_or_si256(_mm256_and_si256(l0, m4), _mm256_slli_epi16(_mm256_and_si256(h, m2), 4));
            q[1] = _mm256_or_si256(_mm256_and_si256(l1, m4),
                                   _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(h, 2), m2), 4));
            q[2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 4), m4),
                                   _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(h, 4), m2), 4));
            q[3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), m4),
                                   _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(h, 6), m2), 4));
            for (int k = 0; k < 4; k++) {
                const int j = 8 * g + 2 * k; /* the 32 values are groups j and j + 1 of 16 */
                const __m256i p = _mm256_maddubs_epi16(q[k], load256(q8 + 128 * g + 32 * k));
                acc = _mm256_add_epi32(acc, _mm256_madd_epi16(p, scales_for(scv, j)));
            }
        }
        const int32_t A = hsum_i32(acc) - 32 * C;
        sum += (quant_f16_lut[x[i].d] * y[i].d) * (float)A;
    }
    return sum;
}

/* ---- Q3_K: value = lo - 4 (1 - hbit): maddubs(lo, a) - maddubs(4 (1 - hbit), a), pairs <= 2*7*127 */

static float q3k_vec_dot_avx2(int64_t n, const void *w, const void *act) {
    const block_q3_K *x = w;
    const block_q8_K *y = act;
    const __m256i m2 = _mm256_set1_epi8(3), one = _mm256_set1_epi8(1);
    float sum = 0.0f;
    for (int64_t i = 0; i < n / QK_K; i++) {
        /* the 16 scales, in registers: low 4 bits from the nibbles of bytes 0..7, high 2 bits from
         * bytes 8..11 (scale 4k + b: bits 2k of byte 8 + b), minus 32 */
        uint64_t l8;
        uint32_t h4;
        memcpy(&l8, x[i].scales, 8);
        memcpy(&h4, x[i].scales + 8, 4);
        const __m128i lv = _mm_cvtsi64_si128((long long)l8);
        const __m128i m4 = _mm_set1_epi8(0x0F);
        const __m128i lo4 = _mm_unpacklo_epi64(_mm_and_si128(lv, m4), _mm_and_si128(_mm_srli_epi16(lv, 4), m4));
        const __m128i hi2 = _mm_and_si128(_mm_srlv_epi32(_mm_set1_epi32((int)h4), _mm_setr_epi32(0, 2, 4, 6)),
                                          _mm_set1_epi8(3));
        const __m128i sc16 = _mm_sub_epi8(_mm_or_si128(lo4, _mm_slli_epi16(hi2, 4)), _mm_set1_epi8(32));
        const __m256i scv = _mm256_broadcastsi128_si256(sc16);
        const int8_t *q8 = y[i].qs;
        const __m256i hm = load256(x[i].hmask);
        __m256i acc = _mm256_setzero_si256();
        for (int g = 0; g < 2; g++) {
            const __m256i bits = load256(x[i].qs + 32 * g);
            for (int k = 0; k < 4; k++) {
                const int v0 = 128 * g + 32 * k, j = v0 / 16;
                const __m256i lo = _mm256_and_si256(_mm256_srli_epi16(bits, 2 * k), m2);
                /* 4 where the high bit is clear */
                const __m256i hb = _mm256_and_si256(_mm256_srli_epi16(hm, v0 / 32), one);
                const __m256i off = _mm256_slli_epi16(_mm256_xor_si256(hb, one), 2);
                const __m256i a = load256(q8 + v0);
                const __m256i p = _mm256_sub_epi16(_mm256_maddubs_epi16(lo, a), _mm256_maddubs_epi16(off, a));
                acc = _mm256_add_epi32(acc, _mm256_madd_epi16(p, scales_for(scv, j)));
            }
        }
        const int32_t A = hsum_i32(acc);
        sum += (quant_f16_lut[x[i].d] * y[i].d) * (float)A;
    }
    return sum;
}

/* ---- Q2_K: q <= 3: pairs at most 2 * 3 * 127 ---------------------------------------------------- */

static float q2k_vec_dot_avx2(int64_t n, const void *w, const void *act) {
    const block_q2_K *x = w;
    const block_q8_K *y = act;
    const __m256i m2 = _mm256_set1_epi8(3);
    float sum = 0.0f;
    for (int64_t i = 0; i < n / QK_K; i++) {
        const __m128i sb = _mm_loadu_si128((const __m128i *)x[i].scales);
        const __m256i scv = _mm256_broadcastsi128_si256(_mm_and_si128(sb, _mm_set1_epi8(0x0F)));
        /* B = sum_j m_j bsums[j], m_j the high nibbles */
        const __m256i mins = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(sb, 4), _mm_set1_epi8(0x0F)));
        const int32_t B = hsum_i32(_mm256_madd_epi16(mins, _mm256_loadu_si256((const __m256i *)y[i].bsums)));
        const int8_t *q8 = y[i].qs;
        __m256i acc = _mm256_setzero_si256();
        for (int g = 0; g < 2; g++) {
            const __m256i bits = load256(x[i].qs + 32 * g);
            for (int k = 0; k < 4; k++) {
                const int v0 = 128 * g + 32 * k, j = v0 / 16;
                const __m256i q = _mm256_and_si256(_mm256_srli_epi16(bits, 2 * k), m2);
                const __m256i p = _mm256_maddubs_epi16(q, load256(q8 + v0));
                acc = _mm256_add_epi32(acc, _mm256_madd_epi16(p, scales_for(scv, j)));
            }
        }
        const int32_t A = hsum_i32(acc);
        sum += (quant_f16_lut[x[i].d] * y[i].d) * (float)A - (quant_f16_lut[x[i].dmin] * y[i].d) * (float)B;
    }
    return sum;
}

void quant_k_avx2(quant_traits t[]) {
    t[STRATA_TYPE_Q2_K].vec_dot = q2k_vec_dot_avx2;
    t[STRATA_TYPE_Q3_K].vec_dot = q3k_vec_dot_avx2;
    t[STRATA_TYPE_Q4_K].vec_dot = q4k_vec_dot_avx2;
    t[STRATA_TYPE_Q5_K].vec_dot = q5k_vec_dot_avx2;
    t[STRATA_TYPE_Q6_K].vec_dot = q6k_vec_dot_avx2;
}
