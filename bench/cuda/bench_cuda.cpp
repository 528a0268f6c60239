// CUDA kernel micro-benchmarks (Google Benchmark, device time from CUDA events).
// Run: build/bench/cuda/atlas_cuda_bench (GPU required; without one every case is skipped).
// Inputs are random (never zeros) and the GEMM weights are larger than the H200's 60 MB L2, so
// the decode (M = 1) cases measure HBM reads.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <mutex>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "backend/cuda/cuda_ops.h"
#include "stream_probe.h"
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

// ---- the model's GEMM shapes: batch-invariant (auto and every forced tile config) vs cuBLASLt ----
// One pool of random bf16 values serves every case (filled once, never freed: it lives until
// the process ends). Decode GEMMs of a real forward pass read weights that are not in L2, so
// each timed call uses the next of several weight copies (together > 60 MB L2) when they fit.
// The 64 gate|up experts plus 48 more: the grouped cases' rotations shift a window of 64 evenly
// spaced experts (the TMA kernel's layout, as the model loads them), 1.29 GB.
constexpr size_t kPoolWeights = size_t(64 + 48) * 2816 * 2048;
constexpr size_t kPoolX = size_t(32768) * 2048;             // 32768 tokens x hidden
constexpr size_t kPoolRows = size_t(32768) * 6;             // routed rows at 32768 tokens, top-6
constexpr size_t kPoolOut = kPoolRows * 2816;

struct Pool {
  uint16_t* w = nullptr;
  uint16_t* x = nullptr;
  uint16_t* out = nullptr;
  uint16_t* x_sorted = nullptr;  // gathered rows for the per-expert baselines
};

void fill_fast(uint16_t* d, size_t n, uint32_t seed, float scale) {
  // Uniform values from an LCG: timing does not care about the distribution, and 369M normal
  // draws from <random> would take longer than the whole benchmark.
  const size_t chunk = size_t(1) << 24;
  std::vector<uint16_t> h(std::min(n, chunk));
  uint32_t s = seed * 2654435761u + 1;
  for (size_t i0 = 0; i0 < n; i0 += chunk) {
    const size_t m = std::min(chunk, n - i0);
    for (size_t i = 0; i < m; ++i) {
      s = s * 1664525u + 1013904223u;
      h[i] = atlas::f32_to_bf16(scale * (float(s >> 8) * (1.0f / 8388608.0f) - 1.0f));
    }
    copy_to_device(d + i0, h.data(), m * 2);
  }
}

Pool& pool() {
  static Pool p = [] {
    Pool q;
    q.w = static_cast<uint16_t*>(device_alloc(kPoolWeights * 2));
    q.x = static_cast<uint16_t*>(device_alloc(kPoolX * 2));
    q.out = static_cast<uint16_t*>(device_alloc(kPoolOut * 2));
    q.x_sorted = static_cast<uint16_t*>(device_alloc(kPoolRows * 2048 * 2));
    fill_fast(q.w, kPoolWeights, 11, 0.03f);
    fill_fast(q.x, kPoolX, 12, 1.0f);
    return q;
  }();
  return p;
}

// ---- summary table: one line per shape x M (dense) and shape x tokens (grouped) ----------------
// Each case records its mean time per call; the table is printed to stdout when the process
// exits (after Google Benchmark's own report), so a short run shows invariant vs cuBLASLt at a
// glance. Cases that did not run (filtered out, no GPU) leave their cells empty.
struct SummaryRow {
  std::string config;                 // the automatic choice
  double inv_us = -1, ref_us = -1;    // invariant auto; cuBLASLt (dense) / per-expert cuBLASLt (grouped)
  std::map<std::string, double> forced;  // forced config -> us
};
struct Summary {
  std::mutex mu;
  std::map<std::string, SummaryRow> rows;  // key: "dense  N=.. K=.. M=.." (sorted = grouped by kind)
  ~Summary() {
    if (rows.empty()) return;
    std::printf("\nGEMM summary (us per call; ratio = invariant auto / cuBLASLt)\n");
    std::printf("%-44s %-16s %10s %10s %7s  %s\n", "case", "auto config", "invariant", "cuBLASLt", "ratio",
                "forced configs");
    for (const auto& [key, r] : rows) {
      std::string forced;
      for (const auto& [name, us] : r.forced) {
        char b[96];
        std::snprintf(b, sizeof b, "%s%s %.1f", forced.empty() ? "" : ", ", name.c_str(), us);
        forced += b;
      }
      char inv[32] = "-", ref[32] = "-", ratio[32] = "-";
      if (r.inv_us >= 0) std::snprintf(inv, sizeof inv, "%.1f", r.inv_us);
      if (r.ref_us >= 0) std::snprintf(ref, sizeof ref, "%.1f", r.ref_us);
      if (r.inv_us >= 0 && r.ref_us > 0) std::snprintf(ratio, sizeof ratio, "%.2f", r.inv_us / r.ref_us);
      std::printf("%-44s %-16s %10s %10s %7s  %s\n", key.c_str(), r.config.c_str(), inv, ref, ratio, forced.c_str());
    }
    std::fflush(stdout);
  }
};
Summary& summary() {
  static Summary s;
  return s;
}
// kind 0: invariant auto, 1: the cuBLASLt baseline, 2: a forced config (name).
void record(const std::string& key, const std::string& auto_config, int kind, const std::string& name, double us) {
  Summary& s = summary();
  std::lock_guard<std::mutex> lock(s.mu);
  SummaryRow& r = s.rows[key];
  if (!auto_config.empty()) r.config = auto_config;
  if (kind == 0) r.inv_us = us;
  if (kind == 1) r.ref_us = us;
  if (kind == 2) r.forced[name] = us;
}

// The forced-config cases: every config with ATLAS_GEMM_SWEEP=1 in the environment, else the
// few that matter per row count (the split-K decode configs for small M, the large tiles and
// split-K for M = 128, the largest tile for big prefills), so the default run stays short.
bool full_sweep() {
  const char* e = std::getenv("ATLAS_GEMM_SWEEP");
  return e != nullptr && std::string(e) == "1";
}
std::vector<int> forced_configs(int rows) {
  std::vector<int> all;
  for (int c = 0; c < gemm_config_count(); ++c) all.push_back(c);
  if (full_sweep()) return all;
  std::vector<std::string> want;
  if (rows <= 16)
    want = {"splitk16x8/8w", "16x32x128/4", "c16x64/4w", "stream8x8/6w", "stream8x8/3w", "streamwg64x8/4",
            "streamwg64x8/3r2", "streamwg64x8/4l", "streamwg64x8/6l", "streamwg64x8/4l2", "streamwg64x8/8l64", "16x32x128/3", "16x32x128/2",
            "16x32x128/4l", "16x32x128/4u", "streamwg64x8/4l3", "16x32x128/5h", "streamwg64x8/4l/3"};
  else if (rows <= 1024)
    want = {"32x64x64/4+slices", "c128x64/8w", "c64x64/4w", "wg128x128x64/4+slices"};
  else
    want = {"tma192x128x64/5", "wg192x128x64/4", "wg128x128x64/4", "128x64x32/4"};
  std::vector<int> out;
  for (int c : all)
    if (std::find(want.begin(), want.end(), gemm_config_name(c)) != want.end()) out.push_back(c);
  return out;
}

struct Shape {
  int N, K;
  const char* what;
};
constexpr std::array<Shape, 9> kShapes = {{{2048, 2048, "q/o proj"},
                                           {2816, 2048, "expert gate|up"},
                                           {2048, 1408, "expert down"},
                                           {576, 2048, "kv_a"},
                                           {3072, 2048, "q proj (16 x 192)"},
                                           {21888, 2048, "dense gate|up"},
                                           {102400, 2048, "lm_head"},
                                           {5632, 2048, "shared experts gate|up"},
                                           {2048, 2816, "shared experts down"}}};

std::string mode_label(int mode, const std::string& chosen) {
  if (mode == 0) return "invariant auto [" + chosen + "]";
  if (mode == 1) return "fast (cuBLASLt)";
  return "invariant forced [" + gemm_config_name(mode - 2) + "]";
}

// Args: shape index, M, mode (0 invariant auto, 1 cuBLASLt, 2 + c invariant with config c).
void BM_GemmShapes(benchmark::State& state) {
  if (!have_gpu(state)) return;
  const Shape sh = kShapes[size_t(state.range(0))];
  const int M = int(state.range(1)), mode = int(state.range(2));
  if (mode >= 2 + gemm_config_count()) {
    state.SkipWithError("no such config");
    return;
  }
  Pool& p = pool();
  const size_t wsz = size_t(sh.N) * sh.K;
  const int copies = int(std::clamp<size_t>(kPoolWeights / wsz, 1, 16));
  gemm_force_config(mode >= 2 ? mode - 2 : -1);
  GemmArgs a{.x = p.x, .w = p.w, .out = p.out, .M = M, .N = sh.N, .K = sh.K,
             .mode = mode == 1 ? GemmMode::fast : GemmMode::batch_invariant};
  const std::string chosen = gemm_config_name(gemm_chosen_config(a));
  for (int c = 0; c < copies; ++c) {  // warm-up: one-time setup, cuBLASLt plans
    a.w = p.w + size_t(c) * wsz;
    gemm(a);
  }
  synchronize();
  constexpr int kReps = 16;
  EventTimer t;
  int next = 0;
  double total_s = 0;
  int64_t iters = 0;
  for (auto _ : state) {
    t.start();
    for (int r = 0; r < kReps; ++r) {
      a.w = p.w + size_t(next) * wsz;
      next = (next + 1) % copies;
      gemm(a);
    }
    const double s = t.stop_ms() / 1e3 / kReps;
    state.SetIterationTime(s);
    total_s += s;
    ++iters;
  }
  gemm_force_config(-1);
  if (iters > 0) {
    char key[64];
    std::snprintf(key, sizeof key, "dense   N=%6d K=%5d M=%4d", sh.N, sh.K, M);
    const std::string auto_cfg = mode == 0 ? chosen : "";
    record(key, auto_cfg, mode <= 1 ? mode : 2, mode >= 2 ? gemm_config_name(mode - 2) : "", total_s / iters * 1e6);
  }
  const double bytes = 2.0 * (double(sh.N) * sh.K + double(M) * sh.K + double(M) * sh.N);
  state.counters["GB/s"] = benchmark::Counter(bytes, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["TFLOP/s"] =
      benchmark::Counter(2.0 * M * sh.N * sh.K / 1e12, benchmark::Counter::kIsIterationInvariantRate);
  state.SetLabel(std::string(sh.what) + " N=" + std::to_string(sh.N) + " K=" + std::to_string(sh.K) + ", " +
                 mode_label(mode, chosen));
}
// Cases: every shape at M = 1, 128 and 4096 (a prefill chunk): auto, cuBLASLt, then the forced
// configs of forced_configs.
void gemm_shape_cases(benchmark::internal::Benchmark* b) {
  for (int shape = 0; shape < int(kShapes.size()); ++shape)
    for (int M : {1, 128, 4096}) {
      b->Args({shape, M, 0});
      b->Args({shape, M, 1});
      for (int c : forced_configs(M)) b->Args({shape, M, 2 + c});
    }
}
BENCHMARK(BM_GemmShapes)->Apply(gemm_shape_cases)->UseManualTime()->Unit(benchmark::kMicrosecond);

// ---- grouped MoE GEMM: 64 experts, top-6 routing, one launch with device offsets ----------------
// Baselines: the same rows as one cuBLASLt GEMM per non-empty expert (host offsets, rows
// gathered beforehand: what a host-synchronised MoE layer does), and the same per-expert loop
// with the invariant dense kernel.
struct Routing {
  int rows = 0;
  std::vector<int32_t> offsets;  // [65]
  int32_t* d_offsets = nullptr;
  int32_t* d_x_rows = nullptr;
  std::vector<const uint16_t**> d_wptr;  // per rotation: [64] device pointers
  std::vector<const uint16_t*> w_base;   // per rotation: expert 0's weight (the experts at one stride)
};

constexpr int kExperts = 64, kTopK = 6, kRotations = 4;

Routing& routing(int shape, int tokens) {
  static std::map<std::pair<int, int>, Routing> cache;
  auto it = cache.find({shape, tokens});
  if (it != cache.end()) return it->second;
  Routing r;
  std::mt19937 rng(uint32_t(tokens) * 7 + uint32_t(shape));
  std::vector<int> perm(kExperts);
  std::vector<std::vector<int32_t>> by_expert(kExperts);
  for (int t = 0; t < tokens; ++t) {
    std::iota(perm.begin(), perm.end(), 0);
    for (int j = 0; j < kTopK; ++j) {
      std::uniform_int_distribution<int> d(j, kExperts - 1);
      std::swap(perm[size_t(j)], perm[size_t(d(rng))]);
      by_expert[size_t(perm[size_t(j)])].push_back(t);
    }
  }
  std::vector<int32_t> x_rows;
  r.offsets.push_back(0);
  for (auto& e : by_expert) {
    x_rows.insert(x_rows.end(), e.begin(), e.end());
    r.offsets.push_back(int32_t(x_rows.size()));
  }
  r.rows = int(x_rows.size());
  r.d_offsets = static_cast<int32_t*>(device_alloc(r.offsets.size() * 4));
  copy_to_device(r.d_offsets, r.offsets.data(), r.offsets.size() * 4);
  r.d_x_rows = static_cast<int32_t*>(device_alloc(x_rows.size() * 4));
  copy_to_device(r.d_x_rows, x_rows.data(), x_rows.size() * 4);
  const Shape sh = kShapes[size_t(shape)];
  for (int rot = 0; rot < kRotations; ++rot) {
    std::vector<const uint16_t*> wp(kExperts);
    for (int e = 0; e < kExperts; ++e)
      wp[size_t(e)] = pool().w + size_t(e + rot * kExperts / kRotations) * sh.N * sh.K;
    r.w_base.push_back(wp[0]);
    auto* d = static_cast<const uint16_t**>(device_alloc(kExperts * sizeof(void*)));
    copy_to_device(d, wp.data(), kExperts * sizeof(void*));
    r.d_wptr.push_back(d);
  }
  return cache.emplace(std::pair{shape, tokens}, std::move(r)).first->second;
}

// Args: shape index (1: gate|up N=2816 K=2048, 2: down N=2048 K=1408), tokens, mode
// (0 grouped auto, 1 per-expert cuBLASLt, 2 per-expert invariant, 3 + c grouped config c).
void BM_GroupedGemm(benchmark::State& state) {
  if (!have_gpu(state)) return;
  const int shape = int(state.range(0)), tokens = int(state.range(1)), mode = int(state.range(2));
  if (mode >= 3 + gemm_config_count()) {
    state.SkipWithError("no such config");
    return;
  }
  const Shape sh = kShapes[size_t(shape)];
  Pool& p = pool();
  Routing& r = routing(shape, tokens);
  const size_t wsz = size_t(sh.N) * sh.K;
  if (mode == 1 || mode == 2)  // the baselines read pre-gathered rows
    moe_gather({.x = p.x, .sorted_token = r.d_x_rows, .x_sorted = p.x_sorted, .rows = r.rows, .dim = sh.K});
  gemm_force_config(mode >= 3 ? mode - 3 : -1);
  GroupedGemmArgs g{.x = p.x, .x_rows = r.d_x_rows, .w = r.d_wptr[0], .offsets = r.d_offsets, .out = p.out,
                    .groups = kExperts, .max_rows = r.rows, .N = sh.N, .K = sh.K, .x_rows_limit = tokens,
                    .w_base = r.w_base[0], .w_group_stride = int64_t(wsz)};
  const int chosen = grouped_gemm_chosen_config(g);
  auto run_once = [&](int rot) {
    if (mode == 0 || mode >= 3) {
      g.w = r.d_wptr[size_t(rot)];
      g.w_base = r.w_base[size_t(rot)];
      grouped_gemm(g);
      return;
    }
    for (int e = 0; e < kExperts; ++e) {
      const int lo = r.offsets[size_t(e)], n = r.offsets[size_t(e) + 1] - lo;
      if (n == 0) continue;
      gemm({.x = p.x_sorted + size_t(lo) * sh.K,
            .w = p.w + size_t(e + rot * kExperts / kRotations) * wsz,
            .out = p.out + size_t(lo) * sh.N, .M = n, .N = sh.N, .K = sh.K,
            .mode = mode == 1 ? GemmMode::fast : GemmMode::batch_invariant});
    }
  };
  for (int rot = 0; rot < kRotations; ++rot) run_once(rot);  // warm-up, cuBLASLt plans
  check_device_errors();
  EventTimer t;
  int rot = 0;
  double total_s = 0;
  int64_t iters = 0;
  for (auto _ : state) {
    t.start();
    for (int i = 0; i < kRotations; ++i) {
      run_once(rot);
      rot = (rot + 1) % kRotations;
    }
    const double s = t.stop_ms() / 1e3 / kRotations;
    state.SetIterationTime(s);
    total_s += s;
    ++iters;
  }
  gemm_force_config(-1);
  if (iters > 0 && mode != 2) {
    char key[64];
    std::snprintf(key, sizeof key, "grouped N=%6d K=%5d tok=%5d", sh.N, sh.K, tokens);
    const std::string auto_cfg = mode == 0 && chosen >= 0 ? gemm_config_name(chosen) : "";
    record(key, auto_cfg, mode == 0 ? 0 : mode == 1 ? 1 : 2, mode >= 3 ? gemm_config_name(mode - 3) : "",
           total_s / iters * 1e6);
  } else if (iters > 0) {
    char key[64];
    std::snprintf(key, sizeof key, "grouped N=%6d K=%5d tok=%5d", sh.N, sh.K, tokens);
    record(key, "", 2, "per-expert inv", total_s / iters * 1e6);
  }
  int busy = 0;
  for (int e = 0; e < kExperts; ++e) busy += r.offsets[size_t(e) + 1] > r.offsets[size_t(e)];
  const double bytes = 2.0 * (double(busy) * wsz + double(r.rows) * sh.K + double(r.rows) * sh.N);
  state.counters["GB/s"] = benchmark::Counter(bytes, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["TFLOP/s"] =
      benchmark::Counter(2.0 * r.rows * sh.N * sh.K / 1e12, benchmark::Counter::kIsIterationInvariantRate);
  const std::string m = mode == 0   ? "grouped auto [" + (chosen >= 0 ? gemm_config_name(chosen) : "-") + "]"
                        : mode == 1 ? "per-expert cuBLASLt loop"
                        : mode == 2 ? "per-expert invariant loop"
                                    : "grouped forced [" + gemm_config_name(mode - 3) + "]";
  state.SetLabel("64 experts top-6, " + std::to_string(tokens) + " tokens (" + std::to_string(r.rows) +
                 " rows), N=" + std::to_string(sh.N) + " K=" + std::to_string(sh.K) + ", " + m);
}
// Cases: gate|up and down at 1, 128 and 32768 tokens: grouped auto, the two per-expert loops,
// then the forced configs for the rows per busy expert (1, ~12, ~3072).
void grouped_cases(benchmark::internal::Benchmark* b) {
  for (int shape : {1, 2})
    for (int tokens : {1, 128, 32768}) {
      for (int mode : {0, 1, 2}) b->Args({shape, tokens, mode});
      const int rows_per_expert = tokens == 1 ? 1 : tokens * kTopK / kExperts;
      for (int c : forced_configs(rows_per_expert)) b->Args({shape, tokens, 3 + c});
    }
}
BENCHMARK(BM_GroupedGemm)->Apply(grouped_cases)->UseManualTime()->Unit(benchmark::kMicrosecond);

// ---- weight streaming: the grouped GEMM's access pattern vs contiguous runs (stream_probe.cu) ----
// Args: seg bytes per row per step (128 = the decode grouped GEMM's 64-wide K steps), contiguous.
// Reads the 738 MB GEMM pool once per iteration; GB/s is the pool's bytes per second.
void BM_StreamProbe(benchmark::State& state) {
  if (!have_gpu(state)) return;
  const atlas_bench::StreamProbeArgs a{.pool = pool().w, .bytes = kPoolWeights * 2, .seg_bytes = int(state.range(0)),
                                       .contiguous = state.range(1) != 0, .iters = 4};
  for (auto _ : state) state.SetIterationTime(atlas_bench::stream_probe_us(a) / 1e6);
  state.counters["GB/s"] = benchmark::Counter(double(kPoolWeights) * 2, benchmark::Counter::kIsIterationInvariantRate);
  state.SetLabel(a.contiguous ? "contiguous 16 KB per step" : std::to_string(a.seg_bytes) + " B from each row per step");
}
BENCHMARK(BM_StreamProbe)
    ->ArgNames({"seg", "contiguous"})
    ->ArgsProduct({{128, 256, 512, 4096}, {0, 1}})
    ->UseManualTime()
    ->Unit(benchmark::kMicrosecond);

// ---- MLA attention (absorbed form) ----------------------------------------------------------
constexpr int kMlaHeads = 16;
constexpr float kMlaScale = 0.11472139f;

const char* mla_impl_name(int impl) { return impl == 0 ? "tensor_core" : "scalar"; }

// Decode: rows x 16 heads, one query per row over its own cache of `len` tokens (all rows full
// length). Each iteration reads a different copy of the caches (copies together >= 256 MB, well
// past the 60 MB L2), as consecutive layers would: the figures are HBM reads, not L2 hits.
// GB/s counts the cache bytes once; TFLOP/s counts q.K (576) and P.V (512) per head and token.
// Args: rows, len, impl (0 tensor_core, 1 scalar), split_tokens, tile buffers (0 auto, 1, 2).
void BM_MlaDecode(benchmark::State& state) {
  if (!have_gpu(state)) return;
  const int rows = int(state.range(0)), len = int(state.range(1)), split = int(state.range(3));
  const int bufs = int(state.range(4));
  const MlaImpl impl = state.range(2) == 0 ? MlaImpl::tensor_core : MlaImpl::scalar;
  const size_t cache_elems = size_t(rows) * len * kMlaWidth;
  const int copies = int(std::clamp<size_t>((size_t(256) << 20) / (cache_elems * 2) + 1, 1, 4096));
  Dev<uint16_t> q(size_t(rows) * kMlaHeads * kMlaWidth), cache(cache_elems * copies),
      out(size_t(rows) * kMlaHeads * kMlaLatent);
  Dev<int32_t> lengths(rows);
  Dev<float> ws(mla_decode_workspace_floats(rows, kMlaHeads, len, split));
  fill_bf16(q.p, size_t(rows) * kMlaHeads * kMlaWidth, 3, 0.5f);
  fill_fast(cache.p, cache_elems * copies, 4, 2.0f);  // uniform: timing ignores the distribution
  std::vector<int32_t> hl(rows, len);
  copy_to_device(lengths.p, hl.data(), rows * 4);
  MlaDecodeArgs a{.q = q.p, .latent_cache = cache.p, .cache_row_stride = int64_t(len) * kMlaWidth,
                  .lengths = lengths.p, .max_length = len, .out = out.p, .rows = rows, .heads = kMlaHeads,
                  .scale = kMlaScale, .split_tokens = split, .workspace = ws.p, .impl = impl, .tile_buffers = bufs};
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
                 (bufs ? std::to_string(bufs) + " tile buffers, " : "") + std::to_string(copies) + " cache copies");
}
BENCHMARK(BM_MlaDecode)
    ->ArgNames({"rows", "len", "impl", "split", "bufs"})
    ->Args({1, 512, 0, 256, 0})
    ->Args({1, 4096, 0, 256, 0})
    ->Args({1, 4096, 0, 64, 0})
    ->Args({128, 512, 0, 256, 0})
    ->Args({128, 512, 0, 256, 1})
    ->Args({128, 512, 0, 256, 2})
    ->Args({128, 1024, 0, 256, 0})
    ->Args({128, 1024, 0, 256, 1})
    ->Args({128, 1024, 0, 256, 2})
    ->Args({1, 512, 1, 256, 0})
    ->Args({1, 4096, 1, 256, 0})
    ->Args({128, 512, 1, 256, 0})
    ->Args({128, 1024, 1, 256, 0})
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
  fill_fast(q.p, size_t(Q) * kMlaHeads * kMlaWidth, 5, 1.0f);
  fill_fast(cache.p, size_t(rows) * T * kMlaWidth, 6, 2.0f);
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
    ->Args({0, 4})
    ->Args({0, 2})
    ->Args({0, 1})
    ->Args({1, 0})
    ->UseManualTime()
    ->Unit(benchmark::kMicrosecond);

}  // namespace
