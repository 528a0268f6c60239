// Tails of the split-K kernel (kernels/gemm_mma.cuh, splitk_body): the op that follows a GEMM at a
// batch-1 decode step, run by the GEMM launch's last block on the finished output instead of by
// a launch of its own (session 23; gemm_add_rmsnorm in gemm.cu, ATLAS_GEMM_TAILS). Why: at one
// row that op moves a few KB, and its own launch costs a boundary (the wait for the GEMM's end,
// the release of the next kernel) of ~2.3 us per layer (CUPTI, sessions 22-23).
// The tail runs the op's own arithmetic in its own order, so the bits are those of the two
// launches (tests/cuda/test_cuda_gemm.cpp, Gemm.AddRmsNormTail*).
#pragma once

#include "gemm_cluster.cuh"
#include "gemm_mma.cuh"
#include "route_core.cuh"
#include "rmsnorm.cuh"

namespace atlas::cuda::kern {

// o_proj's tail: x = bf16(x + y) (the residual stream, one row; y = the GEMM's bf16 output) and
// out = rmsnorm(x) * w: rmsnorm_row's arithmetic on kReduceThreads threads, the bits of
// add_rmsnorm's kernels (the wide one gives the same bits by construction, kernels/rmsnorm.cuh).
// The GEMM's output is read through L2 (__ldcg): the other blocks wrote it.
struct AddRmsNormTail {
  uint16_t* x = nullptr;
  const uint16_t* w = nullptr;
  uint16_t* out = nullptr;
  int dim = 0;
  float eps = 0.0f;
  int* counter = nullptr;  // zero between launches (splitk_body resets it)
  __device__ void operator()(const MmaGemmParams& p) const {
    __shared__ float scratch[16];
    const uint16_t* y = static_cast<const uint16_t*>(p.out);
    rmsnorm_row<uint16_t, true>(rms_preload<uint16_t>(x, w, dim), x,
                                [y](int, int i) { return bf2f(__ldcg(reinterpret_cast<const unsigned short*>(y) + i)); },
                                w, out, dim, eps, scratch);
  }
};

// The post-attention residual add + norm inside the router's launch (session 43;
// gemm_after_add_rmsnorm in gemm.cu, ATLAS_ROUTER_NORM): a batch-1 decode step's o_proj output
// y is added to the residual row x and the sum normed by every block of the router GEMM (the
// staged 8-warp split-K kernel: 256 threads, the order rmsnorm_row's sum needs) for itself,
// instead of by a launch of its own before the router. Why: at one row that launch moves ~12 KB
// and costs its boundary (the router's blocks waited for it, ~1.8 us per layer after o_proj in
// session 42's timelines); the router's 8 blocks each re-read the two 4 KB rows instead (from
// L2) and stage their weights before the wait as before. rmsnorm_row's arithmetic, so the bits
// of add_rmsnorm's launches (the wide kernel gives the same bits by construction): x[i] =
// bf16(x[i] + y[i]), then the norm of the rounded sum. The sum goes to x_out (never x itself:
// the other blocks read x while block 0 stores it) and the normed row to h_out, both by block
// 0; every block keeps its copy of the normed row in shared memory (row()), where the GEMM's
// A loads read it.
struct AddRmsNormPrologue {
  static constexpr bool kOn = true;
  const uint16_t* x = nullptr;  // [dim] the residual row before the sum
  const uint16_t* y = nullptr;  // [dim] the addend (o_proj's output)
  const uint16_t* w = nullptr;  // [dim] the norm's weight
  uint16_t* x_out = nullptr;    // [dim] the residual sum (must not alias x or y)
  uint16_t* h_out = nullptr;    // [dim] the normed row
  int dim = 0;                  // = K, at most kWideDim (every element in rmsnorm_row's registers)
  float eps = 0.0f;
  using Loaded = RmsPre;
  static __device__ uint16_t* row() {
    __shared__ __align__(16) uint16_t h[kWideDim];
    return h;
  }
  // Before the launch-overlap wait: the norm's weights (a model weight, never a kernel's output).
  __device__ RmsPre before_wait() const {
    RmsPre pre;
#pragma unroll
    for (int j = 0; j < kRmsRegs; ++j) {
      const int i = threadIdx.x + j * kReduceThreads;
      pre.w[j] = i < dim ? bf2f(w[i]) : 0.0f;
      pre.x[j] = 0.0f;
    }
    return pre;
  }
  // After it: the rows (written by earlier kernels), all loads in flight at once, then
  // rmsnorm_row into row() (the other blocks' sums go there too, overwritten by the normed row:
  // "out may alias x"); block 0 stores the sum and the normed row.
  __device__ void after_wait(RmsPre pre, bool first) const {
    __shared__ float scratch[16];
    float yv[kRmsRegs];
#pragma unroll
    for (int j = 0; j < kRmsRegs; ++j) {
      const int i = threadIdx.x + j * kReduceThreads;
      pre.x[j] = i < dim ? bf2f(x[i]) : 0.0f;
      yv[j] = i < dim ? bf2f(y[i]) : 0.0f;
    }
    uint16_t* h = row();
    const uint16_t* yr = y;
    rmsnorm_row<uint16_t, true>(
        pre, first ? x_out : h, [&yv, yr](int j, int i) { return j >= 0 ? yv[j] : bf2f(yr[i]); }, w, h, dim, eps,
        scratch);
    if (first) {
#pragma unroll
      for (int j = 0; j < kRmsRegs; ++j) {  // (the thread's own elements of h: no barrier needed)
        const int i = threadIdx.x + j * kReduceThreads;
        if (i < dim) h_out[i] = h[i];
      }
    }
    __syncthreads();  // the whole row in h for every warp's A loads
  }
};

// The router GEMM of one row (the staged 8-warp split-K kernel, fp32 out) with
// AddRmsNormPrologue (gemm_after_add_rmsnorm, gemm.cu).
template <class T>
__global__ void __launch_bounds__(T::THREADS)
    gemm_splitk_norm_kernel(const MmaGemmParams p, const AddRmsNormPrologue pro) {
  static_assert(T::THREADS == kReduceThreads, "the norm runs rmsnorm_row's kReduceThreads order");
  splitk_body<T, true, true, true, true, NoSplitKTail, false, AddRmsNormPrologue>(p, NoSplitKTail{}, pro);
}

// The router's tail (session 33; gemm_moe_route in gemm.cu, ATLAS_ROUTE_TAIL): one token's
// route and permutation from the finished fp32 logits (the GEMM's output), as route_permute_kernel's
// one-token path runs them: warp 0 alone, route_permute_one_token, or, on a NaN score,
// route_token and permute_one_warp (the host sends only what that path takes: one token,
// greedy, E <= 64). The logits are read through L2 (route_permute_one_token's __ldcg loads):
// the other blocks wrote them.
struct RouteTail {
  RoutePermuteParams q{};
  int* counter = nullptr;  // zero between launches (splitk_body resets it)
  __device__ void operator()(const MmaGemmParams&) const {
    __shared__ float sp[kRouterMaxExperts], scand[kRouterMaxExperts], sw[kRouterMaxK];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    if (warp != 0 || route_permute_one_token(q, sp, sw, lane)) return;
    route_token(q.logits, q.ids, q.weights, q.scores, 0, q.E, q.k, q.grouped, q.n_group, q.topk_group,
                q.norm_topk_prob, q.scaling, sp, scand, sw, lane);
    __syncwarp();  // the ids lane 0 wrote, visible to the warp
    permute_one_warp(q.ids, q.k, q.k, q.E, q.counts, q.offsets, q.sorted_token, q.pair_slot, q.error_flag);
  }
};

// The router GEMM of one row on the cluster config (c16x64/4w: one 64-column tile, one block per
// K slice; session 41, ATLAS_ROUTE_CLUSTER, gemm_moe_route in gemm.cu): the adding block (block
// 0 at one row) holds every logit after the cluster's slice sums and routes the token itself
// (RouteTail), so the routing costs no launch, no grid-wide counter and no fence; the
// kernel releases the next launch after its own wait (gemm_cluster_body). fp32 out (the
// logits), the same bits as the router GEMM then route_permute_kernel.
template <class T>
__global__ void __launch_bounds__(T::THREADS) gemm_cluster_route_kernel(const MmaGemmParams p, const RouteTail tail) {
  gemm_cluster_body<T, true, false, RouteTail>(p, tail);
}

// The staged split-K kernel (bf16 or, kOutF32, fp32 out; at most 8 rows, 16-byte copies) with a
// tail: dense problems only (every block has a tile, so every block counts itself).
template <class T, class Tail, bool kOutF32 = false>
__global__ void __launch_bounds__(T::THREADS) gemm_splitk_tail_kernel(const MmaGemmParams p, const Tail tail) {
  static_assert(T::THREADS == kReduceThreads, "the tails' norms run rmsnorm_row's kReduceThreads order");
  splitk_body<T, kOutF32, true, true, true, Tail>(p, tail);
}

}  // namespace atlas::cuda::kern
