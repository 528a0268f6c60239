// A batch-1 decode step's MoE combine + residual add + next input norm inside the next layer's
// q|kv_a GEMM (session 42; gemm_combine_norm in gemm.cu, ATLAS_COMBINE_QKV): the cluster GEMM
// (kernels/gemm_cluster.cuh, c16x64/4w: one block per 256-wide K slice) computes its A row
// itself instead of copying the normed row that moe_combine_add_rmsnorm's launch wrote. Why:
// at one row that launch moves ~30 KB and its own boundary (the wait for the down GEMMs, then
// the q|kv_a blocks' wait for it, then their x copies) costs ~6 us per layer (session 41's
// timeline: the combine ends 4.4 us after the routed down, q|kv_a 6.0 after the combine).
//
// Each block (rank r of its cluster) combines only its slice [256 r, 256 r + 256) of the row:
// thread t the two elements 2t, 2t + 1, with moe_combine_add_rmsnorm_pairs_kernel's arithmetic
// (combine_residual_bf16: the same bits). The norm needs the sum of squares of the whole row, in
// rmsnorm_wide_scale's order (the 256-thread block's thread u adds the squares of elements
// u + 256 j, j ascending from +0, then block_sum's tree over its eight warps): each block pushes
// its slice's squares into every other block of its cluster (st.async on one mbarrier per block,
// initialised before the launch-overlap wait, so no cluster barrier on the critical path), waits
// for the rest of the row's, and sums them in that order (thread t standing for threads t and
// t + 128, as latent_cache_half_block does). Then its slice of the normed row goes into row 0 of
// its ring slots in bf16, and the GEMM runs as before: the same A values, the same bits.
// The first cluster also stores the row's residual sum into x_out (never x itself: the other
// clusters read x while it runs) and, where h_out is set, the normed row.
// The squares live in the ring's A part (kWideDim floats): nothing else uses it before the main
// loop, and every block's pushes have landed before its mbarrier completes. Rows 1..15 of the A
// slots keep what the squares left there: an m16n8k16 product's output row r reads A row r only,
// and only row 0 is stored.
#pragma once

#include "dsmem.cuh"
#include "gemm_cluster.cuh"
#include "combine_core.cuh"
#include "rmsnorm.cuh"

namespace atlas::cuda::kern {

// kK: the router's k where known at compile time (6: V2-Lite's), 0: k <= kCombineStageK at run
// time (predicated).
// kDirect (ATLAS_COMBINE_DIRECT): one token's k pairs are rows 0..k-1 of ys whatever the slots
// say (the permutation of one token's k distinct experts), so load() issues those rows beside the
// slots and weights, one round after the wait, and picks slot q's row from registers by selects
// (no dynamic register index); the slots only order the sum, as before: the same values in the
// same order. A slot outside [0, k) (never written so: the routing flags such ids) gives zeros.
template <int kK, bool kDirect = false>
struct CombineNormPrologue {
  static constexpr bool kOn = true;
  const uint16_t* ys = nullptr;      // [k, dim] the routed experts' rows (slot order)
  const int32_t* slot = nullptr;     // [k] the token's slots
  const float* w = nullptr;          // [k] the token's routing weights
  int k = 0;
  const uint16_t* addend = nullptr;  // [dim] the shared experts' row, or null
  const uint16_t* x = nullptr;       // [dim] the residual row before the sum
  uint16_t* x_out = nullptr;         // [dim] the residual sum (must not alias x)
  const uint16_t* norm_w = nullptr;  // [dim] the next input norm's weight
  uint16_t* h_out = nullptr;         // [dim] the normed row, or null
  int dim = 0;                       // = K: a multiple of 64, at most kWideDim
  float eps = 0.0f;
  // Set where the launch was not ordered after the shared experts (no stream join: session 42's
  // flagged form): their flag, 1 once they are done (combine_signal_kernel). Every block's
  // thread 0 polls it (acquire) before any thread reads the addend; the launch then follows the
  // routed down with launch overlap, so its blocks stage their weights before the wait.
  // Unsafe as a default: these blocks spin while holding SMs, and nothing guarantees that the
  // shared experts' blocks or the signal kernel get one (a run hung under it, s42-8).
  const uint32_t* ready = nullptr;
  // > 0: the weights before the wait without a flag (the launch depends programmatically on the
  // addend's writer: ATLAS_COMBINE_QKV=event).
  int early_weights = 0;
  __device__ bool weights_first() const { return ready != nullptr || early_weights > 0; }

  static __device__ uint64_t* barrier() {
    __shared__ uint64_t bar;
    return &bar;
  }
  // Before the launch-overlap wait: the norm weights of the thread's two elements (a model
  // weight), and the mbarrier the other blocks' squares land on.
  __device__ float2 before_wait(int rank, int C) const {
    const int tid = threadIdx.x, base = rank * kSliceK, len = min(kSliceK, dim - base), e = 2 * tid;
    const float2 wv = e < len ? bf16_pair(*reinterpret_cast<const uint32_t*>(norm_w + base + e)) : make_float2(0.f, 0.f);
    if (C > 1) {
      if (tid == 0) {
        const uint32_t bar = smem_u32(barrier());
        mbar_init(bar, 1);
        mbar_arrive_expect_tx(bar, uint32_t(dim - len) * 4u);  // every other slice's squares
        fence_mbarrier_init();
      }
      cluster_arrive_relaxed();  // its wait before the first push: every block's barrier is ready
    }
    return wv;
  }
  // After the launch-overlap wait, before the weights' copies (so that these loads are served
  // first: issued after 32 KB of copies per block they waited for them, session 42's first
  // run): the thread's two elements of the residual row, of the shared experts' row and of each
  // routed row (the slots first: one dependent round).
  static constexpr int kQ = kK > 0 ? kK : kCombineStageK;
  struct Loaded {
    float2 xv, av;
    float wt[kQ];
    float2 yq[kQ];
  };
  __device__ Loaded load(int rank) const {
    const int base = rank * kSliceK, len = min(kSliceK, dim - base), e = 2 * threadIdx.x, i0 = base + e;
    const bool in = e < len;  // dim is even: both elements or neither
    const auto pair = [](const uint16_t* p) { return bf16_pair(*reinterpret_cast<const uint32_t*>(p)); };
    const float2 zero = make_float2(0.f, 0.f);
    if (ready) {
      if (threadIdx.x == 0) {
        uint32_t v = 0;
        do {
          asm volatile("ld.acquire.gpu.global.u32 %0, [%1];\n" : "=r"(v) : "l"(ready) : "memory");
        } while (v == 0);
      }
      __syncthreads();  // (thread 0's acquire, then the block's reads)
    }
    Loaded l;
    l.xv = in ? pair(x + i0) : zero;
    l.av = addend && in ? pair(addend + i0) : zero;
    int32_t sl[kQ];
#pragma unroll
    for (int q = 0; q < kQ; ++q) {
      const bool use = kK > 0 || q < k;
      sl[q] = use ? slot[q] : 0;
      l.wt[q] = use ? w[q] : 0.0f;
    }
    if constexpr (kDirect) {
      float2 rows[kQ];
#pragma unroll
      for (int r = 0; r < kQ; ++r) rows[r] = (kK > 0 || r < k) && in ? pair(ys + int64_t(r) * dim + i0) : zero;
#pragma unroll
      for (int q = 0; q < kQ; ++q) {
        float2 y = zero;
#pragma unroll
        for (int r = 0; r < kQ; ++r)
          if (sl[q] == r) y = rows[r];
        l.yq[q] = y;
      }
    } else {
#pragma unroll
      for (int q = 0; q < kQ; ++q) l.yq[q] = (kK > 0 || q < k) && in ? pair(ys + int64_t(sl[q]) * dim + i0) : zero;
    }
    return l;
  }
  template <int BM, int BK, int CH, int STAGES>
  __device__ void after_wait(const Loaded& l, float2 wv, uint16_t* sA, int rank, int C, bool first) const {
    static_assert(STAGES * BM * BK * 2 >= kWideDim * 4, "the squares fit the A slots");
    static_assert(BK == 64 && kSliceK == STAGES * BK, "a slice is the ring's steps");
    constexpr int kThreads = kReduceThreads / 2;  // the cluster config's 128 threads
    float* sq = reinterpret_cast<float*>(sA);
    const int tid = threadIdx.x;
    const int base = rank * kSliceK, len = min(kSliceK, dim - base), e = 2 * tid, i0 = base + e;
    const bool in = e < len;
    const float2 xv = l.xv, av = l.av;
    float acc0 = 0.0f, acc1 = 0.0f;  // moe_combine_kernel's order: slots ascending from +0
#pragma unroll
    for (int q = 0; q < kQ; ++q)
      if (kK > 0 || q < k) {
        acc0 += l.wt[q] * l.yq[q].x;
        acc1 += l.wt[q] * l.yq[q].y;
      }
    const bool add = addend != nullptr;
    const float v0 = combine_residual_bf16(acc0, av.x, xv.x, add), v1 = combine_residual_bf16(acc1, av.y, xv.y, add);
    const float2 sq2 = make_float2(v0 * v0, v1 * v1);  // the products rmsnorm_row adds
    if (in) *reinterpret_cast<float2*>(sq + i0) = sq2;
    if (C > 1) {
      cluster_wait();
      const uint32_t bar = smem_u32(barrier()), at = smem_u32(sq + i0);
      if (in)
        for (int s = 0; s < C; ++s)
          if (s != rank) st_async_v2(dsmem_addr(at, uint32_t(s)), sq2, dsmem_addr(bar, uint32_t(s)));
      mbar_wait_cluster(bar, 0);
    }
    __syncthreads();  // this block's own squares, visible to the block
    // rmsnorm_wide_scale's sum: threads tid and tid + 128 of the 256-thread order.
    __shared__ float scratch[9];
    float ss[2] = {0.0f, 0.0f};
#pragma unroll
    for (int j = 0; j < kRmsRegs; ++j)
#pragma unroll
      for (int hf = 0; hf < 2; ++hf) {
        const int i = tid + hf * kThreads + j * kReduceThreads;
        if (i < dim) ss[hf] += sq[i];
      }
    // (half_block_sum's barriers: every read of the squares is done, the A slots may be written)
    const float r = 1.0f / sqrtf(half_block_sum(ss[0], ss[1], scratch) / float(dim) + eps);
    if (!in) return;
    const uint32_t h = bf16_pack(wv.x * round_as<uint16_t>(v0 * r), wv.y * round_as<uint16_t>(v1 * r));
    // Row 0 of slot e / BK, element e % BK: chunk (e % BK) / 8 swizzled for row 0.
    const int col = e % BK;
    *reinterpret_cast<uint32_t*>(sA + (e / BK) * (BM * BK) + swz<CH>(0, col / 8) * 8 + col % 8) = h;
    if (first) {
      *reinterpret_cast<uint32_t*>(x_out + i0) = bf16_pack(v0, v1);
      if (h_out) *reinterpret_cast<uint32_t*>(h_out + i0) = h;
    }
  }
};

// gemm_combine_signal: flags[i] = (i == index), the raised one released at GPU scope after the
// stream's earlier kernels (the launch-overlap wait: the shared experts' down) are done. One
// thread; the others of the warp idle.
__global__ void combine_signal_kernel(uint32_t* flags, int count, int index) {
  pdl_begin();
  if (threadIdx.x != 0) return;
  for (int i = 0; i < count; ++i)
    if (i != index) flags[i] = 0u;
  __threadfence();
  asm volatile("st.release.gpu.global.u32 [%0], %1;\n" ::"l"(flags + index), "r"(1u) : "memory");
}

// The cluster GEMM of one row (c16x64/4w) with CombineNormPrologue (gemm_combine_norm, gemm.cu).
template <class T, int kK, bool kDirect>
__global__ void __launch_bounds__(T::THREADS)
    gemm_cluster_combine_kernel(const MmaGemmParams p, const CombineNormPrologue<kK, kDirect> pro) {
  static_assert(T::THREADS == kReduceThreads / 2, "the norm's order: thread t stands for t and t + 128");
  gemm_cluster_body<T, false, false, NoSplitKTail, false, CombineNormPrologue<kK, kDirect>>(p, NoSplitKTail{}, pro);
}

}  // namespace atlas::cuda::kern
