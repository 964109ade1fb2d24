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
