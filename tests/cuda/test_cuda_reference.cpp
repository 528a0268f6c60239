// Host-only checks of the CPU references against exact (double) math. The GPU tests trust
// these references bit for bit, so they are checked here independently; these run in CI too.
#include <algorithm>
#include <cmath>
#include <numeric>

#include "backend/cuda/reference.h"
#include "cuda_test_util.h"
#include "mla_test_util.h"

namespace atlas::cuda::test {
namespace {

TEST(Reference, GemmIsTheDotProduct) {
  std::mt19937 rng(test_seed());
  SCOPED_TRACE(::testing::Message() << "seed " << test_seed());
  const int M = 5, N = 7, K = 300;
  auto x = random_bf16(size_t(M) * K, rng), w = random_bf16(size_t(N) * K, rng);
  std::vector<float> out(size_t(M) * N);
  std::vector<uint16_t> outb(size_t(M) * N);
  ref::gemm({.x = x.data(), .w = w.data(), .out = out.data(), .out_type = OutType::f32, .M = M, .N = N, .K = K});
  ref::gemm({.x = x.data(), .w = w.data(), .out = outb.data(), .M = M, .N = N, .K = K});
  for (int m = 0; m < M; ++m)
    for (int n = 0; n < N; ++n) {
      double s = 0, a = 0;
      for (int k = 0; k < K; ++k) {
        const double p = double(bf(x[m * K + k])) * bf(w[n * K + k]);
        s += p;
        a += std::abs(p);
      }
      EXPECT_NEAR(out[m * N + n], s, 1e-6 * a);
      EXPECT_EQ(outb[m * N + n], f32_to_bf16(out[m * N + n]));
    }
}

// Batched and grouped references against exact integer dot products (small integers: every
// sum is exact in fp32, so the expected values need no tolerance and no reference code).
TEST(Reference, BatchedAndGroupedGemmAreExactDotProducts) {
  std::mt19937 rng(test_seed());
  SCOPED_TRACE(::testing::Message() << "seed " << test_seed());
  std::uniform_int_distribution<int> d(-3, 3);
  auto ints = [&](size_t n) {
    std::vector<uint16_t> v(n);
    for (auto& e : v) e = f32_to_bf16(float(d(rng)));
    return v;
  };
  auto dot = [](const uint16_t* a, const uint16_t* b, int K) {
    double s = 0;
    for (int k = 0; k < K; ++k) s += double(bf(a[k])) * bf(b[k]);
    return float(s);
  };
  // Strided batch: 3 heads, x [M, 3, 10] using the first K = 8 of each head, out [M, 3, 6] (N = 5).
  const int B = 3, M = 4, N = 5, K = 8;
  auto x = ints(size_t(M) * B * 10), w = ints(size_t(B) * N * K);
  std::vector<float> out(size_t(M) * B * 6, -99.0f);
  ref::gemm({.x = x.data(), .w = w.data(), .out = out.data(), .out_type = OutType::f32, .M = M, .N = N, .K = K,
             .x_stride = B * 10, .out_stride = B * 6, .batch = B, .x_batch_stride = 10, .w_batch_stride = N * K,
             .out_batch_stride = 6});
  for (int b = 0; b < B; ++b)
    for (int m = 0; m < M; ++m) {
      for (int n = 0; n < N; ++n)
        EXPECT_EQ(out[size_t(m) * B * 6 + b * 6 + n], dot(&x[size_t(m) * B * 10 + b * 10], &w[(size_t(b) * N + n) * K], K));
      EXPECT_EQ(out[size_t(m) * B * 6 + b * 6 + 5], -99.0f) << "gap written";
    }
  // Grouped with a gather: groups of 2, 0, 3 rows; row r reads x row rows[r].
  const std::vector<int32_t> offsets = {0, 2, 2, 5}, rows = {4, 0, 0, 3, 1};
  auto xg = ints(size_t(5) * K);
  std::vector<std::vector<uint16_t>> ws = {ints(size_t(N) * K), ints(size_t(N) * K), ints(size_t(N) * K)};
  const std::vector<const uint16_t*> wp = {ws[0].data(), ws[1].data(), ws[2].data()};
  std::vector<float> og(size_t(6) * N, -99.0f);
  GroupedGemmArgs g{.x = xg.data(), .x_rows = rows.data(), .w = wp.data(), .offsets = offsets.data(), .out = og.data(),
                    .out_type = OutType::f32, .groups = 3, .max_rows = 6, .N = N, .K = K, .x_rows_limit = 5};
  ref::grouped_gemm(g);
  for (int r = 0; r < 5; ++r) {
    const int grp = r < 2 ? 0 : 2;
    for (int n = 0; n < N; ++n)
      EXPECT_EQ(og[size_t(r) * N + n], dot(&xg[size_t(rows[size_t(r)]) * K], &ws[size_t(grp)][size_t(n) * K], K));
  }
  for (int n = 0; n < N; ++n) EXPECT_EQ(og[size_t(5) * N + n], -99.0f) << "slack row written";
  const std::vector<int32_t> bad = {0, 3, 2, 5};
  g.offsets = bad.data();
  EXPECT_THROW(ref::grouped_gemm(g), Error);
  g.offsets = offsets.data();
  g.x_rows_limit = 4;  // row 4 is now out of range
  EXPECT_THROW(ref::grouped_gemm(g), Error);
}

TEST(Reference, MoePermuteSortsPairsByExpertThenToken) {
  // 3 tokens, k = 2, 4 experts: (t0: 2, 0), (t1: 0, 3), (t2: 2, 1).
  const std::vector<int32_t> ids = {2, 0, 0, 3, 2, 1};
  std::vector<int32_t> counts(4), offsets(5), sorted(6), slot(6);
  ref::moe_permute({.topk_ids = ids.data(), .tokens = 3, .k = 2, .experts = 4, .counts = counts.data(),
                    .offsets = offsets.data(), .sorted_token = sorted.data(), .pair_slot = slot.data()});
  EXPECT_EQ(counts, (std::vector<int32_t>{2, 1, 2, 1}));
  EXPECT_EQ(offsets, (std::vector<int32_t>{0, 2, 3, 5, 6}));
  EXPECT_EQ(sorted, (std::vector<int32_t>{0, 1, 2, 0, 2, 1}));  // e0: t0 t1 | e1: t2 | e2: t0 t2 | e3: t1
  EXPECT_EQ(slot, (std::vector<int32_t>{3, 0, 1, 5, 4, 2}));
}

TEST(Reference, MoeCombineIsTheWeightedSum) {
  // Two tokens, k = 2, dim 1, with values whose weighted sums are exact in bf16.
  const std::vector<uint16_t> y = {f32_to_bf16(1.0f), f32_to_bf16(2.0f), f32_to_bf16(-4.0f), f32_to_bf16(8.0f)};
  const std::vector<int32_t> slot = {3, 0, 1, 2};  // t0 <- y3, y0; t1 <- y1, y2
  const std::vector<float> w = {0.5f, 0.25f, 1.5f, 0.125f};
  std::vector<uint16_t> out(2);
  ref::moe_combine({.y_sorted = y.data(), .pair_slot = slot.data(), .topk_weights = w.data(), .out = out.data(),
                    .tokens = 2, .k = 2, .dim = 1});
  EXPECT_EQ(bf(out[0]), 0.5f * 8.0f + 0.25f * 1.0f);
  EXPECT_EQ(bf(out[1]), 1.5f * 2.0f + 0.125f * -4.0f);
}

// Both MLA contracts against exact math, per element within mla_exact_tolerance()
// (tests/cuda/mla_test_util.h: the bound each contract's roundings imply). Split sizes cover one
// split, tiles cut by splits, many splits.
TEST(Reference, MlaDecodeIsSoftmaxAttentionOverTheLatent) {
  std::mt19937 rng(test_seed());
  SCOPED_TRACE(::testing::Message() << "seed " << test_seed());
  const int H = 2, len = 300, W = kMlaWidth, D = kMlaLatent;
  auto q = random_bf16(size_t(H) * W, rng, 0.5f), cache = random_bf16(size_t(len) * W, rng);
  const std::vector<int32_t> lengths = {len};
  std::vector<MlaExact> exact;
  for (int h = 0; h < H; ++h) exact.push_back(mla_exact(&q[size_t(h) * W], cache.data(), len, W, D, 0.1));
  for (MlaImpl impl : {MlaImpl::tensor_core, MlaImpl::scalar})
    for (int split : {256, 100, 8}) {
      SCOPED_TRACE(::testing::Message() << "impl " << int(impl) << " split " << split);
      std::vector<uint16_t> out(size_t(H) * D);
      ref::mla_decode({.q = q.data(), .latent_cache = cache.data(), .cache_row_stride = int64_t(len) * W,
                       .lengths = lengths.data(), .max_length = len, .out = out.data(), .rows = 1, .heads = H,
                       .scale = 0.1f, .split_tokens = split, .impl = impl});
      for (int h = 0; h < H; ++h)
        for (int d = 0; d < D; ++d) {
          const double o = exact[size_t(h)].o[size_t(d)], a = exact[size_t(h)].a[size_t(d)];
          const double tol = mla_exact_tolerance(o, a, impl == MlaImpl::tensor_core);
          EXPECT_NEAR(bf(out[size_t(h) * D + size_t(d)]), o, tol) << h << "," << d;
        }
    }
}

// The tensor-core contract rounds P to bf16: on the same inputs its outputs differ from the
// fp32-P contract in a sizeable fraction of elements (guards against the mirror silently
// keeping P in fp32, which would make the GPU tests compare two fp32-P computations).
TEST(Reference, MlaTensorCoreContractRoundsTheWeights) {
  std::mt19937 rng(test_seed());
  SCOPED_TRACE(::testing::Message() << "seed " << test_seed());
  const int H = 4, len = 200, W = kMlaWidth, D = kMlaLatent;
  auto q = random_bf16(size_t(H) * W, rng, 0.5f), cache = random_bf16(size_t(len) * W, rng);
  const std::vector<int32_t> lengths = {len};
  std::vector<uint16_t> tc(size_t(H) * D), sc(size_t(H) * D);
  MlaDecodeArgs a{.q = q.data(), .latent_cache = cache.data(), .cache_row_stride = int64_t(len) * W,
                  .lengths = lengths.data(), .max_length = len, .out = tc.data(), .rows = 1, .heads = H,
                  .scale = 0.11472139f, .split_tokens = 256};
  ref::mla_decode(a);
  a.out = sc.data();
  a.impl = MlaImpl::scalar;
  ref::mla_decode(a);
  size_t differ = 0;
  for (size_t i = 0; i < tc.size(); ++i) differ += tc[i] != sc[i];
  EXPECT_GT(differ, tc.size() / 20);
}

TEST(Reference, RopeRotatesAdjacentPairs) {
  // Position 1, frequency table with one pair: rotation by inv_freq[0] = 1 rad.
  const std::vector<uint16_t> cos = {f32_to_bf16(1.0f), f32_to_bf16(std::cos(1.0f))};
  const std::vector<uint16_t> sin = {f32_to_bf16(0.0f), f32_to_bf16(std::sin(1.0f))};
  std::vector<uint16_t> x = {f32_to_bf16(1.0f), f32_to_bf16(0.0f)};
  const std::vector<int32_t> pos = {1};
  ref::rope_inplace({.x = x.data(), .tokens = 1, .heads = 1, .token_stride = 2, .head_stride = 0, .rope_dim = 2,
                     .positions = pos.data(), .cos = cos.data(), .sin = sin.data(), .max_positions = 2});
  EXPECT_EQ(x[0], cos[1]);  // (1, 0) -> (cos, sin)
  EXPECT_EQ(x[1], sin[1]);
}

}  // namespace
}  // namespace atlas::cuda::test
