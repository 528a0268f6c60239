#include "model/presets.h"

#include "core/error.h"

namespace atlas {
namespace {

// DeepSeek-V2-Lite's released config.json, value for value (int stays int, float stays
// float), so a `lite` directory is indistinguishable from the real one but for the weights.
json lite_config() {
  return json{
      {"architectures", {"DeepseekV2ForCausalLM"}},
      {"attention_bias", false},
      {"attention_dropout", 0.0},
      {"auto_map",
       {{"AutoConfig", "configuration_deepseek.DeepseekV2Config"},
        {"AutoModel", "modeling_deepseek.DeepseekV2Model"},
        {"AutoModelForCausalLM", "modeling_deepseek.DeepseekV2ForCausalLM"}}},
      {"aux_loss_alpha", 0.001},
      {"bos_token_id", 100000},
      {"eos_token_id", 100001},
      {"first_k_dense_replace", 1},
      {"hidden_act", "silu"},
      {"hidden_size", 2048},
      {"initializer_range", 0.02},
      {"intermediate_size", 10944},
      {"kv_lora_rank", 512},
      {"max_position_embeddings", 163840},
      {"model_type", "deepseek_v2"},
      {"moe_intermediate_size", 1408},
      {"moe_layer_freq", 1},
      {"n_group", 1},
      {"n_routed_experts", 64},
      {"n_shared_experts", 2},
      {"norm_topk_prob", false},
      {"num_attention_heads", 16},
      {"num_experts_per_tok", 6},
      {"num_hidden_layers", 27},
      {"num_key_value_heads", 16},
      {"pretraining_tp", 1},
      {"q_lora_rank", nullptr},
      {"qk_nope_head_dim", 128},
      {"qk_rope_head_dim", 64},
      {"rms_norm_eps", 1e-06},
      {"rope_scaling",
       {{"beta_fast", 32},
        {"beta_slow", 1},
        {"factor", 40},
        {"mscale", 0.707},
        {"mscale_all_dim", 0.707},
        {"original_max_position_embeddings", 4096},
        {"type", "yarn"}}},
      {"rope_theta", 10000},
      {"routed_scaling_factor", 1.0},
      {"scoring_func", "softmax"},
      {"seq_aux", true},
      {"tie_word_embeddings", false},
      {"topk_group", 1},
      {"topk_method", "greedy"},
      {"torch_dtype", "bfloat16"},
      {"transformers_version", "4.33.1"},
      {"use_cache", true},
      {"v_head_dim", 128},
      {"vocab_size", 102400},
  };
}

// Small enough to generate in milliseconds (~0.8 MB in bf16), big enough that
// every code path runs: a dense first layer then MoE layers with shared experts, top-3 of 8
// routing, MLA without q LoRA, YaRN with positions past original_max_position_embeddings (64).
json tiny_config() {
  return json{
      {"architectures", {"DeepseekV2ForCausalLM"}},
      {"attention_bias", false},
      {"bos_token_id", 1000},
      {"eos_token_id", 1001},
      {"first_k_dense_replace", 1},
      {"hidden_act", "silu"},
      {"hidden_size", 64},
      {"intermediate_size", 128},
      {"kv_lora_rank", 32},
      {"max_position_embeddings", 1024},
      {"model_type", "deepseek_v2"},
      {"moe_intermediate_size", 32},
      {"moe_layer_freq", 1},
      {"n_group", 1},
      {"n_routed_experts", 8},
      {"n_shared_experts", 2},
      {"norm_topk_prob", false},
      {"num_attention_heads", 4},
      {"num_experts_per_tok", 3},
      {"num_hidden_layers", 4},
      {"num_key_value_heads", 4},
      {"q_lora_rank", nullptr},
      {"qk_nope_head_dim", 16},
      {"qk_rope_head_dim", 8},
      {"rms_norm_eps", 1e-06},
      {"rope_scaling",
       {{"beta_fast", 32},
        {"beta_slow", 1},
        {"factor", 4},
        {"mscale", 0.707},
        {"mscale_all_dim", 0.707},
        {"original_max_position_embeddings", 64},
        {"type", "yarn"}}},
      {"rope_theta", 10000},
      {"routed_scaling_factor", 1.0},
      {"scoring_func", "softmax"},
      {"tie_word_embeddings", false},
      {"topk_group", 1},
      {"topk_method", "greedy"},
      {"torch_dtype", "bfloat16"},
      {"v_head_dim", 16},
      {"vocab_size", 1024},
  };
}

}  // namespace

std::vector<std::string> preset_names() { return {"lite", "tiny"}; }

std::string torch_dtype_name(DType t) {
  switch (t) {
    case DType::BF16: return "bfloat16";
    case DType::F16: return "float16";
    case DType::F32: return "float32";
    default: fail("--dtype", {}, "unsupported " + std::string(dtype_name(t)) + " (supported: bf16, f16, f32)");
  }
}

Preset make_preset(const std::string& name, DType dtype) {
  Preset p;
  p.name = name;
  if (name == "tiny") {
    p.config = tiny_config();
  } else if (name == "lite") {
    p.config = lite_config();
    p.max_shard_bytes = uint64_t(8) << 30;
  } else {
    fail("--preset", {}, "unknown preset \"" + name + "\" (known: lite, tiny)");
  }
  p.config["torch_dtype"] = torch_dtype_name(dtype);
  return p;
}

}  // namespace atlas
