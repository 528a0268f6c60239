// Batch-invariant GEMM for at most 8 rows per tile on wgmma with the operands swapped (session
// 23): 64 weight rows are the instruction's A operand and the tile's x rows its 8-wide B operand,
// wgmma.m64n8k16, D = W . X^T. Same numerics contract as kernels/gemm_mma.cuh (read it first),
// so the same bits as every other config: per output, the k16 chunks of a 256-wide K slice are
// chained into an fp32 accumulator from +0 (each wgmma updates an output by its own 16-term
// product, as mma.m16n8k16 does; chunks past K are never issued), and each finished slice is
// added to the running total in slice order. atlas_wgmma_gemv_probe (bench/cuda) showed those
// bits equal to the mma.sync reference (sessions 22-23) and this shape streaming the batch-1
// routed gate|up's 69 MB at ~3.9 TB/s by its span, where the 8 x 8 mma.sync tiles of
// kernels/gemm_stream.cuh issue ~490 instructions per 4 KB (session 13) and reach ~3.
//
// Work: a tile is up to 8 output rows (BM) x 64 columns (BN: 64 weight rows), the whole K; tiles
// numbered as in find_tile (grouped: group after group, n-tiles innermost; dense: the raster,
// then the batch). Persistent: block b takes tiles [b T / B, (b + 1) T / B) of the T real tiles
// (grouped: counted on the device from the offsets) and walks their BK-wide K steps as one
// sequence through a STAGES-deep cp.async ring, STAGES - 2 steps ahead across tile boundaries
// (a slot is refilled two steps after its last read, whose wgmma group wait_group 1 retired).
// A slot holds BK / 64 swizzle atoms of the 64 weight rows ([64][64] bf16, 128-byte rows, the
// 16-byte chunks XOR-swizzled by row: the hardware's 128-byte swizzle, as kernels/gemm_wgmma.cuh)
// and of the tile's 8 x rows ([8][64]); x rows past the tile's and weight rows past N are copied
// as zeros. One warpgroup (128 threads) per block.
// Fused gate|up (p.gated): b_row_offset interleaves the weight rows (tile row 2j gate j, 2j + 1
// up j), so a thread's D rows n (gate) and n + 1 (up, the lane four above) pair up by a shuffle,
// and the epilogue writes gated_value as the other kernels' fused epilogue does.
// Dense problems copy their first steps' weights before pdl_begin_gemm() (weights are never an
// earlier kernel's output, kernels/pdl.cuh; MmaGemmParams::prefetch 2, or an L2 prefetch with 1);
// every x copy comes after it. Grouped ones wait first (the offsets are an earlier kernel's).
// Async operands only (16-byte rows, K % 16 == 0); the host runs another config otherwise (same
// bits). Compiled only into sm_90a code; the host asks gemm_stream_probe_kernel first.
// Register-staged copies (LEAD > 0, session 24, ATLAS_GEMM_STREAM_REGS=1; measured slower in the
// decode step, 398.5 vs 425.9 tok/s, H200 s25-1, so off): the same tiles, steps and wgmma chain,
// but each thread loads its 16-byte chunks of step s into registers (plain ld.global.nc, the
// weights with the L2 evict_first policy) LEAD steps before it stores them into the step's ring
// slot (st.shared, then the async-proxy fence and the block barrier the wgmma reads need). Why:
// atlas_stream_sweep_probe (s23-1) streamed 69 / 138 MB at 4.2-4.4 TB/s by plain 16-byte loads
// against 3.6-3.9 through cp.async or bulk-copy rings. A slot is written one step ahead of its
// wgmma and two after its last read (STAGES 3).
// gemm_wgstream_lean_kernel (session 30, the default where this config runs): the same loop
// with the per-step work cut down; its comment says why.
#pragma once

#include <type_traits>

#include "gemm_stream.cuh"  // grouped_tile_count, gemm_stream_probe_kernel
#include "gemm_wgmma.cuh"   // wg_desc, wg_fence, wg_commit, wg_wait_*
#include "route_core.cuh"   // route_permute_one_token, route_token, permute_one_warp (kRoute)

namespace atlas::cuda::kern {

// WGS_ = 2 (session 28, config "streamwg64x8/4x2", A/B only: ATLAS_GEMM_STREAM_FEW): two warpgroups per
// block, each with its own ring, walk the same tiles; warpgroup w takes the K slices s with
// s % 2 == w (their BK steps chained as above), keeps each finished slice's sum in registers, and
// at the tile's end warpgroup 1 hands its slice sums to warpgroup 0 through shared memory, which
// adds all of them to the total in slice order from +0 (the one-warpgroup loop's order: the same
// bits) and stores. Why: one tile per block (the shared experts' gate|up, 88 tiles) is bound by
// one warpgroup's loop (~10-20 GB/s per block whatever the ring's depth, session 28); two loops per
// tile took it from 22.8 to 14.6 us per call (s28-5), though its 161 KB per block then keep the
// routed gate|up's blocks off the SMs and the step is slower. K must have more than one slice
// and at most 2 * kMaxParts (the host falls back to the one-warpgroup config otherwise: the same
// bits).
template <int BK_, int STAGES_, int LEAD_ = 0, int WGS_ = 1>
struct WgStreamTile {
  static constexpr int BK = BK_, STAGES = STAGES_;
  static constexpr int LEAD = LEAD_;  // > 0: register-staged copies, LEAD steps in registers
  static constexpr int WGS = WGS_;    // warpgroups per block (1, or 2: K slices split between them)
  static constexpr int BM = 8, BN = 64, WG_THREADS = 128, THREADS = WG_THREADS * WGS;
  static constexpr int ATOMS = BK / 64;                   // swizzle atoms per step (64 k each)
  static constexpr int ATOM_W = 64 * 64 * 2, ATOM_X = 8 * 64 * 2;  // bytes
  static constexpr int SLOT_W = ATOMS * ATOM_W, SLOT_X = ATOMS * ATOM_X;
  static constexpr int CPR = BK / 8;                      // 16-byte chunks per row and step
  static constexpr int CPR_LOG2 = BK == 64 ? 3 : BK == 128 ? 4 : 5;
  static constexpr int RP = WG_THREADS / CPR;             // rows one pass of the warpgroup copies
  static constexpr int W_PER_THREAD = BN * CPR / WG_THREADS;  // weight chunks per thread and step
  static constexpr int kMaxParts = 8;  // WGS 2: slice sums per warpgroup and tile (K <= 4096)
  static constexpr int PARTS_BYTES = WGS > 1 ? kMaxParts * WG_THREADS * 16 : 0;  // warpgroup 1's, handed over
  // + aligning the ring to 1 KB
  static constexpr int SMEM_BYTES = WGS * STAGES * (SLOT_W + SLOT_X) + 1024 + PARTS_BYTES;
  static_assert(BK == 64 || BK == 128 || BK == 256, "whole atoms, whole steps per K slice");
  static_assert(kSliceK % BK == 0, "a K slice must be whole BK steps");
  static_assert(STAGES >= 3, "a slot is refilled two steps after its last read");
  static_assert(LEAD == 0 || (LEAD >= 1 && LEAD <= 3), "register-staged: 1 to 3 steps in registers");
  static_assert(WGS == 1 || (WGS == 2 && LEAD == 0), "two warpgroups: cp.async rings only");
  static_assert(BN * CPR % WG_THREADS == 0 && BM * CPR <= WG_THREADS, "copy plan");
};

// D(64 x 8) += A(64 x 16) . B(16 x 8), both K-major in shared memory (128-byte swizzle).
__device__ __forceinline__ void wgmma_m64n8k16(float (&d)[4], uint64_t da, uint64_t db) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %6, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n8k16.f32.bf16.bf16 {%0, %1, %2, %3}, %4, %5, p, 1, 1, 0, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "l"(da), "l"(db), "r"(1));
#endif
}

// 16 bytes from global memory into registers (the non-coherent path: weights, or activations an
// earlier kernel wrote), with h's L2 policy where h.on.
__device__ __forceinline__ uint4 ldg16(const uint16_t* src, L2Hint h) {
  uint4 v;
  if (h.on)
    asm volatile("ld.global.nc.L2::cache_hint.v4.u32 {%0, %1, %2, %3}, [%4], %5;\n"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(src), "l"(h.policy));
  else
    asm volatile("ld.global.nc.v4.u32 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(src));
  return v;
}
__device__ __forceinline__ void sts16(uint32_t dst, const uint4& v) {
  asm volatile("st.shared.v4.u32 [%0], {%1, %2, %3, %4};\n" ::"r"(dst), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w)
               : "memory");
}

// The epilogue of a finished tile ct from a thread's totals (both loops below): thread (warp w,
// lane l) holds D rows n = 64 n_tile + 16 w + l / 4 and n + 8 (output columns) for x rows
// 2 (l % 4) and + 1. Fused gate|up: rows n and n + 8 (gate) pair with n + 1 and n + 9 (up), held
// by lane + 4, and the even l / 4 store gated_value.
template <class T, bool kOutF32>
__device__ __forceinline__ void wgstream_store_tile(const MmaGemmParams& p, const TileSpot& ct, int warp, int lane,
                                                    const float (&tot)[4]) {
  const int g = lane >> 2, tq = lane & 3;
  const int n = ct.n_tile * T::BN + warp * 16 + g;
  if (p.gated > 0 && !kOutF32) {
    float up[4];
#pragma unroll
    for (int e = 0; e < 4; ++e) up[e] = __shfl_xor_sync(0xffffffffu, tot[e], 4);
    if ((g & 1) != 0) return;
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int row = ct.row_begin + 2 * tq + (e & 1), col = n + (e >> 1) * 8;
      if (row < ct.row_end && col < p.N)
        static_cast<uint16_t*>(p.out)[ct.out_base + int64_t(row) * p.os + (col >> 1)] = gated_value(tot[e], up[e]);
    }
    return;
  }
#pragma unroll
  for (int e = 0; e < 4; ++e) {
    const int row = ct.row_begin + 2 * tq + (e & 1), col = n + (e >> 1) * 8;
    if (row < ct.row_end && col < p.N) store_out_pair<kOutF32>(p, ct.out_base + int64_t(row) * p.os + col, tot[e], 0.f, false);
  }
}

// kTail: K % BK != 0 (the host picks the instance): the last step of a tile has fewer chunks.
// Its own instance because a wgmma under a data-dependent test makes ptxas serialise every wgmma
// of the kernel (C7520); every V2-Lite shape has K % 128 == 0.
template <class T, bool kOutF32, bool kTail>
__global__ void __launch_bounds__(T::THREADS) gemm_wgstream_kernel(const MmaGemmParams p) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  extern __shared__ __align__(128) unsigned char gemm_smem[];
  const uint32_t raw = smem_u32(gemm_smem);
  // WGS > 1: warpgroup wg's thread tid (0-127) and its own ring; wg is 0 with one warpgroup.
  const int wg = T::WGS > 1 ? int(threadIdx.x) / T::WG_THREADS : 0;
  const uint32_t base = (raw + 1023u) & ~1023u;
  const uint32_t ring_w = base + uint32_t(wg * T::STAGES * T::SLOT_W);  // [WGS][STAGES][ATOMS][64][64]
  const uint32_t ring_x = base + uint32_t(T::WGS * T::STAGES * T::SLOT_W + wg * T::STAGES * T::SLOT_X);  // [..][8][64]
  const int tid = T::WGS > 1 ? int(threadIdx.x) % T::WG_THREADS : int(threadIdx.x), lane = tid & 31, warp = tid >> 5;
  const bool grouped = p.offsets != nullptr;
  if (grouped) pdl_begin_gemm();
  const auto [first, last] = stream_share<T::BM>(p, lane);
  const int K = p.K;
  const int KT = (K + T::BK - 1) / T::BK;
  constexpr int kSteps = kSliceK / T::BK;  // steps per K slice
  // This warpgroup's steps per tile (WGS > 1: those of the slices s with s % WGS == wg), and the
  // tile's step index of its j-th.
  int KTW = KT;
  if constexpr (T::WGS > 1) {
    constexpr int kGroup = kSteps * T::WGS;
    KTW = KT / kGroup * kSteps + min(max(KT % kGroup - wg * kSteps, 0), kSteps);
  }
  const auto kt_of = [&](int j) {
    if constexpr (T::WGS > 1)
      return j / kSteps * (kSteps * T::WGS) + wg * kSteps + j % kSteps;
    else
      return j;
  };
  const int steps = (last - first) * KTW;
  constexpr int kAhead = T::STAGES - 2;

  // The tile of pid (false: none, or a bad table / weight find_tile flagged).
  const auto tile_of = [&](int pid, TileSpot& t) {
    return stream_tile<T::BM>(p, pid, tid, lane, t);
  };

  // Issue side. This thread copies chunk c = tid % CPR of weight rows tid / CPR + q (THREADS /
  // CPR) and, for tid < BM * CPR, chunk c of x row tid / CPR. Offsets of the issue tile (-1: a
  // zero row), refreshed when the issue side enters a tile.
  const int c = tid % T::CPR, r0 = tid / T::CPR;
  int64_t w_off[T::W_PER_THREAD];
  int64_t x_off = -1;
  const uint16_t* iw = p.w;
  const uint16_t* ix = p.x;
  int itile = -1;  // tile index (from first) whose offsets are loaded; -1: none, -2: no tile (stop)
  const auto enter_issue_tile = [&](int i) {
    TileSpot t;
    if (!tile_of(first + i, t)) {
      itile = -2;
      return;
    }
    itile = i;
    iw = t.w;
    ix = t.x;
#pragma unroll
    for (int q = 0; q < T::W_PER_THREAD; ++q) w_off[q] = b_row_offset(p, t.n_tile * T::BN + r0 + q * T::RP);
    x_off = r0 < T::BM ? a_row_offset(p, t.row_begin + r0, t.row_end) : -1;
  };
  const L2Hint w_hint = l2_evict_first_hint(p.l2_evict_first > 0);
  // Step s's chunk of this thread in slot `slot`: weights (kW) and / or x (kX).
  const auto copy_step = [&](int slot, int s, bool kW, bool kX) {
    if (s >= steps) return;
    if (s / KTW != itile && itile != -2) enter_issue_tile(s / KTW);
    if (itile == -2) return;
    const int k = kt_of(s % KTW) * T::BK + c * 8;
    const int atom = c >> 3, cc = c & 7;
    if (kW) {
#pragma unroll
      for (int q = 0; q < T::W_PER_THREAD; ++q) {
        const int r = r0 + q * T::RP;
        const bool in = w_off[q] >= 0 && k < K;
        const uint32_t dst = ring_w + uint32_t(slot * T::SLOT_W + atom * T::ATOM_W + r * 128 + ((cc ^ (r & 7)) * 16));
        cp_async16_at(dst, in ? iw + w_off[q] + k : iw, in ? 16 : 0, w_hint);
      }
    }
    if (kX && r0 < T::BM) {
      const bool in = x_off >= 0 && k < K;
      const uint32_t dst = ring_x + uint32_t(slot * T::SLOT_X + atom * T::ATOM_X + r0 * 128 + ((cc ^ (r0 & 7)) * 16));
      cp_async16_at(dst, in ? ix + x_off + k : ix, in ? 16 : 0);
    }
  };

  // Register-staged copies (LEAD > 0): step s's chunks of this thread in rw[s % LEAD] (weights,
  // then x), loaded LEAD steps before they are stored into the step's slot. Zeros where the
  // cp.async path copies zeros (rows past N or the tile, chunks past K, no tile).
  constexpr int kLead = T::LEAD > 0 ? T::LEAD : 1;
  uint4 rw[kLead][T::W_PER_THREAD + 1];
  const auto load_regs = [&](int s, uint4(&r)[T::W_PER_THREAD + 1], bool kW, bool kX) {
    if (s >= steps) return;
    if (s / KT != itile && itile != -2) enter_issue_tile(s / KT);
    const int k = (s % KT) * T::BK + c * 8;
    const uint4 zero = make_uint4(0u, 0u, 0u, 0u);
    if (kW) {
#pragma unroll
      for (int q = 0; q < T::W_PER_THREAD; ++q)
        r[q] = itile != -2 && w_off[q] >= 0 && k < K ? ldg16(iw + w_off[q] + k, w_hint) : zero;
    }
    if (kX) r[T::W_PER_THREAD] = itile != -2 && x_off >= 0 && k < K ? ldg16(ix + x_off + k, L2Hint{}) : zero;
  };
  const auto store_regs = [&](int slot, const uint4(&r)[T::W_PER_THREAD + 1]) {
    const int atom = c >> 3, cc = c & 7;
#pragma unroll
    for (int q = 0; q < T::W_PER_THREAD; ++q) {
      const int row = r0 + q * T::RP;
      sts16(ring_w + uint32_t(slot * T::SLOT_W + atom * T::ATOM_W + row * 128 + ((cc ^ (row & 7)) * 16)), r[q]);
    }
    if (r0 < T::BM)
      sts16(ring_x + uint32_t(slot * T::SLOT_X + atom * T::ATOM_X + r0 * 128 + ((cc ^ (r0 & 7)) * 16)),
            r[T::W_PER_THREAD]);
  };

  if constexpr (T::LEAD == 0) {
    // Prologue: steps [0, kAhead). Dense weights before the wait (staged, or pulled into L2).
    if (!grouped && p.prefetch > 1) {
#pragma unroll
      for (int s = 0; s < kAhead; ++s) copy_step(s % T::STAGES, s, true, false);
    } else if (!grouped && p.prefetch == 1 && steps > 0) {
      enter_issue_tile(0);
      if (itile == 0 && c == 0)
#pragma unroll
        for (int q = 0; q < T::W_PER_THREAD; ++q)
          if (w_off[q] >= 0) prefetch_l2(iw + w_off[q], uint32_t(min(K, kAhead * T::BK)) * 2u);
    }
    if (!grouped) pdl_begin_gemm();
    const bool early = !grouped && p.prefetch > 1;
#pragma unroll
    for (int s = 0; s < kAhead; ++s) {
      copy_step(s % T::STAGES, s, !early, true);
      cp_async_commit();
    }
  } else {
    // Prologue: steps [0, LEAD) into registers (dense weights before the wait), step 0 into its
    // slot, step LEAD into the registers step 0 left.
    const bool early = !grouped && p.prefetch > 0;
    if (early)
#pragma unroll
      for (int s = 0; s < T::LEAD; ++s) load_regs(s, rw[s], true, false);
    if (!grouped) pdl_begin_gemm();
#pragma unroll
    for (int s = 0; s < T::LEAD; ++s) load_regs(s, rw[s], !early, true);
    if (steps > 0) store_regs(0, rw[0]);
    load_regs(T::LEAD, rw[0], true, true);
    fence_proxy_async_smem();  // the stores (generic proxy) before the wgmma's reads
    __syncthreads();
  }

  // Compute side. Thread (warp w, lane l) holds D rows n = 16 w + l / 4 and n + 8 (weight rows,
  // i.e. output columns) for x rows m = 2 (l % 4) and m + 1: acc[0] = (n, m), [1] = (n, m + 1),
  // [2] = (n + 8, m), [3] = (n + 8, m + 1).
  float acc[4] = {0.f, 0.f, 0.f, 0.f}, tot[4] = {0.f, 0.f, 0.f, 0.f};
  // Store the finished tile `tile` (from first); nothing where find_tile finds none (a bad table
  // or weight it flagged: the issue side copied nothing for it either).
  const auto store = [&](int tile) {
    TileSpot ct;
    if (tile_of(first + tile, ct)) wgstream_store_tile<T, kOutF32>(p, ct, warp, lane, tot);
  };
  bool pending = false;  // a slice's last group is in flight: fold it into the total first
  // WGS > 1: this warpgroup's finished slice sums of the tile (part[q]: its q-th slice, the tile's
  // slice q * WGS + wg), and the pending one's q.
  float part[T::WGS > 1 ? T::kMaxParts : 1][4];
  int pend_q = 0;
  const auto stash = [&]() {
#pragma unroll
    for (int q = 0; q < (T::WGS > 1 ? T::kMaxParts : 1); ++q)
      if (q == pend_q)
#pragma unroll
        for (int e = 0; e < 4; ++e) part[q][e] = acc[e];
#pragma unroll
    for (int e = 0; e < 4; ++e) acc[e] = 0.f;
  };
  // WGS > 1, at a tile's end in both warpgroups: warpgroup 1's slice sums into shared memory (after
  // the rings), then warpgroup 0 adds every slice's sum to the total in slice order from +0, as the
  // one-warpgroup loop does, and stores; the second barrier keeps warpgroup 1 from overwriting the
  // sums before they are read.
  const auto finish_tile = [&](int tile) {
    float4* handed = reinterpret_cast<float4*>(gemm_smem + (base - raw) + T::WGS * T::STAGES * (T::SLOT_W + T::SLOT_X));
    const int KS = (KT + kSteps - 1) / kSteps;  // the tile's K slices
    if (wg == 1)
#pragma unroll
      for (int q = 0; q < T::kMaxParts; ++q)
        if (2 * q + 1 < KS) handed[q * T::WG_THREADS + tid] = make_float4(part[q][0], part[q][1], part[q][2], part[q][3]);
    __syncthreads();
    if (wg == 0) {
#pragma unroll
      for (int e = 0; e < 4; ++e) tot[e] = 0.f;
#pragma unroll
      for (int sl = 0; sl < 2 * T::kMaxParts; ++sl) {
        if (sl < KS) {
          float v[4];
          if (sl % 2 == 0) {
#pragma unroll
            for (int e = 0; e < 4; ++e) v[e] = part[sl / 2][e];
          } else {
            const float4 h = handed[(sl / 2) * T::WG_THREADS + tid];
            v[0] = h.x, v[1] = h.y, v[2] = h.z, v[3] = h.w;
          }
#pragma unroll
          for (int e = 0; e < 4; ++e) tot[e] = __fadd_rn(tot[e], v[e]);
        }
      }
      store(tile);
    }
    __syncthreads();
  };
  // Step i's compute: first the pending slice's fold (and, at a tile's first step, the store of
  // the tile before), then step i's wgmma chain on its slot, committed.
  const auto compute = [&](int i) {
    const int kt = kt_of(i % KTW);
    if (pending) {
      wg_wait_all();
      if constexpr (T::WGS == 1) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          tot[e] = __fadd_rn(tot[e], acc[e]);
          acc[e] = 0.f;
        }
      } else {
        stash();
      }
      pending = false;
      if (T::WGS == 1 ? kt == 0 : i % KTW == 0) {  // ... and it was the tile's last (its first step here)
        if constexpr (T::WGS == 1) {
          store(i / KTW - 1);
#pragma unroll
          for (int e = 0; e < 4; ++e) tot[e] = 0.f;
        } else {
          finish_tile(i / KTW - 1);
        }
      }
    }
    const uint32_t wb = ring_w + uint32_t((i % T::STAGES) * T::SLOT_W);
    const uint32_t xb = ring_x + uint32_t((i % T::STAGES) * T::SLOT_X);
    const auto chunk = [&](int kk) {
      wgmma_m64n8k16(acc, wg_desc(wb + uint32_t((kk >> 2) * T::ATOM_W + (kk & 3) * 32)),
                     wg_desc(xb + uint32_t((kk >> 2) * T::ATOM_X + (kk & 3) * 32)));
    };
    wg_fence();
    if constexpr (kTail) {
      const int kc = min(T::BK / 16, (K - kt * T::BK) / 16);  // k16 chunks inside K (K % 16 == 0)
#pragma unroll
      for (int kk = 0; kk < T::BK / 16; ++kk)
        if (kk < kc) chunk(kk);  // chunks past K are not in the contract
    } else {
#pragma unroll
      for (int kk = 0; kk < T::BK / 16; ++kk) chunk(kk);
    }
    wg_commit();
  };
  if constexpr (T::LEAD == 0) {
    for (int i = 0; i < steps; ++i) {
      cp_async_wait<kAhead - 1>();
      fence_proxy_async_smem();  // the copies' writes (generic proxy) before the wgmma's reads
      if constexpr (T::WGS == 1)
        __syncthreads();
      else  // this warpgroup's threads only (its ring is its own)
        asm volatile("bar.sync %0, %1;\n" ::"r"(1 + wg), "n"(T::WG_THREADS) : "memory");
      copy_step((i + kAhead) % T::STAGES, i + kAhead, true, true);
      cp_async_commit();
      compute(i);
      wg_wait_one();
      const int kt = kt_of(i % KTW);
      pending = (kt + 1) % kSteps == 0 || kt + 1 == KT;
      if constexpr (T::WGS > 1) pend_q = kt / kSteps / T::WGS;
    }
  } else {
    // Step i: its wgmma (slot i % STAGES, stored and fenced the step before), then step i + 1's
    // registers into its slot, whose last reader (step i + 1 - STAGES) the wait_one of the step
    // before retired in every warp before the barrier; then step i + 1 + LEAD's loads into those
    // registers. Unrolled by LEAD so that the registers are named at compile time (i0 % LEAD == 0).
    static_assert(T::LEAD == 0 || T::STAGES == 3, "register-staged: a slot per step in flight, written, retired");
    for (int i0 = 0; i0 < steps; i0 += kLead) {
#pragma unroll
      for (int u = 0; u < kLead; ++u) {
        const int i = i0 + u;
        if (i >= steps) break;
        compute(i);
        if (i + 1 < steps) store_regs((i + 1) % T::STAGES, rw[(u + 1) % kLead]);
        load_regs(i + 1 + kLead, rw[(u + 1) % kLead], true, true);
        wg_wait_one();
        const int kt = i % KT;
        pending = (kt + 1) % kSteps == 0 || kt + 1 == KT;
        fence_proxy_async_smem();  // step i + 1's stores before its wgmma's reads
        __syncthreads();
      }
    }
  }
  wg_wait_all();
  cp_async_wait<0>();  // nothing in flight when the block's shared memory is released
  if constexpr (T::WGS == 1) {
    if (pending) {
#pragma unroll
      for (int e = 0; e < 4; ++e) tot[e] = __fadd_rn(tot[e], acc[e]);
      store(steps / KT - 1);
    }
  } else {
    // Both warpgroups have steps in every tile of the block (the host keeps K past one slice), so
    // both end here with a pending slice and meet in finish_tile as often.
    if (pending) stash();
    if (steps > 0) finish_tile(steps / KTW - 1);
  }
#else
  __trap();  // the host never launches it without sm_90a device code (gemm_stream_probe_kernel)
#endif
}

// The lean loop's sources in tile pid (-1: past the block's share), for thread tid's copies
// (chunk c = tid % CPR of weight rows r0 + RP j, r0 = tid / CPR, j < W_PER_THREAD, and of x row
// r0): the first weight row's chunk, the byte stride to the next (rows r0 + RP j of the tile are
// RP j rows on, or RP j / 2 with the gate|up rows interleaved: b_row_offset), how many of them lie
// inside N (full: all 64 rows of the tile do), the x chunk and its copy size (0: zeros), or stop
// where there is no tile. Out of line: one copy of find_tile's code, off the loop's path.
struct LeanSources {
  const char* w = nullptr;
  const char* x = nullptr;
  int64_t wstride = 0;
  int wrows = 0, xsz = 0;
  bool stop = true, full = false;
};
template <class T>
__device__ __noinline__ LeanSources lean_sources(const MmaGemmParams& p, int pid, int tid, int lane) {
  LeanSources s;
  TileSpot t;
  if (pid < 0 || !stream_tile<T::BM>(p, pid, tid, lane, t)) return s;
  constexpr int RP = T::RP;  // 8 (BK 128) or 16 (BK 64)
  const int r0 = tid >> T::CPR_LOG2, c = tid & (T::CPR - 1);
  const int n0 = t.n_tile * T::BN + r0;
  const int64_t wo = b_row_offset(p, n0), xo = a_row_offset(p, t.row_begin + r0, t.row_end);
  s.w = reinterpret_cast<const char*>(t.w + (wo >= 0 ? wo : 0)) + 16 * c;
  s.wstride = int64_t(p.gated > 0 ? RP / 2 : RP) * p.ws * 2;
  s.wrows = n0 < p.N ? min(T::W_PER_THREAD, (p.N - n0 + RP - 1) / RP) : 0;
  s.full = (t.n_tile + 1) * T::BN <= p.N;
  s.x = reinterpret_cast<const char*>(t.x + (xo >= 0 ? xo : 0)) + 16 * c;
  s.xsz = xo >= 0 ? 16 : 0;
  s.stop = false;
  return s;
}

// Store the finished tile pid from this thread's totals (gemm_wgstream_kernel's epilogue; nothing
// where find_tile finds no tile). Out of line, as lean_sources.
template <class T, bool kOutF32>
__device__ __noinline__ void lean_store(const MmaGemmParams& p, int pid, int tid, int lane, float t0, float t1, float t2,
                                        float t3) {
  const float tot[4] = {t0, t1, t2, t3};
  TileSpot ct;
  if (stream_tile<T::BM>(p, pid, tid, lane, ct)) wgstream_store_tile<T, kOutF32>(p, ct, tid >> 5, lane, tot);
}

// MmaGemmParams::next_*: this block's share of the next GEMM's weights into L2 (a hint that
// writes nothing, so never bits). Dense: next_bytes of next_w. Grouped: next_bytes of
// next_w_groups[g] for each group g with rows in this launch's offsets (the down's experts are
// the gate|up's), in ascending g. Every block of the grid takes an equal run of the whole
// (128-byte boundaries) and issues it in pieces of at most kNextPiece bytes. Warp 0 only (the
// busy groups by ballot), lane 0 issues; out of line, off the loop's path.
constexpr int kNextPiece = 32768;
__device__ __noinline__ void lean_prefetch_next(const MmaGemmParams& p, int tid) {
  if (tid >= 32) return;
  const int lane = tid;
  const bool grouped = p.next_w_groups != nullptr;
  uint32_t busy[kNextMaxGroups / 32];
  int64_t units = 1;
  if (grouped) {
    units = 0;
#pragma unroll
    for (int w = 0; w < kNextMaxGroups / 32; ++w) {
      const int g = 32 * w + lane;
      busy[w] = __ballot_sync(0xffffffffu, g < p.groups && p.offsets[g + 1] > p.offsets[g]);
      units += __popc(busy[w]);
    }
  }
  if (lane != 0) return;
  const int64_t total = units * p.next_bytes, blocks = gridDim.x, b = blockIdx.x;
  int64_t pos = (total * b / blocks) & ~int64_t(127);
  const int64_t end = b + 1 == blocks ? total : (total * (b + 1) / blocks) & ~int64_t(127);
  while (pos < end) {
    const int64_t unit = pos / p.next_bytes, off = pos - unit * p.next_bytes;
    const char* base = reinterpret_cast<const char*>(p.next_w);
    if (grouped) {  // the unit-th busy group
      int64_t left = unit;
      int g = -1;
      for (int w = 0; w < kNextMaxGroups / 32 && g < 0; ++w) {
        const int n = __popc(busy[w]);
        if (left < n) {
          uint32_t m = busy[w];
          for (int i = 0; i < left; ++i) m &= m - 1;  // drop the lowest set bits before it
          g = 32 * w + __ffs(m) - 1;
        }
        left -= n;
      }
      base = reinterpret_cast<const char*>(p.next_w_groups[g]);
    }
    const int64_t n = min(min(end - pos, p.next_bytes - off), int64_t(kNextPiece));
    prefetch_l2(base + off, uint32_t(n));
    pos += n;
  }
}

// The first step of part q of a tile of KT steps, S = ceil(KT / steps_per_slice) K slices, split
// into `parts` runs of whole slices (part q: slices [q S / parts, (q + 1) S / parts)); q = parts
// gives KT. With S >= parts every part has at least one slice, and part 1 starts at slice
// S / parts (where the last arrival's fold begins). parts 1: q * KT. Host-callable for tests.
__host__ __device__ constexpr int lean_part_begin(int q, int parts, int S, int KT, int steps_per_slice) {
  if (parts == 1) return q * KT;
  const int b = q * S / parts * steps_per_slice;
  return b < KT ? b : KT;
}

// Stream-K shares (the lean loop's kParts 0, session 52): U = tiles_total x S units (tile, K
// slice) in tile-major order, block b of G taking units [b U / G, (b + 1) U / G). Host-callable
// for tests. The block holding unit u: the largest b with floor(b U / G) <= u, i.e. b < (u + 1) G
// / U.
__host__ __device__ constexpr int streamk_block_of(int64_t u, int64_t U, int64_t G) {
  return int(((u + 1) * G + U - 1) / U - 1);
}
// A split tile's workspace slot and counter: the tile itself where there are no more tiles than
// blocks, else the block holding its slice 0 (no block holds slice 0 of two split tiles: the
// earlier would lie inside it whole).
__host__ __device__ constexpr int streamk_slot(int tile, int S, int64_t tiles, int64_t G) {
  return tiles <= G ? tile : streamk_block_of(int64_t(tile) * S, tiles * S, G);
}
__device__ __forceinline__ int streamk_slot(const MmaGemmParams& p, int tile, int S) {
  return streamk_slot(tile, S, p.tiles_total, gridDim.x);
}
// A split tile's last arrival: thread tid's running total in ws (slot 0), then the slice sums
// of slices [from, S) added in slice order (the contract's running total), stored as tile `tile`.
template <class T, bool kOutF32>
__device__ __forceinline__ void split_fold_store(const MmaGemmParams& p, const float* ws, int from, int S, int tile,
                                                 int tid, int lane) {
  const float4 t0 = __ldcg(reinterpret_cast<const float4*>(ws));
  float v[4] = {t0.x, t0.y, t0.z, t0.w};
#pragma unroll 8
  for (int sl = from; sl < S; ++sl) {
    const float4 x = __ldcg(reinterpret_cast<const float4*>(ws + sl * 512));
    v[0] = __fadd_rn(v[0], x.x);
    v[1] = __fadd_rn(v[1], x.y);
    v[2] = __fadd_rn(v[2], x.z);
    v[3] = __fadd_rn(v[3], x.w);
  }
  lean_store<T, kOutF32>(p, tile, tid, lane, v[0], v[1], v[2], v[3]);
}
// A block's arrivals on its split tiles (tail: one whose slices after the first it summed apart,
// head: one whose running total from slice 0 it left in slot 0), after its loop: its sums
// fenced, one atomic per tile, and where it is a tile's last arrival (of the blocks holding the
// tile's units) the fold: the running total of the block that held slice 0, then the later
// slices in order, the unsplit loop's running total exactly; the store; the counter zeroed for
// the next launch. Out of line: off the loop's path.
template <class T, bool kOutF32>
__device__ __noinline__ void streamk_arrivals(const MmaGemmParams& p, int S, int tail, int head, int tid, int lane) {
  if (tail < 0 && head < 0) return;  // (block-uniform)
  const int64_t U = int64_t(p.tiles_total) * S, G = gridDim.x;
  __threadfence();  // this block's sums before its arrivals
  __syncthreads();
  const int tiles[2] = {tail, head};
  bool mine[2] = {false, false};  // thread 0's: this block is the tile's last arrival
  if (tid == 0) {
    for (int j = 0; j < 2; ++j) {
      const int t = tiles[j];
      if (t < 0) continue;
      const int parts = streamk_block_of(int64_t(t + 1) * S - 1, U, G) - streamk_block_of(int64_t(t) * S, U, G) + 1;
      mine[j] = atomicAdd(p.split_cnt + streamk_slot(p, t, S), 1) == parts - 1;
    }
  }
  // (broadcast by the barriers themselves: no shared memory, which the lean ring's three blocks
  // per SM leave none of)
  const bool last_arrival[2] = {__syncthreads_or(mine[0]) != 0, __syncthreads_or(mine[1]) != 0};
  for (int j = 0; j < 2; ++j) {
    const int t = tiles[j];
    if (t < 0 || !last_arrival[j]) continue;
    __threadfence();  // the other blocks' sums (each fenced before its arrival) after ours
    const int slot = streamk_slot(p, t, S);
    const float* ws = p.split_ws + int64_t(slot) * S * 512 + tid * 4;
    // The slice where slot 0's running total ends: the end of the units of the block holding
    // slice 0 (it has a later block, or the tile would not be split).
    const int b0 = streamk_block_of(int64_t(t) * S, U, G);
    const int e0 = int(min(int64_t(S), (int64_t(b0) + 1) * U / G - int64_t(t) * S));
    split_fold_store<T, kOutF32>(p, ws, e0, S, t, tid, lane);
    if (tid == 0) p.split_cnt[slot] = 0;  // zero for the next launch
  }
}

// The lean loop (session 30, configs "streamwg64x8/4l" and "/6l", ATLAS_GEMM_STREAM_LEAN): the
// same tiles, shares, ring, copy plan, wgmma chain and slice folds as gemm_wgstream_kernel<T,
// kOutF32, false> (so the same bits), with the per-step work cut to what the step needs. Why:
// Nsight Compute on the shared experts' gate|up alone (N 5632, K 2048, 88 blocks, s30-1) sampled
// its warps waiting on instruction fetch, fixed-latency dependencies and selection, hardly on
// memory (long scoreboard 4% of the samples), and counted ~6,400 instructions per warp for 16
// steps at ~5 cycles each: ~1 us per 16 KB step, the "per-block bound" of sessions 28-29. That
// loop finds each step's tile and K offset by runtime divisions, computes eight 64-bit sources
// and swizzled destinations per step, and tests every chunk against N and K. Here a thread's
// eight weight rows lie at one stride (lean_sources), its destinations at 1 KB steps from one
// offset fixed for the kernel, the tile and step are counters, the tile lookups and the store
// are out of line, and K is a multiple of BK (the config's tail instance, the full loop, runs
// the rest: the same bits).
// The parameter block is __grid_constant__: lean_sources and lean_store take it by reference
// without a local copy.
// kParts > 1 (session 31, config "streamwg64x8/4l2", ATLAS_GEMM_STREAM_GROUPED=wg-split): each
// tile is kParts work items, runs of whole K slices (the tile's S slices dealt evenly: part q has
// slices [q S / kParts, (q + 1) S / kParts)), so a problem of few tiles (one token's routed
// experts' down: 192 tiles of 11 steps) fills more blocks. Part 0 folds its slices into the
// running total as the unsplit loop does; the other parts keep each slice's sum apart; all go to
// p.split_ws, and the tile's last block to arrive (p.split_cnt) adds the later slices to part
// 0's total in slice order and stores the tile: the contract's running total exactly, the same
// bits. The host runs it only where S >= kParts (every part has a slice).
// kParts 0 (stream-K, session 52, configs "streamwg64x8/4lk" and "/8l64k", ATLAS_GEMM_STREAMK):
// dense problems only; every block takes an equal run of the (tile, K slice) units in tile-major
// order (streamk_block_of), so that a grid of every resident slot holds equal bytes whatever the
// tile count (the LM head's 1,600 tiles on 396 blocks: 32.3 slices each, against 4 or 5 whole
// tiles; layer 0's gate|up, 342 tiles: 6.9 slices each, against one tile each on 342 blocks, 78
// SMs holding three and 54 two). A block's items are its first tile's slices (a tail of it where
// the run began inside it), whole tiles, and its last tile's first slices (a head of it): whole
// tiles store as the unsplit loop does; a head keeps the running total, a tail each slice's sum
// apart, both in the workspace (streamk_slot), and the block arrives on them after its loop
// (streamk_arrivals), where a tile's last arrival folds them: the same bits.
// kStamp: the diagnostic instantiation (ATLAS_BLOCK_STAMPS, kernels/block_stamp.cuh): the same
// work, each block's stamp appended to the module's ring.
// kLead (session 38, config "streamwg64x8/4l/3", ATLAS_GEMM_STREAM_LEAN=4/3; 0: STAGES - 2): the
// copies run kLead steps ahead. STAGES - 1 keeps three 16 KB steps in flight in the 4-slot ring
// (48 KB against 32, the same 73 KB of shared memory, so the same three blocks per SM): the slot a
// step's copies refill was read by the step before's wgmma, so each step waits for its wgmma
// group (wg_wait_all) instead of leaving it in flight (wg_wait_one). Why: session 38's block
// stamps found a routed gate|up block's time independent of how many blocks share its SM (23 us
// for 256 KB with one, two or three) while the same loop's blocks ran twice as fast under less
// load, which suggests each block is bound by its bytes in flight over the memory's loaded
// latency; this config tests that. (The 64-wide
// lean loop, /8l64, had 48 KB in flight too but twice the steps and their instructions: slower,
// s32-1.) The same bits: the same steps in the same order.
// kRoute (session 39, ATLAS_MOE_SELF_ROUTE): the grouped gate|up of one token's routed experts
// finds its groups' table by routing the token itself, from the router's logits
// (MmaGemmParams::route_*), instead of waiting for the routing kernel before it to end. Why:
// session 38's block stamps found this launch's blocks resident 1.4 us after the router's end and
// held 2.8 us more by their launch-overlap wait on the routing kernel (one warp's work, then its
// completion and the release), at the head of every MoE layer's critical path.
// What it relies on (the launcher and the model see to it): the launch directly follows the
// routing kernel (route_permute_kernel, wait-first: it releases this launch only once its own
// wait has seen the router complete, so the logits are in memory when these blocks start; read
// through L2, __ldcg), and reads nothing else any kernel of the last few wrote but x, through
// cp.async.cg (L2); it writes only its output. It never waits at its start, and waits at its end
// (griddepcontrol.wait), so the launch completes only after the routing kernel has: the down
// after it, whose wait covers this launch, reads the routing kernel's table and rows.
// The same integers as the routing kernel's: the same device code (route_core.cuh) on the same
// logits, one warp; the table and rows go to shared memory, and the block's tile lookups and
// stores read a shared-memory copy of the parameters pointing there.
// Measured (s39-3): the same bits, slower (467 against 477.6 tok/s): while these blocks route,
// the shared experts' gate|up streams alone, and the routed launch then ends later, not sooner:
// the MoE phase is bound by what the memory system gives all its blocks (docs/cuda-sessions.md, session 39).
struct LeanTable {
  static constexpr int kMaxGroups = kRouteOneTokenMaxExperts, kMaxRows = 64;
  MmaGemmParams q;                   // p with offsets / x_rows / w_groups below
  int32_t offsets[kMaxGroups + 1];
  int32_t rows[kMaxRows];
  const uint16_t* w[kMaxGroups];
};
// Its static shared memory must leave the lean ring's three blocks per SM (3 x (73 KB + 1 KB
// reserved) of 228 KB leave 2 KB a block).
static_assert(sizeof(LeanTable) <= 2048, "the lean kernel's table would cost a resident block");
// Scratch floats of lean_route (in the ring's shared memory, before its first copy).
constexpr int kLeanRouteScratch = 64 * 3 + kRouterMaxK * 3 + 64 + kRouterMaxK + 1;
__device__ __noinline__ void lean_route(const MmaGemmParams& p, LeanTable& r, float* scratch, int tid) {
  if (tid < 32) {
    const int lane = tid, E = p.groups, k = p.route_k;
    float* sp = scratch;               // [64] scores
    float* scand = sp + 64;            // [64] candidates (route_token)
    float* lg = scand + 64;            // [64] the logits (route_token's copy)
    float* sw = lg + 64;               // [16] picks' scores
    float* weights = sw + kRouterMaxK;  // [16]
    int32_t* ids = reinterpret_cast<int32_t*>(weights + kRouterMaxK);  // [16]
    int32_t* counts = ids + kRouterMaxK;                                // [64]
    int32_t* slot = counts + 64;                                        // [16]
    int* err = slot + kRouterMaxK;
    const RoutePermuteParams q{.logits = p.route_logits, .ids = ids, .weights = weights, .scores = nullptr,
                               .tokens = 1, .E = E, .k = k, .grouped = 0, .n_group = 1, .topk_group = 1,
                               .norm_topk_prob = p.route_norm, .scaling = p.route_scaling, .counts = counts,
                               .offsets = r.offsets, .sorted_token = r.rows, .pair_slot = slot, .error_flag = err};
    if (!route_permute_one_token(q, sp, sw, lane)) {
      // A NaN score: route_token and permute_one_warp, as route_permute_kernel does then (the
      // logits copied through L2 first: route_token reads them with plain loads).
      for (int e = lane; e < E; e += 32) lg[e] = __ldcg(p.route_logits + e);
      __syncwarp();
      route_token(lg, ids, weights, nullptr, 0, E, k, 0, 1, 1, p.route_norm, p.route_scaling, sp, scand, sw, lane);
      __syncwarp();
      permute_one_warp(ids, k, k, E, counts, r.offsets, r.rows, slot, err);
    }
  }
  __syncthreads();
}

// kWaitFirst (session 44, GroupedGemmArgs::wait_first; the model's ATLAS_MOE_DOWN_EARLY): a
// grouped launch waits for its predecessor before it releases the next launch (pdl_begin()
// instead of pdl_begin_gemm()), so that the launch after it may read the tables its predecessor
// wrote before its own wait (the routed down's early weight steps, gemm_mma.cuh's
// early_weight_steps). Nothing is lost where the next launch's blocks cannot be resident
// beside this one's anyway (the routed down's 48 KB blocks beside three 73 KB ones).
template <class T, bool kOutF32, int kParts = 1, bool kStamp = false, int kLead = 0, bool kRoute = false,
          bool kWaitFirst = false>
__global__ void __launch_bounds__(T::THREADS) gemm_wgstream_lean_kernel(const __grid_constant__ MmaGemmParams p) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  static_assert(T::WGS == 1 && T::LEAD == 0 && (T::BK == 128 || T::BK == 64),
                "the lean loop: one warpgroup, cp.async, 16 or 8 chunks per row");
  auto stamp = gemm_block_stamp<kStamp>(p, kBlockStampLean);
  extern __shared__ __align__(128) unsigned char gemm_smem[];
  const uint32_t ring_w = (smem_u32(gemm_smem) + 1023u) & ~1023u;  // [STAGES][ATOMS][64][64]
  const uint32_t ring_x = ring_w + uint32_t(T::STAGES * T::SLOT_W);  // [STAGES][ATOMS][8][64]
  const int tid = int(threadIdx.x), lane = tid & 31;
  const bool grouped = p.offsets != nullptr;
  static_assert(!kRoute || (kParts == 1 && !kStamp && kLeanRouteScratch * 4 + 1024 <= T::SMEM_BYTES),
                "kRoute: the unsplit, unstamped loop; its scratch in the ring");
  static_assert(!kWaitFirst || (!kRoute && !kStamp), "kWaitFirst: the plain grouped loop");
  constexpr bool kStreamK = kParts == 0;
  static_assert(kParts >= 0 && (!kStreamK || (!kRoute && !kStamp && !kWaitFirst)), "kStreamK: the plain dense loop");
  // Grouped problems of at most 64 groups and rows find their tiles in a shared-memory copy of
  // the tables (session 40): the weight pointers and the parameters before the launch-overlap
  // wait (the model's expert table: no kernel of the stream writes it), the offsets and gathered
  // rows after it in one round of loads, all at once. Why: atlas_moe_stream_probe's stamps
  // (s40-3) found a routed gate|up block 3.3-3.6 us from its start to its first weight copy on
  // the global tables (the tile count's scan, find_tile's scan, w_groups[g], x_rows[row]: one
  // dependent load after another, in each of the four warps) against 19.6 us for all its steps
  // after it. The same values, so the same tiles, checks and bits. kRoute's routing writes the
  // same table.
  // (raw bytes: MmaGemmParams's member initialisers would make it a dynamic initialisation)
  __shared__ __align__(16) unsigned char table_smem[sizeof(LeanTable)];
  LeanTable& tab = *reinterpret_cast<LeanTable*>(table_smem);
  const bool tabled = kRoute || (grouped && p.groups <= LeanTable::kMaxGroups && p.max_rows <= LeanTable::kMaxRows);
  if (tabled) {
    if (tid < p.groups) tab.w[tid] = p.w_groups[tid];
    if (tid == 0) {
      tab.q = p;
      tab.q.offsets = tab.offsets;
      tab.q.x_rows = kRoute || p.x_rows != nullptr ? tab.rows : nullptr;
      tab.q.w_groups = tab.w;
    }
  }
  if constexpr (kRoute) {
    pdl_release_if(true);  // release, never wait here (above)
    lean_route(p, tab, reinterpret_cast<float*>(gemm_smem), tid);  // (its barrier covers the copies above)
  } else if (grouped) {
    if constexpr (kWaitFirst)
      pdl_begin();
    else
      pdl_begin_gemm();
    stamp.go();
    if (tabled) {
      if (tid <= p.groups) tab.offsets[tid] = p.offsets[tid];
      if (p.x_rows != nullptr && tid < p.max_rows) tab.rows[tid] = p.x_rows[tid];
      __syncthreads();
    }
  }
  const MmaGemmParams& pt = tabled ? tab.q : p;  // tile lookups and stores
  const int KT = p.K / T::BK;  // steps per tile
  constexpr int kAhead = kLead > 0 ? kLead : T::STAGES - 2;
  static_assert(kAhead >= 1 && kAhead <= T::STAGES - 1, "a step's slot is free once its wgmma has read it");
  constexpr bool kWaitAll = kAhead == T::STAGES - 1;  // the refilled slot is the step before's
  constexpr int kSteps = kSliceK / T::BK;  // steps per K slice
  const int S = (KT + kSteps - 1) / kSteps;  // K slices per tile
  // The block's work: items [0, last - first). kParts >= 1: item i is the stream share's item
  // first + i, tile (first + i) / kParts, steps [part_begin(q), part_begin(q + 1)) of it, q =
  // (first + i) % kParts (kParts 1: the whole tile). kStreamK: units [u0, u1) of the (tile, K
  // slice) units in tile-major order; item i is tile first + i's slices inside them.
  int first = 0, last = 0, u0 = 0, u1 = 0;
  if constexpr (kStreamK) {
    const int64_t U = int64_t(p.tiles_total) * S;
    u0 = int(int64_t(blockIdx.x) * U / gridDim.x);
    u1 = int(int64_t(blockIdx.x + 1) * U / gridDim.x);
    first = u0 / S;
    last = u1 > u0 ? (u1 - 1) / S + 1 : first;
  } else {
    const auto share = stream_share<T::BM>(pt, lane, kParts);
    first = share.first;
    last = share.last;
  }
  constexpr int kP = kParts > 0 ? kParts : 1;  // (kParts's divisions where kStreamK never runs them)
  const auto part_begin = [&](int q) { return lean_part_begin(q, kP, S, KT, kSteps); };
  const auto item_begin = [&](int i) {  // item i's first step
    if constexpr (kStreamK) return i == 0 ? min((u0 - first * S) * kSteps, KT) : 0;
    else return part_begin((first + i) % kP);
  };
  const auto item_end = [&](int i) {  // one past item i's last step
    if constexpr (kStreamK) return first + i == last - 1 ? min((u1 - (first + i) * S) * kSteps, KT) : KT;
    else return part_begin((first + i) % kP + 1);
  };
  const auto item_tile = [&](int i) { return kStreamK ? first + i : (first + i) / kP; };
  const auto item_steps = [&](int i) { return item_end(i) - item_begin(i); };
  int my_steps = (last - first) * KT;
  if constexpr (kParts != 1) {
    my_steps = 0;
    for (int i = 0; i < last - first; ++i) my_steps += item_steps(i);
  }
  // Lane 0's count (every lane's is the same): a trip count ptxas can see is warp-uniform lets it
  // keep the loop's wgmma descriptors in uniform registers (session 31, from the SASS: computed
  // from the lanes' own values, each wgmma cost ~12 instructions of 64-bit adds and moves into
  // uniform registers, ~100 of the ~185 per step; from lane 0's, a few uniform adds).
  const int steps = __shfl_sync(0xffffffffu, my_steps, 0);
  stamp.add_bytes(int64_t(steps) * T::BN * T::BK * 2);  // (BN weight rows a step; rows past N copy zeros: counted anyway)

  // Copy plan (lean_sources): chunk c of weight rows r0 + 8 j and of x row r0, as the full
  // loop's, so that each warp instruction reads two whole 256-byte row segments (a first version
  // gave each thread 8 chunks of one row, each instruction 16 rows x 32 bytes: faster alone,
  // slower beside other kernels, s30-2). The swizzle term depends on r0 % 8 only, so the
  // destinations of j are the first's + 1 KB j.
  // (BK 64, session 31: 8 chunks per row, rows r0 + 16 j, j < 4, x copied by the threads of r0 < 8.)
  constexpr int RP = T::RP;  // rows per pass
  const int r0 = tid >> T::CPR_LOG2, c = tid & (T::CPR - 1);
  const uint32_t cdst = uint32_t((c >> 3) * T::ATOM_W + r0 * 128 + (((c & 7) ^ (r0 & 7)) << 4));
  const uint32_t xdst = uint32_t((c >> 3) * T::ATOM_X + r0 * 128 + (((c & 7) ^ (r0 & 7)) << 4));
  // Issue side: the tile (from first) and step of the next copy, this thread's sources in it.
  struct Issue : LeanSources {
    int tile = 0, kt = 0, kend = 0;  // tile: the work item (from first); kt, kend: its steps
  };
  const auto enter = [&](Issue& s, int i) {
    s.tile = i;
    s.kt = item_begin(i);
    s.kend = item_end(i);
    static_cast<LeanSources&>(s) = lean_sources<T>(pt, i < last - first ? item_tile(i) : -1, tid, lane);
    // Lane 0's flags (the same in every lane: one tile per block): branches ptxas can see are
    // warp-uniform keep the loop free of divergence bookkeeping around the copies.
    s.stop = __shfl_sync(0xffffffffu, s.stop, 0);
    s.full = __shfl_sync(0xffffffffu, s.full, 0);
  };
  const auto advance = [&](Issue& s) {
    if (++s.kt == s.kend) enter(s, s.tile + 1);
  };
  // The policy test once per step, not per copy (a branch around each copy otherwise). Rows past
  // N (a last n-tile only) copy zeros from the first row, never read.
  const L2Hint w_hint = l2_evict_first_hint(p.l2_evict_first > 0);
  const auto copy_w = [&](const Issue& s, int slot) {
    if (s.stop) return;
    const uint32_t d = ring_w + uint32_t(slot * T::SLOT_W) + cdst;
    const char* first_row = s.w + s.kt * (T::BK * 2);
    // Four straight-line variants (every row inside N or not, policy or not): no per-copy tests
    // on the common path.
    const auto issue = [&](auto full_c, auto hint_c) {
      constexpr bool kFull = decltype(full_c)::value, kHint = decltype(hint_c)::value;
      const char* src = first_row;
#pragma unroll
      for (int j = 0; j < T::W_PER_THREAD; ++j) {
        const bool in = kFull || j < s.wrows;
        const char* from = kFull || in ? src : first_row;
        if constexpr (kHint)
          asm volatile("cp.async.cg.shared.global.L2::cache_hint [%0], [%1], 16, %2, %3;\n" ::"r"(d + uint32_t(j * RP * 128)),
                       "l"(from), "r"(in ? 16 : 0), "l"(w_hint.policy)
                       : "memory");
        else
          cp_async16_at(d + uint32_t(j * RP * 128), from, in ? 16 : 0);
        src += s.wstride;
      }
    };
    using Yes = std::true_type;
    using No = std::false_type;
    if (s.full) {
      if (w_hint.on) issue(Yes{}, Yes{});
      else issue(Yes{}, No{});
    } else {
      if (w_hint.on) issue(No{}, Yes{});
      else issue(No{}, No{});
    }
  };
  const auto copy_x = [&](const Issue& s, int slot) {
    if (!s.stop && (RP <= T::BM || r0 < T::BM))
      cp_async16_at(ring_x + uint32_t(slot * T::SLOT_X) + xdst, s.x + s.kt * (T::BK * 2), s.xsz);
  };

  Issue is;  // stop until entered
  if (steps > 0) enter(is, 0);
  // Prologue: steps [0, kAhead). Dense weights before the launch-overlap wait (staged, or pulled
  // into L2), every x copy after it.
  const bool early = !grouped && p.prefetch > 1;
  if (early) {
    Issue s = is;
#pragma unroll 1
    for (int k = 0; k < kAhead; ++k) {
      copy_w(s, k);
      if (!s.stop) advance(s);
    }
  } else if (!grouped && p.prefetch == 1 && !is.stop && c == 0) {
    for (int j = 0; j < is.wrows; ++j)
      prefetch_l2(is.w + j * is.wstride + is.kt * (T::BK * 2), uint32_t(min(p.K - is.kt * T::BK, kAhead * T::BK)) * 2u);
  }
  if (!grouped) {
    pdl_begin_gemm();
    stamp.go();
  }
#pragma unroll 1
  for (int k = 0; k < kAhead; ++k) {
    if (!early) copy_w(is, k);
    copy_x(is, k);
    cp_async_commit();
    if (!is.stop) advance(is);
  }

  // Compute side: as gemm_wgstream_kernel's (thread (warp w, lane l): D rows n = 16 w + l / 4
  // and n + 8, x rows 2 (l % 4) and + 1).
  float acc[4] = {0.f, 0.f, 0.f, 0.f}, tot[4] = {0.f, 0.f, 0.f, 0.f};
  const auto store = [&](int tile) { lean_store<T, kOutF32>(pt, first + tile, tid, lane, tot[0], tot[1], tot[2], tot[3]); };
  const uint64_t dw0 = wg_desc(ring_w), dx0 = wg_desc(ring_x);
  bool pending = false;  // a slice's last wgmma group is in flight: fold it into the total first
  int ct = 0, ck = 0;    // step i's tile (from first) and step in it
  // kParts != 1: the pending slice's item and slice, whether it ends its item, the item's length
  int f_item = 0, f_slice = 0, clen = item_steps(0);
  bool f_last = false;
  // kParts > 1: the pending slice (its groups retired) into the total (part 0) or the workspace,
  // then, where it ended its item, the item's arrival; the tile's last arrival folds and stores.
  const auto fold_split = [&]() {
    __shared__ int last_arrival;
    const int item = first + f_item, q = item % kP, pid = item / kP;
    float* ws = p.split_ws + int64_t(pid) * S * 512 + tid * 4;
    if (q == 0) {
#pragma unroll
      for (int e = 0; e < 4; ++e) tot[e] = __fadd_rn(tot[e], acc[e]);
    } else {
      *reinterpret_cast<float4*>(ws + f_slice * 512) = make_float4(acc[0], acc[1], acc[2], acc[3]);
    }
#pragma unroll
    for (int e = 0; e < 4; ++e) acc[e] = 0.f;
    if (!f_last) return;
    if (q == 0) *reinterpret_cast<float4*>(ws) = make_float4(tot[0], tot[1], tot[2], tot[3]);
    __threadfence();  // this block's sums before its arrival
    __syncthreads();
    if (tid == 0) last_arrival = atomicAdd(p.split_cnt + pid, 1) == kP - 1;
    __syncthreads();
    if (last_arrival) {
      __threadfence();  // the other blocks' sums (each fenced before its arrival) after ours
      split_fold_store<T, kOutF32>(pt, ws, S / kP, S, pid, tid, lane);  // part 1's first slice on
      if (tid == 0) p.split_cnt[pid] = 0;  // zero for the next launch
    }
#pragma unroll
    for (int e = 0; e < 4; ++e) tot[e] = 0.f;
  };
  // kStreamK: where this block's items leave a tile split (its first item begins after the tile's
  // slice 0: `tail`; its last ends before the tile's end: `head`), the tile whose sums it wrote;
  // the block arrives on both after its loop (streamk_arrivals), so that no arrival stalls
  // the loop; -1: none.
  int split_tail = -1, split_head = -1;
  // kStreamK: the pending slice into the running total (the item began at the tile's slice 0) or
  // into the workspace, then at its item's end the whole tile's store, or the running total to
  // the workspace's slot 0.
  const auto fold_streamk = [&]() {
    const int tile = first + f_item;
    const bool head = item_begin(f_item) == 0;
    if (head) {
#pragma unroll
      for (int e = 0; e < 4; ++e) tot[e] = __fadd_rn(tot[e], acc[e]);
    } else {
      float* ws = p.split_ws + int64_t(streamk_slot(p, tile, S)) * S * 512 + tid * 4;
      *reinterpret_cast<float4*>(ws + f_slice * 512) = make_float4(acc[0], acc[1], acc[2], acc[3]);
    }
#pragma unroll
    for (int e = 0; e < 4; ++e) acc[e] = 0.f;
    if (!f_last) return;
    if (!head) {
      split_tail = tile;
      return;
    }
    if (item_end(f_item) == KT) {
      store(f_item);
    } else {
      float* ws = p.split_ws + int64_t(streamk_slot(p, tile, S)) * S * 512 + tid * 4;
      *reinterpret_cast<float4*>(ws) = make_float4(tot[0], tot[1], tot[2], tot[3]);
      split_head = tile;
    }
#pragma unroll
    for (int e = 0; e < 4; ++e) tot[e] = 0.f;
  };
  // MmaGemmParams::next_at: the next GEMM's weights into L2 at step (steps * next_at) / 4 of this
  // block's loop (4: after it); -1 none.
  const int next_step = p.next_at < 0 ? -1 : steps * p.next_at / 4;
  for (int i = 0; i < steps; ++i) {
    cp_async_wait<kAhead - 1>();
    fence_proxy_async_smem();  // the copies' writes (generic proxy) before the wgmma's reads
    __syncthreads();
    const int ahead = (i + kAhead) % T::STAGES;
    copy_w(is, ahead);
    copy_x(is, ahead);
    cp_async_commit();
    if (!is.stop) advance(is);
    if (i == next_step) lean_prefetch_next(pt, tid);
    if (pending) {
      wg_wait_all();
      if constexpr (kStreamK) {
        fold_streamk();
      } else if constexpr (kParts > 1) {
        fold_split();
      } else {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          tot[e] = __fadd_rn(tot[e], acc[e]);
          acc[e] = 0.f;
        }
        if (ck == 0) {  // ... and it was the tile before's last slice
          store(ct - 1);
#pragma unroll
          for (int e = 0; e < 4; ++e) tot[e] = 0.f;
        }
      }
      pending = false;
    }
    const int slot = i % T::STAGES;
    const uint64_t dw = dw0 + uint64_t((slot * T::SLOT_W) >> 4), dx = dx0 + uint64_t((slot * T::SLOT_X) >> 4);
    wg_fence();
#pragma unroll
    for (int kk = 0; kk < T::BK / 16; ++kk)
      wgmma_m64n8k16(acc, dw + uint64_t(((kk >> 2) * T::ATOM_W + (kk & 3) * 32) >> 4),
                     dx + uint64_t(((kk >> 2) * T::ATOM_X + (kk & 3) * 32) >> 4));
    wg_commit();
    if constexpr (kWaitAll)
      wg_wait_all();
    else
      wg_wait_one();
    if constexpr (kParts != 1) {
      pending = (ck + 1) % kSteps == 0 || ck + 1 == clen;
      f_item = ct;
      f_slice = (item_begin(ct) + ck) / kSteps;
      f_last = ck + 1 == clen;
      if (++ck == clen) {
        ck = 0;
        ++ct;
        clen = item_steps(ct);
      }
    } else {  // (its own branch: the general one costs the unsplit loop ~40 instructions, SASS)
      pending = (ck + 1) % kSteps == 0 || ck + 1 == KT;
      if (++ck == KT) {
        ck = 0;
        ++ct;
      }
    }
  }
  if (next_step >= steps) lean_prefetch_next(pt, tid);  // (after the loop, or a block without steps)
  wg_wait_all();
  cp_async_wait<0>();  // nothing in flight when the block's shared memory is released
  if (pending) {  // the last step always ends its tile (its item)
    if constexpr (kStreamK) {
      fold_streamk();
    } else if constexpr (kParts > 1) {
      fold_split();
    } else {
#pragma unroll
      for (int e = 0; e < 4; ++e) tot[e] = __fadd_rn(tot[e], acc[e]);
      store(ct - 1);
    }
  }
  if constexpr (kStreamK) streamk_arrivals<T, kOutF32>(pt, S, split_tail, split_head, tid, lane);
  if constexpr (kRoute) pdl_wait_after(true);  // complete only after the routing kernel (above)
#else
  __trap();  // the host never launches it without sm_90a device code (gemm_stream_probe_kernel)
#endif
}

}  // namespace atlas::cuda::kern
