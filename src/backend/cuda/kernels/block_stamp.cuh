// Block stamps (ATLAS_BLOCK_STAMPS, a diagnostic, session 38): where the blocks of the MoE
// phase's GEMM launches run and when, in their real context (a graph-captured batch-1 decode
// step, the shared experts' launches on the side stream beside the routed ones). CUPTI gives a
// launch's span only; session 37's timelines left open whether the routed gate|up is bound per
// block, per SM or by HBM as a whole (docs/cuda-sessions.md, "Status after session 37"), which needs each
// block's SM, its residency and the bytes it moved. A stamped instantiation of a GEMM kernel
// (kStamp = true) has thread 0 of each block read %smid and %globaltimer when the block starts,
// after its launch-overlap wait, and when it ends, and append one BlockStamp to a device ring
// (g_block_stamp_log, set by gemm.cu, which writes the ring to a CSV file when the process
// exits). The default instantiations carry none of it (BlockStampScope<false> is empty) and their
// parameters are what they were (the ring is a device global, not a GEMM parameter): their code
// is byte for byte what it was (tools/profile/cubin_ops.py same, on the cubins before and after).
#pragma once

#include <cstdint>

#include "common.cuh"  // global_timer_ns, sm_id

namespace atlas::cuda::kern {

// One block of one launch (64 bytes).
struct BlockStamp {
  // %globaltimer (ns, one clock for every SM): the block became resident, passed its
  // launch-overlap wait and found its tile (0: it had none; s38-1's split-K kernel did not mark
  // it), ended (thread 0's end).
  unsigned long long t0, go, t1;
  // The launch's weight: the dense w, or the grouped launch's per-group table w_groups. One
  // address per GEMM of each layer: which launch of a step the block belongs to.
  unsigned long long site;
  int n, k, grid, block;  // the problem's N and K, the launch's blocks, this block's index (x fastest)
  int smid, kind;         // the SM it ran on; kind: kBlockStamp* below (+ kBlockStampGrouped)
  long long bytes;        // the weight bytes this block copied (0: not counted by the kernel)
};
static_assert(sizeof(BlockStamp) == 64, "one stamp, one 64-byte record");

constexpr int kBlockStampLean = 0;    // gemm_wgstream_lean_kernel (the gate|ups' stream loop)
constexpr int kBlockStampTiled = 1;   // gemm_mma_kernel (the routed down's tiles)
constexpr int kBlockStampSplitK = 2;  // gemm_splitk_kernel (the shared down)
constexpr int kBlockStampGrouped = 16;  // added to the kind: a grouped launch (p.offsets)

// The ring: entry i of the process's stamps goes to entries[i % cap] (cap a power of two); count
// is the number written so far.
struct BlockStampLog {
  BlockStamp* entries = nullptr;
  unsigned long long* count = nullptr;
  unsigned cap = 0;
};
// This module's ring (cudaMemcpyToSymbol from gemm.cu; zero while stamps are off: a stamped
// block then records nothing). static: each translation unit that includes this header has its
// own, and only gemm.cu's launches stamped kernels.
static __device__ BlockStampLog g_block_stamp_log;

// A block's stamp: the constructor marks its start, go() the end of its wait, add_bytes() what it
// copied, and the destructor (at any return) appends the record. kOn false: nothing at all.
template <bool kOn>
struct BlockStampScope {
  __device__ __forceinline__ BlockStampScope(const void*, int, int, int) {}
  __device__ __forceinline__ void go() {}
  __device__ __forceinline__ void add_bytes(long long) {}
};

// The record lives in shared memory and only thread 0 touches it: the other threads hold nothing
// for it, so the stamped kernel keeps (nearly) the registers of the default one (in registers,
// s38-1's lean loop went from 80 to 88 per thread).
template <>
struct BlockStampScope<true> {
  static __device__ __forceinline__ BlockStamp& record() {
    __shared__ BlockStamp s;
    return s;
  }
  static __device__ __forceinline__ bool first() { return threadIdx.x == 0 && threadIdx.y == 0 && threadIdx.z == 0; }
  __device__ __forceinline__ BlockStampScope(const void* site, int n, int k, int kind) {
    if (!first()) return;
    BlockStamp& s = record();
    s.t0 = global_timer_ns();
    s.go = 0;
    s.site = reinterpret_cast<unsigned long long>(site);
    s.n = n;
    s.k = k;
    s.grid = int(gridDim.x * gridDim.y * gridDim.z);
    s.block = int(blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z));
    s.kind = kind;
    s.bytes = 0;
  }
  __device__ __forceinline__ void go() {
    if (first()) record().go = global_timer_ns();
  }
  __device__ __forceinline__ void add_bytes(long long b) {
    if (first()) record().bytes += b;
  }
  __device__ __forceinline__ ~BlockStampScope() {
    if (!first()) return;
    const BlockStampLog log = g_block_stamp_log;
    if (log.entries == nullptr || log.cap == 0) return;
    BlockStamp s = record();
    s.t1 = global_timer_ns();
    s.smid = int(sm_id());
    const unsigned long long i = atomicAdd(log.count, 1ull);
    log.entries[i & (log.cap - 1)] = s;
  }
};

}  // namespace atlas::cuda::kern
