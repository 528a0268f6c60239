// Hook points: named places in the forward pass where observers read, and may overwrite,
// an intermediate tensor.
//
// Names are stable strings shaped like the checkpoint names (the full list, with shapes and
// firing points, is hook_catalog() below and `atlas hooks`). The forward pass fires a hook
// right after computing the value and *before* using it, so an observer that writes into
// the tensor changes everything downstream: reading and intervening go through one path.
//
// Untraced runs pay almost nothing: the forward asks wants(name) before materialising any
// value that exists only for observers (the attention pattern, for example).
//
// Three kinds of observer: tensor observers (add) see, and may overwrite, the f32 tensor;
// readers (add_reader) see the same tensor but may not change it; digest observers
// (add_digests) see only the per-token SHA-256 digests of a [B, T, ...] float hook
// (model/digest.h), which is all a trace that keeps stage hashes needs. A backend that can
// digest where the tensor lives (the CUDA backend, on the device) does so when no tensor
// observer wants the hook, and copies out 32 bytes per token instead of the whole tensor.
//
// Readers and digest observers only record, so a backend may deliver them late: the CUDA
// backend copies their values out asynchronously and calls them while later layers run (a
// hook that only they want costs the GPU no wait). Guarantees: every delivery happens before
// forward() returns; deliveries keep hook order among themselves, and all deliveries of a hook
// come before the tensor observers of any later hook; at one hook the order is tensor
// observers, then readers, then digest observers, and readers see the values the tensor
// observers left.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/dtype.h"

namespace atlas {

// A tensor at a hook point. data is F32 or I32 (dtype says which), row-major over shape.
// The leading dimensions are [B, T] (batch row, token) for per-token hooks.
struct HookTensor {
  std::string_view name;
  int64_t layer = -1;  // -1 for global hooks
  DType dtype = DType::F32;
  std::vector<int64_t> shape;
  void* data = nullptr;

  int64_t numel() const {
    int64_t n = 1;
    for (auto d : shape) n *= d;
    return n;
  }
  float* f32() const { return static_cast<float*>(data); }
  int32_t* i32() const { return static_cast<int32_t*>(data); }
};

// The per-token digests of a [B, T, ...] float hook: token (b, t)'s digest is the SHA-256 of
// its T-slice (every value after the [B, T] dimensions) as float32 little-endian bytes,
// at sha256 + (b*T + t)*32 (definition: model/digest.h, docs/trace.md).
struct HookDigests {
  std::string_view name;
  int64_t layer = -1;  // -1 for global hooks
  int64_t rows = 0;    // B
  int64_t tokens = 0;  // T
  const uint8_t* sha256 = nullptr;  // [B*T][32]

  // Row b's digests of tokens [a, e), (e - a) * 32 bytes: digest_chain_hex() of it is the
  // stage hash of that range. Throws on a range outside [0, T].
  std::span<const uint8_t> row(int64_t b, int64_t a, int64_t e) const;
};

bool glob_match(std::string_view pattern, std::string_view name);

// A tensor observer's edit of whole token rows, in a form a backend may run where the tensor
// lives (the CUDA backend: on the device, with no copy to the host and back). The observer is
// select() then apply_row_edit() (below); a backend that runs the edit instead must give its
// bits, and a bf16 hook's value is rounded to bf16 once afterwards (only one edit per bf16 hook
// runs that way: two observers in a row round once, after both). select(shape, rows, add) lists
// the token rows to edit (indexes into the hook's [B*T', W] values, W = the values after
// [B, T']) and for Add the values to add; it counts as the observer's call and may throw (it
// may run before earlier hooks' late deliveries: it reads only the pass's own state).
struct HookRowEdit {
  enum class Op { Zero, Scale, Add };
  Op op = Op::Zero;
  double factor = 1;
  bool per_row = false;
  std::function<void(const std::vector<int64_t>& shape, std::vector<int64_t>& rows, std::vector<float>& add)> select;
};

// The edit on f32 values t ([B, T', ...]): for each listed row r and value v:
//   Zero:  0
//   Scale: float(double(v) * factor)
//   Add:   float(double(v) + factor * double(s_j)), s = the row's `add` values ([W] per listed
//          row when per_row, else one [W] vector for every row)
void apply_row_edit(const HookRowEdit& e, std::span<const int64_t> rows, std::span<const float> add, HookTensor& t);

class Hooks {
 public:
  using Fn = std::function<void(HookTensor&)>;
  using DigestFn = std::function<void(const HookDigests&)>;
  using ReadFn = std::function<void(const HookTensor&)>;

  // pattern: an exact hook name, or a glob with '*' (matches any run of characters), e.g.
  // "blocks.*.moe.hook_topk_ids". Observers of a kind run in the order they were added; at one
  // hook every tensor observer runs before every digest observer.
  void add(std::string pattern, Fn fn);
  // A tensor observer that is also a row edit (HookRowEdit above): fn defines it.
  void add(std::string pattern, Fn fn, std::shared_ptr<const HookRowEdit> edit);
  // Digests exist only for [B, T, ...] float hooks: a pattern that matches an I32 hook
  // (hook_topk_ids) or one not laid out [B, T, ...] (attn.hook_pattern) throws naming the hook.
  void add_digests(std::string pattern, DigestFn fn);
  // A read-only observer (see above: it may be called after the forward pass moved on).
  void add_reader(std::string pattern, ReadFn fn);

  bool wants(std::string_view name) const { return wants_tensor(name) || wants_reader(name) || wants_digests(name); }
  bool wants_tensor(std::string_view name) const;
  bool wants_reader(std::string_view name) const;
  bool wants_digests(std::string_view name) const;
  bool empty() const { return tensor_subs_.empty() && reader_subs_.empty() && digest_subs_.empty(); }
  bool has_tensor_observers() const { return !tensor_subs_.empty(); }  // (observers that may write)
  // The row edits of the tensor observers of `name`, in their order, when every one of them
  // has one (a backend may then run them instead of calling the observers); else empty.
  std::vector<const HookRowEdit*> row_edits(std::string_view name) const;

  // Calls the tensor observers, then fire_read(t). Backends without a deferred path of their
  // own need nothing else.
  void fire(HookTensor& t) const;
  // The tensor observers only: a backend that stores the values in another type rounds what
  // they wrote before fire_read(t), so that readers see what the model goes on with.
  void fire_tensor(HookTensor& t) const;
  // Calls the readers; then, if digest observers want the hook, digests the f32 tensor on the
  // host and calls them (a backend's late delivery of a hook no tensor observer wants).
  void fire_read(const HookTensor& t) const;
  // For backends that computed the digests themselves (only when !wants_tensor(name)).
  void fire_digests(const HookDigests& d) const;

 private:
  template <class F>
  struct Sub {
    std::string pattern;
    F fn;
  };
  template <class F>
  static bool any_matches(const std::vector<Sub<F>>& subs, std::string_view name) {
    for (const auto& s : subs)
      if (glob_match(s.pattern, name)) return true;
    return false;
  }
  std::vector<Sub<Fn>> tensor_subs_;
  std::vector<std::shared_ptr<const HookRowEdit>> tensor_edits_;  // beside tensor_subs_ (null: none)
  std::vector<Sub<ReadFn>> reader_subs_;
  std::vector<Sub<DigestFn>> digest_subs_;
};


// Every hook point of the model, for listing and for validating patterns.
struct HookInfo {
  std::string name;   // with {L} for per-layer hooks
  std::string shape;  // symbolic, e.g. "[B,T,H]"
  std::string dtype;  // "F32" or "I32"
  std::string when;   // what the value is and when it fires
};
const std::vector<HookInfo>& hook_catalog();
// The catalog entry of a concrete hook name ("blocks.3.attn.hook_q" -> blocks.{L}.attn.hook_q's),
// null for names outside the catalog.
const HookInfo* find_hook(std::string_view name);

// Per-layer hook names, built once per layer so the forward pass does not format strings.
struct LayerHookNames {
  std::string ln1, q, latent, latent_norm, pattern, attn_out, resid_mid, ln2, router_logits, topk_ids,
      topk_weights, shared_out, routed_out, mlp_out, resid_post;
  explicit LayerHookNames(int64_t layer);
};

}  // namespace atlas
