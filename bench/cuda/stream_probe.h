// Weight-streaming probe (stream_probe.cu): cp.async reads of a device pool in the grouped GEMM's
// row-strided pattern or as contiguous runs, no arithmetic.
#pragma once

#include <cstddef>

namespace atlas_bench {

struct StreamProbeArgs {
  const void* pool = nullptr;  // device memory, `bytes` long (read in whole tiles)
  size_t bytes = 0;
  int seg_bytes = 128;         // bytes per weight row per step (divides 4096)
  bool contiguous = false;     // true: each step reads one contiguous 16 KB run instead
  int iters = 10;
};

// Microseconds per pass over the pool (CUDA events, after one warm-up pass).
double stream_probe_us(const StreamProbeArgs& a);

}  // namespace atlas_bench
