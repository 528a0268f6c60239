// decode/sample_core.h (the algorithm the CUDA sampling kernel runs, here compiled for the host)
// against the host contract decode::warp + decode::inverse_cdf: identical tokens, survivor ids
// and float32 probabilities over many random rows, and the same error (with the same token
// index) on bad logits. The GPU test (tests/cuda/test_cuda_sample.cpp) then only has to show
// kernel == sample_row().
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <string>

#include "core/error.h"
#include "decode/sample_core.h"
#include "decode/sampler.h"

namespace atlas::decode {
namespace {

namespace sc = atlas::sample_core;
constexpr float kInf = std::numeric_limits<float>::infinity();

float bf16_round(float f) {  // round to nearest even at bf16 (the CUDA backend's logits dtype)
  uint32_t u = std::bit_cast<uint32_t>(f);
  u += 0x7fffu + ((u >> 16) & 1u);
  return std::bit_cast<float>(u & 0xffff0000u);
}

struct Case {
  std::vector<float> logits;
  SamplingParams params;
  double u = 0.0;
  std::string describe() const {
    return "V=" + std::to_string(logits.size()) + " T=" + std::to_string(params.temperature) +
           " top_p=" + std::to_string(params.top_p) + " top_k=" + std::to_string(params.top_k) +
           " u=" + std::to_string(u);
  }
};

// Random rows: spreads from near-ties to huge, bf16-rounded (many exact ties) or quantized to
// a few values, -inf tokens, -0.0; temperatures from 1e-4 to 1e4; top_k 0/1/k/V/V+3; top_p
// 0/0.5/0.95/1/random; u at 0, just above 0, just below 1 and random.
Case random_case(std::mt19937_64& g, int vocab) {
  std::uniform_real_distribution<double> U(0.0, 1.0);
  auto pick = [&](int n) { return int(g() % uint64_t(n)); };
  Case c;
  c.logits.resize(size_t(vocab));
  const double spreads[] = {1e-3, 0.5, 3.0, 20.0, 300.0};
  const double spread = spreads[pick(5)];
  std::normal_distribution<double> N(pick(3) == 0 ? -50.0 : 0.0, spread);
  const int style = pick(4);
  for (auto& x : c.logits) {
    double v = N(g);
    if (style == 1) v = std::round(v / spread * 2.0) * 0.25;  // a handful of values: many ties
    float f = float(v);
    if (style != 3) f = bf16_round(f);
    x = f;
  }
  if (pick(3) == 0)
    for (int i = 0, n = 1 + pick(std::max(1, vocab / 3)); i < n; ++i) c.logits[size_t(pick(vocab))] = -kInf;
  if (pick(6) == 0) c.logits[size_t(pick(vocab))] = -0.0f;
  if (pick(6) == 0) c.logits[size_t(pick(vocab))] = 0.0f;
  const double temps[] = {1.0, 0.3, 0.7, 1.5, 1e-4, 1e4, 0.05};
  const double ps[] = {1.0, 0.95, 0.5, 0.0, 0.9999, U(g)};
  c.params = {.mode = SamplingMode::Seeded, .temperature = temps[pick(7)], .top_p = ps[pick(6)]};
  switch (pick(6)) {
    case 0: c.params.top_k = 0; break;
    case 1: c.params.top_k = 1; break;
    case 2: c.params.top_k = vocab; break;
    case 3: c.params.top_k = vocab + 3; break;
    default: c.params.top_k = 1 + pick(std::min(vocab, 2000)); break;
  }
  switch (pick(5)) {
    case 0: c.u = 0.0; break;
    case 1: c.u = std::ldexp(1.0, -53) * double(1 + pick(1000)); break;
    case 2: c.u = 1.0 - std::ldexp(1.0, -53) * double(1 + pick(4)); break;
    default: c.u = std::ldexp(double(g() >> 11), -53); break;
  }
  return c;
}

sc::RowParams row_params(const Case& c) {
  return sc::make_row_params(c.params.temperature, c.params.top_p, c.params.top_k, c.u);
}

// Compares one case (gtest assertions name the case).
void check_case(const Case& c) {
  sc::Survivors got;
  const int32_t tok = sc::sample_row(c.logits.data(), int(c.logits.size()), row_params(c), &got);
  Distribution want;
  try {
    want = warp(c.logits, c.params);
  } catch (const Error& e) {
    ASSERT_LT(tok, 0) << c.describe() << ": the host contract fails (" << e.what() << "), the core drew " << tok;
    const int32_t code = (-tok) & 7, index = (-tok) >> 3;
    if (code != sc::kNoFinite) {
      EXPECT_NE(std::string(e.what()).find("logits[" + std::to_string(index) + "]"), std::string::npos)
          << c.describe() << ": core says " << sc::error_name(code) << " at " << index << ", host: " << e.what();
    }
    return;
  }
  ASSERT_GE(tok, 0) << c.describe() << ": the core failed with " << sc::error_name((-tok) & 7);
  ASSERT_EQ(got.ids.size(), want.ids.size()) << c.describe();
  for (size_t j = 0; j < got.ids.size(); ++j) {
    ASSERT_EQ(got.ids[j], want.ids[j]) << c.describe() << " survivor " << j;
    ASSERT_EQ(std::bit_cast<uint32_t>(got.probs[j]), std::bit_cast<uint32_t>(want.probs[j]))
        << c.describe() << " survivor " << j << " id " << got.ids[j] << ": " << got.probs[j] << " vs "
        << want.probs[j];
  }
  ASSERT_EQ(tok, inverse_cdf(want, c.u)) << c.describe();
  // The driver without the survivor list stops at the token: the same token.
  ASSERT_EQ(sc::sample_row(c.logits.data(), int(c.logits.size()), row_params(c)), tok) << c.describe();
}

TEST(SampleCore, ExpF32MatchesTheHostContract) {
  std::mt19937 gen(5);
  std::uniform_real_distribution<float> wide(-110.0f, 0.0f), narrow(-1.0f, 0.0f);
  int mismatches = 0;
  for (int i = 0; i < 300000; ++i) {
    const float x = (i % 2) ? wide(gen) : narrow(gen);
    if (std::bit_cast<uint32_t>(sc::exp_f32(x)) != std::bit_cast<uint32_t>(exp_f32(x))) ++mismatches;
  }
  for (float x : {0.0f, -0.0f, -104.0f, -103.99f, -1e-30f, -87.5f})
    if (sc::exp_f32(x) != exp_f32(x)) ++mismatches;
  EXPECT_EQ(mismatches, 0);
}

TEST(SampleCore, OrderKeyIsMonotoneAndFoldsSignedZero) {
  const float v[] = {-kInf, -3e38f, -1.0f, -1e-45f, -0.0f, 0.0f, 1e-45f, 1.0f, 3e38f, kInf};
  for (size_t i = 0; i + 1 < std::size(v); ++i)
    if (v[i] < v[i + 1]) {
      EXPECT_LT(sc::order_key(v[i]), sc::order_key(v[i + 1])) << v[i];
    }
  EXPECT_EQ(sc::order_key(-0.0f), sc::order_key(0.0f));
  EXPECT_EQ(sc::order_key(-kInf), sc::kNegInfKey);
  for (float x : {-2.5f, 0.0f, 1e-45f, 7.0f, -kInf}) EXPECT_EQ(sc::key_value(sc::order_key(x)), x);
}

TEST(SampleCore, ExactSumRoundsLikeADoubleSum) {
  // Sums that a double holds exactly must come back exactly; the rounding case (2^0 + 2^-60)
  // must round to nearest even.
  sc::Acc a;
  sc::acc_zero(a);
  sc::acc_add(a, 1.0f);
  sc::acc_add(a, 0.5f);
  sc::acc_add(a, 1e-45f);
  EXPECT_EQ(sc::to_double(sc::normalize(a)), 1.5 + double(1e-45f));  // 1.5 + 2^-149 rounds to 1.5
  sc::acc_zero(a);
  sc::acc_add(a, 1e-45f);
  sc::acc_add(a, 1e-45f);
  EXPECT_EQ(sc::to_double(sc::normalize(a)), 2.0 * double(1e-45f));
  sc::acc_zero(a);
  std::mt19937 gen(3);
  std::uniform_real_distribution<float> d(0.0f, 1.0f);
  double ref = 0;  // exact: 24-bit values over 18 binades, 1000 of them, fit 53 bits
  for (int i = 0; i < 1000; ++i) {
    const float f = std::ldexp(d(gen), -(i % 18));
    sc::acc_add(a, f);
    ref += f;
  }
  EXPECT_EQ(sc::to_double(sc::normalize(a)), ref);
}

TEST(SampleCore, TopPThresholdTestRoundsTiesToEven) {
  // removable(x) must be "float32(x) <= t" for exact x, including x exactly at the midpoint of
  // t and the next float (a tie: rounds to the even one). Random rows rarely hit a midpoint.
  std::mt19937 gen(9);
  std::uniform_real_distribution<float> d(1e-6f, 0.999f);
  for (int i = 0; i < 20000; ++i) {
    const float t = d(gen), t1 = std::nextafter(t, 2.0f);
    const sc::TopPBound b = sc::make_bound(t);
    const float ulp = t1 - t;  // exact
    // x = t + delta, exact in a double: at the midpoint, 2^-20 ulp either side, t, t'.
    for (float delta : {0.5f * ulp, 0.5f * ulp - std::ldexp(ulp, -20), 0.5f * ulp + std::ldexp(ulp, -20), 0.0f, ulp}) {
      const double x = double(t) + double(delta);
      sc::Acc a;
      sc::acc_zero(a);
      sc::acc_add(a, t);
      sc::acc_add(a, delta);
      ASSERT_EQ(sc::removable(sc::normalize(a), b), float(x) <= t) << "t=" << t << " x=" << x;
    }
  }
}

TEST(SampleCore, SmallRowsMatchWarpAndInverseCdf) {
  std::mt19937_64 g(20240611);
  const int vocabs[] = {1, 2, 3, 4, 5, 7, 16, 37, 100, 257, 1000};
  for (int n = 0; n < 20000; ++n) {
    const Case c = random_case(g, vocabs[n % std::size(vocabs)]);
    check_case(c);
    if (HasFatalFailure()) return;
  }
}

TEST(SampleCore, DeepSeekSizedRowsMatchWarpAndInverseCdf) {
  std::mt19937_64 g(77);
  for (int n = 0; n < 48; ++n) {
    const Case c = random_case(g, n % 3 == 0 ? 102400 : 65537);
    check_case(c);
    if (HasFatalFailure()) return;
  }
}

TEST(SampleCore, HandPickedEdges) {
  // Four equal logits, top_p = 0.75: id 0's cumulative 0.25 is <= 0.25, ids 1..3 survive
  // (docs/decoding.md); top_p = 0 keeps one token; top_k = 1 with a tie at the max keeps both.
  std::vector<Case> cases;
  cases.push_back({{1, 1, 1, 1}, {.mode = SamplingMode::Seeded, .top_p = 0.75}, 0.0});
  cases.push_back({{1, 1, 1, 1}, {.mode = SamplingMode::Seeded, .top_p = 0.0}, 0.999});
  cases.push_back({{3, 1, 3, 2}, {.mode = SamplingMode::Seeded, .top_k = 1}, 0.7});
  cases.push_back({{-kInf, 2, -kInf}, {.mode = SamplingMode::Seeded, .top_p = 0.3, .top_k = 2}, 0.5});
  cases.push_back({{-kInf, -kInf}, {.mode = SamplingMode::Seeded}, 0.5});                      // no finite
  cases.push_back({{0, std::nanf(""), kInf}, {.mode = SamplingMode::Seeded}, 0.5});             // NaN at 1
  cases.push_back({{0, 1, kInf}, {.mode = SamplingMode::Seeded}, 0.5});                         // +inf at 2
  cases.push_back({{0, 3e38f, 1}, {.mode = SamplingMode::Seeded, .temperature = 0.01}, 0.5});  // overflow
  cases.push_back({{-0.0f, 0.0f, -0.0f}, {.mode = SamplingMode::Seeded, .top_p = 0.5}, 0.9});
  for (const auto& c : cases) {
    check_case(c);
    if (HasFatalFailure()) return;
  }
  sc::Survivors s;
  EXPECT_EQ(sc::sample_row(cases[0].logits.data(), 4, row_params(cases[0]), &s), 1);
  EXPECT_EQ(s.ids, (std::vector<int32_t>{1, 2, 3}));
}

}  // namespace
}  // namespace atlas::decode
