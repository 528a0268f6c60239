// Router (softmax, top-k, weights) and MoE permutation / gather / combine.
#include <algorithm>
#include <cmath>
#include <limits>
#include <cstring>
#include <memory>
#include <numeric>
#include <set>

#include "backend/cuda/reference.h"
#include "cuda_test_util.h"

namespace atlas::cuda::test {
namespace {

// ---- host-only: the selection rules of the reference, from hand-built cases ----------------

// Floats as bit patterns (NaN != NaN as floats), for bit-for-bit comparisons.
std::vector<uint32_t> float_bits(const std::vector<float>& v) {
  std::vector<uint32_t> u(v.size());
  std::memcpy(u.data(), v.data(), v.size() * sizeof(float));
  return u;
}

TEST(RouterReference, TiesGoToTheLowerExpertAndOrderIsDescending) {
  // Experts 5 and 2 share the highest logit, 7 is next, 1 and 3 tie after it.
  std::vector<float> logits(8, -3.0f);
  logits[5] = logits[2] = 2.0f;
  logits[7] = 1.5f;
  logits[1] = logits[3] = 1.0f;
  std::vector<int32_t> ids(4);
  std::vector<float> w(4);
  ref::router({.logits = logits.data(), .topk_ids = ids.data(), .topk_weights = w.data(), .tokens = 1,
               .experts = 8, .k = 4});
  EXPECT_EQ(ids, (std::vector<int32_t>{2, 5, 7, 1}));
  EXPECT_EQ(w[0], w[1]);
  EXPECT_GT(w[1], w[2]);
  EXPECT_GT(w[2], w[3]);
}

TEST(RouterReference, GroupLimitedKeepsOnlyTheBestGroups) {
  // 8 experts in 4 groups of 2; group maxima: g0 0.0, g1 3.0, g2 2.0, g3 2.5 -> keep g1, g3.
  std::vector<float> logits = {0.0f, -1.0f, 3.0f, -2.0f, 2.0f, 1.9f, -0.5f, 2.5f};
  std::vector<int32_t> ids(3);
  std::vector<float> w(3);
  ref::router({.logits = logits.data(), .topk_ids = ids.data(), .topk_weights = w.data(), .tokens = 1,
               .experts = 8, .k = 3, .method = TopkMethod::group_limited_greedy, .n_group = 4,
               .topk_group = 2, .norm_topk_prob = true});
  EXPECT_EQ(ids, (std::vector<int32_t>{2, 7, 6}));
  EXPECT_NEAR(w[0] + w[1] + w[2], 1.0f, 1e-6f);
}

// ---- GPU ------------------------------------------------------------------------------------

class Router : public CudaTest {};

struct RouterCase {
  int experts, k;
  TopkMethod method;
  int n_group, topk_group;
  bool norm;
  float scale;
};

TEST_F(Router, MatchesReferenceAndTrueTopK) {
  std::mt19937 rng(test_seed());
  SCOPED_TRACE(::testing::Message() << "seed " << test_seed());
  const int T = 300;
  for (const RouterCase c : {RouterCase{64, 6, TopkMethod::greedy, 1, 1, false, 1.0f},  // Lite
                             RouterCase{160, 6, TopkMethod::group_limited_greedy, 8, 3, false, 16.0f},  // V2
                             RouterCase{64, 8, TopkMethod::group_limited_greedy, 8, 4, true, 1.0f}}) {
    const int E = c.experts, k = c.k;
    auto logits = random_f32(size_t(T) * E, rng, 2.0f);
    std::vector<int32_t> want_ids(size_t(T) * k);
    std::vector<float> want_w(size_t(T) * k), want_scores(size_t(T) * E);
    RouterArgs a{.logits = logits.data(), .topk_ids = want_ids.data(), .topk_weights = want_w.data(),
                 .scores = want_scores.data(), .tokens = T, .experts = E, .k = k, .method = c.method,
                 .n_group = c.n_group, .topk_group = c.topk_group, .norm_topk_prob = c.norm,
                 .routed_scaling_factor = c.scale};
    ref::router(a);
    DevBuf<float> dl(logits), dw(want_w.size()), ds(want_scores.size());
    DevBuf<int32_t> di(want_ids.size());
    a.logits = dl.get();
    a.topk_ids = di.get();
    a.topk_weights = dw.get();
    a.scores = ds.get();
    router(a);
    check_device_errors();
    EXPECT_EQ(di.download(), want_ids) << "E=" << E;
    const auto gw = dw.download(), gs = ds.download();
    for (size_t i = 0; i < gw.size(); ++i) EXPECT_NEAR(gw[i], want_w[i], 2e-6f * std::abs(want_w[i]) + 1e-12f);
    for (size_t i = 0; i < gs.size(); ++i) EXPECT_NEAR(gs[i], want_scores[i], 2e-6f * want_scores[i] + 1e-12f);
    // Independent: in double, the chosen set is the k best among the kept groups.
    const auto gi = di.download();
    for (int t = 0; t < T; ++t) {
      std::vector<double> p(E);
      double m = *std::max_element(&logits[size_t(t) * E], &logits[size_t(t) * E] + E), s = 0;
      for (int e = 0; e < E; ++e) s += p[e] = std::exp(double(logits[size_t(t) * E + e]) - m);
      for (auto& v : p) v /= s;
      if (c.method == TopkMethod::group_limited_greedy) {
        const int gs_ = E / c.n_group;
        std::vector<std::pair<double, int>> g;
        for (int q = 0; q < c.n_group; ++q)
          g.push_back({-*std::max_element(&p[q * gs_], &p[q * gs_] + gs_), q});
        std::sort(g.begin(), g.end());
        std::set<int> keep;
        for (int q = 0; q < c.topk_group; ++q) keep.insert(g[q].second);
        for (int e = 0; e < E; ++e)
          if (!keep.count(e / gs_)) p[e] = 0;
      }
      std::vector<int> order(E);
      std::iota(order.begin(), order.end(), 0);
      std::stable_sort(order.begin(), order.end(), [&](int x, int y) { return p[x] > p[y]; });
      double wsum = 0;
      for (int j = 0; j < k; ++j) wsum += p[order[j]];
      for (int j = 0; j < k; ++j) {
        ASSERT_EQ(gi[size_t(t) * k + j], order[j]) << "token " << t << " slot " << j;
        const double want = c.norm ? p[order[j]] / wsum : p[order[j]] * c.scale;
        EXPECT_NEAR(gw[size_t(t) * k + j], want, 1e-5 * want);
      }
    }
  }
}

class Moe : public CudaTest {};

// Routes with k distinct experts per token, skewed so some experts get many pairs and some none.
std::vector<int32_t> random_routes(int T, int k, int E, std::mt19937& rng) {
  std::vector<int32_t> ids(size_t(T) * k);
  std::vector<int> all(E);
  std::iota(all.begin(), all.end(), 0);
  for (int t = 0; t < T; ++t) {
    std::shuffle(all.begin(), all.end() - E / 4, rng);  // the last quarter is never routed
    for (int j = 0; j < k; ++j) ids[size_t(t) * k + j] = all[j];
  }
  return ids;
}

TEST_F(Moe, PermuteGatherCombineMatchReference) {
  std::mt19937 rng(test_seed());
  SCOPED_TRACE(::testing::Message() << "seed " << test_seed());
  const int E = 64, k = 6, dim = 192;
  // 1, 7, 256 tokens: the one-chunk kernel (256: six scatter rounds); 257 and 1000: several
  // chunks of 256 (count, scan, scatter).
  for (int T : {1, 7, 256, 257, 1000}) {
    const auto ids = random_routes(T, k, E, rng);
    const size_t P = size_t(T) * k;
    std::vector<int32_t> counts(E), offsets(E + 1), sorted(P), slot(P);
    ref::moe_permute({.topk_ids = ids.data(), .tokens = T, .k = k, .experts = E, .counts = counts.data(),
                      .offsets = offsets.data(), .sorted_token = sorted.data(), .pair_slot = slot.data()});
    DevBuf<int32_t> di(ids), dc(E), doff(E + 1), ds(P), dslot(P), ws(moe_permute_workspace_ints(T, E));
    MoePermuteArgs a{.topk_ids = di.get(), .tokens = T, .k = k, .experts = E, .counts = dc.get(),
                     .offsets = doff.get(), .sorted_token = ds.get(), .pair_slot = dslot.get(),
                     .workspace = ws.get()};
    moe_permute(a);
    check_device_errors();
    EXPECT_EQ(dc.download(), counts) << T;
    EXPECT_EQ(doff.download(), offsets) << T;
    EXPECT_EQ(ds.download(), sorted) << T;
    EXPECT_EQ(dslot.download(), slot) << T;
    // Independent properties: slot is a permutation, each slot holds its own token and expert.
    std::vector<int> seen(P, 0);
    for (size_t i = 0; i < P; ++i) {
      ASSERT_GE(slot[i], 0);
      ASSERT_LT(size_t(slot[i]), P);
      ++seen[slot[i]];
      EXPECT_EQ(sorted[slot[i]], int32_t(i / k));
      const int e = ids[i];
      EXPECT_GE(slot[i], offsets[e]);
      EXPECT_LT(slot[i], offsets[e + 1]);
    }
    EXPECT_TRUE(std::all_of(seen.begin(), seen.end(), [](int s) { return s == 1; }));

    // Gather, then fake expert outputs, then the weighted combine.
    auto x = random_bf16(size_t(T) * dim, rng);
    DevBuf<uint16_t> dx(x), dxs(P * dim);
    moe_gather({.x = dx.get(), .sorted_token = ds.get(), .x_sorted = dxs.get(), .rows = int(P), .dim = dim});
    const auto xs = dxs.download();
    for (size_t r = 0; r < P; ++r)
      ASSERT_TRUE(std::equal(xs.begin() + r * dim, xs.begin() + (r + 1) * dim, x.begin() + sorted[r] * dim));
    auto y = random_bf16(P * dim, rng);
    auto w = random_f32(P, rng, 0.2f);
    std::vector<uint16_t> want(size_t(T) * dim);
    ref::moe_combine({.y_sorted = y.data(), .pair_slot = slot.data(), .topk_weights = w.data(),
                      .out = want.data(), .tokens = T, .k = k, .dim = dim});
    DevBuf<uint16_t> dy(y), dout(want.size());
    DevBuf<float> dw(w);
    moe_combine({.y_sorted = dy.get(), .pair_slot = dslot.get(), .topk_weights = dw.get(), .out = dout.get(),
                 .tokens = T, .k = k, .dim = dim});
    check_device_errors();
    EXPECT_EQ(dout.download(), want) << T;
    // With the shared experts' output added in the same launch: out as before, and
    // sum_out = bf16(out + addend), the bits of add().
    auto shared = random_bf16(size_t(T) * dim, rng);
    std::vector<uint16_t> want_sum(want.size());
    ref::add_bf16({.a = want.data(), .b = shared.data(), .out = want_sum.data(), .n = int64_t(want.size())});
    DevBuf<uint16_t> dsh(shared), dout2(want.size()), dsum(want.size());
    moe_combine({.y_sorted = dy.get(), .pair_slot = dslot.get(), .topk_weights = dw.get(), .out = dout2.get(),
                 .tokens = T, .k = k, .dim = dim, .addend = dsh.get(), .sum_out = dsum.get()});
    check_device_errors();
    EXPECT_EQ(dout2.download(), want) << T;
    EXPECT_EQ(dsum.download(), want_sum) << T;
  }
}

// moe_combine_add_rmsnorm: the bits of moe_combine (with or without the shared addend), then
// add_rmsnorm of the residual stream with its sum: x updated in place and the normed rows, in
// bf16 and f32, at V2-Lite's width and at one past the kernel's register rows (2304), on both
// bf16 variants of the 256-thread kernel (staged and not) and the wide one. (add_rmsnorm itself
// is checked against the host reference in test_cuda_elementwise.cpp, on both its kernels.)
template <class T>
void combine_norm_matches_two_calls(std::mt19937& rng, int tokens, int k, int dim, bool with_shared) {
  const size_t P = size_t(tokens) * k;
  std::vector<int32_t> slot(P);
  std::iota(slot.begin(), slot.end(), 0);
  std::shuffle(slot.begin(), slot.end(), rng);
  auto to_t = [](const std::vector<uint16_t>& b) {
    std::vector<T> v(b.size());
    for (size_t i = 0; i < b.size(); ++i) {
      if constexpr (sizeof(T) == 2)
        v[i] = b[i];
      else
        v[i] = bf16_to_f32(b[i]) * 1.37f;
    }
    return v;
  };
  const auto y = to_t(random_bf16(P * dim, rng)), sh = to_t(random_bf16(size_t(tokens) * dim, rng)),
             x = to_t(random_bf16(size_t(tokens) * dim, rng)), nw = to_t(random_bf16(size_t(dim), rng, 0.5f));
  const auto w = random_f32(P, rng, 0.2f);
  DevBuf<T> dy(y), dsh(sh), dx_a(x), dx_b(x), dnw(nw), drouted(size_t(tokens) * dim), dsum(size_t(tokens) * dim),
      dh_a(size_t(tokens) * dim), dh_b(size_t(tokens) * dim);
  DevBuf<int32_t> dslot(slot);
  DevBuf<float> dw(w);
  moe_combine(MoeCombineArgsT<T>{.y_sorted = dy.get(), .pair_slot = dslot.get(), .topk_weights = dw.get(),
                                 .out = drouted.get(), .tokens = tokens, .k = k, .dim = dim,
                                 .addend = with_shared ? dsh.get() : nullptr,
                                 .sum_out = with_shared ? dsum.get() : nullptr});
  add_rmsnorm(AddRmsNormArgsT<T>{.x = dx_a.get(), .y = with_shared ? dsum.get() : drouted.get(), .weight = dnw.get(),
                                 .out = dh_a.get(), .rows = tokens, .dim = dim, .eps = 1e-6f});
  moe_combine_add_rmsnorm(MoeCombineNormArgsT<T>{.y_sorted = dy.get(), .pair_slot = dslot.get(),
                                                 .topk_weights = dw.get(), .addend = with_shared ? dsh.get() : nullptr,
                                                 .x = dx_b.get(), .weight = dnw.get(), .out = dh_b.get(),
                                                 .tokens = tokens, .k = k, .dim = dim, .eps = 1e-6f});
  check_device_errors();
  const auto xa = dx_a.download(), xb = dx_b.download(), ha = dh_a.download(), hb = dh_b.download();
  EXPECT_EQ(std::memcmp(xa.data(), xb.data(), xa.size() * sizeof(T)), 0) << "residual stream";
  EXPECT_EQ(std::memcmp(ha.data(), hb.data(), ha.size() * sizeof(T)), 0) << "normed rows";
  EXPECT_NE(std::memcmp(xb.data(), x.data(), xb.size() * sizeof(T)), 0) << "x not updated";
}

TEST_F(Moe, CombineAddRmsNormIsCombineThenAddRmsNorm) {
  std::mt19937 rng(test_seed());
  SCOPED_TRACE(::testing::Message() << "seed " << test_seed());
  // bf16 takes the staged kernel at k <= 8 and dims <= 2048 that are multiples of 8 (2048, 1000:
  // threads past the row's 125 chunks load nothing), the other at 2304, 1001 and k = 10.
  for (const int dim : {2048, 2304, 1000, 1001})
    for (const bool shared : {true, false}) {
      SCOPED_TRACE(::testing::Message() << "dim " << dim << (shared ? " with" : " without") << " shared");
      combine_norm_matches_two_calls<uint16_t>(rng, 37, 6, dim, shared);
      combine_norm_matches_two_calls<float>(rng, 5, 6, dim, shared);
    }
  for (const int k : {1, 8, 10}) {
    SCOPED_TRACE(::testing::Message() << "k " << k);
    combine_norm_matches_two_calls<uint16_t>(rng, 9, k, 2048, true);
  }
  // One token (a batch-1 decode step), k up to 8: the wide kernels (the paired one where dim
  // is even), at V2-Lite's width and two others, and an odd width (the unpaired wide kernel).
  for (const int k : {1, 6, 8})
    for (const int dim : {2048, 1000, 64, 999}) {
      SCOPED_TRACE(::testing::Message() << "one token, k " << k << ", dim " << dim);
      combine_norm_matches_two_calls<uint16_t>(rng, 1, k, dim, true);
      combine_norm_matches_two_calls<uint16_t>(rng, 1, k, dim, false);
      combine_norm_matches_two_calls<float>(rng, 1, k, dim, true);
    }
  // Up to 256 tokens the wide kernel (one 1024-thread block per token) runs both sides where
  // k <= 8 and dim <= 2048; 300 tokens: the 256-thread kernels.
  for (const bool shared : {true, false}) {
    SCOPED_TRACE(::testing::Message() << "300 tokens" << (shared ? " with" : " without") << " shared");
    combine_norm_matches_two_calls<uint16_t>(rng, 300, 6, 2048, shared);
    combine_norm_matches_two_calls<float>(rng, 300, 6, 1000, shared);
  }
  DevBuf<uint16_t> d(16);
  DevBuf<int32_t> ds(16);
  DevBuf<float> dw(16);
  const MoeCombineNormArgsT<uint16_t> ok{.y_sorted = d.get(), .pair_slot = ds.get(), .topk_weights = dw.get(),
                                         .x = d.get(), .weight = d.get(), .out = d.get(), .tokens = 1, .k = 17,
                                         .dim = 8};
  EXPECT_THROW(moe_combine_add_rmsnorm(ok), Error);  // k > 16 (and out aliases x)
}

// gemm_combine_norm (session 42, ATLAS_COMBINE_QKV): the next layer's q|kv_a GEMM with the MoE
// combine + residual add + input norm inside (gemm_cluster_combine_kernel) against
// moe_combine_add_rmsnorm then gemm(): the same GEMM output, residual sum (in x_out; x itself
// untouched) and normed row, bit for bit, at V2-Lite's shape (dim 2048: clusters of eight blocks
// exchanging their squares; k = 6 and the run-time k path), at 512 (two blocks) and at the tiny
// preset's 64 (one block: no exchange), with and without the shared experts' addend, with the
// routed rows loaded by their slots and directly (ATLAS_COMBINE_DIRECT; the slots shuffled). What
// it does not take launches nothing and returns false; aliasing x_out and x throws.
TEST_F(Moe, CombineNormInsideQkvEqualsTheCombineThenGemm) {
  std::mt19937 rng(test_seed());
  SCOPED_TRACE(::testing::Message() << "seed " << test_seed());
  struct Case {
    int dim, N, k;
    bool shared;
  };
  for (const Case c : {Case{2048, 3648, 6, true}, Case{2048, 3648, 6, false}, Case{2048, 3648, 4, true},
                       Case{512, 200, 8, true}, Case{64, 136, 3, true}, Case{64, 136, 1, false}}) {
    SCOPED_TRACE(::testing::Message() << "dim " << c.dim << " N " << c.N << " k " << c.k << (c.shared ? " shared" : ""));
    const int dim = c.dim, k = c.k;
    std::vector<int32_t> slot(static_cast<size_t>(k));
    std::iota(slot.begin(), slot.end(), 0);
    std::shuffle(slot.begin(), slot.end(), rng);
    const auto y = random_bf16(size_t(k) * dim, rng), sh = random_bf16(size_t(dim), rng), x = random_bf16(size_t(dim), rng),
               nw = random_bf16(size_t(dim), rng, 0.5f), wq = random_bf16(size_t(c.N) * dim, rng, 0.1f);
    const auto w = random_f32(size_t(k), rng, 0.2f);
    DevBuf<uint16_t> dy(y), dsh(sh), dnw(nw), dwq(wq);
    DevBuf<int32_t> dslot(slot);
    DevBuf<float> dw(w);
    struct Out {
      std::vector<uint16_t> out, x, x_out, h;
    };
    const auto run = [&](bool fused, bool flagged = false, bool direct = false) {
      DevBuf<uint16_t> dx(x), dh(static_cast<size_t>(dim)), dxo(static_cast<size_t>(dim)), dout(static_cast<size_t>(c.N));
      DevBuf<uint32_t> flags(std::vector<uint32_t>(3, 0u));
      if (flagged) gemm_combine_signal(flags.get(), 3, 1, nullptr);  // (before it in the stream here)
      const MoeCombineNormArgsT<uint16_t> a{.y_sorted = dy.get(), .pair_slot = dslot.get(), .topk_weights = dw.get(),
                                            .addend = c.shared ? dsh.get() : nullptr, .x = dx.get(), .weight = dnw.get(),
                                            .out = dh.get(), .tokens = 1, .k = k, .dim = dim, .eps = 1e-6f};
      const GemmArgs g{.x = dh.get(), .w = dwq.get(), .out = dout.get(), .M = 1, .N = c.N, .K = dim};
      gemm_set_combine_norm(fused ? 1 : 0);
      gemm_set_combine_direct(direct ? 1 : 0);
      const int64_t before = gemm_combine_norm_launches(), direct_before = gemm_combine_direct_launches();
      const bool ran = gemm_combine_norm(g, a, dxo.get(), flagged ? flags.get() + 1 : nullptr);
      EXPECT_EQ(ran, fused);
      EXPECT_EQ(gemm_combine_norm_launches(), before + (fused ? 1 : 0));
      EXPECT_EQ(gemm_combine_direct_launches(), direct_before + (fused && direct ? 1 : 0));
      gemm_set_combine_direct(-1);
      if (!ran) {
        moe_combine_add_rmsnorm(a);
        gemm(g);
      }
      gemm_set_combine_norm(-1);
      check_device_errors();
      if (flagged) {
        EXPECT_EQ(flags.download(), (std::vector<uint32_t>{0u, 1u, 0u}));
      }
      return Out{dout.download(), dx.download(), dxo.download(), dh.download()};
    };
    const Out want = run(false);
    EXPECT_NE(want.x, x) << "the combine added nothing";
    for (const bool flagged : {false, true})
      for (const bool direct : {false, true}) {  // (ATLAS_COMBINE_DIRECT: the rows beside the slots)
        SCOPED_TRACE(flagged ? "flagged (weights before the wait)" : "joined");
        SCOPED_TRACE(direct ? "rows loaded directly" : "rows by their slots");
        const Out got = run(true, flagged, direct);
        EXPECT_EQ(got.out, want.out) << "q|kv_a output";
        EXPECT_EQ(got.x_out, want.x) << "residual sum";
        EXPECT_EQ(got.h, want.h) << "normed row";
        EXPECT_EQ(got.x, x) << "x written";
      }
  }
  // Not taken: two rows, K unlike dim, K not a multiple of 64, k > 8, f32 out; x_out = x throws.
  const int dim = 2048;
  DevBuf<uint16_t> d(size_t(4) * dim), dq(size_t(64) * dim), dxo(static_cast<size_t>(dim)), dout(size_t(2) * 64);
  DevBuf<int32_t> ds(16);
  DevBuf<float> dw(16);
  const MoeCombineNormArgsT<uint16_t> a{.y_sorted = d.get(), .pair_slot = ds.get(), .topk_weights = dw.get(),
                                        .x = d.get() + dim, .weight = d.get() + 2 * dim, .out = d.get() + 3 * dim,
                                        .tokens = 1, .k = 6, .dim = dim};
  const GemmArgs g{.x = a.out, .w = dq.get(), .out = dout.get(), .M = 1, .N = 64, .K = dim};
  gemm_set_combine_norm(1);
  const int64_t before = gemm_combine_norm_launches();
  GemmArgs g2 = g;
  g2.M = 2;
  EXPECT_FALSE(gemm_combine_norm(g2, a, dxo.get()));
  MoeCombineNormArgsT<uint16_t> a2 = a;
  a2.dim = 1024;
  EXPECT_FALSE(gemm_combine_norm(g, a2, dxo.get()));
  GemmArgs g3 = g;
  g3.K = a2.dim = 1000;
  EXPECT_FALSE(gemm_combine_norm(g3, a2, dxo.get()));
  a2 = a;
  a2.k = 9;
  EXPECT_FALSE(gemm_combine_norm(g, a2, dxo.get()));
  GemmArgs g4 = g;
  g4.out_type = OutType::f32;
  EXPECT_FALSE(gemm_combine_norm(g4, a, dxo.get()));
  EXPECT_EQ(gemm_combine_norm_launches(), before);
  EXPECT_THROW(gemm_combine_norm(g, a, const_cast<uint16_t*>(a.x)), Error);
  gemm_set_combine_norm(-1);
}

TEST_F(Moe, PermutationIsRepeatable) {
  std::mt19937 rng(test_seed());
  const int T = 4096, k = 6, E = 64;
  const auto ids = random_routes(T, k, E, rng);
  DevBuf<int32_t> di(ids), dc(E), doff(E + 1), ds(T * k), dslot(T * k), ws(moe_permute_workspace_ints(T, E));
  MoePermuteArgs a{.topk_ids = di.get(), .tokens = T, .k = k, .experts = E, .counts = dc.get(),
                   .offsets = doff.get(), .sorted_token = ds.get(), .pair_slot = dslot.get(),
                   .workspace = ws.get()};
  moe_permute(a);
  const auto first = dslot.download();
  for (int rep = 0; rep < 5; ++rep) {
    moe_permute(a);
    ASSERT_EQ(dslot.download(), first) << "rep " << rep;
  }
}

// Many chunks of several rounds each (a 128-prompt traced prefill has ~150 chunks of 256 tokens),
// every repetition against the reference: a missing barrier between the scatter's rounds showed
// only at this size, as stage hashes that changed from run to run.
TEST_F(Moe, LargePermutationsMatchTheReferenceEveryTime) {
  std::mt19937 rng(test_seed());
  SCOPED_TRACE(::testing::Message() << "seed " << test_seed());
  const int T = 38400, k = 6, E = 64;
  const auto ids = random_routes(T, k, E, rng);
  const size_t P = size_t(T) * k;
  std::vector<int32_t> counts(E), offsets(E + 1), sorted(P), slot(P);
  ref::moe_permute({.topk_ids = ids.data(), .tokens = T, .k = k, .experts = E, .counts = counts.data(),
                    .offsets = offsets.data(), .sorted_token = sorted.data(), .pair_slot = slot.data()});
  DevBuf<int32_t> di(ids), dc(E), doff(E + 1), ds(P), dslot(P), ws(moe_permute_workspace_ints(T, E));
  MoePermuteArgs a{.topk_ids = di.get(), .tokens = T, .k = k, .experts = E, .counts = dc.get(),
                   .offsets = doff.get(), .sorted_token = ds.get(), .pair_slot = dslot.get(),
                   .workspace = ws.get()};
  for (int rep = 0; rep < 20; ++rep) {
    moe_permute(a);
    check_device_errors();
    ASSERT_EQ(ds.download(), sorted) << "rep " << rep;
    ASSERT_EQ(dslot.download(), slot) << "rep " << rep;
  }
}

TEST_F(Moe, BadExpertIdIsReported) {
  DevBuf<int32_t> di(std::vector<int32_t>{0, 64}), dc(64), doff(65), ds(2), dslot(2), ws(moe_permute_workspace_ints(1, 64));
  moe_permute({.topk_ids = di.get(), .tokens = 1, .k = 2, .experts = 64, .counts = dc.get(), .offsets = doff.get(),
               .sorted_token = ds.get(), .pair_slot = dslot.get(), .workspace = ws.get()});
  EXPECT_THROW(check_device_errors(), Error);
}

// moe_route (one launch for 1-8 tokens, else the two calls; up to 32 pairs permuted by one warp)
// against router() then moe_permute() on the same logits: every output bit for bit, greedy and
// group-limited, with and without the scores, at token counts on both sides of the fused path's
// bound and of the one-warp permutation's.
TEST_F(Moe, RouteEqualsRouterThenPermute) {
  std::mt19937 rng(test_seed());
  SCOPED_TRACE(::testing::Message() << "seed " << test_seed());
  for (const RouterCase c : {RouterCase{64, 6, TopkMethod::greedy, 1, 1, true, 1.0f},  // Lite
                             RouterCase{160, 6, TopkMethod::group_limited_greedy, 8, 3, false, 16.0f}}) {
    for (int T : {1, 3, 5, 6, kMoeRouteFusedMaxTokens, kMoeRouteFusedMaxTokens + 1, 300}) {  // (<= 5: one warp)
      const int E = c.experts, k = c.k;
      const size_t P = size_t(T) * k;
      const auto logits = random_f32(size_t(T) * E, rng, 2.0f);
      DevBuf<float> dl(logits);
      struct Out {
        DevBuf<int32_t> ids, counts, offsets, sorted, slot, ws;
        DevBuf<float> w, scores;
      };
      auto run = [&](bool fused, bool scores) {
        std::unique_ptr<Out> o(new Out{DevBuf<int32_t>(P), DevBuf<int32_t>(size_t(E)), DevBuf<int32_t>(size_t(E + 1)),
                                       DevBuf<int32_t>(P), DevBuf<int32_t>(P),
                                       DevBuf<int32_t>(moe_permute_workspace_ints(T, E)), DevBuf<float>(P),
                                       DevBuf<float>(size_t(T) * E)});
        const RouterArgs r{.logits = dl.get(), .topk_ids = o->ids.get(), .topk_weights = o->w.get(),
                           .scores = scores ? o->scores.get() : nullptr, .tokens = T, .experts = E, .k = k,
                           .method = c.method, .n_group = c.n_group, .topk_group = c.topk_group,
                           .norm_topk_prob = c.norm, .routed_scaling_factor = c.scale};
        const MoePermuteArgs p{.topk_ids = o->ids.get(), .tokens = T, .k = k, .experts = E,
                               .counts = o->counts.get(), .offsets = o->offsets.get(),
                               .sorted_token = o->sorted.get(), .pair_slot = o->slot.get(), .workspace = o->ws.get()};
        if (fused) {
          moe_route(r, p);
        } else {
          router(r);
          moe_permute(p);
        }
        check_device_errors();
        return o;
      };
      for (bool scores : {false, true}) {
        const auto a = run(true, scores), b = run(false, scores);
        SCOPED_TRACE(::testing::Message() << "E=" << E << " T=" << T << " scores=" << scores);
        EXPECT_EQ(a->ids.download(), b->ids.download());
        EXPECT_EQ(a->w.download(), b->w.download());
        if (scores) {
          EXPECT_EQ(a->scores.download(), b->scores.download());
        }
        EXPECT_EQ(a->counts.download(), b->counts.download());
        EXPECT_EQ(a->offsets.download(), b->offsets.download());
        EXPECT_EQ(a->sorted.download(), b->sorted.download());
        EXPECT_EQ(a->slot.download(), b->slot.download());
      }
    }
  }
}

// The one-token path of moe_route (greedy, E <= 64: selection by rank, no block barrier) against
// router() then moe_permute(): expert counts on both sides of a warp's 32, k from 1 to E, the
// weights normalised or scaled, scores tied in value (ties go to the lower id in both), and
// logits that make a score NaN (+inf, NaN, all -inf), where the fused kernel falls back to the
// general code: the same outputs and the same device error either way.
TEST_F(Moe, RouteOneTokenEqualsRouterThenPermute) {
  std::mt19937 rng(test_seed());
  SCOPED_TRACE(::testing::Message() << "seed " << test_seed());
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  struct Case {
    int E, k;
    bool norm;
    float scale;
    int kind;  // 0 random, 1 ties (logits in steps of 1, few values), 2 one +inf, 3 one NaN, 4 all -inf
  };
  std::vector<Case> cases;
  for (int E : {6, 31, 32, 33, 40, 64})
    for (int k : {1, 2, 6})
      if (k <= E)
        for (int kind = 0; kind < 5; ++kind) cases.push_back({E, k, kind % 2 == 0, kind % 2 ? 2.5f : 1.0f, kind});
  cases.push_back({8, 8, true, 1.0f, 1});  // k = E: every expert picked
  for (const Case& c : cases) {
    SCOPED_TRACE(::testing::Message() << "E=" << c.E << " k=" << c.k << " kind=" << c.kind);
    auto logits = random_f32(size_t(c.E), rng, 2.0f);
    if (c.kind == 1)
      for (float& v : logits) v = std::floor(v);  // about four distinct values over E experts
    if (c.kind == 2) logits[size_t(c.E / 2)] = inf;
    if (c.kind == 3) logits[size_t(c.E - 1)] = nan;
    if (c.kind == 4) std::fill(logits.begin(), logits.end(), -inf);
    DevBuf<float> dl(logits);
    struct Out {
      std::vector<int32_t> ids, counts, offsets, sorted, slot;
      std::vector<float> w, scores;
      bool error;
    };
    auto run = [&](bool fused) {
      const int E = c.E, k = c.k;
      DevBuf<int32_t> ids{size_t(k)}, counts{size_t(E)}, offsets{size_t(E + 1)}, sorted{size_t(k)}, slot{size_t(k)},
          ws{moe_permute_workspace_ints(1, E)};
      DevBuf<float> w{size_t(k)}, scores{size_t(E)};
      // (DevBuf's poison is where nothing is written: the error cases leave slots unplaced.)
      const RouterArgs r{.logits = dl.get(), .topk_ids = ids.get(), .topk_weights = w.get(), .scores = scores.get(),
                         .tokens = 1, .experts = E, .k = k, .method = TopkMethod::greedy, .n_group = 1,
                         .topk_group = 1, .norm_topk_prob = c.norm, .routed_scaling_factor = c.scale};
      const MoePermuteArgs p{.topk_ids = ids.get(), .tokens = 1, .k = k, .experts = E, .counts = counts.get(),
                             .offsets = offsets.get(), .sorted_token = sorted.get(), .pair_slot = slot.get(),
                             .workspace = ws.get()};
      if (fused) {
        moe_route(r, p);
      } else {
        router(r);
        moe_permute(p);
      }
      const bool error = device_error_raised();
      return Out{ids.download(), counts.download(), offsets.download(), sorted.download(), slot.download(),
                 w.download(), scores.download(), error};
    };
    const Out a = run(true), b = run(false);
    EXPECT_EQ(a.error, b.error);
    EXPECT_EQ(a.error, c.kind >= 2);  // a NaN score: nothing routable, an id out of range flagged
    EXPECT_EQ(a.ids, b.ids);
    EXPECT_EQ(a.counts, b.counts);
    EXPECT_EQ(a.offsets, b.offsets);
    EXPECT_EQ(a.sorted, b.sorted);
    EXPECT_EQ(a.slot, b.slot);
    EXPECT_EQ(float_bits(a.w), float_bits(b.w));
    EXPECT_EQ(float_bits(a.scores), float_bits(b.scores));
  }
}

// gemm_moe_route (session 33, ATLAS_ROUTE_TAIL): the router GEMM's launch routes one token in its
// last block (RouteTail). Against gemm() then moe_route(): the same logits, routes, weights,
// permutation and device error, bit for bit, for the one-token path's cases above (random,
// ties, +inf, NaN, all -inf: the logits are built by the GEMM itself from one-hot x), on the
// staged split-K config (forced: what one row's router GEMM gets); what it does not take
// launches nothing and returns false; a logits pointer other than the GEMM's output throws.
TEST_F(Moe, RouteTailEqualsTheRouterGemmThenMoeRoute) {
  std::mt19937 rng(test_seed());
  SCOPED_TRACE(::testing::Message() << "seed " << test_seed());
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  int staged = -1;
  for (int c = 0; c < gemm_config_count(); ++c)
    if (gemm_config_name(c) == "splitk16x8/8w+staged") staged = c;
  ASSERT_GE(staged, 0);
  const int K = 2048;
  struct Case {
    int E, k;
    bool norm;
    int kind;  // 0 random x and w, 1 ties, 2 one +inf, 3 one NaN, 4 all -inf (one-hot x)
  };
  std::vector<Case> cases;
  for (int E : {6, 33, 64})
    for (int k : {1, 6})
      if (k <= E)
        for (int kind = 0; kind < 5; ++kind) cases.push_back({E, k, kind % 2 == 0, kind});
  for (const Case& c : cases) {
    SCOPED_TRACE(::testing::Message() << "E=" << c.E << " k=" << c.k << " kind=" << c.kind);
    std::vector<uint16_t> x(size_t(K), 0), w(size_t(c.E) * K, 0);
    if (c.kind == 0) {
      x = random_bf16(size_t(K), rng);
      w = random_bf16(size_t(c.E) * K, rng, 0.1f);
    } else {
      x[0] = f32_to_bf16(1.0f);
      const auto l = random_f32(size_t(c.E), rng, 2.0f);
      for (int e = 0; e < c.E; ++e) w[size_t(e) * K] = f32_to_bf16(c.kind == 1 ? std::floor(l[size_t(e)]) : l[size_t(e)]);
      if (c.kind == 2) w[size_t(c.E / 2) * K] = f32_to_bf16(inf);
      if (c.kind == 3) w[size_t(c.E - 1) * K] = f32_to_bf16(nan);
      if (c.kind == 4)
        for (int e = 0; e < c.E; ++e) w[size_t(e) * K] = f32_to_bf16(-inf);
    }
    DevBuf<uint16_t> dx(x), dw(w);
    struct Out {
      std::vector<float> logits, w;
      std::vector<int32_t> ids, counts, offsets, sorted, slot;
      bool error;
    };
    const auto run = [&](int tail) {  // gemm_set_route_tail's mode: 0 the two launches, 1 split-K tail, 2 cluster
      const int E = c.E, k = c.k;
      DevBuf<float> logits{size_t(E)}, wts{size_t(k)};
      DevBuf<int32_t> ids{size_t(k)}, counts{size_t(E)}, offsets{size_t(E + 1)}, sorted{size_t(k)}, slot{size_t(k)},
          ws{moe_permute_workspace_ints(1, E)};
      const GemmArgs g{.x = dx.get(), .w = dw.get(), .out = logits.get(), .out_type = OutType::f32, .M = 1, .N = E,
                       .K = K};
      const RouterArgs r{.logits = logits.get(), .topk_ids = ids.get(), .topk_weights = wts.get(), .tokens = 1,
                         .experts = E, .k = k, .norm_topk_prob = c.norm, .routed_scaling_factor = 1.5f};
      const MoePermuteArgs p{.topk_ids = ids.get(), .tokens = 1, .k = k, .experts = E, .counts = counts.get(),
                             .offsets = offsets.get(), .sorted_token = sorted.get(), .pair_slot = slot.get(),
                             .workspace = ws.get()};
      gemm_force_config(staged);
      gemm_set_route_tail(tail);
      const int64_t before = gemm_route_tail_launches(), before_cluster = gemm_route_cluster_launches();
      const bool ran = gemm_moe_route(g, r, p);
      EXPECT_EQ(ran, tail != 0);
      EXPECT_EQ(gemm_route_tail_launches(), before + (tail == 1 ? 1 : 0));
      EXPECT_EQ(gemm_route_cluster_launches(), before_cluster + (tail == 2 ? 1 : 0));
      if (!ran) {
        gemm(g);
        moe_route(r, p);
      }
      gemm_set_route_tail(-1);
      gemm_force_config(-1);
      const bool error = device_error_raised();
      return Out{logits.download(), wts.download(), ids.download(), counts.download(), offsets.download(),
                 sorted.download(), slot.download(), error};
    };
    const Out b = run(0);
    for (const int mode : {1, 2}) {
      SCOPED_TRACE(mode == 1 ? "split-K tail" : "cluster route");
      const Out a = run(mode);
      EXPECT_EQ(a.error, b.error);
      EXPECT_EQ(a.error, c.kind >= 2);
      EXPECT_EQ(float_bits(a.logits), float_bits(b.logits));
      EXPECT_EQ(float_bits(a.w), float_bits(b.w));
      EXPECT_EQ(a.ids, b.ids);
      EXPECT_EQ(a.counts, b.counts);
      EXPECT_EQ(a.offsets, b.offsets);
      EXPECT_EQ(a.sorted, b.sorted);
      EXPECT_EQ(a.slot, b.slot);
    }
  }
  // What the tail does not take: nothing launched, false; a foreign logits pointer: an error.
  DevBuf<uint16_t> dx(size_t(2) * K), dw(size_t(128) * K);
  DevBuf<float> logits(size_t(2) * 128), other(128), wts(12);
  DevBuf<int32_t> ids(12), counts(128), offsets(129), sorted(12), slot(12), ws(moe_permute_workspace_ints(2, 128));
  const GemmArgs g{.x = dx.get(), .w = dw.get(), .out = logits.get(), .out_type = OutType::f32, .M = 1, .N = 64, .K = K};
  const RouterArgs r{.logits = logits.get(), .topk_ids = ids.get(), .topk_weights = wts.get(), .tokens = 1,
                     .experts = 64, .k = 6};
  const MoePermuteArgs p{.topk_ids = ids.get(), .tokens = 1, .k = 6, .experts = 64, .counts = counts.get(),
                         .offsets = offsets.get(), .sorted_token = sorted.get(), .pair_slot = slot.get(),
                         .workspace = ws.get()};
  gemm_force_config(staged);
  const int64_t before = gemm_route_tail_launches(), before_cluster = gemm_route_cluster_launches();
  gemm_set_route_tail(0);
  EXPECT_FALSE(gemm_moe_route(g, r, p)) << "the switch off";
  for (const int mode : {1, 2}) {
    SCOPED_TRACE(mode == 1 ? "split-K tail" : "cluster route");
    gemm_set_route_tail(mode);
    // The same problem on `rows` rows and `experts` experts (the GEMM's, the router's and the
    // permutation's fields alike).
    const auto refused_shape = [&](int rows, int experts, const char* what) {
      GemmArgs g2 = g;
      g2.M = rows;
      g2.N = experts;
      RouterArgs r2 = r;
      r2.tokens = rows;
      r2.experts = experts;
      MoePermuteArgs p2 = p;
      p2.tokens = rows;
      p2.experts = experts;
      EXPECT_FALSE(gemm_moe_route(g2, r2, p2)) << what;
    };
    refused_shape(2, 64, "two rows");
    RouterArgs rg = r;
    rg.method = TopkMethod::group_limited_greedy;
    rg.n_group = 8;
    rg.topk_group = 4;
    EXPECT_FALSE(gemm_moe_route(g, rg, p)) << "group-limited";
    refused_shape(1, 128, "128 experts");
    GemmArgs gb = g;
    gb.out_type = OutType::bf16;
    EXPECT_FALSE(gemm_moe_route(gb, r, p)) << "bf16 logits";
    RouterArgs ro = r;
    ro.logits = other.get();
    try {
      gemm_moe_route(g, ro, p);
      ADD_FAILURE() << "no throw";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("gemm_moe_route: logits"), std::string::npos) << e.what();
    }
  }
  EXPECT_EQ(gemm_route_tail_launches(), before);
  EXPECT_EQ(gemm_route_cluster_launches(), before_cluster);
  gemm_set_route_tail(-1);
  gemm_force_config(-1);
  synchronize();
}

TEST_F(Moe, RouteRefusesAPermutationOfOtherIds) {
  DevBuf<float> dl(64);
  DevBuf<int32_t> ids(6), other(6), dc(64), doff(65), ds(6), dslot(6), ws(moe_permute_workspace_ints(1, 64));
  DevBuf<float> dw(6);
  const RouterArgs r{.logits = dl.get(), .topk_ids = ids.get(), .topk_weights = dw.get(), .tokens = 1,
                     .experts = 64, .k = 6};
  const MoePermuteArgs p{.topk_ids = other.get(), .tokens = 1, .k = 6, .experts = 64, .counts = dc.get(),
                         .offsets = doff.get(), .sorted_token = ds.get(), .pair_slot = dslot.get(),
                         .workspace = ws.get()};
  try {
    moe_route(r, p);
    FAIL() << "no throw";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("moe_route: permute"), std::string::npos) << e.what();
  }
}

TEST_F(Router, BadArgumentsThrowNamingTheField) {
  try {
    router({.logits = nullptr, .topk_ids = nullptr, .topk_weights = nullptr, .tokens = 1, .experts = 300, .k = 6});
    FAIL() << "no throw";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("router: experts"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace atlas::cuda::test
