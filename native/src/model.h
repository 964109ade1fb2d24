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
    int32_t head_dim;
    int32_t n_expert;      /* E */
    int32_t n_expert_used; /* K */
    int32_t n_ff_exp;      /* F */
    float rope_theta;
    float rms_eps;
    int32_t bos_id;
    int32_t eos_id;
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
    const float *q_norm;      /* [head_dim] */
    const float *k_norm;      /* [head_dim] */
    const float *ffn_norm;    /* [D] */
    wview router;             /* [E, D] */
    /* Routed experts: expert e is rows [e * rows, (e + 1) * rows) of these, contiguous in the file.
     * Read them only through moe_expert() (moe.c). */
    wview gate_exps;          /* [E * F, D] */
    wview up_exps;            /* [E * F, D] */
    wview down_exps;          /* [E * D, F] */
    int64_t resident_bytes;   /* bytes of the layer's tensors that are not routed experts */
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
