/*
 * forward.c — the forward pass over a chunk of tokens and the CPU backend (the chunk buffers laid out in
 * the emulated device memory, the blocks of attention.c and moe.c).
 *
 * Prompts are processed chunk-major, and layer-major inside a chunk: all T tokens of a chunk pass
 * layer l before any enters layer l + 1 (attention_block, then moe_block). A decode step is the same
 * pass with T = 1, so a token's logits do not depend on how the prompt was cut into chunks.
 */
#include <string.h>
#include <sys/mman.h>

#include "common.h"
#include "engine_internal.h"
#include "matmul.h"

/* ---- chunk buffers ------------------------------------------------------------------------------ */

/* The largest quantized activation row any product of the model needs. */
static size_t act_stride_of(const strata_engine *e) {
    const hparams *hp = &e->hp;
    size_t m = 0;
    for (int32_t l = 0; l < hp->n_layer; l++) {
        const layer_weights *L = &e->w.layers[l];
        const wview *ws[] = {&L->wq,         &L->wk,         &L->wv,       &L->wo,         &L->router,
                             &L->gate_exps,  &L->up_exps,    &L->down_exps, &L->gate_shexp, &L->up_shexp,
                             &L->down_shexp, &L->gate_dense, &L->up_dense,  &L->down_dense, &L->wq_a,
                             &L->wq_b,       &L->wkv_a,      &L->wk_b,      &L->wv_b};
        for (size_t i = 0; i < sizeof ws / sizeof ws[0]; i++) {
            if (!ws[i]->data) continue; /* a block this family does not have */
            size_t b = mm_act_row_bytes(e->qt, ws[i]->type, ws[i]->cols);
            m = b > m ? b : m;
        }
    }
    size_t b = mm_act_row_bytes(e->qt, e->w.output.type, e->w.output.cols);
    m = b > m ? b : m;
    return STRATA_ALIGN_UP(m, 64);
}

/* The largest quantized activation row of MLA's per-head products (0 for other attention kinds). */
static size_t mla_act_stride_of(const strata_engine *e) {
    size_t m = 0;
    for (int32_t l = 0; l < e->hp.n_layer && e->hp.attn == ATTN_MLA; l++) {
        const layer_weights *L = &e->w.layers[l];
        size_t a = mm_act_row_bytes(e->qt, L->wk_b.type, L->wk_b.cols);
        size_t b = mm_act_row_bytes(e->qt, L->wv_b.type, L->wv_b.cols);
        m = a > m ? a : m;
        m = b > m ? b : m;
    }
    return STRATA_ALIGN_UP(m, 64);
}

typedef struct buf_spec {
    void **ptr;
    size_t bytes;
    const char *name; /* for the arena's failure record */
} buf_spec;

static int fill_specs(strata_engine *e, chunk_buffers *cb, int32_t T, buf_spec *s) {
    const hparams *hp = &e->hp;
    const size_t D = (size_t)hp->n_embd, E = (size_t)hp->n_expert, K = (size_t)hp->n_expert_used;
    const size_t F = (size_t)hp->n_ff_exp, QD = (size_t)hp->n_head * (size_t)hp->head_dim;
    const size_t H = (size_t)hp->n_head, t = (size_t)T, QO = H * (size_t)hp->head_dim_v;
    const int mla = hp->attn == ATTN_MLA;
    /* MLA: k holds each token's latent and k_pe (the cached row); v is not used */
    const size_t KD = mla ? (size_t)hp->kv.k_dim : (size_t)hp->n_head_kv * (size_t)hp->head_dim;
    const size_t st = e->w.layers ? act_stride_of(e) : 0; /* no layers: only enumerating the buffers to free */
    const size_t mst = e->w.layers ? mla_act_stride_of(e) : 0;
    int n = 0;
#define B(field, bytes) s[n++] = (buf_spec){(void **)&cb->field, (bytes), #field}
    B(x, t * D * 4);
    B(xn, t * D * 4);
    B(act, t * st);
    B(q, t * QD * 4);
    B(k, t * KD * 4);
    B(v, mla ? 4 : t * KD * 4);
    B(att, t * (QD > QO ? QD : QO) * 4);
    if (mla) { /* only this attention's: the others' layout is unchanged */
        const size_t Lk = (size_t)hp->kv_lora_rank;
        B(mq, t * (size_t)(hp->q_lora_rank > 0 ? hp->q_lora_rank : 1) * 4);
        B(mqk, t * H * (size_t)hp->kv.k_dim * 4);
        B(mlat, t * H * Lk * 4);
        B(mact, H * t * mst);
        B(msegs, H * sizeof(mm_seg));
    }
    B(o, t * D * 4);
    B(scores, (size_t)pool_size(e->pool) * (size_t)e->n_ctx * 4);
    B(rope, (size_t)hp->head_dim * 4);
    B(router, t * E * 4);
    B(sel, t * K * 4);
    B(wsel, t * K * 4);
    B(grp_off, (E + 1) * 4);
    B(grp_tok, t * K * 4);
    B(grp_slot, t * K * 4);
    B(g, t * K * F * 4);
    B(u, t * K * F * 4);
    B(hact, t * K * st);
    B(ye, t * K * D * 4);
    if (hp->n_ff_shexp > 0 || hp->n_ff_dense > 0) { /* only families with them: the others' layout is unchanged */
        const size_t FS = (size_t)(hp->n_ff_shexp > hp->n_ff_dense ? hp->n_ff_shexp : hp->n_ff_dense);
        B(sg, t * FS * 4);
        B(su, t * FS * 4);
        B(shact, t * st);
        B(ysh, t * D * 4);
    }
    if (hp->gating == GATING_SIGMOID) B(choice, t * E * 4);
    B(segs, 2 * E * sizeof(mm_seg));
    B(views, E * sizeof(expert_view));
#undef B
    cb->act_stride = st;
    cb->mact_stride = mst;
    return n;
}

/* Lay the buffers of T tokens out in a, storing the pointers in cb (which need not be the engine's). */
static strata_status layout_into(strata_engine *e, chunk_buffers *cb, arena *a, int32_t T) {
    buf_spec s[40];
    int n = fill_specs(e, cb, T, s);
    cb->cap = 0;
    for (int i = 0; i < n; i++) {
        *s[i].ptr = arena_alloc(a, (int64_t)s[i].bytes, s[i].name);
        if (!*s[i].ptr) return STRATA_ERR_BUDGET;
    }
    cb->cap = T;
    return STRATA_OK;
}

strata_status chunk_buffers_alloc(strata_engine *e, arena *a, int32_t T) { return layout_into(e, &e->md->cb, a, T); }

int64_t chunk_buffers_bytes(const strata_engine *e, int32_t T) {
    /* the layout itself, run against a measuring arena into a scratch record: the live buffers are
     * untouched, so layout(T) may be asked at any time */
    chunk_buffers tmp;
    arena a;
    arena_init_measure(&a);
    strata_status s = layout_into((strata_engine *)e, &tmp, &a, T);
    return s == STRATA_OK ? a.used : -1;
}

strata_status chunk_buffers_use_scratch(strata_engine *e) {
    arena_reset(&e->md->scratch);
    return chunk_buffers_alloc(e, &e->md->scratch, e->n_seq); /* a decode step of every sequence */
}

void chunk_buffers_free(strata_engine *e) {
    for (int32_t d = 0; d < STRATA_MAX_DEVICES; d++) memset(&e->devs[d].cb, 0, sizeof e->devs[d].cb);
}

/* ---- forward ----------------------------------------------------------------------------------- */

strata_status engine_prompt_cancelled(strata_engine *e, int32_t layer) {
    if (!e->prompt_progress || e->prompt_progress(e->prompt_user, e->prompt_done, e->prompt_total) == 0)
        return STRATA_OK;
    return err_set(&e->err, STRATA_ERR_CANCELLED, "prefill cancelled after %d of %d prompt tokens (at layer %d of a chunk)",
                   e->prompt_done, e->prompt_total, layer);
}

strata_status engine_forward(strata_engine *e, const int32_t *tokens, int32_t T, moe_phase phase, int want_logits) {
    return e->be->forward(e, tokens, T, phase == MOE_PHASE_PREFILL, want_logits);
}

/* The embeddings of T tokens into the residual stream x [T, D]. */
static void embed_rows(strata_engine *e, const int32_t *tokens, int32_t T) {
    const hparams *hp = &e->hp;
    const int32_t D = hp->n_embd;
    chunk_buffers *cb = &e->md->cb;
    const quant_traits *te = quant_lookup(e->qt, e->w.tok_embd.type);
    for (int32_t t = 0; t < T; t++)
        te->dequant(e->w.tok_embd.data + (size_t)tokens[t] * e->w.tok_embd.row_bytes, cb->x + (int64_t)t * D, D);
    if (hp->embd_scale != 1.0f) /* granite's embedding multiplier */
        for (int64_t i = 0; i < (int64_t)T * D; i++) cb->x[i] *= hp->embd_scale;
}

/* The logits of n rows of x from row r0 on: row i's into y + (y_idx ? y_idx[i] : i) * V. Each row is
 * computed the same way whatever n is (the one-token step and a step of several sequences agree). */
static void logits_rows(strata_engine *e, int32_t r0, int32_t n, float *y, const int32_t *y_idx) {
    const hparams *hp = &e->hp;
    const int32_t D = hp->n_embd, V = hp->n_vocab;
    chunk_buffers *cb = &e->md->cb;
    rmsnorm_rows(cb->xn, cb->x + (int64_t)r0 * D, e->w.output_norm, n, D, hp->rms_eps);
    mm_quantize(e->qt, e->w.output.type, cb->xn, D, n, D, cb->act, cb->act_stride);
    mm_seg so = {quant_lookup(e->qt, e->w.output.type), e->w.output, cb->act, cb->act_stride, NULL, n, y, V, y_idx};
    mm_run(e->pool, &so, 1);
    if (hp->logit_scale != 1.0f) /* granite's logits scaling */
        for (int32_t i = 0; i < n; i++) {
            float *yi = y + (int64_t)(y_idx ? y_idx[i] : i) * V;
            for (int32_t v = 0; v < V; v++) yi[v] /= hp->logit_scale;
        }
}

/* The CPU backend's forward pass (attention.c, moe.c), device by device: layers [layer_begin, layer_end)
 * of each device run in its chunk buffers (its loan, or its decode scratch), and the residual stream of
 * the T tokens is copied into the next device's buffers at the split point, once per pass. One device: no
 * crossing. */
static strata_status cpu_layers(strata_engine *e, const int32_t *tokens, int32_t T, moe_phase phase) {
    const int32_t D = e->hp.n_embd;
    for (int32_t d = 0; d < e->n_dev; d++) {
        mem_device *prev = e->md;
        e->md = &e->devs[d];
        chunk_buffers *cb = &e->md->cb;
        STRATA_ASSERT(&e->err, T <= cb->cap); /* laid out by the prefill's loan or the decode scratch */
        if (d == 0) {
            embed_rows(e, tokens, T);
        } else {
            memcpy(cb->x, prev->cb.x, (size_t)T * (size_t)D * sizeof(float)); /* the split point */
        }
        for (int32_t l = e->md->layer_begin; l < e->md->layer_end; l++) {
            strata_status s = attention_block(e, l, T, e->n_past);
            if (s == STRATA_OK) s = moe_block(e, l, T, phase);
            if (s != STRATA_OK) return err_prefix(&e->err, "layer %d: ", l);
            /* a prompt chunk: prompt_progress is set only in a prefill */
            if (l + 1 < e->hp.n_layer && (s = engine_prompt_cancelled(e, l + 1)) != STRATA_OK) return s;
        }
    }
    return STRATA_OK;
}

static strata_status cpu_forward(strata_engine *e, const int32_t *tokens, int32_t T, int prompt, int want_logits) {
    const moe_phase phase = prompt ? MOE_PHASE_PREFILL : MOE_PHASE_DECODE;
    STRATA_ASSERT(&e->err, e->n_past + T <= e->n_ctx);
    e->md = &e->devs[0];
    strata_status s = cpu_layers(e, tokens, T, phase);
    if (s == STRATA_OK && want_logits) { /* the head, on the last layer's device */
        logits_rows(e, T - 1, 1, e->logits, NULL);
        e->has_logits = 1;
    }
    e->md = &e->devs[0];
    return s;
}

/* One decode step of T sequences: token t at position seqs[batch_seq[t]].n_past of its own sequence. The
 * pass is the prefill's pass over T rows (every product, norm and routing step computes a row the same way
 * whatever the other rows are); only attention reads each row's own KV cache (attention.c), and the
 * logits of every row are computed into its sequence's. */
static strata_status cpu_forward_batch(strata_engine *e, const int32_t *tokens, int32_t T) {
    const hparams *hp = &e->hp;
    STRATA_ASSERT(&e->err, e->n_dev == 1); /* mem_open refuses a layer split with several sequences */
    e->md = &e->devs[0];
    STRATA_ASSERT(&e->err, e->batch_seq && T <= e->md->cb.cap);

    embed_rows(e, tokens, T);
    for (int32_t l = 0; l < hp->n_layer; l++) {
        strata_status s = attention_block(e, l, T, 0);
        if (s == STRATA_OK) s = moe_block(e, l, T, MOE_PHASE_DECODE);
        if (s != STRATA_OK) return err_prefix(&e->err, "layer %d: ", l);
    }
    logits_rows(e, 0, T, e->logits_all, e->batch_seq); /* row t into sequence batch_seq[t]'s logits */
    return STRATA_OK;
}

/* ---- the CPU backend ---------------------------------------------------------------------------- */

static int64_t cpu_layout_bytes(const strata_engine *e, int32_t T) { return chunk_buffers_bytes(e, T); }

static strata_status cpu_layout(strata_engine *e, arena *a, int32_t T) { return chunk_buffers_alloc(e, a, T); }

/* memcpy is done when it returns: nothing to order */
static strata_status cpu_nothing(strata_engine *e) {
    (void)e;
    return STRATA_OK;
}

static void cpu_fail_msg(strata_engine *e, const arena *a, int32_t T, char *buf, size_t len) {
    (void)e;
    arena_chunk_fail_msg(a, T, buf, len);
}

/* The emulated device budget: one block of host memory, handed out from the front in the plan's order. */
static strata_status cpu_open(strata_engine *e, uint8_t **slab, errbuf *err) {
    mem_device *md = e->md; /* the device being opened: one block for each */
    md->dev_len = (size_t)md->plan.budget_bytes;
    void *m = mmap(NULL, md->dev_len ? md->dev_len : 1, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
                   -1, 0);
    if (m == MAP_FAILED) {
        md->dev_mem = NULL;
        return err_set(err, STRATA_ERR_OUT_OF_MEMORY,
                       "cannot reserve %.1f MiB of host memory to stand in for the device budget; lower --vram-budget",
                       (double)md->plan.budget_bytes / 1048576.0);
    }
    md->dev_mem = m;
    arena_init(&md->dev, md->dev_mem, (int64_t)md->dev_len);
    const strata_plan *pp = &md->plan;
    int ok = arena_alloc(&md->dev, pp->resident_bytes, "resident weights") != NULL;
    ok = ok && arena_alloc(&md->dev, pp->kv_bytes, "KV cache") != NULL;
    uint8_t *scr = arena_alloc(&md->dev, pp->scratch_bytes, "decode scratch");
    ok = ok && scr && arena_alloc(&md->dev, pp->reserve_bytes, "reserve") != NULL;
    if (ok && md->mp.no_cache) {
        md->own_chunk = arena_alloc(&md->dev, md->mp.own_chunk_bytes, "prompt buffers");
        ok = md->own_chunk != NULL;
    }
    *slab = ok ? arena_alloc(&md->dev, (int64_t)pp->n_slots * pp->slot_bytes, "expert cache") : NULL;
    STRATA_ASSERT(err, ok && *slab); /* the plan fitted all of these into the budget */
    arena_init(&md->scratch, scr, pp->scratch_bytes);
    return STRATA_OK;
}

static int32_t cpu_present(void) { return 1; }

static void cpu_absent_why(char *buf, size_t len) {
    if (len) buf[0] = 0;
}

static strata_status cpu_init(strata_engine *e, int64_t *free_bytes, errbuf *err) {
    (void)e;
    (void)free_bytes;
    (void)err;
    return STRATA_OK;
}

static int64_t cpu_scratch_bytes(const strata_engine *e) { return chunk_buffers_bytes(e, e->n_seq); }

static strata_status cpu_ready(strata_engine *e, double t_fill, errbuf *err) {
    (void)e;
    (void)t_fill;
    (void)err;
    return STRATA_OK; /* memcpy is done when it returns */
}

/* the emulated budget is one block handed out from the front and never given back */
static void cpu_mem_held(const strata_engine *e, int64_t *now, int64_t *peak) { *now = *peak = e->md->dev.used; }

static void cpu_close(strata_engine *e) {
    mem_device *md = e->md; /* called once for each device */
    if (md->dev_mem) munmap(md->dev_mem, md->dev_len ? md->dev_len : 1);
    md->dev_mem = NULL;
}

const backend_ops cpu_backend_ops = {
    .name = "cpu",
    .layer_split = 1,
    .present = cpu_present,
    .absent_why = cpu_absent_why,
    .init = cpu_init,
    .scratch_bytes = cpu_scratch_bytes,
    .open = cpu_open,
    .ready = cpu_ready,
    .mem_held = cpu_mem_held,
    .close = cpu_close,
    .layout_bytes = cpu_layout_bytes,
    .host_bytes = NULL,
    .layout = cpu_layout,
    .use_scratch = chunk_buffers_use_scratch,
    .copy_expert = moe_expert_copy,
    .loan_end = cpu_nothing,
    .cache_changed = cpu_nothing,
    .fail_msg = cpu_fail_msg,
    .forward = cpu_forward,
    .forward_batch = cpu_forward_batch,
};

