/*
 * matmul.h — the engine's one way of multiplying weights by activations on the CPU.
 *
 * A job is a list of segments; each multiplies the rows of one weight view by n activation rows.
 * Every output element y[token, row] is one vec_dot(cols, W[row], act[token]) — the same call for a
 * chunk of 512 tokens as for one decode step, whichever thread runs it. Threads split rows only.
 * This is the whole determinism story of the matrix products.
 */
#ifndef STRATA_MATMUL_H
#define STRATA_MATMUL_H

#include <stddef.h>
#include <stdint.h>

#include "model.h"
#include "quant.h"
#include "threads.h"

typedef struct mm_seg {
    const quant_traits *qt; /* the weight type's kernels */
    wview w;                /* [rows, cols] */
    const uint8_t *act;     /* activation rows, quantized to qt->act_type */
    size_t act_stride;      /* bytes between activation rows */
    const int32_t *act_idx; /* row i of the segment reads act row act_idx[i]; NULL = i */
    int32_t n;              /* activation rows (tokens) */
    float *y;               /* output: token i, weight row r at y[yrow(i) * y_ld + r] */
    int64_t y_ld;
    const int32_t *y_idx; /* yrow(i) = y_idx[i]; NULL = i */
} mm_seg;

/* Run every segment (segments may not write the same outputs). */
void mm_run(pool *p, const mm_seg *segs, int32_t n_segs);

/* Bytes of one activation row for weights of type wtype with cols columns; 0 when unknown. */
size_t mm_act_row_bytes(const quant_traits *table, int32_t wtype, int64_t cols);
/* Quantize n rows x[i * x_ld .. + cols] into dst (rows dst_stride apart) for weights of type wtype. */
void mm_quantize(const quant_traits *table, int32_t wtype, const float *x, int64_t x_ld, int32_t n, int64_t cols,
                 uint8_t *dst, size_t dst_stride);

#endif
