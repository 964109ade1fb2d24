/*
 * mmq.cu — prompt-chunk products of Q8_0 / Q4_0 / Q4_K / Q6_K weights on the tensor cores (integer MMA), grouped by
 * expert: the tokens routed to one expert share one read of its weights. The other quantized types' kernels
 * (mmq_types.cu) share the tiles, the order and this file's launcher.
 *
 * Legend: R rows of W, C cols (a multiple of 32), G = C / 32 blocks of 32 values per row,
 *         BM = 64 rows and BN = 64 tokens per thread block, KC = 8 blocks (256 values) per stage.
 *
 * Activations are the 8-bit blocks of cuda_quantize_act (cols int8, then cols / 32 float scales).
 * A thread block takes BM rows of one matrix and up to BN tokens (a "segment": tokens of one expert,
 * gathered by index, or consecutive tokens of a dense product). Per stage it copies the rows' next KC
 * blocks and the tokens' next KC blocks into shared memory; each of the 4 warps then owns 16 rows and
 * runs one mma.m16n8k32 (s8 x s8 -> s32) per 8 tokens per block, which is the exact integer dot of
 * one 32-value block, and folds it into a float accumulator:
 *
 *     acc = 0;  for g = 0 .. G-1:  acc = acc + (dw[r, g] * dx[t, g]) * isum[r, t, g]
 *
 * (each operation rounded separately, no fused multiply-add, blocks in order). For the K-quants a
 * stage is one super-block. Q4_K (w = d*sc*q - dmin*m per sub-block of 32, q in 0..15) adds the min
 * term through a second MMA against ones, which sums each token's block:
 * acc + ((d*sc * dx) * isum - (dmin*m * dx) * xsum). Q6_K (w = d*sc*(q - 32), a scale per 16 values)
 * runs the two halves of a block as two MMAs: acc + ((d*sc_lo * dx) * isum_lo + (d*sc_hi * dx) * isum_hi).
 * Each expression depends on the row and the token alone: not on how many tokens are processed together, which
 * segment or tile a token lands in, or which wave of experts it runs in. cuda_mirror_mmq computes the
 * same expression on the host, bit for bit.
 *
 * mma.m16n8k32 fragments (PTX ISA; gid = lane / 4, tig = lane % 4; 4 int8 per register):
 *   A 16x32 (weights, row-major): a0 = A[gid][4tig..], a1 = A[gid+8][4tig..],
 *                                 a2 = A[gid][16+4tig..], a3 = A[gid+8][16+4tig..]
 *   B 32x8 (tokens, one column per token): b0 = B[4tig..][gid], b1 = B[16+4tig..][gid]
 *   C 16x8: c0 = C[gid][2tig], c1 = C[gid][2tig+1], c2 = C[gid+8][2tig], c3 = C[gid+8][2tig+1]
 * Tiles reach shared memory by cp.async, every copy of a stage in flight at once.
 *
 * Below sm_80 (and with STRATA_CUDA_PORTABLE=1) the same kernel runs with SM80 = false: plain copies
 * and four mma m8n8k16 per m16n8k32 (arch.cuh). Both give every isum as the same exact integer, so the
 * float expressions above, and the bits, are the same on every card.
 */
#include "arch.cuh"
#include "common.cuh"
#include "mmq_common.cuh"
#include "../group_dequant.h"

/* 4 bytes from a 2-byte aligned address (Q8_0/Q4_0 blocks are 34/18 bytes: quants are 2-aligned) */
static __device__ __forceinline__ uint32_t ld_u32_a2(const uint8_t *p) {
    const uint16_t *h = (const uint16_t *)p;
    return (uint32_t)h[0] | ((uint32_t)h[1] << 16);
}

/*
 * W / w_ptrs: one matrix (dense) or one per segment; rows of row_bytes.
 * Dense (w_ptrs == NULL): tile y = blockIdx.y covers tokens 64y .. min(T, 64y + 64): x row t, y row t.
 * Segments: segment s = blockIdx.y has tokens pairs[seg_start[s] .. seg_start[s + 1]) (at most 64);
 *   pair p reads x row p / xdiv and writes y row p.
 * accumulate: y += instead of y =.
 */
template <int TYPE, bool SM80>
__global__ void __launch_bounds__(MQ_THREADS)
k_mmq(const uint8_t *__restrict__ W, const uint8_t *const *__restrict__ w_ptrs, int64_t row_bytes, int64_t rows,
      int64_t cols, const uint8_t *__restrict__ xq, int64_t xs, const int32_t *__restrict__ pairs,
      const int32_t *__restrict__ seg_start, int32_t xdiv, float *__restrict__ y, int64_t ys, int32_t T,
      int32_t accumulate, int64_t unit0) {
    /* bytes per 32 values: Q8_0 34, Q4_0 18, Q4_K 18 (144 per 256: a stage is one super-block);
     * Q6_K: a stage is one super-block of 210 bytes, only 2-byte aligned, copied as 53 words */
    constexpr bool K6 = TYPE == STRATA_TYPE_Q6_K;
    constexpr int BS = TYPE == STRATA_TYPE_Q8_0 ? 34 : 18;
    constexpr int SB6 = 210;
    constexpr int SA = K6 ? 212 : MQ_KC * BS; /* weight tile row stride: 272 / 144 / 212 bytes */
    __shared__ __align__(16) uint8_t sA[MQ_BM * SA];        /* [BM rows][KC blocks in the file layout] */
    __shared__ __align__(16) uint8_t sB[MQ_BN * MQ_SB];     /* [BN tokens][KC blocks of 32 int8] */
    __shared__ __align__(16) float sdx[MQ_KC][MQ_BN];       /* activation scales [block][token] */
    __shared__ int64_t sxo[MQ_BN], swo[MQ_BM];              /* byte offsets of token rows / weight rows */
    __shared__ int64_t syr[MQ_BN];                          /* output row of each token, -1 = none */

    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, gid = lane >> 2, tig = lane & 3;
    const int64_t row0 = (int64_t)blockIdx.x * MQ_BM;
    const int64_t unit = unit0 + blockIdx.y;
    const uint8_t *Wm = w_ptrs ? w_ptrs[unit] : W;
    const int cnt = mq_tile_rows(sxo, syr, swo, w_ptrs != NULL, pairs, seg_start, xdiv, xs, T, unit, row0, rows,
                                 row_bytes);

    float acc[8][4];
#pragma unroll
    for (int n = 0; n < 8; n++)
#pragma unroll
        for (int i = 0; i < 4; i++) acc[n][i] = 0.0f;

    const int64_t G = cols >> 5;
    /* the widest copy unit every address of the weight tile allows (a stage starts at a multiple of
     * KC * BS = 272 / 144 bytes, both multiples of 16) */
    const uint64_t walign = (uint64_t)(uintptr_t)Wm | (uint64_t)row_bytes;
    const float *xscale_base = (const float *)(xq + cols); /* + sxo[token] bytes */
    const uint8_t *wr = sA + (warp * 16 + gid) * SA;       /* this thread's first row; +8 rows below */

    for (int64_t c0 = 0; c0 < G; c0 += MQ_KC) {
        const int nb = G - c0 < MQ_KC ? (int)(G - c0) : MQ_KC;
        __syncthreads(); /* the previous stage's tiles are no longer read */
        /* weights: BM rows x nb blocks, raw. A whole stage of 16-byte aligned rows goes by cp.async
         * (KC * BS = 272 / 144 bytes a row, 16-byte units); a short last stage or rows of another
         * alignment by plain copies of the widest unit they allow. */
        if (K6) {
            /* super-block c0 / 8 of each row: 4-byte copies from the word holding its first byte, so
             * it lands at byte (address & 2) of the shared row; a 4-byte aligned super-block ends
             * with 2 bytes copied on their own (a word there would read past it) */
            const uint8_t *src = Wm + (c0 / MQ_KC) * SB6;
            for (int i = tid; i < MQ_BM * 53; i += MQ_THREADS) {
                const int r = i / 53, u = i - r * 53;
                const uint8_t *a = src + swo[r];
                const int sh = (int)((uintptr_t)a & 2);
                if (sh == 0 && u == 52)
                    *(uint16_t *)(sA + r * SA + 208) = *(const uint16_t *)(a + 208);
                else
                    cu_cp4<SM80>(sA + r * SA + 4 * u, a - sh + 4 * u, 4);
            }
        } else {
            const int bytes = nb * BS;
            const uint8_t *src = Wm + c0 * BS;
            const uint64_t al = walign | (uint64_t)bytes;
            if (nb == MQ_KC && (al & 15) == 0) {
                constexpr int UPR = SA / 16;
                for (int i = tid; i < MQ_BM * UPR; i += MQ_THREADS) {
                    const int r = i / UPR, u = i - r * UPR;
                    cu_cp16<SM80>(sA + r * SA + u * 16, src + swo[r] + u * 16, 16);
                }
            } else if ((al & 15) == 0) {
                copy_rows<uint4>(sA, SA, src, swo, MQ_BM, bytes);
            } else if ((al & 3) == 0) {
                copy_rows<uint32_t>(sA, SA, src, swo, MQ_BM, bytes);
            } else {
                copy_rows<uint16_t>(sA, SA, src, swo, MQ_BM, bytes);
            }
        }
        /* tokens (mmq_common.cuh) */
        mq_load_tokens<SM80>(sB, sdx, xq, xscale_base, sxo, cnt, c0, nb);
        cu_cp_wait_all<SM80>();
        __syncthreads();

#pragma unroll 2
        for (int blk = 0; blk < nb; blk++) {
            const uint8_t *ba = wr + blk * BS, *bb = ba + 8 * SA; /* rows gid and gid + 8 of the warp */
            float dwa, dwb, mna = 0.0f, mnb = 0.0f;               /* block scales (and Q4_K's min terms) */
            uint32_t a[4];
            float dha = 0.0f, dhb = 0.0f; /* Q6_K: scales of the second 16 values */
            if (K6) {
                /* sub-block blk = 4h + qq: value l is (nibble qq / 2 of ql[64h + 32(qq % 2) + l]) |
                 * (bits 2qq.. of qh[32h + l]) << 4, minus 32; values 0..15 and 16..31 have their own scale */
                const uint8_t *s6 = Wm + (c0 / MQ_KC) * SB6;
                const uint8_t *sa = wr + ((uintptr_t)(s6 + swo[warp * 16 + gid]) & 2);
                const uint8_t *sb = wr + 8 * SA + ((uintptr_t)(s6 + swo[warp * 16 + gid + 8]) & 2);
                const int h = blk >> 2, qq = blk & 3, ol = 64 * h + 32 * (qq & 1) + 4 * tig, oh = 128 + 32 * h + 4 * tig;
                const int ls = 4 * (qq >> 1), hs = 2 * qq;
#define Q6V(p, o)                                                                                            \
    __vsub4(((ld_u32_a2((p) + ol + (o)) >> ls) & 0x0F0F0F0Fu) | (((ld_u32_a2((p) + oh + (o)) >> hs) & 0x03030303u) << 4), \
            0x20202020u)
                a[0] = Q6V(sa, 0);
                a[1] = Q6V(sb, 0);
                a[2] = Q6V(sa, 16);
                a[3] = Q6V(sb, 16);
#undef Q6V
                const float da = gq_f16(sa + 208), db = gq_f16(sb + 208);
                const int8_t *sca = (const int8_t *)(sa + 192 + 8 * h + 2 * qq);
                const int8_t *scb = (const int8_t *)(sb + 192 + 8 * h + 2 * qq);
                dwa = __fmul_rn(da, (float)sca[0]);
                dha = __fmul_rn(da, (float)sca[1]);
                dwb = __fmul_rn(db, (float)scb[0]);
                dhb = __fmul_rn(db, (float)scb[1]);
            } else if (TYPE == STRATA_TYPE_Q4_K) {
                /* the stage is one super-block per row: sub-block blk's value v is nibble blk % 2 of
                 * qs[32 * (blk / 2) + v]; w = (d * sc) * q - (dmin * m), q in 0..15 */
                const uint8_t *sa = wr, *sb = wr + 8 * SA;
                const int o = 16 + 32 * (blk >> 1) + 4 * tig, sh = 4 * (blk & 1);
                a[0] = (ld_u32_a2(sa + o) >> sh) & 0x0F0F0F0Fu;
                a[1] = (ld_u32_a2(sb + o) >> sh) & 0x0F0F0F0Fu;
                a[2] = (ld_u32_a2(sa + o + 16) >> sh) & 0x0F0F0F0Fu;
                a[3] = (ld_u32_a2(sb + o + 16) >> sh) & 0x0F0F0F0Fu;
                int sc, m;
                gq_q4k_scale_min(sa + 4, blk, &sc, &m);
                dwa = __fmul_rn(gq_f16(sa), (float)sc);
                mna = __fmul_rn(gq_f16(sa + 2), (float)m);
                gq_q4k_scale_min(sb + 4, blk, &sc, &m);
                dwb = __fmul_rn(gq_f16(sb), (float)sc);
                mnb = __fmul_rn(gq_f16(sb + 2), (float)m);
            } else if (TYPE == STRATA_TYPE_Q8_0) {
                dwa = gq_f16(ba);
                dwb = gq_f16(bb);
                a[0] = ld_u32_a2(ba + 2 + 4 * tig);
                a[1] = ld_u32_a2(bb + 2 + 4 * tig);
                a[2] = ld_u32_a2(ba + 18 + 4 * tig);
                a[3] = ld_u32_a2(bb + 18 + 4 * tig);
            } else { /* Q4_0: byte j holds value j (low nibble) and value j + 16 (high nibble) */
                dwa = gq_f16(ba);
                dwb = gq_f16(bb);
                const uint32_t qa = ld_u32_a2(ba + 2 + 4 * tig), qb = ld_u32_a2(bb + 2 + 4 * tig);
                a[0] = __vsub4(qa & 0x0F0F0F0Fu, 0x08080808u);
                a[1] = __vsub4(qb & 0x0F0F0F0Fu, 0x08080808u);
                a[2] = __vsub4((qa >> 4) & 0x0F0F0F0Fu, 0x08080808u);
                a[3] = __vsub4((qb >> 4) & 0x0F0F0F0Fu, 0x08080808u);
            }
#pragma unroll
            for (int nt = 0; nt < 8; nt++) {
                if (nt * 8 >= cnt) break; /* warp-uniform: the rest of the tile is empty */
                const uint8_t *bp = sB + (nt * 8 + gid) * MQ_SB + blk * 32 + 4 * tig;
                const uint32_t b0 = *(const uint32_t *)bp, b1 = *(const uint32_t *)(bp + 16);
                float c[4] = {0.0f, 0.0f, 0.0f, 0.0f};
                if (!K6) mma_s8<SM80>(c, a, b0, b1);
                const float2 dx = *(const float2 *)&sdx[blk][nt * 8 + 2 * tig];
                if (K6) {
                    /* the two halves of the block by two MMAs, each with the other half's weights
                     * zeroed: term = (d*sc_lo * dx) * isum_lo + (d*sc_hi * dx) * isum_hi */
                    const uint32_t alo[4] = {a[0], a[1], 0u, 0u}, ahi[4] = {0u, 0u, a[2], a[3]};
                    float cl[4], ch[4];
                    mma_s8<SM80>(cl, alo, b0, b1);
                    mma_s8<SM80>(ch, ahi, b0, b1);
                    acc[nt][0] = __fadd_rn(acc[nt][0], __fadd_rn(__fmul_rn(__fmul_rn(dwa, dx.x), cl[0]),
                                                                 __fmul_rn(__fmul_rn(dha, dx.x), ch[0])));
                    acc[nt][1] = __fadd_rn(acc[nt][1], __fadd_rn(__fmul_rn(__fmul_rn(dwa, dx.y), cl[1]),
                                                                 __fmul_rn(__fmul_rn(dha, dx.y), ch[1])));
                    acc[nt][2] = __fadd_rn(acc[nt][2], __fadd_rn(__fmul_rn(__fmul_rn(dwb, dx.x), cl[2]),
                                                                 __fmul_rn(__fmul_rn(dhb, dx.x), ch[2])));
                    acc[nt][3] = __fadd_rn(acc[nt][3], __fadd_rn(__fmul_rn(__fmul_rn(dwb, dx.y), cl[3]),
                                                                 __fmul_rn(__fmul_rn(dhb, dx.y), ch[3])));
                } else if (TYPE == STRATA_TYPE_Q4_K) {
                    /* the tokens' block sums (for the min term) by one more MMA against ones:
                     * every row of C is then sum_k x[k][n], so c[0], c[2] hold token 2tig's, c[1], c[3]
                     * token 2tig + 1's. term = (dsc * dx) * isum - (dmin_m * dx) * xsum */
                    const uint32_t ones[4] = {0x01010101u, 0x01010101u, 0x01010101u, 0x01010101u};
                    float xs[4];
                    mma_s8<SM80>(xs, ones, b0, b1);
                    acc[nt][0] = __fadd_rn(acc[nt][0], __fsub_rn(__fmul_rn(__fmul_rn(dwa, dx.x), c[0]),
                                                                 __fmul_rn(__fmul_rn(mna, dx.x), xs[0])));
                    acc[nt][1] = __fadd_rn(acc[nt][1], __fsub_rn(__fmul_rn(__fmul_rn(dwa, dx.y), c[1]),
                                                                 __fmul_rn(__fmul_rn(mna, dx.y), xs[1])));
                    acc[nt][2] = __fadd_rn(acc[nt][2], __fsub_rn(__fmul_rn(__fmul_rn(dwb, dx.x), c[2]),
                                                                 __fmul_rn(__fmul_rn(mnb, dx.x), xs[2])));
                    acc[nt][3] = __fadd_rn(acc[nt][3], __fsub_rn(__fmul_rn(__fmul_rn(dwb, dx.y), c[3]),
                                                                 __fmul_rn(__fmul_rn(mnb, dx.y), xs[3])));
                } else {
                    acc[nt][0] = __fadd_rn(acc[nt][0], __fmul_rn(__fmul_rn(dwa, dx.x), c[0]));
                    acc[nt][1] = __fadd_rn(acc[nt][1], __fmul_rn(__fmul_rn(dwa, dx.y), c[1]));
                    acc[nt][2] = __fadd_rn(acc[nt][2], __fmul_rn(__fmul_rn(dwb, dx.x), c[2]));
                    acc[nt][3] = __fadd_rn(acc[nt][3], __fmul_rn(__fmul_rn(dwb, dx.y), c[3]));
                }
            }
        }
    }

    mq_store(acc, y, ys, syr, cnt, row0 + warp * 16 + gid, rows, tig, accumulate);
}

/* mmq_types.cu's kernels of a type; NULL for the types of this file and those without a tensor-core form */
static const mmq_kernels *mmq_types_find(int32_t type) {
    for (int i = 0; i < cuda_mmq_types_n; i++)
        if (cuda_mmq_types[i].type == type) return &cuda_mmq_types[i];
    return NULL;
}

static strata_status mmq_launch(cuda_ctx *ctx, int32_t type, const void *w, const void *const *w_ptrs, int64_t rows,
                                int64_t cols, const void *xq, int64_t xs, const int32_t *pairs,
                                const int32_t *seg_start, int32_t xdiv, float *y, int64_t ys, int64_t units, int32_t T,
                                int32_t accumulate) {
    if (rows <= 0 || units <= 0) return STRATA_OK;
    if (!cuda_mmq_supported(type) || !gq_shape_ok(type, cols) || xs % 16 || ((uintptr_t)xq & 15)) {
        snprintf(ctx->err, sizeof ctx->err,
                 "CUDA: the grouped product runs quantized weights on 16-byte aligned activation rows of whole "
                 "blocks (type %d, %lld cols, row stride %lld bytes)",
                 type, (long long)cols, (long long)xs);
        return STRATA_ERR_INVALID_ARGUMENT;
    }
    const int64_t rb = gq_row_bytes(type, cols);
    cudaStream_t s = CU_COMPUTE(ctx);
    const mmq_kernels *k = mmq_types_find(type);
    /* grid.y is limited to 65535: launch in slices of units */
    for (int64_t u0 = 0; u0 < units; u0 += 65535) {
        const int64_t nu = units - u0 < 65535 ? units - u0 : 65535;
        dim3 grid(cu_blocks(rows, MQ_BM), (unsigned)nu);
/* ctx->sm80: cp.async and mma m16n8k32 (arch.cuh); else plain copies and mma m8n8k16, the same bits */
#define MQ_LAUNCH2(TY, SM)                                                                                   \
    k_mmq<TY, SM><<<grid, MQ_THREADS, 0, s>>>((const uint8_t *)w, (const uint8_t *const *)w_ptrs, rb, rows, cols,      \
                                              (const uint8_t *)xq, xs, pairs, seg_start, xdiv, y, ys, T, accumulate, u0)
#define MQ_LAUNCH(TY)                                                                                        \
    do {                                                                                                     \
        if (ctx->sm80) MQ_LAUNCH2(TY, true);                                                                 \
        else MQ_LAUNCH2(TY, false);                                                                          \
    } while (0)
        if (type == STRATA_TYPE_Q8_0)
            MQ_LAUNCH(STRATA_TYPE_Q8_0);
        else if (type == STRATA_TYPE_Q4_0)
            MQ_LAUNCH(STRATA_TYPE_Q4_0);
        else if (type == STRATA_TYPE_Q4_K)
            MQ_LAUNCH(STRATA_TYPE_Q4_K);
        else if (type == STRATA_TYPE_Q6_K)
            MQ_LAUNCH(STRATA_TYPE_Q6_K);
        else /* mmq_types.cu's (cuda_mmq_supported found it there) */
            (ctx->sm80 ? k->sm80 : k->portable)<<<grid, MQ_THREADS, 0, s>>>(
                (const uint8_t *)w, (const uint8_t *const *)w_ptrs, rb, rows, cols, (const uint8_t *)xq, xs, pairs,
                seg_start, xdiv, y, ys, T, accumulate, u0);
#undef MQ_LAUNCH
#undef MQ_LAUNCH2
        CU_LAUNCHED(ctx, "grouped quantized product");
    }
    return STRATA_OK;
}

extern "C" {

int32_t cuda_mmq_supported(int32_t type) {
    return type == STRATA_TYPE_Q8_0 || type == STRATA_TYPE_Q4_0 || type == STRATA_TYPE_Q4_K ||
           type == STRATA_TYPE_Q6_K || mmq_types_find(type) != NULL;
}

strata_status cuda_mmq(cuda_ctx *ctx, int32_t type, const void *w, int64_t rows, int64_t cols, const void *xq,
                       int64_t xs, float *y, int64_t ys, int32_t T, int32_t accumulate) {
    if (T <= 0) return STRATA_OK;
    return mmq_launch(ctx, type, w, NULL, rows, cols, xq, xs, NULL, NULL, 1, y, ys, (T + MQ_BN - 1) / MQ_BN, T,
                      accumulate);
}

strata_status cuda_mmq_segments(cuda_ctx *ctx, int32_t type, const void *const *w_ptrs, int64_t rows, int64_t cols,
                                const void *xq, int64_t xs, const int32_t *pairs, const int32_t *seg_start,
                                int32_t xdiv, float *y, int64_t ys, int32_t n_segments) {
    if (n_segments <= 0) return STRATA_OK;
    if (xdiv <= 0) return STRATA_ERR_INVALID_ARGUMENT;
    return mmq_launch(ctx, type, NULL, w_ptrs, rows, cols, xq, xs, pairs, seg_start, xdiv, y, ys, n_segments, 0, 0);
}

} /* extern "C" */
