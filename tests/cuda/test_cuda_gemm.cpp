// GEMM: the batch-invariant kernel against its bit-exact reference and across M; cuBLASLt.
#include <cmath>
#include <cstdio>

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

// cuBLASLt: a different summation order, so a tolerance: fp32 output within 1e-5 of the
// largest |x|.|w| term sum; bf16 output within 1 bf16 ulp of the reference. Also reports (does
// not require) whether its rows happen to be M-invariant for this shape.
TEST_F(Gemm, FastModeMatchesReferenceWithinTolerance) {
  std::mt19937 rng(test_seed());
  SCOPED_TRACE(::testing::Message() << "seed " << test_seed());
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
    const auto got_f = run_gemm<float>(dx, dw, M, N, K, GemmMode::fast);
    for (size_t i = 0; i < got_f.size(); ++i)
      ASSERT_NEAR(got_f[i], want[i], 1e-5f * absdot[i]) << "M=" << M << " i=" << i;
    const auto got_b = run_gemm<uint16_t>(dx, dw, M, N, K, GemmMode::fast);
    size_t differ = 0;
    for (size_t i = 0; i < got_b.size(); ++i) {
      const uint16_t wb = f32_to_bf16(want[i]);
      const int d = bf16_ulp_diff(got_b[i], wb);
      ASSERT_LE(d, 1) << "M=" << M << " i=" << i;
      differ += d != 0;
    }
    EXPECT_LE(differ, got_b.size() / 50) << "M=" << M;
  }
  // Informational: is cuBLASLt's heuristic choice row-invariant between M=1 and M=128 here?
  auto x = random_bf16(size_t(128) * K, rng), w = random_bf16(size_t(N) * K, rng, 0.02f);
  DevBuf<uint16_t> dx(x), dw(w), dx1(std::vector<uint16_t>(x.begin(), x.begin() + K));
  const auto f128 = run_gemm<float>(dx, dw, 128, N, K, GemmMode::fast);
  const auto f1 = run_gemm<float>(dx1, dw, 1, N, K, GemmMode::fast);
  const bool same = std::equal(f1.begin(), f1.end(), f128.begin());
  std::printf("[ info ] cuBLASLt heuristic, N=K=2048: row 0 at M=1 %s row 0 at M=128\n",
              same ? "==" : "!=");
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
