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
 *
 * The scalar kernel here is the reference; cpu/mirror_avx2.c and cpu/mirror_avx512.c run the 32
 * lanes as vector elements (cuda_mirror.h), chosen by the engine's kernel level (--simd).
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cuda_backend.h"
#include "cuda_mirror.h"
#include "group_dequant.h"
#include "quant.h"
#include "strata_kernels.h"
#include "threads.h"

/* ---- activations -------------------------------------------------------------------------------- */

/* The device's 8-bit quantization of x: q[cols] and one scale per block of 32 (rounded through f16). */
static void quantize_q8(const float *x, int64_t cols, int8_t *q, float *scales) {
    for (int64_t b = 0; b < cols / 32; b++) {
        const float *xb = x + b * 32;
        float amax = 0.0f;
        for (int j = 0; j < 32; j++) amax = fmaxf(amax, fabsf(xb[j]));
        const float d = amax / 127.0f;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        for (int j = 0; j < 32; j++) q[b * 32 + j] = (int8_t)roundf(xb[j] * id);
        scales[b] = strata_f16_to_f32(strata_f32_to_f16(d));
    }
}

void cuda_mirror_quantize_q8(const float *x, int64_t cols, uint8_t *q) {
    quantize_q8(x, cols, (int8_t *)q, (float *)(q + cols));
}

static size_t up64(size_t n) { return (n + 63) & ~(size_t)63; }

size_t mirror_x_bytes(int64_t cols) {
    const size_t c = (size_t)cols;
    /* q, d, qp, corr, dl, xt, plus the alignment of the start */
    return 64 + up64(c) + up64(c / 8) + up64(c) + up64(c) + up64(c / 2) + up64(c * 4);
}

/* Byte p (0..15) of a level's per-value vector of K-quant bytes holds the byte of 8-value piece
 * rho(p) of the 128 bytes it transposes (piece = 4 * row + slice): AVX-512 keeps the order, AVX2's
 * word unpacks leave the pieces' pairs in the order 0, 2, 4, 6, 1, 3, 5, 7. */
static int piece_of(int32_t simd, int p) {
    static const int pair[8] = {0, 2, 4, 6, 1, 3, 5, 7};
    return simd == STRATA_SIMD_AVX512 ? p : 2 * pair[p >> 1] + (p & 1);
}

/* Lane of the value of piece rho, low (nib 0) or high (nib 1) nibble of its byte, in a K-quant
 * super-block: Q4_K's qs rows r hold sub-blocks 2r (low) and 2r + 1 (high); Q6_K's ql rows r = 2h + b
 * hold sub-blocks 4h + b (low) and 4h + 2 + b (high). Lane = 4 * sub-block + slice. */
static int lane_of_piece(int32_t type, int rho, int nib) {
    const int r = rho >> 2, s = rho & 3;
    if (type == STRATA_TYPE_Q4_K) return 8 * r + 4 * nib + s;
    return 16 * (r >> 1) + 8 * nib + 4 * (r & 1) + s;
}

/* Fill the level's arrangement of px (its type's kernel exists at that level: 1). */
static int arrange(mirror_x *px, int32_t simd) {
    const int64_t cols = px->cols, S = cols / 256;
    if (px->int8) {
        /* dl: the lane's block scale; lane l of step t reads block 8 t + l / 4 */
        for (int64_t t = 0; t < S; t++)
            for (int l = 0; l < 32; l++) px->dl[t * 32 + l] = px->d[8 * t + l / 4];
        /* qp: Q4_0 on AVX-512 multiplies 4 blocks' low nibbles (values 0..15 of each) in one vector and
         * their high nibbles (16..31) in the next; everything else is in value order */
        const int q4 = px->type == STRATA_TYPE_Q4_0;
        if (q4 && simd == STRATA_SIMD_AVX512)
            for (int64_t t = 0; t < S; t++)
                for (int i = 0; i < 256; i += 16) {
                    const int hk = i >> 7, part = (i >> 6) & 1, c = (i >> 4) & 3;
                    memcpy(px->qp + t * 256 + i, px->q + t * 256 + (4 * hk + c) * 32 + 16 * part, 16);
                }
        else
            memcpy(px->qp, px->q, (size_t)(S * 256));
        /* corr: the kernels multiply unsigned weight bytes u = w + off (Q8_0 on AVX-512: w ^ 0x80, so
         * off = 128; Q4_0: the nibble, off = 8); subtracting off * sum(x) per 4 values makes it exact */
        const int32_t off = q4 ? 8 : (simd == STRATA_SIMD_AVX512 ? 128 : 0);
        for (int64_t i = 0; i < S * 64 && off; i++) {
            const int8_t *q = px->qp + 4 * i;
            px->corr[i] = -off * ((int32_t)q[0] + q[1] + q[2] + q[3]);
        }
        return 1;
    }
    const int kq = px->type == STRATA_TYPE_Q4_K || px->type == STRATA_TYPE_Q6_K;
    const int fl = px->type == STRATA_TYPE_F32 || px->type == STRATA_TYPE_F16 || px->type == STRATA_TYPE_BF16;
    /* the types of GQ_NEW_TYPES: dequantized a step at a time (gq_dequant8) into the float kernel's buffer */
    px->deq = !kq && !fl && gq_block_values(px->type) > 0;
    if (!kq && !fl && !px->deq) return 0;
    /* F32 / F16 / BF16 and deq: vector element e is lane e. K-quants: element e (0..31) is byte e % 16 of the
     * per-value vector, its low nibble for e < 16 */
    for (int e = 0; e < 32 && !kq; e++) px->lane_of[e] = e;
    for (int e = 0; e < 32 && kq; e++) {
        px->lane_of[e] = lane_of_piece(px->type, piece_of(simd, e & 15), e >> 4);
        /* Q4_K: one scale per sub-block (lane / 4); Q6_K: one per 16 values (lane / 2) */
        px->sidx[e] = px->type == STRATA_TYPE_Q4_K ? px->lane_of[e] >> 2 : px->lane_of[e] >> 1;
    }
    for (int64_t t = 0; t < S; t++)
        for (int v = 0; v < 8; v++)
            for (int e = 0; e < 32; e++) px->xt[t * 256 + v * 32 + e] = px->x[t * 256 + 8 * px->lane_of[e] + v];
    return 1;
}

void mirror_prepare(mirror_x *px, void *ws, int32_t simd, int32_t type, const float *x, int64_t cols) {
    const size_t c = (size_t)cols;
    uint8_t *p = (uint8_t *)(((uintptr_t)ws + 63) & ~(uintptr_t)63);
    memset(px, 0, sizeof *px);
    px->type = type;
    px->cols = cols;
    px->x = x;
    px->int8 = cuda_act_type(type) == STRATA_TYPE_Q8_0;
    px->q = (int8_t *)p;
    p += up64(c);
    px->d = (float *)p;
    p += up64(c / 8);
    px->qp = (int8_t *)p;
    p += up64(c);
    px->corr = (int32_t *)p;
    p += up64(c);
    px->dl = (float *)p;
    p += up64(c / 2);
    px->xt = (float *)p;
    if (px->int8) {
        if (simd == STRATA_SIMD_AVX512)
            mirror_quantize_avx512(x, cols, px->q, px->d);
        else if (simd == STRATA_SIMD_AVX2)
            mirror_quantize_avx2(x, cols, px->q, px->d);
        else
            quantize_q8(x, cols, px->q, px->d);
    }
    px->simd = STRATA_SIMD_SCALAR;
    if ((simd == STRATA_SIMD_AVX512 || simd == STRATA_SIMD_AVX2) && arrange(px, simd)) px->simd = simd;
}

void mirror_rows(const mirror_x *px, const void *w, int64_t rows, float *y) {
    if (px->simd == STRATA_SIMD_AVX512)
        mirror_rows_avx512(px, w, rows, y);
    else if (px->simd == STRATA_SIMD_AVX2)
        mirror_rows_avx2(px, w, rows, y);
    else
        mirror_rows_scalar(px, w, rows, y);
}

/* ---- the scalar kernel -------------------------------------------------------------------------- */

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

float mirror_finish_row(const mirror_x *px, const uint8_t *row, int64_t g0, float acc[32]) {
    const int64_t G = px->cols / 32;
    float nxt[32], wv[8];
    for (int lane = 0; lane < 32 && g0 < G; lane++) {
        const int sl = lane & 3;
        float a = acc[lane];
        for (int64_t g = g0 + (lane >> 2); g < G && px->int8; g += 8) {
            float dw;
            const int32_t is = mirror_isum(px->type, row, g, sl, px->q, &dw);
            a = a + (dw * px->d[g]) * (float)is;
        }
        for (int64_t g = g0 + (lane >> 2); g < G && !px->int8; g += 8) {
            gq_dequant8(px->type, row, g, sl, wv);
            const float *xp = px->x + g * 32 + sl * 8;
            for (int l = 0; l < 8; l++) a = a + wv[l] * xp[l];
        }
        acc[lane] = a;
    }
    /* the warp's butterfly: lane l adds lane l ^ off; lane 0 ends with the sum */
    for (int off = 16; off > 0; off >>= 1) {
        for (int l = 0; l < 32; l++) nxt[l] = acc[l] + acc[l ^ off];
        for (int l = 0; l < 32; l++) acc[l] = nxt[l];
    }
    return acc[0];
}

void mirror_rows_scalar(const mirror_x *px, const void *w, int64_t rows, float *y) {
    const int64_t rb = gq_row_bytes(px->type, px->cols);
    for (int64_t r = 0; r < rows; r++) {
        float acc[32] = {0};
        y[r] = mirror_finish_row(px, (const uint8_t *)w + r * rb, 0, acc);
    }
}

/* The kernel level of the process-wide entry points (strata_simd_set). */
static int32_t current_level(void) {
    const quant_traits *t = quant_current_table();
    for (int32_t l = STRATA_SIMD_AVX512; l > STRATA_SIMD_SCALAR; l--)
        if (t == quant_table(l)) return l;
    return STRATA_SIMD_SCALAR;
}

void cuda_mirror_matvec(int32_t type, const void *w, int64_t rows, int64_t cols, const float *x, float *y) {
    void *ws = malloc(mirror_x_bytes(cols));
    if (!ws) return;
    mirror_x px;
    mirror_prepare(&px, ws, current_level(), type, x, cols);
    mirror_rows(&px, w, rows, y);
    free(ws);
}

/* The prompt-chunk product of mmq.cu: per block the exact integer dot of all 32 values, then
 * acc = acc + (dw * dx) * isum over the blocks in order (Q4_K: acc + ((d * sc * dx) * isum -
 * (dmin * m * dx) * sum of the block's activations); Q6_K: acc + ((d * sc_lo * dx) * isum_lo +
 * (d * sc_hi * dx) * isum_hi), the halves of 16 values having their own scales). */
/* The 8-bit form of a type of GQ_NEW_TYPES (group_dequant_types.h): its values 4 at a time and its scales. */
typedef uint32_t (*mq_w4_fn)(const uint8_t *b, int j, int v0);
typedef void (*mq_ws_fn)(const uint8_t *b, int j, float *s, float *m);
typedef struct {
    int32_t type, per_block, block_bytes, form;
    mq_w4_fn w4;
    mq_ws_fn ws;
} mq_form;
static const mq_form k_mq_forms[] = {
#define MQ_ENTRY(T, V, B, N, MQ) {T, V, B, MQ, gq_w4_##N, gq_ws_##N},
    GQ_NEW_TYPES(MQ_ENTRY)
#undef MQ_ENTRY
};

/* cuda/mmq_types.cu's expression for group g of a row of a type of GQ_NEW_TYPES, added to acc: with the
 * exact integer dots isum (all 32 values), ilo / ihi (values 0..15 / 16..31) and the activations' sums
 * xsum, xlo, xhi,
 *   form 0:                 acc + (s0 dx) isum
 *   GQ_MQ_MIN:              acc + ((s0 dx) isum + (m0 dx) xsum)
 *   GQ_MQ_SPLIT:            acc + ((s0 dx) ilo + (s1 dx) ihi)
 *   GQ_MQ_SPLIT | GQ_MQ_MIN: acc + (((s0 dx) ilo + (s1 dx) ihi) + ((m0 dx) xlo + (m1 dx) xhi)) */
static float mirror_mmq_group(const mq_form *f, const uint8_t *row, int64_t g, const int8_t *xg, float dx, float acc) {
    const int per = f->per_block / 32;
    const uint8_t *b = row + (g / per) * f->block_bytes;
    const int j = (int)(g % per);
    int32_t ih[2] = {0, 0}, xh[2] = {0, 0};
    for (int v0 = 0; v0 < 32; v0 += 4) {
        const uint32_t q = f->w4(b, j, v0);
        for (int k = 0; k < 4; k++) {
            ih[v0 >> 4] += (int32_t)(int8_t)(uint8_t)(q >> (8 * k)) * xg[v0 + k];
            xh[v0 >> 4] += xg[v0 + k];
        }
    }
    float s[2], m[2];
    f->ws(b, j, s, m);
    if (f->form == (GQ_MQ_SPLIT | GQ_MQ_MIN))
        return acc + (((s[0] * dx) * (float)ih[0] + (s[1] * dx) * (float)ih[1]) +
                      ((m[0] * dx) * (float)xh[0] + (m[1] * dx) * (float)xh[1]));
    if (f->form == GQ_MQ_SPLIT) return acc + ((s[0] * dx) * (float)ih[0] + (s[1] * dx) * (float)ih[1]);
    if (f->form == GQ_MQ_MIN) return acc + ((s[0] * dx) * (float)(ih[0] + ih[1]) + (m[0] * dx) * (float)(xh[0] + xh[1]));
    return acc + (s[0] * dx) * (float)(ih[0] + ih[1]);
}

void cuda_mirror_mmq(int32_t type, const void *w, int64_t rows, int64_t cols, const float *x, float *y) {
    const int64_t rb = gq_row_bytes(type, cols), G = cols / 32;
    const mq_form *form = NULL;
    for (size_t i = 0; i < sizeof k_mq_forms / sizeof k_mq_forms[0]; i++)
        if (k_mq_forms[i].type == type) form = &k_mq_forms[i];
    uint8_t *xq = (uint8_t *)malloc((size_t)(cols + cols / 8));
    if (!xq) return;
    cuda_mirror_quantize_q8(x, cols, xq);
    const float *dx = (const float *)(xq + cols);
    for (int64_t r = 0; r < rows; r++) {
        const uint8_t *row = (const uint8_t *)w + r * rb;
        float acc = 0.0f;
        for (int64_t g = 0; g < G; g++) {
            const int8_t *xg = (const int8_t *)xq + g * 32;
            if (form) {
                acc = mirror_mmq_group(form, row, g, xg, dx[g], acc);
                continue;
            }
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


/* ---- experts, rows split over a pool ------------------------------------------------------------- */

#define MIRROR_ROWS 16 /* rows per item of the pool: small enough to balance 16 threads over F = 768 */

/* Matrices of equal row counts whose rows the pool splits: item i is rows [16 (i % per), ...) of
 * matrix i / per. */
typedef struct mirror_job {
    const mirror_x *px[2 * CUDA_MIRROR_MAX_EXPERTS];
    const uint8_t *w[2 * CUDA_MIRROR_MAX_EXPERTS]; /* [rows, row_bytes] */
    float *y[2 * CUDA_MIRROR_MAX_EXPERTS];         /* [rows] */
    int64_t row_bytes[2 * CUDA_MIRROR_MAX_EXPERTS];
    int64_t rows, per;
    int n_mat;
} mirror_job;

static void job_rows(void *ctx, int64_t item, int thread) {
    (void)thread;
    const mirror_job *j = ctx;
    const int i = (int)(item / j->per);
    const int64_t r0 = (item % j->per) * MIRROR_ROWS;
    const int64_t n = j->rows - r0 < MIRROR_ROWS ? j->rows - r0 : MIRROR_ROWS;
    /* a row's bits do not depend on the rows computed with it: any split gives the same result */
    mirror_rows(j->px[i], j->w[i] + r0 * j->row_bytes[i], n, j->y[i] + r0);
}

static void job_run(pool *p, mirror_job *j) {
    j->per = (j->rows + MIRROR_ROWS - 1) / MIRROR_ROWS;
    const int64_t items = j->per * j->n_mat;
    if (p) {
        pool_run(p, items, job_rows, j);
        return;
    }
    for (int64_t i = 0; i < items; i++) job_rows(j, i, 0);
}

/* g[i] = gq_swiglu(g[i], u[i]) at level simd */
static void swiglu(int32_t simd, float *g, const float *u, int64_t n) {
    if (simd == STRATA_SIMD_AVX512)
        mirror_swiglu_avx512(g, u, n);
    else if (simd == STRATA_SIMD_AVX2)
        mirror_swiglu_avx2(g, u, n);
    else
        for (int64_t i = 0; i < n; i++) g[i] = gq_swiglu(g[i], u[i]);
}

int64_t cuda_mirror_scratch_floats(int64_t D, int64_t F, int32_t n) {
    if (n > CUDA_MIRROR_MAX_EXPERTS) n = CUDA_MIRROR_MAX_EXPERTS;
    return (int64_t)n * (2 * F + (int64_t)(mirror_x_bytes(F) + 3) / 4) + (int64_t)(2 * mirror_x_bytes(D) + 3) / 4;
}

void cuda_mirror_experts(pool *p, int32_t simd, int32_t n, const void *const *gate, int32_t gate_type,
                         const void *const *up, int32_t up_type, const void *const *down, int32_t down_type, int64_t D,
                         int64_t F, const float *x, float *const *out, float *scratch) {
    for (int32_t e0 = 0; e0 < n; e0 += CUDA_MIRROR_MAX_EXPERTS) {
        const int32_t m = n - e0 < CUDA_MIRROR_MAX_EXPERTS ? n - e0 : CUDA_MIRROR_MAX_EXPERTS;
        float *gu = scratch; /* [m, 2F]: expert k's gate at 2kF, up at 2kF + F */
        uint8_t *ws = (uint8_t *)(scratch + 2 * (int64_t)m * F);
        mirror_x xg, xu, xh[CUDA_MIRROR_MAX_EXPERTS];
        /* x is prepared once for every gate and up (twice only when their types want different layouts) */
        mirror_prepare(&xg, ws, simd, gate_type, x, D);
        const mirror_x *pu = &xg;
        if (up_type != gate_type) {
            mirror_prepare(&xu, ws + mirror_x_bytes(D), simd, up_type, x, D);
            pu = &xu;
        }
        ws += 2 * mirror_x_bytes(D);
        mirror_job j = {.rows = F, .n_mat = 2 * m};
        for (int32_t k = 0; k < m; k++) {
            j.px[2 * k] = &xg;
            j.w[2 * k] = gate[e0 + k];
            j.row_bytes[2 * k] = gq_row_bytes(gate_type, D);
            j.y[2 * k] = gu + 2 * k * F;
            j.px[2 * k + 1] = pu;
            j.w[2 * k + 1] = up[e0 + k];
            j.row_bytes[2 * k + 1] = gq_row_bytes(up_type, D);
            j.y[2 * k + 1] = gu + 2 * k * F + F;
        }
        job_run(p, &j);
        mirror_job d = {.rows = D, .n_mat = m};
        for (int32_t k = 0; k < m; k++) {
            float *g = gu + 2 * k * F;
            swiglu(simd, g, g + F, F);
            mirror_prepare(&xh[k], ws + k * mirror_x_bytes(F), simd, down_type, g, F);
            d.px[k] = &xh[k];
            d.w[k] = down[e0 + k];
            d.row_bytes[k] = gq_row_bytes(down_type, F);
            d.y[k] = out[e0 + k];
        }
        job_run(p, &d);
    }
}

/* ---- public entry point (tests, benchmarks) -------------------------------------------------------- */

static int mirror_shape_ok(int32_t type, int64_t cols) { return gq_shape_ok(type, cols); }

static double mirror_now_us(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e6 + ts.tv_nsec / 1e3;
}

strata_status strata_cuda_mirror_expert(int32_t gate_type, const void *gate, int32_t up_type, const void *up,
                                        int32_t down_type, const void *down, int64_t D, int64_t F, int32_t n_experts,
                                        const float *x, float *out, int32_t n_threads, int32_t reps,
                                        double *median_us) {
    if (!gate || !up || !down || !x || !out || n_experts < 1 || n_threads < 1 || reps < 1 ||
        !mirror_shape_ok(gate_type, D) || !mirror_shape_ok(up_type, D) || !mirror_shape_ok(down_type, F))
        return STRATA_ERR_INVALID_ARGUMENT;
    errbuf err = {0};
    pool *p = NULL;
    strata_status s = pool_create(n_threads, &p, &err);
    if (s != STRATA_OK) return s;
    float *scratch = malloc((size_t)cuda_mirror_scratch_floats(D, F, n_experts) * sizeof(float));
    double *t = malloc((size_t)reps * sizeof(double));
    const void **ptrs = malloc((size_t)n_experts * 3 * sizeof(void *));
    float **outs = malloc((size_t)n_experts * sizeof(float *));
    if (!scratch || !t || !ptrs || !outs) {
        s = STRATA_ERR_OUT_OF_MEMORY;
        goto done;
    }
    for (int32_t k = 0; k < n_experts; k++) {
        ptrs[k] = (const uint8_t *)gate + k * F * gq_row_bytes(gate_type, D);
        ptrs[n_experts + k] = (const uint8_t *)up + k * F * gq_row_bytes(up_type, D);
        ptrs[2 * n_experts + k] = (const uint8_t *)down + k * D * gq_row_bytes(down_type, F);
        outs[k] = out + k * D;
    }
    const int32_t simd = current_level();
    for (int32_t i = 0; i < reps; i++) {
        const double t0 = mirror_now_us();
        cuda_mirror_experts(p, simd, n_experts, ptrs, gate_type, ptrs + n_experts, up_type, ptrs + 2 * n_experts,
                            down_type, D, F, x, outs, scratch);
        t[i] = mirror_now_us() - t0;
    }
    /* insertion sort: reps is small */
    for (int32_t i = 1; i < reps; i++)
        for (int32_t j = i; j > 0 && t[j - 1] > t[j]; j--) {
            const double v = t[j];
            t[j] = t[j - 1];
            t[j - 1] = v;
        }
    if (median_us) *median_us = t[reps / 2];
done:
    free(scratch);
    free(t);
    free(ptrs);
    free(outs);
    pool_destroy(p);
    return s;
}

strata_status strata_cuda_mirror_swiglu(float *g, const float *u, int64_t n) {
    if (!g || !u || n < 0) return STRATA_ERR_INVALID_ARGUMENT;
    swiglu(current_level(), g, u, n);
    return STRATA_OK;
}
