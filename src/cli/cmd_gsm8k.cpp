// atlas gsm8k: score GSM8K completions by strict answer extraction (docs/eval.md).
//
// Problems: the GSM8K test.jsonl ({"question", "answer"} per line; gold = the number after
// "####"). Samples: {"index": N (0-based problem line), "completion": "...", "stop": "eos" |
// "length"}. Output lines, in input order: the sample plus "gold", "extracted" (canonical number
// or null), "method" (boxed, phrase, last_number, none), "strict_complete", "exact" and
// "matches_gold" (diagnostic: equal to gold by any method, the fallback included).
#include <cstdio>
#include <map>

#include "cli/command.h"
#include "core/error.h"
#include "core/file.h"
#include "eval/gsm8k.h"
#include "eval/jsonl.h"

namespace atlas::cli {
namespace {

struct Gsm8kArgs {
  std::string problems, samples, out;
};

void run_gsm8k(const Gsm8kArgs& a) {
  using namespace atlas::eval;
  std::vector<std::string> gold;
  for (const JsonLine& jl : read_jsonl(a.problems)) {
    const JsonReader r(jl.value, a.problems, line_field(jl.line));
    const std::string answer = r.get<std::string>("answer");
    auto g = parse_gold(answer);
    if (!g) fail(a.problems, r.field("answer"), "no number after \"####\"");
    gold.push_back(*g);
  }
  if (gold.empty()) fail(a.problems, {}, "no problems");

  const auto lines = read_jsonl(a.samples);
  // A score over no samples (0/0) is a mistake upstream (a wrong path, a generation that wrote
  // nothing), never a result.
  if (lines.empty()) fail(a.samples, {}, "no samples");
  AtomicFile f(a.out);
  std::map<std::string, size_t> by_method;
  size_t strict = 0, exact = 0, matches = 0;
  for (const JsonLine& jl : lines) {
    const JsonReader r(jl.value, a.samples, line_field(jl.line));
    const int64_t index = r.get<int64_t>("index");
    if (index < 0 || size_t(index) >= gold.size())
      fail(a.samples, r.field("index"),
           "out of range: " + std::to_string(index) + " (the problems file has " + std::to_string(gold.size()) + ")");
    const std::string completion = r.get<std::string>("completion");
    const std::string stop = r.get<std::string>("stop");
    if (stop != "eos" && stop != "length") fail(a.samples, r.field("stop"), "expected \"eos\" or \"length\", got \"" + stop + "\"");
    const Gsm8kScore s = score_gsm8k(completion, stop == "eos", gold[size_t(index)]);
    ojson j;
    for (const auto& [k, v] : jl.value.items()) j[k] = v;
    j["gold"] = gold[size_t(index)];
    j["extracted"] = s.extraction.method == ExtractMethod::None ? ojson(nullptr) : ojson(s.extraction.value);
    j["method"] = method_name(s.extraction.method);
    j["strict_complete"] = s.strict_complete;
    j["exact"] = s.exact;
    j["matches_gold"] = s.matches_gold;
    f.write(j.dump() + "\n");
    ++by_method[std::string(method_name(s.extraction.method))];
    strict += s.strict_complete;
    exact += s.exact;
    matches += s.matches_gold;
  }
  f.commit();
  const size_t n = lines.size();
  std::printf("gsm8k: %zu samples\n", n);
  for (const char* m : {"boxed", "phrase", "last_number", "none"}) std::printf("  method %-12s %zu\n", m, by_method[m]);
  std::printf("  strict_complete     %zu/%zu\n", strict, n);
  std::printf("  strict exact        %zu/%zu = %.2f%%\n", exact, n, n ? 100.0 * double(exact) / double(n) : 0.0);
  std::printf("  matches_gold (diag) %zu/%zu\n", matches, n);
}

Registrar reg{{
    .name = "gsm8k",
    .help = "Score GSM8K completions by strict answer extraction",
    .setup =
        [](CLI::App& app) {
          static Gsm8kArgs a;
          app.add_option("--problems", a.problems, "GSM8K JSONL(.gz) with \"answer\" (gold after ####)")->required();
          app.add_option("--samples", a.samples, "JSONL: {\"index\", \"completion\", \"stop\": \"eos\"|\"length\"}")
              ->required();
          app.add_option("--out", a.out, "Output JSONL (samples plus gold, extracted, method, strict_complete, exact, "
                                          "matches_gold)")
              ->required();
          app.footer(
              "Extraction order: \\boxed{...}, then an answer phrase (\"the answer is\", \"answer:\", \"####\"),\n"
              "then the last number (a diagnostic fallback, never strict). strict_complete = stopped at EOS\n"
              "and an explicit marker; exact = strict_complete and equal to gold. See docs/eval.md.");
          app.callback([] { run_gsm8k(a); });
        },
}};

}  // namespace
}  // namespace atlas::cli
