// Launch-floor and L2-prefetch probe (a measurement, not part of atlas): what a chain of small
// dependent launches costs inside a CUDA graph on this GPU, and what an L2 prefetch of the next
// launch's weights buys a batch-1 GEMV-shaped kernel. Built and run by hand on the GPU machine:
//   build/bench/cuda/atlas_launch_floor   (or: nvcc -O3 -std=c++20 -Isrc -gencode=arch=compute_90a,code=sm_90a bench/cuda/launch_floor.cu)
// Each figure is the median over 15 replays of one graph of `kChain` launches, per launch.
#include "backend/cuda/kernels/common.cuh"  // kern::prefetch_l2
#include "probe_util.h"

constexpr int kChain = 64;      // launches per graph
constexpr int kDim = kProbeRowDim;  // row width (bf16)
constexpr int kRows = 2048;     // GEMV output rows (an o_proj: 2048 x 2048, 8 MB)
constexpr int kMats = 64;       // distinct weight matrices (512 MB: never all in L2)

using atlas::cuda::kern::prefetch_l2;
// Release and wait apart (kern::pdl_begin does both at once): the probe places work between them.
__device__ __forceinline__ void pdl_wait() { asm volatile("griddepcontrol.wait;" ::: "memory"); }
__device__ __forceinline__ void pdl_release() { asm volatile("griddepcontrol.launch_dependents;" ::: "memory"); }

__global__ void k_empty() {}

// One block: out = in * w / rms(in) (an RMSNorm's shape: one dependent read, a block reduce).
__global__ void k_norm(const float* in, float* out, const float* w, const char* next, unsigned next_bytes, int pdl) {
  if (pdl) pdl_release();
  if (next)  // 64 KB per prefetch, spread over the block's threads
    for (unsigned off = threadIdx.x * 65536u; off < next_bytes; off += 256u * 65536u)
      prefetch_l2(next + off, min(65536u, next_bytes - off));
  if (pdl) pdl_wait();
  probe_norm(in, out, w);
}

// GEMV: out[n] = sum_k x[k] * W[n][k], a warp per row, 8 rows per block (256 blocks); `next`:
// each block prefetches its share of the next launch's weights into L2 before it starts.
__global__ void k_gemv(const unsigned short* W, const float* x, float* out, const unsigned short* next, int pdl) {
  if (pdl) pdl_release();
  const int row = blockIdx.x * 8 + (threadIdx.x >> 5), lane = threadIdx.x & 31;
  if (next && threadIdx.x < 8) prefetch_l2(next + size_t(blockIdx.x * 8 + threadIdx.x) * kDim, kDim * 2);
  uint4 wv[8];
  probe_load_row(W, row, lane, wv);  // weights do not depend on the previous launch
  if (pdl) pdl_wait();
  const float s = probe_dot_row(wv, x, lane);
  if (lane == 0) out[row] = s * 1e-3f;
}

// Per launch: the median of 15 replays (after 3) of one graph of kChain launches of body().
template <class F>
static float time_graph(cudaStream_t s, F&& body) {
  return graph_us_per_launch(s, kChain, body);
}

template <class K, class... A>
static void launch(cudaStream_t s, bool pdl, int grid, K kern, A... args) {
  cudaLaunchConfig_t c{};
  c.gridDim = dim3(grid);
  c.blockDim = dim3(256);
  c.stream = s;
  cudaLaunchAttribute at{};
  at.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  at.val.programmaticStreamSerializationAllowed = 1;
  c.attrs = &at;
  c.numAttrs = pdl ? 1 : 0;
  CK(cudaLaunchKernelEx(&c, kern, args...));
}

int main() {
  cudaStream_t s;
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  float *act, *normw;
  unsigned short* W;
  CK(cudaMalloc(&act, 2 * kChain * kDim * sizeof(float)));
  CK(cudaMalloc(&normw, size_t(kMats) * (2u << 20)));  // one 4 KB norm weight per 2 MB (cold pages)
  CK(cudaMalloc(&W, size_t(kMats) * kRows * kDim * 2));
  CK(cudaMemset(act, 0, 2 * kChain * kDim * sizeof(float)));
  CK(cudaMemset(normw, 0, size_t(kMats) * (2u << 20)));
  CK(cudaMemset(W, 0, size_t(kMats) * kRows * kDim * 2));
  const auto nw = [&](int i) { return normw + size_t(i % kMats) * (512u << 10); };
  const auto mat = [&](int i) { return W + size_t(i % kMats) * kRows * kDim; };
  const auto a = [&](int i) { return act + size_t(i % (2 * kChain)) * kDim; };
  std::printf("per launch, us (median of 15 graph replays of %d launches)\n", kChain);
  for (int pdl = 0; pdl < 2; ++pdl) {
    std::printf("-- launch overlap %s\n", pdl ? "on" : "off");
    std::printf("empty 1 block                        %6.2f\n", time_graph(s, [&] {
                  for (int i = 0; i < kChain; ++i) launch(s, pdl, 1, k_empty);
                }));
    std::printf("norm, weight hot                     %6.2f\n", time_graph(s, [&] {
                  for (int i = 0; i < kChain; ++i) launch(s, pdl, 1, k_norm, a(i), a(i + 1), nw(0), (const char*)nullptr, 0u, pdl);
                }));
    std::printf("norm, weight cold                    %6.2f\n", time_graph(s, [&] {
                  for (int i = 0; i < kChain; ++i) launch(s, pdl, 1, k_norm, a(i), a(i + 1), nw(i), (const char*)nullptr, 0u, pdl);
                }));
    std::printf("norm, cold, next's weight prefetched %6.2f\n", time_graph(s, [&] {
                  for (int i = 0; i < kChain; ++i)
                    launch(s, pdl, 1, k_norm, a(i), a(i + 1), nw(i), (const char*)nw(i + 1), 4096u, pdl);
                }));
    std::printf("gemv 8 MB, weights hot (L2)          %6.2f\n", time_graph(s, [&] {
                  for (int i = 0; i < kChain; ++i) launch(s, pdl, 256, k_gemv, (const unsigned short*)mat(0), (const float*)a(i), a(i + 1), (const unsigned short*)nullptr, pdl);
                }));
    std::printf("gemv 8 MB, weights cold              %6.2f\n", time_graph(s, [&] {
                  for (int i = 0; i < kChain; ++i) launch(s, pdl, 256, k_gemv, (const unsigned short*)mat(i), (const float*)a(i), a(i + 1), (const unsigned short*)nullptr, pdl);
                }));
    std::printf("gemv cold, next's prefetched         %6.2f\n", time_graph(s, [&] {
                  for (int i = 0; i < kChain; ++i) launch(s, pdl, 256, k_gemv, (const unsigned short*)mat(i), (const float*)a(i), a(i + 1), (const unsigned short*)mat(i + 1), pdl);
                }));
    // A layer-like alternation: norm (idle memory) then gemv; the norm prefetches the gemv's weights.
    std::printf("norm+gemv pair, cold                 %6.2f\n", 2 * time_graph(s, [&] {
                  for (int i = 0; i < kChain / 2; ++i) {
                    launch(s, pdl, 1, k_norm, a(2 * i), a(2 * i + 1), nw(i), (const char*)nullptr, 0u, pdl);
                    launch(s, pdl, 256, k_gemv, (const unsigned short*)mat(i), (const float*)a(2 * i + 1), a(2 * i + 2), (const unsigned short*)nullptr, pdl);
                  }
                }));
    std::printf("norm+gemv pair, norm prefetches gemv %6.2f\n", 2 * time_graph(s, [&] {
                  for (int i = 0; i < kChain / 2; ++i) {
                    launch(s, pdl, 1, k_norm, a(2 * i), a(2 * i + 1), nw(i), (const char*)mat(i), unsigned(kRows) * kDim * 2, pdl);
                    launch(s, pdl, 256, k_gemv, (const unsigned short*)mat(i), (const float*)a(2 * i + 1), a(2 * i + 2), (const unsigned short*)nullptr, pdl);
                  }
                }));
  }
  CK(cudaDeviceSynchronize());
  return 0;
}
