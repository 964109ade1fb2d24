/*
 * prefill.c — reading a prompt: chunk-major forward passes inside the slots the expert cache lends
 * (memory.c's mem_lend and mem_give_back), with the context rolled back when a chunk fails.
 */
#include "engine_internal.h"

/* ---- prefill ------------------------------------------------------------------------------------ */

strata_status engine_prefill(strata_engine *e, const int32_t *tokens, int32_t n, strata_progress_fn progress,
                             void *user) {
    if (n < 0 || (n > 0 && !tokens))
        return err_set(&e->err, STRATA_ERR_INVALID_ARGUMENT, "prefill: no tokens given");
    if (n == 0) return STRATA_OK;
    for (int32_t i = 0; i < n; i++)
        if (tokens[i] < 0 || tokens[i] >= e->hp.n_vocab)
            return err_set(&e->err, STRATA_ERR_INVALID_ARGUMENT,
                           "token %d at position %d is not in the vocabulary (0..%d)", tokens[i], i, e->hp.n_vocab - 1);
    if ((int64_t)e->n_past + n > e->n_ctx)
        return err_set(&e->err, STRATA_ERR_CONTEXT,
                       "the prompt does not fit in the context: %d tokens already in it + %d new > %d "
                       "(raise --max-context or shorten the prompt)",
                       e->n_past, n, e->n_ctx);
    const int32_t start = e->n_past;
    double t0 = engine_now_ms();
    int32_t t = mem_request_chunk(e, n); /* the devices' smallest */
    strata_status s = mem_lend(e, &t);
    if (s != STRATA_OK) {
        mem_give_back(e);
        mem_sync_stats(e);
        return s;
    }
    e->stats.state = 1;
    e->stats.prompt_done = 0;
    e->stats.prompt_total = n;
    e->stats.last_chunk = t;
    e->prompt_progress = progress;
    e->prompt_user = user;
    e->prompt_total = n;
    for (int32_t done = 0; done < n;) {
        int32_t T = n - done < t ? n - done : t;
        e->prompt_done = done;
        s = engine_forward(e, tokens + done, T, MOE_PHASE_PREFILL, done + T == n);
        if (s != STRATA_OK) break;
        e->n_past += T;
        done += T;
        e->stats.prompt_done = done;
        if (progress && progress(user, done, n) != 0 && done < n) {
            s = err_set(&e->err, STRATA_ERR_CANCELLED, "prefill cancelled after %d of %d prompt tokens", done, n);
            break;
        }
    }
    e->prompt_progress = NULL;
    e->prompt_user = NULL;
    const strata_status sg = mem_give_back(e);
    if (s == STRATA_OK) s = sg;
    if (s != STRATA_OK) {
        /* roll back: the cache rows past start are simply forgotten */
        e->n_past = start;
        e->has_logits = 0;
    } else {
        e->stats.prompt_tokens += n;
    }
    e->stats.prompt_ms += engine_now_ms() - t0;
    e->stats.state = 0;
    e->stats.n_past = e->n_past;
    mem_sync_stats(e);
    return s;
}
