/*
 * attn.h — causal attention over an f16 KV cache, tiled: several queries of one KV head against
 * tiles of 16 positions (cpu/attn_avx512.c, and the same algorithm on 8-lane vectors in cpu/attn_avx2.c).
 *
 * A work item is one KV head and a block of tokens; its queries are the G heads that read that KV
 * head, for every token of the block. The K and V rows of a tile are converted to f32 once and read
 * by all those queries. Each query keeps its own online softmax (running max m, running sum l, the
 * weighted sum of V rows in f32), updated tile by tile over the fixed grid of tiles 0, 16, 32, ...
 * up to its own position (from the tile holding its window's first position, on a sliding layer; a sink
 * logit joins the final denominator). So one query's result depends on its q and the cache alone: the same
 * bits whether it was decoded alone or read as part of a chunk, whichever thread ran it.
 */
#ifndef STRATA_CPU_ATTN_H
#define STRATA_CPU_ATTN_H

#include <stddef.h>
#include <stdint.h>

typedef struct attn_tile_job {
    const float *q;        /* [T, H * hd] queries (normed, rotated) of the chunk */
    float *out;            /* [T, H * hd] attention output */
    const uint8_t *k, *v;  /* this layer's f16 cache rows: position p at k + p * row_bytes */
    size_t row_bytes;      /* bytes of one position (all KV heads) */
    int32_t hd;            /* head dim: 32, 64 or 128 (attn_f16_tiled_supported) */
    int32_t n_head;        /* H */
    int32_t group;         /* G = H / H_kv: heads per KV head */
    int32_t pos0;          /* position of token 0 of the chunk */
    float scale;           /* 1 / sqrt(hd) */
    const float *sinks;    /* [n_head] or NULL: each head's sink logit, in the softmax's denominator only */
    int32_t window;        /* 0, or a query at position p sees positions p - window + 1 .. p (sliding layers) */
} attn_tile_job;

/* 1 when the tiled kernel handles head dim hd. */
int attn_f16_tiled_supported(int32_t hd);
/* Every query of tokens t0 .. t1 - 1 of KV head kvh; needs the AVX-512 level. */
void attn_f16_tiled_avx512(const attn_tile_job *j, int32_t kvh, int32_t t0, int32_t t1);
/* dst[n] = src[n] as f16, rounded to nearest even (vcvtps2ph): the bits of strata_f32_to_f16 for
 * every value but NaN payloads. The tiled path stores its cache rows with it. */
void attn_store_f16_avx512(uint16_t *dst, const float *src, int32_t n);
/* The same on AVX2 + FMA + F16C (cpu/attn_avx2.c): its own bits, as fixed per query as the AVX-512 one's. */
void attn_f16_tiled_avx2(const attn_tile_job *j, int32_t kvh, int32_t t0, int32_t t1);
/* attn_store_f16_avx512's conversion with F16C (vcvtps2ph, nearest even). */
void attn_store_f16_avx2(uint16_t *dst, const float *src, int32_t n);
/* Queries (heads x tokens) a work item should hold: the tile's conversion is shared by them. */
#define ATTN_ITEM_QUERIES 32

#endif
