// mbarriers and distributed shared memory between the blocks of a cluster (sm_90): stores that
// signal the receiving block's mbarrier with their byte count (st.async ... complete_tx), and the
// mbarrier operations the receiver needs. A producer pushes its data into every consumer's
// shared memory; a consumer waits on its own mbarrier until the bytes it expects have landed.
// Unlike a cluster barrier (barrier.cluster.arrive's release is a GPU-scope memory barrier in the
// machine code, MEMBAR.ALL.GPU, Nsight session 36), nothing here waits for the block's other
// memory traffic, and a consumer waits only for its own producers.
// Order of use: init + expect (one thread) -> fence_mbarrier_init + cluster_arrive_relaxed (every
// thread) -> ... -> cluster_wait (every thread, before the first remote store) -> pushes ->
// mbar_wait_cluster on the local barrier. One phase (parity 0) per barrier and launch.
// mbar_init and mbar_arrive_expect_tx are also the TMA kernels' (gemm_tma.cuh). Each helper
// emits its instruction for sm_90 and later only: its callers compile for older GPUs too (their
// bodies are behind an architecture test).
#pragma once

#include <cstdint>

namespace atlas::cuda::kern {

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define ATLAS_DSMEM_ARCH 1
#else
#define ATLAS_DSMEM_ARCH 0
#endif

__device__ __forceinline__ void mbar_init(uint32_t bar, uint32_t arrivals) {
#if ATLAS_DSMEM_ARCH
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(arrivals) : "memory");
#endif
}
// One arrival that also adds `bytes` to the transaction count the phase waits for (the bytes of
// tensor copies or of st.async stores).
__device__ __forceinline__ void mbar_arrive_expect_tx(uint32_t bar, uint32_t bytes) {
#if ATLAS_DSMEM_ARCH
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
#endif
}
__device__ __forceinline__ void fence_mbarrier_init() {
#if ATLAS_DSMEM_ARCH
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void cluster_arrive_relaxed() {
#if ATLAS_DSMEM_ARCH
  asm volatile("barrier.cluster.arrive.relaxed.aligned;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void cluster_wait() {
#if ATLAS_DSMEM_ARCH
  asm volatile("barrier.cluster.wait.aligned;\n" ::: "memory");
#endif
}
// Spins until the barrier's phase `parity` has completed; acquire at cluster scope (the pushes
// came from other blocks). (gemm_tma.cuh's mbar_wait is the CTA-scope form for its TMA ring.)
__device__ __forceinline__ void mbar_wait_cluster(uint32_t bar, uint32_t parity) {
#if ATLAS_DSMEM_ARCH
  uint32_t done = 0;
  do {
    asm volatile(
        "{\n .reg .pred p;\n mbarrier.try_wait.parity.acquire.cluster.shared::cta.b64 p, [%1], %2;\n"
        " selp.u32 %0, 1, 0, p;\n}\n"
        : "=r"(done)
        : "r"(bar), "r"(parity)
        : "memory");
  } while (!done);
#endif
}
// One arrival on barrier `bar` of another block (an address from dsmem_addr), releasing this
// thread's earlier reads and writes at cluster scope.
__device__ __forceinline__ void mbar_remote_arrive(uint32_t bar) {
#if ATLAS_DSMEM_ARCH
  asm volatile("mbarrier.arrive.release.cluster.shared::cluster.b64 _, [%0];\n" ::"r"(bar) : "memory");
#endif
}
// The address of `local` (a shared::cta address) in block `rank` of the cluster.
__device__ __forceinline__ uint32_t dsmem_addr(uint32_t local, uint32_t rank) {
  uint32_t r = local;
#if ATLAS_DSMEM_ARCH
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(r) : "r"(local), "r"(rank));
#endif
  return r;
}
// Remote stores (addresses from dsmem_addr) that count their bytes on the remote barrier `bar`.
__device__ __forceinline__ void st_async_f32(uint32_t addr, float v, uint32_t bar) {
#if ATLAS_DSMEM_ARCH
  asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.b32 [%0], %1, [%2];\n" ::"r"(addr),
               "r"(__float_as_uint(v)), "r"(bar)
               : "memory");
#endif
}
__device__ __forceinline__ void st_async_v2(uint32_t addr, float2 v, uint32_t bar) {
#if ATLAS_DSMEM_ARCH
  asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.v2.b32 [%0], {%1, %2}, [%3];\n" ::"r"(addr),
               "r"(__float_as_uint(v.x)), "r"(__float_as_uint(v.y)), "r"(bar)
               : "memory");
#endif
}
__device__ __forceinline__ void st_async_v4(uint32_t addr, uint4 v, uint32_t bar) {
#if ATLAS_DSMEM_ARCH
  asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.v4.b32 [%0], {%1, %2, %3, %4}, [%5];\n" ::"r"(
                   addr),
               "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w), "r"(bar)
               : "memory");
#endif
}

#undef ATLAS_DSMEM_ARCH

}  // namespace atlas::cuda::kern
