// Cost of one sampling step on a DeepSeek-V2-sized vocabulary (V = 102400), CPU, one thread.
// Synthetic logits: a smooth pseudo-random row with a spread like a real LM head's.
#include <benchmark/benchmark.h>

#include <cmath>
#include <vector>

#include "decode/rng.h"
#include "decode/sampler.h"

namespace {

using namespace atlas::decode;

std::vector<float> bench_row(size_t V) {
  std::vector<float> l(V);
  for (size_t i = 0; i < V; ++i)
    l[i] = float(3.0 * std::sin(double(i) * 12.9898) * std::cos(double(i) * 0.0137) - 2.0);
  return l;
}

void BM_Greedy(benchmark::State& st) {
  const auto l = bench_row(102400);
  for (auto _ : st) benchmark::DoNotOptimize(greedy_token(l));
}
BENCHMARK(BM_Greedy);

// args: temperature x100, top_p x100, top_k
void BM_SampleStep(benchmark::State& st) {
  const auto l = bench_row(102400);
  RowSampler r({.mode = SamplingMode::Crn, .temperature = double(st.range(0)) / 100,
                .top_p = double(st.range(1)) / 100, .top_k = st.range(2), .seed = 1, .crn_row_key = "bench"});
  for (auto _ : st) benchmark::DoNotOptimize(r.next(l));
}
BENCHMARK(BM_SampleStep)->Args({30, 95, 0})->Args({100, 95, 0})->Args({100, 100, 0})->Args({70, 90, 50});

void BM_CrnUniform(benchmark::State& st) {
  uint64_t t = 0;
  for (auto _ : st) benchmark::DoNotOptimize(crn_uniform(7, "humaneval/17", t++));
}
BENCHMARK(BM_CrnUniform);

void BM_PhiloxUniform(benchmark::State& st) {
  uint64_t t = 0;
  for (auto _ : st) benchmark::DoNotOptimize(philox_uniform({.seed = 7, .stream = 1, .step = t++, .draw = 0}));
}
BENCHMARK(BM_PhiloxUniform);

}  // namespace
