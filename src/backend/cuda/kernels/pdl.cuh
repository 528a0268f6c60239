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
// weights before it, and the lean stream loop copies a grouped launch's weight-pointer table.
// Launched without the attribute both instructions are no-ops.
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
// the GEMMs' launches alone, or every launch but theirs, were faster (session 18, docs/cuda-sessions.md).
__device__ __forceinline__ void pdl_begin() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}

// Release-first as a choice (ATLAS_RELEASE_FIRST; launchers pass cuda_internal.h's
// release_first(site)): pdl_begin() or, with rf, release then wait as the GEMMs
// do, so that the next kernel's blocks may become resident, and load what they load before their
// own wait, while this one still waits. The bits cannot change: the next kernel's wait still
// waits for this one's completion. What it needs of every kernel: the part before its wait reads
// only model weights (never a kernel's output) or what was written before the last wait-first
// kernel ahead of it in the stream completed: a decode step's lengths, cache rows and older cache
// slots (the MLA kernels; run_inputs_kernel writes them, and the embedding copy after it waits
// first). Every atlas kernel keeps to that (docs/cuda-sessions.md, "Status after session 27").
// For kernels with work before their wait: pdl_release_if(rf) first thing, pdl_wait_after(rf)
// where the wait goes (it releases there unless released already).
__device__ __forceinline__ void pdl_release_if(bool rf) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  if (rf) asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void pdl_wait_after(bool released) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
  if (!released) asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}
// Both at the start (rf may be a template constant or a launch parameter).
__device__ __forceinline__ void pdl_begin_rf(bool rf) {
  if (rf)
    pdl_begin_gemm();
  else
    pdl_begin();
}

}  // namespace atlas::cuda::kern
