/*
 * attention.c — the attention block for a chunk of T tokens (T = 1 when decoding), composed from the
 * architecture's description (arch.h).
 *
 *   xn = rmsnorm(x) * attn_norm                     [T, D]
 *   q, k, v = xn Wq^T (+ bq), xn Wk^T (+ bk), xn Wv^T (+ bv)   [T, QD], [T, KD], [T, KD]
 *   q/k norm: per head (q = rmsnorm(q_h) * q_norm, QK_NORM_HEAD), over the whole projection (QK_NORM_FULL)
 *   or none; then RoPE on the first n_rot dims of each head (NeoX: pairs (i, i + n_rot/2); NORM: (2i, 2i+1))
 *   K, V appended to the cache at positions pos0 .. pos0 + T - 1
 *   per (token, head): softmax(q . K[p0..pos] * attn_scale) . V[p0..pos]   (causal; GQA: head h reads KV
 *   head h / (n_head / n_head_kv); attn_scale is 1 / sqrt(hd) unless the file says; p0 = 0, or
 *   pos - n_swa + 1 on a sliding-window layer; with attn_sinks the head's sink logit joins the softmax's
 *   denominator and weighs no value)
 *   x += (att Wo^T (+ bo)) * residual_scale  (granite; 1 elsewhere)
 *
 * Multi-head latent attention (ATTN_MLA, deepseek2; Lk = kv_lora_rank, R = n_rot, hd = nope + R):
 *   q = xn Wq^T, or rmsnorm(xn Wq_a^T) * q_a_norm Wq_b^T           [T, H, hd]: q_nope then q_pe per head
 *   [c, k_pe] = xn Wkv_a^T; c = rmsnorm(c) * kv_a_norm; k_pe, q_pe roped   [T, Lk + R]
 *   the cache keeps [c, k_pe] per position (one row shared by every head; values read from its c part)
 *   per head: q' = [Wk_b_h q_nope, q_pe], a = softmax(q' . [c_p, k_pe_p] * attn_scale) over p <= pos,
 *   out_h = Wv_b_h (sum_p a_p c_p); x += out Wo^T
 *   which is the decompressed attention's (k_nope = Wk_b_h^T c, v = Wv_b_h c) regrouped, without ever
 *   expanding a cached position into H heads.
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

/* The rotation frequencies of the n_rot / 2 pairs, in double (the same for every position), and the
 * magnitude cos and sin are multiplied by (1 unless YaRN). Unscaled: theta^(-2i/n_rot); linear scaling
 * divides them by the factor; YaRN blends the interpolated (divided) and the original frequency per pair
 * by a ramp between the pairs that turn beta_fast and beta_slow times over the original context. */
static float rope_freqs(double *f, const hparams *hp) {
    const int32_t nr = hp->n_rot, half = nr / 2;
    for (int32_t i = 0; i < half; i++) f[i] = pow((double)hp->rope_theta, -2.0 * (double)i / (double)nr);
    if (hp->rope_scaling == ROPE_SCALING_LINEAR)
        for (int32_t i = 0; i < half; i++) f[i] /= (double)hp->rope_factor;
    if (hp->rope_scaling != ROPE_SCALING_YARN) return 1.0f;
    const double base = hp->rope_theta, ctx = hp->rope_orig_ctx, two_pi = 6.283185307179586;
    /* the pair index whose wavelength fits `rot` turns into the original context */
    double lo = (double)nr * log(ctx / ((double)hp->yarn_beta_fast * two_pi)) / (2.0 * log(base));
    double hi = (double)nr * log(ctx / ((double)hp->yarn_beta_slow * two_pi)) / (2.0 * log(base));
    if (hp->yarn_truncate) { /* rounded out to whole dims; gpt-oss keeps the exact ones */
        lo = floor(lo);
        hi = ceil(hi);
    }
    if (lo < 0) lo = 0;
    if (hi > nr - 1) hi = nr - 1;
    if (lo == hi) hi += 0.001;
    for (int32_t i = 0; i < half; i++) {
        double ramp = ((double)i - lo) / (hi - lo);
        ramp = ramp < 0 ? 0 : ramp > 1 ? 1 : ramp;
        const double extra = 1.0 - ramp; /* 1: keep the original frequency (fast pairs) */
        f[i] = f[i] / (double)hp->rope_factor * (1.0 - extra) + f[i] * extra;
    }
    return hp->yarn_attn_factor;
}

/* The rotation of one position: cs[i] = cos, cs[half + i] = sin of pos * f[i] (half = n_rot / 2), computed
 * in double so that long positions keep their precision. */
static void rope_angles(float *cs, int32_t nr, int32_t pos, const double *f, float mag) {
    int32_t half = nr / 2;
    for (int32_t i = 0; i < half; i++) {
        double ang = (double)pos * f[i];
        cs[i] = (float)cos(ang);
        cs[half + i] = (float)sin(ang);
    }
    if (mag != 1.0f)
        for (int32_t i = 0; i < nr; i++) cs[i] *= mag;
}

/* NeoX layout: element i pairs with element i + n_rot/2 (not with its neighbour); dims past n_rot stay. */
static void rope_neox(float *v, int32_t nr, const float *cs) {
    int32_t half = nr / 2;
    for (int32_t i = 0; i < half; i++) {
        float c = cs[i], s = cs[half + i];
        float x0 = v[i], x1 = v[i + half];
        v[i] = x0 * c - x1 * s;
        v[i + half] = x0 * s + x1 * c;
    }
}

/* Adjacent layout (ROPE_NORM): element 2i pairs with 2i + 1. */
static void rope_norm(float *v, int32_t nr, const float *cs) {
    int32_t half = nr / 2;
    for (int32_t i = 0; i < half; i++) {
        float c = cs[i], s = cs[half + i];
        float x0 = v[2 * i], x1 = v[2 * i + 1];
        v[2 * i] = x0 * c - x1 * s;
        v[2 * i + 1] = x0 * s + x1 * c;
    }
}

static void rope_apply(float *v, int32_t nr, const float *cs, rope_kind kind) {
    if (kind == ROPE_NORM)
        rope_norm(v, nr, cs);
    else
        rope_neox(v, nr, cs);
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
    /* a decode step of several sequences: each row at its own position in its own cache */
    const kv_cache *kv = e->batch_seq ? &e->seqs[e->batch_seq[t]].kv : &e->kv;
    int32_t pos = e->batch_seq ? e->seqs[e->batch_seq[t]].n_past : j->pos0 + t;
    const float *q = e->md->cb.q + (int64_t)t * H * hd + (int64_t)h * hd;
    float *out = e->md->cb.att + (int64_t)t * H * hd + (int64_t)h * hd;
    float *sc = e->md->cb.scores + (int64_t)thread * e->n_ctx; /* [pos + 1] */
    const float scale = hp->attn_scale;
    const layer_weights *L = &e->w.layers[j->layer];
    /* a sliding-window layer sees its last n_swa positions, itself included */
    const int32_t p0 = L->swa && pos >= hp->n_swa ? pos - hp->n_swa + 1 : 0;
    const float sink = L->sinks ? L->sinks[h] : -INFINITY; /* a logit in the denominator, with no value */
    float mx = sink;
    for (int32_t p = p0; p <= pos; p++) {
        sc[p] = kv_dot_k(kv, j->layer, p, kvh, q) * scale;
        if (sc[p] > mx) mx = sc[p];
    }
    float sum = L->sinks ? expf(sink - mx) : 0.0f;
    for (int32_t p = p0; p <= pos; p++) {
        sc[p] = expf(sc[p] - mx);
        sum += sc[p];
    }
    memset(out, 0, sizeof(float) * (size_t)hd);
    float inv = 1.0f / sum;
    for (int32_t p = p0; p <= pos; p++) kv_acc_v(kv, j->layer, p, kvh, sc[p] * inv, out);
}

/* Which tiled kernel an engine runs (att_use_tiled; 0: none, the per-query path above). */
enum { ATT_TILED_AVX2 = 1, ATT_TILED_AVX512 = 2 };

/* The tiled kernel (cpu/attn_avx512.c, cpu/attn_avx2.c): an item is one KV head and a block of tokens, the blocks
 * handed out last token first so that the longest (causal) items start early. */
typedef struct att_tiled_ctx {
    attn_tile_job job;
    int level; /* att_use_tiled */
    int32_t T, n_head_kv, tokens_per_item, n_blocks;
} att_tiled_ctx;

/* A decode step of several sequences: item = row * H_kv + KV head, each row the one-token call of its own
 * sequence (its query and output rows, its cache, its position), as a decode step alone makes it. */
typedef struct att_tiled_batch {
    const attn_tile_job *jobs; /* [T] */
    int32_t n_head_kv;
    int level; /* att_use_tiled */
} att_tiled_batch;

static void att_tiled_batch_item(void *ctx, int64_t item, int thread) {
    (void)thread;
    const att_tiled_batch *c = ctx;
    const attn_tile_job *job = &c->jobs[item / c->n_head_kv];
    const int32_t kvh = (int32_t)(item % c->n_head_kv);
    if (c->level == ATT_TILED_AVX512) attn_f16_tiled_avx512(job, kvh, 0, 1);
    else attn_f16_tiled_avx2(job, kvh, 0, 1);
}

static void att_tiled_item(void *ctx, int64_t item, int thread) {
    (void)thread;
    const att_tiled_ctx *c = ctx;
    const int32_t kvh = (int32_t)(item % c->n_head_kv);
    const int32_t blk = c->n_blocks - 1 - (int32_t)(item / c->n_head_kv);
    const int32_t t0 = blk * c->tokens_per_item;
    const int32_t t1 = t0 + c->tokens_per_item < c->T ? t0 + c->tokens_per_item : c->T;
    if (c->level == ATT_TILED_AVX512) attn_f16_tiled_avx512(&c->job, kvh, t0, t1);
    else attn_f16_tiled_avx2(&c->job, kvh, t0, t1);
}

/* Which tiled kernel this engine runs (0: none, the per-query path): the AVX-512 or AVX2 level, f16
 * cache, a head dim it handles. The choice depends on the engine's configuration alone, so decode and
 * prefill always agree. */
static int att_use_tiled(const strata_engine *e) {
    if (e->hp.attn != ATTN_GQA) return 0; /* the tiled kernels read GQA's K and V rows */
    if (e->kv.type != STRATA_KV_F16 || !attn_f16_tiled_supported(e->hp.head_dim)) return 0;
    if (quant_simd_supported(STRATA_SIMD_AVX512) && e->qt == quant_table(STRATA_SIMD_AVX512)) return ATT_TILED_AVX512;
    if (quant_simd_supported(STRATA_SIMD_AVX2) && e->qt == quant_table(STRATA_SIMD_AVX2)) return ATT_TILED_AVX2;
    return 0;
}

/* ---- per-token steps, split over the pool by blocks of tokens ----------------------------------- */

/* What each token's step does; every token is independent, so the split changes no result. */
enum { TOK_NORM_QUANT, TOK_ROPE_STORE, TOK_QUANT_ATT, TOK_RESIDUAL, TOK_MLA_ROPE_STORE };
#define TOK_BLOCK 16
#define ROPE_MAX_HD 512

typedef struct tok_job {
    strata_engine *e;
    int32_t l, T, pos0, step;
    int32_t wtype; /* the weight type the activations are quantized for */
    int tiled;     /* att_use_tiled: the cache rows are stored by that level's converter */
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
        /* biases, q/k norms and RoPE, then append to the cache */
        float cs[ROPE_MAX_HD];         /* [n_rot] this token's rotation */
        double freq[ROPE_MAX_HD / 2];  /* [n_rot / 2] */
        const float mag = rope_freqs(freq, hp);
        const int32_t nr = hp->n_rot;
        const qk_norm_kind qn = hp->qk_norm;
        const rope_kind rk = hp->ad->rope;
        for (int32_t t = t0; t < t1; t++) {
            kv_cache *kv = e->batch_seq ? &e->seqs[e->batch_seq[t]].kv : &e->kv;
            int32_t pos = e->batch_seq ? e->seqs[e->batch_seq[t]].n_past : j->pos0 + t;
            rope_angles(cs, nr, pos, freq, mag);
            float *qt = cb->q + t * QD, *kt = cb->k + t * KD, *vt = cb->v + t * KD;
            if (L->bq)
                for (int64_t i = 0; i < QD; i++) qt[i] += L->bq[i];
            if (L->bk)
                for (int64_t i = 0; i < KD; i++) kt[i] += L->bk[i];
            if (L->bv)
                for (int64_t i = 0; i < KD; i++) vt[i] += L->bv[i];
            if (qn == QK_NORM_FULL) {
                rmsnorm_rows(qt, qt, L->q_norm, 1, (int32_t)QD, hp->rms_eps);
                rmsnorm_rows(kt, kt, L->k_norm, 1, (int32_t)KD, hp->rms_eps);
            }
            for (int32_t h = 0; h < H; h++) {
                float *qh = qt + (int64_t)h * hd;
                if (qn == QK_NORM_HEAD) rmsnorm_rows(qh, qh, L->q_norm, 1, hd, hp->rms_eps);
                rope_apply(qh, nr, cs, rk);
            }
            for (int32_t h = 0; h < HKV; h++) {
                float *kh = kt + (int64_t)h * hd;
                if (qn == QK_NORM_HEAD) rmsnorm_rows(kh, kh, L->k_norm, 1, hd, hp->rms_eps);
                rope_apply(kh, nr, cs, rk);
            }
            if (j->tiled) { /* the same row layout as kv_store, converted 16 (AVX2: 8) values at a time */
                const size_t off = ((size_t)j->l * (size_t)kv->n_ctx + (size_t)pos) * kv->row_bytes;
                uint16_t *kd = (uint16_t *)(void *)(kv->k + off), *vd = (uint16_t *)(void *)(kv->v + off);
                if (j->tiled == ATT_TILED_AVX512) {
                    attn_store_f16_avx512(kd, cb->k + t * KD, (int32_t)KD);
                    attn_store_f16_avx512(vd, cb->v + t * KD, (int32_t)KD);
                } else {
                    attn_store_f16_avx2(kd, cb->k + t * KD, (int32_t)KD);
                    attn_store_f16_avx2(vd, cb->v + t * KD, (int32_t)KD);
                }
            } else {
                kv_store(kv, j->l, pos, cb->k + t * KD, cb->v + t * KD);
            }
        }
        break;
    }
    case TOK_QUANT_ATT: {
        const int64_t QO = (int64_t)H * hp->head_dim_v; /* QD but under MLA */
        mm_quantize(e->qt, j->wtype, cb->att + (int64_t)t0 * QO, QO, n, QO, cb->act + (size_t)t0 * cb->act_stride,
                    cb->act_stride);
        break;
    }
    case TOK_MLA_ROPE_STORE: {
        /* the latent normed, k_pe and each head's q_pe roped; the cached row is [latent, k_pe] */
        float cs[ROPE_MAX_HD];
        double freq[ROPE_MAX_HD / 2];
        const float mag = rope_freqs(freq, hp);
        const int32_t R = hp->n_rot, Lk = hp->kv_lora_rank, KR = Lk + R, nope = hd - R;
        for (int32_t t = t0; t < t1; t++) {
            kv_cache *kv = e->batch_seq ? &e->seqs[e->batch_seq[t]].kv : &e->kv;
            int32_t pos = e->batch_seq ? e->seqs[e->batch_seq[t]].n_past : j->pos0 + t;
            rope_angles(cs, R, pos, freq, mag);
            float *kt = cb->k + (int64_t)t * KR;
            rmsnorm_rows(kt, kt, L->kv_a_norm, 1, Lk, hp->rms_eps);
            rope_apply(kt + Lk, R, cs, hp->ad->rope);
            kv_store(kv, j->l, pos, kt, NULL);
            for (int32_t h = 0; h < H; h++) {
                float *qpe = cb->q + (int64_t)t * QD + (int64_t)h * hd + nope;
                rope_apply(qpe, R, cs, hp->ad->rope);
                memcpy(cb->mqk + ((int64_t)t * H + h) * KR + Lk, qpe, sizeof(float) * (size_t)R);
            }
        }
        break;
    }
    case TOK_RESIDUAL:
        if (L->bo)
            for (int32_t t = t0; t < t1; t++)
                for (int32_t i = 0; i < D; i++) cb->o[(int64_t)t * D + i] += L->bo[i];
        if (hp->residual_scale != 1.0f)
            for (int64_t i = (int64_t)t0 * D; i < (int64_t)t1 * D; i++) cb->x[i] += cb->o[i] * hp->residual_scale;
        else
            for (int64_t i = (int64_t)t0 * D; i < (int64_t)t1 * D; i++) cb->x[i] += cb->o[i];
        break;
    }
}


static void tok_run(strata_engine *e, int32_t l, int32_t T, int32_t pos0, int32_t step, int32_t wtype) {
    tok_job j = {e, l, T, pos0, step, wtype, att_use_tiled(e)};
    pool_run(e->pool, (T + TOK_BLOCK - 1) / TOK_BLOCK, tok_item, &j);
}

/* ---- multi-head latent attention ----------------------------------------------------------------- */

/* One (token, head) of MLA over the compressed cache: with the query q' = [Wkb_h^T q_nope, q_pe] (mqk), a
 * score is q' . [latent_p, k_pe_p] = q_nope . k_nope_p + q_pe . k_pe_p, the decompressed heads' own, and the
 * attended latent sum_p a_p latent_p (mlat) is decompressed by Wvb_h afterwards (values are linear in it). */
static void mla_item(void *ctx, int64_t item, int thread) {
    const att_job *j = ctx;
    strata_engine *e = j->e;
    const hparams *hp = &e->hp;
    const int32_t H = hp->n_head, KR = hp->kv.k_dim, Lk = hp->kv_lora_rank;
    int32_t t = (int32_t)(item / H), h = (int32_t)(item % H);
    const kv_cache *kv = e->batch_seq ? &e->seqs[e->batch_seq[t]].kv : &e->kv;
    int32_t pos = e->batch_seq ? e->seqs[e->batch_seq[t]].n_past : j->pos0 + t;
    const float *q = e->md->cb.mqk + ((int64_t)t * H + h) * KR;
    float *out = e->md->cb.mlat + ((int64_t)t * H + h) * Lk;
    float *sc = e->md->cb.scores + (int64_t)thread * e->n_ctx; /* [pos + 1] */
    const float scale = hp->attn_scale;
    float mx = -INFINITY;
    for (int32_t p = 0; p <= pos; p++) {
        sc[p] = kv_dot_k(kv, j->layer, p, 0, q) * scale;
        if (sc[p] > mx) mx = sc[p];
    }
    float sum = 0.0f;
    for (int32_t p = 0; p <= pos; p++) {
        sc[p] = expf(sc[p] - mx);
        sum += sc[p];
    }
    memset(out, 0, sizeof(float) * (size_t)Lk);
    float inv = 1.0f / sum;
    for (int32_t p = 0; p <= pos; p++) kv_acc_v(kv, j->layer, p, 0, sc[p] * inv, out);
}

/* y[t, h, :] (rows y_ld apart, head h at y + h * y_hs) = W_h x[t, h, :] for every head: W is [H * rows, cols]
 * (head h's rows from h * rows on), x's rows x_ld apart, head h's cols values at x + h * x_hs. One segment per
 * head. */
static void per_head_products(strata_engine *e, const wview *W, const float *x, int64_t x_hs, int64_t x_ld, int32_t T,
                              float *y, int64_t y_hs, int64_t y_ld) {
    chunk_buffers *cb = &e->md->cb;
    const int32_t H = e->hp.n_head;
    const int64_t rows = W->rows / H, cols = W->cols;
    const quant_traits *qt = quant_lookup(e->qt, W->type);
    for (int32_t h = 0; h < H; h++) {
        uint8_t *act = cb->mact + (size_t)h * (size_t)T * cb->mact_stride;
        mm_quantize(e->qt, W->type, x + (int64_t)h * x_hs, x_ld, T, cols, act, cb->mact_stride);
        wview wh = *W;
        wh.rows = rows;
        wh.data += (size_t)h * (size_t)rows * W->row_bytes;
        cb->msegs[h] = (mm_seg){qt, wh, act, cb->mact_stride, NULL, T, y + (int64_t)h * y_hs, y_ld, NULL};
    }
    mm_run(e->pool, cb->msegs, H);
}

/* xn -> q [T, H * hd] (direct, or through the normed low-rank q) and the latent and k_pe [T, Lk + R]. */
static void mla_project(strata_engine *e, const layer_weights *L, int32_t T) {
    const hparams *hp = &e->hp;
    chunk_buffers *cb = &e->md->cb;
    const int32_t D = hp->n_embd, Lq = hp->q_lora_rank;
    const wview *wq = Lq > 0 ? &L->wq_a : &L->wq;
    float *yq = Lq > 0 ? cb->mq : cb->q;
    const quant_traits *tq = quant_lookup(e->qt, wq->type), *tkv = quant_lookup(e->qt, L->wkv_a.type);
    mm_seg s[2] = {{tq, *wq, cb->act, cb->act_stride, NULL, T, yq, wq->rows, NULL},
                   {tkv, L->wkv_a, cb->act, cb->act_stride, NULL, T, cb->k, L->wkv_a.rows, NULL}};
    if (tq->act_type == tkv->act_type) { /* xn was quantized for wq */
        mm_run(e->pool, s, 2);
    } else {
        mm_run(e->pool, &s[0], 1);
        mm_quantize(e->qt, L->wkv_a.type, cb->xn, D, T, D, cb->act, cb->act_stride);
        mm_run(e->pool, &s[1], 1);
    }
    if (Lq > 0) {
        rmsnorm_rows(cb->mq, cb->mq, L->q_a_norm, T, Lq, hp->rms_eps);
        mm_quantize(e->qt, L->wq_b.type, cb->mq, Lq, T, Lq, cb->act, cb->act_stride);
        mm_seg sb = {quant_lookup(e->qt, L->wq_b.type), L->wq_b, cb->act, cb->act_stride, NULL, T, cb->q, L->wq_b.rows,
                     NULL};
        mm_run(e->pool, &sb, 1);
    }
}

static strata_status mla_block(strata_engine *e, int32_t l, int32_t T, int32_t pos0) {
    const hparams *hp = &e->hp;
    const layer_weights *L = &e->w.layers[l];
    chunk_buffers *cb = &e->md->cb;
    const int32_t H = hp->n_head, hd = hp->head_dim, Lk = hp->kv_lora_rank, KR = hp->kv.k_dim;
    const int64_t QD = (int64_t)H * hd;
    STRATA_ASSERT(&e->err, hp->n_rot <= ROPE_MAX_HD && cb->mqk && cb->msegs);

    tok_run(e, l, T, pos0, TOK_NORM_QUANT, hp->q_lora_rank > 0 ? L->wq_a.type : L->wq.type);
    mla_project(e, L, T);
    tok_run(e, l, T, pos0, TOK_MLA_ROPE_STORE, 0);
    /* each head's q_nope into the latent space: mqk[t, h, 0..Lk) */
    per_head_products(e, &L->wk_b, cb->q, hd, QD, T, cb->mqk, KR, (int64_t)H * KR);
    att_job aj = {e, l, T, pos0};
    pool_run(e->pool, (int64_t)T * H, mla_item, &aj);
    /* each head's attended latent to its values: att[t, h * hv ..] */
    per_head_products(e, &L->wv_b, cb->mlat, Lk, (int64_t)H * Lk, T, cb->att, hp->head_dim_v, (int64_t)H * hp->head_dim_v);

    tok_run(e, l, T, pos0, TOK_QUANT_ATT, L->wo.type);
    mm_seg so = {quant_lookup(e->qt, L->wo.type), L->wo, cb->act, cb->act_stride, NULL, T, cb->o, hp->n_embd, NULL};
    mm_run(e->pool, &so, 1);
    tok_run(e, l, T, pos0, TOK_RESIDUAL, 0);
    return STRATA_OK;
}

/* ---- the block --------------------------------------------------------------------------------- */

strata_status attention_block(strata_engine *e, int32_t l, int32_t T, int32_t pos0) {
    if (e->hp.attn == ATTN_MLA) return mla_block(e, l, T, pos0);
    const hparams *hp = &e->hp;
    const layer_weights *L = &e->w.layers[l];
    chunk_buffers *cb = &e->md->cb;
    const int32_t D = hp->n_embd, hd = hp->head_dim, H = hp->n_head, HKV = hp->n_head_kv;
    const int64_t QD = (int64_t)H * hd, KD = (int64_t)HKV * hd;
    STRATA_ASSERT(&e->err, T <= cb->cap && (e->batch_seq || pos0 + T <= e->n_ctx));

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

    const int tiled = att_use_tiled(e);
    if (tiled && e->batch_seq) {
        attn_tile_job jobs[STRATA_MAX_SEQ];
        STRATA_ASSERT(&e->err, T <= STRATA_MAX_SEQ);
        for (int32_t t = 0; t < T; t++) {
            const seq_state *sq = &e->seqs[e->batch_seq[t]];
            const size_t lo = (size_t)l * (size_t)sq->kv.n_ctx * sq->kv.row_bytes;
            jobs[t] = (attn_tile_job){.q = cb->q + t * QD,
                                      .out = cb->att + t * QD,
                                      .k = sq->kv.k + lo,
                                      .v = sq->kv.v + lo,
                                      .row_bytes = sq->kv.row_bytes,
                                      .hd = hd,
                                      .n_head = H,
                                      .group = H / HKV,
                                      .pos0 = sq->n_past,
                                      .scale = hp->attn_scale,
                                      .sinks = L->sinks,
                                      .window = L->swa ? hp->n_swa : 0};
        }
        att_tiled_batch c = {jobs, HKV, tiled};
        pool_run(e->pool, (int64_t)T * HKV, att_tiled_batch_item, &c);
    } else if (tiled) {
        const int32_t G = H / HKV;
        att_tiled_ctx c;
        c.level = tiled;
        const size_t lo = (size_t)l * (size_t)e->kv.n_ctx * e->kv.row_bytes;
        c.job = (attn_tile_job){.q = cb->q,
                                .out = cb->att,
                                .k = e->kv.k + lo,
                                .v = e->kv.v + lo,
                                .row_bytes = e->kv.row_bytes,
                                .hd = hd,
                                .n_head = H,
                                .group = G,
                                .pos0 = pos0,
                                .scale = hp->attn_scale,
                                .sinks = L->sinks,
                                .window = L->swa ? hp->n_swa : 0};
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
