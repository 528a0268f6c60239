#include "model/hooks.h"

namespace atlas {

bool glob_match(std::string_view p, std::string_view s) {
  // Iterative '*' matcher with backtracking to the last star: linear in practice.
  size_t pi = 0, si = 0, star = std::string_view::npos, mark = 0;
  while (si < s.size()) {
    if (pi < p.size() && p[pi] == '*') {
      star = pi++;
      mark = si;
    } else if (pi < p.size() && p[pi] == s[si]) {
      ++pi;
      ++si;
    } else if (star != std::string_view::npos) {
      pi = star + 1;
      si = ++mark;
    } else {
      return false;
    }
  }
  while (pi < p.size() && p[pi] == '*') ++pi;
  return pi == p.size();
}

void Hooks::add(std::string pattern, Fn fn) { subs_.push_back({std::move(pattern), std::move(fn)}); }

bool Hooks::wants(std::string_view name) const {
  for (const auto& s : subs_)
    if (glob_match(s.pattern, name)) return true;
  return false;
}

void Hooks::fire(HookTensor& t) const {
  for (const auto& s : subs_)
    if (glob_match(s.pattern, t.name)) s.fn(t);
}

LayerHookNames::LayerHookNames(int64_t layer) {
  const std::string p = "blocks." + std::to_string(layer) + ".";
  ln1 = p + "ln1.hook_normalized";
  q = p + "attn.hook_q";
  latent = p + "attn.hook_latent";
  latent_norm = p + "attn.hook_latent_normed";
  pattern = p + "attn.hook_pattern";
  attn_out = p + "attn.hook_out";
  resid_mid = p + "hook_resid_mid";
  ln2 = p + "ln2.hook_normalized";
  router_logits = p + "moe.hook_router_logits";
  topk_ids = p + "moe.hook_topk_ids";
  topk_weights = p + "moe.hook_topk_weights";
  shared_out = p + "moe.hook_shared_out";
  routed_out = p + "moe.hook_routed_out";
  mlp_out = p + "mlp.hook_out";
  resid_post = p + "hook_resid_post";
}

const std::vector<HookInfo>& hook_catalog() {
  static const std::vector<HookInfo> k = {
      {"embed", "[B,T,H]", "F32", "token embeddings (hidden stage 0)"},
      {"blocks.{L}.ln1.hook_normalized", "[B,T,H]", "F32", "input_layernorm output (attention input)"},
      {"blocks.{L}.attn.hook_q", "[B,T,heads,qk_nope+qk_rope]", "F32", "query projection, before RoPE"},
      {"blocks.{L}.attn.hook_latent", "[B,T,kv_lora_rank+qk_rope]", "F32",
       "kv_a_proj_with_mqa output: MLA compressed latent and shared rope key, before norm and RoPE"},
      {"blocks.{L}.attn.hook_latent_normed", "[B,T,kv_lora_rank+qk_rope]", "F32",
       "what the KV cache stores: kv_a_layernorm(latent) and the rotated rope key"},
      {"blocks.{L}.attn.hook_pattern", "[B,heads,T,Tk]", "F32",
       "attention probabilities after softmax (computed only when observed)"},
      {"blocks.{L}.attn.hook_out", "[B,T,H]", "F32", "attention output after o_proj"},
      {"blocks.{L}.hook_resid_mid", "[B,T,H]", "F32", "residual stream after the attention add"},
      {"blocks.{L}.ln2.hook_normalized", "[B,T,H]", "F32", "post_attention_layernorm output (MLP/MoE input)"},
      {"blocks.{L}.moe.hook_router_logits", "[B,T,E]", "F32", "router logits (fp32), MoE layers only"},
      {"blocks.{L}.moe.hook_topk_ids", "[B,T,k]", "I32",
       "selected experts, by weight descending, ties to the lower id; overwriting reroutes"},
      {"blocks.{L}.moe.hook_topk_weights", "[B,T,k]", "F32",
       "combine weights after normalisation/scaling, aligned with topk_ids"},
      {"blocks.{L}.moe.hook_shared_out", "[B,T,H]", "F32", "shared experts' output (if any)"},
      {"blocks.{L}.moe.hook_routed_out", "[B,T,H]", "F32", "weighted sum of the routed experts' outputs"},
      {"blocks.{L}.mlp.hook_out", "[B,T,H]", "F32", "dense MLP or MoE block output"},
      {"blocks.{L}.hook_resid_post", "[B,T,H]", "F32", "residual stream after the layer (hidden stage L+1)"},
      {"final_norm", "[B,T,H]", "F32", "final RMSNorm output (hidden stage L+1 of a full run)"},
      {"logits", "[B,T,V]", "F32", "lm_head output"},
  };
  return k;
}

}  // namespace atlas
