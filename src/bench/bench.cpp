#include "bench/bench.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cmath>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <map>
#include <unistd.h>  // environ

#include "core/error.h"
#include "core/json.h"
#include "core/provenance.h"
#include "core/sha256.h"
#include "decode/generate.h"
#include "io/checkpoint.h"
#include "model/digest.h"
#include "model/hooks.h"
#include "model/intervene.h"
#include "model/loader.h"
#ifdef ATLAS_HAVE_CUDA
#include "backend/cuda/cuda_ops.h"
#endif

namespace atlas::bench {
namespace {

// The median of a non-empty list (the mean of the middle two for an even count).
double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

using Clock = std::chrono::steady_clock;
double since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

uint64_t splitmix(uint64_t& s) {
  uint64_t z = (s += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

std::string utc_now() {
  std::time_t t = std::time(nullptr);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&t));
  return buf;
}

struct Device {
  std::string name = "cpu";
  std::optional<double> bandwidth;  // bytes/s, where known
};

Device device_of(const std::string& backend, int device) {
  Device d;
  if (backend != "cuda") return d;
#ifdef ATLAS_HAVE_CUDA
  if (cuda::device_count() > 0) {
    d.name = cuda::device_info(device).name;
    // Peak HBM bandwidth by product (vendor data sheets): the bound the issue states.
    if (d.name.find("H200") != std::string::npos) d.bandwidth = 4.8e12;
    else if (d.name.find("H100") != std::string::npos) d.bandwidth = 3.35e12;
  }
#endif
  return d;
}

// GPU memory in use by everything on the device (total - free), bytes; 0 without CUDA.
double device_used_bytes(const std::string& backend) {
#ifdef ATLAS_HAVE_CUDA
  if (backend == "cuda") {
    const auto m = cuda::memory_info();
    return double(m.total - m.free);
  }
#endif
  (void)backend;
  return 0;
}

// Weight bytes one decode token reads (bf16): attention + dense MLPs + router + the k routed
// and the shared experts of every MoE layer + lm_head (the embedding row is negligible).
struct WeightBytes {
  double per_token_b1 = 0;  // batch 1: only the chosen experts
  double all = 0;           // every weight but the embedding (a large batch touches all experts)
};
WeightBytes weight_bytes(const ModelConfig& c) {
  const double H = double(c.hidden_size), nh = double(c.num_attention_heads), dq = double(c.q_head_dim());
  const double dn = double(c.qk_nope_head_dim), dv = double(c.v_head_dim), dc = double(c.kv_lora_rank);
  const double W = double(c.latent_dim());
  double q = c.q_lora_rank ? double(*c.q_lora_rank) * (H + nh * dq) : nh * dq * H;
  const double attn = q + W * H + nh * (dn + dv) * dc + H * nh * dv;
  WeightBytes w;
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    if (c.is_moe_layer(l)) {
      const double expert = 3.0 * H * double(c.moe_intermediate_size);
      const double shared = double(c.n_shared_experts) * expert;
      w.per_token_b1 += attn + double(c.n_routed_experts) * H + double(c.num_experts_per_tok) * expert + shared;
      w.all += attn + double(c.n_routed_experts) * H + double(c.n_routed_experts) * expert + shared;
    } else {
      w.per_token_b1 += attn + 3.0 * H * double(c.intermediate_size);
      w.all += attn + 3.0 * H * double(c.intermediate_size);
    }
  }
  w.per_token_b1 = 2.0 * (w.per_token_b1 + double(c.vocab_size) * H);
  w.all = 2.0 * (w.all + double(c.vocab_size) * H);
  return w;
}

// The reference file: {"records": [{"workload": ..., "value": ...}, ...], "device": ...}.
struct Reference {
  std::map<std::string, double> values;  // workload -> figure
  ojson source;                          // what every record says of the file (null: no file)
};

// A string field of the reference file, or null where it is absent (older files have no date).
ojson optional_string(const json& j, const char* key, const std::string& path) {
  if (!j.contains(key)) return nullptr;
  if (!j[key].is_string()) fail(path, key, "not a string");
  return j[key].get<std::string>();
}

Reference read_reference(const std::string& path) {
  Reference r;
  if (path.empty()) return r;
  const json j = read_json_file(path);
  if (!j.is_object()) fail(path, "(top level)", "not a JSON object");
  if (!j.contains("records") || !j["records"].is_array()) fail(path, "records", "missing or not an array");
  for (const auto& e : j["records"]) {
    if (!e.contains("workload") || !e["workload"].is_string()) fail(path, "records[].workload", "missing");
    if (!e.contains("value") || !e["value"].is_number()) fail(path, "records[].value", "missing or not a number");
    r.values[e["workload"].get<std::string>()] = e["value"].get<double>();
  }
  r.source = ojson::object();
  r.source["file"] = path;
  r.source["sha256"] = sha256_file(path);
  r.source["name"] = optional_string(j, "reference", path);
  r.source["device"] = optional_string(j, "device", path);
  r.source["date"] = optional_string(j, "date", path);
  return r;
}

void progress(const BenchOptions& o, const std::string& what) {
  if (o.progress) std::fprintf(stderr, "bench: %s\n", what.c_str());
}

}  // namespace

std::vector<std::vector<int32_t>> bench_prompts(uint64_t seed, int64_t n, int64_t min_len, int64_t max_len,
                                                int64_t vocab) {
  if (n <= 0 || min_len <= 0 || max_len < min_len) fail("bench", "prompts", "need n > 0 and 0 < min <= max");
  if (vocab <= 16) fail("bench", "vocab", "vocabulary too small");
  uint64_t s = seed;
  std::vector<std::vector<int32_t>> rows(static_cast<size_t>(n));
  for (auto& r : rows) {
    const int64_t len = min_len + int64_t(splitmix(s) % uint64_t(max_len - min_len + 1));
    r.resize(size_t(len));
    for (auto& id : r) id = int32_t(16 + splitmix(s) % uint64_t(vocab - 16));
  }
  return rows;
}

BenchPrompts make_prompts(const BenchOptions& o, int64_t vocab) {
  return {.grid = bench_prompts(o.seed, o.grid_prompts, o.prompt_min, o.prompt_max, vocab),
          .decode = bench_prompts(o.seed + 1, 1, o.decode_prompt, o.decode_prompt, vocab)[0],
          .mem = bench_prompts(o.seed + 2, o.mem_rows, o.mem_prefill, o.mem_prefill, vocab)};
}

ojson prompts_json(const BenchOptions& o, const BenchPrompts& p) {
  ojson j;
  j["seed"] = o.seed;
  j["new_tokens"] = o.grid_new_tokens;
  j["prompts"] = p.grid;
  j["decode_prompt"] = p.decode;
  j["decode_steps"] = o.decode_steps;
  j["mem"] = {{"rows", o.mem_rows}, {"prefill", o.mem_prefill}, {"steps", o.mem_steps}};
  j["mem_prompts"] = p.mem;
  return j;
}

const std::vector<std::string>& workload_names() {
  static const std::vector<std::string> n = {"load", "seed-grid-128x512", "prefill-trace-128", "decode-b1",
                                             "peak-mem-128x1024"};
  return n;
}

std::vector<Record> run_bench(const BenchOptions& o) {
  std::vector<std::string> workloads = o.workloads.empty() ? workload_names() : o.workloads;
  for (const auto& w : workloads)
    if (std::find(workload_names().begin(), workload_names().end(), w) == workload_names().end())
      fail("--workload", {}, "unknown workload \"" + w + "\"");
  std::vector<std::string> modes = o.modes;
  if (modes.empty()) modes = o.backend == "cuda" ? std::vector<std::string>{"batch-invariant", "fast"}
                                                 : std::vector<std::string>{"batch-invariant"};
  for (const auto& m : modes) {
    if (m != "batch-invariant" && m != "fast") fail("--mode", {}, "unknown mode \"" + m + "\"");
    if (m == "fast" && o.backend != "cuda") fail("--mode", {}, "fast exists on the cuda backend only");
  }
  const auto reference = read_reference(o.reference_path);
  const Device dev = device_of(o.backend, o.device);
  const std::string commit = build_provenance().value("git_commit", "unknown");
  const std::string date = utc_now();
  const ojson environment = atlas_environment();

  // Page cache first, so `load` measures page cache -> ready (as the issue asks).
  Checkpoint ck = Checkpoint::open(o.model_dir);
  const ModelConfig cfg = ck.config();
  std::vector<char> buf(size_t(1) << 24);
  for (const auto& e : std::filesystem::directory_iterator(o.model_dir)) {
    if (e.path().extension() != ".safetensors") continue;
    std::ifstream f(e.path(), std::ios::binary);
    while (f.read(buf.data(), std::streamsize(buf.size())) || f.gcount() > 0) {
    }
  }
  const BenchPrompts all = make_prompts(o, cfg.vocab_size);
  const auto& prompts = all.grid;
  int64_t prompt_tokens = 0;
  for (const auto& p : prompts) prompt_tokens += int64_t(p.size());
  const WeightBytes wb = weight_bytes(cfg);
  // Hook edits (--intervene), checked against the model before anything loads, as trace and
  // generate check theirs. They change what the timed workloads compute, so the others (load,
  // memory) do not run beside them.
  const auto wants = [&](const std::string& w) { return std::find(workloads.begin(), workloads.end(), w) != workloads.end(); };
  std::optional<Interventions> edits;
  if (!o.interventions.empty()) {
    for (const auto& w : workloads)
      if (w != "seed-grid-128x512" && w != "prefill-trace-128" && w != "decode-b1")
        fail("--intervene", {},
             "edits apply to seed-grid-128x512, prefill-trace-128 and decode-b1 only (name them with --workload; "
             "not \"" + w + "\")");
    edits.emplace(o.interventions, cfg, LayerRange::all(cfg), true);
    if (wants("seed-grid-128x512") || wants("decode-b1")) edits->check_for_generation();
    if (wants("prefill-trace-128")) {
      int64_t longest = 0;
      for (const auto& p : prompts) longest = std::max<int64_t>(longest, int64_t(p.size()));
      edits->check_tokens(longest, "prefill-trace-128");
    }
  }
  Interventions* const edit = edits ? &*edits : nullptr;
  const ojson edits_json = edits ? edits->to_json() : ojson(nullptr);

  std::vector<Record> out;
  auto record = [&](const std::string& workload, const std::string& mode, double v, const std::string& unit,
                    std::optional<double> bound, ojson detail) {
    Record r{.workload = workload, .mode = mode, .unit = unit, .gpu = dev.name, .commit = commit, .date = date,
             .command = o.command, .atlas = v, .reference = std::nullopt, .bound = bound, .detail = std::move(detail),
             .environment = environment, .interventions = edits_json};
    if (auto it = reference.values.find(workload); it != reference.values.end()) r.reference = it->second;
    r.reference_source = reference.source;
    out.push_back(std::move(r));
  };

  if (o.repeat < 1) fail("--repeat", {}, "must be >= 1");
  // A timed workload o.repeat times: `once` runs it and returns its figure and detail. The
  // record keeps the median (the mean of the middle two for an even count) and every figure;
  // the fingerprint field of the detail (tokens or stage hashes) must be the same in every run.
  auto repeated = [&](const std::string& workload, const std::string& mode, const std::string& unit,
                      std::optional<double> bound, const char* fingerprint, auto once) {
    std::vector<double> figures;
    ojson detail;
    bool same = true;
    for (int i = 0; i < o.repeat; ++i) {
      auto [v, d] = once();
      figures.push_back(v);
      if (i == 0)
        detail = std::move(d);
      else if (d.value(fingerprint, std::string()) != detail.value(fingerprint, std::string()))
        same = false;
    }
    const double mid = median(figures);
    if (o.repeat > 1) {
      detail["runs"] = figures;
      detail["statistic"] = "median of " + std::to_string(o.repeat) + " runs";
      detail["fingerprint_identical_across_runs"] = same;
      if (!same)
        std::fprintf(stderr, "atlas bench: warning: %s (%s): %s differs between runs (nondeterminism)\n",
                     workload.c_str(), mode.c_str(), fingerprint);
    }
    record(workload, mode, mid, unit, bound, std::move(detail));
  };
  // With edits: the same workload without them, as many times (`once(nullptr)`), into the
  // edited record's detail: figures, their median, the fingerprint, and edit_cost = the edited
  // run's time over the unedited one's (> 1: the edits cost time).
  auto unedited = [&](const char* key, const char* fingerprint, bool rate, auto once) {
    if (!edit) return;
    std::vector<double> figures;
    std::string fp;
    for (int i = 0; i < o.repeat; ++i) {
      auto [v, d] = once(nullptr);
      figures.push_back(v);
      fp = d.value(fingerprint, std::string());
    }
    ojson& d = out.back().detail;
    const double mid = median(figures);
    d[std::string("unedited_") + key] = mid;
    d[std::string("unedited_") + key + "_runs"] = figures;
    d[std::string("unedited_") + fingerprint] = fp;
    d["edit_cost"] = rate ? mid / out.back().atlas : out.back().atlas / mid;
  };

  for (const auto& mode : modes) {
    const ModelOptions mo{.backend = o.backend, .compute = Compute::BF16, .device = o.device,
                          .batch_invariant = mode == "batch-invariant"};
    progress(o, "loading (" + mode + ")");
    const auto t_load = Clock::now();
    Checkpoint ck2 = Checkpoint::open(o.model_dir);
    std::unique_ptr<Model> model = load_model(ck2, mo);
    const double load_s = since(t_load);
    if (wants("load")) record("load", mode, load_s, "s", std::nullopt, {{"bytes", ck2.report().total_bytes}});

    if (wants("seed-grid-128x512")) {
      progress(o, "seed grid (" + mode + "): " + std::to_string(o.grid_prompts) + " x " +
                      std::to_string(o.grid_new_tokens));
      std::vector<decode::PromptRow> rows;
      for (size_t i = 0; i < prompts.size(); ++i) rows.push_back({.id = std::to_string(i), .ids = prompts[i], .sampling = {}});
      std::optional<double> bound;
      if (dev.bandwidth) bound = double(o.grid_new_tokens) * wb.all / *dev.bandwidth;
      const auto grid_once = [&](Interventions* e) {
        const auto t0 = Clock::now();
        auto res = decode::generate(*model, rows,
                                    {.max_new_tokens = o.grid_new_tokens, .batch = o.grid_prompts, .eos_ids = {},
                                     .stop_strings = {}, .pad_id = 0, .detokenize = {}, .on_row = {}, .on_logits = {},
                                     .progress = o.progress, .edits = e});
        const double s = since(t0);
        int64_t new_tokens = 0;
        Sha256 h;
        for (const auto& r : res) {
          new_tokens += r.n_new;
          h.update(r.ids.data(), r.ids.size() * 4);
        }
        return std::pair{s, ojson{{"prompts", o.grid_prompts}, {"prompt_tokens", prompt_tokens},
                                  {"new_tokens", new_tokens}, {"tokens_per_s", double(new_tokens) / s},
                                  {"tokens_sha256", h.hex()}}};
      };
      repeated("seed-grid-128x512", mode, "s", bound, "tokens_sha256", [&] { return grid_once(edit); });
      ojson& d = out.back().detail;  // the rate of the reported (median) run
      d["tokens_per_s"] = d["new_tokens"].get<double>() / out.back().atlas;
      unedited("s", "tokens_sha256", false, grid_once);
    }

    if (wants("prefill-trace-128")) {
      progress(o, "prefill trace (" + mode + ")");
      const int64_t B = int64_t(prompts.size());
      int64_t T = 0;
      for (const auto& p : prompts) T = std::max<int64_t>(T, int64_t(p.size()));
      std::vector<int32_t> ids(size_t(B * T), 0), pos(size_t(B * T), 0);
      std::vector<uint8_t> mask(size_t(B * T), 0);
      for (int64_t b = 0; b < B; ++b) {
        const auto& p = prompts[size_t(b)];
        const int64_t pad = T - int64_t(p.size());
        for (int64_t t = pad; t < T; ++t) {
          ids[size_t(b * T + t)] = p[size_t(t - pad)];
          pos[size_t(b * T + t)] = int32_t(t - pad);
          mask[size_t(b * T + t)] = 1;
        }
      }
      // What a probe trace keeps: routes of every gate, a SHA-256 per row of every hidden stage
      // (the stage hash of the row's real tokens, from the per-token digests: model/digest.h).
      std::map<std::string, std::vector<std::string>> stage_hashes;
      std::map<std::string, std::vector<int32_t>> routes;
      std::map<std::string, std::vector<float>> route_w;
      // The recorders; edits first where there are any, so that the recorders see the edited
      // values (as in atlas trace).
      const auto recording = [&](Interventions* e) {
        auto hooks_ptr = std::make_unique<Hooks>();
        Hooks& hooks = *hooks_ptr;
        if (e) e->attach(hooks);
        auto stage = [&](const std::string& name) {
          hooks.add_digests(name, [&, name](const HookDigests& d) {
            std::vector<std::string> hs(static_cast<size_t>(B));
            for (int64_t b = 0; b < B; ++b)
              hs[size_t(b)] = digest_chain_hex(d.row(b, T - int64_t(prompts[size_t(b)].size()), T));
            stage_hashes[name] = std::move(hs);
          });
        };
        stage("embed");
        for (int64_t l = 0; l < cfg.num_hidden_layers; ++l) {
          const LayerHookNames n(l);
          stage(n.resid_post);
          if (!cfg.is_moe_layer(l)) continue;
          hooks.add_reader(n.topk_ids, [&, l](const HookTensor& t) {
            routes[std::to_string(l)].assign(t.i32(), t.i32() + t.numel());
          });
          hooks.add_reader(n.topk_weights, [&, l](const HookTensor& t) {
            route_w[std::to_string(l)].assign(t.f32(), t.f32() + t.numel());
          });
        }
        stage("final_norm");
        return hooks_ptr;
      };
      const ForwardInput in{.batch = B, .tokens = T, .ids = ids, .positions = pos, .mask = mask,
                            .logits_last_only = true, .logits_rows = {}};
      const auto recorders = recording(edit);  // with the edits, where there are any
      const auto unedited_recorders = edit ? recording(nullptr) : nullptr;
      const auto traced_once = [&](Interventions* e) {
        stage_hashes.clear();
        routes.clear();
        route_w.clear();
        auto cache = model->make_cache(B, T);
        const auto t0 = Clock::now();
        if (e) e->begin_pass(in);
        model->forward(in, *cache, e || !edit ? recorders.get() : unedited_recorders.get());
        if (e) e->check_fired();
        const double s = since(t0);
        Sha256 h;
        for (const auto& [name, hs] : stage_hashes)
          for (const auto& x : hs) h.update(x);
        int64_t decisions = 0;
        for (const auto& [l, r] : routes) decisions += int64_t(r.size());
        return std::pair{s, ojson{{"rows", B}, {"padded_tokens", T}, {"prompt_tokens", prompt_tokens},
                                  {"stages", stage_hashes.size()}, {"route_decisions_padded", decisions},
                                  {"stage_hashes_sha256", h.hex()}}};
      };
      repeated("prefill-trace-128", mode, "s", std::nullopt, "stage_hashes_sha256", [&] { return traced_once(edit); });
      unedited("s", "stage_hashes_sha256", false, traced_once);
      // What tracing costs: the same forward without hooks, as many times (median, seconds).
      std::vector<double> untraced;
      for (int i = 0; i < o.repeat; ++i) {
        auto cache = model->make_cache(B, T);
        const auto t0 = Clock::now();
        model->forward(in, *cache);
        untraced.push_back(since(t0));
      }
      out.back().detail["untraced_s"] = median(untraced);
      out.back().detail["untraced_runs"] = untraced;
    }

    if (wants("decode-b1")) {
      progress(o, "decode b1 (" + mode + ")");
      const auto& p = all.decode;
      const int64_t P = int64_t(p.size());
      std::vector<int32_t> pos(static_cast<size_t>(P));
      for (int64_t t = 0; t < P; ++t) pos[size_t(t)] = int32_t(t);
      std::vector<uint8_t> mask(size_t(P), 1);
      const std::vector<uint8_t> no_logits(1, 0);
      std::optional<double> bound;
      if (dev.bandwidth) bound = *dev.bandwidth / wb.per_token_b1;
      // Each run's first token (the clock's start to its arrival: a new cache store's eager step
      // and the step graph's capture, where they happen) and its rate after it.
      std::vector<double> first_token_s, after_first_tok_s;
      const auto decode_once = [&](Interventions* e) {
        // Edits run in every pass (the prompt's, then each step's), as atlas generate runs them.
        std::unique_ptr<Hooks> hooks;
        if (e) e->attach(*(hooks = std::make_unique<Hooks>()));
        const auto edited_forward = [&](const ForwardInput& in, Cache& cache) {
          if (e) e->begin_pass(in);
          auto out = model->forward(in, cache, hooks.get());
          if (e) e->check_fired();
          return out;
        };
        auto cache = model->make_cache(1, P + o.decode_steps + 1);
        auto r = edited_forward({.batch = 1, .tokens = P, .ids = p, .positions = pos, .mask = mask,
                                 .logits_last_only = true, .logits_rows = no_logits},
                                *cache);
        int32_t tok = r.greedy.at(0);
        std::vector<int32_t> toks;
        // The decode steps as `atlas generate` runs them for greedy rows: a DecodeRun with
        // GenerateOptions' default number of steps pushed ahead of the one read (the cache's first
        // decode step runs eagerly inside it); --decode-ahead 0, or edits (as in generate): one
        // forward() call per step.
        const int64_t ahead = e ? 0 : o.decode_ahead;
        // generate's attention form for decode steps in both loops (the CUDA backend has one form;
        // the CPU backend's two differ in rounding, so the loops must not differ in it).
        const AttentionForm form = decode::GenerateOptions{}.decode_attention;
        const auto t0 = Clock::now();
        double first = 0;
        if (ahead == 0) {
          for (int64_t s = 0; s < o.decode_steps; ++s) {
            const int32_t id = tok, ps = int32_t(P + s);
            const uint8_t one = 1;
            r = edited_forward({.batch = 1, .tokens = 1, .ids = {&id, 1}, .positions = {&ps, 1}, .mask = {&one, 1},
                                .logits_last_only = true, .logits_rows = no_logits, .attention = form},
                               *cache);
            tok = r.greedy.at(0);
            toks.push_back(tok);
            if (s == 0) first = since(t0);
          }
        } else {
          auto run = model->start_decode(*cache, std::span(&tok, 1), form);
          int64_t pushed = 0;
          const auto push_through = [&](int64_t last) {
            for (; pushed <= std::min(last, o.decode_steps - 1); ++pushed) {
              const int32_t ps = int32_t(P + pushed);
              run->push({&ps, 1});
            }
          };
          for (int64_t s = 0; s < o.decode_steps; ++s) {
            push_through(s + ahead);
            toks.push_back(run->pop().at(0));
            if (s == 0) first = since(t0);
          }
        }
        const double s = since(t0);
        first_token_s.push_back(first);
        after_first_tok_s.push_back(o.decode_steps > 1 ? double(o.decode_steps - 1) / (s - first) : 0.0);
        return std::pair{double(o.decode_steps) / s,
                         ojson{{"prompt_tokens", P}, {"steps", o.decode_steps}, {"seconds", s},
                               {"bytes_per_token_bound", wb.per_token_b1}, {"decode_ahead", ahead},
                               {"tokens_sha256", ids_sha256(toks)}}};
      };
      repeated("decode-b1", mode, "tok/s", bound, "tokens_sha256", [&] { return decode_once(edit); });
      out.back().detail["seconds"] = double(o.decode_steps) / out.back().atlas;  // of the reported (median) rate
      out.back().detail["first_token_s"] = first_token_s;
      out.back().detail["after_first_tok_s"] = after_first_tok_s;
      unedited("tok_s", "tokens_sha256", true, decode_once);
    }

    if (wants("peak-mem-128x1024")) {
      progress(o, "peak memory (" + mode + ")");
      // A fresh model: the one above keeps the working memory its largest call grew (the traced
      // prefill runs 128 rows unchunked), which is not this workload's.
      model.reset();
      model = load_model(ck2, mo);
      const int64_t B = o.mem_rows, P = o.mem_prefill, S = o.mem_steps;
      double peak = device_used_bytes(o.backend);
      const auto& rows = all.mem;
      std::vector<int32_t> ids, pos;
      for (const auto& r : rows)
        for (int64_t t = 0; t < P; ++t) {
          ids.push_back(r[size_t(t)]);
          pos.push_back(int32_t(t));
        }
      std::vector<uint8_t> mask(ids.size(), 1);
      const std::vector<uint8_t> no_logits(size_t(B), 0);
      auto cache = model->make_cache(B, P + S);
      auto r = model->forward({.batch = B, .tokens = P, .ids = ids, .positions = pos, .mask = mask,
                               .logits_last_only = true, .logits_rows = no_logits},
                              *cache);
      peak = std::max(peak, device_used_bytes(o.backend));
      for (int64_t s = 0; s < S; ++s) {
        std::vector<int32_t> sid = r.greedy, sp(size_t(B), int32_t(P + s));
        std::vector<uint8_t> sm(size_t(B), 1);
        r = model->forward({.batch = B, .tokens = 1, .ids = sid, .positions = sp, .mask = sm,
                            .logits_last_only = true, .logits_rows = no_logits},
                           *cache);
        peak = std::max(peak, device_used_bytes(o.backend));
      }
      record("peak-mem-128x1024", mode, peak / double(1ull << 30), "GiB", std::nullopt,
             {{"rows", B}, {"prefill_tokens", P}, {"decode_steps", S},
              {"what", "device total - free after each call (weights, cache, working memory, CUDA context)"}});
    }
  }
  return out;
}

ojson atlas_environment() {
  std::map<std::string, std::string> vars;  // sorted by name: the same environment, the same bytes
  for (char** e = environ; e && *e; ++e) {
    const std::string kv = *e;
    const size_t eq = kv.find('=');
    if (eq == std::string::npos) continue;
    const std::string name = kv.substr(0, eq);
    // (CUDA_DEVICE_MAX_CONNECTIONS: the caller's value, or what a CUDA build sets before the
    // driver starts, src/backend/cuda/runtime.cu; a measurement's condition like the switches.)
    if (name.rfind("ATLAS_", 0) != 0 && name != "CUDA_DEVICE_MAX_CONNECTIONS") continue;
    if (name != "ATLAS_GIT_COMMIT") vars[name] = kv.substr(eq + 1);
  }
  ojson j = ojson::object();
  for (const auto& [k, v] : vars) j[k] = v;
  return j;
}

ojson to_json(const std::vector<Record>& records) {
  ojson a = ojson::array();
  for (const auto& r : records) {
    ojson j;
    j["workload"] = r.workload;
    j["mode"] = r.mode;
    j["atlas"] = r.atlas;
    j["reference"] = r.reference ? ojson(*r.reference) : ojson(nullptr);
    j["unit"] = r.unit;
    j["gpu"] = r.gpu;
    j["commit"] = r.commit;
    j["date"] = r.date;
    j["command"] = r.command;
    j["environment"] = r.environment;
    j["reference_name"] = "transformers (tools/reference/bench_transformers.py)";
    // Which run of it: the file, its hash, and the device and date it recorded (a file from
    // another session or machine is visible here; the bench cannot tell on its own).
    j["reference_source"] = r.reference_source;  // null without --reference
    // ratio > 1 = atlas better (faster, or less memory), whatever the unit's direction.
    if (r.reference && r.atlas > 0 && *r.reference > 0)
      j["speedup_vs_reference"] = r.unit == "tok/s" ? r.atlas / *r.reference : *r.reference / r.atlas;
    else
      j["speedup_vs_reference"] = nullptr;
    j["bound"] = r.bound ? ojson(*r.bound) : ojson(nullptr);
    if (r.bound && r.atlas > 0)
      j["fraction_of_bound"] = r.unit == "tok/s" ? r.atlas / *r.bound : *r.bound / r.atlas;
    if (!r.interventions.is_null()) j["interventions"] = r.interventions;  // absent without edits
    j["detail"] = r.detail;
    a.push_back(std::move(j));
  }
  return a;
}

}  // namespace atlas::bench
