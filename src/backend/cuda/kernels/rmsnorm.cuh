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

// ---- wide norms: one row by kWideThreads threads (rows of at most kWideDim) ----
// The same arithmetic as rmsnorm_row, spread over four times the threads: thread T holds the
// elements T + m * kWideThreads (m < kWideRegs) in registers. Only the sum of squares has an
// order across elements (thread i < kReduceThreads adds the squares of i, i + 256, ... in turn,
// then block_sum), so the squares go through shared memory and the first kReduceThreads threads
// add them in that order; everything else is per element. Why: at one row (a batch-1 decode
// step) a 256-thread norm is a chain of dependent instructions per thread (8 elements each, the
// bf16 roundings of every step); Nsight (H200, session 15) saw a fused combine + norm issue ~1400
// instructions per warp with 2 warps per scheduler, 4 us of its 5.5.
constexpr int kWideThreads = 4 * kReduceThreads, kWideRegs = kRmsRegs / 4;
constexpr int kWideDim = kWideThreads * kWideRegs;  // = kRmsRegs * kReduceThreads (2048)

// v: this thread's elements of the row to normalise (already rounded as rmsnorm_row's v), w: the
// weights at the same elements; out[i] = w * round(v * r). sq: kWideDim floats of shared memory.
// The wide norms' scale r = 1 / sqrt(mean of squares + eps) once sq[0, dim) holds every
// element's square (made visible here): thread t < 256 adds sq[t], sq[t + 256], ... in order,
// then block_sum, as rmsnorm_row. Every thread gets r.
__device__ __forceinline__ float rmsnorm_wide_scale(const float* sq, int dim, float eps, float* scratch) {
  const int tid = threadIdx.x;
  __syncthreads();
  float ss = 0.0f;
  if (tid < kReduceThreads) {
#pragma unroll
    for (int j = 0; j < kRmsRegs; ++j)
      if (tid + j * kReduceThreads < dim) ss += sq[tid + j * kReduceThreads];
  }
  ss = block_sum(ss, scratch);
  return 1.0f / sqrtf(ss / float(dim) + eps);
}

template <class T>
__device__ __forceinline__ void rmsnorm_wide_finish(const float (&v)[kWideRegs], const float (&w)[kWideRegs], T* orow,
                                                    int dim, float eps, float* sq, float* scratch) {
  const int tid = threadIdx.x;
#pragma unroll
  for (int m = 0; m < kWideRegs; ++m) {
    const int i = tid + m * kWideThreads;
    if (i < dim) sq[i] = v[m] * v[m];  // the product rmsnorm_row adds, rounded as it is there
  }
  const float r = rmsnorm_wide_scale(sq, dim, eps, scratch);
#pragma unroll
  for (int m = 0; m < kWideRegs; ++m) {
    const int i = tid + m * kWideThreads;
    if (i < dim) orow[i] = from_f32<T>(w[m] * round_as<T>(v[m] * r));
  }
}

// rmsnorm_kernel<T, kAdd> for dim <= kWideDim, one block of kWideThreads per row: the same bits.
// kReleaseFirst: the next launch released before the wait (kernels/pdl.cuh; ATLAS_RELEASE_FIRST).
// kAdd: the rounded sum goes to sum (x itself for add_rmsnorm in place, another buffer, or
// nowhere when null: a second reader of the same x and y that needs only the normed row).
template <class T, bool kAdd, bool kReleaseFirst = false>
__global__ void __launch_bounds__(kWideThreads)
    rmsnorm_wide_kernel(const T* x, const T* __restrict__ y, const T* __restrict__ w, T* out, T* sum, int dim,
                        int64_t x_stride, int64_t out_stride, float eps) {
  __shared__ float scratch[16];
  __shared__ float sq[kWideDim];
  const T* xr = x + int64_t(blockIdx.x) * x_stride;
  T* sr = kAdd && sum ? sum + int64_t(blockIdx.x) * x_stride : nullptr;
  const T* yr = kAdd ? y + int64_t(blockIdx.x) * x_stride : nullptr;
  float v[kWideRegs], wv[kWideRegs], yv[kWideRegs];
  // The norm weights before the launch-overlap wait (a model weight, never a kernel's output:
  // kernels/pdl.cuh), the rows after it.
#pragma unroll
  for (int m = 0; m < kWideRegs; ++m) {
    const int i = threadIdx.x + m * kWideThreads;
    wv[m] = i < dim ? to_f32(w[i]) : 0.0f;
  }
  pdl_begin_rf(kReleaseFirst);
#pragma unroll
  for (int m = 0; m < kWideRegs; ++m) {
    const int i = threadIdx.x + m * kWideThreads;
    v[m] = i < dim ? to_f32(xr[i]) : 0.0f;
    yv[m] = kAdd && i < dim ? to_f32(yr[i]) : 0.0f;
  }
  if constexpr (kAdd) {
#pragma unroll
    for (int m = 0; m < kWideRegs; ++m) {
      const int i = threadIdx.x + m * kWideThreads;
      if (i < dim) {
        v[m] = round_as<T>(v[m] + yv[m]);
        if (sr) sr[i] = from_f32<T>(v[m]);
      }
    }
  }
  // out may alias x (rmsnorm): every read of the row is above, before the barriers.
  rmsnorm_wide_finish<T>(v, wv, out + int64_t(blockIdx.x) * out_stride, dim, eps, sq, scratch);
}

// kAdd: the sum goes back into x (sum must be x: the launcher takes the wide kernel for any other).
template <class T, bool kAdd>
__global__ void rmsnorm_kernel(const T* x, const T* __restrict__ y, const T* __restrict__ w, T* out, T* sum, int dim,
                               int64_t x_stride, int64_t out_stride, float eps) {
  pdl_begin();
  __shared__ float scratch[16];
  const T* yr = kAdd ? y + int64_t(blockIdx.x) * x_stride : nullptr;
  T* xr = (kAdd ? sum : const_cast<T*>(x)) + int64_t(blockIdx.x) * x_stride;  // (read only without kAdd)
  rmsnorm_row<T, kAdd>(rms_preload(xr, w, dim), xr, [yr](int, int i) { return to_f32(yr[i]); }, w,
                       out + int64_t(blockIdx.x) * out_stride, dim, eps, scratch);
}

}  // namespace atlas::cuda::kern
