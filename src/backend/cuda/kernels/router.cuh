// Router: fp32 softmax, top-k (greedy or group-limited greedy), weights. One warp per token.
// The arithmetic is reference.cpp's sequential loop exactly: the max and every selection are
// exact comparisons (any order gives the same answer), the softmax sum is added in ascending
// expert order by one lane, the normalisation sum in k order by one lane. Selection is repeated
// arg-max: the highest score wins, ties go to the lower expert (or group) id, so the output is
// sorted by weight descending. (The first version ran one thread per token with its arrays in
// local memory: 29-37 us per call on the H200 even for one token.)
// Planned: fuse into the epilogue of the router GEMM.
#pragma once

#include "common.cuh"

namespace atlas::cuda::kern {

constexpr int kRouterMaxExperts = 256;
constexpr int kRouterMaxK = 16;
constexpr int kRouterMaxGroups = 64;

constexpr int kRouterWarps = 4;  // tokens per block

// The better of two candidates (v, i): higher value, ties to the lower index. Unused = (-1, big):
// scores are probabilities (>= 0), so -1 loses to every real candidate.
__device__ __forceinline__ void router_better(float& v, int& i, float v2, int i2) {
  if (v2 > v || (v2 == v && i2 < i)) {
    v = v2;
    i = i2;
  }
}

__device__ __forceinline__ void router_warp_argmax(float& v, int& i) {
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) {
    const float v2 = __shfl_xor_sync(0xffffffffu, v, off);
    const int i2 = __shfl_xor_sync(0xffffffffu, i, off);
    router_better(v, i, v2, i2);
  }
}

// Token t by one warp (lane = its lane); p, cand: [E] and w: [k] shared scratch of this warp.
// Warp-level synchronisation only.
__device__ __forceinline__ void route_token(const float* __restrict__ logits, int32_t* __restrict__ ids,
                                            float* __restrict__ weights, float* __restrict__ scores_out, int t,
                                            int E, int k, int grouped, int n_group, int topk_group,
                                            int norm_topk_prob, float scaling, float* p, float* cand, float* w,
                                            int lane) {
  const float* l = logits + int64_t(t) * E;

  float m = l[0];
  for (int e = lane; e < E; e += 32) m = fmaxf(m, l[e]);
  m = warp_max(m);
  for (int e = lane; e < E; e += 32) p[e] = expf(l[e] - m);
  __syncwarp();
  float sum = 0.0f;
  if (lane == 0)
    for (int e = 0; e < E; ++e) sum += p[e];
  sum = __shfl_sync(0xffffffffu, sum, 0);
  for (int e = lane; e < E; e += 32) {
    const float v = p[e] / sum;
    p[e] = v;
    cand[e] = v;
    if (scores_out) scores_out[int64_t(t) * E + e] = v;
  }
  __syncwarp();

  // Candidate scores: all of them (greedy) or those of the kept groups, the others 0.0.
  if (grouped) {
    const int gs = E / n_group;
    float gv[2];
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      const int g = lane + 32 * j;
      gv[j] = -1.0f;
      if (g < n_group) {
        float v = p[g * gs];
        for (int i = 1; i < gs; ++i) v = fmaxf(v, p[g * gs + i]);
        gv[j] = v;
      }
    }
    unsigned long long keep = 0;  // bit g: group g kept (the same in every lane)
    for (int r = 0; r < topk_group; ++r) {
      float bv = -1.0f;
      int bi = 1 << 30;
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        const int g = lane + 32 * j;
        if (g < n_group && !((keep >> g) & 1ull)) router_better(bv, bi, gv[j], g);
      }
      router_warp_argmax(bv, bi);
      keep |= 1ull << bi;
    }
    for (int e = lane; e < E; e += 32)
      if (!((keep >> (e / gs)) & 1ull)) cand[e] = 0.0f;
    __syncwarp();
  }
  unsigned taken = 0;  // bit j: expert lane + 32 j taken (this lane's experts only)
  for (int j = 0; j < k; ++j) {
    float bv = -1.0f;
    int bi = 1 << 30;
    for (int e = lane, q = 0; e < E; e += 32, ++q)
      if (!((taken >> q) & 1u)) router_better(bv, bi, cand[e], e);
    router_warp_argmax(bv, bi);
    if ((bi & 31) == lane) taken |= 1u << (bi >> 5);
    if (lane == 0) {
      ids[int64_t(t) * k + j] = bi;
      w[j] = bv;
    }
  }
  if (lane == 0) {
    if (norm_topk_prob && k > 1) {
      float s = 0.0f;
      for (int j = 0; j < k; ++j) s += w[j];
      s += 1e-20f;
      for (int j = 0; j < k; ++j) w[j] = w[j] / s;
    } else {
      for (int j = 0; j < k; ++j) w[j] = w[j] * scaling;
    }
    for (int j = 0; j < k; ++j) weights[int64_t(t) * k + j] = w[j];
  }
}

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
