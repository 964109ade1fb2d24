/* router_topk.cuh — the router's top-k of one token by one warp, shared by moe.cu (k_router_topk,
 * k_router_topk_fast) and matvec.cu (the F32 router product that routes in its last block).
 * Legend: E experts, K used per token. */
#ifndef STRATA_CUDA_ROUTER_TOPK_CUH
#define STRATA_CUDA_ROUTER_TOPK_CUH

#include "common.cuh"

#define RT_MAXE 8 /* logits per lane in registers: E <= 32 * RT_MAXE */

/* One round's candidate: expert e (logit v) replaces the lane's best if it comes after the previous
 * pick (pi, pv; pi < 0 in the first round) in the order "greater logit first, lower id on a tie" and
 * its logit is greater (a lane's experts come in rising e: a tie keeps the lower id). Written as
 * selects on values so that the inlined code is branch-free, as the open-coded form was. */
__device__ __forceinline__ bool cu_router_takes(int e, float v, int pi, float pv, int best, float bv) {
    const bool eligible = pi < 0 || v < pv || (v == pv && e > pi);
    return eligible && (best < 0 || v > bv);
}

/* The best of the warp's lanes by the same order (commutative and associative: every lane ends with the
 * same pick). */
__device__ __forceinline__ void cu_router_warp_best(int &best, float &bv) {
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) {
        const int ob = __shfl_xor_sync(0xffffffffu, best, off);
        const float ov = __shfl_xor_sync(0xffffffffu, bv, off);
        const bool take = ob >= 0 && (best < 0 || ov > bv || (ov == bv && ob < best));
        best = take ? ob : best;
        bv = take ? ov : bv;
    }
}

/* Segment j = t * K + k of cuda_matvec_segments for pick k (expert id) of token t: its weights from
 * table[id] (gate, up, down), token t into row j. */
__device__ __forceinline__ void cu_router_segment(const void *const *table, int id, int64_t j, int t,
                                                  const void **seg_w, int seg_cap, int32_t *seg_tok, int32_t *seg_out,
                                                  int64_t seg_half) {
    const void *const *p = table + (int64_t)id * 3;
    seg_w[j] = p[0];
    seg_w[seg_cap + j] = p[1];
    seg_w[2 * (int64_t)seg_cap + j] = p[2];
    seg_tok[j] = t;                     /* token row of xn */
    seg_out[j] = (int32_t)j;            /* row t * K + k of g and u */
    seg_tok[seg_half + j] = (int32_t)j; /* row of h */
    seg_out[seg_half + j] = (int32_t)j; /* row of ye */
}

/* k_router_topk's picks and weight bits for token t (logits lg[E]), by one warp: each lane loads its
 * logits once into registers (the first kernel reads them again in every round, one dependent round
 * trip per value); every lane then knows each round's pick and logit, so every lane forms the same
 * exp(l - max) and the same sum in k order, and lane k writes pick k, its weight and its segment entries
 * (instead of lane 0 writing all of them one by one). K <= 32. L2: read the logits through L2 (written
 * by other blocks of the same launch). */
template <bool L2>
__device__ __forceinline__ void cu_router_topk_warp(const float *lg, int t, int E, int K, int lane, int32_t *ids,
                                                    float *weights, const void *const *table, const void **seg_w,
                                                    int seg_cap, int32_t *seg_tok, int32_t *seg_out, int64_t seg_half) {
    float lv[RT_MAXE];
#pragma unroll
    for (int j = 0; j < RT_MAXE; j++) {
        const int e = lane + 32 * j;
        lv[j] = e < E ? (L2 ? __ldcg(lg + e) : lg[e]) : 0.0f;
    }
    int pi = -1;
    float pv = 0.0f, mx = 0.0f, sum = 0.0f, my_ex = 0.0f;
    int my_id = -1;
    for (int k = 0; k < K; k++) {
        int best = -1;
        float bv = -INFINITY;
#pragma unroll
        for (int j = 0; j < RT_MAXE; j++) {
            const int e = lane + 32 * j;
            if (e < E && cu_router_takes(e, lv[j], pi, pv, best, bv)) {
                best = e;
                bv = lv[j];
            }
        }
        cu_router_warp_best(best, bv);
        pi = best;
        pv = bv;
        if (k == 0) mx = bv;
        const float ex = expf(bv - mx);
        sum = __fadd_rn(sum, ex);
        if (lane == k) {
            my_id = best;
            my_ex = ex;
        }
    }
    if (lane < K) {
        const int64_t j = (int64_t)t * K + lane;
        ids[j] = my_id;
        weights[j] = my_ex / sum;
        if (table) cu_router_segment(table, my_id, j, t, seg_w, seg_cap, seg_tok, seg_out, seg_half);
    }
}

#endif
