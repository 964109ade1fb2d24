/*
 * sample.c — picking a token from logits: greedy, or temperature with top-k, top-p and min-p.
 *
 * Order of the steps (the usual one): logits / temperature -> keep the top_k largest -> softmax ->
 * keep the smallest set whose probability reaches top_p -> drop tokens below min_p * (best
 * probability) -> draw. Only top-k and top-p need the candidates in order: without them the draw walks
 * the vocabulary in id order, so a step costs O(V) and not a sort of the whole vocabulary. Ties between equal logits go to the lower token id, so greedy picks are
 * reproducible. The generator is splitmix64-seeded xoshiro256**: a seed gives the same draws on
 * every machine.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "strata.h"

strata_sampling strata_default_sampling(void) {
    strata_sampling s = {0.0f, 0, 1.0f, 0.0f, 0};
    return s;
}

struct strata_sampler {
    strata_sampling s;
    uint64_t rng[4];
    int32_t cap;
    float *p; /* [cap] probabilities of the candidates */
    void *c;  /* [cap] candidates (value, token id) */
};

static uint64_t splitmix64(uint64_t *x) {
    uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static inline uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

static uint64_t next_u64(uint64_t s[4]) {
    uint64_t r = rotl(s[1] * 5, 7) * 9, t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return r;
}

/* uniform in [0, 1) with 53 random bits */
static double next_unit(uint64_t s[4]) { return (double)(next_u64(s) >> 11) * (1.0 / 9007199254740992.0); }

strata_status strata_sampler_init(const strata_sampling *s, strata_sampler **out) {
    if (!out) return STRATA_ERR_INVALID_ARGUMENT;
    *out = NULL;
    strata_sampling d = strata_default_sampling();
    if (!s) s = &d;
    if (!(s->temperature >= 0) || !(s->top_p > 0 && s->top_p <= 1) || !(s->min_p >= 0 && s->min_p <= 1) || s->top_k < 0)
        return STRATA_ERR_INVALID_ARGUMENT;
    strata_sampler *smp = calloc(1, sizeof *smp);
    if (!smp) return STRATA_ERR_OUT_OF_MEMORY;
    smp->s = *s;
    uint64_t x = s->seed;
    for (int i = 0; i < 4; i++) smp->rng[i] = splitmix64(&x);
    *out = smp;
    return STRATA_OK;
}

void strata_sampler_free(strata_sampler *smp) {
    if (!smp) return;
    free(smp->p);
    free(smp->c);
    free(smp);
}

static int32_t argmax(const float *x, int32_t n) {
    int32_t best = 0;
    for (int32_t i = 1; i < n; i++)
        if (x[i] > x[best]) best = i;
    return best;
}

typedef struct pair {
    float v;
    int32_t i;
} pair;

/* a before b: larger value first, lower id among equals */
static inline int before(pair a, pair b) { return a.v > b.v || (a.v == b.v && a.i < b.i); }

static int cmp_pair(const void *x, const void *y) {
    const pair *a = x, *b = y;
    return before(*a, *b) ? -1 : before(*b, *a) ? 1 : 0;
}

/* Restore the heap c[0..k) (the worst candidate at the root) below position j. */
static void sift_down(pair *c, int32_t k, int32_t j) {
    for (;;) {
        int32_t l = 2 * j + 1, r = l + 1, w = j;
        if (l < k && before(c[w], c[l])) w = l;
        if (r < k && before(c[w], c[r])) w = r;
        if (w == j) break;
        pair t = c[j];
        c[j] = c[w];
        c[w] = t;
        j = w;
    }
}

/* Keep the k best of c[0..n) in c[0..k), best first: a min-heap of the k best so far (O(n log k)). */
static void keep_top_k(pair *c, int32_t n, int32_t k) {
    /* heap over c[0..k): the worst kept candidate at the root */
    for (int32_t i = k / 2 - 1; i >= 0; i--) sift_down(c, k, i);
    for (int32_t i = k; i < n; i++) {
        if (!before(c[i], c[0])) continue;
        c[0] = c[i];
        sift_down(c, k, 0);
    }
    qsort(c, (size_t)k, sizeof *c, cmp_pair);
}

int32_t strata_sampler_sample(strata_sampler *smp, const float *logits, int32_t n_vocab) {
    if (!smp || !logits || n_vocab <= 0) return -1;
    const strata_sampling *s = &smp->s;
    if (s->temperature <= 0.0f || s->top_k == 1) return argmax(logits, n_vocab);
    if (smp->cap < n_vocab) {
        free(smp->p);
        free(smp->c);
        smp->p = malloc(sizeof(float) * (size_t)n_vocab);
        smp->c = malloc(sizeof(pair) * (size_t)n_vocab);
        smp->cap = smp->p && smp->c ? n_vocab : 0;
        if (!smp->cap) return argmax(logits, n_vocab); /* out of memory: the most likely token */
    }
    pair *c = smp->c;
    float *p = smp->p;
    /* candidates: every token in id order, or the top k best first; NaN logits count as -inf */
    int32_t n = n_vocab, sorted = 0;
    for (int32_t i = 0; i < n_vocab; i++) c[i] = (pair){isnan(logits[i]) ? -INFINITY : logits[i] / s->temperature, i};
    if (s->top_k > 0 && s->top_k < n) {
        keep_top_k(c, n, s->top_k);
        n = s->top_k;
        sorted = 1;
    }
    float mx = -INFINITY;
    for (int32_t i = 0; i < n; i++) mx = c[i].v > mx ? c[i].v : mx;
    if (!isfinite(mx)) return argmax(logits, n_vocab);
    /* softmax, in double for a stable sum */
    double sum = 0.0;
    for (int32_t i = 0; i < n; i++) {
        p[i] = (float)exp((double)c[i].v - (double)mx);
        sum += p[i];
    }
    for (int32_t i = 0; i < n; i++) p[i] = (float)(p[i] / sum);
    if (s->top_p < 1.0f) {
        if (!sorted) {
            /* sort candidates with their probabilities: probabilities follow the values' order */
            qsort(c, (size_t)n, sizeof *c, cmp_pair);
            for (int32_t i = 0; i < n; i++) p[i] = (float)(exp((double)c[i].v - (double)mx) / sum);
            sorted = 1;
        }
        double cum = 0.0;
        for (int32_t i = 0; i < n; i++) {
            cum += p[i];
            if (cum >= s->top_p) {
                n = i + 1;
                break;
            }
        }
    }
    if (s->min_p > 0.0f) {
        float pmax = 0.0f;
        for (int32_t i = 0; i < n; i++) pmax = p[i] > pmax ? p[i] : pmax;
        const float floor_p = s->min_p * pmax;
        int32_t m = 0;
        for (int32_t i = 0; i < n; i++)
            if (p[i] >= floor_p) {
                c[m] = c[i];
                p[m] = p[i];
                m++;
            }
        n = m;
    }
    /* draw: walk the kept candidates in their order until the cumulative mass passes r */
    double total = 0.0;
    for (int32_t i = 0; i < n; i++) total += p[i];
    double r = next_unit(smp->rng) * total, acc = 0.0;
    for (int32_t i = 0; i < n; i++) {
        acc += p[i];
        if (r < acc) return c[i].i;
    }
    return c[n - 1].i;
}
