/*
 * matvec_types.cu — the matrix-vector kernels (matvec_kernels.cuh) instantiated for the block types of
 * group_dequant_types.h (GQ_NEW_TYPES): Q4_1, Q5_0, Q5_1, IQ4_NL, MXFP4, Q2_K, Q3_K, Q5_K, IQ4_XS, IQ3_XXS,
 * IQ3_S, IQ2_XS, IQ2_XXS, IQ2_S, IQ1_S, IQ1_M.
 *
 * They follow the K-quants' pattern: float activations, each lane dequantizing its slice of 8 values with
 * gguf-py's expressions (gq_dequant8) and adding w * x in the kernels' fixed order, so that one token gets
 * the same bits alone or inside a batch, and cuda_mirror.c's scalar kernel reproduces them on the host.
 * A file of its own so that these instantiations compile in parallel with matvec.cu.
 */
#include "matvec_kernels.cuh"

#define MV_ENTRY(T, V, B, N, MQ) MV_KERNELS_F(T),
const mv_kernels cuda_mv_types[] = {GQ_NEW_TYPES(MV_ENTRY)};
#undef MV_ENTRY
const int cuda_mv_types_n = (int)(sizeof cuda_mv_types / sizeof cuda_mv_types[0]);
