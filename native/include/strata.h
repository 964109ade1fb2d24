/*
 * strata.h — the public interface of libstrata.
 *
 * strata runs Mixture-of-Experts language models stored as GGUF files on machines whose device
 * memory is smaller than the model. The routed experts that are used most live in an expert cache
 * (a slab of equal-sized slots in device memory, or in a host arena that stands in for it on the
 * CPU backend); the others stay in host RAM and are streamed in or computed on the host. Prompts are
 * processed in chunks whose buffers are laid out inside slots that the cache lends for the duration
 * of the prompt (the loan) and gets back afterwards (the refill).
 *
 * Everything here is plain C with opaque handles. No function exits or aborts the process: every
 * failure is a strata_status plus a message (strata_last_error, or the err buffer of
 * strata_engine_open) written so that a user knows what to change.
 *
 * Usage:
 *
 *     strata_params p = strata_default_params();
 *     p.n_threads = 8;
 *     p.vram_budget = 12LL << 30;                 // plan as if the device had 12 GiB
 *     strata_engine *eng = NULL;
 *     char err[512];
 *     if (strata_engine_open("model.gguf", &p, &eng, err, sizeof err) != STRATA_OK) {
 *         fprintf(stderr, "%s\n", err);
 *         return 1;
 *     }
 *     strata_generate_params g = strata_default_generate_params();
 *     g.max_tokens = 64;
 *     int32_t out[64], n_out = 0;
 *     strata_status s = strata_generate(eng, prompt, n_prompt, &g, on_token, NULL, out, 64, &n_out);
 *     if (s != STRATA_OK) fprintf(stderr, "%s\n", strata_last_error(eng));
 *     strata_engine_close(eng);
 *
 * Several sequences: with params.n_seq = N the engine holds N sequences, each with its own KV cache of
 * max_context tokens (the plan counts all N). strata_seq_prefill reads a prompt into one of them;
 * strata_decode_batch appends one token to each of several sequences in one forward pass. A row of the
 * batch gets the bits it would get decoded alone (every kernel's per-row result is independent of the
 * batch), so a reply does not depend on what runs beside it. The single-sequence calls act on sequence 0.
 *
 * Threading: one engine is used by one thread at a time. The engine runs its own worker threads.
 * Enum values are only ever appended; numeric values are part of the ABI.
 * The kernel-level entry points that tests and benchmarks call are in strata_kernels.h, not here.
 */
#ifndef STRATA_H
#define STRATA_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(STRATA_BUILD)
#define STRATA_API __attribute__((visibility("default")))
#else
#define STRATA_API
#endif

#define STRATA_API_VERSION 1

/* ---- status codes ------------------------------------------------------------------------------ */

typedef enum strata_status {
    STRATA_OK = 0,                    /* success */
    STRATA_ERR_INVALID_ARGUMENT = 1,  /* a parameter is out of range or NULL where it may not be */
    STRATA_ERR_IO = 2,                /* a file could not be opened, read, mapped or written */
    STRATA_ERR_FORMAT = 3,            /* the model file is malformed (truncated, bad counts, bad offsets) */
    STRATA_ERR_UNSUPPORTED = 4,       /* valid file, but an architecture or tensor type strata cannot run */
    STRATA_ERR_OUT_OF_MEMORY = 5,     /* a host allocation failed */
    STRATA_ERR_BUDGET = 6,            /* the device budget cannot hold the plan's fixed part */
    STRATA_ERR_CONTEXT = 7,           /* the tokens would not fit in the context (max_context) */
    STRATA_ERR_LEND = 8,              /* lending the prompt path its slots failed (legacy lend policy) */
    STRATA_ERR_CANCELLED = 9,         /* a callback asked to stop */
    STRATA_ERR_DEVICE = 10,           /* a CUDA call failed (out of memory, failed launch, no device) */
    STRATA_ERR_INTERNAL = 11,         /* an internal invariant broke: a bug in strata */
    STRATA_ERR_STATE = 12,            /* the call is not valid in the engine's current state */
} strata_status;

/* ---- enumerations ------------------------------------------------------------------------------ */

/* Tensor types: the numeric values are GGUF's (ggml's) type ids. */
typedef enum strata_type {
    STRATA_TYPE_F32 = 0,
    STRATA_TYPE_F16 = 1,
    STRATA_TYPE_Q4_0 = 2,
    STRATA_TYPE_Q4_1 = 3,
    STRATA_TYPE_Q5_0 = 6,
    STRATA_TYPE_Q5_1 = 7,
    STRATA_TYPE_Q8_0 = 8,
    STRATA_TYPE_Q8_1 = 9,
    STRATA_TYPE_Q2_K = 10,
    STRATA_TYPE_Q3_K = 11,
    STRATA_TYPE_Q4_K = 12,
    STRATA_TYPE_Q5_K = 13,
    STRATA_TYPE_Q6_K = 14,
    STRATA_TYPE_Q8_K = 15,
    STRATA_TYPE_IQ2_XXS = 16,
    STRATA_TYPE_IQ2_XS = 17,
    STRATA_TYPE_IQ3_XXS = 18,
    STRATA_TYPE_IQ1_S = 19,
    STRATA_TYPE_IQ4_NL = 20,
    STRATA_TYPE_IQ3_S = 21,
    STRATA_TYPE_IQ2_S = 22,
    STRATA_TYPE_IQ4_XS = 23,
    STRATA_TYPE_IQ1_M = 29,
    STRATA_TYPE_BF16 = 30,
    STRATA_TYPE_MXFP4 = 39,
} strata_type;

typedef enum strata_device {
    STRATA_DEVICE_CPU = 0,   /* host arena stands in for device memory */
    STRATA_DEVICE_CUDA = 1,  /* NVIDIA GPU */
    STRATA_DEVICE_AUTO = 2,  /* CUDA when a device is present, else CPU */
} strata_device;

typedef enum strata_kv_type {
    STRATA_KV_F16 = 0,   /* K and V stored as f16 */
    STRATA_KV_INT8 = 1,  /* K and V stored as int8 with one f32 scale per block of 32 values */
} strata_kv_type;

typedef enum strata_lend_policy {
    STRATA_LEND_CURRENT = 0,  /* each request's loan holds its own chunk's layout; halve when none can */
    STRATA_LEND_LEGACY = 1,   /* loan sized once for the auto chunk; a larger layout fails (the old bug) */
} strata_lend_policy;

typedef enum strata_miss_policy {
    STRATA_MISS_AUTO = 0,  /* CUDA: each step's misses split between host and copy from measured rates;
                              the CPU backend: host */
    STRATA_MISS_HOST = 1,  /* a decode miss runs on the host from host RAM */
    STRATA_MISS_COPY = 2,  /* a decode miss is copied into a victim slot and runs there */
    STRATA_MISS_READ = 3,  /* CUDA: the device reads a decode miss from the pinned expert store over the bus,
                              so a decode step never waits for the host (on the CPU backend: host) */
} strata_miss_policy;

typedef enum strata_cache_policy {
    STRATA_CACHE_ADAPTIVE = 0,  /* decayed routing counts, periodic swaps */
    STRATA_CACHE_LRU = 1,       /* least recently used, for comparison */
} strata_cache_policy;

typedef enum strata_simd {
    STRATA_SIMD_AUTO = 0,    /* best the CPU supports */
    STRATA_SIMD_SCALAR = 1,  /* portable C */
    STRATA_SIMD_AVX2 = 2,    /* AVX2 + FMA + F16C */
    STRATA_SIMD_AVX512 = 3,  /* AVX-512 F/BW/VL (+VNNI where present) */
} strata_simd;

typedef enum strata_split {
    STRATA_SPLIT_NONE = 0,   /* one device holds every layer */
    STRATA_SPLIT_LAYER = 1,  /* the layers are cut into n_devices runs of consecutive layers, one per device */
} strata_split;

/* Most devices a split may use. */
#define STRATA_MAX_DEVICES 8

/* ---- callbacks --------------------------------------------------------------------------------- */

/* Trace sink: one line of text, no trailing newline. Default (fn == NULL): stderr when STRATA_TRACE=1. */
typedef void (*strata_trace_fn)(void *user, const char *line);

/* Prompt progress: n_done of n_total prompt tokens processed. Return nonzero to cancel. Called after each
 * chunk and also between the layers of a chunk with n_done unchanged, so that a cancel is seen within a
 * layer's time even where a chunk takes seconds. */
typedef int32_t (*strata_progress_fn)(void *user, int32_t n_done, int32_t n_total);

/* Called after each generated token with the logits it was sampled from. Return nonzero to stop. */
typedef int32_t (*strata_token_fn)(void *user, int32_t token, const float *logits, int32_t n_vocab);

/* ---- engine parameters ------------------------------------------------------------------------- */

typedef struct strata_params {
    int32_t n_threads;         /* CPU threads; 0 = all cores */
    int32_t device;            /* strata_device */
    int64_t vram_budget;       /* bytes of device memory to plan for; 0 = CUDA: free memory, CPU: enough for all experts */
    int32_t vram_reserve_mib;  /* MiB of the budget kept free for others */
    int32_t max_context;       /* tokens of KV cache; 0 = min(model's training context, 4096) */
    int32_t kv_type;           /* strata_kv_type */
    int32_t expert_cache;      /* slots in the expert cache; -1 = auto (all that fits) */
    int32_t prefill_chunk;     /* prompt chunk in tokens; 0 = auto */
    int32_t prefill_max;       /* with prefill_chunk == 0: the largest chunk the scan considers; 0 = default */
    int32_t lend_policy;       /* strata_lend_policy */
    int32_t lend_floor;        /* slots never lent; -1 = default (128, or a quarter of a small cache) */
    float lend_pct;            /* most of the cache that may be lent, 0..1; <= 0 = default */
    int32_t miss_policy;       /* strata_miss_policy */
    int32_t cache_policy;      /* strata_cache_policy */
    int32_t adapt_every;       /* decode tokens between adaptive swaps */
    int32_t adapt_swaps;       /* most experts swapped in at each adaptation */
    float adapt_decay;         /* decay of routing counts per adaptation, 0..1 */
    const char *expert_profile; /* ranked (layer, expert) list to fill the cache at open; NULL = none */
    int64_t host_ram_budget;   /* bytes of host RAM the plan may pin or borrow; 0 = available RAM minus headroom */
    int32_t simd;              /* strata_simd: which CPU kernels to use */
    strata_trace_fn trace;     /* trace sink; NULL = default */
    void *trace_user;          /* passed to trace */
    int32_t n_seq;             /* sequences, each with its own KV cache, decoded together by strata_decode_batch;
                                  0 = 1 (CPU backend only above 1) */
    /* A layer split (--split layer): each device holds its layers' resident weights and KV cache, its own
     * expert cache and its own loan, planned within its own budget; the activations cross to the next
     * device once per forward pass; the host store of experts is shared. On the CPU backend the devices
     * are emulated budgets of the one host, numbered 0..n_devices-1. */
    int32_t split;             /* strata_split */
    int32_t n_devices;         /* with split LAYER: devices the layers are cut over, 1..STRATA_MAX_DEVICES */
    int32_t devices[STRATA_MAX_DEVICES]; /* device of each run of layers, in layer order (CUDA ordinals); may repeat */
    float tensor_split[STRATA_MAX_DEVICES]; /* share of the layers of each device; all 0 = as even as possible */
    int64_t vram_budgets[STRATA_MAX_DEVICES]; /* budget of each device; 0 = vram_budget's rule for that device */
} strata_params;

/* ---- descriptions returned by the engine ------------------------------------------------------- */

typedef struct strata_model_info {
    char arch[32];            /* general.architecture, e.g. "qwen3moe" */
    char name[128];           /* general.name, or "" */
    int32_t n_vocab;          /* tokens in the vocabulary */
    int32_t n_ctx_train;      /* context length the model was trained for */
    int32_t n_embd;           /* D: model dimension */
    int32_t n_layer;          /* transformer blocks */
    int32_t n_head;           /* query heads */
    int32_t n_head_kv;        /* key/value heads */
    int32_t head_dim;         /* dimension of one head */
    int32_t n_expert;         /* E: routed experts per layer */
    int32_t n_expert_used;    /* K: experts used per token */
    int32_t n_ff_exp;         /* F: hidden dimension of one expert */
    float rope_theta;         /* RoPE base */
    float rms_eps;            /* RMSNorm epsilon */
    int32_t bos_id;           /* -1 when absent */
    int32_t eos_id;           /* -1 when absent */
    int64_t n_params;         /* parameters in the file */
    int64_t file_bytes;       /* size of the file */
    int64_t resident_bytes;   /* bytes of every weight that is not a routed expert */
    int64_t expert_bytes;     /* bytes of the largest expert (gate + up + down of one layer) */
    int32_t expert_type;      /* strata_type of ffn_gate_exps in the first layer */
    int32_t tied_embeddings;  /* 1 when output.weight is absent and token_embd is reused */
} strata_model_info;

/* The memory plan, fixed at open. All sizes in bytes. */
typedef struct strata_plan {
    int32_t device;            /* strata_device actually used */
    int64_t budget_bytes;      /* device memory planned for */
    int64_t resident_bytes;    /* weights that are not routed experts */
    int64_t kv_bytes;          /* KV cache for max_context */
    int64_t scratch_bytes;     /* decode scratch */
    int64_t reserve_bytes;     /* vram_reserve_mib */
    int64_t slot_bytes;        /* one slot: the largest expert blob, rounded up to 256 bytes */
    int32_t n_slots;           /* slots in the expert cache */
    int32_t n_experts_total;   /* n_layer * n_expert */
    int32_t max_context;       /* tokens */
    int32_t kv_type;           /* strata_kv_type */
    int32_t auto_chunk;        /* the chunk chosen by the scan (or the fixed chunk after halving) */
    int32_t auto_ring_slots;   /* ring depth of auto_chunk */
    int32_t auto_loan_slots;   /* slots auto_chunk borrows (its layout) */
    int32_t small_chunk;       /* chunks at or below this get the deeper ring */
    int32_t lend_floor;        /* slots never lent */
    int32_t max_lend_slots;    /* the most slots a loan may take (lend_pct and floor applied) */
    int32_t lend_policy;       /* strata_lend_policy */
    int32_t miss_policy;       /* strata_miss_policy actually used: AUTO only on CUDA (each decode step splits its misses) */
    int32_t cache_policy;      /* strata_cache_policy */
    int64_t host_expert_bytes; /* host RAM holding the experts (pinned or mapped) */
    int64_t host_borrow_bytes; /* host RAM the prompt path borrows for auto_chunk */
    int64_t host_avail_bytes;  /* host RAM the plan was allowed to use */
    int32_t n_threads;         /* CPU threads in use */
    int32_t simd;              /* strata_simd in use (never AUTO) */
    int32_t n_seq;             /* sequences; kv_bytes and the decode scratch hold them all */
} strata_plan;

/* The layout of one prompt chunk of n_tokens: what layout(T) computes. */
typedef struct strata_layout {
    int32_t n_tokens;          /* T */
    int64_t buffer_bytes;      /* activations, router, grouped expert in/out, attention scratch */
    int32_t ring_slots;        /* staging slots for streamed experts */
    int32_t slots_needed;      /* slots the chunk borrows: ceil(buffer_bytes / slot_bytes) + ring_slots */
    int64_t host_bytes;        /* host RAM the chunk borrows */
} strata_layout;

typedef struct strata_loan_prediction {
    int32_t n_tokens;
    int32_t chunk;        /* the chunk the request asks for: n rounded up to the plan's granularity, at most the auto chunk */
    int32_t chunk_used;   /* the chunk it runs at, after any halving (current policy) */
    int32_t slots_needed; /* layout(chunk).slots_needed */
    int32_t loan_slots;   /* what the cache lends for it */
    int32_t halvings;     /* times the chunk is halved */
    int32_t verdict;      /* 0 served at its chunk, 1 served at a halved chunk, 2 lending fails (legacy) */
} strata_loan_prediction;

/* One device of an engine (a layer split has several; every engine has one): its layers, its plan and
 * its cache's counters. */
typedef struct strata_device_info {
    int32_t device;            /* its index (a CUDA ordinal, or an emulated device on the CPU backend) */
    int32_t layer_begin;       /* first layer it holds */
    int32_t layer_end;         /* one past its last layer */
    strata_plan plan;          /* its memory plan, made within its own budget */
    int32_t slots_lent_now;    /* slots of its cache on loan at this moment */
    int32_t last_loan_slots;   /* slots it lent for the last prompt */
    uint64_t lookups;          /* expert lookups in its cache */
    uint64_t hits;             /* lookups served from one of its slots */
    uint64_t misses;           /* lookups not in its cache */
    uint64_t swaps;            /* experts its decode policy brought in */
    int64_t device_bytes;      /* memory it holds now (its part of strata_stats.device_bytes) */
    int64_t device_peak_bytes; /* the most it has held since open */
} strata_device_info;

/* Counters since open or the last strata_stats_reset. */
typedef struct strata_stats {
    uint64_t lookups;          /* expert lookups in the cache (decode and prefill) */
    uint64_t hits;             /* lookups served from a slot */
    uint64_t misses;           /* lookups not in the cache */
    uint64_t swaps;            /* experts brought into the cache by the decode policy */
    uint64_t bytes_streamed;   /* expert bytes moved through the prefill ring */
    uint64_t bytes_copied;     /* expert bytes copied into slots (misses with copy, swaps, refill) */
    uint64_t host_expert_runs; /* expert evaluations done on the host from host RAM */
    int32_t slots_lent_now;    /* slots on loan to the prompt path at this moment */
    int32_t last_loan_slots;   /* slots lent for the last prompt */
    int32_t last_chunk;        /* chunk used for the last prompt */
    int32_t halvings;          /* times a request's chunk was halved to fit a loan */
    int32_t refills;           /* loans given back */
    int32_t n_past;            /* tokens in the KV cache */
    int64_t prompt_tokens;     /* prompt tokens processed */
    int64_t decode_tokens;     /* tokens decoded */
    double prompt_ms;          /* time in prefill */
    double decode_ms;          /* time in decode */
    int32_t state;             /* 0 idle, 1 reading the prompt, 2 generating */
    int32_t prompt_done;       /* while reading: tokens done of prompt_total */
    int32_t prompt_total;      /* while reading: tokens in the prompt */
    int64_t device_bytes;      /* device memory the engine holds now: its CUDA allocations, or on the CPU
                                  the bytes handed out of the emulated budget */
    int64_t device_peak_bytes; /* the most device_bytes has been since open */
    uint64_t bus_reads;        /* decode misses the device read from the pinned host store (--miss read) */
} strata_stats;

typedef struct strata_sampling {
    float temperature;   /* 0 = greedy */
    int32_t top_k;       /* 0 = off */
    float top_p;         /* 1 = off */
    float min_p;         /* 0 = off */
    uint64_t seed;       /* RNG seed */
} strata_sampling;

typedef struct strata_generate_params {
    strata_sampling sampling;     /* how to pick tokens */
    int32_t max_tokens;           /* most tokens to generate */
    const int32_t *stop_tokens;   /* extra token ids that end generation (not emitted) */
    int32_t n_stop_tokens;        /* length of stop_tokens */
    int32_t stop_at_eos;          /* 1 = the model's EOS ends generation */
    strata_progress_fn on_prompt; /* prompt progress; may be NULL */
} strata_generate_params;

typedef struct strata_engine strata_engine;
typedef struct strata_sampler strata_sampler;

/* ---- library ----------------------------------------------------------------------------------- */

STRATA_API const char *strata_version(void);                 /* strata/_version.py's __version__ */
STRATA_API const char *strata_status_str(strata_status s);   /* short name of a status */
STRATA_API const char *strata_cpu_features(void);            /* e.g. "avx2 fma f16c avx512f avx512vnni" */
STRATA_API int32_t strata_cuda_available(void);              /* 1 when built with CUDA and a device is present */
STRATA_API strata_params strata_default_params(void);        /* defaults documented on each field */
STRATA_API strata_sampling strata_default_sampling(void);    /* greedy */
STRATA_API strata_generate_params strata_default_generate_params(void); /* greedy, 128 tokens, EOS stops */

/* ---- engine ------------------------------------------------------------------------------------ */

/* Open a GGUF model and make the memory plan. On failure *out is NULL and err holds the reason.
 * Returns FORMAT, UNSUPPORTED, IO, BUDGET, OUT_OF_MEMORY, DEVICE or INVALID_ARGUMENT on failure. */
STRATA_API strata_status strata_engine_open(const char *path, const strata_params *params,
                                            strata_engine **out, char *err, size_t err_len);
/* Free everything; NULL is fine. */
STRATA_API void strata_engine_close(strata_engine *eng);
/* Read a model file's metadata and tensors (no engine, no plan) and write into buf the family and the
 * blocks its forward pass composes ("Qwen2-MoE: attention GQA 4/2, rope neox; moe softmax top-3 of 8,
 * shared expert with sigmoid gate"), or on failure why strata cannot run it. Returns as strata_engine_open. */
STRATA_API strata_status strata_model_describe(const char *path, char *buf, size_t len);
/* The message of the last failed call on this engine ("" when none). Valid until the next call. */
STRATA_API const char *strata_last_error(const strata_engine *eng);
STRATA_API strata_status strata_model_info_get(const strata_engine *eng, strata_model_info *out);
/* The plan; on a split engine the devices' plans together: their sizes and slots summed, the auto chunk the
 * one all of them run (strata_device_info_get gives each device's own plan). */
STRATA_API strata_status strata_plan_get(const strata_engine *eng, strata_plan *out);
/* layout(T) for n_tokens, exactly as the scan, the loan and requests compute it. */
STRATA_API strata_status strata_chunk_layout(const strata_engine *eng, int32_t n_tokens, strata_layout *out);
/* What the prompt path does with a fresh prompt of n_tokens, by the rule strata_prefill follows (the same
 * function decides both): the chunk it asks for, the chunk it runs at after any halving, the loan and
 * whether lending fails (legacy only). */
STRATA_API strata_status strata_predict_loan(const strata_engine *eng, int32_t n_tokens, strata_loan_prediction *out);
/* Devices the engine's layers are split over (1 without a split; 0 for NULL). */
STRATA_API int32_t strata_device_count(const strata_engine *eng);
/* Device i (0 <= i < strata_device_count) in layer order. INVALID_ARGUMENT for another i. */
STRATA_API strata_status strata_device_info_get(const strata_engine *eng, int32_t i, strata_device_info *out);
/* strata_predict_loan for device i alone: on a split engine every device runs the chunk that all of them can
 * lend for (chunk_used is the same on each), each lends from its own cache; strata_predict_loan gives that
 * common chunk, the devices' loans and needs summed, every halving and the worst verdict. */
STRATA_API strata_status strata_predict_loan_device(const strata_engine *eng, int32_t i, int32_t n_tokens,
                                                    strata_loan_prediction *out);

/* Append n tokens to the context and compute the logits of the last one. CONTEXT when they do not
 * fit (nothing is appended), CANCELLED when progress returns nonzero (the context is rolled back),
 * LEND under the legacy lend policy when a chunk's layout does not fit the loan. */
STRATA_API strata_status strata_prefill(strata_engine *eng, const int32_t *tokens, int32_t n_tokens,
                                        strata_progress_fn progress, void *user);
/* Append one token and compute its logits. */
STRATA_API strata_status strata_decode(strata_engine *eng, int32_t token);
/* Logits of the last processed token: [n_vocab]; NULL before the first token. Valid until the next call. */
STRATA_API const float *strata_logits(const strata_engine *eng);
/* Tokens in the context. */
STRATA_API int32_t strata_n_past(const strata_engine *eng);
/* Keep the first n_keep tokens of the context. */
STRATA_API strata_status strata_kv_truncate(strata_engine *eng, int32_t n_keep);
/* Empty the context. */
STRATA_API void strata_kv_reset(strata_engine *eng);

/* ---- several sequences (strata_params.n_seq) --------------------------------------------------- */

/* strata_prefill for sequence seq (0 .. n_seq - 1). */
STRATA_API strata_status strata_seq_prefill(strata_engine *eng, int32_t seq, const int32_t *tokens, int32_t n_tokens,
                                            strata_progress_fn progress, void *user);
/* Append tokens[i] to sequence seqs[i] for i < n, in one forward pass, and compute each one's logits. The
 * sequences are distinct and each has processed a token. INVALID_ARGUMENT or CONTEXT (naming the sequence)
 * before anything is appended; on any other failure no sequence has its logits. */
STRATA_API strata_status strata_decode_batch(strata_engine *eng, int32_t n, const int32_t *seqs,
                                             const int32_t *tokens);
/* Logits of sequence seq's last token [n_vocab], or NULL. Valid until the next call that runs the engine. */
STRATA_API const float *strata_seq_logits(const strata_engine *eng, int32_t seq);
/* Tokens in sequence seq's context (0 for a sequence out of range). */
STRATA_API int32_t strata_seq_n_past(const strata_engine *eng, int32_t seq);
/* Keep the first n_keep tokens of sequence seq (0 empties it). */
STRATA_API strata_status strata_seq_kv_truncate(strata_engine *eng, int32_t seq, int32_t n_keep);

/* Prefill prompt (appended to the context), then sample up to max_tokens. Generated tokens are
 * written to out (up to out_cap) and counted in *n_out; on_token sees each one. Generation also ends,
 * with STRATA_OK, when the context is full (strata_n_past equals the plan's max_context). */
STRATA_API strata_status strata_generate(strata_engine *eng, const int32_t *prompt, int32_t n_prompt,
                                         const strata_generate_params *gp, strata_token_fn on_token,
                                         void *user, int32_t *out, int32_t out_cap, int32_t *n_out);

/* ---- sampling ---------------------------------------------------------------------------------- */

STRATA_API strata_status strata_sampler_init(const strata_sampling *s, strata_sampler **out);
STRATA_API void strata_sampler_free(strata_sampler *smp);
/* Pick a token from logits[n_vocab] (the array is not modified). Returns -1 on bad arguments. */
STRATA_API int32_t strata_sampler_sample(strata_sampler *smp, const float *logits, int32_t n_vocab);

/* ---- observability ----------------------------------------------------------------------------- */

/* Counters; safe to call from another thread while the engine runs (values may be a moment old). */
STRATA_API strata_status strata_stats_get(const strata_engine *eng, strata_stats *out);
STRATA_API void strata_stats_reset(strata_engine *eng);
/* Residency table: slot_of[layer * n_expert + expert] = slot or -1 (on a split: the slot in the cache of the
 * device that holds the layer). cap = n_layer * n_expert. */
STRATA_API strata_status strata_cache_residency(const strata_engine *eng, int32_t *slot_of, int32_t cap);
/* Write the ranked (layer, expert) profile the cache learned, one "layer expert score" line each. */
STRATA_API strata_status strata_profile_save(strata_engine *eng, const char *path);

#ifdef __cplusplus
}
#endif

#endif /* STRATA_H */
