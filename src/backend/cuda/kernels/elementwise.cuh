// Elementwise kernels: RoPE rotation, SiLU gate, bf16 add. Each output element depends only on
// its own inputs, so they are batch invariant by construction.
// Planned fast path: 16-byte (8 x bf16) loads/stores and fusion into the neighbouring GEMM
// epilogues (SiLU-gate into the gate/up GEMM, RoPE into the q / kv_a GEMM outputs).
#pragma once

#include "common.cuh"

namespace atlas::cuda::kern {

// One thread per (token, head, pair k). Official rounding (spec section 5): the two products
// and their sum are each rounded to bf16; rotate_half's negation is exact.
__global__ void rope_kernel(uint16_t* x, int tokens, int heads, int64_t token_stride,
                            int64_t head_stride, int half, const int32_t* __restrict__ positions,
                            const uint16_t* __restrict__ cos_t, const uint16_t* __restrict__ sin_t,
                            int max_positions, int* bad_position) {
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
  const float c = bf2f(cos_t[int64_t(p) * half + k]);
  const float s = bf2f(sin_t[int64_t(p) * half + k]);
  uint16_t* r = x + int64_t(t) * token_stride + int64_t(h) * head_stride + 2 * k;
  const float a = bf2f(r[0]), b = bf2f(r[1]);
  const float even = round_bf(round_bf(a * c) - round_bf(b * s));
  const float odd = round_bf(round_bf(b * c) + round_bf(a * s));
  r[0] = f2bf(even);
  r[1] = f2bf(odd);
}

// silu(g) = g / (1 + exp(-g)) in fp32 (PyTorch's formula), rounded to bf16; then the product
// with up, rounded again.
__device__ __forceinline__ float silu_f32(float g) { return g / (1.0f + expf(-g)); }

__global__ void silu_gate_kernel(const uint16_t* __restrict__ gate, const uint16_t* __restrict__ up,
                                 uint16_t* __restrict__ out, int rows, int width,
                                 int64_t in_stride) {
  const int64_t idx = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= int64_t(rows) * width) return;
  const int64_t r = idx / width, c = idx % width;
  const float g = bf2f(gate[r * in_stride + c]);
  const float u = bf2f(up[r * in_stride + c]);
  out[idx] = f2bf(round_bf(silu_f32(g)) * u);
}

__global__ void add_kernel(const uint16_t* a, const uint16_t* b, uint16_t* out, int64_t n) {
  const int64_t idx = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx < n) out[idx] = f2bf(bf2f(a[idx]) + bf2f(b[idx]));
}

}  // namespace atlas::cuda::kern
