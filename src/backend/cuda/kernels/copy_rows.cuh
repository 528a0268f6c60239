// Row gather/scatter of bf16 (or f32) rows through optional index arrays: the embedding lookup (src rows
// = token ids), the KV-cache append (dst rows = each token's packed cache slot, -1 for padding)
// and the last-token selection before lm_head. A pure copy: no arithmetic, so trivially batch
// invariant. One block per row, threads over the row's elements.
#pragma once

#include "common.cuh"

namespace atlas::cuda::kern {

template <class T>
__global__ void copy_rows_kernel(const T* __restrict__ src, T* __restrict__ dst,
                                 const int32_t* __restrict__ src_rows, const int32_t* __restrict__ dst_rows,
                                 int width, int64_t src_stride, int64_t dst_stride, int64_t src_limit,
                                 int64_t dst_limit, int* error_flag) {
  pdl_begin();
  const int64_t i = blockIdx.x;
  const int64_t s = src_rows ? src_rows[i] : i, d = dst_rows ? dst_rows[i] : i;
  if (s < 0 || d < 0) return;  // skipped row
  if (s >= src_limit || d >= dst_limit) {
    if (threadIdx.x == 0) atomicOr(error_flag, 8);
    return;
  }
  const T* sr = src + s * src_stride;
  T* dr = dst + d * dst_stride;
  // 16-byte chunks where both rows allow them, a thread's four loads issued before their stores:
  // element by element, each thread waited for one memory round trip per element it copied (a
  // batch-1 decode step's embedding row, 4 KB: 7.3 us, H200 s25-4).
  const size_t bytes = size_t(width) * sizeof(T);
  if (((reinterpret_cast<uintptr_t>(sr) | reinterpret_cast<uintptr_t>(dr) | bytes) & 15u) == 0) {
    const uint4* s4 = reinterpret_cast<const uint4*>(sr);
    uint4* d4 = reinterpret_cast<uint4*>(dr);
    const int chunks = int(bytes / 16), step = int(blockDim.x);
    for (int c0 = threadIdx.x; c0 < chunks; c0 += 4 * step) {
      uint4 v[4];
#pragma unroll
      for (int u = 0; u < 4; ++u)
        if (c0 + u * step < chunks) v[u] = __ldg(s4 + c0 + u * step);
#pragma unroll
      for (int u = 0; u < 4; ++u)
        if (c0 + u * step < chunks) d4[c0 + u * step] = v[u];
    }
    return;
  }
  for (int c = threadIdx.x; c < width; c += blockDim.x) dr[c] = sr[c];
}

// A hook edit of listed rows (cuda_ops.h RowEditArgsT): one block per listed row. Double
// arithmetic written with the _rn intrinsics, so nothing contracts whatever the flags.
template <class T>
__global__ void edit_rows_kernel(T* __restrict__ x, int64_t limit, int width, const int64_t* __restrict__ rows,
                                 int op, double factor, const float* __restrict__ src, int src_per_row,
                                 int* error_flag) {
  pdl_begin();
  const int64_t i = blockIdx.x, r = rows[i];
  if (r < 0 || r >= limit) {
    if (threadIdx.x == 0) atomicOr(error_flag, 8);
    return;
  }
  T* xr = x + r * int64_t(width);
  const float* sr = src != nullptr ? src + (src_per_row ? i * int64_t(width) : 0) : nullptr;
  for (int j = threadIdx.x; j < width; j += blockDim.x) {
    float v = 0.0f;
    if (op == 1) v = __double2float_rn(__dmul_rn(double(to_f32(xr[j])), factor));
    else if (op == 2) v = __double2float_rn(__dadd_rn(double(to_f32(xr[j])), __dmul_rn(factor, double(sr[j]))));
    xr[j] = from_f32<T>(v);
  }
}

}  // namespace atlas::cuda::kern
