// MLA decode attention in the absorbed form over the 576-wide latent cache (spec section 3).
// Runtime shape: latent <= 512 and width = latent + rope <= 576 (the tiny test models use
// smaller ones); query b reads cache row cache_rows[b] (or b); a length of 0 gives zeros.
//
// Split phase, grid (max_splits, rows), 256 threads, one block per (row, split of S <= 256
// cached tokens), all heads (<= 16) at once since they share the cache (MQA):
//   scores:  thread j owns token j of the split: s[h][j] = scale * fmaf-chain over d = 0..575
//            of q[h][d] * cache[j][d] (ascending d).
//   softmax: warp w owns heads 2w, 2w+1; lane i takes j = i, i+32, ...; m = max (warp
//            butterfly), p = expf(s - m), l = lane sums then warp butterfly.
//   values:  thread i owns latent dims i and i+256 for every head, an fmaf chain over j.
//   -> partial (acc[h][512], m[h], l[h]) per split, unnormalised.
// Merge phase, grid rows: the splits of the row, in ascending split order:
//   M = max m_s; L = sum_s l_s*exp(m_s - M); out = bf16(sum_s acc_s*exp(m_s - M) / L).
// S is fixed by the caller, never derived from the batch, so a row's bits depend only on its
// own query, cache and length. P stays fp32 (the FA2 path of the official code keeps softmax
// in fp32 too); the only bf16 rounding is the output.
// Templated on the storage type T of q, cache and output: uint16_t (bf16) or float (the f32
// checking mode, whose only difference is that nothing is rounded to bf16: fp32 loads, fp32
// output). The f32 query (16 x 576 x 4 = 36 KB) does not fit the 48 KB static shared-memory
// limit beside the scores, so it lives in dynamic shared memory (the launcher sizes it and
// raises the limit); the bf16 query stays in its static array.
// Planned fast path: split-K over the cache across SMs with 64-token tiles loaded by the bulk
// copy engine, q.K^T and P.V on tensor cores (wgmma, the 16 heads as the M dimension),
// FlashMLA-style; the split size stays a constant, so the invariance argument is unchanged.
#pragma once

#include "common.cuh"

namespace atlas::cuda::kern {

constexpr int kMlaLatentDim = 512;
constexpr int kMlaWidthDim = 576;
constexpr int kMlaMaxHeads = 16;
constexpr int kMlaThreads = 256;
constexpr int kMlaPartial = kMlaLatentDim + 2;  // acc[512], m, l

// Dynamic shared-memory bytes of mla_split_kernel<T>: 0 for bf16, the f32 query otherwise.
template <class T>
constexpr int mla_split_dyn_smem() {
  return sizeof(T) == 2 ? 0 : int(kMlaMaxHeads * kMlaWidthDim * sizeof(T));
}

template <class T>
__global__ void __launch_bounds__(kMlaThreads)
mla_split_kernel(const T* __restrict__ q, const T* __restrict__ cache,
                 int64_t cache_row_stride, const int32_t* __restrict__ lengths,
                 const int32_t* __restrict__ cache_rows, int max_length, int heads, int latent,
                 int width, float scale, int S, int max_splits, float* __restrict__ ws,
                 int* error_flag) {
  pdl_begin();
  extern __shared__ __align__(16) unsigned char mla_split_dyn[];
  T* qs;
  if constexpr (sizeof(T) == 2) {
    __shared__ uint16_t qs_static[kMlaMaxHeads * kMlaWidthDim];
    qs = qs_static;
  } else {
    qs = reinterpret_cast<T*>(mla_split_dyn);
  }
  __shared__ float ps[kMlaMaxHeads][kMlaThreads];
  __shared__ float ms[kMlaMaxHeads], ls[kMlaMaxHeads];
  const int row = blockIdx.y, split = blockIdx.x, tid = threadIdx.x;
  const int len = lengths[row];
  if (len < 0 || len > max_length) {
    if (split == 0 && tid == 0) atomicOr(error_flag, 4);
    return;
  }
  const int j0 = split * S;
  if (j0 >= len) return;  // len == 0: the merge writes zeros
  const int n = min(S, len - j0);
  const T* qr = q + int64_t(row) * heads * width;
  for (int i = tid; i < heads * width; i += kMlaThreads) qs[i] = qr[i];
  __syncthreads();
  const int64_t crow = cache_rows ? cache_rows[row] : row;
  const T* cr = cache + crow * cache_row_stride + int64_t(j0) * width;

  // Scores.
  if (tid < n) {
    float acc[kMlaMaxHeads];
#pragma unroll
    for (int h = 0; h < kMlaMaxHeads; ++h) acc[h] = 0.0f;
    const T* c = cr + int64_t(tid) * width;
    for (int d = 0; d < width; ++d) {
      const float cv = to_f32(c[d]);
#pragma unroll
      for (int h = 0; h < kMlaMaxHeads; ++h)
        if (h < heads) acc[h] = __fmaf_rn(to_f32(qs[h * width + d]), cv, acc[h]);
    }
#pragma unroll
    for (int h = 0; h < kMlaMaxHeads; ++h)
      if (h < heads) ps[h][tid] = acc[h] * scale;
  }
  __syncthreads();

  // Softmax pieces per head (unnormalised).
  const int warp = tid >> 5, lane = tid & 31;
  for (int h = 2 * warp; h < 2 * warp + 2 && h < heads; ++h) {
    float m = -INFINITY;
    for (int j = lane; j < n; j += 32) m = fmaxf(m, ps[h][j]);
    m = warp_max(m);
    float l = 0.0f;
    for (int j = lane; j < n; j += 32) {
      const float p = expf(ps[h][j] - m);
      ps[h][j] = p;
      l += p;
    }
    l = warp_sum(l);
    if (lane == 0) {
      ms[h] = m;
      ls[h] = l;
    }
  }
  __syncthreads();

  // Values: the latent part of the cache (first 512 of 576).
  float acc0[kMlaMaxHeads], acc1[kMlaMaxHeads];
#pragma unroll
  for (int h = 0; h < kMlaMaxHeads; ++h) acc0[h] = acc1[h] = 0.0f;
  const bool has0 = tid < latent, has1 = tid + 256 < latent;
  for (int j = 0; j < n; ++j) {
    const float c0 = has0 ? to_f32(cr[int64_t(j) * width + tid]) : 0.0f;
    const float c1 = has1 ? to_f32(cr[int64_t(j) * width + tid + 256]) : 0.0f;
#pragma unroll
    for (int h = 0; h < kMlaMaxHeads; ++h) {
      if (h < heads) {
        acc0[h] = __fmaf_rn(ps[h][j], c0, acc0[h]);
        acc1[h] = __fmaf_rn(ps[h][j], c1, acc1[h]);
      }
    }
  }
  float* out = ws + ((int64_t(row) * max_splits + split) * heads) * kMlaPartial;
#pragma unroll
  for (int h = 0; h < kMlaMaxHeads; ++h) {
    if (h < heads) {
      out[h * kMlaPartial + tid] = acc0[h];
      out[h * kMlaPartial + tid + 256] = acc1[h];
      if (tid == 0) {
        out[h * kMlaPartial + kMlaLatentDim] = ms[h];
        out[h * kMlaPartial + kMlaLatentDim + 1] = ls[h];
      }
    }
  }
}

template <class T>
__global__ void __launch_bounds__(kMlaThreads)
mla_merge_kernel(const float* __restrict__ ws, const int32_t* __restrict__ lengths, int max_length,
                 int heads, int latent, int S, int max_splits, T* __restrict__ out) {
  pdl_begin();
  const int row = blockIdx.x, tid = threadIdx.x;
  const int len = lengths[row];
  if (len < 0 || len > max_length) return;  // reported by the split kernel
  const bool has0 = tid < latent, has1 = tid + 256 < latent;
  if (len == 0) {  // a query that sees no key (padding): output 0, as the CPU backend
    for (int h = 0; h < heads; ++h) {
      T* o = out + (int64_t(row) * heads + h) * latent;
      if (has0) o[tid] = T(0);
      if (has1) o[tid + 256] = T(0);
    }
    return;
  }
  const int n_splits = (len + S - 1) / S;
  const float* base = ws + int64_t(row) * max_splits * heads * kMlaPartial;
  for (int h = 0; h < heads; ++h) {
    float M = -INFINITY;
    for (int s = 0; s < n_splits; ++s) M = fmaxf(M, base[(int64_t(s) * heads + h) * kMlaPartial + kMlaLatentDim]);
    float L = 0.0f, o0 = 0.0f, o1 = 0.0f;
    for (int s = 0; s < n_splits; ++s) {
      const float* p = base + (int64_t(s) * heads + h) * kMlaPartial;
      const float f = expf(p[kMlaLatentDim] - M);
      L = __fmaf_rn(p[kMlaLatentDim + 1], f, L);
      o0 = __fmaf_rn(p[tid], f, o0);
      o1 = __fmaf_rn(p[tid + 256], f, o1);
    }
    T* o = out + (int64_t(row) * heads + h) * latent;
    if (has0) o[tid] = from_f32<T>(o0 / L);
    if (has1) o[tid + 256] = from_f32<T>(o1 / L);
  }
}

}  // namespace atlas::cuda::kern
