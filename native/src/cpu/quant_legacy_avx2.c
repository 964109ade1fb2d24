/*
 * quant_legacy_avx2.c — AVX2 dot products of the 32-value block types (Q4_0, Q4_1, Q5_0, Q5_1, and
 * IQ4_NL, whose values come from a 16-entry table) against Q8_0 activations.
 *
 * Same arithmetic as the scalar kernels: a block's integer products are summed exactly (8 int32
 * lanes, then reduced), and block i's float contribution goes to lane i mod 8 of eight float sums.
 * Here eight blocks are done at once: their eight lane vectors are reduced together by a hadd tree
 * into one vector of eight block sums, which is scaled and added to the eight float sums in one step.
 * The float operations per lane are the scalar kernel's, in the same order: bit-identical results.
 */
#include <immintrin.h>
#include <string.h>

#include "common.h"
#include "iq_tables.h"
#include "quant_blocks.h"
#include "strata.h"

static inline __m256i load256(const void *p) { return _mm256_loadu_si256((const __m256i *)p); }

/* Eight vectors of 8 int32 lanes -> one vector whose lane k is the sum of the lanes of v[k]. */
static inline __m256i reduce8(const __m256i v[8]) {
    const __m256i h01 = _mm256_hadd_epi32(v[0], v[1]), h23 = _mm256_hadd_epi32(v[2], v[3]);
    const __m256i h45 = _mm256_hadd_epi32(v[4], v[5]), h67 = _mm256_hadd_epi32(v[6], v[7]);
    const __m256i a = _mm256_hadd_epi32(h01, h23), b = _mm256_hadd_epi32(h45, h67);
    return _mm256_add_epi32(_mm256_permute2x128_si256(a, b, 0x20), _mm256_permute2x128_si256(a, b, 0x31));
}

static inline int32_t hsum_i32(__m256i v) {
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, _MM_SHUFFLE(1, 0, 3, 2)));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, _MM_SHUFFLE(2, 3, 0, 1)));
    return _mm_cvtsi128_si32(s);
}

/* The 32 4-bit indices of a block as bytes: value j < 16 is the low nibble of byte j, j >= 16 the high. */
static inline __m256i nibbles32(const uint8_t *qs) {
    const __m128i b = _mm_loadu_si128((const __m128i *)qs);
    const __m128i m4 = _mm_set1_epi8(0x0F);
    return _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(b, 4), m4), _mm_and_si128(b, m4));
}

/* The fifth bit of each value (bit j of the u32 at qh) as 0x10 in byte j. */
static inline __m256i fifth_bits(const uint8_t *qh4) {
    uint32_t qh;
    memcpy(&qh, qh4, 4);
    /* byte j takes byte j/8 of qh, then tests bit j%8 */
    const __m256i shuf = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2, 3, 3,
                                          3, 3, 3, 3, 3, 3);
    const __m256i bit = _mm256_set1_epi64x((long long)0x8040201008040201ULL);
    __m256i v = _mm256_shuffle_epi8(_mm256_set1_epi32((int)qh), shuf);
    v = _mm256_cmpeq_epi8(_mm256_and_si256(v, bit), bit);
    return _mm256_and_si256(v, _mm256_set1_epi8(0x10));
}

/* Signed w times signed a, |w| <= 127, |a| <= 127: pairs of products fit int16; then 8 int32 lanes. */
static inline __m256i dot_ss(__m256i w, __m256i a) {
    const __m256i p = _mm256_maddubs_epi16(_mm256_sign_epi8(w, w), _mm256_sign_epi8(a, w));
    return _mm256_madd_epi16(p, _mm256_set1_epi16(1));
}

/* Unsigned w <= 31 times signed a. */
static inline __m256i dot_us(__m256i w, __m256i a) {
    return _mm256_madd_epi16(_mm256_maddubs_epi16(w, a), _mm256_set1_epi16(1));
}

/* ---- the symmetric types: r = (dw * da) * isum ------------------------------------------------ */

#define SYM_DOT(fname, blk_t, VALUES)                                                                     \
    float fname(int64_t n, const void *w, const void *act) {                                              \
        const blk_t *x = w;                                                                               \
        const block_q8_0_act *y = act;                                                                    \
        const int64_t nb = n / QK4_0;                                                                     \
        __m256 acc = _mm256_setzero_ps();                                                                 \
        int64_t i = 0;                                                                                    \
        for (; i + 8 <= nb; i += 8) {                                                                     \
            __m256i s[8];                                                                                 \
            float d[8];                                                                                   \
            for (int k = 0; k < 8; k++) {                                                                 \
                const blk_t *b = &x[i + k];                                                               \
                s[k] = dot_ss(VALUES(b), load256(y[i + k].qs));                                           \
                d[k] = quant_f16_lut[b->d] * quant_f16_lut[y[i + k].d];                                   \
            }                                                                                             \
            acc = _mm256_add_ps(acc, _mm256_mul_ps(_mm256_loadu_ps(d), _mm256_cvtepi32_ps(reduce8(s))));  \
        }                                                                                                 \
        float a[8];                                                                                       \
        _mm256_storeu_ps(a, acc);                                                                         \
        for (; i < nb; i++) {                                                                             \
            const blk_t *b = &x[i];                                                                       \
            const int32_t s = hsum_i32(dot_ss(VALUES(b), load256(y[i].qs)));                              \
            a[i & 7] += (quant_f16_lut[b->d] * quant_f16_lut[y[i].d]) * (float)s;                         \
        }                                                                                                 \
        return quant_sum8(a);                                                                             \
    }

#define Q4_0_VALUES(b) _mm256_sub_epi8(nibbles32((b)->qs), _mm256_set1_epi8(8))
#define Q5_0_VALUES(b) _mm256_sub_epi8(_mm256_or_si256(nibbles32((b)->qs), fifth_bits((b)->qh)), _mm256_set1_epi8(16))
#define IQ4NL_VALUES(b)                                                                                   \
    _mm256_shuffle_epi8(_mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)iq4nl_values)),      \
                        nibbles32((b)->qs))

static SYM_DOT(q4_0_vec_dot_avx2, block_q4_0, Q4_0_VALUES)
static SYM_DOT(q5_0_vec_dot_avx2, block_q5_0, Q5_0_VALUES)
/* IQ4_NL's family (quant_iq.c) registers it; declared in quant_blocks.h. */
SYM_DOT(quant_iq4nl_vec_dot_avx2, block_iq4_nl, IQ4NL_VALUES)

/* ---- the affine types: r = (dw * da) * isum + (mw * da) * asum ---------------------------------- */

#define AFF_DOT(fname, blk_t, VALUES)                                                                     \
    static float fname(int64_t n, const void *w, const void *act) {                                       \
        const blk_t *x = w;                                                                               \
        const block_q8_0_act *y = act;                                                                    \
        const int64_t nb = n / QK4_0;                                                                     \
        const __m256i ones = _mm256_set1_epi8(1);                                                         \
        __m256 acc = _mm256_setzero_ps();                                                                 \
        int64_t i = 0;                                                                                    \
        for (; i + 8 <= nb; i += 8) {                                                                     \
            __m256i s[8], sa[8];                                                                          \
            float d[8], m[8];                                                                             \
            for (int k = 0; k < 8; k++) {                                                                 \
                const blk_t *b = &x[i + k];                                                               \
                const __m256i a = load256(y[i + k].qs);                                                   \
                s[k] = dot_us(VALUES(b), a);                                                              \
                sa[k] = dot_us(ones, a);                                                                  \
                const float da = quant_f16_lut[y[i + k].d];                                               \
                d[k] = quant_f16_lut[b->d] * da;                                                          \
                m[k] = quant_f16_lut[b->m] * da;                                                          \
            }                                                                                             \
            const __m256 r = _mm256_add_ps(_mm256_mul_ps(_mm256_loadu_ps(d), _mm256_cvtepi32_ps(reduce8(s))), \
                                           _mm256_mul_ps(_mm256_loadu_ps(m), _mm256_cvtepi32_ps(reduce8(sa)))); \
            acc = _mm256_add_ps(acc, r);                                                                  \
        }                                                                                                 \
        float a[8];                                                                                       \
        _mm256_storeu_ps(a, acc);                                                                         \
        for (; i < nb; i++) {                                                                             \
            const blk_t *b = &x[i];                                                                       \
            const __m256i av = load256(y[i].qs);                                                          \
            const int32_t s = hsum_i32(dot_us(VALUES(b), av)), sas = hsum_i32(dot_us(ones, av));          \
            const float da = quant_f16_lut[y[i].d];                                                       \
            a[i & 7] += (quant_f16_lut[b->d] * da) * (float)s + (quant_f16_lut[b->m] * da) * (float)sas;  \
        }                                                                                                 \
        return quant_sum8(a);                                                                             \
    }

#define Q4_1_VALUES(b) nibbles32((b)->qs)
#define Q5_1_VALUES(b) _mm256_or_si256(nibbles32((b)->qs), fifth_bits((b)->qh))

AFF_DOT(q4_1_vec_dot_avx2, block_q4_1, Q4_1_VALUES)
AFF_DOT(q5_1_vec_dot_avx2, block_q5_1, Q5_1_VALUES)

void quant_legacy_avx2(quant_traits t[]) {
    t[STRATA_TYPE_Q4_0].vec_dot = q4_0_vec_dot_avx2;
    t[STRATA_TYPE_Q4_1].vec_dot = q4_1_vec_dot_avx2;
    t[STRATA_TYPE_Q5_0].vec_dot = q5_0_vec_dot_avx2;
    t[STRATA_TYPE_Q5_1].vec_dot = q5_1_vec_dot_avx2;
}
