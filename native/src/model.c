/*
 * model.c — hyperparameters and tensor binding for every family of the architecture table (arch.h).
 *
 * Every tensor's type and shape is checked against the hyperparameters here, once, so that the
 * forward pass can index weights without further checks.
 */
#include "model.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "quant.h"
#include "strata.h"

/* ---- metadata ---------------------------------------------------------------------------------- */

static strata_status get_i32(const gguf_file *f, const char *key, int32_t *out, int required, int32_t lo,
                             int32_t hi, errbuf *err) {
    const gguf_kv *kv = gguf_find_kv(f, key);
    if (!kv) {
        if (!required) return STRATA_OK;
        return err_set(err, STRATA_ERR_FORMAT, "the model has no metadata key '%s', which this architecture needs",
                       key);
    }
    int64_t v;
    if (!gguf_kv_get_int(kv, &v) || kv->type == GGUF_VT_BOOL)
        return err_set(err, STRATA_ERR_FORMAT, "metadata '%s' is a %s, expected an integer", key,
                       gguf_vtype_name(kv->type));
    if (v < lo || v > hi)
        return err_set(err, STRATA_ERR_FORMAT, "metadata '%s' is %lld, outside the valid range %d..%d", key,
                       (long long)v, lo, hi);
    *out = (int32_t)v;
    return STRATA_OK;
}

static strata_status get_f32(const gguf_file *f, const char *key, float *out, errbuf *err) {
    const gguf_kv *kv = gguf_find_kv(f, key);
    if (!kv) return STRATA_OK;
    double v;
    if (!gguf_kv_get_float(kv, &v))
        return err_set(err, STRATA_ERR_FORMAT, "metadata '%s' is a %s, expected a number", key,
                       gguf_vtype_name(kv->type));
    if (!(v > 0) || v > 1e30)
        return err_set(err, STRATA_ERR_FORMAT, "metadata '%s' is %g; it must be a positive number", key, v);
    *out = (float)v;
    return STRATA_OK;
}

static strata_status get_bool(const gguf_file *f, const char *key, int32_t *out, errbuf *err) {
    const gguf_kv *kv = gguf_find_kv(f, key);
    if (!kv) return STRATA_OK;
    int64_t v;
    if (!gguf_kv_get_int(kv, &v))
        return err_set(err, STRATA_ERR_FORMAT, "metadata '%s' is a %s, expected a bool", key, gguf_vtype_name(kv->type));
    *out = v != 0;
    return STRATA_OK;
}

/* The options of the family's blocks: the row's defaults (arch.c), then what the file's keys say. */
static strata_status read_blocks(const gguf_file *f, hparams *hp, errbuf *err) {
    const arch_desc *a = hp->ad;
    char key[128];
#define KEY(suffix) (snprintf(key, sizeof key, "%s." suffix, hp->arch), key)
    const int32_t BIG = 1 << 24;
    STRATA_TRY(get_i32(f, KEY("rope.dimension_count"), &hp->n_rot, 0, 2, 65536, err));

    hp->rope_scaling = ROPE_SCALING_NONE;
    hp->rope_factor = 1.0f;
    char st[32] = "";
    const gguf_kv *kt = gguf_find_kv(f, KEY("rope.scaling.type"));
    if (kt && !gguf_kv_get_str(kt, st, sizeof st))
        return err_set(err, STRATA_ERR_FORMAT, "metadata '%s' is a %s, expected a string", key, gguf_vtype_name(kt->type));
    STRATA_TRY(get_f32(f, KEY("rope.scaling.factor"), &hp->rope_factor, err));
    if (st[0] == 0 || strcmp(st, "none") == 0 || hp->rope_factor == 1.0f) {
        hp->rope_factor = 1.0f;
    } else if (strcmp(st, "linear") == 0) {
        hp->rope_scaling = ROPE_SCALING_LINEAR;
    } else if (strcmp(st, "yarn") == 0) {
        hp->rope_scaling = ROPE_SCALING_YARN;
        hp->rope_orig_ctx = 0;
        STRATA_TRY(get_i32(f, KEY("rope.scaling.original_context_length"), &hp->rope_orig_ctx, 1, 1, 1 << 30, err));
        hp->yarn_beta_fast = 32.0f;
        hp->yarn_beta_slow = 1.0f;
        STRATA_TRY(get_f32(f, KEY("rope.scaling.yarn_beta_fast"), &hp->yarn_beta_fast, err));
        STRATA_TRY(get_f32(f, KEY("rope.scaling.yarn_beta_slow"), &hp->yarn_beta_slow, err));
        hp->yarn_attn_factor = 0.1f * logf(hp->rope_factor) + 1.0f;
        if (hp->rope_factor < 1.0f) hp->yarn_attn_factor = 1.0f;
        /* deepseek2 files carry 0.1 * mscale_all_dim: the softmax scale grows by (1 + it ln(factor))^2 and
         * cos and sin keep magnitude mscale / mscale_all_dim, 1 in the published files, which give both the
         * same (the file does not carry mscale itself) */
        hp->yarn_log_mul = 0.0f;
        STRATA_TRY(get_f32(f, KEY("rope.scaling.yarn_log_multiplier"), &hp->yarn_log_mul, err));
        if (hp->yarn_log_mul > 0.0f) hp->yarn_attn_factor = 1.0f;
        float af = 0.0f;
        STRATA_TRY(get_f32(f, KEY("rope.scaling.yarn_attn_factor"), &af, err));
        if (af > 0.0f) hp->yarn_attn_factor = af;
        hp->yarn_truncate = !a->yarn_untruncated;
    } else {
        return err_set(err, STRATA_ERR_UNSUPPORTED,
                       "%s: rope scaling '%s' is not supported yet (strata reads linear and yarn)", hp->arch, st);
    }

    hp->gating = a->gating;
    int32_t gf = 0;
    STRATA_TRY(get_i32(f, KEY("expert_gating_func"), &gf, 0, 0, 16, err));
    if (gf == GATING_SOFTMAX || gf == GATING_SIGMOID)
        hp->gating = (gating_kind)gf;
    else if (gf != 0)
        return err_set(err, STRATA_ERR_UNSUPPORTED, "%s: expert gating function %d is not supported yet", hp->arch, gf);
    hp->n_group = hp->n_group_used = 1;
    STRATA_TRY(get_i32(f, KEY("expert_group_count"), &hp->n_group, 0, 1, 65536, err));
    hp->n_group_used = hp->n_group;
    STRATA_TRY(get_i32(f, KEY("expert_group_used_count"), &hp->n_group_used, 0, 1, 65536, err));
    hp->norm_topk = a->norm_topk;
    STRATA_TRY(get_bool(f, KEY("expert_weights_norm"), &hp->norm_topk, err));
    hp->routed_scale = 1.0f;
    STRATA_TRY(get_f32(f, KEY("expert_weights_scale"), &hp->routed_scale, err));

    if (a->shexp != SHEXP_NONE) {
        /* qwen2moe gives the width; glm4moe and deepseek2 give a count of expert-wide shared experts, which
         * together are one SwiGLU of count * expert width (model_load, once that width is known) */
        STRATA_TRY(get_i32(f, KEY("expert_shared_feed_forward_length"), &hp->n_ff_shexp, 0, 1, BIG, err));
        if (hp->n_ff_shexp == 0) {
            int32_t n_shared = 0;
            STRATA_TRY(get_i32(f, KEY("expert_shared_count"), &n_shared, 0, 1, 4096, err));
            hp->n_ff_shexp = -n_shared; /* resolved in model_load */
        }
    }
    STRATA_TRY(get_i32(f, KEY("leading_dense_block_count"), &hp->n_dense_lead, 0, 0, 4096, err));
    if (hp->n_dense_lead > 0) STRATA_TRY(get_i32(f, KEY("feed_forward_length"), &hp->n_ff_dense, 1, 1, BIG, err));
    int32_t nextn = 0; /* multi-token prediction layers at the end: not part of the forward */
    STRATA_TRY(get_i32(f, KEY("nextn_predict_layers"), &nextn, 0, 0, 64, err));
    hp->n_nextn = nextn;

    hp->ffn_act = a->ffn_act;
    if (hp->ffn_act == FFN_ACT_SWIGLU_OAI) { /* fixed by the family: its files carry no key for them */
        hp->swiglu_alpha = 1.702f;
        hp->swiglu_limit = 7.0f;
    }
    /* the family's sliding layers need their window: a file without it is refused, not run as full attention */
    if (a->swa_period > 0) STRATA_TRY(get_i32(f, KEY("attention.sliding_window"), &hp->n_swa, 1, 1, 1 << 30, err));

    hp->embd_scale = hp->residual_scale = hp->logit_scale = 1.0f;
    hp->attn_scale = 0.0f; /* 1 / sqrt(head_dim), once head_dim is known */
    if (a->multipliers) {
        STRATA_TRY(get_f32(f, KEY("embedding_scale"), &hp->embd_scale, err));
        STRATA_TRY(get_f32(f, KEY("residual_scale"), &hp->residual_scale, err));
        STRATA_TRY(get_f32(f, KEY("attention.scale"), &hp->attn_scale, err));
        STRATA_TRY(get_f32(f, KEY("logit_scale"), &hp->logit_scale, err));
    }
#undef KEY
    return STRATA_OK;
}

/* Multi-head latent attention. The converter writes the cache's view as the attention's key and value
 * lengths (key_length = kv_lora_rank + rope dims, value_length = kv_lora_rank, one KV head) and the
 * decompressed heads' as key_length_mla / value_length_mla; files without the _mla keys give the
 * decompressed heads as key_length / value_length. */
static strata_status read_mla(const gguf_file *f, hparams *hp, errbuf *err) {
    char key[128];
#define KEY(suffix) (snprintf(key, sizeof key, "%s." suffix, hp->arch), key)
    const int32_t BIG = 1 << 24;
    STRATA_TRY(get_i32(f, KEY("attention.kv_lora_rank"), &hp->kv_lora_rank, 1, 1, BIG, err));
    STRATA_TRY(get_i32(f, KEY("attention.q_lora_rank"), &hp->q_lora_rank, 0, 1, BIG, err));
    if (!gguf_find_kv(f, KEY("rope.dimension_count")))
        return err_set(err, STRATA_ERR_FORMAT, "the model has no metadata key '%s', which multi-head latent attention "
                       "needs", key);
    if (gguf_find_kv(f, KEY("attention.key_length_mla"))) {
        STRATA_TRY(get_i32(f, KEY("attention.key_length_mla"), &hp->head_dim, 1, 2, 65536, err));
        STRATA_TRY(get_i32(f, KEY("attention.value_length_mla"), &hp->head_dim_v, 1, 1, 65536, err));
    }
#undef KEY
    if (hp->n_rot >= hp->head_dim)
        return err_set(err, STRATA_ERR_FORMAT, "%s: rope.dimension_count %d leaves no unrotated key dims of %d", hp->arch,
                       hp->n_rot, hp->head_dim);
    hp->n_head_kv = 1; /* every head reads the one cached latent and k_pe */
    hp->kv = (kv_layout){1, hp->kv_lora_rank + hp->n_rot, hp->kv_lora_rank, 1};
    return STRATA_OK;
}

static strata_status read_hparams(const gguf_file *f, hparams *hp, errbuf *err) {
    memset(hp, 0, sizeof *hp);
    const gguf_kv *a = gguf_find_kv(f, "general.architecture");
    if (!a || !gguf_kv_get_str(a, hp->arch, sizeof hp->arch))
        return err_set(err, STRATA_ERR_FORMAT,
                       "the model has no general.architecture string; is this a model file made by a GGUF "
                       "converter?");
    hp->ad = arch_find(hp->arch);
    if (!hp->ad)
        return err_set(err, STRATA_ERR_UNSUPPORTED, "architecture '%s' is not supported; strata runs %s", hp->arch,
                       arch_supported_list());
    if (hp->ad->missing) return err_set(err, STRATA_ERR_UNSUPPORTED, "%s: %s", hp->arch, hp->ad->missing);
    gguf_kv_get_str(gguf_find_kv(f, "general.name"), hp->name, sizeof hp->name);

    char key[128];
#define KEY(suffix) (snprintf(key, sizeof key, "%s." suffix, hp->arch), key)
    const int32_t BIG = 1 << 24;
    if (!gguf_find_kv(f, KEY("expert_count")))
        return err_set(err, STRATA_ERR_UNSUPPORTED,
                       "%s: this file has no experts (no %s.expert_count); strata runs mixture-of-experts models",
                       hp->arch, hp->arch);
    STRATA_TRY(get_i32(f, KEY("embedding_length"), &hp->n_embd, 1, 1, BIG, err));
    STRATA_TRY(get_i32(f, KEY("block_count"), &hp->n_layer, 1, 1, 4096, err));
    STRATA_TRY(get_i32(f, KEY("attention.head_count"), &hp->n_head, 1, 1, 65536, err));
    hp->n_head_kv = hp->n_head;
    STRATA_TRY(get_i32(f, KEY("attention.head_count_kv"), &hp->n_head_kv, 0, 1, 65536, err));
    hp->head_dim = hp->n_embd / hp->n_head;
    STRATA_TRY(get_i32(f, KEY("attention.key_length"), &hp->head_dim, 0, 2, 65536, err));
    int32_t vlen = hp->head_dim;
    STRATA_TRY(get_i32(f, KEY("attention.value_length"), &vlen, 0, 2, 65536, err));
    hp->n_ctx_train = 4096;
    STRATA_TRY(get_i32(f, KEY("context_length"), &hp->n_ctx_train, 0, 1, 1 << 30, err));
    STRATA_TRY(get_i32(f, KEY("expert_count"), &hp->n_expert, 1, 1, 65536, err));
    STRATA_TRY(get_i32(f, KEY("expert_used_count"), &hp->n_expert_used, 1, 1, 65536, err));
    /* absent in some families' files (mixtral's experts have feed_forward_length): the tensors say it */
    STRATA_TRY(get_i32(f, KEY("expert_feed_forward_length"), &hp->n_ff_exp, 0, 1, BIG, err));
    hp->rope_theta = 10000.0f;
    STRATA_TRY(get_f32(f, KEY("rope.freq_base"), &hp->rope_theta, err));
    hp->rms_eps = 1e-6f;
    STRATA_TRY(get_f32(f, KEY("attention.layer_norm_rms_epsilon"), &hp->rms_eps, err));
    STRATA_TRY(read_blocks(f, hp, err));
    if (hp->n_nextn >= hp->n_layer)
        return err_set(err, STRATA_ERR_FORMAT, "%s.nextn_predict_layers %d leaves no layers of %d", hp->arch, hp->n_nextn,
                       hp->n_layer);
    hp->n_layer -= hp->n_nextn;
    if (hp->n_dense_lead >= hp->n_layer)
        return err_set(err, STRATA_ERR_FORMAT, "%s.leading_dense_block_count %d leaves no MoE layers of %d", hp->arch,
                       hp->n_dense_lead, hp->n_layer);
#undef KEY
    hp->bos_id = -1;
    hp->eos_id = -1;
    STRATA_TRY(get_i32(f, "tokenizer.ggml.bos_token_id", &hp->bos_id, 0, 0, INT32_MAX, err));
    STRATA_TRY(get_i32(f, "tokenizer.ggml.eos_token_id", &hp->eos_id, 0, 0, INT32_MAX, err));

    if (hp->head_dim < 2)
        return err_set(err, STRATA_ERR_FORMAT,
                       "head dimension is %d (embedding_length %d / head_count %d and no attention.key_length)",
                       hp->head_dim, hp->n_embd, hp->n_head);
    hp->attn = hp->ad->attn;
    hp->head_dim_v = vlen;
    if (hp->attn == ATTN_MLA) STRATA_TRY(read_mla(f, hp, err));
    else if (vlen != hp->head_dim)
        return err_set(err, STRATA_ERR_UNSUPPORTED,
                       "attention key length %d differs from value length %d; strata needs them equal",
                       hp->head_dim, vlen);
    else
        hp->kv = (kv_layout){hp->n_head_kv, hp->head_dim, hp->head_dim, 0};
    if (hp->n_rot == 0) hp->n_rot = hp->head_dim;
    if (hp->n_rot % 2 != 0 || hp->n_rot > hp->head_dim)
        return err_set(err, STRATA_ERR_FORMAT,
                       "rope.dimension_count %d must be even and at most the head dimension %d", hp->n_rot,
                       hp->head_dim);
    if (hp->attn_scale == 0.0f) hp->attn_scale = 1.0f / sqrtf((float)hp->head_dim);
    if (hp->rope_scaling == ROPE_SCALING_YARN && hp->yarn_log_mul > 0.0f) {
        const float m = 1.0f + hp->yarn_log_mul * logf(hp->rope_factor);
        hp->attn_scale *= m * m;
    }
    if (hp->n_group > 1 || hp->n_group_used != hp->n_group) {
        if (hp->n_group > 64)
            return err_set(err, STRATA_ERR_UNSUPPORTED, "%s: %d expert groups; strata routes at most 64", hp->arch,
                           hp->n_group);
        if (hp->n_expert % hp->n_group != 0 || hp->n_group_used > hp->n_group)
            return err_set(err, STRATA_ERR_FORMAT, "%s: %d experts in %d groups, %d of them used, is not a valid grouping",
                           hp->arch, hp->n_expert, hp->n_group, hp->n_group_used);
        if (hp->n_expert_used > hp->n_group_used * (hp->n_expert / hp->n_group))
            return err_set(err, STRATA_ERR_FORMAT, "%s: %d experts used per token do not fit in %d groups of %d",
                           hp->arch, hp->n_expert_used, hp->n_group_used, hp->n_expert / hp->n_group);
    }
    if (hp->n_head % hp->n_head_kv != 0)
        return err_set(err, STRATA_ERR_FORMAT,
                       "attention.head_count %d is not a multiple of attention.head_count_kv %d", hp->n_head,
                       hp->n_head_kv);
    if (hp->n_expert_used > hp->n_expert)
        return err_set(err, STRATA_ERR_FORMAT, "expert_used_count %d is larger than expert_count %d",
                       hp->n_expert_used, hp->n_expert);
    return STRATA_OK;
}

/* ---- tensors ----------------------------------------------------------------------------------- */

typedef struct binder {
    const gguf_file *f;
    const quant_traits *table;
    model_weights *w;
    errbuf *err;
} binder;

static int64_t n_elems(const gguf_tensor *t) {
    int64_t n = 1;
    for (int d = 0; d < GGUF_MAX_DIMS; d++) n *= t->ne[d];
    return n;
}

/* Find a tensor and check its shape (ne0, ne1, ne2; 0 = must be absent, i.e. 1). */
static strata_status find(binder *b, const char *name, int64_t ne0, int64_t ne1, int64_t ne2, int optional,
                          const gguf_tensor **out) {
    const gguf_tensor *t = gguf_find_tensor(b->f, name);
    *out = t;
    if (!t) {
        if (optional) return STRATA_OK;
        return err_set(b->err, STRATA_ERR_FORMAT, "the model has no tensor '%s'; the file is incomplete", name);
    }
    int64_t want[4] = {ne0, ne1 ? ne1 : 1, ne2 ? ne2 : 1, 1};
    for (int d = 0; d < 4; d++)
        if (t->ne[d] != want[d])
            return err_set(b->err, STRATA_ERR_FORMAT,
                           "tensor '%s' has shape [%lld, %lld, %lld, %lld]; the metadata says it should be "
                           "[%lld, %lld, %lld, %lld]",
                           name, (long long)t->ne[0], (long long)t->ne[1], (long long)t->ne[2],
                           (long long)t->ne[3], (long long)want[0], (long long)want[1], (long long)want[2],
                           (long long)want[3]);
    b->w->n_params += n_elems(t);
    return STRATA_OK;
}

/* An F32 tensor of shape [ne0] (ne1 == 0) or [ne1 rows of ne0], read in place from the mapping; what and
 * whats name it in the error ("norm weight", "norms"). */
static strata_status bind_f32(binder *b, const char *name, int64_t ne0, int64_t ne1, const char *what,
                              const char *whats, const float **out) {
    const gguf_tensor *t;
    STRATA_TRY(find(b, name, ne0, ne1, 0, 0, &t));
    if (t->type != STRATA_TYPE_F32)
        return err_set(b->err, STRATA_ERR_UNSUPPORTED, "%s '%s' is %s; strata reads %s as F32", what, name,
                       quant_type_name((int32_t)t->type), whats);
    if (((uintptr_t)t->data & 3) != 0)
        return err_set(b->err, STRATA_ERR_FORMAT, "tensor '%s' is not 4-byte aligned in the file", name);
    *out = (const float *)t->data;
    b->w->resident_bytes += (int64_t)t->bytes;
    return STRATA_OK;
}

static strata_status bind_norm(binder *b, const char *name, int64_t n, const float **out) {
    return bind_f32(b, name, n, 0, "norm weight", "norms", out);
}

/* A 1-D F32 tensor that a family may or may not have (biases). */
static strata_status bind_opt_vec(binder *b, const char *name, int64_t n, const float **out) {
    *out = NULL;
    if (!gguf_find_tensor(b->f, name)) return STRATA_OK;
    return bind_norm(b, name, n, out);
}

/* A 2-D F32 tensor [ne1 rows of ne0] that a family may or may not have (the experts' biases). */
static strata_status bind_opt_rows(binder *b, const char *name, int64_t ne0, int64_t ne1, const float **out) {
    *out = NULL;
    if (!gguf_find_tensor(b->f, name)) return STRATA_OK;
    return bind_f32(b, name, ne0, ne1, "bias", "biases", out);
}

/* A tensor of a block this family's row does not compose: running without it would be wrong. */
static strata_status refuse_tensor(binder *b, const char *name, const char *block) {
    if (!gguf_find_tensor(b->f, name)) return STRATA_OK;
    char arch[32] = "";
    gguf_kv_get_str(gguf_find_kv(b->f, "general.architecture"), arch, sizeof arch);
    return err_set(b->err, STRATA_ERR_UNSUPPORTED, "%s: the file has '%s' (%s), which strata does not run for this "
                   "architecture yet", arch, name, block);
}

static strata_status bind_matrix(binder *b, const char *name, int64_t cols, int64_t rows, int64_t n3, int optional,
                                 wview *out) {
    const gguf_tensor *t;
    STRATA_TRY(find(b, name, cols, rows, n3, optional, &t));
    if (!t) return STRATA_OK;
    if (!quant_lookup(b->table, (int32_t)t->type)) {
        const char *tn = quant_type_name((int32_t)t->type);
        return err_set(b->err, STRATA_ERR_UNSUPPORTED,
                       "tensor '%s' is %s, a weight type this build of strata cannot run yet (supported here: "
                       "F32, F16, BF16, Q8_0 and the types registered by the quant kernels)",
                       name, tn ? tn : "an unknown type");
    }
    /* Float rows are read as float/half arrays: they must sit on their element size. */
    int64_t esz = t->type == STRATA_TYPE_F32 ? 4 : (t->type == STRATA_TYPE_F16 || t->type == STRATA_TYPE_BF16) ? 2 : 1;
    if (((uintptr_t)t->data % (uintptr_t)esz) != 0)
        return err_set(b->err, STRATA_ERR_FORMAT, "tensor '%s' is not %lld-byte aligned in the file", name,
                       (long long)esz);
    out->data = t->data;
    out->type = (int32_t)t->type;
    out->cols = cols;
    out->rows = rows * (n3 ? n3 : 1);
    out->row_bytes = (size_t)quant_row_bytes(out->type, cols);
    if (!n3) b->w->resident_bytes += (int64_t)t->bytes;
    return STRATA_OK;
}

/* A per-head 3-D matrix of the attention ([n3, rows, cols]): resident, unlike the experts' 3-D tensors. */
static strata_status bind_heads(binder *b, const char *name, int64_t cols, int64_t rows, int64_t n3, wview *out) {
    STRATA_TRY(bind_matrix(b, name, cols, rows, n3, 0, out));
    b->w->resident_bytes += (int64_t)gguf_find_tensor(b->f, name)->bytes;
    return STRATA_OK;
}

/* Multi-head latent attention's tensors (hd = nope + rope, Lk = kv_lora_rank, Lq = q_lora_rank, hv = head_dim_v):
 * q direct (attn_q) or low-rank (attn_q_a, attn_q_a_norm, attn_q_b), the latent and k_pe (attn_kv_a_mqa,
 * attn_kv_a_norm), and the per-head decompressions as the converter splits them: attn_k_b [H, Lk, nope]
 * (transposed, so that it maps a head's q_nope into the latent space) and attn_v_b [H, hv, Lk]. */
static strata_status bind_mla(binder *b, const hparams *hp, int32_t l, layer_weights *L) {
    const int64_t D = hp->n_embd, H = hp->n_head, hd = hp->head_dim, R = hp->n_rot, nope = hd - R;
    const int64_t Lk = hp->kv_lora_rank, Lq = hp->q_lora_rank;
    char n[96];
#define NAME(s) (snprintf(n, sizeof n, "blk.%d." s ".weight", l), n)
    if (!gguf_find_tensor(b->f, NAME("attn_k_b")) && gguf_find_tensor(b->f, NAME("attn_kv_b")))
        return err_set(b->err, STRATA_ERR_UNSUPPORTED,
                       "%s: the file has '%s' (the keys' and values' decompression in one matrix, as older converters "
                       "wrote it); strata reads it split into attn_k_b and attn_v_b: convert the model again with a "
                       "current llama.cpp converter",
                       hp->arch, n);
    if (Lq > 0) {
        STRATA_TRY(bind_matrix(b, NAME("attn_q_a"), D, Lq, 0, 0, &L->wq_a));
        STRATA_TRY(bind_norm(b, NAME("attn_q_a_norm"), Lq, &L->q_a_norm));
        STRATA_TRY(bind_matrix(b, NAME("attn_q_b"), Lq, H * hd, 0, 0, &L->wq_b));
    } else {
        STRATA_TRY(bind_matrix(b, NAME("attn_q"), D, H * hd, 0, 0, &L->wq));
    }
    STRATA_TRY(bind_matrix(b, NAME("attn_kv_a_mqa"), D, Lk + R, 0, 0, &L->wkv_a));
    STRATA_TRY(bind_norm(b, NAME("attn_kv_a_norm"), Lk, &L->kv_a_norm));
    STRATA_TRY(bind_heads(b, NAME("attn_k_b"), nope, Lk, H, &L->wk_b));
    STRATA_TRY(bind_heads(b, NAME("attn_v_b"), Lk, hp->head_dim_v, H, &L->wv_b));
#undef NAME
    return STRATA_OK;
}

strata_status model_load(const gguf_file *f, const quant_traits *quant_tab, hparams *hp, model_weights *w, errbuf *err) {
    memset(w, 0, sizeof *w);
    STRATA_TRY(read_hparams(f, hp, err));
    binder b = {f, quant_tab, w, err};
    if (hp->n_ff_exp == 0) { /* no expert_feed_forward_length key: the experts' own shape */
        char g0n[64];
        snprintf(g0n, sizeof g0n, "blk.%d.ffn_gate_exps.weight", hp->n_dense_lead);
        const gguf_tensor *g0 = gguf_find_tensor(f, g0n);
        if (!g0)
            return err_set(err, STRATA_ERR_FORMAT,
                           "the model has no tensor 'blk.0.ffn_gate_exps.weight' (merged experts); the file is "
                           "incomplete or stores its experts one by one, which strata does not read");
        if (g0->ne[1] < 1 || g0->ne[1] > (1 << 24))
            return err_set(err, STRATA_ERR_FORMAT, "blk.0.ffn_gate_exps.weight has %lld rows per expert",
                           (long long)g0->ne[1]);
        hp->n_ff_exp = (int32_t)g0->ne[1];
    }
    if (hp->n_ff_shexp < 0) hp->n_ff_shexp *= -hp->n_ff_exp;
    hp->qk_norm = hp->ad->qk_norm;
    if (hp->qk_norm == QK_NORM_NONE && hp->ad->qk_norm_optional && gguf_find_tensor(f, "blk.0.attn_q_norm.weight"))
        hp->qk_norm = QK_NORM_HEAD;
    const int64_t D = hp->n_embd, E = hp->n_expert, F = hp->n_ff_exp, HD = hp->head_dim;
    const int64_t QD = (int64_t)hp->n_head * HD, KD = (int64_t)hp->n_head_kv * HD;

    const gguf_tensor *te = gguf_find_tensor(f, "token_embd.weight");
    if (!te) return err_set(err, STRATA_ERR_FORMAT, "the model has no tensor 'token_embd.weight'; the file is incomplete");
    if (te->ne[1] < 1 || te->ne[1] > INT32_MAX)
        return err_set(err, STRATA_ERR_FORMAT, "token_embd.weight has %lld rows", (long long)te->ne[1]);
    hp->n_vocab = (int32_t)te->ne[1];
    STRATA_TRY(bind_matrix(&b, "token_embd.weight", D, hp->n_vocab, 0, 0, &w->tok_embd));
    w->embd_bytes = w->resident_bytes;
    STRATA_TRY(bind_norm(&b, "output_norm.weight", D, &w->output_norm));
    STRATA_TRY(bind_matrix(&b, "output.weight", D, hp->n_vocab, 0, 1, &w->output));
    w->head_bytes = w->resident_bytes - w->embd_bytes;
    if (!w->output.data) {
        w->output = w->tok_embd;
        w->tied = 1;
        w->head_bytes += w->embd_bytes; /* the head reads token_embd */
    }
    if (hp->bos_id >= hp->n_vocab) hp->bos_id = -1;
    if (hp->eos_id >= hp->n_vocab) hp->eos_id = -1;

    w->layers = calloc((size_t)hp->n_layer, sizeof *w->layers);
    if (!w->layers) return err_set(err, STRATA_ERR_OUT_OF_MEMORY, "out of host memory binding the layers");
    for (int32_t l = 0; l < hp->n_layer; l++) {
        layer_weights *L = &w->layers[l];
        const int64_t before = w->resident_bytes;
        char n[96];
#define NAME(s) (snprintf(n, sizeof n, "blk.%d." s ".weight", l), n)
        STRATA_TRY(bind_norm(&b, NAME("attn_norm"), D, &L->attn_norm));
        if (hp->attn == ATTN_MLA) {
            STRATA_TRY(bind_mla(&b, hp, l, L));
        } else {
            STRATA_TRY(bind_matrix(&b, NAME("attn_q"), D, QD, 0, 0, &L->wq));
            STRATA_TRY(bind_matrix(&b, NAME("attn_k"), D, KD, 0, 0, &L->wk));
            STRATA_TRY(bind_matrix(&b, NAME("attn_v"), D, KD, 0, 0, &L->wv));
        }
        STRATA_TRY(bind_matrix(&b, NAME("attn_output"), (int64_t)hp->n_head * hp->head_dim_v, D, 0, 0, &L->wo));
        if (hp->qk_norm != QK_NORM_NONE) {
            const int full = hp->qk_norm == QK_NORM_FULL;
            STRATA_TRY(bind_norm(&b, NAME("attn_q_norm"), full ? QD : HD, &L->q_norm));
            STRATA_TRY(bind_norm(&b, NAME("attn_k_norm"), full ? KD : HD, &L->k_norm));
        }
#undef NAME
#define NAME(s) (snprintf(n, sizeof n, "blk.%d." s ".bias", l), n)
        STRATA_TRY(bind_opt_vec(&b, NAME("attn_q"), QD, &L->bq));
        STRATA_TRY(bind_opt_vec(&b, NAME("attn_k"), KD, &L->bk));
        STRATA_TRY(bind_opt_vec(&b, NAME("attn_v"), KD, &L->bv));
        if (L->bq || L->bk || L->bv) hp->attn_bias = 1;
        STRATA_TRY(bind_opt_vec(&b, NAME("attn_output"), D, &L->bo));
        if (L->bo) hp->out_bias = 1;
        STRATA_TRY(bind_opt_vec(&b, NAME("ffn_gate_inp"), E, &L->router_b));
        if (L->router_b) hp->router_bias = 1;
        STRATA_TRY(bind_opt_rows(&b, NAME("ffn_gate_exps"), F, E, &L->gate_exps_b));
        STRATA_TRY(bind_opt_rows(&b, NAME("ffn_up_exps"), F, E, &L->up_exps_b));
        STRATA_TRY(bind_opt_rows(&b, NAME("ffn_down_exps"), D, E, &L->down_exps_b));
        if (L->gate_exps_b || L->up_exps_b || L->down_exps_b) hp->exp_ffn_bias = 1;
        if (hp->gating == GATING_SIGMOID && l >= hp->n_dense_lead) {
            STRATA_TRY(bind_opt_vec(&b, NAME("exp_probs_b"), E, &L->exp_bias));
            if (L->exp_bias) hp->expert_bias = 1;
        } else {
            STRATA_TRY(refuse_tensor(&b, NAME("exp_probs_b"), "the expert correction bias"));
        }
#undef NAME
#define NAME(s) (snprintf(n, sizeof n, "blk.%d." s ".weight", l), n)
        STRATA_TRY(bind_opt_vec(&b, NAME("attn_sinks"), hp->n_head, &L->sinks));
        if (L->sinks) hp->attn_sinks = 1;
        L->swa = hp->n_swa > 0 && l % hp->ad->swa_period < hp->ad->swa_period - 1;
        if (hp->ad->ffn_norm) {
            snprintf(n, sizeof n, "blk.%d.%s.weight", l, hp->ad->ffn_norm);
            STRATA_TRY(bind_norm(&b, n, D, &L->ffn_norm));
        } else {
            STRATA_TRY(bind_norm(&b, NAME("ffn_norm"), D, &L->ffn_norm));
        }
        if (l < hp->n_dense_lead) { /* a dense leading layer: no router, no experts */
            const int64_t FD = hp->n_ff_dense;
            STRATA_TRY(bind_matrix(&b, NAME("ffn_gate"), D, FD, 0, 0, &L->gate_dense));
            STRATA_TRY(bind_matrix(&b, NAME("ffn_up"), D, FD, 0, 0, &L->up_dense));
            STRATA_TRY(bind_matrix(&b, NAME("ffn_down"), FD, D, 0, 0, &L->down_dense));
            L->resident_bytes = w->resident_bytes - before;
            continue;
        }
        STRATA_TRY(bind_matrix(&b, NAME("ffn_gate_inp"), D, E, 0, 0, &L->router));
        STRATA_TRY(bind_matrix(&b, NAME("ffn_gate_exps"), D, F, E, 0, &L->gate_exps));
        STRATA_TRY(bind_matrix(&b, NAME("ffn_up_exps"), D, F, E, 0, &L->up_exps));
        STRATA_TRY(bind_matrix(&b, NAME("ffn_down_exps"), F, D, E, 0, &L->down_exps));
        if (hp->ad->shexp != SHEXP_NONE) {
            const int64_t FS = hp->n_ff_shexp;
            STRATA_TRY(bind_matrix(&b, NAME("ffn_gate_shexp"), D, FS, 0, 0, &L->gate_shexp));
            STRATA_TRY(bind_matrix(&b, NAME("ffn_up_shexp"), D, FS, 0, 0, &L->up_shexp));
            STRATA_TRY(bind_matrix(&b, NAME("ffn_down_shexp"), FS, D, 0, 0, &L->down_shexp));
            if (hp->ad->shexp == SHEXP_SIGMOID_GATE) STRATA_TRY(bind_norm(&b, NAME("ffn_gate_inp_shexp"), D, &L->shexp_gate));
        } else {
            STRATA_TRY(refuse_tensor(&b, NAME("ffn_gate_shexp"), "shared experts"));
        }
#undef NAME
        L->resident_bytes = w->resident_bytes - before;
        if (L->gate_exps.type != L->up_exps.type)
            return err_set(err, STRATA_ERR_UNSUPPORTED,
                           "layer %d: ffn_gate_exps is %s but ffn_up_exps is %s; strata needs them of one type", l,
                           quant_type_name(L->gate_exps.type), quant_type_name(L->up_exps.type));
        int64_t eb = (int64_t)(L->gate_exps.row_bytes * F + L->up_exps.row_bytes * F + L->down_exps.row_bytes * D);
        if (eb > w->expert_bytes) w->expert_bytes = eb;
    }
    return STRATA_OK;
}

void model_free(model_weights *w) {
    free(w->layers);
    w->layers = NULL;
}
