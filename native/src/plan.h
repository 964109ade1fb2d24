/*
 * plan.h — the engine's memory plan: made once at open, read by the cache, the prefill and the API.
 *
 * The plan splits the device budget (real free memory on CUDA, the emulated --vram-budget on the CPU)
 * into a fixed part (resident weights, KV cache, decode scratch, reserve) and the expert cache (slots of
 * slot_bytes). The prompt path owns nothing: it borrows slots from the cache's tail. How many depends
 * on the chunk T through ONE function, plan_layout(), used by the scan at open, by the loan and by every
 * request. See plan.c's header for the constants and why they are what they are.
 */
#ifndef STRATA_PLAN_H
#define STRATA_PLAN_H

#include <stddef.h>
#include <stdint.h>

#include "arch.h"
#include "error.h"
#include "strata.h"

/* Bytes of the prefill buffers of a chunk of n_tokens (chunk_buffers_alloc run against a measuring
 * arena), or -1 when they cannot be computed. */
typedef int64_t (*plan_chunk_bytes_fn)(void *ctx, int32_t n_tokens);
/* One line of start-up trace (no newline). */
typedef void (*plan_say_fn)(void *ctx, const char *line);

/* What the plan needs to know, gathered by the engine before planning. */
typedef struct plan_inputs {
    int32_t n_layer;             /* transformer blocks */
    int32_t n_moe_layer;         /* of them, those with routed experts (0: all; dense leading layers have none) */
    int32_t n_expert;            /* E */
    int32_t n_expert_used;       /* K */
    int32_t n_embd;              /* D */
    int32_t n_vocab;             /* output rows */
    kv_layout kv;                /* what the KV cache holds per layer and position (arch.h) */
    int32_t n_ctx_train;         /* the model's training context */
    int64_t resident_bytes;      /* every weight that is not a routed expert */
    int64_t expert_bytes;        /* the largest expert blob (gate + up + down of one layer) */
    int64_t expert_bytes_total;  /* all routed experts of all layers */
    /* bytes of the KV cache (kv.c's kv_bytes): K and V, scales included, or -1 for an unknown type */
    int64_t (*kv_bytes)(int32_t kv_type, int32_t n_layer, int32_t n_ctx, const kv_layout *lay);
    int64_t scratch_bytes;       /* decode scratch (the layout of one token, kept outside the cache) */
    plan_chunk_bytes_fn chunk_bytes; /* layout's buffer part */
    plan_chunk_bytes_fn host_chunk_bytes; /* host RAM a chunk borrows (staging), or NULL: T * (D * 4 + 8) */
    void *chunk_ctx;
    int32_t device;              /* strata_device actually used (never AUTO) */
    int64_t device_free;         /* CUDA: free device memory; unused on the CPU */
    int64_t host_available;      /* available host RAM; 0 = read /proc/meminfo */
    int32_t n_threads;           /* threads in use (reported) */
    int32_t simd;                /* kernel level in use (reported) */
} plan_inputs;

typedef struct plan {
    strata_plan pub;             /* what strata_plan_get returns */
    /* the request side of the plan */
    int32_t fixed_chunk;         /* 1 with --prefill N */
    int32_t prefill_max;         /* the largest chunk the scan considered */
    int32_t granularity;         /* request chunks are prompt lengths rounded up to this */
    int32_t big_ring;            /* ring of chunks above small_chunk */
    int32_t deep_ring;           /* ring of chunks at or below small_chunk */
    int32_t experts_pinned;      /* 1: experts pinned in host RAM; 0: mapped from the file */
    int32_t no_cache;            /* --expert-cache 0: experts read from host memory, buffers owned */
    int64_t host_headroom;       /* host RAM kept free */
    int64_t fixed_bytes;         /* resident + kv + scratch + reserve */
    int64_t own_chunk_bytes;     /* no_cache: the prompt path's own buffers (auto chunk) */
    int32_t n_embd;              /* for host_bytes */
    plan_chunk_bytes_fn chunk_bytes;
    plan_chunk_bytes_fn host_chunk_bytes;
    void *chunk_ctx;
} plan;

/* Constants (their reasons are in plan.c's header comment). */
#define PLAN_GRANULARITY 256            /* tokens: request chunks and scan candidates are multiples */
#define PLAN_DEFAULT_MAX_CHUNK 8192     /* tokens: the largest chunk --prefill auto considers */
#define PLAN_RING_BYTES (128LL << 20)   /* byte budget of the ring of a large chunk */
#define PLAN_RING_MIN 4                 /* slots: the shallowest ring */
#define PLAN_DEEP_RING_BYTES (32LL << 20) /* a small chunk keeps at least this many bytes of copies queued */
#define PLAN_DEEP_RING_LAYERS 2         /* ... and at least this many layers of experts */
#define PLAN_DEFAULT_FLOOR 128          /* slots never lent (a quarter of caches under 512 slots) */
#define PLAN_DEFAULT_LEND_PCT 0.5f      /* most of the cache a loan may take */

/* Make the plan. BUDGET (with how much is missing and which flag to change) when the budget cannot
 * hold the fixed part, the requested cache, or any chunk; INVALID_ARGUMENT for bad parameters. */
strata_status plan_make(plan *p, const plan_inputs *in, const strata_params *params, plan_say_fn say,
                        void *say_ctx, errbuf *err);
/* layout(T): the one function the scan, the loan and requests use. */
strata_status plan_layout(const plan *p, int32_t n_tokens, strata_layout *out, errbuf *err);
/* Ring depth of a chunk of n_tokens. */
int32_t plan_ring_slots(const plan *p, int32_t n_tokens);
/* The chunk a prompt of n_tokens asks for: min(auto chunk, n rounded up to the granularity). */
int32_t plan_request_chunk(const plan *p, int32_t n_tokens);
/* The plan as one line (the trace's "plan:" line). */
void plan_line(const plan *p, char *buf, size_t len);
/* Default floor for a cache of n_slots. */
int32_t plan_default_floor(int32_t n_slots);

#endif
