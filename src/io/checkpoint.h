// A model directory: config.json, one or more safetensors files (with
// model.safetensors.index.json when sharded), optional tokenizer files.
//
// Opening verifies before anything runs: the index and the shards agree, every tensor the
// config implies is present with the right shape and a float dtype (BF16/F16/F32), extra
// tensors are reported, and bytes are totalled per dtype. With a layer range only the
// shards holding those layers are mapped (a full load maps every shard the index names,
// so the index can be checked against all of them). Every problem is one line naming the
// file and the tensor or field; open() throws the first (telling how many more there are)
// unless verify_only, which returns them all in report(). A directory holding only
// config.json and the index (no shards) is verified with verify_index_only().
#pragma once

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/json.h"
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

// How the directory stores its weights.
enum class CheckpointLayout {
  Single,     // model.safetensors
  Sharded,    // model.safetensors.index.json + the shards it names
  IndexOnly,  // config.json + index, no shard files at all (weights absent: accounting only)
};
std::string layout_name(CheckpointLayout l);  // "single", "sharded", "index-only"
// Which layout dir has: IndexOnly when the index exists and none of the shards it names do.
// Throws when there is neither model.safetensors nor an index, or both.
CheckpointLayout detect_layout(const std::string& dir);

struct VerificationReport {
  bool ok = true;
  CheckpointLayout layout = CheckpointLayout::Single;
  bool weights_present = true;               // false for IndexOnly
  std::vector<std::string> problems;         // each a one-line message naming file and field
  std::vector<std::string> unexpected;       // tensors present but not implied by the config
  std::map<std::string, DtypeTotals> by_dtype;  // over every tensor in the opened files (index-only:
                                                // every expected tensor at the config's torch_dtype)
  int64_t expected_tensors = 0;              // how many tensors the config (and layer range) needs
  int64_t total_tensors = 0;
  int64_t total_bytes = 0;
  std::optional<int64_t> index_total_size;   // metadata.total_size of the index, if present
  std::optional<bool> index_total_matches;   // set when the comparison was possible (full range)
  std::vector<std::string> files_pinned;     // manifest entries that matched
  std::vector<std::string> shards_opened;    // files mapped (relative to the directory)
  std::vector<std::string> shards_skipped;   // shards not needed by the layer range

  void add_problem(std::string p) {
    ok = false;
    problems.push_back(std::move(p));
  }
  ojson to_json() const;
};

// Accounting without weights: a directory with config.json and model.safetensors.index.json
// (shards may be absent). The index's tensor names must be exactly the config's expected
// names; the expected tensors' bytes at the config's torch_dtype must sum to the index's
// metadata.total_size. Never throws for content problems: they are collected in the report
// (an unreadable config.json / index is still an atlas::Error).
VerificationReport verify_index_only(const std::string& dir, const CheckpointOptions& opts = {});

// Pins: {"files": {"relative/path": "<sha256 hex>"}}; every listed file is hashed and compared.
// Mismatches and missing files become problems naming the file.
void verify_manifest(const std::string& dir, const std::string& manifest_path, VerificationReport& report);
// Every regular file under dir (recursively, hidden files and atlas temp files excluded),
// relative path -> SHA-256, in sorted order. `exclude` (an absolute or dir-relative path) is
// left out, so a manifest written into the directory does not hash itself.
std::map<std::string, std::string> hash_directory(const std::string& dir, const std::string& exclude = {});

class Checkpoint {
 public:
  static Checkpoint open(const std::string& dir, const CheckpointOptions& opts = {});

  const std::string& dir() const { return dir_; }
  const ModelConfig& config() const { return config_; }
  const LayerRange& layers() const { return layers_; }
  const VerificationReport& report() const { return report_; }

  bool has(const std::string& name) const;
  const TensorView& tensor(const std::string& name) const;  // throws naming the tensor
  // "deepseek_v2: 27 layers (1 dense, 26 MoE), 15.71B params, 31.41 GB (BF16) in 5291 tensors, 4 shards"
  std::string summary_line() const;
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
