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
// tile (4 KB of W). Tiles are numbered as in find_tile (grouped: group after group, n-tiles
// innermost; dense: the raster, then the batch). Block b takes tiles [b * T / B, (b + 1) * T / B)
// of the T real tiles (grouped: counted on the device from the offsets, so the host's bound
// costs nothing) and its warps deal them round-robin; a warp walks its tiles' steps as one
// sequence, its ring (STAGES slots) refilled STAGES - 2 steps ahead across tile boundaries.
// Lane l copies 16-byte chunk l of each of the 8 rows (one warp instruction = one row's 512
// contiguous bytes), the chunk index XOR-swizzled by the row so ldmatrix reads are conflict
// free. The warp computes two slices at a time: the contract's two chains (acc = +0, 16 chunk
// mma in order; chunks past K never issued) are independent, so their mma interleave, and the
// running total adds them in slice order. The A fragments (the tile's x rows, L1/L2 resident)
// come from global memory one pair of slices ahead, into registers.
// (Measured on the H200, session 13: one slice at a time, A loaded in the step that uses it, ran
// at 0.5-2.3 TB/s: each 4 KB waited for its A loads and a chain of 16 dependent mma. Dealing a
// tile's slices over several warps, parked in shared memory and folded by the last, was slower
// still: the fences of the hand-over drained each warp's loads.)
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
  static constexpr int SLOT = BN * kSliceK;  // bf16 elements of one ring slot (4 KB)
  static constexpr int SMEM_BYTES = WARPS * STAGES * SLOT * 2;
  static_assert(kSliceK == 256, "a slot row is 32 chunks of 16 bytes: one per lane");
  static_assert(STAGES >= 4, "two slots computed while two are refilled, and one step ahead at least");
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

// The A fragments of slices s and s + 1 (those < S) of the x row at `arow` (null: zeros): the
// lane's pairs at k = 16 c + 2 tig and + 8 of every chunk c.
__device__ __forceinline__ void stream_load_a(const uint16_t* arow, int s, int S, int K, int tig,
                                              uint32_t (&a0)[2][kSliceChunks], uint32_t (&a2)[2][kSliceChunks]) {
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const uint16_t* row = s + h < S ? arow : nullptr;
#pragma unroll
    for (int c = 0; c < kSliceChunks; ++c) {
      const int k = ((s + h) * kSliceChunks + c) * 16 + 2 * tig;
      a0[h][c] = load_pair<true>(row, k, K);
      a2[h][c] = load_pair<true>(row, k + 8, K);
    }
  }
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
  const int gid = lane >> 2, tig = lane & 3;
  // The tile's x row for this lane's fragment row gid (null: a zero row).
  const auto a_row = [&](const TileSpot& t) -> const uint16_t* {
    const int64_t off = a_row_offset(p, t.row_begin + gid, t.row_end);
    return off >= 0 ? t.x + off : nullptr;
  };

  // Issue side: the next step to copy (tile ipid, slice islice) and its 8 weight rows.
  int64_t ipid = first + warp;
  int islice = 0;
  bool ilive = false;
  const uint16_t* irow[T::BN];
  const auto begin_issue_tile = [&]() {
    TileSpot t;
    ilive = tile_of(ipid, t);
    if (!ilive) return;
#pragma unroll
    for (int r = 0; r < T::BN; ++r) {
      const int64_t off = b_row_offset(p, t.n_tile * T::BN + r);
      irow[r] = off >= 0 ? t.w + off : nullptr;
    }
  };
  int issued = 0;  // steps copied (or committed empty) so far: the next one's slot is issued % STAGES
  const auto issue_step = [&]() {
    if (ilive) {
      uint16_t* slot = ring + (issued % T::STAGES) * T::SLOT;
      const int gk = islice * kSliceK + lane * 8;
#pragma unroll
      for (int r = 0; r < T::BN; ++r) {
        const bool ok = irow[r] != nullptr && gk < K;
        cp_async16(slot + r * kSliceK + ((lane ^ r) * 8), ok ? irow[r] + gk : p.x, ok ? 16 : 0);
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

  // Compute side: the same steps in pairs of slices (s, s + 1) of a tile (an odd S ends with a
  // single), each iteration issuing as many steps as it consumes, so the ring stays STAGES - 2
  // steps ahead and one wait count serves every iteration.
  uint32_t a0[2][kSliceChunks], a2[2][kSliceChunks], n0[2][kSliceChunks], n2[2][kSliceChunks];
  {
    TileSpot t;
    stream_load_a(tile_of(first + warp, t) ? a_row(t) : nullptr, 0, S, K, tig, a0, a2);
  }
  int done = 0;  // steps computed: the next one's slot is done % STAGES
  for (int64_t pid = first + warp; pid < last; pid += T::WARPS) {
    TileSpot t;
    if (!tile_of(pid, t)) break;  // the issue side stopped at the same tile
    float tot0 = 0.0f, tot1 = 0.0f;  // row gid, columns 2 tig and 2 tig + 1 of the n8 tile
    for (int s = 0; s < S; s += 2) {
      const int c = min(2, S - s);
      {  // the next pair's A fragments, in flight during this pair
        TileSpot tn;
        const bool same = s + 2 < S;
        const uint16_t* arow = same ? a_row(t) : tile_of(pid + T::WARPS, tn) ? a_row(tn) : nullptr;
        stream_load_a(arow, same ? s + 2 : 0, S, K, tig, n0, n2);
      }
      __syncwarp();  // every lane is done reading the slots the next copies overwrite
      issue_step();
      if (c == 2) issue_step();
      cp_async_wait<T::STAGES - 2>();  // this pair's groups are complete (this lane's copies)
      __syncwarp();                    // ... and every lane's
      const uint16_t* slot0 = ring + (done % T::STAGES) * T::SLOT;
      const uint16_t* slot1 = ring + ((done + 1) % T::STAGES) * T::SLOT;
      float acc[2][4] = {{0.0f, 0.0f, 0.0f, 0.0f}, {0.0f, 0.0f, 0.0f, 0.0f}};
#pragma unroll
      for (int ch = 0; ch < kSliceChunks; ++ch) {
        // lanes 0-7: rows 0-7 at k 0-7 (b0b1), lanes 8-15: rows 0-7 at k 8-15 (b2b3).
        const int r = lane & 7;
        const int q = 2 * ch + ((lane >> 3) & 1);
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          if (h < c && (s + h) * kSliceChunks + ch < KC) {  // warp-uniform: chunks past K are not in the contract
            uint32_t b0, b1;
            ldmatrix_x2(b0, b1, (h == 0 ? slot0 : slot1) + r * kSliceK + ((q ^ r) * 8));
            const uint32_t a[4] = {a0[h][ch], 0u, a2[h][ch], 0u};
            mma_bf16_16816(acc[h], a, b0, b1);
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
#pragma unroll
      for (int h = 0; h < 2; ++h)
#pragma unroll
        for (int ch = 0; ch < kSliceChunks; ++ch) {
          a0[h][ch] = n0[h][ch];
          a2[h][ch] = n2[h][ch];
        }
    }
    const int row = t.row_begin + gid;
    const int col = t.n_tile * T::BN + 2 * tig;
    if (row < t.row_end && col < p.N) store_tile_pair<kOutF32>(p, t.out_base + int64_t(row) * p.os, col, tot0, tot1);
  }
  cp_async_wait<0>();  // nothing in flight when the block's shared memory is released
}

}  // namespace atlas::cuda::kern
