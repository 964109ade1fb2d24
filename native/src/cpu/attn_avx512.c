/*
 * attn_avx512.c — tiled causal attention over the f16 KV cache with AVX-512 (see cpu/attn.h).
 *
 * Shapes: HD head dim (32, 64 or 128, a compile-time constant per instance), tiles of 16 positions,
 * up to ATTN_ITEM_QUERIES queries per pass. Per tile:
 *   kt, vt  [16, HD] f32   K and V rows of positions j0 .. j0 + 15 (rows past the item's last
 *                          position are zero and never reach a result: their lanes are masked)
 *   per query: s[16] = (q . kt[p]) * scale, lanes past the query's position masked to -inf;
 *              m' = max(m, max s); a = exp(m - m'); e = exp(s - m'); l = l a + sum e;
 *              acc = acc a + sum over its positions p of e[p] vt[p]  (p in order)
 *   at the end out = acc * (1 / l), or with a sink logit s: acc * a / (l a + exp(s - m')), m' = max(m, s),
 *   a = exp(m - m'); a window (sliding layers) masks the lanes below its first position and skips the
 *   tiles before it.
 * Every step of a query is a fixed sequence of vector operations that depends on its own q and
 * position alone (the tile grid is the multiples of 16 for every query), never on which other queries
 * share the tile or on the thread.
 */
#include <immintrin.h>
#include <math.h>
#include <string.h>

#include "attn.h"

int attn_f16_tiled_supported(int32_t hd) { return hd == 32 || hd == 64 || hd == 128; }

/* exp on 16 lanes for x <= 0 (scores minus their running max): n = round(x log2 e), r = x - n ln 2
 * (two-part constant), e^r by its degree-6 Taylor polynomial (|r| <= ln2 / 2: relative error below
 * 2e-7) evaluated in a short tree, and 2^n added to the exponent bits. Inputs below -86 are taken as
 * -86 (e^-86 ~ 4e-38, still a normal float): the masked lanes, zeroed by the caller anyway. Short
 * dependency chains and no scalef: this runs once per query and tile. */
static inline __m512 exp16(__m512 x) {
    x = _mm512_max_ps(x, _mm512_set1_ps(-86.0f));
    const __m512i ni = _mm512_cvt_roundps_epi32(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                                _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const __m512 n = _mm512_cvtepi32_ps(ni);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693145751953125f), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(1.428606765330187045e-06f), r);
    const __m512 r2 = _mm512_mul_ps(r, r);
    const __m512 a0 = _mm512_add_ps(r, _mm512_set1_ps(1.0f));                                /* 1 + r */
    const __m512 a1 = _mm512_fmadd_ps(r, _mm512_set1_ps(1.0f / 6.0f), _mm512_set1_ps(0.5f)); /* 1/2 + r/6 */
    const __m512 a2 = _mm512_fmadd_ps(r, _mm512_set1_ps(1.0f / 120.0f), _mm512_set1_ps(1.0f / 24.0f));
    __m512 p = _mm512_fmadd_ps(r2, _mm512_set1_ps(1.0f / 720.0f), a2);
    p = _mm512_fmadd_ps(r2, p, a1);
    p = _mm512_fmadd_ps(r2, p, a0);
    return _mm512_castsi512_ps(_mm512_add_epi32(_mm512_castps_si512(p), _mm512_slli_epi32(ni, 23)));
}

/* Sixteen 16-lane vectors -> one vector whose lane p is the sum of v[p]'s lanes (a fixed tree:
 * 256-bit halves, then 128-bit quarters, then pairs, then neighbours; the last permute puts
 * position p in lane p). */
static inline __m512 reduce16(const __m512 v[16]) {
    __m512 a[8], b[4], c[2];
    for (int p = 0; p < 8; p++)
        a[p] = _mm512_add_ps(_mm512_shuffle_f32x4(v[p], v[p + 8], 0x44), _mm512_shuffle_f32x4(v[p], v[p + 8], 0xEE));
    /* a[p]: lanes 0-7 partials of p, 8-15 of p + 8 */
    for (int p = 0; p < 4; p++)
        b[p] = _mm512_add_ps(_mm512_shuffle_f32x4(a[p], a[p + 4], 0x88), _mm512_shuffle_f32x4(a[p], a[p + 4], 0xDD));
    /* b[p]: 128-bit lanes hold p, p + 8, p + 4, p + 12 (four partials each) */
    for (int p = 0; p < 2; p++)
        c[p] = _mm512_add_ps(_mm512_shuffle_ps(b[p], b[p + 2], _MM_SHUFFLE(1, 0, 1, 0)),
                             _mm512_shuffle_ps(b[p], b[p + 2], _MM_SHUFFLE(3, 2, 3, 2)));
    /* c[p]: in 128-bit lane k, two partials of (off_k + p), two of (off_k + p + 2); off = 0, 8, 4, 12 */
    const __m512 d = _mm512_add_ps(_mm512_shuffle_ps(c[0], c[1], _MM_SHUFFLE(2, 0, 2, 0)),
                                   _mm512_shuffle_ps(c[0], c[1], _MM_SHUFFLE(3, 1, 3, 1)));
    /* d lane 4k + e holds position off_k + (0, 2, 1, 3)[e] */
    const __m512i idx = _mm512_setr_epi32(0, 2, 1, 3, 8, 10, 9, 11, 4, 6, 5, 7, 12, 14, 13, 15);
    return _mm512_permutexvar_ps(idx, d);
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
static inline __attribute__((always_inline)) void attn_pass(const attn_tile_job *j, int32_t kvh, int32_t t0, int32_t qs,
                                                            int32_t nq, const int HD) {
    const int NV = HD / 16; /* vectors per row */
    const int32_t G = j->group;
    float kt[16 * 128] __attribute__((aligned(64)));                 /* [16, HD] */
    float vt[16 * 128] __attribute__((aligned(64)));                 /* [16, HD] */
    float acc[ATTN_ITEM_QUERIES * 128] __attribute__((aligned(64))); /* [nq, HD] */
    float m[ATTN_ITEM_QUERIES], l[ATTN_ITEM_QUERIES];
    float sc[ATTN_ITEM_QUERIES * 16] __attribute__((aligned(64))); /* [nq, 16] scores of the tile */
    float ew[ATTN_ITEM_QUERIES * 16] __attribute__((aligned(64))); /* [nq, 16] their softmax weights */
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
    const __m512 scale = _mm512_set1_ps(j->scale);
    /* the grid of tiles stays at multiples of 16: a window only skips the tiles below it */
    for (int32_t j0 = first / 16 * 16; j0 <= last; j0 += 16) {
        const int32_t nrow = last - j0 + 1 < 16 ? last - j0 + 1 : 16;
        for (int32_t p = 0; p < 16; p++) {
            if (p < nrow) {
                const size_t off = (size_t)(j0 + p) * j->row_bytes;
                const uint16_t *kr = (const uint16_t *)(const void *)(j->k + off) + (size_t)kvh * HD;
                const uint16_t *vr = (const uint16_t *)(const void *)(j->v + off) + (size_t)kvh * HD;
                for (int c = 0; c < NV; c++) {
                    const __m256i kh = _mm256_loadu_si256((const __m256i *)(kr + 16 * c));
                    const __m256i vh = _mm256_loadu_si256((const __m256i *)(vr + 16 * c));
                    _mm512_store_ps(kt + p * HD + 16 * c, _mm512_cvtph_ps(kh));
                    _mm512_store_ps(vt + p * HD + 16 * c, _mm512_cvtph_ps(vh));
                }
            } else {
                for (int c = 0; c < NV; c++) {
                    _mm512_store_ps(kt + p * HD + 16 * c, _mm512_setzero_ps());
                    _mm512_store_ps(vt + p * HD + 16 * c, _mm512_setzero_ps());
                }
            }
        }
        /* Three passes over the queries, each a short chain per query that the CPU overlaps across
         * queries (one long chain per query would leave the softmax's latency exposed); per query the
         * operations and their order are the same as in one pass. */
        /* scores: one 16-lane partial vector per position, then reduced across positions */
        for (int32_t i = 0; i < nq; i++) {
            if (qpos[i] < j0 || qlo[i] >= j0 + 16) continue;
            const int32_t np = qpos[i] - j0 + 1 < 16 ? qpos[i] - j0 + 1 : 16; /* positions this query sees */
            const int32_t p0 = qlo[i] > j0 ? qlo[i] - j0 : 0;                 /* below: outside its window */
            const __mmask16 valid = (__mmask16)(((1u << np) - 1u) & ~((1u << p0) - 1u));
            __m512 qv[8];
            for (int c = 0; c < NV; c++) qv[c] = _mm512_loadu_ps(qp[i] + 16 * c);
            __m512 pv[16];
            for (int p = 0; p < 16; p++) {
                __m512 sp = _mm512_mul_ps(qv[0], _mm512_load_ps(kt + p * HD));
                for (int c = 1; c < NV; c++) sp = _mm512_fmadd_ps(qv[c], _mm512_load_ps(kt + p * HD + 16 * c), sp);
                pv[p] = sp;
            }
            const __m512 sv = _mm512_mul_ps(reduce16(pv), scale);
            _mm512_store_ps(sc + 16 * i, _mm512_mask_mov_ps(_mm512_set1_ps(-INFINITY), valid, sv));
        }
        /* online softmax: weights e of the tile, the rescale factor of the query's old sums */
        for (int32_t i = 0; i < nq; i++) {
            if (qpos[i] < j0 || qlo[i] >= j0 + 16) continue;
            const int32_t np = qpos[i] - j0 + 1 < 16 ? qpos[i] - j0 + 1 : 16;
            const int32_t p0 = qlo[i] > j0 ? qlo[i] - j0 : 0;
            const __mmask16 valid = (__mmask16)(((1u << np) - 1u) & ~((1u << p0) - 1u));
            const __m512 sv = _mm512_load_ps(sc + 16 * i);
            const float mt = _mm512_reduce_max_ps(sv);
            const float mn = mt > m[i] ? mt : m[i];
            const __m512 e = _mm512_maskz_mov_ps(valid, exp16(_mm512_sub_ps(sv, _mm512_set1_ps(mn))));
            rescale[i] = mt > m[i]; /* otherwise the factor is exp16(0) = 1 exactly: skipped */
            if (rescale[i]) {
                alpha[i] = _mm512_cvtss_f32(exp16(_mm512_set1_ps(m[i] - mn))); /* first tile: ~0 */
                l[i] *= alpha[i];
            }
            l[i] += _mm512_reduce_add_ps(e);
            m[i] = mn;
            _mm512_store_ps(ew + 16 * i, e);
        }
        /* weighted sum of the V rows the query sees, in position order */
        for (int32_t i = 0; i < nq; i++) {
            if (qpos[i] < j0 || qlo[i] >= j0 + 16) continue;
            const int32_t np = qpos[i] - j0 + 1 < 16 ? qpos[i] - j0 + 1 : 16;
            const int32_t p0 = qlo[i] > j0 ? qlo[i] - j0 : 0;
            float *ac = acc + (size_t)i * HD;
            __m512 o[8];
            for (int c = 0; c < NV; c++) o[c] = _mm512_load_ps(ac + 16 * c);
            if (rescale[i]) {
                const __m512 av = _mm512_set1_ps(alpha[i]);
                for (int c = 0; c < NV; c++) o[c] = _mm512_mul_ps(o[c], av);
            }
            for (int32_t p = p0; p < np; p++) {
                const __m512 w = _mm512_set1_ps(ew[16 * i + p]);
                for (int c = 0; c < NV; c++) o[c] = _mm512_fmadd_ps(w, _mm512_load_ps(vt + p * HD + 16 * c), o[c]);
            }
            for (int c = 0; c < NV; c++) _mm512_store_ps(ac + 16 * c, o[c]);
        }
    }
    for (int32_t i = 0; i < nq; i++) {
        const int32_t t = t0 + (qs + i) / G, h = kvh * G + (qs + i) % G;
        float *out = j->out + (int64_t)t * j->n_head * HD + (int64_t)h * HD;
        const __m512 inv = _mm512_set1_ps(final_scale(j, h, m[i], l[i]));
        for (int c = 0; c < NV; c++)
            _mm512_storeu_ps(out + 16 * c, _mm512_mul_ps(_mm512_load_ps(acc + (size_t)i * HD + 16 * c), inv));
    }
}

void attn_store_f16_avx512(uint16_t *dst, const float *src, int32_t n) {
    int32_t i = 0;
    for (; i + 16 <= n; i += 16)
        _mm256_storeu_si256((__m256i *)(dst + i), _mm512_cvtps_ph(_mm512_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT));
    if (i < n) {
        const __mmask16 m = (__mmask16)((1u << (n - i)) - 1u);
        const __m256i h = _mm512_cvtps_ph(_mm512_maskz_loadu_ps(m, src + i), _MM_FROUND_TO_NEAREST_INT);
        _mm256_mask_storeu_epi16(dst + i, m, h);
    }
}

void attn_f16_tiled_avx512(const attn_tile_job *j, int32_t kvh, int32_t t0, int32_t t1) {
    const int32_t nq_all = (t1 - t0) * j->group;
    for (int32_t qs = 0; qs < nq_all; qs += ATTN_ITEM_QUERIES) {
        const int32_t nq = nq_all - qs < ATTN_ITEM_QUERIES ? nq_all - qs : ATTN_ITEM_QUERIES;
        if (j->hd == 32)
            attn_pass(j, kvh, t0, qs, nq, 32);
        else if (j->hd == 64)
            attn_pass(j, kvh, t0, qs, nq, 64);
        else
            attn_pass(j, kvh, t0, qs, nq, 128);
    }
}
