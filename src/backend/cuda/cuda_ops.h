// The CUDA backend's plain C++ API (issue 5): launchers over raw device pointers.
//
// This header includes no CUDA header, so code compiled by the host compiler alone (the CLI,
// the model, tests) can call it. bf16 tensors are uint16_t (the bit pattern, as in core/bf16.h),
// streams are an opaque `void*` (a cudaStream_t; nullptr = the default stream).
// Element types: the row-wise ops, MLA and the copies take argument structs templated on the
// storage type, `XxxArgsT<uint16_t>` (bf16, the production path; `XxxArgs` is that alias) and
// `XxxArgsT<float>` (the f32 checking mode, `--compute f32`: the same op with every bf16
// rounding point removed, fp32 in and out). Both are overloads of one launcher name, so the
// CUDA model's forward loop is one template over the element type. Every launcher
// checks its arguments and the launch and throws atlas::Error with a message that names the op
// and the field at fault; nothing here fails silently.
//
// Each op has a CPU reference with the same argument struct in reference.h (host pointers);
// tests/cuda compares the two. Rounding contract: docs/cuda.md.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <type_traits>
#include <vector>

namespace atlas::sample_core {
struct RowParams;  // decode/sample_core.h
}

namespace atlas::cuda {

using Stream = void*;  // cudaStream_t

// ---- runtime ---------------------------------------------------------------------------
// Number of usable CUDA devices; 0 when there is no driver or no GPU (never throws).
int device_count();
// The hardware work queues the driver gives the process (CUDA_DEVICE_MAX_CONNECTIONS): atlas
// sets 32 before the driver starts (static initialization) where the caller gave no value;
// CUDA's own default is 8. Session 65's H100s ran batch-1 decode ~0.2% faster with 32.
inline constexpr int kDeviceConnections = 32;
// Whether the process was given CUDA_DEVICE_MAX_CONNECTIONS (atlas then kept that value).
bool device_connections_given();

struct DeviceInfo {
  std::string name;
  int cc_major = 0, cc_minor = 0;
  int sm_count = 0;
  size_t total_memory = 0;  // bytes
};
DeviceInfo device_info(int device = 0);
void set_device(int device);  // cudaSetDevice: later allocations and launches of this thread use it

void* device_alloc(size_t bytes);  // cudaMalloc; throws with the size asked and free memory found
void device_free(void* p);
void copy_to_device(void* dst, const void* src, size_t bytes);
void copy_to_host(void* dst, const void* src, size_t bytes);
void device_memset(void* dst, int byte, size_t bytes);
void synchronize();
// Free and total bytes of the current device (cudaMemGetInfo).
struct MemoryInfo {
  size_t free = 0, total = 0;
};
MemoryInfo memory_info();
// Page-locked host memory for fast uploads (cudaMallocHost), and an asynchronous host->device
// copy from it on `stream`; stream_synchronize waits for everything issued on the stream.
void* host_alloc_pinned(size_t bytes);
void host_free_pinned(void* p);
void copy_to_device_async(void* dst, const void* src, size_t bytes, Stream stream = nullptr);
void stream_synchronize(Stream stream = nullptr);
// Device-to-device copy of `rows` rows of `row_bytes` bytes between strided layouts
// (cudaMemcpy2DAsync); pitches in bytes.
void copy_2d(void* dst, size_t dst_pitch, const void* src, size_t src_pitch, size_t row_bytes, size_t rows,
             Stream stream = nullptr);
// A non-blocking stream of its own (a model's work is issued on one, so that it can be captured
// into a CUDA graph; the legacy default stream cannot be captured).
// The block scheduler dispatches pending blocks of a higher-priority stream first (running blocks
// are never preempted); high / low are the device's extremes, normal its default (on current
// NVIDIA GPUs the default is also the lowest).
enum class StreamPriority { normal, high, low };
Stream stream_create(StreamPriority priority = StreamPriority::normal);
void stream_destroy(Stream s);
// Fork / join between two streams: `waiter`'s later work waits for everything issued on
// `producer` so far (an event recorded there). Inside a capture this adds graph edges (both
// streams must be joined back into the capturing one before it ends). `event` is one of
// event_create()'s, reused freely (each call records it anew).
using Event = void*;
Event event_create();
void event_destroy(Event e);  // never throws
void stream_wait(Stream waiter, Stream producer, Event event);
// The event marks everything issued on `stream` so far; event_done() asks (without waiting)
// whether that work has completed, event_synchronize() waits for it.
void event_record(Event event, Stream stream);
bool event_done(Event event);
void event_synchronize(Event event);
// A stream that runs GEMMs concurrently with others: gives it its own cuBLASLt workspace (the
// fast path's; other streams share one, so two of them must not run cuBLASLt at once). Call it
// outside captures, once per stream; stream_destroy() frees it.
void gemm_prepare_stream(Stream s);
// Launch overlap (programmatic dependent launch, sm_90+): kernels' launches overlap the runs of
// the ones before them, each waiting for its predecessor before touching anything an earlier
// kernel may write (kernels/pdl.cuh), so the results are the same bits either way. By default
// (`decode`) only the launches of decode steps (forward calls of one token per row, marked by
// DecodeLaunchScope) carry it: measured on the H200 in session 18 (kernels waiting before they
// release, the GEMMs releasing first), batch-1 decode 360-364 against 344-346 tok/s and the
// seed grid 7.02 against 7.36 s, but the traced prefill 0.522 against 0.483 s. ATLAS_PDL=0 / 1 /
// decode or set_launch_overlap() choose (launches after the call; captured graphs keep theirs).
enum class LaunchOverlap { off = 0, on = 1, decode = 2 };
void set_launch_overlap(LaunchOverlap mode);
inline void set_launch_overlap(bool on) { set_launch_overlap(on ? LaunchOverlap::on : LaunchOverlap::off); }
LaunchOverlap launch_overlap_mode();
// Marks the launches of one forward call on this thread as a decode step's (or not) while it
// lives (nests: the destructor restores the enclosing value).
class DecodeLaunchScope {
 public:
  explicit DecodeLaunchScope(bool decode);
  ~DecodeLaunchScope();
  DecodeLaunchScope(const DecodeLaunchScope&) = delete;
  DecodeLaunchScope& operator=(const DecodeLaunchScope&) = delete;

 private:
  bool was_;
};

// The launches on this thread while it lives (urgent = true) carry the device's greatest
// priority as a launch attribute, whatever their stream's (nests like DecodeLaunchScope). For
// one launch on the low-priority side stream whose blocks should take SMs first (session 34,
// ATLAS_SHARED_DOWN_FIRST). Scheduling only: the same bits.
class UrgentLaunchScope {
 public:
  explicit UrgentLaunchScope(bool urgent);
  ~UrgentLaunchScope();
  UrgentLaunchScope(const UrgentLaunchScope&) = delete;
  UrgentLaunchScope& operator=(const UrgentLaunchScope&) = delete;

 private:
  bool was_;
};
// Launches made at that priority so far (tests).
int64_t urgent_launches();

// The launches on this thread while it lives (plain = true) carry no launch-overlap attribute
// even where launch_overlap() would give them one (nests like UrgentLaunchScope): their blocks
// become resident only once the kernel before them in their stream has finished, and a GEMM
// among them stages no weights early (it has nothing to overlap). For the shared experts' down at
// batch-1 decode steps (session 38, ATLAS_SHARED_DOWN_WAIT), whose blocks, resident early at the
// greatest priority, can hold the SMs the routed gate|up needs while they wait. Scheduling only:
// the same bits.
class PlainLaunchScope {
 public:
  explicit PlainLaunchScope(bool plain);
  ~PlainLaunchScope();
  PlainLaunchScope(const PlainLaunchScope&) = delete;
  PlainLaunchScope& operator=(const PlainLaunchScope&) = delete;

 private:
  bool was_;
};
// The launches on this thread while it lives (event set) record `event`: the last launch in the
// scope records it (under stream capture: is noted as the event's node, see
// stream_wait_programmatic). By default (ATLAS_CAPTURE_EDGES=plain), or without launch overlap
// for that launch, after the launch as any event, so a waiter waits for the launch's end; under
// ATLAS_CAPTURE_EDGES=explicit or add with launch overlap, programmatically
// (cudaLaunchAttributeProgrammaticEvent, triggered once every block of the launch has started),
// so a waiting stream may start its next launch before that launch ends. For the shared experts'
// down under ATLAS_COMBINE_QKV=event (the default) and the router's launch under
// ATLAS_ROUTER_NORM=1 (sessions 42-45).
class ProgrammaticEventScope {
 public:
  explicit ProgrammaticEventScope(Event event);
  ~ProgrammaticEventScope();
  ProgrammaticEventScope(const ProgrammaticEventScope&) = delete;
  ProgrammaticEventScope& operator=(const ProgrammaticEventScope&) = delete;

 private:
  Event was_;
};
// `waiter`'s next launches wait for the launch that recorded `event` in a ProgrammaticEventScope
// (no new record: the event as that launch left it). Under stream capture the event is not
// recorded: the waiter's next node gets an edge from that launch's node instead, counted in
// programmatic_capture_edges(). Forms (ATLAS_CAPTURE_EDGES, sessions 44-45):
// - "plain" (the default, session 45): the waiter's whole dependency set written out, its edges
//   from kernel nodes made programmatic as the launch-overlap attribute would make them, and a
//   plain edge from the recorded launch; the waiter's next kernel goes without the attribute.
//   It then overlaps its own stream's kernel before it and waits for the recorded launch's end
//   (eagerly the same: the event recorded after the launch). In s45-1 / s45-2 a launch with two
//   programmatic prerequisites on two streams began only after both had ended.
// - "explicit": the same with a programmatic edge from the recorded launch's launch-completion
//   port (every block begun; without launch overlap a plain edge).
// - "add": that programmatic edge added beside the waiter's dependencies, the next launch's
//   attribute left to capture (measured as explicit in s45-2).
void stream_wait_programmatic(Stream waiter, Event event);
int64_t programmatic_capture_edges();
// Tests: 0 add, 1 explicit, 2 plain, -1 (the default) as ATLAS_CAPTURE_EDGES says; the mode in force.
void set_capture_edges(int mode);
int capture_edges_mode();

// How often a PlainLaunchScope turned launch overlap off where it would have been on (a GEMM
// asks twice per launch: for its parameters and at the launch; tests).
int64_t plain_launches();

// An on/off switch from the environment (the A/B switches of docs/cuda.md): unset or empty ->
// dflt, "0" off, "1" on; any other value throws an Error naming the variable.
bool env_switch(const char* name, bool dflt);
// Every ATLAS_* switch the CUDA backend reads (the GEMM configs' ATLAS_GEMM_STREAM,
// _STREAM_GROUPED, _GROUPED_MANY, _GROUPED_FEW_DOWN, _TMA, _TMA_PERSISTENT; ATLAS_L2_EVICT_FIRST;
// ATLAS_WIDE_NORM; ATLAS_PDL; the model's
// ATLAS_SIDE_STREAM, ATLAS_PAD_DEDUP, ATLAS_CUDA_GRAPHS, ATLAS_STREAM_PRIORITY and model_env's
// three), parsed at once: a bad value is one Error naming the variable before any work. The
// kernels read most of them lazily, at their first launch; make_cuda_model calls this first,
// before it looks for a GPU.
void check_environment();
// The model's measurement settings from the environment (each unset -> 0 / false):
// ATLAS_MLA_PREFILL_QPB (1, 2 or 4 queries per MLA prefill block), ATLAS_MLA_TILE_PARALLEL ("0":
// decode attention without the cluster kernel, "1": automatic), ATLAS_PREFILL_CHUNK_TOKENS (1 to
// 999999999 tokens per prefill chunk). A bad value throws an Error naming the variable.
struct ModelEnv {
  int mla_prefill_qpb = 0;
  bool mla_tile_parallel_off = false;
  int64_t prefill_chunk_tokens = 0;
  // ATLAS_ABSORB: where a decode step's absorbed-query GEMM runs: 0 "side" (the side stream,
  // beside the latent cache kernel: a prefill's place always), 1 "before" / 2 "after" (the
  // model's stream, before or after the latent cache kernel: launch overlap then stages its
  // weights, and "after" lets the attention kernel follow it into early residency; the default
  // in sessions 27-31), 3 "fused" (one launch with the latent cache kernel, gemm_with_latent,
  // where it can run, else "after"; the default since session 32). The same bits.
  int absorb = 3;
  // ATLAS_MOE_PREFETCH (session 33; off by default, measured slower: s33-2): a MoE layer's gate|up
  // launches pull their down's weights into L2 (GemmArgs::next): 1 "routed" (the routed
  // experts'), 2 "shared" (the shared experts'), 3 "both"; 0 "none". ATLAS_MOE_PREFETCH_AT: the
  // quarter of each block's loop where it does so (0-4, L2NextWeights::at; default 0).
  int moe_prefetch = 0;
  int moe_prefetch_at = 0;
  // ATLAS_L2_PREFETCH (session 37; off by default: the same bits, slower, 470.0 at best against
  // 478.9 tok/s, s37-3): at a decode step of <= 16 rows, each MoE layer's shared experts' weights
  // are pulled into L2 from the side stream at the layer's start, beside its attention section
  // (l2_prefetch): 1 "gate_up", 2 "down", 3 "both"; 0 "none".
  // ATLAS_L2_PREFETCH_HOW: bulk (default), bulk_last, line, line_last (L2PrefetchArgs).
  // ATLAS_L2_PREFETCH_BLOCKS: its grid (1-1024 blocks; default 0, the launcher's 32).
  int l2_prefetch = 0;
  int l2_prefetch_how = 0;
  int l2_prefetch_blocks = 0;
  // ATLAS_SHARED_FORK (session 46): where a batch-1 decode step's shared experts leave the
  // model's stream: false "norm" (after the post-attention add + norm, whose output they read),
  // true "o_proj" (after o_proj: the side stream adds and norms the same x and y itself into a
  // row of its own, while the model's stream writes the sum out of place; the same bits).
  bool shared_fork_o_proj = false;
};
ModelEnv model_env();
bool launch_overlap();  // whether a launch issued here and now would carry the attribute
void copy_to_host_async(void* dst, const void* src, size_t bytes, Stream stream = nullptr);

// A CUDA graph captured from the work issued on one stream between begin() and end(), then
// replayed with launch(). Kernel arguments (pointers, sizes) are frozen at capture: whatever
// changes between replays must live in device (or pinned host) memory the kernels read.
class Graph {
 public:
  Graph() = default;
  ~Graph();
  Graph(const Graph&) = delete;
  Graph& operator=(const Graph&) = delete;
  void begin(Stream stream);    // cudaStreamBeginCapture (thread-local mode)
  void end(Stream stream);      // cudaStreamEndCapture + instantiate
  void abort(Stream stream);    // ends a capture that failed half-way; the graph stays empty
  void launch(Stream stream);   // cudaGraphLaunch
  void reset();                 // destroys the graph (ready() becomes false)
  bool ready() const { return exec_ != nullptr; }

 private:
  void* graph_ = nullptr;  // cudaGraph_t
  void* exec_ = nullptr;   // cudaGraphExec_t
};

int64_t graph_captures();  // Graph::end calls that instantiated a graph (tests: a cache store's graphs reused)

// Kernels that meet bad data only on the device (positions, expert ids, cache lengths) raise a
// device flag instead of trapping; this synchronises, reads and clears it, and throws
// atlas::Error naming the op and field. Call it wherever a host sync happens anyway.
void check_device_errors();

// Device-side timing for benchmarks: two CUDA events around work issued on `stream`.
class EventTimer {
 public:
  EventTimer();
  ~EventTimer();
  EventTimer(const EventTimer&) = delete;
  EventTimer& operator=(const EventTimer&) = delete;
  void start(Stream stream = nullptr);
  float stop_ms(Stream stream = nullptr);  // records the end event, waits for it, milliseconds

 private:
  void* begin_ = nullptr;
  void* end_ = nullptr;
};

// ---- RMSNorm (spec section 5) ------------------------------------------------------------
// bf16: out[t] = bf16(w * bf16(x[t] * 1/sqrt(mean(x[t]^2) + eps))); f32: out[t] = w * (x[t] *
// 1/sqrt(mean(x[t]^2) + eps)) (the CPU f32 mode's formula). fp32 mean of squares in the fixed
// reduction order of docs/cuda.md (independent of rows, so batch invariant).
template <class T>
struct RmsNormArgsT {
  const T* x = nullptr;       // [rows, dim], row stride x_stride
  const T* weight = nullptr;  // [dim]
  T* out = nullptr;           // [rows, dim], row stride out_stride (may alias x)
  int rows = 0;
  int dim = 0;
  int64_t x_stride = 0;    // elements; 0 = dim
  int64_t out_stride = 0;  // elements; 0 = dim
  float eps = 1e-6f;
  Stream stream = nullptr;
};
using RmsNormArgs = RmsNormArgsT<uint16_t>;
void rmsnorm(const RmsNormArgs& a);
void rmsnorm(const RmsNormArgsT<float>& a);

// ---- residual add fused with the next RMSNorm --------------------------------------------
// x = bf16(x + y) (written back), then out = rmsnorm(x): one launch with the bits of add()
// followed by rmsnorm() (the norm reads the rounded sum).
template <class T>
struct AddRmsNormArgsT {
  T* x = nullptr;             // [rows, dim] residual stream, updated in place (unless sum says otherwise)
  const T* y = nullptr;       // [rows, dim] what is added
  const T* weight = nullptr;  // [dim]
  T* out = nullptr;           // [rows, dim] (must not alias x or y)
  int rows = 0;
  int dim = 0;
  float eps = 1e-6f;
  Stream stream = nullptr;
  // Where the rounded sum goes: x (in place), sum_out ([rows, dim], not aliasing x, y or out), or
  // nowhere (a second launch over the same x and y that needs only the normed rows: x is then
  // only read). The other two need the wide kernel (few rows of dim <= 2048), else an error.
  enum class Sum : uint8_t { in_place, to_sum_out, dropped } sum = Sum::in_place;
  T* sum_out = nullptr;
};
void add_rmsnorm(const AddRmsNormArgsT<uint16_t>& a);
void add_rmsnorm(const AddRmsNormArgsT<float>& a);
int64_t add_rmsnorm_dropped_sum_launches();  // how many ran with Sum::dropped (tests)
// Whether the norms of rows x dim run the wide kernel (one 1024-thread block per row: few rows of
// dim <= 2048, ATLAS_WIDE_NORM not 0); add_rmsnorm takes a sum other than in place only there.
bool wide_row_norm(int rows, int dim);

// ---- YaRN RoPE (spec section 3) ----------------------------------------------------------
struct YarnParams {
  int rope_dim = 64;  // rotated width; rope_dim/2 frequencies
  double theta = 10000.0;
  double factor = 40.0;
  int original_max_position = 4096;
  double beta_fast = 32.0;
  double beta_slow = 1.0;
  double mscale = 0.707;
  double mscale_all_dim = 0.707;
};
// inv_freq[k], k < rope_dim/2, fp32, as the official YaRN code computes it.
std::vector<float> yarn_inv_freq(const YarnParams& p);
// cos/sin tables [max_positions, rope_dim/2] as bf16 bits: fp32 angle fp32(p)*inv_freq[k],
// fp32 cos/sin times the amplitude mscale(factor, mscale)/mscale(factor, mscale_all_dim), then
// one rounding to bf16. Built on the host (bit-identical on every machine that has IEEE fp32
// cos/sin from the same libm) and uploaded once.
struct RopeTable {
  int max_positions = 0;
  int half = 0;
  std::vector<uint16_t> cos, sin;  // [max_positions, half]
};
RopeTable build_rope_table(const YarnParams& p, int max_positions);

// Rotates adjacent pairs (x[2k], x[2k+1]) of each head's rope slice in place by angle
// pos*inv_freq[k], with the official bf16 roundings:
//   x[2k]   = bf16(bf16(x[2k]*cos) - bf16(x[2k+1]*sin))
//   x[2k+1] = bf16(bf16(x[2k+1]*cos) + bf16(x[2k]*sin))
// f32: the same without any rounding but fp32's (x[2k]*cos - x[2k+1]*sin, two products, one
// difference), over fp32 cos/sin tables (model/rope.h with bf16 = false).
template <class T>
struct RopeArgsT {
  T* x = nullptr;  // first rope element of token 0, head 0
  int tokens = 0;
  int heads = 0;
  int64_t token_stride = 0;  // elements between tokens
  int64_t head_stride = 0;   // elements between heads
  int rope_dim = 64;
  const int32_t* positions = nullptr;  // [tokens], each in [0, max_positions)
  const T* cos = nullptr;              // [max_positions, rope_dim/2] (device)
  const T* sin = nullptr;
  int max_positions = 0;
  Stream stream = nullptr;
  // Out of place: x is only read and the rotated pairs go to out (strides as above, 0 = x's);
  // null = in place.
  T* out = nullptr;
  int64_t out_token_stride = 0;
  int64_t out_head_stride = 0;
};
using RopeArgs = RopeArgsT<uint16_t>;
void rope_inplace(const RopeArgs& a);
void rope_inplace(const RopeArgsT<float>& a);
// Two rotations in one launch (the queries' and the cached key's rope parts of a layer): both
// share tokens, rope_dim, positions, tables and stream; each is exactly rope_inplace(a) / (b).
void rope2(const RopeArgs& a, const RopeArgs& b);
void rope2(const RopeArgsT<float>& a, const RopeArgsT<float>& b);

// ---- the new latent into the MLA cache: rmsnorm + rope2 + copy_rows in one launch ----------
// Per token t: cache[dst_rows[t]] = [rmsnorm(lat[t, :latent]) | rope(lat[t, latent:])] (a row of
// latent + rope_dim elements; dst_rows[t] < 0: no slot) and the queries' rope parts rotated
// (each head's rope_dim elements at q + t * q_token_stride + h * q_head_stride into q_out with
// the out strides). Bit for bit rmsnorm(), rope2() (the key's job, then the queries'), then
// copy_rows() through an intermediate row, with the same device errors.
template <class T>
struct LatentCacheArgsT {
  const T* lat = nullptr;          // [tokens, latent + rope_dim], row stride lat_stride
  int64_t lat_stride = 0;          // 0 = latent + rope_dim
  const T* norm_weight = nullptr;  // [latent]
  float eps = 1e-6f;
  T* cache = nullptr;                 // [cache_rows, latent + rope_dim]
  const int32_t* dst_rows = nullptr;  // [tokens] (device)
  int64_t cache_rows = 0;
  int tokens = 0;
  int latent = 0;
  int rope_dim = 64;
  const T* q = nullptr;  // queries' rope parts (heads per token)
  T* q_out = nullptr;
  int heads = 0;
  int64_t q_token_stride = 0, q_head_stride = 0, q_out_token_stride = 0, q_out_head_stride = 0;
  const int32_t* positions = nullptr;  // [tokens]
  const T* cos = nullptr;              // [max_positions, rope_dim / 2]
  const T* sin = nullptr;
  int max_positions = 0;
  Stream stream = nullptr;
};
void latent_to_cache(const LatentCacheArgsT<uint16_t>& a);
void latent_to_cache(const LatentCacheArgsT<float>& a);

// ---- SiLU gate: out = bf16(bf16(silu(g)) * u); f32: silu(g) * u -------------------------
template <class T>
struct SiluGateArgsT {
  const T* gate = nullptr;  // [rows, width], row stride in_stride
  const T* up = nullptr;    // [rows, width], row stride in_stride
  T* out = nullptr;         // [rows, width], dense
  int rows = 0;
  int width = 0;
  int64_t in_stride = 0;  // 0 = width (lets gate/up be the two halves of one fused GEMM output)
  Stream stream = nullptr;
};
using SiluGateArgs = SiluGateArgsT<uint16_t>;
void silu_gate(const SiluGateArgs& a);
void silu_gate(const SiluGateArgsT<float>& a);

// ---- add: out = bf16(a + b); f32: a + b (residual stream, shared + routed) ----------------
template <class T>
struct AddArgsT {
  const T* a = nullptr;
  const T* b = nullptr;
  T* out = nullptr;  // may alias a or b
  int64_t n = 0;
  Stream stream = nullptr;
};
using AddArgs = AddArgsT<uint16_t>;
void add(const AddArgs& a);
void add(const AddArgsT<float>& a);
inline void add_bf16(const AddArgs& a) { add(a); }

// ---- row edits: a hook edit on the device (model/hooks.h HookRowEdit) ---------------------
// For each of the n listed rows r (an index into x's [limit, width] values), with v = the
// value as f32: zero: 0; scale: float(double(v) * factor); add: float(double(v) + factor *
// double(s_j)), s = src's row i for the i-th listed row (src_per_row) or src's one row for
// every listed row. Stored as T (bf16: one rounding to nearest even). The host path's
// arithmetic (model/intervene.cpp's observers on the f32 copy) in double without contraction,
// so the bits are the same. A row outside [0, limit) sets error flag 8 (as copy_rows).
enum class RowEditOp : int { Zero = 0, Scale = 1, Add = 2 };
template <class T>
struct RowEditArgsT {
  T* x = nullptr;
  int64_t limit = 0;               // rows of x
  int width = 0;
  const int64_t* rows = nullptr;   // [n] device
  int64_t n = 0;
  RowEditOp op = RowEditOp::Zero;
  double factor = 1;               // scale, add
  const float* src = nullptr;      // add: [n, width] (src_per_row) or [width], device
  bool src_per_row = false;
  Stream stream = nullptr;
};
void edit_rows(const RowEditArgsT<uint16_t>& a);
void edit_rows(const RowEditArgsT<float>& a);
int64_t edit_rows_launches();  // (tests: the device path ran)

// ---- L2 prefetch (session 37; ATLAS_L2_PREFETCH) ------------------------------------------
// Pulls up to four byte ranges into L2 from a small grid (kernels/l2_prefetch.cuh) and writes
// nothing: a hint that cannot change any output. `bytes`: multiples of 128, 16-byte aligned
// bases. how: bulk (cp.async.bulk.prefetch.L2 in 32 KB pieces), line (prefetch.global.L2 per
// 128-byte line); `evict_last` adds the L2 evict_last hint.
enum class L2PrefetchHow { bulk, line };
struct L2PrefetchArgs {
  const void* ptr[4] = {};
  int64_t bytes[4] = {};
  L2PrefetchHow how = L2PrefetchHow::bulk;
  bool evict_last = false;
  int blocks = 0;  // 0: the launcher's choice
  Stream stream = nullptr;
};
void l2_prefetch(const L2PrefetchArgs& a);

// ---- router (spec section 4) --------------------------------------------------------------
// fp32 softmax over the experts, top-k, weights. Output in descending weight order, ties ->
// lower expert id. greedy: top-k of all scores. group_limited_greedy: group score = max of
// the group's scores; keep the topk_group best groups (ties -> lower group id), others 0.0;
// top-k of the masked scores. Weights: norm_topk_prob && k > 1 -> w / (sum w + 1e-20), else
// w * routed_scaling_factor.
enum class TopkMethod { greedy, group_limited_greedy };
struct RouterArgs {
  const float* logits = nullptr;  // [tokens, experts] fp32
  int32_t* topk_ids = nullptr;    // [tokens, k]
  float* topk_weights = nullptr;  // [tokens, k] fp32
  float* scores = nullptr;        // optional [tokens, experts] softmax probs (hooks); may be null
  int tokens = 0;
  int experts = 0;  // <= 256
  int k = 0;        // <= 16
  TopkMethod method = TopkMethod::greedy;
  int n_group = 1;
  int topk_group = 1;
  bool norm_topk_prob = false;
  float routed_scaling_factor = 1.0f;
  Stream stream = nullptr;
};
void router(const RouterArgs& a);

// ---- row gather / scatter (embedding lookup, KV-cache append, last-token selection) -------
// dst[dst_rows ? dst_rows[i] : i] = src[src_rows ? src_rows[i] : i] for i < rows, `width`
// values (bf16 or f32) per row; a negative index on either side skips row i (padding not
// stored). Indices are checked against src_limit / dst_limit on the device (error flag,
// "copy_rows").
template <class T>
struct CopyRowsArgsT {
  const T* src = nullptr;
  T* dst = nullptr;
  const int32_t* src_rows = nullptr;  // [rows] device, optional
  const int32_t* dst_rows = nullptr;  // [rows] device, optional
  int64_t rows = 0;
  int width = 0;
  int64_t src_stride = 0, dst_stride = 0;  // elements, 0 = width
  int64_t src_limit = 0, dst_limit = 0;    // rows available on each side (index bound)
  Stream stream = nullptr;
};
using CopyRowsArgs = CopyRowsArgsT<uint16_t>;
void copy_rows(const CopyRowsArgs& a);
void copy_rows(const CopyRowsArgsT<float>& a);

// ---- MoE token permutation ----------------------------------------------------------------
// Stable counting sort of the T*k (token, slot) pairs by expert: inside one expert the pairs
// are in ascending token order, so the layout depends only on the routes (never on timing).
// counts[e] = pairs routed to e; offsets = exclusive scan (offsets[E] = T*k);
// sorted_token[i] = token of the i-th pair in expert order; pair_slot[t*k+j] = its position.
struct MoePermuteArgs {
  const int32_t* topk_ids = nullptr;  // [tokens, k]
  int tokens = 0;
  int k = 0;
  int experts = 0;              // <= 1024
  int32_t* counts = nullptr;    // [experts]
  int32_t* offsets = nullptr;   // [experts + 1]
  int32_t* sorted_token = nullptr;  // [tokens * k]
  int32_t* pair_slot = nullptr;     // [tokens * k]
  int32_t* workspace = nullptr;     // moe_permute_workspace_ints(tokens, experts) int32
  Stream stream = nullptr;
};
size_t moe_permute_workspace_ints(int tokens, int experts);
void moe_permute(const MoePermuteArgs& a);
// router(r), then moe_permute(p) of its routes (p.topk_ids = r.topk_ids, the same tokens, k,
// experts and stream): for 1 .. kMoeRouteFusedMaxTokens tokens (a small decode step) one launch
// that does both with the same arithmetic (the same results, one launch fewer); otherwise the
// two calls.
constexpr int kMoeRouteFusedMaxTokens = 8;
void moe_route(const RouterArgs& r, const MoePermuteArgs& p);

// x_sorted[i] = x[sorted_token[i]] (bf16 or f32 rows), the expert GEMMs' input.
template <class T>
struct MoeGatherArgsT {
  const T* x = nullptr;  // [tokens, dim]
  const int32_t* sorted_token = nullptr;
  T* x_sorted = nullptr;  // [rows, dim]
  int rows = 0;           // tokens * k
  int dim = 0;
  Stream stream = nullptr;
};
using MoeGatherArgs = MoeGatherArgsT<uint16_t>;
void moe_gather(const MoeGatherArgs& a);
void moe_gather(const MoeGatherArgsT<float>& a);

// out[t] = bf16(sum_{j=0..k-1} w[t,j] * fp32(y_sorted[pair_slot[t*k+j]])): fp32 products and
// sum in the router's k order (a fixed order, one bf16 rounding at the end; none in f32).
template <class T>
struct MoeCombineArgsT {
  const T* y_sorted = nullptr;         // [tokens*k, dim] expert outputs in expert order
  const int32_t* pair_slot = nullptr;  // [tokens, k]
  const float* topk_weights = nullptr; // [tokens, k]
  T* out = nullptr;                    // [tokens, dim]
  int tokens = 0;
  int k = 0;
  int dim = 0;
  Stream stream = nullptr;
  // Optional, both or neither: sum_out = bf16(out + addend) in the same launch (the shared
  // experts' output added to the routed one: the bits of add()).
  const T* addend = nullptr;  // [tokens, dim]
  T* sum_out = nullptr;       // [tokens, dim]
};
using MoeCombineArgs = MoeCombineArgsT<uint16_t>;
void moe_combine(const MoeCombineArgs& a);
void moe_combine(const MoeCombineArgsT<float>& a);

// moe_combine (with the shared experts' addend, or without), then add_rmsnorm of the residual
// stream x with that sum, in one launch: x = bf16(x + y), out = rmsnorm(x) * weight, where y is
// what moe_combine would have written to sum_out (or to out without an addend). The bits of
// the two calls; routed and y are never stored. k <= 16.
template <class T>
struct MoeCombineNormArgsT {
  const T* y_sorted = nullptr;          // [tokens*k, dim]
  const int32_t* pair_slot = nullptr;   // [tokens, k]
  const float* topk_weights = nullptr;  // [tokens, k]
  const T* addend = nullptr;            // [tokens, dim] or null
  T* x = nullptr;                       // [tokens, dim] residual stream, updated in place
  const T* weight = nullptr;            // [dim]
  T* out = nullptr;                     // [tokens, dim], must not alias x
  int tokens = 0;
  int k = 0;
  int dim = 0;
  float eps = 1e-6f;
  Stream stream = nullptr;
};
void moe_combine_add_rmsnorm(const MoeCombineNormArgsT<uint16_t>& a);
void moe_combine_add_rmsnorm(const MoeCombineNormArgsT<float>& a);

// ---- greedy token on the device: argmax of each logits row, ties to the lower id ------------
// The same contract as decode::greedy_token on the host (the logits are the same bf16 or f32
// values), so a greedy row needs only its token id copied back, not its V logits. A NaN logit
// raises the device error flag ("argmax: logits: NaN"); out[b] is then unspecified.
// The first and last nodes of a decode run's step graph (kernels/decode_run.cuh). Inputs: reads
// the step index j = state[0] and advances it; copies slot j % ring of the host's staged inputs
// [5B] (ids | pos | dst | qlen | qrow) and sampling parameters, each row's id replaced by prev[b]
// (the step before's token) where j > 0. Outputs: the step's tokens into prev and, with the
// device error flag, into slot j % ring of the host's rings. staged / params_staged / out / err: pinned host memory.
struct RunInputsArgs {
  int32_t* state = nullptr;                // [1], device
  const int32_t* staged = nullptr;         // [ring, 5B]
  const int32_t* params_staged = nullptr;  // [ring, B * param_ints] or null
  const int32_t* prev = nullptr;           // [B]
  int32_t* inputs = nullptr;               // [5B]
  int32_t* params = nullptr;               // [B * param_ints] or null
  int batch = 0, param_ints = 0, ring = 0;
  Stream stream = nullptr;
};
void run_inputs(const RunInputsArgs& a);
// An empty launch (one warp: its launch-overlap wait and release, nothing else) as a decode run's
// step graph's first node (ATLAS_RUN_ROOT, session 49, a diagnostic: s48-1's timeline had the
// first q|kv_a begin 8.1 us after session 47's fused step-start launch ended, where with the
// unfused start it begins during the norm before it; the step-start launch was then the graph's
// root node. With session 49's form it moves the root's cost, it does not remove it: s50-1).
void graph_root(Stream stream);
int64_t graph_root_launches();  // (tests: it ran)
struct RunOutputsArgs {
  const int32_t* state = nullptr;  // [1], device
  const int32_t* tokens = nullptr;  // [B]
  int32_t* prev = nullptr;         // [B], device: what the next step's inputs feed
  int32_t* out = nullptr;          // [ring, B]
  int32_t* err = nullptr;          // [ring]
  int batch = 0, ring = 0;
  Stream stream = nullptr;
};
void run_outputs(const RunOutputsArgs& a);
// The embedding lookup (copy_rows of row ids[0] of `embed` into x) and the first layer's input
// norm (rmsnorm of x into h) at one row, in one launch: the same values (kernels/decode_run.cuh;
// ATLAS_RUN_FUSED, sessions 47 and 49). dim <= kern::kWideDim (wide_row_norm(1, dim) says
// whether it may run).
template <class T>
struct EmbedNormArgsT {
  const int32_t* ids = nullptr;  // [1], device: the row's id (run_inputs' first input)
  const T* embed = nullptr;      // [vocab, dim]
  int64_t vocab = 0;
  const T* weight = nullptr;  // [dim], the first layer's input norm
  T* x = nullptr;             // [dim], the residual stream's row
  T* h = nullptr;             // [dim], the normed row; must not alias x
  int dim = 0;
  float eps = 1e-6f;
  Stream stream = nullptr;
};
void embed_norm(const EmbedNormArgsT<uint16_t>& a);
void embed_norm(const EmbedNormArgsT<float>& a);
int64_t embed_norm_launches();  // (tests: the fused form ran)
int64_t argmax_run_outputs_launches();     // argmax launches that wrote a run's outputs (tests)

template <class T>
struct ArgmaxArgsT {
  const T* logits = nullptr;  // [rows, vocab], row stride `stride` (0 = vocab)
  int32_t* out = nullptr;     // [rows]
  int rows = 0;
  int vocab = 0;
  int64_t stride = 0;
  Stream stream = nullptr;
  // Optional, both or neither: counters [rows] device ints, zero (the kernel leaves them zero
  // again), and partials [argmax_partial_ints(rows, vocab)]: each row is then spread over blocks
  // of 4,096 logits and the last block of a row to finish picks the answer from theirs (the same
  // answer; 25 blocks for a 102,400-entry row). Neither: one block per row.
  int32_t* counters = nullptr;
  int32_t* partials = nullptr;
  // Optional (rows == 1, run_outputs->batch == 1): the answer's block also writes what
  // run_outputs(*run_outputs) would after this launch (its tokens must be `out`), the step's
  // error flag included, so a decode run's step graph ends with the argmax (ATLAS_RUN_FUSED).
  const RunOutputsArgs* run_outputs = nullptr;
};
using ArgmaxArgs = ArgmaxArgsT<uint16_t>;
void argmax(const ArgmaxArgs& a);
void argmax(const ArgmaxArgsT<float>& a);
// Ints of ArgmaxArgsT::partials: two per block of each row.
size_t argmax_partial_ints(int64_t rows, int64_t vocab);
inline void argmax_bf16(const ArgmaxArgs& a) { argmax(a); }

// ---- sampling on the device (docs/decoding.md sections 3-4, decode/sample_core.h) ----------
// For each row whose params[r].mode is sample_core::kSample: temperature, top-k, top-p, softmax
// and the inverse-CDF draw with params[r].u, bit-identical to decode::RowSampler on the same
// (widened) logits; out[r] = the token, or sample_core::encode_error(code, index) for bad
// logits (NaN, +inf, overflow after temperature: the lowest such index; no finite logit).
// Rows in greedy mode are left untouched (run argmax() first: out may be its output).
template <class T>
struct SampleArgsT {
  const T* logits = nullptr;                     // [rows, vocab], row stride `stride` (0 = vocab)
  const sample_core::RowParams* params = nullptr;  // [rows], device memory
  int32_t* out = nullptr;                        // [rows]
  uint32_t* workspace = nullptr;                 // sample_workspace_ints(rows, vocab)
  int rows = 0;
  int vocab = 0;
  int64_t stride = 0;
  Stream stream = nullptr;
};
using SampleArgs = SampleArgsT<uint16_t>;
size_t sample_workspace_ints(int64_t rows, int64_t vocab);
void sample(const SampleArgs& a);
void sample(const SampleArgsT<float>& a);

// ---- per-token SHA-256 digests (the token digest of model/digest.h) -----------------------
// out[r*32 .. r*32+32) = SHA-256 of row r's `dim` values as little-endian float32 bytes, for
// r < rows (bf16 values widened exactly, bits << 16: the bytes of the f32 tensor a host hook
// sees). One thread per row; rows are independent, so a row's digest never depends on the batch.
// Stage hashes over token ranges are built on the host from these (model/digest.h).
template <class T>
struct TokenDigestArgsT {
  const T* x = nullptr;    // [rows, dim], row stride row_stride
  int64_t row_stride = 0;  // elements, 0 = dim
  int64_t rows = 0;        // M tokens
  int dim = 0;             // H
  uint8_t* out = nullptr;  // [rows][32] bytes (device)
  Stream stream = nullptr;
};
using TokenDigestBf16Args = TokenDigestArgsT<uint16_t>;
using TokenDigestF32Args = TokenDigestArgsT<float>;
void token_digests_bf16(const TokenDigestBf16Args& a);
void token_digests_f32(const TokenDigestF32Args& a);

constexpr int kMlaLatent = 512, kMlaRope = 64, kMlaWidth = 576;
constexpr int kMlaLatentMax = 512, kMlaWidthMax = 576;

// ---- MLA attention, absorbed form (spec section 3), decode and prefill ----------------------
// One query token per row b: q[b] = [heads, latent+rope] = [q~ (latent) || q_pe (rope)] bf16; the
// row's cache = latent_cache + cache_rows[b]*cache_row_stride (or b*...), [lengths[b], latent+rope]
// = [c^ || k_pe] bf16. Per head: s_j = scale * (q . cache_j), p = softmax_j(s),
// out[b,h] = bf16(sum_j p_j * c^_j) [latent].
//   latent/rope: any DeepSeek-V2-family shape (512 + 64 for Lite; latent <= 512, width <= 576).
//   cache_rows:  query b reads cache row cache_rows[b] (null: row b). Prefill passes one query
//                per token, all of a batch row's tokens pointing at that row's cache, each with
//                its own causal length.
//   lengths[b] = 0 is allowed: the query sees no key (a padding token) and its output is 0.
// Batch invariance: the cache is cut into splits of a FIXED size (split_tokens, anchored at slot
// 0 of every query, independent of the batch and of other rows); partials merge in split order.
// A row's bits depend only on its own q, cache and length: alone or in any batch, in any order,
// whatever max_length (>= every length) and queries_per_block say.
// Implementations (numerics contracts in docs/cuda.md and the kernel headers):
//   tensor_core (default): mma.sync bf16 -> fp32; splits walked in 64-slot tiles with an online
//     softmax, P rounded to bf16 for the P.V product (as flash-attention), fixed l order.
//   scalar: the first, correctness-first kernel (fp32 FMA chains, P kept fp32; split_tokens <=
//     256); slow, kept as an on-device cross-check. The only one with an f32 form
//     (MlaDecodeArgsT<float>: f32 q, cache and output, no rounding at the end), the f32 checking
//     mode's attention; the tensor-core kernel is bf16-only.
// Capture safe: no allocation, no synchronisation, no host read of device data.
enum class MlaImpl { tensor_core, scalar };
template <class T>
struct MlaDecodeArgsT {
  const T* q = nullptr;             // [rows, heads, latent+rope]
  const T* latent_cache = nullptr;  // cache row r at + r*cache_row_stride: [len, latent+rope]
  int64_t cache_row_stride = 0;     // elements
  const int32_t* lengths = nullptr;     // [rows] device, each in [0, max_length]
  const int32_t* cache_rows = nullptr;  // [rows] device, optional (see above)
  int max_length = 0;                   // host bound used to size the grid and workspace
  T* out = nullptr;                     // [rows, heads, latent]
  int latent = kMlaLatentMax;
  int rope = kMlaWidthMax - kMlaLatentMax;
  int rows = 0;
  int heads = 16;
  float scale = 0.0f;
  int split_tokens = 256;   // fixed; part of the numerics (changing it changes bits)
  float* workspace = nullptr;  // mla_decode_workspace_floats(...) fp32
  Stream stream = nullptr;
  MlaImpl impl = std::is_same_v<T, float> ? MlaImpl::scalar : MlaImpl::tensor_core;
  // tensor_core only: consecutive queries per block, 1, 2 or 4 (0 = 2 when cache_rows is set,
  // else 1; 4 runs one tile buffer). Queries of one block that read the same cache row share its
  // tiles (prefill); for decode (every query its own row) pass 1. Never changes results (tested).
  int queries_per_block = 0;
  // tensor_core only: cache tile buffers per block, 1 or 2 (0 = 1 when there are at least two
  // blocks per SM, else 2). Never changes results (tested).
  int tile_buffers = 0;
  // tensor_core, one query per block only: a split's 4 tiles walked by one block (1), or by the 4
  // blocks of a cluster, one tile each (2; needs split_tokens 256, 16-byte aligned rows, width
  // % 8 == 0 and mla_tile_parallel_available()); 0 = the cluster where the walk would leave
  // most SMs idle (small batches). Never changes results (tested).
  int tile_parallel = 0;
  // The cluster kernel only: how its blocks exchange the row maxima and P (kernels/mla_tc.cuh):
  // 1 pull, 2 push, 3 async (st.async on mbarriers); 0 = ATLAS_MLA_EXCHANGE's (pull, push or
  // async; unset: async). Never changes results (tested).
  int cluster_exchange = 0;
  // The cluster kernel under the async exchange only: where max_length has at most two splits,
  // the split merge inside the kernel (the two splits of a query in one cluster of 8 blocks,
  // length-0 queries' zeros written there too) and no merge launch (2), or the merge launch (1);
  // 0 = 2 where the clusters of 8 fit the SMs at once (session 70). Never changes results
  // (tested).
  int cluster_merge = 0;
  // A decode step's launch right after the latent cache kernel (one query per cache row, which
  // wrote slot lengths[q] - 1 and nothing else): the cluster kernel copies the older slots before
  // its launch-overlap wait (kern::MlaTcParams::stable_prefix). Never changes results.
  bool stable_prefix = false;
};
// Whether this GPU and build run the tile-parallel (cluster) MLA kernel. The first call
// synchronises the device: make it outside any capture (mla_decode's first call does).
bool mla_tile_parallel_available();
using MlaDecodeArgs = MlaDecodeArgsT<uint16_t>;
size_t mla_decode_workspace_floats(int rows, int heads, int max_length, int split_tokens);
void mla_decode(const MlaDecodeArgs& a);
void mla_decode(const MlaDecodeArgsT<float>& a);  // impl must be scalar (the default for f32)

// ---- attention probabilities for the pattern hook (kernels/mla_pattern.cuh) ---------------
// out[q][h][j] = the official eager softmax of query q, head h over slots j < lengths[q] of its
// cache row (bf16: scores bf16(bf16(q~.c) * scale), probabilities rounded to bf16; f32: no
// rounding), 0 for j >= lengths[q]. Only for observers: one block per (query, head).
template <class T>
struct MlaPatternArgsT {
  const T* q = nullptr;                 // [rows, heads, width] absorbed queries (latent | rope)
  const T* latent_cache = nullptr;      // cache row r at + r*cache_row_stride: [slots, width]
  int64_t cache_row_stride = 0;         // elements
  const int32_t* lengths = nullptr;     // [rows] device, each in [0, slots]
  const int32_t* cache_rows = nullptr;  // [rows] device, optional (null: query r reads row r)
  float* out = nullptr;                 // [rows, heads, slots] fp32 (probabilities, bf16 values in bf16 mode)
  int rows = 0;
  int heads = 0;
  int width = 0;
  int slots = 0;  // host bound on the lengths (the out row stride)
  float scale = 0.0f;
  Stream stream = nullptr;
};
void mla_pattern(const MlaPatternArgsT<uint16_t>& a);
void mla_pattern(const MlaPatternArgsT<float>& a);
// Host side of the pattern hook: the device result [B*T, heads, slots] (slots = packed cache
// slots, real tokens only) laid out as the CPU backend's [B, heads, T, Tk] over the timeline's
// token positions. key_slot[b * Tk + j] = the cache slot of row b's token j, or -1 for padding;
// query (b, t) sees slot s iff s < qlen[b * T + t]. Everything else is 0.
std::vector<float> pattern_to_timeline(const std::vector<float>& slot_probs, const std::vector<int32_t>& key_slot,
                                       const int32_t* qlen, int64_t B, int64_t T, int64_t heads, int64_t slots,
                                       int64_t Tk);

// ---- GEMM: out[M,N] = x[M,K] . W[N,K]^T (PyTorch Linear layout) ----------------------------
// bf16 inputs, fp32 accumulation, bf16 or fp32 output (fp32 for the router logits: products of
// bf16 values are exact in fp32, so this equals the official fp32 GEMM on upcast operands).
//   batch_invariant: atlas's own tensor-core kernels (kernels/gemm_mma.cuh). Contract, per output
//     element, with the fixed K slice width S = 256: total = +0 (fp32); for each slice
//     s = 0, 1, ..., ceil(K/S)-1 in ascending order: acc = +0; for each 16-wide k-chunk c of the
//     slice in ascending order: acc = mma.sync.m16n8k16.row.col.f32.bf16.bf16.f32(
//     x[m, 16c..16c+15], w[n, 16c..16c+15], acc), elements past K read as 0, standard fragment
//     positions; then total = total + acc (fp32); finally one rounding of total (bf16
//     round-to-nearest-even, or none for f32 out). S is a constant of the contract, never derived
//     from M or the tile: the slices are what let small-M calls split K over warps (the slice
//     sums are added in slice order) while large tiles keep a running total. Nothing about M, the
//     tile, the batch or the group enters, so a row's bits are the same for M = 1 or 1000, in
//     any tile configuration, dense, batched or grouped (tests/cuda checks all of these). It is
//     not the CPU reference's FMA chain (tensor cores sum each chunk in their own order), so
//     against ref::gemm it agrees within a stated tolerance, not bit for bit.
//     Fast path: K, the row/batch strides of x and w multiples of 8 and x, w 16-byte aligned
//     (every DeepSeek-V2 shape); anything else runs a predicated path of the same kernel with
//     the same bits (tiny test models, odd slices), so no shape is refused.
//   fast: cuBLASLt (its heuristic's first algorithm, plan cached per shape); deterministic for a
//     fixed shape, but the algorithm may change with M, so rows are NOT guaranteed batch invariant.
//   cublaslt_pinned (experimental): the algorithm cuBLASLt's heuristic picks for M = 128 with
//     split-K forced to 1, reused for every M of that (N, K, out type). cuBLAS documents no
//     row invariance for this; tests/cuda measures whether it holds (docs/cuda-sessions.md, session 2).
//   fma_chain: the original scalar kernel (one fp32 FMA chain per output over k ascending, the
//     CPU reference's exact order, bit-exact to ref::gemm); slow, kept as an on-device
//     cross-check of the reference.
// CUDA graphs: gemm() and grouped_gemm() allocate nothing, never synchronise and read no device
// data on the host, so they can be captured, after one first call outside any capture (that
// call does the one-time setup: kernel shared-memory limits, SM count, the device error flag,
// the cuBLASLt handle and workspace; each new cuBLASLt shape also builds its plan on its first
// call, so warm up every fast-mode shape before capturing it).
enum class GemmMode { batch_invariant, fast, cublaslt_pinned, fma_chain };
enum class OutType { bf16, f32 };
// The next GEMM's weights pulled into L2 by this launch's blocks part of the way through their
// own weight stream (session 33; ATLAS_MOE_PREFETCH): a hint that writes nothing, so never bits.
// The lean stream kernel (gemm_wgstream_lean_kernel) takes it; other configs ignore it. Dense:
// `bytes` of w. Grouped: `bytes` of w_groups[g] (device array) for each group g with rows in the
// launch's own offsets (the down's experts are the gate|up's), groups <= 256. bytes: a multiple
// of 128 (16-byte aligned addresses); at: each block issues its share at step (steps * at) / 4 of
// its loop (0: first, 4: after the loop).
struct L2NextWeights {
  const void* w = nullptr;
  const uint16_t* const* w_groups = nullptr;
  int64_t bytes = 0;
  int at = 0;
};

struct GemmArgs {
  const uint16_t* x = nullptr;  // [M, K] bf16, row-major, row stride x_stride
  // [N, K] bf16, row-major, row stride w_stride. A weight no kernel of the stream writes: under
  // launch overlap a dense GEMM reads it before its predecessor is done (the L2 prefetch, and
  // since session 21 the staged split-K kernel's first slices into shared memory).
  const uint16_t* w = nullptr;
  void* out = nullptr;          // [M, N] bf16 or fp32, row stride out_stride
  OutType out_type = OutType::bf16;
  int M = 0, N = 0, K = 0;
  // Row strides in elements, 0 = dense (K, K, N). Strided operands let one head's slice of a
  // [M, heads, d] activation or one head's block of a weight be used in place (MLA absorption).
  int64_t x_stride = 0, w_stride = 0, out_stride = 0;
  GemmMode mode = GemmMode::batch_invariant;
  // Strided batch: `batch` independent products of the same shape; product i reads
  // x + i*x_batch_stride and w + i*w_batch_stride and writes out + i*out_batch_stride
  // (elements). One launch for e.g. the 16 per-head MLA absorptions.
  int batch = 1;
  int64_t x_batch_stride = 0, w_batch_stride = 0, out_batch_stride = 0;
  // Fused gate|up + SiLU (the MLP's first half): gated = I > 0 says w holds 2I rows, gate rows
  // [0, I) then up rows [I, 2I), N = 2I, and out receives act [rows, I] (dense, out_stride 0)
  // = bf16(bf16(silu(gate)) * up): the bits of this GEMM into [rows, 2I] followed by silu_gate,
  // in one launch where the chosen config can fuse it (tiled, wgmma and cluster configs); the
  // others run exactly that pair of steps through gated_scratch ([rows, 2I] bf16, dense).
  // bf16 out, batch 1.
  int gated = 0;
  uint16_t* gated_scratch = nullptr;
  Stream stream = nullptr;
  L2NextWeights next{};  // (dense: w only)
};
void gemm(const GemmArgs& a);

// o_proj and the add + norm after it in one launch (session 23; written after the session's GPU
// time was spent, so off unless ATLAS_GEMM_TAILS=1 until its tests have run on a GPU):
// gemm(a), then add_rmsnorm({.x = t.x, .y = a.out, .weight = t.weight, .out = t.out, .rows = 1,
// .dim = t.dim, .eps = t.eps}), the same bits, where gemm(a) would run the staged 8-warp split-K
// kernel on one row (o_proj at a batch-1 decode step): its last block adds and norms the
// finished row (kernels/gemm_tail.cuh). Returns false and launches nothing otherwise (the
// switch off, another config, more rows, f32 or fast mode, a capture before the stream's first
// eager call): the caller runs the two launches.
struct GemmAddRmsNormArgs {
  uint16_t* x = nullptr;             // [dim] the residual stream row, updated in place
  const uint16_t* weight = nullptr;  // [dim] the norm's weight
  uint16_t* out = nullptr;           // [dim] the normed row (must not alias x or the GEMM's out)
  int dim = 0;                       // must equal the GEMM's N
  float eps = 1e-6f;
};
bool gemm_add_rmsnorm(const GemmArgs& a, const GemmAddRmsNormArgs& t);
// How many tailed launches gemm_add_rmsnorm made in this process (tests check that the tail ran).
int64_t gemm_tailed_launches();
// add_rmsnorm({.x = n.x, .y = n.y, .weight = n.weight, .out = n.h_out, .rows = 1, .dim = n.dim,
// .eps = n.eps}) then gemm(a) with a.x = n.h_out, in one launch (session 43, kernels/gemm_tail.cuh
// AddRmsNormPrologue; ATLAS_ROUTER_NORM=1, off by default: slower, s45-1 / s45-2):
// the router GEMM of a batch-1 decode step with the post-attention add + norm inside, the same
// bits, but the residual sum goes to n.x_out (n.x is only read: every block reads it while block
// 0 stores the sum). Where gemm(a) would run the staged 8-warp split-K kernel on one row with fp32
// out, batch-invariant, and n.dim = a.K <= 2048; returns false and launches nothing otherwise
// (the switch off included: the caller makes the two calls); bad arguments throw.
struct GemmAfterAddRmsNormArgs {
  const uint16_t* x = nullptr;       // [dim] the residual stream row before the sum
  const uint16_t* y = nullptr;       // [dim] the addend
  const uint16_t* weight = nullptr;  // [dim] the norm's weight
  uint16_t* x_out = nullptr;         // [dim] the sum (must not alias x, y or h_out)
  uint16_t* h_out = nullptr;         // [dim] the normed row (the GEMM's x)
  int dim = 0;                       // must equal the GEMM's K
  float eps = 1e-6f;
};
bool gemm_after_add_rmsnorm(const GemmArgs& a, const GemmAfterAddRmsNormArgs& n);
// How many fused launches gemm_after_add_rmsnorm made in this process (tests check that it ran).
int64_t gemm_router_norm_launches();
// Tests: 1 or 2 let gemm_after_add_rmsnorm launch (the model's fork of the shared experts:
// 1 programmatic, 2 after the launch's end), 0 never, -1 (the default) as ATLAS_ROUTER_NORM says;
// process-wide. Never bits.
void gemm_set_router_norm(int mode);
// ATLAS_ROUTER_NORM's mode (or the test override's): 0 off, 1 on with the shared experts forked
// programmatically from the router's launch, 2 ("joined") on with them forked after its end.
int gemm_router_norm_mode();
// A decode step's absorbed-query GEMM and latent_to_cache(l) in one launch (session 32,
// kernels/gemm_latent.cuh): latent_to_cache(l) then gemm(a), the same bits and device errors,
// where gemm(a) would run the tiled 16-row config in a plain launch (the absorbed query of a
// few rows), the output is bf16, the mode batch-invariant, and the latent <= 2048 (the launch's
// extra row of blocks runs the latent job, one block per token). The two must be independent:
// a's output must not overlap l's queries' outputs or its cache, nor l's inputs a's (the model's
// absorbed query writes qt[.., :dc], the latent job qt[.., dc:] and the cache). Returns false
// and launches nothing otherwise (the caller runs the two launches); bad arguments of either
// throw an Error as gemm() and latent_to_cache() would.
bool gemm_with_latent(const GemmArgs& a, const LatentCacheArgsT<uint16_t>& l);
// How many fused launches gemm_with_latent made in this process (tests check that it ran).
int64_t gemm_latent_launches();
// mla_decode(a), then gemm(v) for the value GEMM over its output (v.x = a.out, one product per
// head, K = a.latent), with the attention's split merge inside v's launch (session 32,
// kernels/gemm_merge.cuh; the model's ATLAS_MLA_MERGE_VALUE=1, off by default: slower in
// s33-1): one launch boundary fewer at a decode step. The same bits, o_lat included. Where it does
// not apply (the scalar attention, more than 16 rows, f32 out, fast mode, a forced config,
// another stream or layout) it launches nothing and returns false: the caller makes the two
// calls. Bad arguments throw as mla_decode() and gemm() would.
bool mla_decode_with_value(const MlaDecodeArgs& a, const GemmArgs& v);
// How many merged launches mla_decode_with_value made in this process (tests check that it ran).
int64_t mla_merge_value_launches();
// Tests: 1 lets gemm_add_rmsnorm launch its tail, 0 never, -1 (the default) as ATLAS_GEMM_TAILS
// says; process-wide, like gemm_force_config. Never bits.
void gemm_set_tails(int mode);
// The router GEMM and the routing after it in one launch (session 33, kernels/gemm_tail.cuh
// RouteTail; ATLAS_ROUTE_TAIL=1, off by default: measured slower, s33-4): gemm(a) (the logits, fp32 out,
// one row), then moe_route(r, p) over them (r.logits = a.out), the same bits and device
// errors, where gemm(a) would run the staged split-K config and r routes one token greedily
// over at most 64 experts (route_permute_kernel's one-token path): the launch's last block
// routes. Returns false and launches nothing otherwise (the caller makes the two calls); bad
// arguments throw as gemm() and moe_route() would.
// ATLAS_ROUTE_CLUSTER=1 (session 41, off by default) runs, in gemm_moe_route's place, the router
// GEMM of one row on the cluster config (c16x64/4w: one 64-column tile, one block per K slice,
// the slice sums added in block 0 through distributed shared memory) with block 0 routing the
// token after the cluster's last barrier (gemm_cluster_route_kernel, kernels/gemm_tail.cuh):
// the same bits, one launch, no grid-wide counter; where it cannot run (no cluster launch, rows
// not 16-byte aligned, more than 64 experts, launch overlap without the staged-early path) it
// returns false as above.
bool gemm_moe_route(const GemmArgs& a, const RouterArgs& r, const MoePermuteArgs& p);
// How many routed launches gemm_moe_route made in this process (tests check that it ran): the
// split-K tail's, the cluster route's.
int64_t gemm_route_tail_launches();
int64_t gemm_route_cluster_launches();
// Tests: 1 lets gemm_moe_route launch its split-K tail, 2 the cluster route, 0 neither, -1 (the
// default) as ATLAS_ROUTE_CLUSTER and ATLAS_ROUTE_TAIL say.
void gemm_set_route_tail(int mode);
// A batch-1 decode step's MoE combine + residual add + next input norm inside the next layer's
// q|kv_a GEMM (session 42, kernels/gemm_combine.cuh; ATLAS_COMBINE_QKV=1 or flag, off by
// default): moe_combine_add_rmsnorm(c) then gemm(a) with a.x = c.out, the same bits, but the
// residual sum goes to x_out (c.x is only read: other blocks read it while the sum is stored)
// and c.out gets the normed row as well. One launch on the cluster config c16x64/4w (one block per
// 256-wide K slice, the norm's sum of squares exchanged through distributed shared memory), where
// it can run: one token, one row, bf16, batch-invariant, k <= 8, c.dim = a.K a multiple of 64 of
// at most 2048 (8 slices), 4-byte aligned rows, 16-byte GEMM operands and cluster launch on this
// GPU. Returns false and launches nothing otherwise (the caller makes the two calls); bad
// arguments throw.
// ready (optional): where the caller did not join the stream that wrote c.addend (the shared
// experts on the side stream) before this launch, a flag that gemm_combine_signal raises on
// that stream after them: every block polls it (acquire) before reading c.addend, and stages
// its weights before the launch-overlap wait (session 42, ATLAS_COMBINE_QKV=flag). A measurement
// form only: nothing guarantees that the flag's writer gets an SM while these blocks spin (a
// run hung, s42-8); a programmatic dependency on that stream is the safe form (docs/cuda-sessions.md).
// weights_early: stage the weights before the launch-overlap wait without a flag (the caller
// made this launch programmatically dependent on the addend's writer: ATLAS_COMBINE_QKV=event).
bool gemm_combine_norm(const GemmArgs& a, const MoeCombineNormArgsT<uint16_t>& c, uint16_t* x_out,
                       const uint32_t* ready = nullptr, bool weights_early = false);
// On `stream`: flags[i] = (i == index) for i < count, released at GPU scope once the stream's
// earlier kernels are done (a one-thread launch). The flags of the other layers drop to 0: their
// pollers ran before (the stream was forked from theirs after them).
void gemm_combine_signal(uint32_t* flags, int count, int index, Stream stream);
// ATLAS_COMBINE_QKV's mode (or the test override's): 0 off, 1 joined, 2 "flag", 3 "event" (the
// default since session 45: the shared experts' down records an event that the fused launch's
// stream waits on: ProgrammaticEventScope, stream_wait_programmatic).
int gemm_combine_mode();
// Whether gemm_combine_norm may launch (the switch or the test override; its other conditions
// aside): the caller defers the combine only then.
bool gemm_combine_norm_on();
// How many fused launches gemm_combine_norm made in this process (tests check that it ran).
int64_t gemm_combine_norm_launches();
int64_t gemm_combine_flagged_launches();  // (those with a ready flag)
int64_t gemm_combine_early_launches();    // (those staging their weights early without one)
// Tests: 1 lets gemm_combine_norm launch, 2 in the flagged form, 3 in the event form, 0 not,
// -1 (the default) as ATLAS_COMBINE_QKV says.
void gemm_set_combine_norm(int mode);
// ATLAS_COMBINE_DIRECT (session 46; off until measured): the fused launch loads the token's k
// routed rows as rows 0..k-1 of the routed down's output (one token: its pairs are exactly those
// rows) beside their slots, and picks each slot's row from registers, instead of loading the
// slots first (one dependent L2 round after the launch-overlap wait instead of two; the same
// values in the same order: the same bits). Tests: 1 on, 0 off, -1 as the variable says; the
// launches that took it.
void gemm_set_combine_direct(int mode);
int64_t gemm_combine_direct_launches();

// Tile configurations of the batch_invariant kernel (largest first). Every one gives the same
// bits by the contract above; they differ in speed only. gemm() and grouped_gemm() pick one
// from the shape (never from the data); tests and benchmarks force one to check that claim and
// to time each. gemm_force_config(-1) restores the automatic choice (process-wide setting).
int gemm_config_count();
std::string gemm_config_name(int config);  // "128x128x32/4" = BM x BN x BK / stages; "splitk16x8/8w" = split-K
                                          // 16 x 8 tile, 8 warps on K slices
void gemm_force_config(int config);
// Stream-K launches (the configs "streamwg64x8/4lk" and "/8l64k"; ATLAS_GEMM_STREAMK): tests set
// their grid (blocks; 0, the default: every resident slot, at most one per (tile, K slice) unit)
// to check the split tiles' folds at every share, and count the launches that ran stream-K
// (grouped problems and those whose workspace does not fit run the unsplit loop: same bits).
void gemm_set_streamk_grid(int blocks);
int64_t gemm_streamk_launches();
// Which problems take stream-K where no config is forced (tests): -1 ATLAS_GEMM_STREAMK's
// (the default), 0 none, 1 wide, 2 long, 3 both (gemm_streamk_setting).
void gemm_set_streamk(int mode);
// Whether the batch-invariant GEMMs' weight copies carry an L2 evict_first policy (on by default;
// ATLAS_L2_EVICT_FIRST=0 or set_gemm_weight_evict_first(false) turns it off for launches after
// the call; captured graphs keep theirs). A caching hint only: the same bits either way.
void set_gemm_weight_evict_first(bool on);
bool gemm_weight_evict_first();
// Block stamps (a diagnostic, session 38; kernels/block_stamp.cuh): while on, the MoE phase's
// default GEMM configs (the lean stream loop, 16x32x128/4u, the staged split-K) run their stamped
// instantiations, the same work and bits, and thread 0 of every block records its SM and its
// %globaltimer start, end of launch-overlap wait and tile lookup (go; 0: the block had no tile)
// and end. The layout is the device record's. ATLAS_BLOCK_STAMPS=FILE turns them on at the first
// GEMM (a ring of the last 262,144 blocks) and writes FILE (CSV, tools/profile/
// block_stamps_summary.py reads it) at exit. Launches see the setting at launch (graphs captured
// earlier keep theirs).
struct BlockStampRecord {
  uint64_t t0 = 0, go = 0, t1 = 0;  // ns
  uint64_t site = 0;                 // the launch's weight address (dense w, grouped w_groups)
  int32_t n = 0, k = 0, grid = 0, block = 0, smid = 0;
  int32_t kind = 0;   // 0 the lean stream loop, 1 the tiled kernel, 2 split-K
  int64_t bytes = 0;  // weight bytes the block copied (0: not counted)
};
// On, with a fresh ring of `capacity` records (a power of two; outside any capture).
void gemm_block_stamps_start(size_t capacity);
// The records so far, oldest first (the last `capacity` where more were written); the ring is
// emptied, stamps stay on.
std::vector<BlockStampRecord> gemm_block_stamps_take();
// Off (the ring freed).
void gemm_block_stamps_stop();
// The config a batch_invariant gemm() / grouped_gemm() with these arguments would run (for
// benchmark labels and tuning; -1 for an empty grouped problem).
int gemm_chosen_config(const GemmArgs& a);
// How many times a stream's GEMM scratch block (a sliced launch's slice sums, the TMA kernel's
// gathered rows) was freed to make a larger one, in this process. A launch captured into a graph
// holds the block's address, so a graph captured before a move is stale: the model recaptures
// its graphs when this changes (CudaModelT::current_epoch).
uint64_t gemm_scratch_moves();
// Whether the TMA config ("tma192x128x64/5", kernels/gemm_tma.cuh) can run here: sm_90a device
// code, the driver's tensor-map encoder, ATLAS_GEMM_TMA not "0" (read once, at the first GEMM).
// Where it cannot, or a call does not suit it (a grouped call without w_base, a
// gather over 1 GiB, a refused tensor map), that config runs the cp.async wgmma kernel of the
// same tile instead: the same bits either way. ATLAS_GEMM_TMA_PERSISTENT=0 (read with it) runs
// one block per tile instead of the persistent grid below (measurements; the same bits).
bool gemm_tma_available();
// The TMA kernel is persistent: at most one block per SM, each walking tiles blockIdx.x +
// i * gridDim.x. Tests cap its grid at `blocks` (0: one per SM, the default) so that small
// problems walk many tiles per block; process-wide, like gemm_force_config. Never bits.
void gemm_set_tma_blocks(int blocks);

// ---- grouped GEMM (MoE experts), routing stays on the device ------------------------------
// Rows are sorted by group (expert); group g owns rows [offsets[g], offsets[g+1]) and
// multiplies them by its own weight w[g]:  out[r, :] = A[r, :] . w[g]^T  for r in group g,
// where A[r] = x[x_rows ? x_rows[r] : r] (the optional gather fuses the MoE permutation into the
// A loads). offsets live on the device and are never read by the host, so a MoE layer needs no
// host round trip; `max_rows` (host) bounds offsets[groups] and sizes the grid (one launch of
// n-tiles x (ceil(max_rows / BM) + min(groups, max_rows)) blocks; blocks past the last real tile
// exit at once). Each row's result is bit-identical to the batch_invariant `gemm` of that row
// alone with w[g] (same kernel, same contract), so expert outputs do not depend on which other
// rows share the expert. Rows in [offsets[groups], max_rows) are not written.
// Checked on the device (the error flag; check_device_errors() throws naming the field):
// offsets[0] == 0, non-decreasing, offsets[groups] <= max_rows (else nothing is written);
// x_rows entries in [0, x_rows_limit) when x_rows_limit > 0, >= 0 always (a bad row reads as
// zeros); each w[g] non-null and, on the fast path, 16-byte aligned (else that tile is skipped).
// A grouped GEMM of at most this many rows in all (one or two tokens' routed experts) takes the
// few-row configs (gemm.cu, grouped_config); the model launches the shared experts' down first
// in the same steps (ATLAS_SHARED_DOWN_FIRST).
constexpr int64_t kGroupedFewMaxRows = 16;
// A grouped GEMM over one token's routed experts may find its groups' table by routing the
// token again inside the launch (session 39, ATLAS_MOE_SELF_ROUTE; kernels/gemm_wgstream.cuh
// kRoute) instead of waiting for the routing kernel before it. The caller's promise: the launch
// directly follows moe_route() of that token (one token, greedy, the wait-first routing kernel)
// on the same stream, whose offsets and rows it is given, from these logits and this rule. The
// launcher uses it only where the config has that instantiation (the lean stream loop at k
// rows, k <= groups <= 64); the bits are the same either way. Off by default: slower (s39-3).
struct GroupedSelfRoute {
  const float* logits = nullptr;  // [groups] fp32, the token's router logits; null: off
  int k = 0;
  bool norm_topk_prob = false;
  float scaling = 1.0f;  // routed_scaling_factor (without normalisation)
};

// Launch-order promises for a pair of grouped launches on one stream (session 44, the model's
// ATLAS_MOE_DOWN_EARLY; timing only, the same bits). wait_first: under launch overlap the launch
// waits for its predecessor before it releases the next launch (the lean stream loop's
// wait-first instance; a config without one launches without launch overlap), so everything its
// predecessor wrote is final when the next launch's blocks start; it excludes self_route.
// tables_before_wait: the caller promises that the launch before this one on the stream kept
// wait_first and that the offsets table was final before that launch's wait; the few-row down's
// config (16x32x128/4u) then finds its tile and issues its first weight steps before its own
// wait (kernels/gemm_mma.cuh, early_weight_steps). Unkept, the promise would let a block read a
// table still being written: set both or neither.
struct GroupedOrder {
  bool wait_first = false;
  bool tables_before_wait = false;
};

struct GroupedGemmArgs {
  const uint16_t* x = nullptr;              // [*, K] bf16, row stride x_stride
  const int32_t* x_rows = nullptr;          // [max_rows] device, optional: A row r = x row x_rows[r]
  // [groups] device array of device pointers, each [N, K]. Model weights no kernel of the stream
  // writes, the array too: under launch overlap the lean stream loop copies the array before its
  // predecessor is done (session 40, kernels/gemm_wgstream.cuh LeanTable).
  const uint16_t* const* w = nullptr;
  const int32_t* offsets = nullptr;         // [groups + 1] device, non-decreasing, offsets[0] = 0
  void* out = nullptr;                      // [max_rows, N], row stride out_stride
  OutType out_type = OutType::bf16;
  int groups = 0;
  int max_rows = 0;  // host bound: offsets[groups] <= max_rows (checked on the device)
  int N = 0, K = 0;
  int64_t x_stride = 0, w_stride = 0, out_stride = 0;  // elements, 0 = dense
  int64_t x_rows_limit = 0;  // rows of x, bound for x_rows entries (0 = only negatives checked)
  // Optional, for the TMA kernel (gemm_tma_available()): the groups' weights lie at one stride,
  // w[g] == w_base + g * w_group_stride (elements; checked on the device: error "w"). Without
  // them the grouped call runs the cp.async kernels (same bits). On that kernel, without x_rows,
  // x must hold x_rows_limit rows (max_rows where x_rows_limit is 0): whole boxes of rows are read.
  const uint16_t* w_base = nullptr;
  int64_t w_group_stride = 0;
  // Fused gate|up + SiLU (the MLP's first half): gated = I > 0 says w holds 2I rows, gate rows
  // [0, I) then up rows [I, 2I), N = 2I, and out receives act [rows, I] (dense, out_stride 0)
  // = bf16(bf16(silu(gate)) * up): the bits of this GEMM into [rows, 2I] followed by silu_gate,
  // in one launch where the chosen config can fuse it (tiled, wgmma and cluster configs); the
  // others run exactly that pair of steps through gated_scratch ([max_rows, 2I] bf16, dense).
  // bf16 out, batch 1.
  int gated = 0;
  uint16_t* gated_scratch = nullptr;
  Stream stream = nullptr;
  L2NextWeights next{};  // (grouped: w_groups only)
  GroupedSelfRoute self_route{};
  GroupedOrder order{};
};
void grouped_gemm(const GroupedGemmArgs& a);
// How many grouped launches ran the wait-first instance / the early weight steps' instance
// (tests check that the paths ran).
int64_t grouped_wait_first_launches();
int64_t grouped_early_weight_launches();
int grouped_gemm_chosen_config(const GroupedGemmArgs& a);
// How many grouped launches in this process routed their token themselves (GroupedSelfRoute;
// tests check that the path ran).
int64_t grouped_self_routed_launches();

// ---- f32 GEMM (the f32 checking mode, `--compute f32`) ------------------------------------
// out[M,N] = x[M,K] . W[N,K]^T with f32 operands and output (kernels/gemm_f32.cuh). Contract
// per output element: acc = +0; for k = 0..K-1 ascending: acc = fmaf(x[m,k], w[n,k], acc);
// out = acc (no rounding but fp32's). Nothing of M, the tile, the batch or the group enters,
// so it is batch invariant by construction and bit-exact to ref::gemm_f32 (std::fma, same
// order). Tiled through shared memory; slow next to the bf16 tensor-core kernels, which is
// fine for a checking mode. Capture safe (no allocation, no synchronisation, no host read).
struct GemmF32Args {
  const float* x = nullptr;  // [M, K], row stride x_stride
  const float* w = nullptr;  // [N, K], row stride w_stride
  float* out = nullptr;      // [M, N], row stride out_stride
  int M = 0, N = 0, K = 0;
  int64_t x_stride = 0, w_stride = 0, out_stride = 0;  // elements, 0 = dense (K, K, N)
  // Strided batch, as GemmArgs: product i reads x + i*x_batch_stride, w + i*w_batch_stride and
  // writes out + i*out_batch_stride.
  int batch = 1;
  int64_t x_batch_stride = 0, w_batch_stride = 0, out_batch_stride = 0;
  Stream stream = nullptr;
};
void gemm_f32(const GemmF32Args& a);

// Grouped f32 GEMM (MoE experts), the GroupedGemmArgs contract with f32 operands: group g owns
// rows [offsets[g], offsets[g+1]) (device offsets, never read by the host), A row r =
// x[x_rows ? x_rows[r] : r], out[r] = A[r] . w[g]^T; each row's bits equal gemm_f32 of that
// row alone. Device checks raise the same error bits as grouped_gemm (offsets order and bound,
// x_rows range, null group weight), so check_device_errors() names them alike.
struct GroupedGemmF32Args {
  const float* x = nullptr;          // [*, K], row stride x_stride
  const int32_t* x_rows = nullptr;   // [max_rows] device, optional gather
  const float* const* w = nullptr;   // [groups] device array of device pointers, each [N, K]
  const int32_t* offsets = nullptr;  // [groups + 1] device, non-decreasing, offsets[0] = 0
  float* out = nullptr;              // [max_rows, N], row stride out_stride
  int groups = 0;
  int max_rows = 0;  // host bound: offsets[groups] <= max_rows (checked on the device)
  int N = 0, K = 0;
  int64_t x_stride = 0, w_stride = 0, out_stride = 0;  // elements, 0 = dense
  int64_t x_rows_limit = 0;  // rows of x, bound for x_rows entries (0 = only negatives checked)
  Stream stream = nullptr;
};
void grouped_gemm_f32(const GroupedGemmF32Args& a);

}  // namespace atlas::cuda
