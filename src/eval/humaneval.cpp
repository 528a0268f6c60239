#include "eval/humaneval.h"

#include <algorithm>
#include <csignal>
#include <atomic>
#include <cstdio>
#include <exception>
#include <filesystem>
#include <random>
#include <set>
#include <thread>

#include "core/error.h"
#include "core/file.h"
#include "core/json.h"
#include "core/sha256.h"
#include "eval/jsonl.h"

namespace atlas::eval {
namespace {

namespace fs = std::filesystem;

// The harness runs inside the sandbox as `python3 -S -s -B /atlas/harness.py`, reads a nonce
// from stdin and the task from /atlas/task.json, and reports JSON lines on fd 3: first
// {"event":"started"}, then exactly one {"event":"result",...}. See docs/eval.md for what this
// channel does and does not protect against.
constexpr const char* kHarness = R"PY(# atlas HumanEval harness (runs inside the sandbox)
import json
import os
import sys

_write, _exit, _dumps, _getpid = os.write, os._exit, json.dumps, os.getpid
_REPORT_FD = 3


def _where(exc):
    # The innermost frame in the candidate or the test, e.g. ("candidate", 12).
    found = ("", 0)
    tb = exc.__traceback__
    while tb is not None:
        name = tb.tb_frame.f_code.co_filename
        if name in ("<candidate>", "<test>"):
            found = (name[1:-1], tb.tb_lineno)
        tb = tb.tb_next
    return found


def _message(exc):
    try:
        msg = str(exc)
    except BaseException:
        msg = "<unprintable>"
    msg = " ".join(msg.split())
    return msg[:200] + "..." if len(msg) > 200 else msg


def _main():
    pid = _getpid()
    nonce = sys.stdin.readline().strip()
    fallback = (_dumps({"event": "result", "class": "runtime_error", "exception": "MemoryError",
                        "detail": "the harness could not format its report", "nonce": nonce}) + "\n").encode()

    def report(rec):
        if _getpid() != pid:
            _exit(70)  # a copy forked by the candidate never reports
        try:
            rec["nonce"] = nonce
            data = (_dumps(rec) + "\n").encode()
        except BaseException:
            data = fallback
        try:
            _write(_REPORT_FD, data)
        except BaseException:
            _exit(71)

    with open("/atlas/task.json", encoding="utf-8") as f:
        task = json.load(f)
    report({"event": "started"})
    devnull = os.open("/dev/null", os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)

    try:
        program = compile(task["program"], "<candidate>", "exec", dont_inherit=True)
    except (SyntaxError, ValueError) as e:
        line = getattr(e, "lineno", None)
        where = " (candidate line %d)" % line if line else ""
        report({"event": "result", "class": "syntax_error", "exception": type(e).__name__,
                "detail": "%s: %s%s" % (type(e).__name__, getattr(e, "msg", None) or _message(e), where)})
        _exit(0)
    except BaseException as e:  # MemoryError, RecursionError on pathological input
        report({"event": "result", "class": "runtime_error", "exception": type(e).__name__,
                "detail": "%s while compiling: %s" % (type(e).__name__, _message(e))})
        _exit(0)
    test = compile(task["test"], "<test>", "exec", dont_inherit=True)
    entry = task["entry_point"]
    ns = {"__name__": "__candidate__"}
    try:
        exec(program, ns)
        exec(test, ns)
        if entry not in ns:
            raise NameError("entry point %r is not defined" % entry)
        ns["check"](ns[entry])
        rec = {"event": "result", "class": "passed", "exception": "", "detail": ""}
    except BaseException as e:
        name, line = _where(e)
        cls = "assertion_failed" if isinstance(e, AssertionError) and name == "test" else "runtime_error"
        where = " (%s line %d)" % (name, line) if name else ""
        rec = {"event": "result", "class": cls, "exception": type(e).__name__,
               "detail": type(e).__name__ + (": " + _message(e) if _message(e) else "") + where}
        del e
    ns.clear()  # frees the candidate's memory before we format the report
    report(rec)
    _exit(0)


_main()
)PY";

std::string random_nonce() {
  std::random_device rd;
  char buf[33];
  for (int i = 0; i < 4; ++i) std::snprintf(buf + 8 * i, 9, "%08x", unsigned(rd()));
  return std::string(buf, 32);
}

std::string trim(std::string_view s) {
  size_t a = s.find_first_not_of(" \t\r\n");
  if (a == std::string_view::npos) return {};
  size_t b = s.find_last_not_of(" \t\r\n");
  return std::string(s.substr(a, b - a + 1));
}

std::string lower(std::string s) {
  for (char& c : s) c = char(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

std::vector<std::string_view> split_lines(std::string_view s) {
  std::vector<std::string_view> out;
  size_t start = 0;
  while (start <= s.size()) {
    size_t end = s.find('\n', start);
    if (end == std::string_view::npos) end = s.size();
    out.push_back(s.substr(start, end - start));
    start = end + 1;
  }
  return out;
}

// A line that opens or closes a fence: optional indentation, then ```.
bool is_fence(std::string_view line, std::string* info) {
  size_t i = line.find_first_not_of(" \t");
  if (i == std::string_view::npos || line.substr(i, 3) != "```") return false;
  if (info) *info = lower(trim(line.substr(i + 3)));
  return true;
}

bool defines_at_top_level(std::string_view code, const std::string& name) {
  for (std::string_view line : split_lines(code)) {
    std::string_view l = line;
    if (l.substr(0, 6) == "async ") l = l.substr(6);
    while (!l.empty() && l[0] == ' ') l.remove_prefix(1);
    if (l.substr(0, 4) != "def ") continue;
    l = l.substr(4);
    size_t a = l.find_first_not_of(' ');
    if (a == std::string_view::npos) continue;
    l = l.substr(a);
    if (l.substr(0, name.size()) != name) continue;
    l = l.substr(name.size());
    size_t b = l.find_first_not_of(' ');
    if (b != std::string_view::npos && l[b] == '(') return true;
  }
  return false;
}

Outcome from_record(const json& rec, const std::string& where) {
  Outcome o;
  const JsonReader r(rec, where);
  const auto v = parse_verdict(r.get<std::string>("class"));
  if (!v || *v == Verdict::Timeout || *v == Verdict::NotRun) fail(where, "class", "unexpected class");
  o.verdict = *v;
  o.exception = r.get<std::string>("exception");
  o.detail = r.get<std::string>("detail");
  return o;
}

std::string signal_name(int sig) {
  switch (sig) {
    case SIGKILL: return "SIGKILL";
    case SIGSEGV: return "SIGSEGV";
    case SIGABRT: return "SIGABRT";
    case SIGXCPU: return "SIGXCPU";
    case SIGXFSZ: return "SIGXFSZ";
    case SIGTERM: return "SIGTERM";
    case SIGBUS: return "SIGBUS";
    case SIGFPE: return "SIGFPE";
    default: return "signal " + std::to_string(sig);
  }
}

std::string fmt_seconds(double s) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", s);
  return buf;
}

}  // namespace

std::string_view verdict_name(Verdict v) {
  switch (v) {
    case Verdict::Passed: return "passed";
    case Verdict::AssertionFailed: return "assertion_failed";
    case Verdict::RuntimeError: return "runtime_error";
    case Verdict::Timeout: return "timeout";
    case Verdict::SyntaxError: return "syntax_error";
    case Verdict::NotRun: return "not_run";
  }
  return "?";
}

std::optional<Verdict> parse_verdict(std::string_view s) {
  for (Verdict v : kAllVerdicts)
    if (verdict_name(v) == s) return v;
  return std::nullopt;
}

std::vector<HumanEvalProblem> load_humaneval(const std::string& path) {
  std::vector<HumanEvalProblem> out;
  std::set<std::string> seen;
  for (const JsonLine& jl : read_jsonl(path)) {
    const JsonReader r(jl.value, path, line_field(jl.line));
    HumanEvalProblem p{.task_id = r.get<std::string>("task_id"),
                       .prompt = r.get<std::string>("prompt"),
                       .entry_point = r.get<std::string>("entry_point"),
                       .test = r.get<std::string>("test"),
                       .canonical_solution = r.get_or<std::string>("canonical_solution", "")};
    if (p.entry_point.empty()) fail(path, r.field("entry_point"), "empty");
    if (!seen.insert(p.task_id).second) fail(path, r.field("task_id"), "duplicate task \"" + p.task_id + "\"");
    out.push_back(std::move(p));
  }
  if (out.empty()) fail(path, {}, "no problems");
  return out;
}

Program build_program(const HumanEvalProblem& problem, std::string_view completion) {
  if (trim(completion).empty()) return {.runnable = false, .source = {}, .extraction = "none", .reason = "empty completion"};
  const auto lines = split_lines(completion);
  // Fenced blocks: [open line, close line).
  struct Block {
    size_t open, close;
    std::string info;
  };
  std::vector<Block> blocks;
  bool unclosed = false;
  for (size_t i = 0; i < lines.size(); ++i) {
    std::string info;
    if (!is_fence(lines[i], &info)) continue;
    size_t j = i + 1;
    while (j < lines.size() && !(is_fence(lines[j], nullptr) && trim(lines[j]) == "```")) ++j;
    if (j == lines.size()) {
      unclosed = true;
      break;
    }
    blocks.push_back({i, j, info});
    i = j;
  }
  if (blocks.empty() && !unclosed) {
    return {.runnable = true, .source = problem.prompt + std::string(completion), .extraction = "raw", .reason = {}};
  }
  if (blocks.empty())
    return {.runnable = false, .source = {}, .extraction = "none", .reason = "unclosed code fence"};
  const Block* pick = &blocks[0];
  for (const Block& b : blocks)
    if (b.info.empty() || b.info == "python" || b.info == "py" || b.info == "python3") {
      pick = &b;
      break;
    }
  std::string code;
  for (size_t k = pick->open + 1; k < pick->close; ++k) {
    code += lines[k];
    code += '\n';
  }
  if (trim(code).empty()) return {.runnable = false, .source = {}, .extraction = "none", .reason = "empty code block"};
  if (defines_at_top_level(code, problem.entry_point)) {
    std::string src = problem.prompt;
    if (!src.empty() && src.back() != '\n') src += '\n';
    return {.runnable = true, .source = src + "\n" + code, .extraction = "fenced_function", .reason = {}};
  }
  return {.runnable = true, .source = problem.prompt + code, .extraction = "fenced_body", .reason = {}};
}

std::string harness_version() {
  static const std::string v = "atlas-humaneval-harness/1:" + sha256_hex(kHarness);
  return v;
}

std::string cache_key(const SandboxConfig& config, const HumanEvalProblem& problem, const std::string& program) {
  Sha256 h;
  auto field = [&](std::string_view s) {
    const std::string n = std::to_string(s.size()) + ":";
    h.update(n);
    h.update(s);
  };
  field(harness_version());
  field(sandbox_fingerprint(config));
  field(problem.entry_point);
  field(problem.test);
  field(program);
  return h.hex();
}

Outcome run_program(const SandboxConfig& config, const HumanEvalProblem& problem, const std::string& program,
                    RunFacts* facts) {
  const std::string nonce = random_nonce();
  const ojson task{{"program", program}, {"test", problem.test}, {"entry_point", problem.entry_point}};
  const SandboxResult r = run_sandboxed(
      config, {.argv = {config.python, "-S", "-s", "-B", "/atlas/harness.py"},
               .files = {{.name = "harness.py", .content = kHarness}, {.name = "task.json", .content = task.dump()}},
               .stdin_data = nonce + "\n"});
  if (facts) *facts = {.wall_seconds = r.wall_seconds, .timed_out = r.timed_out, .pid_namespace = r.pid_namespace};

  // Read the report channel: lines carrying our nonce; one "started", at most one "result".
  int started = 0, results = 0, foreign = 0;
  std::optional<Outcome> reported;
  size_t start = 0;
  while (start < r.report.size()) {
    size_t end = r.report.find('\n', start);
    const bool complete = end != std::string::npos;
    if (!complete) end = r.report.size();
    const std::string line = r.report.substr(start, end - start);
    start = end + 1;
    const json j = json::parse(line, nullptr, false);
    if (!complete || j.is_discarded() || !j.is_object() || j.value("nonce", "") != nonce) {
      ++foreign;
      continue;
    }
    const std::string ev = j.value("event", "");
    if (ev == "started") {
      ++started;
    } else if (ev == "result") {
      ++results;
      try {
        reported = from_record(j, "harness report");
      } catch (const Error&) {
        ++foreign;
      }
    } else {
      ++foreign;
    }
  }
  if (foreign || started > 1 || results > 1)
    return {.verdict = Verdict::RuntimeError, .exception = {},
            .detail = "the report channel was tampered with; the run is not trusted"};
  if (reported && started == 1) return *reported;
  if (r.timed_out)
    return {.verdict = Verdict::Timeout, .exception = {},
            .detail = "wall clock limit of " + fmt_seconds(config.limits.wall_seconds) + " s"};
  if (r.term_signal == SIGXCPU)
    return {.verdict = Verdict::Timeout, .exception = {},
            .detail = "CPU time limit of " + std::to_string(config.limits.cpu_seconds) + " s"};
  std::string how = r.term_signal ? "killed by " + signal_name(r.term_signal)
                                  : "exited with code " + std::to_string(r.exit_code);
  if (r.term_signal == SIGXFSZ) how += " (file size limit)";
  return {.verdict = Verdict::RuntimeError, .exception = {},
          .detail = (started ? "the program ended without a result: " : "the harness did not start: ") + how};
}

ResultCache::ResultCache(std::string dir) : dir_(std::move(dir)) {
  if (!dir_.empty()) {
    std::error_code ec;
    fs::create_directories(dir_, ec);
    if (ec) fail(dir_, {}, "cannot create the cache directory: " + ec.message());
  }
}

std::optional<Outcome> ResultCache::get(const std::string& key) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = mem_.find(key);
    if (it != mem_.end()) return it->second;
  }
  if (dir_.empty()) return std::nullopt;
  const std::string path = dir_ + "/" + key + ".json";
  if (!file_exists(path)) return std::nullopt;
  // A damaged entry is a miss (it is rewritten), never a result.
  const json j = json::parse(read_file(path), nullptr, false);
  if (j.is_discarded() || !j.is_object() || j.value("key", "") != key) return std::nullopt;
  const auto v = parse_verdict(j.value("result", ""));
  if (!v) return std::nullopt;
  Outcome o{.verdict = *v, .exception = j.value("exception", ""), .detail = j.value("detail", "")};
  std::lock_guard<std::mutex> lock(mu_);
  mem_[key] = o;
  return o;
}

void ResultCache::put(const std::string& key, const Outcome& o) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    mem_[key] = o;
  }
  if (dir_.empty() || o.verdict == Verdict::Timeout) return;
  const ojson j{{"key", key},
                {"harness", harness_version()},
                {"result", verdict_name(o.verdict)},
                {"exception", o.exception},
                {"detail", o.detail}};
  write_file_atomic(dir_ + "/" + key + ".json", j.dump() + "\n");
}

std::vector<Outcome> evaluate_humaneval(const std::vector<Candidate>& candidates, const EvalOptions& options,
                                        EvalStats* stats) {
  ResultCache own;
  ResultCache& cache = options.cache ? *options.cache : own;
  std::vector<Outcome> out(candidates.size());
  std::vector<std::string> keys(candidates.size());
  // Unique programs to run: key -> (problem, source).
  struct Job {
    std::string key;
    const HumanEvalProblem* problem;
    std::string source;
  };
  std::vector<Job> jobs;
  std::set<std::string> queued;
  EvalStats st;
  st.candidates = candidates.size();
  std::set<std::string> unique;
  for (size_t i = 0; i < candidates.size(); ++i) {
    const Candidate& c = candidates[i];
    if (!c.problem) fail("humaneval", "candidate", "no problem");
    Program p = build_program(*c.problem, c.completion);
    if (!p.runnable) {
      out[i] = {.verdict = Verdict::NotRun, .exception = {}, .detail = p.reason};
      continue;
    }
    keys[i] = cache_key(options.sandbox, *c.problem, p.source);
    unique.insert(keys[i]);
    if (cache.get(keys[i])) continue;
    if (queued.insert(keys[i]).second) jobs.push_back({keys[i], c.problem, std::move(p.source)});
  }
  st.unique_programs = unique.size();
  st.executed = jobs.size();

  int workers = options.workers > 0 ? options.workers : int(std::max(1u, std::thread::hardware_concurrency()));
  workers = std::max(1, std::min<int>(workers, int(jobs.size())));
  std::atomic<size_t> next{0}, done{0};
  std::atomic<bool> stop{false};
  std::exception_ptr error;
  std::mutex err_mu;
  auto work = [&] {
    for (;;) {
      const size_t k = next++;
      if (k >= jobs.size() || stop) return;
      try {
        cache.put(jobs[k].key, run_program(options.sandbox, *jobs[k].problem, jobs[k].source));
      } catch (...) {
        std::lock_guard<std::mutex> lock(err_mu);
        if (!error) error = std::current_exception();
        stop = true;
        return;
      }
      const size_t d = ++done;
      if (options.progress) std::fprintf(stderr, "\rhumaneval: %zu/%zu programs run", d, jobs.size());
    }
  };
  std::vector<std::thread> pool;
  for (int w = 0; w < workers; ++w) pool.emplace_back(work);
  for (auto& t : pool) t.join();
  if (options.progress && !jobs.empty()) std::fprintf(stderr, "\n");
  if (error) std::rethrow_exception(error);

  std::set<std::string> ran;
  for (const Job& j : jobs) ran.insert(j.key);
  for (size_t i = 0; i < candidates.size(); ++i) {
    if (keys[i].empty()) continue;
    auto o = cache.get(keys[i]);
    if (!o) fail("humaneval", "cache", "missing result");  // cannot happen: every key ran or was cached
    out[i] = *o;
    if (!ran.erase(keys[i])) ++st.cache_hits;  // the first candidate of a key that ran is not a hit
  }
  if (stats) *stats = st;
  return out;
}

}  // namespace atlas::eval
