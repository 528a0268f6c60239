// Shared device helpers: bf16 bit conversions and the fixed-order block reduction.
//
// bf16 values travel as uint16_t bit patterns. The conversions are the same integer code as
// core/bf16.h (round to nearest even, NaN kept quiet), so device and host round identically.
// All atlas_cuda code is compiled with --fmad=false: a*b+c is two roundings unless a kernel
// writes fmaf() on purpose, exactly as the host side builds with -ffp-contract=off.
#pragma once

#include <cstdint>

#include "pdl.cuh"

namespace atlas::cuda::kern {

// `bytes` (a multiple of 16, 16-byte aligned src) of global memory into L2 (sm_90 bulk
// prefetch; nothing on older GPUs). A hint: it writes nothing, so it never changes bits.
__device__ __forceinline__ void prefetch_l2(const void* src, uint32_t bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;\n" ::"l"(src), "r"(bytes) : "memory");
#endif
}

__device__ __forceinline__ float bf2f(uint16_t h) { return __uint_as_float(uint32_t(h) << 16); }

__device__ __forceinline__ uint16_t f2bf(float f) {
  uint32_t u = __float_as_uint(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);
  return uint16_t(u >> 16);
}

__device__ __forceinline__ float round_bf(float f) { return bf2f(f2bf(f)); }

// Element-type helpers for kernels templated on the storage type: uint16_t = bf16 bits (the
// production path), float = the f32 checking mode. to_f32 loads, from_f32<T> stores (bf16: one
// rounding to nearest even; f32: exact), round_as<T> is a bf16 rounding point of the official
// code (identity in f32). For uint16_t they are exactly bf2f / f2bf / round_bf, so a kernel
// written with them compiles to the same arithmetic as before for bf16.
__device__ __forceinline__ float to_f32(uint16_t h) { return bf2f(h); }
__device__ __forceinline__ float to_f32(float f) { return f; }
template <class T>
__device__ __forceinline__ T from_f32(float f);
template <>
__device__ __forceinline__ uint16_t from_f32<uint16_t>(float f) { return f2bf(f); }
template <>
__device__ __forceinline__ float from_f32<float>(float f) { return f; }
template <class T>
__device__ __forceinline__ float round_as(float f) { return to_f32(from_f32<T>(f)); }

// Fixed-order sum over a block of kReduceThreads threads (8 warps):
//   1. inside each warp, a butterfly over lane offsets 16, 8, 4, 2, 1;
//   2. the 8 warp sums, as a tree with offsets 4, 2, 1.
// Float addition is commutative, so after step 1 every lane of a warp holds the same bits.
// reference.cpp's block_sum_ref() reproduces this order on the host. Every thread gets the sum.
constexpr int kReduceThreads = 256;

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
  return v;
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, off));
  return v;
}

// Warp 0's tree over the 8 warp sums scratch[0..7] into scratch[8]: offsets 4, 2, 1 (lanes >= 8
// carry zeros that never mix in: lane i < 8 only reads lanes i^4, i^2, i^1 < 8).
__device__ __forceinline__ void eight_warp_tree(float* scratch, int lane) {
  float s = lane < 8 ? scratch[lane] : 0.0f;
  s += __shfl_xor_sync(0xffffffffu, s, 4);
  s += __shfl_xor_sync(0xffffffffu, s, 2);
  s += __shfl_xor_sync(0xffffffffu, s, 1);
  if (lane == 0) scratch[8] = s;
}

// `scratch` holds at least 9 floats. The block has kReduceThreads threads, or more (the wide
// norms of rmsnorm.cuh: 1024), in which case only the first kReduceThreads threads' values
// count: the order is the same whatever the block size.
__device__ __forceinline__ float block_sum(float v, float* scratch) {
  v = warp_sum(v);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  __syncthreads();  // scratch may still be read by a previous call
  if (lane == 0 && warp < kReduceThreads / 32) scratch[warp] = v;
  __syncthreads();
  if (warp == 0) eight_warp_tree(scratch, lane);
  __syncthreads();
  return scratch[8];
}

// block_sum's order on a block of kReduceThreads / 2 threads (128: the cluster GEMM's and the
// tiled 16-row GEMM's blocks): thread t stands for the 256-thread block's threads t and t + 128,
// holding their values v0 and v1, so warp w's two warp sums are that block's warps w and w + 4;
// then block_sum's tree over the eight. The same bits as block_sum over those 256 values. Every
// thread gets the sum. `scratch` holds at least 9 floats and is not read by an earlier call
// still (its two callers use it once; unlike block_sum, no barrier before the warp sums' stores,
// so latent_cache_half_block runs the barriers it ran before this function existed).
__device__ __forceinline__ float half_block_sum(float v0, float v1, float* scratch) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const float w0 = warp_sum(v0), w1 = warp_sum(v1);
  if (lane == 0) {
    scratch[warp] = w0;
    scratch[warp + 4] = w1;
  }
  __syncthreads();
  if (warp == 0) eight_warp_tree(scratch, lane);  // block_sum's tree over the eight warp sums
  __syncthreads();
  return scratch[8];
}

__device__ __forceinline__ float block_max(float v, float* scratch) {
  v = warp_max(v);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  __syncthreads();
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  if (warp == 0) {
    float s = lane < 8 ? scratch[lane] : scratch[0];
    s = fmaxf(s, __shfl_xor_sync(0xffffffffu, s, 4));
    s = fmaxf(s, __shfl_xor_sync(0xffffffffu, s, 2));
    s = fmaxf(s, __shfl_xor_sync(0xffffffffu, s, 1));
    if (lane == 0) scratch[8] = s;
  }
  __syncthreads();
  return scratch[8];
}

// ---- shared-memory addresses and 16-byte asynchronous copies (sm_80+; GEMM and MLA kernels) ----

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// 16-byte global -> shared copy; src_bytes = 0 writes 16 zero bytes and reads nothing.
// dst: an address in the shared window (smem_u32).
__device__ __forceinline__ void cp_async16_at(uint32_t dst, const void* src, int src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(src_bytes) : "memory");
}
__device__ __forceinline__ void cp_async16(void* dst, const void* src, int src_bytes) {
  cp_async16_at(smem_u32(dst), src, src_bytes);
}
// Streamed weights and L2 (session 17): a batch-1 decode step reads ~5 GB of weights through a
// 50 MB L2, each byte once. The GEMMs' weight copies carry an evict_first policy (MmaGemmParams::
// l2_evict_first, on by default; the host's rule in gemm.cu), so the L2 gives up those lines
// first. Measured: batch-1 decode 5% faster, mostly in the expert GEMMs themselves (docs/cuda-sessions.md,
// session 17). A caching hint only: the same bits either way.
// L2Hint{} (on = false): the plain copy.
struct L2Hint {
  bool on = false;
  uint64_t policy = 0;
};
__device__ __forceinline__ L2Hint l2_evict_first_hint(bool on) {
  L2Hint h;
  h.on = on;
  if (on) asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;\n" : "=l"(h.policy));
  return h;
}
__device__ __forceinline__ void cp_async16_at(uint32_t dst, const void* src, int src_bytes, L2Hint h) {
  if (h.on)
    asm volatile("cp.async.cg.shared.global.L2::cache_hint [%0], [%1], 16, %2, %3;\n" ::"r"(dst), "l"(src),
                 "r"(src_bytes), "l"(h.policy)
                 : "memory");
  else
    cp_async16_at(dst, src, src_bytes);
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

// silu(g) = g / (1 + exp(-g)) in fp32 (PyTorch's formula). The MLP's activation is
// round(round(silu(g)) * u) at the working precision, g and u being the gate|up GEMM's outputs
// (silu_gate_kernel; the GEMMs' fused gate|up epilogue computes the same from its unrounded
// sums after rounding them to bf16 as a stored output would be).
__device__ __forceinline__ float silu_f32(float g) { return g / (1.0f + expf(-g)); }

// The global nanosecond timer (%globaltimer: one clock for every SM) and the SM a thread runs on:
// the block stamps' readings (block_stamp.cuh) and bench/cuda's probes.
__device__ __forceinline__ unsigned long long global_timer_ns() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}
__device__ __forceinline__ unsigned sm_id() {
  unsigned s;
  asm volatile("mov.u32 %0, %%smid;" : "=r"(s));
  return s;
}

}  // namespace atlas::cuda::kern
