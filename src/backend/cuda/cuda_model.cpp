// The CUDA forward pass (see cuda_model.h for the contract). One loop over layers, the same
// order and hook points as model/deepseek_v2.cpp; every op is a cuda_ops.h launcher on the
// model's stream. Shapes in comments: M = B*T tokens, H hidden, nh heads, dn/dr/dv head dims,
// dc kv_lora_rank, W = dc + dr the cache width.
//
// The model is a template over its element type Elem (weights, activations, cache, logits):
// uint16_t = bf16 (production) or float (the f32 checking mode, `--compute f32`). Both run this
// one loop, so the f32 mode checks the same indexing, routing, cache layout, MoE dispatch and
// hook firing as the bf16 path; only the launchers' overloads (and the GEMM / attention kernels
// behind them) differ. Elem is never called T here: T is the token count.
#include "backend/cuda/cuda_model.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <type_traits>
#include <vector>

#include "backend/cuda/cuda_ops.h"
#include "backend/cuda/pad_plan.h"
#include "core/bf16.h"
#include "core/error.h"
#include "decode/sample_core.h"
#include "model/hooks.h"
#include "model/rope.h"

namespace atlas::cuda {
namespace {

constexpr int kSplitTokens = 256;           // MLA split size: part of the numerics (docs/cuda.md)
// Decode-step graphs whose rows are all at most this long are captured with it as the MLA bound
// (two splits): the attention's split merge then runs inside its launch (the pair merge,
// MlaDecodeArgs::cluster_merge) and the graph has no merge launch (session 70).
constexpr int64_t kPairBound = 2 * kSplitTokens;
constexpr size_t kAlign = 256;              // device sub-allocation alignment (bytes)
constexpr size_t kMlaWorkspaceBudget = 512u << 20;  // bytes of MLA partials per launch

size_t align_up(size_t n) { return (n + kAlign - 1) / kAlign * kAlign; }

std::string gib(size_t bytes) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.2f GiB", double(bytes) / double(1ull << 30));
  return buf;
}


// A device allocation owned by RAII.
class DeviceBlock {
 public:
  DeviceBlock() = default;
  explicit DeviceBlock(size_t bytes) : bytes_(bytes), p_(device_alloc(std::max<size_t>(bytes, 1))) {}
  ~DeviceBlock() {
    // Never throw from a destructor: at process exit the CUDA runtime may already be unloading
    // (a model held in a static), and then cudaFree reports an error that is of no consequence.
    try {
      if (p_) device_free(p_);
    } catch (const Error&) {
    }
  }
  DeviceBlock(const DeviceBlock&) = delete;
  DeviceBlock& operator=(const DeviceBlock&) = delete;
  DeviceBlock(DeviceBlock&& o) noexcept : bytes_(o.bytes_), p_(o.p_) { o.p_ = nullptr; }
  DeviceBlock& operator=(DeviceBlock&& o) noexcept {
    std::swap(bytes_, o.bytes_);
    std::swap(p_, o.p_);
    return *this;
  }
  char* get() const { return static_cast<char*>(p_); }
  size_t bytes() const { return bytes_; }

 private:
  size_t bytes_ = 0;
  void* p_ = nullptr;
};

// The memory of a cache and what was captured against it: the device latent cache (per layer,
// per row, `capacity` slots of W values of the model's element type: bf16, or f32 in the
// checking mode; elem_bytes = 2 or 4), the pinned staging of a decode step, a decode run's ring
// and state, and the step graphs, whose kernels hold these addresses. A cache that ends hands its
// store to its model's CachePool (below, where the model has one: CudaModelOptions::cache_pool,
// off by default), and the model's next cache of the same shape takes it back, graphs included:
// its decode steps replay them from the first step, where a new store runs one step eagerly and
// then captures (session 62).
struct CacheStore {
  CacheStore(int64_t n_layers, int64_t batch, int64_t capacity, int64_t width, size_t elem_bytes)
      : layers(n_layers), batch(batch), capacity(capacity), width(width), elem_bytes(elem_bytes) {
    const size_t bytes = size_t(n_layers * batch * capacity * width) * elem_bytes;
    const MemoryInfo mem = memory_info();
    if (bytes > mem.free)
      fail("cuda", "kv cache", "needs " + gib(bytes) + " (" + std::to_string(n_layers) + " layers x " +
                                   std::to_string(batch) + " rows x " + std::to_string(capacity) +
                                   " tokens), the device has " + gib(mem.free) + " free");
    block = DeviceBlock(bytes);
  }
  ~CacheStore() {
    try {
      if (pinned) host_free_pinned(pinned);
      if (run_pinned) host_free_pinned(run_pinned);
    } catch (const Error&) {
    }
  }
  CacheStore(const CacheStore&) = delete;
  CacheStore& operator=(const CacheStore&) = delete;
  bool has_shape(int64_t n_layers, int64_t b, int64_t cap, int64_t w, size_t es) const {
    return layers == n_layers && batch == b && capacity == cap && width == w && elem_bytes == es;
  }

  const int64_t layers, batch, capacity, width;
  const size_t elem_bytes;
  DeviceBlock block;
  int32_t* pinned = nullptr;      // CudaCache::pinned()
  DeviceBlock run_state;          // CudaCache::run_state()
  int32_t* run_pinned = nullptr;  // CudaCache::run_host()
  // A decode run's step graph, without / with the sampling kernel [g], for steps of any length
  // up to the capacity / of at most kPairBound slots where the capacity is larger [k] (the
  // attention bound they were captured with: CudaModelT::graph_bound). (Session 24: pushes
  // alternating between two instances of it measured no faster: 421.8 vs 423.8 tok/s at one step
  // ahead, s24-4.)
  Graph run_graph[2][2];
  uint64_t run_epoch[2][2] = {{0, 0}, {0, 0}};  // the scratch layout each was captured against
  Graph decode_graph[2];           // forward()'s T = 1 step [k], captured on first use (CudaModel::forward)
  uint64_t graph_epoch[2] = {0, 0};    // the scratch layout each was captured against
  bool graph_samples[2] = {false, false};  // whether each was captured with the sampling kernel
  // Decode steps this store has run: its first runs eagerly (one-time setup inside the
  // launchers, cuBLASLt plans and kernel attributes, must not happen during a capture), later
  // ones from the graphs.
  int64_t decode_steps = 0;
};

// The store of the model's last ended cache, kept for its next cache of the same shape
// (CudaModelOptions::cache_pool, ATLAS_CACHE_POOL=1; off by default: in s62-1, an H100, batch-1
// decode on a taken-back store ran ~2% slower per step than on a new one, 412.7 against 420-421
// tok/s after the first token, in every later run, which outweighs the first token's 2.5 against
// 5-9 ms; the cause is not known). One store, of at most kMaxBytes of device memory: what a
// decode at a few rows holds (batch 1 at V2-Lite's width: ~31 KB a token), where the graph's
// capture is a visible part of a run; a large batch's cache is freed as before.
class CachePool {
 public:
  static constexpr size_t kMaxBytes = size_t(256) << 20;
  // The kept store if it has this shape, else null (a kept store of another shape is freed
  // first, so that its memory is free for the new cache).
  std::unique_ptr<CacheStore> take(int64_t n_layers, int64_t batch, int64_t capacity, int64_t width,
                                   size_t elem_bytes) {
    if (kept_ && kept_->has_shape(n_layers, batch, capacity, width, elem_bytes)) return std::move(kept_);
    kept_.reset();
    return nullptr;
  }
  void keep(std::unique_ptr<CacheStore> store) {
    if (store && store->block.bytes() <= kMaxBytes) kept_ = std::move(store);
  }
  void clear() { kept_.reset(); }

 private:
  std::unique_ptr<CacheStore> kept_;
};

// A cache: its store (above) and its timeline. Rows are packed: slot i of row b is the row's
// i-th real token (padding is never stored).
class CudaCache final : public Cache {
 public:
  // `pool`: where the store goes when the cache ends (null, or a pool already gone: freed).
  CudaCache(std::unique_ptr<CacheStore> store, std::weak_ptr<CachePool> pool)
      : real_(size_t(store->batch), 0), key_slot_(size_t(store->batch)), store_(std::move(store)),
        pool_(std::move(pool)) {}
  int64_t batch() const override { return store_->batch; }
  int64_t capacity() const override { return store_->capacity; }
  int64_t length() const override { return length_; }

  ~CudaCache() override {
    if (auto pool = pool_.lock()) pool->keep(std::move(store_));
  }
  CacheStore& store() const { return *store_; }
  template <class Elem>
  Elem* layer(int64_t li) const {
    if (sizeof(Elem) != store_->elem_bytes) fail("cuda", "kv cache", "element type differs from the model's");
    return reinterpret_cast<Elem*>(store_->block.get()) + li * store_->batch * store_->capacity * store_->width;
  }
  // Pinned host ints of one decode step: [5B] inputs (ids, pos, dst, qlen, qrow), [B] greedy
  // (or sampled) tokens out, then [B] sampling parameters (32 bytes = 8 ints each). The decode
  // graph copies from / to these fixed addresses.
  int32_t* pinned() {
    if (!store_->pinned) store_->pinned = static_cast<int32_t*>(host_alloc_pinned(size_t(14 * batch()) * 4));
    return store_->pinned;
  }
  int64_t length_ = 0;         // the shared timeline (what the caller sees)
  std::vector<int32_t> real_;  // real tokens stored per row
  // key_slot_[b][j]: the cache slot of row b's timeline token j, -1 for padding (never stored).
  // Only the pattern hook reads it (to lay its slot-indexed probabilities out over the timeline).
  std::vector<std::vector<int32_t>> key_slot_;
  // Decode runs (CudaModel::start_decode): one step's graph replayed per pushed step. The host's
  // ring in pinned memory, which the run's kernels read and write directly (kernels/
  // decode_run.cuh), R = DecodeRun::kMaxPending slots: [R][5B] staged inputs, [R][B][8]
  // sampling parameters (32-byte RowParams; 8-byte aligned: 20 R B bytes in), [R][B] tokens out,
  // [R] error flags, then [16] zeros (the source of a step-index reset). The step index is one
  // device int.
  static constexpr int64_t kRing = DecodeRun::kMaxPending;
  int64_t run_params_at() const { return kRing * 5 * batch(); }
  int64_t run_out_at() const { return kRing * 13 * batch(); }
  int64_t run_err_at() const { return kRing * 14 * batch(); }
  int64_t run_zero_at() const { return run_err_at() + kRing; }
  int32_t* run_host() {
    if (!store_->run_pinned) {
      store_->run_pinned = static_cast<int32_t*>(host_alloc_pinned(size_t(run_zero_at() + 16) * 4));
      std::memset(store_->run_pinned, 0, size_t(run_zero_at() + 16) * 4);
    }
    return store_->run_pinned;
  }
  // Device ints: [16] the step index, then [B] the last step's tokens (what the next step feeds).
  int32_t* run_state() {
    if (!store_->run_state.get()) store_->run_state = DeviceBlock(size_t(16 + batch()) * 4);
    return reinterpret_cast<int32_t*>(store_->run_state.get());
  }
  bool run_active = false;  // a DecodeRun of this cache exists (one at a time)

 private:
  std::unique_ptr<CacheStore> store_;
  std::weak_ptr<CachePool> pool_;
};

// Weights of the model's element type Elem (bf16 bits or f32).
template <class Elem>
struct MlpT {
  const Elem* gate_up = nullptr;  // [2I, H]: gate rows then up rows (one GEMM for both)
  const Elem* down = nullptr;     // [H, I]
  int64_t inter = 0;              // I
};

// A MoE layer's expert matrices for the grouped GEMM: the device array of per-expert pointers,
// and (base, stride in elements) where the experts lie at one stride in the weight block, which
// the TMA GEMM kernel needs (GroupedGemmArgs::w_base; null base: not evenly spaced).
template <class Elem>
struct ExpertWeightsT {
  const Elem* const* ptrs = nullptr;  // [E] device array
  const Elem* base = nullptr;
  int64_t stride = 0;
};

template <class Elem>
struct LayerT {
  const Elem *ln1 = nullptr, *ln2 = nullptr;   // [H]
  const Elem* q = nullptr;                     // [nh*dq, H]
  const Elem *q_a = nullptr, *q_b = nullptr;   // [r, H], [nh*dq, r]
  const Elem* q_a_ln = nullptr;                // [r]
  const Elem* kv_a = nullptr;                  // [W, H]
  const Elem* q_kv = nullptr;                  // [nh*dq + W, H]: q then kv_a, back to back (no LoRA)
  const Elem* kv_a_ln = nullptr;               // [dc]
  const Elem* kv_b = nullptr;                  // [nh*(dn+dv), dc]
  const Elem* w_uk_t = nullptr;                // [nh, dc, dn]: W_UK^h transposed, for q~ = q_nope W_UK^h
  const Elem* o = nullptr;                     // [H, nh*dv]
  bool moe = false;
  MlpT<Elem> dense;
  const Elem* router = nullptr;  // [E, H]
  std::vector<MlpT<Elem>> experts;
  ExpertWeightsT<Elem> gate_up_w;  // experts[e].gate_up (grouped GEMM)
  ExpertWeightsT<Elem> down_w;     // experts[e].down
  bool has_shared = false;
  MlpT<Elem> shared;
};

// Converting uploads through two pinned staging buffers: converting chunk k overlaps the
// copy of chunk k-1 (before a copy is issued the previous one is waited for, so a buffer is
// never refilled while its copy is in flight). Converts to Elem: bf16 (f16 / f32 checkpoint
// values rounded to nearest even) or f32 (bf16 / f16 / f32 values widened exactly).
template <class Elem>
class Uploader {
 public:
  static constexpr size_t kChunkBytes = size_t(64) << 20;  // per staging buffer
  static constexpr size_t kChunk = kChunkBytes / sizeof(Elem);  // elements per staging buffer
  Uploader() {
    for (auto& b : buf_) b = static_cast<Elem*>(host_alloc_pinned(kChunkBytes));
  }
  ~Uploader() {
    try {
      stream_synchronize();
    } catch (...) {
    }
    for (auto* b : buf_) {
      try {
        host_free_pinned(b);
      } catch (const Error&) {
      }
    }
  }
  void upload(const TensorView& t, Elem* dst) {
    const int64_t n = t.numel();
    for (int64_t off = 0; off < n; off += int64_t(kChunk)) {
      const int64_t len = std::min<int64_t>(int64_t(kChunk), n - off);
      Elem* b = buf_[cur_];
      convert(t, off, len, b);
      stream_synchronize();
      copy_to_device_async(dst + off, b, size_t(len) * sizeof(Elem));
      cur_ ^= 1;
    }
  }
  void upload(const std::vector<Elem>& h, Elem* dst) {
    stream_synchronize();
    copy_to_device(dst, h.data(), h.size() * sizeof(Elem));
  }

 private:
  // Same-type copies go through memcpy in blocks; everything else converts element by element.
  template <class Src>
  static void copy_block(const Src* s, int64_t len, Elem* out) {
#pragma omp parallel for schedule(static) if (len >= (1 << 20))
    for (int64_t i = 0; i < len; i += 4096) std::memcpy(out + i, s + i, size_t(std::min<int64_t>(4096, len - i)) * sizeof(Elem));
  }
  static void convert(const TensorView& t, int64_t off, int64_t len, Elem* out) {
    constexpr bool f32 = std::is_same_v<Elem, float>;
    switch (t.dtype) {
      case DType::BF16: {
        const uint16_t* s = reinterpret_cast<const uint16_t*>(t.data) + off;
        if constexpr (!f32) {
          copy_block(s, len, out);
        } else {
#pragma omp parallel for schedule(static) if (len >= (1 << 20))
          for (int64_t i = 0; i < len; ++i) out[i] = bf16_to_f32(s[i]);
        }
        break;
      }
      case DType::F16: {
        const uint16_t* s = reinterpret_cast<const uint16_t*>(t.data) + off;
#pragma omp parallel for schedule(static) if (len >= (1 << 20))
        for (int64_t i = 0; i < len; ++i) out[i] = f32_to_elem<Elem>(f16_to_f32(s[i]));
        break;
      }
      case DType::F32: {
        const float* s = reinterpret_cast<const float*>(t.data) + off;
        if constexpr (f32) {
          copy_block(s, len, out);
        } else {
#pragma omp parallel for schedule(static) if (len >= (1 << 20))
          for (int64_t i = 0; i < len; ++i) out[i] = f32_to_bf16(s[i]);
        }
        break;
      }
      default:
        fail(t.file, t.name, "unsupported dtype " + std::string(dtype_name(t.dtype)) + " (expected BF16, F16 or F32)");
    }
  }
  Elem* buf_[2] = {nullptr, nullptr};
  int cur_ = 0;
};


template <class Elem>
class CudaModelT final : public Model {
 public:
  static constexpr bool kF32 = std::is_same_v<Elem, float>;
  static constexpr size_t kEs = sizeof(Elem);  // bytes per element
  using Mlp = MlpT<Elem>;
  using Layer = LayerT<Elem>;

  CudaModelT(const Checkpoint& ck, const CudaModelOptions& opts);
  ~CudaModelT() override {
    try {
      drop_late();
      if (pinned_ints_) host_free_pinned(pinned_ints_);
      if (late_arena_) host_free_pinned(late_arena_);
      if (edit_staging_) host_free_pinned(edit_staging_);
    } catch (const Error&) {
    }
    for (Event e : late_events_) event_destroy(e);
    stream_destroy(s_);
    stream_destroy(side_);
    event_destroy(fork_);
    event_destroy(join_);
    event_destroy(shared_done_);
    event_destroy(router_done_);
  }

  const ModelConfig& config() const override { return cfg_; }
  const LayerRange& layers() const override { return layers_; }
  Compute compute() const override { return kF32 ? Compute::F32 : Compute::BF16; }
  bool has_head() const override { return has_head_; }
  std::string backend() const override { return "cuda"; }
  bool supports_device_sampling() const override { return true; }

  std::unique_ptr<Cache> make_cache(int64_t batch, int64_t capacity) const override {
    if (batch <= 0 || capacity <= 0) fail("cuda", "make_cache", "batch and capacity must be > 0");
    const int64_t L = layers_.count(), W = cfg_.latent_dim();
    std::unique_ptr<CacheStore> store = pool_ ? pool_->take(L, batch, capacity, W, kEs) : nullptr;
    if (store)
      stream_synchronize(s_);  // (no work of its last cache may still read its ring or pinned ints)
    else
      store = std::make_unique<CacheStore>(L, batch, capacity, W, kEs);
    return std::make_unique<CudaCache>(std::move(store), pool_);
  }
  // A cache with a decode run in progress takes no forward() call (its next step would feed the
  // run's last token, not this call's); the run's own eager steps call forward_step().
  ForwardOutput forward(const ForwardInput& in, Cache& cache, const Hooks* hooks = nullptr) const override {
    if (const auto* c = dynamic_cast<const CudaCache*>(&cache); c && c->run_active)
      fail("forward", "cache", "the cache has a decode run in progress (end the run first)");
    return forward_step(in, cache, hooks);
  }
  using Model::forward;
  std::unique_ptr<DecodeRun> start_decode(Cache& cache, std::span<const int32_t> first_ids,
                                          AttentionForm attention = AttentionForm::Absorbed) const override;

 private:
  class Run;  // start_decode's DecodeRun
  ForwardOutput forward_step(const ForwardInput& in, Cache& cache, const Hooks* hooks) const;

  // Per-call device buffers, carved from one grow-only block (decode steps reuse it).
  struct Buffers {
    Elem *x, *h, *y, *q, *qa, *qn, *lat, *latn, *qkv, *qt, *olat, *heads, *gu, *act, *ys, *routed, *shared;
    // One row's second residual buffer (M = 1 only): where the q|kv_a launch with the MoE combine
    // inside (gemm_combine_norm) stores the residual sum, since its other blocks read x meanwhile;
    // layers_forward then swaps x and x_alt (the residual ping-pongs between the two).
    Elem* x_alt;
    // One row (M = 1 only): the post-attention norm's output as the side stream makes it for the
    // shared experts under ATLAS_SHARED_FORK=o_proj (the same bits as h).
    Elem* h_side;
    // One flag per layer (M = 1 under ATLAS_COMBINE_QKV=flag only, else null; zero until a
    // layer's shared experts are done, moe()): the q|kv_a launch with the combine inside polls
    // its layer's instead of the stream join.
    uint32_t* shared_ready;
    Elem *sgu, *sact;  // the shared experts' gate|up scratch and activation (they run on side_)
    Elem *hl, *logits;
    float *router_logits, *topk_w, *mla_ws;
    // ids, pos, dst_rows, qlen, qrow are consecutive [M] arrays (one upload for all five).
    int32_t *ids, *pos, *dst_rows, *qlen, *qrow, *last_rows, *topk_ids, *counts, *offsets, *sorted, *slot, *perm_ws;
    int32_t* greedy;
    int32_t *argmax_counters, *argmax_parts;  // the split argmax's (both null: one block per row)
    sample_core::RowParams* sample_params;  // [B]
    uint32_t* sample_ws;                    // sample_workspace_ints(B, V), only when sampling
  };
  // no_room: where non-null and the buffers would need a larger block (or new counters), it is
  // set and nothing is carved or allocated (the returned buffers are empty).
  Buffers carve(int64_t M, int64_t B, int64_t rows_out, int64_t mla_chunk, int64_t mla_max_len,
                bool sampling = false, bool* no_room = nullptr) const;

  // The layers, final norm, lm_head, device argmax and (with `sample`, over b.sample_params)
  // the sampling kernel for inputs already on the device: everything a decode graph replays.
  // qlen_host: per-query causal lengths (host), for the MLA grid bound; null = use mla_bound
  // for every chunk (graph capture).
  // key_slot: [B][Tk] cache slot of each timeline token (-1 padding) when a pattern hook is
  // observed, else null.
  // ends: a decode run's batch-1 step graph under ATLAS_RUN_FUSED (Run::push): its launch after
  // run_inputs did the embedding lookup and the first input norm already (embed_norm, which waits
  // before it releases, as the embedding copy does: the MLA kernels read the step's lengths
  // before their own wait, kernels/pdl.cuh), and/or the argmax writes the run's outputs (set in
  // greedy steps only: a sampled step's sampler follows the argmax). Null everywhere else.
  struct StepEnds {
    bool embedded_and_normed = false;
    const RunOutputsArgs* outputs = nullptr;
  };
  void layers_forward(int64_t B, int64_t T, Cache& cache, const Buffers& b, int64_t chunk, const int32_t* qlen_host,
                      int64_t mla_bound, bool last_only, const Hooks* hooks, bool sample = false,
                      const std::vector<int32_t>* key_slot = nullptr, const StepEnds* ends = nullptr) const;
  // How mlp() launches: on `stream`; prefetch_down: the gate|up launch pulls the down's weights
  // into L2 (ATLAS_MOE_PREFETCH); urgent_down: the down's launches at the device's greatest
  // priority (UrgentLaunchScope; the gate|up there too lost 0.45%, s66-1); plain_down: the down
  // without launch overlap (PlainLaunchScope); down_event: the down's launch records it
  // programmatically (ProgrammaticEventScope).
  struct MlpLaunch {
    Stream stream = nullptr;
    bool prefetch_down = false;
    bool urgent_down = false;
    bool plain_down = false;
    Event down_event = nullptr;
  };
  // out = down(silu(gate x) * up x); gu / act: its scratch and activation buffers.
  void mlp(const Mlp& m, int64_t M, const Elem* x, Elem* out, Elem* gu, Elem* act, const MlpLaunch& how) const;
  void upload(void* dst, const void* src, size_t bytes) const;    // async on s_, then waits
  void download(void* dst, const void* src, size_t bytes) const;  // waits for s_, copies
  // next_norm: the next layer's input norm (or the final norm); where no hook reads the layer's
  // MoE parts or the residual sum, moe() also does x += y and h = next_norm(x) (one launch with
  // the combine) and returns true; false: y holds the MoE output for the caller's add + norm.
  // A batch-1 decode step's combine + add + norm left by moe() for the next layer's q|kv_a launch
  // (gemm_combine_norm runs it inside), and how that launch learns that the shared experts on
  // side_ are done where moe() did not join side_: their flag (ATLAS_COMBINE_QKV=flag) or the
  // programmatic event their down recorded (=event).
  struct DeferredCombine {
    MoeCombineNormArgsT<Elem> args;
    const uint32_t* ready = nullptr;
    bool event = false;
    bool unjoined() const { return ready != nullptr || event; }
  };
  // defer (a batch-1 decode step's, where the caller's next launch is the next layer's q|kv_a):
  // the combine launch is left in *defer instead of launched. router_launch: the caller launched the
  // router GEMM already (with the add + norm before it inside: gemm_after_add_rmsnorm), so the
  // shared experts fork after it: RouterLaunched::programmatic from that launch's
  // programmatic record of router_done_ (stream_wait_programmatic), ::joined after its end.
  enum class RouterLaunched { no, joined, programmatic };
  // shared_in: the caller forked side_ already and queued the shared experts' input there (their
  // normed row, ATLAS_SHARED_FORK=o_proj); null: they read h, forked here.
  bool moe(const Layer& L, const LayerHookNames& names, int64_t l, int64_t B, int64_t T, const Buffers& b,
           const Hooks* hooks, const Elem* next_norm, std::optional<DeferredCombine>* defer = nullptr,
           RouterLaunched router_launch = RouterLaunched::no, const Elem* shared_in = nullptr) const;
  // GEMMs in the model's element type, one place per form, so the loop never names a kernel:
  // bf16 -> gemm() / grouped_gemm() (batch-invariant tensor cores; dense ones through cuBLASLt
  // in the fast mode), f32 -> gemm_f32() / grouped_gemm_f32() (the FMA-chain f32 kernel).
  struct MatMul {
    const Elem* x = nullptr;  // [M, K], row stride x_stride
    const Elem* w = nullptr;  // [N, K], row stride w_stride
    Elem* out = nullptr;      // [M, N], row stride out_stride
    int64_t M = 0, N = 0, K = 0;
    int64_t x_stride = 0, w_stride = 0, out_stride = 0;  // 0 = dense
    int64_t batch = 1, x_batch_stride = 0, w_batch_stride = 0, out_batch_stride = 0;
    Stream stream = nullptr;  // null: s_
  };
  void matmul(const MatMul& m) const;
  // gemm()'s arguments for m (the bf16 model's matmul; also gemm_with_latent's).
  GemmArgs gemm_args(const MatMul& m) const {
    return {.x = reinterpret_cast<const uint16_t*>(m.x), .w = reinterpret_cast<const uint16_t*>(m.w), .out = m.out,
            .out_type = OutType::bf16, .M = int(m.M), .N = int(m.N), .K = int(m.K), .x_stride = m.x_stride,
            .w_stride = m.w_stride, .out_stride = m.out_stride, .mode = mode_for(m.M), .batch = int(m.batch),
            .x_batch_stride = m.x_batch_stride, .w_batch_stride = m.w_batch_stride,
            .out_batch_stride = m.out_batch_stride, .stream = m.stream ? m.stream : s_};
  }
  void linear(const Elem* x, const Elem* w, Elem* out, int64_t M, int64_t N, int64_t K, int64_t xs = 0,
              int64_t os = 0, Stream stream = nullptr) const {
    matmul({.x = x, .w = w, .out = out, .M = M, .N = N, .K = K, .x_stride = xs, .out_stride = os, .stream = stream});
  }
  // Router logits [M, E] in fp32 (bf16: the official upcast GEMM, fp32 out).
  void router_gemm(const Elem* x, const Elem* w, float* out, int64_t M, int64_t E, int64_t K) const;
  // The bf16 router GEMM's gemm() arguments (router_gemm's; also gemm_moe_route's).
  GemmArgs router_args(const Elem* x, const Elem* w, float* out, int64_t M, int64_t E, int64_t K) const {
    return {.x = reinterpret_cast<const uint16_t*>(x), .w = reinterpret_cast<const uint16_t*>(w), .out = out,
            .out_type = OutType::f32, .M = int(M), .N = int(E), .K = int(K), .mode = mode_for(M), .stream = s_};
  }
  // Expert GEMM over the rows sorted by expert (device offsets), optional gather of A rows.
  // gated = I > 0: the gate|up GEMM (N = 2I) with SiLU, out = act [max_rows, I], scratch
  // [max_rows, 2I] (GroupedGemmArgs::gated; the f32 mode runs the GEMM into scratch, then silu_gate).
  void expert_gemm(const Elem* x, const int32_t* x_rows, int64_t x_rows_limit, const ExpertWeightsT<Elem>& w,
                   const int32_t* offsets, Elem* out, int64_t groups, int64_t max_rows, int64_t N, int64_t K,
                   int64_t gated = 0, Elem* scratch = nullptr, const L2NextWeights& next = {},
                   const GroupedSelfRoute& self_route = {}, const GroupedOrder& order = {}) const;
  // Hooks over device tensors: copy out as f32, fire, copy back (an observer may write). When
  // only digest observers want the hook, hook_digests serves them instead.
  // hook_act: an activation of the model's element type (hook_bf16 for bf16, hook_f32 for f32).
  void hook_act(const Hooks* hooks, const std::string& name, int64_t layer, std::vector<int64_t> shape,
                Elem* dev) const {
    if constexpr (kF32)
      hook_f32(hooks, name, layer, std::move(shape), dev);
    else
      hook_bf16(hooks, name, layer, std::move(shape), dev);
  }
  void hook_bf16(const Hooks* hooks, const std::string& name, int64_t layer, std::vector<int64_t> shape,
                 uint16_t* dev) const;
  void hook_f32(const Hooks* hooks, const std::string& name, int64_t layer, std::vector<int64_t> shape,
                float* dev) const;
  // The hook's tensor observers run as row edits on the device (model/hooks.h HookRowEdit:
  // edit_rows, the same bits as the host path) where every one of them is one and the switch
  // allows (ATLAS_DEVICE_EDITS); true if they ran, and the hook then counts as one no tensor
  // observer wants. A bf16 hook takes one edit this way (the host path rounds after all).
  template <class V>
  bool device_edits(const Hooks& hooks, const std::string& name, const std::vector<int64_t>& shape, V* dev) const;
  // Per-token SHA-256 of a [B, T, ...] hook on the device; only [B*T][32] bytes come to the host.
  // One of bf16 / f32 is set.
  void hook_digests(const Hooks& hooks, const std::string& name, int64_t layer, const std::vector<int64_t>& shape,
                    const uint16_t* bf16, const float* f32) const;

  // Late deliveries (model/hooks.h): the values of a hook that only readers and digest observers
  // want are copied into a pinned arena on s_ (async), and delivered in hook order once their
  // copy has landed: between later hooks (deliver_ready, never waiting) or, at the latest, before
  // forward() returns or a tensor observer runs (deliver_all). The GPU never waits for the host.
  struct LateHook {
    std::string name;
    int64_t layer = -1;
    std::vector<int64_t> shape;
    DType dtype = DType::F32;  // what readers see (bf16 values arrive as F32)
    bool digests = false;      // the bytes are [B*T][32] token digests (digest observers)
    bool bf16 = false;         // the bytes are bf16 values
    size_t offset = 0, bytes = 0;  // in the arena (set by defer_hook)
    Event copied = nullptr;        // (set by defer_hook)
  };
  // Queues e, a copy of the `bytes` at dev. false: too large for the arena (kLateArenaMax): the
  // caller delivers synchronously.
  bool defer_hook(const Hooks& hooks, LateHook e, const void* dev, size_t bytes) const;
  void deliver_ready() const;
  void deliver_all() const;
  void deliver(LateHook& e) const;
  void drop_late() const;  // after an exception: wait for the copies, forget the deliveries
  static constexpr size_t kLateArenaMax = size_t(1) << 30, kLateArenaFirst = size_t(64) << 20;

  ModelConfig cfg_;
  LayerRange layers_;
  bool has_head_ = false;
  DeviceBlock weights_;
  const Elem* embed_ = nullptr;     // [V, H]
  const Elem* final_ln_ = nullptr;  // [H]
  const Elem* lm_head_ = nullptr;   // [V, H]
  std::vector<Layer> blocks_;
  DeviceBlock rope_;  // cos, sin tables [max_positions, dr/2] (bf16-rounded values, or f32)
  const Elem *cos_ = nullptr, *sin_ = nullptr;
  int max_positions_ = 0;
  float scale_ = 0.0f;
  DeviceBlock expert_ptrs_;  // the layers' gate_up_w / down_w pointer arrays
  GemmMode dense_mode_ = GemmMode::batch_invariant;
  // The fast mode's dense GEMMs of <= 16 rows (a decode step of a few rows) on the
  // batch-invariant kernels, which decode faster than cuBLASLt since session 21: fast batch-1
  // decode 396.9 vs 370.8 tok/s on one machine (session 22, s22-1); ATLAS_FAST_SMALL_M=0 keeps
  // cuBLASLt. The fast mode promises a tolerance, not bits: its decode hash went from ec29be1c
  // to 64147f26 (CudaTiny.FastModeIsCloseToInvariantMode checks the tolerance).
  bool fast_small_m_invariant_ = true;
  GemmMode mode_for(int64_t M) const {
    return dense_mode_ == GemmMode::fast && fast_small_m_invariant_ && M <= 16 ? GemmMode::batch_invariant
                                                                              : dense_mode_;
  }
  bool graphs_ = true;
  int64_t max_tokens_ = 8192;  // tokens per forward pass before a prefill is chunked
  Stream s_ = nullptr;  // every launch goes here (capturable, unlike the legacy default stream)
  // ... except two pieces of work with inputs of their own, which run on side_: a MoE layer's
  // shared experts (h alone) while s_ routes and runs the routed experts, and the absorbed-query
  // GEMM while s_ writes the latent into the cache (fork_ / join_ order the two streams; the
  // same kernels on the same inputs, so the same bits; CudaModelOptions::side_stream).
  Stream side_ = nullptr;  // null with the side stream off
  Event fork_ = nullptr, join_ = nullptr;
  bool side_on_ = true;
  // The stream for side work that may start now (side_ after it waits for s_'s work so far, or
  // s_ itself with the side stream off), and s_ waiting for everything issued on side_.
  Stream fork_side() const {
    if (!side_on_) return s_;
    stream_wait(side_, s_, fork_);
    return side_;
  }
  void join_side() const {
    if (side_on_) stream_wait(s_, side_, join_);
  }
  // side_ for work that may start once s_'s launch that recorded `event` in a
  // ProgrammaticEventScope has every block running (its launch-overlap wait then waits for that
  // launch, and through it for s_'s work before it); s_ itself with the side stream off. Under
  // capture side_ must have joined it already (a fork_side() before that launch).
  Stream fork_side_programmatic(Event event) const {
    if (!side_on_) return s_;
    stream_wait_programmatic(side_, event);
    return side_;
  }
  // Queries per MLA block in a prefill (4: the cache tiles are read by four queries at once);
  // ATLAS_MLA_PREFILL_QPB=1|2|4 overrides it for measurements (any gives the same bits).
  int mla_prefill_qpb_ = 4;
  int mla_tile_parallel_ = 0;  // MlaDecodeArgs::tile_parallel (ATLAS_MLA_TILE_PARALLEL=0: 1, off)
  bool mla_early_cache_ = true;  // MlaDecodeArgs::stable_prefix at decode steps (ATLAS_MLA_EARLY_CACHE=0: off)
  // A decode step's MLA split merge inside the value GEMM's launch (mla_decode_with_value;
  // ATLAS_MLA_MERGE_VALUE=1; off by default: written in session 32, slower in s33-1).
  bool mla_merge_value_ = false;
  // The MLA split merge inside the attention launch where a step's bound has two splits, and the
  // decode graphs' short bound (kPairBound) that gives it at lengths up to 512 (ATLAS_MLA_PAIR_MERGE=0:
  // off, the merge launch and one graph per cache; session 70).
  bool mla_pair_merge_ = true;
  // The MLA bound a decode-step graph is captured with for steps whose longest row has max_len
  // slots, on a cache of `capacity`; graph_kind's index into CacheStore's graph arrays (1: short).
  int64_t graph_bound(int64_t capacity, int64_t max_len) const {
    return mla_pair_merge_ && capacity > kPairBound && max_len <= kPairBound ? kPairBound : capacity;
  }
  static int graph_kind(int64_t capacity, int64_t bound) { return bound < capacity ? 1 : 0; }
  // The shared experts' down (side_, low priority) launched at the greatest priority where the
  // routed experts have few rows (M * top_k <= kGroupedFewMaxRows: the few-row configs), so that
  // its blocks get SMs early instead of after the routed down's. Session 34: with the routed down
  // shortened (16x32x128/4u) the shared down ended last, 3.9 us after it (it started only as the
  // routed gate|up's blocks left); urgent, it ends before the routed down and the combine ends
  // ~2 us earlier per layer: batch-1 decode 469.2 / 467.6 against 461.7 / 461.9 tok/s (s34-3,
  // s34-4). At 128 rows (the seed grid's steps) it cost 7.014 against 6.860 s (s34-4), hence the
  // bound. ATLAS_SHARED_DOWN_FIRST=0 turns it off; the same bits either way.
  bool shared_down_first_ = true;
  // The shared experts' down launched without launch overlap where the routed experts have few
  // rows (PlainLaunchScope; ATLAS_SHARED_DOWN_WAIT=1, session 38, off until measured): its 256
  // split-K blocks (256 threads x 128 registers: half an SM's register file each) then become
  // resident only when the shared gate|up has finished, and cannot hold SMs while they wait. In
  // session 38's stamped run (ATLAS_BLOCK_STAMPS, s38-1) they became resident before the routed
  // gate|up in 78 of 144 layers, two per SM on nearly every SM, and there the routed gate|up
  // became resident only as they left: the routed down ended 66.0 us after the window's first
  // block against 54.3 in the other 66 layers (rare in the unstamped default, but a race). The
  // same bits either way.
  bool shared_down_wait_ = false;
  // One token's routed gate|up routes the token again in its own blocks (GroupedSelfRoute;
  // ATLAS_MOE_SELF_ROUTE=1, session 39; off: slower, s39-3) instead of waiting for the routing
  // kernel: only where nothing runs between the two launches (no route tail, no observer of the
  // routes). The same bits.
  bool self_route_ = false;
  // A decode step's routed gate|up waits for the routing before it releases the routed down,
  // whose blocks then find their tiles and issue their first weight steps before their own
  // wait (GroupedGemmArgs::wait_first / tables_before_wait; ATLAS_MOE_DOWN_EARLY=1, session 44,
  // off: not faster, s45-1 / s45-2). Where M * top_k <= kGroupedFewMaxRows (the few-row down config)
  // and the gate|up does not route itself. The same bits.
  bool moe_down_early_ = false;
  // A decode step's absorbed-query GEMM: 0 on side_, 1 / 2 on s_ before / after the latent cache
  // kernel, 3 in one launch with it where it can (else as 2) (ModelEnv::absorb, ATLAS_ABSORB).
  int absorb_ = 3;
  // A MoE layer's gate|up launches pull their down's weights into L2 (ModelEnv::moe_prefetch,
  // ATLAS_MOE_PREFETCH: bit 0 the routed experts', bit 1 the shared; _AT the loop quarter).
  int moe_prefetch_ = 0, moe_prefetch_at_ = 0;
  // ATLAS_L2_PREFETCH / _HOW / _BLOCKS (ModelEnv::l2_prefetch, session 37; off: slower): a decode step's
  // MoE layers pull their shared experts' weights into L2 from side_ at the layer's start.
  int l2_prefetch_ = 0, l2_prefetch_how_ = 0, l2_prefetch_blocks_ = 0;
  // ATLAS_SHARED_FORK=o_proj (ModelEnv::shared_fork_o_proj, session 46): a batch-1 decode step's
  // shared experts fork from o_proj, and side_ adds and norms for them itself.
  bool shared_fork_o_proj_ = false;
  // The device argmax spread over blocks (ArgmaxArgsT::counters; ATLAS_ARGMAX_SPLIT=0: one block
  // per row). Its counters live apart from scratch_ (zero between launches, so they must not move
  // under other buffers when the carve's sizes change): grow-only, zeroed when allocated.
  bool argmax_split_ = true;
  // ATLAS_RUN_FUSED (sessions 47 and 49; on by default since session 50: ~3 us less per step at
  // the step's head, s50-1): a batch-1 decode run's step graph does the embedding lookup and the
  // first input norm in one launch after its inputs' (embed_norm) and ends with the argmax
  // writing the run's outputs (greedy steps): three launches per step where there were five.
  // The same bits.
  bool run_fused_ = true;
  // ATLAS_RUN_ROOT=1 (session 49, a diagnostic; off): a decode run's step graph begins with an
  // empty launch (graph_root), so that its step-start launch is not the graph's root node.
  bool run_root_ = false;
  // Early graphs (CudaModelOptions::early_graphs, ATLAS_EARLY_GRAPHS; session 63, on by
  // default since s63-2): a prefill on a store without a decode run's greedy step graph
  // captures it after its own launches, so that the host records it while the GPU runs the
  // prefill instead of with the GPU idle after the run's eager first step. A capture needs the
  // launchers' one-time setup (cuBLASLt plans, kernel attributes) done, which is the model's, not
  // the store's: greedy_step_rows_ holds the batch sizes whose greedy decode step has run
  // eagerly.
  mutable bool early_graphs_ = false;  // (mutable: turned off where a capture behind a prefill fails)
  mutable std::set<int64_t> greedy_step_rows_;
  // A decode run's step graph for `c` (sampled: with the sampling kernel), captured against the
  // current scratch layout (Run::push; the prefill's early capture). With `room_only`, nothing
  // is captured where the step's buffers would need a larger scratch block (a prefill's
  // buffers are still in use; the run captures at its second step then).
  // bound: the MLA bound (graph_bound), which picks the graph (graph_kind).
  void capture_run_graph(CudaCache& c, bool sampled, int64_t bound, bool room_only = false) const;
  mutable DeviceBlock argmax_counters_;
  mutable DeviceBlock shared_ready_;  // Buffers::shared_ready (zeroed once)
  Event shared_done_ = nullptr;       // DeferredCombine::event's (with the side stream)
  Event router_done_ = nullptr;       // ATLAS_ROUTER_NORM=1's fork (with the side stream)
  int64_t chunk_tokens_env_ = 0;  // ATLAS_PREFILL_CHUNK_TOKENS, 0 = unset
  mutable DeviceBlock scratch_;
  mutable DeviceBlock digests_;  // grow-only [M][32] token digests of a digest-only hook
  // Padding computed once (forward): a prefill's padding tokens that would compute the same
  // values (the same id, position, visible length and, when that is > 0, cache row) run as one
  // row; rows_ is the rows the kernels see this call (B x T without it), expand_ the device map
  // [B x T] -> computed row that hooks are expanded through (null: the identity), flat_rows_ =
  // B x T. ATLAS_PAD_DEDUP=0 turns it off (measurements; the same bits either way).
  bool pad_dedup_ = true;
  mutable int64_t rows_ = 0, flat_rows_ = 0;

 public:
  int64_t computed_rows() const { return rows_; }  // (of the last forward; cuda::computed_rows)

 private:
  mutable const int32_t* expand_ = nullptr;
  mutable DeviceBlock expand_map_, expand_buf_;  // grow-only: the map, hook tensors expanded through it
  // `dev` ([rows_][width] of 2- or 4-byte values) as [flat_rows_][width] (dev itself without a map).
  template <class V>
  const V* expanded(const V* dev, int64_t width) const;
  mutable uint64_t scratch_epoch_ = 0;  // bumped when scratch_ is reallocated (graphs hold its pointers)
  mutable uint64_t gemm_moves_seen_ = 0;  // gemm_scratch_moves() when current_epoch() last looked
  // What a captured graph must have been captured against to replay: its pointers into scratch_
  // and into the GEMM launchers' per-stream scratch (sliced launches, the TMA kernel's gathered
  // rows: graphs of decode steps of more than 16 rows hold them), which an eager launch larger
  // than any before (a prefill) frees and makes again. Either move makes every graph stale.
  uint64_t current_epoch() const {
    const uint64_t moves = gemm_scratch_moves();
    if (moves != gemm_moves_seen_) {
      gemm_moves_seen_ = moves;
      ++scratch_epoch_;
    }
    return scratch_epoch_;
  }
  // The last ended cache's store (CudaModelOptions::cache_pool; null: off). Shared with the
  // caches, which hand their stores to it while it lives.
  std::shared_ptr<CachePool> pool_;
  mutable int32_t* pinned_ints_ = nullptr;  // grow-only staging for per-call int uploads
  mutable size_t pinned_ints_n_ = 0;
  mutable std::deque<LateHook> late_;
  mutable std::vector<Event> late_events_, free_events_;  // every event made; those not in use
  mutable const Hooks* late_hooks_ = nullptr;
  mutable unsigned char* late_arena_ = nullptr;  // pinned, grow-only
  mutable size_t late_arena_bytes_ = 0, late_arena_used_ = 0;
  // Device edits' rows and added values: staged in pinned memory, copied on s_ into a device
  // block of the same size at the same offset; used from the front until full, then (after the
  // stream drained, so no copy still reads the staging) from the front again. Grow-only.
  bool device_edits_on_ = true;  // ATLAS_DEVICE_EDITS
  mutable unsigned char* edit_staging_ = nullptr;
  mutable DeviceBlock edit_dev_;
  mutable size_t edit_bytes_ = 0, edit_used_ = 0;
};

template <class Elem>
CudaModelT<Elem>::CudaModelT(const Checkpoint& ck, const CudaModelOptions& opts)
    : cfg_(ck.config()), layers_(ck.layers()) {
  const ModelConfig& c = cfg_;
  const int64_t H = c.hidden_size, nh = c.num_attention_heads, dn = c.qk_nope_head_dim, dr = c.qk_rope_head_dim;
  const int64_t dv = c.v_head_dim, dc = c.kv_lora_rank;
  if (c.num_attention_heads > 16) fail("cuda", "num_attention_heads", "more than 16 heads (the MLA kernel's limit)");
  if (dc > kMlaLatentMax || dc + dr > kMlaWidthMax)
    fail("cuda", "kv_lora_rank", "latent + rope width above 512 + 64 (the MLA kernel's limit)");
  if (c.n_routed_experts > 256) fail("cuda", "n_routed_experts", "more than 256 (the router kernel's limit)");
  if (c.num_experts_per_tok > 16) fail("cuda", "num_experts_per_tok", "more than 16 (the router kernel's limit)");

  // Layout: every weight's place in one device block, then one pass of uploads.
  struct Job {
    const TensorView* t = nullptr;
    size_t offset = 0;  // bytes into the block
  };
  std::vector<Job> jobs;
  size_t total = 0;
  auto place = [&](size_t elems) {
    const size_t off = total;
    total += align_up(elems * kEs);
    return off;
  };
  auto add = [&](const std::string& name) {
    const TensorView& t = ck.tensor(name);
    jobs.push_back({&t, place(size_t(t.numel()))});
    return jobs.size() - 1;
  };
  // gate and up of one MLP stored back to back: one [2I, H] matrix.
  auto add_mlp = [&](const std::string& p, std::vector<size_t>& idx) {
    const TensorView& g = ck.tensor(p + "gate_proj.weight");
    const TensorView& u = ck.tensor(p + "up_proj.weight");
    const size_t off = place(size_t(g.numel() + u.numel()));
    jobs.push_back({&g, off});
    jobs.push_back({&u, off + size_t(g.numel()) * kEs});
    idx.push_back(jobs.size() - 2);
    idx.push_back(add(p + "down_proj.weight"));
    return g.shape[0];
  };
  struct LayerIdx {
    size_t ln1, ln2, q = 0, q_a = 0, q_b = 0, q_a_ln = 0, kv_a, kv_a_ln, kv_b, o, router = 0, w_uk_t;
    std::vector<size_t> mlps;  // pairs (gate_up job, down job): dense, or experts then shared
    std::vector<int64_t> inters;
  };
  std::vector<LayerIdx> li;
  const size_t embed_job = add("model.embed_tokens.weight");
  for (int64_t l = layers_.first; l <= layers_.last; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    LayerIdx x;
    x.ln1 = add(p + "input_layernorm.weight");
    x.ln2 = add(p + "post_attention_layernorm.weight");
    if (c.q_lora_rank) {
      x.q_a = add(p + "self_attn.q_a_proj.weight");
      x.q_a_ln = add(p + "self_attn.q_a_layernorm.weight");
      x.q_b = add(p + "self_attn.q_b_proj.weight");
    } else {
      x.q = add(p + "self_attn.q_proj.weight");
    }
    x.kv_a = add(p + "self_attn.kv_a_proj_with_mqa.weight");
    x.kv_a_ln = add(p + "self_attn.kv_a_layernorm.weight");
    x.kv_b = add(p + "self_attn.kv_b_proj.weight");
    x.w_uk_t = place(size_t(nh * dc * dn));
    x.o = add(p + "self_attn.o_proj.weight");
    if (c.is_moe_layer(l)) {
      x.router = add(p + "mlp.gate.weight");
      for (int64_t e = 0; e < c.n_routed_experts; ++e)
        x.inters.push_back(add_mlp(p + "mlp.experts." + std::to_string(e) + ".", x.mlps));
      if (c.n_shared_experts > 0) x.inters.push_back(add_mlp(p + "mlp.shared_experts.", x.mlps));
    } else {
      x.inters.push_back(add_mlp(p + "mlp.", x.mlps));
    }
    li.push_back(std::move(x));
  }
  has_head_ = layers_.last == c.num_hidden_layers - 1;
  size_t final_job = 0, head_job = 0;
  if (has_head_) {
    final_job = add("model.norm.weight");
    head_job = c.tie_word_embeddings ? embed_job : add("lm_head.weight");
  }

  // Memory: the weights plus a margin for activations and the cache must fit.
  {  // (before any device object exists: a bad value leaves nothing behind)
    side_on_ = opts.side_stream && env_switch("ATLAS_SIDE_STREAM", true);
    pad_dedup_ = opts.pad_dedup && env_switch("ATLAS_PAD_DEDUP", true);
    const ModelEnv env = model_env();
    if (env.mla_prefill_qpb > 0) mla_prefill_qpb_ = env.mla_prefill_qpb;
    // ATLAS_MLA_TILE_PARALLEL=0: decode attention always walks a split's tiles in one block
    // (MlaDecodeArgs::tile_parallel = 1), for measuring what the cluster kernel saves (same bits).
    if (env.mla_tile_parallel_off) mla_tile_parallel_ = 1;
    // ATLAS_PREFILL_CHUNK_TOKENS=<n> overrides CudaModelOptions::max_tokens_per_call, for
    // measurements (chunking never changes the bits; it bounds working memory).
    chunk_tokens_env_ = env.prefill_chunk_tokens;
    absorb_ = env.absorb;
    moe_prefetch_ = env.moe_prefetch;
    shared_fork_o_proj_ = env.shared_fork_o_proj;
    moe_prefetch_at_ = env.moe_prefetch_at;
    l2_prefetch_ = env.l2_prefetch;
    l2_prefetch_how_ = env.l2_prefetch_how;
    l2_prefetch_blocks_ = env.l2_prefetch_blocks;
  }
  set_device(opts.device);
  const bool prio = opts.stream_priority && env_switch("ATLAS_STREAM_PRIORITY", true);
  s_ = stream_create(prio ? StreamPriority::high : StreamPriority::normal);
  // The tile-parallel MLA kernel's one-time setup synchronises the device: here, never inside
  // the decode step's graph capture.
  if (mla_tile_parallel_ == 0) (void)mla_tile_parallel_available();
  if (side_on_) {
    side_ = stream_create(prio ? StreamPriority::low : StreamPriority::normal);
    fork_ = event_create();
    join_ = event_create();
    shared_done_ = event_create();
    router_done_ = event_create();
    gemm_prepare_stream(side_);  // its own cuBLASLt workspace (the fast mode's shared experts)
  }
  dense_mode_ = opts.batch_invariant ? GemmMode::batch_invariant : GemmMode::fast;
  fast_small_m_invariant_ = env_switch("ATLAS_FAST_SMALL_M", true);
  mla_early_cache_ = env_switch("ATLAS_MLA_EARLY_CACHE", true);
  mla_merge_value_ = env_switch("ATLAS_MLA_MERGE_VALUE", false);
  mla_pair_merge_ = env_switch("ATLAS_MLA_PAIR_MERGE", true);
  shared_down_first_ = side_on_ && env_switch("ATLAS_SHARED_DOWN_FIRST", true);
  shared_down_wait_ = side_on_ && env_switch("ATLAS_SHARED_DOWN_WAIT", false);
  self_route_ = env_switch("ATLAS_MOE_SELF_ROUTE", false);
  moe_down_early_ = env_switch("ATLAS_MOE_DOWN_EARLY", false);
  argmax_split_ = env_switch("ATLAS_ARGMAX_SPLIT", true);
  run_fused_ = env_switch("ATLAS_RUN_FUSED", true);
  run_root_ = env_switch("ATLAS_RUN_ROOT", false);
  device_edits_on_ = env_switch("ATLAS_DEVICE_EDITS", true);
  graphs_ = opts.graphs && env_switch("ATLAS_CUDA_GRAPHS", true);
  early_graphs_ = env_switch("ATLAS_EARLY_GRAPHS", opts.early_graphs);
  if (env_switch("ATLAS_CACHE_POOL", opts.cache_pool)) pool_ = std::make_shared<CachePool>();
  max_tokens_ = chunk_tokens_env_ > 0 ? chunk_tokens_env_ : std::max<int64_t>(1, opts.max_tokens_per_call);
  const MemoryInfo mem = memory_info();
  const size_t margin = size_t(1) << 30;
  if (total + margin > mem.free)
    fail(ck.dir(), "weights",
         "the model needs " + gib(total) + " of device memory in " +
             (kF32 ? std::string("f32 (--compute f32 keeps 4 bytes per weight, twice bf16)") : std::string("bf16")) +
             " plus ~1 GiB working space, the device has " + gib(mem.free) + " free of " + gib(mem.total));
  weights_ = DeviceBlock(total);
  char* base = weights_.get();
  {
    Uploader<Elem> up;
    for (const Job& j : jobs) up.upload(*j.t, reinterpret_cast<Elem*>(base + j.offset));
    // W_UK^h transposed: w_uk_t[h][c][d] = kv_b[h*(dn+dv) + d][c], so q~ is a plain GEMM per head.
    for (size_t i = 0; i < li.size(); ++i) {
      const TensorView& kvb = *jobs[li[i].kv_b].t;
      const std::vector<float> w = to_f32(kvb);
      std::vector<Elem> t(size_t(nh * dc * dn));
      for (int64_t hh = 0; hh < nh; ++hh)
        for (int64_t d = 0; d < dn; ++d)
          for (int64_t cc = 0; cc < dc; ++cc)
            t[size_t((hh * dc + cc) * dn + d)] = f32_to_elem<Elem>(w[size_t((hh * (dn + dv) + d) * dc + cc)]);
      up.upload(t, reinterpret_cast<Elem*>(base + li[i].w_uk_t));
    }
  }
  synchronize();
  auto at = [&](size_t job) { return reinterpret_cast<const Elem*>(base + jobs[job].offset); };
  embed_ = at(embed_job);
  if (has_head_) {
    final_ln_ = at(final_job);
    lm_head_ = at(head_job);
  }
  for (int64_t i = 0; i < int64_t(li.size()); ++i) {
    const LayerIdx& x = li[size_t(i)];
    Layer L;
    L.ln1 = at(x.ln1);
    L.ln2 = at(x.ln2);
    if (c.q_lora_rank) {
      L.q_a = at(x.q_a);
      L.q_a_ln = at(x.q_a_ln);
      L.q_b = at(x.q_b);
    } else {
      L.q = at(x.q);
    }
    L.kv_a = at(x.kv_a);
    // q_proj and kv_a_proj are placed back to back (add() above, in that order): one GEMM
    // computes both from h where no hook reads either alone.
    if (!c.q_lora_rank && L.kv_a == L.q + nh * (dn + dr) * H) L.q_kv = L.q;
    L.kv_a_ln = at(x.kv_a_ln);
    L.kv_b = at(x.kv_b);
    L.w_uk_t = reinterpret_cast<const Elem*>(base + x.w_uk_t);
    L.o = at(x.o);
    L.moe = c.is_moe_layer(layers_.first + i);
    std::vector<Mlp> mlps;
    for (size_t k = 0; k < x.inters.size(); ++k)
      mlps.push_back({.gate_up = at(x.mlps[2 * k]), .down = at(x.mlps[2 * k + 1]), .inter = x.inters[k]});
    if (L.moe) {
      L.router = at(x.router);
      L.experts.assign(mlps.begin(), mlps.begin() + c.n_routed_experts);
      L.has_shared = c.n_shared_experts > 0;
      if (L.has_shared) L.shared = mlps.back();
    } else {
      L.dense = mlps[0];
    }
    blocks_.push_back(std::move(L));
  }
  // Per MoE layer, the device arrays of expert weight pointers the grouped GEMM reads.
  std::vector<const Elem*> ptrs;
  for (const Layer& L : blocks_) {
    for (const Mlp& m : L.experts) ptrs.push_back(m.gate_up);
    for (const Mlp& m : L.experts) ptrs.push_back(m.down);
  }
  if (!ptrs.empty()) {
    expert_ptrs_ = DeviceBlock(ptrs.size() * sizeof(void*));
    copy_to_device(expert_ptrs_.get(), ptrs.data(), ptrs.size() * sizeof(void*));
    auto* dev = reinterpret_cast<const Elem* const*>(expert_ptrs_.get());
    // Experts placed at one stride (the loader places each expert's gate|up then down, so they
    // are): base and stride for the TMA kernel; anything else leaves the base null.
    auto spaced = [](const std::vector<const Elem*>& p, int64_t elems) {
      const int64_t stride = p.size() > 1 ? int64_t(p[1] - p[0]) : elems;
      for (size_t e = 1; e < p.size(); ++e)
        if (int64_t(p[e] - p[e - 1]) != stride) return std::pair<const Elem*, int64_t>{nullptr, 0};
      return stride >= elems ? std::pair{p[0], stride} : std::pair<const Elem*, int64_t>{nullptr, 0};
    };
    size_t o = 0;
    for (Layer& L : blocks_) {
      if (L.experts.empty()) continue;
      std::vector<const Elem*> gu, dn;
      for (const Mlp& m : L.experts) {
        gu.push_back(m.gate_up);
        dn.push_back(m.down);
      }
      const int64_t I = L.experts[0].inter;
      const auto [gu_base, gu_stride] = spaced(gu, 2 * I * H);
      const auto [dn_base, dn_stride] = spaced(dn, H * I);
      L.gate_up_w = {.ptrs = dev + o, .base = gu_base, .stride = gu_stride};
      L.down_w = {.ptrs = dev + o + L.experts.size(), .base = dn_base, .stride = dn_stride};
      o += 2 * L.experts.size();
    }
  }

  // RoPE tables: the same cos/sin values the CPU backend computes in the same mode (model/rope.h:
  // bf16-rounded for bf16, fp32 for f32), one row per position up to max_position_embeddings.
  max_positions_ = int(std::max<int64_t>(1, c.max_position_embeddings));
  const std::vector<float> inv = rope_inv_freq(c);
  const float amp = float(c.rope_amplitude());
  const int64_t half = dr / 2;
  std::vector<Elem> tab(size_t(2 * max_positions_ * half));
  std::vector<float> cs(static_cast<size_t>(dr));
  for (int64_t p = 0; p < max_positions_; ++p) {
    rope_cos_sin(inv, amp, p, !kF32, cs.data(), cs.data() + half);
    for (int64_t k = 0; k < half; ++k) {
      tab[size_t(p * half + k)] = f32_to_elem<Elem>(cs[size_t(k)]);
      tab[size_t((max_positions_ + p) * half + k)] = f32_to_elem<Elem>(cs[size_t(half + k)]);
    }
  }
  rope_ = DeviceBlock(tab.size() * kEs);
  copy_to_device(rope_.get(), tab.data(), tab.size() * kEs);
  cos_ = reinterpret_cast<const Elem*>(rope_.get());
  sin_ = cos_ + max_positions_ * half;
  scale_ = float(c.softmax_scale());
  // The hook arena's first size now, with the model, not inside the first traced forward: a
  // pinned allocation of 64 MiB took part of a process's first traced prefill (0.527-0.533 s
  // against 0.477-0.478 for the second, s39-6 / s40-14; session 40).
  late_arena_ = static_cast<unsigned char*>(host_alloc_pinned(kLateArenaFirst));
  late_arena_bytes_ = kLateArenaFirst;
}

template <class Elem>
void CudaModelT<Elem>::matmul(const MatMul& m) const {
  if constexpr (kF32) {
    gemm_f32({.x = m.x, .w = m.w, .out = m.out, .M = int(m.M), .N = int(m.N), .K = int(m.K), .x_stride = m.x_stride,
              .w_stride = m.w_stride, .out_stride = m.out_stride, .batch = int(m.batch),
              .x_batch_stride = m.x_batch_stride, .w_batch_stride = m.w_batch_stride,
              .out_batch_stride = m.out_batch_stride, .stream = m.stream ? m.stream : s_});
  } else {
    gemm(gemm_args(m));
  }
}

template <class Elem>
void CudaModelT<Elem>::router_gemm(const Elem* x, const Elem* w, float* out, int64_t M, int64_t E, int64_t K) const {
  if constexpr (kF32)
    gemm_f32({.x = x, .w = w, .out = out, .M = int(M), .N = int(E), .K = int(K), .stream = s_});
  else
    gemm(router_args(x, w, out, M, E, K));
}

template <class Elem>
void CudaModelT<Elem>::expert_gemm(const Elem* x, const int32_t* x_rows, int64_t x_rows_limit,
                                   const ExpertWeightsT<Elem>& w,
                                   const int32_t* offsets, Elem* out, int64_t groups, int64_t max_rows, int64_t N,
                                   int64_t K, int64_t gated, Elem* scratch, const L2NextWeights& next,
                                   const GroupedSelfRoute& self_route, const GroupedOrder& order) const {
  if constexpr (kF32) {
    grouped_gemm_f32({.x = x, .x_rows = x_rows, .w = w.ptrs, .offsets = offsets, .out = gated ? scratch : out,
                      .groups = int(groups), .max_rows = int(max_rows), .N = int(N), .K = int(K),
                      .x_rows_limit = x_rows_limit, .stream = s_});
    if (gated)
      silu_gate({.gate = scratch, .up = scratch + gated, .out = out, .rows = int(max_rows), .width = int(gated),
                 .in_stride = N, .stream = s_});
  } else {
    grouped_gemm({.x = x, .x_rows = x_rows, .w = w.ptrs, .offsets = offsets, .out = out, .groups = int(groups),
                  .max_rows = int(max_rows), .N = int(N), .K = int(K), .x_rows_limit = x_rows_limit,
                  .w_base = w.base, .w_group_stride = w.stride,
                  .gated = int(gated), .gated_scratch = scratch, .stream = s_, .next = next,
                  .self_route = self_route, .order = order});
  }
}

template <class Elem>
void CudaModelT<Elem>::upload(void* dst, const void* src, size_t bytes) const {
  copy_to_device_async(dst, src, bytes, s_);
  stream_synchronize(s_);  // the source may be pageable host memory the caller reuses
}

template <class Elem>
void CudaModelT<Elem>::download(void* dst, const void* src, size_t bytes) const {
  copy_to_host_async(dst, src, bytes, s_);
  stream_synchronize(s_);
}

template <class Elem>
template <class V>
const V* CudaModelT<Elem>::expanded(const V* dev, int64_t width) const {
  static_assert(sizeof(V) == 2 || sizeof(V) == 4, "2- or 4-byte values");
  if (!expand_) return dev;
  const size_t bytes = size_t(flat_rows_ * width) * sizeof(V);
  if (expand_buf_.bytes() < bytes) {
    deliver_all();  // no copy out of the old block is still in flight
    expand_buf_ = DeviceBlock();
    expand_buf_ = DeviceBlock(bytes);
  }
  // A gather of whole rows (the values' bits, whatever their type: copy_rows's 2- or 4-byte form).
  using U = std::conditional_t<sizeof(V) == 2, uint16_t, float>;
  copy_rows(CopyRowsArgsT<U>{.src = reinterpret_cast<const U*>(dev), .dst = reinterpret_cast<U*>(expand_buf_.get()),
                             .src_rows = expand_, .rows = flat_rows_, .width = int(width), .src_limit = rows_,
                             .dst_limit = flat_rows_, .stream = s_});
  return reinterpret_cast<const V*>(expand_buf_.get());
}

template <class Elem>
void CudaModelT<Elem>::hook_digests(const Hooks& hooks, const std::string& name, int64_t layer,
                                    const std::vector<int64_t>& shape, const uint16_t* bf16, const float* f32) const {
  const int64_t B = shape.at(0), T = shape.at(1), M = B * T;
  int64_t width = 1;  // values per token: everything after [B, T]
  for (size_t i = 2; i < shape.size(); ++i) width *= shape[i];
  const size_t bytes = size_t(M) * 32;
  if (digests_.bytes() < bytes) {
    deliver_all();             // no copy out of the old block is still in flight
    digests_ = DeviceBlock();
    digests_ = DeviceBlock(bytes);
  }
  auto* computed = reinterpret_cast<uint8_t*>(digests_.get());
  // The computed rows' digests (rows_ of them: B x T unless padding ran once), then expanded.
  if (bf16)
    token_digests_bf16({.x = bf16, .rows = rows_, .dim = int(width), .out = computed, .stream = s_});
  else
    token_digests_f32({.x = f32, .rows = rows_, .dim = int(width), .out = computed, .stream = s_});
  const auto* out = reinterpret_cast<const uint8_t*>(expanded(reinterpret_cast<const uint16_t*>(computed), 16));
  // (digests_ is reused by the next digest hook: the stream orders its kernel after this copy.)
  if (defer_hook(hooks, {.name = name, .layer = layer, .shape = {B, T}, .digests = true}, out, bytes)) return;
  deliver_all();
  std::vector<uint8_t> h(bytes);
  download(h.data(), out, bytes);
  hooks.fire_digests({.name = name, .layer = layer, .rows = B, .tokens = T, .sha256 = h.data()});
}

template <class Elem>
bool CudaModelT<Elem>::defer_hook(const Hooks& hooks, LateHook e, const void* dev, size_t bytes) const {
  if (bytes > kLateArenaMax) return false;
  const size_t align = 256;
  size_t off = (late_arena_used_ + align - 1) / align * align;
  if (off + bytes > late_arena_bytes_) {
    deliver_all();  // every copy landed and was delivered: the arena is free again
    off = 0;
    if (bytes > late_arena_bytes_) {  // grow (doubling, at least 64 MiB, at most kLateArenaMax)
      const size_t want = std::min(kLateArenaMax, std::max({bytes, kLateArenaFirst, 2 * late_arena_bytes_}));
      if (late_arena_) host_free_pinned(late_arena_);
      late_arena_ = nullptr;
      late_arena_bytes_ = 0;
      late_arena_ = static_cast<unsigned char*>(host_alloc_pinned(want));
      late_arena_bytes_ = want;
    }
  }
  copy_to_host_async(late_arena_ + off, dev, bytes, s_);
  if (free_events_.empty()) {
    e.copied = event_create();
    late_events_.push_back(e.copied);
  } else {
    e.copied = free_events_.back();
    free_events_.pop_back();
  }
  event_record(e.copied, s_);
  e.offset = off;
  e.bytes = bytes;
  late_hooks_ = &hooks;
  late_.push_back(std::move(e));
  late_arena_used_ = off + bytes;
  deliver_ready();
  return true;
}

template <class Elem>
void CudaModelT<Elem>::deliver(LateHook& e) const {
  free_events_.push_back(e.copied);
  unsigned char* p = late_arena_ + e.offset;
  if (e.digests) {
    late_hooks_->fire_digests({.name = e.name, .layer = e.layer, .rows = e.shape[0], .tokens = e.shape[1], .sha256 = p});
    return;
  }
  std::vector<float> f;
  void* data = p;
  if (e.bf16) {
    f.resize(e.bytes / 2);
    const auto* h = reinterpret_cast<const uint16_t*>(p);
    const int64_t n = int64_t(f.size());
#pragma omp parallel for schedule(static) if (n >= (1 << 20))
    for (int64_t i = 0; i < n; ++i) f[size_t(i)] = bf16_to_f32(h[size_t(i)]);
    data = f.data();
  }
  const HookTensor t{.name = e.name, .layer = e.layer, .dtype = e.dtype, .shape = e.shape, .data = data};
  late_hooks_->fire_read(t);
}

template <class Elem>
void CudaModelT<Elem>::deliver_ready() const {
  while (!late_.empty() && event_done(late_.front().copied)) {
    LateHook e = std::move(late_.front());
    late_.pop_front();
    deliver(e);
  }
  if (late_.empty()) late_arena_used_ = 0;
}

template <class Elem>
void CudaModelT<Elem>::deliver_all() const {
  while (!late_.empty()) {
    event_synchronize(late_.front().copied);
    LateHook e = std::move(late_.front());
    late_.pop_front();
    deliver(e);
  }
  late_arena_used_ = 0;
}

template <class Elem>
void CudaModelT<Elem>::drop_late() const {
  if (late_.empty()) return;
  stream_synchronize(s_);
  for (const LateHook& e : late_) free_events_.push_back(e.copied);
  late_.clear();
  late_arena_used_ = 0;
}

template <class Elem>
void CudaModelT<Elem>::hook_bf16(const Hooks* hooks, const std::string& name, int64_t layer,
                                 std::vector<int64_t> shape, uint16_t* dev) const {
  if (!hooks) return;
  int64_t n = 1;
  for (auto d : shape) n *= d;
  // Computed rows fewer than B x T (forward: padding once): readers see the expanded tensor (no
  // tensor observer: they would write into a copy); digests are taken of the computed rows.
  const bool edited = hooks->wants_tensor(name) && device_edits(*hooks, name, shape, dev);
  if (expand_ && hooks->wants_reader(name)) dev = const_cast<uint16_t*>(expanded(dev, n / flat_rows_));
  if (edited || !hooks->wants_tensor(name)) {
    if (hooks->wants_reader(name)) {  // readers (and digests, then from their copy)
      if (defer_hook(*hooks, {.name = name, .layer = layer, .shape = shape, .bf16 = true}, dev, size_t(n) * 2)) return;
    } else {
      if (hooks->wants_digests(name)) hook_digests(*hooks, name, layer, shape, dev, nullptr);
      return;
    }
  }
  // A tensor observer wants it (or a reader, of a tensor too large to defer): the whole tensor
  // comes to the host now, and Hooks::fire_read digests it there for any digest observers (after
  // the tensor observers and readers ran).
  deliver_all();
  std::vector<uint16_t> h(static_cast<size_t>(n));
  download(h.data(), dev, h.size() * 2);
  std::vector<float> f(h.size());
#pragma omp parallel for schedule(static) if (n >= (1 << 20))
  for (int64_t i = 0; i < n; ++i) f[size_t(i)] = bf16_to_f32(h[size_t(i)]);
  HookTensor t{.name = name, .layer = layer, .dtype = DType::F32, .shape = std::move(shape), .data = f.data()};
  hooks->fire_tensor(t);
  // What the observers wrote, rounded to bf16 as the model stores it; readers and digests see
  // those values (what the rest of the pass reads, and what device edits leave). Copied back
  // only where an observer changed something (recording observers cost one download).
  bool changed = false;
#pragma omp parallel for schedule(static) reduction(|| : changed) if (n >= (1 << 20))
  for (int64_t i = 0; i < n; ++i) {
    const uint16_t v = f32_to_bf16(f[size_t(i)]);
    changed = changed || v != h[size_t(i)];
    h[size_t(i)] = v;
    f[size_t(i)] = bf16_to_f32(v);
  }
  hooks->fire_read(t);
  if (changed) upload(dev, h.data(), h.size() * 2);
}

template <class Elem>
void CudaModelT<Elem>::hook_f32(const Hooks* hooks, const std::string& name, int64_t layer,
                                std::vector<int64_t> shape, float* dev) const {
  if (!hooks) return;
  int64_t n = 1;
  for (auto d : shape) n *= d;
  const bool edited = hooks->wants_tensor(name) && device_edits(*hooks, name, shape, dev);
  if (expand_ && hooks->wants_reader(name)) dev = const_cast<float*>(expanded(dev, n / flat_rows_));  // (as hook_bf16)
  if (edited || !hooks->wants_tensor(name)) {
    if (hooks->wants_reader(name)) {
      if (defer_hook(*hooks, {.name = name, .layer = layer, .shape = shape}, dev, size_t(n) * 4)) return;
    } else {
      if (hooks->wants_digests(name)) hook_digests(*hooks, name, layer, shape, nullptr, dev);
      return;
    }
  }
  deliver_all();
  std::vector<float> f(static_cast<size_t>(n));
  download(f.data(), dev, f.size() * 4);
  const std::vector<float> before = f;
  HookTensor t{.name = name, .layer = layer, .dtype = DType::F32, .shape = std::move(shape), .data = f.data()};
  hooks->fire(t);
  if (std::memcmp(before.data(), f.data(), f.size() * 4) != 0) upload(dev, f.data(), f.size() * 4);
}

template <class Elem>
template <class V>
bool CudaModelT<Elem>::device_edits(const Hooks& hooks, const std::string& name, const std::vector<int64_t>& shape,
                                    V* dev) const {
  if (!device_edits_on_ || expand_ || shape.size() < 3) return false;
  const std::vector<const HookRowEdit*> edits = hooks.row_edits(name);
  if (edits.empty() || (sizeof(V) == 2 && edits.size() > 1)) return false;
  const int64_t rows = shape[0] * shape[1];
  int64_t n = 1;
  for (auto d : shape) n *= d;
  if (rows <= 0 || n % rows != 0 || n / rows > 0x7fffffff) return false;
  const int width = int(n / rows);
  std::vector<int64_t> list;
  std::vector<float> add;
  for (const HookRowEdit* e : edits) {
    e->select(shape, list, add);  // (counts as the observer's call)
    if (list.empty()) continue;
    // rows then added values, each 256-byte aligned, at the same offset on both sides
    const auto up = [](size_t b) { return (b + 255) / 256 * 256; };
    const size_t rows_bytes = up(list.size() * 8), bytes = rows_bytes + up(add.size() * 4);
    if (edit_used_ + bytes > edit_bytes_) {
      stream_synchronize(s_);  // every earlier copy out of the staging has landed
      edit_used_ = 0;
      if (bytes > edit_bytes_) {
        const size_t want = std::max({bytes, size_t(1) << 20, 2 * edit_bytes_});
        if (edit_staging_) host_free_pinned(edit_staging_);
        edit_staging_ = nullptr;
        edit_bytes_ = 0;
        edit_dev_ = DeviceBlock();
        edit_dev_ = DeviceBlock(want);
        edit_staging_ = static_cast<unsigned char*>(host_alloc_pinned(want));
        edit_bytes_ = want;
      }
    }
    unsigned char* h = edit_staging_ + edit_used_;
    auto* d = reinterpret_cast<unsigned char*>(edit_dev_.get()) + edit_used_;
    std::memcpy(h, list.data(), list.size() * 8);
    std::memcpy(h + rows_bytes, add.data(), add.size() * 4);
    copy_to_device_async(d, h, bytes, s_);
    edit_used_ += bytes;
    const RowEditOp op = e->op == HookRowEdit::Op::Zero    ? RowEditOp::Zero
                         : e->op == HookRowEdit::Op::Scale ? RowEditOp::Scale
                                                           : RowEditOp::Add;
    edit_rows(RowEditArgsT<V>{.x = dev, .limit = rows, .width = width, .rows = reinterpret_cast<const int64_t*>(d),
                              .n = int64_t(list.size()), .op = op, .factor = e->factor,
                              .src = reinterpret_cast<const float*>(d + rows_bytes), .src_per_row = e->per_row,
                              .stream = s_});
  }
  return true;
}

template <class Elem>
typename CudaModelT<Elem>::Buffers CudaModelT<Elem>::carve(int64_t M, int64_t B, int64_t rows_out, int64_t mla_chunk,
                                    int64_t mla_max_len, bool sampling, bool* no_room) const {
  const ModelConfig& c = cfg_;
  const int64_t H = c.hidden_size, nh = c.num_attention_heads, dq = c.q_head_dim(), dv = c.v_head_dim;
  const int64_t dc = c.kv_lora_rank, W = c.latent_dim(), E = std::max<int64_t>(1, c.n_routed_experts);
  const int64_t k = std::max<int64_t>(1, c.num_experts_per_tok), r = c.q_lora_rank.value_or(1);
  int64_t inter_rows = M * c.intermediate_size;  // widest MLP activation, in elements per GEMM row set
  if (c.n_routed_experts > 0) {
    inter_rows = std::max(inter_rows, M * k * c.moe_intermediate_size);
    inter_rows = std::max(inter_rows, M * c.moe_intermediate_size * std::max<int64_t>(1, c.n_shared_experts));
  }
  // The shared experts' activation, in elements (0 without them).
  const int64_t shared_rows =
      c.n_routed_experts > 0 ? M * c.moe_intermediate_size * std::max<int64_t>(0, c.n_shared_experts) : 0;
  struct Req {
    void** p;
    size_t bytes;
  };
  Buffers b{};
  const size_t e = kEs;  // bytes per element of the Elem buffers
  std::vector<Req> reqs = {
      {(void**)&b.x, size_t(M * H) * e},           {(void**)&b.h, size_t(M * H) * e},
      {(void**)&b.y, size_t(M * H) * e},
      // Without LoRA, q and the latent live inside the [M, nh*dq + W] block of the joint GEMM
      // (set below): a layer uses either the joint rows or the two dense tensors, never both.
      {(void**)&b.q, c.q_lora_rank ? size_t(M * nh * dq) * e : 0},
      {(void**)&b.qa, size_t(M * r) * e},          {(void**)&b.qn, size_t(M * r) * e},
      {(void**)&b.lat, c.q_lora_rank ? size_t(M * W) * e : 0},
      {(void**)&b.latn, size_t(M * W) * e},
      {(void**)&b.qkv, c.q_lora_rank ? 0 : size_t(M * (nh * dq + W)) * e},
      {(void**)&b.qt, size_t(M * nh * W) * e},     {(void**)&b.olat, size_t(M * nh * dc) * e},
      {(void**)&b.heads, size_t(M * nh * dv) * e}, {(void**)&b.gu, size_t(2 * inter_rows) * e},
      {(void**)&b.act, size_t(inter_rows) * e},    {(void**)&b.ys, size_t(M * k * H) * e},
      {(void**)&b.sgu, size_t(2 * shared_rows) * e}, {(void**)&b.sact, size_t(shared_rows) * e},
      {(void**)&b.routed, size_t(M * H) * e},      {(void**)&b.shared, size_t(M * H) * e},
      {(void**)&b.x_alt, M == 1 ? size_t(H) * e : 0},
      {(void**)&b.h_side, M == 1 && shared_fork_o_proj_ ? size_t(H) * e : 0},
      {(void**)&b.hl, size_t(rows_out * H) * e},   {(void**)&b.logits, size_t(rows_out * c.vocab_size) * e},
      {(void**)&b.router_logits, size_t(M * E) * 4},
      {(void**)&b.topk_w, size_t(M * k) * 4},
      {(void**)&b.mla_ws, mla_decode_workspace_floats(int(mla_chunk), int(nh), int(mla_max_len), kSplitTokens) * 4},
      {(void**)&b.ids, size_t(5 * M) * 4},         {(void**)&b.last_rows, size_t(B) * 4},
      {(void**)&b.topk_ids, size_t(M * k) * 4},    {(void**)&b.counts, size_t(E) * 4},
      {(void**)&b.offsets, size_t(E + 1) * 4},     {(void**)&b.sorted, size_t(M * k) * 4},
      {(void**)&b.slot, size_t(M * k) * 4},
      {(void**)&b.perm_ws, moe_permute_workspace_ints(int(M), int(E)) * 4},
      {(void**)&b.greedy, size_t(B) * 4},
      {(void**)&b.argmax_parts, argmax_split_ ? argmax_partial_ints(B, c.vocab_size) * 4 : 0},
      // Last, so that turning sampling on does not move the buffers above.
      {(void**)&b.sample_params, size_t(B) * sizeof(sample_core::RowParams)},
      {(void**)&b.sample_ws, sampling ? sample_workspace_ints(B, c.vocab_size) * 4 : 0},
  };
  size_t total = 0;
  for (const auto& q : reqs) total += align_up(std::max<size_t>(q.bytes, 1));
  // What must grow (each growth waits for the stream and moves what graphs hold).
  const bool with_ready = M == 1 && side_on_ && gemm_combine_mode() == 2;  // (ATLAS_COMBINE_QKV=flag only)
  const size_t ready_bytes = size_t(std::max<int64_t>(1, c.num_hidden_layers)) * 4;
  const bool grow_scratch = scratch_.bytes() < total;
  const bool grow_counters = argmax_split_ && argmax_counters_.bytes() < size_t(B) * 4;
  const bool grow_ready = with_ready && shared_ready_.bytes() < ready_bytes;
  if (no_room && (grow_scratch || grow_counters || grow_ready)) {
    *no_room = true;
    return Buffers{};
  }
  if (grow_scratch) {
    stream_synchronize(s_);    // nothing in flight may still use the old block
    scratch_ = DeviceBlock();  // free the old block first
    if (pool_) pool_->clear();  // (its graphs hold the old block: recaptured anyway)
    const MemoryInfo mem = memory_info();
    if (total > mem.free)
      fail("cuda", "forward", "this batch (" + std::to_string(M) + " tokens) needs " + gib(total) +
                                  " of working memory, the device has " + gib(mem.free) + " free");
    scratch_ = DeviceBlock(total);
    ++scratch_epoch_;
  }
  size_t off = 0;
  for (const auto& q : reqs) {
    *q.p = scratch_.get() + off;
    off += align_up(std::max<size_t>(q.bytes, 1));
  }
  if (!c.q_lora_rank) {
    b.q = b.qkv;
    b.lat = b.qkv + M * nh * dq;
  }
  b.argmax_counters = nullptr;
  if (argmax_split_) {
    if (grow_counters) {
      stream_synchronize(s_);  // nothing in flight may still use the old counters
      argmax_counters_ = DeviceBlock();
      argmax_counters_ = DeviceBlock(size_t(B) * 4);
      device_memset(argmax_counters_.get(), 0, size_t(B) * 4);
      synchronize();  // (cudaMemset is not ordered with a non-blocking stream)
      ++scratch_epoch_;  // captured graphs hold the old pointer
    }
    b.argmax_counters = reinterpret_cast<int32_t*>(argmax_counters_.get());
  } else {
    b.argmax_parts = nullptr;
  }
  b.shared_ready = nullptr;
  if (with_ready) {
    if (grow_ready) {
      stream_synchronize(s_);
      shared_ready_ = DeviceBlock(ready_bytes);
      device_memset(shared_ready_.get(), 0, ready_bytes);
      synchronize();  // (cudaMemset is not ordered with a non-blocking stream)
      ++scratch_epoch_;  // captured graphs hold the old pointer
    }
    b.shared_ready = reinterpret_cast<uint32_t*>(shared_ready_.get());
  }
  b.pos = b.ids + M;
  b.dst_rows = b.ids + 2 * M;
  b.qlen = b.ids + 3 * M;
  b.qrow = b.ids + 4 * M;
  return b;
}

template <class Elem>
void CudaModelT<Elem>::mlp(const Mlp& m, int64_t M, const Elem* x, Elem* out, Elem* gu, Elem* act,
                           const MlpLaunch& how) const {
  const int64_t H = cfg_.hidden_size, I = m.inter;
  const Stream stream = how.stream;
  if (M == 0) return;
  // act [M, I] = silu(gate) * up from the [M, 2I] gate | up product (fused into the GEMM's
  // epilogue where the chosen config can: the same bits; gu is the unfused path's scratch)
  if constexpr (kF32) {
    linear(x, m.gate_up, gu, M, 2 * I, H, 0, 0, stream);
    silu_gate({.gate = gu, .up = gu + I, .out = act, .rows = int(M), .width = int(I), .in_stride = 2 * I,
               .stream = stream});
  } else {
    const L2NextWeights next =
        how.prefetch_down ? L2NextWeights{.w = m.down, .bytes = int64_t(H * I * kEs), .at = moe_prefetch_at_} : L2NextWeights{};
    gemm({.x = x, .w = m.gate_up, .out = act, .M = int(M), .N = int(2 * I), .K = int(H), .mode = mode_for(M),
          .gated = int(I), .gated_scratch = gu, .stream = stream, .next = next});
  }
  const UrgentLaunchScope urgent_down(how.urgent_down);
  const PlainLaunchScope plain(how.plain_down);
  const ProgrammaticEventScope done(how.down_event);
  linear(act, m.down, out, M, H, I, 0, 0, stream);
}

template <class Elem>
bool CudaModelT<Elem>::moe(const Layer& L, const LayerHookNames& names, int64_t l, int64_t B, int64_t T, const Buffers& b,
                    const Hooks* hooks, const Elem* next_norm, std::optional<DeferredCombine>* defer,
                    RouterLaunched router_launch, const Elem* shared_in) const {
  const ModelConfig& c = cfg_;
  const int64_t M = rows_, H = c.hidden_size, E = c.n_routed_experts, k = c.num_experts_per_tok;
  const int64_t I = c.moe_intermediate_size;
  // Readers and digest observers of the residual sum only read it, and the fused launch leaves the sum in x
  // (as add_then_norm's fused launch does), so they do not keep the MoE tail apart: the traced
  // prefill digests every resid_post. A tensor observer could write the sum before the norm.
  const bool tail = next_norm && !(hooks && (hooks->wants(names.routed_out) || hooks->wants(names.shared_out) ||
                                             hooks->wants(names.mlp_out) || hooks->wants_tensor(names.resid_post)));
  // Where the combine is deferred into the next q|kv_a launch with the side stream on, how that
  // launch learns that the shared experts are done instead of a join here (gemm_combine_mode:
  // 2 a flag, 3 a programmatic event; 1 the join). Every other reader of b.shared needs the join.
  const int wait_mode = defer && tail && side_on_ && L.has_shared ? gemm_combine_mode() : 1;
  const bool flagged = wait_mode == 2 && b.shared_ready, evented = wait_mode == 3;
  // The shared experts first, on side_ when it is on (they read h only and write b.shared,
  // their own scratch): they overlap the routing and the routed experts on s_ and are joined
  // back before the combine reads b.shared.
  const bool router_done = router_launch != RouterLaunched::no;
  if (L.has_shared) {
    const bool few = M * k <= kGroupedFewMaxRows;
    mlp(L.shared, M, shared_in ? shared_in : b.h, b.shared, b.sgu, b.sact,
        {.stream = shared_in                                       ? side_
                   : router_launch == RouterLaunched::programmatic ? fork_side_programmatic(router_done_)
                                                                   : fork_side(),
         .prefetch_down = (moe_prefetch_ & 2) != 0,
         .urgent_down = shared_down_first_ && few,
         .plain_down = shared_down_wait_ && few,
         .down_event = evented ? shared_done_ : nullptr});
  }
  const RouterArgs route{
      .logits = b.router_logits, .topk_ids = b.topk_ids, .topk_weights = b.topk_w, .tokens = int(M),
      .experts = int(E), .k = int(k),
      .method = c.topk_method == atlas::TopkMethod::GroupLimitedGreedy ? TopkMethod::group_limited_greedy
                                                                       : TopkMethod::greedy,
      .n_group = int(c.n_group), .topk_group = int(c.topk_group), .norm_topk_prob = c.norm_topk_prob,
      .routed_scaling_factor = float(c.routed_scaling_factor), .stream = s_};
  // Dispatch, all on the device: (token, slot) pairs sorted by expert (stable: ascending token
  // inside an expert), then one grouped GEMM over every expert's contiguous rows, reading the
  // expert offsets on the device (no host round trip) and gathering x rows as it loads them.
  const MoePermuteArgs permute{.topk_ids = b.topk_ids, .tokens = int(M), .k = int(k), .experts = int(E),
                               .counts = b.counts, .offsets = b.offsets, .sorted_token = b.sorted,
                               .pair_slot = b.slot, .workspace = b.perm_ws, .stream = s_};
  // Router logits in fp32 (bf16 products are exact in fp32: the official upcast GEMM). At one
  // row the router's launch may route too (gemm_moe_route, ATLAS_ROUTE_TAIL), unless an observer
  // could change the logits or the routes in between (readers see the same logits either way).
  bool routed = false;
  if constexpr (!kF32)
    if (!router_done && !(hooks && (hooks->wants_tensor(names.router_logits) || hooks->wants_tensor(names.topk_ids))))
      routed = gemm_moe_route(router_args(b.h, L.router, b.router_logits, M, E, H), route, permute);
  if (!routed && !router_done) router_gemm(b.h, L.router, b.router_logits, M, E, H);
  hook_f32(hooks, names.router_logits, l, {B, T, E}, b.router_logits);
  if (hooks && hooks->wants_tensor(names.topk_ids)) {
    // An observer may rewrite the routes between the router and the permutation.
    deliver_all();
    router(route);
    std::vector<int32_t> ids(static_cast<size_t>(M * k));
    download(ids.data(), b.topk_ids, ids.size() * 4);
    HookTensor t{.name = names.topk_ids, .layer = l, .dtype = DType::I32, .shape = {B, T, k}, .data = ids.data()};
    const std::vector<int32_t> before = ids;
    hooks->fire(t);
    for (int32_t id : ids)
      if (id < 0 || id >= E)
        fail("hook " + names.topk_ids, {}, "an observer wrote expert id " + std::to_string(id) + " (valid: 0-" +
                                               std::to_string(E - 1) + ")");
    if (ids != before) upload(b.topk_ids, ids.data(), ids.size() * 4);
    moe_permute(permute);
  } else {
    if (!routed) moe_route(route, permute);  // one launch for a few tokens (the same routes and order)
    const int32_t* ids_dev = hooks && hooks->wants_reader(names.topk_ids) ? expanded(b.topk_ids, k) : nullptr;
    if (ids_dev && !defer_hook(*hooks, {.name = names.topk_ids, .layer = l, .shape = {B, T, k}, .dtype = DType::I32},
                               ids_dev, size_t(B * T * k) * 4)) {
      deliver_all();
      std::vector<int32_t> ids(static_cast<size_t>(B * T * k));
      download(ids.data(), ids_dev, ids.size() * 4);
      hooks->fire_read({.name = names.topk_ids, .layer = l, .dtype = DType::I32, .shape = {B, T, k}, .data = ids.data()});
    }
  }
  // (The permutation does not read the weights: an observer's change reaches the combine only.)
  hook_f32(hooks, names.topk_weights, l, {B, T, k}, b.topk_w);
  // act = silu(gate) * up (ATLAS_MOE_PREFETCH routed / both: its blocks pull the down's weights into L2)
  L2NextWeights next{};
  if constexpr (!kF32)
    if ((moe_prefetch_ & 1) != 0) next = {.w_groups = L.down_w.ptrs, .bytes = int64_t(H * I * kEs), .at = moe_prefetch_at_};
  // ATLAS_MOE_SELF_ROUTE: one token, greedy, routed by the one routing launch just before
  // (moe_route: no route tail, no observer of the logits or routes, which would launch between).
  GroupedSelfRoute self{};
  if constexpr (!kF32)
    if (self_route_ && M == 1 && !routed && route.method == TopkMethod::greedy &&
        !(hooks && (hooks->wants(names.router_logits) || hooks->wants(names.topk_ids) ||
                    hooks->wants(names.topk_weights))))
      self = {.logits = b.router_logits, .k = int(k), .norm_topk_prob = c.norm_topk_prob,
              .scaling = float(c.routed_scaling_factor)};
  // ATLAS_MOE_DOWN_EARLY: the two launches run back to back on s_ (nothing between them reads
  // or writes the routing's table), the gate|up waiting first, so the down may read the table
  // before its own wait.
  const bool down_early = moe_down_early_ && self.logits == nullptr && M * k <= kGroupedFewMaxRows;
  expert_gemm(b.h, b.sorted, M, L.gate_up_w, b.offsets, b.act, E, M * k, 2 * I, H, I, b.gu, next, self,
              {.wait_first = down_early});
  expert_gemm(b.act, nullptr, 0, L.down_w, b.offsets, b.ys, E, M * k, H, I, 0, nullptr, {}, {},
              {.tables_before_wait = down_early});
  // The shared experts' sum joins the combine launch unless a tensor observer of either part
  // could change it in between (the bits are those of combine, then add). Flagged or evented, no
  // join here: the deferred launch then follows the routed down with launch overlap (a join
  // makes it wait for the down's end, session 42) and stages its weights beside it; flagged, the
  // shared experts' end raises the layer's flag on side_ (gemm_combine_signal), which that launch
  // polls. layers_forward joins side_ again where the launch does not run, and at the end.
  if (flagged)
    gemm_combine_signal(b.shared_ready, int(cfg_.num_hidden_layers), int(l), side_);
  else if (L.has_shared && !evented)
    join_side();  // side_ has nothing after the shared experts
  if (tail) {
    const MoeCombineNormArgsT<Elem> ca{.y_sorted = b.ys, .pair_slot = b.slot, .topk_weights = b.topk_w,
                                       .addend = L.has_shared ? b.shared : nullptr, .x = b.x, .weight = next_norm,
                                       .out = b.h, .tokens = int(M), .k = int(k), .dim = int(H),
                                       .eps = float(c.rms_norm_eps), .stream = s_};
    if (defer) {  // (the caller checked that no hook reads resid_post)
      defer->emplace(DeferredCombine{.args = ca, .ready = flagged ? b.shared_ready + l : nullptr, .event = evented});
      return true;
    }
    moe_combine_add_rmsnorm(ca);
    hook_act(hooks, names.resid_post, l, {B, T, H}, b.x);  // readers and digests only (or nothing)
    return true;
  }
  const bool fuse_shared = L.has_shared && !(hooks && (hooks->wants_tensor(names.routed_out) ||
                                                       hooks->wants_tensor(names.shared_out)));
  moe_combine({.y_sorted = b.ys, .pair_slot = b.slot, .topk_weights = b.topk_w, .out = b.routed, .tokens = int(M),
               .k = int(k), .dim = int(H), .stream = s_, .addend = fuse_shared ? b.shared : nullptr,
               .sum_out = fuse_shared ? b.y : nullptr});
  hook_act(hooks, names.routed_out, l, {B, T, H}, b.routed);
  if (L.has_shared) {
    hook_act(hooks, names.shared_out, l, {B, T, H}, b.shared);
    if (!fuse_shared) add({.a = b.routed, .b = b.shared, .out = b.y, .n = M * H, .stream = s_});
  } else {
    copy_2d(b.y, size_t(H) * kEs, b.routed, size_t(H) * kEs, size_t(H) * kEs, size_t(M), s_);
  }
  return false;
}

template <class Elem>
void CudaModelT<Elem>::layers_forward(int64_t B, int64_t T, Cache& cache_base, const Buffers& b0, int64_t chunk,
                               const int32_t* qlen_host, int64_t mla_bound, bool last_only,
                               const Hooks* hooks, bool sample, const std::vector<int32_t>* key_slot,
                               const StepEnds* ends) const {
  auto& cache = static_cast<CudaCache&>(cache_base);
  const ModelConfig& c = cfg_;
  const int64_t M = rows_, H = c.hidden_size, V = c.vocab_size;  // rows computed (B x T, or fewer: forward)
  // The buffers, but x and x_alt swap where a q|kv_a launch stored the residual sum in x_alt.
  Buffers b = b0;
  // A batch-1 decode step's MoE combine + norm, left by moe() for the next layer's q|kv_a launch
  // (gemm_combine_norm, ATLAS_COMBINE_QKV), which runs it inside or, where it cannot, first.
  std::optional<DeferredCombine> pending;
  bool side_unjoined = false;  // a deferral left side_ unjoined since its last join
  // The pending combine as its own launch (after side_'s join where moe() did not join it).
  const auto flush_pending = [&] {
    if (!pending) return;
    if (pending->unjoined()) join_side();
    moe_combine_add_rmsnorm(pending->args);
    pending.reset();
  };
  const int64_t nh = c.num_attention_heads, dn = c.qk_nope_head_dim, dr = c.qk_rope_head_dim, dv = c.v_head_dim;
  const int64_t dc = c.kv_lora_rank, dq = dn + dr, W = dc + dr;

  // Embedding lookup: x [M, H], the residual stream (done, with the first layer's input norm,
  // by one launch before this call where `ends` says so: embed_norm).
  const bool embedded = ends && ends->embedded_and_normed;
  if (!embedded)
    copy_rows({.src = embed_, .dst = b.x, .src_rows = b.ids, .rows = M, .width = int(H), .src_limit = V,
               .dst_limit = M, .stream = s_});
  hook_act(hooks, "embed", -1, {B, T, H}, b.x);

  const float eps = float(c.rms_norm_eps);
  // x = x + y, then h = rmsnorm(x) with norm_w (if any): one launch (add_rmsnorm, the same bits)
  // unless a tensor observer of the sum could change it between the two (Hooks can write).
  const auto add_then_norm = [&](const std::string& sum_hook, const Elem* norm_w, int64_t layer) {
    const bool fused = norm_w && !(hooks && hooks->wants_tensor(sum_hook));
    if (fused)
      add_rmsnorm({.x = b.x, .y = b.y, .weight = norm_w, .out = b.h, .rows = int(M), .dim = int(H), .eps = eps,
                   .stream = s_});
    else
      add({.a = b.x, .b = b.y, .out = b.x, .n = M * H, .stream = s_});
    hook_act(hooks, sum_hook, layer, {B, T, H}, b.x);
    if (norm_w && !fused)
      rmsnorm({.x = b.x, .weight = norm_w, .out = b.h, .rows = int(M), .dim = int(H), .eps = eps, .stream = s_});
  };
  // h = input_layernorm(x) of the first layer; later layers get theirs from add_then_norm.
  if (!blocks_.empty() && !embedded)
    rmsnorm({.x = b.x, .weight = blocks_[0].ln1, .out = b.h, .rows = int(M), .dim = int(H), .eps = eps, .stream = s_});

  for (int64_t li = 0; li < int64_t(blocks_.size()); ++li) {
    const Layer& L = blocks_[size_t(li)];
    const int64_t l = layers_.first + li;
    const LayerHookNames names(l);
    Elem* kv = cache.layer<Elem>(li);
    // ATLAS_L2_PREFETCH: the shared experts' weights into L2 beside the attention section, whose
    // launches leave HBM mostly idle, so that the MoE phase's HBM reads are the routed experts'
    // alone (a hint on side_: it writes nothing; side_'s shared experts follow it).
    if constexpr (!kF32)
      if (l2_prefetch_ && side_on_ && T == 1 && M <= kGroupedFewMaxRows && L.moe && L.has_shared) {
        const int64_t I = L.shared.inter, bytes_gu = 2 * I * H * kEs, bytes_down = H * I * kEs;
        L2PrefetchArgs pf{.how = l2_prefetch_how_ >= 2 ? L2PrefetchHow::line : L2PrefetchHow::bulk,
                          .evict_last = (l2_prefetch_how_ & 1) != 0, .blocks = l2_prefetch_blocks_,
                          .stream = fork_side()};
        int r = 0;
        if (l2_prefetch_ & 1) pf.ptr[r] = L.shared.gate_up, pf.bytes[r++] = bytes_gu;
        if (l2_prefetch_ & 2) pf.ptr[r] = L.shared.down, pf.bytes[r++] = bytes_down;
        l2_prefetch(pf);
      }

    // h = input_layernorm(x)
    hook_act(hooks, names.ln1, l, {B, T, H}, b.h);
    // q [M, nh*dq] (or the LoRA path q_b(rmsnorm(q_a h))) and latent [M, W] = kv_a h (the
    // compressed KV and the shared rope key, before norm / RoPE). Without LoRA both are one GEMM
    // over the back-to-back weights into [M, nh*dq + W] rows (q | latent), unless a hook reads
    // q or the latent (hooks see dense tensors): a column's bits never depend on N.
    Elem *qp = b.q, *lp = b.lat;  // q and latent rows, strides qs and ls
    int64_t qs = nh * dq, ls = W;
    if (L.q_kv && !(hooks && (hooks->wants(names.q) || hooks->wants(names.latent)))) {
      bool combined = false;  // q|kv_a ran with the previous layer's MoE combine + norm inside
      if constexpr (!kF32)
        if (pending) {
          if (pending->event) stream_wait_programmatic(s_, shared_done_);
          combined = gemm_combine_norm(gemm_args({.x = b.h, .w = L.q_kv, .out = b.qkv, .M = M, .N = nh * dq + W, .K = H}),
                                       pending->args, b.x_alt, pending->ready, pending->event);
          if (combined) {
            std::swap(b.x, b.x_alt);  // the residual sum is in x_alt
            pending.reset();
          }
        }
      flush_pending();  // (where it did not run inside)
      if (!combined) linear(b.h, L.q_kv, b.qkv, M, nh * dq + W, H);
      qp = b.qkv;
      lp = b.qkv + nh * dq;
      qs = ls = nh * dq + W;
    } else {
      flush_pending();  // (moe() defers only where the next layer takes the branch above)
      if (c.q_lora_rank) {
        const int64_t r = *c.q_lora_rank;
        linear(b.h, L.q_a, b.qa, M, r, H);
        rmsnorm({.x = b.qa, .weight = L.q_a_ln, .out = b.qn, .rows = int(M), .dim = int(r), .eps = eps, .stream = s_});
        linear(b.qn, L.q_b, b.q, M, nh * dq, r);
      } else {
        linear(b.h, L.q, b.q, M, nh * dq, H);
      }
      hook_act(hooks, names.q, l, {B, T, nh, dq}, b.q);
      linear(b.h, L.kv_a, b.lat, M, W, H);
      hook_act(hooks, names.latent, l, {B, T, W}, b.lat);
    }
    // Absorbed attention. q~_h = q_nope_h W_UK^h -> qt[:, h, :dc] (one batched launch over the
    // heads); qt[:, h, dc:] = rotated q_pe_h (latent_to_cache or rope2 below). The two write
    // disjoint columns of qt from the q rows above, so the GEMM runs on side_ while s_ writes the
    // cache (joined before the attention reads qt), or, a decode step's, on s_ after it
    // (ATLAS_ABSORB=after: launch overlap then makes the GEMM's weights and the attention
    // kernel's older cache slots load while q|kv_a and the latent cache kernel run), or in one
    // launch with it (the default, "fused", below).
    const auto absorb_mm = [&](Stream st) -> MatMul {
      return {.x = qp, .w = L.w_uk_t, .out = b.qt, .M = M, .N = dc, .K = dn, .x_stride = qs, .w_stride = dn,
              .out_stride = nh * W, .batch = nh, .x_batch_stride = dq, .w_batch_stride = dc * dn,
              .out_batch_stride = W, .stream = st};
    };
    const auto absorb = [&](Stream st) { matmul(absorb_mm(st)); };
    const int absorb_at = T == 1 ? absorb_ : 0;  // a prefill's stays on side_
    bool absorbed = false;                         // ran inside the latent cache launch ("fused")
    if (absorb_at == 0) absorb(fork_side());
    if (absorb_at == 1) absorb(s_);
    // Cache slot = [rmsnorm(c) | rope(k_pe)]; the queries' rope parts rotate at the same positions
    // (into each head's absorbed query, qt[:, h, dc:]; the q rows keep the unrotated values).
    if (!(hooks && hooks->wants(names.latent_norm))) {
      // Nobody reads the normed row: written straight into its cache slot (one launch, the bits
      // of the three below).
      const LatentCacheArgsT<Elem> lc{
          .lat = lp, .lat_stride = ls, .norm_weight = L.kv_a_ln, .eps = eps, .cache = kv, .dst_rows = b.dst_rows,
          .cache_rows = B * cache.capacity(), .tokens = int(M), .latent = int(dc), .rope_dim = int(dr),
          .q = qp + dn, .q_out = b.qt + dc, .heads = int(nh), .q_token_stride = qs, .q_head_stride = dq,
          .q_out_token_stride = nh * W, .q_out_head_stride = W, .positions = b.pos, .cos = cos_, .sin = sin_,
          .max_positions = max_positions_, .stream = s_};
      // ATLAS_ABSORB=fused (a decode step's default since session 32): the absorbed query and
      // this in one launch where gemm_with_latent can (kernels/gemm_latent.cuh), else "after".
      if constexpr (!kF32)
        if (absorb_at == 3) absorbed = gemm_with_latent(gemm_args(absorb_mm(s_)), lc);
      if (!absorbed) latent_to_cache(lc);
    } else {
      rmsnorm({.x = lp, .weight = L.kv_a_ln, .out = b.latn, .rows = int(M), .dim = int(dc), .x_stride = ls,
               .out_stride = W, .eps = eps, .stream = s_});
      // One launch rotates the key's rope part (latn[:, dc:]) and each head's query rope part.
      rope2({.x = lp + dc, .tokens = int(M), .heads = 1, .token_stride = ls, .head_stride = ls,
             .rope_dim = int(dr), .positions = b.pos, .cos = cos_, .sin = sin_, .max_positions = max_positions_,
             .stream = s_, .out = b.latn + dc, .out_token_stride = W, .out_head_stride = W},
            {.x = qp + dn, .tokens = int(M), .heads = int(nh), .token_stride = qs, .head_stride = dq,
             .rope_dim = int(dr), .positions = b.pos, .cos = cos_, .sin = sin_, .max_positions = max_positions_,
             .stream = s_, .out = b.qt + dc, .out_token_stride = nh * W, .out_head_stride = W});
      hook_act(hooks, names.latent_norm, l, {B, T, W}, b.latn);
      copy_rows({.src = b.latn, .dst = kv, .dst_rows = b.dst_rows, .rows = M, .width = int(W), .src_limit = M,
                 .dst_limit = B * cache.capacity(), .stream = s_});
    }

    if ((absorb_at == 2 || absorb_at == 3) && !absorbed) absorb(s_);
    if (absorb_at == 0) join_side();  // qt complete
    // o_lat [M, nh, dc] = softmax(q~ . cache) . c^, each query over its row's first qlen slots.
    // bf16: the tensor-core kernel; f32: the scalar kernel (MlaDecodeArgsT<float>'s default).
    // O_h = o_lat_h W_UV^h^T -> heads [M, nh*dv] (one batched launch over the heads)
    const MatMul value_mm{.x = b.olat, .w = L.kv_b + dn * dc, .out = b.heads, .M = M, .N = dv, .K = dc,
                          .x_stride = nh * dc, .w_stride = dc, .out_stride = nh * dv, .batch = nh,
                          .x_batch_stride = dc, .w_batch_stride = (dn + dv) * dc, .out_batch_stride = dv};
    bool value_done = false;  // the value GEMM ran with the split merge (ATLAS_MLA_MERGE_VALUE)
    for (int64_t r0 = 0; r0 < M; r0 += chunk) {
      const int64_t n = std::min(chunk, M - r0);
      int64_t ml = mla_bound;
      if (qlen_host) {
        ml = 1;
        for (int64_t m = r0; m < r0 + n; ++m) ml = std::max<int64_t>(ml, qlen_host[m]);
      }
      const MlaDecodeArgsT<Elem> da{
          .q = b.qt + r0 * nh * W, .latent_cache = kv, .cache_row_stride = cache.capacity() * W,
          .lengths = b.qlen + r0, .cache_rows = b.qrow + r0, .max_length = int(ml), .out = b.olat + r0 * nh * dc,
          .latent = int(dc), .rope = int(dr), .rows = int(n), .heads = int(nh), .scale = scale_,
          .split_tokens = kSplitTokens, .workspace = b.mla_ws, .stream = s_,
          // prefill: consecutive queries of one row share each cache tile; decode: one
          // row per block (the bits are the same either way)
          .queries_per_block = T > 1 ? mla_prefill_qpb_ : 1, .tile_parallel = mla_tile_parallel_,
          .cluster_merge = mla_pair_merge_ ? 0 : 1,
          // one token per row: the latent cache kernel just above wrote each row's newest
          // slot only, so the older ones may be copied before the launch-overlap wait
          .stable_prefix = T == 1 && mla_early_cache_};
      // A decode step's merge inside the value GEMM's launch where it can run (session 32, off
      // by default: ATLAS_MLA_MERGE_VALUE=1), else the two calls.
      if constexpr (!kF32)
        if (T == 1 && mla_merge_value_ && n == M) value_done = mla_decode_with_value(da, gemm_args(value_mm));
      if (!value_done) mla_decode(da);
    }
    if (key_slot && qlen_host && hooks->wants(names.pattern)) {
      // The official eager softmax over the same absorbed queries and cache slots (the attention
      // kernel's online softmax never materialises it), laid out as the CPU backend's
      // [B, heads, T, Tk]. Observers only read it (as on the CPU backend).
      const int64_t S = mla_bound, Tk = int64_t(key_slot->size()) / B;
      DeviceBlock probs(size_t(M * nh * S) * 4);
      mla_pattern({.q = b.qt, .latent_cache = kv, .cache_row_stride = cache.capacity() * W, .lengths = b.qlen,
                   .cache_rows = b.qrow, .out = reinterpret_cast<float*>(probs.get()), .rows = int(M),
                   .heads = int(nh), .width = int(W), .slots = int(S), .scale = scale_, .stream = s_});
      std::vector<float> slot_probs(size_t(M * nh * S));
      deliver_all();
      download(slot_probs.data(), probs.get(), slot_probs.size() * 4);
      std::vector<float> pat = pattern_to_timeline(slot_probs, *key_slot, qlen_host, B, T, nh, S, Tk);
      HookTensor t{.name = names.pattern, .layer = l, .dtype = DType::F32, .shape = {B, nh, T, Tk}, .data = pat.data()};
      hooks->fire(t);
    }
    if (!value_done) matmul(value_mm);
    // x = x + attn; h = post_attention_layernorm(x); x = x + mlp_or_moe(h). At one row o_proj's
    // own launch may add and norm (gemm_add_rmsnorm, ATLAS_GEMM_TAILS), unless a tensor observer
    // of attn_out or resid_mid could change a value in between.
    bool tailed = false;
    if constexpr (!kF32) {
      if (M == 1 && L.ln2 && !(hooks && (hooks->wants_tensor(names.attn_out) || hooks->wants_tensor(names.resid_mid))))
        tailed = gemm_add_rmsnorm({.x = b.heads, .w = L.o, .out = b.y, .out_type = OutType::bf16, .M = 1, .N = int(H),
                                   .K = int(nh * dv), .mode = mode_for(1), .stream = s_},
                                  {.x = b.x, .weight = L.ln2, .out = b.h, .dim = int(H), .eps = eps});
    }
    if (!tailed) linear(b.heads, L.o, b.y, M, H, nh * dv);
    hook_act(hooks, names.attn_out, l, {B, T, H}, b.y);
    // ATLAS_SHARED_FORK=o_proj: at one row of an MoE layer with shared experts, side_ forks here,
    // after o_proj, and makes their input itself (the same add + norm of the same x and y, its sum
    // dropped, into h_side), so their launches need not wait for the model's stream's norm; that
    // norm (below, or the router's, ATLAS_ROUTER_NORM) writes its sum out of place (x_alt, then x
    // and x_alt swap) because side_ still reads x. x_alt's next writer (the next residual sum)
    // follows the shared experts' end: it waits for their join, flag or event, which follow this
    // launch on side_. Not where a hook reads or writes anything in between.
    const Elem* shared_in = nullptr;
    using Sum = typename AddRmsNormArgsT<Elem>::Sum;
    // (h_side and x_alt hold a row wherever M == 1 with the switch on: carve.)
    if (shared_fork_o_proj_ && side_on_ && !tailed && M == 1 && L.moe && L.has_shared && L.ln2 &&
        wide_row_norm(1, int(H)) &&
        !(hooks && (hooks->wants(names.attn_out) || hooks->wants(names.resid_mid) || hooks->wants(names.ln2)))) {
      add_rmsnorm({.x = b.x, .y = b.y, .weight = L.ln2, .out = b.h_side, .rows = 1, .dim = int(H), .eps = eps,
                   .stream = fork_side(), .sum = Sum::dropped});
      shared_in = b.h_side;
    }
    // ... or, at one row of an MoE layer, the router's launch adds and norms before its GEMM
    // (gemm_after_add_rmsnorm, ATLAS_ROUTER_NORM; the sum into x_alt, then x and x_alt swap),
    // unless a hook reads or writes anything in between.
    // With the side stream, ATLAS_ROUTER_NORM=1 has the launch record router_done_
    // programmatically and the shared experts fork from it (their blocks become resident while
    // it runs, as they did beside the norm's launch); "joined" forks them after its end (and
    // where they forked from o_proj above, neither).
    RouterLaunched router_launched = RouterLaunched::no;
    if constexpr (!kF32) {
      const int router_norm = gemm_router_norm_mode();
      if (router_norm > 0 && !tailed && M == 1 && L.moe && L.ln2 &&
          !(hooks && (hooks->wants(names.attn_out) || hooks->wants(names.resid_mid) || hooks->wants(names.ln2) ||
                      hooks->wants(names.router_logits) || hooks->wants(names.topk_ids)))) {
        const int64_t E = c.n_routed_experts;
        const bool programmatic = router_norm == 1 && side_on_ && L.has_shared && !shared_in;
        // side_ after s_'s work so far first: under capture a stream joins the capture only
        // through an event of it, and the programmatic fork adds an edge to a joined one.
        if (programmatic) (void)fork_side();
        const ProgrammaticEventScope record(programmatic ? router_done_ : nullptr);
        if (gemm_after_add_rmsnorm(router_args(b.h, L.router, b.router_logits, M, E, H),
                                   {.x = b.x, .y = b.y, .weight = L.ln2, .x_out = b.x_alt, .h_out = b.h,
                                    .dim = int(H), .eps = eps})) {
          std::swap(b.x, b.x_alt);  // the residual sum is in x_alt
          router_launched = programmatic ? RouterLaunched::programmatic : RouterLaunched::joined;
        }
      }
    }
    if (shared_in && router_launched == RouterLaunched::no) {
      add_rmsnorm({.x = b.x, .y = b.y, .weight = L.ln2, .out = b.h, .rows = 1, .dim = int(H), .eps = eps, .stream = s_,
                   .sum = Sum::to_sum_out, .sum_out = b.x_alt});
      std::swap(b.x, b.x_alt);  // the residual sum is in x_alt
    }
    if (tailed || router_launched != RouterLaunched::no || shared_in)
      hook_act(hooks, names.resid_mid, l, {B, T, H}, b.x);
    else
      add_then_norm(names.resid_mid, L.ln2, l);
    hook_act(hooks, names.ln2, l, {B, T, H}, b.h);
    // ... and the next layer's input_layernorm (or the final norm) in the same launch.
    const Elem* next_norm = li + 1 < int64_t(blocks_.size()) ? blocks_[size_t(li + 1)].ln1 : has_head_ ? final_ln_ : nullptr;
    // A batch-1 decode step defers its combine + norm to the next layer's q|kv_a launch where
    // that is the next launch and nothing observes the sum or the normed row in between (and
    // its GEMMs are the batch-invariant kernels: gemm_combine_norm takes nothing else, and the
    // event form's wait needs the shared experts' down to be one of their launches).
    bool defer = false;
    if constexpr (!kF32) {
      if (M == 1 && li + 1 < int64_t(blocks_.size()) && blocks_[size_t(li + 1)].q_kv && gemm_combine_norm_on() &&
          mode_for(1) == GemmMode::batch_invariant) {
        const LayerHookNames nn(l + 1);
        defer = !(hooks && (hooks->wants(names.resid_post) || hooks->wants(nn.ln1) || hooks->wants(nn.q) ||
                            hooks->wants(nn.latent)));
      }
    }
    if (L.moe && moe(L, names, l, B, T, b, hooks, next_norm, defer ? &pending : nullptr, router_launched, shared_in)) {
      side_unjoined = side_unjoined || (pending && pending->unjoined());
      continue;  // combined, added and normed (or left in pending)
    }
    if (!L.moe) mlp(L.dense, M, b.h, b.y, b.gu, b.act, {.stream = s_});
    hook_act(hooks, names.mlp_out, l, {B, T, H}, b.y);
    add_then_norm(names.resid_post, next_norm, l);
  }
  flush_pending();  // (never left: the last layer does not defer)
  if (side_unjoined) join_side();  // (before the capture ends; the last MoE layer joins anyway)
  if (!has_head_) return;
  if (blocks_.empty())
    rmsnorm({.x = b.x, .weight = final_ln_, .out = b.h, .rows = int(M), .dim = int(H), .eps = eps, .stream = s_});
  hook_act(hooks, "final_norm", -1, {B, T, H}, b.h);
  const Elem* head_in = b.h;
  if (last_only && T > 1) {
    copy_rows({.src = b.h, .dst = b.hl, .src_rows = b.last_rows, .rows = B, .width = int(H), .src_limit = M,
               .dst_limit = B, .stream = s_});
    head_in = b.hl;
  }
  const int64_t rows_out = last_only ? B : M;
  // lm_head in bf16 (the official bf16 model's logits dtype; the CPU bf16 mode rounds there too),
  // or f32 in the checking mode.
  linear(head_in, lm_head_, b.logits, rows_out, V, H);
  if (last_only)
    argmax({.logits = b.logits, .out = b.greedy, .rows = int(B), .vocab = int(V), .stream = s_,
            .counters = b.argmax_counters, .partials = b.argmax_parts,
            .run_outputs = ends ? ends->outputs : nullptr});
  // Sampled rows overwrite their argmax with the drawn token (docs/decoding.md, bit-identical to
  // the host's RowSampler); greedy-mode rows are skipped by the kernel.
  if (last_only && sample)
    cuda::sample({.logits = b.logits, .params = b.sample_params, .out = b.greedy, .workspace = b.sample_ws,
                  .rows = int(B), .vocab = int(V), .stream = s_});
}

template <class Elem>
ForwardOutput CudaModelT<Elem>::forward_step(const ForwardInput& in, Cache& cache_base, const Hooks* hooks) const {
  auto* cache = dynamic_cast<CudaCache*>(&cache_base);
  if (!cache) fail("forward: the cache was not made by the CUDA backend");
  const ModelConfig& c = cfg_;
  const int64_t B = in.batch, T = in.tokens, M = B * T, V = c.vocab_size, nh = c.num_attention_heads;
  if (B <= 0 || T <= 0) fail("forward: empty batch");
  if (int64_t(in.ids.size()) != M || int64_t(in.positions.size()) != M || int64_t(in.mask.size()) != M)
    fail("forward: ids, positions and mask must each hold batch x tokens values");
  if (!in.logits_rows.empty() && int64_t(in.logits_rows.size()) != B)
    fail("forward: logits_rows must hold one flag per row");
  if (!in.sampling.empty() && (int64_t(in.sampling.size()) != B || !in.logits_last_only || !has_head_))
    fail("forward: sampling needs one parameter set per row, logits_last_only and the lm_head");
  bool sampling = false;  // any row drawn on the device
  for (const auto& sp : in.sampling) sampling = sampling || sp.mode == sample_core::kSample;
  if (cache->batch() != B) fail("forward: kv cache batch size differs from the input's");
  if (cache->length_ + T > cache->capacity())
    fail("kv cache: " + std::to_string(cache->length_ + T) + " tokens exceed its capacity of " +
         std::to_string(cache->capacity()));
  drop_late();  // deliveries an earlier, failed forward left behind (their observers may be gone)
  const DecodeLaunchScope overlap(T == 1);  // launch overlap's default covers decode steps (cuda_ops.h)
  rows_ = flat_rows_ = M;  // every row computed, unless padding runs once (below)
  expand_ = nullptr;
  bool want_pattern = false;
  for (int64_t l = layers_.first; l <= layers_.last && hooks; ++l)
    want_pattern = want_pattern || hooks->wants(LayerHookNames(l).pattern);

  // A decode step without hooks replays the cache's captured graph (inputs through pinned memory).
  // Long prefills run in chunks of whole time steps (every row advances together), so working
  // memory stays bounded whatever B x T is. Each chunk appends to the cache and attends to what
  // the earlier chunks stored: a token's result is the same bits as in one call (row-wise ops,
  // per-row invariant GEMMs, attention splits fixed by cache slot). Only without hooks (their
  // observers expect whole [B, T, ...] tensors) and with last-token logits.
  if (T > 1 && M > max_tokens_ && in.logits_last_only && (!hooks || hooks->empty())) {
    const int64_t tc = std::max<int64_t>(1, max_tokens_ / B);
    const std::vector<uint8_t> no_rows(static_cast<size_t>(B), 0);  // the earlier chunks' logits_rows
    ForwardOutput out;
    for (int64_t t0 = 0; t0 < T; t0 += tc) {
      const int64_t n = std::min(tc, T - t0);
      std::vector<int32_t> ids(static_cast<size_t>(B * n)), pos(static_cast<size_t>(B * n));
      std::vector<uint8_t> mask(static_cast<size_t>(B * n));
      for (int64_t bb = 0; bb < B; ++bb)
        for (int64_t t = 0; t < n; ++t) {
          const size_t src = size_t(bb * T + t0 + t), dst = size_t(bb * n + t);
          ids[dst] = in.ids[src];
          pos[dst] = in.positions[src];
          mask[dst] = in.mask[src];
        }
      ForwardInput part = in;
      part.tokens = n;
      part.ids = ids;
      part.positions = pos;
      part.mask = mask;
      // Only the last chunk's tokens are the answer: the others draw nothing and bring no logits
      // rows to the host (every row's [V] logits, 26 MB at V = 102,400 and B = 128, per chunk).
      if (t0 + n < T) {
        part.sampling = {};
        part.logits_rows = no_rows;
      }
      out = forward_step(part, cache_base, hooks);  // the last chunk holds every row's last token
    }
    return out;
  }

  // A cache store's first decode step runs eagerly: one-time setup inside the launchers (cuBLASLt
  // plans for the step's shapes, kernel attributes) must not happen during a capture. (It also
  // keeps the replayed steps fast: s63-1, an H100, ran a new store's graphs from its first step
  // ~2% slower per step for the whole run, 405.5 against 414.5 tok/s, as the cache pool's
  // taken-back stores in s62-1; s64-1, an H200, 489.9 against 495.9. The cause is not known: not
  // the scratch's contents or layout, nor the host's wait for the step, nor idle time; s65 found
  // it in the MoE phase's GEMMs, and only with the side stream and launch overlap both on; s66-3:
  // two, four or nine eager steps leave the replays no faster than one.)
  const bool decode_step = T == 1 && in.logits_last_only && has_head_ && (!hooks || hooks->empty());
  CacheStore& store = cache->store();
  const bool use_graph = graphs_ && decode_step && store.decode_steps > 0;
  if (decode_step) ++store.decode_steps;

  // Host-side bookkeeping: each token's packed cache slot and each query's causal length.
  // Layout [ids | pos | dst | qlen | qrow] (M each), as on the device, then last [B].
  // Then [B] sampling parameters (8 ints each) at 5M + B, the same offset as in the cache's
  // pinned block (M = B there).
  const size_t n_ints = size_t(5 * M + B + 8 * B);
  int32_t* ints = nullptr;
  if (use_graph) {
    ints = cache->pinned();
  } else {
    if (pinned_ints_n_ < n_ints) {
      stream_synchronize(s_);
      if (pinned_ints_) host_free_pinned(pinned_ints_);
      pinned_ints_ = static_cast<int32_t*>(host_alloc_pinned(n_ints * 4));
      pinned_ints_n_ = n_ints;
    }
    ints = pinned_ints_;
  }
  int32_t* ids = ints;
  int32_t* pos = ids + M;
  int32_t* dst = pos + M;
  int32_t* qlen = dst + M;
  int32_t* qrow = qlen + M;
  std::vector<int32_t> last(static_cast<size_t>(B));
  int64_t max_len = 1;
  std::vector<int32_t> real = cache->real_;
  for (int64_t bb = 0; bb < B; ++bb) {
    for (int64_t t = 0; t < T; ++t) {
      const int64_t m = bb * T + t;
      const int32_t id = in.ids[size_t(m)];
      if (id < 0 || id >= V)
        fail("input ids", "row " + std::to_string(bb) + " token " + std::to_string(t),
             "token id " + std::to_string(id) + " is outside the vocabulary (size " + std::to_string(V) + ")");
      const int32_t p = in.positions[size_t(m)];
      if (p < 0 || p >= max_positions_)
        fail("input positions", "row " + std::to_string(bb) + " token " + std::to_string(t),
             "position " + std::to_string(p) + " is outside [0, max_position_embeddings = " +
                 std::to_string(max_positions_) + ")");
      ids[m] = id;
      pos[m] = p;
      qrow[m] = int32_t(bb);
      if (in.mask[size_t(m)]) {
        dst[m] = int32_t(bb * cache->capacity() + real[size_t(bb)]);
        ++real[size_t(bb)];
      } else {
        dst[m] = -1;  // padding: never stored, never attended to
      }
      qlen[m] = real[size_t(bb)];  // keys visible to this query: the row's real tokens so far (itself included)
      max_len = std::max<int64_t>(max_len, qlen[m]);
    }
    last[size_t(bb)] = int32_t(bb * T + T - 1);
  }
  std::vector<int32_t> dst_flat;  // dst as above, kept where padding runs once (the arrays are packed)
  // The cache slot of this call's token (bb, t) inside its row, -1 for padding.
  const auto slot_of = [&](int64_t bb, int64_t t) {
    const int32_t d = dst_flat.empty() ? dst[bb * T + t] : dst_flat[size_t(bb * T + t)];
    return d < 0 ? -1 : int32_t(d - bb * cache->capacity());
  };
  int32_t* sample_host = ints + 5 * M + B;
  if (sampling) std::memcpy(sample_host, in.sampling.data(), size_t(B) * sizeof(sample_core::RowParams));
  const int64_t rows_out = in.logits_last_only ? B : M;

  // Padding once: a padding token's values depend on its id, its position, its visible length
  // and (when that is > 0) its cache row only, since every operation is per row but attention,
  // which reads the cache, and padding is never stored there. So the prefill computes one row
  // per distinct (id, position, length, row if length > 0) among its padding tokens, and every
  // other padding token is that row's copy: the same bits in every [B, T] hook, at a fraction of
  // the work (the issue's traced prefill: 128 prompts of 200-300 tokens, one in six of its
  // 38,400 rows padding). Not with tensor observers (they may write a row; a copy would not pass
  // it on), the attention pattern hook or logits of every row; never in a captured decode step.
  int64_t Mc = M;
  if (pad_dedup_ && T > 1 && !use_graph && in.logits_last_only && !want_pattern &&
      !(hooks && hooks->has_tensor_observers())) {
    const size_t Ms = size_t(M);
    const PadPlan plan = plan_padding({ids, Ms}, {pos, Ms}, {qlen, Ms}, {qrow, Ms}, in.mask);
    if (plan.rows() < M) {
      const int64_t n = plan.rows();
      dst_flat.assign(dst, dst + M);
      std::vector<int32_t> packed(static_cast<size_t>(5 * n));
      for (int64_t r = 0; r < n; ++r)
        for (int64_t a = 0; a < 5; ++a) packed[size_t(a * n + r)] = ints[a * M + plan.first[size_t(r)]];
      for (auto& l : last) l = plan.src_of[size_t(l)];
      std::memcpy(ints, packed.data(), packed.size() * 4);  // ids | pos | dst | qlen | qrow, n each
      if (expand_map_.bytes() < Ms * 4) {
        stream_synchronize(s_);
        expand_map_ = DeviceBlock();
        expand_map_ = DeviceBlock(Ms * 4);
      }
      upload(expand_map_.get(), plan.src_of.data(), Ms * 4);
      expand_ = reinterpret_cast<const int32_t*>(expand_map_.get());
      rows_ = Mc = n;
    }
  }
  Buffers b{};
  if (use_graph) {
    // Buffers sized for the cache's capacity, so that the graphs of one cache share them; the
    // attention bound is the capacity, or kPairBound while every row is that short (graph_bound):
    // at most two graphs serve every step of this cache.
    const int64_t cap = cache->capacity(), bound = graph_bound(cap, max_len);
    const int k = graph_kind(cap, bound);
    Graph& graph = store.decode_graph[k];
    b = carve(M, B, rows_out, M, cap, sampling);
    if (!graph.ready() || store.graph_epoch[k] != current_epoch() || store.graph_samples[k] != sampling) {
      graph.reset();  // (re)capture: first use, or the scratch block moved
      stream_synchronize(s_);
      graph.begin(s_);
      try {
        copy_to_device_async(b.ids, ints, size_t(5 * M) * 4, s_);
        if (sampling)
          copy_to_device_async(b.sample_params, sample_host, size_t(B) * sizeof(sample_core::RowParams), s_);
        layers_forward(B, T, *cache, b, M, nullptr, bound, true, nullptr, sampling);
        copy_to_host_async(ints + 5 * M, b.greedy, size_t(B) * 4, s_);
        graph.end(s_);
      } catch (...) {
        graph.abort(s_);
        throw;
      }
      store.graph_epoch[k] = current_epoch();
      store.graph_samples[k] = sampling;
    }
    graph.launch(s_);
  } else {
    const int64_t per_query = int64_t(mla_decode_workspace_floats(1, int(nh), int(max_len), kSplitTokens)) * 4;
    const int64_t chunk =
        std::clamp<int64_t>(int64_t(kMlaWorkspaceBudget) / per_query, 1, std::min<int64_t>(Mc, 65535));
    b = carve(Mc, B, rows_out, chunk, max_len, sampling);
    copy_to_device_async(b.ids, ints, size_t(5 * Mc) * 4, s_);
    if (sampling) copy_to_device_async(b.sample_params, sample_host, size_t(B) * sizeof(sample_core::RowParams), s_);
    upload(b.last_rows, last.data(), size_t(B) * 4);
    std::vector<int32_t> key_slot;  // [B][Tk] for the pattern hook: the cache's history + this call
    if (want_pattern) {
      const int64_t Tk = cache->length_ + T;
      key_slot.reserve(size_t(B * Tk));
      for (int64_t bb = 0; bb < B; ++bb) {
        const auto& past = cache->key_slot_[size_t(bb)];
        key_slot.insert(key_slot.end(), past.begin(), past.end());
        for (int64_t t = 0; t < T; ++t) key_slot.push_back(slot_of(bb, t));
      }
    }
    layers_forward(B, T, *cache, b, chunk, ints + 3 * Mc, max_len, in.logits_last_only, hooks, sampling,
                   want_pattern ? &key_slot : nullptr);
    // Early graphs: the decode run's greedy step graph, recorded while the GPU runs this prefill
    // (before the head's copies, which wait for it), for the run's steps after its eager first
    // (room for both is left). Its buffers may not move this prefill's. Its attention bound is
    // that first graph step's (the rows' lengths after this prefill, plus two steps).
    const int64_t early_bound = graph_bound(cache->capacity(), int64_t(*std::max_element(real.begin(), real.end())) + 2);
    if (T > 1 && early_graphs_ && graphs_ && has_head_ && in.logits_last_only && (!hooks || hooks->empty()) &&
        !cache->run_active && cache->length_ + T + 1 < cache->capacity() && greedy_step_rows_.count(B) > 0 &&
        !store.run_graph[0][graph_kind(cache->capacity(), early_bound)].ready()) {
      const int64_t rows = rows_, flat = flat_rows_;
      const int32_t* expand = expand_;
      try {
        capture_run_graph(*cache, false, early_bound, true);
      } catch (const std::exception& e) {  // (the run captures at its second step instead)
        early_graphs_ = false;
        std::fprintf(stderr, "atlas: cuda: early graphs off: the capture behind a prefill failed (%s)\n", e.what());
      }
      rows_ = rows, flat_rows_ = flat, expand_ = expand;
    }
  }

  ForwardOutput out;
  if (has_head_) {
    // Logits to the host: every row, or only the rows the caller reads (greedy rows need none).
    const bool all_rows = !in.logits_last_only || in.logits_rows.empty() || (hooks && hooks->wants("logits"));
    std::vector<Elem> lb;
    if (all_rows) {
      lb.resize(size_t(rows_out * V));
      copy_to_host_async(lb.data(), b.logits, lb.size() * kEs, s_);
    } else {
      bool any = false;
      for (uint8_t f : in.logits_rows) any = any || f;
      if (any) {
        lb.assign(size_t(rows_out * V), Elem(0));
        for (int64_t r = 0; r < B; ++r)
          if (in.logits_rows[size_t(r)])
            copy_to_host_async(lb.data() + r * V, b.logits + r * V, size_t(V) * kEs, s_);
      }
    }
    std::vector<int32_t> greedy(static_cast<size_t>(in.logits_last_only ? B : 0));
    if (in.logits_last_only && !use_graph) copy_to_host_async(greedy.data(), b.greedy, greedy.size() * 4, s_);
    deliver_all();  // the last hooks' values, while the head finishes
    stream_synchronize(s_);
    if (use_graph) std::memcpy(greedy.data(), ints + 5 * M, greedy.size() * 4);
    out.logits.resize(lb.size());
    const int64_t nl = int64_t(lb.size());
#pragma omp parallel for schedule(static) if (nl >= (1 << 20))
    for (int64_t i = 0; i < nl; ++i) out.logits[size_t(i)] = elem_to_f32(lb[size_t(i)]);
    if (hooks && hooks->wants("logits")) {
      HookTensor t{.name = "logits", .layer = -1, .dtype = DType::F32,
                   .shape = in.logits_last_only ? std::vector<int64_t>{B, 1, V} : std::vector<int64_t>{B, T, V},
                   .data = out.logits.data()};
      hooks->fire(t);
      if (in.logits_last_only) {
        greedy = greedy_rows(out.logits, B, V);  // an observer may have written
        // ... so sampled rows draw again from what it left, on the host with the kernel's
        // algorithm (decode/sample_core.h: the same tokens).
        for (int64_t r = 0; r < B && sampling; ++r)
          if (in.sampling[size_t(r)].mode == sample_core::kSample)
            greedy[size_t(r)] = sample_core::sample_row(out.logits.data() + r * V, int(V), in.sampling[size_t(r)]);
      }
    }
    for (int64_t r = 0; r < B && sampling; ++r) {
      const int32_t t = greedy[size_t(r)];
      if (in.sampling[size_t(r)].mode == sample_core::kSample && t < 0)
        fail("sampling", "logits[" + std::to_string((-t) >> 3) + "]",
             "row " + std::to_string(r) + ": " + sample_core::error_name((-t) & 7));
    }
    if (in.logits_last_only) out.greedy = std::move(greedy);
  }
  deliver_all();  // (a model without the head: the last layers' hooks)
  check_device_errors();
  for (int64_t bb = 0; bb < B; ++bb)  // the timeline's slot map (the pattern hook's layout)
    for (int64_t t = 0; t < T; ++t) cache->key_slot_[size_t(bb)].push_back(slot_of(bb, t));
  cache->real_ = std::move(real);
  cache->length_ += T;
  if (decode_step && !use_graph && !sampling) greedy_step_rows_.insert(B);  // its setup is done (early graphs)
  return out;
}

template <class Elem>
void CudaModelT<Elem>::capture_run_graph(CudaCache& c, bool sampled, int64_t bound, bool room_only) const {
  const int64_t B = c.batch(), cap = c.capacity();
  CacheStore& store = c.store();
  const int g = sampled ? 1 : 0, k = graph_kind(cap, bound);
  Graph& graph = store.run_graph[g][k];
  const DecodeLaunchScope overlap(true);  // as forward()'s decode steps
  rows_ = flat_rows_ = B;
  expand_ = nullptr;
  bool no_room = false;
  const Buffers b = carve(B, B, B, B, cap, sampled, room_only ? &no_room : nullptr);  // forward()'s decode-graph buffers
  if (no_room) return;
  int32_t* host = c.run_host();  // (allocated before the capture: no allocation inside one)
  int32_t* state = c.run_state();
  if (graph.ready()) {
    graph.reset();
    stream_synchronize(s_);  // (its last launch may be in flight; a new graph needs no wait)
  }
  graph.begin(s_);
  try {
    const RunInputsArgs in{.state = state,
                           .staged = host,
                           .params_staged = sampled ? host + c.run_params_at() : nullptr,
                           .prev = state + 16,
                           .inputs = b.ids,
                           .params = sampled ? reinterpret_cast<int32_t*>(b.sample_params) : nullptr,
                           .batch = int(B),
                           .param_ints = int(sizeof(sample_core::RowParams) / 4),
                           .ring = int(CudaCache::kRing),
                           .stream = s_};
    const RunOutputsArgs out{.state = state,
                             .tokens = b.greedy,
                             .prev = state + 16,
                             .out = host + c.run_out_at(),
                             .err = host + c.run_err_at(),
                             .batch = int(B),
                             .ring = int(CudaCache::kRing),
                             .stream = s_};
    // ATLAS_RUN_FUSED at one row: one launch embeds and norms (where the wide norm serves the
    // row), and a greedy step's argmax writes the outputs.
    const int64_t H = cfg_.hidden_size;
    const bool fuse = run_fused_ && B == 1 && has_head_;
    const StepEnds ends{.embedded_and_normed = fuse && !blocks_.empty() && wide_row_norm(1, int(H)),
                        .outputs = fuse && !sampled ? &out : nullptr};
    if (run_root_) graph_root(s_);
    run_inputs(in);
    if (ends.embedded_and_normed)
      embed_norm({.ids = b.ids,
                  .embed = embed_,
                  .vocab = cfg_.vocab_size,
                  .weight = blocks_[0].ln1,
                  .x = b.x,
                  .h = b.h,
                  .dim = int(H),
                  .eps = float(cfg_.rms_norm_eps),
                  .stream = s_});
    layers_forward(B, 1, c, b, B, nullptr, bound, true, nullptr, sampled, nullptr, &ends);
    if (!ends.outputs) run_outputs(out);
    graph.end(s_);
  } catch (...) {
    graph.abort(s_);
    throw;
  }
  store.run_epoch[g][k] = current_epoch();
}

// A decode run on the CUDA backend: each pushed step replays the cache's step graph, whose first
// node (kernels/decode_run.cuh) takes the step's inputs from the host's pinned ring and each
// row's id from the step before's tokens on the device, and whose last node writes the tokens and
// the error flag into the ring; an event per step tells pop() when they are there. So the host
// never waits between steps: generate() pushes the next step before it reads the last one. The
// graph holds forward()'s decode-step kernels on the same buffers: a run gives the bits of one
// forward() call per step (tests/cuda: CudaTiny.DecodeRun*). Where graphs are off, every step is a
// forward() call in push(); so is a cache store's first decode step (forward()'s rule: it runs
// eagerly; a store taken back from the model's CachePool has run steps, and its graphs replay).
template <class Elem>
class CudaModelT<Elem>::Run final : public DecodeRun {
 public:
  Run(const CudaModelT& m, CudaCache& c, std::span<const int32_t> first, AttentionForm a)
      : m_(m), c_(c), host_ids_(first.begin(), first.end()), attention_(a) {
    if (c_.run_active) fail("decode run", "start_decode", "the cache already has a decode run");
    c_.run_active = true;
  }
  ~Run() override {
    try {
      stream_synchronize(m_.s_);  // the pushed steps (their tokens are dropped)
      for (const Step& st : q_)  // a flag only dropped steps raised is theirs: cleared, not reported
        if (!st.ready && c_.run_host()[c_.run_err_at() + st.slot] != 0) check_device_errors();
    } catch (const Error&) {
    }
    for (Event e : events_) event_destroy(e);
    c_.run_active = false;
  }

  void push(std::span<const int32_t> positions, std::span<const sample_core::RowParams> sampling) override {
    check_decode_push(c_, positions, sampling, pending());
    const int64_t B = c_.batch(), cap = c_.capacity();
    check_step_positions(positions, B, m_.max_positions_, pushed_);
    ++pushed_;
    CacheStore& store = c_.store();
    bool sampled = false;  // any row drawn on the device
    for (const auto& sp : sampling) sampled = sampled || sp.mode == sample_core::kSample;
    if (!m_.graphs_ || store.decode_steps == 0) {
      const std::vector<uint8_t> mask(size_t(B), 1), no_rows(size_t(B), 0);
      const ForwardOutput r = m_.forward_step({.batch = B, .tokens = 1, .ids = host_ids_, .positions = positions,
                                          .mask = mask, .logits_last_only = true, .logits_rows = no_rows,
                                               .attention = attention_, .sampling = sampling},
                                              c_, nullptr);
      host_ids_ = r.greedy;
      feed_host_ = true;  // the next step's ids come from here (a graph step restarts the index)
      q_.push_back({.ready = true, .tokens = r.greedy});
      return;
    }
    // The step's attention bound: its longest row after it (graph_bound), which picks the graph.
    std::vector<int32_t>& real = c_.real_;
    const int64_t bound = m_.graph_bound(cap, int64_t(*std::max_element(real.begin(), real.end())) + 1);
    const int g = sampled ? 1 : 0, k = graph_kind(cap, bound);
    Graph& graph = store.run_graph[g][k];
    m_.drop_late();
    if (!graph.ready() || store.run_epoch[g][k] != m_.current_epoch()) m_.capture_run_graph(c_, sampled, bound);
    m_.rows_ = m_.flat_rows_ = B;
    m_.expand_ = nullptr;
    int32_t* host = c_.run_host();
    int32_t* state = c_.run_state();
    if (feed_host_) {  // this step's ids are the host's: restart the device's step index at 0
      copy_to_device_async(state, host + c_.run_zero_at(), 4, m_.s_);
      j_ = 0;
    }
    // Slot j % R of the ring: free, since at most R steps are pending and this one's step R
    // before was popped (its step had ended).
    const int slot = int(j_ % CudaCache::kRing);
    int32_t* st = host + int64_t(slot) * 5 * B;
    for (int64_t bb = 0; bb < B; ++bb) {
      st[bb] = feed_host_ ? host_ids_[size_t(bb)] : 0;
      st[B + bb] = positions[size_t(bb)];
      st[2 * B + bb] = int32_t(bb * cap + real[size_t(bb)]);
      c_.key_slot_[size_t(bb)].push_back(real[size_t(bb)]);
      ++real[size_t(bb)];
      st[3 * B + bb] = real[size_t(bb)];
      st[4 * B + bb] = int32_t(bb);
    }
    if (sampled)
      std::memcpy(host + c_.run_params_at() + int64_t(slot) * 8 * B, sampling.data(),
                  size_t(B) * sizeof(sample_core::RowParams));
    host[c_.run_err_at() + slot] = 0;
    ++c_.length_;
    ++store.decode_steps;
    graph.launch(m_.s_);
    if (free_.empty()) {
      events_.push_back(event_create());
      free_.push_back(events_.back());
    }
    const Event done = free_.back();
    free_.pop_back();
    event_record(done, m_.s_);
    q_.push_back({.ready = false, .slot = slot, .done = done, .index = pushed_ - 1});
    ++j_;
    feed_host_ = false;
  }

  std::vector<int32_t> pop() override {
    if (q_.empty()) fail("decode run", "pop", "no pushed step left to pop");
    Step st = std::move(q_.front());
    q_.pop_front();
    if (st.ready) return st.tokens;
    event_synchronize(st.done);
    free_.push_back(st.done);
    const int32_t* host = c_.run_host();
    const int64_t B = c_.batch();
    if (host[c_.run_err_at() + st.slot] != 0) {
      stream_synchronize(m_.s_);  // the later steps too, before the flag is read and cleared
      check_device_errors();
    }
    std::vector<int32_t> t(host + c_.run_out_at() + int64_t(st.slot) * B,
                           host + c_.run_out_at() + int64_t(st.slot + 1) * B);
    for (int64_t bb = 0; bb < B; ++bb)
      if (t[size_t(bb)] < 0)  // only a drawn token is ever negative (argmax gives an id or raises the flag)
        fail("sampling", "logits[" + std::to_string((-t[size_t(bb)]) >> 3) + "]",
             "row " + std::to_string(bb) + " step " + std::to_string(st.index) + ": " +
                 sample_core::error_name((-t[size_t(bb)]) & 7));
    return t;
  }

  int64_t pending() const override { return int64_t(q_.size()); }

 private:
  struct Step {
    bool ready = false;           // a forward() step: its tokens are here
    std::vector<int32_t> tokens;
    int slot = 0;                 // a graph step: its ring slot and event
    Event done = nullptr;
    int64_t index = 0;            // pushed as the run's step `index`
  };
  const CudaModelT& m_;
  CudaCache& c_;
  std::vector<int32_t> host_ids_;  // the ids of the next step where feed_host_
  AttentionForm attention_;
  bool feed_host_ = true;
  int64_t j_ = 0, pushed_ = 0;     // the device step index of the next graph step; steps pushed
  std::deque<Step> q_;
  std::vector<Event> events_, free_;
};

template <class Elem>
std::unique_ptr<DecodeRun> CudaModelT<Elem>::start_decode(Cache& cache_base, std::span<const int32_t> first_ids,
                                                          AttentionForm attention) const {
  auto* cache = dynamic_cast<CudaCache*>(&cache_base);
  if (!cache) fail("decode run: the cache was not made by the CUDA backend");
  check_decode_start(*cache, first_ids, cfg_.vocab_size);
  if (!has_head_) fail("decode run: the model was loaded without its final layers (use all layers)");
  return std::make_unique<Run>(*this, *cache, first_ids, attention);
}
}  // namespace

int64_t computed_rows(const Model& model) {
  if (const auto* m = dynamic_cast<const CudaModelT<uint16_t>*>(&model)) return m->computed_rows();
  if (const auto* m = dynamic_cast<const CudaModelT<float>*>(&model)) return m->computed_rows();
  fail("computed_rows: not a CUDA model");
}

std::unique_ptr<Model> make_cuda_model(const Checkpoint& ck, const CudaModelOptions& opts) {
  // A bad ATLAS_* switch, or a flag combination that no hardware can run: refused before
  // looking for a GPU.
  check_environment();
  if (opts.compute == Compute::F32 && !opts.batch_invariant)
    fail("--fast", {}, "the fast mode (cuBLASLt) is bf16-only; --compute f32 is the f32 checking mode with its own "
                       "kernels (drop --fast, or use --compute bf16)");
  if (device_count() == 0)
    fail("--backend", {}, "cuda: no CUDA device found (no GPU or no driver); use --backend cpu");
  if (opts.device < 0 || opts.device >= device_count())
    fail("--device", {}, "cuda device " + std::to_string(opts.device) + " does not exist (" +
                             std::to_string(device_count()) + " found)");
  if (opts.compute == Compute::F32) return std::make_unique<CudaModelT<float>>(ck, opts);
  return std::make_unique<CudaModelT<uint16_t>>(ck, opts);
}

}  // namespace atlas::cuda
