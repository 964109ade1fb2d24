/*
 * threads.c — the worker pool (see threads.h).
 *
 * One word of state holds the job's generation (high 32 bits) and the next item to take (low 32
 * bits). A thread takes an item with a compare-and-swap that also checks the generation, so a worker
 * that wakes up late, after its job is over, can never take an item of the next job with the
 * previous job's function: its swap fails. The caller takes items too and then waits only for items
 * that were actually taken to be finished, never for a worker to wake up: on a machine busier than
 * its cores (CI runners, shared hosts) a descheduled worker costs nothing but its own share.
 *
 * Workers spin briefly between jobs (a decode step issues hundreds of short jobs, and waking a
 * sleeping thread costs more than most of them), then sleep on a condition variable.
 */
#include "threads.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define SPIN_ROUNDS 50000 /* pauses before a worker sleeps (on the order of a millisecond) */
#define YIELD_EVERY 256   /* spinning threads yield this often, so an overloaded host can run others */

typedef struct job_slot {
    _Atomic(pool_fn) fn;
    _Atomic(void *) ctx;
    _Atomic int64_t n_items;
} job_slot;

struct pool {
    int n;          /* threads including the caller */
    pthread_t *tid; /* [n - 1] */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    _Atomic uint64_t state; /* generation << 32 | next item */
    _Atomic int64_t done;   /* items of the current job finished */
    _Atomic int sleepers;   /* workers waiting on cv */
    _Atomic int quit;
    /* Job descriptions alternate between two slots: slot gen & 1 is rewritten only for job gen + 2,
     * which cannot start before every item of job gen is finished. */
    job_slot slot[2];
};

typedef struct worker_arg {
    pool *p;
    int idx;
} worker_arg;

static inline void cpu_relax(void) {
#if defined(__x86_64__)
    __builtin_ia32_pause();
#endif
}

/* Take an item of job gen, or -1 when it has none left (or is no longer the current job). */
static inline int64_t claim(pool *p, uint32_t gen, int64_t n_items) {
    uint64_t s = atomic_load_explicit(&p->state, memory_order_acquire);
    for (;;) {
        if ((uint32_t)(s >> 32) != gen || (int64_t)(uint32_t)s >= n_items) return -1;
        if (atomic_compare_exchange_weak_explicit(&p->state, &s, s + 1, memory_order_acq_rel, memory_order_acquire))
            return (int64_t)(uint32_t)s;
    }
}

static void run_job(pool *p, uint32_t gen, int thread) {
    const job_slot *js = &p->slot[gen & 1];
    pool_fn fn = atomic_load_explicit(&js->fn, memory_order_relaxed);
    void *ctx = atomic_load_explicit(&js->ctx, memory_order_relaxed);
    int64_t n = atomic_load_explicit(&js->n_items, memory_order_relaxed);
    /* If the job has moved on, these values may be stale; claim() then fails and nothing runs. */
    for (int64_t i; (i = claim(p, gen, n)) >= 0;) {
        fn(ctx, i, thread);
        atomic_fetch_add_explicit(&p->done, 1, memory_order_release);
    }
}

static void *worker_main(void *arg) {
    worker_arg wa = *(worker_arg *)arg;
    free(arg);
    pool *p = wa.p;
    uint32_t seen = 0;
    for (;;) {
        int spins = 0;
        while ((uint32_t)(atomic_load(&p->state) >> 32) == seen && !atomic_load(&p->quit)) {
            if (++spins < SPIN_ROUNDS) {
                cpu_relax();
                if (spins % YIELD_EVERY == 0) sched_yield();
                continue;
            }
            pthread_mutex_lock(&p->mu);
            atomic_fetch_add(&p->sleepers, 1);
            while ((uint32_t)(atomic_load(&p->state) >> 32) == seen && !atomic_load(&p->quit))
                pthread_cond_wait(&p->cv, &p->mu);
            atomic_fetch_sub(&p->sleepers, 1);
            pthread_mutex_unlock(&p->mu);
        }
        if (atomic_load(&p->quit)) return NULL;
        seen = (uint32_t)(atomic_load(&p->state) >> 32);
        run_job(p, seen, wa.idx);
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
    p->n = 1;
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->cv, NULL);
    p->tid = calloc((size_t)n_threads, sizeof *p->tid);
    if (!p->tid) {
        pool_destroy(p);
        return err_set(err, STRATA_ERR_OUT_OF_MEMORY, "out of host memory creating the thread pool");
    }
    for (int i = 1; i < n_threads; i++) {
        worker_arg *wa = malloc(sizeof *wa);
        if (wa) *wa = (worker_arg){p, i};
        if (!wa || pthread_create(&p->tid[i - 1], NULL, worker_main, wa) != 0) {
            free(wa);
            pool_destroy(p); /* joins the p->n - 1 workers started so far */
            return err_set(err, STRATA_ERR_OUT_OF_MEMORY, "could not start worker thread %d of %d; try fewer --threads",
                           i, n_threads);
        }
        p->n = i + 1;
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
    if (!p || p->n == 1 || n_items == 1 || n_items >= (int64_t)UINT32_MAX) {
        for (int64_t i = 0; i < n_items; i++) fn(ctx, i, 0);
        return;
    }
    uint32_t gen = (uint32_t)(atomic_load(&p->state) >> 32) + 1;
    if (gen == 0) gen = 1; /* 0 is the workers' "nothing seen yet" */
    job_slot *js = &p->slot[gen & 1];
    atomic_store_explicit(&js->fn, fn, memory_order_relaxed);
    atomic_store_explicit(&js->ctx, ctx, memory_order_relaxed);
    atomic_store_explicit(&js->n_items, n_items, memory_order_relaxed);
    atomic_store_explicit(&p->done, 0, memory_order_relaxed);
    atomic_store(&p->state, (uint64_t)gen << 32); /* publishes the slot (seq_cst: pairs with sleepers) */
    if (atomic_load(&p->sleepers) > 0) {
        pthread_mutex_lock(&p->mu);
        pthread_cond_broadcast(&p->cv);
        pthread_mutex_unlock(&p->mu);
    }
    run_job(p, gen, 0);
    /* every item is taken; wait for the ones other threads are still running */
    for (int spins = 0; atomic_load_explicit(&p->done, memory_order_acquire) < n_items;) {
        cpu_relax();
        if (++spins % YIELD_EVERY == 0) sched_yield();
    }
}
