/* common.cuh — what every CUDA file of the backend shares: the context and error reporting. */
#ifndef STRATA_CUDA_COMMON_CUH
#define STRATA_CUDA_COMMON_CUH

#include <cuda_runtime.h>
#include <stdarg.h>
#include <stdio.h>

#include "../cuda_backend.h"

struct cuda_ctx {
    int device;
    cudaStream_t stream[2];  /* CUDA_STREAM_COMPUTE, CUDA_STREAM_COPY */
    cudaEvent_t order_event;
    char name[256];
    char err[1024];
    /* device allocations, so that the engine can say how much device memory it holds */
    void **alloc_ptr;
    size_t *alloc_size;
    int32_t n_alloc, cap_alloc;
    int64_t bytes_now, bytes_peak;
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
#define CU_TRY(ctx, call, ...)                                  \
    do {                                                        \
        cudaError_t e_ = (call);                                \
        if (e_ != cudaSuccess) return cuda_fail((ctx), e_, __VA_ARGS__); \
    } while (0)

/* Check the launch that was just made. */
#define CU_LAUNCHED(ctx, name) CU_TRY((ctx), cudaGetLastError(), "launching %s", (name))

#define CU_COMPUTE(ctx) ((ctx)->stream[CUDA_STREAM_COMPUTE])

static inline unsigned cu_blocks(int64_t n, int threads) { return (unsigned)((n + threads - 1) / threads); }

#endif
