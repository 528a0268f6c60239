// The CUDA forward pass (see cuda_model.h for the contract). One loop over layers, the same
// order and hook points as model/deepseek_v2.cpp; every op is a cuda_ops.h launcher on the
// default stream. Shapes in comments: M = B*T tokens, H hidden, nh heads, dn/dr/dv head dims,
// dc kv_lora_rank, W = dc + dr the cache width.
#include "backend/cuda/cuda_model.h"

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "backend/cuda/cuda_ops.h"
#include "core/bf16.h"
#include "core/error.h"
#include "model/hooks.h"
#include "model/rope.h"

namespace atlas::cuda {
namespace {

constexpr int kSplitTokens = 256;           // MLA split size: part of the numerics (docs/cuda.md)
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

// The latent cache on the device: per layer, per row, `capacity` slots of W bf16 values.
// Rows are packed: slot i of row b is the row's i-th real token (padding is never stored).
class CudaCache final : public Cache {
 public:
  CudaCache(int64_t n_layers, int64_t batch, int64_t capacity, int64_t width)
      : real_(size_t(batch), 0), batch_(batch), capacity_(capacity), width_(width) {
    const size_t bytes = size_t(n_layers * batch * capacity * width) * 2;
    const MemoryInfo mem = memory_info();
    if (bytes > mem.free)
      fail("cuda", "kv cache", "needs " + gib(bytes) + " (" + std::to_string(n_layers) + " layers x " +
                                   std::to_string(batch) + " rows x " + std::to_string(capacity) +
                                   " tokens), the device has " + gib(mem.free) + " free");
    block_ = DeviceBlock(bytes);
  }
  int64_t batch() const override { return batch_; }
  int64_t capacity() const override { return capacity_; }
  int64_t length() const override { return length_; }

  uint16_t* layer(int64_t li) const {
    return reinterpret_cast<uint16_t*>(block_.get()) + li * batch_ * capacity_ * width_;
  }
  int64_t length_ = 0;         // the shared timeline (what the caller sees)
  std::vector<int32_t> real_;  // real tokens stored per row

 private:
  int64_t batch_, capacity_, width_;
  DeviceBlock block_;
};

struct Mlp {
  const uint16_t* gate_up = nullptr;  // [2I, H]: gate rows then up rows (one GEMM for both)
  const uint16_t* down = nullptr;     // [H, I]
  int64_t inter = 0;                  // I
};

struct Layer {
  const uint16_t *ln1 = nullptr, *ln2 = nullptr;   // [H]
  const uint16_t* q = nullptr;                     // [nh*dq, H]
  const uint16_t *q_a = nullptr, *q_b = nullptr;   // [r, H], [nh*dq, r]
  const uint16_t* q_a_ln = nullptr;                // [r]
  const uint16_t* kv_a = nullptr;                  // [W, H]
  const uint16_t* kv_a_ln = nullptr;               // [dc]
  const uint16_t* kv_b = nullptr;                  // [nh*(dn+dv), dc]
  const uint16_t* w_uk_t = nullptr;                // [nh, dc, dn]: W_UK^h transposed, for q~ = q_nope W_UK^h
  const uint16_t* o = nullptr;                     // [H, nh*dv]
  bool moe = false;
  Mlp dense;
  const uint16_t* router = nullptr;  // [E, H]
  std::vector<Mlp> experts;
  bool has_shared = false;
  Mlp shared;
};

// Converting uploads through two pinned staging buffers: converting chunk k overlaps the
// copy of chunk k-1 (before a copy is issued the previous one is waited for, so a buffer is
// never refilled while its copy is in flight).
class Uploader {
 public:
  static constexpr size_t kChunk = size_t(32) << 20;  // bf16 elements per staging buffer (64 MiB)
  Uploader() {
    for (auto& b : buf_) b = static_cast<uint16_t*>(host_alloc_pinned(kChunk * 2));
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
  void upload(const TensorView& t, uint16_t* dst) {
    const int64_t n = t.numel();
    for (int64_t off = 0; off < n; off += int64_t(kChunk)) {
      const int64_t len = std::min<int64_t>(int64_t(kChunk), n - off);
      uint16_t* b = buf_[cur_];
      convert(t, off, len, b);
      stream_synchronize();
      copy_to_device_async(dst + off, b, size_t(len) * 2);
      cur_ ^= 1;
    }
  }
  void upload(const std::vector<uint16_t>& h, uint16_t* dst) {
    stream_synchronize();
    copy_to_device(dst, h.data(), h.size() * 2);
  }

 private:
  static void convert(const TensorView& t, int64_t off, int64_t len, uint16_t* out) {
    switch (t.dtype) {
      case DType::BF16: {
        const uint16_t* s = reinterpret_cast<const uint16_t*>(t.data) + off;
#pragma omp parallel for schedule(static) if (len >= (1 << 20))
        for (int64_t i = 0; i < len; i += 4096) std::memcpy(out + i, s + i, size_t(std::min<int64_t>(4096, len - i)) * 2);
        break;
      }
      case DType::F16: {
        const uint16_t* s = reinterpret_cast<const uint16_t*>(t.data) + off;
#pragma omp parallel for schedule(static) if (len >= (1 << 20))
        for (int64_t i = 0; i < len; ++i) out[i] = f32_to_bf16(f16_to_f32(s[i]));
        break;
      }
      case DType::F32: {
        const float* s = reinterpret_cast<const float*>(t.data) + off;
#pragma omp parallel for schedule(static) if (len >= (1 << 20))
        for (int64_t i = 0; i < len; ++i) out[i] = f32_to_bf16(s[i]);
        break;
      }
      default:
        fail(t.file, t.name, "unsupported dtype " + std::string(dtype_name(t.dtype)) + " (expected BF16, F16 or F32)");
    }
  }
  uint16_t* buf_[2] = {nullptr, nullptr};
  int cur_ = 0;
};

std::vector<float> bf16_to_host_f32(const uint16_t* dev, size_t n) {
  std::vector<uint16_t> h(n);
  copy_to_host(h.data(), dev, n * 2);
  std::vector<float> f(n);
  for (size_t i = 0; i < n; ++i) f[i] = bf16_to_f32(h[i]);
  return f;
}

class CudaModel final : public Model {
 public:
  CudaModel(const Checkpoint& ck, const CudaModelOptions& opts);

  const ModelConfig& config() const override { return cfg_; }
  const LayerRange& layers() const override { return layers_; }
  Compute compute() const override { return Compute::BF16; }
  bool has_head() const override { return has_head_; }
  std::string backend() const override { return "cuda"; }

  std::unique_ptr<Cache> make_cache(int64_t batch, int64_t capacity) const override {
    if (batch <= 0 || capacity <= 0) fail("cuda", "make_cache", "batch and capacity must be > 0");
    return std::make_unique<CudaCache>(layers_.count(), batch, capacity, cfg_.latent_dim());
  }
  ForwardOutput forward(const ForwardInput& in, Cache& cache, const Hooks* hooks = nullptr) const override;
  using Model::forward;

 private:
  // Per-call device buffers, carved from one grow-only block (decode steps reuse it).
  struct Buffers {
    uint16_t *x, *h, *y, *q, *qa, *qn, *lat, *latn, *qt, *olat, *heads, *gu, *act, *xs, *ys, *routed, *shared;
    uint16_t *hl, *logits;
    float *router_logits, *topk_w, *mla_ws;
    int32_t *ids, *pos, *dst_rows, *qlen, *qrow, *last_rows, *topk_ids, *counts, *offsets, *sorted, *slot, *perm_ws;
  };
  Buffers carve(int64_t M, int64_t B, int64_t rows_out, int64_t mla_chunk, int64_t mla_max_len) const;

  void mlp(const Mlp& m, int64_t M, const uint16_t* x, uint16_t* out, const Buffers& b) const;
  void moe(const Layer& L, const LayerHookNames& names, int64_t l, int64_t B, int64_t T, const Buffers& b,
           const Hooks* hooks) const;
  void gemm_bf16(const uint16_t* x, const uint16_t* w, uint16_t* out, int64_t M, int64_t N, int64_t K,
                 int64_t xs = 0, int64_t os = 0) const;
  // Hooks over device tensors: copy out as f32, fire, copy back (an observer may write).
  void hook_bf16(const Hooks* hooks, const std::string& name, int64_t layer, std::vector<int64_t> shape,
                 uint16_t* dev) const;
  void hook_f32(const Hooks* hooks, const std::string& name, int64_t layer, std::vector<int64_t> shape,
                float* dev) const;

  ModelConfig cfg_;
  LayerRange layers_;
  bool has_head_ = false;
  DeviceBlock weights_;
  const uint16_t* embed_ = nullptr;     // [V, H]
  const uint16_t* final_ln_ = nullptr;  // [H]
  const uint16_t* lm_head_ = nullptr;   // [V, H]
  std::vector<Layer> blocks_;
  DeviceBlock rope_;  // cos, sin tables [max_positions, dr/2] bf16
  const uint16_t *cos_ = nullptr, *sin_ = nullptr;
  int max_positions_ = 0;
  float scale_ = 0.0f;
  mutable DeviceBlock scratch_;
};

CudaModel::CudaModel(const Checkpoint& ck, const CudaModelOptions& opts) : cfg_(ck.config()), layers_(ck.layers()) {
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
    total += align_up(elems * 2);
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
    jobs.push_back({&u, off + size_t(g.numel()) * 2});
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
  set_device(opts.device);
  const MemoryInfo mem = memory_info();
  const size_t margin = size_t(1) << 30;
  if (total + margin > mem.free)
    fail(ck.dir(), "weights", "the model needs " + gib(total) + " of device memory in bf16 (plus ~1 GiB working space), the device has " +
                                  gib(mem.free) + " free of " + gib(mem.total));
  weights_ = DeviceBlock(total);
  char* base = weights_.get();
  {
    Uploader up;
    for (const Job& j : jobs) up.upload(*j.t, reinterpret_cast<uint16_t*>(base + j.offset));
    // W_UK^h transposed: w_uk_t[h][c][d] = kv_b[h*(dn+dv) + d][c], so q~ is a plain GEMM per head.
    for (size_t i = 0; i < li.size(); ++i) {
      const TensorView& kvb = *jobs[li[i].kv_b].t;
      const std::vector<float> w = to_f32(kvb);
      std::vector<uint16_t> t(size_t(nh * dc * dn));
      for (int64_t hh = 0; hh < nh; ++hh)
        for (int64_t d = 0; d < dn; ++d)
          for (int64_t cc = 0; cc < dc; ++cc)
            t[size_t((hh * dc + cc) * dn + d)] = f32_to_bf16(w[size_t((hh * (dn + dv) + d) * dc + cc)]);
      up.upload(t, reinterpret_cast<uint16_t*>(base + li[i].w_uk_t));
    }
  }
  synchronize();
  auto at = [&](size_t job) { return reinterpret_cast<const uint16_t*>(base + jobs[job].offset); };
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
    L.kv_a_ln = at(x.kv_a_ln);
    L.kv_b = at(x.kv_b);
    L.w_uk_t = reinterpret_cast<const uint16_t*>(base + x.w_uk_t);
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
  (void)H;

  // RoPE tables: the same cos/sin values the CPU bf16 mode computes (model/rope.h), one row
  // per position up to max_position_embeddings.
  max_positions_ = int(std::max<int64_t>(1, c.max_position_embeddings));
  const std::vector<float> inv = rope_inv_freq(c);
  const float amp = float(c.rope_amplitude());
  const int64_t half = dr / 2;
  std::vector<uint16_t> tab(size_t(2 * max_positions_ * half));
  std::vector<float> cs(static_cast<size_t>(dr));
  for (int64_t p = 0; p < max_positions_; ++p) {
    rope_cos_sin(inv, amp, p, true, cs.data(), cs.data() + half);
    for (int64_t k = 0; k < half; ++k) {
      tab[size_t(p * half + k)] = f32_to_bf16(cs[size_t(k)]);
      tab[size_t((max_positions_ + p) * half + k)] = f32_to_bf16(cs[size_t(half + k)]);
    }
  }
  rope_ = DeviceBlock(tab.size() * 2);
  copy_to_device(rope_.get(), tab.data(), tab.size() * 2);
  cos_ = reinterpret_cast<const uint16_t*>(rope_.get());
  sin_ = cos_ + max_positions_ * half;
  scale_ = float(c.softmax_scale());
}

void CudaModel::gemm_bf16(const uint16_t* x, const uint16_t* w, uint16_t* out, int64_t M, int64_t N, int64_t K,
                          int64_t xs, int64_t os) const {
  gemm({.x = x, .w = w, .out = out, .out_type = OutType::bf16, .M = int(M), .N = int(N), .K = int(K),
        .x_stride = xs, .out_stride = os, .mode = GemmMode::batch_invariant});
}

void CudaModel::hook_bf16(const Hooks* hooks, const std::string& name, int64_t layer, std::vector<int64_t> shape,
                          uint16_t* dev) const {
  if (!hooks || !hooks->wants(name)) return;
  int64_t n = 1;
  for (auto d : shape) n *= d;
  std::vector<float> f = bf16_to_host_f32(dev, size_t(n));
  HookTensor t{.name = name, .layer = layer, .dtype = DType::F32, .shape = std::move(shape), .data = f.data()};
  hooks->fire(t);
  std::vector<uint16_t> h(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) h[size_t(i)] = f32_to_bf16(f[size_t(i)]);
  copy_to_device(dev, h.data(), h.size() * 2);
}

void CudaModel::hook_f32(const Hooks* hooks, const std::string& name, int64_t layer, std::vector<int64_t> shape,
                         float* dev) const {
  if (!hooks || !hooks->wants(name)) return;
  int64_t n = 1;
  for (auto d : shape) n *= d;
  std::vector<float> f(static_cast<size_t>(n));
  copy_to_host(f.data(), dev, f.size() * 4);
  HookTensor t{.name = name, .layer = layer, .dtype = DType::F32, .shape = std::move(shape), .data = f.data()};
  hooks->fire(t);
  copy_to_device(dev, f.data(), f.size() * 4);
}

CudaModel::Buffers CudaModel::carve(int64_t M, int64_t B, int64_t rows_out, int64_t mla_chunk,
                                    int64_t mla_max_len) const {
  const ModelConfig& c = cfg_;
  const int64_t H = c.hidden_size, nh = c.num_attention_heads, dq = c.q_head_dim(), dv = c.v_head_dim;
  const int64_t dc = c.kv_lora_rank, W = c.latent_dim(), E = std::max<int64_t>(1, c.n_routed_experts);
  const int64_t k = std::max<int64_t>(1, c.num_experts_per_tok), r = c.q_lora_rank.value_or(1);
  int64_t inter_rows = M * c.intermediate_size;  // widest MLP activation, in elements per GEMM row set
  if (c.n_routed_experts > 0) {
    inter_rows = std::max(inter_rows, M * k * c.moe_intermediate_size);
    inter_rows = std::max(inter_rows, M * c.moe_intermediate_size * std::max<int64_t>(1, c.n_shared_experts));
  }
  struct Req {
    void** p;
    size_t bytes;
  };
  Buffers b{};
  std::vector<Req> reqs = {
      {(void**)&b.x, size_t(M * H) * 2},           {(void**)&b.h, size_t(M * H) * 2},
      {(void**)&b.y, size_t(M * H) * 2},           {(void**)&b.q, size_t(M * nh * dq) * 2},
      {(void**)&b.qa, size_t(M * r) * 2},          {(void**)&b.qn, size_t(M * r) * 2},
      {(void**)&b.lat, size_t(M * W) * 2},         {(void**)&b.latn, size_t(M * W) * 2},
      {(void**)&b.qt, size_t(M * nh * W) * 2},     {(void**)&b.olat, size_t(M * nh * dc) * 2},
      {(void**)&b.heads, size_t(M * nh * dv) * 2}, {(void**)&b.gu, size_t(2 * inter_rows) * 2},
      {(void**)&b.act, size_t(inter_rows) * 2},    {(void**)&b.xs, size_t(M * k * H) * 2},
      {(void**)&b.ys, size_t(M * k * H) * 2},      {(void**)&b.routed, size_t(M * H) * 2},
      {(void**)&b.shared, size_t(M * H) * 2},      {(void**)&b.hl, size_t(rows_out * H) * 2},
      {(void**)&b.logits, size_t(rows_out * c.vocab_size) * 2},
      {(void**)&b.router_logits, size_t(M * E) * 4},
      {(void**)&b.topk_w, size_t(M * k) * 4},
      {(void**)&b.mla_ws, mla_decode_workspace_floats(int(mla_chunk), int(nh), int(mla_max_len), kSplitTokens) * 4},
      {(void**)&b.ids, size_t(M) * 4},             {(void**)&b.pos, size_t(M) * 4},
      {(void**)&b.dst_rows, size_t(M) * 4},        {(void**)&b.qlen, size_t(M) * 4},
      {(void**)&b.qrow, size_t(M) * 4},            {(void**)&b.last_rows, size_t(B) * 4},
      {(void**)&b.topk_ids, size_t(M * k) * 4},    {(void**)&b.counts, size_t(E) * 4},
      {(void**)&b.offsets, size_t(E + 1) * 4},     {(void**)&b.sorted, size_t(M * k) * 4},
      {(void**)&b.slot, size_t(M * k) * 4},
      {(void**)&b.perm_ws, moe_permute_workspace_ints(int(M), int(E)) * 4},
  };
  size_t total = 0;
  for (const auto& q : reqs) total += align_up(std::max<size_t>(q.bytes, 1));
  if (scratch_.bytes() < total) {
    scratch_ = DeviceBlock();  // free the old block first
    const MemoryInfo mem = memory_info();
    if (total > mem.free)
      fail("cuda", "forward", "this batch (" + std::to_string(M) + " tokens) needs " + gib(total) +
                                  " of working memory, the device has " + gib(mem.free) + " free");
    scratch_ = DeviceBlock(total);
  }
  size_t off = 0;
  for (const auto& q : reqs) {
    *q.p = scratch_.get() + off;
    off += align_up(std::max<size_t>(q.bytes, 1));
  }
  return b;
}

void CudaModel::mlp(const Mlp& m, int64_t M, const uint16_t* x, uint16_t* out, const Buffers& b) const {
  const int64_t H = cfg_.hidden_size, I = m.inter;
  if (M == 0) return;
  gemm_bf16(x, m.gate_up, b.gu, M, 2 * I, H);  // [M, 2I]: gate | up
  silu_gate({.gate = b.gu, .up = b.gu + I, .out = b.act, .rows = int(M), .width = int(I), .in_stride = 2 * I});
  gemm_bf16(b.act, m.down, out, M, H, I);
}

void CudaModel::moe(const Layer& L, const LayerHookNames& names, int64_t l, int64_t B, int64_t T, const Buffers& b,
                    const Hooks* hooks) const {
  const ModelConfig& c = cfg_;
  const int64_t M = B * T, H = c.hidden_size, E = c.n_routed_experts, k = c.num_experts_per_tok;
  const int64_t I = c.moe_intermediate_size;
  // Router logits in fp32 (bf16 products are exact in fp32: the official upcast GEMM).
  gemm({.x = b.h, .w = L.router, .out = b.router_logits, .out_type = OutType::f32, .M = int(M), .N = int(E),
        .K = int(H), .mode = GemmMode::batch_invariant});
  hook_f32(hooks, names.router_logits, l, {B, T, E}, b.router_logits);
  router({.logits = b.router_logits, .topk_ids = b.topk_ids, .topk_weights = b.topk_w, .tokens = int(M),
          .experts = int(E), .k = int(k),
          .method = c.topk_method == atlas::TopkMethod::GroupLimitedGreedy ? TopkMethod::group_limited_greedy
                                                                           : TopkMethod::greedy,
          .n_group = int(c.n_group), .topk_group = int(c.topk_group), .norm_topk_prob = c.norm_topk_prob,
          .routed_scaling_factor = float(c.routed_scaling_factor)});
  if (hooks && hooks->wants(names.topk_ids)) {
    std::vector<int32_t> ids(static_cast<size_t>(M * k));
    copy_to_host(ids.data(), b.topk_ids, ids.size() * 4);
    HookTensor t{.name = names.topk_ids, .layer = l, .dtype = DType::I32, .shape = {B, T, k}, .data = ids.data()};
    hooks->fire(t);
    for (int32_t id : ids)
      if (id < 0 || id >= E)
        fail("hook " + names.topk_ids, {}, "an observer wrote expert id " + std::to_string(id) + " (valid: 0-" +
                                               std::to_string(E - 1) + ")");
    copy_to_device(b.topk_ids, ids.data(), ids.size() * 4);
  }
  hook_f32(hooks, names.topk_weights, l, {B, T, k}, b.topk_w);

  // Dispatch: rows sorted by expert (stable: ascending token inside an expert), one
  // invariant GEMM chain per non-empty expert over its contiguous row range.
  moe_permute({.topk_ids = b.topk_ids, .tokens = int(M), .k = int(k), .experts = int(E), .counts = b.counts,
               .offsets = b.offsets, .sorted_token = b.sorted, .pair_slot = b.slot, .workspace = b.perm_ws});
  std::vector<int32_t> offsets(static_cast<size_t>(E + 1));
  copy_to_host(offsets.data(), b.offsets, offsets.size() * 4);  // synchronises: the expert loop needs counts
  moe_gather({.x = b.h, .sorted_token = b.sorted, .x_sorted = b.xs, .rows = int(M * k), .dim = int(H)});
  for (int64_t e = 0; e < E; ++e) {
    const int64_t o = offsets[size_t(e)], n = offsets[size_t(e + 1)] - o;
    if (n > 0) gemm_bf16(b.xs + o * H, L.experts[size_t(e)].gate_up, b.gu + o * 2 * I, n, 2 * I, H);
  }
  silu_gate({.gate = b.gu, .up = b.gu + I, .out = b.act, .rows = int(M * k), .width = int(I), .in_stride = 2 * I});
  for (int64_t e = 0; e < E; ++e) {
    const int64_t o = offsets[size_t(e)], n = offsets[size_t(e + 1)] - o;
    if (n > 0) gemm_bf16(b.act + o * I, L.experts[size_t(e)].down, b.ys + o * H, n, H, I);
  }
  moe_combine({.y_sorted = b.ys, .pair_slot = b.slot, .topk_weights = b.topk_w, .out = b.routed, .tokens = int(M),
               .k = int(k), .dim = int(H)});
  hook_bf16(hooks, names.routed_out, l, {B, T, H}, b.routed);
  if (L.has_shared) {
    mlp(L.shared, M, b.h, b.shared, b);
    hook_bf16(hooks, names.shared_out, l, {B, T, H}, b.shared);
    add_bf16({.a = b.routed, .b = b.shared, .out = b.y, .n = M * H});
  } else {
    copy_2d(b.y, size_t(H) * 2, b.routed, size_t(H) * 2, size_t(H) * 2, size_t(M));
  }
}

ForwardOutput CudaModel::forward(const ForwardInput& in, Cache& cache_base, const Hooks* hooks) const {
  auto* cache = dynamic_cast<CudaCache*>(&cache_base);
  if (!cache) fail("forward: the cache was not made by the CUDA backend");
  const ModelConfig& c = cfg_;
  const int64_t B = in.batch, T = in.tokens, M = B * T, H = c.hidden_size, V = c.vocab_size;
  const int64_t nh = c.num_attention_heads, dn = c.qk_nope_head_dim, dr = c.qk_rope_head_dim, dv = c.v_head_dim;
  const int64_t dc = c.kv_lora_rank, dq = dn + dr, W = dc + dr;
  if (B <= 0 || T <= 0) fail("forward: empty batch");
  if (int64_t(in.ids.size()) != M || int64_t(in.positions.size()) != M || int64_t(in.mask.size()) != M)
    fail("forward: ids, positions and mask must each hold batch x tokens values");
  if (cache->batch() != B) fail("forward: kv cache batch size differs from the input's");
  if (cache->length_ + T > cache->capacity())
    fail("kv cache: " + std::to_string(cache->length_ + T) + " tokens exceed its capacity of " +
         std::to_string(cache->capacity()));
  for (int64_t l = layers_.first; l <= layers_.last; ++l)
    if (hooks && hooks->wants(LayerHookNames(l).pattern))
      fail("hook " + LayerHookNames(l).pattern, {},
           "the attention pattern is not available on the cuda backend yet (use --backend cpu)");

  // Host-side bookkeeping: each token's packed cache slot and each query's causal length.
  std::vector<int32_t> ints(size_t(5 * M + B));
  int32_t* ids = ints.data();
  int32_t* pos = ids + M;
  int32_t* dst = pos + M;
  int32_t* qlen = dst + M;
  int32_t* qrow = qlen + M;
  int32_t* last = qrow + M;
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
    last[bb] = int32_t(bb * T + T - 1);
  }
  const int64_t rows_out = in.logits_last_only ? B : M;
  const int64_t per_query = int64_t(mla_decode_workspace_floats(1, int(nh), int(max_len), kSplitTokens)) * 4;
  const int64_t chunk = std::clamp<int64_t>(int64_t(kMlaWorkspaceBudget) / per_query, 1, std::min<int64_t>(M, 65535));
  const Buffers b = carve(M, B, rows_out, chunk, max_len);
  copy_to_device(b.ids, ids, size_t(M) * 4);
  copy_to_device(b.pos, pos, size_t(M) * 4);
  copy_to_device(b.dst_rows, dst, size_t(M) * 4);
  copy_to_device(b.qlen, qlen, size_t(M) * 4);
  copy_to_device(b.qrow, qrow, size_t(M) * 4);
  copy_to_device(b.last_rows, last, size_t(B) * 4);

  // Embedding lookup: x [M, H], the residual stream.
  copy_rows({.src = embed_, .dst = b.x, .src_rows = b.ids, .rows = M, .width = int(H), .src_limit = V, .dst_limit = M});
  hook_bf16(hooks, "embed", -1, {B, T, H}, b.x);

  for (int64_t li = 0; li < int64_t(blocks_.size()); ++li) {
    const Layer& L = blocks_[size_t(li)];
    const int64_t l = layers_.first + li;
    const LayerHookNames names(l);
    uint16_t* kv = cache->layer(li);
    const float eps = float(c.rms_norm_eps);

    // h = input_layernorm(x)
    rmsnorm({.x = b.x, .weight = L.ln1, .out = b.h, .rows = int(M), .dim = int(H), .eps = eps});
    hook_bf16(hooks, names.ln1, l, {B, T, H}, b.h);
    // q [M, nh*dq] (or the LoRA path q_b(rmsnorm(q_a h)))
    if (c.q_lora_rank) {
      const int64_t r = *c.q_lora_rank;
      gemm_bf16(b.h, L.q_a, b.qa, M, r, H);
      rmsnorm({.x = b.qa, .weight = L.q_a_ln, .out = b.qn, .rows = int(M), .dim = int(r), .eps = eps});
      gemm_bf16(b.qn, L.q_b, b.q, M, nh * dq, r);
    } else {
      gemm_bf16(b.h, L.q, b.q, M, nh * dq, H);
    }
    hook_bf16(hooks, names.q, l, {B, T, nh, dq}, b.q);
    // latent [M, W] = kv_a h: the compressed KV and the shared rope key, before norm / RoPE.
    gemm_bf16(b.h, L.kv_a, b.lat, M, W, H);
    hook_bf16(hooks, names.latent, l, {B, T, W}, b.lat);
    // Cache slot = [rmsnorm(c) | rope(k_pe)]; the queries' rope parts rotate at the same positions.
    rmsnorm({.x = b.lat, .weight = L.kv_a_ln, .out = b.latn, .rows = int(M), .dim = int(dc), .x_stride = W,
             .out_stride = W, .eps = eps});
    copy_2d(b.latn + dc, size_t(W) * 2, b.lat + dc, size_t(W) * 2, size_t(dr) * 2, size_t(M));
    rope_inplace({.x = b.latn + dc, .tokens = int(M), .heads = 1, .token_stride = W, .head_stride = W,
                  .rope_dim = int(dr), .positions = b.pos, .cos = cos_, .sin = sin_, .max_positions = max_positions_});
    rope_inplace({.x = b.q + dn, .tokens = int(M), .heads = int(nh), .token_stride = nh * dq, .head_stride = dq,
                  .rope_dim = int(dr), .positions = b.pos, .cos = cos_, .sin = sin_, .max_positions = max_positions_});
    hook_bf16(hooks, names.latent_norm, l, {B, T, W}, b.latn);
    copy_rows({.src = b.latn, .dst = kv, .dst_rows = b.dst_rows, .rows = M, .width = int(W), .src_limit = M,
               .dst_limit = B * cache->capacity()});

    // Absorbed attention. q~_h = q_nope_h W_UK^h  -> qt[:, h, :dc]; qt[:, h, dc:] = rotated q_pe_h.
    for (int64_t hh = 0; hh < nh; ++hh)
      gemm_bf16(b.q + hh * dq, L.w_uk_t + hh * dc * dn, b.qt + hh * W, M, dc, dn, nh * dq, nh * W);
    copy_2d(b.qt + dc, size_t(W) * 2, b.q + dn, size_t(dq) * 2, size_t(dr) * 2, size_t(M * nh));
    // o_lat [M, nh, dc] = softmax(q~ . cache) . c^, each query over its row's first qlen slots.
    for (int64_t r0 = 0; r0 < M; r0 += chunk) {
      const int64_t n = std::min(chunk, M - r0);
      int64_t ml = 1;
      for (int64_t m = r0; m < r0 + n; ++m) ml = std::max<int64_t>(ml, qlen[m]);
      mla_decode({.q = b.qt + r0 * nh * W, .latent_cache = kv, .cache_row_stride = cache->capacity() * W,
                  .lengths = b.qlen + r0, .cache_rows = b.qrow + r0, .max_length = int(ml), .out = b.olat + r0 * nh * dc,
                  .latent = int(dc), .rope = int(dr), .rows = int(n), .heads = int(nh), .scale = scale_,
                  .split_tokens = kSplitTokens, .workspace = b.mla_ws});
    }
    // O_h = o_lat_h W_UV^h^T -> heads [M, nh*dv]
    for (int64_t hh = 0; hh < nh; ++hh)
      gemm_bf16(b.olat + hh * dc, L.kv_b + (hh * (dn + dv) + dn) * dc, b.heads + hh * dv, M, dv, dc, nh * dc, nh * dv);
    gemm_bf16(b.heads, L.o, b.y, M, H, nh * dv);
    hook_bf16(hooks, names.attn_out, l, {B, T, H}, b.y);
    add_bf16({.a = b.x, .b = b.y, .out = b.x, .n = M * H});
    hook_bf16(hooks, names.resid_mid, l, {B, T, H}, b.x);

    // h = post_attention_layernorm(x); x = x + mlp_or_moe(h)
    rmsnorm({.x = b.x, .weight = L.ln2, .out = b.h, .rows = int(M), .dim = int(H), .eps = eps});
    hook_bf16(hooks, names.ln2, l, {B, T, H}, b.h);
    if (L.moe)
      moe(L, names, l, B, T, b, hooks);
    else
      mlp(L.dense, M, b.h, b.y, b);
    hook_bf16(hooks, names.mlp_out, l, {B, T, H}, b.y);
    add_bf16({.a = b.x, .b = b.y, .out = b.x, .n = M * H});
    hook_bf16(hooks, names.resid_post, l, {B, T, H}, b.x);
  }
  check_device_errors();
  cache->real_ = std::move(real);
  cache->length_ += T;

  ForwardOutput out;
  if (!has_head_) return out;
  rmsnorm({.x = b.x, .weight = final_ln_, .out = b.h, .rows = int(M), .dim = int(H), .eps = float(c.rms_norm_eps)});
  hook_bf16(hooks, "final_norm", -1, {B, T, H}, b.h);
  const uint16_t* head_in = b.h;
  if (in.logits_last_only) {
    copy_rows({.src = b.h, .dst = b.hl, .src_rows = b.last_rows, .rows = B, .width = int(H), .src_limit = M,
               .dst_limit = B});
    head_in = b.hl;
  }
  // lm_head in bf16 (the official bf16 model's logits dtype; the CPU bf16 mode rounds there too).
  gemm_bf16(head_in, lm_head_, b.logits, rows_out, V, H);
  out.logits = bf16_to_host_f32(b.logits, size_t(rows_out * V));
  check_device_errors();
  if (hooks && hooks->wants("logits")) {
    HookTensor t{.name = "logits", .layer = -1, .dtype = DType::F32,
                 .shape = in.logits_last_only ? std::vector<int64_t>{B, 1, V} : std::vector<int64_t>{B, T, V},
                 .data = out.logits.data()};
    hooks->fire(t);
  }
  return out;
}

}  // namespace

std::unique_ptr<Model> make_cuda_model(const Checkpoint& ck, const CudaModelOptions& opts) {
  if (device_count() == 0)
    fail("--backend", {}, "cuda: no CUDA device found (no GPU or no driver); use --backend cpu");
  if (opts.device < 0 || opts.device >= device_count())
    fail("--device", {}, "cuda device " + std::to_string(opts.device) + " does not exist (" +
                             std::to_string(device_count()) + " found)");
  if (opts.compute != Compute::BF16)
    fail("--compute", {}, "the cuda backend computes in bf16 only for now (use --compute bf16, or --backend cpu for f32)");
  return std::make_unique<CudaModel>(ck, opts);
}

}  // namespace atlas::cuda
