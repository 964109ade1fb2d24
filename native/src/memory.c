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
 *
 * A layer split (--split layer) has one mem_device per device, each with all of the above: its own plan
 * (made within its own budget from its layers' weights, KV cache and experts), memory, cache and loan.
 * A request's chunk is the one every device can lend for (mem_split_loan_rule applies each device's rule
 * until none lowers it); each device then lends, lays out and refills on its own. e->md names the device
 * the backend works on; outside a forward and between the calls here it is the first.
 */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "cache.h"
#include "common.h"
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

/* Start-up lines of the plan: a device of a split says which it is. */
typedef struct say_ctx {
    strata_engine *e;
    const mem_device *d; /* NULL without a split */
} say_ctx;

static void say(void *ctx, const char *line) {
    const say_ctx *c = ctx;
    if (c->d)
        trace_emit(&c->e->trace, "device %d (layers %d-%d): %s", c->d->index, c->d->layer_begin, c->d->layer_end - 1,
                   line);
    else
        trace_emit(&c->e->trace, "%s", line);
}

#define MIB(b) ((double)(b) / (1024.0 * 1024.0))

/* ---- the layer split: which device holds which layers ------------------------------------------ */

/* Cut the layers into the params' runs: by tensor_split's shares (all 0: as even as possible), each
 * device one run of consecutive layers, the first device the first run. */
static strata_status split_layers(strata_engine *e, errbuf *err) {
    const strata_params *p = &e->params;
    const int32_t L = e->hp.n_layer;
    if (p->split == STRATA_SPLIT_NONE) {
        e->n_dev = 1;
        e->devs[0].index = 0;
        e->devs[0].layer_begin = 0;
        e->devs[0].layer_end = L;
        return STRATA_OK;
    }
    const int32_t n = p->n_devices;
    if (n > L)
        return err_set(err, STRATA_ERR_INVALID_ARGUMENT,
                       "--split layer over %d devices: the model has only %d layers, and every device needs at least "
                       "one; give at most %d devices",
                       n, L, L);
    double share[STRATA_MAX_DEVICES], total = 0;
    for (int32_t d = 0; d < n; d++) total += p->tensor_split[d];
    for (int32_t d = 0; d < n; d++) share[d] = total > 0 ? p->tensor_split[d] / total : 1.0 / n;
    double cum = 0;
    int32_t begin = 0;
    for (int32_t d = 0; d < n; d++) {
        cum += share[d];
        int32_t end = d == n - 1 ? L : (int32_t)floor(cum * L + 0.5);
        if (end <= begin)
            return err_set(err, STRATA_ERR_INVALID_ARGUMENT,
                           "--tensor-split: device %d's share (%.3g of %.3g) gives it no layer of the model's %d; "
                           "raise its share or give fewer devices",
                           p->devices[d], (double)p->tensor_split[d], total, L);
        e->devs[d].index = p->devices[d];
        e->devs[d].layer_begin = begin;
        e->devs[d].layer_end = end;
        begin = end;
    }
    e->n_dev = n;
    return STRATA_OK;
}

/* Bytes of the resident weights device d holds: its layers', the embedding on the first, the head on the
 * last (one device: every resident weight). */
static int64_t device_resident_bytes(const strata_engine *e, int32_t d) {
    if (e->n_dev == 1) return e->w.resident_bytes;
    const mem_device *md = &e->devs[d];
    int64_t b = 0;
    for (int32_t l = md->layer_begin; l < md->layer_end; l++) b += e->w.layers[l].resident_bytes;
    if (d == 0) b += e->w.embd_bytes;
    if (d == e->n_dev - 1) b += e->w.head_bytes;
    return b;
}

/* The engine's plan: the devices' plans together (sizes and slots summed, the chunk all of them run). */
static void combine_plans(strata_engine *e) {
    e->plan = e->devs[0].plan;
    e->chunk = e->plan.auto_chunk;
    if (e->n_dev == 1) return;
    strata_plan *o = &e->plan;
    for (int32_t d = 1; d < e->n_dev; d++) {
        const strata_plan *q = &e->devs[d].plan;
        o->budget_bytes += q->budget_bytes;
        o->resident_bytes += q->resident_bytes;
        o->kv_bytes += q->kv_bytes;
        o->scratch_bytes += q->scratch_bytes;
        o->reserve_bytes += q->reserve_bytes;
        o->n_slots += q->n_slots;
        o->n_experts_total += q->n_experts_total;
        o->auto_ring_slots += q->auto_ring_slots;
        o->auto_loan_slots += q->auto_loan_slots;
        o->lend_floor += q->lend_floor;
        o->max_lend_slots += q->max_lend_slots;
        o->host_expert_bytes += q->host_expert_bytes;
        o->host_borrow_bytes += q->host_borrow_bytes;
        o->auto_chunk = STRATA_MIN(o->auto_chunk, q->auto_chunk);
        o->small_chunk = STRATA_MIN(o->small_chunk, q->small_chunk);
    }
    e->chunk = o->auto_chunk;
}

/* One device's plan, memory and expert cache (e->md is the device). */
static strata_status device_open(strata_engine *e, int32_t d, plan_inputs in, errbuf *err) {
    const hparams *hp = &e->hp;
    mem_device *md = &e->devs[d];
    e->md = md;
    /* the device's context and what its plan may use (a card shared with an earlier device of the split
     * reports what that one left free) */
    int64_t device_free = 0;
    STRATA_TRY(e->be->init(e, &device_free, err));
    in.scratch_bytes = e->be->scratch_bytes(e);
    if (in.scratch_bytes < 0) return err_set(err, STRATA_ERR_INTERNAL, "the decode scratch could not be sized");
    strata_params prm = e->params;
    prm.max_context = e->n_ctx; /* decided by the engine: the attention scratch depends on it */
    prm.n_seq = e->n_seq;
    if (e->params.split != STRATA_SPLIT_NONE && e->params.vram_budgets[d] > 0) prm.vram_budget = e->params.vram_budgets[d];
    const int32_t nl = md->layer_end - md->layer_begin;
    /* its layers with experts: dense leading layers have none (the cache counts MoE layers only) */
    const int32_t moe0 = STRATA_MAX(md->layer_begin, hp->n_dense_lead);
    const int32_t n_moe = md->layer_end - moe0;
    in.n_layer = nl;
    in.n_moe_layer = n_moe;
    in.resident_bytes = device_resident_bytes(e, d);
    in.expert_bytes_total = e->w.expert_bytes * hp->n_expert * n_moe;
    in.device_free = device_free;
    say_ctx sc = {e, e->n_dev > 1 ? md : NULL};
    STRATA_TRY(plan_make(&md->mp, &in, &prm, say, &sc, err));
    md->plan = md->mp.pub;

    /* the memory itself: the backend's (device memory, or the host block standing in for it) */
    const strata_plan *pp = &md->plan;
    uint8_t *slab = NULL;
    STRATA_TRY(e->be->open(e, &slab, err));

    /* the device's expert cache, over the backend's slab: its layers' experts */
    cache_config cc = {prm.cache_policy, pp->miss_policy, prm.adapt_every, prm.adapt_swaps, prm.adapt_decay};
    STRATA_TRY(cache_init(&md->cache, slab, pp->n_slots, pp->slot_bytes, n_moe, hp->n_expert, &cc, e->be->copy_expert,
                          e, err));
    cache_set_layers(&md->cache, moe0, hp->n_dense_lead, hp->n_layer);
    const double t_fill = engine_now_ms();
    if (prm.expert_profile && prm.expert_profile[0]) {
        STRATA_TRY(cache_profile_load(&md->cache, prm.expert_profile, err));
    } else {
        cache_fill_default(&md->cache);
    }
    STRATA_TRY(e->be->ready(e, t_fill, err)); /* the fill's copies are done (and on the device timed) */
    int32_t resident = cache_resident(&md->cache);
    char line[1024];
    snprintf(line, sizeof line, "expert cache filled: %d of %d experts in %d slots (%s), %.1f MiB copied in %.0f ms",
             resident, pp->n_experts_total, pp->n_slots,
             prm.expert_profile && prm.expert_profile[0] ? "from the profile" : "even spread",
             MIB(md->cache.bytes_copied), engine_now_ms() - t_fill);
    say(&sc, line);
    md->cache.bytes_copied = 0; /* counters start after the fill */
    if (e->be->use_scratch(e) != STRATA_OK)
        return err_set(err, STRATA_ERR_INTERNAL, "the decode scratch does not hold the layout of one token");
    plan_line(&md->mp, line, sizeof line);
    say(&sc, line);
    return STRATA_OK;
}

strata_status mem_open(strata_engine *e, errbuf *err) {
    const hparams *hp = &e->hp;
    const strata_params *prm = &e->params;
    STRATA_TRY(split_layers(e, err));
    e->md = &e->devs[0];
    if (e->n_dev > 1 && e->n_seq > 1)
        return err_set(err, STRATA_ERR_INVALID_ARGUMENT,
                       "--split layer with --parallel above 1 is not supported yet: the step of several sequences runs "
                       "every layer on one device; use --parallel 1 with --split layer, or leave out --split for "
                       "--parallel %d",
                       e->n_seq);
    for (int32_t d = 0; d < e->n_dev && e->n_dev > 1; d++)
        if (e->devs[d].layer_end <= hp->n_dense_lead)
            return err_set(err, STRATA_ERR_INVALID_ARGUMENT,
                           "--split layer: device %d would hold only layers %d-%d, which are dense leading layers "
                           "without experts (the model's first %d); a device of the split needs a layer with experts, "
                           "so give it a later share (--tensor-split) or use fewer devices",
                           e->devs[d].index, e->devs[d].layer_begin, e->devs[d].layer_end - 1, hp->n_dense_lead);
    plan_inputs in;
    memset(&in, 0, sizeof in);
    in.n_layer = hp->n_layer;
    in.n_moe_layer = hp->n_layer - hp->n_dense_lead;
    in.n_expert = hp->n_expert;
    in.n_expert_used = hp->n_expert_used;
    in.n_embd = hp->n_embd;
    in.n_vocab = hp->n_vocab;
    in.kv = hp->kv;
    in.n_ctx_train = hp->n_ctx_train;
    in.expert_bytes = e->w.expert_bytes;
    in.kv_bytes = kv_bytes;
    in.device = STRATA_DEVICE_CPU;
    const int on_gpu = prm->device == STRATA_DEVICE_CUDA || (prm->device == STRATA_DEVICE_AUTO && cuda_backend_ops.present());
    e->be = on_gpu ? &cuda_backend_ops : &cpu_backend_ops;
    if (e->n_dev > 1 && !e->be->layer_split)
        return err_set(err, STRATA_ERR_UNSUPPORTED,
                       "--split layer over %d devices: the %s backend of this build runs every layer on one device; "
                       "leave out --split (or run the split on --device cpu, where the devices are emulated budgets)",
                       e->n_dev, e->be->name);
    if (on_gpu) {
        in.device = STRATA_DEVICE_CUDA;
        if (e->n_seq > 1)
            return err_set(err, STRATA_ERR_INVALID_ARGUMENT,
                           "--parallel %d: the CUDA backend decodes one sequence at a time and cannot yet step several "
                           "together; use --parallel 1 with --device cuda, or --device cpu for several sequences",
                           e->n_seq);
        if (prm->expert_cache == 0)
            return err_set(err, STRATA_ERR_INVALID_ARGUMENT,
                           "--expert-cache 0 runs every expert from host memory, which only the CPU backend does; "
                           "on --device cuda give the cache at least %d slots (the experts one token uses) or auto",
                           hp->n_expert_used);
    }
    in.chunk_bytes = layout_bytes;
    in.host_chunk_bytes = e->be->host_bytes ? host_bytes : NULL;
    in.chunk_ctx = e;
    in.n_threads = pool_size(e->pool);
    in.simd = prm->simd == STRATA_SIMD_AUTO ? quant_cpu_best() : prm->simd;
    for (int32_t d = 0; d < e->n_dev; d++) {
        const strata_status s = device_open(e, d, in, err);
        if (s != STRATA_OK) {
            if (e->n_dev > 1)
                err_prefix(err, "device %d (layers %d-%d): ", e->devs[d].index, e->devs[d].layer_begin,
                           e->devs[d].layer_end - 1);
            e->md = &e->devs[0];
            return s;
        }
    }
    e->md = &e->devs[0];
    combine_plans(e);
    return STRATA_OK;
}

strata_status mem_check_device(const strata_params *p, errbuf *err) {
    if (p->device != STRATA_DEVICE_CUDA || cuda_backend_ops.present()) return STRATA_OK;
    char why[512];
    cuda_backend_ops.absent_why(why, sizeof why); /* no CUDA in this build, or no device */
    return err_set(err, STRATA_ERR_DEVICE, "--device cuda: %s", why);
}

void mem_held(const strata_engine *e, int64_t *now, int64_t *peak) {
    *now = *peak = 0;
    for (int32_t d = 0; d < e->n_dev; d++) {
        int64_t n, p;
        mem_device_held(e, d, &n, &p);
        *now += n;
        *peak += p;
    }
}

void mem_device_held(const strata_engine *e, int32_t d, int64_t *now, int64_t *peak) {
    /* the backend reports the device in use: point the engine at d for the call */
    strata_engine *m = (strata_engine *)e;
    mem_device *was = m->md;
    m->md = &m->devs[d];
    e->be->mem_held(e, now, peak);
    m->md = was;
}

void mem_close(strata_engine *e) {
    for (int32_t d = e->n_dev > 0 ? e->n_dev - 1 : 0; d >= 0; d--) { /* the reverse of the open */
        e->md = &e->devs[d];
        e->be->close(e);
        cache_free(&e->devs[d].cache);
    }
    e->md = &e->devs[0];
}

void mem_sync_stats(strata_engine *e) {
    strata_stats *s = &e->stats;
    s->lookups = s->hits = s->misses = s->swaps = s->bytes_copied = s->host_expert_runs = s->bus_reads = 0;
    s->slots_lent_now = 0;
    for (int32_t d = 0; d < e->n_dev; d++) {
        const expert_cache *c = &e->devs[d].cache;
        s->lookups += c->lookups;
        s->hits += c->hits;
        s->misses += c->misses;
        s->swaps += c->swaps;
        s->bytes_copied += c->bytes_copied;
        s->host_expert_runs += c->host_runs;
        s->bus_reads += c->reads;
        s->slots_lent_now += cache_lent(c);
    }
}

void mem_reset_stats(strata_engine *e) {
    for (int32_t d = 0; d < e->n_dev; d++) {
        expert_cache *c = &e->devs[d].cache;
        c->lookups = c->hits = c->misses = c->swaps = c->bytes_copied = c->host_runs = c->reads = 0;
    }
}

strata_status mem_token_done(strata_engine *e) {
    strata_status s = STRATA_OK;
    for (int32_t d = 0; d < e->n_dev; d++) {
        expert_cache *c = &e->devs[d].cache;
        const uint64_t swaps = c->swaps;
        e->md = &e->devs[d]; /* the adaptation copies into this device's slots */
        cache_token_done(c);
        if (c->swaps != swaps) {
            const strata_status s1 = e->be->cache_changed(e); /* the adaptation's copies */
            if (s == STRATA_OK) s = s1;
        }
    }
    e->md = &e->devs[0];
    return s;
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

strata_status mem_split_loan_rule(const strata_engine *e, const trace_sink *tr, int32_t t, strata_loan_prediction *o,
                                  strata_loan_prediction *per, errbuf *err) {
    if (e->n_dev == 1) {
        STRATA_TRY(mem_loan_rule(&e->devs[0].mp, tr, t, o, err));
        if (per) per[0] = *o;
        return STRATA_OK;
    }
    /* every device runs the same chunk (the residual stream of T tokens crosses between them): apply each
     * device's rule until none lowers it */
    strata_loan_prediction first[STRATA_MAX_DEVICES], r[STRATA_MAX_DEVICES];
    int32_t c = t;
    for (int32_t round = 0;; round++) {
        int32_t low = c, who = 0;
        for (int32_t d = 0; d < e->n_dev; d++) {
            STRATA_TRY(mem_loan_rule(&e->devs[d].mp, NULL, c, &r[d], err));
            if (round == 0) first[d] = r[d];
            if (r[d].chunk_used < low) {
                low = r[d].chunk_used;
                who = d;
            }
        }
        if (low >= c) break;
        if (tr)
            trace_emit(tr, "chunk %d halved to %d: device %d needs %d slots for it, its cache lends at most %d", c, low,
                       e->devs[who].index, r[who].slots_needed, e->devs[who].plan.max_lend_slots);
        c = low;
    }
    int32_t halvings = 0;
    while ((t >> halvings) > c && halvings < 31) halvings++;
    memset(o, 0, sizeof *o);
    o->chunk = t;
    o->chunk_used = c;
    o->halvings = c < t ? halvings : 0;
    for (int32_t d = 0; d < e->n_dev; d++) {
        strata_loan_prediction q = r[d];
        q.chunk = t;
        q.chunk_used = c;
        q.slots_needed = first[d].slots_needed; /* layout(t) on this device */
        q.halvings = o->halvings;
        q.verdict = r[d].verdict == 2 ? 2 : c < t ? 1 : 0;
        if (per) per[d] = q;
        o->slots_needed += q.slots_needed;
        o->loan_slots += q.loan_slots;
        if (q.verdict > o->verdict) o->verdict = q.verdict;
    }
    return STRATA_OK;
}

int32_t mem_request_chunk(const strata_engine *e, int32_t n_tokens) {
    int32_t t = plan_request_chunk(&e->devs[0].mp, n_tokens);
    for (int32_t d = 1; d < e->n_dev; d++) t = STRATA_MIN(t, plan_request_chunk(&e->devs[d].mp, n_tokens));
    return t;
}

/* Lend device md's k slots for chunk t and lay its ring and chunk buffers out in them (e->md is md). */
static strata_status device_lend(strata_engine *e, mem_device *md, int32_t k, int32_t t) {
    plan *p = &md->mp;
    if (p->no_cache) {
        arena a;
        arena_init(&a, md->own_chunk, p->own_chunk_bytes);
        if (chunk_buffers_alloc(e, &a, t) != STRATA_OK) {
            char msg[400];
            arena_chunk_fail_msg(&a, t, msg, sizeof msg);
            return err_set(&e->err, STRATA_ERR_INTERNAL, "%s", msg);
        }
        md->last_loan_slots = 0;
        return STRATA_OK;
    }
    uint8_t *mem = cache_lend(&md->cache, k);
    STRATA_ASSERT(&e->err, mem != NULL);
    if (e->n_dev > 1)
        trace_emit(&e->trace, "device %d: lent %d slots for %d tokens", md->index, k, t);
    else
        trace_emit(&e->trace, "lent %d slots for %d tokens", k, t);
    md->last_loan_slots = k;

    arena a;
    arena_init(&a, mem, (int64_t)k * p->pub.slot_bytes);
    int32_t ring = plan_ring_slots(p, t);
    md->ring = arena_alloc(&a, (int64_t)ring * p->pub.slot_bytes, "ring");
    strata_status s = md->ring ? e->be->layout(e, &a, t) : STRATA_ERR_BUDGET;
    if (s != STRATA_OK) {
        char msg[400];
        e->be->fail_msg(e, &a, t, msg, sizeof msg);
        md->ring = NULL;
        return err_set(&e->err, p->pub.lend_policy == STRATA_LEND_LEGACY ? STRATA_ERR_LEND : STRATA_ERR_INTERNAL,
                       "lending the prompt path its slots failed: %s%s", msg,
                       e->n_dev > 1 ? " (on one device of the split)" : "");
    }
    md->ring_slots = ring;
    md->ring_next = 0;
    md->moe_batch = ring;
    return STRATA_OK;
}

strata_status mem_lend(strata_engine *e, int32_t *t) {
    strata_loan_prediction r, per[STRATA_MAX_DEVICES];
    if (!e->devs[0].mp.no_cache) {
        STRATA_TRY(mem_split_loan_rule(e, &e->trace, *t, &r, per, &e->err));
        e->stats.halvings += r.halvings;
        *t = r.chunk_used;
    }
    strata_status s = STRATA_OK;
    e->stats.last_loan_slots = 0;
    for (int32_t d = 0; d < e->n_dev && s == STRATA_OK; d++) {
        e->md = &e->devs[d];
        s = device_lend(e, e->md, e->devs[0].mp.no_cache ? 0 : per[d].loan_slots, *t);
        e->stats.last_loan_slots += e->md->last_loan_slots;
    }
    e->md = &e->devs[0];
    mem_sync_stats(e);
    return s;
}

strata_status mem_give_back(strata_engine *e) {
    strata_status s = STRATA_OK;
    int lent = 0;
    for (int32_t d = 0; d < e->n_dev; d++) {
        mem_device *md = &e->devs[d];
        e->md = md;
        int32_t k = cache_lent(&md->cache);
        if (k > 0) {
            lent = 1;
            strata_status s1 = e->be->loan_end(e); /* the device: the prompt's work on the loan comes first */
            int32_t n = cache_refill(&md->cache);
            if (e->n_dev > 1)
                trace_emit(&e->trace, "device %d: refilled %d slots (%d experts copied back)", md->index, k, n);
            else
                trace_emit(&e->trace, "refilled %d slots (%d experts copied back)", k, n);
            const strata_status s2 = e->be->cache_changed(e);
            if (s1 == STRATA_OK) s1 = s2;
            if (s == STRATA_OK) s = s1;
        }
        md->ring = NULL;
        md->ring_slots = 0;
        md->moe_batch = 0;
        e->be->use_scratch(e); /* cannot fail: it did at open */
    }
    e->md = &e->devs[0];
    e->stats.refills += lent; /* one loan per prompt, over every device */
    e->stats.slots_lent_now = 0;
    return s;
}
