// The device code of routing that is not a kernel (session 33: split out of router.cuh and
// moe.cuh so that the router GEMM's tail, kernels/gemm_tail.cuh in gemm.cu, can run it without
// those headers' kernels being defined twice): route_token (router_kernel's per-token route),
// permute_one_warp and route_permute_one_token (route_permute_kernel's one-token path).
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

// The one-chunk permutation of at most 32 pairs by one warp, without block barriers (a batch-1
// decode step: 6 pairs). Pair p (lane p) goes to offsets[e] plus the number of earlier pairs of
// its expert, which is where one scatter round of one warp puts it (its rank among the
// same-expert lanes); the counts are the histogram, the offsets its exclusive scan in expert
// order. Integer results identical to permute_one_chunk's (tested); out-of-range ids flagged
// (error bit 2) and not placed, as there. Every lane of the warp must call it.
__device__ __forceinline__ void permute_one_warp(const int32_t* __restrict__ ids, int n, int k, int E,
                                                 int32_t* __restrict__ counts, int32_t* __restrict__ offsets,
                                                 int32_t* __restrict__ sorted_token, int32_t* __restrict__ pair_slot,
                                                 int* error_flag) {
  const unsigned full = 0xffffffffu;
  const int lane = threadIdx.x & 31;
  int e = lane < n ? ids[lane] : -1;
  if (lane < n && (e < 0 || e >= E)) {
    atomicOr(error_flag, 2);
    e = -1;
  }
  const unsigned same = __match_any_sync(full, e);
  const int rank = __popc(same & ((1u << lane) - 1u));
  int carry = 0, my_offset = 0;
  for (int x0 = 0; x0 <= E; x0 += 32) {  // experts x0 + lane; offsets has E + 1 entries
    const int x = x0 + lane;
    int c = 0;
    for (int q = 0; q < n; ++q) c += __shfl_sync(full, e, q) == x ? 1 : 0;
    int incl = c;
#pragma unroll
    for (int d = 1; d < 32; d *= 2) {
      const int v = __shfl_up_sync(full, incl, d);
      if (lane >= d) incl += v;
    }
    const int excl = carry + incl - c;
    if (x < E) counts[x] = c;
    if (x <= E) offsets[x] = excl;
    const bool here = e >= x0 && e < x0 + 32;
    const int o = __shfl_sync(full, excl, here ? e - x0 : lane);
    if (here) my_offset = o;
    carry += __shfl_sync(full, incl, 31);
  }
  if (e >= 0) {
    const int pos = my_offset + rank;
    sorted_token[pos] = lane / k;
    pair_slot[lane] = pos;
  }
}

// route_permute_kernel's parameters (moe.cuh; RouteTail in gemm_tail.cuh takes the same).
struct RoutePermuteParams {
  const float* logits;
  int32_t* ids;
  float* weights;
  float* scores;
  int tokens, E, k, grouped, n_group, topk_group, norm_topk_prob;
  float scaling;
  int32_t *counts, *offsets, *sorted_token, *pair_slot;
  int* error_flag;
  int release_first = 0;  // the next launch released before the wait (kernels/pdl.cuh)
};

// The most experts route_permute_one_token takes: two per lane of its warp.
constexpr int kRouteOneTokenMaxExperts = 64;

// One token, greedy, E <= 64 experts (two per lane), k <= E: the route and its permutation by
// one warp with nothing between them but registers and this warp's shared scratch (a batch-1
// decode step; the general path below took ~6 us at one token on the H200, Nsight session 15:
// 6 rounds of a shuffle arg-max, a block barrier, the ids read back from memory). The same
// results bit for bit:
//  - max, exp and the ascending-order softmax sum are route_token's expressions (every lane sums
//    the same 64 values in the same order, so every lane holds lane 0's sum);
//  - selection by rank: the k picks of route_token's repeated arg-max (higher score, ties to the
//    lower id) are the candidates beaten by fewer than k others under that same strict order,
//    and pick j is the one beaten by exactly j. That needs a total order: a NaN score (a NaN or
//    +inf logit) sends the warp back to route_token itself (`return false`, nothing written);
//  - the weights' normalisation sums the picks in pick order, as lane 0 does there;
//  - the permutation of one token's k distinct experts: counts[x] = 1 if x was picked,
//    offsets[x] = the picks below x, pair j at offsets[its expert] (permute_one_warp's result for
//    distinct experts: rank 0 among its expert's pairs).
// p, w: this warp's scratch ([E] and [k] floats).
__device__ __forceinline__ bool route_permute_one_token(const RoutePermuteParams& q, float* p, float* w, int lane) {
  const unsigned full = 0xffffffffu;
  const int E = q.E, k = q.k;
  const bool in0 = lane < E, in1 = lane + 32 < E;
  // (__ldcg: in gemm_splitk_tail_kernel's RouteTail other blocks wrote them)
  const float l0 = in0 ? __ldcg(q.logits + lane) : 0.0f, l1 = in1 ? __ldcg(q.logits + lane + 32) : 0.0f;
  // route_token: m = l[0], then fmaxf over this lane's experts in order, then the warp max.
  float m = __shfl_sync(full, l0, 0);
  if (in0) m = fmaxf(m, l0);
  if (in1) m = fmaxf(m, l1);
  m = warp_max(m);
  if (in0) p[lane] = expf(l0 - m);
  if (in1) p[lane + 32] = expf(l1 - m);
  __syncwarp();
  float sum = 0.0f;
  for (int e = 0; e < E; ++e) sum += p[e];
  const float v0 = in0 ? p[lane] / sum : 0.0f, v1 = in1 ? p[lane + 32] / sum : 0.0f;
  if (__any_sync(full, (in0 && isnan(v0)) || (in1 && isnan(v1)))) return false;
  __syncwarp();  // every lane's reads of p[] are done
  if (in0) p[lane] = v0;
  if (in1) p[lane + 32] = v1;
  if (q.scores) {
    if (in0) q.scores[lane] = v0;
    if (in1) q.scores[lane + 32] = v1;
  }
  __syncwarp();
  // Rank of expert e with score v: the experts e2 with p[e2] > v, or == v and e2 < e.
  int r0 = 0, r1 = 0;
  for (int e2 = 0; e2 < E; ++e2) {
    const float u = p[e2];
    r0 += (u > v0 || (u == v0 && e2 < lane)) ? 1 : 0;
    r1 += (u > v1 || (u == v1 && e2 < lane + 32)) ? 1 : 0;
  }
  const bool s0 = in0 && r0 < k, s1 = in1 && r1 < k;
  if (s0) {
    q.ids[r0] = lane;
    w[r0] = v0;
  }
  if (s1) {
    q.ids[r1] = lane + 32;
    w[r1] = v1;
  }
  __syncwarp();
  // The weights, as route_token's lane 0 computes them, pick j by lane j.
  if (q.norm_topk_prob && k > 1) {
    float s = 0.0f;
    for (int j = 0; j < k; ++j) s += w[j];
    s += 1e-20f;
    if (lane < k) q.weights[lane] = w[lane] / s;
  } else if (lane < k) {
    q.weights[lane] = w[lane] * q.scaling;
  }
  // The permutation: expert x = lane (+ 32) picked or not; offsets = picks below x.
  const unsigned b0 = __ballot_sync(full, s0), b1 = __ballot_sync(full, s1);
  const unsigned below = (1u << lane) - 1u;
  const int o0 = __popc(b0 & below), o1 = __popc(b0) + __popc(b1 & below);
  if (in0) {
    q.counts[lane] = s0 ? 1 : 0;
    q.offsets[lane] = o0;
  }
  if (in1) {
    q.counts[lane + 32] = s1 ? 1 : 0;
    q.offsets[lane + 32] = o1;
  }
  if (lane == 0) q.offsets[E] = k;
  if (s0) {
    q.sorted_token[o0] = 0;
    q.pair_slot[r0] = o0;
  }
  if (s1) {
    q.sorted_token[o1] = 0;
    q.pair_slot[r1] = o1;
  }
  return true;
}

}  // namespace atlas::cuda::kern
