/*
 * attn_avx2.c — tiled causal attention over the f16 KV cache with AVX2 + FMA + F16C (see cpu/attn.h).
 *
 * The AVX-512 kernel's algorithm (cpu/attn_avx512.c) on 8-lane vectors: HD head dim (32, 64 or 128, a
 * compile-time constant per instance), tiles of 16 positions, up to ATTN_ITEM_QUERIES queries per pass.
 * Per tile:
 *   kt, vt  [16, HD] f32   K and V rows of positions j0 .. j0 + 15 (rows past the item's last position
 *                          are zero and never reach a result: their lanes are masked)
 *   per query: s[16] = (q . kt[p]) * scale, lanes past the query's position set to -inf;
 *              m' = max(m, max s); a = exp(m - m'); e = exp(s - m'); l = l a + sum e;
 *              acc = acc a + sum over its positions p of e[p] vt[p]  (p in order)
 *   at the end out = acc * (1 / l), or with a sink logit s: acc * a / (l a + exp(s - m')), m' = max(m, s),
 *   a = exp(m - m'); a window (sliding layers) masks the lanes below its first position and skips the
 *   tiles before it.
 * Every step of a query is a fixed sequence of vector operations that depends on its own q and position
 * alone (the tile grid is the multiples of 16 for every query), never on which other queries share the tile
 * or on the thread: a token decoded alone gets the bits it gets inside a prompt chunk.
 */
#include <immintrin.h>
#include <math.h>
#include <string.h>

#include "attn.h"
#include "common.h"

/* exp on 8 lanes for x <= 0, the same steps as the AVX-512 kernel's exp16: n = round(x log2 e),
 * r = x - n ln 2 (two-part constant), e^r by its degree-6 Taylor polynomial in a short tree, 2^n added to
 * the exponent bits; inputs below -86 are taken as -86 (the masked lanes, zeroed by the caller). */
static inline __m256 exp8(__m256 x) {
    x = _mm256_max_ps(x, _mm256_set1_ps(-86.0f));
    const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                     _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const __m256i ni = _mm256_cvttps_epi32(n);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693145751953125f), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(1.428606765330187045e-06f), r);
    const __m256 r2 = _mm256_mul_ps(r, r);
    const __m256 a0 = _mm256_add_ps(r, _mm256_set1_ps(1.0f));                                    /* 1 + r */
    const __m256 a1 = _mm256_fmadd_ps(r, _mm256_set1_ps(1.0f / 6.0f), _mm256_set1_ps(0.5f));     /* 1/2 + r/6 */
    const __m256 a2 = _mm256_fmadd_ps(r, _mm256_set1_ps(1.0f / 120.0f), _mm256_set1_ps(1.0f / 24.0f));
    __m256 p = _mm256_fmadd_ps(r2, _mm256_set1_ps(1.0f / 720.0f), a2);
    p = _mm256_fmadd_ps(r2, p, a1);
    p = _mm256_fmadd_ps(r2, p, a0);
    return _mm256_castsi256_ps(_mm256_add_epi32(_mm256_castps_si256(p), _mm256_slli_epi32(ni, 23)));
}

/* Eight 8-lane vectors -> one vector whose lane p is the sum of v[p]'s lanes (a fixed tree). */
static inline __m256 reduce8(const __m256 v[8]) {
    const __m256 h01 = _mm256_hadd_ps(v[0], v[1]), h23 = _mm256_hadd_ps(v[2], v[3]);
    const __m256 h45 = _mm256_hadd_ps(v[4], v[5]), h67 = _mm256_hadd_ps(v[6], v[7]);
    const __m256 a = _mm256_hadd_ps(h01, h23), b = _mm256_hadd_ps(h45, h67);
    return _mm256_add_ps(_mm256_permute2f128_ps(a, b, 0x20), _mm256_permute2f128_ps(a, b, 0x31));
}

/* The lanes of v summed in a fixed tree. */
static inline float hsum8(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

static inline float hmax8(__m256 v) {
    __m128 s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_max_ps(s, _mm_movehl_ps(s, s));
    s = _mm_max_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* Lanes p (positions lane0 + p) below np: all ones. */
static inline __m256 lanes_below(int32_t np, int32_t lane0);
/* Lanes lane0 .. lane0 + 7 that lie in [p0, np): all ones, else zero. */
static inline __m256 lanes_in(int32_t p0, int32_t np, int32_t lane0) {
    return p0 > 0 ? _mm256_andnot_ps(lanes_below(p0, lane0), lanes_below(np, lane0)) : lanes_below(np, lane0);
}
static inline __m256 lanes_below(int32_t np, int32_t lane0) {
    const __m256i idx = _mm256_add_epi32(_mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7), _mm256_set1_epi32(lane0));
    return _mm256_castsi256_ps(_mm256_cmpgt_epi32(_mm256_set1_epi32(np), idx));
}

/* The factor a query's weighted sum is multiplied by at the end: 1 / l, or with a sink logit s for head h
 * (joining the denominator, weighing no value) a / (l a + exp(s - m')) where m' = max(m, s), a = exp(m - m'). */
static inline float final_scale(const attn_tile_job *j, int32_t h, float m, float l) {
    if (!j->sinks) return 1.0f / l;
    const float s = j->sinks[h], mn = s > m ? s : m, a = expf(m - mn);
    return a / (l * a + expf(s - mn));
}

/* One pass over the tiles for queries qs .. qs + nq - 1 of the item (query i = token t0 + i / G,
 * head kvh * G + i % G). */
static inline __attribute__((always_inline)) void attn_pass(const attn_tile_job *j, int32_t kvh, int32_t t0,
                                                           int32_t qs, int32_t nq, const int HD) {
    const int NV = HD / 8; /* vectors per row */
    const int32_t G = j->group;
    float kt[16 * 128] __attribute__((aligned(32)));                /* [16, HD] */
    float vt[16 * 128] __attribute__((aligned(32)));                /* [16, HD] */
    float acc[ATTN_ITEM_QUERIES * 128] __attribute__((aligned(32))); /* [nq, HD] */
    float m[ATTN_ITEM_QUERIES], l[ATTN_ITEM_QUERIES];
    float sc[ATTN_ITEM_QUERIES * 16] __attribute__((aligned(32))); /* [nq, 16] scores of the tile */
    float ew[ATTN_ITEM_QUERIES * 16] __attribute__((aligned(32))); /* [nq, 16] their softmax weights */
    float alpha[ATTN_ITEM_QUERIES];
    int rescale[ATTN_ITEM_QUERIES];
    int32_t qpos[ATTN_ITEM_QUERIES], qlo[ATTN_ITEM_QUERIES]; /* a query sees positions qlo .. qpos */
    const float *qp[ATTN_ITEM_QUERIES];
    int32_t last = 0, first = INT32_MAX; /* the pass's last position, and its first seen */
    for (int32_t i = 0; i < nq; i++) {
        const int32_t t = t0 + (qs + i) / G, h = kvh * G + (qs + i) % G;
        qpos[i] = j->pos0 + t;
        qlo[i] = j->window > 0 && qpos[i] >= j->window ? qpos[i] - j->window + 1 : 0;
        qp[i] = j->q + (int64_t)t * j->n_head * HD + (int64_t)h * HD;
        m[i] = -INFINITY;
        l[i] = 0.0f;
        last = qpos[i] > last ? qpos[i] : last;
        first = qlo[i] < first ? qlo[i] : first;
    }
    memset(acc, 0, sizeof(float) * (size_t)nq * (size_t)HD);
    const __m256 scale = _mm256_set1_ps(j->scale), ninf = _mm256_set1_ps(-INFINITY);
    /* the grid of tiles stays at multiples of 16: a window only skips the tiles below it */
    for (int32_t j0 = first / 16 * 16; j0 <= last; j0 += 16) {
        const int32_t nrow = last - j0 + 1 < 16 ? last - j0 + 1 : 16;
        for (int32_t p = 0; p < 16; p++) {
            if (p < nrow) {
                const size_t off = (size_t)(j0 + p) * j->row_bytes;
                const uint16_t *kr = (const uint16_t *)(const void *)(j->k + off) + (size_t)kvh * HD;
                const uint16_t *vr = (const uint16_t *)(const void *)(j->v + off) + (size_t)kvh * HD;
                for (int c = 0; c < NV; c++) {
                    _mm256_store_ps(kt + p * HD + 8 * c, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(kr + 8 * c))));
                    _mm256_store_ps(vt + p * HD + 8 * c, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(vr + 8 * c))));
                }
            } else {
                for (int c = 0; c < NV; c++) {
                    _mm256_store_ps(kt + p * HD + 8 * c, _mm256_setzero_ps());
                    _mm256_store_ps(vt + p * HD + 8 * c, _mm256_setzero_ps());
                }
            }
        }
        /* Three passes over the queries (short chains that the CPU overlaps across queries); per query
         * the operations and their order are the same as in one pass. */
        /* scores: one 8-lane partial vector per position, then reduced across positions */
        for (int32_t i = 0; i < nq; i++) {
            if (qpos[i] < j0 || qlo[i] >= j0 + 16) continue;
            const int32_t np = qpos[i] - j0 + 1 < 16 ? qpos[i] - j0 + 1 : 16; /* positions this query sees */
            const int32_t p0 = qlo[i] > j0 ? qlo[i] - j0 : 0;                 /* below: outside its window */
            const float *q = qp[i];
            for (int h = 0; h < 2; h++) {
                __m256 pv[8];
                for (int p = 0; p < 8; p++) {
                    const float *kp = kt + (8 * h + p) * HD;
                    __m256 sp = _mm256_mul_ps(_mm256_loadu_ps(q), _mm256_load_ps(kp));
                    for (int c = 1; c < NV; c++) sp = _mm256_fmadd_ps(_mm256_loadu_ps(q + 8 * c), _mm256_load_ps(kp + 8 * c), sp);
                    pv[p] = sp;
                }
                const __m256 sv = _mm256_mul_ps(reduce8(pv), scale);
                _mm256_store_ps(sc + 16 * i + 8 * h, _mm256_blendv_ps(ninf, sv, lanes_in(p0, np, 8 * h)));
            }
        }
        /* online softmax: weights e of the tile, the rescale factor of the query's old sums */
        for (int32_t i = 0; i < nq; i++) {
            if (qpos[i] < j0 || qlo[i] >= j0 + 16) continue;
            const int32_t np = qpos[i] - j0 + 1 < 16 ? qpos[i] - j0 + 1 : 16;
            const int32_t p0 = qlo[i] > j0 ? qlo[i] - j0 : 0;
            const __m256 s0 = _mm256_load_ps(sc + 16 * i), s1 = _mm256_load_ps(sc + 16 * i + 8);
            const float mt = hmax8(_mm256_max_ps(s0, s1));
            const float mn = mt > m[i] ? mt : m[i];
            const __m256 mv = _mm256_set1_ps(mn);
            const __m256 e0 = _mm256_and_ps(lanes_in(p0, np, 0), exp8(_mm256_sub_ps(s0, mv)));
            const __m256 e1 = _mm256_and_ps(lanes_in(p0, np, 8), exp8(_mm256_sub_ps(s1, mv)));
            rescale[i] = mt > m[i]; /* otherwise the factor is exp8(0) = 1 exactly: skipped */
            if (rescale[i]) {
                alpha[i] = _mm256_cvtss_f32(exp8(_mm256_set1_ps(m[i] - mn))); /* first tile: ~0 */
                l[i] *= alpha[i];
            }
            l[i] += hsum8(_mm256_add_ps(e0, e1));
            m[i] = mn;
            _mm256_store_ps(ew + 16 * i, e0);
            _mm256_store_ps(ew + 16 * i + 8, e1);
        }
        /* weighted sum of the V rows the query sees, in position order */
        for (int32_t i = 0; i < nq; i++) {
            if (qpos[i] < j0 || qlo[i] >= j0 + 16) continue;
            const int32_t np = qpos[i] - j0 + 1 < 16 ? qpos[i] - j0 + 1 : 16;
            const int32_t p0 = qlo[i] > j0 ? qlo[i] - j0 : 0;
            float *ac = acc + (size_t)i * HD;
            __m256 o[16];
            for (int c = 0; c < NV; c++) o[c] = _mm256_load_ps(ac + 8 * c);
            if (rescale[i]) {
                const __m256 av = _mm256_set1_ps(alpha[i]);
                for (int c = 0; c < NV; c++) o[c] = _mm256_mul_ps(o[c], av);
            }
            for (int32_t p = p0; p < np; p++) {
                const __m256 w = _mm256_broadcast_ss(&ew[16 * i + p]);
                for (int c = 0; c < NV; c++) o[c] = _mm256_fmadd_ps(w, _mm256_load_ps(vt + p * HD + 8 * c), o[c]);
            }
            for (int c = 0; c < NV; c++) _mm256_store_ps(ac + 8 * c, o[c]);
        }
    }
    for (int32_t i = 0; i < nq; i++) {
        const int32_t t = t0 + (qs + i) / G, h = kvh * G + (qs + i) % G;
        float *out = j->out + (int64_t)t * j->n_head * HD + (int64_t)h * HD;
        const __m256 inv = _mm256_set1_ps(final_scale(j, h, m[i], l[i]));
        for (int c = 0; c < NV; c++)
            _mm256_storeu_ps(out + 8 * c, _mm256_mul_ps(_mm256_load_ps(acc + (size_t)i * HD + 8 * c), inv));
    }
}

void attn_store_f16_avx2(uint16_t *dst, const float *src, int32_t n) {
    int32_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm_storeu_si128((__m128i *)(dst + i), _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT));
    if (i < n) { /* the tail through a zero-padded vector */
        float f[8] = {0};
        uint16_t h[8];
        memcpy(f, src + i, sizeof(float) * (size_t)(n - i));
        _mm_storeu_si128((__m128i *)h, _mm256_cvtps_ph(_mm256_loadu_ps(f), _MM_FROUND_TO_NEAREST_INT));
        memcpy(dst + i, h, sizeof(uint16_t) * (size_t)(n - i));
    }
}

void attn_f16_tiled_avx2(const attn_tile_job *j, int32_t kvh, int32_t t0, int32_t t1) {
    const int32_t nq_all = (t1 - t0) * j->group;
    for (int32_t qs = 0; qs < nq_all; qs += ATTN_ITEM_QUERIES) {
        const int32_t nq = nq_all - qs < ATTN_ITEM_QUERIES ? nq_all - qs : ATTN_ITEM_QUERIES;
        if (j->hd == 32) attn_pass(j, kvh, t0, qs, nq, 32);
        else if (j->hd == 64) attn_pass(j, kvh, t0, qs, nq, 64);
        else attn_pass(j, kvh, t0, qs, nq, 128);
    }
}
