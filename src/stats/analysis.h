// `atlas analyze`: routing, hidden-state and output metrics with paired bootstrap intervals.
//
// The analysis reads an AnalysisInput: a self-describing grid of cells (source x condition
// [x repeat]) with, per cell, any of: per-token top-k routes for every MoE layer, hidden rows
// of the target tokens per stage, generated token ids and the completion ledgers. Its JSON
// form ("atlas-analysis-input-v1") is documented in docs/stats.md; probe artifacts are
// converted to it by an adapter. Every definition is in docs/stats.md and stats/metrics.h.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "core/json.h"
#include "stats/bootstrap.h"

namespace atlas::stats {

struct Source {
  std::string id;
  uint32_t domain = 0;  // index into AnalysisInput::domains
};

struct Cell {
  std::string id;
  uint32_t source = 0, condition = 0;  // indices into sources / conditions
  std::string repeat{};                // seed or tape label; "" when the grid has no repeats
  uint32_t tokens = 0;                 // T: input tokens (with routes), else target rows
  std::vector<uint8_t> target{};       // [T] 1 = token in the target scope (aligned across a source)
  std::vector<int32_t> topk_ids{};     // [L][T][k] empty when the cell has no routes
  std::vector<float> topk_weights{};   // [L][T][k]
  std::vector<float> hidden{};         // [S][R][H] target rows only; empty when absent
  std::optional<std::vector<int32_t>> generated{};
  std::optional<std::string> stop{};  // "eos" | "length"
  std::optional<bool> evaluable{}, correct{};
  std::optional<std::string> terminal{};  // the evaluator's terminal state (final_marker, parses, ...)
};

struct Edge {
  std::string name;
  uint32_t condition = 0, reference = 0;  // metric(condition) vs metric(reference); b = reference
};

// A 2x2 factorial: cell[a][b] is the condition at A level a and B level b.
struct Factorial {
  std::string name{}, factor_a{}, factor_b{};
  uint32_t cell[2][2] = {{0, 0}, {0, 0}};
};

struct InputFile {
  std::string path, sha256;
};

struct AnalysisInput {
  std::vector<InputFile> files;
  std::string manifest_sha256;  // "" when not given
  uint32_t experts = 0, top_k = 0, hidden_dim = 0;
  std::vector<std::string> layers, stages, domains, conditions;
  std::vector<Source> sources;
  std::vector<Cell> cells;
  std::vector<Edge> edges;
  std::vector<Factorial> factorials;
  // Where edges and factorials come from, written to analysis.json "design" (e.g. declared in
  // the input, the manifest's protocol, or the default: every condition vs the first).
  std::string design_origin = "declared in the analysis input";
  // Evaluation verdicts joined from EVAL.json files (run artifacts): what was checked and
  // joined, written to analysis.json "eval"; null when none was given.
  ojson eval_join = nullptr;

  bool has_routes() const { return !layers.empty(); }
  bool has_hidden() const { return !stages.empty(); }
};

// Reads and validates one or more input files; several files are merged (same layers,
// stages, experts, conditions; disjoint cells). Files naming different manifest_sha256 are
// refused unless allow_mixed. Errors name the file and the field.
AnalysisInput read_analysis_input(const std::vector<std::string>& paths, bool allow_mixed);
AnalysisInput parse_analysis_input(const json& j, const std::string& file);
// Checks the grid: indices in range, every (source, condition) present where a family needs
// it, aligned target counts, equal shapes. Called by the readers; for library callers too.
void validate_analysis_input(const AnalysisInput& in);

struct AnalysisOptions {
  BootstrapConfig bootstrap{.replicates = 2000, .seed = 20260729, .level = 0.95};
  BootstrapConfig task_bootstrap{.replicates = 10000, .seed = 20260729, .level = 0.95};
  // Expert distributions (CV, TV, JSD, factorial effects) are resampled for the count loads of
  // both scopes, full input and target, as the seeds report them (seed-system.md 3: two scopes,
  // two aggregations, source-bootstrap intervals). bootstrap_full_scope = false keeps the full
  // scope at point values; bootstrap_weighted adds the weighted loads, which the seeds report
  // as point values only. Statistics not resampled keep their point value and get no interval.
  bool bootstrap_full_scope = true;
  bool bootstrap_weighted = false;
  // Routing replicates: each domain's statistics are evaluated once per distinct multiplicity
  // vector and shared by the replicates that draw it (the same bits). false evaluates every
  // replicate from scratch: the straightforward reference that the tests compare against.
  bool share_domain_replicates = true;
};

// Every number, with definitions and settings; deterministic (no timings, no host).
ojson analyze(const AnalysisInput& in, const AnalysisOptions& opt);

// The seed-style tables of an analysis as Markdown.
std::string report_markdown(const ojson& analysis);

}  // namespace atlas::stats
