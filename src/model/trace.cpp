#include "model/trace.h"

#include <algorithm>
#include <cmath>

#include "core/sha256.h"
#include "model/digest.h"
#include "model/intervene.h"

namespace atlas {

TraceRecorder::TraceRecorder(const Model& model, TraceOptions opts) : model_(model), opts_(opts) {}

void TraceRecorder::keep(const std::string& name, const HookTensor& t) {
  if (t.shape.empty() || t.shape[0] != 1) fail("trace: expects a batch of one row");
  Stored s{.name = name, .dtype = t.dtype, .shape = {t.shape.begin() + 1, t.shape.end()}, .f32 = {}, .i32 = {}};
  if (t.dtype == DType::I32)
    s.i32.assign(t.i32(), t.i32() + t.numel());
  else
    s.f32.assign(t.f32(), t.f32() + t.numel());
  if (!stored_.count(name)) order_.push_back(name);
  stored_[name] = std::move(s);
}

void TraceRecorder::attach(Hooks& hooks) {
  // The standard tensors: every hook this run fires that the dump names (trace_dump_name, the
  // same names patch sources are read by), less what the options leave out.
  for (const std::string& h : fired_hook_names(model_.config(), model_.layers())) {
    const std::string name = trace_dump_name(h, model_.config());
    if (name.empty() || (!opts_.keep_latents && name.rfind("mla.", 0) == 0) || (!opts_.keep_logits && name == "logits"))
      continue;
    hooks.add_reader(h, [this, name](const HookTensor& t) { keep(name, t); });
  }
  for (const std::string& pattern : opts_.record)
    hooks.add_reader(pattern, [this](const HookTensor& t) { keep(std::string(t.name), t); });
}

const TraceRecorder::Stored* TraceRecorder::find(const std::string& name) const {
  auto it = stored_.find(name);
  return it == stored_.end() ? nullptr : &it->second;
}

std::vector<TensorToWrite> TraceRecorder::tensors() const {
  // Stable order regardless of hook firing order: hidden stages by index, then per layer
  // router tensors and latents, then logits.
  std::vector<TensorToWrite> out;
  auto add = [&](const std::string& name) {
    const Stored* s = find(name);
    if (!s) return;
    out.push_back({.name = s->name,
                   .dtype = s->dtype,
                   .shape = s->shape,
                   .data = s->dtype == DType::I32 ? static_cast<const void*>(s->i32.data())
                                                  : static_cast<const void*>(s->f32.data())});
  };
  const auto& L = model_.layers();
  for (int64_t s = 0; s <= model_.config().num_hidden_layers + 1; ++s) add("hidden." + std::to_string(s));
  for (int64_t l = L.first; l <= L.last; ++l) {
    const std::string p = "router." + std::to_string(l) + ".";
    add(p + "logits");
    add(p + "topk_ids");
    add(p + "topk_weights");
  }
  for (int64_t l = L.first; l <= L.last; ++l) add("mla." + std::to_string(l) + ".latent");
  add("logits");
  for (const std::string& h : recorded_names())
    if (h != "logits") add(h);  // (the standard dump's logits are the hook's own name)
  return out;
}

std::vector<std::string> TraceRecorder::recorded_names() const {
  std::vector<std::string> out;
  if (opts_.record.empty()) return out;
  // By the patterns, not by what is stored: "logits" is also the standard dump's name.
  for (const std::string& h : fired_hook_names(model_.config(), model_.layers()))
    if (find(h) && std::any_of(opts_.record.begin(), opts_.record.end(), [&](const std::string& p) { return glob_match(p, h); }))
      out.push_back(h);
  return out;
}

void check_record_patterns(const std::vector<std::string>& patterns, const ModelConfig& cfg, const LayerRange& layers) {
  const std::vector<std::string> fired = fired_hook_names(cfg, layers);
  for (const std::string& p : patterns)
    if (std::none_of(fired.begin(), fired.end(), [&](const std::string& h) { return glob_match(p, h); }))
      fail("--record '" + p + "'", {},
           "matches no hook this run fires (atlas hooks lists them; layers " + std::to_string(layers.first) + "-" +
               std::to_string(layers.last) + ")");
}

ojson tensor_stats(const std::vector<float>& v, const std::vector<int64_t>& shape) {
  double sum = 0, sq = 0;
  float mn = v.empty() ? 0 : v[0], mx = mn;
  for (float x : v) {
    sum += x;
    sq += double(x) * double(x);
    mn = std::min(mn, x);
    mx = std::max(mx, x);
  }
  const double n = double(v.size());
  const double mean = n ? sum / n : 0;
  double var = 0;
  for (float x : v) var += (double(x) - mean) * (double(x) - mean);
  ojson j;
  j["shape"] = shape;
  j["dtype"] = "F32";
  j["mean"] = mean;
  j["std"] = n ? std::sqrt(var / n) : 0.0;  // population standard deviation
  j["min"] = mn;
  j["max"] = mx;
  j["l2"] = std::sqrt(sq);
  j["sha256"] = sha256_hex(v.data(), v.size() * sizeof(float));
  return j;
}

ojson TraceRecorder::summary() const {
  ojson stages = ojson::array();
  const int64_t n_layers = model_.config().num_hidden_layers;
  for (int64_t s = 0; s <= n_layers + 1; ++s) {
    const Stored* st = find("hidden." + std::to_string(s));
    if (!st) continue;
    ojson j;
    j["stage"] = s;
    j["name"] = st->name;
    j["hook"] = s == 0 ? "embed" : s == n_layers + 1 ? "final_norm" : "blocks." + std::to_string(s - 1) + ".hook_resid_post";
    j.update(tensor_stats(st->f32, st->shape));
    // A hidden stage's hash is the stage hash of its tokens (model/digest.h), the same value a
    // probe run records as full_sha256 for the same unpadded row; other tensors (logits) keep
    // the SHA-256 of their whole float32 image.
    const int64_t T = st->shape.at(0);
    j["sha256"] = stage_sha256(st->f32.data(), T, T > 0 ? int64_t(st->f32.size()) / T : 0);
    stages.push_back(std::move(j));
  }
  ojson gates = ojson::array();
  const auto& L = model_.layers();
  const int64_t E = model_.config().n_routed_experts;
  for (int64_t l = L.first; l <= L.last; ++l) {
    const std::string p = "router." + std::to_string(l) + ".";
    const Stored* ids = find(p + "topk_ids");
    const Stored* w = find(p + "topk_weights");
    if (!ids || !w) continue;
    std::vector<int64_t> load(static_cast<size_t>(E), 0);
    std::vector<double> wload(static_cast<size_t>(E), 0.0);
    for (size_t i = 0; i < ids->i32.size(); ++i) {
      load[size_t(ids->i32[i])] += 1;
      wload[size_t(ids->i32[i])] += double(w->f32[i]);
    }
    ojson g;
    g["layer"] = l;
    g["tokens"] = ids->shape[0];
    g["k"] = ids->shape[1];
    g["topk_ids_sha256"] = ids_sha256(ids->i32);
    g["topk_weights_sha256"] = sha256_hex(w->f32.data(), w->f32.size() * sizeof(float));
    const Stored* lg = find(p + "logits");
    if (lg) g["logits_sha256"] = sha256_hex(lg->f32.data(), lg->f32.size() * sizeof(float));
    g["load"] = load;
    g["weighted_load"] = wload;
    gates.push_back(std::move(g));
  }
  ojson out;
  out["stages"] = std::move(stages);
  out["gates"] = std::move(gates);
  if (const Stored* lg = find("logits")) out["logits"] = tensor_stats(lg->f32, lg->shape);
  if (!opts_.record.empty()) {
    ojson rec = ojson::array();
    for (const std::string& h : recorded_names()) {
      const Stored* st = find(h);
      rec.push_back({{"hook", h},
                     {"shape", st->shape},
                     {"dtype", std::string(dtype_name(st->dtype))},
                     {"sha256", st->dtype == DType::I32 ? sha256_hex(st->i32.data(), st->i32.size() * 4)
                                                        : sha256_hex(st->f32.data(), st->f32.size() * 4)}});
    }
    out["recorded"] = std::move(rec);
  }
  return out;
}

}  // namespace atlas
