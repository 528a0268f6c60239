// GEMM: the batch-invariant kernel against its bit-exact reference and across M; cuBLASLt.
#include <cmath>
#include <cstdio>
#include <string>
#include <utility>

#include "backend/cuda/reference.h"
#include "cuda_test_util.h"

namespace atlas::cuda::test {
namespace {

class Gemm : public CudaTest {};

template <class T>
std::vector<T> run_gemm(const DevBuf<uint16_t>& dx, const DevBuf<uint16_t>& dw, int M, int N, int K,
                        GemmMode mode) {
  DevBuf<T> dout(size_t(M) * N);
  gemm({.x = dx.get(), .w = dw.get(), .out = dout.get(),
        .out_type = std::is_same_v<T, float> ? OutType::f32 : OutType::bf16, .M = M, .N = N, .K = K,
        .mode = mode});
  synchronize();
  return dout.download();
}

TEST_F(Gemm, InvariantModeIsBitExactToReference) {
  std::mt19937 rng(test_seed());
  SCOPED_TRACE(::testing::Message() << "seed " << test_seed());
  // N and K off the tile sizes (64 / 16) to cover the edges.
  const int M = 70, N = 200, K = 2056;
  auto x = random_bf16(size_t(M) * K, rng), w = random_bf16(size_t(N) * K, rng, 0.02f);
  DevBuf<uint16_t> dx(x), dw(w);
  std::vector<uint16_t> want_b(size_t(M) * N);
  std::vector<float> want_f(size_t(M) * N);
  ref::gemm({.x = x.data(), .w = w.data(), .out = want_b.data(), .M = M, .N = N, .K = K});
  ref::gemm({.x = x.data(), .w = w.data(), .out = want_f.data(), .out_type = OutType::f32, .M = M, .N = N, .K = K});
  EXPECT_EQ(run_gemm<uint16_t>(dx, dw, M, N, K, GemmMode::batch_invariant), want_b);
  EXPECT_EQ(run_gemm<float>(dx, dw, M, N, K, GemmMode::batch_invariant), want_f);
}

// The property batch invariance needs: row r of x . W^T has the same bits whether the GEMM
// runs on 1, 37 or 128 rows (r at different positions inside the tiles).
TEST_F(Gemm, InvariantModeRowsDoNotDependOnM) {
  std::mt19937 rng(test_seed());
  SCOPED_TRACE(::testing::Message() << "seed " << test_seed());
  const int N = 576, K = 2048;  // the kv_a projection's shape
  auto x = random_bf16(size_t(128) * K, rng), w = random_bf16(size_t(N) * K, rng, 0.02f);
  DevBuf<uint16_t> dw(w), dx128(x);
  const auto full = run_gemm<uint16_t>(dx128, dw, 128, N, K, GemmMode::batch_invariant);
  const auto full_f = run_gemm<float>(dx128, dw, 128, N, K, GemmMode::batch_invariant);
  for (int M : {1, 37}) {
    for (int start : {0, 5, 91}) {
      if (start + M > 128) continue;
      std::vector<uint16_t> xs(x.begin() + size_t(start) * K, x.begin() + size_t(start + M) * K);
      DevBuf<uint16_t> dxs(xs);
      const auto part = run_gemm<uint16_t>(dxs, dw, M, N, K, GemmMode::batch_invariant);
      const auto part_f = run_gemm<float>(dxs, dw, M, N, K, GemmMode::batch_invariant);
      for (int r = 0; r < M; ++r) {
        ASSERT_TRUE(std::equal(part.begin() + size_t(r) * N, part.begin() + size_t(r + 1) * N,
                               full.begin() + size_t(start + r) * N))
            << "bf16 out, M=" << M << " start=" << start << " row " << r;
        ASSERT_TRUE(std::equal(part_f.begin() + size_t(r) * N, part_f.begin() + size_t(r + 1) * N,
                               full_f.begin() + size_t(start + r) * N))
            << "f32 out, M=" << M << " start=" << start << " row " << r;
      }
    }
  }
}

// cuBLASLt: a different summation order, so a tolerance. fp32 output: within 1e-5 of the sum
// of |x_k * w_k| (fp32 accumulation error, whatever the order). bf16 output: the same plus half
// a bf16 ulp of rounding (2^-9 relative, taken as 2^-8 for the two roundings compared).
void expect_cublaslt_close(GemmMode mode, std::mt19937& rng) {
  const int N = 2048, K = 2048;
  for (int M : {1, 37, 128}) {
    auto x = random_bf16(size_t(M) * K, rng), w = random_bf16(size_t(N) * K, rng, 0.02f);
    DevBuf<uint16_t> dx(x), dw(w);
    std::vector<float> want(size_t(M) * N), absdot(size_t(M) * N);
    ref::gemm({.x = x.data(), .w = w.data(), .out = want.data(), .out_type = OutType::f32, .M = M, .N = N, .K = K});
    for (int m = 0; m < M; ++m)
      for (int n = 0; n < N; ++n) {
        double s = 0;
        for (int k = 0; k < K; ++k) s += std::abs(double(bf(x[size_t(m) * K + k])) * bf(w[size_t(n) * K + k]));
        absdot[size_t(m) * N + n] = float(s);
      }
    const auto got_f = run_gemm<float>(dx, dw, M, N, K, mode);
    for (size_t i = 0; i < got_f.size(); ++i)
      ASSERT_NEAR(got_f[i], want[i], 1e-5f * absdot[i]) << "M=" << M << " i=" << i;
    const auto got_b = run_gemm<uint16_t>(dx, dw, M, N, K, mode);
    for (size_t i = 0; i < got_b.size(); ++i)
      ASSERT_NEAR(bf(got_b[i]), want[i], std::ldexp(std::abs(want[i]), -8) + 1e-5f * absdot[i])
          << "M=" << M << " i=" << i;
  }
}

// Informational (the assertions above are the test): are cuBLASLt rows M-invariant here?
void report_cublaslt_invariance(GemmMode mode, const char* name, std::mt19937& rng) {
  for (auto [N, K] : {std::pair{2048, 2048}, std::pair{576, 2048}, std::pair{21888, 2048}, std::pair{2048, 1408}}) {
    auto x = random_bf16(size_t(128) * K, rng), w = random_bf16(size_t(N) * K, rng, 0.02f);
    DevBuf<uint16_t> dx(x), dw(w);
    const auto f128 = run_gemm<float>(dx, dw, 128, N, K, mode);
    std::string verdict;
    for (int M : {1, 8, 37}) {
      DevBuf<uint16_t> dxm(std::vector<uint16_t>(x.begin(), x.begin() + size_t(M) * K));
      const auto fm = run_gemm<float>(dxm, dw, M, N, K, mode);
      const bool same = std::equal(fm.begin(), fm.end(), f128.begin());
      verdict += " M=" + std::to_string(M) + (same ? ":same" : ":DIFFERENT");
    }
    std::printf("[ info ] %s N=%d K=%d, rows vs M=128:%s\n", name, N, K, verdict.c_str());
  }
}

TEST_F(Gemm, FastModeMatchesReferenceWithinTolerance) {
  std::mt19937 rng(test_seed());
  SCOPED_TRACE(::testing::Message() << "seed " << test_seed());
  expect_cublaslt_close(GemmMode::fast, rng);
  report_cublaslt_invariance(GemmMode::fast, "cuBLASLt heuristic", rng);
}

TEST_F(Gemm, PinnedCublasLtMatchesReferenceWithinTolerance) {
  std::mt19937 rng(test_seed());
  SCOPED_TRACE(::testing::Message() << "seed " << test_seed());
  try {
    expect_cublaslt_close(GemmMode::cublaslt_pinned, rng);
    report_cublaslt_invariance(GemmMode::cublaslt_pinned, "cuBLASLt pinned (M=128 algo, split-K 1)", rng);
  } catch (const Error& e) {
    // An algorithm cuBLASLt will not run at another M is a finding about cuBLASLt, not a bug here.
    if (std::string(e.what()).find("AlgoCheck") == std::string::npos) throw;
    GTEST_SKIP() << "cuBLASLt refuses the pinned algorithm: " << e.what();
  }
}

TEST_F(Gemm, BadShapeThrowsNamingTheField) {
  try {
    gemm({.x = nullptr, .w = nullptr, .out = nullptr, .M = 1, .N = 0, .K = 4});
    FAIL() << "no throw";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("gemm: shape"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace atlas::cuda::test
