// f32 GEMM for the f32 checking mode (`--compute f32`): out[m][n] = sum_k x[m][k] * w[n][k],
// f32 operands, f32 output.
//
// Numerics contract, per output element (m, n):
//   acc = +0; for k = 0 .. K-1 ascending: acc = fmaf(x[m][k], w[n][k], acc); out = acc.
// One FMA chain in ascending k, no split-K, no rounding but fp32's: nothing about M, N, the tile,
// the grid, the batch or the group enters it, so the result is batch invariant by construction
// and bit-exact to the host reference (std::fma in the same order, reference.cpp).
//
// One kernel for the three forms (the f32 twins of the bf16 gemm / strided-batch / grouped):
//   dense / strided batch: blockIdx.x = 64-row tile, blockIdx.y = 64-column tile, blockIdx.z =
//     batch (x, w, out shifted by the batch strides);
//   grouped (MoE experts, `offsets` set): blockIdx.x counts 64-row tiles group after group
//     (ceil(rows_g / 64) per group g, rows [offsets[g], offsets[g+1])), the grid's bound is
//     host-side (ceil(max_rows / 64) + min(groups, max_rows)) and blocks past the last real tile
//     exit; each group multiplies by its own weight w_groups[g] (device array); A rows may be
//     gathered through x_rows. Offsets are read on the device only: no host round trip per layer.
// Tiles: 64 x 64 outputs per 256-thread block, 4 x 4 per thread, K in steps of 16 through
// shared memory. Correctness first; speed does not matter much in a checking mode.
#pragma once

#include "common.cuh"

namespace atlas::cuda::kern {

constexpr int kF32Tile = 64, kF32BK = 16, kF32Threads = 256;
// Device error bits: the same as the bf16 grouped GEMM's (kernels/gemm_mma.cuh, checked equal
// in gemm_f32.cu), so check_device_errors() reports them under the same names.
constexpr int kF32ErrOffsets = 16, kF32ErrGatherRows = 32, kF32ErrGroupWeight = 64;

struct F32GemmParams {
  const float* x = nullptr;
  const float* w = nullptr;                 // dense / batched weight
  float* out = nullptr;
  const float* const* w_groups = nullptr;   // grouped: per-group weights (device array)
  const int32_t* offsets = nullptr;         // grouped: [groups + 1] (device); null = dense
  const int32_t* x_rows = nullptr;          // grouped: optional gather (device)
  int64_t xs = 0, ws = 0, os = 0;           // row strides, elements
  int64_t x_bs = 0, w_bs = 0, o_bs = 0;     // batch strides, elements (blockIdx.z)
  int64_t x_rows_limit = 0;                 // > 0: bound checked on x_rows entries
  int M = 0, N = 0, K = 0;                  // dense: M rows per batch; grouped: M unused
  int groups = 0, max_rows = 0;
  int* error_flag = nullptr;
};

__global__ void __launch_bounds__(kF32Threads) gemm_f32_kernel(const F32GemmParams p) {
  pdl_begin_gemm();
  __shared__ float As[kF32BK][kF32Tile + 4];
  __shared__ float Bs[kF32BK][kF32Tile + 4];
  __shared__ int64_t a_off[kF32Tile];  // element offset in x of each tile row's A row; -1 = zero row
  __shared__ int spot[3];              // grouped: row_begin, row_end, group (-1: no tile here)
  const int tid = threadIdx.x;
  const float* x = p.x;
  const float* w = p.w;
  float* out = p.out;
  int row_begin = 0, row_end = 0;
  if (p.offsets == nullptr) {
    const int64_t b = blockIdx.z;
    x += b * p.x_bs;
    w += b * p.w_bs;
    out += b * p.o_bs;
    row_begin = int(blockIdx.x) * kF32Tile;
    row_end = min(row_begin + kF32Tile, p.M);
  } else {
    // One thread walks (and checks) the whole offsets table: groups are few (64 experts), and a
    // single sequential scan is the simplest way to be sure every block sees the same answer.
    if (tid == 0) {
      const int tile = int(blockIdx.x);
      int base = 0, g_found = -1, rb = 0, re = 0;
      bool bad = false;
      for (int g = 0; g < p.groups; ++g) {
        const int lo = p.offsets[g], hi = p.offsets[g + 1];
        if ((g == 0 && lo != 0) || lo < 0 || hi < lo || hi > p.max_rows) {
          bad = true;
          break;
        }
        const int tiles = (hi - lo + kF32Tile - 1) / kF32Tile;
        if (g_found < 0 && tile < base + tiles) {
          g_found = g;
          rb = lo + (tile - base) * kF32Tile;
          re = min(rb + kF32Tile, hi);
        }
        base += tiles;
      }
      if (bad) {
        if (blockIdx.x == 0 && blockIdx.y == 0) atomicOr(p.error_flag, kF32ErrOffsets);
        g_found = -1;
      } else if (g_found >= 0 && p.w_groups[g_found] == nullptr) {
        atomicOr(p.error_flag, kF32ErrGroupWeight);
        g_found = -1;
      }
      spot[0] = rb;
      spot[1] = re;
      spot[2] = g_found;
    }
    __syncthreads();
    if (spot[2] < 0) return;  // the whole block: past the last real tile, or a flagged error
    row_begin = spot[0];
    row_end = spot[1];
    w = p.w_groups[spot[2]];
  }
  for (int i = tid; i < kF32Tile; i += kF32Threads) {
    const int row = row_begin + i;
    int64_t off = -1;
    if (row < row_end) {
      int64_t src = row;
      if (p.x_rows != nullptr) {
        src = p.x_rows[row];
        if (src < 0 || (p.x_rows_limit > 0 && src >= p.x_rows_limit)) {
          atomicOr(p.error_flag, kF32ErrGatherRows);
          src = -1;  // a bad row reads as zeros (the bf16 grouped GEMM does the same)
        }
      }
      off = src < 0 ? -1 : src * p.xs;
    }
    a_off[i] = off;
  }
  __syncthreads();

  const int n0 = int(blockIdx.y) * kF32Tile;
  const int tm = (tid / 16) * 4, tn = (tid % 16) * 4;
  float acc[4][4];
#pragma unroll
  for (int i = 0; i < 4; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j) acc[i][j] = 0.0f;

  for (int k0 = 0; k0 < p.K; k0 += kF32BK) {
    const int kn = min(kF32BK, p.K - k0);
    // 64 rows x 16 k of each operand, 4 values per thread; outside the matrix -> 0 (never part
    // of a stored chain: the k loop stops at kn, rows/columns past the edge are not stored).
    for (int i = tid; i < kF32Tile * kF32BK; i += kF32Threads) {
      const int r = i / kF32BK, kk = i % kF32BK, gk = k0 + kk;
      const int64_t ao = a_off[r];
      As[kk][r] = (ao >= 0 && gk < p.K) ? x[ao + gk] : 0.0f;
      const int gn = n0 + r;
      Bs[kk][r] = (gn < p.N && gk < p.K) ? w[int64_t(gn) * p.ws + gk] : 0.0f;
    }
    __syncthreads();
    for (int kk = 0; kk < kn; ++kk) {
      float a[4], b[4];
#pragma unroll
      for (int i = 0; i < 4; ++i) a[i] = As[kk][tm + i];
#pragma unroll
      for (int j = 0; j < 4; ++j) b[j] = Bs[kk][tn + j];
#pragma unroll
      for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) acc[i][j] = __fmaf_rn(a[i], b[j], acc[i][j]);
    }
    __syncthreads();
  }
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int row = row_begin + tm + i;
    if (row >= row_end) continue;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int gn = n0 + tn + j;
      if (gn < p.N) out[int64_t(row) * p.os + gn] = acc[i][j];
    }
  }
}

}  // namespace atlas::cuda::kern
