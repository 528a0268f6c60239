// GEMM: the tensor-core batch-invariant kernel (every tile config, dense, strided batch,
// grouped), the fma_chain kernel against its bit-exact reference, cuBLASLt, CUDA-graph capture.
//
// What is exact and what has a tolerance:
//  - batch_invariant vs itself (other M, other row position, other tile config, batched,
//    grouped, predicated path, bf16 vs f32 output): bit for bit, that is the contract.
//  - batch_invariant vs the CPU reference (an FMA chain) on small-integer data: bit for bit,
//    since every partial sum is an integer below 2^24 and so exact in any order.
//  - batch_invariant vs the CPU reference on random data: a tolerance, because the tensor
//    cores add each 16-product chunk in their own order and the contract adds 256-wide K slices
//    (kernels/gemm_mma.cuh). Both sides accumulate in fp32; the error of a sum in fp32 in any
//    order is at most (terms) * 2^-24 * sum|x_k w_k| in the worst case and about
//    sqrt(terms) * 2^-24 * sum|x_k w_k| for random signs; with K = 2048 that is ~3e-6 relative
//    to sum|x w| for the reference's 2048 sequential adds and less for the contract's 16 chunk
//    adds per slice plus 8 slice adds, so 1e-5 * sum|x_k w_k| leaves a margin of a few times the
//    typical error (the bound cuBLASLt already met on the H200). bf16 out adds one rounding on
//    each side: 2^-8 |ref| (two half-ulps).
//  - batch_invariant vs its own K slices: a GEMM over K == the fp32 sum in slice order of the
//    GEMMs over each slice, bit for bit (the contract's outer loop, checked directly).
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <limits>
#include <memory>
#include <numeric>
#include <string>
#include <tuple>
#include <utility>

#include "backend/cuda/cuda_internal.h"
#include "backend/cuda/reference.h"
#include "cuda_test_util.h"

namespace atlas::cuda::test {
namespace {

class Gemm : public CudaTest {};
class GroupedGemm : public CudaTest {};

// Forces one tile config for the scope (restores the automatic choice on exit, also on failure).
struct ForceConfig {
  explicit ForceConfig(int c) { gemm_force_config(c); }
  ~ForceConfig() { gemm_force_config(-1); }
};

// The wgmma streaming config the chooser takes under this process's environment:
// ATLAS_GEMM_STREAM_REGS=1 the register-staged one, else ATLAS_GEMM_STREAM_LEAN's loop (session
// 30: the lean loop with 4 slots by default, "6" with 6, "8" 8 slots of 64-wide steps, "4/3" 4
// slots with the copies 3 steps ahead (session 38), "0" the full loop).
std::string expected_wgstream_config() {
  const char* regs = std::getenv("ATLAS_GEMM_STREAM_REGS");
  const char* lean_env = std::getenv("ATLAS_GEMM_STREAM_LEAN");
  const std::string lean = lean_env == nullptr ? "" : lean_env;
  if (regs != nullptr && std::string(regs) == "1") return "streamwg64x8/3r2";
  return lean == "0"   ? "streamwg64x8/4"
         : lean == "6" ? "streamwg64x8/6l"
         : lean == "8" ? "streamwg64x8/8l64"
         : lean == "4/3" ? "streamwg64x8/4l/3"
                       : "streamwg64x8/4l";
}

// The index of the config called `name` (-1: none).
int config_named(const std::string& name) {
  for (int c = 0; c < gemm_config_count(); ++c)
    if (gemm_config_name(c) == name) return c;
  return -1;
}

// Small integers in [-r, r]: every product and partial sum is exact in fp32.
std::vector<uint16_t> random_int_bf16(size_t n, std::mt19937& rng, int r = 4) {
  std::uniform_int_distribution<int> d(-r, r);
  std::vector<uint16_t> v(n);
  for (auto& x : v) x = f32_to_bf16(float(d(rng)));
  return v;
}

template <class T>
constexpr OutType out_type_of() {
  return std::is_same_v<T, float> ? OutType::f32 : OutType::bf16;
}

// Runs gemm with `a` (device x/w set by the caller) into a fresh poisoned buffer of out_elems.
template <class T>
std::vector<T> run(GemmArgs a, size_t out_elems) {
  DevBuf<T> dout(out_elems);
  a.out = dout.get();
  a.out_type = out_type_of<T>();
  gemm(a);
  synchronize();
  return dout.download();
}

template <class T>
std::vector<T> run_gemm(const DevBuf<uint16_t>& dx, const DevBuf<uint16_t>& dw, int M, int N, int K, GemmMode mode) {
  return run<T>({.x = dx.get(), .w = dw.get(), .M = M, .N = N, .K = K, .mode = mode}, size_t(M) * N);
}

template <class T>
std::vector<T> ref_gemm(const std::vector<uint16_t>& x, const std::vector<uint16_t>& w, int M, int N, int K) {
  std::vector<T> out(size_t(M) * N);
  ref::gemm({.x = x.data(), .w = w.data(), .out = out.data(), .out_type = out_type_of<T>(), .M = M, .N = N, .K = K});
  return out;
}

// sum_k |x[m,k] w[n,k]| in double: the scale of the fp32 accumulation error.
std::vector<float> abs_dot(const std::vector<uint16_t>& x, const std::vector<uint16_t>& w, int M, int N, int K) {
  std::vector<float> s(size_t(M) * N);
  for (int m = 0; m < M; ++m)
    for (int n = 0; n < N; ++n) {
      double a = 0;
      for (int k = 0; k < K; ++k) a += std::abs(double(bf(x[size_t(m) * K + k])) * bf(w[size_t(n) * K + k]));
      s[size_t(m) * N + n] = float(a);
    }
  return s;
}

// The stated tolerance (header comment) for any non-FMA-chain GEMM against ref::gemm.
void expect_close_to_reference(const std::vector<float>& got_f, const std::vector<uint16_t>& got_b,
                               const std::vector<float>& want, const std::vector<float>& absdot,
                               const std::string& what) {
  for (size_t i = 0; i < want.size(); ++i)
    ASSERT_NEAR(got_f[i], want[i], 1e-5f * absdot[i]) << what << " f32 out, element " << i;
  for (size_t i = 0; i < want.size(); ++i)
    ASSERT_NEAR(bf(got_b[i]), want[i], std::ldexp(std::abs(want[i]), -8) + 1e-5f * absdot[i])
        << what << " bf16 out, element " << i;
}

// The one rounding: bf16 output == bf16(fp32 output) bit for bit.
void expect_bf16_is_rounded_f32(const std::vector<uint16_t>& b, const std::vector<float>& f, const std::string& what) {
  ASSERT_EQ(b.size(), f.size());
  for (size_t i = 0; i < b.size(); ++i) ASSERT_EQ(b[i], f32_to_bf16(f[i])) << what << " element " << i;
}

// ---- fma_chain: the old scalar kernel, bit-exact to the reference -------------------------------

TEST_F(Gemm, FmaChainModeIsBitExactToReference) {
  std::mt19937 rng(test_seed());
  SCOPED_TRACE(::testing::Message() << "seed " << test_seed());
  // N and K off the tile sizes (64 / 16) to cover the edges.
  const int M = 70, N = 200, K = 2056;
  auto x = random_bf16(size_t(M) * K, rng), w = random_bf16(size_t(N) * K, rng, 0.02f);
  DevBuf<uint16_t> dx(x), dw(w);
  EXPECT_EQ(run_gemm<uint16_t>(dx, dw, M, N, K, GemmMode::fma_chain), (ref_gemm<uint16_t>(x, w, M, N, K)));
  EXPECT_EQ(run_gemm<float>(dx, dw, M, N, K, GemmMode::fma_chain), (ref_gemm<float>(x, w, M, N, K)));
}

// ---- batch_invariant: the tensor-core kernel ------------------------------------------------------

// Exact data: every config, every edge (M, N, K off the tiles, K tail of 8 and of 4 elements,
// odd N, unaligned operands) must give the reference's bits. A wrong fragment position, a
// missed k-chunk, a row or column off by one changes integers, so this catches indexing bugs.
TEST_F(Gemm, TensorCoreKernelIsExactOnIntegerDataInEveryConfig) {
  std::mt19937 rng(test_seed());
  SCOPED_TRACE(::testing::Message() << "seed " << test_seed());
  struct Shape {
    int M, N, K;
    int x_shift;  // elements: x starts this far into its buffer (1 = not 16-byte aligned)
  };
  // K = 2056 and 4104: more slices than the split-K kernel has warps (several rounds, a short
  // last slice); M = 12 and 16: split-K tiles with more than 8 rows; x_shift = 1 with M <= 16:
  // the split-K kernel's element-load variant.
  const Shape shapes[] = {{1, 8, 16, 0},   {7, 40, 2056, 0}, {70, 200, 264, 0}, {130, 136, 40, 0},
                          {33, 17, 24, 0},  {19, 72, 20, 0},  {45, 24, 136, 1}, {3, 24, 4104, 0},
                          {12, 40, 600, 0}, {16, 9, 520, 1},  {5, 33, 300, 1}};
  for (int c = -1; c < gemm_config_count(); ++c) {
    ForceConfig force(c);
    for (const Shape& s : shapes) {
      SCOPED_TRACE(::testing::Message() << "config " << (c < 0 ? "auto" : gemm_config_name(c)) << " M=" << s.M
                                        << " N=" << s.N << " K=" << s.K << " x_shift=" << s.x_shift);
      auto x = random_int_bf16(size_t(s.M) * s.K, rng), w = random_int_bf16(size_t(s.N) * s.K, rng);
      std::vector<uint16_t> xbuf(size_t(s.x_shift), 0);
      xbuf.insert(xbuf.end(), x.begin(), x.end());
      DevBuf<uint16_t> dx(xbuf), dw(w);
      const GemmArgs a{.x = dx.get() + s.x_shift, .w = dw.get(), .M = s.M, .N = s.N, .K = s.K};
      const auto got_b = run<uint16_t>(a, size_t(s.M) * s.N);
      const auto got_f = run<float>(a, size_t(s.M) * s.N);
      ASSERT_EQ(got_f, (ref_gemm<float>(x, w, s.M, s.N, s.K)));
      ASSERT_EQ(got_b, (ref_gemm<uint16_t>(x, w, s.M, s.N, s.K)));
    }
  }
}

// The weight-streaming configs (kernels/gemm_stream.cuh) where they run (K % 16 == 0; elsewhere
// they hand over to split-K): x rows past a tile's and weight rows past N come from stale shared
// memory and must never reach the output; several 8-row tiles; one slice, an odd count, a short
// last slice, sixteen; strided batches. Random data gives the split-K kernel's bits (the
// contract), integer data the reference's.
TEST_F(Gemm, StreamConfigsGiveTheContractBits) {
  std::mt19937 rng(test_seed());
  SCOPED_TRACE(::testing::Message() << "seed " << test_seed());
  struct Shape {
    int M, N, K, batch;
  };
  // (Session 28: {1, 8960, 512, 1} has 140 tiles, more than the two-warpgroup config's one block
  // per SM, so its blocks walk two tiles each and hand slice sums over twice; {3, 72, 1040, 1} a
  // short last step (K % 128 = 16) over five slices, the stream configs' tail instances. Session
  // 30: {3, 33000, 384, 1} has 516 tiles of three steps, more than any stream config's resident
  // blocks on an H200, so the lean loop's blocks walk two tiles, its copies running ahead across
  // the tile boundary from the prologue on.)
  const Shape shapes[] = {{1, 8, 16, 1},    {1, 33, 1408, 1},  {5, 40, 768, 1},  {8, 2048, 256, 1},
                          {12, 72, 2048, 1}, {3, 17, 4096, 1}, {1, 100, 512, 3}, {2, 64, 128, 16},
                          {1, 8960, 512, 1}, {1, 64, 2816, 1}, {3, 72, 1040, 1}, {3, 33000, 384, 1}};
  const int split = config_named("splitk16x8/8w");
  std::vector<int> streams;
  for (int c = 0; c < gemm_config_count(); ++c)
    if (gemm_config_name(c).rfind("stream", 0) == 0) streams.push_back(c);
  ASSERT_GE(split, 0);
  ASSERT_FALSE(streams.empty());
  for (const Shape& sh : shapes) {
    const size_t xn = size_t(sh.batch) * sh.M * sh.K, wn = size_t(sh.batch) * sh.N * sh.K;
    const size_t on = size_t(sh.batch) * sh.M * sh.N;
    const auto x = random_bf16(xn, rng), w = random_bf16(wn, rng, 0.05f);
    const auto xi = random_int_bf16(xn, rng), wi = random_int_bf16(wn, rng);
    DevBuf<uint16_t> dx(x), dw(w), dxi(xi), dwi(wi);
    const auto args = [&](const DevBuf<uint16_t>& ax, const DevBuf<uint16_t>& aw) {
      return GemmArgs{.x = ax.get(), .w = aw.get(), .M = sh.M, .N = sh.N, .K = sh.K, .batch = sh.batch,
                      .x_batch_stride = int64_t(sh.M) * sh.K, .w_batch_stride = int64_t(sh.N) * sh.K,
                      .out_batch_stride = int64_t(sh.M) * sh.N};
    };
    std::vector<float> want_f;
    std::vector<uint16_t> want_b;
    {
      ForceConfig force(split);
      want_f = run<float>(args(dx, dw), on);
      want_b = run<uint16_t>(args(dx, dw), on);
    }
    for (int c : streams) {
      ForceConfig force(c);
      SCOPED_TRACE(::testing::Message() << gemm_config_name(c) << " M=" << sh.M << " N=" << sh.N << " K=" << sh.K
                                        << " batch=" << sh.batch);
      ASSERT_EQ(run<float>(args(dx, dw), on), want_f);
      ASSERT_EQ(run<uint16_t>(args(dx, dw), on), want_b);
      if (sh.batch == 1) {
        ASSERT_EQ(run<float>(args(dxi, dwi), on), (ref_gemm<float>(xi, wi, sh.M, sh.N, sh.K)));
      }
    }
  }
}

// Stream-K (session 52): the lean loop in equal runs of (tile, K slice) units gives the unsplit
// lean loop's bits at any grid: one block per unit, a few blocks for many tiles (each holding
// heads and tails of split tiles), tiles split over more blocks than slots, tiles fewer and more
// than blocks (the workspace's two slot rules), bf16 and f32 out, gated (bf16 out), and K's last slice short
// (K = 384 on 128-wide steps, 10,944 on 64-wide: the dense MLP's down). The reference bits: the
// lean loop of the same steps ("/4l", "/8l64"); StreamConfigsGiveTheContractBits checks those
// against split-K and every stream config, this one included, at the default grid.
TEST_F(Gemm, StreamKGivesTheUnsplitBitsAtEveryGrid) {
  std::mt19937 rng(test_seed());
  SCOPED_TRACE(::testing::Message() << "seed " << test_seed());
  const int k128 = config_named("streamwg64x8/4lk"), k64 = config_named("streamwg64x8/8l64k");
  const int lean128 = config_named("streamwg64x8/4l"), lean64 = config_named("streamwg64x8/8l64");
  ASSERT_GE(k128, 0);
  ASSERT_GE(k64, 0);
  ASSERT_GE(lean128, 0);
  ASSERT_GE(lean64, 0);
  struct Shape {
    int M, N, K, gated;
  };
  // (21,888 x 2,048 gated: layer 0's gate|up, 342 tiles; 2,048 x 10,944: its down, 32 tiles of
  // 43 slices; 2,752 x 2,048: 43 tiles of 8; 520 x 384: 9 tiles (the last one 8 columns wide) of
  // a full and a one-step slice.)
  const Shape shapes[] = {{1, 21888, 2048, 10944}, {1, 2048, 10944, 0}, {3, 2752, 2048, 0}, {8, 520, 384, 0},
                          {1, 2752, 2048, 1376}};
  struct GridSetting {
    explicit GridSetting(int g) { gemm_set_streamk_grid(g); }
    ~GridSetting() { gemm_set_streamk_grid(0); }
  };
  for (const Shape& sh : shapes) {
    const auto x = random_bf16(size_t(sh.M) * sh.K, rng), w = random_bf16(size_t(sh.N) * sh.K, rng, 0.05f);
    DevBuf<uint16_t> dx(x), dw(w), scratch(size_t(sh.M) * sh.N);
    const int outs = sh.gated > 0 ? sh.gated : sh.N;
    const GemmArgs a{.x = dx.get(), .w = dw.get(), .M = sh.M, .N = sh.N, .K = sh.K, .gated = sh.gated,
                     .gated_scratch = sh.gated > 0 ? scratch.get() : nullptr};
    const size_t on = size_t(sh.M) * outs;
    for (const auto& [sk, lean] : {std::pair{k128, lean128}, std::pair{k64, lean64}}) {
      if (sh.K % (sk == k128 ? 128 : 64) != 0) continue;  // (the tail instance's K: the unsplit loops run)
      std::vector<float> want_f;
      std::vector<uint16_t> want_b;
      const bool f32 = sh.gated == 0;  // (a gated product has bf16 out only)
      {
        ForceConfig force(lean);
        if (f32) want_f = run<float>(a, on);
        want_b = run<uint16_t>(a, on);
      }
      const int64_t units = int64_t(sh.N + 63) / 64 * ((sh.K + 255) / 256);
      for (int grid : {1, 2, 3, 7, 31, 131, 396, 4000, 0}) {
        SCOPED_TRACE(::testing::Message() << gemm_config_name(sk) << " M=" << sh.M << " N=" << sh.N << " K=" << sh.K
                                          << " gated=" << sh.gated << " grid=" << grid << " units=" << units);
        ForceConfig force(sk);
        GridSetting g(grid);
        const int64_t before = gemm_streamk_launches();
        if (f32) {
          ASSERT_EQ(run<float>(a, on), want_f);
        }
        ASSERT_EQ(run<uint16_t>(a, on), want_b);
        ASSERT_EQ(gemm_streamk_launches(), before + (f32 ? 2 : 1)) << "the stream-K loop did not run";
      }
    }
  }
}

// Which problems ATLAS_GEMM_STREAMK sends to stream-K (gemm_set_streamk stands in for the
// variable): `wide` the one-row problems on the lean stream loop of at least one 64-column tile per
// SM (the LM head, layer 0's gate|up), `long` the one-row ungated ones of more than 16 K slices
// (layer 0's down), none else (the shared experts' 88-tile gate|up, more than 8 rows, the default
// 0); each with the bits of the default choice.
TEST_F(Gemm, StreamKSwitchTakesTheWideAndLongOneRowProblems) {
  std::mt19937 rng(test_seed());
  struct StreamKSetting {
    explicit StreamKSetting(int m) { gemm_set_streamk(m); }
    ~StreamKSetting() { gemm_set_streamk(-1); }
  };
  struct Case {
    int M, N, K, gated;
    bool wide, long_k;  // stream-K under `wide` / under `long`
  };
  const int sms = device_info().sm_count;
  const Case cases[] = {{1, 21888, 2048, 10944, 64 * sms <= 21888, false},
                        {1, 64 * sms, 2048, 0, true, false},
                        {1, 2048, 10944, 0, false, true},
                        {1, 5632, 2048, 2816, false, false},
                        {16, 21888, 2048, 10944, false, false},
                        {16, 2048, 10944, 0, false, false},
                        {1, 2048, 4096, 0, false, false}};
  for (const Case& cs : cases) {
    const auto x = random_bf16(size_t(cs.M) * cs.K, rng), w = random_bf16(size_t(cs.N) * cs.K, rng, 0.05f);
    DevBuf<uint16_t> dx(x), dw(w), scratch(size_t(cs.M) * cs.N);
    const GemmArgs a{.x = dx.get(), .w = dw.get(), .M = cs.M, .N = cs.N, .K = cs.K, .gated = cs.gated,
                     .gated_scratch = cs.gated > 0 ? scratch.get() : nullptr};
    const size_t on = size_t(cs.M) * (cs.gated > 0 ? cs.gated : cs.N);
    std::vector<uint16_t> want;
    {
      StreamKSetting off(0);
      const int64_t before = gemm_streamk_launches();
      want = run<uint16_t>(a, on);
      ASSERT_EQ(gemm_streamk_launches(), before);
    }
    for (int mode : {1, 2, 3}) {
      SCOPED_TRACE(::testing::Message() << "mode " << mode << " M=" << cs.M << " N=" << cs.N << " K=" << cs.K);
      StreamKSetting on_(mode);
      const int64_t before = gemm_streamk_launches();
      ASSERT_EQ(run<uint16_t>(a, on), want);
      const bool expect = ((mode & 1) != 0 && cs.wide) || ((mode & 2) != 0 && cs.long_k);
      ASSERT_EQ(gemm_streamk_launches(), before + (expect ? 1 : 0));
    }
  }
}

// The stream-K shares (no GPU needed): every unit's block (streamk_block_of) is the block whose
// run [b U / G, (b + 1) U / G) holds it, for unit counts below, at and above the grid.
TEST(GemmSettings, StreamKSharesHoldEveryUnitOnce) {
  for (int64_t G : {1, 2, 3, 7, 132, 396})
    for (int64_t U : {1, 2, 5, 131, 396, 397, 2736, 12800}) {
      for (int64_t u = 0; u < U; ++u) {
        const int64_t b = detail::gemm_streamk_block_of(u, U, G);
        ASSERT_GE(b, 0);
        ASSERT_LT(b, G);
        ASSERT_LE(b * U / G, u) << "U=" << U << " G=" << G << " u=" << u;
        ASSERT_LT(u, (b + 1) * U / G) << "U=" << U << " G=" << G << " u=" << u;
      }
    }
}

// The workspace slots of the split tiles (no GPU needed): every tile whose units more than one
// block holds gets its own slot below min(tiles, blocks) (the launcher sizes the workspace so),
// for tile counts below and above the grid, one slice to the down's 43.
TEST(GemmSettings, StreamKSplitTilesHaveTheirOwnSlots) {
  for (int64_t G : {1, 2, 3, 7, 131, 396})
    for (int64_t T : {1, 2, 9, 32, 43, 342, 1600})
      for (int S : {1, 2, 8, 43}) {
        const int64_t U = T * S, grid = std::min(U, G);
        std::vector<int> owner(size_t(std::min(T, grid)), -1);
        for (int t = 0; t < T; ++t) {
          const int b0 = detail::gemm_streamk_block_of(int64_t(t) * S, U, grid);
          const int b1 = detail::gemm_streamk_block_of(int64_t(t + 1) * S - 1, U, grid);
          ASSERT_LE(b0, b1);
          if (b0 == b1) continue;  // one block holds the whole tile: no slot
          const int slot = detail::gemm_streamk_slot(t, S, T, grid);
          SCOPED_TRACE(::testing::Message() << "G=" << G << " T=" << T << " S=" << S << " tile " << t);
          ASSERT_GE(slot, 0);
          ASSERT_LT(slot, int(owner.size()));
          ASSERT_EQ(owner[size_t(slot)], -1) << "slot " << slot << " already tile " << owner[size_t(slot)] << "'s";
          owner[size_t(slot)] = t;
        }
      }
}

// ATLAS_GEMM_STREAMK's values (no GPU needed).
TEST(GemmSettings, StreamKSwitchNamesItselfOnBadValues) {
  EXPECT_EQ(detail::gemm_streamk_setting(nullptr), 0);
  EXPECT_EQ(detail::gemm_streamk_setting(""), 0);
  EXPECT_EQ(detail::gemm_streamk_setting("0"), 0);
  EXPECT_EQ(detail::gemm_streamk_setting("wide"), 1);
  EXPECT_EQ(detail::gemm_streamk_setting("long"), 2);
  EXPECT_EQ(detail::gemm_streamk_setting("all"), 3);
  expect_each_rejected([](const char* v) { detail::gemm_streamk_setting(v); }, {"1", "both", "Wide", " all"},
                       [](const char* v) {
                         return std::vector<std::string>{"ATLAS_GEMM_STREAMK", "'" + std::string(v) + "'"};
                       });
}

// The split lean loop's parts (session 31, no GPU needed): for every K the host runs it on (K %
// 128 == 0, at least `parts` slices of 256), the parts tile [0, KT) in order, each non-empty and
// starting on a slice boundary, and part 1 starts at slice S / parts, where the tile's last
// arrival starts adding the later parts' slice sums: the contract's slice order.
TEST(GemmSettings, LeanSplitPartsAreWholeSlicesInOrder) {
  for (int parts : {2, 3, 4, 8})
    for (int K = 128; K <= 8192; K += 128) {
      const int KT = K / 128, S = (KT + 1) / 2;
      if (S < parts) continue;
      SCOPED_TRACE(::testing::Message() << "parts " << parts << " K " << K);
      EXPECT_EQ(detail::gemm_lean_part_begin(0, parts, K), 0);
      EXPECT_EQ(detail::gemm_lean_part_begin(parts, parts, K), KT);
      EXPECT_EQ(detail::gemm_lean_part_begin(1, parts, K), S / parts * 2);
      for (int q = 0; q < parts; ++q) {
        const int b = detail::gemm_lean_part_begin(q, parts, K), e = detail::gemm_lean_part_begin(q + 1, parts, K);
        EXPECT_LT(b, e) << "part " << q << " is empty";
        EXPECT_EQ(b % 2, 0) << "part " << q << " starts inside a slice";
      }
    }
  EXPECT_EQ(detail::gemm_lean_part_begin(1, 1, 2048), 16);  // one part: the whole tile
  // One token's routed down (K 1408: 11 steps, 6 slices): slices 0-2 and 3-5, steps 0-5 and 6-10.
  EXPECT_EQ(detail::gemm_lean_part_begin(1, 2, 1408), 6);
}

// The lean loop's switch (no GPU needed): 4 ring slots by default, 6, 8 (of 64-wide steps), 0
// (the full loop), a clear error otherwise.
TEST(GemmSettings, StreamLeanSwitchNamesItselfOnBadValues) {
  EXPECT_EQ(detail::gemm_stream_lean_setting(nullptr), 4);
  EXPECT_EQ(detail::gemm_stream_lean_setting(""), 4);
  EXPECT_EQ(detail::gemm_stream_lean_setting("0"), 0);
  EXPECT_EQ(detail::gemm_stream_lean_setting("4"), 4);
  EXPECT_EQ(detail::gemm_stream_lean_setting("6"), 6);
  EXPECT_EQ(detail::gemm_stream_lean_setting("8"), 8);
  EXPECT_EQ(detail::gemm_stream_lean_setting("4/3"), 3);
  expect_each_rejected([](const char* v) { detail::gemm_stream_lean_setting(v); },
                       {"1", "5", "lean", " 4", "64", "3", "4/2", "4/4"},
                       [](const char* v) {
                         return std::vector<std::string>{"ATLAS_GEMM_STREAM_LEAN", "'" + std::string(v) + "'"};
                       });
}

// The weight-streaming switch (no GPU needed): the three settings, and a clear error otherwise.
TEST(GemmSettings, StreamSwitchNamesItselfOnBadValues) {
  EXPECT_EQ(detail::gemm_stream_setting(nullptr), 1);
  EXPECT_EQ(detail::gemm_stream_setting(""), 1);
  EXPECT_EQ(detail::gemm_stream_setting("3"), 3);
  EXPECT_EQ(detail::gemm_stream_setting("6"), 6);
  EXPECT_EQ(detail::gemm_stream_setting("0"), 0);
  EXPECT_EQ(detail::gemm_stream_setting("wg"), 1);
  expect_each_rejected([](const char* v) { detail::gemm_stream_setting(v); }, {"4", "yes", " 3", "8", "1", "WG"},
                       [](const char* v) {
                         return std::vector<std::string>{"ATLAS_GEMM_STREAM", "'" + std::string(v) + "'"};
                       });
}

// A grouped launch's row-tile bound (detail::grouped_y_tiles), ceil and tight (floor,
// ATLAS_GEMM_TIGHT_TILES): never fewer than the tiles of any split of at most max_rows rows
// over the groups (random splits, and the worst cases: every group one row past a whole tile),
// and one token's six experts on 16-row tiles exactly six tight, seven not.
TEST(GemmSettings, GroupedTileBoundCoversEverySplit) {
  EXPECT_EQ(detail::grouped_y_tiles(6, 16, 64, true), 6);
  EXPECT_EQ(detail::grouped_y_tiles(6, 16, 64, false), 7);
  std::mt19937 rng(test_seed());
  for (int bm : {16, 32, 64, 128})
    for (int64_t groups : {1, 2, 6, 64})
      for (int64_t max_rows : {1, 5, 6, 16, 17, 33, 100, 768}) {
        for (int trial = 0; trial < 200; ++trial) {
          // rows: a random split of at most max_rows over the groups (some empty)
          std::uniform_int_distribution<int64_t> total_d(0, max_rows);
          int64_t left = total_d(rng), tiles = 0;
          for (int64_t g = 0; g < groups && left > 0; ++g) {
            std::uniform_int_distribution<int64_t> take(0, left);
            const int64_t r = g + 1 == groups ? left : take(rng);
            tiles += (r + bm - 1) / bm;
            left -= r;
          }
          for (bool tight : {false, true})
            ASSERT_GE(detail::grouped_y_tiles(max_rows, bm, groups, tight), tiles)
                << "bm " << bm << " groups " << groups << " max_rows " << max_rows << (tight ? " tight" : "");
        }
        // Worst case: as many groups as fit each hold bm + 1 rows (one row past a whole tile).
        int64_t left = max_rows, tiles = 0;
        for (int64_t g = 0; g < groups && left > 0; ++g) {
          const int64_t r = std::min<int64_t>(left, g + 1 == groups ? left : bm + 1);
          tiles += (r + bm - 1) / bm;
          left -= r;
        }
        ASSERT_GE(detail::grouped_y_tiles(max_rows, bm, groups, true), tiles)
            << "bm " << bm << " groups " << groups << " max_rows " << max_rows;
      }
}

// The stream configs' persistent grid (no GPU needed): never more blocks than tiles or resident
// slots. Unbalanced (the default except on an H200): every slot, min(T, slots) (the LM head: 1,600
// tiles on 396 slots, 396 blocks of which 16 walk a fifth). Balanced (ATLAS_GEMM_STREAM_BALANCE=1,
// the H200's default): no block walks more tiles than ceil(T / slots), with the fewest blocks that
// allow it (320 blocks of five).
TEST(GemmSettings, StreamGridsAreBalanced) {
  EXPECT_EQ(detail::stream_grid_blocks(1600, 396, true), 320);
  EXPECT_EQ(detail::stream_grid_blocks(1600, 396, false), 396);
  EXPECT_EQ(detail::stream_grid_blocks(308, 396, true), 308);
  EXPECT_EQ(detail::stream_grid_blocks(308, 396, false), 308);
  EXPECT_EQ(detail::stream_grid_blocks(0, 396, true), 0);
  for (int64_t slots : {1, 7, 264, 396})
    for (int64_t t = 1; t <= 3000; t += 7) {
      ASSERT_EQ(detail::stream_grid_blocks(t, slots, false), std::min(t, slots)) << "t=" << t << " slots=" << slots;
      const int64_t b = detail::stream_grid_blocks(t, slots, true);
      ASSERT_GE(b, 1);
      ASSERT_LE(b, std::min(t, slots)) << "t=" << t << " slots=" << slots;
      const int64_t rounds = (t + slots - 1) / slots;  // the fewest tiles per block possible
      int64_t most = 0;
      for (int64_t i = 0; i < b; ++i) most = std::max(most, (i + 1) * t / b - i * t / b);
      ASSERT_EQ(most, rounds) << "t=" << t << " slots=" << slots;
      ASSERT_GE(b * rounds, t);  // every tile has a block
      if (b > 1) {
        ASSERT_LT((b - 1) * rounds, t) << "fewer blocks would do: t=" << t << " slots=" << slots;
      }
    }
}

// Which devices balance their stream grids unless ATLAS_GEMM_STREAM_BALANCE says otherwise: the
// H200 (measured faster there, session 53), not the H100 (measured slower) nor anything unnamed.
TEST(GemmSettings, StreamBalanceDefaultsOnOnlyOnTheH200) {
  EXPECT_TRUE(detail::gemm_stream_balance_default("NVIDIA H200"));
  EXPECT_TRUE(detail::gemm_stream_balance_default("NVIDIA H200 NVL"));
  EXPECT_FALSE(detail::gemm_stream_balance_default("NVIDIA H100 80GB HBM3"));
  EXPECT_FALSE(detail::gemm_stream_balance_default("NVIDIA GeForce RTX 4090"));
  EXPECT_FALSE(detail::gemm_stream_balance_default(""));
}

// The routed down's blocks per SM: three unless set (session 53), 1-4 by hand, nothing else.
TEST(GemmSettings, DownBlocksPerSmDefaultsToThree) {
  EXPECT_EQ(detail::gemm_down_blocks_setting(nullptr), 3);
  EXPECT_EQ(detail::gemm_down_blocks_setting(""), 3);
  for (const char* v : {"1", "2", "3", "4"}) EXPECT_EQ(detail::gemm_down_blocks_setting(v), v[0] - '0');
  expect_each_rejected([](const char* v) { detail::gemm_down_blocks_setting(v); }, {"0", "5", "33", "three", "-1"},
                       [](const char* v) {
                         return std::vector<std::string>{"ATLAS_GEMM_DOWN_BLOCKS_PER_SM: expected 1, 2, 3 or 4 (blocks "
                                                         "per SM), got '" +
                                                         std::string(v) + "'"};
                       });
}

// The stream-K grid bound: unset is every resident slot (0), 1-4096 by hand, nothing else.
TEST(GemmSettings, StreamKGridTakesWholeBlockCounts) {
  EXPECT_EQ(detail::gemm_streamk_grid_setting(nullptr), 0);
  EXPECT_EQ(detail::gemm_streamk_grid_setting(""), 0);
  EXPECT_EQ(detail::gemm_streamk_grid_setting("1"), 1);
  EXPECT_EQ(detail::gemm_streamk_grid_setting("264"), 264);
  EXPECT_EQ(detail::gemm_streamk_grid_setting("4096"), 4096);
  expect_each_rejected([](const char* v) { detail::gemm_streamk_grid_setting(v); },
                       {"0", "4097", "10000", "-1", "+5", "08", "2 ", "many"}, [](const char* v) {
                         return std::vector<std::string>{"ATLAS_GEMM_STREAMK_GRID: expected a whole number of blocks "
                                                         "from 1 to 4096 (unset: every resident slot), got '" +
                                                         std::string(v) + "'"};
                       });
}

TEST(GemmSettings, StreamGroupedSwitchNamesItselfOnBadValues) {
  EXPECT_EQ(detail::gemm_stream_grouped_setting(nullptr), 3);
  EXPECT_EQ(detail::gemm_stream_grouped_setting(""), 3);
  EXPECT_EQ(detail::gemm_stream_grouped_setting("0"), 0);
  EXPECT_EQ(detail::gemm_stream_grouped_setting("1"), 1);
  EXPECT_EQ(detail::gemm_stream_grouped_setting("wg"), 2);
  EXPECT_EQ(detail::gemm_stream_grouped_setting("wg-gate"), 3);
  EXPECT_EQ(detail::gemm_stream_grouped_setting("wg-split"), 4);
  EXPECT_EQ(detail::gemm_stream_grouped_setting("split-gate"), 5);
  EXPECT_EQ(detail::gemm_stream_grouped_setting("split-gate3"), 6);
  EXPECT_EQ(detail::gemm_stream_grouped_setting("wg-gate3"), 7);
  expect_each_rejected([](const char* v) { detail::gemm_stream_grouped_setting(v); },
                       {"yes", "2", "true", "WG", "wg-down", "split-gate2"}, [](const char* v) {
                         return std::vector<std::string>{"ATLAS_GEMM_STREAM_GROUPED: expected 0, 1, wg, wg-gate, wg-gate3, wg-split, "
                                                         "split-gate or split-gate3, got '" +
                                                         std::string(v) + "'"};
                       });
}

// ATLAS_BLOCK_STAMPS names a file in an existing directory; anything else is one error naming the
// variable (no GPU needed: check_environment runs it before any GPU is looked for).
TEST(GemmSettings, BlockStampsFileMustBeInAnExistingDirectory) {
  EXPECT_EQ(detail::block_stamps_setting(nullptr), "");
  EXPECT_EQ(detail::block_stamps_setting(""), "");
  EXPECT_EQ(detail::block_stamps_setting("stamps.csv"), "stamps.csv");
  EXPECT_EQ(detail::block_stamps_setting("/tmp/stamps.csv"), "/tmp/stamps.csv");
  expect_each_rejected([](const char* v) { detail::block_stamps_setting(v); }, {"/nonexistent-atlas-dir/s.csv", "/tmp"},
                       [](const char* v) {
                         return std::vector<std::string>{"ATLAS_BLOCK_STAMPS: expected a file", std::string(v)};
                       });
}

TEST_F(Gemm, InvariantModeMatchesReferenceWithinTolerance) {
  std::mt19937 rng(test_seed());
  SCOPED_TRACE(::testing::Message() << "seed " << test_seed());
  for (auto [M, N, K] : {std::tuple{70, 200, 2056}, std::tuple{1, 2816, 2048}, std::tuple{130, 64, 1408}}) {
    auto x = random_bf16(size_t(M) * K, rng), w = random_bf16(size_t(N) * K, rng, 0.02f);
    DevBuf<uint16_t> dx(x), dw(w);
    const auto got_f = run_gemm<float>(dx, dw, M, N, K, GemmMode::batch_invariant);
    const auto got_b = run_gemm<uint16_t>(dx, dw, M, N, K, GemmMode::batch_invariant);
    const std::string what = "M=" + std::to_string(M) + " N=" + std::to_string(N) + " K=" + std::to_string(K);
    expect_close_to_reference(got_f, got_b, ref_gemm<float>(x, w, M, N, K), abs_dot(x, w, M, N, K), what);
    expect_bf16_is_rounded_f32(got_b, got_f, what);
  }
}

// Batch invariance: row r's bits are the same whether it runs inside M = 1, 7, 64, 128 or 1000
// rows, at any position inside the tiles, in any tile config. The canonical result is the
// automatic config at M = 1000.
TEST_F(Gemm, InvariantRowsAreIdenticalForAnyMPositionAndConfig) {
  std::mt19937 rng(test_seed());
  SCOPED_TRACE(::testing::Message() << "seed " << test_seed());
  const int total = 1000;
  // (136, 4360): 18 K slices, the last 8 wide (split-K: three rounds; tiled: a short last slice).
  for (auto [N, K] : {std::pair{576, 2048}, std::pair{2048, 1408}, std::pair{136, 4360}}) {
    auto x = random_bf16(size_t(total) * K, rng), w = random_bf16(size_t(N) * K, rng, 0.02f);
    DevBuf<uint16_t> dw(w), dx(x);
    const GemmArgs all{.x = dx.get(), .w = dw.get(), .M = total, .N = N, .K = K};
    const auto full_b = run<uint16_t>(all, size_t(total) * N);
    const auto full_f = run<float>(all, size_t(total) * N);
    expect_bf16_is_rounded_f32(full_b, full_f, "M=1000");
    const int n_configs = N == 2048 ? 0 : gemm_config_count();  // every config on two shapes
    for (int c = -1; c < n_configs; ++c) {
      ForceConfig force(c);
      for (int M : {1, 7, 9, 16, 64, 128, 1000}) {
        for (int start : {0, 5, 91, 333, total - M}) {
          if (start + M > total || start < 0) continue;
          const GemmArgs part{.x = dx.get() + size_t(start) * K, .w = dw.get(), .M = M, .N = N, .K = K};
          const auto pb = run<uint16_t>(part, size_t(M) * N);
          const auto pf = run<float>(part, size_t(M) * N);
          for (int r = 0; r < M; ++r) {
            ASSERT_TRUE(std::equal(pb.begin() + size_t(r) * N, pb.begin() + size_t(r + 1) * N,
                                   full_b.begin() + size_t(start + r) * N))
                << "bf16 out, N=" << N << " config " << (c < 0 ? "auto" : gemm_config_name(c)) << " M=" << M
                << " start=" << start << " row " << r;
            ASSERT_TRUE(std::equal(pf.begin() + size_t(r) * N, pf.begin() + size_t(r + 1) * N,
                                   full_f.begin() + size_t(start + r) * N))
                << "f32 out, N=" << N << " config " << (c < 0 ? "auto" : gemm_config_name(c)) << " M=" << M
                << " start=" << start << " row " << r;
          }
        }
      }
    }
  }
}

// The K-slice contract itself: with fp32 output, a GEMM over K equals the fp32 sum, in slice
// order starting from +0, of the GEMMs over each 256-wide K slice (each a one-slice problem, run
// in place through the row strides). Holds in every config, so the split-K kernel's reduction
// order and the tiled kernel's running total are both the contract's.
TEST_F(Gemm, InvariantResultIsTheOrderedSumOfItsKSlices) {
  std::mt19937 rng(test_seed());
  SCOPED_TRACE(::testing::Message() << "seed " << test_seed());
  constexpr int kSlice = 256;  // the contract's slice width (kernels/gemm_mma.cuh, kSliceK)
  for (auto [M, N, K] : {std::tuple{1, 40, 768}, std::tuple{12, 24, 600}, std::tuple{70, 136, 2312}}) {
    auto x = random_bf16(size_t(M) * K, rng), w = random_bf16(size_t(N) * K, rng, 0.02f);
    DevBuf<uint16_t> dx(x), dw(w);
    const int slices = (K + kSlice - 1) / kSlice;
    for (int c = -1; c < gemm_config_count(); ++c) {
      ForceConfig force(c);
      const std::string what = "config " + (c < 0 ? std::string("auto") : gemm_config_name(c)) +
                               " M=" + std::to_string(M) + " K=" + std::to_string(K);
      const auto full = run<float>({.x = dx.get(), .w = dw.get(), .M = M, .N = N, .K = K}, size_t(M) * N);
      std::vector<float> want(size_t(M) * N, 0.0f);
      for (int sl = 0; sl < slices; ++sl) {
        const int k0 = sl * kSlice, ks = std::min(kSlice, K - k0);
        const auto part = run<float>({.x = dx.get() + k0, .w = dw.get() + k0, .M = M, .N = N, .K = ks,
                                      .x_stride = K, .w_stride = K},
                                     size_t(M) * N);
        for (size_t i = 0; i < want.size(); ++i) want[i] = want[i] + part[i];
      }
      for (size_t i = 0; i < want.size(); ++i)
        ASSERT_EQ(std::memcmp(&full[i], &want[i], sizeof(float)), 0)
            << what << " element " << i << ": " << full[i] << " vs slice sum " << want[i];
    }
  }
}

// Operands that are not 16-byte aligned (odd strides, shifted pointers) take the predicated
// path: same contract, so the same bits as the aligned fast path on the same values.
TEST_F(Gemm, PredicatedPathGivesTheFastPathBits) {
  std::mt19937 rng(test_seed());
  SCOPED_TRACE(::testing::Message() << "seed " << test_seed());
  for (int M : {3, 12, 100}) {
    const int N = 96, K = 1408, ks = K + 1;  // odd row stride: no row is 16-byte aligned
    auto x = random_bf16(size_t(M) * K, rng), w = random_bf16(size_t(N) * K, rng, 0.02f);
    std::vector<uint16_t> xs(size_t(M) * ks + 1, 0), ws(size_t(N) * ks + 1, 0);
    for (int m = 0; m < M; ++m) std::copy_n(x.begin() + size_t(m) * K, K, xs.begin() + 1 + size_t(m) * ks);
    for (int n = 0; n < N; ++n) std::copy_n(w.begin() + size_t(n) * K, K, ws.begin() + 1 + size_t(n) * ks);
    DevBuf<uint16_t> dx(x), dw(w), dxs(xs), dws(ws);
    const GemmArgs fast{.x = dx.get(), .w = dw.get(), .M = M, .N = N, .K = K};
    const GemmArgs slow{.x = dxs.get() + 1, .w = dws.get() + 1, .M = M, .N = N, .K = K, .x_stride = ks, .w_stride = ks};
    EXPECT_EQ(run<uint16_t>(slow, size_t(M) * N), run<uint16_t>(fast, size_t(M) * N)) << "M=" << M;
    EXPECT_EQ(run<float>(slow, size_t(M) * N), run<float>(fast, size_t(M) * N)) << "M=" << M;
  }
}

// Strided batch, as the MLA absorptions use it: 16 heads, x a per-head slice of [M, 16, dx],
// W [16, N, K], out a per-head slice of [M, 16, dout]. One batched launch == 16 dense ones, and
// the batched fma_chain == the batched reference, bit for bit; cuBLASLt within tolerance.
TEST_F(Gemm, StridedBatchEqualsPerBatchDense) {
  std::mt19937 rng(test_seed());
  SCOPED_TRACE(::testing::Message() << "seed " << test_seed());
  const int H = 16, M = 37;
  struct Case {
    int N, K, dx, dout;  // dx, dout: per-head widths of the strided activations
  };
  for (const Case cs : {Case{512, 128, 192, 576}, Case{128, 512, 512, 128}}) {
    SCOPED_TRACE(::testing::Message() << "N=" << cs.N << " K=" << cs.K);
    auto x = random_bf16(size_t(M) * H * cs.dx, rng), w = random_bf16(size_t(H) * cs.N * cs.K, rng, 0.05f);
    DevBuf<uint16_t> dx(x), dw(w);
    const size_t out_elems = size_t(M) * H * cs.dout;
    const GemmArgs batched{.x = dx.get(), .w = dw.get(), .M = M, .N = cs.N, .K = cs.K, .x_stride = H * cs.dx,
                           .out_stride = H * cs.dout, .batch = H, .x_batch_stride = cs.dx,
                           .w_batch_stride = int64_t(cs.N) * cs.K, .out_batch_stride = cs.dout};
    // Every config batched (blockIdx.z) against the automatic per-head dense calls.
    for (bool f32 : {false, true}) {
      DevBuf<uint16_t> each(out_elems * 2);  // room for fp32 too
      for (int h = 0; h < H; ++h) {
        GemmArgs d = batched;
        d.out_type = f32 ? OutType::f32 : OutType::bf16;
        d.batch = 1;
        d.x = dx.get() + h * cs.dx;
        d.w = dw.get() + size_t(h) * cs.N * cs.K;
        d.out = each.get() + size_t(h) * cs.dout * (f32 ? 2 : 1);
        gemm(d);
      }
      const auto want_each = each.download();
      for (int c = -1; c < gemm_config_count(); ++c) {
        ForceConfig force(c);
        DevBuf<uint16_t> once(out_elems * 2);
        GemmArgs a = batched;
        a.out = once.get();
        a.out_type = f32 ? OutType::f32 : OutType::bf16;
        gemm(a);
        synchronize();
        EXPECT_EQ(once.download(), want_each)
            << (f32 ? "f32" : "bf16") << " out, config " << (c < 0 ? "auto" : gemm_config_name(c));
      }
    }
    // fma_chain batched vs the batched reference (checks the reference's batch loop too).
    std::vector<float> want(out_elems, -1.0f);
    GemmArgs r = batched;
    r.x = x.data();
    r.w = w.data();
    r.out = want.data();
    r.out_type = OutType::f32;
    ref::gemm(r);
    GemmArgs chain = batched;
    chain.mode = GemmMode::fma_chain;
    const auto got_chain = run<float>(chain, out_elems);
    DevBuf<float> poison(1);
    const float p = poison.download()[0];
    for (size_t i = 0; i < out_elems; ++i)
      if ((i % cs.dout) >= size_t(cs.N)) {  // gaps between heads: never written
        ASSERT_EQ(std::memcmp(&got_chain[i], &p, 4), 0) << "element " << i << " written";
      } else {
        ASSERT_EQ(got_chain[i], want[i]) << "fma_chain element " << i;
      }
    // cuBLASLt strided batch: within the stated tolerance of the reference.
    GemmArgs lt = batched;
    lt.mode = GemmMode::fast;
    const auto lt_f = run<float>(lt, out_elems);
    for (int h = 0; h < H; ++h)
      for (int m = 0; m < M; ++m)
        for (int n = 0; n < cs.N; ++n) {
          const size_t i = size_t(m) * H * cs.dout + size_t(h) * cs.dout + n;
          double s = 0;
          for (int k = 0; k < cs.K; ++k)
            s += std::abs(double(bf(x[size_t(m) * H * cs.dx + size_t(h) * cs.dx + k])) *
                          bf(w[(size_t(h) * cs.N + n) * cs.K + k]));
          ASSERT_NEAR(lt_f[i], want[i], 1e-5 * s) << "cuBLASLt batched, head " << h << " row " << m << " col " << n;
        }
  }
}

// ---- grouped (MoE) ----------------------------------------------------------------------------------

struct GroupedCase {
  std::vector<int> counts;  // rows per group
  int N, K;
  int x_rows_total;  // rows of x for the gather (0: no gather, A rows are x rows directly)
  int slack;         // max_rows - sum(counts): rows that must stay unwritten
  bool spaced = true;  // the groups' weights in one block at one stride, passed as w_base (the TMA kernel)
};

// Group weights in one device block at a stride past N * K (a gap, as between a model's experts),
// 16-byte aligned: what GroupedGemmArgs::w_base describes.
struct SpacedWeights {
  int64_t stride = 0;
  std::unique_ptr<DevBuf<uint16_t>> block;
  std::vector<const uint16_t*> ptrs;
  SpacedWeights(const std::vector<std::vector<uint16_t>>& w, size_t elems)
      : stride(int64_t((elems + 7) / 8 * 8 + 64)) {
    std::vector<uint16_t> all(size_t(stride) * w.size(), 0xffff);
    for (size_t g = 0; g < w.size(); ++g) std::copy(w[g].begin(), w[g].end(), all.begin() + int64_t(g) * stride);
    block = std::make_unique<DevBuf<uint16_t>>(all);
    for (size_t g = 0; g < w.size(); ++g) ptrs.push_back(block->get() + int64_t(g) * stride);
  }
};

// Grouped rows == the dense kernel on that group's rows (gathered on the host), bit for bit, in
// every tile config; rows past offsets[groups] untouched; no device error raised.
template <class T>
void check_grouped(const GroupedCase& gc, std::mt19937& rng) {
  const int G = int(gc.counts.size()), N = gc.N, K = gc.K;
  const std::vector<int32_t> offsets = group_offsets(gc.counts);
  const int rows = offsets.back(), max_rows = rows + gc.slack;
  const int x_count = gc.x_rows_total > 0 ? gc.x_rows_total : std::max(rows, 1);
  auto x = random_bf16(size_t(x_count) * K, rng);
  std::vector<int32_t> x_rows;
  if (gc.x_rows_total > 0) x_rows = random_rows(std::max(max_rows, 1), gc.x_rows_total, rng);
  std::vector<std::vector<uint16_t>> w(static_cast<size_t>(G));
  for (int g = 0; g < G; ++g) w[size_t(g)] = random_bf16(size_t(N) * K, rng, 0.03f);
  const SpacedWeights sw(w, size_t(N) * K);
  const std::vector<const uint16_t*>& wptr = sw.ptrs;
  DevBuf<uint16_t> dx(x);
  DevBuf<int32_t> doff(offsets);
  DevBuf<int32_t> drows(x_rows.empty() ? std::vector<int32_t>{0} : x_rows);
  DevBuf<const uint16_t*> dwptr(wptr);
  const size_t out_elems = size_t(std::max(max_rows, 1)) * N;
  for (int c = -1; c < gemm_config_count(); ++c) {
    ForceConfig force(c);
    SCOPED_TRACE(::testing::Message() << "config " << (c < 0 ? "auto" : gemm_config_name(c)));
    DevBuf<T> dout(out_elems);
    grouped_gemm({.x = dx.get(), .x_rows = x_rows.empty() ? nullptr : drows.get(), .w = dwptr.get(),
                  .offsets = doff.get(), .out = dout.get(), .out_type = out_type_of<T>(), .groups = G,
                  .max_rows = max_rows, .N = N, .K = K, .x_rows_limit = x_count,
                  .w_base = gc.spaced ? wptr[0] : nullptr, .w_group_stride = gc.spaced ? sw.stride : 0});
    check_device_errors();  // synchronises; must not throw
    const auto got = dout.download();
    DevBuf<T> poison(1);
    const T p = poison.download()[0];
    for (int g = 0; g < G; ++g) {
      const int lo = offsets[size_t(g)], n_rows = gc.counts[size_t(g)];
      if (n_rows == 0) continue;
      std::vector<uint16_t> xg(size_t(n_rows) * K);
      for (int r = 0; r < n_rows; ++r) {
        const int src = x_rows.empty() ? lo + r : x_rows[size_t(lo + r)];
        std::copy_n(x.begin() + size_t(src) * K, K, xg.begin() + size_t(r) * K);
      }
      DevBuf<uint16_t> dxg(xg);
      const auto want = run<T>({.x = dxg.get(), .w = wptr[size_t(g)], .M = n_rows, .N = N, .K = K}, size_t(n_rows) * N);
      ASSERT_TRUE(std::equal(want.begin(), want.end(), got.begin() + size_t(lo) * N)) << "group " << g;
    }
    for (size_t i = size_t(rows) * N; i < size_t(max_rows) * N; ++i)
      ASSERT_EQ(std::memcmp(&got[i], &p, sizeof(T)), 0) << "slack element " << i << " written";
  }
}

TEST_F(GroupedGemm, RowsEqualTheDenseGemmOfTheirGroup) {
  std::mt19937 rng(test_seed());
  SCOPED_TRACE(::testing::Message() << "seed " << test_seed());
  // Empty groups (first, middle, last), a group of 1, groups across tile boundaries, gather.
  const GroupedCase with_gather{{0, 5, 0, 1, 40, 17, 130, 3, 0}, 200, 264, 120, 9};
  check_grouped<uint16_t>(with_gather, rng);
  check_grouped<float>(with_gather, rng);
  GroupedCase unspaced = with_gather;  // no w_base: the TMA config runs its cp.async kernel
  unspaced.spaced = false;
  check_grouped<uint16_t>(unspaced, rng);
  // Groups over two and three 192-row tiles (the TMA kernel's A boxes run into the next group's
  // rows and past the last row), K of 9 slices with a short last step.
  check_grouped<uint16_t>({{250, 0, 401, 7}, 136, 2120, 300, 4}, rng);
  // No gather, K with a tail of 8, odd N.
  check_grouped<uint16_t>({{33, 0, 64, 2}, 75, 136, 0, 0}, rng);
  // One group == a dense GEMM; every group empty (nothing written, no error).
  check_grouped<uint16_t>({{77}, 64, 512, 0, 5}, rng);
  check_grouped<uint16_t>({{0, 0, 0, 0}, 64, 128, 10, 6}, rng);
  // Decode-like: 6 rows over 64 experts, gathered from 1 token.
  std::vector<int> decode(64, 0);
  for (int e : {3, 9, 10, 31, 50, 63}) decode[size_t(e)] = 1;
  check_grouped<uint16_t>({decode, 128, 256, 1, 0}, rng);
  // The same at the routed experts' down K (11 whole 128-wide steps: "16x32x128/4u"'s unrolled
  // loop runs twice and breaks in its last pass), fp32 out.
  check_grouped<float>({decode, 96, 1408, 1, 0}, rng);
  // Batch-128-like: ~12 rows per expert (split-K tiles with more than 8 rows), 9 K slices.
  std::vector<int> busy(16, 0);
  for (int e = 0; e < 16; ++e) busy[size_t(e)] = (e * 7) % 13 + 6;
  check_grouped<float>({busy, 48, 2056, 64, 3}, rng);
  // Groups over two 8-row tiles, odd N, a short last slice, gather (the stream configs run:
  // K % 16 == 0).
  check_grouped<uint16_t>({{9, 0, 1, 12, 0, 3}, 44, 1408, 30, 2}, rng);
  // Unaligned K (predicated path) with gather.
  check_grouped<float>({{4, 0, 9}, 24, 20, 7, 2}, rng);
  // The lean stream loop's shared-memory tables (session 40: at most 64 groups and 64 rows) at
  // their bound, and just past it on either count (the global tables): the same bits either way.
  std::vector<int> at_bound(64, 1), more_groups(65, 0), more_rows(64, 1);
  for (int g = 0; g < 65; g += 7) more_groups[size_t(g)] = 2;
  more_rows[17] = 2;
  check_grouped<uint16_t>({at_bound, 72, 512, 40, 0}, rng);
  check_grouped<uint16_t>({more_groups, 72, 512, 40, 0}, rng);
  check_grouped<uint16_t>({more_rows, 72, 512, 40, 0}, rng);
}

// Bad offsets: the kernel writes nothing and raises the device flag; check_device_errors()
// throws naming grouped_gemm and the field, then the flag is clear again.
// ---- fused gate|up + SiLU (GemmArgs / GroupedGemmArgs::gated) ------------------------------------

// The unfused pair of steps the fused epilogue must reproduce: silu_gate over a [rows, 2I] product.
std::vector<uint16_t> silu_of(const std::vector<uint16_t>& gu, int rows, int I) {
  DevBuf<uint16_t> dgu(gu), dact(size_t(rows) * I);
  silu_gate({.gate = dgu.get(), .up = dgu.get() + I, .out = dact.get(), .rows = rows, .width = I, .in_stride = 2 * I});
  synchronize();
  return dact.download();
}

TEST_F(Gemm, GatedEqualsTheGemmThenSiluGateInEveryConfig) {
  std::mt19937 rng(test_seed());
  SCOPED_TRACE(::testing::Message() << "seed " << test_seed());
  // M from a decode row to two 192-row tiles; I not a multiple of any tile width.
  for (const auto& [M, I, K] : {std::tuple{1, 72, 264}, std::tuple{7, 200, 512}, std::tuple{130, 72, 264},
                                std::tuple{400, 136, 256}}) {
    const int N = 2 * I;
    const auto x = random_bf16(size_t(M) * K, rng);
    const auto w = random_bf16(size_t(N) * K, rng, 0.1f);
    DevBuf<uint16_t> dx(x), dw(w), scratch(size_t(M) * N);
    for (int c = -1; c < gemm_config_count(); ++c) {
      ForceConfig force(c);
      SCOPED_TRACE(::testing::Message() << "M " << M << " I " << I << " config "
                                        << (c < 0 ? "auto" : gemm_config_name(c)));
      const auto want = silu_of(run<uint16_t>({.x = dx.get(), .w = dw.get(), .M = M, .N = N, .K = K}, size_t(M) * N), M, I);
      const auto got = run<uint16_t>({.x = dx.get(), .w = dw.get(), .M = M, .N = N, .K = K, .gated = I,
                                      .gated_scratch = scratch.get()},
                                     size_t(M) * I);
      ASSERT_EQ(got, want);
    }
    // The fast mode: cuBLASLt's product, then silu_gate.
    const auto want = silu_of(run_gemm<uint16_t>(dx, dw, M, N, K, GemmMode::fast), M, I);
    const auto got = run<uint16_t>({.x = dx.get(), .w = dw.get(), .M = M, .N = N, .K = K, .mode = GemmMode::fast,
                                    .gated = I, .gated_scratch = scratch.get()},
                                   size_t(M) * I);
    ASSERT_EQ(got, want) << "fast mode, M " << M;
  }
}

// Launch overlap on: every config's blocks prefetch their weights into L2 before they wait for
// the kernel before them (kern::start_tile); the products are the bits of overlap off, also when
// the GEMM follows another GEMM on the stream (so the wait really has something to wait for).
// (1 x 36 x 4360: 18 K slices, three rounds of the staged split-K's eight warps, the first staged
// early, with a short last slice and a part column tile; session 69.)
TEST_F(Gemm, LaunchOverlapWithWeightPrefetchGivesTheSameBits) {
  std::mt19937 rng(test_seed());
  SCOPED_TRACE(::testing::Message() << "seed " << test_seed());
  const LaunchOverlap was = launch_overlap_mode();
  for (const auto& [M, N, K] : {std::tuple{1, 200, 520}, std::tuple{130, 136, 1032}, std::tuple{16, 2816, 2048},
                                std::tuple{1, 36, 4360}}) {
    const auto x = random_bf16(size_t(M) * K, rng);
    const auto w = random_bf16(size_t(N) * K, rng, 0.1f);
    DevBuf<uint16_t> dx(x), dw(w), scratch(size_t(M) * N);
    for (int c = -1; c < gemm_config_count(); ++c) {
      ForceConfig force(c);
      SCOPED_TRACE(::testing::Message() << "M " << M << " N " << N << " config "
                                        << (c < 0 ? "auto" : gemm_config_name(c)));
      std::vector<std::vector<uint16_t>> outs;
      for (bool on : {false, true}) {
        set_launch_overlap(on);
        DevBuf<uint16_t> first(size_t(M) * N), second(size_t(M) * N), gated(size_t(M) * N / 2);
        gemm({.x = dx.get(), .w = dw.get(), .out = first.get(), .M = M, .N = N, .K = K});
        gemm({.x = dx.get(), .w = dw.get(), .out = second.get(), .M = M, .N = N, .K = K});
        gemm({.x = dx.get(), .w = dw.get(), .out = gated.get(), .M = M, .N = N, .K = K, .gated = N / 2,
              .gated_scratch = scratch.get()});
        synchronize();
        outs.push_back(first.download());
        outs.push_back(second.download());
        outs.push_back(gated.download());
      }
      set_launch_overlap(was);
      EXPECT_EQ(outs[0], outs[1]) << "the same product twice";
      EXPECT_EQ(outs[0], outs[3]) << "overlap on, first";
      EXPECT_EQ(outs[1], outs[4]) << "overlap on, second";
      EXPECT_EQ(outs[2], outs[5]) << "overlap on, gated";
    }
  }
  set_launch_overlap(was);
}

// base (a grouped problem) into out, then the same problem gated (N / 2 activations) into
// gated_out through scratch: the two grouped calls of the caching-hint tests below.
void grouped_plain_and_gated(const GroupedGemmArgs& base, uint16_t* out, uint16_t* gated_out, uint16_t* scratch) {
  GroupedGemmArgs ga = base;
  ga.out = out;
  grouped_gemm(ga);
  GroupedGemmArgs gg = base;
  gg.out = gated_out;
  gg.gated = base.N / 2;
  gg.gated_scratch = scratch;
  grouped_gemm(gg);
}

// The weight copies' L2 evict_first policy is a caching hint: every config, dense (plain, gated,
// strided batch) and grouped (gathered rows, empty groups, gated), gives the same bits with it
// off and on.
TEST_F(Gemm, WeightEvictFirstGivesTheSameBits) {
  std::mt19937 rng(test_seed());
  SCOPED_TRACE(::testing::Message() << "seed " << test_seed());
  const bool was = gemm_weight_evict_first();
  const std::vector<int> counts = {0, 3, 1, 0, 70, 9};
  const int G = int(counts.size());
  const std::vector<int32_t> offsets = group_offsets(counts);
  const int rows = offsets.back();
  for (const auto& [M, N, K] : {std::tuple{1, 200, 520}, std::tuple{130, 136, 1032}, std::tuple{8, 2816, 2048}}) {
    const auto x = random_bf16(size_t(M) * K * 2, rng);
    const auto w = random_bf16(size_t(N) * K * 2, rng, 0.1f);
    DevBuf<uint16_t> dx(x), dw(w), scratch(size_t(std::max(M, rows)) * N * 2);
    const std::vector<int32_t> x_rows = random_rows(rows, M, rng);
    std::vector<std::vector<uint16_t>> gw;
    for (int g = 0; g < G; ++g) gw.push_back(random_bf16(size_t(N) * K, rng, 0.1f));
    const SpacedWeights sw(gw, size_t(N) * K);
    DevBuf<int32_t> doff(offsets), drows(x_rows);
    DevBuf<const uint16_t*> dwptr(sw.ptrs);
    for (int c = -1; c < gemm_config_count(); ++c) {
      ForceConfig force(c);
      SCOPED_TRACE(::testing::Message() << "M " << M << " N " << N << " K " << K << " config "
                                        << (c < 0 ? "auto" : gemm_config_name(c)));
      std::vector<std::vector<uint16_t>> outs[2];
      for (int on = 0; on < 2; ++on) {
        set_gemm_weight_evict_first(on == 1);
        DevBuf<uint16_t> plain(size_t(M) * N), gated(size_t(M) * N / 2), batched(size_t(M) * N * 2);
        DevBuf<uint16_t> grouped(size_t(rows) * N), ggated(size_t(rows) * N / 2);
        gemm({.x = dx.get(), .w = dw.get(), .out = plain.get(), .M = M, .N = N, .K = K});
        gemm({.x = dx.get(), .w = dw.get(), .out = gated.get(), .M = M, .N = N, .K = K, .gated = N / 2,
              .gated_scratch = scratch.get()});
        gemm({.x = dx.get(), .w = dw.get(), .out = batched.get(), .M = M, .N = N, .K = K, .batch = 2,
              .x_batch_stride = int64_t(M) * K, .w_batch_stride = int64_t(N) * K, .out_batch_stride = int64_t(M) * N});
        const GroupedGemmArgs base{.x = dx.get(), .x_rows = drows.get(), .w = dwptr.get(), .offsets = doff.get(),
                                   .groups = G, .max_rows = rows, .N = N, .K = K, .x_rows_limit = M,
                                   .w_base = sw.ptrs[0], .w_group_stride = sw.stride};
        grouped_plain_and_gated(base, grouped.get(), ggated.get(), scratch.get());
        synchronize();
        for (DevBuf<uint16_t>* b : {&plain, &gated, &batched, &grouped, &ggated}) outs[on].push_back(b->download());
      }
      set_gemm_weight_evict_first(was);
      const char* what[] = {"plain", "gated", "batched", "grouped", "grouped gated"};
      for (size_t i = 0; i < outs[0].size(); ++i) EXPECT_EQ(outs[0][i], outs[1][i]) << what[i];
    }
  }
  set_gemm_weight_evict_first(was);
}

// GemmArgs / GroupedGemmArgs::next (session 33, ATLAS_MOE_PREFETCH) is an L2 prefetch of the
// next GEMM's weights: every config, dense (plain, gated) and grouped (gathered rows, empty
// groups, gated), gives the same bits with it as without, at the loop's start, middle and end;
// and a malformed hint is one error naming the field. (The lean stream configs are the ones that
// issue it; an address it computed wrong would fault here.)
void expect_error(const std::function<void()>& f, const std::string& what);  // (bad arguments, below)

TEST_F(Gemm, NextWeightPrefetchGivesTheSameBits) {
  std::mt19937 rng(test_seed());
  SCOPED_TRACE(::testing::Message() << "seed " << test_seed());
  const std::vector<int> counts = {0, 3, 1, 0, 70, 9, 0, 1};
  const int G = int(counts.size());
  const std::vector<int32_t> offsets = group_offsets(counts);
  const int rows = offsets.back();
  for (const auto& [M, N, K] : {std::tuple{1, 200, 520}, std::tuple{8, 2816, 2048}}) {
    const auto x = random_bf16(size_t(M) * K * 2, rng);
    const auto w = random_bf16(size_t(N) * K * 2, rng, 0.1f);
    DevBuf<uint16_t> dx(x), dw(w), scratch(size_t(std::max(M, rows)) * N * 2);
    const std::vector<int32_t> x_rows = random_rows(rows, M, rng);
    std::vector<std::vector<uint16_t>> gw, nw;
    for (int g = 0; g < G; ++g) gw.push_back(random_bf16(size_t(N) * K, rng, 0.1f));
    for (int g = 0; g < G; ++g) nw.push_back(random_bf16(size_t(K) * 512, rng, 0.1f));  // the "down"s
    const SpacedWeights sw(gw, size_t(N) * K), snext(nw, size_t(K) * 512);
    DevBuf<int32_t> doff(offsets), drows(x_rows);
    DevBuf<const uint16_t*> dwptr(sw.ptrs), dnext(snext.ptrs);
    DevBuf<uint16_t> dense_next(size_t(K) * 512);
    const int64_t next_bytes = int64_t(K) * 512 * 2;
    for (int c = -1; c < gemm_config_count(); ++c) {
      ForceConfig force(c);
      for (int at : c < 0 ? std::vector<int>{0, 1, 2, 4} : std::vector<int>{0, 4}) {
        SCOPED_TRACE(::testing::Message() << "M " << M << " N " << N << " K " << K << " config "
                                          << (c < 0 ? "auto" : gemm_config_name(c)) << " at " << at);
        std::vector<std::vector<uint16_t>> outs[2];
        for (int on = 0; on < 2; ++on) {
          const L2NextWeights dn = on ? L2NextWeights{.w = dense_next.get(), .bytes = next_bytes, .at = at}
                                      : L2NextWeights{};
          const L2NextWeights gn = on ? L2NextWeights{.w_groups = dnext.get(), .bytes = next_bytes, .at = at}
                                      : L2NextWeights{};
          DevBuf<uint16_t> plain(size_t(M) * N), gated(size_t(M) * N / 2);
          DevBuf<uint16_t> grouped(size_t(rows) * N), ggated(size_t(rows) * N / 2);
          gemm({.x = dx.get(), .w = dw.get(), .out = plain.get(), .M = M, .N = N, .K = K, .next = dn});
          gemm({.x = dx.get(), .w = dw.get(), .out = gated.get(), .M = M, .N = N, .K = K, .gated = N / 2,
                .gated_scratch = scratch.get(), .next = dn});
          const GroupedGemmArgs base{.x = dx.get(), .x_rows = drows.get(), .w = dwptr.get(), .offsets = doff.get(),
                                     .groups = G, .max_rows = rows, .N = N, .K = K, .x_rows_limit = M,
                                     .w_base = sw.ptrs[0], .w_group_stride = sw.stride, .next = gn};
          grouped_plain_and_gated(base, grouped.get(), ggated.get(), scratch.get());
          synchronize();
          for (DevBuf<uint16_t>* b : {&plain, &gated, &grouped, &ggated}) outs[on].push_back(b->download());
        }
        const char* what[] = {"plain", "gated", "grouped", "grouped gated"};
        for (size_t i = 0; i < outs[0].size(); ++i) EXPECT_EQ(outs[0][i], outs[1][i]) << what[i];
      }
    }
  }
  // Malformed hints: one error naming the field, nothing launched.
  DevBuf<uint16_t> dx(size_t(64)), dw(size_t(64) * 64), out(size_t(64));
  DevBuf<int32_t> doff(std::vector<int32_t>{0, 1});
  DevBuf<const uint16_t*> dwptr(std::vector<const uint16_t*>{dw.get()});
  const auto dense = [&](L2NextWeights n) {
    gemm({.x = dx.get(), .w = dw.get(), .out = out.get(), .M = 1, .N = 64, .K = 64, .next = n});
  };
  const auto grouped = [&](L2NextWeights n) {
    grouped_gemm({.x = dx.get(), .w = dwptr.get(), .offsets = doff.get(), .out = out.get(), .groups = 1,
                  .max_rows = 1, .N = 64, .K = 64, .next = n});
  };
  expect_error([&] { dense({.w = dw.get(), .bytes = 100}); }, "gemm: next.bytes");
  expect_error([&] { dense({.w = dw.get(), .bytes = 0}); }, "gemm: next.bytes");
  expect_error([&] { dense({.w = dw.get(), .bytes = 128, .at = 5}); }, "gemm: next.at");
  expect_error([&] { dense({.w_groups = dwptr.get(), .bytes = 128}); }, "gemm: next: a dense");
  expect_error([&] { grouped({.w = dw.get(), .bytes = 128}); }, "grouped_gemm: next: a grouped");
  expect_error([&] { grouped({.w_groups = dwptr.get(), .bytes = 64}); }, "grouped_gemm: next.bytes");
}

TEST_F(GroupedGemm, GatedEqualsTheGemmThenSiluGateInEveryConfig) {
  std::mt19937 rng(test_seed());
  SCOPED_TRACE(::testing::Message() << "seed " << test_seed());
  // Empty groups, a group of 1, a group over two 192-row tiles, gathered rows.
  const std::vector<int> counts = {0, 5, 1, 0, 400, 13};
  const int G = int(counts.size()), I = 72, N = 2 * I, K = 264, x_count = 300;
  const std::vector<int32_t> offsets = group_offsets(counts);
  const int rows = offsets.back();
  const auto x = random_bf16(size_t(x_count) * K, rng);
  const std::vector<int32_t> x_rows = random_rows(rows, x_count, rng);
  std::vector<std::vector<uint16_t>> w;
  for (int g = 0; g < G; ++g) w.push_back(random_bf16(size_t(N) * K, rng, 0.1f));
  const SpacedWeights sw(w, size_t(N) * K);
  const std::vector<const uint16_t*>& wptr = sw.ptrs;
  DevBuf<uint16_t> dx(x), scratch(size_t(rows) * N);
  DevBuf<int32_t> doff(offsets), drows(x_rows);
  DevBuf<const uint16_t*> dwptr(wptr);
  for (int c = -1; c < gemm_config_count(); ++c) {
    ForceConfig force(c);
    SCOPED_TRACE(::testing::Message() << "config " << (c < 0 ? "auto" : gemm_config_name(c)));
    const GroupedGemmArgs base{.x = dx.get(), .x_rows = drows.get(), .w = dwptr.get(), .offsets = doff.get(),
                               .groups = G, .max_rows = rows, .N = N, .K = K, .x_rows_limit = x_count,
                               .w_base = wptr[0], .w_group_stride = sw.stride};
    DevBuf<uint16_t> dgu(size_t(rows) * N), dact(size_t(rows) * I);
    GroupedGemmArgs plain = base;
    plain.out = dgu.get();
    grouped_gemm(plain);
    synchronize();
    const auto want = silu_of(dgu.download(), rows, I);
    GroupedGemmArgs gated = base;
    gated.out = dact.get();
    gated.gated = I;
    gated.gated_scratch = scratch.get();
    grouped_gemm(gated);
    check_device_errors();
    ASSERT_EQ(dact.download(), want);
  }
}

TEST_F(GroupedGemm, BadOffsetsRaiseTheDeviceError) {
  std::mt19937 rng(test_seed());
  const int N = 32, K = 64, max_rows = 8;
  auto x = random_bf16(size_t(max_rows) * K, rng), w = random_bf16(size_t(N) * K, rng);
  DevBuf<uint16_t> dx(x), dw(w);
  DevBuf<const uint16_t*> dwptr(std::vector<const uint16_t*>(3, dw.get()));
  const std::vector<std::vector<int32_t>> bad = {{0, 5, 3, 8}, {0, 5, 6, 9}, {1, 5, 6, 8}, {0, -2, 4, 4}};
  for (const auto& off : bad) {
    SCOPED_TRACE(::testing::Message() << "offsets " << off[0] << "," << off[1] << "," << off[2] << "," << off[3]);
    DevBuf<int32_t> doff(off);
    DevBuf<uint16_t> dout(size_t(max_rows) * N);
    grouped_gemm({.x = dx.get(), .w = dwptr.get(), .offsets = doff.get(), .out = dout.get(), .groups = 3,
                  .max_rows = max_rows, .N = N, .K = K});
    try {
      check_device_errors();
      FAIL() << "no device error";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("grouped_gemm: offsets"), std::string::npos) << e.what();
    }
    for (uint16_t v : dout.download()) ASSERT_EQ(v, 0xffff) << "output written despite bad offsets";
    EXPECT_NO_THROW(check_device_errors());
  }
}

TEST_F(GroupedGemm, GatherRowOutOfRangeRaisesTheDeviceError) {
  std::mt19937 rng(test_seed());
  const int N = 32, K = 64, x_count = 5;
  auto x = random_bf16(size_t(x_count) * K, rng), w = random_bf16(size_t(N) * K, rng);
  DevBuf<uint16_t> dx(x), dw(w);
  DevBuf<const uint16_t*> dwptr(std::vector<const uint16_t*>(1, dw.get()));
  DevBuf<int32_t> doff(std::vector<int32_t>{0, 3});
  for (int32_t bad_row : {x_count, -1}) {
    DevBuf<int32_t> drows(std::vector<int32_t>{0, bad_row, 2});
    DevBuf<uint16_t> dout(size_t(3) * N);
    grouped_gemm({.x = dx.get(), .x_rows = drows.get(), .w = dwptr.get(), .offsets = doff.get(), .out = dout.get(),
                  .groups = 1, .max_rows = 3, .N = N, .K = K, .x_rows_limit = x_count});
    try {
      check_device_errors();
      FAIL() << "no device error for x_rows entry " << bad_row;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("grouped_gemm: x_rows"), std::string::npos) << e.what();
    }
  }
}

// The TMA kernel reads group g's weight at w_base + g * w_group_stride: where the w array says
// otherwise it raises the device error naming w instead of multiplying by another matrix. On a
// Hopper GPU with this sm_90a build the TMA kernel must be available (a silent fallback would
// keep every bit test green and lose the speed); the error proves the TMA kernel ran, since the
// cp.async kernels never read w_base.
TEST_F(GroupedGemm, TmaKernelRunsAndChecksWBaseAgainstW) {
  int dev = 0, major = 0;
  ASSERT_EQ(cudaGetDevice(&dev), cudaSuccess);
  ASSERT_EQ(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev), cudaSuccess);
  if (major < 9) GTEST_SKIP() << "compute capability " << major << ".x: no TMA kernel";
  const char* env = std::getenv("ATLAS_GEMM_TMA");
  if (env && std::string(env) == "0") GTEST_SKIP() << "ATLAS_GEMM_TMA=0";
  ASSERT_TRUE(gemm_tma_available()) << "a 9.x GPU and this sm_90a build should run the TMA kernel";
  const int tma = config_named("tma192x128x64/5");
  ASSERT_GE(tma, 0);
  std::mt19937 rng(test_seed());
  const int N = 128, K = 256, rows = 200;
  const std::vector<std::vector<uint16_t>> w = {random_bf16(size_t(N) * K, rng), random_bf16(size_t(N) * K, rng)};
  const SpacedWeights sw(w, size_t(N) * K);
  DevBuf<uint16_t> dx(random_bf16(size_t(rows) * K, rng)), dout(size_t(rows) * N);
  DevBuf<int32_t> doff(std::vector<int32_t>{0, 100, rows});
  ForceConfig force(tma);
  for (int64_t shift : {int64_t(0), int64_t(8)}) {
    SCOPED_TRACE(::testing::Message() << "group 1 at w_base + stride + " << shift);
    DevBuf<const uint16_t*> dwptr(std::vector<const uint16_t*>{sw.ptrs[0], sw.ptrs[1] + shift});
    grouped_gemm({.x = dx.get(), .w = dwptr.get(), .offsets = doff.get(), .out = dout.get(), .groups = 2,
                  .max_rows = rows, .N = N, .K = K, .x_rows_limit = rows, .w_base = sw.ptrs[0],
                  .w_group_stride = sw.stride});
    if (shift == 0) {
      EXPECT_NO_THROW(check_device_errors());
      continue;
    }
    try {
      check_device_errors();
      FAIL() << "no device error";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("grouped_gemm: w"), std::string::npos) << e.what();
    }
  }
}

// Caps the persistent TMA kernel's grid for the scope (gemm_set_tma_blocks).
struct TmaBlocks {
  explicit TmaBlocks(int n) { gemm_set_tma_blocks(n); }
  ~TmaBlocks() { gemm_set_tma_blocks(0); }
};

// The persistent TMA kernel walks many tiles per block (here: grids capped at 1, 2 and 5 blocks,
// and the default), carrying its ring slots and barrier phases from tile to tile: dense, a
// strided batch whose entries have fewer tiles than there are blocks, the fused gate|up, and a
// grouped call with gather and empty groups all give the bits of the cp.async kernel of the
// same tile (wg192x128x64/4), which has no such state.
TEST_F(Gemm, PersistentTmaKernelGivesTheBitsOfOneBlockPerTile) {
  int dev = 0, major = 0;
  ASSERT_EQ(cudaGetDevice(&dev), cudaSuccess);
  ASSERT_EQ(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev), cudaSuccess);
  if (major < 9) GTEST_SKIP() << "compute capability " << major << ".x: no TMA kernel";
  if (!gemm_tma_available()) GTEST_SKIP() << "no TMA kernel here (ATLAS_GEMM_TMA=0?)";
  const int tma = config_named("tma192x128x64/5"), wg = config_named("wg192x128x64/4");
  ASSERT_GE(tma, 0);
  ASSERT_GE(wg, 0);
  std::mt19937 rng(test_seed());
  SCOPED_TRACE(::testing::Message() << "seed " << test_seed());
  // Runs `call` into a fresh buffer of `elems` under config c and grid cap `blocks`.
  auto outputs = [&](int c, int blocks, size_t elems, const std::function<void(uint16_t*)>& call) {
    ForceConfig force(c);
    TmaBlocks cap(blocks);
    DevBuf<uint16_t> out(elems);
    call(out.get());
    check_device_errors();
    return out.download();
  };
  auto same_everywhere = [&](const std::string& what, size_t elems, const std::function<void(uint16_t*)>& call) {
    SCOPED_TRACE(what);
    const auto want = outputs(wg, 0, elems, call);
    for (int blocks : {1, 2, 5, 0}) {
      const auto got = outputs(tma, blocks, elems, call);
      ASSERT_TRUE(std::equal(want.begin(), want.end(), got.begin())) << "grid capped at " << blocks;
    }
  };

  // Dense: 4 x 3 tiles, K of 3 slices with a short last step.
  const int M = 700, N = 300, K = 600;
  DevBuf<uint16_t> dx(random_bf16(size_t(M) * K, rng)), dw(random_bf16(size_t(N) * K, rng, 0.05f));
  same_everywhere("dense", size_t(M) * N, [&](uint16_t* out) {
    gemm({.x = dx.get(), .w = dw.get(), .out = out, .M = M, .N = N, .K = K});
  });
  // Strided batch of 7 entries of 2 tiles each (tiles of one block cross entries).
  const int BM = 150, BN = 200, BK = 256, H = 7;
  DevBuf<uint16_t> bx(random_bf16(size_t(BM) * H * BK, rng)), bw(random_bf16(size_t(H) * BN * BK, rng, 0.05f));
  same_everywhere("strided batch", size_t(BM) * H * BN, [&](uint16_t* out) {
    gemm({.x = bx.get(), .w = bw.get(), .out = out, .M = BM, .N = BN, .K = BK, .x_stride = H * BK,
          .out_stride = H * BN, .batch = H, .x_batch_stride = BK, .w_batch_stride = int64_t(BN) * BK,
          .out_batch_stride = BN});
  });
  // Fused gate|up: I = 200 (N = 400, 4 column tiles).
  const int I = 200;
  DevBuf<uint16_t> gw(random_bf16(size_t(2 * I) * K, rng, 0.05f)), scratch(size_t(M) * 2 * I);
  same_everywhere("gated", size_t(M) * I, [&](uint16_t* out) {
    gemm({.x = dx.get(), .w = gw.get(), .out = out, .M = M, .N = 2 * I, .K = K, .gated = I,
          .gated_scratch = scratch.get()});
  });
  // Grouped with gather: groups over one to three 192-row tiles, empty ones between.
  const std::vector<int> counts = {250, 0, 401, 7, 0, 30, 192};
  const int G = int(counts.size()), GN = 136, GK = 520, x_count = 300;
  const std::vector<int32_t> offsets = group_offsets(counts);
  const int rows = offsets.back();
  const std::vector<int32_t> x_rows = random_rows(rows, x_count, rng);
  std::vector<std::vector<uint16_t>> w(static_cast<size_t>(G));
  for (auto& wg_g : w) wg_g = random_bf16(size_t(GN) * GK, rng, 0.03f);
  const SpacedWeights sw(w, size_t(GN) * GK);
  DevBuf<uint16_t> gx(random_bf16(size_t(x_count) * GK, rng));
  DevBuf<int32_t> doff(offsets), drows(x_rows);
  DevBuf<const uint16_t*> dwptr(sw.ptrs);
  same_everywhere("grouped", size_t(rows) * GN, [&](uint16_t* out) {
    grouped_gemm({.x = gx.get(), .x_rows = drows.get(), .w = dwptr.get(), .offsets = doff.get(), .out = out,
                  .groups = G, .max_rows = rows, .N = GN, .K = GK, .x_rows_limit = x_count, .w_base = sw.ptrs[0],
                  .w_group_stride = sw.stride});
  });
  EXPECT_THROW(gemm_set_tma_blocks(-1), Error);
}

// On a Hopper GPU the cluster configs run as clusters (a silent fallback would keep the tests
// green and lose the speed): the automatic choices for a batch-128 and a batch-1 decode
// projection are cluster configs, and
// a forced cluster config is reported as itself at K = 2048 (8 blocks per cluster), c128x64/8w
// also at K = 2816 (11 blocks: a non-portable cluster size), while K = 4360 (18 slices, more than
// a cluster holds) falls back.
TEST_F(Gemm, ClusterConfigsRunAsClustersOnHopper) {
  int dev = 0, major = 0;
  ASSERT_EQ(cudaGetDevice(&dev), cudaSuccess);
  ASSERT_EQ(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev), cudaSuccess);
  if (major < 9) GTEST_SKIP() << "compute capability " << major << ".x: no thread-block clusters";
  DevBuf<uint16_t> dx(size_t(128) * 4360), dw(size_t(2048) * 4360);
  const GemmArgs m128{.x = dx.get(), .w = dw.get(), .M = 128, .N = 2048, .K = 2048};
  // The automatic choices at M = 128: narrow N and the fused gate|up take a cluster config;
  // N >= 2048 otherwise the sliced wgmma launch (the build's sm_90a code runs on this 9.x GPU).
  GemmArgs narrow = m128;
  narrow.N = 576;
  EXPECT_EQ(gemm_config_name(gemm_chosen_config(narrow)), "c64x64/4w");
  GemmArgs gated = m128;
  gated.N = 2816;
  gated.gated = 1408;
  gated.gated_scratch = dw.get();
  EXPECT_EQ(gemm_config_name(gemm_chosen_config(gated)), "c64x64/4w");
  EXPECT_EQ(gemm_config_name(gemm_chosen_config(m128)), "wg128x128x64/4+slices");
  // Session 7: the shared experts at M = 128. Down (K = 2816: 11 slices, past a cluster) takes
  // the sliced wgmma launch; the wide fused gate|up the plain tiled kernel (it fuses the SiLU).
  GemmArgs shared_down = m128;
  shared_down.K = 2816;
  EXPECT_EQ(gemm_config_name(gemm_chosen_config(shared_down)), "wg128x128x64/4+slices");
  GemmArgs shared_gate_up = gated;
  shared_gate_up.N = 5632;
  shared_gate_up.gated = 2816;
  EXPECT_EQ(gemm_config_name(gemm_chosen_config(shared_gate_up)), "32x64x64/4");
  GemmArgs m1 = m128;
  m1.M = 1;
  m1.N = 3072;
  // (ATLAS_GEMM_CLUSTER_PUSH=1, session 36: the same problems on the push variant of the config)
  const char* push_env = std::getenv("ATLAS_GEMM_CLUSTER_PUSH");
  const std::string c16 = push_env != nullptr && std::string(push_env) == "1" ? "c16x64/4w+push" : "c16x64/4w";
  EXPECT_EQ(gemm_config_name(gemm_chosen_config(m1)), c16);
  // Session 13: one row and N >= 4096 streams the weights (kernels/gemm_stream.cuh), unless
  // ATLAS_GEMM_STREAM=0; since session 23 on the wgmma streaming config unless it names 3 or 6.
  const char* stream_env = std::getenv("ATLAS_GEMM_STREAM");
  const std::string stream = stream_env == nullptr ? "" : stream_env;
  const std::string wg = expected_wgstream_config();
  GemmArgs lm_head = m1;
  lm_head.N = 102400;
  EXPECT_EQ(gemm_config_name(gemm_chosen_config(lm_head)), stream == "0"   ? c16
                                                           : stream == "6" ? "stream8x8/6w"
                                                           : stream == "3" ? "stream8x8/3w"
                                                                           : wg);
  // Session 28: one-row problems of fewer 64-row tiles than SMs (the shared experts' gate|up: 88)
  // take ATLAS_GEMM_STREAM_FEW's config where it is set (A/B runs; name the staged split-K config,
  // the plain one's name runs the split-K default), else the LM head's.
  const char* few_env = std::getenv("ATLAS_GEMM_STREAM_FEW");
  GemmArgs shared_one = m1;
  shared_one.N = 5632;
  shared_one.gated = 2816;
  shared_one.gated_scratch = dw.get();
  int sms = 0;
  ASSERT_EQ(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev), cudaSuccess);
  if (stream != "0" && sms > 88 && few_env != nullptr && *few_env != '\0')
    EXPECT_EQ(gemm_config_name(gemm_chosen_config(shared_one)), few_env);
  else
    EXPECT_EQ(gemm_config_name(gemm_chosen_config(shared_one)), gemm_config_name(gemm_chosen_config(lm_head)));
  // Session 49: the dense MLP at one row (V2-Lite's layer 0: gate|up N = 21,888 gated, down
  // K = 10,944) takes ATLAS_GEMM_WIDE_GATED's / ATLAS_GEMM_LONG_K's config where set (A/B runs);
  // else its gate|up the LM head's stream config and its down the staged split-K.
  GemmArgs dense_gate_up = m1;
  dense_gate_up.N = 21888;
  dense_gate_up.gated = 10944;
  dense_gate_up.gated_scratch = dw.get();
  GemmArgs dense_down = m1;
  dense_down.N = 2048;
  dense_down.K = 10944;
  const auto env_of = [](const char* var) {
    const char* v = std::getenv(var);
    return std::string(v == nullptr ? "" : v);
  };
  const std::string wide_env = env_of("ATLAS_GEMM_WIDE_GATED"), long_env = env_of("ATLAS_GEMM_LONG_K");
  if (!wide_env.empty()) {
    EXPECT_EQ(gemm_config_name(gemm_chosen_config(dense_gate_up)), wide_env);
  } else if (stream != "0") {
    EXPECT_EQ(gemm_config_name(gemm_chosen_config(dense_gate_up)), gemm_config_name(gemm_chosen_config(lm_head)));
  }
  if (!long_env.empty() && long_env != "splitk16x8/8w") {
    EXPECT_EQ(gemm_config_name(gemm_chosen_config(dense_down)), long_env);
  } else if (env_of("ATLAS_GEMM_SPLITK").empty()) {
    EXPECT_EQ(gemm_config_name(gemm_chosen_config(dense_down)), "splitk16x8/8w+staged");
  }
  for (int c = 0; c < gemm_config_count(); ++c) {
    const std::string name = gemm_config_name(c);
    if (name[0] != 'c') continue;
    ForceConfig force(c);
    for (int K : {2048, 2816}) {
      if (K == 2816 && name != "c128x64/8w") continue;
      GemmArgs a = m128;
      a.K = K;
      EXPECT_EQ(gemm_config_name(gemm_chosen_config(a)), name) << "K=" << K;
    }
    GemmArgs big = m128;
    big.K = 4360;
    EXPECT_NE(gemm_config_name(gemm_chosen_config(big)), name) << "K=4360 cannot be one cluster";
  }
}

// Session 23: o_proj's launch with the add + norm in its last block (gemm_add_rmsnorm) gives the
// bits of gemm() followed by add_rmsnorm(): the GEMM's output, the updated residual row and the
// normed row, over repeated launches (the block counter is reset by each launch's last block),
// with launch overlap off and on. Where the staged split-K config would not run it launches
// nothing and says so (more rows, N != dim, the tails off).
TEST_F(Gemm, AddRmsNormTailGivesTheBitsOfGemmThenAddRmsNorm) {
  std::mt19937 rng(test_seed());
  SCOPED_TRACE(::testing::Message() << "seed " << test_seed());
  const LaunchOverlap was = launch_overlap_mode();
  for (const auto& [N, K] : {std::pair{2048, 2048}, std::pair{64, 2048}}) {
    SCOPED_TRACE(::testing::Message() << "N=" << N << " K=" << K);
    const auto x = random_bf16(size_t(K), rng), w = random_bf16(size_t(N) * K, rng, 0.02f);
    const auto resid = random_bf16(size_t(N), rng), norm_w = random_bf16(size_t(N), rng, 0.5f);
    DevBuf<uint16_t> dx(x), dw(w), dnorm(norm_w);
    // The two launches.
    DevBuf<uint16_t> y_ref(static_cast<size_t>(N)), x_ref(resid), h_ref(static_cast<size_t>(N));
    gemm({.x = dx.get(), .w = dw.get(), .out = y_ref.get(), .M = 1, .N = N, .K = K});
    add_rmsnorm({.x = x_ref.get(), .y = y_ref.get(), .weight = dnorm.get(), .out = h_ref.get(), .rows = 1, .dim = N,
                 .eps = 1e-6f});
    synchronize();
    const auto want_y = y_ref.download(), want_x = x_ref.download(), want_h = h_ref.download();
    gemm_set_tails(1);
    for (auto mode : {LaunchOverlap::off, LaunchOverlap::on}) {
      set_launch_overlap(mode);
      for (int rep = 0; rep < 3; ++rep) {
        SCOPED_TRACE(::testing::Message() << "overlap " << int(mode) << " launch " << rep);
        DevBuf<uint16_t> y(static_cast<size_t>(N)), xr(resid), h(static_cast<size_t>(N));
        const int64_t before = gemm_tailed_launches();
        ASSERT_TRUE(gemm_add_rmsnorm({.x = dx.get(), .w = dw.get(), .out = y.get(), .M = 1, .N = N, .K = K},
                                     {.x = xr.get(), .weight = dnorm.get(), .out = h.get(), .dim = N, .eps = 1e-6f}));
        synchronize();
        check_device_errors();
        EXPECT_EQ(gemm_tailed_launches(), before + 1);
        ASSERT_EQ(y.download(), want_y) << "the GEMM's output";
        ASSERT_EQ(xr.download(), want_x) << "the residual row";
        ASSERT_EQ(h.download(), want_h) << "the normed row";
      }
    }
    set_launch_overlap(was);
    // Where the tail does not apply nothing is launched (the outputs keep their poison).
    DevBuf<uint16_t> y(size_t(2) * N), xr(resid), h(static_cast<size_t>(N));
    DevBuf<uint16_t> dx2(random_bf16(size_t(2) * K, rng));
    EXPECT_FALSE(gemm_add_rmsnorm({.x = dx2.get(), .w = dw.get(), .out = y.get(), .M = 2, .N = N, .K = K},
                                  {.x = xr.get(), .weight = dnorm.get(), .out = h.get(), .dim = N}))
        << "two rows";
    EXPECT_FALSE(gemm_add_rmsnorm({.x = dx.get(), .w = dw.get(), .out = y.get(), .M = 1, .N = N, .K = K},
                                  {.x = xr.get(), .weight = dnorm.get(), .out = h.get(), .dim = N - 8}))
        << "dim != N";
    gemm_set_tails(0);
    EXPECT_FALSE(gemm_add_rmsnorm({.x = dx.get(), .w = dw.get(), .out = y.get(), .M = 1, .N = N, .K = K},
                                  {.x = xr.get(), .weight = dnorm.get(), .out = h.get(), .dim = N}))
        << "the tails off";
    gemm_set_tails(-1);
    synchronize();
    EXPECT_EQ(xr.download(), resid) << "a call that launched nothing changed the residual row";
  }
}

// Session 43: the router's launch with the post-attention add + norm inside
// (gemm_after_add_rmsnorm, every block adding and norming the row for itself) gives the bits of
// add_rmsnorm() followed by gemm(): the fp32 logits, the residual sum (in x_out; x untouched)
// and the normed row, over repeated launches, with launch overlap off and on: V2-Lite's router
// (64 experts over 2048) on the config gemm() picks, and a 512-wide row over 160 columns with
// the staged split-K config forced. Where it does not apply it launches nothing and says so;
// aliasing throws.
TEST_F(Gemm, RouterAfterAddRmsNormGivesTheBitsOfAddRmsNormThenGemm) {
  std::mt19937 rng(test_seed());
  SCOPED_TRACE(::testing::Message() << "seed " << test_seed());
  const LaunchOverlap was = launch_overlap_mode();
  const int staged = config_named("splitk16x8/8w+staged");
  ASSERT_GE(staged, 0);
  for (const auto& [N, K, forced] : {std::tuple{64, 2048, false}, std::tuple{160, 512, true}}) {
    SCOPED_TRACE(::testing::Message() << "N=" << N << " K=" << K);
    gemm_force_config(forced ? staged : -1);
    const auto resid = random_bf16(size_t(K), rng), attn = random_bf16(size_t(K), rng);
    const auto norm_w = random_bf16(size_t(K), rng, 0.5f), w = random_bf16(size_t(N) * K, rng, 0.02f);
    DevBuf<uint16_t> dy(attn), dnorm(norm_w), dw(w);
    // The two launches.
    DevBuf<uint16_t> x_ref(resid), h_ref(static_cast<size_t>(K));
    DevBuf<float> l_ref(static_cast<size_t>(N));
    add_rmsnorm({.x = x_ref.get(), .y = dy.get(), .weight = dnorm.get(), .out = h_ref.get(), .rows = 1, .dim = K,
                 .eps = 1e-6f});
    gemm({.x = h_ref.get(), .w = dw.get(), .out = l_ref.get(), .out_type = OutType::f32, .M = 1, .N = N, .K = K});
    synchronize();
    const auto want_x = x_ref.download(), want_h = h_ref.download();
    const auto want_l = l_ref.download();
    gemm_set_router_norm(1);
    for (auto mode : {LaunchOverlap::off, LaunchOverlap::on}) {
      set_launch_overlap(mode);
      for (int rep = 0; rep < 3; ++rep) {
        SCOPED_TRACE(::testing::Message() << "overlap " << int(mode) << " launch " << rep);
        DevBuf<uint16_t> x(resid), x_out(static_cast<size_t>(K)), h(static_cast<size_t>(K));
        DevBuf<float> l(static_cast<size_t>(N));
        const int64_t before = gemm_router_norm_launches();
        ASSERT_TRUE(gemm_after_add_rmsnorm(
            {.x = h.get(), .w = dw.get(), .out = l.get(), .out_type = OutType::f32, .M = 1, .N = N, .K = K},
            {.x = x.get(), .y = dy.get(), .weight = dnorm.get(), .x_out = x_out.get(), .h_out = h.get(), .dim = K,
             .eps = 1e-6f}));
        synchronize();
        check_device_errors();
        EXPECT_EQ(gemm_router_norm_launches(), before + 1);
        ASSERT_EQ(l.download(), want_l) << "the logits";
        ASSERT_EQ(x_out.download(), want_x) << "the residual sum";
        ASSERT_EQ(h.download(), want_h) << "the normed row";
        ASSERT_EQ(x.download(), resid) << "x itself is only read";
      }
    }
    set_launch_overlap(was);
    // Where it does not apply nothing is launched; aliasing throws.
    DevBuf<uint16_t> x(resid), x_out(static_cast<size_t>(K)), h(size_t(2) * K);
    DevBuf<float> l(size_t(2) * N);
    const GemmArgs one{.x = h.get(), .w = dw.get(), .out = l.get(), .out_type = OutType::f32, .M = 1, .N = N, .K = K};
    const GemmAfterAddRmsNormArgs norm{.x = x.get(), .y = dy.get(), .weight = dnorm.get(), .x_out = x_out.get(),
                                       .h_out = h.get(), .dim = K, .eps = 1e-6f};
    GemmArgs two = one;
    two.M = 2;
    EXPECT_FALSE(gemm_after_add_rmsnorm(two, norm)) << "two rows";
    GemmArgs bf16_out = one;
    bf16_out.out_type = OutType::bf16;
    EXPECT_FALSE(gemm_after_add_rmsnorm(bf16_out, norm)) << "bf16 out";
    GemmAfterAddRmsNormArgs narrow = norm;
    narrow.dim = K - 8;
    EXPECT_FALSE(gemm_after_add_rmsnorm(one, narrow)) << "dim != K";
    GemmAfterAddRmsNormArgs aliased = norm;
    aliased.x_out = x.get();
    EXPECT_THROW(gemm_after_add_rmsnorm(one, aliased), Error) << "x_out aliasing x";
    gemm_set_router_norm(0);
    EXPECT_FALSE(gemm_after_add_rmsnorm(one, norm)) << "the switch off";
    gemm_set_router_norm(-1);
    gemm_force_config(-1);
    synchronize();
    EXPECT_EQ(x.download(), resid) << "a call that launched nothing changed the residual row";
  }
}

// Session 23: one token's routed experts (6 rows over 64 groups) take the wgmma streaming
// config for the fused gate|up, the tiled one for the down (ATLAS_GEMM_STREAM_GROUPED=wg-gate,
// the default; "wg" puts the down there too, "wg-split" its K-split variant there, "0" neither);
// the down's tiled config is "16x32x128/4u" since session 34 (ATLAS_GEMM_GROUPED_FEW_DOWN names
// another). The bits are the same either way
// (EveryConfig*, StreamConfigsGiveTheContractBits); this guards the speed.
TEST_F(Gemm, OneTokenExpertGemmsTakeTheWgmmaStreamForTheGateUp) {
  DevBuf<uint16_t> dx(size_t(8) * 2048);
  const char* env = std::getenv("ATLAS_GEMM_STREAM_GROUPED");
  const std::string grouped = env == nullptr ? "" : env;
  const char* down_env = std::getenv("ATLAS_GEMM_GROUPED_FEW_DOWN");
  const std::string down_name = down_env != nullptr && *down_env != '\0' ? down_env : "16x32x128/4u";
  const GroupedGemmArgs gate_up{.x = dx.get(), .groups = 64, .max_rows = 6, .N = 2816, .K = 2048, .gated = 1408};
  const GroupedGemmArgs down{.x = dx.get(), .groups = 64, .max_rows = 6, .N = 2048, .K = 1408};
  const char* stream_env = std::getenv("ATLAS_GEMM_STREAM");  // "1": the dense problems' stream config
  const std::string stream = stream_env == nullptr ? "" : stream_env;
  const std::string wg = expected_wgstream_config();
  const std::string dense_stream = stream == "0"   ? "16x32x128/4"
                                   : stream == "3" ? "stream8x8/3w"
                                   : stream == "6" ? "stream8x8/6w"
                                                   : wg;
  EXPECT_EQ(gemm_config_name(grouped_gemm_chosen_config(gate_up)),
            grouped == "0" ? "16x32x128/4" : grouped == "1" ? dense_stream : wg);
  EXPECT_EQ(gemm_config_name(grouped_gemm_chosen_config(down)),
            grouped == "wg"         ? wg
            : grouped == "wg-split" ? "streamwg64x8/4l2"
            : grouped == "1" && stream != "0" ? dense_stream
                                              : down_name);
  // Many tokens (a batch-128 step: 768 rows) keep the tiled configs.
  GroupedGemmArgs many = gate_up;
  many.max_rows = 768;
  EXPECT_EQ(gemm_config_name(grouped_gemm_chosen_config(many)).rfind("stream", 0), std::string::npos);
}

// Block stamps (session 38, ATLAS_BLOCK_STAMPS): on the MoE phase's three default configs (the
// lean stream loop on one dense row, 16x32x128/4u on one token's grouped rows, the staged split-K
// on one dense row) the stamped instantiation gives the unstamped bits, and records every block of
// the launch exactly once: its SM, times in order, the launch's weight as its site, the shape, the
// kind, and (lean, tiled) the weight bytes the launch's tiles span. Off, nothing is recorded; a
// capacity that is not a power of two is one error naming it.
TEST_F(Gemm, BlockStampsRecordEveryBlockOnceAndKeepTheBits) {
  std::mt19937 rng(test_seed());
  SCOPED_TRACE(::testing::Message() << "seed " << test_seed());
  const int sms = device_info().sm_count;
  struct Case {
    const char* config;
    bool grouped;
    int N, K, kind;
  };
  for (const Case& c : {Case{"streamwg64x8/4l", false, 2816, 2048, 0}, Case{"16x32x128/4u", true, 2048, 1408, 1},
                        Case{"splitk16x8/8w+staged", false, 2048, 2816, 2}}) {
    SCOPED_TRACE(c.config);
    const int ci = config_named(c.config);
    ASSERT_GE(ci, 0);
    ForceConfig force(ci);
    const int G = 8;
    const std::vector<int32_t> offsets = group_offsets({1, 0, 1, 1, 0, 1, 1, 1});  // one token's six experts
    const int rows = c.grouped ? offsets.back() : 1;
    const auto x = random_bf16(size_t(rows) * c.K, rng);
    std::vector<std::vector<uint16_t>> gw;
    for (int g = 0; g < (c.grouped ? G : 1); ++g) gw.push_back(random_bf16(size_t(c.N) * c.K, rng, 0.1f));
    const SpacedWeights sw(gw, size_t(c.N) * c.K);
    DevBuf<uint16_t> dx(x);
    DevBuf<int32_t> doff(offsets);
    DevBuf<const uint16_t*> dwptr(sw.ptrs);
    const auto launch = [&](uint16_t* out) {
      if (c.grouped)
        grouped_gemm({.x = dx.get(), .w = dwptr.get(), .offsets = doff.get(), .out = out, .groups = G, .max_rows = rows,
                      .N = c.N, .K = c.K});
      else
        gemm({.x = dx.get(), .w = sw.ptrs[0], .out = out, .M = 1, .N = c.N, .K = c.K});
    };
    DevBuf<uint16_t> plain(size_t(rows) * c.N), stamped(size_t(rows) * c.N);
    launch(plain.get());
    gemm_block_stamps_start(size_t(1) << 12);
    launch(stamped.get());
    const std::vector<BlockStampRecord> recs = gemm_block_stamps_take();
    gemm_block_stamps_stop();
    EXPECT_EQ(plain.download(), stamped.download()) << "the stamped kernel's bits";
    ASSERT_FALSE(recs.empty()) << "no block stamped";
    const int grid = recs[0].grid;
    std::vector<int> seen(size_t(std::max(grid, 1)), 0);
    int64_t bytes = 0;
    for (const BlockStampRecord& r : recs) {
      EXPECT_EQ(r.grid, grid);
      ASSERT_TRUE(r.block >= 0 && r.block < grid) << r.block;
      ++seen[size_t(r.block)];
      EXPECT_EQ(r.site, reinterpret_cast<uint64_t>(c.grouped ? static_cast<const void*>(dwptr.get())
                                                              : static_cast<const void*>(sw.ptrs[0])));
      EXPECT_EQ(r.n, c.N);
      EXPECT_EQ(r.k, c.K);
      EXPECT_EQ(r.kind, c.kind + (c.grouped ? 16 : 0));
      EXPECT_TRUE(r.smid >= 0 && r.smid < sms) << r.smid;
      EXPECT_LE(r.t0, r.t1);
      if (r.go != 0) {
        EXPECT_TRUE(r.t0 <= r.go && r.go <= r.t1) << r.t0 << " " << r.go << " " << r.t1;
      }
      if (c.kind != 1) {  // (the tiled kernel's blocks without a tile return before marking it)
        EXPECT_NE(r.go, 0u) << "the lean and split-K kernels mark their wait's end in every block";
      }
      bytes += r.bytes;
    }
    EXPECT_EQ(seen, std::vector<int>(size_t(grid), 1)) << "each block exactly once";
    // The tiles' weight rows: lean 64-row tiles of the one problem; tiled, each group with rows
    // spans its N x K once (one 16-row tile of rows per group); split-K counts none.
    const int64_t want = c.kind == 2 ? 0 : int64_t(c.grouped ? 6 : 1) * c.N * c.K * 2;
    EXPECT_EQ(bytes, want);
    // Off: nothing recorded.
    launch(stamped.get());
    EXPECT_TRUE(gemm_block_stamps_take().empty());
  }
  expect_error([] { gemm_block_stamps_start(3); }, "gemm_block_stamps_start: capacity");
}

// One token's routed gate|up routing the token itself (GroupedSelfRoute, session 39,
// ATLAS_MOE_SELF_ROUTE): right after moe_route() of the same logits, grouped_gemm with the route
// gives the bits of the plain call (which reads the routing kernel's table), launch overlap off
// and on (on, the routing instantiation never waits at its start), over 6 to 64 experts, k from
// 1 to 6, the weights normalised or scaled, random and tied scores, and scores the routing
// kernel's fallback handles (a NaN: no row placed, a device error raised: the same outputs and
// the same error either way). The routing instantiation ran for each call that asked (the lean
// stream loop: K a multiple of 128); a problem of other rows than k ignores the route.
TEST_F(Gemm, SelfRoutedGateUpGivesTheRoutingKernelsBits) {
  std::mt19937 rng(test_seed());
  SCOPED_TRACE(::testing::Message() << "seed " << test_seed());
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  const int I = 200, N = 2 * I, K = 512;
  const LaunchOverlap was = launch_overlap_mode();
  const auto x = random_bf16(size_t(K), rng);
  std::vector<std::vector<uint16_t>> gw;
  for (int g = 0; g < 64; ++g) gw.push_back(random_bf16(size_t(N) * K, rng, 0.1f));
  const SpacedWeights sw(gw, size_t(N) * K);
  DevBuf<uint16_t> dx(x);
  DevBuf<const uint16_t*> dwptr(sw.ptrs);
  struct Case {
    int E, k, kind;  // kind: 0 random, 1 ties, 2 one +inf, 3 one NaN
  };
  std::vector<Case> cases;
  for (int E : {6, 33, 64})
    for (int k : {1, 6})
      for (int kind = 0; kind < 4; ++kind) cases.push_back({E, k, kind});
  for (const Case& c : cases) {
    SCOPED_TRACE(::testing::Message() << "E=" << c.E << " k=" << c.k << " kind=" << c.kind);
    auto logits = random_f32(size_t(c.E), rng, 2.0f);
    if (c.kind == 1)
      for (float& v : logits) v = std::floor(v);
    if (c.kind == 2) logits[size_t(c.E / 2)] = inf;
    if (c.kind == 3) logits[size_t(c.E - 1)] = nan;
    DevBuf<float> dl(logits);
    const bool norm = c.kind % 2 == 0;
    std::vector<std::vector<uint16_t>> outs;
    std::vector<bool> errors;
    for (bool overlap : {false, true})
      for (bool self : {false, true}) {
        set_launch_overlap(overlap);
        DevBuf<int32_t> ids{size_t(c.k)}, counts{size_t(c.E)}, offsets{size_t(c.E + 1)}, sorted{size_t(c.k)},
            slot{size_t(c.k)}, ws{moe_permute_workspace_ints(1, c.E)};
        DevBuf<float> w{size_t(c.k)};
        DevBuf<uint16_t> act(size_t(c.k) * I), scratch(size_t(c.k) * N);
        const RouterArgs r{.logits = dl.get(), .topk_ids = ids.get(), .topk_weights = w.get(), .tokens = 1,
                           .experts = c.E, .k = c.k, .method = TopkMethod::greedy, .n_group = 1, .topk_group = 1,
                           .norm_topk_prob = norm, .routed_scaling_factor = 1.5f};
        const MoePermuteArgs p{.topk_ids = ids.get(), .tokens = 1, .k = c.k, .experts = c.E, .counts = counts.get(),
                               .offsets = offsets.get(), .sorted_token = sorted.get(), .pair_slot = slot.get(),
                               .workspace = ws.get()};
        const int64_t before = grouped_self_routed_launches();
        moe_route(r, p);
        grouped_gemm({.x = dx.get(), .x_rows = sorted.get(), .w = dwptr.get(), .offsets = offsets.get(),
                      .out = act.get(), .groups = c.E, .max_rows = c.k, .N = N, .K = K, .x_rows_limit = 1,
                      .gated = I, .gated_scratch = scratch.get(),
                      .self_route = self ? GroupedSelfRoute{.logits = dl.get(), .k = c.k, .norm_topk_prob = norm,
                                                            .scaling = 1.5f}
                                         : GroupedSelfRoute{}});
        synchronize();
        EXPECT_EQ(grouped_self_routed_launches(), before + (self ? 1 : 0)) << "overlap " << overlap;
        errors.push_back(device_error_raised());
        outs.push_back(act.download());
      }
    set_launch_overlap(was);
    for (size_t i = 1; i < outs.size(); ++i) {
      EXPECT_EQ(outs[i], outs[0]) << "run " << i;
      EXPECT_EQ(errors[i], errors[0]) << "run " << i;
    }
    EXPECT_EQ(errors[0], c.kind >= 2);
  }
  // Rows other than the route's k (two tokens' worth): the route ignored, the plain launch.
  DevBuf<float> dl(random_f32(8, rng));
  DevBuf<int32_t> offsets(group_offsets({2, 0, 1, 1, 0, 1, 0, 1})), rows(std::vector<int32_t>(6, 0));
  DevBuf<uint16_t> act(size_t(6) * I), scratch(size_t(6) * N);
  const int64_t before = grouped_self_routed_launches();
  grouped_gemm({.x = dx.get(), .x_rows = rows.get(), .w = dwptr.get(), .offsets = offsets.get(), .out = act.get(),
                .groups = 8, .max_rows = 6, .N = N, .K = K, .x_rows_limit = 1, .gated = I,
                .gated_scratch = scratch.get(), .self_route = {.logits = dl.get(), .k = 3}});
  synchronize();
  EXPECT_EQ(grouped_self_routed_launches(), before);
  set_launch_overlap(was);
}

// The routed experts' gate|up waiting first and their down staging its first weight steps before
// its launch-overlap wait (GroupedOrder, session 44, the model's ATLAS_MOE_DOWN_EARLY): right
// after moe_route(), the pair of grouped launches gives the bits of the plain pair, launch
// overlap off and on, for one and two tokens (k = 6: 6 and 12 rows, the few-row down config),
// the gate|up alone waiting first too. Shapes: V2-Lite's expert (H 2048, I 1408: the gate|up on
// the lean stream loop's wait-first instance, every down tile whole 128-wide steps), one whose
// down K is two steps (fewer than the ring's three prologue steps) and whose last down column
// tile is partial (H 200: that tile takes the plain loop after the wait) while the gate|up's K
// is not whole steps (its launch then goes without launch overlap), and one over 64 experts
// with three down steps. The order's instances ran where they apply (counted), and a corrupt
// offsets table is flagged with the order as without it.
TEST_F(Gemm, EarlyDownWeightsGiveTheSameBits) {
  std::mt19937 rng(test_seed());
  SCOPED_TRACE(::testing::Message() << "seed " << test_seed());
  const LaunchOverlap was = launch_overlap_mode();
  struct Shape {
    int E, H, I;
    bool lean_gate, whole_down;  // the gate|up on the lean loop (one token); every down tile whole
  };
  for (const Shape& sh : {Shape{8, 2048, 1408, true, true}, Shape{12, 200, 256, false, false},
                          Shape{64, 256, 384, true, true}}) {
    SCOPED_TRACE(::testing::Message() << "E=" << sh.E << " H=" << sh.H << " I=" << sh.I);
    const int E = sh.E, H = sh.H, I = sh.I, k = 6;
    std::vector<std::vector<uint16_t>> gu_w, dn_w;
    for (int g = 0; g < E; ++g) {
      gu_w.push_back(random_bf16(size_t(2 * I) * H, rng, 0.05f));
      dn_w.push_back(random_bf16(size_t(H) * I, rng, 0.05f));
    }
    const SpacedWeights gu(gu_w, size_t(2 * I) * H), dn(dn_w, size_t(H) * I);
    DevBuf<const uint16_t*> gu_ptr(gu.ptrs), dn_ptr(dn.ptrs);
    for (int tokens : {1, 2}) {
      SCOPED_TRACE(::testing::Message() << "tokens=" << tokens);
      const int rows = tokens * k;
      DevBuf<uint16_t> x(random_bf16(size_t(tokens) * H, rng));
      DevBuf<float> logits(random_f32(size_t(tokens) * E, rng, 2.0f));
      DevBuf<int32_t> ids{size_t(rows)}, counts{size_t(E)}, offsets{size_t(E + 1)}, sorted{size_t(rows)},
          slot{size_t(rows)}, ws{moe_permute_workspace_ints(tokens, E)};
      DevBuf<float> w{size_t(rows)};
      const RouterArgs r{.logits = logits.get(), .topk_ids = ids.get(), .topk_weights = w.get(), .tokens = tokens,
                         .experts = E, .k = k, .method = TopkMethod::greedy, .n_group = 1, .topk_group = 1,
                         .norm_topk_prob = true, .routed_scaling_factor = 1.0f};
      const MoePermuteArgs perm{.topk_ids = ids.get(), .tokens = tokens, .k = k, .experts = E,
                                .counts = counts.get(), .offsets = offsets.get(), .sorted_token = sorted.get(),
                                .pair_slot = slot.get(), .workspace = ws.get()};
      std::vector<std::vector<uint16_t>> acts, ys;
      // order 0: plain; 1: the gate|up waiting first alone; 2: both promises.
      for (bool overlap : {false, true})
        for (int order = 0; order < 3; ++order) {
          SCOPED_TRACE(::testing::Message() << "overlap " << overlap << " order " << order);
          set_launch_overlap(overlap);
          DevBuf<uint16_t> act(size_t(rows) * I), scratch(size_t(rows) * 2 * I), y(size_t(rows) * H);
          const int64_t wf = grouped_wait_first_launches(), ew = grouped_early_weight_launches();
          moe_route(r, perm);
          grouped_gemm({.x = x.get(), .x_rows = sorted.get(), .w = gu_ptr.get(), .offsets = offsets.get(),
                        .out = act.get(), .groups = E, .max_rows = rows, .N = 2 * I, .K = H, .x_rows_limit = tokens,
                        .gated = I, .gated_scratch = scratch.get(), .order = {.wait_first = order >= 1}});
          grouped_gemm({.x = act.get(), .w = dn_ptr.get(), .offsets = offsets.get(), .out = y.get(), .groups = E,
                        .max_rows = rows, .N = H, .K = I, .order = {.tables_before_wait = order == 2}});
          synchronize();
          EXPECT_FALSE(device_error_raised());
          EXPECT_EQ(grouped_wait_first_launches() - wf, order >= 1 && sh.lean_gate && tokens == 1 ? 1 : 0);
          EXPECT_EQ(grouped_early_weight_launches() - ew, order == 2 ? 1 : 0);
          acts.push_back(act.download());
          ys.push_back(y.download());
        }
      for (size_t i = 1; i < ys.size(); ++i) {
        EXPECT_EQ(acts[i], acts[0]) << "run " << i;
        EXPECT_EQ(ys[i], ys[0]) << "run " << i;
      }
    }
  }
  // A corrupt table (offsets[0] != 0): flagged by the early steps as by the plain down.
  {
    const int E = 8, H = 256, I = 256, rows = 6;
    std::vector<std::vector<uint16_t>> dn_w;
    for (int g = 0; g < E; ++g) dn_w.push_back(random_bf16(size_t(H) * I, rng, 0.05f));
    const SpacedWeights dn(dn_w, size_t(H) * I);
    DevBuf<const uint16_t*> dn_ptr(dn.ptrs);
    std::vector<int32_t> bad = group_offsets({1, 0, 1, 1, 0, 1, 1, 1});
    bad[0] = 1;
    DevBuf<int32_t> offsets(bad);
    DevBuf<uint16_t> act(random_bf16(size_t(rows) * I, rng)), y(size_t(rows) * H);
    for (bool early : {false, true}) {
      set_launch_overlap(true);
      grouped_gemm({.x = act.get(), .w = dn_ptr.get(), .offsets = offsets.get(), .out = y.get(), .groups = E,
                    .max_rows = rows, .N = H, .K = I, .order = {.tables_before_wait = early}});
      synchronize();
      EXPECT_TRUE(device_error_raised()) << "early " << early;
    }
  }
  set_launch_overlap(was);
}

// Session 35: the 8-row-slot config ("16x32x128/5h", whose only loop is the whole-steps one and
// whose slots hold x rows 0-7) runs only where every tile has at most 8 rows, K is whole 128-wide
// steps and N whole 32-column tiles; elsewhere, forced or named, the chooser gives its 16-row
// twin "16x32x128/4u" (the same bits: EveryConfig*, RowsEqualTheDenseGemmOfTheirGroup).
TEST_F(Gemm, HalfSlotConfigRunsOnlyWhereItsLoopApplies) {
  const int half = config_named("16x32x128/5h");
  ASSERT_GE(half, 0);
  ForceConfig force(half);
  DevBuf<uint16_t> dx(size_t(16) * 2048), dw(size_t(2048) * 2048);
  const auto grouped = [&](int rows, int N, int K) {
    return gemm_config_name(grouped_gemm_chosen_config({.x = dx.get(), .groups = 64, .max_rows = rows, .N = N, .K = K}));
  };
  const auto dense = [&](int M, int N, int K) {
    return gemm_config_name(gemm_chosen_config({.x = dx.get(), .w = dw.get(), .M = M, .N = N, .K = K}));
  };
  EXPECT_EQ(grouped(6, 2048, 1408), "16x32x128/5h");
  EXPECT_EQ(grouped(8, 96, 256), "16x32x128/5h");
  EXPECT_EQ(grouped(9, 2048, 1408), "16x32x128/4u");
  EXPECT_EQ(grouped(6, 2048, 1400), "16x32x128/4u");
  EXPECT_EQ(grouped(6, 2040, 1408), "16x32x128/4u");
  EXPECT_EQ(dense(1, 2048, 2048), "16x32x128/5h");
  EXPECT_EQ(dense(12, 2048, 2048), "16x32x128/4u");
}

// Session 21: the one-row dense GEMMs the chooser gives split-K (o_proj, the router, the shared
// down) run the staged split-K kernel, unless ATLAS_GEMM_SPLITK names another; operands without
// 16-byte alignment run the plain one (the staged kernel has no predicated path). The bits are
// the same either way (EveryConfig*); this guards the speed.
TEST_F(Gemm, OneRowSplitKProblemsRunTheStagedKernel) {
  DevBuf<uint16_t> dx(size_t(4) * 2816), dw(size_t(2048) * 2816);
  const char* env = std::getenv("ATLAS_GEMM_SPLITK");
  const std::string want = env != nullptr && *env != '\0' ? env : "splitk16x8/8w+staged";
  for (const auto& [N, K] : {std::pair{2048, 2048}, std::pair{64, 2048}, std::pair{2048, 2816}}) {
    const GemmArgs a{.x = dx.get(), .w = dw.get(), .M = 1, .N = N, .K = K};
    EXPECT_EQ(gemm_config_name(gemm_chosen_config(a)), want) << "N=" << N << " K=" << K;
    GemmArgs odd = a;
    odd.x_stride = K + 1;  // rows not 16-byte aligned: no 16-byte copies
    EXPECT_EQ(gemm_config_name(gemm_chosen_config(odd)), "splitk16x8/8w") << "N=" << N << " K=" << K;
  }
  // At most two K slices (the MLA value GEMM: K = 512, 16 heads): the two-warp staged config
  // unless ATLAS_GEMM_SPLITK names one.
  const GemmArgs value{.x = dx.get(), .w = dw.get(), .M = 1, .N = 128, .K = 512, .x_stride = 16 * 512,
                       .w_stride = 512, .out_stride = 16 * 128, .batch = 16, .x_batch_stride = 512,
                       .w_batch_stride = 256 * 512, .out_batch_stride = 128};
  EXPECT_EQ(gemm_config_name(gemm_chosen_config(value)),
            env != nullptr && *env != '\0' ? want : std::string("splitk16x8/2w+staged"));
}

// Launch overlap when the GEMM's x is the output of the kernel just before it (a model's chain:
// the final norm, then the LM head): a kernel may fetch weights before its predecessor is done,
// never x. Session 13's stream kernel first copied x rows with its first weight slices, before
// pdl_begin(); this chain (the first GEMM long enough to still run when the second starts) is
// what that race needs.
TEST_F(Gemm, LaunchOverlapNeverReadsTheInputBeforeItIsWritten) {
  std::mt19937 rng(test_seed());
  SCOPED_TRACE(::testing::Message() << "seed " << test_seed());
  const LaunchOverlap was = launch_overlap_mode();
  const int M = 1, K = 2048, N1 = 2048, N2 = 8192;  // N2 >= 4096: the automatic choice streams
  const auto x = random_bf16(size_t(M) * K, rng);
  const auto w1 = random_bf16(size_t(N1) * K, rng, 0.05f), w2 = random_bf16(size_t(N2) * N1, rng, 0.05f);
  DevBuf<uint16_t> dx(x), dw1(w1), dw2(w2);
  for (int c = -1; c < gemm_config_count(); ++c) {
    ForceConfig force(c);
    SCOPED_TRACE(::testing::Message() << "config " << (c < 0 ? "auto" : gemm_config_name(c)));
    std::vector<std::vector<uint16_t>> outs;
    for (bool on : {false, true}) {
      set_launch_overlap(on);
      for (int rep = 0; rep < 4; ++rep) {
        DevBuf<uint16_t> mid(std::vector<uint16_t>(size_t(M) * N1, 0x7fc0)), out(size_t(M) * N2);  // mid: NaN until written
        gemm({.x = dx.get(), .w = dw1.get(), .out = mid.get(), .M = M, .N = N1, .K = K});
        gemm({.x = mid.get(), .w = dw2.get(), .out = out.get(), .M = M, .N = N2, .K = N1});
        synchronize();
        outs.push_back(out.download());
      }
    }
    set_launch_overlap(was);
    for (size_t i = 1; i < outs.size(); ++i) ASSERT_EQ(outs[i], outs[0]) << "run " << i << " (overlap " << (i >= 4) << ")";
  }
  set_launch_overlap(was);
}

// ---- CUDA graphs: captured calls give the eager bits ---------------------------------------------

TEST_F(Gemm, CapturedInACudaGraphGivesTheEagerResults) {
  std::mt19937 rng(test_seed());
  SCOPED_TRACE(::testing::Message() << "seed " << test_seed());
  const int M = 24, N = 2816, K = 2048, G = 4;
  auto x = random_bf16(size_t(M) * K, rng), w = random_bf16(size_t(G) * N * K, rng, 0.02f);
  DevBuf<uint16_t> dx(x), dw(w);
  std::vector<const uint16_t*> wp;
  for (int g = 0; g < G; ++g) wp.push_back(dw.get() + size_t(g) * N * K);
  DevBuf<const uint16_t*> dwp(wp);
  DevBuf<int32_t> doff(std::vector<int32_t>{0, 10, 10, 11, M});
  DevBuf<int32_t> drows(std::vector<int32_t>{5, 3, 3, 0, 23, 22, 1, 2, 9, 8, 7, 6, 4, 10, 11, 12, 13, 14, 15, 16,
                                             17, 18, 19, 20});
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  auto issue = [&](uint16_t* inv, uint16_t* grouped, uint16_t* fast) {
    gemm({.x = dx.get(), .w = dw.get(), .out = inv, .M = M, .N = N, .K = K, .stream = stream});
    grouped_gemm({.x = dx.get(), .x_rows = drows.get(), .w = dwp.get(), .offsets = doff.get(), .out = grouped,
                  .groups = G, .max_rows = M, .N = N, .K = K, .x_rows_limit = M, .stream = stream});
    gemm({.x = dx.get(), .w = dw.get(), .out = fast, .M = M, .N = N, .K = K, .mode = GemmMode::fast, .stream = stream});
  };
  const size_t n = size_t(M) * N;
  DevBuf<uint16_t> e1(n), e2(n), e3(n), c1(n), c2(n), c3(n);
  issue(e1.get(), e2.get(), e3.get());  // eager first: one-time setup and the cuBLASLt plan
  ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  ASSERT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal), cudaSuccess);
  issue(c1.get(), c2.get(), c3.get());
  ASSERT_EQ(cudaStreamEndCapture(stream, &graph), cudaSuccess);
  ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
  ASSERT_EQ(cudaGraphLaunch(exec, stream), cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  EXPECT_EQ(c1.download(), e1.download()) << "batch_invariant";
  EXPECT_EQ(c2.download(), e2.download()) << "grouped";
  EXPECT_EQ(c3.download(), e3.download()) << "fast (cuBLASLt)";
  check_device_errors();
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  stream_destroy(stream);  // (with the stream's GEMM scratch: a later stream may get its handle)
}

// A sliced launch larger than its stream's scratch block frees the block and makes a larger one,
// so a graph captured before holds a freed address: gemm_scratch_moves() counts each such move
// (the model recaptures its graphs when it changes); launches the block holds move nothing.
TEST_F(Gemm, ALargerSlicedLaunchCountsAScratchMove) {
  const int M = 128, N = 2048, K_small = 1024, K_large = 4096;  // 4 MB, then 16 MB of slice sums
  DevBuf<uint16_t> dx(size_t(M) * K_large), dw(size_t(N) * K_large), out(size_t(M) * N);
  const GemmArgs small{.x = dx.get(), .w = dw.get(), .out = out.get(), .M = M, .N = N, .K = K_small};
  GemmArgs large = small;
  large.K = K_large;
  for (const GemmArgs& a : {small, large})
    if (gemm_config_name(gemm_chosen_config(a)).find("+slices") == std::string::npos)
      GTEST_SKIP() << "M = 128, N = 2048 takes " << gemm_config_name(gemm_chosen_config(a))
                   << " here, not a sliced launch";
  const Stream s = stream_create();
  const auto run = [&](GemmArgs a) {
    a.stream = s;
    gemm(a);
    stream_synchronize(s);
  };
  run(small);  // the stream's block (made, or moved if a destroyed stream's handle left one)
  const uint64_t before = gemm_scratch_moves();
  run(large);
  EXPECT_EQ(gemm_scratch_moves(), before + 1) << "the larger launch moved the block";
  run(small);
  run(large);
  EXPECT_EQ(gemm_scratch_moves(), before + 1) << "launches the block holds";
  check_device_errors();
  stream_destroy(s);
}

// ---- cuBLASLt ---------------------------------------------------------------------------------------

void expect_cublaslt_close(GemmMode mode, std::mt19937& rng) {
  const int N = 2048, K = 2048;
  for (int M : {1, 37, 128}) {
    auto x = random_bf16(size_t(M) * K, rng), w = random_bf16(size_t(N) * K, rng, 0.02f);
    DevBuf<uint16_t> dx(x), dw(w);
    const auto got_f = run_gemm<float>(dx, dw, M, N, K, mode);
    const auto got_b = run_gemm<uint16_t>(dx, dw, M, N, K, mode);
    expect_close_to_reference(got_f, got_b, ref_gemm<float>(x, w, M, N, K), abs_dot(x, w, M, N, K),
                              "M=" + std::to_string(M));
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

// ---- bad arguments (host checks; no device work) ------------------------------------------------------

void expect_error(const std::function<void()>& f, const std::string& what) {
  try {
    f();
    FAIL() << "no throw, expected " << what;
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
  }
}

TEST_F(Gemm, BadArgumentsThrowNamingTheField) {
  DevBuf<uint16_t> b(64);
  expect_error([] { gemm({.x = nullptr, .w = nullptr, .out = nullptr, .M = 1, .N = 0, .K = 4}); }, "gemm: shape");
  expect_error([&] { gemm({.x = b.get(), .w = b.get(), .out = b.get(), .M = 1, .N = 8, .K = 8, .batch = 0}); },
               "gemm: batch");
  expect_error([&] { gemm({.x = b.get(), .w = b.get(), .out = b.get(), .M = 1, .N = 8, .K = 8, .x_stride = 4}); },
               "gemm: stride");
  expect_error([&] { grouped_gemm({.x = b.get(), .out = b.get(), .groups = 0, .max_rows = 1, .N = 8, .K = 8}); },
               "grouped_gemm: groups");
  expect_error([&] { grouped_gemm({.x = b.get(), .out = b.get(), .groups = 1, .max_rows = 1, .N = 8, .K = 8}); },
               "grouped_gemm: pointers");
  expect_error([] { gemm_force_config(gemm_config_count()); }, "gemm_force_config: config");
  expect_error([&] { gemm({.x = b.get(), .w = b.get(), .out = b.get(), .M = 1, .N = 8, .K = 8, .gated = 3,
                           .gated_scratch = b.get()}); },
               "gemm: gated");
  expect_error([&] { gemm({.x = b.get(), .w = b.get(), .out = b.get(), .M = 1, .N = 8, .K = 8, .gated = 4}); },
               "gemm: gated_scratch");
  expect_error([&] { gemm({.x = b.get(), .w = b.get(), .out = b.get(), .out_type = OutType::f32, .M = 1, .N = 8,
                           .K = 8, .gated = 4, .gated_scratch = b.get()}); },
               "gemm: gated");
  expect_error([&] { grouped_gemm({.x = b.get(), .w = reinterpret_cast<const uint16_t* const*>(b.get()),
                                   .offsets = reinterpret_cast<const int32_t*>(b.get()), .out = b.get(), .groups = 1,
                                   .max_rows = 1, .N = 8, .K = 8, .gated = 4}); },
               "grouped_gemm: gated_scratch");
  expect_error([&] { grouped_gemm({.x = b.get(), .w = reinterpret_cast<const uint16_t* const*>(b.get()),
                                   .offsets = reinterpret_cast<const int32_t*>(b.get()), .out = b.get(), .groups = 2,
                                   .max_rows = 1, .N = 8, .K = 8, .w_base = b.get(), .w_group_stride = 63}); },
               "grouped_gemm: w_group_stride");
}

}  // namespace
}  // namespace atlas::cuda::test
