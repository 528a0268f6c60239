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

// What run_outputs_kernel (kernels/decode_run.cuh) writes for a run of one row (err is the whole
// step's flag), from the argmax's answering block (ATLAS_RUN_FUSED): called by the thread that
// wrote the token, after the argmax's own error bits. prev null: nothing to write.
struct RunOut {
  const int32_t* state;
  int32_t *prev, *out, *err;
  int ring;
};
__device__ __forceinline__ void run_out_write(const RunOut& ro, int32_t tok, const int* error_flag) {
  if (ro.prev == nullptr) return;
  const int slot = (ro.state[0] - 1) % ro.ring;
  ro.prev[0] = tok;
  ro.out[slot] = tok;
  ro.err[slot] = *reinterpret_cast<const volatile int*>(error_flag);
}

// (value, index) "better" relation: larger value, or equal value and smaller index.
__device__ __forceinline__ bool argmax_better(float v, int i, float bv, int bi) {
  return v > bv || (v == bv && i < bi);
}

// The block's best (value, index) into thread 0's best / best_i: a butterfly inside each warp,
// then thread 0 over the warps in order (sv / si: kThreads / 32 shared slots each). The relation
// is a total order, so the order of the comparisons never changes the answer.
template <int kThreads>
__device__ __forceinline__ void argmax_block_best(float& best, int& best_i, float* sv, int* si) {
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
  if (threadIdx.x == 0)
    for (int w = 1; w < kThreads / 32; ++w)
      if (argmax_better(sv[w], si[w], best, best_i)) {
        best = sv[w];
        best_i = si[w];
      }
}

template <class T>
__global__ void argmax_kernel(const T* __restrict__ logits, int32_t* __restrict__ out, int vocab, int64_t stride,
                              int* error_flag, RunOut run) {
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
  argmax_block_best<kArgmaxThreads>(best, best_i, sv, si);  // (its barrier orders snan)
  if (threadIdx.x == 0) {
    // Every value -inf: best_i may still be the sentinel when vocab < threads; the smallest
    // index of a -inf value is then 0 (all are -inf).
    const int32_t tok = best_i == 0x7fffffff ? 0 : best_i;
    out[blockIdx.x] = tok;
    if (snan) atomicOr(error_flag, 128);
    run_out_write(run, tok, error_flag);  // (one row: this is the step's last write)
  }
}

// ---- the same argmax spread over blocks (a decode step's row over ~25 blocks, not one) -------
// One block of kArgmaxThreads needs ~3 dependent rounds of loads for a 102,400-entry row and ends
// ~9 us after the LM head (session 25); here each block of a row takes kArgmaxSplitElems entries
// (one round of loads), writes its (value, index) to the workspace, and the row's last block to
// count itself (a device counter per row, reset by that block) picks the best of them. The
// relation is a total order (argmax_better), so the answer is the single-block kernel's.
constexpr int kArgmaxSplitThreads = 256;
constexpr int kArgmaxSplitElems = 4096;  // a multiple of 8: every block's range starts on a 16-byte vector

// Grid (ceil(vocab / kArgmaxSplitElems), rows). counters: [rows], zero between launches;
// partials: [rows][gridDim.x][2] ints (each block's value bits and index).
template <class T>
__global__ void __launch_bounds__(kArgmaxSplitThreads)
    argmax_split_kernel(const T* __restrict__ logits, int32_t* __restrict__ out, int vocab, int64_t stride,
                        int32_t* counters, int32_t* partials, int* error_flag, RunOut run) {
  pdl_begin();
  const int r = blockIdx.y, nb = gridDim.x;
  const T* row = logits + int64_t(r) * stride;
  const int lo = blockIdx.x * kArgmaxSplitElems, hi = min(vocab, lo + kArgmaxSplitElems);
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
  constexpr int kVec = 16 / int(sizeof(T));
  constexpr int kPer = kArgmaxSplitElems / kVec / kArgmaxSplitThreads;  // vectors per thread
  static_assert(kArgmaxSplitElems % (kVec * kArgmaxSplitThreads) == 0, "whole vectors per thread");
  if ((reinterpret_cast<uintptr_t>(row) & 15u) == 0 && vocab % kVec == 0) {
    // lo and hi are multiples of kVec here; every load is issued before the first comparison.
    const uint4* rv = reinterpret_cast<const uint4*>(row);
    const int v0 = lo / kVec, v1 = hi / kVec;
    uint4 u[kPer];
#pragma unroll
    for (int j = 0; j < kPer; ++j) {
      const int c = v0 + int(threadIdx.x) + j * kArgmaxSplitThreads;
      if (c < v1) u[j] = __ldg(rv + c);
    }
#pragma unroll
    for (int j = 0; j < kPer; ++j) {
      const int c = v0 + int(threadIdx.x) + j * kArgmaxSplitThreads;
      if (c >= v1) continue;
      const T* e = reinterpret_cast<const T*>(&u[j]);
#pragma unroll
      for (int q = 0; q < kVec; ++q) consider(to_f32(e[q]), c * kVec + q);
    }
  } else {
    for (int i = lo + int(threadIdx.x); i < hi; i += kArgmaxSplitThreads) consider(to_f32(row[i]), i);
  }
  __shared__ float sv[kArgmaxSplitThreads / 32];
  __shared__ int si[kArgmaxSplitThreads / 32];
  __shared__ int snan, last;
  if (threadIdx.x == 0) snan = 0;
  __syncthreads();
  if (nan) atomicOr(&snan, 1);
  argmax_block_best<kArgmaxSplitThreads>(best, best_i, sv, si);  // (its barrier orders snan)
  int32_t* part = partials + (int64_t(r) * nb + blockIdx.x) * 2;
  if (threadIdx.x == 0) {
    if (snan) atomicOr(error_flag, 128);
    part[0] = __float_as_int(best);
    part[1] = best_i;
    __threadfence();  // the partial is visible before the count says so
    last = atomicAdd(counters + r, 1) == nb - 1;
  }
  __syncthreads();
  if (!last) return;
  __threadfence();
  best = -__int_as_float(0x7f800000);
  best_i = 0x7fffffff;
  const int32_t* parts = partials + int64_t(r) * nb * 2;
  for (int j = int(threadIdx.x); j < nb; j += kArgmaxSplitThreads) {
    const float v = __int_as_float(__ldcg(parts + 2 * j));  // through L2: other blocks wrote them
    const int i = __ldcg(parts + 2 * j + 1);
    if (argmax_better(v, i, best, best_i)) {
      best = v;
      best_i = i;
    }
  }
  __syncthreads();  // sv / si are reused
  argmax_block_best<kArgmaxSplitThreads>(best, best_i, sv, si);
  if (threadIdx.x == 0) {
    // Every value -inf (or NaN): see argmax_kernel.
    const int32_t tok = best_i == 0x7fffffff ? 0 : best_i;
    out[r] = tok;
    counters[r] = 0;  // the next launch counts from zero
    // (One row: every block's NaN bit was raised before its count, so the flag read here is the
    // step's.)
    run_out_write(run, tok, error_flag);
  }
}

}  // namespace atlas::cuda::kern
