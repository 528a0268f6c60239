// MoE token permutation without any host round trip and without order-dependent atomics.
//   1. moe_count_kernel: per chunk of kMoeChunk tokens, a histogram of expert ids (shared
//      atomics only count; a count does not depend on the order of the increments).
//   2. moe_scan_kernel (one block): totals per expert, exclusive scan over experts, and each
//      chunk's base offset inside each expert (chunks in ascending order).
//   3. moe_scatter_kernel: per chunk, thread e walks the chunk's pairs in (token, slot) order
//      and hands out consecutive positions for expert e. Result: inside an expert, pairs are in
//      ascending token order, fully determined by the routes.
// gather/combine are plain per-element kernels over bf16 or f32 rows; the combine sums the k
// expert outputs in the router's k order in fp32 and rounds once (bf16; f32: not at all).
// Planned fast path: warp-ballot ranking in the scatter, 16-byte row copies, and fusing the
// gather into the expert GEMM's A-tile loads (indexed rows) and the combine into the down-proj
// epilogue.
#pragma once

#include "common.cuh"

namespace atlas::cuda::kern {

constexpr int kMoeChunk = 256;
constexpr int kMoeMaxK = 16;

__global__ void moe_count_kernel(const int32_t* __restrict__ ids, int tokens, int k, int E,
                                 int32_t* __restrict__ chunk_counts, int* error_flag) {
  extern __shared__ int32_t hist[];  // [E]
  for (int e = threadIdx.x; e < E; e += blockDim.x) hist[e] = 0;
  __syncthreads();
  const int t = blockIdx.x * kMoeChunk + threadIdx.x;
  if (t < tokens) {
    for (int j = 0; j < k; ++j) {
      const int e = ids[int64_t(t) * k + j];
      if (e < 0 || e >= E) {
        atomicOr(error_flag, 2);
        continue;
      }
      atomicAdd(&hist[e], 1);
    }
  }
  __syncthreads();
  for (int e = threadIdx.x; e < E; e += blockDim.x) chunk_counts[int64_t(blockIdx.x) * E + e] = hist[e];
}

// One block, blockDim >= E. chunk_counts [n_chunks, E] is turned into chunk bases in place.
__global__ void moe_scan_kernel(int32_t* chunk_counts, int n_chunks, int E,
                                int32_t* __restrict__ counts, int32_t* __restrict__ offsets) {
  const int e = threadIdx.x;
  if (e < E) {
    int32_t total = 0;
    for (int c = 0; c < n_chunks; ++c) total += chunk_counts[int64_t(c) * E + e];
    counts[e] = total;
  }
  __syncthreads();
  if (e == 0) {
    int32_t run = 0;
    for (int i = 0; i < E; ++i) {
      offsets[i] = run;
      run += counts[i];
    }
    offsets[E] = run;
  }
  __syncthreads();
  if (e < E) {
    int32_t base = offsets[e];
    for (int c = 0; c < n_chunks; ++c) {
      const int32_t n = chunk_counts[int64_t(c) * E + e];
      chunk_counts[int64_t(c) * E + e] = base;
      base += n;
    }
  }
}

__global__ void moe_scatter_kernel(const int32_t* __restrict__ ids, int tokens, int k, int E,
                                   const int32_t* __restrict__ chunk_base,
                                   int32_t* __restrict__ sorted_token, int32_t* __restrict__ pair_slot) {
  __shared__ int32_t sid[kMoeChunk * kMoeMaxK];
  const int t0 = blockIdx.x * kMoeChunk;
  const int nt = min(kMoeChunk, tokens - t0);
  for (int i = threadIdx.x; i < nt * k; i += blockDim.x) sid[i] = ids[int64_t(t0) * k + i];
  __syncthreads();
  for (int e = threadIdx.x; e < E; e += blockDim.x) {
    int32_t pos = chunk_base[int64_t(blockIdx.x) * E + e];
    for (int i = 0; i < nt * k; ++i) {
      if (sid[i] != e) continue;
      const int t = t0 + i / k;
      sorted_token[pos] = t;
      pair_slot[int64_t(t0) * k + i] = pos;
      ++pos;
    }
  }
}

template <class T>
__global__ void moe_gather_kernel(const T* __restrict__ x, const int32_t* __restrict__ sorted_token,
                                  T* __restrict__ xs, int rows, int dim) {
  const int64_t idx = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= int64_t(rows) * dim) return;
  const int64_t r = idx / dim, c = idx % dim;
  xs[idx] = x[int64_t(sorted_token[r]) * dim + c];
}

template <class T>
__global__ void moe_combine_kernel(const T* __restrict__ ys, const int32_t* __restrict__ slot,
                                   const float* __restrict__ w, T* __restrict__ out, int tokens, int k,
                                   int dim) {
  const int64_t idx = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= int64_t(tokens) * dim) return;
  const int64_t t = idx / dim, c = idx % dim;
  float acc = 0.0f;
  for (int j = 0; j < k; ++j) acc += w[t * k + j] * to_f32(ys[int64_t(slot[t * k + j]) * dim + c]);
  out[idx] = from_f32<T>(acc);
}

}  // namespace atlas::cuda::kern
