/*
 * mmq_common.cuh — the tile geometry and helpers shared by the tensor-core prompt products: mmq.cu (Q8_0,
 * Q4_0, Q4_K, Q6_K) and mmq_types.cu (the types of group_dequant_types.h).
 */
#ifndef STRATA_CUDA_MMQ_COMMON_CUH
#define STRATA_CUDA_MMQ_COMMON_CUH

#include "arch.cuh"
#include "common.cuh"

#define MQ_BM 64
#define MQ_BN CUDA_MMQ_TOKENS
#define MQ_KC 8                     /* blocks per stage */
#define MQ_THREADS 128
#define MQ_SB (MQ_KC * 32 + 16)     /* token tile row stride: 272 bytes = 68 words, so the 4-byte
                                       fragment reads of a warp (8 tokens x 4 threads) hit 32 banks */

static_assert(MQ_BN == 64, "the token loops below assume 64 tokens per tile");

/* The integer dots of one 16x8 tile as floats, exactly. The accumulator starts at the bit pattern of
 * 1.5 * 2^23 (whose float ulp is 1), so that the int32 result read as a float is 1.5 * 2^23 + dot for
 * |dot| < 2^22 (a block's dot is at most 32 * 128 * 127 in magnitude); subtracting 1.5 * 2^23 is then
 * exact and gives (float)dot: the same bits as a conversion, on the full-rate float pipe instead of
 * the quarter-rate conversion unit. */
#define MQ_BIAS_BITS 0x4B400000
#define MQ_BIAS 12582912.0f
template <bool SM80>
static __device__ __forceinline__ void mma_s8(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    int r[4];
    cu_mma_s8<SM80>(r, a, b0, b1, MQ_BIAS_BITS);
#pragma unroll
    for (int i = 0; i < 4; i++) c[i] = __fsub_rn(__int_as_float(r[i]), MQ_BIAS);
}

/* Copy `bytes` of each of nrows rows (row r at src0 + src_off[r]) to dst rows of dst_stride, in units
 * of U (the caller checks that every address and length is a multiple of sizeof(U)). */
template <typename U>
static __device__ __forceinline__ void copy_rows(uint8_t *dst, int64_t dst_stride, const uint8_t *src0,
                                                 const int64_t *src_off, int nrows, int bytes) {
    const int per = bytes / (int)sizeof(U);
    for (int i = threadIdx.x; i < nrows * per; i += MQ_THREADS) {
        const int r = i / per, u = i - r * per;
        *(U *)(dst + r * dst_stride + u * (int)sizeof(U)) = *(const U *)(src0 + src_off[r] + u * (int)sizeof(U));
    }
}

/* The rows of one thread block (the setup of k_mmq and k_mmq_t): which tokens it takes, where their x
 * rows start (sxo, bytes) and which y row each writes (syr, -1 = none), and where its BM weight rows start
 * (swo, bytes); returns the number of tokens. See k_mmq (mmq.cu) for the dense and the segment forms. */
static __device__ __forceinline__ int mq_tile_rows(int64_t *sxo, int64_t *syr, int64_t *swo, bool segments,
                                                   const int32_t *__restrict__ pairs,
                                                   const int32_t *__restrict__ seg_start, int32_t xdiv, int64_t xs,
                                                   int32_t T, int64_t unit, int64_t row0, int64_t rows,
                                                   int64_t row_bytes) {
    const int tid = threadIdx.x;
    int cnt;
    if (segments) {
        const int32_t s0 = seg_start[unit];
        cnt = seg_start[unit + 1] - s0;
        for (int j = tid; j < MQ_BN; j += MQ_THREADS) {
            const int32_t p = j < cnt ? pairs[s0 + j] : -1;
            sxo[j] = p >= 0 ? (int64_t)(p / xdiv) * xs : 0;
            syr[j] = p;
        }
    } else {
        const int64_t t0 = unit * MQ_BN;
        cnt = T - t0 < MQ_BN ? (int)(T - t0) : MQ_BN;
        for (int j = tid; j < MQ_BN; j += MQ_THREADS) {
            sxo[j] = j < cnt ? (t0 + j) * xs : 0;
            syr[j] = j < cnt ? t0 + j : -1;
        }
    }
    for (int j = tid; j < MQ_BM; j += MQ_THREADS) {
        /* rows past the end read the last row (valid memory); their results are not written */
        const int64_t r = row0 + j < rows ? row0 + j : rows - 1;
        swo[j] = r * row_bytes;
    }
    return cnt;
}

/* The token tile of a stage (blocks c0 .. c0 + nb - 1), in flight until cu_cp_wait_all: 16-byte unit u of
 * token n is values 16u .. 16u + 15 of the stage (zeros past the segment's tokens or the row's end), and
 * the tokens' block scales. */
template <bool SM80>
static __device__ __forceinline__ void mq_load_tokens(uint8_t *sB, float (*sdx)[MQ_BN], const uint8_t *xq,
                                                      const float *xscale_base, const int64_t *sxo, int cnt,
                                                      int64_t c0, int nb) {
    const int tid = threadIdx.x;
    for (int i = tid; i < MQ_BN * 2 * MQ_KC; i += MQ_THREADS) {
        const int n = i / (2 * MQ_KC), u = i % (2 * MQ_KC);
        const bool ok = n < cnt && (u >> 1) < nb;
        cu_cp16<SM80>(sB + n * MQ_SB + u * 16, ok ? xq + sxo[n] + c0 * 32 + u * 16 : xq, ok ? 16 : 0);
    }
    for (int i = tid; i < MQ_BN * MQ_KC; i += MQ_THREADS) {
        const int n = i / MQ_KC, blk = i % MQ_KC;
        const bool ok = n < cnt && blk < nb;
        cu_cp4<SM80>(&sdx[blk][n], ok ? xscale_base + (sxo[n] >> 2) + c0 + blk : (const float *)xq, ok ? 4 : 0);
    }
}

/* The accumulators out: acc[nt][i] is row ra (i < 2) or ra + 8, token 8 nt + 2 tig + (i & 1); y += with
 * accumulate, else y =. Tokens past cnt and rows past the end are not written. */
static __device__ __forceinline__ void mq_store(const float (&acc)[8][4], float *__restrict__ y, int64_t ys,
                                                const int64_t *syr, int cnt, int64_t ra, int64_t rows, int tig,
                                                int32_t accumulate) {
    const int64_t rb = ra + 8;
#pragma unroll
    for (int nt = 0; nt < 8; nt++) {
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const int n = nt * 8 + 2 * tig + (i & 1);
            const int64_t r = (i & 2) ? rb : ra;
            if (n < cnt && r < rows) {
                float *p = y + syr[n] * ys + r;
                *p = accumulate ? __fadd_rn(*p, acc[nt][i]) : acc[nt][i];
            }
        }
    }
}

/* The kernels of a type for mmq.cu's launcher: with cp.async and m16n8k32 (sm80), or the portable forms. */
typedef void (*mmq_fn)(const uint8_t *, const uint8_t *const *, int64_t, int64_t, int64_t, const uint8_t *, int64_t,
                       const int32_t *, const int32_t *, int32_t, float *, int64_t, int32_t, int32_t, int64_t);
struct mmq_kernels {
    int32_t type;
    mmq_fn sm80, portable;
};
/* mmq_types.cu's table: the types of GQ_NEW_TYPES */
extern const mmq_kernels cuda_mmq_types[];
extern const int cuda_mmq_types_n;

#endif
