// CUDA kernel micro-benchmarks (Google Benchmark, device time from CUDA events).
// Run: build/bench/cuda/atlas_cuda_bench (GPU required; without one every case is skipped).
// Inputs are random (never zeros) and the GEMM weights are larger than the H200's 60 MB L2, so
// the decode (M = 1) cases measure HBM reads.
#include <benchmark/benchmark.h>

#include <random>
#include <vector>

#include "backend/cuda/cuda_ops.h"
#include "core/bf16.h"

namespace {

using namespace atlas::cuda;

template <class T>
struct Dev {
  T* p;
  explicit Dev(size_t n) : p(static_cast<T*>(device_alloc(n * sizeof(T)))) {}
  ~Dev() { device_free(p); }
};

void fill_bf16(uint16_t* d, size_t n, uint32_t seed, float sigma) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, sigma);
  std::vector<uint16_t> h(n);
  for (auto& v : h) v = atlas::f32_to_bf16(nd(rng));
  copy_to_device(d, h.data(), n * 2);
}

bool have_gpu(benchmark::State& state) {
  if (device_count() > 0) return true;
  state.SkipWithError("no CUDA device");
  return false;
}

// Layer 0's fused gate|up projection: N = 2 x 10944, K = 2048 (89.6 MB of bf16 weights).
void BM_Gemm(benchmark::State& state) {
  if (!have_gpu(state)) return;
  const int M = int(state.range(0)), N = 21888, K = 2048;
  const GemmMode mode = state.range(1) == 0   ? GemmMode::batch_invariant
                        : state.range(1) == 1 ? GemmMode::fast
                                              : GemmMode::cublaslt_pinned;
  Dev<uint16_t> x(size_t(M) * K), w(size_t(N) * K), out(size_t(M) * N);
  fill_bf16(x.p, size_t(M) * K, 1, 1.0f);
  fill_bf16(w.p, size_t(N) * K, 2, 0.02f);
  const GemmArgs a{.x = x.p, .w = w.p, .out = out.p, .M = M, .N = N, .K = K, .mode = mode};
  gemm(a);  // warm-up: module load, cuBLASLt handle
  synchronize();
  EventTimer t;
  for (auto _ : state) {
    t.start();
    gemm(a);
    state.SetIterationTime(t.stop_ms() / 1e3);
  }
  const double bytes = 2.0 * (double(N) * K + double(M) * K + double(M) * N);
  state.counters["GB/s"] = benchmark::Counter(bytes, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["TFLOP/s"] = benchmark::Counter(2.0 * M * N * K / 1e12, benchmark::Counter::kIsIterationInvariantRate);
  state.SetLabel(state.range(1) == 0 ? "batch-invariant" : state.range(1) == 1 ? "fast (cuBLASLt)" : "cuBLASLt pinned");
}
BENCHMARK(BM_Gemm)->ArgsProduct({{1, 128}, {0, 1, 2}})->UseManualTime()->Unit(benchmark::kMicrosecond);

// Decode attention: rows x 16 heads over caches of `len` tokens (all rows full length).
void BM_MlaDecode(benchmark::State& state) {
  if (!have_gpu(state)) return;
  const int rows = int(state.range(0)), len = int(state.range(1)), H = 16;
  Dev<uint16_t> q(size_t(rows) * H * kMlaWidth), cache(size_t(rows) * len * kMlaWidth),
      out(size_t(rows) * H * kMlaLatent);
  Dev<int32_t> lengths(rows);
  Dev<float> ws(mla_decode_workspace_floats(rows, H, len, 256));
  fill_bf16(q.p, size_t(rows) * H * kMlaWidth, 3, 0.5f);
  fill_bf16(cache.p, size_t(rows) * len * kMlaWidth, 4, 1.0f);
  std::vector<int32_t> hl(rows, len);
  copy_to_device(lengths.p, hl.data(), rows * 4);
  const MlaDecodeArgs a{.q = q.p, .latent_cache = cache.p, .cache_row_stride = int64_t(len) * kMlaWidth,
                        .lengths = lengths.p, .max_length = len, .out = out.p, .rows = rows, .heads = H,
                        .scale = 0.11472139f, .split_tokens = 256, .workspace = ws.p};
  mla_decode(a);
  synchronize();
  EventTimer t;
  for (auto _ : state) {
    t.start();
    mla_decode(a);
    state.SetIterationTime(t.stop_ms() / 1e3);
  }
  state.counters["GB/s"] = benchmark::Counter(2.0 * rows * len * kMlaWidth, benchmark::Counter::kIsIterationInvariantRate);
}
BENCHMARK(BM_MlaDecode)->Args({1, 4096})->Args({128, 1024})->UseManualTime()->Unit(benchmark::kMicrosecond);

}  // namespace
