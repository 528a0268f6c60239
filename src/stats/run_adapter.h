// Adapter: probe run artifacts (`atlas run`, docs/probe.md) -> stats::AnalysisInput.
//
// Builds the analysis grid directly from DIR/run.json (+ DIR/hidden/*.safetensors) so the
// large route and hidden tensors never pass through the analysis-input JSON. The rules
// (scopes, repeats, edges) are in docs/stats.md, section "Probe run artifacts".
#pragma once

#include <string>
#include <vector>

#include "stats/analysis.h"

namespace atlas::stats {

// True when PATH is a run directory (holding run.json) or a JSON file whose "kind" is
// "atlas.probe.run". Reads only the first few KiB of a file (the artifact writes "kind" first).
bool is_run_artifact(const std::string& path);

struct RunAdapterOptions {
  std::vector<std::string> runs;  // run directories or their run.json (shards of one manifest)
  std::string manifest;           // optional MANIFEST.json: checked against the runs' manifest_sha256
  std::string model_dir;          // optional: where config.json (expert count) is; default: the run's
  // EVAL.json files of `atlas eval` over these runs: their verdicts fill each cell's
  // evaluable / correct / terminal. Each must name the runs' manifest and one run's
  // content_sha256, and every judged cell's text and stop must be the run's; allow_mismatch
  // turns those checks into counts recorded in analysis.json instead of errors.
  std::vector<std::string> evals;
  bool allow_mismatch = false;
};

// Errors name the file and field (missing routes, mismatched manifest, absent hidden tensors, ...).
AnalysisInput read_run_artifacts(const RunAdapterOptions& opt);

}  // namespace atlas::stats
