/*
 * engine_internal.h — the engine's state, grouped by lifetime, and the forward-pass entry points.
 *
 * Legend used in every file of the forward pass:
 *   T  tokens in a chunk (1 for a decode step)     D  model dimension (n_embd)
 *   E  routed experts per layer                    K  experts used per token
 *   F  hidden dimension of one expert              V  vocabulary
 *   QD n_head * head_dim                           KD n_head_kv * head_dim
 *
 * Lifetimes, built in this order at open and freed in reverse at close:
 *   1. model description: hparams (read from metadata)
 *   2. weights: views into the mapped file (own nothing but the layer array)
 *   3. plan: fixed at open (threads, kernels, context, chunk)
 *   4. run state: KV cache, chunk buffers, logits, counters (owned)
 */
#ifndef STRATA_ENGINE_INTERNAL_H
#define STRATA_ENGINE_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "arena.h"
#include "cache.h"
#include "error.h"
#include "gguf.h"
#include "kv.h"
#include "model.h"
#include "plan.h"
#include "quant.h"
#include "strata.h"
#include "threads.h"
#include "trace.h"

struct mm_seg;
struct backend_ops;

/* The weights of one routed expert as the forward pass sees them. */
typedef struct expert_view {
    wview gate;  /* [F, D] */
    wview up;    /* [F, D] */
    wview down;  /* [D, F] */
} expert_view;

/* Buffers of one prompt chunk of up to cap tokens (a decode step uses the first row of each).
 * Laid out only by chunk_buffers_alloc, inside an arena: the decode scratch (T = 1), the slots lent
 * to a prompt, or a measuring arena (layout(T)). */
typedef struct chunk_buffers {
    int32_t cap;          /* T the buffers hold */
    size_t act_stride;    /* bytes of one quantized activation row (the largest any weight needs) */
    float *x;             /* [T, D] residual stream */
    float *xn;            /* [T, D] normed input of the current block */
    uint8_t *act;         /* [T, act_stride] activations quantized for the next product */
    float *q;             /* [T, QD] */
    float *k;             /* [T, KD] (MLA: [T, Lk + R], the latent and k_pe of each token) */
    float *v;             /* [T, KD] */
    float *att;           /* [T, n_head * head_dim_v] attention output, before the output projection */
    /* multi-head latent attention only (absent otherwise; Lk = kv_lora_rank, Lq = q_lora_rank, R = n_rot) */
    float *mq;            /* [T, Lq] the low-rank q, normed */
    float *mqk;           /* [T, H, Lk + R] each head's query against the cached row: its q_nope mapped into
                           * the latent space, then its roped q_pe */
    float *mlat;          /* [T, H, Lk] each head's attended latent */
    uint8_t *mact;        /* [H * T, mact_stride] per-head activations, head-major, quantized */
    size_t mact_stride;   /* bytes of one of them (the head-sized rows of attn_k_b / attn_v_b, not act_stride) */
    struct mm_seg *msegs; /* [H] the per-head product segments */
    float *o;             /* [T, D] output of a block, before it is added to x */
    float *scores;        /* [n_threads, n_ctx] attention scores, one row per thread */
    float *rope;          /* [head_dim] cos then sin of one position's rotation */
    float *router;        /* [T, E] router logits, then probabilities (the picked ones set to -1) */
    int32_t *sel;         /* [T, K] selected experts, best first */
    float *wsel;          /* [T, K] their renormalized weights */
    int32_t *grp_off;     /* [E + 1] start of each expert's group in grp_tok / grp_slot */
    int32_t *grp_tok;     /* [T * K] token of each (token, k) pair, grouped by expert */
    int32_t *grp_slot;    /* [T * K] t * K + k of each pair, grouped by expert */
    float *g;             /* [T * K, F] gate products, rows in group order */
    float *u;             /* [T * K, F] up products, rows in group order */
    uint8_t *hact;        /* [T * K, act_stride] silu(g) * u, quantized for down */
    float *ye;            /* [T * K, D] expert outputs, row t * K + k */
    float *sg;            /* [T, Fs] shared expert's or dense layer's gate products (Fs: the wider of
                           * n_ff_shexp and n_ff_dense; absent when both are 0) */
    float *su;            /* [T, Fs] their up products */
    uint8_t *shact;       /* [T, act_stride] silu(sg) * su, quantized for their down */
    float *ysh;           /* [T, D] their output */
    float *choice;        /* [T, E] sigmoid routing: the scores plus the correction bias the experts are
                           * picked by (absent under softmax routing) */
    struct mm_seg *segs;  /* [2 * E] product segments of the expert jobs */
    expert_view *views;   /* [E] views of the active experts */
} chunk_buffers;

/* Most sequences an engine holds (strata_params.n_seq). */
#define STRATA_MAX_SEQ 64

/* One sequence's run state. The current sequence's lives in the engine's own fields (kv, n_past,
 * has_logits, logits), which the forward pass reads; engine_seq_select swaps them. */
typedef struct seq_state {
    kv_cache kv;
    int32_t n_past;
    int32_t has_logits;
    float *logits;            /* [V] within the engine's logits_all */
} seq_state;
/* One device's part of the memory layer: the run of layers it holds, its plan (made by the one planner
 * within its own budget), its budget's memory, its expert cache, the chunk buffers laid out in it and its
 * loan. An engine has one; a layer split (--split layer) has one per device, in layer order, and the
 * forward walks them: layers [layer_begin, layer_end) run on device d, and the residual stream crosses to
 * device d + 1 once per pass. */
typedef struct mem_device {
    int32_t index;            /* the device (a CUDA ordinal; an emulated device on the CPU backend) */
    int32_t layer_begin;      /* first layer it holds */
    int32_t layer_end;        /* one past its last */
    plan mp;                  /* its memory plan (plan.c) */
    strata_plan plan;         /* its public part */
    uint8_t *dev_mem;         /* CPU backend: the host block standing in for its memory [dev_len] */
    size_t dev_len;
    arena dev;                /* its budget over dev_mem */
    arena scratch;            /* decode scratch inside dev: the layout of one token */
    uint8_t *own_chunk;       /* --expert-cache 0: the prompt path's own buffers inside dev */
    expert_cache cache;       /* slots inside dev, residency, counters of its layers' experts */
    chunk_buffers cb;         /* the buffers of the chunk in progress on this device */
    uint8_t *ring;            /* while a prompt is read: ring_slots staging slots inside its loan */
    int32_t ring_slots;
    int64_t ring_next;        /* next ring slot to fill (mod ring_slots) */
    int32_t moe_batch;        /* experts fetched together by moe_block (ring depth while reading a prompt) */
    int32_t last_loan_slots;  /* slots it lent for the last prompt */
    struct cuda_state *gpu;   /* the CUDA backend's state of this device (cuda/host.h) on a GPU, else NULL */
} mem_device;

struct strata_engine {
    /* ---- 1. model description ---- */
    hparams hp;

    /* ---- 2. weights: views into the mapping ---- */
    gguf_file file;
    model_weights w;

    /* ---- 3. plan: fixed at open ---- */
    strata_params params;
    strata_plan plan;         /* the devices' plans together (strata_plan_get); devs[0].plan without a split */
    const quant_traits *qt;   /* kernel table of the level in use */
    int32_t n_ctx;            /* KV positions */
    int32_t chunk;            /* prompt chunk in tokens */
    mem_device devs[STRATA_MAX_DEVICES]; /* the memory layer of each device, in layer order */
    int32_t n_dev;            /* devices in use (1 without a split) */
    mem_device *md;           /* the device the forward is on now (devs[0] outside a forward) */

    /* ---- 4. run state: owned ---- */
    pool *pool;
    kv_cache kv;
    float *logits;            /* [V] of the last processed token (of the current sequence) */
    int32_t has_logits;
    int32_t n_past;           /* tokens in the KV cache (of the current sequence) */
    int32_t n_seq;            /* sequences (strata_params.n_seq, at least 1) */
    int32_t cur_seq;          /* the sequence in kv, n_past, has_logits and logits */
    seq_state *seqs;          /* [n_seq]; seqs[cur_seq] is stale while it is current (engine_seq_save) */
    float *logits_all;        /* [n_seq, V] */
    const int32_t *batch_seq; /* during strata_decode_batch: token t belongs to sequence batch_seq[t], at
                                 position seqs[batch_seq[t]].n_past; NULL otherwise */
    strata_stats stats;
    /* during engine_prefill: its progress callback and where the prompt stands, so that a cancel is
     * also seen between the layers of a chunk (a chunk on slow kernels takes seconds); NULL otherwise */
    strata_progress_fn prompt_progress;
    void *prompt_user;
    int32_t prompt_done, prompt_total;

    /* ---- the backend: memory, copies and kernels (cpu_backend_ops or cuda_backend_ops) ---- */
    const struct backend_ops *be;

    /* ---- diagnostics ---- */
    errbuf err;
    trace_sink trace;
};

typedef enum moe_phase {
    MOE_PHASE_PREFILL = 0, /* a prompt chunk */
    MOE_PHASE_DECODE = 1,  /* one generated token */
} moe_phase;

/* ---- the backend seam --------------------------------------------------------------------------
 * What differs between the CPU backend (a host block standing in for device memory) and a GPU: where a
 * chunk's buffers live, how an expert is copied into a slot, and the kernels of the forward pass. The
 * plan, the expert cache, the loan and the refill (plan.c, cache.c, prefill.c) are one code on both and
 * reach the backend only through this table. Every address an arena hands out is the backend's memory
 * (device memory on CUDA): the code above only computes with it. */
typedef struct backend_ops {
    const char *name;
    /* 1: its forward walks the devices of a layer split (e->devs), the residual stream crossing between them */
    int32_t layer_split;
    /* the backend's device can be used here (the CPU's always); else why not, in words */
    int32_t (*present)(void);
    void (*absent_why)(char *buf, size_t len);
    /* before the plan of each device (e->md): its context, and the device memory its plan may use
     * (*free_bytes; the CPU leaves it) */
    strata_status (*init)(strata_engine *e, int64_t *free_bytes, errbuf *err);
    /* bytes of the decode scratch (the plan's scratch): layout(1) and the decode step's tables */
    int64_t (*scratch_bytes)(const strata_engine *e);
    /* after the plan, in its order: resident weights, KV cache, decode scratch, and the slab of the plan's
     * slots (*slab, for the expert cache) */
    strata_status (*open)(strata_engine *e, uint8_t **slab, errbuf *err);
    /* after the expert cache was filled (its copies enqueued since t_fill, engine_now_ms): they are done */
    strata_status (*ready)(strata_engine *e, double t_fill, errbuf *err);
    /* the memory the backend holds now and at most since open */
    void (*mem_held)(const strata_engine *e, int64_t *now, int64_t *peak);
    void (*close)(strata_engine *e);
    /* bytes of the buffers of a chunk of T tokens: the layout below run against a measuring arena */
    int64_t (*layout_bytes)(const strata_engine *e, int32_t T);
    /* host RAM a chunk of T tokens borrows (staging), or NULL for the plan's default */
    int64_t (*host_bytes)(const strata_engine *e, int32_t T);
    /* lay the buffers of a chunk of T tokens out in arena a (the loan); BUDGET when one does not fit */
    strata_status (*layout)(strata_engine *e, arena *a, int32_t T);
    /* point the buffers back at the decode scratch (after the loan is given back) */
    strata_status (*use_scratch)(strata_engine *e);
    /* the expert cache's copy function: one expert from the host store into a slot */
    int64_t (*copy_expert)(void *engine, int32_t layer, int32_t expert, uint8_t *dst);
    /* the prompt is done with its loan: its work that reads the loan comes before the refill's copies */
    strata_status (*loan_end)(strata_engine *e);
    /* the cache changed outside a forward (fill, refill, swaps between tokens): later work sees it */
    strata_status (*cache_changed)(strata_engine *e);
    /* the failure message of a chunk layout that did not fit arena a, with the device's own figures */
    void (*fail_msg)(strata_engine *e, const arena *a, int32_t T, char *buf, size_t len);
    /* one forward pass: embed T tokens, every layer, the logits of the last when want_logits */
    strata_status (*forward)(strata_engine *e, const int32_t *tokens, int32_t T, int prompt, int want_logits);
    /* one decode step of T sequences (e->batch_seq): token t is appended to its own sequence and the logits
     * of every row are computed into that sequence's; NULL when the backend steps one sequence only */
    strata_status (*forward_batch)(strata_engine *e, const int32_t *tokens, int32_t T);
} backend_ops;

extern const backend_ops cpu_backend_ops;  /* forward.c */
extern const backend_ops cuda_backend_ops; /* cuda/host_memory.c */

/* Lay the chunk buffers of T tokens out in arena a (the one place they are laid out). BUDGET without a
 * message when a buffer does not fit: the arena records which and by how much. */
strata_status chunk_buffers_alloc(strata_engine *e, arena *a, int32_t T);
/* Point the chunk buffers back at the decode scratch (after a prompt gave its loan back). */
strata_status chunk_buffers_use_scratch(strata_engine *e);
void chunk_buffers_free(strata_engine *e);
/* Bytes chunk_buffers_alloc takes for T tokens (it, run against a measuring arena). */
int64_t chunk_buffers_bytes(const strata_engine *e, int32_t T);

/* norm.c: RMSNorm of n rows of D values: out[i] = x[i] / rms(x) * w[i]. Sum of squares in double, in order. */
void rmsnorm_rows(float *out, const float *x, const float *w, int32_t n, int32_t D, float eps);

/* attention.c: x += attention(rmsnorm(x)) for T tokens at positions pos0..pos0+T-1 (appends to KV). */
strata_status attention_block(strata_engine *e, int32_t layer, int32_t T, int32_t pos0);
/* moe.c: x += moe(rmsnorm(x)) for T tokens. */
strata_status moe_block(strata_engine *e, int32_t layer, int32_t T, moe_phase phase);
/* moe.c: the ONE way to reach a routed expert's weights (gate, up, down and their types) during a
 * phase. The memory plan points it at a cache slot, a ring slot or the mapped file. */
strata_status moe_expert(strata_engine *e, int32_t layer, int32_t expert, moe_phase phase, expert_view *out);
/* moe.c: copy an expert's gate, up and down from the mapped file into dst (a slot); returns the bytes.
 * ctx is the engine (the expert cache's copy function). */
int64_t moe_expert_copy(void *ctx, int32_t layer, int32_t expert, uint8_t *dst);
/* forward.c: embed T tokens, run every layer, compute the logits of the last token when want_logits
 * (through the backend). */
strata_status engine_forward(strata_engine *e, const int32_t *tokens, int32_t T, moe_phase phase, int want_logits);
/* Between two layers of a prompt chunk: STRATA_ERR_CANCELLED when the prompt's progress callback asks to
 * stop (it is called again with the tokens done so far), STRATA_OK otherwise or outside a prefill. */
strata_status engine_prompt_cancelled(strata_engine *e, int32_t layer);

/* engine.c: open, close, one decode step */
strata_status engine_open(const char *path, const strata_params *p, strata_engine **out, errbuf *err);
void engine_close(strata_engine *e);
strata_status engine_decode(strata_engine *e, int32_t token);
/* engine.c: one decode step of n sequences (strata_decode_batch). */
strata_status engine_decode_batch(strata_engine *e, int32_t n, const int32_t *seqs, const int32_t *tokens);
/* engine.c: make sequence s the current one (its KV cache, position and logits in the engine's fields). */
void engine_seq_select(strata_engine *e, int32_t s);
/* engine.c: the current sequence's fields written back to seqs[cur_seq] / read from it. */
void engine_seq_save(strata_engine *e);
void engine_seq_load(strata_engine *e);
/* prefill.c: a prompt, chunk by chunk, with slots lent by the cache */
strata_status engine_prefill(strata_engine *e, const int32_t *tokens, int32_t n, strata_progress_fn progress,
                             void *user);

/* ---- memory.c: the plan, the backend's memory, the expert cache and the loan ---------------------- */
/* --device cuda asked for and usable (else DEVICE, saying why: no CUDA in this build, or no device). */
strata_status mem_check_device(const strata_params *p, errbuf *err);
/* The memory plan, the backend's memory and the expert cache at open (after the model and the thread
 * pool), and their end at close (the backend's too). */
strata_status mem_open(strata_engine *e, errbuf *err);
void mem_close(strata_engine *e);
/* Counters of the cache copied into e->stats. */
void mem_sync_stats(strata_engine *e);
/* Zero the cache's counters (strata_stats_reset). */
void mem_reset_stats(strata_engine *e);
/* Device memory the engine holds now and at most since open (the emulated budget on the CPU). */
void mem_held(const strata_engine *e, int64_t *now, int64_t *peak);
/* Lend the slots for a prompt's chunk *t (halving it under the current policy when it cannot be lent)
 * and lay the ring and the chunk's buffers out in them. */
strata_status mem_lend(strata_engine *e, int32_t *t);
/* The loan rule mem_lend follows for a request of chunk t (traced to tr when not NULL): the chunk it runs at,
 * the slots lent, the halvings and whether lending fails; strata_predict_loan gives it to callers. */
strata_status mem_loan_rule(const plan *p, const trace_sink *tr, int32_t t, strata_loan_prediction *o, errbuf *err);
/* Give the loan back: the displaced experts are copied back, the buffers return to the decode scratch. */
strata_status mem_give_back(strata_engine *e);
/* The loan rule over every device of the engine for a request of chunk t: the chunk all of them run at
 * (each device's rule applied until they agree), each device's answer in per[] (NULL: not wanted) and
 * their total in *o. One device: mem_loan_rule. */
strata_status mem_split_loan_rule(const strata_engine *e, const trace_sink *tr, int32_t t, strata_loan_prediction *o,
                                  strata_loan_prediction *per, errbuf *err);
/* The request chunk of a prompt of n tokens: the smallest of the devices' (plan_request_chunk). */
int32_t mem_request_chunk(const strata_engine *e, int32_t n_tokens);
/* Device memory device d holds now and at most since open. */
void mem_device_held(const strata_engine *e, int32_t d, int64_t *now, int64_t *peak);
/* A decode token is done on every device's cache (adaptation; a device whose cache swapped experts is told
 * through the backend's cache_changed). */
strata_status mem_token_done(strata_engine *e);

#endif
