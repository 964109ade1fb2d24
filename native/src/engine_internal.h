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

#include "error.h"
#include "gguf.h"
#include "kv.h"
#include "model.h"
#include "quant.h"
#include "strata.h"
#include "threads.h"
#include "trace.h"

struct mm_seg;

/* The weights of one routed expert as the forward pass sees them. */
typedef struct expert_view {
    wview gate;  /* [F, D] */
    wview up;    /* [F, D] */
    wview down;  /* [D, F] */
} expert_view;

/* Buffers of one prompt chunk of up to cap tokens (a decode step uses the first row of each).
 * Allocated only by chunk_buffers_alloc, freed only by chunk_buffers_free. */
typedef struct chunk_buffers {
    int32_t cap;          /* T the buffers hold */
    size_t act_stride;    /* bytes of one quantized activation row (the largest any weight needs) */
    float *x;             /* [T, D] residual stream */
    float *xn;            /* [T, D] normed input of the current block */
    uint8_t *act;         /* [T, act_stride] activations quantized for the next product */
    float *q;             /* [T, QD] */
    float *k;             /* [T, KD] */
    float *v;             /* [T, KD] */
    float *att;           /* [T, QD] attention output, before the output projection */
    float *o;             /* [T, D] output of a block, before it is added to x */
    float *scores;        /* [n_threads, n_ctx] attention scores, one row per thread */
    float *rope;          /* [head_dim] cos then sin of one position's rotation */
    float *router;        /* [T, E] router logits, then probabilities */
    int32_t *sel;         /* [T, K] selected experts, best first */
    float *wsel;          /* [T, K] their renormalized weights */
    int32_t *grp_off;     /* [E + 1] start of each expert's group in grp_tok / grp_slot */
    int32_t *grp_tok;     /* [T * K] token of each (token, k) pair, grouped by expert */
    int32_t *grp_slot;    /* [T * K] t * K + k of each pair, grouped by expert */
    float *g;             /* [T * K, F] gate products, rows in group order */
    float *u;             /* [T * K, F] up products, rows in group order */
    uint8_t *hact;        /* [T * K, act_stride] silu(g) * u, quantized for down */
    float *ye;            /* [T * K, D] expert outputs, row t * K + k */
    struct mm_seg *segs;  /* [2 * E] product segments of the expert jobs */
    expert_view *views;   /* [E] views of the active experts */
} chunk_buffers;

struct strata_engine {
    /* ---- 1. model description ---- */
    hparams hp;

    /* ---- 2. weights: views into the mapping ---- */
    gguf_file file;
    model_weights w;

    /* ---- 3. plan: fixed at open ---- */
    strata_params params;
    strata_plan plan;
    const quant_traits *qt;   /* kernel table of the level in use */
    int32_t n_ctx;            /* KV positions */
    int32_t chunk;            /* prompt chunk in tokens */

    /* ---- 4. run state: owned ---- */
    pool *pool;
    kv_cache kv;
    chunk_buffers cb;
    float *logits;            /* [V] of the last processed token */
    int32_t has_logits;
    int32_t n_past;           /* tokens in the KV cache */
    strata_stats stats;

    /* ---- device: the CUDA backend's state when running on a GPU (cuda_forward.c), else NULL ---- */
    struct cuda_state *gpu;

    /* ---- diagnostics ---- */
    errbuf err;
    trace_sink trace;
};

typedef enum moe_phase {
    MOE_PHASE_PREFILL = 0, /* a prompt chunk */
    MOE_PHASE_DECODE = 1,  /* one generated token */
} moe_phase;

/* Ensure the chunk buffers hold T tokens (the one place they are allocated). */
strata_status chunk_buffers_alloc(strata_engine *e, int32_t T);
void chunk_buffers_free(strata_engine *e);
/* Bytes chunk_buffers_alloc takes for T tokens. */
int64_t chunk_buffers_bytes(const strata_engine *e, int32_t T);

/* RMSNorm of n rows of D values: out[i] = x[i] / rms(x) * w[i]. Sum of squares in double, in order. */
void rmsnorm_rows(float *out, const float *x, const float *w, int32_t n, int32_t D, float eps);

/* attention.c: x += attention(rmsnorm(x)) for T tokens at positions pos0..pos0+T-1 (appends to KV). */
strata_status attention_block(strata_engine *e, int32_t layer, int32_t T, int32_t pos0);
/* moe.c: x += moe(rmsnorm(x)) for T tokens. */
strata_status moe_block(strata_engine *e, int32_t layer, int32_t T, moe_phase phase);
/* moe.c: the ONE way to reach a routed expert's weights (gate, up, down and their types) during a
 * phase. The memory plan points it at a cache slot, a ring slot or the mapped file. */
strata_status moe_expert(strata_engine *e, int32_t layer, int32_t expert, moe_phase phase, expert_view *out);
/* engine.c: embed T tokens, run every layer, compute the logits of the last token when want_logits. */
strata_status engine_forward(strata_engine *e, const int32_t *tokens, int32_t T, moe_phase phase, int want_logits);

/* engine.c */
strata_status engine_open(const char *path, const strata_params *p, strata_engine **out, errbuf *err);
void engine_close(strata_engine *e);
strata_status engine_prefill(strata_engine *e, const int32_t *tokens, int32_t n, strata_progress_fn progress,
                             void *user);
strata_status engine_decode(strata_engine *e, int32_t token);
double engine_now_ms(void);

#endif
