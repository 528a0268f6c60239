// The first and last nodes of a decode run's step graph (Model::start_decode; CudaModel replays
// one captured step graph per pushed step, with no host round trip between steps). A graph's
// kernels have fixed arguments, so the step index lives on the device: state[0] is the step about
// to run (counted from the run's last restart); the inputs kernel reads it and advances it. The
// host's ring of `ring` slots per step lies in pinned host memory, which kernels read and write
// directly (unified addressing): the host fills step j's slot j % ring before pushing it and reads
// its outputs after the step's event, never reusing a slot before its step was popped.
#pragma once

#include <cstdint>

#include "pdl.cuh"

namespace atlas::cuda::kern {

constexpr int kRunThreads = 256;

// One block. Step j = state[0], slot = j % ring:
//   inputs[0, 5B)     = staged[slot] (ids | pos | dst | qlen | qrow, B each, made on the host)
//   inputs[b], j > 0  = prev[b], the token the step before produced for row b (kept there by
//                       run_outputs_kernel; a negative one, a drawn token's error code, is fed as
//                       id 0: the host reports the error when that step is popped)
//   params[0, B * pi) = params_staged[slot] (each row's sampling parameters, pi ints), if any.
// Nothing in it depends on other rows.
__global__ void __launch_bounds__(kRunThreads) run_inputs_kernel(int32_t* state, const int32_t* staged,
                                                                 const int32_t* params_staged, const int32_t* prev,
                                                                 int32_t* inputs, int32_t* params, int B, int pi,
                                                                 int ring) {
  pdl_begin();
  const int j = state[0], slot = j % ring;
  const int n = 5 * B;
  for (int i = threadIdx.x; i < n; i += blockDim.x) {
    int32_t v = staged[int64_t(slot) * n + i];
    if (i < B && j > 0) {
      const int32_t t = prev[i];
      v = t < 0 ? 0 : t;
    }
    inputs[i] = v;
  }
  if (params_staged != nullptr)
    for (int i = threadIdx.x; i < B * pi; i += blockDim.x) params[i] = params_staged[int64_t(slot) * B * pi + i];
  __syncthreads();  // every thread has read state[0]
  if (threadIdx.x == 0) state[0] = j + 1;
}

// One block, after the step's last kernel: prev[b] = out[slot][b] = tokens[b] and err[slot] = the
// device error flag, for the step j = state[0] - 1 that the inputs kernel started.
__global__ void __launch_bounds__(kRunThreads) run_outputs_kernel(const int32_t* state, const int32_t* tokens,
                                                                  const int* error_flag, int32_t* prev, int32_t* out,
                                                                  int32_t* err, int B, int ring) {
  pdl_begin();  // the tokens are the kernel before's output
  const int slot = (state[0] - 1) % ring;
  for (int i = threadIdx.x; i < B; i += blockDim.x) {
    const int32_t t = tokens[i];
    prev[i] = t;
    out[int64_t(slot) * B + i] = t;
  }
  if (threadIdx.x == 0) err[slot] = *reinterpret_cast<const volatile int*>(error_flag);
}

}  // namespace atlas::cuda::kern
