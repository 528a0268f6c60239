// Batch-invariant tensor-core GEMM: out[m][n] = sum_k x[m][k] * w[n][k], bf16 in, fp32 accumulate.
//
// Numerics contract (docs/cuda.md, "GEMM, batch-invariant"), per output element (m, n):
//   acc = 0 (fp32)
//   for c = 0 .. ceil(K/16)-1, ascending:                      (chunks past K are never issued)
//     acc = mma.m16n8k16.row.col.f32.bf16.bf16.f32(A chunk c, B chunk c, acc)
//   out = acc (fp32 out) or bf16(acc) (one rounding, nearest even)
// where A chunk c is x[m][16c .. 16c+15] and B chunk c is w[n][16c .. 16c+15], elements past K
// read as 0, always in the standard fragment positions (k = 16c + j in fragment position j).
// No split-K, nothing of M, N, the tile or the grid enters that sequence: a row's value depends
// on its own x row, the w column and K alone. So every tile configuration below gives the same
// bits and configurations may be chosen by M (small-M decode tiles, 128x128 for prefill), and
// the grouped (MoE) and strided-batch forms run this same code.
//
// Structure: a block computes a BM x BN output tile with WARPS_M x WARPS_N warps (each WM x WN,
// made of MI x NI m16n8 accumulators). K is staged through shared memory in BK-wide slices by a
// STAGES-deep cp.async ring (16-byte copies, zero-fill for rows / k past the edge), rows of
// BK bf16 with the 16-byte chunks XOR-swizzled so ldmatrix and the copies are bank-conflict free.
// kAsync = false is the predicated slow path for operands that are not 16-byte aligned or K not
// a multiple of 8 (tiny test models, odd slices): plain loads element by element, same smem
// layout, same fragments, same chunk sequence, so the same bits.
#pragma once

#include <cstdint>

#include "common.cuh"

namespace atlas::cuda::kern {

// Device error bits raised by the GEMM kernels (decoded in runtime.cu's check_device_errors).
constexpr int kErrGroupedOffsets = 16;  // offsets not 0 = o[0] <= o[1] <= ... <= o[groups] <= max_rows
constexpr int kErrGatherRows = 32;      // an x_rows entry outside [0, x_rows_limit) (or negative)
constexpr int kErrGroupWeight = 64;     // a group's weight pointer null or not 16-byte aligned

template <int BM_, int BN_, int BK_, int WARPS_M_, int WARPS_N_, int STAGES_>
struct MmaTile {
  static constexpr int BM = BM_, BN = BN_, BK = BK_, WARPS_M = WARPS_M_, WARPS_N = WARPS_N_;
  static constexpr int STAGES = STAGES_;
  static constexpr int THREADS = 32 * WARPS_M * WARPS_N;
  static constexpr int WM = BM / WARPS_M, WN = BN / WARPS_N;
  static constexpr int MI = WM / 16, NI = WN / 8;
  static constexpr int CH = BK / 8;  // 16-byte chunks per shared-memory row
  static constexpr int SMEM_BYTES = STAGES * (BM + BN) * BK * 2;
  static_assert(WM % 16 == 0 && WN % 8 == 0, "warp tile must be whole m16n8 tiles");
  static_assert(NI == 1 || NI % 2 == 0, "B fragments load n8 tiles in pairs (or one)");
  static_assert(BK == 32 || BK == 64 || BK == 128, "swizzle defined for 4, 8 or 16 chunks per row");
  static_assert(STAGES >= 2, "pipeline needs two stages at least");
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
};

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

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// 16-byte global -> shared copy; src_bytes = 0 writes 16 zero bytes and reads nothing.
__device__ __forceinline__ void cp_async16(void* dst, const void* src, int src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_u32(dst)), "l"(src), "r"(src_bytes)
               : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_u32(p)));
}
__device__ __forceinline__ void ldmatrix_x2(uint32_t& r0, uint32_t& r1, const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0,%1}, [%2];\n"
               : "=r"(r0), "=r"(r1)
               : "r"(smem_u32(p)));
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
__device__ __forceinline__ void load_chunk(uint16_t* dst, const uint16_t* base, int64_t off, int gk, int K) {
  if constexpr (kAsync) {
    const bool ok = off >= 0 && gk < K;
    cp_async16(dst, ok ? base + off + gk : base, ok ? 16 : 0);
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

template <class T, bool kOutF32, bool kAsync>
__global__ void __launch_bounds__(T::THREADS) gemm_mma_kernel(const MmaGemmParams p) {
  extern __shared__ __align__(128) unsigned char gemm_smem[];
  __shared__ int64_t a_off[T::BM];  // element offset of each tile row's A row in x; -1 = zero row
  __shared__ int64_t b_off[T::BN];  // element offset of each tile column's W row; -1 = zero row
  uint16_t* sA = reinterpret_cast<uint16_t*>(gemm_smem);    // [STAGES][BM][BK] (swizzled chunks)
  uint16_t* sB = sA + T::STAGES * T::BM * T::BK;             // [STAGES][BN][BK]

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int wm = warp / T::WARPS_N, wn = warp % T::WARPS_N;

  // ---- which tile: rows [row_begin, row_end) of the output, columns from n0 ----
  int n_tile, row_begin, row_end;
  const uint16_t* x = p.x;
  const uint16_t* w;
  int64_t out_base = 0;  // element offset of this problem's out (batch)
  if (p.offsets == nullptr) {
    const int pid = blockIdx.x;
    const int per_group = kRasterGroup * p.n_tiles;
    const int first_m = (pid / per_group) * kRasterGroup;
    const int gm = min(p.m_tiles - first_m, kRasterGroup);
    const int m_tile = first_m + (pid % per_group) % gm;
    n_tile = (pid % per_group) / gm;
    row_begin = m_tile * T::BM;
    row_end = min(row_begin + T::BM, p.M);
    const int64_t b = blockIdx.z;
    x += b * p.x_bs;
    w = p.w + b * p.w_bs;
    out_base = b * p.o_bs;
  } else {
    // Grouped: tile t is the j-th BM-row tile of group g, counting tiles group after group
    // (ceil(rows_g / BM) each). Every warp scans the offsets itself (identical results, no
    // barrier needed) and checks them; the grid's tile bound is host-side, so blocks past the
    // last real tile find nothing and exit.
    const int t = blockIdx.x / p.n_tiles;
    n_tile = blockIdx.x % p.n_tiles;
    bool bad = false;
    int base = 0, g_found = -1, lo_found = 0, hi_found = 0, j_found = 0;
    for (int g0 = 0; g0 < p.groups; g0 += 32) {
      const int g = g0 + lane;
      int lo = 0, hi = 0;
      if (g < p.groups) {
        lo = p.offsets[g];
        hi = p.offsets[g + 1];
        bad |= (g == 0 && lo != 0) || hi < lo || hi > p.max_rows || lo < 0;
      }
      // Clamp so a corrupt table cannot overflow the tile arithmetic (the block exits anyway).
      lo = min(max(lo, 0), p.max_rows);
      hi = min(max(hi, lo), p.max_rows);
      const int tiles = (hi - lo + T::BM - 1) / T::BM;
      int inc = tiles;
#pragma unroll
      for (int off = 1; off < 32; off <<= 1) {
        const int v = __shfl_up_sync(0xffffffffu, inc, off);
        if (lane >= off) inc += v;
      }
      const int excl = base + inc - tiles;
      const unsigned hit = __ballot_sync(0xffffffffu, g < p.groups && tiles > 0 && t >= excl && t < excl + tiles);
      if (hit != 0 && g_found < 0) {
        const int src = __ffs(hit) - 1;
        g_found = g0 + src;
        lo_found = __shfl_sync(0xffffffffu, lo, src);
        hi_found = __shfl_sync(0xffffffffu, hi, src);
        j_found = t - __shfl_sync(0xffffffffu, excl, src);
      }
      base += __shfl_sync(0xffffffffu, inc, 31);
    }
    bad = __any_sync(0xffffffffu, bad);
    if (bad) {
      if (blockIdx.x == 0 && tid == 0) atomicOr(p.error_flag, kErrGroupedOffsets);
      return;  // whole block: every warp saw the same table
    }
    if (g_found < 0) return;  // a block past the last real tile
    row_begin = lo_found + j_found * T::BM;
    row_end = min(row_begin + T::BM, hi_found);
    w = p.w_groups[g_found];
    if (w == nullptr || (kAsync && (reinterpret_cast<uintptr_t>(w) & 15u) != 0)) {
      if (tid == 0) atomicOr(p.error_flag, kErrGroupWeight);
      return;
    }
  }
  const int n0 = n_tile * T::BN;

  for (int r = tid; r < T::BM; r += T::THREADS) {
    const int row = row_begin + r;
    int64_t off = -1;
    if (row < row_end) {
      int64_t src = row;
      if (p.x_rows != nullptr) {
        src = p.x_rows[row];
        if (src < 0 || (p.x_rows_limit > 0 && src >= p.x_rows_limit)) {
          atomicOr(p.error_flag, kErrGatherRows);
          src = -1;
        }
      }
      if (src >= 0) off = src * p.xs;
    }
    a_off[r] = off;
  }
  for (int r = tid; r < T::BN; r += T::THREADS) b_off[r] = n0 + r < p.N ? int64_t(n0 + r) * p.ws : -1;
  __syncthreads();

  const int K = p.K;
  const int KT = (K + T::BK - 1) / T::BK;  // BK slices
  const int KC = (K + 15) / 16;            // 16-wide chunks: exactly these mma steps per output

  auto load_stage = [&](int slot, int kt) {
    const int k0 = kt * T::BK;
    uint16_t* sa = sA + slot * (T::BM * T::BK);
    uint16_t* sb = sB + slot * (T::BN * T::BK);
    // Rows past M (or N) are zero in every slice: each slot zero-fills them on its first use
    // (slot s first holds slice s) and nothing overwrites them later, so later fills skip them
    // (a 1-row decode tile then copies 1 A row instead of 16).
    const bool first_fill = kt < T::STAGES;
#pragma unroll
    for (int i0 = 0; i0 < T::BM * T::CH; i0 += T::THREADS) {
      const int i = i0 + tid;
      if (T::BM * T::CH % T::THREADS == 0 || i < T::BM * T::CH) {
        const int r = i / T::CH, c = i % T::CH;
        const int64_t off = a_off[r];
        if (off >= 0 || first_fill)
          load_chunk<kAsync>(sa + r * T::BK + swz<T::CH>(r, c) * 8, x, off, k0 + c * 8, K);
      }
    }
#pragma unroll
    for (int i0 = 0; i0 < T::BN * T::CH; i0 += T::THREADS) {
      const int i = i0 + tid;
      if (T::BN * T::CH % T::THREADS == 0 || i < T::BN * T::CH) {
        const int r = i / T::CH, c = i % T::CH;
        const int64_t off = b_off[r];
        if (off >= 0 || first_fill)
          load_chunk<kAsync>(sb + r * T::BK + swz<T::CH>(r, c) * 8, w, off, k0 + c * 8, K);
      }
    }
  };

  float acc[T::MI][T::NI][4];
#pragma unroll
  for (int mi = 0; mi < T::MI; ++mi)
#pragma unroll
    for (int ni = 0; ni < T::NI; ++ni)
#pragma unroll
      for (int q = 0; q < 4; ++q) acc[mi][ni][q] = 0.0f;

#pragma unroll
  for (int s = 0; s < T::STAGES - 1; ++s) {
    if (s < KT) load_stage(s, s);
    cp_async_commit();
  }

  for (int kt = 0; kt < KT; ++kt) {
    cp_async_wait<T::STAGES - 2>();  // slice kt has landed (this thread's copies) ...
    __syncthreads();                 // ... everyone's, and slot (kt-1) % STAGES is free again
    {
      const int nk = kt + T::STAGES - 1;
      if (nk < KT) load_stage(nk % T::STAGES, nk);
      cp_async_commit();
    }
    const uint16_t* sa = sA + (kt % T::STAGES) * (T::BM * T::BK);
    const uint16_t* sb = sB + (kt % T::STAGES) * (T::BN * T::BK);
#pragma unroll
    for (int kk = 0; kk < T::BK / 16; ++kk) {
      if (kt * (T::BK / 16) + kk < KC) {  // uniform: chunks past K are not part of the contract
        uint32_t af[T::MI][4];
        uint32_t bfr[T::NI][2];
#pragma unroll
        for (int mi = 0; mi < T::MI; ++mi) {
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
        for (int mi = 0; mi < T::MI; ++mi)
#pragma unroll
          for (int ni = 0; ni < T::NI; ++ni) mma_bf16_16816(acc[mi][ni], af[mi], bfr[ni][0], bfr[ni][1]);
      }
    }
  }
  cp_async_wait<0>();

  // ---- epilogue: accumulator (mi, ni, q) is row gid (+8 for q >= 2), columns 2*tig + {0, 1} ----
  const int gid = lane >> 2, tig = lane & 3;
#pragma unroll
  for (int mi = 0; mi < T::MI; ++mi)
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int row = row_begin + wm * T::WM + mi * 16 + gid + half * 8;
      if (row >= row_end) continue;
      const int64_t o_row = out_base + int64_t(row) * p.os;
#pragma unroll
      for (int ni = 0; ni < T::NI; ++ni) {
        const int col = n0 + wn * T::WN + ni * 8 + tig * 2;
        if (col >= p.N) continue;
        const float v0 = acc[mi][ni][half * 2], v1 = acc[mi][ni][half * 2 + 1];
        const bool two = col + 1 < p.N;
        if constexpr (kOutF32) {
          float* o = static_cast<float*>(p.out) + o_row + col;
          if (two && p.pair_store) {
            *reinterpret_cast<float2*>(o) = make_float2(v0, v1);
          } else {
            o[0] = v0;
            if (two) o[1] = v1;
          }
        } else {
          uint16_t* o = static_cast<uint16_t*>(p.out) + o_row + col;
          if (two && p.pair_store) {
            *reinterpret_cast<uint32_t*>(o) = uint32_t(f2bf(v0)) | (uint32_t(f2bf(v1)) << 16);
          } else {
            o[0] = f2bf(v0);
            if (two) o[1] = f2bf(v1);
          }
        }
      }
    }
}

}  // namespace atlas::cuda::kern
