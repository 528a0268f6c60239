// The new latent into the MLA cache in one launch: per token, the cache row
// [rmsnorm(latent) | rope(key rope part)] written straight to its slot, and the queries' rope
// parts rotated into the absorbed queries. Exactly rmsnorm_kernel, then rope_kernel (two jobs),
// then copy_rows_kernel (the same device functions, the same error bits), without the
// intermediate row: two launches fewer per layer and step. Used where no hook reads that row.
// One block of kReduceThreads threads per token.
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
};

// Every load that does not depend on another is issued first (the norm's row and weights, the
// position, the cache slot, the query pairs of this thread's first kLatentQRegs slots and the key
// pair), then the cos / sin rows of the position: two memory round trips before the stores,
// where the code that rotated pair after pair through rope_pair and read the slot and the key
// pair after the query stores (which may alias them as far as the compiler knows) took four or
// five (3.9 us alone, 8 us beside the absorbed-query GEMM, H200 session 15). The arithmetic is
// rope_pair's and rmsnorm_row's, in the same order: the same bits.
constexpr int kLatentQRegs = 2;  // query pairs per thread held in registers (V2-Lite: 16 x 32 = 512)
template <class T>
__global__ void __launch_bounds__(kReduceThreads) latent_cache_kernel(const LatentCacheParams<T> p) {
  pdl_begin();
  __shared__ float scratch[16];
  const int t = blockIdx.x, tid = threadIdx.x;
  const T* src = p.lat + int64_t(t) * p.lat_stride;
  const RmsPre pre = rms_preload(src, p.norm_w, p.latent);
  const int pos = p.positions[t];
  const int64_t d = p.dst_rows[t];
  const int pairs = p.heads * p.half;
  float qa[kLatentQRegs], qb[kLatentQRegs];
#pragma unroll
  for (int j = 0; j < kLatentQRegs; ++j) {
    const int i = tid + j * kReduceThreads;
    qa[j] = qb[j] = 0.0f;
    if (i < pairs) {
      const T* r = p.q + int64_t(t) * p.q_ts + int64_t(i / p.half) * p.q_hs + 2 * (i % p.half);
      qa[j] = to_f32(r[0]);
      qb[j] = to_f32(r[1]);
    }
  }
  const bool key_pair = tid < p.half;  // half <= kReduceThreads (latent_to_cache checks it)
  const float ka = key_pair ? to_f32(src[p.latent + 2 * tid]) : 0.0f;
  const float kb = key_pair ? to_f32(src[p.latent + 2 * tid + 1]) : 0.0f;
  const bool pos_ok = pos >= 0 && pos < p.max_positions;
  if (!pos_ok && tid == 0) atomicOr(p.error_flag, 1);  // rope: the pairs are left unwritten
  // The cos / sin of this thread's key pair (k = tid) before any store: the first query slot has
  // the same k wherever half divides kReduceThreads (V2-Lite: 32), so these loads are shared.
  float kc = 0.0f, ks = 0.0f;
  if (pos_ok && key_pair) {
    kc = to_f32(p.cos_t[int64_t(pos) * p.half + tid]);
    ks = to_f32(p.sin_t[int64_t(pos) * p.half + tid]);
  }
  if (pos_ok) {
    float c[kLatentQRegs], s[kLatentQRegs];
#pragma unroll
    for (int j = 0; j < kLatentQRegs; ++j) {
      const int i = tid + j * kReduceThreads;
      c[j] = s[j] = 0.0f;
      if (i < pairs) {
        c[j] = to_f32(p.cos_t[int64_t(pos) * p.half + i % p.half]);
        s[j] = to_f32(p.sin_t[int64_t(pos) * p.half + i % p.half]);
      }
    }
#pragma unroll
    for (int j = 0; j < kLatentQRegs; ++j) {
      const int i = tid + j * kReduceThreads;
      if (i < pairs)
        rope_rotate<T>(qa[j], qb[j], c[j], s[j],
                       p.q_out + int64_t(t) * p.qo_ts + int64_t(i / p.half) * p.qo_hs + 2 * (i % p.half));
    }
    for (int i = tid + kLatentQRegs * kReduceThreads; i < pairs; i += kReduceThreads) {
      const int h = i / p.half, k = i % p.half;
      rope_pair<T>(p.q + int64_t(t) * p.q_ts + int64_t(h) * p.q_hs + 2 * k,
                   p.q_out + int64_t(t) * p.qo_ts + int64_t(h) * p.qo_hs + 2 * k, pos, k, p.half, p.cos_t, p.sin_t);
    }
  }
  // block-uniform: the early returns keep block_sum's barriers whole
  if (d < 0) return;  // a padding token: no cache slot
  if (d >= p.cache_rows) {
    if (tid == 0) atomicOr(p.error_flag, 8);
    return;
  }
  T* row = p.cache + d * int64_t(p.latent + 2 * p.half);
  // rmsnorm_row reads its x row through a writable pointer only when it adds a residual (kAdd).
  rmsnorm_row<T, false>(pre, const_cast<T*>(src), [](int, int) { return 0.0f; }, p.norm_w, row, p.latent, p.eps,
                        scratch);
  if (pos_ok && key_pair) rope_rotate<T>(ka, kb, kc, ks, row + p.latent + 2 * tid);
}

}  // namespace atlas::cuda::kern
