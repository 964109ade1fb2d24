/*
 * arch.h — an architecture as data: which blocks the forward pass composes for a GGUF
 * general.architecture, and the options those blocks read from the file's metadata.
 *
 * A family is one row of the table in arch.c. Options that real files carry as metadata keys (rope
 * scaling, the gating function, top-k normalization, routed scaling, granite's multipliers, shared
 * experts, dense leading layers, the sliding window) are read by model.c into hparams and override the
 * row's defaults; what a row fixes is what no key says (where the rotary pairs sit, which norm the q/k
 * projections get, which layers slide, whether YaRN's ramp is rounded, the experts' activation). Optional
 * tensors (biases of q/k/v/o, the router and the experts, attention sinks) are used by any family whose
 * file has them.
 */
#ifndef STRATA_ARCH_H
#define STRATA_ARCH_H

#include <stddef.h>
#include <stdint.h>

/* How the q and k projections are normalized before RoPE. */
typedef enum qk_norm_kind {
    QK_NORM_NONE = 0, /* none (qwen2moe, mixtral, granitemoe) */
    QK_NORM_HEAD = 1, /* RMSNorm of each head's head_dim values, one weight per head dim (qwen3moe) */
    QK_NORM_FULL = 2, /* RMSNorm over the whole projection, n_head * head_dim weights (olmoe) */
} qk_norm_kind;

/* Where the two values of a rotary pair sit in a head. */
typedef enum rope_kind {
    ROPE_NEOX = 0, /* i and i + n_rot / 2 (qwen, olmoe) */
    ROPE_NORM = 1, /* 2i and 2i + 1 (llama's layout: the converter permutes q and k rows into it) */
} rope_kind;

/* Frequency scaling of the rotation (<arch>.rope.scaling.type). */
typedef enum rope_scaling_kind {
    ROPE_SCALING_NONE = 0,
    ROPE_SCALING_LINEAR = 1, /* positions divided by the factor */
    ROPE_SCALING_YARN = 2,   /* YaRN: per-dimension blend of interpolation and extrapolation, and a magnitude factor */
} rope_scaling_kind;

/* The router's gating function (the values of <arch>.expert_gating_func). */
typedef enum gating_kind {
    GATING_SOFTMAX = 1,
    GATING_SIGMOID = 2,
} gating_kind;

/* The attention block and, with it, what the KV cache stores per position (kv_layout). */
typedef enum attn_kind {
    ATTN_GQA = 0, /* q, k, v projections; K and V of every KV head cached (GQA, MQA and MHA alike) */
    ATTN_MLA = 1, /* multi-head latent attention (deepseek2): q direct or low-rank, keys and values expanded
                   * per head from one normalized latent of kv_lora_rank values and a shared roped k_pe;
                   * the cache holds the latent and k_pe only */
} attn_kind;

/* What the KV cache holds per layer and position: n_head_kv rows of k_dim key values and, unless v_in_k,
 * n_head_kv rows of v_dim values. v_in_k: a head's values are the first v_dim of its key row (MLA: the
 * latent is both), so nothing more is stored. */
typedef struct kv_layout {
    int32_t n_head_kv;
    int32_t k_dim;
    int32_t v_dim;
    int32_t v_in_k;
} kv_layout;

/* Shared experts: a dense SwiGLU every token passes through beside the routed ones. */
typedef enum shexp_kind {
    SHEXP_NONE = 0,
    SHEXP_SIGMOID_GATE = 1, /* scaled by sigmoid(xn . ffn_gate_inp_shexp) (qwen2moe) */
    SHEXP_PLAIN = 2,        /* added as it is (glm4moe, deepseek2) */
} shexp_kind;

/* The activation between an expert's gate and up products. */
typedef enum ffn_act_kind {
    FFN_ACT_SILU = 0,       /* silu(gate) * up */
    FFN_ACT_SWIGLU_OAI = 1, /* gpt-oss: gate clamped above and up clamped both sides at limit, then
                             * (up + 1) * gate * sigmoid(alpha * gate) (alpha 1.702, limit 7) */
} ffn_act_kind;

typedef struct arch_desc {
    const char *arch;           /* general.architecture */
    const char *family;         /* the family as people name it */
    attn_kind attn;
    qk_norm_kind qk_norm;
    rope_kind rope;
    gating_kind gating;         /* default when the file has no expert_gating_func */
    int32_t norm_topk;          /* top-k weights renormalized to sum 1 (default when no expert_weights_norm key) */
    shexp_kind shexp;
    int32_t multipliers;        /* reads granite's embedding, attention, residual and logit scales */
    int32_t qk_norm_optional;   /* QK_NORM_NONE rows: per-head q/k norms when the file has them (glm4moe) */
    const char *ffn_norm;       /* the name of the norm before the MoE ("post_attention_norm" in glm4moe files);
                                 * NULL: "ffn_norm" */
    const char *missing;        /* not NULL: the block this family needs that strata does not have yet */
    /* ---- appended options (rows that leave them out get 0: the behaviour of the families above) ---- */
    int32_t swa_period;       /* with <arch>.attention.sliding_window: layer l attends to a window when
                               * l % swa_period < swa_period - 1 (gpt-oss: 2, the even layers); 0: no windows */
    int32_t yarn_untruncated; /* YaRN's ramp runs between the exact correction dims, not rounded to whole ones */
    ffn_act_kind ffn_act;     /* the experts' activation */
} arch_desc;

/* The row of general.architecture arch, or NULL when strata does not know it. */
const arch_desc *arch_find(const char *arch);

/* The families strata runs, comma-separated (for messages). */
const char *arch_supported_list(void);

/* One line naming the blocks a model composes (from its description and hparams), into buf. */
struct hparams;
void arch_describe(const struct hparams *hp, char *buf, size_t len);

#endif
