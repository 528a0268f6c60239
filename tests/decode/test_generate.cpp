// Generation against transformers' generate (greedy, f32, official semantics) on the
// reference fixtures, and the batch-invariance / seed contracts of issue 4.
#include <gtest/gtest.h>
#include <omp.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>

#include "core/file.h"
#include "core/json.h"
#include "decode/generate.h"
#include "decode/sample_core.h"
#include "io/checkpoint.h"
#include "io/safetensors.h"
#include "model/loader.h"

using namespace atlas;
namespace fs = std::filesystem;

namespace {

std::vector<std::string> fixtures_with_generate() {
  std::vector<std::string> out;
  for (auto& e : fs::directory_iterator(fs::path(ATLAS_SOURCE_DIR) / "tests" / "fixtures"))
    if (fs::exists(e.path() / "generate.json")) out.push_back(e.path().string());
  std::sort(out.begin(), out.end());
  return out;
}

struct Loaded {
  Checkpoint ck;
  std::unique_ptr<Model> owned;
  const Model& model;
  Loaded(const std::string& dir, Compute c)
      : ck(Checkpoint::open(dir)), owned(load_model(ck, {.backend = "cpu", .compute = c})), model(*owned) {}
};

decode::GenerateOptions greedy_opts(const ModelConfig& cfg, int64_t max_new, int64_t batch) {
  return {.max_new_tokens = max_new,
          .batch = batch,
          .eos_ids = {*cfg.eos_token_id},
          .pad_id = int32_t(*cfg.eos_token_id)};
}

}  // namespace

TEST(Generate, GreedyMatchesTransformersGenerate) {
  int cases = 0;
  for (const auto& dir : fixtures_with_generate()) {
    SCOPED_TRACE(dir);
    Loaded m(dir, Compute::F32);
    json g = read_json_file(dir + "/generate.json");
    for (const auto& c : g["cases"]) {
      SCOPED_TRACE(c["name"].get<std::string>());
      const auto& in = c["input_ids"];
      const auto& mask = c["attention_mask"];
      const auto& outs = c["output_ids"];
      const int64_t eos = c["eos_token_id"].get<int64_t>();
      const int64_t max_new = c["max_new_tokens"].get<int64_t>();
      std::vector<decode::PromptRow> rows;
      std::vector<std::vector<int32_t>> expected;
      for (size_t r = 0; r < in.size(); ++r) {
        decode::PromptRow row{.id = std::to_string(r), .ids = {}, .sampling = {}};
        for (size_t t = 0; t < in[r].size(); ++t)
          if (mask[r][t].get<int>()) row.ids.push_back(in[r][t].get<int32_t>());
        std::vector<int32_t> cont;
        for (size_t t = in[r].size(); t < outs[r].size(); ++t) {
          cont.push_back(outs[r][t].get<int32_t>());
          if (cont.back() == eos) break;  // transformers pads finished rows after EOS
        }
        rows.push_back(std::move(row));
        expected.push_back(std::move(cont));
      }
      for (int64_t batch : {int64_t(rows.size()), int64_t(1)}) {
        auto got = decode::generate(m.model, rows, greedy_opts(m.ck.config(), max_new, batch));
        for (size_t r = 0; r < rows.size(); ++r) {
          EXPECT_EQ(got[r].ids, expected[r]) << "row " << r << " batch " << batch;
          EXPECT_EQ(got[r].stop, got[r].ids.back() == eos ? decode::StopReason::Eos : decode::StopReason::Length);
        }
      }
      ++cases;
    }
  }
  EXPECT_GE(cases, 6);
}

namespace {

// Eight rows of mixed lengths from the first fixture's vocabulary.
std::vector<decode::PromptRow> mixed_rows(const decode::SamplingParams& base) {
  std::vector<decode::PromptRow> rows;
  for (int r = 0; r < 8; ++r) {
    decode::PromptRow row{.id = "row" + std::to_string(r), .ids = {}, .sampling = base};
    for (int t = 0; t < 3 + 5 * r % 17; ++t) row.ids.push_back(int32_t(2 + (r * 37 + t * 11) % 250));
    row.sampling.stream = uint32_t(r);
    row.sampling.crn_row_key = row.id;
    rows.push_back(std::move(row));
  }
  return rows;
}

// Every row's logits at every step, for bitwise comparison.
using LogitLog = std::map<std::pair<size_t, int64_t>, std::vector<float>>;

}  // namespace

TEST(Generate, RowsAreBitIdenticalAloneOrInAMixedBatch) {
  const std::string dir = fixtures_with_generate().front();
  for (Compute mode : {Compute::F32, Compute::BF16}) {
    Loaded m(dir, mode);
    for (auto smode : {decode::SamplingMode::Greedy, decode::SamplingMode::Seeded, decode::SamplingMode::Crn}) {
      decode::SamplingParams base{.mode = smode, .temperature = 0.8, .top_p = 0.95, .top_k = 0, .seed = 1234};
      auto rows = mixed_rows(base);
      auto opts = greedy_opts(m.ck.config(), 12, 8);
      LogitLog batched, alone;
      opts.on_logits = [&](size_t i, int64_t step, std::span<const float> l) {
        batched[{i, step}].assign(l.begin(), l.end());
      };
      auto all = decode::generate(m.model, rows, opts);
      for (size_t r = 0; r < rows.size(); ++r) {
        opts.batch = 1;
        opts.on_logits = [&](size_t, int64_t step, std::span<const float> l) {
          alone[{r, step}].assign(l.begin(), l.end());
        };
        auto one = decode::generate(m.model, std::span(rows).subspan(r, 1), opts);
        EXPECT_EQ(one[0].ids, all[r].ids) << "row " << r;
        EXPECT_EQ(one[0].rng_state_sha256, all[r].rng_state_sha256);
      }
      ASSERT_EQ(alone.size(), batched.size());
      for (auto& [k, v] : alone) ASSERT_EQ(v, batched[k]) << "row " << k.first << " step " << k.second;
    }
  }
}

TEST(Generate, SeedsReproduceAndDiffer) {
  const std::string dir = fixtures_with_generate().front();
  Loaded m(dir, Compute::F32);
  auto run = [&](uint64_t seed, int threads) {
    omp_set_num_threads(threads);
    decode::SamplingParams base{.mode = decode::SamplingMode::Seeded, .temperature = 1.0, .top_p = 1.0, .seed = seed};
    auto res = decode::generate(m.model, mixed_rows(base), greedy_opts(m.ck.config(), 10, 3));
    omp_set_num_threads(omp_get_num_procs());
    std::vector<std::vector<int32_t>> ids;
    for (auto& r : res) ids.push_back(r.ids);
    return ids;
  };
  auto a = run(7, 1), b = run(7, 2), c = run(8, 2);
  EXPECT_EQ(a, b);
  EXPECT_NE(a, c);
}

TEST(Generate, RejectsBadRequests) {
  const std::string dir = fixtures_with_generate().front();
  Loaded m(dir, Compute::F32);
  auto opts = greedy_opts(m.ck.config(), 4, 2);
  std::vector<decode::PromptRow> empty{{.id = "e", .ids = {}, .sampling = {}}};
  EXPECT_THROW(decode::generate(m.model, empty, opts), Error);
  std::vector<decode::PromptRow> oov{{.id = "o", .ids = {1, 2, int32_t(m.ck.config().vocab_size)}, .sampling = {}}};
  EXPECT_THROW(decode::generate(m.model, oov, opts), Error);
  std::vector<decode::PromptRow> ok{{.id = "k", .ids = {1, 2}, .sampling = {}}};
  opts.decode_ahead = DecodeRun::kMaxPending;
  EXPECT_THROW(decode::generate(m.model, ok, opts), Error);
  opts.decode_ahead = -1;
  EXPECT_THROW(decode::generate(m.model, ok, opts), Error);
  opts.decode_ahead = 1;
  opts.max_new_tokens = 0;
  EXPECT_THROW(decode::generate(m.model, ok, opts), Error);
  opts.max_new_tokens = m.ck.config().max_position_embeddings;
  EXPECT_THROW(decode::generate(m.model, ok, opts), Error);  // prompt + new tokens exceed the context
}

namespace {

// A backend that "samples where the logits are" the way the CUDA backend does: forward()
// honours ForwardInput::sampling by drawing with sample_core::sample_row (the kernel's
// algorithm) over the CPU model's logits. It lets this machine check generate()'s device
// sampling path (step counters, uniforms, finished rows, logits_rows) against the host path.
class SamplingInForward final : public Model {
 public:
  explicit SamplingInForward(const Model& m) : m_(m) {}
  const ModelConfig& config() const override { return m_.config(); }
  const LayerRange& layers() const override { return m_.layers(); }
  Compute compute() const override { return m_.compute(); }
  bool has_head() const override { return m_.has_head(); }
  std::string backend() const override { return "test"; }
  bool supports_device_sampling() const override { return true; }
  std::unique_ptr<Cache> make_cache(int64_t batch, int64_t capacity) const override {
    return m_.make_cache(batch, capacity);
  }
  ForwardOutput forward(const ForwardInput& in, Cache& cache, const Hooks* hooks = nullptr) const override {
    ForwardInput plain = in;
    plain.sampling = {};
    plain.logits_rows = {};  // every row's logits, to draw from
    ForwardOutput out = m_.forward(plain, cache, hooks);
    const int64_t V = config().vocab_size;
    for (size_t r = 0; r < in.sampling.size(); ++r) {
      if (in.sampling[r].mode != sample_core::kSample) continue;
      ++draws;
      if (!in.logits_rows.empty() && in.logits_rows[r]) ++logits_requested;  // device rows need none
      out.greedy[r] = sample_core::sample_row(out.logits.data() + r * size_t(V), int(V), in.sampling[r]);
    }
    return out;
  }
  using Model::forward;
  // Model's own run (forward() calls in push()), counted.
  std::unique_ptr<DecodeRun> start_decode(Cache& cache, std::span<const int32_t> first_ids,
                                          AttentionForm attention) const override {
    ++runs;
    return Model::start_decode(cache, first_ids, attention);
  }
  mutable int64_t draws = 0, logits_requested = 0, runs = 0;

 private:
  const Model& m_;
};

}  // namespace

TEST(Generate, SamplingInForwardEqualsHostSampling) {
  const std::string dir = fixtures_with_generate().front();
  Loaded m(dir, Compute::F32);
  SamplingInForward dev(m.model);
  for (auto smode : {decode::SamplingMode::Seeded, decode::SamplingMode::Crn}) {
    for (double top_p : {1.0, 0.9}) {
      decode::SamplingParams base{.mode = smode, .temperature = 0.9, .top_p = top_p, .top_k = 0, .seed = 99};
      auto rows = mixed_rows(base);
      rows[2].sampling = {};  // a greedy row among sampled ones
      rows[5].sampling.top_k = 3;
      for (int64_t batch : {3, 1}) {
        auto opts = greedy_opts(m.ck.config(), 9, batch);
        const auto host = decode::generate(m.model, rows, opts);
        const int64_t before = dev.draws;
        const auto on_dev = decode::generate(dev, rows, opts);
        EXPECT_GT(dev.draws, before) << "the sampled rows were not drawn in forward()";
        for (size_t r = 0; r < rows.size(); ++r) {
          EXPECT_EQ(on_dev[r].ids, host[r].ids) << decode::mode_name(smode) << " top_p " << top_p << " batch "
                                                << batch << " row " << r;
          EXPECT_EQ(on_dev[r].stop, host[r].stop);
          EXPECT_EQ(on_dev[r].rng_state_sha256, host[r].rng_state_sha256);
        }
      }
    }
  }
  EXPECT_EQ(dev.logits_requested, 0);
  // ATLAS_DEVICE_SAMPLING=0 forces the host path: forward() is then never asked to sample.
  setenv("ATLAS_DEVICE_SAMPLING", "0", 1);
  const int64_t before = dev.draws;
  decode::SamplingParams base{.mode = decode::SamplingMode::Seeded, .temperature = 0.9, .seed = 3};
  decode::generate(dev, mixed_rows(base), greedy_opts(m.ck.config(), 4, 3));
  unsetenv("ATLAS_DEVICE_SAMPLING");
  EXPECT_EQ(dev.draws, before);
  // Any other value is one error naming the variable, before anything is generated.
  setenv("ATLAS_DEVICE_SAMPLING", "no", 1);
  try {
    decode::generate(dev, mixed_rows(base), greedy_opts(m.ck.config(), 4, 3));
    ADD_FAILURE() << "ATLAS_DEVICE_SAMPLING=no accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("ATLAS_DEVICE_SAMPLING"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("expected 0 or 1, got 'no'"), std::string::npos) << e.what();
  }
  unsetenv("ATLAS_DEVICE_SAMPLING");
  EXPECT_EQ(dev.draws, before);
}

// Decode runs (GenerateOptions::decode_ahead steps pushed ahead) give the tokens of one forward
// call per step: greedy and device-sampled rows, rows that stop on EOS while later steps are
// pushed (those run on, unread), pushes cut short by max_new_tokens, batches of one and several.
TEST(Generate, DecodeRunsGiveTheTokensOfOneCallPerStep) {
  const std::string dir = fixtures_with_generate().front();
  Loaded m(dir, Compute::F32);
  SamplingInForward dev(m.model);
  for (auto smode : {decode::SamplingMode::Greedy, decode::SamplingMode::Crn}) {
    decode::SamplingParams base{.mode = smode, .temperature = 0.9, .top_p = 0.9, .top_k = 0, .seed = 5};
    auto rows = mixed_rows(base);
    rows[1].sampling = {};  // a greedy row among sampled ones
    auto opts = greedy_opts(m.ck.config(), 11, 3);
    opts.decode_ahead = 0;
    const int64_t none = dev.runs;
    const auto plain = decode::generate(dev, rows, opts);
    EXPECT_EQ(dev.runs, none) << "decode_ahead 0 started a run";
    // An EOS that some rows produce while later steps are pushed: row 0's fourth token.
    ASSERT_GE(plain[0].ids.size(), 4u);
    opts.eos_ids = {plain[0].ids[3]};
    const auto ref = decode::generate(dev, rows, opts);
    int stopped_early = 0;
    for (const auto& g : ref) stopped_early += g.stop == decode::StopReason::Eos && g.n_new < 11;
    EXPECT_GE(stopped_early, 1);
    for (int64_t ahead : {1, 2, 5, 20})
      for (int64_t batch : {3, 1, 8}) {
        SCOPED_TRACE(std::string(decode::mode_name(smode)) + " ahead " + std::to_string(ahead) + " batch " +
                     std::to_string(batch));
        opts.decode_ahead = ahead;
        opts.batch = batch;
        const int64_t before = dev.runs;
        const auto got = decode::generate(dev, rows, opts);
        EXPECT_GT(dev.runs, before) << "no run started";
        for (size_t r = 0; r < rows.size(); ++r) {
          EXPECT_EQ(got[r].ids, ref[r].ids) << "row " << r;
          EXPECT_EQ(got[r].stop, ref[r].stop) << "row " << r;
          EXPECT_EQ(got[r].rng_state_sha256, ref[r].rng_state_sha256);
        }
      }
  }
  // An observer of the logits needs them on the host: one call per step, no run.
  const int64_t before = dev.runs;
  auto opts = greedy_opts(m.ck.config(), 6, 2);
  int64_t seen = 0;
  opts.on_logits = [&](size_t, int64_t, std::span<const float>) { ++seen; };
  decode::generate(dev, mixed_rows({}), opts);
  EXPECT_EQ(dev.runs, before);
  EXPECT_GT(seen, 0);
}

// A decode run's contract on the CPU backend (Model's implementation, through decode_chain): the
// tokens of forward() calls fed back, the cache advanced by the steps; bad input refused with
// one error naming the field, before any step.
TEST(Generate, DecodeChainIsForwardFedBack) {
  const std::string dir = fixtures_with_generate().front();
  Loaded m(dir, Compute::F32);
  const int64_t B = 2, P = 5, S = 6;
  std::vector<int32_t> ids, pos;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < P; ++t) {
      ids.push_back(int32_t(3 + 7 * b + 5 * t));
      pos.push_back(int32_t(t));
    }
  const std::vector<uint8_t> mask(size_t(B * P), 1);
  auto run_prefill = [&](Cache& c) {
    return m.model.forward({.batch = B, .tokens = P, .ids = ids, .positions = pos, .mask = mask, .logits_last_only = true}, c)
        .greedy;
  };
  auto c1 = m.model.make_cache(B, P + S);
  std::vector<int32_t> tok = run_prefill(*c1), expected;
  for (int64_t j = 0; j < S; ++j) {
    std::vector<int32_t> p(size_t(B), int32_t(P + j));
    const std::vector<uint8_t> one(size_t(B), 1);
    tok = m.model.forward({.batch = B, .tokens = 1, .ids = tok, .positions = p, .mask = one, .logits_last_only = true}, *c1)
              .greedy;
    expected.insert(expected.end(), tok.begin(), tok.end());
  }
  auto c2 = m.model.make_cache(B, P + S);
  const std::vector<int32_t> first = run_prefill(*c2);
  std::vector<int32_t> chain_pos;
  for (int64_t j = 0; j < S; ++j)
    for (int64_t b = 0; b < B; ++b) chain_pos.push_back(int32_t(P + j));
  EXPECT_EQ(m.model.decode_chain({.batch = B, .steps = S, .first_ids = first, .positions = chain_pos}, *c2), expected);
  EXPECT_EQ(c2->length(), P + S);
  // Bad input: one error each, the cache untouched.
  auto c3 = m.model.make_cache(B, P + S);
  run_prefill(*c3);
  const auto refused = [&](DecodeChainInput in, const std::string& what) {
    try {
      m.model.decode_chain(in, *c3);
      ADD_FAILURE() << "accepted: " << what;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
    }
    EXPECT_EQ(c3->length(), P);
  };
  refused({.batch = B, .steps = S + 1, .first_ids = first, .positions = std::vector<int32_t>(size_t(B * (S + 1)), 6)},
          "exceed its capacity");
  refused({.batch = B, .steps = S, .first_ids = std::span(first).first(1), .positions = chain_pos}, "first_ids");
  refused({.batch = B, .steps = S, .first_ids = first, .positions = std::span(chain_pos).first(3)}, "positions");
  const std::vector<int32_t> oov(size_t(B), int32_t(m.ck.config().vocab_size));
  refused({.batch = B, .steps = S, .first_ids = oov, .positions = chain_pos}, "outside the vocabulary");
  refused({.batch = B, .steps = 0, .first_ids = first, .positions = {}}, "no steps");
  std::vector<int32_t> past = chain_pos;
  past[size_t(2 * B + 1)] = int32_t(m.ck.config().max_position_embeddings);
  refused({.batch = B, .steps = S, .first_ids = first, .positions = past}, "row 1 step 2");
  // A run itself: pushes past kMaxPending, a pop with nothing pushed, wrong-sized positions.
  auto c4 = m.model.make_cache(B, P + DecodeRun::kMaxPending + 1);
  run_prefill(*c4);
  auto run = m.model.start_decode(*c4, first);
  EXPECT_THROW(run->pop(), Error);
  EXPECT_THROW(run->push(std::span(chain_pos).first(1)), Error);
  for (int64_t j = 0; j < DecodeRun::kMaxPending; ++j) {
    const std::vector<int32_t> p(size_t(B), int32_t(P + j));
    run->push(p);
  }
  const std::vector<int32_t> p(size_t(B), int32_t(P + DecodeRun::kMaxPending));
  EXPECT_THROW(run->push(p), Error);
  EXPECT_EQ(run->pending(), DecodeRun::kMaxPending);
  EXPECT_EQ(run->pop(), std::vector<int32_t>(expected.begin(), expected.begin() + B));
}

// Hook edits in generation (model/intervene.h): they run in the prompt's pass and every step's,
// a row's tokens with edits are the same alone or in a mixed batch, an edit at position q leaves
// the tokens made before q is reached as they were (the token at position q makes the next one),
// and an expert routed out at every position changes what is generated.
TEST(Generate, EditsRunInEveryPassAndKeepRowsBatchInvariant) {
  const std::string dir = fixtures_with_generate().front();
  Loaded m(dir, Compute::F32);
  const ModelConfig& cfg = m.ck.config();
  int64_t moe = -1;
  for (int64_t l = 0; l < cfg.num_hidden_layers && moe < 0; ++l)
    if (cfg.is_moe_layer(l)) moe = l;
  ASSERT_GE(moe, 0);
  const std::string L = std::to_string(moe);
  auto rows = mixed_rows({});
  rows.resize(4);
  auto opts = greedy_opts(cfg, 10, 4);
  opts.eos_ids.clear();  // every row runs the full length
  const auto plain = decode::generate(m.model, rows, opts);

  // Routed out everywhere, and one position's residual scaled: the same tokens at batch 4 and 1.
  for (const std::vector<std::string>& specs :
       {std::vector<std::string>{"blocks." + L + ".moe.experts.0,1=route-out"},
        std::vector<std::string>{"blocks." + L + ".hook_resid_post@6=scale:0", "blocks." + L + ".moe.experts.2=zero"}}) {
    SCOPED_TRACE(specs.front());
    Interventions edits(specs, cfg, LayerRange::all(cfg), true);
    edits.check_for_generation();
    opts.edits = &edits;
    opts.batch = 4;
    const auto batched = decode::generate(m.model, rows, opts);
    int changed = 0;
    for (size_t r = 0; r < rows.size(); ++r) {
      opts.batch = 1;
      const auto one = decode::generate(m.model, std::span(rows).subspan(r, 1), opts);
      EXPECT_EQ(one[0].ids, batched[r].ids) << "row " << r;
      changed += batched[r].ids != plain[r].ids;
    }
    EXPECT_GE(changed, 1);
    opts.edits = nullptr;
  }

  // Position q = prompt length + 3 (row 0): the prompt's pass and the first three steps run
  // positions below q, so the first four generated tokens are the unedited run's.
  const int64_t P = int64_t(rows[0].ids.size());
  Interventions late(std::vector<std::string>{"blocks." + L + ".hook_resid_post@" + std::to_string(P + 3) + "=scale:0"},
                     cfg, LayerRange::all(cfg), true);
  opts.edits = &late;
  opts.batch = 1;
  const auto edited = decode::generate(m.model, std::span(rows).subspan(0, 1), opts);
  ASSERT_EQ(edited[0].ids.size(), plain[0].ids.size());
  for (int i = 0; i < 4; ++i) EXPECT_EQ(edited[0].ids[size_t(i)], plain[0].ids[size_t(i)]) << i;
  EXPECT_NE(edited[0].ids, plain[0].ids) << "zeroing the residual at position " << P + 3 << " changed nothing after it";

  // Generation's own refusals.
  const std::string src = (fs::temp_directory_path() / ("atlas_gen_patch_" + std::to_string(::getpid()) + ".safetensors")).string();
  const std::vector<float> zeros(size_t(4 * cfg.hidden_size), 0.0f);
  write_safetensors(src, {{.name = "blocks." + L + ".hook_resid_post", .dtype = DType::F32, .shape = {4, cfg.hidden_size},
                           .data = zeros.data()}},
                    {});
  for (const auto& [spec, want] : std::vector<std::pair<std::string, std::string>>{
           {"logits=zero", "generation cannot edit logits"},
           {"blocks." + L + ".hook_resid_post=patch:" + src, "names its tokens"},
           {"blocks." + L + ".hook_resid_post@4=patch:" + src, "holds 4 tokens; token 4 is not among them"}}) {
    try {
      Interventions(std::vector<std::string>{spec}, cfg, LayerRange::all(cfg), true).check_for_generation();
      ADD_FAILURE() << spec << ": no error";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(want), std::string::npos) << e.what();
    }
  }
  fs::remove(src);

  // Edits that read sibling rows (probe cells' patch:@) index the batch: one batch only.
  Interventions sib(std::vector<std::string>{"blocks." + L + ".hook_resid_post@0=patch:@other"}, cfg, LayerRange::all(cfg),
                    true, true);
  sib.set_sibling_rows({{"other", 0}});
  opts.edits = nullptr;
  opts.row_edits = {nullptr, &sib};
  opts.batch = 1;
  try {
    decode::generate(m.model, std::span(rows).subspan(0, 2), opts);
    ADD_FAILURE() << "sibling rows across batches: no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("run every row in one batch"), std::string::npos) << e.what();
  }
  opts.batch = 2;
  const auto two = decode::generate(m.model, std::span(rows).subspan(0, 2), opts);
  EXPECT_EQ(two[0].ids, plain[0].ids);  // the row that reads nothing
}
