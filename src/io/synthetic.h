// Synthetic checkpoints: deterministic pseudo-random weights for any DeepSeek-V2 config,
// written as a complete model directory (what `atlas make-model` produces).
//
// The generator is counter-based, so every element is a pure function of
// (seed, tensor name, element index): any tensor can be regenerated on its own, and the
// bytes do not depend on the thread count or the order tensors are written in.
//
//   name_hash  = FNV-1a 64-bit over the tensor name's bytes
//   key        = mix64(mix64(seed + G) ^ name_hash)              G = 0x9E3779B97F4A7C15
//   h          = mix64(key + (index + 1) * G)                    one 64-bit word per element
//   z          = h[0:16] + h[16:32] + h[32:48] + h[48:64] - 131070   (four 16-bit fields;
//                Irwin-Hall: symmetric, bell-shaped, |z| <= 131070, var = 4 (65536^2 - 1) / 12)
//   matrices:  value = float(z * (0.02 / sqrt(var)))              std 0.02 (|value| < 0.07)
//   norms:     value = float(1 + z * (0.05 / sqrt(var)))          1 +- 0.05 std: RMSNorm not trivial
//   stored     rounded to the file's dtype with round-to-nearest-even (bf16: f32_to_bf16)
// mix64 is SplitMix64's finaliser (z ^= z>>30; z *= 0xBF58476D1CE4E5B9; z ^= z>>27;
// z *= 0x94D049BB133111EB; z ^= z>>31). Only integer arithmetic and one IEEE multiply(-add)
// in double, so the values are identical on every machine. "Norms" are the tensors whose
// name ends in "norm.weight" (input/post_attention/q_a/kv_a layernorms and model.norm).
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/dtype.h"
#include "io/safetensors.h"
#include "model/config.h"
#include "model/presets.h"

namespace atlas {

uint64_t synthetic_tensor_key(uint64_t seed, std::string_view name);
bool is_norm_weight(std::string_view name);
float synthetic_value(uint64_t key, uint64_t index, bool norm);
// Fills out[0..n) with elements [first, first + n) of a tensor, as float32 (multithreaded).
void synthetic_fill_f32(uint64_t key, bool norm, uint64_t first, float* out, size_t n);

// Where each tensor goes: the order transformers writes DeepSeek-V2 tensors in (embedding,
// final norm, lm_head, then per layer: attention, router, shared experts, routed experts,
// the two layer norms), cut into shards greedily: a shard closes once it holds at least
// max_shard_bytes. max_shard_bytes 0: one shard named model.safetensors.
struct ShardPlan {
  std::string file;  // "model.safetensors" or "model-00001-of-000004.safetensors"
  std::vector<TensorSpec> tensors;
  uint64_t bytes = 0;
};
std::vector<ShardPlan> plan_shards(const ModelConfig& c, DType dtype, uint64_t max_shard_bytes);

struct SyntheticWeights {
  uint64_t seed = 0;
  DType dtype = DType::BF16;
  uint64_t max_shard_bytes = 0;  // see plan_shards
  // Called after each written chunk with (bytes written, total bytes); may be empty.
  std::function<void(uint64_t, uint64_t)> progress;
};

// Writes the weight files (and model.safetensors.index.json when sharded) into dir.
// Streams: memory use is a few chunk buffers, whatever the model size.
void write_synthetic_weights(const std::string& dir, const ModelConfig& c, const SyntheticWeights& w);

// A model directory written all-or-nothing: files go to a hidden staging folder inside
// out_dir and are moved into place by commit(); if anything throws first, the staging
// folder (and out_dir, when this created it) is removed. A non-empty out_dir is refused
// unless force; with force, files of the same name are replaced and stale weight files
// (model*.safetensors, model.safetensors.index.json) that this write does not produce are
// removed so the directory cannot mix two checkpoints. Other files (tokenizer) are kept.
class StagedModelDir {
 public:
  StagedModelDir(std::string out_dir, bool force);
  ~StagedModelDir();
  StagedModelDir(const StagedModelDir&) = delete;
  StagedModelDir& operator=(const StagedModelDir&) = delete;
  const std::string& staging() const { return staging_; }
  std::string path(const std::string& rel) const;  // staging/rel
  void commit();

 private:
  std::string out_, staging_;
  bool created_out_ = false, committed_ = false;
};

struct MakeModelOptions {
  std::string preset = "tiny";
  uint64_t seed = 0;
  DType dtype = DType::BF16;
  std::optional<uint64_t> max_shard_bytes;  // default: the preset's
  std::function<void(uint64_t, uint64_t)> progress;  // see SyntheticWeights
};

// The model files of a preset: config.json, generation_config.json, weights (+ index), all
// into dir (normally StagedModelDir::staging()). Tokenizer files are not written here:
// `make-model` adds them to the same staging folder before committing.
void write_model_files(const std::string& dir, const Preset& preset, const MakeModelOptions& opts);

}  // namespace atlas
