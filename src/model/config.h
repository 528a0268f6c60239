// DeepSeek-V2-family configuration (config.json), validated on load.
//
// Every field the forward pass reads is here. Values atlas does not implement
// (scoring_func "sigmoid", topk_method "noaux_tc", hidden_act other than silu, ...) are a
// clear error naming the field, never a silent fallback. No defaults are borrowed from
// configuration_deepseek.py: those differ from the released checkpoints (q_lora_rank 1536,
// topk_method "gready", ...), so a field the model needs must be in the file.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "core/json.h"

namespace atlas {

enum class TopkMethod { Greedy, GroupLimitedGreedy };

struct YarnScaling {
  double factor = 1.0;
  int64_t original_max_position_embeddings = 4096;
  double beta_fast = 32.0;
  double beta_slow = 1.0;
  double mscale = 1.0;
  double mscale_all_dim = 0.0;
};

struct ModelConfig {
  std::string model_type;  // "deepseek_v2"
  int64_t vocab_size = 0;
  int64_t hidden_size = 0;
  int64_t num_hidden_layers = 0;
  int64_t num_attention_heads = 0;
  std::optional<int64_t> q_lora_rank;  // null -> plain q_proj
  int64_t kv_lora_rank = 0;
  int64_t qk_nope_head_dim = 0;
  int64_t qk_rope_head_dim = 0;
  int64_t v_head_dim = 0;
  int64_t intermediate_size = 0;      // dense MLP width
  int64_t moe_intermediate_size = 0;  // per routed expert
  int64_t n_routed_experts = 0;       // 0 -> no MoE layers at all
  int64_t n_shared_experts = 0;
  int64_t num_experts_per_tok = 0;
  int64_t first_k_dense_replace = 0;
  int64_t moe_layer_freq = 1;
  TopkMethod topk_method = TopkMethod::Greedy;
  int64_t n_group = 1;
  int64_t topk_group = 1;
  bool norm_topk_prob = false;
  double routed_scaling_factor = 1.0;
  double rope_theta = 10000.0;
  std::optional<YarnScaling> rope_scaling;  // only "yarn" is supported
  double rms_norm_eps = 1e-6;
  bool tie_word_embeddings = false;
  int64_t max_position_embeddings = 0;
  std::optional<int64_t> bos_token_id;
  std::optional<int64_t> eos_token_id;

  // Derived.
  int64_t q_head_dim() const { return qk_nope_head_dim + qk_rope_head_dim; }
  int64_t latent_dim() const { return kv_lora_rank + qk_rope_head_dim; }  // MLA cache width (576)
  bool is_moe_layer(int64_t layer) const {
    return n_routed_experts > 0 && layer >= first_k_dense_replace && layer % moe_layer_freq == 0;
  }
  // Softmax scale: q_head_dim^-1/2, times mscale(factor, mscale_all_dim)^2 under YaRN.
  double softmax_scale() const;
  // Amplitude of the YaRN cos/sin tables: mscale(factor, mscale) / mscale(factor, mscale_all_dim).
  double rope_amplitude() const;

  static ModelConfig from_json(const json& j, const std::string& file);
  static ModelConfig load(const std::string& path);
  ojson to_json() const;  // canonical form (what atlas understood), for artifacts
};

std::string topk_method_name(TopkMethod m);

// An inclusive range of decoder layers to load and run ("--layers 0-6").
struct LayerRange {
  int64_t first = 0;
  int64_t last = -1;  // inclusive
  int64_t count() const { return last - first + 1; }
  bool contains(int64_t l) const { return l >= first && l <= last; }
  bool is_full(const ModelConfig& c) const { return first == 0 && last == c.num_hidden_layers - 1; }
  static LayerRange all(const ModelConfig& c) { return {0, c.num_hidden_layers - 1}; }
  // "A-B", "A" or "" (all). Partial runs start at layer 0: a later layer needs the ones before it.
  static LayerRange parse(const std::string& spec, const ModelConfig& c);
};

// One tensor the config implies: its checkpoint name, shape, and what it is for.
struct ExpectedTensor {
  std::string name;
  std::vector<int64_t> shape;
  int64_t layer = -1;  // -1: global (embedding, final norm, lm_head)
};

// Every tensor a checkpoint with this config must hold, in a fixed order. With a partial
// layer range, only those layers' tensors plus the embedding (and, when the range reaches
// the last layer, the final norm and lm_head).
std::vector<ExpectedTensor> expected_tensors(const ModelConfig& c, const LayerRange& layers);

}  // namespace atlas
