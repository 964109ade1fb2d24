/*
 * quant_iq_avx512.c — AVX-512 (BW + VNNI) dot product of IQ4_XS against Q8_K.
 *
 * AVX-512 has no byte sign instruction, so the signed table values v are shifted into unsigned
 * bytes (v + 128 <= 241) and VNNI's dpbusd sums four products each in int32:
 *   sum v a = sum (v + 128) a - 128 sum a,
 * where sum a over a sub-block comes from the activation's bsums. All integers, exact: the block's
 * A and its float expression are the scalar kernel's, so the bits are the same. The other i-quants
 * keep their AVX2 kernels.
 */
#include <immintrin.h>
#include <string.h>

#include "common.h"
#include "iq_tables.h"
#include "quant_blocks.h"
#include "strata.h"

static float iq4xs_vec_dot_avx512(int64_t n, const void *w, const void *act) {
    const block_iq4_xs *x = w;
    const block_q8_K *y = act;
    int8_t lut_u[16];
    for (int k = 0; k < 16; k++) lut_u[k] = (int8_t)(iq4nl_values[k] + 128);
    const __m512i lut = _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)lut_u));
    const __m512i m4 = _mm512_set1_epi8(0x0F);
    /* qword indices: [L0 H0 L1 H1] and [L2 H2 L3 H3] of the 128-bit lanes of lo (L) and hi (H) */
    const __m512i ia = _mm512_setr_epi64(0, 1, 8, 9, 2, 3, 10, 11), ib = _mm512_setr_epi64(4, 5, 12, 13, 6, 7, 14, 15);
    float sum = 0.0f;
    for (int64_t i = 0; i < n / QK_K; i++) {
        int32_t ls[8];
        for (int j = 0; j < 8; j++)
            ls[j] = ((x[i].scales_l[j / 2] >> (4 * (j % 2))) & 0xF) | (((x[i].scales_h >> (2 * j)) & 3) << 4);
        int32_t corr = 0; /* 128 sum_j (ls_j - 32) sum(a over sub-block j) */
        for (int j = 0; j < 8; j++) corr += (ls[j] - 32) * (y[i].bsums[2 * j] + y[i].bsums[2 * j + 1]);
        __m512i acc = _mm512_setzero_si512();
        for (int p = 0; p < 2; p++) { /* sub-blocks 4p .. 4p + 3 */
            const __m512i bits = _mm512_loadu_si512((const void *)(x[i].qs + 64 * p));
            const __m512i lo = _mm512_and_si512(bits, m4), hi = _mm512_and_si512(_mm512_srli_epi16(bits, 4), m4);
            /* sub-block j: low nibbles of its 16 bytes, then their high nibbles */
            const __m512i va = _mm512_shuffle_epi8(lut, _mm512_permutex2var_epi64(lo, ia, hi));
            const __m512i vb = _mm512_shuffle_epi8(lut, _mm512_permutex2var_epi64(lo, ib, hi));
            const __m512i a0 = _mm512_loadu_si512((const void *)(y[i].qs + 128 * p));
            const __m512i a1 = _mm512_loadu_si512((const void *)(y[i].qs + 128 * p + 64));
            const __m512i s0 = _mm512_dpbusd_epi32(_mm512_setzero_si512(), va, a0); /* lanes 0-7: sub 4p, 8-15: 4p+1 */
            const __m512i s1 = _mm512_dpbusd_epi32(_mm512_setzero_si512(), vb, a1);
            const __m512i f0 = _mm512_inserti64x4(_mm512_set1_epi32(ls[4 * p] - 32), _mm256_set1_epi32(ls[4 * p + 1] - 32), 1);
            const __m512i f1 =
                _mm512_inserti64x4(_mm512_set1_epi32(ls[4 * p + 2] - 32), _mm256_set1_epi32(ls[4 * p + 3] - 32), 1);
            acc = _mm512_add_epi32(acc, _mm512_add_epi32(_mm512_mullo_epi32(s0, f0), _mm512_mullo_epi32(s1, f1)));
        }
        const int32_t A = _mm512_reduce_add_epi32(acc) - 128 * corr;
        sum += (quant_f16_lut[x[i].d] * y[i].d) * (float)A;
    }
    return sum;
}

/* Four 8-lane int32 vectors -> their four sums. */
static inline __m128i reduce4_256(__m256i v0, __m256i v1, __m256i v2, __m256i v3) {
    const __m256i h = _mm256_hadd_epi32(_mm256_hadd_epi32(v0, v1), _mm256_hadd_epi32(v2, v3));
    return _mm_add_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1));
}

/* Four int32 accumulators -> their four lane sums (exact integer adds, any order). */
static inline __m128i reduce4(__m512i v0, __m512i v1, __m512i v2, __m512i v3) {
    const __m512i a = _mm512_add_epi32(_mm512_shuffle_i64x2(v0, v1, 0x44), _mm512_shuffle_i64x2(v0, v1, 0xEE));
    const __m512i b = _mm512_add_epi32(_mm512_shuffle_i64x2(v2, v3, 0x44), _mm512_shuffle_i64x2(v2, v3, 0xEE));
    const __m512i c = _mm512_add_epi32(_mm512_shuffle_i64x2(a, b, 0x88), _mm512_shuffle_i64x2(a, b, 0xDD));
    const __m512i d = _mm512_add_epi32(c, _mm512_shuffle_epi32(c, _MM_PERM_BADC));
    const __m512i e = _mm512_add_epi32(d, _mm512_shuffle_epi32(d, _MM_PERM_CDAB));
    return _mm512_castsi512_si128(_mm512_permutexvar_epi32(_mm512_setr_epi32(0, 4, 8, 12, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0), e));
}

/* An IQ4_XS block unpacked for the many-token kernel: v[q] the biased table values of values
 * 64q .. 64q + 63, f[q] their sub-block factors, lsp the factors in int16 pairs for the bsums. */
typedef struct {
    __m512i v[4], f[4];
    __m256i lsp;
    float d;
} iq4xs_unpacked;

#define XN_CHUNK 8

static inline void iq4xs_unpack(const block_iq4_xs *b, __m512i lut, iq4xs_unpacked *u) {
    const __m512i m4 = _mm512_set1_epi8(0x0F);
    const __m512i ia = _mm512_setr_epi64(0, 1, 8, 9, 2, 3, 10, 11), ib = _mm512_setr_epi64(4, 5, 12, 13, 6, 7, 14, 15);
    int32_t ls[8];
    for (int j = 0; j < 8; j++)
        ls[j] = (((b->scales_l[j / 2] >> (4 * (j % 2))) & 0xF) | (((b->scales_h >> (2 * j)) & 3) << 4)) - 32;
    /* int16 lanes 2j, 2j + 1 = ls_j: madd with the bsums gives ls_j * (sum of sub-block j) */
    const __m256i l32 = _mm256_loadu_si256((const __m256i *)ls);
    u->lsp = _mm256_or_si256(_mm256_and_si256(l32, _mm256_set1_epi32(0xFFFF)), _mm256_slli_epi32(l32, 16));
    for (int p = 0; p < 2; p++) {
        const __m512i bits = _mm512_loadu_si512((const void *)(b->qs + 64 * p));
        const __m512i lo = _mm512_and_si512(bits, m4), hi = _mm512_and_si512(_mm512_srli_epi16(bits, 4), m4);
        u->v[2 * p] = _mm512_shuffle_epi8(lut, _mm512_permutex2var_epi64(lo, ia, hi));
        u->v[2 * p + 1] = _mm512_shuffle_epi8(lut, _mm512_permutex2var_epi64(lo, ib, hi));
        u->f[2 * p] = _mm512_inserti64x4(_mm512_set1_epi32(ls[4 * p]), _mm256_set1_epi32(ls[4 * p + 1]), 1);
        u->f[2 * p + 1] = _mm512_inserti64x4(_mm512_set1_epi32(ls[4 * p + 2]), _mm256_set1_epi32(ls[4 * p + 3]), 1);
    }
    u->d = quant_f16_lut[b->d];
}

/* A of one unpacked block against one activation block (see iq4xs_vec_dot_avx512) */
static inline __m512i iq4xs_acc(const iq4xs_unpacked *u, const int8_t *q8) {
    __m512i acc = _mm512_setzero_si512();
    for (int q = 0; q < 4; q++) {
        const __m512i s =
            _mm512_dpbusd_epi32(_mm512_setzero_si512(), u->v[q], _mm512_loadu_si512((const void *)(q8 + 64 * q)));
        acc = _mm512_add_epi32(acc, _mm512_mullo_epi32(s, u->f[q]));
    }
    return acc;
}

/* IQ4_XS against several activation rows: a chunk of the row's blocks is unpacked once for all rows;
 * four rows' sums are reduced together; per row the float steps are vec_dot's, blocks in order. */
static void iq4xs_vec_dot_n_avx512(int64_t n, const void *w, const void *const *act, int32_t n_act, float *out) {
    const block_iq4_xs *x = w;
    const int64_t nb = n / QK_K;
    int8_t lut_u[16];
    for (int k = 0; k < 16; k++) lut_u[k] = (int8_t)(iq4nl_values[k] + 128);
    const __m512i lut = _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)lut_u));
    for (int32_t t0 = 0; t0 < n_act; t0 += QUANT_DOT_N_MAX) {
        const int32_t tn = n_act - t0 < QUANT_DOT_N_MAX ? n_act - t0 : QUANT_DOT_N_MAX;
        float sums[QUANT_DOT_N_MAX + 3] = {0};
        for (int64_t c0 = 0; c0 < nb; c0 += XN_CHUNK) {
            const int64_t cn = nb - c0 < XN_CHUNK ? nb - c0 : XN_CHUNK;
            iq4xs_unpacked u[XN_CHUNK];
            for (int64_t c = 0; c < cn; c++) iq4xs_unpack(&x[c0 + c], lut, &u[c]);
            for (int32_t k0 = 0; k0 < tn; k0 += 4) {
                const int32_t kn = tn - k0 < 4 ? tn - k0 : 4;
                const block_q8_K *y[4];
                for (int k = 0; k < 4; k++) y[k] = (const block_q8_K *)act[t0 + k0 + (k < kn ? k : 0)] + c0;
                __m128 sum = _mm_loadu_ps(sums + k0);
                for (int64_t c = 0; c < cn; c++) {
                    const iq4xs_unpacked *uc = &u[c];
                    __m256i cc[4];
                    for (int k = 0; k < 4; k++)
                        cc[k] = _mm256_madd_epi16(_mm256_loadu_si256((const __m256i *)y[k][c].bsums), uc->lsp);
                    const __m128i A = _mm_sub_epi32(reduce4(iq4xs_acc(uc, y[0][c].qs), iq4xs_acc(uc, y[1][c].qs),
                                                            iq4xs_acc(uc, y[2][c].qs), iq4xs_acc(uc, y[3][c].qs)),
                                                    _mm_slli_epi32(reduce4_256(cc[0], cc[1], cc[2], cc[3]), 7));
                    const __m128 yd = _mm_setr_ps(y[0][c].d, y[1][c].d, y[2][c].d, y[3][c].d);
                    sum = _mm_add_ps(sum, _mm_mul_ps(_mm_mul_ps(_mm_set1_ps(uc->d), yd), _mm_cvtepi32_ps(A)));
                }
                _mm_storeu_ps(sums + k0, sum);
            }
        }
        for (int32_t k = 0; k < tn; k++) out[t0 + k] = sums[k];
    }
}

void quant_iq_avx512(quant_traits t[]) {
    t[STRATA_TYPE_IQ4_XS].vec_dot = iq4xs_vec_dot_avx512;
    quant_set_xn(t, STRATA_TYPE_IQ4_XS, iq4xs_vec_dot_n_avx512);
}
