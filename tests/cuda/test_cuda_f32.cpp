// The f32 checking mode's kernels (--compute f32): the f32 GEMM (dense, strided batch, grouped),
// the f32 forms of the row-wise ops, copies, MoE gather/combine, argmax and the scalar MLA
// kernel, each against its CPU reference (reference.h) and the references against independent
// double-precision math. Host-only checks run everywhere; GPU checks skip without a device.
// Device outputs start poisoned (all bits set: NaN for f32), inputs are random normal values.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <memory>

#include "backend/cuda/reference.h"
#include "cuda_test_util.h"

namespace atlas::cuda::test {
namespace {

constexpr double kU = 1.0 / (1 << 24);  // fp32 unit roundoff

// Exact x . w^T in double, and sum |x_k w_k| per output (the scale of any fp32 rounding).
struct Exact {
  std::vector<double> v, abs;
};
Exact exact_gemm(const std::vector<float>& x, const std::vector<float>& w, int M, int N, int K) {
  Exact e{std::vector<double>(size_t(M) * N), std::vector<double>(size_t(M) * N)};
  for (int m = 0; m < M; ++m)
    for (int n = 0; n < N; ++n) {
      double s = 0, a = 0;
      for (int k = 0; k < K; ++k) {
        const double p = double(x[size_t(m) * K + k]) * double(w[size_t(n) * K + k]);
        s += p;
        a += std::abs(p);
      }
      e.v[size_t(m) * N + n] = s;
      e.abs[size_t(m) * N + n] = a;
    }
  return e;
}

double rel_l2(const std::vector<float>& got, const std::vector<double>& want) {
  double num = 0, den = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    num += (double(got[i]) - want[i]) * (double(got[i]) - want[i]);
    den += want[i] * want[i];
  }
  return den > 0 ? std::sqrt(num / den) : std::sqrt(num);
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

float nan_poison() {
  const uint32_t bits = 0xffffffffu;  // what DevBuf<float> fills with
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

// ---- host-only: the references against independent math --------------------------------------

// The f32 GEMM reference is the ordered FMA chain: on small integers every product and partial
// sum is exact, so it equals the double result exactly; on random data it is within the chain's
// rounding bound K*u*sum|x w| of it; the strided batch is the dense product per batch.
TEST(F32Reference, GemmIsTheOrderedFmaChain) {
  std::mt19937 rng(test_seed());
  SCOPED_TRACE(::testing::Message() << "seed " << test_seed());
  const int M = 5, N = 7, K = 300;
  std::uniform_int_distribution<int> small(-8, 8);
  std::vector<float> xi(size_t(M) * K), wi(size_t(N) * K);
  for (auto& v : xi) v = float(small(rng) | 1);  // odd: never zero
  for (auto& v : wi) v = float(small(rng) | 1);
  std::vector<float> out(size_t(M) * N);
  ref::gemm_f32({.x = xi.data(), .w = wi.data(), .out = out.data(), .M = M, .N = N, .K = K});
  const Exact ei = exact_gemm(xi, wi, M, N, K);
  for (size_t i = 0; i < out.size(); ++i) ASSERT_EQ(double(out[i]), ei.v[i]) << i;

  const auto x = random_f32(size_t(M) * K, rng), w = random_f32(size_t(N) * K, rng);
  ref::gemm_f32({.x = x.data(), .w = w.data(), .out = out.data(), .M = M, .N = N, .K = K});
  const Exact e = exact_gemm(x, w, M, N, K);
  for (size_t i = 0; i < out.size(); ++i) ASSERT_LE(std::abs(out[i] - e.v[i]), K * kU * e.abs[i]) << i;

  // Strided batch of 3 over slices of wider rows == dense on copied slices, bit for bit.
  const int B = 3, xs = K + 5, os = N + 3;
  const auto xb = random_f32(size_t(B) * M * xs, rng), wb = random_f32(size_t(B) * N * K, rng);
  std::vector<float> ob(size_t(B) * M * os, 0.0f);
  ref::gemm_f32({.x = xb.data(), .w = wb.data(), .out = ob.data(), .M = M, .N = N, .K = K, .x_stride = xs,
                 .out_stride = os, .batch = B, .x_batch_stride = int64_t(M) * xs, .w_batch_stride = int64_t(N) * K,
                 .out_batch_stride = int64_t(M) * os});
  for (int b = 0; b < B; ++b) {
    std::vector<float> xd(size_t(M) * K), od(size_t(M) * N);
    for (int m = 0; m < M; ++m) std::copy_n(xb.begin() + (size_t(b) * M + m) * xs, K, xd.begin() + size_t(m) * K);
    ref::gemm_f32({.x = xd.data(), .w = wb.data() + size_t(b) * N * K, .out = od.data(), .M = M, .N = N, .K = K});
    for (int m = 0; m < M; ++m)
      for (int n = 0; n < N; ++n) ASSERT_EQ(ob[(size_t(b) * M + m) * os + n], od[size_t(m) * N + n]) << b << m << n;
  }
}

// RMSNorm, RoPE, SiLU gate and the MoE combine in f32 against the formulas in double: each is
// a handful of fp32 operations, so within a few units of fp32 rounding.
TEST(F32Reference, RowOpsMatchTheFormulasInDouble) {
  std::mt19937 rng(test_seed());
  SCOPED_TRACE(::testing::Message() << "seed " << test_seed());
  const int rows = 3, dim = 300;
  const auto x = random_f32(size_t(rows) * dim, rng, 3.0f), w = random_f32(dim, rng, 0.5f);
  std::vector<float> y(x.size());
  ref::rmsnorm(RmsNormArgsT<float>{.x = x.data(), .weight = w.data(), .out = y.data(), .rows = rows, .dim = dim});
  for (int r = 0; r < rows; ++r) {
    double ss = 0;
    for (int i = 0; i < dim; ++i) ss += double(x[size_t(r) * dim + i]) * x[size_t(r) * dim + i];
    const double rs = 1.0 / std::sqrt(ss / dim + 1e-6);
    for (int i = 0; i < dim; ++i) {
      const double want = double(x[size_t(r) * dim + i]) * rs * w[size_t(i)];
      EXPECT_NEAR(y[size_t(r) * dim + i], want, 1e-6 * std::abs(want)) << r << "," << i;
    }
  }
  // RoPE: three pairs at position 2 of a 3-position table (rows 0 and 1 are decoys).
  const auto cs = random_f32(9, rng), sn = random_f32(9, rng);
  auto v = random_f32(6, rng);
  const auto v0 = v;
  const std::vector<int32_t> pos = {2};
  ref::rope_inplace(RopeArgsT<float>{.x = v.data(), .tokens = 1, .heads = 1, .token_stride = 6, .head_stride = 6,
                                     .rope_dim = 6, .positions = pos.data(), .cos = cs.data(), .sin = sn.data(),
                                     .max_positions = 3});
  for (int k = 0; k < 3; ++k) {
    const double a = v0[size_t(2 * k)], b = v0[size_t(2 * k + 1)], c = cs[size_t(6 + k)], sv = sn[size_t(6 + k)];
    EXPECT_NEAR(v[size_t(2 * k)], a * c - b * sv, 4 * kU * (std::abs(a * c) + std::abs(b * sv))) << k;
    EXPECT_NEAR(v[size_t(2 * k + 1)], b * c + a * sv, 4 * kU * (std::abs(b * c) + std::abs(a * sv))) << k;
  }
  // SiLU gate over [gate | up] halves.
  const auto gu = random_f32(2 * 50, rng, 4.0f);
  std::vector<float> act(50);
  ref::silu_gate(SiluGateArgsT<float>{.gate = gu.data(), .up = gu.data() + 50, .out = act.data(), .rows = 1,
                                      .width = 50, .in_stride = 100});
  for (int i = 0; i < 50; ++i) {
    const double g = gu[size_t(i)], want = g / (1.0 + std::exp(-g)) * gu[size_t(50 + i)];
    EXPECT_NEAR(act[size_t(i)], want, 8 * kU * std::abs(want)) << i;
  }
  // Combine: two tokens, k = 3 slots each.
  const auto ys = random_f32(6 * 20, rng), tw = random_f32(6, rng);
  const std::vector<int32_t> slot = {4, 0, 2, 1, 5, 3};
  std::vector<float> comb(2 * 20);
  ref::moe_combine(MoeCombineArgsT<float>{.y_sorted = ys.data(), .pair_slot = slot.data(), .topk_weights = tw.data(),
                                          .out = comb.data(), .tokens = 2, .k = 3, .dim = 20});
  for (int t = 0; t < 2; ++t)
    for (int c = 0; c < 20; ++c) {
      double want = 0, scale = 0;
      for (int j = 0; j < 3; ++j) {
        const double p = double(tw[size_t(t * 3 + j)]) * ys[size_t(slot[size_t(t * 3 + j)]) * 20 + c];
        want += p;
        scale += std::abs(p);
      }
      EXPECT_NEAR(comb[size_t(t) * 20 + c], want, 6 * kU * scale) << t << "," << c;
    }
}

// ---- GPU -----------------------------------------------------------------------------------------

class F32Kernels : public CudaTest {};

std::vector<float> run_gemm(const GemmF32Args& a, size_t out_elems) {
  DevBuf<float> out(out_elems);
  GemmF32Args g = a;
  g.out = out.get();
  gemm_f32(g);
  check_device_errors();
  return out.download();
}

// Dense shapes from decode (M = 1) to prefill-like tiles with ragged edges: bit-exact to the
// reference (same FMA chain), relative L2 to exact math far under 1e-5, and every element
// within the chain's rounding bound K*u*sum|x w|.
TEST_F(F32Kernels, GemmIsBitExactToReferenceAndCloseToDouble) {
  std::mt19937 rng(test_seed());
  SCOPED_TRACE(::testing::Message() << "seed " << test_seed());
  struct Shape {
    int M, N, K;
  };
  for (const Shape s : {Shape{1, 300, 2048}, Shape{37, 129, 100}, Shape{130, 72, 1408}, Shape{5, 64, 7},
                        Shape{64, 64, 16}}) {
    SCOPED_TRACE(::testing::Message() << "M=" << s.M << " N=" << s.N << " K=" << s.K);
    const auto x = random_f32(size_t(s.M) * s.K, rng), w = random_f32(size_t(s.N) * s.K, rng);
    std::vector<float> want(size_t(s.M) * s.N);
    ref::gemm_f32({.x = x.data(), .w = w.data(), .out = want.data(), .M = s.M, .N = s.N, .K = s.K});
    DevBuf<float> dx(x), dw(w);
    const auto got = run_gemm({.x = dx.get(), .w = dw.get(), .M = s.M, .N = s.N, .K = s.K}, want.size());
    EXPECT_TRUE(same_bits(got, want));
    const Exact e = exact_gemm(x, w, s.M, s.N, s.K);
    const double rl2 = rel_l2(got, e.v);
    std::printf("  f32 gemm M=%d N=%d K=%d: relative L2 to double %.3g\n", s.M, s.N, s.K, rl2);
    EXPECT_LT(rl2, 4e-6);
    for (size_t i = 0; i < got.size(); ++i)
      ASSERT_LE(std::abs(double(got[i]) - e.v[i]), s.K * kU * e.abs[i]) << "element " << i;
  }
}

// Batch invariance and the strided forms: rows of M = 300 computed alone (M = 1) give the same
// bits; a strided batch over slices of wider rows equals the dense GEMM per batch; strided
// outputs leave the gaps untouched.
TEST_F(F32Kernels, GemmRowsAndBatchesAreInvariant) {
  std::mt19937 rng(test_seed());
  SCOPED_TRACE(::testing::Message() << "seed " << test_seed());
  const int M = 300, N = 96, K = 200;
  const auto x = random_f32(size_t(M) * K, rng), w = random_f32(size_t(N) * K, rng);
  DevBuf<float> dx(x), dw(w);
  const auto full = run_gemm({.x = dx.get(), .w = dw.get(), .M = M, .N = N, .K = K}, size_t(M) * N);
  for (int m : {0, 1, 63, 64, 65, 128, 299}) {
    const auto row = run_gemm({.x = dx.get() + size_t(m) * K, .w = dw.get(), .M = 1, .N = N, .K = K}, size_t(N));
    ASSERT_EQ(std::memcmp(row.data(), full.data() + size_t(m) * N, size_t(N) * 4), 0) << "row " << m;
  }
  // 4 heads: x [Mb, 4, K] (row stride 4K), w [4, N, K], out [Mb, 4, N] (row stride 4N).
  const int H = 4, Mb = 70;
  const auto xh = random_f32(size_t(Mb) * H * K, rng), wh = random_f32(size_t(H) * N * K, rng);
  DevBuf<float> dxh(xh), dwh(wh);
  const auto batched = run_gemm({.x = dxh.get(), .w = dwh.get(), .M = Mb, .N = N, .K = K, .x_stride = H * K,
                                 .out_stride = H * N, .batch = H, .x_batch_stride = K, .w_batch_stride = int64_t(N) * K,
                                 .out_batch_stride = N},
                                size_t(Mb) * H * N);
  for (int h = 0; h < H; ++h) {
    const auto dense = run_gemm({.x = dxh.get() + size_t(h) * K, .w = dwh.get() + size_t(h) * N * K, .M = Mb, .N = N,
                                 .K = K, .x_stride = H * K},
                                size_t(Mb) * N);
    for (int m = 0; m < Mb; ++m)
      ASSERT_EQ(std::memcmp(dense.data() + size_t(m) * N, batched.data() + (size_t(m) * H + h) * N, size_t(N) * 4), 0)
          << "head " << h << " row " << m;
  }
  // Gaps of a strided output are not written (the poison stays).
  const int os = N + 7;
  const auto strided = run_gemm({.x = dx.get(), .w = dw.get(), .M = 3, .N = N, .K = K, .out_stride = os},
                                size_t(3) * os);
  for (int m = 0; m < 3; ++m)
    for (int j = N; j < os; ++j) EXPECT_TRUE(std::isnan(strided[size_t(m) * os + j])) << m << "," << j;
}

// Grouped: every row equals the dense f32 GEMM of that row alone with its group's weight (bit
// for bit) and the host reference; empty groups, a group of one, groups across tile boundaries,
// gathered A rows, decode-like groups; rows past offsets[groups] are never written.
TEST_F(F32Kernels, GroupedRowsEqualTheDenseGemmOfTheirGroup) {
  std::mt19937 rng(test_seed());
  SCOPED_TRACE(::testing::Message() << "seed " << test_seed());
  struct Case {
    std::vector<int> counts;
    int N, K, x_count;  // x_count > 0: gather A rows from x_count rows of x
    int slack;          // max_rows - sum(counts)
  };
  std::vector<int> decode(64, 0);
  for (int e : {3, 9, 10, 31, 50, 63}) decode[size_t(e)] = 1;
  const std::vector<Case> cases = {{{0, 5, 0, 1, 70, 17, 130, 3, 0}, 72, 100, 9, 6},
                                   {{33, 0, 64, 2}, 75, 136, 0, 0},
                                   {{77}, 64, 48, 0, 5},
                                   {{0, 0, 0}, 32, 40, 4, 3},
                                   {decode, 40, 256, 1, 0}};
  for (const Case& c : cases) {
    const int G = int(c.counts.size());
    const std::vector<int32_t> offsets = group_offsets(c.counts);
    const int rows = offsets.back(), max_rows = rows + c.slack;
    SCOPED_TRACE(::testing::Message() << "groups " << G << " rows " << rows << " N " << c.N << " K " << c.K);
    const int x_count = c.x_count > 0 ? c.x_count : std::max(rows, 1);
    std::vector<int32_t> x_rows;
    if (c.x_count > 0) x_rows = random_rows(rows, c.x_count, rng);
    const auto x = random_f32(size_t(x_count) * c.K, rng);
    std::vector<std::vector<float>> w;
    for (int g = 0; g < G; ++g) w.push_back(random_f32(size_t(c.N) * c.K, rng));
    // Host reference.
    std::vector<const float*> hw;
    for (const auto& wg : w) hw.push_back(wg.data());
    std::vector<float> want(size_t(max_rows) * c.N, nan_poison());
    ref::grouped_gemm_f32({.x = x.data(), .x_rows = x_rows.empty() ? nullptr : x_rows.data(), .w = hw.data(),
                           .offsets = offsets.data(), .out = want.data(), .groups = G, .max_rows = max_rows, .N = c.N,
                           .K = c.K, .x_rows_limit = x_count});
    // Device.
    DevBuf<float> dx(x), dout(size_t(max_rows) * c.N);
    std::vector<std::unique_ptr<DevBuf<float>>> dw;
    std::vector<const float*> wptr;
    for (const auto& wg : w) {
      dw.push_back(std::make_unique<DevBuf<float>>(wg));
      wptr.push_back(dw.back()->get());
    }
    DevBuf<const float*> dwptr(wptr);
    DevBuf<int32_t> doff(offsets), drows(x_rows.empty() ? std::vector<int32_t>{0} : x_rows);
    grouped_gemm_f32({.x = dx.get(), .x_rows = x_rows.empty() ? nullptr : drows.get(), .w = dwptr.get(),
                      .offsets = doff.get(), .out = dout.get(), .groups = G, .max_rows = max_rows, .N = c.N, .K = c.K,
                      .x_rows_limit = x_count});
    check_device_errors();
    const auto got = dout.download();
    EXPECT_TRUE(same_bits(got, want)) << "grouped vs reference (slack rows: both the NaN poison)";
    for (int g = 0; g < G; ++g)
      for (int r = offsets[size_t(g)]; r < offsets[size_t(g) + 1]; ++r) {
        const int src = x_rows.empty() ? r : x_rows[size_t(r)];
        const auto row = run_gemm({.x = dx.get() + size_t(src) * c.K, .w = wptr[size_t(g)], .M = 1, .N = c.N, .K = c.K},
                                  size_t(c.N));
        ASSERT_EQ(std::memcmp(row.data(), got.data() + size_t(r) * c.N, size_t(c.N) * 4), 0)
            << "group " << g << " row " << r;
      }
    for (size_t i = size_t(rows) * c.N; i < got.size(); ++i)
      ASSERT_TRUE(std::isnan(got[i])) << "slack element " << i << " written";
  }
}

// Bad device data: offsets out of order / past max_rows / not starting at 0, a gather index out
// of range, a null group weight: check_device_errors() names grouped_gemm and the field.
TEST_F(F32Kernels, GroupedBadDeviceDataIsReported) {
  std::mt19937 rng(test_seed());
  const int N = 32, K = 40, max_rows = 8;
  DevBuf<float> dx(random_f32(size_t(max_rows) * K, rng)), dw(random_f32(size_t(N) * K, rng));
  DevBuf<const float*> dwptr(std::vector<const float*>(3, dw.get()));
  auto expect_error = [](const std::string& field) {
    try {
      check_device_errors();
      ADD_FAILURE() << "no device error, expected " << field;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(field), std::string::npos) << e.what();
    }
    EXPECT_NO_THROW(check_device_errors());  // cleared
  };
  for (const auto& off : std::vector<std::vector<int32_t>>{{0, 5, 3, 8}, {0, 5, 6, 9}, {1, 5, 6, 8}, {0, -2, 4, 4}}) {
    DevBuf<int32_t> doff(off);
    DevBuf<float> dout(size_t(max_rows) * N);
    grouped_gemm_f32({.x = dx.get(), .w = dwptr.get(), .offsets = doff.get(), .out = dout.get(), .groups = 3,
                      .max_rows = max_rows, .N = N, .K = K});
    expect_error("grouped_gemm: offsets");
    for (float v : dout.download()) ASSERT_TRUE(std::isnan(v)) << "output written despite bad offsets";
  }
  DevBuf<int32_t> doff(std::vector<int32_t>{0, 3});
  for (int32_t bad : {max_rows, -1}) {
    DevBuf<int32_t> drows(std::vector<int32_t>{0, bad, 2});
    DevBuf<float> dout(size_t(3) * N);
    grouped_gemm_f32({.x = dx.get(), .x_rows = drows.get(), .w = dwptr.get(), .offsets = doff.get(),
                      .out = dout.get(), .groups = 1, .max_rows = 3, .N = N, .K = K, .x_rows_limit = max_rows});
    expect_error("grouped_gemm: x_rows");
  }
  DevBuf<const float*> dnull(std::vector<const float*>{nullptr});
  DevBuf<float> dout(size_t(3) * N);
  grouped_gemm_f32({.x = dx.get(), .w = dnull.get(), .offsets = doff.get(), .out = dout.get(), .groups = 1,
                    .max_rows = 3, .N = N, .K = K});
  expect_error("grouped_gemm: w");
}

// The f32 row-wise ops, copies, gather/combine and argmax against their references: bit-exact
// where no transcendental function enters; the SiLU gate (device expf vs libm exp) within a
// few fp32 units.
TEST_F(F32Kernels, RowOpsCopiesAndArgmaxMatchReference) {
  std::mt19937 rng(test_seed());
  SCOPED_TRACE(::testing::Message() << "seed " << test_seed());
  // RMSNorm: strided (the kv_a latent: 512 of a 576 row) and in place.
  {
    const int rows = 37, dim = 512, stride = 576;
    const auto x = random_f32(size_t(rows) * stride, rng, 3.0f), w = random_f32(dim, rng, 0.5f);
    std::vector<float> want(size_t(rows) * dim);
    ref::rmsnorm(RmsNormArgsT<float>{.x = x.data(), .weight = w.data(), .out = want.data(), .rows = rows, .dim = dim,
                                     .x_stride = stride});
    DevBuf<float> dx(x), dw(w), dout(want.size());
    rmsnorm({.x = dx.get(), .weight = dw.get(), .out = dout.get(), .rows = rows, .dim = dim, .x_stride = stride});
    check_device_errors();
    EXPECT_TRUE(same_bits(dout.download(), want)) << "rmsnorm";
    const auto xd = random_f32(size_t(rows) * 2048, rng, 3.0f), wd = random_f32(2048, rng);
    std::vector<float> want2(xd.size());
    ref::rmsnorm(RmsNormArgsT<float>{.x = xd.data(), .weight = wd.data(), .out = want2.data(), .rows = rows, .dim = 2048});
    DevBuf<float> dxd(xd), dwd(wd);
    rmsnorm({.x = dxd.get(), .weight = dwd.get(), .out = dxd.get(), .rows = rows, .dim = 2048});
    check_device_errors();
    EXPECT_TRUE(same_bits(dxd.download(), want2)) << "rmsnorm in place";
  }
  // RoPE over heads of a q-like layout, f32 tables, positions across the table.
  {
    const int T = 9, heads = 3, rope = 64, half = 32, dq = 192, P = 50;
    auto x = random_f32(size_t(T) * heads * dq, rng);
    const auto cs = random_f32(size_t(P) * half, rng), sn = random_f32(size_t(P) * half, rng);
    std::vector<int32_t> pos(T);
    for (int t = 0; t < T; ++t) pos[size_t(t)] = (t * 17) % P;
    DevBuf<float> dx(x), dc(cs), ds(sn);
    DevBuf<int32_t> dp(pos);
    const RopeArgsT<float> base{.tokens = T, .heads = heads, .token_stride = heads * dq, .head_stride = dq,
                                .rope_dim = rope, .max_positions = P};
    RopeArgsT<float> r = base;
    r.x = x.data() + 128;
    r.positions = pos.data();
    r.cos = cs.data();
    r.sin = sn.data();
    ref::rope_inplace(r);
    RopeArgsT<float> g = base;
    g.x = dx.get() + 128;
    g.positions = dp.get();
    g.cos = dc.get();
    g.sin = ds.get();
    rope_inplace(g);
    check_device_errors();
    EXPECT_TRUE(same_bits(dx.download(), x)) << "rope";
  }
  // SiLU gate over a fused [gate | up] GEMM output; add in place.
  {
    const int rows = 40, width = 1408;
    const auto gu = random_f32(size_t(rows) * 2 * width, rng, 3.0f);
    std::vector<float> want(size_t(rows) * width);
    ref::silu_gate(SiluGateArgsT<float>{.gate = gu.data(), .up = gu.data() + width, .out = want.data(), .rows = rows,
                                        .width = width, .in_stride = 2 * width});
    DevBuf<float> dgu(gu), dout(want.size());
    silu_gate({.gate = dgu.get(), .up = dgu.get() + width, .out = dout.get(), .rows = rows, .width = width,
               .in_stride = 2 * width});
    check_device_errors();
    const auto got = dout.download();
    double worst = 0;
    for (size_t i = 0; i < got.size(); ++i)
      worst = std::max(worst, std::abs(double(got[i]) - want[i]) / std::max(std::abs(double(want[i])), 1e-30));
    std::printf("  f32 silu_gate: max relative difference to the reference %.3g\n", worst);
    EXPECT_LE(worst, 8 * kU);
    const int64_t n = 10007;
    const auto a = random_f32(size_t(n), rng), b = random_f32(size_t(n), rng);
    std::vector<float> sum(static_cast<size_t>(n));
    ref::add(AddArgsT<float>{.a = a.data(), .b = b.data(), .out = sum.data(), .n = n});
    for (int64_t i = 0; i < n; i += 997) ASSERT_EQ(sum[size_t(i)], a[size_t(i)] + b[size_t(i)]);
    DevBuf<float> da(a), db(b);
    add({.a = da.get(), .b = db.get(), .out = da.get(), .n = n});
    check_device_errors();
    EXPECT_TRUE(same_bits(da.download(), sum)) << "add";
  }
  // copy_rows with skipped rows; MoE gather and combine.
  {
    const int width = 40, src_rows = 30, dst_rows = 50, n = 20;
    const auto src = random_f32(size_t(src_rows) * 48, rng);
    std::vector<int32_t> sidx(n), didx(n);
    for (int i = 0; i < n; ++i) {
      sidx[size_t(i)] = int32_t((i * 7) % src_rows);
      didx[size_t(i)] = i % 5 == 3 ? -1 : int32_t(49 - 2 * i);
    }
    std::vector<float> want(size_t(dst_rows) * width, nan_poison());
    const CopyRowsArgsT<float> base{.rows = n, .width = width, .src_stride = 48, .src_limit = src_rows,
                                    .dst_limit = dst_rows};
    CopyRowsArgsT<float> r = base;
    r.src = src.data();
    r.dst = want.data();
    r.src_rows = sidx.data();
    r.dst_rows = didx.data();
    ref::copy_rows(r);
    DevBuf<float> dsrc(src), ddst(want.size());
    DevBuf<int32_t> dsi(sidx), ddi(didx);
    CopyRowsArgsT<float> g = base;
    g.src = dsrc.get();
    g.dst = ddst.get();
    g.src_rows = dsi.get();
    g.dst_rows = ddi.get();
    copy_rows(g);
    check_device_errors();
    EXPECT_TRUE(same_bits(ddst.download(), want)) << "copy_rows";

    const int tokens = 33, k = 6, dim = 96, P = tokens * k;
    const auto x = random_f32(size_t(tokens) * dim, rng), ys = random_f32(size_t(P) * dim, rng);
    const auto tw = random_f32(size_t(P), rng);
    std::vector<int32_t> sorted(P), slot(P);
    for (int i = 0; i < P; ++i) {
      sorted[size_t(i)] = int32_t((i * 13) % tokens);
      slot[size_t(i)] = int32_t((i * 37 + 5) % P);  // a permutation (37 and 198 coprime)
    }
    std::vector<float> xs_want(size_t(P) * dim), comb_want(size_t(tokens) * dim);
    ref::moe_gather(MoeGatherArgsT<float>{.x = x.data(), .sorted_token = sorted.data(), .x_sorted = xs_want.data(),
                                          .rows = P, .dim = dim});
    ref::moe_combine(MoeCombineArgsT<float>{.y_sorted = ys.data(), .pair_slot = slot.data(), .topk_weights = tw.data(),
                                            .out = comb_want.data(), .tokens = tokens, .k = k, .dim = dim});
    DevBuf<float> dx(x), dxs(xs_want.size()), dys(ys), dtw(tw), dcomb(comb_want.size());
    DevBuf<int32_t> dsorted(sorted), dslot(slot);
    moe_gather({.x = dx.get(), .sorted_token = dsorted.get(), .x_sorted = dxs.get(), .rows = P, .dim = dim});
    moe_combine({.y_sorted = dys.get(), .pair_slot = dslot.get(), .topk_weights = dtw.get(), .out = dcomb.get(),
                 .tokens = tokens, .k = k, .dim = dim});
    check_device_errors();
    EXPECT_TRUE(same_bits(dxs.download(), xs_want)) << "moe_gather";
    EXPECT_TRUE(same_bits(dcomb.download(), comb_want)) << "moe_combine";
  }
  // argmax over f32 logits: ties to the lower id, infinities, values a bf16 rounding would tie.
  {
    const int rows = 5, vocab = 1000, stride = 1003;
    auto h = random_f32(size_t(rows) * stride, rng);
    for (int i = 0; i < vocab; ++i) h[size_t(1) * stride + i] = 3.0f;  // all tied: id 0
    h[size_t(2) * stride + 999] = std::numeric_limits<float>::infinity();
    h[size_t(3) * stride + 500] = h[size_t(3) * stride + 700] = 100.0f;  // tie: 500
    h[size_t(4) * stride + 10] = 50.0f;
    h[size_t(4) * stride + 11] = std::nextafter(50.0f, 100.0f);  // one f32 ulp above: 11
    std::vector<int32_t> want(rows);
    ref::argmax(ArgmaxArgsT<float>{.logits = h.data(), .out = want.data(), .rows = rows, .vocab = vocab,
                                   .stride = stride});
    EXPECT_EQ(want[1], 0);
    EXPECT_EQ(want[2], 999);
    EXPECT_EQ(want[3], 500);
    EXPECT_EQ(want[4], 11);
    DevBuf<float> dl(h);
    DevBuf<int32_t> dout(static_cast<size_t>(rows));
    argmax({.logits = dl.get(), .out = dout.get(), .rows = rows, .vocab = vocab, .stride = stride});
    check_device_errors();
    EXPECT_EQ(dout.download(), want);
    {  // the split form (rows over blocks of 4,096; one block each here): the same answers
      DevBuf<int32_t> counters(std::vector<int32_t>(size_t(rows), 0)), parts(argmax_partial_ints(rows, vocab));
      DevBuf<int32_t> dsplit(static_cast<size_t>(rows));
      argmax({.logits = dl.get(), .out = dsplit.get(), .rows = rows, .vocab = vocab, .stride = stride,
              .counters = counters.get(), .partials = parts.get()});
      check_device_errors();
      EXPECT_EQ(dsplit.download(), want);
      EXPECT_EQ(counters.download(), std::vector<int32_t>(size_t(rows), 0));
    }
    // ... and over several blocks, vector (a multiple of 4 entries) and scalar rows: the
    // maximum in the last block, a tie across blocks (the lower id).
    for (const int v : {3 * 4096 + 4, 3 * 4096 + 5}) {
      auto g = random_f32(size_t(2) * v, rng);
      g[size_t(v) - 1] = 60.0f;
      g[size_t(v) + 4100] = g[size_t(v) + 2 * 4096 + 1] = 60.0f;
      std::vector<int32_t> w(2);
      ref::argmax(ArgmaxArgsT<float>{.logits = g.data(), .out = w.data(), .rows = 2, .vocab = v});
      EXPECT_EQ(w, (std::vector<int32_t>{v - 1, 4100}));
      DevBuf<float> dg(g);
      DevBuf<int32_t> counters(std::vector<int32_t>(2, 0)), parts(argmax_partial_ints(2, v)), dsplit(2);
      argmax({.logits = dg.get(), .out = dsplit.get(), .rows = 2, .vocab = v, .counters = counters.get(),
              .partials = parts.get()});
      check_device_errors();
      EXPECT_EQ(dsplit.download(), w) << v;
    }
    h[17] = std::numeric_limits<float>::quiet_NaN();
    dl.upload(h);
    argmax({.logits = dl.get(), .out = dout.get(), .rows = 1, .vocab = vocab});
    EXPECT_THROW(check_device_errors(), Error);
    check_device_errors();  // cleared
  }
}

// ---- the scalar MLA kernel in f32 -----------------------------------------------------------------

// Exact attention of one head in double.
std::vector<double> mla_exact_f32(const float* q, const float* cache, int len, int width, int latent, double scale) {
  std::vector<double> o(size_t(latent), 0.0);
  if (len == 0) return o;
  std::vector<double> s(static_cast<size_t>(len));
  for (int j = 0; j < len; ++j) {
    double acc = 0;
    for (int d = 0; d < width; ++d) acc += double(q[d]) * cache[size_t(j) * width + d];
    s[size_t(j)] = acc * scale;
  }
  const double m = *std::max_element(s.begin(), s.end());
  double l = 0;
  for (auto& v : s) l += v = std::exp(v - m);
  for (int j = 0; j < len; ++j)
    for (int d = 0; d < latent; ++d) o[size_t(d)] += s[size_t(j)] * cache[size_t(j) * width + d];
  for (auto& v : o) v /= l;
  return o;
}

double head_rel_l2(const float* got, const std::vector<double>& want) {
  double num = 0, den = 0;
  for (size_t d = 0; d < want.size(); ++d) {
    num += (got[d] - want[d]) * (got[d] - want[d]);
    den += want[d] * want[d];
  }
  return den > 0 ? std::sqrt(num / den) : std::sqrt(num);
}

// Two shapes: the Lite widths (16 heads, 512 + 64) with decode rows of mixed lengths (one
// split, several splits, one slot), and the tiny test models' widths with prefill-style
// cache_rows and a padding query (length 0 -> zeros). GPU vs reference (they differ only in
// expf vs libm exp) and vs exact math, per (query, head) relative L2; each query alone gives the
// same bits as in the batch.
TEST_F(F32Kernels, MlaScalarMatchesReferenceExactMathAndIsBatchInvariant) {
  std::mt19937 rng(test_seed());
  SCOPED_TRACE(::testing::Message() << "seed " << test_seed());
  struct Case {
    int heads, latent, rope;
    std::vector<int32_t> lengths, cache_rows;  // cache_rows empty: query b reads row b
    int cache_n, capacity;
  };
  const std::vector<Case> cases = {
      {16, 512, 64, {600, 1, 257, 256, 31}, {}, 5, 600},
      {4, 32, 16, {1, 2, 3, 0, 300, 257, 256, 5, 100}, {0, 0, 0, 1, 1, 2, 2, 2, 2}, 3, 300},
  };
  for (const Case& c : cases) {
    const int W = c.latent + c.rope, Q = int(c.lengths.size()), H = c.heads;
    const float scale = 1.0f / std::sqrt(float(W));
    SCOPED_TRACE(::testing::Message() << "heads " << H << " latent " << c.latent << " rope " << c.rope);
    const auto q = random_f32(size_t(Q) * H * W, rng), cache = random_f32(size_t(c.cache_n) * c.capacity * W, rng);
    const MlaDecodeArgsT<float> base{.cache_row_stride = int64_t(c.capacity) * W, .max_length = c.capacity,
                                     .latent = c.latent, .rope = c.rope, .rows = Q, .heads = H, .scale = scale};
    ASSERT_EQ(base.impl, MlaImpl::scalar) << "f32 defaults to the scalar kernel";
    std::vector<float> want(size_t(Q) * H * c.latent);
    MlaDecodeArgsT<float> r = base;
    r.q = q.data();
    r.latent_cache = cache.data();
    r.lengths = c.lengths.data();
    r.cache_rows = c.cache_rows.empty() ? nullptr : c.cache_rows.data();
    r.out = want.data();
    ref::mla_decode_scalar(r);
    DevBuf<float> dq(q), dc(cache), dout(want.size());
    DevBuf<int32_t> dl(c.lengths), dr(c.cache_rows.empty() ? std::vector<int32_t>{0} : c.cache_rows);
    DevBuf<float> ws(mla_decode_workspace_floats(Q, H, c.capacity, 256));
    MlaDecodeArgsT<float> g = base;
    g.q = dq.get();
    g.latent_cache = dc.get();
    g.lengths = dl.get();
    g.cache_rows = c.cache_rows.empty() ? nullptr : dr.get();
    g.out = dout.get();
    g.workspace = ws.get();
    mla_decode(g);
    check_device_errors();
    const auto got = dout.download();
    double worst_ref = 0, worst_exact = 0;
    for (int i = 0; i < Q; ++i) {
      const int len = c.lengths[size_t(i)], row = c.cache_rows.empty() ? i : c.cache_rows[size_t(i)];
      for (int h = 0; h < H; ++h) {
        const size_t o = (size_t(i) * H + h) * c.latent;
        if (len == 0) {
          for (int d = 0; d < c.latent; ++d) ASSERT_EQ(got[o + d], 0.0f) << "padding query " << i;
          continue;
        }
        const std::vector<double> wref(want.begin() + o, want.begin() + o + c.latent);
        const auto exact = mla_exact_f32(&q[(size_t(i) * H + h) * W], &cache[size_t(row) * c.capacity * W], len, W,
                                         c.latent, scale);
        worst_ref = std::max(worst_ref, head_rel_l2(&got[o], wref));
        worst_exact = std::max(worst_exact, head_rel_l2(&got[o], exact));
        ASSERT_LE(head_rel_l2(&want[o], exact), 1e-5) << "reference vs exact, query " << i << " head " << h;
      }
    }
    std::printf("  f32 mla (heads %d, width %d): worst per-head relative L2 %.3g vs reference, %.3g vs exact\n", H, W,
                worst_ref, worst_exact);
    EXPECT_LE(worst_ref, 2e-6);
    EXPECT_LE(worst_exact, 1e-5);
    // Each query alone (its own copy of its cache row, cut to its length) = its batch result.
    for (int i = 0; i < Q; ++i) {
      const int len = c.lengths[size_t(i)], row = c.cache_rows.empty() ? i : c.cache_rows[size_t(i)];
      if (len == 0) continue;
      std::vector<float> q1(q.begin() + size_t(i) * H * W, q.begin() + size_t(i + 1) * H * W);
      std::vector<float> c1(cache.begin() + size_t(row) * c.capacity * W,
                            cache.begin() + (size_t(row) * c.capacity + size_t(len)) * W);
      DevBuf<float> aq(q1), ac(c1), ao(size_t(H) * c.latent), aw(mla_decode_workspace_floats(1, H, len, 256));
      DevBuf<int32_t> al(std::vector<int32_t>{len});
      MlaDecodeArgsT<float> a = base;
      a.q = aq.get();
      a.latent_cache = ac.get();
      a.cache_row_stride = int64_t(len) * W;
      a.lengths = al.get();
      a.max_length = len;
      a.rows = 1;
      a.out = ao.get();
      a.workspace = aw.get();
      mla_decode(a);
      check_device_errors();
      const auto alone = ao.download();
      ASSERT_EQ(std::memcmp(alone.data(), got.data() + size_t(i) * H * c.latent, alone.size() * 4), 0)
          << "query " << i;
    }
  }
}

TEST_F(F32Kernels, MlaTensorCoreIsRefusedForF32) {
  DevBuf<float> q(16 * 48), cache(48), out(16 * 32), ws(mla_decode_workspace_floats(1, 16, 1, 256));
  DevBuf<int32_t> len(std::vector<int32_t>{1});
  try {
    mla_decode({.q = q.get(), .latent_cache = cache.get(), .cache_row_stride = 48, .lengths = len.get(),
                .max_length = 1, .out = out.get(), .latent = 32, .rope = 16, .rows = 1, .heads = 16, .scale = 0.1f,
                .workspace = ws.get(), .impl = MlaImpl::tensor_core});
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("mla_decode: impl"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace atlas::cuda::test
