// Elementwise kernels: RoPE rotation, SiLU gate, add. Each output element depends only on its
// own inputs, so they are batch invariant by construction. Templated on the storage type T
// (uint16_t = bf16, float = the f32 checking mode: every round_as<float> is the identity).
// Planned fast path: 16-byte (8 x bf16) loads/stores and fusion into the neighbouring GEMM
// epilogues (SiLU-gate into the gate/up GEMM, RoPE into the q / kv_a GEMM outputs).
#pragma once

#include "common.cuh"

namespace atlas::cuda::kern {

// One thread per (token, head, pair k); the heads of up to two jobs (the queries' and the
// key's rope parts) in one launch. Official rounding (spec section 5): the two products and
// their sum are each rounded to bf16; rotate_half's negation is exact.
template <class T>
struct RopeJob {
  const T* src;
  T* dst;  // may equal src (in place)
  int heads;
  int64_t src_token_stride, src_head_stride, dst_token_stride, dst_head_stride;
};

// Pair k of a head at position p: (r[0], r[1]) rotated into (o[0], o[1]) (o may equal r). Shared
// with the fused latent-to-cache kernel (kernels/latent_cache.cuh).
template <class T>
__device__ __forceinline__ void rope_pair(const T* r, T* o, int p, int k, int half, const T* __restrict__ cos_t,
                                          const T* __restrict__ sin_t) {
  const float c = to_f32(cos_t[int64_t(p) * half + k]);
  const float s = to_f32(sin_t[int64_t(p) * half + k]);
  const float a = to_f32(r[0]), b = to_f32(r[1]);
  const float even = round_as<T>(round_as<T>(a * c) - round_as<T>(b * s));
  const float odd = round_as<T>(round_as<T>(b * c) + round_as<T>(a * s));
  o[0] = from_f32<T>(even);
  o[1] = from_f32<T>(odd);
}

template <class T>
__global__ void rope_kernel(RopeJob<T> j0, RopeJob<T> j1, int tokens, int half,
                            const int32_t* __restrict__ positions, const T* __restrict__ cos_t,
                            const T* __restrict__ sin_t, int max_positions, int* bad_position) {
  pdl_begin();
  const int heads = j0.heads + j1.heads;
  const int64_t idx = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t total = int64_t(tokens) * heads * half;
  if (idx >= total) return;
  const int k = int(idx % half);
  int h = int((idx / half) % heads);
  const int t = int(idx / (int64_t(half) * heads));
  const RopeJob<T>& j = h < j0.heads ? j0 : j1;
  if (h >= j0.heads) h -= j0.heads;
  const int p = positions[t];
  if (p < 0 || p >= max_positions) {  // reported to the host; the pair is left unwritten
    atomicOr(bad_position, 1);
    return;
  }
  rope_pair<T>(j.src + int64_t(t) * j.src_token_stride + int64_t(h) * j.src_head_stride + 2 * k,
               j.dst + int64_t(t) * j.dst_token_stride + int64_t(h) * j.dst_head_stride + 2 * k, p, k, half, cos_t,
               sin_t);
}

// out = silu(gate) * up (silu_f32 in common.cuh: the rounding points are shared with the GEMM's
// fused gate|up epilogue, kernels/gemm_mma.cuh).
template <class T>
__global__ void silu_gate_kernel(const T* __restrict__ gate, const T* __restrict__ up, T* __restrict__ out,
                                 int rows, int width, int64_t in_stride) {
  pdl_begin();
  const int64_t idx = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= int64_t(rows) * width) return;
  const int64_t r = idx / width, c = idx % width;
  const float g = to_f32(gate[r * in_stride + c]);
  const float u = to_f32(up[r * in_stride + c]);
  out[idx] = from_f32<T>(round_as<T>(silu_f32(g)) * u);
}

template <class T>
__global__ void add_kernel(const T* a, const T* b, T* out, int64_t n) {
  pdl_begin();
  const int64_t idx = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx < n) out[idx] = from_f32<T>(to_f32(a[idx]) + to_f32(b[idx]));
}

}  // namespace atlas::cuda::kern
