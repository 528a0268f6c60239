// atlas eval: the GSM8K and HumanEval evaluators applied to a generate-mode probe run
// (docs/eval.md, section "atlas eval RUN_ARTIFACT").
//
// Gold answers and HumanEval tests never enter the run artifact (they are never rendered), so
// the run's manifest supplies them: GSM8K gold from manifest sources[].gold, HumanEval tasks from
// the corpus file recorded in manifest corpora[] (its SHA-256 re-checked). Four ledgers are kept
// apart for every cell: stopping (eos | length), terminal state (final marker / program that
// parses), evaluator coverage (evaluated or why not) and correctness.
#pragma once

#include <cstdint>
#include <string>

#include "core/json.h"
#include "eval/humaneval.h"

namespace atlas::eval {

struct RunEvalOptions {
  std::string run;       // run.json of `atlas run` in generate mode
  std::string manifest;  // the MANIFEST.json the run was made from
  std::string out;       // EVAL.json, written atomically
  EvalOptions humaneval;  // sandbox, workers (cache: optional)
};

struct RunEvalSummary {
  int64_t cells = 0, evaluated = 0, correct = 0;
  ojson ledgers;  // the artifact's "ledgers" section
};

// Bad input (not a generate-mode run, another manifest, a domain whose corpus has no
// evaluator, a missing gold answer or task, a changed corpus file) -> atlas::Error naming the
// file and the cell or field; nothing is written then.
RunEvalSummary eval_run(const RunEvalOptions& opts);

}  // namespace atlas::eval
