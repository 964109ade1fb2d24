/*
 * kv.h — the key/value cache: per layer, per position, the keys and values of every KV head.
 *
 * Layout (kv_layout, arch.h: a property of the attention kind): k is [n_layer, n_ctx, n_head_kv * k_dim] and
 * v [n_layer, n_ctx, n_head_kv * v_dim] rows of the cache type; when v_in_k there is no v, and a head's
 * values are the first v_dim of its key row (MLA: one row of the normalized latent and the roped k_pe per
 * position, read as key by every head and, its latent part, as value). The attention reads them only
 * through kv_dot_k and kv_acc_v, so that another storage type (int8 with a scale per
 * block) is a change to this file alone: add the type to kv_row_bytes, kv_store, kv_dot_k and kv_acc_v.
 */
#ifndef STRATA_KV_H
#define STRATA_KV_H

#include <stddef.h>
#include <stdint.h>

#include "arch.h"
#include "error.h"

/* f16 row kernels of one SIMD level (scalar in kv.c, AVX2 in cpu/kv_avx2.c). Their reduction order
 * depends on n alone. */
typedef struct kv_kernels {
    float (*dot_f16)(int32_t n, const uint16_t *k, const float *q);      /* sum k[i] * q[i] */
    void (*axpy_f16)(int32_t n, float a, const uint16_t *v, float *out); /* out[i] += a * v[i] */
} kv_kernels;

/* AVX2 + F16C versions (cpu/kv_avx2.c). */
void kv_kernels_avx2(kv_kernels *k);

typedef struct kv_cache {
    int32_t type; /* strata_kv_type */
    int32_t n_layer;
    int32_t n_ctx; /* positions held */
    int32_t n_head_kv;
    int32_t head_dim;   /* k_dim: key values of a head */
    int32_t v_dim;      /* value values of a head */
    int32_t v_in_k;     /* values read from the key rows (no v) */
    size_t row_bytes;   /* bytes of one position's K of one layer: n_head_kv * head_dim values */
    size_t v_row_bytes; /* bytes of one position's V of one layer (0 when v_in_k) */
    uint8_t *k;         /* [n_layer, n_ctx, row_bytes] */
    uint8_t *v;         /* [n_layer, n_ctx, v_row_bytes], NULL when v_in_k */
    kv_kernels kern;  /* of the engine's SIMD level */
} kv_cache;

/* Bytes the cache needs (what the layout stores: K and V, or K alone), or -1 for a type that cannot hold it. */
int64_t kv_bytes(int32_t type, int32_t n_layer, int32_t n_ctx, const kv_layout *lay);
strata_status kv_init(kv_cache *kv, int32_t type, int32_t n_layer, int32_t n_ctx, const kv_layout *lay, int32_t simd,
                      errbuf *err);
void kv_free(kv_cache *kv);
/* Store one position's keys and values: k[n_head_kv * head_dim], v[n_head_kv * v_dim] (ignored when v_in_k). */
void kv_store(kv_cache *kv, int32_t layer, int32_t pos, const float *k, const float *v);
/* q[head_dim] . K[layer, pos, head] */
float kv_dot_k(const kv_cache *kv, int32_t layer, int32_t pos, int32_t head, const float *q);
/* out[v_dim] += p * V[layer, pos, head] */
void kv_acc_v(const kv_cache *kv, int32_t layer, int32_t pos, int32_t head, float p, float *out);

#endif
