// atlas inspect MODEL_DIR [--json] [--layers A-B] [--manifest FILE]: architecture summary,
// parameter and byte counts by dtype, and the verification result. Works on a directory
// with config.json and the index but no shards (accounting only). Exits non-zero when
// verification fails.
#include <cstdio>
#include <filesystem>

#include "cli/command.h"
#include "core/error.h"
#include "core/json.h"
#include "io/checkpoint.h"

namespace {

using atlas::ModelConfig;
using atlas::ojson;

// [0, 2, 3, 4] -> "0, 2-4"
std::string ranges(const std::vector<int64_t>& v) {
  std::string out;
  for (size_t i = 0; i < v.size();) {
    size_t j = i;
    while (j + 1 < v.size() && v[j + 1] == v[j] + 1) ++j;
    out += (out.empty() ? "" : ", ") + std::to_string(v[i]) + (j > i ? "-" + std::to_string(v[j]) : "");
    i = j + 1;
  }
  return out.empty() ? "none" : out;
}

ojson architecture(const ModelConfig& c) {
  std::vector<int64_t> dense, moe;
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) (c.is_moe_layer(l) ? moe : dense).push_back(l);
  ojson a;
  a["layers"] = c.num_hidden_layers;
  a["dense_layers"] = dense;
  a["moe_layers"] = moe;
  a["vocab_size"] = c.vocab_size;
  a["hidden_size"] = c.hidden_size;
  a["attention"] = {{"kind", "MLA"},
                    {"heads", c.num_attention_heads},
                    {"q_lora_rank", c.q_lora_rank ? ojson(*c.q_lora_rank) : ojson(nullptr)},
                    {"kv_lora_rank", c.kv_lora_rank},
                    {"qk_nope_head_dim", c.qk_nope_head_dim},
                    {"qk_rope_head_dim", c.qk_rope_head_dim},
                    {"v_head_dim", c.v_head_dim},
                    {"latent_dim", c.latent_dim()},
                    {"softmax_scale", c.softmax_scale()}};
  a["dense_mlp"] = {{"intermediate_size", c.intermediate_size}};
  if (c.n_routed_experts > 0)
    a["moe"] = {{"routed_experts", c.n_routed_experts},
                {"shared_experts", c.n_shared_experts},
                {"experts_per_token", c.num_experts_per_tok},
                {"moe_intermediate_size", c.moe_intermediate_size},
                {"routing", atlas::topk_method_name(c.topk_method)},
                {"n_group", c.n_group},
                {"topk_group", c.topk_group},
                {"norm_topk_prob", c.norm_topk_prob},
                {"routed_scaling_factor", c.routed_scaling_factor},
                {"scoring_func", "softmax"}};
  else
    a["moe"] = nullptr;
  ojson rope = {{"theta", c.rope_theta}, {"scaling", nullptr}, {"amplitude", c.rope_amplitude()}};
  if (c.rope_scaling)
    rope["scaling"] = {{"type", "yarn"},
                       {"factor", c.rope_scaling->factor},
                       {"original_max_position_embeddings", c.rope_scaling->original_max_position_embeddings},
                       {"beta_fast", c.rope_scaling->beta_fast},
                       {"beta_slow", c.rope_scaling->beta_slow},
                       {"mscale", c.rope_scaling->mscale},
                       {"mscale_all_dim", c.rope_scaling->mscale_all_dim}};
  a["rope"] = rope;
  a["max_position_embeddings"] = c.max_position_embeddings;
  a["rms_norm_eps"] = c.rms_norm_eps;
  a["tie_word_embeddings"] = c.tie_word_embeddings;
  return a;
}

std::string with_commas(int64_t v) {
  std::string s = std::to_string(v), out;
  int n = 0;
  for (auto it = s.rbegin(); it != s.rend(); ++it) {
    if (n && n % 3 == 0 && *it != '-') out.insert(out.begin(), ',');
    out.insert(out.begin(), *it);
    ++n;
  }
  return out;
}

void print_text(const std::string& dir, const ModelConfig& c, const atlas::LayerRange& layers,
                const atlas::VerificationReport& r, const std::string& summary) {
  std::vector<int64_t> dense, moe;
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) (c.is_moe_layer(l) ? moe : dense).push_back(l);
  std::printf("model %s (%s)\n", dir.c_str(), c.model_type.c_str());
  std::printf("  layers      %lld: dense %s; MoE %s\n", (long long)c.num_hidden_layers, ranges(dense).c_str(),
              ranges(moe).c_str());
  std::printf("  embedding   vocab %lld x hidden %lld, tie_word_embeddings %s\n", (long long)c.vocab_size,
              (long long)c.hidden_size, c.tie_word_embeddings ? "true" : "false");
  std::printf("  attention   MLA, %lld heads, q_lora_rank %s, kv_lora_rank %lld, qk_nope %lld + qk_rope %lld, v %lld, "
              "softmax scale %.6g\n",
              (long long)c.num_attention_heads, c.q_lora_rank ? std::to_string(*c.q_lora_rank).c_str() : "null",
              (long long)c.kv_lora_rank, (long long)c.qk_nope_head_dim, (long long)c.qk_rope_head_dim,
              (long long)c.v_head_dim, c.softmax_scale());
  std::printf("  dense mlp   intermediate %lld (SwiGLU)\n", (long long)c.intermediate_size);
  if (c.n_routed_experts > 0)
    std::printf("  moe         %lld routed + %lld shared experts (intermediate %lld), top-%lld, %s (n_group %lld, "
                "topk_group %lld), softmax, norm_topk_prob %s, routed_scaling_factor %g\n",
                (long long)c.n_routed_experts, (long long)c.n_shared_experts, (long long)c.moe_intermediate_size,
                (long long)c.num_experts_per_tok, atlas::topk_method_name(c.topk_method).c_str(),
                (long long)c.n_group, (long long)c.topk_group, c.norm_topk_prob ? "true" : "false",
                c.routed_scaling_factor);
  if (c.rope_scaling)
    std::printf("  rope        theta %g, yarn factor %g (original_max_position_embeddings %lld, beta_fast %g, "
                "beta_slow %g, mscale %g, mscale_all_dim %g), amplitude %.6g\n",
                c.rope_theta, c.rope_scaling->factor, (long long)c.rope_scaling->original_max_position_embeddings,
                c.rope_scaling->beta_fast, c.rope_scaling->beta_slow, c.rope_scaling->mscale,
                c.rope_scaling->mscale_all_dim, c.rope_amplitude());
  else
    std::printf("  rope        theta %g, no scaling\n", c.rope_theta);

  std::printf("checkpoint  %s%s, layers %lld-%lld: %lld tensors expected\n", atlas::layout_name(r.layout).c_str(),
              r.weights_present ? "" : " (weights absent: accounting from the index and config only)",
              (long long)layers.first, (long long)layers.last, (long long)r.expected_tensors);
  for (const auto& [name, t] : r.by_dtype)
    std::printf("  %-5s %8s tensors %18s params %20s bytes\n", name.c_str(), with_commas(t.tensors).c_str(),
                with_commas(t.params).c_str(), with_commas(t.bytes).c_str());
  std::printf("  total %8s tensors %18s        %20s bytes\n", with_commas(r.total_tensors).c_str(), "",
              with_commas(r.total_bytes).c_str());
  if (r.index_total_size)
    std::printf("  index metadata.total_size %s: %s\n", with_commas(*r.index_total_size).c_str(),
                !r.index_total_matches ? "not compared (partial view)"
                : *r.index_total_matches ? "matches"
                                         : "MISMATCH");
  if (!r.shards_opened.empty()) std::printf("  mapped      %zu file(s)\n", r.shards_opened.size());
  if (!r.shards_skipped.empty())
    std::printf("  not mapped  %zu shard(s)%s\n", r.shards_skipped.size(),
                r.weights_present ? " (not needed by the layer range)" : "");
  if (!r.files_pinned.empty()) std::printf("  manifest    %zu file(s) match their SHA-256\n", r.files_pinned.size());
  std::printf("unexpected  %zu tensor(s)\n", r.unexpected.size());
  const size_t show = 20;
  for (size_t i = 0; i < r.unexpected.size() && i < show; ++i) std::printf("  %s\n", r.unexpected[i].c_str());
  if (r.unexpected.size() > show) std::printf("  ... and %zu more (see --json)\n", r.unexpected.size() - show);
  if (r.ok) {
    std::printf("verification OK\n");
  } else {
    std::printf("verification FAILED: %zu problem(s)\n", r.problems.size());
    for (const auto& p : r.problems) std::printf("  %s\n", p.c_str());
  }
  if (!summary.empty()) std::printf("%s\n", summary.c_str());
}

atlas::cli::Registrar reg{{
    .name = "inspect",
    .help = "Summarise and verify a checkpoint directory",
    .setup =
        [](CLI::App& app) {
          struct Args {
            std::string dir, layers, manifest;
            bool json = false;
          };
          static Args a;
          app.add_option("MODEL_DIR", a.dir, "Model directory (config.json + safetensors or index)")->required();
          app.add_flag("--json", a.json, "Print the result as JSON");
          app.add_option("--layers", a.layers, "Verify only what layers A-B need (A must be 0)");
          app.add_option("--manifest", a.manifest, "JSON {\"files\": {\"relative/path\": \"sha256\"}} to check");
          app.callback([] {
            namespace fs = std::filesystem;
            atlas::CheckpointLayout layout = atlas::detect_layout(a.dir);
            ModelConfig cfg = ModelConfig::load((fs::path(a.dir) / "config.json").string());
            atlas::CheckpointOptions opts{.layers = {}, .manifest_path = a.manifest, .verify_only = true};
            if (!a.layers.empty()) opts.layers = atlas::LayerRange::parse(a.layers, cfg);
            atlas::LayerRange layers = opts.layers.value_or(atlas::LayerRange::all(cfg));
            atlas::VerificationReport report;
            std::string summary;
            if (layout == atlas::CheckpointLayout::IndexOnly) {
              report = atlas::verify_index_only(a.dir, opts);
            } else {
              auto ck = atlas::Checkpoint::open(a.dir, opts);
              report = ck.report();
              if (report.ok) summary = "loaded " + ck.summary_line();
            }
            if (a.json) {
              ojson j;
              j["model_dir"] = a.dir;
              j["layers"] = {{"first", layers.first}, {"last", layers.last}};
              j["config"] = cfg.to_json();
              j["architecture"] = architecture(cfg);
              j["verification"] = report.to_json();
              std::printf("%s\n", j.dump(2).c_str());
            } else {
              print_text(a.dir, cfg, layers, report, summary);
            }
            if (!report.ok)
              atlas::fail(a.dir, {}, "verification failed: " + report.problems.front() +
                                         (report.problems.size() > 1
                                              ? " (and " + std::to_string(report.problems.size() - 1) + " more)"
                                              : ""));
          });
        },
}};

}  // namespace
