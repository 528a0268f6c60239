// The MLA split merge inside the value GEMM's launch (session 32; off by default,
// ATLAS_MLA_MERGE_VALUE=1; the same bits, slower: 447.6 vs 458.7 tok/s, s33-1). At a decode step the merge (one block per
// (query, head): the attention kernel's split partials folded into the latent output o_lat) and
// the value GEMM (o_lat_h W_UV^h per head) were two launches, each a ~2.3-2.7 us hop after the
// one before. Here the value GEMM's block (tile x of head z) first merges the rows of its tile
// for head z itself, as mla_tc_merge_kernel's block for that item would (mla_merge_item: the same
// arithmetic, the same o_lat stores), then runs the tile from o_lat as gemm_mma_kernel does. The
// tiles of one head all merge the same items: they store the same values into o_lat, and each
// block reads only after its own stores (the barrier below), so what it reads is the merged row
// whichever block's store landed last. Queries with one split (the attention kernel wrote o_lat
// itself) and lengths out of range are left as the merge kernel leaves them. The same bits as
// the merge kernel then gemm().
#pragma once

#include "gemm_mma.cuh"
#include "mla_merge.cuh"

namespace atlas::cuda::kern {

template <class T>
__global__ void __launch_bounds__(T::THREADS) gemm_mma_merge_kernel(const MmaGemmParams p, const MlaMergeParams m) {
  static_assert(T::THREADS == kMlaMergeThreads, "one merge item per block pass: 4 latent columns per thread");
  extern __shared__ __align__(128) unsigned char gemm_smem[];
  __shared__ int64_t a_off[T::BM];
  __shared__ int64_t b_off[T::BN];
  uint16_t* sA = reinterpret_cast<uint16_t*>(gemm_smem);
  uint16_t* sB = sA + T::STAGES * T::BM * T::BK;
  const int tid = threadIdx.x, lane = tid & 31;
  TileSpot t;
  // The weights into L2 before the launch-overlap wait (start_tile), the merge after it.
  if (!start_tile<T::BM, T::BN, true>(p, int(blockIdx.x), tid, lane, t, 0, p.K)) return;
  const int head = int(blockIdx.z);
  for (int r = t.row_begin; r < t.row_end; ++r) {
    const int len = m.lengths[r];  // bad lengths: reported by the attention kernel
    if (len >= 0 && len <= m.max_length && (len == 0 || len > m.S))
      mla_merge_item<true>(m.ws_acc, m.ws_ml, len, m.heads, m.latent, m.S, m.max_splits, m.out,
                           int64_t(r) * m.heads + head, 4 * tid);
  }
  // Every o_lat store of this block before its copies read the rows: the copies (cp.async.cg)
  // read through L2, past the L1 that a CTA-scope barrier alone may leave the stores in, so the
  // stores are fenced at GPU scope first.
  __threadfence();
  __syncthreads();
  mma_tile<T, false, true>(p, t, 0, sA, sB, a_off, b_off);
}

}  // namespace atlas::cuda::kern
