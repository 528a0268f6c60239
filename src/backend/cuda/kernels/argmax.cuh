// Greedy token on the device: argmax of one logits row (bf16 or f32) per block, ties to the lower id.
// The host contract (decode::greedy_token) on the same values: the max is exact (a comparison),
// and among equal maxima the smallest index wins, whatever order threads meet them in.
#pragma once

#include <cstdint>

#include "backend/cuda/kernels/common.cuh"

namespace atlas::cuda::kern {

// 1024 threads: a decode step's one row of 102,400 bf16 is 12,800 16-byte vectors, ~13 rounds of
// four loads per thread at 256 threads (15.4 us per step on the H200, session 15), ~3 at 1024.
constexpr int kArgmaxThreads = 1024;

// (value, index) "better" relation: larger value, or equal value and smaller index.
__device__ __forceinline__ bool argmax_better(float v, int i, float bv, int bi) {
  return v > bv || (v == bv && i < bi);
}

template <class T>
__global__ void argmax_kernel(const T* __restrict__ logits, int32_t* __restrict__ out, int vocab, int64_t stride,
                              int* error_flag) {
  pdl_begin();
  const T* row = logits + int64_t(blockIdx.x) * stride;
  float best = -__int_as_float(0x7f800000);  // -inf
  int best_i = 0x7fffffff;
  bool nan = false;
  auto consider = [&](float v, int i) {
    if (v != v) nan = true;
    else if (argmax_better(v, i, best, best_i)) {
      best = v;
      best_i = i;
    }
  };
  // 16-byte loads where the row allows them, four in flight per thread: one element per load
  // kept a row of 102,400 bf16 at ~48 us (one block, 400 dependent-latency rounds per thread).
  // Which thread meets which element never changes the answer (the relation is a total order).
  constexpr int kVec = 16 / int(sizeof(T));
  const bool vec = (reinterpret_cast<uintptr_t>(row) & 15u) == 0 && vocab % kVec == 0;
  const int start = vec ? vocab : 0;
  if (vec) {
    const int nv = vocab / kVec;
    const uint4* rv = reinterpret_cast<const uint4*>(row);
    for (int c0 = threadIdx.x; c0 < nv; c0 += 4 * kArgmaxThreads) {
      uint4 u[4];
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const int c = c0 + j * kArgmaxThreads;
        if (c < nv) u[j] = __ldg(rv + c);
      }
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const int c = c0 + j * kArgmaxThreads;
        if (c >= nv) continue;
        const T* e = reinterpret_cast<const T*>(&u[j]);
#pragma unroll
        for (int q = 0; q < kVec; ++q) consider(to_f32(e[q]), c * kVec + q);
      }
    }
  }
  for (int i = start + threadIdx.x; i < vocab; i += kArgmaxThreads) consider(to_f32(row[i]), i);
  // A row of all -inf still needs an answer: index order decides among equal (-inf) values.
  __shared__ float sv[kArgmaxThreads / 32];
  __shared__ int si[kArgmaxThreads / 32];
  __shared__ int snan;
  if (threadIdx.x == 0) snan = 0;
  __syncthreads();
  if (nan) atomicOr(&snan, 1);
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) {
    const float ov = __shfl_xor_sync(0xffffffffu, best, off);
    const int oi = __shfl_xor_sync(0xffffffffu, best_i, off);
    if (argmax_better(ov, oi, best, best_i)) {
      best = ov;
      best_i = oi;
    }
  }
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  if (lane == 0) {
    sv[warp] = best;
    si[warp] = best_i;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int w = 1; w < kArgmaxThreads / 32; ++w)
      if (argmax_better(sv[w], si[w], best, best_i)) {
        best = sv[w];
        best_i = si[w];
      }
    // Every value -inf: best_i may still be the sentinel when vocab < threads; the smallest
    // index of a -inf value is then 0 (all are -inf).
    out[blockIdx.x] = best_i == 0x7fffffff ? 0 : best_i;
    if (snan) atomicOr(error_flag, 128);
  }
}

}  // namespace atlas::cuda::kern
