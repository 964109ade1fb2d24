/*
 * cuda_mirror.c — the host's bit-exact copy of the CUDA matrix-vector kernel (cuda/matvec.cu).
 *
 * The device kernel gives lane l of a warp slice l % 4 (8 values) of the groups l / 4, l / 4 + 8, ...
 * of a row, accumulates acc = acc + w * x over them in order (separately rounded multiply and add),
 * and combines the 32 lanes by a butterfly (xor 16, 8, 4, 2, 1). Doing exactly that here, with
 * contraction off, reproduces the device's bits: this is how a decode miss that runs on the host
 * (--miss host) gives the same reply as one copied to the device (--miss copy). For Q8_0 and Q4_0
 * weights the activations are first quantized to 8 bits per block of 32 as the device does, and each
 * lane adds (dw * dx) * (exact integer dot of its 8 values).
 */
#include <math.h>
#include <stdlib.h>

#include "cuda_backend.h"
#include "group_dequant.h"

void cuda_mirror_quantize_q8(const float *x, int64_t cols, uint8_t *q) {
    float *scales = (float *)(q + cols);
    for (int64_t b = 0; b < cols / 32; b++) {
        const float *xb = x + b * 32;
        float amax = 0.0f;
        for (int j = 0; j < 32; j++) amax = fmaxf(amax, fabsf(xb[j]));
        const float d = amax / 127.0f;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        for (int j = 0; j < 32; j++) q[b * 32 + j] = (uint8_t)(int8_t)roundf(xb[j] * id);
        scales[b] = strata_f16_to_f32(strata_f32_to_f16(d));
    }
}

/* integer dot of the 8 values of slice sl of block g of a Q8_0 / Q4_0 row with the activations */
static int32_t mirror_isum(int32_t type, const uint8_t *row, int64_t g, int sl, const int8_t *xq, float *dw) {
    int32_t s = 0;
    if (type == STRATA_TYPE_Q8_0) {
        const uint8_t *b = row + g * 34;
        *dw = gq_f16(b);
        for (int l = 0; l < 8; l++) s += (int32_t)(int8_t)b[2 + 8 * sl + l] * xq[g * 32 + 8 * sl + l];
    } else {
        const uint8_t *b = row + g * 18;
        *dw = gq_f16(b);
        const int shift = (sl & 2) ? 4 : 0;
        for (int l = 0; l < 8; l++)
            s += (((b[2 + 8 * (sl & 1) + l] >> shift) & 0xF) - 8) * xq[g * 32 + 8 * sl + l];
    }
    return s;
}

void cuda_mirror_matvec(int32_t type, const void *w, int64_t rows, int64_t cols, const float *x, float *y) {
    const int64_t rb = gq_row_bytes(type, cols), G = cols / 32;
    const int int8_act = cuda_act_type(type) == STRATA_TYPE_Q8_0;
    uint8_t *xq = NULL;
    if (int8_act) {
        xq = (uint8_t *)malloc((size_t)(cols + cols / 8));
        if (!xq) return;
        cuda_mirror_quantize_q8(x, cols, xq);
    }
    const float *dx = xq ? (const float *)(xq + cols) : NULL;
    for (int64_t r = 0; r < rows; r++) {
        const uint8_t *row = (const uint8_t *)w + r * rb;
        float acc[32], nxt[32], wv[8];
        for (int lane = 0; lane < 32; lane++) {
            const int sl = lane & 3;
            float a = 0.0f;
            for (int64_t g = lane >> 2; g < G && int8_act; g += 8) {
                float dw;
                const int32_t is = mirror_isum(type, row, g, sl, (const int8_t *)xq, &dw);
                a = a + (dw * dx[g]) * (float)is;
            }
            for (int64_t g = lane >> 2; g < G && !int8_act; g += 8) {
                gq_dequant8(type, row, g, sl, wv);
                const float *xp = x + g * 32 + sl * 8;
                for (int l = 0; l < 8; l++) a = a + wv[l] * xp[l];
            }
            acc[lane] = a;
        }
        for (int off = 16; off > 0; off >>= 1) {
            for (int l = 0; l < 32; l++) nxt[l] = acc[l] + acc[l ^ off];
            for (int l = 0; l < 32; l++) acc[l] = nxt[l];
        }
        y[r] = acc[0];
    }
    free(xq);
}

/* The prompt-chunk product of mmq.cu: per block the exact integer dot of all 32 values, then
 * acc = acc + (dw * dx) * isum over the blocks in order (Q4_K: acc + ((d * sc * dx) * isum -
 * (dmin * m * dx) * sum of the block's activations); Q6_K: acc + ((d * sc_lo * dx) * isum_lo +
 * (d * sc_hi * dx) * isum_hi), the halves of 16 values having their own scales). */
void cuda_mirror_mmq(int32_t type, const void *w, int64_t rows, int64_t cols, const float *x, float *y) {
    const int64_t rb = gq_row_bytes(type, cols), G = cols / 32;
    uint8_t *xq = (uint8_t *)malloc((size_t)(cols + cols / 8));
    if (!xq) return;
    cuda_mirror_quantize_q8(x, cols, xq);
    const float *dx = (const float *)(xq + cols);
    for (int64_t r = 0; r < rows; r++) {
        const uint8_t *row = (const uint8_t *)w + r * rb;
        float acc = 0.0f;
        for (int64_t g = 0; g < G; g++) {
            const int8_t *xg = (const int8_t *)xq + g * 32;
            if (type == STRATA_TYPE_Q4_K) { /* sub-block j of a super-block: (d * sc) * q - dmin * m */
                const uint8_t *b = row + (g >> 3) * 144;
                const int j = (int)(g & 7), sh = 4 * (j & 1);
                int sc, m;
                gq_q4k_scale_min(b + 4, j, &sc, &m);
                const float dsc = gq_f16(b) * (float)sc, dmn = gq_f16(b + 2) * (float)m;
                int32_t isum = 0, xsum = 0;
                for (int v = 0; v < 32; v++) {
                    isum += ((b[16 + 32 * (j >> 1) + v] >> sh) & 0xF) * xg[v];
                    xsum += xg[v];
                }
                acc = acc + ((dsc * dx[g]) * (float)isum - (dmn * dx[g]) * (float)xsum);
                continue;
            }
            if (type == STRATA_TYPE_Q6_K) { /* sub-block j = 4h + qq; values 0..15 and 16..31 scaled apart */
                const uint8_t *b = row + (g >> 3) * 210;
                const int j = (int)(g & 7), h = j >> 2, qq = j & 3, ls = 4 * (qq >> 1), hs = 2 * qq;
                int32_t is[2] = {0, 0};
                for (int l = 0; l < 32; l++) {
                    const int q = ((b[64 * h + 32 * (qq & 1) + l] >> ls) & 0xF) | (((b[128 + 32 * h + l] >> hs) & 3) << 4);
                    is[l >> 4] += (q - 32) * xg[l];
                }
                const int8_t *sc = (const int8_t *)(b + 192 + 8 * h + 2 * qq);
                const float d = gq_f16(b + 208), dlo = d * (float)sc[0], dhi = d * (float)sc[1];
                acc = acc + ((dlo * dx[g]) * (float)is[0] + (dhi * dx[g]) * (float)is[1]);
                continue;
            }
            float dw = 0.0f;
            int32_t isum = 0;
            for (int sl = 0; sl < 4; sl++) isum += mirror_isum(type, row, g, sl, (const int8_t *)xq, &dw);
            acc = acc + (dw * dx[g]) * (float)isum;
        }
        y[r] = acc;
    }
    free(xq);
}

void cuda_mirror_expert(const void *gate, int32_t gate_type, const void *up, int32_t up_type, const void *down,
                        int32_t down_type, int64_t D, int64_t F, const float *x, float *out, float *scratch) {
    float *g = scratch, *u = scratch + F;
    cuda_mirror_matvec(gate_type, gate, F, D, x, g);
    cuda_mirror_matvec(up_type, up, F, D, x, u);
    for (int64_t i = 0; i < F; i++) g[i] = gq_swiglu(g[i], u[i]);
    cuda_mirror_matvec(down_type, down, D, F, g, out);
}
