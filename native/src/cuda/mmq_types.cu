/*
 * mmq_types.cu — the tensor-core prompt product (mmq.cu's tiles and order) for the block types of
 * group_dequant_types.h: Q4_1, Q5_0, Q5_1, IQ4_NL, MXFP4, Q2_K, Q3_K, Q5_K, IQ4_XS, IQ3_XXS, IQ3_S, IQ2_XS,
 * IQ2_XXS, IQ2_S, IQ1_S, IQ1_M.
 *
 * A stage is KC = 8 groups of 32 values: 8 blocks of the 32-value types, one super-block of the others. The
 * weight tile holds each row's stage bytes as in the file (plain copies of the widest unit the addresses
 * allow: MXFP4's 17-byte blocks go byte by byte). Each thread unpacks its fragment's values with the
 * type's gq_w4 (int8 values q: the format's integers, w = s * q + m) and takes the scales from gq_ws; one
 * mma.m16n8k32 per 8 tokens gives each block's exact integer dot, and the group adds, by its form
 * (GQ_DEVICE_TYPES; each operation rounded on its own, groups in order):
 *
 *     0                        acc + (s0 dx) isum
 *     GQ_MQ_MIN                acc + ((s0 dx) isum + (m0 dx) xsum)          xsum: the token's block sum (MMA against ones)
 *     GQ_MQ_SPLIT              acc + ((s0 dx) ilo + (s1 dx) ihi)            halves of 16 values by two MMAs
 *     GQ_MQ_SPLIT | GQ_MQ_MIN  acc + (((s0 dx) ilo + (s1 dx) ihi) + ((m0 dx) xlo + (m1 dx) xhi))
 *
 * which depends on the row and the token alone (not on the tokens processed with it), and which
 * cuda_mirror_mmq computes on the host, bit for bit. SM80 = false: the same kernel with plain copies and
 * four mma m8n8k16 per m16n8k32 (arch.cuh), the same exact integers, so the same bits.
 */
#include "mmq_common.cuh"
#include "../group_dequant.h"

template <int TYPE>
static __device__ __forceinline__ uint32_t mq_w4(const uint8_t *b, int j, int v0) {
    switch (TYPE) {
#define MQ_CASE(T, V, B, N, MQ) \
    case T: return gq_w4_##N(b, j, v0);
        GQ_NEW_TYPES(MQ_CASE)
#undef MQ_CASE
    }
    return 0;
}
template <int TYPE>
static __device__ __forceinline__ void mq_ws(const uint8_t *b, int j, float *s, float *m) {
    switch (TYPE) {
#define MQ_CASE(T, V, B, N, MQ) \
    case T: gq_ws_##N(b, j, s, m); return;
        GQ_NEW_TYPES(MQ_CASE)
#undef MQ_CASE
    }
}

/* The arguments and tiles of k_mmq (mmq.cu); PER values and BB bytes per block, FORM the GQ_MQ_* flags. */
template <int TYPE, int PER, int BB, int FORM, bool SM80>
__global__ void __launch_bounds__(MQ_THREADS)
k_mmq_t(const uint8_t *__restrict__ W, const uint8_t *const *__restrict__ w_ptrs, int64_t row_bytes, int64_t rows,
        int64_t cols, const uint8_t *__restrict__ xq, int64_t xs, const int32_t *__restrict__ pairs,
        const int32_t *__restrict__ seg_start, int32_t xdiv, float *__restrict__ y, int64_t ys, int32_t T,
        int32_t accumulate, int64_t unit0) {
    constexpr bool SUPER = PER == 256;                     /* a stage is one super-block */
    constexpr int STAGE = SUPER ? BB : MQ_KC * BB;         /* bytes of a whole stage of a row */
    constexpr int SA = (STAGE + 15) / 16 * 16;             /* weight tile row stride */
    constexpr bool SPLIT = (FORM & GQ_MQ_SPLIT) != 0, MIN = (FORM & GQ_MQ_MIN) != 0;
    __shared__ __align__(16) uint8_t sA[MQ_BM * SA];       /* [BM rows][a stage in the file layout] */
    __shared__ __align__(16) uint8_t sB[MQ_BN * MQ_SB];    /* [BN tokens][KC blocks of 32 int8] */
    __shared__ __align__(16) float sdx[MQ_KC][MQ_BN];      /* activation scales [block][token] */
    __shared__ int64_t sxo[MQ_BN], swo[MQ_BM];             /* byte offsets of token rows / weight rows */
    __shared__ int64_t syr[MQ_BN];                         /* output row of each token, -1 = none */

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
    const uint64_t walign = (uint64_t)(uintptr_t)Wm | (uint64_t)row_bytes;
    const float *xscale_base = (const float *)(xq + cols); /* + sxo[token] bytes */
    const uint8_t *wr = sA + (warp * 16 + gid) * SA;       /* this thread's first row; +8 rows below */
    const uint32_t ones = 0x01010101u;

    for (int64_t c0 = 0; c0 < G; c0 += MQ_KC) {
        const int nb = G - c0 < MQ_KC ? (int)(G - c0) : MQ_KC;
        __syncthreads(); /* the previous stage's tiles are no longer read */
        {
            const int bytes = SUPER ? BB : nb * BB;
            const int64_t off = SUPER ? (c0 / MQ_KC) * BB : c0 * BB;
            const uint64_t al = walign | (uint64_t)off | (uint64_t)bytes;
            const uint8_t *src = Wm + off;
            if ((al & 15) == 0)
                copy_rows<uint4>(sA, SA, src, swo, MQ_BM, bytes);
            else if ((al & 3) == 0)
                copy_rows<uint32_t>(sA, SA, src, swo, MQ_BM, bytes);
            else if ((al & 1) == 0)
                copy_rows<uint16_t>(sA, SA, src, swo, MQ_BM, bytes);
            else
                copy_rows<uint8_t>(sA, SA, src, swo, MQ_BM, bytes);
        }
        /* tokens (mmq_common.cuh) */
        mq_load_tokens<SM80>(sB, sdx, xq, xscale_base, sxo, cnt, c0, nb);
        cu_cp_wait_all<SM80>();
        __syncthreads();

        for (int blk = 0; blk < nb; blk++) {
            /* rows gid and gid + 8 of the warp: their block of group blk, and the group within it */
            const uint8_t *ba = SUPER ? wr : wr + blk * BB, *bb = ba + 8 * SA;
            const int j = SUPER ? blk : 0;
            uint32_t a[4];
            a[0] = mq_w4<TYPE>(ba, j, 4 * tig);
            a[1] = mq_w4<TYPE>(bb, j, 4 * tig);
            a[2] = mq_w4<TYPE>(ba, j, 16 + 4 * tig);
            a[3] = mq_w4<TYPE>(bb, j, 16 + 4 * tig);
            float sa[2], ma[2], sb[2], mb[2];
            mq_ws<TYPE>(ba, j, sa, ma);
            mq_ws<TYPE>(bb, j, sb, mb);
            for (int nt = 0; nt < 8; nt++) {
                if (nt * 8 >= cnt) break; /* warp-uniform: the rest of the tile is empty */
                const uint8_t *bp = sB + (nt * 8 + gid) * MQ_SB + blk * 32 + 4 * tig;
                const uint32_t b0 = *(const uint32_t *)bp, b1 = *(const uint32_t *)(bp + 16);
                const float2 dxv = *(const float2 *)&sdx[blk][nt * 8 + 2 * tig];
                /* c[i]: row gid (i < 2) or gid + 8, token 2 tig + (i & 1) */
                float c[4], ch[4], x[4], xh[4];
                if (SPLIT) {
                    const uint32_t alo[4] = {a[0], a[1], 0u, 0u}, ahi[4] = {0u, 0u, a[2], a[3]};
                    mma_s8<SM80>(c, alo, b0, b1);
                    mma_s8<SM80>(ch, ahi, b0, b1);
                    if (MIN) {
                        const uint32_t olo[4] = {ones, ones, 0u, 0u}, ohi[4] = {0u, 0u, ones, ones};
                        mma_s8<SM80>(x, olo, b0, b1);
                        mma_s8<SM80>(xh, ohi, b0, b1);
                    }
                } else {
                    mma_s8<SM80>(c, a, b0, b1);
                    if (MIN) {
                        const uint32_t o[4] = {ones, ones, ones, ones};
                        mma_s8<SM80>(x, o, b0, b1);
                    }
                }
#pragma unroll
                for (int i = 0; i < 4; i++) {
                    const float dx = (i & 1) ? dxv.y : dxv.x;
                    const float *s = i < 2 ? sa : sb, *m = i < 2 ? ma : mb;
                    float t;
                    if (SPLIT) {
                        t = __fadd_rn(__fmul_rn(__fmul_rn(s[0], dx), c[i]), __fmul_rn(__fmul_rn(s[1], dx), ch[i]));
                        if (MIN)
                            t = __fadd_rn(t, __fadd_rn(__fmul_rn(__fmul_rn(m[0], dx), x[i]),
                                                       __fmul_rn(__fmul_rn(m[1], dx), xh[i])));
                    } else {
                        t = __fmul_rn(__fmul_rn(s[0], dx), c[i]);
                        if (MIN) t = __fadd_rn(t, __fmul_rn(__fmul_rn(m[0], dx), x[i]));
                    }
                    acc[nt][i] = __fadd_rn(acc[nt][i], t);
                }
            }
        }
    }

    mq_store(acc, y, ys, syr, cnt, row0 + warp * 16 + gid, rows, tig, accumulate);
}

#define MQ_ENTRY(T, V, B, N, MQ) {T, k_mmq_t<T, V, B, MQ, true>, k_mmq_t<T, V, B, MQ, false>},
const mmq_kernels cuda_mmq_types[] = {GQ_NEW_TYPES(MQ_ENTRY)};
#undef MQ_ENTRY
const int cuda_mmq_types_n = (int)(sizeof cuda_mmq_types / sizeof cuda_mmq_types[0]);
