// MLA attention in the absorbed form on tensor cores (mma.sync m16n8k16, bf16 -> fp32), for
// decode (one query per cache row) and prefill (many queries of one cache row, each with its
// own causal length). FlashMLA-like: MQA, all heads of a query share the single latent "KV
// head", so a query's heads (padded to 16 with zero rows) form the M = 16 rows of the MMA.
//
// Numerics contract (the CPU twin is ref::mla_decode in reference.cpp; docs/cuda.md):
//   For query b with length len (slots [0, len) of its cache row), heads h:
//   * splits: slots [s*S, min((s+1)*S, len)), S = split_tokens, anchored at slot 0 (never at a
//     block's or a group's first slot), one partial (acc[latent], m, l) per split;
//   * tiles: each split is walked in tiles of kMlaTile = 64 slots from the split's start, in
//     ascending order; for one tile with nv valid slots:
//       s_j   = fp32(q_h . c_j) * scale          (tensor core dot over the width, fp32 accumulate)
//       m'    = max(m, max_j s_j)
//       p_j   = bf16(expf(s_j - m'))            (P is rounded to bf16 for the MMA, as in
//                                                flash-attention; l sums the same rounded p_j)
//       t     = (q0 + q1) + (q2 + q3), q_k = sequential fp32 sum of p over tile columns
//               [16k, 16k+16) (invalid columns are 0)
//       a     = expf(m - m')                    (0 for the split's first tile)
//       l     = fmaf(l, a, t);  acc = acc * a + P . C[tile, :latent]  (tensor core)
//   * merge over the splits in ascending order: M = max m_s, f_s = expf(m_s - M),
//     L = fmaf chain of l_s*f_s, o = fmaf chain of acc_s*f_s, out = bf16(o / L), and an exact
//     zero is written as +0. With one split this is out = bf16(acc / l), which the split kernel
//     writes directly (the merge of one split is the identity: f = 1, fmaf(x, 1, 0) = x).
//   * len = 0: out = 0.
// The only differences to the CPU reference are the tensor core's fp32 accumulation order in
// the two dot products and expf vs libm (tests state the tolerance). Nothing depends on other
// queries: the split and tile boundaries are fixed per query, rows of an MMA never mix (padded
// heads and other queries are other rows), and a slot that is valid for another query of the
// block but not for this one has p = 0 exactly, which adds exact zeros. So a query's bits are
// the same alone, in any batch, in any order, grouped with any neighbours, and whatever
// max_length says (tests/cuda/test_cuda_mla.cpp checks each).
//
// Structure: grid (ceil(rows / G), max_splits), 256 threads (8 warps), G = 1, 2 or 4 consecutive
// queries per block (prefill: neighbours of the same cache row share every cache tile, so G
// divides the cache traffic; G = 4 has 64 MMA rows and fits one tile buffer only, ~177 KB). A
// block walks runs of its queries that share a cache row (queries of different rows run one
// after the other). Per tile of 64 slots, double-buffered with 16-byte cp.async:
//   phase 1: S[16G, 64] = Q . C^T: warp w takes query w / (8/G) and 8G slots;
//   softmax: 4 threads per MMA row (the fixed l order above), P to shared memory as bf16;
//   phase 2: O[16G, latent] += P . C[:, :latent]: warp w owns latent columns [64w, 64w+64)
//            for all G queries (accumulators stay in registers across the split).
// Small decode batches run mla_tc_cluster_kernel (below) instead: the same numbers, a split's
// four tiles spread over a cluster of four blocks.
// (Session 9: the cache tiles through the bulk-copy engine, one copy per slot row on a per-stage
// mbarrier, commit c0834d7: same bits, no gain: batch 1 at 512 slots 30.1 us against session 8's
// 29.9 with cp.async, end to end within noise in the same run; Nsight 10.4
// cycles per issued instruction with 2 warps per scheduler: a batch-1 block is bound by its own
// instruction latency chain over ~1,000 instructions per warp and tile, not by its loads.
// Dropped.)
#pragma once

#include <cooperative_groups.h>

#include "common.cuh"
#include "dsmem.cuh"
#include "mla_merge.cuh"  // kMlaAccStride, f2bf_out, mla_merge_item
#include "phase_clock.cuh"

namespace atlas::cuda::kern {

constexpr int kMlaTcThreads = 256;
constexpr int kMlaTile = 64;           // slots per tile: part of the numerics (see above)
constexpr int kMlaSStride = kMlaTile + 4;  // fp32 scores row stride (bank spread)
constexpr int kMlaPStride = kMlaTile + 8;  // bf16 P row stride (16-byte rows, conflict-free ldmatrix)

struct MlaTcParams {
  const uint16_t* q;       // [rows, heads, width]
  const uint16_t* cache;   // row r at + r * cache_row_stride: [slots, width]
  int64_t cache_row_stride;
  const int32_t* lengths;  // [rows]
  const int32_t* cache_rows;  // [rows] or null
  uint16_t* out;           // [rows, heads, latent]
  float* ws_acc;           // [rows, max_splits, heads, kMlaAccStride]
  float* ws_ml;            // [rows, max_splits, heads, 2] (m, l)
  int* error_flag;
  int rows, heads, latent, width;
  int wp;                  // width rounded up to 16 (MMA k steps; the pad is zeros)
  int max_length, S, max_splits;
  float scale;
  // 1: a decode step's launch (one query per cache row) after the latent cache kernel, which
  // writes slot lengths[q] - 1 of each row only: slots [0, lengths[q] - 1) were written by
  // earlier steps, lengths and cache_rows at this step's start (ahead of the embedding copy, which
  // waits first: kernels/pdl.cuh), so the cluster kernel reads them before its launch-overlap wait.
  int stable_prefix = 0;
  int release_first = 0;  // the cluster kernel: the next launch released first (kernels/pdl.cuh)
  // The cluster kernel under the async exchange only (session 70): 1 where the grid has at most
  // two splits, launched as clusters of (4, max_splits): the blocks of a query's two splits form
  // one cluster, the second split's blocks push their partials, m and l into the first's, which
  // merge them with the merge kernel's arithmetic (the same bits), and length-0 queries get
  // their zeros here too: every output is written, and no merge launch follows.
  int pair_merge = 0;
  // Under the pair merge, where the blocks release the next launch (the value GEMM, whose 256
  // blocks stage their weights before their wait; the merge launch's 16 blocks were small):
  // 0 after the launch-overlap wait (pdl_begin's place), 1 before phase 2, 2 before the
  // epilogue, 3 at their end (ATLAS_MLA_PAIR_RELEASE; the bits cannot change: kernels/pdl.cuh).
  int pair_release = 0;
  // The cluster kernel's clocked instantiation only (ATLAS_PHASE_CLOCKS=attention,
  // kernels/phase_clock.cuh): the sums of its phases' clocks.
  unsigned long long* phase_clocks = nullptr;
};

// Shared memory: Q [16G][wp+8], C [NST][64][wp+8] (bf16), S [16G][68] fp32, P [16G][72] bf16,
// alpha [16G], l [16G]. Rows of wp+8 elements are 16-byte multiples of 4 mod 8 words, so the
// 8 rows of one ldmatrix phase hit 8 distinct groups of 4 banks (no conflicts).
// NST = 2 double-buffers the cache tiles (the next tile's copies overlap this tile's work: one
// block per SM at width 576, ~175 KB); NST = 1 loads each tile after the previous one is done
// (~100 KB: two blocks per SM, each overlapping the other's copies). The same tiles in the same
// order either way, so the same bits; the launcher picks by the number of blocks.
__host__ __device__ constexpr int mla_tc_smem_bytes(int G, int wp, int nst = 2) {
  return 2 * (16 * G) * (wp + 8) + 2 * nst * kMlaTile * (wp + 8) + 4 * (16 * G) * kMlaSStride +
         2 * (16 * G) * kMlaPStride + 4 * 2 * (16 * G);
}

__device__ __forceinline__ void ldsm_x4(uint32_t (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_u32(p))
               : "memory");
}
__device__ __forceinline__ void ldsm_x4_trans(uint32_t (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_u32(p))
               : "memory");
}
__device__ __forceinline__ void ldsm_x2(uint32_t (&r)[2], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0,%1}, [%2];\n"
               : "=r"(r[0]), "=r"(r[1])
               : "r"(smem_u32(p))
               : "memory");
}

// d += a . b, m16n8k16, bf16 inputs, fp32 accumulators. Fragment layout (PTX ISA): with
// g = lane/4, c = lane%4: a = {A[g][2c..], A[g+8][2c..], A[g][2c+8..], A[g+8][2c+8..]},
// b = {B[2c..][g], B[2c+8..][g]}, d = {D[g][2c], D[g][2c+1], D[g+8][2c], D[g+8][2c+1]}.
__device__ __forceinline__ void mma_bf16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Rows [0, n_rows) x 16-byte chunks [0, cpr) of cache rows into shared memory (row stride ldd
// elements) by cp.async: row r from src + r * sstride; rows >= live are zero-filled (finite
// values that meet P = 0). (r, c) advance by a fixed step instead of a division per chunk: the
// copies' address arithmetic was most of a batch-1 tile's instructions.
// skip >= 0: that row is left out (the cluster kernel copies a decode step's fresh slot after
// its launch-overlap wait, mla_copy_row).
__device__ __forceinline__ void mla_copy_tile(uint16_t* dst, int ldd, const uint16_t* src, int64_t sstride, int n_rows,
                                              int live, int cpr, int tid, int skip = -1) {
  const int n_chunks = n_rows * cpr, dr = kMlaTcThreads / cpr, dc = kMlaTcThreads % cpr;
  int r = tid / cpr, c = tid % cpr;
  for (int i = tid; i < n_chunks; i += kMlaTcThreads) {
    const bool ok = r < live;
    if (r != skip) cp_async16(dst + r * ldd + 8 * c, ok ? src + r * sstride + 8 * c : src, ok ? 16 : 0);
    r += dr;
    c += dc;
    if (c >= cpr) {
      c -= cpr;
      ++r;
    }
  }
}

// Row r (a live one) of a tile, as mla_copy_tile copies it.
__device__ __forceinline__ void mla_copy_row(uint16_t* dst, int ldd, const uint16_t* src, int64_t sstride, int r,
                                             int cpr, int tid) {
  for (int c = tid; c < cpr; c += kMlaTcThreads) cp_async16(dst + r * ldd + 8 * c, src + r * sstride + 8 * c, 16);
}

// Phase 1 of one warp: S[16 rows of query slot qg][8G slots from tok] = scale * Q . C^T over
// the wp / 16 k steps in ascending order (one accumulator per n8 tile), written to Ss. Both
// kernels run exactly this, so a score has the same bits whichever kernel computed it.
template <int G>
__device__ __forceinline__ void mla_scores(const uint16_t* Qs, const uint16_t* C, int ldq, int wp, int qg, int tok,
                                           int lane, float scale, float* Ss) {
  float sacc[G][4];
#pragma unroll
  for (int n = 0; n < G; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e) sacc[n][e] = 0.0f;
  const uint16_t* qa = Qs + (qg * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * ldq + (lane >> 4) * 8;
#pragma unroll 4
  for (int k0 = 0; k0 < wp; k0 += 16) {
    uint32_t a[4];
    ldsm_x4(a, qa + k0);
    if constexpr (G == 1) {
      uint32_t b[2];
      ldsm_x2(b, C + (tok + (lane & 7)) * ldq + k0 + ((lane >> 3) & 1) * 8);
      mma_bf16(sacc[0], a, b[0], b[1]);
    } else {
#pragma unroll
      for (int np = 0; np < G / 2; ++np) {
        uint32_t b[4];
        ldsm_x4(b, C + (tok + np * 16 + (lane & 7) + (lane >> 4) * 8) * ldq + k0 + ((lane >> 3) & 1) * 8);
        mma_bf16(sacc[2 * np], a, b[0], b[1]);
        mma_bf16(sacc[2 * np + 1], a, b[2], b[3]);
      }
    }
  }
  const int r = qg * 16 + (lane >> 2);
#pragma unroll
  for (int n = 0; n < G; ++n) {
    const int c = tok + n * 8 + 2 * (lane & 3);
    *reinterpret_cast<float2*>(Ss + r * kMlaSStride + c) = make_float2(sacc[n][0] * scale, sacc[n][1] * scale);
    *reinterpret_cast<float2*>(Ss + (r + 8) * kMlaSStride + c) = make_float2(sacc[n][2] * scale, sacc[n][3] * scale);
  }
}

// Online softmax, first half, in the 4 threads (quarters q = 0..3, consecutive lanes) of one MMA
// row: the row's scores s[16] of quarter q of the tile, and the tile's row max over the nv
// valid slots (-inf if none), the same in all 4 threads.
__device__ __forceinline__ float mla_row_max(const float* srow, int q, int nv, float (&s)[16]) {
#pragma unroll
  for (int i = 0; i < 16; i += 4) {
    const float4 v = *reinterpret_cast<const float4*>(srow + q * 16 + i);
    s[i] = v.x;
    s[i + 1] = v.y;
    s[i + 2] = v.z;
    s[i + 3] = v.w;
  }
  float mx = -INFINITY;  // (fmaxf with -inf for an invalid slot: a select, not a branch per slot)
#pragma unroll
  for (int i = 0; i < 16; ++i) mx = fmaxf(mx, q * 16 + i < nv ? s[i] : -INFINITY);
  mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
  return fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
}

// Second half: p = bf16(expf(s - m_use)) into the quarter's 16 columns of the P row, and the
// tile sum (q0 + q1) + (q2 + q3) of the rounded p (sequential within a quarter), the same in
// all 4 threads.
__device__ __forceinline__ float mla_row_p(const float (&s)[16], int q, int nv, float m_use, uint16_t* prow_q) {
  float sum = 0.0f;
  uint32_t packed[8];
#pragma unroll
  for (int i = 0; i < 16; i += 2) {
    // An invalid slot's exp is expf(-inf) = +0, whose bf16 is the 0 it had (its s may be
    // anything, stale shared memory included, and never reaches p): every exp is computed, with
    // no branch per slot, so the 16 interleave (session 36: the decode step's softmax and P
    // exchange went from ~2,900 to ~2,200 cycles, phase clocks, ATLAS_PHASE_CLOCKS).
    const uint16_t b0 = f2bf(expf(q * 16 + i < nv ? s[i] - m_use : -INFINITY));
    const uint16_t b1 = f2bf(expf(q * 16 + i + 1 < nv ? s[i + 1] - m_use : -INFINITY));
    sum += bf2f(b0);
    sum += bf2f(b1);
    packed[i / 2] = uint32_t(b0) | (uint32_t(b1) << 16);
  }
  uint4* prow = reinterpret_cast<uint4*>(prow_q);
  prow[0] = make_uint4(packed[0], packed[1], packed[2], packed[3]);
  prow[1] = make_uint4(packed[4], packed[5], packed[6], packed[7]);
  sum += __shfl_xor_sync(0xffffffffu, sum, 1);  // (q0 + q1), (q2 + q3)
  sum += __shfl_xor_sync(0xffffffffu, sum, 2);  // (q0 + q1) + (q2 + q3)
  return sum;
}

// The epilogue's store of latent columns d, d + 1 of query qi, head h (both kernels): bf16(v / l)
// into the output when the query has one split (direct), else the fp32 partials into the merge's
// workspace.
__device__ __forceinline__ void mla_store_pair(const MlaTcParams& p, int qi, int split, int h, int d, float v0,
                                               float v1, float l, bool direct) {
  if (direct) {
    uint16_t* dst = p.out + (int64_t(qi) * p.heads + h) * p.latent + d;
    if (d < p.latent) dst[0] = f2bf_out(v0 / l);
    if (d + 1 < p.latent) dst[1] = f2bf_out(v1 / l);
  } else {
    float* dst = p.ws_acc + ((int64_t(qi) * p.max_splits + split) * p.heads + h) * kMlaAccStride + d;
    if (d + 1 < p.latent)
      *reinterpret_cast<float2*>(dst) = make_float2(v0, v1);
    else if (d < p.latent)
      dst[0] = v0;
  }
}

// kVec: width % 8 == 0 and 16-byte aligned q / cache rows (the host checks): 16-byte cp.async
// loads. Otherwise element loads (slower; the same values land in shared memory, so the same
// bits come out; tested).
template <int G, bool kVec, int NST>
__global__ void __launch_bounds__(kMlaTcThreads, NST == 1 && G <= 2 ? 2 : 1) mla_tc_kernel(const MlaTcParams p) {
  static_assert(NST == 1 || NST == 2, "one or two cache tile buffers");
  static_assert(G == 1 || G == 2 || (G == 4 && NST == 1), "1, 2 or 4 queries per block (4: one tile buffer)");
  pdl_begin();
  constexpr int R = 16 * G;  // MMA rows: G queries x 16 (padded) heads
  extern __shared__ __align__(16) unsigned char smem_raw[];
  __shared__ int s_len[G];       // query length, -1 for no query / bad length
  __shared__ int64_t s_crow[G];  // cache row
  __shared__ int s_qi[G];

  const int ldq = p.wp + 8;  // elements; (wp + 8) / 2 words = 4 mod 8 since wp % 16 == 0
  uint16_t* Qs = reinterpret_cast<uint16_t*>(smem_raw);
  uint16_t* Cs = Qs + R * ldq;
  float* Ss = reinterpret_cast<float*>(Cs + NST * kMlaTile * ldq);
  uint16_t* Ps = reinterpret_cast<uint16_t*>(Ss + R * kMlaSStride);
  float* alpha_s = reinterpret_cast<float*>(Ps + R * kMlaPStride);
  float* l_s = alpha_s + R;

  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int split = blockIdx.y;
  const int j0 = split * p.S;  // first slot of this split (anchored at slot 0)

  if (tid < G) {
    const int qi = blockIdx.x * G + tid;
    int len = -1;
    int64_t crow = -1;
    if (qi < p.rows) {
      len = p.lengths[qi];
      if (len < 0 || len > p.max_length) {
        if (split == 0) atomicOr(p.error_flag, 4);
        len = -1;
      } else {
        crow = p.cache_rows ? p.cache_rows[qi] : qi;
      }
    }
    s_len[tid] = len;
    s_crow[tid] = crow;
    s_qi[tid] = qi;
  }
  __syncthreads();
  bool any = false;
#pragma unroll
  for (int g = 0; g < G; ++g) any |= s_len[g] > j0;
  if (!any) return;  // block-uniform: no query of this block has a slot in this split

  // Q rows (zeros for padded heads, missing queries and the k pad [width, wp)).
  {
    const int width = p.width;
    if constexpr (kVec) {
      const int cpr = p.wp / 8;  // 16-byte chunks per Q row
      for (int i = tid; i < R * cpr; i += kMlaTcThreads) {
        const int r = i / cpr, c = (i % cpr) * 8, g = r >> 4, h = r & 15;
        uint4 v = make_uint4(0, 0, 0, 0);
        if (s_len[g] > 0 && h < p.heads && c < width)
          v = *reinterpret_cast<const uint4*>(p.q + (int64_t(s_qi[g]) * p.heads + h) * width + c);
        *reinterpret_cast<uint4*>(Qs + r * ldq + c) = v;
      }
    } else {
      for (int i = tid; i < R * p.wp; i += kMlaTcThreads) {
        const int r = i / p.wp, c = i % p.wp, g = r >> 4, h = r & 15;
        uint16_t v = 0;
        if (s_len[g] > 0 && h < p.heads && c < width) v = p.q[(int64_t(s_qi[g]) * p.heads + h) * width + c];
        Qs[r * ldq + c] = v;
      }
    }
    // The k pad of the cache stages: never written by the tile loads, read by phase 1.
    const int pad = p.wp - width;
    for (int i = tid; i < NST * kMlaTile * pad; i += kMlaTcThreads)
      Cs[(i / pad) * ldq + width + i % pad] = 0;
  }
  // (made visible by the first barrier of the tile loop)

  // Fixed roles.
  constexpr int kWarpsPerQuery = 8 / G;
  const int p1_g = warp / kWarpsPerQuery;               // phase 1: query slot of this warp
  const int p1_tok = (warp % kWarpsPerQuery) * 8 * G;  // phase 1: first slot (in the tile) of its G n-tiles
  const int d0 = 64 * warp;                            // phase 2: first latent column of this warp
  const int dcols = (p.latent + 7) & ~7;               // latent columns the MMAs cover
  const int sm_row = tid >> 2, sm_q = tid & 3;         // softmax: MMA row and quarter of the tile
  const int sm_g = sm_row >> 4;

  for (int g0 = 0; g0 < G;) {
    // A run: consecutive slots of this block that read the same cache row.
    int g1 = g0 + 1;
    while (g1 < G && s_crow[g1] == s_crow[g0]) ++g1;
    int run_end = j0;  // end slot of this split for the run (max over its queries)
#pragma unroll
    for (int g = 0; g < G; ++g)
      if (g >= g0 && g < g1 && s_len[g] > j0) run_end = max(run_end, min(s_len[g], j0 + p.S));
    const int run_g0 = g0, run_g1 = g1;
    g0 = g1;
    if (run_end <= j0) continue;  // block-uniform
    auto in_run = [&](int g) { return g >= run_g0 && g < run_g1 && s_len[g] > j0; };
    const uint16_t* cbase = p.cache + s_crow[run_g0] * p.cache_row_stride;
    const int ntiles = (run_end - j0 + kMlaTile - 1) / kMlaTile;

    auto load_tile = [&](int t) {
      uint16_t* dst = Cs + (t % NST) * kMlaTile * ldq;
      const int t0 = j0 + t * kMlaTile;
      const int n_load = min(kMlaTile, run_end - t0);
      const uint16_t* src = cbase + int64_t(t0) * p.width;
      if constexpr (kVec) {
        mla_copy_tile(dst, ldq, src, p.width, kMlaTile, n_load, p.width / 8, tid);
      } else {
        for (int i = tid; i < kMlaTile * p.width; i += kMlaTcThreads) {
          const int r = i / p.width, c = i % p.width;
          dst[r * ldq + c] = r < n_load ? src[int64_t(r) * p.width + c] : uint16_t(0);
        }
      }
      cp_async_commit();
    };

    // Per-run state: softmax rows (m, l) in the 4 threads of each row; O in registers.
    float m_run = -INFINITY, l_run = 0.0f;
    float o[G][8][4];
#pragma unroll
    for (int g = 0; g < G; ++g)
#pragma unroll
      for (int nt = 0; nt < 8; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) o[g][nt][e] = 0.0f;

    load_tile(0);
    for (int t = 0; t < ntiles; ++t) {
      const int t0 = j0 + t * kMlaTile;
      const int n_load = min(kMlaTile, run_end - t0);
      if constexpr (NST == 2) {
        if (t + 1 < ntiles) {
          load_tile(t + 1);  // overwrites the stage read in tile t-1 (barrier at the end of t-1)
          cp_async_wait<1>();
        } else {
          cp_async_wait<0>();
        }
      } else {
        if (t > 0) load_tile(t);  // the one stage, free since the barrier at the end of t-1
        cp_async_wait<0>();
      }
      __syncthreads();
      const uint16_t* C = Cs + (t % NST) * kMlaTile * ldq;

      // ---- phase 1: S = scale * Q . C^T for this warp's query and 8G slots ----
      if (in_run(p1_g) && p1_tok < n_load) mla_scores<G>(Qs, C, ldq, p.wp, p1_g, p1_tok, lane, p.scale, Ss);
      __syncthreads();

      // ---- online softmax: 4 threads per MMA row (warp-uniform branch: a warp = 8 rows of one query) ----
      if (tid < 4 * R && in_run(sm_g)) {
        const int nv = max(0, min(kMlaTile, min(s_len[sm_g], j0 + p.S) - t0));  // this query's valid slots
        float s[16];
        const float mx = mla_row_max(Ss + sm_row * kMlaSStride, sm_q, nv, s);
        const float m_new = fmaxf(m_run, mx);
        const float m_use = m_new == -INFINITY ? 0.0f : m_new;  // no key seen yet: avoid inf - inf
        const float sum = mla_row_p(s, sm_q, nv, m_use, Ps + sm_row * kMlaPStride + sm_q * 16);
        const float alpha = expf(m_run - m_use);      // 0 on the first tile, 1 if the max did not move
        l_run = __fmaf_rn(l_run, alpha, sum);
        m_run = m_new;
        if (sm_q == 0) alpha_s[sm_row] = alpha;
      }
      __syncthreads();

      // ---- phase 2: O = O * alpha + P . C[:, d0 .. d0+64) ----
      if (d0 < dcols) {
#pragma unroll
        for (int g = 0; g < G; ++g) {
          if (!in_run(g)) continue;
          const float a_lo = alpha_s[g * 16 + (lane >> 2)], a_hi = alpha_s[g * 16 + (lane >> 2) + 8];
#pragma unroll
          for (int nt = 0; nt < 8; ++nt) {
            o[g][nt][0] *= a_lo;
            o[g][nt][1] *= a_lo;
            o[g][nt][2] *= a_hi;
            o[g][nt][3] *= a_hi;
          }
        }
        const int ksteps = (n_load + 15) / 16;  // slots past n_load: P = 0 for every query
        for (int ks = 0; ks < ksteps; ++ks) {
          uint32_t b[4][4];
#pragma unroll
          for (int np = 0; np < 4; ++np)
            if (d0 + np * 16 < dcols)
              ldsm_x4_trans(b[np], C + (ks * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * ldq + d0 + np * 16 +
                                       (lane >> 4) * 8);
#pragma unroll
          for (int g = 0; g < G; ++g) {
            if (!in_run(g)) continue;
            uint32_t a[4];
            ldsm_x4(a, Ps + (g * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * kMlaPStride + ks * 16 + (lane >> 4) * 8);
#pragma unroll
            for (int nt = 0; nt < 8; ++nt)
              if (d0 + nt * 8 < dcols) mma_bf16(o[g][nt], a, b[nt / 2][(nt & 1) * 2], b[nt / 2][(nt & 1) * 2 + 1]);
          }
        }
      }
      __syncthreads();  // stage t % NST, S, P and alpha are reused by tile t + 1
    }

    // ---- epilogue: one split -> the output directly; several -> the workspace for the merge ----
    if (tid < 4 * R && sm_q == 0) l_s[sm_row] = l_run;
    if (tid < 4 * R && sm_q == 0 && in_run(sm_g) && (sm_row & 15) < p.heads && s_len[sm_g] > p.S) {
      const int64_t base = ((int64_t(s_qi[sm_g]) * p.max_splits + split) * p.heads + (sm_row & 15)) * 2;
      p.ws_ml[base] = m_run;
      p.ws_ml[base + 1] = l_run;
    }
    __syncthreads();
    if (d0 < dcols) {
#pragma unroll
      for (int g = 0; g < G; ++g) {
        if (!in_run(g)) continue;
        const bool direct = s_len[g] <= p.S;  // the query has exactly one split
        const int qi = s_qi[g];
#pragma unroll
        for (int half = 0; half < 2; ++half) {
          const int h = (lane >> 2) + half * 8;
          if (h >= p.heads) continue;
          const float l = l_s[g * 16 + h];
#pragma unroll
          for (int nt = 0; nt < 8; ++nt) {
            const int d = d0 + nt * 8 + 2 * (lane & 3);
            mla_store_pair(p, qi, split, h, d, o[g][nt][half * 2], o[g][nt][half * 2 + 1], l, direct);
          }
        }
      }
    }
    __syncthreads();  // l_s and the stages are reused by the next run
  }
}

// ---- tile-parallel split: one query per cluster of kMlaClusterTiles blocks (sm_90) ----------
// The kernel above walks a split's tiles in one block: at batch 1 that is one block per split,
// bound by its own instruction latency (Nsight, session 9: 24 us on 2 SMs for a 512-slot
// decode). Here the S / 64 = 4 blocks of a cluster share one (query, split) and compute the
// same numbers with the work spread out:
//   * block r runs phase 1 for tile r only (mla_scores, the same k order: the same scores) and
//     its tile's row max;
//   * once the row maxima of tiles < r are in (distributed shared memory: kX below says how),
//     each block has the running max m_{r-1} and m_r = fmaxf(m_{r-1}, max_r) exactly as the
//     sequential walk has them, and computes its tile's P, tile sum and alpha = expf(m_{r-1} -
//     m_use) (mla_row_p, the same formulas);
//   * once every tile's P, alpha and sum are in every block, each block chains
//     l = fmaf(l, alpha_t, sum_t) over t ascending (the walk's l), and runs phase 2 for latent
//     columns [128 r, 128 r + 128) over all tiles in ascending order: o = o * alpha_t, then the
//     tile's k steps through the same mma.sync as the walk; a column's chain depends only on P,
//     alpha and that column of the cache, so every output has the walk's bits;
//   * the epilogue is the walk's (direct output for one split, else the workspace for the merge
//     kernel, m and l from rank 0), or under MlaTcParams::pair_merge the merge itself: block r
//     of the second split pushes its phase-2 accumulators (thread for thread: the same (head,
//     column) pairs) into block r of the first, its rank 0 the split's m and l into all four,
//     and the first split's blocks merge (mla_merge_item's formula for two splits) and store.
// Per block: the query, its own full-width tile (phase 1) and a 128-column latent slice of every
// tile of the split (phase 2), ~173 KB of shared memory. Decode only (one query per block row,
// 16-byte loads), split_tokens = 256, latent <= 512; the launcher picks it where the walk would
// leave most SMs idle. Tested bit for bit against the walk (tests/cuda/test_cuda_mla.cpp).
constexpr int kMlaClusterTiles = 4;                                    // blocks per cluster = tiles per split
constexpr int kMlaClusterCols = kMlaAccStride / kMlaClusterTiles;       // latent columns per block (phase 2)
constexpr int kMlaSliceStride = kMlaClusterCols + 8;                   // 272-byte rows: conflict-free ldmatrix
// The pair merge's receiving area (MlaTcParams::pair_merge): the split's m [16], the other
// split's (m, l) [16][2], its accumulators [threads][8] and one mbarrier.
constexpr int kMlaPairBytes = 4 * 16 + 4 * 32 + 4 * kMlaTcThreads * 8 + 8;
__host__ __device__ constexpr int mla_tc_cluster_smem_bytes(int wp, bool pair = false) {
  return 2 * 16 * (wp + 8) + 2 * kMlaTile * (wp + 8) + 2 * kMlaClusterTiles * kMlaTile * kMlaSliceStride +
         4 * 16 * kMlaSStride + 2 * kMlaClusterTiles * 16 * kMlaPStride + 4 * 3 * kMlaClusterTiles * 16 + 4 * 16 +
         2 * 8 +  // + the two mbarriers of the st.async exchange (8-byte aligned: every part is)
         (pair ? kMlaPairBytes : 0);
}

// 1 where this binary's device code has the cluster kernel (sm_90 or later), else 0.
__global__ void mla_tc_cluster_probe_kernel(int* out) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  *out = 1;
#else
  *out = 0;
#endif
}

// Grid (rows * kMlaClusterTiles, max_splits), clusters of (kMlaClusterTiles, 1, 1), or of
// (kMlaClusterTiles, max_splits, 1) under p.pair_merge (at most two splits, async exchange).
// kClocks: the diagnostic instantiation (ATLAS_PHASE_CLOCKS=attention): the same work, with
// thread 0's clock marks (mark(i) below; mla.cu names the phases between them) added to p.phase_clocks.
constexpr int kMlaClusterMarks = 10;
// kX: how the blocks exchange the row maxima and P (the same values either way, so the same
// bits; ATLAS_MLA_EXCHANGE, MlaDecodeArgs::cluster_exchange; async is the default since session
// 36: batch-1 decode 478.7 against 471.4 tok/s with pull, 474.0 / 471.0 / 465.1 for async /
// push / pull before the softmax lost its branches, runs s36-2 and s36-3):
//   kMlaXPull:  each block reads the others' maxima after cluster barrier 1 and copies their P,
//               alphas and sums after barrier 2, then barrier 3 (no block leaves while read);
//   kMlaXPush:  each block writes its maxima, P, alphas and sums into the others' shared memory
//               before barriers 1 and 2; no third barrier;
//   kMlaXAsync: as push, by st.async counted on each receiver's mbarriers (kernels/dsmem.cuh):
//               no cluster barrier on the way (one at the start, before the launch-overlap
//               wait, makes the mbarriers' init visible).
constexpr int kMlaXPull = 1, kMlaXPush = 2, kMlaXAsync = 3;
template <bool kClocks = false, int kX = kMlaXPull>
__global__ void __launch_bounds__(kMlaTcThreads, 1) mla_tc_cluster_kernel(const MlaTcParams p) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  namespace cg = cooperative_groups;
  PhaseClock<kMlaClusterMarks> clk;
  const auto mark = [&](int i) {
    if constexpr (kClocks) clk.mark(i);
  };
  mark(0);
  // p.stable_prefix (a decode step): everything up to the copies of the slots before the
  // query's newest one runs before the launch-overlap wait (the lengths, the cache rows and
  // those slots were written before the kernel this one follows: MlaTcParams), the newest slot
  // and the query after it. The same rows land in the same places: the same bits.
  const bool early = p.stable_prefix != 0, rf = p.release_first != 0;
  const bool pair = kX == kMlaXAsync && p.pair_merge != 0;
  // The release: first (rf), after the wait, or (the pair merge) later, at rel below; `no_release`
  // where the wait does not release.
  const int rel = pair && !rf ? p.pair_release : 0;
  const bool no_release = rf || rel != 0;
  pdl_release_if(rf);
  if (!early) pdl_wait_after(no_release);
  constexpr int T = kMlaClusterTiles;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  const int ldq = p.wp + 8;
  uint16_t* Qs = reinterpret_cast<uint16_t*>(smem_raw);     // [16][ldq]
  uint16_t* Ct = Qs + 16 * ldq;                              // [64][ldq]: this block's tile
  uint16_t* Cl = Ct + kMlaTile * ldq;                        // [T][64][kMlaSliceStride]: latent slices
  float* Ss = reinterpret_cast<float*>(Cl + T * kMlaTile * kMlaSliceStride);  // [16][kMlaSStride]
  uint16_t* Pa = reinterpret_cast<uint16_t*>(Ss + 16 * kMlaSStride);          // [T][16][kMlaPStride]
  float* mx_a = reinterpret_cast<float*>(Pa + T * 16 * kMlaPStride);          // [T][16] tile row maxima
  float* al_a = mx_a + T * 16;                                                // [T][16] alpha
  float* su_a = al_a + T * 16;                                                // [T][16] tile sums
  float* l_s = su_a + T * 16;                                                 // [16]
  uint64_t* mbars = reinterpret_cast<uint64_t*>(l_s + 16);                    // [2] (kMlaXAsync)
  const uint32_t mbar0 = smem_u32(mbars), mbar1 = smem_u32(mbars + 1);
  // The pair merge's area (kMlaPairBytes; 16-byte aligned: every part before it is a multiple).
  float* m_s = reinterpret_cast<float*>(mbars + 2);  // [16] this split's m
  float* x_ml = m_s + 16;                            // [16][2] the second split's (m, l)
  float* x_acc = x_ml + 32;                          // [threads][8] its accumulators
  const uint32_t mbar2 = smem_u32(x_acc + kMlaTcThreads * 8);

  const cg::cluster_group cluster = cg::this_cluster();
  // Under the pair merge a cluster is (T, 2): the blocks of split 1 have ranks T .. 2T - 1, and
  // rbase + t is the rank of tile t's block of this block's own split.
  const int crank = int(cluster.block_rank()), rank = crank % T, rbase = crank - rank;
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int qi = int(blockIdx.x) / T, split = blockIdx.y, j0 = split * p.S;

  // Every block of the cluster reads the same length, so all of them leave here or none.
  const int len = p.lengths[qi];
  if (len < 0 || len > p.max_length) {
    if (early) pdl_wait_after(no_release);  // (a block that ends has released)
    if (split == 0 && rank == 0 && tid == 0) atomicOr(p.error_flag, 4);
    return;
  }
  const int c0 = rank * kMlaClusterCols;                 // this block's latent columns (phase 2)
  if (len <= j0) {  // no slot of this split
    if (early) pdl_wait_after(no_release);
    if (pair) {
      // A query that sees no key gets zeros (the merge kernel's rule), written here since no
      // merge follows; and the blocks of a split past the query's length arrive on the cluster
      // barrier the other split's blocks wait on before their first remote store.
      if (len == 0 && split == 0)
        for (int i = tid; i < p.heads * kMlaClusterCols; i += kMlaTcThreads) {
          const int h = i / kMlaClusterCols, d = c0 + i % kMlaClusterCols;
          if (d < p.latent) p.out[(int64_t(qi) * p.heads + h) * p.latent + d] = 0;
        }
      cluster_arrive_relaxed();
      cluster_wait();
    }
    return;
  }
  const int send = min(len, j0 + p.S);  // end slot of the split
  const int ntiles = (send - j0 + kMlaTile - 1) / kMlaTile;
  const int64_t crow = p.cache_rows ? p.cache_rows[qi] : qi;
  const uint16_t* cbase = p.cache + crow * p.cache_row_stride;
  const int dcols = (p.latent + 7) & ~7;                 // latent columns the MMAs cover (<= width)
  const int slice_cpr = max(0, min(kMlaClusterCols, dcols - c0)) / 8;
  // The pair merge: this block receives the second split's partials (the first split of a
  // query with two) or sends its own (the second split). Warps with d0 < dcols hold columns.
  const bool pair_recv = pair && split == 0 && len > p.S, pair_send = pair && split == 1;
  if constexpr (kX == kMlaXAsync) {
    // The bytes this block receives: barrier 0 the row maxima (64 bytes from each other tile,
    // where this block runs a softmax), barrier 1 each other tile's P rows (64 threads x 32
    // bytes), alphas and sums (16 x 8 bytes). A count the stores may reach before the expect:
    // the phase also waits for this one arrival.
    if (tid == 0) {
      const uint32_t others = uint32_t(ntiles - (rank < ntiles ? 1 : 0));
      mbar_init(mbar0, 1);
      mbar_init(mbar1, 1);
      mbar_arrive_expect_tx(mbar0, rank < ntiles ? others * 16 * 4 : 0);
      mbar_arrive_expect_tx(mbar1, others * (64 * 32 + 16 * 8));
      if (pair_recv) {
        // 32 bytes from each thread of the partner's warps that hold columns, and (m, l) of 16
        // rows from the partner split's rank 0.
        const uint32_t col_warps = uint32_t(min(kMlaTcThreads / 32, max(0, (dcols - c0 + 15) / 16)));
        mbar_init(mbar2, 1);
        mbar_arrive_expect_tx(mbar2, col_warps * 32 * 32 + 16 * 8);
      }
      fence_mbarrier_init();
    }
  }
  // Push and async write into the other blocks before any cluster barrier of the exchange: this
  // one (its wait after phase 1, long after every block of the cluster has started) makes sure
  // each has, and under async that its mbarriers are initialised.
  if constexpr (kX != kMlaXPull) cluster_arrive_relaxed();

  // Copies: group 0 = the query (zeros for padded heads and the k pad) and this block's tile;
  // group 1 = the latent slices of every tile (needed only after the softmax). Early (a decode
  // step): group 0 = the tile and group 1 = the slices without the newest slot (len - 1), before
  // the wait; group 2 = the query and the newest slot's rows after it.
  {
    const int fresh = early ? len - 1 : -1;  // slot copied after the wait (early only)
    const auto fresh_row = [&](int t) { return fresh - (j0 + t * kMlaTile); };  // its row in tile t
    const int pad = p.wp - p.width;  // the k pad of the tile: never copied, read by phase 1
    for (int i = tid; i < kMlaTile * pad; i += kMlaTcThreads) Ct[(i / pad) * ldq + p.width + i % pad] = 0;
    const auto copy_query = [&] {
      const int cpr = p.wp / 8;
      const uint16_t* qrow = p.q + int64_t(qi) * p.heads * p.width;
      for (int i = tid; i < 16 * cpr; i += kMlaTcThreads) {
        const int h = i / cpr, c = (i % cpr) * 8;
        const bool ok = h < p.heads && c < p.width;
        cp_async16(Qs + h * ldq + c, ok ? qrow + h * p.width + c : qrow, ok ? 16 : 0);
      }
    };
    if (!early) copy_query();
    if (rank < ntiles) {
      const int t0 = j0 + rank * kMlaTile;
      mla_copy_tile(Ct, ldq, cbase + int64_t(t0) * p.width, p.width, kMlaTile, min(kMlaTile, send - t0), p.width / 8,
                    tid, early ? fresh_row(rank) : -1);
    }
    cp_async_commit();
    for (int t = 0; t < ntiles && slice_cpr > 0; ++t) {
      const int t0 = j0 + t * kMlaTile;
      mla_copy_tile(Cl + t * kMlaTile * kMlaSliceStride, kMlaSliceStride, cbase + int64_t(t0) * p.width + c0, p.width,
                    kMlaTile, min(kMlaTile, send - t0), slice_cpr, tid, early ? fresh_row(t) : -1);
    }
    cp_async_commit();
    mark(1);
    if (early) {
      pdl_wait_after(no_release);
      mark(2);
      copy_query();
      const int ft = (fresh - j0) / kMlaTile;  // the newest slot's tile, if in this split
      if (fresh >= j0 && fresh < send) {
        const int64_t t0 = j0 + int64_t(ft) * kMlaTile;
        if (ft == rank) mla_copy_row(Ct, ldq, cbase + t0 * p.width, p.width, fresh_row(ft), p.width / 8, tid);
        if (slice_cpr > 0)
          mla_copy_row(Cl + ft * kMlaTile * kMlaSliceStride, kMlaSliceStride, cbase + t0 * p.width + c0, p.width,
                       fresh_row(ft), slice_cpr, tid);
      }
      cp_async_commit();
    }
  }

  // ---- phase 1 and the tile's row maxima (block r: tile r) ----
  const int sm_row = tid >> 2, sm_q = tid & 3;  // softmax: 4 threads per MMA row (tid < 64)
  const int my_t0 = j0 + rank * kMlaTile;
  const int my_nv = rank < ntiles ? min(kMlaTile, send - my_t0) : 0;
  float s[16];
  if (!early) mark(2);
  if (early)
    cp_async_wait<0>();  // the query came last
  else
    cp_async_wait<1>();
  __syncthreads();
  mark(3);
  if (rank < ntiles && warp * 8 < my_nv) mla_scores<1>(Qs, Ct, ldq, p.wp, 0, warp * 8, lane, p.scale, Ss);
  __syncthreads();
  mark(4);
  // The tile's row maxima to the blocks (pull: the others read them after barrier 1; push:
  // written into every block; async: st.async into the blocks that run a softmax, counted on
  // their barrier 0).
  if constexpr (kX != kMlaXPull) cluster_wait();  // every block has started (and initialised its barriers)
  float mx = -INFINITY;
  if (tid < 64 && rank < ntiles) {
    mx = mla_row_max(Ss + sm_row * kMlaSStride, sm_q, my_nv, s);
    float* mine = mx_a + rank * 16 + sm_row;
    if (sm_q == 0) {
      *mine = mx;
      if constexpr (kX == kMlaXPush) {
        for (int t = 0; t < T; ++t)
          if (t != rank) *cluster.map_shared_rank(mine, rbase + t) = mx;
      } else if constexpr (kX == kMlaXAsync) {
        for (int t = 0; t < ntiles; ++t)
          if (t != rank) st_async_f32(dsmem_addr(smem_u32(mine), rbase + t), mx, dsmem_addr(mbar0, rbase + t));
      }
    }
  }
  if constexpr (kX == kMlaXAsync) {
    if (tid < 64 && rank < ntiles) mbar_wait_cluster(mbar0, 0);
  } else {
    cluster.sync();  // every tile's row maxima are visible to the cluster
  }
  mark(5);

  // ---- softmax of tile r with the running max of tiles < r ----
  if (tid < 64 && rank < ntiles) {
    float m_run = -INFINITY;
    if constexpr (kX == kMlaXPull) {
      for (int t = 0; t < rank; ++t) m_run = fmaxf(m_run, *cluster.map_shared_rank(mx_a + t * 16 + sm_row, rbase + t));
    } else {
      for (int t = 0; t < rank; ++t) m_run = fmaxf(m_run, mx_a[t * 16 + sm_row]);
    }
    const float m_new = fmaxf(m_run, mx);
    const float m_use = m_new == -INFINITY ? 0.0f : m_new;  // no key seen yet: avoid inf - inf
    uint16_t* prow = Pa + (rank * 16 + sm_row) * kMlaPStride + sm_q * 16;
    const float sum = mla_row_p(s, sm_q, my_nv, m_use, prow);
    const float alpha = expf(m_run - m_use);  // 0 on the split's first tile
    float* al = al_a + rank * 16 + sm_row;
    float* su = su_a + rank * 16 + sm_row;
    if (sm_q == 0) {
      *al = alpha;
      *su = sum;
    }
    if constexpr (kX != kMlaXPull) {
      // This thread's 16 P values (two 16-byte pieces) and, in the row's first thread, its
      // alpha and sum into every other block: each block runs phase 2 over every tile.
      const uint4 v0 = reinterpret_cast<const uint4*>(prow)[0], v1 = reinterpret_cast<const uint4*>(prow)[1];
      for (int t = 0; t < T; ++t) {
        if (t == rank) continue;
        if constexpr (kX == kMlaXPush) {
          uint4* rp = reinterpret_cast<uint4*>(cluster.map_shared_rank(prow, rbase + t));
          rp[0] = v0;
          rp[1] = v1;
          if (sm_q == 0) {
            *cluster.map_shared_rank(al, rbase + t) = alpha;
            *cluster.map_shared_rank(su, rbase + t) = sum;
          }
        } else {
          const uint32_t bar = dsmem_addr(mbar1, rbase + t), rp = dsmem_addr(smem_u32(prow), rbase + t);
          st_async_v4(rp, v0, bar);
          st_async_v4(rp + 16, v1, bar);
          if (sm_q == 0) {
            st_async_f32(dsmem_addr(smem_u32(al), rbase + t), alpha, bar);
            st_async_f32(dsmem_addr(smem_u32(su), rbase + t), sum, bar);
          }
        }
      }
    }
  }
  if constexpr (kX == kMlaXPull) {
    cluster.sync();  // every tile's P, alpha and sum are visible to the cluster
    mark(6);
    // Copy the other tiles' P (16 rows x 64 bf16 = 128 16-byte chunks per tile), maxima, alphas
    // and sums into this block's shared memory.
    for (int i = tid; i < ntiles * 128; i += kMlaTcThreads) {
      const int t = i >> 7, r = (i >> 3) & 15, c = (i & 7) * 8;
      if (t == rank) continue;
      uint16_t* dst = Pa + (t * 16 + r) * kMlaPStride + c;
      *reinterpret_cast<uint4*>(dst) = *reinterpret_cast<const uint4*>(cluster.map_shared_rank(dst, rbase + t));
    }
    for (int i = tid; i < ntiles * 48; i += kMlaTcThreads) {
      const int t = i / 48, a = (i % 48) / 16, r = i % 16;
      if (t == rank) continue;
      float* dst = (a == 0 ? mx_a : a == 1 ? al_a : su_a) + t * 16 + r;
      *dst = *cluster.map_shared_rank(dst, rbase + t);
    }
    cp_async_wait<0>();
    cluster.sync();  // copies done (no block leaves while another reads it) and visible in the block
  } else if constexpr (kX == kMlaXPush) {
    // After this barrier no block touches another's shared memory: each may leave when done.
    cp_async_wait<0>();
    cluster.sync();  // every tile's P, alpha and sum are in every block
    mark(6);
  } else {
    cp_async_wait<0>();
    mbar_wait_cluster(mbar1, 0);  // the other tiles' P, alphas and sums have landed here
    __syncthreads();      // this block's own (and its slice copies) are visible to every warp
    mark(6);
  }
  mark(7);
  float m_fin = -INFINITY, l_fin = 0.0f;
  if (tid < 16) {  // the walk's l and final m of row tid
    for (int t = 0; t < ntiles; ++t) {
      l_fin = __fmaf_rn(l_fin, al_a[t * 16 + tid], su_a[t * 16 + tid]);
      m_fin = fmaxf(m_fin, mx_a[t * 16 + tid]);
    }
    l_s[tid] = l_fin;
  }

  // ---- phase 2: columns c0 + 16 warp .. + 16 over all tiles, ascending ----
  if (rel == 1) pdl_release_if(true);
  const int d0 = c0 + 16 * warp;
  float o[2][4];
#pragma unroll
  for (int nt = 0; nt < 2; ++nt)
#pragma unroll
    for (int e = 0; e < 4; ++e) o[nt][e] = 0.0f;
  if (d0 < dcols) {
    for (int t = 0; t < ntiles; ++t) {
      const float a_lo = al_a[t * 16 + (lane >> 2)], a_hi = al_a[t * 16 + (lane >> 2) + 8];
#pragma unroll
      for (int nt = 0; nt < 2; ++nt) {
        o[nt][0] *= a_lo;
        o[nt][1] *= a_lo;
        o[nt][2] *= a_hi;
        o[nt][3] *= a_hi;
      }
      const int ksteps = (min(kMlaTile, send - (j0 + t * kMlaTile)) + 15) / 16;
      const uint16_t* C = Cl + t * kMlaTile * kMlaSliceStride;
      const uint16_t* P = Pa + t * 16 * kMlaPStride;
      for (int ks = 0; ks < ksteps; ++ks) {
        uint32_t b[4], a[4];
        ldsm_x4_trans(b, C + (ks * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * kMlaSliceStride + 16 * warp +
                             (lane >> 4) * 8);
        ldsm_x4(a, P + ((lane & 7) + ((lane >> 3) & 1) * 8) * kMlaPStride + ks * 16 + (lane >> 4) * 8);
        mma_bf16(o[0], a, b[0], b[1]);
        if (d0 + 8 < dcols) mma_bf16(o[1], a, b[2], b[3]);
      }
    }
  }

  // ---- epilogue (the walk's, or the pair merge's) ----
  mark(8);
  if (rel == 2) pdl_release_if(true);
  if (pair_send) {
    // Block r of the second split: its accumulators into block r of the first (thread for
    // thread), and from rank 0 (which has every tile's maxima) the split's m and l into all four.
    const int partner = rank;  // the first split's blocks have ranks 0 .. T - 1
    const uint32_t bar = dsmem_addr(mbar2, partner);
    if (d0 < dcols) {
      const uint32_t dst = dsmem_addr(smem_u32(x_acc + tid * 8), partner);
      st_async_v4(dst, make_uint4(__float_as_uint(o[0][0]), __float_as_uint(o[0][1]), __float_as_uint(o[0][2]),
                                  __float_as_uint(o[0][3])), bar);
      st_async_v4(dst + 16, make_uint4(__float_as_uint(o[1][0]), __float_as_uint(o[1][1]), __float_as_uint(o[1][2]),
                                       __float_as_uint(o[1][3])), bar);
    }
    if (rank == 0 && tid < 16)
      for (int t = 0; t < T; ++t)
        st_async_v2(dsmem_addr(smem_u32(x_ml + 2 * tid), t), make_float2(m_fin, l_fin), dsmem_addr(mbar2, t));
  } else if (pair_recv) {
    // The merge of the two splits (mla_merge_item for n = 2, in its order: M from -inf over the
    // splits ascending, then the fmaf chains of l and of each column from 0): the same bits.
    if (tid < 16) m_s[tid] = m_fin;
    mbar_wait_cluster(mbar2, 0);  // the partner's accumulators and (m, l) have landed here
    __syncthreads();              // m_s, l_s
    if (d0 < dcols) {
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int h = (lane >> 2) + half * 8;
        if (h >= p.heads) continue;
        const float m0 = m_s[h], m1 = x_ml[2 * h];
        const float M = fmaxf(fmaxf(-INFINITY, m0), m1);
        const float f0 = expf(m0 - M), f1 = expf(m1 - M);
        const float L = __fmaf_rn(x_ml[2 * h + 1], f1, __fmaf_rn(l_s[h], f0, 0.0f));
        uint16_t* dst = p.out + (int64_t(qi) * p.heads + h) * p.latent;
#pragma unroll
        for (int nt = 0; nt < 2; ++nt)
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            const int d = d0 + nt * 8 + 2 * (lane & 3) + e;
            const float a1 = x_acc[tid * 8 + nt * 4 + half * 2 + e];
            const float v = __fmaf_rn(a1, f1, __fmaf_rn(o[nt][half * 2 + e], f0, 0.0f));
            if (d < p.latent) dst[d] = f2bf_out(v / L);
          }
      }
    }
  } else {
    const bool direct = len <= p.S;  // the query has exactly one split
    if (!direct && rank == 0 && tid < p.heads) {
      const int64_t base = ((int64_t(qi) * p.max_splits + split) * p.heads + tid) * 2;
      p.ws_ml[base] = m_fin;
      p.ws_ml[base + 1] = l_s[tid];
    }
    __syncthreads();  // l_s
    if (d0 < dcols) {
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int h = (lane >> 2) + half * 8;
        if (h >= p.heads) continue;
        const float l = l_s[h];
#pragma unroll
        for (int nt = 0; nt < 2; ++nt) {
          const int d = d0 + nt * 8 + 2 * (lane & 3);
          mla_store_pair(p, qi, split, h, d, o[nt][half * 2], o[nt][half * 2 + 1], l, direct);
        }
      }
    }
  }
  if constexpr (kClocks) {
    mark(9);
    if (tid == 0 && rank < ntiles) clk.flush(p.phase_clocks);
  }
#else
  __trap();  // the host never launches it without sm_90 device code (mla_tc_cluster_probe_kernel)
#endif
}

// Merge of the split partials of queries with more than one split (and zeros for length 0).
// One (query, head) per block iteration, 4 latent columns per thread. Block b's items are b,
// b + gridDim.x, ...; with more than one, it reads the lengths of 128 of them at once (one per
// thread) and works through the ones with work, in ascending order: a prefill's items are
// nearly all one-split queries, which had cost one dependent length read each (131 us per
// launch on average in session 11's traced-prefill profile, ~75 items per block). A decode
// step (one item per block) skips the list: its barriers cost ~0.9 us per launch at batch 1.
// kEarly (ATLAS_MLA_MERGE_EARLY, default on): a decode step's length read before the
// launch-overlap wait, and each item's loads in one round (mla_merge_item<true>); the same bits.
// kReleaseFirst (ATLAS_RELEASE_FIRST=merge): the next launch released first (kernels/pdl.cuh).
template <bool kEarly, bool kReleaseFirst = false>
__global__ void __launch_bounds__(kMlaMergeThreads)
mla_tc_merge_kernel(const float* __restrict__ ws_acc, const float* __restrict__ ws_ml,
                    const int32_t* __restrict__ lengths, int rows, int heads, int latent, int max_length, int S,
                    int max_splits, uint16_t* __restrict__ out) {
  pdl_release_if(kReleaseFirst);
  __shared__ int s_cnt[kMlaMergeThreads / 32];
  __shared__ int s_list[kMlaMergeThreads];
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int d = 4 * tid;
  const int64_t items = int64_t(rows) * heads, stride = gridDim.x;
  if (items <= stride) {  // (launch-uniform) one item per block, a decode step: no list
    // The length before the launch-overlap wait: the lengths were written before the kernel
    // this one follows (the attention kernel, launched just before it by the same call) began
    // its work (kernels/pdl.cuh; the cluster kernel reads them early too: MlaTcParams).
    if (!kEarly) pdl_wait_after(kReleaseFirst);
    const int len = lengths[blockIdx.x / heads];
    if (kEarly) pdl_wait_after(kReleaseFirst);
    if (len >= 0 && len <= max_length && (len == 0 || len > S))
      mla_merge_item<kEarly>(ws_acc, ws_ml, len, heads, latent, S, max_splits, out, blockIdx.x, d);
    return;
  }
  pdl_wait_after(kReleaseFirst);
  for (int64_t c0 = blockIdx.x; c0 < items; c0 += stride * kMlaMergeThreads) {
    const int64_t mine = c0 + int64_t(tid) * stride;
    bool need = false;
    if (mine < items) {
      const int len = lengths[mine / heads];  // bad lengths: reported by the split kernel
      need = len >= 0 && len <= max_length && (len == 0 || len > S);
    }
    const unsigned ballot = __ballot_sync(0xffffffffu, need);
    if (lane == 0) s_cnt[warp] = __popc(ballot);
    __syncthreads();
    int before = 0, n_need = 0;
#pragma unroll
    for (int w = 0; w < kMlaMergeThreads / 32; ++w) {
      before += w < warp ? s_cnt[w] : 0;
      n_need += s_cnt[w];
    }
    if (need) s_list[before + __popc(ballot & ((1u << lane) - 1u))] = tid;
    __syncthreads();
    for (int i = 0; i < n_need; ++i) {
      const int64_t item = c0 + int64_t(s_list[i]) * stride;
      mla_merge_item<kEarly>(ws_acc, ws_ml, lengths[item / heads], heads, latent, S, max_splits, out, item, d);
    }
    __syncthreads();  // s_cnt and s_list are rewritten for the next 128 items
  }
}

}  // namespace atlas::cuda::kern
