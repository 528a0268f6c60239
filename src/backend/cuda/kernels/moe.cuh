// MoE token permutation without any host round trip and without order-dependent atomics.
//   1. moe_count_kernel: per chunk of kMoeChunk tokens, a histogram of expert ids (shared
//      atomics only count; a count does not depend on the order of the increments).
//   2. moe_scan_kernel (one block): totals per expert, exclusive scan over experts, and each
//      chunk's base offset inside each expert (chunks in ascending order).
//   3. moe_scatter_kernel: per chunk, the pairs in (token, slot) order get consecutive positions
//      per expert (warp match + per-warp counts). Result: inside an expert, pairs are in
//      ascending token order, fully determined by the routes.
// With one chunk (tokens <= kMoeChunk: decode steps) moe_permute_one_chunk_kernel does all three
// in one launch.
// gather/combine are plain per-element kernels over bf16 or f32 rows; the combine sums the k
// expert outputs in the router's k order in fp32 and rounds once (bf16; f32: not at all).
// Planned fast path: 16-byte row copies, and fusing the
// gather into the expert GEMM's A-tile loads (indexed rows) and the combine into the down-proj
// epilogue.
#pragma once

#include "combine_core.cuh"
#include "common.cuh"
#include "rmsnorm.cuh"
#include "router.cuh"

namespace atlas::cuda::kern {

constexpr int kMoeChunk = 256;
constexpr int kMoeMaxK = 16;

// hist [E] (shared) = the expert counts of the chunk's tokens [t0, t0 + blockDim.x) below
// `tokens`; out-of-range ids are flagged (error bit 2) and not counted. Ends with a barrier.
__device__ __forceinline__ void moe_chunk_histogram(const int32_t* __restrict__ ids, int t0, int tokens, int k, int E,
                                                    int32_t* hist, int* error_flag) {
  for (int e = threadIdx.x; e < E; e += blockDim.x) hist[e] = 0;
  __syncthreads();
  const int t = t0 + threadIdx.x;
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
}

__global__ void moe_count_kernel(const int32_t* __restrict__ ids, int tokens, int k, int E,
                                 int32_t* __restrict__ chunk_counts, int* error_flag) {
  pdl_begin();
  extern __shared__ int32_t hist[];  // [E]
  moe_chunk_histogram(ids, blockIdx.x * kMoeChunk, tokens, k, E, hist, error_flag);
  for (int e = threadIdx.x; e < E; e += blockDim.x) chunk_counts[int64_t(blockIdx.x) * E + e] = hist[e];
}

// One block, blockDim >= E. chunk_counts [n_chunks, E] is turned into chunk bases in place.
__global__ void moe_scan_kernel(int32_t* chunk_counts, int n_chunks, int E,
                                int32_t* __restrict__ counts, int32_t* __restrict__ offsets) {
  pdl_begin();
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

// Pairs in rounds of kMoeChunk (the block size) in (token, slot) order: a pair's position is its
// expert's running position, plus the same-expert pairs of earlier warps in the round, plus its
// rank among the same-expert lanes of its warp (__match_any_sync). Identical output to walking
// the pairs one by one (the first version: one thread per expert walked the whole chunk, 57 us
// per call on the H200 at 128 tokens). `run` [E] holds each expert's next position on entry;
// `cnt` is [kMoeChunk / 32][E] shared scratch. Pairs [0, n) of tokens from t0.
__device__ __forceinline__ void moe_scatter_rounds(const int32_t* __restrict__ ids, int t0, int n, int k, int E,
                                                   int32_t* run, int32_t* cnt, int32_t* __restrict__ sorted_token,
                                                   int32_t* __restrict__ pair_slot) {
  constexpr int kWarps = kMoeChunk / 32;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  for (int base = 0; base < n; base += kMoeChunk) {
    for (int i = tid; i < kWarps * E; i += kMoeChunk) cnt[i] = 0;
    __syncthreads();
    const int i = base + tid;
    const int e = i < n ? ids[int64_t(t0) * k + i] : -1;
    const bool mine = e >= 0 && e < E;  // out-of-range ids were flagged by the count
    const unsigned same = __match_any_sync(0xffffffffu, mine ? e : -1);
    const int rank = __popc(same & ((1u << lane) - 1u));
    if (mine && rank == 0) cnt[warp * E + e] = __popc(same);
    __syncthreads();
    if (mine) {
      int pos = run[e] + rank;
      for (int w = 0; w < warp; ++w) pos += cnt[w * E + e];
      sorted_token[pos] = t0 + i / k;
      pair_slot[int64_t(t0) * k + i] = pos;
    }
    __syncthreads();
    for (int x = tid; x < E; x += kMoeChunk) {
      int sum = 0;
      for (int w = 0; w < kWarps; ++w) sum += cnt[w * E + x];
      run[x] += sum;
    }
    __syncthreads();  // every count read before the next round zeroes cnt
  }
}

// Dynamic shared memory: (1 + kMoeChunk / 32) * E ints.
__global__ void __launch_bounds__(kMoeChunk)
moe_scatter_kernel(const int32_t* __restrict__ ids, int tokens, int k, int E,
                   const int32_t* __restrict__ chunk_base, int32_t* __restrict__ sorted_token,
                   int32_t* __restrict__ pair_slot) {
  pdl_begin();
  extern __shared__ int32_t scatter_smem[];
  int32_t* run = scatter_smem;  // [E] next position of each expert
  const int t0 = blockIdx.x * kMoeChunk;
  for (int e = threadIdx.x; e < E; e += kMoeChunk) run[e] = chunk_base[int64_t(blockIdx.x) * E + e];
  moe_scatter_rounds(ids, t0, min(kMoeChunk, tokens - t0) * k, k, E, run, run + E, sorted_token, pair_slot);
}

// All three steps in one block where the tokens fit one chunk (every decode step up to 256 rows):
// the chunk's histogram is the expert counts, their exclusive scan the offsets and the chunk's
// bases, then the same scatter rounds. Integer results: identical to the three launches.
// permute_smem: (2 + kMoeChunk / 32) * E ints; kMoeChunk threads.
__device__ __forceinline__ void permute_one_chunk(const int32_t* __restrict__ ids, int tokens, int k, int E,
                                                  int32_t* __restrict__ counts, int32_t* __restrict__ offsets,
                                                  int32_t* __restrict__ sorted_token, int32_t* __restrict__ pair_slot,
                                                  int* error_flag, int32_t* permute_smem) {
  int32_t* hist = permute_smem;  // [E]
  int32_t* run = hist + E;       // [E]
  const int tid = threadIdx.x;
  moe_chunk_histogram(ids, 0, tokens, k, E, hist, error_flag);
  if (tid == 0) {
    int32_t total = 0;
    for (int e = 0; e < E; ++e) {
      run[e] = total;
      offsets[e] = total;
      total += hist[e];
    }
    offsets[E] = total;
  }
  for (int e = tid; e < E; e += kMoeChunk) counts[e] = hist[e];
  __syncthreads();
  moe_scatter_rounds(ids, 0, tokens * k, k, E, run, run + E, sorted_token, pair_slot);
}

// Dynamic shared memory: (2 + kMoeChunk / 32) * E ints.
__global__ void __launch_bounds__(kMoeChunk)
moe_permute_one_chunk_kernel(const int32_t* __restrict__ ids, int tokens, int k, int E, int32_t* __restrict__ counts,
                             int32_t* __restrict__ offsets, int32_t* __restrict__ sorted_token,
                             int32_t* __restrict__ pair_slot, int* error_flag) {
  pdl_begin();
  extern __shared__ int32_t permute_smem[];
  permute_one_chunk(ids, tokens, k, E, counts, offsets, sorted_token, pair_slot, error_flag, permute_smem);
}

// The router and the permutation of its routes in one launch, for a few tokens (a batch-1 or
// small-batch decode step): warp w routes tokens w, w + 8, ... exactly as router_kernel does
// (route_token), the block barrier makes their ids visible, then the one-chunk permutation runs
// as moe_permute_one_chunk_kernel does (up to 32 pairs: by one warp, permute_one_warp; its block
// barriers were most of a batch-1 launch's 8.5 us, Nsight session 12). The same results as the
// two launches, one launch fewer.
constexpr int kRoutePermuteWarps = kMoeChunk / 32;
// Dynamic shared memory: (2 + kMoeChunk / 32) * E ints.
__global__ void __launch_bounds__(kMoeChunk) route_permute_kernel(const RoutePermuteParams q) {
  pdl_begin_rf(q.release_first != 0);
  __shared__ float sp[kRoutePermuteWarps][kRouterMaxExperts];
  __shared__ float scand[kRoutePermuteWarps][kRouterMaxExperts];
  __shared__ float sw[kRoutePermuteWarps][kRouterMaxK];
  extern __shared__ int32_t permute_smem[];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  if (q.tokens == 1 && !q.grouped && q.E <= kRouteOneTokenMaxExperts && q.k <= q.E) {  // block-uniform
    if (warp != 0 || route_permute_one_token(q, sp[0], sw[0], lane)) return;
    // A NaN score: route_token and permute_one_warp exactly as below, by this warp alone.
    route_token(q.logits, q.ids, q.weights, q.scores, 0, q.E, q.k, q.grouped, q.n_group, q.topk_group,
                q.norm_topk_prob, q.scaling, sp[0], scand[0], sw[0], lane);
    __syncwarp();  // the ids lane 0 wrote, visible to the warp
    permute_one_warp(q.ids, q.k, q.k, q.E, q.counts, q.offsets, q.sorted_token, q.pair_slot, q.error_flag);
    return;
  }
  for (int t = warp; t < q.tokens; t += kRoutePermuteWarps) {
    __syncwarp();  // the previous token's reads of this warp's scratch are done
    route_token(q.logits, q.ids, q.weights, q.scores, t, q.E, q.k, q.grouped, q.n_group, q.topk_group,
                q.norm_topk_prob, q.scaling, sp[warp], scand[warp], sw[warp], lane);
  }
  __syncthreads();  // every token's ids written (global writes of this block, visible after it)
  if (q.tokens * q.k <= 32) {  // (block-uniform) a warp's worth of pairs: no block barriers
    if (warp == 0)
      permute_one_warp(q.ids, q.tokens * q.k, q.k, q.E, q.counts, q.offsets, q.sorted_token, q.pair_slot,
                       q.error_flag);
    return;
  }
  permute_one_chunk(q.ids, q.tokens, q.k, q.E, q.counts, q.offsets, q.sorted_token, q.pair_slot, q.error_flag,
                    permute_smem);
}

template <class T>
__global__ void moe_gather_kernel(const T* __restrict__ x, const int32_t* __restrict__ sorted_token,
                                  T* __restrict__ xs, int rows, int dim) {
  pdl_begin();
  const int64_t idx = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= int64_t(rows) * dim) return;
  const int64_t r = idx / dim, c = idx % dim;
  xs[idx] = x[int64_t(sorted_token[r]) * dim + c];
}

// addend / sum_out (both or neither): sum_out = bf16(out + addend), the routed + shared add.
template <class T>
__global__ void moe_combine_kernel(const T* __restrict__ ys, const int32_t* __restrict__ slot,
                                   const float* __restrict__ w, T* __restrict__ out, int tokens, int k,
                                   int dim, const T* __restrict__ addend, T* __restrict__ sum_out) {
  pdl_begin();
  const int64_t idx = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= int64_t(tokens) * dim) return;
  const int64_t t = idx / dim, c = idx % dim;
  float acc = 0.0f;
  for (int j = 0; j < k; ++j) acc += w[t * k + j] * to_f32(ys[int64_t(slot[t * k + j]) * dim + c]);
  const T routed = from_f32<T>(acc);
  out[idx] = routed;
  if (addend) sum_out[idx] = from_f32<T>(to_f32(routed) + to_f32(addend[idx]));
}

// The combine, the routed + shared add, the residual add and the next RMSNorm in one launch (one
// block of kReduceThreads threads per token): y = moe_combine_kernel's sum_out (or out without
// addend) computed per element in the same order, then x = bf16(x + y), h = rmsnorm(x) exactly
// as rmsnorm_kernel<T, true>. Two launches and the [tokens, dim] round trips of routed and y
// fewer per MoE layer; used where no hook reads routed, shared, y or the sum. A thread's
// elements are combined before the norm with every gathered load issued up front (k rounds
// unrolled, each of kRmsRegs independent loads): computed element by element inside the norm's
// loop, the loads ran one after another (15 us per launch at one token, H200 session 7).
constexpr int kCombineMaxK = 16;
// The staged variant (kStage): bf16, k <= kCombineStageK, dim <= kCombineStageDim, dim % 8 == 0,
// 16-byte aligned rows. Every gathered row (and the shared experts' row) comes in through one
// 16-byte load per thread and row, all issued before the first is used, into shared memory; the
// arithmetic then reads the same values from there in the same order (the same bits). Without
// it the k rounds of gathered loads ran one after another: the loop over k leaves early for
// q >= k, so no load of a later round could be issued before the earlier round's sums
// (12.5 us per launch at one token, H200 session 8).
constexpr int kCombineStageDim = kRmsRegs * kReduceThreads;  // (kCombineStageK: combine_core.cuh)
template <class T, bool kStage>
__global__ void __launch_bounds__(kReduceThreads)
    moe_combine_add_rmsnorm_kernel(const T* __restrict__ ys, const int32_t* __restrict__ slot,
                                   const float* __restrict__ w, int k, const T* __restrict__ addend, T* x,
                                   const T* __restrict__ norm_w, T* h, int dim, float eps) {
  pdl_begin();
  __shared__ float scratch[16];
  const int64_t t = blockIdx.x;
  const int tid = threadIdx.x;
  // The residual row and the norm's weights first: their loads (the weights come from HBM)
  // overlap the slot loads and the gather below instead of following the combine.
  const RmsPre pre = rms_preload(x + t * dim, norm_w, dim);
  int32_t sl[kCombineMaxK];
  float wt[kCombineMaxK];
#pragma unroll
  for (int q = 0; q < kCombineMaxK; ++q) {
    sl[q] = q < k ? slot[t * k + q] : 0;
    wt[q] = q < k ? w[t * k + q] : 0.0f;
  }
  // The combine of one element, in moe_combine_kernel's order (slots ascending from +0).
  const auto combine = [&](int i) {
    float acc = 0.0f;
#pragma unroll
    for (int q = 0; q < kCombineMaxK; ++q)
      if (q < k) acc += wt[q] * to_f32(ys[int64_t(sl[q]) * dim + i]);
    return acc;
  };
  // kStage: the gathered rows and the addend row through shared memory (one round of 16-byte
  // loads, issued before any sum); the same values, summed below in the same order either way.
  constexpr int kStK = kStage ? kCombineStageK : 1, kStDim = kStage ? kCombineStageDim : 8;
  __shared__ __align__(16) uint16_t ys_s[kStK][kStDim];
  __shared__ __align__(16) uint16_t add_s[kStDim];
  if constexpr (kStage) {
    static_assert(sizeof(T) == 2, "the staged combine is bf16");
    const int chunks = dim / 8;  // <= kReduceThreads: one 16-byte chunk per thread and row
    uint4 v[kCombineStageK], av = make_uint4(0, 0, 0, 0);
#pragma unroll
    for (int q = 0; q < kCombineStageK; ++q)
      if (q < k && tid < chunks) v[q] = *reinterpret_cast<const uint4*>(ys + int64_t(sl[q]) * dim + 8 * tid);
    if (addend && tid < chunks) av = *reinterpret_cast<const uint4*>(addend + t * dim + 8 * tid);
#pragma unroll
    for (int q = 0; q < kCombineStageK; ++q)
      if (q < k && tid < chunks) *reinterpret_cast<uint4*>(&ys_s[q][8 * tid]) = v[q];
    if (addend && tid < chunks) *reinterpret_cast<uint4*>(&add_s[8 * tid]) = av;
    __syncthreads();
  }
  const auto y_at = [&](int q, int i) {  // routed row q, element i
    if constexpr (kStage)
      return to_f32(T(ys_s[q][i]));
    else
      return to_f32(ys[int64_t(sl[q]) * dim + i]);
  };
  const auto addend_at = [&](int i) {
    if constexpr (kStage)
      return to_f32(T(add_s[i]));
    else
      return to_f32(addend[t * dim + i]);
  };
  // y from the combine's fp32 sum: bf16(routed), plus the addend in bf16 where there is one.
  const auto finish = [&](float a, float add) {
    const T routed = from_f32<T>(a);
    return addend ? to_f32(from_f32<T>(to_f32(routed) + add)) : to_f32(routed);
  };
  float acc[kRmsRegs], yv[kRmsRegs];
#pragma unroll
  for (int j = 0; j < kRmsRegs; ++j) acc[j] = 0.0f;
#pragma unroll
  for (int q = 0; q < kCombineMaxK; ++q) {
    if (q >= k) break;
#pragma unroll
    for (int j = 0; j < kRmsRegs; ++j) {
      const int i = tid + j * kReduceThreads;
      if (i < dim) acc[j] += wt[q] * y_at(q, i);
    }
  }
#pragma unroll
  for (int j = 0; j < kRmsRegs; ++j) {
    const int i = tid + j * kReduceThreads;
    yv[j] = i < dim ? finish(acc[j], addend ? addend_at(i) : 0.0f) : 0.0f;
  }
  // Elements past the registers (dim > kRmsRegs * threads; never staged) are recomputed.
  rmsnorm_row<T, true>(
      pre, x + t * dim,
      [&](int j, int i) { return j >= 0 ? yv[j] : finish(combine(i), addend ? to_f32(addend[t * dim + i]) : 0.0f); },
      norm_w, h + t * dim, dim, eps, scratch);
}

// moe_combine_add_rmsnorm_kernel for rows of at most kWideDim and k <= kCombineStageK, one block
// of kWideThreads per token (rmsnorm.cuh, "wide norms"): each thread combines its kWideRegs
// elements (every gathered load issued before the first sum: the k rounds are predicated, not
// left early), in the same order, with the same roundings; the norm is rmsnorm_wide_finish.
// The same bits as the 256-thread kernel.
template <class T, bool kReleaseFirst = false>
__global__ void __launch_bounds__(kWideThreads)
    moe_combine_add_rmsnorm_wide_kernel(const T* __restrict__ ys, const int32_t* __restrict__ slot,
                                        const float* __restrict__ w, int k, const T* __restrict__ addend, T* x,
                                        const T* __restrict__ norm_w, T* h, int dim, float eps) {
  __shared__ float scratch[16];
  __shared__ float sq[kWideDim];
  const int64_t t = blockIdx.x;
  const int tid = threadIdx.x;
  T* xr = x + t * dim;
  float xv[kWideRegs], wv[kWideRegs], av[kWideRegs];
  // The norm weights before the launch-overlap wait (a model weight, never a kernel's output:
  // kernels/pdl.cuh), everything else after it.
#pragma unroll
  for (int m = 0; m < kWideRegs; ++m) {
    const int i = tid + m * kWideThreads;
    wv[m] = i < dim ? to_f32(norm_w[i]) : 0.0f;
  }
  pdl_begin_rf(kReleaseFirst);
#pragma unroll
  for (int m = 0; m < kWideRegs; ++m) {
    const int i = tid + m * kWideThreads;
    xv[m] = i < dim ? to_f32(xr[i]) : 0.0f;
    av[m] = addend && i < dim ? to_f32(addend[t * dim + i]) : 0.0f;
  }
  int32_t sl[kCombineStageK];
  float wt[kCombineStageK];
#pragma unroll
  for (int q = 0; q < kCombineStageK; ++q) {
    sl[q] = q < k ? slot[t * k + q] : 0;
    wt[q] = q < k ? w[t * k + q] : 0.0f;
  }
  float yq[kCombineStageK][kWideRegs];
#pragma unroll
  for (int q = 0; q < kCombineStageK; ++q)
#pragma unroll
    for (int m = 0; m < kWideRegs; ++m) {
      const int i = tid + m * kWideThreads;
      yq[q][m] = q < k && i < dim ? to_f32(ys[int64_t(sl[q]) * dim + i]) : 0.0f;
    }
  float v[kWideRegs];
#pragma unroll
  for (int m = 0; m < kWideRegs; ++m) {
    const int i = tid + m * kWideThreads;
    float acc = 0.0f;  // moe_combine_kernel's order: slots ascending from +0
#pragma unroll
    for (int q = 0; q < kCombineStageK; ++q)
      if (q < k) acc += wt[q] * yq[q][m];
    const T routed = from_f32<T>(acc);
    const float y = addend ? to_f32(from_f32<T>(to_f32(routed) + av[m])) : to_f32(routed);
    v[m] = round_as<T>(xv[m] + y);  // the residual add, as rmsnorm_row<T, true>
    if (i < dim) xr[i] = from_f32<T>(v[m]);
  }
  rmsnorm_wide_finish<T>(v, wv, h + t * dim, dim, eps, sq, scratch);
}

// moe_combine_add_rmsnorm_wide_kernel for bf16 rows of even width whose rows start on 4-byte
// boundaries: thread tid holds the adjacent elements 2 tid and 2 tid + 1 and loads and stores
// them as one 32-bit pair; kK = the router's k where it is known at compile time (6, V2-Lite's;
// 0: k <= kCombineStageK at run time, predicated as in the wide kernel). Nsight (H200, session
// 26): the wide kernel issued ~450 instructions per warp on its one SM, half the cycles busy, its
// 6.0 us in isolation set by the instructions and their latencies, not by memory; this form
// issues half the loads and address sums and no rounds for slots past k. Each element's
// arithmetic is the wide kernel's and the squares land in sq at their element's index (the sum
// reads sq by index): the same bits. (bf16_pair, bf16_pack and combine_residual_bf16:
// combine_core.cuh.)
template <int kK, bool kReleaseFirst = false>
__global__ void __launch_bounds__(kWideThreads)
    moe_combine_add_rmsnorm_pairs_kernel(const uint16_t* __restrict__ ys, const int32_t* __restrict__ slot,
                                         const float* __restrict__ w, int k, const uint16_t* __restrict__ addend,
                                         uint16_t* x, const uint16_t* __restrict__ norm_w, uint16_t* h, int dim,
                                         float eps) {
  constexpr int kQ = kK > 0 ? kK : kCombineStageK;  // slot rounds
  __shared__ float scratch[16];
  __shared__ float sq[kWideDim];
  const int64_t t = blockIdx.x;
  const int tid = threadIdx.x, i0 = 2 * tid;
  const bool in = i0 < dim;  // dim is even: both elements or neither
  uint16_t* xr = x + t * dim;
  // The norm weights before the launch-overlap wait (a model weight, never a kernel's output:
  // kernels/pdl.cuh), everything else after it.
  const float2 wv = in ? bf16_pair(*reinterpret_cast<const uint32_t*>(norm_w + i0)) : make_float2(0.0f, 0.0f);
  pdl_begin_rf(kReleaseFirst);
  const float2 xv = in ? bf16_pair(*reinterpret_cast<const uint32_t*>(xr + i0)) : make_float2(0.0f, 0.0f);
  const float2 av = addend && in ? bf16_pair(*reinterpret_cast<const uint32_t*>(addend + t * dim + i0))
                                 : make_float2(0.0f, 0.0f);
  int32_t sl[kQ];
  float wt[kQ];
#pragma unroll
  for (int q = 0; q < kQ; ++q) {
    const bool use = kK > 0 || q < k;
    sl[q] = use ? slot[t * k + q] : 0;
    wt[q] = use ? w[t * k + q] : 0.0f;
  }
  float2 yq[kQ];
#pragma unroll
  for (int q = 0; q < kQ; ++q)
    yq[q] = (kK > 0 || q < k) && in ? bf16_pair(*reinterpret_cast<const uint32_t*>(ys + int64_t(sl[q]) * dim + i0))
                                    : make_float2(0.0f, 0.0f);
  float acc0 = 0.0f, acc1 = 0.0f;  // moe_combine_kernel's order: slots ascending from +0
#pragma unroll
  for (int q = 0; q < kQ; ++q)
    if (kK > 0 || q < k) {
      acc0 += wt[q] * yq[q].x;
      acc1 += wt[q] * yq[q].y;
    }
  const bool add = addend != nullptr;
  const float v0 = combine_residual_bf16(acc0, av.x, xv.x, add), v1 = combine_residual_bf16(acc1, av.y, xv.y, add);
  if (in) {
    *reinterpret_cast<uint32_t*>(xr + i0) = bf16_pack(v0, v1);
    sq[i0] = v0 * v0;  // the products rmsnorm_row adds, at their elements' indices
    sq[i0 + 1] = v1 * v1;
  }
  const float r = rmsnorm_wide_scale(sq, dim, eps, scratch);
  if (in)
    *reinterpret_cast<uint32_t*>(h + t * dim + i0) =
        bf16_pack(wv.x * round_as<uint16_t>(v0 * r), wv.y * round_as<uint16_t>(v1 * r));
}

}  // namespace atlas::cuda::kern
