/*
 * engine.c — opening and closing an engine, and the decode step (one generated token).
 *
 * Layers, each calling only down: api.c → engine.c (decode) / prefill.c (prompts) → memory.c (the plan,
 * the expert cache, the loan) → forward.c (the forward pass, the CPU backend) → attention.c, moe.c (the
 * blocks) → the backend's kernels (cpu/, cuda/ through cuda_backend_ops).
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common.h"
#include "engine_internal.h"

#define DEFAULT_MAX_CONTEXT 4096

strata_status engine_decode(strata_engine *e, int32_t token) {
    if (token < 0 || token >= e->hp.n_vocab)
        return err_set(&e->err, STRATA_ERR_INVALID_ARGUMENT, "token %d is not in the vocabulary (0..%d)", token,
                       e->hp.n_vocab - 1);
    if (e->n_past + 1 > e->n_ctx)
        return err_set(&e->err, STRATA_ERR_CONTEXT,
                       "the context is full (%d tokens); raise --max-context or start a new conversation", e->n_ctx);
    double t0 = engine_now_ms();
    strata_status s = engine_forward(e, &token, 1, MOE_PHASE_DECODE, 1);
    if (s == STRATA_OK) {
        e->n_past++;
        e->stats.decode_tokens++;
        s = mem_token_done(e); /* the adaptation, and its copies */
    } else {
        e->has_logits = 0;
    }
    e->stats.decode_ms += engine_now_ms() - t0;
    e->stats.n_past = e->n_past;
    mem_sync_stats(e);
    return s;
}

/* ---- several sequences -------------------------------------------------------------------------- */

void engine_seq_save(strata_engine *e) {
    seq_state *c = &e->seqs[e->cur_seq];
    c->kv = e->kv;
    c->n_past = e->n_past;
    c->has_logits = e->has_logits;
    c->logits = e->logits;
}

void engine_seq_load(strata_engine *e) {
    const seq_state *c = &e->seqs[e->cur_seq];
    e->kv = c->kv;
    e->n_past = c->n_past;
    e->has_logits = c->has_logits;
    e->logits = c->logits;
    e->stats.n_past = e->n_past;
}

void engine_seq_select(strata_engine *e, int32_t s) {
    if (s == e->cur_seq) return;
    engine_seq_save(e);
    e->cur_seq = s;
    engine_seq_load(e);
}

strata_status engine_decode_batch(strata_engine *e, int32_t n, const int32_t *seqs, const int32_t *tokens) {
    if (n < 1 || n > e->n_seq || !seqs || !tokens)
        return err_set(&e->err, STRATA_ERR_INVALID_ARGUMENT, "decode_batch: %d tokens for an engine of %d sequences", n,
                       e->n_seq);
    engine_seq_save(e);
    uint64_t seen = 0; /* n_seq <= 64 */
    for (int32_t i = 0; i < n; i++) {
        const int32_t q = seqs[i];
        if (q < 0 || q >= e->n_seq)
            return err_set(&e->err, STRATA_ERR_INVALID_ARGUMENT, "decode_batch: sequence %d is not in 0..%d", q,
                           e->n_seq - 1);
        if (seen >> q & 1)
            return err_set(&e->err, STRATA_ERR_INVALID_ARGUMENT, "decode_batch: sequence %d appears twice", q);
        seen |= (uint64_t)1 << q;
        if (tokens[i] < 0 || tokens[i] >= e->hp.n_vocab)
            return err_set(&e->err, STRATA_ERR_INVALID_ARGUMENT, "decode_batch: token %d is not in the vocabulary (0..%d)",
                           tokens[i], e->hp.n_vocab - 1);
        if (e->seqs[q].n_past < 1)
            return err_set(&e->err, STRATA_ERR_STATE, "decode_batch: sequence %d has no prompt yet", q);
        if (e->seqs[q].n_past + 1 > e->n_ctx)
            return err_set(&e->err, STRATA_ERR_CONTEXT,
                           "sequence %d: the context is full (%d tokens); raise --max-context or start a new "
                           "conversation",
                           q, e->n_ctx);
    }
    if (!e->be->forward_batch) { /* a backend of one sequence: n_seq is 1 (mem_open refuses more) */
        STRATA_ASSERT(&e->err, n == 1 && e->n_seq == 1);
        return engine_decode(e, tokens[0]);
    }
    double t0 = engine_now_ms();
    e->batch_seq = seqs;
    strata_status s = e->be->forward_batch(e, tokens, n);
    e->batch_seq = NULL;
    for (int32_t i = 0; i < n; i++) {
        seq_state *q = &e->seqs[seqs[i]];
        q->has_logits = s == STRATA_OK;
        if (s == STRATA_OK) q->n_past++;
    }
    if (s == STRATA_OK) {
        e->stats.decode_tokens += (uint64_t)n;
        /* one device: mem_open refuses a layer split with several sequences */
        expert_cache *c = &e->devs[0].cache;
        e->md = &e->devs[0];
        const uint64_t swaps = c->swaps;
        for (int32_t i = 0; i < n; i++) cache_token_done(c);
        if (c->swaps != swaps) s = e->be->cache_changed(e); /* the adaptation's copies */
    }
    engine_seq_load(e);
    e->stats.decode_ms += engine_now_ms() - t0;
    mem_sync_stats(e);
    return s;
}

/* The engine's defaults (strata.h documents each). */
strata_params strata_default_params(void) {
    strata_params p;
    memset(&p, 0, sizeof p);
    p.n_threads = 0;
    p.device = STRATA_DEVICE_CPU;
    p.vram_budget = 0;
    p.vram_reserve_mib = 0;
    p.max_context = 0;
    p.kv_type = STRATA_KV_F16;
    p.expert_cache = -1;
    p.prefill_chunk = 0;
    p.prefill_max = 0;
    p.lend_policy = STRATA_LEND_CURRENT;
    p.lend_floor = -1;
    p.lend_pct = 0.0f;
    p.miss_policy = STRATA_MISS_AUTO;
    p.cache_policy = STRATA_CACHE_ADAPTIVE;
    p.adapt_every = 16;
    p.adapt_swaps = 4;
    p.adapt_decay = 0.9f;
    p.expert_profile = NULL;
    p.host_ram_budget = 0;
    p.simd = STRATA_SIMD_AUTO;
    p.trace = NULL;
    p.trace_user = NULL;
    p.split = STRATA_SPLIT_NONE;
    p.n_devices = 0;
    p.n_seq = 0;
    return p;
}

/* ---- open / close ------------------------------------------------------------------------------ */

/* The split's parameters that do not depend on the model (the layer count is checked at open). */
static strata_status check_split(const strata_params *p, errbuf *err) {
    if (p->split != STRATA_SPLIT_NONE && p->split != STRATA_SPLIT_LAYER)
        return err_set(err, STRATA_ERR_INVALID_ARGUMENT, "split mode %d is not none or layer", p->split);
    if (p->split == STRATA_SPLIT_NONE) {
        if (p->n_devices > 1)
            return err_set(err, STRATA_ERR_INVALID_ARGUMENT,
                           "%d devices are given but the layers are not split: add --split layer", p->n_devices);
        for (int32_t d = 1; d < STRATA_MAX_DEVICES; d++)
            if (p->vram_budgets[d] != 0)
                return err_set(err, STRATA_ERR_INVALID_ARGUMENT,
                               "--vram-budget lists a budget for each of several devices: add --split layer");
        return STRATA_OK;
    }
    if (p->n_devices < 1 || p->n_devices > STRATA_MAX_DEVICES)
        return err_set(err, STRATA_ERR_INVALID_ARGUMENT, "--split layer needs 1 to %d devices, not %d",
                       STRATA_MAX_DEVICES, p->n_devices);
    for (int32_t d = 0; d < p->n_devices; d++) {
        if (p->devices[d] < 0)
            return err_set(err, STRATA_ERR_INVALID_ARGUMENT, "--gpus: device %d is negative", p->devices[d]);
        /* the CPU backend's devices are emulated budgets, numbered 0..n_devices-1; a CUDA ordinal is checked
         * against the cards present when the backend opens */
        if (p->device == STRATA_DEVICE_CPU && p->devices[d] >= p->n_devices)
            return err_set(err, STRATA_ERR_INVALID_ARGUMENT,
                           "--gpus: device %d does not exist; on --device cpu the devices of a split are %d emulated "
                           "budgets, numbered 0 to %d",
                           p->devices[d], p->n_devices, p->n_devices - 1);
        if (!(p->tensor_split[d] >= 0.0f) || p->tensor_split[d] > 1e6f)
            return err_set(err, STRATA_ERR_INVALID_ARGUMENT,
                           "--tensor-split: the share of device %d is %g; shares are numbers >= 0", d,
                           (double)p->tensor_split[d]);
        if (p->vram_budgets[d] < 0)
            return err_set(err, STRATA_ERR_INVALID_ARGUMENT, "--vram-budget: the budget of device %d is negative", d);
    }
    for (int32_t d = p->n_devices; d < STRATA_MAX_DEVICES; d++)
        if (p->tensor_split[d] != 0.0f || p->vram_budgets[d] != 0)
            return err_set(err, STRATA_ERR_INVALID_ARGUMENT,
                           "a share or budget is given for device %d, but the split has %d devices", d, p->n_devices);
    return STRATA_OK;
}

static strata_status check_params(const strata_params *p, errbuf *err) {
    if (p->n_threads < 0 || p->n_threads > 1024)
        return err_set(err, STRATA_ERR_INVALID_ARGUMENT, "--threads %d is out of range (0 = all cores, up to 1024)",
                       p->n_threads);
    if (p->max_context < 0)
        return err_set(err, STRATA_ERR_INVALID_ARGUMENT, "--max-context %d is negative", p->max_context);
    if (p->n_seq < 0 || p->n_seq > STRATA_MAX_SEQ)
        return err_set(err, STRATA_ERR_INVALID_ARGUMENT, "--parallel %d is out of range (1 to %d sequences)", p->n_seq,
                       STRATA_MAX_SEQ);
    if (p->prefill_chunk < 0)
        return err_set(err, STRATA_ERR_INVALID_ARGUMENT, "--prefill %d is negative", p->prefill_chunk);
    STRATA_TRY(mem_check_device(p, err));
    if (p->device != STRATA_DEVICE_CPU && p->device != STRATA_DEVICE_AUTO && p->device != STRATA_DEVICE_CUDA)
        return err_set(err, STRATA_ERR_INVALID_ARGUMENT, "device %d is not cpu, cuda or auto", p->device);
    STRATA_TRY(check_split(p, err));
    if (p->kv_type != STRATA_KV_F16 && p->kv_type != STRATA_KV_INT8)
        return err_set(err, STRATA_ERR_INVALID_ARGUMENT, "KV type %d is not f16 or int8", p->kv_type);
    if (p->simd < STRATA_SIMD_AUTO || p->simd > STRATA_SIMD_AVX512)
        return err_set(err, STRATA_ERR_INVALID_ARGUMENT, "SIMD level %d is not auto, scalar, avx2 or avx512", p->simd);
    if (!quant_simd_supported(p->simd))
        return err_set(err, STRATA_ERR_INVALID_ARGUMENT,
                       "--simd %s: this CPU lacks the instructions (it has: %s); use --simd auto",
                       p->simd == STRATA_SIMD_AVX2 ? "avx2" : "avx512", quant_cpu_features());
    return STRATA_OK;
}

strata_status engine_open(const char *path, const strata_params *params, strata_engine **out, errbuf *err) {
    *out = NULL;
    strata_params p = params ? *params : strata_default_params();
    STRATA_TRY(check_params(&p, err));
    strata_engine *e = calloc(1, sizeof *e);
    if (!e) return err_set(err, STRATA_ERR_OUT_OF_MEMORY, "out of host memory opening the engine");
    e->params = p;
    e->be = &cpu_backend_ops; /* mem_open picks the device's */
    e->n_dev = 1;             /* mem_open splits the layers when asked */
    e->md = &e->devs[0];
    e->file.fd = -1;
    e->n_seq = p.n_seq > 0 ? p.n_seq : 1;
    trace_init(&e->trace, p.trace, p.trace_user);
    double t0 = engine_now_ms();
    strata_status s;

    e->qt = quant_table(p.simd);
    s = gguf_open(path, &e->file, err);
    if (s != STRATA_OK) goto fail;
    trace_emit(&e->trace, "opened %s: GGUF v%u, %llu tensors, %llu metadata keys (%.1f ms)", path, e->file.version,
               (unsigned long long)e->file.n_tensors, (unsigned long long)e->file.n_kv, engine_now_ms() - t0);
    s = model_load(&e->file, e->qt, &e->hp, &e->w, err);
    if (s != STRATA_OK) {
        err_prefix(err, "%s: ", path);
        goto fail;
    }

    {
        char blocks[320];
        arch_describe(&e->hp, blocks, sizeof blocks);
        trace_emit(&e->trace, "architecture %s, %s", e->hp.arch, blocks);
    }
    e->n_ctx = p.max_context > 0 ? p.max_context
                                 : (e->hp.n_ctx_train < DEFAULT_MAX_CONTEXT ? e->hp.n_ctx_train : DEFAULT_MAX_CONTEXT);
    int nt = p.n_threads > 0 ? p.n_threads : pool_cpu_count();
    s = pool_create(nt, &e->pool, err);
    if (s != STRATA_OK) goto fail;
    const int32_t level = p.simd == STRATA_SIMD_AUTO ? quant_cpu_best() : p.simd;
    trace_emit(&e->trace,
               "model %s: D=%d layers=%d heads=%d/%d hd=%d experts=%d used=%d F=%d vocab=%d; %d threads, %s kernels "
               "(cpu: %s)",
               e->hp.arch, e->hp.n_embd, e->hp.n_layer, e->hp.n_head, e->hp.n_head_kv, e->hp.head_dim,
               e->hp.n_expert, e->hp.n_expert_used, e->hp.n_ff_exp, e->hp.n_vocab, nt,
               level == STRATA_SIMD_AVX512 ? "avx512" : level == STRATA_SIMD_AVX2 ? "avx2" : "scalar",
               quant_cpu_features());
    /* the memory plan decides the context, the chunk, the device arena and the cache */
    s = mem_open(e, err);
    if (s != STRATA_OK) goto fail;
    e->seqs = calloc((size_t)e->n_seq, sizeof *e->seqs);
    e->logits_all = calloc((size_t)e->n_seq * (size_t)e->hp.n_vocab, sizeof(float));
    if (!e->seqs || !e->logits_all) {
        s = err_set(err, STRATA_ERR_OUT_OF_MEMORY, "out of host memory for the logits of %d sequences", e->n_seq);
        goto fail;
    }
    for (int32_t q = 0; q < e->n_seq && s == STRATA_OK; q++) {
        e->seqs[q].logits = e->logits_all + (size_t)q * (size_t)e->hp.n_vocab;
        if (!e->devs[0].gpu) /* on a GPU the KV cache lives in device memory (cuda/host_memory.c) */
            s = kv_init(&e->seqs[q].kv, p.kv_type, e->hp.n_layer, e->n_ctx, &e->hp.kv,
                        p.simd == STRATA_SIMD_AUTO ? quant_cpu_best() : p.simd, err);
    }
    if (s != STRATA_OK) goto fail;
    e->cur_seq = 0;
    engine_seq_load(e);
    if (e->n_seq > 1)
        trace_emit(&e->trace, "%d sequences, each with a KV cache of %d tokens, decoded together", e->n_seq, e->n_ctx);
    trace_emit(&e->trace, "ready in %.1f ms", engine_now_ms() - t0);
    *out = e;
    return STRATA_OK;
fail:
    engine_close(e);
    return s;
}

void engine_close(strata_engine *e) {
    if (!e) return;
    chunk_buffers_free(e);
    if (e->seqs) {
        engine_seq_save(e); /* the current sequence's cache is freed with the others */
        for (int32_t q = 0; q < e->n_seq; q++) kv_free(&e->seqs[q].kv);
        memset(&e->kv, 0, sizeof e->kv);
    } else {
        kv_free(&e->kv);
    }
    free(e->seqs);
    free(e->logits_all);
    mem_close(e);
    pool_destroy(e->pool);
    model_free(&e->w);
    gguf_close(&e->file);
    free(e);
}
