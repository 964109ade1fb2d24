/*
 * quant_iq_avx512.c — AVX-512 (BW + VNNI) dot products of IQ4_XS against Q8_K.
 *
 * The table values v are signed and AVX-512 has no byte sign instruction, so:
 *   - one row (decode): v is shifted into unsigned bytes (v + 128 <= 241) and VNNI's dpbusd sums
 *     four products each in int32: sum v a = sum (v + 128) a - 128 sum a, where sum a over a
 *     sub-block comes from the activation's bsums;
 *   - many rows (prompt): |v| and the sign mask are made once per block, the sign goes onto each
 *     activation row (masked negate), and maddubs + dpwssd multiply and scale (pairs at most
 *     2 * 127 * 127, no saturation).
 * All integers, exact: the block's A and its float expression are the scalar kernel's, so the bits
 * are the same. The grid types (IQ3_XXS, IQ3_S, IQ2_XS) use the many-rows form for every kernel,
 * their magnitudes gathered from the grid once per block (section "grid types").
 */
#include <immintrin.h>
#include <string.h>

#include "common.h"
#include "iq_tables.h"
#include "quant_blocks.h"
#include "quant_reduce16.h"
#include "strata.h"

/* The 8 sub-block factors ls_j - 32 of an IQ4_XS block in int32 lanes, built with vector shifts
 * (no scalar stores: a wide load of values just stored one by one would stall on store forwarding). */
static inline __m256i iq4xs_factors(const block_iq4_xs *b) {
    uint32_t sl;
    memcpy(&sl, b->scales_l, 4);
    const __m256i lo = _mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32((int)sl), _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28)),
                                        _mm256_set1_epi32(0xF));
    const __m256i hi = _mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32(b->scales_h), _mm256_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14)),
                                        _mm256_set1_epi32(3));
    return _mm256_sub_epi32(_mm256_or_si256(lo, _mm256_slli_epi32(hi, 4)), _mm256_set1_epi32(32));
}

static float iq4xs_vec_dot_avx512(int64_t n, const void *w, const void *act) {
    const block_iq4_xs *x = w;
    const block_q8_K *y = act;
    int8_t lut_u[16];
    for (int k = 0; k < 16; k++) lut_u[k] = (int8_t)(iq4nl_values[k] + 128);
    const __m512i lut = _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)lut_u));
    const __m512i m4 = _mm512_set1_epi8(0x0F);
    /* qword indices: [L0 H0 L1 H1] and [L2 H2 L3 H3] of the 128-bit lanes of lo (L) and hi (H) */
    const __m512i ia = _mm512_setr_epi64(0, 1, 8, 9, 2, 3, 10, 11), ib = _mm512_setr_epi64(4, 5, 12, 13, 6, 7, 14, 15);
    /* int32 lanes 0-7 take factor 2q, lanes 8-15 factor 2q + 1 */
    const __m512i fsel = _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1);
    float sum = 0.0f;
    for (int64_t i = 0; i < n / QK_K; i++) {
        const __m256i l32 = iq4xs_factors(&x[i]);
        /* corr = sum_j (ls_j - 32) * sum(a over sub-block j), from the bsums: int16 lanes 2j, 2j + 1 = factor j */
        const __m256i lsp = _mm256_or_si256(_mm256_and_si256(l32, _mm256_set1_epi32(0xFFFF)), _mm256_slli_epi32(l32, 16));
        const __m256i cv = _mm256_madd_epi16(_mm256_loadu_si256((const __m256i *)y[i].bsums), lsp);
        const __m512i lz = _mm512_castsi256_si512(l32);
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
            const __m512i f0 = _mm512_permutexvar_epi32(_mm512_add_epi32(fsel, _mm512_set1_epi32(4 * p)), lz);
            const __m512i f1 = _mm512_permutexvar_epi32(_mm512_add_epi32(fsel, _mm512_set1_epi32(4 * p + 2)), lz);
            acc = _mm512_add_epi32(acc, _mm512_add_epi32(_mm512_mullo_epi32(s0, f0), _mm512_mullo_epi32(s1, f1)));
        }
        __m128i cs = _mm_add_epi32(_mm256_castsi256_si128(cv), _mm256_extracti128_si256(cv, 1));
        cs = _mm_add_epi32(cs, _mm_shuffle_epi32(cs, _MM_SHUFFLE(1, 0, 3, 2)));
        cs = _mm_add_epi32(cs, _mm_shuffle_epi32(cs, _MM_SHUFFLE(2, 3, 0, 1)));
        const int32_t A = _mm512_reduce_add_epi32(acc) - 128 * _mm_cvtsi128_si32(cs);
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

/* An IQ4_XS block unpacked for the many-token kernel: for values 64q .. 64q + 63, the magnitudes of
 * their table values (u[q]), which of them are negative (neg[q]: that sign goes onto the activation),
 * and the int16 scale lanes of their two sub-blocks (f[q]). Then per activation row a 64-value step
 * is maddubs (|v| * +-a, pairs at most 2 * 127 * 127: no saturation) and dpwssd (times ls - 32). */
typedef struct {
    __m512i u[4], f[4];
    __mmask64 neg[4];
    float d;
} iq4xs_unpacked;

#define XN_CHUNK 8

static inline void iq4xs_unpack(const block_iq4_xs *b, __m512i lut, iq4xs_unpacked *u) {
    const __m512i m4 = _mm512_set1_epi8(0x0F);
    const __m512i ia = _mm512_setr_epi64(0, 1, 8, 9, 2, 3, 10, 11), ib = _mm512_setr_epi64(4, 5, 12, 13, 6, 7, 14, 15);
    /* int16 lanes 0-15 take factor 2q, 16-31 factor 2q + 1 */
    const __m512i sel = _mm512_set_epi16(1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
                                         0, 0, 0, 0, 0, 0);
    const __m512i f16 = _mm512_castsi128_si512(_mm256_cvtepi32_epi16(iq4xs_factors(b))); /* int16 lane j = factor j */
    for (int p = 0; p < 2; p++) {
        const __m512i bits = _mm512_loadu_si512((const void *)(b->qs + 64 * p));
        const __m512i lo = _mm512_and_si512(bits, m4), hi = _mm512_and_si512(_mm512_srli_epi16(bits, 4), m4);
        const __m512i va = _mm512_shuffle_epi8(lut, _mm512_permutex2var_epi64(lo, ia, hi));
        const __m512i vb = _mm512_shuffle_epi8(lut, _mm512_permutex2var_epi64(lo, ib, hi));
        u->u[2 * p] = _mm512_abs_epi8(va);
        u->u[2 * p + 1] = _mm512_abs_epi8(vb);
        u->neg[2 * p] = _mm512_movepi8_mask(va);
        u->neg[2 * p + 1] = _mm512_movepi8_mask(vb);
    }
    for (int q = 0; q < 4; q++) u->f[q] = _mm512_permutexvar_epi16(_mm512_add_epi16(sel, _mm512_set1_epi16((short)(2 * q))), f16);
    u->d = quant_f16_lut[b->d];
}

/* A of one unpacked block against one activation block: exact, the scalar kernel's integer. */
static inline __m512i iq4xs_acc(const iq4xs_unpacked *u, const int8_t *q8) {
    __m512i acc = _mm512_setzero_si512();
    for (int q = 0; q < 4; q++) {
        const __m512i a = _mm512_loadu_si512((const void *)(q8 + 64 * q));
        const __m512i sa = _mm512_mask_sub_epi8(a, u->neg[q], _mm512_setzero_si512(), a);
        acc = _mm512_dpwssd_epi32(acc, _mm512_maddubs_epi16(u->u[q], sa), u->f[q]);
    }
    return acc;
}

/* IQ4_XS, four weight rows against one activation row (decode): the activation block is loaded
 * once for the four rows, whose sums are reduced together; per row the float steps are vec_dot's. */
static void iq4xs_vec_dot_x4_avx512(int64_t n, const void *w, size_t w_stride, const void *act, float out[4]) {
    const block_q8_K *y = act;
    const __m512i lut = _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)iq4nl_values));
    __m128 sum = _mm_setzero_ps();
    for (int64_t i = 0; i < n / QK_K; i++) {
        __m512i a[4];
        for (int q = 0; q < 4; q++) a[q] = _mm512_loadu_si512((const void *)(y[i].qs + 64 * q));
        __m512i acc[4];
        float dd[4];
        for (int r = 0; r < 4; r++) {
            const block_iq4_xs *b = (const block_iq4_xs *)((const uint8_t *)w + (size_t)r * w_stride) + i;
            prefetch_block((const uint8_t *)b + QUANT_PREFETCH_ROWS * w_stride, (int)sizeof *b);
            iq4xs_unpacked u;
            iq4xs_unpack(b, lut, &u);
            acc[r] = _mm512_setzero_si512();
            for (int q = 0; q < 4; q++) {
                const __m512i sa = _mm512_mask_sub_epi8(a[q], u.neg[q], _mm512_setzero_si512(), a[q]);
                acc[r] = _mm512_dpwssd_epi32(acc[r], _mm512_maddubs_epi16(u.u[q], sa), u.f[q]);
            }
            dd[r] = u.d;
        }
        const __m128i A = reduce4(acc[0], acc[1], acc[2], acc[3]);
        sum = _mm_add_ps(sum, _mm_mul_ps(_mm_mul_ps(_mm_loadu_ps(dd), _mm_set1_ps(y[i].d)), _mm_cvtepi32_ps(A)));
    }
    _mm_storeu_ps(out, sum);
}

/* IQ4_XS against several activation rows: a chunk of the row's blocks is unpacked once for all rows;
 * four rows' sums are reduced together; per row the float steps are vec_dot's, blocks in order. */
static void iq4xs_vec_dot_n_avx512(int64_t n, const void *w, const void *const *act, int32_t n_act, float *out) {
    const block_iq4_xs *x = w;
    const int64_t nb = n / QK_K;
    const __m512i lut = _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)iq4nl_values));
    for (int32_t t0 = 0; t0 < n_act; t0 += QUANT_DOT_N_MAX) {
        const int32_t tn = n_act - t0 < QUANT_DOT_N_MAX ? n_act - t0 : QUANT_DOT_N_MAX;
        float sums[QUANT_DOT_N_MAX + 3] = {0};
        for (int64_t c0 = 0; c0 < nb; c0 += XN_CHUNK) {
            const int64_t cn = nb - c0 < XN_CHUNK ? nb - c0 : XN_CHUNK;
            iq4xs_unpacked u[XN_CHUNK];
            for (int64_t c = 0; c < cn; c++) iq4xs_unpack(&x[c0 + c], lut, &u[c]);
            for (int32_t k0 = 0; k0 < tn; k0 += 4) {
                const block_q8_K *y[4];
                q8k_rows4(act + t0 + k0, tn - k0, c0, y);
                __m128 sum = _mm_loadu_ps(sums + k0);
                for (int64_t c = 0; c < cn; c++) {
                    const iq4xs_unpacked *uc = &u[c];
                    const __m128i A = reduce4(iq4xs_acc(uc, y[0][c].qs), iq4xs_acc(uc, y[1][c].qs),
                                              iq4xs_acc(uc, y[2][c].qs), iq4xs_acc(uc, y[3][c].qs));
                    const __m128 yd = _mm_setr_ps(y[0][c].d, y[1][c].d, y[2][c].d, y[3][c].d);
                    sum = _mm_add_ps(sum, _mm_mul_ps(_mm_mul_ps(_mm_set1_ps(uc->d), yd), _mm_cvtepi32_ps(A)));
                }
                _mm_storeu_ps(sums + k0, sum);
            }
        }
        for (int32_t k = 0; k < tn; k++) out[t0 + k] = sums[k];
    }
}

/* Blocks per row that the four-row kernel unpacks at once (4 rows x 8 blocks x 512 bytes: in L1). */
#define X4N_CHUNK 8

/* IQ4_XS, four weight rows x many activation rows (the prompt path). A chunk of blocks of the four
 * rows is unpacked once for all the tokens into int16 values already times their sub-block factor
 * (|ls - 32| <= 32, |v| <= 127: at most 4064), so one dpwssd against the activations widened to
 * int16 multiplies, scales and sums 32 values: 8 per block and (row, token) pair, 16 pairs in
 * registers. The int32 lanes add products of at most 2 x 4064 x 127: the block's A is exact and
 * equals the scalar kernel's. Per pair the float step is vec_dot's, (d * y.d) * A added to the
 * pair's sum in block order, done for 16 pairs in one vector: out[4 k + r] is bit for bit
 * vec_dot(n, row r, act[k]). */
static void iq4xs_vec_dot_4xn_avx512(int64_t n, const void *w, size_t ws, const void *const *act, int32_t n_act,
                                     float *out) {
    const int64_t nb = n / QK_K;
    const __m512i lut = _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)iq4nl_values));
    const __m512i m4 = _mm512_set1_epi8(0x0F);
    const __m512i ia = _mm512_setr_epi64(0, 1, 8, 9, 2, 3, 10, 11), ib = _mm512_setr_epi64(4, 5, 12, 13, 6, 7, 14, 15);
    __m512i w16[4][X4N_CHUNK][8]; /* [row][block][sub-block]: factor x value, int16 */
    float dr[X4N_CHUNK][4];
    for (int32_t t0 = 0; t0 < n_act; t0 += QUANT_DOT_4XN_MAX) {
        const int32_t tn = n_act - t0 < QUANT_DOT_4XN_MAX ? n_act - t0 : QUANT_DOT_4XN_MAX;
        __m512 sums[QUANT_DOT_4XN_MAX / 4]; /* lane 4 r + k: row r, token k0 + k */
        for (int g = 0; g < QUANT_DOT_4XN_MAX / 4; g++) sums[g] = _mm512_setzero_ps();
        for (int64_t c0 = 0; c0 < nb; c0 += X4N_CHUNK) {
            const int64_t cn = nb - c0 < X4N_CHUNK ? nb - c0 : X4N_CHUNK;
            for (int r = 0; r < 4; r++)
                for (int64_t c = 0; c < cn; c++) {
                    const block_iq4_xs *b = (const block_iq4_xs *)((const uint8_t *)w + (size_t)r * ws) + c0 + c;
                    for (int p = 0; p < 2; p++) {
                        const __m512i bits = _mm512_loadu_si512((const void *)(b->qs + 64 * p));
                        const __m512i lo = _mm512_and_si512(bits, m4);
                        const __m512i hi = _mm512_and_si512(_mm512_srli_epi16(bits, 4), m4);
                        /* values 128p .. 128p + 63 and 128p + 64 .. 128p + 127 in order */
                        const __m512i va = _mm512_shuffle_epi8(lut, _mm512_permutex2var_epi64(lo, ia, hi));
                        const __m512i vb = _mm512_shuffle_epi8(lut, _mm512_permutex2var_epi64(lo, ib, hi));
                        const __m256i half[4] = {_mm512_castsi512_si256(va), _mm512_extracti64x4_epi64(va, 1),
                                                 _mm512_castsi512_si256(vb), _mm512_extracti64x4_epi64(vb, 1)};
                        for (int h = 0; h < 4; h++) {
                            const int j = 4 * p + h;
                            const int ls = ((b->scales_l[j / 2] >> (4 * (j % 2))) & 0xF) |
                                           (((b->scales_h >> (2 * j)) & 3) << 4);
                            const __m512i f = _mm512_set1_epi16((short)(ls - 32));
                            w16[r][c][j] = _mm512_mullo_epi16(_mm512_cvtepi8_epi16(half[h]), f);
                        }
                    }
                    dr[c][r] = quant_f16_lut[b->d];
                }
            for (int32_t k0 = 0; k0 < tn; k0 += 4) {
                const block_q8_K *y[4];
                q8k_rows4(act + t0 + k0, tn - k0, c0, y);
                __m512 sum = sums[k0 / 4];
                for (int64_t c = 0; c < cn; c++) {
                    __m512i acc[16];
                    for (int q = 0; q < 16; q++) acc[q] = _mm512_setzero_si512();
                    for (int j = 0; j < 8; j++) {
                        __m512i a16[4];
                        for (int k = 0; k < 4; k++)
                            a16[k] = _mm512_cvtepi8_epi16(_mm256_loadu_si256((const __m256i *)(y[k][c].qs + 32 * j)));
                        for (int r = 0; r < 4; r++)
                            for (int k = 0; k < 4; k++)
                                acc[4 * r + k] = _mm512_dpwssd_epi32(acc[4 * r + k], w16[r][c][j], a16[k]);
                    }
                    const __m512 A = _mm512_cvtepi32_ps(reduce16(acc));
                    const __m512 dv = pairs_by_row(dr[c]);
                    const __m512 yv = token_scales(y, c);
                    sum = _mm512_add_ps(sum, _mm512_mul_ps(_mm512_mul_ps(dv, yv), A));
                }
                sums[k0 / 4] = sum;
            }
        }
        for (int32_t k0 = 0; k0 < tn; k0 += 4) store_pairs(out + (size_t)(t0 + k0) * 4, sums[k0 / 4], tn - k0);
    }
}

/* ---- grid types: IQ3_XXS, IQ3_S, IQ2_XS ----------------------------------------------------------- */

/* A grid block unpacked: for values 64q .. 64q + 63 the grid magnitudes (m[q], gathered from the
 * grid table: IQ3 4 values per index, IQ2_XS 8), which values are negative (neg[q]: that sign goes
 * onto the activation with a masked negate, |a| <= 127 so it never overflows), and the int16 lanes of
 * their odd factors 2 s + 1 (f[q]). A step is maddubs (m * +-a, pairs at most 2 * 62 * 127: no
 * saturation) then dpwssd (times the factor): the scalar kernel's exact A. The power of two of the
 * scale stays in the float expression, as in quant_iq.c. */
typedef struct {
    __m512i m[4], f[4];
    __mmask64 neg[4];
    float d;
} grid_unpacked;

enum { GRID_IQ3XXS, GRID_IQ3S, GRID_IQ2XS };

/* int16 lanes 0..15 = a, 16..31 = b: the factors of two 32-value sub-blocks */
static inline __m512i grid_pair16(int a, int b) {
    return _mm512_inserti64x4(_mm512_set1_epi16((short)a), _mm256_set1_epi16((short)b), 1);
}

/* iq_ksigns[i] is i with bit 7 set to the parity of i (each 8 values carry an even count of minus
 * signs): computed on int32 lanes i < 128, so the 32 sign bytes of a block need no table loads. */
static inline __m512i ksigns_lanes(__m512i v) {
    __m512i p = _mm512_xor_si512(v, _mm512_srli_epi32(v, 4));
    p = _mm512_xor_si512(p, _mm512_srli_epi32(p, 2));
    p = _mm512_xor_si512(p, _mm512_srli_epi32(p, 1));
    return _mm512_or_si512(v, _mm512_slli_epi32(_mm512_and_si512(p, _mm512_set1_epi32(1)), 7));
}

static inline void iq3xxs_unpack(const block_iq3_xxs *b, grid_unpacked *u) {
    uint32_t aux[8];
    memcpy(aux, b->sas, 32);
    /* sign byte of values 32 ib + 8 l .. + 7: ksigns of bits 7 l .. 7 l + 6 of sub-block ib's word;
     * lanes 4 ib + l of two vectors (ib < 4, ib >= 4), narrowed to bytes: 8 bytes = one mask */
    const __m512i words = _mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)b->sas));
    const __m512i sel = _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3);
    const __m512i sh = _mm512_setr_epi32(0, 7, 14, 21, 0, 7, 14, 21, 0, 7, 14, 21, 0, 7, 14, 21);
    __m128i sg[2];
    for (int h = 0; h < 2; h++) {
        const __m512i wv = _mm512_permutexvar_epi32(_mm512_add_epi32(sel, _mm512_set1_epi32(4 * h)), words);
        const __m512i v = _mm512_and_si512(_mm512_srlv_epi32(wv, sh), _mm512_set1_epi32(127));
        sg[h] = _mm512_cvtepi32_epi8(ksigns_lanes(v));
    }
    for (int q = 0; q < 4; q++) {
        const __m512i idx = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(b->qs + 16 * q)));
        u->m[q] = _mm512_i32gather_epi32(idx, (const void *)iq3xxs_grid, 4);
        u->neg[q] = (__mmask64)(q % 2 ? _mm_extract_epi64(sg[q / 2], 1) : _mm_cvtsi128_si64(sg[q / 2]));
        u->f[q] = grid_pair16(2 * (int)(aux[2 * q] >> 28) + 1, 2 * (int)(aux[2 * q + 1] >> 28) + 1);
    }
    u->d = quant_f16_lut[b->d];
}

static inline void iq3s_unpack(const block_iq3_s *b, grid_unpacked *u) {
    const __m512i bitpos = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    for (int q = 0; q < 4; q++) {
        /* index t = qs[t] | (bit t % 8 of qh[t / 8]) << 8, for t = 16 q .. 16 q + 15 */
        const int h16 = b->qh[2 * q] | (b->qh[2 * q + 1] << 8);
        const __m512i hb = _mm512_and_si512(_mm512_srlv_epi32(_mm512_set1_epi32(h16), bitpos), _mm512_set1_epi32(1));
        const __m512i idx = _mm512_or_si512(_mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(b->qs + 16 * q))),
                                            _mm512_slli_epi32(hb, 8));
        u->m[q] = _mm512_i32gather_epi32(idx, (const void *)iq3s_grid, 4);
        uint64_t neg;
        memcpy(&neg, b->signs + 8 * q, 8); /* one bit per value, in order */
        u->neg[q] = (__mmask64)neg;
        u->f[q] = grid_pair16(1 + 2 * (b->scales[q] & 0xF), 1 + 2 * (b->scales[q] >> 4));
    }
    u->d = quant_f16_lut[b->d];
}

static inline void iq2xs_unpack(const block_iq2_xs *b, grid_unpacked *u) {
    /* 16 factors of 16 values: group 2p from the low nibble of scales[p], 2p + 1 from the high one */
    uint64_t s8;
    memcpy(&s8, b->scales, 8);
    const __m128i sv = _mm_cvtsi64_si128((long long)s8), m4 = _mm_set1_epi8(0x0F);
    const __m128i s16 = _mm_unpacklo_epi8(_mm_and_si128(sv, m4), _mm_and_si128(_mm_srli_epi16(sv, 4), m4));
    const __m512i f16 = _mm512_castsi256_si512(
        _mm256_add_epi16(_mm256_slli_epi16(_mm256_cvtepu8_epi16(s16), 1), _mm256_set1_epi16(1)));
    /* int16 lane l of f[q] = factor 4q + l / 8 (lane l holds values 2l, 2l + 1 of the 64) */
    const __m512i sel = _mm512_set_epi16(3, 3, 3, 3, 3, 3, 3, 3, 2, 2, 2, 2, 2, 2, 2, 2, 1, 1, 1, 1, 1, 1, 1, 1, 0, 0,
                                         0, 0, 0, 0, 0, 0);
    /* sign bytes: ksigns of the top 7 bits of each of the 32 words, 16 per vector */
    __m128i sg[2];
    for (int h = 0; h < 2; h++)
        sg[h] = _mm512_cvtepi32_epi8(
            ksigns_lanes(_mm512_srli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(b->qs + 16 * h))), 9)));
    for (int q = 0; q < 4; q++) {
        const __m128i w = _mm_loadu_si128((const __m128i *)(b->qs + 8 * q));
        const __m512i idx = _mm512_and_si512(_mm512_cvtepu16_epi64(w), _mm512_set1_epi64(511));
        u->m[q] = _mm512_i64gather_epi64(idx, (const void *)iq2xs_grid, 8);
        u->neg[q] = (__mmask64)(q % 2 ? _mm_extract_epi64(sg[q / 2], 1) : _mm_cvtsi128_si64(sg[q / 2]));
        u->f[q] = _mm512_permutexvar_epi16(_mm512_add_epi16(sel, _mm512_set1_epi16((short)(4 * q))), f16);
    }
    u->d = quant_f16_lut[b->d];
}

/* kind is a constant at every call: the kernels below are written once and compiled per type */
static inline __attribute__((always_inline)) void grid_unpack(const uint8_t *w, int64_t i, grid_unpacked *u,
                                                              const int kind) {
    if (kind == GRID_IQ3XXS)
        iq3xxs_unpack((const block_iq3_xxs *)w + i, u);
    else if (kind == GRID_IQ3S)
        iq3s_unpack((const block_iq3_s *)w + i, u);
    else
        iq2xs_unpack((const block_iq2_xs *)w + i, u);
}

static inline __attribute__((always_inline)) int grid_block_bytes(const int kind) {
    return kind == GRID_IQ3XXS ? (int)sizeof(block_iq3_xxs)
                               : kind == GRID_IQ3S ? (int)sizeof(block_iq3_s) : (int)sizeof(block_iq2_xs);
}

/* The power of two of the scale, as quant_iq.c multiplies it: ((dw * da) * p) * A; IQ3_S has none. */
static inline __attribute__((always_inline)) float grid_pow2(const int kind) {
    return kind == GRID_IQ3XXS ? 0.25f : 0.125f;
}

static inline __m512i grid_step(__m512i acc, const grid_unpacked *u, int q, __m512i a) {
    const __m512i sa = _mm512_mask_sub_epi8(a, u->neg[q], _mm512_setzero_si512(), a);
    return _mm512_dpwssd_epi32(acc, _mm512_maddubs_epi16(u->m[q], sa), u->f[q]);
}

static inline __m512i grid_acc(const grid_unpacked *u, const int8_t *q8) {
    __m512i acc = _mm512_setzero_si512();
    for (int q = 0; q < 4; q++) acc = grid_step(acc, u, q, _mm512_loadu_si512((const void *)(q8 + 64 * q)));
    return acc;
}

static inline __attribute__((always_inline)) float grid_vec_dot(int64_t n, const void *w, const void *act,
                                                                const int kind) {
    const block_q8_K *y = act;
    float sum = 0.0f;
    for (int64_t i = 0; i < n / QK_K; i++) {
        grid_unpacked u;
        grid_unpack(w, i, &u, kind);
        const int32_t A = _mm512_reduce_add_epi32(grid_acc(&u, y[i].qs));
        if (kind == GRID_IQ3S)
            sum += (u.d * y[i].d) * (float)A;
        else
            sum += ((u.d * y[i].d) * grid_pow2(kind)) * (float)A;
    }
    return sum;
}

/* lanes of (dw * da) [* 2^-k], in quant_iq.c's order */
static inline __attribute__((always_inline)) __m128 grid_scale4(__m128 dw, __m128 da, const int kind) {
    const __m128 s = _mm_mul_ps(dw, da);
    return kind == GRID_IQ3S ? s : _mm_mul_ps(s, _mm_set1_ps(grid_pow2(kind)));
}

/* Four weight rows against one activation row (decode), as iq4xs_vec_dot_x4_avx512. */
static inline __attribute__((always_inline)) void grid_vec_dot_x4(int64_t n, const void *w, size_t w_stride,
                                                                  const void *act, float out[4], const int kind) {
    const block_q8_K *y = act;
    const int bsz = grid_block_bytes(kind);
    __m128 sum = _mm_setzero_ps();
    for (int64_t i = 0; i < n / QK_K; i++) {
        __m512i a[4];
        for (int q = 0; q < 4; q++) a[q] = _mm512_loadu_si512((const void *)(y[i].qs + 64 * q));
        __m512i acc[4];
        float dd[4];
        for (int r = 0; r < 4; r++) {
            const uint8_t *row = (const uint8_t *)w + (size_t)r * w_stride;
            prefetch_block(row + QUANT_PREFETCH_ROWS * w_stride + i * bsz, bsz);
            grid_unpacked u;
            grid_unpack(row, i, &u, kind);
            acc[r] = _mm512_setzero_si512();
            for (int q = 0; q < 4; q++) acc[r] = grid_step(acc[r], &u, q, a[q]);
            dd[r] = u.d;
        }
        const __m128i A = reduce4(acc[0], acc[1], acc[2], acc[3]);
        sum = _mm_add_ps(sum, _mm_mul_ps(grid_scale4(_mm_loadu_ps(dd), _mm_set1_ps(y[i].d), kind), _mm_cvtepi32_ps(A)));
    }
    _mm_storeu_ps(out, sum);
}

/* Against several activation rows: a chunk of blocks unpacked once, four rows' sums reduced together,
 * each row's float sum over the blocks in vec_dot's order. */
static inline __attribute__((always_inline)) void grid_vec_dot_n(int64_t n, const void *w, const void *const *act,
                                                                 int32_t n_act, float *out, const int kind) {
    const int64_t nb = n / QK_K;
    for (int32_t t0 = 0; t0 < n_act; t0 += QUANT_DOT_N_MAX) {
        const int32_t tn = n_act - t0 < QUANT_DOT_N_MAX ? n_act - t0 : QUANT_DOT_N_MAX;
        float sums[QUANT_DOT_N_MAX + 3] = {0};
        for (int64_t c0 = 0; c0 < nb; c0 += XN_CHUNK) {
            const int64_t cn = nb - c0 < XN_CHUNK ? nb - c0 : XN_CHUNK;
            grid_unpacked u[XN_CHUNK];
            for (int64_t c = 0; c < cn; c++) grid_unpack(w, c0 + c, &u[c], kind);
            for (int32_t k0 = 0; k0 < tn; k0 += 4) {
                const block_q8_K *y[4];
                q8k_rows4(act + t0 + k0, tn - k0, c0, y);
                __m128 sum = _mm_loadu_ps(sums + k0);
                for (int64_t c = 0; c < cn; c++) {
                    const grid_unpacked *uc = &u[c];
                    const __m128i A = reduce4(grid_acc(uc, y[0][c].qs), grid_acc(uc, y[1][c].qs),
                                              grid_acc(uc, y[2][c].qs), grid_acc(uc, y[3][c].qs));
                    const __m128 yd = _mm_setr_ps(y[0][c].d, y[1][c].d, y[2][c].d, y[3][c].d);
                    sum = _mm_add_ps(sum, _mm_mul_ps(grid_scale4(_mm_set1_ps(uc->d), yd, kind), _mm_cvtepi32_ps(A)));
                }
                _mm_storeu_ps(sums + k0, sum);
            }
        }
        for (int32_t k = 0; k < tn; k++) out[t0 + k] = sums[k];
    }
}

/* Four weight rows x many activation rows (the prompt path): the 16 (row, token) pairs accumulate in
 * registers, are reduced together, and the float step runs for the 16 in one vector; out[4 k + r] is
 * bit for bit vec_dot(n, row r, act[k]). */
static inline __attribute__((always_inline)) void grid_vec_dot_4xn(int64_t n, const void *w, size_t ws,
                                                                   const void *const *act, int32_t n_act, float *out,
                                                                   const int kind) {
    const int64_t nb = n / QK_K;
    grid_unpacked u[4][X4N_CHUNK];
    for (int32_t t0 = 0; t0 < n_act; t0 += QUANT_DOT_4XN_MAX) {
        const int32_t tn = n_act - t0 < QUANT_DOT_4XN_MAX ? n_act - t0 : QUANT_DOT_4XN_MAX;
        __m512 sums[QUANT_DOT_4XN_MAX / 4]; /* lane 4 r + k: row r, token k0 + k */
        for (int g = 0; g < QUANT_DOT_4XN_MAX / 4; g++) sums[g] = _mm512_setzero_ps();
        for (int64_t c0 = 0; c0 < nb; c0 += X4N_CHUNK) {
            const int64_t cn = nb - c0 < X4N_CHUNK ? nb - c0 : X4N_CHUNK;
            for (int r = 0; r < 4; r++)
                for (int64_t c = 0; c < cn; c++) grid_unpack((const uint8_t *)w + (size_t)r * ws, c0 + c, &u[r][c], kind);
            for (int32_t k0 = 0; k0 < tn; k0 += 4) {
                const block_q8_K *y[4];
                q8k_rows4(act + t0 + k0, tn - k0, c0, y);
                __m512 sum = sums[k0 / 4];
                for (int64_t c = 0; c < cn; c++) {
                    __m512i acc[16];
                    for (int p = 0; p < 16; p++) acc[p] = _mm512_setzero_si512();
                    for (int q = 0; q < 4; q++) {
                        __m512i a[4];
                        for (int k = 0; k < 4; k++) a[k] = _mm512_loadu_si512((const void *)(y[k][c].qs + 64 * q));
                        for (int r = 0; r < 4; r++)
                            for (int k = 0; k < 4; k++) acc[4 * r + k] = grid_step(acc[4 * r + k], &u[r][c], q, a[k]);
                    }
                    const float dd[4] = {u[0][c].d, u[1][c].d, u[2][c].d, u[3][c].d};
                    const __m512 yv = token_scales(y, c);
                    __m512 s = _mm512_mul_ps(pairs_by_row(dd), yv);
                    if (kind != GRID_IQ3S) s = _mm512_mul_ps(s, _mm512_set1_ps(grid_pow2(kind)));
                    sum = _mm512_add_ps(sum, _mm512_mul_ps(s, _mm512_cvtepi32_ps(reduce16(acc))));
                }
                sums[k0 / 4] = sum;
            }
        }
        for (int32_t k0 = 0; k0 < tn; k0 += 4) store_pairs(out + (size_t)(t0 + k0) * 4, sums[k0 / 4], tn - k0);
    }
}

#define GRID_KERNELS(pfx, kind)                                                                                   \
    static float pfx##_vec_dot_avx512(int64_t n, const void *w, const void *act) {                                \
        return grid_vec_dot(n, w, act, kind);                                                                     \
    }                                                                                                             \
    static void pfx##_vec_dot_x4_avx512(int64_t n, const void *w, size_t ws, const void *act, float out[4]) {     \
        grid_vec_dot_x4(n, w, ws, act, out, kind);                                                                \
    }                                                                                                             \
    static void pfx##_vec_dot_n_avx512(int64_t n, const void *w, const void *const *act, int32_t n_act,          \
                                       float *out) {                                                              \
        grid_vec_dot_n(n, w, act, n_act, out, kind);                                                              \
    }                                                                                                             \
    static void pfx##_vec_dot_4xn_avx512(int64_t n, const void *w, size_t ws, const void *const *act,            \
                                         int32_t n_act, float *out) {                                             \
        grid_vec_dot_4xn(n, w, ws, act, n_act, out, kind);                                                        \
    }
GRID_KERNELS(iq3xxs, GRID_IQ3XXS)
GRID_KERNELS(iq3s, GRID_IQ3S)
GRID_KERNELS(iq2xs, GRID_IQ2XS)
#undef GRID_KERNELS

void quant_iq_avx512(quant_traits t[]) {
    quant_set_4xn(t, STRATA_TYPE_IQ4_XS, iq4xs_vec_dot_4xn_avx512);
    t[STRATA_TYPE_IQ4_XS].vec_dot = iq4xs_vec_dot_avx512;
    quant_set_xn(t, STRATA_TYPE_IQ4_XS, iq4xs_vec_dot_n_avx512);
    quant_set_x4(t, STRATA_TYPE_IQ4_XS, iq4xs_vec_dot_x4_avx512);
    /* grid types */
    t[STRATA_TYPE_IQ3_XXS].vec_dot = iq3xxs_vec_dot_avx512;
    t[STRATA_TYPE_IQ3_S].vec_dot = iq3s_vec_dot_avx512;
    t[STRATA_TYPE_IQ2_XS].vec_dot = iq2xs_vec_dot_avx512;
    quant_set_x4(t, STRATA_TYPE_IQ3_XXS, iq3xxs_vec_dot_x4_avx512);
    quant_set_x4(t, STRATA_TYPE_IQ3_S, iq3s_vec_dot_x4_avx512);
    quant_set_x4(t, STRATA_TYPE_IQ2_XS, iq2xs_vec_dot_x4_avx512);
    quant_set_xn(t, STRATA_TYPE_IQ3_XXS, iq3xxs_vec_dot_n_avx512);
    quant_set_xn(t, STRATA_TYPE_IQ3_S, iq3s_vec_dot_n_avx512);
    quant_set_xn(t, STRATA_TYPE_IQ2_XS, iq2xs_vec_dot_n_avx512);
    quant_set_4xn(t, STRATA_TYPE_IQ3_XXS, iq3xxs_vec_dot_4xn_avx512);
    quant_set_4xn(t, STRATA_TYPE_IQ3_S, iq3s_vec_dot_4xn_avx512);
    quant_set_4xn(t, STRATA_TYPE_IQ2_XS, iq2xs_vec_dot_4xn_avx512);
    /* IQ4_NL: its kernels live with the other 32-value blocks (quant_legacy_avx512.c) */
    t[STRATA_TYPE_IQ4_NL].vec_dot = quant_iq4nl_vec_dot_avx512;
    quant_set_x4(t, STRATA_TYPE_IQ4_NL, quant_iq4nl_vec_dot_x4_avx512);
    quant_set_4xn(t, STRATA_TYPE_IQ4_NL, quant_iq4nl_vec_dot_4xn_avx512);
}
