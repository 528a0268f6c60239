// HumanEval throughput: the 164 canonical solutions, each in its own bubblewrap sandbox, with
// a cold cache (every program runs) and a warm one (every program is answered from the
// cache). Reports candidates/second. Needs ../shared/data/humaneval/HumanEval.jsonl.gz and a
// working bwrap; skips with a message otherwise. GSM8K extraction over the 1,319 test answers.
#include <benchmark/benchmark.h>

#include <filesystem>

#include "core/error.h"
#include "eval/gsm8k.h"
#include "eval/humaneval.h"
#include "eval/jsonl.h"

namespace {

namespace fs = std::filesystem;
using namespace atlas::eval;

std::string data_file(const std::string& rel) {
  for (fs::path p = ATLAS_SOURCE_DIR; p.has_parent_path() && p != p.parent_path(); p = p.parent_path())
    if (fs::exists(p / "shared/data" / rel)) return (p / "shared/data" / rel).string();
  return {};
}

const std::vector<HumanEvalProblem>* problems() {
  static std::vector<HumanEvalProblem> p;
  static bool loaded = false;
  if (!loaded) {
    loaded = true;
    const std::string path = data_file("humaneval/HumanEval.jsonl.gz");
    if (!path.empty()) p = load_humaneval(path);
  }
  return p.empty() ? nullptr : &p;
}

void run_canonical(benchmark::State& st, bool warm) {
  const auto* probs = problems();
  if (!probs) {
    st.SkipWithError("../shared/data/humaneval/HumanEval.jsonl.gz absent");
    return;
  }
  std::vector<Candidate> cands;
  for (const auto& p : *probs) cands.push_back({&p, p.canonical_solution});
  EvalOptions opt{.sandbox = SandboxConfig{}, .workers = int(st.range(0)), .cache = nullptr, .progress = false};
  try {
    probe_sandbox(opt.sandbox);
  } catch (const atlas::Error& e) {
    st.SkipWithError(e.what());
    return;
  }
  ResultCache warm_cache;
  if (warm) {
    opt.cache = &warm_cache;
    evaluate_humaneval(cands, opt);  // fill it
  }
  size_t passed = 0;
  for (auto _ : st) {
    ResultCache cold_cache;
    if (!warm) opt.cache = &cold_cache;
    EvalStats stats;
    const auto out = evaluate_humaneval(cands, opt, &stats);
    passed = 0;
    for (const auto& o : out) passed += o.verdict == Verdict::Passed;
    if (stats.executed != (warm ? 0u : cands.size())) st.SkipWithError("unexpected cache behaviour");
  }
  st.counters["candidates_per_s"] =
      benchmark::Counter(double(cands.size()) * double(st.iterations()), benchmark::Counter::kIsRate);
  st.counters["passed"] = double(passed);
}

void BM_HumanEvalCanonicalCold(benchmark::State& st) { run_canonical(st, false); }
void BM_HumanEvalCanonicalWarm(benchmark::State& st) { run_canonical(st, true); }
// arg: workers (0 = the machine's cores)
BENCHMARK(BM_HumanEvalCanonicalCold)->Arg(0)->Arg(1)->Unit(benchmark::kMillisecond)->UseRealTime()->Iterations(2);
BENCHMARK(BM_HumanEvalCanonicalWarm)->Arg(0)->Unit(benchmark::kMillisecond)->UseRealTime();

void BM_Gsm8kExtractTestAnswers(benchmark::State& st) {
  const std::string path = data_file("gsm8k/test.jsonl");
  if (path.empty()) {
    st.SkipWithError("../shared/data/gsm8k/test.jsonl absent");
    return;
  }
  std::vector<std::string> answers;
  for (const auto& l : read_jsonl(path)) answers.push_back(l.value.at("answer").get<std::string>());
  for (auto _ : st)
    for (const auto& a : answers) benchmark::DoNotOptimize(extract_answer(a));
  st.counters["answers_per_s"] =
      benchmark::Counter(double(answers.size()) * double(st.iterations()), benchmark::Counter::kIsRate);
}
BENCHMARK(BM_Gsm8kExtractTestAnswers)->Unit(benchmark::kMillisecond);

}  // namespace
