// CUDA forward-pass throughput on a model directory (issue 5 baseline): prefill of B prompts x
// T tokens, and decode steps at batch 1 and 128 after a 256-token prefill.
//   ATLAS_BENCH_MODEL=/path/to/model build/bench/cuda/atlas_cuda_model_bench
// Without a GPU or without ATLAS_BENCH_MODEL every case is skipped. Wall time of whole forward
// calls (each returns host logits, so it includes the device work and the logits copy).
// Counters: tokens/s (items_per_second). Results: docs/benchmarks.md and docs/cuda-sessions.md.
#include <benchmark/benchmark.h>

#include <chrono>
#include <cstdlib>
#include <memory>

#include "backend/cuda/cuda_ops.h"
#include "io/checkpoint.h"
#include "model/loader.h"

using namespace atlas;

namespace {

struct Loaded {
  std::unique_ptr<Checkpoint> ck;
  std::unique_ptr<Model> model;
  double load_s = 0;
};

Loaded* model_or_skip(benchmark::State& state) {
  static std::unique_ptr<Loaded> m;
  const char* dir = std::getenv("ATLAS_BENCH_MODEL");
  if (cuda::device_count() == 0 || !dir) {
    state.SkipWithError("needs a CUDA device and ATLAS_BENCH_MODEL");
    return nullptr;
  }
  if (!m) {
    m = std::make_unique<Loaded>();
    const auto t0 = std::chrono::steady_clock::now();
    m->ck = std::make_unique<Checkpoint>(Checkpoint::open(dir));
    m->model = load_model(*m->ck, {.backend = "cuda", .compute = Compute::BF16});
    m->load_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
  state.counters["load_s"] = m->load_s;
  return m.get();
}

ForwardInput make_input(int64_t B, int64_t T, int64_t V, int64_t pos0, std::vector<int32_t>& ids,
                        std::vector<int32_t>& pos, std::vector<uint8_t>& mask) {
  ids.resize(size_t(B * T));
  pos.resize(size_t(B * T));
  mask.assign(size_t(B * T), 1);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < T; ++t) {
      ids[size_t(b * T + t)] = int32_t((b * 7919 + t * 104729 + 1) % V);
      pos[size_t(b * T + t)] = int32_t(pos0 + t);
    }
  return {.batch = B, .tokens = T, .ids = ids, .positions = pos, .mask = mask, .logits_last_only = true};
}

void BM_Prefill(benchmark::State& state) {
  Loaded* m = model_or_skip(state);
  if (!m) return;
  const int64_t B = state.range(0), T = state.range(1), V = m->model->config().vocab_size;
  std::vector<int32_t> ids, pos;
  std::vector<uint8_t> mask;
  const ForwardInput in = make_input(B, T, V, 0, ids, pos, mask);
  for (auto _ : state) {
    auto cache = m->model->make_cache(B, T);
    const auto t0 = std::chrono::steady_clock::now();
    benchmark::DoNotOptimize(m->model->forward(in, *cache).logits.data());
    state.SetIterationTime(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  state.SetItemsProcessed(state.iterations() * B * T);
}

// One decode step per iteration after a 256-token prefill; the cache grows by one per step.
void BM_Decode(benchmark::State& state) {
  Loaded* m = model_or_skip(state);
  if (!m) return;
  const int64_t B = state.range(0), P = 256, V = m->model->config().vocab_size;
  const int64_t max_steps = 64;
  std::vector<int32_t> ids, pos;
  std::vector<uint8_t> mask;
  auto cache = m->model->make_cache(B, P + max_steps + 1);
  m->model->forward(make_input(B, P, V, 0, ids, pos, mask), *cache);
  int64_t step = 0;
  for (auto _ : state) {
    if (step == max_steps) {
      state.SkipWithError("more iterations than cache room");
      break;
    }
    std::vector<int32_t> sids, spos;
    std::vector<uint8_t> smask;
    const ForwardInput in = make_input(B, 1, V, P + step, sids, spos, smask);
    const auto t0 = std::chrono::steady_clock::now();
    benchmark::DoNotOptimize(m->model->forward(in, *cache).logits.data());
    state.SetIterationTime(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    ++step;
  }
  state.SetItemsProcessed(state.iterations() * B);
}

BENCHMARK(BM_Prefill)->Args({128, 256})->UseManualTime()->Unit(benchmark::kMillisecond)->Iterations(2);
BENCHMARK(BM_Decode)->Arg(1)->Arg(128)->UseManualTime()->Unit(benchmark::kMillisecond)->Iterations(16);

}  // namespace
