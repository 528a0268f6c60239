// Batch-invariant GEMM on Hopper's warpgroup tensor-core instructions (wgmma, sm_90a): the same
// numerics contract as kernels/gemm_mma.cuh (read it first), so the same bits as every other
// config: per output, the k16 chunks of a 256-wide K slice are chained into an fp32 accumulator
// starting from +0 (acc = A_c * B_c + acc, c ascending), and each finished slice is added to a
// running total in slice order. wgmma.m64n128k16 over one k16 chunk is that chain's step for a
// 64 x 128 block of outputs (each output's accumulator is updated by its own 16-term product,
// as mma.m16n8k16 does); the GPU tests compare this config's bits with every other config's.
//
// Tile: 64 WGS x 128 outputs per block (WgTile<WGS>: 2 or 3 warpgroups of 4 warps, warpgroup g
// owns rows 64g..64g+63), BK = 64: a shared-memory row is 128 bytes, stored with the 16-byte
// chunks XOR-swizzled by row (swz<8>), which is the hardware's 128-byte swizzle for K-major
// operands, so the descriptors point straight at the cp.async ring (STAGES deep, tile bases
// 1024-byte aligned). Per K step: wait for the step's copies, fence them into the async proxy,
// barrier, issue the copies of step + STAGES - 2, then 4 wgmma per warpgroup (one per k16 chunk)
// as one group, leaving it in flight while the next step waits for its copies (a ring slot is
// refilled two steps after its last read). A slice's last group stays in flight too: the next
// step adds the finished slice into the total after its barrier, just before its own wgmma.
// Only the 16-byte-copy path exists (aligned operands, K % 8 == 0); the host runs another config
// otherwise. Compiled only into sm_90a code (__CUDA_ARCH_FEAT_SM90_ALL); the host asks
// its probe (gemm_wgmma_probe_kernel, at setup) before choosing it.
#pragma once

#include "gemm_mma.cuh"

namespace atlas::cuda::kern {

template <int WGS_>
struct WgTile {
  // WGS warpgroups, warpgroup g owns rows 64g .. 64g+63 of a BM = 64 WGS row tile, 128 columns
  // (wgmma.m64n128k16). Registers per thread: 64 accumulators + 64 of the slice total.
  static constexpr int WGS = WGS_, BM = 64 * WGS_, BN = 128, BK = 64, STAGES = 5, THREADS = 128 * WGS_, CH = BK / 8;
  static constexpr int NACC = BN / 2;
  static constexpr int TILE_A = BM * BK * 2, TILE_B = BN * BK * 2;  // bytes per stage
  // ring + 1024 for aligning it + the row offset tables
  static constexpr int SMEM_BYTES = STAGES * (TILE_A + TILE_B) + 1024 + (BM + BN) * 8;
  static_assert(SMEM_BYTES <= 227 * 1024, "Hopper's shared memory per block");
};

// Shared-memory matrix descriptor, K-major operand with the 128-byte swizzle: start address,
// leading byte offset 16 (unused by this layout), stride byte offset 1024 (8 rows of 128 bytes).
__device__ __forceinline__ uint64_t wg_desc(uint32_t saddr) {
  return uint64_t((saddr & 0x3FFFFu) >> 4) | (uint64_t(16 >> 4) << 16) | (uint64_t(1024 >> 4) << 32) |
         (uint64_t(1) << 62);
}

__device__ __forceinline__ void wg_fence() {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void wg_commit() {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void wg_wait_all() {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void wg_wait_one() {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile("wgmma.wait_group.sync.aligned 1;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void fence_proxy_async_smem() {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
#endif
}

// D(64 x 128, fp32 registers) = A(64 x 16) * B(16 x 128) + D, both operands from shared memory.
__device__ __forceinline__ void wgmma_m64n128k16(float (&d)[64], uint64_t desc_a, uint64_t desc_b) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile(
      "{\n"
      ".reg .pred p;\n"
      "setp.ne.b32 p, %66, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, "
      "%64, %65, p, 1, 1, 0, 0;\n"
      "}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
        "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
        "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
        "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
        "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
        "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
      : "l"(desc_a), "l"(desc_b), "r"(1));
#else
  __trap();
#endif
}

// One K step of a warpgroup's 64 x 128 accumulators (this kernel and kernels/gemm_tma.cuh): the
// k16 chunks of step kt that lie inside K (KC chunks in all; chunks past K are not part of the
// contract) from the ring slot's A rows at a_base and B rows at b_base, as one committed group.
template <class T>
__device__ __forceinline__ void wg_issue_step(float (&acc)[T::NACC], uint32_t a_base, uint32_t b_base, int kt,
                                              int KC) {
  wg_fence();
  if ((kt + 1) * (T::BK / 16) <= KC) {  // a whole step (every step but a short last one)
#pragma unroll
    for (int kk = 0; kk < T::BK / 16; ++kk) wgmma_m64n128k16(acc, wg_desc(a_base + kk * 32), wg_desc(b_base + kk * 32));
  } else {
#pragma unroll
    for (int kk = 0; kk < T::BK / 16; ++kk)
      if (kt * (T::BK / 16) + kk < KC)  // uniform
        wgmma_m64n128k16(acc, wg_desc(a_base + kk * 32), wg_desc(b_base + kk * 32));
  }
  wg_commit();
}

// A finished K slice: once its groups retired, total += slice and the next slice starts from +0.
template <int N>
__device__ __forceinline__ void wg_fold_slice(float (&tot)[N], float (&acc)[N]) {
  wg_wait_all();
#pragma unroll
  for (int i = 0; i < N; ++i) {
    tot[i] = __fadd_rn(tot[i], acc[i]);
    acc[i] = 0.0f;
  }
}

// The epilogue's plain store of one accumulator row half (row gid + 8 half of the warp's 16):
// columns n0 + 8 nt + 2 tig (+1) of n8 tiles nt, pairs of the 64 accumulators.
template <class T, bool kOutF32>
__device__ __forceinline__ void wg_store_half(const MmaGemmParams& p, const float (&tot)[T::NACC], int64_t o_row, int n0,
                                              int tig, int half) {
#pragma unroll
  for (int nt = 0; nt < T::BN / 8; ++nt) {
    const int col = n0 + nt * 8 + tig * 2;
    if (col >= p.N) continue;
    store_tile_pair<kOutF32>(p, o_row, col, tot[nt * 4 + half * 2], tot[nt * 4 + half * 2 + 1]);
  }
}

// 1 where this binary's device code has the wgmma kernel (built for sm_90a), else 0.
__global__ void gemm_wgmma_probe_kernel(int* out) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  *out = 1;
#else
  *out = 0;
#endif
}

template <class T, bool kOutF32>
__global__ void __launch_bounds__(T::THREADS, 1) gemm_wgmma_kernel(const MmaGemmParams p) {
  pdl_begin_gemm();
  extern __shared__ unsigned char wg_smem_raw[];
  // The ring must start 1024-byte aligned (the swizzle pattern repeats every 8 rows of 128 B).
  const uint32_t raw = smem_u32(wg_smem_raw);
  unsigned char* ring = wg_smem_raw + (((raw + 1023u) & ~1023u) - raw);
  uint16_t* sA = reinterpret_cast<uint16_t*>(ring);                    // [STAGES][BM][BK]
  uint16_t* sB = reinterpret_cast<uint16_t*>(ring + T::STAGES * T::TILE_A);  // [STAGES][BN][BK]
  int64_t* a_off = reinterpret_cast<int64_t*>(ring + T::STAGES * (T::TILE_A + T::TILE_B));
  int64_t* b_off = a_off + T::BM;

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int wg = warp >> 2, wq = warp & 3;  // warpgroup, warp inside it

  TileSpot t;
  if (!find_tile<T::BM, true>(p, int(blockIdx.x), tid, lane, t)) return;
  const int row_begin = t.row_begin, row_end = t.row_end;
  const uint16_t* x = t.x;
  const uint16_t* w = t.w;
  int64_t out_base = t.out_base;
  const int n0 = t.n_tile * T::BN;
  for (int r = tid; r < T::BM; r += T::THREADS) a_off[r] = a_row_offset(p, row_begin + r, row_end);
  for (int r = tid; r < T::BN; r += T::THREADS) b_off[r] = b_row_offset(p, n0 + r);
  __syncthreads();

  const int K = p.K;
  int KT = (K + T::BK - 1) / T::BK;
  const int KC = (K + 15) / 16;
  int kt_begin = 0;
  if (p.slice_stride > 0) {
    kt_begin = int(blockIdx.y) * (kSliceK / T::BK);
    KT = min(KT, kt_begin + kSliceK / T::BK);
    out_base += int64_t(blockIdx.y) * p.slice_stride;
  }

  // The copies are planned once per tile (TileCopies: a step then costs an add and a cp.async
  // per copy); load_tile_step's per-step row / swizzle / offset arithmetic made up most of the
  // ~380 instructions per warp per K step that Nsight counted here (session 9).
  TileCopies<T> copies;
  copies.plan(sA, sB, a_off, b_off, x, w, tid);
  const L2Hint w_hint = l2_evict_first_hint(p.l2_evict_first > 0);
  auto load_stage = [&](int slot, int kt) { copies.issue(slot, kt * T::BK, K, kt - kt_begin < T::STAGES, x, w_hint); };

  float acc[T::NACC], tot[T::NACC];
#pragma unroll
  for (int i = 0; i < T::NACC; ++i) acc[i] = tot[i] = 0.0f;

  // Copies run STAGES - 2 steps ahead and one step's wgmma group stays in flight while the next
  // step's copies are waited for: the slot refilled at step r was read by step r - 2, whose group
  // every warpgroup has retired (wait_group 1 at the end of step r - 1) before step r's barrier.
  // A slice's last group is also left in flight (wait_group 1): the next step adds the finished
  // slice into the total only after its barrier and copies are issued, just before its first
  // wgmma overwrites the accumulators, so the tensor cores are not drained while the block waits
  // at the barrier (`pending`).
  constexpr int kAhead = T::STAGES - 2;
#pragma unroll
  for (int s = 0; s < kAhead; ++s) {
    if (kt_begin + s < KT) load_stage(s, kt_begin + s);
    cp_async_commit();
  }
  bool pending = false;
  for (int kt = kt_begin; kt < KT; ++kt) {
    const int rel = kt - kt_begin;
    cp_async_wait<kAhead - 1>();  // step kt's copies (this thread's) have landed
    fence_proxy_async_smem();     // ... and are visible to the tensor cores' reads
    __syncthreads();
    {
      const int nk = kt + kAhead;
      if (nk < KT) load_stage((rel + kAhead) % T::STAGES, nk);
      cp_async_commit();
    }
    if (pending) {  // the previous slice is complete: total += slice, new slice from +0
      wg_fold_slice(tot, acc);
      pending = false;
    }
    const uint32_t a_base = smem_u32(sA + (rel % T::STAGES) * (T::BM * T::BK)) + uint32_t(wg * 64 * T::BK * 2);
    const uint32_t b_base = smem_u32(sB + (rel % T::STAGES) * (T::BN * T::BK));
    wg_issue_step<T>(acc, a_base, b_base, kt, KC);
    wg_wait_one();
    pending = (kt + 1) % (kSliceK / T::BK) == 0;
  }
  wg_wait_all();  // the last slice (complete or short)
#pragma unroll
  for (int i = 0; i < T::NACC; ++i) tot[i] = __fadd_rn(tot[i], acc[i]);
  cp_async_wait<0>();

  // Accumulator i of a thread: n8 tile i / 4, row gid (+8 for i % 4 >= 2), column 2*tig + i % 2
  // inside the tile; warp wq of warpgroup wg holds rows 64 wg + 16 wq .. +15.
  const int gid = lane >> 2, tig = lane & 3;
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int row = row_begin + wg * 64 + wq * 16 + gid + half * 8;
    if (row >= row_end) continue;
    wg_store_half<T, kOutF32>(p, tot, out_base + int64_t(row) * p.os, n0, tig, half);
  }
}

}  // namespace atlas::cuda::kern
