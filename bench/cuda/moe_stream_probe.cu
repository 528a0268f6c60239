// MoE stream probe (a measurement, not part of atlas; session 39, docs/cuda-sessions.md "Status after
// session 39"): in a batch-1 decode step the routed experts' gate|up (one token, six of 64
// experts, 69 MB on the lean stream loop) streams at ~2.9 TB/s by its span even with nothing
// beside it (s39-7), where session 23's probe read the same bytes over the same 264-block grid
// at ~4 TB/s. This probe runs atlas's own GEMM launches (gemm / grouped_gemm on the lean stream
// config, their stamped instantiations: kernels/block_stamp.cuh) alone on a flushed L2 and
// changes one thing of the real launch at a time:
//   dense          one [16896, 2048] matrix, M = 1 (the probe's shape: contiguous rows)
//   dense gated    the same with the gate|up row order (row n / 2 and 8448 + n / 2 per pair)
//   grouped 0-5    six consecutive experts of a [64, 2816, 2048] block, gated (one token's
//                  rows, offsets and gather as the model's)
//   grouped spread six experts spread over the block (3, 14, 25, 36, 47, 58), gated: the model's
//                  case (routes are spread)
//   grouped plain  the spread experts without the gated order
//   spread gated, tables in L2 / no gather / 6 groups: the model's case with the one-token
//                  tables (offsets, gathered rows, weight pointers) read into L2 after the flush
//                  (as in a decode step, where the routing kernel just wrote them), without the
//                  gather (x holds six copies of the row), or over a table of only the six
//                  experts: each removes or shortens one of the block's dependent loads before
//                  its first weight step (the offsets scan, w_groups[g], x_rows[row])
// Each case: 7 launches, each after a 256 MB write that evicts L2; per launch the span (first
// block's start to the last block's end, %globaltimer) and the median block's run (end of its
// wait to its end); the medians over the launches are printed with the span's rate, the median
// block's time to its wait's end ("to go"), the spread of the blocks' starts ("stagger"), and
// how many SMs held 0, 1, 2, 3 or more working blocks in the last launch with their blocks'
// median run (session 40: whether placement or the loop makes blocks slow). Run it once more
// with ATLAS_L2_EVICT_FIRST=0 for the copies without the evict_first policy. (Session 40 found
// the grouped block's tile lookup, before its first copy, with the stamp's go moved after it:
// docs/cuda-sessions.md "Status after session 40".)
//   build/bench/cuda/atlas_moe_stream_probe
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "backend/cuda/cuda_ops.h"
#include "probe_util.h"

namespace {

using namespace atlas::cuda;

struct Timing {
  double span_us = 0, block_us = 0, wait_us = 0, stagger_us = 0;
  int blocks = 0;
  // The last launch's working blocks (weight bytes > 0) per SM: sms[c] SMs held c of them, and
  // the median run of a block on such an SM (us): whether the block scheduler's placement,
  // not the loop, makes blocks slow.
  int sms[5] = {0, 0, 0, 0, 0};
  double run_by_load[5] = {0, 0, 0, 0, 0};
};

template <class T>
T median(std::vector<T> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// launch() once per repetition after evicting L2 (then warm(), if any); the stamps of its blocks only.
template <class F, class W = void (*)()>
Timing measure(F&& launch, char* flush, size_t flush_bytes, int sm_count, W warm = [] {}) {
  std::vector<double> spans, runs, waits, staggers;
  int blocks = 0;
  Timing out;
  for (int r = 0; r < 8; ++r) {
    CK(cudaMemset(flush, r, flush_bytes));
    warm();
    CK(cudaDeviceSynchronize());
    (void)gemm_block_stamps_take();  // (empty: nothing stamped since)
    launch();
    CK(cudaDeviceSynchronize());
    const std::vector<BlockStampRecord> recs = gemm_block_stamps_take();
    if (r == 0 || recs.empty()) continue;  // the first launch warms the code
    uint64_t t0 = UINT64_MAX, t1 = 0, last_start = 0;
    // The working blocks (weight bytes > 0): each one's run (end of its wait to its end), time to
    // its wait's end, and SM; how many of them each SM held.
    struct Working {
      double run;
      int sm;
    };
    std::vector<Working> work;
    std::vector<double> run, wait;
    std::vector<int> load(size_t(sm_count), 0);
    for (const BlockStampRecord& b : recs) {
      t0 = std::min(t0, b.t0);
      t1 = std::max(t1, b.t1);
      if (b.bytes <= 0) continue;
      const uint64_t go = b.go ? b.go : b.t0;
      run.push_back(double(b.t1 - go) / 1000.0);
      wait.push_back(double(go - b.t0) / 1000.0);
      last_start = std::max(last_start, b.t0);
      if (b.smid >= 0 && b.smid < sm_count) {
        work.push_back({run.back(), b.smid});
        ++load[size_t(b.smid)];
      }
    }
    if (!wait.empty()) waits.push_back(median(wait));
    staggers.push_back(double(last_start - t0) / 1000.0);
    spans.push_back(double(t1 - t0) / 1000.0);
    if (!run.empty()) runs.push_back(median(run));
    blocks = int(recs.size());
    std::vector<double> by[5];
    for (const Working& w : work) by[std::min(load[size_t(w.sm)], 4)].push_back(w.run);
    for (int c = 0; c < 5; ++c) {
      out.sms[c] = 0;
      out.run_by_load[c] = by[c].empty() ? 0.0 : median(by[c]);
    }
    for (int l : load) ++out.sms[std::min(l, 4)];
  }
  out.span_us = median(spans);
  out.block_us = runs.empty() ? 0.0 : median(runs);
  out.wait_us = waits.empty() ? 0.0 : median(waits);
  out.stagger_us = median(staggers);
  out.blocks = blocks;
  return out;
}

}  // namespace

int main() {
  const int sm_count = hopper_sm_count("atlas_moe_stream_probe");
  if (sm_count == 0) return 0;
  const int E = 64, k = 6, I = 1408, N = 2 * I, K = 2048;
  const size_t per = size_t(N) * K;  // one expert's gate|up, elements
  uint16_t *w = nullptr, *x = nullptr, *out = nullptr, *scratch = nullptr;
  char* flush = nullptr;
  const size_t flush_bytes = size_t(256) << 20;
  CK(cudaMalloc(&w, size_t(E) * per * 2));
  CK(cudaMemset(w, 0x3c, size_t(E) * per * 2));  // bf16 0x3c3c (~0.0115) everywhere
  CK(cudaMalloc(&x, size_t(k) * K * 2));  // k identical rows (the "no gather" case reads them all)
  CK(cudaMemset(x, 0x3c, size_t(k) * K * 2));
  CK(cudaMalloc(&out, size_t(k) * N * 2 * 2));
  CK(cudaMalloc(&scratch, size_t(k) * N * 2 * 2));
  CK(cudaMalloc(&flush, flush_bytes));
  int32_t *offsets = nullptr, *rows = nullptr;
  const uint16_t** ptrs = nullptr;
  CK(cudaMalloc(&offsets, (E + 1) * sizeof(int32_t)));
  CK(cudaMalloc(&rows, k * sizeof(int32_t)));
  CK(cudaMalloc(&ptrs, E * sizeof(uint16_t*)));
  CK(cudaMemset(rows, 0, k * sizeof(int32_t)));  // one token: every row gathers x row 0
  std::vector<const uint16_t*> hp(E);
  for (int e = 0; e < E; ++e) hp[size_t(e)] = w + size_t(e) * per;
  CK(cudaMemcpy(ptrs, hp.data(), E * sizeof(uint16_t*), cudaMemcpyHostToDevice));
  // One token's table: one row for each chosen expert, in expert order.
  const auto table = [&](std::vector<int> chosen) {
    std::vector<int32_t> off(size_t(E) + 1, 0);
    for (int e = 0; e < E; ++e)
      off[size_t(e) + 1] = off[size_t(e)] + (std::find(chosen.begin(), chosen.end(), e) != chosen.end() ? 1 : 0);
    CK(cudaMemcpy(offsets, off.data(), off.size() * sizeof(int32_t), cudaMemcpyHostToDevice));
  };
  const std::vector<int> consecutive = {0, 1, 2, 3, 4, 5}, spread = {3, 14, 25, 36, 47, 58};
  const auto grouped = [&](bool gated) {
    grouped_gemm({.x = x, .x_rows = rows, .w = ptrs, .offsets = offsets, .out = out, .groups = E, .max_rows = k,
                  .N = N, .K = K, .x_rows_limit = 1, .w_base = w, .w_group_stride = int64_t(per),
                  .gated = gated ? I : 0, .gated_scratch = scratch});
  };
  gemm_block_stamps_start(size_t(1) << 14);
  struct Case {
    const char* name;
    double mb;
    Timing t;
  };
  std::vector<Case> cases;
  const double mb = double(k) * per * 2 / 1e6;
  cases.push_back({"dense", mb, measure([&] { gemm({.x = x, .w = w, .out = out, .M = 1, .N = k * N, .K = K}); }, flush, flush_bytes, sm_count)});
  cases.push_back({"dense gated", mb,
                   measure([&] {
                     gemm({.x = x, .w = w, .out = out, .M = 1, .N = k * N, .K = K, .gated = k * I, .gated_scratch = scratch});
                   }, flush, flush_bytes, sm_count)});
  table(consecutive);
  cases.push_back({"grouped 0-5 gated", mb, measure([&] { grouped(true); }, flush, flush_bytes, sm_count)});
  table(spread);
  cases.push_back({"grouped spread gated", mb, measure([&] { grouped(true); }, flush, flush_bytes, sm_count)});
  cases.push_back({"grouped spread plain", mb, measure([&] { grouped(false); }, flush, flush_bytes, sm_count)});
  // The tables read through L2 after the flush (a device-to-device copy reads them).
  char* sink = nullptr;
  CK(cudaMalloc(&sink, 4096));
  const auto warm_tables = [&] {
    CK(cudaMemcpyAsync(sink, offsets, (E + 1) * sizeof(int32_t), cudaMemcpyDeviceToDevice));
    CK(cudaMemcpyAsync(sink + 1024, rows, k * sizeof(int32_t), cudaMemcpyDeviceToDevice));
    CK(cudaMemcpyAsync(sink + 2048, ptrs, E * sizeof(uint16_t*), cudaMemcpyDeviceToDevice));
  };
  cases.push_back({"spread gated, tables L2", mb, measure([&] { grouped(true); }, flush, flush_bytes, sm_count, warm_tables)});
  cases.push_back({"spread gated, no gather", mb, measure([&] {
                     grouped_gemm({.x = x, .w = ptrs, .offsets = offsets, .out = out, .groups = E, .max_rows = k,
                                   .N = N, .K = K, .w_base = w, .w_group_stride = int64_t(per), .gated = I,
                                   .gated_scratch = scratch});
                   }, flush, flush_bytes, sm_count)});
  // A table of the six chosen experts only: offsets 0..6, their six pointers.
  int32_t* offsets6 = nullptr;
  const uint16_t** ptrs6 = nullptr;
  CK(cudaMalloc(&offsets6, (k + 1) * sizeof(int32_t)));
  CK(cudaMalloc(&ptrs6, k * sizeof(uint16_t*)));
  std::vector<int32_t> off6(size_t(k) + 1);
  std::vector<const uint16_t*> hp6(static_cast<size_t>(k));
  for (int j = 0; j <= k; ++j) off6[size_t(j)] = j;
  for (int j = 0; j < k; ++j) hp6[size_t(j)] = hp[size_t(spread[size_t(j)])];
  CK(cudaMemcpy(offsets6, off6.data(), off6.size() * sizeof(int32_t), cudaMemcpyHostToDevice));
  CK(cudaMemcpy(ptrs6, hp6.data(), hp6.size() * sizeof(uint16_t*), cudaMemcpyHostToDevice));
  cases.push_back({"spread gated, 6 groups", mb, measure([&] {
                     grouped_gemm({.x = x, .x_rows = rows, .w = ptrs6, .offsets = offsets6, .out = out, .groups = k,
                                   .max_rows = k, .N = N, .K = K, .x_rows_limit = 1, .gated = I,
                                   .gated_scratch = scratch});
                   }, flush, flush_bytes, sm_count)});
  gemm_block_stamps_stop();
  check_device_errors();
  std::printf("atlas_moe_stream_probe: alone on a flushed L2, medians of 7 launches (L2 evict_first %s)\n",
              std::getenv("ATLAS_L2_EVICT_FIRST") && std::getenv("ATLAS_L2_EVICT_FIRST")[0] == '0' ? "off" : "on");
  std::printf("%-24s %8s %7s %10s %8s %12s %8s %8s  %s\n", "case", "MB", "blocks", "span us", "TB/s", "block run us",
              "to go us", "stagger", "SMs holding 0/1/2/3/4+ working blocks (their blocks' median run, us)");
  for (const Case& c : cases) {
    std::printf("%-24s %8.1f %7d %10.2f %8.2f %12.2f %8.2f %8.2f ", c.name, c.mb, c.t.blocks, c.t.span_us,
                c.mb / c.t.span_us, c.t.block_us, c.t.wait_us, c.t.stagger_us);  // MB per us = TB/s
    for (int l = 0; l < 5; ++l) std::printf(" %d (%.1f)", c.t.sms[l], c.t.run_by_load[l]);
    std::printf("\n");
  }
  return 0;
}
