// RMSNorm, RoPE (+ YaRN tables), SiLU gate and bf16 add on the GPU against the CPU references.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <numbers>
#include <numeric>
#include <string>
#include <utility>

#include "backend/cuda/cuda_internal.h"  // detail::wide_norm_setting
#include "backend/cuda/reference.h"
#include "cuda_test_util.h"

namespace atlas::cuda::test {
namespace {

// ---- host-only checks (run in CI too) -------------------------------------------------------

// The spec's worked numbers (section 3) for Lite: low = 10, high = 23; k <= 10 keeps the
// original frequency, k >= 23 is divided by 40, linear blend in between. Computed here in
// double from the spec's formula, independently of rope_table.cpp.
TEST(YarnTable, InvFreqMatchesSpecFormula) {
  const YarnParams p{};
  const std::vector<float> inv = yarn_inv_freq(p);
  ASSERT_EQ(inv.size(), 32u);
  for (int k = 0; k < 32; ++k) {
    const double ext = 1.0 / std::pow(10000.0, 2.0 * k / 64.0), inter = ext / 40.0;
    const double ramp = std::clamp((k - 10.0) / (23.0 - 10.0), 0.0, 1.0);
    const double want = inter * ramp + ext * (1.0 - ramp);
    EXPECT_NEAR(inv[k], want, 2e-6 * want) << "k=" << k;
  }
}

TEST(YarnTable, CosSinAreBf16OfTheAngle) {
  const YarnParams p{};
  const RopeTable t = build_rope_table(p, 5000);
  const std::vector<float> inv = yarn_inv_freq(p);
  for (int pos : {0, 1, 7, 4095, 4999})
    for (int k = 0; k < 32; ++k) {
      const double ang = double(float(pos) * inv[k]);
      // bf16 keeps 8 bits: half an ulp is 2^-9 relative, plus fp32 angle error at large pos.
      EXPECT_NEAR(bf(t.cos[pos * 32 + k]), std::cos(ang), 4e-3) << pos << "," << k;
      EXPECT_NEAR(bf(t.sin[pos * 32 + k]), std::sin(ang), 4e-3) << pos << "," << k;
    }
  EXPECT_EQ(bf(t.cos[0]), 1.0f);  // amplitude mscale ratio is exactly 1 for Lite
  EXPECT_EQ(bf(t.sin[0]), 0.0f);
}

TEST(Reference, BlockSumOrderIsATree) {
  // 256 partials: 1 at index 0 and tiny values elsewhere show the tree order matters only in
  // rounding; compare with a double sum within fp32 precision.
  std::mt19937 rng(test_seed());
  std::vector<float> v = random_f32(256, rng);
  double want = 0;
  for (float x : v) want += x;
  EXPECT_NEAR(ref::block_sum_ref(v.data()), want, 1e-4);
}

// ---- GPU ------------------------------------------------------------------------------------

class Elementwise : public CudaTest {};

TEST_F(Elementwise, RmsNormBitExactAndInPlace) {
  std::mt19937 rng(test_seed());
  SCOPED_TRACE(::testing::Message() << "seed " << test_seed());
  // 3000: past the 8 elements per thread kept in registers; rows 37: the wide kernel (one
  // 1024-thread block per row) where dim <= 2048, 300: the 256-thread kernel.
  for (const auto& [dim, rows] : {std::pair{2048, 37}, {512, 37}, {100, 37}, {3000, 37}, {2048, 300}, {100, 300}}) {
    const int64_t stride = dim == 512 ? 576 : dim;  // kv_a output: 512 latent of a 576 row
    auto x = random_bf16(rows * stride, rng, 3.0f);
    auto w = random_bf16(dim, rng, 0.5f);
    std::vector<uint16_t> want(size_t(rows) * dim);
    ref::rmsnorm({.x = x.data(), .weight = w.data(), .out = want.data(), .rows = rows, .dim = dim,
                  .x_stride = stride});
    DevBuf<uint16_t> dx(x), dw(w), dout(want.size());
    rmsnorm({.x = dx.get(), .weight = dw.get(), .out = dout.get(), .rows = rows, .dim = dim,
             .x_stride = stride});
    check_device_errors();
    EXPECT_EQ(dout.download(), want) << "dim " << dim << " rows " << rows;
    // Independent check of the formula in double (bf16 output: 2 roundings, <= 2^-7 relative).
    for (int r = 0; r < rows; r += 9) {
      double ss = 0;
      for (int i = 0; i < dim; ++i) ss += double(bf(x[r * stride + i])) * bf(x[r * stride + i]);
      const double rs = 1.0 / std::sqrt(ss / dim + 1e-6);
      for (int i = 0; i < dim; i += 17) {
        const double y = bf(x[r * stride + i]) * rs * bf(w[i]);
        EXPECT_NEAR(bf(want[r * dim + i]), y, std::abs(y) * 0.0079 + 1e-30);
      }
    }
    if (stride == dim) {  // in place: out aliases x
      rmsnorm({.x = dx.get(), .weight = dw.get(), .out = dx.get(), .rows = rows, .dim = dim});
      EXPECT_EQ(dx.download(), want) << "in place, dim " << dim;
    }
  }
}

TEST_F(Elementwise, RopeBitExactOnQAndKpeLayouts) {
  std::mt19937 rng(test_seed());
  SCOPED_TRACE(::testing::Message() << "seed " << test_seed());
  const int max_pos = 6000, T = 29;
  const RopeTable tab = build_rope_table(YarnParams{}, max_pos);
  DevBuf<uint16_t> dcos(tab.cos), dsin(tab.sin);
  std::vector<int32_t> pos(T);
  std::uniform_int_distribution<int> pd(0, max_pos - 1);
  for (auto& p : pos) p = pd(rng);
  pos[0] = 0;
  pos[1] = max_pos - 1;
  DevBuf<int32_t> dpos(pos);
  struct Layout { int heads; int64_t token_stride, head_stride, offset; };
  // q: [T, 16, 192], rope = last 64 of each head. kv_a output: [T, 576], k_pe = 512..575.
  for (Layout l : {Layout{16, 16 * 192, 192, 128}, Layout{1, 576, 0, 512}}) {
    auto x = random_bf16(size_t(T) * l.token_stride, rng, 2.0f);
    auto want = x;
    ref::rope_inplace({.x = want.data() + l.offset, .tokens = T, .heads = l.heads,
                       .token_stride = l.token_stride, .head_stride = l.head_stride, .rope_dim = 64,
                       .positions = pos.data(), .cos = tab.cos.data(), .sin = tab.sin.data(),
                       .max_positions = max_pos});
    DevBuf<uint16_t> dx(x);
    rope_inplace({.x = dx.get() + l.offset, .tokens = T, .heads = l.heads, .token_stride = l.token_stride,
                  .head_stride = l.head_stride, .rope_dim = 64, .positions = dpos.get(),
                  .cos = dcos.get(), .sin = dsin.get(), .max_positions = max_pos});
    check_device_errors();
    const auto got = dx.download();
    EXPECT_EQ(got, want) << "heads " << l.heads;
    // Independent: adjacent pairs rotated by pos*inv_freq (double), nope parts untouched.
    const std::vector<float> inv = yarn_inv_freq(YarnParams{});
    for (int t = 0; t < T; ++t)
      for (int h = 0; h < l.heads; ++h) {
        const int64_t base = t * l.token_stride + h * l.head_stride;
        for (int64_t i = base; i < base + l.offset; ++i) ASSERT_EQ(got[i], x[i]) << "non-rope element changed";
        for (int k = 0; k < 32; ++k) {
          const double ang = double(float(pos[t]) * inv[k]);
          const double a = bf(x[base + l.offset + 2 * k]), b = bf(x[base + l.offset + 2 * k + 1]);
          const double e = a * std::cos(ang) - b * std::sin(ang), o = b * std::cos(ang) + a * std::sin(ang);
          const double tol = 0.03 * (std::abs(a) + std::abs(b)) + 1e-6;
          EXPECT_NEAR(bf(got[base + l.offset + 2 * k]), e, tol);
          EXPECT_NEAR(bf(got[base + l.offset + 2 * k + 1]), o, tol);
        }
      }
  }
}

// The residual add fused with the next norm: x and out are the bits of add() then rmsnorm(),
// bf16 and f32, at the model's widths and one past the register-resident part (3000), on the
// wide kernel (19 rows) and the 256-thread one (300 rows).
TEST_F(Elementwise, AddRmsNormIsAddThenRmsNorm) {
  std::mt19937 rng(test_seed());
  SCOPED_TRACE(::testing::Message() << "seed " << test_seed());
  for (const auto& [dim, rows] : {std::pair{2048, 19}, {512, 19}, {100, 19}, {3000, 19}, {2048, 300}}) {
    SCOPED_TRACE(::testing::Message() << "rows " << rows);
    const int64_t n = int64_t(rows) * dim;
    auto x = random_bf16(size_t(n), rng, 3.0f), y = random_bf16(size_t(n), rng, 1.0f);
    auto w = random_bf16(dim, rng, 0.5f);
    std::vector<uint16_t> sum(static_cast<size_t>(n)), want(static_cast<size_t>(n));
    ref::add_bf16({.a = x.data(), .b = y.data(), .out = sum.data(), .n = n});
    ref::rmsnorm({.x = sum.data(), .weight = w.data(), .out = want.data(), .rows = rows, .dim = dim});
    DevBuf<uint16_t> dx(x), dy(y), dw(w), dout(static_cast<size_t>(n));
    add_rmsnorm({.x = dx.get(), .y = dy.get(), .weight = dw.get(), .out = dout.get(), .rows = rows, .dim = dim});
    check_device_errors();
    EXPECT_EQ(dx.download(), sum) << "dim " << dim;
    EXPECT_EQ(dout.download(), want) << "dim " << dim;

    std::vector<float> xf(static_cast<size_t>(n)), yf(static_cast<size_t>(n)), wf(static_cast<size_t>(dim)), sumf(static_cast<size_t>(n)), wantf(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) xf[size_t(i)] = bf(x[size_t(i)]), yf[size_t(i)] = bf(y[size_t(i)]) * 0.37f;
    for (int i = 0; i < dim; ++i) wf[size_t(i)] = bf(w[size_t(i)]);
    ref::add({.a = xf.data(), .b = yf.data(), .out = sumf.data(), .n = n});
    ref::rmsnorm(RmsNormArgsT<float>{.x = sumf.data(), .weight = wf.data(), .out = wantf.data(), .rows = rows, .dim = dim});
    DevBuf<float> fx(xf), fy(yf), fw(wf), fout(static_cast<size_t>(n));
    add_rmsnorm(AddRmsNormArgsT<float>{.x = fx.get(), .y = fy.get(), .weight = fw.get(), .out = fout.get(), .rows = rows,
                                       .dim = dim});
    check_device_errors();
    EXPECT_EQ(fx.download(), sumf) << "f32 dim " << dim;
    EXPECT_EQ(fout.download(), wantf) << "f32 dim " << dim;
  }
  DevBuf<uint16_t> d(8);
  EXPECT_THROW(add_rmsnorm({.x = d.get(), .y = d.get(), .weight = d.get(), .out = d.get(), .rows = 1, .dim = 8}), Error);
}

// The sum out of place (Sum::to_sum_out) or dropped (Sum::dropped, a second launch over the same
// x and y that needs only the normed rows; ATLAS_SHARED_FORK=o_proj): the normed rows are the
// in-place form's bits, the sum lands in sum_out or nowhere, x is left as it was, bf16 and f32,
// on the wide kernel (1 and 19 rows, the model's width and narrower). Where the launch would take
// the 256-thread kernel (wider rows, many rows) or sum_out aliases a buffer, one Error.
TEST_F(Elementwise, AddRmsNormSumOutOfPlaceOrDroppedGivesTheSameRows) {
  std::mt19937 rng(test_seed());
  SCOPED_TRACE(::testing::Message() << "seed " << test_seed());
  using Sum = AddRmsNormArgsT<uint16_t>::Sum;
  using SumF = AddRmsNormArgsT<float>::Sum;
  const int64_t dropped0 = add_rmsnorm_dropped_sum_launches();
  for (const auto& [dim, rows] : {std::pair{2048, 1}, {2048, 19}, {100, 19}}) {
    SCOPED_TRACE(::testing::Message() << "dim " << dim << " rows " << rows);
    ASSERT_TRUE(wide_row_norm(rows, dim));  // (not under ATLAS_WIDE_NORM=0)
    const size_t n = size_t(rows) * size_t(dim);
    auto x = random_bf16(n, rng, 3.0f), y = random_bf16(n, rng, 1.0f);
    auto w = random_bf16(size_t(dim), rng, 0.5f);
    DevBuf<uint16_t> ix(x), dy(y), dw(w), iout(n);  // the in-place form
    add_rmsnorm({.x = ix.get(), .y = dy.get(), .weight = dw.get(), .out = iout.get(), .rows = rows, .dim = dim});
    DevBuf<uint16_t> ox(x), osum(std::vector<uint16_t>(n, 0x7fc0)), oout(n);
    add_rmsnorm({.x = ox.get(), .y = dy.get(), .weight = dw.get(), .out = oout.get(), .rows = rows, .dim = dim,
                 .sum = Sum::to_sum_out, .sum_out = osum.get()});
    DevBuf<uint16_t> dx(x), dout(n);
    add_rmsnorm({.x = dx.get(), .y = dy.get(), .weight = dw.get(), .out = dout.get(), .rows = rows, .dim = dim,
                 .sum = Sum::dropped});
    check_device_errors();
    const auto want = iout.download(), sum = ix.download();
    EXPECT_NE(sum, x);  // (the in-place form did write)
    EXPECT_EQ(oout.download(), want);
    EXPECT_EQ(osum.download(), sum);
    EXPECT_EQ(ox.download(), x);
    EXPECT_EQ(dout.download(), want);
    EXPECT_EQ(dx.download(), x);

    std::vector<float> xf(n), yf(n), wf(static_cast<size_t>(dim));
    for (size_t i = 0; i < n; ++i) xf[i] = bf(x[i]), yf[i] = bf(y[i]) * 0.37f;
    for (int i = 0; i < dim; ++i) wf[size_t(i)] = bf(w[size_t(i)]);
    DevBuf<float> fx(xf), fy(yf), fw(wf), fout(n), gx(xf), gout(n), gsum(n);
    add_rmsnorm(AddRmsNormArgsT<float>{.x = fx.get(), .y = fy.get(), .weight = fw.get(), .out = fout.get(),
                                       .rows = rows, .dim = dim});
    add_rmsnorm(AddRmsNormArgsT<float>{.x = gx.get(), .y = fy.get(), .weight = fw.get(), .out = gout.get(),
                                       .rows = rows, .dim = dim, .sum = SumF::to_sum_out, .sum_out = gsum.get()});
    check_device_errors();
    EXPECT_EQ(gout.download(), fout.download()) << "f32";
    EXPECT_EQ(gsum.download(), fx.download()) << "f32";
    EXPECT_EQ(gx.download(), xf) << "f32";
  }
  EXPECT_EQ(add_rmsnorm_dropped_sum_launches() - dropped0, 3);
  DevBuf<uint16_t> a(300 * 3000), b(300 * 3000), c(300 * 3000), o(300 * 3000), w(3000);
  for (const auto& [dim, rows] : {std::pair{3000, 1}, {2048, 300}}) {  // the 256-thread kernel's
    SCOPED_TRACE(::testing::Message() << "dim " << dim << " rows " << rows);
    const AddRmsNormArgsT<uint16_t> base{.x = a.get(), .y = b.get(), .weight = w.get(), .out = o.get(), .rows = rows, .dim = dim};
    AddRmsNormArgsT<uint16_t> drop = base, out_of_place = base;
    drop.sum = Sum::dropped;
    out_of_place.sum = Sum::to_sum_out;
    out_of_place.sum_out = c.get();
    EXPECT_FALSE(wide_row_norm(rows, dim));
    EXPECT_THROW(add_rmsnorm(drop), Error);
    EXPECT_THROW(add_rmsnorm(out_of_place), Error);
    EXPECT_NO_THROW(add_rmsnorm(base));
  }
  check_device_errors();
  const AddRmsNormArgsT<uint16_t> ok{.x = a.get(), .y = b.get(), .weight = w.get(), .out = o.get(), .rows = 1, .dim = 2048,
                          .sum = Sum::to_sum_out, .sum_out = c.get()};
  for (uint16_t* alias : {a.get(), b.get(), o.get(), static_cast<uint16_t*>(nullptr)}) {
    AddRmsNormArgsT<uint16_t> bad = ok;
    bad.sum_out = alias;
    EXPECT_THROW(add_rmsnorm(bad), Error);
  }
}

// check_environment (no GPU needed): every switch of the CUDA backend parsed at once, a bad value
// one Error naming the variable; good values pass. The variables are restored afterwards (the
// kernels read them once, at their first launch).
TEST(EnvSettings, CheckEnvironmentNamesTheBadSwitch) {
  struct Saved {
    std::string name;
    bool set;
    std::string value;
  };
  const std::vector<std::pair<std::string, std::vector<std::string>>> cases = {
      // name, {good values..., then one bad value}
      {"ATLAS_GEMM_STREAM", {"0", "3", "6", "wg", "5"}},
      {"ATLAS_GEMM_STREAM_GROUPED", {"0", "1", "wg", "wg-gate", "wg-gate3", "wg-split", "split-gate", "split-gate3", "yes"}},
      {"ATLAS_GEMM_STREAM_LEAN", {"0", "4", "6", "8", "4/3", "5"}},
      {"ATLAS_GEMM_STREAMK", {"0", "wide", "long", "all", "both"}},
      {"ATLAS_GEMM_STREAM_FEW", {"stream8x8/3w", "splitk16x8/8w+staged", "c16x64/4w", "16x32x128/4+slices"}},
      {"ATLAS_GEMM_WIDE_GATED", {"streamwg64x8/4l2", "streamwg64x8/4lk", "c16x64/4w", "streamwg64x8/6l", "splitk16x8/8w+staged"}},
      {"ATLAS_GEMM_LONG_K", {"splitk16x8/4w+staged", "16x32x128/4+slices", "splitk16x16/8w", "32x64x128/4"}},
      {"ATLAS_GEMM_GROUPED_MANY", {"32x64x64/4", "splitk16x8/8w"}},
      {"ATLAS_GEMM_GROUPED_FEW_DOWN", {"16x32x128/4", "splitk16x8/8w", "stream8x8/3w", "16x32x128/4+slices", "c16x64/4w",
                                       "16x32x128/4l", "16x32x128/4u", "16x32x128/5h", "wg128x128x64/4"}},
      {"ATLAS_GEMM_SPLITK", {"splitk16x8/8w", "splitk16x8/8w+staged", "splitk16x16/8w", "16x32x128/4"}},
      {"ATLAS_WIDE_NORM", {"0", "1", "2"}},
      {"ATLAS_SHARED_FORK", {"norm", "o_proj", "router"}},
      {"ATLAS_GEMM_TMA", {"0", "1", "off"}},
      {"ATLAS_GEMM_TMA_PERSISTENT", {"0", "1", "-1"}},
      {"ATLAS_PDL", {"0", "1", "decode", "2"}},
      {"ATLAS_SIDE_STREAM", {"0", "1", " 0"}},
      {"ATLAS_PAD_DEDUP", {"0", "1", "no"}},
      {"ATLAS_CUDA_GRAPHS", {"0", "1", "00"}},
      {"ATLAS_STREAM_PRIORITY", {"0", "1", "high"}},
      {"ATLAS_L2_EVICT_FIRST", {"0", "1", "first"}},
      {"ATLAS_GEMM_STAGE_EARLY", {"0", "1", "yes"}},
      {"ATLAS_FAST_SMALL_M", {"0", "1", "cublas"}},
      {"ATLAS_GEMM_CLUSTER_EARLY", {"0", "1", "on"}},
      {"ATLAS_GEMM_CLUSTER16", {"0", "1", "c16"}},
      {"ATLAS_GEMM_CLUSTER_PUSH", {"0", "1", "push"}},
      {"ATLAS_MLA_EARLY_CACHE", {"0", "1", "true"}},
      {"ATLAS_GEMM_STREAM_BALANCE", {"0", "1", "even"}},
      {"ATLAS_GEMM_TAILS", {"0", "1", "yes"}},
      {"ATLAS_GEMM_STREAM_REGS", {"0", "1", "regs"}},
      {"ATLAS_ARGMAX_SPLIT", {"0", "1", "split"}},
      {"ATLAS_MLA_MERGE_EARLY", {"0", "1", "early"}},
      {"ATLAS_MOE_COMBINE_PAIRS", {"0", "1", "pairs"}},
      {"ATLAS_MLA_MERGE_VALUE", {"0", "1", "merge"}},
      {"ATLAS_MLA_PAIR_MERGE", {"0", "1", "pair"}},
      {"ATLAS_ROUTE_TAIL", {"0", "1", "tail"}},
      {"ATLAS_SHARED_DOWN_FIRST", {"0", "1", "first"}},
      {"ATLAS_SHARED_DOWN_WAIT", {"0", "1", "wait"}},
      {"ATLAS_MOE_SELF_ROUTE", {"0", "1", "self"}},
      {"ATLAS_MOE_DOWN_EARLY", {"0", "1", "early"}},
      {"ATLAS_GEMM_TIGHT_TILES", {"0", "1", "tight"}},
      {"ATLAS_ROUTE_CLUSTER", {"0", "1", "cluster"}},
      {"ATLAS_GEMM_WIDE_SPLITK4", {"0", "1", "4"}},
      {"ATLAS_COMBINE_DIRECT", {"0", "1", "rows"}},
      {"ATLAS_RUN_FUSED", {"0", "1", "fused"}},
      {"ATLAS_RUN_ROOT", {"0", "1", "root"}},
      {"ATLAS_DEVICE_EDITS", {"0", "1", "device"}},
      {"ATLAS_CACHE_POOL", {"0", "1", "pool"}},
      {"ATLAS_EARLY_GRAPHS", {"0", "1", "early"}},
      {"ATLAS_COMBINE_QKV", {"0", "1", "flag", "event", "fused"}},
      {"ATLAS_ROUTER_NORM", {"0", "1", "joined", "norm"}},
      {"ATLAS_CAPTURE_EDGES", {"add", "explicit", "plain", "all"}},
      {"ATLAS_RELEASE_FIRST", {"none", "all", "combine", "norm,route", "latent,attention,merge", "combine,"}},
      {"ATLAS_ABSORB", {"side", "before", "after", "fused", "main"}},
      {"ATLAS_MOE_PREFETCH", {"none", "routed", "shared", "both", "down"}},
      {"ATLAS_MOE_PREFETCH_AT", {"0", "1", "2", "3", "4", "5"}},
      {"ATLAS_L2_PREFETCH", {"none", "gate_up", "down", "both", "shared"}},
      {"ATLAS_L2_PREFETCH_HOW", {"bulk", "bulk_last", "line", "line_last", "lines"}},
      {"ATLAS_L2_PREFETCH_BLOCKS", {"1", "132", "1024", "0"}},
      {"ATLAS_GEMM_DOWN_BLOCKS_PER_SM", {"1", "2", "3", "4", "5"}},
      {"ATLAS_GEMM_STREAMK_GRID", {"", "1", "264", "4096", "0"}},
      {"ATLAS_MLA_PREFILL_QPB", {"1", "2", "4", "3"}},
      {"ATLAS_MLA_TILE_PARALLEL", {"0", "1", "auto"}},
      {"ATLAS_PREFILL_CHUNK_TOKENS", {"1", "8192", "999999999", "0"}},
      {"ATLAS_MLA_EXCHANGE", {"pull", "push", "async", "2"}},
      {"ATLAS_PHASE_CLOCKS", {"attention", "cluster_gemm", "merge"}},
      {"ATLAS_BLOCK_STAMPS", {"", "stamps.csv", "/tmp/stamps.csv", "/nonexistent-atlas-dir/stamps.csv"}},
      {"CUDA_DEVICE_MAX_CONNECTIONS", {"", "1", "8", "32", "33"}},
  };
  std::vector<Saved> saved;
  for (const auto& c : cases) {
    const char* v = std::getenv(c.first.c_str());
    saved.push_back({c.first, v != nullptr, v ? v : ""});
    unsetenv(c.first.c_str());
  }
  EXPECT_NO_THROW(check_environment());
  for (const auto& [name, values] : cases) {
    for (size_t i = 0; i < values.size(); ++i) {
      setenv(name.c_str(), values[i].c_str(), 1);
      const bool last = i + 1 == values.size();
      try {
        check_environment();
        if (last) ADD_FAILURE() << name << "='" << values[i] << "' passed";
      } catch (const Error& e) {
        if (!last) ADD_FAILURE() << name << "='" << values[i] << "': " << e.what();
        else
          EXPECT_NE(std::string(e.what()).find(name + ": "), std::string::npos) << e.what();
      }
    }
    unsetenv(name.c_str());
  }
  EXPECT_FALSE(env_switch("ATLAS_WIDE_NORM", false));  // unset: the default
  EXPECT_TRUE(env_switch("ATLAS_WIDE_NORM", true));
  for (const Saved& s : saved)
    if (s.set) setenv(s.name.c_str(), s.value.c_str(), 1);
}

// CUDA_DEVICE_MAX_CONNECTIONS (no GPU needed): set to 32 before main where the test process was
// not given it (the driver reads it once, at its start), the caller's value kept otherwise; the
// setting's parse takes 1 to 32 and names the variable on anything else.
TEST(EnvSettings, DeviceConnectionsDefaultIsSetBeforeTheDriverStarts) {
  const char* v = std::getenv("CUDA_DEVICE_MAX_CONNECTIONS");
  ASSERT_NE(v, nullptr) << "nothing set CUDA_DEVICE_MAX_CONNECTIONS before main";
  if (!device_connections_given()) EXPECT_STREQ(v, "32");
  EXPECT_EQ(kDeviceConnections, 32);
  EXPECT_EQ(detail::device_connections_setting(nullptr), kDeviceConnections);
  EXPECT_EQ(detail::device_connections_setting("8"), 8);
  for (const char* bad : {"0", "-1", "x", "8 ", "100"}) {
    try {
      detail::device_connections_setting(bad);
      ADD_FAILURE() << "'" << bad << "' passed";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("CUDA_DEVICE_MAX_CONNECTIONS: "), std::string::npos) << e.what();
    }
  }
}

// The wide-norm switch (no GPU needed): on by default, "0" off, a clear error otherwise.
TEST(NormSettings, WideSwitchNamesItselfOnBadValues) {
  EXPECT_TRUE(detail::wide_norm_setting(nullptr));
  EXPECT_TRUE(detail::wide_norm_setting(""));
  EXPECT_TRUE(detail::wide_norm_setting("1"));
  EXPECT_FALSE(detail::wide_norm_setting("0"));
  expect_each_rejected([](const char* v) { detail::wide_norm_setting(v); }, {"yes", "2", " 1"}, [](const char* v) {
    return std::vector<std::string>{"ATLAS_WIDE_NORM: expected 0 or 1, got '" + std::string(v) + "'"};
  });
}

// The release-first sites (no GPU needed): unset = combine, latent, norm; "none", "all", or a list;
// an unknown or empty name is one error naming the variable and the whole value.
TEST(EnvSettings, MlaExchangeParses) {
  using namespace detail;
  EXPECT_EQ(mla_exchange_setting(nullptr), 3);  // async, the default since session 36
  EXPECT_EQ(mla_exchange_setting(""), 3);
  EXPECT_EQ(mla_exchange_setting("pull"), 1);
  EXPECT_EQ(mla_exchange_setting("push"), 2);
  EXPECT_EQ(mla_exchange_setting("async"), 3);
  expect_each_rejected([](const char* v) { mla_exchange_setting(v); }, {"0", "3", "Async", "pull,push"},
                       [](const char* v) {
                         return std::vector<std::string>{"ATLAS_MLA_EXCHANGE: expected pull, push or async",
                                                         "got '" + std::string(v) + "'"};
                       });
}

TEST(EnvSettings, MlaPairReleaseParses) {
  using namespace detail;
  EXPECT_EQ(mla_pair_release_setting(nullptr), 1);  // before phase 2, the default since session 70
  EXPECT_EQ(mla_pair_release_setting(""), 1);
  EXPECT_EQ(mla_pair_release_setting("wait"), 0);
  EXPECT_EQ(mla_pair_release_setting("phase2"), 1);
  EXPECT_EQ(mla_pair_release_setting("epilogue"), 2);
  EXPECT_EQ(mla_pair_release_setting("exit"), 3);
  expect_each_rejected([](const char* v) { mla_pair_release_setting(v); }, {"0", "1", "Wait", "phase 2", "wait,exit"},
                       [](const char* v) {
                         return std::vector<std::string>{
                             "ATLAS_MLA_PAIR_RELEASE: expected wait, phase2, epilogue or exit", "got '" + std::string(v) + "'"};
                       });
}

TEST(EnvSettings, ReleaseFirstSitesParse) {
  using namespace detail;
  EXPECT_EQ(release_first_setting(nullptr), unsigned(kRfCombine | kRfLatent | kRfNorm));
  EXPECT_EQ(release_first_setting(""), unsigned(kRfCombine | kRfLatent | kRfNorm));
  EXPECT_EQ(release_first_setting("none"), 0u);
  EXPECT_EQ(release_first_setting("all"),
            unsigned(kRfCombine | kRfLatent | kRfAttention | kRfMerge | kRfNorm | kRfRoute));
  EXPECT_EQ(release_first_setting("norm"), unsigned(kRfNorm));
  EXPECT_EQ(release_first_setting("route,latent,route"), unsigned(kRfRoute | kRfLatent));
  EXPECT_EQ(release_first_setting("attention,merge"), unsigned(kRfAttention | kRfMerge));
  EXPECT_EQ(release_first_setting("attention+merge,norm"), unsigned(kRfAttention | kRfMerge | kRfNorm));
  expect_each_rejected(
      [](const char* v) { release_first_setting(v); }, {"0", "1", "norm,,route", ",norm", "Norm", "none,norm"},
      [](const char* v) {
        return std::vector<std::string>{"ATLAS_RELEASE_FIRST: expected none, all or a comma-separated list",
                                        "got '" + std::string(v) + "'"};
      });
}

// rope2: the queries' rope parts rotated out of place into the absorbed-query layout and the
// key's into the cache-slot layout, in one launch: each is the in-place reference applied to a
// copy; the sources and every other element of the destinations stay as they were.
TEST_F(Elementwise, Rope2OutOfPlaceEqualsInPlaceReference) {
  std::mt19937 rng(test_seed());
  SCOPED_TRACE(::testing::Message() << "seed " << test_seed());
  const int T = 37, max_pos = 300, nh = 16, dq = 192, dn = 128, W = 576, dc = 512;
  const RopeTable tab = build_rope_table(YarnParams{}, max_pos);
  DevBuf<uint16_t> dcos(tab.cos), dsin(tab.sin);
  std::vector<int32_t> pos(T);
  std::uniform_int_distribution<int> pd(0, max_pos - 1);
  for (auto& p : pos) p = pd(rng);
  DevBuf<int32_t> dpos(pos);
  const auto q = random_bf16(size_t(T) * nh * dq, rng, 2.0f), lat = random_bf16(size_t(T) * W, rng, 2.0f);
  const auto qt0 = random_bf16(size_t(T) * nh * W, rng), latn0 = random_bf16(size_t(T) * W, rng);
  // Reference: rotate copies of the sources in place, then place their rope parts.
  auto qr = q, lr = lat;
  ref::rope_inplace({.x = qr.data() + dn, .tokens = T, .heads = nh, .token_stride = nh * dq, .head_stride = dq,
                     .rope_dim = 64, .positions = pos.data(), .cos = tab.cos.data(), .sin = tab.sin.data(),
                     .max_positions = max_pos});
  ref::rope_inplace({.x = lr.data() + dc, .tokens = T, .heads = 1, .token_stride = W, .head_stride = W, .rope_dim = 64,
                     .positions = pos.data(), .cos = tab.cos.data(), .sin = tab.sin.data(), .max_positions = max_pos});
  auto want_qt = qt0, want_latn = latn0;
  for (int t = 0; t < T; ++t) {
    for (int h = 0; h < nh; ++h)
      std::copy_n(qr.begin() + (t * nh + h) * dq + dn, 64, want_qt.begin() + (t * nh + h) * W + dc);
    std::copy_n(lr.begin() + t * W + dc, 64, want_latn.begin() + t * W + dc);
  }
  DevBuf<uint16_t> dq_(q), dlat(lat), dqt(qt0), dlatn(latn0);
  rope2({.x = dlat.get() + dc, .tokens = T, .heads = 1, .token_stride = W, .head_stride = W, .rope_dim = 64,
         .positions = dpos.get(), .cos = dcos.get(), .sin = dsin.get(), .max_positions = max_pos,
         .out = dlatn.get() + dc},
        {.x = dq_.get() + dn, .tokens = T, .heads = nh, .token_stride = nh * dq, .head_stride = dq, .rope_dim = 64,
         .positions = dpos.get(), .cos = dcos.get(), .sin = dsin.get(), .max_positions = max_pos,
         .out = dqt.get() + dc, .out_token_stride = nh * W, .out_head_stride = W});
  check_device_errors();
  EXPECT_EQ(dqt.download(), want_qt);
  EXPECT_EQ(dlatn.download(), want_latn);
  EXPECT_EQ(dq_.download(), q) << "source changed";
  EXPECT_EQ(dlat.download(), lat) << "source changed";
  // The two jobs must share tokens / positions / tables.
  EXPECT_THROW(rope2({.x = dlat.get(), .tokens = T, .heads = 1, .token_stride = W, .rope_dim = 64,
                      .positions = dpos.get(), .cos = dcos.get(), .sin = dsin.get(), .max_positions = max_pos},
                     {.x = dq_.get(), .tokens = T - 1, .heads = 1, .token_stride = dq, .rope_dim = 64,
                      .positions = dpos.get(), .cos = dcos.get(), .sin = dsin.get(), .max_positions = max_pos}),
               Error);
}

TEST_F(Elementwise, RopeRejectsBadPositions) {
  const RopeTable tab = build_rope_table(YarnParams{}, 16);
  DevBuf<uint16_t> dcos(tab.cos), dsin(tab.sin), dx(std::vector<uint16_t>(64, 0x3f80));
  DevBuf<int32_t> dpos(std::vector<int32_t>{16});
  rope_inplace({.x = dx.get(), .tokens = 1, .heads = 1, .token_stride = 64, .head_stride = 0,
                .rope_dim = 64, .positions = dpos.get(), .cos = dcos.get(), .sin = dsin.get(),
                .max_positions = 16});
  EXPECT_THROW(check_device_errors(), Error);
  check_device_errors();  // the flag was cleared
}

// SiLU uses expf: CUDA's expf and libm's may differ in the last fp32 bit, which can move the
// bf16 rounding of silu(g) by one unit. Tolerance: <= 2 bf16 ulp per element (one from silu,
// one from the product's rounding) and at most 1% of elements differing at all.
TEST_F(Elementwise, SiluGateMatchesReference) {
  std::mt19937 rng(test_seed());
  SCOPED_TRACE(::testing::Message() << "seed " << test_seed());
  const int rows = 33, width = 1408;
  // Fused gate|up GEMM output [rows, 2*width]: gate = first half, up = second half.
  auto gu = random_bf16(size_t(rows) * 2 * width, rng, 3.0f);
  std::vector<uint16_t> want(size_t(rows) * width);
  ref::silu_gate({.gate = gu.data(), .up = gu.data() + width, .out = want.data(), .rows = rows,
                  .width = width, .in_stride = 2 * width});
  DevBuf<uint16_t> dgu(gu), dout(want.size());
  silu_gate({.gate = dgu.get(), .up = dgu.get() + width, .out = dout.get(), .rows = rows, .width = width,
             .in_stride = 2 * width});
  check_device_errors();
  const auto got = dout.download();
  size_t differ = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const int d = bf16_ulp_diff(got[i], want[i]);
    EXPECT_LE(d, 2) << i;
    differ += d != 0;
  }
  EXPECT_LE(differ, got.size() / 100);
  // Independent formula check in double.
  for (int r = 0; r < rows; r += 8)
    for (int c = 0; c < width; c += 13) {
      const double g = bf(gu[size_t(r) * 2 * width + c]), u = bf(gu[size_t(r) * 2 * width + width + c]);
      const double y = g / (1 + std::exp(-g)) * u;
      EXPECT_NEAR(bf(got[size_t(r) * width + c]), y, std::abs(y) * 0.016 + 1e-6);
    }
}

TEST_F(Elementwise, AddBitExact) {
  std::mt19937 rng(test_seed());
  const int64_t n = 100003;
  auto a = random_bf16(n, rng), b = random_bf16(n, rng, 0.01f);
  std::vector<uint16_t> want(n);
  ref::add_bf16({.a = a.data(), .b = b.data(), .out = want.data(), .n = n});
  DevBuf<uint16_t> da(a), db(b);
  add_bf16({.a = da.get(), .b = db.get(), .out = da.get(), .n = n});  // in place, residual style
  EXPECT_EQ(da.download(), want);
}


// l2_prefetch (ATLAS_L2_PREFETCH): every way of issuing it over one to four ranges (a range's
// last bulk piece shorter than 32 KB, more units than the grid's threads) runs without a launch
// or device error and leaves every byte as it was; bad ranges are one error naming the range.
TEST_F(Elementwise, L2PrefetchRunsOverItsRangesAndWritesNothing) {
  std::mt19937 rng(test_seed());
  const int64_t sizes[4] = {32768 * 3 + 128, 128, 4096 * 128, 32768 * 70};
  std::vector<std::vector<uint16_t>> host;
  std::deque<DevBuf<uint16_t>> dev;  // (DevBuf does not move)
  for (int64_t b : sizes) host.push_back(random_bf16(b / 2, rng));
  for (const auto& h : host) dev.emplace_back(h);
  for (const L2PrefetchHow how : {L2PrefetchHow::bulk, L2PrefetchHow::line})
    for (const bool last : {false, true})
      for (int ranges = 1; ranges <= 4; ++ranges)
        for (const int blocks : {0, 1, 3}) {
          L2PrefetchArgs a{.how = how, .evict_last = last, .blocks = blocks};
          for (int r = 0; r < ranges; ++r) a.ptr[r] = dev[size_t(r)].get(), a.bytes[r] = sizes[r];
          EXPECT_NO_THROW(l2_prefetch(a));
        }
  EXPECT_NO_THROW(l2_prefetch({}));  // no range: nothing launched
  for (size_t r = 0; r < host.size(); ++r) EXPECT_EQ(dev[r].download(), host[r]) << "range " << r;
  EXPECT_NO_THROW(check_device_errors());
  const auto rejects = [](const L2PrefetchArgs& a, const std::string& what) {
    try {
      l2_prefetch(a);
      ADD_FAILURE() << "accepted: " << what;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
    }
  };
  const char* base = reinterpret_cast<const char*>(dev[0].get());
  rejects({.ptr = {base}, .bytes = {100}}, "l2_prefetch: ranges[0]");
  rejects({.ptr = {base, base + 8}, .bytes = {128, 128}}, "l2_prefetch: ranges[1]");
  rejects({.ptr = {nullptr, nullptr, base}, .bytes = {0, 0, -128}}, "l2_prefetch: ranges[2]");
  rejects({.ptr = {}, .bytes = {0, 0, 0, 256}}, "l2_prefetch: ranges[3]");
  rejects({.ptr = {base}, .bytes = {128}, .blocks = -1}, "l2_prefetch: blocks");
}

// latent_to_cache: one launch gives the bits of rmsnorm, rope2 and copy_rows through an
// intermediate row (the unfused sequence the traced forward still runs), in bf16 and f32: the
// cache rows named by dst_rows (a -1 row is skipped), every other cache row untouched, the
// queries' rope parts in the absorbed-query layout. A position or a cache row out of range
// raises the same device errors as the unfused kernels.
// nh: query heads (16: V2-Lite's 512 query pairs; 21: 672, a partial round of the 256-thread
// kernel's threads). T_ tokens: up to 256 the wide kernel (one 1024-thread block per token), more
// the 256-thread one.
template <class T>
void latent_to_cache_matches_unfused(std::mt19937& rng, int nh, int T_) {
  const int max_pos = 300, dq = 192, dn = 128, W = 576, dc = 512, slots = T_ + 27;
  const RopeTable tab = build_rope_table(YarnParams{}, max_pos);
  std::vector<T> cos_t(tab.cos.size()), sin_t(tab.sin.size()), norm_w(dc), q(size_t(T_) * nh * dq),
      lat(size_t(T_) * W), qt0(size_t(T_) * nh * W), cache0(size_t(slots) * W);
  auto fill = [&](std::vector<T>& v, float sigma) {
    const auto b = random_bf16(v.size(), rng, sigma);
    for (size_t i = 0; i < v.size(); ++i) {
      if constexpr (sizeof(T) == 2)
        v[i] = b[i];
      else
        v[i] = bf16_to_f32(b[i]) * 1.37f;  // f32 values with more bits than a bf16
    }
  };
  for (size_t i = 0; i < tab.cos.size(); ++i) {
    if constexpr (sizeof(T) == 2) {
      cos_t[i] = tab.cos[i];
      sin_t[i] = tab.sin[i];
    } else {
      cos_t[i] = bf16_to_f32(tab.cos[i]);
      sin_t[i] = bf16_to_f32(tab.sin[i]);
    }
  }
  fill(norm_w, 0.5f);
  fill(q, 2.0f);
  fill(lat, 2.0f);
  fill(qt0, 1.0f);
  fill(cache0, 1.0f);
  std::vector<int32_t> pos(T_), rows(T_);
  std::uniform_int_distribution<int> pd(0, max_pos - 1);
  for (auto& p : pos) p = pd(rng);
  std::vector<int32_t> perm(slots);
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), rng);
  for (int t = 0; t < T_; ++t) rows[size_t(t)] = t % 9 == 4 ? -1 : perm[size_t(t)];  // distinct slots, some skipped
  DevBuf<T> dcos(cos_t), dsin(sin_t), dw(norm_w), dq_(q), dlat(lat), dqt_a(qt0), dqt_b(qt0), dcache_a(cache0),
      dcache_b(cache0), dlatn(size_t(T_) * W);
  DevBuf<int32_t> dpos(pos), drows(rows);
  // Unfused: the traced forward's sequence.
  rmsnorm(RmsNormArgsT<T>{.x = dlat.get(), .weight = dw.get(), .out = dlatn.get(), .rows = T_, .dim = dc,
                          .x_stride = W, .out_stride = W, .eps = 1e-6f});
  rope2(RopeArgsT<T>{.x = dlat.get() + dc, .tokens = T_, .heads = 1, .token_stride = W, .head_stride = W,
                     .rope_dim = 64, .positions = dpos.get(), .cos = dcos.get(), .sin = dsin.get(),
                     .max_positions = max_pos, .out = dlatn.get() + dc},
        RopeArgsT<T>{.x = dq_.get() + dn, .tokens = T_, .heads = nh, .token_stride = nh * dq, .head_stride = dq,
                     .rope_dim = 64, .positions = dpos.get(), .cos = dcos.get(), .sin = dsin.get(),
                     .max_positions = max_pos, .out = dqt_a.get() + dc, .out_token_stride = nh * W,
                     .out_head_stride = W});
  copy_rows(CopyRowsArgsT<T>{.src = dlatn.get(), .dst = dcache_a.get(), .dst_rows = drows.get(), .rows = T_,
                             .width = W, .src_limit = T_, .dst_limit = slots});
  const LatentCacheArgsT<T> fused{.lat = dlat.get(), .lat_stride = W, .norm_weight = dw.get(), .eps = 1e-6f,
                                  .cache = dcache_b.get(), .dst_rows = drows.get(), .cache_rows = slots, .tokens = T_,
                                  .latent = dc, .rope_dim = 64, .q = dq_.get() + dn, .q_out = dqt_b.get() + dc,
                                  .heads = nh, .q_token_stride = nh * dq, .q_head_stride = dq,
                                  .q_out_token_stride = nh * W, .q_out_head_stride = W, .positions = dpos.get(),
                                  .cos = dcos.get(), .sin = dsin.get(), .max_positions = max_pos};
  latent_to_cache(fused);
  check_device_errors();
  const auto ca = dcache_a.download(), cb = dcache_b.download();
  EXPECT_EQ(std::memcmp(ca.data(), cb.data(), ca.size() * sizeof(T)), 0) << "cache rows differ";
  EXPECT_NE(std::memcmp(cb.data(), cache0.data(), cb.size() * sizeof(T)), 0) << "nothing written";
  const auto qa = dqt_a.download(), qb = dqt_b.download();
  EXPECT_EQ(std::memcmp(qa.data(), qb.data(), qa.size() * sizeof(T)), 0) << "absorbed queries differ";
  // Errors: a cache row past cache_rows (copy_rows' bit), a position past the table (rope's).
  std::vector<int32_t> bad_rows = rows;
  bad_rows[3] = slots;
  drows.upload(bad_rows);
  latent_to_cache(fused);
  EXPECT_THROW(check_device_errors(), Error);
  drows.upload(rows);
  std::vector<int32_t> bad_pos = pos;
  bad_pos[5] = max_pos;
  dpos.upload(bad_pos);
  latent_to_cache(fused);
  EXPECT_THROW(check_device_errors(), Error);
  check_device_errors();  // cleared
  LatentCacheArgsT<T> no_q = fused;
  no_q.q = nullptr;
  EXPECT_THROW(latent_to_cache(no_q), Error);
  LatentCacheArgsT<T> narrow = fused;
  narrow.lat_stride = W - 1;
  EXPECT_THROW(latent_to_cache(narrow), Error);
}

TEST_F(Elementwise, LatentToCacheEqualsTheUnfusedKernels) {
  std::mt19937 rng(test_seed());
  SCOPED_TRACE(::testing::Message() << "seed " << test_seed());
  for (const auto& [nh, tokens] : {std::pair{16, 37}, {21, 37}, {16, 300}, {21, 300}}) {
    SCOPED_TRACE(::testing::Message() << "heads " << nh << " tokens " << tokens);
    {
      SCOPED_TRACE("bf16");
      latent_to_cache_matches_unfused<uint16_t>(rng, nh, tokens);
    }
    {
      SCOPED_TRACE("f32");
      latent_to_cache_matches_unfused<float>(rng, nh, tokens);
    }
  }
}

// gemm_with_latent (session 32): the absorbed query's GEMM and latent_to_cache in one launch
// give the bits of latent_to_cache() then gemm(): the cache rows, the queries' rotated rope parts
// and the GEMM's columns of the same absorbed-query rows, the device errors of the latent job,
// with launch overlap off and on. At V2-Lite's attention shapes (16 heads, q_nope 128, latent
// 512 + rope 64), 1 and 7 tokens (N = 512: 16 tiles per head, more than the tokens), and a
// narrow N of 64 (2 tiles) with 5 tokens, where the latent blocks outnumber the GEMM's tiles.
// Where gemm() would run another config (forced here), f32 out, or tokens = 0, it launches
// nothing and returns false.
TEST_F(Elementwise, GemmWithLatentEqualsTheTwoLaunches) {
  std::mt19937 rng(test_seed());
  SCOPED_TRACE(::testing::Message() << "seed " << test_seed());
  const int nh = 16, dq = 192, dn = 128, W = 576, dc = 512, max_pos = 300;
  const RopeTable tab = build_rope_table(YarnParams{}, max_pos);
  DevBuf<uint16_t> dcos(tab.cos), dsin(tab.sin), dnorm(random_bf16(size_t(dc), rng, 0.5f));
  const LaunchOverlap was = launch_overlap_mode();
  for (const auto& [T_, N] : {std::pair{1, 512}, {7, 512}, {5, 64}}) {
    SCOPED_TRACE(::testing::Message() << "tokens " << T_ << " N " << N);
    const int slots = T_ + 11;
    const auto q = random_bf16(size_t(T_) * nh * dq, rng, 2.0f), lat = random_bf16(size_t(T_) * W, rng, 2.0f);
    const auto wuk = random_bf16(size_t(nh) * N * dn, rng, 0.05f);
    const auto qt0 = random_bf16(size_t(T_) * nh * W, rng), cache0 = random_bf16(size_t(slots) * W, rng);
    std::vector<int32_t> pos(T_), rows(T_);
    for (int t = 0; t < T_; ++t) {
      pos[size_t(t)] = int32_t((t * 37 + 11) % max_pos);
      rows[size_t(t)] = t == 2 ? -1 : slots - 1 - t;  // distinct slots, one padding token
    }
    DevBuf<uint16_t> dq_(q), dlat(lat), dwuk(wuk), dqt_a(qt0), dqt_b(qt0), dcache_a(cache0), dcache_b(cache0);
    DevBuf<int32_t> dpos(pos), drows(rows);
    const auto gemm_for = [&](DevBuf<uint16_t>& qt) {
      return GemmArgs{.x = dq_.get(), .w = dwuk.get(), .out = qt.get(), .M = T_, .N = N, .K = dn,
                      .x_stride = nh * dq, .w_stride = dn, .out_stride = nh * W, .batch = nh,
                      .x_batch_stride = dq, .w_batch_stride = int64_t(N) * dn, .out_batch_stride = W};
    };
    const auto latent_for = [&](DevBuf<uint16_t>& qt, DevBuf<uint16_t>& cache) {
      return LatentCacheArgsT<uint16_t>{
          .lat = dlat.get(), .lat_stride = W, .norm_weight = dnorm.get(), .eps = 1e-6f, .cache = cache.get(),
          .dst_rows = drows.get(), .cache_rows = slots, .tokens = T_, .latent = dc, .rope_dim = 64,
          .q = dq_.get() + dn, .q_out = qt.get() + dc, .heads = nh, .q_token_stride = nh * dq, .q_head_stride = dq,
          .q_out_token_stride = nh * W, .q_out_head_stride = W, .positions = dpos.get(), .cos = dcos.get(),
          .sin = dsin.get(), .max_positions = max_pos};
    };
    latent_to_cache(latent_for(dqt_a, dcache_a));
    gemm(gemm_for(dqt_a));
    check_device_errors();
    const auto want_qt = dqt_a.download(), want_cache = dcache_a.download();
    EXPECT_NE(want_cache, cache0) << "nothing written";
    for (auto mode : {LaunchOverlap::off, LaunchOverlap::on}) {
      SCOPED_TRACE(::testing::Message() << "overlap " << int(mode));
      set_launch_overlap(mode);
      dqt_b.upload(qt0);
      dcache_b.upload(cache0);
      const int64_t before = gemm_latent_launches();
      ASSERT_TRUE(gemm_with_latent(gemm_for(dqt_b), latent_for(dqt_b, dcache_b)));
      check_device_errors();
      EXPECT_EQ(gemm_latent_launches(), before + 1);
      EXPECT_EQ(dqt_b.download(), want_qt) << "absorbed queries";
      EXPECT_EQ(dcache_b.download(), want_cache) << "cache rows";
    }
    set_launch_overlap(was);
    // The latent job's device errors: a cache row past cache_rows, a position past the table.
    const auto expect_error_with = [&](DevBuf<int32_t>& buf, const std::vector<int32_t>& good, int32_t bad) {
      std::vector<int32_t> v = good;
      v[0] = bad;
      buf.upload(v);
      ASSERT_TRUE(gemm_with_latent(gemm_for(dqt_b), latent_for(dqt_b, dcache_b)));
      EXPECT_THROW(check_device_errors(), Error);
      buf.upload(good);
    };
    expect_error_with(drows, rows, slots);
    expect_error_with(dpos, pos, max_pos);
    check_device_errors();  // cleared
    // Nothing launched where it does not apply.
    dqt_b.upload(qt0);
    dcache_b.upload(cache0);
    const int64_t before = gemm_latent_launches();
    gemm_force_config(0);
    EXPECT_FALSE(gemm_with_latent(gemm_for(dqt_b), latent_for(dqt_b, dcache_b))) << "another config";
    gemm_force_config(-1);
    DevBuf<float> f32_out(size_t(T_) * nh * W);
    GemmArgs f32_gemm = gemm_for(dqt_b);
    f32_gemm.out = f32_out.get();
    f32_gemm.out_type = OutType::f32;
    EXPECT_FALSE(gemm_with_latent(f32_gemm, latent_for(dqt_b, dcache_b))) << "f32 out";
    LatentCacheArgsT<uint16_t> none = latent_for(dqt_b, dcache_b);
    none.tokens = 0;
    EXPECT_FALSE(gemm_with_latent(gemm_for(dqt_b), none)) << "no tokens";
    LatentCacheArgsT<uint16_t> no_q = latent_for(dqt_b, dcache_b);
    no_q.q = nullptr;
    EXPECT_THROW(gemm_with_latent(gemm_for(dqt_b), no_q), Error) << "a bad latent argument";
    EXPECT_EQ(gemm_latent_launches(), before);
    EXPECT_EQ(dqt_b.download(), qt0) << "a call that launched nothing wrote the queries";
    EXPECT_EQ(dcache_b.download(), cache0) << "a call that launched nothing wrote the cache";
  }
}

}  // namespace
}  // namespace atlas::cuda::test
