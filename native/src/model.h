/*
 * model.h — what a model is: its hyperparameters (read from GGUF metadata) and its weights (views
 * into the mapped file, found by their tensor names). Nothing here owns memory but the layer array.
 *
 * Names and keys are those real qwen3moe files use:
 *   token_embd, output_norm, output (absent: tied to token_embd),
 *   blk.N.{attn_norm, attn_q, attn_k, attn_v, attn_output, attn_q_norm, attn_k_norm,
 *          ffn_norm, ffn_gate_inp, ffn_gate_exps, ffn_up_exps, ffn_down_exps}
 *   qwen3moe.{context_length, embedding_length, block_count, attention.head_count,
 *             attention.head_count_kv, attention.key_length, attention.value_length, rope.freq_base,
 *             attention.layer_norm_rms_epsilon, expert_count, expert_used_count,
 *             expert_feed_forward_length}, tokenizer.ggml.{bos,eos}_token_id
 */
#ifndef STRATA_MODEL_H
#define STRATA_MODEL_H

#include <stddef.h>
#include <stdint.h>

#include "arch.h"
#include "error.h"
#include "gguf.h"

typedef struct hparams {
    char arch[32];
    char name[128];
    int32_t n_vocab;
    int32_t n_ctx_train;
    int32_t n_embd;        /* D */
    int32_t n_layer;
    int32_t n_head;
    int32_t n_head_kv;
    int32_t head_dim;      /* of q and k (MLA: qk_nope + qk_rope, the decompressed heads) */
    int32_t head_dim_v;    /* of v and the attention output per head (head_dim unless MLA says) */
    int32_t n_expert;      /* E */
    int32_t n_expert_used; /* K */
    int32_t n_ff_exp;      /* F */
    float rope_theta;
    float rms_eps;
    int32_t bos_id;
    int32_t eos_id;
    /* ---- the architecture's blocks and their options (arch.h; metadata overrides the row's defaults) ---- */
    const arch_desc *ad;         /* the family's row */
    int32_t n_rot;               /* rotated dims of a head (rope.dimension_count; head_dim unless partial) */
    rope_scaling_kind rope_scaling;
    float rope_factor;           /* rope.scaling.factor (1 when not scaled) */
    int32_t rope_orig_ctx;       /* rope.scaling.original_context_length (YaRN) */
    float yarn_beta_fast, yarn_beta_slow; /* YaRN's ramp, in rotations over the original context */
    float yarn_attn_factor;      /* YaRN: magnitude of cos and sin (0.1 ln(factor) + 1 unless the file says) */
    gating_kind gating;
    int32_t norm_topk;           /* the K weights renormalized to sum 1 */
    float routed_scale;          /* expert_weights_scale: the routed sum is multiplied by it (1 when absent) */
    int32_t n_ff_shexp;          /* hidden dim of the shared expert(s) together (0: none) */
    float embd_scale;            /* granite: embeddings multiplied by it (1 when absent) */
    float residual_scale;        /* granite: each block's output multiplied by it before the residual add */
    float attn_scale;            /* softmax scale of q . k (1 / sqrt(head_dim) unless the file says) */
    float logit_scale;           /* granite: logits divided by it (1 when absent) */
    int32_t attn_bias;           /* the file has q/k/v biases (bound per layer) */
    qk_norm_kind qk_norm;        /* the row's, or per head where an optional norm is in the file */
    int32_t expert_bias;         /* routing picks by score + exp_probs_b (the correction bias) */
    int32_t n_dense_lead;        /* leading_dense_block_count: layers 0..n-1 run a dense SwiGLU, no experts */
    int32_t n_ff_dense;          /* their width (feed_forward_length) */
    /* ---- multi-head latent attention (ATTN_MLA) ---- */
    attn_kind attn;              /* the row's */
    kv_layout kv;                /* what the KV cache stores per layer and position (arch_kv_layout) */
    int32_t q_lora_rank;         /* attention.q_lora_rank: q through attn_q_a, attn_q_a_norm, attn_q_b (0: attn_q) */
    int32_t kv_lora_rank;        /* attention.kv_lora_rank: the latent the cache holds */
    int32_t n_group;             /* expert_group_count: experts in n_group groups (1: no grouping) */
    int32_t n_group_used;        /* expert_group_used_count: the groups a token's experts are picked from */
    float yarn_log_mul;          /* rope.scaling.yarn_log_multiplier: softmax scale *= (1 + it * ln(factor))^2 (0: none) */
    int32_t n_nextn;             /* nextn_predict_layers: trailing multi-token-prediction layers, not run */
    /* ---- appended: gpt-oss's blocks (any family whose file has the tensors or keys gets them) ---- */
    int32_t n_swa;         /* attention.sliding_window: a sliding layer's query sees its last n_swa
                            * positions, itself included (0: every layer attends to all) */
    int32_t yarn_truncate; /* YaRN's correction dims rounded to whole dims (floor / ceil) */
    ffn_act_kind ffn_act;  /* the experts' activation (the row's) */
    float swiglu_alpha;    /* FFN_ACT_SWIGLU_OAI: the sigmoid's slope */
    float swiglu_limit;    /* FFN_ACT_SWIGLU_OAI: where gate and up are clamped */
    int32_t attn_sinks;    /* the file has attn_sinks: a per-head logit joins each softmax's denominator */
    int32_t out_bias;      /* the file has attn_output biases */
    int32_t router_bias;   /* the file has ffn_gate_inp biases (added to the router's logits) */
    int32_t exp_ffn_bias;  /* the file has biases on the experts' gate, up and down products */
} hparams;

/* A 2-D view of (part of) a tensor: rows of cols values each, in the file's type. */
typedef struct wview {
    const uint8_t *data;   /* first row */
    int32_t type;          /* strata_type */
    int64_t rows;
    int64_t cols;
    size_t row_bytes;
} wview;

typedef struct layer_weights {
    const float *attn_norm;   /* [D] */
    wview wq;                 /* [n_head * head_dim, D] */
    wview wk;                 /* [n_head_kv * head_dim, D] */
    wview wv;                 /* [n_head_kv * head_dim, D] */
    wview wo;                 /* [D, n_head * head_dim] */
    const float *bq;          /* [QD] or NULL: attention biases, where the file has them */
    const float *bk;          /* [KD] or NULL */
    const float *bv;          /* [KD] or NULL */
    const float *q_norm;      /* [head_dim] (QK_NORM_HEAD), [QD] (QK_NORM_FULL) or NULL */
    const float *k_norm;      /* [head_dim] (QK_NORM_HEAD), [KD] (QK_NORM_FULL) or NULL */
    /* MLA (hd = head_dim = nope + rope, Lk = kv_lora_rank, Lq = q_lora_rank, R = n_rot, hv = head_dim_v) */
    wview wq_a;               /* [Lq, D] (q_lora_rank > 0; wq is then absent) */
    const float *q_a_norm;    /* [Lq] */
    wview wq_b;               /* [n_head * hd, Lq] */
    wview wkv_a;              /* [Lk + R, D]: the latent then the shared k_pe */
    const float *kv_a_norm;   /* [Lk] */
    wview wk_b;               /* [n_head * Lk, nope]: head h's rows map its q_nope into the latent space */
    wview wv_b;               /* [n_head * hv, Lk]: head h's rows map the attended latent to its values */
    const float *ffn_norm;    /* [D] */
    wview router;             /* [E, D] */
    /* Routed experts: expert e is rows [e * rows, (e + 1) * rows) of these, contiguous in the file.
     * Read them only through moe_expert() (moe.c). */
    wview gate_exps;          /* [E * F, D] */
    wview up_exps;            /* [E * F, D] */
    wview down_exps;          /* [E * D, F] */
    /* Shared expert (SHEXP_*): resident, every token passes through it. Fs = n_ff_shexp. */
    wview gate_shexp;         /* [Fs, D] */
    wview up_shexp;           /* [Fs, D] */
    wview down_shexp;         /* [D, Fs] */
    const float *shexp_gate;  /* [D] ffn_gate_inp_shexp (SHEXP_SIGMOID_GATE) */
    const float *exp_bias;    /* [E] exp_probs_b: added to the scores to pick the experts, not to their weights */
    /* Dense leading layers (l < n_dense_lead): a SwiGLU of width n_ff_dense in place of the MoE. */
    wview gate_dense;         /* [Fd, D] */
    wview up_dense;           /* [Fd, D] */
    wview down_dense;         /* [D, Fd] */
    int64_t resident_bytes;   /* bytes of the layer's tensors that are not routed experts */
    /* ---- appended: optional biases, sinks, the layer's attention window ---- */
    const float *bo;          /* [D] attn_output bias or NULL */
    const float *sinks;       /* [n_head] attn_sinks or NULL */
    const float *router_b;    /* [E] ffn_gate_inp bias or NULL */
    const float *gate_exps_b; /* [E, F] or NULL: row e is expert e's gate bias (resident, not in a slot) */
    const float *up_exps_b;   /* [E, F] or NULL */
    const float *down_exps_b; /* [E, D] or NULL */
    int32_t swa;              /* this layer attends to a sliding window of hp->n_swa positions */
} layer_weights;

typedef struct model_weights {
    wview tok_embd;           /* [n_vocab, D] */
    const float *output_norm; /* [D] */
    wview output;             /* [n_vocab, D] (token_embd when tied) */
    int32_t tied;
    layer_weights *layers;    /* [n_layer], owned */
    int64_t n_params;
    int64_t resident_bytes;   /* every tensor that is not a routed expert */
    int64_t expert_bytes;     /* largest gate + up + down of one expert */
    int64_t embd_bytes;       /* token_embd (held by the device of the first layer in a split) */
    int64_t head_bytes;       /* output_norm and the output head (token_embd when tied): the last layer's device */
} model_weights;

/* Read hyperparameters, then bind and check every tensor. UNSUPPORTED for another architecture or a
 * type without kernels (checked against table), FORMAT for missing or misshapen tensors. */
struct quant_traits;
strata_status model_load(const gguf_file *f, const struct quant_traits *quant_table, hparams *hp, model_weights *w,
                         errbuf *err);
void model_free(model_weights *w);

#endif
