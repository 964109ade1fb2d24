/*
 * model.c — hyperparameters and tensor binding for qwen3moe (see model.h).
 *
 * Every tensor's type and shape is checked against the hyperparameters here, once, so that the
 * forward pass can index weights without further checks.
 */
#include "model.h"

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

static strata_status read_hparams(const gguf_file *f, hparams *hp, errbuf *err) {
    memset(hp, 0, sizeof *hp);
    const gguf_kv *a = gguf_find_kv(f, "general.architecture");
    if (!a || !gguf_kv_get_str(a, hp->arch, sizeof hp->arch))
        return err_set(err, STRATA_ERR_FORMAT,
                       "the model has no general.architecture string; is this a model file made by a GGUF "
                       "converter?");
    if (strcmp(hp->arch, "qwen3moe") != 0)
        return err_set(err, STRATA_ERR_UNSUPPORTED,
                       "architecture '%s' is not supported; strata runs qwen3moe models", hp->arch);
    gguf_kv_get_str(gguf_find_kv(f, "general.name"), hp->name, sizeof hp->name);

    char key[128];
#define KEY(suffix) (snprintf(key, sizeof key, "%s." suffix, hp->arch), key)
    const int32_t BIG = 1 << 24;
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
    STRATA_TRY(get_i32(f, KEY("expert_feed_forward_length"), &hp->n_ff_exp, 1, 1, BIG, err));
    hp->rope_theta = 10000.0f;
    STRATA_TRY(get_f32(f, KEY("rope.freq_base"), &hp->rope_theta, err));
    hp->rms_eps = 1e-6f;
    STRATA_TRY(get_f32(f, KEY("attention.layer_norm_rms_epsilon"), &hp->rms_eps, err));
#undef KEY
    hp->bos_id = -1;
    hp->eos_id = -1;
    STRATA_TRY(get_i32(f, "tokenizer.ggml.bos_token_id", &hp->bos_id, 0, 0, INT32_MAX, err));
    STRATA_TRY(get_i32(f, "tokenizer.ggml.eos_token_id", &hp->eos_id, 0, 0, INT32_MAX, err));

    if (hp->head_dim < 2)
        return err_set(err, STRATA_ERR_FORMAT,
                       "head dimension is %d (embedding_length %d / head_count %d and no attention.key_length)",
                       hp->head_dim, hp->n_embd, hp->n_head);
    if (vlen != hp->head_dim)
        return err_set(err, STRATA_ERR_UNSUPPORTED,
                       "attention key length %d differs from value length %d; strata needs them equal",
                       hp->head_dim, vlen);
    if (hp->head_dim % 2 != 0)
        return err_set(err, STRATA_ERR_FORMAT, "head dimension %d is odd; RoPE needs an even one", hp->head_dim);
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

static strata_status bind_norm(binder *b, const char *name, int64_t n, const float **out) {
    const gguf_tensor *t;
    STRATA_TRY(find(b, name, n, 0, 0, 0, &t));
    if (t->type != STRATA_TYPE_F32)
        return err_set(b->err, STRATA_ERR_UNSUPPORTED, "norm weight '%s' is %s; strata reads norms as F32", name,
                       quant_type_name((int32_t)t->type));
    if (((uintptr_t)t->data & 3) != 0)
        return err_set(b->err, STRATA_ERR_FORMAT, "tensor '%s' is not 4-byte aligned in the file", name);
    *out = (const float *)t->data;
    b->w->resident_bytes += (int64_t)t->bytes;
    return STRATA_OK;
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

strata_status model_load(const gguf_file *f, const quant_traits *quant_tab, hparams *hp, model_weights *w, errbuf *err) {
    memset(w, 0, sizeof *w);
    STRATA_TRY(read_hparams(f, hp, err));
    binder b = {f, quant_tab, w, err};
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
        STRATA_TRY(bind_matrix(&b, NAME("attn_q"), D, QD, 0, 0, &L->wq));
        STRATA_TRY(bind_matrix(&b, NAME("attn_k"), D, KD, 0, 0, &L->wk));
        STRATA_TRY(bind_matrix(&b, NAME("attn_v"), D, KD, 0, 0, &L->wv));
        STRATA_TRY(bind_matrix(&b, NAME("attn_output"), QD, D, 0, 0, &L->wo));
        STRATA_TRY(bind_norm(&b, NAME("attn_q_norm"), HD, &L->q_norm));
        STRATA_TRY(bind_norm(&b, NAME("attn_k_norm"), HD, &L->k_norm));
        STRATA_TRY(bind_norm(&b, NAME("ffn_norm"), D, &L->ffn_norm));
        STRATA_TRY(bind_matrix(&b, NAME("ffn_gate_inp"), D, E, 0, 0, &L->router));
        STRATA_TRY(bind_matrix(&b, NAME("ffn_gate_exps"), D, F, E, 0, &L->gate_exps));
        STRATA_TRY(bind_matrix(&b, NAME("ffn_up_exps"), D, F, E, 0, &L->up_exps));
        STRATA_TRY(bind_matrix(&b, NAME("ffn_down_exps"), F, D, E, 0, &L->down_exps));
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
