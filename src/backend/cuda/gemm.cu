// GEMM launchers: the batch-invariant tensor-core kernel (dense, strided batch, grouped MoE),
// the scalar fma_chain kernel, and the cuBLASLt fast path.
//
// CUDA-graph capture: gemm() and grouped_gemm() never synchronise, never read device data on the
// host and allocate nothing while a capture is running (sliced launches grow their per-stream
// scratch only outside captures), so they may be captured. One-time setup (the dynamic shared
// memory limits of every kernel instantiation, the device's SM count, the device error flag,
// the cuBLASLt handle and workspace) happens on the first call of either function: make that
// first call outside a capture (a warm-up step). cuBLASLt plans are cached per shape, so a
// later call of the same shape creates nothing either.
#include <cublasLt.h>
#include <cudaTypedefs.h>  // PFN_cuTensorMapEncodeTiled (the driver entry point, resolved at run time)
#include <dlfcn.h>         // cuBLASLt, opened on first use (lt_api)

#include <algorithm>
#include <array>
#include <atomic>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <mutex>
#include <type_traits>
#include <optional>
#include <string>
#include <string_view>
#include <tuple>
#include <vector>

#include "backend/cuda/cuda_internal.h"
#include "backend/cuda/kernels/gemm_cluster.cuh"
#include "backend/cuda/kernels/gemm_combine.cuh"
#include "backend/cuda/kernels/gemm_stream.cuh"
#include "backend/cuda/kernels/gemm_tail.cuh"
#include "backend/cuda/kernels/gemm_invariant.cuh"
#include "backend/cuda/kernels/gemm_latent.cuh"
#include "backend/cuda/kernels/gemm_merge.cuh"
#include "backend/cuda/kernels/gemm_mma.cuh"
#include "backend/cuda/kernels/gemm_tma.cuh"
#include "backend/cuda/kernels/gemm_wgmma.cuh"
#include "backend/cuda/kernels/gemm_wgstream.cuh"

namespace atlas::cuda {

using namespace detail;

// A switch's mode: the tests' override where set, else the environment's setting (below).
int mode_or_override(const std::atomic<int>& override_mode, int setting);

namespace {

// ---- tile configurations of the batch-invariant kernel ----------------------------------------
// All give the same bits (kernels/gemm_mma.cuh); they differ in speed only. Ordered from the
// largest tile to the smallest: the chooser takes the first that fills the GPU.
//                        BM   BN   BK  warps_m warps_n stages   smem
using CfgL128 = kern::MmaTile<128, 128, 32, 2, 4, 4>;  // 64 KB, 256 threads: prefill (1 block/SM)
using CfgL128N64 = kern::MmaTile<128, 64, 32, 4, 2, 4>;  // 48 KB, 256 threads: prefill (2 blocks/SM)
using CfgM64 = kern::MmaTile<64, 64, 64, 2, 2, 4>;     // 64 KB, 128 threads
using CfgM64N32 = kern::MmaTile<64, 32, 64, 2, 2, 4>;  // 48 KB, 128 threads
using CfgM32 = kern::MmaTile<32, 64, 64, 2, 2, 4>;     // 48 KB, 128 threads
using CfgD32 = kern::MmaTile<16, 32, 128, 1, 4, 4>;    // 48 KB, 128 threads: 16-row tiled
// CfgD32 with three / two ring slots (36 / 24 KB; the same bits: the ring's depth never changes
// a sum). Two slots: gemm_with_latent's tile (the absorbed query is one K step; a smaller block
// finds room beside q|kv_a's sooner and releases the attention kernel after it sooner: s32-5).
// Both as grouped-only configs (session 32, for ATLAS_GEMM_GROUPED_FEW_DOWN A/B runs): the routed
// down at one token (448 blocks of CfgD32) gets SM room only as the gate|up's 73 KB blocks leave;
// a shallower ring lets two blocks in where one of 48 KB fit. Slower in the step (s33-1: 454.6 /
// 422.2 against 458.7 tok/s).
using CfgD32S3 = kern::MmaTile<16, 32, 128, 1, 4, 3>;
using CfgD32S2 = kern::MmaTile<16, 32, 128, 1, 4, 2>;
// CfgD32 with 8-row x slots and five ring slots (50 KB, four blocks per SM as CfgD32's 48 KB):
// four weight steps in flight per block instead of three (session 35: the routed down's Nsight
// profile at one token, s35-1, had long-scoreboard waits on top, and session 33's three-slot
// ring had cost 2.7 us of it). Tiles of at most 8 rows only (half_a_or_fallback). Grouped-only,
// for ATLAS_GEMM_GROUPED_FEW_DOWN A/B runs: the same bits, slower in the step (s35-4: 464.8
// against 466.9 tok/s; the down phase is bound by the memory system as a whole).
using CfgD32H5 = kern::MmaTile<16, 32, 128, 1, 4, 5, 8>;
// Candidates for the grouped GEMMs of a batch-128 decode step (~12 rows per expert), where
// 32x64x64/4 streamed the experts at ~3.3 TB/s (69% of the H200's peak, Nsight: 23% achieved
// occupancy, SM 55% busy): wider K steps (256-byte weight row segments), a deeper ring, more
// columns per block, 16-row tiles. Only the grouped chooser and forced runs use them. Session 4
// sweep (bench/results/h200-2026-11-30-s4-run6-grouped-sweep.log), gate|up / down us:
// 32x128x64/8 209 / 107 (chosen), 32x64x64/4 219 / 114, 32x64x64/4x6 260 / 139,
// 32x64x128/4 289 / 152, 16x64x128/4 304 / 152.
using CfgG32K128 = kern::MmaTile<32, 64, 128, 2, 2, 3>;  // 72 KB, 128 threads
using CfgG32S6 = kern::MmaTile<32, 64, 64, 2, 2, 6>;     // 72 KB, 128 threads
using CfgG32N128 = kern::MmaTile<32, 128, 64, 2, 4, 4>;  // 80 KB, 256 threads
using CfgG16N64 = kern::MmaTile<16, 64, 128, 1, 4, 4>;   // 80 KB, 128 threads
// Session 7 candidates (the tiled kernel's copies now planned once per tile): a deeper ring for
// 32x128, and 16-row tiles 128 wide (groups over 16 rows take two tiles).
using CfgG32N128S5 = kern::MmaTile<32, 128, 64, 2, 4, 5>;  // 100 KB, 256 threads
using CfgG16N128 = kern::MmaTile<16, 128, 64, 1, 4, 4>;    // 72 KB, 128 threads
// (Session 8: 32 x 128 tiles with 128-wide K steps, i.e. 256-byte weight row segments, where the
// stream probe of session 7 read 4.46 TB/s against 3.99 for 128-byte ones, measured slower:
// 3 / 4 stages 291 / 289 us gate|up and 155 / 153 us down at 128 tokens, one block per SM;
// bench/results/h200-2026-11-30-s8-run2-grouped-sweep-kernels.log. Dropped.)
// Cluster split-K (decode-sized M, kernels/gemm_cluster.cuh): one block per K slice of a tile,
// the slice sums added through distributed shared memory.   BM   BN  warps_m warps_n   smem
using CfgC128 = kern::ClusterTile<128, 64, 4, 2>;  // 96 KB, 256 threads
using CfgC64 = kern::ClusterTile<64, 64, 2, 2>;    // 64 KB, 128 threads
using CfgC16 = kern::ClusterTile<16, 64, 1, 4>;    // 40 KB, 128 threads
// (Measured and dropped, session 5: 128 x 32 and 16 x 32 tiles, 128 x 128 tiles, two slices
// per block; none was faster on any V2-Lite shape.)
// wgmma (sm_90a, kernels/gemm_wgmma.cuh): 64-row warpgroups, 5-stage cp.async ring.
// 192 x 128 tiles were 1.2-1.3x faster than 128 x 128 on every V2-Lite shape at M = 4096 and the
// grouped experts at 32768 tokens (H200, session 6: the operands' L2 traffic per FLOP falls with
// the tile's area); 128 x 192 (m64n192, 224 registers) sat between them and was dropped.
//                                   warpgroups  ring    threads
using CfgWg192 = kern::WgTile<3>;  //  3         200 KB   384 (156 registers)
using CfgWg128 = kern::WgTile<2>;  //  2         160 KB   256
// The same 192 x 128 tile with TMA copies (kernels/gemm_tma.cuh, session 10; a producer warp
// and persistent blocks since session 11): dense problems (any strided batch) and grouped ones
// whose group weights lie at one stride. Elsewhere (and with ATLAS_GEMM_TMA=0) the config runs
// CfgWg192's cp.async kernel: same tile, same bits.
using CfgTma192 = kern::TmaTile<3>;
// (Session 9: a warp-specialised variant of the 192 x 128 tile, a producer warpgroup of cp.async
// copies handing ring slots to three consumer warpgroups through mbarriers, setmaxnreg 56 / 152,
// no block barrier per K step; commit 6435996. It measured ~12% slower than this one on every
// M = 4096 shape and both grouped prefill GEMMs: the barrier was not the limit. Dropped.)
// Split-K (M <= 16 / decode): 16 rows x 8*NI columns, 8 warps on different K slices.
using CfgS16 = kern::SplitKTile<2, 8>;  // 16 columns, 256 threads
using CfgS8 = kern::SplitKTile<1, 8>;   // 8 columns, 256 threads (narrow N: more blocks)
using CfgS8W2 = kern::SplitKTile<1, 2>;  // 8 columns, 64 threads: K <= 512 (two slices, two warps)
using CfgS8W4 = kern::SplitKTile<1, 4>;  // 8 columns, 128 threads (ATLAS_GEMM_WIDE_SPLITK4)
// Weight streaming (at most 8 rows per tile, kernels/gemm_stream.cuh): one 8 x 8 tile per warp
// at a time, per-warp rings of 4 KB K slices, persistent blocks with even shares.
//                                     warps stages   smem    blocks per SM
using CfgSt6 = kern::StreamTile<6, 4>;  //  6    4     198 KB  1
using CfgSt3 = kern::StreamTile<3, 4>;  //  3    4      99 KB  2 (room for a concurrent kernel)
// The same persistent streaming with wgmma.m64n8k16 as the consumer (kernels/gemm_wgstream.cuh,
// session 23): 64 weight rows x 8 x rows per tile, one warpgroup, 128-wide K steps, 4-deep ring
// (atlas_wgmma_gemv_probe's best span on the routed gate|up's 69 MB: 3.94 TB/s, s23-1).
//                                          BK  stages   smem    blocks per SM
using CfgWs128 = kern::WgStreamTile<128, 4>;  // 128    4      73 KB   3
// The same with two warpgroups per block splitting K's slices (session 28; ATLAS_GEMM_STREAM_FEW
// may name it for the shared experts' gate|up, one tile per block: two loops per tile).
using CfgWs128x2 = kern::WgStreamTile<128, 4, 0, 2>;  // 128  2 x 4  161 KB   1
// The same with register-staged copies (two steps in registers, a 3-slot ring; session 24, off
// unless ATLAS_GEMM_STREAM_REGS=1: atlas_stream_sweep_probe's plain loads outran its cp.async
// rings by ~10%, but in the decode step it is slower, 398.5 vs 425.9 tok/s with the same tokens;
// the routed and shared gate|up 33.2 / 29.9 us per call vs 28.7 / 25.4, H200 s25-1).
using CfgWs128R2 = kern::WgStreamTile<128, 3, 2>;  // 128  3 + 2 in registers  55 KB
// The lean loop of the same tile (gemm_wgstream_lean_kernel, session 30, ATLAS_GEMM_STREAM_LEAN):
// the 4-slot ring as CfgWs128's, and a 6-slot one (four steps in flight).
using CfgWs128S6 = kern::WgStreamTile<128, 6>;  // 128    6     109 KB   2
// Session 31: the lean loop with 64-wide steps, 8 slots in the 4-slot ring's 73 KB (six steps,
// 48 KB, in flight instead of two of 32 KB, three blocks per SM still; ATLAS_GEMM_STREAM_LEAN=8).
using CfgWs64S8 = kern::WgStreamTile<64, 8>;  //   64    8      73 KB   3
// Session 67: the lean loop in a 3-slot ring, copies two steps ahead (the 4-slot ring's 32 KB in
// flight, each step waiting for its wgmma group as /4l/3 does), 55 KB: three blocks per SM still,
// but with ~54 KB left beside them, where one routed-down block (16x32x128/4u at 48 KB,
// ATLAS_GEMM_DOWN_BLOCKS_PER_SM=4) fits while the routed gate|up streams
// (ATLAS_GEMM_STREAM_GROUPED=wg-gate3, an A/B setting). Two H100s: 0.4% slower alone, equal to
// the default with the down's room (s67-1, s67-4); block stamps (s67-5) found 132 down blocks
// resident early by default too (beside the gate|up's tile-less blocks' and the shared experts'
// leavings), and every working down block starting at the gate|up's end either way.
using CfgWs128S3 = kern::WgStreamTile<128, 3>;  // 128    3      55 KB   3

using KernelFn = void (*)(kern::MmaGemmParams);

struct TileConfig {
  const char* name;
  int bm, bn, threads, smem;
  bool splitk;
  KernelFn fn[2][2][2];  // [out f32][async][at most 8 rows per tile]; null where not instantiated
  bool sliced = false;   // dense problems: one K slice per block + an ordered reduce (MmaGemmParams)
  bool wgmma = false;    // needs the sm_90a build (kernels/gemm_wgmma.cuh); async operands only
  bool grouped_only = false;  // never picked by choose_config (the grouped rule or a forced run may)
  bool cluster = false;  // one block per K slice in clusters (needs sm_90 code and K <= 16 slices)
  bool tma = false;      // gemm_tma_kernel<CfgTma192> where it can run, else fn (the cp.async wgmma kernel)
  bool stream = false;   // persistent weight streaming: a grid of blocks per SM, not per tile
  // [out f32]: where set, the instance for K % tail_k != 0 (fn's assume K % tail_k == 0).
  KernelFn tail[2] = {nullptr, nullptr};
  int tail_k = 0;
  // > 0: two warpgroups per block splitting K's slices (kernels/gemm_wgstream.cuh, WGS 2), for
  // 1 < slices <= wg_split_max_slices only; config_or_fallback runs kStreamWg elsewhere.
  int wg_split_max_slices = 0;
  // > 1: the lean stream loop with each tile split into k_parts runs of whole K slices
  // (gemm_wgstream_lean_kernel's kParts; p.split_ws / split_cnt: stream_split_scratch), for
  // slices >= k_parts and K % tail_k == 0 only; config_or_fallback runs kStreamWgLean elsewhere.
  int k_parts = 0;
  // The lean stream loop's stream-K form (gemm_wgstream_lean_kernel's kParts 0; dense problems,
  // K % tail_k == 0; p.split_ws / split_cnt: stream_split_scratch): every resident slot takes an
  // equal run of the (tile, K slice) units. Elsewhere (grouped, no workspace) the unsplit lean
  // loop (same bits).
  bool streamk = false;
  // [out f32][at most 8 rows per tile]: the stamped instantiation (kStamp, ATLAS_BLOCK_STAMPS,
  // kernels/block_stamp.cuh) of fn[f32][1][rows8], where there is one: the MoE phase's default
  // configs only (the lean stream loop, 16x32x128/4u, the staged split-K).
  KernelFn stamped[2][2] = {{nullptr, nullptr}, {nullptr, nullptr}};
  // [at most 8 rows per tile]: fn[0][1][rows8]'s instantiation that routes one token itself
  // (kRoute, MmaGemmParams::route_logits; kernels/gemm_wgstream.cuh), where there is one: the
  // unsplit lean stream loops (bf16 out, the MoE gate|up).
  KernelFn routed[2] = {nullptr, nullptr};
};

constexpr TileConfig grouped_only(TileConfig c) {
  c.grouped_only = true;
  return c;
}

// A config whose kernel has async operands only (bf16 and f32 out; the predicated path runs
// another config): the wgmma and cluster configs.
template <class T>
constexpr TileConfig async_only_config(const char* name, KernelFn bf16_out, KernelFn f32_out) {
  TileConfig c{name, T::BM, T::BN, T::THREADS, T::SMEM_BYTES, false, {}};
  for (int h = 0; h < 2; ++h) {
    c.fn[0][1][h] = bf16_out;
    c.fn[1][1][h] = f32_out;
  }
  return c;
}

template <class T>
constexpr TileConfig make_stream_config(const char* name) {
  TileConfig c = async_only_config<T>(name, kern::gemm_stream_kernel<T, false>, kern::gemm_stream_kernel<T, true>);
  c.stream = true;
  return c;
}

// The wgmma streaming kernel: fn for K % BK == 0 (every V2-Lite shape), tail for the rest.
template <class T>
constexpr TileConfig make_wgstream_config(const char* name) {
  TileConfig c = async_only_config<T>(name, kern::gemm_wgstream_kernel<T, false, false>,
                                      kern::gemm_wgstream_kernel<T, true, false>);
  c.stream = true;
  c.wg_split_max_slices = T::WGS > 1 ? T::WGS * T::kMaxParts : 0;
  c.tail[0] = kern::gemm_wgstream_kernel<T, false, true>;
  c.tail[1] = kern::gemm_wgstream_kernel<T, true, true>;
  c.tail_k = T::BK;
  return c;
}

// The lean wgmma streaming loop: fn for K % BK == 0, the full loop's tail instance for the rest
// (the same bits). kLead: the copies' steps ahead (0: STAGES - 2; gemm_wgstream_lean_kernel).
template <class T, int kLead = 0>
constexpr TileConfig make_wglean_config(const char* name) {
  TileConfig c = make_wgstream_config<T>(name);
  for (int h = 0; h < 2; ++h) {
    c.fn[0][1][h] = kern::gemm_wgstream_lean_kernel<T, false, 1, false, kLead>;
    c.fn[1][1][h] = kern::gemm_wgstream_lean_kernel<T, true, 1, false, kLead>;
    c.stamped[0][h] = kern::gemm_wgstream_lean_kernel<T, false, 1, true, kLead>;
    c.stamped[1][h] = kern::gemm_wgstream_lean_kernel<T, true, 1, true, kLead>;
    c.routed[h] = kern::gemm_wgstream_lean_kernel<T, false, 1, false, kLead, true>;
  }
  return c;
}

// The same with each tile's K split into P work items (session 31), or with P = 0 in stream-K
// shares (session 52).
template <class T, int P>
constexpr TileConfig make_wglean_split_config(const char* name) {
  TileConfig c = make_wglean_config<T>(name);
  for (int h = 0; h < 2; ++h) {
    c.fn[0][1][h] = kern::gemm_wgstream_lean_kernel<T, false, P>;
    c.fn[1][1][h] = kern::gemm_wgstream_lean_kernel<T, true, P>;
    c.stamped[0][h] = c.stamped[1][h] = nullptr;  // (no stamped split loop)
    c.routed[h] = nullptr;
  }
  c.k_parts = P;
  c.streamk = P == 0;
  return c;
}

template <class T>
constexpr TileConfig make_wgmma_config(const char* name) {
  TileConfig c = async_only_config<T>(name, kern::gemm_wgmma_kernel<T, false>, kern::gemm_wgmma_kernel<T, true>);
  c.wgmma = true;
  return c;
}

constexpr TileConfig make_tma_config(const char* name) {
  TileConfig c = make_wgmma_config<CfgWg192>(name);
  c.tma = true;
  return c;
}

// The same tiled kernel in a sliced launch (dense, batch 1, async operands; elsewhere the plain
// launch of the same config runs: same bits either way).
constexpr TileConfig sliced(TileConfig c, const char* name) {
  c.name = name;
  c.sliced = true;
  return c;
}

// kLean: the async instances copy through kern::LeanTileCopies (1, session 33), and also run
// kern::mma_whole_steps where it applies (2, session 34); the same bits.
template <class T, bool kSync, int kLean = 0>
constexpr TileConfig make_config(const char* name) {
  TileConfig c{name, T::BM, T::BN, T::THREADS, T::SMEM_BYTES, false, {}};
  for (int h = 0; h < 2; ++h) {  // the tiled kernel has no 8-row variant
    c.fn[0][1][h] = kern::gemm_mma_kernel<T, false, true, kLean>;
    c.fn[1][1][h] = kern::gemm_mma_kernel<T, true, true, kLean>;
    if constexpr (kLean == 2) {  // 16x32x128/4u, the routed down's default
      c.stamped[0][h] = kern::gemm_mma_kernel<T, false, true, kLean, true>;
      c.stamped[1][h] = kern::gemm_mma_kernel<T, true, true, kLean, true>;
    }
    if constexpr (kSync) {
      c.fn[0][0][h] = kern::gemm_mma_kernel<T, false, false>;
      c.fn[1][0][h] = kern::gemm_mma_kernel<T, true, false>;
    }
  }
  return c;
}

// kPush: the slice sums pushed by st.async (kernels/gemm_cluster.cuh), two mbarriers after the ring.
template <class T, bool kPush = false>
constexpr TileConfig make_cluster_config(const char* name) {
  TileConfig c = async_only_config<T>(name, kern::gemm_cluster_kernel<T, false, kPush>,
                                      kern::gemm_cluster_kernel<T, true, kPush>);
  c.cluster = true;
  if (kPush) c.smem += 16;
  return c;
}

// Split-K configs always have their predicated (element-load) variant: it is the same loop.
// kStaged (kernels/gemm_mma.cuh): 16-byte copies only, so only the async entries are its own;
// the predicated path runs kSyncSmall (the plain split-K kernel: the same bits). The staged
// config is the dense split-K problems' default since session 21 (dense_splitk_config).
template <class T, bool kStaged = false>
constexpr TileConfig make_splitk_config(const char* name) {
  TileConfig c{name, T::BM, T::BN, T::THREADS, T::SMEM_BYTES, true, {}};
  c.fn[0][1][0] = kern::gemm_splitk_kernel<T, false, true, false, kStaged>;
  c.fn[1][1][0] = kern::gemm_splitk_kernel<T, true, true, false, kStaged>;
  c.fn[0][1][1] = kern::gemm_splitk_kernel<T, false, true, true, kStaged>;
  c.fn[1][1][1] = kern::gemm_splitk_kernel<T, true, true, true, kStaged>;
  if constexpr (kStaged) {  // the dense one-row default (the shared down)
    c.stamped[0][0] = kern::gemm_splitk_kernel<T, false, true, false, true, true>;
    c.stamped[1][0] = kern::gemm_splitk_kernel<T, true, true, false, true, true>;
    c.stamped[0][1] = kern::gemm_splitk_kernel<T, false, true, true, true, true>;
    c.stamped[1][1] = kern::gemm_splitk_kernel<T, true, true, true, true, true>;
  }
  if constexpr (!kStaged) {
    c.fn[0][0][0] = kern::gemm_splitk_kernel<T, false, false, false>;
    c.fn[1][0][0] = kern::gemm_splitk_kernel<T, true, false, false>;
    c.fn[0][0][1] = kern::gemm_splitk_kernel<T, false, false, true>;
    c.fn[1][0][1] = kern::gemm_splitk_kernel<T, true, false, true>;
  }
  return c;
}

// Order = the chooser's preference for M > 16. 128x64 before 128x128: the K-slice contract's
// running total doubles the accumulator registers (128x128: ~163 per thread, one block per SM;
// 128x64: two blocks per SM, the per-SM tile area the old 128x128 had). Retune from the bench.
// constexpr: constant-initialised, so other translation units may ask for names during their
// own static initialisation (the benchmark registers its cases by config name).
constexpr std::array<TileConfig, 47> kConfigs = {
    make_tma_config("tma192x128x64/5"),           make_wgmma_config<CfgWg192>("wg192x128x64/4"),
    make_wgmma_config<CfgWg128>("wg128x128x64/4"),          make_config<CfgL128N64, false>("128x64x32/4"), make_config<CfgL128, false>("128x128x32/4"),
    make_config<CfgM64, true>("64x64x64/4"),      make_config<CfgM64N32, false>("64x32x64/4"),
    make_config<CfgM32, false>("32x64x64/4"),     make_config<CfgD32, false>("16x32x128/4"),
    make_splitk_config<CfgS16>("splitk16x16/8w"), make_splitk_config<CfgS8>("splitk16x8/8w"),
    sliced(make_config<CfgM64N32, false>(""), "64x32x64/4+slices"),
    sliced(make_config<CfgM32, false>(""), "32x64x64/4+slices"),
    sliced(make_config<CfgD32, false>(""), "16x32x128/4+slices"),
    grouped_only(make_config<CfgG32K128, false>("32x64x128/4")),
    grouped_only(make_config<CfgG32S6, false>("32x64x64/4x6")),
    grouped_only(make_config<CfgG32N128, false>("32x128x64/8")),
    grouped_only(make_config<CfgG16N64, false>("16x64x128/4")),
    make_cluster_config<CfgC128>("c128x64/8w"), make_cluster_config<CfgC64>("c64x64/4w"),
    make_cluster_config<CfgC16>("c16x64/4w"),
    sliced(make_wgmma_config<CfgWg128>(""), "wg128x128x64/4+slices"),
    grouped_only(make_config<CfgG32N128S5, false>("32x128x64/8x5")),
    grouped_only(make_config<CfgG16N128, false>("16x128x64/4")),
    make_stream_config<CfgSt6>("stream8x8/6w"), make_stream_config<CfgSt3>("stream8x8/3w"),
    make_splitk_config<CfgS8, true>("splitk16x8/8w+staged"), make_splitk_config<CfgS8W2, true>("splitk16x8/2w+staged"),
    make_wgstream_config<CfgWs128>("streamwg64x8/4"), make_wgstream_config<CfgWs128R2>("streamwg64x8/3r2"),
    make_wgstream_config<CfgWs128x2>("streamwg64x8/4x2"), make_wglean_config<CfgWs128>("streamwg64x8/4l"),
    make_wglean_config<CfgWs128S6>("streamwg64x8/6l"), make_wglean_split_config<CfgWs128, 2>("streamwg64x8/4l2"),
    make_wglean_config<CfgWs64S8>("streamwg64x8/8l64"), grouped_only(make_config<CfgD32S3, false>("16x32x128/3")),
    grouped_only(make_config<CfgD32S2, false>("16x32x128/2")),
    grouped_only(make_config<CfgD32, false, 1>("16x32x128/4l")),
    grouped_only(make_config<CfgD32, false, 2>("16x32x128/4u")),
    // The lean loop in three K parts (session 35, for ATLAS_GEMM_STREAM_FEW A/B runs on the shared
    // experts' gate|up: 264 blocks at one row; slower in the step, s35-2: 453.7 against 468.8 tok/s).
    make_wglean_split_config<CfgWs128, 3>("streamwg64x8/4l3"), grouped_only(make_config<CfgD32H5, false, 3>("16x32x128/5h")),
    // q|kv_a's cluster config with the slice sums pushed instead of read after a cluster barrier
    // (session 36, ATLAS_GEMM_CLUSTER_PUSH; the same bits, slower: 468.1 against 475.9 tok/s, s37-1).
    make_cluster_config<CfgC16, true>("c16x64/4w+push"),
    // The lean loop with three 16 KB steps in flight in its 4-slot ring (session 38,
    // ATLAS_GEMM_STREAM_LEAN=4/3; written after the session's device time was spent: not yet run).
    make_wglean_config<CfgWs128, 3>("streamwg64x8/4l/3"),
    // The staged split-K kernel on four warps (session 41, ATLAS_GEMM_WIDE_SPLITK4): 128-thread
    // blocks, so that q|kv_a's 456 blocks at one row fit the SMs in one wave (the 8-warp blocks'
    // registers allow two per SM) and all stage their first four slices early.
    make_splitk_config<CfgS8W4, true>("splitk16x8/4w+staged"),
    // The lean loop in stream-K shares (session 52, ATLAS_GEMM_STREAMK): 128-wide steps (the LM
    // head, layer 0's gate|up at one row) and 64-wide ones (layer 0's down: K = 10,944 is no
    // multiple of 128).
    make_wglean_split_config<CfgWs128, 0>("streamwg64x8/4lk"), make_wglean_split_config<CfgWs64S8, 0>("streamwg64x8/8l64k"),
    make_wglean_config<CfgWs128S3, 2>("streamwg64x8/3l/2")};

constexpr int config_index(std::string_view name) {
  for (size_t i = 0; i < kConfigs.size(); ++i)
    if (std::string_view(kConfigs[i].name) == name) return int(i);
  return -1;
}
// The predicated (unaligned) path of the tiled kernel is instantiated for one config only (it
// serves tiny models and odd slices, where speed does not matter): kSyncLarge for tiles of more
// than 16 rows; 16-row tiles fall back to kSyncSmall (split-K, which always has it). Forcing
// another config with unaligned operands runs one of these (same bits).
constexpr int kSyncLarge = config_index("64x64x64/4"), kSyncSmall = config_index("splitk16x8/8w");
constexpr int kSplitK8 = config_index("splitk16x8/8w");
constexpr int kSplitK8Staged = config_index("splitk16x8/8w+staged");
constexpr int kSplitK8W2Staged = config_index("splitk16x8/2w+staged");
constexpr int kSplitK8W4Staged = config_index("splitk16x8/4w+staged");
static_assert(kSplitK8W4Staged >= 0);
// Grouped GEMMs with small groups (grouped_config): many rows in total / a handful.
// Many: 32x128x64/8 since session 4 (H200: 209 / 107 us vs 32x64x64/4's 219 / 114 for the
// batch-128 step's gate|up / down; seed grid 8.98 vs 9.22 s, same tokens).
constexpr int kGroupedMany = config_index("32x128x64/8"), kGroupedFew = config_index("16x32x128/4");
constexpr int kGroupedFewDown = config_index("16x32x128/4u"), kFewDownHalfA = config_index("16x32x128/5h");
constexpr int kSliced64 = config_index("64x32x64/4+slices"), kSliced32 = config_index("32x64x64/4+slices");
// Where the wgmma config is forced but this build or GPU lacks it (same bits).
constexpr int kWgmmaFallback = config_index("128x128x32/4");
constexpr int kClusterFallback = config_index("64x64x64/4");  // a cluster config cannot run (same bits)
constexpr int kCluster128 = config_index("c128x64/8w"), kCluster64 = config_index("c64x64/4w"),
              kCluster16 = config_index("c16x64/4w"), kCluster16Push = config_index("c16x64/4w+push");
constexpr int kSlicedWg128 = config_index("wg128x128x64/4+slices");
constexpr int kStream6 = config_index("stream8x8/6w"), kStream3 = config_index("stream8x8/3w");
constexpr int kStreamWg = config_index("streamwg64x8/4"), kStreamWgRegs = config_index("streamwg64x8/3r2");
constexpr int kStreamWgLean = config_index("streamwg64x8/4l"), kStreamWgLean6 = config_index("streamwg64x8/6l");
constexpr int kStreamWgLean2 = config_index("streamwg64x8/4l2"), kStreamWgLean8 = config_index("streamwg64x8/8l64");
constexpr int kStreamWgLeanLead3 = config_index("streamwg64x8/4l/3");
constexpr int kStreamWgLean3 = config_index("streamwg64x8/4l3");
constexpr int kStreamWgLeanS3 = config_index("streamwg64x8/3l/2");
static_assert(kStreamWgLeanS3 >= 0, "the 3-slot lean config");
constexpr int kStreamWgLeanK = config_index("streamwg64x8/4lk"), kStreamWgLean64K = config_index("streamwg64x8/8l64k");
static_assert(kStreamWgLeanK >= 0 && kStreamWgLean64K >= 0, "the stream-K configs");
static_assert(kStreamWgLean3 >= 0, "the three-part lean config");
static_assert(kStream6 >= 0 && kStream3 >= 0 && kStreamWg >= 0 && kStreamWgRegs >= 0 && kStreamWgLean >= 0 &&
                  kStreamWgLean6 >= 0 && kStreamWgLean2 >= 0 && kStreamWgLean8 >= 0 && kStreamWgLeanLead3 >= 0,
              "stream config names");
constexpr int kTiled32 = config_index("32x64x64/4"), kTiled16 = config_index("16x32x128/4");
static_assert(kTiled32 >= 0 && kTiled16 >= 0, "tiled config names");
static_assert(kSlicedWg128 >= 0, "sliced wgmma config name");
static_assert(kClusterFallback >= 0 && kCluster128 >= 0 && kCluster64 >= 0 && kCluster16 >= 0 && kCluster16Push >= 0,
              "cluster config names");
static_assert(kSyncLarge >= 0 && kSyncSmall >= 0 && kSplitK8 >= 0 && kSplitK8Staged >= 0 && kSplitK8W2Staged >= 0 && kGroupedMany >= 0 && kGroupedFew >= 0 && kGroupedFewDown >= 0 && kFewDownHalfA >= 0 &&
                  kSliced64 >= 0 && kSliced32 >= 0 && kWgmmaFallback >= 0,
              "config names");

std::atomic<int> forced_config{-1};

// The instances of the grouped launches' order promises (launch_mma's GroupedOrder, session 44;
// their shared-memory limits raised in setup()): the lean stream loop waiting first, the few-row
// down (16x32x128/4u) staging its first weight steps before its wait (bf16, f32 out).
const KernelFn kLeanWaitFirst = kern::gemm_wgstream_lean_kernel<CfgWs128, false, 1, false, 0, false, true>;
const KernelFn kLeanS3WaitFirst = kern::gemm_wgstream_lean_kernel<CfgWs128S3, false, 1, false, 2, false, true>;
const KernelFn kEarlyDown[2] = {kern::gemm_mma_kernel<CfgD32, false, true, 2, false, true>,
                                kern::gemm_mma_kernel<CfgD32, true, true, 2, false, true>};

// The weight copies' L2 policy (kern::L2Hint): -1 not decided yet (ATLAS_L2_EVICT_FIRST at the
// first GEMM), 0 plain, 1 evict_first. Session 17 (H200, batch-1 decode, CUPTI per step): 2896
// vs 3187 us with plain copies; the expert GEMMs gain most (per call: routed gate|up 30.8 -> 25.6
// us, shared gate|up 16.8 -> 12.8, routed down 20.0 -> 18.8; the small kernels barely move). A
// decode step streams ~5 GB of weights through the 50 MB L2, each byte once; lines marked
// evict_first are the first replaced. Why the streaming kernels themselves gain this much (the
// L2's sets, DRAM traffic) was not measured. The TMA configs' copies stay plain.
std::atomic<int> g_weight_evict_first{-1};
bool weight_evict_first() {
  int v = g_weight_evict_first.load(std::memory_order_relaxed);
  if (v < 0) {
    v = env_switch("ATLAS_L2_EVICT_FIRST", true) ? 1 : 0;
    g_weight_evict_first.store(v, std::memory_order_relaxed);
  }
  return v == 1;
}
std::atomic<int> tma_blocks_cap{0};  // gemm_set_tma_blocks (tests)
std::atomic<int64_t> tailed_launches{0};  // gemm_tailed_launches (tests)
std::atomic<int64_t> latent_launches{0};  // gemm_latent_launches (tests)
std::atomic<int64_t> merge_launches{0};   // mla_merge_value_launches (tests)
std::atomic<int> tails_override{-1};      // gemm_set_tails (tests)
std::atomic<int> route_tail_override{-1};  // gemm_set_route_tail (tests)
std::atomic<int64_t> route_tail_launches{0};  // gemm_route_tail_launches (tests)
std::atomic<int64_t> route_cluster_launches{0};  // gemm_route_cluster_launches (tests)
std::atomic<int> combine_norm_override{-1};      // gemm_set_combine_norm (tests)
std::atomic<int64_t> combine_norm_launches{0};   // gemm_combine_norm_launches (tests)
std::atomic<int64_t> combine_flagged_launches{0};  // ... of them with a ready flag
std::atomic<int64_t> combine_early_launches{0};    // ... with the weights staged early without one
std::atomic<int> combine_direct_override{-1};      // gemm_set_combine_direct (tests)
std::atomic<int64_t> combine_direct_launches{0};   // ... with the routed rows loaded directly
std::atomic<int64_t> self_routed_launches{0};  // grouped_self_routed_launches (tests)
std::atomic<int> streamk_grid{0};                // gemm_set_streamk_grid (tests; 0: every resident slot)
std::atomic<int> streamk_override{-1};           // gemm_set_streamk (tests; -1: ATLAS_GEMM_STREAMK's)
std::atomic<int64_t> streamk_launches{0};        // gemm_streamk_launches (tests)
std::atomic<int> router_norm_override{-1};       // gemm_set_router_norm (tests)
std::atomic<int64_t> router_norm_launches{0};    // gemm_router_norm_launches (tests)

struct GemmSetup {
  int sm_count = 132;
  int* error_flag = nullptr;
  bool wgmma = false;  // the loaded device code has the wgmma kernel (an sm_90a build on a 9.0 GPU)
  // The TMA kernel may run: wgmma, the driver's tensor-map encoder found, ATLAS_GEMM_TMA not "0".
  PFN_cuTensorMapEncodeTiled_v12000 encode_map = nullptr;
  bool tma_persistent = true;  // ATLAS_GEMM_TMA_PERSISTENT not "0" (launch_tma)
  // cluster_sizes[i]: the largest C such that config i's clusters of 1..C blocks all fit the
  // device (cudaOccupancyMaxActiveClusters > 0, both output types); 0: not a cluster config, or
  // no cluster launch here (device without it, or device code built for an older arch).
  std::array<int, kConfigs.size()> cluster_sizes{};
  // stream_blocks[i]: blocks per SM of stream config i (its persistent grid); 0 otherwise, or
  // where this build's device code lacks the kernel (not sm_90a).
  std::array<int, kConfigs.size()> stream_blocks{};
  // The stream config dense_config picks for one-row problems; -1: none (ATLAS_GEMM_STREAM,
  // detail::gemm_stream_setting).
  int stream_choice = -1;
  // The stream configs grouped problems of <= 8 rows take, with the fused gate|up and without it
  // (ATLAS_GEMM_STREAM_GROUPED: "1" the dense one's for both, "wg" the wgmma one for both,
  // "wg-gate" the wgmma one for the gate|up only; -1: none, the tiled configs).
  int stream_grouped_gate = -1, stream_grouped_down = -1;
  // ATLAS_GEMM_DOWN_BLOCKS_PER_SM (session 41; unset: 3 since session 53): the dynamic shared
  // memory the routed experts' few-row down launches with (grouped_few_down_config, gated == 0),
  // sized so that at most that many of its blocks fit an SM; 0: the config's own (48 KB: four per
  // SM, as the setting 4). Session 38's block stamps found the down's blocks 10.2 us long on SMs
  // that held four of them against 8.1 on SMs with three. Three per SM, batch-1 decode (the
  // balanced stream grids on, s53): 493.7 / 493.3 / 494.0 / 493.6 against 490.9 / 491.8 / 492.7
  // tok/s on an H200 (s53-4), 420.0 / 420.0 / 419.8 against 419.4 / 419.6 / 419.6 on an H100
  // (s53-7). The same kernel and tiles: never bits.
  int down_smem = 0;
  // ATLAS_GEMM_TIGHT_TILES (session 41; default 0): a grouped launch's grid bound on its row tiles
  // per column is floor(max_rows / BM) + the busy groups instead of ceil(...) + them
  // (detail::grouped_y_tiles): one token's routed gate|up 264 blocks instead of 308, its down 384
  // instead of 448, none of the dropped ones with a tile. Never bits.
  bool tight_tiles = false;
  // ATLAS_GEMM_STAGE_EARLY (default 1; 0 for A/B runs): the staged split-K kernel's first weight
  // slices into shared memory before its launch-overlap wait (MmaGemmParams::prefetch = 2).
  bool stage_early = true;
  // ATLAS_GEMM_CLUSTER_EARLY (default 1; 0 for A/B runs): the cluster kernel (a dense problem)
  // copies its whole weight slice into shared memory before its launch-overlap wait too
  // (MmaGemmParams::cluster_early; only where stage_early is on, and for one-tile problems of at
  // most 16 rows).
  bool cluster_early = true;
  // ATLAS_GEMM_CLUSTER16 (default 1; 0 for A/B runs, session 35): one-row dense problems of N >=
  // 2816 and <= 8 K slices (q|kv_a at batch 1) on the cluster config c16x64/4w; 0: they stay on
  // the split-K config (the staged kernel by default). The same bits; slower in the step (s35-3:
  // 465.7 against 467.9 tok/s: its 256-thread blocks keep the next launch from becoming resident).
  bool cluster16 = true;
  // ATLAS_GEMM_CLUSTER_PUSH=1: those problems on c16x64/4w+push (the slice sums pushed by
  // st.async, no cluster barrier after the main loop; session 36; slower in s37-1, so off).
  bool cluster_push = false;
  // ATLAS_GEMM_STREAM_BALANCE (default by device since session 53, gemm_stream_balance_default:
  // 1 on an H200, 0 elsewhere): with 1, a stream config's persistent grid of more tiles than
  // resident blocks takes ceil(T / ceil(T / slots)) blocks, so that every block walks the same
  // number of tiles (launch_mma); with 0 it takes every resident slot, min(T, slots). The batch-1
  // LM head (1,600 tiles) is the one decode launch it changes. On an H100 396 blocks stream more
  // bytes at once than 320 and its blocks are bound by their bytes in flight (sessions 38-39):
  // 144.4 against 158.1 us, 413.5 / 413.6 against 411.3 tok/s (s51-6), 419.6 / 419.6 against
  // 417.1 / 417.5 (s53-7). On an H200, whose memory the 320 blocks already nearly fill, the 16
  // blocks left with a fifth tile cost more than the extra bytes in flight gain: 98.0 against
  // 103.0 us (s53-5's CUPTI timelines), 491.8 / 490.7 / 490.7 against 489.7 / 489.7 / 490.3 /
  // 489.6 tok/s (s53-2).
  bool stream_balance = false;
  // ATLAS_GEMM_STREAMK (session 52; default 0: measured slower, 482.1-487.2 against 489.8 tok/s
  // on an H200, s53-1): which one-row dense problems run the lean loop in stream-K shares
  // (gemm_streamk_setting: bit 1 the wide ones, bit 2 the long-K ones; dense_config).
  int streamk = 0;
  // ATLAS_GEMM_STREAMK_GRID (session 54; default 0: every resident slot): the stream-K launches'
  // grid bound, for A/B runs of the shared experts' gate|up on stream-K shares
  // (ATLAS_GEMM_STREAM_FEW=streamwg64x8/4lk), which shares its SMs with the routed experts.
  int streamk_grid = 0;
  // ATLAS_GEMM_TAILS (default 0 until its first GPU run; session 23): gemm_add_rmsnorm may launch
  // its tailed kernel.
  bool tails = false;
  // ATLAS_ROUTE_TAIL (default 0: slower, s33-4; session 33): gemm_moe_route may launch its
  // routed kernel.
  bool route_tail = false;
  // ATLAS_ROUTE_CLUSTER (session 41; default 0): gemm_moe_route runs the router GEMM of one row on
  // the cluster config with the routing in its adding block (gemm_cluster_route_kernel) instead;
  // it takes precedence over ATLAS_ROUTE_TAIL.
  bool route_cluster = false;
  // ATLAS_GEMM_WIDE_SPLITK4 (session 41; default 0): one-row dense problems of N >= 2816 and <= 8
  // K slices (q|kv_a at batch 1) on splitk16x8/4w+staged instead of the cluster config.
  bool wide_splitk4 = false;
  // ATLAS_COMBINE_QKV (session 42; default 3, "event", since session 45): 1 gemm_combine_norm
  // may launch the q|kv_a GEMM with the MoE combine + norm inside (gemm_cluster_combine_kernel; slower, s42-1/-4), 2 ("flag")
  // and the model may leave the side stream unjoined before it, a flag polled instead (faster,
  // 488.3 against 483.0 / 483.3 tok/s in s42-7, but UNSAFE: the launch's blocks spin on work of
  // another stream that nothing guarantees an SM; a run under it hung, s42-8; docs/cuda-sessions.md),
  // 3 ("event") the shared experts' down's event in place of the flag, a plain dependency
  // (ATLAS_CAPTURE_EDGES=plain, the default: 490.8 against 484.3 tok/s in s45-2; with the
  // cross-stream edge programmatic, 469.3 / 469.0: the fused launch then waited for the routed
  // down's end as well).
  int combine_qkv = 3;
  // ATLAS_COMBINE_DIRECT (session 46; default 0 until measured): gemm_combine_norm's launch loads
  // the token's routed rows as rows 0..k-1 beside their slots (CombineNormPrologue::kDirect).
  bool combine_direct = false;
  // ATLAS_ROUTER_NORM (session 43; default 0: slower, s45-1 / s45-2 / s45-4): 1 or 2 ("joined"):
  // gemm_after_add_rmsnorm may launch the router GEMM of one row with the post-attention add +
  // norm inside (gemm_splitk_norm_kernel); the model forks the shared experts from that launch
  // programmatically (1) or after its end (2).
  int router_norm = 0;
  // ATLAS_PHASE_CLOCKS=cluster_gemm (session 41, a diagnostic): the phase-clock sums of the
  // cluster config c16x64/4w's bf16 launches (q|kv_a at one row), else null.
  unsigned long long* cluster_clocks = nullptr;
};

// Block stamps (ATLAS_BLOCK_STAMPS=FILE or gemm_block_stamps_start; kernels/block_stamp.cuh):
// the device ring the stamped launches write to (null pointers while off), mirrored into the
// module's device global kern::g_block_stamp_log, which the stamped kernels read when they run
// (so a graph captured with stamps on records into whatever ring is set when it is replayed).
std::mutex stamp_mu;
kern::BlockStampLog stamp_log{};
std::atomic<bool> stamps_on{false};
std::string stamp_path;  // ATLAS_BLOCK_STAMPS's file, written at exit
constexpr size_t kBlockStampsEnvCapacity = size_t(1) << 18;  // ~10 batch-1 decode steps' MoE blocks
static_assert(sizeof(kern::BlockStamp) == sizeof(BlockStampRecord) &&
                  offsetof(kern::BlockStamp, site) == offsetof(BlockStampRecord, site) &&
                  offsetof(kern::BlockStamp, smid) == offsetof(BlockStampRecord, smid) &&
                  offsetof(kern::BlockStamp, bytes) == offsetof(BlockStampRecord, bytes),
              "the host record is the device stamp's layout");

// The stamps written so far, oldest first (at most the ring's capacity), and the count reset.
std::vector<BlockStampRecord> take_stamps_locked() {
  std::vector<BlockStampRecord> out;
  if (stamp_log.entries == nullptr) return out;
  check_cuda(cudaDeviceSynchronize(), "gemm_block_stamps", "cudaDeviceSynchronize");
  unsigned long long n = 0;
  check_cuda(cudaMemcpy(&n, stamp_log.count, sizeof n, cudaMemcpyDeviceToHost), "gemm_block_stamps", "cudaMemcpy (count)");
  const unsigned long long cap = stamp_log.cap, kept = std::min(n, cap);
  std::vector<BlockStampRecord> ring(static_cast<size_t>(cap));
  check_cuda(cudaMemcpy(ring.data(), stamp_log.entries, size_t(cap) * sizeof(BlockStampRecord), cudaMemcpyDeviceToHost),
             "gemm_block_stamps", "cudaMemcpy (entries)");
  out.reserve(size_t(kept));
  for (unsigned long long i = n - kept; i < n; ++i) out.push_back(ring[size_t(i % cap)]);
  check_cuda(cudaMemset(stamp_log.count, 0, sizeof n), "gemm_block_stamps", "cudaMemset (count)");
  return out;
}

// At exit (registered after the CUDA runtime's first use, so it runs before the runtime's own
// teardown): ATLAS_BLOCK_STAMPS's CSV, one line a block, through a temporary file and a rename
// (by hand: atlas_cuda builds without atlas_lib, whose core/file.h AtomicFile is not linked there).
void write_stamp_file() {
  std::lock_guard<std::mutex> lock(stamp_mu);
  if (stamp_path.empty()) return;  // stopped since
  try {
    const std::vector<BlockStampRecord> rows = take_stamps_locked();
    const std::string tmp = stamp_path + ".tmp";
    std::FILE* f = std::fopen(tmp.c_str(), "w");
    if (f == nullptr) throw Error("cuda: ATLAS_BLOCK_STAMPS: cannot write '" + tmp + "'");
    std::fprintf(f, "t0_ns,go_ns,t1_ns,site,n,k,grid,block,smid,kind,bytes\n");
    for (const BlockStampRecord& r : rows)
      std::fprintf(f, "%llu,%llu,%llu,%llx,%d,%d,%d,%d,%d,%d,%lld\n", (unsigned long long)r.t0, (unsigned long long)r.go,
                   (unsigned long long)r.t1, (unsigned long long)r.site, r.n, r.k, r.grid, r.block, r.smid, r.kind,
                   (long long)r.bytes);
    const bool ok = std::fflush(f) == 0 && std::ferror(f) == 0;
    if (std::fclose(f) != 0 || !ok || std::rename(tmp.c_str(), stamp_path.c_str()) != 0) {
      std::remove(tmp.c_str());
      throw Error("cuda: ATLAS_BLOCK_STAMPS: cannot write '" + stamp_path + "'");
    }
    std::fprintf(stderr, "block stamps: %zu blocks into %s\n", rows.size(), stamp_path.c_str());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "atlas: error: %s\n", e.what());
  }
}

// Off: the device global cleared (a graph captured with stamps on then records nothing), the
// ring freed once nothing in flight can write to it.
void release_stamps_locked() {
  stamps_on.store(false);
  if (stamp_log.entries == nullptr) return;
  check_cuda(cudaDeviceSynchronize(), "gemm_block_stamps", "cudaDeviceSynchronize");
  const kern::BlockStampLog old = stamp_log;
  stamp_log = {};
  check_cuda(cudaMemcpyToSymbol(kern::g_block_stamp_log, &stamp_log, sizeof stamp_log), "gemm_block_stamps",
             "cudaMemcpyToSymbol");
  check_cuda(cudaFree(old.entries), "gemm_block_stamps", "cudaFree");
  check_cuda(cudaFree(old.count), "gemm_block_stamps", "cudaFree");
}

void start_stamps_locked(size_t capacity) {
  release_stamps_locked();
  check_cuda(cudaMalloc(&stamp_log.entries, capacity * sizeof(kern::BlockStamp)), "gemm_block_stamps", "cudaMalloc (ring)");
  check_cuda(cudaMalloc(&stamp_log.count, sizeof(unsigned long long)), "gemm_block_stamps", "cudaMalloc (count)");
  check_cuda(cudaMemset(stamp_log.count, 0, sizeof(unsigned long long)), "gemm_block_stamps", "cudaMemset (count)");
  stamp_log.cap = unsigned(capacity);
  check_cuda(cudaMemcpyToSymbol(kern::g_block_stamp_log, &stamp_log, sizeof stamp_log), "gemm_block_stamps",
             "cudaMemcpyToSymbol");
  stamps_on.store(true);
}

// The largest C <= kClusterMax such that clusters of 1..C blocks of cluster config c fit the
// device (cluster_fits for both output types); 0 if none does.
int max_cluster_blocks(const TileConfig& c) {
  int fits = kern::kClusterMax;
  for (KernelFn f : {c.fn[0][1][0], c.fn[1][1][0]}) {
    check_cuda(cudaFuncSetAttribute(reinterpret_cast<const void*>(f), cudaFuncAttributeNonPortableClusterSizeAllowed, 1),
               "gemm", "cudaFuncSetAttribute(NonPortableClusterSizeAllowed)");
    for (int cs = 1; cs <= fits; ++cs)
      if (!cluster_fits(reinterpret_cast<const void*>(f), cs, c.threads, c.smem)) {
        fits = cs - 1;
        break;
      }
  }
  return fits;
}

int grouped_few_down_config();  // (below: ATLAS_GEMM_GROUPED_FEW_DOWN's config or the default)

// First call (outside any capture): raise the dynamic shared-memory limit of every kernel
// instantiation (> 48 KB needs it), read the SM count, create the device error flag.
const GemmSetup& setup() {
  static const GemmSetup s = [] {
    GemmSetup g;
    int dev = 0;
    check_cuda(cudaGetDevice(&dev), "gemm", "cudaGetDevice");
    check_cuda(cudaDeviceGetAttribute(&g.sm_count, cudaDevAttrMultiProcessorCount, dev), "gemm",
               "cudaDeviceGetAttribute(multiProcessorCount)");
    const auto raise_smem = [](const void* f, int smem) {
      if (f && smem > 0)
        check_cuda(cudaFuncSetAttribute(f, cudaFuncAttributeMaxDynamicSharedMemorySize, smem), "gemm",
                   "cudaFuncSetAttribute(MaxDynamicSharedMemorySize)");
    };
    for (const TileConfig& c : kConfigs) {
      for (auto& per_out : c.fn)
        for (auto& per_async : per_out)
          for (KernelFn f : per_async) raise_smem(reinterpret_cast<const void*>(f), c.smem);
      for (KernelFn f : c.tail) raise_smem(reinterpret_cast<const void*>(f), c.smem);
      for (auto& per_out : c.stamped)
        for (KernelFn f : per_out) raise_smem(reinterpret_cast<const void*>(f), c.smem);
      for (KernelFn f : c.routed) raise_smem(reinterpret_cast<const void*>(f), c.smem);
    }
    // The fused launches' kernels (gemm_with_latent's 24 KB ring is under the default limit;
    // raised anyway, so a deeper ring cannot fail at launch as its first 48 KB form did in s32-2).
    raise_smem(reinterpret_cast<const void*>(kern::gemm_mma_latent_kernel<CfgD32S2>), CfgD32S2::SMEM_BYTES);
    raise_smem(reinterpret_cast<const void*>(kern::gemm_mma_merge_kernel<CfgD32>), CfgD32::SMEM_BYTES);
    raise_smem(reinterpret_cast<const void*>(kern::gemm_cluster_route_kernel<CfgC16>), CfgC16::SMEM_BYTES);
    raise_smem(reinterpret_cast<const void*>(kLeanWaitFirst), kConfigs[size_t(kStreamWgLean)].smem);
    raise_smem(reinterpret_cast<const void*>(kLeanS3WaitFirst), kConfigs[size_t(kStreamWgLeanS3)].smem);
    for (KernelFn f : kEarlyDown) raise_smem(reinterpret_cast<const void*>(f), kConfigs[size_t(kGroupedFewDown)].smem);
    raise_smem(reinterpret_cast<const void*>(kern::gemm_cluster_kernel<CfgC16, false, false, true>),
               CfgC16::SMEM_BYTES);
    // (allocated here, outside any capture: the first GEMM call)
    static_assert(kern::kClusterGemmMarks == 9, "one name per phase between marks");
    g.cluster_clocks = phase_clock_sums(
        "cluster_gemm", {"start to the weight slice's copies issued", "launch-overlap wait",
                         "x copies issued", "the four K steps (copies landed, mma)", "slice sum into shared memory",
                         "cluster barrier 1", "block 0: the DSMEM sums added and stored", "cluster barrier 2"});
    g.error_flag = error_flag();
    g.wgmma = probe_device_code(kern::gemm_wgmma_probe_kernel, "wgmma probe");
    if (g.wgmma && env_switch("ATLAS_GEMM_TMA", true)) {
      void* fn = nullptr;
      cudaDriverEntryPointQueryResult q{};
      if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &q) ==
              cudaSuccess &&
          q == cudaDriverEntryPointSuccess && fn != nullptr)
        g.encode_map = reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(fn);
      (void)cudaGetLastError();  // a driver without it is an answer (the cp.async kernel runs), not an error
    }
    const bool stream_code = probe_device_code(kern::gemm_stream_probe_kernel, "stream probe");
    for (size_t i = 0; stream_code && i < kConfigs.size(); ++i) {
      if (!kConfigs[i].stream) continue;
      int per_sm = 0;
      check_cuda(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kConfigs[i].fn[0][1][0], kConfigs[i].threads,
                                                               size_t(kConfigs[i].smem)),
                 "gemm", "cudaOccupancyMaxActiveBlocksPerMultiprocessor (stream config)");
      g.stream_blocks[i] = std::max(per_sm, 1);
    }
    const int stream_warps = gemm_stream_setting(std::getenv("ATLAS_GEMM_STREAM"));
    // The wgmma streaming config, with register-staged copies under ATLAS_GEMM_STREAM_REGS=1.
    // The lean loop (ATLAS_GEMM_STREAM_LEAN: 4 ring slots by default since session 30, 6, 8 slots
    // of 64-wide steps (session 31), or 0: the full loop; s30-3: decode 451.0 vs 442.8 tok/s, the
    // same tokens).
    const int lean = gemm_stream_lean_setting(std::getenv("ATLAS_GEMM_STREAM_LEAN"));
    const int wg = env_switch("ATLAS_GEMM_STREAM_REGS", false) ? kStreamWgRegs
                   : lean == 4                                 ? kStreamWgLean
                   : lean == 6                                 ? kStreamWgLean6
                   : lean == 8                                 ? kStreamWgLean8
                   : lean == 3                                 ? kStreamWgLeanLead3
                                                               : kStreamWg;
    g.stream_choice = stream_warps == 3    ? kStream3
                      : stream_warps == 6  ? kStream6
                      : stream_warps == 1  ? wg
                                           : -1;
    const int grouped = gemm_stream_grouped_setting(std::getenv("ATLAS_GEMM_STREAM_GROUPED"));
    g.stream_grouped_gate = grouped == 1   ? g.stream_choice
                            : grouped == 5 ? kStreamWgLean2
                            : grouped == 6 ? kStreamWgLean3
                            : grouped == 7 ? kStreamWgLeanS3
                            : grouped >= 2 ? wg
                                           : -1;
    g.stream_grouped_down = grouped == 3 || grouped >= 5 ? -1 : grouped == 4 ? kStreamWgLean2 : g.stream_grouped_gate;
    if (const int n = gemm_down_blocks_setting(std::getenv("ATLAS_GEMM_DOWN_BLOCKS_PER_SM")); n > 0) {
      int per_sm = 0, reserved = 0;
      check_cuda(cudaDeviceGetAttribute(&per_sm, cudaDevAttrMaxSharedMemoryPerMultiprocessor, dev), "gemm",
                 "cudaDeviceGetAttribute(maxSharedMemoryPerMultiprocessor)");
      check_cuda(cudaDeviceGetAttribute(&reserved, cudaDevAttrReservedSharedMemoryPerBlock, dev), "gemm",
                 "cudaDeviceGetAttribute(reservedSharedMemoryPerBlock)");
      // n + 1 blocks must not fit: each asks for more than per_sm / (n + 1) with its reserve.
      const int want = (per_sm / (n + 1) - reserved + 1 + 127) / 128 * 128;
      const TileConfig& down = kConfigs[size_t(grouped_few_down_config())];
      if (want > down.smem) {
        g.down_smem = want;
        for (auto& per_out : down.fn)
          for (auto& per_async : per_out)
            for (KernelFn f : per_async) raise_smem(reinterpret_cast<const void*>(f), want);
        for (auto& per_out : down.stamped)  // (ATLAS_BLOCK_STAMPS launches these in its place)
          for (KernelFn f : per_out) raise_smem(reinterpret_cast<const void*>(f), want);
        if (&down == &kConfigs[size_t(kGroupedFewDown)])  // (and tables_before_wait these)
          for (KernelFn f : kEarlyDown) raise_smem(reinterpret_cast<const void*>(f), want);
      }
    }
    g.tight_tiles = env_switch("ATLAS_GEMM_TIGHT_TILES", false);
    g.stage_early = env_switch("ATLAS_GEMM_STAGE_EARLY", true);
    g.cluster_early = env_switch("ATLAS_GEMM_CLUSTER_EARLY", true);
    g.cluster16 = env_switch("ATLAS_GEMM_CLUSTER16", true);
    g.cluster_push = env_switch("ATLAS_GEMM_CLUSTER_PUSH", false);
    g.stream_balance = env_switch("ATLAS_GEMM_STREAM_BALANCE", gemm_stream_balance_default(device_info(dev).name));
    g.streamk = gemm_streamk_setting(std::getenv("ATLAS_GEMM_STREAMK"));
    g.streamk_grid = gemm_streamk_grid_setting(std::getenv("ATLAS_GEMM_STREAMK_GRID"));
    g.tails = env_switch("ATLAS_GEMM_TAILS", false);
    g.route_tail = env_switch("ATLAS_ROUTE_TAIL", false);
    g.route_cluster = env_switch("ATLAS_ROUTE_CLUSTER", false);
    g.wide_splitk4 = env_switch("ATLAS_GEMM_WIDE_SPLITK4", false);
    g.combine_qkv = combine_qkv_setting(std::getenv("ATLAS_COMBINE_QKV"));
    g.combine_direct = env_switch("ATLAS_COMBINE_DIRECT", false);
    g.router_norm = router_norm_setting(std::getenv("ATLAS_ROUTER_NORM"));
    g.tma_persistent = env_switch("ATLAS_GEMM_TMA_PERSISTENT", true);
    if (const std::string path = detail::block_stamps_setting(std::getenv("ATLAS_BLOCK_STAMPS")); !path.empty()) {
      std::lock_guard<std::mutex> lock(stamp_mu);
      stamp_path = path;
      start_stamps_locked(kBlockStampsEnvCapacity);
      std::atexit(write_stamp_file);
    }
    if (g.encode_map)
      for (const void* f : {reinterpret_cast<const void*>(kern::gemm_tma_kernel<CfgTma192, false>),
                            reinterpret_cast<const void*>(kern::gemm_tma_kernel<CfgTma192, true>)})
        check_cuda(cudaFuncSetAttribute(f, cudaFuncAttributeMaxDynamicSharedMemorySize, CfgTma192::SMEM_BYTES),
                   "gemm", "cudaFuncSetAttribute(MaxDynamicSharedMemorySize, TMA)");
    int cluster_launch = 0;
    check_cuda(cudaDeviceGetAttribute(&cluster_launch, cudaDevAttrClusterLaunch, dev), "gemm",
               "cudaDeviceGetAttribute(clusterLaunch)");
    if (cluster_launch) cluster_launch = probe_device_code(kern::gemm_cluster_probe_kernel, "cluster probe");
    for (size_t i = 0; cluster_launch && i < kConfigs.size(); ++i)
      if (kConfigs[i].cluster) g.cluster_sizes[i] = max_cluster_blocks(kConfigs[i]);
    return g;
  }();
  return s;
}

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// A GEMM's row strides in elements, 0 (dense) resolved: x and w K apart, out N apart.
struct RowStrides {
  int64_t x, w, out;
};
template <class A>
RowStrides row_strides(const A& a) {
  return {a.x_stride ? a.x_stride : a.K, a.w_stride ? a.w_stride : a.K, a.out_stride ? a.out_stride : a.N};
}

// Tile rows that make sense for `m` rows per problem (padding a 1-row decode to 128 rows
// would waste the tensor cores; 192-row tiles from two of them per problem).
int bm_cap(int64_t m) { return m <= 16 ? 16 : m <= 32 ? 32 : m <= 64 ? 64 : m < 384 ? 128 : 192; }

// Blocks per cluster for cluster config `ci` at this K (one per K slice), or 0 where it cannot
// run here (not a cluster config, more slices than the device places in one cluster, no
// cluster launch in this build or on this GPU).
int cluster_blocks(int ci, int K) {
  const int slices = int(ceil_div(K, kern::kSliceK));
  return kConfigs[size_t(ci)].cluster && slices <= setup().cluster_sizes[size_t(ci)] ? slices : 0;
}
// A cluster config that cannot run at this K runs an ordinary tiled one, a stream config that
// cannot (K % 16 != 0, no sm_90a device code) the split-K kernel, the two-warpgroup stream config
// outside 2..16 K slices the one-warpgroup one (same bits).
int config_or_fallback(int ci, int K) {
  if (const int most = kConfigs[size_t(ci)].wg_split_max_slices; most > 0) {
    const int64_t slices = ceil_div(K, kern::kSliceK);
    if (slices < 2 || slices > most) ci = kStreamWg;  // one warpgroup would hold every slice (same bits)
  }
  if (const int parts = kConfigs[size_t(ci)].k_parts; parts > 1)
    if (ceil_div(K, kern::kSliceK) < parts || K % kConfigs[size_t(ci)].tail_k != 0)
      ci = kStreamWgLean;  // a part without a slice, or the tail instance's K (same bits)
  if (kConfigs[size_t(ci)].streamk && K % kConfigs[size_t(ci)].tail_k != 0)
    ci = kStreamWgLean;  // (the tail instance's K: the unsplit loops, same bits)
  if (kConfigs[size_t(ci)].stream) return K % 16 == 0 && setup().stream_blocks[size_t(ci)] > 0 ? ci : kSplitK8;
  if (!kConfigs[size_t(ci)].cluster || cluster_blocks(ci, K) > 0) return ci;
  return kConfigs[size_t(ci)].bm <= 16 ? kSplitK8 : kClusterFallback;
}
// The 8-row-slot config runs only where its whole-steps loop applies to every tile: at most 8 rows
// per tile (rows: M, or a grouped problem's max_rows), K whole 128-wide steps, N whole 32-column
// tiles; elsewhere the same tile with 16-row slots, "16x32x128/4u" (the same bits).
int half_a_or_fallback(int ci, int64_t rows, int64_t N, int64_t K) {
  using T = CfgD32H5;
  if (ci == kFewDownHalfA && !(rows <= T::AROWS && K % T::BK == 0 && N % T::BN == 0)) return kGroupedFewDown;
  return ci;
}


// The automatic choice. Up to 16 rows per problem (decode, small expert groups): the split-K
// kernel with 8 columns per block (the most blocks, and at <= 120 registers per thread two
// 256-thread blocks fit an SM, so one block's loads overlap the other's reduction; the 16-column
// variant needs ~150-185 registers: one block per SM). Larger M: the largest tiled config (first
// in kConfigs) whose height suits M and whose block count reaches 3/4 of the SMs; if none does
// (small N), split-K with 16-row tiles (K parallelism instead of a few blocks each running the
// whole K). `tiles_of(bm)` = m-tiles for a tile height. Depends on shape only, never on data,
// and never on bits (any config is exact): retune freely from the benchmark's summary table.
template <class TilesOf>
int choose_config(int64_t m_per_problem, int N, TilesOf tiles_of, int sm_count) {
  const int forced = forced_config.load();
  const bool wgmma_ok = setup().wgmma;
  if (forced >= 0) return kConfigs[size_t(forced)].wgmma && !wgmma_ok ? kWgmmaFallback : forced;
  const int cap = bm_cap(m_per_problem);
  if (cap == 16) return kSplitK8;
  for (int i = 0; i < int(kConfigs.size()); ++i) {
    const TileConfig& c = kConfigs[size_t(i)];
    if (c.splitk || c.sliced || c.grouped_only || c.cluster || c.stream || c.bm > cap || c.bm == 16 ||
        (c.wgmma && !wgmma_ok))
      continue;
    if (ceil_div(N, c.bn) * tiles_of(c.bm) >= int64_t(sm_count) * 3 / 4) return i;
  }
  return kSplitK8;
}

bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

// ---- cuBLASLt ----------------------------------------------------------------------------------

// cuBLASLt is opened on first use (dlopen), not linked: the library is ~540 MB, and loading it at
// start cost every atlas process ~0.37 s (its relocations' page faults), commands that never
// touch a GPU included (tests/decode/test_sampler_definitions.py alone starts it 547 times). Only the fast mode's GEMMs and
// the pinned experiment call it; a machine without it runs everything else.
// Each entry point once: the field (cublasLt<name>'s type) and its dlsym below come from this list.
#define ATLAS_LT_FUNCTIONS(X) \
  X(Create) X(Matmul) X(MatmulAlgoCheck) X(MatmulAlgoConfigSetAttribute) \
  X(MatmulAlgoGetHeuristic) X(MatmulDescCreate) X(MatmulDescDestroy) X(MatmulDescSetAttribute) \
  X(MatmulPreferenceCreate) X(MatmulPreferenceDestroy) X(MatmulPreferenceSetAttribute) X(MatrixLayoutCreate) \
  X(MatrixLayoutDestroy) X(MatrixLayoutSetAttribute)
struct LtApi {
#define ATLAS_LT_FIELD(name) decltype(&cublasLt##name) name = nullptr;
  ATLAS_LT_FUNCTIONS(ATLAS_LT_FIELD)
#undef ATLAS_LT_FIELD
};

const LtApi& lt_api() {
  static LtApi a;
  static std::once_flag once;
  std::call_once(once, [] {
    // The soname of the toolkit built against (cuBLAS's major version is CUDA's), through the
    // executable's run path and the loader's search, then in the toolkit's directory.
    void* lib = dlopen(ATLAS_CUBLASLT_SONAME, RTLD_NOW | RTLD_LOCAL);
    if (!lib) lib = dlopen(ATLAS_CUBLASLT_DIR "/" ATLAS_CUBLASLT_SONAME, RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
      const char* why = dlerror();
      throw Error(std::string("cuda: gemm: the fast mode's GEMMs need cuBLASLt, and ") + ATLAS_CUBLASLT_SONAME +
                  " could not be loaded (" + (why ? why : "not found") + "); the batch-invariant mode does not use it");
    }
    const auto sym = [&](auto& fn, const char* name) {
      fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(dlsym(lib, name));
      if (!fn) throw Error(std::string("cuda: gemm: ") + ATLAS_CUBLASLT_SONAME + " lacks " + name);
    };
#define ATLAS_LT_SYM(name) sym(a.name, "cublasLt" #name);
    ATLAS_LT_FUNCTIONS(ATLAS_LT_SYM)
#undef ATLAS_LT_SYM
  });
  return a;
}
#undef ATLAS_LT_FUNCTIONS

void check_lt(cublasStatus_t st, const char* what) {
  if (st == CUBLAS_STATUS_SUCCESS) return;
  throw Error(std::string("cuda: gemm: ") + what + ": cuBLASLt status " + std::to_string(int(st)));
}

struct LtState {
  cublasLtHandle_t handle = nullptr;
  void* workspace = nullptr;
  size_t workspace_bytes = 32u << 20;  // cuBLAS's own recommendation for Hopper
};

LtState& lt() {
  static LtState s;
  static std::once_flag once;
  std::call_once(once, [] {
    check_lt(lt_api().Create(&s.handle), "cublasLtCreate");
    check_cuda(cudaMalloc(&s.workspace, s.workspace_bytes), "gemm", "cudaMalloc(workspace)");
  });
  return s;
}

// A cached cuBLASLt plan: descriptors and algorithm for one exact shape, kept for the process.
struct LtPlan {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t la = nullptr, lb = nullptr, lc = nullptr;
  cublasLtMatmulAlgo_t algo{};
};
using LtKey = std::tuple<int, int, int, int64_t, int64_t, int64_t, int, int, int64_t, int64_t, int64_t, bool>;
std::mutex lt_mutex;
std::map<LtKey, LtPlan> lt_plans;
// Workspaces of streams that run cuBLASLt concurrently with others (gemm_prepare_stream);
// every other stream uses LtState's. Guarded by lt_mutex.
std::map<std::pair<int, cudaStream_t>, void*> lt_stream_workspaces;

// The workspace `stream` runs cuBLASLt with. Caller holds lt_mutex.
void* lt_workspace_locked(int dev, cudaStream_t stream) {
  auto it = lt_stream_workspaces.find({dev, stream});
  return it == lt_stream_workspaces.end() ? lt().workspace : it->second;
}

// The pinned algorithm per (N, K, out type), chosen once for M = kPinM.
constexpr int kPinM = 128;
std::map<std::tuple<int, int, int>, cublasLtMatmulAlgo_t> pinned_algos;

void set_batch(cublasLtMatrixLayout_t l, int batch, int64_t stride, const char* what) {
  if (batch <= 1) return;
  check_lt(lt_api().MatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &batch, sizeof(batch)), what);
  check_lt(lt_api().MatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride, sizeof(stride)),
           what);
}

// Row-major out[M,N] = x[M,K] . W[N,K]^T is column-major out'[N,M] = W'^T . x' with
// W' = [K,N] (ld K) and x' = [K,M] (ld K): op(A) = transpose(W'), op(B) = x'.
// Caller holds lt_mutex.
LtPlan make_plan(const GemmArgs& a, int64_t xs, int64_t ws, int64_t os, bool pinned) {
  LtState& s = lt();
  const cudaDataType_t out_t = a.out_type == OutType::f32 ? CUDA_R_32F : CUDA_R_16BF;
  LtPlan p;
  cublasLtMatmulPreference_t pref = nullptr;
  try {
    check_lt(lt_api().MatmulDescCreate(&p.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F), "MatmulDescCreate");
    const cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
    check_lt(lt_api().MatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)), "TRANSA");
    check_lt(lt_api().MatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)), "TRANSB");
    check_lt(lt_api().MatrixLayoutCreate(&p.la, CUDA_R_16BF, a.K, a.N, ws), "layout A");
    check_lt(lt_api().MatrixLayoutCreate(&p.lb, CUDA_R_16BF, a.K, a.M, xs), "layout B");
    check_lt(lt_api().MatrixLayoutCreate(&p.lc, out_t, a.N, a.M, os), "layout C");
    set_batch(p.la, a.batch, a.w_batch_stride, "batch A");
    set_batch(p.lb, a.batch, a.x_batch_stride, "batch B");
    set_batch(p.lc, a.batch, a.out_batch_stride, "batch C");
    check_lt(lt_api().MatmulPreferenceCreate(&pref), "PreferenceCreate");
    check_lt(lt_api().MatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                  &s.workspace_bytes, sizeof(s.workspace_bytes)),
             "MAX_WORKSPACE_BYTES");
    if (!pinned) {
      cublasLtMatmulHeuristicResult_t heur{};
      int found = 0;
      check_lt(lt_api().MatmulAlgoGetHeuristic(s.handle, p.desc, p.la, p.lb, p.lc, p.lc, pref, 1, &heur, &found),
               "AlgoGetHeuristic");
      if (found == 0)
        throw Error("cuda: gemm: cuBLASLt found no algorithm for M=" + std::to_string(a.M) +
                    " N=" + std::to_string(a.N) + " K=" + std::to_string(a.K));
      p.algo = heur.algo;
    } else {
      const auto key = std::tuple{a.N, a.K, int(a.out_type)};
      auto it = pinned_algos.find(key);
      if (it == pinned_algos.end()) {
        cublasLtMatrixLayout_t lb_pin = nullptr, lc_pin = nullptr;
        check_lt(lt_api().MatrixLayoutCreate(&lb_pin, CUDA_R_16BF, a.K, kPinM, a.K), "layout B (pin)");
        check_lt(lt_api().MatrixLayoutCreate(&lc_pin, out_t, a.N, kPinM, a.N), "layout C (pin)");
        cublasLtMatrixLayout_t la_pin = nullptr;
        check_lt(lt_api().MatrixLayoutCreate(&la_pin, CUDA_R_16BF, a.K, a.N, a.K), "layout A (pin)");
        cublasLtMatmulHeuristicResult_t heur{};
        int found = 0;
        const cublasStatus_t st =
            lt_api().MatmulAlgoGetHeuristic(s.handle, p.desc, la_pin, lb_pin, lc_pin, lc_pin, pref, 1, &heur, &found);
        lt_api().MatrixLayoutDestroy(la_pin);
        lt_api().MatrixLayoutDestroy(lb_pin);
        lt_api().MatrixLayoutDestroy(lc_pin);
        check_lt(st, "AlgoGetHeuristic (pin)");
        if (found == 0)
          throw Error("cuda: gemm: cuBLASLt found no algorithm to pin for N=" + std::to_string(a.N) +
                      " K=" + std::to_string(a.K));
        const int32_t one = 1;
        const uint32_t no_reduction = CUBLASLT_REDUCTION_SCHEME_NONE;
        check_lt(lt_api().MatmulAlgoConfigSetAttribute(&heur.algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &one, sizeof(one)),
                 "SPLITK_NUM");
        check_lt(lt_api().MatmulAlgoConfigSetAttribute(&heur.algo, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME,
                                                      &no_reduction, sizeof(no_reduction)),
                 "REDUCTION_SCHEME");
        it = pinned_algos.emplace(key, heur.algo).first;
      }
      p.algo = it->second;
      cublasLtMatmulHeuristicResult_t check{};
      check_lt(lt_api().MatmulAlgoCheck(s.handle, p.desc, p.la, p.lb, p.lc, p.lc, &p.algo, &check),
               "AlgoCheck: the pinned algorithm does not support this M");
    }
  } catch (...) {
    if (pref) lt_api().MatmulPreferenceDestroy(pref);
    if (p.lc) lt_api().MatrixLayoutDestroy(p.lc);
    if (p.lb) lt_api().MatrixLayoutDestroy(p.lb);
    if (p.la) lt_api().MatrixLayoutDestroy(p.la);
    if (p.desc) lt_api().MatmulDescDestroy(p.desc);
    throw;
  }
  lt_api().MatmulPreferenceDestroy(pref);
  return p;
}

void gemm_cublaslt(const GemmArgs& a, int64_t xs, int64_t ws, int64_t os, bool pinned) {
  LtState& s = lt();
  const LtKey key{a.M, a.N, a.K, xs, ws, os, int(a.out_type), a.batch, a.x_batch_stride, a.w_batch_stride,
                  a.out_batch_stride, pinned};
  int dev = 0;
  check_cuda(cudaGetDevice(&dev), "gemm", "cudaGetDevice");
  LtPlan plan;
  void* workspace = nullptr;
  {  // one lock for the plan and the stream's workspace
    std::lock_guard<std::mutex> lock(lt_mutex);
    auto it = lt_plans.find(key);
    if (it == lt_plans.end()) it = lt_plans.emplace(key, make_plan(a, xs, ws, os, pinned)).first;
    plan = it->second;  // descriptors are never destroyed: a copy of the handles is safe
    workspace = lt_workspace_locked(dev, stream_of(a.stream));
  }
  const float alpha = 1.0f, beta = 0.0f;
  check_lt(lt_api().Matmul(s.handle, plan.desc, &alpha, a.w, plan.la, a.x, plan.lb, &beta, a.out, plan.lc, a.out,
                          plan.lc, &plan.algo, workspace, s.workspace_bytes, stream_of(a.stream)),
           "Matmul");
}

// The config gemm() runs for `a` (batch_invariant mode): the chooser, then the predicated
// fallback when the operands rule out 16-byte copies.
bool dense_async(const GemmArgs& a, int64_t xs, int64_t ws) {
  return a.K % 8 == 0 && xs % 8 == 0 && ws % 8 == 0 && aligned16(a.x) && aligned16(a.w) &&
         (a.batch == 1 || (a.x_batch_stride % 8 == 0 && a.w_batch_stride % 8 == 0));
}
// Sliced launches (one K slice per block) where a dense decode-sized problem has too few tiles to
// keep the SMs busy: the profile of session 3 had M = 128 x N = 2048 x K = 2048 at 35 us on 128
// blocks of 4 warps (1 block per SM, the warps mostly idle), against 8 us for cuBLASLt.
constexpr int64_t kSlicedMaxM = 512;
// Cluster launches (kernels/gemm_cluster.cuh) for 16 < M <= this (the automatic choice).
constexpr int64_t kClusterMaxM = 128;
constexpr size_t kSlicedMaxWorkspace = size_t(64) << 20;  // bytes of fp32 slice sums
bool use_sliced(const GemmArgs& a, const TileConfig& c, bool async, int sm_count) {
  const int64_t slices = ceil_div(a.K, kern::kSliceK);
  return c.sliced && async && a.batch == 1 && slices > 1 &&
         size_t(slices) * size_t(a.M) * size_t(a.N) * 4 <= kSlicedMaxWorkspace &&
         ceil_div(a.M, c.bm) * ceil_div(a.N, c.bn) * slices <= int64_t(INT32_MAX) && sm_count > 0;
}
int dense_splitk_config();  // (below, with the other config overrides)
bool splitk_overridden();
int stream_few_config();  // ATLAS_GEMM_STREAM_FEW's config, -1 where unset (below)
int wide_gated_config();  // ATLAS_GEMM_WIDE_GATED's, -1 where unset (below)
int long_k_config();      // ATLAS_GEMM_LONG_K's, -1 where unset (below)
int dense_config(const GemmArgs& a, bool async, int sm_count) {
  int ci = choose_config(a.M, a.N, [&](int bm) { return ceil_div(a.M, bm) * a.batch; }, sm_count);
  if (forced_config.load() < 0 && a.M > 16 && a.M <= kSlicedMaxM) {
    // Decode-sized M: when the chosen tiles leave the GPU underfilled (fewer than two blocks per
    // SM), cut K into its slices across blocks instead.
    const TileConfig& c = kConfigs[size_t(ci)];
    // 32-row tiles up to M = 128: at M = 128 they beat the 64-row ones on all five decode
    // shapes of V2-Lite (H200 sweep, session 4: N x K = 576 x 2048 8.3 vs 8.9 us, 2048 x 1408
    // 14.4 vs 15.0, 2048 x 2048 16.3 vs 17.0, 2816 x 2048 21.9 vs 22.8, 3072 x 2048 23.0 vs 24.0).
    const int cand = a.M <= 128 ? kSliced32 : kSliced64;
    if (c.splitk || ceil_div(a.M, c.bm) * ceil_div(a.N, c.bn) < 2 * int64_t(sm_count))
      if (use_sliced(a, kConfigs[size_t(cand)], async, sm_count)) ci = cand;
  }
  // Cluster split-K (kernels/gemm_cluster.cuh) where it measured faster, H200, session 5
  // (atlas_cuda_bench, us; the cluster kernels are latency-bound: ~9 us per wave of clusters).
  // Only where K has at most 8 slices (the measured shapes) and the chosen launch is sliced or
  // split-K; elsewhere the tiled kernels fill the GPU and win (N = 21888 at M = 128: wgmma 81 us,
  // c128x64 116).
  const bool decode_128 = forced_config.load() < 0 && async && a.batch == 1 && a.M > 64 && a.M <= kClusterMaxM &&
                          (ci == kSliced32 || ci == kSliced64);
  if (decode_128 && a.N >= 2048 && a.gated == 0 && a.K <= 11 * kern::kSliceK && setup().wgmma &&
      use_sliced(a, kConfigs[size_t(kSlicedWg128)], async, sm_count)) {
    // The wgmma tile (all 128 rows x 128 columns) in a sliced launch, session 6 at M = 128 (us,
    // vs c64x64 / c128x64): N x K = 2048 x 1408 12.1 vs 17.0, 2048 x 2048 13.2 vs 18.5,
    // 3072 x 2048 19.6 vs 23.2, 2816 x 2048 19.3 vs 20.2 (but gate|up there is gated: the
    // cluster kernel fuses the SiLU, the sliced launch cannot); N = 576 11.3 vs 9.5 (not taken).
    // Session 7: also at 9-11 K slices, where no cluster config runs: the shared experts' down
    // projection 2048 x 2816 19.4 vs 32x64x64/4+slices 22.8 (longer K, e.g. the dense MLP's
    // 10944, was not measured and keeps the 32-row sliced launch).
    ci = kSlicedWg128;
  } else if (decode_128 && a.gated > 0 && a.N > 2816) {
    // Gated and wide (the shared experts' gate|up, N = 5632, at M = 128): the plain tiled
    // 32 x 64 tiles with the fused SiLU, session 7 (ungated timings, us): 30.6 vs c128x64 35.1,
    // c64x64 38.1; the sliced launches cannot fuse (40.6 + the SiLU kernel).
    ci = kTiled32;
  } else if (forced_config.load() < 0 && async && a.batch == 1 && a.K <= 8 * kern::kSliceK) {
    if (a.M > 16 && a.M <= kClusterMaxM && (ci == kSliced32 || ci == kSliced64)) {
      // M = 128 vs the sliced launch: N = 576 c64x64 9.0 vs 10.2, 2048 17.7 vs 18.6, 2816 19.4 vs
      // 24.0; N = 3072 c128x64 22.9 vs 25.6 (c64x64 23.7).
      const int cand = a.N <= 2816 ? kCluster64 : kCluster128;
      if (cluster_blocks(cand, a.K) > 0) ci = cand;
    } else if (a.M <= 16 && ci == kSplitK8 && a.N >= 2816) {
      // M = 1 vs split-K: N = 2816 c16x64 8.2 vs 9.5, 3072 9.0 vs 9.8, 21888 34.8 vs 39.8,
      // 102400 132 vs 166 (narrower N stays split-K: 576 4.9 vs 6.4, 2048 7.3 vs 7.6).
      if (setup().wide_splitk4)
        ci = kSplitK8W4Staged;
      else if (setup().cluster16 && cluster_blocks(kCluster16, a.K) > 0)
        ci = setup().cluster_push && cluster_blocks(kCluster16Push, a.K) > 0 ? kCluster16Push : kCluster16;
    }
  }
  if (forced_config.load() < 0 && async && ci == kSplitK8 && a.K <= kern::kSliceK) {
    // One K slice (the absorbed query's per-head 128 x 512 GEMMs at batch 1): split-K has
    // nothing to split, one warp of eight would work; the 16-row tiles spread the columns over
    // four warps instead (session 8, batch-1 decode: that GEMM 10.5 us per layer on split-K).
    ci = kTiled16;
  }
  if (forced_config.load() < 0 && async && a.M <= 8 && a.batch == 1 && a.N >= 4096 && setup().stream_choice >= 0) {
    // Weight streaming (kernels/gemm_stream.cuh) where it measured faster, H200, session 13
    // (atlas_cuda_bench, M = 1, us): N x K = 5632 x 2048 (the shared experts' gate|up) 10.3 vs
    // split-K 14.1, 21888 x 2048 30.0 vs c16x64 36.5, the LM head 102400 x 2048 113 vs 139
    // (cuBLASLt 105). Narrower N stays where it was: 3072 x 2048 9.4 vs c16x64 9.2, 2048 x 2048
    // 9.0 vs split-K 7.2, 576 x 2048 8.8 vs 5.0 (one wave of short tiles: the ramp dominates).
    ci = setup().stream_choice;
    // Fewer 64-row tiles than SMs (the shared experts' gate|up at one row: 88 tiles, one per
    // block): ATLAS_GEMM_STREAM_FEW=<config> runs them on another config (A/B runs; the same bits).
    if (ceil_div(a.N, 64) < int64_t(sm_count))
      if (const int few = stream_few_config(); few >= 0) ci = few;
  }
  // Stream-K (session 52, ATLAS_GEMM_STREAMK; the same bits): one-row dense problems on the lean
  // stream loop with at least one tile per SM (the LM head, 1,600 tiles; layer 0's gate|up, 342)
  // in equal runs of (tile, K slice) units on every resident slot (`wide`), and those of more
  // than 16 K slices (layer 0's down, K = 10,944: on the staged split-K's 256 blocks ~2.9 TB/s
  // in s48-1) on the 64-wide steps' form (`long`). Why: the stream grids hold whole tiles, so
  // the LM head's 396 blocks walk 4 or 5 tiles (the 16 with a fifth end it alone) and layer 0's
  // gate|up runs 342 one-tile blocks (78 SMs hold three, 54 two): ~3.3 TB/s against the LM
  // head's ~4.3 (s48-1, s49-1).
  // (Both this and the session-49 switches below: one-row problems where no config is forced;
  // "wide" = at least one 64-column tile per SM, "long" = ungated, more than 16 K slices.)
  const bool one_row = forced_config.load() < 0 && async && a.M <= 8 && a.batch == 1;
  const bool wide = ceil_div(a.N, 64) >= int64_t(sm_count);
  const bool long_k = a.gated == 0 && ceil_div(a.K, kern::kSliceK) > 16;
  const int streamk = mode_or_override(streamk_override, setup().streamk);
  if (one_row && streamk != 0) {
    if ((streamk & 1) != 0 && ci == kStreamWgLean && wide)
      ci = kStreamWgLeanK;
    else if ((streamk & 2) != 0 && long_k && a.K % 64 == 0)
      ci = kStreamWgLean64K;
  }
  // Session 49, for A/B runs in the decode step (any config gives the same bits): the dense MLP's
  // two GEMMs at one row (V2-Lite's layer 0). Its gate|up (gated, at least one 64-column tile
  // per SM: N = 21,888, 342 tiles) takes ATLAS_GEMM_WIDE_GATED's config and its down (more than 16
  // K slices: K = 10,944, 43) ATLAS_GEMM_LONG_K's, where set. Why: s48-1's timeline had them at
  // 3.26 and 2.88 TB/s (the stream config's 342 one-tile blocks, the staged split-K's 256) against
  // the LM head's 4.25 on the same stream config.
  if (one_row) {
    if (a.gated > 0 && wide) {
      if (const int w = wide_gated_config(); w >= 0) ci = w;
    } else if (long_k) {
      if (const int l = long_k_config(); l >= 0) ci = l;
    }
  }
  ci = config_or_fallback(ci, a.K);
  ci = half_a_or_fallback(ci, a.M, a.N, a.K);
  if (forced_config.load() < 0 && ci == kSplitK8) {
    ci = dense_splitk_config();
    // At most two K slices (the MLA value GEMM, K = 512) on two-warp blocks: the 8-warp blocks'
    // six idle warps held registers that kept the next GEMM's blocks (o_proj) from becoming
    // resident and staging their weights early. 2500.9 vs 2515.2 us per decode step (session 22,
    // s22-1). Only where ATLAS_GEMM_SPLITK is unset (naming a config forces it everywhere); the
    // same bits.
    if (ci == kSplitK8Staged && !splitk_overridden() && ceil_div(a.K, kern::kSliceK) <= 2) ci = kSplitK8W2Staged;
  }
  if (!async && !kConfigs[size_t(ci)].fn[0][0][0]) ci = kConfigs[size_t(ci)].bm <= 16 ? kSyncSmall : kSyncLarge;
  return ci;
}

// Grouped: the same, with the average rows per non-empty group standing in for M. Tile bound:
// sum_g ceil(rows_g / BM) <= ceil(max_rows / BM) + (non-empty groups), and at most
// min(groups, max_rows) groups are non-empty.
bool grouped_async(const GroupedGemmArgs& a, int64_t xs, int64_t ws) {
  // Group weights are device pointers the host cannot see: the kernel checks their alignment
  // on the async path (device error "w") instead.
  return a.K % 8 == 0 && xs % 8 == 0 && ws % 8 == 0 && aligned16(a.x);
}
// A config-name override's value (null or empty: unset, -1): the config it names, where `fits`
// accepts it; anything else throws an Error naming the variable and what it may name (`kinds`).
int config_override_setting(const char* var, const char* value, bool (*fits)(const TileConfig&), const char* kinds) {
  if (value == nullptr || *value == '\0') return -1;
  const int i = config_index(value);
  if (i < 0 || !fits(kConfigs[size_t(i)]))
    throw Error(std::string("cuda: gemm: ") + var + ": '" + value + "' is not " + kinds);
  return i;
}
// The override's config where the variable is set, else dflt (read once per variable: the callers
// keep the result in a static).
int config_or_override(const char* var, int (*setting)(const char*), int dflt) {
  const int i = setting(std::getenv(var));
  return i < 0 ? dflt : i;
}
// The config one-row problems of few tiles take in place of the stream config where
// ATLAS_GEMM_STREAM_FEW names one (session 28, end-to-end A/B runs; any config: the same bits).
int stream_few_config() {
  static const int ci = config_or_override("ATLAS_GEMM_STREAM_FEW", gemm_stream_few_setting, -1);
  return ci;
}
// The configs of the dense MLP's gate|up and down at one row where ATLAS_GEMM_WIDE_GATED /
// ATLAS_GEMM_LONG_K name them (session 49, A/B runs; dense_config says which problems).
int wide_gated_config() {
  static const int ci = config_or_override("ATLAS_GEMM_WIDE_GATED", gemm_wide_gated_setting, -1);
  return ci;
}
int long_k_config() {
  static const int ci = config_or_override("ATLAS_GEMM_LONG_K", gemm_long_k_setting, -1);
  return ci;
}
// The config for many small groups (a decode step of many tokens); ATLAS_GEMM_GROUPED_MANY=<config
// name> overrides it for end-to-end measurements of the candidates (any config: the same bits).
int grouped_many_config() {
  static const int ci = config_or_override("ATLAS_GEMM_GROUPED_MANY", gemm_grouped_many_setting, kGroupedMany);
  return ci;
}
// The config for a few rows in all (one token's routed experts) without the fused gate: the MoE
// down projection of a batch-1 decode step. ATLAS_GEMM_GROUPED_FEW_DOWN=<config name> overrides
// it for end-to-end measurements (session 17: that GEMM moves 34.6 MB in 18.8 us, ~1.8 TB/s,
// where the gate|up beside it reaches ~3.2; any config gives the same bits). The default since
// session 34 is 16x32x128/4's tile with the lean copies and the whole-steps loop ("/4u",
// kern::mma_whole_steps): its loop is ~70 instructions per K step against ~180 ("/4l") and ~275
// (the plain tile); batch-1 decode with ATLAS_SHARED_DOWN_FIRST 469.2 / 467.6 against 461.7 / 461.9
// tok/s for the plain tile without it (s34-3, s34-4; docs/cuda-sessions.md, session 34).
int grouped_few_down_config() {
  static const int ci =
      config_or_override("ATLAS_GEMM_GROUPED_FEW_DOWN", gemm_grouped_few_down_setting, kGroupedFewDown);
  return ci;
}
// The split-K config of dense problems where the chooser picks split-K (one-row GEMMs: o_proj,
// the shared down, the router, the value GEMM): the staged variant, whose weight slices come in
// as whole 512-byte row segments (H200 session 21, s21-1, CUPTI timelines of batch-1 decode
// steps: 2537 against 2652 us per step; medians over every layer of each kernel's end after the
// latest earlier end: o_proj 6.2 -> 4.5 us, the router 3.0 -> 2.3, the shared down 5.4 -> 3.4;
// splitk16x16/8w 2712). ATLAS_GEMM_SPLITK=<a split-K config name> overrides it for A/B
// measurements (any config gives the same bits; splitk16x8/8w is the one before session 21).
// Problems without 16-byte aligned operands run the plain kernel (the staged one has no
// predicated path).
int dense_splitk_config() {
  static const int ci = config_or_override("ATLAS_GEMM_SPLITK", gemm_splitk_setting, kSplitK8Staged);
  return ci;
}
bool splitk_overridden() {
  static const bool set = gemm_splitk_setting(std::getenv("ATLAS_GEMM_SPLITK")) >= 0;
  return set;
}
int64_t busy_groups(const GroupedGemmArgs& a) { return std::min<int64_t>(a.groups, a.max_rows); }
int grouped_config(const GroupedGemmArgs& a, bool async, int sm_count) {
  const int64_t busy = busy_groups(a), m_avg = ceil_div(a.max_rows, busy);
  int ci = choose_config(m_avg, a.N, [&](int bm) { return busy * ceil_div(m_avg, bm); }, sm_count);
  // Small groups, from the H200 sweeps of sessions 2 and 4 (ATLAS_GEMM_SWEEP=1, 64 experts,
  // N x K = 2816 x 2048 / 2048 x 1408): a decode step of 128 tokens (~12 rows per expert)
  // 32x128x64/8 209 / 107 us (32x64x64/4 219 / 114, split-K 786 / 416, 16x32x128/4 314 / 156);
  // of 1 token (6 rows) 16x32x128/4 30 / 20 us (split-K 40 / 28). Any config gives the same bits.
  if (forced_config.load() < 0 && m_avg <= 16)
    ci = a.max_rows > kGroupedFewMaxRows ? grouped_many_config()
         : a.gated == 0                  ? grouped_few_down_config()
                                         : kGroupedFew;
  // (Weight streaming at one token, session 13: gate|up 28.7 vs 29.2 us, down 18.9 vs 20.0 in
  // isolation, but batch-1 decode 287 vs 299 tok/s end to end: these run beside the shared
  // experts on the side stream, whose blocks its 99-198 KB per block keep off the SMs.
  // ATLAS_GEMM_STREAM_GROUPED=1 takes it, for end-to-end A/B runs.)
  const int stream_ci = a.gated > 0 ? setup().stream_grouped_gate : setup().stream_grouped_down;
  if (forced_config.load() < 0 && async && a.max_rows <= 8 && stream_ci >= 0) ci = stream_ci;
  // (The sliced grouped config, 16x32x128/4+slices, is not chosen automatically: at a batch-1
  // decode step it measured slower end to end than these tiles, 189 vs 215 tok/s on the H200.)
  ci = config_or_fallback(ci, a.K);
  ci = half_a_or_fallback(ci, a.max_rows, a.N, a.K);
  if (!async && !kConfigs[size_t(ci)].fn[0][0][0]) ci = kConfigs[size_t(ci)].bm <= 16 ? kSyncSmall : kSyncLarge;
  return ci;
}

constexpr size_t kSplitWsFloats = size_t(4) << 20;  // 16 MiB: 8,192 (tile, slice) sums; one token's routed down: 192 x 6
constexpr size_t kSplitTiles = 8192;
std::pair<float*, int*> stream_split_scratch(cudaStream_t stream);  // below

// Launches of the instances that keep a grouped launch's order promises (GroupedOrder).
std::atomic<int64_t> wait_first_launches{0}, early_weight_launches{0};

// `rows8`: no tile holds more than 8 rows (the split-K kernel's 8-row variant may run).
// `tiles`: output tiles of one problem (grid.x); cluster configs run `cluster` blocks per tile.
void launch_mma(const TileConfig& c, const kern::MmaGemmParams& p, int64_t tiles, unsigned batch, bool f32,
                bool async, bool rows8, int cluster, cudaStream_t stream, int smem_at_least = 0,
                GroupedOrder order = {}) {
  KernelFn f = c.tail_k > 0 && p.K % c.tail_k != 0 ? c.tail[f32 ? 1 : 0] : c.fn[f32 ? 1 : 0][async ? 1 : 0][rows8 ? 1 : 0];
  // Where the config's plain instance would run: its wait-first (the lean stream loop) or
  // early-weights (the few-row down, 16x32x128/4u) instantiation where asked for. A wait-first
  // launch that has no such instance goes without launch overlap (its blocks start after its
  // predecessor's end: the promise kept the plain way). Ahead of the stamps and the self route,
  // which the caller does not combine with these.
  const KernelFn plain_f = f;
  if (order.wait_first && async && !f32 && p.offsets != nullptr && f == c.fn[0][1][rows8 ? 1 : 0]) {
    if (&c == &kConfigs[size_t(kStreamWgLean)]) f = kLeanWaitFirst;
    else if (&c == &kConfigs[size_t(kStreamWgLeanS3)]) f = kLeanS3WaitFirst;
  }
  if (order.tables_before_wait && async && p.offsets != nullptr && p.slice_stride == 0 &&
      &c == &kConfigs[size_t(kGroupedFewDown)] && f == c.fn[f32 ? 1 : 0][1][rows8 ? 1 : 0])
    f = kEarlyDown[f32 ? 1 : 0];
  const bool reordered = f != plain_f;
  if (reordered) (order.wait_first ? wait_first_launches : early_weight_launches).fetch_add(1);
  std::optional<PlainLaunchScope> plain;  // (only where asked: a scope sets, it does not add)
  if (order.wait_first && !reordered) plain.emplace(true);
  // Block stamps on: the stamped instantiation of the same kernel, where the config has one (the
  // same parameters; the ring is the module's device global).
  const KernelFn with_stamps = c.stamped[f32 ? 1 : 0][rows8 ? 1 : 0];
  if (reordered) {
    // (the order's instance, unstamped and unrouted)
  } else if (stamps_on.load(std::memory_order_relaxed) && async && with_stamps != nullptr && f == c.fn[f32 ? 1 : 0][1][rows8 ? 1 : 0])
    f = with_stamps;
  // One token's routing in the launch (grouped_gemm set route_logits): the routing instantiation
  // of the same kernel, where the config has one; elsewhere the plain kernel, which ignores the
  // fields and waits for the routing kernel's table (the same bits either way).
  else if (p.route_logits != nullptr && !f32 && async && c.routed[rows8 ? 1 : 0] != nullptr && f == c.fn[0][1][rows8 ? 1 : 0]) {
    f = c.routed[rows8 ? 1 : 0];
    self_routed_launches.fetch_add(1, std::memory_order_relaxed);
  }
  // ATLAS_PHASE_CLOCKS=cluster_gemm (gemm() set phase_clocks): c16x64/4w's clocked instantiation.
  else if (p.phase_clocks != nullptr && &c == &kConfigs[size_t(kCluster16)] && !f32 && f == c.fn[0][1][0])
    f = kern::gemm_cluster_kernel<CfgC16, false, false, true>;
  if (c.stream) {
    // Persistent: every block takes an even share of the tiles (dense: the batch flattened).
    // Balanced where there are more tiles than resident blocks: the LM head's 1,600 tiles of the
    // wgmma config on 396 slots would give 16 blocks a fifth tile, walked alone at the end; 320
    // blocks walk five each. Which block walks which tile never changes a bit.
    kern::MmaGemmParams q = p;
    const int64_t t = tiles * batch;
    q.tiles_total = int(t);
    const int64_t slots = int64_t(setup().sm_count) * setup().stream_blocks[size_t(&c - kConfigs.data())];
    if ((c.k_parts > 1 || c.streamk) && f == c.fn[f32 ? 1 : 0][async ? 1 : 0][rows8 ? 1 : 0]) {  // (no stamped split loop)
      // The split lean loops: fp32 slice sums [slot][slices][128][4] and a counter per slot in
      // the stream's fixed block. k_parts: each tile's K in k_parts runs (config_or_fallback saw
      // every part get a slice), one slot per tile. Not balanced: the point is more blocks.
      // (s31-4 ran it balanced: a grouped problem's host bound of 224 tiles made 448 items on 396
      // slots, i.e. 224 blocks of two items, the unsplit grid, and the step slowed, 415.3 vs
      // 453.5 tok/s. Unbalanced, one token's 192 real tiles are 384 items on 396 blocks: 430.9 vs
      // 452.6 tok/s, s32-1.) Stream-K (dense only): every resident slot (or streamk_grid's test
      // grid, else ATLAS_GEMM_STREAMK_GRID's bound), each an equal run of the (tile, slice)
      // units, one slot per split tile (kern::streamk_slot: at most min(tiles, blocks)). Where
      // the sums do not fit the block, inside a capture before an eager call made it, or for a
      // grouped stream-K problem: the unsplit lean loop of the same steps instead (same bits).
      const int64_t slices = ceil_div(p.K, kern::kSliceK);
      const int test_grid = streamk_grid.load();
      const int forced_grid = test_grid > 0 ? test_grid : setup().streamk_grid;
      const int64_t grid = c.streamk ? std::min(t * slices, forced_grid > 0 ? int64_t(forced_grid) : slots)
                                     : stream_grid_blocks(t * c.k_parts, slots, false);
      const int64_t ws_slots = c.streamk ? std::min(t, grid) : t;
      const auto [ws, cnt] = c.streamk && p.offsets != nullptr ? std::pair<float*, int*>{} : stream_split_scratch(stream);
      if (cnt != nullptr && size_t(ws_slots * slices) * 512 <= kSplitWsFloats && size_t(ws_slots) <= kSplitTiles) {
        q.split_ws = ws;
        q.split_cnt = cnt;
        if (c.streamk) streamk_launches.fetch_add(1, std::memory_order_relaxed);
        launch(f, dim3(unsigned(grid)), c.threads, c.smem, stream, q);
        return;
      }
      const int li = c.tail_k == kConfigs[size_t(kStreamWgLean)].tail_k ? kStreamWgLean : kStreamWgLean8;
      const TileConfig& lean = kConfigs[size_t(li)];
      const int64_t lean_slots = int64_t(setup().sm_count) * setup().stream_blocks[size_t(li)];
      launch(lean.fn[f32 ? 1 : 0][1][rows8 ? 1 : 0],
             dim3(unsigned(stream_grid_blocks(t, lean_slots, setup().stream_balance))), lean.threads, lean.smem, stream, q);
      return;
    }
    launch(f, dim3(unsigned(stream_grid_blocks(t, slots, setup().stream_balance))), c.threads, c.smem, stream, q);
  } else if (c.cluster)
    launch_clustered(unsigned(cluster), f, dim3(unsigned(tiles * cluster), 1, batch), c.threads, c.smem, stream, p);
  else
    launch(f, dim3(unsigned(tiles), 1, batch), c.threads, std::max(c.smem, smem_at_least), stream, p);
}

// The slice sums' scratch, also holding the TMA kernel's gathered A rows (try_tma_grouped): one
// grow-only device block per stream (launches on one stream run in order, so they share it). Grown only outside a stream capture: inside one, a launch that does
// not fit returns null and the caller runs the plain launch of the same config (same bits). A
// model's first decode step runs eagerly with the step's shapes, so its capture finds the block
// big enough. (Stream-ordered cudaMallocAsync was the first version: inside decode graphs every
// call got its own allocation node, and peak memory of the 128 x 1024 workload rose by 4 GiB.)
struct ScratchBlock {
  void* p = nullptr;
  size_t bytes = 0;
  int* tail_counter = nullptr;  // gemm_add_rmsnorm's block counter (zero between launches)
  float* split_ws = nullptr;      // the split lean loop's slice sums (stream_split_scratch)
  int* split_counters = nullptr;  // and its per-tile arrivals (zero between launches)
};
std::mutex scratch_mu;
std::map<std::pair<int, cudaStream_t>, ScratchBlock> scratch_blocks;  // (device, stream); <= 1 GiB each
// Blocks freed to make larger ones (gemm_scratch_moves: graphs captured before hold the old address).
std::atomic<uint64_t> scratch_moves{0};

// Whether a capture is recording the stream (scratch cannot be made then: the caller falls back).
bool capturing(cudaStream_t stream) {
  cudaStreamCaptureStatus cap = cudaStreamCaptureStatusNone;
  check_cuda(cudaStreamIsCapturing(stream, &cap), "gemm", "cudaStreamIsCapturing");
  return cap != cudaStreamCaptureStatusNone;
}

float* stream_scratch(size_t bytes, cudaStream_t stream) {
  int dev = 0;
  check_cuda(cudaGetDevice(&dev), "gemm", "cudaGetDevice");
  std::lock_guard<std::mutex> lock(scratch_mu);
  ScratchBlock& b = scratch_blocks[{dev, stream}];
  if (b.bytes >= bytes) return static_cast<float*>(b.p);
  if (capturing(stream)) return nullptr;
  check_cuda(cudaStreamSynchronize(stream), "gemm", "cudaStreamSynchronize (slice scratch)");
  if (b.p) {
    check_cuda(cudaFree(b.p), "gemm", "cudaFree (slice scratch)");
    scratch_moves.fetch_add(1);
  }
  b.p = nullptr;
  b.bytes = 0;
  check_cuda(cudaMalloc(&b.p, bytes), "gemm", "cudaMalloc (slice scratch)");
  b.bytes = bytes;
  return static_cast<float*>(b.p);
}

// The stream's tail counter (kern::splitk_body's tails), zeroed once; null inside a capture
// before the stream's first eager call made it (the caller then runs the plain launches).
int* stream_tail_counter(cudaStream_t stream) {
  int dev = 0;
  check_cuda(cudaGetDevice(&dev), "gemm", "cudaGetDevice");
  std::lock_guard<std::mutex> lock(scratch_mu);
  ScratchBlock& b = scratch_blocks[{dev, stream}];
  if (b.tail_counter != nullptr) return b.tail_counter;
  if (capturing(stream)) return nullptr;
  check_cuda(cudaMalloc(&b.tail_counter, sizeof(int)), "gemm", "cudaMalloc (tail counter)");
  check_cuda(cudaMemset(b.tail_counter, 0, sizeof(int)), "gemm", "cudaMemset (tail counter)");
  return b.tail_counter;
}

// The split lean loop's workspace (kern::MmaGemmParams::split_ws, split_cnt): one fixed block
// per stream, made once (outside a capture) and never moved, because decode graphs keep its
// address (the slice scratch above may grow and move after a capture, so it cannot serve them).
// The counters are zeroed when made; each launch leaves them zero.
std::pair<float*, int*> stream_split_scratch(cudaStream_t stream) {
  int dev = 0;
  check_cuda(cudaGetDevice(&dev), "gemm", "cudaGetDevice");
  std::lock_guard<std::mutex> lock(scratch_mu);
  ScratchBlock& b = scratch_blocks[{dev, stream}];
  if (b.split_counters != nullptr) return {b.split_ws, b.split_counters};
  if (capturing(stream)) return {nullptr, nullptr};
  check_cuda(cudaMalloc(&b.split_ws, kSplitWsFloats * 4), "gemm", "cudaMalloc (split workspace)");
  check_cuda(cudaMalloc(&b.split_counters, kSplitTiles * sizeof(int)), "gemm", "cudaMalloc (split counters)");
  check_cuda(cudaMemset(b.split_counters, 0, kSplitTiles * sizeof(int)), "gemm", "cudaMemset (split counters)");
  check_cuda(cudaStreamSynchronize(stream), "gemm", "cudaStreamSynchronize (split counters)");
  return {b.split_ws, b.split_counters};
}

// A sliced launch (kern::MmaGemmParams::slice_stride): fp32 slice sums [slices][rows][N] in the
// stream's scratch, then the ordered reduce into out. rows_total: grouped problems'
// &offsets[groups] (device), null for dense. false: no scratch (inside a capture), nothing ran.
bool launch_sliced(const TileConfig& c, const kern::MmaGemmParams& p, int64_t tiles, int slices, int rows, int N,
                   bool f32, bool async, void* out, int64_t os, const int32_t* rows_total, cudaStream_t stream,
                   const char* op) {
  const int64_t per_slice = int64_t(rows) * N;
  float* ws = stream_scratch(size_t(slices) * size_t(per_slice) * 4, stream);
  if (ws == nullptr) return false;
  kern::MmaGemmParams ps = p;
  ps.out = ws;
  ps.os = N;
  ps.slice_stride = per_slice;
  ps.pair_store = N % 2 == 0;
  launch(c.fn[1][async ? 1 : 0][0], dim3(unsigned(tiles), unsigned(slices), 1), c.threads, c.smem, stream, ps);
  check_launch(op);
  const unsigned blocks = unsigned((per_slice + 255) / 256);
  if (f32)
    launch(kern::gemm_slice_reduce_kernel<true>, blocks, 256, 0, stream, ws, per_slice, slices, rows, N, out, os, rows_total);
  else
    launch(kern::gemm_slice_reduce_kernel<false>, blocks, 256, 0, stream, ws, per_slice, slices, rows, N, out, os, rows_total);
  check_launch(op);
  return true;
}

// ---- the TMA kernel (kernels/gemm_tma.cuh) ------------------------------------------------------
// Gathered A rows (grouped problems with x_rows) live in the stream's scratch block; larger
// problems run the cp.async kernel of the same tile (same bits). A prefill chunk of 8,192 tokens
// gathers 49,152 rows x 2,048 = 192 MiB (the benchmark's 32,768-token case 768 MiB).
constexpr size_t kTmaGatherMaxBytes = size_t(1) << 30;

// A 3D bf16 tensor map for the TMA kernel: dims innermost first (K, rows, batch or groups),
// byte strides of the outer two, box 64 (K) x box_rows x 1, the ring's 128-byte swizzle, zeros
// outside the tensor. false: the driver refused (alignment, sizes): the caller runs the cp.async
// kernel.
bool encode_map(CUtensorMap& m, const void* base, const cuuint64_t (&dims)[3], const cuuint64_t (&strides)[2],
                uint32_t box_rows) {
  const cuuint32_t box[3] = {64, box_rows, 1}, unit[3] = {1, 1, 1};
  return setup().encode_map(&m, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 3, const_cast<void*>(base), dims,
                            strides, box, unit, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                            CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

// Persistent (the default): one block per SM walks the tiles blockIdx.x + i * gridDim.x, its
// producer warp filling the ring with the next tile's first steps while the consumers store
// the last one. ATLAS_GEMM_TMA_PERSISTENT=0: one block per tile (the same kernel and bits; for
// measurements).
void launch_tma(const CUtensorMap& ma, const CUtensorMap& mb, kern::MmaGemmParams p, int64_t tiles,
                unsigned batch, bool f32, cudaStream_t stream) {
  using T = CfgTma192;
  const int64_t total = tiles * int64_t(batch);
  p.tiles_total = int(total);
  const int cap = tma_blocks_cap.load();
  const int64_t blocks =
      setup().tma_persistent ? std::min<int64_t>(total, cap > 0 ? cap : setup().sm_count) : total;
  const dim3 grid(unsigned(blocks), 1, 1);
  if (f32)
    launch(kern::gemm_tma_kernel<T, true>, grid, T::THREADS, T::SMEM_BYTES, stream, ma, mb, p);
  else
    launch(kern::gemm_tma_kernel<T, false>, grid, T::THREADS, T::SMEM_BYTES, stream, ma, mb, p);
}

// Dense (the caller checked the async path): x [batch][M][K] (row stride xs, batch stride
// x_batch_stride), w [batch][N][K] (ws, w_batch_stride). false: not launched (no TMA here, or
// the driver refused a map).
bool try_tma_dense(const GemmArgs& a, const kern::MmaGemmParams& p, int64_t xs, int64_t ws, int64_t tiles, bool f32,
                   cudaStream_t stream) {
  if (!setup().encode_map || tiles * a.batch > int64_t(INT32_MAX)) return false;  // (pids are int)
  CUtensorMap ma, mb;
  const cuuint64_t da[3] = {cuuint64_t(a.K), cuuint64_t(a.M), cuuint64_t(a.batch)};
  const cuuint64_t sa[2] = {cuuint64_t(xs) * 2, cuuint64_t(a.batch > 1 ? a.x_batch_stride : xs * a.M) * 2};
  const cuuint64_t db[3] = {cuuint64_t(a.K), cuuint64_t(a.N), cuuint64_t(a.batch)};
  const cuuint64_t sb[2] = {cuuint64_t(ws) * 2, cuuint64_t(a.batch > 1 ? a.w_batch_stride : ws * a.N) * 2};
  if (!encode_map(ma, a.x, da, sa, CfgTma192::BM) || !encode_map(mb, a.w, db, sb, 64)) return false;
  launch_tma(ma, mb, p, tiles, unsigned(a.batch), f32, stream);
  return true;
}

// Grouped (async path): group weights at a.w_base + g * a.w_group_stride; A rows gathered into
// the stream's scratch first where x_rows is set (the tensor copy reads whole boxes of rows).
bool try_tma_grouped(const GroupedGemmArgs& a, const kern::MmaGemmParams& p, int64_t xs, int64_t ws, int64_t tiles,
                     bool f32, cudaStream_t stream, const char* op) {
  const GemmSetup& s = setup();
  if (!s.encode_map || a.w_base == nullptr) return false;
  const void* ax = a.x;
  int64_t axs = xs, a_rows = a.x_rows_limit > 0 ? a.x_rows_limit : a.max_rows;
  uint16_t* gathered = nullptr;
  if (a.x_rows != nullptr) {
    const size_t bytes = size_t(a.max_rows) * size_t(a.K) * 2;
    if (bytes > kTmaGatherMaxBytes) return false;
    gathered = reinterpret_cast<uint16_t*>(stream_scratch(bytes, stream));
    if (gathered == nullptr) return false;  // inside a capture and the scratch too small
    ax = gathered;
    axs = a.K;
    a_rows = a.max_rows;
  }
  CUtensorMap ma, mb;
  const cuuint64_t da[3] = {cuuint64_t(a.K), cuuint64_t(a_rows), 1};
  const cuuint64_t sa[2] = {cuuint64_t(axs) * 2, cuuint64_t(axs * a_rows) * 2};
  const cuuint64_t db[3] = {cuuint64_t(a.K), cuuint64_t(a.N), cuuint64_t(a.groups)};
  const cuuint64_t sb[2] = {cuuint64_t(ws) * 2, cuuint64_t(a.w_group_stride) * 2};
  if (!encode_map(ma, ax, da, sa, CfgTma192::BM) || !encode_map(mb, a.w_base, db, sb, 64)) return false;
  if (gathered != nullptr) {
    launch(kern::gather_rows_kernel, unsigned(a.max_rows), 256, 0, stream, a.x, xs, a.x_rows, a.x_rows_limit,
           a.offsets + a.groups, a.K, gathered, s.error_flag);
    check_launch(op);
  }
  kern::MmaGemmParams q = p;
  q.w_group_base = a.w_base;
  q.w_group_stride = a.w_group_stride;
  launch_tma(ma, mb, q, tiles, 1, f32, stream);
  return true;
}

}  // namespace

bool gemm_tma_available() { return setup().encode_map != nullptr; }

void gemm_set_tma_blocks(int blocks) {
  require(blocks >= 0, "gemm_set_tma_blocks", "blocks", "must be >= 0, got " + std::to_string(blocks));
  tma_blocks_cap.store(blocks);
}

void gemm_prepare_stream(Stream stream) {
  const cudaStream_t s = stream_of(stream);
  const size_t bytes = lt().workspace_bytes;
  int dev = 0;
  check_cuda(cudaGetDevice(&dev), "gemm", "cudaGetDevice");
  std::lock_guard<std::mutex> lock(lt_mutex);
  if (lt_stream_workspaces.count({dev, s})) return;
  void* p = nullptr;
  check_cuda(cudaMalloc(&p, bytes), "gemm", "cudaMalloc (stream workspace)");
  lt_stream_workspaces[{dev, s}] = p;
}

uint64_t gemm_scratch_moves() { return scratch_moves.load(); }

void detail::gemm_release_stream(cudaStream_t s) noexcept {
  try {
    int dev = 0;
    if (cudaGetDevice(&dev) != cudaSuccess) return;
    {
      std::lock_guard<std::mutex> lock(lt_mutex);
      auto it = lt_stream_workspaces.find({dev, s});
      if (it != lt_stream_workspaces.end()) {
        cudaStreamSynchronize(s);
        cudaFree(it->second);
        lt_stream_workspaces.erase(it);
      }
    }
    std::lock_guard<std::mutex> lock(scratch_mu);
    auto it = scratch_blocks.find({dev, s});
    if (it == scratch_blocks.end()) return;
    cudaStreamSynchronize(s);
    cudaFree(it->second.p);
    cudaFree(it->second.tail_counter);
    cudaFree(it->second.split_ws);
    cudaFree(it->second.split_counters);
    scratch_blocks.erase(it);
  } catch (...) {
  }
}

int gemm_config_count() { return int(kConfigs.size()); }

std::string gemm_config_name(int config) {
  if (config < 0 || config >= int(kConfigs.size()))
    arg_error("gemm_config_name", "config", "no config " + std::to_string(config));
  return kConfigs[size_t(config)].name;
}

void gemm_force_config(int config) {
  if (config < -1 || config >= int(kConfigs.size()))
    arg_error("gemm_force_config", "config",
              "expected -1 (automatic) or 0.." + std::to_string(kConfigs.size() - 1) + ", got " +
                  std::to_string(config));
  forced_config.store(config);
}

void set_gemm_weight_evict_first(bool on) { g_weight_evict_first.store(on ? 1 : 0); }
void gemm_block_stamps_start(size_t capacity) {
  require(capacity > 0 && capacity <= (size_t(1) << 24) && (capacity & (capacity - 1)) == 0, "gemm_block_stamps_start",
          "capacity", "a power of two from 1 to 16,777,216, got " + std::to_string(capacity));
  (void)setup();  // the GEMMs' first-use setup (ATLAS_BLOCK_STAMPS) before this ring replaces its
  std::lock_guard<std::mutex> lock(stamp_mu);
  start_stamps_locked(capacity);
}
std::vector<BlockStampRecord> gemm_block_stamps_take() {
  std::lock_guard<std::mutex> lock(stamp_mu);
  return take_stamps_locked();
}
void gemm_block_stamps_stop() {
  std::lock_guard<std::mutex> lock(stamp_mu);
  release_stamps_locked();
  stamp_path.clear();  // (nothing left for the exit handler to write)
}
bool gemm_weight_evict_first() { return weight_evict_first(); }

int gemm_chosen_config(const GemmArgs& a) {
  const int64_t xs = a.x_stride ? a.x_stride : a.K, ws = a.w_stride ? a.w_stride : a.K;
  return dense_config(a, dense_async(a, xs, ws), setup().sm_count);
}

int grouped_gemm_chosen_config(const GroupedGemmArgs& a) {
  const int64_t xs = a.x_stride ? a.x_stride : a.K, ws = a.w_stride ? a.w_stride : a.K;
  if (a.groups < 1 || a.max_rows < 1) return -1;
  return grouped_config(a, grouped_async(a, xs, ws), setup().sm_count);
}

// The host checks of a fused gate|up request (GemmArgs / GroupedGemmArgs::gated).
template <class A>
void require_gated(const A& a, const char* op) {
  require(a.gated >= 0, op, "gated", "must be >= 0, got " + std::to_string(a.gated));
  if (a.gated == 0) return;
  require(a.N == 2 * a.gated, op, "gated", "N must be 2 * gated (gate | up), got N=" + std::to_string(a.N) +
                                               " gated=" + std::to_string(a.gated));
  require(a.out_type == OutType::bf16 && a.out_stride == 0, op, "gated", "needs a dense bf16 out");
  require(a.gated_scratch != nullptr, op, "gated_scratch", "must be set with gated");
}
// A config whose kernel takes MmaGemmParams::gated (the table-driven ones), in a plain launch.
bool fuses_gated(const TileConfig& c) { return !c.splitk && !c.sliced; }
// A gated call the chosen launch cannot fuse: the product (gated cleared) into the scratch, then
// silu_gate over `rows` rows: the bits the fused epilogue reproduces.
template <class A, class Run>
void run_unfused_gated(const A& a, int rows, Run run) {
  A b = a;
  b.gated = 0;
  b.out = a.gated_scratch;
  run(b);
  silu_gate({.gate = a.gated_scratch, .up = a.gated_scratch + a.gated, .out = static_cast<uint16_t*>(a.out),
             .rows = rows, .width = a.gated, .in_stride = a.N, .stream = a.stream});
}

// GemmArgs / GroupedGemmArgs::next's checks (gemm() and grouped_gemm() make them on entry):
// dense takes w only, grouped w_groups only; bytes > 0, a multiple of 128; at 0-4; grouped, at
// most kern::kNextMaxGroups groups.
void check_next(const L2NextWeights& n, bool grouped, int groups, const char* op) {
  if (n.w == nullptr && n.w_groups == nullptr) return;
  require(grouped ? n.w == nullptr : n.w_groups == nullptr, op, "next",
          grouped ? "a grouped GEMM's next weights are w_groups (per group), not w"
                  : "a dense GEMM's next weights are w, not w_groups");
  require(n.bytes > 0 && n.bytes % 128 == 0, op, "next.bytes",
          "must be a positive multiple of 128, got " + std::to_string(n.bytes));
  require(n.at >= 0 && n.at <= 4, op, "next.at", "must be 0-4 (quarters of a block's loop), got " + std::to_string(n.at));
  require(!grouped || groups <= kern::kNextMaxGroups, op, "next",
          "at most " + std::to_string(kern::kNextMaxGroups) + " groups, got " + std::to_string(groups));
}
// ... and into the kernel parameters (only the lean stream kernel reads them; no hint: next_at
// stays -1).
void set_next(kern::MmaGemmParams& p, const L2NextWeights& n) {
  if (n.w == nullptr && n.w_groups == nullptr) return;
  p.next_w = n.w;
  p.next_w_groups = n.w_groups;
  p.next_bytes = n.bytes;
  p.next_at = n.at;
}

// The kernel parameters of a dense batch-invariant gemm() (`m_tiles` x `n_tiles` tiles of the
// chosen config; strides resolved).
kern::MmaGemmParams dense_params(const GemmArgs& a, int64_t xs, int64_t ws, int64_t os, int64_t m_tiles,
                                 int64_t n_tiles) {
  const size_t elt = a.out_type == OutType::f32 ? 4 : 2;
  kern::MmaGemmParams p;
  p.x = a.x;
  p.w = a.w;
  p.out = a.out;
  p.xs = xs;
  p.ws = ws;
  p.os = os;
  p.x_bs = a.x_batch_stride;
  p.w_bs = a.w_batch_stride;
  p.o_bs = a.out_batch_stride;
  p.M = a.M;
  p.N = a.N;
  p.K = a.K;
  p.m_tiles = int(m_tiles);
  p.n_tiles = int(n_tiles);
  p.error_flag = setup().error_flag;
  p.pair_store = (reinterpret_cast<uintptr_t>(a.out) % (2 * elt)) == 0 && os % 2 == 0 &&
                 (a.batch == 1 || a.out_batch_stride % 2 == 0);
  // Under launch overlap the blocks pull their weights into L2 while the kernel before them runs
  // (kern::prefetch_weights_l2): the weights of a dense GEMM are never an earlier kernel's output.
  // The staged split-K kernel copies its first slices into shared memory then (2,
  // ATLAS_GEMM_STAGE_EARLY; the other kernels read any value > 0 as 1).
  p.prefetch = pdl_enabled() ? (setup().stage_early ? 2 : 1) : 0;
  // ... and the cluster kernel its whole slice, at decode sizes only: on the seed grid's M = 128
  // steps it measured slower (7.20 vs 7.08 s, session 22), where several m-tiles read each slice.
  p.cluster_early = setup().cluster_early && m_tiles == 1 && a.M <= 16 ? 1 : 0;
  // Only where each weight row is read by one block row (one m-tile): with two or more, a line
  // marked evict_first may leave before the second tile reads it (session 17, the seed grid's
  // M = 128 steps on 64-row tiles: 7.32 s with the hint on every dense GEMM vs 7.12 without).
  p.l2_evict_first = weight_evict_first() && m_tiles == 1 ? 1 : 0;
  if (a.gated > 0) {  // a fusing config in a plain launch (the caller checked): the activation out
    p.gated = a.gated;
    p.os = a.gated;
  }
  set_next(p, a.next);
  return p;
}

void gemm(const GemmArgs& a) {
  const char* op = "gemm";
  require_gemm_args(a, op);
  require_gated(a, op);
  require(a.gated == 0 || a.batch == 1, op, "gated", "needs batch 1");
  check_next(a.next, false, 0, op);
  if (a.M == 0) return;
  const auto unfused = [&] { run_unfused_gated(a, a.M, [](const GemmArgs& b) { gemm(b); }); };
  if (a.gated > 0 && a.mode != GemmMode::batch_invariant) return unfused();
  const auto [xs, ws, os] = row_strides(a);
  const cudaStream_t stream = stream_of(a.stream);
  const bool f32 = a.out_type == OutType::f32;
  if (a.mode == GemmMode::fast || a.mode == GemmMode::cublaslt_pinned) {
    gemm_cublaslt(a, xs, ws, os, a.mode == GemmMode::cublaslt_pinned);
    return;
  }
  if (a.mode == GemmMode::fma_chain) {
    require(ceil_div(a.M, kern::kGemmBM) <= 65535, op, "M", "too many rows for one fma_chain launch");
    const dim3 grid(unsigned(ceil_div(a.N, kern::kGemmBN)), unsigned(ceil_div(a.M, kern::kGemmBM)), unsigned(a.batch));
    if (f32)
      launch(kern::gemm_invariant_kernel<true>, grid, kern::kGemmThreads, 0, stream,
          a.x, a.w, a.out, a.M, a.N, a.K, xs, ws, os, a.x_batch_stride, a.w_batch_stride, a.out_batch_stride);
    else
      launch(kern::gemm_invariant_kernel<false>, grid, kern::kGemmThreads, 0, stream,
          a.x, a.w, a.out, a.M, a.N, a.K, xs, ws, os, a.x_batch_stride, a.w_batch_stride, a.out_batch_stride);
    check_launch(op);
    return;
  }
  require(a.mode == GemmMode::batch_invariant, op, "mode", "unknown GemmMode");
  const GemmSetup& s = setup();
  // The 16-byte cp.async path needs every row start 16-byte aligned: K, strides and base
  // pointers in multiples of 8 bf16. Anything else takes the predicated path (same bits).
  const bool async = dense_async(a, xs, ws);
  const int ci = dense_config(a, async, s.sm_count);
  const TileConfig& c = kConfigs[size_t(ci)];
  const bool sliced = use_sliced(a, c, async, s.sm_count);
  if (a.gated > 0 && (!fuses_gated(c) || sliced)) return unfused();
  const int cluster = cluster_blocks(ci, a.K);  // 0 unless a cluster config
  const int64_t m_tiles = ceil_div(a.M, c.bm), n_tiles = ceil_div(a.N, c.bn);
  require(m_tiles * n_tiles * std::max(cluster, 1) <= int64_t(INT32_MAX), op, "M", "too many tiles for one launch");
  kern::MmaGemmParams p = dense_params(a, xs, ws, os, m_tiles, n_tiles);
  if (sliced &&
      launch_sliced(c, p, m_tiles * n_tiles, int(ceil_div(a.K, kern::kSliceK)), a.M, a.N, f32, async, a.out, os,
                    nullptr, stream, op))
    return;
  if (c.tma && async && try_tma_dense(a, p, xs, ws, m_tiles * n_tiles, f32, stream)) {
    check_launch(op);
    return;
  }
  if (ci == kCluster16 && !f32) p.phase_clocks = s.cluster_clocks;  // (null unless ATLAS_PHASE_CLOCKS)
  launch_mma(c, p, m_tiles * n_tiles, unsigned(a.batch), f32, async, a.M <= 8, cluster, stream);
  check_launch(op);
}

void grouped_gemm(const GroupedGemmArgs& a) {
  const char* op = "grouped_gemm";
  require_grouped_args(a, op);
  require_gated(a, op);
  check_next(a.next, true, a.groups, op);
  require(a.w_base == nullptr || a.w_group_stride >= int64_t(a.N) * (a.w_stride ? a.w_stride : a.K), op,
          "w_group_stride", "with w_base, must be >= N * (w row stride) (the groups' weights do not overlap), got " +
                                std::to_string(a.w_group_stride));
  if (a.max_rows == 0) return;
  const GemmSetup& s = setup();
  const auto [xs, ws, os] = row_strides(a);
  const bool f32 = a.out_type == OutType::f32;
  const bool async = grouped_async(a, xs, ws);
  const int ci = grouped_config(a, async, s.sm_count);
  const TileConfig& c = kConfigs[size_t(ci)];
  if (a.gated > 0 && !fuses_gated(c)) {
    // Every row the bound allows (rows past offsets[groups] are never read by the down projection).
    run_unfused_gated(a, a.max_rows, [](const GroupedGemmArgs& b) { grouped_gemm(b); });
    return;
  }
  const int cluster = cluster_blocks(ci, a.K);  // 0 unless a cluster config
  const int64_t y_tiles = grouped_y_tiles(a.max_rows, c.bm, a.groups, s.tight_tiles), n_tiles = ceil_div(a.N, c.bn);
  require(y_tiles * n_tiles * std::max(cluster, 1) <= int64_t(INT32_MAX), op, "max_rows",
          "too many tiles for one launch");
  const size_t elt = f32 ? 4 : 2;
  kern::MmaGemmParams p;
  p.x = a.x;
  p.out = a.out;
  p.w_groups = a.w;
  p.offsets = a.offsets;
  p.x_rows = a.x_rows;
  p.xs = xs;
  p.ws = ws;
  p.os = os;
  p.x_rows_limit = a.x_rows_limit;
  p.N = a.N;
  p.K = a.K;
  p.m_tiles = int(y_tiles);
  p.n_tiles = int(n_tiles);
  p.groups = a.groups;
  p.max_rows = a.max_rows;
  p.error_flag = s.error_flag;
  p.pair_store = (reinterpret_cast<uintptr_t>(a.out) % (2 * elt)) == 0 && os % 2 == 0;
  p.l2_evict_first = weight_evict_first() ? 1 : 0;
  set_next(p, a.next);
  if (a.gated > 0) {  // a fusing config (never sliced): the activation out
    p.gated = a.gated;
    p.os = a.gated;
  }
  // The one token's routing again in the launch (GroupedSelfRoute): only where it is the whole
  // problem (k rows, k <= groups <= 64, greedy); launch_mma takes it where the config has it.
  const GroupedSelfRoute& r = a.self_route;
  if (r.logits != nullptr && a.groups <= kern::LeanTable::kMaxGroups && r.k >= 1 && r.k <= a.groups &&
      r.k <= kern::kRouterMaxK && a.max_rows == r.k && !f32 && !release_first(kRfRoute) && !a.order.wait_first) {
    p.route_logits = r.logits;
    p.route_k = r.k;
    p.route_norm = r.norm_topk_prob ? 1 : 0;
    p.route_scaling = r.scaling;
  }
  const int slices = int(ceil_div(a.K, kern::kSliceK));
  {
    // wait_first on the sliced and TMA launches (no wait-first instance): without launch overlap.
    std::optional<PlainLaunchScope> plain;
    if (a.order.wait_first) plain.emplace(true);
    if (c.sliced && async && slices > 1 &&
        size_t(slices) * size_t(a.max_rows) * size_t(a.N) * 4 <= kSlicedMaxWorkspace &&
        launch_sliced(c, p, y_tiles * n_tiles, slices, a.max_rows, a.N, f32, async, a.out, os, a.offsets + a.groups,
                      stream_of(a.stream), op))
      return;
    if (c.tma && async && try_tma_grouped(a, p, xs, ws, y_tiles * n_tiles, f32, stream_of(a.stream), op)) {
      check_launch(op);
      return;
    }
  }
  // ATLAS_GEMM_DOWN_BLOCKS_PER_SM: the routed down's launch with more shared memory (GemmSetup).
  const bool few_down = a.gated == 0 && &c == &kConfigs[size_t(grouped_few_down_config())];
  launch_mma(c, p, y_tiles * n_tiles, 1, f32, async, a.max_rows <= 8, cluster, stream_of(a.stream),
             few_down ? s.down_smem : 0,
             a.order);
  check_launch(op);
}
int64_t grouped_wait_first_launches() { return wait_first_launches.load(); }
int64_t grouped_early_weight_launches() { return early_weight_launches.load(); }

// Where gemm(a) would run the staged 8-warp split-K kernel (dense, 16-byte rows): that launch's
// parameters and shape (one block per column tile; the tails' and the prologue's kernels are its
// instantiations); nullopt otherwise.
struct StagedSplitK {
  kern::MmaGemmParams p;
  unsigned blocks;
  unsigned threads;
};
std::optional<StagedSplitK> staged_splitk(const GemmArgs& a) {
  const auto [xs, ws, os] = row_strides(a);
  const bool async = dense_async(a, xs, ws);
  if (!async || dense_config(a, async, setup().sm_count) != kSplitK8Staged) return std::nullopt;
  const TileConfig& c = kConfigs[size_t(kSplitK8Staged)];
  const int64_t n_tiles = ceil_div(a.N, c.bn);
  return StagedSplitK{.p = dense_params(a, xs, ws, os, 1, n_tiles), .blocks = unsigned(n_tiles),
                      .threads = unsigned(c.threads)};
}

// The one-row GEMM a on the staged split-K kernel with the tail make_tail(counter) builds
// (kernels/gemm_tail.cuh), where gemm(a) would run that config and the stream's tail counter
// exists; false (nothing launched) otherwise. kOutF32: a's output is fp32.
template <bool kOutF32, class MakeTail>
bool launch_splitk_tail(const GemmArgs& a, const char* op, const MakeTail& make_tail) {
  const std::optional<StagedSplitK> k = staged_splitk(a);
  if (!k) return false;
  const cudaStream_t stream = stream_of(a.stream);
  int* counter = stream_tail_counter(stream);
  if (counter == nullptr) return false;
  using Tail = decltype(make_tail(counter));
  const Tail tail = make_tail(counter);
  launch(kern::gemm_splitk_tail_kernel<CfgS8, Tail, kOutF32>, dim3(k->blocks), k->threads, 0, stream, k->p, tail);
  check_launch(op);
  return true;
}

// A switch's mode: the tests' override where set (>= 0), else the environment's setting.
int mode_or_override(const std::atomic<int>& override_mode, int setting) {
  const int forced = override_mode.load();
  return forced >= 0 ? forced : setting;
}
// A tail's switch: the tests' override (1 on, 0 off) where set, else the environment's setting.
bool tail_on(const std::atomic<int>& override_mode, bool setting) {
  return mode_or_override(override_mode, setting ? 1 : 0) == 1;
}

// o_proj's launch that also adds and norms (kernels/gemm_tail.cuh): where gemm(a) would run the
// staged 8-warp split-K kernel on one row (o_proj at a batch-1 decode step), that kernel with
// AddRmsNormTail; the last block runs add_rmsnorm's arithmetic on the finished row.
bool gemm_add_rmsnorm(const GemmArgs& a, const GemmAddRmsNormArgs& t) {
  const char* op = "gemm_add_rmsnorm";
  // Off (the default): nothing to check here, the caller's gemm() checks its arguments.
  if (!tail_on(tails_override, setup().tails)) return false;
  require_gemm_args(a, op);
  require(t.x && t.weight && t.out, op, "pointers", "x, weight and out must be set");
  require(t.out != t.x && t.out != a.out && t.x != a.out, op, "out", "x, out and the GEMM's out must not alias");
  if (a.mode != GemmMode::batch_invariant || a.M != 1 || a.batch != 1 || a.gated != 0 || a.out_type != OutType::bf16 ||
      t.dim != a.N || a.out_stride > a.N)
    return false;
  if (!launch_splitk_tail<false>(a, op, [&](int* counter) {
        return kern::AddRmsNormTail{.x = t.x, .w = t.weight, .out = t.out, .dim = t.dim, .eps = t.eps, .counter = counter};
      }))
    return false;
  ++tailed_launches;
  return true;
}

int64_t gemm_tailed_launches() { return tailed_launches.load(); }

// The router GEMM of one row with the post-attention add + norm inside (kernels/gemm_tail.cuh,
// AddRmsNormPrologue): where gemm(a) would run the staged 8-warp split-K kernel, that kernel
// with every block adding and norming the row itself.
bool gemm_after_add_rmsnorm(const GemmArgs& a, const GemmAfterAddRmsNormArgs& n) {
  const char* op = "gemm_after_add_rmsnorm";
  // Off (the default): nothing to check here, the caller's two calls check their arguments.
  if (gemm_router_norm_mode() == 0) return false;
  require_gemm_args(a, op);
  require(n.x && n.y && n.weight && n.x_out && n.h_out, op, "pointers", "x, y, weight, x_out and h_out must be set");
  require(n.x_out != n.x && n.x_out != n.y && n.h_out != n.x && n.h_out != n.y && n.h_out != n.x_out, op, "x_out",
          "x, y, x_out and h_out must not alias");
  require(a.x == n.h_out, op, "x", "the GEMM must read the norm's output");
  if (a.mode != GemmMode::batch_invariant || a.M != 1 || a.batch != 1 || a.gated != 0 || a.out_type != OutType::f32 ||
      n.dim != a.K || a.K > kern::kWideDim || a.out_stride > a.N)
    return false;
  const std::optional<StagedSplitK> k = staged_splitk(a);
  if (!k) return false;
  launch(kern::gemm_splitk_norm_kernel<CfgS8>, dim3(k->blocks), k->threads, 0, stream_of(a.stream), k->p,
         kern::AddRmsNormPrologue{.x = n.x, .y = n.y, .w = n.weight, .x_out = n.x_out, .h_out = n.h_out,
                                  .dim = n.dim, .eps = n.eps});
  check_launch(op);
  ++router_norm_launches;
  return true;
}
int64_t gemm_router_norm_launches() { return router_norm_launches.load(); }
void gemm_set_router_norm(int mode) { router_norm_override.store(mode < 0 ? -1 : std::min(mode, 2)); }
int gemm_router_norm_mode() { return mode_or_override(router_norm_override, setup().router_norm); }

bool gemm_moe_route(const GemmArgs& a, const RouterArgs& r, const MoePermuteArgs& pm) {
  const char* op = "gemm_moe_route";
  // gemm_set_route_tail's mode where a test set one, else the switches: 2 the cluster route
  // (ATLAS_ROUTE_CLUSTER), 1 the split-K tail (ATLAS_ROUTE_TAIL), 0 neither.
  const int mode = mode_or_override(route_tail_override, setup().route_cluster ? 2 : setup().route_tail ? 1 : 0);
  // Off (the default): nothing to check here, the caller's gemm() and moe_route() check theirs.
  if (mode == 0) return false;
  require_gemm_args(a, op);
  check_route(r, pm, op);
  require(r.logits == a.out, op, "logits", "must be the GEMM's output");
  require(r.stream == a.stream, op, "stream", "the router GEMM and the routing must share a stream");
  // route_permute_kernel's one-token path (RouteTail), after gemm()'s choice for one row.
  if (a.mode != GemmMode::batch_invariant || a.M != 1 || a.batch != 1 || a.gated != 0 || a.out_type != OutType::f32 ||
      a.out_stride > a.N || a.N != r.experts || r.tokens != 1 || r.method != TopkMethod::greedy || r.experts > kern::kRouteOneTokenMaxExperts)
    return false;
  if (mode == 2) {
    // The cluster config's one 64-column tile, one block per K slice (what q|kv_a runs at one
    // row): 16-byte rows, the cluster placeable, N <= 64; under launch overlap only where the
    // kernel takes its early path (weights staged, then wait, then release).
    const auto [xs, ws, os] = row_strides(a);
    const TileConfig& c = kConfigs[size_t(kCluster16)];
    const int cluster = cluster_blocks(kCluster16, a.K);
    if (!dense_async(a, xs, ws) || cluster == 0 || a.N > c.bn) return false;
    const kern::MmaGemmParams p = dense_params(a, xs, ws, os, 1, 1);
    if (pdl_enabled() && !(p.prefetch > 1 && p.cluster_early > 0)) return false;
    launch_clustered(unsigned(cluster), kern::gemm_cluster_route_kernel<CfgC16>, dim3(unsigned(cluster), 1, 1),
                     c.threads, c.smem, stream_of(a.stream), p, kern::RouteTail{.q = route_permute_params(r, pm)});
    check_launch(op);
    ++route_cluster_launches;
    return true;
  }
  if (!launch_splitk_tail<true>(a, op, [&](int* counter) {
        return kern::RouteTail{.q = route_permute_params(r, pm), .counter = counter};
      }))
    return false;
  ++route_tail_launches;
  return true;
}

int64_t gemm_route_tail_launches() { return route_tail_launches.load(); }
int64_t gemm_route_cluster_launches() { return route_cluster_launches.load(); }
int64_t grouped_self_routed_launches() { return self_routed_launches.load(); }
void gemm_set_route_tail(int mode) { route_tail_override.store(mode < 0 ? -1 : std::min(mode, 2)); }

bool gemm_combine_norm_on() { return gemm_combine_mode() > 0; }
bool gemm_combine_norm(const GemmArgs& a, const MoeCombineNormArgsT<uint16_t>& c, uint16_t* x_out,
                       const uint32_t* ready, bool weights_early) {
  const char* op = "gemm_combine_norm";
  // Off (the default): nothing to check here, the caller's two calls check their arguments.
  if (!gemm_combine_norm_on()) return false;
  require_gemm_args(a, op);
  require(c.y_sorted && c.pair_slot && c.topk_weights && c.x && c.weight && c.out && x_out, op, "pointers",
          "y_sorted, pair_slot, topk_weights, x, weight, out and x_out must be set");
  require(x_out != c.x && x_out != c.out && c.out != c.x, op, "x_out", "x, out and x_out must not alias");
  require(a.x == c.out, op, "x", "the GEMM must read the norm's output");
  const auto a4 = [](const void* p) { return (reinterpret_cast<uintptr_t>(p) & 3u) == 0; };
  if (a.mode != GemmMode::batch_invariant || a.M != 1 || a.batch != 1 || a.gated != 0 || a.out_type != OutType::bf16 ||
      c.tokens != 1 || c.k < 1 || c.k > kern::kCombineStageK || c.dim != a.K || a.K % 64 != 0 ||
      a.K > kern::kWideDim || !a4(c.y_sorted) || !a4(c.x) || !a4(c.weight) || !a4(x_out) ||
      (c.addend && !a4(c.addend)))
    return false;
  const auto [xs, ws, os] = row_strides(a);
  const int cluster = cluster_blocks(kCluster16, a.K);
  // (at most 8 blocks: a portable cluster, like the plain kernel's at K = 2048)
  if (!dense_async(a, xs, ws) || cluster == 0 || cluster > 8) return false;
  const TileConfig& cfg = kConfigs[size_t(kCluster16)];
  const int64_t n_tiles = ceil_div(a.N, cfg.bn);
  const kern::MmaGemmParams p = dense_params(a, xs, ws, os, 1, n_tiles);
  const auto run = [&](auto kernel, const auto& pro) {
    launch_clustered(unsigned(cluster), kernel, dim3(unsigned(n_tiles * cluster), 1, 1), cfg.threads, cfg.smem,
                     stream_of(a.stream), p, pro);
  };
  const auto pro = [&](auto kk, auto direct) {
    return kern::CombineNormPrologue<decltype(kk)::value, decltype(direct)::value>{
        .ys = c.y_sorted, .slot = c.pair_slot, .w = c.topk_weights, .k = c.k, .addend = c.addend, .x = c.x,
        .x_out = x_out, .norm_w = c.weight, .h_out = c.out, .dim = c.dim, .eps = c.eps, .ready = ready,
        .early_weights = weights_early ? 1 : 0};
  };
  // One token (checked above): its k pairs are rows 0..k-1 of y_sorted, whatever the slots.
  const bool direct = tail_on(combine_direct_override, setup().combine_direct);
  const auto run_k = [&](auto kk) {
    constexpr int kK = decltype(kk)::value;
    if (direct)
      run(kern::gemm_cluster_combine_kernel<CfgC16, kK, true>, pro(kk, std::true_type{}));
    else
      run(kern::gemm_cluster_combine_kernel<CfgC16, kK, false>, pro(kk, std::false_type{}));
  };
  if (c.k == 6)
    run_k(std::integral_constant<int, 6>{});
  else
    run_k(std::integral_constant<int, 0>{});
  check_launch(op);
  ++combine_norm_launches;
  if (direct) ++combine_direct_launches;
  if (ready) ++combine_flagged_launches;
  if (weights_early && !ready) ++combine_early_launches;
  return true;
}
int64_t gemm_combine_norm_launches() { return combine_norm_launches.load(); }
int64_t gemm_combine_flagged_launches() { return combine_flagged_launches.load(); }
int64_t gemm_combine_early_launches() { return combine_early_launches.load(); }
void gemm_set_combine_norm(int mode) { combine_norm_override.store(mode < 0 ? -1 : std::min(mode, 3)); }
void gemm_set_streamk(int mode) { streamk_override.store(mode < 0 ? -1 : std::min(mode, 3)); }
void gemm_set_streamk_grid(int blocks) { streamk_grid.store(std::max(blocks, 0)); }
int64_t gemm_streamk_launches() { return streamk_launches.load(); }
void gemm_set_combine_direct(int mode) { combine_direct_override.store(mode < 0 ? -1 : std::min(mode, 1)); }
int64_t gemm_combine_direct_launches() { return combine_direct_launches.load(); }
int gemm_combine_mode() { return mode_or_override(combine_norm_override, setup().combine_qkv); }
void gemm_combine_signal(uint32_t* flags, int count, int index, Stream stream) {
  const char* op = "gemm_combine_signal";
  require(flags != nullptr && count > 0 && index >= 0 && index < count, op, "flags",
          "a flag array of count > 0 and an index inside it");
  launch(kern::combine_signal_kernel, 1, 32, 0, stream_of(stream), flags, count, index);
  check_launch(op);
}
bool gemm_with_latent(const GemmArgs& a, const LatentCacheArgsT<uint16_t>& l) {
  const char* op = "gemm_with_latent";
  require_gemm_args(a, op);
  const kern::LatentCacheParams<uint16_t> lp = latent_cache_params(l);
  if (a.M == 0 || l.tokens == 0 || a.mode != GemmMode::batch_invariant || a.gated != 0 ||
      a.out_type != OutType::bf16 || l.latent > kern::kWideDim || a.batch >= 65535)
    return false;
  const auto [xs, ws, os] = row_strides(a);
  const bool async = dense_async(a, xs, ws);
  const GemmSetup& s = setup();
  // The GEMM as gemm() would run it: the tiled 16-row config in a plain launch (what a decode
  // step of a few rows gets for the absorbed query), else the caller's two launches.
  if (!async || dense_config(a, async, s.sm_count) != kTiled16 ||
      use_sliced(a, kConfigs[size_t(kTiled16)], async, s.sm_count))
    return false;
  const TileConfig& c = kConfigs[size_t(kTiled16)];
  const int64_t m_tiles = ceil_div(a.M, c.bm), n_tiles = ceil_div(a.N, c.bn);
  const int64_t tiles = m_tiles * n_tiles;
  const kern::MmaGemmParams p = dense_params(a, xs, ws, os, m_tiles, n_tiles);
  static_assert(CfgD32S2::BM == CfgD32::BM && CfgD32S2::BN == CfgD32::BN &&
                CfgD32S2::THREADS == CfgD32::THREADS);
  launch(kern::gemm_mma_latent_kernel<CfgD32S2>,
         dim3(unsigned(std::max<int64_t>(tiles, l.tokens)), 1, unsigned(a.batch + 1)), CfgD32S2::THREADS,
         CfgD32S2::SMEM_BYTES, stream_of(a.stream), p, lp, a.batch, int(tiles), l.tokens);
  check_launch(op);
  ++latent_launches;
  return true;
}
int64_t gemm_latent_launches() { return latent_launches.load(); }
bool mla_decode_with_value(const MlaDecodeArgs& a, const GemmArgs& v) {
  const char* op = "mla_decode_with_value";
  require_gemm_args(v, op);
  const auto [xs, ws, os] = row_strides(v);
  // v must be the value GEMM over a's output: x = o_lat [rows, heads, latent], one product per
  // head; a few rows (one 16-row tile: the merge runs once per tile and head); the tensor-core
  // attention (its workspace layout); the same stream (the merge follows the attention kernel).
  if (a.impl != MlaImpl::tensor_core || a.rows <= 0 || v.x != a.out || v.M != a.rows || v.K != a.latent ||
      v.batch != a.heads || xs != int64_t(a.heads) * a.latent || v.x_batch_stride != a.latent ||
      a.latent > 4 * kern::kMlaMergeThreads || v.M > CfgD32::BM || stream_of(v.stream) != stream_of(a.stream) ||
      v.mode != GemmMode::batch_invariant || v.gated != 0 || v.out_type != OutType::bf16 || forced_config.load() >= 0 ||
      !dense_async(v, xs, ws))
    return false;
  kern::MlaMergeParams merge{};
  if (!mla_attention_only(a, merge)) return false;
  // Any tile gives the contract's bits; the tiled 16-row one (a thread per 4 merged columns).
  const int64_t n_tiles = ceil_div(v.N, CfgD32::BN);
  const kern::MmaGemmParams p = dense_params(v, xs, ws, os, 1, n_tiles);
  launch(kern::gemm_mma_merge_kernel<CfgD32>, dim3(unsigned(n_tiles), 1, unsigned(v.batch)), CfgD32::THREADS,
         CfgD32::SMEM_BYTES, stream_of(v.stream), p, merge);
  check_launch(op);
  ++merge_launches;
  return true;
}
int64_t mla_merge_value_launches() { return merge_launches.load(); }
void gemm_set_tails(int mode) { tails_override.store(mode < 0 ? -1 : mode > 0 ? 1 : 0); }

namespace detail {

int gemm_streamk_block_of(int64_t unit, int64_t units, int64_t blocks) {
  return kern::streamk_block_of(unit, units, blocks);
}
int gemm_streamk_slot(int tile, int slices, int64_t tiles, int64_t blocks) {
  return kern::streamk_slot(tile, slices, tiles, blocks);
}

bool gemm_stream_balance_default(const std::string& device_name) {
  return device_name.find("H200") != std::string::npos;
}

int64_t stream_grid_blocks(int64_t tiles, int64_t slots, bool balance) {
  if (tiles <= slots || !balance) return std::min(tiles, slots);
  return ceil_div(tiles, ceil_div(tiles, slots));
}

int gemm_stream_setting(const char* value) {
  const std::string v = value == nullptr ? "" : value;
  if (v.empty() || v == "wg") return 1;
  if (v == "3") return 3;
  if (v == "6") return 6;
  if (v == "0") return 0;
  throw Error("cuda: gemm: ATLAS_GEMM_STREAM: expected 0 (off), 3 or 6 (warps per block) or wg (the wgmma config), got '" +
              v + "'");
}

int gemm_streamk_setting(const char* value) {
  const std::string v = value == nullptr ? "" : value;
  if (v.empty() || v == "0") return 0;
  if (v == "wide") return 1;
  if (v == "long") return 2;
  if (v == "all") return 3;
  throw Error("cuda: gemm: ATLAS_GEMM_STREAMK: expected 0 (off), wide (one-row problems of at least one tile per SM), "
              "long (one-row problems of more than 16 K slices) or all, got '" + v + "'");
}

int gemm_streamk_grid_setting(const char* value) {
  const std::string v = value == nullptr ? "" : value;
  if (v.empty()) return 0;
  // (runtime.cu's whole-number switches' idiom; no leading zero)
  const bool digits = v.size() <= 4 && v[0] != '0' && v.find_first_not_of("0123456789") == std::string::npos;
  const int n = digits ? std::stoi(v) : 0;
  if (n < 1 || n > 4096)
    throw Error("cuda: gemm: ATLAS_GEMM_STREAMK_GRID: expected a whole number of blocks from 1 to 4096 (unset: every "
                "resident slot), got '" + v + "'");
  return n;
}

int gemm_stream_lean_setting(const char* value) {
  const std::string v = value == nullptr ? "" : value;
  if (v == "0") return 0;
  if (v.empty() || v == "4") return 4;
  if (v == "6") return 6;
  if (v == "8") return 8;
  if (v == "4/3") return 3;
  throw Error("cuda: gemm: ATLAS_GEMM_STREAM_LEAN: expected 0 (the full loop), 4 or 6 (the lean loop's ring slots), "
              "8 (8 slots of 64-wide steps) or 4/3 (4 slots, 3 steps ahead), got '" + v + "'");
}

std::string block_stamps_setting(const char* value) {
  const std::string v = value == nullptr ? "" : value;
  if (v.empty()) return v;
  const std::filesystem::path dir = std::filesystem::path(v).parent_path();
  std::error_code ec;
  if (!dir.empty() && !std::filesystem::is_directory(dir, ec))
    throw Error("cuda: ATLAS_BLOCK_STAMPS: expected a file in an existing directory, got '" + v + "'");
  if (std::filesystem::is_directory(v, ec))
    throw Error("cuda: ATLAS_BLOCK_STAMPS: expected a file, got the directory '" + v + "'");
  return v;
}

int gemm_stream_grouped_setting(const char* value) {
  const std::string v = value == nullptr ? "" : value;
  if (v.empty() || v == "wg-gate") return 3;
  if (v == "0") return 0;
  if (v == "1") return 1;
  if (v == "wg") return 2;
  if (v == "wg-split") return 4;
  if (v == "split-gate") return 5;
  if (v == "split-gate3") return 6;
  if (v == "wg-gate3") return 7;
  throw Error("cuda: gemm: ATLAS_GEMM_STREAM_GROUPED: expected 0, 1, wg, wg-gate, wg-gate3, wg-split, split-gate or split-gate3, got '" +
              v + "'");
}

int gemm_lean_part_begin(int q, int parts, int K) {
  constexpr int kSteps = kern::kSliceK / CfgWs128::BK;
  const int KT = K / CfgWs128::BK;
  return kern::lean_part_begin(q, parts, (KT + kSteps - 1) / kSteps, KT, kSteps);
}

int gemm_stream_few_setting(const char* value) {
  return config_override_setting(
      "ATLAS_GEMM_STREAM_FEW", value, [](const TileConfig& c) { return !c.grouped_only && !c.tma && !c.sliced; },
      "the name of a dense config other than a TMA or sliced one (see atlas_cuda_bench's sweep)");
}

int gemm_wide_gated_setting(const char* value) {
  return config_override_setting(
      "ATLAS_GEMM_WIDE_GATED", value,
      [](const TileConfig& c) { return !c.grouped_only && !c.tma && fuses_gated(c); },
      "the name of a dense config that fuses the SiLU: not split-K, sliced or TMA (see atlas_cuda_bench's sweep)");
}

int gemm_long_k_setting(const char* value) {
  return config_override_setting(
      "ATLAS_GEMM_LONG_K", value, [](const TileConfig& c) { return !c.grouped_only && !c.tma; },
      "the name of a dense config other than a TMA one (see atlas_cuda_bench's sweep)");
}

int gemm_grouped_many_setting(const char* value) {
  return config_override_setting(
      "ATLAS_GEMM_GROUPED_MANY", value, [](const TileConfig& c) { return !c.splitk && !c.sliced && !c.wgmma; },
      "a tiled config name (see atlas_cuda_bench's sweep)");
}

int gemm_grouped_few_down_setting(const char* value) {
  return config_override_setting(
      "ATLAS_GEMM_GROUPED_FEW_DOWN", value, [](const TileConfig& c) { return !c.wgmma && !c.tma; },
      "the name of a config with mma.sync tiles (tiled, split-K, sliced, cluster or stream; see atlas_cuda_bench's "
      "sweep)");
}

int gemm_splitk_setting(const char* value) {
  return config_override_setting("ATLAS_GEMM_SPLITK", value, [](const TileConfig& c) { return c.splitk; },
                                 "a split-K config name (splitk16x8/8w, splitk16x16/8w, splitk16x8/8w+staged, "
                                 "splitk16x8/2w+staged, splitk16x8/4w+staged)");
}

bool probe_device_code(void (*probe)(int*), const char* what) {
  int* flag = nullptr;
  int have = 0;
  check_cuda(cudaMalloc(&flag, sizeof(int)), what, "cudaMalloc");
  probe<<<1, 1>>>(flag);
  const cudaError_t e = cudaMemcpy(&have, flag, sizeof(int), cudaMemcpyDeviceToHost);
  cudaFree(flag);
  check_cuda(e, what, "probe kernel");
  return have == 1;
}

int64_t grouped_y_tiles(int64_t max_rows, int bm, int64_t groups, bool tight) {
  // Groups of r_g rows (sum <= max_rows) have sum_g ceil(r_g / bm) tiles; ceil(r / bm) <=
  // floor(r / bm) + 1 for r > 0 and the floors add up to at most floor(max_rows / bm), so the
  // tight bound holds too; at most min(groups, max_rows) groups have rows.
  return (tight ? max_rows / bm : ceil_div(max_rows, bm)) + std::min<int64_t>(groups, max_rows);
}

int router_norm_setting(const char* value) {
  const std::string v = value ? value : "";
  if (v.empty() || v == "0") return 0;
  if (v == "1") return 1;
  if (v == "joined") return 2;
  throw Error("cuda: ATLAS_ROUTER_NORM: expected 0, 1 or joined, got '" + v + "'");
}

int combine_qkv_setting(const char* value) {
  const std::string v = value ? value : "";
  if (v == "0") return 0;
  if (v == "1") return 1;
  if (v == "flag") return 2;
  if (v.empty() || v == "event") return 3;
  throw Error("cuda: ATLAS_COMBINE_QKV: expected 0, 1, flag or event, got '" + v + "'");
}

int gemm_down_blocks_setting(const char* value) {
  const std::string v = value ? value : "";
  if (v.empty()) return 3;
  if (v.size() != 1 || v[0] < '1' || v[0] > '4')
    throw Error("cuda: ATLAS_GEMM_DOWN_BLOCKS_PER_SM: expected 1, 2, 3 or 4 (blocks per SM), got '" + v + "'");
  return v[0] - '0';
}

int cluster_capacity(const void* kernel, int cluster_x, int cluster_y, int threads, int smem) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(unsigned(cluster_x), unsigned(cluster_y), 1);
  cfg.blockDim = dim3(unsigned(threads), 1, 1);
  cfg.dynamicSmemBytes = size_t(smem);
  cudaLaunchAttribute attr{};
  attr.id = cudaLaunchAttributeClusterDimension;
  attr.val.clusterDim.x = unsigned(cluster_x);
  attr.val.clusterDim.y = unsigned(cluster_y);
  attr.val.clusterDim.z = 1;
  cfg.attrs = &attr;
  cfg.numAttrs = 1;
  int clusters = 0;
  if (cudaOccupancyMaxActiveClusters(&clusters, kernel, &cfg) != cudaSuccess) {
    (void)cudaGetLastError();  // an unsupported size is an answer, not an error
    return 0;
  }
  return clusters;
}

bool cluster_fits(const void* kernel, int cluster_x, int threads, int smem) {
  return cluster_capacity(kernel, cluster_x, 1, threads, smem) > 0;
}

}  // namespace detail

}  // namespace atlas::cuda
