/* arena.c — the bump allocator that stands in for device memory (see arena.h). */
#include "arena.h"

#include <stdio.h>
#include <string.h>

/* Measuring arenas hand out this one placeholder: non-NULL (so callers' NULL checks pass) and aligned.
 * Nothing may write to it; chunk_buffers_alloc only stores pointers. */
static _Alignas(ARENA_ALIGN) uint8_t measure_placeholder[ARENA_ALIGN];

#define MEASURE_CAP ((int64_t)1 << 62)

void arena_init(arena *a, void *base, int64_t cap) {
    memset(a, 0, sizeof *a);
    a->base = (uint8_t *)base;
    a->cap = cap < 0 ? 0 : cap;
}

void arena_init_measure(arena *a) {
    memset(a, 0, sizeof *a);
    a->cap = MEASURE_CAP;
}

int64_t arena_size_of(int64_t bytes) { return (bytes + ARENA_ALIGN - 1) / ARENA_ALIGN * ARENA_ALIGN; }

void *arena_alloc(arena *a, int64_t bytes, const char *what) {
    if (!a || bytes < 0) return NULL;
    int64_t size = arena_size_of(bytes);
    /* written as a subtraction so that a huge request cannot overflow used + size */
    if (size > a->cap - a->used) {
        if (!a->failed) {
            a->failed = 1;
            a->fail_want = bytes;
            a->fail_free = a->cap - a->used;
            snprintf(a->fail_what, sizeof a->fail_what, "%s", what ? what : "buffer");
        }
        return NULL;
    }
    void *p = a->base ? (void *)(a->base + a->used) : (void *)measure_placeholder;
    a->used += size;
    a->n_allocs++;
    return p;
}

void arena_reset(arena *a) {
    a->used = 0;
    a->n_allocs = 0;
    a->failed = 0;
    a->fail_want = 0;
    a->fail_free = 0;
    a->fail_what[0] = '\0';
}

int64_t arena_free_bytes(const arena *a) { return a->cap - a->used; }

static double mib(int64_t b) { return (double)b / (1024.0 * 1024.0); }

void arena_chunk_fail_msg(const arena *a, int32_t n_tokens, char *buf, size_t len) {
    /* the emulated device: its free memory is the arena's at the failure, its total the arena */
    arena_chunk_fail_msg_device(a, n_tokens, a ? a->fail_free : 0, a ? a->cap : 0, buf, len);
}

void arena_chunk_fail_msg_device(const arena *a, int32_t n_tokens, int64_t dev_free, int64_t dev_total, char *buf,
                                 size_t len) {
    if (!buf || len == 0) return;
    if (!a || !a->failed) {
        buf[0] = '\0';
        return;
    }
    snprintf(buf, len,
             "prefill: device buffers for a chunk of %d tokens do not fit (%.1f of %.1f MiB free at the "
             "failure; %.1f MiB taken, the failing buffer wanted %.1f MiB)",
             n_tokens, mib(dev_free), mib(dev_total), mib(a->cap - a->fail_free), mib(a->fail_want));
}
