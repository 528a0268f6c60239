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
#include "core/error.h"
#include "core/file.h"
#include "core/provenance.h"
#include "eval/humaneval.h"
#include "eval/jsonl.h"

namespace atlas::cli {
namespace {

struct HumanEvalArgs {
  std::string problems, samples, out, cache, python = "/usr/bin/python3", bwrap = "bwrap";
  std::vector<std::string> ro_paths;
  int workers = 0;
  double timeout = 5.0;
  uint32_t host_uid_base = 2000000000;
  uint64_t memory_mib = 256, processes = 64, cpu_seconds = 10, file_size_mib = 16, tmpfs_mib = 16;
};

void run_humaneval(const HumanEvalArgs& a) {
  RuntimeClock clock;
  using namespace atlas::eval;
  const auto problems = load_humaneval(a.problems);
  std::map<std::string, const HumanEvalProblem*> by_id;
  for (const auto& p : problems) by_id[p.task_id] = &p;

  const auto lines = read_jsonl(a.samples);
  std::vector<Candidate> cands;
  for (const JsonLine& jl : lines) {
    const JsonReader r(jl.value, a.samples, line_field(jl.line));
    const std::string id = r.get<std::string>("task_id");
    auto it = by_id.find(id);
    if (it == by_id.end()) fail(a.samples, r.field("task_id"), "unknown task \"" + id + "\" (not in " + a.problems + ")");
    cands.push_back({.problem = it->second, .completion = r.get<std::string>("completion")});
  }

  EvalOptions opt;
  opt.sandbox.python = a.python;
  opt.sandbox.bwrap = a.bwrap;
  opt.sandbox.host_uid_base = a.host_uid_base;
  if (!a.ro_paths.empty()) opt.sandbox.ro_paths = a.ro_paths;
  opt.sandbox.limits = {.address_space_bytes = a.memory_mib << 20,
                        .processes = a.processes,
                        .cpu_seconds = a.cpu_seconds,
                        .file_size_bytes = a.file_size_mib << 20,
                        .open_files = 256,
                        .tmpfs_bytes = a.tmpfs_mib << 20,
                        .wall_seconds = a.timeout};
  if (!(a.timeout > 0)) fail({}, "--timeout", "must be > 0");
  opt.workers = a.workers;
  opt.progress = progress_enabled();
  probe_sandbox(opt.sandbox);  // fails clearly (bwrap missing, no namespaces) before any candidate runs
  ResultCache cache(a.cache);
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
          app.add_option("--workers", a.workers, "Parallel sandboxes (0: the machine's cores)")->capture_default_str();
          app.add_option("--cache", a.cache, "Directory of cached results (kept across runs; timeouts are not cached)");
          app.add_option("--timeout", a.timeout, "Wall-clock limit per candidate, seconds")->capture_default_str();
          app.add_option("--memory-mib", a.memory_mib, "Address-space limit (RLIMIT_AS), MiB")->capture_default_str();
          app.add_option("--processes", a.processes, "Process limit per sandbox (RLIMIT_NPROC)")->capture_default_str();
          app.add_option("--cpu-seconds", a.cpu_seconds, "CPU-time limit per process (RLIMIT_CPU)")->capture_default_str();
          app.add_option("--file-size-mib", a.file_size_mib, "File-size limit (RLIMIT_FSIZE), MiB")->capture_default_str();
          app.add_option("--tmpfs-mib", a.tmpfs_mib, "Size of the private /work tmpfs, MiB")->capture_default_str();
          app.add_option("--python", a.python, "Python interpreter used inside the sandbox")->capture_default_str();
          app.add_option("--ro-path", a.ro_paths, "Host path visible read-only inside (repeatable; default /usr)");
          app.add_option("--bwrap", a.bwrap, "bubblewrap executable")->capture_default_str();
          app.add_option("--host-uid-base", a.host_uid_base,
                         "When root: run each sandbox as host uid BASE+k (0: as root; RLIMIT_NPROC is then "
                         "not enforced)")
              ->capture_default_str();
          app.footer(
              "Each candidate runs in a fresh sandbox: new user/pid/net/ipc/uts namespaces, uid 65534,\n"
              "no capabilities, read-only /usr, a private tmpfs, rlimits, a wall-clock kill. Without a\n"
              "working bubblewrap the command fails; it never runs code unsandboxed. See docs/eval.md.");
          app.callback([] { run_humaneval(a); });
        },
}};

}  // namespace
}  // namespace atlas::cli
