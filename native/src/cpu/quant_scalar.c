/*
 * quant_scalar.c — portable kernels of the base types: F32, F16, BF16 and Q8_0.
 *
 * Float weights (F32, F16, BF16) are dotted against F32 activations; Q8_0 weights against
 * activations quantized to Q8_0 per row (one f16 scale per 32 values), as the engine does for every
 * token. Reduction orders: the float dots keep 8 partial sums, lane i taking the elements i mod 8,
 * combined pairwise at the end; Q8_0 sums each block exactly in integers and adds the blocks in
 * order into one float. Both orders depend on n alone.
 */
#include <math.h>
#include <string.h>

#include "common.h"
#include "quant.h"
#include "strata.h"

/* ---- block layout ------------------------------------------------------------------------------ */

#define QK8_0 32
typedef struct {
    uint16_t d;       /* f16 scale */
    int8_t qs[QK8_0]; /* values = d * qs */
} block_q8_0;
_Static_assert(sizeof(block_q8_0) == 34, "Q8_0 block is 34 bytes in GGUF");

/* ---- helpers ----------------------------------------------------------------------------------- */

static inline float sum8(const float acc[8]) {
    return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
}

/* ---- F32 --------------------------------------------------------------------------------------- */

static void f32_dequant(const void *src, float *dst, int64_t n) { memcpy(dst, src, (size_t)n * sizeof(float)); }

static void f32_quantize_act(const float *x, void *dst, int64_t n) { memcpy(dst, x, (size_t)n * sizeof(float)); }

static float f32_vec_dot(int64_t n, const void *w, const void *act) {
    const float *a = w, *b = act;
    float acc[8] = {0};
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int j = 0; j < 8; j++) acc[j] += a[i + j] * b[i + j];
    for (int j = 0; i < n; i++, j++) acc[j] += a[i] * b[i];
    return sum8(acc);
}

/* ---- F16 --------------------------------------------------------------------------------------- */

static void f16_dequant(const void *src, float *dst, int64_t n) {
    const uint16_t *h = src;
    for (int64_t i = 0; i < n; i++) dst[i] = quant_f16_lut[h[i]];
}

static float f16_vec_dot(int64_t n, const void *w, const void *act) {
    const uint16_t *a = w;
    const float *b = act;
    float acc[8] = {0};
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int j = 0; j < 8; j++) acc[j] += quant_f16_lut[a[i + j]] * b[i + j];
    for (int j = 0; i < n; i++, j++) acc[j] += quant_f16_lut[a[i]] * b[i];
    return sum8(acc);
}

/* ---- BF16 -------------------------------------------------------------------------------------- */

static void bf16_dequant(const void *src, float *dst, int64_t n) {
    const uint16_t *h = src;
    for (int64_t i = 0; i < n; i++) dst[i] = strata_bf16_to_f32(h[i]);
}

static float bf16_vec_dot(int64_t n, const void *w, const void *act) {
    const uint16_t *a = w;
    const float *b = act;
    float acc[8] = {0};
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int j = 0; j < 8; j++) acc[j] += strata_bf16_to_f32(a[i + j]) * b[i + j];
    for (int j = 0; i < n; i++, j++) acc[j] += strata_bf16_to_f32(a[i]) * b[i];
    return sum8(acc);
}

/* ---- Q8_0 -------------------------------------------------------------------------------------- */

static void q8_0_dequant(const void *src, float *dst, int64_t n) {
    const block_q8_0 *b = src;
    for (int64_t i = 0; i < n / QK8_0; i++) {
        float d = quant_f16_lut[b[i].d];
        for (int j = 0; j < QK8_0; j++) dst[i * QK8_0 + j] = d * (float)b[i].qs[j];
    }
}

/* Activations: scale = max|x| / 127 per block, values rounded to nearest (ties away from zero). */
static void q8_0_quantize_act(const float *x, void *dst, int64_t n) {
    block_q8_0 *b = dst;
    for (int64_t i = 0; i < n / QK8_0; i++) {
        const float *xb = x + i * QK8_0;
        float amax = 0.0f;
        for (int j = 0; j < QK8_0; j++) amax = fmaxf(amax, fabsf(xb[j]));
        float d = amax / 127.0f;
        float id = d != 0.0f ? 1.0f / d : 0.0f;
        b[i].d = strata_f32_to_f16(d);
        for (int j = 0; j < QK8_0; j++) b[i].qs[j] = (int8_t)roundf(xb[j] * id);
    }
}

static float q8_0_vec_dot(int64_t n, const void *w, const void *act) {
    const block_q8_0 *a = w, *b = act;
    float sum = 0.0f;
    for (int64_t i = 0; i < n / QK8_0; i++) {
        int32_t s = 0;
        for (int j = 0; j < QK8_0; j++) s += (int32_t)a[i].qs[j] * (int32_t)b[i].qs[j];
        sum += (quant_f16_lut[a[i].d] * quant_f16_lut[b[i].d]) * (float)s;
    }
    return sum;
}

/* ---- registration ------------------------------------------------------------------------------ */

void quant_register_base(quant_traits t[], int32_t simd) {
    t[STRATA_TYPE_F32] =
        (quant_traits){"F32", STRATA_TYPE_F32, 1, 4, STRATA_TYPE_F32, f32_dequant, f32_quantize_act, f32_vec_dot};
    t[STRATA_TYPE_F16] = (quant_traits){"F16", STRATA_TYPE_F16, 1, 2, STRATA_TYPE_F32, f16_dequant, NULL, f16_vec_dot};
    t[STRATA_TYPE_BF16] =
        (quant_traits){"BF16", STRATA_TYPE_BF16, 1, 2, STRATA_TYPE_F32, bf16_dequant, NULL, bf16_vec_dot};
    t[STRATA_TYPE_Q8_0] = (quant_traits){"Q8_0",       STRATA_TYPE_Q8_0,  QK8_0,       34, STRATA_TYPE_Q8_0,
                                         q8_0_dequant, q8_0_quantize_act, q8_0_vec_dot};
    if (simd >= STRATA_SIMD_AVX2) quant_base_avx2(t);
    if (simd >= STRATA_SIMD_AVX512) quant_base_avx512(t);
}
