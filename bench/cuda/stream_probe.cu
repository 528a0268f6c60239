// Weight-streaming probe (atlas_cuda_bench, BM_StreamProbe): how fast the GPU reads a weight
// pool through cp.async in the decode-step grouped GEMM's access pattern (a block's K step
// copies `seg` bytes from each of 16 KB / seg consecutive weight rows of 4 KB) against the same
// bytes read as one contiguous 16 KB run per step. No arithmetic: the answer separates the DRAM
// access pattern from the GEMM kernel's own costs (session 7: the grouped GEMM at ~3.7 TB/s in
// every tile config).
#include <cuda_runtime.h>

#include <cstdint>
#include <stdexcept>
#include <string>

#include "stream_probe.h"

namespace atlas_bench {
namespace {

constexpr int kThreads = 256, kStages = 4, kStageBytes = 16384, kRowBytes = 4096;

__device__ __forceinline__ void copy16(uint32_t dst, const void* src) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(dst), "l"(src) : "memory");
}

// Block b streams tile b: rows [b * R, b * R + R) of 4 KB (R = 16 KB / seg), kRowBytes / seg steps.
__global__ void __launch_bounds__(kThreads) stream_probe_kernel(const unsigned char* pool, int seg, int contiguous,
                                                                unsigned* sink) {
  extern __shared__ __align__(128) unsigned char ring[];
  const int rows = kStageBytes / seg, steps = kRowBytes / seg, chunks_per_row = seg / 16;
  const unsigned char* tile = pool + size_t(blockIdx.x) * rows * kRowBytes;
  const uint32_t ring0 = uint32_t(__cvta_generic_to_shared(ring));
  auto issue = [&](int step) {
    const uint32_t slot = ring0 + uint32_t(step % kStages) * kStageBytes;
    for (int i = threadIdx.x; i < kStageBytes / 16; i += kThreads) {
      const unsigned char* src = contiguous ? tile + size_t(step) * kStageBytes + size_t(i) * 16
                                            : tile + size_t(i / chunks_per_row) * kRowBytes + size_t(step) * seg +
                                                  size_t(i % chunks_per_row) * 16;
      copy16(slot + uint32_t(i) * 16, src);
    }
  };
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < steps) issue(s);
    asm volatile("cp.async.commit_group;\n" ::: "memory");
  }
  unsigned acc = 0;
  for (int s = 0; s < steps; ++s) {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(kStages - 2) : "memory");
    __syncthreads();
    if (s + kStages - 1 < steps) issue(s + kStages - 1);
    asm volatile("cp.async.commit_group;\n" ::: "memory");
    acc += reinterpret_cast<const unsigned*>(ring + (s % kStages) * kStageBytes)[threadIdx.x];
  }
  if (acc == 0x9e3779b9u) *sink = acc;  // keeps the reads observable
}

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw std::runtime_error(std::string("stream probe: ") + what + ": " + cudaGetErrorString(e));
}

}  // namespace

double stream_probe_us(const StreamProbeArgs& a) {
  if (a.seg_bytes < 16 || a.seg_bytes > kRowBytes || kRowBytes % a.seg_bytes != 0 || kStageBytes % a.seg_bytes != 0)
    throw std::invalid_argument("stream probe: seg_bytes must divide 4096 and be at least 16");
  const size_t tile_bytes = size_t(kStageBytes / a.seg_bytes) * kRowBytes;
  const unsigned blocks = unsigned(a.bytes / tile_bytes);
  static unsigned* sink = nullptr;
  if (!sink) check(cudaMalloc(&sink, sizeof(unsigned)), "cudaMalloc");
  const int smem = kStages * kStageBytes;
  check(cudaFuncSetAttribute(stream_probe_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem), "smem");
  cudaEvent_t e0, e1;
  check(cudaEventCreate(&e0), "event");
  check(cudaEventCreate(&e1), "event");
  stream_probe_kernel<<<blocks, kThreads, smem>>>(static_cast<const unsigned char*>(a.pool), a.seg_bytes,
                                                  a.contiguous ? 1 : 0, sink);  // warm-up
  check(cudaEventRecord(e0), "record");
  for (int i = 0; i < a.iters; ++i)
    stream_probe_kernel<<<blocks, kThreads, smem>>>(static_cast<const unsigned char*>(a.pool), a.seg_bytes,
                                                    a.contiguous ? 1 : 0, sink);
  check(cudaEventRecord(e1), "record");
  check(cudaEventSynchronize(e1), "sync");
  float ms = 0;
  check(cudaEventElapsedTime(&ms, e0, e1), "elapsed");
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  check(cudaGetLastError(), "launch");
  return double(ms) * 1e3 / a.iters;
}

}  // namespace atlas_bench
