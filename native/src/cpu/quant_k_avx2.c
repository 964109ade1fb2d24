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

/* ---- prompt kernels: four weight rows x many activation rows ------------------------------------ */

/* One K-quant super-block unpacked for the prompt kernels, in the activations' order: w[j] holds values
 * 32 j .. 32 j + 31 as unsigned bytes (Q3_K biased by 4, so 0..7), s[j] the int16 scale lanes that
 * madd gives them (one scale, or two of 16 values each), f the 16 int16 multipliers of the
 * activation's 16 block sums (Q4_K/Q5_K: m_j in lanes 2j and 2j + 1; Q2_K the 16 mins; Q3_K/Q6_K the
 * 16 scales), d and dmin as floats. Every integer below is vec_dot's exactly (integer adds in any
 * order), so the float step per block, the same expression as vec_dot's, gives the same bits. */
typedef struct {
    __m256i w[8], s[8], f;
    float d, dmin;
} kx_unpacked;

enum { KX_Q2_K, KX_Q3_K, KX_Q4_K, KX_Q5_K, KX_Q6_K };

static inline void kx_unpack_q4k(const block_q4_K *b, kx_unpacked *u) {
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    uint8_t sc[8];
    const uint64_t m = k_scale_words(b->scales, sc);
    for (int g = 0; g < 4; g++) {
        const __m256i bits = load256(b->qs + 32 * g);
        u->w[2 * g] = _mm256_and_si256(bits, m4);
        u->w[2 * g + 1] = _mm256_and_si256(_mm256_srli_epi16(bits, 4), m4);
        u->s[2 * g] = _mm256_set1_epi16(sc[2 * g]);
        u->s[2 * g + 1] = _mm256_set1_epi16(sc[2 * g + 1]);
    }
    const __m256i mm = _mm256_cvtepu8_epi32(_mm_cvtsi64_si128((long long)m));
    u->f = _mm256_or_si256(mm, _mm256_slli_epi32(mm, 16));
    u->d = quant_f16_lut[b->d];
    u->dmin = quant_f16_lut[b->dmin];
}

static inline void kx_unpack_q5k(const block_q5_K *b, kx_unpacked *u) {
    const __m256i m4 = _mm256_set1_epi8(0x0F), one = _mm256_set1_epi8(1);
    uint8_t sc[8];
    const uint64_t m = k_scale_words(b->scales, sc);
    const __m256i qh = load256(b->qh);
    for (int g = 0; g < 4; g++) {
        const __m256i bits = load256(b->qs + 32 * g);
        const __m256i h0 = _mm256_and_si256(_mm256_srli_epi16(qh, 2 * g), one);
        const __m256i h1 = _mm256_and_si256(_mm256_srli_epi16(qh, 2 * g + 1), one);
        u->w[2 * g] = _mm256_or_si256(_mm256_and_si256(bits, m4), _mm256_slli_epi16(h0, 4));
        u->w[2 * g + 1] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(bits, 4), m4), _mm256_slli_epi16(h1, 4));
        u->s[2 * g] = _mm256_set1_epi16(sc[2 * g]);
        u->s[2 * g + 1] = _mm256_set1_epi16(sc[2 * g + 1]);
    }
    const __m256i mm = _mm256_cvtepu8_epi32(_mm_cvtsi64_si128((long long)m));
    u->f = _mm256_or_si256(mm, _mm256_slli_epi32(mm, 16));
    u->d = quant_f16_lut[b->d];
    u->dmin = quant_f16_lut[b->dmin];
}

static inline void kx_unpack_q6k(const block_q6_K *b, kx_unpacked *u) {
    const __m256i m4 = _mm256_set1_epi8(0x0F), m2 = _mm256_set1_epi8(3);
    const __m128i sc8 = _mm_loadu_si128((const __m128i *)b->scales);
    const __m256i scv = _mm256_broadcastsi128_si256(sc8);
    for (int g = 0; g < 2; g++) {
        const __m256i l0 = load256(b->ql + 64 * g), l1 = load256(b->ql + 64 * g + 32);
        const __m256i h = load256(b->qh + 32 * g);
        u->w[4 * g] = _mm256_or_si256(_mm256_and_si256(l0, m4), _mm256_slli_epi16(_mm256_and_si256(h, m2), 4));
        u->w[4 * g + 1] =
            _mm256_or_si256(_mm256_and_si256(l1, m4), _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(h, 2), m2), 4));
        u->w[4 * g + 2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 4), m4),
                                          _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(h, 4), m2), 4));
        u->w[4 * g + 3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), m4),
                                          _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(h, 6), m2), 4));
    }
    for (int j = 0; j < 8; j++) u->s[j] = scales_for(scv, 2 * j);
    u->f = _mm256_cvtepi8_epi16(sc8);
    u->d = quant_f16_lut[b->d];
    u->dmin = 0.0f;
}

static inline void kx_unpack_q2k(const block_q2_K *b, kx_unpacked *u) {
    const __m256i m2 = _mm256_set1_epi8(3);
    const __m128i sb = _mm_loadu_si128((const __m128i *)b->scales);
    const __m256i scv = _mm256_broadcastsi128_si256(_mm_and_si128(sb, _mm_set1_epi8(0x0F)));
    for (int g = 0; g < 2; g++) {
        const __m256i bits = load256(b->qs + 32 * g);
        for (int k = 0; k < 4; k++) u->w[4 * g + k] = _mm256_and_si256(_mm256_srli_epi16(bits, 2 * k), m2);
    }
    for (int j = 0; j < 8; j++) u->s[j] = scales_for(scv, 2 * j);
    u->f = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(sb, 4), _mm_set1_epi8(0x0F)));
    u->d = quant_f16_lut[b->d];
    u->dmin = quant_f16_lut[b->dmin];
}

/* Q3_K's value lo - 4 (1 - hbit) is kept as lo + 4 hbit (0..7); A = acc - 4 C with C = sum_j sc_j bsum_j. */
static inline void kx_unpack_q3k(const block_q3_K *b, kx_unpacked *u) {
    const __m256i m2 = _mm256_set1_epi8(3), one = _mm256_set1_epi8(1);
    uint64_t l8;
    uint32_t h4;
    memcpy(&l8, b->scales, 8);
    memcpy(&h4, b->scales + 8, 4);
    const __m128i lv = _mm_cvtsi64_si128((long long)l8);
    const __m128i m4 = _mm_set1_epi8(0x0F);
    const __m128i lo4 = _mm_unpacklo_epi64(_mm_and_si128(lv, m4), _mm_and_si128(_mm_srli_epi16(lv, 4), m4));
    const __m128i hi2 =
        _mm_and_si128(_mm_srlv_epi32(_mm_set1_epi32((int)h4), _mm_setr_epi32(0, 2, 4, 6)), _mm_set1_epi8(3));
    const __m128i sc16 = _mm_sub_epi8(_mm_or_si128(lo4, _mm_slli_epi16(hi2, 4)), _mm_set1_epi8(32));
    const __m256i scv = _mm256_broadcastsi128_si256(sc16);
    const __m256i hm = load256(b->hmask);
    for (int g = 0; g < 2; g++) {
        const __m256i bits = load256(b->qs + 32 * g);
        for (int k = 0; k < 4; k++) {
            const int j = 4 * g + k;
            const __m256i lo = _mm256_and_si256(_mm256_srli_epi16(bits, 2 * k), m2);
            const __m256i hb = _mm256_and_si256(_mm256_srli_epi16(hm, j), one);
            u->w[j] = _mm256_or_si256(lo, _mm256_slli_epi16(hb, 2));
        }
    }
    for (int j = 0; j < 8; j++) u->s[j] = scales_for(scv, 2 * j);
    u->f = _mm256_cvtepi8_epi16(sc16);
    u->d = quant_f16_lut[b->d];
    u->dmin = 0.0f;
}

static inline __attribute__((always_inline)) void kx_unpack(const uint8_t *row, int64_t i, kx_unpacked *u, const int kt) {
    switch (kt) {
    case KX_Q2_K: kx_unpack_q2k((const block_q2_K *)row + i, u); break;
    case KX_Q3_K: kx_unpack_q3k((const block_q3_K *)row + i, u); break;
    case KX_Q4_K: kx_unpack_q4k((const block_q4_K *)row + i, u); break;
    case KX_Q5_K: kx_unpack_q5k((const block_q5_K *)row + i, u); break;
    default: kx_unpack_q6k((const block_q6_K *)row + i, u); break;
    }
}

/* Eight vectors of 8 int32 lanes -> one vector whose lane p is the sum of v[p]'s lanes (exact). */
static inline __m256i reduce8(const __m256i v[8]) {
    const __m256i h01 = _mm256_hadd_epi32(v[0], v[1]), h23 = _mm256_hadd_epi32(v[2], v[3]);
    const __m256i h45 = _mm256_hadd_epi32(v[4], v[5]), h67 = _mm256_hadd_epi32(v[6], v[7]);
    const __m256i a = _mm256_hadd_epi32(h01, h23), b = _mm256_hadd_epi32(h45, h67);
    return _mm256_add_epi32(_mm256_permute2x128_si256(a, b, 0x20), _mm256_permute2x128_si256(a, b, 0x31));
}

/* Blocks per row unpacked at once (4 rows x 8 blocks x 576 bytes: in L1). */
#define KX_CHUNK 8

/* Four weight rows x many activation rows (the prompt path). A chunk of blocks of the four rows is
 * unpacked once for all the tokens; then, two rows and four tokens at a time, the eight (row, token)
 * pairs accumulate vec_dot's integer sums in registers (lane vectors p = 4 rr + k), A and the block-sum
 * term of the eight pairs are reduced together, and the float step of vec_dot for the block runs on the
 * eight pairs in one vector, blocks in order: out[4 k + r] is bit for bit vec_dot(n, row r, act[k]). */
static inline __attribute__((always_inline)) void kx_vec_dot_4xn(int64_t n, const void *w, size_t ws,
                                                                 const void *const *act, int32_t n_act, float *out,
                                                                 const int kt) {
    const int64_t nb = n / QK_K;
    kx_unpacked u[4][KX_CHUNK];
    for (int32_t t0 = 0; t0 < n_act; t0 += QUANT_DOT_4XN_MAX) {
        const int32_t tn = n_act - t0 < QUANT_DOT_4XN_MAX ? n_act - t0 : QUANT_DOT_4XN_MAX;
        /* [row pair][token group]: lane 4 rr + k is row 2 rp + rr, token 4 g + k */
        __m256 sums[2][QUANT_DOT_4XN_MAX / 4];
        for (int g = 0; g < QUANT_DOT_4XN_MAX / 4; g++) sums[0][g] = sums[1][g] = _mm256_setzero_ps();
        for (int64_t c0 = 0; c0 < nb; c0 += KX_CHUNK) {
            const int64_t cn = nb - c0 < KX_CHUNK ? nb - c0 : KX_CHUNK;
            for (int r = 0; r < 4; r++)
                for (int64_t c = 0; c < cn; c++) kx_unpack((const uint8_t *)w + (size_t)r * ws, c0 + c, &u[r][c], kt);
            for (int32_t k0 = 0; k0 < tn; k0 += 4) {
                const block_q8_K *y[4];
                for (int k = 0; k < 4; k++) y[k] = (const block_q8_K *)act[t0 + k0 + (k < tn - k0 ? k : 0)] + c0;
                for (int rp = 0; rp < 2; rp++) {
                    __m256 sum = sums[rp][k0 / 4];
                    for (int64_t c = 0; c < cn; c++) {
                        const kx_unpacked *u0 = &u[2 * rp][c], *u1 = &u[2 * rp + 1][c];
                        __m256i acc[8];
                        for (int p = 0; p < 8; p++) acc[p] = _mm256_setzero_si256();
#pragma GCC unroll 2
                        for (int j = 0; j < 8; j++) {
                            const __m256i w0 = u0->w[j], w1 = u1->w[j];
                            for (int k = 0; k < 4; k++) {
                                const __m256i a = load256(y[k][c].qs + 32 * j);
                                acc[k] = _mm256_add_epi32(acc[k], _mm256_madd_epi16(_mm256_maddubs_epi16(w0, a), u0->s[j]));
                                acc[4 + k] =
                                    _mm256_add_epi32(acc[4 + k], _mm256_madd_epi16(_mm256_maddubs_epi16(w1, a), u1->s[j]));
                            }
                        }
                        __m256i bacc[8];
                        for (int k = 0; k < 4; k++) {
                            const __m256i bs = load256(y[k][c].bsums);
                            bacc[k] = _mm256_madd_epi16(bs, u0->f);
                            bacc[4 + k] = _mm256_madd_epi16(bs, u1->f);
                        }
                        const __m256i A = reduce8(acc), B = reduce8(bacc);
                        const __m128 yd4 = _mm_setr_ps(y[0][c].d, y[1][c].d, y[2][c].d, y[3][c].d);
                        const __m256 yd = _mm256_set_m128(yd4, yd4);
                        const __m256 dd = _mm256_set_m128(_mm_set1_ps(u1->d), _mm_set1_ps(u0->d));
                        if (kt == KX_Q6_K || kt == KX_Q3_K) {
                            const __m256i Ai = _mm256_sub_epi32(A, _mm256_slli_epi32(B, kt == KX_Q6_K ? 5 : 2));
                            sum = _mm256_add_ps(sum, _mm256_mul_ps(_mm256_mul_ps(dd, yd), _mm256_cvtepi32_ps(Ai)));
                        } else {
                            const __m256 dm = _mm256_set_m128(_mm_set1_ps(u1->dmin), _mm_set1_ps(u0->dmin));
                            const __m256 ta = _mm256_mul_ps(_mm256_mul_ps(dd, yd), _mm256_cvtepi32_ps(A));
                            const __m256 tb = _mm256_mul_ps(_mm256_mul_ps(dm, yd), _mm256_cvtepi32_ps(B));
                            sum = _mm256_add_ps(sum, _mm256_sub_ps(ta, tb));
                        }
                    }
                    sums[rp][k0 / 4] = sum;
                }
            }
        }
        for (int32_t k0 = 0; k0 < tn; k0 += 4) {
            float v[2][8];
            _mm256_storeu_ps(v[0], sums[0][k0 / 4]);
            _mm256_storeu_ps(v[1], sums[1][k0 / 4]);
            for (int32_t k = 0; k < 4 && k < tn - k0; k++)
                for (int r = 0; r < 4; r++) out[(size_t)(t0 + k0 + k) * 4 + r] = v[r / 2][4 * (r % 2) + k];
        }
    }
}

/* Four vectors of 8 int32 lanes -> their four sums (exact). */
static inline __m128i reduce4(__m256i v0, __m256i v1, __m256i v2, __m256i v3) {
    const __m256i h = _mm256_hadd_epi32(_mm256_hadd_epi32(v0, v1), _mm256_hadd_epi32(v2, v3));
    return _mm_add_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1));
}

static inline __attribute__((always_inline)) int kx_block_bytes(const int kt) {
    switch (kt) {
    case KX_Q2_K: return (int)sizeof(block_q2_K);
    case KX_Q3_K: return (int)sizeof(block_q3_K);
    case KX_Q4_K: return (int)sizeof(block_q4_K);
    case KX_Q5_K: return (int)sizeof(block_q5_K);
    default: return (int)sizeof(block_q6_K);
    }
}

/* Decode streams whole matrices once per token and waits on memory: each call asks for the blocks it
 * will read KX_PREFETCH_ROWS rows (four calls) ahead, every cache line of them. A prefetch past the end
 * of a matrix is a hint that never faults. */
#define KX_PREFETCH_ROWS 16
static inline __attribute__((always_inline)) void kx_prefetch(const void *p, int bytes) {
    const char *c = (const char *)p;
    for (int o = 0; o < bytes; o += 64) _mm_prefetch(c + o, _MM_HINT_T0);
    _mm_prefetch(c + bytes - 1, _MM_HINT_T0);
}

/* Four weight rows against one activation row (decode): per block, each row's integer sums are
 * vec_dot's (the activation block read once for the four rows), reduced together, and per row the
 * float step of vec_dot, blocks in order, runs in lane r: out[r] is bit for bit vec_dot of row r. */
static inline __attribute__((always_inline)) void kx_vec_dot_x4(int64_t n, const void *w, size_t ws, const void *act,
                                                                float out[4], const int kt) {
    const block_q8_K *y = act;
    const int bsz = kx_block_bytes(kt);
    __m128 sum = _mm_setzero_ps();
    for (int64_t i = 0; i < n / QK_K; i++) {
        const __m256i bs = load256(y[i].bsums);
        __m256i acc[4], bacc[4];
        float dd[4], dm[4];
        for (int r = 0; r < 4; r++) {
            const uint8_t *row = (const uint8_t *)w + (size_t)r * ws;
            kx_prefetch(row + KX_PREFETCH_ROWS * ws + i * bsz, bsz);
            kx_unpacked u;
            kx_unpack(row, i, &u, kt);
            acc[r] = _mm256_setzero_si256();
            for (int j = 0; j < 8; j++)
                acc[r] = _mm256_add_epi32(acc[r], _mm256_madd_epi16(_mm256_maddubs_epi16(u.w[j], load256(y[i].qs + 32 * j)), u.s[j]));
            bacc[r] = _mm256_madd_epi16(bs, u.f);
            dd[r] = u.d;
            dm[r] = u.dmin;
        }
        const __m128i A = reduce4(acc[0], acc[1], acc[2], acc[3]), B = reduce4(bacc[0], bacc[1], bacc[2], bacc[3]);
        const __m128 yd = _mm_set1_ps(y[i].d);
        if (kt == KX_Q6_K || kt == KX_Q3_K) {
            const __m128i Ai = _mm_sub_epi32(A, _mm_slli_epi32(B, kt == KX_Q6_K ? 5 : 2));
            sum = _mm_add_ps(sum, _mm_mul_ps(_mm_mul_ps(_mm_loadu_ps(dd), yd), _mm_cvtepi32_ps(Ai)));
        } else {
            const __m128 ta = _mm_mul_ps(_mm_mul_ps(_mm_loadu_ps(dd), yd), _mm_cvtepi32_ps(A));
            const __m128 tb = _mm_mul_ps(_mm_mul_ps(_mm_loadu_ps(dm), yd), _mm_cvtepi32_ps(B));
            sum = _mm_add_ps(sum, _mm_sub_ps(ta, tb));
        }
    }
    _mm_storeu_ps(out, sum);
}

#define KX_4XN(name, kt)                                                                                     \
    static void name##_vec_dot_4xn_avx2(int64_t n, const void *w, size_t ws, const void *const *act, int32_t n_act, \
                                        float *out) {                                                        \
        kx_vec_dot_4xn(n, w, ws, act, n_act, out, kt);                                                       \
    }                                                                                                        \
    static void name##_vec_dot_x4_avx2(int64_t n, const void *w, size_t ws, const void *act, float out[4]) {  \
        kx_vec_dot_x4(n, w, ws, act, out, kt);                                                               \
    }
KX_4XN(q2k, KX_Q2_K)
KX_4XN(q3k, KX_Q3_K)
KX_4XN(q4k, KX_Q4_K)
KX_4XN(q5k, KX_Q5_K)
KX_4XN(q6k, KX_Q6_K)
#undef KX_4XN

/* ---- Q8_K activations --------------------------------------------------------------------------- */

/* The scalar q8k_quantize_act's operations on 8 lanes: the same IEEE multiplies and adds (the
 * magic-number round), the same max and clamp, so the same bytes and block sums. */
static void q8k_quantize_act_avx2(const float *x, void *dst, int64_t n) {
    const __m256 magic = _mm256_set1_ps(12582912.0f), lim = _mm256_set1_ps(127.0f), nlim = _mm256_set1_ps(-127.0f);
    const __m256 sign = _mm256_set1_ps(-0.0f);
    block_q8_K *b = dst;
    for (int64_t i = 0; i < n / QK_K; i++, x += QK_K) {
        __m256 mx = _mm256_setzero_ps(), nan = _mm256_setzero_ps();
        for (int j = 0; j < QK_K; j += 8) {
            const __m256 v = _mm256_loadu_ps(x + j);
            mx = _mm256_max_ps(mx, _mm256_andnot_ps(sign, v));
            nan = _mm256_or_ps(nan, _mm256_cmp_ps(v, v, _CMP_UNORD_Q));
        }
        __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(mx), _mm256_extractf128_ps(mx, 1));
        m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
        m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
        const float amax = _mm_cvtss_f32(m4);
        if (_mm256_movemask_ps(nan) || !(amax <= 3.4028235e38f)) { /* NaN or inf inputs: the scalar kernel's path */
            quant_q8k_quantize_act_scalar(x, &b[i], QK_K);
            continue;
        }
        if (amax == 0.0f) {
            memset(&b[i], 0, sizeof b[i]);
            continue;
        }
        const __m256 id = _mm256_set1_ps(127.0f / amax);
        b[i].d = amax / 127.0f;
        for (int j = 0; j < QK_K; j += 16) {
            __m256i q[2];
            for (int h = 0; h < 2; h++) {
                __m256 v = _mm256_sub_ps(_mm256_add_ps(_mm256_mul_ps(_mm256_loadu_ps(x + j + 8 * h), id), magic), magic);
                /* a block whose largest value is below 127 / FLT_MAX has an infinite id: 0 x inf is NaN,
                 * which the scalar kernel turns into 0 */
                v = _mm256_and_ps(v, _mm256_cmp_ps(v, v, _CMP_ORD_Q));
                q[h] = _mm256_cvttps_epi32(_mm256_min_ps(_mm256_max_ps(v, nlim), lim));
            }
            const __m256i p16 = _mm256_permute4x64_epi64(_mm256_packs_epi32(q[0], q[1]), _MM_SHUFFLE(3, 1, 2, 0));
            _mm_storeu_si128((__m128i *)(b[i].qs + j),
                             _mm_packs_epi16(_mm256_castsi256_si128(p16), _mm256_extracti128_si256(p16, 1)));
            b[i].bsums[j / 16] = (int16_t)hsum_i32(_mm256_add_epi32(q[0], q[1]));
        }
    }
}

void quant_k_avx2(quant_traits t[]) {
    t[STRATA_TYPE_Q8_K].quantize_act = q8k_quantize_act_avx2;
    t[STRATA_TYPE_Q2_K].vec_dot = q2k_vec_dot_avx2;
    t[STRATA_TYPE_Q3_K].vec_dot = q3k_vec_dot_avx2;
    t[STRATA_TYPE_Q4_K].vec_dot = q4k_vec_dot_avx2;
    t[STRATA_TYPE_Q5_K].vec_dot = q5k_vec_dot_avx2;
    t[STRATA_TYPE_Q6_K].vec_dot = q6k_vec_dot_avx2;
    quant_set_4xn(t, STRATA_TYPE_Q2_K, q2k_vec_dot_4xn_avx2);
    quant_set_4xn(t, STRATA_TYPE_Q3_K, q3k_vec_dot_4xn_avx2);
    quant_set_4xn(t, STRATA_TYPE_Q4_K, q4k_vec_dot_4xn_avx2);
    quant_set_4xn(t, STRATA_TYPE_Q5_K, q5k_vec_dot_4xn_avx2);
    quant_set_4xn(t, STRATA_TYPE_Q6_K, q6k_vec_dot_4xn_avx2);
    quant_set_x4(t, STRATA_TYPE_Q2_K, q2k_vec_dot_x4_avx2);
    quant_set_x4(t, STRATA_TYPE_Q3_K, q3k_vec_dot_x4_avx2);
    quant_set_x4(t, STRATA_TYPE_Q4_K, q4k_vec_dot_x4_avx2);
    quant_set_x4(t, STRATA_TYPE_Q5_K, q5k_vec_dot_x4_avx2);
    quant_set_x4(t, STRATA_TYPE_Q6_K, q6k_vec_dot_x4_avx2);
}
