// GemmMode::fma_chain: out[m][n] = sum_k x[m][k] * w[n][k], bf16 in, fp32 accumulate, scalar.
//
// The original correctness-first kernel, kept as an on-device twin of the CPU reference (the
// fast batch-invariant kernel is gemm_mma.cuh). Its contract is per output element: acc = 0;
// for k = 0..K-1 ascending:
// acc = fmaf(x[m][k], w[n][k], acc); then one rounding to the output type. Nothing about M, N,
// the grid or the tile enters that chain, so any tiling (and any M) gives the same bits, and
// the host reference (std::fma in the same order) gives them too. No split-K.
// Tiles: 64x64 outputs per 256-thread block, 4x4 per thread, K in steps of 16 through shared
// memory (fp32, converted once on load). blockIdx.z walks a strided batch (xbs/wbs/obs).
#pragma once

#include "common.cuh"

namespace atlas::cuda::kern {

constexpr int kGemmBM = 64, kGemmBN = 64, kGemmBK = 16, kGemmThreads = 256;

template <bool kOutF32>
__global__ void __launch_bounds__(kGemmThreads)
gemm_invariant_kernel(const uint16_t* __restrict__ x, const uint16_t* __restrict__ w, void* out,
                      int M, int N, int K, int64_t xs, int64_t ws, int64_t os, int64_t xbs,
                      int64_t wbs, int64_t obs) {
  pdl_begin_gemm();
  x += int64_t(blockIdx.z) * xbs;
  w += int64_t(blockIdx.z) * wbs;
  out = kOutF32 ? static_cast<void*>(static_cast<float*>(out) + int64_t(blockIdx.z) * obs)
                : static_cast<void*>(static_cast<uint16_t*>(out) + int64_t(blockIdx.z) * obs);
  __shared__ float As[kGemmBK][kGemmBM + 4];
  __shared__ float Bs[kGemmBK][kGemmBN + 4];
  const int tid = threadIdx.x;
  const int m0 = blockIdx.y * kGemmBM, n0 = blockIdx.x * kGemmBN;
  const int tm = (tid / 16) * 4, tn = (tid % 16) * 4;
  float acc[4][4];
#pragma unroll
  for (int i = 0; i < 4; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j) acc[i][j] = 0.0f;

  for (int k0 = 0; k0 < K; k0 += kGemmBK) {
    const int kn = min(kGemmBK, K - k0);
    // 64 rows x 16 k of each operand = 1024 values, 4 per thread; out-of-range -> 0 (never used
    // in a chain: the k loop below stops at kn, and rows/cols >= M/N are not stored).
    for (int i = tid; i < kGemmBM * kGemmBK; i += kGemmThreads) {
      const int r = i / kGemmBK, kk = i % kGemmBK;
      const int gm = m0 + r, gn = n0 + r, gk = k0 + kk;
      As[kk][r] = (gm < M && gk < K) ? bf2f(x[int64_t(gm) * xs + gk]) : 0.0f;
      Bs[kk][r] = (gn < N && gk < K) ? bf2f(w[int64_t(gn) * ws + gk]) : 0.0f;
    }
    __syncthreads();
    for (int kk = 0; kk < kn; ++kk) {
      float a[4], b[4];
#pragma unroll
      for (int i = 0; i < 4; ++i) a[i] = As[kk][tm + i];
#pragma unroll
      for (int j = 0; j < 4; ++j) b[j] = Bs[kk][tn + j];
#pragma unroll
      for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) acc[i][j] = __fmaf_rn(a[i], b[j], acc[i][j]);
    }
    __syncthreads();
  }
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int gm = m0 + tm + i;
    if (gm >= M) continue;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int gn = n0 + tn + j;
      if (gn >= N) continue;
      if constexpr (kOutF32)
        static_cast<float*>(out)[int64_t(gm) * os + gn] = acc[i][j];
      else
        static_cast<uint16_t*>(out)[int64_t(gm) * os + gn] = f2bf(acc[i][j]);
    }
  }
}

}  // namespace atlas::cuda::kern
