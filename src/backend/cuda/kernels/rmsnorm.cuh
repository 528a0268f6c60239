// RMSNorm exactly as the official code rounds (spec section 5):
//   v = mean(fp32(x)^2); y = fp32(x) * (1 / sqrt(v + eps)); out = bf16(w * bf16(y)).
// T = float (the f32 checking mode): the same with no bf16 rounding, out = w * y.
// One block of kReduceThreads threads per row. Thread i sums x[i]^2, x[i+256]^2, ... in order,
// then block_sum() fixes the rest of the order; nothing depends on the number of rows.
// 1/sqrtf(.) (both IEEE-rounded without fast math) rather than rsqrtf, whose approximation the
// host could not reproduce.
// Planned fast path: 16-byte loads, the row kept in registers between the two passes, several
// rows per block for small dims (the 512-wide kv_a_layernorm), fused with the residual add.
#pragma once

#include "common.cuh"

namespace atlas::cuda::kern {

template <class T>
__global__ void rmsnorm_kernel(const T* __restrict__ x, const T* __restrict__ w, T* out, int dim,
                               int64_t x_stride, int64_t out_stride, float eps) {
  __shared__ float scratch[16];
  const T* xr = x + int64_t(blockIdx.x) * x_stride;
  T* orow = out + int64_t(blockIdx.x) * out_stride;
  float ss = 0.0f;
  for (int i = threadIdx.x; i < dim; i += blockDim.x) {
    float v = to_f32(xr[i]);
    ss += v * v;
  }
  ss = block_sum(ss, scratch);
  const float r = 1.0f / sqrtf(ss / float(dim) + eps);
  // All reads of this row happened before block_sum's barriers, so out may alias x.
  for (int i = threadIdx.x; i < dim; i += blockDim.x) {
    float y = round_as<T>(to_f32(xr[i]) * r);
    orow[i] = from_f32<T>(to_f32(w[i]) * y);
  }
}

}  // namespace atlas::cuda::kern
