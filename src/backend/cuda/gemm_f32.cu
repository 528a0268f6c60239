// Launchers of the f32 GEMM (the f32 checking mode): dense, strided batch and grouped, one
// kernel (kernels/gemm_f32.cuh). Capture safe: nothing allocated, no synchronisation, no host
// read of device data.
#include <algorithm>
#include <string>

#include "backend/cuda/cuda_internal.h"
#include "backend/cuda/kernels/gemm_f32.cuh"
#include "backend/cuda/kernels/gemm_mma.cuh"  // only for the error bits checked below

namespace atlas::cuda {

using namespace detail;

static_assert(kern::kF32ErrOffsets == kern::kErrGroupedOffsets && kern::kF32ErrGatherRows == kern::kErrGatherRows &&
                  kern::kF32ErrGroupWeight == kern::kErrGroupWeight,
              "the f32 GEMM raises the bf16 grouped GEMM's error bits (runtime.cu decodes them)");

namespace {

int64_t tiles(int64_t n) { return (n + kern::kF32Tile - 1) / kern::kF32Tile; }

}  // namespace

void gemm_f32(const GemmF32Args& a) {
  const char* op = "gemm_f32";
  require_gemm_args(a, op);
  require(tiles(a.N) <= 65535, op, "N", "too many columns for one launch (N / 64 > 65535)");
  if (a.M == 0) return;
  kern::F32GemmParams p;
  p.x = a.x;
  p.w = a.w;
  p.out = a.out;
  p.xs = a.x_stride ? a.x_stride : a.K;
  p.ws = a.w_stride ? a.w_stride : a.K;
  p.os = a.out_stride ? a.out_stride : a.N;
  p.x_bs = a.x_batch_stride;
  p.w_bs = a.w_batch_stride;
  p.o_bs = a.out_batch_stride;
  p.M = a.M;
  p.N = a.N;
  p.K = a.K;
  p.error_flag = error_flag();
  const dim3 grid(unsigned(tiles(a.M)), unsigned(tiles(a.N)), unsigned(a.batch));
  launch(kern::gemm_f32_kernel, grid, kern::kF32Threads, 0, stream_of(a.stream), p);
  check_launch(op);
}

void grouped_gemm_f32(const GroupedGemmF32Args& a) {
  const char* op = "grouped_gemm_f32";
  require_grouped_args(a, op);
  require(tiles(a.N) <= 65535, op, "N", "too many columns for one launch (N / 64 > 65535)");
  if (a.max_rows == 0) return;
  kern::F32GemmParams p;
  p.x = a.x;
  p.out = a.out;
  p.w_groups = a.w;
  p.offsets = a.offsets;
  p.x_rows = a.x_rows;
  p.xs = a.x_stride ? a.x_stride : a.K;
  p.ws = a.w_stride ? a.w_stride : a.K;
  p.os = a.out_stride ? a.out_stride : a.N;
  p.x_rows_limit = a.x_rows_limit;
  p.N = a.N;
  p.K = a.K;
  p.groups = a.groups;
  p.max_rows = a.max_rows;
  p.error_flag = error_flag();
  // Row tiles: sum_g ceil(rows_g / 64) <= ceil(max_rows / 64) + (non-empty groups), and at most
  // min(groups, max_rows) groups are non-empty.
  const int64_t row_tiles = tiles(a.max_rows) + std::min<int64_t>(a.groups, a.max_rows);
  const dim3 grid(unsigned(row_tiles), unsigned(tiles(a.N)), 1);
  launch(kern::gemm_f32_kernel, grid, kern::kF32Threads, 0, stream_of(a.stream), p);
  check_launch(op);
}

}  // namespace atlas::cuda
