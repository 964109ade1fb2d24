/* cuda_forward.h — the forward pass on the GPU (cuda_forward.c), called by engine.c when the engine
 * runs on --device cuda. */
#ifndef STRATA_CUDA_FORWARD_H
#define STRATA_CUDA_FORWARD_H

#include <stdint.h>

#include "strata.h"

struct strata_engine;
typedef struct cuda_state cuda_state;

/* Upload the resident weights, allocate the KV cache and the work buffers, and fill an expert cache
 * of the slots that fit: min(expert_cache if > 0, what the budget leaves). budget: bytes of device
 * memory to plan for (0 = the device's free memory). */
strata_status cuda_forward_open(struct strata_engine *e, int64_t budget, int32_t expert_cache);
void cuda_forward_close(struct strata_engine *e);
/* Run T tokens at positions pos0.. through every layer; the logits of the last when want_logits. */
strata_status cuda_forward(struct strata_engine *e, const int32_t *tokens, int32_t T, int32_t pos0, int want_logits);
/* Slot of an expert in the device cache, or -1. */
int32_t cuda_forward_slot_of(const struct strata_engine *e, int32_t layer, int32_t expert);
/* Slots in the device cache. */
int32_t cuda_forward_n_slots(const struct strata_engine *e);

#endif
