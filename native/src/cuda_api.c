/* cuda_api.c — strata_kernels.h's entry points to the CUDA kernels (tests and benchmarks), and
 * strata_cuda_available (strata.h). */
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cuda_backend.h"
#include "group_dequant.h"
#include "strata.h"
#include "strata_kernels.h"

static int shape_ok(int32_t type, int64_t rows, int64_t cols) { return rows > 0 && gq_shape_ok(type, cols); }

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

/* the weight types of the tensor-core prompt product (checked here too: the stub build has no kernels) */
static int mmq_type(int32_t type) { return gq_mmq_form(type) >= 0; }

strata_status strata_cuda_mirror_mmq(int32_t type, const void *w, int64_t rows, int64_t cols, const float *x,
                                     float *y) {
    if (!w || !x || !y || !mmq_type(type) || !shape_ok(type, rows, cols)) return STRATA_ERR_INVALID_ARGUMENT;
    cuda_mirror_mmq(type, w, rows, cols, x, y);
    return STRATA_OK;
}

/* Upload W and X, group the pairs by matrix into segments the way the engine does, run, download Y. */
strata_status strata_cuda_mmq(int32_t type, const void *w, int32_t n_mat, int64_t rows, int64_t cols, const float *x,
                              int64_t n_x, const int32_t *mat, int64_t n_pairs, int32_t xdiv, int32_t seg_tokens,
                              float *y) {
    if (!w || !x || !y || n_x <= 0 || n_mat <= 0 || !mmq_type(type) || !shape_ok(type, rows, cols))
        return STRATA_ERR_INVALID_ARGUMENT;
    if (mat && (n_pairs <= 0 || xdiv <= 0 || seg_tokens < 1 || seg_tokens > CUDA_MMQ_TOKENS ||
                (n_pairs - 1) / xdiv >= n_x))
        return STRATA_ERR_INVALID_ARGUMENT;
    for (int64_t p = 0; mat && p < n_pairs; p++)
        if (mat[p] >= n_mat) return STRATA_ERR_INVALID_ARGUMENT;
    const int64_t n_y = mat ? n_pairs : n_x;
    char err[512];
    cuda_ctx *ctx = NULL;
    strata_status s = cuda_ctx_create(0, &ctx, err, sizeof err);
    if (s != STRATA_OK) return s;
    const int64_t mb = gq_row_bytes(type, cols) * rows;
    const size_t wb = (size_t)(mb * n_mat), xb = (size_t)(n_x * cols * 4), yb = (size_t)(n_y * rows * 4);
    /* activations in 8-bit blocks of 32 for every type here; rows 16-byte aligned, as in the engine */
    const int64_t qrb = (cuda_act_row_bytes(STRATA_TYPE_Q8_0, cols) + 15) / 16 * 16;
    void *dw = NULL, *dx = NULL, *dy = NULL, *dq = NULL, *dt = NULL;
    int32_t *hp = NULL, *hs = NULL;
    const void **hw = NULL;
    int64_t n_seg = 0;
    if (mat) { /* segments: each matrix's pairs in order, seg_tokens at a time */
        hp = (int32_t *)malloc((size_t)n_pairs * sizeof *hp);
        hs = (int32_t *)malloc((size_t)(n_pairs + 1) * sizeof *hs);
        hw = (const void **)malloc((size_t)n_pairs * sizeof *hw);
        if (!hp || !hs || !hw) {
            s = STRATA_ERR_OUT_OF_MEMORY;
            goto done;
        }
    }
    if ((s = cuda_alloc(ctx, wb, &dw, "weights")) || (s = cuda_alloc(ctx, xb, &dx, "x")) ||
        (s = cuda_alloc(ctx, yb, &dy, "y")) || (s = cuda_alloc(ctx, (size_t)(qrb * n_x), &dq, "quantized x")))
        goto done;
    if ((s = cuda_h2d(ctx, dw, w, wb, CUDA_STREAM_COMPUTE)) || (s = cuda_h2d(ctx, dx, x, xb, CUDA_STREAM_COMPUTE)) ||
        (s = cuda_memset(ctx, dy, 0, yb)))
        goto done;
    if ((s = cuda_quantize_act(ctx, STRATA_TYPE_Q8_0, (const float *)dx, cols, dq, qrb, cols, (int32_t)n_x)))
        goto done;
    if (!mat) {
        s = cuda_mmq(ctx, type, dw, rows, cols, dq, qrb, (float *)dy, rows, (int32_t)n_x, 0);
    } else {
        int64_t np = 0;
        for (int32_t m = 0; m < n_mat; m++) {
            int32_t fill = seg_tokens;
            for (int64_t p = 0; p < n_pairs; p++) {
                if (mat[p] != m) continue;
                if (fill == seg_tokens) {
                    hs[n_seg] = (int32_t)np;
                    hw[n_seg++] = (const uint8_t *)dw + m * mb;
                    fill = 0;
                }
                hp[np++] = (int32_t)p;
                fill++;
            }
        }
        hs[n_seg] = (int32_t)np;
        const size_t tb = (size_t)(np + n_seg + 1) * 4 + (size_t)n_seg * sizeof(void *) + 16;
        if (n_seg > 0) {
            if ((s = cuda_alloc(ctx, tb, &dt, "segment tables"))) goto done;
            const void **dsw = (const void **)dt;
            int32_t *dpairs = (int32_t *)(dsw + n_seg), *dstart = dpairs + np;
            if ((s = cuda_h2d(ctx, (void *)dsw, hw, (size_t)n_seg * sizeof(void *), CUDA_STREAM_COMPUTE)) ||
                (s = cuda_h2d(ctx, dpairs, hp, (size_t)np * 4, CUDA_STREAM_COMPUTE)) ||
                (s = cuda_h2d(ctx, dstart, hs, (size_t)(n_seg + 1) * 4, CUDA_STREAM_COMPUTE)))
                goto done;
            s = cuda_mmq_segments(ctx, type, dsw, rows, cols, dq, qrb, dpairs, dstart, xdiv, (float *)dy, rows,
                                  (int32_t)n_seg);
        }
    }
    if (s != STRATA_OK) goto done;
    /* pairs without a matrix keep the caller's y: copy back only the rows that were computed */
    if ((s = cuda_sync(ctx))) goto done;
    if (!mat) {
        s = cuda_d2h(ctx, y, dy, yb, CUDA_STREAM_COMPUTE);
    } else {
        for (int64_t p = 0; p < n_pairs && s == STRATA_OK; p++)
            if (mat[p] >= 0)
                s = cuda_d2h(ctx, y + p * rows, (const float *)dy + p * rows, (size_t)rows * 4, CUDA_STREAM_COMPUTE);
    }
    if (s == STRATA_OK) s = cuda_sync(ctx);
done:
    free(hp);
    free(hs);
    free(hw);
    cuda_free(ctx, dt);
    cuda_free(ctx, dw);
    cuda_free(ctx, dx);
    cuda_free(ctx, dy);
    cuda_free(ctx, dq);
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

/* strata_cuda_attention and strata_cuda_flash_attention: store k and v into a cache, run attention for
 * the last T of n_pos positions, download the output. flash: the tensor-core prompt kernel, with room for
 * a whole tile after the chunk, all bits set (f16 NaNs), which the kernel must not read. */
static strata_status attention_entry(int flash, int32_t kv_type, const float *q, const float *k, const float *v,
                                     int32_t n_pos, int32_t T, int32_t H, int32_t Hkv, int32_t hd,
                                     int32_t pos_on_device, float *out) {
    if (!q || !k || !v || !out || n_pos <= 0 || T <= 0 || T > n_pos || H <= 0 || Hkv <= 0 || hd <= 0 ||
        (kv_type != STRATA_KV_F16 && kv_type != STRATA_KV_INT8))
        return STRATA_ERR_INVALID_ARGUMENT;
    if (flash && !cuda_device_present()) return STRATA_ERR_DEVICE;
    if (flash && !cuda_flash_attention_supported(kv_type, H, Hkv, hd)) return STRATA_ERR_UNSUPPORTED;
    char err[512];
    cuda_ctx *ctx = NULL;
    strata_status s = cuda_ctx_create(0, &ctx, err, sizeof err);
    if (s != STRATA_OK) return s;
    const int64_t kd = (int64_t)Hkv * hd, qd = (int64_t)H * hd;
    const int64_t row = kv_type == STRATA_KV_F16 ? kd * 2 : kd + kd / 8;
    const int64_t n_alloc = flash ? (int64_t)n_pos + 64 : n_pos;
    const int32_t pos0 = n_pos - T;
    void *dq = NULL, *dk = NULL, *dv = NULL, *kc = NULL, *vc = NULL, *dout = NULL, *dpos = NULL;
    if ((s = cuda_alloc(ctx, (size_t)(T * qd * 4), &dq, "q")) ||
        (s = cuda_alloc(ctx, (size_t)(n_pos * kd * 4), &dk, "k")) ||
        (s = cuda_alloc(ctx, (size_t)(n_pos * kd * 4), &dv, "v")) ||
        (s = cuda_alloc(ctx, (size_t)(n_alloc * row), &kc, "k cache")) ||
        (s = cuda_alloc(ctx, (size_t)(n_alloc * row), &vc, "v cache")) ||
        (s = cuda_alloc(ctx, (size_t)(T * qd * 4), &dout, "out")) || (s = cuda_alloc(ctx, 4, &dpos, "position")))
        goto done;
    if (flash && ((s = cuda_memset(ctx, kc, 0xff, (size_t)(n_alloc * row))) ||
                  (s = cuda_memset(ctx, vc, 0xff, (size_t)(n_alloc * row)))))
        goto done;
    if ((s = cuda_h2d(ctx, dq, q, (size_t)(T * qd * 4), CUDA_STREAM_COMPUTE)) ||
        (s = cuda_h2d(ctx, dk, k, (size_t)(n_pos * kd * 4), CUDA_STREAM_COMPUTE)) ||
        (s = cuda_h2d(ctx, dv, v, (size_t)(n_pos * kd * 4), CUDA_STREAM_COMPUTE)) ||
        (s = cuda_h2d(ctx, dpos, &pos0, 4, CUDA_STREAM_COMPUTE)) ||
        (s = cuda_kv_store(ctx, kv_type, (const float *)dk, (const float *)dv, kc, vc, n_pos, (int32_t)kd, 0, NULL)))
        goto done;
    /* with the position on the device, the argument is garbage: the kernel must not read it */
    const int32_t pos_arg = pos_on_device ? -77777 : pos0;
    const int32_t *pos_dev = pos_on_device ? (const int32_t *)dpos : NULL;
    s = flash ? cuda_flash_attention(ctx, kv_type, (const float *)dq, kc, vc, (float *)dout, T, H, Hkv, hd, pos_arg,
                                     pos_dev)
              : cuda_attention(ctx, kv_type, (const float *)dq, kc, vc, (float *)dout, T, H, Hkv, hd, pos_arg, pos_dev);
    if (s || (s = cuda_d2h(ctx, out, dout, (size_t)(T * qd * 4), CUDA_STREAM_COMPUTE)) || (s = cuda_sync(ctx)))
        goto done;
done:
    if (ctx) cuda_sync(ctx);
    void *p[] = {dq, dk, dv, kc, vc, dout, dpos};
    for (size_t i = 0; i < sizeof p / sizeof p[0]; i++) cuda_free(ctx, p[i]);
    cuda_ctx_destroy(ctx);
    return s;
}

strata_status strata_cuda_attention(int32_t kv_type, const float *q, const float *k, const float *v, int32_t n_pos,
                                    int32_t T, int32_t H, int32_t Hkv, int32_t hd, int32_t pos_on_device, float *out) {
    return attention_entry(0, kv_type, q, k, v, n_pos, T, H, Hkv, hd, pos_on_device, out);
}

strata_status strata_cuda_flash_attention(int32_t kv_type, const float *q, const float *k, const float *v,
                                          int32_t n_pos, int32_t T, int32_t H, int32_t Hkv, int32_t hd,
                                          int32_t pos_on_device, float *out) {
    return attention_entry(1, kv_type, q, k, v, n_pos, T, H, Hkv, hd, pos_on_device, out);
}
