// Unit tests for the decoding contracts (src/decode): Philox, the CRN tape, the warpers, the
// inverse-CDF draw and RowSampler. Expected values come from published test vectors, from the
// documented pre-images rebuilt byte by byte here, or from distributions whose float32
// probabilities are exact (equal logits over a power-of-two count).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <set>
#include <thread>

#include "core/error.h"
#include "core/sha256.h"
#include "decode/rng.h"
#include "decode/sampler.h"

namespace atlas::decode {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

std::string u32le(uint32_t v) {
  std::string s;
  for (int i = 0; i < 4; ++i) s.push_back(char(v >> (8 * i)));
  return s;
}
std::string u64le(uint64_t v) { return u32le(uint32_t(v)) + u32le(uint32_t(v >> 32)); }

// ---- Philox4x32-10 ------------------------------------------------------------------------

TEST(Philox, Random123KnownAnswers) {
  // Random123's kat_vectors for philox4x32 with 10 rounds: counter, key -> output.
  EXPECT_EQ(philox4x32_10({0, 0, 0, 0}, {0, 0}),
            (PhiloxCounter{0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8}));
  EXPECT_EQ(philox4x32_10({0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff}, {0xffffffff, 0xffffffff}),
            (PhiloxCounter{0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd}));
  EXPECT_EQ(philox4x32_10({0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344}, {0xa4093822, 0x299f31d0}),
            (PhiloxCounter{0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1}));
}

TEST(Philox, KeyAndCounterLayout) {
  const PhiloxPosition pos{.seed = 0x1122334455667788ull, .stream = 9, .step = 0x0000000500000003ull, .draw = 2};
  EXPECT_EQ(philox_key(pos.seed), (PhiloxKey{0x55667788, 0x11223344}));
  EXPECT_EQ(philox_counter(pos), (PhiloxCounter{2, 3, 5, 9}));
}

TEST(Philox, UniformBitRecipes) {
  EXPECT_EQ(uniform_float({0, 0, 0, 0}), 0.0f);
  EXPECT_EQ(uniform_float({0xffffffff, 0, 0, 0}), float((1 << 24) - 1) / float(1 << 24));
  EXPECT_EQ(uniform_float({0x80000000, 0, 0, 0}), 0.5f);
  EXPECT_EQ(uniform_float({0x000000ff, 0xffffffff, 7, 7}), 0.0f);  // only the top 24 bits of w0
  EXPECT_EQ(uniform_double({0xffffffff, 0xffffffff, 0, 0}), 1.0 - std::ldexp(1.0, -53));
  EXPECT_EQ(uniform_double({0x80000000, 0, 0, 0}), 0.5);
  EXPECT_EQ(uniform_double({0, 0x00000800, 0, 0}), std::ldexp(1.0, -53));  // lowest kept bit of w1
  EXPECT_EQ(uniform_double({0, 0x000007ff, 0, 0}), 0.0);                   // the 11 dropped bits
}

TEST(Philox, UniformsLookUniform) {
  double sum = 0;
  for (uint64_t t = 0; t < 20000; ++t) {
    const double u = philox_uniform({.seed = 12345, .stream = 3, .step = t, .draw = 0});
    ASSERT_GE(u, 0.0);
    ASSERT_LT(u, 1.0);
    sum += u;
  }
  EXPECT_NEAR(sum / 20000, 0.5, 0.01);  // 7 standard errors
}

TEST(Philox, StateHashIsTheDocumentedPreimage) {
  const PhiloxPosition pos{.seed = 0xfedcba9876543210ull, .stream = 4, .step = 0, .draw = 0};
  const std::string pre = std::string("atlas-rng-state-v1:philox4x32-10") + u32le(0x76543210) +
                          u32le(0xfedcba98) + u32le(0) + u32le(0) + u32le(0) + u32le(4);
  EXPECT_EQ(philox_state_sha256(pos), sha256_hex(pre));
  EXPECT_NE(philox_state_sha256(pos), philox_state_sha256({.seed = 1, .stream = 4}));
  EXPECT_NE(philox_state_sha256(pos), philox_state_sha256({.seed = pos.seed, .stream = 5}));
}

// ---- CRN tape -----------------------------------------------------------------------------

TEST(Crn, UniformIsTheDocumentedPreimage) {
  const std::string key = "humaneval/17";
  const std::string pre = "atlas-crn-v1" + u64le(20260729) + u32le(uint32_t(key.size())) + key + u64le(41);
  const auto d = Sha256().update(pre).digest();
  uint64_t x = 0;
  for (int i = 0; i < 8; ++i) x |= uint64_t(d[i]) << (8 * i);
  EXPECT_EQ(crn_uniform(20260729, key, 41), std::ldexp(double(x >> 11), -53));
  EXPECT_EQ(crn_state_sha256(20260729, key, 0),
            sha256_hex("atlas-rng-state-v1:crn-sha256" + u64le(20260729) + u32le(uint32_t(key.size())) + key +
                       u64le(0)));
}

TEST(Crn, TapeRowAndStepAllMatter) {
  const double u = crn_uniform(1, "a", 0);
  EXPECT_NE(u, crn_uniform(2, "a", 0));
  EXPECT_NE(u, crn_uniform(1, "b", 0));
  EXPECT_NE(u, crn_uniform(1, "a", 1));
  // The length prefix keeps ("ab", t) and ("a", ...) pre-images apart.
  EXPECT_NE(crn_uniform(1, "ab", 0), crn_uniform(1, "a", 0));
}

// ---- greedy -------------------------------------------------------------------------------

TEST(Greedy, ArgmaxTiesToLowerId) {
  const std::vector<float> l = {0.5f, 2.0f, -1.0f, 2.0f, 2.0f};
  EXPECT_EQ(greedy_token(l), 1);
  const std::vector<float> neg = {-kInf, -3.0f, -3.0f};
  EXPECT_EQ(greedy_token(neg), 1);
  const std::vector<float> with_inf = {1.0f, kInf, kInf};
  EXPECT_EQ(greedy_token(with_inf), 1);
}

TEST(Greedy, NaNAndEmptyAreErrors) {
  const std::vector<float> l = {0.5f, std::nanf(""), 3.0f};
  EXPECT_THROW(greedy_token(l), Error);
  EXPECT_THROW(greedy_token(std::span<const float>{}), Error);
}

// ---- portable exp --------------------------------------------------------------------------

TEST(ExpF32, MatchesCorrectlyRoundedExp) {
  // Reference: glibc's double exp (< 1 ulp) rounded to float32, which is the correctly rounded
  // float32 unless exp(x) lies within ~1e-16 of a rounding midpoint (odds ~1e-9 per value).
  EXPECT_EQ(exp_f32(0.0f), 1.0f);
  EXPECT_EQ(exp_f32(-0.0f), 1.0f);
  EXPECT_EQ(exp_f32(-200.0f), 0.0f);
  EXPECT_EQ(exp_f32(-104.0f), 0.0f);
  EXPECT_EQ(exp_f32(-103.0f), float(std::exp(-103.0)));  // a subnormal result
  std::mt19937 gen(11);
  std::uniform_real_distribution<float> wide(-104.0f, 0.0f), narrow(-1.0f, 0.0f);
  int mismatches = 0;
  for (int i = 0; i < 300000; ++i) {
    const float x = (i % 2) ? wide(gen) : narrow(gen);
    if (exp_f32(x) != float(std::exp(double(x)))) ++mismatches;
  }
  EXPECT_EQ(mismatches, 0);
}

// ---- warpers ------------------------------------------------------------------------------

SamplingParams sampled(double t, double p, int64_t k) {
  return {.mode = SamplingMode::Seeded, .temperature = t, .top_p = p, .top_k = k, .seed = 1};
}

TEST(Warp, EqualLogitsGiveExactProbabilities) {
  const std::vector<float> l(4, 1.5f);
  const Distribution d = warp(l, sampled(0.3, 1.0, 0));
  EXPECT_EQ(d.ids, (std::vector<int64_t>{0, 1, 2, 3}));
  EXPECT_EQ(d.probs, (std::vector<float>{0.25f, 0.25f, 0.25f, 0.25f}));
}

TEST(Warp, TopKKeepsTiesAtTheKthValue) {
  const std::vector<float> l = {1, 3, 3, 2, 3, 0};
  EXPECT_EQ(warp(l, sampled(1.0, 1.0, 2)).ids, (std::vector<int64_t>{1, 2, 4}));
  EXPECT_EQ(warp(l, sampled(1.0, 1.0, 4)).ids, (std::vector<int64_t>{1, 2, 3, 4}));
  EXPECT_EQ(warp(l, sampled(1.0, 1.0, 6)).ids.size(), 6u);
  EXPECT_EQ(warp(l, sampled(1.0, 1.0, 100)).ids.size(), 6u);
}

TEST(Warp, TopPRemovesTiesInAscendingIdOrder) {
  // Four equal tokens: probabilities 0.25 exactly, cumulative 0.25, 0.5, 0.75, 1 in
  // (logit, id) ascending order; remove where cumulative <= 1 - top_p.
  const std::vector<float> l(4, 0.0f);
  EXPECT_EQ(warp(l, sampled(1.0, 0.75, 0)).ids, (std::vector<int64_t>{1, 2, 3}));  // 0.25 <= 0.25
  EXPECT_EQ(warp(l, sampled(1.0, 0.5, 0)).ids, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(warp(l, sampled(1.0, 0.0, 0)).ids, (std::vector<int64_t>{3}));  // the last one is always kept
  EXPECT_EQ(warp(l, sampled(1.0, 0.76, 0)).ids, (std::vector<int64_t>{0, 1, 2, 3}));  // 0.25 > 0.24
  EXPECT_EQ(warp(l, sampled(1.0, 1.0, 0)).ids, (std::vector<int64_t>{0, 1, 2, 3}));
  const Distribution d = warp(l, sampled(1.0, 0.5, 0));
  EXPECT_EQ(d.probs, (std::vector<float>{0.5f, 0.5f}));  // renormalised over the survivors
}

TEST(Warp, TopPOrdersByLogitThenId) {
  // p = (a, b, a, b) with a ~ 0.0034: ascending order is id 0, id 2 (the small pair, lower id
  // first), then id 1, id 3; cumulative a, 2a, 2a + b, 1. With 1 - top_p = 0.1 both small
  // tokens go; with top_p = 0 only the last in that order (id 3) stays.
  const std::vector<float> l = {0.0f, 5.0f, 0.0f, 5.0f};
  EXPECT_EQ(warp(l, sampled(1.0, 0.9, 0)).ids, (std::vector<int64_t>{1, 3}));
  EXPECT_EQ(warp(l, sampled(1.0, 0.0, 0)).ids, (std::vector<int64_t>{3}));
  EXPECT_EQ(warp(l, sampled(1.0, 0.999, 0)).ids, (std::vector<int64_t>{0, 1, 2, 3}));  // 0.001 < a
}

TEST(Warp, MinusInfinityNeverSurvivesAndBadRowsThrow) {
  const std::vector<float> l = {-kInf, 1.0f, -kInf, 0.0f};
  EXPECT_EQ(warp(l, sampled(1.0, 1.0, 0)).ids, (std::vector<int64_t>{1, 3}));
  const std::vector<float> all_masked(3, -kInf);
  EXPECT_THROW(warp(all_masked, sampled(1.0, 1.0, 0)), Error);
  const std::vector<float> nan = {0.0f, std::nanf("")};
  EXPECT_THROW(warp(nan, sampled(1.0, 1.0, 0)), Error);
  const std::vector<float> pinf = {0.0f, kInf};
  EXPECT_THROW(warp(pinf, sampled(1.0, 1.0, 0)), Error);
  const std::vector<float> big = {3e38f, 0.0f};
  EXPECT_THROW(warp(big, sampled(0.1, 1.0, 0)), Error);  // overflows to +inf after temperature
  EXPECT_THROW(warp(std::span<const float>{}, sampled(1.0, 1.0, 0)), Error);
}

TEST(Warp, ParameterValidationNamesTheField) {
  const std::vector<float> l = {0.0f, 1.0f};
  auto msg = [&](SamplingParams p) {
    try {
      warp(l, p);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(msg(sampled(0.0, 1.0, 0)).find("temperature"), std::string::npos);
  EXPECT_NE(msg(sampled(-1.0, 1.0, 0)).find("temperature"), std::string::npos);
  EXPECT_NE(msg(sampled(1.0, 1.5, 0)).find("top_p"), std::string::npos);
  EXPECT_NE(msg(sampled(1.0, -0.1, 0)).find("top_p"), std::string::npos);
  EXPECT_NE(msg(sampled(1.0, 1.0, -1)).find("top_k"), std::string::npos);
  EXPECT_THROW(RowSampler({.mode = SamplingMode::Crn, .temperature = 1.0, .seed = 3}), Error);  // no row key
}

// The exact-sum heap walk in warp() against a plain full sort with double prefix sums (the
// torch CPU way), on random rows where the two conventions cannot differ by rounding luck.
TEST(Warp, TopPMatchesAFullSortReference) {
  std::mt19937 gen(7);
  std::normal_distribution<float> normal(0.0f, 3.0f);
  for (int trial = 0; trial < 60; ++trial) {
    const size_t V = 500 + size_t(trial) * 37;
    std::vector<float> l(V);
    for (auto& x : l) x = normal(gen);
    if (trial % 3 == 0)
      for (size_t i = 0; i < V; i += 7) l[i] = l[0];  // plenty of exact ties
    const double T = (trial % 4 == 0) ? 1.0 : 0.3 + 0.2 * (trial % 5);
    const double top_p = std::vector<double>{0.95, 0.5, 0.9, 0.99, 0.1}[size_t(trial) % 5];
    const int64_t k = trial % 6 == 5 ? 40 : 0;
    const SamplingParams p = sampled(T, top_p, k);

    std::vector<float> s(V);
    for (size_t i = 0; i < V; ++i) s[i] = l[i] / float(T);
    std::vector<size_t> order(V);
    for (size_t i = 0; i < V; ++i) order[i] = i;
    std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return s[a] < s[b]; });
    std::vector<char> alive(V, 1);
    if (k > 0)
      for (size_t r = 0; r + size_t(k) < V; ++r)
        if (s[order[r]] < s[order[V - size_t(k)]]) alive[order[r]] = 0;
    const float m = s[order.back()];
    double S = 0;
    for (size_t i = 0; i < V; ++i)
      if (alive[i]) S += double(std::exp(s[i] - m));
    double c = 0;
    std::set<int64_t> expected;
    for (size_t r = 0; r < V; ++r) {
      const size_t i = order[r];
      const float prob = alive[i] ? float(double(std::exp(s[i] - m)) / S) : 0.0f;
      c += prob;
      if (alive[i] && (float(c) > float(1.0 - top_p) || r + 1 == V)) expected.insert(int64_t(i));
    }
    const Distribution d = warp(l, p);
    const std::set<int64_t> got(d.ids.begin(), d.ids.end());
    EXPECT_EQ(got, expected) << "trial " << trial;
  }
}

// ---- inverse CDF --------------------------------------------------------------------------

TEST(InverseCdf, FirstCumulativeSumStrictlyAboveU) {
  const Distribution d{.ids = {3, 7, 9}, .probs = {0.25f, 0.5f, 0.25f}};
  EXPECT_EQ(inverse_cdf(d, 0.0), 3);
  EXPECT_EQ(inverse_cdf(d, 0.2499999), 3);
  EXPECT_EQ(inverse_cdf(d, 0.25), 7);  // 0.25 does not exceed 0.25
  EXPECT_EQ(inverse_cdf(d, 0.7499999), 7);
  EXPECT_EQ(inverse_cdf(d, 0.75), 9);
  EXPECT_EQ(inverse_cdf(d, 1.0 - 1e-16), 9);
}

TEST(InverseCdf, RoundingShortfallTakesTheLastSurvivor) {
  const Distribution d{.ids = {1, 2, 5}, .probs = {0.3f, 0.3f, 0.3f}};  // sums to ~0.9
  EXPECT_EQ(inverse_cdf(d, 0.95), 5);
  EXPECT_THROW(inverse_cdf(d, 1.0), Error);
  EXPECT_THROW(inverse_cdf(d, -0.1), Error);
}

TEST(InverseCdf, FloatAccumulationIsUsed) {
  // 0.1f + 0.2f in float32 is 0.300000011920928955078125, above the double 0.3 + 1e-9.
  const Distribution d{.ids = {0, 1, 2}, .probs = {0.1f, 0.2f, 0.7f}};
  EXPECT_EQ(inverse_cdf(d, 0.3 + 1e-9), 1);
  EXPECT_EQ(inverse_cdf(d, double(0.1f + 0.2f)), 2);
}

// ---- RowSampler ---------------------------------------------------------------------------

std::vector<float> wide_row(size_t V) {
  std::vector<float> l(V);
  for (size_t i = 0; i < V; ++i) l[i] = float(std::sin(double(i) * 0.37) * 2.0);
  return l;
}

std::vector<int64_t> run(RowSampler r, const std::vector<float>& l, int n) {
  std::vector<int64_t> out;
  for (int i = 0; i < n; ++i) out.push_back(r.next(l));
  return out;
}

TEST(RowSampler, SameSeedSameTokensDifferentSeedsDiffer) {
  const auto l = wide_row(1000);
  const SamplingParams a{.mode = SamplingMode::Seeded, .temperature = 1.0, .top_p = 0.95, .seed = 19683830};
  SamplingParams b = a;
  b.seed = 1560062173;
  SamplingParams c = a;
  c.stream = 1;
  EXPECT_EQ(run(RowSampler(a), l, 64), run(RowSampler(a), l, 64));
  EXPECT_NE(run(RowSampler(a), l, 64), run(RowSampler(b), l, 64));
  EXPECT_NE(run(RowSampler(a), l, 64), run(RowSampler(c), l, 64));
  EXPECT_NE(RowSampler(a).rng_state_sha256(), RowSampler(b).rng_state_sha256());
  EXPECT_EQ(RowSampler(a).rng_state_sha256(), philox_state_sha256({.seed = a.seed, .stream = 0}));
}

TEST(RowSampler, NextIsInverseCdfOfTheStepUniform) {
  const auto l = wide_row(300);
  const SamplingParams p{.mode = SamplingMode::Seeded, .temperature = 0.7, .top_p = 0.9, .top_k = 50, .seed = 5};
  RowSampler r(p);
  const Distribution d = warp(l, p);
  for (uint64_t t = 0; t < 20; ++t) {
    EXPECT_EQ(r.step(), t);
    const double u = philox_uniform({.seed = 5, .stream = 0, .step = t, .draw = 0});
    EXPECT_EQ(r.uniform_at(t), u);
    EXPECT_EQ(r.next(l), inverse_cdf(d, u));
  }
}

TEST(RowSampler, CrnConditionsShareEveryUniform) {
  const SamplingParams a{.mode = SamplingMode::Crn, .temperature = 0.3, .top_p = 0.95, .seed = 77,
                         .crn_row_key = "gsm8k/12"};
  SamplingParams b = a;  // another condition: other decoding parameters, same tape and row
  b.temperature = 1.0;
  b.top_p = 0.5;
  SamplingParams other_row = a;
  other_row.crn_row_key = "gsm8k/13";
  const RowSampler ra(a), rb(b), ro(other_row);
  for (uint64_t t = 0; t < 50; ++t) {
    EXPECT_EQ(ra.uniform_at(t), rb.uniform_at(t));
    EXPECT_EQ(ra.uniform_at(t), crn_uniform(77, "gsm8k/12", t));
    EXPECT_NE(ra.uniform_at(t), ro.uniform_at(t));
  }
  EXPECT_EQ(ra.rng_state_sha256(), rb.rng_state_sha256());
  EXPECT_EQ(ra.rng_state_sha256(), crn_state_sha256(77, "gsm8k/12", 0));
}

TEST(RowSampler, GreedyIgnoresWarpersAndHasNoState) {
  const std::vector<float> l = {0.1f, 0.9f, 0.9f, 0.2f};
  RowSampler r({.mode = SamplingMode::Greedy, .temperature = 0.0});  // greedy ignores temperature
  EXPECT_EQ(r.next(l), 1);
  EXPECT_EQ(r.step(), 1u);
  EXPECT_TRUE(r.rng_state_sha256().empty());
  EXPECT_THROW(r.uniform_at(0), Error);
}

TEST(RowSampler, ThreadsGiveTheSameTokensAsOneThread) {
  // Rows sampled concurrently (each thread has its own warp scratch) match a sequential run.
  const auto l = wide_row(4000);
  auto params = [](int r) {
    return SamplingParams{.mode = r % 2 ? SamplingMode::Seeded : SamplingMode::Crn, .temperature = 0.3 + 0.1 * r,
                          .top_p = 0.9, .top_k = r % 3 == 0 ? 0 : 200, .seed = uint64_t(100 + r),
                          .stream = uint32_t(r), .crn_row_key = "row" + std::to_string(r)};
  };
  std::vector<std::vector<int64_t>> seq(8), par(8);
  for (int r = 0; r < 8; ++r) seq[size_t(r)] = run(RowSampler(params(r)), l, 40);
  std::vector<std::thread> threads;
  for (int r = 0; r < 8; ++r)
    threads.emplace_back([&, r] { par[size_t(r)] = run(RowSampler(params(r)), l, 40); });
  for (auto& t : threads) t.join();
  EXPECT_EQ(seq, par);
}

TEST(SamplingMode, NamesRoundTrip) {
  for (auto m : {SamplingMode::Greedy, SamplingMode::Seeded, SamplingMode::Crn})
    EXPECT_EQ(parse_mode(mode_name(m)), m);
  EXPECT_FALSE(parse_mode("multinomial").has_value());
}

}  // namespace
}  // namespace atlas::decode
