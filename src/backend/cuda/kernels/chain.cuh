// The device side of a flag chain link (chain_link.h): the consumer's wait in place of the
// launch-overlap wait, the producer's signal at a block's end.
//
// Why it is safe (the host's part: cuda_model.cpp, ModelEnv::flag_chain):
// - The consumer is launched with launch overlap right after the producer, so it starts only
//   once every producer block has started (launch_dependents or exit): the producer's blocks are
//   all resident while consumer blocks poll, so the poll cannot starve them.
// - Every producer block signals after all its stores, thread 0 by a release add after a block
//   barrier (the pattern of a grid barrier): when the count is whole, every block's writes are
//   visible at GPU scope. The consumer's thread 0 reads the count with acquire semantics and the
//   block barrier after it orders its threads' loads after that.
// - A producer signals only after its own wait (launch overlap or a link), so whatever its
//   inputs were is complete too: a consumer may read any earlier kernel's output, as in stream
//   order.
// - Counts are zeroed by the consumer's last block past its wait (a ticket from a counter beside
//   the count) at its end, before its own signal: so before any later kernel runs past a link
//   or a launch-overlap wait, in particular before the next decode step's producer signals.
#pragma once

#include "chain_link.h"
#include "common.cuh"

namespace atlas::cuda::kern {

// The count, with acquire semantics at GPU scope: what the producer's blocks stored before their
// release (chain_end) is visible to this thread after it, and through the block barrier that
// follows to the whole block (the pattern of a grid barrier; the acquire also drops this SM's L1
// lines, so even the GEMMs' non-coherent loads of x read the new values).
__device__ __forceinline__ int chain_load_acquire(const int* p) {
  int v;
  asm volatile("ld.acquire.gpu.global.s32 %0, [%1];\n" : "=r"(v) : "l"(p) : "memory");
  return v;
}

// Consumer: wait until *c.wait == c.count (thread 0 polls, the block waits at a barrier).
// Returns thread 0's ticket (its block's place among the consumer's blocks past the wait; the
// atomic's result is read only in chain_end, so its round trip overlaps the block's work).
__device__ __forceinline__ int chain_wait(const ChainLink& c) {
  int ticket = 0;
  if (threadIdx.x == 0) {
    if (chain_load_acquire(c.wait) < c.count) {
      const unsigned long long t0 = global_timer_ns();
      while (chain_load_acquire(c.wait) < c.count) {
        if (global_timer_ns() - t0 > kChainTimeoutNs) {
          if (c.error) atomicOr(c.error, kErrChainTimeout);
          break;
        }
      }
    }
    ticket = atomicAdd(c.wait + kChainPassed, 1);
  }
  __syncthreads();
  return ticket;
}

// Every block of a kernel with a link, once, at its very end (all threads): a consumer's last
// block past the wait zeroes the slot it waited on (every block of it has passed, so nobody
// reads it any more; before the signal below, so before anything after this launch); then a
// producer's block publishes its stores.
__device__ __forceinline__ void chain_end(const ChainLink& c, int ticket) {
  if (c.wait != nullptr && threadIdx.x == 0 && ticket == int(gridDim.x * gridDim.y * gridDim.z) - 1) {
    c.wait[0] = 0;
    c.wait[kChainPassed] = 0;
  }
  if (c.signal == nullptr) return;
  __syncthreads();  // every thread's stores before thread 0's release
  if (threadIdx.x == 0) asm volatile("red.release.gpu.global.add.s32 [%0], 1;\n" ::"l"(c.signal) : "memory");
}

// The wait of a kernel that releases the next launch first (the GEMMs): with a link, release,
// then poll the link instead of griddepcontrol.wait.
__device__ __forceinline__ void chain_or_pdl_begin_gemm(const ChainLink& c, int& ticket) {
  if (c.wait != nullptr) {
    pdl_release_if(true);
    ticket = chain_wait(c);
  } else {
    pdl_begin_gemm();
  }
}
// ... and where a kernel's wait was pdl_wait_after(released): release after the poll unless
// released already.
__device__ __forceinline__ void chain_or_pdl_wait_after(const ChainLink& c, bool released, int& ticket) {
  if (c.wait != nullptr) {
    ticket = chain_wait(c);
    pdl_release_if(!released);
  } else {
    pdl_wait_after(released);
  }
}

}  // namespace atlas::cuda::kern
