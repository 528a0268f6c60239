// Checkpoint verification: single file, shards + index, partial loading, manifests, the
// index-only accounting of the real DeepSeek-V2-Lite, and one test per bad-input rule.
#include <gtest/gtest.h>

// Options are built with designated initializers that leave the other fields at their defaults.
#pragma GCC diagnostic ignored "-Wmissing-field-initializers"

#include <filesystem>
#include <fstream>
#include <functional>
#include <set>

#include "core/json.h"
#include "core/sha256.h"
#include "io/checkpoint.h"
#include "io_test_util.h"
#include "io/synthetic.h"
#include "model/presets.h"

using namespace atlas;
using atlas::testing::expect_error;
using atlas::testing::ScratchDir;
namespace fs = std::filesystem;

namespace {

void make_tiny(const std::string& dir, uint64_t max_shard_bytes = 0, DType dtype = DType::BF16) {
  fs::create_directories(dir);
  MakeModelOptions opts{.preset = "tiny", .seed = 0, .dtype = dtype, .max_shard_bytes = {}, .progress = {}};
  if (max_shard_bytes) opts.max_shard_bytes = max_shard_bytes;
  write_model_files(dir, make_preset("tiny", dtype), opts);
}

// Rewrites a safetensors file through `edit`, which may change, drop or add tensors.
struct OwnedTensor {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;
  std::string bytes;
};
void rewrite(const std::string& path, const std::function<void(std::vector<OwnedTensor>&)>& edit) {
  std::vector<OwnedTensor> ts;
  {
    auto f = SafetensorsFile::open(path);
    for (const auto& t : f->tensors())
      ts.push_back({t.name, t.dtype, t.shape, std::string(reinterpret_cast<const char*>(t.data), t.nbytes)});
  }
  edit(ts);
  std::vector<TensorToWrite> w;
  for (const auto& t : ts) w.push_back({.name = t.name, .dtype = t.dtype, .shape = t.shape, .data = t.bytes.data()});
  write_safetensors(path, w);
}

void edit_json(const std::string& path, const std::function<void(ojson&)>& edit) {
  ojson j = ojson::parse(read_file(path));
  edit(j);
  write_file_atomic(path, j.dump(2));
}

std::string real_lite_dir() { return std::string(ATLAS_SOURCE_DIR) + "/../shared/data/deepseek-v2-lite"; }

const std::string kO = "model.layers.0.self_attn.o_proj.weight";  // [64, 4 * 16] in tiny

}  // namespace

TEST(Checkpoint, TinySingleFileVerifiesWithHandCountedTotals) {
  ScratchDir d("ck");
  make_tiny(d.str());
  auto ck = Checkpoint::open(d.str());
  const auto& r = ck.report();
  EXPECT_TRUE(r.ok);
  EXPECT_EQ(r.layout, CheckpointLayout::Single);
  // Counted by hand from the tiny config (H 64, V 1024, 4 heads, qk 16+8, v 16, kv_lora 32,
  // dense 128, 8 experts of 32 + 2 shared, layer 0 dense, layers 1-3 MoE):
  //   global: embed + lm_head 2*1024*64, final norm 64
  //   attention per layer: q 96*64 + kv_a 40*64 + kv_a_norm 32 + kv_b 128*32 + o 64*64 + 2 norms 64
  //   dense MLP: 3*128*64; MoE: gate 8*64 + 8 experts * 3*32*64 + shared 3*64*64
  const int64_t global = 2 * 1024 * 64 + 64;
  const int64_t attn = 96 * 64 + 40 * 64 + 32 + 128 * 32 + 64 * 64 + 2 * 64;
  const int64_t dense = 3 * 128 * 64, moe = 8 * 64 + 8 * 3 * 32 * 64 + 3 * 64 * 64;
  const int64_t params = global + 4 * attn + dense + 3 * moe;
  const int64_t tensors = 3 + 4 * 7 + 3 + 3 * (1 + 8 * 3 + 3);
  EXPECT_EQ(r.expected_tensors, tensors);
  EXPECT_EQ(r.total_tensors, tensors);
  EXPECT_EQ(r.by_dtype.at("BF16").params, params);
  EXPECT_EQ(r.total_bytes, 2 * params);
  EXPECT_TRUE(r.unexpected.empty());
  EXPECT_TRUE(ck.has(kO));
  EXPECT_EQ(ck.tensor(kO).shape, (std::vector<int64_t>{64, 64}));
  expect_error([&] { ck.tensor("model.layers.9.nothing"); }, {"model.layers.9.nothing"});
  EXPECT_NE(ck.summary_line().find("4 layers (1 dense, 3 MoE)"), std::string::npos) << ck.summary_line();
  auto hashes = ck.file_hashes();
  EXPECT_EQ(hashes.at("model.safetensors"), sha256_file(d / "model.safetensors"));
  EXPECT_EQ(hashes.at("config.json"), sha256_file(d / "config.json"));
}

TEST(Checkpoint, F32AndF16CheckpointsVerifyToo) {
  for (DType t : {DType::F32, DType::F16}) {
    ScratchDir d(std::string("ck") + std::string(dtype_name(t)));
    make_tiny(d.str(), 0, t);
    auto ck = Checkpoint::open(d.str());
    EXPECT_TRUE(ck.report().ok);
    EXPECT_EQ(ck.report().by_dtype.size(), 1u);
    EXPECT_EQ(ck.report().by_dtype.count(std::string(dtype_name(t))), 1u);
    EXPECT_EQ(ck.tensor(kO).dtype, t);
  }
}

TEST(Checkpoint, ShardedAgreesWithIndexAndTotalSize) {
  ScratchDir d("ck");
  make_tiny(d.str(), 200'000);
  ASSERT_TRUE(file_exists(d / "model.safetensors.index.json"));
  ASSERT_FALSE(file_exists(d / "model.safetensors"));
  auto ck = Checkpoint::open(d.str());
  const auto& r = ck.report();
  EXPECT_TRUE(r.ok) << (r.problems.empty() ? "" : r.problems[0]);
  EXPECT_EQ(r.layout, CheckpointLayout::Sharded);
  EXPECT_GE(r.shards_opened.size(), 3u);
  ASSERT_TRUE(r.index_total_size.has_value());
  EXPECT_EQ(*r.index_total_size, r.total_bytes);
  EXPECT_EQ(r.index_total_matches, std::optional<bool>(true));
  // Same tensors as the single-file layout.
  ScratchDir s("ck1");
  make_tiny(s.str());
  EXPECT_EQ(Checkpoint::open(s.str()).report().total_bytes, r.total_bytes);
}

TEST(CheckpointPartial, LayerRangeMapsOnlyTheShardsItNeeds) {
  ScratchDir d("ck");
  make_tiny(d.str(), 100'000);
  // Find a shard that holds none of what layers 0-1 need (embedding + layers 0 and 1).
  json ix = read_json_file(d / "model.safetensors.index.json");
  ModelConfig cfg = ModelConfig::load(d / "config.json");
  std::set<std::string> needed_shards, all_shards;
  for (const auto& t : expected_tensors(cfg, {0, 1}))
    needed_shards.insert(ix["weight_map"][t.name].get<std::string>());
  for (const auto& kv : ix["weight_map"].items()) all_shards.insert(kv.value().get<std::string>());
  std::string unneeded;
  for (const auto& s : all_shards)
    if (!needed_shards.count(s)) unneeded = s;
  ASSERT_FALSE(unneeded.empty()) << "test setup: every shard holds part of layers 0-1";
  fs::remove(d / unneeded);

  auto ck = Checkpoint::open(d.str(), {.layers = LayerRange{0, 1}});
  const auto& r = ck.report();
  EXPECT_TRUE(r.ok) << (r.problems.empty() ? "" : r.problems[0]);
  EXPECT_EQ(std::set<std::string>(r.shards_opened.begin(), r.shards_opened.end()), needed_shards);
  EXPECT_NE(std::find(r.shards_skipped.begin(), r.shards_skipped.end(), unneeded), r.shards_skipped.end());
  EXPECT_TRUE(r.unexpected.empty()) << "tensors of other layers are not unexpected: " << r.unexpected.front();
  EXPECT_FALSE(r.index_total_matches.has_value()) << "a partial view cannot be compared with total_size";
  EXPECT_TRUE(ck.has("model.layers.1.mlp.experts.7.down_proj.weight"));
  EXPECT_EQ(ck.layers().last, 1);

  // The full load needs every shard and names the one that is gone.
  expect_error([&] { Checkpoint::open(d.str()); }, {unneeded, "missing shard"});
}

TEST(CheckpointBadInput, MissingShard) {
  ScratchDir d("ck");
  make_tiny(d.str(), 200'000);
  std::string shard = read_json_file(d / "model.safetensors.index.json")["weight_map"][kO].get<std::string>();
  fs::remove(d / shard);
  expect_error([&] { Checkpoint::open(d.str()); }, {d / shard, "missing shard"});
}

TEST(CheckpointBadInput, TruncatedShard) {
  ScratchDir d("ck");
  make_tiny(d.str(), 200'000);
  std::string shard = read_json_file(d / "model.safetensors.index.json")["weight_map"][kO].get<std::string>();
  auto f = SafetensorsFile::open(d / shard);
  std::string last = f->tensors().back().name;
  f.reset();
  atlas::testing::truncate_by(d / shard, 10);
  expect_error([&] { Checkpoint::open(d.str()); }, {d / shard, last, "truncated"});
}

TEST(CheckpointBadInput, MalformedHeader) {
  ScratchDir d("ck");
  make_tiny(d.str());
  {
    std::fstream f(d / "model.safetensors", std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(8);
    f << "[{{";  // the header JSON now starts with garbage
  }
  expect_error([&] { Checkpoint::open(d.str()); }, {d / "model.safetensors", "header", "malformed header JSON"});
}

TEST(CheckpointBadInput, ShapeMismatchNamesFileTensorAndBothShapes) {
  ScratchDir d("ck");
  make_tiny(d.str());
  rewrite(d / "model.safetensors", [](std::vector<OwnedTensor>& ts) {
    for (auto& t : ts)
      if (t.name == kO) t.shape = {32, 128};  // same byte count, wrong shape
  });
  expect_error([&] { Checkpoint::open(d.str()); },
               {d / "model.safetensors", kO, "shape [32, 128], expected [64, 64]"});
}

TEST(CheckpointBadInput, DtypeMismatchNamesFileTensorAndDtype) {
  ScratchDir d("ck");
  make_tiny(d.str());
  rewrite(d / "model.safetensors", [](std::vector<OwnedTensor>& ts) {
    for (auto& t : ts)
      if (t.name == kO) {
        t.dtype = DType::I32;
        t.bytes.resize(t.bytes.size() * 2);
      }
  });
  expect_error([&] { Checkpoint::open(d.str()); }, {d / "model.safetensors", kO, "dtype I32, expected BF16, F16 or F32"});
}

TEST(CheckpointBadInput, MissingTensorAndVerifyOnlyCollectsEverything) {
  ScratchDir d("ck");
  make_tiny(d.str());
  rewrite(d / "model.safetensors", [](std::vector<OwnedTensor>& ts) {
    std::erase_if(ts, [](const OwnedTensor& t) { return t.name == "lm_head.weight"; });
    for (auto& t : ts)
      if (t.name == kO) t.shape = {4096};
    ts.push_back({"model.extra.weight", DType::F32, {2}, std::string(8, '\0')});
  });
  // The first problem (in expected order: o_proj of layer 0) is thrown, the count of the rest told.
  expect_error([&] { Checkpoint::open(d.str()); }, {d / "model.safetensors", kO, "shape [4096]", "1 more"});
  auto ck = Checkpoint::open(d.str(), {.verify_only = true});
  const auto& r = ck.report();
  EXPECT_FALSE(r.ok);
  ASSERT_EQ(r.problems.size(), 2u);
  EXPECT_NE(r.problems[1].find(d / "model.safetensors" + ": lm_head.weight: missing"), std::string::npos)
      << r.problems[1];
  EXPECT_EQ(r.unexpected, (std::vector<std::string>{"model.extra.weight"}));
}

TEST(Checkpoint, UnexpectedTensorsAreReportedNotFatal) {
  ScratchDir d("ck");
  make_tiny(d.str());
  rewrite(d / "model.safetensors", [](std::vector<OwnedTensor>& ts) {
    ts.push_back({"model.layers.0.self_attn.rotary_emb.inv_freq", DType::F32, {4}, std::string(16, '\0')});
  });
  auto ck = Checkpoint::open(d.str());
  EXPECT_TRUE(ck.report().ok);
  EXPECT_EQ(ck.report().unexpected, (std::vector<std::string>{"model.layers.0.self_attn.rotary_emb.inv_freq"}));
  EXPECT_EQ(ck.report().by_dtype.at("F32").tensors, 1);
}

TEST(CheckpointBadInput, IndexAndShardsMustAgree) {
  ScratchDir d("ck");
  make_tiny(d.str(), 200'000);
  const std::string ixp = d / "model.safetensors.index.json";
  json ix = read_json_file(ixp);
  std::string home = ix["weight_map"][kO].get<std::string>();
  std::string other;
  for (const auto& kv : ix["weight_map"].items())
    if (kv.value().get<std::string>() != home) other = kv.value().get<std::string>();
  // The index claims o_proj lives in another shard: both directions of the disagreement show.
  edit_json(ixp, [&](ojson& j) { j["weight_map"][kO] = other; });
  auto ck = Checkpoint::open(d.str(), {.verify_only = true});
  std::string all;
  for (const auto& p : ck.report().problems) all += p + "\n";
  EXPECT_NE(all.find(d / other + ": " + kO + ": listed in"), std::string::npos) << all;
  EXPECT_NE(all.find(d / home + ": " + kO + ": in this shard but"), std::string::npos) << all;

  // A tensor in a shard that the index does not list at all.
  edit_json(ixp, [&](ojson& j) {
    j["weight_map"][kO] = home;
    j["weight_map"].erase("model.norm.weight");
  });
  expect_error([&] { Checkpoint::open(d.str()); }, {"model.norm.weight"});
}

TEST(CheckpointBadInput, IndexTotalSizeMismatch) {
  ScratchDir d("ck");
  make_tiny(d.str(), 200'000);
  edit_json(d / "model.safetensors.index.json", [](ojson& j) { j["metadata"]["total_size"] = 12345; });
  expect_error([&] { Checkpoint::open(d.str()); }, {"model.safetensors.index.json", "metadata.total_size", "12345"});
}

TEST(CheckpointBadInput, ConfigMissingFieldAndUnsupportedValues) {
  ScratchDir d("ck");
  make_tiny(d.str());
  const std::string cfg = d / "config.json";
  const std::string good = read_file(cfg);
  edit_json(cfg, [](ojson& j) { j.erase("hidden_size"); });
  expect_error([&] { Checkpoint::open(d.str()); }, {cfg, "hidden_size", "missing field"});
  write_file_atomic(cfg, good);
  edit_json(cfg, [](ojson& j) { j["scoring_func"] = "sigmoid"; });
  expect_error([&] { Checkpoint::open(d.str()); }, {cfg, "scoring_func", "sigmoid"});
  write_file_atomic(cfg, good);
  edit_json(cfg, [](ojson& j) { j["topk_method"] = "noaux_tc"; });
  expect_error([&] { Checkpoint::open(d.str()); }, {cfg, "topk_method", "noaux_tc"});
  write_file_atomic(cfg, "{\"vocab_size\": 10,");
  expect_error([&] { Checkpoint::open(d.str()); }, {cfg, "malformed JSON"});
  write_file_atomic(cfg, good);
  EXPECT_TRUE(Checkpoint::open(d.str()).report().ok);
}

TEST(CheckpointBadInput, NotAModelDirectory) {
  ScratchDir d("ck");
  expect_error([&] { Checkpoint::open(d.str()); }, {d.str(), "no model.safetensors or model.safetensors.index.json"});
  make_tiny(d.str());
  write_file_atomic(d / "model.safetensors.index.json", "{}");
  expect_error([&] { Checkpoint::open(d.str()); }, {d.str(), "both"});
}

TEST(CheckpointManifest, PinsMatchAndMismatchesNameTheFile) {
  ScratchDir d("ck");
  make_tiny(d.str());
  const std::string man = d / "pins.json";
  auto files = hash_directory(d.str());
  EXPECT_EQ(files.size(), 3u);  // config.json, generation_config.json, model.safetensors
  json j{{"files", files}};
  write_file_atomic(man, j.dump());
  auto ck = Checkpoint::open(d.str(), {.manifest_path = man});
  EXPECT_EQ(ck.report().files_pinned.size(), 3u);

  // A tampered file (same size, one byte changed) is caught and named.
  std::string gen = read_file(d / "generation_config.json");
  gen[gen.size() - 2] = gen[gen.size() - 2] == '1' ? '2' : '1';
  write_file_atomic(d / "generation_config.json", gen);
  expect_error([&] { Checkpoint::open(d.str(), {.manifest_path = man}); },
               {d / "generation_config.json", "sha256", man});
  // A pinned file that is missing is named too.
  j["files"]["tokenizer.json"] = std::string(64, 'a');
  write_file_atomic(man, j.dump());
  auto r = Checkpoint::open(d.str(), {.manifest_path = man, .verify_only = true}).report();
  ASSERT_EQ(r.problems.size(), 2u);
  EXPECT_NE(r.problems[1].find(d / "tokenizer.json"), std::string::npos) << r.problems[1];
  EXPECT_NE(r.problems[1].find("missing"), std::string::npos) << r.problems[1];
  // Malformed pins are an error in the manifest itself.
  write_file_atomic(man, R"({"files": {"config.json": "xyz"}})");
  expect_error([&] { Checkpoint::open(d.str(), {.manifest_path = man}); }, {man, "files.config.json", "SHA-256"});
  write_file_atomic(man, R"({"files": {"../etc/passwd": "0000000000000000000000000000000000000000000000000000000000000000"}})");
  expect_error([&] { Checkpoint::open(d.str(), {.manifest_path = man}); }, {man, "inside the model directory"});
}

TEST(CheckpointIndexOnly, RealDeepSeekV2LiteAccounting) {
  const std::string dir = real_lite_dir();
  if (!fs::exists(dir + "/model.safetensors.index.json")) GTEST_SKIP() << "absent: " << dir;
  EXPECT_EQ(detect_layout(dir), CheckpointLayout::IndexOnly);
  auto r = verify_index_only(dir);
  EXPECT_TRUE(r.ok) << (r.problems.empty() ? "" : r.problems[0]);
  EXPECT_FALSE(r.weights_present);
  EXPECT_EQ(r.expected_tensors, 5291);
  EXPECT_EQ(r.total_tensors, 5291);
  EXPECT_EQ(r.total_bytes, 31'412'968'448);
  EXPECT_EQ(r.index_total_size, std::optional<int64_t>(31'412'968'448));
  EXPECT_EQ(r.index_total_matches, std::optional<bool>(true));
  EXPECT_TRUE(r.unexpected.empty());
  EXPECT_EQ(r.shards_skipped.size(), 4u);
  // Loading weights from it fails, naming the first absent shard.
  expect_error([&] { Checkpoint::open(dir); }, {"model-00001-of-000004.safetensors", "missing shard"});
}

TEST(CheckpointIndexOnly, NameAndSizeDisagreementsAreProblems) {
  // A tiny index-only directory: the sharded checkpoint with its shards removed.
  ScratchDir d("ck");
  make_tiny(d.str(), 200'000);
  for (const auto& e : fs::directory_iterator(d.path))
    if (e.path().extension() == ".safetensors") fs::remove(e.path());
  ASSERT_EQ(detect_layout(d.str()), CheckpointLayout::IndexOnly);
  EXPECT_TRUE(verify_index_only(d.str()).ok);

  const std::string ixp = d / "model.safetensors.index.json";
  edit_json(ixp, [](ojson& j) { j["metadata"]["total_size"] = 1; });
  auto r = verify_index_only(d.str());
  ASSERT_EQ(r.problems.size(), 1u);
  EXPECT_NE(r.problems[0].find("metadata.total_size"), std::string::npos) << r.problems[0];

  edit_json(ixp, [](ojson& j) {
    j["weight_map"].erase(kO);
    j["weight_map"]["model.layers.0.extra.weight"] = "model-00001-of-000005.safetensors";
  });
  r = verify_index_only(d.str());
  EXPECT_FALSE(r.ok);
  EXPECT_NE(r.problems[0].find(kO), std::string::npos) << r.problems[0];
  EXPECT_EQ(r.unexpected, (std::vector<std::string>{"model.layers.0.extra.weight"}));

  edit_json(d / "config.json", [](ojson& j) { j.erase("torch_dtype"); });
  r = verify_index_only(d.str());
  bool named = false;
  for (const auto& p : r.problems) named |= p.find("config.json: torch_dtype") != std::string::npos;
  EXPECT_TRUE(named);
}
