// A decode step's absorbed-query GEMM and its latent cache kernel in one launch (session 32).
// The two are independent: both read only the q|kv_a rows (the GEMM q_nope, the latent job the
// latent row and q_pe) and they write disjoint columns of the absorbed queries (the GEMM
// [.., :dc], the latent job the rotated rope parts [.., dc:]) and the cache slot. In one stream
// with launch overlap each launch waits for the whole one before it, so as two launches the
// GEMM waited for the latent kernel (~2.5 us) after q|kv_a; here both wait for q|kv_a only.
// Grid (max(tiles, tokens), 1, batch + 1): z < batch is gemm_mma_kernel<T, false, true>'s tile
// (blockIdx.x, batch entry z: the head), z == batch is the latent job of token blockIdx.x
// (latent_cache_half_block), the queries' rope pairs spread over the rest of that row (or, with
// no blocks to spare, over all of it after the latent jobs); GEMM blocks past the tiles exit.
// The same bits as latent_to_cache() then gemm().
#pragma once

#include "gemm_mma.cuh"
#include "latent_cache.cuh"

namespace atlas::cuda::kern {

template <class T>
__global__ void __launch_bounds__(T::THREADS)
    gemm_mma_latent_kernel(const MmaGemmParams p, const LatentCacheParams<uint16_t> lc, int batch, int tiles,
                           int tokens) {
  static_assert(T::THREADS == kReduceThreads / 2, "the latent job's block is half a reduce block");
  extern __shared__ __align__(128) unsigned char gemm_smem[];
  __shared__ int64_t a_off[T::BM];
  __shared__ int64_t b_off[T::BN];
  if (int(blockIdx.z) == batch) {
    // Released first, as the GEMM's blocks are (pdl_begin_gemm): the attention kernel after this
    // launch reads the new slot and the queries only after its own wait.
    pdl_release_if(true);
    const int x = int(blockIdx.x), blocks = int(gridDim.x);
    if (x < tokens) {
      latent_cache_half_block<uint16_t>(lc, x, reinterpret_cast<float*>(gemm_smem));
      if (blocks > tokens) return;
    } else {
      pdl_wait_after(true);
    }
    // The queries' rope pairs on the blocks past the tokens (at a batch-1 step 15 blocks, one
    // pair per thread), else on every block of the row after its latent job.
    const int first = blocks > tokens ? tokens : 0;
    latent_rope_queries_spread<uint16_t>(lc, tokens, (x - first) * T::THREADS + int(threadIdx.x),
                                         (blocks - first) * T::THREADS);
    return;
  }
  if (int(blockIdx.x) >= tiles) return;
  uint16_t* sA = reinterpret_cast<uint16_t*>(gemm_smem);
  uint16_t* sB = sA + T::STAGES * T::BM * T::BK;
  const int tid = threadIdx.x, lane = tid & 31;
  TileSpot t;
  if (!start_tile<T::BM, T::BN, true>(p, int(blockIdx.x), tid, lane, t, 0, p.K)) return;
  mma_tile<T, false, true>(p, t, 0, sA, sB, a_off, b_off);
}

}  // namespace atlas::cuda::kern
