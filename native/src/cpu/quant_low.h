/*
 * quant_low.h — the low-bit i-quants IQ2_XXS, IQ2_S, IQ1_S, IQ1_M and the microscaling type MXFP4:
 * block layouts, and the unpacking that every kernel level shares (cpu/quant_low*.c).
 *
 * Every kernel unpacks a block with the same portable code below into signed int8 values q and
 * per-16-value odd factors, then sums products exactly in int32, so the levels differ only in how
 * they add integers, and give the same bits:
 *   IQ2_XXS, IQ2_S: y = d (0.5 + s) / 4 grid sign = d (2 s + 1) / 8 * (grid sign):
 *       q = +-grid (<= 43), factor 2 s + 1 (<= 31), block dot ((dw da) / 8) * A;
 *   IQ1_S, IQ1_M:   y = d (2 s + 1) (g + delta), g in -1, 0, 1, delta = +-1/8:
 *       q = 8 g +- 1 (|q| <= 9), factor 2 s + 1 (<= 15), block dot ((dw da) / 8) * A;
 *   with A = sum over the 16 groups of 16 values of factor * sum(q a) (|A| <= 16 * 31 * 16 * 43 * 127);
 *   MXFP4 (32 values, Q8_0 activations): y = e8m0_half(e) * v, v one of the doubled e2m1 values
 *       (|v| <= 12); block dot (dw da) * sum(v a) into lane i mod 8, as the other 32-value types.
 */
#ifndef STRATA_QUANT_LOW_H
#define STRATA_QUANT_LOW_H

#include <stdint.h>
#include <string.h>

#include "iq_tables.h"
#include "quant_blocks.h"

typedef struct {
    uint16_t d;
    uint8_t qs[QK_K / 4];       /* per 32 values two u32: 4 grid indices (bytes), then 4 x 7 sign bits | scale << 28 */
} block_iq2_xxs;

typedef struct {
    uint16_t d;
    uint8_t qs[QK_K / 8];       /* low 8 bits of 32 grid indices (8 values each) */
    uint8_t signs[QK_K / 8];    /* one sign bit per value */
    uint8_t qh[QK_K / 32];      /* bits 8-9 of the indices, 2 per index */
    uint8_t scales[QK_K / 32];  /* 16 4-bit scales of 16 values */
} block_iq2_s;

typedef struct {
    uint16_t d;
    uint8_t qs[QK_K / 8];       /* low 8 bits of 32 indices into the 2048-entry grid */
    uint16_t qh[QK_K / 32];     /* per 32 values: 4 x 3 high index bits, 3-bit scale << 12, delta sign << 15 */
} block_iq1_s;

typedef struct {
    uint8_t qs[QK_K / 8];       /* low 8 bits of 32 indices */
    uint8_t qh[QK_K / 16];      /* per index a nibble: 3 high index bits, delta sign << 3 */
    uint8_t scales[QK_K / 32];  /* 4 u16: 4 x 3-bit scales of 16 values each, the f16 d in the top nibbles */
} block_iq1_m;

typedef struct {
    uint8_t e;                  /* E8M0 exponent: the scale is 2^(e - 128) (e8m0_half) */
    uint8_t qs[16];             /* value j: low nibble of qs[j] (j < 16), high nibble of qs[j - 16] */
} block_mxfp4;

_Static_assert(sizeof(block_iq2_xxs) == 66, "IQ2_XXS block is 66 bytes");
_Static_assert(sizeof(block_iq2_s) == 82, "IQ2_S block is 82 bytes");
_Static_assert(sizeof(block_iq1_s) == 50, "IQ1_S block is 50 bytes");
_Static_assert(sizeof(block_iq1_m) == 56, "IQ1_M block is 56 bytes");
_Static_assert(sizeof(block_mxfp4) == 17, "MXFP4 block is 17 bytes");

/* A 256-value block unpacked: q[v] signed, fl[p] the factor of values 2p and 2p + 1 (so that int16
 * lane p of a pair-sum vector meets its factor), d the block's float scale. */
typedef struct {
    int8_t q[QK_K];
    int16_t fl[QK_K / 2];
    float d;
} low_unpacked;

static inline void low_factors16(low_unpacked *u, const int32_t f[16]) {
    for (int p = 0; p < QK_K / 2; p++) u->fl[p] = (int16_t)f[p / 8];
}

static inline uint32_t low_u32(const uint8_t *p) {
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}

/* Tables derived from the format's tables once, before any kernel runs (quant_register_low):
 * low_sign_mask[s] has byte j = 0xFF where bit j of s is set; low_iq1_values[n][i] has byte j =
 * 8 * iq1s_grid[i][j] + 1 (n = 0) or - 1 (n = 1) as int8. */
extern uint64_t low_sign_mask[256];
extern uint64_t low_iq1_values[2][2048];

/* 8 magnitudes (each 1..127, so no byte carries) with the signs of bits s: -m = (m ^ 0xFF) + 1. */
static inline uint64_t low_signed8(uint64_t m, uint8_t s) {
    const uint64_t k = low_sign_mask[s];
    return (m ^ k) + (k & 0x0101010101010101ULL);
}

static inline void iq2xxs_unpack(const block_iq2_xxs *b, low_unpacked *u) {
    int32_t f[16];
    for (int ib = 0; ib < 8; ib++) {
        const uint32_t a1 = low_u32(b->qs + 8 * ib + 4);
        f[2 * ib] = f[2 * ib + 1] = 2 * (int32_t)(a1 >> 28) + 1;
        for (int l = 0; l < 4; l++) {
            const uint64_t v = low_signed8(iq2xxs_grid[b->qs[8 * ib + l]], iq_ksigns[(a1 >> (7 * l)) & 127]);
            memcpy(u->q + 32 * ib + 8 * l, &v, 8);
        }
    }
    low_factors16(u, f);
    u->d = quant_f16_lut[b->d];
}

static inline int iq2s_index(const block_iq2_s *b, int t) { return b->qs[t] | (((b->qh[t / 4] >> (2 * (t % 4))) & 3) << 8); }

static inline void iq2s_unpack(const block_iq2_s *b, low_unpacked *u) {
    int32_t f[16];
    for (int g = 0; g < 16; g++) f[g] = 2 * ((b->scales[g / 2] >> (4 * (g % 2))) & 0xF) + 1;
    for (int t = 0; t < 32; t++) {
        const uint64_t v = low_signed8(iq2s_grid[iq2s_index(b, t)], b->signs[t]);
        memcpy(u->q + 8 * t, &v, 8);
    }
    low_factors16(u, f);
    u->d = quant_f16_lut[b->d];
}

static inline void iq1s_unpack(const block_iq1_s *b, low_unpacked *u) {
    int32_t f[16];
    for (int ib = 0; ib < 8; ib++) {
        const int h = b->qh[ib];
        f[2 * ib] = f[2 * ib + 1] = 2 * ((h >> 12) & 7) + 1;
        const uint64_t *vals = low_iq1_values[(h >> 15) & 1];
        for (int l = 0; l < 4; l++)
            memcpy(u->q + 32 * ib + 8 * l, &vals[b->qs[4 * ib + l] | (((h >> (3 * l)) & 7) << 8)], 8);
    }
    low_factors16(u, f);
    u->d = quant_f16_lut[b->d];
}

/* The f16 d of an IQ1_M block, spread over the top nibbles of its four scale words. */
static inline uint16_t iq1m_d(const block_iq1_m *b, uint16_t sc[4]) {
    memcpy(sc, b->scales, 8);
    return (uint16_t)((sc[0] >> 12) | ((sc[1] >> 8) & 0x00F0) | ((sc[2] >> 4) & 0x0F00) | (sc[3] & 0xF000));
}

static inline void iq1m_unpack(const block_iq1_m *b, low_unpacked *u) {
    uint16_t sc[4];
    const uint16_t d = iq1m_d(b, sc);
    int32_t f[16];
    for (int j = 0; j < 16; j++) f[j] = 2 * ((sc[j / 4] >> (3 * (j % 4))) & 7) + 1;
    for (int t = 0; t < 32; t++) {
        const int h = (b->qh[t / 2] >> (4 * (t % 2))) & 0xF;
        memcpy(u->q + 8 * t, &low_iq1_values[h >> 3][b->qs[t] | ((h & 7) << 8)], 8);
    }
    low_factors16(u, f);
    u->d = quant_f16_lut[d];
}

/* ggml's e8m0_to_fp32_half: 2^(e - 128) as a float (e < 2: the subnormals 2^-128, 2^-127). */
static inline float mxfp4_scale(uint8_t e) {
    const uint32_t bits = e < 2 ? 0x00200000u << e : (uint32_t)(e - 1) << 23;
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

static inline void mxfp4_unpack(const block_mxfp4 *b, int8_t q[32]) {
    for (int j = 0; j < 16; j++) {
        q[j] = mxfp4_values[b->qs[j] & 0xF];
        q[j + 16] = mxfp4_values[b->qs[j] >> 4];
    }
}

/* kind is a constant at every call site: one kernel body, compiled per type */
enum { LOW_IQ2XXS, LOW_IQ2S, LOW_IQ1S, LOW_IQ1M };

static inline __attribute__((always_inline)) int low_block_bytes(const int kind) {
    return kind == LOW_IQ2XXS ? (int)sizeof(block_iq2_xxs)
           : kind == LOW_IQ2S ? (int)sizeof(block_iq2_s)
           : kind == LOW_IQ1S ? (int)sizeof(block_iq1_s)
                              : (int)sizeof(block_iq1_m);
}

static inline __attribute__((always_inline)) void low_unpack(const void *w, int64_t i, low_unpacked *u,
                                                             const int kind) {
    const uint8_t *p = (const uint8_t *)w + i * low_block_bytes(kind);
    if (kind == LOW_IQ2XXS)
        iq2xxs_unpack((const block_iq2_xxs *)p, u);
    else if (kind == LOW_IQ2S)
        iq2s_unpack((const block_iq2_s *)p, u);
    else if (kind == LOW_IQ1S)
        iq1s_unpack((const block_iq1_s *)p, u);
    else
        iq1m_unpack((const block_iq1_m *)p, u);
}

/* The float scale d of block i. */
static inline __attribute__((always_inline)) float low_block_d(const void *w, int64_t i, const int kind) {
    const uint8_t *p = (const uint8_t *)w + i * low_block_bytes(kind);
    if (kind == LOW_IQ1M) {
        uint16_t sc[4];
        return quant_f16_lut[iq1m_d((const block_iq1_m *)p, sc)];
    }
    uint16_t d;
    memcpy(&d, p, 2); /* the other three types start with their f16 d */
    return quant_f16_lut[d];
}

/* The float step of a block, the same at every level. */
static inline float low_block_float(float dw, float da, int32_t A) { return ((dw * da) * 0.125f) * (float)A; }

/*
 * The kernels of one level from its exact integer dot of an unpacked block with one activation block
 * (IDOT(u, a) -> int32 A) and of an MXFP4 block with a Q8_0 block (MXDOT(b, a) -> int32, the values
 * sum of mxfp4_unpack(b) times a): vec_dot and the many-token
 * kernel (each block unpacked once for up to QUANT_DOT_N_MAX tokens, every token's sum over the
 * blocks in vec_dot's order).
 */
#define LOW_LEVEL_KERNELS(SFX, IDOT, MXDOT)                                                                   \
    static inline __attribute__((always_inline)) float low_vec_dot_##SFX(int64_t n, const void *w, const void *act, \
                                                                         const int kind) {                     \
        const block_q8_K *y = act;                                                                             \
        float sum = 0.0f;                                                                                      \
        for (int64_t i = 0; i < n / QK_K; i++) {                                                               \
            low_unpacked u;                                                                                    \
            low_unpack(w, i, &u, kind);                                                                        \
            sum += low_block_float(u.d, y[i].d, IDOT(&u, y[i].qs));                                            \
        }                                                                                                      \
        return sum;                                                                                            \
    }                                                                                                          \
    static inline __attribute__((always_inline)) void low_vec_dot_n_##SFX(                                    \
        int64_t n, const void *w, const void *const *act, int32_t n_act, float *out, const int kind) {         \
        for (int32_t t0 = 0; t0 < n_act; t0 += QUANT_DOT_N_MAX) {                                              \
            const int32_t tn = n_act - t0 < QUANT_DOT_N_MAX ? n_act - t0 : QUANT_DOT_N_MAX;                    \
            float sums[QUANT_DOT_N_MAX] = {0};                                                                 \
            for (int64_t i = 0; i < n / QK_K; i++) {                                                           \
                low_unpacked u;                                                                                \
                low_unpack(w, i, &u, kind);                                                                    \
                for (int32_t k = 0; k < tn; k++) {                                                             \
                    const block_q8_K *y = (const block_q8_K *)act[t0 + k] + i;                                 \
                    sums[k] += low_block_float(u.d, y->d, IDOT(&u, y->qs));                                    \
                }                                                                                              \
            }                                                                                                  \
            for (int32_t k = 0; k < tn; k++) out[t0 + k] = sums[k];                                            \
        }                                                                                                      \
    }                                                                                                          \
    static float mxfp4_vec_dot_##SFX(int64_t n, const void *w, const void *act) {                              \
        const block_mxfp4 *x = w;                                                                              \
        const block_q8_0_act *y = act;                                                                         \
        float acc[8] = {0};                                                                                    \
        for (int64_t i = 0; i < n / 32; i++)                                                                   \
            acc[i & 7] += (mxfp4_scale(x[i].e) * quant_f16_lut[y[i].d]) * (float)MXDOT(&x[i], y[i].qs);        \
        return quant_sum8(acc);                                                                                \
    }                                                                                                          \
    static void mxfp4_vec_dot_n_##SFX(int64_t n, const void *w, const void *const *act, int32_t n_act,        \
                                      float *out) {                                                            \
        const block_mxfp4 *x = w;                                                                              \
        for (int32_t t0 = 0; t0 < n_act; t0 += QUANT_DOT_N_MAX) {                                              \
            const int32_t tn = n_act - t0 < QUANT_DOT_N_MAX ? n_act - t0 : QUANT_DOT_N_MAX;                    \
            float acc[QUANT_DOT_N_MAX][8] = {{0}};                                                             \
            for (int64_t i = 0; i < n / 32; i++) {                                                             \
                const float dw = mxfp4_scale(x[i].e);                                                          \
                for (int32_t k = 0; k < tn; k++) {                                                             \
                    const block_q8_0_act *y = (const block_q8_0_act *)act[t0 + k] + i;                         \
                    acc[k][i & 7] += (dw * quant_f16_lut[y->d]) * (float)MXDOT(&x[i], y->qs);                  \
                }                                                                                              \
            }                                                                                                  \
            for (int32_t k = 0; k < tn; k++) out[t0 + k] = quant_sum8(acc[k]);                                 \
        }                                                                                                      \
    }                                                                                                          \
    static float iq2xxs_vec_dot_##SFX(int64_t n, const void *w, const void *a) {                               \
        return low_vec_dot_##SFX(n, w, a, LOW_IQ2XXS);                                                         \
    }                                                                                                          \
    static float iq2s_vec_dot_##SFX(int64_t n, const void *w, const void *a) {                                 \
        return low_vec_dot_##SFX(n, w, a, LOW_IQ2S);                                                           \
    }                                                                                                          \
    static float iq1s_vec_dot_##SFX(int64_t n, const void *w, const void *a) {                                 \
        return low_vec_dot_##SFX(n, w, a, LOW_IQ1S);                                                           \
    }                                                                                                          \
    static float iq1m_vec_dot_##SFX(int64_t n, const void *w, const void *a) {                                 \
        return low_vec_dot_##SFX(n, w, a, LOW_IQ1M);                                                           \
    }                                                                                                          \
    static void iq2xxs_vec_dot_n_##SFX(int64_t n, const void *w, const void *const *a, int32_t na, float *o) { \
        low_vec_dot_n_##SFX(n, w, a, na, o, LOW_IQ2XXS);                                                       \
    }                                                                                                          \
    static void iq2s_vec_dot_n_##SFX(int64_t n, const void *w, const void *const *a, int32_t na, float *o) {   \
        low_vec_dot_n_##SFX(n, w, a, na, o, LOW_IQ2S);                                                         \
    }                                                                                                          \
    static void iq1s_vec_dot_n_##SFX(int64_t n, const void *w, const void *const *a, int32_t na, float *o) {   \
        low_vec_dot_n_##SFX(n, w, a, na, o, LOW_IQ1S);                                                         \
    }                                                                                                          \
    static void iq1m_vec_dot_n_##SFX(int64_t n, const void *w, const void *const *a, int32_t na, float *o) {   \
        low_vec_dot_n_##SFX(n, w, a, na, o, LOW_IQ1M);                                                         \
    }                                                                                                          \
    static void low_set_##SFX(quant_traits t[]) {                                                              \
        t[STRATA_TYPE_IQ2_XXS].vec_dot = iq2xxs_vec_dot_##SFX;                                                 \
        t[STRATA_TYPE_IQ2_S].vec_dot = iq2s_vec_dot_##SFX;                                                     \
        t[STRATA_TYPE_IQ1_S].vec_dot = iq1s_vec_dot_##SFX;                                                     \
        t[STRATA_TYPE_IQ1_M].vec_dot = iq1m_vec_dot_##SFX;                                                     \
        t[STRATA_TYPE_MXFP4].vec_dot = mxfp4_vec_dot_##SFX;                                                    \
        quant_set_xn(t, STRATA_TYPE_IQ2_XXS, iq2xxs_vec_dot_n_##SFX);                                          \
        quant_set_xn(t, STRATA_TYPE_IQ2_S, iq2s_vec_dot_n_##SFX);                                              \
        quant_set_xn(t, STRATA_TYPE_IQ1_S, iq1s_vec_dot_n_##SFX);                                              \
        quant_set_xn(t, STRATA_TYPE_IQ1_M, iq1m_vec_dot_n_##SFX);                                              \
        quant_set_xn(t, STRATA_TYPE_MXFP4, mxfp4_vec_dot_n_##SFX);                                             \
    }

void quant_register_low(quant_traits table[], int32_t simd);
void quant_low_avx2(quant_traits table[]);
void quant_low_avx512(quant_traits table[]);

#endif
