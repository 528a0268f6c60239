// atlas sample-debug: a debugging tool that applies one decoding contract to a logits row from
// a JSON file and prints what it did (survivors, probabilities, the uniforms, the tokens) as
// JSON. It exists so independent implementations (tests/decode/test_sampler_definitions.py)
// can check the contracts in docs/decoding.md against atlas; generation itself is `generate`.
#include <cmath>
#include <cstdio>
#include <limits>
#include <optional>
#include <string>

#include "cli/command.h"
#include "core/error.h"
#include "core/file.h"
#include "core/json.h"
#include "decode/sampler.h"

namespace {

using namespace atlas;
using namespace atlas::decode;

// A JSON array of numbers; -inf, inf and nan (which JSON cannot spell) as strings. Also
// accepted: {"logits": [...]}.
std::vector<float> read_logits(const std::string& path) {
  const json j = read_json_file(path);
  const json& arr = j.is_object() ? JsonReader(j, path).raw("logits") : j;
  const std::string field = j.is_object() ? "logits" : "";
  if (!arr.is_array() || arr.empty()) fail(path, field, "expected a non-empty array of numbers");
  std::vector<float> out;
  out.reserve(arr.size());
  for (size_t i = 0; i < arr.size(); ++i) {
    const json& v = arr[i];
    const std::string f = field + "[" + std::to_string(i) + "]";
    if (v.is_number()) {
      out.push_back(v.get<float>());
    } else if (v.is_string() && (v == "-inf" || v == "inf" || v == "nan")) {
      out.push_back(v == "nan" ? std::numeric_limits<float>::quiet_NaN()
                               : (v == "inf" ? 1.0f : -1.0f) * std::numeric_limits<float>::infinity());
    } else {
      fail(path, f, "expected a number or one of \"-inf\", \"inf\", \"nan\", got " + v.dump());
    }
  }
  return out;
}

struct Options {
  std::string logits, mode = "seeded", row_key, out;
  std::optional<uint64_t> seed, tape_seed;
  uint32_t stream = 0;
  uint64_t step = 0, steps = 1;
  double temperature = 1.0, top_p = 1.0;
  int64_t top_k = 0;
  std::optional<double> u;
};

void run(const Options& o) {
  const auto mode = parse_mode(o.mode);
  if (!mode) fail({}, "--mode", "expected greedy, seeded or crn, got \"" + o.mode + "\"");
  SamplingParams p{.mode = *mode, .temperature = o.temperature, .top_p = o.top_p, .top_k = o.top_k,
                   .seed = 0, .stream = o.stream, .crn_row_key = o.row_key};
  if (*mode == SamplingMode::Seeded) {
    if (!o.seed) fail({}, "--seed", "seeded mode needs --seed");
    p.seed = *o.seed;
  } else if (*mode == SamplingMode::Crn) {
    if (!o.tape_seed) fail({}, "--tape-seed", "crn mode needs --tape-seed");
    if (o.row_key.empty()) fail({}, "--row-key", "crn mode needs --row-key");
    p.seed = *o.tape_seed;
  }
  // Each draw is a JSON object held in memory: a bound, not an out-of-memory kill.
  if (o.steps == 0 || o.steps > 1000000) fail({}, "--steps", "must be from 1 to 1000000");
  if (o.step > UINT64_MAX - o.steps) fail({}, "--step", "--step + --steps runs past the last step (2^64 - 1)");
  if (o.u && (*mode == SamplingMode::Greedy || !(*o.u >= 0.0 && *o.u < 1.0) || o.steps != 1))
    fail({}, "--u", "needs a sampling mode, a value in [0, 1) and --steps 1");
  const RowSampler row(p);  // validates the flags
  const std::vector<float> logits = read_logits(o.logits);

  ojson j;
  j["mode"] = mode_name(*mode);
  j["vocab"] = logits.size();
  ojson draws = ojson::array();
  try {
    if (*mode == SamplingMode::Greedy) {
      j["rng_state_sha256"] = nullptr;
      const int64_t tok = greedy_token(logits);
      for (uint64_t t = o.step; t < o.step + o.steps; ++t) draws.push_back({{"step", t}, {"token", tok}});
    } else {
      j["params"] = {{"temperature", p.temperature}, {"top_p", p.top_p}, {"top_k", p.top_k},
                     {"seed", p.seed}, {"stream", p.stream}, {"row_key", p.crn_row_key}};
      j["rng_state_sha256"] = row.rng_state_sha256();
      const Distribution d = warp(logits, p);
      j["survivors"] = d.ids;
      ojson probs = ojson::array();
      for (float q : d.probs) probs.push_back(double(q));  // exact: every float is a double
      j["probs"] = probs;
      for (uint64_t t = o.step; t < o.step + o.steps; ++t) {
        const double u = o.u ? *o.u : row.uniform_at(t);
        draws.push_back({{"step", t}, {"u", u}, {"token", inverse_cdf(d, u)}});
      }
    }
  } catch (const Error& e) {
    fail(o.logits, {}, e.what());  // the bad logit is in this file
  }
  j["draws"] = draws;
  const std::string text = j.dump(1) + "\n";
  if (o.out.empty())
    std::fputs(text.c_str(), stdout);
  else
    write_file_atomic(o.out, text);
}

cli::Registrar reg{{
    .name = "sample-debug",
    .help = "Debugging tool: apply one decoding contract to a logits row (JSON) and print the details",
    .setup =
        [](CLI::App& app) {
          static Options o;
          app.group("Debugging");
          app.footer(
              "Prints JSON: mode, vocab, params, rng_state_sha256 (state before the row's first draw),\n"
              "survivors (ids after temperature/top-k/top-p, ascending), probs (their float32\n"
              "probabilities), and draws [{step, u, token}] for steps --step .. --step+--steps-1.\n"
              "The contracts are in docs/decoding.md. For checking implementations, not for generation.");
          app.add_option("--logits", o.logits, "JSON array of float32 logits (\"-inf\" allowed)")
              ->required()
              ->check(CLI::ExistingFile);
          app.add_option("--mode", o.mode, "greedy | seeded | crn")->capture_default_str();
          app.add_option("--seed", o.seed, "Philox seed (seeded mode)");
          app.add_option("--stream", o.stream, "Philox stream: the row's identity (seeded mode)")
              ->capture_default_str();
          app.add_option("--tape-seed", o.tape_seed, "CRN tape seed (crn mode)");
          app.add_option("--row-key", o.row_key, "CRN row key, e.g. the source id (crn mode)");
          app.add_option("--step", o.step, "First step to draw")->capture_default_str();
          app.add_option("--steps", o.steps, "Number of consecutive steps to draw")->capture_default_str();
          app.add_option("--temperature", o.temperature, "Temperature > 0")->capture_default_str();
          app.add_option("--top-p", o.top_p, "Nucleus mass in [0, 1]; 1 = off")->capture_default_str();
          app.add_option("--top-k", o.top_k, "Top-k; 0 = off")->capture_default_str();
          app.add_option("--u", o.u, "Use this uniform instead of the generator's (checks the inverse CDF)");
          app.add_option("--out", o.out, "Write the JSON here instead of stdout");
          app.callback([] { run(o); });
        },
}};

}  // namespace
