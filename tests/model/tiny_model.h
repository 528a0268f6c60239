// An in-memory DeepSeek-V2 with random weights, for tests that need no files.
#pragma once

#include <map>
#include <random>
#include <string>
#include <vector>

#include "core/bf16.h"
#include "model/config.h"
#include "model/deepseek_v2.h"

namespace atlas::test_support {

inline json tiny_config_json() {
  return json::parse(R"({
    "model_type": "deepseek_v2", "vocab_size": 97, "hidden_size": 32, "num_hidden_layers": 3,
    "num_attention_heads": 4, "q_lora_rank": null, "kv_lora_rank": 16, "qk_nope_head_dim": 8,
    "qk_rope_head_dim": 4, "v_head_dim": 8, "intermediate_size": 48, "moe_intermediate_size": 12,
    "n_routed_experts": 8, "n_shared_experts": 1, "num_experts_per_tok": 3, "first_k_dense_replace": 1,
    "moe_layer_freq": 1, "topk_method": "group_limited_greedy", "n_group": 4, "topk_group": 2,
    "norm_topk_prob": true, "routed_scaling_factor": 1.0, "scoring_func": "softmax", "rope_theta": 10000,
    "rope_scaling": {"type": "yarn", "factor": 4, "original_max_position_embeddings": 8, "beta_fast": 32,
                     "beta_slow": 1, "mscale": 0.707, "mscale_all_dim": 0.707},
    "rms_norm_eps": 1e-6, "tie_word_embeddings": false, "max_position_embeddings": 256,
    "bos_token_id": 0, "eos_token_id": 1})");
}

// Weights for every expected tensor, stored as BF16 (like real checkpoints), normal(0, 0.2);
// norm weights around 1.
class TinyWeights {
 public:
  explicit TinyWeights(const ModelConfig& c, uint32_t seed = 7) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> nd(0.0f, 0.2f);
    for (const auto& e : expected_tensors(c, LayerRange::all(c))) {
      int64_t n = 1;
      for (auto d : e.shape) n *= d;
      auto& buf = bytes_[e.name];
      buf.resize(size_t(n));
      const bool is_norm = e.shape.size() == 1;
      for (auto& v : buf) v = f32_to_bf16(is_norm ? 1.0f + 0.1f * nd(rng) : nd(rng));
      views_[e.name] = TensorView{.name = e.name, .dtype = DType::BF16, .shape = e.shape,
                                  .data = reinterpret_cast<const uint8_t*>(buf.data()),
                                  .nbytes = size_t(n) * 2, .file = "memory"};
    }
  }
  WeightSource source() const {
    return [this](const std::string& n) -> const TensorView& { return views_.at(n); };
  }

 private:
  std::map<std::string, std::vector<uint16_t>> bytes_;
  std::map<std::string, TensorView> views_;
};

}  // namespace atlas::test_support
