/* cache.c — the expert cache (see cache.h). Index arithmetic: id = layer * E + expert. */
#include "cache.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "strata.h"

strata_status cache_init(expert_cache *c, uint8_t *slab, int32_t n_slots, int64_t slot_bytes, int32_t n_layer,
                         int32_t n_expert, const cache_config *cfg, cache_copy_fn copy, void *copy_ctx, errbuf *err) {
    memset(c, 0, sizeof *c);
    if (n_slots < 0 || n_layer < 1 || n_expert < 1 || slot_bytes < 0)
        return err_set(err, STRATA_ERR_INVALID_ARGUMENT, "expert cache: bad shape (%d slots, %d layers, %d experts)",
                       n_slots, n_layer, n_expert);
    size_t n_ids = (size_t)n_layer * (size_t)n_expert;
    size_t ns = n_slots > 0 ? (size_t)n_slots : 1;
    c->slot_of = malloc(n_ids * sizeof *c->slot_of);
    c->score = calloc(n_ids, sizeof *c->score);
    c->expert_in = malloc(ns * sizeof *c->expert_in);
    c->last_use = calloc(ns, sizeof *c->last_use);
    c->pin = calloc(ns, sizeof *c->pin);
    c->displaced = malloc(ns * sizeof *c->displaced);
    if (!c->slot_of || !c->score || !c->expert_in || !c->last_use || !c->pin || !c->displaced) {
        cache_free(c);
        return err_set(err, STRATA_ERR_OUT_OF_MEMORY, "out of host memory for the expert cache's tables");
    }
    for (size_t i = 0; i < n_ids; i++) c->slot_of[i] = -1;
    for (size_t i = 0; i < ns; i++) c->expert_in[i] = c->displaced[i] = -1;
    c->n_slots = n_slots;
    c->n_usable = n_slots;
    c->n_layer = n_layer;
    c->layer0 = 0;
    c->moe_first = 0;
    c->n_layer_model = n_layer;
    c->n_expert = n_expert;
    c->slot_bytes = slot_bytes;
    c->slab = slab;
    c->policy = cfg->policy;
    /* read admits as host does: the miss ran from where it was, and only the policy brings it in */
    c->miss = cfg->miss == STRATA_MISS_COPY || cfg->miss == STRATA_MISS_READ ? cfg->miss : STRATA_MISS_HOST;
    c->adapt_every = cfg->adapt_every > 0 ? cfg->adapt_every : 16;
    c->adapt_swaps = cfg->adapt_swaps >= 0 ? cfg->adapt_swaps : 4;
    c->adapt_decay = cfg->adapt_decay >= 0 && cfg->adapt_decay <= 1 ? cfg->adapt_decay : 0.9f;
    c->stamp = 1;
    c->copy = copy;
    c->copy_ctx = copy_ctx;
    return STRATA_OK;
}

void cache_free(expert_cache *c) {
    free(c->slot_of);
    free(c->score);
    free(c->expert_in);
    free(c->last_use);
    free(c->pin);
    free(c->displaced);
    memset(c, 0, sizeof *c);
}

void cache_set_layers(expert_cache *c, int32_t layer0, int32_t moe_first, int32_t n_layer_model) {
    c->layer0 = layer0;
    c->moe_first = moe_first;
    c->n_layer_model = n_layer_model;
}

/* Put expert id into slot (which must be usable); whatever was there leaves the cache. */
static void place(expert_cache *c, int32_t slot, int32_t id) {
    int32_t old = c->expert_in[slot];
    if (old >= 0) c->slot_of[old] = -1;
    int64_t n = c->copy ? c->copy(c->copy_ctx, c->layer0 + id / c->n_expert, id % c->n_expert, cache_slot_ptr(c, slot)) : 0;
    c->bytes_copied += (uint64_t)(n > 0 ? n : 0);
    c->expert_in[slot] = id;
    c->slot_of[id] = slot;
    c->last_use[slot] = ++c->clock;
}

int32_t cache_fill_ranked(expert_cache *c, const int32_t *ids, int32_t n) {
    int32_t placed = 0, slot = 0;
    int32_t n_ids = c->n_layer * c->n_expert;
    for (int32_t i = 0; i < n; i++) {
        int32_t id = ids[i];
        if (id < 0 || id >= n_ids || c->slot_of[id] >= 0) continue;
        while (slot < c->n_usable && c->expert_in[slot] >= 0) slot++;
        if (slot >= c->n_usable) break;
        place(c, slot, id);
        placed++;
    }
    return placed;
}

int32_t cache_fill_default(expert_cache *c) {
    int32_t n_ids = c->n_layer * c->n_expert;
    int32_t n = n_ids < c->n_usable ? n_ids : c->n_usable;
    int32_t *ids = malloc((size_t)(n > 0 ? n : 1) * sizeof *ids);
    if (!ids) return 0;
    for (int32_t r = 0; r < n; r++) ids[r] = (r % c->n_layer) * c->n_expert + r / c->n_layer;
    int32_t placed = cache_fill_ranked(c, ids, n);
    free(ids);
    return placed;
}

/* ---- profiles ------------------------------------------------------------------------------------ */

strata_status cache_profile_load(expert_cache *c, const char *path, errbuf *err) {
    FILE *f = fopen(path, "r");
    if (!f)
        return err_set(err, STRATA_ERR_IO, "--expert-profile: cannot read %s: %s (write one with `strata profile save`)",
                       path, strerror(errno));
    int32_t n_ids = c->n_layer * c->n_expert;
    int32_t *ids = malloc((size_t)n_ids * sizeof *ids);
    if (!ids) {
        fclose(f);
        return err_set(err, STRATA_ERR_OUT_OF_MEMORY, "out of host memory reading %s", path);
    }
    int32_t n = 0, lineno = 0;
    char line[256];
    strata_status st = STRATA_OK;
    while (fgets(line, sizeof line, f)) {
        lineno++;
        char *s = line;
        while (*s == ' ' || *s == '\t') s++;
        if (*s == '#' || *s == '\n' || *s == '\r' || *s == '\0') continue;
        long layer, expert;
        double score;
        char tail[8];
        int got = sscanf(s, "%ld %ld %lf %7s", &layer, &expert, &score, tail);
        if (got < 2 || got > 3) {
            st = err_set(err, STRATA_ERR_FORMAT,
                         "--expert-profile %s line %d: expected 'layer expert [score]', got '%.60s'", path, lineno, s);
            break;
        }
        if (layer < c->moe_first || layer >= c->n_layer_model || expert < 0 || expert >= c->n_expert) {
            st = err_set(err, STRATA_ERR_FORMAT,
                         "--expert-profile %s line %d: layer %ld expert %ld is out of range (the model has %d layers "
                         "of %d experts from layer %d); was the profile saved for another model?",
                         path, lineno, layer, expert, c->n_layer_model - c->moe_first, c->n_expert, c->moe_first);
            break;
        }
        if (layer < c->layer0 || layer >= c->layer0 + c->n_layer) continue; /* another device's layer */
        if (n < n_ids) ids[n++] = (int32_t)((layer - c->layer0) * c->n_expert + expert);
    }
    if (st == STRATA_OK && ferror(f))
        st = err_set(err, STRATA_ERR_IO, "--expert-profile: error reading %s: %s", path, strerror(errno));
    fclose(f);
    if (st == STRATA_OK) {
        /* the profile decides the whole content: start from an empty cache */
        for (int32_t s = 0; s < c->n_usable; s++) {
            if (c->expert_in[s] >= 0) c->slot_of[c->expert_in[s]] = -1;
            c->expert_in[s] = -1;
        }
        cache_fill_ranked(c, ids, n);
        /* a profile's order is also a prior for the adaptive counts: earlier ranks start higher */
        for (int32_t i = 0; i < n; i++)
            if (c->score[ids[i]] == 0.0f) c->score[ids[i]] = (float)(n - i) / (float)n;
    }
    free(ids);
    return st;
}

typedef struct ranked {
    int32_t id;
    int32_t resident;
    float score;
} ranked;

static int ranked_cmp(const void *a, const void *b) {
    const ranked *x = a, *y = b;
    if (x->score != y->score) return x->score > y->score ? -1 : 1;
    if (x->resident != y->resident) return y->resident - x->resident;
    return x->id - y->id;
}

strata_status cache_profile_save(const expert_cache *c, const char *path, errbuf *err) {
    return cache_profile_save_all(&c, 1, path, err);
}

strata_status cache_profile_save_all(const expert_cache *const *cs, int32_t n_caches, const char *path, errbuf *err) {
    int32_t n_ids = 0;
    for (int32_t j = 0; j < n_caches; j++) n_ids += cs[j]->n_layer * cs[j]->n_expert;
    ranked *r = malloc((size_t)(n_ids > 0 ? n_ids : 1) * sizeof *r);
    if (!r) return err_set(err, STRATA_ERR_OUT_OF_MEMORY, "out of host memory saving the profile");
    int32_t n = 0;
    for (int32_t j = 0; j < n_caches; j++) {
        const expert_cache *c = cs[j];
        for (int32_t i = 0; i < c->n_layer * c->n_expert; i++, n++) {
            r[n].id = c->layer0 * c->n_expert + i; /* the model's numbering */
            r[n].score = c->score[i];
            int32_t s = c->slot_of[i];
            if (s < 0 && c->displaced) /* on loan right now: still counts as resident */
                for (int32_t k = 0; k < c->n_slots - c->n_usable; k++)
                    if (c->displaced[k] == i) s = c->n_usable + k;
            r[n].resident = s >= 0;
        }
    }
    qsort(r, (size_t)n_ids, sizeof *r, ranked_cmp);
    FILE *f = fopen(path, "w");
    if (!f) {
        free(r);
        return err_set(err, STRATA_ERR_IO, "cannot write the profile to %s: %s", path, strerror(errno));
    }
    const int32_t E = cs[0]->n_expert;
    fprintf(f, "# strata expert profile: layer expert score, best first (%d layers x %d experts)\n",
            cs[0]->n_layer_model - cs[0]->moe_first, E);
    for (int32_t i = 0; i < n_ids; i++) fprintf(f, "%d %d %.6g\n", r[i].id / E, r[i].id % E, (double)r[i].score);
    free(r);
    if (fclose(f) != 0) return err_set(err, STRATA_ERR_IO, "cannot write the profile to %s: %s", path, strerror(errno));
    return STRATA_OK;
}

/* ---- lookups ------------------------------------------------------------------------------------- */

void cache_step_begin(expert_cache *c) {
    if (++c->stamp == 0) { /* wrapped: clear every pin once */
        memset(c->pin, 0, (size_t)(c->n_slots > 0 ? c->n_slots : 1) * sizeof *c->pin);
        c->stamp = 1;
    }
}

/* The slot to give up: an empty usable slot first, else the weakest (adaptive: lowest count, oldest on
 * ties; lru: least recently used) that the current step does not use. -1 when every slot is pinned. */
static int32_t victim(const expert_cache *c) {
    int32_t best = -1;
    for (int32_t s = 0; s < c->n_usable; s++) {
        if (c->pin[s] == c->stamp) continue;
        int32_t id = c->expert_in[s];
        if (id < 0) return s;
        if (best < 0) {
            best = s;
            continue;
        }
        int32_t bid = c->expert_in[best];
        if (c->policy == STRATA_CACHE_LRU) {
            if (c->last_use[s] < c->last_use[best]) best = s;
        } else if (c->score[id] < c->score[bid] ||
                   (c->score[id] == c->score[bid] && c->last_use[s] < c->last_use[best])) {
            best = s;
        }
    }
    return best;
}

int32_t cache_decode_lookup(expert_cache *c, int32_t layer, int32_t expert) {
    return cache_decode_lookup_as(c, layer, expert, c->miss);
}

int32_t cache_peek(const expert_cache *c, int32_t layer, int32_t expert) {
    int32_t s = c->slot_of ? c->slot_of[(layer - c->layer0) * c->n_expert + expert] : -1;
    return s >= 0 && s < c->n_usable ? s : -1;
}

int32_t cache_resident(const expert_cache *c) {
    int32_t n = 0;
    for (int32_t s = 0; s < c->n_usable; s++) n += c->expert_in[s] >= 0;
    return n;
}

int32_t cache_decode_lookup_as(expert_cache *c, int32_t layer, int32_t expert, int32_t miss) {
    int32_t id = (layer - c->layer0) * c->n_expert + expert;
    c->lookups++;
    c->score[id] += 1.0f;
    int32_t s = c->slot_of[id];
    if (s >= 0 && s < c->n_usable) {
        c->hits++;
        c->last_use[s] = ++c->clock;
        c->pin[s] = c->stamp;
        return s;
    }
    c->misses++;
    int admit = c->policy == STRATA_CACHE_LRU || miss == STRATA_MISS_COPY;
    if (admit && c->n_usable > 0) {
        int32_t v = victim(c);
        if (v >= 0) {
            place(c, v, id);
            c->swaps++;
            c->pin[v] = c->stamp;
            if (miss == STRATA_MISS_COPY) return v;
        }
    }
    if (miss == STRATA_MISS_READ) c->reads++;
    else c->host_runs++;
    return -1;
}

int32_t cache_prefill_lookup(expert_cache *c, int32_t layer, int32_t expert) {
    int32_t id = (layer - c->layer0) * c->n_expert + expert;
    c->lookups++;
    int32_t s = c->slot_of[id];
    if (s >= 0 && s < c->n_usable) {
        c->hits++;
        return s;
    }
    c->misses++;
    return -1;
}

/* Adaptive: bring in up to adapt_swaps experts whose count beats the weakest resident's, then decay. */
static void adapt(expert_cache *c) {
    int32_t n_ids = c->n_layer * c->n_expert;
    for (int32_t k = 0; k < c->adapt_swaps && c->n_usable > 0; k++) {
        int32_t best = -1;
        for (int32_t i = 0; i < n_ids; i++)
            if (c->slot_of[i] < 0 && c->score[i] > 0 && (best < 0 || c->score[i] > c->score[best])) best = i;
        if (best < 0) break;
        cache_step_begin(c); /* adaptation happens between tokens: nothing is pinned */
        int32_t v = victim(c);
        if (v < 0) break;
        int32_t vid = c->expert_in[v];
        if (vid >= 0 && !(c->score[best] > c->score[vid])) break;
        place(c, v, best);
        c->swaps++;
    }
    for (int32_t i = 0; i < n_ids; i++) c->score[i] *= c->adapt_decay;
}

void cache_token_done(expert_cache *c) {
    if (c->policy != STRATA_CACHE_ADAPTIVE) return;
    if (++c->tokens_since >= c->adapt_every) {
        c->tokens_since = 0;
        adapt(c);
    }
}

/* ---- the loan ------------------------------------------------------------------------------------ */

uint8_t *cache_lend(expert_cache *c, int32_t k) {
    if (k <= 0 || k > c->n_usable || c->n_usable != c->n_slots) return NULL;
    int32_t first = c->n_slots - k;
    for (int32_t i = 0; i < k; i++) {
        int32_t s = first + i;
        int32_t id = c->expert_in[s];
        c->displaced[i] = id;
        if (id >= 0) c->slot_of[id] = -1;
        c->expert_in[s] = -1;
    }
    c->n_usable = first;
    return cache_slot_ptr(c, first);
}

int32_t cache_refill(expert_cache *c) {
    int32_t k = c->n_slots - c->n_usable;
    int32_t refilled = 0;
    c->n_usable = c->n_slots;
    for (int32_t i = 0; i < k; i++) {
        int32_t s = c->n_slots - k + i;
        int32_t id = c->displaced[i];
        c->displaced[i] = -1;
        if (id < 0) continue;
        /* keep the old recency: a refill is a restore, not a use */
        uint64_t lu = c->last_use[s];
        place(c, s, id);
        c->last_use[s] = lu;
        refilled++;
    }
    return refilled;
}

int32_t cache_lent(const expert_cache *c) { return c->n_slots - c->n_usable; }
