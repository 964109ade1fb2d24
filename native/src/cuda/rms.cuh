/* rms.cuh — the latency-tuned RMSNorm's pieces, shared by norm_rope.cu (k_rmsnorm_fast) and matvec.cu
 * (k_norm_matvec_f32, the norm in front of the router's product), so that both give k_rmsnorm's bits.
 * Legend: D model dim. Blocks of RMS_THREADS threads; thread tid owns the values tid + RMS_THREADS j,
 * j < RMS_MAXV (the values k_rmsnorm's loop gives it, in the same order), so D <= RMS_THREADS * RMS_MAXV. */
#ifndef STRATA_CUDA_RMS_CUH
#define STRATA_CUDA_RMS_CUH

#include "common.cuh"

#define RMS_THREADS 256
#define RMS_MAXV 16

/* The sum over the block in block_sum's tree order (norm_rope.cu) with one barrier: the 256 partials
 * in shared memory (sh: RMS_THREADS floats), warp 0 doing the steps 128, 64, 32 from there and 16 .. 1 by
 * shuffles (lane i adds lane i + s, the tree's pairing). */
static __device__ __forceinline__ float rms_block_sum(float v, float *sh) {
    sh[threadIdx.x] = v;
    __syncthreads();
    float r = 0.0f;
    if (threadIdx.x < 32) {
        const int l = threadIdx.x;
        const float a0 = __fadd_rn(sh[l], sh[l + 128]), a1 = __fadd_rn(sh[l + 32], sh[l + 160]);
        const float a2 = __fadd_rn(sh[l + 64], sh[l + 192]), a3 = __fadd_rn(sh[l + 96], sh[l + 224]);
        r = __fadd_rn(__fadd_rn(a0, a2), __fadd_rn(a1, a3)); /* steps 64 (l + 64, l + 96) then 32 */
#pragma unroll
        for (int s = 16; s > 0; s >>= 1) r = __fadd_rn(r, __shfl_down_sync(0xffffffffu, r, s));
        if (l == 0) sh[0] = r;
    }
    __syncthreads();
    return sh[0];
}

/* The thread's norm weights (0 past D). Written by no launch: may be read before cu_pdl_wait. */
static __device__ __forceinline__ void rms_load_weights(const float *w, int D, float (&wv)[RMS_MAXV]) {
#pragma unroll
    for (int j = 0; j < RMS_MAXV; j++) {
        const int i = threadIdx.x + j * RMS_THREADS;
        wv[j] = i < D ? __ldg(w + i) : 0.0f;
    }
}

/* The thread's values of row xr (0 past D), loaded together, and the row's scale
 * 1 / sqrt(sum x^2 / D + eps) with k_rmsnorm's sum. Reads xr: after cu_pdl_wait. */
static __device__ __forceinline__ float rms_load_scale(const float *xr, int D, float eps, float (&xv)[RMS_MAXV],
                                                       float *sh) {
    const int tid = threadIdx.x;
#pragma unroll
    for (int j = 0; j < RMS_MAXV; j++) {
        const int i = tid + j * RMS_THREADS;
        xv[j] = i < D ? xr[i] : 0.0f;
    }
    float ss = 0.0f;
#pragma unroll
    for (int j = 0; j < RMS_MAXV; j++)
        if (tid + j * RMS_THREADS < D) ss = __fadd_rn(ss, __fmul_rn(xv[j], xv[j]));
    ss = rms_block_sum(ss, sh);
    return 1.0f / sqrtf(ss / (float)D + eps);
}

#endif
