#include "io/synthetic.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <set>

#include "core/bf16.h"
#include "core/error.h"
#include "core/file.h"
#include "io/checkpoint.h"

namespace atlas {
namespace fs = std::filesystem;

namespace {

constexpr uint64_t kGolden = 0x9E3779B97F4A7C15ull;

inline uint64_t mix64(uint64_t z) {
  z ^= z >> 30;
  z *= 0xBF58476D1CE4E5B9ull;
  z ^= z >> 27;
  z *= 0x94D049BB133111EBull;
  z ^= z >> 31;
  return z;
}

// Scale from the Irwin-Hall integer z to a unit-variance value: 1 / sqrt(4 (65536^2 - 1) / 12).
const double kUnit = 1.0 / std::sqrt(4.0 * (65536.0 * 65536.0 - 1.0) / 12.0);
constexpr double kMatrixStd = 0.02;
constexpr double kNormStd = 0.05;

inline float value_of(uint64_t key, uint64_t index, bool norm) {
  uint64_t h = mix64(key + (index + 1) * kGolden);
  int64_t z = int64_t(h & 0xffff) + int64_t((h >> 16) & 0xffff) + int64_t((h >> 32) & 0xffff) +
              int64_t(h >> 48) - 131070;
  double u = double(z) * kUnit;
  return norm ? float(1.0 + u * kNormStd) : float(u * kMatrixStd);
}

// Below this many elements a thread team costs more than it saves (tiny's tensors).
constexpr int64_t kParallelMin = 1 << 16;

// Elements [first, first + n) of one tensor, in the file's dtype, into out (n * size bytes).
void fill_chunk(uint64_t key, bool norm, uint64_t first, DType dtype, uint8_t* out, size_t n) {
  const int64_t N = int64_t(n);
  switch (dtype) {
    case DType::F32: {
      float* o = reinterpret_cast<float*>(out);
#pragma omp parallel for schedule(static) if (N > kParallelMin)
      for (int64_t i = 0; i < N; ++i) o[i] = value_of(key, first + uint64_t(i), norm);
      break;
    }
    case DType::BF16: {
      uint16_t* o = reinterpret_cast<uint16_t*>(out);
#pragma omp parallel for schedule(static) if (N > kParallelMin)
      for (int64_t i = 0; i < N; ++i) o[i] = f32_to_bf16(value_of(key, first + uint64_t(i), norm));
      break;
    }
    case DType::F16: {
      uint16_t* o = reinterpret_cast<uint16_t*>(out);
#pragma omp parallel for schedule(static) if (N > kParallelMin)
      for (int64_t i = 0; i < N; ++i) o[i] = f32_to_f16(value_of(key, first + uint64_t(i), norm));
      break;
    }
    default:
      fail("--dtype", {}, "synthetic weights are F32, F16 or BF16, not " + std::string(dtype_name(dtype)));
  }
}

// Position of a tensor inside its layer in transformers' write order.
int layer_rank(const std::string& name) {
  auto ends = [&](std::string_view s) { return name.size() >= s.size() && name.compare(name.size() - s.size(), s.size(), s) == 0; };
  if (ends("input_layernorm.weight")) return 100;
  if (ends("post_attention_layernorm.weight")) return 101;
  if (name.find(".mlp.experts.") != std::string::npos) return 60;
  if (name.find(".mlp.shared_experts.") != std::string::npos) return 50;
  if (ends(".mlp.gate.weight")) return 40;
  return 0;  // attention, dense MLP: keep expected_tensors' order
}

std::vector<ExpectedTensor> write_order(const ModelConfig& c) {
  auto all = expected_tensors(c, LayerRange::all(c));
  std::vector<ExpectedTensor> out;
  for (const auto& t : all)
    if (t.layer < 0) out.push_back(t);  // embedding, final norm, lm_head first
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    std::vector<ExpectedTensor> layer;
    for (const auto& t : all)
      if (t.layer == l) layer.push_back(t);
    std::stable_sort(layer.begin(), layer.end(),
                     [](const ExpectedTensor& a, const ExpectedTensor& b) { return layer_rank(a.name) < layer_rank(b.name); });
    out.insert(out.end(), layer.begin(), layer.end());
  }
  return out;
}

bool is_weight_file(const std::string& name) {
  return name == "model.safetensors.index.json" ||
         (name.rfind("model", 0) == 0 && name.size() > 12 && name.substr(name.size() - 12) == ".safetensors");
}

}  // namespace

uint64_t synthetic_tensor_key(uint64_t seed, std::string_view name) {
  uint64_t h = 0xcbf29ce484222325ull;  // FNV-1a offset basis
  for (unsigned char ch : name) {
    h ^= ch;
    h *= 0x100000001b3ull;  // FNV prime
  }
  return mix64(mix64(seed + kGolden) ^ h);
}

bool is_norm_weight(std::string_view name) {
  constexpr std::string_view suffix = "norm.weight";
  return name.size() >= suffix.size() && name.substr(name.size() - suffix.size()) == suffix;
}

float synthetic_value(uint64_t key, uint64_t index, bool norm) { return value_of(key, index, norm); }

void synthetic_fill_f32(uint64_t key, bool norm, uint64_t first, float* out, size_t n) {
  fill_chunk(key, norm, first, DType::F32, reinterpret_cast<uint8_t*>(out), n);
}

std::vector<ShardPlan> plan_shards(const ModelConfig& c, DType dtype, uint64_t max_shard_bytes) {
  std::vector<ShardPlan> plan(1);
  for (const auto& t : write_order(c)) {
    if (max_shard_bytes && plan.back().bytes >= max_shard_bytes) plan.emplace_back();
    TensorSpec s{.name = t.name, .dtype = dtype, .shape = t.shape};
    plan.back().bytes += s.nbytes();
    plan.back().tensors.push_back(std::move(s));
  }
  if (!max_shard_bytes) {
    plan[0].file = "model.safetensors";
  } else {
    // transformers' names, including its 6-digit total in the released Lite checkpoint.
    for (size_t i = 0; i < plan.size(); ++i) {
      char buf[64];
      std::snprintf(buf, sizeof buf, "model-%05zu-of-%06zu.safetensors", i + 1, plan.size());
      plan[i].file = buf;
    }
  }
  return plan;
}

void write_synthetic_weights(const std::string& dir, const ModelConfig& c, const SyntheticWeights& w) {
  const auto plan = plan_shards(c, w.dtype, w.max_shard_bytes);
  const size_t esize = dtype_size(w.dtype);
  // 16 Mi elements per chunk: big enough to keep every core busy, small enough to stream.
  constexpr size_t kChunk = size_t(1) << 24;
  std::vector<uint8_t> buf;
  uint64_t total = 0, all = 0, done = 0;
  for (const auto& shard : plan) all += shard.bytes;
  for (const auto& shard : plan) {
    SafetensorsWriter out((fs::path(dir) / shard.file).string(), shard.tensors, {{"format", "pt"}});
    for (const auto& t : shard.tensors) {
      const uint64_t key = synthetic_tensor_key(w.seed, t.name);
      const bool norm = is_norm_weight(t.name);
      const uint64_t n = uint64_t(t.numel());
      for (uint64_t first = 0; first < n; first += kChunk) {
        size_t m = size_t(std::min<uint64_t>(kChunk, n - first));
        buf.resize(m * esize);
        fill_chunk(key, norm, first, w.dtype, buf.data(), m);
        out.write(buf.data(), buf.size());
        done += buf.size();
        if (w.progress) w.progress(done, all);
      }
    }
    out.commit();
    total += shard.bytes;
  }
  if (plan.size() > 1 || w.max_shard_bytes) {
    ojson wm = ojson::object();
    for (const auto& shard : plan)
      for (const auto& t : shard.tensors) wm[t.name] = shard.file;
    ojson index{{"metadata", {{"total_size", total}}}, {"weight_map", wm}};
    write_file_atomic((fs::path(dir) / "model.safetensors.index.json").string(), index.dump(2) + "\n");
  }
}

// ---- staged output directory -----------------------------------------------------------

StagedModelDir::StagedModelDir(std::string out_dir, bool force) : out_(std::move(out_dir)) {
  std::error_code ec;
  if (fs::exists(out_)) {
    if (!fs::is_directory(out_)) fail(out_, {}, "exists and is not a directory");
    if (!fs::is_empty(out_) && !force) fail(out_, {}, "exists and is not empty (use --force to overwrite)");
  } else {
    if (!fs::create_directories(out_, ec)) fail(out_, {}, "cannot create directory: " + ec.message());
    created_out_ = true;
  }
  staging_ = (fs::path(out_) / (".atlas-staging-" + std::to_string(::getpid()))).string();
  fs::remove_all(staging_, ec);
  if (!fs::create_directory(staging_, ec)) fail(staging_, {}, "cannot create directory: " + ec.message());
}

StagedModelDir::~StagedModelDir() {
  std::error_code ec;
  fs::remove_all(staging_, ec);
  if (!committed_ && created_out_) fs::remove_all(out_, ec);
}

std::string StagedModelDir::path(const std::string& rel) const { return (fs::path(staging_) / rel).string(); }

void StagedModelDir::commit() {
  std::set<std::string> staged;
  for (const auto& e : fs::directory_iterator(staging_)) staged.insert(e.path().filename().string());
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(out_)) {
    std::string name = e.path().filename().string();
    if (e.is_regular_file() && is_weight_file(name) && !staged.count(name) && !fs::remove(e.path(), ec))
      fail(e.path().string(), {}, "cannot remove stale weight file: " + ec.message());
  }
  for (const auto& name : staged) {
    fs::rename(fs::path(staging_) / name, fs::path(out_) / name, ec);
    if (ec) fail((fs::path(out_) / name).string(), {}, "cannot move into place: " + ec.message());
  }
  committed_ = true;
}

// ---- make-model ------------------------------------------------------------------------

void write_model_files(const std::string& dir, const Preset& preset, const MakeModelOptions& opts) {
  const std::string label = "preset " + preset.name;
  ModelConfig cfg = ModelConfig::from_json(preset.config, label);
  write_file_atomic((fs::path(dir) / "config.json").string(), preset.config.dump(2) + "\n");
  json gen = json::object();
  if (cfg.bos_token_id) gen["bos_token_id"] = *cfg.bos_token_id;
  if (cfg.eos_token_id) gen["eos_token_id"] = *cfg.eos_token_id;
  write_file_atomic((fs::path(dir) / "generation_config.json").string(), gen.dump(2) + "\n");
  write_synthetic_weights(dir, cfg,
                          {.seed = opts.seed,
                           .dtype = opts.dtype,
                           .max_shard_bytes = opts.max_shard_bytes.value_or(preset.max_shard_bytes),
                           .progress = opts.progress});
}

}  // namespace atlas
