// CPU forward-pass and decode throughput on the embedded tiny preset (made in a temp dir).
// Counters: tokens/s ("items_per_second"). No targets here; results go in docs/benchmarks.md.
#include <benchmark/benchmark.h>
#include <omp.h>

#include <filesystem>
#include <memory>

#include "decode/generate.h"
#include "io/checkpoint.h"
#include "io/synthetic.h"
#include "model/loader.h"
#include "model/presets.h"

using namespace atlas;

namespace {

struct TinyModel {
  std::string dir;
  std::unique_ptr<Checkpoint> ck;
  std::unique_ptr<Model> model;
  explicit TinyModel(Compute c) {
    dir = (std::filesystem::temp_directory_path() / "atlas_bench_tiny").string();
    std::filesystem::remove_all(dir);
    std::filesystem::create_directories(dir);
    write_model_files(dir, make_preset("tiny"), {.preset = "tiny", .seed = 0, .dtype = DType::BF16, .max_shard_bytes = {}});
    ck = std::make_unique<Checkpoint>(Checkpoint::open(dir));
    model = load_model(*ck, {.backend = "cpu", .compute = c});
  }
};

TinyModel& tiny(Compute c) {
  static TinyModel f32(Compute::F32), bf16(Compute::BF16);
  return c == Compute::F32 ? f32 : bf16;
}

void BM_Prefill(benchmark::State& state) {
  const Compute c = state.range(0) ? Compute::BF16 : Compute::F32;
  const int64_t T = state.range(1);
  auto& m = tiny(c);
  std::vector<int32_t> ids(static_cast<size_t>(T)), pos(static_cast<size_t>(T));
  std::vector<uint8_t> mask(static_cast<size_t>(T), 1);
  for (int64_t t = 0; t < T; ++t) {
    ids[size_t(t)] = int32_t((t * 37) % 1000);
    pos[size_t(t)] = int32_t(t);
  }
  for (auto _ : state) {
    auto out = m.model->forward({.batch = 1, .tokens = T, .ids = ids, .positions = pos, .mask = mask});
    benchmark::DoNotOptimize(out.logits.data());
  }
  state.SetItemsProcessed(state.iterations() * T);
  state.SetLabel(compute_name(c) + " tokens/s");
}
BENCHMARK(BM_Prefill)->Args({0, 128})->Args({1, 128})->Unit(benchmark::kMillisecond)->UseRealTime();

void BM_DecodeGreedy(benchmark::State& state) {
  const int64_t B = state.range(0), new_tokens = 32;
  auto& m = tiny(Compute::BF16);
  std::vector<decode::PromptRow> rows;
  for (int64_t r = 0; r < B; ++r) {
    decode::PromptRow row{.id = std::to_string(r), .ids = {}, .sampling = {}};
    for (int t = 0; t < 16; ++t) row.ids.push_back(int32_t((r * 31 + t * 7) % 1000));
    rows.push_back(std::move(row));
  }
  // EOS disabled (no eos ids) so every row runs the full length.
  decode::GenerateOptions opts{.max_new_tokens = new_tokens, .batch = B, .eos_ids = {}, .pad_id = 1001};
  for (auto _ : state) {
    auto res = decode::generate(*m.model, rows, opts);
    benchmark::DoNotOptimize(res.data());
  }
  state.SetItemsProcessed(state.iterations() * B * new_tokens);
  state.SetLabel("bf16 new tokens/s, batch " + std::to_string(B));
}
BENCHMARK(BM_DecodeGreedy)->Arg(1)->Arg(8)->Unit(benchmark::kMillisecond)->UseRealTime();

}  // namespace
