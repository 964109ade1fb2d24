/*
 * test_memplan.c — unit checks of the arena, the plan and the expert cache without a model
 * (built and run by tests/test_memplan_unit.py). Chunk buffers are sized by a formula that mirrors the
 * engine's chunk_buffers for the model's dimensions; each check prints what failed and returns 1.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "arena.h"
#include "cache.h"
#include "plan.h"

static int failures = 0;
#define CHECK(cond, ...)                                           \
    do {                                                           \
        if (!(cond)) {                                             \
            failures++;                                            \
            fprintf(stderr, "FAIL %s:%d: %s: ", __FILE__, __LINE__, #cond); \
            fprintf(stderr, __VA_ARGS__);                          \
            fprintf(stderr, "\n");                                 \
        }                                                          \
    } while (0)

typedef struct dims {
    int D, QD, KD, E, K, F, L, V, ctx;
    int64_t act_stride;
    int64_t expert_bytes;
} dims;

/* per-token and fixed bytes of the engine's chunk buffers (64-byte aligned buffers) */
static int64_t al(int64_t b) { return (b + 63) / 64 * 64; }
static int64_t chunk_bytes(void *ctx, int32_t T) {
    const dims *d = ctx;
    int64_t t = T, tk = t * d->K;
    return al(t * d->D * 4) * 3 + al(t * d->act_stride) + al(t * d->QD * 4) * 2 + al(t * d->KD * 4) * 2 +
           al(4 * (int64_t)d->ctx) + al(t * d->E * 4) + al(tk * 4) * 4 + al((d->E + 1) * 4) + al(tk * d->F * 4) * 2 +
           al(tk * d->act_stride) + al(tk * d->D * 4);
}

static int64_t kv_bytes(int32_t type, int32_t n_layer, int32_t n_ctx, const kv_layout *lay) {
    int64_t row = (int64_t)lay->n_head_kv * lay->k_dim;
    int64_t rb = type == STRATA_KV_INT8 ? row + row / 32 * 4 : row * 2;
    return 2 * rb * n_layer * n_ctx;
}

static plan_inputs inputs_of(dims *d) {
    plan_inputs in = {0};
    in.n_layer = d->L;
    in.n_expert = d->E;
    in.n_expert_used = d->K;
    in.n_embd = d->D;
    in.n_vocab = d->V;
    in.kv.n_head_kv = d->KD / 128 > 0 ? d->KD / 128 : 1;
    in.kv.k_dim = in.kv.v_dim = d->KD / in.kv.n_head_kv;
    in.n_ctx_train = d->ctx;
    in.resident_bytes = 1 << 20;
    in.expert_bytes = d->expert_bytes;
    in.expert_bytes_total = d->expert_bytes * d->E * d->L;
    in.scratch_bytes = chunk_bytes(d, 1);
    in.kv_bytes = kv_bytes;
    in.chunk_bytes = chunk_bytes;
    in.chunk_ctx = d;
    in.device = STRATA_DEVICE_CPU;
    in.host_available = (int64_t)64 << 30;
    return in;
}

static void check_arena(void) {
    static _Alignas(64) uint8_t mem[4096];
    arena a;
    arena_init(&a, mem, sizeof mem);
    uint8_t *p1 = arena_alloc(&a, 10, "a");
    uint8_t *p2 = arena_alloc(&a, 100, "b");
    CHECK(p1 == mem && p2 == mem + 64, "alignment: %p %p", (void *)p1, (void *)p2);
    CHECK(arena_alloc(&a, 4000, "big") == NULL, "over capacity must fail");
    CHECK(a.failed && a.fail_want == 4000 && a.fail_free == 4096 - 192, "record %lld %lld", (long long)a.fail_want,
          (long long)a.fail_free);
    char msg[256];
    arena_chunk_fail_msg(&a, 77, msg, sizeof msg);
    CHECK(strstr(msg, "prefill: device buffers for a chunk of 77 tokens do not fit (0.0 of 0.0 MiB free at the "
                      "failure; 0.0 MiB taken, the failing buffer wanted 0.0 MiB)") == msg,
          "message: %s", msg);
    arena m;
    arena_init_measure(&m);
    for (int i = 0; i < 5; i++) CHECK(arena_alloc(&m, 1000, "x") != NULL, "measure");
    CHECK(m.used == 5 * 1024, "measured %lld", (long long)m.used);
}

static strata_params params(int64_t budget, int cache, int policy) {
    strata_params p;
    memset(&p, 0, sizeof p);
    p.vram_budget = budget;
    p.expert_cache = cache;
    p.lend_policy = policy;
    p.lend_floor = -1;
    p.max_context = 8192;
    p.adapt_every = 16;
    p.adapt_swaps = 4;
    p.adapt_decay = 0.9f;
    return p;
}

/* A legacy failure: a request chunk t < auto chunk whose layout needs more slots than the auto loan. */
static int legacy_fails(const plan *p, int32_t t) {
    strata_layout lt;
    if (t >= p->pub.auto_chunk) return 0;
    plan_layout(p, t, &lt, NULL);
    return lt.slots_needed > p->pub.auto_loan_slots;
}

static void scan_model(const char *name, dims *d, int ctx, int n_max, int contiguous) {
    plan_inputs in = inputs_of(d);
    errbuf err = {0};
    int lo = -1, hi = -1, n_fail = 0;
    for (int n = 64; n <= n_max; n += 1) {
        strata_params prm = params(0, n, STRATA_LEND_LEGACY);
        prm.max_context = ctx;
        plan p;
        if (plan_make(&p, &in, &prm, NULL, NULL, &err) != STRATA_OK) continue;
        int f = legacy_fails(&p, 2048) || legacy_fails(&p, 3072);
        if (f) {
            if (lo < 0) lo = n;
            hi = n;
            n_fail++;
        }
        /* property: a plan's auto chunk fits its limit */
        CHECK(p.pub.auto_loan_slots <= p.pub.max_lend_slots, "%s n=%d loan %d > max %d", name, n, p.pub.auto_loan_slots,
              p.pub.max_lend_slots);
    }
    printf("%s (context %d): legacy fails for 2048/3072-token chunks with caches of %d..%d slots (%d sizes)\n", name,
           ctx, lo, hi, n_fail);
    CHECK(n_fail >= 3, "%s: a failing range must exist", name);
    CHECK(!contiguous || (n_fail == hi - lo + 1 && hi < n_max), "%s: failing range must be contiguous and bounded "
          "(%d in %d..%d)", name, n_fail, lo, hi);
}

static void check_plan(void) {
    /* tiny: D 128, 4 heads of 32, 2 KV heads, E 32, K 4, F 128, Q8_0 experts */
    /* act_stride: the widest activation row, the F32 router's (D floats) in both models */
    dims tiny = {128, 128, 64, 32, 4, 64, 4, 2048, 4096, 128 * 4, 3 * 128 * 64 / 32 * 34};
    /* Qwen3-30B-A3B: D 2048, 32 heads of 128, 4 KV heads, E 128, K 8, F 768, Q4_K experts (~2.65 MB) */
    dims qwen = {2048, 4096, 512, 128, 8, 768, 48, 151936, 32768, 2048 * 4, 2654208};
    scan_model("tiny", &tiny, 4096, 8000, 1);
    scan_model("qwen3-30b-a3b", &qwen, 32768, 3000, 0);
    plan_inputs in = inputs_of(&qwen);
    errbuf err = {0};
    plan p;
    strata_params prm = params(0, 800, STRATA_LEND_LEGACY);
    CHECK(plan_make(&p, &in, &prm, NULL, NULL, &err) == STRATA_OK, "%s", err.msg);
    int32_t Ts[] = {1024, 2048, 3072, 4096, 6144, 8192};
    for (int i = 0; i < 6; i++) {
        strata_layout l;
        plan_layout(&p, Ts[i], &l, NULL);
        printf("qwen3 layout(%d): buffers %.1f MiB, ring %d, slots %d\n", Ts[i], l.buffer_bytes / 1048576.0,
               l.ring_slots, l.slots_needed);
    }
    char line[1024];
    plan_line(&p, line, sizeof line);
    printf("%s\n", line);

    /* budget errors name the flag */
    in = inputs_of(&tiny);
    prm = params(1 << 20, -1, STRATA_LEND_CURRENT);
    CHECK(plan_make(&p, &in, &prm, NULL, NULL, &err) == STRATA_ERR_BUDGET && strstr(err.msg, "--vram-budget") &&
              strstr(err.msg, "missing"),
          "%s", err.msg);
    prm = params(64 << 20, 100000, STRATA_LEND_CURRENT);
    CHECK(plan_make(&p, &in, &prm, NULL, NULL, &err) == STRATA_ERR_BUDGET && strstr(err.msg, "--expert-cache"), "%s",
          err.msg);
    /* non-monotonic on tiny: the small pick (a deep ring) needs more than the auto chunk 4096 */
    prm = params(0, 4600, STRATA_LEND_CURRENT);
    prm.max_context = 4096;
    CHECK(plan_make(&p, &in, &prm, NULL, NULL, &err) == STRATA_OK, "%s", err.msg);
    strata_layout a, b;
    CHECK(p.pub.auto_chunk == 4096 && p.pub.small_chunk >= 2048 && p.pub.small_chunk < 4096, "auto %d small %d",
          p.pub.auto_chunk, p.pub.small_chunk);
    plan_layout(&p, p.pub.small_chunk, &a, NULL);
    plan_layout(&p, 4096, &b, NULL);
    CHECK(a.slots_needed > b.slots_needed, "%d needs %d, 4096 needs %d", p.pub.small_chunk, a.slots_needed,
          b.slots_needed);
    plan_line(&p, line, sizeof line);
    printf("%s\n", line);
}

static int64_t fake_copy(void *ctx, int32_t layer, int32_t expert, uint8_t *dst) {
    int64_t *sb = ctx;
    memset(dst, (layer * 31 + expert) & 0xff, (size_t)*sb);
    return *sb;
}

static void check_cache(void) {
    int64_t sb = 256;
    int32_t n = 40, L = 4, E = 16;
    uint8_t *slab = malloc((size_t)(n * sb));
    expert_cache c;
    cache_config cfg = {STRATA_CACHE_ADAPTIVE, STRATA_MISS_COPY, 4, 2, 0.5f};
    errbuf err = {0};
    CHECK(cache_init(&c, slab, n, sb, L, E, &cfg, fake_copy, &sb, &err) == STRATA_OK, "%s", err.msg);
    CHECK(cache_fill_default(&c) == n, "fill");
    int32_t before[64];
    memcpy(before, c.slot_of, sizeof before);
    uint8_t *lent = cache_lend(&c, 15);
    CHECK(lent == slab + 25 * sb && cache_lent(&c) == 15, "lend");
    memset(lent, 0xee, (size_t)(15 * sb)); /* the prompt path scribbles over its loan */
    CHECK(cache_refill(&c) == 15, "refill count");
    CHECK(memcmp(before, c.slot_of, sizeof before) == 0, "residency restored");
    for (int32_t s = 0; s < n; s++) {
        int32_t id = c.expert_in[s];
        CHECK(slab[s * sb] == (((id / E) * 31 + id % E) & 0xff), "slot %d content", s);
    }
    /* decode: a hot non-resident expert gets swapped in by adaptation */
    int32_t hot = 3 * E + 15; /* never in the default fill (rank 63 >= 40 slots) */
    CHECK(c.slot_of[hot] < 0, "hot not resident at start");
    cfg.miss = STRATA_MISS_HOST;
    c.miss = STRATA_MISS_HOST;
    for (int t = 0; t < 8; t++) {
        cache_step_begin(&c);
        CHECK(cache_decode_lookup(&c, 3, 15) == -1 || t > 3, "host miss runs from host");
        cache_token_done(&c);
    }
    CHECK(c.slot_of[hot] >= 0, "adaptive brought the hot expert in (swaps %llu)", (unsigned long long)c.swaps);
    /* profile round trip */
    const char *path = "/tmp/strata_test_profile.txt";
    CHECK(cache_profile_save(&c, path, &err) == STRATA_OK, "%s", err.msg);
    expert_cache d;
    CHECK(cache_init(&d, slab, 8, sb, L, E, &cfg, fake_copy, &sb, &err) == STRATA_OK, "%s", err.msg);
    CHECK(cache_profile_load(&d, path, &err) == STRATA_OK, "%s", err.msg);
    CHECK(d.slot_of[hot] == 0, "best expert of the profile goes first (slot %d)", d.slot_of[hot]);
    CHECK(cache_profile_load(&d, "/nonexistent/profile", &err) == STRATA_ERR_IO && strstr(err.msg, "cannot read"), "%s",
          err.msg);
    FILE *f = fopen(path, "w");
    fprintf(f, "0 1 2.0\n9 0 1.0\n");
    fclose(f);
    CHECK(cache_profile_load(&d, path, &err) == STRATA_ERR_FORMAT && strstr(err.msg, "line 2"), "%s", err.msg);
    remove(path);
    cache_free(&d);
    cache_free(&c);
    free(slab);
}

int main(void) {
    check_arena();
    check_plan();
    check_cache();
    if (failures) fprintf(stderr, "%d checks failed\n", failures);
    else printf("all checks passed\n");
    return failures ? 1 : 0;
}
