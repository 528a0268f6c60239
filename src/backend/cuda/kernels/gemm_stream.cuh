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
// ahead across tile boundaries. Lane l copies 16-byte chunk l of each row (one warp instruction
// = one row's 512 contiguous bytes) into rows padded to 528 bytes, so the ldmatrix phases (8
// rows at one chunk) are conflict free and every chunk's address is the lane's base plus a
// constant. One ldmatrix.x4 per chunk gives both operands' fragments: lanes 0-15 address the x
// rows (A), lanes 16-31 the weight rows (B). Only the tile's real x rows are copied: the other
// rows of the slot hold stale data, which reaches only output rows that are never stored (an
// mma output row depends on its own A row alone).
// The warp computes two slices at a time: the contract's two chains (acc = +0, 16 chunk mma in
// order; chunks past K never issued) are independent, so their mma interleave, and the running
// total adds them in slice order.
// (Measured on the H200, session 13, Nsight: with the A fragments loaded from global memory by
// every lane the kernel issued ~770 instructions per 4 KB step and streamed at 2.1 TB/s,
// instruction-bound at two warps per scheduler; dealing a tile's slices over several warps,
// parked in shared memory and folded by the last, was slower still.)
// Dense problems copy their first steps before pdl_begin(): weights are never an earlier
// kernel's output (kernels/pdl.cuh). Grouped ones wait first (the offsets are).
// Async operands only (K % 8 == 0, 16-byte rows); the host runs another config otherwise
// (same bits).
#pragma once

#include "gemm_mma.cuh"

namespace atlas::cuda::kern {

template <int WARPS_, int STAGES_>
struct StreamTile {
  static constexpr int WARPS = WARPS_, STAGES = STAGES_;
  static constexpr int BM = 8, BN = 8;
  static constexpr int THREADS = 32 * WARPS;
  static constexpr int ROW = kSliceK + 8;  // bf16 elements of a padded slot row (528 bytes)
  static constexpr int SLOT = 2 * 8 * ROW;  // x rows [0, 8), then weight rows [8, 16)
  static constexpr int SMEM_BYTES = WARPS * STAGES * SLOT * 2;
  static_assert(kSliceK == 256, "a slot row is 32 chunks of 16 bytes: one per lane");
  static_assert(STAGES >= 4, "two slots computed while two are refilled");
};

// Grouped problems: the real tiles sum_g ceil(rows_g / BM) * n_tiles, with find_tile's clamping
// (a corrupt table is find_tile's to flag). Warp-wide; every lane gets the answer.
template <int BM>
__device__ __forceinline__ int64_t grouped_tile_count(const MmaGemmParams& p, int lane) {
  int64_t tiles = 0;
  for (int g0 = 0; g0 < p.groups; g0 += 32) {
    const int g = g0 + lane;
    int t = 0;
    if (g < p.groups) {
      const int lo = min(max(p.offsets[g], 0), p.max_rows);
      const int hi = min(max(p.offsets[g + 1], lo), p.max_rows);
      t = (hi - lo + BM - 1) / BM;
    }
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) t += __shfl_xor_sync(0xffffffffu, t, off);
    tiles += t;
  }
  return tiles * p.n_tiles;
}

template <class T, bool kOutF32>
__global__ void __launch_bounds__(T::THREADS, 1) gemm_stream_kernel(const MmaGemmParams p) {
  extern __shared__ __align__(128) unsigned char gemm_smem[];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  uint16_t* ring = reinterpret_cast<uint16_t*>(gemm_smem) + warp * (T::STAGES * T::SLOT);
  const bool grouped = p.offsets != nullptr;
  if (grouped) pdl_begin();
  const int64_t per_batch = int64_t(p.m_tiles) * p.n_tiles;  // dense
  const int64_t total = grouped ? grouped_tile_count<T::BM>(p, lane) : int64_t(p.tiles_total);
  const int64_t first = int64_t(blockIdx.x) * total / gridDim.x;
  const int64_t last = int64_t(blockIdx.x + 1) * total / gridDim.x;
  const int K = p.K;
  const int KC = (K + 15) / 16;
  const int S = (K + kSliceK - 1) / kSliceK;

  // The tile of pid (false: none; find_tile flags bad tables and weights, lane 0 reporting).
  const auto tile_of = [&](int64_t pid, TileSpot& t) {
    if (pid >= last) return false;
    if (grouped) return find_tile<T::BM, true>(p, int(pid), lane, lane, t);
    return find_tile<T::BM, true>(p, int(pid % per_batch), lane, lane, t, int(pid / per_batch));
  };

  // Issue side: the next step to copy (tile ipid, slice islice), its 8 weight rows and its
  // real x rows (xrows of them).
  int64_t ipid = first + warp;
  int islice = 0, xrows = 0;
  bool ilive = false;
  const uint16_t* wrow[T::BN];
  const uint16_t* xrow[T::BM];
  const auto begin_issue_tile = [&]() {
    TileSpot t;
    ilive = tile_of(ipid, t);
    if (!ilive) return;
    xrows = t.row_end - t.row_begin;
#pragma unroll
    for (int r = 0; r < T::BN; ++r) {
      const int64_t off = b_row_offset(p, t.n_tile * T::BN + r);
      wrow[r] = off >= 0 ? t.w + off : nullptr;
    }
#pragma unroll
    for (int r = 0; r < T::BM; ++r) {
      const int64_t off = a_row_offset(p, t.row_begin + r, t.row_end);
      xrow[r] = off >= 0 ? t.x + off : nullptr;
    }
  };
  int issued = 0;  // steps copied (or committed empty) so far: the next one's slot is issued % STAGES
  const uint32_t ring_at = smem_u32(ring) + uint32_t(lane) * 16u;
  const auto issue_step = [&]() {
    if (ilive) {
      const uint32_t slot = ring_at + uint32_t(issued % T::STAGES) * uint32_t(T::SLOT * 2);
      const int gk = islice * kSliceK + lane * 8;
      const bool in_k = gk < K;  // K % 8 == 0: a chunk is wholly inside K or outside (zeros)
#pragma unroll
      for (int r = 0; r < T::BM; ++r)
        if (r < xrows) {
          const bool ok = in_k && xrow[r] != nullptr;
          cp_async16_at(slot + uint32_t(r * T::ROW * 2), ok ? xrow[r] + gk : p.x, ok ? 16 : 0);
        }
#pragma unroll
      for (int r = 0; r < T::BN; ++r) {
        const bool ok = in_k && wrow[r] != nullptr;
        cp_async16_at(slot + uint32_t((8 + r) * T::ROW * 2), ok ? wrow[r] + gk : p.x, ok ? 16 : 0);
      }
      if (++islice == S) {
        islice = 0;
        ipid += T::WARPS;
        begin_issue_tile();
      }
    }
    cp_async_commit();  // empty past the last step: keeps the wait count below exact
    ++issued;
  };
  begin_issue_tile();
  for (int i = 0; i < T::STAGES - 2; ++i) issue_step();
  if (!grouped) pdl_begin();  // dense: the first copies (model weights) went out before the wait

  // ldmatrix.x4 addresses: lanes 0-7 x rows 0-7 at k 0-7 of a chunk (a0a1), lanes 8-15 at k 8-15
  // (a2a3), lanes 16-23 weight rows 0-7 at k 0-7 (b0b1), lanes 24-31 at k 8-15 (b2b3).
  const uint32_t frag_at =
      smem_u32(ring) + uint32_t(((lane >> 4) * 8 + (lane & 7)) * T::ROW * 2 + ((lane >> 3) & 1) * 16);
  const int gid = lane >> 2, tig = lane & 3;

  // Compute side: the same steps in pairs of slices (s, s + 1) of a tile (an odd S ends with a
  // single), each iteration issuing as many steps as it consumes, so the ring stays STAGES - 2
  // steps ahead and one wait count serves every iteration.
  int done = 0;  // steps computed: the next one's slot is done % STAGES
  for (int64_t pid = first + warp; pid < last; pid += T::WARPS) {
    TileSpot t;
    if (!tile_of(pid, t)) break;  // the issue side stopped at the same tile
    float tot0 = 0.0f, tot1 = 0.0f;  // row gid, columns 2 tig and 2 tig + 1 of the n8 tile
    for (int s = 0; s < S; s += 2) {
      const int c = min(2, S - s);
      __syncwarp();  // every lane is done reading the slots the next copies overwrite
      issue_step();
      if (c == 2) issue_step();
      cp_async_wait<T::STAGES - 2>();  // this pair's groups are complete (this lane's copies)
      __syncwarp();                    // ... and every lane's
      const uint32_t at0 = frag_at + uint32_t(done % T::STAGES) * uint32_t(T::SLOT * 2);
      const uint32_t at1 = frag_at + uint32_t((done + 1) % T::STAGES) * uint32_t(T::SLOT * 2);
      const int live0 = min(kSliceChunks, KC - s * kSliceChunks);  // chunks of the slices inside K
      const int live1 = c == 2 ? min(kSliceChunks, KC - (s + 1) * kSliceChunks) : 0;
      float acc[2][4] = {{0.0f, 0.0f, 0.0f, 0.0f}, {0.0f, 0.0f, 0.0f, 0.0f}};
#pragma unroll
      for (int ch = 0; ch < kSliceChunks; ++ch) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          if (ch < (h == 0 ? live0 : live1)) {  // warp-uniform: chunks past K are not in the contract
            uint32_t f[4];
            asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                         : "=r"(f[0]), "=r"(f[1]), "=r"(f[2]), "=r"(f[3])
                         : "r"((h == 0 ? at0 : at1) + uint32_t(ch * 32)));
            const uint32_t a[4] = {f[0], 0u, f[1], 0u};
            mma_bf16_16816(acc[h], a, f[2], f[3]);
          }
        }
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
  cp_async_wait<0>();  // nothing in flight when the block's shared memory is released
}

}  // namespace atlas::cuda::kern
