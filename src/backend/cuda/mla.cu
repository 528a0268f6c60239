// Launchers for MLA attention (absorbed form): the tensor-core kernel (default) and the scalar
// correctness-first kernel (MlaImpl::scalar, the on-device cross-check, and in its f32 form the
// f32 checking mode's attention).
#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <mutex>
#include <string>
#include <type_traits>

#include "backend/cuda/cuda_internal.h"
#include "backend/cuda/kernels/mla_decode.cuh"
#include "backend/cuda/kernels/mla_pattern.cuh"
#include "backend/cuda/kernels/mla_merge.cuh"
#include "backend/cuda/kernels/mla_tc.cuh"

namespace atlas::cuda {

using namespace detail;

static_assert(kMlaLatentMax == kern::kMlaLatentDim && kMlaWidthMax == kern::kMlaWidthDim);
static_assert(kern::kMlaAccStride == kMlaLatentMax);

// Both kernels keep, per (query, split, head), latent accumulators (512 floats) plus m and l:
// the scalar kernel interleaved ([..][514]), the tensor-core one as two regions (acc [..][512],
// then (m, l) [..][2]); the same total.
size_t mla_decode_workspace_floats(int rows, int heads, int max_length, int split_tokens) {
  if (rows <= 0 || heads <= 0 || max_length <= 0 || split_tokens <= 0) return 1;
  const int64_t splits = (int64_t(max_length) + split_tokens - 1) / split_tokens;
  return size_t(int64_t(rows) * splits * heads * kern::kMlaPartial);
}

namespace {

template <class T>
void launch_scalar(const MlaDecodeArgsT<T>& a, int width, int max_splits, cudaStream_t s) {
  const char* op = "mla_decode";
  require(a.split_tokens <= kern::kMlaThreads, op, "split_tokens",
          "must be in [1, 256] for the scalar kernel, got " + std::to_string(a.split_tokens));
  require(max_splits <= 65535, op, "max_length", "too long for the split grid");
  constexpr int dyn = kern::mla_split_dyn_smem<T>();
  if constexpr (dyn > 0) {
    // The f32 query in dynamic shared memory takes the block past 48 KB: raise the limit once,
    // before any launch (so later launches, inside a graph capture too, change no attribute).
    static std::once_flag once;
    std::call_once(once, [] {
      check_cuda(cudaFuncSetAttribute(kern::mla_split_kernel<T>, cudaFuncAttributeMaxDynamicSharedMemorySize, dyn),
                 "mla_decode", "cudaFuncSetAttribute");
    });
  }
  launch(kern::mla_split_kernel<T>, dim3(max_splits, a.rows), kern::kMlaThreads, dyn, s,
      a.q, a.latent_cache, a.cache_row_stride, a.lengths, a.cache_rows, a.max_length, a.heads, a.latent, width,
      a.scale, a.split_tokens, max_splits, a.workspace, error_flag());
  check_launch(op);
  launch(kern::mla_merge_kernel<T>, a.rows, kern::kMlaThreads, 0, s, a.workspace, a.lengths, a.max_length, a.heads,
                                                              a.latent, a.split_tokens, max_splits, a.out);
  check_launch(op);
}

// The dynamic shared-memory limit is raised once per instantiation to what the widest cache
// (576) needs, before any launch, so later launches (inside a CUDA graph capture too) change
// no function attribute.
template <int G, bool kVec, int NST>
void launch_tc_kernel(const kern::MlaTcParams& p, cudaStream_t s) {
  static std::once_flag once;
  std::call_once(once, [] {
    check_cuda(cudaFuncSetAttribute(kern::mla_tc_kernel<G, kVec, NST>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    kern::mla_tc_smem_bytes(G, kMlaWidthMax, NST)),
               "mla_decode", "cudaFuncSetAttribute");
  });
  const dim3 grid(unsigned((p.rows + G - 1) / G), unsigned(p.max_splits));
  launch(kern::mla_tc_kernel<G, kVec, NST>, grid, kern::kMlaTcThreads, kern::mla_tc_smem_bytes(G, p.wp, NST), s, p);
}
template <int G, bool kVec>
void launch_tc_kernel(const kern::MlaTcParams& p, int nst, cudaStream_t s) {
  if constexpr (G == 4)
    launch_tc_kernel<G, kVec, 1>(p, s);  // (64 rows of Q, S and P leave room for one tile buffer)
  else
    nst == 1 ? launch_tc_kernel<G, kVec, 1>(p, s) : launch_tc_kernel<G, kVec, 2>(p, s);
}

// SMs of the current device (a cheap attribute read, no synchronisation: fine inside captures).
int sm_count() {
  int dev = 0, n = 0;
  check_cuda(cudaGetDevice(&dev), "mla_decode", "cudaGetDevice");
  check_cuda(cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev), "mla_decode", "cudaDeviceGetAttribute");
  return n;
}

// The cluster kernel's phase-clock sums under ATLAS_PHASE_CLOCKS=attention, else null: one name
// per phase between its marks (kern::kMlaClusterMarks; the early path's marks, a decode step's).
unsigned long long* cluster_clocks() {
  static unsigned long long* const sums = phase_clock_sums(
      "attention", {"start to the older slots' copies issued", "launch-overlap wait",
                    "query and newest slot copied, every copy landed", "phase 1 (scores)",
                    "row maxima exchanged (barrier 1)", "softmax of the tile, P exchanged (barrier 2)",
                    "pull: P, alphas and sums copied, barrier 3", "l chain and phase 2", "epilogue stores"});
  static_assert(kern::kMlaClusterMarks == 10, "one name per phase between marks");
  return sums;
}

static_assert(kern::kMlaXPull == 1 && kern::kMlaXPush == 2 && kern::kMlaXAsync == 3,
              "MlaDecodeArgs::cluster_exchange and ATLAS_MLA_EXCHANGE's values (mla_exchange_setting)");
using ClusterKernel = void (*)(kern::MlaTcParams);
ClusterKernel cluster_kernel(bool clocks, int exchange) {
  using namespace kern;
  switch (exchange) {
    case kMlaXPush: return clocks ? mla_tc_cluster_kernel<true, kMlaXPush> : mla_tc_cluster_kernel<false, kMlaXPush>;
    case kMlaXAsync: return clocks ? mla_tc_cluster_kernel<true, kMlaXAsync> : mla_tc_cluster_kernel<false, kMlaXAsync>;
    default: return clocks ? mla_tc_cluster_kernel<true, kMlaXPull> : mla_tc_cluster_kernel<false, kMlaXPull>;
  }
}

// The tile-parallel kernel's one-time setup: device code for sm_90, cluster launch, the shared
// memory limit raised to what the widest cache needs (with the pair merge's area), a cluster of
// 4 such blocks placeable (ok), and how many clusters of (4, 2) the device holds at once (the
// pair merge's; 0 where none fits).
struct TileParallelSetup {
  bool ok = false;
  int pair_clusters = 0;
};
const TileParallelSetup& tile_parallel_facts() {
  static const TileParallelSetup facts = [] {
    int dev = 0, cluster_launch = 0;
    check_cuda(cudaGetDevice(&dev), "mla_decode", "cudaGetDevice");
    check_cuda(cudaDeviceGetAttribute(&cluster_launch, cudaDevAttrClusterLaunch, dev), "mla_decode",
               "cudaDeviceGetAttribute(clusterLaunch)");
    if (!cluster_launch || !probe_device_code(kern::mla_tc_cluster_probe_kernel, "mla_decode"))
      return TileParallelSetup{};
    const int smem = kern::mla_tc_cluster_smem_bytes(kMlaWidthMax, true);
    for (const int x : {kern::kMlaXPull, kern::kMlaXPush, kern::kMlaXAsync})
      for (const bool clocks : {false, true})
        check_cuda(cudaFuncSetAttribute(cluster_kernel(clocks, x), cudaFuncAttributeMaxDynamicSharedMemorySize, smem),
                   "mla_decode", "cudaFuncSetAttribute");
    (void)cluster_clocks();  // (allocates outside any capture)
    const void* async = reinterpret_cast<const void*>(kern::mla_tc_cluster_kernel<false, kern::kMlaXAsync>);
    return TileParallelSetup{
        .ok = cluster_fits(reinterpret_cast<const void*>(kern::mla_tc_cluster_kernel<false>), kern::kMlaClusterTiles,
                           kern::kMlaTcThreads, smem),
        .pair_clusters = cluster_capacity(async, kern::kMlaClusterTiles, 2, kern::kMlaTcThreads, smem)};
  }();
  return facts;
}
bool tile_parallel_setup() { return tile_parallel_facts().ok; }

// The tensor-core launch's form: queries per block, 16-byte loads, the walk's grid (blocks) and
// the SMs it is weighed against, the cluster kernel (tp) and its exchange, the pair merge (no
// merge launch); the argument checks before any of it.
struct TcPlan {
  int G = 1;
  bool vec = false, tp = false, pair = false;
  int exchange = 0;
  int64_t blocks = 0;
  int sms = 0;
};
TcPlan plan_tc(const MlaDecodeArgs& a, int width, int max_splits) {
  const char* op = "mla_decode";
  const int G = a.queries_per_block ? a.queries_per_block : (a.cache_rows ? 2 : 1);
  require(G == 1 || G == 2 || G == 4, op, "queries_per_block", "must be 0 (auto), 1, 2 or 4, got " + std::to_string(G));
  require(G != 4 || a.tile_buffers != 2, op, "tile_buffers", "4 queries per block fit one tile buffer only, got 2");
  require(max_splits <= 65535, op, "max_length", "too long for the split grid (max_length / split_tokens > 65535)");
  const bool vec = width % 8 == 0 && a.cache_row_stride % 8 == 0 && reinterpret_cast<uintptr_t>(a.q) % 16 == 0 &&
                   reinterpret_cast<uintptr_t>(a.latent_cache) % 16 == 0;
  // (Host checks before anything touches the device: the error flag below is a device buffer.)
  require(a.cluster_exchange >= 0 && a.cluster_exchange <= 3, op, "cluster_exchange",
          "must be 0 (ATLAS_MLA_EXCHANGE's), 1 (pull), 2 (push) or 3 (async), got " +
              std::to_string(a.cluster_exchange));
  require(a.tile_parallel >= 0 && a.tile_parallel <= 2, op, "tile_parallel",
          "must be 0 (auto), 1 (off) or 2 (on), got " + std::to_string(a.tile_parallel));
  require(a.cluster_merge >= 0 && a.cluster_merge <= 2, op, "cluster_merge",
          "must be 0 (auto), 1 (off) or 2 (on), got " + std::to_string(a.cluster_merge));
  const bool tp_fits = G == 1 && vec && a.split_tokens == kern::kMlaTile * kern::kMlaClusterTiles;
  require(a.tile_parallel != 2 || (tp_fits && tile_parallel_setup()), op, "tile_parallel",
          "2 needs one query per block, split_tokens 256, width % 8 == 0, 16-byte aligned q and cache rows "
          "and a GPU with cluster launch (mla_tile_parallel_available())");
  // Tile-parallel: each block of the walk's grid ((rows / G) x splits) becomes a cluster of 4
  // (one tile of the split each); automatic where the clusters fit the SMs in one wave (decode
  // batches up to ~16 rows at two splits), where the walk leaves most SMs idle and each block
  // runs its tiles one by one.
  const int64_t blocks = int64_t((a.rows + G - 1) / G) * max_splits;
  const int sms = sm_count();
  const bool tp = a.tile_parallel == 2 || (a.tile_parallel == 0 && tp_fits &&
                                           blocks * kern::kMlaClusterTiles <= sms && tile_parallel_setup());
  static const int env_exchange = mla_exchange_setting(std::getenv("ATLAS_MLA_EXCHANGE"));
  const int exchange = a.cluster_exchange ? a.cluster_exchange : env_exchange;
  // The pair merge (MlaTcParams::pair_merge): at most two splits, the async exchange, and at two
  // splits every query's cluster of 8 resident at once (automatic) or at least one (forced).
  const bool pair_can = tp && max_splits <= 2 && exchange == kern::kMlaXAsync &&
                        (max_splits == 1 || tile_parallel_facts().pair_clusters > 0);
  require(a.cluster_merge != 2 || pair_can, op, "cluster_merge",
          "2 needs the cluster kernel (tile_parallel), the async exchange, max_length <= 2 * split_tokens and "
          "room for a cluster of 8 blocks");
  const bool pair = pair_can && (a.cluster_merge == 2 ||
                                 (a.cluster_merge == 0 && (max_splits == 1 || a.rows <= tile_parallel_facts().pair_clusters)));
  return {.G = G, .vec = vec, .tp = tp, .pair = pair, .exchange = exchange, .blocks = blocks, .sms = sms};
}

// plan: plan_tc(a, width, max_splits). merge_out: null launches the split merge after the
// attention kernel (mla_decode), unless the pair merge wrote every output; else its arguments go
// there and nothing more is launched (mla_attention_only: the value GEMM's launch merges,
// kernels/gemm_merge.cuh; never with the pair merge).
void launch_tc(const MlaDecodeArgs& a, const TcPlan& plan, int width, int max_splits, cudaStream_t s,
               kern::MlaMergeParams* merge_out = nullptr) {
  const char* op = "mla_decode";
  const int G = plan.G;
  const int wp = (width + 15) / 16 * 16;
  const int64_t acc_floats = int64_t(a.rows) * max_splits * a.heads * kern::kMlaAccStride;
  const kern::MlaTcParams p{.q = a.q,
                            .cache = a.latent_cache,
                            .cache_row_stride = a.cache_row_stride,
                            .lengths = a.lengths,
                            .cache_rows = a.cache_rows,
                            .out = a.out,
                            .ws_acc = a.workspace,
                            .ws_ml = a.workspace + acc_floats,
                            .error_flag = error_flag(),
                            .rows = a.rows,
                            .heads = a.heads,
                            .latent = a.latent,
                            .width = width,
                            .wp = wp,
                            .max_length = a.max_length,
                            .S = a.split_tokens,
                            .max_splits = max_splits,
                            .scale = a.scale,
                            .stable_prefix = a.stable_prefix ? 1 : 0,
                            // ATLAS_RELEASE_FIRST=attention (the cluster kernel only)
                            .release_first = release_first(kRfAttention) ? 1 : 0};
  // One tile buffer (two blocks per SM) where the blocks outnumber the SMs (a batch-128 decode
  // step), else double-buffered tiles (batch 1: one block per split). H200, session 6, 128 rows:
  // 512 slots (256 blocks) 58.4 vs 69.0 us, 1024 slots (512 blocks) 93.5 vs 118 us.
  const int nst = a.tile_buffers ? a.tile_buffers : (G == 1 && plan.blocks > int64_t(plan.sms) ? 1 : 2);
  const bool vec = plan.vec;
  if (plan.tp) {
    kern::MlaTcParams pc = p;
    pc.phase_clocks = cluster_clocks();
    pc.pair_merge = plan.pair ? 1 : 0;
    static const int env_pair_release = mla_pair_release_setting(std::getenv("ATLAS_MLA_PAIR_RELEASE"));
    pc.pair_release = env_pair_release;
    launch_clustered(dim3(unsigned(kern::kMlaClusterTiles), plan.pair ? unsigned(max_splits) : 1u),
                     cluster_kernel(pc.phase_clocks != nullptr, plan.exchange),
                     dim3(unsigned(a.rows * kern::kMlaClusterTiles), unsigned(max_splits)), kern::kMlaTcThreads,
                     size_t(kern::mla_tc_cluster_smem_bytes(wp, plan.pair)), s, pc);
  } else if (G == 1)
    vec ? launch_tc_kernel<1, true>(p, nst, s) : launch_tc_kernel<1, false>(p, nst, s);
  else if (G == 2)
    vec ? launch_tc_kernel<2, true>(p, nst, s) : launch_tc_kernel<2, false>(p, nst, s);
  else
    vec ? launch_tc_kernel<4, true>(p, nst, s) : launch_tc_kernel<4, false>(p, nst, s);
  check_launch(op);
  if (plan.pair) return;  // every output written (MlaTcParams::pair_merge)
  if (merge_out != nullptr) {
    *merge_out = {.ws_acc = p.ws_acc, .ws_ml = p.ws_ml, .lengths = a.lengths, .rows = a.rows, .heads = a.heads,
                  .latent = a.latent, .max_length = a.max_length, .S = a.split_tokens, .max_splits = max_splits,
                  .out = a.out};
    return;
  }
  // Merge: one (query, head) per block iteration; a grid-stride loop keeps the block count
  // bounded when most queries have one split (prefill), where each item is one length read.
  const int64_t items = int64_t(a.rows) * a.heads;
  const unsigned merge_blocks = unsigned(std::min<int64_t>(items, 8192));
  static const bool early = env_switch("ATLAS_MLA_MERGE_EARLY", true);
  static const bool merge_rf = release_first(kRfMerge);  // ATLAS_RELEASE_FIRST=merge
  using namespace kern;
  const auto merge = early ? (merge_rf ? mla_tc_merge_kernel<true, true> : mla_tc_merge_kernel<true, false>)
                           : (merge_rf ? mla_tc_merge_kernel<false, true> : mla_tc_merge_kernel<false, false>);
  launch(merge, merge_blocks,
         kern::kMlaMergeThreads, 0, s, p.ws_acc, p.ws_ml, a.lengths, a.rows, a.heads, a.latent, a.max_length,
         a.split_tokens, max_splits, a.out);
  check_launch(op);
}

// mla_decode's argument checks; the split count.
template <class T>
int64_t check_decode_args(const MlaDecodeArgsT<T>& a) {
  const char* op = "mla_decode";
  require(a.heads > 0 && a.heads <= kern::kMlaMaxHeads, op, "heads",
          "must be in [1, 16] for this kernel, got " + std::to_string(a.heads));
  require(a.latent > 0 && a.latent <= kMlaLatentMax, op, "latent",
          "must be in [1, 512], got " + std::to_string(a.latent));
  require(a.rope >= 0 && a.latent + a.rope <= kMlaWidthMax, op, "rope",
          "latent + rope must be <= 576, got " + std::to_string(a.latent + a.rope));
  const int width = a.latent + a.rope;
  require(a.split_tokens > 0, op, "split_tokens", "must be > 0, got " + std::to_string(a.split_tokens));
  require(a.rows >= 0, op, "rows", "must be >= 0");
  require(a.max_length > 0, op, "max_length", "must be > 0");
  require(a.cache_row_stride >= int64_t(a.max_length) * width || (a.rows <= 1 && !a.cache_rows), op,
          "cache_row_stride", "smaller than max_length * (latent + rope)");
  require(a.scale > 0.0f, op, "scale", "must be > 0");
  require(a.q && a.latent_cache && a.lengths && a.out && a.workspace, op, "pointers",
          "q, latent_cache, lengths, out, workspace must be set");
  require(a.tile_buffers >= 0 && a.tile_buffers <= 2, op, "tile_buffers",
          "must be 0 (auto), 1 or 2, got " + std::to_string(a.tile_buffers));
  const int64_t max_splits = (int64_t(a.max_length) + a.split_tokens - 1) / a.split_tokens;
  require(max_splits <= 65535, op, "max_length", "too long for the split grid (max_length / split_tokens > 65535)");
  return max_splits;
}

template <class T>
void mla_decode_impl(const MlaDecodeArgsT<T>& a) {
  const char* op = "mla_decode";
  const int64_t max_splits = check_decode_args(a);
  const int width = a.latent + a.rope;
  if (a.rows == 0) return;
  cudaStream_t s = stream_of(a.stream);
  if constexpr (std::is_same_v<T, float>) {
    require(a.impl == MlaImpl::scalar, op, "impl", "the tensor-core kernel is bf16-only; f32 runs MlaImpl::scalar");
    launch_scalar(a, width, int(max_splits), s);
  } else {
    if (a.impl == MlaImpl::scalar)
      launch_scalar(a, width, int(max_splits), s);
    else
      launch_tc(a, plan_tc(a, width, int(max_splits)), width, int(max_splits), s);
  }
}

}  // namespace

namespace detail {

bool mla_attention_only(const MlaDecodeArgs& a, kern::MlaMergeParams& merge) {
  const int64_t max_splits = check_decode_args(a);
  if (a.rows == 0 || a.impl != MlaImpl::tensor_core) return false;
  const int width = a.latent + a.rope;
  const TcPlan plan = plan_tc(a, width, int(max_splits));
  if (plan.pair) return false;  // (no merge to move)
  launch_tc(a, plan, width, int(max_splits), stream_of(a.stream), &merge);
  return true;
}

}  // namespace detail

void mla_decode(const MlaDecodeArgs& a) { mla_decode_impl(a); }
void mla_decode(const MlaDecodeArgsT<float>& a) { mla_decode_impl(a); }
bool mla_tile_parallel_available() { return tile_parallel_setup(); }

template <class T>
void mla_pattern_impl(const MlaPatternArgsT<T>& a) {
  const char* op = "mla_pattern";
  require(a.rows >= 0 && a.heads > 0 && a.width > 0 && a.slots >= 0, op, "shape",
          "need rows >= 0, heads > 0, width > 0, slots >= 0");
  require(int64_t(a.rows) * a.heads <= int64_t(INT32_MAX), op, "rows", "too many (query, head) pairs for one launch");
  require(a.q && a.latent_cache && a.lengths && a.out, op, "pointers", "q, latent_cache, lengths and out must be set");
  require(a.cache_row_stride >= 0, op, "cache_row_stride", "must be >= 0");
  if (a.rows == 0 || a.slots == 0) return;
  launch(kern::mla_pattern_kernel<T>, unsigned(a.rows * a.heads), kern::kReduceThreads, 0, stream_of(a.stream), a.q,
         a.latent_cache, a.cache_row_stride, a.lengths, a.cache_rows, a.out, a.heads, a.width, a.slots, a.scale,
         error_flag());
  check_launch(op);
}

void mla_pattern(const MlaPatternArgsT<uint16_t>& a) { mla_pattern_impl(a); }
void mla_pattern(const MlaPatternArgsT<float>& a) { mla_pattern_impl(a); }

}  // namespace atlas::cuda
