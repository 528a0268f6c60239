// One link of a flag chain between two launches of a stream (session 41, ATLAS_FLAG_CHAIN; the
// device side in chain.cuh). Plain data, included by cuda_ops.h (host compiler) and the kernels.
//
// Under launch overlap a kernel's wait (griddepcontrol.wait) returns ~1.5-2 us after its
// predecessor's last block has ended (session 40's block stamps: the routed down's blocks passed
// it 1.8-2.3 us after the gate|up's last block). A link replaces that wait between two kernels
// of a decode step: every block of the producer, at its very end (its stores made visible by a
// fence), adds 1 to `signal`; every block of the consumer, where it would wait, polls `wait`
// until it holds `count` (the producer's block count) instead. Nothing about the data changes:
// the consumer reads the same values, after the producer wrote them: the same bits.
#pragma once

namespace atlas::cuda::kern {

struct ChainLink {
  // Consumer side: poll *wait until it reaches count (the producer launch's number of blocks),
  // then zero it (the consumer's last block, counted in wait[kChainPassed]) for the next step.
  int* wait = nullptr;
  int count = 0;
  // Producer side: each block adds 1 to *signal at its end.
  int* signal = nullptr;
  // Where a consumer that waited kChainTimeoutNs in vain reports kErrChainTimeout (a producer
  // that never ran: a bug in the host's links, not hung forever).
  int* error = nullptr;
};

// A slot: the count at [0], the consumer's passed blocks one 128-byte line later (the
// producers' adds and the consumers' polls meet on the first line only).
constexpr int kChainPassed = 32, kChainSlotInts = 64;
constexpr int kErrChainTimeout = 1024;
constexpr unsigned long long kChainTimeoutNs = 2000000000ull;

}  // namespace atlas::cuda::kern
