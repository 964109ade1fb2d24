/*
 * moe.c — the mixture-of-experts block for a chunk of T tokens (T = 1 when decoding), composed from the
 * architecture's description (arch.h).
 *
 *   xn = rmsnorm(x) * ffn_norm                               [T, D]
 *   p = softmax(xn Wr^T (+ br)), or sigmoid(xn Wr^T) (GATING_SIGMOID) [T, E]
 *   group-limited (expert_group_count G > 1): only the experts of the expert_group_used_count best groups
 *   compete (a group's score: its two best p + exp_probs_b under sigmoid, its best p under softmax)
 *   per token: the K largest p (sigmoid: of p + exp_probs_b, weighted by p; ties: lower expert id),
 *   renormalized to sum 1 when norm_topk, times routed_scale  [T, K]
 *   tokens grouped by expert; per expert e and its tokens:
 *       h = silu(xn Wg_e^T (+ bg_e)) * (xn Wu_e^T (+ bu_e))   [n_e, F]
 *           (FFN_ACT_SWIGLU_OAI: g = min(g, limit), u = clamp(u, -limit, limit), h = (u + 1) * g * sigmoid(alpha g))
 *       y = h Wd_e^T (+ bd_e)                                 [n_e, D]
 *   x[t] += (sum over k = 0..K-1 (best first) of w[t, k] * y[t, k]  + shared(xn[t])) * residual_scale
 *   shared: a resident SwiGLU of Fs = n_ff_shexp, times sigmoid(xn . gate_inp_shexp) under SHEXP_SIGMOID_GATE
 *   dense leading layers (l < n_dense_lead): x += swiglu(xn) of width n_ff_dense, no routing at all
 *
 * Every routed expert's weights are reached through moe_expert() alone: the memory plan replaces
 * what it returns (a cache slot, a staging slot of the prefill ring, or the mapped file) without
 * touching the math. The per-token sum runs in k order whatever order the experts were computed in.
 */
#include <math.h>
#include <string.h>

#include "engine_internal.h"
#include "matmul.h"

/* ---- expert access (the seam of the memory plan) ----------------------------------------------- */

/* The expert's slices in the mapped file (host memory). */
static void host_view(const strata_engine *e, int32_t layer, int32_t expert, expert_view *out) {
    const layer_weights *L = &e->w.layers[layer];
    const int64_t F = e->hp.n_ff_exp, D = e->hp.n_embd;
    out->gate = L->gate_exps;
    out->gate.rows = F;
    out->gate.data += (size_t)expert * (size_t)F * L->gate_exps.row_bytes;
    out->up = L->up_exps;
    out->up.rows = F;
    out->up.data += (size_t)expert * (size_t)F * L->up_exps.row_bytes;
    out->down = L->down_exps;
    out->down.rows = D;
    out->down.data += (size_t)expert * (size_t)D * L->down_exps.row_bytes;
}

/* A slot holds gate, up and down back to back, each in the file's own layout. */
static void slot_view(const expert_view *host, const uint8_t *slot, expert_view *out) {
    *out = *host;
    size_t gb = (size_t)host->gate.rows * host->gate.row_bytes, ub = (size_t)host->up.rows * host->up.row_bytes;
    out->gate.data = slot;
    out->up.data = slot + gb;
    out->down.data = slot + gb + ub;
}

/* layer is the model's (a layer with experts: not a dense leading one). */
int64_t moe_expert_copy(void *ctx, int32_t layer, int32_t expert, uint8_t *dst) {
    const strata_engine *e = ctx;
    expert_view h;
    host_view(e, layer, expert, &h);
    size_t gb = (size_t)h.gate.rows * h.gate.row_bytes, ub = (size_t)h.up.rows * h.up.row_bytes;
    size_t db = (size_t)h.down.rows * h.down.row_bytes;
    memcpy(dst, h.gate.data, gb);
    memcpy(dst + gb, h.up.data, ub);
    memcpy(dst + gb + ub, h.down.data, db);
    return (int64_t)(gb + ub + db);
}

/* Decode: a hit runs from its slot; a miss from host memory, or from the victim slot it was copied
 * into (--miss copy). Prefill: a resident expert runs from its slot, any other is copied from the
 * mapped file into the next ring slot (the ring is laid out in the loan; moe_block fetches at most
 * ring-depth experts before computing them, so a ring slot is never reused while in use). */
strata_status moe_expert(strata_engine *e, int32_t layer, int32_t expert, moe_phase phase, expert_view *out) {
    STRATA_ASSERT(&e->err, layer >= 0 && layer < e->hp.n_layer && expert >= 0 && expert < e->hp.n_expert);
    STRATA_ASSERT(&e->err, layer >= e->hp.n_dense_lead);
    host_view(e, layer, expert, out);
    expert_cache *c = &e->md->cache;
    if (c->n_slots == 0) return STRATA_OK; /* no expert cache: host memory */
    /* the cache takes model layers; it holds the layers with experts only */
    if (phase == MOE_PHASE_DECODE) {
        int32_t s = cache_decode_lookup(c, layer, expert);
        if (s >= 0) slot_view(out, cache_slot_ptr(c, s), out);
        return STRATA_OK;
    }
    int32_t s = cache_prefill_lookup(c, layer, expert);
    if (s >= 0) {
        slot_view(out, cache_slot_ptr(c, s), out);
        return STRATA_OK;
    }
    STRATA_ASSERT(&e->err, e->md->ring && e->md->ring_slots > 0);
    uint8_t *dst = e->md->ring + (size_t)(e->md->ring_next++ % e->md->ring_slots) * (size_t)c->slot_bytes;
    int64_t n = moe_expert_copy(e, layer, expert, dst);
    e->stats.bytes_streamed += (uint64_t)n;
    slot_view(out, dst, out);
    return STRATA_OK;
}

/* ---- routing ----------------------------------------------------------------------------------- */

/* Group-limited top-k: the E experts are G groups of E / G in id order; a group scores the sum of its two
 * best values (top2: sigmoid routing, DeepSeek V3) or its best (softmax routing, DeepSeek V2), the Gu best
 * groups are kept (ties: lower group) and every expert of the others gets `off`, below any value it could
 * be picked by. G of 1 keeps everything. */
#define MOE_MAX_GROUPS 64
static void group_limit(float *v, int32_t E, int32_t G, int32_t Gu, int top2, float off) {
    if (G <= 1 || Gu >= G) return;
    const int32_t n = E / G;
    float gs[MOE_MAX_GROUPS];
    for (int32_t g = 0; g < G; g++) {
        const float *vg = v + (int64_t)g * n;
        float b1 = -INFINITY, b2 = -INFINITY;
        for (int32_t i = 0; i < n; i++) {
            if (vg[i] > b1) {
                b2 = b1;
                b1 = vg[i];
            } else if (vg[i] > b2) {
                b2 = vg[i];
            }
        }
        gs[g] = top2 && n > 1 ? b1 + b2 : b1;
    }
    int32_t keep[MOE_MAX_GROUPS] = {0};
    for (int32_t k = 0; k < Gu; k++) {
        int32_t best = -1;
        for (int32_t g = 0; g < G; g++)
            if (!keep[g] && (best < 0 || gs[g] > gs[best])) best = g;
        keep[best] = 1;
    }
    for (int32_t g = 0; g < G; g++)
        if (!keep[g])
            for (int32_t i = 0; i < n; i++) v[(int64_t)g * n + i] = off;
}

/* Softmax of E logits in place, then the K best (ties: lower id) with weights renormalized. Each pick
 * marks its entry with -1 (probabilities are >= 0), so a pick costs one pass over E. */
static void route_token(float *p, int32_t E, int32_t K, int32_t G, int32_t Gu, int32_t norm, float scale, int32_t *sel,
                        float *w) {
    float mx = -INFINITY;
    for (int32_t i = 0; i < E; i++) mx = p[i] > mx ? p[i] : mx;
    float sum = 0.0f;
    for (int32_t i = 0; i < E; i++) {
        p[i] = expf(p[i] - mx);
        sum += p[i];
    }
    for (int32_t i = 0; i < E; i++) p[i] /= sum;
    group_limit(p, E, G, Gu, 0, -2.0f); /* below the -1 of a pick, never picked (K fits in the kept groups) */
    float wsum = 0.0f;
    for (int32_t k = 0; k < K; k++) {
        int32_t best = 0;
        for (int32_t i = 1; i < E; i++)
            if (p[i] > p[best]) best = i;
        sel[k] = best;
        w[k] = p[best];
        wsum += p[best];
        p[best] = -1.0f;
    }
    if (norm)
        for (int32_t k = 0; k < K; k++) w[k] /= wsum;
    if (scale != 1.0f)
        for (int32_t k = 0; k < K; k++) w[k] *= scale;
}

/* Sigmoid routing (glm4moe, DeepSeek V3): s = sigmoid(logits) in place; the K best of s + bias (ties:
 * lower id; bias may be NULL) are picked, and weighted by s itself, renormalized when norm. */
static void route_token_sigmoid(float *p, float *choice, const float *bias, int32_t E, int32_t K, int32_t G, int32_t Gu,
                                int32_t norm, float scale, int32_t *sel, float *w) {
    for (int32_t i = 0; i < E; i++) {
        p[i] = 1.0f / (1.0f + expf(-p[i]));
        choice[i] = bias ? p[i] + bias[i] : p[i];
    }
    group_limit(choice, E, G, Gu, 1, -INFINITY);
    float wsum = 0.0f;
    for (int32_t k = 0; k < K; k++) {
        int32_t best = 0;
        for (int32_t i = 1; i < E; i++)
            if (choice[i] > choice[best]) best = i;
        sel[k] = best;
        w[k] = p[best];
        wsum += p[best];
        choice[best] = -INFINITY;
    }
    if (norm)
        for (int32_t k = 0; k < K; k++) w[k] /= wsum;
    if (scale != 1.0f)
        for (int32_t k = 0; k < K; k++) w[k] *= scale;
}

static inline float silu(float x) { return x / (1.0f + expf(-x)); }

/* The experts' activation for experts x0 .. x1 - 1 of a batch, in place into g: rows [grp_off[x], grp_off[x + 1])
 * of g and u (F values each) belong to expert x, and get its gate and up biases first where the file has them. */
static void expert_act(const hparams *hp, const layer_weights *L, const int32_t *grp_off, int32_t x0, int32_t x1,
                       float *g, const float *u) {
    const int64_t F = hp->n_ff_exp;
    const float alpha = hp->swiglu_alpha, lim = hp->swiglu_limit;
    for (int32_t x = x0; x < x1; x++) {
        const float *bg = L->gate_exps_b ? L->gate_exps_b + (int64_t)x * F : NULL;
        const float *bu = L->up_exps_b ? L->up_exps_b + (int64_t)x * F : NULL;
        for (int64_t r = grp_off[x]; r < grp_off[x + 1]; r++) {
            float *gr = g + r * F;
            const float *ur = u + r * F;
            for (int64_t i = 0; i < F; i++) {
                float gv = bg ? gr[i] + bg[i] : gr[i], uv = bu ? ur[i] + bu[i] : ur[i];
                if (hp->ffn_act == FFN_ACT_SWIGLU_OAI) {
                    gv = gv > lim ? lim : gv;
                    uv = uv > lim ? lim : uv < -lim ? -lim : uv;
                    gr[i] = (uv + 1.0f) * gv / (1.0f + expf(-alpha * gv));
                } else {
                    gr[i] = silu(gv) * uv;
                }
            }
        }
    }
}

/* ---- dense SwiGLU: the shared expert, a dense leading layer ------------------------------------ */

/* ysh = silu(xn Wg^T) * (xn Wu^T) Wd^T for every token (F = the weights' hidden width), times
 * sigmoid(xn . sgate) when sgate is given. These weights are resident (not experts the cache moves).
 * Reads cb->xn; clobbers cb->act. */
static void dense_swiglu(strata_engine *e, const wview *wg, const wview *wu, const wview *wd, const float *sgate,
                         int32_t T) {
    const hparams *hp = &e->hp;
    chunk_buffers *cb = &e->md->cb;
    const int32_t D = hp->n_embd, FS = (int32_t)wg->rows;
    const quant_traits *qg = quant_lookup(e->qt, wg->type), *qu = quant_lookup(e->qt, wu->type);
    const quant_traits *qd = quant_lookup(e->qt, wd->type);
    mm_quantize(e->qt, wg->type, cb->xn, D, T, D, cb->act, cb->act_stride);
    if (qg->act_type == qu->act_type) {
        mm_seg s[2] = {{qg, *wg, cb->act, cb->act_stride, NULL, T, cb->sg, FS, NULL},
                       {qu, *wu, cb->act, cb->act_stride, NULL, T, cb->su, FS, NULL}};
        mm_run(e->pool, s, 2);
    } else {
        mm_seg sg = {qg, *wg, cb->act, cb->act_stride, NULL, T, cb->sg, FS, NULL};
        mm_run(e->pool, &sg, 1);
        mm_quantize(e->qt, wu->type, cb->xn, D, T, D, cb->act, cb->act_stride);
        mm_seg su = {qu, *wu, cb->act, cb->act_stride, NULL, T, cb->su, FS, NULL};
        mm_run(e->pool, &su, 1);
    }
    for (int64_t i = 0; i < (int64_t)T * FS; i++) cb->sg[i] = silu(cb->sg[i]) * cb->su[i];
    mm_quantize(e->qt, wd->type, cb->sg, FS, T, FS, cb->shact, cb->act_stride);
    mm_seg sd = {qd, *wd, cb->shact, cb->act_stride, NULL, T, cb->ysh, D, NULL};
    mm_run(e->pool, &sd, 1);
    if (sgate)
        for (int32_t t = 0; t < T; t++) {
            const float *xt = cb->xn + (int64_t)t * D;
            double z = 0.0; /* one dot of D values, in order */
            for (int32_t d = 0; d < D; d++) z += (double)xt[d] * (double)sgate[d];
            const float gt = 1.0f / (1.0f + expf(-(float)z));
            float *yt = cb->ysh + (int64_t)t * D;
            for (int32_t d = 0; d < D; d++) yt[d] *= gt;
        }
}

static void shared_expert(strata_engine *e, const layer_weights *L, int32_t T) {
    dense_swiglu(e, &L->gate_shexp, &L->up_shexp, &L->down_shexp,
                 e->hp.ad->shexp == SHEXP_SIGMOID_GATE ? L->shexp_gate : NULL, T);
}

/* ---- the block --------------------------------------------------------------------------------- */

strata_status moe_block(strata_engine *e, int32_t l, int32_t T, moe_phase phase) {
    const hparams *hp = &e->hp;
    const layer_weights *L = &e->w.layers[l];
    chunk_buffers *cb = &e->md->cb;
    const int32_t D = hp->n_embd, E = hp->n_expert, K = hp->n_expert_used, F = hp->n_ff_exp;
    STRATA_ASSERT(&e->err, T <= cb->cap);

    rmsnorm_rows(cb->xn, cb->x, L->ffn_norm, T, D, hp->rms_eps);

    if (l < hp->n_dense_lead) { /* a dense leading layer: one SwiGLU, no router, no experts */
        dense_swiglu(e, &L->gate_dense, &L->up_dense, &L->down_dense, NULL, T);
        const float rs = hp->residual_scale;
        for (int64_t i = 0; i < (int64_t)T * D; i++) cb->x[i] += rs != 1.0f ? cb->ysh[i] * rs : cb->ysh[i];
        return STRATA_OK;
    }

    /* router */
    mm_quantize(e->qt, L->router.type, cb->xn, D, T, D, cb->act, cb->act_stride);
    mm_seg sr = {quant_lookup(e->qt, L->router.type), L->router, cb->act, cb->act_stride, NULL, T, cb->router, E, NULL};
    mm_run(e->pool, &sr, 1);
    for (int32_t t = 0; t < T; t++) {
        float *pt = cb->router + (int64_t)t * E;
        int32_t *st = cb->sel + (int64_t)t * K;
        float *wt = cb->wsel + (int64_t)t * K;
        if (L->router_b)
            for (int32_t i = 0; i < E; i++) pt[i] += L->router_b[i];
        if (hp->gating == GATING_SIGMOID)
            route_token_sigmoid(pt, cb->choice + (int64_t)t * E, L->exp_bias, E, K, hp->n_group, hp->n_group_used,
                                hp->norm_topk, hp->routed_scale, st, wt);
        else
            route_token(pt, E, K, hp->n_group, hp->n_group_used, hp->norm_topk, hp->routed_scale, st, wt);
    }

    /* group the (token, k) pairs by expert, tokens ascending inside a group */
    memset(cb->grp_off, 0, sizeof(int32_t) * (size_t)(E + 1));
    for (int64_t i = 0; i < (int64_t)T * K; i++) cb->grp_off[cb->sel[i] + 1]++;
    for (int32_t x = 0; x < E; x++) cb->grp_off[x + 1] += cb->grp_off[x];
    for (int32_t x = 0, n = 0; x < E; x++) {
        /* a scan per expert keeps this allocation-free; T * K * E is tiny next to the products */
        if (cb->grp_off[x + 1] == cb->grp_off[x]) continue;
        n = cb->grp_off[x];
        for (int32_t t = 0; t < T; t++)
            for (int32_t k = 0; k < K; k++)
                if (cb->sel[(int64_t)t * K + k] == x) {
                    cb->grp_tok[n] = t;
                    cb->grp_slot[n] = t * K + k;
                    n++;
                }
    }

    /* Experts in batches: all active experts at once, except while a prompt streams experts through
     * the ring, where a batch holds at most ring-depth experts. Each (token, k) row is computed the same
     * way whatever the batch, so the batching never changes a result. */
    mm_quantize(e->qt, L->gate_exps.type, cb->xn, D, T, D, cb->act, cb->act_stride);
    const quant_traits *qg = quant_lookup(e->qt, L->gate_exps.type);
    const quant_traits *qd = quant_lookup(e->qt, L->down_exps.type);
    const int32_t batch = phase == MOE_PHASE_PREFILL && e->md->moe_batch > 0 ? e->md->moe_batch : E;
    mm_seg *segs = cb->segs;          /* [2 * batch] */
    expert_view *views = cb->views;   /* [batch] */
    for (int32_t x0 = 0; x0 < E;) {
        cache_step_begin(&e->md->cache); /* the slots of this batch are pinned until the next one */
        int32_t ns = 0, a = 0, x = x0;
        for (; x < E && a < batch; x++) {
            int32_t off = cb->grp_off[x], n = cb->grp_off[x + 1] - off;
            if (n == 0) continue;
            STRATA_TRY(moe_expert(e, l, x, phase, &views[a]));
            segs[ns++] = (mm_seg){qg, views[a].gate, cb->act, cb->act_stride, cb->grp_tok + off, n, cb->g + (int64_t)off * F, F, NULL};
            segs[ns++] = (mm_seg){qg, views[a].up, cb->act, cb->act_stride, cb->grp_tok + off, n, cb->u + (int64_t)off * F, F, NULL};
            a++;
        }
        const int32_t x1 = x, r0 = cb->grp_off[x0], r1 = cb->grp_off[x1]; /* rows [r0, r1) of this batch */
        if (a > 0) {
            mm_run(e->pool, segs, ns);

            /* SwiGLU, quantized per row for the down products */
            expert_act(hp, L, cb->grp_off, x0, x1, cb->g, cb->u);
            mm_quantize(e->qt, L->down_exps.type, cb->g + (int64_t)r0 * F, F, r1 - r0, F,
                        cb->hact + (size_t)r0 * cb->act_stride, cb->act_stride);

            /* down of every expert of the batch, each output row going to its (token, k) slot */
            ns = 0;
            a = 0;
            for (x = x0; x < x1; x++) {
                int32_t off = cb->grp_off[x], n = cb->grp_off[x + 1] - off;
                if (n == 0) continue;
                segs[ns++] = (mm_seg){qd, views[a].down, cb->hact + (size_t)off * cb->act_stride, cb->act_stride, NULL,
                                      n, cb->ye, D, cb->grp_slot + off};
                a++;
            }
            mm_run(e->pool, segs, ns);
        }
        x0 = x1;
    }

    if (hp->n_ff_shexp > 0) shared_expert(e, L, T);

    /* weighted sum in k order (best expert first), the shared expert after it, then into the residual
     * stream (granite scales the block's output first) */
    const float rs = hp->residual_scale;
    for (int32_t t = 0; t < T; t++) {
        float *xt = cb->x + (int64_t)t * D;
        const float *wt = cb->wsel + (int64_t)t * K;
        const float *ys = hp->n_ff_shexp > 0 ? cb->ysh + (int64_t)t * D : NULL;
        const int32_t *st = cb->sel + (int64_t)t * K;
        for (int32_t d = 0; d < D; d++) {
            float acc = 0.0f;
            if (L->down_exps_b) /* each expert's down bias, inside its weighted term */
                for (int32_t k = 0; k < K; k++)
                    acc += wt[k] * (cb->ye[((int64_t)t * K + k) * D + d] + L->down_exps_b[(int64_t)st[k] * D + d]);
            else
                for (int32_t k = 0; k < K; k++) acc += wt[k] * cb->ye[((int64_t)t * K + k) * D + d];
            if (ys) acc += ys[d];
            xt[d] += rs != 1.0f ? acc * rs : acc;
        }
    }
    return STRATA_OK;
}
