// Router: fp32 softmax, top-k (greedy or group-limited greedy), weights. One thread per token;
// 64 experts is tiny work, and a single thread's sequential loops give the order in
// reference.cpp exactly. Selection is repeated arg-max: the highest score wins, ties go to the
// lower expert (or group) id, so the output is sorted by weight descending.
// Planned fast path: one warp per token (2 experts per lane, warp arg-max via shuffles with the
// same tie rule), fused into the epilogue of the router GEMM.
#pragma once

#include "common.cuh"

namespace atlas::cuda::kern {

constexpr int kRouterMaxExperts = 256;
constexpr int kRouterMaxK = 16;
constexpr int kRouterMaxGroups = 64;

__global__ void router_kernel(const float* __restrict__ logits, int32_t* __restrict__ ids,
                              float* __restrict__ weights, float* __restrict__ scores_out,
                              int tokens, int E, int k, int grouped, int n_group, int topk_group,
                              int norm_topk_prob, float scaling) {
  const int t = blockIdx.x * blockDim.x + threadIdx.x;
  if (t >= tokens) return;
  const float* l = logits + int64_t(t) * E;
  float p[kRouterMaxExperts];
  float m = l[0];
  for (int e = 1; e < E; ++e) m = fmaxf(m, l[e]);
  float sum = 0.0f;
  for (int e = 0; e < E; ++e) {
    p[e] = expf(l[e] - m);
    sum += p[e];
  }
  for (int e = 0; e < E; ++e) p[e] = p[e] / sum;
  if (scores_out)
    for (int e = 0; e < E; ++e) scores_out[int64_t(t) * E + e] = p[e];

  // Candidate scores: all of them (greedy) or those of the kept groups, the others 0.0.
  float cand[kRouterMaxExperts];
  for (int e = 0; e < E; ++e) cand[e] = p[e];
  if (grouped) {
    const int gs = E / n_group;
    float gscore[kRouterMaxGroups];
    bool keep[kRouterMaxGroups];
    for (int g = 0; g < n_group; ++g) {
      float v = p[g * gs];
      for (int i = 1; i < gs; ++i) v = fmaxf(v, p[g * gs + i]);
      gscore[g] = v;
      keep[g] = false;
    }
    for (int r = 0; r < topk_group; ++r) {
      int best = -1;
      for (int g = 0; g < n_group; ++g)
        if (!keep[g] && (best < 0 || gscore[g] > gscore[best])) best = g;
      keep[best] = true;
    }
    for (int e = 0; e < E; ++e)
      if (!keep[e / gs]) cand[e] = 0.0f;
  }
  bool taken[kRouterMaxExperts];
  for (int e = 0; e < E; ++e) taken[e] = false;
  float w[kRouterMaxK];
  for (int j = 0; j < k; ++j) {
    int best = -1;
    for (int e = 0; e < E; ++e)
      if (!taken[e] && (best < 0 || cand[e] > cand[best])) best = e;
    taken[best] = true;
    ids[int64_t(t) * k + j] = best;
    w[j] = cand[best];
  }
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

}  // namespace atlas::cuda::kern
