// atlas humaneval: run HumanEval completions against the official tests, each in a fresh
// bubblewrap sandbox (docs/eval.md).
//
// Input lines: {"task_id": "HumanEval/N", "completion": "..."} (other fields are kept).
// Output lines, in input order: the input object plus "extraction" (raw, fenced_body,
// fenced_function, none), "result" (passed, assertion_failed, runtime_error, timeout,
// syntax_error, not_run), "exception" (Python class name or "") and "detail".
#include <cstdio>
#include <map>
#include <thread>

#include "cli/command.h"
#include "cli/sandbox_flags.h"
#include "core/error.h"
#include "core/file.h"
#include "core/provenance.h"
#include "eval/humaneval.h"
#include "eval/jsonl.h"

namespace atlas::cli {
namespace {

struct HumanEvalArgs {
  std::string problems, samples, out;
  SandboxFlags sandbox;
};

void run_humaneval(const HumanEvalArgs& a) {
  RuntimeClock clock;
  using namespace atlas::eval;
  EvalOptions opt = sandbox_options(a.sandbox);  // the flags first: a bad one reads no file
  const auto problems = load_humaneval(a.problems);
  std::map<std::string, const HumanEvalProblem*> by_id;
  for (const auto& p : problems) by_id[p.task_id] = &p;

  const auto lines = read_jsonl(a.samples);
  if (lines.empty()) fail(a.samples, {}, "no samples");  // (as gsm8k: 0/0 is no result)
  std::vector<Candidate> cands;
  for (const JsonLine& jl : lines) {
    const JsonReader r(jl.value, a.samples, line_field(jl.line));
    const std::string id = r.get<std::string>("task_id");
    auto it = by_id.find(id);
    if (it == by_id.end()) fail(a.samples, r.field("task_id"), "unknown task \"" + id + "\" (not in " + a.problems + ")");
    cands.push_back({.problem = it->second, .completion = r.get<std::string>("completion")});
  }

  probe_sandbox(opt.sandbox);  // fails clearly (bwrap missing, no namespaces) before any candidate runs
  ResultCache cache(a.sandbox.cache);
  opt.cache = &cache;
  EvalStats stats;
  const auto outcomes = evaluate_humaneval(cands, opt, &stats);

  AtomicFile f(a.out);
  std::map<Verdict, size_t> counts;
  for (size_t i = 0; i < lines.size(); ++i) {
    ojson j;
    for (const auto& [k, v] : lines[i].value.items()) j[k] = v;
    j["extraction"] = build_program(*cands[i].problem, cands[i].completion).extraction;
    j["result"] = verdict_name(outcomes[i].verdict);
    j["exception"] = outcomes[i].exception;
    j["detail"] = outcomes[i].detail;
    f.write(j.dump() + "\n");
    ++counts[outcomes[i].verdict];
  }
  f.commit();

  std::printf("humaneval: %zu candidates\n", cands.size());
  for (Verdict v : kAllVerdicts) std::printf("  %-17s %zu\n", std::string(verdict_name(v)).c_str(), counts[v]);
  const double rate = cands.empty() ? 0.0 : 100.0 * double(counts[Verdict::Passed]) / double(cands.size());
  std::printf("  pass rate         %zu/%zu = %.2f%%\n", counts[Verdict::Passed], cands.size(), rate);
  std::fprintf(stderr, "humaneval: %zu programs (%zu distinct), %zu run in sandboxes, %zu from the cache, %.2f s\n",
               stats.candidates - counts[Verdict::NotRun], stats.unique_programs, stats.executed, stats.cache_hits,
               clock.seconds());
}

Registrar reg{{
    .name = "humaneval",
    .help = "Run HumanEval completions against the task tests, each in a bubblewrap sandbox",
    .setup =
        [](CLI::App& app) {
          static HumanEvalArgs a;
          app.add_option("--problems", a.problems, "HumanEval.jsonl(.gz): task_id, prompt, entry_point, test")->required();
          app.add_option("--samples", a.samples, "JSONL: {\"task_id\", \"completion\"} per line")->required();
          app.add_option("--out", a.out, "Output JSONL (input lines plus extraction, result, exception, detail)")
              ->required();
          add_sandbox_flags(app, a.sandbox);
          app.footer(
              "Each candidate runs in a fresh sandbox: new user/pid/net/ipc/uts namespaces, uid 65534,\n"
              "no capabilities, read-only /usr, a private tmpfs, rlimits, a wall-clock kill. Without a\n"
              "working bubblewrap the command fails; it never runs code unsandboxed. See docs/eval.md.");
          app.callback([] { run_humaneval(a); });
        },
}};

}  // namespace
}  // namespace atlas::cli
