/*
 * engine.c — opening an engine, the chunk buffers, and the forward pass over a chunk of tokens.
 *
 * Prompts are processed chunk-major, and layer-major inside a chunk: all T tokens of a chunk pass
 * layer l before any enters layer l + 1 (attention_block, then moe_block). A decode step is the same
 * pass with T = 1, so a token's logits do not depend on how the prompt was cut into chunks.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common.h"
#include "cuda_backend.h"
#include "cuda_forward.h"
#include "engine_internal.h"
#include "matmul.h"

#define DEFAULT_MAX_CONTEXT 4096

double engine_now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec * 1e-6;
}

void rmsnorm_rows(float *out, const float *x, const float *w, int32_t n, int32_t D, float eps) {
    for (int32_t i = 0; i < n; i++) {
        const float *xi = x + (int64_t)i * D;
        float *oi = out + (int64_t)i * D;
        double ss = 0.0;
        for (int32_t d = 0; d < D; d++) ss += (double)xi[d] * (double)xi[d];
        float r = (float)(1.0 / sqrt(ss / D + (double)eps));
        for (int32_t d = 0; d < D; d++) oi[d] = xi[d] * r * w[d];
    }
}

/* ---- chunk buffers ------------------------------------------------------------------------------ */

/* The largest quantized activation row any product of the model needs. */
static size_t act_stride_of(const strata_engine *e) {
    const hparams *hp = &e->hp;
    size_t m = 0;
    for (int32_t l = 0; l < hp->n_layer; l++) {
        const layer_weights *L = &e->w.layers[l];
        const wview *ws[] = {&L->wq, &L->wk, &L->wv, &L->wo, &L->router, &L->gate_exps, &L->up_exps, &L->down_exps};
        for (size_t i = 0; i < sizeof ws / sizeof ws[0]; i++) {
            size_t b = mm_act_row_bytes(e->qt, ws[i]->type, ws[i]->cols);
            m = b > m ? b : m;
        }
    }
    size_t b = mm_act_row_bytes(e->qt, e->w.output.type, e->w.output.cols);
    m = b > m ? b : m;
    return STRATA_ALIGN_UP(m, 64);
}

typedef struct buf_spec {
    void **ptr;
    size_t bytes;
    const char *name; /* for the arena's failure record */
} buf_spec;

static int fill_specs(strata_engine *e, chunk_buffers *cb, int32_t T, buf_spec *s) {
    const hparams *hp = &e->hp;
    const size_t D = (size_t)hp->n_embd, E = (size_t)hp->n_expert, K = (size_t)hp->n_expert_used;
    const size_t F = (size_t)hp->n_ff_exp, QD = (size_t)hp->n_head * (size_t)hp->head_dim;
    const size_t KD = (size_t)hp->n_head_kv * (size_t)hp->head_dim, t = (size_t)T;
    const size_t st = e->w.layers ? act_stride_of(e) : 0; /* no layers: only enumerating the buffers to free */
    int n = 0;
#define B(field, bytes) s[n++] = (buf_spec){(void **)&cb->field, (bytes), #field}
    B(x, t * D * 4);
    B(xn, t * D * 4);
    B(act, t * st);
    B(q, t * QD * 4);
    B(k, t * KD * 4);
    B(v, t * KD * 4);
    B(att, t * QD * 4);
    B(o, t * D * 4);
    B(scores, (size_t)pool_size(e->pool) * (size_t)e->n_ctx * 4);
    B(rope, (size_t)hp->head_dim * 4);
    B(router, t * E * 4);
    B(sel, t * K * 4);
    B(wsel, t * K * 4);
    B(grp_off, (E + 1) * 4);
    B(grp_tok, t * K * 4);
    B(grp_slot, t * K * 4);
    B(g, t * K * F * 4);
    B(u, t * K * F * 4);
    B(hact, t * K * st);
    B(ye, t * K * D * 4);
    B(segs, 2 * E * sizeof(mm_seg));
    B(views, E * sizeof(expert_view));
#undef B
    cb->act_stride = st;
    return n;
}

/* Lay the buffers of T tokens out in a, storing the pointers in cb (which need not be the engine's). */
static strata_status layout_into(strata_engine *e, chunk_buffers *cb, arena *a, int32_t T) {
    buf_spec s[32];
    int n = fill_specs(e, cb, T, s);
    cb->cap = 0;
    for (int i = 0; i < n; i++) {
        *s[i].ptr = arena_alloc(a, (int64_t)s[i].bytes, s[i].name);
        if (!*s[i].ptr) return STRATA_ERR_BUDGET;
    }
    cb->cap = T;
    return STRATA_OK;
}

strata_status chunk_buffers_alloc(strata_engine *e, arena *a, int32_t T) { return layout_into(e, &e->cb, a, T); }

int64_t chunk_buffers_bytes(const strata_engine *e, int32_t T) {
    /* the layout itself, run against a measuring arena into a scratch record: the live buffers are
     * untouched, so layout(T) may be asked at any time */
    chunk_buffers tmp;
    arena a;
    arena_init_measure(&a);
    strata_status s = layout_into((strata_engine *)e, &tmp, &a, T);
    return s == STRATA_OK ? a.used : -1;
}

strata_status chunk_buffers_use_scratch(strata_engine *e) {
    arena_reset(&e->scratch);
    return chunk_buffers_alloc(e, &e->scratch, 1);
}

void chunk_buffers_free(strata_engine *e) { memset(&e->cb, 0, sizeof e->cb); }

/* ---- forward ----------------------------------------------------------------------------------- */

strata_status engine_forward(strata_engine *e, const int32_t *tokens, int32_t T, moe_phase phase, int want_logits) {
    return e->be->forward(e, tokens, T, phase == MOE_PHASE_PREFILL, want_logits);
}

/* The CPU backend's forward pass (attention.c, moe.c). */
static strata_status cpu_forward(strata_engine *e, const int32_t *tokens, int32_t T, int prompt, int want_logits) {
    const hparams *hp = &e->hp;
    const int32_t D = hp->n_embd;
    const moe_phase phase = prompt ? MOE_PHASE_PREFILL : MOE_PHASE_DECODE;
    chunk_buffers *cb = &e->cb;
    STRATA_ASSERT(&e->err, T <= cb->cap); /* laid out by the prefill's loan or the decode scratch */
    STRATA_ASSERT(&e->err, e->n_past + T <= e->n_ctx);

    const quant_traits *te = quant_lookup(e->qt, e->w.tok_embd.type);
    for (int32_t t = 0; t < T; t++)
        te->dequant(e->w.tok_embd.data + (size_t)tokens[t] * e->w.tok_embd.row_bytes, cb->x + (int64_t)t * D, D);

    for (int32_t l = 0; l < hp->n_layer; l++) {
        strata_status s = attention_block(e, l, T, e->n_past);
        if (s == STRATA_OK) s = moe_block(e, l, T, phase);
        if (s != STRATA_OK) return err_prefix(&e->err, "layer %d: ", l);
    }

    if (want_logits) {
        const float *xl = cb->x + (int64_t)(T - 1) * D;
        rmsnorm_rows(cb->xn, xl, e->w.output_norm, 1, D, hp->rms_eps);
        mm_quantize(e->qt, e->w.output.type, cb->xn, D, 1, D, cb->act, cb->act_stride);
        mm_seg so = {quant_lookup(e->qt, e->w.output.type), e->w.output, cb->act, cb->act_stride, NULL, 1,
                     e->logits, hp->n_vocab, NULL};
        mm_run(e->pool, &so, 1);
        e->has_logits = 1;
    }
    return STRATA_OK;
}

/* ---- the CPU backend ---------------------------------------------------------------------------- */

static int64_t cpu_layout_bytes(const strata_engine *e, int32_t T) { return chunk_buffers_bytes(e, T); }

static strata_status cpu_layout(strata_engine *e, arena *a, int32_t T) { return chunk_buffers_alloc(e, a, T); }

/* memcpy is done when it returns: nothing to order */
static strata_status cpu_nothing(strata_engine *e) {
    (void)e;
    return STRATA_OK;
}

static void cpu_fail_msg(strata_engine *e, const arena *a, int32_t T, char *buf, size_t len) {
    (void)e;
    arena_chunk_fail_msg(a, T, buf, len);
}

const backend_ops cpu_backend_ops = {
    .name = "cpu",
    .layout_bytes = cpu_layout_bytes,
    .host_bytes = NULL,
    .layout = cpu_layout,
    .use_scratch = chunk_buffers_use_scratch,
    .copy_expert = moe_expert_copy,
    .loan_end = cpu_nothing,
    .cache_changed = cpu_nothing,
    .fail_msg = cpu_fail_msg,
    .forward = cpu_forward,
};

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
        const uint64_t swaps = e->cache.swaps;
        cache_token_done(&e->cache);
        if (e->cache.swaps != swaps) s = e->be->cache_changed(e); /* the adaptation's copies */
    } else {
        e->has_logits = 0;
    }
    e->stats.decode_ms += engine_now_ms() - t0;
    e->stats.n_past = e->n_past;
    mem_sync_stats(e);
    return s;
}

/* ---- open / close ------------------------------------------------------------------------------ */

static strata_status check_params(const strata_params *p, errbuf *err) {
    if (p->n_threads < 0 || p->n_threads > 1024)
        return err_set(err, STRATA_ERR_INVALID_ARGUMENT, "--threads %d is out of range (0 = all cores, up to 1024)",
                       p->n_threads);
    if (p->max_context < 0)
        return err_set(err, STRATA_ERR_INVALID_ARGUMENT, "--max-context %d is negative", p->max_context);
    if (p->prefill_chunk < 0)
        return err_set(err, STRATA_ERR_INVALID_ARGUMENT, "--prefill %d is negative", p->prefill_chunk);
    if (p->device == STRATA_DEVICE_CUDA && !cuda_device_present()) {
        char why[512];
        cuda_ctx *probe = NULL;
        cuda_ctx_create(0, &probe, why, sizeof why); /* says why: no CUDA in this build, or no device */
        cuda_ctx_destroy(probe);
        return err_set(err, STRATA_ERR_DEVICE, "--device cuda: %s", why);
    }
    if (p->device != STRATA_DEVICE_CPU && p->device != STRATA_DEVICE_AUTO && p->device != STRATA_DEVICE_CUDA)
        return err_set(err, STRATA_ERR_INVALID_ARGUMENT, "device %d is not cpu, cuda or auto", p->device);
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
    e->file.fd = -1;
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
    if (!e->gpu) /* on a GPU the KV cache lives in device memory (cuda_forward.c) */
        s = kv_init(&e->kv, p.kv_type, e->hp.n_layer, e->n_ctx, e->hp.n_head_kv, e->hp.head_dim,
                p.simd == STRATA_SIMD_AUTO ? quant_cpu_best() : p.simd, err);
    if (s != STRATA_OK) goto fail;
    e->logits = calloc((size_t)e->hp.n_vocab, sizeof(float));
    if (!e->logits) {
        s = err_set(err, STRATA_ERR_OUT_OF_MEMORY, "out of host memory for the logits");
        goto fail;
    }
    trace_emit(&e->trace, "ready in %.1f ms", engine_now_ms() - t0);
    *out = e;
    return STRATA_OK;
fail:
    engine_close(e);
    return s;
}

void engine_close(strata_engine *e) {
    if (!e) return;
    cuda_forward_close(e);
    chunk_buffers_free(e);
    free(e->logits);
    kv_free(&e->kv);
    mem_close(e);
    pool_destroy(e->pool);
    model_free(&e->w);
    gguf_close(&e->file);
    free(e);
}
