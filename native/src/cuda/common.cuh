/* common.cuh — what every CUDA file of the backend shares: the context and error reporting. */
#ifndef STRATA_CUDA_COMMON_CUH
#define STRATA_CUDA_COMMON_CUH

#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdarg.h>
#include <stdio.h>

#include "../cuda_backend.h"

struct cuda_ctx {
    int device;
    cudaStream_t stream[2]; /* CUDA_STREAM_COMPUTE, CUDA_STREAM_COPY */
    cudaEvent_t order_event;
    char name[256];
    char err[1024];
    /* device allocations, so that the engine can say how much device memory it holds */
    void **alloc_ptr;
    size_t *alloc_size;
    int32_t n_alloc, cap_alloc;
    int64_t bytes_now, bytes_peak;
    /* decode options (cuda_ctx_set_decode): the latency-tuned kernels (same bits as the plain ones),
     * and programmatic dependent launch for the kernels launched through cu_launch */
    int fast, pdl;
    /* the next cu_launch follows a copy or an event wait on the compute stream: launch it plainly */
    int pdl_hold;
    /* what the card and the loaded code can do (device.cu, arch.cuh), fixed when the context is made:
     * cc the device's compute capability and code_arch the architecture its kernels were compiled for
     * (10 * major + minor: 90 for sm_90 machine code; 75 for the compute_75 PTX the driver compiled);
     * portable STRATA_CUDA_PORTABLE=1; sm80 the kernels may take their cp.async / m16n8k32 forms
     * (code_arch >= 80, not portable); pdl_ok programmatic dependent launch (cc and code_arch >= 90, not
     * portable); smem_optin the most dynamic shared memory a block may ask for, in bytes */
    int cc, code_arch, portable, sm80, pdl_ok, smem_optin;
    char code_path[640]; /* the above in words, for the trace */
};

/* Record a failure in the context's message and return STRATA_ERR_DEVICE. */
static inline strata_status cuda_fail(cuda_ctx *ctx, cudaError_t e, const char *fmt, ...) {
    char what[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    if (ctx) {
        snprintf(ctx->err, sizeof ctx->err, "CUDA: %s failed: %s (%s)", what, cudaGetErrorString(e),
                 cudaGetErrorName(e));
    }
    return STRATA_ERR_DEVICE;
}

/* Check a runtime call; on failure return the status from the enclosing function. */
#define CU_TRY(ctx, call, ...)                                                                                         \
    do {                                                                                                               \
        cudaError_t e_ = (call);                                                                                       \
        if (e_ != cudaSuccess) return cuda_fail((ctx), e_, __VA_ARGS__);                                               \
    } while (0)

/* Check the launch that was just made. */
#define CU_LAUNCHED(ctx, name) CU_TRY((ctx), cudaGetLastError(), "launching %s", (name))

#define CU_COMPUTE(ctx) ((ctx)->stream[CUDA_STREAM_COMPUTE])

/* ---- programmatic dependent launch (sm_90) ------------------------------------------------------
 * A kernel launched with cu_launch while ctx->pdl is on may start while the kernel before it in the
 * stream is still running (its blocks start once every block of that kernel has called
 * cu_pdl_trigger or exited). It must therefore call cu_pdl_wait (which returns once the kernel before
 * it has finished and its writes are visible) before it reads anything another launch wrote, and
 * before it writes anything; only reads of memory no launch writes (weights) may come before. Every
 * thread of every kernel launched with cu_launch calls cu_pdl_wait, so a kernel never finishes before
 * the one it follows, and a kernel two launches later can rely on both. Without the attribute both
 * calls do nothing; in code compiled for an architecture below sm_90 they are empty. */
__device__ __forceinline__ void cu_pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
__device__ __forceinline__ void cu_pdl_trigger() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

/* Launch kern on the compute stream, with programmatic dependent launch when ctx->pdl is on and the
 * launch follows another kernel (not a copy: cuda_h2d and the others set pdl_hold). ctx->pdl is never on
 * unless ctx->pdl_ok: a kernel compiled for an architecture below sm_90 (the compute_75 PTX on any card)
 * has empty cu_pdl_wait calls and must not start before the kernel it follows has finished. */
template <typename... KArgs, typename... Args>
static inline cudaError_t cu_launch(cuda_ctx *ctx, void (*kern)(KArgs...), dim3 grid, dim3 block, size_t smem,
                                    Args... args) {
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid;
    cfg.blockDim = block;
    cfg.dynamicSmemBytes = smem;
    cfg.stream = CU_COMPUTE(ctx);
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[0].val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = attr;
    cfg.numAttrs = ctx->pdl && !ctx->pdl_hold ? 1 : 0;
    ctx->pdl_hold = 0;
    const cudaError_t e = cudaLaunchKernelEx(&cfg, kern, ((KArgs)args)...);
    if (e != cudaSuccess) cudaGetLastError(); /* reported through the return value, not by the next check */
    return e;
}

static inline unsigned cu_blocks(int64_t n, int threads) { return (unsigned)((n + threads - 1) / threads); }

/* One warp quantizes block b (32 values, v = this lane's) of an activation row for Q8_0/Q4_0 weights,
 * with the host engine's rounding: d = max|x| / 127 (stored rounded to f16), q = round(x / d). Row
 * layout: cols int8 values, then cols / 32 float scales. Every producer of such rows calls this, so
 * they give the same bits. */
__device__ __forceinline__ void cu_q8_block(float v, uint8_t *row, int64_t b, int lane, int64_t cols) {
    float amax = fabsf(v);
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, off));
    const float d = amax / 127.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    row[b * 32 + lane] = (uint8_t)(int8_t)roundf(__fmul_rn(v, id));
    if (lane == 0) ((float *)(row + cols))[b] = __half2float(__float2half_rn(d));
}

#endif
