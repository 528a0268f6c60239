// atlas eval: score a generate-mode probe run with the GSM8K and HumanEval evaluators
// (docs/eval.md, section "atlas eval RUN_ARTIFACT").
#include <cstdio>

#include "cli/command.h"
#include "core/error.h"
#include "eval/run_eval.h"

namespace atlas::cli {
namespace {

struct EvalArgs {
  std::string run, manifest, out, cache, python = "/usr/bin/python3", bwrap = "bwrap";
  std::vector<std::string> ro_paths;
  int workers = 0;
  double timeout = 5.0;
  uint32_t host_uid_base = 2000000000;
};

void run_eval_cmd(const EvalArgs& a) {
  using namespace atlas::eval;
  if (!(a.timeout > 0)) fail({}, "--timeout", "must be > 0");
  RunEvalOptions o{.run = a.run, .manifest = a.manifest, .out = a.out, .humaneval = {}};
  o.humaneval.sandbox.python = a.python;
  o.humaneval.sandbox.bwrap = a.bwrap;
  o.humaneval.sandbox.host_uid_base = a.host_uid_base;
  if (!a.ro_paths.empty()) o.humaneval.sandbox.ro_paths = a.ro_paths;
  o.humaneval.sandbox.limits.wall_seconds = a.timeout;
  o.humaneval.workers = a.workers;
  o.humaneval.progress = progress_enabled();
  ResultCache cache(a.cache);
  o.humaneval.cache = &cache;
  const RunEvalSummary s = eval_run(o);
  std::printf("eval: %lld cells, %lld evaluated, %lld correct -> %s\n", (long long)s.cells, (long long)s.evaluated,
              (long long)s.correct, a.out.c_str());
  for (const char* l : {"stopping", "terminal", "coverage", "correctness"}) {
    std::printf("  %-12s", l);
    for (const auto& [k, v] : s.ledgers[l].items()) std::printf(" %s=%lld", k.c_str(), (long long)v.get<int64_t>());
    std::printf("\n");
  }
}

Registrar reg{{
    .name = "eval",
    .help = "Score a generate-mode probe run (GSM8K and HumanEval cells) into EVAL.json",
    .setup =
        [](CLI::App& app) {
          static EvalArgs a;
          app.add_option("run", a.run, "run.json of `atlas run` in generate mode")->required();
          app.add_option("--manifest", a.manifest, "The manifest the run was made from (gold answers, corpora)")
              ->required();
          app.add_option("--out", a.out, "Output EVAL.json (written atomically)")->required();
          app.add_option("--workers", a.workers, "Parallel sandboxes (0: the machine's cores)")->capture_default_str();
          app.add_option("--cache", a.cache, "Directory of cached HumanEval results");
          app.add_option("--timeout", a.timeout, "Wall-clock limit per HumanEval candidate, seconds")
              ->capture_default_str();
          app.add_option("--python", a.python, "Python interpreter used inside the sandbox")->capture_default_str();
          app.add_option("--ro-path", a.ro_paths, "Host path visible read-only inside (repeatable; default /usr)");
          app.add_option("--bwrap", a.bwrap, "bubblewrap executable")->capture_default_str();
          app.add_option("--host-uid-base", a.host_uid_base, "When root: sandboxes run as host uid BASE+k")
              ->capture_default_str();
          app.footer(
              "Domains are dispatched by their corpus format in the manifest: gsm8k -> strict GSM8K scoring\n"
              "(gold from manifest sources[].gold), humaneval -> sandboxed tests (tasks from the corpus file,\n"
              "SHA-256 re-checked). Any other domain is an error. Ledgers: stopping, terminal, coverage,\n"
              "correctness; everything except \"runtime\" is deterministic. See docs/eval.md.");
          app.callback([] { run_eval_cmd(a); });
        },
}};

}  // namespace
}  // namespace atlas::cli
