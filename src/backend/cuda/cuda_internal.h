// Internals shared by the launchers (.cu files only): error checks and the device error flag.
#pragma once

#include <cuda_runtime.h>

#include <string>
#include <utility>
#include <vector>

#include "backend/cuda/cuda_ops.h"
#include "core/error.h"

namespace atlas::cuda::kern {
template <class T>
struct LatentCacheParams;  // kernels/latent_cache.cuh
struct MlaMergeParams;     // kernels/mla_merge.cuh
struct RoutePermuteParams;  // kernels/route_core.cuh
}  // namespace atlas::cuda::kern

namespace atlas::cuda::detail {

// Throws atlas::Error("cuda: <op>: <call>: <CUDA error text>") on failure.
void check_cuda(cudaError_t e, const char* op, const char* what);
// After a launch: picks up launch-configuration errors without synchronising.
void check_launch(const char* op);
// Argument checks: "cuda: <op>: <field>: <what>".
[[noreturn]] void arg_error(const char* op, const char* field, const std::string& what);
inline void require(bool ok, const char* op, const char* field, const std::string& what) {
  if (!ok) arg_error(op, field, what);
}

// Whether the loaded device code has a feature (an sm_90 kernel in a build for older GPUs too):
// the probe kernel writes 1 (has it) or 0. Synchronises: call once, outside any capture.
bool probe_device_code(void (*probe)(int*), const char* what);
// How many clusters of (cluster_x, cluster_y, 1) blocks of `kernel` (threads per block, dynamic
// shared memory bytes) the device can hold at once: cudaOccupancyMaxActiveClusters, a refusal
// being 0. cluster_fits: at least one.
int cluster_capacity(const void* kernel, int cluster_x, int cluster_y, int threads, int smem);
bool cluster_fits(const void* kernel, int cluster_x, int threads, int smem);

// ATLAS_GEMM_STREAM's value (null: unset): the weight-streaming GEMM config the automatic choice
// uses for one-row problems: 1 for "wg" (the wgmma streaming config, kernels/gemm_wgstream.cuh;
// the default since session 23), 3 or 6 (the mma.sync stream config with that many warps per
// block, kernels/gemm_stream.cuh; 3 was the default before), 0 for none; anything else throws
// an Error naming the variable. gemm.cu reads it once, at its setup.
int gemm_stream_setting(const char* value);
// ATLAS_GEMM_STREAM_LEAN's value (null: unset): which loop the wgmma streaming config runs where
// it runs (kernels/gemm_wgstream.cuh, session 30): 4 (the default) or 6 the lean loop with that
// many ring slots ("streamwg64x8/4l", "streamwg64x8/6l"), 8 the lean loop with 8 slots of 64-wide
// steps ("streamwg64x8/8l64", session 31), 3 ("4/3", session 38) the lean loop with 4 slots and
// its copies three steps ahead ("streamwg64x8/4l/3"), 0 the full loop ("streamwg64x8/4", the
// default before); anything else throws an Error naming the variable. The same bits each way.
int gemm_stream_lean_setting(const char* value);
// ATLAS_GEMM_STREAMK: 0 (unset, "0"), 1 ("wide"), 2 ("long"), 3 ("all"); anything else throws.
int gemm_streamk_setting(const char* value);
// ATLAS_GEMM_STREAMK_GRID (session 54): at most this many blocks for a stream-K launch (whole
// number 1-4096); 0 where unset or empty: every resident slot. Anything else throws.
int gemm_streamk_grid_setting(const char* value);
// The block of `blocks` holding unit `unit` of `units` in the stream-K shares (block b: units
// [b units / blocks, (b + 1) units / blocks); kern::streamk_block_of). Host-side, for tests.
int gemm_streamk_block_of(int64_t unit, int64_t units, int64_t blocks);
// A split tile's workspace slot and counter (kern::streamk_slot), host-side for tests.
int gemm_streamk_slot(int tile, int slices, int64_t tiles, int64_t blocks);
// ATLAS_GEMM_STREAM_BALANCE's default on the device named `device_name` (session 53): on where
// the name has "H200" (balanced grids measured faster there), off elsewhere (measured slower on
// the H100). Never bits.
bool gemm_stream_balance_default(const std::string& device_name);
// The persistent grid of a stream config with `tiles` tiles and `slots` resident blocks (SMs x
// blocks per SM): min(tiles, slots), or with `balance` (ATLAS_GEMM_STREAM_BALANCE) and more
// tiles than slots ceil(tiles / ceil(tiles / slots)), so that every block's even share
// [b T / B, (b + 1) T / B) holds the same number of tiles give or take one less.
int64_t stream_grid_blocks(int64_t tiles, int64_t slots, bool balance);
// An on/off switch's value (null: unset): dflt where unset or empty, "0" off, "1" on; anything
// else throws an Error naming the variable (env_switch reads the environment through it).
bool switch_setting(const char* name, const char* value, bool dflt);
// ATLAS_GEMM_STREAM_GROUPED's value (null: unset): which stream config grouped problems of <= 8
// rows take: 3 ("wg-gate", the default since session 23) the wgmma streaming config for the
// fused gate|up only (the routed experts' down stays on the tiled config), 2 ("wg") that config
// for both, 4 ("wg-split", session 31) the gate|up as 3 and the down on the lean loop split over
// K ("streamwg64x8/4l2"), 5 / 6 ("split-gate" / "split-gate3", session 37) the gate|up on the
// lean loop split over K in two / three parts ("/4l2", "/4l3") and the down on the tiled config
// (the same bits; slower: 429.9 / 431.3 against 476.6 tok/s, s37-4: 396 blocks wait for the
// shared gate|up's slots and crowd out the shared down), 7 ("wg-gate3", session 67) the gate|up
// on the lean loop in a 3-slot ring ("streamwg64x8/3l/2": 55 KB, room beside three blocks for one
// routed-down block) and the down on the tiled config,
// 1 ("1") the dense problems' stream config, 0 ("0": the tiled configs,
// the default before); anything else throws an Error naming the variable.
int gemm_stream_grouped_setting(const char* value);
// ATLAS_BLOCK_STAMPS's value (null or empty: off, ""): the file the block stamps go to at exit
// (gemm_block_stamps_start); a path whose directory does not exist throws an Error naming the
// variable.
std::string block_stamps_setting(const char* value);
// The split lean loop's first step of part q (of `parts`) of a tile of depth K
// (kern::lean_part_begin with the config's 128-wide steps and 256-wide slices; q = parts: the
// tile's step count), for tests of the split's invariants on the host.
int gemm_lean_part_begin(int q, int parts, int K);
// ATLAS_GEMM_STREAM_FEW's value (null or empty: unset, -1): the config one-row dense problems of
// N >= 4096 but fewer 64-row tiles than SMs (the shared experts' gate|up at batch 1) take in place
// of the stream config, where one would run (not under ATLAS_GEMM_STREAM=0; session 28, for A/B
// runs: any config gives the same bits; a split-K name then runs as the split-K default does,
// ATLAS_GEMM_SPLITK); a name that is not a dense, non-TMA, non-sliced config throws an Error
// naming the variable.
int gemm_stream_few_setting(const char* value);
// ATLAS_GEMM_WIDE_GATED / ATLAS_GEMM_LONG_K's values (null or empty: unset, -1; session 49, for A/B
// runs: any config gives the same bits): the config the dense MLP's gate|up at one row (gated, at
// least one 64-column tile per SM) / its down (more than 16 K slices) take, where async operands
// allow; a split-K name runs as the split-K default does (ATLAS_GEMM_SPLITK). A name that is not a
// dense, non-TMA config (WIDE_GATED: one that fuses the SiLU, so not split-K or sliced either)
// throws an Error naming the variable.
int gemm_wide_gated_setting(const char* value);
int gemm_long_k_setting(const char* value);
// ATLAS_WIDE_NORM's value (null: unset): whether the norms of at most kWideNormMaxRows rows (and
// the kernels with a norm fused in: the MoE combine + norm, the latent to the MLA cache) run one
// 1024-thread block per row (kernels/rmsnorm.cuh, "wide norms"; the same bits) — unset or "1"
// yes, "0" no (for A/B runs); anything else throws an Error naming the variable. ops.cu reads
// it once.
bool wide_norm_setting(const char* value);
// ATLAS_GEMM_GROUPED_MANY's value (null or empty: unset): the config it names for grouped GEMMs
// of many small groups, -1 where unset; a name that is not a tiled config throws an Error
// naming the variable.
int gemm_grouped_many_setting(const char* value);
// ATLAS_GEMM_GROUPED_FEW_DOWN's value (null or empty: unset): the config it names for grouped
// GEMMs of a few rows in all without the fused gate (the MoE down projection at batch 1), -1
// where unset; a wgmma / TMA config or an unknown name throws an Error naming the variable. For
// A/B measurements.
int gemm_grouped_few_down_setting(const char* value);
// ATLAS_GEMM_DOWN_BLOCKS_PER_SM's value (null or empty: unset, 3 since session 53): 1-4, at most
// that many blocks of the routed experts' few-row down (grouped_few_down_config's launch) per SM,
// by asking for enough shared memory that one more does not fit (session 41; 4 is the config's
// own 48 KB); anything else throws an Error naming the variable. Never bits.
int gemm_down_blocks_setting(const char* value);
// ATLAS_COMBINE_QKV's value (null or empty: unset, 0): "0", "1" (the MoE combine + norm inside
// the next q|kv_a launch, gemm_combine_norm), "flag" (2: and the side stream left unjoined
// before it, a flag polled instead) or "event" (3: a programmatic event in place of the flag);
// anything else throws an Error naming the variable.
int combine_qkv_setting(const char* value);
// ATLAS_ROUTER_NORM's value (null or empty: unset, 0): "0", "1" (the post-attention add + norm
// inside the router's launch, gemm_after_add_rmsnorm, the shared experts forked from that launch
// programmatically) or "joined" (2: the same with the shared experts forked after its end);
// anything else throws an Error naming the variable.
int router_norm_setting(const char* value);
// ATLAS_CAPTURE_EDGES's value (null or empty: unset, "plain"): 0 "add", 1 "explicit", 2 "plain"
// (stream_wait_programmatic's capture forms); anything else throws an Error naming it.
int capture_edges_setting(const char* value);
// Whether stream_wait_programmatic wrote out `stream`'s capture dependencies for its next launch
// (ATLAS_CAPTURE_EDGES=explicit or plain), which then goes without the launch-overlap attribute;
// true once (the mark is cleared).
bool take_edges_set(cudaStream_t stream);
// A grouped launch's bound on the row tiles of one column (its grid: that x the column tiles):
// ceil(max_rows / bm) or, tight (ATLAS_GEMM_TIGHT_TILES=1), floor(max_rows / bm), plus the
// groups that can have rows, min(groups, max_rows). Either is at least the tiles any offsets of
// at most max_rows rows make.
int64_t grouped_y_tiles(int64_t max_rows, int bm, int64_t groups, bool tight);
// ATLAS_GEMM_SPLITK's value (null or empty: unset): the split-K config dense problems run where
// the chooser picks split-K; -1 where unset (the staged config). Anything else throws naming the
// variable. For A/B measurements.
int gemm_splitk_setting(const char* value);
constexpr int kWideNormMaxRows = 256;

// One device int per device, set by kernels that find bad data they cannot reject on the host
// (out-of-range positions, expert ids, cache lengths); read by check_device_errors().
int* error_flag();

// The host-side checks every dense / strided-batch GEMM launcher makes (bf16 GemmArgs, f32
// GemmF32Args: the same field names).
template <class A>
void require_gemm_args(const A& a, const char* op) {
  require(a.M >= 0 && a.N > 0 && a.K > 0, op, "shape",
          "need M >= 0, N > 0, K > 0; got M=" + std::to_string(a.M) + " N=" + std::to_string(a.N) +
              " K=" + std::to_string(a.K));
  require(a.x && a.w && a.out, op, "pointers", "x, w and out must be set");
  require((a.x_stride == 0 || a.x_stride >= a.K) && (a.w_stride == 0 || a.w_stride >= a.K) &&
              (a.out_stride == 0 || a.out_stride >= a.N),
          op, "stride", "a row stride is smaller than the row (K for x and w, N for out)");
  require(a.batch >= 1 && a.batch <= 65535, op, "batch", "need 1 <= batch <= 65535, got " + std::to_string(a.batch));
  require(a.x_batch_stride >= 0 && a.w_batch_stride >= 0 && a.out_batch_stride >= 0, op, "batch_stride",
          "batch strides must be >= 0");
}

// The host-side checks every grouped GEMM launcher makes (bf16 GroupedGemmArgs, f32
// GroupedGemmF32Args: the same field names).
template <class A>
void require_grouped_args(const A& a, const char* op) {
  require(a.N > 0 && a.K > 0, op, "shape", "need N > 0, K > 0; got N=" + std::to_string(a.N) + " K=" + std::to_string(a.K));
  require(a.groups >= 1, op, "groups", "need at least one group, got " + std::to_string(a.groups));
  require(a.max_rows >= 0, op, "max_rows", "must be >= 0, got " + std::to_string(a.max_rows));
  require(a.x && a.w && a.offsets && a.out, op, "pointers", "x, w, offsets and out must be set");
  require((a.x_stride == 0 || a.x_stride >= a.K) && (a.w_stride == 0 || a.w_stride >= a.K) &&
              (a.out_stride == 0 || a.out_stride >= a.N),
          op, "stride", "a row stride is smaller than the row (K for x and w, N for out)");
  require(a.x_rows_limit >= 0, op, "x_rows_limit", "must be >= 0");
}

inline cudaStream_t stream_of(Stream s) { return static_cast<cudaStream_t>(s); }

// gemm.cu keeps per-stream scratch for sliced launches; stream_destroy() returns it (never throws).
void gemm_release_stream(cudaStream_t s) noexcept;

inline unsigned blocks_for(int64_t n, int threads) { return unsigned((n + threads - 1) / threads); }

// Programmatic dependent launch (kernels/pdl.cuh): whether this launch carries the attribute:
// by default inside a decode step (DecodeLaunchScope), everywhere with ATLAS_PDL=1 or
// set_launch_overlap(LaunchOverlap::on), nowhere with 0 / off or on GPUs before compute
// capability 9.0. The same bits either way.
bool pdl_enabled();
// Inside an UrgentLaunchScope(true): the device's greatest stream priority (numerically lowest,
// e.g. -5) for the launch, counted in urgent_launches(); else 0 (the stream's own). One call per
// launch.
int urgent_launch_priority();
// Inside a ProgrammaticEventScope: its event (a cudaEvent_t) for the launch to record
// programmatically; else null.
void* programmatic_event();
// Whether `stream` is capturing into a graph (cudaStreamIsCapturing; throws on its error).
bool stream_capturing(cudaStream_t stream);
// Under capture: the node `stream`'s last launch made, as `event`'s programmatic source for
// stream_wait_programmatic (cudaStreamGetCaptureInfo; throws on its error).
void note_programmatic_node(cudaStream_t stream, void* event);
// ATLAS_PDL's value as an int(LaunchOverlap): 0 off, 1 on, 2 decode (unset or "decode");
// anything else throws an Error naming it.
int pdl_setting(const char* value);
// Launch sites whose kernel releases the next launch before its own launch-overlap wait
// (kernels/pdl.cuh, pdl_begin_rf; the GEMMs always do): the MoE combine + norm, the latent to the
// MLA cache, the MLA attention kernel, its split merge, the wide norms (rmsnorm, add + rmsnorm),
// the one-launch routing. Each names a kernel whose every successor reads only weights before
// its wait (the GEMMs) or what pdl.cuh allows (the MLA kernels). The same bits either way.
enum ReleaseFirstSite : unsigned {
  kRfCombine = 1u << 0,
  kRfLatent = 1u << 1,
  kRfAttention = 1u << 2,
  kRfMerge = 1u << 3,
  kRfNorm = 1u << 4,
  kRfRoute = 1u << 5,
};
// ATLAS_RELEASE_FIRST's value (null or empty: unset) as a set of sites: unset
// "combine,latent,norm" (the default since session 27), "none", "all", or a list of combine,
// latent, attention, merge, norm, route separated by commas or "+" (the GPU scripts' variable
// lists split at commas); anything else throws an Error naming the variable.
unsigned release_first_setting(const char* value);
// Whether a site releases first (ATLAS_RELEASE_FIRST, read once).
bool release_first(ReleaseFirstSite site);

// ATLAS_MLA_EXCHANGE's value (null or empty: unset): the MLA cluster kernel's exchange between
// its blocks, kern::kMlaXPull (1, "pull", the default before session 36), kMlaXPush (2, "push")
// or kMlaXAsync (3, "async", the default); anything else throws an Error naming the variable.
int mla_exchange_setting(const char* value);
// ATLAS_MLA_PAIR_RELEASE's value (null or empty: unset): where the MLA cluster kernel releases
// the next launch under the pair merge (kern::MlaTcParams::pair_release): 0 "wait" (after its
// launch-overlap wait, as every wait-first kernel), 1 "phase2" (before phase 2), 2 "epilogue"
// (before the merge), 3 "exit" (when its blocks end); anything else throws an Error naming the
// variable.
int mla_pair_release_setting(const char* value);
// CUDA_DEVICE_MAX_CONNECTIONS's value (null or empty: kDeviceConnections, what atlas sets where
// the caller did not): a whole number from 1 to 32; anything else throws an Error naming it.
int device_connections_setting(const char* value);
// ATLAS_PHASE_CLOCKS's value (null or empty: unset, ""): "attention" (the MLA cluster kernel's
// clocked instantiation, kernels/phase_clock.cuh) or "cluster_gemm" (the cluster GEMM kernel's,
// c16x64/4w with bf16 out: q|kv_a at a batch-1 decode step; session 41); anything else throws an
// Error naming the variable.
std::string phase_clocks_setting(const char* value);
// The device sums of `site`'s phase clocks where ATLAS_PHASE_CLOCKS names it, else null; the
// first call allocates them (call it outside a stream capture) and has the means of `phases`
// (names of the phases between consecutive marks) printed on stderr at exit.
unsigned long long* phase_clock_sums(const char* site, const std::vector<std::string>& phases);

// latent_to_cache's argument checks (one Error naming the field) and its kernels' parameters
// (ops.cu; gemm_with_latent in gemm.cu launches the same work inside the absorbed query's GEMM).
template <class T>
kern::LatentCacheParams<T> latent_cache_params(const LatentCacheArgsT<T>& a);

// mla_decode(a)'s checks and its attention kernel without the split merge (mla.cu): the merge's
// arguments into `merge` for mla_decode_with_value (gemm.cu), which merges inside the value
// GEMM's launch. False, and nothing launched, where mla_decode would run the scalar kernel or
// there are no rows.
bool mla_attention_only(const MlaDecodeArgs& a, kern::MlaMergeParams& merge);

// Every atlas kernel launch: kernel<<<grid, block, smem, stream>>>(args...), with the
// programmatic-serialization attribute when pdl_enabled(), and clusters of `cluster` blocks
// when cluster.x > 0 (launch_clustered; the GEMM's cluster configs, (x, 1, 1), and the MLA
// kernel's, (4, 1, 1) or (4, 2, 1)). Launch errors are
// picked up by the caller's check_launch, as with <<<>>>.
template <class... Params, class... Args>
void launch_clustered(dim3 cluster, void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem,
                      cudaStream_t stream, Args&&... args) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  cudaLaunchAttribute attr[4];
  unsigned n = 0;
  if (cluster.x > 0) {
    attr[n].id = cudaLaunchAttributeClusterDimension;
    attr[n].val.clusterDim.x = cluster.x;
    attr[n].val.clusterDim.y = cluster.y;
    attr[n].val.clusterDim.z = cluster.z;
    ++n;
  }
  // (A launch after stream_wait_programmatic's explicit capture edges has them already.)
  const bool edges_set = take_edges_set(stream);
  const bool overlap = pdl_enabled();
  if (overlap && !edges_set) {
    attr[n].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[n].val.programmaticStreamSerializationAllowed = 1;
    ++n;
  }
  if (const int prio = urgent_launch_priority(); prio != 0) {
    attr[n].id = cudaLaunchAttributePriority;
    attr[n].val.priority = prio;
    ++n;
  }
  // Inside a ProgrammaticEventScope: eagerly, the launch records the event; under stream capture
  // the launch's graph node is noted for the event instead (stream_wait_programmatic then adds an
  // edge from it, with edge data where programmatic: cudaGraphEdgeData).
  // Without launch overlap, or with plain waits (ATLAS_CAPTURE_EDGES=plain, the default), the
  // event is recorded after the launch as any event: its waiter then waits for the launch's end
  // (a waiter's launch without the attribute has no launch-overlap wait of its own to rely on; a
  // waiter whose launch overlaps its own stream's kernel waits for the other stream's work
  // plainly, s45-2: a launch with two programmatic prerequisites on two streams began only
  // after both had ended).
  void* const ev = programmatic_event();
  const bool capturing = ev != nullptr && stream_capturing(stream);
  const bool record_after = ev != nullptr && !capturing && (!overlap || capture_edges_mode() == 2);
  if (ev != nullptr && !capturing && !record_after) {
    attr[n].id = cudaLaunchAttributeProgrammaticEvent;
    attr[n].val.programmaticEvent.event = static_cast<cudaEvent_t>(ev);
    attr[n].val.programmaticEvent.flags = 0;
    attr[n].val.programmaticEvent.triggerAtBlockStart = 1;  // every block started: it will finish
    ++n;
  }
  cfg.attrs = n > 0 ? attr : nullptr;
  cfg.numAttrs = n;
  const cudaError_t err = cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...);
  if (capturing && err == cudaSuccess) note_programmatic_node(stream, ev);
  if (record_after && err == cudaSuccess)
    check_cuda(cudaEventRecord(static_cast<cudaEvent_t>(ev), stream), "ProgrammaticEventScope", "cudaEventRecord");
}
template <class... Params, class... Args>
void launch(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream, Args&&... args) {
  launch_clustered(dim3(0), kernel, grid, block, smem, stream, std::forward<Args>(args)...);
}

// moe_route's checks (router, permutation, and that the permutation is the router's) and its
// kernel's parameters (ops.cu); gemm_moe_route (gemm.cu) runs the same route in a GEMM's tail.
void check_route(const RouterArgs& r, const MoePermuteArgs& p, const char* op);
kern::RoutePermuteParams route_permute_params(const RouterArgs& r, const MoePermuteArgs& p);

}  // namespace atlas::cuda::detail
