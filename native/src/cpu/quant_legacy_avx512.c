/*
 * quant_legacy_avx512.c — AVX-512 (VNNI) kernels of the 32-value block types: the many-token kernels of
 * Q8_0 weights (the prompt path), and all the kernels of Q4_0, Q4_1, Q5_0, Q5_1 and IQ4_NL.
 *
 * Q8_0's one-row kernel is the base family's (cpu/quant_avx512.c, q8_0_rows_avx512). This kernel
 * runs exactly its operations for every activation row — the same pairs of blocks in 512-bit halves,
 * the same fused multiply-adds into the same lanes, the same tail block and final tree — only with
 * each weight block loaded and sign-split once for four rows. So out[k] is bit for bit
 * vec_dot(n, w, act[k]); tests/test_quants.py checks that matmul equals matvec for Q8_0 too.
 *
 * Then the one-row, four-row and prompt (four rows x many tokens) kernels of Q4_0, Q4_1, Q5_0, Q5_1
 * and IQ4_NL (IQ4_NL's family, quant_iq_avx512.c, registers its three), on the reduction order of
 * quant_blocks.h: bit for bit the scalar kernels' results.
 */
#include <immintrin.h>
#include <string.h>

#include "common.h"
#include "iq_tables.h"
#include "quant_blocks.h"
#include "quant_reduce16.h"
#include "strata.h"

static inline float f16_at(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, 2);
    return quant_f16_lut[h];
}

static void q8_0_vec_dot_n_avx512(int64_t n, const void *w, const void *const *act, int32_t n_act, float *out) {
    const uint8_t *a = w;
    const int64_t nb = n / 32;
    for (int32_t k0 = 0; k0 < n_act; k0 += 4) {
        const int32_t kn = n_act - k0 < 4 ? n_act - k0 : 4;
        const uint8_t *b[4];
        for (int k = 0; k < 4; k++) b[k] = act[k0 + (k < kn ? k : 0)];
        __m512 acc2[4];
        for (int k = 0; k < 4; k++) acc2[k] = _mm512_setzero_ps();
        int64_t i = 0;
        for (; i + 2 <= nb; i += 2) {
            const uint8_t *ai = a + i * 34;
            const __m512i qa = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)(ai + 2))),
                                                  _mm256_loadu_si256((const __m256i *)(ai + 36)), 1);
            const __m512i ua = _mm512_abs_epi8(qa);
            const __mmask64 neg = _mm512_movepi8_mask(qa);
            const float da0 = f16_at(ai), da1 = f16_at(ai + 34);
            for (int k = 0; k < 4; k++) {
                const uint8_t *bb = b[k] + i * 34;
                const __m512i qb =
                    _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)(bb + 2))),
                                       _mm256_loadu_si256((const __m256i *)(bb + 36)), 1);
                const __m512i sb = _mm512_mask_sub_epi8(qb, neg, _mm512_setzero_si512(), qb);
                const __m512i p = _mm512_dpbusd_epi32(_mm512_setzero_si512(), ua, sb);
                const __m512 d =
                    _mm512_insertf32x8(_mm512_set1_ps(da0 * f16_at(bb)), _mm256_set1_ps(da1 * f16_at(bb + 34)), 1);
                acc2[k] = _mm512_fmadd_ps(d, _mm512_cvtepi32_ps(p), acc2[k]);
            }
        }
        for (int k = 0; k < kn; k++) {
            const uint8_t *ai = a + i * 34, *bb = b[k] + i * 34;
            __m256 acc = _mm256_add_ps(_mm512_castps512_ps256(acc2[k]), _mm512_extractf32x8_ps(acc2[k], 1));
            if (i < nb) {
                const __m256i qa = _mm256_loadu_si256((const __m256i *)(ai + 2));
                const __m256i qb = _mm256_loadu_si256((const __m256i *)(bb + 2));
                const __m256i p =
                    _mm256_dpbusd_epi32(_mm256_setzero_si256(), _mm256_sign_epi8(qa, qa), _mm256_sign_epi8(qb, qa));
                acc = _mm256_fmadd_ps(_mm256_set1_ps(f16_at(ai) * f16_at(bb)), _mm256_cvtepi32_ps(p), acc);
            }
            __m128 lo = _mm256_castps256_ps128(acc), hi = _mm256_extractf128_ps(acc, 1);
            lo = _mm_add_ps(lo, hi);
            lo = _mm_add_ps(lo, _mm_movehl_ps(lo, lo));
            lo = _mm_add_ss(lo, _mm_movehdup_ps(lo));
            out[k0 + k] = _mm_cvtss_f32(lo);
        }
    }
}

/* [lo x 8 | hi x 8]: the per-lane scale of a pair of blocks */
static inline __m512 pair_scale(float lo, float hi) {
    return _mm512_insertf32x8(_mm512_set1_ps(lo), _mm256_set1_ps(hi), 1);
}

static inline __m512i load_pair(const uint8_t *blk) {
    return _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)(blk + 2))),
                              _mm256_loadu_si256((const __m256i *)(blk + 36)), 1);
}

/* Q8_0, four weight rows x up to four activation rows per pass, 16 accumulators in registers.
 * The integer lanes are vec_dot's (each int32 lane the exact sum of four products) but made with one
 * dpbusd per row and token: the activation goes in unsigned (b + 128, once per token and block) and
 * the accumulator starts at -128 x (the weights' four-value sums, once per row and block), so
 * dpbusd(-128 sum a, b + 128, a) = sum a b exactly. Then per lane the same scale product
 * (da * db), conversion and fused multiply-add as q8_0_rows_avx512, the same odd tail block and
 * final tree: out[4 k + r] is bit for bit vec_dot(n, row r, act[k]). */
static void q8_0_vec_dot_4xn_avx512(int64_t n, const void *w, size_t ws, const void *const *act, int32_t n_act,
                                    float *out) {
    const uint8_t *a = w;
    const int64_t nb = n / 32;
    const __m512i x80 = _mm512_set1_epi8((char)0x80);
    for (int32_t k0 = 0; k0 < n_act; k0 += 4) {
        const int32_t kn = n_act - k0 < 4 ? n_act - k0 : 4;
        const uint8_t *b[4];
        for (int k = 0; k < 4; k++) b[k] = act[k0 + (k < kn ? k : 0)];
        __m512 acc[4][4];
        for (int r = 0; r < 4; r++)
            for (int k = 0; k < 4; k++) acc[r][k] = _mm512_setzero_ps();
        int64_t i = 0;
        for (; i + 2 <= nb; i += 2) {
            __m512i bu[4];
            __m512 db[4];
            for (int k = 0; k < 4; k++) {
                const uint8_t *bb = b[k] + i * 34;
                bu[k] = _mm512_xor_si512(load_pair(bb), x80);
                db[k] = pair_scale(f16_at(bb), f16_at(bb + 34));
            }
            for (int r = 0; r < 4; r++) {
                const uint8_t *ai = a + (size_t)r * ws + i * 34;
                const __m512i qa = load_pair(ai);
                const __m512i zero = _mm512_setzero_si512();
                const __m512i corr = _mm512_sub_epi32(zero, _mm512_dpbusd_epi32(zero, x80, qa));
                const __m512 da = pair_scale(f16_at(ai), f16_at(ai + 34));
                for (int k = 0; k < 4; k++) {
                    const __m512i p = _mm512_dpbusd_epi32(corr, bu[k], qa);
                    acc[r][k] = _mm512_fmadd_ps(_mm512_mul_ps(da, db[k]), _mm512_cvtepi32_ps(p), acc[r][k]);
                }
            }
        }
        for (int r = 0; r < 4; r++) {
            for (int k = 0; k < kn; k++) {
                const uint8_t *ai = a + (size_t)r * ws + i * 34, *bb = b[k] + i * 34;
                __m256 s = _mm256_add_ps(_mm512_castps512_ps256(acc[r][k]), _mm512_extractf32x8_ps(acc[r][k], 1));
                if (i < nb) {
                    const __m256i qa = _mm256_loadu_si256((const __m256i *)(ai + 2));
                    const __m256i qb = _mm256_loadu_si256((const __m256i *)(bb + 2));
                    const __m256i p =
                        _mm256_dpbusd_epi32(_mm256_setzero_si256(), _mm256_sign_epi8(qa, qa), _mm256_sign_epi8(qb, qa));
                    s = _mm256_fmadd_ps(_mm256_set1_ps(f16_at(ai) * f16_at(bb)), _mm256_cvtepi32_ps(p), s);
                }
                __m128 lo = _mm256_castps256_ps128(s), hi = _mm256_extractf128_ps(s, 1);
                lo = _mm_add_ps(lo, hi);
                lo = _mm_add_ps(lo, _mm_movehl_ps(lo, lo));
                lo = _mm_add_ss(lo, _mm_movehdup_ps(lo));
                out[(size_t)(k0 + k) * 4 + r] = _mm_cvtss_f32(lo);
            }
        }
    }
}

/* ---- Q4_0, Q4_1, Q5_0, Q5_1, IQ4_NL: one and four weight rows against one activation row ---------
 *
 * The scalar kernel adds block i's float contribution to lane i mod 8 of eight sums, in block order.
 * Here sixteen blocks go at once: vector p (p < 8) holds block p in its low 256 bits and block p + 8
 * in its high ones, so that after the lane sums (reduce16_from8) lane k holds block k's exact integer
 * sum. The sixteen contributions are then made with the scalar kernel's float expression, lane by
 * lane, and added to the eight sums as two steps: blocks 0-7 first, then blocks 8-15 - the scalar
 * kernel's order. Leftover blocks (n / 32 mod 16) go one at a time in the scalar way.
 *
 * Integers: dpbusd multiplies unsigned weight bytes by the signed activation bytes and sums four
 * products per int32 lane exactly. The weights go in as their unsigned indices u (0..31, or the
 * IQ4_NL table value + 128 <= 241); the symmetric types' offset (8, 16, 128) comes back as
 * off * sum(a), which is made once per activation block (for all four rows) and put in the
 * accumulator's start: dpbusd(-off sum a, u, a) = sum (u - off) a, the scalar kernel's integer. The
 * affine types use sum(a) itself for their minimum. */

enum { L_Q4_0, L_Q4_1, L_Q5_0, L_Q5_1, L_IQ4NL };

#define ALWAYS_INLINE static inline __attribute__((always_inline))

ALWAYS_INLINE int l_bytes(int kind) {
    return kind == L_Q4_0 || kind == L_IQ4NL ? 18 : kind == L_Q4_1 ? 20 : kind == L_Q5_0 ? 22 : 24;
}
ALWAYS_INLINE int l_qs(int kind) {
    return kind == L_Q4_0 || kind == L_IQ4NL ? 2 : kind == L_Q4_1 ? 4 : kind == L_Q5_0 ? 6 : 8;
}
ALWAYS_INLINE int l_qh(int kind) { return kind == L_Q5_0 ? 2 : 4; }
ALWAYS_INLINE int l_affine(int kind) { return kind == L_Q4_1 || kind == L_Q5_1; }
ALWAYS_INLINE int l_off(int kind) { return kind == L_Q4_0 ? 8 : kind == L_Q5_0 ? 16 : 128; }

/* The unsigned indices of blocks b0 (low 256 bits) and b1 (high), value j at byte j of its half:
 * each half's 16 bytes twice, the second copy shifted down a nibble (values 16..31). */
ALWAYS_INLINE __m512i l_unpack(int kind, const uint8_t *b0, const uint8_t *b1, __m512i lut) {
    const __m512i z = _mm512_inserti64x4(
        _mm512_castsi256_si512(_mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)(b0 + l_qs(kind))))),
        _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)(b1 + l_qs(kind)))), 1);
    __m512i u =
        _mm512_and_si512(_mm512_srlv_epi64(z, _mm512_setr_epi64(0, 0, 4, 4, 0, 0, 4, 4)), _mm512_set1_epi8(0x0F));
    if (kind == L_Q5_0 || kind == L_Q5_1) { /* bit j of qh is value j's fifth bit: a byte mask as it is */
        uint32_t h0, h1;
        memcpy(&h0, b0 + l_qh(kind), 4);
        memcpy(&h1, b1 + l_qh(kind), 4);
        u = _mm512_mask_add_epi8(u, (__mmask64)h0 | ((__mmask64)h1 << 32), u, _mm512_set1_epi8(0x10));
    }
    if (kind == L_IQ4NL) u = _mm512_shuffle_epi8(lut, u);
    return u;
}

/* The activation bytes of blocks b0 (low) and b1 (high). */
ALWAYS_INLINE __m512i l_act_pair(const uint8_t *b0, const uint8_t *b1) {
    return _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)(b0 + 2))),
                              _mm256_loadu_si256((const __m256i *)(b1 + 2)), 1);
}

/* The f16 at byte offset `off` of sixteen consecutive blocks (idx_bytes: their offsets plus off), as
 * floats. One gather of 4 bytes per block (it stays inside the block: off + 4 <= its bytes), then the
 * hardware conversion, which is exact and equals quant_f16_lut for every non-NaN half (a NaN stays a
 * NaN; its payload is not part of the contract). */
ALWAYS_INLINE __m512 l_f16x16(const uint8_t *base, __m512i idx_bytes) {
    return _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_i32gather_epi32(idx_bytes, (const void *)base, 1)));
}

/* Lane sum of the low 256 bits (one block) of an int32 vector. */
ALWAYS_INLINE int32_t l_lo_sum(__m512i v) { return _mm512_reduce_add_epi32(_mm512_maskz_mov_epi32(0x00FF, v)); }

/* Blocks i0 .. nb - 1 (fewer than sixteen) of rows r < nr one at a time, in the scalar kernel's way:
 * the block's exact integer sums, then its float expression added to lane (block mod 8). */
ALWAYS_INLINE void l_tail(int kind, int64_t i0, int64_t nb, const uint8_t *w, size_t ws, const uint8_t *y,
                          float lanes[][8], int nr, __m512i lut) {
    const int bytes = l_bytes(kind);
    const __m512i offv = _mm512_set1_epi8((char)l_off(kind)), ones = _mm512_set1_epi8(1);
    for (int64_t i = i0; i < nb; i++) {
        const uint8_t *yb = y + i * 34;
        const __m512i a = l_act_pair(yb, yb);
        uint16_t hy;
        memcpy(&hy, yb, 2);
        const float da = quant_f16_lut[hy];
        const __m512i c = l_affine(kind) ? _mm512_setzero_si512()
                                         : _mm512_sub_epi32(_mm512_setzero_si512(),
                                                            _mm512_dpbusd_epi32(_mm512_setzero_si512(), offv, a));
        const int32_t sas = l_affine(kind) ? l_lo_sum(_mm512_dpbusd_epi32(_mm512_setzero_si512(), ones, a)) : 0;
        for (int r = 0; r < nr; r++) {
            const uint8_t *xb = w + (size_t)r * ws + i * bytes;
            const int32_t s = l_lo_sum(_mm512_dpbusd_epi32(c, l_unpack(kind, xb, xb, lut), a));
            uint16_t hd, hm;
            memcpy(&hd, xb, 2);
            memcpy(&hm, xb + 2, 2);
            if (l_affine(kind))
                lanes[r][i & 7] += (quant_f16_lut[hd] * da) * (float)s + (quant_f16_lut[hm] * da) * (float)sas;
            else
                lanes[r][i & 7] += (quant_f16_lut[hd] * da) * (float)s;
        }
    }
}

/* The activation side of a group of sixteen blocks at yb (blocks p and p + 8 in pair p): the pairs a,
 * the integer start c of each pair's sums (minus the offset times the block sums for the symmetric
 * types, 0 for the affine ones), and for the affine types the block sums as floats (lane per block). */
ALWAYS_INLINE __m512 l_act_group(int kind, const uint8_t *yb, __m512i a[8], __m512i c[8]) {
    const __m512i zero = _mm512_setzero_si512();
    for (int p = 0; p < 8; p++) {
        a[p] = l_act_pair(yb + p * 34, yb + (p + 8) * 34);
        c[p] = l_affine(kind)
                   ? zero
                   : _mm512_sub_epi32(zero, _mm512_dpbusd_epi32(zero, _mm512_set1_epi8((char)l_off(kind)), a[p]));
    }
    if (!l_affine(kind)) return _mm512_setzero_ps();
    __m512i s[8];
    for (int p = 0; p < 8; p++) s[p] = _mm512_dpbusd_epi32(zero, _mm512_set1_epi8(1), a[p]);
    return _mm512_cvtepi32_ps(reduce16_from8(s));
}

/* acc + the group's float step (lane per block): (dw dy) s, plus (mw dy) sa for the affine types, the
 * 16 lanes folded onto 8 (blocks p and p + 8 in one lane sum, as vec_dot adds them). */
ALWAYS_INLINE __m256 l_add_group(int kind, __m256 acc, __m512 wd, __m512 wm, __m512 yd, __m512 s, __m512 sa) {
    __m512 t = _mm512_mul_ps(_mm512_mul_ps(wd, yd), s);
    if (l_affine(kind)) t = _mm512_add_ps(t, _mm512_mul_ps(_mm512_mul_ps(wm, yd), sa));
    acc = _mm256_add_ps(acc, _mm512_castps512_ps256(t));
    return _mm256_add_ps(acc, _mm512_extractf32x8_ps(t, 1));
}

/* out[r] = vec_dot(n, w + r * ws, act) for r < nr (nr = 1 or 4, a constant after inlining). */
ALWAYS_INLINE void l_rows(int kind, int64_t n, const uint8_t *w, size_t ws, const uint8_t *y, float *out, int nr) {
    const int bytes = l_bytes(kind);
    const int64_t nb = n / QK4_0;
    /* IQ4_NL's table + 128 (wrapping byte add: the values are -127..113) */
    const __m512i lut =
        _mm512_broadcast_i32x4(_mm_add_epi8(_mm_loadu_si128((const __m128i *)iq4nl_values), _mm_set1_epi8((char)0x80)));
    const __m512i iota = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    const __m512i wi_d = _mm512_mullo_epi32(iota, _mm512_set1_epi32(bytes));
    const __m512i wi_m = _mm512_add_epi32(wi_d, _mm512_set1_epi32(2));
    const __m512i yi_d = _mm512_mullo_epi32(iota, _mm512_set1_epi32(34));
    __m256 acc[4];
    for (int r = 0; r < nr; r++) acc[r] = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 16 <= nb; i += 16) {
        const uint8_t *yb = y + i * 34;
        __m512i a[8], c[8];
        const __m512 sa = l_act_group(kind, yb, a, c);
        const __m512 yd = l_f16x16(yb, yi_d);
        for (int r = 0; r < nr; r++) {
            const uint8_t *xb = w + (size_t)r * ws + i * bytes;
            if (nr > 1) prefetch_block(xb + QUANT_PREFETCH_ROWS * ws, 16 * bytes);
            __m512i v[8];
            for (int p = 0; p < 8; p++)
                v[p] = _mm512_dpbusd_epi32(c[p], l_unpack(kind, xb + p * bytes, xb + (p + 8) * bytes, lut), a[p]);
            const __m512 s = _mm512_cvtepi32_ps(reduce16_from8(v));
            const __m512 wm = l_affine(kind) ? l_f16x16(xb, wi_m) : _mm512_setzero_ps();
            acc[r] = l_add_group(kind, acc[r], l_f16x16(xb, wi_d), wm, yd, s, sa);
        }
    }
    float lanes[4][8];
    for (int r = 0; r < nr; r++) _mm256_storeu_ps(lanes[r], acc[r]);
    l_tail(kind, i, nb, w, ws, y, lanes, nr, lut);
    for (int r = 0; r < nr; r++) out[r] = quant_sum8(lanes[r]);
}

/* Four rows x many activation rows (the prompt path): a group of sixteen blocks of the four rows is
 * unpacked once (32 vectors of indices and the rows' scales) for all the tokens of the tile; per
 * token the activation pairs and their offset sums are made once for the four rows. Every lane then
 * sees exactly l_rows's operations in l_rows's order (the 256-bit lane sums of a (row, token) pair
 * wait in memory between groups), so out[4 k + r] is bit for bit vec_dot(n, row r, act[k]). */
ALWAYS_INLINE void l_4xn(int kind, int64_t n, const uint8_t *w, size_t ws, const void *const *act, int32_t n_act,
                         float *out) {
    const int bytes = l_bytes(kind);
    const int64_t nb = n / QK4_0;
    const __m512i lut =
        _mm512_broadcast_i32x4(_mm_add_epi8(_mm_loadu_si128((const __m128i *)iq4nl_values), _mm_set1_epi8((char)0x80)));
    const __m512i iota = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    const __m512i wi_d = _mm512_mullo_epi32(iota, _mm512_set1_epi32(bytes));
    const __m512i wi_m = _mm512_add_epi32(wi_d, _mm512_set1_epi32(2));
    const __m512i yi_d = _mm512_mullo_epi32(iota, _mm512_set1_epi32(34));
    __m256 acc[QUANT_DOT_4XN_MAX][4]; /* [token][row]: lane sums */
    __m512i u[4][8];                  /* [row][pair]: indices of blocks p and p + 8 of the group */
    __m512 wd[4], wm[4];
    for (int32_t t0 = 0; t0 < n_act; t0 += QUANT_DOT_4XN_MAX) {
        const int32_t tn = n_act - t0 < QUANT_DOT_4XN_MAX ? n_act - t0 : QUANT_DOT_4XN_MAX;
        for (int32_t k = 0; k < tn; k++)
            for (int r = 0; r < 4; r++) acc[k][r] = _mm256_setzero_ps();
        int64_t i = 0;
        for (; i + 16 <= nb; i += 16) {
            for (int r = 0; r < 4; r++) {
                const uint8_t *xb = w + (size_t)r * ws + i * bytes;
                for (int p = 0; p < 8; p++) u[r][p] = l_unpack(kind, xb + p * bytes, xb + (p + 8) * bytes, lut);
                wd[r] = l_f16x16(xb, wi_d);
                wm[r] = l_affine(kind) ? l_f16x16(xb, wi_m) : _mm512_setzero_ps();
            }
            for (int32_t k = 0; k < tn; k++) {
                const uint8_t *yb = (const uint8_t *)act[t0 + k] + i * 34;
                __m512i a[8], c[8];
                const __m512 sa = l_act_group(kind, yb, a, c);
                const __m512 yd = l_f16x16(yb, yi_d);
                for (int r = 0; r < 4; r++) {
                    __m512i v[8];
                    for (int p = 0; p < 8; p++) v[p] = _mm512_dpbusd_epi32(c[p], u[r][p], a[p]);
                    const __m512 s = _mm512_cvtepi32_ps(reduce16_from8(v));
                    acc[k][r] = l_add_group(kind, acc[k][r], wd[r], wm[r], yd, s, sa);
                }
            }
        }
        for (int32_t k = 0; k < tn; k++) {
            float lanes[4][8];
            for (int r = 0; r < 4; r++) _mm256_storeu_ps(lanes[r], acc[k][r]);
            l_tail(kind, i, nb, w, ws, act[t0 + k], lanes, 4, lut);
            for (int r = 0; r < 4; r++) out[(size_t)(t0 + k) * 4 + r] = quant_sum8(lanes[r]);
        }
    }
}

#define L_KERNELS(name, kind)                                                                                          \
    static float name##_vec_dot_avx512(int64_t n, const void *w, const void *act) {                                    \
        float out;                                                                                                     \
        l_rows(kind, n, w, 0, act, &out, 1);                                                                           \
        return out;                                                                                                    \
    }                                                                                                                  \
    static void name##_vec_dot_x4_avx512(int64_t n, const void *w, size_t ws, const void *act, float out[4]) {         \
        l_rows(kind, n, w, ws, act, out, 4);                                                                           \
    }                                                                                                                  \
    static void name##_vec_dot_4xn_avx512(int64_t n, const void *w, size_t ws, const void *const *act, int32_t n_act,  \
                                          float *out) {                                                                \
        l_4xn(kind, n, w, ws, act, n_act, out);                                                                        \
    }

L_KERNELS(q4_0, L_Q4_0)
L_KERNELS(q4_1, L_Q4_1)
L_KERNELS(q5_0, L_Q5_0)
L_KERNELS(q5_1, L_Q5_1)

/* IQ4_NL's family (quant_iq_avx512.c) registers these; declared in quant_blocks.h. */
float quant_iq4nl_vec_dot_avx512(int64_t n, const void *w, const void *act) {
    float out;
    l_rows(L_IQ4NL, n, w, 0, act, &out, 1);
    return out;
}
void quant_iq4nl_vec_dot_x4_avx512(int64_t n, const void *w, size_t ws, const void *act, float out[4]) {
    l_rows(L_IQ4NL, n, w, ws, act, out, 4);
}
void quant_iq4nl_vec_dot_4xn_avx512(int64_t n, const void *w, size_t ws, const void *const *act, int32_t n_act,
                                    float *out) {
    l_4xn(L_IQ4NL, n, w, ws, act, n_act, out);
}

void quant_legacy_avx512(quant_traits t[]) {
    quant_set_xn(t, STRATA_TYPE_Q8_0, q8_0_vec_dot_n_avx512);
    quant_set_4xn(t, STRATA_TYPE_Q8_0, q8_0_vec_dot_4xn_avx512);
    t[STRATA_TYPE_Q4_0].vec_dot = q4_0_vec_dot_avx512;
    quant_set_x4(t, STRATA_TYPE_Q4_0, q4_0_vec_dot_x4_avx512);
    quant_set_4xn(t, STRATA_TYPE_Q4_0, q4_0_vec_dot_4xn_avx512);
    t[STRATA_TYPE_Q4_1].vec_dot = q4_1_vec_dot_avx512;
    quant_set_x4(t, STRATA_TYPE_Q4_1, q4_1_vec_dot_x4_avx512);
    quant_set_4xn(t, STRATA_TYPE_Q4_1, q4_1_vec_dot_4xn_avx512);
    t[STRATA_TYPE_Q5_0].vec_dot = q5_0_vec_dot_avx512;
    quant_set_x4(t, STRATA_TYPE_Q5_0, q5_0_vec_dot_x4_avx512);
    quant_set_4xn(t, STRATA_TYPE_Q5_0, q5_0_vec_dot_4xn_avx512);
    t[STRATA_TYPE_Q5_1].vec_dot = q5_1_vec_dot_avx512;
    quant_set_x4(t, STRATA_TYPE_Q5_1, q5_1_vec_dot_x4_avx512);
    quant_set_4xn(t, STRATA_TYPE_Q5_1, q5_1_vec_dot_4xn_avx512);
}
