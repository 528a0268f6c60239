// Distributed shared memory between the blocks of a cluster (sm_90): stores that signal the
// receiving block's mbarrier with their byte count (st.async ... complete_tx), and the mbarrier
// operations the receiver needs. A producer pushes its data into every consumer's shared memory;
// a consumer waits on its own mbarrier until the bytes it expects have landed. Unlike a cluster
// barrier (barrier.cluster.arrive's release is a GPU-scope memory barrier in the machine code,
// MEMBAR.ALL.GPU, Nsight session 36), nothing here waits for the block's other memory traffic,
// and a consumer waits only for its own producers.
// Order of use: init + expect (one thread) -> fence_mbarrier_init + cluster_arrive_relaxed (every
// thread) -> ... -> cluster_wait (every thread, before the first remote store) -> pushes ->
// mbar_wait on the local barrier. One phase (parity 0) per barrier and launch.
#pragma once

#include <cstdint>

namespace atlas::cuda::kern {

__device__ __forceinline__ void mbar_init(uint32_t bar, uint32_t arrivals) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(arrivals) : "memory");
}
// One arrival that also adds `bytes` to the transaction count the phase waits for.
__device__ __forceinline__ void mbar_arrive_expect(uint32_t bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}
__device__ __forceinline__ void fence_mbarrier_init() {
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}
__device__ __forceinline__ void cluster_arrive_relaxed() {
  asm volatile("barrier.cluster.arrive.relaxed.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void cluster_wait() { asm volatile("barrier.cluster.wait.aligned;\n" ::: "memory"); }
// Spins until the barrier's phase `parity` has completed; acquire at cluster scope (the pushes
// came from other blocks).
__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity) {
  uint32_t done = 0;
  do {
    asm volatile(
        "{\n .reg .pred p;\n mbarrier.try_wait.parity.acquire.cluster.shared::cta.b64 p, [%1], %2;\n"
        " selp.u32 %0, 1, 0, p;\n}\n"
        : "=r"(done)
        : "r"(bar), "r"(parity)
        : "memory");
  } while (!done);
}
// The address of `local` (a shared::cta address) in block `rank` of the cluster.
__device__ __forceinline__ uint32_t dsmem_addr(uint32_t local, uint32_t rank) {
  uint32_t r;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(r) : "r"(local), "r"(rank));
  return r;
}
// Remote stores (addresses from dsmem_addr) that count their bytes on the remote barrier `bar`.
__device__ __forceinline__ void st_async_f32(uint32_t addr, float v, uint32_t bar) {
  asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.b32 [%0], %1, [%2];\n" ::"r"(addr),
               "r"(__float_as_uint(v)), "r"(bar)
               : "memory");
}
__device__ __forceinline__ void st_async_v4(uint32_t addr, uint4 v, uint32_t bar) {
  asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.v4.b32 [%0], {%1, %2, %3, %4}, [%5];\n" ::"r"(
                   addr),
               "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w), "r"(bar)
               : "memory");
}

}  // namespace atlas::cuda::kern
