/* norm_rope.cu — RMSNorm, per-head q/k RMSNorm with NeoX RoPE, and the KV-cache store.
 * Legend: T tokens, D model dim, H query heads, Hkv key/value heads, hd head dim. */
#include <cuda_fp16.h>

#include "common.cuh"

#define NORM_THREADS 256

/* Sum over a block of NORM_THREADS in a fixed tree order. */
static __device__ float block_sum(float v, float *sh) {
    sh[threadIdx.x] = v;
    __syncthreads();
    for (int s = blockDim.x / 2; s > 0; s >>= 1) {
        if ((int)threadIdx.x < s) sh[threadIdx.x] = __fadd_rn(sh[threadIdx.x], sh[threadIdx.x + s]);
        __syncthreads();
    }
    float r = sh[0];
    __syncthreads();
    return r;
}

__global__ void k_rmsnorm(const float *x, const float *w, float *y, int D, float eps) {
    __shared__ float sh[NORM_THREADS];
    const float *xr = x + (int64_t)blockIdx.x * D;
    float *yr = y + (int64_t)blockIdx.x * D;
    float ss = 0.0f;
    for (int i = threadIdx.x; i < D; i += blockDim.x) ss = __fadd_rn(ss, __fmul_rn(xr[i], xr[i]));
    ss = block_sum(ss, sh);
    const float scale = 1.0f / sqrtf(ss / (float)D + eps);
    for (int i = threadIdx.x; i < D; i += blockDim.x) yr[i] = __fmul_rn(__fmul_rn(xr[i], scale), w[i]);
}

/* k_rmsnorm, and the normed row quantized for Q8_0/Q4_0 weights in the same pass (one launch instead
 * of two; the same bits as k_rmsnorm followed by k_quantize_q8). */
__global__ void k_rmsnorm_q8(const float *x, const float *w, float *y, uint8_t *q, int64_t q_stride, int D,
                             float eps) {
    __shared__ float sh[NORM_THREADS];
    const float *xr = x + (int64_t)blockIdx.x * D;
    float *yr = y + (int64_t)blockIdx.x * D;
    uint8_t *qr = q + (int64_t)blockIdx.x * q_stride;
    float ss = 0.0f;
    for (int i = threadIdx.x; i < D; i += blockDim.x) ss = __fadd_rn(ss, __fmul_rn(xr[i], xr[i]));
    ss = block_sum(ss, sh);
    const float scale = 1.0f / sqrtf(ss / (float)D + eps);
    const int lane = threadIdx.x & 31;
    for (int b = threadIdx.x >> 5; b < D / 32; b += blockDim.x >> 5) {
        const int i = b * 32 + lane;
        const float v = __fmul_rn(__fmul_rn(xr[i], scale), w[i]);
        yr[i] = v;
        cu_q8_block(v, qr, b, lane, D);
    }
}

/* one block per (token, head) of q and k: blockIdx.y < H are q heads, the rest k heads; hd threads */
__global__ void k_qk_norm_rope(float *q, float *k, const float *qn, const float *kn, int H, int Hkv, int hd,
                               int pos0, float theta, float eps, const int32_t *pos_dev) {
    if (pos_dev) pos0 = *pos_dev;
    __shared__ float sh[NORM_THREADS];
    __shared__ float v[512];
    const int t = blockIdx.x, hh = blockIdx.y, i = threadIdx.x;
    const bool isq = hh < H;
    float *x = isq ? q + ((int64_t)t * H + hh) * hd : k + ((int64_t)t * Hkv + (hh - H)) * hd;
    const float *w = isq ? qn : kn;
    const float xi = i < hd ? x[i] : 0.0f;
    const float ss = block_sum(__fmul_rn(xi, xi), sh);
    const float scale = 1.0f / sqrtf(ss / (float)hd + eps);
    if (i < hd) v[i] = w ? __fmul_rn(__fmul_rn(xi, scale), w[i]) : xi;
    __syncthreads();
    /* NeoX layout: element i pairs with i + hd/2 */
    const int half = hd / 2;
    if (i < half) {
        const float freq = powf(theta, -2.0f * (float)i / (float)hd);
        const float ang = (float)(pos0 + t) * freq;
        float sn, cs;
        sincosf(ang, &sn, &cs);
        const float x0 = v[i], x1 = v[i + half];
        x[i] = __fsub_rn(__fmul_rn(x0, cs), __fmul_rn(x1, sn));
        x[i + half] = __fadd_rn(__fmul_rn(x0, sn), __fmul_rn(x1, cs));
    }
}

/* f16 cache: row p = kv_dim halves.  int8 cache: row p = kv_dim int8 then kv_dim/32 f32 scales. */
__global__ void k_kv_store(int kv_type, const float *k, const float *v, uint8_t *kc, uint8_t *vc, int kv_dim,
                           int pos0, const int32_t *pos_dev) {
    if (pos_dev) pos0 = *pos_dev;
    const int t = blockIdx.x;
    const float *src = blockIdx.y == 0 ? k : v;
    uint8_t *dst = blockIdx.y == 0 ? kc : vc;
    const float *s = src + (int64_t)t * kv_dim;
    const int64_t p = pos0 + t;
    if (kv_type == STRATA_KV_F16) {
        __half *row = (__half *)(dst + p * (int64_t)kv_dim * 2);
        for (int i = threadIdx.x; i < kv_dim; i += blockDim.x) row[i] = __float2half_rn(s[i]);
        return;
    }
    const int64_t rb = kv_dim + kv_dim / 8;
    int8_t *row = (int8_t *)(dst + p * rb);
    float *scales = (float *)(dst + p * rb + kv_dim);
    /* one warp per block of 32 values */
    const int lane = threadIdx.x & 31;
    for (int b = threadIdx.x >> 5; b < kv_dim / 32; b += blockDim.x >> 5) {
        const float x = s[b * 32 + lane];
        float amax = fabsf(x);
        for (int off = 16; off > 0; off >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, off));
        const float d = amax / 127.0f;
        const float id = d > 0.0f ? 1.0f / d : 0.0f;
        row[b * 32 + lane] = (int8_t)__float2int_rn(x * id);
        if (lane == 0) scales[b] = d;
    }
}

extern "C" {

strata_status cuda_rmsnorm(cuda_ctx *ctx, const float *x, const float *w, float *y, int32_t T, int32_t D, float eps) {
    if (T <= 0) return STRATA_OK;
    k_rmsnorm<<<T, NORM_THREADS, 0, CU_COMPUTE(ctx)>>>(x, w, y, D, eps);
    CU_LAUNCHED(ctx, "rmsnorm");
    return STRATA_OK;
}

strata_status cuda_rmsnorm_q8(cuda_ctx *ctx, const float *x, const float *w, float *y, void *q, int64_t q_stride,
                             int32_t T, int32_t D, float eps) {
    if (T <= 0) return STRATA_OK;
    if (D % 32) return STRATA_ERR_INVALID_ARGUMENT;
    k_rmsnorm_q8<<<T, NORM_THREADS, 0, CU_COMPUTE(ctx)>>>(x, w, y, (uint8_t *)q, q_stride, D, eps);
    CU_LAUNCHED(ctx, "rmsnorm and quantization");
    return STRATA_OK;
}

strata_status cuda_qk_norm_rope(cuda_ctx *ctx, float *q, float *k, const float *q_norm, const float *k_norm, int32_t T,
                                int32_t H, int32_t Hkv, int32_t hd, int32_t pos0, float theta, float eps,
                                const int32_t *pos_dev) {
    if (T <= 0) return STRATA_OK;
    if (hd > 512 || hd % 2) {
        snprintf(ctx->err, sizeof ctx->err, "CUDA: head dimension %d is not supported (at most 512, even)", hd);
        return STRATA_ERR_UNSUPPORTED;
    }
    const int threads = hd <= 32 ? 32 : (hd <= 64 ? 64 : (hd <= 128 ? 128 : (hd <= 256 ? 256 : 512)));
    /* block_sum needs a power-of-two block no larger than NORM_THREADS */
    if (threads > NORM_THREADS) {
        snprintf(ctx->err, sizeof ctx->err, "CUDA: head dimension %d is not supported (at most 256)", hd);
        return STRATA_ERR_UNSUPPORTED;
    }
    dim3 grid(T, H + Hkv);
    k_qk_norm_rope<<<grid, threads, 0, CU_COMPUTE(ctx)>>>(q, k, q_norm, k_norm, H, Hkv, hd, pos0, theta, eps,
                                                          pos_dev);
    CU_LAUNCHED(ctx, "q/k norm and rope");
    return STRATA_OK;
}

strata_status cuda_kv_store(cuda_ctx *ctx, int32_t kv_type, const float *k, const float *v, void *k_cache,
                            void *v_cache, int32_t T, int32_t kv_dim, int32_t pos0, const int32_t *pos_dev) {
    if (T <= 0) return STRATA_OK;
    if (kv_dim % 32) return STRATA_ERR_INVALID_ARGUMENT;
    dim3 grid(T, 2);
    k_kv_store<<<grid, 256, 0, CU_COMPUTE(ctx)>>>(kv_type, k, v, (uint8_t *)k_cache, (uint8_t *)v_cache, kv_dim, pos0,
                                                  pos_dev);
    CU_LAUNCHED(ctx, "kv store");
    return STRATA_OK;
}

} /* extern "C" */
