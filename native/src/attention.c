/*
 * attention.c — the attention block of qwen3moe for a chunk of T tokens (T = 1 when decoding).
 *
 *   xn = rmsnorm(x) * attn_norm                     [T, D]
 *   q, k, v = xn Wq^T, xn Wk^T, xn Wv^T             [T, QD], [T, KD], [T, KD]
 *   per head: q = rmsnorm(q) * q_norm, k = rmsnorm(k) * k_norm, then RoPE (NeoX: pairs (i, i + hd/2))
 *   K, V appended to the cache at positions pos0 .. pos0 + T - 1
 *   per (token, head): softmax(q . K[0..pos] / sqrt(hd)) . V[0..pos]   (causal; GQA: head h reads KV
 *   head h / (n_head / n_head_kv))
 *   x += att Wo^T
 *
 * Every query row reads its keys back from the cache, so a token sees the same (f16-rounded) keys
 * whether it was part of a chunk or decoded alone: this is what keeps logits identical across chunkings.
 */
#include <math.h>
#include <string.h>

#include "cpu/attn.h"
#include "engine_internal.h"
#include "matmul.h"

/* ---- RoPE -------------------------------------------------------------------------------------- */

/* The rotation frequencies theta^(-2i/hd), i < hd/2, in double (the same for every position). */
static void rope_freqs(double *f, int32_t hd, float theta) {
    for (int32_t i = 0; i < hd / 2; i++) f[i] = pow((double)theta, -2.0 * (double)i / (double)hd);
}

/* The rotation of one position: cs[i] = cos, cs[half + i] = sin of pos * f[i], computed in double
 * so that long positions keep their precision. */
static void rope_angles(float *cs, int32_t hd, int32_t pos, const double *f) {
    int32_t half = hd / 2;
    for (int32_t i = 0; i < half; i++) {
        double ang = (double)pos * f[i];
        cs[i] = (float)cos(ang);
        cs[half + i] = (float)sin(ang);
    }
}

/* NeoX layout: element i pairs with element i + hd/2 (not with its neighbour). */
static void rope_neox(float *v, int32_t hd, const float *cs) {
    int32_t half = hd / 2;
    for (int32_t i = 0; i < half; i++) {
        float c = cs[i], s = cs[half + i];
        float x0 = v[i], x1 = v[i + half];
        v[i] = x0 * c - x1 * s;
        v[i + half] = x0 * s + x1 * c;
    }
}

/* ---- attention over the cache ------------------------------------------------------------------ */

typedef struct att_job {
    strata_engine *e;
    int32_t layer, T, pos0;
} att_job;

/* One (token, head): scores over positions 0..pos in order, max-subtracted softmax, weighted sum. */
static void att_item(void *ctx, int64_t item, int thread) {
    const att_job *j = ctx;
    strata_engine *e = j->e;
    const hparams *hp = &e->hp;
    const int32_t hd = hp->head_dim, H = hp->n_head;
    int32_t t = (int32_t)(item / H), h = (int32_t)(item % H);
    int32_t kvh = h / (H / hp->n_head_kv);
    int32_t pos = j->pos0 + t;
    const float *q = e->md->cb.q + (int64_t)t * H * hd + (int64_t)h * hd;
    float *out = e->md->cb.att + (int64_t)t * H * hd + (int64_t)h * hd;
    float *sc = e->md->cb.scores + (int64_t)thread * e->n_ctx; /* [pos + 1] */
    const float scale = 1.0f / sqrtf((float)hd);
    float mx = -INFINITY;
    for (int32_t p = 0; p <= pos; p++) {
        sc[p] = kv_dot_k(&e->kv, j->layer, p, kvh, q) * scale;
        if (sc[p] > mx) mx = sc[p];
    }
    float sum = 0.0f;
    for (int32_t p = 0; p <= pos; p++) {
        sc[p] = expf(sc[p] - mx);
        sum += sc[p];
    }
    memset(out, 0, sizeof(float) * (size_t)hd);
    float inv = 1.0f / sum;
    for (int32_t p = 0; p <= pos; p++) kv_acc_v(&e->kv, j->layer, p, kvh, sc[p] * inv, out);
}

/* The tiled kernel (cpu/attn_avx512.c): an item is one KV head and a block of tokens, the blocks
 * handed out last token first so that the longest (causal) items start early. */
typedef struct att_tiled_ctx {
    attn_tile_job job;
    int32_t T, n_head_kv, tokens_per_item, n_blocks;
} att_tiled_ctx;

static void att_tiled_item(void *ctx, int64_t item, int thread) {
    (void)thread;
    const att_tiled_ctx *c = ctx;
    const int32_t kvh = (int32_t)(item % c->n_head_kv);
    const int32_t blk = c->n_blocks - 1 - (int32_t)(item / c->n_head_kv);
    const int32_t t0 = blk * c->tokens_per_item;
    const int32_t t1 = t0 + c->tokens_per_item < c->T ? t0 + c->tokens_per_item : c->T;
    attn_f16_tiled_avx512(&c->job, kvh, t0, t1);
}

/* 1 when this engine runs the tiled kernel: AVX-512 level, f16 cache, a head dim it handles. The
 * choice depends on the engine's configuration alone, so decode and prefill always agree. */
static int att_use_tiled(const strata_engine *e) {
    return e->kv.type == STRATA_KV_F16 && attn_f16_tiled_supported(e->hp.head_dim) &&
           quant_simd_supported(STRATA_SIMD_AVX512) && e->qt == quant_table(STRATA_SIMD_AVX512);
}

/* ---- per-token steps, split over the pool by blocks of tokens ----------------------------------- */

/* What each token's step does; every token is independent, so the split changes no result. */
enum { TOK_NORM_QUANT, TOK_ROPE_STORE, TOK_QUANT_ATT, TOK_RESIDUAL };
#define TOK_BLOCK 16
#define ROPE_MAX_HD 512

typedef struct tok_job {
    strata_engine *e;
    int32_t l, T, pos0, step;
    int32_t wtype; /* the weight type the activations are quantized for */
    int tiled;     /* att_use_tiled: the cache rows are stored by the AVX-512 converter */
} tok_job;

static void tok_item(void *ctx, int64_t item, int thread) {
    (void)thread;
    const tok_job *j = ctx;
    strata_engine *e = j->e;
    const hparams *hp = &e->hp;
    const layer_weights *L = &e->w.layers[j->l];
    chunk_buffers *cb = &e->md->cb;
    const int32_t D = hp->n_embd, hd = hp->head_dim, H = hp->n_head, HKV = hp->n_head_kv;
    const int64_t QD = (int64_t)H * hd, KD = (int64_t)HKV * hd;
    const int32_t t0 = (int32_t)item * TOK_BLOCK, t1 = t0 + TOK_BLOCK < j->T ? t0 + TOK_BLOCK : j->T, n = t1 - t0;
    switch (j->step) {
    case TOK_NORM_QUANT:
        rmsnorm_rows(cb->xn + (int64_t)t0 * D, cb->x + (int64_t)t0 * D, L->attn_norm, n, D, hp->rms_eps);
        mm_quantize(e->qt, j->wtype, cb->xn + (int64_t)t0 * D, D, n, D, cb->act + (size_t)t0 * cb->act_stride,
                    cb->act_stride);
        break;
    case TOK_ROPE_STORE: {
        /* per-head norms and RoPE, then append to the cache */
        float cs[ROPE_MAX_HD];         /* [hd] this token's rotation */
        double freq[ROPE_MAX_HD / 2];  /* [hd / 2] */
        rope_freqs(freq, hd, hp->rope_theta);
        for (int32_t t = t0; t < t1; t++) {
            int32_t pos = j->pos0 + t;
            rope_angles(cs, hd, pos, freq);
            for (int32_t h = 0; h < H; h++) {
                float *qh = cb->q + t * QD + (int64_t)h * hd;
                rmsnorm_rows(qh, qh, L->q_norm, 1, hd, hp->rms_eps);
                rope_neox(qh, hd, cs);
            }
            for (int32_t h = 0; h < HKV; h++) {
                float *kh = cb->k + t * KD + (int64_t)h * hd;
                rmsnorm_rows(kh, kh, L->k_norm, 1, hd, hp->rms_eps);
                rope_neox(kh, hd, cs);
            }
            if (j->tiled) { /* the same row layout as kv_store, converted 16 values at a time */
                const size_t off = ((size_t)j->l * (size_t)e->kv.n_ctx + (size_t)pos) * e->kv.row_bytes;
                attn_store_f16_avx512((uint16_t *)(void *)(e->kv.k + off), cb->k + t * KD, (int32_t)KD);
                attn_store_f16_avx512((uint16_t *)(void *)(e->kv.v + off), cb->v + t * KD, (int32_t)KD);
            } else {
                kv_store(&e->kv, j->l, pos, cb->k + t * KD, cb->v + t * KD);
            }
        }
        break;
    }
    case TOK_QUANT_ATT:
        mm_quantize(e->qt, j->wtype, cb->att + (int64_t)t0 * QD, QD, n, QD, cb->act + (size_t)t0 * cb->act_stride,
                    cb->act_stride);
        break;
    case TOK_RESIDUAL:
        for (int64_t i = (int64_t)t0 * D; i < (int64_t)t1 * D; i++) cb->x[i] += cb->o[i];
        break;
    }
}


static void tok_run(strata_engine *e, int32_t l, int32_t T, int32_t pos0, int32_t step, int32_t wtype) {
    tok_job j = {e, l, T, pos0, step, wtype, att_use_tiled(e)};
    pool_run(e->pool, (T + TOK_BLOCK - 1) / TOK_BLOCK, tok_item, &j);
}

/* ---- the block --------------------------------------------------------------------------------- */

strata_status attention_block(strata_engine *e, int32_t l, int32_t T, int32_t pos0) {
    const hparams *hp = &e->hp;
    const layer_weights *L = &e->w.layers[l];
    chunk_buffers *cb = &e->md->cb;
    const int32_t D = hp->n_embd, hd = hp->head_dim, H = hp->n_head, HKV = hp->n_head_kv;
    const int64_t QD = (int64_t)H * hd, KD = (int64_t)HKV * hd;
    STRATA_ASSERT(&e->err, T <= cb->cap && pos0 + T <= e->n_ctx);

    STRATA_ASSERT(&e->err, hd <= ROPE_MAX_HD);

    /* q, k, v: one job when they share an activation type (the usual case), else one each. */
    const wview *W[3] = {&L->wq, &L->wk, &L->wv};
    float *Y[3] = {cb->q, cb->k, cb->v};
    int64_t LD[3] = {QD, KD, KD};
    int same = quant_lookup(e->qt, L->wq.type)->act_type == quant_lookup(e->qt, L->wk.type)->act_type &&
               quant_lookup(e->qt, L->wq.type)->act_type == quant_lookup(e->qt, L->wv.type)->act_type;
    mm_seg segs[3];
    tok_run(e, l, T, pos0, TOK_NORM_QUANT, W[0]->type); /* xn = rmsnorm(x), quantized for wq */
    for (int i = 0; i < 3; i++) {
        if (i > 0 && !same) mm_quantize(e->qt, W[i]->type, cb->xn, D, T, D, cb->act, cb->act_stride);
        segs[i] = (mm_seg){quant_lookup(e->qt, W[i]->type), *W[i], cb->act, cb->act_stride, NULL, T, Y[i], LD[i], NULL};
        if (!same) mm_run(e->pool, &segs[i], 1);
    }
    if (same) mm_run(e->pool, segs, 3);

    tok_run(e, l, T, pos0, TOK_ROPE_STORE, 0);

    if (att_use_tiled(e)) {
        const int32_t G = H / HKV;
        att_tiled_ctx c;
        c.job = (attn_tile_job){cb->q, cb->att, e->kv.k + (size_t)l * (size_t)e->kv.n_ctx * e->kv.row_bytes,
                                e->kv.v + (size_t)l * (size_t)e->kv.n_ctx * e->kv.row_bytes, e->kv.row_bytes, hd, H,
                                G, pos0, 1.0f / sqrtf((float)hd)};
        c.T = T;
        c.n_head_kv = HKV;
        c.tokens_per_item = ATTN_ITEM_QUERIES / G > 1 ? ATTN_ITEM_QUERIES / G : 1;
        /* enough items for every thread on short chunks */
        while (c.tokens_per_item > 1 &&
               (int64_t)HKV * ((T + c.tokens_per_item - 1) / c.tokens_per_item) < 4 * pool_size(e->pool))
            c.tokens_per_item /= 2;
        c.n_blocks = (T + c.tokens_per_item - 1) / c.tokens_per_item;
        pool_run(e->pool, (int64_t)HKV * c.n_blocks, att_tiled_item, &c);
    } else {
        att_job aj = {e, l, T, pos0};
        pool_run(e->pool, (int64_t)T * H, att_item, &aj);
    }

    /* output projection, added to the residual stream */
    tok_run(e, l, T, pos0, TOK_QUANT_ATT, L->wo.type);
    mm_seg so = {quant_lookup(e->qt, L->wo.type), L->wo, cb->act, cb->act_stride, NULL, T, cb->o, D, NULL};
    mm_run(e->pool, &so, 1);
    tok_run(e, l, T, pos0, TOK_RESIDUAL, 0);
    return STRATA_OK;
}
