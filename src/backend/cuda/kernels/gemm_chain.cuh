// Two grouped GEMMs in one persistent launch (session 29; grouped_gemm_chain in gemm.cu, off
// unless ATLAS_MOE_CHAIN=1 until measured): the MoE experts' fused gate|up (problem a) and their
// down projection (problem b, whose x is a's output), on the wgmma streaming loop of
// kernels/gemm_wgstream.cuh (one warpgroup, a cp.async ring of BK-wide steps; read it first) and
// with its bits: per output, the k16 wgmma chain of each 256-wide K slice from +0, the slices
// added in order; a's epilogue is the fused SiLU gate, b's the plain bf16 store.
//
// Why: at a batch-1 decode step the down (35 MB) started only when the gate|up's last block had
// ended and ended ~14 us after it, ~2.4 TB/s (docs/cuda.md, sessions 23-28). Here a block that
// has finished its gate|up tiles copies its down tiles' weights at once; only their x rows wait,
// per group, for a counter of a's finished tiles of that group.
//
// Work: a's TA tiles (numbered as find_tile numbers them) are dealt round robin, tile i to block
// i % B; b's continue where a's ended, tile j to block (TA + j) % B. A block walks its a tiles,
// then its b tiles, as one sequence of steps through the ring (kAhead steps ahead across tile
// boundaries, as in the stream kernel). A b tile's weights are copied like any other step's; its
// x chunks are not, until its group is complete: at the b tile's first step the block stores its
// previous tile (counting it, if an a tile), waits for the group's count (thread 0 polls with
// acquire loads, then a barrier), copies the x chunks of the steps already in the ring and drains
// them; later steps copy x with the weights.
// Deadlock-free where every block of the grid can be resident at once (the host's grid is at most
// the resident slots of the config): a block waits only for a tiles, and every block stores all
// of its a tiles before its first wait. A wait that does not end within ~2^24 polls (a bug, or a
// grid that is not co-resident) flags kErrChainWait and goes on; the error is reported by
// check_device_errors, the output is then wrong.
// Counters (int, zero at launch): counters[g] = a's tiles of group g stored, counters[groups] =
// blocks finished; the last block to finish zeroes them all for the next launch (nothing reads
// them after it: every other block has passed its waits).
// Store -> count: each thread's stores, __threadfence, the block barrier, thread 0's atomicAdd;
// wait -> read: thread 0's ld.acquire.gpu, the block barrier, then the x copies (cp.async.cg:
// through L2, never a stale L1 line).
#pragma once

#include "gemm_wgstream.cuh"

namespace atlas::cuda::kern {

constexpr int kErrChainWait = 512;  // gemm_chain_kernel: a group's first-GEMM tiles never all arrived

struct ChainParams {
  MmaGemmParams a;  // grouped, fused gate|up (a.gated > 0), bf16 out
  MmaGemmParams b;  // grouped, the same offsets and groups, b.x = a.out, bf16 out
  int* counters;    // [a.groups + 1], zero at launch (and again after it)
};

__device__ __forceinline__ int ld_acquire_gpu(const int* p) {
  int v;
  asm volatile("ld.acquire.gpu.global.b32 %0, [%1];\n" : "=r"(v) : "l"(p) : "memory");
  return v;
}

template <class T>
__global__ void __launch_bounds__(T::THREADS) gemm_chain_kernel(const ChainParams cp) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  static_assert(T::WGS == 1 && T::LEAD == 0, "the chain runs the one-warpgroup cp.async loop");
  extern __shared__ __align__(128) unsigned char gemm_smem[];
  const uint32_t raw = smem_u32(gemm_smem);
  const uint32_t base = (raw + 1023u) & ~1023u;
  const uint32_t ring_w = base;                                     // [STAGES][ATOMS][64][64]
  const uint32_t ring_x = base + uint32_t(T::STAGES * T::SLOT_W);  // [STAGES][ATOMS][8][64]
  const int tid = int(threadIdx.x), lane = tid & 31, warp = tid >> 5;
  pdl_begin_gemm();  // the offsets (and a's x rows) are an earlier kernel's
  const int nblocks = int(gridDim.x), blk = int(blockIdx.x);
  const int TA = grouped_tile_count<T::BM>(cp.a, lane), TB = grouped_tile_count<T::BM>(cp.b, lane);
  const int nA = blk < TA ? (TA - 1 - blk) / nblocks + 1 : 0;
  const int jb = ((blk - TA) % nblocks + nblocks) % nblocks;  // this block's first b tile
  const int nB = jb < TB ? (TB - 1 - jb) / nblocks + 1 : 0;
  const int KTA = cp.a.K / T::BK, KTB = cp.b.K / T::BK;  // the host keeps K % BK == 0, K >= kAhead BK
  const int stepsA = nA * KTA, steps = stepsA + nB * KTB;
  constexpr int kSteps = kSliceK / T::BK;
  constexpr int kAhead = T::STAGES - 2;

  // The block's tile t (a's first, then b's): its problem, index in the launch, K steps.
  const auto tile_of_step = [&](int s) { return s < stepsA ? s / KTA : nA + (s - stepsA) / KTB; };
  const auto kt_of_step = [&](int s) { return s < stepsA ? s % KTA : (s - stepsA) % KTB; };
  const auto find = [&](int t, TileSpot& spot) {
    return t < nA ? find_tile<T::BM, true>(cp.a, blk + t * nblocks, tid, lane, spot)
                  : find_tile<T::BM, true>(cp.b, jb + (t - nA) * nblocks, tid, lane, spot);
  };

  // Issue side (as gemm_wgstream_kernel's): this thread copies chunk c of weight rows
  // r0 + q kRowStep and, for r0 < BM, chunk c of x row r0, of the issue tile `itile`.
  const int c = tid % T::CPR, r0 = tid / T::CPR;
  constexpr int kRowStep = T::WG_THREADS / T::CPR;
  int64_t w_off[T::W_PER_THREAD];
  int64_t x_off = -1;
  const uint16_t* iw = cp.a.w;
  const uint16_t* ix = cp.a.x;
  int itile = -1;       // tile whose offsets are loaded; -2: none found (the issue side stops)
  int ready_tile = -1;  // the b tile whose group is complete: its x chunks go with its weights
  const auto enter_issue_tile = [&](int t) {
    TileSpot spot;
    if (!find(t, spot)) {
      itile = -2;
      return;
    }
    itile = t;
    iw = spot.w;
    ix = spot.x;
    const auto offsets = [&](const MmaGemmParams& p) {
#pragma unroll
      for (int q = 0; q < T::W_PER_THREAD; ++q) w_off[q] = b_row_offset(p, spot.n_tile * T::BN + r0 + q * kRowStep);
      x_off = r0 < T::BM ? a_row_offset(p, spot.row_begin + r0, spot.row_end) : -1;
    };
    if (t < nA)
      offsets(cp.a);
    else
      offsets(cp.b);
  };
  const L2Hint w_hint = l2_evict_first_hint(cp.a.l2_evict_first > 0);
  const auto copy_x = [&](int slot, int kt) {  // the issue tile's x chunk of its step kt
    if (r0 >= T::BM) return;
    const int k = kt * T::BK + c * 8, atom = c >> 3, cc = c & 7;
    const bool in = x_off >= 0;
    const uint32_t dst = ring_x + uint32_t(slot * T::SLOT_X + atom * T::ATOM_X + r0 * 128 + ((cc ^ (r0 & 7)) * 16));
    cp_async16_at(dst, in ? ix + x_off + k : ix, in ? 16 : 0);
  };
  const auto copy_step = [&](int slot, int s) {
    if (s >= steps) return;
    const int t = tile_of_step(s);
    if (t != itile && itile != -2) enter_issue_tile(t);
    if (itile == -2) return;
    const int kt = kt_of_step(s);
    const int k = kt * T::BK + c * 8, atom = c >> 3, cc = c & 7;
#pragma unroll
    for (int q = 0; q < T::W_PER_THREAD; ++q) {
      const int r = r0 + q * kRowStep;
      const bool in = w_off[q] >= 0;
      const uint32_t dst = ring_w + uint32_t(slot * T::SLOT_W + atom * T::ATOM_W + r * 128 + ((cc ^ (r & 7)) * 16));
      cp_async16_at(dst, in ? iw + w_off[q] + k : iw, in ? 16 : 0, w_hint);
    }
    if (t < nA || t == ready_tile) copy_x(slot, kt);
  };

  // Compute side: as gemm_wgstream_kernel's (thread (warp w, lane l) holds D rows 16 w + l / 4
  // and + 8 for x rows 2 (l % 4) and + 1).
  const int g = lane >> 2, tq = lane & 3;
  float acc[4] = {0.f, 0.f, 0.f, 0.f}, tot[4] = {0.f, 0.f, 0.f, 0.f};
  // Store the finished tile t; an a tile is then counted toward its group (every thread's stores
  // fenced, the barrier, one atomic).
  const auto store = [&](int t) {
    TileSpot ct;
    if (!find(t, ct)) return;
    const int n = ct.n_tile * T::BN + warp * 16 + g;
    if (t < nA) {
      // Rows n and n + 8 pair with n + 1 and n + 9 (up), held by lane + 4: even g stores.
      float up[4];
#pragma unroll
      for (int e = 0; e < 4; ++e) up[e] = __shfl_xor_sync(0xffffffffu, tot[e], 4);
      if ((g & 1) == 0) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int row = ct.row_begin + 2 * tq + (e & 1), col = n + (e >> 1) * 8;
          if (row < ct.row_end && col < cp.a.N)
            static_cast<uint16_t*>(cp.a.out)[ct.out_base + int64_t(row) * cp.a.os + (col >> 1)] =
                gated_value(tot[e], up[e]);
        }
      }
      __threadfence();
      __syncthreads();
      if (tid == 0) atomicAdd(cp.counters + ct.group, 1);
    } else {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int row = ct.row_begin + 2 * tq + (e & 1), col = n + (e >> 1) * 8;
        if (row < ct.row_end && col < cp.b.N)
          store_out_pair<false>(cp.b, ct.out_base + int64_t(row) * cp.b.os + col, tot[e], 0.f, false);
      }
    }
  };
  // Wait until every a tile of b tile t's group is stored.
  const auto wait_group = [&](int t) {
    TileSpot ct;
    if (find(t, ct) && tid == 0) {
      int lo = cp.a.offsets[ct.group], hi = cp.a.offsets[ct.group + 1];
      clamp_group_rows(cp.a, lo, hi);
      const int need = (hi - lo + T::BM - 1) / T::BM * cp.a.n_tiles;
      for (int polls = 0; ld_acquire_gpu(cp.counters + ct.group) < need; ++polls) {
        if (polls == (1 << 24)) {
          atomicOr(cp.a.error_flag, kErrChainWait);
          break;
        }
        __nanosleep(64);
      }
    }
    __syncthreads();
  };
  const auto fold = [&]() {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      tot[e] = __fadd_rn(tot[e], acc[e]);
      acc[e] = 0.f;
    }
  };
  const auto clear_total = [&]() {
#pragma unroll
    for (int e = 0; e < 4; ++e) tot[e] = 0.f;
  };

  // Prologue: steps [0, kAhead).
#pragma unroll
  for (int s = 0; s < kAhead; ++s) {
    copy_step(s % T::STAGES, s);
    cp_async_commit();
  }
  bool pending = false;  // a slice's last group is in flight: fold it into the total first
  for (int i = 0; i < steps; ++i) {
    const int t = tile_of_step(i), kt = kt_of_step(i);
    if (kt == 0 && t >= nA && t != ready_tile) {
      // A b tile's first step: the tile before is stored (and counted) first, since it may be
      // one this wait is for; then the x chunks of this tile's steps already issued.
      if (pending) {
        wg_wait_all();
        fold();
        pending = false;
        if (t > 0) store(t - 1);
        clear_total();
      }
      wait_group(t);
      ready_tile = t;
      if (itile == t)
        for (int s = i; s < i + kAhead && s < steps; ++s)
          if (tile_of_step(s) == t) copy_x(s % T::STAGES, kt_of_step(s));
      cp_async_commit();
      cp_async_wait<0>();
    }
    cp_async_wait<kAhead - 1>();
    fence_proxy_async_smem();  // the copies' writes (generic proxy) before the wgmma's reads
    __syncthreads();
    copy_step((i + kAhead) % T::STAGES, i + kAhead);
    cp_async_commit();
    if (pending) {
      wg_wait_all();
      fold();
      pending = false;
      if (kt == 0) {  // ... and it was the previous tile's last
        store(t - 1);
        clear_total();
      }
    }
    const uint32_t wb = ring_w + uint32_t((i % T::STAGES) * T::SLOT_W);
    const uint32_t xb = ring_x + uint32_t((i % T::STAGES) * T::SLOT_X);
    wg_fence();
#pragma unroll
    for (int kk = 0; kk < T::BK / 16; ++kk)
      wgmma_m64n8k16(acc, wg_desc(wb + uint32_t((kk >> 2) * T::ATOM_W + (kk & 3) * 32)),
                     wg_desc(xb + uint32_t((kk >> 2) * T::ATOM_X + (kk & 3) * 32)));
    wg_commit();
    wg_wait_one();
    const int KT = t < nA ? KTA : KTB;
    pending = (kt + 1) % kSteps == 0 || kt + 1 == KT;
  }
  wg_wait_all();
  cp_async_wait<0>();  // nothing in flight when the block's shared memory is released
  if (pending) {
    fold();
    store(tile_of_step(steps - 1));
  }
  // The last block out zeroes the counters for the next launch.
  __syncthreads();
  if (tid == 0) {
    __threadfence();
    const int groups = cp.a.groups;
    if (atomicAdd(cp.counters + groups, 1) == nblocks - 1) {
      for (int q = 0; q <= groups; ++q) cp.counters[q] = 0;
      __threadfence();
    }
  }
#else
  __trap();  // the host never launches it without sm_90a device code (gemm_stream_probe_kernel)
#endif
}

}  // namespace atlas::cuda::kern
