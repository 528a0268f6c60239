// Phase clocks (ATLAS_PHASE_CLOCKS, a diagnostic): where one launch's time goes inside a small
// kernel in its real context (a graph-captured decode step with launch overlap, other kernels'
// blocks beside it), which CUPTI's kernel spans do not split and Nsight Compute's replays of a
// single launch do not reproduce. A clocked instantiation of the kernel marks SM clock readings
// (clock64) at fixed points in thread 0 of each block and, at its end, adds the differences of
// consecutive marks to a device buffer; the host prints the means when the process exits
// (runtime.cu, phase_clock_sums). The default instantiation carries none of it (no marks, no
// buffer).
#pragma once

#include <cstdint>

namespace atlas::cuda::kern {

constexpr int kPhaseClockMax = 15;  // marks per kernel (sums: [0] blocks, [i] mark i - mark i-1)

template <int N>
struct PhaseClock {
  static_assert(N >= 2 && N <= kPhaseClockMax);
  long long t[N];
  __device__ __forceinline__ void mark(int i) { t[i] = clock64(); }
  // Thread 0's marks of one block into sums (kPhaseClockMax + 1 counters).
  __device__ __forceinline__ void flush(unsigned long long* sums) const {
    atomicAdd(sums, 1ull);
#pragma unroll
    for (int i = 1; i < N; ++i) atomicAdd(sums + i, static_cast<unsigned long long>(t[i] - t[i - 1]));
  }
};

}  // namespace atlas::cuda::kern
