// RMSNorm exactly as the official code rounds (spec section 5):
//   v = mean(fp32(x)^2); y = fp32(x) * (1 / sqrt(v + eps)); out = bf16(w * bf16(y)).
// T = float (the f32 checking mode): the same with no bf16 rounding, out = w * y.
// One block of kReduceThreads threads per row. Thread i sums x[i]^2, x[i+256]^2, ... in order,
// then block_sum() fixes the rest of the order; nothing depends on the number of rows.
// 1/sqrtf(.) (both IEEE-rounded without fast math) rather than rsqrtf, whose approximation the
// host could not reproduce.
// The first kRmsRegs elements of each thread are loaded into registers before the sum (all
// loads in flight at once; a row of 2048 is 8 per thread): the loop that summed straight from
// memory issued one dependent load after another, 6.6 us per 2048-wide row at batch 1. The
// order of the additions is the same, so the bits are.
// kAdd (the fused residual add, add_rmsnorm): x = bf16(x + y) is written back first and the
// norm is taken of the rounded sum: the bits of add() followed by rmsnorm().
#pragma once

#include "common.cuh"

namespace atlas::cuda::kern {

constexpr int kRmsRegs = 8;

// The row's values a thread's register slots hold before the norm: x[i] and w[i] for
// i = tid + j * kReduceThreads, j < kRmsRegs (0 past dim). Neither depends on anything the
// norm computes, so a fused kernel loads them first (rms_preload), with its own loads, and
// their memory latency overlaps the rest instead of following it.
struct RmsPre {
  float x[kRmsRegs], w[kRmsRegs];
};
template <class T>
__device__ __forceinline__ RmsPre rms_preload(const T* xr, const T* __restrict__ w, int dim) {
  RmsPre pre;
#pragma unroll
  for (int j = 0; j < kRmsRegs; ++j) {
    const int i = threadIdx.x + j * kReduceThreads;
    pre.x[j] = i < dim ? to_f32(xr[i]) : 0.0f;
    pre.w[j] = i < dim ? to_f32(w[i]) : 0.0f;
  }
  return pre;
}

// One row by one block of kReduceThreads threads (the kernel below, and the fused kernels of
// kernels/latent_cache.cuh and moe.cuh, which must give the same bits), from the row's
// preloaded slots `pre` (rms_preload of the same xr and w). kAdd: x[i] = bf16(x[i] +
// y_at(j, i)) first: y_at(j, i) is the addend's element i as a float, j = i's register slot
// (i = tid + j * kReduceThreads, a constant once unrolled, so a caller may hand back values it
// loaded beforehand) or -1 past the register slots (rows wider than kRmsRegs * 256).
// `scratch`: >= 16 floats.
template <class T, bool kAdd, class YAt>
__device__ __forceinline__ void rmsnorm_row(const RmsPre& pre, T* xr, YAt y_at, const T* __restrict__ w, T* orow,
                                            int dim, float eps, float* scratch) {
  const int tid = threadIdx.x;
  float v[kRmsRegs];
#pragma unroll
  for (int j = 0; j < kRmsRegs; ++j) {
    const int i = tid + j * kReduceThreads;
    v[j] = pre.x[j];
    if constexpr (kAdd)
      if (i < dim) v[j] = round_as<T>(v[j] + y_at(j, i));
  }
  float ss = 0.0f;
#pragma unroll
  for (int j = 0; j < kRmsRegs; ++j)
    if (tid + j * kReduceThreads < dim) ss += v[j] * v[j];
  // Rows wider than kRmsRegs * 256 (none in V2-Lite): the rest straight from memory.
  for (int i = tid + kRmsRegs * kReduceThreads; i < dim; i += kReduceThreads) {
    float a = to_f32(xr[i]);
    if constexpr (kAdd) {
      a = round_as<T>(a + y_at(-1, i));
      xr[i] = from_f32<T>(a);  // read back below by this thread only
    }
    ss += a * a;
  }
  if constexpr (kAdd) {
#pragma unroll
    for (int j = 0; j < kRmsRegs; ++j)
      if (tid + j * kReduceThreads < dim) xr[tid + j * kReduceThreads] = from_f32<T>(v[j]);
  }
  ss = block_sum(ss, scratch);
  const float r = 1.0f / sqrtf(ss / float(dim) + eps);
  // All reads of this row happened before block_sum's barriers, so out may alias x.
#pragma unroll
  for (int j = 0; j < kRmsRegs; ++j) {
    const int i = tid + j * kReduceThreads;
    if (i < dim) orow[i] = from_f32<T>(pre.w[j] * round_as<T>(v[j] * r));
  }
  for (int i = tid + kRmsRegs * kReduceThreads; i < dim; i += kReduceThreads)
    orow[i] = from_f32<T>(to_f32(w[i]) * round_as<T>(to_f32(xr[i]) * r));
}

template <class T, bool kAdd>
__global__ void rmsnorm_kernel(T* x, const T* __restrict__ y, const T* __restrict__ w, T* out, int dim,
                               int64_t x_stride, int64_t out_stride, float eps) {
  pdl_begin();
  __shared__ float scratch[16];
  const T* yr = kAdd ? y + int64_t(blockIdx.x) * x_stride : nullptr;
  T* xr = x + int64_t(blockIdx.x) * x_stride;
  rmsnorm_row<T, kAdd>(rms_preload(xr, w, dim), xr, [yr](int, int i) { return to_f32(yr[i]); }, w,
                       out + int64_t(blockIdx.x) * out_stride, dim, eps, scratch);
}

}  // namespace atlas::cuda::kern
