/* norm_rope.cu — RMSNorm, per-head q/k RMSNorm with NeoX RoPE, and the KV-cache store.
 * Legend: T tokens, D model dim, H query heads, Hkv key/value heads, hd head dim. */
#include <cuda_fp16.h>

#include "common.cuh"
#include "rms.cuh"

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
__global__ void k_rmsnorm_q8(const float *x, const float *w, float *y, uint8_t *q, int64_t q_stride, int D, float eps) {
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

/* ---- latency-tuned RMSNorm (ctx->fast): the same bits as k_rmsnorm / k_rmsnorm_q8 ----------------
 * Thread i owns x[i + 256 j] for every j (the values the plain kernels' loops give it, in the same
 * order), loaded together at the start with the weights, instead of one dependent round trip per
 * value; the sum of squares goes through block_sum's tree with one barrier (rms.cuh). For
 * D <= RMS_THREADS * RMS_MAXV. Quantization (Q8): warp w holds blocks b = w + 8 j, k_rmsnorm_q8's
 * assignment. */
static_assert(NORM_THREADS == RMS_THREADS, "k_rmsnorm_fast runs the plain kernels' block size");

template <bool Q8>
__global__ void __launch_bounds__(NORM_THREADS)
    k_rmsnorm_fast(const float *x, const float *w, float *y, uint8_t *q, int64_t q_stride, int D, float eps) {
    __shared__ float sh[NORM_THREADS];
    cu_pdl_trigger();
    float wv[RMS_MAXV];
    const int tid = threadIdx.x;
    rms_load_weights(w, D, wv); /* weights: written by no launch, read before the wait */
    cu_pdl_wait();
    float xv[RMS_MAXV];
    const float scale = rms_load_scale(x + (int64_t)blockIdx.x * D, D, eps, xv, sh);
    float *yr = y + (int64_t)blockIdx.x * D;
    const int lane = tid & 31, warp = tid >> 5;
#pragma unroll
    for (int j = 0; j < RMS_MAXV; j++) {
        const int i = tid + j * NORM_THREADS;
        if (Q8) {
            const int b = warp + j * (NORM_THREADS / 32); /* warp-uniform: D is a multiple of 32 */
            if (b < D / 32) {
                const float v = __fmul_rn(__fmul_rn(xv[j], scale), wv[j]);
                yr[i] = v;
                cu_q8_block(v, q + (int64_t)blockIdx.x * q_stride, b, lane, D);
            }
        } else if (i < D) {
            yr[i] = __fmul_rn(__fmul_rn(xv[j], scale), wv[j]);
        }
    }
}

/* One head of hd values at position pos, thread i holding element i (a power-of-two block, block_sum):
 * x = RoPE(rmsnorm(x) * w) (w NULL: no norm), with v (shared, hd floats) holding the normed head. NeoX
 * layout: element i pairs with i + hd/2. keep: the rotated pairs also go to v. */
static __device__ __forceinline__ void head_norm_rope(float *x, const float *w, int hd, int i, int pos, float theta,
                                                      float eps, float *sh, float *v, bool keep) {
    const float xi = i < hd ? x[i] : 0.0f;
    const float ss = block_sum(__fmul_rn(xi, xi), sh);
    const float scale = 1.0f / sqrtf(ss / (float)hd + eps);
    if (i < hd) v[i] = w ? __fmul_rn(__fmul_rn(xi, scale), w[i]) : xi;
    __syncthreads();
    const int half = hd / 2;
    if (i < half) {
        const float freq = powf(theta, -2.0f * (float)i / (float)hd);
        const float ang = (float)pos * freq;
        float sn, cs;
        sincosf(ang, &sn, &cs);
        const float x0 = v[i], x1 = v[i + half];
        const float r0 = __fsub_rn(__fmul_rn(x0, cs), __fmul_rn(x1, sn));
        const float r1 = __fadd_rn(__fmul_rn(x0, sn), __fmul_rn(x1, cs));
        x[i] = r0;
        x[i + half] = r1;
        if (keep) {
            v[i] = r0;
            v[i + half] = r1;
        }
    }
}

/* one block per (token, head) of q and k: blockIdx.y < H are q heads, the rest k heads; hd threads */
__global__ void k_qk_norm_rope(float *q, float *k, const float *qn, const float *kn, int H, int Hkv, int hd, int pos0,
                               float theta, float eps, const int32_t *pos_dev) {
    if (pos_dev) pos0 = *pos_dev;
    __shared__ float sh[NORM_THREADS];
    __shared__ float v[512];
    const int t = blockIdx.x, hh = blockIdx.y, i = threadIdx.x;
    const bool isq = hh < H;
    float *x = isq ? q + ((int64_t)t * H + hh) * hd : k + ((int64_t)t * Hkv + (hh - H)) * hd;
    head_norm_rope(x, isq ? qn : kn, hd, i, pos0 + t, theta, eps, sh, v, false);
}

/* int8 cache, one warp per block of 32 values (x: this lane's): q = round(x / d) with d = max|x| / 127,
 * kept as a float; the lane given a scale pointer writes d. */
static __device__ __forceinline__ void kv_q8(float x, int8_t *q, float *scale) {
    float amax = fabsf(x);
    for (int off = 16; off > 0; off >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, off));
    const float d = amax / 127.0f;
    const float id = d > 0.0f ? 1.0f / d : 0.0f;
    *q = (int8_t)__float2int_rn(x * id);
    if (scale) *scale = d;
}

/* f16 cache: row p = kv_dim halves.  int8 cache: row p = kv_dim int8 then kv_dim/32 f32 scales. */
__global__ void k_kv_store(int kv_type, const float *k, const float *v, uint8_t *kc, uint8_t *vc, int kv_dim, int pos0,
                           const int32_t *pos_dev) {
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
        kv_q8(s[b * 32 + lane], row + b * 32 + lane, lane == 0 ? scales + b : NULL);
    }
}

/* Decode (cuda_qk_norm_rope_store): k_qk_norm_rope and k_kv_store in one launch. Blocks y < H are q
 * heads, H .. H + Hkv - 1 k heads (normed, rotated, written to k and to the cache), the last Hkv v heads
 * (written to the cache). hd threads, hd a multiple of 32; the values and every expression are those
 * of the two kernels, so the cache gets the same bits. */
__global__ void k_qk_norm_rope_store(float *q, float *k, const float *vsrc, const float *qn, const float *kn, int H,
                                     int Hkv, int hd, int pos0, float theta, float eps, const int32_t *pos_dev,
                                     int kv_type, uint8_t *kc, uint8_t *vc) {
    cu_pdl_trigger();
    cu_pdl_wait();
    if (pos_dev) pos0 = *pos_dev;
    __shared__ float sh[NORM_THREADS];
    __shared__ float v[512];
    const int t = blockIdx.x, hh = blockIdx.y, i = threadIdx.x;
    const int kv_dim = Hkv * hd;
    const int64_t p = pos0 + t;
    float out = 0.0f; /* the value of element i to store (k and v heads) */
    uint8_t *dst = NULL;
    int col = 0;
    if (hh < H + Hkv) {
        const bool isq = hh < H;
        float *x = isq ? q + ((int64_t)t * H + hh) * hd : k + ((int64_t)t * Hkv + (hh - H)) * hd;
        /* k heads: the rotated pairs to shared memory too (thread i then stores element i) */
        head_norm_rope(x, isq ? qn : kn, hd, i, pos0 + t, theta, eps, sh, v, !isq);
        if (isq) return; /* block-uniform */
        __syncthreads();
        out = v[i];
        dst = kc;
        col = (hh - H) * hd + i;
    } else {
        col = (hh - H - Hkv) * hd + i;
        out = vsrc[(int64_t)t * kv_dim + col];
        dst = vc;
    }
    if (kv_type == STRATA_KV_F16) {
        ((__half *)(dst + p * (int64_t)kv_dim * 2))[col] = __float2half_rn(out);
        return;
    }
    /* int8: one warp per block of 32 values (hd is a multiple of 32): k_kv_store's expression */
    const int64_t rb = kv_dim + kv_dim / 8;
    int8_t *row = (int8_t *)(dst + p * rb);
    float *scales = (float *)(dst + p * rb + kv_dim);
    kv_q8(out, row + col, (i & 31) == 0 ? scales + (col >> 5) : NULL);
}

extern "C" {

strata_status cuda_rmsnorm(cuda_ctx *ctx, const float *x, const float *w, float *y, int32_t T, int32_t D, float eps) {
    if (T <= 0) return STRATA_OK;
    if ((ctx->fast & CUDA_FAST_NORM) && D <= RMS_THREADS * RMS_MAXV) {
        CU_TRY(ctx,
               cu_launch(ctx, k_rmsnorm_fast<false>, dim3(T), dim3(NORM_THREADS), 0, x, w, y, (uint8_t *)NULL,
                         (int64_t)0, (int)D, eps),
               "launching rmsnorm");
        return STRATA_OK;
    }
    k_rmsnorm<<<T, NORM_THREADS, 0, CU_COMPUTE(ctx)>>>(x, w, y, D, eps);
    CU_LAUNCHED(ctx, "rmsnorm");
    return STRATA_OK;
}

strata_status cuda_rmsnorm_q8(cuda_ctx *ctx, const float *x, const float *w, float *y, void *q, int64_t q_stride,
                              int32_t T, int32_t D, float eps) {
    if (T <= 0) return STRATA_OK;
    if (D % 32) return STRATA_ERR_INVALID_ARGUMENT;
    if ((ctx->fast & CUDA_FAST_NORM) && D <= RMS_THREADS * RMS_MAXV) {
        CU_TRY(ctx,
               cu_launch(ctx, k_rmsnorm_fast<true>, dim3(T), dim3(NORM_THREADS), 0, x, w, y, (uint8_t *)q,
                         (int64_t)q_stride, (int)D, eps),
               "launching rmsnorm and quantization");
        return STRATA_OK;
    }
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
    k_qk_norm_rope<<<grid, threads, 0, CU_COMPUTE(ctx)>>>(q, k, q_norm, k_norm, H, Hkv, hd, pos0, theta, eps, pos_dev);
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

strata_status cuda_qk_norm_rope_store(cuda_ctx *ctx, float *q, float *k, const float *v, const float *q_norm,
                                      const float *k_norm, int32_t T, int32_t H, int32_t Hkv, int32_t hd, int32_t pos0,
                                      float theta, float eps, const int32_t *pos_dev, int32_t kv_type, void *k_cache,
                                      void *v_cache) {
    if (T <= 0) return STRATA_OK;
    /* one thread per value and a power-of-two block (block_sum): hd of 32, 64, 128 or 256 */
    if (hd != 32 && hd != 64 && hd != 128 && hd != 256) {
        snprintf(ctx->err, sizeof ctx->err, "CUDA: head dimension %d: no fused rope and cache store", hd);
        return STRATA_ERR_UNSUPPORTED;
    }
    CU_TRY(ctx,
           cu_launch(ctx, k_qk_norm_rope_store, dim3(T, H + 2 * Hkv), dim3(hd), 0, q, k, v, q_norm, k_norm, (int)H,
                     (int)Hkv, (int)hd, (int)pos0, theta, eps, pos_dev, (int)kv_type, (uint8_t *)k_cache,
                     (uint8_t *)v_cache),
           "launching q/k norm, rope and kv store");
    return STRATA_OK;
}

} /* extern "C" */
