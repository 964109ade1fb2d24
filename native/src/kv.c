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

/* Bytes of one position's K and V rows of one layer (V: 0 when read from K), or -1. */
static int64_t pos_bytes(int32_t type, const kv_layout *lay, int64_t *kb, int64_t *vb) {
    *kb = row_bytes(type, lay->n_head_kv, lay->k_dim);
    *vb = lay->v_in_k ? 0 : row_bytes(type, lay->n_head_kv, lay->v_dim);
    /* int8 values read from a key row use its blocks' scales: they must end on a block */
    if (lay->v_in_k && (lay->v_dim > lay->k_dim || (type == STRATA_KV_INT8 && lay->v_dim % KV_BLOCK))) return -1;
    if (*kb < 0 || *vb < 0) return -1;
    return *kb + *vb;
}

int64_t kv_bytes(int32_t type, int32_t n_layer, int32_t n_ctx, const kv_layout *lay) {
    int64_t kb, vb, pb = pos_bytes(type, lay, &kb, &vb);
    if (pb < 0) return -1;
    return pb * n_layer * (int64_t)n_ctx;
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

strata_status kv_init(kv_cache *kv, int32_t type, int32_t n_layer, int32_t n_ctx, const kv_layout *lay, int32_t simd,
                      errbuf *err) {
    memset(kv, 0, sizeof *kv);
    int64_t rb, vb;
    if (pos_bytes(type, lay, &rb, &vb) < 0)
        return err_set(err, STRATA_ERR_UNSUPPORTED, "KV cache type %d cannot hold this model's keys and values (use --kv f16)",
                       type);
    size_t total = (size_t)rb * (size_t)n_layer * (size_t)n_ctx, vtotal = (size_t)vb * (size_t)n_layer * (size_t)n_ctx;
    kv->k = malloc(total ? total : 1);
    if (!lay->v_in_k) kv->v = malloc(vtotal ? vtotal : 1);
    if (!kv->k || (!lay->v_in_k && !kv->v)) {
        kv_free(kv);
        return err_set(err, STRATA_ERR_OUT_OF_MEMORY,
                       "out of host memory for the KV cache (%zu MiB for %d tokens); lower --max-context",
                       (total + vtotal) >> 20, n_ctx);
    }
    kv->type = type;
    kv->n_layer = n_layer;
    kv->n_ctx = n_ctx;
    kv->n_head_kv = lay->n_head_kv;
    kv->head_dim = lay->k_dim;
    kv->v_dim = lay->v_dim;
    kv->v_in_k = lay->v_in_k;
    kv->row_bytes = (size_t)rb;
    kv->v_row_bytes = (size_t)vb;
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

/* The V row of a position (the K row when values are read from it) and the bytes of a head in it. */
static inline const uint8_t *v_row(const kv_cache *kv, int32_t layer, int32_t pos) {
    if (kv->v_in_k) return kv->k + row_off(kv, layer, pos);
    return kv->v + ((size_t)layer * (size_t)kv->n_ctx + (size_t)pos) * kv->v_row_bytes;
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
    const int32_t n = kv->n_head_kv * kv->head_dim, nv = kv->n_head_kv * kv->v_dim;
    uint8_t *vrow = kv->v_in_k ? NULL : (uint8_t *)v_row(kv, layer, pos);
    if (kv->type == STRATA_KV_INT8) {
        store_i8(kv->k + row_off(kv, layer, pos), k, n);
        if (vrow) store_i8(vrow, v, nv);
        return;
    }
    uint16_t *kr = (uint16_t *)(kv->k + row_off(kv, layer, pos));
    for (int32_t i = 0; i < n; i++) kr[i] = strata_f32_to_f16(k[i]);
    if (vrow)
        for (int32_t i = 0; i < nv; i++) ((uint16_t *)(void *)vrow)[i] = strata_f32_to_f16(v[i]);
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
    const uint8_t *row = v_row(kv, layer, pos);
    /* a head's stride in its row: v_dim in a V row, the key dim when values are read from the K row */
    const int32_t hs = kv->v_in_k ? kv->head_dim : kv->v_dim;
    if (kv->type == STRATA_KV_INT8) {
        axpy_i8(kv->v_dim, p, (const int8_t *)row + (size_t)head * hs,
                i8_scales(row, kv->n_head_kv * hs) + (size_t)head * hs / KV_BLOCK, out);
        return;
    }
    const uint16_t *vr = (const uint16_t *)(const void *)row + (size_t)head * hs;
    kv->kern.axpy_f16(kv->v_dim, p, vr, out);
}
