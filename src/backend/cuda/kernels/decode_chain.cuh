// The inputs of one step of a decode chain (Model::decode_chain; CudaModel replays one captured
// step graph S times without a host round trip in between). The graph's kernels have fixed
// arguments, so the step index lives on the device: state[0] is the step about to run, and this
// kernel, the graph's first node, reads it and advances it.
#pragma once

#include <cstdint>

namespace atlas::cuda::kern {

constexpr int kChainThreads = 256;

// One block. Step j = state[0]:
//   inputs[0, 5B)      = staged[j] (ids | pos | dst | qlen | qrow, B each, made on the host)
//   inputs[b], j > 0   = prev[b], the token step j - 1 produced for row b (a negative one, a drawn
//                        token's error code, is fed as id 0; the host reports the error from hist)
//   hist[j - 1][b]     = prev[b]
//   params[0, B * pi)  = params_staged[j] (each row's sampling parameters, pi ints each), if any.
// Nothing in it depends on other rows.
__global__ void __launch_bounds__(kChainThreads) chain_inputs_kernel(int32_t* state, const int32_t* staged,
                                                                     const int32_t* params_staged,
                                                                     const int32_t* prev, int32_t* inputs,
                                                                     int32_t* params, int32_t* hist, int B, int pi) {
  const int j = state[0];
  const int n = 5 * B;
  for (int i = threadIdx.x; i < n; i += blockDim.x) {
    int32_t v = staged[int64_t(j) * n + i];
    if (i < B && j > 0) {
      const int32_t t = prev[i];
      hist[int64_t(j - 1) * B + i] = t;
      v = t < 0 ? 0 : t;
    }
    inputs[i] = v;
  }
  if (params_staged != nullptr)
    for (int i = threadIdx.x; i < B * pi; i += blockDim.x) params[i] = params_staged[int64_t(j) * B * pi + i];
  __syncthreads();  // every thread has read state[0]
  if (threadIdx.x == 0) state[0] = j + 1;
}

}  // namespace atlas::cuda::kern
