/*
 * group_dequant_types.h — gq_dequant8 for the block types beyond F32 / F16 / BF16 / Q8_0 / Q4_0 / Q4_K /
 * Q6_K (included by group_dequant.h, which documents the slice convention): the 8 values 8 s .. 8 s + 7
 * of group g (the 32 values from column 32 g) of a row, computed with gguf-py's float32 expressions in
 * gguf-py's order (the CPU kernels' dequantization, native/src/cpu/quant_*.c, computes the same), so
 * that the device, its host mirror and gguf-py give the same bits.
 *
 * Block layouts (GGUF facts; offsets in bytes):
 *   Q4_1    32 values, 20 B: f16 d, f16 m, qs[16]               w = d * q + m        (q: 4 bits)
 *   Q5_0    32 values, 22 B: f16 d, qh[4], qs[16]               w = d * (q - 16)     (q: 4 bits | bit j of qh << 4)
 *   Q5_1    32 values, 24 B: f16 d, f16 m, qh[4], qs[16]        w = d * q + m
 *   IQ4_NL  32 values, 18 B: f16 d, qs[16]                      w = d * kv[q]
 *   MXFP4   32 values, 17 B: u8 e, qs[16]                       w = 2^(e-128) * v[q]  (v: doubled e2m1 values)
 *     (value j < 16: low nibble of qs[j]; value j >= 16: high nibble of qs[j - 16])
 *   Q2_K   256 values, 84 B: scales[16] (sc | m << 4 per 16 values) @0, qs[64] @16, f16 d @80, f16 dmin @82
 *                            value 128 h + 32 k + c = bits 2k of qs[32 h + c]     w = (d * sc) * q - dmin * m
 *   Q3_K   256 values, 110 B: hmask[32] @0, qs[64] @32, scales[12] @96, f16 d @108
 *                            low bits as Q2_K; value v loses 4 unless bit v / 32 of hmask[v % 32] is set
 *                            w = (d * (sc - 32)) * q, 6-bit sc per 16 values
 *   Q5_K   256 values, 176 B: f16 d, f16 dmin, scales[12] @4 (as Q4_K), qh[32] @16, qs[128] @48
 *                            value 64 h + 32 b + c = nibble b of qs[32 h + c] | bit (v / 32) of qh[c] << 4
 *   IQ4_XS 256 values, 136 B: f16 d, u16 scales_h @2, scales_l[4] @4, qs[128] @8 (16 per sub-block of 32)
 *                            w = (d * (ls - 32)) * kv[q], ls = 4 bits of scales_l | 2 bits of scales_h << 4
 *   IQ3_XXS 256 values, 98 B: f16 d, qs[64] @2 (grid indices, 4 values each), sas[32] @66 (u32 per 32 values:
 *                            4 x 7 sign bits, scale << 28)       w = ((d * (0.5 + s)) * 0.5) * grid * sign
 *   IQ3_S  256 values, 110 B: f16 d, qs[64] @2, qh[8] @66 (9th index bits), signs[32] @74, scales[4] @106
 *                            w = (d * (1 + 2 s)) * grid * sign, a 4-bit s per 32 values
 *   IQ2_XS 256 values, 74 B: f16 d, u16 qs[32] @2 (9-bit index | 7 sign bits << 9), scales[8] @66
 *                            w = ((d * (0.5 + s)) * 0.25) * grid * sign, a 4-bit s per 16 values
 *   IQ2_XXS 256 values, 66 B: f16 d, per 32 values 8 bytes @2 + 8 ib: 4 grid indices, then a u32 of
 *                            4 x 7 sign bits | s << 28            w = ((d * (0.5 + s)) * 0.25) * grid * sign
 *   IQ2_S  256 values, 82 B: f16 d, qs[32] @2, signs[32] @34, qh[8] @66 (2 index bits each), scales[8] @74
 *                            w = ((d * (0.5 + s)) * 0.25) * grid * sign, a 4-bit s per 16 values
 *   IQ1_S  256 values, 50 B: f16 d, qs[32] @2, u16 qh[8] @34 (4 x 3 index bits, s << 12, delta sign << 15)
 *                            w = (d * (2 s + 1)) * (grid + delta), delta = +-1/8, grid in -1, 0, 1
 *   IQ1_M  256 values, 56 B: qs[32] @0, qh[16] @32 (a nibble per index: 3 bits, delta sign << 3),
 *                            scales[8] @48 (4 u16: 4 x 3-bit s per 16 values; f16 d in the top nibbles)
 * Signs are applied by multiplying with +-1.0 (built from bits, so no compiler turns it into a negation,
 * which would differ from gguf-py's product on a NaN).
 */
#ifndef STRATA_GROUP_DEQUANT_TYPES_H
#define STRATA_GROUP_DEQUANT_TYPES_H

#include "iq_tables.h"
#ifdef __CUDACC__
#include "iq_tables_dev.h"
#endif

/* The lookup tables: the device's copies in device code, the host's elsewhere. */
#ifdef __CUDA_ARCH__
#define GQ_TAB(name) gqd_##name
#else
#define GQ_TAB(name) name
#endif

GQ_FN float gq_f16_bits(uint16_t h) {
    const uint8_t p[2] = {(uint8_t)(h & 0xFF), (uint8_t)(h >> 8)};
    return gq_f16(p);
}
GQ_FN uint32_t gq_u32(const uint8_t *p) {
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24);
}
GQ_FN uint32_t gq_u16(const uint8_t *p) { return (uint32_t)p[0] | ((uint32_t)p[1] << 8); }
/* +1.0f for bit 0, -1.0f for bit 1 */
GQ_FN float gq_sign1(uint32_t bit) {
    const uint32_t u = 0x3F800000u | ((bit & 1u) << 31);
    float f;
    memcpy(&f, &u, 4);
    return f;
}
/* MXFP4's scale 2^(e - 128) (e < 2: the subnormals 2^-128, 2^-127) */
GQ_FN float gq_e8m0_half(uint8_t e) {
    const uint32_t bits = e < 2 ? 0x00200000u << e : (uint32_t)(e - 1) << 23;
    float f;
    memcpy(&f, &bits, 4);
    return f;
}
/* nibble of value e0 + l of a 32-value block's qs[16] */
GQ_FN int gq_nib(const uint8_t *qs, int e0, int l) { return ((qs[(e0 & 15) + l] >> (e0 >= 16 ? 4 : 0)) & 0xF); }

GQ_FN void gq_dq8_q4_1(const uint8_t *row, int64_t g, int e0, float *w) {
    const uint8_t *b = row + g * 20;
    const float d = gq_f16(b), m = gq_f16(b + 2);
    for (int l = 0; l < 8; l++) w[l] = d * (float)gq_nib(b + 4, e0, l) + m;
}
GQ_FN void gq_dq8_q5_0(const uint8_t *row, int64_t g, int e0, float *w) {
    const uint8_t *b = row + g * 22;
    const float d = gq_f16(b);
    const uint32_t qh = gq_u32(b + 2);
    for (int l = 0; l < 8; l++)
        w[l] = d * (float)((gq_nib(b + 6, e0, l) | (int)(((qh >> (e0 + l)) & 1u) << 4)) - 16);
}
GQ_FN void gq_dq8_q5_1(const uint8_t *row, int64_t g, int e0, float *w) {
    const uint8_t *b = row + g * 24;
    const float d = gq_f16(b), m = gq_f16(b + 2);
    const uint32_t qh = gq_u32(b + 4);
    for (int l = 0; l < 8; l++) w[l] = d * (float)(gq_nib(b + 8, e0, l) | (int)(((qh >> (e0 + l)) & 1u) << 4)) + m;
}
GQ_FN void gq_dq8_iq4_nl(const uint8_t *row, int64_t g, int e0, float *w) {
    const uint8_t *b = row + g * 18;
    const float d = gq_f16(b);
    for (int l = 0; l < 8; l++) w[l] = d * (float)GQ_TAB(iq4nl_values)[gq_nib(b + 2, e0, l)];
}
GQ_FN void gq_dq8_mxfp4(const uint8_t *row, int64_t g, int e0, float *w) {
    const uint8_t *b = row + g * 17;
    const float d = gq_e8m0_half(b[0]);
    for (int l = 0; l < 8; l++) w[l] = d * (float)GQ_TAB(mxfp4_values)[gq_nib(b + 1, e0, l)];
}

/* 256-value blocks: j = g % 8 is the sub-block of 32 values, e0 = 8 s the first of the 8 within it */
GQ_FN void gq_dq8_q2_k(const uint8_t *row, int64_t g, int e0, float *w) {
    const uint8_t *b = row + (g >> 3) * 84;
    const int j = (int)(g & 7);
    const uint8_t sc = b[2 * j + (e0 >> 4)];
    const float dl = gq_f16(b + 80) * (float)(sc & 0xF), ml = gq_f16(b + 82) * (float)(sc >> 4);
    const uint8_t *qs = b + 16 + 32 * (j >> 2) + e0;
    const int sh = 2 * (j & 3);
    for (int l = 0; l < 8; l++) w[l] = dl * (float)((qs[l] >> sh) & 3) - ml;
}
GQ_FN void gq_dq8_q3_k(const uint8_t *row, int64_t g, int e0, float *w) {
    const uint8_t *b = row + (g >> 3) * 110;
    const int j = (int)(g & 7), i = 2 * j + (e0 >> 4); /* scale of 16 values */
    const uint8_t *s = b + 96;
    const int lo = (i < 8 ? s[i] : s[i - 8] >> 4) & 0xF, hi = (s[8 + (i & 3)] >> (2 * (i >> 2))) & 3;
    const float dl = gq_f16(b + 108) * (float)((lo | (hi << 4)) - 32);
    const uint8_t *qs = b + 32 + 32 * (j >> 2) + e0, *hm = b + e0;
    const int sh = 2 * (j & 3);
    for (int l = 0; l < 8; l++) w[l] = dl * (float)(((qs[l] >> sh) & 3) - (((hm[l] >> j) & 1) ? 0 : 4));
}
GQ_FN void gq_dq8_q5_k(const uint8_t *row, int64_t g, int e0, float *w) {
    const uint8_t *b = row + (g >> 3) * 176;
    const int j = (int)(g & 7);
    int sc, m;
    gq_q4k_scale_min(b + 4, j, &sc, &m);
    const float dl = gq_f16(b) * (float)sc, ml = gq_f16(b + 2) * (float)m;
    const uint8_t *qs = b + 48 + 32 * (j >> 1) + e0, *qh = b + 16 + e0;
    const int sh = 4 * (j & 1);
    for (int l = 0; l < 8; l++) w[l] = dl * (float)(((qs[l] >> sh) & 0xF) | (((qh[l] >> j) & 1) << 4)) - ml;
}
GQ_FN void gq_dq8_iq4_xs(const uint8_t *row, int64_t g, int e0, float *w) {
    const uint8_t *b = row + (g >> 3) * 136;
    const int j = (int)(g & 7);
    const int ls = ((b[4 + j / 2] >> (4 * (j % 2))) & 0xF) | (int)(((gq_u16(b + 2) >> (2 * j)) & 3u) << 4);
    const float dl = gq_f16(b) * (float)(ls - 32);
    for (int l = 0; l < 8; l++) w[l] = dl * (float)GQ_TAB(iq4nl_values)[gq_nib(b + 8 + 16 * j, e0, l)];
}
GQ_FN void gq_dq8_iq3_xxs(const uint8_t *row, int64_t g, int e0, float *w) {
    const uint8_t *b = row + (g >> 3) * 98;
    const int ib = (int)(g & 7), s = e0 >> 3;
    const uint32_t aux = gq_u32(b + 66 + 4 * ib);
    const float db = gq_f16(b) * (0.5f + (float)(aux >> 28)) * 0.5f;
    const uint32_t sg = GQ_TAB(iq_ksigns)[(aux >> (7 * s)) & 127];
    const uint32_t g1 = GQ_TAB(iq3xxs_grid)[b[2 + 8 * ib + 2 * s]], g2 = GQ_TAB(iq3xxs_grid)[b[2 + 8 * ib + 2 * s + 1]];
    for (int l = 0; l < 4; l++) {
        w[l] = db * (float)((g1 >> (8 * l)) & 0xFF) * gq_sign1(sg >> l);
        w[l + 4] = db * (float)((g2 >> (8 * l)) & 0xFF) * gq_sign1(sg >> (l + 4));
    }
}
GQ_FN void gq_dq8_iq3_s(const uint8_t *row, int64_t g, int e0, float *w) {
    const uint8_t *b = row + (g >> 3) * 110;
    const int j = (int)(g & 7), t = 8 * j + (e0 >> 2); /* grid entries t, t + 1 */
    const float db = gq_f16(b) * (float)(1 + 2 * ((b[106 + j / 2] >> (4 * (j % 2))) & 0xF));
    const uint32_t sg = b[74 + 4 * j + (e0 >> 3)];
    for (int h = 0; h < 2; h++) {
        const int tt = t + h;
        const uint32_t gr = GQ_TAB(iq3s_grid)[b[2 + tt] | (((b[66 + tt / 8] >> (tt % 8)) & 1) << 8)];
        for (int l = 0; l < 4; l++)
            w[4 * h + l] = db * (float)((gr >> (8 * l)) & 0xFF) * gq_sign1(sg >> (4 * h + l));
    }
}
GQ_FN void gq_dq8_iq2_xs(const uint8_t *row, int64_t g, int e0, float *w) {
    const uint8_t *b = row + (g >> 3) * 74;
    const int t = 4 * (int)(g & 7) + (e0 >> 3), k = t / 2; /* 8 values of entry t; scale k of 16 values */
    const float db = gq_f16(b) * (0.5f + (float)((b[66 + k / 2] >> (4 * (k % 2))) & 0xF)) * 0.25f;
    const uint32_t q = gq_u16(b + 2 + 2 * t);
    const uint64_t gr = GQ_TAB(iq2xs_grid)[q & 511];
    const uint32_t sg = GQ_TAB(iq_ksigns)[q >> 9];
    for (int l = 0; l < 8; l++) w[l] = db * (float)((gr >> (8 * l)) & 0xFF) * gq_sign1(sg >> l);
}
GQ_FN void gq_dq8_iq2_xxs(const uint8_t *row, int64_t g, int e0, float *w) {
    const uint8_t *b = row + (g >> 3) * 66;
    const int ib = (int)(g & 7), s = e0 >> 3;
    const uint32_t a1 = gq_u32(b + 2 + 8 * ib + 4);
    const float db = gq_f16(b) * (0.5f + (float)(a1 >> 28)) * 0.25f;
    const uint64_t gr = GQ_TAB(iq2xxs_grid)[b[2 + 8 * ib + s]];
    const uint32_t sg = GQ_TAB(iq_ksigns)[(a1 >> (7 * s)) & 127];
    for (int l = 0; l < 8; l++) w[l] = db * (float)((gr >> (8 * l)) & 0xFF) * gq_sign1(sg >> l);
}
GQ_FN void gq_dq8_iq2_s(const uint8_t *row, int64_t g, int e0, float *w) {
    const uint8_t *b = row + (g >> 3) * 82;
    const int t = 4 * (int)(g & 7) + (e0 >> 3), k = t / 2;
    const float db = gq_f16(b) * (0.5f + (float)((b[74 + k / 2] >> (4 * (k % 2))) & 0xF)) * 0.25f;
    const uint64_t gr = GQ_TAB(iq2s_grid)[b[2 + t] | (((b[66 + t / 4] >> (2 * (t % 4))) & 3) << 8)];
    const uint32_t sg = b[34 + t];
    for (int l = 0; l < 8; l++) w[l] = db * (float)((gr >> (8 * l)) & 0xFF) * gq_sign1(sg >> l);
}
GQ_FN void gq_dq8_iq1_s(const uint8_t *row, int64_t g, int e0, float *w) {
    const uint8_t *b = row + (g >> 3) * 50;
    const int ib = (int)(g & 7), s = e0 >> 3;
    const uint32_t h = gq_u16(b + 34 + 2 * ib);
    const float dl = gq_f16(b) * (float)(2 * ((h >> 12) & 7) + 1);
    const float delta = (h & 0x8000) ? -0.125f : 0.125f;
    const uint64_t gr = GQ_TAB(iq1s_grid)[b[2 + 4 * ib + s] | (((h >> (3 * s)) & 7) << 8)];
    for (int l = 0; l < 8; l++) w[l] = dl * ((float)(int8_t)(uint8_t)(gr >> (8 * l)) + delta);
}
GQ_FN void gq_dq8_iq1_m(const uint8_t *row, int64_t g, int e0, float *w) {
    const uint8_t *b = row + (g >> 3) * 56;
    const int t = 4 * (int)(g & 7) + (e0 >> 3), k = t / 2;
    const uint32_t s0 = gq_u16(b + 48), s1 = gq_u16(b + 50), s2 = gq_u16(b + 52), s3 = gq_u16(b + 54);
    const float d = gq_f16_bits((uint16_t)((s0 >> 12) | ((s1 >> 8) & 0x00F0) | ((s2 >> 4) & 0x0F00) | (s3 & 0xF000)));
    const uint32_t sk = gq_u16(b + 48 + 2 * (k / 4));
    const float dl = d * (float)(2 * ((sk >> (3 * (k % 4))) & 7) + 1);
    const int h = (b[32 + t / 2] >> (4 * (t % 2))) & 0xF;
    const float delta = (h & 8) ? -0.125f : 0.125f;
    const uint64_t gr = GQ_TAB(iq1s_grid)[b[t] | ((h & 7) << 8)];
    for (int l = 0; l < 8; l++) w[l] = dl * ((float)(int8_t)(uint8_t)(gr >> (8 * l)) + delta);
}

/* ---- the 8-bit forms of the tensor-core prompt product (cuda/mmq_types.cu, cuda_mirror_mmq) ----------
 * Each type's group of 32 values as int8 values q and float scales with w = s * q (+ m): gq_w4_<type> packs
 * values v0 .. v0 + 3 (v0 = 0, 4, .. 28) of group j of block b little-endian (b: the block; j: the group
 * within it, 0 for the 32-value types); gq_ws_<type> gives s[0], s[1] (the scales of values 0..15 and
 * 16..31) and m[0], m[1] (additive terms, negated for the types that subtract a minimum: an exact
 * negation). GQ_MQ_SPLIT: the halves have their own scales (and minimums); GQ_MQ_MIN: the type has a
 * minimum. The values are integers of the format (the i-quants' signed grid values, IQ1's 8 g +- 1 with
 * s = dl / 8, exact), so a block's integer dot is exact and the float expression of cuda_mirror_mmq is
 * the only rounding. */
#define GQ_MQ_SPLIT 1
#define GQ_MQ_MIN 2

GQ_FN uint32_t gq_pack4(int a, int b, int c, int d) {
    return (uint32_t)(uint8_t)a | ((uint32_t)(uint8_t)b << 8) | ((uint32_t)(uint8_t)c << 16) | ((uint32_t)(uint8_t)d << 24);
}
/* 4 magnitudes (bytes of m) with sign bits sg >> 0..3 */
GQ_FN uint32_t gq_signed4(uint32_t m, uint32_t sg) {
    int v[4];
    for (int k = 0; k < 4; k++) {
        const int x = (int)((m >> (8 * k)) & 0xFF);
        v[k] = ((sg >> k) & 1) ? -x : x;
    }
    return gq_pack4(v[0], v[1], v[2], v[3]);
}

GQ_FN uint32_t gq_w4_q4_1(const uint8_t *b, int j, int v0) {
    (void)j;
    return gq_pack4(gq_nib(b + 4, v0 & 16, (v0 & 15)), gq_nib(b + 4, v0 & 16, (v0 & 15) + 1),
                    gq_nib(b + 4, v0 & 16, (v0 & 15) + 2), gq_nib(b + 4, v0 & 16, (v0 & 15) + 3));
}
GQ_FN void gq_ws_q4_1(const uint8_t *b, int j, float *s, float *m) {
    (void)j;
    s[0] = s[1] = gq_f16(b);
    m[0] = m[1] = gq_f16(b + 2);
}
GQ_FN int gq_q5v(const uint8_t *qs, uint32_t qh, int v) {
    return gq_nib(qs, v & 16, v & 15) | (int)(((qh >> v) & 1u) << 4);
}
GQ_FN uint32_t gq_w4_q5_0(const uint8_t *b, int j, int v0) {
    (void)j;
    const uint32_t qh = gq_u32(b + 2);
    return gq_pack4(gq_q5v(b + 6, qh, v0) - 16, gq_q5v(b + 6, qh, v0 + 1) - 16, gq_q5v(b + 6, qh, v0 + 2) - 16,
                    gq_q5v(b + 6, qh, v0 + 3) - 16);
}
GQ_FN void gq_ws_q5_0(const uint8_t *b, int j, float *s, float *m) {
    (void)j;
    s[0] = s[1] = gq_f16(b);
    m[0] = m[1] = 0.0f;
}
GQ_FN uint32_t gq_w4_q5_1(const uint8_t *b, int j, int v0) {
    (void)j;
    const uint32_t qh = gq_u32(b + 4);
    return gq_pack4(gq_q5v(b + 8, qh, v0), gq_q5v(b + 8, qh, v0 + 1), gq_q5v(b + 8, qh, v0 + 2),
                    gq_q5v(b + 8, qh, v0 + 3));
}
GQ_FN void gq_ws_q5_1(const uint8_t *b, int j, float *s, float *m) { gq_ws_q4_1(b, j, s, m); }
GQ_FN uint32_t gq_w4_iq4_nl(const uint8_t *b, int j, int v0) {
    (void)j;
    int v[4];
    for (int k = 0; k < 4; k++) v[k] = GQ_TAB(iq4nl_values)[gq_nib(b + 2, v0 & 16, (v0 & 15) + k)];
    return gq_pack4(v[0], v[1], v[2], v[3]);
}
GQ_FN void gq_ws_iq4_nl(const uint8_t *b, int j, float *s, float *m) { gq_ws_q5_0(b, j, s, m); }
GQ_FN uint32_t gq_w4_mxfp4(const uint8_t *b, int j, int v0) {
    (void)j;
    int v[4];
    for (int k = 0; k < 4; k++) v[k] = GQ_TAB(mxfp4_values)[gq_nib(b + 1, v0 & 16, (v0 & 15) + k)];
    return gq_pack4(v[0], v[1], v[2], v[3]);
}
GQ_FN void gq_ws_mxfp4(const uint8_t *b, int j, float *s, float *m) {
    (void)j;
    s[0] = s[1] = gq_e8m0_half(b[0]);
    m[0] = m[1] = 0.0f;
}

GQ_FN uint32_t gq_w4_q2_k(const uint8_t *b, int j, int v0) {
    const uint8_t *qs = b + 16 + 32 * (j >> 2) + v0;
    const int sh = 2 * (j & 3);
    return gq_pack4((qs[0] >> sh) & 3, (qs[1] >> sh) & 3, (qs[2] >> sh) & 3, (qs[3] >> sh) & 3);
}
GQ_FN void gq_ws_q2_k(const uint8_t *b, int j, float *s, float *m) {
    const float d = gq_f16(b + 80), dmin = gq_f16(b + 82);
    for (int h = 0; h < 2; h++) {
        const uint8_t sc = b[2 * j + h];
        s[h] = d * (float)(sc & 0xF);
        m[h] = -(dmin * (float)(sc >> 4));
    }
}
GQ_FN uint32_t gq_w4_q3_k(const uint8_t *b, int j, int v0) {
    const uint8_t *qs = b + 32 + 32 * (j >> 2) + v0, *hm = b + v0;
    const int sh = 2 * (j & 3);
    int v[4];
    for (int k = 0; k < 4; k++) v[k] = ((qs[k] >> sh) & 3) - (((hm[k] >> j) & 1) ? 0 : 4);
    return gq_pack4(v[0], v[1], v[2], v[3]);
}
GQ_FN void gq_ws_q3_k(const uint8_t *b, int j, float *s, float *m) {
    const float d = gq_f16(b + 108);
    const uint8_t *sc = b + 96;
    for (int h = 0; h < 2; h++) {
        const int i = 2 * j + h;
        const int lo = (i < 8 ? sc[i] : sc[i - 8] >> 4) & 0xF, hi = (sc[8 + (i & 3)] >> (2 * (i >> 2))) & 3;
        s[h] = d * (float)((lo | (hi << 4)) - 32);
        m[h] = 0.0f;
    }
}
GQ_FN uint32_t gq_w4_q5_k(const uint8_t *b, int j, int v0) {
    const uint8_t *qs = b + 48 + 32 * (j >> 1) + v0, *qh = b + 16 + v0;
    const int sh = 4 * (j & 1);
    int v[4];
    for (int k = 0; k < 4; k++) v[k] = ((qs[k] >> sh) & 0xF) | (((qh[k] >> j) & 1) << 4);
    return gq_pack4(v[0], v[1], v[2], v[3]);
}
GQ_FN void gq_ws_q5_k(const uint8_t *b, int j, float *s, float *m) {
    int sc, mn;
    gq_q4k_scale_min(b + 4, j, &sc, &mn);
    s[0] = s[1] = gq_f16(b) * (float)sc;
    m[0] = m[1] = -(gq_f16(b + 2) * (float)mn);
}
GQ_FN uint32_t gq_w4_iq4_xs(const uint8_t *b, int j, int v0) {
    int v[4];
    for (int k = 0; k < 4; k++) v[k] = GQ_TAB(iq4nl_values)[gq_nib(b + 8 + 16 * j, v0 & 16, (v0 & 15) + k)];
    return gq_pack4(v[0], v[1], v[2], v[3]);
}
GQ_FN void gq_ws_iq4_xs(const uint8_t *b, int j, float *s, float *m) {
    const int ls = ((b[4 + j / 2] >> (4 * (j % 2))) & 0xF) | (int)(((gq_u16(b + 2) >> (2 * j)) & 3u) << 4);
    s[0] = s[1] = gq_f16(b) * (float)(ls - 32);
    m[0] = m[1] = 0.0f;
}
GQ_FN uint32_t gq_w4_iq3_xxs(const uint8_t *b, int j, int v0) {
    const uint32_t aux = gq_u32(b + 66 + 4 * j);
    const uint32_t sg = GQ_TAB(iq_ksigns)[(aux >> (7 * (v0 >> 3))) & 127];
    return gq_signed4(GQ_TAB(iq3xxs_grid)[b[2 + 8 * j + (v0 >> 2)]], sg >> (v0 & 7));
}
GQ_FN void gq_ws_iq3_xxs(const uint8_t *b, int j, float *s, float *m) {
    const uint32_t aux = gq_u32(b + 66 + 4 * j);
    s[0] = s[1] = gq_f16(b) * (0.5f + (float)(aux >> 28)) * 0.5f;
    m[0] = m[1] = 0.0f;
}
GQ_FN uint32_t gq_w4_iq3_s(const uint8_t *b, int j, int v0) {
    const int tt = 8 * j + (v0 >> 2);
    const uint32_t gr = GQ_TAB(iq3s_grid)[b[2 + tt] | (((b[66 + tt / 8] >> (tt % 8)) & 1) << 8)];
    return gq_signed4(gr, (uint32_t)b[74 + 4 * j + (v0 >> 3)] >> (v0 & 7));
}
GQ_FN void gq_ws_iq3_s(const uint8_t *b, int j, float *s, float *m) {
    s[0] = s[1] = gq_f16(b) * (float)(1 + 2 * ((b[106 + j / 2] >> (4 * (j % 2))) & 0xF));
    m[0] = m[1] = 0.0f;
}
GQ_FN uint32_t gq_w4_iq2_xs(const uint8_t *b, int j, int v0) {
    const uint32_t q = gq_u16(b + 2 + 2 * (4 * j + (v0 >> 3)));
    const uint64_t gr = GQ_TAB(iq2xs_grid)[q & 511] >> (8 * (v0 & 7));
    return gq_signed4((uint32_t)gr, (uint32_t)GQ_TAB(iq_ksigns)[q >> 9] >> (v0 & 7));
}
/* the scales of 16 values k = 2 j, 2 j + 1 of the IQ2 types with (0.5 + s) / 4 per 16 values */
GQ_FN void gq_ws_iq2_16(const uint8_t *b, const uint8_t *sc, int j, float *s, float *m) {
    const float d = gq_f16(b);
    for (int h = 0; h < 2; h++) {
        const int k = 2 * j + h;
        s[h] = d * (0.5f + (float)((sc[k / 2] >> (4 * (k % 2))) & 0xF)) * 0.25f;
        m[h] = 0.0f;
    }
}
GQ_FN void gq_ws_iq2_xs(const uint8_t *b, int j, float *s, float *m) { gq_ws_iq2_16(b, b + 66, j, s, m); }
GQ_FN uint32_t gq_w4_iq2_xxs(const uint8_t *b, int j, int v0) {
    const uint32_t a1 = gq_u32(b + 2 + 8 * j + 4);
    const uint64_t gr = GQ_TAB(iq2xxs_grid)[b[2 + 8 * j + (v0 >> 3)]] >> (8 * (v0 & 7));
    return gq_signed4((uint32_t)gr, (uint32_t)GQ_TAB(iq_ksigns)[(a1 >> (7 * (v0 >> 3))) & 127] >> (v0 & 7));
}
GQ_FN void gq_ws_iq2_xxs(const uint8_t *b, int j, float *s, float *m) {
    const uint32_t a1 = gq_u32(b + 2 + 8 * j + 4);
    s[0] = s[1] = gq_f16(b) * (0.5f + (float)(a1 >> 28)) * 0.25f;
    m[0] = m[1] = 0.0f;
}
GQ_FN uint32_t gq_w4_iq2_s(const uint8_t *b, int j, int v0) {
    const int t = 4 * j + (v0 >> 3);
    const uint64_t gr = GQ_TAB(iq2s_grid)[b[2 + t] | (((b[66 + t / 4] >> (2 * (t % 4))) & 3) << 8)] >> (8 * (v0 & 7));
    return gq_signed4((uint32_t)gr, (uint32_t)b[34 + t] >> (v0 & 7));
}
GQ_FN void gq_ws_iq2_s(const uint8_t *b, int j, float *s, float *m) { gq_ws_iq2_16(b, b + 74, j, s, m); }
/* IQ1: 4 grid values g (int8 -1, 0, 1) as 8 g + 1 (delta > 0) or 8 g - 1 */
GQ_FN uint32_t gq_iq1_4(uint64_t gr, int neg) {
    int v[4];
    for (int k = 0; k < 4; k++) v[k] = 8 * (int)(int8_t)(uint8_t)(gr >> (8 * k)) + (neg ? -1 : 1);
    return gq_pack4(v[0], v[1], v[2], v[3]);
}
GQ_FN uint32_t gq_w4_iq1_s(const uint8_t *b, int j, int v0) {
    const uint32_t h = gq_u16(b + 34 + 2 * j);
    const int l = v0 >> 3;
    const uint64_t gr = GQ_TAB(iq1s_grid)[b[2 + 4 * j + l] | (((h >> (3 * l)) & 7) << 8)] >> (8 * (v0 & 7));
    return gq_iq1_4(gr, (h & 0x8000) != 0);
}
GQ_FN void gq_ws_iq1_s(const uint8_t *b, int j, float *s, float *m) {
    const uint32_t h = gq_u16(b + 34 + 2 * j);
    s[0] = s[1] = gq_f16(b) * (float)(2 * ((h >> 12) & 7) + 1) * 0.125f;
    m[0] = m[1] = 0.0f;
}
GQ_FN uint32_t gq_w4_iq1_m(const uint8_t *b, int j, int v0) {
    const int t = 4 * j + (v0 >> 3);
    const int h = (b[32 + t / 2] >> (4 * (t % 2))) & 0xF;
    const uint64_t gr = GQ_TAB(iq1s_grid)[b[t] | ((h & 7) << 8)] >> (8 * (v0 & 7));
    return gq_iq1_4(gr, (h & 8) != 0);
}
GQ_FN void gq_ws_iq1_m(const uint8_t *b, int j, float *s, float *m) {
    const uint32_t s0 = gq_u16(b + 48), s1 = gq_u16(b + 50), s2 = gq_u16(b + 52), s3 = gq_u16(b + 54);
    const float d = gq_f16_bits((uint16_t)((s0 >> 12) | ((s1 >> 8) & 0x00F0) | ((s2 >> 4) & 0x0F00) | (s3 & 0xF000)));
    for (int h = 0; h < 2; h++) {
        const int k = 2 * j + h;
        const uint32_t sk = gq_u16(b + 48 + 2 * (k / 4));
        s[h] = d * (float)(2 * ((sk >> (3 * (k % 4))) & 7) + 1) * 0.125f;
        m[h] = 0.0f;
    }
}


#endif
