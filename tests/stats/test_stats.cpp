// Hand-computed cases for the metric primitives, the bootstrap's reproducibility and thread
// independence, and the analysis input's error messages. The numpy/scipy comparison of every
// statistic is tests/stats/test_stats_vs_numpy.py.
#include <gtest/gtest.h>
#include <omp.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>

#include "core/error.h"
#include "stats/analysis.h"
#include "stats/bootstrap.h"
#include "stats/metrics.h"
#include "stats/plots.h"

using namespace atlas;
using namespace atlas::stats;

namespace {

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

}  // namespace

TEST(StatsMetrics, DetLogMatchesLibmWithinOneUlp) {
  EXPECT_EQ(det_log(1.0), 0.0);
  EXPECT_TRUE(std::isnan(det_log(0.0)));
  EXPECT_TRUE(std::isnan(det_log(-1.0)));
  double worst = 0;
  // Values spread over many binades, including both sides of sqrt(2) and subnormals.
  for (int i = 0; i < 200000; ++i) {
    const double x = std::ldexp(1.0 + double((i * 2654435761u) % 1000003u) / 1000003.0, (i % 300) - 150);
    const double want = std::log(x), got = det_log(x);
    const double ulp = std::fabs(std::nextafter(want, INFINITY) - want);
    worst = std::max(worst, std::fabs(got - want) / (ulp > 0 ? ulp : 1e-300));
  }
  EXPECT_LE(worst, 1.0);
  EXPECT_NEAR(det_log(4.9e-324), std::log(4.9e-324), 1e-12);
  EXPECT_DOUBLE_EQ(det_log(std::exp(1.0)), 1.0);
}

TEST(StatsMetrics, CoefficientOfVariationIsPopulationStdOverMean) {
  const std::vector<double> flat{0.25, 0.25, 0.25, 0.25};
  EXPECT_EQ(coefficient_of_variation(flat), 0.0);
  const std::vector<double> two{2, 0};  // mean 1, population std 1
  EXPECT_DOUBLE_EQ(coefficient_of_variation(two), 1.0);
  const std::vector<double> counts{1, 2, 3, 6};  // mean 3, var (4+1+0+9)/4 = 3.5
  EXPECT_DOUBLE_EQ(coefficient_of_variation(counts), std::sqrt(3.5) / 3.0);
  const std::vector<double> zeros{0, 0};
  EXPECT_TRUE(std::isnan(coefficient_of_variation(zeros)));
}

TEST(StatsMetrics, TotalVariationAndJensenShannon) {
  const std::vector<double> p{0.5, 0.5, 0}, q{0, 0.5, 0.5};
  EXPECT_DOUBLE_EQ(total_variation(p, q), 0.5);
  // Disjoint supports: JSD is exactly 1 bit.
  const std::vector<double> a{1, 0}, b{0, 1};
  EXPECT_NEAR(jensen_shannon_bits(a, b), 1.0, 1e-15);
  EXPECT_EQ(jensen_shannon_bits(p, p), 0.0);  // identical distributions give exactly 0
  // p = (1/2, 1/2, 0), q = (0, 1/2, 1/2): m = (1/4, 1/2, 1/4); KL(p||m) = 1/2 log2 2 = 1/2 bit each.
  EXPECT_NEAR(jensen_shannon_bits(p, q), 0.5, 1e-15);
}

TEST(StatsMetrics, TopkAgreement) {
  const std::vector<int32_t> a{1, 2, 3}, same{1, 2, 3}, perm{3, 2, 1}, other{1, 4, 5};
  auto x = topk_agreement(a, same);
  EXPECT_TRUE(x.ordered && x.set);
  EXPECT_EQ(x.jaccard, 1.0);
  x = topk_agreement(a, perm);
  EXPECT_FALSE(x.ordered);
  EXPECT_TRUE(x.set);
  EXPECT_EQ(x.jaccard, 1.0);
  x = topk_agreement(a, other);
  EXPECT_FALSE(x.ordered || x.set);
  EXPECT_DOUBLE_EQ(x.jaccard, 1.0 / 5.0);
}

TEST(StatsMetrics, HiddenRows) {
  const std::vector<float> x{1, 0}, y{0, 1}, z{3, 4}, zero{0, 0};
  EXPECT_EQ(cosine(compare_rows(x, y)), 0.0);
  EXPECT_DOUBLE_EQ(relative_l2(compare_rows(x, y)), std::sqrt(2.0));  // |(1,-1)| / |(0,1)|
  const RowPair same = compare_rows(z, z);
  EXPECT_TRUE(same.exact);
  EXPECT_DOUBLE_EQ(cosine(same), 1.0);
  EXPECT_EQ(relative_l2(same), 0.0);
  const RowPair p = compare_rows(x, z);  // a = (1,0), b = (3,4): |a-b| = sqrt(4+16), |b| = 5
  EXPECT_DOUBLE_EQ(relative_l2(p), std::sqrt(20.0) / 5.0);
  EXPECT_DOUBLE_EQ(cosine(p), 3.0 / 5.0);
  EXPECT_FALSE(p.exact);
  EXPECT_TRUE(std::isnan(relative_l2(compare_rows(x, zero))));
  // +0 and -0 are equal numbers but not bitwise equal rows.
  const std::vector<float> pz{0.0f, 1.0f}, nz{-0.0f, 1.0f};
  EXPECT_FALSE(compare_rows(pz, nz).exact);
}

TEST(StatsMetrics, OutputDivergence) {
  // kitten -> sitting as ids: 3 edits.
  const std::vector<int32_t> kitten{11, 9, 20, 20, 5, 14}, sitting{19, 9, 20, 20, 9, 14, 7}, empty{};
  EXPECT_EQ(levenshtein(kitten, sitting), 3u);
  EXPECT_EQ(levenshtein(sitting, kitten), 3u);
  EXPECT_EQ(levenshtein(empty, kitten), 6u);
  EXPECT_DOUBLE_EQ(token_similarity(kitten, sitting), 1.0 - 3.0 / 7.0);
  EXPECT_EQ(token_similarity(empty, empty), 1.0);
  EXPECT_EQ(token_similarity(empty, kitten), 0.0);
  EXPECT_EQ(common_prefix(kitten, sitting), 0u);
  const std::vector<int32_t> pre{11, 9, 20};
  EXPECT_EQ(common_prefix(kitten, pre), 3u);
  EXPECT_EQ(distinct_sequences({kitten, sitting, kitten, empty, empty}), 3u);
}

TEST(StatsMetrics, FactorialEffects) {
  const auto f = factorial_effects(/*m00=*/1, /*m10=*/3, /*m01=*/2, /*m11=*/7);
  EXPECT_DOUBLE_EQ(f.main_a, 0.5 * ((3 - 1) + (7 - 2)));
  EXPECT_DOUBLE_EQ(f.main_b, 0.5 * ((2 - 1) + (7 - 3)));
  EXPECT_DOUBLE_EQ(f.did, (7 - 2) - (3 - 1));
}

TEST(StatsMetrics, PercentileType7) {
  std::vector<double> v{4, 1, 3, 2};
  EXPECT_DOUBLE_EQ(percentile_type7(v, 0.25), 1.75);  // h = 0.75
  EXPECT_DOUBLE_EQ(percentile_type7(v, 0.0), 1.0);
  EXPECT_DOUBLE_EQ(percentile_type7(v, 1.0), 4.0);
  EXPECT_DOUBLE_EQ(percentile_type7(v, 0.5), 2.5);
  std::vector<double> one{7};
  EXPECT_EQ(percentile_type7(one, 0.975), 7.0);
  std::vector<double> with_nan{1, std::nan(""), 3};
  const Interval iv = percentile_interval(with_nan, 0.5);  // quantiles 0.25, 0.75 of {1, 3}
  EXPECT_EQ(iv.valid, 2u);
  EXPECT_DOUBLE_EQ(iv.lo, 1.5);
  EXPECT_DOUBLE_EQ(iv.hi, 2.5);
}

TEST(StatsBootstrap, DrawsReproducibleAndSeedDependent) {
  const BootstrapConfig a{.replicates = 50, .seed = 20260729}, b{.replicates = 50, .seed = 20260730};
  const BootstrapDraws d1(a, {4, 7}), d2(a, {4, 7}), d3(b, {4, 7});
  bool differ = false;
  for (uint32_t r = 0; r < 50; ++r)
    for (size_t s = 0; s < 2; ++s) {
      const auto x = d1.indices(s, r), y = d2.indices(s, r), z = d3.indices(s, r);
      EXPECT_TRUE(std::equal(x.begin(), x.end(), y.begin()));
      differ |= !std::equal(x.begin(), x.end(), z.begin());
      for (uint32_t i : x) EXPECT_LT(i, d1.units(s));
      std::vector<double> m(d1.units(s));
      d1.multiplicity(s, r, m);
      double sum = 0;
      for (double v : m) sum += v;
      EXPECT_EQ(sum, double(d1.units(s)));
    }
  EXPECT_TRUE(differ);
  // Replicates differ from each other (not one draw repeated).
  const auto r0 = d1.indices(1, 0), r1 = d1.indices(1, 1);
  EXPECT_FALSE(std::equal(r0.begin(), r0.end(), r1.begin()));
}

TEST(StatsBootstrap, IntervalsIndependentOfThreadCount) {
  const BootstrapConfig cfg{.replicates = 500, .seed = 3, .level = 0.95};
  const BootstrapDraws draws(cfg, {5, 3});
  const std::vector<double> x{0.1, 0.7, 0.2, 0.9, 0.4, 1.5, 2.5, 0.5};
  const std::vector<uint32_t> strata{0, 1};
  auto eval = [&](std::span<const double> m, std::span<double> out) {
    double num = 0, den = 0;
    for (size_t i = 0; i < m.size(); ++i) num += m[i] * x[i], den += m[i];
    out[0] = num / den;
    out[1] = m[0];
  };
  const int saved = omp_get_max_threads();
  omp_set_num_threads(1);
  const auto a = bootstrap_strata(draws, strata, 2, cfg, eval);
  omp_set_num_threads(3);
  const auto b = bootstrap_strata(draws, strata, 2, cfg, eval);
  omp_set_num_threads(saved);
  for (int i = 0; i < 2; ++i) {
    EXPECT_EQ(a[i].lo, b[i].lo);
    EXPECT_EQ(a[i].hi, b[i].hi);
  }
  EXPECT_LT(a[0].lo, a[0].hi);
  EXPECT_EQ(a[0].valid, 500u);
}

namespace {

json tiny_input() {
  return json::parse(R"({
    "format": "atlas-analysis-input-v1", "experts": 4, "top_k": 2, "layers": [1],
    "conditions": ["off", "on"], "domains": ["d0", "d1"],
    "sources": [{"id": "a", "domain": "d0"}, {"id": "b", "domain": "d0"}, {"id": "c", "domain": "d1"}],
    "edges": [{"name": "on-off", "condition": "on", "reference": "off"}],
    "cells": [
      {"source": "a", "condition": "off", "target_range": [1, 3],
       "routes": {"topk_ids": [[[0, 1], [1, 2], [2, 3]]], "topk_weights": [[[0.6, 0.4], [0.5, 0.5], [0.9, 0.1]]]},
       "generated_ids": [1, 2, 3], "stop": "eos"},
      {"source": "a", "condition": "on", "target_range": [2, 4],
       "routes": {"topk_ids": [[[3, 1], [0, 1], [1, 2], [3, 2]]], "topk_weights": [[[0.6, 0.4], [0.5, 0.5], [0.9, 0.1], [0.7, 0.3]]]},
       "generated_ids": [1, 2, 4], "stop": "length"},
      {"source": "b", "condition": "off", "routes": {"topk_ids": [[[0, 1]]], "topk_weights": [[[1, 0]]]}},
      {"source": "b", "condition": "on", "routes": {"topk_ids": [[[0, 2]]], "topk_weights": [[[0.5, 0.5]]]}},
      {"source": "c", "condition": "off", "routes": {"topk_ids": [[[3, 2]]], "topk_weights": [[[0.5, 0.5]]]}},
      {"source": "c", "condition": "on", "routes": {"topk_ids": [[[2, 3]]], "topk_weights": [[[0.5, 0.5]]]}}
    ]})");
}

AnalysisInput parse_ok(const json& j) {
  AnalysisInput in = parse_analysis_input(j, "in.json");
  in.files = {{.path = "in.json", .sha256 = ""}};
  validate_analysis_input(in);
  return in;
}

const ojson* find_row(const ojson& rows, const std::map<std::string, std::string>& want) {
  for (const auto& r : rows) {
    bool ok = true;
    for (const auto& [k, v] : want) ok = ok && r.contains(k) && r[k] == v;
    if (ok) return &r;
  }
  return nullptr;
}

}  // namespace

TEST(StatsAnalysis, HandComputedRoutingAndOutputs) {
  const AnalysisInput in = parse_ok(tiny_input());
  AnalysisOptions opt;
  opt.bootstrap.replicates = 0;
  opt.task_bootstrap.replicates = 0;
  const ojson a = analyze(in, opt);
  const ojson& st = a["routing"]["stats"];
  // Source a, target scope: off = tokens 1,2 -> {1,2},{2,3}; on = tokens 2,3 -> {1,2},{3,2}.
  // Aligned pairs: ({1,2},{1,2}) ordered-equal; ({2,3},{3,2}) set-equal only.
  const ojson* r = find_row(st, {{"metric", "ordered_exact_rate"}, {"domain", "d0"}});
  ASSERT_NE(r, nullptr);
  // d0 pools a (2 aligned tokens, 1 ordered match) and b (1 token, no match): 1/3.
  EXPECT_DOUBLE_EQ((*r)["value"].get<double>(), 1.0 / 3.0);
  r = find_row(st, {{"metric", "set_exact_rate"}, {"domain", "d0"}});
  EXPECT_DOUBLE_EQ((*r)["value"].get<double>(), 2.0 / 3.0);
  // d1, full scope, count, token: off {3,2} vs on {2,3}: identical loads -> TV 0, JSD 0.
  r = find_row(st, {{"metric", "tv"}, {"domain", "d1"}, {"scope", "full"}, {"kind", "count"}, {"aggregation", "token"}});
  EXPECT_EQ((*r)["value"].get<double>(), 0.0);
  r = find_row(st, {{"metric", "jsd_bits"}, {"domain", "d1"}, {"scope", "full"}, {"kind", "count"}, {"aggregation", "token"}});
  EXPECT_EQ((*r)["value"].get<double>(), 0.0);
  // d0, target, count: off pools a{1,2,2,3} + b{0,1} = (1,2,2,1)/6; on pools a{1,2,3,2} + b{0,2} = (1,1,3,1)/6.
  // TV = 1/2 (0 + 1/6 + 1/6 + 0) = 1/6 (token-weighted).
  r = find_row(st, {{"metric", "tv"}, {"domain", "d0"}, {"scope", "target"}, {"kind", "count"}, {"aggregation", "token"}});
  EXPECT_DOUBLE_EQ((*r)["value"].get<double>(), 1.0 / 6.0);
  // Prompt-balanced: off = mean of a (0,1,2,1)/4 and b (1,1,0,0)/2 = (1/4, 3/8, 1/4, 1/8);
  // on = mean of a (0,1,2,1)/4 and b (1,0,1,0)/2 = (1/4, 1/8, 1/2, 1/8); TV = 1/2 (1/4 + 1/4) = 1/4.
  r = find_row(st, {{"metric", "tv"}, {"domain", "d0"}, {"scope", "target"}, {"kind", "count"}, {"aggregation", "prompt"}});
  EXPECT_DOUBLE_EQ((*r)["value"].get<double>(), 0.25);
  // Outputs: one pair (source a): [1,2,3] vs [1,2,4]: prefix 2, distance 1, similarity 2/3.
  const ojson& os = a["outputs"]["stats"];
  EXPECT_DOUBLE_EQ((*find_row(os, {{"metric", "mean_common_prefix"}, {"domain", "d0"}}))["value"].get<double>(), 2.0);
  EXPECT_DOUBLE_EQ((*find_row(os, {{"metric", "mean_token_similarity"}, {"domain", "d0"}}))["value"].get<double>(),
                   1.0 - 1.0 / 3.0);
  // Source-blocked length contrast: 3 - 3 = 0 for the only source with outputs; EOS: 0 - 1 = -1.
  for (const auto& b : a["tasks"]["source_blocked"])
    if (b["edge"] == "on-off" && b["domain"] == "d0" && b["variable"] == "eos") {
      EXPECT_EQ(b["down"], 1);
      EXPECT_EQ(b["sources"][0]["value"], -1.0);
    }
}

TEST(StatsAnalysis, ThreadCountDoesNotChangeTheAnalysis) {
  const AnalysisInput in = parse_ok(tiny_input());
  AnalysisOptions opt;
  opt.bootstrap.replicates = 300;
  opt.task_bootstrap.replicates = 300;
  const int saved = omp_get_max_threads();
  omp_set_num_threads(1);
  const std::string a = analyze(in, opt).dump();
  omp_set_num_threads(4);
  const std::string b = analyze(in, opt).dump();
  omp_set_num_threads(saved);
  EXPECT_EQ(a, b);
  // Another seed gives other intervals (same point values). With two sources per domain the
  // 95% bounds sit on the extremes, so compare interquartile intervals.
  opt.bootstrap.level = 0.5;
  const ojson x = analyze(in, opt);
  opt.bootstrap.seed += 1;
  const ojson y = analyze(in, opt);
  EXPECT_TRUE(x["routing"]["stats"] != y["routing"]["stats"]);
  for (size_t i = 0; i < x["routing"]["stats"].size(); ++i)
    EXPECT_EQ(x["routing"]["stats"][i]["value"], y["routing"]["stats"][i]["value"]);
}

TEST(StatsAnalysis, PlotsAreSvg) {
  const AnalysisInput in = parse_ok(tiny_input());
  AnalysisOptions opt;
  opt.bootstrap.replicates = 10;
  opt.task_bootstrap.replicates = 10;
  const auto plots = make_plots(analyze(in, opt));
  ASSERT_FALSE(plots.empty());
  for (const auto& p : plots) {
    EXPECT_EQ(p.svg.rfind("<svg", 0), 0u) << p.file;
    EXPECT_NE(p.svg.find("</svg>"), std::string::npos) << p.file;
  }
}

TEST(StatsAnalysis, BadInputNamesFileAndField) {
  json j = tiny_input();
  j.erase("conditions");
  EXPECT_NE(error_of([&] { parse_ok(j); }).find("in.json: conditions: missing field"), std::string::npos);

  j = tiny_input();
  j["cells"][0]["source"] = "zz";
  EXPECT_NE(error_of([&] { parse_ok(j); }).find("cells[0].source: unknown source \"zz\""), std::string::npos);

  j = tiny_input();
  j["cells"][0]["routes"]["topk_ids"][0][1][0] = 9;
  EXPECT_NE(error_of([&] { parse_ok(j); }).find("cells[0].routes.topk_ids[0][1][0]"), std::string::npos);

  j = tiny_input();
  j["cells"][1]["routes"]["topk_weights"][0].erase(0);
  EXPECT_NE(error_of([&] { parse_ok(j); }).find("cells[1].routes.topk_weights[0]: expected 4 entries"),
            std::string::npos);

  j = tiny_input();
  j["domains"].push_back("empty");
  EXPECT_NE(error_of([&] { parse_ok(j); }).find("domain \"empty\" has no sources"), std::string::npos);

  j = tiny_input();
  j["cells"].erase(5);  // source c lacks condition "on"
  EXPECT_NE(error_of([&] { parse_ok(j); }).find("no routes for source \"c\", condition \"on\""), std::string::npos);

  j = tiny_input();
  j["cells"][1]["target_range"] = {1, 4};  // 3 target tokens vs 2 under "off"
  EXPECT_NE(error_of([&] { parse_ok(j); }).find("target tokens must align"), std::string::npos);

  j = tiny_input();
  j["format"] = "something-else";
  EXPECT_NE(error_of([&] { parse_ok(j); }).find("in.json: format: expected \"atlas-analysis-input-v1\""),
            std::string::npos);
}

TEST(StatsAnalysis, MixedManifestsNeedAllow) {
  const auto dir = std::filesystem::temp_directory_path() / ("atlas_stats_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  json a = tiny_input(), b = tiny_input();
  // Two halves of one grid: sources a, b in the first file, c in the second.
  a["cells"].erase(5), a["cells"].erase(4);
  b["cells"] = json::array({b["cells"][4], b["cells"][5]});
  a["manifest_sha256"] = "m1";
  b["manifest_sha256"] = "m2";
  const std::string pa = (dir / "a.json").string(), pb = (dir / "b.json").string();
  std::ofstream(pa) << a.dump();
  std::ofstream(pb) << b.dump();
  const std::string err = error_of([&] { read_analysis_input({pa, pb}, false); });
  EXPECT_NE(err.find(pb + ": manifest_sha256: inputs come from different manifests"), std::string::npos) << err;
  EXPECT_NE(err.find("--allow-mixed"), std::string::npos);
  const AnalysisInput m = read_analysis_input({pa, pb}, true);
  EXPECT_EQ(m.cells.size(), 6u);
  EXPECT_EQ(m.files.size(), 2u);
  b["manifest_sha256"] = "m1";
  std::ofstream(pb) << b.dump();
  EXPECT_EQ(read_analysis_input({pa, pb}, false).cells.size(), 6u);
  std::filesystem::remove_all(dir);
}

TEST(StatsBootstrap, CountedPercentileEqualsExpanded) {
  // Distinct values with multiplicities (ties, NaN, a single value) against the expanded list.
  uint64_t state = 12345;
  auto next = [&] { return (state = state * 6364136223846793005ull + 1442695040888963407ull) >> 33; };
  for (int trial = 0; trial < 200; ++trial) {
    std::vector<std::pair<double, uint32_t>> vc;
    std::vector<double> expanded;
    const size_t distinct = 1 + next() % 40;
    for (size_t i = 0; i < distinct; ++i) {
      double v = double(next() % 17) / 7.0 - 1.0;  // ties across entries too
      if (next() % 13 == 0) v = std::numeric_limits<double>::quiet_NaN();
      const uint32_t c = uint32_t(next() % 50);
      vc.push_back({v, c});
      for (uint32_t k = 0; k < c; ++k) expanded.push_back(v);
    }
    const double level = trial % 2 ? 0.95 : 0.5;
    const Interval a = percentile_interval(expanded, level);
    const Interval b = percentile_interval_counted(vc, level);
    ASSERT_EQ(a.valid, b.valid);
    if (a.valid == 0) continue;
    EXPECT_EQ(a.lo, b.lo) << trial;
    EXPECT_EQ(a.hi, b.hi) << trial;
  }
}

namespace {

// A random routing grid: domains with the given source counts, 4 conditions (a 2x2), edges,
// a factorial, target scopes inside longer inputs, and generations with verdicts.
AnalysisInput random_grid(const std::vector<uint32_t>& per_domain, uint64_t seed) {
  uint64_t state = seed;
  auto next = [&] { return uint32_t((state = state * 6364136223846793005ull + 1442695040888963407ull) >> 33); };
  AnalysisInput in;
  in.experts = 8;
  in.top_k = 3;
  in.layers = {"1", "2"};
  in.conditions = {"s0f0", "s1f0", "s0f1", "s1f1"};
  for (size_t d = 0; d < per_domain.size(); ++d) {
    in.domains.push_back("d" + std::to_string(d));
    for (uint32_t i = 0; i < per_domain[d]; ++i)
      in.sources.push_back({.id = std::string("d") + std::to_string(d) + "s" + std::to_string(i), .domain = uint32_t(d)});
  }
  in.edges = {{.name = "system@f0", .condition = 1, .reference = 0},
              {.name = "system@f1", .condition = 3, .reference = 2},
              {.name = "oneshot@s0", .condition = 2, .reference = 0}};
  in.factorials = {{.name = "system x oneshot", .factor_a = "system", .factor_b = "oneshot", .cell = {{0, 2}, {1, 3}}}};
  for (uint32_t s = 0; s < in.sources.size(); ++s) {
    const uint32_t target = 2 + next() % 5;
    for (uint32_t c = 0; c < 4; ++c) {
      const uint32_t prefix = 1 + next() % 3 + (c % 2) * 2, T = prefix + target + next() % 2;
      Cell cell{.id = in.sources[s].id + "/" + in.conditions[c], .source = s, .condition = c};
      cell.tokens = T;
      cell.target.assign(T, 0);
      for (uint32_t t = prefix; t < prefix + target; ++t) cell.target[t] = 1;
      for (size_t i = 0; i < in.layers.size() * T; ++i) {
        uint32_t used = 0;
        for (int j = 0; j < 3; ++j) {
          uint32_t e;
          do e = next() % 8; while (used >> e & 1);
          used |= 1u << e;
          cell.topk_ids.push_back(int32_t(e));
          cell.topk_weights.push_back(float(1 + next() % 100) / 100.0f);
        }
      }
      std::vector<int32_t> gen(next() % 6);
      for (auto& g : gen) g = int32_t(next() % 3);
      cell.generated = gen;
      cell.stop = next() % 3 ? "eos" : "length";
      if (next() % 4) cell.correct = next() % 2 == 0;
      in.cells.push_back(std::move(cell));
    }
  }
  validate_analysis_input(in);
  return in;
}

}  // namespace

TEST(StatsAnalysis, SharedDomainReplicatesEqualTheStraightforwardPath) {
  // The default routing bootstrap evaluates each domain once per distinct multiset of draws
  // and pools cached sums; it must give the same bits as evaluating every replicate from
  // its multiplicities (run_block), for every resampling option, with and without a pooled
  // group, and with domains of 1 to 6 sources (few or many distinct multisets).
  for (const auto& shape : std::vector<std::vector<uint32_t>>{{2, 3, 4, 1}, {6}, {3, 5}}) {
    const AnalysisInput in = random_grid(shape, 99 + shape.size());
    for (int mode = 0; mode < 3; ++mode) {
      AnalysisOptions opt;
      opt.bootstrap = {.replicates = 150, .seed = 7, .level = mode == 2 ? 0.5 : 0.95};
      opt.task_bootstrap.replicates = 20;
      opt.bootstrap_full_scope = mode != 1;
      opt.bootstrap_weighted = mode == 2;
      const ojson fast = analyze(in, opt);
      opt.share_domain_replicates = false;
      const ojson slow = analyze(in, opt);
      ASSERT_EQ(fast["routing"]["stats"].size(), slow["routing"]["stats"].size());
      size_t with_ci = 0;
      for (size_t i = 0; i < fast["routing"]["stats"].size(); ++i) {
        EXPECT_EQ(fast["routing"]["stats"][i].dump(), slow["routing"]["stats"][i].dump());
        with_ci += fast["routing"]["stats"][i]["ci"].is_array();
      }
      EXPECT_GT(with_ci, 0u);
      EXPECT_EQ(fast.dump(), slow.dump());
    }
  }
}

TEST(StatsAnalysis, DefaultResamplesBothScopesOfCountLoads) {
  const AnalysisInput in = random_grid({3, 3}, 5);
  AnalysisOptions opt;
  opt.bootstrap.replicates = 100;
  opt.task_bootstrap.replicates = 10;
  const ojson a = analyze(in, opt);
  size_t checked = 0;
  for (const auto& r : a["routing"]["stats"]) {
    if (!r.contains("kind")) continue;
    const bool want = r["kind"] == "count";  // both scopes; weighted loads keep point values
    EXPECT_EQ(r["ci"].is_array(), want) << r.dump();
    ++checked;
  }
  EXPECT_GT(checked, 0u);
  EXPECT_NE(a["settings"]["resampled_expert_distributions"].get<std::string>().find("scope target and full, kind count;"),
            std::string::npos);
}

TEST(StatsAnalysis, CorrectnessContrastsAndDesign) {
  // Hand-built pairs: edge on-off over (source, repeat) pairs with both verdicts.
  json j = tiny_input();
  j["cells"] = json::array();
  j["edges"] = json::array({{{"name", "on-off"}, {"condition", "on"}, {"reference", "off"}}});
  j.erase("layers");
  // source a: repeats r0 (on correct, off incorrect), r1 (both correct), r2 (on has no verdict);
  // source c: r0 (on incorrect, off correct).
  auto cell = [](const char* s, const char* c, const char* r, std::optional<bool> ok) {
    json x = {{"source", s}, {"condition", c}, {"repeat", r}, {"generated_ids", {1}}, {"stop", "eos"}};
    if (ok) x["correct"] = *ok, x["terminal"] = *ok ? "final_marker" : "no_marker";
    return x;
  };
  for (const auto& x : {cell("a", "on", "r0", true), cell("a", "off", "r0", false), cell("a", "on", "r1", true),
                        cell("a", "off", "r1", true), cell("a", "on", "r2", std::nullopt), cell("a", "off", "r2", false),
                        cell("c", "on", "r0", false), cell("c", "off", "r0", true)})
    j["cells"].push_back(x);
  j["sources"].erase(1);  // b has no cells
  const AnalysisInput in = parse_ok(j);
  AnalysisOptions opt;
  opt.bootstrap.replicates = 0;
  opt.task_bootstrap.replicates = 0;
  const ojson a = analyze(in, opt);
  const ojson* r = find_row(a["outputs"]["stats"], {{"metric", "correct_rate_difference"}, {"domain", "all"}});
  ASSERT_NE(r, nullptr);
  // 3 pairs with both verdicts: (on, off) = (1,0), (1,1), (0,1): difference (1 - 1) / 3 = 0.
  EXPECT_EQ((*r)["pairs"], 3);
  EXPECT_EQ((*r)["both_correct"], 1);
  EXPECT_EQ((*r)["condition_only"], 1);
  EXPECT_EQ((*r)["reference_only"], 1);
  EXPECT_EQ((*r)["neither"], 0);
  EXPECT_EQ((*r)["value"].get<double>(), 0.0);
  r = find_row(a["outputs"]["stats"], {{"metric", "correct_rate_difference"}, {"domain", "d0"}});
  EXPECT_DOUBLE_EQ((*r)["value"].get<double>(), 0.5);  // source a: (1,0), (1,1)
  r = find_row(a["outputs"]["stats"], {{"metric", "correct_rate_condition"}, {"domain", "d0"}});
  EXPECT_DOUBLE_EQ((*r)["value"].get<double>(), 1.0);
  r = find_row(a["outputs"]["stats"], {{"metric", "correct_rate_reference"}, {"domain", "d1"}});
  EXPECT_DOUBLE_EQ((*r)["value"].get<double>(), 1.0);
  // Terminal ledger: d0 "on": final_marker x2, unknown x1.
  bool seen = false;
  for (const auto& l : a["outputs"]["ledgers"])
    if (l["domain"] == "d0" && l["condition"] == "on") {
      EXPECT_EQ(l["terminal"]["final_marker"], 2);
      EXPECT_EQ(l["terminal"]["unknown"], 1);
      seen = true;
    }
  EXPECT_TRUE(seen);
  EXPECT_EQ(a["design"]["edges"][0]["condition"], "on");
  EXPECT_EQ(a["design"]["origin"], "declared in the analysis input");
}

TEST(StatsAnalysis, DuplicateEdgesAndBadFactorialsAreRefused) {
  json j = tiny_input();
  j["edges"].push_back({{"name", "again"}, {"condition", "on"}, {"reference", "off"}});
  EXPECT_NE(error_of([&] { parse_ok(j); }).find("in.json: edges[1]: duplicates edge \"on-off\" (on vs off)"), std::string::npos)
      << error_of([&] { parse_ok(j); });
  j = tiny_input();
  j["edges"].push_back({{"name", "on-off"}, {"condition", "off"}, {"reference", "on"}});
  EXPECT_NE(error_of([&] { parse_ok(j); }).find("in.json: edges[1].name: edge name \"on-off\" used twice"), std::string::npos);
}
