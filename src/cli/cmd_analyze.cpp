// atlas analyze: routing, hidden-state and output metrics with paired bootstrap intervals,
// from analysis-input files (docs/stats.md), to DIR/analysis.json, DIR/report.md and SVG plots.
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "cli/args.h"
#include "cli/command.h"
#include "core/error.h"
#include "core/file.h"
#include "core/json.h"
#include "core/provenance.h"
#include "stats/analysis.h"
#include "stats/plots.h"
#include "stats/run_adapter.h"

namespace {

using namespace atlas;
namespace fs = std::filesystem;

struct Options {
  std::vector<std::string> inputs;
  std::string out, manifest, model_dir;
  std::vector<std::string> evals;
  uint32_t replicates = 2000, task_replicates = 10000;
  uint64_t seed = 20260729, task_seed = 20260729;
  double level = 0.95;
  bool allow_mixed = false, full_scope = true, weighted = false, no_plots = false;
  int threads = 0;
};

// The analysis as a link of the audit chain (docs/audit.md): "kind" first (compare and audit
// find it there), its inputs as hash-chain records relative to OUT (so the directories can move
// together; the SHA-256 is of the bytes the analysis read), provenance, and content_sha256.
ojson with_chain_fields(const ojson& analysis, const Options& o, bool runs) {
  ojson a = {{"kind", "atlas.analysis"}};
  for (const auto& [k, v] : analysis.items()) {
    if (k != "inputs") {
      a[k] = v;
      continue;
    }
    ojson recs = ojson::array();
    for (const auto& f : v) {
      const std::string path = f["path"].get<std::string>();
      const bool is_eval = std::find(o.evals.begin(), o.evals.end(), path) != o.evals.end();
      const std::string role = !runs ? "analysis-input" : path == o.manifest ? "manifest" : is_eval ? "evaluation" : "run";
      const std::string rel = path_relative_to(path, o.out);
      recs.push_back({{"role", role}, {"path", rel}, {"sha256", f["sha256"]}, {"bytes", int64_t(fs::file_size(path))}});
    }
    a["inputs"] = recs;
  }
  ojson prov = build_provenance();
  prov["manifest_sha256"] = a.contains("manifest_sha256") ? a["manifest_sha256"] : ojson(nullptr);
  a["provenance"] = prov;
  a["content_sha256"] = artifact_content_sha256(a);
  return a;
}

void run(const Options& o) {
  if (!(o.level > 0 && o.level < 1)) fail({}, "--level", "expected a value in (0, 1)");
  cli::set_threads(o.threads);
  const auto t0 = std::chrono::steady_clock::now();
  // Probe run artifacts (a run directory or run.json, "kind": "atlas.probe.run") go through the
  // adapter; everything else is the analysis-input JSON. The two are not mixed in one call.
  size_t n_runs = 0;
  for (const auto& p : o.inputs) {
    const bool run = stats::is_run_artifact(p);
    if (!run && std::filesystem::is_directory(p))
      fail(p + "/run.json", {}, "missing: a directory given to analyze must be a probe run's (atlas run --out DIR)");
    n_runs += run;
  }
  if (n_runs != 0 && n_runs != o.inputs.size())
    fail({}, "inputs", "run artifacts and analysis-input files cannot be mixed in one call");
  if (n_runs == 0 && (!o.manifest.empty() || !o.model_dir.empty() || !o.evals.empty()))
    fail({}, !o.evals.empty() ? "--eval" : "--manifest", "--manifest, --model and --eval apply to probe run artifacts only");
  const stats::AnalysisInput in =
      n_runs ? stats::read_run_artifacts({.runs = o.inputs,
                                          .manifest = o.manifest,
                                          .model_dir = o.model_dir,
                                          .evals = o.evals,
                                          .allow_mismatch = o.allow_mixed})
             : stats::read_analysis_input(o.inputs, o.allow_mixed);
  const auto t1 = std::chrono::steady_clock::now();
  stats::AnalysisOptions opt;
  opt.bootstrap = {.replicates = o.replicates, .seed = o.seed, .level = o.level};
  opt.task_bootstrap = {.replicates = o.task_replicates, .seed = o.task_seed, .level = o.level};
  opt.bootstrap_full_scope = o.full_scope;
  opt.bootstrap_weighted = o.weighted;
  ojson a = with_chain_fields(stats::analyze(in, opt), o, n_runs != 0);
  const auto t2 = std::chrono::steady_clock::now();
  const std::string report = stats::report_markdown(a);
  const std::vector<stats::Plot> plots = o.no_plots ? std::vector<stats::Plot>{} : stats::make_plots(a);
  a["runtime"] = {{"read_seconds", std::chrono::duration<double>(t1 - t0).count()},
                  {"analysis_seconds", std::chrono::duration<double>(t2 - t1).count()},
                  {"threads", omp_get_max_threads()}};

  std::filesystem::create_directories(o.out);
  write_file_atomic(o.out + "/analysis.json", a.dump(1) + "\n");
  write_file_atomic(o.out + "/report.md", report);
  for (const auto& p : plots) write_file_atomic(o.out + "/" + p.file, p.svg);
  std::printf("atlas analyze: %zu cells, %zu sources, %zu domains -> %s/analysis.json, report.md, %zu plots (%.2f s)\n",
              in.cells.size(), in.sources.size(), in.domains.size(), o.out.c_str(), plots.size(),
              std::chrono::duration<double>(t2 - t0).count());
}

cli::Registrar reg{{
    .name = "analyze",
    .help = "Routing, hidden-state and output metrics with paired bootstrap intervals (analysis.json, report.md, SVG)",
    .setup =
        [](CLI::App& app) {
          static Options o;
          app.add_option("inputs", o.inputs, "Analysis-input JSON files (atlas-analysis-input-v1), or probe run directories / run.json")
              ->required()
              ->check(CLI::ExistingPath);
          app.add_option("--manifest", o.manifest, "Run artifacts: the frozen manifest (checked; gives the condition order)")
              ->check(CLI::ExistingFile);
          app.add_option("--model", o.model_dir, "Run artifacts: model directory for the expert count (default: the run's)");
          app.add_option("--eval", o.evals,
                         "Run artifacts: EVAL.json of `atlas eval` over the run (repeatable, e.g. one per shard): "
                         "fills the correctness ledger and per-edge correctness contrasts")
              ->check(CLI::ExistingFile);
          app.add_option("--out", o.out, "Output directory")->required();
          app.add_option("--replicates", o.replicates, "Source bootstrap replicates (0: no intervals)")
              ->capture_default_str();
          app.add_option("--seed", o.seed, "Source bootstrap seed")->capture_default_str();
          app.add_option("--task-replicates", o.task_replicates, "Task bootstrap replicates")->capture_default_str();
          app.add_option("--task-seed", o.task_seed, "Task bootstrap seed")->capture_default_str();
          app.add_option("--level", o.level, "Interval level")->capture_default_str();
          app.add_flag("--allow-mixed", o.allow_mixed,
                       "Analyse inputs from different manifests together; join an EVAL.json of another run or "
                       "manifest (mismatches are counted in analysis.json \"eval\")");
          app.add_flag("--bootstrap-full-scope,!--no-bootstrap-full-scope", o.full_scope,
                       "Resample expert distributions of the full input too (default: on; both scopes, as the seeds)");
          app.add_flag("--bootstrap-weighted", o.weighted,
                       "Also resample weighted-load distributions (default: count loads only; the seeds report "
                       "weighted loads as point values)");
          app.add_flag("--no-plots", o.no_plots, "Do not write SVG plots");
          app.add_option("--threads", o.threads, "OpenMP threads (results do not depend on it)");
          app.footer(
              "Writes OUT/analysis.json (every statistic with its point value and percentile interval,\n"
              "definitions, settings, input hashes; timings only under \"runtime\"), OUT/report.md and\n"
              "SVG plots. Input format and definitions: docs/stats.md. Probe run artifacts (`atlas run`\n"
              "output) are read directly; edges and factorials come from the protocol in --manifest\n"
              "([[edge]], [[factorial]]), else every condition is compared with the first one.");
          app.callback([] { run(o); });
        },
}};

}  // namespace
