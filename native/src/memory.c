/*
 * memory.c — the memory plan at open, the backend's memory, the expert cache, and the loan of the cache's
 * slots to a prompt. One code on both backends: the backend (e->be) supplies the memory (device memory,
 * or a host block standing in for it), the expert copies and the layout of a chunk's buffers.
 *
 * At open (mem_open): the plan (plan.c), then the device budget laid out in order — resident weights,
 * KV cache, decode scratch, reserve, the slab of slots — and the cache filled (a profile, or an even
 * spread over the layers). On the CPU backend a host block stands in for device memory; the resident
 * weights and the KV cache are only accounted there (the mapped file and the KV allocation hold them),
 * while the decode scratch, the slots and everything laid out inside a loan live in the block itself.
 *
 * A prompt's loan (mem_lend, for prefill.c):
 *   1. its chunk t = min(auto chunk, n rounded up to the granularity) (plan_request_chunk);
 *   2. the loan: under the current policy, layout(t)'s slots — and when they exceed what the cache
 *      may lend, t is halved for this request (traced) until they fit; under the legacy policy the loan
 *      is the auto chunk's, whatever t is;
 *   3. relayout: the ring (ring_slots(t) whole slots) and then the chunk buffers of t are laid out in
 *      an arena over the lent slots; under legacy a layout larger than the loan fails here with
 *      STRATA_ERR_LEND and the arena's message (the device's own figures on a GPU), after the loan is
 *      given back;
 *   4. (prefill.c) the forward passes; experts that are not resident are streamed through the ring;
 *   5. refill (mem_give_back): every displaced expert is copied back into its slot, the residency table
 *      is as before, and the chunk buffers point at the decode scratch again.
 */
#include <stdio.h>
#include <string.h>

#include "cache.h"
#include "engine_internal.h"

/* ---- open / close ------------------------------------------------------------------------------- */

static int64_t layout_bytes(void *ctx, int32_t T) {
    const strata_engine *e = ctx;
    return e->be->layout_bytes(e, T);
}

static int64_t host_bytes(void *ctx, int32_t T) {
    const strata_engine *e = ctx;
    return e->be->host_bytes(e, T);
}

static void say(void *ctx, const char *line) { trace_emit(&((strata_engine *)ctx)->trace, "%s", line); }

#define MIB(b) ((double)(b) / (1024.0 * 1024.0))

/* The CPU backend's device budget: a host block, mapped lazily so that untouched room costs nothing. The
 * resident weights and the KV cache are only accounted in it (the mapped file and the KV allocation hold
 * them); the decode scratch, the slab and everything laid out inside a loan live in the block. */

strata_status mem_open(strata_engine *e, errbuf *err) {
    const hparams *hp = &e->hp;
    strata_params prm = e->params;
    prm.max_context = e->n_ctx; /* decided by the engine: the attention scratch depends on it */
    prm.n_seq = e->n_seq;
    plan_inputs in;
    memset(&in, 0, sizeof in);
    in.n_layer = hp->n_layer;
    in.n_moe_layer = hp->n_layer - hp->n_dense_lead;
    in.n_expert = hp->n_expert;
    in.n_expert_used = hp->n_expert_used;
    in.n_embd = hp->n_embd;
    in.n_vocab = hp->n_vocab;
    in.n_head_kv = hp->n_head_kv;
    in.head_dim = hp->head_dim;
    in.n_ctx_train = hp->n_ctx_train;
    in.resident_bytes = e->w.resident_bytes;
    in.expert_bytes = e->w.expert_bytes;
    in.expert_bytes_total = e->w.expert_bytes * hp->n_expert * (hp->n_layer - hp->n_dense_lead);
    in.kv_bytes = kv_bytes;
    in.device = STRATA_DEVICE_CPU;
    const int on_gpu = prm.device == STRATA_DEVICE_CUDA || (prm.device == STRATA_DEVICE_AUTO && cuda_backend_ops.present());
    e->be = on_gpu ? &cuda_backend_ops : &cpu_backend_ops;
    STRATA_TRY(e->be->init(e, &in.device_free, err));
    if (on_gpu) {
        in.device = STRATA_DEVICE_CUDA;
        if (e->n_seq > 1)
            return err_set(err, STRATA_ERR_INVALID_ARGUMENT,
                           "--parallel %d: the CUDA backend decodes one sequence at a time and cannot yet step several "
                           "together; use --parallel 1 with --device cuda, or --device cpu for several sequences",
                           e->n_seq);
        if (prm.expert_cache == 0)
            return err_set(err, STRATA_ERR_INVALID_ARGUMENT,
                           "--expert-cache 0 runs every expert from host memory, which only the CPU backend does; "
                           "on --device cuda give the cache at least %d slots (the experts one token uses) or auto",
                           hp->n_expert_used);
    }
    in.scratch_bytes = e->be->scratch_bytes(e);
    in.chunk_bytes = layout_bytes;
    in.host_chunk_bytes = e->be->host_bytes ? host_bytes : NULL;
    in.chunk_ctx = e;
    in.n_threads = pool_size(e->pool);
    in.simd = e->params.simd == STRATA_SIMD_AUTO ? quant_cpu_best() : e->params.simd;
    if (in.scratch_bytes < 0) return err_set(err, STRATA_ERR_INTERNAL, "the decode scratch could not be sized");
    STRATA_TRY(plan_make(&e->mp, &in, &prm, say, e, err));
    e->plan = e->mp.pub;
    e->chunk = e->plan.auto_chunk;

    /* the memory itself: the backend's (device memory, or the host block standing in for it) */
    const strata_plan *pp = &e->plan;
    uint8_t *slab = NULL;
    STRATA_TRY(e->be->open(e, &slab, err));

    /* the one expert cache, over the backend's slab */
    cache_config cc = {prm.cache_policy, pp->miss_policy, prm.adapt_every, prm.adapt_swaps, prm.adapt_decay};
    STRATA_TRY(cache_init(&e->cache, slab, pp->n_slots, pp->slot_bytes, hp->n_layer - hp->n_dense_lead, hp->n_expert, &cc,
                          e->be->copy_expert, e, err));
    e->cache.layer0 = hp->n_dense_lead;
    const double t_fill = engine_now_ms();
    if (prm.expert_profile && prm.expert_profile[0]) {
        STRATA_TRY(cache_profile_load(&e->cache, prm.expert_profile, err));
    } else {
        cache_fill_default(&e->cache);
    }
    STRATA_TRY(e->be->ready(e, t_fill, err)); /* the fill's copies are done (and on the device timed) */
    int32_t resident = cache_resident(&e->cache);
    trace_emit(&e->trace, "expert cache filled: %d of %d experts in %d slots (%s), %.1f MiB copied in %.0f ms", resident,
               pp->n_experts_total, pp->n_slots, prm.expert_profile && prm.expert_profile[0] ? "from the profile" : "even spread",
               MIB(e->cache.bytes_copied), engine_now_ms() - t_fill);
    e->cache.bytes_copied = 0; /* counters start after the fill */
    if (e->be->use_scratch(e) != STRATA_OK)
        return err_set(err, STRATA_ERR_INTERNAL, "the decode scratch does not hold the layout of one token");
    char line[768];
    plan_line(&e->mp, line, sizeof line);
    trace_emit(&e->trace, "%s", line);
    return STRATA_OK;
}

strata_status mem_check_device(const strata_params *p, errbuf *err) {
    if (p->device != STRATA_DEVICE_CUDA || cuda_backend_ops.present()) return STRATA_OK;
    char why[512];
    cuda_backend_ops.absent_why(why, sizeof why); /* no CUDA in this build, or no device */
    return err_set(err, STRATA_ERR_DEVICE, "--device cuda: %s", why);
}

void mem_held(const strata_engine *e, int64_t *now, int64_t *peak) { e->be->mem_held(e, now, peak); }

void mem_close(strata_engine *e) {
    e->be->close(e);
    cache_free(&e->cache);
}

void mem_sync_stats(strata_engine *e) {
    const expert_cache *c = &e->cache;
    strata_stats *s = &e->stats;
    s->lookups = c->lookups;
    s->hits = c->hits;
    s->misses = c->misses;
    s->swaps = c->swaps;
    s->bytes_copied = c->bytes_copied;
    s->host_expert_runs = c->host_runs;
    s->bus_reads = c->reads;
    s->slots_lent_now = cache_lent(c);
}

void mem_reset_stats(strata_engine *e) {
    expert_cache *c = &e->cache;
    c->lookups = c->hits = c->misses = c->swaps = c->bytes_copied = c->host_runs = c->reads = 0;
}

/* ---- the loan ----------------------------------------------------------------------------------- */

strata_status mem_loan_rule(const plan *p, const trace_sink *tr, int32_t t, strata_loan_prediction *o, errbuf *err) {
    memset(o, 0, sizeof *o);
    o->chunk = o->chunk_used = t;
    if (p->no_cache) return STRATA_OK; /* the prompt path owns its buffers */
    strata_layout lay;
    STRATA_TRY(plan_layout(p, t, &lay, err));
    o->slots_needed = lay.slots_needed;
    if (p->pub.lend_policy != STRATA_LEND_CURRENT) {
        o->loan_slots = p->pub.auto_loan_slots; /* legacy: sized once, for the auto chunk */
        o->verdict = lay.slots_needed > o->loan_slots ? 2 : 0;
        return STRATA_OK;
    }
    while (lay.slots_needed > p->pub.max_lend_slots) {
        if (o->chunk_used <= 1) {
            /* cannot happen with a plan that fitted its auto chunk; kept so that a request is always served */
            if (tr) trace_emit(tr, "chunk %d: no smaller chunk fits; using the auto chunk %d", o->chunk_used, p->pub.auto_chunk);
            o->chunk_used = p->pub.auto_chunk;
            STRATA_TRY(plan_layout(p, o->chunk_used, &lay, err));
            break;
        }
        if (tr)
            trace_emit(tr, "chunk %d halved to %d: it needs %d slots, the cache lends at most %d", o->chunk_used,
                       o->chunk_used / 2, lay.slots_needed, p->pub.max_lend_slots);
        o->halvings++;
        o->chunk_used /= 2;
        STRATA_TRY(plan_layout(p, o->chunk_used, &lay, err));
    }
    o->loan_slots = lay.slots_needed;
    o->verdict = o->halvings > 0 ? 1 : 0;
    return STRATA_OK;
}

strata_status mem_lend(strata_engine *e, int32_t *t) {
    plan *p = &e->mp;
    if (p->no_cache) {
        arena a;
        arena_init(&a, e->own_chunk, p->own_chunk_bytes);
        if (chunk_buffers_alloc(e, &a, *t) != STRATA_OK) {
            char msg[400];
            arena_chunk_fail_msg(&a, *t, msg, sizeof msg);
            return err_set(&e->err, STRATA_ERR_INTERNAL, "%s", msg);
        }
        e->stats.last_loan_slots = 0;
        return STRATA_OK;
    }
    strata_loan_prediction r;
    STRATA_TRY(mem_loan_rule(p, &e->trace, *t, &r, &e->err));
    e->stats.halvings += r.halvings;
    *t = r.chunk_used;
    const int32_t k = r.loan_slots;
    uint8_t *mem = cache_lend(&e->cache, k);
    STRATA_ASSERT(&e->err, mem != NULL);
    trace_emit(&e->trace, "lent %d slots for %d tokens", k, *t);
    e->stats.last_loan_slots = k;
    e->stats.slots_lent_now = k;

    arena a;
    arena_init(&a, mem, (int64_t)k * p->pub.slot_bytes);
    int32_t ring = plan_ring_slots(p, *t);
    e->ring = arena_alloc(&a, (int64_t)ring * p->pub.slot_bytes, "ring");
    strata_status s = e->ring ? e->be->layout(e, &a, *t) : STRATA_ERR_BUDGET;
    if (s != STRATA_OK) {
        char msg[400];
        e->be->fail_msg(e, &a, *t, msg, sizeof msg);
        e->ring = NULL;
        return err_set(&e->err, p->pub.lend_policy == STRATA_LEND_LEGACY ? STRATA_ERR_LEND : STRATA_ERR_INTERNAL,
                       "lending the prompt path its slots failed: %s", msg);
    }
    e->ring_slots = ring;
    e->ring_next = 0;
    e->moe_batch = ring;
    return STRATA_OK;
}

strata_status mem_give_back(strata_engine *e) {
    strata_status s = STRATA_OK;
    int32_t k = cache_lent(&e->cache);
    if (k > 0) {
        s = e->be->loan_end(e); /* the device: the prompt's work on the loan comes first */
        int32_t n = cache_refill(&e->cache);
        e->stats.refills++;
        trace_emit(&e->trace, "refilled %d slots (%d experts copied back)", k, n);
        const strata_status s2 = e->be->cache_changed(e);
        if (s == STRATA_OK) s = s2;
    }
    e->ring = NULL;
    e->ring_slots = 0;
    e->moe_batch = 0;
    e->stats.slots_lent_now = 0;
    e->be->use_scratch(e); /* cannot fail: it did at open */
    return s;
}

