// The MLA split merge's pieces shared by mla_tc.cuh (the attention kernels and the merge kernel)
// and gemm_merge.cuh (the merge inside the value GEMM's launch): the workspace layout, the bf16
// output rounding and one (query, head) item of the merge.
#pragma once

#include "common.cuh"

namespace atlas::cuda::kern {

constexpr int kMlaAccStride = 512;     // workspace: acc floats per (query, split, head)
constexpr int kMlaMergeThreads = 128;  // merge blocks: 4 latent columns per thread

// mla_tc_merge_kernel's arguments (gemm_mma_merge_kernel's merge half, kernels/gemm_merge.cuh).
struct MlaMergeParams {
  const float* ws_acc;
  const float* ws_ml;
  const int32_t* lengths;
  int rows, heads, latent, max_length, S, max_splits;
  uint16_t* out;  // o_lat [rows, heads, latent]: also the value GEMM's x
};

// bf16 output with an exact zero written as +0 (a sum of zeros may come out as -0 depending
// on which zero products entered it; the contract makes the bits independent of that).
__device__ __forceinline__ uint16_t f2bf_out(float f) {
  const uint16_t b = f2bf(f);
  return b == 0x8000u ? uint16_t(0) : b;
}

// One (query, head) item of the merge, 4 latent columns from d per thread; len: the query's
// length (lengths[item / heads]). kOneRound: queries of at most 8 splits load everything at once.
template <bool kOneRound>
__device__ __forceinline__ void mla_merge_item(const float* __restrict__ ws_acc, const float* __restrict__ ws_ml,
                                               int len, int heads, int latent, int S, int max_splits,
                                               uint16_t* __restrict__ out, int64_t item, int d) {
  const int row = int(item / heads), h = int(item % heads);
  uint16_t* o_dst = out + (int64_t(row) * heads + h) * latent;
  if (len == 0) {  // a query that sees no key (padding): output 0, as the CPU backend
    for (int e = 0; e < 4; ++e)
      if (d + e < latent) o_dst[d + e] = 0;
    return;
  }
  const int n = (len + S - 1) / S;  // > 1: one split was written by the split kernel
  const float* ml = ws_ml + (int64_t(row) * max_splits * heads + h) * 2;
  const int64_t ml_step = int64_t(heads) * 2;
  const float* acc = ws_acc + (int64_t(row) * max_splits * heads + h) * kMlaAccStride + d;
  const int64_t acc_step = int64_t(heads) * kMlaAccStride;
  float M = -INFINITY;
  float L = 0.0f, o0 = 0.0f, o1 = 0.0f, o2 = 0.0f, o3 = 0.0f;
  float4 v[8];
  float mm[8], ll[8];
  // Splits s0 .. s0 + 7: the loads first (independent of the chain), then the fixed ascending
  // fmaf chain.
  const auto load = [&](int s0) {
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      if (s0 + i < n) {
        mm[i] = ml[(s0 + i) * ml_step];
        ll[i] = ml[(s0 + i) * ml_step + 1];
        if (d < latent) v[i] = *reinterpret_cast<const float4*>(acc + (s0 + i) * acc_step);
      }
    }
  };
  const auto chain = [&](int s0) {
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      if (s0 + i < n) {
        const float f = expf(mm[i] - M);
        L = __fmaf_rn(ll[i], f, L);
        o0 = __fmaf_rn(v[i].x, f, o0);
        o1 = __fmaf_rn(v[i].y, f, o1);
        o2 = __fmaf_rn(v[i].z, f, o2);
        o3 = __fmaf_rn(v[i].w, f, o3);
      }
    }
  };
  if (kOneRound && n <= 8) {
    // Up to 8 splits (a decode step's queries up to 2,048 slots): every load in one round, the
    // maximum from the same values in the same order (fmaxf from -inf, splits ascending), then
    // the chain. The other form takes two rounds (the maxima, then the partials).
    load(0);
#pragma unroll
    for (int i = 0; i < 8; ++i)
      if (i < n) M = fmaxf(M, mm[i]);
    if (d >= latent) return;
    chain(0);
  } else {
    for (int s = 0; s < n; ++s) M = fmaxf(M, ml[s * ml_step]);
    if (d >= latent) return;
    for (int s0 = 0; s0 < n; s0 += 8) {
      load(s0);
      chain(s0);
    }
  }
  const float r[4] = {o0, o1, o2, o3};
#pragma unroll
  for (int e = 0; e < 4; ++e)
    if (d + e < latent) o_dst[d + e] = f2bf_out(r[e] / L);
}

// The merge of V groups of 4 latent columns from d (one query qi, head h, n > 1 splits) inside
// the cluster attention kernel (mla_tc.cuh, MlaTcParams::merge_cnt): mla_merge_item's arithmetic
// (M = fmaxf over the splits ascending from -inf, then the fmaf chains of l f and acc f in split
// order, out = bf16(o / L)), so the same bits. The partials are the other blocks' stores of the
// same launch: read through L2 (ld.cg), every load of a round of 8 splits issued before the chain.
template <int V>
__device__ __forceinline__ void mla_merge_cols(const float* __restrict__ ws_acc, const float* __restrict__ ws_ml,
                                               int n, int heads, int latent, int max_splits,
                                               uint16_t* __restrict__ out, int qi, int h, int d) {
  const float* ml = ws_ml + (int64_t(qi) * max_splits * heads + h) * 2;
  const int64_t ml_step = int64_t(heads) * 2;
  const float* acc = ws_acc + (int64_t(qi) * max_splits * heads + h) * kMlaAccStride + d;
  const int64_t acc_step = int64_t(heads) * kMlaAccStride;
  float M = -INFINITY, L = 0.0f;
  float o[V][4];
#pragma unroll
  for (int g = 0; g < V; ++g)
#pragma unroll
    for (int e = 0; e < 4; ++e) o[g][e] = 0.0f;
  if (n > 8)  // (else from the one round's loads below)
    for (int s = 0; s < n; ++s) M = fmaxf(M, __ldcg(ml + s * ml_step));
  for (int s0 = 0; s0 < n; s0 += 8) {
    float4 v[8][V];
    float mm[8], ll[8];
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      if (s0 + i < n) {
        mm[i] = __ldcg(ml + (s0 + i) * ml_step);
        ll[i] = __ldcg(ml + (s0 + i) * ml_step + 1);
#pragma unroll
        for (int g = 0; g < V; ++g)
          if (d + 4 * g < latent) v[i][g] = __ldcg(reinterpret_cast<const float4*>(acc + (s0 + i) * acc_step + 4 * g));
      }
    }
    if (n <= 8)
#pragma unroll
      for (int i = 0; i < 8; ++i)
        if (i < n) M = fmaxf(M, mm[i]);
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      if (s0 + i < n) {
        const float f = expf(mm[i] - M);
        L = __fmaf_rn(ll[i], f, L);
#pragma unroll
        for (int g = 0; g < V; ++g) {
          if (d + 4 * g >= latent) continue;
          o[g][0] = __fmaf_rn(v[i][g].x, f, o[g][0]);
          o[g][1] = __fmaf_rn(v[i][g].y, f, o[g][1]);
          o[g][2] = __fmaf_rn(v[i][g].z, f, o[g][2]);
          o[g][3] = __fmaf_rn(v[i][g].w, f, o[g][3]);
        }
      }
    }
  }
  uint16_t* o_dst = out + (int64_t(qi) * heads + h) * latent + d;
#pragma unroll
  for (int g = 0; g < V; ++g)
#pragma unroll
    for (int e = 0; e < 4; ++e)
      if (d + 4 * g + e < latent) o_dst[4 * g + e] = f2bf_out(o[g][e] / L);
}

// Zeros for a query of length 0 (it sees no key), latent columns [c0, c0 + 128) of every head,
// by a block of 256 threads (the cluster kernel's merge form; the merge kernel writes them
// otherwise).
__device__ __forceinline__ void mla_zero_cols(uint16_t* __restrict__ out, int heads, int latent, int c0, int tid) {
  for (int i = tid; i < heads * 128; i += 256) {
    const int h = i >> 7, d = c0 + (i & 127);
    if (d < latent) out[int64_t(h) * latent + d] = 0;
  }
}

}  // namespace atlas::cuda::kern
