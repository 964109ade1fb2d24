/*
 * flash_attn.cu — causal attention of a prompt chunk on the tensor cores (f16 or int8 KV cache).
 *
 * Legend: T queries at positions pos0.., H query heads, Hkv key/value heads, G = H / Hkv query heads
 * per kv head, D head dim (32, 64 or 128), P = FA_KV positions per KV tile, R = T * G rows per kv head.
 *
 * Rows. For kv head hk, the queries that read it are the R rows r = t * G + gi (token t, query head
 * hk * G + gi), so that one block's rows share their K/V tiles (GQA reuse). A block takes FA_ROWS
 * consecutive rows of one kv head; warp w of it rows 16w .. 16w + 15. Blocks are launched in reverse
 * row order, the longest first.
 *
 * Tiles. The cache is cut into tiles of P positions from position 0, whatever pos0 and T. A block walks
 * tiles 0 .. (its last row's position) / P, K and V tiles brought to shared memory by cp.async, the
 * next tile's copies in flight while the current one is computed. Positions after the block's last row
 * are not read: their shared rows are zeros (they may not have been written yet, and a stale bit
 * pattern could be a NaN that 0 * NaN would spread).
 *
 * Arithmetic, per row (mma.sync m16n8k16, f16 x f16 -> f32, PTX fragment layouts below):
 *   s = (q * scale * log2 e) . k: q is split into f16 hi + lo (q - hi), so s carries about 22 bits of q;
 *       the dims are accumulated 16 at a time in order (hi then lo).
 *   positions after the row's own are masked to -inf; mt = max over the tile; m' = max(m, mt);
 *   alpha = 1 if m' == m else exp2(m - m'); p = exp2(s - m') (0 where masked);
 *   l = l * alpha + (sum of p: this lane's 16 values in order, then lanes xor 1, xor 2);
 *   o = o * alpha + p . v, p again split hi + lo, positions accumulated 16 at a time in order.
 *   out = o / l.
 * Every step depends on the row's own position, q and the cache, never on the other rows of its warp or
 * block, nor on T or pos0: a tile after the row's position leaves its state exactly as it was (alpha
 * 1, l + 0, o * 1 + products of p = 0), which is why a warp may skip the tiles after its own last row
 * and why a row gives the same bits in a chunk of 1 token as in a chunk of 4096.
 *
 * mma.m16n8k16 fragments (gid = lane / 4, tig = lane % 4; two f16 per register, lower column first):
 *   A (16 x 16, row major): a0 (gid, 2tig..+1), a1 (gid + 8, 2tig..), a2 (gid, 2tig + 8..), a3 (gid + 8, 2tig + 8..)
 *   B (16 x 8, k x n): b0 (k = 2tig..+1, n = gid), b1 (k = 2tig + 8..+9, n = gid)
 *   C (16 x 8, f32): c0 (gid, 2tig), c1 (gid, 2tig + 1), c2 (gid + 8, 2tig), c3 (gid + 8, 2tig + 1)
 * So the C fragments of two 8-position tiles of s are the A fragment of p for those 16 positions. B of
 * K^T comes from K rows by ldmatrix (thread i gets row i / 4, columns 2 (i % 4)..+1 of an 8 x 8
 * matrix); B of V from V rows by ldmatrix.trans (thread i gets rows 2 (i % 4)..+1 of column i / 4).
 *
 * int8 cache (I8). A cache row is kv_dim int8 values then kv_dim / 32 f32 scales (one per block of 32
 * values). The copies bring the tile's raw rows (the head's D bytes and D / 32 scales of each position)
 * to a staging area of S stages; once they have landed, the block turns the tile into the f16 K and V
 * tiles the products read, value = f16(f32(q8) * scale) (the f32 product of the decode kernel, rounded
 * to f16 once), and computes exactly as for an f16 cache. So an int8 cache gives the bits of an f16
 * cache holding f16(q8 * scale), and every property above holds as it is. Staging positions after the
 * block's last row are zeros (values and scales), so their f16 rows are zeros too.
 *
 * Cards. ldmatrix is sm_75's; the m16n8k16 product is two m16n8k8 on sm_75 (cu_mma_f16: the same
 * operands in the same order; the tensor core's own rounding of the sums is the hardware's, so the
 * last bits may differ between architectures, never between runs or chunkings on one card); cp.async
 * is plain copies below sm_80; one pipeline stage where two do not fit the card's shared memory.
 */
#include <cuda_fp16.h>
#include <stdint.h>

#include "arch.cuh"
#include "common.cuh"

#define FA_WARPS 4
#define FA_ROWS (16 * FA_WARPS) /* rows of a block */
#define FA_KV 64                /* positions per KV tile */
#define FA_PAD 8                /* halves after each shared row: ldmatrix's 8 rows fall in distinct banks */

/* Four 8 x 8 matrices of f16; lanes 8i .. 8i + 7 give the row addresses of matrix i. */
static __device__ __forceinline__ void fa_ldsm4(uint32_t (&r)[4], const __half *p) {
    const unsigned a = (unsigned)__cvta_generic_to_shared(p);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(a)
                 : "memory"); /* reads what cp.async wrote: keep it after the barrier */
}
static __device__ __forceinline__ void fa_ldsm4_t(uint32_t (&r)[4], const __half *p) {
    const unsigned a = (unsigned)__cvta_generic_to_shared(p);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(a)
                 : "memory"); /* reads what cp.async wrote: keep it after the barrier */
}

/* Two floats as an f16 pair (x in the lower half: the lower column of a fragment register). */
static __device__ __forceinline__ uint32_t fa_pack(float x, float y) {
    const __half2 h = __halves2half2(__float2half_rn(x), __float2half_rn(y));
    return *(const uint32_t *)&h;
}
/* hi = f16(x), lo = f16(x - hi): x to about 22 bits as two f16 operands. */
static __device__ __forceinline__ void fa_split(float x, float y, uint32_t &hi, uint32_t &lo) {
    const __half hx = __float2half_rn(x), hy = __float2half_rn(y);
    const __half2 h = __halves2half2(hx, hy);
    hi = *(const uint32_t *)&h;
    lo = fa_pack(__fsub_rn(x, __half2float(hx)), __fsub_rn(y, __half2float(hy)));
}

/* Shared memory of a block. f16 cache: S stages of a K and a V tile (2 stages, head dim 128: 68 KiB).
 * int8 cache: one f16 K and V tile, and S stages of the raw tiles (D bytes and D / 32 scales per
 * position, for K and for V): 2 stages, head dim 128: 70 KiB; 1 stage: 52 KiB. */
template <int D>
constexpr int fa_raw_bytes() {
    return 2 * FA_KV * (D + D / 8);
}
template <int D, bool I8>
constexpr int fa_smem_bytes(int S) {
    return I8 ? 2 * FA_KV * (D + FA_PAD) * 2 + S * fa_raw_bytes<D>() : S * 2 * FA_KV * (D + FA_PAD) * 2;
}

/* S = 2: the next tile's copies are in flight while the current tile is computed; S = 1 (a card whose
 * opt-in shared memory is below two stages, 64 KiB on sm_75, or STRATA_CUDA_PORTABLE=1): each tile is
 * brought in, then computed. SM80: cp.async (else plain copies, arch.cuh). Neither changes what is
 * computed or in which order: the same bits. I8: an int8 cache (kc, vc its rows of kv_dim * 9 / 8
 * bytes), copied CW bytes at a time (16 where every row and the cache start on 16 bytes, else 4): the
 * same bytes land either way. */
template <int D, int S, bool SM80, bool I8, int CW>
__global__ void __launch_bounds__(FA_WARPS * 32)
k_flash_attn(const float *__restrict__ q, const void *__restrict__ kcache, const void *__restrict__ vcache,
             float *__restrict__ out, int T, int H, int Hkv, int pos0, const int32_t *pos_dev, float qscale) {
    constexpr int SD = D + FA_PAD;  /* shared row stride in halves */
    constexpr int KS = D / 16;      /* k-steps of q . k */
    constexpr int ND = D / 8;       /* 8-wide column tiles of o */
    constexpr int NT = FA_KV / 8;   /* 8-position tiles of s */
    constexpr int CH = D / 8;       /* 16-byte chunks of a row */
    constexpr int NB = D / 32;      /* int8 cache: scales per row of a head */
    constexpr int FS = I8 ? 1 : S;  /* f16 tile stages */
    constexpr int RB = 2 * FA_KV * (D + D / 8); /* I8: bytes of a staging stage (fa_raw_bytes) */
    extern __shared__ __align__(16) unsigned char fa_smem[];
    __half *sk = (__half *)fa_smem;          /* [FS][FA_KV][SD] */
    __half *sv = sk + FS * FA_KV * SD;       /* [FS][FA_KV][SD] */
    /* I8 staging, stage st at raw + st * RB: K values [FA_KV][D], V values [FA_KV][D], K scales
     * [FA_KV][NB], V scales [FA_KV][NB] */
    unsigned char *raw = (unsigned char *)(sv + FS * FA_KV * SD);
    const __half *kc = (const __half *)kcache, *vc = (const __half *)vcache;
    const unsigned char *kc8 = (const unsigned char *)kcache, *vc8 = (const unsigned char *)vcache;

    if (pos_dev) pos0 = *pos_dev;
    const int G = H / Hkv, R = T * G, kv_dim = Hkv * D;
    const int hk = blockIdx.y;
    const int r0 = (gridDim.x - 1 - blockIdx.x) * FA_ROWS; /* longest blocks first */
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, gid = lane >> 2, tig = lane & 3;
    const int block_last = min(r0 + FA_ROWS - 1, R - 1);
    const int pos_last = pos0 + block_last / G; /* the last position any row of the block sees */
    const int ntile = pos_last / FA_KV + 1;
    /* the warp's rows; rows past R (the last block) borrow the last row's query and position, and
     * their results are not stored */
    const int wr0 = r0 + 16 * warp;
    const int warp_tiles = wr0 < R ? (pos0 + min(wr0 + 15, R - 1) / G) / FA_KV + 1 : 0;
    int row[2], rpos[2];
    const float *qrow[2];
#pragma unroll
    for (int i = 0; i < 2; i++) {
        row[i] = wr0 + gid + 8 * i;
        const int rc = min(row[i], R - 1), t = rc / G, h = hk * G + rc % G;
        rpos[i] = pos0 + t;
        qrow[i] = q + ((int64_t)t * H + h) * D;
    }

    /* q fragments, hi and lo, for all D dims */
    uint32_t qh[KS][4], ql[KS][4];
#pragma unroll
    for (int ks = 0; ks < KS; ks++) {
#pragma unroll
        for (int j = 0; j < 4; j++) {
            const int i = j & 1, c = ks * 16 + (j >> 1) * 8 + 2 * tig;
            const float2 x = *(const float2 *)(qrow[i] + c);
            fa_split(__fmul_rn(x.x, qscale), __fmul_rn(x.y, qscale), qh[ks][j], ql[ks][j]);
        }
    }

    /* bring tile j to stage st: row i of the tile is position j * FA_KV + i */
    auto load_tile = [&](int j, int st) {
        if (!I8) {
            __half *dk = sk + st * FA_KV * SD, *dv = sv + st * FA_KV * SD;
            for (int c = threadIdx.x; c < FA_KV * CH; c += FA_WARPS * 32) {
                const int i = c / CH, ch = c % CH, p = j * FA_KV + i;
                const int ok = p <= pos_last;
                const int64_t src = (int64_t)(ok ? p : pos_last) * kv_dim + hk * D + ch * 8;
                cu_cp16<SM80>(dk + i * SD + ch * 8, kc + src, ok ? 16 : 0);
                cu_cp16<SM80>(dv + i * SD + ch * 8, vc + src, ok ? 16 : 0);
            }
        } else {
            const int64_t rb = (int64_t)kv_dim + kv_dim / 8; /* bytes of a cache row */
            unsigned char *rk = raw + st * RB, *rv = rk + FA_KV * D;
            unsigned char *rks = rv + FA_KV * D, *rvs = rks + FA_KV * NB * 4;
            constexpr int VC = D / CW; /* copies of a row's values */
            for (int c = threadIdx.x; c < FA_KV * VC; c += FA_WARPS * 32) {
                const int i = c / VC, ch = c % VC, p = j * FA_KV + i;
                const int ok = p <= pos_last;
                const int64_t src = (int64_t)(ok ? p : pos_last) * rb + hk * D + ch * CW;
                if (CW == 16) {
                    cu_cp16<SM80>(rk + i * D + ch * 16, kc8 + src, ok ? 16 : 0);
                    cu_cp16<SM80>(rv + i * D + ch * 16, vc8 + src, ok ? 16 : 0);
                } else {
                    cu_cp4<SM80>(rk + i * D + ch * 4, kc8 + src, ok ? 4 : 0);
                    cu_cp4<SM80>(rv + i * D + ch * 4, vc8 + src, ok ? 4 : 0);
                }
            }
            for (int c = threadIdx.x; c < FA_KV * NB; c += FA_WARPS * 32) {
                const int i = c / NB, b = c % NB, p = j * FA_KV + i;
                const int ok = p <= pos_last;
                const int64_t src = (int64_t)(ok ? p : pos_last) * rb + kv_dim + (int64_t)(hk * NB + b) * 4;
                cu_cp4<SM80>(rks + (i * NB + b) * 4, kc8 + src, ok ? 4 : 0);
                cu_cp4<SM80>(rvs + (i * NB + b) * 4, vc8 + src, ok ? 4 : 0);
            }
        }
        cu_cp_commit<SM80>();
    };
    /* I8: the staged tile of stage st as f16 K and V tiles, value f16(f32(q8) * scale), 8 values (one
     * 16-byte shared store) at a time */
    auto convert_tile = [&](int st) {
        const unsigned char *rk = raw + st * RB, *rv = rk + FA_KV * D;
        const float *rks = (const float *)(rv + FA_KV * D), *rvs = rks + FA_KV * NB;
        for (int c = threadIdx.x; c < 2 * FA_KV * CH; c += FA_WARPS * 32) {
            const int isv = c >= FA_KV * CH, cc = isv ? c - FA_KV * CH : c;
            const int i = cc / CH, ch = cc % CH;
            const uint2 w = *(const uint2 *)((isv ? rv : rk) + i * D + ch * 8);
            const float sc = (isv ? rvs : rks)[i * NB + ch / 4];
            uint32_t hv[4];
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const uint32_t x = e < 2 ? w.x : w.y, sh = (e & 1) * 16;
                const float lo = __fmul_rn((float)(int8_t)(x >> sh), sc);
                const float hi = __fmul_rn((float)(int8_t)(x >> (sh + 8)), sc);
                hv[e] = fa_pack(lo, hi);
            }
            *(uint4 *)((isv ? sv : sk) + i * SD + ch * 8) = make_uint4(hv[0], hv[1], hv[2], hv[3]);
        }
    };

    float o[ND][4];
#pragma unroll
    for (int n = 0; n < ND; n++) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
    float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};

    if (S == 2) load_tile(0, 0);
    for (int j = 0; j < ntile; j++) {
        const int st = S == 2 ? j & 1 : 0;
        if (S == 1) {
            load_tile(j, 0); /* the stage's last readers passed the barrier at the end of the last tile */
            cu_cp_wait_group<SM80, 0>();
        } else if (j + 1 < ntile) {
            load_tile(j + 1, st ^ 1);
            cu_cp_wait_group<SM80, 1>();
        } else {
            cu_cp_wait_group<SM80, 0>();
        }
        __syncthreads();
        if (I8) {
            /* the f16 tiles' last readers (tile j - 1) passed the barrier above; the staging stage is
             * refilled only after the barrier below (the next iteration's copies) */
            convert_tile(st);
            __syncthreads();
        }
        if (j < warp_tiles) {
            const int fs = I8 ? 0 : st;
            const __half *tk = sk + fs * FA_KV * SD, *tv = sv + fs * FA_KV * SD;
            /* s = q . k for the tile's 64 positions (8 tiles of 8) */
            float s[NT][4];
#pragma unroll
            for (int n = 0; n < NT; n++) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.0f;
#pragma unroll
            for (int n = 0; n < NT; n++) {
#pragma unroll
                for (int kk = 0; kk < KS / 2; kk++) {
                    /* matrices i = 0..3: positions 8n.., dims 32kk + 8i..: b0, b1 of k-step 2kk, then 2kk + 1 */
                    uint32_t b[4];
                    fa_ldsm4(b, tk + (n * 8 + (lane & 7)) * SD + kk * 32 + (lane >> 3) * 8);
                    cu_mma_f16(s[n], qh[2 * kk], b[0], b[1]);
                    cu_mma_f16(s[n], ql[2 * kk], b[0], b[1]);
                    cu_mma_f16(s[n], qh[2 * kk + 1], b[2], b[3]);
                    cu_mma_f16(s[n], ql[2 * kk + 1], b[2], b[3]);
                }
            }
            /* causal mask by absolute position, the tile's max per row */
            float mt[2] = {-INFINITY, -INFINITY};
#pragma unroll
            for (int n = 0; n < NT; n++) {
#pragma unroll
                for (int c = 0; c < 4; c++) {
                    const int p = j * FA_KV + n * 8 + 2 * tig + (c & 1);
                    if (p > rpos[c >> 1]) s[n][c] = -INFINITY;
                    mt[c >> 1] = fmaxf(mt[c >> 1], s[n][c]);
                }
            }
            float alpha[2];
#pragma unroll
            for (int i = 0; i < 2; i++) {
                mt[i] = fmaxf(mt[i], __shfl_xor_sync(0xffffffffu, mt[i], 1));
                mt[i] = fmaxf(mt[i], __shfl_xor_sync(0xffffffffu, mt[i], 2));
                const float mn = fmaxf(m[i], mt[i]);
                alpha[i] = mn == m[i] ? 1.0f : exp2f(__fsub_rn(m[i], mn));
                m[i] = mn;
            }
            /* p = exp2(s - m), 0 where masked; the row sums in a fixed order */
            float ps[2] = {0.0f, 0.0f};
#pragma unroll
            for (int n = 0; n < NT; n++) {
#pragma unroll
                for (int c = 0; c < 4; c++) {
                    const float x = s[n][c];
                    s[n][c] = x == -INFINITY ? 0.0f : exp2f(__fsub_rn(x, m[c >> 1]));
                    ps[c >> 1] = __fadd_rn(ps[c >> 1], s[n][c]);
                }
            }
#pragma unroll
            for (int i = 0; i < 2; i++) {
                ps[i] = __fadd_rn(ps[i], __shfl_xor_sync(0xffffffffu, ps[i], 1));
                ps[i] = __fadd_rn(ps[i], __shfl_xor_sync(0xffffffffu, ps[i], 2));
                l[i] = __fadd_rn(__fmul_rn(l[i], alpha[i]), ps[i]);
            }
#pragma unroll
            for (int n = 0; n < ND; n++) {
                o[n][0] = __fmul_rn(o[n][0], alpha[0]);
                o[n][1] = __fmul_rn(o[n][1], alpha[0]);
                o[n][2] = __fmul_rn(o[n][2], alpha[1]);
                o[n][3] = __fmul_rn(o[n][3], alpha[1]);
            }
            /* o += p . v, 16 positions at a time */
#pragma unroll
            for (int kp = 0; kp < FA_KV / 16; kp++) {
                uint32_t ph[4], pl[4];
                fa_split(s[2 * kp][0], s[2 * kp][1], ph[0], pl[0]);
                fa_split(s[2 * kp][2], s[2 * kp][3], ph[1], pl[1]);
                fa_split(s[2 * kp + 1][0], s[2 * kp + 1][1], ph[2], pl[2]);
                fa_split(s[2 * kp + 1][2], s[2 * kp + 1][3], ph[3], pl[3]);
#pragma unroll
                for (int n = 0; n < ND; n += 2) {
                    /* matrices i = 0..3: positions 16kp + 8 (i & 1).., dims 8n + 8 (i >> 1)..:
                     * b0, b1 of column tile n, then of n + 1 */
                    const int i = lane >> 3;
                    uint32_t b[4];
                    fa_ldsm4_t(b, tv + (kp * 16 + (i & 1) * 8 + (lane & 7)) * SD + n * 8 + (i >> 1) * 8);
                    cu_mma_f16(o[n], ph, b[0], b[1]);
                    cu_mma_f16(o[n], pl, b[0], b[1]);
                    cu_mma_f16(o[n + 1], ph, b[2], b[3]);
                    cu_mma_f16(o[n + 1], pl, b[2], b[3]);
                }
            }
        }
        /* f16: the stage is refilled by the next iteration's copies. I8: the next iteration's copies
         * go to a staging stage last read before the barrier after convert_tile, and its f16 tiles are
         * written after its first barrier, so no barrier is needed here. */
        if (!I8) __syncthreads();
    }

#pragma unroll
    for (int i = 0; i < 2; i++) {
        if (row[i] >= R) continue;
        const int t = row[i] / G, h = hk * G + row[i] % G;
        float *orow = out + ((int64_t)t * H + h) * D;
#pragma unroll
        for (int n = 0; n < ND; n++) {
            float2 y;
            y.x = __fdiv_rn(o[n][2 * i], l[i]);
            y.y = __fdiv_rn(o[n][2 * i + 1], l[i]);
            *(float2 *)(orow + n * 8 + 2 * tig) = y;
        }
    }
}

extern "C" int32_t cuda_flash_attention_supported(int32_t kv_type, int32_t H, int32_t Hkv, int32_t hd) {
    return (kv_type == STRATA_KV_F16 || kv_type == STRATA_KV_INT8) && (hd == 32 || hd == 64 || hd == 128) &&
           Hkv > 0 && H % Hkv == 0;
}

template <int D, int S, bool SM80, bool I8, int CW>
static strata_status fa_launch_as(cuda_ctx *ctx, const float *q, const void *kc, const void *vc, float *out, int32_t T,
                                  int32_t H, int32_t Hkv, int32_t pos0, const int32_t *pos_dev) {
    const int bytes = fa_smem_bytes<D, I8>(S);
    /* above 48 KiB a kernel must ask for its dynamic shared memory */
    CU_TRY(ctx,
           cudaFuncSetAttribute(k_flash_attn<D, S, SM80, I8, CW>, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes),
           "setting the flash attention kernel's shared memory (%d bytes)", bytes);
    const int64_t rows = (int64_t)T * (H / Hkv);
    const dim3 grid((unsigned)((rows + FA_ROWS - 1) / FA_ROWS), (unsigned)Hkv);
    /* scores in log2 units: exp2(s') = exp(q . k / sqrt(D)) */
    const float qscale = (float)(1.4426950408889634 / sqrt((double)D));
    k_flash_attn<D, S, SM80, I8, CW><<<grid, FA_WARPS * 32, bytes, CU_COMPUTE(ctx)>>>(q, kc, vc, out, T, H, Hkv, pos0,
                                                                                   pos_dev, qscale);
    CU_LAUNCHED(ctx, "flash attention");
    return STRATA_OK;
}

template <int D, bool I8, int CW>
static strata_status fa_launch_kv(cuda_ctx *ctx, int two, const float *q, const void *kc, const void *vc, float *out,
                                  int32_t T, int32_t H, int32_t Hkv, int32_t pos0, const int32_t *pos_dev) {
    if (two) {
        return ctx->sm80 ? fa_launch_as<D, 2, true, I8, CW>(ctx, q, kc, vc, out, T, H, Hkv, pos0, pos_dev)
                         : fa_launch_as<D, 2, false, I8, CW>(ctx, q, kc, vc, out, T, H, Hkv, pos0, pos_dev);
    }
    return ctx->sm80 ? fa_launch_as<D, 1, true, I8, CW>(ctx, q, kc, vc, out, T, H, Hkv, pos0, pos_dev)
                     : fa_launch_as<D, 1, false, I8, CW>(ctx, q, kc, vc, out, T, H, Hkv, pos0, pos_dev);
}

/* Two stages where the card's opt-in shared memory holds them (every card but sm_75 at head dim 128),
 * cp.async where the code has it; STRATA_CUDA_PORTABLE=1 takes one stage and plain copies. */
template <int D, bool I8>
static strata_status fa_launch(cuda_ctx *ctx, const float *q, const void *kc, const void *vc, float *out, int32_t T,
                               int32_t H, int32_t Hkv, int32_t pos0, const int32_t *pos_dev) {
    const int two = !ctx->portable && fa_smem_bytes<D, I8>(2) <= ctx->smem_optin;
    if (!two && fa_smem_bytes<D, I8>(1) > ctx->smem_optin) {
        snprintf(ctx->err, sizeof ctx->err,
                 "CUDA: flash attention at head dim %d needs %d bytes of shared memory per block; %s allows %d",
                 D, fa_smem_bytes<D, I8>(1), ctx->name, ctx->smem_optin);
        return STRATA_ERR_UNSUPPORTED;
    }
    if (!I8) return fa_launch_kv<D, false, 16>(ctx, two, q, kc, vc, out, T, H, Hkv, pos0, pos_dev);
    /* int8 rows are kv_dim * 9 / 8 bytes: 16-byte copies where every row starts on 16 bytes */
    const int64_t rb = (int64_t)Hkv * D * 9 / 8;
    const int w16 = rb % 16 == 0 && ((uintptr_t)kc | (uintptr_t)vc) % 16 == 0;
    if (((uintptr_t)kc | (uintptr_t)vc) % 4) {
        snprintf(ctx->err, sizeof ctx->err, "CUDA: flash attention needs an int8 KV cache aligned to 4 bytes");
        return STRATA_ERR_INVALID_ARGUMENT;
    }
    return w16 ? fa_launch_kv<D, true, 16>(ctx, two, q, kc, vc, out, T, H, Hkv, pos0, pos_dev)
               : fa_launch_kv<D, true, 4>(ctx, two, q, kc, vc, out, T, H, Hkv, pos0, pos_dev);
}

extern "C" strata_status cuda_flash_attention(cuda_ctx *ctx, int32_t kv_type, const float *q, const void *k_cache,
                                              const void *v_cache, float *out, int32_t T, int32_t H, int32_t Hkv,
                                              int32_t hd, int32_t pos0, const int32_t *pos_dev) {
    if (T <= 0) return STRATA_OK;
    if (!cuda_flash_attention_supported(kv_type, H, Hkv, hd)) {
        snprintf(ctx->err, sizeof ctx->err,
                 "CUDA: flash attention with KV type %d, head dim %d, %d heads, %d kv heads is not supported "
                 "(f16 or int8 KV, head dim 32, 64 or 128, heads a multiple of kv heads)",
                 (int)kv_type, hd, H, Hkv);
        return STRATA_ERR_UNSUPPORTED;
    }
    const bool i8 = kv_type == STRATA_KV_INT8;
    switch (hd) {
    case 32:
        return i8 ? fa_launch<32, true>(ctx, q, k_cache, v_cache, out, T, H, Hkv, pos0, pos_dev)
                  : fa_launch<32, false>(ctx, q, k_cache, v_cache, out, T, H, Hkv, pos0, pos_dev);
    case 64:
        return i8 ? fa_launch<64, true>(ctx, q, k_cache, v_cache, out, T, H, Hkv, pos0, pos_dev)
                  : fa_launch<64, false>(ctx, q, k_cache, v_cache, out, T, H, Hkv, pos0, pos_dev);
    default:
        return i8 ? fa_launch<128, true>(ctx, q, k_cache, v_cache, out, T, H, Hkv, pos0, pos_dev)
                  : fa_launch<128, false>(ctx, q, k_cache, v_cache, out, T, H, Hkv, pos0, pos_dev);
    }
}
