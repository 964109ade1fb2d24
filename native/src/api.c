/*
 * api.c — every function of strata.h that is not in version.c or sample.c, and the CPU kernels of
 * strata_kernels.h: argument checks, the engine's error path, and thin calls into the engine.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine_internal.h"
#include "matmul.h"
#include "quant.h"
#include "strata.h"
#include "strata_kernels.h"

/* ---- library ----------------------------------------------------------------------------------- */

const char *strata_cpu_features(void) { return quant_cpu_features(); }


strata_generate_params strata_default_generate_params(void) {
    strata_generate_params g;
    memset(&g, 0, sizeof g);
    g.sampling = strata_default_sampling();
    g.max_tokens = 128;
    g.stop_at_eos = 1;
    return g;
}

/* ---- engine ------------------------------------------------------------------------------------ */

strata_status strata_engine_open(const char *path, const strata_params *params, strata_engine **out, char *err,
                                 size_t err_len) {
    errbuf eb;
    err_clear(&eb);
    strata_status s;
    if (!out) {
        s = err_set(&eb, STRATA_ERR_INVALID_ARGUMENT, "strata_engine_open: out is NULL");
    } else {
        s = engine_open(path, params, out, &eb);
    }
    if (err && err_len > 0) snprintf(err, err_len, "%s", s == STRATA_OK ? "" : eb.msg);
    return s;
}

void strata_engine_close(strata_engine *eng) { engine_close(eng); }

strata_status strata_model_describe(const char *path, char *buf, size_t len) {
    errbuf eb;
    err_clear(&eb);
    gguf_file f;
    memset(&f, 0, sizeof f);
    f.fd = -1;
    hparams hp;
    model_weights w;
    memset(&w, 0, sizeof w);
    strata_status s = path ? gguf_open(path, &f, &eb) : err_set(&eb, STRATA_ERR_INVALID_ARGUMENT, "path is NULL");
    if (s == STRATA_OK) {
        s = model_load(&f, quant_table(STRATA_SIMD_AUTO), &hp, &w, &eb);
        if (s != STRATA_OK) err_prefix(&eb, "%s: ", path);
        model_free(&w);
        gguf_close(&f);
    }
    if (buf && len > 0) {
        if (s == STRATA_OK)
            arch_describe(&hp, buf, len);
        else
            snprintf(buf, len, "%s", eb.msg);
    }
    return s;
}

const char *strata_last_error(const strata_engine *eng) { return eng ? eng->err.msg : "no engine (NULL)"; }

strata_status strata_model_info_get(const strata_engine *e, strata_model_info *out) {
    if (!e || !out) return STRATA_ERR_INVALID_ARGUMENT;
    memset(out, 0, sizeof *out);
    const hparams *hp = &e->hp;
    snprintf(out->arch, sizeof out->arch, "%s", hp->arch);
    snprintf(out->name, sizeof out->name, "%s", hp->name);
    out->n_vocab = hp->n_vocab;
    out->n_ctx_train = hp->n_ctx_train;
    out->n_embd = hp->n_embd;
    out->n_layer = hp->n_layer;
    out->n_head = hp->n_head;
    out->n_head_kv = hp->n_head_kv;
    out->head_dim = hp->head_dim;
    out->n_expert = hp->n_expert;
    out->n_expert_used = hp->n_expert_used;
    out->n_ff_exp = hp->n_ff_exp;
    out->rope_theta = hp->rope_theta;
    out->rms_eps = hp->rms_eps;
    out->bos_id = hp->bos_id;
    out->eos_id = hp->eos_id;
    out->n_params = e->w.n_params;
    out->file_bytes = (int64_t)e->file.total_size; /* every part of a split model */
    out->resident_bytes = e->w.resident_bytes;
    out->expert_bytes = e->w.expert_bytes;
    out->expert_type = e->w.layers[0].gate_exps.type;
    out->tied_embeddings = e->w.tied;
    return STRATA_OK;
}

strata_status strata_plan_get(const strata_engine *e, strata_plan *out) {
    if (!e || !out) return STRATA_ERR_INVALID_ARGUMENT;
    *out = e->plan;
    return STRATA_OK;
}

strata_status strata_chunk_layout(const strata_engine *e, int32_t n_tokens, strata_layout *out) {
    if (!e || !out) return STRATA_ERR_INVALID_ARGUMENT;
    return plan_layout(&e->devs[0].mp, n_tokens, out, (errbuf *)&e->err); /* the same buffers on every device */
}

strata_status strata_predict_loan(const strata_engine *e, int32_t n_tokens, strata_loan_prediction *out) {
    if (!e || !out || n_tokens < 1) return STRATA_ERR_INVALID_ARGUMENT;
    const strata_status s = mem_split_loan_rule(e, NULL, mem_request_chunk(e, n_tokens), out, NULL, (errbuf *)&e->err);
    out->n_tokens = n_tokens;
    return s;
}

int32_t strata_device_count(const strata_engine *e) { return e ? e->n_dev : 0; }

strata_status strata_device_info_get(const strata_engine *e, int32_t i, strata_device_info *out) {
    if (!e || !out || i < 0 || i >= e->n_dev) return STRATA_ERR_INVALID_ARGUMENT;
    const mem_device *md = &e->devs[i];
    memset(out, 0, sizeof *out);
    out->device = md->index;
    out->layer_begin = md->layer_begin;
    out->layer_end = md->layer_end;
    out->plan = md->plan;
    out->slots_lent_now = cache_lent(&md->cache);
    out->last_loan_slots = md->last_loan_slots;
    out->lookups = md->cache.lookups;
    out->hits = md->cache.hits;
    out->misses = md->cache.misses;
    out->swaps = md->cache.swaps;
    mem_device_held(e, i, &out->device_bytes, &out->device_peak_bytes);
    return STRATA_OK;
}

strata_status strata_predict_loan_device(const strata_engine *e, int32_t i, int32_t n_tokens,
                                         strata_loan_prediction *out) {
    if (!e || !out || n_tokens < 1 || i < 0 || i >= e->n_dev) return STRATA_ERR_INVALID_ARGUMENT;
    strata_loan_prediction all, per[STRATA_MAX_DEVICES];
    const strata_status s = mem_split_loan_rule(e, NULL, mem_request_chunk(e, n_tokens), &all, per, (errbuf *)&e->err);
    *out = per[i];
    out->n_tokens = n_tokens;
    return s;
}

strata_status strata_prefill(strata_engine *e, const int32_t *tokens, int32_t n_tokens, strata_progress_fn progress,
                             void *user) {
    return strata_seq_prefill(e, 0, tokens, n_tokens, progress, user);
}

strata_status strata_decode(strata_engine *e, int32_t token) {
    if (!e) return STRATA_ERR_INVALID_ARGUMENT;
    engine_seq_select(e, 0);
    return engine_decode(e, token);
}

const float *strata_logits(const strata_engine *e) { return strata_seq_logits(e, 0); }

int32_t strata_n_past(const strata_engine *e) { return strata_seq_n_past(e, 0); }

strata_status strata_kv_truncate(strata_engine *e, int32_t n_keep) { return strata_seq_kv_truncate(e, 0, n_keep); }

void strata_kv_reset(strata_engine *e) {
    if (!e) return;
    engine_seq_select(e, 0);
    e->n_past = 0;
    e->has_logits = 0;
    e->stats.n_past = 0;
}

/* ---- several sequences ------------------------------------------------------------------------- */

static strata_status check_seq(strata_engine *e, int32_t seq, const char *what) {
    if (seq < 0 || seq >= e->n_seq)
        return err_set(&e->err, STRATA_ERR_INVALID_ARGUMENT, "%s: sequence %d is not in 0..%d (the engine holds %d)",
                       what, seq, e->n_seq - 1, e->n_seq);
    return STRATA_OK;
}

strata_status strata_seq_prefill(strata_engine *e, int32_t seq, const int32_t *tokens, int32_t n_tokens,
                                 strata_progress_fn progress, void *user) {
    if (!e) return STRATA_ERR_INVALID_ARGUMENT;
    STRATA_TRY(check_seq(e, seq, "prefill"));
    engine_seq_select(e, seq);
    return engine_prefill(e, tokens, n_tokens, progress, user);
}

strata_status strata_decode_batch(strata_engine *e, int32_t n, const int32_t *seqs, const int32_t *tokens) {
    if (!e) return STRATA_ERR_INVALID_ARGUMENT;
    return engine_decode_batch(e, n, seqs, tokens);
}

const float *strata_seq_logits(const strata_engine *e, int32_t seq) {
    if (!e || seq < 0 || seq >= e->n_seq) return NULL;
    if (seq == e->cur_seq) return e->has_logits ? e->logits : NULL; /* the current one's fields are the live ones */
    return e->seqs[seq].has_logits ? e->seqs[seq].logits : NULL;
}

int32_t strata_seq_n_past(const strata_engine *e, int32_t seq) {
    if (!e || seq < 0 || seq >= e->n_seq) return 0;
    return seq == e->cur_seq ? e->n_past : e->seqs[seq].n_past;
}

strata_status strata_seq_kv_truncate(strata_engine *e, int32_t seq, int32_t n_keep) {
    if (!e) return STRATA_ERR_INVALID_ARGUMENT;
    STRATA_TRY(check_seq(e, seq, "kv_truncate"));
    engine_seq_select(e, seq);
    if (n_keep < 0 || n_keep > e->n_past)
        return err_set(&e->err, STRATA_ERR_INVALID_ARGUMENT,
                       "kv_truncate: cannot keep %d tokens of a context holding %d", n_keep, e->n_past);
    if (n_keep < e->n_past) e->has_logits = 0; /* the logits belonged to a token now dropped */
    e->n_past = n_keep;
    e->stats.n_past = n_keep;
    return STRATA_OK;
}

strata_status strata_generate(strata_engine *e, const int32_t *prompt, int32_t n_prompt,
                              const strata_generate_params *gp, strata_token_fn on_token, void *user, int32_t *out,
                              int32_t out_cap, int32_t *n_out) {
    if (!e) return STRATA_ERR_INVALID_ARGUMENT;
    if (n_out) *n_out = 0;
    strata_generate_params g = gp ? *gp : strata_default_generate_params();
    if (g.max_tokens < 0)
        return err_set(&e->err, STRATA_ERR_INVALID_ARGUMENT, "generate: max_tokens %d is negative", g.max_tokens);
    if (g.n_stop_tokens < 0 || (g.n_stop_tokens > 0 && !g.stop_tokens))
        return err_set(&e->err, STRATA_ERR_INVALID_ARGUMENT, "generate: stop_tokens is NULL or its count negative");
    if (out_cap < 0 || (out_cap > 0 && !out))
        return err_set(&e->err, STRATA_ERR_INVALID_ARGUMENT, "generate: out is NULL or out_cap negative");
    strata_sampler *smp = NULL;
    if (strata_sampler_init(&g.sampling, &smp) != STRATA_OK)
        return err_set(&e->err, STRATA_ERR_INVALID_ARGUMENT,
                       "generate: sampling settings out of range (temperature >= 0, 0 < top_p <= 1, 0 <= min_p <= 1, "
                       "top_k >= 0)");
    strata_status s = STRATA_OK;
    engine_seq_select(e, 0);
    if (n_prompt > 0) {
        s = engine_prefill(e, prompt, n_prompt, g.on_prompt, user);
    } else if (!e->has_logits) {
        s = err_set(&e->err, STRATA_ERR_STATE, "generate: no prompt given and no token processed yet");
    }
    e->stats.state = 2;
    int32_t produced = 0;
    while (s == STRATA_OK && produced < g.max_tokens) {
        int32_t tok = strata_sampler_sample(smp, e->logits, e->hp.n_vocab);
        int stop = g.stop_at_eos && tok == e->hp.eos_id;
        for (int32_t i = 0; i < g.n_stop_tokens && !stop; i++) stop = tok == g.stop_tokens[i];
        if (stop) break;
        if (produced < out_cap) out[produced] = tok;
        produced++;
        if (n_out) *n_out = produced;
        if (on_token && on_token(user, tok, e->logits, e->hp.n_vocab) != 0) break;
        if (produced >= g.max_tokens) break;
        if (e->n_past >= e->n_ctx) break; /* the context is full: the last token cannot be appended */
        s = engine_decode(e, tok);
    }
    e->stats.state = 0;
    strata_sampler_free(smp);
    return s;
}

/* ---- observability ----------------------------------------------------------------------------- */

strata_status strata_stats_get(const strata_engine *e, strata_stats *out) {
    if (!e || !out) return STRATA_ERR_INVALID_ARGUMENT;
    *out = e->stats;
    out->n_past = e->n_past;
    mem_held(e, &out->device_bytes, &out->device_peak_bytes);
    return STRATA_OK;
}

void strata_stats_reset(strata_engine *e) {
    if (!e) return;
    int32_t state = e->stats.state;
    memset(&e->stats, 0, sizeof e->stats);
    mem_reset_stats(e);
    e->stats.state = state;
    e->stats.n_past = e->n_past;
}

strata_status strata_cache_residency(const strata_engine *e, int32_t *slot_of, int32_t cap) {
    if (!e || !slot_of) return STRATA_ERR_INVALID_ARGUMENT;
    int64_t n = (int64_t)e->hp.n_layer * e->hp.n_expert;
    if (cap < n) return STRATA_ERR_INVALID_ARGUMENT;
    /* each layer's slot in the cache of the device holding it (a split); the caches count MoE layers only:
     * dense leading layers have no experts to hold */
    for (int64_t i = 0; i < n; i++) slot_of[i] = -1;
    for (int32_t d = 0; d < e->n_dev; d++) {
        const expert_cache *c = &e->devs[d].cache;
        if (!c->slot_of) continue;
        const int64_t first = (int64_t)c->layer0 * e->hp.n_expert;
        const int64_t k = (int64_t)c->n_layer * e->hp.n_expert;
        for (int64_t i = 0; i < k; i++) slot_of[first + i] = c->slot_of[i];
    }
    return STRATA_OK;
}

strata_status strata_profile_save(strata_engine *e, const char *path) {
    if (!e || !path) return STRATA_ERR_INVALID_ARGUMENT;
    if (!e->devs[0].cache.slot_of)
        return err_set(&e->err, STRATA_ERR_STATE, "this engine has no expert cache (--expert-cache 0): no profile to save");
    const expert_cache *cs[STRATA_MAX_DEVICES];
    for (int32_t d = 0; d < e->n_dev; d++) cs[d] = &e->devs[d].cache;
    return cache_profile_save_all(cs, e->n_dev, path, &e->err);
}

/* ---- kernels ----------------------------------------------------------------------------------- */

int64_t strata_type_row_bytes(int32_t type, int64_t n) { return quant_row_bytes(type, n); }

const char *strata_type_name(int32_t type) { return quant_type_name(type); }

strata_status strata_dequantize(int32_t type, const void *src, float *dst, int64_t n) {
    const quant_traits *q = quant_get(type);
    if (!q || !src || !dst || n < 0 || n % q->block != 0) return STRATA_ERR_INVALID_ARGUMENT;
    q->dequant(src, dst, n);
    return STRATA_OK;
}

static strata_status kernel_product(int32_t type, const void *w, int64_t rows, int64_t cols, const float *x,
                                    int64_t n, float *y, int32_t n_threads) {
    const quant_traits *table = quant_current_table();
    const quant_traits *q = quant_lookup(table, type);
    if (!q || !w || !x || !y || rows < 1 || cols < 1 || n < 1 || n > INT32_MAX || cols % q->block != 0)
        return STRATA_ERR_INVALID_ARGUMENT;
    size_t stride = (size_t)quant_row_bytes(q->act_type, cols);
    uint8_t *act = malloc(stride * (size_t)n);
    if (!act) return STRATA_ERR_OUT_OF_MEMORY;
    mm_quantize(table, type, x, cols, (int32_t)n, cols, act, stride);
    pool *p = NULL;
    errbuf eb;
    if (pool_create(n_threads > 0 ? n_threads : 1, &p, &eb) != STRATA_OK) {
        free(act);
        return STRATA_ERR_OUT_OF_MEMORY;
    }
    wview wv = {w, type, rows, cols, (size_t)quant_row_bytes(type, cols)};
    mm_seg seg = {q, wv, act, stride, NULL, (int32_t)n, y, rows, NULL};
    mm_run(p, &seg, 1);
    pool_destroy(p);
    free(act);
    return STRATA_OK;
}

strata_status strata_matvec(int32_t type, const void *w, int64_t rows, int64_t cols, const float *x, float *y,
                            int32_t n_threads) {
    return kernel_product(type, w, rows, cols, x, 1, y, n_threads);
}

strata_status strata_matmul(int32_t type, const void *w, int64_t rows, int64_t cols, const float *x, int64_t n,
                            float *y, int32_t n_threads) {
    return kernel_product(type, w, rows, cols, x, n, y, n_threads);
}

int32_t strata_simd_set(int32_t simd) { return quant_select(simd); }
