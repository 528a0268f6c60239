// Router: fp32 softmax, top-k (greedy or group-limited greedy), weights. One warp per token.
// The arithmetic is reference.cpp's sequential loop exactly: the max and every selection are
// exact comparisons (any order gives the same answer), the softmax sum is added in ascending
// expert order by one lane, the normalisation sum in k order by one lane. Selection is repeated
// arg-max: the highest score wins, ties go to the lower expert (or group) id, so the output is
// sorted by weight descending. (The first version ran one thread per token with its arrays in
// local memory: 29-37 us per call on the H200 even for one token.)
// The router GEMM's launch can route one token itself (gemm_tail.cuh RouteTail, session 33).
#pragma once

#include "route_core.cuh"

namespace atlas::cuda::kern {

__global__ void __launch_bounds__(32 * kRouterWarps)
router_kernel(const float* __restrict__ logits, int32_t* __restrict__ ids, float* __restrict__ weights,
              float* __restrict__ scores_out, int tokens, int E, int k, int grouped, int n_group,
              int topk_group, int norm_topk_prob, float scaling) {
  pdl_begin();
  __shared__ float sp[kRouterWarps][kRouterMaxExperts];    // probabilities
  __shared__ float scand[kRouterWarps][kRouterMaxExperts];  // candidate scores
  __shared__ float sw[kRouterWarps][kRouterMaxK];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int t = blockIdx.x * kRouterWarps + warp;
  if (t >= tokens) return;  // a whole warp; only warp-level synchronisation below
  route_token(logits, ids, weights, scores_out, t, E, k, grouped, n_group, topk_group, norm_topk_prob, scaling,
              sp[warp], scand[warp], sw[warp], lane);
}

}  // namespace atlas::cuda::kern
