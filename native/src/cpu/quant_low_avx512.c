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
    const __m256i s =
        _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_abs_epi8(v), _mm256_sign_epi8(x, v)), _mm256_set1_epi16(1));
    __m128i r = _mm_add_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
    r = _mm_add_epi32(r, _mm_shuffle_epi32(r, _MM_SHUFFLE(1, 0, 3, 2)));
    r = _mm_add_epi32(r, _mm_shuffle_epi32(r, _MM_SHUFFLE(2, 3, 0, 1)));
    return _mm_cvtsi128_si32(r);
}

LOW_LEVEL_KERNELS(avx512, low_idot_avx512, mxdot_avx512)

/* Values 64 c .. 64 c + 63 of block i as magnitudes m (unsigned bytes) and the mask of the negative
 * ones, the grid entries gathered by index vectors, and the four factors of their 16-value groups:
 * the values low_unpack gives, so the same integer sums. */
static inline __attribute__((always_inline)) void low_chunk_vec(const void *w, int64_t i, int c, __m512i *m,
                                                                __mmask64 *neg, int32_t f[4], const int kind) {
    const uint8_t *p = (const uint8_t *)w + i * low_block_bytes(kind);
    if (kind == LOW_IQ2XXS) {
        const block_iq2_xxs *b = (const block_iq2_xxs *)p;
        const __m128i bytes = _mm_loadu_si128((const __m128i *)(b->qs + 16 * c));
        const __m128i sel = _mm_setr_epi8(0, 1, 2, 3, 8, 9, 10, 11, -1, -1, -1, -1, -1, -1, -1, -1);
        *m = _mm512_i64gather_epi64(_mm512_cvtepu8_epi64(_mm_shuffle_epi8(bytes, sel)), (const void *)iq2xxs_grid, 8);
        uint64_t sg = 0;
        for (int h = 0; h < 2; h++) {
            const uint32_t a1 = low_u32(b->qs + 16 * c + 8 * h + 4);
            f[2 * h] = f[2 * h + 1] = 2 * (int32_t)(a1 >> 28) + 1;
            for (int l = 0; l < 4; l++) sg |= (uint64_t)iq_ksigns[(a1 >> (7 * l)) & 127] << (8 * (4 * h + l));
        }
        *neg = (__mmask64)sg;
    } else if (kind == LOW_IQ2S) {
        const block_iq2_s *b = (const block_iq2_s *)p;
        for (int g = 0; g < 4; g++) f[g] = 2 * ((b->scales[2 * c + g / 2] >> (4 * (g % 2))) & 0xF) + 1;
        uint64_t lo8, sg;
        memcpy(&lo8, b->qs + 8 * c, 8);
        memcpy(&sg, b->signs + 8 * c, 8);
        const int h16 = b->qh[2 * c] | (b->qh[2 * c + 1] << 8);
        const __m512i hi =
            _mm512_and_si512(_mm512_srlv_epi64(_mm512_set1_epi64(h16), _mm512_setr_epi64(0, 2, 4, 6, 8, 10, 12, 14)),
                             _mm512_set1_epi64(3));
        const __m512i idx =
            _mm512_or_si512(_mm512_cvtepu8_epi64(_mm_cvtsi64_si128((long long)lo8)), _mm512_slli_epi64(hi, 8));
        *m = _mm512_i64gather_epi64(idx, (const void *)iq2s_grid, 8);
        *neg = (__mmask64)sg;
    } else {
        __m512i idx;
        if (kind == LOW_IQ1S) {
            const block_iq1_s *b = (const block_iq1_s *)p;
            const int q0 = b->qh[2 * c], q1 = b->qh[2 * c + 1];
            f[0] = f[1] = 2 * ((q0 >> 12) & 7) + 1;
            f[2] = f[3] = 2 * ((q1 >> 12) & 7) + 1;
            uint64_t lo8;
            memcpy(&lo8, b->qs + 8 * c, 8);
            const __m512i qv = _mm512_setr_epi64(q0, q0, q0, q0, q1, q1, q1, q1);
            const __m512i hi = _mm512_and_si512(_mm512_srlv_epi64(qv, _mm512_setr_epi64(0, 3, 6, 9, 0, 3, 6, 9)),
                                                _mm512_set1_epi64(7));
            const __m512i dn = _mm512_and_si512(_mm512_srli_epi64(qv, 15), _mm512_set1_epi64(1));
            idx = _mm512_or_si512(_mm512_cvtepu8_epi64(_mm_cvtsi64_si128((long long)lo8)),
                                  _mm512_or_si512(_mm512_slli_epi64(hi, 8), _mm512_slli_epi64(dn, 11)));
        } else {
            const block_iq1_m *b = (const block_iq1_m *)p;
            uint16_t sc;
            memcpy(&sc, b->scales + 2 * c, 2);
            for (int g = 0; g < 4; g++) f[g] = 2 * ((sc >> (3 * g)) & 7) + 1;
            uint64_t lo8;
            uint32_t h4;
            memcpy(&lo8, b->qs + 8 * c, 8);
            memcpy(&h4, b->qh + 4 * c, 4);
            const __m512i hb = _mm512_cvtepu8_epi64(_mm_shuffle_epi8(
                _mm_cvtsi32_si128((int)h4), _mm_setr_epi8(0, 0, 1, 1, 2, 2, 3, 3, -1, -1, -1, -1, -1, -1, -1, -1)));
            const __m512i nib = _mm512_and_si512(_mm512_srlv_epi64(hb, _mm512_setr_epi64(0, 4, 0, 4, 0, 4, 0, 4)),
                                                 _mm512_set1_epi64(0xF));
            idx = _mm512_or_si512(_mm512_cvtepu8_epi64(_mm_cvtsi64_si128((long long)lo8)),
                                  _mm512_or_si512(_mm512_slli_epi64(_mm512_and_si512(nib, _mm512_set1_epi64(7)), 8),
                                                  _mm512_slli_epi64(_mm512_srli_epi64(nib, 3), 11)));
        }
        const __m512i v = _mm512_i64gather_epi64(idx, (const void *)&low_iq1_values[0][0], 8);
        *m = _mm512_abs_epi8(v);
        *neg = _mm512_movepi8_mask(v);
    }
}

/* Decode (one activation row): each 64 values gathered into registers (no trip through memory); the
 * same A as the unpacked kernels. */
static inline __attribute__((always_inline)) float low_vec_dot_reg(int64_t n, const void *w, const void *act,
                                                                   const int kind) {
    const block_q8_K *y = act;
    float sum = 0.0f;
    for (int64_t i = 0; i < n / QK_K; i++) {
        __m512i acc = _mm512_setzero_si512();
        for (int c = 0; c < 4; c++) {
            __m512i m;
            __mmask64 neg;
            int32_t f[4];
            low_chunk_vec(w, i, c, &m, &neg, f, kind);
            int32_t fp[4];
            for (int g = 0; g < 4; g++) fp[g] = (int32_t)((uint32_t)f[g] | ((uint32_t)f[g] << 16));
            const __m512i fv = _mm512_set_epi32(fp[3], fp[3], fp[3], fp[3], fp[2], fp[2], fp[2], fp[2], fp[1], fp[1],
                                                fp[1], fp[1], fp[0], fp[0], fp[0], fp[0]);
            const __m512i x = _mm512_loadu_si512((const void *)(y[i].qs + 64 * c));
            const __m512i sx = _mm512_mask_sub_epi8(x, neg, _mm512_setzero_si512(), x);
            acc = _mm512_dpwssd_epi32(acc, _mm512_maddubs_epi16(m, sx), fv);
        }
        sum += low_block_float(low_block_d(w, i, kind), y[i].d, _mm512_reduce_add_epi32(acc));
    }
    return sum;
}

#define REG_DOT(pfx, kind)                                                                                             \
    static float pfx##_vec_dot_reg(int64_t n, const void *w, const void *a) { return low_vec_dot_reg(n, w, a, kind); }
REG_DOT(iq2xxs, LOW_IQ2XXS)
REG_DOT(iq2s, LOW_IQ2S)
REG_DOT(iq1s, LOW_IQ1S)
REG_DOT(iq1m, LOW_IQ1M)
#undef REG_DOT

void quant_low_avx512(quant_traits t[]) {
    low_set_avx512(t);
    t[STRATA_TYPE_IQ2_XXS].vec_dot = iq2xxs_vec_dot_reg;
    t[STRATA_TYPE_IQ2_S].vec_dot = iq2s_vec_dot_reg;
    t[STRATA_TYPE_IQ1_S].vec_dot = iq1s_vec_dot_reg;
    t[STRATA_TYPE_IQ1_M].vec_dot = iq1m_vec_dot_reg;
}
