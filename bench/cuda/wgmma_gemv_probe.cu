// atlas_wgmma_gemv_probe (session 22): can a one-row GEMM run on wgmma with the operands swapped
// (64 weight rows as the instruction's A operand, the x rows as its 8-wide B operand:
// wgmma.m64n8k16, D = W . X^T) and still give the batch-invariant contract's bits, and how fast
// does such a kernel stream weights? Why: the decode step's expert GEMMs (mma.sync m16n8k16 with
// the x row as A, 15 of its 16 rows zero) move their bytes at ~3 TB/s and Nsight has the stream
// kernel instruction-bound (docs/cuda-sessions.md, session 13: ~490 instructions per 4 KB step); a
// wgmma.m64n8k16 takes 2 KB of weights per instruction from shared memory.
//
// Part 1 (bits): the contract's reference (kernels/gemm_mma.cuh: per 256-wide K slice an fp32
// chain of m16n8k16 mma over the k16 chunks from +0, the slices added in order) on mma.sync with
// fragments loaded from global memory, against the swapped wgmma kernel below; every output
// compared bit for bit (M = 1 and 5, K = 2048 and 1408).
// Part 2 (speed): the swapped kernel as a persistent grid over the routed experts' bytes of a
// batch-1 MoE layer (gate|up: N = 16896, K = 2048, 69 MB; down: N = 12288, K = 1408, 35 MB),
// ring depths and steps of 64 / 128 / 256 k, with and without the wgmma (without: the copy
// pattern's ceiling), and the same over a tile-major weight layout (one contiguous run per step;
// speed only, the engine stores weights row-major).
// Timing: each configuration as a single launch between CUDA events (launch and ramp included:
// the figures of session 22's runs s22-3, s22-4, s22-7) and, added after s22-7, by the kernel's
// own span (%globaltimer, first block's start to last block's end).
// Standalone: includes the kernels' wgmma helpers only (since session 23 the m64n8k16 wrapper of
// kernels/gemm_wgstream.cuh, the production kernel built on this probe).
#include <array>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <tuple>
#include <vector>

#include "backend/cuda/kernels/gemm_wgstream.cuh"  // wgmma_m64n8k16 (the production kernel's), wg_desc, ...
#include "probe_util.h"

namespace {

using namespace atlas::cuda::kern;

constexpr int kAtomK = 64;                 // k per swizzle atom (one 128-byte swizzled row)
constexpr int kRowsW = 64;                 // weight rows per tile (wgmma M)
constexpr int kRowsX = 8;                  // x rows (wgmma N)
constexpr int kAtomW = kRowsW * kAtomK * 2;  // 8 KB: one [64][64] atom of weights
constexpr int kAtomX = kRowsX * kAtomK * 2;  // 1 KB: one [8][64] atom of x

__device__ __forceinline__ uint32_t ld32(const uint16_t* p) { return *reinterpret_cast<const uint32_t*>(p); }

// The contract on mma.sync, one warp per n8 tile, M <= 8 (A rows 8-15 zero), K % 16 == 0.
__global__ void ref_kernel(const uint16_t* x, const uint16_t* w, float* out, int M, int N, int K) {
  const int lane = threadIdx.x & 31;
  const int n0 = ((blockIdx.x * blockDim.x + threadIdx.x) >> 5) * 8;
  if (n0 >= N) return;
  const int g = lane >> 2, t = lane & 3;
  float tot[4] = {0.f, 0.f, 0.f, 0.f};
  for (int s0 = 0; s0 < K; s0 += kSliceK) {
    float acc[4] = {0.f, 0.f, 0.f, 0.f};
    for (int k = s0; k < min(K, s0 + kSliceK); k += 16) {
      uint32_t a[4] = {g < M ? ld32(x + size_t(g) * K + k + 2 * t) : 0u, 0u,
                       g < M ? ld32(x + size_t(g) * K + k + 8 + 2 * t) : 0u, 0u};
      const uint16_t* wr = w + size_t(n0 + g) * K + k;
      mma_bf16_16816(acc, a, ld32(wr + 2 * t), ld32(wr + 8 + 2 * t));  // gemm_mma.cuh's
    }
    for (int e = 0; e < 4; ++e) tot[e] = __fadd_rn(tot[e], acc[e]);
  }
  if (g < M) {
    out[size_t(g) * N + n0 + 2 * t] = tot[0];
    out[size_t(g) * N + n0 + 2 * t + 1] = tot[1];
  }
}

// Persistent: block b takes 64-row tiles [b T / B, (b + 1) T / B) and walks their K steps (BK =
// 64, 128 or 256: each weight row's run per step is 2 BK bytes) as one sequence through a
// STAGES-deep cp.async ring (STAGES - 2 steps ahead; a slot is refilled two steps after its last
// read, whose wgmma group was retired by wait_group 1). A step's slot holds BK / 64 swizzle atoms.
// Slice sums folded into the total when a slice's last group has retired (the contract's
// order); M <= 8.
template <int BK, int STAGES, bool kMath, bool kTiled = false>
__global__ void __launch_bounds__(128) wg_gemv_kernel(const uint16_t* x, const uint16_t* w, float* out, int M, int N,
                                                      int K, int tiles, KernelSpan* span) {
  span_begin(span);
  extern __shared__ unsigned char raw[];
  const uint32_t raw_addr = smem_u32(raw);
  unsigned char* ring = raw + (((raw_addr + 1023u) & ~1023u) - raw_addr);
  constexpr int kAtoms = BK / kAtomK, kTileW = kAtoms * kAtomW, kTileX = kAtoms * kAtomX;
  constexpr int kStepsPerSlice = kSliceK / BK;
  uint16_t* sW = reinterpret_cast<uint16_t*>(ring);                   // [STAGES][atoms][64][64]
  uint16_t* sX = reinterpret_cast<uint16_t*>(ring + STAGES * kTileW);  // [STAGES][atoms][8][64]
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  for (int i = tid; i < STAGES * kTileX / 2; i += 128) sX[i] = 0;  // x rows >= M stay zero
  __syncthreads();
  const int t0 = int(int64_t(blockIdx.x) * tiles / gridDim.x), t1 = int(int64_t(blockIdx.x + 1) * tiles / gridDim.x);
  const int KT = (K + BK - 1) / BK, total = (t1 - t0) * KT;
  // Chunk j of a step: row j / CPR, 16-byte chunk j % CPR of the row's BK (consecutive threads
  // take consecutive chunks of one row: 2 BK contiguous bytes), in atom c / 8 at chunk c % 8.
  constexpr int CPR = BK / 8;
  const auto load = [&](int slot, int i) {
    const int n0 = (t0 + i / KT) * kRowsW, k0 = (i % KT) * BK;
#pragma unroll
    for (int q = 0; q < kRowsW * CPR / 128; ++q) {
      const int j = tid + 128 * q, r = j / CPR, c = j % CPR, a = c >> 3, cc = c & 7;
      const bool in = k0 + c * 8 < K;
      // kTiled (speed only: a layout the engine does not have): the weights stored tile-major,
      // each (tile, step) block of 64 rows x BK contiguous, so a step reads one 8-32 KB run
      // instead of 64 runs of 2 BK bytes.
      const int bk = min(BK, K - k0);  // a short last step's block is 64 x bk
      const uint16_t* src = kTiled ? w + size_t(n0) * K + size_t(k0) * kRowsW + r * bk + c * 8
                                   : w + size_t(n0 + r) * K + k0 + c * 8;
      cp_async16(sW + slot * (kTileW / 2) + a * (kAtomW / 2) + r * kAtomK + ((cc ^ (r & 7)) * 8), in ? src : w,
                 in ? 16 : 0);
    }
    for (int j = tid; j < M * CPR; j += 128) {
      const int r = j / CPR, c = j % CPR, a = c >> 3, cc = c & 7;
      const bool in = k0 + c * 8 < K;
      cp_async16(sX + slot * (kTileX / 2) + a * (kAtomX / 2) + r * kAtomK + ((cc ^ (r & 7)) * 8),
                 in ? x + size_t(r) * K + k0 + c * 8 : x, in ? 16 : 0);
    }
  };
  constexpr int kAhead = STAGES - 2;
#pragma unroll
  for (int s = 0; s < kAhead; ++s) {
    if (s < total) load(s, s);
    cp_async_commit();
  }
  float acc[4] = {0.f, 0.f, 0.f, 0.f}, tot[4] = {0.f, 0.f, 0.f, 0.f};
  const int g = lane >> 2, t = lane & 3;
  const auto store = [&](int tile) {
    const int n = tile * kRowsW + warp * 16 + g;
    if (2 * t < M) {
      out[size_t(2 * t) * N + n] = tot[0];
      out[size_t(2 * t) * N + n + 8] = tot[2];
    }
    if (2 * t + 1 < M) {
      out[size_t(2 * t + 1) * N + n] = tot[1];
      out[size_t(2 * t + 1) * N + n + 8] = tot[3];
    }
  };
  bool pending = false;
  for (int i = 0; i < total; ++i) {
    cp_async_wait<kAhead - 1>();
    fence_proxy_async_smem();
    __syncthreads();
    if (i + kAhead < total) load((i + kAhead) % STAGES, i + kAhead);
    cp_async_commit();
    const int kt = i % KT;
    if (pending) {  // a slice is complete: total += slice, a new slice from +0
      wg_wait_all();
      for (int e = 0; e < 4; ++e) {
        tot[e] = __fadd_rn(tot[e], acc[e]);
        acc[e] = 0.f;
      }
      pending = false;
      if (kt == 0) {  // ... and it was the tile's last
        store(t0 + (i - 1) / KT);
        for (int e = 0; e < 4; ++e) tot[e] = 0.f;
      }
    }
    if constexpr (kMath) {
      const uint32_t wb = smem_u32(sW + (i % STAGES) * (kTileW / 2)), xb = smem_u32(sX + (i % STAGES) * (kTileX / 2));
      wg_fence();
      const int kc = min(BK / 16, (K - kt * BK) / 16);  // k16 chunks inside K (K % 16 == 0)
#pragma unroll
      for (int kk = 0; kk < BK / 16; ++kk)
        if (kk < kc)
          wgmma_m64n8k16(acc, wg_desc(wb + (kk >> 2) * kAtomW + (kk & 3) * 32),
                         wg_desc(xb + (kk >> 2) * kAtomX + (kk & 3) * 32));
      wg_commit();
      wg_wait_one();
    }
    pending = (kt + 1) % kStepsPerSlice == 0 || kt + 1 == KT;
  }
  wg_wait_all();
  cp_async_wait<0>();
  if (total > 0) {
    for (int e = 0; e < 4; ++e) tot[e] = __fadd_rn(tot[e], acc[e]);
    store(t1 - 1);
  }
  span_end(span);
}

__global__ void fill_bf16(uint16_t* p, size_t n, uint32_t seed) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    uint32_t h = uint32_t(i) * 2654435761u ^ seed;
    h ^= h >> 15;
    h *= 2246822519u;
    h ^= h >> 13;
    // bf16 in about [-0.5, 0.5): sign, exponent 117..125, random mantissa
    p[i] = uint16_t(((h >> 31) << 15) | ((117u + (h >> 8) % 9u) << 7) | (h & 0x7fu));
  }
}

// A timed configuration: the median event-timed single launch (launch and ramp included) and the
// kernel's own span (probe_util.h).
struct Timing {
  float single_us = 0.f;
  double span_us = 0.0;
};

template <int BK, int STAGES, bool kMath, bool kTiled = false>
Timing run_wg(const uint16_t* x, const uint16_t* w, float* out, int M, int N, int K, int sms, int* blocks_out,
              bool time_it) {
  auto f = wg_gemv_kernel<BK, STAGES, kMath, kTiled>;
  const int smem = STAGES * (BK / kAtomK) * (kAtomW + kAtomX) + 1024;
  CK(cudaFuncSetAttribute(f, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  int per_sm = 0;
  CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, f, 128, size_t(smem)));
  const int tiles = N / kRowsW;
  const int blocks = std::min(tiles, sms * std::max(per_sm, 1));
  *blocks_out = blocks;
  const auto go = [&] { f<<<blocks, 128, smem>>>(x, w, out, M, N, K, tiles, nullptr); };
  if (!time_it) {
    go();
    CK(cudaGetLastError());
    CK(cudaDeviceSynchronize());
    return {};
  }
  static KernelSpan* span = nullptr;
  if (span == nullptr) CK(cudaMalloc(&span, sizeof(KernelSpan)));
  Timing t;
  t.single_us = median_us(nullptr, 3, 20, go);
  t.span_us = kernel_span_us(span, [&](KernelSpan* d) { f<<<blocks, 128, smem>>>(x, w, out, M, N, K, tiles, d); });
  return t;
}

}  // namespace

int main() {
  const int sms = hopper_sm_count("wgmma probe");
  if (sms == 0) return 0;
  // Part 1: bits.
  bool all_equal = true;
  for (const auto& [M, N, K] : std::vector<std::array<int, 3>>{{1, 5632, 2048}, {5, 5632, 2048}, {1, 4096, 1408},
                                                                {8, 4096, 1408}}) {
    uint16_t *x, *w;
    float *o_ref, *o_wg;
    CK(cudaMalloc(&x, size_t(M) * K * 2));
    CK(cudaMalloc(&w, size_t(N) * K * 2));
    CK(cudaMalloc(&o_ref, size_t(M) * N * 4));
    CK(cudaMalloc(&o_wg, size_t(M) * N * 4));
    fill_bf16<<<256, 256>>>(x, size_t(M) * K, 0x1234u + M);
    fill_bf16<<<1024, 256>>>(w, size_t(N) * K, 0xabcdu + K);
    CK(cudaMemset(o_wg, 0xff, size_t(M) * N * 4));
    ref_kernel<<<(N / 8 * 32 + 255) / 256, 256>>>(x, w, o_ref, M, N, K);
    CK(cudaGetLastError());
    int blocks = 0;
    run_wg<64, 6, true>(x, w, o_wg, M, N, K, sms, &blocks, false);
    std::vector<uint32_t> c(size_t(M) * N);
    CK(cudaMemcpy(c.data(), o_wg, c.size() * 4, cudaMemcpyDeviceToHost));
    CK(cudaMemset(o_wg, 0xff, size_t(M) * N * 4));
    run_wg<256, 3, true>(x, w, o_wg, M, N, K, sms, &blocks, false);
    std::vector<uint32_t> a(size_t(M) * N), b(size_t(M) * N);
    CK(cudaMemcpy(a.data(), o_ref, a.size() * 4, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(b.data(), o_wg, b.size() * 4, cudaMemcpyDeviceToHost));
    size_t diff = 0, first = size_t(-1);
    for (size_t i = 0; i < a.size(); ++i)
      if (a[i] != b[i] || a[i] != c[i]) {
        ++diff;
        if (first == size_t(-1)) first = i;
      }
    all_equal &= diff == 0;
    std::printf("bits M=%d N=%d K=%d: %zu of %zu outputs differ (BK 64 or 256)", M, N, K, diff, a.size());
    if (diff) {
      float fa, fb;
      std::memcpy(&fa, &a[first], 4);
      std::memcpy(&fb, &b[first], 4);
      std::printf(" (first at %zu: contract %.9g, wgmma %.9g)", first, fa, fb);
    }
    std::printf("\n");
    CK(cudaFree(x));
    CK(cudaFree(w));
    CK(cudaFree(o_ref));
    CK(cudaFree(o_wg));
  }
  std::printf("bits: %s\n", all_equal ? "the swapped wgmma kernel gives the contract's bits" : "DIFFERENT");

  // Part 2: speed, M = 1.
  for (const auto& [name, N, K] : std::vector<std::tuple<const char*, int, int>>{{"routed gate|up", 16896, 2048},
                                                                               {"routed down", 12288, 1408}}) {
    uint16_t *x, *w;
    float* o;
    CK(cudaMalloc(&x, size_t(K) * 2));
    CK(cudaMalloc(&w, size_t(N) * K * 2));
    CK(cudaMalloc(&o, size_t(N) * 4));
    fill_bf16<<<256, 256>>>(x, size_t(K), 7u);
    fill_bf16<<<1024, 256>>>(w, size_t(N) * K, 9u);
    const double mb = double(N) * K * 2 / 1e6;
    int blocks = 0;
    const auto report = [&](const char* what, Timing t) {  // MB per us = TB/s
      std::printf("%-15s %6.1f MB  %-26s %4d blocks  single %8.2f us %5.2f TB/s  span %8.2f us %5.2f TB/s\n", name,
                  mb, what, blocks, t.single_us, mb / t.single_us, t.span_us, mb / t.span_us);
    };
    report("wgmma, BK 64 x 6 stages", run_wg<64, 6, true>(x, w, o, 1, N, K, sms, &blocks, true));
    report("wgmma, BK 64 x 8 stages", run_wg<64, 8, true>(x, w, o, 1, N, K, sms, &blocks, true));
    report("wgmma, BK 128 x 4 stages", run_wg<128, 4, true>(x, w, o, 1, N, K, sms, &blocks, true));
    report("wgmma, BK 128 x 6 stages", run_wg<128, 6, true>(x, w, o, 1, N, K, sms, &blocks, true));
    report("wgmma, BK 256 x 3 stages", run_wg<256, 3, true>(x, w, o, 1, N, K, sms, &blocks, true));
    report("wgmma, BK 256 x 4 stages", run_wg<256, 4, true>(x, w, o, 1, N, K, sms, &blocks, true));
    report("copies, BK 64 x 8 stages", run_wg<64, 8, false>(x, w, o, 1, N, K, sms, &blocks, true));
    report("copies, BK 128 x 6 stages", run_wg<128, 6, false>(x, w, o, 1, N, K, sms, &blocks, true));
    report("copies, BK 256 x 3 stages", run_wg<256, 3, false>(x, w, o, 1, N, K, sms, &blocks, true));
    report("tiled: wgmma, BK 64 x 8", run_wg<64, 8, true, true>(x, w, o, 1, N, K, sms, &blocks, true));
    report("tiled: wgmma, BK 128 x 6", run_wg<128, 6, true, true>(x, w, o, 1, N, K, sms, &blocks, true));
    report("tiled: wgmma, BK 256 x 3", run_wg<256, 3, true, true>(x, w, o, 1, N, K, sms, &blocks, true));
    report("tiled: copies, BK 128 x 6", run_wg<128, 6, false, true>(x, w, o, 1, N, K, sms, &blocks, true));
    report("tiled: copies, BK 256 x 3", run_wg<256, 3, false, true>(x, w, o, 1, N, K, sms, &blocks, true));
    CK(cudaFree(x));
    CK(cudaFree(w));
    CK(cudaFree(o));
  }
  return all_equal ? 0 : 1;
}
