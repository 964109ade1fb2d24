/*
 * mirror_avx512.c — the host mirror of the CUDA decode product (cuda_mirror.h) with AVX-512 (VNNI).
 *
 * The 32 lanes of the device's warp are 32 vector elements (two zmm of 16), so each lane's sequence of
 * rounded float operations is the scalar mirror's, element by element:
 *   Q8_0, Q4_0 (8-bit activations): per step of 256 values, lane l's exact integer dot of its 8
 *     values (dpbusd on unsigned weight bytes, the offset taken out through the accumulator's start
 *     value, then the two 4-value sums of the lane added), then a = a + (dw * dx) * isum.
 *   Q4_K, Q6_K (float activations): per super-block, the weight bytes transposed so that one vector
 *     holds byte v of every lane's 8, then for v = 0..7 in order a = a + w_v * x_v with w_v dequantized
 *     exactly as gq_dequant8 does it.
 * The lanes are combined by the warp's butterfly, written as the same tree of additions.
 * T = 256 values per step, G = cols / 32 blocks; a partial last step goes to mirror_finish_row.
 */
#include <immintrin.h>
#include <stdint.h>

#include "../cuda_mirror.h"
#include "../group_dequant.h"
#include "mirror_q4k.h"

/* The butterfly's result for lanes 0..15 in a, 16..31 in b: ((l + l^16) + (l^8 ...)) ... to lane 0. */
static inline float reduce32(__m512 a, __m512 b) {
    const __m512 s = _mm512_add_ps(a, b);
    const __m256 s8 = _mm256_add_ps(_mm512_castps512_ps256(s), _mm512_extractf32x8_ps(s, 1));
    const __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps(s8, 1));
    const __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
    return _mm_cvtss_f32(_mm_add_ss(s2, _mm_movehdup_ps(s2)));
}

/* Lane sums from dpbusd results: r0, r1 hold 16 dwords each, lane k's two 4-value sums at dwords
 * ev[k] and ev[k] + 1 of the pair (r0 first). Integer additions: exact. */
static inline __m512i pair_sums(__m512i r0, __m512i r1, __m512i ev, __m512i od) {
    return _mm512_add_epi32(_mm512_permutex2var_epi32(r0, ev, r1), _mm512_permutex2var_epi32(r0, od, r1));
}

/* The 8 block scales (f16 at base + stride * g) of a step as floats, spread to lanes 0..15 / 16..31. */
static inline void step_scales(const uint8_t *base, __m256i offs, __m512i rep0, __m512i rep1, __m512 *d0,
                               __m512 *d1) {
    const __m256i h = _mm256_i32gather_epi32((const int *)(const void *)base, offs, 1);
    const __m512 dw = _mm512_castps256_ps512(_mm256_cvtph_ps(_mm256_cvtepi32_epi16(h)));
    *d0 = _mm512_permutexvar_ps(rep0, dw);
    *d1 = _mm512_permutexvar_ps(rep1, dw);
}

static void rows_int8(const mirror_x *px, const uint8_t *w, int64_t rows, float *y) {
    const int64_t G = px->cols / 32, S = G / 8;
    const int q4 = px->type == STRATA_TYPE_Q4_0;
    const int64_t bb = q4 ? 18 : 34, rb = G * bb;
    int32_t ev_[16], od_[16], off_[8], rep_[16];
    for (int k = 0; k < 16; k++) {
        /* Q8_0: dwords in value order; Q4_0: lane 4c + s at 4c + 2s (s < 2, low nibbles) or at
         * 16 + 4c + 2 (s - 2) (s >= 2, the high-nibble vector) */
        const int c = k >> 2, s = k & 3;
        ev_[k] = q4 ? (s < 2 ? 4 * c + 2 * s : 16 + 4 * c + 2 * (s - 2)) : 2 * k;
        od_[k] = ev_[k] + 1;
        rep_[k] = k >> 2;
    }
    for (int g = 0; g < 8; g++) off_[g] = (int32_t)(g * bb);
    const __m512i ev = _mm512_loadu_si512(ev_), od = _mm512_loadu_si512(od_);
    const __m512i rep0 = _mm512_loadu_si512(rep_), rep1 = _mm512_add_epi32(rep0, _mm512_set1_epi32(4));
    const __m256i offs = _mm256_loadu_si256((const __m256i *)off_);
    const __m512i x80 = _mm512_set1_epi8((char)0x80), m4 = _mm512_set1_epi8(0x0F);
    for (int64_t r = 0; r < rows; r++) {
        const uint8_t *row = w + r * rb;
        __m512 a0 = _mm512_setzero_ps(), a1 = _mm512_setzero_ps();
        for (int64_t t = 0; t < S; t++) {
            const uint8_t *b = row + t * 8 * bb;
            const int8_t *xq = px->qp + t * 256;
            const int32_t *cr = px->corr + t * 64;
            __m512i l0, l1;
            if (!q4) {
                __m512i rr[4];
                for (int k = 0; k < 4; k++) {
                    /* blocks 2k and 2k + 1: their 32 quants each, as unsigned bytes w + 128 */
                    __m512i wv = _mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)(b + 2 * k * 34 + 2)));
                    wv = _mm512_inserti64x4(wv, _mm256_loadu_si256((const __m256i *)(b + (2 * k + 1) * 34 + 2)), 1);
                    wv = _mm512_xor_si512(wv, x80);
                    rr[k] = _mm512_dpbusd_epi32(_mm512_loadu_si512(cr + 16 * k), wv, _mm512_loadu_si512(xq + 64 * k));
                }
                l0 = pair_sums(rr[0], rr[1], ev, od);
                l1 = pair_sums(rr[2], rr[3], ev, od);
            } else {
                __m512i lh[2];
                for (int hk = 0; hk < 2; hk++) {
                    /* blocks 4hk .. 4hk + 3: 16 quant bytes each; low nibbles are values 0..15 */
                    const uint8_t *q = b + hk * 4 * 18 + 2;
                    __m512i v = _mm512_castsi128_si512(_mm_loadu_si128((const __m128i *)q));
                    v = _mm512_inserti32x4(v, _mm_loadu_si128((const __m128i *)(q + 18)), 1);
                    v = _mm512_inserti32x4(v, _mm_loadu_si128((const __m128i *)(q + 36)), 2);
                    v = _mm512_inserti32x4(v, _mm_loadu_si128((const __m128i *)(q + 54)), 3);
                    const __m512i lo = _mm512_and_si512(v, m4), hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), m4);
                    const __m512i rlo = _mm512_dpbusd_epi32(_mm512_loadu_si512(cr + 32 * hk), lo,
                                                            _mm512_loadu_si512(xq + 128 * hk));
                    const __m512i rhi = _mm512_dpbusd_epi32(_mm512_loadu_si512(cr + 32 * hk + 16), hi,
                                                            _mm512_loadu_si512(xq + 128 * hk + 64));
                    lh[hk] = pair_sums(rlo, rhi, ev, od);
                }
                l0 = lh[0];
                l1 = lh[1];
            }
            __m512 d0, d1;
            step_scales(b, offs, rep0, rep1, &d0, &d1);
            const __m512 x0 = _mm512_loadu_ps(px->dl + t * 32), x1 = _mm512_loadu_ps(px->dl + t * 32 + 16);
            /* a = a + (dw * dx) * isum: two multiplies and one add, each rounded, as on the device */
            a0 = _mm512_add_ps(a0, _mm512_mul_ps(_mm512_mul_ps(d0, x0), _mm512_cvtepi32_ps(l0)));
            a1 = _mm512_add_ps(a1, _mm512_mul_ps(_mm512_mul_ps(d1, x1), _mm512_cvtepi32_ps(l1)));
        }
        if (8 * S < G) {
            float acc[32];
            _mm512_storeu_ps(acc, a0);
            _mm512_storeu_ps(acc + 16, a1);
            y[r] = mirror_finish_row(px, row, 8 * S, acc);
        } else {
            y[r] = reduce32(a0, a1);
        }
    }
}

/* 128 bytes = 16 pieces of 8 values (piece p at 8p): out0 lane v (v = 0..3) and out1 lane v - 4
 * (v = 4..7) get byte v of the 16 pieces, in piece order. A byte shuffle pairs pieces 2c, 2c + 1 per
 * value (word v of chunk c), then a word permute gathers word v of the 8 chunks. */
static inline void transpose16x8(__m512i z0, __m512i z1, __m512i sh, __m512i w0, __m512i w1, __m512i *out0,
                                 __m512i *out1) {
    z0 = _mm512_shuffle_epi8(z0, sh);
    z1 = _mm512_shuffle_epi8(z1, sh);
    *out0 = _mm512_permutex2var_epi16(z0, w0, z1);
    *out1 = _mm512_permutex2var_epi16(z0, w1, z1);
}

#define LANE128(z, k) ((k) == 0 ? _mm512_castsi512_si128(z) : _mm512_extracti32x4_epi32(z, (k)))

static void rows_kquant(const mirror_x *px, const uint8_t *w, int64_t rows, float *y) {
    const int64_t S = px->cols / 256;
    const int q6 = px->type == STRATA_TYPE_Q6_K;
    const int64_t bb = q6 ? 210 : 144, rb = S * bb;
    uint16_t wi[64];
    int32_t inv[32];
    for (int v = 0; v < 8; v++)
        for (int c = 0; c < 8; c++) wi[8 * v + c] = (uint16_t)(8 * c + v);
    for (int e = 0; e < 32; e++) inv[px->lane_of[e]] = e;
    const __m512i sh = _mm512_broadcast_i32x4(_mm_setr_epi8(0, 8, 1, 9, 2, 10, 3, 11, 4, 12, 5, 13, 6, 14, 7, 15));
    const __m512i w0 = _mm512_loadu_si512(wi), w1 = _mm512_loadu_si512(wi + 32);
    const __m512i si0 = _mm512_loadu_si512(px->sidx), si1 = _mm512_loadu_si512(px->sidx + 16);
    const __m512i inv0 = _mm512_loadu_si512(inv), inv1 = _mm512_loadu_si512(inv + 16);
    const __m128i m4 = _mm_set1_epi8(0x0F), m2 = _mm_set1_epi8(3), c32 = _mm_set1_epi8(32);
    const __m128i shl = _mm_setr_epi32(0, 2, 0, 2), shh = _mm_setr_epi32(4, 6, 4, 6);
    for (int64_t r = 0; r < rows; r++) {
        const uint8_t *row = w + r * rb;
        __m512 a0 = _mm512_setzero_ps(), a1 = _mm512_setzero_ps();
        for (int64_t t = 0; t < S; t++) {
            const uint8_t *b = row + t * bb;
            const float *xt = px->xt + t * 256;
            __m512 dlo, dhi, mlo = _mm512_setzero_ps(), mhi = _mm512_setzero_ps();
            __m512i q0, q1, h0 = _mm512_setzero_si512(), h1 = _mm512_setzero_si512();
            if (!q6) {
                /* d * sc and dmin * m of the 8 sub-blocks, each rounded once, as gq_dequant8 */
                __m256 dsc, dm;
                mirror_q4k_scales(b, &dsc, &dm);
                const __m512 s8 = _mm512_castps256_ps512(dsc);
                const __m512 m8 = _mm512_castps256_ps512(dm);
                dlo = _mm512_permutexvar_ps(si0, s8);
                dhi = _mm512_permutexvar_ps(si1, s8);
                mlo = _mm512_permutexvar_ps(si0, m8);
                mhi = _mm512_permutexvar_ps(si1, m8);
                transpose16x8(_mm512_loadu_si512(b + 16), _mm512_loadu_si512(b + 80), sh, w0, w1, &q0, &q1);
            } else {
                const __m512 s16 = _mm512_mul_ps(_mm512_set1_ps(gq_f16(b + 208)),
                                                 _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(
                                                     _mm_loadu_si128((const __m128i *)(b + 192)))));
                dlo = _mm512_permutexvar_ps(si0, s16);
                dhi = _mm512_permutexvar_ps(si1, s16);
                transpose16x8(_mm512_loadu_si512(b), _mm512_loadu_si512(b + 64), sh, w0, w1, &q0, &q1);
                /* qh rows 0, 0, 1, 1: piece 4r + s of ql row r takes its high bits from qh row r / 2 */
                transpose16x8(_mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(b + 128))),
                              _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(b + 160))), sh, w0, w1,
                              &h0, &h1);
            }
#define STEP(z, hz, k, v)                                                                                       \
    do {                                                                                                        \
        const __m128i ql = LANE128(z, k);                                                                       \
        __m128i lo = _mm_and_si128(ql, m4), hi = _mm_and_si128(_mm_srli_epi16(ql, 4), m4);                      \
        __m512 wl, wh;                                                                                          \
        if (!q6) {                                                                                              \
            wl = _mm512_sub_ps(_mm512_mul_ps(dlo, _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(lo))), mlo);          \
            wh = _mm512_sub_ps(_mm512_mul_ps(dhi, _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(hi))), mhi);          \
        } else {                                                                                                \
            /* the 2 high bits: field r % 2 (low nibble) or 2 + r % 2 (high) of the qh byte; a dword is  \
             * one row r, and the mask keeps each byte's own bits */                                          \
            const __m128i qh = LANE128(hz, k);                                                                  \
            lo = _mm_or_si128(lo, _mm_slli_epi16(_mm_and_si128(_mm_srlv_epi32(qh, shl), m2), 4));                \
            hi = _mm_or_si128(hi, _mm_slli_epi16(_mm_and_si128(_mm_srlv_epi32(qh, shh), m2), 4));                \
            wl = _mm512_mul_ps(dlo, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_sub_epi8(lo, c32))));           \
            wh = _mm512_mul_ps(dhi, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_sub_epi8(hi, c32))));           \
        }                                                                                                       \
        a0 = _mm512_add_ps(a0, _mm512_mul_ps(wl, _mm512_loadu_ps(xt + 32 * (v))));                              \
        a1 = _mm512_add_ps(a1, _mm512_mul_ps(wh, _mm512_loadu_ps(xt + 32 * (v) + 16)));                         \
    } while (0)
            STEP(q0, h0, 0, 0);
            STEP(q0, h0, 1, 1);
            STEP(q0, h0, 2, 2);
            STEP(q0, h0, 3, 3);
            STEP(q1, h1, 0, 4);
            STEP(q1, h1, 1, 5);
            STEP(q1, h1, 2, 6);
            STEP(q1, h1, 3, 7);
#undef STEP
        }
        /* elements back to lane order, then the butterfly */
        y[r] = reduce32(_mm512_permutex2var_ps(a0, inv0, a1), _mm512_permutex2var_ps(a0, inv1, a1));
    }
}

/* F32, F16, BF16 (and the types of GQ_NEW_TYPES, dequantized by gq_dequant8: px->deq): a step's 256 weights
 * are widened to floats in value order (exact conversions), then
 * gathered per value index v from that buffer: element l of vector v is lane l's value v. */
static void rows_float(const mirror_x *px, const uint8_t *w, int64_t rows, float *y) {
    const int64_t G = px->cols / 32, S = G / 8, rb = gq_row_bytes(px->type, px->cols);
    const int64_t es = px->type == STRATA_TYPE_F32 ? 4 : 2;
    const __m512i idx0 = _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                                            _mm512_set1_epi32(8));
    const __m512i idx1 = _mm512_add_epi32(idx0, _mm512_set1_epi32(128));
    float buf[256] __attribute__((aligned(64)));
    for (int64_t r = 0; r < rows; r++) {
        const uint8_t *row = w + r * rb;
        __m512 a0 = _mm512_setzero_ps(), a1 = _mm512_setzero_ps();
        for (int64_t t = 0; t < S; t++) {
            if (px->deq) { /* the other types: gq_dequant8's values, the scalar kernel's */
                for (int gg = 0; gg < 8; gg++)
                    for (int sl = 0; sl < 4; sl++) gq_dequant8(px->type, row, 8 * t + gg, sl, buf + 32 * gg + 8 * sl);
            } else {
                const uint8_t *src = row + t * 256 * es;
                for (int k = 0; k < 16; k++) {
                    __m512 v;
                    if (px->type == STRATA_TYPE_F32)
                        v = _mm512_loadu_ps(src + 64 * k);
                    else if (px->type == STRATA_TYPE_F16)
                        v = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(src + 32 * k)));
                    else
                        v = _mm512_castsi512_ps(_mm512_slli_epi32(
                            _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(src + 32 * k))), 16));
                    _mm512_store_ps(buf + 16 * k, v);
                }
            }
            const float *xt = px->xt + t * 256;
            for (int v = 0; v < 8; v++) {
                const __m512 w0 = _mm512_i32gather_ps(idx0, buf + v, 4), w1 = _mm512_i32gather_ps(idx1, buf + v, 4);
                a0 = _mm512_add_ps(a0, _mm512_mul_ps(w0, _mm512_loadu_ps(xt + 32 * v)));
                a1 = _mm512_add_ps(a1, _mm512_mul_ps(w1, _mm512_loadu_ps(xt + 32 * v + 16)));
            }
        }
        if (8 * S < G) {
            float acc[32];
            _mm512_storeu_ps(acc, a0);
            _mm512_storeu_ps(acc + 16, a1);
            y[r] = mirror_finish_row(px, row, 8 * S, acc);
        } else {
            y[r] = reduce32(a0, a1);
        }
    }
}

void mirror_rows_avx512(const mirror_x *px, const void *w, int64_t rows, float *y) {
    if (px->int8)
        rows_int8(px, (const uint8_t *)w, rows, y);
    else if (px->type == STRATA_TYPE_Q4_K || px->type == STRATA_TYPE_Q6_K)
        rows_kquant(px, (const uint8_t *)w, rows, y);
    else
        rows_float(px, (const uint8_t *)w, rows, y);
}

/* ---- the serial steps of an expert: x's 8-bit quantization and SwiGLU, with the scalar bits ---------- */

void mirror_quantize_avx512(const float *x, int64_t cols, int8_t *q, float *scales) {
    const __m512 absm = _mm512_castsi512_ps(_mm512_set1_epi32(0x7FFFFFFF)), half = _mm512_set1_ps(0.5f);
    const __m512 one = _mm512_set1_ps(1.0f);
    for (int64_t b = 0; b < cols / 32; b++) {
        const __m512 x0 = _mm512_loadu_ps(x + 32 * b), x1 = _mm512_loadu_ps(x + 32 * b + 16);
        /* max |x| ignoring NaN as fmaxf does: max_ps returns its second operand when one is NaN */
        __m512 m = _mm512_max_ps(_mm512_and_ps(x0, absm), _mm512_setzero_ps());
        m = _mm512_max_ps(_mm512_and_ps(x1, absm), m);
        const float amax = _mm512_reduce_max_ps(m);
        const float d = amax / 127.0f;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        const __m512 vid = _mm512_set1_ps(id);
        for (int h = 0; h < 2; h++) {
            const __m512 v = _mm512_mul_ps(h ? x1 : x0, vid);
            /* roundf: half away from zero. v - trunc(v) is exact, so the tie test is too */
            const __m512 t = _mm512_roundscale_ps(v, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
            const __mmask16 up = _mm512_cmp_ps_mask(_mm512_and_ps(_mm512_sub_ps(v, t), absm), half, _CMP_GE_OQ);
            const __m512 sgn = _mm512_or_ps(one, _mm512_andnot_ps(absm, v));
            const __m512 r = _mm512_mask_add_ps(t, up, t, sgn);
            /* the int8 conversion keeps the low byte, as the scalar (int8_t) cast of the int32 does */
            _mm_storeu_si128((__m128i *)(q + 32 * b + 16 * h), _mm512_cvtepi32_epi8(_mm512_cvttps_epi32(r)));
        }
        scales[b] = strata_f16_to_f32(strata_f32_to_f16(d));
    }
}

/* gq_expf on 16 values: the same operations in the same order */
static inline __m512 expf16(__m512 x) {
    const __mmask16 zero = _mm512_cmp_ps_mask(x, _mm512_set1_ps(-87.0f), _CMP_LT_OQ);
    x = _mm512_mask_mov_ps(x, _mm512_cmp_ps_mask(x, _mm512_set1_ps(88.0f), _CMP_GT_OQ), _mm512_set1_ps(88.0f));
    const __m512 n = _mm512_roundscale_ps(_mm512_add_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504f)), _mm512_set1_ps(0.5f)),
                                          _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_sub_ps(x, _mm512_mul_ps(n, _mm512_set1_ps(0.693145752f)));
    r = _mm512_sub_ps(r, _mm512_mul_ps(n, _mm512_set1_ps(1.42860677e-06f)));
    __m512 p = _mm512_set1_ps(1.98412698e-4f);
    p = _mm512_add_ps(_mm512_mul_ps(p, r), _mm512_set1_ps(1.38888889e-3f));
    p = _mm512_add_ps(_mm512_mul_ps(p, r), _mm512_set1_ps(8.33333333e-3f));
    p = _mm512_add_ps(_mm512_mul_ps(p, r), _mm512_set1_ps(4.16666667e-2f));
    p = _mm512_add_ps(_mm512_mul_ps(p, r), _mm512_set1_ps(1.66666667e-1f));
    p = _mm512_add_ps(_mm512_mul_ps(p, r), _mm512_set1_ps(0.5f));
    p = _mm512_add_ps(_mm512_mul_ps(p, r), _mm512_set1_ps(1.0f));
    p = _mm512_add_ps(_mm512_mul_ps(p, r), _mm512_set1_ps(1.0f));
    const __m512i bits = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvttps_epi32(n), _mm512_set1_epi32(127)), 23);
    return _mm512_maskz_mov_ps((__mmask16)~zero, _mm512_mul_ps(p, _mm512_castsi512_ps(bits)));
}

void mirror_swiglu_avx512(float *g, const float *u, int64_t n) {
    const __m512 sgn = _mm512_castsi512_ps(_mm512_set1_epi32((int)0x80000000u)), one = _mm512_set1_ps(1.0f);
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        const __m512 gv = _mm512_loadu_ps(g + i);
        const __m512 e = expf16(_mm512_xor_ps(gv, sgn));
        _mm512_storeu_ps(g + i, _mm512_mul_ps(_mm512_div_ps(gv, _mm512_add_ps(one, e)), _mm512_loadu_ps(u + i)));
    }
    for (; i < n; i++) g[i] = gq_swiglu(g[i], u[i]);
}
