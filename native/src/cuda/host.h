/*
 * cuda/host.h — the CUDA backend's host side (host_memory.c, host_forward.c): the forward pass on an NVIDIA GPU with the same blocks as the host
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
 * Decode with every expert resident, or under --miss read (with the expert store pinned),
 * skips that round trip: the router kernel writes the segment tables itself from a device table of each
 * expert's addresses (ptr_dev, made from the cache's residency table): its slot when it is cached and the
 * copy into the slot has landed, else its place in the pinned store, which the kernels read over the bus
 * (the same bytes, so the same bits). A decode step then never waits for the host, nor for the copies of
 * a refill, a swap or an LRU admission: those run on the copy stream under the next steps, and the table
 * names a slot from the first step after its copy has landed (gpu_routing_settle). The step is captured
 * once as a CUDA Graph (the position comes from device memory, pos_dev) and replayed with one launch per
 * token; the table changes under it without a new capture. Each layer's choices land in their own row of
 * the scratch and come back with the logits, so the cache counts them (lookups, misses, the policy's
 * admissions, the adaptive routing counts, profiles) exactly as the host engine does.
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
#ifndef STRATA_CUDA_HOST_H
#define STRATA_CUDA_HOST_H

#include <stdint.h>

#include "cache.h"
#include "common.h"
#include "cuda_backend.h"
typedef struct cuda_state cuda_state;
#include "engine_internal.h"

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
#define SEQ_EVENTS 8          /* batches of copies into slots in flight at once (their events) */
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
    exp_ptrs *ptr_dev;       /* device [L * E]: the same (when decode can route on the device, else NULL) */
    int32_t routing;         /* decode routes on the device now: no loan, and every expert resident in a usable
                              * slot or --miss read (ptr_dev names the store for the others) */
    int32_t ptr_stale;       /* ptr_dev names the store for a cached expert whose slot is still being copied */
    /* copies into slots in batches: a table build closes the open batch with an event on the copy stream */
    int64_t *slot_seq;       /* [S]: the batch the last copy into each slot went in (0: none) */
    int64_t seq_open;        /* the batch copies go in now (from 1) */
    int64_t seq_done;        /* every batch up to this one has landed */
    int32_t seq_dirty;       /* a copy went into batch seq_open */
    void *seq_ev[SEQ_EVENTS]; /* after batch b's copies, at b % SEQ_EVENTS */
    char store_why[640];     /* why there is no pinned store (the plan line and --miss read's error) */
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
    /* the expert store (STRATA_CUDA_STORE): the mapped file page-locked for the device (reg_parts), or every
     * expert copied once into pinned host memory (store); a slot is then filled by DMAs with no host
     * copy. Neither: through the ring above. */
    uint32_t reg_parts;      /* parts of the mapped file page-locked (every part of a split model), or 0 */
    uint8_t *store;          /* pinned: gate | up | down of each expert, layer after layer, or NULL */
    int32_t store_shared;    /* store or reg_parts is the first device's of a split (shared, not freed here) */
    int32_t direct;          /* reg_parts or store: a copy needs no work from the host */
    int32_t overlap;         /* copies on CUDA_STREAM_COPY, ordered by the events below (STRATA_CUDA_OVERLAP) */
    int32_t copies_pending;  /* copies were enqueued outside a wave (refill, swaps): the next forward waits */
    strata_status copy_status; /* the first failed copy of the cache's copy function (it returns bytes) */
    void *ev_copy;           /* copy stream: after the copies of the last wave */
    void *ev_tables;         /* compute stream: after the last wave's segment tables left the staging */
    void *ev_half[2];        /* compute stream: after the products that last read each half of the prompt's ring */
    int64_t ring_wave;       /* prompt waves through the ring so far (which half is next) */
    double copy_ms;          /* measured time of one expert's copy (the fill at open) */
    double host_ms;          /* measured time of one expert on the host (at open, then a running mean) */
    double miss_split;       /* STRATA_CUDA_MISS_SPLIT, or -1: --miss auto's host share from the rates */
    uint32_t host_probe;     /* decode steps with misses (--miss auto refreshes its host time every 64) */
};

/* ---- helpers ----------------------------------------------------------------------------------- */

static inline strata_status dev_fail(strata_engine *e, strata_status s) {
    if (s == STRATA_OK) return s;
    return err_set(&e->err, s, "%s", cuda_ctx_error(e->md->gpu->ctx));
}
#define DEV(e, call) STRATA_TRY(dev_fail((e), (call)))

/* The device of the state in use (e->md) is the current one. A layer split's devices may be different
 * cards, and the CUDA calls run on the current device: every entry into the backend for a device of a
 * split makes its card current first (one device: nothing to do). */
static inline strata_status gpu_use(strata_engine *e) {
    if (e->n_dev == 1) return STRATA_OK;
    return dev_fail(e, cuda_ctx_use(e->md->gpu->ctx));
}

/* The device in use holds the last layers (and so the output head): the only one of an engine without a
 * split. */
static inline int gpu_holds_head(const strata_engine *e) { return e->md == &e->devs[e->n_dev - 1]; }


/* Bytes of one expert of layer l (gate + up + down). */
static inline int64_t expert_bytes(const cuda_state *g, int32_t l) {
    return g->xbytes[3 * l] + g->xbytes[3 * l + 1] + g->xbytes[3 * l + 2];
}

/* The gate, up and down of an expert of layer l whose slot (or ring slot) starts at base. */
static inline exp_ptrs slot_ptrs(const cuda_state *g, int32_t l, const uint8_t *base) {
    const int64_t gb = g->xbytes[3 * l], ub = g->xbytes[3 * l + 1];
    return (exp_ptrs){base, base + gb, base + gb + ub};
}

/* Segments a wave of a chunk of T tokens may have: at most T * K pairs, grouped by expert into segments
 * of CUDA_SEG_TOKENS, so <= T * K / SEG + E (the device tables and their pinned staging are sized by it). */
static inline int64_t seg_cap_of(const strata_engine *e, int64_t T) {
    return T * e->hp.n_expert_used / CUDA_SEG_TOKENS + e->hp.n_expert + 1;
}

/* The stream expert copies go on. */
static inline int32_t copy_stream(const cuda_state *g) { return g->overlap ? CUDA_STREAM_COPY : CUDA_STREAM_COMPUTE; }

/* ---- shared by host_memory.c and host_forward.c ----------------------------------------------- */

/* host_memory.c: copy expert (l, ex) — gate, up and down back to back — into device memory at dst (a
 * slot or a ring slot) on `stream`, from the expert store. */
strata_status gpu_expert_to(strata_engine *e, uint8_t *dst, int32_t l, int32_t ex, int32_t stream);
/* host_memory.c: the cache operation that just ran copied with no failure (else its message). */
strata_status gpu_copies_ok(strata_engine *e);
/* host_memory.c: work enqueued on the compute stream from now on comes after every copy so far. */
strata_status gpu_order_copies(strata_engine *e);
/* host_memory.c: decode's routing and ptr_dev follow the cache (see routing in the header above). */
strata_status gpu_routing_refresh(strata_engine *e);
/* host_memory.c: before a routed step: ptr_dev names the slots whose copies have landed since. */
strata_status gpu_routing_settle(strata_engine *e);
/* host_forward.c: experts ex[0..n) of layer W on the host with the device's bits (decode misses). */
void gpu_host_experts(strata_engine *e, const layer_weights *W, const int32_t *ex, int32_t n, const float *x,
                      float *const *out, float *scratch);
void gpu_host_expert(strata_engine *e, const layer_weights *W, int32_t ex, const float *x, float *out,
                     float *scratch);
/* host_forward.c: one forward pass on the device (the backend's forward). */
strata_status gpu_forward(strata_engine *e, const int32_t *tokens, int32_t T, int prompt, int want_logits);

#endif
