// Attention probabilities for the blocks.{L}.attn.hook_pattern hook (only when observed): the
// official eager-attention softmax over the absorbed query and the cached latent, which the
// attention kernels never materialise (they run an online softmax over tiles).
//
// Contract (the CPU twin is ref::mla_pattern in reference.cpp), per query q, head h, over the
// slots j < len of q's cache row (len = 0: a row of zeros):
//   acc_j = sum_k q~[h][k] * c_j[k], k = 0 .. width-1 ascending, fp32 products and adds
//   s_j   = bf16(bf16(acc_j) * scale)   (T = bf16: the official bf16 scores; f32: acc_j * scale)
//   m     = max_j s_j
//   e_j   = expf(s_j - m); sum: thread i adds e_i, e_{i+256}, ... in order, then block_sum's tree
//   p_j   = bf16(e_j / sum)               (f32: e_j / sum); slots j >= len hold 0
// One block of kReduceThreads threads per (query, head); slot j's dot product is one thread's
// sequential loop. Speed is not a goal: this runs only for an observer of the pattern.
#pragma once

#include "common.cuh"

namespace atlas::cuda::kern {

template <class T>
__global__ void mla_pattern_kernel(const T* __restrict__ q, const T* __restrict__ cache, int64_t cache_row_stride,
                                   const int32_t* __restrict__ lengths, const int32_t* __restrict__ cache_rows,
                                   float* __restrict__ out, int heads, int width, int slots, float scale,
                                   int* error_flag) {
  pdl_begin();
  __shared__ float scratch[16];
  const int qi = blockIdx.x / heads, h = blockIdx.x % heads;
  float* o = out + int64_t(blockIdx.x) * slots;
  const int len = lengths[qi];
  if (len < 0 || len > slots) {  // reported to the host; the row is left unwritten
    if (threadIdx.x == 0) atomicOr(error_flag, 256);
    return;
  }
  const T* qh = q + (int64_t(qi) * heads + h) * width;
  const T* row = cache + int64_t(cache_rows ? cache_rows[qi] : qi) * cache_row_stride;
  float mx = -INFINITY;
  for (int j = threadIdx.x; j < len; j += blockDim.x) {
    const T* c = row + int64_t(j) * width;
    float acc = 0.0f;
    for (int k = 0; k < width; ++k) acc = acc + to_f32(qh[k]) * to_f32(c[k]);
    const float s = round_as<T>(round_as<T>(acc) * scale);
    o[j] = s;
    mx = fmaxf(mx, s);
  }
  for (int j = len + threadIdx.x; j < slots; j += blockDim.x) o[j] = 0.0f;
  mx = block_max(mx, scratch);
  float sum = 0.0f;
  for (int j = threadIdx.x; j < len; j += blockDim.x) {
    const float e = expf(o[j] - mx);
    o[j] = e;
    sum += e;
  }
  sum = block_sum(sum, scratch);
  for (int j = threadIdx.x; j < len; j += blockDim.x) o[j] = round_as<T>(o[j] / sum);
}

}  // namespace atlas::cuda::kern
