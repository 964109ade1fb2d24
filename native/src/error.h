/*
 * error.h — how failures travel inside the engine.
 *
 * Every function that can fail returns a strata_status and writes its message into an errbuf that
 * the caller owns (the engine's, or the err buffer of strata_engine_open). The library never exits
 * or aborts: broken internal invariants go through STRATA_ASSERT, which reports STRATA_ERR_INTERNAL
 * with the file, line and the condition, through the same path as any other failure.
 */
#ifndef STRATA_ERROR_H
#define STRATA_ERROR_H

#include "strata.h"

typedef struct errbuf {
    strata_status status; /* last status written */
    char msg[1024];       /* its message, NUL-terminated */
} errbuf;

/* Write a message (printf format) and return s, so that callers can `return err_set(...)`. */
strata_status err_set(errbuf *e, strata_status s, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* Put context in front of the message already in e ("layer 3: " + old message); returns e->status. */
strata_status err_prefix(errbuf *e, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void err_clear(errbuf *e);

/* The one assert of the engine: reports a bug as STRATA_ERR_INTERNAL instead of aborting. */
#define STRATA_ASSERT(err, cond)                                                                                       \
    do {                                                                                                               \
        if (!(cond))                                                                                                   \
            return err_set((err), STRATA_ERR_INTERNAL,                                                                 \
                           "internal error at %s:%d: '%s' does not hold (a bug in strata; please "                     \
                           "report it with the model file's name and the flags used)",                                 \
                           __FILE__, __LINE__, #cond);                                                                 \
    } while (0)

/* Propagate a failing status unchanged. */
#define STRATA_TRY(expr)                                                                                               \
    do {                                                                                                               \
        strata_status try_s_ = (expr);                                                                                 \
        if (try_s_ != STRATA_OK) return try_s_;                                                                        \
    } while (0)

#endif
