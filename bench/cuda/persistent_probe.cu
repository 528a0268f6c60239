// Persistent-kernel probe (a measurement, not part of atlas; written in session 14 to decide the
// next step of issue 5): can one persistent grid with grid-wide barriers run a batch-1 MoE
// layer's expert work near the HBM bound, where today ~6 launches take ~70 us per layer?
//
// A "layer" here has the byte counts of DeepSeek-V2-Lite's routed experts at one token:
//   phase A  y1 = W1 x     W1 [16896 x 2048] bf16 (6 experts' gate|up, 69 MB)
//   phase B  y2 = W2 a     W2 [12288 x 1408] bf16 (6 experts' down, 35 MB); a = the first 1408
//                          of each expert's 2816 outputs (a stand-in for silu(gate) * up)
//   phase C  x  = rmsnorm(sum of the 6 experts' 2048-wide rows), one block
// 26 such layers with distinct weights (2.7 GB: nothing stays in L2 between layers). The GEMVs
// are plain FMA dot products (a warp per row, 16-byte loads, two rows in flight per warp): a
// bandwidth question, not the contract's mma order (the weight-streaming GEMM showed that path
// reaching 3.7 TB/s).
// Variants, each timed as the median of 7 runs of all 26 layers:
//   graph       3 launches per layer (GEMV grids of a warp per row, then one norm block) in a CUDA graph
//   persistent  one cooperative launch for all 26 layers, phases separated by grid barriers
//   barrier     the persistent grid doing only its barriers (the cost of one)
//   graph, mma  (session 16) as `graph`, with phases A and B shaped like the contract's kernels:
//               a warp owns one n8 tile (8 weight rows) at one x row and walks K in 256-wide
//               slices of 16 mma.sync m16n8k16 (acc = +0 per slice, slices added in order), its B
//               fragments loaded straight from global memory in the fragment layout (4-byte
//               loads, two slices in flight: ~8 KB per warp, 16 warps per SM); x as bf16 in
//               shared memory. Does the plain GEMV's memory parallelism survive the contract's
//               arithmetic shape? (Timing only: the sums are not the contract's bits.)
//   build/bench/cuda/atlas_persistent_probe
#include "backend/cuda/kernels/gemm_mma.cuh"  // kern::bf2f, kern::mma_bf16_16816
#include "probe_util.h"

constexpr int kLayers = 26, kExperts = 6, kHidden = 2048, kInter = 1408;
constexpr int kRows1 = kExperts * 2 * kInter, kK1 = kHidden;  // 16896 x 2048
constexpr int kRows2 = kExperts * kHidden, kK2 = kInter;      // 12288 x 1408
constexpr int kThreads = 256, kWarps = kThreads / 32;
static_assert(kRows1 % 2 == 0 && kRows2 % 2 == 0 && kHidden % 2 == 0, "rows go two at a time");

struct Layer {
  const unsigned short* w1;  // [kRows1][kK1]
  const unsigned short* w2;  // [kRows2][kK2]
};
struct Params {
  const Layer* layers;
  float* x;   // [kHidden] the layer input / output
  float* y1;  // [kRows1]
  float* y2;  // [kRows2]
  unsigned* bar_count;
  unsigned* bar_gen;
  int layers_n;
  int barrier_only;
};

using atlas::cuda::kern::bf2f;
using atlas::cuda::kern::mma_bf16_16816;

// Dot products of rows r and r + 1 of W (width K, a compile-time constant so that every load
// of both rows is issued before the first is used) with xs (shared memory), one warp. xstride:
// phase B reads expert e's slice of the input (rows of expert e are [e*2048, (e+1)*2048)).
template <int K>
__device__ __forceinline__ void warp_rows(const unsigned short* W, int r, const float* xs, float* out, int xstride) {
  constexpr int kChunks = K / 8, kPerLane = (kChunks + 31) / 32;  // 16-byte chunks
  const int lane = threadIdx.x & 31;
  const uint4* a = reinterpret_cast<const uint4*>(W + size_t(r) * K);
  const uint4* b = a + kChunks;
  const float* xr = xs + (xstride ? (r / 2048) * xstride : 0);
  uint4 va[kPerLane], vb[kPerLane];
#pragma unroll
  for (int u = 0; u < kPerLane; ++u) {
    const int c = lane + 32 * u;
    const bool in = u < kPerLane - 1 || c < kChunks;
    va[u] = in ? a[c] : make_uint4(0, 0, 0, 0);
    vb[u] = in ? b[c] : make_uint4(0, 0, 0, 0);
  }
  float s0 = 0.f, s1 = 0.f;
#pragma unroll
  for (int u = 0; u < kPerLane; ++u) {
    const int c = lane + 32 * u;
    if (u == kPerLane - 1 && c >= kChunks) continue;
    const unsigned short* ha = reinterpret_cast<const unsigned short*>(&va[u]);
    const unsigned short* hb = reinterpret_cast<const unsigned short*>(&vb[u]);
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      s0 += bf2f(ha[j]) * xr[8 * c + j];
      s1 += bf2f(hb[j]) * xr[8 * c + j];
    }
  }
  for (int o = 16; o; o >>= 1) {
    s0 += __shfl_xor_sync(~0u, s0, o);
    s1 += __shfl_xor_sync(~0u, s1, o);
  }
  if (lane == 0) {
    out[r] = s0;
    out[r + 1] = s1;
  }
}

// Rows [0, rows) of one phase (rows even) over `nwarps` warps numbered `gwarp`, two per step.
template <int K>
__device__ __forceinline__ void phase_rows(const unsigned short* W, int rows, const float* xs, float* out, int xstride,
                                           int gwarp, int nwarps) {
  for (int r = 2 * gwarp; r < rows; r += 2 * nwarps) warp_rows<K>(W, r, xs, out, xstride);
}

// x = rmsnorm(sum over experts of y2's rows) by one block (phase C).
__device__ __forceinline__ void phase_norm(const float* y2, float* x) {
  __shared__ float red[kWarps];
  float v[kHidden / kThreads], ss = 0.f;
#pragma unroll
  for (int j = 0; j < kHidden / kThreads; ++j) {
    const int i = threadIdx.x + kThreads * j;
    float s = 0.f;
    for (int e = 0; e < kExperts; ++e) s += y2[e * kHidden + i];
    v[j] = s;
    ss += s * s;
  }
  for (int o = 16; o; o >>= 1) ss += __shfl_xor_sync(~0u, ss, o);
  if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = ss;
  __syncthreads();
  ss = 0.f;
  for (int w = 0; w < kWarps; ++w) ss += red[w];
  const float r = rsqrtf(ss / kHidden + 1e-6f);
#pragma unroll
  for (int j = 0; j < kHidden / kThreads; ++j) x[threadIdx.x + kThreads * j] = v[j] * r;
}

// Sense-by-generation grid barrier: the last block to arrive resets the count and bumps the
// generation; the others spin on it. Every block is resident (cooperative launch).
__device__ __forceinline__ void grid_barrier(unsigned* count, unsigned* gen) {
  __syncthreads();
  if (threadIdx.x == 0) {
    volatile unsigned* vgen = gen;
    const unsigned g = *vgen;
    __threadfence();
    if (atomicAdd(count, 1u) == gridDim.x - 1) {
      atomicExch(count, 0u);
      __threadfence();
      atomicAdd(gen, 1u);
    } else {
      while (*vgen == g) {
      }
    }
    __threadfence();
  }
  __syncthreads();
}

__device__ __forceinline__ void load_x(float* xs, const float* src, int n) {
  for (int i = threadIdx.x; i < n; i += kThreads) xs[i] = src[i];
  __syncthreads();
}

__global__ void __launch_bounds__(kThreads) k_persistent(Params p) {
  __shared__ float xs[kExperts * kInter];  // phase A's x (2048) or phase B's a (6 x 1408)
  static_assert(kExperts * kInter >= kHidden, "xs holds either input");
  const int gwarp = blockIdx.x * kWarps + (threadIdx.x >> 5), nwarps = gridDim.x * kWarps;
  for (int l = 0; l < p.layers_n; ++l) {
    if (!p.barrier_only) {
      load_x(xs, p.x, kHidden);
      phase_rows<kK1>(p.layers[l].w1, kRows1, xs, p.y1, 0, gwarp, nwarps);
    }
    grid_barrier(p.bar_count, p.bar_gen);
    if (!p.barrier_only) {
      for (int i = threadIdx.x; i < kExperts * kInter; i += kThreads)
        xs[i] = p.y1[(i / kInter) * 2 * kInter + i % kInter];
      __syncthreads();
      phase_rows<kK2>(p.layers[l].w2, kRows2, xs, p.y2, kInter, gwarp, nwarps);
    }
    grid_barrier(p.bar_count, p.bar_gen);
    if (!p.barrier_only && blockIdx.x == 0) phase_norm(p.y2, p.x);
    grid_barrier(p.bar_count, p.bar_gen);
  }
}

__global__ void __launch_bounds__(kThreads) k_phase_a(Params p, int l) {
  __shared__ float xs[kHidden];
  load_x(xs, p.x, kHidden);
  phase_rows<kK1>(p.layers[l].w1, kRows1, xs, p.y1, 0, blockIdx.x * kWarps + (threadIdx.x >> 5), gridDim.x * kWarps);
}
__global__ void __launch_bounds__(kThreads) k_phase_b(Params p, int l) {
  __shared__ float xs[kExperts * kInter];
  for (int i = threadIdx.x; i < kExperts * kInter; i += kThreads) xs[i] = p.y1[(i / kInter) * 2 * kInter + i % kInter];
  __syncthreads();
  phase_rows<kK2>(p.layers[l].w2, kRows2, xs, p.y2, kInter, blockIdx.x * kWarps + (threadIdx.x >> 5),
                  gridDim.x * kWarps);
}
__global__ void __launch_bounds__(kThreads) k_phase_c(Params p) { phase_norm(p.y2, p.x); }

// ---- the contract-shaped variant ("graph, mma") ----
__device__ __forceinline__ unsigned bf16_pair(const unsigned short* p) { return *reinterpret_cast<const unsigned*>(p); }

// One n8 tile (weight rows [8 t, 8 t + 8) of width K) at one x row (xs: bf16 in shared memory):
// lane l holds the B fragment of row 8 t + l / 4 at k = 2 (l % 4) (+1, +8, +9) of each k16 chunk;
// lanes 0-3 hold the A fragment's row 0 (the other 15 rows are zero) and the tile's 8 outputs.
template <int K>
__device__ __forceinline__ void warp_tile_mma(const unsigned short* W, int t, const unsigned short* xs, float* out) {
  constexpr int kSlices = (K + 255) / 256;
  const int lane = threadIdx.x & 31, q = lane & 3;
  const unsigned short* wr = W + size_t(8 * t + (lane >> 2)) * K + 2 * q;
  const unsigned short* xr = xs + 2 * q;
  float t0 = 0.f, t1 = 0.f;
#pragma unroll
  for (int s0 = 0; s0 < kSlices; s0 += 2) {
    unsigned b[2][16][2];
#pragma unroll
    for (int h = 0; h < 2; ++h)
#pragma unroll
      for (int c = 0; c < 16; ++c) {
        const int k0 = (s0 + h) * 256 + 16 * c;
        if (s0 + h < kSlices && k0 < K) {
          // volatile: issued in this order, all before the first mma (volatile too), so both
          // slices' loads are in flight together (plain loads were sunk next to their use).
          asm volatile("ld.global.nc.b32 %0, [%1];\n" : "=r"(b[h][c][0]) : "l"(wr + k0));
          asm volatile("ld.global.nc.b32 %0, [%1];\n" : "=r"(b[h][c][1]) : "l"(wr + k0 + 8));
        }
      }
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      if (s0 + h >= kSlices) continue;
      float acc[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
      for (int c = 0; c < 16; ++c) {
        const int k0 = (s0 + h) * 256 + 16 * c;
        if (k0 >= K) continue;
        const unsigned a[4] = {lane < 4 ? bf16_pair(xr + k0) : 0u, 0u, lane < 4 ? bf16_pair(xr + k0 + 8) : 0u, 0u};
        mma_bf16_16816(acc, a, b[h][c][0], b[h][c][1]);
      }
      t0 += acc[0];
      t1 += acc[1];
    }
  }
  if (lane < 4) {
    out[8 * t + 2 * q] = t0;
    out[8 * t + 2 * q + 1] = t1;
  }
}

// The same tile with the weights stored in fragment order (a layout a loader could write once):
// per (tile, slice) 4 KB where lane l's 32 B-fragment words (16 chunks x 2) are 128 contiguous
// bytes, so a warp reads each slice with eight 16-byte loads per lane (512 contiguous bytes per
// instruction) instead of 32 four-byte loads.
// Ping-pong over two register sets in a rolled loop: group g + 1's loads are issued before
// group g's mma, and cannot be sunk past the loop's back edge (ptxas sinks loads of a fully
// unrolled loop to just before their use). load(v, g) / compute(v, g) over groups [0, groups).
template <class V, class Load, class Compute>
__device__ __forceinline__ void ping_pong(int groups, Load&& load, Compute&& compute) {
  V v0, v1;
  load(v0, 0);
#pragma unroll 1
  for (int g = 0; g < groups; g += 2) {
    if (g + 1 < groups) load(v1, g + 1);
    compute(v0, g);
    if (g + 1 < groups) {
      if (g + 2 < groups) load(v0, g + 2);
      compute(v1, g + 1);
    }
  }
}

template <int K, int F>  // F slices per group, the next group's loads issued before this one's mma
__device__ __forceinline__ void warp_tile_mma_frag(const unsigned short* W, int t, const unsigned short* xs, float* out) {
  constexpr int kSlices = (K + 255) / 256, kGroups = (kSlices + F - 1) / F;
  const int lane = threadIdx.x & 31, q = lane & 3;
  const uint4* wt = reinterpret_cast<const uint4*>(W + size_t(8 * t) * K) + lane * 8;  // 8 x 16 B per lane per slice
  const unsigned short* xr = xs + 2 * q;
  float t0 = 0.f, t1 = 0.f;
  const auto load = [&](uint4 (&v)[F][8], int g) {
#pragma unroll
    for (int h = 0; h < F; ++h)
#pragma unroll
      for (int j = 0; j < 8; ++j)
        if (g * F + h < kSlices) v[h][j] = __ldg(wt + (g * F + h) * 256 + j);
  };
  const auto compute = [&](const uint4 (&v)[F][8], int g) {
#pragma unroll
    for (int h = 0; h < F; ++h) {
      const int sl = g * F + h;
      if (sl >= kSlices) continue;
      const unsigned* b = reinterpret_cast<const unsigned*>(v[h]);
      float acc[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
      for (int c = 0; c < 16; ++c) {
        const int k0 = sl * 256 + 16 * c;
        if (k0 >= K) continue;
        const unsigned a[4] = {lane < 4 ? bf16_pair(xr + k0) : 0u, 0u, lane < 4 ? bf16_pair(xr + k0 + 8) : 0u, 0u};
        mma_bf16_16816(acc, a, b[2 * c], b[2 * c + 1]);
      }
      t0 += acc[0];
      t1 += acc[1];
    }
  };
  using Group = uint4[F][8];
  ping_pong<Group>(kGroups, load, compute);
  if (lane < 4) {
    out[8 * t + 2 * q] = t0;
    out[8 * t + 2 * q + 1] = t1;
  }
}

// 4 x 4 transpose of 32-bit words across the 4 lanes of a quad (lane q holds row q of M, w[0..3]);
// after it lane q holds column q: w[i] = M[i][q]. Two shuffle stages of two words each.
__device__ __forceinline__ void quad_transpose(unsigned (&w)[4], int q) {
  const bool hi = q & 2, odd = q & 1;
  unsigned r0 = __shfl_xor_sync(~0u, hi ? w[0] : w[2], 2), r1 = __shfl_xor_sync(~0u, hi ? w[1] : w[3], 2);
  if (hi) {
    w[0] = r0;
    w[1] = r1;
  } else {
    w[2] = r0;
    w[3] = r1;
  }  // rows now: top lanes [A | C], bottom lanes [B | D] (2 x 2 blocks)
  r0 = __shfl_xor_sync(~0u, odd ? w[0] : w[1], 1);
  r1 = __shfl_xor_sync(~0u, odd ? w[2] : w[3], 1);
  if (odd) {
    w[0] = r0;
    w[2] = r1;
  } else {
    w[1] = r0;
    w[3] = r1;
  }
}

// The tile with row-major weights read by 16-byte loads: lane (n, q) of a quad loads 16-byte units
// 4 r + q (r = 0..7) of row n's slice, and a quad transpose per r turns them into the B fragments
// (lane q then holds word q of units 4 r .. 4 r + 3: chunks 2 r and 2 r + 1). One-slice groups,
// the next loaded a group ahead as in warp_tile_mma_frag.
template <int K>
__device__ __forceinline__ void warp_tile_mma_shfl(const unsigned short* W, int t, const unsigned short* xs, float* out) {
  constexpr int kSlices = (K + 255) / 256;
  const int lane = threadIdx.x & 31, q = lane & 3;
  const uint4* wr = reinterpret_cast<const uint4*>(W + size_t(8 * t + (lane >> 2)) * K) + q;
  const unsigned short* xr = xs + 2 * q;
  float t0 = 0.f, t1 = 0.f;
  const auto load = [&](uint4 (&v)[8], int sl) {
#pragma unroll
    for (int r = 0; r < 8; ++r)
      if (sl * 256 + 32 * r < K) v[r] = __ldg(wr + sl * 32 + 4 * r);
  };
  const auto compute = [&](const uint4 (&v)[8], int sl) {
    float acc[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
    for (int r = 0; r < 8; ++r) {
      if (sl * 256 + 32 * r >= K) continue;
      unsigned w[4] = {v[r].x, v[r].y, v[r].z, v[r].w};
      quad_transpose(w, q);
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int k0 = sl * 256 + 16 * (2 * r + h);
        const unsigned a[4] = {lane < 4 ? bf16_pair(xr + k0) : 0u, 0u, lane < 4 ? bf16_pair(xr + k0 + 8) : 0u, 0u};
        mma_bf16_16816(acc, a, w[2 * h], w[2 * h + 1]);
      }
    }
    t0 += acc[0];
    t1 += acc[1];
  };
  using Slice = uint4[8];
  ping_pong<Slice>(kSlices, load, compute);
  if (lane < 4) {
    out[8 * t + 2 * q] = t0;
    out[8 * t + 2 * q + 1] = t1;
  }
}

__device__ __forceinline__ unsigned short to_bf16_bits(float f) { return (unsigned short)(__float_as_uint(f) >> 16); }

// kMode 0: row-major weights, four-byte fragment loads (the compiler keeps ~40 registers: the
// loads go out shortly before their mma); 1: fragment order, groups of one slice, the next
// group's loads a group ahead (~8 KB per warp in flight); 2: groups of two slices (~16 KB);
// 3: row-major weights by 16-byte loads, fragments made by quad transposes, one-slice groups.
template <int kMode, int K>
__device__ __forceinline__ void tile_mma_k(const unsigned short* W, int t, const unsigned short* xs, float* out) {
  if constexpr (kMode == 0) warp_tile_mma<K>(W, t, xs, out);
  else if constexpr (kMode == 3) warp_tile_mma_shfl<K>(W, t, xs, out);
  else warp_tile_mma_frag<K, kMode == 1 ? 1 : 2>(W, t, xs, out);
}
template <int kMode>
__device__ __forceinline__ void tile_mma(const unsigned short* W, int t, const unsigned short* xs, float* out, int K1) {
  if (K1 == kK1) tile_mma_k<kMode, kK1>(W, t, xs, out);
  else tile_mma_k<kMode, kK2>(W, t, xs, out);
}

template <int kMode, int kT>
__global__ void __launch_bounds__(kT) k_mma_a(Params p, int l) {
  __shared__ __align__(16) unsigned short xs[kHidden];
  for (int i = threadIdx.x; i < kHidden; i += kT) xs[i] = to_bf16_bits(p.x[i]);
  __syncthreads();
  const int t = blockIdx.x * (kT / 32) + (threadIdx.x >> 5);
  if (t < kRows1 / 8) tile_mma<kMode>(p.layers[l].w1, t, xs, p.y1, kK1);
}
template <int kMode, int kT>
__global__ void __launch_bounds__(kT) k_mma_b(Params p, int l) {
  __shared__ __align__(16) unsigned short as[kExperts * kInter];
  for (int i = threadIdx.x; i < kExperts * kInter; i += kT)
    as[i] = to_bf16_bits(p.y1[(i / kInter) * 2 * kInter + i % kInter]);
  __syncthreads();
  const int t = blockIdx.x * (kT / 32) + (threadIdx.x >> 5);  // expert t / 256 (2048 rows = 256 tiles each)
  if (t < kRows2 / 8) tile_mma<kMode>(p.layers[l].w2, t, as + (t / (kHidden / 8)) * kInter, p.y2, kK2);
}

// One graph of the contract-shaped phases (A, B, norm per layer) for a kernel variant.
template <int kMode, int kT>
float time_mma_graph(const Params& p, cudaStream_t s) {
  constexpr int kW = kT / 32;
  const int tiles_a = kRows1 / 8, tiles_b = kRows2 / 8;
  cudaGraph_t gm;
  cudaGraphExec_t gme;
  CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
  for (int l = 0; l < kLayers; ++l) {
    k_mma_a<kMode, kT><<<(tiles_a + kW - 1) / kW, kT, 0, s>>>(p, l);
    k_mma_b<kMode, kT><<<(tiles_b + kW - 1) / kW, kT, 0, s>>>(p, l);
    k_phase_c<<<1, kThreads, 0, s>>>(p);
  }
  CK(cudaStreamEndCapture(s, &gm));
  CK(cudaGraphInstantiate(&gme, gm, 0));
  const float us = median_us(s, 2, 7, [&] { CK(cudaGraphLaunch(gme, s)); });
  CK(cudaGraphExecDestroy(gme));
  CK(cudaGraphDestroy(gm));
  return us;
}

int main() {
  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, 0));
  int per_sm = 0;
  CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, k_persistent, kThreads, 0));
  const size_t b1 = size_t(kRows1) * kK1 * 2, b2 = size_t(kRows2) * kK2 * 2;
  std::printf("%s, %d SMs, persistent blocks per SM %d; per layer %.1f MB (A %.1f + B %.1f), %d layers\n", prop.name,
              prop.multiProcessorCount, per_sm, (b1 + b2) / 1e6, b1 / 1e6, b2 / 1e6, kLayers);
  unsigned short* wbuf;
  // + 64 KB: the fragment-order variant reads whole 4 KB slice blocks, and the down's K (1408)
  // ends half-way through its last one (the last tile's read may pass the last layer's bytes).
  CK(cudaMalloc(&wbuf, (b1 + b2) * kLayers + 65536));
  CK(cudaMemset(wbuf, 0x3c, (b1 + b2) * kLayers));  // bf16 ~0.011: finite sums
  std::vector<Layer> hl(kLayers);
  for (int l = 0; l < kLayers; ++l) {
    hl[l].w1 = wbuf + (b1 + b2) / 2 * l;
    hl[l].w2 = hl[l].w1 + b1 / 2;
  }
  Layer* dl;
  CK(cudaMalloc(&dl, sizeof(Layer) * kLayers));
  CK(cudaMemcpy(dl, hl.data(), sizeof(Layer) * kLayers, cudaMemcpyHostToDevice));
  Params p{};
  p.layers = dl;
  p.layers_n = kLayers;
  CK(cudaMalloc(&p.x, kHidden * 4));
  CK(cudaMalloc(&p.y1, kRows1 * 4));
  CK(cudaMalloc(&p.y2, kRows2 * 4));
  CK(cudaMalloc(&p.bar_count, 8));
  p.bar_gen = p.bar_count + 1;
  CK(cudaMemset(p.bar_count, 0, 8));
  std::vector<float> ones(kHidden, 1.0f);
  CK(cudaMemcpy(p.x, ones.data(), kHidden * 4, cudaMemcpyHostToDevice));
  cudaStream_t s;
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  const auto median = [&](auto&& run) { return median_us(s, 2, 7, run); };
  const double bytes = double(b1 + b2) * kLayers;
  const auto report = [&](const char* what, float us, int barriers) {
    std::printf("%-34s %9.1f us for %d layers: %6.2f us per layer, %5.2f TB/s", what, us, kLayers, us / kLayers,
                barriers ? 0.0 : bytes / (us * 1e-6) / 1e12);
    if (barriers) std::printf(", %.2f us per barrier", us / barriers);
    std::printf("\n");
  };

  // Graph: a warp per row pair, 3 launches per layer.
  const int grid_a = (kRows1 / 2 + kWarps - 1) / kWarps, grid_b = (kRows2 / 2 + kWarps - 1) / kWarps;
  cudaGraph_t g;
  cudaGraphExec_t ge;
  CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
  for (int l = 0; l < kLayers; ++l) {
    k_phase_a<<<grid_a, kThreads, 0, s>>>(p, l);
    k_phase_b<<<grid_b, kThreads, 0, s>>>(p, l);
    k_phase_c<<<1, kThreads, 0, s>>>(p);
  }
  CK(cudaStreamEndCapture(s, &g));
  CK(cudaGraphInstantiate(&ge, g, 0));
  report("graph (3 launches per layer)", median([&] { CK(cudaGraphLaunch(ge, s)); }), 0);

  // The contract-shaped phases: a warp per n8 tile, weights row-major or in fragment order.
  report("graph, mma n8 tiles (contract-shaped)", time_mma_graph<0, 256>(p, s), 0);
  report("graph, mma n8, fragment order, 1 slice", time_mma_graph<1, 256>(p, s), 0);
  report("graph, mma n8, fragment order, 2 slices", time_mma_graph<2, 128>(p, s), 0);
  report("graph, mma n8, row-major, quad transposes", time_mma_graph<3, 256>(p, s), 0);

  for (int mult : {1, 2, per_sm}) {
    if (mult > per_sm) continue;
    const int blocks = prop.multiProcessorCount * mult;
    for (int only : {0, 1}) {
      Params q = p;
      q.barrier_only = only;
      void* args[] = {&q};
      char label[64];
      std::snprintf(label, sizeof label, "persistent %s, %d blocks", only ? "barriers only" : "layers", blocks);
      const float us = median([&] {
        CK(cudaLaunchCooperativeKernel(reinterpret_cast<void*>(k_persistent), dim3(blocks), dim3(kThreads), args, 0, s));
      });
      report(label, us, only ? 3 * kLayers : 0);
    }
  }
  CK(cudaDeviceSynchronize());
  std::vector<float> x(kHidden);
  CK(cudaMemcpy(x.data(), p.x, kHidden * 4, cudaMemcpyDeviceToHost));
  std::printf("x[0] = %g (finite: the phases ran)\n", x[0]);
  return 0;
}
