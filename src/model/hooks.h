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
#pragma once

#include <cstdint>
#include <functional>
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

class Hooks {
 public:
  using Fn = std::function<void(HookTensor&)>;

  // pattern: an exact hook name, or a glob with '*' (matches any run of characters), e.g.
  // "blocks.*.moe.hook_topk_ids". Observers run in the order they were added.
  void add(std::string pattern, Fn fn);
  bool wants(std::string_view name) const;
  bool empty() const { return subs_.empty(); }
  void fire(HookTensor& t) const;

 private:
  struct Sub {
    std::string pattern;
    Fn fn;
  };
  std::vector<Sub> subs_;
};

bool glob_match(std::string_view pattern, std::string_view name);

// Every hook point of the model, for listing and for validating patterns.
struct HookInfo {
  std::string name;   // with {L} for per-layer hooks
  std::string shape;  // symbolic, e.g. "[B,T,H]"
  std::string dtype;  // "F32" or "I32"
  std::string when;   // what the value is and when it fires
};
const std::vector<HookInfo>& hook_catalog();

// Per-layer hook names, built once per layer so the forward pass does not format strings.
struct LayerHookNames {
  std::string ln1, q, latent, latent_norm, pattern, attn_out, resid_mid, ln2, router_logits, topk_ids,
      topk_weights, shared_out, routed_out, mlp_out, resid_post;
  explicit LayerHookNames(int64_t layer);
};

}  // namespace atlas
