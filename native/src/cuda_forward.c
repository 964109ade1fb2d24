/*
 * cuda_forward.c — the CUDA backend: the forward pass on an NVIDIA GPU with the same blocks as the host
 * engine (engine.c, attention.c, moe.c), and the backend operations that the plan, the expert cache and
 * the loan (plan.c, cache.c, prefill.c) run on the device through (cuda_backend_ops).
 *
 * Legend: T tokens in a chunk (1 in decode), D model dim, E experts, K used per token, F expert ffn
 *         dim, QD = H * hd, KD = Hkv * hd, V vocabulary, S slots in the expert cache, L layers.
 *
 * Device memory, laid out once at open from the plan (prefill.c's mem_open), in the plan's order:
 *   resident   norms (f32) and wq/wk/wv/wo/router/output in the file's own types
 *   kv         [L][n_ctx] rows of K and V (f16, or int8 + scales)
 *   scratch    the decode step's buffers: layout(1) and the decode tables (never move, so a captured
 *              CUDA Graph of the step stays valid)
 *   slab       S slots of slot_bytes: gate | up | down of one expert, in the file's layout
 * The expert cache is cache.c's, the same as the CPU backend's: its slab is this device slab and its copy
 * function (copy_expert) a DMA from the host store. A prompt chunk's buffers and its ring of staging slots
 * are laid out (layout(T), the function the plan sized them with) inside the slots the cache lends for
 * the prompt, and the refill copies the displaced experts back afterwards on the copy stream.
 *
 * A layer's experts, after the router: the choices come to the host, which looks each chosen expert up in
 * the cache. A prompt runs the cached ones from their slots and streams the others through the ring, in
 * waves of half the ring (one half is copied while the other's products run). A decode step runs hits
 * from their slots; a miss is copied into the slot the cache's policy picks (--miss copy), or runs on the
 * host from host RAM with the device's bits (--miss host; --miss auto splits the misses from the measured
 * rates). Then one product per matrix (gate, up, down) for all segments of the wave.
 *
 * Decode with every expert resident skips that round trip: the router kernel writes the segment tables
 * itself from a device copy of the expert -> slot addresses (ptr_dev, made from the cache's residency
 * table), so a hit needs no host round trip; the step is captured once as a CUDA Graph (the position comes
 * from device memory, pos_dev) and replayed with one launch per token. Each layer's choices land in their
 * own row of the scratch and come back with the logits, so the cache counts them (lookups, the adaptive
 * policy's routing counts, profiles) exactly as the host engine does.
 *
 * A decode step is nine launches per layer: RMSNorm + 8-bit row; q/k/v; q/k norm + RoPE + KV store;
 * attention (+ Wo's 8-bit row); Wo; ffn norm + F32 router + the experts' 8-bit row (+ top-k and the
 * segments, every expert resident); gate + up + SwiGLU; down (quantizing h itself) + weighted sum. The
 * kernels are launched with programmatic dependent launch, so each one starts, and loads the weights it
 * will read, while the one before it finishes. Every fusion and kernel variant gives the bits of the
 * separate launches (STRATA_CUDA_FAST, _FUSE and _PDL in trace.c switch them off), except attention
 * beyond 256 positions, split over blocks in a fixed order (STRATA_CUDA_ATT_SPLIT).
 *
 * Expert copies (the cache fill, decode misses under --miss copy, swaps, the prompt's ring, the refill)
 * come from the expert store (STRATA_CUDA_STORE, trace.c). By default every routed expert is copied once
 * at open into pinned host memory, when the plan's host RAM allows it (plan.c: "experts pinned"); else a
 * ring of STAGE_RING pinned buffers of one slot each: the pool's threads copy the expert's bytes from the
 * mapped file into a free buffer, and one DMA at full PCIe speed takes it to its slot. A copy straight
 * from the mapping would be a pageable copy: a fraction of the bandwidth, with the host blocked.
 *
 * Copies run on their own stream (CUDA_STREAM_COPY) and the products wait for them through events, so
 * that a layer's hits run while its misses are copied (STRATA_CUDA_OVERLAP=0: all on the compute
 * stream). Copies made outside a forward (the refill, swaps between tokens) are ordered before the next
 * forward's work (copies_pending).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cache.h"
#include "common.h"
#include "cuda_backend.h"
#include "cuda_forward.h"
#include "engine_internal.h"
#include "group_dequant.h"
#include "trace.h"

typedef struct dev_layer {
    float *attn_norm, *ffn_norm, *q_norm, *k_norm; /* [D], [D], [hd], [hd] */
    void *wq, *wk, *wv, *wo, *router;              /* file types */
    void *k_cache, *v_cache;                       /* [n_ctx, kv row] */
} dev_layer;

typedef struct exp_ptrs {
    const void *gate, *up, *down;
} exp_ptrs;

/* the second round of decode fusions (STRATA_CUDA_FUSE, trace.c) */
enum { FUSE_ROUTER = 1, FUSE_ROPE_STORE = 2, FUSE_ATT_Q8 = 4, FUSE_DOWN_Q8 = 8, FUSE_ROUTER_TOPK = 16 };

#define STAGE_RING 4          /* pinned staging buffers for expert copies */
#define STAGE_PIECE (1 << 16) /* the parallel host copy's items are multiples of this many bytes */

struct cuda_state {
    cuda_ctx *ctx;
    dev_layer *layers;       /* [L] */
    float *output_norm;      /* [D] */
    void *output;            /* [V, D] */
    uint8_t *slab;           /* [S, slot_bytes]: the expert cache's slots (cache.c owns what is in them) */
    int64_t slot_bytes;      /* the plan's */
    int64_t *xbytes;         /* [L][3]: bytes of one expert's gate, up and down in layer l */
    int64_t *store_off;      /* [L]: where layer l's experts start in the pinned store */
    const uint8_t **addr;    /* [E]: where each expert of the layer being run is (a slot or a ring slot) */
    exp_ptrs *ptr_host;      /* [L * E]: device addresses of each cached expert's gate/up/down (ptr_dev's source) */
    exp_ptrs *ptr_dev;       /* device [L * E]: the same (when the slab can hold every expert, else NULL) */
    int32_t routing;         /* decode routes on the device now: every expert resident in a usable slot */
    int32_t *pos_dev;        /* device [1]: the position of a graph-replayed decode step */
    const int32_t *pos_arg;  /* pos_dev while a step is captured, else NULL (kernels take pos0) */
    void *graph;             /* the captured decode step (cuda_capture_end), or NULL */
    int32_t graph_state;     /* 0 not captured yet, 1 captured, -1 off (STRATA_CUDA_GRAPH=0 or capture failed) */
    int32_t fused;           /* decode's fused launches (STRATA_CUDA_DECODE=unfused: 0) */
    int32_t fast;            /* latency-tuned decode kernels, CUDA_FAST_* bits (STRATA_CUDA_FAST) */
    int32_t pdl;             /* decode kernels with programmatic dependent launch (STRATA_CUDA_PDL=0: 0) */
    int32_t fuse2;           /* the second round of decode fusions, FUSE_* bits (STRATA_CUDA_FUSE) */
    int32_t xn_q8;           /* act holds xn's 8-bit row (the last norm_matvec wrote it) */
    int32_t att_splits;      /* decode attention's splits per head beyond 256 positions (S) */
    float *att_part;         /* device [H, S, hd + 2]: the splits' states */
    int32_t *att_cnt;        /* device [H + 1]: splits finished per head, then the router's blocks finished
                              * (each back to 0 after its launch) */
    int32_t miss_policy;
    int prompt;              /* the forward in progress reads a prompt chunk (cuda_forward) */
    int32_t kv_type;
    int64_t kv_row;          /* bytes of one position of K (or V) of one layer */
    /* the buffers of the chunk in progress (cap tokens): the decode scratch, or laid out in a loan */
    int32_t cap;
    float *x, *xn, *q, *k, *v, *att, *router, *wsel, *g, *u, *h, *ye; /* device */
    int32_t *sel;            /* device [max(T, L), K]: decode on the device writes layer l's choices in row l */
    uint8_t *act, *hact;     /* device quantized activations [T, act_row], [T*K, hact_row] */
    int64_t act_row, hact_row;
    /* segment tables for the expert products (device) and their host staging (pinned) */
    const void **seg_w;      /* device [3][n_seg] */
    int32_t *seg_tok, *seg_out; /* device [2][n_seg * SEG] */
    int32_t seg_cap;
    void *scratch;           /* device: the decode scratch, layout(1) */
    int64_t scratch_len;
    float *logits_dev;       /* device [V] */
    void *stage;             /* pinned host staging */
    size_t stage_bytes;
    float *host_logits;      /* pinned [V] */
    int32_t *host_sel;       /* pinned [L, K]: a device-routed decode step's choices */
    float *host_tmp;         /* pinned [D + K * D + cuda_mirror_scratch_floats(D, F, K)]: decode misses run on the host
                              * (xn, outputs, scratch) */
    uint8_t *exp_state;      /* [E]: EXP_* of each expert of the layer being run */
    uint8_t *ring[STAGE_RING];   /* pinned [slot_bytes] each, or NULL (STRATA_CUDA_STAGING=0: direct copies) */
    void *ring_done[STAGE_RING]; /* event after the DMA out of each buffer */
    int32_t ring_next;
    int8_t mmq;              /* prompt products on the tensor cores: 0 not decided yet, 1 yes, 2 no */
    int8_t flash;            /* prompt attention on the tensor cores: 0 not decided yet, 1 yes, 2 no */
    int32_t *bucket;         /* host scratch of wave_segments: [2 * (E + 1) + T * K] */
    int32_t bucket_cap;
    /* the expert store (STRATA_CUDA_STORE): the mapped file page-locked for the device (reg_ptr), or every
     * expert copied once into pinned host memory (store); a slot is then filled by DMAs with no host
     * copy. Neither: through the ring above. */
    void *reg_ptr;
    uint8_t *store;          /* pinned: gate | up | down of each expert, layer after layer, or NULL */
    int32_t direct;          /* reg_ptr or store: a copy needs no work from the host */
    int32_t overlap;         /* copies on CUDA_STREAM_COPY, ordered by the events below (STRATA_CUDA_OVERLAP) */
    int32_t copies_pending;  /* copies were enqueued outside a wave (refill, swaps): the next forward waits */
    strata_status copy_status; /* the first failed copy of the cache's copy function (it returns bytes) */
    void *ev_copy;           /* copy stream: after the copies of the last wave */
    void *ev_prod;           /* compute stream: after the products of the last wave */
    void *ev_tables;         /* compute stream: after the last wave's segment tables left the staging */
    void *ev_half[2];        /* compute stream: after the products that last read each half of the prompt's ring */
    int64_t ring_wave;       /* prompt waves through the ring so far (which half is next) */
    double copy_ms;          /* measured time of one expert's copy (the fill at open) */
    double host_ms;          /* measured time of one expert on the host (at open, then a running mean) */
    double miss_split;       /* STRATA_CUDA_MISS_SPLIT, or -1: --miss auto's host share from the rates */
    uint32_t host_probe;     /* decode steps with misses (--miss auto refreshes its host time every 64) */
};

/* ---- helpers ----------------------------------------------------------------------------------- */

static strata_status dev_fail(strata_engine *e, strata_status s) {
    if (s == STRATA_OK) return s;
    return err_set(&e->err, s, "%s", cuda_ctx_error(e->gpu->ctx));
}
#define DEV(e, call) STRATA_TRY(dev_fail((e), (call)))

static strata_status upload(strata_engine *e, void **dst, const void *src, size_t bytes, const char *what) {
    cuda_state *g = e->gpu;
    DEV(e, cuda_alloc(g->ctx, bytes, dst, what));
    DEV(e, cuda_h2d(g->ctx, *dst, src, bytes, CUDA_STREAM_COMPUTE));
    return STRATA_OK;
}

static size_t wbytes(const wview *w) { return (size_t)w->rows * w->row_bytes; }

static strata_status check_type(strata_engine *e, const wview *w, const char *name) {
    if (!cuda_type_supported(w->type))
        return err_set(&e->err, STRATA_ERR_UNSUPPORTED,
                       "--device cuda: tensor %s is %s, which the CUDA kernels do not run yet (they run F32, F16, "
                       "BF16, Q8_0, Q4_0, Q4_K and Q6_K); use --device cpu for this file",
                       name, quant_type_name(w->type) ? quant_type_name(w->type) : "an unknown type");
    return STRATA_OK;
}

/* Bytes of one expert of layer l (gate + up + down). */
static int64_t expert_bytes(const cuda_state *g, int32_t l) {
    return g->xbytes[3 * l] + g->xbytes[3 * l + 1] + g->xbytes[3 * l + 2];
}

/* The gate, up and down of an expert of layer l whose slot (or ring slot) starts at base. */
static exp_ptrs slot_ptrs(const cuda_state *g, int32_t l, const uint8_t *base) {
    const int64_t gb = g->xbytes[3 * l], ub = g->xbytes[3 * l + 1];
    return (exp_ptrs){base, base + gb, base + gb + ub};
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
    /* at most T * K pairs, grouped by expert into segments of CUDA_SEG_TOKENS: <= T * K / SEG + E */
    b->seg_cap = (int32_t)(T * K / CUDA_SEG_TOKENS + E + 1);
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
    cuda_state tmp = *e->gpu; /* the live buffers are untouched: layout(T) may be asked at any time */
    arena a;
    arena_init_measure(&a);
    return layout_into(e, &tmp, &a, T) == STRATA_OK ? a.used : -1;
}

/* Host RAM a chunk of T tokens borrows: the pinned staging of its embeddings, the expert choices and the
 * segment tables of one wave. */
static int64_t stage_bytes_of(const strata_engine *e, int32_t T) {
    const int64_t D = e->hp.n_embd, K = e->hp.n_expert_used, E = e->hp.n_expert;
    const int64_t seg_cap = T * K / CUDA_SEG_TOKENS + E + 1;
    const int64_t rows = T > e->hp.n_layer ? T : e->hp.n_layer;
    return T * D * 4 + rows * K * 8 + 3 * seg_cap * (int64_t)sizeof(void *) + 4 * seg_cap * CUDA_SEG_TOKENS * 4 + 4096;
}

static int64_t cuda_host_bytes(const strata_engine *e, int32_t T) { return stage_bytes_of(e, T); }

/* The pinned staging for chunks of up to T tokens (grown, never shrunk: it is host RAM the plan counted). */
static strata_status stage_reserve(strata_engine *e, int32_t T) {
    cuda_state *g = e->gpu;
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
    STRATA_TRY(layout_into(e, e->gpu, a, T));
    return stage_reserve(e, T);
}

static strata_status cuda_use_scratch(strata_engine *e) {
    cuda_state *g = e->gpu;
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

int64_t cuda_forward_scratch_bytes(const strata_engine *e) {
    const int64_t one = cuda_layout_bytes(e, 1);
    return one < 0 ? -1 : one + decode_tables_bytes(e);
}

/* A chunk's layout that did not fit its loan, with the device's figures: the free memory the CUDA
 * allocator reports and the card's total, what the loan's buffers took, and the failing buffer. */
static void cuda_fail_msg(strata_engine *e, const arena *a, int32_t T, char *buf, size_t len) {
    int64_t free_b = 0, total_b = 0;
    if (cuda_mem_info(e->gpu->ctx, &free_b, &total_b) != STRATA_OK) {
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
static strata_status expert_to(strata_engine *e, uint8_t *dst, int32_t l, int32_t ex, int32_t stream) {
    cuda_state *g = e->gpu;
    const layer_weights *L = &e->w.layers[l];
    const int64_t gb = g->xbytes[3 * l], ub = g->xbytes[3 * l + 1], db = g->xbytes[3 * l + 2], n = gb + ub + db;
    const uint8_t *src_g = L->gate_exps.data + ex * gb;
    const uint8_t *src_u = L->up_exps.data + ex * ub;
    const uint8_t *src_d = L->down_exps.data + ex * db;
    if (g->store) {
        /* pinned: one DMA at full PCIe speed, nothing for the host to copy and nothing to wait for */
        DEV(e, cuda_h2d(g->ctx, dst, g->store + g->store_off[l] + ex * n, (size_t)n, stream));
    } else if (g->reg_ptr || !g->ring[0]) {
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

static int32_t copy_stream(const cuda_state *g) { return g->overlap ? CUDA_STREAM_COPY : CUDA_STREAM_COMPUTE; }

/* The expert cache's copy function (cache.c calls it when it places an expert in a slot): a DMA on the
 * copy stream. A failure is kept in copy_status (the function returns bytes) and reported by the caller
 * of the cache operation. */
static int64_t cuda_copy_expert(void *ctx, int32_t l, int32_t ex, uint8_t *dst) {
    strata_engine *e = ctx;
    cuda_state *g = e->gpu;
    const strata_status s = expert_to(e, dst, l, ex, copy_stream(g));
    if (s != STRATA_OK) {
        if (g->copy_status == STRATA_OK) g->copy_status = s;
        return 0;
    }
    if (g->overlap) g->copies_pending = 1;
    return expert_bytes(g, l);
}

/* The cache operation that just ran copied with no failure (else its message). */
static strata_status copies_ok(strata_engine *e) {
    cuda_state *g = e->gpu;
    const strata_status s = g->copy_status;
    g->copy_status = STRATA_OK;
    if (s != STRATA_OK) return err_prefix(&e->err, "copying an expert into the device cache: ");
    return STRATA_OK;
}

/* Work enqueued on the compute stream from now on comes after every copy enqueued so far. */
static strata_status order_copies(strata_engine *e) {
    cuda_state *g = e->gpu;
    if (!g->copies_pending) return STRATA_OK;
    g->copies_pending = 0;
    DEV(e, cuda_stream_order(g->ctx, CUDA_STREAM_COPY, CUDA_STREAM_COMPUTE));
    return STRATA_OK;
}

/* Every expert is resident in a usable slot: decode routes on the device, from ptr_dev (made from the
 * cache's residency table; uploaded on the compute stream, so the next step reads the new table). */
static strata_status routing_refresh(strata_engine *e) {
    cuda_state *g = e->gpu;
    const expert_cache *c = &e->cache;
    const int32_t LE = e->hp.n_layer * e->hp.n_expert;
    g->routing = 0;
    if (!g->ptr_dev || !env_cuda_device_routing() || cache_lent(c) > 0 || cache_resident(c) < LE) return STRATA_OK;
    for (int32_t id = 0; id < LE; id++) {
        const int32_t s = c->slot_of[id];
        STRATA_ASSERT(&e->err, s >= 0);
        g->ptr_host[id] = slot_ptrs(g, id / e->hp.n_expert, cache_slot_ptr(c, s));
    }
    DEV(e, cuda_h2d(g->ctx, g->ptr_dev, g->ptr_host, (size_t)LE * sizeof(exp_ptrs), CUDA_STREAM_COMPUTE));
    DEV(e, cuda_sync(g->ctx)); /* ptr_host is the upload's source */
    g->routing = 1;
    return STRATA_OK;
}

/* The prompt is done with its loan: the refill's copies (copy stream) come after the prompt's work. */
static strata_status cuda_loan_end(strata_engine *e) {
    cuda_state *g = e->gpu;
    if (g->overlap) DEV(e, cuda_stream_order(g->ctx, CUDA_STREAM_COMPUTE, CUDA_STREAM_COPY));
    return STRATA_OK;
}

/* The cache changed between forwards (refill, swaps): the next forward's work waits for the copies
 * (order_copies), and decode's routing follows the residency. */
static strata_status cuda_cache_changed(strata_engine *e) {
    STRATA_TRY(copies_ok(e));
    return routing_refresh(e);
}

static void host_expert(strata_engine *e, const layer_weights *W, int32_t ex, const float *x, float *out,
                        float *scratch);
static void host_experts(strata_engine *e, const layer_weights *W, const int32_t *ex, int32_t n, const float *x,
                         float *const *out, float *scratch);

/* One expert's gate | up | down from the mapped file into its place in the store (pool item = l * E + e). */
static void store_piece(void *ctx, int64_t item, int thread) {
    (void)thread;
    strata_engine *e = ctx;
    cuda_state *g = e->gpu;
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
    cuda_state *g = e->gpu;
    const int64_t all = (int64_t)e->hp.n_layer * e->hp.n_expert;
    const int store = env_cuda_store();
    const int64_t bytes = store == 1 ? (int64_t)e->file.size : g->store_off[e->hp.n_layer];
    const double gib = (double)bytes / (1 << 30);
    char why[640];
    why[0] = 0;
    if (store == 0) {
        snprintf(why, sizeof why, "STRATA_CUDA_STORE=ring");
    } else if (e->plan.n_slots >= all + e->plan.max_lend_slots) {
        snprintf(why, sizeof why, "every expert is resident");
    } else if (!e->mp.experts_pinned || (e->plan.host_avail_bytes > 0 && bytes > e->plan.host_avail_bytes)) {
        snprintf(why, sizeof why, "%.1f GiB is more than the host RAM the plan may use (%.1f GiB)", gib,
                 (double)e->plan.host_avail_bytes / (1 << 30));
    } else if (store == 1) {
        const double t0 = engine_now_ms();
        if (cuda_host_register(g->ctx, e->file.map, (size_t)e->file.size) == STRATA_OK) {
            g->reg_ptr = e->file.map;
            g->direct = 1;
            trace_emit(&e->trace, "cuda: expert store: the mapped file (%.1f GiB) registered with the device in %.0f ms; "
                       "experts are copied straight from it", gib, engine_now_ms() - t0);
            return;
        }
        snprintf(why, sizeof why, "%s", cuda_ctx_error(g->ctx));
    } else {
        const double t0 = engine_now_ms();
        if (cuda_host_alloc(g->ctx, (size_t)bytes, (void **)&g->store) == STRATA_OK) {
            const double t1 = engine_now_ms();
            pool_run(e->pool, all, store_piece, e);
            g->direct = 1;
            trace_emit(&e->trace, "cuda: expert store: %.1f GiB of pinned host memory in %.0f ms, experts copied into it in "
                       "%.0f ms", gib, t1 - t0, engine_now_ms() - t1);
            return;
        }
        g->store = NULL;
        snprintf(why, sizeof why, "%s", cuda_ctx_error(g->ctx));
    }
    e->mp.experts_pinned = 0; /* the plan line says what was done */
    trace_emit(&e->trace, "cuda: expert store: %s; experts are copied %s", why,
               env_cuda_staging() ? "through a ring of pinned staging buffers" : "straight from pageable memory");
}

/* Time one expert on the host (--miss auto weighs it against a copy; decode refines it): a run of expert
 * 0 of layer 0 first (threads and code warm), then the timed run of expert 0 of the middle layer, whose
 * weights the fill (or the store) has touched since and that the CPU caches no longer hold, as a missed
 * expert's are not. */
static void host_rate(strata_engine *e) {
    cuda_state *g = e->gpu;
    const int64_t D = e->hp.n_embd;
    const int32_t K = e->hp.n_expert_used, E = e->hp.n_expert;
    float *x = g->host_tmp, *out = x + D, *scratch = out + (int64_t)K * D;
    memset(x, 0, (size_t)D * sizeof(float));
    host_expert(e, &e->w.layers[0], 0, x, out, scratch);
    /* a decode step's host share is a few experts of one layer at once: time two of them together
     * (other experts each time), the best of three */
    const int32_t n = K >= 2 && E >= 6 ? 2 : 1;
    float *outs[2] = {out, out + (n > 1 ? D : 0)};
    double best = -1.0;
    for (int32_t r = 0; r < 3; r++) {
        const int32_t ex[2] = {(2 * r) % E, (2 * r + 1) % E};
        const double t0 = engine_now_ms();
        host_experts(e, &e->w.layers[e->hp.n_layer / 2], ex, n, x, outs, scratch);
        const double dt = (engine_now_ms() - t0) / n;
        if (best < 0 || dt < best) best = dt;
    }
    g->host_ms = best;
}

/* ---- open / close ------------------------------------------------------------------------------ */

strata_status cuda_forward_init(strata_engine *e, int64_t *free_bytes) {
    char err[512];
    cuda_state *g = calloc(1, sizeof *g);
    if (!g) return err_set(&e->err, STRATA_ERR_OUT_OF_MEMORY, "out of host memory for the CUDA state");
    e->gpu = g;
    strata_status s = cuda_ctx_create(0, &g->ctx, err, sizeof err);
    if (s != STRATA_OK) return err_set(&e->err, s, "--device cuda: %s", err);
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

strata_status cuda_forward_open(strata_engine *e, uint8_t **slab_out) {
    const hparams *hp = &e->hp;
    cuda_state *g = e->gpu;
    const strata_plan *pp = &e->plan;
    const int64_t D = hp->n_embd, F = hp->n_ff_exp, E = hp->n_expert, L = hp->n_layer, hd = hp->head_dim;
    const int64_t KD = (int64_t)hp->n_head_kv * hd;
    /* every tensor must be one the kernels run */
    STRATA_TRY(check_type(e, &e->w.output, "output.weight"));
    for (int32_t l = 0; l < L; l++) {
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
    for (int32_t l = 0; l < L; l++) {
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
    STRATA_TRY(upload(e, (void **)&g->output_norm, e->w.output_norm, (size_t)D * 4, "the output norm"));
    STRATA_TRY(upload(e, &g->output, e->w.output.data, wbytes(&e->w.output), "the output head"));
    for (int32_t l = 0; l < L; l++) {
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
    if (pp->n_slots >= L * E) { /* every expert can be resident: decode may route on the device */
        DEV(e, cuda_alloc(g->ctx, (size_t)(L * E) * sizeof(exp_ptrs), (void **)&g->ptr_dev, "the expert address table"));
        DEV(e, cuda_alloc(g->ctx, sizeof(int32_t), (void **)&g->pos_dev, "the decode position"));
    }
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
    DEV(e, cuda_event_create(g->ctx, &g->ev_prod));
    DEV(e, cuda_event_create(g->ctx, &g->ev_tables));
    DEV(e, cuda_event_create(g->ctx, &g->ev_half[0]));
    DEV(e, cuda_event_create(g->ctx, &g->ev_half[1]));
    store_open(e);
    if (!g->direct && env_cuda_staging())
        for (int i = 0; i < STAGE_RING; i++) {
            DEV(e, cuda_host_alloc(g->ctx, (size_t)g->slot_bytes, (void **)&g->ring[i]));
            DEV(e, cuda_event_create(g->ctx, &g->ring_done[i]));
        }
    DEV(e, cuda_sync(g->ctx)); /* the fill that follows is timed */
    return STRATA_OK;
}

strata_status cuda_forward_ready(strata_engine *e, double t_fill) {
    cuda_state *g = e->gpu;
    const hparams *hp = &e->hp;
    const int64_t L = hp->n_layer, E = hp->n_expert;
    STRATA_TRY(copies_ok(e));
    DEV(e, cuda_sync(g->ctx));
    g->copies_pending = 0;
    const double fill_ms = engine_now_ms() - t_fill;
    const int32_t filled = cache_resident(&e->cache);
    /* the rate of an expert copy that --miss auto weighs against the host */
    g->copy_ms = filled > 0 ? fill_ms / filled : 0.0;
    trace_emit(&e->trace, "cuda: expert cache filled: %d experts (%.1f MiB) in %.0f ms, %.1f GB/s", filled,
               (double)e->cache.bytes_copied / 1048576.0, fill_ms,
               fill_ms > 0 ? (double)e->cache.bytes_copied / fill_ms / 1e6 : 0.0);
    if (g->miss_policy == STRATA_MISS_AUTO && filled < L * E) {
        host_rate(e);
        trace_emit(&e->trace, "cuda: --miss auto: an expert takes %.3f ms to copy and %.3f ms on the host (%d threads)%s",
                   g->copy_ms, g->host_ms, pool_size(e->pool),
                   g->miss_split >= 0 ? "; STRATA_CUDA_MISS_SPLIT sets the host's share" : "");
    }
    STRATA_TRY(routing_refresh(e));
    g->graph_state = g->ptr_dev && env_cuda_graph() ? 0 : -1;
    DEV(e, cuda_sync(g->ctx));
    trace_emit(&e->trace, "cuda: %s, %d of %lld experts in %d slots of %.2f MiB, KV %.1f MiB%s", cuda_ctx_device_name(g->ctx),
               filled, (long long)(L * E), e->cache.n_slots, g->slot_bytes / 1048576.0,
               2.0 * (double)g->kv_row * e->n_ctx * L / 1048576.0,
               g->routing ? "; decode routes on the device" : "");
    return STRATA_OK;
}

void cuda_forward_close(strata_engine *e) {
    cuda_state *g = e->gpu;
    if (!g) return;
    if (g->ctx) {
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
        cuda_event_free(g->ev_prod);
        cuda_event_free(g->ev_tables);
        cuda_event_free(g->ev_half[0]);
        cuda_event_free(g->ev_half[1]);
        /* before the file is unmapped (engine_close closes the file after this) */
        if (g->reg_ptr) cuda_host_unregister(g->ctx, g->reg_ptr);
        g->reg_ptr = NULL;
        cuda_host_free(g->ctx, g->store);
        g->store = NULL;
        cuda_ctx_destroy(g->ctx);
    }
    free(g->layers);
    free(g->xbytes);
    free(g->store_off);
    free(g->addr);
    free(g->ptr_host);
    free(g->exp_state);
    free(g->bucket);
    free(g);
    e->gpu = NULL;
}

void cuda_forward_mem_held(const strata_engine *e, int64_t *now, int64_t *peak) {
    cuda_mem_held(e->gpu ? e->gpu->ctx : NULL, now, peak);
}

/* ---- blocks ------------------------------------------------------------------------------------ */

/* A decode step (not a prompt chunk, whatever its size): the decode shortcuts below (fused norm and
 * quantization, q/k/v quantized once, device routing, the graph) apply only here, so that prompt
 * chunks keep one code path whatever their T (the tensor-core products of use_mmq). */
static int decoding(const strata_engine *e) { return !e->gpu->prompt; }

/* Decode, one token: y (+)= W x with the one-token kernel (x in W's activation type already). */
static strata_status matvec1(strata_engine *e, int32_t type, const void *w, int64_t rows, int64_t cols, const void *x,
                             float *y, int32_t acc) {
    const void *const w3[3] = {w, NULL, NULL};
    const int64_t r3[3] = {rows, 0, 0};
    float *const y3[3] = {y, NULL, NULL};
    DEV(e, cuda_matvec3(e->gpu->ctx, type, w3, r3, cols, x, y3, acc));
    return STRATA_OK;
}

/* Whether a product of `type` runs on the tensor cores (cuda_mmq*): in every prompt chunk, whatever
 * its T (1 included), so that a token gets the same arithmetic in whichever chunk it is read; decode
 * keeps the matrix-vector kernel. STRATA_CUDA_MMQ=0 turns it off (trace.c). */
static int use_mmq(strata_engine *e, int32_t type) {
    cuda_state *g = e->gpu;
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
    cuda_state *g = e->gpu;
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
    cuda_state *g = e->gpu;
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
    cuda_state *g = e->gpu;
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
    cuda_state *g = e->gpu;
    if (!g->flash) g->flash = trace_env_cuda_flash() ? 1 : 2;
    return g->flash == 1 && !decoding(e) &&
           cuda_flash_attention_supported(g->kv_type, e->hp.n_head, e->hp.n_head_kv, e->hp.head_dim);
}

static strata_status attention(strata_engine *e, int32_t l, int32_t T, int32_t pos0) {
    cuda_state *g = e->gpu;
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
    cuda_state *g = e->gpu;
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
    cuda_state *g = e->gpu;
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
static void host_experts(strata_engine *e, const layer_weights *W, const int32_t *ex, int32_t n, const float *x,
                         float *const *out, float *scratch) {
    const int64_t D = e->hp.n_embd, F = e->hp.n_ff_exp;
    const int32_t simd = e->params.simd == STRATA_SIMD_AUTO ? quant_cpu_best() : e->params.simd;
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
static void host_expert(strata_engine *e, const layer_weights *W, int32_t ex, const float *x, float *out,
                        float *scratch) {
    host_experts(e, W, &ex, 1, x, &out, scratch);
}

/* Segment tables of the experts marked WAVE in state, uploaded; returns the number of segments.
 * The wave's pairs i = t * K + k are first bucketed by expert (one pass over sel, then each expert's
 * pairs in increasing i), so the work is O(T * K + E), not O(E * T * K). */
enum { EXP_IDLE = 0, EXP_PENDING = 1, EXP_WAVE = 2, EXP_HOST = 3, EXP_COPIED = 4 };
static strata_status wave_segments(strata_engine *e, int32_t l, const int32_t *sel, int32_t T, uint8_t *state,
                                   int32_t SEG, int32_t *n_out) {
    cuda_state *g = e->gpu;
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
 * event of this wave's copies (when it copied any), and with events that say when the tables have left
 * the staging (ev_tables) and when the products are done (ev_prod). */
static strata_status run_wave(strata_engine *e, int32_t l, const int32_t *sel, int32_t T, int32_t SEG, int32_t copied) {
    cuda_state *g = e->gpu;
    int32_t n_seg = 0;
    STRATA_TRY(wave_segments(e, l, sel, T, g->exp_state, SEG, &n_seg));
    DEV(e, cuda_event_record(g->ctx, g->ev_tables, CUDA_STREAM_COMPUTE));
    if (g->overlap && copied) DEV(e, cuda_stream_wait(g->ctx, g->ev_copy, CUDA_STREAM_COMPUTE));
    if (n_seg > 0) STRATA_TRY(expert_products(e, l, n_seg, SEG, T)); /* none: every miss runs on the host */
    if (g->overlap) DEV(e, cuda_event_record(g->ctx, g->ev_prod, CUDA_STREAM_COMPUTE));
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

/* The routed experts of one layer for T tokens (see the header). Decode with every expert resident runs
 * on the device alone. Otherwise the choices come to the host, which looks every chosen expert up in the
 * cache: a prompt runs the cached ones from their slots and streams the others through the ring in the
 * loan; a decode step runs hits from their slots and each miss from the slot the cache's policy copies
 * it into, or on the host. A pair's result does not depend on the wave it ran in, so neither does the
 * reply. */
static strata_status moe(strata_engine *e, int32_t l, int32_t T) {
    cuda_state *g = e->gpu;
    expert_cache *c = &e->cache;
    const hparams *hp = &e->hp;
    const layer_weights *W = &e->w.layers[l];
    const dev_layer *dl = &g->layers[l];
    const int32_t D = hp->n_embd, E = hp->n_expert, K = hp->n_expert_used;
    const int on_device = T == 1 && g->routing && decoding(e); /* every expert resident: no round trip */
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
        STRATA_ASSERT(&e->err, n_miss == 0 || (e->ring && e->ring_slots > 0));
        const int32_t halves = e->ring_slots >= 2 ? 2 : 1, per = e->ring_slots / halves;
        for (int32_t ex = 0; ex < E && n_miss > 0;) {
            const int32_t hf = (int32_t)(g->ring_wave++ % halves);
            if (g->overlap) DEV(e, cuda_stream_wait(g->ctx, g->ev_half[hf], CUDA_STREAM_COPY));
            int32_t copied = 0;
            for (; ex < E && copied < per; ex++) {
                if (state[ex] != EXP_PENDING) continue;
                uint8_t *dst = e->ring + ((int64_t)hf * per + copied) * c->slot_bytes;
                STRATA_TRY(expert_to(e, dst, l, ex, cs));
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
        STRATA_TRY(copies_ok(e));
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
    /* (an LRU admission under --miss host copies too: its wave does not read it, the next forward waits) */
    if (g->overlap && g->copies_pending) {
        DEV(e, cuda_event_record(g->ctx, g->ev_copy, CUDA_STREAM_COPY));
        g->copies_pending = 0;
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
            host_experts(e, W, hex, nh, xh, hout, scratch);
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

/* Enqueue one forward of T tokens whose embeddings are in the staging (and, while a graph is
 * captured, the position after them): the upload, every layer, and the logits' download when asked.
 * Nothing here waits for the device when every expert is resident and T == 1. */
static strata_status enqueue_forward(strata_engine *e, int32_t T, int32_t pos0, int want_logits) {
    cuda_state *g = e->gpu;
    const hparams *hp = &e->hp;
    const int32_t D = hp->n_embd;
    const float *xe = (const float *)g->stage;
    /* the host writes the staging again only after a sync (a layer's routing, or the end of this call) */
    DEV(e, cuda_h2d(g->ctx, g->x, xe, (size_t)T * D * 4, CUDA_STREAM_COMPUTE));
    if (g->pos_arg) DEV(e, cuda_h2d(g->ctx, g->pos_dev, xe + (int64_t)T * D, sizeof(int32_t), CUDA_STREAM_COMPUTE));
    for (int32_t l = 0; l < hp->n_layer; l++) {
        strata_status s = attention(e, l, T, pos0);
        if (s == STRATA_OK) s = moe(e, l, T);
        if (s != STRATA_OK) return err_prefix(&e->err, "layer %d: ", l);
    }
    if (want_logits) {
        float *xl = g->x + (int64_t)(T - 1) * D;
        STRATA_TRY(norm_matvec(e, xl, g->output_norm, e->w.output.type, g->output, hp->n_vocab, g->logits_dev, 1));
        DEV(e, cuda_d2h(g->ctx, g->host_logits, g->logits_dev, (size_t)hp->n_vocab * 4, CUDA_STREAM_COMPUTE));
        if (T == 1 && g->routing && decoding(e)) /* the step's choices, row l for layer l */
            DEV(e, cuda_d2h(g->ctx, g->host_sel, g->sel, (size_t)hp->n_layer * hp->n_expert_used * 4,
                            CUDA_STREAM_COMPUTE));
    }
    return STRATA_OK;
}

/* A decode step routed on the device is done: its choices go through the cache like any step's (every
 * one a hit), so the counters, the recency and the adaptive policy's routing counts are the host
 * engine's. */
static void count_device_step(strata_engine *e) {
    cuda_state *g = e->gpu;
    const int32_t K = e->hp.n_expert_used;
    for (int32_t l = 0; l < e->hp.n_layer; l++) {
        cache_step_begin(&e->cache);
        for (int32_t k = 0; k < K; k++) cache_decode_lookup(&e->cache, l, g->host_sel[l * K + k]);
    }
}

/* Capture the decode step (T = 1, every expert resident, logits wanted) as a graph. The capture runs
 * nothing. On failure the step runs without a graph from then on, and the trace says why. */
static void graph_capture(strata_engine *e) {
    cuda_state *g = e->gpu;
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

static strata_status cuda_forward(strata_engine *e, const int32_t *tokens, int32_t T, int prompt, int want_logits) {
    cuda_state *g = e->gpu;
    const int32_t pos0 = e->n_past;
    g->prompt = prompt;
    /* programmatic dependent launch only in decode (the prompt's kernels do not wait for it) */
    cuda_ctx_set_decode(g->ctx, g->fast, g->pdl && !prompt);
    const hparams *hp = &e->hp;
    const int32_t D = hp->n_embd;
    STRATA_ASSERT(&e->err, T <= g->cap); /* laid out by the prefill's loan or the decode scratch */
    STRATA_ASSERT(&e->err, pos0 + T <= e->n_ctx);
    /* the staging below may still be read by the copies of a call that ended without logits or failed
     * (an idle stream makes this free) */
    DEV(e, cuda_sync(g->ctx));
    STRATA_TRY(order_copies(e)); /* the refill's and the swaps' copies come before this forward's work */
    /* embeddings on the host (one row per token), then up */
    float *xe = (float *)g->stage;
    const quant_traits *te = quant_lookup(e->qt, e->w.tok_embd.type);
    for (int32_t t = 0; t < T; t++)
        te->dequant(e->w.tok_embd.data + (size_t)tokens[t] * e->w.tok_embd.row_bytes, xe + (int64_t)t * D, D);
    const int routed = T == 1 && want_logits && g->routing && decoding(e);
    if (routed && g->graph_state >= 0) {
        memcpy(xe + D, &pos0, sizeof pos0); /* the staging holds [D] floats and then the position */
        if (g->graph_state == 0) graph_capture(e);
        if (g->graph_state == 1) {
            DEV(e, cuda_graph_launch(g->ctx, g->graph));
            DEV(e, cuda_sync(g->ctx));
            count_device_step(e);
            memcpy(e->logits, g->host_logits, (size_t)hp->n_vocab * 4);
            e->has_logits = 1;
            return STRATA_OK;
        }
    }
    STRATA_TRY(enqueue_forward(e, T, pos0, want_logits));
    if (want_logits) {
        DEV(e, cuda_sync(g->ctx));
        if (routed) count_device_step(e);
        memcpy(e->logits, g->host_logits, (size_t)hp->n_vocab * 4);
        e->has_logits = 1;
    }
    return STRATA_OK;
}

/* ---- the backend --------------------------------------------------------------------------------- */

const backend_ops cuda_backend_ops = {
    .name = "cuda",
    .layout_bytes = cuda_layout_bytes,
    .host_bytes = cuda_host_bytes,
    .layout = cuda_layout,
    .use_scratch = cuda_use_scratch,
    .copy_expert = cuda_copy_expert,
    .loan_end = cuda_loan_end,
    .cache_changed = cuda_cache_changed,
    .fail_msg = cuda_fail_msg,
    .forward = cuda_forward,
};
