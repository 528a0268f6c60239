// Programmatic dependent launch (sm_90; docs/cuda.md "Launch overlap"; ATLAS_PDL=1 or
// set_launch_overlap(true)). Every atlas kernel begins with pdl_begin(): allow the next kernel's
// blocks to be scheduled (griddepcontrol.launch_dependents), then wait until the kernel before it
// in the stream has completed and its writes are visible (griddepcontrol.wait). The next kernels'
// launches thus overlap this one's run (each one releases its own successor as soon as its blocks
// are resident, so a chain of small launches is scheduled ahead as far as the SMs have room),
// while no kernel reads or writes anything an earlier kernel may write before its predecessor is
// done: a kernel's predecessor completes only after passing its own wait, so the order of
// completion, and the bits, are those of plain stream order. (The dense GEMMs prefetch their
// model weights into L2 before the wait: kern::start_tile in gemm_mma.cuh.) Session 9, H200:
// releasing before the wait measured 274.7 tok/s at batch-1 decode and 7.48 s for the seed grid,
// against 262.1 / 7.71 for wait-then-release and 266.8 / 7.65 with overlap off (one run each).
// Launched without the attribute (overlap off, or <<<>>>) both instructions are no-ops.
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

// Every other kernel (session 18): wait, then release. A chain of small launches is then
// scheduled one kernel ahead, not as far as the SMs have room: under ATLAS_PDL=1 a small
// kernel released early by a GEMM had released the next GEMM in turn, whose blocks then
// prefetched their weights beside the GEMM still running (ATLAS_PDL=1 measured slower than
// off in sessions 9 and 14 and 18; the GEMMs' launches alone, ATLAS_PDL=3, faster).
__device__ __forceinline__ void pdl_begin() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}

}  // namespace atlas::cuda::kern
