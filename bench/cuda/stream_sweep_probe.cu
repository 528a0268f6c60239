// atlas_stream_sweep_probe (session 22, not yet run on a GPU when written): how fast can one
// kernel read the weight bytes of a batch-1 MoE phase on this GPU, and with which copy path and
// grid shape? The decode step's expert GEMMs move ~3 TB/s in place (docs/cuda-sessions.md, "Status after
// session 22"), and atlas_wgmma_gemv_probe's event-timed single launches put a copies-only grid of
// the GEMM's shape at 3.0-3.1 TB/s, a figure that includes the launch; this probe times the
// kernel itself (%globaltimer: first block's start to last block's end) and the per-launch time
// of back-to-back launches in a CUDA graph (what a decode step's graph sees), so the ceiling the
// expert GEMMs work against is measured rather than guessed.
//
// Each variant reads the whole pool once (bytes split evenly over a persistent grid of
// blocks_per_sm x SMs blocks, each block one contiguous range) and folds what it read into a
// checksum (so the reads are not dead code):
//   cpasync   16-byte cp.async into a STAGES-deep shared ring of `stage` bytes per step;
//   bulk      one cp.async.bulk (the copy engine) per step of `stage` bytes, completing on the
//             slot's mbarrier (the stream GEMM kernel's copy path);
//   ldg       16-byte loads straight into registers, 8 in flight per thread.
// Pools: 69 MB (the routed experts' gate|up at batch 1), 35 MB (their down), 138 MB (a MoE
// layer's expert bytes).
#include <cstdint>
#include <cstdio>
#include <vector>

#include "backend/cuda/kernels/gemm_stream.cuh"  // bulk_copy_to_shared, mbarriers (sm_90a)
#include "probe_util.h"

namespace {

using namespace atlas::cuda::kern;

// The byte range [lo, hi) of block b (16-byte aligned).
__device__ __forceinline__ void block_range(size_t bytes, size_t& lo, size_t& hi) {
  const size_t chunks = bytes / 16;
  lo = chunks * blockIdx.x / gridDim.x * 16;
  hi = chunks * (blockIdx.x + 1) / gridDim.x * 16;
}

template <int STAGES>
__global__ void cpasync_kernel(const unsigned char* pool, size_t bytes, int stage, unsigned* sink, KernelSpan* span) {
  span_begin(span);
  extern __shared__ __align__(128) unsigned char ring[];
  size_t lo, hi;
  block_range(bytes, lo, hi);
  const int steps = int((hi - lo + stage - 1) / stage);
  const auto issue = [&](int s) {
    const size_t base = lo + size_t(s) * stage;
    for (int i = threadIdx.x * 16; i < stage; i += blockDim.x * 16)
      if (base + i < hi) cp_async16(ring + (s % STAGES) * stage + i, pool + base + i, 16);
  };
  for (int s = 0; s < STAGES - 1; ++s) {
    if (s < steps) issue(s);
    cp_async_commit();
  }
  unsigned acc = 0;
  for (int s = 0; s < steps; ++s) {
    cp_async_wait<STAGES - 2>();
    __syncthreads();
    acc ^= reinterpret_cast<const unsigned*>(ring + (s % STAGES) * stage)[threadIdx.x % (stage / 4)];
    __syncthreads();  // the slot read above is refilled below (s + STAGES - 1 lands in slot s - 1)
    if (s + STAGES - 1 < steps) issue(s + STAGES - 1);
    cp_async_commit();
  }
  cp_async_wait<0>();
  if (acc == 0x9e3779b9u) *sink = acc;
  span_end(span);
}

// One producer thread issues a bulk copy per step; every thread waits on the slot's barrier.
template <int STAGES>
__global__ void bulk_kernel(const unsigned char* pool, size_t bytes, int stage, unsigned* sink, KernelSpan* span) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  span_begin(span);
  extern __shared__ __align__(128) unsigned char ring[];
  __shared__ __align__(8) uint64_t full[STAGES];
  size_t lo, hi;
  block_range(bytes, lo, hi);
  const int steps = int((hi - lo + stage - 1) / stage);
  if (threadIdx.x == 0)
    for (int i = 0; i < STAGES; ++i) mbar_init(smem_u32(&full[i]), 1);
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  __syncthreads();
  const auto issue = [&](int s) {
    const size_t base = lo + size_t(s) * stage;
    const uint32_t n = uint32_t(min(size_t(stage), hi - base));
    const uint32_t bar = smem_u32(&full[s % STAGES]);
    mbar_arrive_expect_tx(bar, n);
    bulk_copy_to_shared(smem_u32(ring + (s % STAGES) * stage), reinterpret_cast<const uint16_t*>(pool + base), n, bar,
                        L2Hint{});
  };
  if (threadIdx.x == 0)
    for (int s = 0; s < STAGES && s < steps; ++s) issue(s);
  unsigned acc = 0;
  for (int s = 0; s < steps; ++s) {
    mbar_wait(smem_u32(&full[s % STAGES]), uint32_t((s / STAGES) & 1));
    acc ^= reinterpret_cast<const unsigned*>(ring + (s % STAGES) * stage)[threadIdx.x % (stage / 4)];
    __syncthreads();  // every thread is done with the slot
    if (threadIdx.x == 0 && s + STAGES < steps) issue(s + STAGES);
  }
  if (acc == 0x9e3779b9u) *sink = acc;
  span_end(span);
#else
  __trap();
#endif
}

__global__ void ldg_kernel(const unsigned char* pool, size_t bytes, int, unsigned* sink, KernelSpan* span) {
  span_begin(span);
  size_t lo, hi;
  block_range(bytes, lo, hi);
  const uint4* p = reinterpret_cast<const uint4*>(pool);
  uint4 acc = make_uint4(0, 0, 0, 0);
  const size_t per_round = size_t(blockDim.x) * 8;
  for (size_t c = lo / 16 + threadIdx.x; c < hi / 16; c += per_round) {
    uint4 v[8];
#pragma unroll
    for (int u = 0; u < 8; ++u) {
      const size_t i = c + size_t(u) * blockDim.x;
      v[u] = i < hi / 16 ? __ldcs(p + i) : make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int u = 0; u < 8; ++u) {
      acc.x ^= v[u].x;
      acc.y ^= v[u].y;
      acc.z ^= v[u].z;
      acc.w ^= v[u].w;
    }
  }
  if ((acc.x ^ acc.y ^ acc.z ^ acc.w) == 0x9e3779b9u) *sink = acc.x;
  span_end(span);
}

using Kernel = void (*)(const unsigned char*, size_t, int, unsigned*, KernelSpan*);

struct Variant {
  const char* name;
  Kernel kernel;
  int threads, blocks_per_sm, stage, smem;
};

}  // namespace

int main() {
  const int sms = hopper_sm_count("stream sweep probe");
  if (sms == 0) return 0;
  const size_t max_bytes = size_t(138) << 20;
  unsigned char* pool = nullptr;
  unsigned* sink = nullptr;
  KernelSpan* span = nullptr;
  CK(cudaMalloc(&pool, max_bytes));
  CK(cudaMemset(pool, 0x5a, max_bytes));
  CK(cudaMalloc(&sink, 4));
  CK(cudaMalloc(&span, sizeof(KernelSpan)));
  const std::vector<Variant> variants = {
      {"cpasync 128t x1 16K x4", cpasync_kernel<4>, 128, 1, 16384, 4 * 16384},
      {"cpasync 256t x1 32K x4", cpasync_kernel<4>, 256, 1, 32768, 4 * 32768},
      {"cpasync 256t x2 16K x4", cpasync_kernel<4>, 256, 2, 16384, 4 * 16384},
      {"cpasync 128t x2 16K x6", cpasync_kernel<6>, 128, 2, 16384, 6 * 16384},
      {"cpasync 256t x3 16K x4", cpasync_kernel<4>, 256, 3, 16384, 4 * 16384},
      {"cpasync 512t x1 32K x6", cpasync_kernel<6>, 512, 1, 32768, 6 * 32768},
      {"bulk 128t x1 32K x6", bulk_kernel<6>, 128, 1, 32768, 6 * 32768},
      {"bulk 128t x2 16K x6", bulk_kernel<6>, 128, 2, 16384, 6 * 16384},
      {"bulk 128t x2 32K x3", bulk_kernel<3>, 128, 2, 32768, 3 * 32768},
      {"bulk 128t x4 8K x6", bulk_kernel<6>, 128, 4, 8192, 6 * 8192},
      {"ldg 512t x2", ldg_kernel, 512, 2, 0, 0},
      {"ldg 1024t x2", ldg_kernel, 1024, 2, 0, 0},
      {"ldg 256t x8", ldg_kernel, 256, 8, 0, 0},
  };
  std::printf("%d SMs; per variant: event-timed single launch, per launch in a graph of 8, the kernel's own span\n",
              sms);
  for (const double mb : {69.2, 34.6, 138.4}) {
    const size_t bytes = size_t(mb * 1e6) / 16 * 16;
    for (const Variant& v : variants) {
      if (v.smem > 0)
        CK(cudaFuncSetAttribute(v.kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, v.smem));
      int fits = 0;
      CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&fits, v.kernel, v.threads, size_t(v.smem)));
      if (fits < v.blocks_per_sm) {
        std::printf("%6.1f MB  %-24s  skipped: %d blocks per SM fit\n", mb, v.name, fits);
        continue;
      }
      const unsigned grid = unsigned(sms * v.blocks_per_sm);
      const auto go = [&](cudaStream_t s) { v.kernel<<<grid, v.threads, v.smem, s>>>(pool, bytes, v.stage, sink, nullptr); };
      const float single = median_us(nullptr, 3, 15, [&] { go(nullptr); });
      cudaStream_t s;
      CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
      const float in_graph = graph_us_per_launch(s, 8, [&] {
        for (int i = 0; i < 8; ++i) go(s);
      });
      CK(cudaStreamDestroy(s));
      const double span_us = kernel_span_us(span, [&](KernelSpan* d) {
        v.kernel<<<grid, v.threads, v.smem>>>(pool, bytes, v.stage, sink, d);
      });
      std::printf("%6.1f MB  %-24s  %4u blocks  single %7.2f us %5.2f TB/s  graph %7.2f us %5.2f TB/s  span %7.2f us %5.2f TB/s\n",
                  mb, v.name, grid, single, mb / single, in_graph, mb / in_graph, span_us, mb / span_us);
    }
  }
  CK(cudaFree(pool));
  CK(cudaFree(sink));
  CK(cudaFree(span));
  return 0;
}
