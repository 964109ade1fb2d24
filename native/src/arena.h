/*
 * arena.h — the device budget: a bump allocator over one block of memory.
 *
 * On the CPU backend a host block stands in for device memory, so that the plan, the expert cache,
 * the loan and the relayout all run (and are tested) without a GPU; on CUDA the same allocator hands
 * out offsets of one device allocation. Three kinds of arenas are used:
 *   - the device arena: the whole --vram-budget (resident part, KV, decode scratch, the slab of slots);
 *   - a loan arena: laid over the slots the cache lends to one prompt (its ring and chunk buffers);
 *   - a measuring arena: no memory at all; it only adds up what a layout would take (layout(T)).
 * An arena never exits and never frees a single buffer: it is reset as a whole. The first failure is
 * recorded (what, how much, how much was free) so that the message names the failing buffer.
 */
#ifndef STRATA_ARENA_H
#define STRATA_ARENA_H

#include <stddef.h>
#include <stdint.h>

/* Every buffer starts on a 64-byte boundary (a cache line; AVX-512 loads). Slot bytes are multiples of
 * 256, so an arena laid over slots keeps this alignment for every buffer it hands out. */
#define ARENA_ALIGN 64

typedef struct arena {
    uint8_t *base;      /* first byte; NULL for a measuring arena */
    int64_t cap;        /* bytes */
    int64_t used;       /* bytes handed out, padding included */
    int32_t n_allocs;   /* buffers handed out since the last reset */
    int32_t failed;     /* 1 after the first failure since the last reset */
    int64_t fail_want;  /* bytes the failing buffer wanted */
    int64_t fail_free;  /* bytes free at the failure */
    char fail_what[40]; /* name of the failing buffer */
} arena;

/* An arena over [base, base + cap). base must be ARENA_ALIGN-aligned. */
void arena_init(arena *a, void *base, int64_t cap);
/* A measuring arena: no memory, no limit. Its pointers are placeholders that must not be touched. */
void arena_init_measure(arena *a);
/* A buffer of bytes (>= 0), aligned to ARENA_ALIGN; NULL when it does not fit (the failure is recorded). */
void *arena_alloc(arena *a, int64_t bytes, const char *what);
/* Forget every buffer (and the failure). */
void arena_reset(arena *a);
/* Bytes still free. */
int64_t arena_free_bytes(const arena *a);
/* Bytes a buffer of n bytes takes in an arena (n rounded up to ARENA_ALIGN). */
int64_t arena_size_of(int64_t bytes);
/* The message of a failed chunk layout, in the one shape every caller and the harnesses parse:
 * "prefill: device buffers for a chunk of N tokens do not fit (X of Y MiB free at the failure;
 *  Z MiB taken, the failing buffer wanted W MiB)". Writes "" when the arena has not failed. */
void arena_chunk_fail_msg(const arena *a, int32_t n_tokens, char *buf, size_t len);
/* The same message with a real device's figures (an arena over device memory): X of Y are the free and
 * total bytes the device's allocator reports, Z what the arena's buffers took before the failure. */
void arena_chunk_fail_msg_device(const arena *a, int32_t n_tokens, int64_t dev_free, int64_t dev_total, char *buf,
                                 size_t len);

#endif
