// Shared by the CPU and CUDA reference tests: the committed transformers fixtures
// (tests/fixtures/*/reference.safetensors), a forward pass that captures every tensor those
// fixtures hold under the same names, and the relative error over real tokens.
#pragma once

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/error.h"
#include "io/safetensors.h"
#include "model/model.h"

namespace atlas::test_support {

inline std::vector<std::string> fixture_dirs() {
  std::vector<std::string> out;
  std::filesystem::path root = std::filesystem::path(ATLAS_SOURCE_DIR) / "tests" / "fixtures";
  if (!std::filesystem::exists(root)) return out;
  for (auto& e : std::filesystem::directory_iterator(root))
    if (std::filesystem::exists(e.path() / "reference.safetensors")) out.push_back(e.path().string());
  std::sort(out.begin(), out.end());
  return out;
}

// A fixture's inputs: left-padded ids and mask [B, T].
struct Reference {
  std::shared_ptr<SafetensorsFile> file;
  std::vector<int32_t> ids, mask;
  int64_t B = 0, T = 0;
  explicit Reference(const std::string& dir) {
    file = SafetensorsFile::open(dir + "/reference.safetensors");
    const TensorView* in = file->find("input_ids");
    const TensorView* am = file->find("attention_mask");
    if (!in || !am) fail(dir + "/reference.safetensors", {}, "lacks input_ids/attention_mask");
    B = in->shape[0];
    T = in->shape[1];
    ids.assign(reinterpret_cast<const int32_t*>(in->data), reinterpret_cast<const int32_t*>(in->data) + B * T);
    mask.assign(reinterpret_cast<const int32_t*>(am->data), reinterpret_cast<const int32_t*>(am->data) + B * T);
  }
};

// Everything the reference holds, captured from the model's hooks under the reference's names.
struct Captured {
  std::map<std::string, std::vector<float>> f32;
  std::map<std::string, std::vector<int32_t>> i32;
};

// Runs the fixture's batch (positions = cumsum(mask) - 1, as transformers) and captures
// hidden.{s}, mla.{l}.latent, router.{l}.*, logits. `attention` is the CPU backend's form (the
// CUDA backend always absorbs).
inline Captured run_captured(const Model& model, const Reference& ref,
                             AttentionForm attention = AttentionForm::Expanded) {
  const int64_t B = ref.B, T = ref.T;
  std::vector<int32_t> pos(ref.ids.size());
  std::vector<uint8_t> mask(ref.ids.size());
  for (int64_t b = 0; b < B; ++b) {
    int32_t c = 0;
    for (int64_t t = 0; t < T; ++t) {
      const size_t i = size_t(b * T + t);
      mask[i] = uint8_t(ref.mask[i]);
      pos[i] = ref.mask[i] ? c++ : 0;
    }
  }
  Captured cap;
  Hooks hooks;
  auto keep = [&cap](const std::string& name) {
    return [&cap, name](HookTensor& t) {
      if (t.dtype == DType::I32)
        cap.i32[name].assign(t.i32(), t.i32() + t.numel());
      else
        cap.f32[name].assign(t.f32(), t.f32() + t.numel());
    };
  };
  const int64_t L = model.config().num_hidden_layers;
  hooks.add("embed", keep("hidden.0"));
  for (int64_t l = 0; l < L; ++l) {
    LayerHookNames n(l);
    hooks.add(n.resid_post, keep("hidden." + std::to_string(l + 1)));
    hooks.add(n.latent, keep("mla." + std::to_string(l) + ".latent"));
    hooks.add(n.router_logits, keep("router." + std::to_string(l) + ".logits"));
    hooks.add(n.topk_ids, keep("router." + std::to_string(l) + ".topk_ids"));
    hooks.add(n.topk_weights, keep("router." + std::to_string(l) + ".topk_weights"));
  }
  hooks.add("final_norm", keep("hidden." + std::to_string(L + 1)));
  hooks.add("logits", keep("logits"));
  model.forward({.batch = B, .tokens = T, .ids = ref.ids, .positions = pos, .mask = mask, .attention = attention},
                &hooks);
  return cap;
}

// max |a - b| / max |b| over the real (mask = 1) tokens; rows are `width` wide.
inline double rel_error(const std::vector<float>& a, const std::vector<float>& b, const std::vector<int32_t>& mask,
                        int64_t width) {
  double maxerr = 0, maxref = 0;
  for (size_t m = 0; m < mask.size(); ++m) {
    if (!mask[m]) continue;
    for (int64_t i = 0; i < width; ++i) {
      maxerr = std::max(maxerr, std::abs(double(a[m * width + i]) - double(b[m * width + i])));
      maxref = std::max(maxref, std::abs(double(b[m * width + i])));
    }
  }
  return maxref > 0 ? maxerr / maxref : maxerr;
}

}  // namespace atlas::test_support
