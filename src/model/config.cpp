#include "model/config.h"

#include <cmath>
#include <set>

#include "core/file.h"

namespace atlas {
namespace {

double yarn_get_mscale(double scale, double mscale) {
  if (scale <= 1.0) return 1.0;
  return 0.1 * mscale * std::log(scale) + 1.0;
}

}  // namespace

std::string topk_method_name(TopkMethod m) {
  return m == TopkMethod::Greedy ? "greedy" : "group_limited_greedy";
}

double ModelConfig::softmax_scale() const {
  double s = 1.0 / std::sqrt(double(q_head_dim()));
  if (rope_scaling && rope_scaling->mscale_all_dim != 0.0) {
    double m = yarn_get_mscale(rope_scaling->factor, rope_scaling->mscale_all_dim);
    s *= m * m;
  }
  return s;
}

double ModelConfig::rope_amplitude() const {
  if (!rope_scaling) return 1.0;
  return yarn_get_mscale(rope_scaling->factor, rope_scaling->mscale) /
         yarn_get_mscale(rope_scaling->factor, rope_scaling->mscale_all_dim);
}

ModelConfig ModelConfig::load(const std::string& path) { return from_json(read_json_file(path), path); }

ModelConfig ModelConfig::from_json(const json& j, const std::string& file) {
  if (!j.is_object()) fail(file, {}, "expected a JSON object");
  JsonReader r(j, file);
  ModelConfig c;
  c.model_type = r.get_or<std::string>("model_type", "deepseek_v2");
  if (c.model_type != "deepseek_v2")
    fail(file, "model_type", "unsupported value \"" + c.model_type + "\" (atlas runs deepseek_v2)");

  auto positive = [&](const char* key) {
    int64_t v = r.get<int64_t>(key);
    if (v <= 0) fail(file, key, "must be positive, got " + std::to_string(v));
    return v;
  };
  c.vocab_size = positive("vocab_size");
  c.hidden_size = positive("hidden_size");
  c.num_hidden_layers = positive("num_hidden_layers");
  c.num_attention_heads = positive("num_attention_heads");
  c.q_lora_rank = r.get_optional<int64_t>("q_lora_rank");
  if (c.q_lora_rank && *c.q_lora_rank <= 0) fail(file, "q_lora_rank", "must be null or positive");
  c.kv_lora_rank = positive("kv_lora_rank");
  c.qk_nope_head_dim = positive("qk_nope_head_dim");
  c.qk_rope_head_dim = positive("qk_rope_head_dim");
  if (c.qk_rope_head_dim % 2) fail(file, "qk_rope_head_dim", "must be even (RoPE rotates pairs)");
  c.v_head_dim = positive("v_head_dim");
  c.intermediate_size = positive("intermediate_size");
  c.max_position_embeddings = positive("max_position_embeddings");

  c.n_routed_experts = r.get_or<int64_t>("n_routed_experts", 0);
  if (c.n_routed_experts < 0) fail(file, "n_routed_experts", "must be >= 0");
  if (c.n_routed_experts > 0) {
    c.moe_intermediate_size = positive("moe_intermediate_size");
    c.num_experts_per_tok = positive("num_experts_per_tok");
    if (c.num_experts_per_tok > c.n_routed_experts)
      fail(file, "num_experts_per_tok", "exceeds n_routed_experts");
    c.n_shared_experts = r.get_or<int64_t>("n_shared_experts", 0);
    if (c.n_shared_experts < 0) fail(file, "n_shared_experts", "must be >= 0");
    c.first_k_dense_replace = r.get<int64_t>("first_k_dense_replace");
    if (c.first_k_dense_replace < 0) fail(file, "first_k_dense_replace", "must be >= 0");
    c.moe_layer_freq = positive("moe_layer_freq");
    std::string method = r.get<std::string>("topk_method");
    if (method == "greedy") {
      c.topk_method = TopkMethod::Greedy;
    } else if (method == "group_limited_greedy") {
      c.topk_method = TopkMethod::GroupLimitedGreedy;
    } else {
      fail(file, "topk_method",
           "unsupported value \"" + method + "\" (supported: greedy, group_limited_greedy)");
    }
    c.n_group = r.get_or<int64_t>("n_group", 1);
    c.topk_group = r.get_or<int64_t>("topk_group", 1);
    if (c.topk_method == TopkMethod::GroupLimitedGreedy) {
      if (c.n_group <= 0 || c.n_routed_experts % c.n_group)
        fail(file, "n_group", "must divide n_routed_experts");
      if (c.topk_group <= 0 || c.topk_group > c.n_group) fail(file, "topk_group", "must be in 1..n_group");
      if (c.topk_group * (c.n_routed_experts / c.n_group) < c.num_experts_per_tok)
        fail(file, "topk_group", "selected groups hold fewer experts than num_experts_per_tok");
    }
    c.norm_topk_prob = r.get<bool>("norm_topk_prob");
    c.routed_scaling_factor = r.get<double>("routed_scaling_factor");
    std::string scoring = r.get_or<std::string>("scoring_func", "softmax");
    if (scoring != "softmax") fail(file, "scoring_func", "unsupported value \"" + scoring + "\" (supported: softmax)");
  }
  std::string act = r.get_or<std::string>("hidden_act", "silu");
  if (act != "silu") fail(file, "hidden_act", "unsupported value \"" + act + "\" (supported: silu)");
  if (r.get_or<bool>("attention_bias", false)) fail(file, "attention_bias", "unsupported value true");

  c.rope_theta = r.get<double>("rope_theta");
  if (c.rope_theta <= 0) fail(file, "rope_theta", "must be positive");
  if (r.has_value("rope_scaling")) {
    JsonReader rs = r.child("rope_scaling");
    std::string type = rs.has("type") ? rs.get<std::string>("type") : rs.get<std::string>("rope_type");
    if (type != "yarn")
      fail(file, rs.field(rs.has("type") ? "type" : "rope_type"),
           "unsupported value \"" + type + "\" (supported: yarn, or rope_scaling null)");
    YarnScaling y;
    y.factor = rs.get<double>("factor");
    if (y.factor < 1.0) fail(file, "rope_scaling.factor", "must be >= 1");
    y.original_max_position_embeddings = rs.get<int64_t>("original_max_position_embeddings");
    y.beta_fast = rs.get_or<double>("beta_fast", 32.0);
    y.beta_slow = rs.get_or<double>("beta_slow", 1.0);
    y.mscale = rs.get_or<double>("mscale", 1.0);
    y.mscale_all_dim = rs.get_or<double>("mscale_all_dim", 0.0);
    c.rope_scaling = y;
  }
  c.rms_norm_eps = r.get<double>("rms_norm_eps");
  if (c.rms_norm_eps <= 0) fail(file, "rms_norm_eps", "must be positive");
  c.tie_word_embeddings = r.get_or<bool>("tie_word_embeddings", false);
  c.bos_token_id = r.get_optional<int64_t>("bos_token_id");
  if (r.has_value("eos_token_id")) {
    const json& e = r.raw("eos_token_id");
    // generation configs may list several; config.json has one.
    if (e.is_array()) {
      if (e.empty() || !e[0].is_number_integer()) fail(file, "eos_token_id", "expected an integer or list");
      c.eos_token_id = e[0].get<int64_t>();
    } else {
      c.eos_token_id = r.get<int64_t>("eos_token_id");
    }
  }
  return c;
}

ojson ModelConfig::to_json() const {
  ojson j;
  j["model_type"] = model_type;
  j["vocab_size"] = vocab_size;
  j["hidden_size"] = hidden_size;
  j["num_hidden_layers"] = num_hidden_layers;
  j["num_attention_heads"] = num_attention_heads;
  j["q_lora_rank"] = q_lora_rank ? ojson(*q_lora_rank) : ojson(nullptr);
  j["kv_lora_rank"] = kv_lora_rank;
  j["qk_nope_head_dim"] = qk_nope_head_dim;
  j["qk_rope_head_dim"] = qk_rope_head_dim;
  j["v_head_dim"] = v_head_dim;
  j["intermediate_size"] = intermediate_size;
  j["moe_intermediate_size"] = moe_intermediate_size;
  j["n_routed_experts"] = n_routed_experts;
  j["n_shared_experts"] = n_shared_experts;
  j["num_experts_per_tok"] = num_experts_per_tok;
  j["first_k_dense_replace"] = first_k_dense_replace;
  j["moe_layer_freq"] = moe_layer_freq;
  j["topk_method"] = topk_method_name(topk_method);
  j["n_group"] = n_group;
  j["topk_group"] = topk_group;
  j["norm_topk_prob"] = norm_topk_prob;
  j["routed_scaling_factor"] = routed_scaling_factor;
  j["scoring_func"] = "softmax";
  j["hidden_act"] = "silu";
  j["rope_theta"] = rope_theta;
  if (rope_scaling) {
    j["rope_scaling"] = {{"type", "yarn"},
                         {"factor", rope_scaling->factor},
                         {"original_max_position_embeddings", rope_scaling->original_max_position_embeddings},
                         {"beta_fast", rope_scaling->beta_fast},
                         {"beta_slow", rope_scaling->beta_slow},
                         {"mscale", rope_scaling->mscale},
                         {"mscale_all_dim", rope_scaling->mscale_all_dim}};
  } else {
    j["rope_scaling"] = nullptr;
  }
  j["rms_norm_eps"] = rms_norm_eps;
  j["tie_word_embeddings"] = tie_word_embeddings;
  j["max_position_embeddings"] = max_position_embeddings;
  j["bos_token_id"] = bos_token_id ? ojson(*bos_token_id) : ojson(nullptr);
  j["eos_token_id"] = eos_token_id ? ojson(*eos_token_id) : ojson(nullptr);
  j["attention_bias"] = false;
  return j;
}

LayerRange LayerRange::parse(const std::string& spec, const ModelConfig& c) {
  LayerRange r = all(c);
  if (spec.empty()) return r;
  auto parse_int = [&](const std::string& s) -> int64_t {
    if (s.empty() || s.find_first_not_of("0123456789") != std::string::npos)
      fail("--layers", {}, "expected A-B or A (layer numbers), got \"" + spec + "\"");
    return std::stoll(s);
  };
  auto dash = spec.find('-');
  if (dash == std::string::npos) {
    r.first = 0;
    r.last = parse_int(spec);
  } else {
    r.first = parse_int(spec.substr(0, dash));
    r.last = parse_int(spec.substr(dash + 1));
  }
  if (r.first != 0)
    fail("--layers", {}, "a partial run must start at layer 0 (layer N needs the output of the layers before it)");
  if (r.last < r.first || r.last >= c.num_hidden_layers)
    fail("--layers", {}, "range " + spec + " is outside 0-" + std::to_string(c.num_hidden_layers - 1));
  return r;
}

std::vector<ExpectedTensor> expected_tensors(const ModelConfig& c, const LayerRange& layers) {
  std::vector<ExpectedTensor> out;
  const int64_t H = c.hidden_size, nh = c.num_attention_heads;
  auto add = [&](std::string name, std::vector<int64_t> shape, int64_t layer) {
    out.push_back({std::move(name), std::move(shape), layer});
  };
  add("model.embed_tokens.weight", {c.vocab_size, H}, -1);
  for (int64_t l = layers.first; l <= layers.last; ++l) {
    std::string p = "model.layers." + std::to_string(l) + ".";
    add(p + "input_layernorm.weight", {H}, l);
    add(p + "post_attention_layernorm.weight", {H}, l);
    if (c.q_lora_rank) {
      add(p + "self_attn.q_a_proj.weight", {*c.q_lora_rank, H}, l);
      add(p + "self_attn.q_a_layernorm.weight", {*c.q_lora_rank}, l);
      add(p + "self_attn.q_b_proj.weight", {nh * c.q_head_dim(), *c.q_lora_rank}, l);
    } else {
      add(p + "self_attn.q_proj.weight", {nh * c.q_head_dim(), H}, l);
    }
    add(p + "self_attn.kv_a_proj_with_mqa.weight", {c.kv_lora_rank + c.qk_rope_head_dim, H}, l);
    add(p + "self_attn.kv_a_layernorm.weight", {c.kv_lora_rank}, l);
    add(p + "self_attn.kv_b_proj.weight", {nh * (c.qk_nope_head_dim + c.v_head_dim), c.kv_lora_rank}, l);
    add(p + "self_attn.o_proj.weight", {H, nh * c.v_head_dim}, l);
    if (c.is_moe_layer(l)) {
      const int64_t I = c.moe_intermediate_size;
      add(p + "mlp.gate.weight", {c.n_routed_experts, H}, l);
      for (int64_t e = 0; e < c.n_routed_experts; ++e) {
        std::string q = p + "mlp.experts." + std::to_string(e) + ".";
        add(q + "gate_proj.weight", {I, H}, l);
        add(q + "up_proj.weight", {I, H}, l);
        add(q + "down_proj.weight", {H, I}, l);
      }
      if (c.n_shared_experts > 0) {
        const int64_t S = I * c.n_shared_experts;
        add(p + "mlp.shared_experts.gate_proj.weight", {S, H}, l);
        add(p + "mlp.shared_experts.up_proj.weight", {S, H}, l);
        add(p + "mlp.shared_experts.down_proj.weight", {H, S}, l);
      }
    } else {
      add(p + "mlp.gate_proj.weight", {c.intermediate_size, H}, l);
      add(p + "mlp.up_proj.weight", {c.intermediate_size, H}, l);
      add(p + "mlp.down_proj.weight", {H, c.intermediate_size}, l);
    }
  }
  if (layers.last == c.num_hidden_layers - 1) {
    add("model.norm.weight", {H}, -1);
    if (!c.tie_word_embeddings) add("lm_head.weight", {c.vocab_size, H}, -1);
  }
  return out;
}

}  // namespace atlas
