/* cuda_forward.h — the forward pass on the GPU (cuda_forward.c), called by engine.c when the engine
 * runs on --device cuda. */
#ifndef STRATA_CUDA_FORWARD_H
#define STRATA_CUDA_FORWARD_H

#include <stdint.h>

#include "strata.h"

struct strata_engine;
typedef struct cuda_state cuda_state;

/* Create the device context (e->gpu) and report the free device memory the plan may use. */
strata_status cuda_forward_init(struct strata_engine *e, int64_t *free_bytes);
/* After the plan: upload the resident weights, allocate the KV cache and the work buffers for the
 * plan's chunk, and an expert cache of n_slots slots filled with an even spread over the layers. */
strata_status cuda_forward_open(struct strata_engine *e, int32_t n_slots);
/* Device bytes of the work buffers for a chunk of T tokens. */
int64_t cuda_forward_work_bytes(const struct strata_engine *e, int32_t T);
void cuda_forward_close(struct strata_engine *e);
/* Run T tokens at positions pos0.. through every layer; the logits of the last when want_logits. */
/* prompt: a chunk of a prompt (engine_prefill), not a decode step, whatever T is. */
strata_status cuda_forward(struct strata_engine *e, const int32_t *tokens, int32_t T, int32_t pos0, int prompt,
                           int want_logits);
/* Slot of an expert in the device cache, or -1. */
int32_t cuda_forward_slot_of(const struct strata_engine *e, int32_t layer, int32_t expert);
/* Slots in the device cache. */
int32_t cuda_forward_n_slots(const struct strata_engine *e);
/* Device memory the backend holds now and at most since open (0, 0 without a device). */
void cuda_forward_mem_held(const struct strata_engine *e, int64_t *now, int64_t *peak);

#endif
