// A model directory: config.json, one or more safetensors files (with
// model.safetensors.index.json when sharded), optional tokenizer files.
//
// Opening verifies before anything runs: the index and the shards agree, every tensor the
// config implies is present with the right shape and a float dtype (BF16/F16/F32), extra
// tensors are reported, and bytes are totalled per dtype. With a layer range only the
// shards holding those layers are mapped.
#pragma once

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "io/safetensors.h"
#include "model/config.h"

namespace atlas {

struct CheckpointOptions {
  std::optional<LayerRange> layers;  // none: all layers
  std::string manifest_path;         // optional: {"files": {"relative/path": "sha256"}} pins
  bool verify_only = false;          // collect problems into the report instead of throwing
};

struct DtypeTotals {
  int64_t tensors = 0;
  int64_t params = 0;
  int64_t bytes = 0;
};

struct VerificationReport {
  bool ok = true;
  std::vector<std::string> problems;         // each a one-line message naming file and field
  std::vector<std::string> unexpected;       // tensors present but not implied by the config
  std::map<std::string, DtypeTotals> by_dtype;  // over every tensor in the checkpoint/index
  int64_t total_tensors = 0;
  int64_t total_bytes = 0;
  std::optional<int64_t> index_total_size;   // metadata.total_size of the index, if present
  std::vector<std::string> files_pinned;     // manifest entries that matched
};

class Checkpoint {
 public:
  static Checkpoint open(const std::string& dir, const CheckpointOptions& opts = {});

  const std::string& dir() const { return dir_; }
  const ModelConfig& config() const { return config_; }
  const LayerRange& layers() const { return layers_; }
  const VerificationReport& report() const { return report_; }

  bool has(const std::string& name) const;
  const TensorView& tensor(const std::string& name) const;  // throws naming the tensor
  // Files of the checkpoint with their SHA-256 (computed on demand, cached), for provenance.
  std::map<std::string, std::string> file_hashes() const;

 private:
  std::string dir_;
  ModelConfig config_;
  LayerRange layers_;
  VerificationReport report_;
  std::vector<std::shared_ptr<SafetensorsFile>> files_;
  std::map<std::string, const TensorView*> tensors_;
  mutable std::map<std::string, std::string> hash_cache_;
};

}  // namespace atlas
