// HumanEval: build the program from a completion, run the task's tests in the sandbox
// (eval/sandbox.h), classify the outcome, cache identical candidates.
//
// The library API is what `atlas humaneval` uses, and what `atlas eval RUN_ARTIFACT` will use:
// turn each code cell into a Candidate {problem, completion}, call evaluate_humaneval(), and
// put the Outcomes into the correctness ledger (not_run / syntax_error feed coverage).
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "eval/sandbox.h"

namespace atlas::eval {

struct HumanEvalProblem {
  std::string task_id;
  std::string prompt;
  std::string entry_point;
  std::string test;                // defines check(candidate)
  std::string canonical_solution;  // the reference body
};

// HumanEval.jsonl(.gz). Errors name the file, the line and the field.
std::vector<HumanEvalProblem> load_humaneval(const std::string& path);

// The six result classes.
enum class Verdict { Passed, AssertionFailed, RuntimeError, Timeout, SyntaxError, NotRun };
std::string_view verdict_name(Verdict v);
std::optional<Verdict> parse_verdict(std::string_view s);
constexpr Verdict kAllVerdicts[] = {Verdict::Passed,  Verdict::AssertionFailed, Verdict::RuntimeError,
                                    Verdict::Timeout, Verdict::SyntaxError,     Verdict::NotRun};

// The program to run, or why there is none.
struct Program {
  bool runnable = false;
  std::string source;      // prompt + code (runnable only)
  std::string extraction;  // "raw" (the completion continues the prompt), "fenced_body",
                           // "fenced_function" (the block restates the signature), or "none"
  std::string reason;      // why not runnable ("empty completion", "unclosed code fence")
};

// Program = prompt + completion. When the completion holds a fenced block (```python ... ```),
// its code is used instead: if the block defines the entry point at top level it follows the
// whole prompt (whose imports and helpers it keeps; the block's def replaces the prompt's
// signature-only one), otherwise it is the body under the prompt's signature. An unclosed
// fence or an empty completion is not runnable (not_run).
Program build_program(const HumanEvalProblem& problem, std::string_view completion);

struct Outcome {
  Verdict verdict = Verdict::NotRun;
  std::string exception;  // Python exception class name, empty when there is none
  std::string detail;     // deterministic: no timings, no host paths
};

// The in-sandbox harness's version: part of every cache key.
std::string harness_version();

// Runtime facts of one sandboxed run (not part of any result; tests use them to check that
// nothing of the sandbox survives it).
struct RunFacts {
  double wall_seconds = 0;
  bool timed_out = false;
  uint64_t pid_namespace = 0;
};

// Runs one program in a fresh sandbox (no cache). Throws atlas::Error only when the sandbox
// itself cannot be set up.
Outcome run_program(const SandboxConfig& config, const HumanEvalProblem& problem, const std::string& program,
                    RunFacts* facts = nullptr);

// SHA-256 over (program, task test, entry point, harness version, sandbox limits).
std::string cache_key(const SandboxConfig& config, const HumanEvalProblem& problem, const std::string& program);

// Results by cache key: in memory for a run, optionally also one JSON file per key in a
// directory that outlives the run. Timeouts are not written to the directory (they depend on
// the machine's load); everything else is a pure function of the key.
class ResultCache {
 public:
  explicit ResultCache(std::string dir = {});
  std::optional<Outcome> get(const std::string& key);
  void put(const std::string& key, const Outcome& o);
  const std::string& dir() const { return dir_; }

 private:
  std::string dir_;
  std::mutex mu_;
  std::map<std::string, Outcome> mem_;
};

struct Candidate {
  const HumanEvalProblem* problem = nullptr;
  std::string completion;
};

struct EvalOptions {
  SandboxConfig sandbox;
  int workers = 0;                 // 0: the machine's cores
  ResultCache* cache = nullptr;    // nullptr: a private in-memory cache for this call
  bool progress = false;           // a progress line on stderr
};

struct EvalStats {
  size_t candidates = 0;
  size_t unique_programs = 0;  // distinct cache keys among runnable candidates
  size_t executed = 0;         // sandboxes actually started (cache misses)
  size_t cache_hits = 0;       // runnable candidates answered from the cache
};

// One Outcome per candidate, in order. Identical programs run once; the rest run in parallel.
std::vector<Outcome> evaluate_humaneval(const std::vector<Candidate>& candidates, const EvalOptions& options,
                                        EvalStats* stats = nullptr);

}  // namespace atlas::eval
