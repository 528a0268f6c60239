// What the standalone probes of bench/cuda (launch_floor.cu, persistent_probe.cu, tlb_probe.cu)
// share: a CUDA-call check that names the call site and exits, the median of timed runs, and the
// bodies of the small kernels they time.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>

#define CK(x)                                                                       \
  do {                                                                              \
    cudaError_t e_ = (x);                                                           \
    if (e_ != cudaSuccess) {                                                        \
      std::fprintf(stderr, "%s:%d %s\n", __FILE__, __LINE__, cudaGetErrorString(e_)); \
      std::exit(1);                                                                 \
    }                                                                               \
  } while (0)

// The current GPU's SM count, or 0 (after saying so on stdout) where it is older than sm_90,
// which the probes built on Hopper instructions need: they then exit 0, skipped.
inline int hopper_sm_count(const char* probe) {
  int dev = 0, sms = 0;
  CK(cudaGetDevice(&dev));
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  cudaDeviceProp prop{};
  CK(cudaGetDeviceProperties(&prop, dev));
  if (prop.major >= 9) return sms;
  std::printf("%s: needs sm_90 (this GPU is sm_%d%d); skipped\n", probe, prop.major, prop.minor);
  return 0;
}

// Median device time (us, CUDA events on `s`) of run() over `reps` runs after `warm` untimed ones.
template <class F>
float median_us(cudaStream_t s, int warm, int reps, F&& run) {
  cudaEvent_t a, b;
  CK(cudaEventCreate(&a));
  CK(cudaEventCreate(&b));
  std::vector<float> t;
  for (int r = 0; r < warm + reps; ++r) {
    CK(cudaEventRecord(a, s));
    run();
    CK(cudaEventRecord(b, s));
    CK(cudaEventSynchronize(b));
    float ms;
    CK(cudaEventElapsedTime(&ms, a, b));
    if (r >= warm) t.push_back(ms * 1000.f);
  }
  CK(cudaEventDestroy(a));
  CK(cudaEventDestroy(b));
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

// Per launch: the median device time (us) of 15 replays (after 3) of one CUDA graph captured from
// body(), which launches `launches` kernels on s.
template <class F>
float graph_us_per_launch(cudaStream_t s, int launches, F&& body) {
  cudaGraph_t g;
  cudaGraphExec_t ge;
  CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
  body();
  CK(cudaStreamEndCapture(s, &g));
  CK(cudaGraphInstantiate(&ge, g, 0));
  const float us = median_us(s, 3, 15, [&] { CK(cudaGraphLaunch(ge, s)); }) / float(launches);
  CK(cudaGraphExecDestroy(ge));
  CK(cudaGraphDestroy(g));
  return us;
}

#ifdef __CUDACC__
#include "backend/cuda/kernels/common.cuh"  // global_timer_ns (%globaltimer), sm_id (%smid)
using atlas::cuda::kern::global_timer_ns;
using atlas::cuda::kern::sm_id;

// A kernel's own span: the first block's start and the last block's end (%globaltimer, ns); every
// block calls span_begin first and span_end last (span_end has a block barrier). Null: off.
struct KernelSpan {
  unsigned long long start, end;
};
__device__ __forceinline__ void span_begin(KernelSpan* s) {
  if (s != nullptr && threadIdx.x == 0) atomicMin(&s->start, global_timer_ns());
}
__device__ __forceinline__ void span_end(KernelSpan* s) {
  __syncthreads();
  if (s != nullptr && threadIdx.x == 0) atomicMax(&s->end, global_timer_ns());
}
// The span (us) of one more launch by launch(d), d a device KernelSpan.
template <class F>
double kernel_span_us(KernelSpan* d, F&& launch) {
  const KernelSpan init{~0ull, 0ull};
  CK(cudaMemcpy(d, &init, sizeof(KernelSpan), cudaMemcpyHostToDevice));
  launch(d);
  CK(cudaGetLastError());
  KernelSpan got{};
  CK(cudaMemcpy(&got, d, sizeof(KernelSpan), cudaMemcpyDeviceToHost));
  return double(got.end - got.start) / 1e3;
}

// One block of 256 threads: out = in * w / rms(in * w) over 1024 floats (an RMSNorm's shape: one
// dependent read, a block reduce, a write).
__device__ inline void probe_norm(const float* in, float* out, const float* w) {
  __shared__ float red[32];
  float v[4], s = 0.f;
  for (int j = 0; j < 4; ++j) {
    v[j] = in[threadIdx.x + 256 * j] * w[threadIdx.x + 256 * j];
    s += v[j] * v[j];
  }
  for (int o = 16; o; o >>= 1) s += __shfl_xor_sync(~0u, s, o);
  if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = s;
  __syncthreads();
  s = 0.f;
  for (int i = 0; i < 8; ++i) s += red[i];
  const float r = rsqrtf(s / 1024.f + 1e-6f);
  for (int j = 0; j < 4; ++j) out[threadIdx.x + 256 * j] = v[j] * r;
}

// A warp's share of a 2048-wide bf16 weight row: 8 x 16 bytes per lane.
constexpr int kProbeRowDim = 2048;
__device__ inline void probe_load_row(const unsigned short* W, int row, int lane, uint4 (&wv)[8]) {
  const uint4* wr = reinterpret_cast<const uint4*>(W + size_t(row) * kProbeRowDim);
  for (int i = 0; i < 8; ++i) wv[i] = wr[lane + 32 * i];
}
// The row's dot product with x (fp32, 2048), every lane getting the sum.
__device__ inline float probe_dot_row(const uint4 (&wv)[8], const float* x, int lane) {
  float s = 0.f;
  for (int i = 0; i < 8; ++i) {
    const unsigned short* h = reinterpret_cast<const unsigned short*>(&wv[i]);
    const int k0 = 8 * (lane + 32 * i);
    for (int j = 0; j < 8; ++j) s += __uint_as_float(unsigned(h[j]) << 16) * x[k0 + j];
  }
  for (int o = 16; o; o >>= 1) s += __shfl_xor_sync(~0u, s, o);
  return s;
}
#endif
