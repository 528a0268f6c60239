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

}  // namespace atlas::cuda::kern
