// Running a frozen manifest: cells in their declared batches, one hash-checked journal per
// source (resumable), then one artifact whose deterministic content is separate from its
// `runtime` section. docs/probe.md documents the journal and artifact schemas.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "core/json.h"

namespace atlas {
struct TensorView;
}

namespace atlas::probe {

struct ShardSpec {
  int64_t index = 0, count = 1;  // 0 <= index < count; sources go to shard (unit % count)
};
// "i/n" with 0 <= i < n; anything else -> atlas::Error naming --shard.
ShardSpec parse_shard(const std::string& spec);

struct RunOptions {
  std::string manifest;   // MANIFEST.json
  std::string out_dir;    // DIR: DIR/journal/*.jsonl, DIR/run.json
  std::string model_dir;  // overrides the manifest's model directory when non-empty
  bool resume = false;
  ShardSpec shard;
  bool sharded = false;   // --shard given (the artifact records it)
  bool progress = false;  // stderr progress lines
  std::string backend = "cpu";  // cpu | cuda (recorded in the artifact's model section)
  int device = 0;               // CUDA device index
};

struct RunSummary {
  int64_t cells = 0, cells_run = 0, cells_resumed = 0, sources = 0, tokens = 0;
  std::string artifact, content_sha256;
};

RunSummary run_manifest(const RunOptions& opts);

struct MergeOptions {
  std::string manifest;
  std::vector<std::string> shard_dirs;
  std::string out_dir;
};
// Joins shard artifacts: every cell of the manifest exactly once, all from the same manifest.
RunSummary merge_runs(const MergeOptions& opts);

// A trace cell's hidden-vector rows (DIR/hidden/*.safetensors) against its result: for each of
// result.stages, the tensor result.hidden_vectors.tensor_prefix + the stage's name exists
// (`find`), is F32 [tokens, hidden] and hashes to the stage's target_sha256 (model/digest.h).
// Returns "" when all hold, else what is wrong (naming the file and tensor); `checked` counts
// the tensors that held. `run --resume` and `atlas audit` both check side files with it.
std::string check_cell_vectors(const ojson& result, const std::function<const TensorView*(const std::string&)>& find,
                               int64_t& checked);

// SHA-256 of an artifact's compact dump without its runtime and content_sha256 keys.
std::string artifact_content_hash(const ojson& artifact);

}  // namespace atlas::probe
