/*
 * matmul.c — weight x activation products as a list of segments (see matmul.h).
 *
 * Work items are blocks of rows of one segment; an item computes its rows for all the segment's
 * tokens, tokens tiled so that a tile of activation rows stays in cache while the block's weight
 * rows stream past it. Which thread takes which block changes nothing in the results.
 */
#include "matmul.h"

#include <stdlib.h>
#include <string.h>

#include "strata.h"

#define MM_MAX_SEGS 4096
#define MM_TOKEN_TILE 64
/* The kernels that decode a weight row once for a tile of tokens (quant_get_xn / quant_get_4xn) pay off
 * from this many tokens; a smaller tile (a decode step of a few sequences, a short prompt chunk) runs the
 * four-row kernel per token, which keeps the four rows in cache across the tile. Both give vec_dot's bits,
 * so the choice changes speed only. Measured on a decode step of the small preset (AVX-512, one thread, CPU
 * time): 2 rows 3.6 -> 1.9-2.6 ms, 4 rows 4.4-5.0 -> 3.4 ms; 16 rows alike either way. */
#define MM_XN_MIN 16

typedef struct mm_job {
    const mm_seg *segs;
    int32_t n_segs;
    int64_t rows_per_item;
    int64_t *first_item; /* [n_segs + 1]: items of segment s are first_item[s] .. first_item[s + 1] - 1 */
} mm_job;

static void mm_item(void *ctx, int64_t item, int thread) {
    (void)thread;
    const mm_job *j = ctx;
    /* find the segment by binary search over first_item */
    int32_t lo = 0, hi = j->n_segs - 1;
    while (lo < hi) {
        int32_t mid = (lo + hi + 1) / 2;
        if (j->first_item[mid] <= item) lo = mid;
        else hi = mid - 1;
    }
    const mm_seg *s = &j->segs[lo];
    int64_t r0 = (item - j->first_item[lo]) * j->rows_per_item;
    int64_t r1 = r0 + j->rows_per_item;
    if (r1 > s->w.rows) r1 = s->w.rows;
    const size_t rb = s->w.row_bytes;
    for (int32_t t0 = 0; t0 < s->n; t0 += MM_TOKEN_TILE) {
        int32_t t1 = t0 + MM_TOKEN_TILE < s->n ? t0 + MM_TOKEN_TILE : s->n;
        int64_t r = r0;
        /* a weight row decoded once for the whole tile where the type has a kernel for it (out[k] is
         * bit-identical to vec_dot) */
        quant_dot_xn_fn xn = t1 - t0 >= MM_XN_MIN ? quant_get_xn(s->qt) : NULL;
        quant_dot_4xn_fn x4n = t1 - t0 >= MM_XN_MIN ? quant_get_4xn(s->qt) : NULL;
        if (xn || x4n) {
            const void *acts[MM_TOKEN_TILE];
            float out[4 * MM_TOKEN_TILE];
            const int32_t nt = t1 - t0;
            for (int32_t t = t0; t < t1; t++)
                acts[t - t0] = s->act + (size_t)(s->act_idx ? s->act_idx[t] : t) * s->act_stride;
            /* four rows x the tile in registers where the type has a kernel for it */
            for (; x4n && r + 4 <= r1; r += 4) {
                x4n(s->w.cols, s->w.data + (size_t)r * rb, rb, acts, nt, out);
                for (int32_t t = t0; t < t1; t++) /* the kernel's out is token-major: four floats per token */
                    memcpy(s->y + (int64_t)(s->y_idx ? s->y_idx[t] : t) * s->y_ld + r, out + 4 * (t - t0),
                           4 * sizeof(float));
            }
            for (; r < r1; r++) {
                if (!xn) {
                    for (int32_t t = t0; t < t1; t++)
                        s->y[(int64_t)(s->y_idx ? s->y_idx[t] : t) * s->y_ld + r] =
                            s->qt->vec_dot(s->w.cols, s->w.data + (size_t)r * rb, acts[t - t0]);
                    continue;
                }
                xn(s->w.cols, s->w.data + (size_t)r * rb, acts, t1 - t0, out);
                for (int32_t t = t0; t < t1; t++) s->y[(int64_t)(s->y_idx ? s->y_idx[t] : t) * s->y_ld + r] = out[t - t0];
            }
            continue;
        }
        /* four rows at a time where the type has a kernel for it (bit-identical per row to vec_dot) */
        quant_dot_x4_fn x4 = quant_get_x4(s->qt);
        if (x4) {
            for (; r + 4 <= r1; r += 4) {
                const uint8_t *wr = s->w.data + (size_t)r * rb;
                for (int32_t t = t0; t < t1; t++) {
                    const uint8_t *a = s->act + (size_t)(s->act_idx ? s->act_idx[t] : t) * s->act_stride;
                    float *y = s->y + (int64_t)(s->y_idx ? s->y_idx[t] : t) * s->y_ld;
                    x4(s->w.cols, wr, rb, a, y + r);
                }
            }
        }
        for (; r < r1; r++) {
            const uint8_t *wr = s->w.data + (size_t)r * rb;
            for (int32_t t = t0; t < t1; t++) {
                const uint8_t *a = s->act + (size_t)(s->act_idx ? s->act_idx[t] : t) * s->act_stride;
                float *y = s->y + (int64_t)(s->y_idx ? s->y_idx[t] : t) * s->y_ld;
                y[r] = s->qt->vec_dot(s->w.cols, wr, a);
            }
        }
    }
}

void mm_run(pool *p, const mm_seg *segs, int32_t n_segs) {
    if (n_segs <= 0) return;
    int64_t stack_first[65];
    int64_t *first = n_segs < 65 ? stack_first : malloc(sizeof(int64_t) * (size_t)(n_segs + 1));
    int64_t total_rows = 0, work = 0;
    for (int32_t s = 0; s < n_segs; s++) {
        total_rows += segs[s].w.rows;
        work += segs[s].w.rows * segs[s].n * segs[s].w.cols;
    }
    /* Aim for several items per thread so that uneven segments balance; never below 4 rows. */
    int nt = pool_size(p);
    int64_t rpi = total_rows / (8 * (int64_t)nt);
    if (rpi < 4) rpi = 4;
    rpi = (rpi + 3) / 4 * 4; /* whole groups of four rows for the four-row kernels */
    if (work < 65536) rpi = total_rows; /* tiny jobs: one item per segment, no hand-off cost */
    if (rpi < 1) rpi = 1;
    mm_job j = {segs, n_segs, rpi, first};
    if (!first) { /* out of memory for the index: run segment by segment, same results */
        int64_t one[2] = {0, 0};
        for (int32_t s = 0; s < n_segs; s++) {
            mm_job js = {&segs[s], 1, rpi, one};
            one[1] = (segs[s].w.rows + rpi - 1) / rpi;
            pool_run(p, one[1], mm_item, &js);
        }
        return;
    }
    first[0] = 0;
    for (int32_t s = 0; s < n_segs; s++) first[s + 1] = first[s] + (segs[s].n > 0 ? (segs[s].w.rows + rpi - 1) / rpi : 0);
    pool_run(p, first[n_segs], mm_item, &j);
    if (first != stack_first) free(first);
}

size_t mm_act_row_bytes(const quant_traits *table, int32_t wtype, int64_t cols) {
    const quant_traits *w = quant_lookup(table, wtype);
    if (!w) return 0;
    int64_t rb = quant_row_bytes(w->act_type, cols);
    return rb < 0 ? 0 : (size_t)rb;
}

void mm_quantize(const quant_traits *table, int32_t wtype, const float *x, int64_t x_ld, int32_t n, int64_t cols,
                 uint8_t *dst, size_t dst_stride) {
    const quant_traits *w = quant_lookup(table, wtype);
    const quant_traits *a = quant_lookup(table, w->act_type);
    for (int32_t i = 0; i < n; i++) a->quantize_act(x + (int64_t)i * x_ld, dst + (size_t)i * dst_stride, cols);
}
