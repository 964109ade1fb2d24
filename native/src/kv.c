/*
 * kv.c — the key/value cache (see kv.h). F16 storage: values are rounded to half precision once,
 * when stored, so a position reads back the same whether it was written by a prompt chunk or by a
 * decode step.
 */
#include "kv.h"

#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "quant.h"
#include "strata.h"

static int64_t row_bytes(int32_t type, int32_t n) {
    switch (type) {
    case STRATA_KV_F16: return (int64_t)n * 2;
    default: return -1;
    }
}

int64_t kv_bytes(int32_t type, int32_t n_layer, int32_t n_ctx, int32_t n_head_kv, int32_t head_dim) {
    int64_t rb = row_bytes(type, n_head_kv * head_dim);
    if (rb < 0) return -1;
    return 2 * rb * n_layer * (int64_t)n_ctx;
}

/* Scalar kernels: 8 partial sums by index mod 8, combined pairwise. */
static float dot_f16_scalar(int32_t n, const uint16_t *k, const float *q) {
    float acc[8] = {0};
    int32_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int j = 0; j < 8; j++) acc[j] += quant_f16_lut[k[i + j]] * q[i + j];
    for (int j = 0; i < n; i++, j++) acc[j] += quant_f16_lut[k[i]] * q[i];
    return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
}

static void axpy_f16_scalar(int32_t n, float a, const uint16_t *v, float *out) {
    for (int32_t i = 0; i < n; i++) out[i] += a * quant_f16_lut[v[i]];
}

strata_status kv_init(kv_cache *kv, int32_t type, int32_t n_layer, int32_t n_ctx, int32_t n_head_kv,
                      int32_t head_dim, int32_t simd, errbuf *err) {
    memset(kv, 0, sizeof *kv);
    int64_t rb = row_bytes(type, n_head_kv * head_dim);
    if (rb < 0)
        return err_set(err, STRATA_ERR_UNSUPPORTED, "KV cache type %d is not supported by this build (use --kv f16)",
                       type);
    size_t total = (size_t)rb * (size_t)n_layer * (size_t)n_ctx;
    kv->k = malloc(total ? total : 1);
    kv->v = malloc(total ? total : 1);
    if (!kv->k || !kv->v) {
        kv_free(kv);
        return err_set(err, STRATA_ERR_OUT_OF_MEMORY,
                       "out of host memory for the KV cache (%zu MiB for %d tokens); lower --max-context",
                       2 * total >> 20, n_ctx);
    }
    kv->type = type;
    kv->n_layer = n_layer;
    kv->n_ctx = n_ctx;
    kv->n_head_kv = n_head_kv;
    kv->head_dim = head_dim;
    kv->row_bytes = (size_t)rb;
    kv->kern = (kv_kernels){dot_f16_scalar, axpy_f16_scalar};
    if (simd >= STRATA_SIMD_AVX2) kv_kernels_avx2(&kv->kern);
    return STRATA_OK;
}

void kv_free(kv_cache *kv) {
    free(kv->k);
    free(kv->v);
    memset(kv, 0, sizeof *kv);
}

static inline size_t row_off(const kv_cache *kv, int32_t layer, int32_t pos) {
    return ((size_t)layer * (size_t)kv->n_ctx + (size_t)pos) * kv->row_bytes;
}

void kv_store(kv_cache *kv, int32_t layer, int32_t pos, const float *k, const float *v) {
    int32_t n = kv->n_head_kv * kv->head_dim;
    uint16_t *kr = (uint16_t *)(kv->k + row_off(kv, layer, pos));
    uint16_t *vr = (uint16_t *)(kv->v + row_off(kv, layer, pos));
    for (int32_t i = 0; i < n; i++) {
        kr[i] = strata_f32_to_f16(k[i]);
        vr[i] = strata_f32_to_f16(v[i]);
    }
}

float kv_dot_k(const kv_cache *kv, int32_t layer, int32_t pos, int32_t head, const float *q) {
    const uint16_t *kr = (const uint16_t *)(kv->k + row_off(kv, layer, pos)) + (size_t)head * kv->head_dim;
    return kv->kern.dot_f16(kv->head_dim, kr, q);
}

void kv_acc_v(const kv_cache *kv, int32_t layer, int32_t pos, int32_t head, float p, float *out) {
    const uint16_t *vr = (const uint16_t *)(kv->v + row_off(kv, layer, pos)) + (size_t)head * kv->head_dim;
    kv->kern.axpy_f16(kv->head_dim, p, vr, out);
}
