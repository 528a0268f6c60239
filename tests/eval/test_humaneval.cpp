// HumanEval in the sandbox: program building, result classes, containment, the cache, and
// all 164 canonical solutions on the real data (skipped visibly when ../shared/data is absent).
#include <arpa/inet.h>
#include <dirent.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <gtest/gtest.h>
#include <random>

#include "core/error.h"
#include "core/file.h"
#include "eval/humaneval.h"

namespace atlas::eval {
namespace {

namespace fs = std::filesystem;

const HumanEvalProblem kAdd{.task_id = "toy/add",
                            .prompt = "import math\n\n\ndef add(a, b):\n    \"\"\"Return a + b.\"\"\"\n",
                            .entry_point = "add",
                            .test = "\n\ndef check(candidate):\n    assert candidate(2, 3) == 5\n"
                                    "    assert candidate(-1, 1) == 0\n",
                            .canonical_solution = "    return a + b\n"};

// Short limits keep the containment tests fast; the defaults are in SandboxLimits.
SandboxConfig test_config() {
  SandboxConfig c;
  c.limits.wall_seconds = 2.0;
  c.limits.cpu_seconds = 4;
  return c;
}

Outcome run(const std::string& completion, RunFacts* facts = nullptr, const SandboxConfig& c = test_config()) {
  const Program p = build_program(kAdd, completion);
  if (!p.runnable) return {.verdict = Verdict::NotRun, .exception = {}, .detail = p.reason};
  return run_program(c, kAdd, p.source, facts);
}

// Host processes still in the given pid namespace (by /proc/PID/ns/pid).
int survivors(uint64_t pid_ns) {
  const std::string want = "pid:[" + std::to_string(pid_ns) + "]";
  int n = 0;
  for (const auto& e : fs::directory_iterator("/proc")) {
    const std::string name = e.path().filename();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    std::error_code ec;
    auto link = fs::read_symlink(e.path() / "ns" / "pid", ec);
    if (!ec && link.string() == want) ++n;
  }
  return n;
}

// ../shared/data next to the checkout, or next to any parent (a worktree lives deeper).
std::string data_dir() {
  for (fs::path p = ATLAS_SOURCE_DIR; p.has_parent_path() && p != p.parent_path(); p = p.parent_path())
    if (fs::is_directory(p / "shared" / "data")) return (p / "shared" / "data").string();
  return std::string(ATLAS_SOURCE_DIR) + "/../shared/data";
}

// ---- program building ------------------------------------------------------------------

TEST(HumanEvalProgram, RawCompletionContinuesThePrompt) {
  const Program p = build_program(kAdd, "    return a + b\n");
  EXPECT_TRUE(p.runnable);
  EXPECT_EQ(p.extraction, "raw");
  EXPECT_EQ(p.source, kAdd.prompt + "    return a + b\n");
}

TEST(HumanEvalProgram, FencedFunctionKeepsPromptAndItsOwnSignature) {
  const Program p = build_program(kAdd, "Sure:\n```python\ndef add(a, b):\n    return a + b\n```\nDone.");
  EXPECT_TRUE(p.runnable);
  EXPECT_EQ(p.extraction, "fenced_function");
  EXPECT_EQ(p.source, kAdd.prompt + "\ndef add(a, b):\n    return a + b\n");
}

TEST(HumanEvalProgram, FencedBodyGoesUnderThePromptSignature) {
  const Program p = build_program(kAdd, "```\n    return a + b\n```");
  EXPECT_EQ(p.extraction, "fenced_body");
  EXPECT_EQ(p.source, kAdd.prompt + "    return a + b\n");
}

TEST(HumanEvalProgram, PrefersThePythonBlock) {
  const Program p = build_program(kAdd, "```text\nnot code\n```\n```py\ndef add(a, b):\n    return b + a\n```\n");
  EXPECT_EQ(p.extraction, "fenced_function");
  EXPECT_NE(p.source.find("return b + a"), std::string::npos);
  EXPECT_EQ(p.source.find("not code"), std::string::npos);
}

TEST(HumanEvalProgram, NotRunnable) {
  EXPECT_EQ(build_program(kAdd, "").reason, "empty completion");
  EXPECT_EQ(build_program(kAdd, " \n\t\n").reason, "empty completion");
  EXPECT_EQ(build_program(kAdd, "```python\ndef add(a, b):\n    return a + b\n").reason, "unclosed code fence");
  EXPECT_EQ(build_program(kAdd, "```python\n\n```").reason, "empty code block");
  EXPECT_FALSE(build_program(kAdd, "```python\ndef add(a, b):\n").runnable);
}

TEST(HumanEvalProgram, CacheKeyCoversProgramTestAndLimits) {
  const SandboxConfig c = test_config();
  const std::string k = cache_key(c, kAdd, "x");
  EXPECT_EQ(k.size(), 64u);
  EXPECT_EQ(k, cache_key(c, kAdd, "x"));
  EXPECT_NE(k, cache_key(c, kAdd, "y"));
  HumanEvalProblem other = kAdd;
  other.test += "    assert candidate(0, 0) == 0\n";
  EXPECT_NE(k, cache_key(c, other, "x"));
  SandboxConfig c2 = c;
  c2.limits.wall_seconds = 3;
  EXPECT_NE(k, cache_key(c2, kAdd, "x"));
}

// ---- result classes --------------------------------------------------------------------

TEST(HumanEvalClasses, Passed) {
  const Outcome o = run("    return a + b\n");
  EXPECT_EQ(o.verdict, Verdict::Passed) << o.detail;
  EXPECT_EQ(o.exception, "");
}

TEST(HumanEvalClasses, FencedChatAnswerPasses) {
  EXPECT_EQ(run("Here is the code:\n```python\nimport math\n\ndef add(a, b):\n    return math.fsum([a, b])\n```\n").verdict,
            Verdict::Passed);
}

TEST(HumanEvalClasses, AssertionFailedInTheTest) {
  const Outcome o = run("    return a - b\n");
  EXPECT_EQ(o.verdict, Verdict::AssertionFailed);
  EXPECT_EQ(o.exception, "AssertionError");
  EXPECT_NE(o.detail.find("test line 4"), std::string::npos) << o.detail;
}

TEST(HumanEvalClasses, AssertInTheCandidateIsARuntimeError) {
  const Outcome o = run("    assert a > 100, 'too small'\n    return a + b\n");
  EXPECT_EQ(o.verdict, Verdict::RuntimeError);
  EXPECT_EQ(o.exception, "AssertionError");
  EXPECT_NE(o.detail.find("candidate line"), std::string::npos) << o.detail;
}

TEST(HumanEvalClasses, RuntimeErrorNamesTheException) {
  Outcome o = run("    return a / 0\n");
  EXPECT_EQ(o.verdict, Verdict::RuntimeError);
  EXPECT_EQ(o.exception, "ZeroDivisionError");
  o = run("    return undefined_name\n");
  EXPECT_EQ(o.exception, "NameError");
  o = run("    return add(a, b)\n");  // infinite recursion
  EXPECT_EQ(o.exception, "RecursionError");
  o = run("    import numpy\n    return a + b\n");  // only the standard library is visible
  EXPECT_EQ(o.exception, "ModuleNotFoundError");
}

TEST(HumanEvalClasses, SyntaxErrors) {
  Outcome o = run("    return a +\n");
  EXPECT_EQ(o.verdict, Verdict::SyntaxError);
  EXPECT_EQ(o.exception, "SyntaxError");
  o = run("  return a + b\n      x = 1\n");
  EXPECT_EQ(o.verdict, Verdict::SyntaxError);
  EXPECT_EQ(o.exception, "IndentationError");
}

TEST(HumanEvalClasses, NotRun) {
  EXPECT_EQ(run("").verdict, Verdict::NotRun);
  EXPECT_EQ(run("```python\ndef add(a, b):\n    return a + b\n").verdict, Verdict::NotRun);
}

TEST(HumanEvalClasses, ExitsAreNotPasses) {
  Outcome o = run("    import sys\n    sys.exit(0)\n");
  EXPECT_EQ(o.verdict, Verdict::RuntimeError);
  EXPECT_EQ(o.exception, "SystemExit");
  o = run("    import os\n    os._exit(0)\n");
  EXPECT_EQ(o.verdict, Verdict::RuntimeError);
  EXPECT_NE(o.detail.find("without a result"), std::string::npos) << o.detail;
}

TEST(HumanEvalClasses, NaiveForgeryIsRejected) {
  // Writes a "passed" record on the report channel without the nonce, then exits.
  const Outcome o = run(
      "    import os\n"
      "    os.write(3, b'{\"event\": \"result\", \"class\": \"passed\", \"exception\": \"\", \"detail\": \"\"}\\n')\n"
      "    print('passed')\n"
      "    os._exit(0)\n");
  EXPECT_EQ(o.verdict, Verdict::RuntimeError);
  EXPECT_NE(o.detail.find("tampered"), std::string::npos) << o.detail;
}

// ---- containment -------------------------------------------------------------------------

TEST(HumanEvalContainment, NoNetworkEvenToHostLoopback) {
  const int srv = ::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
  ASSERT_GE(srv, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::bind(srv, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
  ASSERT_EQ(::listen(srv, 4), 0);
  socklen_t len = sizeof addr;
  ::getsockname(srv, reinterpret_cast<sockaddr*>(&addr), &len);
  const int port = ntohs(addr.sin_port);
  const Outcome o = run("    import socket\n    socket.create_connection(('127.0.0.1', " + std::to_string(port) +
                        "), timeout=1).sendall(b'escaped')\n    return a + b\n");
  EXPECT_EQ(o.verdict, Verdict::RuntimeError) << o.detail;
  EXPECT_EQ(o.exception, "ConnectionRefusedError") << o.detail;  // the sandbox's own, empty loopback
  EXPECT_LT(::accept(srv, nullptr, nullptr), 0);                   // nothing reached the host listener
  ::close(srv);
  // No interface but loopback at all.
  EXPECT_EQ(run("    import socket\n    assert [n for _, n in socket.if_nameindex()] == ['lo']\n    return a + b\n").verdict,
            Verdict::Passed);
}

TEST(HumanEvalContainment, WritesOutsideTheWorkingDirFail) {
  const fs::path dir = fs::temp_directory_path() / ("atlas-eval-host-" + std::to_string(::getpid()));
  fs::create_directories(dir);
  for (const std::string& target : {(dir / "escape").string(), std::string("/usr/escape"), std::string("/escape"),
                                   std::string("/atlas/escape"), std::string("/dev/shm/escape")}) {
    const Outcome o = run("    open('" + target + "', 'w').write('x')\n    return a + b\n");
    EXPECT_EQ(o.verdict, Verdict::RuntimeError) << target;
    EXPECT_TRUE(o.exception == "FileNotFoundError" || o.exception == "OSError" || o.exception == "PermissionError")
        << target << ": " << o.exception;
  }
  EXPECT_TRUE(fs::is_empty(dir));
  EXPECT_FALSE(fs::exists("/usr/escape"));
  EXPECT_FALSE(fs::exists("/escape"));
  fs::remove_all(dir);
  // The working dir itself is writable (the sandbox is not simply broken).
  EXPECT_EQ(run("    open('scratch', 'w').write('x')\n    assert open('/work/scratch').read() == 'x'\n"
                "    return a + b\n")
                .verdict,
            Verdict::Passed);
}

TEST(HumanEvalContainment, HostFilesOutsideTheViewAreInvisible) {
  std::mt19937_64 rng(std::random_device{}());
  const std::string secret = "atlas-secret-" + std::to_string(rng());
  std::vector<std::string> markers = {(fs::temp_directory_path() / ("atlas-marker-" + std::to_string(::getpid()))).string()};
  if (::access("/root", W_OK) == 0) markers.push_back("/root/.atlas-marker-" + std::to_string(::getpid()));
  for (const auto& m : markers) {
    write_file_atomic(m, secret);
    const Outcome o = run("    return open('" + m + "').read()\n");
    EXPECT_EQ(o.verdict, Verdict::RuntimeError) << m;
    EXPECT_EQ(o.exception, "FileNotFoundError") << m;
    EXPECT_EQ(o.detail.find(secret), std::string::npos);
    std::remove(m.c_str());
  }
  // /etc is not in the view either.
  EXPECT_EQ(run("    return open('/etc/hostname').read()\n").exception, "FileNotFoundError");
}

TEST(HumanEvalContainment, ForkBombIsBoundedAndCleanedUp) {
  RunFacts f;
  const Outcome o = run("    import os\n    while True:\n        os.fork()\n", &f);
  EXPECT_EQ(o.verdict, Verdict::RuntimeError) << o.detail;
  EXPECT_EQ(o.exception, "BlockingIOError") << o.detail;  // fork() hit RLIMIT_NPROC
  ASSERT_NE(f.pid_namespace, 0u);
  EXPECT_EQ(survivors(f.pid_namespace), 0);
}

TEST(HumanEvalContainment, MemoryBombHitsTheAddressSpaceLimit) {
  Outcome o = run("    x = bytearray(1 << 30)\n    return a + b\n");
  EXPECT_EQ(o.verdict, Verdict::RuntimeError);
  EXPECT_EQ(o.exception, "MemoryError");
  o = run("    x = []\n    while True:\n        x.append(' ' * (1 << 20))\n");
  EXPECT_EQ(o.verdict, Verdict::RuntimeError);
  EXPECT_EQ(o.exception, "MemoryError");
}

TEST(HumanEvalContainment, InfiniteLoopAndSleepTimeOut) {
  for (const std::string body : {"    while True:\n        pass\n", "    import time\n    time.sleep(60)\n"}) {
    RunFacts f;
    const Outcome o = run(body, &f);
    EXPECT_EQ(o.verdict, Verdict::Timeout) << o.detail;
    EXPECT_TRUE(f.timed_out);
    EXPECT_EQ(o.detail, "wall clock limit of 2 s");
    EXPECT_EQ(survivors(f.pid_namespace), 0);
  }
}

TEST(HumanEvalContainment, CpuLimitAppliesToEveryProcess) {
  // A child spinning past RLIMIT_CPU is killed by the kernel even though the wall clock has time.
  SandboxConfig c = test_config();
  c.limits.cpu_seconds = 1;
  c.limits.wall_seconds = 20;
  RunFacts f;
  const Outcome o = run("    while True:\n        pass\n", &f, c);
  EXPECT_EQ(o.verdict, Verdict::Timeout) << o.detail;
  EXPECT_FALSE(f.timed_out);
  EXPECT_EQ(o.detail, "CPU time limit of 1 s");
}

TEST(HumanEvalContainment, KillingTheParentDoesNothing) {
  // The parent inside is the sandbox's pid 1, which ignores signals from its own namespace;
  // kill(-1) reaches only the sandbox's processes. The harness survives and reports.
  const Outcome o = run(
      "    import os, signal\n"
      "    for pid in (os.getppid(), 1):\n"
      "        os.kill(pid, signal.SIGKILL)\n"
      "    try:\n"
      "        os.kill(-1, signal.SIGKILL)\n"
      "    except ProcessLookupError:\n"
      "        pass\n"
      "    return a + b\n");
  EXPECT_EQ(o.verdict, Verdict::Passed) << o.detail;
  EXPECT_EQ(::kill(::getppid(), 0), 0);  // and our own parent is alive
}

TEST(HumanEvalContainment, BackgroundProcessesDoNotOutliveTheRun) {
  RunFacts f;
  const Outcome o = run(
      "    import os, subprocess, time\n"
      "    subprocess.Popen(['/usr/bin/sleep', '60'], start_new_session=True)\n"
      "    if os.fork() == 0:\n"
      "        os.setsid()\n"
      "        if os.fork() == 0:\n"
      "            time.sleep(60)\n"
      "        os._exit(0)\n"
      "    return a + b\n",
      &f);
  EXPECT_EQ(o.verdict, Verdict::Passed) << o.detail;
  ASSERT_NE(f.pid_namespace, 0u);
  EXPECT_EQ(survivors(f.pid_namespace), 0);
}

TEST(HumanEvalContainment, UnprivilegedInside) {
  EXPECT_EQ(run("    import os\n    assert (os.getuid(), os.getgid()) == (65534, 65534)\n"
                "    try:\n        os.setuid(0)\n    except OSError:\n        return a + b\n")
                .verdict,
            Verdict::Passed);
}

// ---- setup failures ----------------------------------------------------------------------

TEST(HumanEvalSandbox, MissingBwrapIsAClearError) {
  SandboxConfig c = test_config();
  c.bwrap = "/nonexistent/bwrap";
  try {
    probe_sandbox(c);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("bubblewrap"), std::string::npos) << e.what();
  }
}

TEST(HumanEvalSandbox, RefusedNamespacesAreAnErrorNotAFallback) {
  // A stand-in for bwrap on a machine without user namespaces: it fails the way bwrap does.
  const fs::path fake = fs::temp_directory_path() / ("atlas-fake-bwrap-" + std::to_string(::getpid()));
  write_file_atomic(fake, "#!/bin/sh\necho 'bwrap: setting up uid map: Permission denied' >&2\nexit 1\n");
  // Executable by the unprivileged host uid bwrap runs as.
  fs::permissions(fake, fs::perms::owner_all | fs::perms::group_read | fs::perms::group_exec |
                            fs::perms::others_read | fs::perms::others_exec);
  SandboxConfig c = test_config();
  c.bwrap = fake;
  try {
    run_program(c, kAdd, kAdd.prompt + kAdd.canonical_solution);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("uid map: Permission denied"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("never run without it"), std::string::npos) << e.what();
  }
  fs::remove(fake);
}

TEST(HumanEvalSandbox, PythonOutsideTheViewIsRejected) {
  SandboxConfig c = test_config();
  c.python = "/bin/sh";  // /bin -> usr/bin: inside; a path outside is not
  c.ro_paths = {"/dev"};
  EXPECT_THROW(probe_sandbox(c), Error);
}

TEST(HumanEvalSandbox, ProbePasses) { EXPECT_NO_THROW(probe_sandbox(test_config())); }

// ---- cache and the real data -------------------------------------------------------------

TEST(HumanEvalCache, IdenticalCandidatesRunOnceAndDiskCacheIsReused) {
  const fs::path dir = fs::temp_directory_path() / ("atlas-eval-cache-" + std::to_string(::getpid()));
  fs::remove_all(dir);
  std::vector<Candidate> cands = {{&kAdd, "    return a + b\n"},
                                  {&kAdd, "    return a - b\n"},
                                  {&kAdd, "    return a + b\n"},
                                  {&kAdd, ""}};
  EvalOptions opt{.sandbox = test_config(), .workers = 2, .cache = nullptr, .progress = false};
  {
    ResultCache cache(dir.string());
    opt.cache = &cache;
    EvalStats st;
    const auto out = evaluate_humaneval(cands, opt, &st);
    ASSERT_EQ(out.size(), 4u);
    EXPECT_EQ(out[0].verdict, Verdict::Passed);
    EXPECT_EQ(out[1].verdict, Verdict::AssertionFailed);
    EXPECT_EQ(out[2].verdict, Verdict::Passed);
    EXPECT_EQ(out[3].verdict, Verdict::NotRun);
    EXPECT_EQ(st.unique_programs, 2u);
    EXPECT_EQ(st.executed, 2u);
    EXPECT_EQ(st.cache_hits, 1u);
  }
  {
    ResultCache cache(dir.string());  // a new process would see the same directory
    opt.cache = &cache;
    EvalStats st;
    const auto out = evaluate_humaneval(cands, opt, &st);
    EXPECT_EQ(out[1].verdict, Verdict::AssertionFailed);
    EXPECT_EQ(st.executed, 0u);
    EXPECT_EQ(st.cache_hits, 3u);
  }
  fs::remove_all(dir);
}

TEST(HumanEvalData, AllCanonicalSolutionsPassAndBrokenOnesFail) {
  const std::string path = data_dir() + "/humaneval/HumanEval.jsonl.gz";
  if (!file_exists(path)) GTEST_SKIP() << "absent: " << path;
  const auto problems = load_humaneval(path);
  ASSERT_EQ(problems.size(), 164u);
  std::vector<Candidate> cands;
  for (const auto& p : problems) cands.push_back({&p, p.canonical_solution});
  // Broken variants of a few: a wrong constant, a body that raises, a syntax error.
  cands.push_back({&problems[0], "    return not True\n"});
  cands.push_back({&problems[2], "    raise KeyError('x')\n"});
  cands.push_back({&problems[4], "    return sum(numbers) /\n"});
  EvalOptions opt{.sandbox = SandboxConfig{}, .workers = 0, .cache = nullptr, .progress = false};
  const auto out = evaluate_humaneval(cands, opt);
  for (size_t i = 0; i < problems.size(); ++i)
    EXPECT_EQ(out[i].verdict, Verdict::Passed) << problems[i].task_id << ": " << out[i].detail;
  EXPECT_EQ(out[164].verdict, Verdict::AssertionFailed);
  EXPECT_EQ(out[165].verdict, Verdict::RuntimeError);
  EXPECT_EQ(out[165].exception, "KeyError");
  EXPECT_EQ(out[166].verdict, Verdict::SyntaxError);
}

TEST(HumanEvalData, LoaderErrorsNameFileAndLine) {
  const fs::path p = fs::temp_directory_path() / ("atlas-he-bad-" + std::to_string(::getpid()) + ".jsonl");
  write_file_atomic(p, "{\"task_id\": \"a\", \"prompt\": \"\", \"entry_point\": \"f\", \"test\": \"\"}\n{\"task_id\": 3}\n");
  try {
    load_humaneval(p);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("line 2.task_id"), std::string::npos) << e.what();
  }
  write_file_atomic(p, "{\"task_id\": \"a\",\n");
  EXPECT_THROW(load_humaneval(p), Error);
  fs::remove(p);
  EXPECT_THROW(load_humaneval("/nonexistent/HumanEval.jsonl.gz"), Error);
}

}  // namespace
}  // namespace atlas::eval
