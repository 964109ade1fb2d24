/*
 * cache.h — the expert cache: a slab of equal slots, a residency table (layer, expert) -> slot, the
 * decode policy that learns which experts to keep, and the loan of the slab's tail to the prompt path.
 *
 * Slots [0, n_usable) serve lookups; during a prompt the tail [n_usable, n_slots) is on loan and holds
 * the prompt path's ring and buffers. Lent slots are taken out of the residency table and put back,
 * expert for expert, by the refill.
 *
 * Layers are the model's: every call takes a model layer in [layer0, layer0 + n_layer); an id is
 * (layer - layer0) * E + expert. A device of a layer split has a cache of its own layers only.
 *
 * Policies (decode only; the prompt path never changes what is cached):
 *   adaptive  every lookup adds 1 to the expert's routing count; every adapt_every tokens the counts
 *             are multiplied by adapt_decay and up to adapt_swaps experts whose count beats the
 *             weakest resident's are brought in. With miss=copy a miss is also copied into the slot of
 *             the weakest resident.
 *   lru       every miss is brought in over the least recently used slot (counted as a swap); with
 *             miss=host the token's math still runs from host memory.
 * A slot used by the current layer step is pinned (never a victim), so a step's K experts can be
 * fetched first and computed together.
 */
#ifndef STRATA_CACHE_H
#define STRATA_CACHE_H

#include <stddef.h>
#include <stdint.h>

#include "error.h"

/* Copy expert (layer, expert) — gate, up, down — from host memory into dst[slot_bytes]; returns the
 * bytes copied. */
typedef int64_t (*cache_copy_fn)(void *ctx, int32_t layer, int32_t expert, uint8_t *dst);

typedef struct expert_cache {
    int32_t n_slots;          /* slots in the slab */
    int32_t n_layer;          /* layers it serves, all with experts: the model's [layer0, layer0 + n_layer) */
    int32_t layer0;           /* the model layer of the cache's layer 0: the first with experts (dense leading
                               * layers have none), or a later device's first layer on a layer split */
    int32_t moe_first;        /* the model's first layer with experts (profiles name model layers) */
    int32_t n_layer_model;    /* layers of the model */
    int32_t n_expert;         /* E */
    int64_t slot_bytes;
    uint8_t *slab;            /* [n_slots, slot_bytes], not owned (device arena) */
    int32_t *slot_of;         /* [n_layer * E] slot or -1 */
    int32_t *expert_in;       /* [n_slots] layer * E + expert, or -1 */
    float *score;             /* [n_layer * E] decayed routing counts */
    uint64_t *last_use;       /* [n_slots] LRU clock of the last hit or fill */
    uint32_t *pin;            /* [n_slots] == stamp: used by the current layer step */
    uint32_t stamp;
    uint64_t clock;
    int32_t n_usable;         /* slots serving lookups; the rest are on loan */
    int32_t *displaced;       /* [n_slots] expert that slot n_usable + i held before the loan, or -1 */
    int32_t policy;           /* strata_cache_policy */
    int32_t miss;             /* strata_miss_policy (HOST, COPY or READ: READ admits as HOST does) */
    int32_t adapt_every;
    int32_t adapt_swaps;
    float adapt_decay;
    int32_t tokens_since;     /* decode tokens since the last adaptation */
    cache_copy_fn copy;
    void *copy_ctx;
    /* counters */
    uint64_t lookups, hits, misses, swaps, bytes_copied, host_runs, reads;
} expert_cache;

typedef struct cache_config {
    int32_t policy, miss, adapt_every, adapt_swaps;
    float adapt_decay;
} cache_config;

strata_status cache_init(expert_cache *c, uint8_t *slab, int32_t n_slots, int64_t slot_bytes, int32_t n_layer,
                         int32_t n_expert, const cache_config *cfg, cache_copy_fn copy, void *copy_ctx, errbuf *err);
void cache_free(expert_cache *c);
/* The cache serves the model's layers [layer0, layer0 + c->n_layer) of n_layer_model, whose layers with
 * experts start at moe_first (cache_init: all, from 0). */
void cache_set_layers(expert_cache *c, int32_t layer0, int32_t moe_first, int32_t n_layer_model);

/* Fill empty slots, in order, with the ranked ids (layer * E + expert); ids already resident are
 * skipped. Returns the number of experts placed. */
int32_t cache_fill_ranked(expert_cache *c, const int32_t *ids, int32_t n);
/* Fill every empty slot with an even spread: rank r is layer r % n_layer, expert r / n_layer. */
int32_t cache_fill_default(expert_cache *c);
/* Read a profile ("layer expert score" per line, best first, '#' comments) and fill the cache with it
 * (lines of layers another device serves are skipped). IO when the file cannot be read, FORMAT with the line number when a line is malformed or out of range. */
strata_status cache_profile_load(expert_cache *c, const char *path, errbuf *err);
/* Write every expert ranked by learned count (residents first on ties). */
strata_status cache_profile_save(const expert_cache *c, const char *path, errbuf *err);
/* The same over the caches of a split's n devices, one ranking of every expert of the model. */
strata_status cache_profile_save_all(const expert_cache *const *cs, int32_t n, const char *path, errbuf *err);

/* Start a layer step (unpins the previous step's slots). */
void cache_step_begin(expert_cache *c);
/* Decode lookup of (layer, expert): the slot to run from, or -1 to run from host memory. */
int32_t cache_decode_lookup(expert_cache *c, int32_t layer, int32_t expert);
/* The same lookup with this lookup's miss policy given (STRATA_MISS_HOST, _COPY or _READ): a backend
 * that splits one step's misses between the host and copies (--miss auto on CUDA), or counts a step the
 * device routed and whose misses it read from the host store (READ: counted in reads, not host_runs). */
int32_t cache_decode_lookup_as(expert_cache *c, int32_t layer, int32_t expert, int32_t miss);
/* The slot of (layer, expert) when it is resident in a usable slot, else -1 (no counting). */
int32_t cache_peek(const expert_cache *c, int32_t layer, int32_t expert);
/* Experts resident in usable slots. */
int32_t cache_resident(const expert_cache *c);
/* Prefill lookup: the slot when resident (and usable), else -1 (the caller streams it through the ring). */
int32_t cache_prefill_lookup(expert_cache *c, int32_t layer, int32_t expert);
/* One decode token finished: adapt when it is time. */
void cache_token_done(expert_cache *c);

/* Lend the last k slots (0 < k <= n_slots): they leave the residency table. Returns their first byte. */
uint8_t *cache_lend(expert_cache *c, int32_t k);
/* Give the loan back: copy every displaced expert back into its slot. Returns the slots refilled. */
int32_t cache_refill(expert_cache *c);
/* Slots on loan now. */
int32_t cache_lent(const expert_cache *c);

/* Slot memory. */
static inline uint8_t *cache_slot_ptr(const expert_cache *c, int32_t slot) {
    return c->slab + (size_t)slot * (size_t)c->slot_bytes;
}

#endif
