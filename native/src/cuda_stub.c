/* cuda_stub.c — the CUDA backend's functions in a build without CUDA: each says so and fails. */
#ifndef STRATA_HAVE_CUDA
#include <stdio.h>

#include "cuda_backend.h"

static const char NO_CUDA[] =
    "this build of strata has no CUDA backend (nvcc was not found when it was built); "
    "rebuild on a machine with the CUDA toolkit, or use --device cpu";

int32_t cuda_device_present(void) { return 0; }
strata_status cuda_ctx_create(int32_t device, cuda_ctx **out, char *err, size_t err_len) {
    (void)device;
    *out = NULL;
    if (err && err_len) snprintf(err, err_len, "%s", NO_CUDA);
    return STRATA_ERR_DEVICE;
}
void cuda_ctx_destroy(cuda_ctx *ctx) { (void)ctx; }
strata_status cuda_ctx_use(cuda_ctx *ctx) { (void)ctx; return STRATA_ERR_DEVICE; }
void cuda_ctx_set_decode(cuda_ctx *ctx, int32_t fast, int32_t pdl) { (void)ctx; (void)fast; (void)pdl; }
const char *cuda_ctx_error(const cuda_ctx *ctx) { (void)ctx; return NO_CUDA; }
const char *cuda_ctx_device_name(const cuda_ctx *ctx) { (void)ctx; return ""; }
const char *cuda_ctx_code_path(const cuda_ctx *ctx) { (void)ctx; return ""; }
strata_status cuda_mem_info(cuda_ctx *c, int64_t *f, int64_t *t) { (void)c; *f = *t = 0; return STRATA_ERR_DEVICE; }
strata_status cuda_alloc(cuda_ctx *c, size_t n, void **p, const char *w) { (void)c; (void)n; (void)w; *p = NULL; return STRATA_ERR_DEVICE; }
void cuda_free(cuda_ctx *c, void *p) { (void)c; (void)p; }
void cuda_mem_held(const cuda_ctx *c, int64_t *now, int64_t *peak) {
    (void)c;
    *now = *peak = 0;
}
strata_status cuda_host_register(cuda_ctx *c, void *p, size_t n) { (void)c; (void)p; (void)n; return STRATA_ERR_DEVICE; }
void cuda_host_unregister(cuda_ctx *c, void *p) { (void)c; (void)p; }
strata_status cuda_host_alloc(cuda_ctx *c, size_t n, void **p) { (void)c; (void)n; *p = NULL; return STRATA_ERR_DEVICE; }
void cuda_host_free(cuda_ctx *c, void *p) { (void)c; (void)p; }
strata_status cuda_h2d(cuda_ctx *c, void *d, const void *s, size_t n, int32_t st) { (void)c; (void)d; (void)s; (void)n; (void)st; return STRATA_ERR_DEVICE; }
strata_status cuda_d2h(cuda_ctx *c, void *d, const void *s, size_t n, int32_t st) { (void)c; (void)d; (void)s; (void)n; (void)st; return STRATA_ERR_DEVICE; }
strata_status cuda_d2d(cuda_ctx *c, void *d, const void *s, size_t n, int32_t st) { (void)c; (void)d; (void)s; (void)n; (void)st; return STRATA_ERR_DEVICE; }
strata_status cuda_memset(cuda_ctx *c, void *d, int v, size_t n) { (void)c; (void)d; (void)v; (void)n; return STRATA_ERR_DEVICE; }
strata_status cuda_stream_order(cuda_ctx *c, int32_t a, int32_t b) { (void)c; (void)a; (void)b; return STRATA_ERR_DEVICE; }
strata_status cuda_sync(cuda_ctx *c) { (void)c; return STRATA_ERR_DEVICE; }
strata_status cuda_stream_sync(cuda_ctx *c, int32_t s) { (void)c; (void)s; return STRATA_ERR_DEVICE; }
strata_status cuda_capture_begin(cuda_ctx *c) { (void)c; return STRATA_ERR_DEVICE; }
strata_status cuda_event_create(cuda_ctx *c, void **x) { (void)c; (void)x; return STRATA_ERR_DEVICE; }
strata_status cuda_event_record(cuda_ctx *c, void *x, int32_t s) { (void)c; (void)x; (void)s; return STRATA_ERR_DEVICE; }
strata_status cuda_event_wait(cuda_ctx *c, void *x) { (void)c; (void)x; return STRATA_ERR_DEVICE; }
strata_status cuda_event_done(cuda_ctx *c, void *x, int32_t *done) { (void)c; (void)x; *done = 1; return STRATA_ERR_DEVICE; }
strata_status cuda_stream_wait(cuda_ctx *c, void *x, int32_t s) { (void)c; (void)x; (void)s; return STRATA_ERR_DEVICE; }
void cuda_event_free(void *x) { (void)x; }
strata_status cuda_capture_end(cuda_ctx *c, void **x) { (void)c; (void)x; return STRATA_ERR_DEVICE; }
strata_status cuda_graph_launch(cuda_ctx *c, void *x) { (void)c; (void)x; return STRATA_ERR_DEVICE; }
void cuda_graph_free(void *x) { (void)x; }
int32_t cuda_type_supported(int32_t t) { (void)t; return 0; }
/* the same answers as matvec.cu: the host mirror (cuda_mirror.c, built either way) follows them */
int32_t cuda_act_type(int32_t t) {
    return (t == STRATA_TYPE_Q8_0 || t == STRATA_TYPE_Q4_0) ? STRATA_TYPE_Q8_0 : STRATA_TYPE_F32;
}
int64_t cuda_act_row_bytes(int32_t t, int64_t cols) { return cuda_act_type(t) == STRATA_TYPE_Q8_0 ? cols + cols / 8 : cols * 4; }
strata_status cuda_quantize_act(cuda_ctx *c, int32_t t, const float *x, int64_t xs, void *q, int64_t qs, int64_t cols,
                                int32_t T) {
    (void)c; (void)t; (void)x; (void)xs; (void)q; (void)qs; (void)cols; (void)T;
    return STRATA_ERR_DEVICE;
}
strata_status cuda_matvec(cuda_ctx *c, int32_t ty, const void *w, int64_t r, int64_t co, const void *x, int64_t xs,
                          float *y, int64_t ys, int32_t T, int32_t a) {
    (void)c; (void)ty; (void)w; (void)r; (void)co; (void)x; (void)xs; (void)y; (void)ys; (void)T; (void)a;
    return STRATA_ERR_DEVICE;
}
strata_status cuda_matvec_segments(cuda_ctx *c, int32_t ty, const void *const *w, int64_t r, int64_t co,
                                   const void *x, int64_t xs, const int32_t *tok, const int32_t *o, float *y,
                                   int64_t ys, int32_t n, int32_t st) {
    (void)c; (void)ty; (void)w; (void)r; (void)co; (void)x; (void)xs; (void)tok; (void)o; (void)y; (void)ys; (void)n; (void)st;
    return STRATA_ERR_DEVICE;
}
int32_t cuda_mmq_supported(int32_t t) { (void)t; return 0; }
strata_status cuda_mmq(cuda_ctx *c, int32_t ty, const void *w, int64_t r, int64_t co, const void *x, int64_t xs,
                       float *y, int64_t ys, int32_t T, int32_t a) {
    (void)c; (void)ty; (void)w; (void)r; (void)co; (void)x; (void)xs; (void)y; (void)ys; (void)T; (void)a;
    return STRATA_ERR_DEVICE;
}
strata_status cuda_mmq_segments(cuda_ctx *c, int32_t ty, const void *const *w, int64_t r, int64_t co, const void *x,
                                int64_t xs, const int32_t *p, const int32_t *s, int32_t xd, float *y, int64_t ys,
                                int32_t n) {
    (void)c; (void)ty; (void)w; (void)r; (void)co; (void)x; (void)xs; (void)p; (void)s; (void)xd; (void)y; (void)ys;
    (void)n;
    return STRATA_ERR_DEVICE;
}
strata_status cuda_rmsnorm(cuda_ctx *c, const float *x, const float *w, float *y, int32_t T, int32_t D, float e) {
    (void)c; (void)x; (void)w; (void)y; (void)T; (void)D; (void)e;
    return STRATA_ERR_DEVICE;
}
strata_status cuda_qk_norm_rope(cuda_ctx *c, float *q, float *k, const float *qn, const float *kn, int32_t T,
                                int32_t H, int32_t Hkv, int32_t hd, int32_t p, float th, float e, const int32_t *pd) {
    (void)c; (void)q; (void)k; (void)qn; (void)kn; (void)T; (void)H; (void)Hkv; (void)hd; (void)p; (void)th; (void)e;
    (void)pd;
    return STRATA_ERR_DEVICE;
}
strata_status cuda_kv_store(cuda_ctx *c, int32_t kt, const float *k, const float *v, void *kc, void *vc, int32_t T,
                            int32_t kd, int32_t p, const int32_t *pd) {
    (void)c; (void)kt; (void)k; (void)v; (void)kc; (void)vc; (void)T; (void)kd; (void)p; (void)pd;
    return STRATA_ERR_DEVICE;
}
strata_status cuda_attention(cuda_ctx *c, int32_t kt, const float *q, const void *kc, const void *vc, float *o,
                             int32_t T, int32_t H, int32_t Hkv, int32_t hd, int32_t p, const int32_t *pd) {
    (void)c; (void)kt; (void)q; (void)kc; (void)vc; (void)o; (void)T; (void)H; (void)Hkv; (void)hd; (void)p; (void)pd;
    return STRATA_ERR_DEVICE;
}
strata_status cuda_router_topk(cuda_ctx *c, const float *l, int32_t T, int32_t E, int32_t K, int32_t *i, float *w) {
    (void)c; (void)l; (void)T; (void)E; (void)K; (void)i; (void)w;
    return STRATA_ERR_DEVICE;
}
strata_status cuda_rmsnorm_q8(cuda_ctx *c, const float *x, const float *w, float *y, void *q, int64_t qs, int32_t T,
                             int32_t D, float e) {
    (void)c; (void)x; (void)w; (void)y; (void)q; (void)qs; (void)T; (void)D; (void)e;
    return STRATA_ERR_DEVICE;
}
strata_status cuda_matvec3(cuda_ctx *c, int32_t t, const void *const w[3], const int64_t r[3], int64_t cols,
                           const void *x, float *const y[3], int32_t a) {
    (void)c; (void)t; (void)w; (void)r; (void)cols; (void)x; (void)y; (void)a;
    return STRATA_ERR_DEVICE;
}
strata_status cuda_expert_gate_up(cuda_ctx *c, int32_t t, const void *const *wg, const void *const *wu, int64_t F,
                                  int64_t D, const void *x, float *h, int32_t K) {
    (void)c; (void)t; (void)wg; (void)wu; (void)F; (void)D; (void)x; (void)h; (void)K;
    return STRATA_ERR_DEVICE;
}
strata_status cuda_expert_down_combine(cuda_ctx *c, int32_t t, const void *const *wd, int64_t D, int64_t F,
                                       const void *h, int64_t hs, const float *w, float *y, int32_t K) {
    (void)c; (void)t; (void)wd; (void)D; (void)F; (void)h; (void)hs; (void)w; (void)y; (void)K;
    return STRATA_ERR_DEVICE;
}
strata_status cuda_router_topk_segments(cuda_ctx *c, const float *l, int32_t T, int32_t E, int32_t K, int32_t *i,
                                        float *w, const void *const *tb, const void **sw, int32_t sc, int32_t *st,
                                        int32_t *so, int64_t sh) {
    (void)c; (void)l; (void)T; (void)E; (void)K; (void)i; (void)w; (void)tb; (void)sw; (void)sc; (void)st; (void)so;
    (void)sh;
    return STRATA_ERR_DEVICE;
}
strata_status cuda_swiglu(cuda_ctx *c, const float *g, const float *u, float *h, int64_t n) {
    (void)c; (void)g; (void)u; (void)h; (void)n;
    return STRATA_ERR_DEVICE;
}
strata_status cuda_moe_combine(cuda_ctx *c, const float *e, const float *w, float *y, int32_t T, int32_t K, int32_t D) {
    (void)c; (void)e; (void)w; (void)y; (void)T; (void)K; (void)D;
    return STRATA_ERR_DEVICE;
}
strata_status cuda_add(cuda_ctx *c, float *y, const float *x, int64_t n) { (void)c; (void)y; (void)x; (void)n; return STRATA_ERR_DEVICE; }
strata_status cuda_norm_matvec_f32(cuda_ctx *c, const float *x, const float *nw, float *xn, void *q, const float *w,
                                  int64_t rows, int32_t D, float eps, float *y) {
    (void)c; (void)x; (void)nw; (void)xn; (void)q; (void)w; (void)rows; (void)D; (void)eps; (void)y;
    return STRATA_ERR_DEVICE;
}
strata_status cuda_qk_norm_rope_store(cuda_ctx *c, float *q, float *k, const float *v, const float *qn, const float *kn,
                                      int32_t T, int32_t H, int32_t Hkv, int32_t hd, int32_t pos0, float theta,
                                      float eps, const int32_t *pd, int32_t kt, void *kc, void *vc) {
    (void)c; (void)q; (void)k; (void)v; (void)qn; (void)kn; (void)T; (void)H; (void)Hkv; (void)hd; (void)pos0;
    (void)theta; (void)eps; (void)pd; (void)kt; (void)kc; (void)vc;
    return STRATA_ERR_DEVICE;
}
strata_status cuda_attention_decode(cuda_ctx *c, int32_t kt, const float *q, const void *kc, const void *vc, float *o,
                                    void *q8, int64_t qs, int32_t H, int32_t Hkv, int32_t hd, int32_t pos0,
                                    const int32_t *pd, float *part, int32_t *cnt, int32_t S) {
    (void)c; (void)kt; (void)q; (void)kc; (void)vc; (void)o; (void)q8; (void)qs; (void)H; (void)Hkv; (void)hd;
    (void)pos0; (void)pd; (void)part; (void)cnt; (void)S;
    return STRATA_ERR_DEVICE;
}
strata_status cuda_expert_down_combine_hq(cuda_ctx *c, int32_t t, const void *const *wd, int64_t D, int64_t F,
                                          const float *h, int64_t hs, const float *w, float *y, int32_t K) {
    (void)c; (void)t; (void)wd; (void)D; (void)F; (void)h; (void)hs; (void)w; (void)y; (void)K;
    return STRATA_ERR_DEVICE;
}
strata_status cuda_norm_router_topk_f32(cuda_ctx *c, const float *x, const float *nw, float *xn, void *q,
                                        const float *w, int32_t E, int32_t D, float eps, float *lg, int32_t K,
                                        int32_t *ids, float *wt, const void *const *tb, const void **sw, int32_t sc,
                                        int32_t *st, int32_t *so, int64_t sh, int32_t *cnt) {
    (void)c; (void)x; (void)nw; (void)xn; (void)q; (void)w; (void)E; (void)D; (void)eps; (void)lg; (void)K; (void)ids;
    (void)wt; (void)tb; (void)sw; (void)sc; (void)st; (void)so; (void)sh; (void)cnt;
    return STRATA_ERR_DEVICE;
}
int32_t cuda_flash_attention_supported(int32_t kt, int32_t H, int32_t Hkv, int32_t hd) {
    (void)kt; (void)H; (void)Hkv; (void)hd;
    return 0;
}
strata_status cuda_flash_attention(cuda_ctx *c, int32_t kt, const float *q, const void *kc, const void *vc, float *o,
                                   int32_t T, int32_t H, int32_t Hkv, int32_t hd, int32_t p, const int32_t *pd) {
    (void)c; (void)kt; (void)q; (void)kc; (void)vc; (void)o; (void)T; (void)H; (void)Hkv; (void)hd; (void)p; (void)pd;
    return STRATA_ERR_DEVICE;
}
#else
typedef int strata_cuda_stub_unused; /* ISO C forbids an empty translation unit */
#endif
