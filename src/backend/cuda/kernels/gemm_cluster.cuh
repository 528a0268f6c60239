// Batch-invariant GEMM for decode-sized M: split-K across a thread-block cluster (sm_90), the
// slice sums added through distributed shared memory. Same numerics contract as
// kernels/gemm_mma.cuh (read it first), so the same bits as every other config.
//
// Why: at decode sizes (M <= 128 rows) a dense GEMM has few output tiles, so the tiled kernel
// either leaves most SMs idle or (the sliced launch) writes every K slice's fp32 sums to global
// memory and runs a second kernel to add them. Here the C = ceil(K / 256) blocks of one cluster
// share an output tile, block r computing K slice r only (4 BK steps, all of its copies in
// flight at once), park their slice sums in their own shared memory, and after one cluster
// barrier each block reads every block's sums for its share of the tile (DSMEM) and adds them in
// slice order starting from +0: the contract's running total, the same sequence of fp32
// additions as the tiled kernel's. Nothing goes through global memory but the operands and the
// output, one launch.
// Measured (H200, session 5, docs/cuda-sessions.md): faster than the sliced launch and the split-K kernel
// on some decode shapes only (M = 1 with N >= 2816: lm_head 132 vs 166 us; M = 128 with
// N <= 3072: 2-19%), slower where tiled kernels fill the GPU. It is latency-bound: one wave of
// clusters takes ~9 us whatever the bytes (Nsight: stalls on the cp.async waits, the barriers
// and the cluster barrier's memory fence; at M = 128 x N = 2048 only 30 clusters of 8 fit at
// once, so 32 need two waves), where cuBLASLt's non-invariant kernel takes 8 us in all.
// Grid: blockIdx.x = tile * C + rank, clusters of (C, 1, 1) along x, so a cluster's blocks have
// the same tile index (`pid` = blockIdx.x / C) and find_tile gives them the same tile; when it
// gives none (grouped: past the last tile, or bad offsets) every block of the cluster exits
// before the first cluster barrier. blockIdx.z walks a strided batch. C <= 16 (K <= 4096; the
// host asks for non-portable cluster sizes above 8 and checks the device can place the cluster).
// Async operands only (K % 8 == 0, 16-byte rows): the host runs another config otherwise.
#pragma once

#include <cooperative_groups.h>

#include <type_traits>

#include "dsmem.cuh"
#include "gemm_mma.cuh"
#include "phase_clock.cuh"

namespace atlas::cuda::kern {

// The most blocks a cluster may have (non-portable above 8: Hopper's limit), so K <= 16 slices.
constexpr int kClusterMax = 16;

// BM x BN tile, WARPS_M x WARPS_N warps, BK = 64: one K slice is STAGES = 4 steps, each in its
// own ring slot (a block never refills a slot).
template <int BM_, int BN_, int WARPS_M_, int WARPS_N_>
struct ClusterTile {
  static constexpr int BM = BM_, BN = BN_, BK = 64, WARPS_M = WARPS_M_, WARPS_N = WARPS_N_;
  static constexpr int STAGES = kSliceK / BK;
  static constexpr int THREADS = 32 * WARPS_M * WARPS_N;
  static constexpr int WM = BM / WARPS_M, WN = BN / WARPS_N;
  static constexpr int MI = WM / 16, NI = WN / 8;
  static constexpr int CH = BK / 8;
  static constexpr int RING_BYTES = STAGES * (BM + BN) * BK * 2;
  static constexpr int SUM_BYTES = BM * BN * 4;  // the slice sum, reusing the ring
  static constexpr int SMEM_BYTES = RING_BYTES > SUM_BYTES ? RING_BYTES : SUM_BYTES;
  static_assert(WM % 16 == 0 && WN % 8 == 0, "warp tile must be whole m16n8 tiles");
  static_assert(NI == 1 || NI % 2 == 0, "B fragments load n8 tiles in pairs (or one)");
  static_assert(BN % 4 == 0, "the reduction works on column quads");
};

// 1 where this binary's device code has the cluster kernel (built for sm_90 or later), else 0.
__global__ void gemm_cluster_probe_kernel(int* out) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  *out = 1;
#else
  *out = 0;
#endif
}

// kPush (config "c16x64/4w+push", ATLAS_GEMM_CLUSTER_PUSH; session 36; measured in session 37:
// the same bits, slower, 468.1 against 475.9 tok/s, q|kv_a ending 7.2 us after the combine
// against 6.1, s37-1: a block may push only after the adding block's "free" arrival, a round
// trip the barrier path does not wait for; off by default): where the slice sums of all C blocks fit
// the ring beside this block's own, (1 + C) * BM * BN * 4 <= SMEM_BYTES, the blocks push their
// slice sums by st.async (kernels/dsmem.cuh) into the block that adds each column quad instead
// of that block reading them after a cluster barrier: no cluster barrier after the main loop
// (barrier.cluster.arrive's release is a GPU-scope memory barrier, MEMBAR.ALL.GPU; the MLA
// cluster kernel's exchange gained ~9 tok/s at batch-1 decode from the same change, s36-2/-3).
// Each block's mbarrier 1 ("free") counts one remote arrival from every adding block once that
// block's ring is no longer read by its main loop; a block pushes only after its own barrier 1
// has completed, into the adding block's ring past its own slice sum ([C][BM][BN] fp32, slice s
// at s); the adding block waits on its mbarrier 0 for C * (its quads) * 16 bytes, then adds
// slice 0, 1, ... from +0 as before: the same values in the same order, the same bits.
// Elsewhere (more slices) the kernel runs the barrier path. The mbarriers follow the ring in
// dynamic shared memory (the config's smem is SMEM_BYTES + 16).
// Tail (not NoSplitKTail: gemm_cluster_route_kernel, kernels/gemm_tail.cuh; session 41): a dense
// one-tile problem whose block 0 runs tail(p) on the finished output before the last cluster
// barrier (the barrier path only), and which releases the next launch only after its own
// launch-overlap wait (wait-first: a routing tail's routed gate|up must not become resident
// before the shared experts' gate|up, session 33's lesson).
// kClocks (ATLAS_PHASE_CLOCKS=cluster_gemm; the early barrier path, block rank 0 of each
// cluster): kClusterGemmMarks clock64 readings (kernels/phase_clock.cuh) into p.phase_clocks.
// Prologue (not NoPrologue: the MoE combine + norm before q|kv_a, kernels/gemm_combine.cuh;
// session 42): a dense one-row problem whose A row the blocks compute themselves instead of
// copying it: `float2 w = pro.before_wait(rank, C)` before the launch-overlap wait; after it
// `in = pro.load(rank)` (its loads issued before the weights' copies), the weights' copies, and
// `pro.after_wait(in, w, sA, rank, C, first)`, which writes row 0 of each of the block's ring
// slots (the block's K slice of the row, bf16, in the swizzled layout the copies would have used)
// in place of the x copies; `first`: the block is in the first cluster (the one that stores the
// row's side outputs).
// (NoPrologue: kernels/gemm_mma.cuh, shared with splitk_body.)
constexpr int kClusterGemmMarks = 9;
template <class T, bool kOutF32, bool kPush, class Tail, bool kClocks = false, class Pro = NoPrologue>
__device__ __forceinline__ void gemm_cluster_body(const MmaGemmParams& p, const Tail& tail, const Pro& pro = {}) {
  constexpr bool kTail = !std::is_same_v<Tail, NoSplitKTail>;
  constexpr bool kPro = Pro::kOn;
  static_assert(!(kTail && kPush), "a tail runs on the barrier path");
  static_assert(!(kClocks && (kTail || kPush)), "clocks on the plain barrier path");
  static_assert(!(kPro && (kTail || kPush || kClocks || kOutF32)), "a prologue on the plain bf16 barrier path");
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  PhaseClock<kClusterGemmMarks> clk;
  const auto mark = [&](int i) {
    if constexpr (kClocks) clk.mark(i);
  };
  mark(0);
  namespace cg = cooperative_groups;
  extern __shared__ __align__(128) unsigned char gemm_smem[];
  __shared__ int64_t a_off[T::BM];
  __shared__ int64_t b_off[T::BN];
  uint16_t* sA = reinterpret_cast<uint16_t*>(gemm_smem);  // [STAGES][BM][BK] (swizzled chunks)
  uint16_t* sB = sA + T::STAGES * T::BM * T::BK;           // [STAGES][BN][BK]
  float* part = reinterpret_cast<float*>(gemm_smem);        // [BM][BN] after the main loop

  const cg::cluster_group cluster = cg::this_cluster();
  const int C = int(cluster.num_blocks()), rank = int(cluster.block_rank());
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int wm = warp / T::WARPS_N, wn = warp % T::WARPS_N;

  // This block's K slice: steps [kt_begin, kt_end) (a short last slice has fewer steps), all of
  // its copies in flight at once, one ring slot per step.
  const int K = p.K;
  const int KC = (K + 15) / 16;
  const L2Hint w_hint = l2_evict_first_hint(p.l2_evict_first > 0);
  const int kt_begin = rank * T::STAGES;
  const int nsteps = min((K + T::BK - 1) / T::BK, kt_begin + T::STAGES) - kt_begin;
  TileSpot t;  // the whole cluster finds the same tile (or none); rank r runs K slice r
  const auto copy_steps = [&](auto parts) {
#pragma unroll
    for (int i = 0; i < T::STAGES; ++i) {
      if (i < nsteps)
        load_tile_step<T, true, decltype(parts)::value>(sA + i * (T::BM * T::BK), sB + i * (T::BN * T::BK), a_off,
                                                         b_off, t.x, t.w, (kt_begin + i) * T::BK, K, true, tid, w_hint);
      cp_async_commit();
    }
  };

  // A dense problem under launch overlap with p.prefetch > 1 (ATLAS_GEMM_STAGE_EARLY, as the
  // staged split-K kernel) and p.cluster_early (ATLAS_GEMM_CLUSTER_EARLY; the host sets it for
  // one-tile problems of <= 16 rows): the block copies its whole weight slice (BN rows x 256)
  // into the ring before pdl_begin_gemm(), while the kernel before it still runs (a dense GEMM's
  // weights are never an earlier kernel's output), one commit group ahead of the per-step
  // groups; x only after the wait. At a batch-1 decode step that is the q|kv_a GEMM (14.9 MB)
  // staged during the MoE combine's one-block launch: 2516 -> 2475 us per step (session 22).
  // The same data in the same ring slots: the same bits.
  const bool early = kPro || (p.offsets == nullptr && p.prefetch > 1 && p.cluster_early > 0);
  [[maybe_unused]] float2 pro_w{};
  [[maybe_unused]] typename Pro::Loaded pro_in{};
  // The block's weight slice into the ring (one commit group), once b_off holds its rows.
  const auto stage_weights = [&] {
#pragma unroll
    for (int i = 0; i < T::STAGES; ++i)
      if (i < nsteps)
        load_tile_step<T, true, kTileB>(sA + i * (T::BM * T::BK), sB + i * (T::BN * T::BK), a_off, b_off, t.x, t.w,
                                        (kt_begin + i) * T::BK, K, true, tid, w_hint);
    cp_async_commit();
  };
  if constexpr (kPro) {
    // A prologue's launch follows a join of two streams (the MoE's shared experts) unless the
    // prologue polls a flag for them (weights_first): joined, its kernel starts after its
    // predecessor's end, so staging the weights before the wait gains nothing and the
    // prologue's loads are issued first (behind 32 KB of copies per block they waited, s42-1);
    // flagged, it follows the routed down with launch overlap and stages them before the wait.
    const bool found = find_tile<T::BM, true>(p, int(blockIdx.x) / C, tid, lane, t);
    const bool weights_first = pro.weights_first();
    for (int r = tid; found && r < T::BN; r += T::THREADS) b_off[r] = b_row_offset(p, t.n_tile * T::BN + r);
    __syncthreads();
    if (found && weights_first) stage_weights();
    pro_w = pro.before_wait(rank, C);
    pdl_begin_gemm();
    if (!found) return;  // (never, dense: every cluster has its tile)
    pro_in = pro.load(rank);
    if (!weights_first) stage_weights();
  } else if (early) {
    const bool found = find_tile<T::BM, true>(p, int(blockIdx.x) / C, tid, lane, t);
    if (found) {
      for (int r = tid; r < T::BN; r += T::THREADS) b_off[r] = b_row_offset(p, t.n_tile * T::BN + r);
      __syncthreads();
      stage_weights();
    }
    mark(1);
    if constexpr (kTail)
      pdl_begin();
    else
      pdl_begin_gemm();
    mark(2);
    if (!found) return;
  } else if (!start_tile<T::BM, T::BN, true>(p, int(blockIdx.x) / C, tid, lane, t, rank * kSliceK,
                                             (rank + 1) * kSliceK)) {
    return;
  }
  const int row_begin = t.row_begin, row_end = t.row_end;
  const int n0 = t.n_tile * T::BN;
  // kPush: the two mbarriers (after the ring), the blocks that add quads and this one's quads.
  [[maybe_unused]] bool push = false;
  [[maybe_unused]] uint32_t xdata = 0, xfree = 0;
  [[maybe_unused]] int owners = 0, my_quads = 0;
  // (the same in every block; a tile has rows, but an mbarrier must not count 0 arrivals)
  if constexpr (kPush) push = (1 + C) * T::SUM_BYTES <= T::SMEM_BYTES && row_end > row_begin;
  if (push) {
    xdata = smem_u32(gemm_smem + T::SMEM_BYTES);
    xfree = xdata + 8;
    const int n_quads = (row_end - row_begin) * (T::BN / 4);
    owners = min(C, (n_quads + T::THREADS - 1) / T::THREADS);
    for (int i = rank * T::THREADS; i < n_quads; i += C * T::THREADS) my_quads += min(T::THREADS, n_quads - i);
    if (tid == 0) {
      mbar_init(xdata, 1);
      mbar_arrive_expect_tx(xdata, uint32_t(C * my_quads * 16));
      mbar_init(xfree, uint32_t(owners));
      fence_mbarrier_init();
    }
    cluster_arrive_relaxed();  // its wait after the main loop: every block started, barriers ready
  }
  for (int r = tid; r < T::BM; r += T::THREADS) a_off[r] = a_row_offset(p, row_begin + r, row_end);
  if (!early)
    for (int r = tid; r < T::BN; r += T::THREADS) b_off[r] = b_row_offset(p, n0 + r);
  __syncthreads();
  // One commit group per step (the early weights' group, if any, was committed before them, so
  // the waits below cover it too). A prologue writes the A rows itself: empty groups keep the
  // count of the waits below.
  if constexpr (kPro) {
    pro.template after_wait<T::BM, T::BK, T::CH, T::STAGES>(pro_in, pro_w, sA, rank, C, int(blockIdx.x) / C == 0);
#pragma unroll
    for (int i = 0; i < T::STAGES; ++i) cp_async_commit();
  } else if (early)
    copy_steps(std::integral_constant<int, kTileA>{});
  else
    copy_steps(std::integral_constant<int, kTileA | kTileB>{});
  mark(3);
  static_assert(T::STAGES == 4, "cp_async_wait<3> below: 4 groups in flight");

  float acc[T::MI][T::NI][4];
#pragma unroll
  for (int mi = 0; mi < T::MI; ++mi)
#pragma unroll
    for (int ni = 0; ni < T::NI; ++ni)
#pragma unroll
      for (int q = 0; q < 4; ++q) acc[mi][ni][q] = 0.0f;
  for (int i = 0; i < nsteps; ++i) {
    cp_async_wait<3>();  // groups committed: 4 + i (5 + i with the early weights); step i's is complete
    __syncthreads();
    mma_step<T>(sA + i * (T::BM * T::BK), sB + i * (T::BN * T::BK), acc, kt_begin + i, KC, wm, wn, lane);
    cp_async_commit();   // an empty group: keeps the count of the wait above
  }
  cp_async_wait<0>();
  __syncthreads();  // every warp is done with the ring: it becomes the slice sum
  mark(4);

  // The slice sum into shared memory, part[row][col] (accumulator (mi, ni, q): row gid (+8 for
  // q >= 2), columns 2*tig + {0, 1}).
  const int gid = lane >> 2, tig = lane & 3;
#pragma unroll
  for (int mi = 0; mi < T::MI; ++mi)
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int r = wm * T::WM + mi * 16 + gid + half * 8;
#pragma unroll
      for (int ni = 0; ni < T::NI; ++ni) {
        const int c = wn * T::WN + ni * 8 + tig * 2;
        *reinterpret_cast<float2*>(part + r * T::BN + c) = make_float2(acc[mi][ni][half * 2], acc[mi][ni][half * 2 + 1]);
      }
    }
  // Block `rank` finishes column quads rank, rank + C, ... of the tile's real rows: total = +0,
  // then + slice 0, + slice 1, ... , one rounding to the output type. slice_at(s, r, c): where
  // slice s's sums of the quad are (block s's part, or this block's receive area under push).
  // Every load is issued before the first addition (the DSMEM latency once, not per slice).
  const auto add_quads = [&](auto slice_at) {
    const int rows = row_end - row_begin;
    const int quads = rows * (T::BN / 4);
    for (int i = rank * T::THREADS + tid; i < quads; i += C * T::THREADS) {
      const int r = i / (T::BN / 4), c = (i % (T::BN / 4)) * 4;
      float4 v[kClusterMax];
#pragma unroll
      for (int s = 0; s < kClusterMax; ++s)
        if (s < C) v[s] = *slice_at(s, r, c);
      float4 tot = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll
      for (int s = 0; s < kClusterMax; ++s)
        if (s < C) {
          tot.x = __fadd_rn(tot.x, v[s].x);
          tot.y = __fadd_rn(tot.y, v[s].y);
          tot.z = __fadd_rn(tot.z, v[s].z);
          tot.w = __fadd_rn(tot.w, v[s].w);
        }
      const int col = n0 + c;
      const int64_t o_row = t.out_base + int64_t(row_begin + r) * p.os;
      if (col < p.N) store_tile_pair<kOutF32>(p, o_row, col, tot.x, tot.y);
      if (col + 2 < p.N) store_tile_pair<kOutF32>(p, o_row, col + 2, tot.z, tot.w);
    }
  };
  if (push) {
    const int quads = (row_end - row_begin) * (T::BN / 4);
    float* recv = part + T::BM * T::BN;  // [C][BM][BN]: slice s's sums pushed by block s
    cluster_wait();
    if (rank < owners && tid == 0)
      for (int s = 0; s < C; ++s) mbar_remote_arrive(dsmem_addr(xfree, uint32_t(s)));  // my ring is free
    __syncthreads();       // this block's slice sum (part) is complete
    mbar_wait_cluster(xfree, 0);   // every adding block's ring is free
    for (int i = tid; i < quads; i += T::THREADS) {
      const int r = i / (T::BN / 4), c = (i % (T::BN / 4)) * 4;
      const uint32_t owner = uint32_t((i / T::THREADS) % C);
      st_async_v4(dsmem_addr(smem_u32(recv + (rank * T::BM + r) * T::BN + c), owner),
                  *reinterpret_cast<const uint4*>(part + r * T::BN + c), dsmem_addr(xdata, owner));
    }
    // A block that adds nothing receives nothing but the adding blocks' arrivals on its barrier 1,
    // which it has waited for: it may leave (the adding blocks wait for their bytes).
    if (my_quads == 0) return;
    mbar_wait_cluster(xdata, 0);
    add_quads([&](int s, int r, int c) { return reinterpret_cast<const float4*>(recv + (s * T::BM + r) * T::BN + c); });
    return;
  }
  mark(5);
  cluster.sync();  // every block's slice sum is written and visible to the cluster
  mark(6);
  add_quads([&](int s, int r, int c) {
    return reinterpret_cast<const float4*>(cluster.map_shared_rank(part + r * T::BN + c, s));
  });
  if constexpr (kClocks) __syncthreads();  // (thread 0's mark after every adding thread's stores)
  mark(7);
  // The tail before the last cluster barrier: the others wait there for block 0 anyway (the
  // launch completes with its last block), so block 0 does not wait for them first.
  if constexpr (kTail)
    if (rank == 0) {  // (block 0 stored the whole output: at one row it adds every quad)
      __syncthreads();  // its threads' stores of the output, visible to the block
      tail(p);
    }
  cluster.sync();  // no block leaves while another may still read its shared memory
  mark(8);
  if constexpr (kClocks)
    if (tid == 0 && rank == 0) clk.flush(p.phase_clocks);
#else
  __trap();  // the host never launches it without sm_90 device code (gemm_cluster_probe_kernel)
#endif
}

template <class T, bool kOutF32, bool kPush = false, bool kClocks = false>
__global__ void __launch_bounds__(T::THREADS) gemm_cluster_kernel(const MmaGemmParams p) {
  gemm_cluster_body<T, kOutF32, kPush, NoSplitKTail, kClocks>(p, NoSplitKTail{});
}

}  // namespace atlas::cuda::kern
