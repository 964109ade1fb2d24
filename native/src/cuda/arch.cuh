/*
 * arch.cuh — the instructions whose availability differs by GPU architecture, each behind one function
 * with a fallback, so that every card from Turing (sm_75) on runs the same kernels.
 *
 * The library carries machine code for sm_75, 80, 86, 89, 90 and 120 and compute_75 PTX
 * (native/CMakeLists.txt). Each function below is compiled per architecture under __CUDA_ARCH__
 * guards; where the host may also choose (template parameter SM80), it chooses from what the loaded
 * code was compiled for, cuda_ctx.code_arch, probed when a context is made (device.cu), and never from
 * the device alone: the compute_75 PTX that the driver compiles for a device with no machine code of
 * its own (or for any device under CUDA_FORCE_PTX_JIT=1) runs the sm_75 code, whatever the device.
 * STRATA_CUDA_PORTABLE=1 makes the host choose every fallback it can on any device (cuda_ctx.portable).
 *
 *   feature                          from    fallback, and why it gives the same bits
 *   programmatic dependent launch    sm_90   plain launches (common.cuh: cu_pdl_wait / cu_pdl_trigger
 *                                            are empty, the launch attribute is not set). It changes
 *                                            when a kernel starts, not what it computes.
 *   cp.async, global -> shared       sm_80   a load and a store through registers (zeros where the copy
 *                                            fills zeros), finished before the barrier that follows: the
 *                                            same bytes land in shared memory.
 *   mma m16n8k32 s8 x s8 -> s32      sm_80   four mma m8n8k16 (sm_75) on the same fragment registers:
 *                                            every sum is an exact int32 sum (no overflow: cu_mma_s8),
 *                                            so any grouping of the 32 products gives the same integer.
 *   mma m16n8k16 f16 x f16 -> f32    sm_80   two mma m16n8k8 (sm_75): see cu_mma_f16; the one place where
 *                                            the card's own arithmetic decides the last bits.
 *   shared memory per block          -       the opt-in maximum differs (64 KiB sm_75, 99 KiB sm_86/89/120,
 *                                            163 KiB sm_80, 227 KiB sm_90): kernels that need more than
 *                                            48 KiB size their pipeline from cuda_ctx.smem_optin
 *                                            (flash_attn.cu: one stage instead of two).
 *
 * Not covered by a fallback and assumed the same on every card: IEEE float add, multiply, divide and
 * square root (every kernel is built with -fmad=false and the default -prec-div / -prec-sqrt, so each
 * is rounded on its own), integer dp4a, and the special-function unit's exp2 approximation behind
 * expf / exp2f (NVIDIA documents its error bound, not its bits; it has given the same bits on every
 * card strata has been run on, which so far is the H200 alone).
 */
#ifndef STRATA_CUDA_ARCH_CUH
#define STRATA_CUDA_ARCH_CUH

#include <stdint.h>

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 750
#error "strata's CUDA kernels need sm_75 (Turing) or newer: build for those architectures (STRATA_CUDA_ARCHS)"
#endif

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
#define CU_ARCH_SM80 1
#else
#define CU_ARCH_SM80 0
#endif

/* ---- global -> shared copies --------------------------------------------------------------------
 * src_bytes is all or nothing (16 / 4, or 0: write zeros and read nothing). With SM80 in code built for
 * sm_80 or newer the copy is asynchronous and done once cu_cp_wait_all (or cu_cp_wait_group) returns in
 * the thread that issued it; otherwise it is done when the call returns. Either way the caller's
 * __syncthreads after the wait makes it visible to the block. */
template <bool SM80> static __device__ __forceinline__ void cu_cp16(void *dst, const void *src, int src_bytes) {
#if CU_ARCH_SM80
    if (SM80) {
        const unsigned d = (unsigned)__cvta_generic_to_shared(dst);
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(d), "l"(src), "r"(src_bytes) : "memory");
        return;
    }
#endif
    *(uint4 *)dst = src_bytes ? *(const uint4 *)src : make_uint4(0u, 0u, 0u, 0u);
}
template <bool SM80> static __device__ __forceinline__ void cu_cp4(void *dst, const void *src, int src_bytes) {
#if CU_ARCH_SM80
    if (SM80) {
        const unsigned d = (unsigned)__cvta_generic_to_shared(dst);
        asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;" ::"r"(d), "l"(src), "r"(src_bytes) : "memory");
        return;
    }
#endif
    *(uint32_t *)dst = src_bytes ? *(const uint32_t *)src : 0u;
}
/* The copies issued since the last commit form one group (cu_cp_wait_group counts groups). */
template <bool SM80> static __device__ __forceinline__ void cu_cp_commit() {
#if CU_ARCH_SM80
    if (SM80) asm volatile("cp.async.commit_group;" ::: "memory");
#endif
}
/* Wait until at most N of this thread's committed groups are still in flight. */
template <bool SM80, int N> static __device__ __forceinline__ void cu_cp_wait_group() {
#if CU_ARCH_SM80
    if (SM80) asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
#endif
}
template <bool SM80> static __device__ __forceinline__ void cu_cp_wait_all() {
#if CU_ARCH_SM80
    if (SM80) asm volatile("cp.async.wait_all;" ::: "memory");
#endif
}

/* ---- integer MMA: d = A (16 x 32 s8) . B (32 x 8 s8) + c, in int32 --------------------------------
 * Fragments (PTX ISA; gid = lane / 4, tig = lane % 4; 4 int8 per register, lowest k first):
 *   a0 = A[gid][4tig..], a1 = A[gid + 8][4tig..], a2 = A[gid][16 + 4tig..], a3 = A[gid + 8][16 + 4tig..]
 *   b0 = B[4tig..][gid], b1 = B[16 + 4tig..][gid]
 *   d0 = D[gid][2tig], d1 = D[gid][2tig + 1], d2 = D[gid + 8][2tig], d3 = D[gid + 8][2tig + 1]
 * c is added to all four. The sm_75 form splits the tile into the two 8-row halves and the two 16-wide
 * halves of k: mma m8n8k16 takes a = A[gid][4tig..] (8 x 16), b = B[4tig..][gid] (16 x 8) and gives
 * D[gid][2tig..+1], so rows gid take (a0, b0) then (a2, b1) and rows gid + 8 take (a1, b0) then (a3, b1),
 * the first product's result being the second one's accumulator. Integer addition is exact and
 * associative while nothing overflows, so both forms give the same int32 for every |c| + 32 * 128 * 128
 * below 2^31, which every caller keeps (mmq.cu: c = 1.5 * 2^23 as an integer, |dot| < 2^19). */
template <bool SM80>
static __device__ __forceinline__ void cu_mma_s8(int (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1, int c) {
#if CU_ARCH_SM80
    if (SM80) {
        asm volatile("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                     "{%10,%10,%10,%10};"
                     : "=r"(d[0]), "=r"(d[1]), "=r"(d[2]), "=r"(d[3])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1), "r"(c));
        return;
    }
#endif
#if defined(__CUDA_ARCH__)
    int lo0, lo1, hi0, hi1;
    asm volatile("mma.sync.aligned.m8n8k16.row.col.s32.s8.s8.s32 {%0,%1}, {%2}, {%3}, {%4,%4};"
                 : "=r"(lo0), "=r"(lo1)
                 : "r"(a[0]), "r"(b0), "r"(c));
    asm volatile("mma.sync.aligned.m8n8k16.row.col.s32.s8.s8.s32 {%0,%1}, {%2}, {%3}, {%4,%5};"
                 : "=r"(d[0]), "=r"(d[1])
                 : "r"(a[2]), "r"(b1), "r"(lo0), "r"(lo1));
    asm volatile("mma.sync.aligned.m8n8k16.row.col.s32.s8.s8.s32 {%0,%1}, {%2}, {%3}, {%4,%4};"
                 : "=r"(hi0), "=r"(hi1)
                 : "r"(a[1]), "r"(b0), "r"(c));
    asm volatile("mma.sync.aligned.m8n8k16.row.col.s32.s8.s8.s32 {%0,%1}, {%2}, {%3}, {%4,%5};"
                 : "=r"(d[2]), "=r"(d[3])
                 : "r"(a[3]), "r"(b1), "r"(hi0), "r"(hi1));
#endif
}

/* ---- f16 MMA: c += A (16 x 16 f16) . B (16 x 8 f16), in f32 ------------------------------------------
 * Fragments (two f16 per register, lower column first):
 *   a0 (gid, 2tig..+1), a1 (gid + 8, 2tig..), a2 (gid, 2tig + 8..), a3 (gid + 8, 2tig + 8..);
 *   b0 (k = 2tig..+1, n = gid), b1 (k = 2tig + 8..+9, n = gid); c as cu_mma_s8's d.
 * sm_80 and newer: one mma m16n8k16. sm_75: two mma m16n8k8, k 0..7 (a0, a1, b0) then k 8..15 (a2, a3,
 * b1), whose fragments are exactly those halves of the k16 ones.
 *
 * Bits. Each f16 x f16 product is exact in f32 (11 x 11 significand bits), but how the tensor core adds
 * the products and c is the hardware's: it aligns them to the largest exponent and keeps a limited
 * number of bits, in groups whose size has changed between generations, and NVIDIA does not specify it.
 * No fallback can reproduce another generation's tensor core exactly, and even the same instruction
 * need not give the same bits on two generations; only the inputs and their order are ours, and those
 * are the same in both forms. So flash attention (the one user) gives the same bits on every card of one
 * architecture, and may differ in the last bits between architectures; STRATA_CUDA_FLASH=0 runs prompt
 * attention on the float kernel of decode instead, whose bits do not depend on the card. Because of
 * this the form is chosen by the code's architecture only, not by STRATA_CUDA_PORTABLE: the portable
 * switch must not change a reply on the card it runs on. */
static __device__ __forceinline__ void cu_mma_f16(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
#if CU_ARCH_SM80
    /* not volatile: registers only, the compiler may schedule it freely */
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#elif defined(__CUDA_ARCH__)
    asm("mma.sync.aligned.m16n8k8.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5}, {%6}, {%0,%1,%2,%3};"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(b0));
    asm("mma.sync.aligned.m16n8k8.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5}, {%6}, {%0,%1,%2,%3};"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[2]), "r"(a[3]), "r"(b1));
#endif
}

#endif
