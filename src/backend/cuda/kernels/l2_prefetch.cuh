// Weights pulled into L2 ahead of the kernel that reads them (session 37, ATLAS_L2_PREFETCH):
// a few small blocks on the side stream issue prefetches over up to kL2PrefetchRanges byte
// ranges and write nothing, so no output can change. Why: at a batch-1 decode step the
// attention section's launches move ~27 MB in ~27 us (latency-bound chains) while the MoE phase
// after it moves ~138 MB at what the memory system gives (~3.2 TB/s, sessions 33-35); the
// shared experts' weights read from L2 leave HBM to the routed experts. Measured (s37-2, s37-3):
// the shared gate|up read from L2 ends ~4 us sooner, the routed gate|up not at all (it is bound
// by its own blocks, not by HBM), the attention section slows beside the prefetch: slower, so off.
#pragma once

#include <cstdint>

#include "common.cuh"

namespace atlas::cuda::kern {

constexpr int kL2PrefetchRanges = 4;
constexpr int kL2PrefetchPiece = 32768;  // bytes per bulk prefetch (a multiple of 128)
constexpr int kL2PrefetchLine = 128;     // bytes per line prefetch (an L2 line)

// how: 0 bulk (cp.async.bulk.prefetch.L2, kL2PrefetchPiece bytes a thread), 1 the same with the
// L2 evict_last hint, 2 line (prefetch.global.L2, one 128-byte line a thread), 3 line with
// evict_last.
struct L2PrefetchParams {
  const char* base[kL2PrefetchRanges] = {};
  int64_t bytes[kL2PrefetchRanges] = {};  // multiples of 128, 16-byte aligned bases
  int ranges = 0;
  int how = 0;
};

__device__ __forceinline__ void prefetch_l2_last(const void* src, uint32_t bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile(
      "{\n .reg .b64 pol;\n createpolicy.fractional.L2::evict_last.b64 pol, 1.0;\n"
      " cp.async.bulk.prefetch.L2.global.L2::cache_hint [%0], %1, pol;\n}\n" ::"l"(src),
      "r"(bytes)
      : "memory");
#endif
}

__device__ __forceinline__ void prefetch_line_l2(const void* src, bool last) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  if (last)
    asm volatile("prefetch.global.L2::evict_last [%0];\n" ::"l"(src) : "memory");
  else
    asm volatile("prefetch.global.L2 [%0];\n" ::"l"(src) : "memory");
#endif
}

// Thread t takes units t, t + threads, ... of the ranges laid end to end (a unit: one bulk piece
// or one line; a range's last bulk piece may be shorter).
__global__ void l2_prefetch_kernel(const L2PrefetchParams p) {
  pdl_begin();
  const bool bulk = p.how < 2, last = (p.how & 1) != 0;
  const int64_t unit = bulk ? kL2PrefetchPiece : kL2PrefetchLine;
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  int64_t first = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;  // unit index within range r
  for (int r = 0; r < p.ranges; ++r) {
    const int64_t units = (p.bytes[r] + unit - 1) / unit;
    for (int64_t u = first; u < units; u += stride) {
      const char* a = p.base[r] + u * unit;
      if (!bulk) {
        prefetch_line_l2(a, last);
        continue;
      }
      const uint32_t n = uint32_t(min(unit, p.bytes[r] - u * unit));
      if (last)
        prefetch_l2_last(a, n);
      else
        prefetch_l2(a, n);
    }
    // the next range continues the thread order where this one stopped
    first = ((first - units) % stride + stride) % stride;
  }
}

}  // namespace atlas::cuda::kern
