// atlas demo [--out DIR]: the main job end to end on a fresh machine. Makes the embedded tiny
// checkpoint if it is missing, writes a small probe protocol (the special-token family
// control over a few inline texts), freezes it, runs it, and prints a short summary of what
// the edits did to the routes of the target tokens.
#include <cstdio>
#include <filesystem>
#include <map>

#include "cli/command.h"
#include "core/file.h"
#include "io/checkpoint.h"
#include "io/synthetic.h"
#include "model/presets.h"
#include "probe/freeze.h"
#include "probe/run.h"
#include "text/tiny_tokenizer.h"

namespace atlas::cli {
namespace {
namespace fs = std::filesystem;

// The special-token family control (seed section 3.9) on inline texts, all layers of the tiny model.
constexpr const char* kDemoProtocol = R"toml(# Written by `atlas demo`: the special-token family control on a few inline texts.
[protocol]
name = "demo-special-token-family"
description = "system off/on x {EOS, BOS, x, period} at the completed-assistant boundary of a filler history"
seed_section = "3.9"

[model]
dir = "tiny"

[[corpus]]
domain = "english"
format = "inline"
texts = ["The quick brown fox jumps over the lazy dog.",
         "A routing probe changes one token and watches the experts.",
         "Mixture of experts models send each token to a few experts."]

[[corpus]]
domain = "code"
format = "inline"
texts = ["def add(a, b):\n    return a + b\n",
         "for i in range(10):\n    print(i * i)\n",
         "import math\nprint(math.sqrt(2))\n"]

[selection]
salt = "atlas-demo-v1"
per_domain = 2
content_tokens = [0]

[blocks]
system = "You are a careful assistant."
filler_token = "x"
filler_repeat = 9

[[condition]]
name = "s0_eos"
system = false
history = "filler"
group = "s0"

[[condition]]
name = "s0_bos"
system = false
history = "filler"
group = "s0"
edits = [{ anchor = "history_eos", to = "<bos>" }]

[[condition]]
name = "s0_x"
system = false
history = "filler"
group = "s0"
edits = [{ anchor = "history_eos", to = "x" }]

[[condition]]
name = "s0_period"
system = false
history = "filler"
group = "s0"
edits = [{ anchor = "history_eos", to = "." }]

[[condition]]
name = "s1_eos"
system = true
history = "filler"
group = "s1"

[[condition]]
name = "s1_bos"
system = true
history = "filler"
group = "s1"
edits = [{ anchor = "history_eos", to = "<bos>" }]

[[condition]]
name = "s1_x"
system = true
history = "filler"
group = "s1"
edits = [{ anchor = "history_eos", to = "x" }]

[[condition]]
name = "s1_period"
system = true
history = "filler"
group = "s1"
edits = [{ anchor = "history_eos", to = "." }]

[execution]
mode = "trace"
layers = ""
compute = "bf16"

[batching]
sources_per_batch = 1
)toml";

void make_tiny(const std::string& dir) {
  MakeModelOptions opts{.preset = "tiny", .seed = 0, .dtype = DType::BF16, .max_shard_bytes = {}, .progress = {}};
  Preset preset = make_preset("tiny", opts.dtype);
  StagedModelDir out(dir, false);
  write_model_files(out.staging(), preset, opts);
  write_tiny_tokenizer(out.staging());
  { auto ck = Checkpoint::open(out.staging()); }
  out.commit();
}

void run_demo(const std::string& dir) {
  fs::create_directories(dir);
  const std::string tiny = dir + "/tiny";
  if (!file_exists(tiny + "/config.json")) {
    std::printf("demo: making the tiny checkpoint in %s\n", tiny.c_str());
    make_tiny(tiny);
  }
  const std::string proto = dir + "/demo.toml", manifest = dir + "/manifest.json", run_dir = dir + "/run";
  write_file_atomic(proto, kDemoProtocol);
  ojson m = probe::freeze({.protocol = proto, .model_dir = {}, .data_root = {}, .per_domain = {}});
  write_file_atomic(manifest, m.dump(1) + "\n");
  std::printf("demo: froze %lld cells (%lld sources x %lld conditions), contracts verified -> %s\n",
              (long long)m["contracts"]["cells"].get<int64_t>(), (long long)m["contracts"]["sources"].get<int64_t>(),
              (long long)m["contracts"]["conditions"].get<int64_t>(), manifest.c_str());
  fs::remove_all(run_dir);  // the demo always runs from scratch
  auto s = probe::run_manifest({.manifest = manifest, .out_dir = run_dir, .model_dir = {}, .resume = false, .shard = {},
                                .sharded = false, .progress = progress_enabled(), .backend = "cpu"});
  // Summary: per condition, how many target-token routes (ordered top-k lists over all MoE
  // layers) equal those of the official EOS cell of the same source and system level.
  ojson a = ojson::parse(read_file(s.artifact));
  std::map<std::string, const ojson*> official;  // source|group -> official cell
  for (const auto& c : a["cells"])
    if (c["edits"].empty()) official[c["source_key"].get<std::string>() + "|" + c["group"].get<std::string>()] = &c;
  std::map<std::string, std::pair<int64_t, int64_t>> same;  // condition -> (equal, total)
  std::vector<std::string> order;
  for (const auto& c : a["cells"]) {
    const std::string cond = c["condition"].get<std::string>();
    if (!same.count(cond)) order.push_back(cond);
    auto& acc = same[cond];
    const ojson& ref = *official.at(c["source_key"].get<std::string>() + "|" + c["group"].get<std::string>());
    const int64_t a0 = c["interior_token_range"][0], a1 = c["interior_token_range"][1];
    const int64_t r0 = ref["interior_token_range"][0];
    const auto& routes = c["result"]["routes"];
    for (size_t l = 0; l < routes.size(); ++l)
      for (int64_t t = a0; t < a1; ++t) {
        acc.first += routes[l]["topk_ids"][size_t(t)] == ref["result"]["routes"][l]["topk_ids"][size_t(r0 + t - a0)];
        acc.second += 1;
      }
  }
  std::printf("\ntarget-token routes equal to the official EOS cell (ordered top-k, all MoE layers):\n");
  for (const auto& cond : order)
    std::printf("  %-10s %5lld / %-5lld  %6.2f%%\n", cond.c_str(), (long long)same[cond].first,
                (long long)same[cond].second, 100.0 * double(same[cond].first) / double(std::max<int64_t>(1, same[cond].second)));
  std::printf("\n(the tiny model has random weights: these numbers show the pipeline, not DeepSeek)\n");
  std::printf("artifacts:\n  protocol  %s\n  manifest  %s\n  journals  %s/journal/\n  run       %s (content sha256 %s)\n",
              proto.c_str(), manifest.c_str(), run_dir.c_str(), s.artifact.c_str(), s.content_sha256.c_str());
}

Registrar reg{{
    .name = "demo",
    .help = "Main job: make the tiny checkpoint if missing, freeze and run a small probe protocol, summarise",
    .setup =
        [](CLI::App& app) {
          static std::string out = "atlas-demo";
          app.add_option("--out", out, "Demo directory (tiny checkpoint, protocol, manifest, run)")->capture_default_str();
          app.callback([] { run_demo(out); });
        },
}};

}  // namespace
}  // namespace atlas::cli
