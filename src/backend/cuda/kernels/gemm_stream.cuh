// Batch-invariant GEMM for at most 8 rows per tile (batch-1 decode: the routed experts' one row
// each, the dense projections' one row): the weights streamed through per-warp cp.async rings.
// Same numerics contract as kernels/gemm_mma.cuh (read it first), so the same bits as every
// other config.
//
// Why: at one row a GEMM is a read of the weight matrix, and the tiled kernels read it at 1.6-2.5
// TB/s of the H200's ~4.8 (session 12's profile: the routed experts' gate|up at 28 us on 616
// blocks of 16x32 tiles, 23% occupancy, 1.17 waves, so the last blocks ran on a GPU a sixth
// full). Here one block per SM (or two) owns an even share of the work, so every SM reads the
// same bytes and no wave quantisation is left, and no block barrier paces the copies.
//
// Work: a tile is 8 output rows (one m8 block of A: the m16n8k16 A fragment's upper half is
// zero) x 8 columns (one n8 block of W rows), the whole K; a step is one 256-wide K slice of a
// tile (4 KB of W, and the tile's x rows over the same k). Tiles are numbered as in find_tile
// (grouped: group after group, n-tiles innermost; dense: the raster, then the batch). Block b
// takes tiles [b * T / B, (b + 1) * T / B) of the T real tiles (grouped: counted on the device
// from the offsets, so the host's bound costs nothing) and its warps deal them round-robin; a
// warp walks its tiles' steps as one sequence, its ring (STAGES slots) refilled STAGES - 2 steps
// ahead across tile boundaries.
// A step's copies are bulk copies (the copy engine, one instruction per row: lanes 0-7 the
// weight rows, lanes 8-15 the tile's real x rows), completing on the slot's mbarrier, into rows
// padded to 528 bytes so the ldmatrix phases (8 rows at one chunk) are conflict free and every
// chunk's address is the lane's base plus a constant. One ldmatrix.x4 per chunk gives both
// operands' fragments: lanes 0-15 address the x rows (A), lanes 16-31 the weight rows (B).
// Rows that are not copied (x rows past the tile's, weight rows past N) hold stale data, which
// reaches only output rows and columns that are never stored (an mma output element depends on
// its own A row and B column alone). K % 16 == 0 (host-checked), so no chunk is partly past K.
// The warp computes two slices at a time: the contract's two chains (acc = +0, 16 chunk mma in
// order; chunks past K never issued) are independent, so their mma interleave, and the running
// total adds them in slice order.
// (Measured on the H200, session 13, Nsight on the LM head at M = 1: with the A fragments
// loaded from global memory by every lane the kernel issued ~770 instructions per 4 KB step and
// streamed at 2.1 TB/s, instruction-bound at two warps per scheduler; with 16-byte cp.async
// copies of both operands ~490, 2.8 TB/s. Dealing a tile's slices over several warps, parked in
// shared memory and folded by the last, was slower still: the fences drained the loads.)
// Dense problems prefetch their first weight slices into L2 before pdl_begin_gemm() (weights are never
// an earlier kernel's output, kernels/pdl.cuh); every copy into the ring comes after it, since it
// carries x rows too. Grouped ones wait first (the offsets are an earlier kernel's output).
// Async operands only (16-byte rows, K % 16 == 0); the host runs another config otherwise
// (same bits).
#pragma once

#include "gemm_tma.cuh"  // mbar_init, mbar_arrive_expect_tx, mbar_wait (sm_90a)

namespace atlas::cuda::kern {

template <int WARPS_, int STAGES_>
struct StreamTile {
  static constexpr int WARPS = WARPS_, STAGES = STAGES_;
  static constexpr int BM = 8, BN = 8;
  static constexpr int THREADS = 32 * WARPS;
  static constexpr int ROW = kSliceK + 8;  // bf16 elements of a padded slot row (528 bytes)
  static constexpr int SLOT = 2 * 8 * ROW;  // x rows [0, 8), then weight rows [8, 16)
  static constexpr int SMEM_BYTES = WARPS * STAGES * SLOT * 2;
  static_assert(kSliceK == 256, "a slot row is 32 chunks of 16 bytes");
  static_assert(STAGES >= 4, "two slots computed while two are refilled");
};

// 1 where this binary's device code has the stream kernel (sm_90a: bulk copies, mbarriers).
__global__ void gemm_stream_probe_kernel(int* out) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  *out = 1;
#else
  *out = 0;
#endif
}

// Grouped problems: the real tiles sum_g ceil(rows_g / BM) * n_tiles, rows clamped as find_tile
// clamps them (a corrupt table is find_tile's to flag). Warp-wide; every lane gets the answer.
template <int BM>
__device__ __forceinline__ int grouped_tile_count(const MmaGemmParams& p, int lane) {
  int tiles = 0;
  for (int g0 = 0; g0 < p.groups; g0 += 32) {
    const int g = g0 + lane;
    int t = 0;
    if (g < p.groups) {
      int lo = p.offsets[g], hi = p.offsets[g + 1];
      clamp_group_rows(p, lo, hi);
      t = (hi - lo + BM - 1) / BM;
    }
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) t += __shfl_xor_sync(0xffffffffu, t, off);
    tiles += t;
  }
  return tiles * p.n_tiles;
}

// One block's share of a persistent stream kernel's tiles: [first, last) of the problem's real
// tiles (grouped: counted on the device, after pdl_begin_gemm(); dense: p.tiles_total), dealt
// evenly over the grid. Both stream kernels (this file's and kernels/gemm_wgstream.cuh's).
struct StreamShare {
  int first, last;
};
// parts > 1: each tile is `parts` work items (the lean loop's K-split runs), dealt the same way.
template <int BM>
__device__ __forceinline__ StreamShare stream_share(const MmaGemmParams& p, int lane, int parts = 1) {
  const int total = (p.offsets != nullptr ? grouped_tile_count<BM>(p, lane) : p.tiles_total) * parts;
  return {int(int64_t(blockIdx.x) * total / gridDim.x), int(int64_t(blockIdx.x + 1) * total / gridDim.x)};
}

// The tile numbered pid (grouped: group after group, n-tiles innermost; dense: the raster, then
// the batch). False: none, or a bad table / weight find_tile flagged (thread `reporter` reports).
template <int BM>
__device__ __forceinline__ bool stream_tile(const MmaGemmParams& p, int pid, int reporter, int lane, TileSpot& t) {
  if (p.offsets != nullptr) return find_tile<BM, true>(p, pid, reporter, lane, t);
  const int per_batch = p.m_tiles * p.n_tiles;
  if (per_batch == p.tiles_total) return find_tile<BM, true>(p, pid, reporter, lane, t, 0);
  return find_tile<BM, true>(p, pid % per_batch, reporter, lane, t, pid / per_batch);
}

// One bulk copy of `bytes` from global src to shared address dst, completing on the mbarrier at
// bar; with h.on it carries h's L2 policy (kern::L2Hint).
__device__ __forceinline__ void bulk_copy_to_shared(uint32_t dst, const uint16_t* src, uint32_t bytes, uint32_t bar,
                                                    L2Hint h) {
  if (h.on)
    asm volatile(
        "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint [%0], [%1], %2, [%3], %4;\n" ::"r"(
            dst),
        "l"(src), "r"(bytes), "r"(bar), "l"(h.policy)
        : "memory");
  else
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(dst),
                 "l"(src), "r"(bytes), "r"(bar)
                 : "memory");
}

template <class T, bool kOutF32>
__global__ void __launch_bounds__(T::THREADS, 1) gemm_stream_kernel(const MmaGemmParams p) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  extern __shared__ __align__(128) unsigned char gemm_smem[];
  __shared__ __align__(8) uint64_t full_bars[T::WARPS][T::STAGES];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  uint16_t* ring = reinterpret_cast<uint16_t*>(gemm_smem) + warp * (T::STAGES * T::SLOT);
  const uint32_t ring_at = smem_u32(ring), bar0 = smem_u32(&full_bars[warp][0]);
  if (lane == 0) {
    for (int i = 0; i < T::STAGES; ++i) mbar_init(bar0 + 8u * uint32_t(i), 1);
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");  // visible to the copy engine
  }
  __syncwarp();
  const bool grouped = p.offsets != nullptr;
  if (grouped) pdl_begin_gemm();
  const auto [first, last] = stream_share<T::BM>(p, lane);
  const int K = p.K;
  const int KC = K / 16;
  const int S = (K + kSliceK - 1) / kSliceK;

  // The tile of pid (false: none; find_tile flags bad tables and weights, lane 0 reporting).
  const auto tile_of = [&](int pid, TileSpot& t) {
    return pid < last && stream_tile<T::BM>(p, pid, lane, lane, t);
  };

  // Issue side: the next step to copy (tile ipid, slice islice). Lane r < 8 holds weight row r
  // of the tile, lane 8 + r its x row r (null: not copied); rows = the rows copied per step.
  int ipid = first + warp, islice = 0, rows = 0;
  const uint16_t* src = nullptr;
  const auto begin_issue_tile = [&]() {
    TileSpot t;
    src = nullptr;
    if (tile_of(ipid, t)) {
      if (lane < 8) {
        const int64_t off = b_row_offset(p, t.n_tile * T::BN + lane);
        src = off >= 0 ? t.w + off : nullptr;
      } else if (lane < 16) {
        const int64_t off = a_row_offset(p, t.row_begin + lane - 8, t.row_end);
        src = off >= 0 ? t.x + off : nullptr;
      }
    } else {
      ipid = last;  // the issue side stops here, as the compute side does
    }
    rows = __popc(__ballot_sync(0xffffffffu, src != nullptr));
  };
  // This lane's destination row in a slot (bytes): x rows first, then weight rows.
  const uint32_t dst_row = uint32_t(((lane < 8 ? 8 : 0) + (lane & 7)) * T::ROW * 2);
  int issued = 0;  // steps copied so far: the next one's slot is issued % STAGES
  const L2Hint w_hint = l2_evict_first_hint(p.l2_evict_first > 0);
  const auto issue_step = [&]() {
    if (ipid >= last) return;
    const int slot = issued % T::STAGES;
    const int k0 = islice * kSliceK;
    const uint32_t bytes = uint32_t(min(kSliceK, K - k0)) * 2u;
    const uint32_t bar = bar0 + 8u * uint32_t(slot);
    if (lane == 0) mbar_arrive_expect_tx(bar, bytes * uint32_t(rows));
    if (src != nullptr) {
      // This lane's earlier reads of the slot (ldmatrix, generic proxy) before the copy's writes.
      asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
      const uint32_t dst = ring_at + uint32_t(slot * T::SLOT * 2) + dst_row;
      if (lane < 8 && w_hint.on)  // lanes 0-7 copy weight rows
        bulk_copy_to_shared(dst, src + k0, bytes, bar, w_hint);
      else
        bulk_copy_to_shared(dst, src + k0, bytes, bar, L2Hint{});
    }
    ++issued;
    if (++islice == S) {
      islice = 0;
      ipid += T::WARPS;
      begin_issue_tile();
    }
  };
  begin_issue_tile();
  if (!grouped) {
    // Dense: the first tile's weight slices into L2 while the kernel before this one finishes
    // (weights are never an earlier kernel's output); the x rows may be, so every copy into the
    // ring waits for pdl_begin_gemm().
    if (lane < 8 && src != nullptr) prefetch_l2(src, uint32_t(min(K, (T::STAGES - 2) * kSliceK)) * 2u);
    pdl_begin_gemm();
  }
  for (int i = 0; i < T::STAGES - 2; ++i) issue_step();

  // ldmatrix.x4 addresses: lanes 0-7 x rows 0-7 at k 0-7 of a chunk (a0a1), lanes 8-15 at k 8-15
  // (a2a3), lanes 16-23 weight rows 0-7 at k 0-7 (b0b1), lanes 24-31 at k 8-15 (b2b3).
  const uint32_t frag_at = ring_at + uint32_t(((lane >> 4) * 8 + (lane & 7)) * T::ROW * 2 + ((lane >> 3) & 1) * 16);
  const int gid = lane >> 2, tig = lane & 3;

  // Compute side: the same steps in pairs of slices (s, s + 1) of a tile (an odd S ends with a
  // single), each iteration issuing as many steps as it consumes, so the ring stays STAGES - 2
  // steps ahead.
  int done = 0;  // steps computed: the next one's slot is done % STAGES
  for (int pid = first + warp; pid < last; pid += T::WARPS) {
    TileSpot t;
    if (!tile_of(pid, t)) break;  // the issue side stopped at the same tile
    float tot0 = 0.0f, tot1 = 0.0f;  // row gid, columns 2 tig and 2 tig + 1 of the n8 tile
    for (int s = 0; s < S; s += 2) {
      const int c = min(2, S - s);
      __syncwarp();  // every lane is done reading the slots the next copies overwrite
      issue_step();
      if (c == 2) issue_step();
      const int slot0 = done % T::STAGES, slot1 = (done + 1) % T::STAGES;
      mbar_wait(bar0 + 8u * uint32_t(slot0), uint32_t(done / T::STAGES) & 1u);
      if (c == 2) mbar_wait(bar0 + 8u * uint32_t(slot1), uint32_t((done + 1) / T::STAGES) & 1u);
      const uint32_t at0 = frag_at + uint32_t(slot0 * T::SLOT * 2);
      const uint32_t at1 = frag_at + uint32_t(slot1 * T::SLOT * 2);
      const int live0 = min(kSliceChunks, KC - s * kSliceChunks);  // chunks of the slices inside K
      const int live1 = c == 2 ? min(kSliceChunks, KC - (s + 1) * kSliceChunks) : 0;
      float acc[2][4] = {{0.0f, 0.0f, 0.0f, 0.0f}, {0.0f, 0.0f, 0.0f, 0.0f}};
      // Chunk ch of slice s + h: both operands' fragments by one ldmatrix.x4, one mma.
      const auto chunk = [&](int ch, int h) {
        uint32_t f[4];
        ldmatrix_x4_at(f, (h == 0 ? at0 : at1) + uint32_t(ch * 32));
        const uint32_t a[4] = {f[0], 0u, f[1], 0u};
        mma_bf16_16816(acc[h], a, f[2], f[3]);
      };
      // Two whole slices (every full-K step): no per-chunk test. Kept as its own unrolled loop:
      // folding the test into one loop put a branch on every chunk (session 13 review, PTX).
      if (live0 == kSliceChunks && live1 == kSliceChunks) {
#pragma unroll
        for (int ch = 0; ch < kSliceChunks; ++ch)
#pragma unroll
          for (int h = 0; h < 2; ++h) chunk(ch, h);
      } else {
#pragma unroll
        for (int ch = 0; ch < kSliceChunks; ++ch)
#pragma unroll
          for (int h = 0; h < 2; ++h)
            if (ch < (h == 0 ? live0 : live1)) chunk(ch, h);  // warp-uniform: chunks past K are not in the contract
      }
      tot0 = __fadd_rn(tot0, acc[0][0]);
      tot1 = __fadd_rn(tot1, acc[0][1]);
      if (c == 2) {
        tot0 = __fadd_rn(tot0, acc[1][0]);
        tot1 = __fadd_rn(tot1, acc[1][1]);
      }
      done += c;
    }
    const int row = t.row_begin + gid;
    const int col = t.n_tile * T::BN + 2 * tig;
    if (row < t.row_end && col < p.N) store_tile_pair<kOutF32>(p, t.out_base + int64_t(row) * p.os, col, tot0, tot1);
  }
  // Every copy this warp issued was waited for (the compute side consumes each issued step), so
  // nothing is in flight when the block's shared memory is released.
#else
  __trap();  // the host never launches it without sm_90a device code (gemm_stream_probe_kernel)
#endif
}

}  // namespace atlas::cuda::kern
