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
    const char *name;    /* "Q8_0" */
    int32_t type;        /* strata_type */
    int32_t block;       /* values per block */
    int32_t block_bytes; /* bytes per block */
    int32_t act_type;    /* type the activations are quantized to for vec_dot */
    /* dst[n] = dequantized src (n a multiple of block). */
    void (*dequant)(const void *src, float *dst, int64_t n);
    /* For act types only: quantize x[n] into dst (n a multiple of block). NULL for weight-only types. */
    void (*quantize_act)(const float *x, void *dst, int64_t n);
    /* Dot of one weight row w[n] with act (already in act_type). Fixed reduction order. */
    float (*vec_dot)(int64_t n, const void *w, const void *act);
} quant_traits;

/*
 * Optional four-row kernels: four weight rows, w_stride bytes apart, against one activation row.
 * out[i] must be bit-identical to vec_dot(n, w + i * w_stride, act): the same operations in the same
 * order for each output, only interleaved, so that the four share the activation loads. A family sets
 * one from its register function with quant_set_x4(table, type, fn); types without one use vec_dot.
 */
typedef void (*quant_dot_x4_fn)(int64_t n, const void *w, size_t w_stride, const void *act, float out[4]);
void quant_set_x4(const quant_traits table[], int32_t type, quant_dot_x4_fn fn);
/* The four-row kernel of a type's traits (as returned by quant_lookup), or NULL. */
quant_dot_x4_fn quant_get_x4(const quant_traits *traits);

/*
 * Optional many-token kernels: one weight row against n_act activation rows (pointers), decoding the
 * weights once for all of them (the prompt path). out[k] must be bit-identical to vec_dot(n, w, act[k]).
 * Set with quant_set_xn like the four-row kernels; matmul uses it for token tiles of more than one row.
 */
typedef void (*quant_dot_xn_fn)(int64_t n, const void *w, const void *const *act, int32_t n_act, float *out);
void quant_set_xn(const quant_traits table[], int32_t type, quant_dot_xn_fn fn);
/* The many-token kernel of a type's traits, or NULL. */
quant_dot_xn_fn quant_get_xn(const quant_traits *traits);
/* Activation rows a many-token kernel keeps in flight at once (any n_act works). */
#define QUANT_DOT_N_MAX 32

/*
 * Optional register-blocked kernels: four weight rows (w_stride bytes apart) against n_act activation
 * rows, each weight and activation block loaded once for the whole 4 x n_act tile (the prompt path).
 * out[4 * k + r] (token-major: the four rows of a token side by side, as the output rows are laid
 * out) must be bit-identical to vec_dot(n, w + r * w_stride, act[k]). Set with
 * quant_set_4xn; matmul prefers it to the many-token kernel for groups of four rows.
 */
typedef void (*quant_dot_4xn_fn)(int64_t n, const void *w, size_t w_stride, const void *const *act, int32_t n_act,
                                 float *out);
void quant_set_4xn(const quant_traits table[], int32_t type, quant_dot_4xn_fn fn);
/* Activation rows a four-row kernel keeps in flight at once (any n_act works). */
#define QUANT_DOT_4XN_MAX 64
/* The register-blocked kernel of a type's traits, or NULL. */
quant_dot_4xn_fn quant_get_4xn(const quant_traits *traits);

/* Type ids are GGUF's; tables are indexed by them. */
#define QUANT_N_TYPES 40

/*
 * Registration. Each type family lives in its own files (cpu/quant_<family>.c, plus
 * cpu/quant_<family>_avx2.c / _avx512.c for its SIMD kernels) and exports one function
 *     void quant_register_<family>(quant_traits table[QUANT_N_TYPES], int32_t simd);
 * that fills table[type] for its types at kernel level simd (scalar first, then overriding the
 * entries it has faster kernels for). quant.c calls every family once per level; adding a family
 * is one line in its k_families list.
 */
typedef void (*quant_register_fn)(quant_traits table[], int32_t simd);

/* F32, F16, BF16, Q8_0 (cpu/quant_scalar.c; SIMD overrides in cpu/quant_avx2.c, cpu/quant_avx512.c). */
void quant_register_base(quant_traits table[], int32_t simd);
void quant_base_avx2(quant_traits table[]);
void quant_base_avx512(quant_traits table[]);

/* f16 -> f32 for every half value, filled before any table is handed out. */
extern float quant_f16_lut[1 << 16];

/* The best level this CPU runs (never AUTO). */
int32_t quant_cpu_best(void);
/* 1 when the CPU can run level simd (AUTO and SCALAR always). */
int quant_simd_supported(int32_t simd);
/* "avx2 fma f16c avx512f ..." */
const char *quant_cpu_features(void);
/* The traits table of one level (AUTO = the best); built once, thread-safe, never freed. */
const quant_traits *quant_table(int32_t simd);
/* Traits of a type in a table, or NULL when that level cannot run it. */
const quant_traits *quant_lookup(const quant_traits *table, int32_t type);

/* Select the kernel level (strata_simd); AUTO picks the best the CPU has. Returns the level used. */
int32_t quant_select(int32_t simd);
/* The table of the level chosen by quant_select (AUTO until then). */
const quant_traits *quant_current_table(void);
/* Traits of a type at the selected level, or NULL when strata cannot run it. */
const quant_traits *quant_get(int32_t type);
/* Bytes of a row of n values, -1 when n is not a whole number of blocks or the type is unknown. */
int64_t quant_row_bytes(int32_t type, int64_t n);
/* Name of any GGUF type id, known to strata or not ("type 99" for unknown ids is the caller's job). */
const char *quant_type_name(int32_t type);

#endif
