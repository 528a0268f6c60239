// atlas eval: score a generate-mode probe run with the GSM8K and HumanEval evaluators
// (docs/eval.md, section "atlas eval RUN_ARTIFACT").
#include <cstdio>

#include "cli/command.h"
#include "cli/sandbox_flags.h"
#include "core/error.h"
#include "eval/run_eval.h"

namespace atlas::cli {
namespace {

struct EvalArgs {
  std::string run, manifest, out;
  SandboxFlags sandbox;
};

void run_eval_cmd(const EvalArgs& a) {
  using namespace atlas::eval;
  RunEvalOptions o{.run = a.run, .manifest = a.manifest, .out = a.out, .humaneval = sandbox_options(a.sandbox)};
  ResultCache cache(a.sandbox.cache);
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
          add_sandbox_flags(app, a.sandbox);  // HumanEval cells: same flags as `atlas humaneval`
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
