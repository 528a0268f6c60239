// Warp-specialised variant of the wgmma GEMM (kernels/gemm_wgmma.cuh; same numerics contract, so
// the same bits as every other config): a producer warpgroup copies, three consumer warpgroups
// only wait, multiply and add, and the two sides meet at shared-memory barriers (mbarrier) per
// ring slot instead of a block-wide __syncthreads per K step.
//
// Why: in gemm_wgmma_kernel every thread issues its share of the copies and every K step ends in
// a barrier of all 384 threads, so a warpgroup whose wgmma group finished early idles until the
// slowest one has issued its copies, and the copies ride on the consumers' issue slots (the
// prefill's large GEMMs ran at ~240 TFLOP/s, 2.2-2.8x cuBLASLt). Here the consumers never wait
// for each other: a ring slot is "full" once the producer's copies into it have landed
// (cp.async.mbarrier.arrive.noinc: each producer thread arrives when its own copies complete)
// and "empty" once every consumer warp has retired the wgmma group that read it.
//
// Tile: WsTile = 192 x 128 outputs (3 consumer warpgroups of 64 rows, wgmma.m64n128k16), BK = 64,
// STAGES ring slots of A [192][64] and B [128][64] bf16 with the 128-byte swizzle the wgmma
// descriptors expect (swz<8>, 1024-byte aligned tiles), the A / B row tables of the other
// table-driven kernels (gather, gated gate|up interleave, zero rows past M / N), the copies in
// load_tile_step's chunks. K must be a multiple of BK (the host runs the plain wgmma config
// otherwise), so every step is the same group of four wgmma with nothing between them.
// setmaxnreg moves registers from the producer (56) to the consumers (152: 64 accumulators and
// 64 of the slice total each). Consumer step: wait "full", fence the async proxy, add a finished
// slice into the total (wait_group 0 first), issue the step's 4 wgmma as one group, wait_group 1
// (the previous step's group is done) and release the previous step's slot. The K slice /
// running total bookkeeping is gemm_wgmma_kernel's, so the arithmetic is the same chain in the
// same order. Compiled only into sm_90a code (__CUDA_ARCH_FEAT_SM90_ALL); the host asks the
// wgmma probe before choosing it.
#pragma once

#include "gemm_wgmma.cuh"

namespace atlas::cuda::kern {

struct WsTile {
  static constexpr int WGS = 3, BM = 64 * WGS, BN = 128, BK = 64, STAGES = 5, CH = BK / 8;
  static constexpr int CONSUMERS = 128 * WGS;         // threads of the consumer warpgroups
  static constexpr int THREADS = CONSUMERS + 128;     // + the producer warpgroup
  // Registers per thread after setmaxnreg: the consumers hold 64 accumulators + 64 of the slice
  // total; the producer only addresses. 3 * 128 * 152 + 128 * 56 = 65536, the register file.
  static constexpr int CONSUMER_REGS = 152, PRODUCER_REGS = 56;
  static constexpr int NACC = BN / 2;
  static constexpr int TILE_A = BM * BK * 2, TILE_B = BN * BK * 2;  // bytes per stage
  // ring + 1024 for aligning it + the row offset tables + full / empty barriers
  static constexpr int SMEM_BYTES = STAGES * (TILE_A + TILE_B) + 1024 + (BM + BN) * 8 + 2 * STAGES * 8;
  static_assert(SMEM_BYTES <= 227 * 1024, "Hopper's shared memory per block");
  static_assert((BM + BN) * CH % 128 == 0, "the producer's copies: whole rounds of its 128 threads");
};

__device__ __forceinline__ void mbar_init(uint32_t bar, int count) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
#endif
}
__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile(
      "{\n"
      ".reg .pred done;\n"
      "WAIT:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra WAIT;\n"
      "}\n" ::"r"(bar),
      "r"(parity)
      : "memory");
#endif
}
__device__ __forceinline__ void mbar_arrive(uint32_t bar) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
#endif
}
// Register budget of this warpgroup from here on (all its threads execute it; sm_90a).
template <int N>
__device__ __forceinline__ void setmaxnreg_inc() {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(N));
#endif
}
template <int N>
__device__ __forceinline__ void setmaxnreg_dec() {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(N));
#endif
}
// Arrives on `bar` once every cp.async this thread issued before it has landed (the expected
// count includes these arrivals: .noinc).
__device__ __forceinline__ void cp_async_mbar_arrive(uint32_t bar) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(bar) : "memory");
#endif
}

template <class T, bool kOutF32>
__global__ void __launch_bounds__(T::THREADS, 1) gemm_wgmma_ws_kernel(const MmaGemmParams p) {
  pdl_begin();
  extern __shared__ unsigned char ws_smem_raw[];
  const uint32_t raw = smem_u32(ws_smem_raw);
  unsigned char* ring = ws_smem_raw + (((raw + 1023u) & ~1023u) - raw);
  uint16_t* sA = reinterpret_cast<uint16_t*>(ring);                          // [STAGES][BM][BK]
  uint16_t* sB = reinterpret_cast<uint16_t*>(ring + T::STAGES * T::TILE_A);  // [STAGES][BN][BK]
  int64_t* a_off = reinterpret_cast<int64_t*>(ring + T::STAGES * (T::TILE_A + T::TILE_B));
  int64_t* b_off = a_off + T::BM;
  const uint32_t full0 = smem_u32(b_off + T::BN), empty0 = full0 + 8 * T::STAGES;  // 8 bytes each

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  TileSpot t;
  if (!find_tile<T::BM, true>(p, int(blockIdx.x), tid, lane, t)) return;  // the whole block
  const int row_begin = t.row_begin, row_end = t.row_end;
  const int n0 = t.n_tile * T::BN;
  for (int r = tid; r < T::BM; r += T::THREADS) a_off[r] = a_row_offset(p, row_begin + r, row_end);
  for (int r = tid; r < T::BN; r += T::THREADS) b_off[r] = b_row_offset(p, n0 + r);
  if (tid == 0) {
    for (int s = 0; s < T::STAGES; ++s) {
      mbar_init(full0 + 8 * s, 128);                     // the producer's threads
      mbar_init(empty0 + 8 * s, T::CONSUMERS / 32);      // one arrival per consumer warp
    }
  }
  __syncthreads();  // tables and barriers ready; the last block-wide barrier

  const int K = p.K;  // a multiple of BK (host)
  int KT = K / T::BK;
  int kt_begin = 0;
  int64_t out_base = t.out_base;
  if (p.slice_stride > 0) {
    kt_begin = int(blockIdx.y) * (kSliceK / T::BK);
    KT = min(KT, kt_begin + kSliceK / T::BK);
    out_base += int64_t(blockIdx.y) * p.slice_stride;
  }
  const int nsteps = KT - kt_begin;

  // Warp-uniform in the compiler's eyes too (a shuffle of lane 0's value), so the wgmma below sit
  // on a path the whole warpgroup takes.
  const int role = __shfl_sync(0xffffffffu, tid / 128, 0);
  if (role == T::WGS) {
    // ---- producer warpgroup: thread i copies 16-byte chunk column c = i % 8 of rows i / 8 + 16 j ----
    setmaxnreg_dec<T::PRODUCER_REGS>();
    const int i = tid - T::CONSUMERS, c = i & 7, r0 = i >> 3;
    for (int rel = 0; rel < nsteps; ++rel) {
      const int s = rel % T::STAGES, use = rel / T::STAGES;
      if (use > 0) mbar_wait(empty0 + 8 * s, uint32_t(use - 1) & 1u);  // the consumers are done with it
      const int gk = (kt_begin + rel) * T::BK + c * 8;
      const uint32_t a_dst = smem_u32(sA + s * (T::BM * T::BK)), b_dst = smem_u32(sB + s * (T::BN * T::BK));
#pragma unroll 4
      for (int r = r0; r < T::BM; r += 16) {
        const int64_t off = a_off[r];
        const bool ok = off >= 0;
        cp_async16_at(a_dst + uint32_t(r * T::BK + swz<T::CH>(r, c) * 8) * 2u, ok ? t.x + off + gk : t.x, ok ? 16 : 0);
      }
#pragma unroll 4
      for (int r = r0; r < T::BN; r += 16) {
        const int64_t off = b_off[r];
        const bool ok = off >= 0;
        cp_async16_at(b_dst + uint32_t(r * T::BK + swz<T::CH>(r, c) * 8) * 2u, ok ? t.w + off + gk : t.w, ok ? 16 : 0);
      }
      cp_async_mbar_arrive(full0 + 8 * s);
    }
    cp_async_wait<0>();  // nothing in flight when the warpgroup leaves
    return;
  }

  // ---- consumer warpgroups ----
  setmaxnreg_inc<T::CONSUMER_REGS>();
  const int wg = role, wq = warp & 3;
  float acc[T::NACC], tot[T::NACC];
#pragma unroll
  for (int i = 0; i < T::NACC; ++i) acc[i] = tot[i] = 0.0f;
  bool pending = false;
  for (int rel = 0; rel < nsteps; ++rel) {
    const int kt = kt_begin + rel, s = rel % T::STAGES;
    mbar_wait(full0 + 8 * s, uint32_t(rel / T::STAGES) & 1u);
    fence_proxy_async_smem();  // the producer's landed copies, visible to the tensor cores' reads
    if (pending) {  // the previous slice is complete: total += slice, new slice from +0
      wg_wait_all();
#pragma unroll
      for (int i = 0; i < T::NACC; ++i) {
        tot[i] = __fadd_rn(tot[i], acc[i]);
        acc[i] = 0.0f;
      }
      pending = false;
    }
    const uint32_t a_base = smem_u32(sA + s * (T::BM * T::BK)) + uint32_t(wg * 64 * T::BK * 2);
    const uint32_t b_base = smem_u32(sB + s * (T::BN * T::BK));
    // Every step is whole (K % BK == 0: the host's condition for this config), so the group is
    // always the same four wgmma and nothing branches between them.
    wg_fence_operands(acc);
    wg_fence();
#pragma unroll
    for (int kk = 0; kk < T::BK / 16; ++kk) wgmma_m64n128k16(acc, wg_desc(a_base + kk * 32), wg_desc(b_base + kk * 32));
    wg_commit();
    wg_fence_operands(acc);
    wg_wait_one();  // the previous step's group has retired: its slot may be refilled
    if (rel > 0 && lane == 0) mbar_arrive(empty0 + 8 * ((rel - 1) % T::STAGES));
    pending = (kt + 1) % (kSliceK / T::BK) == 0;
  }
  wg_wait_all();  // the last slice (complete or short)
#pragma unroll
  for (int i = 0; i < T::NACC; ++i) tot[i] = __fadd_rn(tot[i], acc[i]);

  // Accumulator i of a thread: n8 tile i / 4, row gid (+8 for i % 4 >= 2), column 2*tig + i % 2
  // inside the tile; warp wq of warpgroup wg holds rows 64 wg + 16 wq .. +15.
  const int gid = lane >> 2, tig = lane & 3;
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int row = row_begin + wg * 64 + wq * 16 + gid + half * 8;
    if (row >= row_end) continue;
    const int64_t o_row = out_base + int64_t(row) * p.os;
#pragma unroll
    for (int nt = 0; nt < T::BN / 8; ++nt) {
      const int col = n0 + nt * 8 + tig * 2;
      if (col >= p.N) continue;
      store_tile_pair<kOutF32>(p, o_row, col, tot[nt * 4 + half * 2], tot[nt * 4 + half * 2 + 1]);
    }
  }
}

}  // namespace atlas::cuda::kern
