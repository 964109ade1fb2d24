/*
 * threads.h — a fixed pool of worker threads that run one parallel loop at a time.
 *
 * pool_run(pool, n_items, fn, ctx) calls fn(ctx, item, thread) for every item in [0, n_items) on
 * the pool's threads (the caller's thread takes part as thread 0) and returns when all are done.
 * Items are handed out dynamically, so the engine splits only work whose result does not depend
 * on which thread does it (output rows, attention heads): never a reduction.
 */
#ifndef STRATA_THREADS_H
#define STRATA_THREADS_H

#include <stdint.h>

#include "error.h"

typedef struct pool pool;
typedef void (*pool_fn)(void *ctx, int64_t item, int thread);

/* n_threads >= 1 (the caller counts as one). */
strata_status pool_create(int n_threads, pool **out, errbuf *err);
void pool_destroy(pool *p);
int pool_size(const pool *p);
void pool_run(pool *p, int64_t n_items, pool_fn fn, void *ctx);
/* Cores of this machine that the process may use. */
int pool_cpu_count(void);

#endif
