/*
 * quant_avx2.c — AVX2 + FMA + F16C dot products of the base types (F32, F16, BF16, Q8_0).
 *
 * Compiled with -mavx2 -mfma -mf16c; only called when the CPU has them (quant_simd_supported).
 * Orders: see each kernel; all are fixed by n alone. Each type also has a four-row kernel, the same
 * code instantiated for four rows, so each row's result is bit-identical to the one-row kernel's.
 */
#include <immintrin.h>

#include "common.h"
#include "quant.h"
#include "strata.h"

static inline float hsum256(__m256 v) {
    __m128 lo = _mm256_castps256_ps128(v), hi = _mm256_extractf128_ps(v, 1);
    lo = _mm_add_ps(lo, hi);
    __m128 sh = _mm_movehdup_ps(lo);
    __m128 s = _mm_add_ps(lo, sh);
    sh = _mm_movehl_ps(sh, s);
    s = _mm_add_ss(s, sh);
    return _mm_cvtss_f32(s);
}

/* ---- float weights (F32, F16, BF16) against F32 activations ----------------------------------- */

enum { W_F32, W_F16, W_BF16 };

/* 8 weights as floats. */
static inline __attribute__((always_inline)) __m256 load8(const void *w, int64_t i, const int wt) {
    if (wt == W_F32) return _mm256_loadu_ps((const float *)w + i);
    __m128i h = _mm_loadu_si128((const __m128i *)((const uint16_t *)w + i));
    if (wt == W_F16) return _mm256_cvtph_ps(h);
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16)); /* bf16: the top half of an f32 */
}

static inline __attribute__((always_inline)) float load1(const void *w, int64_t i, const int wt) {
    if (wt == W_F32) return ((const float *)w)[i];
    uint16_t h = ((const uint16_t *)w)[i];
    return wt == W_F16 ? quant_f16_lut[h] : strata_bf16_to_f32(h);
}

/* R weight rows (ws bytes apart) against one activation row. Per row: two 8-lane accumulators over
 * 16-element steps, one more 8-element step into the first, their sum reduced in a fixed tree, then a
 * scalar tail. Instantiated for R = 1 (vec_dot) and R = 4 (vec_dot_x4): bit-identical per row. */
static inline __attribute__((always_inline)) void float_rows_avx2(int64_t n, const uint8_t *w, size_t ws,
                                                                 const float *b, float *out, const int R,
                                                                 const int wt) {
    __m256 s0[4], s1[4];
    for (int r = 0; r < R; r++) s0[r] = s1[r] = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m256 b0 = _mm256_loadu_ps(b + i), b1 = _mm256_loadu_ps(b + i + 8);
        for (int r = 0; r < R; r++) {
            s0[r] = _mm256_fmadd_ps(load8(w + (size_t)r * ws, i, wt), b0, s0[r]);
            s1[r] = _mm256_fmadd_ps(load8(w + (size_t)r * ws, i + 8, wt), b1, s1[r]);
        }
    }
    int64_t i8 = i;
    if (i8 + 8 <= n) {
        __m256 b0 = _mm256_loadu_ps(b + i8);
        for (int r = 0; r < R; r++) s0[r] = _mm256_fmadd_ps(load8(w + (size_t)r * ws, i8, wt), b0, s0[r]);
        i += 8;
    }
    for (int r = 0; r < R; r++) {
        float sum = hsum256(_mm256_add_ps(s0[r], s1[r]));
        for (int64_t j = i; j < n; j++) sum += load1(w + (size_t)r * ws, j, wt) * b[j];
        out[r] = sum;
    }
}

#define FLOAT_KERNELS(name, wt)                                                                       \
    static float name##_vec_dot_avx2(int64_t n, const void *w, const void *act) {                  \
        float out[1];                                                                               \
        float_rows_avx2(n, w, 0, act, out, 1, wt);                                                  \
        return out[0];                                                                              \
    }                                                                                               \
    static void name##_vec_dot_x4_avx2(int64_t n, const void *w, size_t ws, const void *act, float out[4]) { \
        float_rows_avx2(n, w, ws, act, out, 4, wt);                                                 \
    }
FLOAT_KERNELS(f32, W_F32)
FLOAT_KERNELS(f16, W_F16)
FLOAT_KERNELS(bf16, W_BF16)
#undef FLOAT_KERNELS

/* Q8_0 block: f16 scale then 32 int8 (34 bytes, so loads are unaligned). R weight rows against one
 * activation row, each with its own accumulator and the same operations; instantiated for R = 1
 * (vec_dot) and R = 4 (vec_dot_x4), bit-identical per row. */
static inline __attribute__((always_inline)) void q8_0_rows_avx2(int64_t n, const uint8_t *w, size_t ws,
                                                                const uint8_t *b, float *out, const int R) {
    __m256 acc[4];
    for (int r = 0; r < R; r++) acc[r] = _mm256_setzero_ps();
    const __m256i ones = _mm256_set1_epi16(1);
    for (int64_t i = 0; i < n / 32; i++) {
        const uint8_t *bb = b + i * 34;
        uint16_t db;
        memcpy(&db, bb, 2);
        __m256i qb = _mm256_loadu_si256((const __m256i *)(bb + 2));
        for (int r = 0; r < R; r++) {
            const uint8_t *a = w + (size_t)r * ws + i * 34;
            uint16_t da;
            memcpy(&da, a, 2);
            __m256i qa = _mm256_loadu_si256((const __m256i *)(a + 2));
            /* maddubs takes unsigned x signed: move qa's sign onto qb, then multiply |qa| by it. The
             * products fit int16 (|qa| <= 128, |qb| <= 127, two terms), so the integer sum is exact. */
            __m256i ua = _mm256_sign_epi8(qa, qa);
            __m256i sb = _mm256_sign_epi8(qb, qa);
            __m256i p16 = _mm256_maddubs_epi16(ua, sb);
            __m256i p32 = _mm256_madd_epi16(p16, ones);
            __m256 d = _mm256_set1_ps(quant_f16_lut[da] * quant_f16_lut[db]);
            acc[r] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(p32), acc[r]);
        }
    }
    for (int r = 0; r < R; r++) out[r] = hsum256(acc[r]);
}

static float q8_0_vec_dot_avx2(int64_t n, const void *w, const void *act) {
    float out[1];
    q8_0_rows_avx2(n, w, 0, act, out, 1);
    return out[0];
}

static void q8_0_vec_dot_x4_avx2(int64_t n, const void *w, size_t ws, const void *act, float out[4]) {
    q8_0_rows_avx2(n, w, ws, act, out, 4);
}

/* Q8_0, four weight rows x many activation rows (the prompt path): for two rows and four tokens at a
 * time, the eight (row, token) pairs run q8_0_rows_avx2's operations for their row and token — the same
 * sign split, maddubs and madd per block, the same scale product da * db, conversion and fused
 * multiply-add into the same eight lanes, blocks in order, then hsum256 — with each weight block loaded
 * and sign-split once for the four tokens. So out[4 k + r] is bit for bit vec_dot(n, row r, act[k]). */
static void q8_0_vec_dot_4xn_avx2(int64_t n, const void *w, size_t ws, const void *const *act, int32_t n_act,
                                  float *out) {
    const int64_t nb = n / 32;
    const __m256i ones = _mm256_set1_epi16(1);
    for (int32_t k0 = 0; k0 < n_act; k0 += 4) {
        const int32_t kn = n_act - k0 < 4 ? n_act - k0 : 4;
        const uint8_t *b[4];
        for (int k = 0; k < 4; k++) b[k] = act[k0 + (k < kn ? k : 0)];
        for (int rp = 0; rp < 2; rp++) {
            const uint8_t *a0 = (const uint8_t *)w + (size_t)(2 * rp) * ws, *a1 = a0 + ws;
            __m256 acc[8]; /* pair 4 rr + k: row 2 rp + rr, token k0 + k */
            for (int p = 0; p < 8; p++) acc[p] = _mm256_setzero_ps();
            for (int64_t i = 0; i < nb; i++) {
                uint16_t h;
                float db[4], da[2];
                for (int k = 0; k < 4; k++) {
                    memcpy(&h, b[k] + i * 34, 2);
                    db[k] = quant_f16_lut[h];
                }
                memcpy(&h, a0 + i * 34, 2);
                da[0] = quant_f16_lut[h];
                memcpy(&h, a1 + i * 34, 2);
                da[1] = quant_f16_lut[h];
                for (int rr = 0; rr < 2; rr++) {
                    const __m256i qa = _mm256_loadu_si256((const __m256i *)((rr ? a1 : a0) + i * 34 + 2));
                    const __m256i ua = _mm256_sign_epi8(qa, qa);
                    for (int k = 0; k < 4; k++) {
                        const __m256i qb = _mm256_loadu_si256((const __m256i *)(b[k] + i * 34 + 2));
                        const __m256i p32 = _mm256_madd_epi16(_mm256_maddubs_epi16(ua, _mm256_sign_epi8(qb, qa)), ones);
                        acc[4 * rr + k] =
                            _mm256_fmadd_ps(_mm256_set1_ps(da[rr] * db[k]), _mm256_cvtepi32_ps(p32), acc[4 * rr + k]);
                    }
                }
            }
            for (int rr = 0; rr < 2; rr++)
                for (int k = 0; k < kn; k++) out[(size_t)(k0 + k) * 4 + 2 * rp + rr] = hsum256(acc[4 * rr + k]);
        }
    }
}

/* Activations to Q8_0, bit-identical to the scalar quantizer: the same max (exact in any order), the
 * same scale and product per value, and roundf's ties-away-from-zero rounding rebuilt from a truncation
 * (t - trunc(t) is exact, so |t - trunc(t)| >= 0.5 decides the step away from zero exactly). */
static void q8_0_quantize_act_avx2(const float *x, void *dst, int64_t n) {
    uint8_t *o = dst;
    const __m256 sign = _mm256_set1_ps(-0.0f), half = _mm256_set1_ps(0.5f), one = _mm256_set1_ps(1.0f);
    const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7); /* undoes the packs' lane interleave */
    for (int64_t b = 0; b < n / 32; b++, x += 32, o += 34) {
        __m256 v[4];
        for (int j = 0; j < 4; j++) v[j] = _mm256_loadu_ps(x + 8 * j);
        __m256 m = _mm256_max_ps(_mm256_max_ps(_mm256_andnot_ps(sign, v[0]), _mm256_andnot_ps(sign, v[1])),
                                 _mm256_max_ps(_mm256_andnot_ps(sign, v[2]), _mm256_andnot_ps(sign, v[3])));
        __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
        m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
        m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
        float amax = _mm_cvtss_f32(m4);
        float d = amax / 127.0f;
        float id = d != 0.0f ? 1.0f / d : 0.0f;
        uint16_t dh = strata_f32_to_f16(d);
        memcpy(o, &dh, 2);
        __m256 vid = _mm256_set1_ps(id);
        __m256i q[4];
        for (int j = 0; j < 4; j++) {
            __m256 t = _mm256_mul_ps(v[j], vid);
            __m256 r = _mm256_round_ps(t, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
            __m256 away = _mm256_cmp_ps(_mm256_andnot_ps(sign, _mm256_sub_ps(t, r)), half, _CMP_GE_OQ);
            r = _mm256_add_ps(r, _mm256_and_ps(away, _mm256_or_ps(_mm256_and_ps(t, sign), one)));
            q[j] = _mm256_cvttps_epi32(r);
        }
        __m256i p16a = _mm256_packs_epi32(q[0], q[1]), p16b = _mm256_packs_epi32(q[2], q[3]);
        __m256i p8 = _mm256_permutevar8x32_epi32(_mm256_packs_epi16(p16a, p16b), order);
        _mm256_storeu_si256((__m256i *)(o + 2), p8);
    }
}

void quant_base_avx2(quant_traits t[]) {
    t[STRATA_TYPE_F32].vec_dot = f32_vec_dot_avx2;
    t[STRATA_TYPE_F16].vec_dot = f16_vec_dot_avx2;
    t[STRATA_TYPE_BF16].vec_dot = bf16_vec_dot_avx2;
    quant_set_x4(t, STRATA_TYPE_F32, f32_vec_dot_x4_avx2);
    quant_set_x4(t, STRATA_TYPE_F16, f16_vec_dot_x4_avx2);
    quant_set_x4(t, STRATA_TYPE_BF16, bf16_vec_dot_x4_avx2);
    t[STRATA_TYPE_Q8_0].vec_dot = q8_0_vec_dot_avx2;
    quant_set_x4(t, STRATA_TYPE_Q8_0, q8_0_vec_dot_x4_avx2);
    quant_set_4xn(t, STRATA_TYPE_Q8_0, q8_0_vec_dot_4xn_avx2);
    t[STRATA_TYPE_Q8_0].quantize_act = q8_0_quantize_act_avx2;
}
