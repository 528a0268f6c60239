// Interventions (model/intervene.h) on the CPU backend: the spec checks, what each action does
// to the values and routes, causality (an edit at token p leaves every earlier token's logits
// bit-identical), and activation patching (patching every token of a residual stage from a
// clean run reproduces the clean run downstream, bit for bit).
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>

#include "core/error.h"
#include "io/safetensors.h"
#include "model/deepseek_v2.h"
#include "model/hooks.h"
#include "model/intervene.h"
#include "model/trace.h"
#include "tiny_model.h"

using namespace atlas;
namespace fs = std::filesystem;

namespace {

struct Fixture {
  ModelConfig cfg = ModelConfig::from_json(test_support::tiny_config_json(), "tiny");
  test_support::TinyWeights weights{cfg};
  DeepSeekV2 model(Compute c = Compute::F32) const { return DeepSeekV2(cfg, LayerRange::all(cfg), weights.source(), c); }
};

const std::vector<int32_t> kIds = {5, 17, 42, 8, 9, 13, 21, 34, 55, 89};
const int64_t kT = int64_t(kIds.size());

struct PassResult {
  std::vector<float> logits;                                 // [T, V]
  std::map<std::string, std::vector<float>> f32;             // every F32 per-token hook, as read
  std::map<std::string, std::vector<int32_t>> ids;           // every top-k id hook, as read
};

// One forward pass of kIds with the edits attached, reading every hook after them.
PassResult run(const DeepSeekV2& m, Interventions* edits, const std::vector<int32_t>& input = kIds) {
  std::vector<int32_t> pos(input.size());
  for (size_t t = 0; t < pos.size(); ++t) pos[t] = int32_t(t);
  std::vector<uint8_t> mask(input.size(), 1);
  Hooks hooks;
  if (edits) edits->attach(hooks);
  PassResult r;
  hooks.add_reader("*", [&](const HookTensor& t) {
    if (t.name.find("hook_pattern") != std::string_view::npos) return;
    if (t.dtype == DType::I32)
      r.ids[std::string(t.name)].assign(t.i32(), t.i32() + t.numel());
    else
      r.f32[std::string(t.name)].assign(t.f32(), t.f32() + t.numel());
  });
  const ForwardInput in{.batch = 1, .tokens = int64_t(input.size()), .ids = input, .positions = pos, .mask = mask};
  if (edits) edits->begin_pass(in);
  r.logits = m.forward(in, &hooks).logits;
  if (edits) edits->check_fired();
  return r;
}

std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

// kIds through the model with a TraceRecorder (options as given): a clean run's trace, as
// `atlas trace` keeps it.
void trace_clean(const DeepSeekV2& m, TraceRecorder& rec) {
  Hooks hooks;
  rec.attach(hooks);
  std::vector<int32_t> pos(kIds.size());
  for (size_t t = 0; t < pos.size(); ++t) pos[t] = int32_t(t);
  std::vector<uint8_t> mask(kIds.size(), 1);
  m.forward({.batch = 1, .tokens = kT, .ids = kIds, .positions = pos, .mask = mask}, &hooks);
}

class InterveneTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("atlas_intervene_" + std::to_string(::getpid()) + "_" +
                                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  Interventions make(const std::vector<std::string>& specs, LayerRange range = {}) const {
    if (range.last < 0) range = LayerRange::all(f_.cfg);
    return Interventions(specs, f_.cfg, range, range.last == f_.cfg.num_hidden_layers - 1);
  }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }
  Fixture f_;
  fs::path dir_;
};

}  // namespace

TEST_F(InterveneTest, BadSpecsAreRefusedNamingTheSpec) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"blocks.1.hook_resid_post", "expected TARGET[@TOKENS]=ACTION"},
      {"blocks.1.hook_resid_postx=zero", "unknown hook"},
      {"blocks.{L}.hook_resid_post=zero", "name a concrete layer"},
      {"blocks.7.hook_resid_post=zero", "layer 7 is not run"},
      {"blocks.1.attn.hook_pattern=zero", "read-only"},
      {"blocks.0.moe.hook_router_logits=zero", "layer 0 is dense"},
      {"blocks.0.moe.experts.1=zero", "layer 0 is dense"},
      {"blocks.1.moe.experts.8=zero", "expected an expert id 0-7"},
      {"blocks.1.moe.experts.x=zero", "expected an expert id 0-7"},
      {"blocks.1.moe.experts.1=scale:2", "expected zero or route-out"},
      // Groups of two experts, the best two groups kept, k = 3: experts 0 and 2 out can leave
      // the kept groups with two to choose from.
      {"blocks.1.moe.experts.0,2=route-out", "fewer than k = 3"},
      {"blocks.1.hook_resid_post=scale:inf", "not a finite number"},
      {"blocks.1.hook_resid_post=scale:", "not a finite number"},
      {"blocks.1.hook_resid_post=scale:2x", "not a finite number"},
      {"blocks.1.hook_resid_post=shift:1", "unknown action"},
      {"blocks.1.moe.hook_topk_ids=zero", "only patch:FILE applies"},
      {"blocks.1.hook_resid_post@3-1=zero", "token list"},
      {"blocks.1.hook_resid_post@-1=zero", "token list"},
      {"blocks.1.hook_resid_post@=zero", "token list"},
      {"blocks.1.hook_resid_post@a=zero", "token list"},
      {"blocks.1.hook_resid_post=patch:", "needs a safetensors file"},
      {"blocks.1.hook_resid_post=patch:@s0_eos", "probe protocols only"},
  };
  for (const auto& [spec, want] : cases) {
    const std::string e = error_of([&] { make({spec}); });
    EXPECT_NE(e.find("--intervene '" + spec + "'"), std::string::npos) << spec << " -> " << e;
    EXPECT_NE(e.find(want), std::string::npos) << spec << " -> " << e;
  }
  // Partial runs: the head's hooks do not fire.
  EXPECT_NE(error_of([&] { make({"logits=zero"}, {0, 1}); }).find("fires only when the run reaches the last layer"),
            std::string::npos);
  EXPECT_NE(error_of([&] { make({"blocks.2.hook_resid_post=zero"}, {0, 1}); }).find("layer 2 is not run"),
            std::string::npos);
  // Tokens beyond the sequence are refused before the pass.
  const auto iv = make({"blocks.1.hook_resid_post@2,9-12=zero"});
  EXPECT_EQ(iv.list()[0].tokens, (std::vector<int64_t>{2, 9, 10, 11, 12}));
  const std::string e = error_of([&] { iv.check_tokens(kT, "--ids"); });
  EXPECT_NE(e.find("token 12 is outside the 10 tokens"), std::string::npos) << e;
}

TEST_F(InterveneTest, PatchSourcesAreChecked) {
  const auto m = f_.model();
  // A trace dump of the clean run, as `atlas trace --dump` writes it.
  TraceRecorder rec(m);
  trace_clean(m, rec);
  write_safetensors(path("clean.safetensors"), rec.tensors(), {});

  // The dump's names stand for the hooks; the hook's own name is tried first.
  const auto iv = make({"blocks.1.hook_resid_post=patch:" + path("clean.safetensors"),
                        "blocks.2.moe.hook_topk_ids@3=patch:" + path("clean.safetensors")});
  EXPECT_EQ(iv.list()[0].source_tensor, "hidden.2");
  EXPECT_EQ(iv.list()[1].source_tensor, "router.2.topk_ids");
  iv.check_tokens(kT, "--ids");
  EXPECT_NE(error_of([&] { iv.check_tokens(kT + 1, "--ids"); }).find("holds 10 tokens; patching every token needs exactly 11"),
            std::string::npos);
  const auto short_patch = make({"blocks.1.hook_resid_post@9=patch:" + path("clean.safetensors")});
  short_patch.check_tokens(kT, "--ids");
  EXPECT_NE(error_of([&] { make({"blocks.1.hook_resid_post@10=patch:" + path("clean.safetensors")}).check_tokens(11, "x"); })
                .find("token 10 is not among them"),
            std::string::npos);

  // No such tensor, wrong shape, wrong dtype, non-finite values, bad expert ids, missing file.
  EXPECT_NE(error_of([&] { make({"blocks.1.attn.hook_out=patch:" + path("clean.safetensors")}); })
                .find("no tensor \"blocks.1.attn.hook_out\" to patch"),
            std::string::npos);
  const std::vector<float> wide(size_t(kT * 5), 1.0f), short_row(8, 0.0f);
  std::vector<float> nan_row(32, 0.0f);
  nan_row[1] = std::nanf("");
  const std::vector<int32_t> int_rows(size_t(kT * 32), 0), bad_ids{0, 1, 9};
  write_safetensors(path("odd.safetensors"),
                    {{.name = "blocks.1.hook_resid_post", .dtype = DType::F32, .shape = {kT, 5}, .data = wide.data()},
                     {.name = "blocks.2.hook_resid_post", .dtype = DType::I32, .shape = {kT, 32}, .data = int_rows.data()},
                     {.name = "logits", .dtype = DType::F32, .shape = {1, 8}, .data = short_row.data()},
                     {.name = "blocks.1.attn.hook_out", .dtype = DType::F32, .shape = {1, 32}, .data = nan_row.data()},
                     {.name = "blocks.1.moe.hook_topk_ids", .dtype = DType::I32, .shape = {1, 3}, .data = bad_ids.data()}},
                    {});
  EXPECT_NE(error_of([&] { make({"blocks.1.attn.hook_out=patch:" + path("odd.safetensors")}); })
                .find("blocks.1.attn.hook_out: holds a non-finite value at element 1"),
            std::string::npos);
  EXPECT_NE(error_of([&] { make({"blocks.1.hook_resid_post=patch:" + path("odd.safetensors")}); })
                .find("blocks.1.hook_resid_post: shape [10,5], expected [T,32]"),
            std::string::npos);
  EXPECT_NE(error_of([&] { make({"blocks.2.hook_resid_post=patch:" + path("odd.safetensors")}); })
                .find("dtype I32, expected F32"),
            std::string::npos);
  EXPECT_NE(error_of([&] { make({"logits=patch:" + path("odd.safetensors")}); }).find("shape [1,8], expected [T,97]"),
            std::string::npos);
  EXPECT_NE(error_of([&] { make({"blocks.1.moe.hook_topk_ids=patch:" + path("odd.safetensors")}); })
                .find("expert id 9 at element 2"),
            std::string::npos);
  EXPECT_NE(error_of([&] { make({"embed=patch:" + path("missing.safetensors")}); }).find("missing.safetensors"),
            std::string::npos);
}

// Every edit of every hook at token p: tokens before p keep their logits bit for bit, token p's
// change, and the edit fired once. The edited hook reads back edited (readers see the edit).
TEST_F(InterveneTest, EditsAtATokenAreCausal) {
  const auto m = f_.model();
  const PassResult base = run(m, nullptr);
  const int64_t V = f_.cfg.vocab_size, p = 6;
  // A topk_ids source: every token's routes rotated by one expert.
  std::vector<int32_t> rotated = base.ids.at("blocks.2.moe.hook_topk_ids");
  for (auto& e : rotated) e = (e + 1) % int32_t(f_.cfg.n_routed_experts);
  write_safetensors(path("ids.safetensors"),
                    {{.name = "blocks.2.moe.hook_topk_ids", .dtype = DType::I32, .shape = {kT, 3}, .data = rotated.data()}},
                    {});
  std::vector<std::string> specs;
  for (const std::string& h : fired_hook_names(f_.cfg, LayerRange::all(f_.cfg))) {
    if (h.find("hook_pattern") != std::string::npos) continue;
    specs.push_back(h.find("hook_topk_ids") == std::string::npos ? h + "@6=scale:0.5" : "");
  }
  std::erase(specs, "");
  specs.push_back("blocks.2.moe.hook_topk_ids@6=patch:" + path("ids.safetensors"));
  // The experts each token chose at p in layer 1 / 2: zero them, route them out.
  const auto& ids1 = base.ids.at("blocks.1.moe.hook_topk_ids");
  const std::string e1 = std::to_string(ids1[size_t(p * 3)]);
  specs.push_back("blocks.1.moe.experts." + e1 + "@6=zero");
  specs.push_back("blocks.1.moe.experts." + e1 + "@6=route-out");
  ASSERT_GE(specs.size(), 20u);
  for (const std::string& spec : specs) {
    SCOPED_TRACE(spec);
    Interventions iv = make({spec});
    iv.check_tokens(kT, "--ids");
    const PassResult r = run(m, &iv);
    EXPECT_EQ(0, std::memcmp(r.logits.data(), base.logits.data(), size_t(p * V) * 4)) << "an earlier token changed";
    EXPECT_NE(0, std::memcmp(r.logits.data() + p * V, base.logits.data() + p * V, size_t(V) * 4)) << "token p unchanged";
    const std::string& hook = iv.list()[0].hook;
    if (iv.list()[0].action == InterventionAction::Scale) {
      const auto& got = r.f32.at(hook);
      const auto& was = base.f32.at(hook);
      const int64_t W = int64_t(was.size()) / kT;
      for (int64_t j = 0; j < W; ++j) EXPECT_EQ(got[size_t(p * W + j)], float(double(was[size_t(p * W + j)]) * 0.5));
    }
  }
}

// add:FILE[*F]: one vector for every chosen token (a steering vector) or rows by position; the
// hook reads back value + F * source (double, rounded once) there and unchanged elsewhere,
// earlier tokens keep their logits, and a vector needs no TOKENS in generation.
TEST_F(InterveneTest, AddingAVectorOrRowsToAHook) {
  const auto m = f_.model();
  const PassResult base = run(m, nullptr);
  const int64_t H = f_.cfg.hidden_size, V = f_.cfg.vocab_size;
  std::vector<float> dir(static_cast<size_t>(H)), rows(static_cast<size_t>(kT * H));
  for (int64_t j = 0; j < H; ++j) dir[size_t(j)] = float(j % 7) * 0.25f - 0.5f;
  for (int64_t i = 0; i < kT * H; ++i) rows[size_t(i)] = float((i * 13) % 11) * 0.125f - 0.6f;
  write_safetensors(path("steer.safetensors"),
                    {{.name = "blocks.1.hook_resid_post", .dtype = DType::F32, .shape = {H}, .data = dir.data()},
                     {.name = "blocks.2.attn.hook_out", .dtype = DType::F32, .shape = {kT, H}, .data = rows.data()}},
                    {});
  const std::string file = path("steer.safetensors");
  const auto& was1 = base.f32.at("blocks.1.hook_resid_post");
  const auto& was2 = base.f32.at("blocks.2.attn.hook_out");
  {  // the vector times -1.5 at tokens 4-6
    Interventions iv = make({"blocks.1.hook_resid_post@4-6=add:" + file + "*-1.5"});
    EXPECT_EQ(iv.list()[0].factor, -1.5);
    EXPECT_FALSE(iv.list()[0].source_per_position);
    iv.check_for_generation();  // a vector: no per-position source, so no TOKENS needed
    const PassResult r = run(m, &iv);
    const auto& got = r.f32.at("blocks.1.hook_resid_post");
    for (int64_t t = 0; t < kT; ++t)
      for (int64_t j = 0; j < H; ++j) {
        const size_t at = size_t(t * H + j);
        EXPECT_EQ(got[at], t >= 4 && t <= 6 ? float(double(was1[at]) - 1.5 * double(dir[size_t(j)])) : was1[at]) << t << " " << j;
      }
    EXPECT_EQ(0, std::memcmp(r.logits.data(), base.logits.data(), size_t(4 * V) * 4)) << "an earlier token changed";
    EXPECT_NE(0, std::memcmp(r.logits.data() + 4 * V, base.logits.data() + 4 * V, size_t(V) * 4));
    EXPECT_EQ(iv.to_json()[0]["action"], "add");
    EXPECT_EQ(iv.to_json()[0]["factor"], -1.5);
    EXPECT_EQ(iv.to_json()[0]["source"]["per_position"], false);
  }
  {  // rows by position, every token, factor 1
    Interventions iv = make({"blocks.2.attn.hook_out=add:" + file});
    EXPECT_TRUE(iv.list()[0].source_per_position);
    iv.check_tokens(kT, "--ids");
    const PassResult r = run(m, &iv);
    const auto& got = r.f32.at("blocks.2.attn.hook_out");
    for (size_t i = 0; i < got.size(); ++i) EXPECT_EQ(got[i], float(double(was2[i]) + double(rows[i]))) << i;
    EXPECT_NE(error_of([&] { iv.check_tokens(kT + 1, "--ids"); }).find("adding to every token needs exactly 11"), std::string::npos);
    EXPECT_NE(error_of([&] { iv.check_for_generation(); }).find("an add of rows by position in generation names its tokens"),
              std::string::npos);
  }
  // Adding zero times anything changes nothing, bit for bit.
  Interventions none = make({"blocks.1.hook_resid_post=add:" + file + "*0"});
  EXPECT_EQ(0, std::memcmp(run(m, &none).logits.data(), base.logits.data(), base.logits.size() * 4));
  // Refusals: a bad factor, a shape that is neither [H] nor [T, H], expert ids, no file.
  EXPECT_NE(error_of([&] { make({"blocks.1.hook_resid_post=add:" + file + "*x"}); }).find("factor \"x\" is not a finite number"),
            std::string::npos);
  EXPECT_NE(error_of([&] { make({"blocks.1.moe.hook_router_logits=add:" + file}); }).find("no tensor"), std::string::npos);
  write_safetensors(path("odd.safetensors"),
                    {{.name = "blocks.1.hook_resid_post", .dtype = DType::F32, .shape = {2, 3}, .data = dir.data()}}, {});
  EXPECT_NE(error_of([&] { make({"blocks.1.hook_resid_post=add:" + path("odd.safetensors")}); })
                .find("shape [2,3], expected [T,32] or [32]"),
            std::string::npos);
  EXPECT_NE(error_of([&] { make({"blocks.1.moe.hook_topk_ids=add:" + file}); }).find("nothing can be added"), std::string::npos);
  EXPECT_NE(error_of([&] { make({"blocks.1.hook_resid_post=add:"}); }).find("add: needs a safetensors file"), std::string::npos);
}

TEST_F(InterveneTest, ExpertEditsDoWhatTheySay) {
  const auto m = f_.model();
  const PassResult base = run(m, nullptr);
  const auto& ids = base.ids.at("blocks.1.moe.hook_topk_ids");
  const auto& w = base.f32.at("blocks.1.moe.hook_topk_weights");
  // The expert token 4 chose first, edited at tokens 2-5.
  const int32_t e = ids[4 * 3];
  {
    Interventions iv = make({"blocks.1.moe.experts." + std::to_string(e) + "@2-5=zero"});
    const PassResult r = run(m, &iv);
    EXPECT_EQ(r.ids.at("blocks.1.moe.hook_topk_ids"), ids);  // chosen as before
    const auto& got = r.f32.at("blocks.1.moe.hook_topk_weights");
    int zeroed = 0;
    for (int64_t s = 0; s < kT; ++s)
      for (int j = 0; j < 3; ++j) {
        const size_t i = size_t(s * 3 + j);
        const bool hit = s >= 2 && s <= 5 && ids[i] == e;
        EXPECT_EQ(got[i], hit ? 0.0f : w[i]) << "token " << s << " slot " << j;
        zeroed += hit;
      }
    EXPECT_GE(zeroed, 1);
  }
  {
    Interventions iv = make({"blocks.1.moe.experts." + std::to_string(e) + "@2-5=route-out"});
    const PassResult r = run(m, &iv);
    const auto& got = r.ids.at("blocks.1.moe.hook_topk_ids");
    const auto& gw = r.f32.at("blocks.1.moe.hook_topk_weights");
    for (int64_t s = 0; s < kT; ++s) {
      float sum = 0;
      for (int j = 0; j < 3; ++j) {
        const size_t i = size_t(s * 3 + j);
        if (s >= 2 && s <= 5) {
          EXPECT_NE(got[i], e) << "token " << s;
        }
        if (s < 2) {
          EXPECT_EQ(got[i], ids[i]);
        }
        sum += gw[i];
      }
      EXPECT_NEAR(sum, 1.0f, 1e-6) << "norm_topk_prob: the weights are normalised over the chosen experts";
    }
    EXPECT_EQ(r.f32.at("blocks.1.moe.hook_router_logits")[size_t(2 * 8 + e)], -std::numeric_limits<float>::infinity());
  }
}

// Activation patching: every token of blocks.1.hook_resid_post from the clean run's trace dump
// puts an edited input back on the clean run's path; one token moves only what follows it.
TEST_F(InterveneTest, PatchingTheResidualStreamRestoresTheCleanRun) {
  for (Compute compute : {Compute::F32, Compute::BF16}) {
    SCOPED_TRACE(compute_name(compute));
    const auto m = f_.model(compute);
    const PassResult clean = run(m, nullptr);
    TraceRecorder rec(m);
    trace_clean(m, rec);
    write_safetensors(path("clean.safetensors"), rec.tensors(), {});

    std::vector<int32_t> edited = kIds;
    edited[4] = 77;
    const PassResult dirty = run(m, nullptr, edited);
    ASSERT_NE(dirty.logits, clean.logits);
    Interventions all = make({"blocks.1.hook_resid_post=patch:" + path("clean.safetensors")});
    const PassResult restored = run(m, &all, edited);
    EXPECT_EQ(restored.logits, clean.logits);
    EXPECT_EQ(restored.f32.at("blocks.2.hook_resid_post"), clean.f32.at("blocks.2.hook_resid_post"));
    EXPECT_NE(restored.f32.at("blocks.0.hook_resid_post"), clean.f32.at("blocks.0.hook_resid_post"));

    // Patching the edited token's residual only: later tokens still read the edited keys of
    // layers 0-1, so the run lies between the two; tokens before 4 are untouched throughout.
    Interventions one = make({"blocks.1.hook_resid_post@4=patch:" + path("clean.safetensors")});
    const PassResult partial = run(m, &one, edited);
    const int64_t V = f_.cfg.vocab_size;
    EXPECT_EQ(0, std::memcmp(partial.logits.data(), clean.logits.data(), size_t(4 * V) * 4));
    EXPECT_EQ(0, std::memcmp(partial.logits.data() + 4 * V, clean.logits.data() + 4 * V, size_t(V) * 4))
        << "token 4 reads only its own patched residual and the clean earlier tokens";
    EXPECT_NE(partial.logits, clean.logits);
  }
}

TEST_F(InterveneTest, DumpNamesAgreeWithTheTraceRecorder) {
  const auto m = f_.model();
  TraceRecorder rec(m, {.record = {"*"}});
  trace_clean(m, rec);
  int mapped = 0;
  for (const std::string& h : fired_hook_names(f_.cfg, LayerRange::all(f_.cfg))) {
    SCOPED_TRACE(h);
    const auto* own = rec.find(h);
    ASSERT_NE(own, nullptr) << "--record '*' keeps every hook";
    if (h.find("hook_pattern") != std::string::npos) continue;
    std::vector<int64_t> want{kT};
    for (int64_t d : hook_token_shape(h, f_.cfg)) want.push_back(d);
    EXPECT_EQ(own->shape, want);
    const std::string d = trace_dump_name(h, f_.cfg);
    if (d.empty()) continue;
    const auto* dumped = rec.find(d);
    ASSERT_NE(dumped, nullptr) << d;
    EXPECT_EQ(dumped->f32, own->f32);
    EXPECT_EQ(dumped->i32, own->i32);
    ++mapped;
  }
  // embed, 3 resid_post, 3 latents, 2 x 3 router tensors, final_norm, logits
  EXPECT_EQ(mapped, 1 + 3 + 3 + 6 + 2);
  EXPECT_EQ(rec.recorded_names().size(), fired_hook_names(f_.cfg, LayerRange::all(f_.cfg)).size());
  EXPECT_NE(error_of([&] { check_record_patterns({"blocks.*.nothing"}, f_.cfg, LayerRange::all(f_.cfg)); })
                .find("--record 'blocks.*.nothing': matches no hook"),
            std::string::npos);
  EXPECT_NE(error_of([&] { check_record_patterns({"logits"}, f_.cfg, {0, 1}); }).find("matches no hook"), std::string::npos);
}

TEST_F(InterveneTest, EditsApplyInOrderAndMustFire) {
  const auto m = f_.model();
  const PassResult base = run(m, nullptr);
  // scale 2 then zero = zero; zero then scale = zero; scale 2 then scale 0.25 = scale 0.5.
  Interventions a = make({"blocks.1.attn.hook_out@3=scale:2", "blocks.1.attn.hook_out@3=scale:0.25"});
  Interventions b = make({"blocks.1.attn.hook_out@3=scale:0.5"});
  EXPECT_EQ(run(m, &a).logits, run(m, &b).logits);
  // Never attached to a pass: no edit fired.
  Interventions idle = make({"blocks.1.attn.hook_out=zero"});
  Hooks h;
  idle.attach(h);
  EXPECT_NE(error_of([&] { idle.check_fired(); }).find("fired 0 times"), std::string::npos);
  // The artifact's record.
  const ojson j = a.to_json();
  ASSERT_EQ(j.size(), 2u);
  EXPECT_EQ(j[0]["spec"], "blocks.1.attn.hook_out@3=scale:2");
  EXPECT_EQ(j[0]["action"], "scale");
  EXPECT_EQ(j[0]["factor"], 2.0);
  EXPECT_EQ(j[0]["tokens"], ojson::array({3}));
  EXPECT_EQ(make({"blocks.1.moe.experts.4,1,4=zero"}).to_json()[0]["experts"], ojson::array({1, 4}));
  EXPECT_EQ(make({"embed=zero"}).to_json()[0]["tokens"], "all");
}

// patch:@CONDITION (probe cells): a row reads its sibling row's values in the same pass. Every
// token of layer 1's residual from row 0 puts row 1 (another input, the same length) on row 0's
// logits, bit for bit; row 0 is untouched; without a sibling row it is an error.
TEST_F(InterveneTest, PatchFromASiblingRowInTheSamePass) {
  const auto m = f_.model();
  std::vector<int32_t> other = kIds;
  other[3] = 77;
  std::vector<int32_t> ids = kIds, pos;
  ids.insert(ids.end(), other.begin(), other.end());
  for (int b = 0; b < 2; ++b)
    for (int64_t t = 0; t < kT; ++t) pos.push_back(int32_t(t));
  const std::vector<uint8_t> mask(size_t(2 * kT), 1), second{0, 1};
  const ForwardInput in{.batch = 2, .tokens = kT, .ids = ids, .positions = pos, .mask = mask};
  const std::vector<float> plain = m.forward(in).logits;
  Interventions iv({"blocks.1.hook_resid_post=patch:@clean"}, f_.cfg, LayerRange::all(f_.cfg), true, true);
  EXPECT_EQ(iv.to_json()[0]["source"]["condition"], "clean");
  iv.set_sibling_rows({{"clean", 0}});
  Hooks hooks;
  iv.attach(hooks);
  iv.begin_pass(in, second);
  const std::vector<float> patched = m.forward(in, &hooks).logits;
  iv.check_fired();
  const size_t half = plain.size() / 2;
  EXPECT_TRUE(std::equal(patched.begin(), patched.begin() + long(half), plain.begin())) << "row 0 changed";
  EXPECT_TRUE(std::equal(patched.begin() + long(half), patched.end(), plain.begin())) << "row 1 is not row 0's";
  EXPECT_FALSE(std::equal(plain.begin() + long(half), plain.end(), plain.begin()));
  iv.set_sibling_rows({});
  Hooks h2;
  iv.attach(h2);
  iv.begin_pass(in, second);
  EXPECT_NE(error_of([&] { m.forward(in, &h2); }).find("no row of condition clean in this batch"), std::string::npos);
}

// Zero, scale and add are also row edits (model/hooks.h HookRowEdit), which the CUDA backend
// runs on the device: select() must list exactly the rows the observer edits, with the values
// it adds, so that HookRowEdit's arithmetic on them gives the observer's bits; patch and expert
// edits are not row edits, and a hook with any other tensor observer offers none.
TEST_F(InterveneTest, RowEditsGiveTheObserversValues) {
  const int64_t B = 2, T = 5, W = f_.cfg.hidden_size;
  std::vector<float> dir(static_cast<size_t>(W)), rows(static_cast<size_t>(T * W));
  for (int64_t j = 0; j < W; ++j) dir[size_t(j)] = float(j % 5) * 0.3f - 0.7f;
  for (int64_t i = 0; i < T * W; ++i) rows[size_t(i)] = float((i * 7) % 13) * 0.1f - 0.55f;
  write_safetensors(path("v.safetensors"),
                    {{.name = "blocks.1.hook_resid_post", .dtype = DType::F32, .shape = {W}, .data = dir.data()},
                     {.name = "blocks.2.attn.hook_out", .dtype = DType::F32, .shape = {T, W}, .data = rows.data()}},
                    {});
  const std::string file = path("v.safetensors");
  // Row 0: positions 0-4; row 1: one padding token, then positions 0-3.
  const std::vector<int32_t> ids(size_t(B * T), 7), pos = {0, 1, 2, 3, 4, 0, 0, 1, 2, 3};
  const std::vector<uint8_t> mask = {1, 1, 1, 1, 1, 0, 1, 1, 1, 1};
  const ForwardInput in{.batch = B, .tokens = T, .ids = ids, .positions = pos, .mask = mask};
  std::vector<float> base(size_t(B * T * W));
  for (size_t i = 0; i < base.size(); ++i) base[i] = float(int64_t(i * 37) % 101) * 0.013f - 0.6f;
  struct Case {
    std::string spec, hook;
    std::vector<uint8_t> rows;  // begin_pass's rows ({} = every row)
  };
  const std::vector<Case> cases = {
      {"blocks.1.hook_resid_post@1-3=zero", "blocks.1.hook_resid_post", {}},
      {"blocks.1.hook_resid_post@0,2=scale:-0.37", "blocks.1.hook_resid_post", {}},
      {"blocks.1.hook_resid_post=add:" + file + "*2.5", "blocks.1.hook_resid_post", {0, 1}},
      {"blocks.2.attn.hook_out@1-3=add:" + file + "*-0.75", "blocks.2.attn.hook_out", {}},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.spec);
    Interventions iv = make({c.spec});
    Hooks hooks;
    iv.attach(hooks);
    const std::vector<const HookRowEdit*> edits = hooks.row_edits(c.hook);
    ASSERT_EQ(edits.size(), 1u);
    EXPECT_TRUE(hooks.row_edits("blocks.0.hook_resid_post").empty());
    // The observer on one copy.
    iv.begin_pass(in, c.rows);
    std::vector<float> want = base;
    HookTensor t{.name = c.hook, .layer = iv.list()[0].layer, .shape = {B, T, W}, .data = want.data()};
    hooks.fire(t);
    iv.check_fired();
    // The row edit on another.
    iv.begin_pass(in, c.rows);
    std::vector<int64_t> listed;
    std::vector<float> add;
    edits[0]->select({B, T, W}, listed, add);
    iv.check_fired();  // select() counted as the observer's call
    const HookRowEdit& e = *edits[0];
    ASSERT_EQ(add.size(), e.op != HookRowEdit::Op::Add ? 0 : e.per_row ? listed.size() * size_t(W) : size_t(W));
    std::vector<float> got = base;
    for (size_t i = 0; i < listed.size(); ++i)
      for (int64_t j = 0; j < W; ++j) {
        float& v = got[size_t(listed[i] * W + j)];
        const float s = e.op == HookRowEdit::Op::Add ? add[(e.per_row ? i * size_t(W) : 0) + size_t(j)] : 0.0f;
        v = e.op == HookRowEdit::Op::Zero    ? 0.0f
            : e.op == HookRowEdit::Op::Scale ? float(double(v) * e.factor)
                                             : float(double(v) + e.factor * double(s));
      }
    EXPECT_EQ(0, std::memcmp(got.data(), want.data(), got.size() * 4));
    EXPECT_NE(0, std::memcmp(got.data(), base.data(), got.size() * 4)) << "nothing edited";
    EXPECT_TRUE(std::is_sorted(listed.begin(), listed.end()));
    EXPECT_EQ(std::find(listed.begin(), listed.end(), 5), listed.end()) << "the padding token was listed";
  }
  // Rows of one condition only: the other row is never listed.
  Interventions one = make({"blocks.1.hook_resid_post=zero"});
  Hooks h1;
  one.attach(h1);
  one.begin_pass(in, std::vector<uint8_t>{0, 1});
  std::vector<int64_t> listed;
  std::vector<float> add;
  h1.row_edits("blocks.1.hook_resid_post")[0]->select({B, T, W}, listed, add);
  EXPECT_EQ(listed, (std::vector<int64_t>{6, 7, 8, 9}));
  // Not row edits: a patch, an expert edit; nor a hook that another tensor observer also wants.
  Interventions patch = make({"blocks.2.attn.hook_out=patch:" + file}),
                experts = make({"blocks.1.moe.experts.2=route-out"}),
                two = make({"blocks.1.hook_resid_post=zero", "blocks.1.hook_resid_post=scale:2"});
  Hooks h2, h3, h4;
  patch.attach(h2);
  EXPECT_TRUE(h2.row_edits("blocks.2.attn.hook_out").empty());
  experts.attach(h3);
  EXPECT_TRUE(h3.row_edits("blocks.1.moe.hook_router_logits").empty());
  two.attach(h4);
  EXPECT_EQ(h4.row_edits("blocks.1.hook_resid_post").size(), 2u);
  h4.add("blocks.*.hook_resid_post", [](HookTensor&) {});
  EXPECT_TRUE(h4.row_edits("blocks.1.hook_resid_post").empty());
}
