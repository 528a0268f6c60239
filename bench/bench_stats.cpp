// `atlas analyze` on synthetic data shaped like the seed's largest trace (seed-system.md 3.13):
// 16 sources (4 per domain) x 8 conditions, 26 MoE layers, top-6 of 64 experts, 1,537 target
// tokens per condition (1,537 x 8 x 26 x 6 = 1,918,176 target route decisions) plus template
// tokens around the target (the full scope), 10 edges, 3 factorials, and 128 generated outputs
// of up to 512 ids; 10,000 paired source bootstrap replicates and 10,000 task replicates.
// Results: docs/benchmarks.md, section Statistics.
#include <benchmark/benchmark.h>

#include <cstdint>

#include "decode/rng.h"
#include "stats/analysis.h"

namespace {

using namespace atlas;
using namespace atlas::stats;

// Deterministic pseudo-random integers for the synthetic trace.
struct Gen {
  uint64_t seed, n = 0;
  uint32_t next() {
    const auto w = decode::philox4x32_10({uint32_t(n), uint32_t(n >> 32), 0, 0}, decode::philox_key(seed));
    ++n;
    return w[0];
  }
};

AnalysisInput full_depth_like() {
  AnalysisInput in;
  in.experts = 64;
  in.top_k = 6;
  for (int l = 1; l <= 26; ++l) in.layers.push_back(std::to_string(l));
  in.domains = {"english", "chinese", "code", "math"};
  in.conditions = {"s0_eos", "s0_bos", "s0_x", "s0_period", "s1_eos", "s1_bos", "s1_x", "s1_period"};
  for (uint32_t s = 0; s < 16; ++s) in.sources.push_back({.id = "src" + std::to_string(s), .domain = s / 4});
  // Edges: the 4 system edges, then BOS/x/period minus EOS at S0 and at S1.
  for (uint32_t b = 0; b < 4; ++b) in.edges.push_back({.name = "system@" + in.conditions[b], .condition = 4 + b, .reference = b});
  for (uint32_t s = 0; s < 2; ++s)
    for (uint32_t b = 1; b < 4; ++b)
      in.edges.push_back({.name = in.conditions[4 * s + b] + "-eos", .condition = 4 * s + b, .reference = 4 * s});
  for (uint32_t b = 1; b < 4; ++b)
    in.factorials.push_back({.name = "system x " + in.conditions[b], .factor_a = "system", .factor_b = "token",
                             .cell = {{0, b}, {4, 4 + b}}});
  Gen g{.seed = 20260729};
  const size_t L = 26, k = 6;
  for (uint32_t s = 0; s < 16; ++s) {
    const uint32_t target = s == 0 ? 97 : 96;  // 1,537 target tokens per condition
    for (uint32_t c = 0; c < 8; ++c) {
      const uint32_t prefix = 20 + (c >= 4 ? 16 : 0), T = prefix + target + 4;
      Cell cell{.id = "src" + std::to_string(s) + "/" + in.conditions[c], .source = s, .condition = c};
      cell.tokens = T;
      cell.target.assign(T, 0);
      for (uint32_t t = prefix; t < prefix + target; ++t) cell.target[t] = 1;
      cell.topk_ids.resize(L * T * k);
      cell.topk_weights.resize(L * T * k);
      for (size_t i = 0; i < L * T; ++i) {
        // Six distinct experts, skewed towards low ids so loads are uneven.
        uint64_t used = 0;
        for (size_t j = 0; j < k; ++j) {
          uint32_t e;
          do e = (g.next() % 64) * (g.next() % 64) / 64; while (used >> e & 1);
          used |= 1ull << e;
          cell.topk_ids[i * k + j] = int32_t(e);
          cell.topk_weights[i * k + j] = float(g.next() % 1000) / 1000.0f;
        }
      }
      std::vector<int32_t> gen(256 + g.next() % 257);
      for (auto& id : gen) id = int32_t(g.next() % 8);  // a small alphabet: many partial matches
      cell.generated = gen;
      cell.stop = g.next() % 8 ? "eos" : "length";
      cell.correct = g.next() % 2 == 0;
      in.cells.push_back(std::move(cell));
    }
  }
  validate_analysis_input(in);
  return in;
}

void BM_AnalyzeFullDepthTrace(benchmark::State& state) {
  static const AnalysisInput in = full_depth_like();
  AnalysisOptions opt;
  opt.bootstrap.replicates = uint32_t(state.range(0));
  opt.task_bootstrap.replicates = 10000;
  opt.bootstrap_weighted = state.range(1) != 0;
  opt.share_domain_replicates = state.range(2) == 0;
  size_t rows = 0, with_ci = 0;
  for (auto _ : state) {
    const ojson a = analyze(in, opt);
    rows = a["routing"]["stats"].size();
    with_ci = 0;
    for (const auto& r : a["routing"]["stats"]) with_ci += r.contains("ci") && r["ci"].is_array();
    benchmark::DoNotOptimize(rows);
  }
  state.counters["target_route_decisions"] = 1537.0 * 8 * 26 * 6;
  state.counters["routing_stats"] = double(rows);
  state.counters["routing_intervals"] = double(with_ci);
}
// Args: source replicates; 0 = the default resampling (count-load distributions of both
// scopes), 1 = also the weighted loads (--bootstrap-weighted); 0 = domain statistics shared
// between replicates that draw the same multiset (the default), 1 = every replicate evaluated
// from scratch (the straightforward reference path, for comparison).
BENCHMARK(BM_AnalyzeFullDepthTrace)
    ->Args({10000, 0, 0})
    ->Args({2000, 0, 0})
    ->Args({10000, 1, 0})
    ->Args({2000, 0, 1})
    ->Args({0, 0, 0})
    ->Unit(benchmark::kSecond)
    ->Iterations(1)
    ->UseRealTime();

}  // namespace
