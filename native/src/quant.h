/*
 * quant.h — weight types: block layouts, dequantization and dot products, chosen at run time.
 *
 * Every type has one traits record. Activations are quantized once per row of x to the type's
 * act_type (Q8_0 for the 32-blocks, Q8_K for the K- and i-quants, F32 for float weights) and a weight
 * row is then dotted against them. The reduction order of vec_dot is fixed by n alone (blocks in
 * order, a fixed lane split inside a block), never by threads or by how many rows/tokens are in flight:
 * this is what makes logits identical across thread counts and prompt chunkings.
 */
#ifndef STRATA_QUANT_H
#define STRATA_QUANT_H

#include <stddef.h>
#include <stdint.h>

typedef struct quant_traits {
    const char *name;      /* "Q8_0" */
    int32_t type;          /* strata_type */
    int32_t block;         /* values per block */
    int32_t block_bytes;   /* bytes per block */
    int32_t act_type;      /* type the activations are quantized to for vec_dot */
    /* dst[n] = dequantized src (n a multiple of block). */
    void (*dequant)(const void *src, float *dst, int64_t n);
    /* For act types only: quantize x[n] into dst (n a multiple of block). NULL for weight-only types. */
    void (*quantize_act)(const float *x, void *dst, int64_t n);
    /* Dot of one weight row w[n] with act (already in act_type). Fixed reduction order. */
    float (*vec_dot)(int64_t n, const void *w, const void *act);
} quant_traits;

/* Select the kernel level (strata_simd); AUTO picks the best the CPU has. Returns the level used. */
int32_t quant_select(int32_t simd);
/* Traits of a type at the selected level, or NULL when strata cannot run it. */
const quant_traits *quant_get(int32_t type);
/* Bytes of a row of n values, -1 when n is not a whole number of blocks or the type is unknown. */
int64_t quant_row_bytes(int32_t type, int64_t n);
/* Name of any GGUF type id, known to strata or not ("type 99" for unknown ids is the caller's job). */
const char *quant_type_name(int32_t type);

#endif
