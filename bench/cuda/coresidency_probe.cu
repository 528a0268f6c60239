// Co-residency probe (a measurement, not part of atlas; session 21, docs/cuda-sessions.md "Status after
// session 21", item 5): in a batch-1 decode step the shared experts' gate|up runs the stream
// GEMM config (stream8x8/3w: 264 persistent blocks of 96 threads with 99 KB of dynamic shared
// memory, two per SM) on the low-priority side stream while the routed experts' gate|up (the
// 16x32x128/4 tiled config: 128 threads, 48 KB, 528 blocks at top-6) runs on the main stream. By
// arithmetic two stream blocks leave no room on an SM for a routed block, yet the CUPTI timelines
// show both running at once. Where do the routed blocks run, and when?
// Stand-in kernels with the same block shapes and shared memory hold their SM for a fixed time
// and record their SM (%smid) and start / end (%globaltimer); the "A" kernel (the stream GEMM's
// shape) is launched first on a low-priority stream, the "B" kernel (the routed GEMM's shape)
// right after on a high-priority one, as the decode step does. Each scenario prints B's span,
// how many B blocks started while an A block still held the same SM, on how many SMs, and B's
// blocks per SM; "B alone" is the baseline.
//   build/bench/cuda/atlas_coresidency_probe
#include "probe_util.h"

#include <cstdint>
#include <map>
#include <set>

// The configs' shared memory (gemm.cu): stream8x8/3w = 3 warps x 4 stages x (16 rows x 264) x 2
// bytes; 16x32x128/4 = 4 stages x (16 + 32) rows x 128 x 2 bytes.
constexpr int kStreamSmem = 3 * 4 * (2 * 8 * (256 + 8)) * 2;  // 101,376
constexpr int kStreamThreads = 96;
constexpr int kTiledSmem = 4 * (16 + 32) * 128 * 2;  // 49,152
constexpr int kTiledThreads = 128;

struct Rec {
  unsigned smid;
  unsigned long long start, end;
};

// Holds its SM for hold_ns from its start. Its shared memory is the launch's dynamic size: the
// block scheduler reserves it whether or not the kernel touches it.
__global__ void k_hold(Rec* rec, unsigned long long hold_ns) {
  const unsigned long long t0 = global_timer_ns();
  if (threadIdx.x == 0) {
    rec[blockIdx.x].smid = sm_id();
    rec[blockIdx.x].start = t0;
  }
  while (global_timer_ns() - t0 < hold_ns) {
  }
  __syncthreads();
  if (threadIdx.x == 0) rec[blockIdx.x].end = global_timer_ns();
}

struct Launch {
  int blocks, threads, smem;
  unsigned long long hold_ns;
};

void run(const Launch& l, cudaStream_t s, Rec* d) {
  k_hold<<<l.blocks, l.threads, l.smem, s>>>(d, l.hold_ns);
  CK(cudaGetLastError());
}

std::vector<Rec> fetch(const Rec* d, int n) {
  std::vector<Rec> h(static_cast<size_t>(n));
  CK(cudaMemcpy(h.data(), d, sizeof(Rec) * size_t(n), cudaMemcpyDeviceToHost));
  return h;
}

void report(const char* name, const std::vector<Rec>& a, const std::vector<Rec>& b) {
  unsigned long long t0 = ~0ull, b_first = ~0ull, b_last = 0;
  for (const Rec& r : a) t0 = std::min(t0, r.start);
  for (const Rec& r : b) {
    t0 = std::min(t0, r.start);
    b_first = std::min(b_first, r.start);
    b_last = std::max(b_last, r.end);
  }
  // A's occupancy per SM over time: a B block "beside A" started while an A block held its SM.
  std::map<unsigned, std::vector<std::pair<unsigned long long, unsigned long long>>> a_on;
  std::map<unsigned, int> a_per_sm, b_per_sm;
  for (const Rec& r : a) {
    a_on[r.smid].push_back({r.start, r.end});
    ++a_per_sm[r.smid];
  }
  int beside = 0;
  std::set<unsigned> beside_sms;
  for (const Rec& r : b) {
    ++b_per_sm[r.smid];
    for (const auto& [s, e] : a_on[r.smid])
      if (r.start >= s && r.start < e) {
        ++beside;
        beside_sms.insert(r.smid);
        break;
      }
  }
  int a_max = 0, b_max = 0;
  for (const auto& [sm, n] : a_per_sm) a_max = std::max(a_max, n);
  for (const auto& [sm, n] : b_per_sm) b_max = std::max(b_max, n);
  std::printf("%-34s B: %4zu blocks on %3zu SMs (max %d per SM), first start %7.2f us, last end %7.2f us, "
              "span %7.2f us; %4d started beside an A block (on %3zu SMs); A: %zu blocks on %zu SMs (max %d)\n",
              name, b.size(), b_per_sm.size(), b_max, (b_first - t0) / 1e3, (b_last - t0) / 1e3,
              (b_last - b_first) / 1e3, beside, beside_sms.size(), a.size(), a_per_sm.size(), a_max);
}

int main() {
  int dev = 0, sms = 0, lo = 0, hi = 0;
  CK(cudaGetDevice(&dev));
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  CK(cudaDeviceGetStreamPriorityRange(&lo, &hi));  // lo: the least priority (numerically greatest)
  CK(cudaFuncSetAttribute(k_hold, cudaFuncAttributeMaxDynamicSharedMemorySize, kStreamSmem));
  cudaStream_t s_low, s_high;
  CK(cudaStreamCreateWithPriority(&s_low, cudaStreamNonBlocking, lo));
  CK(cudaStreamCreateWithPriority(&s_high, cudaStreamNonBlocking, hi));
  const int nb = 4 * sms;  // the routed gate|up's real blocks at top-6 (6 x 88 = 528 on 132 SMs)
  Rec *da = nullptr, *db = nullptr;
  CK(cudaMalloc(&da, sizeof(Rec) * size_t(4 * sms)));
  CK(cudaMalloc(&db, sizeof(Rec) * size_t(nb)));
  std::printf("%d SMs; A = the stream GEMM's shape held 40 us, B = the routed GEMM's shape (%d blocks x %d threads, "
              "%d B) held 5 us per block\n",
              sms, nb, kTiledThreads, kTiledSmem);
  const Launch b_launch{nb, kTiledThreads, kTiledSmem, 5000};
  struct Scenario {
    const char* name;
    int a_blocks, a_smem;  // a_blocks 0: B alone
  };
  const Scenario scenarios[] = {
      {"B alone", 0, 0},
      {"A 2/SM x 99 KB (the decode step)", 2 * sms, kStreamSmem},
      {"A 2/SM x 74 KB (a 3-stage ring)", 2 * sms, kStreamSmem * 3 / 4},
      {"A 1/SM x 99 KB", sms, kStreamSmem},
  };
  for (int rep = 0; rep < 2; ++rep) {  // the first round warms up
    for (const Scenario& sc : scenarios) {
      CK(cudaMemset(da, 0, sizeof(Rec) * size_t(4 * sms)));
      CK(cudaMemset(db, 0, sizeof(Rec) * size_t(nb)));
      CK(cudaDeviceSynchronize());
      if (sc.a_blocks > 0) run({sc.a_blocks, kStreamThreads, sc.a_smem, 40000}, s_low, da);
      run(b_launch, s_high, db);
      CK(cudaDeviceSynchronize());
      if (rep == 1) report(sc.name, sc.a_blocks > 0 ? fetch(da, sc.a_blocks) : std::vector<Rec>{}, fetch(db, nb));
    }
  }
  CK(cudaFree(da));
  CK(cudaFree(db));
  return 0;
}
