// Programmatic dependent launch (sm_90; docs/cuda.md "Launch overlap"; off by default, ATLAS_PDL=1). Every atlas kernel
// begins with pdl_begin(): wait until the kernel before it in the stream has completed and its
// writes are visible (griddepcontrol.wait), then allow the next kernel's blocks to be scheduled
// (griddepcontrol.launch_dependents); they in turn wait in their own pdl_begin(). The next
// launch's setup thus overlaps this kernel's run, and no kernel reads or writes anything an
// earlier kernel may write before its predecessor is done, so results are the same bits as with
// plain stream order. (The dense GEMMs prefetch their model weights into L2 before it:
// kern::start_tile in gemm_mma.cuh.) Launched
// without the attribute (detail::launch with PDL off, or <<<>>>) both are no-ops.
#pragma once

namespace atlas::cuda::kern {

__device__ __forceinline__ void pdl_begin() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#if defined(ATLAS_PDL_TRIGGER_FIRST)
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#else
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
#endif
}

}  // namespace atlas::cuda::kern
