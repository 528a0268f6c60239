// The new latent into the MLA cache in one launch: per token, the cache row
// [rmsnorm(latent) | rope(key rope part)] written straight to its slot, and the queries' rope
// parts rotated into the absorbed queries. Exactly rmsnorm_kernel, then rope_kernel (two jobs),
// then copy_rows_kernel (the same device functions, the same error bits), without the
// intermediate row: two launches fewer per layer and step. Used where no hook reads that row.
// One block of kReduceThreads threads per token (latent_cache_wide_kernel below: 1024).
#pragma once

#include "common.cuh"
#include "elementwise.cuh"
#include "rmsnorm.cuh"

namespace atlas::cuda::kern {

template <class T>
struct LatentCacheParams {
  const T* lat;       // [tokens] rows of width latent + half * 2, stride lat_stride
  const T* norm_w;    // [latent]
  T* cache;           // rows of width latent + half * 2
  const int32_t* dst_rows;
  int64_t cache_rows, lat_stride;
  int latent, half;
  float eps;
  const T* q;         // queries' rope parts: token stride q_ts, head stride q_hs
  T* q_out;           // rotated: token stride qo_ts, head stride qo_hs
  int heads;
  int64_t q_ts, q_hs, qo_ts, qo_hs;
  const int32_t* positions;
  const T* cos_t;
  const T* sin_t;
  int max_positions;
  int* error_flag;    // bit 1: a position out of range (rope's), bit 8: a cache row out of range (copy_rows')
  int release_first = 0;  // the wide kernel: the next launch released before the wait (kernels/pdl.cuh)
};

// Query rope pair j of token t (head j / half, pair j % half) at position pos.
template <class T>
__device__ __forceinline__ void latent_rope_query_pair(const LatentCacheParams<T>& p, int t, int j, int pos) {
  const int h = j / p.half, k = j % p.half;
  rope_pair<T>(p.q + int64_t(t) * p.q_ts + int64_t(h) * p.q_hs + 2 * k,
               p.q_out + int64_t(t) * p.qo_ts + int64_t(h) * p.qo_hs + 2 * k, pos, k, p.half, p.cos_t, p.sin_t);
}
// The rope steps both kernels below share, for a block of kThreads threads on token t.
// The queries' rope pairs, pair i by thread i mod kThreads.
template <class T, int kThreads>
__device__ __forceinline__ void latent_rope_queries(const LatentCacheParams<T>& p, int t, int pos) {
  for (int i = threadIdx.x; i < p.heads * p.half; i += kThreads) latent_rope_query_pair(p, t, i, pos);
}
// The key's rope pairs from the latent row src into the cache row.
template <class T, int kThreads>
__device__ __forceinline__ void latent_rope_key(const LatentCacheParams<T>& p, const T* src, T* row, int pos) {
  for (int k = threadIdx.x; k < p.half; k += kThreads)
    rope_pair<T>(src + p.latent + 2 * k, row + p.latent + 2 * k, pos, k, p.half, p.cos_t, p.sin_t);
}

// The token's cache row (null: a padding token, or a slot past the cache, flagged). dst_rows[t]
// is block-uniform, so every thread gets the same answer.
template <class T>
__device__ __forceinline__ T* latent_row(const LatentCacheParams<T>& p, int t) {
  const int64_t d = p.dst_rows[t];
  if (d < 0) return nullptr;  // a padding token: no cache slot
  if (d >= p.cache_rows) {
    if (threadIdx.x == 0) atomicOr(p.error_flag, 8);
    return nullptr;
  }
  return p.cache + d * int64_t(p.latent + 2 * p.half);
}
// Both kernels' middle: a bad position flagged (the rope pairs are then left unwritten), the
// queries' rope parts rotated, and the token's cache row (latent_row).
template <class T, int kThreads>
__device__ __forceinline__ T* latent_queries_then_row(const LatentCacheParams<T>& p, int t, int pos, bool pos_ok) {
  if (!pos_ok && threadIdx.x == 0) atomicOr(p.error_flag, 1);
  if (pos_ok) latent_rope_queries<T, kThreads>(p, t, pos);
  return latent_row(p, t);
}

template <class T>
__global__ void __launch_bounds__(kReduceThreads) latent_cache_kernel(const LatentCacheParams<T> p) {
  pdl_begin();
  __shared__ float scratch[16];
  const int t = blockIdx.x;
  const T* src = p.lat + int64_t(t) * p.lat_stride;
  // The norm's row and weights first: their loads overlap the rope's (nothing here writes them).
  const RmsPre pre = rms_preload(src, p.norm_w, p.latent);
  const int pos = p.positions[t];
  const bool pos_ok = pos >= 0 && pos < p.max_positions;
  T* row = latent_queries_then_row<T, kReduceThreads>(p, t, pos, pos_ok);
  if (row == nullptr) return;  // block-uniform: the early return keeps the barriers whole
  // rmsnorm_row reads its x row through a writable pointer only when it adds a residual (kAdd).
  rmsnorm_row<T, false>(pre, const_cast<T*>(src), [](int, int) { return 0.0f; }, p.norm_w, row, p.latent, p.eps,
                        scratch);
  if (pos_ok) latent_rope_key<T, kReduceThreads>(p, src, row, pos);
}

// latent_cache_kernel for latents of at most kWideDim, one block of kWideThreads per token
// (rmsnorm.cuh, "wide norms"): the same steps in the same order, each pair and element by the
// same expressions, the norm by rmsnorm_wide_finish; four times the threads, so at V2-Lite's
// shape every query pair and latent element has a thread of its own instead of two in turn.
// The same bits.
template <class T>
__global__ void __launch_bounds__(kWideThreads) latent_cache_wide_kernel(const LatentCacheParams<T> p) {
  __shared__ float scratch[16];
  __shared__ float sq[kWideDim];
  const int t = blockIdx.x;
  const T* src = p.lat + int64_t(t) * p.lat_stride;
  float v[kWideRegs], wv[kWideRegs];  // the norm's row and weights first, as rms_preload
  // The norm weights before the launch-overlap wait (a model weight, never a kernel's output:
  // kernels/pdl.cuh), the row after it.
#pragma unroll
  for (int m = 0; m < kWideRegs; ++m) {
    const int i = threadIdx.x + m * kWideThreads;
    wv[m] = i < p.latent ? to_f32(p.norm_w[i]) : 0.0f;
  }
  pdl_begin_rf(p.release_first != 0);
#pragma unroll
  for (int m = 0; m < kWideRegs; ++m) {
    const int i = threadIdx.x + m * kWideThreads;
    v[m] = i < p.latent ? to_f32(src[i]) : 0.0f;
  }
  const int pos = p.positions[t];
  const bool pos_ok = pos >= 0 && pos < p.max_positions;
  T* row = latent_queries_then_row<T, kWideThreads>(p, t, pos, pos_ok);
  if (row == nullptr) return;  // block-uniform: the early return keeps the barriers whole
  rmsnorm_wide_finish<T>(v, wv, row, p.latent, p.eps, sq, scratch);
  if (pos_ok) latent_rope_key<T, kWideThreads>(p, src, row, pos);
}

// The queries' rope pairs of every token, pair i (token-major, then head, then pair) by thread
// `first + i` of `threads` (several blocks: kernels/gemm_latent.cuh spreads them over the blocks
// the latent jobs leave free, one pair per thread at a batch-1 step where one block walked four
// in turn). A token with a bad position keeps its pairs unwritten (its latent job flags it).
template <class T>
__device__ __forceinline__ void latent_rope_queries_spread(const LatentCacheParams<T>& p, int tokens, int first,
                                                          int threads) {
  const int per_token = p.heads * p.half;
  for (int i = first; i < tokens * per_token; i += threads) {
    const int t = i / per_token, pos = p.positions[t];
    if (pos >= 0 && pos < p.max_positions) latent_rope_query_pair(p, t, i % per_token, pos);
  }
}

// latent_cache_kernel's work for token t by a block of kReduceThreads / 2 threads (128: the
// tiled GEMM's block, kernels/gemm_latent.cuh, where one launch runs this beside the absorbed
// query's tiles), but for the queries' rope pairs (latent_rope_queries_spread, run by other
// threads of that launch). The same steps and error bits; the norm's sum of squares in
// rmsnorm_row's order: thread i stands for the 256-thread block's threads i and i + 128 (its
// elements i + 128 m, even m for the first, odd m for the second, each summed in ascending m
// from +0), warp w's two sums are that block's warps w and w + 4, and the tree over the eight
// warp sums is block_sum's. The same bits. Rows of at most kWideDim; the caller releases the
// next launch (kernels/pdl.cuh) and this waits after loading the norm weights.
template <class T>
__device__ __forceinline__ void latent_cache_half_block(const LatentCacheParams<T>& p, int t, float* scratch) {
  constexpr int kThreads = kReduceThreads / 2, kRegs = kWideDim / kThreads;
  const int tid = threadIdx.x;
  float v[kRegs], wv[kRegs];
#pragma unroll
  for (int m = 0; m < kRegs; ++m) {
    const int i = tid + m * kThreads;
    wv[m] = i < p.latent ? to_f32(p.norm_w[i]) : 0.0f;
  }
  pdl_wait_after(true);
  const T* src = p.lat + int64_t(t) * p.lat_stride;
#pragma unroll
  for (int m = 0; m < kRegs; ++m) {
    const int i = tid + m * kThreads;
    v[m] = i < p.latent ? to_f32(src[i]) : 0.0f;
  }
  const int pos = p.positions[t];
  const bool pos_ok = pos >= 0 && pos < p.max_positions;
  if (!pos_ok && threadIdx.x == 0) atomicOr(p.error_flag, 1);
  T* row = latent_row(p, t);
  if (row == nullptr) return;  // block-uniform: the early return keeps the barriers whole
  float ss[2] = {0.0f, 0.0f};
#pragma unroll
  for (int m = 0; m < kRegs; ++m)
    if (tid + m * kThreads < p.latent) ss[m & 1] += v[m] * v[m];
  const float r = 1.0f / sqrtf(half_block_sum(ss[0], ss[1], scratch) / float(p.latent) + p.eps);
#pragma unroll
  for (int m = 0; m < kRegs; ++m) {
    const int i = tid + m * kThreads;
    if (i < p.latent) row[i] = from_f32<T>(wv[m] * round_as<T>(v[m] * r));
  }
  if (pos_ok) latent_rope_key<T, kThreads>(p, src, row, pos);
}

}  // namespace atlas::cuda::kern
