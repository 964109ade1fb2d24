/* device.cu — the CUDA context: device selection, memory, pinned host memory, streams, copies. */
#include <stdlib.h>
#include <string.h>

#include "common.cuh"

extern "C" {
#include "../trace.h"
}

/* The architecture the code loaded for this device was compiled for (__CUDA_ARCH__): its own machine
 * code, the machine code of an older minor version of its major one, or the PTX compiled by the driver
 * (every module of the library carries the same architectures, so the driver picks the same for all). */
__global__ void k_code_arch(int *out) {
#ifdef __CUDA_ARCH__
    *out = __CUDA_ARCH__;
#endif
}

/* Fill ctx's capabilities (common.cuh) from the device and the loaded code; a message in err on failure. */
static strata_status probe_code(cuda_ctx *ctx, const cudaDeviceProp *prop, char *err, size_t err_len) {
    ctx->cc = prop->major * 10 + prop->minor;
    if (ctx->cc < 75) {
        snprintf(err, err_len,
                 "%s (compute %d.%d) is older than strata's CUDA backend supports (Turing, compute 7.5, and newer); "
                 "use --device cpu",
                 prop->name, prop->major, prop->minor);
        return STRATA_ERR_DEVICE;
    }
    cudaError_t e = cudaDeviceGetAttribute(&ctx->smem_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, ctx->device);
    int *d = NULL, arch = 0;
    if (e == cudaSuccess) e = cudaMalloc((void **)&d, sizeof(int));
    if (e == cudaSuccess) {
        k_code_arch<<<1, 1, 0, ctx->stream[0]>>>(d);
        e = cudaGetLastError();
        if (e == cudaSuccess) e = cudaMemcpyAsync(&arch, d, sizeof arch, cudaMemcpyDeviceToHost, ctx->stream[0]);
        if (e == cudaSuccess) e = cudaStreamSynchronize(ctx->stream[0]);
        cudaFree(d);
    }
    if (e != cudaSuccess) {
        cudaGetLastError();
        if (e == cudaErrorNoKernelImageForDevice || e == cudaErrorInvalidKernelImage ||
            e == cudaErrorUnsupportedPtxVersion) {
            snprintf(err, err_len,
                     "this build of strata has no code that %s (compute %d.%d) can run with this driver (%s): rebuild "
                     "with the default architectures, or with -DSTRATA_CUDA_ARCHS=%d%d (see the README), or "
                     "update the driver",
                     prop->name, prop->major, prop->minor, cudaGetErrorString(e), prop->major, prop->minor);
        } else {
            snprintf(err, err_len, "CUDA: probing device %d failed: %s", ctx->device, cudaGetErrorString(e));
        }
        return STRATA_ERR_DEVICE;
    }
    ctx->code_arch = arch / 10;
    ctx->portable = env_cuda_portable();
    ctx->sm80 = ctx->code_arch >= 80 && !ctx->portable;
    ctx->pdl_ok = ctx->cc >= 90 && ctx->code_arch >= 90 && !ctx->portable;
    snprintf(ctx->code_path, sizeof ctx->code_path,
             "%s (compute %d.%d) runs code built for sm_%d%s: %s, %s, programmatic launches %s, %d KiB of shared "
             "memory per block",
             prop->name, prop->major, prop->minor, ctx->code_arch, 
             ctx->portable ? ", portable path (STRATA_CUDA_PORTABLE=1)" : "",
             ctx->sm80 ? "cp.async" : "plain copies to shared memory",
             ctx->sm80 ? "m16n8k32 integer products" : "m8n8k16 integer products", ctx->pdl_ok ? "on" : "off",
             ctx->smem_optin / 1024);
    return STRATA_OK;
}

extern "C" {

int32_t cuda_device_present(void) {
    int n = 0, major = 0, minor = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        cudaGetLastError(); /* clear the sticky "no device" error */
        return 0;
    }
    /* a card older than Turing counts as none (--device auto takes the CPU; cuda_ctx_create says why) */
    if (n <= 0 || cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0) != cudaSuccess ||
        cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, 0) != cudaSuccess) {
        cudaGetLastError();
        return 0;
    }
    return major * 10 + minor >= 75;
}

strata_status cuda_ctx_create(int32_t device, cuda_ctx **out, char *err, size_t err_len) {
    *out = NULL;
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess || n == 0) {
        snprintf(err, err_len,
                 "no CUDA device is usable (%s); use --device cpu, or check the driver with nvidia-smi",
                 e != cudaSuccess ? cudaGetErrorString(e) : "no devices");
        cudaGetLastError();
        return STRATA_ERR_DEVICE;
    }
    if (device < 0 || device >= n) {
        snprintf(err, err_len, "CUDA device %d does not exist (this machine has %d)", device, n);
        return STRATA_ERR_INVALID_ARGUMENT;
    }
    cuda_ctx *ctx = (cuda_ctx *)calloc(1, sizeof *ctx);
    if (!ctx) {
        snprintf(err, err_len, "out of host memory creating the CUDA context");
        return STRATA_ERR_OUT_OF_MEMORY;
    }
    ctx->device = device;
    strata_status s = STRATA_OK;
    cudaDeviceProp prop;
    if ((e = cudaSetDevice(device)) != cudaSuccess || (e = cudaGetDeviceProperties(&prop, device)) != cudaSuccess ||
        (e = cudaStreamCreateWithFlags(&ctx->stream[0], cudaStreamNonBlocking)) != cudaSuccess ||
        (e = cudaStreamCreateWithFlags(&ctx->stream[1], cudaStreamNonBlocking)) != cudaSuccess ||
        (e = cudaEventCreateWithFlags(&ctx->order_event, cudaEventDisableTiming)) != cudaSuccess) {
        snprintf(err, err_len, "CUDA: setting up device %d failed: %s", device, cudaGetErrorString(e));
        s = STRATA_ERR_DEVICE;
        cuda_ctx_destroy(ctx);
        return s;
    }
    snprintf(ctx->name, sizeof ctx->name, "%s", prop.name);
    if ((s = probe_code(ctx, &prop, err, err_len)) != STRATA_OK) {
        cuda_ctx_destroy(ctx);
        return s;
    }
    ctx->fast = CUDA_FAST_ALL;
    *out = ctx;
    return STRATA_OK;
}

strata_status cuda_ctx_use(cuda_ctx *ctx) {
    int cur = -1;
    if (cudaGetDevice(&cur) == cudaSuccess && cur == ctx->device) return STRATA_OK;
    CU_TRY(ctx, cudaSetDevice(ctx->device), "making device %d the current one", ctx->device);
    return STRATA_OK;
}

void cuda_ctx_destroy(cuda_ctx *ctx) {
    if (!ctx) return;
    cudaSetDevice(ctx->device);
    for (int i = 0; i < 2; i++)
        if (ctx->stream[i]) {
            cudaStreamSynchronize(ctx->stream[i]);
            cudaStreamDestroy(ctx->stream[i]);
        }
    if (ctx->order_event) cudaEventDestroy(ctx->order_event);
    cudaGetLastError();
    free(ctx->alloc_ptr);
    free(ctx->alloc_size);
    free(ctx);
}

void cuda_ctx_set_decode(cuda_ctx *ctx, int32_t fast, int32_t pdl) {
    if (!ctx) return;
    ctx->fast = fast & CUDA_FAST_ALL;
    ctx->pdl = pdl != 0 && ctx->pdl_ok;
    ctx->pdl_hold = 0;
}

const char *cuda_ctx_code_path(const cuda_ctx *ctx) { return ctx ? ctx->code_path : ""; }

const char *cuda_ctx_error(const cuda_ctx *ctx) { return ctx ? ctx->err : ""; }
const char *cuda_ctx_device_name(const cuda_ctx *ctx) { return ctx ? ctx->name : ""; }

strata_status cuda_mem_info(cuda_ctx *ctx, int64_t *free_bytes, int64_t *total_bytes) {
    size_t f = 0, t = 0;
    CU_TRY(ctx, cudaMemGetInfo(&f, &t), "reading free device memory");
    *free_bytes = (int64_t)f;
    *total_bytes = (int64_t)t;
    return STRATA_OK;
}

strata_status cuda_alloc(cuda_ctx *ctx, size_t bytes, void **dptr, const char *what) {
    *dptr = NULL;
    cudaError_t e = cudaMalloc(dptr, bytes ? bytes : 1);
    if (e != cudaSuccess) {
        size_t f = 0, t = 0;
        cudaGetLastError();
        cudaMemGetInfo(&f, &t);
        snprintf(ctx->err, sizeof ctx->err,
                 "CUDA: allocating %.1f MiB of device memory for %s failed: %s (%.1f of %.1f MiB free); "
                 "lower --vram-budget or --max-context",
                 bytes / 1048576.0, what, cudaGetErrorString(e), f / 1048576.0, t / 1048576.0);
        return STRATA_ERR_DEVICE;
    }
    if (ctx->n_alloc == ctx->cap_alloc) { /* the table grows; allocations are few (per layer, per buffer) */
        const int32_t cap = ctx->cap_alloc ? 2 * ctx->cap_alloc : 256;
        void **p = (void **)realloc(ctx->alloc_ptr, (size_t)cap * sizeof *p);
        if (p) ctx->alloc_ptr = p;
        size_t *z = (size_t *)realloc(ctx->alloc_size, (size_t)cap * sizeof *z);
        if (z) ctx->alloc_size = z;
        if (!p || !z) {
            cudaFree(*dptr);
            *dptr = NULL;
            snprintf(ctx->err, sizeof ctx->err, "CUDA: out of host memory recording a device allocation");
            return STRATA_ERR_OUT_OF_MEMORY;
        }
        ctx->cap_alloc = cap;
    }
    ctx->alloc_ptr[ctx->n_alloc] = *dptr;
    ctx->alloc_size[ctx->n_alloc++] = bytes;
    ctx->bytes_now += (int64_t)bytes;
    if (ctx->bytes_now > ctx->bytes_peak) ctx->bytes_peak = ctx->bytes_now;
    return STRATA_OK;
}

void cuda_free(cuda_ctx *ctx, void *dptr) {
    if (!dptr) return;
    cudaFree(dptr);
    for (int32_t i = 0; ctx && i < ctx->n_alloc; i++)
        if (ctx->alloc_ptr[i] == dptr) {
            ctx->bytes_now -= (int64_t)ctx->alloc_size[i];
            ctx->alloc_ptr[i] = ctx->alloc_ptr[--ctx->n_alloc];
            ctx->alloc_size[i] = ctx->alloc_size[ctx->n_alloc];
            break;
        }
}

void cuda_mem_held(const cuda_ctx *ctx, int64_t *now, int64_t *peak) {
    *now = ctx ? ctx->bytes_now : 0;
    *peak = ctx ? ctx->bytes_peak : 0;
}

strata_status cuda_host_register(cuda_ctx *ctx, void *ptr, size_t bytes) {
    /* the model is mapped read-only: the pages can be locked only as read-only device-visible memory */
    int ro = 0;
    CU_TRY(ctx, cudaDeviceGetAttribute(&ro, cudaDevAttrHostRegisterReadOnlySupported, ctx->device),
           "asking whether the device reads registered read-only host memory");
    if (!ro) {
        snprintf(ctx->err, sizeof ctx->err,
                 "CUDA: this device or driver cannot register read-only host memory "
                 "(cudaDevAttrHostRegisterReadOnlySupported is 0)");
        return STRATA_ERR_DEVICE;
    }
    cudaError_t e = cudaHostRegister(ptr, bytes, cudaHostRegisterReadOnly | cudaHostRegisterPortable);
    if (e != cudaSuccess) {
        cudaGetLastError(); /* not sticky: the context stays usable and the caller falls back */
        return cuda_fail(ctx, e, "page-locking %.1f MiB of host memory", bytes / 1048576.0);
    }
    return STRATA_OK;
}

void cuda_host_unregister(cuda_ctx *ctx, void *ptr) {
    (void)ctx;
    if (ptr) {
        cudaHostUnregister(ptr);
        cudaGetLastError();
    }
}

strata_status cuda_host_alloc(cuda_ctx *ctx, size_t bytes, void **ptr) {
    CU_TRY(ctx, cudaMallocHost(ptr, bytes ? bytes : 1), "allocating %.1f MiB of pinned host memory",
           bytes / 1048576.0);
    return STRATA_OK;
}

void cuda_host_free(cuda_ctx *ctx, void *ptr) {
    (void)ctx;
    if (ptr) cudaFreeHost(ptr);
}

strata_status cuda_h2d(cuda_ctx *ctx, void *dst, const void *src, size_t bytes, int32_t stream) {
    CU_TRY(ctx, cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, ctx->stream[stream & 1]),
           "copying %zu bytes to the device", bytes);
    ctx->pdl_hold = 1;
    return STRATA_OK;
}

strata_status cuda_d2h(cuda_ctx *ctx, void *dst, const void *src, size_t bytes, int32_t stream) {
    CU_TRY(ctx, cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, ctx->stream[stream & 1]),
           "copying %zu bytes from the device", bytes);
    ctx->pdl_hold = 1;
    return STRATA_OK;
}

strata_status cuda_d2d(cuda_ctx *ctx, void *dst, const void *src, size_t bytes, int32_t stream) {
    CU_TRY(ctx, cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, ctx->stream[stream & 1]),
           "copying %zu bytes on the device", bytes);
    ctx->pdl_hold = 1;
    return STRATA_OK;
}

strata_status cuda_memset(cuda_ctx *ctx, void *dst, int value, size_t bytes) {
    CU_TRY(ctx, cudaMemsetAsync(dst, value, bytes, CU_COMPUTE(ctx)), "clearing %zu bytes", bytes);
    ctx->pdl_hold = 1;
    return STRATA_OK;
}

strata_status cuda_stream_order(cuda_ctx *ctx, int32_t from, int32_t to) {
    CU_TRY(ctx, cudaEventRecord(ctx->order_event, ctx->stream[from & 1]), "recording a stream event");
    CU_TRY(ctx, cudaStreamWaitEvent(ctx->stream[to & 1], ctx->order_event, 0), "ordering streams");
    ctx->pdl_hold = 1;
    return STRATA_OK;
}

strata_status cuda_event_create(cuda_ctx *ctx, void **ev) {
    cudaEvent_t x = NULL;
    CU_TRY(ctx, cudaEventCreateWithFlags(&x, cudaEventDisableTiming), "creating an event");
    *ev = (void *)x;
    return STRATA_OK;
}

strata_status cuda_event_record(cuda_ctx *ctx, void *ev, int32_t stream) {
    CU_TRY(ctx, cudaEventRecord((cudaEvent_t)ev, ctx->stream[stream & 1]), "recording an event");
    ctx->pdl_hold = 1;
    return STRATA_OK;
}

strata_status cuda_stream_wait(cuda_ctx *ctx, void *ev, int32_t stream) {
    CU_TRY(ctx, cudaStreamWaitEvent(ctx->stream[stream & 1], (cudaEvent_t)ev, 0), "ordering a stream after an event");
    ctx->pdl_hold = 1;
    return STRATA_OK;
}

strata_status cuda_event_wait(cuda_ctx *ctx, void *ev) {
    CU_TRY(ctx, cudaEventSynchronize((cudaEvent_t)ev), "waiting for an event");
    return STRATA_OK;
}

strata_status cuda_event_done(cuda_ctx *ctx, void *ev, int32_t *done) {
    const cudaError_t e = cudaEventQuery((cudaEvent_t)ev);
    *done = e == cudaSuccess;
    if (e == cudaSuccess || e == cudaErrorNotReady) {
        if (e == cudaErrorNotReady) (void)cudaGetLastError(); /* not an error: clear it */
        return STRATA_OK;
    }
    CU_TRY(ctx, e, "asking whether an event has passed");
    return STRATA_OK;
}

strata_status cuda_stream_sync(cuda_ctx *ctx, int32_t stream) {
    CU_TRY(ctx, cudaStreamSynchronize(ctx->stream[stream & 1]), "waiting for a stream");
    return STRATA_OK;
}

void cuda_event_free(void *ev) {
    if (ev) cudaEventDestroy((cudaEvent_t)ev);
}

strata_status cuda_capture_begin(cuda_ctx *ctx) {
    /* relaxed: nothing else in the process is enqueueing legacy-stream work meanwhile */
    CU_TRY(ctx, cudaStreamBeginCapture(CU_COMPUTE(ctx), cudaStreamCaptureModeRelaxed), "starting a graph capture");
    return STRATA_OK;
}

strata_status cuda_capture_end(cuda_ctx *ctx, void **exec) {
    *exec = NULL;
    cudaGraph_t graph = NULL;
    cudaError_t e = cudaStreamEndCapture(CU_COMPUTE(ctx), &graph);
    if (e != cudaSuccess) {
        if (graph) cudaGraphDestroy(graph);
        cudaGetLastError(); /* a capture error is not sticky: the stream stays usable */
        return cuda_fail(ctx, e, "capturing a graph");
    }
    cudaGraphExec_t x = NULL;
    e = cudaGraphInstantiate(&x, graph, 0);
    cudaGraphDestroy(graph);
    if (e != cudaSuccess) {
        cudaGetLastError();
        return cuda_fail(ctx, e, "instantiating a graph");
    }
    *exec = (void *)x;
    return STRATA_OK;
}

strata_status cuda_graph_launch(cuda_ctx *ctx, void *exec) {
    CU_TRY(ctx, cudaGraphLaunch((cudaGraphExec_t)exec, CU_COMPUTE(ctx)), "launching a graph");
    return STRATA_OK;
}

void cuda_graph_free(void *exec) {
    if (exec) cudaGraphExecDestroy((cudaGraphExec_t)exec);
}

strata_status cuda_sync(cuda_ctx *ctx) {
    CU_TRY(ctx, cudaStreamSynchronize(ctx->stream[1]), "waiting for the copy stream");
    CU_TRY(ctx, cudaStreamSynchronize(ctx->stream[0]), "waiting for the compute stream");
    return STRATA_OK;
}

} /* extern "C" */
