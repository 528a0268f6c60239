// Batch-invariant GEMM on wgmma with operands brought in by the Tensor Memory Accelerator (TMA,
// sm_90a): the numerics of kernels/gemm_wgmma.cuh (and so of kernels/gemm_mma.cuh's contract),
// the same 64 WGS x 128 tile, the same 128-byte-swizzled K-major ring the wgmma descriptors read;
// only the copies differ. Nsight (H200, session 9) found the cp.async kernel bound by its own
// instruction stream, ~380 warp instructions per warp per 64-wide K step, most of them copy
// address arithmetic, against 4 wgmma. Here a producer warp (of its own warpgroup) issues a K
// step's copies as three tensor copies (the A box of BM rows and two B boxes of 64 rows, 64
// columns each, the swizzle done by the copy engine), which complete on the slot's "full"
// mbarrier with a byte count; there is no block barrier per step. A consumer warpgroup that has retired its wgmma of step kt - 1
// (wait_group 1 at step kt) arrives on that slot's "empty" mbarrier, and the producer refills a
// slot as soon as all of them have (session 10's kernel had thread 0 of the first warpgroup
// refill the slot of step kt - 2 at step kt: three steps of look-ahead of the five, and that
// warpgroup waiting for the slowest). Persistent: one block per SM walks its tiles (pid =
// blockIdx.x + i * gridDim.x, dense batch entries numbered one after the other), and since the
// epilogue stores from registers, the producer loads the next tile's first steps while the
// consumers store the last one (the ring's fill and the epilogue no longer idle the SM between
// tiles). Each K step's wgmma sequence is the old kernel's: the same bits.
//
// Operands (host: gemm.cu's tensor maps, 3D, box 64 x rows x 1, SWIZZLE_128B, zero fill outside):
//   A: [batch][rows][K] bf16: dense x (batch = the strided batch's product), or grouped rows
//      in A-row order (batch 1; the host gathers x_rows first). Rows of a box past the tile's
//      row_end are other groups' rows or zeros: a row's outputs depend on its own A row only and
//      such rows are never stored.
//   B: [batch][N][K] (dense) or [groups][N][K] (grouped: group g's weight at a fixed stride).
//      Columns n0..n0+127 = box rows n0..n0+63 and n0+64..n0+127; with p.gated (gate rows
//      [0, I), up rows [I, 2I)) the boxes are gate rows n0/2.. and up rows I + n0/2.., so tile
//      column c < 64 is gate j = n0/2 + c and c + 64 is up j: a thread holds both (n8 tiles nt
//      and nt + 8) and stores the activation itself.
// K past the tensor's end reads as zeros, and chunks past K are never issued (as in every config).
#pragma once

#include <cuda.h>  // CUtensorMap (a 128-byte parameter type; no driver call is made here)

#include "dsmem.cuh"
#include "gemm_wgmma.cuh"

namespace atlas::cuda::kern {

template <int WGS_>
struct TmaTile {
  // WGS consumer warpgroups and a producer warpgroup (the last; one warp of it works). Registers
  // per thread after setmaxnreg (a launch of 512 threads starts at 128 each): the consumers hold
  // 64 accumulators + 64 of the slice total; 3 x 152 + 56 = 512 per lane of an SM sub-partition.
  static constexpr int WGS = WGS_, BM = 64 * WGS_, BN = 128, BK = 64, THREADS = 128 * (WGS_ + 1);
  static constexpr int PRODUCER_REGS = 56, CONSUMER_REGS = 152;
  static_assert(WGS_ * CONSUMER_REGS + PRODUCER_REGS <= 512, "the register file of an SM sub-partition");
  static constexpr int NACC = BN / 2;
  static constexpr int TILE_A = BM * BK * 2, TILE_B = BN * BK * 2;  // bytes per stage
  static constexpr int STAGES = WGS_ == 3 ? 5 : 6;                  // 200 KB / 192 KB ring
  static constexpr int MAX_GROUPS = 256;  // grouped offsets tables up to this copied to shared memory
  // ring + 1024 for aligning it + full[STAGES] and empty[STAGES] mbarriers + the offsets table
  static constexpr int SMEM_BYTES = STAGES * (TILE_A + TILE_B) + 1024 + 2 * STAGES * 8 + 4 * (MAX_GROUPS + 1);
  static_assert(SMEM_BYTES <= 227 * 1024, "Hopper's shared memory per block");
  static_assert(kSliceK % BK == 0, "a K slice must be whole BK steps");
};

// mbar_init, mbar_arrive_expect_tx (thread 0's arrival on a full barrier, announcing the bytes
// its tensor copies will deliver): kernels/dsmem.cuh.
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
// Until the barrier's phase with this parity has completed.
__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  // One PTX loop (the label is local to its braces): the warp stays converged for the
  // .aligned wgmma instructions that follow.
  asm volatile(
      "{\n.reg .pred p;\nATLAS_MBAR_WAIT:\nmbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n"
      "@!p bra ATLAS_MBAR_WAIT;\n}\n" ::"r"(bar),
      "r"(parity)
      : "memory");
#endif
}
// A box of the tensor map at coordinates (c0 = k, c1 = row, c2 = batch or group) into shared
// memory at dst, completing `bar`'s transaction count.
__device__ __forceinline__ void tma_load_3d(uint32_t dst, const CUtensorMap* map, uint32_t bar, int c0, int c1,
                                            int c2) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4, %5}], "
      "[%2];\n" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(bar), "r"(c0), "r"(c1), "r"(c2)
      : "memory");
#endif
}

// The grouped A operand for the TMA kernel: dst row r = x row x_rows[r] for r < *rows_total (16-byte
// copies; K % 8 == 0 and aligned rows, as the async path requires). A bad x_rows entry raises
// kErrGatherRows (as the other kernels' gather does) and leaves a zero row.
__global__ void gather_rows_kernel(const uint16_t* __restrict__ x, int64_t xs, const int32_t* __restrict__ x_rows,
                                   int64_t x_rows_limit, const int32_t* __restrict__ rows_total, int K,
                                   uint16_t* __restrict__ dst, int* error_flag) {
  pdl_begin_gemm();
  const int r = int(blockIdx.x);
  if (r >= *rows_total) return;
  const int64_t src = x_rows[r];
  const bool ok = src >= 0 && (x_rows_limit <= 0 || src < x_rows_limit);
  if (!ok && threadIdx.x == 0) atomicOr(error_flag, kErrGatherRows);
  const uint4* s = reinterpret_cast<const uint4*>(x + (ok ? src * xs : 0));
  uint4* d = reinterpret_cast<uint4*>(dst + int64_t(r) * K);
  for (int c = int(threadIdx.x); c < K / 8; c += int(blockDim.x)) d[c] = ok ? s[c] : make_uint4(0, 0, 0, 0);
}

template <class T, bool kOutF32>
__global__ void __launch_bounds__(T::THREADS, 1)
    gemm_tma_kernel(const __grid_constant__ CUtensorMap map_a, const __grid_constant__ CUtensorMap map_b,
                    const MmaGemmParams p) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  extern __shared__ unsigned char tma_smem_raw[];
  const uint32_t ring = (smem_u32(tma_smem_raw) + 1023u) & ~1023u;  // the swizzle repeats every 1024 B
  const uint32_t sA = ring;                                          // [STAGES][BM][BK]
  const uint32_t sB = ring + T::STAGES * T::TILE_A;                  // [STAGES][BN][BK]
  const uint32_t bars = sB + T::STAGES * T::TILE_B;                  // full[STAGES], empty[STAGES]
  // The grouped offsets table, read once per block instead of once per tile and warp from L2.
  int32_t* s_off = reinterpret_cast<int32_t*>(tma_smem_raw + (bars + 16u * T::STAGES - smem_u32(tma_smem_raw)));
  auto full = [&](int s) { return bars + 8u * uint32_t(s); };
  auto empty = [&](int s) { return bars + 8u * uint32_t(T::STAGES + s); };

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  // Warpgroup (WGS: the producer), warp inside it; warp-uniform in the compiler's eyes too (a
  // shuffle of lane 0's value), so the wgmma below sit on a path the whole warpgroup takes.
  const int wg = __shfl_sync(0xffffffffu, warp >> 2, 0), wq = warp & 3;

  // The first tile as every table-driven kernel finds it (launch overlap, weight prefetch). A
  // dense launch's tiles are numbered batch entry after batch entry (one grid dimension).
  const int per_batch = p.m_tiles * p.n_tiles;
  const bool grouped = p.offsets != nullptr;
  TileSpot first;
  const int first_pid = int(blockIdx.x);
  if (!start_tile<T::BM, T::BN, true>(p, grouped ? first_pid : first_pid % per_batch, tid, lane, first, 0, p.K,
                                      grouped ? -1 : first_pid / per_batch))
    return;  // the same answer for every thread
  const bool small_table = grouped && p.groups <= T::MAX_GROUPS;
  if (small_table)
    for (int i = tid; i <= p.groups; i += T::THREADS) s_off[i] = p.offsets[i];
  if (tid == 0) {
    for (int s = 0; s < T::STAGES; ++s) {
      mbar_init(full(s), 1);
      mbar_init(empty(s), T::WGS);
    }
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");  // visible to the copy engine
  }
  __syncthreads();  // the last block-wide barrier: the producer warpgroup leaves early

  // Tile `pid` of the launch (false: no more tiles for this block; the same answer in every
  // warp). Later tiles read the shared copy of the offsets; the first is `first`.
  auto tile_at = [&](int pid, TileSpot& t) {
    if (pid == first_pid) {
      t = first;
    } else if (pid >= p.tiles_total) {
      return false;
    } else if (!grouped) {
      if (!find_tile<T::BM, true>(p, pid % per_batch, tid, lane, t, pid / per_batch)) return false;
    } else if (!find_tile<T::BM, true>(p, pid, tid, lane, t, -1, small_table ? s_off : nullptr)) {
      return false;
    }
    if (grouped && t.w != p.w_group_base + int64_t(t.group) * p.w_group_stride) {  // the map would read another weight
      if (tid == 0 || tid == 128 * T::WGS) atomicOr(p.error_flag, kErrGroupWeight);
      return false;
    }
    return true;
  };
  const int K = p.K, KT = (K + T::BK - 1) / T::BK, KC = (K + 15) / 16;

  if (wg == T::WGS) {
    setmaxnreg_dec<T::PRODUCER_REGS>();
    if (wq != 0) return;
    // ---- producer warp: the ring's copies for every K step of every tile of this block ----
    // Step g (counted over the block's tiles) uses slot g % STAGES; its (g / STAGES)-th use
    // waits for the consumers' release of the use before (empty barrier phase g / STAGES - 1).
    int g = 0;
    for (int pid = first_pid;; pid += int(gridDim.x)) {
      TileSpot t;
      if (!tile_at(pid, t)) break;
      const int n0 = t.n_tile * T::BN;
      const int b_row0 = p.gated > 0 ? n0 / 2 : n0;
      const int b_row1 = p.gated > 0 ? p.gated + n0 / 2 : n0 + 64;
      const int a_z = grouped ? 0 : pid / per_batch, b_z = grouped ? t.group : pid / per_batch;
      for (int kt = 0; kt < KT; ++kt, ++g) {
        const int s = g % T::STAGES;
        if (g >= T::STAGES) mbar_wait(empty(s), uint32_t(g / T::STAGES - 1) & 1u);
        if (lane == 0) {
          const int k0 = kt * T::BK;
          const uint32_t a_dst = sA + uint32_t(s * T::TILE_A), b_dst = sB + uint32_t(s * T::TILE_B);
          mbar_arrive_expect_tx(full(s), uint32_t(T::TILE_A + T::TILE_B));
          tma_load_3d(a_dst, &map_a, full(s), k0, t.row_begin, a_z);
          tma_load_3d(b_dst, &map_b, full(s), k0, b_row0, b_z);
          tma_load_3d(b_dst + 64 * T::BK * 2, &map_b, full(s), k0, b_row1, b_z);
        }
        __syncwarp();
      }
    }
    return;
  }

  // ---- consumer warpgroups: wgmma over the ring, then the tile's epilogue from registers ----
  // (The epilogue touches no shared memory, so the producer fills the ring with the next tile's
  // first steps meanwhile.)
  setmaxnreg_inc<T::CONSUMER_REGS>();
  const int gid = lane >> 2, tig = lane & 3;
  int g = 0;
  for (int pid = first_pid;; pid += int(gridDim.x)) {
    TileSpot t;
    if (!__shfl_sync(0xffffffffu, int(tile_at(pid, t)), 0)) break;  // (uniform for the compiler too)
    const int row_begin = t.row_begin, row_end = t.row_end;
    const int n0 = t.n_tile * T::BN;

    float acc[T::NACC], tot[T::NACC];
#pragma unroll
    for (int i = 0; i < T::NACC; ++i) acc[i] = tot[i] = 0.0f;
    // As in gemm_wgmma_kernel: a slice's last group stays in flight and the next step adds the
    // finished slice into the total just before its own first wgmma (`pending`).
    bool pending = false;
    for (int kt = 0; kt < KT; ++kt, ++g) {
      const int s = g % T::STAGES;
      mbar_wait(full(s), uint32_t(g / T::STAGES) & 1u);  // step kt's boxes have landed
      if (pending) {  // the previous slice is complete: total += slice, new slice from +0
        wg_fold_slice(tot, acc);
        pending = false;
      }
      wg_issue_step<T>(acc, sA + uint32_t(s * T::TILE_A + wg * 64 * T::BK * 2), sB + uint32_t(s * T::TILE_B), kt,
                       KC);
      wg_wait_one();  // this warpgroup's step kt - 1 is retired: it no longer reads that slot
      if (kt >= 1 && (tid & 127) == 0) mbar_arrive(empty((g - 1) % T::STAGES));
      pending = (kt + 1) % (kSliceK / T::BK) == 0;
    }
    wg_wait_all();  // the last slice (complete or short)
    if ((tid & 127) == 0) mbar_arrive(empty((g - 1) % T::STAGES));
#pragma unroll
    for (int i = 0; i < T::NACC; ++i) tot[i] = __fadd_rn(tot[i], acc[i]);

    // Accumulator i of a thread: n8 tile i / 4, row gid (+8 for i % 4 >= 2), column 2*tig + i % 2
    // inside the tile; warp wq of warpgroup wg holds rows 64 wg + 16 wq .. +15.
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int row = row_begin + wg * 64 + wq * 16 + gid + half * 8;
      if (row >= row_end) continue;
      const int64_t o_row = t.out_base + int64_t(row) * p.os;
      if constexpr (!kOutF32) {
        if (p.gated > 0) {  // gate j in n8 tile nt < 8, up j in tile nt + 8
#pragma unroll
          for (int nt = 0; nt < 8; ++nt)
#pragma unroll
            for (int e = 0; e < 2; ++e) {
              const int j = n0 / 2 + nt * 8 + tig * 2 + e;
              if (j < p.gated)
                static_cast<uint16_t*>(p.out)[o_row + j] =
                    gated_value(tot[nt * 4 + half * 2 + e], tot[(nt + 8) * 4 + half * 2 + e]);
            }
          continue;
        }
      }
      wg_store_half<T, kOutF32>(p, tot, o_row, n0, tig, half);
    }
  }
#else
  __trap();  // the host runs this kernel only where the wgmma probe found sm_90a code
#endif
}

}  // namespace atlas::cuda::kern
