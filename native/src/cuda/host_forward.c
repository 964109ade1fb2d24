/*
 * cuda/host_forward.c — the forward pass on the device (see cuda/host.h): the blocks, the experts of a
 * layer in waves (cached ones from their slots, a prompt's others through the ring in the loan, decode
 * misses copied or run on the host), and the decode step captured as a CUDA Graph.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda/host.h"
#include "group_dequant.h"
#include "trace.h"

/* ---- blocks ------------------------------------------------------------------------------------ */

/* A decode step (not a prompt chunk, whatever its size): the decode shortcuts below (fused norm and
 * quantization, q/k/v quantized once, device routing, the graph) apply only here, so that prompt
 * chunks keep one code path whatever their T (the tensor-core products of use_mmq). */
static int decoding(const strata_engine *e) { return !e->md->gpu->prompt; }

/* Decode, one token: y (+)= W x with the one-token kernel (x in W's activation type already). */
static strata_status matvec1(strata_engine *e, int32_t type, const void *w, int64_t rows, int64_t cols, const void *x,
                             float *y, int32_t acc) {
    const void *const w3[3] = {w, NULL, NULL};
    const int64_t r3[3] = {rows, 0, 0};
    float *const y3[3] = {y, NULL, NULL};
    DEV(e, cuda_matvec3(e->md->gpu->ctx, type, w3, r3, cols, x, y3, acc));
    return STRATA_OK;
}

/* Whether a product of `type` runs on the tensor cores (cuda_mmq*): in every prompt chunk, whatever
 * its T (1 included), so that a token gets the same arithmetic in whichever chunk it is read; decode
 * keeps the matrix-vector kernel. STRATA_CUDA_MMQ=0 turns it off (trace.c). */
static int use_mmq(strata_engine *e, int32_t type) {
    cuda_state *g = e->md->gpu;
    if (!g->mmq) g->mmq = trace_env_cuda_mmq() ? 1 : 2;
    return g->mmq == 1 && g->prompt && cuda_mmq_supported(type);
}

/* The routed experts of layer l run on the tensor cores (all three matrices' types allow it). */
static int layer_mmq(strata_engine *e, int32_t l) {
    const layer_weights *W = &e->w.layers[l];
    return use_mmq(e, W->gate_exps.type) && use_mmq(e, W->up_exps.type) && use_mmq(e, W->down_exps.type);
}

/* y (+)= W x for T rows of x (f32, stride xs floats), quantizing x first when W's type wants it. */
static strata_status matvec(strata_engine *e, int32_t type, const void *w, int64_t rows, int64_t cols, const float *x,
                            int64_t xs, float *y, int64_t ys, int32_t T, int32_t acc) {
    cuda_state *g = e->md->gpu;
    if (g->fused && T == 1 && decoding(e)) {
        const void *xin = x;
        if (cuda_act_type(type) != STRATA_TYPE_F32) {
            DEV(e, cuda_quantize_act(g->ctx, type, x, xs, g->act, g->act_row, cols, 1));
            xin = g->act;
        }
        return matvec1(e, type, w, rows, cols, xin, y, acc);
    }
    if (use_mmq(e, type)) { /* 8-bit activation blocks for every type the tensor cores run */
        DEV(e, cuda_quantize_act(g->ctx, STRATA_TYPE_Q8_0, x, xs, g->act, g->act_row, cols, T));
        DEV(e, cuda_mmq(g->ctx, type, w, rows, cols, g->act, g->act_row, y, ys, T, acc));
    } else if (cuda_act_type(type) != STRATA_TYPE_F32) {
        DEV(e, cuda_quantize_act(g->ctx, type, x, xs, g->act, g->act_row, cols, T));
        DEV(e, cuda_matvec(g->ctx, type, w, rows, cols, g->act, g->act_row, y, ys, T, acc));
    } else {
        DEV(e, cuda_matvec(g->ctx, type, w, rows, cols, x, xs, y, ys, T, acc));
    }
    return STRATA_OK;
}

/* xn = rmsnorm(x[T, D]) * w, then y = W xn [T, rows]: in decode, for weights with 8-bit activations,
 * the norm writes the quantized rows in the same launch (the same bits as the two launches). */
static strata_status norm_matvec(strata_engine *e, const float *x, const float *nw, int32_t type, const void *w,
                                 int64_t rows, float *y, int32_t T) {
    cuda_state *g = e->md->gpu;
    const int32_t D = e->hp.n_embd;
    g->xn_q8 = 0;
    if (g->fused && (g->fuse2 & FUSE_ROUTER) && decoding(e) && T == 1 && type == STRATA_TYPE_F32 && D % 32 == 0 &&
        D <= 4096) {
        /* the F32 router: norm, product and xn's 8-bit row (for the experts) in one launch */
        DEV(e, cuda_norm_matvec_f32(g->ctx, x, nw, g->xn, g->act, (const float *)w, rows, D, e->hp.rms_eps, y));
        g->xn_q8 = 1;
        return STRATA_OK;
    }
    if (g->fused && decoding(e) && cuda_act_type(type) != STRATA_TYPE_F32) {
        DEV(e, cuda_rmsnorm_q8(g->ctx, x, nw, g->xn, g->act, g->act_row, T, D, e->hp.rms_eps));
        g->xn_q8 = 1;
        if (T == 1) return matvec1(e, type, w, rows, D, g->act, y, 0);
        DEV(e, cuda_matvec(g->ctx, type, w, rows, D, g->act, g->act_row, y, rows, T, 0));
        return STRATA_OK;
    }
    DEV(e, cuda_rmsnorm(g->ctx, x, nw, g->xn, T, D, e->hp.rms_eps));
    return matvec(e, type, w, rows, D, g->xn, D, y, rows, T, 0);
}

/* Decode, one token, after q, k and v: q/k norm and RoPE, the KV-cache store, attention and x += Wo att.
 * With the second round of fusions: RoPE and the store in one launch, and attention writing att's
 * 8-bit row for Wo (the same bits as the separate launches). */
static strata_status attention_decode_tail(strata_engine *e, int32_t l, int32_t pos0) {
    cuda_state *g = e->md->gpu;
    const hparams *hp = &e->hp;
    const layer_weights *W = &e->w.layers[l];
    const dev_layer *dl = &g->layers[l];
    const int32_t hd = hp->head_dim, H = hp->n_head, Hkv = hp->n_head_kv;
    const int64_t D = hp->n_embd, QD = (int64_t)H * hd, KD = (int64_t)Hkv * hd;
    const int hd_ok = hd == 32 || hd == 64 || hd == 128 || hd == 256;
    if ((g->fuse2 & FUSE_ROPE_STORE) && hd_ok) {
        DEV(e, cuda_qk_norm_rope_store(g->ctx, g->q, g->k, g->v, dl->q_norm, dl->k_norm, 1, H, Hkv, hd, pos0,
                                       hp->rope_theta, hp->rms_eps, g->pos_arg, g->kv_type, dl->k_cache, dl->v_cache));
    } else {
        DEV(e, cuda_qk_norm_rope(g->ctx, g->q, g->k, dl->q_norm, dl->k_norm, 1, H, Hkv, hd, pos0, hp->rope_theta,
                                 hp->rms_eps, g->pos_arg));
        DEV(e, cuda_kv_store(g->ctx, g->kv_type, g->k, g->v, dl->k_cache, dl->v_cache, 1, (int32_t)KD, pos0,
                             g->pos_arg));
    }
    if (!(g->fast & CUDA_FAST_ATTENTION)) {
        DEV(e, cuda_attention(g->ctx, g->kv_type, g->q, dl->k_cache, dl->v_cache, g->att, 1, H, Hkv, hd, pos0,
                              g->pos_arg));
        return matvec(e, W->wo.type, dl->wo, D, QD, g->att, QD, g->x, D, 1, 1);
    }
    /* att's 8-bit row straight from attention when Wo takes 8-bit activations */
    const int q8 = (g->fuse2 & FUSE_ATT_Q8) && hd_ok && cuda_act_type(W->wo.type) == STRATA_TYPE_Q8_0;
    DEV(e, cuda_attention_decode(g->ctx, g->kv_type, g->q, dl->k_cache, dl->v_cache, g->att, q8 ? g->act : NULL,
                                 g->act_row, H, Hkv, hd, pos0, g->pos_arg, g->att_part, g->att_cnt, g->att_splits));
    if (q8) return matvec1(e, W->wo.type, dl->wo, D, QD, g->act, g->x, 1);
    return matvec(e, W->wo.type, dl->wo, D, QD, g->att, QD, g->x, D, 1, 1);
}

/* Whether a prompt chunk's attention runs on the tensor cores (cuda_flash_attention): in every prompt
 * chunk, 1-token chunks included, for the caches and head dims it covers; decode keeps cuda_attention.
 * STRATA_CUDA_FLASH=0 turns it off (trace.c). */
static int use_flash(strata_engine *e) {
    cuda_state *g = e->md->gpu;
    if (!g->flash) g->flash = trace_env_cuda_flash() ? 1 : 2;
    return g->flash == 1 && !decoding(e) &&
           cuda_flash_attention_supported(g->kv_type, e->hp.n_head, e->hp.n_head_kv, e->hp.head_dim);
}

static strata_status attention(strata_engine *e, int32_t l, int32_t T, int32_t pos0) {
    cuda_state *g = e->md->gpu;
    const hparams *hp = &e->hp;
    const layer_weights *W = &e->w.layers[l];
    const dev_layer *dl = &g->layers[l];
    const int64_t D = hp->n_embd, QD = (int64_t)hp->n_head * hp->head_dim, KD = (int64_t)hp->n_head_kv * hp->head_dim;
    const int32_t at = cuda_act_type(W->wq.type);
    if (g->fused && decoding(e) && T == 1 && W->wk.type == W->wq.type && W->wv.type == W->wq.type) {
        /* decode: xn (and its 8-bit row) in one launch, then q, k and v in one */
        const void *xin = g->xn;
        if (at != STRATA_TYPE_F32) {
            DEV(e, cuda_rmsnorm_q8(g->ctx, g->x, dl->attn_norm, g->xn, g->act, g->act_row, T, (int32_t)D,
                                   hp->rms_eps));
            xin = g->act;
        } else {
            DEV(e, cuda_rmsnorm(g->ctx, g->x, dl->attn_norm, g->xn, T, (int32_t)D, hp->rms_eps));
        }
        const void *const w3[3] = {dl->wq, dl->wk, dl->wv};
        const int64_t r3[3] = {QD, KD, KD};
        float *const y3[3] = {g->q, g->k, g->v};
        DEV(e, cuda_matvec3(g->ctx, W->wq.type, w3, r3, D, xin, y3, 0));
        return attention_decode_tail(e, l, pos0);
    } else if (decoding(e) && at != STRATA_TYPE_F32 && cuda_act_type(W->wk.type) == at &&
               cuda_act_type(W->wv.type) == at) {
        /* q, k and v read the same quantized activations: normed and quantized once */
        STRATA_TRY(norm_matvec(e, g->x, dl->attn_norm, W->wq.type, dl->wq, QD, g->q, T));
        DEV(e, cuda_matvec(g->ctx, W->wk.type, dl->wk, KD, D, g->act, g->act_row, g->k, KD, T, 0));
        DEV(e, cuda_matvec(g->ctx, W->wv.type, dl->wv, KD, D, g->act, g->act_row, g->v, KD, T, 0));
    } else {
        DEV(e, cuda_rmsnorm(g->ctx, g->x, dl->attn_norm, g->xn, T, (int32_t)D, hp->rms_eps));
        STRATA_TRY(matvec(e, W->wq.type, dl->wq, QD, D, g->xn, D, g->q, QD, T, 0));
        STRATA_TRY(matvec(e, W->wk.type, dl->wk, KD, D, g->xn, D, g->k, KD, T, 0));
        STRATA_TRY(matvec(e, W->wv.type, dl->wv, KD, D, g->xn, D, g->v, KD, T, 0));
    }
    DEV(e, cuda_qk_norm_rope(g->ctx, g->q, g->k, dl->q_norm, dl->k_norm, T, hp->n_head, hp->n_head_kv, hp->head_dim,
                             pos0, hp->rope_theta, hp->rms_eps, g->pos_arg));
    DEV(e, cuda_kv_store(g->ctx, g->kv_type, g->k, g->v, dl->k_cache, dl->v_cache, T, (int32_t)KD, pos0, g->pos_arg));
    if (use_flash(e)) /* every prompt chunk, whatever its T: one expression per query position */
        DEV(e, cuda_flash_attention(g->ctx, g->kv_type, g->q, dl->k_cache, dl->v_cache, g->att, T, hp->n_head,
                                    hp->n_head_kv, hp->head_dim, pos0, g->pos_arg));
    else
        DEV(e, cuda_attention(g->ctx, g->kv_type, g->q, dl->k_cache, dl->v_cache, g->att, T, hp->n_head,
                              hp->n_head_kv, hp->head_dim, pos0, g->pos_arg));
    /* x += Wo att */
    return matvec(e, W->wo.type, dl->wo, D, QD, g->att, QD, g->x, D, T, 1);
}

/* The three expert products over prepared segments (device tables seg_w[3][n], seg_tok/seg_out). */
static strata_status expert_products(strata_engine *e, int32_t l, int32_t n_seg, int32_t seg_tokens, int32_t T) {
    cuda_state *g = e->md->gpu;
    const hparams *hp = &e->hp;
    const layer_weights *W = &e->w.layers[l];
    const int64_t D = hp->n_embd, F = hp->n_ff_exp, K = hp->n_expert_used;
    const int64_t ns = (int64_t)n_seg * seg_tokens;
    const void *const *wg = (const void *const *)g->seg_w, *const *wu = wg + g->seg_cap, *const *wd = wu + g->seg_cap;
    int32_t *tok_in = g->seg_tok, *out_gu = g->seg_out, *tok_h = g->seg_tok + (int64_t)g->seg_cap * CUDA_SEG_TOKENS;
    int32_t *out_d = g->seg_out + (int64_t)g->seg_cap * CUDA_SEG_TOKENS;
    (void)ns;
    if (layer_mmq(e, l)) {
        /* tensor cores: wave_segments left the pairs (t * K + k) grouped by expert in seg_tok and each
         * segment's start in seg_out; gate/up read x row t = pair / K, down reads h row = pair */
        const int32_t *pairs = g->seg_tok, *start = g->seg_out;
        DEV(e, cuda_quantize_act(g->ctx, STRATA_TYPE_Q8_0, g->xn, D, g->act, g->act_row, D, T));
        DEV(e, cuda_mmq_segments(g->ctx, W->gate_exps.type, wg, F, D, g->act, g->act_row, pairs, start, (int32_t)K,
                                 g->g, F, n_seg));
        DEV(e, cuda_mmq_segments(g->ctx, W->up_exps.type, wu, F, D, g->act, g->act_row, pairs, start, (int32_t)K,
                                 g->u, F, n_seg));
        DEV(e, cuda_swiglu(g->ctx, g->g, g->u, g->h, (int64_t)T * K * F));
        DEV(e, cuda_quantize_act(g->ctx, STRATA_TYPE_Q8_0, g->h, F, g->hact, g->hact_row, F, (int32_t)(T * K)));
        DEV(e, cuda_mmq_segments(g->ctx, W->down_exps.type, wd, D, F, g->hact, g->hact_row, pairs, start, 1, g->ye,
                                 D, n_seg));
        return STRATA_OK;
    }
    /* gate and up: x rows are tokens of xn; outputs rows t * K + k of g and u */
    const void *xin = g->xn;
    int64_t xs = D;
    if (cuda_act_type(W->gate_exps.type) != STRATA_TYPE_F32) {
        DEV(e, cuda_quantize_act(g->ctx, W->gate_exps.type, g->xn, D, g->act, g->act_row, D, T));
        xin = g->act;
        xs = g->act_row;
    }
    DEV(e, cuda_matvec_segments(g->ctx, W->gate_exps.type, wg, F, D, xin, xs, tok_in, out_gu, g->g, F, n_seg, seg_tokens));
    if (W->up_exps.type != W->gate_exps.type && cuda_act_type(W->up_exps.type) != cuda_act_type(W->gate_exps.type))
        return err_set(&e->err, STRATA_ERR_UNSUPPORTED, "--device cuda: gate and up experts of layer %d need different "
                       "activation types", l);
    DEV(e, cuda_matvec_segments(g->ctx, W->up_exps.type, wu, F, D, xin, xs, tok_in, out_gu, g->u, F, n_seg, seg_tokens));
    DEV(e, cuda_swiglu(g->ctx, g->g, g->u, g->h, (int64_t)T * K * F));
    const void *hin = g->h;
    int64_t hs = F;
    if (cuda_act_type(W->down_exps.type) != STRATA_TYPE_F32) {
        DEV(e, cuda_quantize_act(g->ctx, W->down_exps.type, g->h, F, g->hact, g->hact_row, F, (int32_t)(T * K)));
        hin = g->hact;
        hs = g->hact_row;
    }
    DEV(e, cuda_matvec_segments(g->ctx, W->down_exps.type, wd, D, F, hin, hs, tok_h, out_d, g->ye, D, n_seg, seg_tokens));
    return STRATA_OK;
}

/* Decode with the segment tables made on the device (one token, segment k = its k-th expert): gate, up
 * and SwiGLU in one launch, down and the weighted sum into x in another. The same bits as
 * expert_products + cuda_moe_combine (cuda_backend.h). xn (and act, its 8-bit rows for the router's
 * type) hold the normed token. */
static strata_status decode_experts(strata_engine *e, int32_t l) {
    cuda_state *g = e->md->gpu;
    const hparams *hp = &e->hp;
    const layer_weights *W = &e->w.layers[l];
    const int64_t D = hp->n_embd, F = hp->n_ff_exp;
    const int32_t K = hp->n_expert_used;
    const void *const *wg = (const void *const *)g->seg_w, *const *wu = wg + g->seg_cap, *const *wd = wu + g->seg_cap;
    const int32_t gt = W->gate_exps.type, dt = W->down_exps.type;
    const void *xin = g->xn;
    if (cuda_act_type(gt) != STRATA_TYPE_F32) {
        /* act holds xn's 8-bit row when norm_matvec wrote it with the router's product */
        if (!g->xn_q8) DEV(e, cuda_quantize_act(g->ctx, gt, g->xn, D, g->act, g->act_row, D, 1));
        xin = g->act;
    }
    DEV(e, cuda_expert_gate_up(g->ctx, gt, wg, wu, F, D, xin, g->h, K));
    if ((g->fuse2 & FUSE_DOWN_Q8) && cuda_act_type(dt) == STRATA_TYPE_Q8_0 && F % 32 == 0) {
        /* h quantized inside the down product's launch */
        DEV(e, cuda_expert_down_combine_hq(g->ctx, dt, wd, D, F, g->h, F, g->wsel, g->x, K));
        return STRATA_OK;
    }
    const void *hin = g->h;
    int64_t hs = F;
    if (cuda_act_type(dt) != STRATA_TYPE_F32) {
        DEV(e, cuda_quantize_act(g->ctx, dt, g->h, F, g->hact, g->hact_row, F, K));
        hin = g->hact;
        hs = g->hact_row;
    }
    DEV(e, cuda_expert_down_combine(g->ctx, dt, wd, D, F, hin, hs, g->wsel, g->x, K));
    return STRATA_OK;
}

/* ---- decode misses on the host ------------------------------------------------------------------ */

/* Experts ex[0..n) of layer W on the host with the device's bits (cuda_mirror_experts), on the engine's
 * threads at its kernel level: out[k][0..D) from x[D], all of them in two pool runs (gates and ups,
 * then downs), x prepared once. scratch: cuda_mirror_scratch_floats(D, F, n) floats (host_tmp after
 * its D + K * D has them for n <= K). */
void gpu_host_experts(strata_engine *e, const layer_weights *W, const int32_t *ex, int32_t n, const float *x,
                         float *const *out, float *scratch) {
    const int64_t D = e->hp.n_embd, F = e->hp.n_ff_exp;
    const int32_t simd = e->md->plan.simd; /* the level resolved once, at open */
    const void *gw[CUDA_MIRROR_MAX_EXPERTS], *uw[CUDA_MIRROR_MAX_EXPERTS], *dw[CUDA_MIRROR_MAX_EXPERTS];
    for (int32_t i0 = 0; i0 < n; i0 += CUDA_MIRROR_MAX_EXPERTS) {
        const int32_t m = n - i0 < CUDA_MIRROR_MAX_EXPERTS ? n - i0 : CUDA_MIRROR_MAX_EXPERTS;
        for (int32_t k = 0; k < m; k++) {
            gw[k] = W->gate_exps.data + ex[i0 + k] * F * W->gate_exps.row_bytes;
            uw[k] = W->up_exps.data + ex[i0 + k] * F * W->up_exps.row_bytes;
            dw[k] = W->down_exps.data + (int64_t)ex[i0 + k] * D * W->down_exps.row_bytes;
        }
        cuda_mirror_experts(e->pool, simd, m, gw, W->gate_exps.type, uw, W->up_exps.type, dw, W->down_exps.type, D,
                            F, x, out + i0, scratch);
    }
}

/* One expert of layer W on the host: out[D] from x[D]; scratch: cuda_mirror_scratch_floats(D, F, 1) floats. */
void gpu_host_expert(strata_engine *e, const layer_weights *W, int32_t ex, const float *x, float *out,
                        float *scratch) {
    gpu_host_experts(e, W, &ex, 1, x, &out, scratch);
}

/* Segment tables of the experts marked WAVE in state, uploaded; returns the number of segments.
 * The wave's pairs i = t * K + k are first bucketed by expert (one pass over sel, then each expert's
 * pairs in increasing i), so the work is O(T * K + E), not O(E * T * K). */
enum { EXP_IDLE = 0, EXP_PENDING = 1, EXP_WAVE = 2, EXP_HOST = 3, EXP_COPIED = 4 };
static strata_status wave_segments(strata_engine *e, int32_t l, const int32_t *sel, int32_t T, uint8_t *state,
                                   int32_t SEG, int32_t *n_out) {
    cuda_state *g = e->md->gpu;
    const int32_t E = e->hp.n_expert, K = e->hp.n_expert_used, TK = T * K;
    const void **sw = (const void **)(sel + TK);
    int32_t *stok = (int32_t *)(sw + 3 * g->seg_cap);
    int32_t *sout = stok + (int64_t)g->seg_cap * SEG;
    int32_t *stok_h = sout + (int64_t)g->seg_cap * SEG;
    int32_t *sout_d = stok_h + (int64_t)g->seg_cap * SEG;
    const int mmq = layer_mmq(e, l);
    /* the last wave's tables must have left the staging before it is written again */
    DEV(e, cuda_event_wait(g->ctx, g->ev_tables));
    /* bucket: first[ex] .. first[ex + 1] of order[] are expert ex's pairs (only experts of this wave).
     * Under the tensor cores order[] is the pair table itself (stok); otherwise host scratch. */
    if (g->bucket_cap < TK + E + 1) {
        int32_t *nb = realloc(g->bucket, (size_t)(TK + E + 1) * 2 * sizeof(int32_t));
        if (!nb) return err_set(&e->err, STRATA_ERR_OUT_OF_MEMORY, "out of host memory for the expert groups");
        g->bucket = nb;
        g->bucket_cap = TK + E + 1;
    }
    int32_t *first = g->bucket, *fill_at = first + E + 1;
    int32_t *order = mmq ? stok : g->bucket + 2 * (E + 1);
    memset(first, 0, (size_t)(E + 1) * sizeof(int32_t));
    for (int32_t i = 0; i < TK; i++)
        if (state[sel[i]] == EXP_WAVE) first[sel[i] + 1]++;
    for (int32_t ex = 0; ex < E; ex++) first[ex + 1] += first[ex];
    memcpy(fill_at, first, (size_t)E * sizeof(int32_t));
    for (int32_t i = 0; i < TK; i++)
        if (state[sel[i]] == EXP_WAVE) order[fill_at[sel[i]]++] = i;
    const int32_t np = first[E];

    int32_t n_seg = 0;
    if (mmq) {
        /* tensor cores: the pairs (order, already in stok) go to seg_tok, CUDA_MMQ_TOKENS per segment,
         * and the segments' starts (n_seg + 1) to seg_out. At most T * K pairs and
         * T * K / CUDA_MMQ_TOKENS + E segments: within the tables sized for CUDA_SEG_TOKENS. */
        int32_t *start = stok + TK;
        for (int32_t ex = 0; ex < E; ex++) {
            if (state[ex] != EXP_WAVE) continue;
            state[ex] = EXP_IDLE;
            const exp_ptrs pe = slot_ptrs(g, l, g->addr[ex]), *p = &pe;
            for (int32_t j = first[ex]; j < first[ex + 1]; j += CUDA_MMQ_TOKENS) {
                STRATA_ASSERT(&e->err, n_seg < g->seg_cap);
                sw[n_seg] = p->gate;
                sw[g->seg_cap + n_seg] = p->up;
                sw[2 * g->seg_cap + n_seg] = p->down;
                start[n_seg++] = j;
            }
        }
        start[n_seg] = np;
        DEV(e, cuda_h2d(g->ctx, (void *)g->seg_w, sw, 3 * (size_t)g->seg_cap * sizeof(void *), CUDA_STREAM_COMPUTE));
        if (np > 0) DEV(e, cuda_h2d(g->ctx, g->seg_tok, order, (size_t)np * 4, CUDA_STREAM_COMPUTE));
        DEV(e, cuda_h2d(g->ctx, g->seg_out, start, (size_t)(n_seg + 1) * 4, CUDA_STREAM_COMPUTE));
        *n_out = n_seg;
        return STRATA_OK;
    }
    for (int32_t ex = 0; ex < E; ex++) {
        if (state[ex] != EXP_WAVE) continue;
        state[ex] = EXP_IDLE;
        const exp_ptrs pe = slot_ptrs(g, l, g->addr[ex]), *p = &pe;
        for (int32_t j0 = first[ex]; j0 < first[ex + 1]; j0 += SEG) {
            STRATA_ASSERT(&e->err, n_seg < g->seg_cap);
            sw[n_seg] = p->gate;
            sw[g->seg_cap + n_seg] = p->up;
            sw[2 * g->seg_cap + n_seg] = p->down;
            for (int32_t f = 0; f < SEG; f++) {
                const int64_t j = (int64_t)n_seg * SEG + f;
                const int32_t i = j0 + f < first[ex + 1] ? order[j0 + f] : -1;
                stok[j] = i < 0 ? -1 : i / K; /* token row of xn */
                sout[j] = i;                  /* row t * K + k of g and u */
                stok_h[j] = i;                /* row of h */
                sout_d[j] = i;                /* row of ye */
            }
            n_seg++;
        }
    }
    const size_t nb = (size_t)n_seg * SEG * 4;
    const int64_t half = (int64_t)g->seg_cap * CUDA_SEG_TOKENS;
    DEV(e, cuda_h2d(g->ctx, (void *)g->seg_w, sw, 3 * (size_t)g->seg_cap * sizeof(void *), CUDA_STREAM_COMPUTE));
    DEV(e, cuda_h2d(g->ctx, g->seg_tok, stok, nb, CUDA_STREAM_COMPUTE));
    DEV(e, cuda_h2d(g->ctx, g->seg_out, sout, nb, CUDA_STREAM_COMPUTE));
    DEV(e, cuda_h2d(g->ctx, g->seg_tok + half, stok_h, nb, CUDA_STREAM_COMPUTE));
    DEV(e, cuda_h2d(g->ctx, g->seg_out + half, sout_d, nb, CUDA_STREAM_COMPUTE));
    *n_out = n_seg;
    return STRATA_OK;
}

/* The segment tables of the experts marked WAVE, then their products: with the copy stream, after the
 * event of this wave's copies (when it copied any), and with an event that says when the tables have left
 * the staging (ev_tables). */
static strata_status run_wave(strata_engine *e, int32_t l, const int32_t *sel, int32_t T, int32_t SEG, int32_t copied) {
    cuda_state *g = e->md->gpu;
    int32_t n_seg = 0;
    STRATA_TRY(wave_segments(e, l, sel, T, g->exp_state, SEG, &n_seg));
    DEV(e, cuda_event_record(g->ctx, g->ev_tables, CUDA_STREAM_COMPUTE));
    if (g->overlap && copied) DEV(e, cuda_stream_wait(g->ctx, g->ev_copy, CUDA_STREAM_COMPUTE));
    if (n_seg > 0) STRATA_TRY(expert_products(e, l, n_seg, SEG, T)); /* none: every miss runs on the host */
    return STRATA_OK;
}

/* How many of a decode step's n_miss misses run on the host. --miss host: all. --miss auto, from the
 * measured time of each (STRATA_CUDA_MISS_SPLIT overrides): when a copy is a DMA alone (direct store),
 * the n for which n host runs and n_miss - n copies take about as long, as they run at the same time;
 * through the ring, the host is busy during a copy too, so all of them where the host is faster, else
 * none. The reply is the same whatever n is. */
static int32_t host_share(const cuda_state *g, int32_t n_miss) {
    if (g->miss_policy == STRATA_MISS_HOST || n_miss <= 0) return n_miss > 0 ? n_miss : 0;
    if (g->miss_split >= 0) return (int32_t)floor(g->miss_split * n_miss + 0.5);
    if (!(g->host_ms > 0) || !(g->copy_ms > 0)) return 0;
    if (!g->direct) return g->host_ms < g->copy_ms ? n_miss : 0;
    int32_t best = 0;
    double best_t = n_miss * g->copy_ms;
    for (int32_t n = 1; n <= n_miss; n++) {
        const double t = fmax(n * g->host_ms, (n_miss - n) * g->copy_ms);
        if (t < best_t) {
            best_t = t;
            best = n;
        }
    }
    return best;
}

/* Time one expert on the host (--miss auto weighs it against a copy, timed by the fill at open; decode
 * refines it), before the first decode step that routes on the host: a run of expert 0 of layer 0 first
 * (threads and code warm), then timed runs of experts of the middle layer, whose weights the CPU caches
 * no longer hold, as a missed expert's are not. It uses host_tmp before the step downloads into it. */
static void host_rate(strata_engine *e) {
    cuda_state *g = e->md->gpu;
    const int64_t D = e->hp.n_embd;
    const int32_t K = e->hp.n_expert_used, E = e->hp.n_expert;
    float *x = g->host_tmp, *out = x + D, *scratch = out + (int64_t)K * D;
    memset(x, 0, (size_t)D * sizeof(float));
    gpu_host_expert(e, &e->w.layers[0], 0, x, out, scratch);
    /* a decode step's host share is a few experts of one layer at once: time two of them together
     * (other experts each time), the best of three */
    const int32_t n = K >= 2 && E >= 6 ? 2 : 1;
    float *outs[2] = {out, out + (n > 1 ? D : 0)};
    double best = -1.0;
    for (int32_t r = 0; r < 3; r++) {
        const int32_t ex[2] = {(2 * r) % E, (2 * r + 1) % E};
        const double t0 = engine_now_ms();
        gpu_host_experts(e, &e->w.layers[e->hp.n_layer / 2], ex, n, x, outs, scratch);
        const double dt = (engine_now_ms() - t0) / n;
        if (best < 0 || dt < best) best = dt;
    }
    g->host_ms = best;
    trace_emit(&e->trace, "cuda: --miss auto: an expert takes %.3f ms to copy and %.3f ms on the host (%d threads)%s",
               g->copy_ms, g->host_ms, pool_size(e->pool),
               g->miss_split >= 0 ? "; STRATA_CUDA_MISS_SPLIT sets the host's share" : "");
}

/* The routed experts of one layer for T tokens (see the header). Decode with every expert resident runs
 * on the device alone. Otherwise the choices come to the host, which looks every chosen expert up in the
 * cache: a prompt runs the cached ones from their slots and streams the others through the ring in the
 * loan; a decode step runs hits from their slots and each miss from the slot the cache's policy copies
 * it into, or on the host. A pair's result does not depend on the wave it ran in, so neither does the
 * reply. */
static strata_status moe(strata_engine *e, int32_t l, int32_t T) {
    cuda_state *g = e->md->gpu;
    expert_cache *c = &e->md->cache;
    const hparams *hp = &e->hp;
    const layer_weights *W = &e->w.layers[l];
    const dev_layer *dl = &g->layers[l];
    const int32_t D = hp->n_embd, E = hp->n_expert, K = hp->n_expert_used;
    const int on_device = T == 1 && g->routing && decoding(e); /* every expert resident, or --miss read: no round trip */
    const int64_t half = (int64_t)g->seg_cap * CUDA_SEG_TOKENS;
    if (on_device) {
        int32_t *sel_l = g->sel + (int64_t)l * K; /* row l: the step's choices come back with the logits */
        if (g->fused && (g->fuse2 & FUSE_ROUTER_TOPK) && W->router.type == STRATA_TYPE_F32 && D % 32 == 0 &&
            D <= 4096 && E <= 256 && K <= 32) {
            /* the ffn norm, the router's product and its top-k in one launch */
            DEV(e, cuda_norm_router_topk_f32(g->ctx, g->x, dl->ffn_norm, g->xn, g->act, (const float *)dl->router, E, D,
                                             hp->rms_eps, g->router, K, sel_l, g->wsel,
                                             (const void *const *)(g->ptr_dev + (int64_t)l * E), g->seg_w, g->seg_cap,
                                             g->seg_tok, g->seg_out, half, g->att_cnt + hp->n_head));
            g->xn_q8 = 1;
        } else {
            STRATA_TRY(norm_matvec(e, g->x, dl->ffn_norm, W->router.type, dl->router, E, g->router, T));
            DEV(e, cuda_router_topk_segments(g->ctx, g->router, T, E, K, sel_l, g->wsel,
                                             (const void *const *)(g->ptr_dev + (int64_t)l * E), g->seg_w, g->seg_cap,
                                             g->seg_tok, g->seg_out, half));
        }
        if (g->fused && W->gate_exps.type == W->up_exps.type && K <= 32) return decode_experts(e, l);
        STRATA_TRY(expert_products(e, l, T * K, 1, T));
        DEV(e, cuda_moe_combine(g->ctx, g->ye, g->wsel, g->x, T, K, D));
        return STRATA_OK;
    }
    STRATA_TRY(norm_matvec(e, g->x, dl->ffn_norm, W->router.type, dl->router, E, g->router, T));
    DEV(e, cuda_router_topk(g->ctx, g->router, T, E, K, g->sel, g->wsel));

    int32_t *sel = (int32_t *)g->stage;
    const int prompt = !decoding(e);
    /* a decode miss may run on the host (the host mirrors the decode kernel) */
    const int may_host = !prompt && g->miss_policy != STRATA_MISS_COPY;
    if (may_host && g->miss_policy == STRATA_MISS_AUTO && g->host_ms <= 0) host_rate(e);
    DEV(e, cuda_d2h(g->ctx, sel, g->sel, (size_t)T * K * 4, CUDA_STREAM_COMPUTE));
    /* a miss run on the host needs the normed token: it comes back with the choices */
    if (may_host) DEV(e, cuda_d2h(g->ctx, g->host_tmp, g->xn, (size_t)D * 4, CUDA_STREAM_COMPUTE));
    DEV(e, cuda_sync(g->ctx)); /* both streams: nothing of an earlier layer is in flight after this */
    uint8_t *state = g->exp_state;
    memset(state, EXP_IDLE, (size_t)E);
    for (int32_t i = 0; i < T * K; i++) state[sel[i]] = EXP_PENDING;
    const int32_t SEG = T == 1 ? 1 : CUDA_SEG_TOKENS;
    const int32_t cs = copy_stream(g);

    /* the hits: every chosen expert resident in a usable slot (a decode lookup pins its slot for the step) */
    cache_step_begin(c);
    int32_t n_hit = 0, n_miss = 0;
    for (int32_t ex = 0; ex < E; ex++) {
        if (state[ex] != EXP_PENDING) continue;
        const int32_t s = prompt ? cache_prefill_lookup(c, l, ex) : cache_peek(c, l, ex);
        if (s < 0) {
            n_miss++;
            continue;
        }
        if (!prompt) cache_decode_lookup(c, l, ex); /* a hit: counted, its recency and routing count */
        g->addr[ex] = cache_slot_ptr(c, s);
        state[ex] = EXP_WAVE;
        n_hit++;
    }

    if (prompt) {
        /* the hits as one wave, then the misses streamed through the ring in waves of half of it: while
         * one half's products run, the other half is copied (each half waits for the products that last
         * read it) */
        if (n_hit > 0) STRATA_TRY(run_wave(e, l, sel, T, SEG, 0));
        STRATA_ASSERT(&e->err, n_miss == 0 || (e->md->ring && e->md->ring_slots > 0));
        const int32_t halves = e->md->ring_slots >= 2 ? 2 : 1, per = e->md->ring_slots / halves;
        for (int32_t ex = 0; ex < E && n_miss > 0;) {
            const int32_t hf = (int32_t)(g->ring_wave++ % halves);
            if (g->overlap) DEV(e, cuda_stream_wait(g->ctx, g->ev_half[hf], CUDA_STREAM_COPY));
            int32_t copied = 0;
            for (; ex < E && copied < per; ex++) {
                if (state[ex] != EXP_PENDING) continue;
                uint8_t *dst = e->md->ring + ((int64_t)hf * per + copied) * c->slot_bytes;
                STRATA_TRY(gpu_expert_to(e, dst, l, ex, cs));
                e->stats.bytes_streamed += (uint64_t)expert_bytes(g, l);
                g->addr[ex] = dst;
                state[ex] = EXP_WAVE;
                copied++;
                n_miss--;
            }
            if (g->overlap) DEV(e, cuda_event_record(g->ctx, g->ev_copy, CUDA_STREAM_COPY));
            STRATA_TRY(run_wave(e, l, sel, T, SEG, copied));
            DEV(e, cuda_event_record(g->ctx, g->ev_half[hf], CUDA_STREAM_COMPUTE));
        }
        DEV(e, cuda_moe_combine(g->ctx, g->ye, g->wsel, g->x, T, K, D));
        return STRATA_OK;
    }

    /* decode: the misses the host runs (all of them under --miss host, --miss auto's share), the others
     * copied into the slots the cache's policy picks */
    int32_t n_host = may_host ? host_share(g, n_miss) : 0;
    /* --miss auto keeps its host time current: when it has chosen copies alone, one miss in 64 such steps
     * still runs on the host (the bits are the same either way), so that one slow measurement at open
     * does not decide for good */
    if (may_host && n_host == 0 && n_miss > 0 && g->miss_policy == STRATA_MISS_AUTO && g->miss_split < 0 &&
        ++g->host_probe % 64 == 0)
        n_host = 1;
    /* with the copy stream, the hits run as a wave of their own under the copies: enqueued after the
     * copies have started when a copy is a DMA alone (direct), before them when the host copies each
     * expert into the staging ring first */
    const int split = g->overlap && n_hit > 0 && n_miss > n_host;
    if (split && !g->direct) STRATA_TRY(run_wave(e, l, sel, T, SEG, 0));
    int32_t copied = 0, host_left = n_host, n_host_runs = 0;
    for (int32_t ex = 0; ex < E; ex++) {
        if (state[ex] != EXP_PENDING) continue;
        const int32_t miss = host_left > 0 ? STRATA_MISS_HOST : STRATA_MISS_COPY;
        host_left -= miss == STRATA_MISS_HOST;
        const int32_t s = cache_decode_lookup_as(c, l, ex, miss);
        STRATA_TRY(gpu_copies_ok(e));
        if (s >= 0) {
            g->addr[ex] = cache_slot_ptr(c, s);
            state[ex] = split && g->direct ? EXP_COPIED : EXP_WAVE;
            copied++;
        } else {
            if (!may_host)
                return err_set(&e->err, STRATA_ERR_INTERNAL,
                               "layer %d: no slot for expert %d (every usable slot is in use by this step)", l, ex);
            state[ex] = EXP_HOST;
            n_host_runs++;
        }
    }
    /* ev_copy comes after every copy enqueued so far, an LRU admission under --miss host included (its wave
     * does not read it). A wave that waits for it orders them all; without one (copied == 0) they stay
     * pending, and the next forward orders them before it reads any slot. */
    if (g->overlap && g->copies_pending) {
        DEV(e, cuda_event_record(g->ctx, g->ev_copy, CUDA_STREAM_COPY));
        if (copied > 0) g->copies_pending = 0;
    }
    if (split && g->direct) {
        STRATA_TRY(run_wave(e, l, sel, T, SEG, 0)); /* the hits */
        for (int32_t ex = 0; ex < E; ex++)
            if (state[ex] == EXP_COPIED) state[ex] = EXP_WAVE;
    }
    STRATA_TRY(run_wave(e, l, sel, T, SEG, copied));
    if (n_host_runs > 0) { /* the missed experts on the host while the device runs the rest */
        /* together, 32 at a time (x prepared once, two pool runs per call), in k order */
        float *xh = g->host_tmp, *yh = xh + D, *scratch = yh + (int64_t)K * D;
        for (int32_t k0 = 0; k0 < K;) {
            int32_t hex[32], hk[32], nh = 0;
            float *hout[32];
            for (; k0 < K && nh < 32; k0++)
                if (state[sel[k0]] == EXP_HOST) {
                    hex[nh] = sel[k0];
                    hk[nh] = k0;
                    hout[nh++] = yh + (int64_t)k0 * D;
                }
            if (nh == 0) continue;
            const double t0 = engine_now_ms();
            gpu_host_experts(e, W, hex, nh, xh, hout, scratch);
            const double dt = (engine_now_ms() - t0) / nh;
            g->host_ms = g->host_ms > 0 ? 0.9 * g->host_ms + 0.1 * dt : dt;
            for (int32_t i = 0; i < nh; i++)
                DEV(e, cuda_h2d(g->ctx, g->ye + (int64_t)hk[i] * D, hout[i], (size_t)D * 4, CUDA_STREAM_COMPUTE));
        }
    }
    /* x += sum_k w_k ye_k (in k order) */
    DEV(e, cuda_moe_combine(g->ctx, g->ye, g->wsel, g->x, T, K, D));
    return STRATA_OK;
}

/* ---- forward ----------------------------------------------------------------------------------- */

/* Enqueue one forward of T tokens whose embeddings (a later device of a split: the residual stream) are in
 * the staging (and, while a graph is captured, the position after them): the upload, the device's layers
 * (every layer without a split), and on the device of the last layers the logits' download when asked.
 * Nothing here waits for the device when every expert is resident and T == 1. */
static strata_status enqueue_forward(strata_engine *e, int32_t T, int32_t pos0, int want_logits) {
    cuda_state *g = e->md->gpu;
    const hparams *hp = &e->hp;
    const int32_t D = hp->n_embd;
    const float *xe = (const float *)g->stage;
    /* the host writes the staging again only after a sync (a layer's routing, or the end of this call) */
    DEV(e, cuda_h2d(g->ctx, g->x, xe, (size_t)T * D * 4, CUDA_STREAM_COMPUTE));
    if (g->pos_arg) DEV(e, cuda_h2d(g->ctx, g->pos_dev, xe + (int64_t)T * D, sizeof(int32_t), CUDA_STREAM_COMPUTE));
    for (int32_t l = e->md->layer_begin; l < e->md->layer_end; l++) {
        strata_status s = attention(e, l, T, pos0);
        if (s == STRATA_OK) s = moe(e, l, T);
        if (s != STRATA_OK) return err_prefix(&e->err, "layer %d: ", l);
        /* a prompt chunk (never a captured step: prompt_progress is set only in a prefill) */
        if (l + 1 < hp->n_layer && (s = engine_prompt_cancelled(e, l + 1)) != STRATA_OK) return s;
    }
    if (want_logits && gpu_holds_head(e)) {
        float *xl = g->x + (int64_t)(T - 1) * D;
        STRATA_TRY(norm_matvec(e, xl, g->output_norm, e->w.output.type, g->output, hp->n_vocab, g->logits_dev, 1));
        DEV(e, cuda_d2h(g->ctx, g->host_logits, g->logits_dev, (size_t)hp->n_vocab * 4, CUDA_STREAM_COMPUTE));
        if (T == 1 && g->routing && decoding(e)) /* the step's choices, row l for layer l */
            DEV(e, cuda_d2h(g->ctx, g->host_sel, g->sel, (size_t)hp->n_layer * hp->n_expert_used * 4,
                            CUDA_STREAM_COMPUTE));
    }
    return STRATA_OK;
}

/* A decode step routed on the device is done: its choices go through the cache like any step's, so the
 * counters, the recency, the adaptive policy's routing counts and the LRU's admissions are the host
 * engine's. A miss was read from the store (--miss read); an admission's copy runs on the copy stream
 * under the next steps, and the table names its slot once it has landed. */
static strata_status count_device_step(strata_engine *e) {
    cuda_state *g = e->md->gpu;
    expert_cache *c = &e->md->cache;
    const int32_t K = e->hp.n_expert_used;
    const uint64_t swaps = c->swaps;
    for (int32_t l = 0; l < e->hp.n_layer; l++) {
        cache_step_begin(c);
        for (int32_t k = 0; k < K; k++) cache_decode_lookup_as(c, l, g->host_sel[l * K + k], STRATA_MISS_READ);
    }
    STRATA_TRY(gpu_copies_ok(e));
    return c->swaps != swaps ? gpu_routing_refresh(e) : STRATA_OK;
}

/* Capture the decode step (T = 1, every expert resident, logits wanted) as a graph. The capture runs
 * nothing. On failure the step runs without a graph from then on, and the trace says why. */
static void graph_capture(strata_engine *e) {
    cuda_state *g = e->md->gpu;
    g->pos_arg = g->pos_dev;
    strata_status s = cuda_capture_begin(g->ctx);
    if (s != STRATA_OK) {
        err_set(&e->err, s, "%s", cuda_ctx_error(g->ctx));
    } else {
        const strata_status s1 = enqueue_forward(e, 1, 0, 1);
        void *exec = NULL;
        const strata_status s2 = cuda_capture_end(g->ctx, &exec);
        if (s1 == STRATA_OK && s2 != STRATA_OK) err_set(&e->err, s2, "%s", cuda_ctx_error(g->ctx));
        s = s1 != STRATA_OK ? s1 : s2;
        if (s == STRATA_OK) g->graph = exec;
        else cuda_graph_free(exec);
    }
    g->pos_arg = NULL;
    if (s == STRATA_OK) {
        g->graph_state = 1;
        trace_emit(&e->trace, "cuda: decode step captured as a graph");
    } else if (g->pdl) {
        /* a driver that does not take programmatic launches into a graph: capture without them */
        trace_emit(&e->trace, "cuda: decode step with programmatic launches not captured (%s); again without",
                   e->err.msg);
        err_clear(&e->err);
        g->pdl = 0;
        cuda_ctx_set_decode(g->ctx, g->fast, 0);
        graph_capture(e);
    } else {
        g->graph_state = -1;
        trace_emit(&e->trace, "cuda: decode step not captured (%s); running it launch by launch", e->err.msg);
        err_clear(&e->err);
    }
}

/* A layer split's forward: device by device, each its own layers in its own buffers, the residual stream of
 * the T tokens carried to the next device through the host staging (down from one card, up to the next)
 * once per pass; the logits on the device of the last layers. Decode routes each step on the host (no
 * device routing, no captured graph), so every device's cache counts its lookups as one device's would. */
static strata_status split_forward(strata_engine *e, const int32_t *tokens, int32_t T, int prompt, int want_logits) {
    const hparams *hp = &e->hp;
    const int32_t D = hp->n_embd, pos0 = e->n_past;
    for (int32_t d = 0; d < e->n_dev; d++) {
        mem_device *prev = e->md;
        e->md = &e->devs[d];
        cuda_state *g = e->md->gpu;
        STRATA_TRY(gpu_use(e));
        g->prompt = prompt;
        cuda_ctx_set_decode(g->ctx, g->fast, g->pdl && !prompt);
        STRATA_ASSERT(&e->err, T <= g->cap); /* laid out by the device's loan or its decode scratch */
        DEV(e, cuda_sync(g->ctx)); /* the staging may still be read by the copies of an earlier call */
        STRATA_TRY(gpu_order_copies(e));
        float *xe = (float *)g->stage;
        if (d == 0) {
            const quant_traits *te = quant_lookup(e->qt, e->w.tok_embd.type);
            for (int32_t t = 0; t < T; t++)
                te->dequant(e->w.tok_embd.data + (size_t)tokens[t] * e->w.tok_embd.row_bytes, xe + (int64_t)t * D, D);
        } else { /* the split point: the previous device's residual stream, through the host */
            cuda_state *pg = prev->gpu;
            e->md = prev;
            STRATA_TRY(gpu_use(e));
            DEV(e, cuda_d2h(pg->ctx, pg->stage, pg->x, (size_t)T * D * 4, CUDA_STREAM_COMPUTE));
            DEV(e, cuda_stream_sync(pg->ctx, CUDA_STREAM_COMPUTE));
            e->md = &e->devs[d];
            STRATA_TRY(gpu_use(e));
            memcpy(xe, pg->stage, (size_t)T * D * 4);
        }
        STRATA_TRY(enqueue_forward(e, T, pos0, want_logits));
    }
    cuda_state *g = e->md->gpu; /* the device of the last layers */
    if (want_logits) {
        DEV(e, cuda_sync(g->ctx));
        memcpy(e->logits, g->host_logits, (size_t)hp->n_vocab * 4);
        e->has_logits = 1;
    } else {
        DEV(e, cuda_stream_sync(g->ctx, CUDA_STREAM_COMPUTE));
    }
    return STRATA_OK;
}

strata_status gpu_forward(strata_engine *e, const int32_t *tokens, int32_t T, int prompt, int want_logits) {
    if (e->n_dev > 1) {
        const strata_status s = split_forward(e, tokens, T, prompt, want_logits);
        e->md = &e->devs[0];
        return s;
    }
    cuda_state *g = e->md->gpu;
    const int32_t pos0 = e->n_past;
    g->prompt = prompt;
    /* programmatic dependent launch only in decode (the prompt's kernels do not wait for it) */
    cuda_ctx_set_decode(g->ctx, g->fast, g->pdl && !prompt);
    const hparams *hp = &e->hp;
    const int32_t D = hp->n_embd;
    STRATA_ASSERT(&e->err, T <= g->cap); /* laid out by the prefill's loan or the decode scratch */
    STRATA_ASSERT(&e->err, pos0 + T <= e->n_ctx);
    int routed = T == 1 && want_logits && g->routing && decoding(e);
    if (routed && g->store) {
        /* the copy stream's copies into slots go on under this step: the table names none of the slots
         * they write (gpu_routing_refresh), and a copy from the pinned store reads no staging */
        DEV(e, cuda_stream_sync(g->ctx, CUDA_STREAM_COMPUTE));
        STRATA_TRY(gpu_routing_settle(e));
        routed = g->routing;
    } else {
        /* the staging below may still be read by the copies of a call that ended without logits or
         * failed (an idle stream makes this free) */
        DEV(e, cuda_sync(g->ctx));
        STRATA_TRY(gpu_order_copies(e)); /* the refill's and the swaps' copies come before this forward's work */
    }
    /* embeddings on the host (one row per token), then up */
    float *xe = (float *)g->stage;
    const quant_traits *te = quant_lookup(e->qt, e->w.tok_embd.type);
    for (int32_t t = 0; t < T; t++)
        te->dequant(e->w.tok_embd.data + (size_t)tokens[t] * e->w.tok_embd.row_bytes, xe + (int64_t)t * D, D);
    if (routed && g->graph_state >= 0) {
        memcpy(xe + D, &pos0, sizeof pos0); /* the staging holds [D] floats and then the position */
        if (g->graph_state == 0) graph_capture(e);
        if (g->graph_state == 1) {
            DEV(e, cuda_graph_launch(g->ctx, g->graph));
            DEV(e, cuda_stream_sync(g->ctx, CUDA_STREAM_COMPUTE));
            memcpy(e->logits, g->host_logits, (size_t)hp->n_vocab * 4);
            e->has_logits = 1;
            return count_device_step(e);
        }
    }
    STRATA_TRY(enqueue_forward(e, T, pos0, want_logits));
    if (want_logits) {
        DEV(e, routed && g->store ? cuda_stream_sync(g->ctx, CUDA_STREAM_COMPUTE) : cuda_sync(g->ctx));
        memcpy(e->logits, g->host_logits, (size_t)hp->n_vocab * 4);
        e->has_logits = 1;
        if (routed) return count_device_step(e);
    }
    return STRATA_OK;
}
