/* cuda_api.c — public entry points to the CUDA kernels for tests and benchmarks. */
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cuda_backend.h"
#include "group_dequant.h"
#include "strata.h"

static int shape_ok(int32_t type, int64_t rows, int64_t cols) {
    const int blk = (type == STRATA_TYPE_Q4_K || type == STRATA_TYPE_Q6_K) ? 256 : 32;
    return rows > 0 && cols > 0 && cols % blk == 0 && gq_row_bytes(type, cols) > 0;
}

/* Upload W and X, run, download Y. */
strata_status strata_cuda_matvec(int32_t type, const void *w, int64_t rows, int64_t cols, const float *x, int64_t n,
                                 float *y) {
    if (!w || !x || !y || n <= 0 || !shape_ok(type, rows, cols)) return STRATA_ERR_INVALID_ARGUMENT;
    char err[512];
    cuda_ctx *ctx = NULL;
    strata_status s = cuda_ctx_create(0, &ctx, err, sizeof err);
    if (s != STRATA_OK) return s;
    const size_t wb = (size_t)(gq_row_bytes(type, cols) * rows), xb = (size_t)(n * cols * 4), yb = (size_t)(n * rows * 4);
    const int64_t qrb = cuda_act_row_bytes(type, cols);
    const int quant = cuda_act_type(type) != STRATA_TYPE_F32;
    void *dw = NULL, *dx = NULL, *dy = NULL, *dq = NULL;
    if ((s = cuda_alloc(ctx, wb, &dw, "weights")) || (s = cuda_alloc(ctx, xb, &dx, "x")) ||
        (s = cuda_alloc(ctx, yb, &dy, "y")) || (s = cuda_alloc(ctx, (size_t)(qrb * n), &dq, "quantized x")))
        goto done;
    if ((s = cuda_h2d(ctx, dw, w, wb, CUDA_STREAM_COMPUTE)) || (s = cuda_h2d(ctx, dx, x, xb, CUDA_STREAM_COMPUTE)))
        goto done;
    if (quant && (s = cuda_quantize_act(ctx, type, (const float *)dx, cols, dq, qrb, cols, (int32_t)n))) goto done;
    if ((s = cuda_matvec(ctx, type, dw, rows, cols, quant ? dq : dx, quant ? qrb : cols, dy, rows, (int32_t)n, 0)) ||
        (s = cuda_d2h(ctx, y, dy, yb, CUDA_STREAM_COMPUTE)) || (s = cuda_sync(ctx)))
        goto done;
done:
    cuda_free(ctx, dw);
    cuda_free(ctx, dx);
    cuda_free(ctx, dy);
    cuda_free(ctx, dq);
    cuda_ctx_destroy(ctx);
    return s;
}

strata_status strata_cuda_mirror_matvec(int32_t type, const void *w, int64_t rows, int64_t cols, const float *x,
                                        float *y) {
    if (!w || !x || !y || !shape_ok(type, rows, cols)) return STRATA_ERR_INVALID_ARGUMENT;
    cuda_mirror_matvec(type, w, rows, cols, x, y);
    return STRATA_OK;
}

static double now_us(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e6 + ts.tv_nsec / 1e3;
}

static int cmp_double(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

strata_status strata_cuda_bench_matvec(int32_t type, const void *w, int64_t rows, int64_t cols, int64_t n, int32_t reps,
                                       double *median_us) {
    if (!w || n <= 0 || reps <= 0 || !median_us || !shape_ok(type, rows, cols)) return STRATA_ERR_INVALID_ARGUMENT;
    char err[512];
    cuda_ctx *ctx = NULL;
    strata_status s = cuda_ctx_create(0, &ctx, err, sizeof err);
    if (s != STRATA_OK) return s;
    const size_t wb = (size_t)(gq_row_bytes(type, cols) * rows), xb = (size_t)(n * cols * 4), yb = (size_t)(n * rows * 4);
    void *dw = NULL, *dx = NULL, *dy = NULL, *dq = NULL;
    double *t = (double *)calloc((size_t)reps, sizeof *t);
    float *hx = (float *)malloc(xb);
    if (!t || !hx) {
        s = STRATA_ERR_OUT_OF_MEMORY;
        goto done;
    }
    for (size_t i = 0; i < xb / 4; i++) hx[i] = (float)((i * 2654435761u) % 1000) / 500.0f - 1.0f;
    const int64_t qrb = cuda_act_row_bytes(type, cols);
    const int quant = cuda_act_type(type) != STRATA_TYPE_F32;
    if ((s = cuda_alloc(ctx, wb, &dw, "weights")) || (s = cuda_alloc(ctx, xb, &dx, "x")) ||
        (s = cuda_alloc(ctx, yb, &dy, "y")) || (s = cuda_alloc(ctx, (size_t)(qrb * n), &dq, "quantized x")))
        goto done;
    if ((s = cuda_h2d(ctx, dw, w, wb, CUDA_STREAM_COMPUTE)) || (s = cuda_h2d(ctx, dx, hx, xb, CUDA_STREAM_COMPUTE)) ||
        (s = cuda_sync(ctx)))
        goto done;
    if (quant && (s = cuda_quantize_act(ctx, type, (const float *)dx, cols, dq, qrb, cols, (int32_t)n))) goto done;
    for (int i = -3; i < reps; i++) { /* three warm-up runs */
        const double t0 = now_us();
        if ((s = cuda_matvec(ctx, type, dw, rows, cols, quant ? dq : dx, quant ? qrb : cols, dy, rows, (int32_t)n, 0)) ||
            (s = cuda_sync(ctx)))
            goto done;
        if (i >= 0) t[i] = now_us() - t0;
    }
    qsort(t, (size_t)reps, sizeof *t, cmp_double);
    *median_us = t[reps / 2];
done:
    free(t);
    free(hx);
    cuda_free(ctx, dq);
    cuda_free(ctx, dw);
    cuda_free(ctx, dx);
    cuda_free(ctx, dy);
    cuda_ctx_destroy(ctx);
    return s;
}

int32_t strata_cuda_available(void) { return cuda_device_present(); }

strata_status strata_cuda_router_topk(const float *logits, int32_t T, int32_t E, int32_t K, int32_t *ids,
                                      float *weights, int32_t with_segments) {
    if (!logits || !ids || !weights || T <= 0 || E <= 0 || K <= 0 || K > E) return STRATA_ERR_INVALID_ARGUMENT;
    char err[512];
    cuda_ctx *ctx = NULL;
    strata_status s = cuda_ctx_create(0, &ctx, err, sizeof err);
    if (s != STRATA_OK) return s;
    const int64_t n = (int64_t)T * K;
    void *dl = NULL, *di = NULL, *dw = NULL, *dtab = NULL, *dsw = NULL, *dst = NULL, *dso = NULL;
    void **tab = NULL;
    if ((s = cuda_alloc(ctx, (size_t)T * E * 4, &dl, "logits")) || (s = cuda_alloc(ctx, (size_t)n * 4, &di, "ids")) ||
        (s = cuda_alloc(ctx, (size_t)n * 4, &dw, "weights")))
        goto done;
    if ((s = cuda_h2d(ctx, dl, logits, (size_t)T * E * 4, CUDA_STREAM_COMPUTE))) goto done;
    if (with_segments) {
        /* a table of made-up addresses: only the ids and weights come back */
        tab = (void **)calloc((size_t)E * 3, sizeof *tab);
        if (!tab) {
            s = STRATA_ERR_OUT_OF_MEMORY;
            goto done;
        }
        if ((s = cuda_alloc(ctx, (size_t)E * 3 * sizeof(void *), &dtab, "table")) ||
            (s = cuda_alloc(ctx, (size_t)n * 3 * sizeof(void *), &dsw, "segments")) ||
            (s = cuda_alloc(ctx, (size_t)n * 2 * 4, &dst, "segment tokens")) ||
            (s = cuda_alloc(ctx, (size_t)n * 2 * 4, &dso, "segment rows")) ||
            (s = cuda_h2d(ctx, dtab, tab, (size_t)E * 3 * sizeof(void *), CUDA_STREAM_COMPUTE)) ||
            (s = cuda_router_topk_segments(ctx, (const float *)dl, T, E, K, (int32_t *)di, (float *)dw,
                                           (const void *const *)dtab, (const void **)dsw, (int32_t)n, (int32_t *)dst,
                                           (int32_t *)dso, n)))
            goto done;
    } else if ((s = cuda_router_topk(ctx, (const float *)dl, T, E, K, (int32_t *)di, (float *)dw))) {
        goto done;
    }
    if ((s = cuda_d2h(ctx, ids, di, (size_t)n * 4, CUDA_STREAM_COMPUTE)) ||
        (s = cuda_d2h(ctx, weights, dw, (size_t)n * 4, CUDA_STREAM_COMPUTE)) || (s = cuda_sync(ctx)))
        goto done;
done:
    if (ctx) cuda_sync(ctx);
    void *p[] = {dl, di, dw, dtab, dsw, dst, dso};
    for (size_t i = 0; i < sizeof p / sizeof p[0]; i++) cuda_free(ctx, p[i]);
    free(tab);
    cuda_ctx_destroy(ctx);
    return s;
}

strata_status strata_cuda_attention(int32_t kv_type, const float *q, const float *k, const float *v, int32_t n_pos,
                                    int32_t T, int32_t H, int32_t Hkv, int32_t hd, int32_t pos_on_device, float *out) {
    if (!q || !k || !v || !out || n_pos <= 0 || T <= 0 || T > n_pos || H <= 0 || Hkv <= 0 || hd <= 0 ||
        (kv_type != STRATA_KV_F16 && kv_type != STRATA_KV_INT8))
        return STRATA_ERR_INVALID_ARGUMENT;
    char err[512];
    cuda_ctx *ctx = NULL;
    strata_status s = cuda_ctx_create(0, &ctx, err, sizeof err);
    if (s != STRATA_OK) return s;
    const int64_t kd = (int64_t)Hkv * hd, qd = (int64_t)H * hd;
    const int64_t row = kv_type == STRATA_KV_F16 ? kd * 2 : kd + kd / 8;
    const int32_t pos0 = n_pos - T;
    void *dq = NULL, *dk = NULL, *dv = NULL, *kc = NULL, *vc = NULL, *dout = NULL, *dpos = NULL;
    if ((s = cuda_alloc(ctx, (size_t)(T * qd * 4), &dq, "q")) || (s = cuda_alloc(ctx, (size_t)(n_pos * kd * 4), &dk, "k")) ||
        (s = cuda_alloc(ctx, (size_t)(n_pos * kd * 4), &dv, "v")) ||
        (s = cuda_alloc(ctx, (size_t)(n_pos * row), &kc, "k cache")) ||
        (s = cuda_alloc(ctx, (size_t)(n_pos * row), &vc, "v cache")) ||
        (s = cuda_alloc(ctx, (size_t)(T * qd * 4), &dout, "out")) || (s = cuda_alloc(ctx, 4, &dpos, "position")))
        goto done;
    if ((s = cuda_h2d(ctx, dq, q, (size_t)(T * qd * 4), CUDA_STREAM_COMPUTE)) ||
        (s = cuda_h2d(ctx, dk, k, (size_t)(n_pos * kd * 4), CUDA_STREAM_COMPUTE)) ||
        (s = cuda_h2d(ctx, dv, v, (size_t)(n_pos * kd * 4), CUDA_STREAM_COMPUTE)) ||
        (s = cuda_h2d(ctx, dpos, &pos0, 4, CUDA_STREAM_COMPUTE)) ||
        (s = cuda_kv_store(ctx, kv_type, (const float *)dk, (const float *)dv, kc, vc, n_pos, (int32_t)kd, 0, NULL)))
        goto done;
    /* with the position on the device, the argument is garbage: the kernel must not read it */
    if ((s = cuda_attention(ctx, kv_type, (const float *)dq, kc, vc, (float *)dout, T, H, Hkv, hd,
                            pos_on_device ? -77777 : pos0, pos_on_device ? (const int32_t *)dpos : NULL)) ||
        (s = cuda_d2h(ctx, out, dout, (size_t)(T * qd * 4), CUDA_STREAM_COMPUTE)) || (s = cuda_sync(ctx)))
        goto done;
done:
    if (ctx) cuda_sync(ctx);
    void *p[] = {dq, dk, dv, kc, vc, dout, dpos};
    for (size_t i = 0; i < sizeof p / sizeof p[0]; i++) cuda_free(ctx, p[i]);
    cuda_ctx_destroy(ctx);
    return s;
}
