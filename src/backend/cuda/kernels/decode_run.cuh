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
#include "rmsnorm.cuh"

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

// Nothing but the launch-overlap wait and release (graph_root, ATLAS_RUN_ROOT): a step graph's
// first node ahead of its step-start launch.
__global__ void __launch_bounds__(32) graph_root_kernel() { pdl_begin(); }

// What a step's second and third launches do at one row, in one launch: the embedding lookup
// (copy_rows_kernel of row ids[0] of `embed` into x: x left as it was for a negative id, and for
// an id past vocab, which raises copy_rows' error bit 8) and the first layer's input norm
// (rmsnorm_wide_kernel<T, false> of x into h, via rmsnorm_wide_finish): the same values
// (ATLAS_RUN_FUSED, sessions 47 and 49; a batch-1 step's boundary was ~13 us longer than a layer
// boundary, s45-3's trace). It waits before it releases (pdl_begin) and reads ids only after its
// wait, so it keeps the contract run_inputs_kernel's step inputs rely on (kernels/pdl.cuh): the
// kernels after it, the MLA ones among them, read the lengths before their own wait. (Session
// 47's form also took run_inputs_kernel's work and wrote the inputs at its end, after its release:
// a race, found by s49-1's model test.) dim <= kWideDim. One block of kWideThreads.
template <class T>
__global__ void __launch_bounds__(kWideThreads)
    embed_norm_kernel(const int32_t* ids, const T* __restrict__ embed, int64_t vocab, const T* __restrict__ w, T* x,
                      T* h, int dim, float eps, int* error_flag) {
  __shared__ float scratch[16];
  __shared__ float sq[kWideDim];
  // The norm weights before the launch-overlap wait (a model weight: kernels/pdl.cuh).
  float wv[kWideRegs];
#pragma unroll
  for (int m = 0; m < kWideRegs; ++m) {
    const int i = threadIdx.x + m * kWideThreads;
    wv[m] = i < dim ? to_f32(w[i]) : 0.0f;
  }
  pdl_begin();
  const int64_t id = ids[0];
  const bool copy = id >= 0 && id < vocab;
  if (id >= vocab && threadIdx.x == 0) atomicOr(error_flag, 8);  // copy_rows_kernel's bit
  const T* src = copy ? embed + id * dim : x;
  float v[kWideRegs];
#pragma unroll
  for (int m = 0; m < kWideRegs; ++m) {
    const int i = threadIdx.x + m * kWideThreads;
    v[m] = 0.0f;
    if (i < dim) {
      const T e = src[i];
      v[m] = to_f32(e);
      if (copy) x[i] = e;
    }
  }
  // h may not alias x; every read of x is above, by the thread that wrote the same element.
  rmsnorm_wide_finish<T>(v, wv, h, dim, eps, sq, scratch);
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
