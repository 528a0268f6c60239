#include "model/intervene.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstring>
#include <limits>
#include <optional>
#include <tuple>

#include "core/error.h"
#include "core/file.h"
#include "core/sha256.h"
#include "io/safetensors.h"

namespace atlas {

namespace {

constexpr std::string_view kExperts = ".moe.experts.";

bool parse_int(std::string_view s, int64_t& out) {
  if (s.empty()) return false;
  const auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), out);
  return ec == std::errc() && p == s.data() + s.size();
}

// "blocks.12.attn.hook_q" -> 12; -1 for global hooks.
int64_t layer_of(std::string_view name) {
  constexpr std::string_view p = "blocks.";
  if (name.substr(0, p.size()) != p) return -1;
  const size_t dot = name.find('.', p.size());
  int64_t l = -1;
  if (dot == std::string_view::npos || !parse_int(name.substr(p.size(), dot - p.size()), l)) return -1;
  return l;
}

std::vector<std::string_view> split(std::string_view s, char sep) {
  std::vector<std::string_view> out;
  size_t a = 0;
  for (size_t b; (b = s.find(sep, a)) != std::string_view::npos; a = b + 1) out.push_back(s.substr(a, b - a));
  out.push_back(s.substr(a));
  return out;
}

bool is_moe_hook(std::string_view templ) {
  return templ.find(".moe.") != std::string_view::npos;
}

}  // namespace

std::vector<int64_t> parse_token_list(std::string_view list, const std::string& where) {
  std::vector<int64_t> out;
  for (std::string_view item : split(list, ',')) {
    const size_t dash = item.find('-', 1);
    int64_t a = -1, b = -1;
    const bool ok = dash == std::string_view::npos
                        ? parse_int(item, a) && (b = a, true)
                        : parse_int(item.substr(0, dash), a) && parse_int(item.substr(dash + 1), b);
    if (!ok || a < 0 || b < a)
      fail(where, {}, "token list \"" + std::string(list) + "\": expected N or A-B (A <= B, from 0), comma-separated");
    if (b - a > (int64_t(1) << 24)) fail(where, {}, "token range " + std::string(item) + " is too long");
    for (int64_t t = a; t <= b; ++t) out.push_back(t);
  }
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

std::vector<int64_t> hook_token_shape(std::string_view hook, const ModelConfig& c) {
  const HookInfo* h = find_hook(hook);
  if (!h) fail("hook " + std::string(hook), {}, "unknown hook (atlas hooks lists them)");
  const std::string& t = h->name;
  const auto ends = [&](std::string_view s) { return t.size() >= s.size() && t.compare(t.size() - s.size(), s.size(), s) == 0; };
  if (ends("attn.hook_pattern"))
    fail("hook " + std::string(hook), {}, "is [B,heads,T,Tk], not a per-token [B,T,...] tensor");
  if (ends("attn.hook_q")) return {c.num_attention_heads, c.q_head_dim()};
  if (ends("attn.hook_latent") || ends("attn.hook_latent_normed")) return {c.latent_dim()};
  if (ends("moe.hook_router_logits")) return {c.n_routed_experts};
  if (ends("moe.hook_topk_ids") || ends("moe.hook_topk_weights")) return {c.num_experts_per_tok};
  if (t == "logits") return {c.vocab_size};
  return {c.hidden_size};  // every other hook is [B,T,H] (the catalog says so)
}

std::vector<std::string> fired_hook_names(const ModelConfig& c, const LayerRange& layers) {
  std::vector<std::string> out{"embed"};
  for (int64_t l = layers.first; l <= layers.last; ++l)
    for (const HookInfo& h : hook_catalog()) {
      if (h.name.rfind("blocks.{L}.", 0) != 0) continue;
      if (is_moe_hook(h.name) && !c.is_moe_layer(l)) continue;
      if (h.name.find("hook_shared_out") != std::string::npos && c.n_shared_experts == 0) continue;
      out.push_back("blocks." + std::to_string(l) + h.name.substr(10));
    }
  if (layers.last == c.num_hidden_layers - 1) out.insert(out.end(), {"final_norm", "logits"});
  return out;
}

std::string trace_dump_name(std::string_view hook, const ModelConfig& c) {
  const std::string h(hook);
  if (h == "embed") return "hidden.0";
  if (h == "final_norm") return "hidden." + std::to_string(c.num_hidden_layers + 1);
  if (h == "logits") return "logits";
  const int64_t l = layer_of(h);
  if (l < 0) return "";
  const std::string p = "blocks." + std::to_string(l) + ".";
  if (h == p + "hook_resid_post") return "hidden." + std::to_string(l + 1);
  if (h == p + "attn.hook_latent") return "mla." + std::to_string(l) + ".latent";
  for (const char* r : {"logits", "topk_ids", "topk_weights"}) {
    const std::string suffix = std::string(r) == "logits" ? "router_logits" : r;
    if (h == p + "moe.hook_" + suffix) return "router." + std::to_string(l) + "." + r;
  }
  return "";
}

std::pair<std::string, std::string> split_add_payload(std::string_view payload) {
  const size_t star = payload.rfind('*');
  if (star == std::string_view::npos) return {std::string(payload), ""};
  return {std::string(payload.substr(0, star)), std::string(payload.substr(star + 1))};
}

namespace {

// A factor (scale:F, add:FILE*F): a finite number and nothing else, or nullopt.
std::optional<double> parse_factor(const std::string& f) {
  char* end = nullptr;
  const double v = std::strtod(f.c_str(), &end);
  if (f.empty() || end != f.c_str() + f.size() || !std::isfinite(v)) return std::nullopt;
  return v;
}

// Whether the edit reads a source file's rows by token position (patch, add of [T', ...]).
bool reads_rows_by_position(const Intervention& iv) { return iv.source && iv.source_per_position; }

// The source tensor of patch:FILE / add:FILE: named as the hook, else as `atlas trace --dump`
// names it; [T', per-token shape] (a value per position), or for add also the per-token shape
// alone (one vector for every token); F32 (I32 for expert ids), finite, ids in range.
void open_source(Intervention& iv, const ModelConfig& cfg, bool ids, bool vector_ok) {
  const std::string& hook = iv.hook;
  iv.source = SafetensorsFile::open(iv.source_path);
  const std::string dump = trace_dump_name(hook, cfg);
  const TensorView* tv = iv.source->find(hook);
  if (!tv && !dump.empty()) tv = iv.source->find(dump);
  if (!tv)
    fail(iv.source_path, {},
         "no tensor \"" + hook + "\"" + (dump.empty() ? "" : " or \"" + dump + "\"") + " to " +
             (iv.action == InterventionAction::Add ? "add to " : "patch ") + hook + (iv.action == InterventionAction::Add ? "" : " from"));
  iv.source_tensor = tv->name;
  const std::vector<int64_t> per = hook_token_shape(hook, cfg);
  std::vector<int64_t> want{-1};
  want.insert(want.end(), per.begin(), per.end());
  const auto matches = [&](const std::vector<int64_t>& w) {
    if (tv->shape.size() != w.size()) return false;
    for (size_t i = 0; i < w.size(); ++i)
      if (w[i] >= 0 && tv->shape[i] != w[i]) return false;
    return true;
  };
  iv.source_per_position = matches(want);
  const auto show = [](const std::vector<int64_t>& s) {
    std::string r = "[";
    for (size_t i = 0; i < s.size(); ++i) {
      if (i) r += ',';
      r += s[i] < 0 ? std::string("T") : std::to_string(s[i]);
    }
    r += ']';
    return r;
  };
  if (!iv.source_per_position && !(vector_ok && matches(per)))
    fail(iv.source_path, iv.source_tensor,
         "shape " + show(tv->shape) + ", expected " + show(want) + (vector_ok ? " or " + show(per) : "") + " for " + hook);
  const DType need = ids ? DType::I32 : DType::F32;
  if (tv->dtype != need)
    fail(iv.source_path, iv.source_tensor,
         "dtype " + std::string(dtype_name(tv->dtype)) + ", expected " + std::string(dtype_name(need)) + " for " + hook);
  if (!ids) {
    const float* v = reinterpret_cast<const float*>(tv->data);
    for (int64_t i = 0; i < tv->numel(); ++i)
      if (!std::isfinite(v[i])) fail(iv.source_path, iv.source_tensor, "holds a non-finite value at element " + std::to_string(i));
  } else {
    const int32_t* v = reinterpret_cast<const int32_t*>(tv->data);
    for (int64_t i = 0; i < tv->numel(); ++i)
      if (v[i] < 0 || v[i] >= cfg.n_routed_experts)
        fail(iv.source_path, iv.source_tensor, "expert id " + std::to_string(v[i]) + " at element " + std::to_string(i) +
                                                   " (valid: 0-" + std::to_string(cfg.n_routed_experts - 1) + ")");
  }
  iv.source_sha256 = sha256_file(iv.source_path);
}

}  // namespace

Interventions::Interventions(const std::vector<std::string>& specs, const ModelConfig& cfg, const LayerRange& layers,
                             bool has_head, bool in_protocol, const std::string& files_base)
{
  const auto resolved = [&](const std::string& path) { return files_base.empty() ? path : path_from(files_base, path); };
  for (const std::string& spec : specs) {
    const std::string where = "--intervene '" + spec + "'";
    const auto bad = [&](const std::string& what) -> void { fail(where, {}, what); };
    Intervention iv{.spec = spec};
    const size_t eq = spec.find('=');
    if (eq == std::string::npos) bad("expected TARGET[@TOKENS]=ACTION");
    std::string_view target = std::string_view(spec).substr(0, eq);
    const std::string_view action = std::string_view(spec).substr(eq + 1);
    if (const size_t at = target.find('@'); at != std::string_view::npos) {
      iv.tokens = parse_token_list(target.substr(at + 1), where);
      target = target.substr(0, at);
    }
    const std::string tname(target);
    iv.layer = layer_of(tname);
    if (iv.layer >= 0 && !layers.contains(iv.layer))
      bad("layer " + std::to_string(iv.layer) + " is not run (layers " + std::to_string(layers.first) + "-" +
          std::to_string(layers.last) + ")");

    if (const size_t ex = tname.find(kExperts); iv.layer >= 0 && ex != std::string::npos) {
      // Routed experts of one MoE layer.
      if (tname.substr(0, ex) != "blocks." + std::to_string(iv.layer)) bad("expected blocks.L.moe.experts.E[,E...]");
      if (!cfg.is_moe_layer(iv.layer)) bad("layer " + std::to_string(iv.layer) + " is dense: it has no routed experts");
      for (std::string_view e : split(std::string_view(tname).substr(ex + kExperts.size()), ',')) {
        int64_t v = -1;
        if (!parse_int(e, v) || v < 0 || v >= cfg.n_routed_experts)
          bad("expert \"" + std::string(e) + "\": expected an expert id 0-" + std::to_string(cfg.n_routed_experts - 1));
        iv.experts.push_back(int32_t(v));
      }
      std::sort(iv.experts.begin(), iv.experts.end());
      iv.experts.erase(std::unique(iv.experts.begin(), iv.experts.end()), iv.experts.end());
      const LayerHookNames n(iv.layer);
      if (action == "zero") {
        iv.action = InterventionAction::ExpertsZero;
        iv.hook = n.topk_weights;
      } else if (action == "route-out") {
        iv.action = InterventionAction::ExpertsRouteOut;
        iv.hook = n.router_logits;
        // The top-k must still find k experts with a non-zero score in whichever groups it keeps
        // (group-limited greedy: the topk_group best groups; a group of routed-out experts only
        // scores 0): the fewest the kept groups can hold is the sum of the smallest counts.
        const bool grouped = cfg.topk_method == TopkMethod::GroupLimitedGreedy;
        const int64_t G = grouped ? cfg.n_group : 1, kept = grouped ? cfg.topk_group : 1, per = cfg.n_routed_experts / G;
        std::vector<int64_t> left(static_cast<size_t>(G), per);
        for (int32_t e : iv.experts) --left[size_t(e / per)];
        std::erase(left, 0);
        std::sort(left.begin(), left.end());
        int64_t fewest = 0;
        for (int64_t g = 0; g < kept && g < int64_t(left.size()); ++g) fewest += left[size_t(g)];
        if (int64_t(left.size()) < kept || fewest < cfg.num_experts_per_tok)
          bad("routing out " + std::to_string(iv.experts.size()) + " of " + std::to_string(cfg.n_routed_experts) +
              " experts can leave fewer than k = " + std::to_string(cfg.num_experts_per_tok) +
              " to choose from" + (grouped ? " in the kept groups" : ""));
      } else {
        bad("unknown action \"" + std::string(action) + "\" for experts (expected zero or route-out)");
      }
      list_.push_back(std::move(iv));
      continue;
    }

    // A hook.
    const HookInfo* info = find_hook(tname);
    if (!info) bad("unknown hook \"" + tname + "\" (atlas hooks lists them; routed experts: blocks.L.moe.experts.E)");
    if (tname.find("{L}") != std::string::npos || (info->name.rfind("blocks.", 0) == 0 && iv.layer < 0))
      bad("name a concrete layer: blocks.3" + info->name.substr(10) + ", not " + info->name);
    if (info->name.find("attn.hook_pattern") != std::string::npos)
      bad("attn.hook_pattern is read-only (the attention has already used its weights)");
    if (is_moe_hook(info->name) && !cfg.is_moe_layer(iv.layer))
      bad("layer " + std::to_string(iv.layer) + " is dense: " + info->name.substr(info->name.find(".moe.") + 1) +
          " does not fire there");
    if (info->name.find("hook_shared_out") != std::string::npos && cfg.n_shared_experts == 0)
      bad("the model has no shared experts");
    if ((tname == "final_norm" || tname == "logits") && !has_head)
      bad(tname + " fires only when the run reaches the last layer");
    iv.hook = tname;
    const bool ids = info->dtype == "I32";
    if (action == "zero") {
      iv.action = InterventionAction::Zero;
    } else if (action.rfind("scale:", 0) == 0) {
      iv.action = InterventionAction::Scale;
      const std::string f(action.substr(6));
      const auto v = parse_factor(f);
      if (!v) bad("scale factor \"" + f + "\" is not a finite number");
      iv.factor = *v;
    } else if (action.rfind("patch:@", 0) == 0) {
      iv.action = InterventionAction::PatchRow;
      iv.source_condition = std::string(action.substr(7));
      if (!in_protocol) bad("patch:@CONDITION reads a sibling cell's row: probe protocols only (give a file)");
      if (iv.source_condition.empty()) bad("patch:@ needs a condition name");
    } else if (action.rfind("patch:", 0) == 0) {
      iv.action = InterventionAction::Patch;
      iv.source_path = std::string(action.substr(6));
      if (iv.source_path.empty()) bad("patch: needs a safetensors file");
      iv.source_path = resolved(iv.source_path);
      open_source(iv, cfg, ids, false);
    } else if (action.rfind("add:", 0) == 0) {
      // add:FILE or add:FILE*F: a steering vector (or per-position rows) times F.
      iv.action = InterventionAction::Add;
      std::string f;
      std::tie(iv.source_path, f) = split_add_payload(action.substr(4));
      if (action.find('*') != std::string_view::npos) {
        const auto v = parse_factor(f);
        if (!v) bad("add: factor \"" + f + "\" is not a finite number (add:FILE*F)");
        iv.factor = *v;
      }
      if (iv.source_path.empty()) bad("add: needs a safetensors file");
      iv.source_path = resolved(iv.source_path);
      if (ids) bad(tname + " holds expert ids: nothing can be added to them");
      open_source(iv, cfg, ids, true);
    } else {
      bad("unknown action \"" + std::string(action) + "\" (expected zero, scale:F, patch:FILE or add:FILE[*F])");
    }
    if (ids && iv.action != InterventionAction::Patch && iv.action != InterventionAction::PatchRow)
      bad(tname + " holds expert ids: only patch:FILE applies (blocks.L.moe.experts.E=zero|route-out edit experts)");
    list_.push_back(std::move(iv));
  }
}

void Interventions::check_tokens(int64_t T, const std::string& where) const {
  for (const Intervention& iv : list_) {
    if (!iv.tokens.empty() && iv.tokens.back() >= T)
      fail(where, {}, "--intervene '" + iv.spec + "': token " + std::to_string(iv.tokens.back()) + " is outside the " +
                          std::to_string(T) + " tokens");
    if (!reads_rows_by_position(iv)) continue;
    const int64_t Ts = iv.source->find(iv.source_tensor)->shape[0];
    if (iv.tokens.empty() ? Ts != T : Ts <= iv.tokens.back())
      fail(where, {},
           "--intervene '" + iv.spec + "': " + iv.source_path + " " + iv.source_tensor + " holds " + std::to_string(Ts) +
               " tokens; " + (iv.tokens.empty() ? std::string(iv.action == InterventionAction::Patch ? "patching" : "adding to") +
                                                      " every token needs exactly " + std::to_string(T)
                                                : "token " + std::to_string(iv.tokens.back()) + " is not among them"));
  }
}

void Interventions::check_for_generation() const {
  for (const Intervention& iv : list_) {
    const std::string where = "--intervene '" + iv.spec + "'";
    if (iv.hook == "logits") fail(where, {}, "generation cannot edit logits (edit final_norm instead)");
    // A sibling row stops at its own EOS: name the (prompt) tokens to read.
    if (iv.action == InterventionAction::PatchRow && iv.tokens.empty())
      fail(where, {}, "a patch from a sibling in generation names its tokens (@TOKENS: the sibling may stop first)");
    if (!reads_rows_by_position(iv)) continue;
    if (iv.tokens.empty())
      fail(where, {}, std::string(iv.action == InterventionAction::Patch ? "a patch" : "an add of rows by position") +
                          " in generation names its tokens (@TOKENS: positions in the source)");
    const int64_t Ts = iv.source->find(iv.source_tensor)->shape[0];
    if (iv.tokens.back() >= Ts)
      fail(where, {}, iv.source_path + " " + iv.source_tensor + " holds " + std::to_string(Ts) + " tokens; token " +
                          std::to_string(iv.tokens.back()) + " is not among them");
  }
}

void Interventions::begin_pass(const ForwardInput& in, std::span<const uint8_t> rows) {
  pass_B_ = in.batch;
  pass_T_ = in.tokens;
  pass_pos_.assign(in.positions.begin(), in.positions.end());
  pass_mask_.assign(in.mask.begin(), in.mask.end());
  if (int64_t(pass_pos_.size()) != pass_B_ * pass_T_ || int64_t(pass_mask_.size()) != pass_B_ * pass_T_)
    fail("interventions: a forward pass's positions or mask is not [B, T]");
  if (!rows.empty() && int64_t(rows.size()) != pass_B_) fail("interventions: the rows to edit are not [B]");
  pass_rows_.assign(rows.begin(), rows.end());
  if (pass_rows_.empty()) pass_rows_.assign(size_t(pass_B_), 1);
  fired_.assign(list_.size(), 0);
}

void Interventions::attach(Hooks& hooks) {
  fired_.assign(list_.size(), 0);
  // Calls fn(row offset into the hook's [B, T', W] values, position) for every real token the
  // edit names. T' is the pass's T, or 1 for a hook of the last tokens only (logits).
  const auto for_tokens = [this](const Intervention& iv, const HookTensor& t, auto&& fn) {
    if (t.shape.size() < 3) fail("hook " + iv.hook, {}, "not a [B,T,...] tensor");
    const int64_t B = t.shape[0], T = t.shape[1], W = t.numel() / std::max<int64_t>(B * T, 1);
    if (B != pass_B_ || (T != pass_T_ && T != 1))
      fail("hook " + iv.hook, {}, "fired with [" + std::to_string(B) + ", " + std::to_string(T) + "] tokens in a pass of [" +
                                      std::to_string(pass_B_) + ", " + std::to_string(pass_T_) + "] (begin_pass)");
    for (int64_t b = 0; b < B; ++b)
      for (int64_t s = 0; s < T && pass_rows_[size_t(b)]; ++s) {
        const int64_t at = b * pass_T_ + (T == pass_T_ ? s : pass_T_ - 1);
        if (!pass_mask_[size_t(at)]) continue;
        const int64_t position = pass_pos_[size_t(at)];
        if (!iv.tokens.empty() && !std::binary_search(iv.tokens.begin(), iv.tokens.end(), position)) continue;
        fn((b * T + s) * W, position, W);
      }
  };
  // Experts' zero edits need the routes the weights belong to: a read of the final ids (after
  // every edit of them), kept per edit and used when the weights fire.
  auto routes = std::make_shared<std::vector<std::vector<int32_t>>>(list_.size());
  // The source row a token reads (patch, add): the one at its position, or an add's one vector.
  const auto source_row = [](const Intervention& iv, int64_t position, int64_t W) {
    const TensorView* src = iv.source->find(iv.source_tensor);
    if (iv.source_per_position && position >= src->shape[0])
      fail("--intervene '" + iv.spec + "'", {},
           "position " + std::to_string(position) + " is past the " + std::to_string(src->shape[0]) +
               " tokens of " + iv.source_path + " " + iv.source_tensor);
    return src->data + (iv.source_per_position ? position * W * 4 : 0);  // F32, maybe unaligned
  };
  for (size_t i = 0; i < list_.size(); ++i) {
    const Intervention* iv = &list_[i];
    // Zero, scale and add are row edits (HookRowEdit): the observer lists the rows and applies
    // apply_row_edit, and a backend may run the same edit where the values live instead (the
    // CUDA backend, on the device).
    if (iv->action == InterventionAction::Zero || iv->action == InterventionAction::Scale ||
        iv->action == InterventionAction::Add) {
      auto edit = std::make_shared<HookRowEdit>();
      edit->op = iv->action == InterventionAction::Zero    ? HookRowEdit::Op::Zero
                 : iv->action == InterventionAction::Scale ? HookRowEdit::Op::Scale
                                                           : HookRowEdit::Op::Add;
      edit->factor = iv->factor;
      edit->per_row = iv->action == InterventionAction::Add && iv->source_per_position;
      edit->select = [this, iv, i, for_tokens, source_row](const std::vector<int64_t>& shape, std::vector<int64_t>& rows,
                                                           std::vector<float>& add) {
        ++fired_[i];
        rows.clear();
        add.clear();
        const HookTensor t{.name = iv->hook, .layer = iv->layer, .shape = shape};
        for_tokens(*iv, t, [&](int64_t o, int64_t position, int64_t W) {
          rows.push_back(o / W);
          if (iv->action != InterventionAction::Add || (!iv->source_per_position && !add.empty())) return;
          const uint8_t* row = source_row(*iv, position, W);  // (a mapped tensor need not be 4-byte aligned)
          add.resize(add.size() + size_t(W));
          std::memcpy(add.data() + add.size() - size_t(W), row, size_t(W) * 4);
        });
      };
      hooks.add(iv->hook, [edit](HookTensor& t) {
        std::vector<int64_t> rows;
        std::vector<float> add;
        edit->select(t.shape, rows, add);  // (counts the firing)
        apply_row_edit(*edit, rows, add, t);
      }, edit);
      continue;
    }
    hooks.add(iv->hook, [this, iv, routes, i, for_tokens, source_row](HookTensor& t) {
      ++fired_[i];
      switch (iv->action) {
        case InterventionAction::Patch:
          // Source row = the token's position (checked against the source's length before).
          for_tokens(*iv, t, [&](int64_t o, int64_t position, int64_t W) {
            std::memcpy(static_cast<uint8_t*>(t.data) + o * 4, source_row(*iv, position, W), size_t(W) * 4);  // F32 or I32
          });
          break;
        case InterventionAction::PatchRow: {
          // The sibling row's token at each position, as the values stand now.
          const int64_t B = t.shape[0], T = t.shape[1], W = t.numel() / std::max<int64_t>(B * T, 1);
          const auto sib = siblings_.find(iv->source_condition);
          if (sib == siblings_.end() || sib->second < 0 || sib->second >= B)
            fail("--intervene '" + iv->spec + "'", {}, "no row of condition " + iv->source_condition + " in this batch");
          std::map<int64_t, int64_t> at_position;  // the sibling's position -> its token index in the hook
          for (int64_t s = 0; s < T; ++s) {
            const int64_t at = sib->second * pass_T_ + (T == pass_T_ ? s : pass_T_ - 1);
            if (pass_mask_[size_t(at)]) at_position[pass_pos_[size_t(at)]] = s;
          }
          for_tokens(*iv, t, [&](int64_t o, int64_t position, int64_t w) {
            const auto src = at_position.find(position);
            if (src == at_position.end())
              fail("--intervene '" + iv->spec + "'", {},
                   "the row of condition " + iv->source_condition + " has no token at position " + std::to_string(position));
            std::memmove(static_cast<uint8_t*>(t.data) + o * 4,
                         static_cast<const uint8_t*>(t.data) + (sib->second * T + src->second) * W * 4, size_t(w) * 4);
          });
          break;
        }
        case InterventionAction::ExpertsRouteOut:
          for_tokens(*iv, t, [&](int64_t o, int64_t, int64_t) {
            for (int32_t e : iv->experts) t.f32()[o + e] = -std::numeric_limits<float>::infinity();
          });
          break;
        case InterventionAction::ExpertsZero: {
          const std::vector<int32_t>& ids = (*routes)[i];
          if (int64_t(ids.size()) != t.numel()) fail("hook " + iv->hook, {}, "top-k ids and weights disagree in size");
          for_tokens(*iv, t, [&](int64_t o, int64_t, int64_t W) {
            for (int64_t j = 0; j < W; ++j)
              if (std::binary_search(iv->experts.begin(), iv->experts.end(), ids[size_t(o + j)])) t.f32()[o + j] = 0.0f;
          });
          break;
        }
        default:  // (zero, scale and add: the row edits above)
          break;
      }
    });
  }
  for (size_t i = 0; i < list_.size(); ++i) {
    const Intervention* iv = &list_[i];
    const std::string ids_hook = iv->layer >= 0 ? LayerHookNames(iv->layer).topk_ids : "";
    if (iv->action == InterventionAction::ExpertsZero)
      hooks.add(ids_hook, [routes, i](HookTensor& t) { (*routes)[i].assign(t.i32(), t.i32() + t.numel()); });
    // A routed-out expert is never chosen (the precheck makes it so unless scores underflow to
    // 0): checked on the routes, unless another edit writes them.
    const bool ids_written = std::any_of(list_.begin(), list_.end(), [&](const Intervention& o) { return o.hook == ids_hook; });
    if (iv->action == InterventionAction::ExpertsRouteOut && !ids_written)
      hooks.add(ids_hook, [iv, for_tokens](HookTensor& t) {
        for_tokens(*iv, t, [&](int64_t o, int64_t position, int64_t W) {
          for (int64_t j = 0; j < W; ++j)
            if (std::binary_search(iv->experts.begin(), iv->experts.end(), t.i32()[o + j]))
              fail("--intervene '" + iv->spec + "'", {},
                   "the token at position " + std::to_string(position) + " was still routed to expert " +
                       std::to_string(t.i32()[o + j]) + " (too few other experts with a non-zero score)");
        });
      });
  }
}

void Interventions::check_fired() const {
  for (size_t i = 0; i < list_.size(); ++i)
    if (fired_.at(i) != 1)
      fail("--intervene '" + list_[i].spec + "'", {},
           "hook " + list_[i].hook + " fired " + std::to_string(fired_[i]) + " times in the forward pass (expected once)");
}

ojson Interventions::to_json() const {
  ojson out = ojson::array();
  for (const Intervention& iv : list_) {
    ojson j;
    j["spec"] = iv.spec;
    j["hook"] = iv.hook;
    static constexpr const char* kNames[] = {"zero", "scale", "patch", "experts_zero", "experts_route_out", "patch_row", "add"};
    j["action"] = kNames[int(iv.action)];
    j["tokens"] = iv.tokens.empty() ? ojson("all") : ojson(iv.tokens);
    if (iv.action == InterventionAction::Scale || iv.action == InterventionAction::Add) j["factor"] = iv.factor;
    if (!iv.experts.empty()) j["experts"] = iv.experts;
    if (iv.action == InterventionAction::Patch || iv.action == InterventionAction::Add)
      j["source"] = {{"file", iv.source_path}, {"sha256", iv.source_sha256}, {"tensor", iv.source_tensor}};
    if (iv.action == InterventionAction::Add) j["source"]["per_position"] = iv.source_per_position;
    if (iv.action == InterventionAction::PatchRow) j["source"] = {{"condition", iv.source_condition}};
    out.push_back(std::move(j));
  }
  return out;
}

}  // namespace atlas
