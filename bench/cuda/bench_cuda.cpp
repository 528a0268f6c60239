// CUDA kernel micro-benchmarks (Google Benchmark, device time from CUDA events).
// Run: build/bench/cuda/atlas_cuda_bench (GPU required; without one every case is skipped).
// Inputs are random (never zeros) and the GEMM weights are larger than the H200's 60 MB L2, so
// the decode (M = 1) cases measure HBM reads.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <random>
#include <string>
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

// ---- MLA attention (absorbed form) ----------------------------------------------------------
// bf16 values of a fast generator (uniform in [-2, 2)): the timing does not depend on their
// distribution, and filling hundreds of MB this way takes milliseconds.
void fill_bf16_fast(uint16_t* d, size_t n, uint32_t seed) {
  std::vector<uint16_t> h(n);
  uint32_t x = seed * 2654435761u + 1;
  for (auto& v : h) {
    x ^= x << 13;
    x ^= x >> 17;
    x ^= x << 5;
    v = atlas::f32_to_bf16(float(int32_t(x >> 8) - (1 << 23)) * (2.0f / (1 << 23)));
  }
  copy_to_device(d, h.data(), n * 2);
}

constexpr int kMlaHeads = 16;
constexpr float kMlaScale = 0.11472139f;

const char* mla_impl_name(int impl) { return impl == 0 ? "tensor_core" : "scalar"; }

// Decode: rows x 16 heads, one query per row over its own cache of `len` tokens (all rows full
// length). Each iteration reads a different copy of the caches (copies together >= 256 MB, well
// past the 60 MB L2), as consecutive layers would: the figures are HBM reads, not L2 hits.
// GB/s counts the cache bytes once; TFLOP/s counts q.K (576) and P.V (512) per head and token.
// Args: rows, len, impl (0 tensor_core, 1 scalar), split_tokens.
void BM_MlaDecode(benchmark::State& state) {
  if (!have_gpu(state)) return;
  const int rows = int(state.range(0)), len = int(state.range(1)), split = int(state.range(3));
  const MlaImpl impl = state.range(2) == 0 ? MlaImpl::tensor_core : MlaImpl::scalar;
  const size_t cache_elems = size_t(rows) * len * kMlaWidth;
  const int copies = int(std::clamp<size_t>((size_t(256) << 20) / (cache_elems * 2) + 1, 1, 4096));
  Dev<uint16_t> q(size_t(rows) * kMlaHeads * kMlaWidth), cache(cache_elems * copies),
      out(size_t(rows) * kMlaHeads * kMlaLatent);
  Dev<int32_t> lengths(rows);
  Dev<float> ws(mla_decode_workspace_floats(rows, kMlaHeads, len, split));
  fill_bf16(q.p, size_t(rows) * kMlaHeads * kMlaWidth, 3, 0.5f);
  fill_bf16_fast(cache.p, cache_elems * copies, 4);
  std::vector<int32_t> hl(rows, len);
  copy_to_device(lengths.p, hl.data(), rows * 4);
  MlaDecodeArgs a{.q = q.p, .latent_cache = cache.p, .cache_row_stride = int64_t(len) * kMlaWidth,
                  .lengths = lengths.p, .max_length = len, .out = out.p, .rows = rows, .heads = kMlaHeads,
                  .scale = kMlaScale, .split_tokens = split, .workspace = ws.p, .impl = impl};
  mla_decode(a);
  synchronize();
  EventTimer t;
  int it = 0;
  for (auto _ : state) {
    a.latent_cache = cache.p + size_t(it++ % copies) * cache_elems;
    t.start();
    mla_decode(a);
    state.SetIterationTime(t.stop_ms() / 1e3);
  }
  state.counters["GB/s"] = benchmark::Counter(2.0 * double(cache_elems), benchmark::Counter::kIsIterationInvariantRate);
  state.counters["TFLOP/s"] = benchmark::Counter(2.0 * rows * kMlaHeads * double(len) * (kMlaWidth + kMlaLatent) / 1e12,
                                                 benchmark::Counter::kIsIterationInvariantRate);
  state.SetLabel(std::string(mla_impl_name(int(state.range(2)))) + ", split " + std::to_string(split) + ", " +
                 std::to_string(copies) + " cache copies");
}
BENCHMARK(BM_MlaDecode)
    ->ArgNames({"rows", "len", "impl", "split"})
    ->Args({1, 512, 0, 256})
    ->Args({1, 4096, 0, 256})
    ->Args({1, 4096, 0, 64})
    ->Args({128, 512, 0, 256})
    ->Args({128, 1024, 0, 256})
    ->Args({1, 512, 1, 256})
    ->Args({1, 4096, 1, 256})
    ->Args({128, 512, 1, 256})
    ->Args({128, 1024, 1, 256})
    ->UseManualTime()
    ->Unit(benchmark::kMicrosecond);

// Prefill: 128 rows x 256 queries, query t of a row over the row's first t + 1 cache slots (the
// causal lengths), cache_rows pointing every query at its row, as the forward pass calls it.
// GB/s counts the caches once (37.7 MB, they stay in L2: prefill is compute bound); TFLOP/s the
// useful q.K and P.V work (each query over its own length).
// Args: impl (0 tensor_core, 1 scalar), queries_per_block (tensor_core).
void BM_MlaPrefill(benchmark::State& state) {
  if (!have_gpu(state)) return;
  const int rows = 128, T = 256, Q = rows * T;
  const MlaImpl impl = state.range(0) == 0 ? MlaImpl::tensor_core : MlaImpl::scalar;
  Dev<uint16_t> q(size_t(Q) * kMlaHeads * kMlaWidth), cache(size_t(rows) * T * kMlaWidth),
      out(size_t(Q) * kMlaHeads * kMlaLatent);
  Dev<int32_t> lengths(Q), crow(Q);
  Dev<float> ws(mla_decode_workspace_floats(Q, kMlaHeads, T, 256));
  fill_bf16_fast(q.p, size_t(Q) * kMlaHeads * kMlaWidth, 5);
  fill_bf16_fast(cache.p, size_t(rows) * T * kMlaWidth, 6);
  std::vector<int32_t> hl(Q), hr(Q);
  double sum_len = 0;
  for (int b = 0; b < Q; ++b) {
    hl[size_t(b)] = b % T + 1;
    hr[size_t(b)] = b / T;
    sum_len += hl[size_t(b)];
  }
  copy_to_device(lengths.p, hl.data(), size_t(Q) * 4);
  copy_to_device(crow.p, hr.data(), size_t(Q) * 4);
  const MlaDecodeArgs a{.q = q.p, .latent_cache = cache.p, .cache_row_stride = int64_t(T) * kMlaWidth,
                        .lengths = lengths.p, .cache_rows = crow.p, .max_length = T, .out = out.p, .rows = Q,
                        .heads = kMlaHeads, .scale = kMlaScale, .split_tokens = 256, .workspace = ws.p,
                        .impl = impl, .queries_per_block = int(state.range(1))};
  mla_decode(a);
  synchronize();
  EventTimer t;
  for (auto _ : state) {
    t.start();
    mla_decode(a);
    state.SetIterationTime(t.stop_ms() / 1e3);
  }
  state.counters["GB/s"] = benchmark::Counter(2.0 * rows * T * kMlaWidth, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["TFLOP/s"] = benchmark::Counter(2.0 * kMlaHeads * sum_len * (kMlaWidth + kMlaLatent) / 1e12,
                                                 benchmark::Counter::kIsIterationInvariantRate);
  state.SetLabel(std::string(mla_impl_name(int(state.range(0)))) +
                 (impl == MlaImpl::tensor_core ? ", " + std::to_string(state.range(1)) + " queries/block" : ""));
}
BENCHMARK(BM_MlaPrefill)
    ->ArgNames({"impl", "qpb"})
    ->Args({0, 2})
    ->Args({0, 1})
    ->Args({1, 0})
    ->UseManualTime()
    ->Unit(benchmark::kMicrosecond);

}  // namespace
