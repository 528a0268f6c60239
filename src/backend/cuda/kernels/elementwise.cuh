// Elementwise kernels: RoPE rotation, SiLU gate, add. Each output element depends only on its
// own inputs, so they are batch invariant by construction. Templated on the storage type T
// (uint16_t = bf16, float = the f32 checking mode: every round_as<float> is the identity).
// Planned fast path: 16-byte (8 x bf16) loads/stores and fusion into the neighbouring GEMM
// epilogues (SiLU-gate into the gate/up GEMM, RoPE into the q / kv_a GEMM outputs).
#pragma once

#include "common.cuh"

namespace atlas::cuda::kern {

// One thread per (token, head, pair k). Official rounding (spec section 5): the two products
// and their sum are each rounded to bf16; rotate_half's negation is exact.
template <class T>
__global__ void rope_kernel(T* x, int tokens, int heads, int64_t token_stride, int64_t head_stride,
                            int half, const int32_t* __restrict__ positions, const T* __restrict__ cos_t,
                            const T* __restrict__ sin_t, int max_positions, int* bad_position) {
  const int64_t idx = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t total = int64_t(tokens) * heads * half;
  if (idx >= total) return;
  const int k = int(idx % half);
  const int h = int((idx / half) % heads);
  const int t = int(idx / (int64_t(half) * heads));
  const int p = positions[t];
  if (p < 0 || p >= max_positions) {  // reported to the host; the row is left untouched
    atomicOr(bad_position, 1);
    return;
  }
  const float c = to_f32(cos_t[int64_t(p) * half + k]);
  const float s = to_f32(sin_t[int64_t(p) * half + k]);
  T* r = x + int64_t(t) * token_stride + int64_t(h) * head_stride + 2 * k;
  const float a = to_f32(r[0]), b = to_f32(r[1]);
  const float even = round_as<T>(round_as<T>(a * c) - round_as<T>(b * s));
  const float odd = round_as<T>(round_as<T>(b * c) + round_as<T>(a * s));
  r[0] = from_f32<T>(even);
  r[1] = from_f32<T>(odd);
}

// silu(g) = g / (1 + exp(-g)) in fp32 (PyTorch's formula), rounded to bf16; then the product
// with up, rounded again.
__device__ __forceinline__ float silu_f32(float g) { return g / (1.0f + expf(-g)); }

template <class T>
__global__ void silu_gate_kernel(const T* __restrict__ gate, const T* __restrict__ up, T* __restrict__ out,
                                 int rows, int width, int64_t in_stride) {
  const int64_t idx = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= int64_t(rows) * width) return;
  const int64_t r = idx / width, c = idx % width;
  const float g = to_f32(gate[r * in_stride + c]);
  const float u = to_f32(up[r * in_stride + c]);
  out[idx] = from_f32<T>(round_as<T>(silu_f32(g)) * u);
}

template <class T>
__global__ void add_kernel(const T* a, const T* b, T* out, int64_t n) {
  const int64_t idx = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx < n) out[idx] = from_f32<T>(to_f32(a[idx]) + to_f32(b[idx]));
}

}  // namespace atlas::cuda::kern
