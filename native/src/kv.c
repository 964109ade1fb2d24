/*
 * kv.c — the key/value cache (see kv.h). Values are rounded to the storage type once, when stored,
 * so a position reads back the same whether it was written by a prompt chunk or by a decode step.
 *
 *   f16   one half per value: row = [n] u16
 *   int8  one signed byte per value and one f32 scale per block of 32 values of a head:
 *         row = [n] i8 then [n / 32] f32; value = q * scale, scale = max|x| / 127 over the block,
 *         q = round-to-nearest(x / scale). Blocks never straddle heads (head_dim % 32 == 0).
 *         Reads keep the f16 kernels' order: 8 partial sums by index mod 8, combined pairwise.
 */
#include "kv.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "quant.h"
#include "strata.h"

#define KV_BLOCK 32

static int64_t row_bytes(int32_t type, int32_t n_head_kv, int32_t head_dim) {
    int64_t n = (int64_t)n_head_kv * head_dim;
    switch (type) {
    case STRATA_KV_F16: return n * 2;
    case STRATA_KV_INT8: return head_dim % KV_BLOCK ? -1 : n + n / KV_BLOCK * 4;
    default: return -1;
    }
}

int64_t kv_bytes(int32_t type, int32_t n_layer, int32_t n_ctx, int32_t n_head_kv, int32_t head_dim) {
    int64_t rb = row_bytes(type, n_head_kv, head_dim);
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

strata_status kv_init(kv_cache *kv, int32_t type, int32_t n_layer, int32_t n_ctx, int32_t n_head_kv, int32_t head_dim,
                      int32_t simd, errbuf *err) {
    memset(kv, 0, sizeof *kv);
    int64_t rb = row_bytes(type, n_head_kv, head_dim);
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

/* ---- int8 rows: the scales of a row start after its n bytes of values ---------------------------- */

static inline const float *i8_scales(const uint8_t *row, int32_t n) { return (const float *)(const void *)(row + n); }

static void store_i8(uint8_t *row, const float *x, int32_t n) {
    int8_t *q = (int8_t *)row;
    float *sc = (float *)(void *)(row + n);
    for (int32_t b = 0; b < n / KV_BLOCK; b++) {
        const float *xb = x + (int64_t)b * KV_BLOCK;
        float amax = 0.0f;
        for (int i = 0; i < KV_BLOCK; i++) amax = fabsf(xb[i]) > amax ? fabsf(xb[i]) : amax;
        float s = amax / 127.0f;
        float inv = s > 0.0f ? 1.0f / s : 0.0f;
        for (int i = 0; i < KV_BLOCK; i++) {
            float r = nearbyintf(xb[i] * inv);
            q[b * KV_BLOCK + i] = (int8_t)(r > 127.0f ? 127 : r < -127.0f ? -127 : r);
        }
        sc[b] = s;
    }
}

static float dot_i8(int32_t d, const int8_t *kq, const float *sc, const float *q) {
    float acc[8] = {0};
    for (int32_t i = 0; i < d; i += 8) {
        float s = sc[i / KV_BLOCK];
        for (int j = 0; j < 8; j++) acc[j] += ((float)kq[i + j] * s) * q[i + j];
    }
    return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
}

static void axpy_i8(int32_t d, float a, const int8_t *vq, const float *sc, float *out) {
    for (int32_t i = 0; i < d; i++) out[i] += a * ((float)vq[i] * sc[i / KV_BLOCK]);
}

/* ---- store and read ------------------------------------------------------------------------------ */

void kv_store(kv_cache *kv, int32_t layer, int32_t pos, const float *k, const float *v) {
    int32_t n = kv->n_head_kv * kv->head_dim;
    if (kv->type == STRATA_KV_INT8) {
        store_i8(kv->k + row_off(kv, layer, pos), k, n);
        store_i8(kv->v + row_off(kv, layer, pos), v, n);
        return;
    }
    uint16_t *kr = (uint16_t *)(kv->k + row_off(kv, layer, pos));
    uint16_t *vr = (uint16_t *)(kv->v + row_off(kv, layer, pos));
    for (int32_t i = 0; i < n; i++) {
        kr[i] = strata_f32_to_f16(k[i]);
        vr[i] = strata_f32_to_f16(v[i]);
    }
}

float kv_dot_k(const kv_cache *kv, int32_t layer, int32_t pos, int32_t head, const float *q) {
    if (kv->type == STRATA_KV_INT8) {
        const uint8_t *row = kv->k + row_off(kv, layer, pos);
        return dot_i8(kv->head_dim, (const int8_t *)row + (size_t)head * kv->head_dim,
                      i8_scales(row, kv->n_head_kv * kv->head_dim) + (size_t)head * kv->head_dim / KV_BLOCK, q);
    }
    const uint16_t *kr = (const uint16_t *)(kv->k + row_off(kv, layer, pos)) + (size_t)head * kv->head_dim;
    return kv->kern.dot_f16(kv->head_dim, kr, q);
}

void kv_acc_v(const kv_cache *kv, int32_t layer, int32_t pos, int32_t head, float p, float *out) {
    if (kv->type == STRATA_KV_INT8) {
        const uint8_t *row = kv->v + row_off(kv, layer, pos);
        axpy_i8(kv->head_dim, p, (const int8_t *)row + (size_t)head * kv->head_dim,
                i8_scales(row, kv->n_head_kv * kv->head_dim) + (size_t)head * kv->head_dim / KV_BLOCK, out);
        return;
    }
    const uint16_t *vr = (const uint16_t *)(kv->v + row_off(kv, layer, pos)) + (size_t)head * kv->head_dim;
    kv->kern.axpy_f16(kv->head_dim, p, vr, out);
}
