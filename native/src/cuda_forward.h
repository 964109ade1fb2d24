/* cuda_forward.h — the CUDA backend's open and close (cuda/host_memory.c); the rest of it is reached through
 * cuda_backend_ops (engine_internal.h), the same seam the CPU backend implements. */
#ifndef STRATA_CUDA_FORWARD_H
#define STRATA_CUDA_FORWARD_H

#include <stdint.h>

#include "strata.h"

struct strata_engine;
typedef struct cuda_state cuda_state;

/* Create the device context (e->gpu) and report the free device memory the plan may use. */
strata_status cuda_forward_init(struct strata_engine *e, int64_t *free_bytes);
/* Device bytes of the decode scratch: layout(1) and the decode step's tables (the plan's scratch). */
int64_t cuda_forward_scratch_bytes(const struct strata_engine *e);
/* After the plan, in its order: the resident weights, the KV cache, the decode scratch and the slab of the
 * plan's slots (*slab, for the expert cache), and the expert store in host memory. */
strata_status cuda_forward_open(struct strata_engine *e, uint8_t **slab);
/* After the expert cache was filled (its copies enqueued since t_fill, engine_now_ms): wait for them,
 * time them, and route decode on the device when every expert is resident. */
strata_status cuda_forward_ready(struct strata_engine *e, double t_fill);
void cuda_forward_close(struct strata_engine *e);
/* Device memory the backend holds now and at most since open (0, 0 without a device). */
void cuda_forward_mem_held(const struct strata_engine *e, int64_t *now, int64_t *peak);

#endif
