// Tails of the split-K kernel (kernels/gemm_mma.cuh, splitk_body): the op that follows a GEMM at a
// batch-1 decode step, run by the GEMM launch's last block on the finished output instead of by
// a launch of its own (session 23; gemm_add_rmsnorm in gemm.cu, ATLAS_GEMM_TAILS). Why: at one
// row that op moves a few KB, and its own launch costs a boundary (the wait for the GEMM's end,
// the release of the next kernel) of ~2.3 us per layer (CUPTI, sessions 22-23).
// The tail runs the op's own arithmetic in its own order, so the bits are those of the two
// launches (tests/cuda/test_cuda_gemm.cpp, Gemm.AddRmsNormTail*).
#pragma once

#include "gemm_cluster.cuh"
#include "gemm_mma.cuh"
#include "route_core.cuh"
#include "rmsnorm.cuh"

namespace atlas::cuda::kern {

// o_proj's tail: x = bf16(x + y) (the residual stream, one row; y = the GEMM's bf16 output) and
// out = rmsnorm(x) * w: rmsnorm_row's arithmetic on kReduceThreads threads, the bits of
// add_rmsnorm's kernels (the wide one gives the same bits by construction, kernels/rmsnorm.cuh).
// The GEMM's output is read through L2 (__ldcg): the other blocks wrote it.
struct AddRmsNormTail {
  uint16_t* x = nullptr;
  const uint16_t* w = nullptr;
  uint16_t* out = nullptr;
  int dim = 0;
  float eps = 0.0f;
  int* counter = nullptr;  // zero between launches (splitk_body resets it)
  __device__ void operator()(const MmaGemmParams& p) const {
    __shared__ float scratch[16];
    const uint16_t* y = static_cast<const uint16_t*>(p.out);
    rmsnorm_row<uint16_t, true>(rms_preload<uint16_t>(x, w, dim), x,
                                [y](int, int i) { return bf2f(__ldcg(reinterpret_cast<const unsigned short*>(y) + i)); },
                                w, out, dim, eps, scratch);
  }
};

// The router's tail (session 33; gemm_moe_route in gemm.cu, ATLAS_ROUTE_TAIL): one token's
// route and permutation from the finished fp32 logits (the GEMM's output), as route_permute_kernel's
// one-token path runs them: warp 0 alone, route_permute_one_token, or, on a NaN score,
// route_token and permute_one_warp (the host sends only what that path takes: one token,
// greedy, E <= 64). The logits are read through L2 (route_permute_one_token's __ldcg loads):
// the other blocks wrote them.
struct RouteTail {
  RoutePermuteParams q{};
  int* counter = nullptr;  // zero between launches (splitk_body resets it)
  __device__ void operator()(const MmaGemmParams&) const {
    __shared__ float sp[kRouterMaxExperts], scand[kRouterMaxExperts], sw[kRouterMaxK];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    if (warp != 0 || route_permute_one_token(q, sp, sw, lane)) return;
    route_token(q.logits, q.ids, q.weights, q.scores, 0, q.E, q.k, q.grouped, q.n_group, q.topk_group,
                q.norm_topk_prob, q.scaling, sp, scand, sw, lane);
    __syncwarp();  // the ids lane 0 wrote, visible to the warp
    permute_one_warp(q.ids, q.k, q.k, q.E, q.counts, q.offsets, q.sorted_token, q.pair_slot, q.error_flag);
  }
};

// The router GEMM of one row on the cluster config (c16x64/4w: one 64-column tile, one block per
// K slice; session 41, ATLAS_ROUTE_CLUSTER, gemm_moe_route in gemm.cu): the adding block (block
// 0 at one row) holds every logit after the cluster's slice sums and routes the token itself
// (RouteTail), so the routing costs no launch, no grid-wide counter and no fence; the
// kernel releases the next launch after its own wait (gemm_cluster_body). fp32 out (the
// logits), the same bits as the router GEMM then route_permute_kernel.
template <class T>
__global__ void __launch_bounds__(T::THREADS) gemm_cluster_route_kernel(const MmaGemmParams p, const RouteTail tail) {
  gemm_cluster_body<T, true, false, RouteTail>(p, tail);
}

// The staged split-K kernel (bf16 or, kOutF32, fp32 out; at most 8 rows, 16-byte copies) with a
// tail: dense problems only (every block has a tile, so every block counts itself).
template <class T, class Tail, bool kOutF32 = false>
__global__ void __launch_bounds__(T::THREADS) gemm_splitk_tail_kernel(const MmaGemmParams p, const Tail tail) {
  static_assert(T::THREADS == kReduceThreads, "the tails' norms run rmsnorm_row's kReduceThreads order");
  splitk_body<T, kOutF32, true, true, true, Tail>(p, tail);
}

}  // namespace atlas::cuda::kern
