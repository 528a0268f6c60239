// Programmatic dependent launch (sm_90; docs/cuda.md "Launch overlap"; on by default for decode
// steps, ATLAS_PDL=0 / 1 / decode or set_launch_overlap()). Every atlas kernel begins with
// pdl_begin() or, the GEMMs, pdl_begin_gemm(): wait until the kernel before it in the stream has
// completed and its writes are visible (griddepcontrol.wait) and allow the next kernel's blocks
// to be scheduled (griddepcontrol.launch_dependents). No kernel reads or writes anything an
// earlier kernel may write before its predecessor is done, and a kernel's predecessor completes
// only after passing its own wait: the order of completion, and the bits, are those of plain
// stream order. Model weights are the one exception, since no kernel writes them: the dense GEMMs
// stage or prefetch theirs before the wait (kern::start_tile in gemm_mma.cuh, the staged split-K
// and the cluster kernels), the wide norms, the latent cache and the MoE combine load their norm
// weights before it. Launched without the attribute both instructions are no-ops.
#pragma once

namespace atlas::cuda::kern {

// The GEMM kernels' (gemm_*.cuh): release, then wait, so the next kernel's blocks may become
// resident while this one still waits for its predecessor.
__device__ __forceinline__ void pdl_begin_gemm() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}

// Every other kernel (since session 18): wait, then release, so the chain runs one kernel
// ahead. When these released first too, a small kernel released early by a GEMM released the
// next GEMM in turn, whose blocks then prefetched their weights beside the GEMM still running:
// overlap on every launch measured slower than off at batch-1 decode (sessions 14 and 18), while
// the GEMMs' launches alone, or every launch but theirs, were faster (session 18, docs/cuda.md).
__device__ __forceinline__ void pdl_begin() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}

// The two halves of pdl_begin(), for a kernel that must write something between them (the
// routing's ready flag below).
__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void pdl_release() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}

// A ready flag: one kernel tells kernels launched after it, which may already run beside it
// under launch overlap, that some of its outputs are final, so they may read those before their
// own wait (which only covers the kernel right before them). The MoE routing's flag (moe.cuh,
// RoutePermuteParams::ready): the routing clears it after its wait and before it releases the
// next kernel (a fence in between: no kernel launched later can read the old value), and sets it
// after every result is written; the routed down GEMM and the combine, two and three launches
// later, read the expert offsets, slots and weights once it is set instead of after their wait.
// Only the time when those values are read changes, never the values: the same bits.
__device__ __forceinline__ int ld_acquire_gpu(const int* p) {
  int v;
  asm volatile("ld.acquire.gpu.global.b32 %0, [%1];\n" : "=r"(v) : "l"(p) : "memory");
  return v;
}
// A coherent load that orders after an earlier ld_acquire_gpu of the same thread but, unlike a
// chain of acquires, does not hold back the loads after it (so a thread's loads overlap). Never
// the read-only (.nc) path, which may serve data another kernel wrote while this one ran.
__device__ __forceinline__ int ld_relaxed_gpu(const int* p) {
  int v;
  asm volatile("ld.relaxed.gpu.global.b32 %0, [%1];\n" : "=r"(v) : "l"(p));
  return v;
}
__device__ __forceinline__ void st_release_gpu(int* p, int v) {
  asm volatile("st.release.gpu.global.b32 [%0], %1;\n" ::"l"(p), "r"(v) : "memory");
}
// Waits (every calling thread) until *flag != 0, then the caller's later loads see what was
// written before the flag was set. false: not set within kReadySpins polls (~1 s at most; the
// caller then reads after its launch-overlap wait as it would without the flag: a flag that is
// never set costs time, never bits).
constexpr int kReadySpins = 1 << 20;
__device__ __forceinline__ bool wait_ready(const int* flag) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  for (int i = 0; i < kReadySpins; ++i) {
    if (ld_acquire_gpu(flag) != 0) return true;
    __nanosleep(32);
  }
#endif
  return false;
}

}  // namespace atlas::cuda::kern
