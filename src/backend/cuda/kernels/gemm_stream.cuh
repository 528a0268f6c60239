// Batch-invariant GEMM for at most 8 rows per tile (batch-1 decode: the routed experts' one row
// each, the dense projections' one row): the weights streamed through per-warp cp.async rings.
// Same numerics contract as kernels/gemm_mma.cuh (read it first), so the same bits as every
// other config.
//
// Why: at one row a GEMM is a read of the weight matrix, and the tiled kernels read it at 1.6-2.5
// TB/s of the H200's ~4.8 (session 12's profile: the routed experts' gate|up at 28 us on 616
// blocks of 16x32 tiles, 23% occupancy, 1.17 waves, so the last blocks ran on a GPU a sixth
// full). Here one block per SM owns an even share of the work, so every SM reads the same number
// of bytes and no wave quantisation is left, and each warp keeps STAGES - 1 K slices of its own
// weight rows in flight with no block barrier anywhere: a warp only waits for its own copies.
//
// Work: a warp tile is 8 output rows (one m8 block of A, the m16n8k16 A fragment's upper half
// zero) x 8 columns (one n8 block of W rows), the whole K. Tiles are numbered as in find_tile
// (grouped: group after group, n-tiles innermost; dense: the raster, then the batch), block b
// takes tiles [b * T / B, (b + 1) * T / B) of the T real tiles (grouped: counted on the device
// from the offsets, so the bound's empty tiles cost no block anything), and its warps deal them
// round-robin. A warp walks its tiles' K slices as one sequence of steps: its ring is refilled
// across tile boundaries, so the next tile's first slices are in flight while it finishes one.
//
// A step (one 256-wide K slice of the 8 W rows, 4 KB): lane l copies 16-byte chunk l of each
// row (one warp instruction = one row's 512 contiguous bytes), chunk index XOR-swizzled by the
// row so the ldmatrix reads are conflict free. The A fragments come straight from global memory
// (the few x rows are L1/L2 resident), loaded before the wait. Then the contract's slice:
// acc = +0, 16 chunk mma in order (chunks past K never issued), total += acc.
// Dense problems copy the first STAGES - 1 steps before pdl_begin(): weights are never an
// earlier kernel's output (see kernels/pdl.cuh). Grouped ones wait first (the offsets are).
// Async operands only (K % 8 == 0, 16-byte rows); the host runs another config otherwise.
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
  static_assert(STAGES >= 2, "the ring needs two slots at least");
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

  // The tile of pid (false: none; find_tile flags bad tables and weights). Lane 0 reports.
  const auto tile_of = [&](int64_t pid, TileSpot& t) {
    if (grouped) return find_tile<T::BM, true>(p, int(pid), lane, lane, t);
    return find_tile<T::BM, true>(p, int(pid % per_batch), lane, lane, t, int(pid / per_batch));
  };

  // Issue side: the next step to copy (tile ipid, slice islice) and its 8 weight rows.
  int64_t ipid = first + warp;
  int islice = 0;
  bool ilive = false;
  const uint16_t* irow[T::BN];
  const auto begin_issue_tile = [&]() {
    TileSpot t;
    ilive = ipid < last && tile_of(ipid, t);
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
  for (int i = 0; i < T::STAGES - 1; ++i) issue_step();
  if (!grouped) pdl_begin();  // dense: the first copies (model weights) went out before the wait

  // Compute side: the same sequence of steps, STAGES - 1 behind.
  const int gid = lane >> 2, tig = lane & 3;
  int step = 0;
  for (int64_t pid = first + warp; pid < last; pid += T::WARPS) {
    TileSpot t;
    if (!tile_of(pid, t)) break;  // the issue side stopped at the same tile
    const int64_t a_off = a_row_offset(p, t.row_begin + gid, t.row_end);
    const uint16_t* arow = a_off >= 0 ? t.x + a_off : nullptr;
    float tot0 = 0.0f, tot1 = 0.0f;  // row gid, columns 2 tig and 2 tig + 1 of the n8 tile
    for (int s = 0; s < S; ++s, ++step) {
      // A fragments of the slice (rows gid; rows gid + 8 are the zero upper half), then the
      // next step's copies, then this step's wait.
      uint32_t a0[kSliceChunks], a2[kSliceChunks];
#pragma unroll
      for (int c = 0; c < kSliceChunks; ++c) {
        const int k = (s * kSliceChunks + c) * 16 + 2 * tig;
        a0[c] = load_pair<true>(arow, k, K);
        a2[c] = load_pair<true>(arow, k + 8, K);
      }
      __syncwarp();  // every lane is done reading the slot the next copies overwrite
      issue_step();
      cp_async_wait<T::STAGES - 1>();  // this step's group is complete (this lane's copies)
      __syncwarp();                    // ... and every lane's
      const uint16_t* slot = ring + (step % T::STAGES) * T::SLOT;
      float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
      for (int c = 0; c < kSliceChunks; ++c) {
        if (s * kSliceChunks + c < KC) {  // warp-uniform: chunks past K are not part of the contract
          // lanes 0-7: rows 0-7 at k 0-7 (b0b1), lanes 8-15: rows 0-7 at k 8-15 (b2b3).
          const int r = lane & 7;
          const int ch = 2 * c + ((lane >> 3) & 1);
          uint32_t b0, b1;
          ldmatrix_x2(b0, b1, slot + r * kSliceK + ((ch ^ r) * 8));
          const uint32_t a[4] = {a0[c], 0u, a2[c], 0u};
          mma_bf16_16816(acc, a, b0, b1);
        }
      }
      tot0 = __fadd_rn(tot0, acc[0]);
      tot1 = __fadd_rn(tot1, acc[1]);
    }
    const int row = t.row_begin + gid;
    const int col = t.n_tile * T::BN + 2 * tig;
    if (row < t.row_end && col < p.N) store_tile_pair<kOutF32>(p, t.out_base + int64_t(row) * p.os, col, tot0, tot1);
  }
  cp_async_wait<0>();  // nothing in flight when the block's shared memory is released
}

}  // namespace atlas::cuda::kern
