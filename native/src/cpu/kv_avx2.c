/*
 * kv_avx2.c — f16 rows of the KV cache with AVX2 + FMA + F16C: the key dot product and the value
 * accumulation of attention. Order: 8-lane accumulators over 16-element steps (two of them), one
 * over an 8-element step, a scalar tail, combined in a fixed tree; depends on n alone.
 */
#include <immintrin.h>

#include "kv.h"
#include "quant.h"

#define LD16(p) _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(p)))

static float dot_f16_avx2(int32_t n, const uint16_t *k, const float *q) {
    __m256 s0 = _mm256_setzero_ps(), s1 = s0;
    int32_t i = 0;
    for (; i + 16 <= n; i += 16) {
        s0 = _mm256_fmadd_ps(LD16(k + i), _mm256_loadu_ps(q + i), s0);
        s1 = _mm256_fmadd_ps(LD16(k + i + 8), _mm256_loadu_ps(q + i + 8), s1);
    }
    for (; i + 8 <= n; i += 8) s0 = _mm256_fmadd_ps(LD16(k + i), _mm256_loadu_ps(q + i), s0);
    __m256 s = _mm256_add_ps(s0, s1);
    __m128 lo = _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1));
    lo = _mm_add_ps(lo, _mm_movehl_ps(lo, lo));
    lo = _mm_add_ss(lo, _mm_movehdup_ps(lo));
    float r = _mm_cvtss_f32(lo);
    for (; i < n; i++) r += quant_f16_lut[k[i]] * q[i];
    return r;
}

static void axpy_f16_avx2(int32_t n, float a, const uint16_t *v, float *out) {
    __m256 va = _mm256_set1_ps(a);
    int32_t i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(out + i, _mm256_fmadd_ps(va, LD16(v + i), _mm256_loadu_ps(out + i)));
    for (; i < n; i++) out[i] += a * quant_f16_lut[v[i]];
}

void kv_kernels_avx2(kv_kernels *k) {
    k->dot_f16 = dot_f16_avx2;
    k->axpy_f16 = axpy_f16_avx2;
}
