/*
 * plan.c — the memory plan (see plan.h).
 *
 * Order, each step traced with the memory left:
 *   1. budget B: --vram-budget (CPU: an arena of that size stands in for device memory; 0 = enough for
 *      every expert plus the largest chunk's loan), or the device's free memory on CUDA;
 *   2. fixed part: resident weights + KV cache (max_context at f16 or int8) + decode scratch + reserve;
 *      when it does not fit, BUDGET says how much is missing and which flag to change;
 *   3. expert cache: --expert-cache N, or every whole slot that is left (auto). A slot holds one
 *      expert of one layer, gate + up + down, in the file's own layout; every slot has the size of the
 *      largest expert blob (rounded up to 256 bytes) so that any expert fits any slot, which is what
 *      lets the cache move an expert of one layer into a slot freed by another;
 *   4. prompt path: the largest candidate chunk whose layout fits the loan limit
 *      (max_lend = min(lend_pct * N, N - floor)) and whose host borrow fits the host RAM plan.
 *
 * layout(T) = chunk buffers (chunk_buffers_alloc against a measuring arena, so the sizes cannot drift
 * from the allocation) + a ring of staging slots whose depth depends on T:
 *
 *   - a large chunk does enough math per streamed expert (T*K/E tokens each) to hide a copy behind it,
 *     so its ring is a byte budget: PLAN_RING_BYTES (128 MiB) of slots, at least PLAN_RING_MIN (4), at
 *     most one layer (E) of experts;
 *   - a small chunk has too little math per expert to hide a copy: its ring holds the whole next layer
 *     while this one computes (PLAN_DEEP_RING_LAYERS = 2 layers of experts) and at least
 *     PLAN_DEEP_RING_BYTES (32 MiB) of copies in flight, which copy engines need to reach full bandwidth
 *     on small experts. Every ring is capped at three quarters of max_lend and at max_lend minus a
 *     1-token chunk's buffers, so that a small cache keeps room for a small chunk (the deep ring is
 *     never shallower than the large-chunk ring).
 *   - "small" is the scan's small pick: the largest candidate whose buffers fit the loan limit together
 *     with the deep ring (plan.small_chunk). Chunks at or below it get the deep ring, larger ones the
 *     byte-budget ring; the auto chunk is the largest candidate that fits with its own ring.
 *
 * So slots_needed(T) is not monotonic in T: it drops where T passes the small pick. Under the current
 * policy that is harmless (a request's chunk t <= auto chunk fits with its own ring: t <= small pick fits
 * by the pick's definition, larger t needs fewer buffers than the auto chunk with the same ring; halving
 * remains as the guard). Under --lend-policy legacy the loan is sized for the auto chunk only, and a
 * request at or below the small pick asks for more than that whenever the deep ring outweighs the
 * buffers the auto chunk adds. Worked figures (2 threads, lend_pct 0.5, floor 128):
 *   tiny preset (D 128, 4 layers, K 4 of E 32, F 64, Q8_0 experts 25.5 KiB, context 4096, 1-2 threads):
 *   ~9.9 KiB of buffers per token, big ring 32, deep ring 1286 (the 32 MiB floor). Chunk 4096 needs
 *   ~1590 slots, 2048 with the deep ring ~2066. Legacy fails for 2048-token chunks (auto chunk 4096)
 *   with --expert-cache 4132..5687 and for 3072-token chunks with 4910..5687; below, the small pick is
 *   under the short chunk (it gets the byte ring), above, the small pick reaches 4096 (the auto chunk
 *   gets the deep ring too). The edges move by a few slots with the thread count (attention scratch).
 *   Qwen3-30B-A3B at Q4_K (experts ~2.65 MB, D 2048, 32 heads of 128, K 8 of E 128, F 768, F32 router):
 *   ~245 KiB of buffers per token (measured with the real dimensions), big ring 50 slots (128 MiB),
 *   deep ring 256 (two layers). Chunk 4096 needs ~437 slots with its ring, 2048 with the deep ring ~450.
 *   With no context cap the auto chunk fills the loan limit closely, so legacy fails only in narrow
 *   bands of cache sizes, 46 sizes between 900 and 1115 slots (1 thread, context 32768), where the small
 *   pick's deep-ring layout lies between the auto chunk's loan and the loan limit: "only with some cache
 *   sizes", as the original report said.
 *
 * The request's chunk: a prompt of n tokens asks for t = min(auto chunk, n rounded up to
 * PLAN_GRANULARITY = 256 tokens). Scan candidates are multiples of 256 up to the largest allowed
 * (--prefill auto:MAX, default 8192, capped by the context), then halvings below 256 for tiny budgets.
 *
 * Host RAM: experts are pinned when they fit next to the auto chunk's host borrow (T * (D * 4 + 8)
 * bytes: the chunk's embeddings and token ids staged on the host) within the available RAM minus a
 * headroom (a tenth, between 256 MiB and 2 GiB), else mapped from the file; the scan drops chunks whose
 * borrow does not fit, so a doubled chunk cannot push a small machine into swap.
 */
#include "plan.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "arena.h"
#include "common.h"

#define MIB(b) ((double)(b) / (1024.0 * 1024.0))

static int64_t slot_round(int64_t b) { return (b + 255) / 256 * 256; }

int32_t plan_default_floor(int32_t n_slots) {
    /* "128, or a quarter of a small cache" */
    return n_slots < 4 * PLAN_DEFAULT_FLOOR ? n_slots / 4 : PLAN_DEFAULT_FLOOR;
}

static int64_t host_available_from_proc(void) {
    FILE *f = fopen("/proc/meminfo", "r");
    if (!f) return 0;
    char line[256];
    int64_t kib = 0;
    while (fgets(line, sizeof line, f)) {
        long long v;
        if (sscanf(line, "MemAvailable: %lld kB", &v) == 1) {
            kib = v;
            break;
        }
    }
    fclose(f);
    return kib * 1024;
}

int32_t plan_ring_slots(const plan *p, int32_t n_tokens) {
    if (p->no_cache) return 0; /* no cache: experts are read in place from host memory */
    return n_tokens <= p->pub.small_chunk ? p->deep_ring : p->big_ring;
}

static int64_t host_bytes_of(const plan *p, int32_t T) {
    if (p->host_chunk_bytes) return p->host_chunk_bytes(p->chunk_ctx, T);
    return (int64_t)T * ((int64_t)p->n_embd * 4 + 8);
}

strata_status plan_layout(const plan *p, int32_t n_tokens, strata_layout *out, errbuf *err) {
    if (n_tokens < 1)
        return err_set(err, STRATA_ERR_INVALID_ARGUMENT, "layout: a chunk needs at least 1 token, not %d", n_tokens);
    int64_t buf = p->chunk_bytes(p->chunk_ctx, n_tokens);
    if (buf < 0)
        return err_set(err, STRATA_ERR_INTERNAL, "layout: the chunk buffers of %d tokens could not be sized",
                       n_tokens);
    memset(out, 0, sizeof *out);
    out->n_tokens = n_tokens;
    out->buffer_bytes = buf;
    out->ring_slots = plan_ring_slots(p, n_tokens);
    int64_t sb = p->pub.slot_bytes > 0 ? p->pub.slot_bytes : 1;
    int64_t buf_slots = (buf + sb - 1) / sb;
    int64_t need = buf_slots + out->ring_slots;
    out->slots_needed = need > INT32_MAX ? INT32_MAX : (int32_t)need;
    out->host_bytes = host_bytes_of(p, n_tokens);
    return STRATA_OK;
}

int32_t plan_request_chunk(const plan *p, int32_t n_tokens) {
    int64_t g = p->granularity;
    int64_t t = (n_tokens + g - 1) / g * g;
    if (t < 1) t = 1;
    return (int32_t)STRATA_MIN(t, (int64_t)p->pub.auto_chunk);
}

/* Does a chunk of T fit the loan limit and the host RAM plan? */
static int chunk_fits(const plan *p, int32_t T, int64_t host_room, strata_layout *lay) {
    if (plan_layout(p, T, lay, NULL) != STRATA_OK) return 0;
    if (lay->host_bytes > host_room) return 0;
    if (p->no_cache) return 1; /* checked against the budget by the caller */
    return lay->slots_needed <= p->pub.max_lend_slots;
}

/* Next smaller scan candidate: multiples of the granularity, then halvings below it. */
static int32_t next_candidate(int32_t T, int32_t g) {
    if (T > g && T % g == 0) return T - g;
    if (T > g) return T / g * g;
    return T / 2;
}

static void say(plan_say_fn fn, void *ctx, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
#include <stdarg.h>
static void say(plan_say_fn fn, void *ctx, const char *fmt, ...) {
    if (!fn) return;
    char line[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    fn(ctx, line);
}

static const char *kv_name(int32_t t) { return t == STRATA_KV_INT8 ? "int8" : "f16"; }

strata_status plan_make(plan *p, const plan_inputs *in, const strata_params *prm, plan_say_fn sayfn,
                        void *sctx, errbuf *err) {
    memset(p, 0, sizeof *p);
    strata_plan *pp = &p->pub;
    p->chunk_bytes = in->chunk_bytes;
    p->host_chunk_bytes = in->host_chunk_bytes;
    p->chunk_ctx = in->chunk_ctx;
    p->n_embd = in->n_embd;
    p->granularity = PLAN_GRANULARITY;
    pp->device = in->device;
    pp->n_threads = in->n_threads;
    pp->simd = in->simd;
    pp->lend_policy = prm->lend_policy;
    pp->cache_policy = prm->cache_policy;
    /* On the CPU backend a host miss is the same work as a copy minus the copy, so auto is host, and so is
     * read (the CPU reads a miss from host RAM where it is). On CUDA auto splits each step's misses
     * between the host and copies (cuda/host_forward.c); read needs the pinned store, which the backend
     * checks at open (cuda/host_memory.c). */
    pp->miss_policy = in->device != STRATA_DEVICE_CUDA &&
                              (prm->miss_policy == STRATA_MISS_AUTO || prm->miss_policy == STRATA_MISS_READ)
                          ? STRATA_MISS_HOST
                          : prm->miss_policy;
    pp->kv_type = prm->kv_type;
    pp->n_experts_total = (in->n_moe_layer > 0 ? in->n_moe_layer : in->n_layer) * in->n_expert;
    pp->slot_bytes = slot_round(in->expert_bytes);
    pp->small_chunk = 0;

    /* ---- parameters ---- */
    if (prm->miss_policy < STRATA_MISS_AUTO || prm->miss_policy > STRATA_MISS_READ)
        return err_set(err, STRATA_ERR_INVALID_ARGUMENT, "--miss: unknown policy %d (use auto, host, copy or read)",
                       prm->miss_policy);
    if (prm->kv_type != STRATA_KV_F16 && prm->kv_type != STRATA_KV_INT8)
        return err_set(err, STRATA_ERR_INVALID_ARGUMENT, "--kv: unknown KV type %d (use f16 or int8)", prm->kv_type);
    if (prm->lend_policy != STRATA_LEND_CURRENT && prm->lend_policy != STRATA_LEND_LEGACY)
        return err_set(err, STRATA_ERR_INVALID_ARGUMENT, "--lend-policy: unknown policy %d (use current or legacy)",
                       prm->lend_policy);
    if (prm->max_context < 0)
        return err_set(err, STRATA_ERR_INVALID_ARGUMENT, "--max-context: %d is negative", prm->max_context);
    if (prm->expert_cache < -1)
        return err_set(err, STRATA_ERR_INVALID_ARGUMENT, "--expert-cache: %d is not auto or a slot count",
                       prm->expert_cache);
    if (prm->prefill_chunk < 0 || prm->prefill_max < 0)
        return err_set(err, STRATA_ERR_INVALID_ARGUMENT, "--prefill: the chunk must be positive (got %d)",
                       prm->prefill_chunk < 0 ? prm->prefill_chunk : prm->prefill_max);
    if (prm->lend_pct > 1.0f)
        return err_set(err, STRATA_ERR_INVALID_ARGUMENT, "--lend-pct: %g is not in (0, 1]", (double)prm->lend_pct);
    if (prm->vram_budget < 0 || prm->vram_reserve_mib < 0)
        return err_set(err, STRATA_ERR_INVALID_ARGUMENT, "--vram-budget / --vram-reserve-mib must not be negative");

    int32_t ctx = prm->max_context > 0 ? prm->max_context : STRATA_MIN(in->n_ctx_train > 0 ? in->n_ctx_train : 4096, 4096);
    pp->max_context = ctx;
    pp->resident_bytes = in->resident_bytes;
    pp->n_seq = prm->n_seq > 0 ? prm->n_seq : 1;
    pp->kv_bytes = in->kv_bytes(prm->kv_type, in->n_layer, ctx, &in->kv);
    if (pp->kv_bytes > 0) pp->kv_bytes *= pp->n_seq; /* every sequence has its own */
    if (pp->kv_bytes < 0)
        return err_set(err, STRATA_ERR_UNSUPPORTED,
                       "--kv %s cannot hold this model's keys and values (rows of %d values; int8 needs a multiple of "
                       "32): use --kv f16",
                       kv_name(prm->kv_type), in->kv.k_dim);
    pp->scratch_bytes = in->scratch_bytes;
    pp->reserve_bytes = (int64_t)prm->vram_reserve_mib << 20;
    /* as the device arena will hand them out: each buffer rounded up to the arena's alignment */
    p->fixed_bytes = arena_size_of(pp->resident_bytes) + arena_size_of(pp->kv_bytes) +
                     arena_size_of(pp->scratch_bytes) + arena_size_of(pp->reserve_bytes);
    p->no_cache = prm->expert_cache == 0;

    /* ---- host RAM ---- */
    int64_t avail = prm->host_ram_budget > 0 ? prm->host_ram_budget
                                             : (in->host_available > 0 ? in->host_available : host_available_from_proc());
    if (avail <= 0) avail = (int64_t)1 << 40; /* unknown: do not limit */
    if (prm->host_ram_budget > 0) {
        p->host_headroom = 0; /* an explicit budget is what may be used */
    } else {
        int64_t h = avail / 10;
        p->host_headroom = STRATA_MIN(STRATA_MAX(h, (int64_t)256 << 20), (int64_t)2 << 30);
        if (p->host_headroom > avail / 2) p->host_headroom = avail / 2;
    }
    pp->host_avail_bytes = avail - p->host_headroom;
    pp->host_expert_bytes = in->expert_bytes_total;

    /* ---- chunk candidates ---- */
    int32_t max_chunk = prm->prefill_chunk > 0 ? prm->prefill_chunk
                                               : (prm->prefill_max > 0 ? prm->prefill_max : PLAN_DEFAULT_MAX_CHUNK);
    if (max_chunk > ctx) max_chunk = ctx;
    p->fixed_chunk = prm->prefill_chunk > 0;
    p->prefill_max = max_chunk;
    /* first scan candidate: the largest multiple of the granularity (or the fixed chunk itself) */
    int32_t first = p->fixed_chunk || max_chunk < p->granularity ? max_chunk : max_chunk / p->granularity * p->granularity;

    /* ---- 1. budget ---- */
    int64_t B;
    const char *budget_src;
    p->big_ring = (int32_t)STRATA_MIN((int64_t)in->n_expert,
                                      STRATA_MAX((int64_t)PLAN_RING_MIN, PLAN_RING_BYTES / pp->slot_bytes));
    int32_t deep_raw = (int32_t)STRATA_MAX((int64_t)PLAN_DEEP_RING_LAYERS * in->n_expert,
                                           (PLAN_DEEP_RING_BYTES + pp->slot_bytes - 1) / pp->slot_bytes);
    /* The default size: every expert plus the largest candidate's loan (lend_pct applied), so that the
     * default engine never displaces an expert and reads prompts at the largest chunk. The CPU backend's
     * budget is that; on CUDA without --vram-budget it is that, or the free device memory when less. */
    int64_t default_bytes = 0;
    if (prm->vram_budget <= 0) {
        p->deep_ring = deep_raw;
        pp->small_chunk = INT32_MAX; /* size for the deep ring: the default plan's auto chunk is its small pick */
        strata_layout l;
        int64_t most = 0;
        for (int32_t T = first; T >= 1; T = next_candidate(T, p->granularity)) {
            if (plan_layout(p, T, &l, err) != STRATA_OK) return err->status;
            if (l.slots_needed > most) most = l.slots_needed;
            if (p->fixed_chunk) break;
        }
        float pct = prm->lend_pct > 0 ? prm->lend_pct : PLAN_DEFAULT_LEND_PCT;
        int64_t n = pp->n_experts_total + most;
        n = STRATA_MAX(n, (int64_t)ceil((double)most / pct));
        n = STRATA_MAX(n, most + PLAN_DEFAULT_FLOOR);
        pp->small_chunk = 0;
        if (p->no_cache) n = 0;
        if (prm->expert_cache > 0) n = prm->expert_cache;
        int64_t own = 0;
        if (p->no_cache) {
            if (plan_layout(p, first, &l, err) != STRATA_OK) return err->status;
            own = l.buffer_bytes;
        }
        default_bytes = p->fixed_bytes + n * pp->slot_bytes + own;
    }
    if (prm->vram_budget > 0) {
        B = prm->vram_budget;
        budget_src = "--vram-budget";
    } else if (in->device == STRATA_DEVICE_CUDA) {
        B = STRATA_MIN(in->device_free, default_bytes);
        budget_src = B < default_bytes ? "free device memory" : "default: every expert and the largest loan";
    } else {
        B = default_bytes;
        budget_src = prm->expert_cache >= 0 ? "default: the fixed part and the cache" : "default: every expert and the largest loan";
    }
    pp->budget_bytes = B;
    int64_t left = B;
    say(sayfn, sctx, "plan: budget %.1f MiB (%s)", MIB(B), budget_src);
    left -= arena_size_of(pp->resident_bytes);
    say(sayfn, sctx, "plan: resident weights %.1f MiB, %.1f MiB left", MIB(pp->resident_bytes), MIB(left));
    left -= arena_size_of(pp->kv_bytes);
    char seqs[48] = ""; /* "" for one sequence, else how many the KV cache holds */
    if (pp->n_seq > 1) snprintf(seqs, sizeof seqs, " for each of %d sequences", pp->n_seq);
    say(sayfn, sctx, "plan: KV cache %d tokens%s at %s %.1f MiB, %.1f MiB left", ctx, seqs, kv_name(prm->kv_type),
        MIB(pp->kv_bytes), MIB(left));
    left -= arena_size_of(pp->scratch_bytes);
    say(sayfn, sctx, "plan: decode scratch %.1f MiB, %.1f MiB left", MIB(pp->scratch_bytes), MIB(left));
    left -= arena_size_of(pp->reserve_bytes);
    say(sayfn, sctx, "plan: reserve %.1f MiB, %.1f MiB left", MIB(pp->reserve_bytes), MIB(left));

    /* ---- 2. fixed part ---- */
    if (left < 0) {
        int64_t missing = -left;
        const char *hint;
        char kvhint[160] = "";
        if (pp->kv_bytes > pp->resident_bytes && ctx > 256) {
            int64_t per_tok = pp->kv_bytes / ctx;
            int64_t fit_ctx = per_tok > 0 ? (pp->kv_bytes - missing) / per_tok : 0;
            if (fit_ctx > 0)
                snprintf(kvhint, sizeof kvhint, ", or lower --max-context to at most %lld tokens (or use --kv int8%s)",
                         (long long)fit_ctx, pp->n_seq > 1 ? ", or lower --parallel" : "");
            hint = "the context is too long for the budget";
        } else {
            hint = "the budget cannot hold the resident part";
        }
        return err_set(err, STRATA_ERR_BUDGET,
                       "%s: resident weights %.1f MiB + KV cache %.1f MiB (%d tokens%s at %s) + decode scratch %.1f MiB "
                       "+ reserve %.1f MiB = %.1f MiB, but the device budget is %.1f MiB (%s); %.1f MiB missing: "
                       "raise --vram-budget to at least %.0f MiB%s",
                       hint, MIB(pp->resident_bytes), MIB(pp->kv_bytes), ctx, seqs, kv_name(prm->kv_type),
                       MIB(pp->scratch_bytes), MIB(pp->reserve_bytes), MIB(p->fixed_bytes), MIB(B), budget_src,
                       MIB(missing), ceil(MIB(p->fixed_bytes + pp->slot_bytes * 8)), kvhint);
    }

    /* ---- 3. expert cache ---- */
    int64_t fit = left / pp->slot_bytes;
    int64_t n_slots;
    if (p->no_cache) {
        n_slots = 0;
    } else if (prm->expert_cache > 0) {
        n_slots = prm->expert_cache;
        if (n_slots > fit)
            return err_set(err, STRATA_ERR_BUDGET,
                           "--expert-cache %lld slots need %.1f MiB (%lld x %.2f MiB) but the budget leaves %.1f MiB "
                           "after the fixed part; %.1f MiB missing: lower --expert-cache to at most %lld or raise "
                           "--vram-budget to at least %.0f MiB",
                           (long long)n_slots, MIB(n_slots * pp->slot_bytes), (long long)n_slots, MIB(pp->slot_bytes),
                           MIB(left), MIB(n_slots * pp->slot_bytes - left), (long long)fit,
                           ceil(MIB(p->fixed_bytes + n_slots * pp->slot_bytes)));
    } else {
        n_slots = fit;
        if (n_slots > INT32_MAX / 2) n_slots = INT32_MAX / 2;
    }
    pp->n_slots = (int32_t)n_slots;
    left -= n_slots * pp->slot_bytes;
    say(sayfn, sctx, "plan: expert cache %d slots of %.3f MiB (%d experts in the model), %.1f MiB left", pp->n_slots,
        MIB(pp->slot_bytes), pp->n_experts_total, MIB(left));

    /* ---- 4. prompt path ---- */
    float pct = prm->lend_pct > 0 ? prm->lend_pct : PLAN_DEFAULT_LEND_PCT;
    pp->lend_floor = prm->lend_floor >= 0 ? prm->lend_floor : plan_default_floor(pp->n_slots);
    if (pp->lend_floor > pp->n_slots) pp->lend_floor = pp->n_slots;
    int64_t by_pct = (int64_t)floor((double)pct * (double)pp->n_slots + 1e-9);
    pp->max_lend_slots = (int32_t)STRATA_MAX(0, STRATA_MIN(by_pct, (int64_t)pp->n_slots - pp->lend_floor));
    /* no ring may take more than three quarters of what the cache lends, nor leave less than a 1-token
     * chunk's buffers (which grow with the thread count: attention scratch per thread), so that a small
     * cache still has room for a small chunk; a ring has at least one slot */
    int64_t b1 = p->chunk_bytes(p->chunk_ctx, 1);
    int64_t b1_slots = b1 > 0 ? (b1 + pp->slot_bytes - 1) / pp->slot_bytes : 0;
    int32_t cap34 = (int32_t)STRATA_MAX(
        1, STRATA_MIN((int64_t)pp->max_lend_slots * 3 / 4, (int64_t)pp->max_lend_slots - b1_slots));
    p->big_ring = STRATA_MIN(p->big_ring, cap34);
    p->deep_ring = STRATA_MAX(p->big_ring, STRATA_MIN(deep_raw, cap34));

    int64_t host_room = pp->host_avail_bytes; /* experts may be mapped instead of pinned */
    strata_layout lay;
    /* the small pick: the largest candidate that fits the loan limit with the deep ring */
    pp->small_chunk = 0;
    if (!p->no_cache) {
        for (int32_t T = first; T >= 1; T = next_candidate(T, p->granularity)) {
            if (plan_layout(p, T, &lay, NULL) != STRATA_OK) break;
            int64_t need = lay.slots_needed - lay.ring_slots + p->deep_ring;
            if (need <= pp->max_lend_slots && lay.host_bytes <= host_room) {
                pp->small_chunk = T;
                break;
            }
        }
    }
    int32_t chosen = 0;
    int32_t T = first;
    for (; T >= 1; T = p->fixed_chunk ? T / 2 : next_candidate(T, p->granularity)) {
        if (chunk_fits(p, T, host_room, &lay) && !(p->no_cache && lay.buffer_bytes > left)) {
            chosen = T;
            break;
        }
        if (p->fixed_chunk && T / 2 >= 1)
            say(sayfn, sctx, "plan: --prefill %d halved to %d: it needs %d slots, the cache lends at most %d", T, T / 2,
                lay.slots_needed, pp->max_lend_slots);
    }
    if (!chosen) {
        strata_layout one;
        if (plan_layout(p, 1, &one, err) != STRATA_OK) return err->status;
        if (one.host_bytes > host_room)
            return err_set(err, STRATA_ERR_BUDGET,
                           "host RAM: the prompt path needs %.1f MiB for a chunk of 1 token but only %.1f MiB may be "
                           "used (%.1f MiB kept free); raise --host-ram-budget",
                           MIB(one.host_bytes), MIB(host_room), MIB(p->host_headroom));
        if (p->no_cache)
            return err_set(err, STRATA_ERR_BUDGET,
                           "the prompt path needs %.1f MiB of buffers for a chunk of 1 token but the budget leaves "
                           "%.1f MiB: raise --vram-budget by at least %.1f MiB",
                           MIB(one.buffer_bytes), MIB(left), MIB(one.buffer_bytes - left));
        return err_set(err, STRATA_ERR_BUDGET,
                       "the prompt path cannot borrow enough slots: a chunk of 1 token needs %d slots (ring %d) but "
                       "the cache lends at most %d of its %d slots (floor %d, lend-pct %.2f); raise --expert-cache "
                       "(or --vram-budget) by at least %d slots, or raise --lend-pct",
                       one.slots_needed, one.ring_slots, pp->max_lend_slots, pp->n_slots, pp->lend_floor, (double)pct,
                       (int32_t)STRATA_MAX(1, (int64_t)ceil((one.slots_needed - pp->max_lend_slots) / pct)));
    }
    pp->auto_chunk = chosen;
    pp->auto_ring_slots = lay.ring_slots;
    pp->auto_loan_slots = p->no_cache ? 0 : lay.slots_needed;
    pp->host_borrow_bytes = lay.host_bytes;
    if (p->no_cache) p->own_chunk_bytes = lay.buffer_bytes;
    p->experts_pinned = in->expert_bytes_total + lay.host_bytes <= pp->host_avail_bytes;
    say(sayfn, sctx, "plan: host RAM %.1f MiB usable (%.1f MiB headroom): experts %.1f MiB %s, chunk borrow %.1f MiB",
        MIB(pp->host_avail_bytes), MIB(p->host_headroom), MIB(in->expert_bytes_total),
        p->experts_pinned ? "pinned" : "mapped from the file (RAM is short)", MIB(lay.host_bytes));
    return STRATA_OK;
}

void plan_line(const plan *p, char *buf, size_t len) {
    const strata_plan *pp = &p->pub;
    char seqs[32] = "";
    if (pp->n_seq > 1) snprintf(seqs, sizeof seqs, " x %d sequences", pp->n_seq);
    static const char *miss[] = {"auto", "host", "copy", "read"};
    snprintf(buf, len,
             "plan: budget %.1f MiB = resident %.1f + kv %.1f (%d tokens %s%s) + scratch %.1f + reserve %.1f + cache "
             "%d slots x %lld bytes; auto chunk %d (ring %d slots, loan %d slots); small chunk %d (ring %d); floor %d; "
             "max lend %d; lend %s; miss %s; cache %s; host experts %.1f MiB %s, borrow %.1f of %.1f MiB",
             MIB(pp->budget_bytes), MIB(pp->resident_bytes), MIB(pp->kv_bytes), pp->max_context,
             kv_name(pp->kv_type), seqs, MIB(pp->scratch_bytes), MIB(pp->reserve_bytes), pp->n_slots,
             (long long)pp->slot_bytes, pp->auto_chunk, pp->auto_ring_slots, pp->auto_loan_slots, pp->small_chunk,
             p->deep_ring, pp->lend_floor, pp->max_lend_slots,
             pp->lend_policy == STRATA_LEND_LEGACY ? "legacy" : "current",
             pp->miss_policy >= 0 && pp->miss_policy <= 3 ? miss[pp->miss_policy] : "?",
             pp->cache_policy == STRATA_CACHE_LRU ? "lru" : "adaptive", MIB(pp->host_expert_bytes),
             p->experts_pinned ? "pinned" : "mapped", MIB(pp->host_borrow_bytes), MIB(pp->host_avail_bytes));
}
