// The attention-pattern hook on the CUDA backend: the host layout of slot probabilities over
// the timeline (runs everywhere), and the device kernel against its CPU reference (GPU).
#include <algorithm>
#include <cmath>

#include "backend/cuda/reference.h"
#include "cuda_test_util.h"

namespace atlas::cuda::test {
namespace {

// ---- host-only (runs in CI too) ---------------------------------------------------------------

// Two rows, two earlier tokens each, then a call of T = 2. Row 0: a padding token, then real
// ones (slots 0, 1, 2). Row 1: real, real, real (slots 0-2), then a padding query. Every value
// is read from the slot it names; padding keys and keys past a query's length read 0.
TEST(PatternLayout, SlotProbabilitiesLandOnTheirTimelinePositions) {
  const int64_t B = 2, T = 2, H = 2, S = 3, Tk = 4;
  const std::vector<int32_t> key_slot = {-1, 0, 1, 2, /* row 1 */ 0, 1, 2, -1};
  const std::vector<int32_t> qlen = {2, 3, /* row 1 */ 3, 3};
  std::vector<float> probs(size_t(B * T * H * S));
  const auto v = [](int64_t m, int64_t h, int64_t s) { return float(100 * m + 10 * h + s + 1); };
  for (int64_t m = 0; m < B * T; ++m)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t s = 0; s < S; ++s) probs[size_t((m * H + h) * S + s)] = v(m, h, s);
  const std::vector<float> out = pattern_to_timeline(probs, key_slot, qlen.data(), B, T, H, S, Tk);
  ASSERT_EQ(out.size(), size_t(B * H * T * Tk));
  const auto at = [&](int64_t b, int64_t h, int64_t t, int64_t j) { return out[size_t(((b * H + h) * T + t) * Tk + j)]; };
  for (int64_t h = 0; h < H; ++h) {
    // row 0, t = 0 (query m = 0 sees slots 0, 1): padding key 0, slot 0 at j = 1, slot 1 at j = 2, j = 3 hidden
    EXPECT_EQ(at(0, h, 0, 0), 0.0f);
    EXPECT_EQ(at(0, h, 0, 1), v(0, h, 0));
    EXPECT_EQ(at(0, h, 0, 2), v(0, h, 1));
    EXPECT_EQ(at(0, h, 0, 3), 0.0f);
    // row 0, t = 1 (m = 1 sees slots 0-2)
    EXPECT_EQ(at(0, h, 1, 0), 0.0f);
    EXPECT_EQ(at(0, h, 1, 3), v(1, h, 2));
    // row 1, t = 0 (m = 2) and the padding query t = 1 (m = 3): slots 0-2 at j = 0-2, the padding key 0
    for (int64_t t = 0; t < 2; ++t) {
      for (int64_t j = 0; j < 3; ++j) EXPECT_EQ(at(1, h, t, j), v(2 + t, h, j));
      EXPECT_EQ(at(1, h, t, 3), 0.0f);
    }
  }
  EXPECT_THROW(pattern_to_timeline(probs, key_slot, qlen.data(), B, T, H, S + 1, Tk), Error);
  EXPECT_THROW(pattern_to_timeline(probs, {0, 1}, qlen.data(), B, T, H, S, Tk), Error);
}

TEST(PatternReference, RowsAreSoftmaxesOfTheScaledScores) {
  // One query, one head, width 2, three slots of a row of four: p = softmax(scale * q.c) over
  // the first three, 0 after; f32 (no rounding) against double math.
  const std::vector<float> q = {1.0f, -2.0f}, cache = {0.5f, 0.25f, -1.0f, 1.0f, 2.0f, 0.0f, 9.0f, 9.0f};
  const std::vector<int32_t> len = {3};
  std::vector<float> out(4, -1.0f);
  ref::mla_pattern(MlaPatternArgsT<float>{.q = q.data(), .latent_cache = cache.data(), .cache_row_stride = 8,
                                          .lengths = len.data(), .out = out.data(), .rows = 1, .heads = 1, .width = 2,
                                          .slots = 4, .scale = 0.5f});
  const double s[3] = {0.5 * (0.5 - 0.5), 0.5 * (-1.0 - 2.0), 0.5 * 2.0};
  double z = 0;
  for (double x : s) z += std::exp(x);
  for (int j = 0; j < 3; ++j) EXPECT_NEAR(out[size_t(j)], std::exp(s[j]) / z, 1e-6) << j;
  EXPECT_EQ(out[3], 0.0f);
  const std::vector<int32_t> bad = {5};
  EXPECT_THROW(ref::mla_pattern(MlaPatternArgsT<float>{.q = q.data(), .latent_cache = cache.data(),
                                                       .cache_row_stride = 8, .lengths = bad.data(), .out = out.data(),
                                                       .rows = 1, .heads = 1, .width = 2, .slots = 4, .scale = 0.5f}),
               Error);
}

// ---- GPU --------------------------------------------------------------------------------------

class Pattern : public CudaTest {};

// bf16 and f32 against the reference: queries of different lengths (0 included) over shared
// cache rows; zeros past each length exactly; probabilities within expf's last bit (bf16: at
// most one bf16 step on <= 1% of them); every non-empty row sums to 1.
TEST_F(Pattern, MatchesReference) {
  std::mt19937 rng(test_seed());
  SCOPED_TRACE(::testing::Message() << "seed " << test_seed());
  const int heads = 16, width = 576, capacity = 300, n_rows = 3, slots = 290;
  const std::vector<int32_t> lengths = {1, 0, 290, 17, 256, 257};
  const std::vector<int32_t> rows = {0, 1, 2, 2, 0, 1};
  const int Q = int(lengths.size());
  const float scale = 0.11472139f;
  auto q = random_bf16(size_t(Q) * heads * width, rng, 0.5f);
  auto cache = random_bf16(size_t(n_rows) * capacity * width, rng, 0.5f);
  std::vector<float> want(size_t(Q) * heads * slots);
  ref::mla_pattern({.q = q.data(), .latent_cache = cache.data(), .cache_row_stride = int64_t(capacity) * width,
                    .lengths = lengths.data(), .cache_rows = rows.data(), .out = want.data(), .rows = Q, .heads = heads,
                    .width = width, .slots = slots, .scale = scale});
  DevBuf<uint16_t> dq(q), dc(cache);
  DevBuf<int32_t> dl(lengths), dr(rows);
  DevBuf<float> dout(want.size());
  mla_pattern({.q = dq.get(), .latent_cache = dc.get(), .cache_row_stride = int64_t(capacity) * width,
               .lengths = dl.get(), .cache_rows = dr.get(), .out = dout.get(), .rows = Q, .heads = heads,
               .width = width, .slots = slots, .scale = scale});
  check_device_errors();
  const auto got = dout.download();
  int64_t differ = 0, nonzero = 0;
  for (int b = 0; b < Q; ++b)
    for (int h = 0; h < heads; ++h) {
      double sum = 0;
      for (int j = 0; j < slots; ++j) {
        const size_t i = (size_t(b) * heads + h) * slots + j;
        if (j >= lengths[size_t(b)]) {
          ASSERT_EQ(got[i], 0.0f) << b << "," << h << "," << j;
          continue;
        }
        ++nonzero;
        sum += got[i];
        if (got[i] != want[i]) {
          ++differ;
          EXPECT_NEAR(got[i], want[i], std::abs(want[i]) * 0.0079 + 1e-30) << b << "," << h << "," << j;
        }
      }
      if (lengths[size_t(b)] > 0) {
        EXPECT_NEAR(sum, 1.0, 0.02) << b << "," << h;
      }
    }
  EXPECT_LE(differ, nonzero / 100 + 1);

  // f32: the same contract without rounding.
  std::vector<float> qf(q.size()), cf(cache.size());
  for (size_t i = 0; i < q.size(); ++i) qf[i] = bf(q[i]);
  for (size_t i = 0; i < cache.size(); ++i) cf[i] = bf(cache[i]);
  std::vector<float> wantf(want.size());
  ref::mla_pattern(MlaPatternArgsT<float>{.q = qf.data(), .latent_cache = cf.data(),
                                          .cache_row_stride = int64_t(capacity) * width, .lengths = lengths.data(),
                                          .cache_rows = rows.data(), .out = wantf.data(), .rows = Q, .heads = heads,
                                          .width = width, .slots = slots, .scale = scale});
  DevBuf<float> dqf(qf), dcf(cf), doutf(wantf.size());
  mla_pattern(MlaPatternArgsT<float>{.q = dqf.get(), .latent_cache = dcf.get(),
                                     .cache_row_stride = int64_t(capacity) * width, .lengths = dl.get(),
                                     .cache_rows = dr.get(), .out = doutf.get(), .rows = Q, .heads = heads,
                                     .width = width, .slots = slots, .scale = scale});
  check_device_errors();
  const auto gotf = doutf.download();
  for (size_t i = 0; i < wantf.size(); ++i) ASSERT_NEAR(gotf[i], wantf[i], std::abs(wantf[i]) * 1e-6 + 1e-30) << i;
}

TEST_F(Pattern, BadLengthIsReported) {
  DevBuf<uint16_t> dq(std::vector<uint16_t>(8, 0)), dc(std::vector<uint16_t>(8, 0));
  DevBuf<int32_t> dl(std::vector<int32_t>{3});
  DevBuf<float> dout(2);
  mla_pattern({.q = dq.get(), .latent_cache = dc.get(), .cache_row_stride = 8, .lengths = dl.get(), .out = dout.get(),
               .rows = 1, .heads = 1, .width = 4, .slots = 2, .scale = 1.0f});
  EXPECT_THROW(check_device_errors(), Error);
  check_device_errors();  // the flag was cleared
}

}  // namespace
}  // namespace atlas::cuda::test
