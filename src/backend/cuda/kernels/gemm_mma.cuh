// Batch-invariant tensor-core GEMM: out[m][n] = sum_k x[m][k] * w[n][k], bf16 in, fp32 accumulate.
//
// Numerics contract (docs/cuda.md, "GEMM, batch-invariant"), per output element (m, n), with the
// fixed slice width S = kSliceK = 256 (a constant: never derived from M, N, the tile or the grid):
//   total = +0 (fp32)
//   for s = 0 .. ceil(K/S)-1, ascending:                       (K slices [S*s, min(S*s+S, K)))
//     acc = +0 (fp32)
//     for c = 16s .. min(16s+16, ceil(K/16))-1, ascending:     (chunks past K are never issued)
//       acc = mma.m16n8k16.row.col.f32.bf16.bf16.f32(A chunk c, B chunk c, acc)
//     total = total + acc                                      (one fp32 add, round to nearest)
//   out = total (fp32 out) or bf16(total) (one rounding, nearest even)
// where A chunk c is x[m][16c .. 16c+15] and B chunk c is w[n][16c .. 16c+15], elements past K
// read as 0, always in the standard fragment positions (k = 16c + j in fragment position j).
// Nothing of M, N, the tile or the grid enters that sequence: a row's value depends on its own
// x row, the w column and K alone. So every configuration below gives the same bits and
// configurations may be chosen by M, and the grouped (MoE) and strided-batch forms run this
// same code. The slices are what allow split-K without breaking invariance: the small-M kernel
// (gemm_splitk_kernel) has several warps stream different slices of the same columns and adds
// their sums in slice order; the tiled kernel keeps a running total and adds each finished
// slice into it.
//
// Tiled kernel (gemm_mma_kernel): a block computes a BM x BN output tile with WARPS_M x WARPS_N
// warps (each WM x WN, made of MI x NI m16n8 accumulators). K is staged through shared memory in
// BK-wide steps (BK divides S) by a STAGES-deep cp.async ring (16-byte copies, zero-fill for rows
// / k past the edge), rows of BK bf16 with the 16-byte chunks XOR-swizzled so ldmatrix and the
// copies are bank-conflict free. kAsync = false is the predicated slow path for operands that are
// not 16-byte aligned or K not a multiple of 8 (tiny test models, odd slices): plain loads
// element by element, same smem layout, same fragments, same chunk sequence, so the same bits.
//
// Split-K kernel (gemm_splitk_kernel, tiles of 16 rows, for M <= 16 and decode-sized expert
// groups): KW warps per block, warp j takes slices j, j + KW, j + 2 KW, ... of the block's 8*NI
// columns. A warp loads a whole slice's fragments straight from global memory into registers
// (all loads issued before the first mma: 16 chunks of W per column in flight per warp), runs
// the slice's 16 mma per n8 tile, and parks the slice sum in shared memory; after each round of
// KW slices one thread per output element adds the parked sums into its running total in slice
// order. That gives KW-way K parallelism and KW x 16 independent chunks of W in flight per
// column group, where the tiled kernel had one serial chain of ceil(K/16) mma per accumulator.
#pragma once

#include <type_traits>

#include <cstdint>

#include "block_stamp.cuh"
#include "common.cuh"

namespace atlas::cuda::kern {

// Device error bits raised by the GEMM kernels (decoded in runtime.cu's check_device_errors).
constexpr int kErrGroupedOffsets = 16;  // offsets not 0 = o[0] <= o[1] <= ... <= o[groups] <= max_rows
constexpr int kErrGatherRows = 32;      // an x_rows entry outside [0, x_rows_limit) (or negative)
constexpr int kErrGroupWeight = 64;     // a group's weight pointer null or not 16-byte aligned

// The contract's K slice width (elements): slices of 16 chunks. A constant of the contract:
// changing it changes the bits of every batch_invariant GEMM.
constexpr int kSliceK = 256;
constexpr int kSliceChunks = kSliceK / 16;

// AROWS: the rows of x a ring slot holds (BM; or 8 for the whole-steps loop of kLean == 3, whose
// tiles hold at most 8 rows: the A fragment's rows 8-15 are zero registers, so a slot is 8 rows
// smaller and the ring one slot deeper in the same shared memory).
template <int BM_, int BN_, int BK_, int WARPS_M_, int WARPS_N_, int STAGES_, int AROWS_ = BM_>
struct MmaTile {
  static constexpr int BM = BM_, BN = BN_, BK = BK_, WARPS_M = WARPS_M_, WARPS_N = WARPS_N_;
  static constexpr int STAGES = STAGES_, AROWS = AROWS_;
  static constexpr int THREADS = 32 * WARPS_M * WARPS_N;
  static constexpr int WM = BM / WARPS_M, WN = BN / WARPS_N;
  static constexpr int MI = WM / 16, NI = WN / 8;
  static constexpr int CH = BK / 8;  // 16-byte chunks per shared-memory row
  static constexpr int SMEM_BYTES = STAGES * (AROWS + BN) * BK * 2;
  static_assert(AROWS == BM || (AROWS == 8 && BM == 16 && WARPS_M == 1), "8-row slots: one m16 block of 8 rows");
  static_assert(WM % 16 == 0 && WN % 8 == 0, "warp tile must be whole m16n8 tiles");
  static_assert(NI == 1 || NI % 2 == 0, "B fragments load n8 tiles in pairs (or one)");
  static_assert(BK == 32 || BK == 64 || BK == 128, "swizzle defined for 4, 8 or 16 chunks per row");
  static_assert(STAGES >= 2, "pipeline needs two stages at least");
  static_assert(kSliceK % BK == 0, "a K slice must be whole BK steps");
};

// Split-K small-M tile: 16 rows x 8*NI columns, KW warps on different K slices.
template <int NI_, int KW_>
struct SplitKTile {
  static constexpr int BM = 16, NI = NI_, BN = 8 * NI_, KW = KW_;
  static constexpr int THREADS = 32 * KW;
  static constexpr int SMEM_BYTES = 0;  // static shared memory only
  static constexpr int ELEMS = (BM * BN + THREADS - 1) / THREADS;  // reduced outputs per thread
};

// Everything a launch needs; one struct for dense, strided-batch and grouped problems.
struct MmaGemmParams {
  const uint16_t* x = nullptr;
  const uint16_t* w = nullptr;                 // dense / batched weight
  void* out = nullptr;
  const uint16_t* const* w_groups = nullptr;   // grouped: per-group weights (device array)
  const int32_t* offsets = nullptr;            // grouped: [groups + 1] (device); null = dense
  const int32_t* x_rows = nullptr;             // grouped: optional gather (device)
  int64_t xs = 0, ws = 0, os = 0;              // row strides, elements
  int64_t x_bs = 0, w_bs = 0, o_bs = 0;        // batch strides, elements (blockIdx.z)
  int64_t x_rows_limit = 0;                    // > 0: bound checked on x_rows entries
  int M = 0, N = 0, K = 0;                     // dense: M rows per batch; grouped: M unused
  int m_tiles = 0, n_tiles = 0;                // dense: tiles per batch; grouped: y tiles bound
  int groups = 0, max_rows = 0;
  int* error_flag = nullptr;
  int pair_store = 0;                          // out pointer/strides allow 2-element stores
  int64_t slice_stride = 0;                    // > 0: sliced launch (below), elements between slices
  int gated = 0;                               // > 0: fused gate|up + SiLU (below); bf16 out only
  int prefetch = 0;                            // > 0: dense weights into L2 before pdl_begin (below)
  int cluster_early = 0;                       // > 0 (with prefetch > 1): the cluster kernel stages its weights early
  int l2_evict_first = 0;                      // > 0: weight copies carry an L2 evict_first policy (common.cuh)
  // Grouped problems on the TMA kernel (kernels/gemm_tma.cuh): its tensor map reads group g's
  // weight at w_group_base + g * w_group_stride (elements); the kernel checks that w_groups[g]
  // is that address (device error "w" otherwise).
  const uint16_t* w_group_base = nullptr;
  int64_t w_group_stride = 0;
  // The TMA kernel's tiles in all (dense: m_tiles * n_tiles per batch entry, batch entries one
  // after the other; grouped: the host's bound): a block walks pids blockIdx.x + i * gridDim.x.
  int tiles_total = 0;
  // The lean wgmma stream loop split over K (gemm_wgstream_lean_kernel, kParts > 1): fp32 slice
  // sums [tiles_total][slices][128 threads][4] and one arrival counter per tile (zero between
  // launches: the tile's last block resets it).
  float* split_ws = nullptr;
  int* split_cnt = nullptr;
  // The next GEMM's weights into L2 part of the way through this launch (session 33; a hint,
  // never bits; the lean stream kernel only, lean_prefetch_next in gemm_wgstream.cuh): next_bytes
  // (a multiple of 128) of next_w (dense), or of next_w_groups[g] for each group with rows
  // (grouped, groups <= kNextMaxGroups), at step (steps * next_at) / 4 of each block's loop
  // (4: after it); next_at -1: none.
  const void* next_w = nullptr;
  const uint16_t* const* next_w_groups = nullptr;
  int64_t next_bytes = 0;
  int next_at = -1;
  // One token's routing done again by every block of the grouped gate|up (session 39,
  // ATLAS_MOE_SELF_ROUTE; the lean stream kernel's kRoute instantiation only, picked by the
  // launcher where route_logits is set): route_logits [groups] fp32 are the router's logits of
  // the one token, route_k its top-k, route_norm / route_scaling the weights' rule. The offsets
  // and x_rows arrays stay the routing kernel's (the down and the combine read them); this
  // launch finds the same table itself (the same device code: the same integers) instead of
  // waiting for that kernel to end. Other kernels ignore these fields.
  const float* route_logits = nullptr;
  int route_k = 0, route_norm = 0;
  float route_scaling = 0.f;
  // The cluster kernel's clocked instantiation only (ATLAS_PHASE_CLOCKS=cluster_gemm,
  // kernels/phase_clock.cuh; session 41): the sums of its phases' clocks.
  unsigned long long* phase_clocks = nullptr;
};
constexpr int kNextMaxGroups = 256;

// A GEMM block's stamp (the kStamp instantiations, kernels/block_stamp.cuh): the launch's weight
// (dense w, grouped w_groups) as its site, a grouped launch's kind marked.
template <bool kOn>
__device__ __forceinline__ BlockStampScope<kOn> gemm_block_stamp(const MmaGemmParams& p, int kind) {
  const bool grouped = p.offsets != nullptr;
  return BlockStampScope<kOn>(grouped ? static_cast<const void*>(p.w_groups) : p.w, p.N, p.K,
                              kind + (grouped ? kBlockStampGrouped : 0));
}
// Fused gate|up (gated = I > 0, N = 2I): tile column n is weight row n / 2 (gate) for even n and
// row I + n / 2 (up) for odd n, so a thread's column pair (2j, 2j+1) holds gate j and up j of a
// row; the epilogue writes out[row][j] = bf16(bf16(silu(bf16 gate)) * bf16 up) (os: out's row
// stride) instead of the pair: the bits of the GEMM into [rows, 2I] followed by
// silu_gate_kernel, one launch and no [rows, 2I] round trip. Only the table-driven kernels
// (tiled mma, wgmma, cluster) take it; the host runs the other configs unfused.
// Sliced launch (dense with one problem, or grouped): blockIdx.y = K slice s; the block computes only slice s's
// sum for its tile and writes it as fp32 to out + s * slice_stride; gemm_slice_reduce_kernel then
// adds the slices in ascending order starting from +0, which is the contract's running total
// exactly. Used where a problem has too few tiles to occupy the GPU (decode-sized M, a decode
// step's few expert rows): K parallelism across blocks, same bits.

// Dense raster: kRasterGroup consecutive m-tiles walk the n-tiles together, so a W tile is
// reused from L2 by several m-tiles (large-M prefill). Affects timing only, never bits.
constexpr int kRasterGroup = 8;

// XOR swizzle of the 16-byte chunk index c in row r: the 8 rows an ldmatrix phase reads (and
// the 8 chunks of a 128-byte line the copies write) land in 8 distinct 16-byte bank groups.
template <int CH>
__device__ __forceinline__ int swz(int r, int c) {
  if constexpr (CH == 4)
    return c ^ ((r >> 1) & 3);  // 64-byte rows: two rows per 128-byte line
  else
    return c ^ (r & 7);  // 128- or 256-byte rows
}

// `at`: an address in the shared window (smem_u32).
__device__ __forceinline__ void ldmatrix_x4_at(uint32_t (&r)[4], uint32_t at) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(at));
}
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const void* p) { ldmatrix_x4_at(r, smem_u32(p)); }
__device__ __forceinline__ void ldmatrix_x2_at(uint32_t& r0, uint32_t& r1, uint32_t at) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0,%1}, [%2];\n" : "=r"(r0), "=r"(r1) : "r"(at));
}
__device__ __forceinline__ void ldmatrix_x2(uint32_t& r0, uint32_t& r1, const void* p) {
  ldmatrix_x2_at(r0, r1, smem_u32(p));
}

// D = A(16x16, row) * B(16x8, col) + D, fp32 accumulators (the contract's only arithmetic).
__device__ __forceinline__ void mma_bf16_16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// One 16-byte chunk (8 bf16 at k = gk..gk+7) of the row at element offset `off` (< 0: a zero
// row) into shared memory. kAsync requires K % 8 == 0 and 16-byte aligned rows, so a chunk is
// either wholly inside K or wholly outside.
template <bool kAsync>
__device__ __forceinline__ void load_chunk(uint16_t* dst, const uint16_t* base, int64_t off, int gk, int K,
                                           L2Hint hint = {}) {
  if constexpr (kAsync) {
    const bool ok = off >= 0 && gk < K;
    cp_async16_at(smem_u32(dst), ok ? base + off + gk : base, ok ? 16 : 0, hint);
  } else {
    uint32_t v[4];
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int k = gk + 2 * j;
      const uint32_t lo = (off >= 0 && k < K) ? base[off + k] : 0u;
      const uint32_t hi = (off >= 0 && k + 1 < K) ? base[off + k + 1] : 0u;
      v[j] = lo | (hi << 16);
    }
    *reinterpret_cast<uint4*>(dst) = make_uint4(v[0], v[1], v[2], v[3]);
  }
}

// Where a block's tile lies: output rows [row_begin, row_end), n-tile, the problem's x, w and out
// offset. Dense: blockIdx.x walks the raster, blockIdx.z the batch. Grouped: see below.
struct TileSpot {
  int n_tile = 0, row_begin = 0, row_end = 0;
  int group = 0;  // grouped: the tile's group
  const uint16_t* x = nullptr;
  const uint16_t* w = nullptr;
  int64_t out_base = 0;  // element offset of this problem's out (batch)
};

// A group's rows [lo, hi) clamped to [0, max_rows], so a corrupt offsets table cannot overflow
// the tile arithmetic (find_tile flags it; every reader of the table clamps the same way).
__device__ __forceinline__ void clamp_group_rows(const MmaGemmParams& p, int& lo, int& hi) {
  lo = min(max(lo, 0), p.max_rows);
  hi = min(max(hi, lo), p.max_rows);
}

// false: the block has no tile (past the last grouped tile, or an error it has flagged) and
// must exit; the answer is the same for every thread of the block (and for every block with
// the same `pid`). `pid` = the tile's index in the launch: blockIdx.x, or blockIdx.x / cluster
// size where a cluster of blocks shares one tile (kernels/gemm_cluster.cuh). The persistent TMA
// kernel walks several tiles per block: it passes the dense batch index `z` (else blockIdx.z)
// and a shared-memory copy of the grouped offsets table (else p.offsets).
template <int BM, bool kAsync>
__device__ __forceinline__ bool find_tile(const MmaGemmParams& p, int pid, int tid, int lane, TileSpot& t, int z = -1,
                                          const int32_t* offsets = nullptr) {
  if (offsets == nullptr) offsets = p.offsets;
  t.x = p.x;
  if (p.offsets == nullptr) {
    const int per_group = kRasterGroup * p.n_tiles;
    const int first_m = (pid / per_group) * kRasterGroup;
    const int gm = min(p.m_tiles - first_m, kRasterGroup);
    const int m_tile = first_m + (pid % per_group) % gm;
    t.n_tile = (pid % per_group) / gm;
    t.row_begin = m_tile * BM;
    t.row_end = min(t.row_begin + BM, p.M);
    const int64_t b = z >= 0 ? int64_t(z) : int64_t(blockIdx.z);
    t.x = p.x + b * p.x_bs;
    t.w = p.w + b * p.w_bs;
    t.out_base = b * p.o_bs;
  } else {
    // Grouped: tile `tile` is the j-th BM-row tile of group g, counting tiles group after group
    // (ceil(rows_g / BM) each). Every warp scans the offsets itself (identical results, no
    // barrier needed) and checks them; the grid's tile bound is host-side, so blocks past the
    // last real tile find nothing and exit.
    const int tile = pid / p.n_tiles;
    t.n_tile = pid % p.n_tiles;
    bool bad = false;
    int base = 0, g_found = -1, lo_found = 0, hi_found = 0, j_found = 0;
    for (int g0 = 0; g0 < p.groups; g0 += 32) {
      const int g = g0 + lane;
      int lo = 0, hi = 0;
      if (g < p.groups) {
        lo = offsets[g];
        hi = offsets[g + 1];
        bad |= (g == 0 && lo != 0) || hi < lo || hi > p.max_rows || lo < 0;
      }
      clamp_group_rows(p, lo, hi);
      const int tiles = (hi - lo + BM - 1) / BM;
      int inc = tiles;
#pragma unroll
      for (int off = 1; off < 32; off <<= 1) {
        const int v = __shfl_up_sync(0xffffffffu, inc, off);
        if (lane >= off) inc += v;
      }
      const int excl = base + inc - tiles;
      const unsigned hit = __ballot_sync(0xffffffffu, g < p.groups && tiles > 0 && tile >= excl && tile < excl + tiles);
      if (hit != 0 && g_found < 0) {
        const int src = __ffs(hit) - 1;
        g_found = g0 + src;
        lo_found = __shfl_sync(0xffffffffu, lo, src);
        hi_found = __shfl_sync(0xffffffffu, hi, src);
        j_found = tile - __shfl_sync(0xffffffffu, excl, src);
      }
      base += __shfl_sync(0xffffffffu, inc, 31);
    }
    bad = __any_sync(0xffffffffu, bad);
    if (bad) {
      if (pid == 0 && tid == 0) atomicOr(p.error_flag, kErrGroupedOffsets);
      return false;  // whole block: every warp saw the same table
    }
    if (g_found < 0) return false;  // a block past the last real tile
    t.row_begin = lo_found + j_found * BM;
    t.row_end = min(t.row_begin + BM, hi_found);
    t.group = g_found;
    t.w = p.w_groups[g_found];
    if (t.w == nullptr || (kAsync && (reinterpret_cast<uintptr_t>(t.w) & 15u) != 0)) {
      if (tid == 0) atomicOr(p.error_flag, kErrGroupWeight);
      return false;
    }
  }
  return true;
}

// Element offset in x of the A row for output row `row` of [row_begin, row_end) (-1: a zero row),
// applying the optional gather and flagging bad gather entries.
__device__ __forceinline__ int64_t a_row_offset(const MmaGemmParams& p, int row, int row_end) {
  if (row >= row_end) return -1;
  int64_t src = row;
  if (p.x_rows != nullptr) {
    src = p.x_rows[row];
    if (src < 0 || (p.x_rows_limit > 0 && src >= p.x_rows_limit)) {
      atomicOr(p.error_flag, kErrGatherRows);
      return -1;
    }
  }
  return src * p.xs;
}

// Element offset in w of the weight row for tile column n (-1: past N, a zero row).
__device__ __forceinline__ int64_t b_row_offset(const MmaGemmParams& p, int n) {
  if (n >= p.N) return -1;
  const int row = p.gated > 0 ? ((n & 1) ? p.gated + (n >> 1) : (n >> 1)) : n;
  return int64_t(row) * p.ws;
}

// Launch overlap (kernels/pdl.cuh) and MmaGemmParams::prefetch: a dense problem's weights are
// model weights that no kernel of the stream writes, so a block may pull its share into L2 before
// pdl_begin_gemm(), while the kernel before it still runs (a batch-1 decode step is a chain of small
// launches: the MoE combine's one block, then the 14.9 MB q|kv_a GEMM). Its loads after
// pdl_begin_gemm() then hit L2. Elements [k_begin, k_end) of the tile's BN weight rows, one bulk
// prefetch per row (16-byte multiples: the async path's K % 8 == 0 and aligned rows). Timing
// only: nothing is written, so never bits.
template <int BN>
__device__ __forceinline__ void prefetch_weights_l2(const MmaGemmParams& p, const uint16_t* w, int n0, int k_begin,
                                                    int k_end) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  k_end = min(k_end, p.K);
  if (k_end <= k_begin) return;
  const uint32_t bytes = uint32_t(k_end - k_begin) * 2u;
  for (int c = threadIdx.x; c < BN; c += blockDim.x) {
    const int64_t off = b_row_offset(p, n0 + c);
    if (off >= 0) prefetch_l2(w + off + k_begin, bytes);
  }
#endif
}

// The start of a table-driven GEMM kernel: pdl_begin_gemm() and find_tile (its answer). Dense problems
// find their tile from the parameters alone, so with p.prefetch (async path) the block prefetches
// its weights [k_begin, k_end) before it waits; grouped ones read the offsets a kernel before them
// wrote, so they wait first.
template <int BM, int BN, bool kAsync>
__device__ __forceinline__ bool start_tile(const MmaGemmParams& p, int pid, int tid, int lane, TileSpot& t,
                                           int k_begin, int k_end, int z = -1) {
  if (p.offsets != nullptr) {
    pdl_begin_gemm();
    return find_tile<BM, kAsync>(p, pid, tid, lane, t);
  }
  const bool found = find_tile<BM, kAsync>(p, pid, tid, lane, t, z);
  if (kAsync && found && p.prefetch > 0) prefetch_weights_l2<BN>(p, t.w, t.n_tile * BN, k_begin, k_end);
  pdl_begin_gemm();
  return found;
}

// One K step of a block's A and B tiles (rows of BK bf16 from k0, swizzled 16-byte chunks) into
// ring slots sa [BM][BK] and sb [BN][BK]. Rows past M (or N) are zero in every slice: each slot
// zero-fills them on its first use (first_fill: the slot's first step) and nothing overwrites
// them later, so later fills skip them (a 1-row decode tile then copies 1 A row instead of 16).
// Shared by the mma.sync and wgmma kernels (any T with BM, BN, BK, CH, THREADS). kParts: which
// operands to copy (kTileA | kTileB; the cluster kernel copies a dense problem's weights before
// its launch-overlap wait and x after it).
constexpr int kTileA = 1, kTileB = 2;
template <class T, bool kAsync, int kParts = kTileA | kTileB>
__device__ __forceinline__ void load_tile_step(uint16_t* sa, uint16_t* sb, const int64_t* a_off, const int64_t* b_off,
                                               const uint16_t* x, const uint16_t* w, int k0, int K, bool first_fill,
                                               int tid, L2Hint w_hint = {}) {
#pragma unroll
  for (int i0 = 0; (kParts & kTileA) && i0 < T::BM * T::CH; i0 += T::THREADS) {
    const int i = i0 + tid;
    if (T::BM * T::CH % T::THREADS == 0 || i < T::BM * T::CH) {
      const int r = i / T::CH, c = i % T::CH;
      const int64_t off = a_off[r];
      if (off >= 0 || first_fill) load_chunk<kAsync>(sa + r * T::BK + swz<T::CH>(r, c) * 8, x, off, k0 + c * 8, K);
    }
  }
#pragma unroll
  for (int i0 = 0; (kParts & kTileB) && i0 < T::BN * T::CH; i0 += T::THREADS) {
    const int i = i0 + tid;
    if (T::BN * T::CH % T::THREADS == 0 || i < T::BN * T::CH) {
      const int r = i / T::CH, c = i % T::CH;
      const int64_t off = b_off[r];
      if (off >= 0 || first_fill) load_chunk<kAsync>(sb + r * T::BK + swz<T::CH>(r, c) * 8, w, off, k0 + c * 8, K, w_hint);
    }
  }
}

// A thread's share of one K step's 16-byte copies (the async path of load_tile_step), resolved
// once per tile: each copy's source row at k = 0 (null: a zero row) and its shared-memory address
// in ring slot 0. A step then costs an add and a cp.async per copy, where load_tile_step
// recomputed the row, the swizzle and the offsets on every step: at decode sizes (a few rows per
// tile, one K step of 20 KB every ~2,300 cycles per SM) the tiled kernel was bound by its
// instruction stream, not by memory (Nsight, H200 session 7: 65% of issue slots busy at 73% of
// the DRAM bandwidth). Same copies, same shared-memory contents: same bits.
// Thread tid always copies chunk column tid % CH (THREADS is a multiple of CH), so one k offset
// serves all its copies.
template <class T>
struct TileCopies {
  static constexpr int NA = (T::BM * T::CH + T::THREADS - 1) / T::THREADS;  // A copies per thread
  static constexpr int NB = (T::BN * T::CH + T::THREADS - 1) / T::THREADS;  // B copies per thread
  static_assert(T::THREADS % T::CH == 0, "a thread's copies share one chunk column");
  const uint16_t* src[NA + NB];  // row start + chunk column (k = 0); null = zero row / no copy
  uint32_t dst[NA + NB];         // shared address in slot 0
  bool real[NA + NB];            // the copy exists (the last round may be partial)
  int kc;                        // the chunk column's first k within a step

  __device__ __forceinline__ void plan(const uint16_t* sa, const uint16_t* sb, const int64_t* a_off,
                                       const int64_t* b_off, const uint16_t* x, const uint16_t* w, int tid) {
    const int c = tid % T::CH;
    kc = c * 8;
#pragma unroll
    for (int j = 0; j < NA + NB; ++j) {
      const bool is_a = j < NA;
      const int i = (is_a ? j : j - NA) * T::THREADS + tid;
      const int rows = is_a ? T::BM : T::BN;
      const int r = i / T::CH;
      real[j] = i < rows * T::CH;
      const int64_t off = real[j] ? (is_a ? a_off[r] : b_off[r]) : -1;
      src[j] = off >= 0 ? (is_a ? x : w) + off + kc : nullptr;
      dst[j] = smem_u32((is_a ? sa : sb) + (real[j] ? r : 0) * T::BK + swz<T::CH>(r, c) * 8);
    }
  }
  // Step k0 into ring slot `slot`; zero rows are written on a slot's first use only (see
  // load_tile_step). `any`: a valid global address for the zero-fill copies.
  __device__ __forceinline__ void issue(int slot, int k0, int K, bool first_fill, const void* any, L2Hint w_hint = {}) const {
    const bool in_k = k0 + kc < K;  // kAsync: K % 8 == 0, a chunk is wholly inside K or outside
#pragma unroll
    for (int j = 0; j < NA + NB; ++j) {
      if (!real[j]) continue;
      const uint32_t at = dst[j] + uint32_t(slot) * uint32_t((j < NA ? T::BM : T::BN) * T::BK * 2);
      if (src[j] != nullptr)
        cp_async16_at(at, in_k ? src[j] + k0 : src[j], in_k ? 16 : 0, j < NA ? L2Hint{} : w_hint);
      else if (first_fill)
        cp_async16_at(at, any, 0);
    }
  }
};

// TileCopies without a branch per copy (session 33, the tiled kernel's kLean instances: config
// "16x32x128/4l", for the batch-1 routed experts' down). Nsight on that GEMM in a decode step
// (s33-5, s33-8: 16x32x128/4, 448 blocks, 15.3-15.7 us, 47% of DRAM bandwidth) counted ~2,630
// instructions per warp for its 11 steps, 0.40 issued per scheduler cycle, the warps mostly
// waiting on fixed-latency dependencies; its SASS spends ~155 of the loop's ~275 instructions on
// the step's six copies: per copy a test of the row (zero rows are written on a slot's first
// fill only), of the L2 policy (two copy variants) and of K. Here a zero row's copy is a
// zero-size copy from a valid address on every step (the slot holds zeros either way), the
// policy is chosen once per step (kHint), and every copy exists (tiles whose rows * chunks are
// multiples of the block's threads): a copy is an add, a select and the cp.async. The same
// shared-memory contents before every mma step: the same bits.
template <class T>
struct LeanTileCopies {
  static constexpr int NA = T::AROWS * T::CH / T::THREADS, NB = T::BN * T::CH / T::THREADS;
  static_assert(T::AROWS * T::CH % T::THREADS == 0 && T::BN * T::CH % T::THREADS == 0 && T::THREADS % T::CH == 0,
                "every thread has whole rounds of copies of one chunk column");
  const char* src[NA + NB];  // the row's chunk at k = 0, or (a zero row) the operand's first chunk
  uint32_t dst[NA + NB];     // shared address in slot 0
  uint32_t bytes[NA + NB];   // 16, or 0 for a zero row
  int kc;                    // the chunk column's first k within a step

  __device__ __forceinline__ void plan(const uint16_t* sa, const uint16_t* sb, const int64_t* a_off,
                                       const int64_t* b_off, const uint16_t* x, const uint16_t* w, int tid) {
    kc = tid % T::CH * 8;
#pragma unroll
    for (int j = 0; j < NA + NB; ++j) plan_entry(j, sa, sb, a_off, b_off, x, w, tid);
  }
  // plan()'s weight-row entries alone (the same values): for the weight steps copied before the
  // A rows are known (early_weight_steps; plan() then sets every entry again).
  __device__ __forceinline__ void plan_b(const uint16_t* sb, const int64_t* b_off, const uint16_t* w, int tid) {
    kc = tid % T::CH * 8;
#pragma unroll
    for (int j = NA; j < NA + NB; ++j) plan_entry(j, nullptr, sb, nullptr, b_off, nullptr, w, tid);
  }
  // Copy j's entries: an x row for j < NA, a weight row after (the other operand's pointers unused).
  __device__ __forceinline__ void plan_entry(int j, const uint16_t* sa, const uint16_t* sb, const int64_t* a_off,
                                             const int64_t* b_off, const uint16_t* x, const uint16_t* w, int tid) {
    const int c = tid % T::CH;
    const bool is_a = j < NA;
    const int r = ((is_a ? j : j - NA) * T::THREADS + tid) / T::CH;
    const int64_t off = is_a ? a_off[r] : b_off[r];
    const uint16_t* base = is_a ? x : w;
    src[j] = reinterpret_cast<const char*>(base + (off >= 0 ? off + kc : 0));
    bytes[j] = off >= 0 ? 16u : 0u;
    dst[j] = smem_u32((is_a ? sa : sb) + r * T::BK + swz<T::CH>(r, c) * 8);
  }
  // Step k0 into ring slot `slot` (kHint: the weights' copies carry `policy`).
  template <bool kHint>
  __device__ __forceinline__ void issue(int slot, int k0, int K, uint64_t policy) const {
    const bool in_k = k0 + kc < K;  // K % 8 == 0: a chunk is wholly inside K or outside
    const int step = in_k ? k0 * 2 : 0;
#pragma unroll
    for (int j = 0; j < NA + NB; ++j) {
      const uint32_t at = dst[j] + uint32_t(slot) * uint32_t((j < NA ? T::AROWS : T::BN) * T::BK * 2);
      const uint32_t n = in_k ? bytes[j] : 0u;
      if (kHint && j >= NA)
        asm volatile("cp.async.cg.shared.global.L2::cache_hint [%0], [%1], 16, %2, %3;\n" ::"r"(at), "l"(src[j] + step),
                     "r"(n), "l"(policy)
                     : "memory");
      else
        cp_async16_at(at, src[j] + step, int(n));
    }
  }
};

// The tiled kernel's K loop for kLean == 2 ("16x32x128/4u", session 34) on a tile whose every
// step is whole (K % BK == 0) and whose BN weight rows all exist (n0 + BN <= N). The SASS of
// the kLean == 1 loop (s34-1) still spent ~180 instructions per warp per step on 8 mma: per copy
// a select of its size (in K or not) and the zero-fill address fix-up, per k16 chunk a test
// against K and two address computations from the ring slot. Here the loop is unrolled by the
// ring's depth, so a step's slot (and the slot its copies fill) is a constant: ldmatrix reads
// at a per-lane address of slot 0 plus an immediate, the copies write at LeanTileCopies' slot-0
// address plus an immediate from a source advanced once per STAGES steps; the weights' copies
// are plain 16-byte copies and a zero A row's copy ignores its source (cp.async's ignore-src).
// The body is unrolled over U = lcm(STAGES, kSliceK / BK) steps, so that the slice fold falls on
// fixed steps of it too (a slice is kSliceK / BK steps and a block's first step starts a slice).
// T::AROWS == 8 (kLean == 3, "16x32x128/5h", session 35): a slot holds x rows 0-7 only; the A
// fragment's registers of rows 0-7 come by ldmatrix.x2 and those of rows 8-15 are zeros (rows
// the tile never has: a row's sums use its own A row only). The same copies land in the same
// slots before the same mma sequence and fold: the same bits.
// The whole-steps loop's two 16-byte copies (mma_whole_steps, early_weight_steps): an x row's
// chunk (`zero`: a zero row, cp.async's ignore-src) and a weight row's chunk (kHint: with the
// L2 policy).
__device__ __forceinline__ void whole_step_copy_a(uint32_t at, const char* from, bool zero) {
  asm volatile("{\n .reg .pred z;\n setp.ne.b32 z, %2, 0;\n cp.async.cg.shared.global [%0], [%1], 16, z;\n}\n" ::"r"(at),
               "l"(from), "r"(int(zero))
               : "memory");
}
template <bool kHint>
__device__ __forceinline__ void whole_step_copy_b(uint32_t at, const char* from, uint64_t policy) {
  if constexpr (kHint)
    asm volatile("cp.async.cg.shared.global.L2::cache_hint [%0], [%1], 16, %2;\n" ::"r"(at), "l"(from), "l"(policy)
                 : "memory");
  else
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(at), "l"(from) : "memory");
}

// kBIssued (gemm_mma_kernel's kEarlyB): the weight copies of the first STAGES - 1 steps were
// issued before the launch-overlap wait (early_weight_steps: one cp.async group per step, the
// same slots and sources), so the prologue here issues their x rows only, again one group per
// step. The groups then complete in the order W0 .. W(S-2), A0 .. A(S-2), G(S-1), ..., and each
// step's cp_async_wait<S - 2> still leaves only groups of later steps pending: step u < S - 1
// needs W(u), older than A(u), and A(u), which has S - 2 - u younger prologue groups and u
// younger loop groups after it. The same shared memory before every mma step: the same bits.
template <class T, bool kHint, bool kBIssued = false>
__device__ __forceinline__ void mma_whole_steps(const LeanTileCopies<T>& c, const uint16_t* sA, const uint16_t* sB,
                                                int kt_begin, int KT, int wm, int wn, int lane, bool live,
                                                uint64_t policy, float (&tot)[T::MI][T::NI][4]) {
  static_assert(T::MI == 1 && T::NI == 1, "one m16n8 accumulator per warp");
  constexpr int S = T::STAGES, SPS = kSliceK / T::BK, KK = T::BK / 16, NA = LeanTileCopies<T>::NA,
                NC = LeanTileCopies<T>::NA + LeanTileCopies<T>::NB;
  constexpr int U = S % SPS == 0 ? S : S * SPS;  // a multiple of both (SPS is 1, 2 or 4; /5h: 10)
  static_assert(U % S == 0 && U % SPS == 0, "the unrolled body is whole ring turns and whole slices");
  constexpr bool kHalfA = T::AROWS == 8;
  constexpr uint32_t kSlotA = T::AROWS * T::BK * 2, kSlotB = T::BN * T::BK * 2, kStep = T::BK * 2;
  // Lane addresses in slot 0 of the A (x4, or x2 for 8-row slots) and B (x2) fragments of chunk
  // kk (as in mma_step; x2: lanes 0-7 rows 0-7 at k 0-7, lanes 8-15 at k 8-15).
  uint32_t a_at[KK], b_at[KK];
  const int ra = kHalfA ? (lane & 7) : wm * T::WM + (lane & 15), rb = wn * T::WN + (lane & 7);
  const int ca = kHalfA ? (lane >> 3) & 1 : lane >> 4;
#pragma unroll
  for (int kk = 0; kk < KK; ++kk) {
    a_at[kk] = smem_u32(sA + ra * T::BK + swz<T::CH>(ra, kk * 2 + ca) * 8);
    b_at[kk] = smem_u32(sB + rb * T::BK + swz<T::CH>(rb, kk * 2 + ((lane >> 3) & 1)) * 8);
  }
  const char* src[NC];  // the copies' sources at the body's first step
  bool zero[NA];        // an A copy's zero row (every weight row exists here)
#pragma unroll
  for (int j = 0; j < NC; ++j) src[j] = c.src[j] + int64_t(kt_begin) * kStep;
#pragma unroll
  for (int j = 0; j < NA; ++j) zero[j] = c.bytes[j] == 0;
  // Step (body start + d) into slot `slot` (both constants once unrolled).
  auto issue = [&](int slot, int d) {
#pragma unroll
    for (int j = 0; j < NC; ++j) {
      const char* from = src[j] + d * kStep;
      if (j < NA)
        whole_step_copy_a(c.dst[j] + uint32_t(slot) * kSlotA, from, zero[j]);
      else
        whole_step_copy_b<kHint>(c.dst[j] + uint32_t(slot) * kSlotB, from, policy);
    }
  };
  if constexpr (kBIssued) {
#pragma unroll
    for (int s = 0; s < S - 1; ++s) {
      if (kt_begin + s < KT) {
#pragma unroll
        for (int j = 0; j < NA; ++j)  // issue()'s A copies of step s
          whole_step_copy_a(c.dst[j] + uint32_t(s) * kSlotA, src[j] + s * kStep, zero[j]);
      }
      cp_async_commit();
    }
  } else {
#pragma unroll
    for (int s = 0; s < S - 1; ++s) {
      if (kt_begin + s < KT) issue(s, s);
      cp_async_commit();
    }
  }
  float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  for (int kb = kt_begin; kb < KT; kb += U) {
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int kt = kb + u;
      if (kt >= KT) break;
      cp_async_wait<S - 2>();  // step kt has landed (this thread's copies) ...
      __syncthreads();         // ... everyone's, and slot (u + S - 1) % S is free again
      if (kt + S - 1 < KT) issue((u + S - 1) % S, u + S - 1);
      cp_async_commit();
      if (live) {
#pragma unroll
        for (int kk = 0; kk < KK; ++kk) {
          uint32_t af[4], b0, b1;
          if constexpr (kHalfA) {
            ldmatrix_x2_at(af[0], af[2], a_at[kk] + uint32_t(u % S) * kSlotA);
            af[1] = af[3] = 0u;
          } else {
            ldmatrix_x4_at(af, a_at[kk] + uint32_t(u % S) * kSlotA);
          }
          ldmatrix_x2_at(b0, b1, b_at[kk] + uint32_t(u % S) * kSlotB);
          mma_bf16_16816(acc, af, b0, b1);
        }
      }
      if ((u + 1) % SPS == 0 || kt == KT - 1) {
#pragma unroll
        for (int q = 0; q < 4; ++q) {
          tot[0][0][q] = __fadd_rn(tot[0][0][q], acc[q]);
          acc[q] = 0.0f;
        }
      }
    }
#pragma unroll
    for (int j = 0; j < NC; ++j) src[j] += U * kStep;
  }
}

// One BK-wide K step of a warp's WM x WN accumulators from ring slots sa [BM][BK] / sb [BN][BK]
// (swizzled chunks): for each k16 chunk of step kt that lies inside K (KC chunks in all), the
// A and B fragments by ldmatrix, then one mma per m16n8 accumulator, chunks in ascending order.
// The contract's inner loop, shared by every mma.sync kernel.
// live_rows: the tile's rows that are stored (row_end - row_begin); m16 blocks wholly past them
// are skipped (their rows are never stored, and a row's sums use only its own A row), so the
// warps of a decode tile's empty rows only copy. Warp-uniform: no divergence.
template <class T>
__device__ __forceinline__ void mma_step(const uint16_t* sa, const uint16_t* sb, float (&acc)[T::MI][T::NI][4], int kt,
                                         int KC, int wm, int wn, int lane, int live_rows = T::BM) {
  if (wm * T::WM >= live_rows) return;
#pragma unroll
  for (int kk = 0; kk < T::BK / 16; ++kk) {
    if (kt * (T::BK / 16) + kk < KC) {  // uniform: chunks past K are not part of the contract
      uint32_t af[T::MI][4];
      uint32_t bfr[T::NI][2];
#pragma unroll
      for (int mi = 0; mi < T::MI; ++mi) {
        if (mi > 0 && wm * T::WM + mi * 16 >= live_rows) continue;
        // ldmatrix.x4: lanes 0-15 address rows 0-15 at k 0-7, lanes 16-31 rows 0-15 at k 8-15
        // -> registers {a0a1, a2a3, a4a5, a6a7} of the m16n8k16 A fragment.
        const int r = wm * T::WM + mi * 16 + (lane & 15);
        const int c = kk * 2 + (lane >> 4);
        ldmatrix_x4(af[mi], sa + r * T::BK + swz<T::CH>(r, c) * 8);
      }
      if constexpr (T::NI == 1) {
        // lanes 0-7: n 0-7 at k 0-7 (b0b1), lanes 8-15: n 0-7 at k 8-15 (b2b3).
        const int r = wn * T::WN + (lane & 7);
        const int c = kk * 2 + ((lane >> 3) & 1);
        ldmatrix_x2(bfr[0][0], bfr[0][1], sb + r * T::BK + swz<T::CH>(r, c) * 8);
      } else {
#pragma unroll
        for (int nj = 0; nj < T::NI / 2; ++nj) {
          // Two n8 tiles: matrices (n 0-7, k 0-7), (n 0-7, k 8-15), (n 8-15, k 0-7), (n 8-15, k 8-15).
          const int r = wn * T::WN + nj * 16 + (lane & 7) + ((lane >> 4) << 3);
          const int c = kk * 2 + ((lane >> 3) & 1);
          uint32_t q[4];
          ldmatrix_x4(q, sb + r * T::BK + swz<T::CH>(r, c) * 8);
          bfr[2 * nj][0] = q[0];
          bfr[2 * nj][1] = q[1];
          bfr[2 * nj + 1][0] = q[2];
          bfr[2 * nj + 1][1] = q[3];
        }
      }
#pragma unroll
      for (int mi = 0; mi < T::MI; ++mi) {
        if (mi > 0 && wm * T::WM + mi * 16 >= live_rows) continue;
#pragma unroll
        for (int ni = 0; ni < T::NI; ++ni) mma_bf16_16816(acc[mi][ni], af[mi], bfr[ni][0], bfr[ni][1]);
      }
    }
  }
}

// Epilogue store of an accumulator pair (columns col, col + 1; `two` = col + 1 < N) at element
// offset `at` of out: fp32, or bf16 rounded once; one 2-element store where p.pair_store allows.
template <bool kOutF32>
__device__ __forceinline__ void store_out_pair(const MmaGemmParams& p, int64_t at, float v0, float v1, bool two) {
  if constexpr (kOutF32) {
    float* o = static_cast<float*>(p.out) + at;
    if (two && p.pair_store) {
      *reinterpret_cast<float2*>(o) = make_float2(v0, v1);
    } else {
      o[0] = v0;
      if (two) o[1] = v1;
    }
  } else {
    uint16_t* o = static_cast<uint16_t*>(p.out) + at;
    if (two && p.pair_store) {
      *reinterpret_cast<uint32_t*>(o) = uint32_t(f2bf(v0)) | (uint32_t(f2bf(v1)) << 16);
    } else {
      o[0] = f2bf(v0);
      if (two) o[1] = f2bf(v1);
    }
  }
}

// The tile kernels' epilogue store of columns (col, col + 1) of the row at element offset o_row
// of out: the pair, or with p.gated (bf16 out) the SiLU-gated activation col / 2 (col is even).
// The fused gate|up epilogue's value from the gate and up sums: bf16(bf16(silu(bf16 gate)) * bf16 up),
// the bits of the GEMM into bf16 followed by silu_gate_kernel.
__device__ __forceinline__ uint16_t gated_value(float gate, float up) {
  const float g = bf2f(f2bf(gate)), u = bf2f(f2bf(up));
  return f2bf(bf2f(f2bf(silu_f32(g))) * u);
}

template <bool kOutF32>
__device__ __forceinline__ void store_tile_pair(const MmaGemmParams& p, int64_t o_row, int col, float v0, float v1) {
  if constexpr (!kOutF32) {
    if (p.gated > 0) {
      static_cast<uint16_t*>(p.out)[o_row + (col >> 1)] = gated_value(v0, v1);
      return;
    }
  }
  store_out_pair<kOutF32>(p, o_row + col, v0, v1, col + 1 < p.N);
}

// The tiled kernel's work on one tile t (found by start_tile), every thread of the block: a_off /
// b_off ([BM] / [BN] shared), sA / sB the ring ([STAGES][BM][BK] / [STAGES][BN][BK] shared,
// swizzled chunks). `slice`: a sliced launch's K slice (p.slice_stride > 0; else unused).
// Why a function with its epilogue as a lambda ahead of the K loop: the compiler schedules this
// form's K loop differently (72 registers against 52 on the batch-1 expert config 16x32x128/4),
// and it streams faster. The same arithmetic in the kernel's body with the epilogue after the
// loop (sessions 3-19): CUPTI 28.3 / 22.3 us per call for the batch-1 routed gate|up / down
// against 27.2 / 17.3 in this form. One H200, the same binary but this file, old form between two
// runs of this one (session 20, run s20-6): decode-b1 359.4 tok/s against 374.8 / 368.5, the
// seed grid 7.31 s against 7.10 / 7.10, the traced prefill 0.487 s against 0.476 / 0.486; the
// same bits.
// kLean (async only): 1, the step's copies through LeanTileCopies; 2, also the whole-steps loop
// (mma_whole_steps) where it applies (the same bits); 3, the whole-steps loop only, for tiles
// of 8-row x slots (T::AROWS == 8, "16x32x128/5h").
// kBIssued: the first weight steps are in flight already (gemm_mma_kernel's kEarlyB; whole
// steps only, mma_whole_steps' kBIssued).
template <class T, bool kOutF32, bool kAsync, int kLean = 0, bool kBIssued = false>
__device__ __forceinline__ void mma_tile(const MmaGemmParams& p, const TileSpot& t, int slice, uint16_t* sA,
                                         uint16_t* sB, int64_t* a_off, int64_t* b_off) {
  static_assert(!kLean || kAsync, "the lean copies are 16-byte copies");
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int wm = warp / T::WARPS_N, wn = warp % T::WARPS_N;
  const int n_tile = t.n_tile, row_begin = t.row_begin, row_end = t.row_end;
  const uint16_t* x = t.x;
  const uint16_t* w = t.w;
  int64_t out_base = t.out_base;
  const int n0 = n_tile * T::BN;

  for (int r = tid; r < T::BM; r += T::THREADS) a_off[r] = a_row_offset(p, row_begin + r, row_end);
  for (int r = tid; r < T::BN; r += T::THREADS) b_off[r] = b_row_offset(p, n0 + r);
  __syncthreads();

  const int K = p.K;
  int KT = (K + T::BK - 1) / T::BK;  // BK-wide steps (kSliceK / BK per K slice)
  const int KC = (K + 15) / 16;      // 16-wide chunks: exactly these mma steps per output
  int kt_begin = 0;                  // sliced launch: this block's slice only
  if (p.slice_stride > 0) {
    kt_begin = slice * (kSliceK / T::BK);
    KT = min(KT, kt_begin + kSliceK / T::BK);
    out_base += int64_t(slice) * p.slice_stride;
  }
  const int gid = lane >> 2, tig = lane & 3;
  // The epilogue: accumulator (mi, ni, q) is row gid (+8 for q >= 2), columns 2*tig + {0, 1}.
  auto store_all = [&](const float (&v)[T::MI][T::NI][4], int64_t base) {
#pragma unroll
    for (int mi = 0; mi < T::MI; ++mi)
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int row = row_begin + wm * T::WM + mi * 16 + gid + half * 8;
        if (row >= row_end) continue;
        const int64_t o_row = base + int64_t(row) * p.os;
#pragma unroll
        for (int ni = 0; ni < T::NI; ++ni) {
          const int col = n0 + wn * T::WN + ni * 8 + tig * 2;
          if (col >= p.N) continue;
          store_tile_pair<kOutF32>(p, o_row, col, v[mi][ni][half * 2], v[mi][ni][half * 2 + 1]);
        }
      }
  };

  using Copies = std::conditional_t<kLean != 0, LeanTileCopies<T>, TileCopies<T>>;
  Copies copies;
  const L2Hint w_hint = l2_evict_first_hint(kAsync && p.l2_evict_first > 0);
  if constexpr (kAsync) copies.plan(sA, sB, a_off, b_off, x, w, tid);
  auto load_stage = [&](int slot, int kt) {
    if constexpr (kLean != 0) {
      if (w_hint.on)
        copies.template issue<true>(slot, kt * T::BK, K, w_hint.policy);
      else
        copies.template issue<false>(slot, kt * T::BK, K, 0);
    } else if constexpr (kAsync)
      copies.issue(slot, kt * T::BK, K, kt - kt_begin < T::STAGES, x, w_hint);
    else
      load_tile_step<T, kAsync>(sA + slot * (T::BM * T::BK), sB + slot * (T::BN * T::BK), a_off, b_off, x, w,
                                kt * T::BK, K, kt - kt_begin < T::STAGES, tid);
  };
  const int live_rows = row_end - row_begin;

  // acc: the current K slice's sum; tot: the running total of finished slices (the contract).
  float acc[T::MI][T::NI][4], tot[T::MI][T::NI][4];
#pragma unroll
  for (int mi = 0; mi < T::MI; ++mi)
#pragma unroll
    for (int ni = 0; ni < T::NI; ++ni)
#pragma unroll
      for (int q = 0; q < 4; ++q) acc[mi][ni][q] = tot[mi][ni][q] = 0.0f;

  if constexpr (kLean == 3) {
    // 8-row slots: the whole-steps loop is this config's only loop (mma_step reads 16 A rows).
    // The host runs it only where every step is whole, every weight row exists and no tile has
    // more than 8 rows (gemm.cu, half_a_or_fallback); anything else is a launcher bug.
    if (K % T::BK != 0 || n0 + T::BN > p.N || live_rows > T::AROWS) __trap();
  }
  if constexpr (kLean >= 2) {
    if (K % T::BK == 0 && n0 + T::BN <= p.N) {
      const bool live = wm * T::WM < live_rows;
      if (w_hint.on)
        mma_whole_steps<T, true, kBIssued>(copies, sA, sB, kt_begin, KT, wm, wn, lane, live, w_hint.policy, tot);
      else
        mma_whole_steps<T, false, kBIssued>(copies, sA, sB, kt_begin, KT, wm, wn, lane, live, 0, tot);
      cp_async_wait<0>();
      store_all(tot, out_base);
      return;
    }
  }
  if constexpr (kBIssued) __trap();  // early_weight_steps issued only for whole-step tiles

#pragma unroll
  for (int s = 0; s < T::STAGES - 1; ++s) {
    if (kt_begin + s < KT) load_stage(s, kt_begin + s);
    cp_async_commit();
  }

  // Ring slots as running counters: step kt reads `slot`, the copies issued with it fill
  // `fill` (= the slot freed by step kt - 1).
  int slot = 0, fill = T::STAGES - 1;
  for (int kt = kt_begin; kt < KT; ++kt) {
    cp_async_wait<T::STAGES - 2>();  // step kt has landed (this thread's copies) ...
    __syncthreads();                 // ... everyone's, and slot `fill` is free again
    {
      const int nk = kt + T::STAGES - 1;
      if (nk < KT) load_stage(fill, nk);
      cp_async_commit();
      fill = fill + 1 == T::STAGES ? 0 : fill + 1;
    }
    mma_step<T>(sA + slot * (T::BM * T::BK), sB + slot * (T::BN * T::BK), acc, kt, KC, wm, wn, lane, live_rows);
    slot = slot + 1 == T::STAGES ? 0 : slot + 1;
    // End of a K slice (kSliceK / BK steps, or the last step): total += slice sum, new slice.
    if (unsigned(kt + 1) % unsigned(kSliceK / T::BK) == 0 || kt == KT - 1) {
#pragma unroll
      for (int mi = 0; mi < T::MI; ++mi)
#pragma unroll
        for (int ni = 0; ni < T::NI; ++ni)
#pragma unroll
          for (int q = 0; q < 4; ++q) {
            tot[mi][ni][q] = __fadd_rn(tot[mi][ni][q], acc[mi][ni][q]);
            acc[mi][ni][q] = 0.0f;
          }
    }
  }
  cp_async_wait<0>();
  store_all(tot, out_base);
}

// The early weight steps of a grouped tile (gemm_mma_kernel's kEarlyB, session 44;
// GroupedGemmArgs::tables_before_wait, the model's ATLAS_MOE_DOWN_EARLY): before the block's
// launch-overlap wait, find its tile from the offsets table and issue the weight copies of the
// ring's first STAGES - 1 steps (one cp.async group each; mma_whole_steps' kBIssued issues their
// x rows after the wait). Why: at a batch-1 decode step the routed experts' down (this config,
// 16x32x128/4u) becomes resident as the routed gate|up's blocks leave and then waits, ~2.9 us
// per block (session 38's stamps), for the gate|up's last block; after the wait it read the
// table, found its tile and only then issued its first copies. Its tile and weights depend on
// the routing kernel's table alone, which is final by then wherever the launch before this one
// waited for its own predecessor before releasing this one (the caller's promise,
// tables_before_wait; the gate|up's wait-first instance): the block's start follows that
// release, and the release follows the routing kernel's completion (kernels/pdl.cuh). The table
// is read through L2 (__ldcg) into shared memory. The x rows (the gate|up's output) and the
// gather table come after the wait, as everything else.
// Returns -1: no tile (the block exits; a bad table is flagged as find_tile flags it), 1: the
// tile's first weight steps issued, 0: a tile that is not whole steps (the plain loop after the
// wait), 2: nothing done (a table too large for the copy, a sliced launch, a dense problem).
constexpr int kEarlyMaxGroups = 256;
template <class T>
__device__ __forceinline__ int early_weight_steps(const MmaGemmParams& p, int pid, int tid, int lane, TileSpot& t,
                                                  uint16_t* sB, int64_t* b_off, int32_t* table) {
  if (p.offsets == nullptr || p.groups > kEarlyMaxGroups || p.slice_stride > 0) return 2;
  for (int g = tid; g <= p.groups; g += T::THREADS) table[g] = __ldcg(p.offsets + g);
  __syncthreads();
  if (!find_tile<T::BM, true>(p, pid, tid, lane, t, -1, table)) return -1;
  const int n0 = t.n_tile * T::BN;
  if (p.K % T::BK != 0 || n0 + T::BN > p.N) return 0;  // mma_tile's whole-steps condition
  for (int r = tid; r < T::BN; r += T::THREADS) b_off[r] = b_row_offset(p, n0 + r);
  __syncthreads();
  LeanTileCopies<T> c;
  c.plan_b(sB, b_off, t.w, tid);
  const L2Hint w_hint = l2_evict_first_hint(p.l2_evict_first > 0);
  constexpr int NA = LeanTileCopies<T>::NA, NC = NA + LeanTileCopies<T>::NB;
  constexpr uint32_t kSlotB = T::BN * T::BK * 2, kStep = T::BK * 2;
  const int KT = p.K / T::BK;
#pragma unroll
  for (int s = 0; s < T::STAGES - 1; ++s) {
    if (s < KT) {
#pragma unroll
      for (int j = NA; j < NC; ++j) {  // mma_whole_steps' weight copies of step s (every row exists)
        const uint32_t at = c.dst[j] + uint32_t(s) * kSlotB;
        const char* from = c.src[j] + s * kStep;
        if (w_hint.on)
          whole_step_copy_b<true>(at, from, w_hint.policy);
        else
          whole_step_copy_b<false>(at, from, 0);
      }
    }
    cp_async_commit();
  }
  __syncthreads();  // every thread's reads of b_off are done before mma_tile writes it again
  return 1;
}

// kStamp: the diagnostic instantiation (ATLAS_BLOCK_STAMPS, kernels/block_stamp.cuh).
// kEarlyB: the early weight steps (early_weight_steps; kLean 2, bf16 or fp32 out).
template <class T, bool kOutF32, bool kAsync, int kLean = 0, bool kStamp = false, bool kEarlyB = false>
__global__ void __launch_bounds__(T::THREADS) gemm_mma_kernel(const MmaGemmParams p) {
  auto stamp = gemm_block_stamp<kStamp>(p, kBlockStampTiled);
  extern __shared__ __align__(128) unsigned char gemm_smem[];
  __shared__ int64_t a_off[T::BM];  // element offset of each tile row's A row in x; -1 = zero row
  __shared__ int64_t b_off[T::BN];  // element offset of each tile column's W row; -1 = zero row
  uint16_t* sA = reinterpret_cast<uint16_t*>(gemm_smem);    // [STAGES][AROWS][BK] (swizzled chunks)
  uint16_t* sB = sA + T::STAGES * T::AROWS * T::BK;          // [STAGES][BN][BK]
  const int tid = threadIdx.x, lane = tid & 31;
  TileSpot t;
  if constexpr (kEarlyB) {
    static_assert(kLean == 2 && kAsync && !kStamp, "the early weight steps: the whole-steps loop, unstamped");
    __shared__ int32_t table[kEarlyMaxGroups + 1];
    pdl_release_if(true);  // as pdl_begin_gemm(): the next launch released first
    const int early = early_weight_steps<T>(p, int(blockIdx.x), tid, lane, t, sB, b_off, table);
    // Every block waits, a block without a tile too: were none to wait (a table without rows),
    // the launch could complete before its predecessor, and the next launch's wait would not
    // cover that predecessor (kernels/pdl.cuh: completion in stream order).
    pdl_wait_after(true);
    if (early < 0) return;
    if (early == 1) {
      mma_tile<T, kOutF32, true, 2, true>(p, t, 0, sA, sB, a_off, b_off);
    } else {
      if (early == 2 && !find_tile<T::BM, true>(p, int(blockIdx.x), tid, lane, t)) return;
      mma_tile<T, kOutF32, true, 2>(p, t, int(blockIdx.y), sA, sB, a_off, b_off);
    }
    return;
  }
  const int k_first = p.slice_stride > 0 ? int(blockIdx.y) * kSliceK : 0;  // this block's K range
  if (!start_tile<T::BM, T::BN, kAsync>(p, int(blockIdx.x), tid, lane, t, k_first,
                                        p.slice_stride > 0 ? k_first + kSliceK : p.K))
    return;
  stamp.go();
  stamp.add_bytes(int64_t(min(T::BN, p.N - t.n_tile * T::BN)) * ((p.slice_stride > 0 ? min(kSliceK, p.K - k_first) : p.K)) * 2);
  mma_tile<T, kOutF32, kAsync, kLean>(p, t, int(blockIdx.y), sA, sB, a_off, b_off);
}


// The sliced launch's second pass: out[m][n] = the contract's running total of the slice sums
// ws[s][m][n] (s ascending, starting from +0), rounded once to bf16 for bf16 output.
// Grouped problems pass rows_total = &offsets[groups] (device): rows past it were never computed
// and stay untouched.
template <bool kOutF32>
__global__ void gemm_slice_reduce_kernel(const float* __restrict__ ws, int64_t slice_stride, int slices, int M,
                                         int N, void* __restrict__ out, int64_t os,
                                         const int32_t* __restrict__ rows_total) {
  pdl_begin_gemm();
  const int64_t idx = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= int64_t(M) * N) return;
  const int64_t m = idx / N, n = idx % N;
  if (rows_total != nullptr && m >= int64_t(min(*rows_total, M))) return;
  float total = 0.0f;
  for (int s = 0; s < slices; ++s) total = __fadd_rn(total, ws[s * slice_stride + idx]);
  if constexpr (kOutF32)
    static_cast<float*>(out)[m * os + n] = total;
  else
    static_cast<uint16_t*>(out)[m * os + n] = f2bf(total);
}

// Two adjacent bf16 (k, k+1) of the row starting at `row` (null: a zero row) as one 32-bit
// fragment register, low half = k. kVec: one 4-byte load (needs K even and an even, 4-byte
// aligned row start, which the host's 16-byte fast-path conditions imply); else element loads.
template <bool kVec>
__device__ __forceinline__ uint32_t load_pair(const uint16_t* row, int k, int K, L2Hint hint = {}) {
  if constexpr (kVec) {
    if (hint.on) {
      uint32_t v = 0u;
      if (row != nullptr && k < K)
        asm volatile("ld.global.nc.L2::cache_hint.b32 %0, [%1], %2;\n" : "=r"(v) : "l"(row + k), "l"(hint.policy));
      return v;
    }
    return (row != nullptr && k < K) ? __ldg(reinterpret_cast<const unsigned int*>(row + k)) : 0u;
  } else {
    const uint32_t lo = (row != nullptr && k < K) ? uint32_t(__ldg(reinterpret_cast<const unsigned short*>(row + k))) : 0u;
    const uint32_t hi =
        (row != nullptr && k + 1 < K) ? uint32_t(__ldg(reinterpret_cast<const unsigned short*>(row + k + 1))) : 0u;
    return lo | (hi << 16);
  }
}

// Split-K small-M kernel (see the header comment): a 16 x BN tile, KW warps on K slices.
// kHalf: the tile has at most 8 rows (host-guaranteed: M <= 8, or grouped max_rows <= 8), so the
// fragment registers of rows 8-15 are constant zeros (fewer registers, no loads).
// kStaged (16-byte copies only, kVec): a warp's weight slice comes in through shared memory
// instead of 4-byte fragment loads: 16-byte cp.async copies of whole row segments (a weight
// row's 256-wide slice is 512 contiguous bytes: one warp instruction, four 128-byte lines, where
// a 4-byte fragment load touches eight rows' lines for 128 bytes), then ldmatrix into the very
// registers load_pair fills (rows n, k pairs 2*tig and 2*tig + 8 of each chunk; chunks past K or
// columns past N zero-filled as load_pair reads zeros). The same fragments, the same mma order
// and the same reduce: the same bits (Gemm.EveryConfig*). Config "splitk16x8/8w+staged", the
// dense split-K default since session 21 (gemm.cu, dense_splitk_config; ATLAS_GEMM_SPLITK).
// The body of gemm_splitk_kernel, with a tail: NoSplitKTail (the kernel), or a kernels/
// gemm_tail.cuh functor that the launch's last block runs on the whole output once every block's
// stores are done (gemm_splitk_tail_kernel; dense problems only, where every block has a tile).
struct NoSplitKTail {};
// A kernel body's prologue hook: none (gemm_cluster_body's and splitk_body's default).
struct NoPrologue {
  static constexpr bool kOn = false;
  struct Loaded {};
};
// kStamp: the stamped instantiation's block stamp (ATLAS_BLOCK_STAMPS; its wait's end marked).
// Pro (not NoPrologue: the residual add + norm before the router, kernels/gemm_tail.cuh,
// AddRmsNormPrologue; session 43): a dense one-row problem whose A row every block computes
// itself: `pre = pro.before_wait()` first (model weights only), `pro.after_wait(pre, first)`
// right after the launch-overlap wait (before the first round's A loads), which leaves the row
// in bf16 at pro.row() (shared memory, made visible to the block); A row 0 is then read from there
// (the other rows are zero: one row). `first`: blockIdx.x == 0, the block that stores the side
// outputs.
template <class T, bool kOutF32, bool kVec, bool kHalf, bool kStaged, class Tail, bool kStamp = false,
          class Pro = NoPrologue>
__device__ __forceinline__ void splitk_body(const MmaGemmParams& p, const Tail& tail, const Pro& pro = {}) {
  static_assert(!kStaged || kVec, "the staged copies are 16-byte copies");
  static_assert(!Pro::kOn || (kHalf && kVec && !kStamp), "a prologue on the one-row 16-byte path");
  auto stamp = gemm_block_stamp<kStamp>(p, kBlockStampSplitK);
  [[maybe_unused]] typename Pro::Loaded pre{};
  if constexpr (Pro::kOn) pre = pro.before_wait();
  __shared__ float part[T::KW][T::BM][T::BN];  // one round's slice sums, [warp][row][col]
  __shared__ int64_t a_off[T::BM];
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  // kStaged: this warp's slice of the tile's BN weight rows, [row][chunk ^ (row & 7)][8] (the
  // XOR spreads ldmatrix's eight rows of one chunk over distinct banks).
  uint16_t* sb = nullptr;
  if constexpr (kStaged) {
    __shared__ __align__(128) uint16_t staged[T::KW][T::BN * kSliceK];
    sb = staged[warp];
  }

  const int K = p.K;
  const int KC = (K + 15) / 16;
  const int S = (K + kSliceK - 1) / kSliceK;
  const L2Hint w_hint = l2_evict_first_hint(kVec && p.l2_evict_first > 0);
  TileSpot t;
  // kStaged: copy slice s of the tile's BN weight rows into this warp's buffer, row j's 16-byte
  // chunk `lane` (K % 8 == 0: a chunk is wholly inside K or not), one commit group.
  const auto stage_slice = [&](int s) {
    if constexpr (kStaged) {
      const int n0 = t.n_tile * T::BN, k = s * kSliceK + lane * 8;
#pragma unroll
      for (int j = 0; j < T::BN; ++j) {
        const bool in = n0 + j < p.N && k < K;
        cp_async16_at(smem_u32(sb + j * kSliceK + (lane ^ (j & 7)) * 8), in ? t.w + int64_t(n0 + j) * p.ws + k : t.w,
                      in ? 16 : 0, w_hint);
      }
      cp_async_commit();
    }
  };
  // kStaged, dense, under launch overlap with p.prefetch > 1 (ATLAS_GEMM_STAGE_EARLY): the first
  // round's weight slices are copied into shared memory before pdl_begin_gemm(), while the kernel
  // before this one still runs (a dense GEMM's weights are never an earlier kernel's output;
  // prefetch_weights_l2), the later rounds' pulled into L2. x is read only after the wait, as
  // always. Timing only: the same data reaches the same registers.
  bool staged_early = false;
  if constexpr (kStaged) {
    if (p.offsets == nullptr && p.prefetch > 1) {
      const bool found = find_tile<T::BM, kVec>(p, int(blockIdx.x), tid, lane, t);
      if (found) {
        if (warp < S) stage_slice(warp);
        prefetch_weights_l2<T::BN>(p, t.w, t.n_tile * T::BN, T::KW * kSliceK, K);
      }
      pdl_begin_gemm();
      if (!found) return;
      staged_early = true;
    }
  }
  if (!staged_early && !start_tile<T::BM, T::BN, kVec>(p, int(blockIdx.x), tid, lane, t, 0, p.K)) return;
  if constexpr (Pro::kOn) pro.after_wait(pre, blockIdx.x == 0);
  stamp.go();
  const int n0 = t.n_tile * T::BN;
  if (tid < T::BM) a_off[tid] = a_row_offset(p, t.row_begin + tid, t.row_end);
  __syncthreads();

  // Fragment coordinates (m16n8k16): A rows gid and gid + 8, B column (n) gid, k pairs at
  // 2*tig and 2*tig + 8 of each chunk; accumulator rows gid / gid + 8, columns 2*tig, 2*tig + 1.
  const int gid = lane >> 2, tig = lane & 3;
  const uint16_t* ar0 = a_off[gid] >= 0 ? t.x + a_off[gid] : nullptr;
  const uint16_t* ar1 = !kHalf && a_off[gid + 8] >= 0 ? t.x + a_off[gid + 8] : nullptr;
  // A pairs: from global memory, or (a prologue) row 0 from the row it left in shared memory.
  const auto a_pair = [&](const uint16_t* row, int k) -> uint32_t {
    if constexpr (Pro::kOn) {
      (void)row;  // (kHalf: only row gid's pairs, and row 0 is the only one)
      return gid == 0 && k < K ? *reinterpret_cast<const uint32_t*>(pro.row() + k) : 0u;
    } else {
      return load_pair<kVec>(row, k, K);
    }
  };
  const uint16_t* br[T::NI];
#pragma unroll
  for (int ni = 0; ni < T::NI; ++ni) {
    const int col = n0 + ni * 8 + gid;
    br[ni] = col < p.N ? t.w + int64_t(col) * p.ws : nullptr;
  }

  float tot[T::ELEMS];
#pragma unroll
  for (int e = 0; e < T::ELEMS; ++e) tot[e] = 0.0f;

  for (int s0 = 0; s0 < S; s0 += T::KW) {
    const int s = s0 + warp;
    if (s < S) {
      const int c0 = s * kSliceChunks;
      // kStaged: every row's copy in flight before the A loads below (the first round's
      // already are where they were copied early).
      if (kStaged && !(staged_early && s0 == 0)) stage_slice(s);
      // The whole slice's fragments first (independent loads, all in flight), then the mma.
      uint32_t af[kSliceChunks][4];
      uint32_t bf[kSliceChunks][T::NI][2];
#pragma unroll
      for (int c = 0; c < kSliceChunks; ++c) {
        const int k = (c0 + c) * 16 + 2 * tig;
        af[c][0] = a_pair(ar0, k);
        af[c][2] = a_pair(ar0, k + 8);
        if constexpr (kHalf) {
          af[c][1] = af[c][3] = 0u;
        } else {
          af[c][1] = a_pair(ar1, k);
          af[c][3] = a_pair(ar1, k + 8);
        }
        if constexpr (!kStaged) {
#pragma unroll
          for (int ni = 0; ni < T::NI; ++ni) {
            bf[c][ni][0] = load_pair<kVec>(br[ni], k, K, w_hint);
            bf[c][ni][1] = load_pair<kVec>(br[ni], k + 8, K, w_hint);
          }
        }
      }
      if constexpr (kStaged) {
        cp_async_wait<0>();
        __syncwarp();  // every lane's copies of this warp's slice landed
        // ldmatrix.x2: lanes 0-7 address rows ni*8 + 0-7 at the chunk's k 0-7 (-> b0), lanes 8-15
        // the same rows at k 8-15 (-> b1); thread (gid, tig) gets row gid's pairs 2*tig.
#pragma unroll
        for (int c = 0; c < kSliceChunks; ++c)
#pragma unroll
          for (int ni = 0; ni < T::NI; ++ni) {
            const int r = ni * 8 + (lane & 7), q = 2 * c + ((lane >> 3) & 1);
            ldmatrix_x2(bf[c][ni][0], bf[c][ni][1], sb + r * kSliceK + (q ^ (r & 7)) * 8);
          }
      }
      float acc[T::NI][4];
#pragma unroll
      for (int ni = 0; ni < T::NI; ++ni)
#pragma unroll
        for (int q = 0; q < 4; ++q) acc[ni][q] = 0.0f;
#pragma unroll
      for (int c = 0; c < kSliceChunks; ++c) {
        if (c0 + c < KC) {  // warp-uniform: chunks past K are not part of the contract
#pragma unroll
          for (int ni = 0; ni < T::NI; ++ni) mma_bf16_16816(acc[ni], af[c], bf[c][ni][0], bf[c][ni][1]);
        }
      }
#pragma unroll
      for (int ni = 0; ni < T::NI; ++ni) {
        const int col = ni * 8 + 2 * tig;
        part[warp][gid][col] = acc[ni][0];
        part[warp][gid][col + 1] = acc[ni][1];
        if constexpr (!kHalf) {
          part[warp][gid + 8][col] = acc[ni][2];
          part[warp][gid + 8][col + 1] = acc[ni][3];
        }
      }
    }
    __syncthreads();
    // Each output element adds this round's slice sums into its total, in slice order.
    const int nsl = min(T::KW, S - s0);
#pragma unroll
    for (int e = 0; e < T::ELEMS; ++e) {
      const int i = tid + e * T::THREADS;
      const int r = i / T::BN, col = i % T::BN;
      if (i < T::BM * T::BN && (!kHalf || r < 8)) {
        for (int j = 0; j < nsl; ++j) tot[e] = __fadd_rn(tot[e], part[j][r][col]);
      }
    }
    __syncthreads();  // part is overwritten by the next round
  }

#pragma unroll
  for (int e = 0; e < T::ELEMS; ++e) {
    const int i = tid + e * T::THREADS;
    const int r = i / T::BN, col = n0 + i % T::BN;
    const int row = t.row_begin + r;
    if (i < T::BM * T::BN && (!kHalf || r < 8) && row < t.row_end && col < p.N) {
      const int64_t o = t.out_base + int64_t(row) * p.os + col;
      if constexpr (kOutF32)
        static_cast<float*>(p.out)[o] = tot[e];
      else
        static_cast<uint16_t*>(p.out)[o] = f2bf(tot[e]);
    }
  }
  if constexpr (!std::is_same_v<Tail, NoSplitKTail>) {
    // Every block counts itself after its stores (made visible first); the last one to count
    // runs the tail over the whole output, read through L2, and resets the counter for the next
    // launch of the stream.
    __shared__ int last_block;
    __threadfence();
    __syncthreads();
    if (tid == 0) last_block = atomicAdd(tail.counter, 1) == int(gridDim.x * gridDim.y * gridDim.z) - 1;
    __syncthreads();
    if (!last_block) return;
    __threadfence();
    tail(p);
    if (tid == 0) *tail.counter = 0;
  }
}

// kStamp: the diagnostic instantiation (ATLAS_BLOCK_STAMPS; start, end of wait and end, no bytes).
template <class T, bool kOutF32, bool kVec, bool kHalf, bool kStaged = false, bool kStamp = false>
__global__ void __launch_bounds__(T::THREADS) gemm_splitk_kernel(const MmaGemmParams p) {
  splitk_body<T, kOutF32, kVec, kHalf, kStaged, NoSplitKTail, kStamp>(p, NoSplitKTail{});
}

}  // namespace atlas::cuda::kern
