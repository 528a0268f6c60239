// Properties of the CPU forward pass that need no reference: batch invariance, thread-count
// invariance, cached == uncached, interventions through hooks, partial layer ranges.
#include <gtest/gtest.h>
#include <omp.h>

#include <cstring>
#include <set>

#include "model/deepseek_v2.h"
#include "model/hooks.h"
#include "tiny_model.h"

using namespace atlas;

namespace {

struct Fixture {
  ModelConfig cfg = ModelConfig::from_json(test_support::tiny_config_json(), "tiny");
  test_support::TinyWeights weights{cfg};
  DeepSeekV2 model(Compute c) const { return DeepSeekV2(cfg, LayerRange::all(cfg), weights.source(), c); }
};

const std::vector<std::vector<int32_t>> kRows = {
    {5, 17, 42, 8, 9, 13, 21, 34, 55, 89, 3, 2},  // longer than original_max_position_embeddings (8)
    {7, 7, 7},
    {96, 0, 1, 50, 60, 70, 80},
    {11},
};

// Left-pads rows to a common length; positions count from each row's first real token.
struct Batch {
  int64_t B = 0, T = 0;
  std::vector<int32_t> ids, pos;
  std::vector<uint8_t> mask;
  ForwardInput input() const { return {.batch = B, .tokens = T, .ids = ids, .positions = pos, .mask = mask}; }
};

Batch left_pad(const std::vector<std::vector<int32_t>>& rows, int32_t pad = 1) {
  Batch b;
  b.B = int64_t(rows.size());
  for (auto& r : rows) b.T = std::max<int64_t>(b.T, int64_t(r.size()));
  for (auto& r : rows) {
    const int64_t npad = b.T - int64_t(r.size());
    for (int64_t t = 0; t < b.T; ++t) {
      const bool real = t >= npad;
      b.ids.push_back(real ? r[size_t(t - npad)] : pad);
      b.mask.push_back(real ? 1 : 0);
      b.pos.push_back(real ? int32_t(t - npad) : 0);
    }
  }
  return b;
}

}  // namespace

class ForwardModes : public ::testing::TestWithParam<Compute> {};

TEST_P(ForwardModes, RowResultsDoNotDependOnTheBatch) {
  Fixture f;
  auto model = f.model(GetParam());
  const int64_t V = f.cfg.vocab_size;
  Batch all = left_pad(kRows);
  auto batched = model.forward(all.input());
  for (size_t r = 0; r < kRows.size(); ++r) {
    Batch one = left_pad({kRows[r]});
    auto alone = model.forward(one.input());
    const int64_t n = int64_t(kRows[r].size()), npad = all.T - n;
    for (int64_t t = 0; t < n; ++t)
      ASSERT_EQ(0, std::memcmp(alone.logits.data() + t * V,
                               batched.logits.data() + ((int64_t(r) * all.T) + npad + t) * V, size_t(V) * 4))
          << "row " << r << " token " << t;
  }
}

TEST_P(ForwardModes, ThreadCountDoesNotChangeResults) {
  Fixture f;
  auto model = f.model(GetParam());
  Batch all = left_pad(kRows);
  omp_set_num_threads(1);
  auto one = model.forward(all.input());
  omp_set_num_threads(3);
  auto three = model.forward(all.input());
  omp_set_num_threads(omp_get_num_procs());
  ASSERT_EQ(one.logits.size(), three.logits.size());
  EXPECT_EQ(0, std::memcmp(one.logits.data(), three.logits.data(), one.logits.size() * 4));
}

TEST_P(ForwardModes, CachedDecodeEqualsUncachedForward) {
  Fixture f;
  auto model = f.model(GetParam());
  const int64_t V = f.cfg.vocab_size;
  Batch all = left_pad(kRows);
  auto full = model.forward(all.input());
  // Prefill the first 5 positions, then one position at a time.
  KVCache cache = model.make_kv_cache(all.B, all.T);
  const int64_t prefill = 5;
  for (int64_t t0 = 0; t0 < all.T;) {
    const int64_t n = t0 == 0 ? prefill : 1;
    Batch step;
    step.B = all.B;
    step.T = n;
    for (int64_t b = 0; b < all.B; ++b)
      for (int64_t t = t0; t < t0 + n; ++t) {
        step.ids.push_back(all.ids[size_t(b * all.T + t)]);
        step.pos.push_back(all.pos[size_t(b * all.T + t)]);
        step.mask.push_back(all.mask[size_t(b * all.T + t)]);
      }
    auto out = model.forward(step.input(), cache);
    for (int64_t b = 0; b < all.B; ++b)
      for (int64_t t = 0; t < n; ++t) {
        if (!all.mask[size_t(b * all.T + t0 + t)]) continue;
        ASSERT_EQ(0, std::memcmp(out.logits.data() + (b * n + t) * V,
                                 full.logits.data() + (b * all.T + t0 + t) * V, size_t(V) * 4))
            << "row " << b << " position " << t0 + t;
      }
    t0 += n;
  }
}

INSTANTIATE_TEST_SUITE_P(Compute, ForwardModes, ::testing::Values(Compute::F32, Compute::BF16),
                         [](const auto& info) { return compute_name(info.param); });

TEST(Forward, OverwritingTopkIdsReroutesTokens) {
  Fixture f;
  auto model = f.model(Compute::F32);
  Batch one = left_pad({kRows[0]});
  auto base = model.forward(one.input());

  // Writing back the same ids changes nothing.
  Hooks same;
  same.add("blocks.1.moe.hook_topk_ids", [](HookTensor&) {});
  auto again = model.forward(one.input(), &same);
  EXPECT_EQ(0, std::memcmp(base.logits.data(), again.logits.data(), base.logits.size() * 4));

  // Routing every token of layer 1 to experts 0,1,2 changes the logits.
  Hooks reroute;
  int fired = 0;
  reroute.add("blocks.1.moe.hook_topk_ids", [&](HookTensor& t) {
    ++fired;
    ASSERT_EQ(t.dtype, DType::I32);
    ASSERT_EQ(t.shape, (std::vector<int64_t>{1, int64_t(kRows[0].size()), 3}));
    for (int64_t i = 0; i < t.numel(); ++i) t.i32()[i] = int32_t(i % 3);
  });
  auto changed = model.forward(one.input(), &reroute);
  EXPECT_EQ(fired, 1);
  EXPECT_NE(0, std::memcmp(base.logits.data(), changed.logits.data(), base.logits.size() * 4));

  // An out-of-range expert id written by an observer is an error, not a crash.
  Hooks bad;
  bad.add("blocks.2.moe.hook_topk_ids", [](HookTensor& t) { t.i32()[0] = 99; });
  EXPECT_THROW(model.forward(one.input(), &bad), Error);
}

TEST(Forward, RouterOutputsAreOrderedAndNormalised) {
  Fixture f;
  auto model = f.model(Compute::F32);
  Batch one = left_pad({kRows[0]});
  std::vector<int32_t> ids;
  std::vector<float> w;
  Hooks h;
  h.add("blocks.2.moe.hook_topk_ids", [&](HookTensor& t) { ids.assign(t.i32(), t.i32() + t.numel()); });
  h.add("blocks.2.moe.hook_topk_weights", [&](HookTensor& t) { w.assign(t.f32(), t.f32() + t.numel()); });
  model.forward(one.input(), &h);
  ASSERT_EQ(ids.size(), kRows[0].size() * 3);
  for (size_t m = 0; m < kRows[0].size(); ++m) {
    float sum = 0;
    for (int j = 0; j < 3; ++j) {
      sum += w[m * 3 + j];
      if (j) {
        EXPECT_GE(w[m * 3 + j - 1], w[m * 3 + j]);
      }
    }
    EXPECT_NEAR(sum, 1.0f, 1e-6f);  // norm_topk_prob
    // group-limited: experts come from at most topk_group (2) of the 4 groups of 2.
    std::set<int> groups;
    for (int j = 0; j < 3; ++j) groups.insert(ids[m * 3 + j] / 2);
    EXPECT_LE(groups.size(), 2u);
  }
}

TEST(Forward, PartialLayerRangeMatchesTheFullRunsStages) {
  Fixture f;
  DeepSeekV2 full(f.cfg, LayerRange::all(f.cfg), f.weights.source(), Compute::BF16);
  DeepSeekV2 part(f.cfg, LayerRange{0, 1}, f.weights.source(), Compute::BF16);
  EXPECT_FALSE(part.has_head());
  Batch one = left_pad({kRows[2]});
  std::vector<float> a, b;
  Hooks ha, hb;
  ha.add("blocks.1.hook_resid_post", [&](HookTensor& t) { a.assign(t.f32(), t.f32() + t.numel()); });
  hb.add("blocks.1.hook_resid_post", [&](HookTensor& t) { b.assign(t.f32(), t.f32() + t.numel()); });
  full.forward(one.input(), &ha);
  auto out = part.forward(one.input(), &hb);
  EXPECT_TRUE(out.logits.empty());
  ASSERT_FALSE(a.empty());
  EXPECT_EQ(a, b);
}

TEST(Forward, RejectsOutOfVocabularyIds) {
  Fixture f;
  auto model = f.model(Compute::F32);
  Batch one = left_pad({{1, 2, 97}});
  try {
    model.forward(one.input());
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("97 is outside the vocabulary"), std::string::npos) << e.what();
  }
}

TEST(Hooks, GlobMatching) {
  EXPECT_TRUE(glob_match("blocks.*.moe.hook_topk_ids", "blocks.12.moe.hook_topk_ids"));
  EXPECT_FALSE(glob_match("blocks.*.moe.hook_topk_ids", "blocks.12.moe.hook_topk_weights"));
  EXPECT_TRUE(glob_match("*", "logits"));
  EXPECT_TRUE(glob_match("embed", "embed"));
  EXPECT_FALSE(glob_match("embed", "embedx"));
}

TEST(Forward, AbsorbedDecodeAgreesWithExpandedForward) {
  Fixture f;
  for (Compute mode : {Compute::F32, Compute::BF16}) {
    auto model = f.model(mode);
    const int64_t V = f.cfg.vocab_size;
    Batch all = left_pad(kRows);
    auto full = model.forward(all.input());
    KVCache cache = model.make_kv_cache(all.B, all.T);
    double worst = 0;
    for (int64_t t0 = 0; t0 < all.T; ++t0) {
      Batch step;
      step.B = all.B;
      step.T = 1;
      for (int64_t b = 0; b < all.B; ++b) {
        step.ids.push_back(all.ids[size_t(b * all.T + t0)]);
        step.pos.push_back(all.pos[size_t(b * all.T + t0)]);
        step.mask.push_back(all.mask[size_t(b * all.T + t0)]);
      }
      ForwardInput in = step.input();
      in.attention = AttentionForm::Absorbed;
      auto out = model.forward(in, cache);
      for (int64_t b = 0; b < all.B; ++b) {
        if (!all.mask[size_t(b * all.T + t0)]) continue;
        double maxabs = 0, maxerr = 0;
        for (int64_t v = 0; v < V; ++v) {
          const double ref = full.logits[size_t((b * all.T + t0) * V + v)];
          maxabs = std::max(maxabs, std::abs(ref));
          maxerr = std::max(maxerr, std::abs(ref - double(out.logits[size_t(b * V + v)])));
        }
        worst = std::max(worst, maxerr / maxabs);
      }
    }
    // f32: reassociation only. bf16: the two forms round at different points (documented).
    EXPECT_LT(worst, mode == Compute::F32 ? 1e-5 : 5e-2) << compute_name(mode);
  }
}
