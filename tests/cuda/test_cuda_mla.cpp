// MLA decode attention (absorbed form): reference agreement, exact math, batch invariance.
#include <algorithm>
#include <cmath>

#include "backend/cuda/reference.h"
#include "cuda_test_util.h"

namespace atlas::cuda::test {
namespace {

class Mla : public CudaTest {};

constexpr int H = 16, W = kMlaWidth, D = kMlaLatent;
constexpr float kScale = 0.11472139f;  // spec section 3: 192^-1/2 * m^2 for Lite

// Runs the GPU kernel on rows with the given lengths; q and cache rows given per row.
std::vector<uint16_t> run_gpu(const std::vector<uint16_t>& q, const std::vector<uint16_t>& cache,
                              const std::vector<int32_t>& lengths, int max_length, int split) {
  const int rows = int(lengths.size());
  DevBuf<uint16_t> dq(q), dc(cache), dout(size_t(rows) * H * D);
  DevBuf<int32_t> dl(lengths);
  DevBuf<float> ws(mla_decode_workspace_floats(rows, H, max_length, split));
  mla_decode({.q = dq.get(), .latent_cache = dc.get(), .cache_row_stride = int64_t(max_length) * W,
              .lengths = dl.get(), .max_length = max_length, .out = dout.get(), .rows = rows, .heads = H,
              .scale = kScale, .split_tokens = split, .workspace = ws.get()});
  check_device_errors();
  return dout.download();
}

// Tolerance against the fp32 mirror: only expf differs (last fp32 bit), which moves an output
// by about 1e-7 of the cache values' scale (~1 here). So: at most one bf16 ulp (2^-7 relative)
// plus 1e-6 absolute, for outputs that cancel to near zero (seen on the H200: -3.35e-7 vs
// -3.41e-7, three bf16 ulps apart at that tiny magnitude); at most 1% of elements differ at all.
void expect_close_to_ref(const std::vector<uint16_t>& got, const std::vector<uint16_t>& want) {
  ASSERT_EQ(got.size(), want.size());
  size_t differ = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const float g = bf(got[i]), w = bf(want[i]);
    EXPECT_LE(std::abs(g - w), std::ldexp(std::abs(w), -7) + 1e-6f) << i << ": " << g << " vs " << w;
    differ += got[i] != want[i];
  }
  EXPECT_LE(differ, got.size() / 100);
}

TEST_F(Mla, MatchesReferenceAndExactMath) {
  std::mt19937 rng(test_seed());
  SCOPED_TRACE(::testing::Message() << "seed " << test_seed());
  const std::vector<int32_t> lengths = {1, 100, 256, 257, 1000};
  const int max_length = 1000, rows = int(lengths.size()), split = 256;
  auto q = random_bf16(size_t(rows) * H * W, rng, 0.5f);
  auto cache = random_bf16(size_t(rows) * max_length * W, rng, 1.0f);
  std::vector<uint16_t> want(size_t(rows) * H * D);
  ref::mla_decode({.q = q.data(), .latent_cache = cache.data(), .cache_row_stride = int64_t(max_length) * W,
                   .lengths = lengths.data(), .max_length = max_length, .out = want.data(), .rows = rows,
                   .heads = H, .scale = kScale, .split_tokens = split});
  const auto got = run_gpu(q, cache, lengths, max_length, split);
  expect_close_to_ref(got, want);
  // Exact math in double: softmax over the whole cache, no splits. Relative L2 per (row, head)
  // within bf16 output precision (2^-8).
  for (int b = 0; b < rows; ++b)
    for (int h = 0; h < H; ++h) {
      const uint16_t* qh = &q[(size_t(b) * H + h) * W];
      const uint16_t* c = &cache[size_t(b) * max_length * W];
      std::vector<double> s(lengths[b]);
      for (int j = 0; j < lengths[b]; ++j) {
        double acc = 0;
        for (int d = 0; d < W; ++d) acc += double(bf(qh[d])) * bf(c[size_t(j) * W + d]);
        s[j] = acc * kScale;
      }
      const double m = *std::max_element(s.begin(), s.end());
      double l = 0;
      for (auto& v : s) l += v = std::exp(v - m);
      double num = 0, den = 0;
      for (int d = 0; d < D; ++d) {
        double o = 0;
        for (int j = 0; j < lengths[b]; ++j) o += s[j] * bf(c[size_t(j) * W + d]);
        o /= l;
        const double g = bf(got[(size_t(b) * H + h) * D + d]);
        num += (g - o) * (g - o);
        den += o * o;
      }
      EXPECT_LT(std::sqrt(num / den), 4e-3) << "row " << b << " head " << h;
    }
}

// A row's output must not depend on the batch: alone, or among rows of other lengths, at any
// position in the batch, bit for bit.
TEST_F(Mla, RowResultIsBatchInvariant) {
  std::mt19937 rng(test_seed());
  SCOPED_TRACE(::testing::Message() << "seed " << test_seed());
  const int max_length = 700, split = 256;
  const int rows = 8;
  std::vector<int32_t> lengths = {700, 3, 511, 512, 513, 64, 299, 1};
  auto q = random_bf16(size_t(rows) * H * W, rng, 0.5f);
  auto cache = random_bf16(size_t(rows) * max_length * W, rng);
  const auto batch = run_gpu(q, cache, lengths, max_length, split);
  for (int b = 0; b < rows; ++b) {
    std::vector<uint16_t> q1(q.begin() + size_t(b) * H * W, q.begin() + size_t(b + 1) * H * W);
    std::vector<uint16_t> c1(cache.begin() + size_t(b) * max_length * W,
                             cache.begin() + size_t(b) * max_length * W + size_t(lengths[b]) * W);
    // Alone, with a cache buffer sized to its own length (different max_length and grid).
    const auto alone = run_gpu(q1, c1, {lengths[b]}, lengths[b], split);
    ASSERT_TRUE(std::equal(alone.begin(), alone.end(), batch.begin() + size_t(b) * H * D)) << "row " << b;
  }
  // The batch reversed: same rows, other positions.
  std::vector<uint16_t> qr, cr;
  std::vector<int32_t> lr(lengths.rbegin(), lengths.rend());
  for (int b = rows - 1; b >= 0; --b) {
    qr.insert(qr.end(), q.begin() + size_t(b) * H * W, q.begin() + size_t(b + 1) * H * W);
    cr.insert(cr.end(), cache.begin() + size_t(b) * max_length * W, cache.begin() + size_t(b + 1) * max_length * W);
  }
  const auto rev = run_gpu(qr, cr, lr, max_length, split);
  for (int b = 0; b < rows; ++b)
    ASSERT_TRUE(std::equal(rev.begin() + size_t(rows - 1 - b) * H * D, rev.begin() + size_t(rows - b) * H * D,
                           batch.begin() + size_t(b) * H * D))
        << "row " << b;
  // Repeatable run to run.
  EXPECT_EQ(run_gpu(q, cache, lengths, max_length, split), batch);
}

TEST_F(Mla, BadLengthIsReported) {
  std::mt19937 rng(test_seed());
  auto q = random_bf16(size_t(H) * W, rng);
  auto cache = random_bf16(size_t(4) * W, rng);
  EXPECT_THROW(run_gpu(q, cache, {5}, 4, 256), Error);
  check_device_errors();
}

}  // namespace
}  // namespace atlas::cuda::test
