/*
 * quant_blocks.h — GGUF block layouts of the legacy, K- and i-quant weight types, the Q8_K
 * activation block, and the registration hooks of their kernel files.
 *
 * Layouts are facts of the file format (every field little-endian, blocks packed back to back, so
 * a block may sit at any byte address: kernels load them with unaligned loads or memcpy).
 *
 * Reduction orders, shared by every kernel level (scalar, AVX2, AVX-512) so that all levels give
 * the same bits:
 *   - every block's integer products are summed exactly in int32 (the bounds are noted per type);
 *   - 256-value blocks (K- and i-quants): the block's float contribution is one fixed expression of
 *     its exact integer sums and its scales, added to one float sum in block order;
 *   - 32-value blocks (Q4_0..Q5_1, IQ4_NL): block i's float contribution goes to lane i mod 8 of eight
 *     float sums, which are combined by a fixed pairwise tree at the end.
 * So a dot product depends on n alone, never on the kernel level, threads or tokens in flight.
 */
#ifndef STRATA_QUANT_BLOCKS_H
#define STRATA_QUANT_BLOCKS_H

#include <stdint.h>

#include "quant.h"

#define QK4_0 32
#define QK_K 256

/* ---- 32-value blocks ----------------------------------------------------------------------------- */

typedef struct {
    uint16_t d;            /* f16 scale */
    uint8_t qs[QK4_0 / 2]; /* value j: nibble j (low nibbles: 0..15, high: 16..31); y = d * (q - 8) */
} block_q4_0;

typedef struct {
    uint16_t d, m;         /* f16 scale and minimum */
    uint8_t qs[QK4_0 / 2]; /* y = d * q + m */
} block_q4_1;

typedef struct {
    uint16_t d;
    uint8_t qh[4];         /* bit j = 5th bit of value j */
    uint8_t qs[QK4_0 / 2]; /* y = d * (q - 16) */
} block_q5_0;

typedef struct {
    uint16_t d, m;
    uint8_t qh[4];
    uint8_t qs[QK4_0 / 2]; /* y = d * q + m */
} block_q5_1;

typedef struct {
    uint16_t d;
    uint8_t qs[QK4_0 / 2]; /* y = d * iq4nl_values[q] */
} block_iq4_nl;

/* The Q8_0 activation block (engine-core's type; repeated here for the dot products). */
typedef struct {
    uint16_t d;
    int8_t qs[32];
} block_q8_0_act;

_Static_assert(sizeof(block_q4_0) == 18, "Q4_0 block is 18 bytes");
_Static_assert(sizeof(block_q4_1) == 20, "Q4_1 block is 20 bytes");
_Static_assert(sizeof(block_q5_0) == 22, "Q5_0 block is 22 bytes");
_Static_assert(sizeof(block_q5_1) == 24, "Q5_1 block is 24 bytes");
_Static_assert(sizeof(block_iq4_nl) == 18, "IQ4_NL block is 18 bytes");
_Static_assert(sizeof(block_q8_0_act) == 34, "Q8_0 block is 34 bytes");

/* ---- 256-value blocks ---------------------------------------------------------------------------- */

typedef struct {
    uint8_t scales[QK_K / 16]; /* per 16 values: low nibble scale, high nibble min */
    uint8_t qs[QK_K / 4];      /* 2-bit values; byte b of a 32-byte group holds values b, b+32, b+64, b+96 */
    uint16_t d, dmin;          /* y = d * sc * q - dmin * m */
} block_q2_K;

typedef struct {
    uint8_t hmask[QK_K / 8]; /* bit set: value has no -4 offset */
    uint8_t qs[QK_K / 4];    /* low 2 bits */
    uint8_t scales[12];      /* 16 6-bit scales, offset 32 */
    uint16_t d;              /* y = d * (sc - 32) * (q - (hbit ? 0 : 4)) */
} block_q3_K;

typedef struct {
    uint16_t d, dmin;
    uint8_t scales[12];   /* 8 6-bit scales and 8 6-bit mins */
    uint8_t qs[QK_K / 2]; /* y = d * sc * q - dmin * m */
} block_q4_K;

typedef struct {
    uint16_t d, dmin;
    uint8_t scales[12];
    uint8_t qh[QK_K / 8];
    uint8_t qs[QK_K / 2];
} block_q5_K;

typedef struct {
    uint8_t ql[QK_K / 2];
    uint8_t qh[QK_K / 4];
    int8_t scales[QK_K / 16]; /* y = d * sc * (q - 32) */
    uint16_t d;
} block_q6_K;

typedef struct {
    uint16_t d;
    uint16_t scales_h;           /* high 2 bits of the 8 sub-block scales */
    uint8_t scales_l[QK_K / 64]; /* low 4 bits */
    uint8_t qs[QK_K / 2];        /* y = d * (ls - 32) * iq4nl_values[q] */
} block_iq4_xs;

typedef struct {
    uint16_t d;
    uint8_t qs[QK_K / 4];  /* 64 grid indices (4 values each) */
    uint8_t sas[QK_K / 8]; /* per 32 values one u32: 4 x 7 sign bits, 4-bit scale on top */
} block_iq3_xxs;

typedef struct {
    uint16_t d;
    uint8_t qs[QK_K / 4];      /* low 8 bits of 64 grid indices */
    uint8_t qh[QK_K / 32];     /* 9th bit of each index */
    uint8_t signs[QK_K / 8];   /* one sign bit per value */
    uint8_t scales[QK_K / 64]; /* 8 4-bit scales: y = d * (1 + 2 s) * grid * sign */
} block_iq3_s;

typedef struct {
    uint16_t d;
    uint16_t qs[QK_K / 8];     /* 9-bit grid index (8 values) | 7 sign bits << 9 */
    uint8_t scales[QK_K / 32]; /* 16 4-bit scales: y = d * (0.5 + s) / 4 * grid * sign */
} block_iq2_xs;

/* Activations of the 256-blocks: y = d * qs, |qs| <= 127, bsums[i] = sum of qs[16 i .. 16 i + 15]. */
typedef struct {
    float d;
    int8_t qs[QK_K];
    int16_t bsums[QK_K / 16];
} block_q8_K;

_Static_assert(sizeof(block_q2_K) == 84, "Q2_K block is 84 bytes");
_Static_assert(sizeof(block_q3_K) == 110, "Q3_K block is 110 bytes");
_Static_assert(sizeof(block_q4_K) == 144, "Q4_K block is 144 bytes");
_Static_assert(sizeof(block_q5_K) == 176, "Q5_K block is 176 bytes");
_Static_assert(sizeof(block_q6_K) == 210, "Q6_K block is 210 bytes");
_Static_assert(sizeof(block_iq4_xs) == 136, "IQ4_XS block is 136 bytes");
_Static_assert(sizeof(block_iq3_xxs) == 98, "IQ3_XXS block is 98 bytes");
_Static_assert(sizeof(block_iq3_s) == 110, "IQ3_S block is 110 bytes");
_Static_assert(sizeof(block_iq2_xs) == 74, "IQ2_XS block is 74 bytes");
_Static_assert(sizeof(block_q8_K) == 292, "Q8_K block is 292 bytes");

/* ---- shared helpers ------------------------------------------------------------------------------ */

/* The 6-bit scale and min of sub-block j of a Q4_K / Q5_K block. */
static inline void q4k_scale_min(int j, const uint8_t *s, uint8_t *sc, uint8_t *m) {
    if (j < 4) {
        *sc = s[j] & 63;
        *m = s[j + 4] & 63;
    } else {
        *sc = (uint8_t)((s[j + 4] & 0xF) | ((s[j - 4] >> 6) << 4));
        *m = (uint8_t)((s[j + 4] >> 4) | ((s[j] >> 6) << 4));
    }
}

/* The 16 signed 6-bit scales of a Q3_K block (already minus 32). */
static inline void q3k_scales(const uint8_t *s, int8_t out[16]) {
    for (int j = 0; j < 16; j++) {
        int lo = (j < 8 ? s[j] : s[j - 8] >> 4) & 0xF;
        int hi = (s[8 + (j & 3)] >> (2 * (j >> 2))) & 3;
        out[j] = (int8_t)((lo | (hi << 4)) - 32);
    }
}

/* The combine of the eight lane sums of the 32-value block types. */
static inline float quant_sum8(const float a[8]) {
    return ((a[0] + a[1]) + (a[2] + a[3])) + ((a[4] + a[5]) + (a[6] + a[7]));
}

/* ---- registration (quant.c calls the family functions, they call their SIMD overrides) --------- */

void quant_register_legacy(quant_traits table[], int32_t simd);
void quant_legacy_avx2(quant_traits table[]);
void quant_legacy_avx512(quant_traits table[]);

void quant_register_k(quant_traits table[], int32_t simd);
/* The portable Q8_K activation quantizer (the SIMD ones give its bytes; they fall back to it for
 * blocks with infinities or NaN). */
void quant_q8k_quantize_act_scalar(const float *x, void *dst, int64_t n);
void quant_k_avx2(quant_traits table[]);
void quant_k_avx512(quant_traits table[]);

void quant_register_iq(quant_traits table[], int32_t simd);
/* IQ4_NL's AVX2 dot lives with the other 32-value blocks (quant_legacy_avx2.c). */
float quant_iq4nl_vec_dot_avx2(int64_t n, const void *w, const void *act);
/* And its AVX-512 one-row, four-row and prompt kernels (quant_legacy_avx512.c). */
float quant_iq4nl_vec_dot_avx512(int64_t n, const void *w, const void *act);
void quant_iq4nl_vec_dot_x4_avx512(int64_t n, const void *w, size_t w_stride, const void *act, float out[4]);
void quant_iq4nl_vec_dot_4xn_avx512(int64_t n, const void *w, size_t w_stride, const void *const *act, int32_t n_act,
                                    float *out);
void quant_iq_avx2(quant_traits table[]);
void quant_iq_avx512(quant_traits table[]);

#endif
