/*
 * quant_avx512.c — AVX-512 (F/BW/VL/DQ + VNNI) dot products of the base types (F32, F16, BF16, Q8_0).
 *
 * Compiled with the AVX-512 flags; only called when the CPU has them. Orders: see each kernel; all
 * are fixed by n alone. Each type has a four-row kernel, the same code instantiated for four rows, so
 * each row's result is bit-identical to the one-row kernel's.
 */
#include <immintrin.h>

#include "common.h"
#include "quant.h"
#include "strata.h"

/* ---- float weights (F32, F16, BF16) against F32 activations ----------------------------------- */

enum { W_F32, W_F16, W_BF16 };

static inline __attribute__((always_inline)) __m512 load16(const void *w, int64_t i, const int wt) {
    if (wt == W_F32) return _mm512_loadu_ps((const float *)w + i);
    __m256i h = _mm256_loadu_si256((const __m256i *)((const uint16_t *)w + i));
    if (wt == W_F16) return _mm512_cvtph_ps(h);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16)); /* bf16: the top half of an f32 */
}

static inline __attribute__((always_inline)) float load1(const void *w, int64_t i, const int wt) {
    if (wt == W_F32) return ((const float *)w)[i];
    uint16_t h = ((const uint16_t *)w)[i];
    return wt == W_F16 ? quant_f16_lut[h] : strata_bf16_to_f32(h);
}

/* R weight rows against one activation row. Per row: two 16-lane accumulators over 32-element steps,
 * one more 16-element step into the first, reduced (_mm512_reduce_add_ps: a fixed tree), then a scalar
 * tail. Instantiated for R = 1 and R = 4: bit-identical per row. */
static inline __attribute__((always_inline)) void
float_rows_avx512(int64_t n, const uint8_t *w, size_t ws, const float *b, float *out, const int R, const int wt) {
    __m512 s0[4], s1[4];
    for (int r = 0; r < R; r++) s0[r] = s1[r] = _mm512_setzero_ps();
    int64_t i = 0;
    for (; i + 32 <= n; i += 32) {
        __m512 b0 = _mm512_loadu_ps(b + i), b1 = _mm512_loadu_ps(b + i + 16);
        for (int r = 0; r < R; r++) {
            s0[r] = _mm512_fmadd_ps(load16(w + (size_t)r * ws, i, wt), b0, s0[r]);
            s1[r] = _mm512_fmadd_ps(load16(w + (size_t)r * ws, i + 16, wt), b1, s1[r]);
        }
    }
    if (i + 16 <= n) {
        __m512 b0 = _mm512_loadu_ps(b + i);
        for (int r = 0; r < R; r++) s0[r] = _mm512_fmadd_ps(load16(w + (size_t)r * ws, i, wt), b0, s0[r]);
        i += 16;
    }
    for (int r = 0; r < R; r++) {
        float sum = _mm512_reduce_add_ps(_mm512_add_ps(s0[r], s1[r]));
        for (int64_t j = i; j < n; j++) sum += load1(w + (size_t)r * ws, j, wt) * b[j];
        out[r] = sum;
    }
}

#define FLOAT_KERNELS(name, wt)                                                                                        \
    static float name##_vec_dot_avx512(int64_t n, const void *w, const void *act) {                                    \
        float out[1];                                                                                                  \
        float_rows_avx512(n, w, 0, act, out, 1, wt);                                                                   \
        return out[0];                                                                                                 \
    }                                                                                                                  \
    static void name##_vec_dot_x4_avx512(int64_t n, const void *w, size_t ws, const void *act, float out[4]) {         \
        float_rows_avx512(n, w, ws, act, out, 4, wt);                                                                  \
    }
FLOAT_KERNELS(f32, W_F32)
FLOAT_KERNELS(f16, W_F16)
FLOAT_KERNELS(bf16, W_BF16)
#undef FLOAT_KERNELS

/* One Q8_0 block's integer dot with VNNI: dpbusd takes unsigned x signed, so |qa| against qb with
 * qa's sign moved onto it (exact: the sums stay far inside int32). */
static inline __m256i q8_block_dot(const uint8_t *a, const uint8_t *b) {
    __m256i qa = _mm256_loadu_si256((const __m256i *)(a + 2));
    __m256i qb = _mm256_loadu_si256((const __m256i *)(b + 2));
    __m256i ua = _mm256_sign_epi8(qa, qa);
    __m256i sb = _mm256_sign_epi8(qb, qa);
    return _mm256_dpbusd_epi32(_mm256_setzero_si256(), ua, sb);
}

static inline float q8_scale(const uint8_t *a, const uint8_t *b) {
    uint16_t da, db;
    memcpy(&da, a, 2);
    memcpy(&db, b, 2);
    return quant_f16_lut[da] * quant_f16_lut[db];
}

/* [d(p0) x 8 | d(p1) x 8]: the f16 scales at p0 and p1 as floats (vcvtph2ps is exact, like the table). */
static inline __m512 q8_pair_scale(const uint8_t *p0, const uint8_t *p1) {
    uint16_t h0, h1;
    memcpy(&h0, p0, 2);
    memcpy(&h1, p1, 2);
    const __m256i h =
        _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_set1_epi16((short)h0)), _mm_set1_epi16((short)h1), 1);
    return _mm512_cvtph_ps(h);
}

/* R weight rows against one activation row, each with its own accumulators and the same operations:
 * two blocks per step in one 512-bit register (block 2i in the low half, 2i + 1 in the high half), an
 * odd last block in a 256-bit accumulator, the halves added at the end. The integer lanes are exact
 * sums of four products, made with one dpbusd per row: the weights go in unsigned (a + 128) and the
 * accumulator starts at -128 x (the activation's four-value sums, once per step for all rows), so
 * dpbusd(-128 sum b, a + 128, b) = sum a b. Each lane then gets the scale product da * db, a
 * conversion and a fused multiply-add. Instantiated for R = 1 (vec_dot) and R = 4 (vec_dot_x4), so
 * both give bit-identical results per row (and the prompt kernels in quant_legacy_avx512.c make the
 * same lanes). */
static inline __attribute__((always_inline)) void q8_0_rows_avx512(int64_t n, const uint8_t *w, size_t ws,
                                                                   const uint8_t *b, float *out, const int R) {
    const int64_t nb = n / 32;
    const __m512i x80 = _mm512_set1_epi8((char)0x80);
    __m512 acc2[4];
    for (int r = 0; r < R; r++) acc2[r] = _mm512_setzero_ps();
    int64_t i = 0;
    for (; i + 2 <= nb; i += 2) {
        const uint8_t *bb = b + i * 34;
        __m512i qb = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)(bb + 2))),
                                        _mm256_loadu_si256((const __m256i *)(bb + 36)), 1);
        const __m512i zero = _mm512_setzero_si512();
        const __m512i corr = _mm512_sub_epi32(zero, _mm512_dpbusd_epi32(zero, x80, qb));
        const __m512 db = q8_pair_scale(bb, bb + 34);
        for (int r = 0; r < R; r++) {
            const uint8_t *a = w + (size_t)r * ws + i * 34;
            /* the rows four calls ahead (decode streams whole matrices; measured best of 8, 16, 32 rows
             * ahead: decode is bound by memory latency, not instructions): a prefetch past the end of
             * the matrix is a hint that never faults */
            if (R > 1) { /* steps are 68 bytes: two lines each so that no line of the row is skipped */
                _mm_prefetch((const char *)(a + 16 * ws), _MM_HINT_T0);
                _mm_prefetch((const char *)(a + 16 * ws + 64), _MM_HINT_T0);
            }
            __m512i qa = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)(a + 2))),
                                            _mm256_loadu_si256((const __m256i *)(a + 36)), 1);
            const __m512i p = _mm512_dpbusd_epi32(corr, _mm512_xor_si512(qa, x80), qb);
            acc2[r] = _mm512_fmadd_ps(_mm512_mul_ps(q8_pair_scale(a, a + 34), db), _mm512_cvtepi32_ps(p), acc2[r]);
        }
    }
    for (int r = 0; r < R; r++) {
        const uint8_t *a = w + (size_t)r * ws + i * 34, *bb = b + i * 34;
        __m256 acc = _mm256_add_ps(_mm512_castps512_ps256(acc2[r]), _mm512_extractf32x8_ps(acc2[r], 1));
        if (i < nb)
            acc = _mm256_fmadd_ps(_mm256_set1_ps(q8_scale(a, bb)), _mm256_cvtepi32_ps(q8_block_dot(a, bb)), acc);
        __m128 lo = _mm256_castps256_ps128(acc), hi = _mm256_extractf128_ps(acc, 1);
        lo = _mm_add_ps(lo, hi);
        lo = _mm_add_ps(lo, _mm_movehl_ps(lo, lo));
        lo = _mm_add_ss(lo, _mm_movehdup_ps(lo));
        out[r] = _mm_cvtss_f32(lo);
    }
}

static float q8_0_vec_dot_avx512(int64_t n, const void *w, const void *act) {
    float out[1];
    q8_0_rows_avx512(n, w, 0, act, out, 1);
    return out[0];
}

static void q8_0_vec_dot_x4_avx512(int64_t n, const void *w, size_t ws, const void *act, float out[4]) {
    q8_0_rows_avx512(n, w, ws, act, out, 4);
}

void quant_base_avx512(quant_traits t[]) {
    t[STRATA_TYPE_F32].vec_dot = f32_vec_dot_avx512;
    t[STRATA_TYPE_F16].vec_dot = f16_vec_dot_avx512;
    t[STRATA_TYPE_BF16].vec_dot = bf16_vec_dot_avx512;
    quant_set_x4(t, STRATA_TYPE_F32, f32_vec_dot_x4_avx512);
    quant_set_x4(t, STRATA_TYPE_F16, f16_vec_dot_x4_avx512);
    quant_set_x4(t, STRATA_TYPE_BF16, bf16_vec_dot_x4_avx512);
    t[STRATA_TYPE_Q8_0].vec_dot = q8_0_vec_dot_avx512;
    quant_set_x4(t, STRATA_TYPE_Q8_0, q8_0_vec_dot_x4_avx512);
}
