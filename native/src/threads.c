/*
 * threads.c — the worker pool (see threads.h).
 *
 * A job is published by bumping a generation counter. Workers spin briefly on it (a decode step
 * issues a few hundred short jobs, and waking a sleeping thread costs more than the job itself),
 * then sleep on a condition variable. Items are taken from an atomic counter; the caller waits
 * until every worker has left the job before the next one is published.
 */
#include "threads.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define SPIN_ROUNDS 20000

struct pool {
    int n;                        /* threads including the caller */
    pthread_t *tid;               /* [n - 1] */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    _Atomic uint64_t gen;         /* bumped for every job */
    _Atomic int64_t next;         /* next item to take */
    _Atomic int busy;             /* workers still inside the job */
    _Atomic int quit;
    int64_t n_items;
    pool_fn fn;
    void *ctx;
};

typedef struct worker_arg {
    pool *p;
    int idx;
} worker_arg;

static void run_items(pool *p, int thread) {
    for (;;) {
        int64_t i = atomic_fetch_add_explicit(&p->next, 1, memory_order_relaxed);
        if (i >= p->n_items) break;
        p->fn(p->ctx, i, thread);
    }
}

static void *worker_main(void *arg) {
    worker_arg wa = *(worker_arg *)arg;
    free(arg);
    pool *p = wa.p;
    uint64_t seen = 0;
    for (;;) {
        uint64_t g;
        int spins = 0;
        while ((g = atomic_load_explicit(&p->gen, memory_order_acquire)) == seen && !atomic_load(&p->quit)) {
            if (++spins < SPIN_ROUNDS) {
#if defined(__x86_64__)
                __builtin_ia32_pause();
#endif
                continue;
            }
            pthread_mutex_lock(&p->mu);
            while (atomic_load(&p->gen) == seen && !atomic_load(&p->quit)) pthread_cond_wait(&p->cv, &p->mu);
            pthread_mutex_unlock(&p->mu);
        }
        if (atomic_load(&p->quit)) return NULL;
        seen = g;
        run_items(p, wa.idx);
        atomic_fetch_sub_explicit(&p->busy, 1, memory_order_release);
    }
}

int pool_cpu_count(void) {
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) == 0) {
        int n = CPU_COUNT(&set);
        if (n > 0) return n;
    }
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (int)n : 1;
}

strata_status pool_create(int n_threads, pool **out, errbuf *err) {
    *out = NULL;
    if (n_threads < 1) n_threads = 1;
    pool *p = calloc(1, sizeof *p);
    if (!p) return err_set(err, STRATA_ERR_OUT_OF_MEMORY, "out of host memory creating the thread pool");
    p->n = n_threads;
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->cv, NULL);
    p->tid = calloc((size_t)n_threads, sizeof *p->tid);
    if (!p->tid) {
        pool_destroy(p);
        return err_set(err, STRATA_ERR_OUT_OF_MEMORY, "out of host memory creating the thread pool");
    }
    for (int i = 1; i < n_threads; i++) {
        worker_arg *wa = malloc(sizeof *wa);
        if (!wa || pthread_create(&p->tid[i - 1], NULL, worker_main, (wa->p = p, wa->idx = i, wa)) != 0) {
            free(wa);
            p->n = i; /* threads 1..i-1 exist */
            pool_destroy(p);
            return err_set(err, STRATA_ERR_OUT_OF_MEMORY,
                           "could not start worker thread %d of %d; try fewer --threads", i, n_threads);
        }
    }
    *out = p;
    return STRATA_OK;
}

void pool_destroy(pool *p) {
    if (!p) return;
    pthread_mutex_lock(&p->mu);
    atomic_store(&p->quit, 1);
    pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&p->mu);
    for (int i = 1; i < p->n; i++) pthread_join(p->tid[i - 1], NULL);
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->cv);
    free(p->tid);
    free(p);
}

int pool_size(const pool *p) { return p ? p->n : 1; }

void pool_run(pool *p, int64_t n_items, pool_fn fn, void *ctx) {
    if (n_items <= 0) return;
    if (!p || p->n == 1 || n_items == 1) {
        for (int64_t i = 0; i < n_items; i++) fn(ctx, i, 0);
        return;
    }
    p->fn = fn;
    p->ctx = ctx;
    p->n_items = n_items;
    atomic_store_explicit(&p->next, 0, memory_order_relaxed);
    atomic_store_explicit(&p->busy, p->n - 1, memory_order_relaxed);
    pthread_mutex_lock(&p->mu);
    atomic_fetch_add_explicit(&p->gen, 1, memory_order_release);
    pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&p->mu);
    run_items(p, 0);
    while (atomic_load_explicit(&p->busy, memory_order_acquire) > 0) {
#if defined(__x86_64__)
        __builtin_ia32_pause();
#endif
    }
}
