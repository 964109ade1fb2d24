/*
 * cuda/host_memory.c — the CUDA backend's memory (see cuda/host.h): layout(T) of a chunk's buffers, the
 * decode scratch, the expert store and the copies into slots, the device side of the loan and the refill,
 * open and close, and the backend table (cuda_backend_ops) the plan, the cache and the loan call.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda/host.h"
#include "group_dequant.h"
#include "trace.h"

static strata_status upload(strata_engine *e, void **dst, const void *src, size_t bytes, const char *what) {
    cuda_state *g = e->md->gpu;
    DEV(e, cuda_alloc(g->ctx, bytes, dst, what));
    DEV(e, cuda_h2d(g->ctx, *dst, src, bytes, CUDA_STREAM_COMPUTE));
    return STRATA_OK;
}

static size_t wbytes(const wview *w) { return (size_t)w->rows * w->row_bytes; }

static strata_status check_type(strata_engine *e, const wview *w, const char *name) {
    if (!cuda_type_supported(w->type))
        return err_set(&e->err, STRATA_ERR_UNSUPPORTED,
                       "--device cuda: tensor %s is %s, which the CUDA kernels do not run (they run F32, F16, BF16, "
                       "Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_NL, IQ4_XS, IQ3_XXS, IQ3_S, "
                       "IQ2_XXS, IQ2_XS, IQ2_S, IQ1_S, IQ1_M and MXFP4); use --device cpu for this file",
                       name, quant_type_name(w->type) ? quant_type_name(w->type) : "an unknown type");
    return STRATA_OK;
}

/* ---- layout(T): the buffers of a chunk ---------------------------------------------------------- */

/* Splits per head of decode attention beyond 256 positions: about 128 blocks in all, at most 8 (a shape
 * fact, so the reply does not depend on anything else). */
static int32_t att_splits(int32_t H) {
    const int32_t s = 128 / (H > 0 ? H : 1);
    return s < 1 ? 1 : (s > 8 ? 8 : s);
}

/* Lay the buffers of T tokens out in arena a into the buffer fields of b (the engine's state, or a copy
 * of it when only measuring). The one layout the plan sizes loans with (cuda_layout_bytes) and the loan
 * and the decode scratch use. */
static strata_status layout_into(const strata_engine *e, cuda_state *b, arena *a, int32_t T) {
    const hparams *hp = &e->hp;
    const int64_t D = hp->n_embd, K = hp->n_expert_used, F = hp->n_ff_exp, E = hp->n_expert;
    const int64_t QD = (int64_t)hp->n_head * hp->head_dim, KD = (int64_t)hp->n_head_kv * hp->head_dim;
    const int64_t rows_sel = T > hp->n_layer ? T : hp->n_layer;
    b->act_row = STRATA_ALIGN_UP(cuda_act_row_bytes(STRATA_TYPE_Q8_0, QD > D ? QD : D), 16);
    b->hact_row = STRATA_ALIGN_UP(cuda_act_row_bytes(STRATA_TYPE_Q8_0, F), 16);
    b->seg_cap = (int32_t)seg_cap_of(e, T);
    struct {
        void **p;
        int64_t bytes;
        const char *what;
    } s[] = {
        {(void **)&b->x, T * D * 4, "the residual stream"},
        {(void **)&b->xn, T * (QD > D ? QD : D) * 4, "normed activations"},
        {(void **)&b->q, T * QD * 4, "queries"},
        {(void **)&b->k, T * KD * 4, "keys"},
        {(void **)&b->v, T * KD * 4, "values"},
        {(void **)&b->att, T * QD * 4, "attention output"},
        {(void **)&b->router, T * E * 4, "router logits"},
        {(void **)&b->wsel, T * K * 4, "expert weights"},
        {(void **)&b->g, T * K * F * 4, "gate products"},
        {(void **)&b->u, T * K * F * 4, "up products"},
        {(void **)&b->h, T * K * F * 4, "expert hidden states"},
        {(void **)&b->ye, T * K * D * 4, "expert outputs"},
        {(void **)&b->sel, rows_sel * K * 4, "expert choices"},
        {(void **)&b->act, T * b->act_row, "quantized activations"},
        {(void **)&b->hact, T * K * b->hact_row, "quantized expert activations"},
        {(void **)&b->seg_w, 3 * (int64_t)b->seg_cap * (int64_t)sizeof(void *), "expert segment table"},
        {(void **)&b->seg_tok, 2 * (int64_t)b->seg_cap * CUDA_SEG_TOKENS * 4, "segment tokens"},
        {(void **)&b->seg_out, 2 * (int64_t)b->seg_cap * CUDA_SEG_TOKENS * 4, "segment rows"},
    };
    b->cap = 0;
    for (size_t i = 0; i < sizeof s / sizeof s[0]; i++) {
        /* every buffer on 64 bytes: the kernels' 16-byte loads of activation rows need it */
        *s[i].p = arena_alloc(a, s[i].bytes, s[i].what);
        if (!*s[i].p) return STRATA_ERR_BUDGET;
    }
    b->cap = T;
    return STRATA_OK;
}

static int64_t cuda_layout_bytes(const strata_engine *e, int32_t T) {
    cuda_state tmp = *e->md->gpu; /* the live buffers are untouched: layout(T) may be asked at any time */
    arena a;
    arena_init_measure(&a);
    return layout_into(e, &tmp, &a, T) == STRATA_OK ? a.used : -1;
}

/* Host RAM a chunk of T tokens borrows: the pinned staging of its embeddings, the expert choices and the
 * segment tables of one wave. */
static int64_t stage_bytes_of(const strata_engine *e, int32_t T) {
    const int64_t D = e->hp.n_embd, K = e->hp.n_expert_used, seg_cap = seg_cap_of(e, T);
    const int64_t rows = T > e->hp.n_layer ? T : e->hp.n_layer;
    return T * D * 4 + rows * K * 8 + 3 * seg_cap * (int64_t)sizeof(void *) + 4 * seg_cap * CUDA_SEG_TOKENS * 4 + 4096;
}

static int64_t cuda_host_bytes(const strata_engine *e, int32_t T) { return stage_bytes_of(e, T); }

/* The pinned staging for chunks of up to T tokens (grown, never shrunk: it is host RAM the plan counted). */
static strata_status stage_reserve(strata_engine *e, int32_t T) {
    cuda_state *g = e->md->gpu;
    const size_t need = (size_t)stage_bytes_of(e, T);
    if (need <= g->stage_bytes) return STRATA_OK;
    DEV(e, cuda_sync(g->ctx)); /* the old staging may still be read by a copy */
    /* a captured decode step reads its embedding from the staging: captured again on the next step */
    cuda_graph_free(g->graph);
    g->graph = NULL;
    if (g->graph_state == 1) g->graph_state = 0;
    cuda_host_free(g->ctx, g->stage);
    g->stage = NULL;
    g->stage_bytes = 0;
    DEV(e, cuda_host_alloc(g->ctx, need, &g->stage));
    g->stage_bytes = need;
    return STRATA_OK;
}

static strata_status cuda_layout(strata_engine *e, arena *a, int32_t T) {
    STRATA_TRY(gpu_use(e));
    STRATA_TRY(layout_into(e, e->md->gpu, a, T));
    return stage_reserve(e, T);
}

static strata_status cuda_use_scratch(strata_engine *e) {
    cuda_state *g = e->md->gpu;
    STRATA_TRY(gpu_use(e));
    arena a;
    arena_init(&a, g->scratch, g->scratch_len);
    return layout_into(e, g, &a, 1); /* the same addresses every time: the captured graph holds them */
}

/* Device bytes of the decode scratch: layout(1) plus the decode step's own tables (logits, the split
 * attention's states, counters, the expert address table and the position), each rounded as cuda_alloc
 * hands them out. */
static int64_t decode_tables_bytes(const strata_engine *e) {
    const hparams *hp = &e->hp;
    const int64_t LE = (int64_t)hp->n_layer * hp->n_expert;
    return arena_size_of((int64_t)hp->n_vocab * 4) +
           arena_size_of((int64_t)hp->n_head * att_splits(hp->n_head) * (hp->head_dim + 2) * 4) +
           arena_size_of((int64_t)(hp->n_head + 1) * 4) + arena_size_of(LE * (int64_t)sizeof(exp_ptrs)) +
           arena_size_of(4);
}

/* Device bytes of the decode scratch: layout(1) and the decode step's tables (the plan's scratch). */
static int64_t cuda_forward_scratch_bytes(const strata_engine *e) {
    const int64_t one = cuda_layout_bytes(e, 1);
    return one < 0 ? -1 : one + decode_tables_bytes(e);
}

/* A chunk's layout that did not fit its loan, with the device's figures: the free memory the CUDA
 * allocator reports and the card's total, what the loan's buffers took, and the failing buffer. */
static void cuda_fail_msg(strata_engine *e, const arena *a, int32_t T, char *buf, size_t len) {
    int64_t free_b = 0, total_b = 0;
    if (gpu_use(e) != STRATA_OK || cuda_mem_info(e->md->gpu->ctx, &free_b, &total_b) != STRATA_OK) {
        arena_chunk_fail_msg(a, T, buf, len);
        return;
    }
    arena_chunk_fail_msg_device(a, T, free_b, total_b, buf, len);
}

/* ---- the expert store and copies into slots ---------------------------------------------------- */

/* One expert's gate | up | down, copied piece by piece into a staging buffer by the pool. */
typedef struct stage_job {
    uint8_t *dst;          /* [gate_bytes + up_bytes + down_bytes] */
    const uint8_t *src[3]; /* gate, up, down in the mapped file */
    int64_t len[3];
    int64_t piece;         /* bytes per item: one item per thread */
} stage_job;

static void stage_piece(void *ctx, int64_t item, int thread) {
    (void)thread;
    const stage_job *j = ctx;
    int64_t lo = item * j->piece, hi = lo + j->piece, base = 0;
    for (int p = 0; p < 3; p++) { /* the part of [lo, hi) that falls in each of the three ranges */
        const int64_t a = lo > base ? lo : base, b = hi < base + j->len[p] ? hi : base + j->len[p];
        if (a < b) memcpy(j->dst + a, j->src[p] + (a - base), (size_t)(b - a));
        base += j->len[p];
    }
}

/* Copy expert (l, ex) — gate, up and down back to back — into device memory at dst (a slot or a ring
 * slot) on `stream`, from the store. */
strata_status gpu_expert_to(strata_engine *e, uint8_t *dst, int32_t l, int32_t ex, int32_t stream) {
    cuda_state *g = e->md->gpu;
    const layer_weights *L = &e->w.layers[l];
    const int64_t gb = g->xbytes[3 * l], ub = g->xbytes[3 * l + 1], db = g->xbytes[3 * l + 2], n = gb + ub + db;
    const uint8_t *src_g = L->gate_exps.data + ex * gb;
    const uint8_t *src_u = L->up_exps.data + ex * ub;
    const uint8_t *src_d = L->down_exps.data + ex * db;
    if (g->store) {
        /* pinned: one DMA at full PCIe speed, nothing for the host to copy and nothing to wait for */
        DEV(e, cuda_h2d(g->ctx, dst, g->store + g->store_off[l] + ex * n, (size_t)n, stream));
    } else if (g->reg_parts || !g->ring[0]) {
        /* the mapping page-locked (or, without staging, pageable): three DMAs straight from the file */
        DEV(e, cuda_h2d(g->ctx, dst, src_g, (size_t)gb, stream));
        DEV(e, cuda_h2d(g->ctx, dst + gb, src_u, (size_t)ub, stream));
        DEV(e, cuda_h2d(g->ctx, dst + gb + ub, src_d, (size_t)db, stream));
    } else {
        const int32_t i = g->ring_next;
        g->ring_next = (i + 1) % STAGE_RING;
        DEV(e, cuda_event_wait(g->ctx, g->ring_done[i])); /* its last DMA has left the buffer */
        /* one piece per thread, so that every thread copies */
        const int64_t nt = pool_size(e->pool) > 0 ? pool_size(e->pool) : 1;
        const int64_t piece = STRATA_ALIGN_UP((n + nt - 1) / nt, STAGE_PIECE);
        stage_job j = {g->ring[i], {src_g, src_u, src_d}, {gb, ub, db}, piece};
        pool_run(e->pool, (n + piece - 1) / piece, stage_piece, &j);
        /* the slot's layout is gate | up | down back to back, as in the buffer: one DMA */
        DEV(e, cuda_h2d(g->ctx, dst, g->ring[i], (size_t)n, stream));
        DEV(e, cuda_event_record(g->ctx, g->ring_done[i], stream));
    }
    return STRATA_OK;
}


/* The expert cache's copy function (cache.c calls it when it places an expert in a slot): a DMA on the
 * copy stream. A failure is kept in copy_status (the function returns bytes) and reported by the caller
 * of the cache operation. */
static int64_t cuda_copy_expert(void *ctx, int32_t l, int32_t ex, uint8_t *dst) {
    strata_engine *e = ctx;
    cuda_state *g = e->md->gpu; /* the cache that copies is the device's in use (memory.c points e->md at it) */
    strata_status s = gpu_use(e);
    if (s == STRATA_OK) s = gpu_expert_to(e, dst, l, ex, copy_stream(g));
    if (s != STRATA_OK) {
        if (g->copy_status == STRATA_OK) g->copy_status = s;
        return 0;
    }
    if (g->overlap) g->copies_pending = 1;
    if (dst >= g->slab && g->slot_bytes > 0) { /* a slot (a ring slot of the prompt's is never one) */
        g->slot_seq[(dst - g->slab) / g->slot_bytes] = g->seq_open;
        g->seq_dirty = 1;
    }
    return expert_bytes(g, l);
}

/* The cache operation that just ran copied with no failure (else its message). */
strata_status gpu_copies_ok(strata_engine *e) {
    cuda_state *g = e->md->gpu;
    const strata_status s = g->copy_status;
    g->copy_status = STRATA_OK;
    if (s != STRATA_OK) return err_prefix(&e->err, "copying an expert into the device cache: ");
    return STRATA_OK;
}

/* Work enqueued on the compute stream from now on comes after every copy enqueued so far. */
strata_status gpu_order_copies(strata_engine *e) {
    cuda_state *g = e->md->gpu;
    if (!g->copies_pending) return STRATA_OK;
    g->copies_pending = 0;
    DEV(e, cuda_stream_order(g->ctx, CUDA_STREAM_COPY, CUDA_STREAM_COMPUTE));
    return STRATA_OK;
}

/* Close the batch of copies into slots made since the last call (an event after them on the copy
 * stream), then move seq_done past every batch that has landed; wait_all: wait for all of them. */
static strata_status copies_landed(strata_engine *e, int wait_all) {
    cuda_state *g = e->md->gpu;
    if (g->seq_dirty) {
        while (g->seq_open - g->seq_done > SEQ_EVENTS) { /* the oldest batch's event is needed again */
            DEV(e, cuda_event_wait(g->ctx, g->seq_ev[(g->seq_done + 1) % SEQ_EVENTS]));
            g->seq_done++;
        }
        DEV(e, cuda_event_record(g->ctx, g->seq_ev[g->seq_open % SEQ_EVENTS], copy_stream(g)));
        g->seq_open++;
        g->seq_dirty = 0;
    }
    while (g->seq_done + 1 < g->seq_open) {
        void *ev = g->seq_ev[(g->seq_done + 1) % SEQ_EVENTS];
        int32_t done = 1;
        if (wait_all) DEV(e, cuda_event_wait(g->ctx, ev));
        else DEV(e, cuda_event_done(g->ctx, ev, &done));
        if (!done) break;
        g->seq_done++;
    }
    return STRATA_OK;
}

/* Decode routes on the device when no prompt holds a loan and every expert is resident in a usable slot,
 * or under --miss read. ptr_dev gives each expert its slot once the copy into that slot has landed, else
 * its place in the pinned store (a miss, or a refill, swap or admission still in flight): so a step need
 * not wait for those copies, and the slot a copy is writing is named by no one. Without a store the
 * copies are waited for. The table goes up on the compute stream, before the next step's work; from
 * pageable memory, so the call returns once ptr_host has been read and the host may change it again. */
strata_status gpu_routing_refresh(strata_engine *e) {
    cuda_state *g = e->md->gpu;
    const expert_cache *c = &e->md->cache;
    const int32_t E = e->hp.n_expert, LE = e->hp.n_layer * E;
    g->routing = 0;
    g->ptr_stale = 0;
    if (!g->ptr_dev || !env_cuda_device_routing() || cache_lent(c) > 0) return STRATA_OK;
    const int reads = g->miss_policy == STRATA_MISS_READ && g->store;
    if (!reads && cache_resident(c) < LE) return STRATA_OK;
    STRATA_TRY(copies_landed(e, g->store == NULL));
    for (int32_t id = 0; id < LE; id++) {
        const int32_t l = id / E, ex = id % E, s = cache_peek(c, l, ex);
        if (s >= 0 && g->slot_seq[s] <= g->seq_done) {
            g->ptr_host[id] = slot_ptrs(g, l, cache_slot_ptr(c, s));
        } else {
            STRATA_ASSERT(&e->err, g->store != NULL);
            g->ptr_host[id] = slot_ptrs(g, l, g->store + g->store_off[l] + (int64_t)ex * expert_bytes(g, l));
            g->ptr_stale |= s >= 0;
        }
    }
    DEV(e, cuda_h2d(g->ctx, g->ptr_dev, g->ptr_host, (size_t)LE * sizeof(exp_ptrs), CUDA_STREAM_COMPUTE));
    g->routing = 1;
    return STRATA_OK;
}

/* Before a routed step: copies made since the table was built are put in it (a path that copies without
 * telling the backend still gets a table that names no slot being written), and the slots whose copies
 * have landed since are named instead of the store. */
strata_status gpu_routing_settle(strata_engine *e) {
    cuda_state *g = e->md->gpu;
    if (g->seq_dirty) return gpu_routing_refresh(e);
    if (!g->ptr_stale) return STRATA_OK;
    const int64_t before = g->seq_done;
    STRATA_TRY(copies_landed(e, 0));
    return g->seq_done != before ? gpu_routing_refresh(e) : STRATA_OK;
}

/* The prompt is done with its loan: the refill's copies (copy stream) come after the prompt's work. */
static strata_status cuda_loan_end(strata_engine *e) {
    cuda_state *g = e->md->gpu;
    STRATA_TRY(gpu_use(e));
    if (g->overlap) DEV(e, cuda_stream_order(g->ctx, CUDA_STREAM_COMPUTE, CUDA_STREAM_COPY));
    return STRATA_OK;
}

/* The cache changed between forwards (refill, swaps): the next forward's work waits for the copies
 * (order_copies), and decode's routing follows the residency. */
static strata_status cuda_cache_changed(strata_engine *e) {
    STRATA_TRY(gpu_use(e));
    STRATA_TRY(gpu_copies_ok(e));
    return gpu_routing_refresh(e);
}


/* One expert's gate | up | down from the mapped file into its place in the store (pool item = l * E + e). */
static void store_piece(void *ctx, int64_t item, int thread) {
    (void)thread;
    strata_engine *e = ctx;
    cuda_state *g = e->md->gpu;
    const int64_t E = e->hp.n_expert;
    const int32_t l = (int32_t)(item / E);
    const layer_weights *L = &e->w.layers[l];
    const int64_t ex = item % E, gb = g->xbytes[3 * l], ub = g->xbytes[3 * l + 1], db = g->xbytes[3 * l + 2];
    uint8_t *dst = g->store + g->store_off[l] + ex * (gb + ub + db);
    memcpy(dst, L->gate_exps.data + ex * gb, (size_t)gb);
    memcpy(dst + gb, L->up_exps.data + ex * ub, (size_t)ub);
    memcpy(dst + gb + ub, L->down_exps.data + ex * db, (size_t)db);
}

/* The expert store (STRATA_CUDA_STORE, trace.c): "register" page-locks the mapped model file for the
 * device (read-only); the default copies every routed expert once into pinned host memory. Either makes
 * every expert copy a DMA with no host work. The plan decides whether the experts may be pinned (plan.c:
 * the store and the chunk's host borrow within the host RAM it may use, --host-ram-budget): when not, or
 * when pinning fails, the copies go through the ring of pinned staging buffers and the plan says
 * "mapped". Not at all when every expert is resident (nothing is copied after the fill). */
static void store_open(strata_engine *e) {
    cuda_state *g = e->md->gpu;
    const mem_device *md = e->md;
    const cuda_state *first = e->devs[0].gpu;
    if (md != &e->devs[0] && (first->store || first->reg_parts)) {
        /* a later device of a split: the first device's store serves it too (pinned host memory and a
         * portable registration are visible to every device), so the host holds the experts once */
        g->store = first->store;
        g->reg_parts = first->reg_parts;
        g->direct = 1;
        g->store_shared = 1;
        trace_emit(&e->trace, "cuda: device %d uses device %d's expert store", md->index, e->devs[0].index);
        return;
    }
    const int64_t all = (int64_t)(md->layer_end - md->layer_begin) * e->hp.n_expert; /* the experts it serves */
    const int store = env_cuda_store();
    const int64_t bytes = store == 1 ? (int64_t)e->file.total_size : g->store_off[e->hp.n_layer];
    const double gib = (double)bytes / (1 << 30);
    char why[640];
    why[0] = 0;
    if (store == 0) {
        snprintf(why, sizeof why, "STRATA_CUDA_STORE=ring");
    } else if (e->md->plan.n_slots >= all + e->md->plan.max_lend_slots) {
        snprintf(g->store_why, sizeof g->store_why, "every expert is resident, with the loan");
        return; /* nothing is copied after the fill: nothing to say */
    } else if (!e->md->mp.experts_pinned || (e->md->plan.host_avail_bytes > 0 && bytes > e->md->plan.host_avail_bytes)) {
        snprintf(why, sizeof why, "%.1f GiB is more than the host RAM the plan may use (%.1f GiB)", gib,
                 (double)e->md->plan.host_avail_bytes / (1 << 30));
    } else if (store == 1) {
        const double t0 = engine_now_ms();
        /* a split model is one mapping per part: each is registered */
        uint32_t i = 0;
        for (uint8_t *m; i < e->file.n_parts; i++) {
            uint64_t n;
            gguf_part_map(&e->file, i, &m, &n);
            if (cuda_host_register(g->ctx, m, (size_t)n) != STRATA_OK) break;
        }
        if (i == e->file.n_parts) {
            g->reg_parts = i;
            g->direct = 1;
            trace_emit(&e->trace, "cuda: expert store: the mapped file (%.1f GiB, %u part%s) registered with the device "
                       "in %.0f ms; experts are copied straight from it", gib, i, i == 1 ? "" : "s", engine_now_ms() - t0);
            return;
        }
        snprintf(why, sizeof why, "%s", cuda_ctx_error(g->ctx));
        while (i-- > 0) {
            uint8_t *m;
            uint64_t n;
            gguf_part_map(&e->file, i, &m, &n);
            cuda_host_unregister(g->ctx, m);
        }
    } else {
        const double t0 = engine_now_ms();
        if (cuda_host_alloc(g->ctx, (size_t)bytes, (void **)&g->store) == STRATA_OK) {
            const double t1 = engine_now_ms();
            pool_run(e->pool, (int64_t)e->hp.n_layer * e->hp.n_expert, store_piece, e); /* every expert: shared */
            g->direct = 1;
            trace_emit(&e->trace, "cuda: expert store: %.1f GiB of pinned host memory in %.0f ms, experts copied into it in "
                       "%.0f ms", gib, t1 - t0, engine_now_ms() - t1);
            return;
        }
        g->store = NULL;
        snprintf(why, sizeof why, "%s", cuda_ctx_error(g->ctx));
    }
    e->md->mp.experts_pinned = 0; /* the plan line says what was done */
    snprintf(g->store_why, sizeof g->store_why, "%s", why);
    trace_emit(&e->trace, "cuda: expert store: %s; experts are copied %s", why,
               env_cuda_staging() ? "through a ring of pinned staging buffers" : "straight from pageable memory");
}


/* ---- open / close ------------------------------------------------------------------------------ */

/* The first block of the model's architecture (arch.h) that the CUDA forward does not compose yet, in
 * words, or NULL when it runs them all. The CUDA kernels are qwen3moe's blocks: per-head q/k norms, NeoX
 * RoPE over the whole head without scaling, softmax routing with renormalized top-k weights, no biases,
 * no shared experts, no multipliers. A model needing more is refused at open, never run without it. */
static const char *cuda_missing_block(const strata_engine *e) {
    const hparams *hp = &e->hp;
    if (hp->attn != ATTN_GQA) return "multi-head latent attention (MLA) and its compressed KV cache";
    if (hp->attn_sinks) return "attention sinks";
    if (hp->n_swa > 0) return "sliding-window attention";
    if (hp->ffn_act != FFN_ACT_SILU) return "the clamped SwiGLU of gpt-oss";
    if (hp->out_bias || hp->router_bias || hp->exp_ffn_bias) return "biases on the attention output, router or experts";
    if (hp->n_dense_lead > 0) return "dense leading layers";
    if (hp->qk_norm != QK_NORM_HEAD)
        return hp->qk_norm == QK_NORM_FULL ? "q/k norms over the whole projection" : "attention without q/k norms";
    if (hp->ad->rope != ROPE_NEOX) return "RoPE with adjacent pairs (the llama layout)";
    if (hp->n_rot != hp->head_dim) return "partial rotary embeddings";
    if (hp->rope_scaling != ROPE_SCALING_NONE) return "rope scaling";
    if (hp->gating != GATING_SOFTMAX || hp->expert_bias || !hp->norm_topk || hp->routed_scale != 1.0f || hp->n_group > 1)
        return "routing other than softmax with renormalized top-k weights";
    if (hp->n_ff_shexp > 0) return "shared experts";
    if (hp->embd_scale != 1.0f || hp->residual_scale != 1.0f || hp->logit_scale != 1.0f ||
        hp->attn_scale != 1.0f / sqrtf((float)hp->head_dim))
        return "granite's embedding, attention, residual and logit multipliers";
    for (int32_t l = 0; l < hp->n_layer; l++)
        if (e->w.layers[l].bq || e->w.layers[l].bk || e->w.layers[l].bv) return "attention biases";
    return NULL;
}

/* Create the device context (e->md->gpu) and report the free device memory the plan may use. */
static strata_status cuda_forward_init(strata_engine *e, int64_t *free_bytes) {
    const char *missing = cuda_missing_block(e);
    if (missing)
        return err_set(&e->err, STRATA_ERR_UNSUPPORTED,
                       "--device cuda: %s (%s) needs %s, which the CUDA backend does not run yet; use --device cpu "
                       "for this file",
                       e->hp.arch, e->hp.ad->family, missing);
    char err[512];
    cuda_state *g = calloc(1, sizeof *g);
    if (!g) return err_set(&e->err, STRATA_ERR_OUT_OF_MEMORY, "out of host memory for the CUDA state");
    e->md->gpu = g; /* one for each device of a split, on its card (--gpus 0,0: two on one card) */
    strata_status s = cuda_ctx_create(e->md->index, &g->ctx, err, sizeof err);
    if (s != STRATA_OK) return err_set(&e->err, s, "--device cuda: %s", err);
    trace_emit(&e->trace, "cuda: %s", cuda_ctx_code_path(g->ctx));
    int64_t total = 0;
    DEV(e, cuda_mem_info(g->ctx, free_bytes, &total));
    /* leave room for the runtime's own allocations (module images, stream and event state) */
    *free_bytes -= 256LL << 20;
    /* the experts' sizes per layer (a mix may give layers different types) and the store's layout */
    const int32_t L = e->hp.n_layer;
    const int64_t F = e->hp.n_ff_exp, D = e->hp.n_embd, E = e->hp.n_expert;
    g->xbytes = malloc((size_t)L * 3 * sizeof(int64_t));
    g->store_off = malloc((size_t)(L + 1) * sizeof(int64_t));
    if (!g->xbytes || !g->store_off) return err_set(&e->err, STRATA_ERR_OUT_OF_MEMORY, "out of host memory for the CUDA state");
    g->store_off[0] = 0;
    for (int32_t l = 0; l < L; l++) {
        const layer_weights *W = &e->w.layers[l];
        g->xbytes[3 * l] = F * (int64_t)W->gate_exps.row_bytes;
        g->xbytes[3 * l + 1] = F * (int64_t)W->up_exps.row_bytes;
        g->xbytes[3 * l + 2] = D * (int64_t)W->down_exps.row_bytes;
        g->store_off[l + 1] = g->store_off[l] + E * expert_bytes(g, l);
    }
    return STRATA_OK;
}

/* After the plan, in its order: the resident weights, the KV cache, the decode scratch and the slab of the
 * plan's slots (*slab_out, for the expert cache), and the expert store in host memory. */
static strata_status cuda_forward_open(strata_engine *e, uint8_t **slab_out) {
    const hparams *hp = &e->hp;
    cuda_state *g = e->md->gpu;
    const strata_plan *pp = &e->md->plan;
    const int64_t D = hp->n_embd, F = hp->n_ff_exp, E = hp->n_expert, L = hp->n_layer, hd = hp->head_dim;
    const int64_t KD = (int64_t)hp->n_head_kv * hd;
    /* the device's layers (all of them without a split) and the experts of those */
    const int32_t lb = e->md->layer_begin, le = e->md->layer_end;
    const int64_t LE = (int64_t)(le - lb) * E;
    const int head = gpu_holds_head(e), split = e->n_dev > 1;
    STRATA_TRY(gpu_use(e));
    /* every tensor must be one the kernels run */
    if (head) STRATA_TRY(check_type(e, &e->w.output, "output.weight"));
    for (int32_t l = lb; l < le; l++) {
        const layer_weights *W = &e->w.layers[l];
        const wview *ws[] = {&W->wq, &W->wk, &W->wv, &W->wo, &W->router, &W->gate_exps, &W->up_exps, &W->down_exps};
        static const char *names[] = {"attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate_inp", "ffn_gate_exps",
                                      "ffn_up_exps", "ffn_down_exps"};
        for (int i = 0; i < 8; i++) {
            char nm[64];
            snprintf(nm, sizeof nm, "blk.%d.%s.weight", l, names[i]);
            STRATA_TRY(check_type(e, ws[i], nm));
        }
    }
    if (pp->n_slots < hp->n_expert_used) /* a decode step runs its K experts from K slots at once */
        return err_set(&e->err, STRATA_ERR_BUDGET,
                       "--device cuda: the plan leaves %d expert slots on the device, fewer than the %d experts one "
                       "token uses; raise --expert-cache (or --vram-budget)",
                       pp->n_slots, hp->n_expert_used);
    /* 1. resident weights and 2. the KV cache, in the plan's order */
    g->kv_type = e->params.kv_type;
    g->kv_row = g->kv_type == STRATA_KV_F16 ? KD * 2 : KD + KD / 8;
    g->layers = calloc((size_t)L, sizeof *g->layers);
    if (!g->layers) return err_set(&e->err, STRATA_ERR_OUT_OF_MEMORY, "out of host memory for the CUDA state");
    for (int32_t l = lb; l < le; l++) {
        const layer_weights *W = &e->w.layers[l];
        dev_layer *dl = &g->layers[l];
        STRATA_TRY(upload(e, (void **)&dl->attn_norm, W->attn_norm, (size_t)D * 4, "attention norms"));
        STRATA_TRY(upload(e, (void **)&dl->ffn_norm, W->ffn_norm, (size_t)D * 4, "ffn norms"));
        if (W->q_norm) STRATA_TRY(upload(e, (void **)&dl->q_norm, W->q_norm, (size_t)hd * 4, "q norms"));
        if (W->k_norm) STRATA_TRY(upload(e, (void **)&dl->k_norm, W->k_norm, (size_t)hd * 4, "k norms"));
        STRATA_TRY(upload(e, &dl->wq, W->wq.data, wbytes(&W->wq), "attention weights"));
        STRATA_TRY(upload(e, &dl->wk, W->wk.data, wbytes(&W->wk), "attention weights"));
        STRATA_TRY(upload(e, &dl->wv, W->wv.data, wbytes(&W->wv), "attention weights"));
        STRATA_TRY(upload(e, &dl->wo, W->wo.data, wbytes(&W->wo), "attention weights"));
        STRATA_TRY(upload(e, &dl->router, W->router.data, wbytes(&W->router), "router weights"));
    }
    if (head) {
        STRATA_TRY(upload(e, (void **)&g->output_norm, e->w.output_norm, (size_t)D * 4, "the output norm"));
        STRATA_TRY(upload(e, &g->output, e->w.output.data, wbytes(&e->w.output), "the output head"));
    }
    for (int32_t l = lb; l < le; l++) {
        dev_layer *dl = &g->layers[l];
        DEV(e, cuda_alloc(g->ctx, (size_t)(g->kv_row * e->n_ctx), &dl->k_cache, "the KV cache"));
        DEV(e, cuda_alloc(g->ctx, (size_t)(g->kv_row * e->n_ctx), &dl->v_cache, "the KV cache"));
    }

    /* 3. the decode scratch: layout(1), then the decode step's tables */
    g->scratch_len = cuda_layout_bytes(e, 1);
    DEV(e, cuda_alloc(g->ctx, (size_t)g->scratch_len, &g->scratch, "the decode scratch"));
    STRATA_TRY(cuda_use_scratch(e));
    STRATA_TRY(stage_reserve(e, 1));
    DEV(e, cuda_alloc(g->ctx, (size_t)hp->n_vocab * 4, (void **)&g->logits_dev, "logits"));
    g->att_splits = env_cuda_att_split() ? att_splits(hp->n_head) : 1;
    DEV(e, cuda_alloc(g->ctx, (size_t)hp->n_head * g->att_splits * (hd + 2) * 4, (void **)&g->att_part,
                      "decode attention's split states"));
    DEV(e, cuda_alloc(g->ctx, (size_t)(hp->n_head + 1) * 4, (void **)&g->att_cnt, "decode counters"));
    DEV(e, cuda_memset(g->ctx, g->att_cnt, 0, (size_t)(hp->n_head + 1) * 4));
    DEV(e, cuda_host_alloc(g->ctx, (size_t)hp->n_vocab * 4, (void **)&g->host_logits));
    DEV(e, cuda_host_alloc(g->ctx, (size_t)(L * hp->n_expert_used) * 4, (void **)&g->host_sel));

    /* 4. the slab of the expert cache (its slots are cache.c's) */
    g->slot_bytes = pp->slot_bytes;
    DEV(e, cuda_alloc(g->ctx, (size_t)((int64_t)pp->n_slots * g->slot_bytes), (void **)&g->slab, "the expert cache"));
    *slab_out = g->slab;

    g->miss_policy = e->params.miss_policy == STRATA_MISS_HOST   ? STRATA_MISS_HOST
                     : e->params.miss_policy == STRATA_MISS_AUTO ? STRATA_MISS_AUTO
                                                                 : STRATA_MISS_COPY;
    g->fused = env_cuda_fused();
    g->fast = env_cuda_fast();
    g->pdl = env_cuda_pdl();
    g->fuse2 = env_cuda_fuse2();
    cuda_ctx_set_decode(g->ctx, g->fast, 0);
    g->overlap = env_cuda_overlap();
    g->miss_split = env_cuda_miss_split();
    g->ptr_host = calloc((size_t)(L * E), sizeof(exp_ptrs));
    g->exp_state = malloc((size_t)E);
    g->addr = calloc((size_t)E, sizeof *g->addr);
    if (!g->ptr_host || !g->exp_state || !g->addr)
        return err_set(&e->err, STRATA_ERR_OUT_OF_MEMORY, "out of host memory for the expert tables");
    /* pinned, so that the copies of a host miss's input and output do not wait for the stream */
    const int64_t host_floats = D + hp->n_expert_used * D + cuda_mirror_scratch_floats(D, F, hp->n_expert_used);
    DEV(e, cuda_host_alloc(g->ctx, (size_t)host_floats * sizeof(float), (void **)&g->host_tmp));
    DEV(e, cuda_event_create(g->ctx, &g->ev_copy));
    DEV(e, cuda_event_create(g->ctx, &g->ev_tables));
    DEV(e, cuda_event_create(g->ctx, &g->ev_half[0]));
    DEV(e, cuda_event_create(g->ctx, &g->ev_half[1]));
    store_open(e);
    /* decode may route on the device: every expert can be resident, or the device can read misses from
     * the pinned store (one device: a split's decode step routes each device's layers on the host) */
    if (!split && (pp->n_slots >= LE || (g->store && env_cuda_device_routing()))) {
        DEV(e, cuda_alloc(g->ctx, (size_t)(L * E) * sizeof(exp_ptrs), (void **)&g->ptr_dev, "the expert address table"));
        DEV(e, cuda_alloc(g->ctx, sizeof(int32_t), (void **)&g->pos_dev, "the decode position"));
    }
    g->slot_seq = calloc((size_t)(pp->n_slots > 0 ? pp->n_slots : 1), sizeof *g->slot_seq);
    if (!g->slot_seq) return err_set(&e->err, STRATA_ERR_OUT_OF_MEMORY, "out of host memory for the expert tables");
    g->seq_open = 1;
    for (int i = 0; i < SEQ_EVENTS; i++) DEV(e, cuda_event_create(g->ctx, &g->seq_ev[i]));
    /* --miss read: the device reads misses from the pinned store (no host round trip in a decode step).
     * --miss auto stays the split of each step's misses between the host and copies: at 12 GiB on the 30B
     * preset read decoded at 63.8 tokens/s against copy's 97.9, because a read miss is not admitted (the
     * adaptive policy brings experts in every adapt_every tokens) and the hit rate fell from 0.87 to 0.63 */
    const int can_read = g->ptr_dev && g->store && env_cuda_device_routing();
    if (e->params.miss_policy == STRATA_MISS_READ) {
        if (split)
            return err_set(&e->err, STRATA_ERR_UNSUPPORTED,
                           "--miss read: a split's decode step routes on the host, and the device reads a miss only "
                           "when it routes; use --miss auto, host or copy with --split layer");
        if (!can_read && pp->n_slots < LE)
            return err_set(&e->err, STRATA_ERR_INVALID_ARGUMENT,
                           "--miss read: the device reads a decode miss from the experts' copy in pinned host memory, "
                           "and there is none (%s); use --miss auto, host or copy",
                           !env_cuda_device_routing() ? "STRATA_CUDA_DEVICE_ROUTING=0" : g->store_why);
        g->miss_policy = STRATA_MISS_READ;
    }
    e->md->plan.miss_policy = g->miss_policy; /* what the plan line and strata_plan report */
    if (!g->direct && env_cuda_staging())
        for (int i = 0; i < STAGE_RING; i++) {
            DEV(e, cuda_host_alloc(g->ctx, (size_t)g->slot_bytes, (void **)&g->ring[i]));
            DEV(e, cuda_event_create(g->ctx, &g->ring_done[i]));
        }
    DEV(e, cuda_sync(g->ctx)); /* the fill that follows is timed */
    return STRATA_OK;
}

/* After the expert cache was filled (its copies enqueued since t_fill): wait for them, time them, and
 * route decode on the device where it can. */
static strata_status cuda_forward_ready(strata_engine *e, double t_fill) {
    cuda_state *g = e->md->gpu;
    const hparams *hp = &e->hp;
    const int64_t L = e->md->layer_end - e->md->layer_begin, E = hp->n_expert; /* the device's layers */
    STRATA_TRY(gpu_use(e));
    STRATA_TRY(gpu_copies_ok(e));
    DEV(e, cuda_sync(g->ctx));
    g->copies_pending = 0;
    memset(g->slot_seq, 0, (size_t)e->md->cache.n_slots * sizeof *g->slot_seq); /* the fill has landed */
    g->seq_dirty = 0;
    const double fill_ms = engine_now_ms() - t_fill;
    const int32_t filled = cache_resident(&e->md->cache);
    /* the rate of an expert copy that --miss auto weighs against the host */
    g->copy_ms = filled > 0 ? fill_ms / filled : 0.0;
    trace_emit(&e->trace, "cuda: expert cache filled: %d experts (%.1f MiB) in %.0f ms, %.1f GB/s", filled,
               (double)e->md->cache.bytes_copied / 1048576.0, fill_ms,
               fill_ms > 0 ? (double)e->md->cache.bytes_copied / fill_ms / 1e6 : 0.0);
    /* --miss auto times the host at its first decode step that routes on the host (host_forward.c) */
    STRATA_TRY(gpu_routing_refresh(e));
    g->graph_state = g->ptr_dev && env_cuda_graph() ? 0 : -1;
    DEV(e, cuda_sync(g->ctx));
    trace_emit(&e->trace, "cuda: %s, %d of %lld experts in %d slots of %.2f MiB, KV %.1f MiB%s", cuda_ctx_device_name(g->ctx),
               filled, (long long)(L * E), e->md->cache.n_slots, g->slot_bytes / 1048576.0,
               2.0 * (double)g->kv_row * e->n_ctx * L / 1048576.0,
               !g->routing                         ? ""
               : g->miss_policy == STRATA_MISS_READ && filled < L * E ? "; decode routes on the device and reads misses from the pinned store"
                                                                   : "; decode routes on the device");
    return STRATA_OK;
}

static void cuda_forward_close(strata_engine *e) {
    cuda_state *g = e->md->gpu;
    if (!g) return;
    if (g->ctx) {
        if (e->n_dev > 1) cuda_ctx_use(g->ctx);
        cuda_sync(g->ctx);
        cuda_graph_free(g->graph);
        if (g->layers)
            for (int32_t l = 0; l < e->hp.n_layer; l++) {
                dev_layer *dl = &g->layers[l];
                void *p[] = {dl->attn_norm, dl->ffn_norm, dl->q_norm, dl->k_norm, dl->wq, dl->wk, dl->wv, dl->wo,
                             dl->router, dl->k_cache, dl->v_cache};
                for (size_t i = 0; i < sizeof p / sizeof p[0]; i++) cuda_free(g->ctx, p[i]);
            }
        void *p[] = {g->output_norm, g->output, g->slab, g->ptr_dev, g->pos_dev, g->att_part, g->att_cnt, g->logits_dev,
                     g->scratch};
        for (size_t i = 0; i < sizeof p / sizeof p[0]; i++) cuda_free(g->ctx, p[i]);
        cuda_host_free(g->ctx, g->stage);
        cuda_host_free(g->ctx, g->host_logits);
        cuda_host_free(g->ctx, g->host_sel);
        cuda_host_free(g->ctx, g->host_tmp);
        for (int i = 0; i < STAGE_RING; i++) {
            cuda_host_free(g->ctx, g->ring[i]);
            cuda_event_free(g->ring_done[i]);
        }
        cuda_event_free(g->ev_copy);
        cuda_event_free(g->ev_tables);
        cuda_event_free(g->ev_half[0]);
        cuda_event_free(g->ev_half[1]);
        for (int i = 0; i < SEQ_EVENTS; i++) cuda_event_free(g->seq_ev[i]);
        /* before the file is unmapped (engine_close closes the file after this) */
        for (uint32_t i = 0; i < g->reg_parts && !g->store_shared; i++) {
            uint8_t *m;
            uint64_t n;
            gguf_part_map(&e->file, i, &m, &n);
            cuda_host_unregister(g->ctx, m);
        }
        g->reg_parts = 0;
        if (!g->store_shared) cuda_host_free(g->ctx, g->store);
        g->store = NULL;
        cuda_ctx_destroy(g->ctx);
    }
    free(g->layers);
    free(g->xbytes);
    free(g->store_off);
    free(g->addr);
    free(g->ptr_host);
    free(g->slot_seq);
    free(g->exp_state);
    free(g->bucket);
    free(g);
    e->md->gpu = NULL;
}

/* Device memory the backend holds now and at most since open (0, 0 without a device). */
static void cuda_forward_mem_held(const strata_engine *e, int64_t *now, int64_t *peak) {
    cuda_mem_held(e->md->gpu ? e->md->gpu->ctx : NULL, now, peak);
}

/* ---- the backend --------------------------------------------------------------------------------- */

/* the backend's errors are in e->err; the plan's caller wants them in err */
static strata_status into(strata_engine *e, strata_status s, errbuf *err) {
    if (s != STRATA_OK) memcpy(err, &e->err, sizeof *err);
    return s;
}

static strata_status cuda_init(strata_engine *e, int64_t *free_bytes, errbuf *err) {
    return into(e, cuda_forward_init(e, free_bytes), err);
}

static strata_status cuda_open(strata_engine *e, uint8_t **slab, errbuf *err) {
    return into(e, cuda_forward_open(e, slab), err);
}

static strata_status cuda_ready(strata_engine *e, double t_fill, errbuf *err) {
    return into(e, cuda_forward_ready(e, t_fill), err);
}

/* why --device cuda cannot run here: no CUDA in this build, or no usable device (the context says) */
static void cuda_absent_why(char *buf, size_t len) {
    cuda_ctx *probe = NULL;
    cuda_ctx_create(0, &probe, buf, len);
    cuda_ctx_destroy(probe);
}

const backend_ops cuda_backend_ops = {
    .layer_split = 1,
    .present = cuda_device_present,
    .absent_why = cuda_absent_why,
    .init = cuda_init,
    .scratch_bytes = cuda_forward_scratch_bytes,
    .open = cuda_open,
    .ready = cuda_ready,
    .mem_held = cuda_forward_mem_held,
    .close = cuda_forward_close,
    .name = "cuda",
    .layout_bytes = cuda_layout_bytes,
    .host_bytes = cuda_host_bytes,
    .layout = cuda_layout,
    .use_scratch = cuda_use_scratch,
    .copy_expert = cuda_copy_expert,
    .loan_end = cuda_loan_end,
    .cache_changed = cuda_cache_changed,
    .fail_msg = cuda_fail_msg,
    .forward = gpu_forward,
};
