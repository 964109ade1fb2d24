/*
 * quant_k_avx512.c — AVX-512 (BW + VNNI) dot products of Q2_K, Q3_K, Q4_K, Q5_K, Q6_K against Q8_K.
 *
 * Same arithmetic as quant_k.c, 128 values per step: maddubs turns unsigned weight values times
 * signed activations into int16 pairs (no saturation: bounds in quant_k.c), and VNNI's dpwssd
 * multiplies the pairs by their sub-block scale and accumulates in int32 — exact, so A and B are the
 * scalar kernel's integers and the float expression per block is the same: bit-identical results.
 * Q2_K and Q3_K share one unpacked form (16 sub-blocks of 16 values; Q3_K's values biased to unsigned).
 */
#include <immintrin.h>
#include <string.h>

#include "common.h"
#include "quant_blocks.h"
#include "quant_k_simd.h"
#include "quant_reduce16.h"
#include "strata.h"

static inline __m256i load256(const void *p) { return _mm256_loadu_si256((const __m256i *)p); }

/* [p0 | p1]: two 32-byte loads into one 64-byte register */
static inline __m512i load2x256(const void *p0, const void *p1) {
    return _mm512_inserti64x4(_mm512_castsi256_si512(load256(p0)), load256(p1), 1);
}

/* int16 lanes 0..15 = scale a, 16..31 = scale b */
static inline __m512i scale_pair(int a, int b) {
    return _mm512_inserti64x4(_mm512_set1_epi16((short)a), _mm256_set1_epi16((short)b), 1);
}

/* ---- Q4_K and Q5_K ------------------------------------------------------------------------------ */

/* One 128-value step of Q4_K/Q5_K: 64 bytes of nibbles (groups 2p, 2p + 1 of 32 bytes), values
 * lo = [sub 4p | sub 4p + 2], hi = [sub 4p + 1 | sub 4p + 3]. */
static inline __m512i k_step(__m512i acc, __m512i lo, __m512i hi, const int8_t *q8, const uint8_t *sc, int p) {
    const __m512i a_lo = load2x256(q8 + 128 * p, q8 + 128 * p + 64);
    const __m512i a_hi = load2x256(q8 + 128 * p + 32, q8 + 128 * p + 96);
    acc = _mm512_dpwssd_epi32(acc, _mm512_maddubs_epi16(lo, a_lo), scale_pair(sc[4 * p], sc[4 * p + 2]));
    acc = _mm512_dpwssd_epi32(acc, _mm512_maddubs_epi16(hi, a_hi), scale_pair(sc[4 * p + 1], sc[4 * p + 3]));
    return acc;
}

static float q4k_vec_dot_avx512(int64_t n, const void *w, const void *act) {
    const block_q4_K *x = w;
    const block_q8_K *y = act;
    const __m512i m4 = _mm512_set1_epi8(0x0F);
    float sum = 0.0f;
    for (int64_t i = 0; i < n / QK_K; i++) {
        uint8_t sc[8];
        const uint64_t m = k_scale_words(x[i].scales, sc);
        const int32_t B = k_min_sum(m, y[i].bsums);
        __m512i acc = _mm512_setzero_si512();
        for (int p = 0; p < 2; p++) {
            const __m512i bits = _mm512_loadu_si512((const void *)(x[i].qs + 64 * p));
            const __m512i lo = _mm512_and_si512(bits, m4);
            const __m512i hi = _mm512_and_si512(_mm512_srli_epi16(bits, 4), m4);
            acc = k_step(acc, lo, hi, y[i].qs, sc, p);
        }
        const int32_t A = _mm512_reduce_add_epi32(acc);
        sum += (quant_f16_lut[x[i].d] * y[i].d) * (float)A - (quant_f16_lut[x[i].dmin] * y[i].d) * (float)B;
    }
    return sum;
}

/* Four int32 accumulators -> their four lane sums (exact integer adds, any order). */
static inline __m128i reduce4(__m512i v0, __m512i v1, __m512i v2, __m512i v3) {
    /* 512 -> 256: [v0 | v1] halves added, [v2 | v3] halves added */
    const __m512i a = _mm512_add_epi32(_mm512_shuffle_i64x2(v0, v1, 0x44), _mm512_shuffle_i64x2(v0, v1, 0xEE));
    const __m512i b = _mm512_add_epi32(_mm512_shuffle_i64x2(v2, v3, 0x44), _mm512_shuffle_i64x2(v2, v3, 0xEE));
    /* 256 -> 128: lanes [v0 v1 v2 v3] */
    const __m512i c = _mm512_add_epi32(_mm512_shuffle_i64x2(a, b, 0x88), _mm512_shuffle_i64x2(a, b, 0xDD));
    /* each 128-bit lane holds one accumulator: sum its four ints */
    const __m512i d = _mm512_add_epi32(c, _mm512_shuffle_epi32(c, _MM_PERM_BADC));
    const __m512i e = _mm512_add_epi32(d, _mm512_shuffle_epi32(d, _MM_PERM_CDAB));
    /* lane k of the result = element 0 of 128-bit lane k */
    return _mm512_castsi512_si128(
        _mm512_permutexvar_epi32(_mm512_setr_epi32(0, 4, 8, 12, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0), e));
}

/* Four 8-lane int32 vectors -> their four sums. */
static inline __m128i reduce4_256(__m256i v0, __m256i v1, __m256i v2, __m256i v3) {
    const __m256i h = _mm256_hadd_epi32(_mm256_hadd_epi32(v0, v1), _mm256_hadd_epi32(v2, v3));
    return _mm_add_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1));
}

/* m_j in int16 lanes 2j and 2j + 1: madd with the 16 bsums gives m_j * (bsums[2j] + bsums[2j+1]). */
static inline __m256i mins_pairs(uint64_t m) {
    /* int32 lane j = m_j, i.e. its two int16 halves are m_j and 0; the caller copies m_j up */
    return _mm256_cvtepu8_epi32(_mm_cvtsi64_si128((long long)m));
}

/* The 16 integer sums of one super-block for 4 weight rows x 4 tokens, acc[4 r + k]: per quarter q (64
 * values), row r's unsigned values wq[r][q] times token k's 8-bit values, adjacent products summed
 * (maddubs), then each pair weighted by the row's int16 scale lanes sq[r][q] (dpwssd). Exact, so any
 * caller's float step sees the same integers as its one-row kernel. */
static inline __attribute__((always_inline)) void dot16_scaled(const __m512i *const wq[4], const __m512i *const sq[4],
                                                               const block_q8_K *const y[4], int64_t c,
                                                               __m512i acc[16]) {
    for (int p = 0; p < 16; p++) acc[p] = _mm512_setzero_si512();
    for (int q = 0; q < 4; q++) {
        __m512i a[4];
        for (int k = 0; k < 4; k++) a[k] = _mm512_loadu_si512((const void *)(y[k][c].qs + 64 * q));
        for (int r = 0; r < 4; r++)
            for (int k = 0; k < 4; k++)
                acc[4 * r + k] = _mm512_dpwssd_epi32(acc[4 * r + k], _mm512_maddubs_epi16(wq[r][q], a[k]), sq[r][q]);
    }
}

/* Unpacked Q4_K block in the activations' order: w[q] holds values 64q .. 64q + 63 (sub-block 2q
 * from the low nibbles of bytes 32q .. 32q + 31, sub-block 2q + 1 from their high nibbles), so each
 * activation row is read with four plain 64-byte loads; s[q] the matching int16 scale lanes. */
typedef struct {
    __m512i w[4], s[4];
    __m256i mpair; /* int16 lanes 2j, 2j + 1 = m_j */
    float d, dmin;
} q4k_unpacked;

static inline void q4k_unpack(const block_q4_K *b, q4k_unpacked *u) {
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    uint8_t sc[8];
    const uint64_t m = k_scale_words(b->scales, sc);
    for (int q = 0; q < 4; q++) {
        const __m256i bits = load256(b->qs + 32 * q);
        const __m256i lo = _mm256_and_si256(bits, m4), hi = _mm256_and_si256(_mm256_srli_epi16(bits, 4), m4);
        u->w[q] = _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
        u->s[q] = scale_pair(sc[2 * q], sc[2 * q + 1]);
    }
    const __m256i mm = mins_pairs(m);
    u->mpair = _mm256_or_si256(mm, _mm256_slli_epi32(mm, 16));
    u->d = quant_f16_lut[b->d];
    u->dmin = quant_f16_lut[b->dmin];
}

/* A's lanes of one unpacked block against one activation block */
static inline __m512i q4k_acc(const q4k_unpacked *u, const int8_t *q8) {
    __m512i acc = _mm512_setzero_si512();
    for (int q = 0; q < 4; q++)
        acc = _mm512_dpwssd_epi32(acc, _mm512_maddubs_epi16(u->w[q], _mm512_loadu_si512((const void *)(q8 + 64 * q))),
                                  u->s[q]);
    return acc;
}

/* B's lanes: m_j * (bsums[2j] + bsums[2j+1]) */
static inline __m256i q4k_bacc(const q4k_unpacked *u, const int16_t *bsums) {
    return _mm256_madd_epi16(_mm256_loadu_si256((const __m256i *)bsums), u->mpair);
}

/* Blocks unpacked at once by the many-token kernels (kept on the stack, in L1). */
#define XN_CHUNK 8

/* Q4_K, four weight rows against one activation row (decode): the activation block is loaded once
 * (four 64-byte registers) for the four rows, whose integer sums are reduced together; per row the
 * float steps are vec_dot's, blocks in order, so out[r] is bit for bit vec_dot of row r. */
static void q4k_vec_dot_x4_avx512(int64_t n, const void *w, size_t w_stride, const void *act, float out[4]) {
    const block_q8_K *y = act;
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    __m128 sum = _mm_setzero_ps();
    for (int64_t i = 0; i < n / QK_K; i++) {
        __m512i a[4];
        for (int q = 0; q < 4; q++) a[q] = _mm512_loadu_si512((const void *)(y[i].qs + 64 * q));
        const __m256i bs = _mm256_loadu_si256((const __m256i *)y[i].bsums);
        __m512i acc[4];
        __m256i bacc[4];
        float dd[4], dm[4];
        for (int r = 0; r < 4; r++) {
            const block_q4_K *b = (const block_q4_K *)((const uint8_t *)w + (size_t)r * w_stride) + i;
            prefetch_block((const uint8_t *)b + QUANT_PREFETCH_ROWS * w_stride, (int)sizeof *b);
            uint8_t sc[8];
            const uint64_t m = k_scale_words(b->scales, sc);
            acc[r] = _mm512_setzero_si512();
            for (int q = 0; q < 4; q++) {
                const __m256i bits = load256(b->qs + 32 * q);
                const __m256i lo = _mm256_and_si256(bits, m4), hi = _mm256_and_si256(_mm256_srli_epi16(bits, 4), m4);
                const __m512i wq = _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
                acc[r] =
                    _mm512_dpwssd_epi32(acc[r], _mm512_maddubs_epi16(wq, a[q]), scale_pair(sc[2 * q], sc[2 * q + 1]));
            }
            const __m256i mp = mins_pairs(m);
            bacc[r] = _mm256_madd_epi16(bs, _mm256_or_si256(mp, _mm256_slli_epi32(mp, 16)));
            dd[r] = quant_f16_lut[b->d];
            dm[r] = quant_f16_lut[b->dmin];
        }
        const __m128i A = reduce4(acc[0], acc[1], acc[2], acc[3]);
        const __m128i B = reduce4_256(bacc[0], bacc[1], bacc[2], bacc[3]);
        const __m128 yd = _mm_set1_ps(y[i].d);
        const __m128 ta = _mm_mul_ps(_mm_mul_ps(_mm_loadu_ps(dd), yd), _mm_cvtepi32_ps(A));
        const __m128 tb = _mm_mul_ps(_mm_mul_ps(_mm_loadu_ps(dm), yd), _mm_cvtepi32_ps(B));
        sum = _mm_add_ps(sum, _mm_sub_ps(ta, tb));
    }
    _mm_storeu_ps(out, sum);
}

/* Q4_K against several activation rows: a chunk of the row's blocks is unpacked once for all the rows;
 * four rows' integer sums are reduced together; each row's float sum runs over the blocks in order
 * with vec_dot's expression (lane k of the 4-wide float ops is exactly the scalar sequence), so
 * out[k] is bit for bit vec_dot(n, w, act[k]). */
static void q4k_vec_dot_n_avx512(int64_t n, const void *w, const void *const *act, int32_t n_act, float *out) {
    const block_q4_K *x = w;
    const int64_t nb = n / QK_K;
    for (int32_t t0 = 0; t0 < n_act; t0 += QUANT_DOT_N_MAX) {
        const int32_t tn = n_act - t0 < QUANT_DOT_N_MAX ? n_act - t0 : QUANT_DOT_N_MAX;
        float sums[QUANT_DOT_N_MAX + 3] = {0};
        for (int64_t c0 = 0; c0 < nb; c0 += XN_CHUNK) {
            const int64_t cn = nb - c0 < XN_CHUNK ? nb - c0 : XN_CHUNK;
            q4k_unpacked u[XN_CHUNK];
            for (int64_t c = 0; c < cn; c++) q4k_unpack(&x[c0 + c], &u[c]);
            for (int32_t k0 = 0; k0 < tn; k0 += 4) {
                const block_q8_K *y[4];
                q8k_rows4(act + t0 + k0, tn - k0, c0, y);
                __m128 sum = _mm_loadu_ps(sums + k0);
                for (int64_t c = 0; c < cn; c++) {
                    const q4k_unpacked *uc = &u[c];
                    const __m128i A = reduce4(q4k_acc(uc, y[0][c].qs), q4k_acc(uc, y[1][c].qs), q4k_acc(uc, y[2][c].qs),
                                              q4k_acc(uc, y[3][c].qs));
                    const __m128i B = reduce4_256(q4k_bacc(uc, y[0][c].bsums), q4k_bacc(uc, y[1][c].bsums),
                                                  q4k_bacc(uc, y[2][c].bsums), q4k_bacc(uc, y[3][c].bsums));
                    const __m128 yd = _mm_setr_ps(y[0][c].d, y[1][c].d, y[2][c].d, y[3][c].d);
                    const __m128 ta = _mm_mul_ps(_mm_mul_ps(_mm_set1_ps(uc->d), yd), _mm_cvtepi32_ps(A));
                    const __m128 tb = _mm_mul_ps(_mm_mul_ps(_mm_set1_ps(uc->dmin), yd), _mm_cvtepi32_ps(B));
                    sum = _mm_add_ps(sum, _mm_sub_ps(ta, tb));
                }
                _mm_storeu_ps(sums + k0, sum);
            }
        }
        for (int32_t k = 0; k < tn; k++) out[t0 + k] = sums[k];
    }
}

/* Blocks per row that the four-row kernels unpack at once (4 rows x 8 blocks x ~550 bytes: in L1). */
#define X4N_CHUNK 8

/* Q4_K, four weight rows x many activation rows (the prompt path): a chunk of blocks of the four rows
 * is unpacked once for all the tokens (q4k_unpack), then four tokens at a time the 16 (row, token)
 * pairs accumulate in registers with vec_dot's exact integer steps. A and B of the 16 pairs are
 * reduced together (B from its first level: lanes 0-7 pair p, 8-15 pair p + 8 = row r + 2, same
 * token), and the float step of vec_dot, (d y.d) A - (dmin y.d) B added in block order, runs for the
 * 16 pairs in one vector: out[4 k + r] is bit for bit vec_dot(n, row r, act[k]). */
static void q4k_vec_dot_4xn_avx512(int64_t n, const void *w, size_t ws, const void *const *act, int32_t n_act,
                                   float *out) {
    const int64_t nb = n / QK_K;
    q4k_unpacked u[4][X4N_CHUNK];
    for (int32_t t0 = 0; t0 < n_act; t0 += QUANT_DOT_4XN_MAX) {
        const int32_t tn = n_act - t0 < QUANT_DOT_4XN_MAX ? n_act - t0 : QUANT_DOT_4XN_MAX;
        __m512 sums[QUANT_DOT_4XN_MAX / 4]; /* lane 4 r + k: row r, token k0 + k */
        for (int g = 0; g < QUANT_DOT_4XN_MAX / 4; g++) sums[g] = _mm512_setzero_ps();
        for (int64_t c0 = 0; c0 < nb; c0 += X4N_CHUNK) {
            const int64_t cn = nb - c0 < X4N_CHUNK ? nb - c0 : X4N_CHUNK;
            for (int r = 0; r < 4; r++)
                for (int64_t c = 0; c < cn; c++)
                    q4k_unpack((const block_q4_K *)((const uint8_t *)w + (size_t)r * ws) + c0 + c, &u[r][c]);
            for (int32_t k0 = 0; k0 < tn; k0 += 4) {
                const block_q8_K *y[4];
                q8k_rows4(act + t0 + k0, tn - k0, c0, y);
                __m512 sum = sums[k0 / 4];
                for (int64_t c = 0; c < cn; c++) {
                    __m512i acc[16];
                    const __m512i *wq[4] = {u[0][c].w, u[1][c].w, u[2][c].w, u[3][c].w};
                    const __m512i *sq[4] = {u[0][c].s, u[1][c].s, u[2][c].s, u[3][c].s};
                    dot16_scaled(wq, sq, y, c, acc);
                    __m512i bl[8];
                    const __m256i f[4] = {u[0][c].mpair, u[1][c].mpair, u[2][c].mpair, u[3][c].mpair};
                    bsum_pairs(f, y, c, bl);
                    const __m512 A = _mm512_cvtepi32_ps(reduce16(acc));
                    const __m512 B = _mm512_cvtepi32_ps(reduce16_from8(bl));
                    const float dd[4] = {u[0][c].d, u[1][c].d, u[2][c].d, u[3][c].d};
                    const float dm[4] = {u[0][c].dmin, u[1][c].dmin, u[2][c].dmin, u[3][c].dmin};
                    const __m512 yv = token_scales(y, c);
                    const __m512 ta = _mm512_mul_ps(_mm512_mul_ps(pairs_by_row(dd), yv), A);
                    const __m512 tb = _mm512_mul_ps(_mm512_mul_ps(pairs_by_row(dm), yv), B);
                    sum = _mm512_add_ps(sum, _mm512_sub_ps(ta, tb));
                }
                sums[k0 / 4] = sum;
            }
        }
        for (int32_t k0 = 0; k0 < tn; k0 += 4) store_pairs(out + (size_t)(t0 + k0) * 4, sums[k0 / 4], tn - k0);
    }
}

static float q5k_vec_dot_avx512(int64_t n, const void *w, const void *act) {
    const block_q5_K *x = w;
    const block_q8_K *y = act;
    const __m512i m4 = _mm512_set1_epi8(0x0F), one = _mm512_set1_epi8(1);
    float sum = 0.0f;
    for (int64_t i = 0; i < n / QK_K; i++) {
        uint8_t sc[8];
        const uint64_t m = k_scale_words(x[i].scales, sc);
        const int32_t B = k_min_sum(m, y[i].bsums);
        /* fifth bits: bit k of qh[c] belongs to value 32 k + c (sub-block k) */
        const __m512i qh = _mm512_broadcast_i64x4(load256(x[i].qh));
        __m512i acc = _mm512_setzero_si512();
        for (int p = 0; p < 2; p++) {
            const __m512i bits = _mm512_loadu_si512((const void *)(x[i].qs + 64 * p));
            /* lo holds sub-blocks 4p (low half) and 4p + 2 (high half); hi 4p + 1 and 4p + 3 */
            const __m512i sh_lo = _mm512_inserti64x4(_mm512_set1_epi64(4 * p), _mm256_set1_epi64x(4 * p + 2), 1);
            const __m512i sh_hi = _mm512_add_epi64(sh_lo, _mm512_set1_epi64(1));
            const __m512i h_lo = _mm512_and_si512(_mm512_srlv_epi64(qh, sh_lo), one);
            const __m512i h_hi = _mm512_and_si512(_mm512_srlv_epi64(qh, sh_hi), one);
            const __m512i lo = _mm512_or_si512(_mm512_and_si512(bits, m4), _mm512_slli_epi16(h_lo, 4));
            const __m512i hi =
                _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(bits, 4), m4), _mm512_slli_epi16(h_hi, 4));
            acc = k_step(acc, lo, hi, y[i].qs, sc, p);
        }
        const int32_t A = _mm512_reduce_add_epi32(acc);
        sum += (quant_f16_lut[x[i].d] * y[i].d) * (float)A - (quant_f16_lut[x[i].dmin] * y[i].d) * (float)B;
    }
    return sum;
}

/* ---- Q6_K --------------------------------------------------------------------------------------- */

static float q6k_vec_dot_avx512(int64_t n, const void *w, const void *act) {
    const block_q6_K *x = w;
    const block_q8_K *y = act;
    const __m512i m4 = _mm512_set1_epi8(0x0F), m2 = _mm512_set1_epi8(3);
    /* int16 lane l of the scale vector for 64 values starting at group j0 takes scale j0 + l / 8 */
    const __m512i idx = _mm512_set_epi16(3, 3, 3, 3, 3, 3, 3, 3, 2, 2, 2, 2, 2, 2, 2, 2, 1, 1, 1, 1, 1, 1, 1, 1, 0, 0,
                                         0, 0, 0, 0, 0, 0);
    float sum = 0.0f;
    for (int64_t i = 0; i < n / QK_K; i++) {
        const __m256i sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)x[i].scales));
        /* C = sum_j sc_j * bsum_j: the part of A removed by the offset -32 */
        const __m256i c = _mm256_madd_epi16(sc16, _mm256_loadu_si256((const __m256i *)y[i].bsums));
        const __m512i scv = _mm512_castsi256_si512(sc16);
        const int8_t *q8 = y[i].qs;
        __m512i acc = _mm512_setzero_si512();
        for (int g = 0; g < 2; g++) {
            const __m512i l = _mm512_loadu_si512((const void *)(x[i].ql + 64 * g)); /* values 128g + [0,64) low */
            const __m512i h = _mm512_broadcast_i64x4(load256(x[i].qh + 32 * g));
            /* values 128g + 32k + c take bits 2k of qh[32g + c]: k = 0, 1 in the first vector, 2, 3 in the second */
            const __m512i s01 = _mm512_inserti64x4(_mm512_set1_epi64(0), _mm256_set1_epi64x(2), 1);
            const __m512i s23 = _mm512_inserti64x4(_mm512_set1_epi64(4), _mm256_set1_epi64x(6), 1);
            const __m512i q01 = _mm512_or_si512(_mm512_and_si512(l, m4),
                                                _mm512_slli_epi16(_mm512_and_si512(_mm512_srlv_epi64(h, s01), m2), 4));
            const __m512i q23 = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(l, 4), m4),
                                                _mm512_slli_epi16(_mm512_and_si512(_mm512_srlv_epi64(h, s23), m2), 4));
            const __m512i sc01 =
                _mm512_permutexvar_epi16(_mm512_add_epi16(idx, _mm512_set1_epi16((short)(8 * g))), scv);
            const __m512i sc23 =
                _mm512_permutexvar_epi16(_mm512_add_epi16(idx, _mm512_set1_epi16((short)(8 * g + 4))), scv);
            acc = _mm512_dpwssd_epi32(acc, _mm512_maddubs_epi16(q01, _mm512_loadu_si512((const void *)(q8 + 128 * g))),
                                      sc01);
            acc = _mm512_dpwssd_epi32(
                acc, _mm512_maddubs_epi16(q23, _mm512_loadu_si512((const void *)(q8 + 128 * g + 64))), sc23);
        }
        __m128i cs = _mm_add_epi32(_mm256_castsi256_si128(c), _mm256_extracti128_si256(c, 1));
        cs = _mm_add_epi32(cs, _mm_shuffle_epi32(cs, _MM_SHUFFLE(1, 0, 3, 2)));
        cs = _mm_add_epi32(cs, _mm_shuffle_epi32(cs, _MM_SHUFFLE(2, 3, 0, 1)));
        const int32_t A = _mm512_reduce_add_epi32(acc) - 32 * _mm_cvtsi128_si32(cs);
        sum += (quant_f16_lut[x[i].d] * y[i].d) * (float)A;
    }
    return sum;
}

/* Unpacked Q6_K block: values 64q .. 64q + 63 (biased by 32, 0..63) and their int16 scale lanes. */
typedef struct {
    __m512i q[4], s[4];
    __m256i sc16; /* the 16 scales as int16 */
    float d;
} q6k_unpacked;

static inline void q6k_unpack(const block_q6_K *b, q6k_unpacked *u) {
    const __m512i m4 = _mm512_set1_epi8(0x0F), m2 = _mm512_set1_epi8(3);
    const __m512i idx = _mm512_set_epi16(3, 3, 3, 3, 3, 3, 3, 3, 2, 2, 2, 2, 2, 2, 2, 2, 1, 1, 1, 1, 1, 1, 1, 1, 0, 0,
                                         0, 0, 0, 0, 0, 0);
    const __m512i s01 = _mm512_inserti64x4(_mm512_set1_epi64(0), _mm256_set1_epi64x(2), 1);
    const __m512i s23 = _mm512_inserti64x4(_mm512_set1_epi64(4), _mm256_set1_epi64x(6), 1);
    u->sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)b->scales));
    const __m512i scv = _mm512_castsi256_si512(u->sc16);
    for (int g = 0; g < 2; g++) {
        const __m512i l = _mm512_loadu_si512((const void *)(b->ql + 64 * g));
        const __m512i h = _mm512_broadcast_i64x4(load256(b->qh + 32 * g));
        u->q[2 * g] = _mm512_or_si512(_mm512_and_si512(l, m4),
                                      _mm512_slli_epi16(_mm512_and_si512(_mm512_srlv_epi64(h, s01), m2), 4));
        u->q[2 * g + 1] = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(l, 4), m4),
                                          _mm512_slli_epi16(_mm512_and_si512(_mm512_srlv_epi64(h, s23), m2), 4));
        u->s[2 * g] = _mm512_permutexvar_epi16(_mm512_add_epi16(idx, _mm512_set1_epi16((short)(8 * g))), scv);
        u->s[2 * g + 1] = _mm512_permutexvar_epi16(_mm512_add_epi16(idx, _mm512_set1_epi16((short)(8 * g + 4))), scv);
    }
    u->d = quant_f16_lut[b->d];
}

static inline __m512i q6k_acc(const q6k_unpacked *u, const int8_t *q8) {
    __m512i acc = _mm512_setzero_si512();
    for (int q = 0; q < 4; q++)
        acc = _mm512_dpwssd_epi32(acc, _mm512_maddubs_epi16(u->q[q], _mm512_loadu_si512((const void *)(q8 + 64 * q))),
                                  u->s[q]);
    return acc;
}

/* Q6_K, four weight rows against one activation row (decode), as q4k_vec_dot_x4_avx512. */
static void q6k_vec_dot_x4_avx512(int64_t n, const void *w, size_t w_stride, const void *act, float out[4]) {
    const block_q8_K *y = act;
    __m128 sum = _mm_setzero_ps();
    for (int64_t i = 0; i < n / QK_K; i++) {
        __m512i a[4];
        for (int q = 0; q < 4; q++) a[q] = _mm512_loadu_si512((const void *)(y[i].qs + 64 * q));
        const __m256i bs = _mm256_loadu_si256((const __m256i *)y[i].bsums);
        __m512i acc[4];
        __m256i cc[4];
        float dd[4];
        for (int r = 0; r < 4; r++) {
            const block_q6_K *b = (const block_q6_K *)((const uint8_t *)w + (size_t)r * w_stride) + i;
            prefetch_block((const uint8_t *)b + QUANT_PREFETCH_ROWS * w_stride, (int)sizeof *b);
            q6k_unpacked u;
            q6k_unpack(b, &u);
            acc[r] = _mm512_setzero_si512();
            for (int q = 0; q < 4; q++)
                acc[r] = _mm512_dpwssd_epi32(acc[r], _mm512_maddubs_epi16(u.q[q], a[q]), u.s[q]);
            cc[r] = _mm256_madd_epi16(u.sc16, bs);
            dd[r] = u.d;
        }
        const __m128i C = reduce4_256(cc[0], cc[1], cc[2], cc[3]);
        const __m128i A = _mm_sub_epi32(reduce4(acc[0], acc[1], acc[2], acc[3]), _mm_slli_epi32(C, 5));
        sum = _mm_add_ps(sum, _mm_mul_ps(_mm_mul_ps(_mm_loadu_ps(dd), _mm_set1_ps(y[i].d)), _mm_cvtepi32_ps(A)));
    }
    _mm_storeu_ps(out, sum);
}

/* Q6_K against several activation rows (see q4k_vec_dot_n_avx512): A = acc - 32 sum_j sc_j bsum_j. */
static void q6k_vec_dot_n_avx512(int64_t n, const void *w, const void *const *act, int32_t n_act, float *out) {
    const block_q6_K *x = w;
    const int64_t nb = n / QK_K;
    for (int32_t t0 = 0; t0 < n_act; t0 += QUANT_DOT_N_MAX) {
        const int32_t tn = n_act - t0 < QUANT_DOT_N_MAX ? n_act - t0 : QUANT_DOT_N_MAX;
        float sums[QUANT_DOT_N_MAX + 3] = {0};
        for (int64_t c0 = 0; c0 < nb; c0 += XN_CHUNK) {
            const int64_t cn = nb - c0 < XN_CHUNK ? nb - c0 : XN_CHUNK;
            q6k_unpacked u[XN_CHUNK];
            for (int64_t c = 0; c < cn; c++) q6k_unpack(&x[c0 + c], &u[c]);
            for (int32_t k0 = 0; k0 < tn; k0 += 4) {
                const block_q8_K *y[4];
                q8k_rows4(act + t0 + k0, tn - k0, c0, y);
                __m128 sum = _mm_loadu_ps(sums + k0);
                for (int64_t c = 0; c < cn; c++) {
                    const q6k_unpacked *uc = &u[c];
                    __m256i cc[4];
                    for (int k = 0; k < 4; k++)
                        cc[k] = _mm256_madd_epi16(uc->sc16, _mm256_loadu_si256((const __m256i *)y[k][c].bsums));
                    const __m128i C = reduce4_256(cc[0], cc[1], cc[2], cc[3]);
                    const __m128i A = _mm_sub_epi32(reduce4(q6k_acc(uc, y[0][c].qs), q6k_acc(uc, y[1][c].qs),
                                                            q6k_acc(uc, y[2][c].qs), q6k_acc(uc, y[3][c].qs)),
                                                    _mm_slli_epi32(C, 5));
                    const __m128 yd = _mm_setr_ps(y[0][c].d, y[1][c].d, y[2][c].d, y[3][c].d);
                    sum = _mm_add_ps(sum, _mm_mul_ps(_mm_mul_ps(_mm_set1_ps(uc->d), yd), _mm_cvtepi32_ps(A)));
                }
                _mm_storeu_ps(sums + k0, sum);
            }
        }
        for (int32_t k = 0; k < tn; k++) out[t0 + k] = sums[k];
    }
}

/* Q6_K, four weight rows x many activation rows: as q4k_vec_dot_4xn_avx512, with A = acc - 32 C,
 * C = sum_j sc_j bsum_j reduced for the 16 pairs together, and vec_dot's (d y.d) A per block. */
static void q6k_vec_dot_4xn_avx512(int64_t n, const void *w, size_t ws, const void *const *act, int32_t n_act,
                                   float *out) {
    const int64_t nb = n / QK_K;
    q6k_unpacked u[4][X4N_CHUNK];
    for (int32_t t0 = 0; t0 < n_act; t0 += QUANT_DOT_4XN_MAX) {
        const int32_t tn = n_act - t0 < QUANT_DOT_4XN_MAX ? n_act - t0 : QUANT_DOT_4XN_MAX;
        __m512 sums[QUANT_DOT_4XN_MAX / 4];
        for (int g = 0; g < QUANT_DOT_4XN_MAX / 4; g++) sums[g] = _mm512_setzero_ps();
        for (int64_t c0 = 0; c0 < nb; c0 += X4N_CHUNK) {
            const int64_t cn = nb - c0 < X4N_CHUNK ? nb - c0 : X4N_CHUNK;
            for (int r = 0; r < 4; r++)
                for (int64_t c = 0; c < cn; c++)
                    q6k_unpack((const block_q6_K *)((const uint8_t *)w + (size_t)r * ws) + c0 + c, &u[r][c]);
            for (int32_t k0 = 0; k0 < tn; k0 += 4) {
                const block_q8_K *y[4];
                q8k_rows4(act + t0 + k0, tn - k0, c0, y);
                __m512 sum = sums[k0 / 4];
                for (int64_t c = 0; c < cn; c++) {
                    __m512i acc[16];
                    const __m512i *wq[4] = {u[0][c].q, u[1][c].q, u[2][c].q, u[3][c].q};
                    const __m512i *sq[4] = {u[0][c].s, u[1][c].s, u[2][c].s, u[3][c].s};
                    dot16_scaled(wq, sq, y, c, acc);
                    __m512i cl[8];
                    const __m256i f[4] = {u[0][c].sc16, u[1][c].sc16, u[2][c].sc16, u[3][c].sc16};
                    bsum_pairs(f, y, c, cl);
                    const __m512i Ai = _mm512_sub_epi32(reduce16(acc), _mm512_slli_epi32(reduce16_from8(cl), 5));
                    const float dd[4] = {u[0][c].d, u[1][c].d, u[2][c].d, u[3][c].d};
                    const __m512 yv = token_scales(y, c);
                    const __m512 t = _mm512_mul_ps(_mm512_mul_ps(pairs_by_row(dd), yv), _mm512_cvtepi32_ps(Ai));
                    sum = _mm512_add_ps(sum, t);
                }
                sums[k0 / 4] = sum;
            }
        }
        for (int32_t k0 = 0; k0 < tn; k0 += 4) store_pairs(out + (size_t)(t0 + k0) * 4, sums[k0 / 4], tn - k0);
    }
}

/* ---- Q2_K and Q3_K ------------------------------------------------------------------------------ */

/* Both have 16 sub-blocks of 16 values with one scale each and 2-bit low parts laid out alike, so they
 * share one unpacked form: values 64q .. 64q + 63 as unsigned bytes and their int16 scale lanes.
 * Q2_K's values are 0..3 and its B = sum_j m_j bsum_j. Q3_K's value lo - 4 (1 - hbit) is stored
 * biased by 4, as lo | hbit << 2 (0..7, an unsigned maddubs operand), and the bias comes back from
 * C = sum_j sc_j bsum_j: A = acc - 4 C, the scalar kernel's integer exactly (as Q6_K's -32).
 * maddubs pairs stay below 2 * 7 * 127, so nothing saturates. */
typedef struct {
    __m512i q[4], s[4];
    __m256i c16; /* int16: Q2_K the 16 mins, Q3_K the 16 scales */
    float d, dmin;
} k16_unpacked;

/* s[q] int16 lane l = scale 4q + l / 8 (lane l holds the pair of values 2l, 2l + 1 of the 64) */
static inline void k16_scale_lanes(__m256i sc16, __m512i s[4]) {
    const __m512i idx = _mm512_set_epi16(3, 3, 3, 3, 3, 3, 3, 3, 2, 2, 2, 2, 2, 2, 2, 2, 1, 1, 1, 1, 1, 1, 1, 1, 0, 0,
                                         0, 0, 0, 0, 0, 0);
    const __m512i scv = _mm512_castsi256_si512(sc16);
    for (int q = 0; q < 4; q++)
        s[q] = _mm512_permutexvar_epi16(_mm512_add_epi16(idx, _mm512_set1_epi16((short)(4 * q))), scv);
}

/* Values 128 g + 32 k + c are bits 2k of qs[32 g + c]: the 32 bytes broadcast to both halves and
 * shifted by [2k | 2k + 2] per 64-bit lane give the 64 values of k = 0, 1 (q = 2g) or 2, 3 (q = 2g + 1);
 * bits shifted in from the next byte land above the 2-bit mask. */
static inline void k16_low_bits(const uint8_t *qs, __m512i lo[4]) {
    const __m512i m2 = _mm512_set1_epi8(3);
    const __m512i s01 = _mm512_inserti64x4(_mm512_set1_epi64(0), _mm256_set1_epi64x(2), 1);
    const __m512i s23 = _mm512_inserti64x4(_mm512_set1_epi64(4), _mm256_set1_epi64x(6), 1);
    for (int g = 0; g < 2; g++) {
        const __m512i h = _mm512_broadcast_i64x4(load256(qs + 32 * g));
        lo[2 * g] = _mm512_and_si512(_mm512_srlv_epi64(h, s01), m2);
        lo[2 * g + 1] = _mm512_and_si512(_mm512_srlv_epi64(h, s23), m2);
    }
}

static inline void q2k_unpack(const block_q2_K *b, k16_unpacked *u) {
    k16_low_bits(b->qs, u->q);
    const __m128i sb = _mm_loadu_si128((const __m128i *)b->scales), m4 = _mm_set1_epi8(0x0F);
    k16_scale_lanes(_mm256_cvtepu8_epi16(_mm_and_si128(sb, m4)), u->s);
    u->c16 = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(sb, 4), m4));
    u->d = quant_f16_lut[b->d];
    u->dmin = quant_f16_lut[b->dmin];
}

static inline void q3k_unpack(const block_q3_K *b, k16_unpacked *u) {
    /* the 16 scales: low 4 bits from the nibbles of bytes 0..7, high 2 bits from bytes 8..11
     * (scale 4k + b: bits 2k of byte 8 + b), minus 32 */
    uint64_t l8;
    uint32_t h4;
    memcpy(&l8, b->scales, 8);
    memcpy(&h4, b->scales + 8, 4);
    const __m128i lv = _mm_cvtsi64_si128((long long)l8), m4 = _mm_set1_epi8(0x0F);
    const __m128i lo4 = _mm_unpacklo_epi64(_mm_and_si128(lv, m4), _mm_and_si128(_mm_srli_epi16(lv, 4), m4));
    const __m128i hi2 =
        _mm_and_si128(_mm_srlv_epi32(_mm_set1_epi32((int)h4), _mm_setr_epi32(0, 2, 4, 6)), _mm_set1_epi8(3));
    const __m128i sc8 = _mm_sub_epi8(_mm_or_si128(lo4, _mm_slli_epi16(hi2, 4)), _mm_set1_epi8(32));
    u->c16 = _mm256_cvtepi8_epi16(sc8);
    k16_scale_lanes(u->c16, u->s);
    __m512i lo[4];
    k16_low_bits(b->qs, lo);
    /* value 32 k' + c takes bit k' of hmask[c]: vector q holds k' = 2q (low half) and 2q + 1 */
    const __m512i hm = _mm512_broadcast_i64x4(load256(b->hmask)), one = _mm512_set1_epi8(1);
    for (int q = 0; q < 4; q++) {
        const __m512i sh = _mm512_inserti64x4(_mm512_set1_epi64(2 * q), _mm256_set1_epi64x(2 * q + 1), 1);
        const __m512i hb = _mm512_and_si512(_mm512_srlv_epi64(hm, sh), one);
        u->q[q] = _mm512_or_si512(lo[q], _mm512_slli_epi16(hb, 2));
    }
    u->d = quant_f16_lut[b->d];
    u->dmin = 0.0f;
}

/* q2 is a constant at every call: the kernels below are written once and compiled per type */
static inline __attribute__((always_inline)) void k16_unpack(const uint8_t *w, int64_t i, k16_unpacked *u,
                                                             const int q2) {
    if (q2)
        q2k_unpack((const block_q2_K *)w + i, u);
    else
        q3k_unpack((const block_q3_K *)w + i, u);
}

static inline __m512i k16_acc(const k16_unpacked *u, const int8_t *q8) {
    __m512i acc = _mm512_setzero_si512();
    for (int q = 0; q < 4; q++)
        acc = _mm512_dpwssd_epi32(acc, _mm512_maddubs_epi16(u->q[q], _mm512_loadu_si512((const void *)(q8 + 64 * q))),
                                  u->s[q]);
    return acc;
}

static inline int32_t hsum256_i32(__m256i v) {
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, _MM_SHUFFLE(1, 0, 3, 2)));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, _MM_SHUFFLE(2, 3, 0, 1)));
    return _mm_cvtsi128_si32(s);
}

static inline __attribute__((always_inline)) float k16_vec_dot(int64_t n, const void *w, const void *act,
                                                               const int q2) {
    const block_q8_K *y = act;
    float sum = 0.0f;
    for (int64_t i = 0; i < n / QK_K; i++) {
        k16_unpacked u;
        k16_unpack(w, i, &u, q2);
        const int32_t acc = _mm512_reduce_add_epi32(k16_acc(&u, y[i].qs));
        const int32_t c = hsum256_i32(_mm256_madd_epi16(u.c16, _mm256_loadu_si256((const __m256i *)y[i].bsums)));
        if (q2)
            sum += (u.d * y[i].d) * (float)acc - (u.dmin * y[i].d) * (float)c;
        else
            sum += (u.d * y[i].d) * (float)(acc - 4 * c);
    }
    return sum;
}

/* Four weight rows against one activation row (decode), as q4k_vec_dot_x4_avx512: out[r] is bit for
 * bit vec_dot of row r. */
static inline __attribute__((always_inline)) void k16_vec_dot_x4(int64_t n, const void *w, size_t w_stride,
                                                                 const void *act, float out[4], const int q2) {
    const block_q8_K *y = act;
    const int bsz = q2 ? (int)sizeof(block_q2_K) : (int)sizeof(block_q3_K);
    __m128 sum = _mm_setzero_ps();
    for (int64_t i = 0; i < n / QK_K; i++) {
        __m512i a[4];
        for (int q = 0; q < 4; q++) a[q] = _mm512_loadu_si512((const void *)(y[i].qs + 64 * q));
        const __m256i bs = _mm256_loadu_si256((const __m256i *)y[i].bsums);
        __m512i acc[4];
        __m256i cc[4];
        float dd[4], dm[4];
        for (int r = 0; r < 4; r++) {
            const uint8_t *row = (const uint8_t *)w + (size_t)r * w_stride;
            prefetch_block(row + QUANT_PREFETCH_ROWS * w_stride + i * bsz, bsz);
            k16_unpacked u;
            k16_unpack(row, i, &u, q2);
            acc[r] = _mm512_setzero_si512();
            for (int q = 0; q < 4; q++)
                acc[r] = _mm512_dpwssd_epi32(acc[r], _mm512_maddubs_epi16(u.q[q], a[q]), u.s[q]);
            cc[r] = _mm256_madd_epi16(u.c16, bs);
            dd[r] = u.d;
            dm[r] = u.dmin;
        }
        const __m128i A = reduce4(acc[0], acc[1], acc[2], acc[3]);
        const __m128i C = reduce4_256(cc[0], cc[1], cc[2], cc[3]);
        const __m128 yd = _mm_set1_ps(y[i].d);
        if (q2) {
            const __m128 ta = _mm_mul_ps(_mm_mul_ps(_mm_loadu_ps(dd), yd), _mm_cvtepi32_ps(A));
            const __m128 tb = _mm_mul_ps(_mm_mul_ps(_mm_loadu_ps(dm), yd), _mm_cvtepi32_ps(C));
            sum = _mm_add_ps(sum, _mm_sub_ps(ta, tb));
        } else {
            const __m128i Ai = _mm_sub_epi32(A, _mm_slli_epi32(C, 2));
            sum = _mm_add_ps(sum, _mm_mul_ps(_mm_mul_ps(_mm_loadu_ps(dd), yd), _mm_cvtepi32_ps(Ai)));
        }
    }
    _mm_storeu_ps(out, sum);
}

/* Against several activation rows (see q4k_vec_dot_n_avx512): a chunk of blocks unpacked once, four
 * rows' integer sums reduced together, each row's float sum over the blocks in vec_dot's order. */
static inline __attribute__((always_inline)) void k16_vec_dot_n(int64_t n, const void *w, const void *const *act,
                                                                int32_t n_act, float *out, const int q2) {
    const int64_t nb = n / QK_K;
    for (int32_t t0 = 0; t0 < n_act; t0 += QUANT_DOT_N_MAX) {
        const int32_t tn = n_act - t0 < QUANT_DOT_N_MAX ? n_act - t0 : QUANT_DOT_N_MAX;
        float sums[QUANT_DOT_N_MAX + 3] = {0};
        for (int64_t c0 = 0; c0 < nb; c0 += XN_CHUNK) {
            const int64_t cn = nb - c0 < XN_CHUNK ? nb - c0 : XN_CHUNK;
            k16_unpacked u[XN_CHUNK];
            for (int64_t c = 0; c < cn; c++) k16_unpack(w, c0 + c, &u[c], q2);
            for (int32_t k0 = 0; k0 < tn; k0 += 4) {
                const block_q8_K *y[4];
                q8k_rows4(act + t0 + k0, tn - k0, c0, y);
                __m128 sum = _mm_loadu_ps(sums + k0);
                for (int64_t c = 0; c < cn; c++) {
                    const k16_unpacked *uc = &u[c];
                    __m256i cc[4];
                    for (int k = 0; k < 4; k++)
                        cc[k] = _mm256_madd_epi16(uc->c16, _mm256_loadu_si256((const __m256i *)y[k][c].bsums));
                    const __m128i C = reduce4_256(cc[0], cc[1], cc[2], cc[3]);
                    const __m128i A = reduce4(k16_acc(uc, y[0][c].qs), k16_acc(uc, y[1][c].qs), k16_acc(uc, y[2][c].qs),
                                              k16_acc(uc, y[3][c].qs));
                    const __m128 yd = _mm_setr_ps(y[0][c].d, y[1][c].d, y[2][c].d, y[3][c].d);
                    if (q2) {
                        const __m128 ta = _mm_mul_ps(_mm_mul_ps(_mm_set1_ps(uc->d), yd), _mm_cvtepi32_ps(A));
                        const __m128 tb = _mm_mul_ps(_mm_mul_ps(_mm_set1_ps(uc->dmin), yd), _mm_cvtepi32_ps(C));
                        sum = _mm_add_ps(sum, _mm_sub_ps(ta, tb));
                    } else {
                        const __m128i Ai = _mm_sub_epi32(A, _mm_slli_epi32(C, 2));
                        sum = _mm_add_ps(sum, _mm_mul_ps(_mm_mul_ps(_mm_set1_ps(uc->d), yd), _mm_cvtepi32_ps(Ai)));
                    }
                }
                _mm_storeu_ps(sums + k0, sum);
            }
        }
        for (int32_t k = 0; k < tn; k++) out[t0 + k] = sums[k];
    }
}

/* Four weight rows x many activation rows (the prompt path), as q6k_vec_dot_4xn_avx512: out[4 k + r]
 * is bit for bit vec_dot(n, row r, act[k]). */
static inline __attribute__((always_inline)) void
k16_vec_dot_4xn(int64_t n, const void *w, size_t ws, const void *const *act, int32_t n_act, float *out, const int q2) {
    const int64_t nb = n / QK_K;
    k16_unpacked u[4][X4N_CHUNK];
    for (int32_t t0 = 0; t0 < n_act; t0 += QUANT_DOT_4XN_MAX) {
        const int32_t tn = n_act - t0 < QUANT_DOT_4XN_MAX ? n_act - t0 : QUANT_DOT_4XN_MAX;
        __m512 sums[QUANT_DOT_4XN_MAX / 4]; /* lane 4 r + k: row r, token k0 + k */
        for (int g = 0; g < QUANT_DOT_4XN_MAX / 4; g++) sums[g] = _mm512_setzero_ps();
        for (int64_t c0 = 0; c0 < nb; c0 += X4N_CHUNK) {
            const int64_t cn = nb - c0 < X4N_CHUNK ? nb - c0 : X4N_CHUNK;
            for (int r = 0; r < 4; r++)
                for (int64_t c = 0; c < cn; c++) k16_unpack((const uint8_t *)w + (size_t)r * ws, c0 + c, &u[r][c], q2);
            for (int32_t k0 = 0; k0 < tn; k0 += 4) {
                const block_q8_K *y[4];
                q8k_rows4(act + t0 + k0, tn - k0, c0, y);
                __m512 sum = sums[k0 / 4];
                for (int64_t c = 0; c < cn; c++) {
                    __m512i acc[16];
                    const __m512i *wq[4] = {u[0][c].q, u[1][c].q, u[2][c].q, u[3][c].q};
                    const __m512i *sq[4] = {u[0][c].s, u[1][c].s, u[2][c].s, u[3][c].s};
                    dot16_scaled(wq, sq, y, c, acc);
                    __m512i cl[8];
                    const __m256i f[4] = {u[0][c].c16, u[1][c].c16, u[2][c].c16, u[3][c].c16};
                    bsum_pairs(f, y, c, cl);
                    const __m512i A = reduce16(acc), C = reduce16_from8(cl);
                    const float dd[4] = {u[0][c].d, u[1][c].d, u[2][c].d, u[3][c].d};
                    const __m512 yv = token_scales(y, c);
                    if (q2) {
                        const float dm[4] = {u[0][c].dmin, u[1][c].dmin, u[2][c].dmin, u[3][c].dmin};
                        const __m512 ta = _mm512_mul_ps(_mm512_mul_ps(pairs_by_row(dd), yv), _mm512_cvtepi32_ps(A));
                        const __m512 tb = _mm512_mul_ps(_mm512_mul_ps(pairs_by_row(dm), yv), _mm512_cvtepi32_ps(C));
                        sum = _mm512_add_ps(sum, _mm512_sub_ps(ta, tb));
                    } else {
                        const __m512i Ai = _mm512_sub_epi32(A, _mm512_slli_epi32(C, 2));
                        sum = _mm512_add_ps(sum,
                                            _mm512_mul_ps(_mm512_mul_ps(pairs_by_row(dd), yv), _mm512_cvtepi32_ps(Ai)));
                    }
                }
                sums[k0 / 4] = sum;
            }
        }
        for (int32_t k0 = 0; k0 < tn; k0 += 4) store_pairs(out + (size_t)(t0 + k0) * 4, sums[k0 / 4], tn - k0);
    }
}

static float q2k_vec_dot_avx512(int64_t n, const void *w, const void *act) { return k16_vec_dot(n, w, act, 1); }
static float q3k_vec_dot_avx512(int64_t n, const void *w, const void *act) { return k16_vec_dot(n, w, act, 0); }
static void q2k_vec_dot_x4_avx512(int64_t n, const void *w, size_t ws, const void *act, float out[4]) {
    k16_vec_dot_x4(n, w, ws, act, out, 1);
}
static void q3k_vec_dot_x4_avx512(int64_t n, const void *w, size_t ws, const void *act, float out[4]) {
    k16_vec_dot_x4(n, w, ws, act, out, 0);
}
static void q2k_vec_dot_n_avx512(int64_t n, const void *w, const void *const *act, int32_t n_act, float *out) {
    k16_vec_dot_n(n, w, act, n_act, out, 1);
}
static void q3k_vec_dot_n_avx512(int64_t n, const void *w, const void *const *act, int32_t n_act, float *out) {
    k16_vec_dot_n(n, w, act, n_act, out, 0);
}
static void q2k_vec_dot_4xn_avx512(int64_t n, const void *w, size_t ws, const void *const *act, int32_t n_act,
                                   float *out) {
    k16_vec_dot_4xn(n, w, ws, act, n_act, out, 1);
}
static void q3k_vec_dot_4xn_avx512(int64_t n, const void *w, size_t ws, const void *const *act, int32_t n_act,
                                   float *out) {
    k16_vec_dot_4xn(n, w, ws, act, n_act, out, 0);
}

/* ---- Q8_K activations --------------------------------------------------------------------------- */

/* The scalar q8k_quantize_act's operations on 16 lanes: the same IEEE multiplies and adds (the
 * magic-number round), the same max, so the same bytes. */
static void q8k_quantize_act_avx512(const float *x, void *dst, int64_t n) {
    const __m512 magic = _mm512_set1_ps(12582912.0f), lim = _mm512_set1_ps(127.0f), nlim = _mm512_set1_ps(-127.0f);
    block_q8_K *b = dst;
    for (int64_t i = 0; i < n / QK_K; i++, x += QK_K) {
        __m512 mx = _mm512_setzero_ps();
        __mmask16 nan = 0;
        for (int j = 0; j < QK_K; j += 16) {
            const __m512 v = _mm512_loadu_ps(x + j);
            mx = _mm512_max_ps(mx, _mm512_abs_ps(v));
            nan |= _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
        }
        const float amax = _mm512_reduce_max_ps(mx);
        if (nan || !(amax <= 3.4028235e38f)) { /* NaN or inf inputs: the scalar kernel's path */
            quant_q8k_quantize_act_scalar(x, &b[i], QK_K);
            continue;
        }
        if (amax == 0.0f) {
            memset(&b[i], 0, sizeof b[i]);
            continue;
        }
        const __m512 id = _mm512_set1_ps(127.0f / amax);
        b[i].d = amax / 127.0f;
        for (int j = 0; j < QK_K; j += 16) {
            __m512 v = _mm512_sub_ps(_mm512_add_ps(_mm512_mul_ps(_mm512_loadu_ps(x + j), id), magic), magic);
            /* a block whose largest value is below 127 / FLT_MAX has an infinite id: 0 x inf is NaN,
             * which the scalar kernel turns into 0 (max_ps would have made it -127) */
            v = _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(v, v, _CMP_ORD_Q), v);
            v = _mm512_min_ps(_mm512_max_ps(v, nlim), lim);
            const __m512i q = _mm512_cvttps_epi32(v);
            _mm_storeu_si128((__m128i *)(b[i].qs + j), _mm512_cvtepi32_epi8(q));
            const __m256i q16 = _mm512_cvtepi32_epi16(q);
            /* bsums[j / 16]: the 16 values of this step */
            __m128i s = _mm_add_epi16(_mm256_castsi256_si128(q16), _mm256_extracti128_si256(q16, 1));
            s = _mm_add_epi16(s, _mm_shuffle_epi32(s, _MM_SHUFFLE(1, 0, 3, 2)));
            s = _mm_add_epi16(s, _mm_shuffle_epi32(s, _MM_SHUFFLE(2, 3, 0, 1)));
            s = _mm_add_epi16(s, _mm_srli_epi32(s, 16));
            b[i].bsums[j / 16] = (int16_t)_mm_cvtsi128_si32(s);
        }
    }
}

void quant_k_avx512(quant_traits t[]) {
    t[STRATA_TYPE_Q8_K].quantize_act = q8k_quantize_act_avx512;
    t[STRATA_TYPE_Q4_K].vec_dot = q4k_vec_dot_avx512;
    t[STRATA_TYPE_Q5_K].vec_dot = q5k_vec_dot_avx512;
    t[STRATA_TYPE_Q6_K].vec_dot = q6k_vec_dot_avx512;
    quant_set_xn(t, STRATA_TYPE_Q4_K, q4k_vec_dot_n_avx512);
    quant_set_x4(t, STRATA_TYPE_Q4_K, q4k_vec_dot_x4_avx512);
    quant_set_xn(t, STRATA_TYPE_Q6_K, q6k_vec_dot_n_avx512);
    quant_set_x4(t, STRATA_TYPE_Q6_K, q6k_vec_dot_x4_avx512);
    quant_set_4xn(t, STRATA_TYPE_Q4_K, q4k_vec_dot_4xn_avx512);
    quant_set_4xn(t, STRATA_TYPE_Q6_K, q6k_vec_dot_4xn_avx512);
    t[STRATA_TYPE_Q2_K].vec_dot = q2k_vec_dot_avx512;
    t[STRATA_TYPE_Q3_K].vec_dot = q3k_vec_dot_avx512;
    quant_set_x4(t, STRATA_TYPE_Q2_K, q2k_vec_dot_x4_avx512);
    quant_set_x4(t, STRATA_TYPE_Q3_K, q3k_vec_dot_x4_avx512);
    quant_set_xn(t, STRATA_TYPE_Q2_K, q2k_vec_dot_n_avx512);
    quant_set_xn(t, STRATA_TYPE_Q3_K, q3k_vec_dot_n_avx512);
    quant_set_4xn(t, STRATA_TYPE_Q2_K, q2k_vec_dot_4xn_avx512);
    quant_set_4xn(t, STRATA_TYPE_Q3_K, q3k_vec_dot_4xn_avx512);
}
