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
// zero) x 8 columns (one n8 block of W rows); a step is one 256-wide K slice of a tile (4 KB of
// W). Tiles are numbered as in find_tile (grouped: group after group, n-tiles innermost; dense:
// the raster, then the batch). Block b takes tiles [b * T / B, (b + 1) * T / B) of the T real
// tiles (grouped: counted on the device from the offsets, so the host's bound costs nothing),
// and its warps deal the block's steps round-robin: warp w runs steps w, w + WARPS, ..., so the
// slices of one tile run on different warps at once. (Session 13's first version gave each warp
// whole tiles: every slice then waited for the one before it, a chain of 16 dependent mma plus
// the A loads per 4 KB, and the kernel ran at 0.5-2.3 TB/s.)
//
// A warp's steps: its ring (STAGES slots of 8 W rows x 256 k) is refilled STAGES - 1 steps
// ahead; lane l copies 16-byte chunk l of each row (one warp instruction = one row's 512
// contiguous bytes), the chunk index XOR-swizzled by the row so ldmatrix reads are conflict
// free. The A fragments (the tile's x rows, L1/L2 resident) are loaded from global memory one
// step ahead, into registers. A step is the contract's slice: acc = +0, 16 chunk mma in order
// (chunks past K never issued); its sums are parked in shared memory (NT tile slots x up to
// kStreamMaxSlices slices), and the warp whose step completes a tile's set (a shared counter)
// adds the parked sums in slice order from +0 and stores the tile: the contract's running total.
// A warp about to park into a tile slot first waits until the slot's previous tile is folded;
// that tile's steps are all earlier steps, so the wait always ends.
// Dense problems copy their first steps before pdl_begin(): weights are never an earlier
// kernel's output (kernels/pdl.cuh). Grouped ones wait first (the offsets are).
// Async operands only (K % 8 == 0, 16-byte rows) and K <= kStreamMaxSlices slices; the host
// runs another config otherwise (same bits).
#pragma once

#include "gemm_mma.cuh"

namespace atlas::cuda::kern {

constexpr int kStreamMaxSlices = 16;  // K <= 4096

template <int WARPS_, int STAGES_, int NT_>
struct StreamTile {
  static constexpr int WARPS = WARPS_, STAGES = STAGES_, NT = NT_;
  static constexpr int BM = 8, BN = 8;
  static constexpr int THREADS = 32 * WARPS;
  static constexpr int SLOT = BN * kSliceK;        // bf16 elements of one ring slot (4 KB)
  static constexpr int PARK = kStreamMaxSlices * BM * BN;  // floats of one tile slot
  static constexpr int SMEM_BYTES = WARPS * STAGES * SLOT * 2 + NT * PARK * 4;
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
  __shared__ int park_count[T::NT];   // steps parked in each tile slot
  __shared__ int park_folded[T::NT];  // the last local tile folded out of each slot
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  uint16_t* ring = reinterpret_cast<uint16_t*>(gemm_smem) + warp * (T::STAGES * T::SLOT);
  float* park = reinterpret_cast<float*>(gemm_smem + T::WARPS * T::STAGES * T::SLOT * 2);
  if (threadIdx.x < T::NT) {
    park_count[threadIdx.x] = 0;
    park_folded[threadIdx.x] = int(threadIdx.x) - T::NT;  // "tile slot - NT": the slot is free
  }
  const bool grouped = p.offsets != nullptr;
  if (grouped) pdl_begin();
  const int64_t per_batch = int64_t(p.m_tiles) * p.n_tiles;  // dense
  const int64_t total = grouped ? grouped_tile_count<T::BM>(p, lane) : int64_t(p.tiles_total);
  const int64_t first = int64_t(blockIdx.x) * total / gridDim.x;
  const int tiles = int(int64_t(blockIdx.x + 1) * total / gridDim.x - first);
  const int K = p.K;
  const int KC = (K + 15) / 16;
  const int S = (K + kSliceK - 1) / kSliceK;
  const int steps = tiles * S;

  // The tile of local tile i (false: none; find_tile flags bad tables and weights, lane 0 of
  // the warp that meets them reporting).
  const auto tile_of = [&](int i, TileSpot& t) {
    const int64_t pid = first + i;
    if (grouped) return find_tile<T::BM, true>(p, int(pid), lane, lane, t);
    return find_tile<T::BM, true>(p, int(pid % per_batch), lane, lane, t, int(pid / per_batch));
  };

  // Issue side: this warp's next step to copy.
  int istep = warp, issued = 0;
  const auto issue_step = [&]() {
    TileSpot t;
    if (istep < steps && tile_of(istep / S, t)) {
      uint16_t* slot = ring + (issued % T::STAGES) * T::SLOT;
      const int gk = (istep % S) * kSliceK + lane * 8;
#pragma unroll
      for (int r = 0; r < T::BN; ++r) {
        const int64_t off = b_row_offset(p, t.n_tile * T::BN + r);
        const bool ok = off >= 0 && gk < K;
        cp_async16(slot + r * kSliceK + ((lane ^ r) * 8), ok ? t.w + off + gk : p.x, ok ? 16 : 0);
      }
    }
    cp_async_commit();  // empty past the last step: keeps the wait count below exact
    istep += T::WARPS;
    ++issued;
  };
  for (int i = 0; i < T::STAGES - 1; ++i) issue_step();
  if (!grouped) pdl_begin();  // dense: the first copies (model weights) went out before the wait
  __syncthreads();            // the park counters are initialised

  // A fragments of step j (rows gid of its tile; rows gid + 8 are the zero upper half).
  const int gid = lane >> 2, tig = lane & 3;
  const auto load_a = [&](int j, uint32_t (&a0)[kSliceChunks], uint32_t (&a2)[kSliceChunks]) {
    TileSpot t;
    const uint16_t* arow = nullptr;
    if (j < steps && tile_of(j / S, t)) {
      const int64_t off = a_row_offset(p, t.row_begin + gid, t.row_end);
      arow = off >= 0 ? t.x + off : nullptr;
    }
#pragma unroll
    for (int c = 0; c < kSliceChunks; ++c) {
      const int k = ((j % S) * kSliceChunks + c) * 16 + 2 * tig;
      a0[c] = load_pair<true>(arow, k, K);
      a2[c] = load_pair<true>(arow, k + 8, K);
    }
  };
  uint32_t a0[kSliceChunks], a2[kSliceChunks], n0[kSliceChunks], n2[kSliceChunks];
  load_a(warp, a0, a2);

  int done = 0;  // steps computed: the ring slot of the current one is done % STAGES
  for (int j = warp; j < steps; j += T::WARPS, ++done) {
    const int tile = j / S, s = j % S;
    load_a(j + T::WARPS, n0, n2);  // the next step's, in flight during this one
    __syncwarp();                  // every lane is done reading the slot the next copies overwrite
    issue_step();
    cp_async_wait<T::STAGES - 1>();  // this step's group is complete (this lane's copies)
    __syncwarp();                    // ... and every lane's
    // No tile (find_tile flagged a bad table or weight): the step still parks and counts, so
    // no warp waits on a slot forever, but nothing is stored.
    TileSpot t;
    const bool live = tile_of(tile, t);
    const uint16_t* slot = ring + (done % T::STAGES) * T::SLOT;
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
#pragma unroll
    for (int c = 0; c < kSliceChunks; ++c) {
      a0[c] = n0[c];
      a2[c] = n2[c];
    }

    // Park the slice sum (row gid, columns 2 tig, 2 tig + 1), once the slot's last tile is out.
    const int ts = tile % T::NT;
    float* tp = park + ts * T::PARK;
    while (*reinterpret_cast<volatile int*>(&park_folded[ts]) != tile - T::NT) {
    }
    __threadfence_block();
    *reinterpret_cast<float2*>(tp + s * (T::BM * T::BN) + gid * T::BN + 2 * tig) = make_float2(acc[0], acc[1]);
    __threadfence_block();
    __syncwarp();
    int before = 0;
    if (lane == 0) before = atomicAdd(&park_count[ts], 1);
    before = __shfl_sync(0xffffffffu, before, 0);
    if (before == S - 1) {
      // The tile's last step: total = +0, + slice 0, + slice 1, ... (lane = row gid, columns 2 tig..).
      __threadfence_block();
      float tot0 = 0.0f, tot1 = 0.0f;
      for (int q = 0; q < S; ++q) {
        const float2 v = *reinterpret_cast<const float2*>(tp + q * (T::BM * T::BN) + gid * T::BN + 2 * tig);
        tot0 = __fadd_rn(tot0, v.x);
        tot1 = __fadd_rn(tot1, v.y);
      }
      const int row = t.row_begin + gid;
      const int col = t.n_tile * T::BN + 2 * tig;
      if (live && row < t.row_end && col < p.N)
        store_tile_pair<kOutF32>(p, t.out_base + int64_t(row) * p.os, col, tot0, tot1);
      __syncwarp();  // every lane has read the slot
      if (lane == 0) {
        park_count[ts] = 0;
        __threadfence_block();
        *reinterpret_cast<volatile int*>(&park_folded[ts]) = tile;
      }
    }
  }
  cp_async_wait<0>();  // nothing in flight when the block's shared memory is released
}

}  // namespace atlas::cuda::kern
