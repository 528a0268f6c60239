// The MoE combine's per-element arithmetic for bf16 rows, shared by the combine kernels
// (moe.cuh) and the q|kv_a GEMM that runs the combine inside (gemm_combine.cuh): one definition,
// so the same bits. Device functions only (no kernels: gemm.cu includes it beside ops.cu).
#pragma once

#include <cstdint>

#include "common.cuh"

namespace atlas::cuda::kern {

// The largest k the staged and wide combine kernels take (their gathered rows in one round).
constexpr int kCombineStageK = 8;

// Two adjacent bf16 elements as one 32-bit word (the low half first), and back.
__device__ __forceinline__ float2 bf16_pair(uint32_t u) {
  return make_float2(bf2f(uint16_t(u & 0xffffu)), bf2f(uint16_t(u >> 16)));
}
__device__ __forceinline__ uint32_t bf16_pack(float lo, float hi) {
  return uint32_t(f2bf(lo)) | (uint32_t(f2bf(hi)) << 16);
}

// One element's residual sum from its combine's fp32 total `acc`: bf16(routed), plus the shared
// experts' element `a` in bf16 where there is an addend, plus the residual element `xe`, rounded
// as rmsnorm_row<T, true> rounds the add (bf16 rows). The pairs kernel's and the fused combine in
// the q|kv_a GEMM's (kernels/gemm_combine.cuh): one definition, the same bits.
__device__ __forceinline__ float combine_residual_bf16(float acc, float a, float xe, bool has_addend) {
  const uint16_t routed = f2bf(acc);
  const float y = has_addend ? bf2f(f2bf(bf2f(routed) + a)) : bf2f(routed);
  return round_as<uint16_t>(xe + y);
}

}  // namespace atlas::cuda::kern
