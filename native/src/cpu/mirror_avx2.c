/*
 * mirror_avx2.c — the host mirror of the CUDA decode product (cuda_mirror.h) with AVX2.
 *
 * The same scheme as mirror_avx512.c with four ymm of 8 lanes: each lane's rounded float operations
 * are the scalar mirror's, element by element.
 *   Q8_0, Q4_0: lane l's exact integer dot of its 8 values (maddubs on |w| and sign(x, w), or on the
 *     nibbles with the offset 8 taken out afterwards; madd; the lane's two 4-value sums added), then
 *     a = a + (dw * dx) * isum.
 *   Q4_K, Q6_K: the super-block's weight bytes transposed (byte shuffles and word unpacks) so that a
 *     vector holds byte v of every lane's 8; a = a + w_v * x_v for v = 0..7 in order.
 * Then the warp's butterfly as the same tree of additions.
 */
#include <immintrin.h>
#include <stdint.h>
#include <string.h>

#include "../cuda_mirror.h"
#include "../group_dequant.h"
#include "mirror_q4k.h"

/* The butterfly's result for lanes 0..7, 8..15, 16..23, 24..31 in a0..a3. */
static inline float reduce32(__m256 a0, __m256 a1, __m256 a2, __m256 a3) {
    const __m256 s8 = _mm256_add_ps(_mm256_add_ps(a0, a2), _mm256_add_ps(a1, a3));
    const __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps(s8, 1));
    const __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
    return _mm_cvtss_f32(_mm_add_ss(s2, _mm_movehdup_ps(s2)));
}

/* Lanes 4g .. 4g + 7 from the 4-value sums of blocks g (r0) and g + 1 (r1), each 8 dwords in value
 * order: hadd pairs them per 128-bit half (lanes 0, 1, 4, 5 | 2, 3, 6, 7), the permute restores order. */
static inline __m256i lane_sums(__m256i r0, __m256i r1) {
    return _mm256_permute4x64_epi64(_mm256_hadd_epi32(r0, r1), 0xD8);
}

static void rows_int8(const mirror_x *px, const uint8_t *w, int64_t rows, float *y) {
    const int64_t G = px->cols / 32, S = G / 8;
    const int q4 = px->type == STRATA_TYPE_Q4_0;
    const int64_t bb = q4 ? 18 : 34, rb = G * bb;
    int32_t off_[8];
    for (int g = 0; g < 8; g++) off_[g] = (int32_t)(g * bb);
    const __m256i offs = _mm256_loadu_si256((const __m256i *)off_);
    const __m256i ones = _mm256_set1_epi16(1), m4 = _mm256_set1_epi8(0x0F);
    /* the low 16 bits of each gathered dword, to the low 8 bytes of each half */
    const __m256i h16 = _mm256_setr_epi8(0, 1, 4, 5, 8, 9, 12, 13, -1, -1, -1, -1, -1, -1, -1, -1, 0, 1, 4, 5, 8, 9,
                                         12, 13, -1, -1, -1, -1, -1, -1, -1, -1);
    __m256i rep[4];
    for (int k = 0; k < 4; k++)
        rep[k] = _mm256_setr_epi32(2 * k, 2 * k, 2 * k, 2 * k, 2 * k + 1, 2 * k + 1, 2 * k + 1, 2 * k + 1);
    for (int64_t r = 0; r < rows; r++) {
        const uint8_t *row = w + r * rb;
        __m256 a[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
        for (int64_t t = 0; t < S; t++) {
            const uint8_t *b = row + t * 8 * bb;
            const int8_t *xq = px->qp + t * 256;
            __m256i rr[8];
            for (int g = 0; g < 8; g++) {
                const __m256i xv = _mm256_loadu_si256((const __m256i *)(xq + 32 * g));
                __m256i p;
                if (!q4) {
                    const __m256i wv = _mm256_loadu_si256((const __m256i *)(b + g * 34 + 2));
                    /* |w| * (x * sign w): pairs at most 2 * 128 * 127, inside int16 */
                    p = _mm256_maddubs_epi16(_mm256_abs_epi8(wv), _mm256_sign_epi8(xv, wv));
                    rr[g] = _mm256_madd_epi16(p, ones);
                } else {
                    const __m128i q = _mm_loadu_si128((const __m128i *)(b + g * 18 + 2));
                    const __m256i u = _mm256_and_si256(
                        _mm256_inserti128_si256(_mm256_castsi128_si256(q), _mm_srli_epi16(q, 4), 1), m4);
                    /* nibbles 0..15 times x, minus 8 * sum(x) per 4 values (corr) */
                    p = _mm256_maddubs_epi16(u, xv);
                    rr[g] = _mm256_add_epi32(_mm256_madd_epi16(p, ones),
                                             _mm256_loadu_si256((const __m256i *)(px->corr + t * 64 + 8 * g)));
                }
            }
            __m256i h = _mm256_i32gather_epi32((const int *)(const void *)b, offs, 1);
            h = _mm256_permute4x64_epi64(_mm256_shuffle_epi8(h, h16), 0x08);
            const __m256 dw = _mm256_cvtph_ps(_mm256_castsi256_si128(h));
            for (int k = 0; k < 4; k++) {
                const __m256 d = _mm256_permutevar8x32_ps(dw, rep[k]);
                const __m256 x = _mm256_loadu_ps(px->dl + t * 32 + 8 * k);
                const __m256 is = _mm256_cvtepi32_ps(lane_sums(rr[2 * k], rr[2 * k + 1]));
                /* a = a + (dw * dx) * isum, each operation rounded, as on the device */
                a[k] = _mm256_add_ps(a[k], _mm256_mul_ps(_mm256_mul_ps(d, x), is));
            }
        }
        if (8 * S < G) {
            float acc[32];
            for (int k = 0; k < 4; k++) _mm256_storeu_ps(acc + 8 * k, a[k]);
            y[r] = mirror_finish_row(px, row, 8 * S, acc);
        } else {
            y[r] = reduce32(a[0], a[1], a[2], a[3]);
        }
    }
}

/* 128 bytes = 16 pieces of 8 values (piece p at 8p) -> out[v] (v = 0..7): byte v of the pieces, their
 * pairs in the order 0, 2, 4, 6, 1, 3, 5, 7 (cuda_mirror.c's piece_of). y[m] holds bytes 32m .. 32m+31. */
static inline void transpose16x8(const __m256i y[4], __m256i sh, __m128i out[8]) {
    const __m256i y0 = _mm256_shuffle_epi8(y[0], sh), y1 = _mm256_shuffle_epi8(y[1], sh);
    const __m256i y2 = _mm256_shuffle_epi8(y[2], sh), y3 = _mm256_shuffle_epi8(y[3], sh);
    const __m256i p0 = _mm256_unpacklo_epi16(y0, y1), p1 = _mm256_unpackhi_epi16(y0, y1);
    const __m256i p2 = _mm256_unpacklo_epi16(y2, y3), p3 = _mm256_unpackhi_epi16(y2, y3);
    const __m256i q[4] = {_mm256_unpacklo_epi32(p0, p2), _mm256_unpackhi_epi32(p0, p2), _mm256_unpacklo_epi32(p1, p3),
                          _mm256_unpackhi_epi32(p1, p3)};
    for (int k = 0; k < 4; k++) {
        const __m256i s = _mm256_permute4x64_epi64(q[k], 0xD8);
        out[2 * k] = _mm256_castsi256_si128(s);
        out[2 * k + 1] = _mm256_extracti128_si256(s, 1);
    }
}

static void rows_kquant(const mirror_x *px, const uint8_t *w, int64_t rows, float *y) {
    const int64_t S = px->cols / 256;
    const int q6 = px->type == STRATA_TYPE_Q6_K;
    const int64_t bb = q6 ? 210 : 144, rb = S * bb;
    const __m256i sh = _mm256_setr_epi8(0, 8, 1, 9, 2, 10, 3, 11, 4, 12, 5, 13, 6, 14, 7, 15, 0, 8, 1, 9, 2, 10, 3, 11,
                                        4, 12, 5, 13, 6, 14, 7, 15);
    const __m128i m4 = _mm_set1_epi8(0x0F), m2 = _mm_set1_epi8(3), c32 = _mm_set1_epi8(32);
    /* rows r of pieces in byte p of a per-value vector (pieces 2c, 2c + 1 of chunk c are row c / 2):
     * the odd rows take Q6_K's fields 1 and 3 of the qh byte */
    int8_t odd_[16];
    for (int p = 0; p < 16; p++) {
        static const int pair[8] = {0, 2, 4, 6, 1, 3, 5, 7};
        odd_[p] = (int8_t)((pair[p >> 1] >> 1) & 1 ? -1 : 0);
    }
    const __m128i odd = _mm_loadu_si128((const __m128i *)odd_);
    __m256i si[4], si7[4];
    __m256 shi[4];
    for (int k = 0; k < 4; k++) {
        si[k] = _mm256_loadu_si256((const __m256i *)(px->sidx + 8 * k));
        si7[k] = _mm256_and_si256(si[k], _mm256_set1_epi32(7));
        shi[k] = _mm256_castsi256_ps(_mm256_cmpgt_epi32(si[k], _mm256_set1_epi32(7)));
    }
    for (int64_t r = 0; r < rows; r++) {
        const uint8_t *row = w + r * rb;
        __m256 a[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
        for (int64_t t = 0; t < S; t++) {
            const uint8_t *b = row + t * bb;
            const float *xt = px->xt + t * 256;
            __m256 ds[4], dm[4];
            __m128i qv[8], hv[8];
            if (!q6) {
                __m256 s8, m8;
                mirror_q4k_scales(b, &s8, &m8);
                for (int k = 0; k < 4; k++) {
                    ds[k] = _mm256_permutevar8x32_ps(s8, si[k]);
                    dm[k] = _mm256_permutevar8x32_ps(m8, si[k]);
                }
                const __m256i yq[4] = {_mm256_loadu_si256((const __m256i *)(b + 16)),
                                       _mm256_loadu_si256((const __m256i *)(b + 48)),
                                       _mm256_loadu_si256((const __m256i *)(b + 80)),
                                       _mm256_loadu_si256((const __m256i *)(b + 112))};
                transpose16x8(yq, sh, qv);
            } else {
                const __m256 d = _mm256_set1_ps(gq_f16(b + 208));
                const __m256 slo = _mm256_mul_ps(
                    d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(b + 192)))));
                const __m256 shv = _mm256_mul_ps(
                    d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(b + 200)))));
                for (int k = 0; k < 4; k++)
                    ds[k] = _mm256_blendv_ps(_mm256_permutevar8x32_ps(slo, si7[k]), _mm256_permutevar8x32_ps(shv, si7[k]),
                                             shi[k]);
                const __m256i yl[4] = {_mm256_loadu_si256((const __m256i *)(b + 0)),
                                       _mm256_loadu_si256((const __m256i *)(b + 32)),
                                       _mm256_loadu_si256((const __m256i *)(b + 64)),
                                       _mm256_loadu_si256((const __m256i *)(b + 96))};
                transpose16x8(yl, sh, qv);
                /* qh rows 0, 0, 1, 1: ql row r takes its high bits from qh row r / 2 */
                const __m256i h0 = _mm256_loadu_si256((const __m256i *)(b + 128));
                const __m256i h1 = _mm256_loadu_si256((const __m256i *)(b + 160));
                const __m256i yh[4] = {h0, h0, h1, h1};
                transpose16x8(yh, sh, hv);
            }
            for (int v = 0; v < 8; v++) {
                __m128i lo = _mm_and_si128(qv[v], m4), hi = _mm_and_si128(_mm_srli_epi16(qv[v], 4), m4);
                if (q6) {
                    /* field r % 2 (low nibble) or 2 + r % 2 (high) of the qh byte; the mask keeps each
                     * byte's own bits after the 16-bit shifts */
                    const __m128i qh = hv[v];
                    const __m128i fl = _mm_blendv_epi8(qh, _mm_srli_epi16(qh, 2), odd);
                    const __m128i fh = _mm_blendv_epi8(_mm_srli_epi16(qh, 4), _mm_srli_epi16(qh, 6), odd);
                    lo = _mm_sub_epi8(_mm_or_si128(lo, _mm_slli_epi16(_mm_and_si128(fl, m2), 4)), c32);
                    hi = _mm_sub_epi8(_mm_or_si128(hi, _mm_slli_epi16(_mm_and_si128(fh, m2), 4)), c32);
                }
                const __m128i part[4] = {lo, _mm_srli_si128(lo, 8), hi, _mm_srli_si128(hi, 8)};
                for (int k = 0; k < 4; k++) {
                    __m256 wv;
                    if (!q6)
                        wv = _mm256_sub_ps(_mm256_mul_ps(ds[k], _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(part[k]))), dm[k]);
                    else
                        wv = _mm256_mul_ps(ds[k], _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(part[k])));
                    a[k] = _mm256_add_ps(a[k], _mm256_mul_ps(wv, _mm256_loadu_ps(xt + 32 * v + 8 * k)));
                }
            }
        }
        float el[32], acc[32];
        for (int k = 0; k < 4; k++) _mm256_storeu_ps(el + 8 * k, a[k]);
        for (int e = 0; e < 32; e++) acc[px->lane_of[e]] = el[e];
        y[r] = mirror_finish_row(px, row, px->cols / 32, acc);
    }
}

/* F32, F16, BF16 (and the types of GQ_NEW_TYPES, dequantized by gq_dequant8: px->deq): a step's 256 weights
 * are widened to floats in value order (exact conversions), then
 * gathered per value index v from that buffer: element l of vector v is lane l's value v. */
static void rows_float(const mirror_x *px, const uint8_t *w, int64_t rows, float *y) {
    const int64_t G = px->cols / 32, S = G / 8, rb = gq_row_bytes(px->type, px->cols);
    const int64_t es = px->type == STRATA_TYPE_F32 ? 4 : 2;
    const __m256i idx = _mm256_setr_epi32(0, 8, 16, 24, 32, 40, 48, 56);
    float buf[256] __attribute__((aligned(32)));
    for (int64_t r = 0; r < rows; r++) {
        const uint8_t *row = w + r * rb;
        __m256 a[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
        for (int64_t t = 0; t < S; t++) {
            if (px->deq) { /* the other types: gq_dequant8's values, the scalar kernel's */
                for (int gg = 0; gg < 8; gg++)
                    for (int sl = 0; sl < 4; sl++) gq_dequant8(px->type, row, 8 * t + gg, sl, buf + 32 * gg + 8 * sl);
            } else {
                const uint8_t *src = row + t * 256 * es;
                for (int k = 0; k < 32; k++) {
                    __m256 v;
                    if (px->type == STRATA_TYPE_F32)
                        v = _mm256_loadu_ps((const float *)(const void *)(src + 32 * k));
                    else if (px->type == STRATA_TYPE_F16)
                        v = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(src + 16 * k)));
                    else
                        v = _mm256_castsi256_ps(
                            _mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(src + 16 * k))), 16));
                    _mm256_store_ps(buf + 8 * k, v);
                }
            }
            const float *xt = px->xt + t * 256;
            for (int v = 0; v < 8; v++)
                for (int k = 0; k < 4; k++) {
                    const __m256 wv = _mm256_i32gather_ps(buf + 64 * k + v, idx, 4);
                    a[k] = _mm256_add_ps(a[k], _mm256_mul_ps(wv, _mm256_loadu_ps(xt + 32 * v + 8 * k)));
                }
        }
        if (8 * S < G) {
            float acc[32];
            for (int k = 0; k < 4; k++) _mm256_storeu_ps(acc + 8 * k, a[k]);
            y[r] = mirror_finish_row(px, row, 8 * S, acc);
        } else {
            y[r] = reduce32(a[0], a[1], a[2], a[3]);
        }
    }
}

void mirror_rows_avx2(const mirror_x *px, const void *w, int64_t rows, float *y) {
    if (px->int8)
        rows_int8(px, (const uint8_t *)w, rows, y);
    else if (px->type == STRATA_TYPE_Q4_K || px->type == STRATA_TYPE_Q6_K)
        rows_kquant(px, (const uint8_t *)w, rows, y);
    else
        rows_float(px, (const uint8_t *)w, rows, y);
}

/* ---- the serial steps of an expert: x's 8-bit quantization and SwiGLU, with the scalar bits ---------- */

void mirror_quantize_avx2(const float *x, int64_t cols, int8_t *q, float *scales) {
    const __m256 absm = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF)), half = _mm256_set1_ps(0.5f);
    const __m256 one = _mm256_set1_ps(1.0f);
    /* the low byte of each int32 (the scalar cast's truncation), to bytes 0..3 of each half */
    const __m256i lowb = _mm256_setr_epi8(0, 4, 8, 12, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, 0, 4, 8, 12, -1,
                                          -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1);
    for (int64_t b = 0; b < cols / 32; b++) {
        __m256 xv[4], m = _mm256_setzero_ps();
        for (int k = 0; k < 4; k++) {
            xv[k] = _mm256_loadu_ps(x + 32 * b + 8 * k);
            /* max |x| ignoring NaN as fmaxf does: max_ps returns its second operand when one is NaN */
            m = _mm256_max_ps(_mm256_and_ps(xv[k], absm), m);
        }
        __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
        m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
        m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
        const float amax = _mm_cvtss_f32(m4);
        const float d = amax / 127.0f;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        const __m256 vid = _mm256_set1_ps(id);
        for (int k = 0; k < 4; k++) {
            const __m256 v = _mm256_mul_ps(xv[k], vid);
            /* roundf: half away from zero. v - trunc(v) is exact, so the tie test is too */
            const __m256 t = _mm256_round_ps(v, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
            const __m256 up = _mm256_cmp_ps(_mm256_and_ps(_mm256_sub_ps(v, t), absm), half, _CMP_GE_OQ);
            const __m256 sgn = _mm256_or_ps(one, _mm256_andnot_ps(absm, v));
            const __m256 r = _mm256_add_ps(t, _mm256_and_ps(up, sgn));
            const __m256i bytes = _mm256_shuffle_epi8(_mm256_cvttps_epi32(r), lowb);
            const int32_t lo = _mm256_extract_epi32(bytes, 0), hi = _mm256_extract_epi32(bytes, 4);
            memcpy(q + 32 * b + 8 * k, &lo, 4);
            memcpy(q + 32 * b + 8 * k + 4, &hi, 4);
        }
        scales[b] = strata_f16_to_f32(strata_f32_to_f16(d));
    }
}

/* gq_expf on 8 values: the same operations in the same order */
static inline __m256 expf8(__m256 x) {
    const __m256 zero = _mm256_cmp_ps(x, _mm256_set1_ps(-87.0f), _CMP_LT_OQ);
    x = _mm256_blendv_ps(x, _mm256_set1_ps(88.0f), _mm256_cmp_ps(x, _mm256_set1_ps(88.0f), _CMP_GT_OQ));
    const __m256 n = _mm256_round_ps(_mm256_add_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504f)), _mm256_set1_ps(0.5f)),
                                     _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_sub_ps(x, _mm256_mul_ps(n, _mm256_set1_ps(0.693145752f)));
    r = _mm256_sub_ps(r, _mm256_mul_ps(n, _mm256_set1_ps(1.42860677e-06f)));
    __m256 p = _mm256_set1_ps(1.98412698e-4f);
    p = _mm256_add_ps(_mm256_mul_ps(p, r), _mm256_set1_ps(1.38888889e-3f));
    p = _mm256_add_ps(_mm256_mul_ps(p, r), _mm256_set1_ps(8.33333333e-3f));
    p = _mm256_add_ps(_mm256_mul_ps(p, r), _mm256_set1_ps(4.16666667e-2f));
    p = _mm256_add_ps(_mm256_mul_ps(p, r), _mm256_set1_ps(1.66666667e-1f));
    p = _mm256_add_ps(_mm256_mul_ps(p, r), _mm256_set1_ps(0.5f));
    p = _mm256_add_ps(_mm256_mul_ps(p, r), _mm256_set1_ps(1.0f));
    p = _mm256_add_ps(_mm256_mul_ps(p, r), _mm256_set1_ps(1.0f));
    const __m256i bits = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvttps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_andnot_ps(zero, _mm256_mul_ps(p, _mm256_castsi256_ps(bits)));
}

void mirror_swiglu_avx2(float *g, const float *u, int64_t n) {
    const __m256 sgn = _mm256_castsi256_ps(_mm256_set1_epi32((int)0x80000000u)), one = _mm256_set1_ps(1.0f);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m256 gv = _mm256_loadu_ps(g + i);
        const __m256 e = expf8(_mm256_xor_ps(gv, sgn));
        _mm256_storeu_ps(g + i, _mm256_mul_ps(_mm256_div_ps(gv, _mm256_add_ps(one, e)), _mm256_loadu_ps(u + i)));
    }
    for (; i < n; i++) g[i] = gq_swiglu(g[i], u[i]);
}
