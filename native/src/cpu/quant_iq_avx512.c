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

void quant_iq_avx512(quant_traits t[]) { t[STRATA_TYPE_IQ4_XS].vec_dot = iq4xs_vec_dot_avx512; }
