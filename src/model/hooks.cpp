#include "model/hooks.h"

#include <algorithm>
#include <cctype>

#include "core/error.h"
#include "model/digest.h"

namespace atlas {

namespace {

// "blocks.12.attn.hook_q" -> "blocks.{L}.attn.hook_q": the catalog's spelling of a per-layer
// name (or of an exact per-layer pattern); anything else unchanged.
std::string layer_template(std::string_view s) {
  constexpr std::string_view p = "blocks.";
  if (s.substr(0, p.size()) != p) return std::string(s);
  size_t i = p.size();
  while (i < s.size() && std::isdigit(static_cast<unsigned char>(s[i]))) ++i;
  if (i == p.size() || i >= s.size() || s[i] != '.') return std::string(s);
  return std::string(p) + "{L}" + std::string(s.substr(i));
}

bool digestible(const HookInfo& h) { return h.dtype == "F32" && h.shape.rfind("[B,T,", 0) == 0; }

[[noreturn]] void not_digestible(std::string_view hook, const std::string& what) {
  fail("hook " + std::string(hook), {},
       "digests are defined only for [B,T,...] F32 hooks (per-token SHA-256 of the float32 values); " + what);
}

// Before digesting a fired hook: known hooks by their catalog entry, others by what they hold.
void check_digestible(std::string_view name, DType dtype, size_t rank) {
  if (const HookInfo* h = find_hook(name); h && !digestible(*h))
    not_digestible(name, "this one is " + h->dtype + " " + h->shape);
  if (dtype != DType::F32) not_digestible(name, "this one holds " + std::string(dtype_name(dtype)) + " values");
  if (rank < 2) not_digestible(name, "this one has rank " + std::to_string(rank));
}

}  // namespace

const HookInfo* find_hook(std::string_view name) {
  const std::string t = layer_template(name);
  for (const auto& h : hook_catalog())
    if (h.name == t) return &h;
  return nullptr;
}

std::span<const uint8_t> HookDigests::row(int64_t b, int64_t a, int64_t e) const {
  if (b < 0 || b >= rows || a < 0 || a > e || e > tokens)
    fail("hook " + std::string(name), "digests",
         "row " + std::to_string(b) + " tokens [" + std::to_string(a) + ", " + std::to_string(e) +
             ") outside [" + std::to_string(rows) + ", " + std::to_string(tokens) + "]");
  return {sha256 + (b * tokens + a) * kTokenDigestBytes, size_t((e - a) * kTokenDigestBytes)};
}

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

void Hooks::add(std::string pattern, Fn fn) { add(std::move(pattern), std::move(fn), nullptr); }

void Hooks::add(std::string pattern, Fn fn, std::shared_ptr<const HookRowEdit> edit) {
  tensor_subs_.push_back({std::move(pattern), std::move(fn)});
  tensor_edits_.push_back(std::move(edit));
}

void apply_row_edit(const HookRowEdit& e, std::span<const int64_t> rows, std::span<const float> add, HookTensor& t) {
  const int64_t W = t.numel() / std::max<int64_t>(t.shape.at(0) * t.shape.at(1), 1);
  for (size_t i = 0; i < rows.size(); ++i) {
    float* v = t.f32() + rows[i] * W;
    const float* s = e.op == HookRowEdit::Op::Add ? add.data() + (e.per_row ? i * size_t(W) : 0) : nullptr;
    for (int64_t j = 0; j < W; ++j)
      v[j] = e.op == HookRowEdit::Op::Zero    ? 0.0f
             : e.op == HookRowEdit::Op::Scale ? float(double(v[j]) * e.factor)
                                              : float(double(v[j]) + e.factor * double(s[j]));
  }
}

std::vector<const HookRowEdit*> Hooks::row_edits(std::string_view name) const {
  std::vector<const HookRowEdit*> out;
  for (size_t i = 0; i < tensor_subs_.size(); ++i) {
    if (!glob_match(tensor_subs_[i].pattern, name)) continue;
    if (!tensor_edits_[i]) return {};
    out.push_back(tensor_edits_[i].get());
  }
  return out;
}

void Hooks::add_digests(std::string pattern, DigestFn fn) {
  // Checked against the catalog now, so a bad subscription fails before any forward pass. An
  // exact per-layer pattern ("blocks.3.moe.hook_topk_ids") is compared in the catalog's spelling.
  const std::string templ = layer_template(pattern);
  for (const auto& h : hook_catalog())
    if ((glob_match(pattern, h.name) || glob_match(templ, h.name)) && !digestible(h))
      not_digestible(h.name, "pattern '" + pattern + "' matches it, and it is " + h.dtype + " " + h.shape);
  digest_subs_.push_back({std::move(pattern), std::move(fn)});
}

bool Hooks::wants_tensor(std::string_view name) const { return any_matches(tensor_subs_, name); }

void Hooks::add_reader(std::string pattern, ReadFn fn) { reader_subs_.push_back({std::move(pattern), std::move(fn)}); }

bool Hooks::wants_reader(std::string_view name) const { return any_matches(reader_subs_, name); }

bool Hooks::wants_digests(std::string_view name) const { return any_matches(digest_subs_, name); }

void Hooks::fire(HookTensor& t) const {
  fire_tensor(t);
  fire_read(t);
}

void Hooks::fire_tensor(HookTensor& t) const {
  for (const auto& s : tensor_subs_)
    if (glob_match(s.pattern, t.name)) s.fn(t);
}

void Hooks::fire_read(const HookTensor& t) const {
  for (const auto& s : reader_subs_)
    if (glob_match(s.pattern, t.name)) s.fn(t);
  if (!wants_digests(t.name)) return;
  check_digestible(t.name, t.dtype, t.shape.size());
  // [B, T, ...]: every value after the first two dimensions belongs to the token.
  const int64_t B = t.shape[0], T = t.shape[1], M = B * T;
  const int64_t width = M > 0 ? t.numel() / M : 0;
  const std::vector<uint8_t> d = token_digests(t.f32(), M, width);
  fire_digests({.name = t.name, .layer = t.layer, .rows = B, .tokens = T, .sha256 = d.data()});
}

void Hooks::fire_digests(const HookDigests& d) const {
  check_digestible(d.name, DType::F32, 2);
  for (const auto& s : digest_subs_)
    if (glob_match(s.pattern, d.name)) s.fn(d);
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
