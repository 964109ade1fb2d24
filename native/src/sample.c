/*
 * sample.c — picking a token from logits: greedy, or temperature with top-k, top-p and min-p.
 *
 * Order of the steps (the usual one): logits / temperature -> keep the top_k largest -> softmax ->
 * keep the smallest set whose probability reaches top_p -> drop tokens below min_p * (best
 * probability) -> draw. Ties between equal logits go to the lower token id, so greedy picks are
 * reproducible. The generator is splitmix64-seeded xoshiro256**: a seed gives the same draws on
 * every machine.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "strata.h"

struct strata_sampler {
    strata_sampling s;
    uint64_t rng[4];
    int32_t cap;
    float *p;       /* [cap] probabilities of the candidates, best first */
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
    if (!(s->temperature >= 0) || !(s->top_p > 0 && s->top_p <= 1) || !(s->min_p >= 0 && s->min_p <= 1) ||
        s->top_k < 0)
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

static int cmp_pair(const void *a, const void *b) {
    const pair *x = a, *y = b;
    if (x->v > y->v) return -1;
    if (x->v < y->v) return 1;
    return (x->i > y->i) - (x->i < y->i);
}

int32_t strata_sampler_sample(strata_sampler *smp, const float *logits, int32_t n_vocab) {
    if (!smp || !logits || n_vocab <= 0) return -1;
    const strata_sampling *s = &smp->s;
    if (s->temperature <= 0.0f || s->top_k == 1) return argmax(logits, n_vocab);
    if (smp->cap < n_vocab) {
        free(smp->p);
        smp->p = malloc(sizeof(float) * (size_t)n_vocab);
        smp->cap = smp->p ? n_vocab : 0;
        if (!smp->cap) return argmax(logits, n_vocab);
    }
    /* candidates sorted best first (ties: lower id) */
    pair *c = (pair *)malloc(sizeof(pair) * (size_t)n_vocab);
    if (!c) return argmax(logits, n_vocab);
    for (int32_t i = 0; i < n_vocab; i++) c[i] = (pair){logits[i] / s->temperature, i};
    int32_t n = n_vocab;
    qsort(c, (size_t)n, sizeof *c, cmp_pair);
    if (s->top_k > 0 && s->top_k < n) n = s->top_k;
    /* softmax over the kept candidates, in double for a stable sum */
    double sum = 0.0;
    for (int32_t i = 0; i < n; i++) {
        smp->p[i] = (float)exp((double)c[i].v - (double)c[0].v);
        sum += smp->p[i];
    }
    for (int32_t i = 0; i < n; i++) smp->p[i] = (float)(smp->p[i] / sum);
    if (s->top_p < 1.0f) {
        double cum = 0.0;
        int32_t keep = n;
        for (int32_t i = 0; i < n; i++) {
            cum += smp->p[i];
            if (cum >= s->top_p) {
                keep = i + 1;
                break;
            }
        }
        n = keep;
    }
    if (s->min_p > 0.0f) {
        float floor_p = s->min_p * smp->p[0];
        int32_t keep = 1;
        while (keep < n && smp->p[keep] >= floor_p) keep++;
        n = keep;
    }
    double total = 0.0;
    for (int32_t i = 0; i < n; i++) total += smp->p[i];
    double r = next_unit(smp->rng) * total, acc = 0.0;
    int32_t pick = c[n - 1].i;
    for (int32_t i = 0; i < n; i++) {
        acc += smp->p[i];
        if (r < acc) {
            pick = c[i].i;
            break;
        }
    }
    free(c);
    return pick;
}
