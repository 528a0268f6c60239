// The CUDA forward pass (backend/cuda/cuda_model.h) end to end: against the CPU backend's bf16
// mode and transformers' fp32 reference on the committed fixtures, determinism, batch
// invariance in prefill and decode, cached decode vs prefill. Skips visibly without a GPU.
//
// Stated tolerances (relative error = max |a - b| / max |b| over real tokens):
//   CUDA bf16 vs CPU bf16: hidden stages and logits within 0.12, top-k ids agree >= 95%.
//     Same rounding points except attention: the CPU rounds scores and probabilities to bf16,
//     the CUDA kernel keeps them fp32 (docs/cuda.md), and reduction orders differ, so a
//     near-tied expert choice may flip and move later layers. Both are bf16 computations,
//     each allowed 0.08 from the fp32 reference (tests/model/test_reference.cpp), so their
//     mutual distance is bounded by the same order, not by a tighter one: measured on the
//     H200, tiny_lite_yarn_bf16 (7 of 348 selections flipped) reaches 0.090 at the logits,
//     the other two fixtures (no flips) stay below 0.017.
//   CUDA bf16 vs transformers fp32: within 0.12, top-k ids agree >= 95%.
//   Determinism, batch invariance, decode vs prefill: bit-identical (the design guarantees it:
//     packed per-row caches, row-independent kernels, fixed MLA split size).
//   CUDA f32 (the checking mode) vs CPU f32 with absorbed attention (the form the CUDA backend
//     runs): relative L2 (over real tokens) <= 1e-5 at every hook the CPU fires, top-k ids
//     identical (issue 5). Both are fp32 computations of the same formulas without a bf16
//     rounding; they differ only in fp32 reduction orders (FMA chains vs the CPU's 8-lane dot
//     products, block sums, split softmax) and expf vs libm exp, which move results by ~1e-7
//     relative per op (the CPU's own expanded vs absorbed forms differ by <= 4e-7 on the
//     fixtures). A larger error means a real difference: indexing, a missed or extra rounding,
//     a wrong cache slot, a flipped route. CUDA f32 vs transformers fp32: 1e-4 (max-abs
//     relative error, the CPU f32 mode's own tolerance, tests/model/test_reference.cpp).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <initializer_list>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "backend/cuda/cuda_model.h"
#include "backend/cuda/cuda_ops.h"
#include "decode/generate.h"
#include "io/checkpoint.h"
#include "io/safetensors.h"
#include "io/synthetic.h"
#include "model/digest.h"
#include "model/hooks.h"
#include "model/intervene.h"
#include "model/loader.h"
#include "model/presets.h"
#include "model/trace.h"
#include "../../support/reference_capture.h"

using namespace atlas;
namespace fs = std::filesystem;

namespace {

// Environment variables set (a null value: unset) for a scope and restored after it. Tests whose
// counters another switch changes pin that switch: gpu_full_run.sh runs the model tests again
// under other switches (MODEL_TEST_ENVS), where e.g. ATLAS_MOE_DOWN_EARLY's plain launches would
// count as ATLAS_SHARED_DOWN_WAIT's.
class ScopedEnv {
 public:
  ScopedEnv(std::initializer_list<std::pair<const char*, const char*>> vars) {
    for (const auto& [name, value] : vars) {
      const char* was = std::getenv(name);
      saved_.push_back({name, was != nullptr, was != nullptr ? was : ""});
      set(name, value);
    }
  }
  ~ScopedEnv() {
    for (auto it = saved_.rbegin(); it != saved_.rend(); ++it) set(it->name, it->had ? it->value.c_str() : nullptr);
  }
  static void set(const char* name, const char* value) {
    if (value != nullptr)
      setenv(name, value, 1);
    else
      unsetenv(name);
  }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  struct Saved {
    const char* name;
    bool had;
    std::string value;
  };
  std::vector<Saved> saved_;
};

class CudaModelTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (cuda::device_count() == 0) GTEST_SKIP() << "no CUDA device";
  }
};

using test_support::Captured;
using test_support::fixture_dirs;
using test_support::Reference;
using test_support::rel_error;

void compare(const std::string& label, const Captured& ours, const Captured& theirs, const Reference& ref,
             double tol) {
  int64_t sel = 0, same = 0, stages = 0;
  for (const auto& [name, want] : theirs.f32) {
    if (name.rfind("hidden.", 0) != 0 && name != "logits") continue;
    ASSERT_TRUE(ours.f32.count(name)) << name;
    const int64_t width = int64_t(want.size()) / (ref.B * ref.T);
    const double err = rel_error(ours.f32.at(name), want, ref.mask, width);
    EXPECT_LE(err, tol) << label << " " << name;
    std::printf("  %s %-10s rel %.4g\n", label.c_str(), name.c_str(), err);
    ++stages;
  }
  for (const auto& [name, want] : theirs.i32) {
    ASSERT_TRUE(ours.i32.count(name)) << name;
    const auto& got = ours.i32.at(name);
    const int64_t width = int64_t(want.size()) / (ref.B * ref.T);
    for (size_t m = 0; m < ref.mask.size(); ++m)
      if (ref.mask[m])
        for (int64_t i = 0; i < width; ++i) {
          ++sel;
          same += got[m * width + i] == want[m * width + i];
        }
  }
  EXPECT_GT(stages, 2);
  ASSERT_GT(sel, 0);
  EXPECT_GE(double(same) / double(sel), 0.95) << label;
  std::printf("  %s top-k agreement %lld / %lld\n", label.c_str(), (long long)same, (long long)sel);
}

// Relative L2 distance ||a - b|| / ||b|| over the real tokens (rows of `width` values).
double rel_l2(const std::vector<float>& a, const std::vector<float>& b, const std::vector<int32_t>& mask,
              int64_t width) {
  double num = 0, den = 0;
  for (size_t m = 0; m < mask.size(); ++m) {
    if (!mask[m]) continue;
    for (int64_t i = 0; i < width; ++i) {
      const double d = double(a[m * width + i]) - double(b[m * width + i]);
      num += d * d;
      den += double(b[m * width + i]) * b[m * width + i];
    }
  }
  return den > 0 ? std::sqrt(num / den) : std::sqrt(num);
}

// The f32 criterion: every f32 tensor within 1e-5 relative L2, every top-k id identical.
void expect_f32_equal(const std::string& label, const Captured& ours, const Captured& theirs,
                      const std::vector<int32_t>& mask, int64_t rows) {
  double worst = 0;
  std::string worst_name;
  for (const auto& [name, want] : theirs.f32) {
    ASSERT_TRUE(ours.f32.count(name)) << label << ": " << name << " not captured on cuda";
    ASSERT_EQ(ours.f32.at(name).size(), want.size()) << label << ": " << name;
    const double err = rel_l2(ours.f32.at(name), want, mask, int64_t(want.size()) / rows);
    EXPECT_LE(err, 1e-5) << label << " " << name;
    const bool hidden = name.rfind("hidden.", 0) == 0 || name.find("hook_resid_post") != std::string::npos;
    if (hidden || name == "logits")
      std::printf("  %s %-10s rel L2 %.3g\n", label.c_str(), name.c_str(), err);
    if (err >= worst) worst = err, worst_name = name;
  }
  int64_t ids = 0, differ = 0;
  for (const auto& [name, want] : theirs.i32) {
    ASSERT_TRUE(ours.i32.count(name)) << label << ": " << name << " not captured on cuda";
    const auto& got = ours.i32.at(name);
    ASSERT_EQ(got.size(), want.size()) << label << ": " << name;
    const int64_t width = int64_t(want.size()) / rows;
    for (size_t m = 0; m < mask.size(); ++m)
      if (mask[m])
        for (int64_t i = 0; i < width; ++i) {
          ++ids;
          differ += got[m * width + i] != want[m * width + i];
        }
  }
  EXPECT_EQ(differ, 0) << label << ": top-k ids differ";
  std::printf("  %s: %zu f32 tensors, worst rel L2 %.3g (%s); top-k ids identical %lld / %lld\n", label.c_str(),
              theirs.f32.size(), worst, worst_name.c_str(), (long long)(ids - differ), (long long)ids);
}

Captured from_reference(const Reference& ref) {
  Captured c;
  for (const auto& t : ref.file->tensors()) {
    if (t.name == "input_ids" || t.name == "attention_mask") continue;
    if (t.dtype == DType::I32)
      c.i32[t.name].assign(reinterpret_cast<const int32_t*>(t.data), reinterpret_cast<const int32_t*>(t.data) + t.numel());
    else
      c.f32[t.name] = to_f32(t);
  }
  return c;
}

}  // namespace

TEST_F(CudaModelTest, FixturesMatchCpuBf16AndTransformersReference) {
  const auto dirs = fixture_dirs();
  ASSERT_GE(dirs.size(), 3u);
  for (const auto& dir : dirs) {
    SCOPED_TRACE(dir);
    const std::string tag = fs::path(dir).filename().string();
    Checkpoint ck = Checkpoint::open(dir);
    Reference ref(dir);
    auto gpu = load_model(ck, {.backend = "cuda", .compute = Compute::BF16});
    auto cpu = load_model(ck, {.backend = "cpu", .compute = Compute::BF16});
    ASSERT_EQ(gpu->backend(), "cuda");
    const Captured g = test_support::run_captured(*gpu, ref);
    const Captured c = test_support::run_captured(*cpu, ref);
    compare(tag + " cuda-vs-cpu-bf16", g, c, ref, 0.12);
    compare(tag + " cuda-vs-f32-ref", g, from_reference(ref), ref, 0.12);
  }
}

// The f32 checking mode on each fixture: CUDA f32 vs CPU f32 (absorbed) at every captured
// stage (hidden states, latents, router logits and weights, logits) and vs transformers' fp32.
TEST_F(CudaModelTest, FixturesF32MatchCpuF32AndTransformersReference) {
  const auto dirs = fixture_dirs();
  ASSERT_GE(dirs.size(), 3u);
  for (const auto& dir : dirs) {
    SCOPED_TRACE(dir);
    const std::string tag = fs::path(dir).filename().string();
    Checkpoint ck = Checkpoint::open(dir);
    Reference ref(dir);
    auto gpu = load_model(ck, {.backend = "cuda", .compute = Compute::F32});
    auto cpu = load_model(ck, {.backend = "cpu", .compute = Compute::F32});
    ASSERT_EQ(gpu->compute(), Compute::F32);
    const Captured g = test_support::run_captured(*gpu, ref);
    const Captured c = test_support::run_captured(*cpu, ref, AttentionForm::Absorbed);
    expect_f32_equal(tag + " cuda-f32-vs-cpu-f32", g, c, ref.mask, ref.B * ref.T);
    const Captured t = from_reference(ref);
    double worst = 0;
    for (const auto& [name, want] : t.f32) {
      ASSERT_TRUE(g.f32.count(name)) << name;
      const double err = rel_error(g.f32.at(name), want, ref.mask, int64_t(want.size()) / (ref.B * ref.T));
      EXPECT_LE(err, 1e-4) << tag << " cuda f32 vs transformers fp32: " << name;
      worst = std::max(worst, err);
    }
    for (const auto& [name, want] : t.i32) {  // top-k ids of the real tokens: identical
      ASSERT_TRUE(g.i32.count(name)) << name;
      const auto& got = g.i32.at(name);
      const int64_t width = int64_t(want.size()) / (ref.B * ref.T);
      int64_t differ = 0;
      for (size_t m = 0; m < ref.mask.size(); ++m)
        if (ref.mask[m])
          for (int64_t i = 0; i < width; ++i) differ += got[m * width + i] != want[m * width + i];
      EXPECT_EQ(differ, 0) << tag << " cuda f32 vs transformers fp32: " << name << " top-k ids differ";
    }
    std::printf("  %s cuda-f32-vs-transformers-fp32: worst relative error %.3g\n", tag.c_str(), worst);
  }
}

// --fast (cuBLASLt) is bf16-only: f32 with it is refused naming --fast, before any GPU is
// needed (so this runs on machines without one too).
TEST(CudaModelOptions, F32WithFastModeIsRefused) {
  Checkpoint ck = Checkpoint::open(fixture_dirs().at(0));
  try {
    load_model(ck, {.backend = "cuda", .compute = Compute::F32, .batch_invariant = false});
    FAIL() << "--fast with --compute f32 should be refused";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--fast"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("bf16-only"), std::string::npos) << e.what();
  }
}

// The tiny preset (vocab 1024, 4 layers, YaRN past its original context), made by the CLI.
class CudaTiny : public CudaModelTest {
 protected:
  static void SetUpTestSuite() {
    dir_ = (fs::temp_directory_path() / ("atlas_cuda_tiny_" + std::to_string(::getpid()))).string();
    const std::string cmd = std::string(ATLAS_BINARY) + " make-model --preset tiny --seed 3 " + dir_ + " > /dev/null";
    if (std::system(cmd.c_str()) != 0) dir_.clear();
  }
  static void TearDownTestSuite() {
    if (!dir_.empty()) fs::remove_all(dir_);
  }
  void SetUp() override {
    CudaModelTest::SetUp();
    if (IsSkipped()) return;
    ASSERT_FALSE(dir_.empty()) << "make-model --preset tiny failed";
    ck_ = std::make_unique<Checkpoint>(Checkpoint::open(dir_));
    model_ = load_model(*ck_, {.backend = "cuda", .compute = Compute::BF16});
  }
  static std::string dir_;
  std::unique_ptr<Checkpoint> ck_;
  std::unique_ptr<Model> model_;
};
std::string CudaTiny::dir_;

namespace {

// Rows of mixed lengths with deterministic ids.
std::vector<std::vector<int32_t>> prompts(int64_t V) {
  const int lens[8] = {5, 37, 1, 64, 12, 300, 33, 2};
  std::vector<std::vector<int32_t>> out;
  for (int r = 0; r < 8; ++r) {
    std::vector<int32_t> p;
    for (int t = 0; t < lens[r]; ++t) p.push_back(int32_t((r * 7919 + t * 104729 + 13) % V));
    out.push_back(p);
  }
  return out;
}

// Rows left-padded into one [B, T] prefill (the layout of bench and probe traces).
struct PaddedBatch {
  std::vector<int32_t> ids, pos;
  std::vector<uint8_t> mask;
  int64_t B = 0, T = 0;
  explicit PaddedBatch(const std::vector<std::vector<int32_t>>& rows) : B(int64_t(rows.size())) {
    for (const auto& r : rows) T = std::max<int64_t>(T, int64_t(r.size()));
    for (const auto& r : rows) {
      const int64_t pad = T - int64_t(r.size());
      for (int64_t t = 0; t < T; ++t) {
        ids.push_back(t < pad ? 0 : r[size_t(t - pad)]);
        pos.push_back(t < pad ? 0 : int32_t(t - pad));
        mask.push_back(t < pad ? 0 : 1);
      }
    }
  }
  ForwardInput input() const {
    return {.batch = B, .tokens = T, .ids = ids, .positions = pos, .mask = mask, .logits_last_only = true,
            .logits_rows = {}};
  }
};

// Left-padded batch prefill; returns the cache and the last-token logits [B, V].
std::vector<float> prefill(const Model& m, Cache& cache, const std::vector<std::vector<int32_t>>& rows,
                           const Hooks* hooks = nullptr, AttentionForm attention = AttentionForm::Expanded) {
  const PaddedBatch batch(rows);
  ForwardInput in = batch.input();
  in.attention = attention;
  return m.forward(in, cache, hooks).logits;
}

std::vector<float> step(const Model& m, Cache& cache, const std::vector<int32_t>& ids, const std::vector<int32_t>& pos,
                        const Hooks* hooks = nullptr, AttentionForm attention = AttentionForm::Expanded) {
  std::vector<uint8_t> mask(ids.size(), 1);
  return m.forward({.batch = int64_t(ids.size()), .tokens = 1, .ids = ids, .positions = pos, .mask = mask,
                    .logits_last_only = true, .attention = attention},
                   cache, hooks)
      .logits;
}

int32_t argmax(const float* x, int64_t n) { return int32_t(std::max_element(x, x + n) - x); }

// One row's prompt as a batch-1 prefill with last-token logits (owns what the input points at).
struct OneRow {
  std::vector<int32_t> ids, pos;
  std::vector<uint8_t> mask;
  explicit OneRow(std::vector<int32_t> row) : ids(std::move(row)), pos(ids.size()), mask(ids.size(), 1) {
    for (size_t t = 0; t < ids.size(); ++t) pos[t] = int32_t(t);
  }
  ForwardInput input() const {
    return {.batch = 1, .tokens = int64_t(ids.size()), .ids = ids, .positions = pos, .mask = mask,
            .logits_last_only = true};
  }
};

}  // namespace

TEST_F(CudaTiny, TwoRunsAreBitIdentical) {
  const auto rows = prompts(ck_->config().vocab_size);
  auto c1 = model_->make_cache(8, 310), c2 = model_->make_cache(8, 310);
  EXPECT_EQ(prefill(*model_, *c1, rows), prefill(*model_, *c2, rows));
}

// Each row's logits alone (no padding, batch of 1) vs inside the left-padded batch of 8, for
// the prefill and 6 greedy decode steps: bit for bit.
TEST_F(CudaTiny, RowLogitsAreBatchInvariantInPrefillAndDecode) {
  const int64_t V = ck_->config().vocab_size;
  const auto rows = prompts(V);
  const int steps = 6;
  auto cache = model_->make_cache(8, 300 + steps + 1);
  std::vector<std::vector<float>> batch_logits;  // per step [8, V]
  batch_logits.push_back(prefill(*model_, *cache, rows));
  std::vector<std::vector<int32_t>> toks(8);
  std::vector<int32_t> next_pos(8);
  for (int r = 0; r < 8; ++r) next_pos[size_t(r)] = int32_t(rows[size_t(r)].size());
  for (int s = 0; s < steps; ++s) {
    std::vector<int32_t> ids(8), pos(8);
    for (int r = 0; r < 8; ++r) {
      ids[size_t(r)] = argmax(batch_logits.back().data() + r * V, V);
      toks[size_t(r)].push_back(ids[size_t(r)]);
      pos[size_t(r)] = next_pos[size_t(r)]++;
    }
    batch_logits.push_back(step(*model_, *cache, ids, pos));
  }
  int64_t compared = 0;
  for (int r = 0; r < 8; ++r) {
    auto c1 = model_->make_cache(1, int64_t(rows[size_t(r)].size()) + steps + 1);
    std::vector<float> alone = prefill(*model_, *c1, {rows[size_t(r)]});
    for (int s = 0; s <= steps; ++s) {
      const std::vector<float> in_batch(batch_logits[size_t(s)].begin() + r * V,
                                        batch_logits[size_t(s)].begin() + (r + 1) * V);
      ASSERT_EQ(alone, in_batch) << "row " << r << " step " << s;
      ++compared;
      if (s == steps) break;
      alone = step(*model_, *c1, {toks[size_t(r)][size_t(s)]}, {int32_t(rows[size_t(r)].size()) + s});
    }
  }
  EXPECT_EQ(compared, 8 * (steps + 1));
}

// Decoding token by token from the cache gives the same logits as one prefill of the whole
// sequence (all-token logits), bit for bit.
TEST_F(CudaTiny, CachedDecodeMatchesPrefill) {
  const int64_t V = ck_->config().vocab_size;
  std::vector<int32_t> seq;
  for (int t = 0; t < 80; ++t) seq.push_back(int32_t((t * 31 + 7) % V));
  const int64_t P = 70, N = int64_t(seq.size());
  std::vector<int32_t> pos(static_cast<size_t>(N));
  for (int64_t t = 0; t < N; ++t) pos[size_t(t)] = int32_t(t);
  std::vector<uint8_t> mask(size_t(N), 1);
  const std::vector<float> full =
      model_->forward(ForwardInput{.batch = 1, .tokens = N, .ids = seq, .positions = pos, .mask = mask}).logits;
  ASSERT_EQ(full.size(), size_t(N * V));
  auto cache = model_->make_cache(1, N);
  std::vector<int32_t> head(seq.begin(), seq.begin() + P);
  std::vector<float> got = prefill(*model_, *cache, {head});
  for (int64_t t = P - 1; t < N; ++t) {
    const std::vector<float> want(full.begin() + t * V, full.begin() + (t + 1) * V);
    double maxd = 0;
    for (int64_t i = 0; i < V; ++i) maxd = std::max(maxd, std::abs(double(got[size_t(i)]) - want[size_t(i)]));
    EXPECT_EQ(got, want) << "token " << t << " max |diff| " << maxd;
    if (t + 1 < N) got = step(*model_, *cache, {seq[size_t(t + 1)]}, {int32_t(t + 1)});
  }
}

// Hooks intervene: forcing every token of layer 1 onto expert 0 changes the logits, and the
// forced run is itself deterministic.
TEST_F(CudaTiny, TopkHookInterventionChangesOutput) {
  const auto rows = prompts(ck_->config().vocab_size);
  auto c0 = model_->make_cache(8, 310);
  const auto base = prefill(*model_, *c0, rows);
  Hooks hooks;
  int fired = 0;
  hooks.add("blocks.1.moe.hook_topk_ids", [&](HookTensor& t) {
    ++fired;
    for (int64_t i = 0; i < t.numel(); ++i) t.i32()[i] = int32_t(i % t.shape.back());
  });
  const OneRow row(rows[1]);
  const ForwardInput in = row.input();
  const auto plain = model_->forward(in).logits;
  const auto forced = model_->forward(in, &hooks).logits;
  EXPECT_EQ(fired, 1);
  EXPECT_NE(plain, forced);
  EXPECT_EQ(forced, model_->forward(in, &hooks).logits);
}

// The fused launches (residual add + the next norm, routed + shared experts' add) run only
// when no tensor observer could change the sum in between; read-only tensor observers on every
// such hook switch the op-by-op path on. Both give the same logits, bit for bit.
TEST_F(CudaTiny, FusedLaunchesEqualTheOpByOpPath) {
  const auto rows = prompts(ck_->config().vocab_size);
  const OneRow row(rows[2]);
  const ForwardInput in = row.input();
  Hooks hooks;
  std::map<std::string, int> fired;
  for (const char* pat : {"blocks.*.hook_resid_mid", "blocks.*.hook_resid_post", "blocks.*.moe.hook_routed_out"})
    hooks.add(pat, [&, pat](HookTensor&) { ++fired[pat]; });
  const auto fused = model_->forward(in).logits;
  const auto op_by_op = model_->forward(in, &hooks).logits;
  const int64_t L = ck_->config().num_hidden_layers;
  EXPECT_EQ(fired["blocks.*.hook_resid_mid"], L);
  EXPECT_EQ(fired["blocks.*.hook_resid_post"], L);
  EXPECT_GT(fired["blocks.*.moe.hook_routed_out"], 0);
  EXPECT_EQ(fused, op_by_op);
}

// blocks.{L}.attn.hook_pattern on the CUDA backend against the CPU backend's (absorbed form):
// a left-padded prefill of 8 rows (1 to 300 tokens) and one decode step, bf16 and f32. Same
// shapes [B, heads, T, Tk], zeros wherever the CPU has structural zeros (padding keys, keys
// after the query), probabilities within the backends' own difference (bf16: the hidden states
// already differ by ~1% in later layers; f32: fp32 rounding).
TEST_F(CudaTiny, AttentionPatternMatchesTheCpuBackend) {
  const int64_t V = ck_->config().vocab_size;
  const auto rows = prompts(V);
  struct Fired {
    std::string name;
    std::vector<int64_t> shape;
    std::vector<float> p;
  };
  for (Compute compute : {Compute::BF16, Compute::F32}) {
    SCOPED_TRACE(compute == Compute::BF16 ? "bf16" : "f32");
    auto gpu = load_model(*ck_, {.backend = "cuda", .compute = compute});
    auto cpu = load_model(*ck_, {.backend = "cpu", .compute = compute});
    std::vector<Fired> fg, fc;
    Hooks hg, hc;
    const auto record = [](std::vector<Fired>& into) {
      return [&into](HookTensor& t) {
        into.push_back(Fired{std::string(t.name), t.shape, std::vector<float>(t.f32(), t.f32() + t.numel())});
      };
    };
    hg.add("blocks.*.attn.hook_pattern", record(fg));
    hc.add("blocks.*.attn.hook_pattern", record(fc));
    auto cg = gpu->make_cache(8, 310), cc = cpu->make_cache(8, 310);
    prefill(*gpu, *cg, rows, &hg, AttentionForm::Absorbed);
    prefill(*cpu, *cc, rows, &hc, AttentionForm::Absorbed);
    std::vector<int32_t> ids(8), pos(8);
    for (int r = 0; r < 8; ++r) {
      ids[size_t(r)] = int32_t((r * 31 + 7) % V);
      pos[size_t(r)] = int32_t(rows[size_t(r)].size());
    }
    step(*gpu, *cg, ids, pos, &hg, AttentionForm::Absorbed);
    step(*cpu, *cc, ids, pos, &hc, AttentionForm::Absorbed);
    ASSERT_EQ(fg.size(), fc.size());
    ASSERT_EQ(fg.size(), size_t(2 * ck_->config().num_hidden_layers));
    for (size_t i = 0; i < fg.size(); ++i) {
      SCOPED_TRACE(fc[i].name + (i < fg.size() / 2 ? " prefill" : " decode"));
      ASSERT_EQ(fg[i].name, fc[i].name);
      ASSERT_EQ(fg[i].shape, fc[i].shape);
      double worst = 0, total = 0;
      int64_t n = 0;
      for (size_t j = 0; j < fc[i].p.size(); ++j) {
        if (fc[i].p[j] == 0.0f) {
          ASSERT_EQ(fg[i].p[j], 0.0f) << j;
          continue;
        }
        const double d = std::abs(double(fg[i].p[j]) - fc[i].p[j]);
        worst = std::max(worst, d);
        total += d;
        ++n;
      }
      ASSERT_GT(n, 0);
      if (compute == Compute::F32) {
        EXPECT_LT(worst, 1e-4);
      } else {
        EXPECT_LT(worst, 0.06);
        EXPECT_LT(total / double(n), 0.005);
      }
    }
  }
}

// The logits of a prefill of the fixture's prompts and of 4 greedy decode steps after it (the
// first step runs eagerly, the rest replay its graph), all rows, concatenated.
namespace {
std::vector<float> prefill_and_greedy_steps(const Model& m, const std::vector<std::vector<int32_t>>& rows, int64_t V) {
  auto c = m.make_cache(8, 310);
  std::vector<float> all = prefill(m, *c, rows), lg = all;
  for (int s = 0; s < 4; ++s) {
    std::vector<int32_t> ids(8), pos(8);
    for (int r = 0; r < 8; ++r) {
      ids[size_t(r)] = argmax(lg.data() + r * V, V);
      pos[size_t(r)] = int32_t(rows[size_t(r)].size()) + s;
    }
    lg = step(m, *c, ids, pos);
    all.insert(all.end(), lg.begin(), lg.end());
  }
  return all;
}

// The same for one row (M = 1 in every decode step: where the GEMM tails apply).
std::vector<float> one_row_greedy_steps(const Model& m, const std::vector<int32_t>& row, int64_t V) {
  auto c = m.make_cache(1, 310);
  std::vector<float> all = prefill(m, *c, {row}), lg = all;
  for (int s = 0; s < 4; ++s) {
    lg = step(m, *c, {argmax(lg.data(), V)}, {int32_t(row.size()) + s});
    all.insert(all.end(), lg.begin(), lg.end());
  }
  return all;
}
}  // namespace

// Launch overlap (programmatic dependent launch) changes when a kernel's launch starts, never
// what it computes: prefill and graph-replayed decode steps with it off, on every launch and on
// the decode steps' launches only (the default), bit for bit. The decode mode's scope covers a
// decode step's forward and nothing else.
TEST_F(CudaTiny, LaunchOverlapGivesTheSameBits) {
  const int64_t V = ck_->config().vocab_size;
  const auto rows = prompts(V);
  const cuda::LaunchOverlap was = cuda::launch_overlap_mode();
  std::vector<std::vector<float>> runs;
  for (auto mode : {cuda::LaunchOverlap::off, cuda::LaunchOverlap::on, cuda::LaunchOverlap::decode}) {
    cuda::set_launch_overlap(mode);
    auto m = load_model(*ck_, {.backend = "cuda", .compute = Compute::BF16});
    runs.push_back(prefill_and_greedy_steps(*m, rows, V));
    if (mode == cuda::LaunchOverlap::decode && cuda::launch_overlap_mode() == mode) {
      EXPECT_FALSE(cuda::launch_overlap()) << "outside a decode step";
      {
        const cuda::DecodeLaunchScope step(true);
        EXPECT_TRUE(cuda::launch_overlap());
        const cuda::DecodeLaunchScope prefill(false);
        EXPECT_FALSE(cuda::launch_overlap()) << "a nested prefill scope";
      }
      EXPECT_FALSE(cuda::launch_overlap()) << "after the scope";
    }
  }
  cuda::set_launch_overlap(was);
  EXPECT_EQ(runs[0], runs[1]) << "on";
  EXPECT_EQ(runs[0], runs[2]) << "decode steps only";
}

// The side stream (the shared experts and the absorbed-query GEMM) on (the default) or off: the
// same bits in a prefill and in eager and graph-replayed decode steps, in both GEMM modes (the
// fast mode's shared experts run cuBLASLt beside the router's GEMM: each stream has its own
// workspace).
TEST_F(CudaTiny, SideStreamGivesTheSameBits) {
  const int64_t V = ck_->config().vocab_size;
  ASSERT_GT(ck_->config().n_shared_experts, 0) << "the fixture must have shared experts";
  const auto rows = prompts(V);
  for (bool invariant : {true, false}) {
    std::vector<std::vector<float>> runs;
    for (bool side : {true, false}) {
      auto m = cuda::make_cuda_model(*ck_, {.compute = Compute::BF16, .batch_invariant = invariant,
                                            .side_stream = side});
      runs.push_back(prefill_and_greedy_steps(*m, rows, V));
    }
    EXPECT_EQ(runs[0], runs[1]) << (invariant ? "batch-invariant" : "fast");
  }
}

// Where a decode step's absorbed-query GEMM runs (ATLAS_ABSORB, read when the model is made): on
// the side stream beside the latent cache kernel, on the model's stream before or after it, or in
// one launch with it (the default, where gemm_with_latent can run it: else as "after"): the same
// bits in a prefill and in eager and graph-replayed decode steps (8 rows and one), with the side
// stream on and off.
TEST_F(CudaTiny, AbsorbPlacementGivesTheSameBits) {
  const int64_t V = ck_->config().vocab_size;
  const auto rows = prompts(V);
  ScopedEnv restore{{"ATLAS_ABSORB", std::getenv("ATLAS_ABSORB")}};
  for (bool side : {true, false}) {
    std::vector<std::vector<float>> runs;
    for (const char* at : {"side", "before", "after", "fused"}) {
      setenv("ATLAS_ABSORB", at, 1);
      const int64_t fused_before = cuda::gemm_latent_launches();
      auto m = cuda::make_cuda_model(*ck_, {.compute = Compute::BF16, .side_stream = side});
      std::vector<float> r = prefill_and_greedy_steps(*m, rows, V);
      const std::vector<float> one = one_row_greedy_steps(*m, rows[0], V);  // batch-1 steps too
      r.insert(r.end(), one.begin(), one.end());
      runs.push_back(std::move(r));
      // The fused launch ran (the tiny model's decode steps fit it) where asked, and only there.
      if (std::string(at) == "fused")
        EXPECT_GT(cuda::gemm_latent_launches(), fused_before) << "side stream " << side;
      else
        EXPECT_EQ(cuda::gemm_latent_launches(), fused_before) << at << ", side stream " << side;
    }
    EXPECT_EQ(runs[0], runs[1]) << "before, side stream " << side;
    EXPECT_EQ(runs[0], runs[2]) << "after, side stream " << side;
    EXPECT_EQ(runs[0], runs[3]) << "fused, side stream " << side;
  }
}

// A model switch read when the model is made (the environment variable `var`, restored after):
// off and on give the same logits in a prefill and in eager and graph-replayed decode steps (8
// rows and one), and the launches `count` counts ran only with it on.
void model_switch_gives_the_same_bits(const Checkpoint& ck, const char* var, int64_t (*count)(),
                                      const char* off = "0", const char* on = "1") {
  const int64_t V = ck.config().vocab_size;
  const auto rows = prompts(V);
  ScopedEnv restore{{var, std::getenv(var)}};
  std::vector<std::vector<float>> runs;
  for (const char* value : {off, on}) {
    setenv(var, value, 1);
    const int64_t before = count();
    auto m = cuda::make_cuda_model(ck, {.compute = Compute::BF16});
    std::vector<float> r = prefill_and_greedy_steps(*m, rows, V);
    const std::vector<float> one = one_row_greedy_steps(*m, rows[0], V);
    r.insert(r.end(), one.begin(), one.end());
    runs.push_back(std::move(r));
    if (value == on)
      EXPECT_GT(count(), before) << var << "=" << on << " launched nothing of its own";
    else
      EXPECT_EQ(count(), before) << var << "=" << off << " still launched its kernels";
  }
  EXPECT_EQ(runs[0], runs[1]) << var;
}


// The MLA split merge inside the value GEMM's launch (ATLAS_MLA_MERGE_VALUE=1, read when the
// model is made; session 32, off by default): the same bits in a prefill and in eager and
// graph-replayed decode steps (8 rows and one), and the merged launch ran. The pair merge is
// pinned off: where it runs (every step here, at most 512 slots) no merge is left to move.
TEST_F(CudaTiny, MergeInsideTheValueGemmGivesTheSameBits) {
  ScopedEnv pin{{"ATLAS_MLA_PAIR_MERGE", "0"}};
  model_switch_gives_the_same_bits(*ck_, "ATLAS_MLA_MERGE_VALUE", cuda::mla_merge_value_launches);
}

// Stream priorities (CudaModelOptions::stream_priority: the main stream high, the side stream
// low) on (the default) or off: the same bits in a prefill and in eager and graph-replayed decode
// steps (the graph keeps its nodes' priorities).
TEST_F(CudaTiny, StreamPriorityGivesTheSameBits) {
  const int64_t V = ck_->config().vocab_size;
  const auto rows = prompts(V);
  std::vector<std::vector<float>> runs;
  for (bool prio : {true, false}) {
    auto m = cuda::make_cuda_model(*ck_, {.compute = Compute::BF16, .stream_priority = prio});
    runs.push_back(prefill_and_greedy_steps(*m, rows, V));
  }
  EXPECT_EQ(runs[0], runs[1]);
}

// The shared experts' down launched at the greatest priority (ATLAS_SHARED_DOWN_FIRST, read when
// the model is made; session 34, on by default where M * top_k <= 16): the same bits off and on
// in a prefill and in eager and graph-replayed decode steps (8 rows and one), and urgent
// launches ran only with it on (the one-row steps).
TEST_F(CudaTiny, SharedDownFirstGivesTheSameBits) {
  model_switch_gives_the_same_bits(*ck_, "ATLAS_SHARED_DOWN_FIRST", cuda::urgent_launches);
}

// The shared experts' down launched without launch overlap (ATLAS_SHARED_DOWN_WAIT, read when
// the model is made; session 38, off by default, where M * top_k <= 16): the same bits off and on
// in a prefill and in eager and graph-replayed decode steps (8 rows and one), and the scope turned
// overlap off only with it on (the one-row decode steps, where overlap is on).
TEST_F(CudaTiny, SharedDownWaitGivesTheSameBits) {
  ScopedEnv pin{{"ATLAS_MOE_DOWN_EARLY", "0"}};  // (its gate|up's plain launches would count here)
  model_switch_gives_the_same_bits(*ck_, "ATLAS_SHARED_DOWN_WAIT", cuda::plain_launches);
}

// The routed gate|up waiting first and the routed down staging its first weight steps before its
// wait (ATLAS_MOE_DOWN_EARLY, read when the model is made; session 44, off by default, where
// M * top_k <= 16 and the gate|up does not route itself): the same bits off and on in a prefill
// and in eager and graph-replayed decode steps (8 rows and one), and the early instance ran only
// with it on. (The tiny model's down is one 32-wide step, so its tiles take the plain loop after
// the early table lookup; Gemm.EarlyDownWeightsGiveTheSameBits runs the early steps themselves.)
TEST_F(CudaTiny, DownEarlyGivesTheSameBits) {
  model_switch_gives_the_same_bits(*ck_, "ATLAS_MOE_DOWN_EARLY", cuda::grouped_early_weight_launches);
}

// ATLAS_ROUTER_NORM off for a scope (the GEMM settings read the environment once; where it runs,
// the routing is its own launch and the route tails give way: gpu_full_run.sh's MODEL_TEST_ENVS
// runs the model tests under it).
struct RouterNormOff {
  RouterNormOff() { cuda::gemm_set_router_norm(0); }
  ~RouterNormOff() { cuda::gemm_set_router_norm(-1); }
  RouterNormOff(const RouterNormOff&) = delete;
  RouterNormOff& operator=(const RouterNormOff&) = delete;
};

// The staged split-K config's index (-1 where there is none): the config the GEMM tails and the
// router's add + norm belong to, forced onto every GEMM of the tiny model by the tests below.
int staged_splitk_config() {
  for (int c = 0; c < cuda::gemm_config_count(); ++c)
    if (cuda::gemm_config_name(c) == "splitk16x8/8w+staged") return c;
  return -1;
}

// A GEMM tail's switch (set: 1 on, 0 off, -1 as its variable says) gives the same logits on a
// one-row prefill and greedy batch-1 steps with every GEMM on the staged split-K config the
// tails belong to (the tiny model's GEMMs would take others), and the tailed launches (count)
// ran only with it on.
void tails_give_the_same_bits(const Checkpoint& ck, void (*set)(int), int64_t (*count)(), const char* what) {
  const int64_t V = ck.config().vocab_size;
  const auto rows = prompts(V);
  const int staged = staged_splitk_config();
  ASSERT_GE(staged, 0);
  cuda::gemm_force_config(staged);
  std::vector<std::vector<float>> runs;
  for (int on : {0, 1}) {
    set(on);
    const int64_t before = count();
    auto m = cuda::make_cuda_model(ck, {.compute = Compute::BF16});
    runs.push_back(one_row_greedy_steps(*m, rows[0], V));
    if (on == 1)
      EXPECT_GT(count(), before) << "no " << what << " launch ran";
    else
      EXPECT_EQ(count(), before) << "a " << what << " launch ran with the switch off";
  }
  set(-1);
  cuda::gemm_force_config(-1);
  EXPECT_EQ(runs[0], runs[1]);
}

// o_proj's launch adding and norming in its last block (cuda::gemm_add_rmsnorm, session 23) gives
// the bits of the two launches: a one-row prefill and eager and graph-replayed batch-1 steps with
// the tails on and off. The tiny model's GEMMs would take other configs, so every GEMM is forced
// onto the staged split-K config the tail belongs to; the tailed launches are counted.
TEST_F(CudaTiny, GemmTailsGiveTheSameBits) {
  tails_give_the_same_bits(*ck_, cuda::gemm_set_tails, cuda::gemm_tailed_launches, "tailed");
}

// The router's launch routing too (gemm_moe_route, session 33, ATLAS_ROUTE_TAIL): with every GEMM
// on the staged split-K config (what a full-size router gets at one row), a one-row prefill and
// greedy steps give the same logits with the tail on and off, and the tail ran.
TEST_F(CudaTiny, RouteTailGivesTheSameBits) {
  const RouterNormOff off;
  tails_give_the_same_bits(*ck_, cuda::gemm_set_route_tail, cuda::gemm_route_tail_launches, "routed");
}

// The router GEMM on the cluster config routing in its adding block (gemm_moe_route's mode 2,
// session 41, ATLAS_ROUTE_CLUSTER): the same logits in a one-row prefill and greedy steps with it
// on and off, and it ran (its kernel does not depend on the forced split-K config).
TEST_F(CudaTiny, RouteClusterGivesTheSameBits) {
  const RouterNormOff off;
  tails_give_the_same_bits(
      *ck_, [](int on) { cuda::gemm_set_route_tail(on > 0 ? 2 : on); }, cuda::gemm_route_cluster_launches,
      "cluster-routed");
}

// A batch-1 step's MoE combine + norm inside the next layer's q|kv_a launch (gemm_combine_norm,
// session 42, ATLAS_COMBINE_QKV; the tiny preset: hidden 64, one block per cluster, k = 3 on the
// run-time k path): the same logits in a one-row prefill and eager and graph-replayed greedy
// steps with it on and off, and it ran (the residual then ping-pongs between x and x_alt).
TEST_F(CudaTiny, CombineInsideQkvGivesTheSameBits) {
  tails_give_the_same_bits(*ck_, cuda::gemm_set_combine_norm, cuda::gemm_combine_norm_launches, "combine-in-q|kv_a");
}
// ... and in its flagged form (ATLAS_COMBINE_QKV=flag): the side stream not joined before that
// launch, which polls the layer's flag raised after the shared experts instead.
TEST_F(CudaTiny, FlaggedCombineInsideQkvGivesTheSameBits) {
  tails_give_the_same_bits(
      *ck_, [](int on) { cuda::gemm_set_combine_norm(on > 0 ? 2 : on); }, cuda::gemm_combine_flagged_launches,
      "flagged combine-in-q|kv_a");
}
// ... and in its event form (ATLAS_COMBINE_QKV=event): the shared experts' down records a
// programmatic event that the fused launch's stream waits on (no join, no flag) in the eager
// one-row prefill; in the graph-captured steps that wait is a programmatic graph edge, and ran.
TEST_F(CudaTiny, EventCombineInsideQkvGivesTheSameBits) {
  const int64_t edges = cuda::programmatic_capture_edges();
  tails_give_the_same_bits(
      *ck_, [](int on) { cuda::gemm_set_combine_norm(on > 0 ? 3 : on); }, cuda::gemm_combine_early_launches,
      "event combine-in-q|kv_a");
  EXPECT_GT(cuda::programmatic_capture_edges(), edges) << "no captured step waited through a programmatic edge";
}

// ... with the token's routed rows loaded directly beside their slots (ATLAS_COMBINE_DIRECT,
// session 46) in the default (event) form: the same logits on and off, and it ran.
TEST_F(CudaTiny, DirectRowsCombineInsideQkvGivesTheSameBits) {
  cuda::gemm_set_combine_norm(3);  // (whatever ATLAS_COMBINE_QKV says)
  tails_give_the_same_bits(*ck_, cuda::gemm_set_combine_direct, cuda::gemm_combine_direct_launches,
                           "combine-in-q|kv_a with its rows loaded directly");
  cuda::gemm_set_combine_norm(-1);
}

// The combine's deferral into q|kv_a in the fast mode (session 43): where the one-row steps'
// GEMMs are the batch-invariant kernels (ATLAS_FAST_SMALL_M=1, the default) it runs as in the
// invariant mode; where they are cuBLASLt's (=0) nothing is deferred (the event form's captured
// wait needs the shared experts' down to be one of the batch-invariant launches). Either way the
// joined and the event forms give the bits of neither, eager and graph-replayed.
TEST_F(CudaTiny, FastModeStepsGiveTheSameBitsUnderEveryCombineForm) {
  const int64_t V = ck_->config().vocab_size;
  const auto rows = prompts(V);
  ScopedEnv restore{{"ATLAS_FAST_SMALL_M", std::getenv("ATLAS_FAST_SMALL_M")}};
  for (const std::string small : {"1", "0"}) {
    SCOPED_TRACE("ATLAS_FAST_SMALL_M=" + small);
    setenv("ATLAS_FAST_SMALL_M", small.c_str(), 1);
    std::vector<std::vector<float>> runs;
    for (int mode : {0, 1, 3}) {
      cuda::gemm_set_combine_norm(mode);
      const int64_t before = cuda::gemm_combine_norm_launches();
      auto m = cuda::make_cuda_model(*ck_, {.compute = Compute::BF16, .batch_invariant = false});
      runs.push_back(one_row_greedy_steps(*m, rows[0], V));
      if (mode > 0 && small == "1")
        EXPECT_GT(cuda::gemm_combine_norm_launches(), before) << "mode " << mode << ": nothing deferred";
      else
        EXPECT_EQ(cuda::gemm_combine_norm_launches(), before) << "mode " << mode << ": deferred";
    }
    cuda::gemm_set_combine_norm(-1);
    EXPECT_EQ(runs[0], runs[1]) << "joined";
    EXPECT_EQ(runs[0], runs[2]) << "event";
  }
}

// A batch-1 step's post-attention add + norm inside the router's launch (gemm_after_add_rmsnorm,
// session 43, ATLAS_ROUTER_NORM; with every GEMM on the staged split-K config the router takes at
// one row in V2-Lite): the same logits in a one-row prefill and eager and graph-replayed greedy
// steps with it on and off, and it ran (the residual then ping-pongs between x and x_alt), with
// the shared experts forked from the launch programmatically (1: in the captured steps through
// programmatic graph edges, counted) and after its end ("joined", 2), and with 1 beside the
// combine inside q|kv_a (event form).
TEST_F(CudaTiny, RouterNormGivesTheSameBits) {
  const int64_t edges = cuda::programmatic_capture_edges();
  tails_give_the_same_bits(*ck_, cuda::gemm_set_router_norm, cuda::gemm_router_norm_launches, "router add + norm");
  EXPECT_GT(cuda::programmatic_capture_edges(), edges) << "no captured step forked the shared experts programmatically";
  tails_give_the_same_bits(
      *ck_, [](int on) { cuda::gemm_set_router_norm(on > 0 ? 2 : on); }, cuda::gemm_router_norm_launches,
      "router add + norm, joined fork");
  cuda::gemm_set_combine_norm(3);
  tails_give_the_same_bits(*ck_, cuda::gemm_set_router_norm, cuda::gemm_router_norm_launches,
                           "router add + norm beside the combine in q|kv_a");
  cuda::gemm_set_combine_norm(-1);
}

// The shared experts forked from o_proj with the side stream's own add + norm (ATLAS_SHARED_FORK=
// o_proj, read when the model is made; session 46, off by default) against the fork after the
// model's stream's norm: the same bits in a prefill and in eager and graph-replayed decode steps
// (8 rows and one: it runs at one row only), with the MoE combine after the join, inside q|kv_a
// by event (the default) and by flag, and beside the router's add + norm; the side stream's
// norms (their sums dropped) ran only with it on.
TEST_F(CudaTiny, SharedForkAfterOprojGivesTheSameBits) {
  ASSERT_GT(ck_->config().n_shared_experts, 0) << "the tiny model has no shared experts to fork";
  const RouterNormOff off;  // (where the router's launch adds and norms, this fork gives way)
  ScopedEnv pin{{"ATLAS_SIDE_STREAM", "1"}};
  for (const int combine : {-1, 0, 2}) {
    SCOPED_TRACE(::testing::Message() << "combine in q|kv_a mode " << combine);
    cuda::gemm_set_combine_norm(combine);
    model_switch_gives_the_same_bits(*ck_, "ATLAS_SHARED_FORK", cuda::add_rmsnorm_dropped_sum_launches, "norm",
                                     "o_proj");
  }
  cuda::gemm_set_combine_norm(-1);
  // ... and beside the router's own add + norm (ATLAS_ROUTER_NORM=1, which then forks nothing:
  // every GEMM on the staged split-K config, where that launch runs), which ran.
  const int staged = staged_splitk_config();
  ASSERT_GE(staged, 0);
  cuda::gemm_force_config(staged);
  cuda::gemm_set_router_norm(1);
  const int64_t routed_norms = cuda::gemm_router_norm_launches();
  model_switch_gives_the_same_bits(*ck_, "ATLAS_SHARED_FORK", cuda::add_rmsnorm_dropped_sum_launches, "norm", "o_proj");
  EXPECT_GT(cuda::gemm_router_norm_launches(), routed_norms) << "the router's add + norm did not run";
  cuda::gemm_force_config(-1);
}

// Padding computed once (CudaModelOptions::pad_dedup, the default) against every padding token
// computed: the same bits in every hook a trace reads (each stage as readers see it, and its
// per-token digests), in the logits and in the decode steps that follow (the cache holds the
// same values), for left padding (the bench's and probe's layout: every padding token alike)
// and right padding with two padding ids (a padding token after real ones attends to its row:
// one computed row per row and id). And padding did run once: fewer rows computed.
TEST_F(CudaTiny, PaddingComputedOnceGivesTheSameBits) {
  const int64_t V = ck_->config().vocab_size, L = ck_->config().num_hidden_layers;
  const auto rows = prompts(V);
  auto once = cuda::make_cuda_model(*ck_, {.compute = Compute::BF16});
  auto every = cuda::make_cuda_model(*ck_, {.compute = Compute::BF16, .pad_dedup = false});
  std::vector<std::string> names = {"embed", "final_norm"};
  for (int64_t l = 0; l < L; ++l) {
    const LayerHookNames n(l);  // every per-layer hook but the attention pattern (it turns this off)
    for (const std::string* s : {&n.ln1, &n.q, &n.latent, &n.latent_norm, &n.attn_out, &n.resid_mid, &n.ln2,
                                 &n.mlp_out, &n.resid_post})
      names.push_back(*s);
    if (ck_->config().is_moe_layer(l))  // (a dense layer has no router, routes or expert outputs)
      for (const std::string* s : {&n.router_logits, &n.topk_ids, &n.topk_weights, &n.shared_out, &n.routed_out})
        names.push_back(*s);
  }
  // Left padding (PaddedBatch) and right padding: real tokens first, then padding ids 0 / 1 at
  // position 0.
  const PaddedBatch left(rows);
  ForwardInput right_in = left.input();
  std::vector<int32_t> rids, rpos;
  std::vector<uint8_t> rmask;
  for (const auto& r : rows)
    for (int64_t t = 0; t < left.T; ++t) {
      const bool real = t < int64_t(r.size());
      rids.push_back(real ? r[size_t(t)] : int32_t(t % 2));
      rpos.push_back(real ? int32_t(t) : 0);
      rmask.push_back(real ? 1 : 0);
    }
  right_in.ids = rids;
  right_in.positions = rpos;
  right_in.mask = rmask;
  for (const bool right : {false, true}) {
    SCOPED_TRACE(right ? "right padding" : "left padding");
    const ForwardInput in = right ? right_in : left.input();
    for (const bool digests : {false, true}) {
      SCOPED_TRACE(digests ? "digest observers" : "readers");
      std::vector<std::map<std::string, std::vector<uint8_t>>> seen(2);
      std::vector<std::vector<float>> logits(2);
      for (int which = 0; which < 2; ++which) {
        const Model& m = which == 0 ? *once : *every;
        Hooks hooks;
        auto& rec = seen[size_t(which)];
        for (const auto& name : names) {
          // Digests are defined for F32 hooks only: the I32 route ids are read in both passes.
          if (digests && name.find("topk_ids") == std::string::npos)
            hooks.add_digests(name, [&rec](const HookDigests& d) {
              rec[std::string(d.name)].assign(d.sha256, d.sha256 + d.rows * d.tokens * 32);
            });
          else
            hooks.add_reader(name, [&rec](const HookTensor& t) {
              const auto* p = static_cast<const uint8_t*>(t.data);
              rec[std::string(t.name)].assign(p, p + t.numel() * 4);
            });
        }
        auto cache = m.make_cache(left.B, left.T + 4);
        logits[size_t(which)] = m.forward(in, *cache, &hooks).logits;
        const int64_t computed = cuda::computed_rows(m);
        if (which == 1) {
          EXPECT_EQ(computed, left.B * left.T) << "every padding token computed";
        } else {
          EXPECT_LT(computed, left.B * left.T) << "padding computed once";
        }
        // The cache holds the same: a decode step from it gives the same logits.
        std::vector<int32_t> ids(size_t(left.B), 7), pos(size_t(left.B));
        for (int64_t b = 0; b < left.B; ++b) pos[size_t(b)] = int32_t(right ? left.T : int64_t(rows[size_t(b)].size()));
        const auto lg = step(m, *cache, ids, pos);
        logits[size_t(which)].insert(logits[size_t(which)].end(), lg.begin(), lg.end());
      }
      ASSERT_EQ(seen[0].size(), names.size()) << "every hook observed";
      ASSERT_EQ(seen[1].size(), names.size()) << "every hook observed";
      for (const auto& [name, bytes] : seen[1]) EXPECT_TRUE(seen[0].at(name) == bytes) << name;
      EXPECT_EQ(logits[0], logits[1]);
    }
  }
  // Without hooks (the chunked and unchunked prefill and the graph-replayed steps after it).
  EXPECT_EQ(prefill_and_greedy_steps(*once, rows, V), prefill_and_greedy_steps(*every, rows, V));
}

// Decode steps replayed from the cache's CUDA graph (T = 1, no hooks) give the same logits and
// greedy tokens as the same steps run op by op (graphs off), and the device argmax equals the
// host argmax of the returned logits. Rows not asked for in logits_rows come back as zeros
// while their greedy token is still right.
TEST_F(CudaTiny, GraphDecodeEqualsEagerDecodeAndDeviceGreedyEqualsHost) {
  const int64_t V = ck_->config().vocab_size;
  const auto rows = prompts(V);
  auto eager_model = cuda::make_cuda_model(*ck_, {.compute = Compute::BF16, .graphs = false});
  const int steps = 5;
  std::vector<int32_t> next_pos(8);
  for (int r = 0; r < 8; ++r) next_pos[size_t(r)] = int32_t(rows[size_t(r)].size());
  auto cg = model_->make_cache(8, 310), ce = eager_model->make_cache(8, 310);
  std::vector<float> lg = prefill(*model_, *cg, rows), le = prefill(*eager_model, *ce, rows);
  ASSERT_EQ(lg, le);
  for (int s = 0; s < steps; ++s) {
    std::vector<int32_t> ids(8), pos(8);
    for (int r = 0; r < 8; ++r) {
      ids[size_t(r)] = argmax(lg.data() + r * V, V);
      pos[size_t(r)] = next_pos[size_t(r)]++;
    }
    std::vector<uint8_t> mask(8, 1);
    const ForwardInput in{.batch = 8, .tokens = 1, .ids = ids, .positions = pos, .mask = mask,
                          .logits_last_only = true};
    const ForwardOutput g = model_->forward(in, *cg);  // graph (all rows' logits)
    const ForwardOutput e = eager_model->forward(in, *ce);
    ASSERT_EQ(g.logits, e.logits) << "step " << s;
    ASSERT_EQ(g.greedy, e.greedy) << "step " << s;
    for (int r = 0; r < 8; ++r) EXPECT_EQ(g.greedy[size_t(r)], argmax(g.logits.data() + r * V, V)) << r;
    lg = g.logits;
  }
  // logits_rows: a fresh cache, the same prefill, one decode step asking for row 3 only.
  auto cp = model_->make_cache(8, 310);
  const auto lp = prefill(*model_, *cp, rows);
  std::vector<int32_t> ids(8), pos(8);
  for (int r = 0; r < 8; ++r) {
    ids[size_t(r)] = argmax(lp.data() + r * V, V);
    pos[size_t(r)] = int32_t(rows[size_t(r)].size());
  }
  std::vector<uint8_t> mask(8, 1), want(8, 0);
  want[3] = 1;
  auto cfull = model_->make_cache(8, 310);
  prefill(*model_, *cfull, rows);
  const ForwardOutput full = model_->forward(
      {.batch = 8, .tokens = 1, .ids = ids, .positions = pos, .mask = mask, .logits_last_only = true}, *cfull);
  const ForwardOutput one = model_->forward({.batch = 8, .tokens = 1, .ids = ids, .positions = pos, .mask = mask,
                                             .logits_last_only = true, .logits_rows = want},
                                            *cp);
  ASSERT_EQ(one.logits.size(), full.logits.size());
  for (int r = 0; r < 8; ++r) {
    const std::vector<float> a(one.logits.begin() + r * V, one.logits.begin() + (r + 1) * V);
    const std::vector<float> b(full.logits.begin() + r * V, full.logits.begin() + (r + 1) * V);
    if (r == 3) EXPECT_EQ(a, b);
    else EXPECT_EQ(a, std::vector<float>(size_t(V), 0.0f)) << r;
  }
  EXPECT_EQ(one.greedy, full.greedy);
}

// Decode graphs by attention bound (session 70): on a cache of more than two splits (600 slots),
// steps whose rows are all at most 512 long replay a graph captured with the bound 512 (the MLA
// split merge inside the attention launch, no merge launch), longer ones the capacity's graph. A
// run crossing 512 (rows of 497 and 480 prompt tokens, 30 steps) gives the tokens of one eager
// forward() per step, as do forward()'s own step graphs and the run with ATLAS_MLA_PAIR_MERGE=0's
// model (one graph, the merge launch).
TEST_F(CudaTiny, DecodeGraphsAcrossThePairBound) {
  const int64_t V = ck_->config().vocab_size, B = 2, S = 30;
  std::vector<std::vector<int32_t>> rows(2);
  for (int r = 0; r < 2; ++r)
    for (int t = 0; t < (r == 0 ? 497 : 480); ++t) rows[size_t(r)].push_back(int32_t((r * 131 + t * 7919 + 5) % V));
  auto eager_model = cuda::make_cuda_model(*ck_, {.compute = Compute::BF16, .graphs = false});
  auto ce = eager_model->make_cache(B, 600);
  const std::vector<float> le = prefill(*eager_model, *ce, rows);
  std::vector<int32_t> first(static_cast<size_t>(B)), fed, expected, positions;
  for (int64_t r = 0; r < B; ++r) first[size_t(r)] = argmax(le.data() + r * V, V);
  fed = first;
  for (int64_t j = 0; j < S; ++j) {
    std::vector<int32_t> pos(static_cast<size_t>(B));
    for (int64_t r = 0; r < B; ++r) pos[size_t(r)] = int32_t(rows[size_t(r)].size() + size_t(j));
    positions.insert(positions.end(), pos.begin(), pos.end());
    const std::vector<uint8_t> mask(size_t(B), 1), none(size_t(B), 0);
    fed = eager_model->forward({.batch = B, .tokens = 1, .ids = fed, .positions = pos, .mask = mask,
                                .logits_last_only = true, .logits_rows = none, .attention = AttentionForm::Absorbed},
                               *ce).greedy;
    expected.insert(expected.end(), fed.begin(), fed.end());
  }
  ASSERT_EQ(ce->length(), 497 + S);
  const auto run = [&](const Model& m) {
    auto c = m.make_cache(B, 600);
    EXPECT_EQ(prefill(m, *c, rows), le);
    return m.decode_chain({.batch = B, .steps = S, .first_ids = first, .positions = positions}, *c);
  };
  EXPECT_EQ(run(*model_), expected) << "a decode run (graphs of both bounds)";
  {
    ScopedEnv off{{"ATLAS_MLA_PAIR_MERGE", "0"}};
    auto plain = cuda::make_cuda_model(*ck_, {.compute = Compute::BF16});
    EXPECT_EQ(run(*plain), expected) << "ATLAS_MLA_PAIR_MERGE=0";
  }
  // forward()'s step graph per call (T = 1), across the bound too.
  auto cf = model_->make_cache(B, 600);
  prefill(*model_, *cf, rows);
  std::vector<int32_t> ids = first, got;
  for (int64_t j = 0; j < S; ++j) {
    const std::vector<int32_t> pos(positions.begin() + j * B, positions.begin() + (j + 1) * B);
    const std::vector<uint8_t> mask(size_t(B), 1), none(size_t(B), 0);
    ids = model_->forward({.batch = B, .tokens = 1, .ids = ids, .positions = pos, .mask = mask,
                           .logits_last_only = true, .logits_rows = none, .attention = AttentionForm::Absorbed},
                          *cf).greedy;
    got.insert(got.end(), ids.begin(), ids.end());
  }
  EXPECT_EQ(got, expected) << "forward() per step";
}

// A decode run on the CUDA backend (one step graph replayed per push, each row fed its previous
// token on the device, tokens back through the pinned ring) gives the tokens of one forward()
// call per step on an eager model, with greedy and device-sampled rows; the cache it leaves gives
// the same next step's logits. decode_chain of 70 steps (64 pushed, then the ring's slots reused)
// and then 3 (a second run, the graph captured once); the cache's first decode step runs eagerly
// inside the first. Then two runs on two caches of one model, pushed and popped interleaved
// (each cache feeds its own tokens), one step ahead as generate() runs them.
TEST_F(CudaTiny, DecodeRunGivesTheBitsOfOneForwardPerStep) {
  const int64_t V = ck_->config().vocab_size, B = 8;
  const auto rows = prompts(V);
  auto eager_model = cuda::make_cuda_model(*ck_, {.compute = Compute::BF16, .graphs = false});
  for (bool sampled : {false, true}) {
    SCOPED_TRACE(sampled ? "rows 1, 4 and 6 sampled on the device" : "greedy");
    auto cc = model_->make_cache(B, 400), ce = eager_model->make_cache(B, 400);
    const std::vector<float> lc = prefill(*model_, *cc, rows), le = prefill(*eager_model, *ce, rows);
    ASSERT_EQ(lc, le);
    std::vector<int32_t> first(static_cast<size_t>(B)), next_pos(static_cast<size_t>(B));
    for (int64_t r = 0; r < B; ++r) {
      first[size_t(r)] = argmax(lc.data() + r * V, V);
      next_pos[size_t(r)] = int32_t(rows[size_t(r)].size());
    }
    // The eager reference: forward() per step, each fed the step before's tokens.
    std::vector<int32_t> fed = first, expected;
    std::vector<int32_t> positions;
    std::vector<sample_core::RowParams> params;
    for (int64_t j = 0; j < 73; ++j) {
      std::vector<int32_t> pos(static_cast<size_t>(B));
      std::vector<sample_core::RowParams> sp(static_cast<size_t>(B));
      for (int64_t r = 0; r < B; ++r) {
        pos[size_t(r)] = next_pos[size_t(r)] + int32_t(j);
        if (sampled && (r == 1 || r == 4 || r == 6))
          sp[size_t(r)] = sample_core::make_row_params(0.8, r == 4 ? 0.9 : 1.0, r == 6 ? 7 : 0,
                                                       double((j * 37 + r * 11) % 100) / 100.0);
      }
      positions.insert(positions.end(), pos.begin(), pos.end());
      if (sampled) params.insert(params.end(), sp.begin(), sp.end());
      const std::vector<uint8_t> mask(size_t(B), 1), none(size_t(B), 0);
      const ForwardOutput o = eager_model->forward({.batch = B, .tokens = 1, .ids = fed, .positions = pos, .mask = mask,
                                                    .logits_last_only = true, .logits_rows = none,
                                                    .attention = AttentionForm::Absorbed,
                                                    .sampling = sampled ? std::span<const sample_core::RowParams>(sp)
                                                                        : std::span<const sample_core::RowParams>()},
                                                   *ce);
      fed = o.greedy;
      expected.insert(expected.end(), fed.begin(), fed.end());
    }
    const auto part = [&](auto& v, int64_t j0, int64_t n) {
      return v.empty() ? std::span(v.data(), 0) : std::span(v.data() + j0 * B, size_t(n * B));
    };
    const std::vector<int32_t> a = model_->decode_chain(
        {.batch = B, .steps = 70, .first_ids = first, .positions = part(positions, 0, 70), .sampling = part(params, 0, 70)},
        *cc);
    ASSERT_EQ(a, std::vector<int32_t>(expected.begin(), expected.begin() + 70 * B));
    const std::vector<int32_t> last(a.end() - B, a.end());
    const std::vector<int32_t> b = model_->decode_chain(
        {.batch = B, .steps = 3, .first_ids = last, .positions = part(positions, 70, 3), .sampling = part(params, 70, 3)},
        *cc);
    ASSERT_EQ(b, std::vector<int32_t>(expected.begin() + 70 * B, expected.end()));
    EXPECT_EQ(cc->length(), ce->length());
    // The caches hold the same bits: the next step's logits agree.
    std::vector<int32_t> pos(static_cast<size_t>(B));
    for (int64_t r = 0; r < B; ++r) pos[size_t(r)] = next_pos[size_t(r)] + 73;
    const std::vector<int32_t> ids(expected.end() - B, expected.end());
    EXPECT_EQ(step(*model_, *cc, ids, pos, nullptr, AttentionForm::Absorbed),
              step(*eager_model, *ce, ids, pos, nullptr, AttentionForm::Absorbed));
    // Interleaved runs on two fresh caches, one step pushed ahead of the one popped.
    auto c1 = model_->make_cache(B, 400), c2 = model_->make_cache(B, 400);
    prefill(*model_, *c1, rows);
    prefill(*model_, *c2, rows);
    auto r1 = model_->start_decode(*c1, first), r2 = model_->start_decode(*c2, first);
    EXPECT_THROW(model_->start_decode(*c1, first), Error);  // one run per cache at a time
    EXPECT_THROW(step(*model_, *c1, first, next_pos), Error);  // and no forward() call beside it
    std::vector<int32_t> got1, got2;
    const int64_t n = 12;
    const auto push = [&](DecodeRun& r, int64_t j) {
      r.push(part(positions, j, 1), part(params, j, 1));
    };
    push(*r1, 0);
    push(*r2, 0);
    for (int64_t j = 0; j < n; ++j) {
      if (j + 1 < n) push(*r1, j + 1);
      const auto t1 = r1->pop();
      if (j + 1 < n) push(*r2, j + 1);
      const auto t2 = r2->pop();
      got1.insert(got1.end(), t1.begin(), t1.end());
      got2.insert(got2.end(), t2.begin(), t2.end());
    }
    const std::vector<int32_t> want(expected.begin(), expected.begin() + n * B);
    EXPECT_EQ(got1, want);
    EXPECT_EQ(got2, want);
    // Steps pushed and never popped: the run's end waits for them; the cache holds them.
    push(*r1, n);
    push(*r1, n + 1);
    r1.reset();
    EXPECT_EQ(c1->length(), c2->length() + 2);
  }
  // Bad input is refused before anything runs: a position past the model's context.
  auto c = model_->make_cache(1, 16);
  const std::vector<int32_t> one{3}, bad{int32_t(ck_->config().max_position_embeddings), 0};
  OneRow p({1, 2, 3});
  model_->forward(p.input(), *c);
  EXPECT_THROW(model_->forward({.batch = 1, .tokens = 1, .ids = one, .positions = std::span(bad).first(1),
                                .mask = std::vector<uint8_t>{1}, .logits_last_only = true},
                               *c),
               Error);
  try {
    model_->decode_chain({.batch = 1, .steps = 2, .first_ids = one, .positions = std::vector<int32_t>{3, int32_t(
                                                                                       ck_->config().max_position_embeddings)}},
                         *c);
    ADD_FAILURE() << "a position past the context was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("step 1"), std::string::npos) << e.what();
  }
  EXPECT_EQ(c->length(), 3);
}

namespace {
// One batch-1 cache's life: a prefill of `row`, 6 steps of a decode run (sampled: on the device),
// then 2 forward() steps; its tokens, the last step's logits, and the graphs captured during the
// prefill and in all.
struct CacheLife {
  std::vector<int32_t> tokens;
  std::vector<float> logits;
  int64_t prefill_captures = 0, captures = 0;
};
CacheLife cache_life(const Model& m, const std::vector<int32_t>& row, bool sampled) {
  const int64_t V = m.config().vocab_size;
  auto c = m.make_cache(1, 100);
  const int64_t before = cuda::graph_captures();
  const std::vector<float> lg = prefill(m, *c, {row});
  CacheLife out;
  out.prefill_captures = cuda::graph_captures() - before;
  const int32_t p0 = int32_t(row.size());
  std::vector<int32_t> positions;
  std::vector<sample_core::RowParams> params;
  for (int j = 0; j < 6; ++j) {
    positions.push_back(p0 + j);
    if (sampled) params.push_back(sample_core::make_row_params(0.8, 0.9, 7, double((j * 37) % 100) / 100.0));
  }
  out.tokens = m.decode_chain({.batch = 1, .steps = 6, .first_ids = std::vector<int32_t>{argmax(lg.data(), V)},
                               .positions = positions, .sampling = params},
                              *c);
  std::vector<float> l = step(m, *c, {out.tokens.back()}, {p0 + 6}, nullptr, AttentionForm::Absorbed);
  out.logits = step(m, *c, {argmax(l.data(), V)}, {p0 + 7}, nullptr, AttentionForm::Absorbed);
  out.captures = cuda::graph_captures() - before;
  return out;
}
}  // namespace

// A cache's store kept by the model when the cache ends (CudaModelOptions::cache_pool, session
// 62, off by default): the next cache of the same shape takes it back with its graphs, and its
// decode steps replay them from the first step (no eager step, no capture), a decode run's and
// forward()'s; a cache of another shape gets a new store (and captures). The tokens and logits
// are those of a model without the pool, for a second prompt of another length after the first,
// greedy and sampled on the device. ATLAS_CACHE_POOL overrides the option either way.
TEST_F(CudaTiny, CachePoolReplaysTheLastCachesGraphsWithTheSameBits) {
  const int64_t V = ck_->config().vocab_size;
  const auto rows = prompts(V);
  ScopedEnv unset{{"ATLAS_CACHE_POOL", nullptr}, {"ATLAS_EARLY_GRAPHS", nullptr}};
  // (Without early graphs, whose captures behind a prefill EarlyGraphsCaptureBehindThePrefill
  // WithTheSameBits counts.)
  auto pooled = cuda::make_cuda_model(*ck_, {.compute = Compute::BF16, .cache_pool = true, .early_graphs = false});
  auto plain = cuda::make_cuda_model(*ck_, {.compute = Compute::BF16, .early_graphs = false});  // (no pool)
  for (const bool sampled : {false, true}) {
    SCOPED_TRACE(sampled ? "sampled on the device" : "greedy");
    const CacheLife a1 = cache_life(*pooled, rows[1], sampled), b1 = cache_life(*plain, rows[1], sampled);
    EXPECT_EQ(a1.tokens, b1.tokens);
    EXPECT_EQ(a1.logits, b1.logits);
    EXPECT_EQ(b1.captures, 2) << "a new store captures the run's graph and forward()'s";
    EXPECT_EQ(a1.captures, sampled ? 1 : 2) << "(sampled: forward()'s graph came from the greedy pass's store)";
    // The second cache: another prompt (rows[4]: 12 tokens against 37), the same shape.
    const CacheLife a2 = cache_life(*pooled, rows[4], sampled), b2 = cache_life(*plain, rows[4], sampled);
    EXPECT_EQ(a2.tokens, b2.tokens);
    EXPECT_EQ(a2.logits, b2.logits);
    EXPECT_EQ(b2.captures, 2) << "without the pool every cache captures";
    EXPECT_EQ(a2.captures, 0) << "the pooled store's graphs were not replayed";
  }
  // Another shape: a new store, whose first steps capture; the same bits as without the pool.
  const auto eight = [&](const Model& m) {
    return std::pair{prefill_and_greedy_steps(m, rows, V), cuda::graph_captures()};
  };
  const int64_t before = cuda::graph_captures();
  const auto [pa, after] = eight(*pooled);
  EXPECT_GT(after, before) << "a cache of another shape took the pooled store";
  EXPECT_EQ(pa, eight(*plain).first);
  // ATLAS_CACHE_POOL (read when the model is made) overrides the option: 1 on, 0 off.
  setenv("ATLAS_CACHE_POOL", "1", 1);
  auto on = cuda::make_cuda_model(*ck_, {.compute = Compute::BF16, .early_graphs = false});
  (void)cache_life(*on, rows[1], false);
  EXPECT_EQ(cache_life(*on, rows[4], false).captures, 0) << "ATLAS_CACHE_POOL=1 kept no store";
  setenv("ATLAS_CACHE_POOL", "0", 1);
  auto off = cuda::make_cuda_model(*ck_, {.compute = Compute::BF16, .cache_pool = true, .early_graphs = false});
  (void)cache_life(*off, rows[1], false);
  EXPECT_EQ(cache_life(*off, rows[4], false).captures, 2) << "ATLAS_CACHE_POOL=0 kept the store";
}

// Early graphs (CudaModelOptions::early_graphs, session 63, on by default): once the model has
// run a decode step of a shape eagerly, a new cache's prefill captures the decode run's greedy
// step graph behind its own launches, and the run (whose first step is still eager) replays it
// from its second step without a capture of its own. The tokens and logits are those of a model
// without it, for a second prompt of another length after the first, greedy and sampled on the
// device; the first cache captures nothing during its prefill (no shape set up yet).
// ATLAS_EARLY_GRAPHS overrides the option either way.
TEST_F(CudaTiny, EarlyGraphsCaptureBehindThePrefillWithTheSameBits) {
  const int64_t V = ck_->config().vocab_size;
  const auto rows = prompts(V);
  ScopedEnv unset{{"ATLAS_EARLY_GRAPHS", nullptr}, {"ATLAS_CACHE_POOL", nullptr}};
  auto early = cuda::make_cuda_model(*ck_, {.compute = Compute::BF16});  // (the default: on)
  auto late = cuda::make_cuda_model(*ck_, {.compute = Compute::BF16, .early_graphs = false});
  {
    const CacheLife e1 = cache_life(*early, rows[1], false), l1 = cache_life(*late, rows[1], false);
    EXPECT_EQ(e1.tokens, l1.tokens);
    EXPECT_EQ(e1.logits, l1.logits);
    EXPECT_EQ(e1.prefill_captures, 0) << "no step of this shape had run: nothing to capture behind the prefill";
    EXPECT_EQ(l1.captures, 2) << "a store captures the run's graph and forward()'s";
    EXPECT_EQ(e1.captures, 2);
    // The second cache: another prompt (rows[4]: 12 tokens against 37), the same shape.
    const CacheLife e2 = cache_life(*early, rows[4], false), l2 = cache_life(*late, rows[4], false);
    EXPECT_EQ(e2.tokens, l2.tokens);
    EXPECT_EQ(e2.logits, l2.logits);
    EXPECT_EQ(e2.prefill_captures, 1) << "the run's greedy graph was not captured behind the prefill";
    EXPECT_EQ(l2.prefill_captures, 0);
    EXPECT_EQ(e2.captures, 2) << "the run captured its graph again (or forward()'s graph was not captured)";
    EXPECT_EQ(l2.captures, 2);
  }
  {
    SCOPED_TRACE("sampled on the device");
    // A sampled run: its prefill captures the greedy graph (that shape ran; unused here), its
    // run steps once eagerly and captures the sampled graph at its second step.
    // (rows[6]: 33 tokens; a one-token prompt's "prefill" would be a decode step of its own)
    const CacheLife e1 = cache_life(*early, rows[6], true), l1 = cache_life(*late, rows[6], true);
    EXPECT_EQ(e1.tokens, l1.tokens);
    EXPECT_EQ(e1.logits, l1.logits);
    EXPECT_EQ(e1.prefill_captures, 1);
    EXPECT_EQ(e1.captures, 3);
    const CacheLife e2 = cache_life(*early, rows[4], true), l2 = cache_life(*late, rows[4], true);
    EXPECT_EQ(e2.tokens, l2.tokens);
    EXPECT_EQ(e2.logits, l2.logits);
    EXPECT_EQ(l2.captures, 2);
    EXPECT_EQ(e2.prefill_captures, 1);
    EXPECT_EQ(e2.captures, 3) << "the greedy graph behind the prefill, the sampled one at the run's second step, forward()'s";
  }
  // Eight rows: their own shape; the same bits.
  EXPECT_EQ(prefill_and_greedy_steps(*early, rows, V), prefill_and_greedy_steps(*late, rows, V));
  EXPECT_EQ(prefill_and_greedy_steps(*early, rows, V), prefill_and_greedy_steps(*late, rows, V));
  // ATLAS_EARLY_GRAPHS (read when the model is made) overrides the option: 0 off, 1 on.
  setenv("ATLAS_EARLY_GRAPHS", "0", 1);
  auto off = cuda::make_cuda_model(*ck_, {.compute = Compute::BF16, .early_graphs = true});
  (void)cache_life(*off, rows[1], false);
  EXPECT_EQ(cache_life(*off, rows[4], false).prefill_captures, 0) << "ATLAS_EARLY_GRAPHS=0 captured behind the prefill";
  setenv("ATLAS_EARLY_GRAPHS", "1", 1);
  auto on = cuda::make_cuda_model(*ck_, {.compute = Compute::BF16, .early_graphs = false});
  (void)cache_life(*on, rows[1], false);
  EXPECT_EQ(cache_life(*on, rows[4], false).prefill_captures, 1) << "ATLAS_EARLY_GRAPHS=1 captured nothing behind the prefill";
}

// A decode graph holds the address of its GEMM launches' per-stream scratch (a sliced launch's
// slice sums: here the steps of 32 rows over K = 512, two 256-wide slices), which a later prefill
// of more rows on the same model frees to make a larger block (gemm_scratch_moves). The first
// cache's next decode run must then capture its graph again, not replay the one holding the
// freed address (session 64; before, it did): the captures are counted, and the tokens are those
// of a model on which nothing ran between the two runs. The tiny preset with 512-wide hidden
// states (its own 64 never makes two slices).
TEST_F(CudaModelTest, ADecodeGraphIsCapturedAgainAfterAGemmScratchMove) {
  ScopedEnv unset{{"ATLAS_CUDA_GRAPHS", nullptr}, {"ATLAS_EARLY_GRAPHS", nullptr}, {"ATLAS_CACHE_POOL", nullptr}};
  Preset wide = make_preset("tiny");
  wide.config["hidden_size"] = 512;
  const std::string dir = (fs::temp_directory_path() / ("atlas_cuda_wide_" + std::to_string(::getpid()))).string();
  fs::remove_all(dir);
  fs::create_directories(dir);
  write_model_files(dir, wide, {.seed = 5});
  struct Cleanup {
    std::string d;
    ~Cleanup() { fs::remove_all(d); }
  } cleanup{dir};
  const Checkpoint ck = Checkpoint::open(dir);
  const int64_t B = 32, V = ck.config().vocab_size;
  const auto rows_of = [&](int len, int salt) {
    std::vector<std::vector<int32_t>> rows(static_cast<size_t>(B));
    for (int64_t r = 0; r < B; ++r)
      for (int t = 0; t < len; ++t) rows[size_t(r)].push_back(int32_t((r * 7919 + t * 104729 + salt) % V));
    return rows;
  };
  const auto short_rows = rows_of(4, 13), long_rows = rows_of(16, 29);  // 128, then 512 rows
  // Two decode runs of 3 steps on one cache (the first steps once eagerly, captures at its
  // second step, replays at its third); `between` runs in between.
  const auto two_runs = [&](const Model& m, const std::function<void()>& between) {
    auto c = m.make_cache(B, 64);
    const std::vector<float> lg = prefill(m, *c, short_rows);
    std::vector<int32_t> first(static_cast<size_t>(B));
    for (int64_t r = 0; r < B; ++r) first[size_t(r)] = argmax(lg.data() + r * V, V);
    std::vector<int32_t> positions;
    for (int j = 0; j < 6; ++j)
      for (int64_t r = 0; r < B; ++r) positions.push_back(4 + j);
    const std::span<const int32_t> pos(positions);
    std::vector<int32_t> a = m.decode_chain({.batch = B, .steps = 3, .first_ids = first, .positions = pos.first(3 * B)}, *c);
    between();
    const std::vector<int32_t> next(a.end() - B, a.end());
    const std::vector<int32_t> b = m.decode_chain({.batch = B, .steps = 3, .first_ids = next, .positions = pos.subspan(3 * B)}, *c);
    a.insert(a.end(), b.begin(), b.end());
    return a;
  };
  auto plain = cuda::make_cuda_model(ck, {.compute = Compute::BF16, .early_graphs = false});
  const std::vector<int32_t> want = two_runs(*plain, [] {});
  auto m = cuda::make_cuda_model(ck, {.compute = Compute::BF16, .early_graphs = false});
  int64_t captures = 0;
  const std::vector<int32_t> got = two_runs(*m, [&] {
    const uint64_t moves = cuda::gemm_scratch_moves();
    auto other = m->make_cache(B, 64);
    (void)prefill(*m, *other, long_rows);
    ASSERT_GT(cuda::gemm_scratch_moves(), moves)
        << "the test's premise: a prefill of 512 rows moves the scratch a decode graph of 32 rows holds";
    captures = cuda::graph_captures();
  });
  EXPECT_EQ(cuda::graph_captures(), captures + 1) << "the second run replayed the graph captured before the move";
  EXPECT_EQ(got, want);
  cuda::check_device_errors();
}

// A decode run's step ends fused (ATLAS_RUN_FUSED, read when the model is made; sessions 47 and
// 49, on by default since session 50): at one row one launch after the step's inputs embeds and
// norms, and a greedy step's argmax writes the run's outputs. The tokens of the unfused run,
// greedy and with the row sampled on the device (there only the first end is fused: the sampler
// follows the argmax), over 70 steps (the ring's slots reused) and 3 more in a second run; the
// caches left give the same next step's logits; the fused launches ran only with it on, and at 8
// rows never. With
// ATLAS_RUN_ROOT=1 too (session 49) the graph's empty first launch ran, and the same tokens.
TEST_F(CudaTiny, FusedRunStepEndsGiveTheSameTokens) {
  const int64_t V = ck_->config().vocab_size;
  const auto rows = prompts(V);
  ScopedEnv restore{{"ATLAS_RUN_FUSED", std::getenv("ATLAS_RUN_FUSED")}, {"ATLAS_RUN_ROOT", std::getenv("ATLAS_RUN_ROOT")}};
  const int32_t p0 = int32_t(rows[1].size());
  for (const bool sampled : {false, true}) {
    SCOPED_TRACE(sampled ? "sampled on the device" : "greedy");
    std::vector<int32_t> positions;
    std::vector<sample_core::RowParams> params;
    for (int j = 0; j < 73; ++j) {
      positions.push_back(p0 + j);
      if (sampled) params.push_back(sample_core::make_row_params(0.8, 0.9, 7, double((j * 37) % 100) / 100.0));
    }
    const auto part = [](const auto& v, int64_t j0, int64_t n) {
      return v.empty() ? std::span(v.data(), 0) : std::span(v.data() + j0, size_t(n));
    };
    std::vector<std::vector<int32_t>> tokens;
    std::vector<std::vector<float>> next;
    // "1+root": with ATLAS_RUN_ROOT=1 too (session 49): an empty launch first, the same tokens.
    for (const std::string value : {"0", "1", "1+root"}) {
      const bool on = value[0] == '1', root = value == "1+root";
      setenv("ATLAS_RUN_FUSED", on ? "1" : "0", 1);
      setenv("ATLAS_RUN_ROOT", root ? "1" : "0", 1);
      auto m = cuda::make_cuda_model(*ck_, {.compute = Compute::BF16});
      auto c = m->make_cache(1, 400);
      const std::vector<float> lg = prefill(*m, *c, {rows[1]});
      const std::vector<int32_t> first{argmax(lg.data(), V)};
      const int64_t ins = cuda::embed_norm_launches(), outs = cuda::argmax_run_outputs_launches();
      const int64_t roots = cuda::graph_root_launches();
      std::vector<int32_t> got = m->decode_chain(
          {.batch = 1, .steps = 70, .first_ids = first, .positions = part(positions, 0, 70),
           .sampling = part(params, 0, 70)},
          *c);
      const std::vector<int32_t> last{got.back()};
      const std::vector<int32_t> more = m->decode_chain(
          {.batch = 1, .steps = 3, .first_ids = last, .positions = part(positions, 70, 3),
           .sampling = part(params, 70, 3)},
          *c);
      got.insert(got.end(), more.begin(), more.end());
      EXPECT_EQ(cuda::embed_norm_launches() > ins, on) << "ATLAS_RUN_FUSED=" << value;
      EXPECT_EQ(cuda::argmax_run_outputs_launches() > outs, on && !sampled) << "ATLAS_RUN_FUSED=" << value;
      EXPECT_EQ(cuda::graph_root_launches() > roots, root) << "ATLAS_RUN_FUSED=" << value;
      tokens.push_back(got);
      next.push_back(step(*m, *c, {got.back()}, {p0 + 73}, nullptr, AttentionForm::Absorbed));
      if (on) {  // 8 rows: the step graph as before
        auto c8 = m->make_cache(8, 400);
        const std::vector<float> l8 = prefill(*m, *c8, rows);
        std::vector<int32_t> f8, pos8;
        for (int64_t r = 0; r < 8; ++r) f8.push_back(argmax(l8.data() + r * V, V));
        for (int j = 0; j < 3; ++j)
          for (int64_t r = 0; r < 8; ++r) pos8.push_back(int32_t(rows[size_t(r)].size()) + j);
        const int64_t ins8 = cuda::embed_norm_launches(), outs8 = cuda::argmax_run_outputs_launches();
        (void)m->decode_chain({.batch = 8, .steps = 3, .first_ids = f8, .positions = pos8}, *c8);
        EXPECT_EQ(cuda::embed_norm_launches(), ins8) << "8 rows";
        EXPECT_EQ(cuda::argmax_run_outputs_launches(), outs8) << "8 rows";
      }
    }
    EXPECT_EQ(tokens[1], tokens[0]);
    EXPECT_EQ(next[1], next[0]);
    EXPECT_EQ(tokens[2], tokens[0]);
    EXPECT_EQ(next[2], next[0]);
  }
}

// The fast mode (cuBLASLt dense GEMMs) stays close to the invariant mode: same greedy tokens on
// the tiny preset's prefill for most rows, logits within the bf16 tolerance of the fixtures.
TEST_F(CudaTiny, FastModeIsCloseToInvariantMode) {
  const int64_t V = ck_->config().vocab_size;
  const auto rows = prompts(V);
  auto fast = load_model(*ck_, {.backend = "cuda", .compute = Compute::BF16, .batch_invariant = false});
  auto c1 = model_->make_cache(8, 310), c2 = fast->make_cache(8, 310);
  const auto a = prefill(*model_, *c1, rows), b = prefill(*fast, *c2, rows);
  double maxd = 0, maxa = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    maxd = std::max(maxd, std::abs(double(a[i]) - b[i]));
    maxa = std::max(maxa, std::abs(double(a[i])));
  }
  std::printf("fast vs invariant: max |diff| %.4g of max |logit| %.4g\n", maxd, maxa);
  EXPECT_LT(maxd, 0.12 * maxa);  // the CUDA-vs-CPU bf16 tolerance of the fixtures (see above)
}

// A prefill split into chunks of whole time steps (working memory bounded) gives the same bits
// as one call: logits, greedy tokens and the cache the decode steps read.
TEST_F(CudaTiny, ChunkedPrefillIsBitIdenticalToOneCall) {
  const int64_t V = ck_->config().vocab_size;
  const auto rows = prompts(V);
  auto chunked = cuda::make_cuda_model(*ck_, {.compute = Compute::BF16, .max_tokens_per_call = 8 * 37});
  auto c1 = model_->make_cache(8, 310), c2 = chunked->make_cache(8, 310);
  const auto a = prefill(*model_, *c1, rows), b = prefill(*chunked, *c2, rows);  // 300 tokens: 9 chunks of 37
  ASSERT_EQ(a, b);
  std::vector<int32_t> ids(8), pos(8);
  for (int r = 0; r < 8; ++r) {
    ids[size_t(r)] = argmax(a.data() + r * V, V);
    pos[size_t(r)] = int32_t(rows[size_t(r)].size());
  }
  EXPECT_EQ(step(*model_, *c1, ids, pos), step(*chunked, *c2, ids, pos));
}

// Digest observers on the CUDA backend. Forward 1 subscribes only digests: the device computes
// them (token_digests_bf16 / _f32) and copies 32 bytes per token. Forward 2 subscribes tensor
// observers too: the tensors come to the host, where Hooks::fire digests them. Both must give
// the same [B*T][32] bytes, equal to the host digests (OpenSSL) of the downloaded tensors, for
// bf16 hooks of rank 3 and 4 and the fp32 router hooks; the logits must not change.
TEST_F(CudaTiny, DeviceDigestsEqualTheDigestsOfTheDownloadedTensors) {
  const int64_t V = ck_->config().vocab_size, L = ck_->config().num_hidden_layers;
  const PaddedBatch batch(prompts(V));
  const ForwardInput in = batch.input();
  const int64_t Tp = batch.T;
  std::vector<std::string> names = {"embed", "final_norm", "blocks.1.attn.hook_q", "blocks.1.moe.hook_router_logits",
                                    "blocks.2.moe.hook_topk_weights", "blocks.3.moe.hook_routed_out"};
  for (int64_t l = 0; l < L; ++l) names.push_back(LayerHookNames(l).resid_post);
  using Bytes = std::vector<uint8_t>;
  std::map<std::string, Bytes> device, host, from_tensor;
  std::map<std::string, std::vector<int64_t>> bt;  // name -> {B, T} as the digest observers saw it
  Hooks digests_only, with_tensors;
  for (const auto& n : names) {
    digests_only.add_digests(n, [&, n](const HookDigests& d) {
      device[n].assign(d.sha256, d.sha256 + d.rows * d.tokens * 32);
      bt[n] = {d.rows, d.tokens};
    });
    with_tensors.add(n, [&, n](HookTensor& t) {
      const int64_t M = t.shape[0] * t.shape[1];
      from_tensor[n] = token_digests(t.f32(), M, t.numel() / M);
    });
    with_tensors.add_digests(n, [&, n](const HookDigests& d) { host[n].assign(d.sha256, d.sha256 + d.rows * d.tokens * 32); });
  }
  auto c1 = model_->make_cache(in.batch, Tp), c2 = model_->make_cache(in.batch, Tp);
  const ForwardOutput a = model_->forward(in, *c1, &digests_only);
  const ForwardOutput b = model_->forward(in, *c2, &with_tensors);
  EXPECT_EQ(a.logits, b.logits);
  EXPECT_EQ(a.greedy, b.greedy);
  for (const auto& n : names) {
    SCOPED_TRACE(n);
    ASSERT_TRUE(device.count(n) && host.count(n) && from_tensor.count(n)) << "an observer did not fire";
    EXPECT_EQ(bt[n], (std::vector<int64_t>{in.batch, Tp}));
    ASSERT_EQ(device[n].size(), size_t(in.batch * Tp * 32));
    EXPECT_EQ(host[n], from_tensor[n]) << "host path: Hooks::fire's digests differ from the tensor's";
    int64_t bad = 0, first = -1;
    for (int64_t m = 0; m < in.batch * Tp; ++m)
      if (std::memcmp(device[n].data() + m * 32, from_tensor[n].data() + m * 32, 32) != 0) {
        if (first < 0) first = m;
        ++bad;
      }
    EXPECT_EQ(bad, 0) << bad << " of " << in.batch * Tp << " device digests differ; first at row " << first / Tp
                      << " token " << first % Tp;
    std::printf("  %-32s %lld token digests, %lld differ between device and host\n", n.c_str(),
                (long long)(in.batch * Tp), (long long)bad);
  }
}

// Readers (copied out asynchronously and delivered late, model/hooks.h) see exactly what tensor
// observers see, in the same order, all before forward() returns; with half of the hooks
// read and half observed as tensors (each tensor observer first delivers every earlier
// reader) the log is the same again, and so are the digests and the logits.
TEST_F(CudaTiny, ReadersSeeWhatTensorObserversSeeInHookOrder) {
  const int64_t V = ck_->config().vocab_size, L = ck_->config().num_hidden_layers;
  const PaddedBatch batch(prompts(V));
  const ForwardInput in = batch.input();
  std::vector<std::string> names = {"embed", "final_norm"};
  for (int64_t l = 0; l < L; ++l) {
    const LayerHookNames n(l);
    for (const std::string* h : {&n.ln1, &n.q, &n.latent, &n.attn_out, &n.ln2, &n.mlp_out, &n.resid_post})
      names.push_back(*h);
    if (ck_->config().is_moe_layer(l))
      for (const std::string* h : {&n.router_logits, &n.topk_ids, &n.topk_weights, &n.routed_out, &n.shared_out})
        names.push_back(*h);
  }
  struct Seen {
    std::string name;
    std::vector<int64_t> shape;
    std::vector<uint8_t> bytes;
    bool operator==(const Seen&) const = default;
  };
  auto seen = [](const HookTensor& t) {
    const auto* p = static_cast<const uint8_t*>(t.data);
    return Seen{std::string(t.name), t.shape, std::vector<uint8_t>(p, p + t.numel() * 4)};
  };
  // mode 0: all tensor observers; 1: all readers; 2: alternating
  std::vector<std::vector<Seen>> logs(3);
  std::vector<std::map<std::string, std::vector<uint8_t>>> digests(3);
  std::vector<ForwardOutput> outs;
  for (int mode = 0; mode < 3; ++mode) {
    Hooks h;
    for (size_t i = 0; i < names.size(); ++i) {
      const std::string& n = names[i];
      if (mode == 0 || (mode == 2 && i % 2 == 0))
        h.add(n, [&, mode](HookTensor& t) { logs[size_t(mode)].push_back(seen(t)); });
      else
        h.add_reader(n, [&, mode](const HookTensor& t) { logs[size_t(mode)].push_back(seen(t)); });
      if (n.find("resid_post") != std::string::npos)
        h.add_digests(n, [&, mode, n](const HookDigests& d) {
          digests[size_t(mode)][n].assign(d.sha256, d.sha256 + d.rows * d.tokens * 32);
        });
    }
    auto cache = model_->make_cache(in.batch, batch.T);
    outs.push_back(model_->forward(in, *cache, &h));
    ASSERT_EQ(logs[size_t(mode)].size(), names.size()) << "mode " << mode << ": not every hook delivered";
  }
  for (int mode = 1; mode < 3; ++mode) {
    SCOPED_TRACE(::testing::Message() << "mode " << mode);
    for (size_t i = 0; i < names.size(); ++i)
      EXPECT_TRUE(logs[size_t(mode)][i] == logs[0][i]) << "entry " << i << ": " << logs[size_t(mode)][i].name
                                                        << " vs " << logs[0][i].name;
    EXPECT_EQ(digests[size_t(mode)], digests[0]);
    EXPECT_EQ(outs[size_t(mode)].logits, outs[0].logits);
  }
  EXPECT_EQ(digests[0].size(), size_t(L));
}

// ---- the f32 checking mode through the cache: prefill of mixed lengths, then decode steps ----
namespace {

// Every hook the CPU backend fires (all but the attention pattern, which the CUDA backend does
// not offer), captured under its own name; each forward call overwrites the previous capture.
Hooks capture_all(const ModelConfig& c, Captured& into, std::map<std::string, int>& fired) {
  Hooks hooks;
  auto keep = [&into, &fired](HookTensor& t) {
    ++fired[std::string(t.name)];
    if (t.dtype == DType::I32)
      into.i32[std::string(t.name)].assign(t.i32(), t.i32() + t.numel());
    else
      into.f32[std::string(t.name)].assign(t.f32(), t.f32() + t.numel());
  };
  std::vector<std::string> names = {"embed", "final_norm", "logits"};
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    const LayerHookNames n(l);
    for (const std::string* s : {&n.ln1, &n.q, &n.latent, &n.latent_norm, &n.attn_out, &n.resid_mid, &n.ln2,
                                 &n.router_logits, &n.topk_ids, &n.topk_weights, &n.shared_out, &n.routed_out,
                                 &n.mlp_out, &n.resid_post})
      names.push_back(*s);
  }
  for (const auto& n : names) hooks.add(n, keep);
  return hooks;
}

}  // namespace

// CUDA f32 vs CPU f32 (absorbed) on the tiny preset through the cache path: a left-padded
// prefill of 8 rows of 1 to 300 tokens, then 4 decode steps fed the CPU's greedy tokens; every
// hook the CPU fires also fires on CUDA (same names, same counts) and matches within 1e-5
// relative L2 over real tokens, routes identical. Then the same sequence without hooks (decode
// steps replayed from the CUDA graph) gives the same logits bit for bit, and rows 2 and 5 run
// alone give their batch rows' bits (the f32 kernels are batch invariant too).
TEST_F(CudaTiny, F32PrefillAndDecodeMatchCpuF32) {
  const ModelConfig& cfg = ck_->config();
  const int64_t V = cfg.vocab_size, B = 8;
  const auto rows = prompts(V);
  const int steps = 4;
  auto gpu = load_model(*ck_, {.backend = "cuda", .compute = Compute::F32});
  auto cpu = load_model(*ck_, {.backend = "cpu", .compute = Compute::F32});
  const PaddedBatch batch(rows);
  const int64_t Tp = batch.T;
  const std::vector<int32_t>& ids = batch.ids;
  const std::vector<int32_t>& pos = batch.pos;
  const std::vector<uint8_t>& mask = batch.mask;
  const std::vector<int32_t> mask32(mask.begin(), mask.end());
  auto cg = gpu->make_cache(B, Tp + steps), cc = cpu->make_cache(B, Tp + steps);
  Captured g, c;
  std::map<std::string, int> fired_g, fired_c;
  const Hooks hg = capture_all(cfg, g, fired_g), hc = capture_all(cfg, c, fired_c);
  std::vector<std::vector<float>> gpu_logits;  // per call [B, V]
  std::vector<std::vector<int32_t>> fed;       // per decode step [B]
  {
    const ForwardInput in{.batch = B, .tokens = Tp, .ids = ids, .positions = pos, .mask = mask,
                          .logits_last_only = true, .attention = AttentionForm::Absorbed};
    gpu_logits.push_back(gpu->forward(in, *cg, &hg).logits);
    cpu->forward(in, *cc, &hc);
    // The last-token logits are [B, 1, V]: compared on their own, every row real.
    Captured gl, cl;
    gl.f32["logits"] = g.f32.at("logits");
    cl.f32["logits"] = c.f32.at("logits");
    Captured gs = g, cs = c;
    gs.f32.erase("logits");
    cs.f32.erase("logits");
    expect_f32_equal("tiny prefill", gs, cs, mask32, B * Tp);
    expect_f32_equal("tiny prefill", gl, cl, std::vector<int32_t>(size_t(B), 1), B);
  }
  std::vector<int32_t> next(static_cast<size_t>(B));
  for (int r = 0; r < B; ++r) next[size_t(r)] = int32_t(rows[size_t(r)].size());
  for (int s = 0; s < steps; ++s) {
    std::vector<int32_t> tok(static_cast<size_t>(B)), p(static_cast<size_t>(B));
    for (int r = 0; r < B; ++r) {
      tok[size_t(r)] = argmax(c.f32.at("logits").data() + r * V, V);  // the CPU's greedy token
      p[size_t(r)] = next[size_t(r)]++;
    }
    fed.push_back(tok);
    const std::vector<uint8_t> m1(static_cast<size_t>(B), 1);
    const ForwardInput in{.batch = B, .tokens = 1, .ids = tok, .positions = p, .mask = m1, .logits_last_only = true,
                          .attention = AttentionForm::Absorbed};
    gpu_logits.push_back(gpu->forward(in, *cg, &hg).logits);
    cpu->forward(in, *cc, &hc);
    expect_f32_equal("tiny decode step " + std::to_string(s + 1), g, c, std::vector<int32_t>(size_t(B), 1), B);
  }
  EXPECT_EQ(fired_g, fired_c) << "hooks fired differently on cuda and cpu";
  EXPECT_GT(fired_c.size(), size_t(10 * cfg.num_hidden_layers));

  // Without hooks: the same logits, bits and all (decode steps 2.. replay the cache's graph),
  // and the device's greedy tokens are the argmax of those logits.
  auto plain = gpu->make_cache(B, Tp + steps);
  const ForwardInput in0{.batch = B, .tokens = Tp, .ids = ids, .positions = pos, .mask = mask, .logits_last_only = true};
  ForwardOutput out = gpu->forward(in0, *plain);
  ASSERT_EQ(out.logits, gpu_logits[0]) << "prefill without hooks";
  for (int s = 0; s < steps; ++s) {
    std::vector<int32_t> p(static_cast<size_t>(B));
    for (int r = 0; r < B; ++r) p[size_t(r)] = int32_t(rows[size_t(r)].size()) + s;
    const std::vector<uint8_t> m1(static_cast<size_t>(B), 1);
    out = gpu->forward({.batch = B, .tokens = 1, .ids = fed[size_t(s)], .positions = p, .mask = m1,
                        .logits_last_only = true},
                       *plain);
    ASSERT_EQ(out.logits, gpu_logits[size_t(s) + 1]) << "decode step " << s + 1 << " without hooks";
    for (int r = 0; r < B; ++r) EXPECT_EQ(out.greedy[size_t(r)], argmax(out.logits.data() + r * V, V)) << r;
  }
  // Rows alone.
  for (int r : {2, 5}) {
    auto c1 = gpu->make_cache(1, int64_t(rows[size_t(r)].size()) + steps);
    std::vector<float> alone = prefill(*gpu, *c1, {rows[size_t(r)]});
    for (int s = 0; s <= steps; ++s) {
      const std::vector<float> in_batch(gpu_logits[size_t(s)].begin() + r * V,
                                        gpu_logits[size_t(s)].begin() + (r + 1) * V);
      ASSERT_EQ(alone, in_batch) << "row " << r << " step " << s;
      if (s == steps) break;
      alone = step(*gpu, *c1, {fed[size_t(s)][size_t(r)]}, {int32_t(rows[size_t(r)].size()) + s});
    }
  }
}

// Device sampling (ForwardInput::sampling, kernels/sample.cuh) against the host path
// (ATLAS_DEVICE_SAMPLING=0: logits to the host, decode::RowSampler): the generated rows must be
// identical, token for token, in bf16 and f32, seeded and CRN, with greedy rows, top-k and
// top-p mixed in, at batch 3 and 1 (the decode graph replays the sampling kernel).
TEST_F(CudaTiny, DeviceSamplingGeneratesExactlyWhatHostSamplingDoes) {
  const int64_t V = ck_->config().vocab_size;
  const auto ps = prompts(V);
  for (Compute compute : {Compute::BF16, Compute::F32}) {
    auto model = compute == Compute::BF16 ? std::move(model_) : load_model(*ck_, {.backend = "cuda", .compute = compute});
    ASSERT_TRUE(model->supports_device_sampling());
    for (auto mode : {decode::SamplingMode::Seeded, decode::SamplingMode::Crn}) {
      std::vector<decode::PromptRow> rows;
      for (size_t r = 0; r < 6; ++r) {
        decode::PromptRow row{.id = std::string("r") + std::to_string(r), .ids = ps[r], .sampling = {}};
        row.sampling = {.mode = mode, .temperature = r == 4 ? 0.05 : 0.9, .top_p = r % 2 ? 0.9 : 1.0,
                        .top_k = r == 3 ? 5 : 0, .seed = 11, .stream = uint32_t(r), .crn_row_key = row.id};
        if (r == 2) row.sampling = {};  // greedy
        rows.push_back(std::move(row));
      }
      for (int64_t batch : {3, 1}) {
        const decode::GenerateOptions opts{.max_new_tokens = 10, .batch = batch, .eos_ids = {}, .pad_id = 0};
        setenv("ATLAS_DEVICE_SAMPLING", "0", 1);
        const auto host = decode::generate(*model, rows, opts);
        unsetenv("ATLAS_DEVICE_SAMPLING");
        const auto dev = decode::generate(*model, rows, opts);
        for (size_t r = 0; r < rows.size(); ++r) {
          auto str = [](const std::vector<int32_t>& v) {
            std::string s;
            for (int32_t t : v) s += std::to_string(t) + " ";
            return s;
          };
          EXPECT_EQ(dev[r].ids, host[r].ids)
              << compute_name(compute) << " " << decode::mode_name(mode) << " batch " << batch << " row " << r
              << " (T " << rows[r].sampling.temperature << ", top_p " << rows[r].sampling.top_p << ", top_k "
              << rows[r].sampling.top_k << "): device [" << str(dev[r].ids) << "] host [" << str(host[r].ids) << "]";
          EXPECT_EQ(dev[r].rng_state_sha256, host[r].rng_state_sha256);
          EXPECT_EQ(dev[r].stop, host[r].stop);
        }
      }
    }
  }
}

// Interventions (model/intervene.h) write through the CUDA backend's hooks as through the CPU's:
// for an edit of every hook the tiny model fires (scale 0.5 at token 20), a patch of one layer's
// routes, an expert zeroed and an expert routed out, CUDA f32 equals CPU f32 (absorbed) within
// 1e-5 relative L2 with the same routes, tokens before 20 keep their logits bit for bit and token
// 20's change. In bf16, patching every token of a residual stage from the clean run's trace dump
// puts an edited input back on the clean run's logits, bit for bit.
// Hook edits run on the device (edit_rows; ATLAS_DEVICE_EDITS, on by default) give the host
// path's bits (ATLAS_DEVICE_EDITS=0: the values copied out, edited by the observers, copied
// back): every hook as read and the logits, in bf16 and f32, for a scale at every hook a pass
// fires, a zero, a steering vector, rows by position, two edits on one hook (bf16 takes the
// host path there) and the edits of one row of a left-padded batch of two (a probe condition's).
// In bf16 the edited hook's readers see the values rounded to bf16 either way (what the model
// reads on; s60-2 found the host path handing them the observers' unrounded f32 values).
TEST_F(CudaTiny, DeviceHookEditsGiveTheHostEditsBits) {
  const ModelConfig& cfg = ck_->config();
  const int64_t V = cfg.vocab_size, H = cfg.hidden_size, T = 24, pad = 4;
  const LayerRange all = LayerRange::all(cfg);
  std::vector<int32_t> ids, pos;
  std::vector<uint8_t> mask;
  for (int64_t b = 0; b < 2; ++b)
    for (int64_t t = 0; t < T; ++t) {
      const bool padded = b == 1 && t < pad;
      ids.push_back(padded ? 0 : int32_t((t * 7919 + 13 * b + 5) % V));
      pos.push_back(padded ? 0 : int32_t(b == 1 ? t - pad : t));
      mask.push_back(padded ? 0 : 1);
    }
  const ForwardInput in{.batch = 2, .tokens = T, .ids = ids, .positions = pos, .mask = mask, .logits_last_only = false};
  const std::string dir = (fs::temp_directory_path() / ("atlas_cuda_device_edits_" + std::to_string(::getpid()))).string();
  fs::create_directories(dir);
  std::vector<float> steer(static_cast<size_t>(H)), rows(static_cast<size_t>(T * H));
  for (int64_t j = 0; j < H; ++j) steer[size_t(j)] = float(int(j % 5) - 2) * 0.5f;
  for (int64_t i = 0; i < T * H; ++i) rows[size_t(i)] = float((i * 13) % 11) * 0.125f - 0.6f;
  write_safetensors(dir + "/v.safetensors",
                    {{.name = "blocks.2.attn.hook_out", .dtype = DType::F32, .shape = {H}, .data = steer.data()},
                     {.name = "blocks.1.ln2.hook_normalized", .dtype = DType::F32, .shape = {T, H}, .data = rows.data()}},
                    {});
  struct Case {
    std::vector<std::string> specs;
    std::vector<uint8_t> rows;  // begin_pass's rows ({} = every row)
  };
  std::vector<Case> cases;
  for (const std::string& h : fired_hook_names(cfg, all))
    if (h.find("hook_pattern") == std::string::npos && h.find("hook_topk_ids") == std::string::npos)
      cases.push_back({{h + "@3-5,17=scale:0.5"}, {}});
  cases.push_back({{"blocks.1.hook_resid_post@2-9=zero"}, {}});
  cases.push_back({{"blocks.2.attn.hook_out=add:" + dir + "/v.safetensors*3"}, {}});
  cases.push_back({{"blocks.1.ln2.hook_normalized@0-19=add:" + dir + "/v.safetensors*-0.5"}, {}});
  cases.push_back({{"blocks.1.hook_resid_post@4=zero", "blocks.1.hook_resid_post@1-6=scale:-1.25"}, {}});
  cases.push_back({{"blocks.2.attn.hook_out@1-12=add:" + dir + "/v.safetensors*2"}, {0, 1}});
  struct Out {
    std::vector<float> logits;
    std::map<std::string, std::vector<float>> f32;
    std::map<std::string, std::vector<int32_t>> i32;
  };
  const auto run = [&](const Model& m, const Case& c) {
    Interventions e(c.specs, cfg, all, true);
    e.check_tokens(T, "test");
    Hooks hooks;
    e.attach(hooks);
    Out o;
    hooks.add_reader("*", [&](const HookTensor& t) {
      if (t.name.find("hook_pattern") != std::string_view::npos) return;
      if (t.dtype == DType::I32)
        o.i32[std::string(t.name)].assign(t.i32(), t.i32() + t.numel());
      else
        o.f32[std::string(t.name)].assign(t.f32(), t.f32() + t.numel());
    });
    e.begin_pass(in, c.rows);
    o.logits = m.forward(in, &hooks).logits;
    e.check_fired();
    return o;
  };
  for (const Compute compute : {Compute::BF16, Compute::F32}) {
    std::unique_ptr<Model> device, host;
    {
      const ScopedEnv on{{"ATLAS_DEVICE_EDITS", nullptr}};
      device = load_model(*ck_, {.backend = "cuda", .compute = compute});
    }
    {
      const ScopedEnv off{{"ATLAS_DEVICE_EDITS", "0"}};
      host = load_model(*ck_, {.backend = "cuda", .compute = compute});
    }
    const Out plain = run(*device, {{}, {}});
    int changed = 0;
    for (const Case& c : cases) {
      SCOPED_TRACE(c.specs[0] + (compute == Compute::F32 ? " (f32)" : " (bf16)"));
      const int64_t launches = cuda::edit_rows_launches();
      const Out d = run(*device, c);
      // (Two edits of a bf16 hook, and the logits, which reach the host anyway, run there.)
      const bool on_host = (c.specs.size() > 1 && compute == Compute::BF16) || c.specs[0].rfind("logits", 0) == 0;
      EXPECT_EQ(cuda::edit_rows_launches() - launches, on_host ? 0 : int64_t(c.specs.size())) << "the device path did not run";
      const int64_t host_launches = cuda::edit_rows_launches();
      const Out h = run(*host, c);
      EXPECT_EQ(cuda::edit_rows_launches(), host_launches);
      EXPECT_EQ(d.logits, h.logits);
      EXPECT_EQ(d.i32, h.i32);
      ASSERT_EQ(d.f32.size(), h.f32.size());
      for (const auto& [name, v] : d.f32) EXPECT_EQ(0, std::memcmp(v.data(), h.f32.at(name).data(), v.size() * 4)) << name;
      changed += d.logits != plain.logits;
    }
    EXPECT_GE(changed, int(cases.size()) - 2);  // (a scale of the logits hook itself changes the logits too)
  }
  fs::remove_all(dir);
}

TEST_F(CudaTiny, InterventionsMatchTheCpuBackend) {
  const ModelConfig& cfg = ck_->config();
  const int64_t V = cfg.vocab_size, T = 40, p = 20;
  const LayerRange all = LayerRange::all(cfg);
  std::vector<int32_t> ids;
  for (int64_t t = 0; t < T; ++t) ids.push_back(int32_t((t * 7919 + 13) % V));
  const OneRow row(ids);
  ForwardInput in = row.input();
  in.logits_last_only = false;
  in.attention = AttentionForm::Absorbed;
  const std::string dir = (fs::temp_directory_path() / ("atlas_cuda_intervene_" + std::to_string(::getpid()))).string();
  fs::create_directories(dir);
  struct Out {
    std::vector<float> logits;
    std::map<std::string, std::vector<int32_t>> routes;
  };
  const auto run = [&](const Model& m, Interventions* edits, const ForwardInput& x) {
    Hooks hooks;
    if (edits) edits->attach(hooks);
    Out o;
    hooks.add_reader("blocks.*.moe.hook_topk_ids",
                     [&](const HookTensor& t) { o.routes[std::string(t.name)].assign(t.i32(), t.i32() + t.numel()); });
    if (edits) edits->begin_pass(x);
    o.logits = m.forward(x, &hooks).logits;
    if (edits) edits->check_fired();
    return o;
  };
  {
    auto gpu = load_model(*ck_, {.backend = "cuda", .compute = Compute::F32});
    auto cpu = load_model(*ck_, {.backend = "cpu", .compute = Compute::F32});
    const Out base = run(*gpu, nullptr, in);
    // A topk_ids source: layer 2's routes, each expert id moved by one.
    std::vector<int32_t> moved = base.routes.at("blocks.2.moe.hook_topk_ids");
    for (auto& e : moved) e = (e + 1) % int32_t(cfg.n_routed_experts);
    const int64_t k = cfg.num_experts_per_tok;
    write_safetensors(dir + "/ids.safetensors",
                      {{.name = "blocks.2.moe.hook_topk_ids", .dtype = DType::I32, .shape = {T, k}, .data = moved.data()}},
                      {});
    std::vector<std::string> specs;
    for (const std::string& h : fired_hook_names(cfg, all))
      if (h.find("hook_pattern") == std::string::npos && h.find("hook_topk_ids") == std::string::npos)
        specs.push_back(h + "@20=scale:0.5");
    const std::string chosen = std::to_string(base.routes.at("blocks.1.moe.hook_topk_ids")[size_t(p * k)]);
    specs.push_back("blocks.2.moe.hook_topk_ids@20=patch:" + dir + "/ids.safetensors");
    specs.push_back("blocks.1.moe.experts." + chosen + "@20=zero");
    specs.push_back("blocks.1.moe.experts." + chosen + "@20=route-out");
    // A steering vector ([H], one for every chosen token) times 3.
    std::vector<float> steer(static_cast<size_t>(cfg.hidden_size));
    for (size_t j = 0; j < steer.size(); ++j) steer[j] = float(int(j % 5) - 2) * 0.5f;
    write_safetensors(dir + "/steer.safetensors",
                      {{.name = "blocks.2.attn.hook_out", .dtype = DType::F32, .shape = {cfg.hidden_size}, .data = steer.data()}},
                      {});
    specs.push_back("blocks.2.attn.hook_out@20=add:" + dir + "/steer.safetensors*3");
    for (const std::string& spec : specs) {
      SCOPED_TRACE(spec);
      Interventions e(std::vector<std::string>{spec}, cfg, all, true);
      e.check_tokens(T, "test");
      const Out g = run(*gpu, &e, in), c = run(*cpu, &e, in);
      const std::vector<int32_t> every(size_t(T), 1);
      EXPECT_LE(rel_l2(g.logits, c.logits, every, V), 1e-5);
      EXPECT_EQ(g.routes, c.routes);
      EXPECT_EQ(0, std::memcmp(g.logits.data(), base.logits.data(), size_t(p * V) * 4)) << "an earlier token changed";
      EXPECT_NE(0, std::memcmp(g.logits.data() + p * V, base.logits.data() + p * V, size_t(V) * 4)) << "token 20 unchanged";
    }
  }
  // bf16: a clean trace's dump, then the edited input with every token of layer 1's residual
  // patched from it.
  TraceRecorder rec(*model_);
  Hooks hooks;
  rec.attach(hooks);
  const ForwardInput clean_in = in;
  const std::vector<float> clean = model_->forward(clean_in, &hooks).logits;
  write_safetensors(dir + "/clean.safetensors", rec.tensors(), {});
  std::vector<int32_t> edited = ids;
  edited[10] = int32_t((edited[10] + 1) % V);
  const OneRow erow(edited);
  ForwardInput ein = erow.input();
  ein.logits_last_only = false;
  ASSERT_NE(model_->forward(ein).logits, clean);
  Interventions patch(std::vector<std::string>{"blocks.1.hook_resid_post=patch:" + dir + "/clean.safetensors"}, cfg, all,
                      true);
  patch.check_tokens(T, "test");
  EXPECT_EQ(run(*model_, &patch, ein).logits, clean);
  fs::remove_all(dir);

  // Generation with edits in every pass (bf16, greedy; the prompt pass left-padded): rows of
  // mixed lengths give the same tokens in one batch and alone, and the edits change some row.
  const auto ps = prompts(V);
  std::vector<decode::PromptRow> grows;
  for (size_t r = 0; r < ps.size(); ++r)
    if (ps[r].size() < 100) grows.push_back({.id = "r" + std::to_string(r), .ids = ps[r], .sampling = {}});
  Interventions gen_edits(std::vector<std::string>{"blocks.1.moe.experts.0,1=route-out", "blocks.2.hook_resid_post@3=scale:0.5"},
                          cfg, all, true);
  gen_edits.check_for_generation();
  decode::GenerateOptions gopts{.max_new_tokens = 8, .batch = int64_t(grows.size()), .eos_ids = {}, .pad_id = 0};
  const auto unedited = decode::generate(*model_, grows, gopts);
  gopts.edits = &gen_edits;
  const auto batched = decode::generate(*model_, grows, gopts);
  int changed = 0;
  for (size_t r = 0; r < grows.size(); ++r) {
    gopts.batch = 1;
    const auto one = decode::generate(*model_, std::span(grows).subspan(r, 1), gopts);
    EXPECT_EQ(one[0].ids, batched[r].ids) << "row " << r;
    changed += batched[r].ids != unedited[r].ids;
  }
  EXPECT_GE(changed, 1);
  // Edits of one row only (a probe condition's): that row as with the batch's edits, every other
  // row as unedited.
  gopts.edits = nullptr;
  gopts.batch = int64_t(grows.size());
  gopts.row_edits.assign(grows.size(), nullptr);
  gopts.row_edits[1] = &gen_edits;
  const auto one_row = decode::generate(*model_, grows, gopts);
  for (size_t r = 0; r < grows.size(); ++r) EXPECT_EQ(one_row[r].ids, r == 1 ? batched[r].ids : unedited[r].ids) << r;

  // patch:@CONDITION (probe cells): row 1 reads row 0's layer-1 residual in the same pass, both
  // left-padded behind a longer row 2; row 1 then gives row 0's last-token logits, bit for bit.
  {
    const std::vector<std::vector<int32_t>> three = {ids, edited, ps[3]};  // 40, 40 and 64 tokens
    const PaddedBatch pb(three);
    const ForwardInput bin{.batch = 3, .tokens = pb.T, .ids = pb.ids, .positions = pb.pos, .mask = pb.mask,
                           .logits_last_only = true};
    const std::vector<float> plain = model_->forward(bin).logits;
    Interventions sib(std::vector<std::string>{"blocks.1.hook_resid_post=patch:@clean"}, cfg, all, true, true);
    sib.set_sibling_rows({{"clean", 0}});
    Hooks h;
    sib.attach(h);
    const std::vector<uint8_t> second{0, 1, 0};
    sib.begin_pass(bin, second);
    const std::vector<float> got = model_->forward(bin, &h).logits;
    sib.check_fired();
    ASSERT_EQ(got.size(), size_t(3 * V));
    EXPECT_TRUE(std::equal(got.begin(), got.begin() + V, plain.begin())) << "row 0 changed";
    EXPECT_TRUE(std::equal(got.begin() + V, got.begin() + 2 * V, plain.begin())) << "row 1 is not row 0's";
    EXPECT_TRUE(std::equal(got.begin() + 2 * V, got.end(), plain.begin() + 2 * V)) << "row 2 changed";
    EXPECT_FALSE(std::equal(plain.begin() + V, plain.begin() + 2 * V, plain.begin()));
  }
}
