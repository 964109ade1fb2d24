/*
 * quant_avx2.c — AVX2 + FMA + F16C dot products of the base types (F32, F16, Q8_0).
 *
 * Compiled with -mavx2 -mfma -mf16c; only called when the CPU has them (quant_simd_supported).
 * Orders: the float dots keep four 8-lane accumulators over 32-element steps, then one over
 * 8-element steps, then a scalar tail, combined in a fixed tree; Q8_0 adds each block's exact
 * integer dot, scaled, into an 8-lane accumulator in block order. All fixed by n.
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

static float f32_vec_dot_avx2(int64_t n, const void *w, const void *act) {
    const float *a = w, *b = act;
    __m256 s0 = _mm256_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;
    int64_t i = 0;
    for (; i + 32 <= n; i += 32) {
        s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
        s1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), s1);
        s2 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 16), _mm256_loadu_ps(b + i + 16), s2);
        s3 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 24), _mm256_loadu_ps(b + i + 24), s3);
    }
    for (; i + 8 <= n; i += 8) s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
    float sum = hsum256(_mm256_add_ps(_mm256_add_ps(s0, s1), _mm256_add_ps(s2, s3)));
    for (; i < n; i++) sum += a[i] * b[i];
    return sum;
}

static float f16_vec_dot_avx2(int64_t n, const void *w, const void *act) {
    const uint16_t *a = w;
    const float *b = act;
    __m256 s0 = _mm256_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;
    int64_t i = 0;
#define LD16(p) _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(p)))
    for (; i + 32 <= n; i += 32) {
        s0 = _mm256_fmadd_ps(LD16(a + i), _mm256_loadu_ps(b + i), s0);
        s1 = _mm256_fmadd_ps(LD16(a + i + 8), _mm256_loadu_ps(b + i + 8), s1);
        s2 = _mm256_fmadd_ps(LD16(a + i + 16), _mm256_loadu_ps(b + i + 16), s2);
        s3 = _mm256_fmadd_ps(LD16(a + i + 24), _mm256_loadu_ps(b + i + 24), s3);
    }
    for (; i + 8 <= n; i += 8) s0 = _mm256_fmadd_ps(LD16(a + i), _mm256_loadu_ps(b + i), s0);
#undef LD16
    float sum = hsum256(_mm256_add_ps(_mm256_add_ps(s0, s1), _mm256_add_ps(s2, s3)));
    for (; i < n; i++) sum += quant_f16_lut[a[i]] * b[i];
    return sum;
}

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

void quant_base_avx2(quant_traits t[]) {
    t[STRATA_TYPE_F32].vec_dot = f32_vec_dot_avx2;
    t[STRATA_TYPE_F16].vec_dot = f16_vec_dot_avx2;
    t[STRATA_TYPE_Q8_0].vec_dot = q8_0_vec_dot_avx2;
    quant_set_x4(t, STRATA_TYPE_Q8_0, q8_0_vec_dot_x4_avx2);
}
