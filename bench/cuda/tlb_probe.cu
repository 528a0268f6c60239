// Address-translation probe (a measurement, not part of atlas; session 15): do the small
// single-block kernels of a batch-1 decode step (norms, routing, the latent cache: 3-8 us each
// in the CUPTI timeline where launch_floor's norm takes ~1 us) pay for TLB misses? A decode
// step walks ~4.8 GB of weights spread over the 31 GB model, so by the time a layer's norm
// reads its 4 KB weight row, the translation for that page is likely gone.
// Each variant times a chain of kernel pairs [touch, work] and reports the work kernel's own
// duration, measured inside it (%globaltimer: the earliest block start to the latest block
// end, so launch and queueing are left out), as the median over the chain:
//   touch   one 4-byte load in each of kTouch distinct 2 MB pages, spread over `span` bytes
//           ("far": 24 GB, one page per 2 MB, more pages than any TLB level holds; "near": the
//           same number of loads inside 24 MB, 12 pages)
//   work    a norm (one block: 4 KB row + 4 KB weight, a block reduce, 4 KB out) or an 8 MB GEMV
//           (256 blocks, a warp per row), its weights at a page the touch kernel did not load
//   build/bench/cuda/atlas_tlb_probe
#include "probe_util.h"

#include <array>
#include <cstdint>

constexpr int kChain = 48;
constexpr int kDim = kProbeRowDim, kRows = 2048;
constexpr size_t kPage = size_t(2) << 20;
constexpr int kTouch = 12288;           // pages the "far" touch kernel loads from
constexpr size_t kFar = kTouch * kPage;  // 24 GB

struct Span {
  unsigned long long start, end;
};

__device__ __forceinline__ void span_begin(Span* s) {
  if (threadIdx.x == 0) atomicMin(&s->start, global_timer_ns());
}
__device__ __forceinline__ void span_end(Span* s) {
  __syncthreads();
  if (threadIdx.x == 0) {
    __threadfence();
    atomicMax(&s->end, global_timer_ns());
  }
}

// One load per `stride` bytes from base, kTouch loads; the sum goes to sink (never zero-skipped).
__global__ void k_touch(const char* base, size_t stride, unsigned* sink) {
  const size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= kTouch) return;
  const unsigned v = *reinterpret_cast<const volatile unsigned*>(base + i * stride);
  if (v == 0xdeadbeefu) atomicAdd(sink, v);
}

__global__ void k_norm(const float* in, float* out, const float* w, Span* span) {
  span_begin(span);
  probe_norm(in, out, w);
  span_end(span);
}

// kSmem: the GEMV holding dynamic shared memory (as atlas's GEMMs do: 48-198 KB), so that the
// SM's L1 / shared split differs from the norm's; its span is not recorded.
template <bool kSmem>
__global__ void k_gemv(const unsigned short* W, const float* x, float* out, Span* span) {
  extern __shared__ float big[];
  if (kSmem && threadIdx.x == 0) big[0] = x[0];
  if (!kSmem) span_begin(span);
  const int row = blockIdx.x * 8 + (threadIdx.x >> 5), lane = threadIdx.x & 31;
  uint4 wv[8];
  probe_load_row(W, row, lane, wv);
  const float s = probe_dot_row(wv, x, lane);
  if (kSmem) __syncthreads();
  if (lane == 0) out[row] = s * 1e-3f + (kSmem ? big[0] * 0.f : 0.f);
  if (!kSmem) span_end(span);
}

int main() {
  cudaStream_t s;
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  char* far;  // the touch region, then the work kernels' weights past it
  const size_t weights = size_t(kChain) * 2 * kRows * kDim * 2;  // 2 x 8 MB per link, distinct
  CK(cudaMalloc(&far, kFar + weights));
  CK(cudaMemset(far, 0, kFar + weights));
  float* act;
  CK(cudaMalloc(&act, 2 * kChain * kDim * sizeof(float)));
  CK(cudaMemset(act, 0, 2 * kChain * kDim * sizeof(float)));
  Span* spans;
  CK(cudaMalloc(&spans, kChain * sizeof(Span)));
  unsigned* sink;
  CK(cudaMalloc(&sink, sizeof(unsigned)));
  const auto a = [&](int i) { return act + size_t(i % (2 * kChain)) * kDim; };
  // Link i's weights: past the touch region, 16 MB apart (an 8 MB GEMV matrix, or a norm row at
  // the start of its own page).
  const auto wt = [&](int i) { return far + kFar + size_t(i) * 2 * kRows * kDim * 2; };

  // touch: 0 none, 1 near (12 pages), 2 far (12288 pages). Returns the median work span, us.
  const auto run = [&](int touch, bool gemv) {
    std::vector<Span> h(kChain, Span{~0ull, 0ull});
    for (int rep = 0; rep < 3; ++rep) {  // the last of three: the first two warm code and L2 state alike
      CK(cudaMemcpy(spans, h.data(), kChain * sizeof(Span), cudaMemcpyHostToDevice));
      for (int i = 0; i < kChain; ++i) {
        if (touch) k_touch<<<kTouch / 256, 256, 0, s>>>(far, touch == 2 ? kPage : 2048, sink);
        if (gemv)
          k_gemv<false><<<kRows / 8, 256, 0, s>>>(reinterpret_cast<const unsigned short*>(wt(i)), a(i), a(i + 1), spans + i);
        else
          k_norm<<<1, 256, 0, s>>>(a(i), a(i + 1), reinterpret_cast<const float*>(wt(i)), spans + i);
      }
      CK(cudaStreamSynchronize(s));
    }
    std::vector<Span> d(kChain);
    CK(cudaMemcpy(d.data(), spans, kChain * sizeof(Span), cudaMemcpyDeviceToHost));
    std::vector<float> us;
    for (const Span& x : d) us.push_back(float(x.end - x.start) / 1000.f);
    std::sort(us.begin(), us.end());
    return std::array<float, 3>{us.front(), us[us.size() / 2], us.back()};
  };
  std::printf("work kernel's own span, us (min / median / max of %d links; %%globaltimer)\n", kChain);
  for (const bool gemv : {false, true})
    for (int touch = 0; touch < 3; ++touch) {
      const auto r = run(touch, gemv);
      std::printf("%-5s after %-26s %7.2f %7.2f %7.2f\n", gemv ? "gemv" : "norm",
                  touch == 0 ? "nothing" : touch == 1 ? "12288 loads in 12 pages" : "12288 loads in 12288 pages",
                  r[0], r[1], r[2]);
    }
  // The touch kernel's own cost (the price of a TLB miss per page, at full parallelism).
  for (int touch = 1; touch < 3; ++touch)
    std::printf("touch %-26s %7.2f us per launch\n", touch == 1 ? "near" : "far", median_us(s, 2, 9, [&] {
                  k_touch<<<kTouch / 256, 256, 0, s>>>(far, touch == 2 ? kPage : 2048, sink);
                }));

  // Shared-memory configuration: pairs [GEMV, norm] in a graph, per pair; the GEMV without
  // shared memory, with 160 KB (the SM's split must change between the two kernels unless the
  // norm asks for the same carveout), and with the norm's carveout set to max shared.
  CK(cudaFuncSetAttribute(k_gemv<true>, cudaFuncAttributeMaxDynamicSharedMemorySize, 160 << 10));
  const auto pairs = [&](int smem) {
    return graph_us_per_launch(s, kChain, [&] {  // per pair
      for (int i = 0; i < kChain; ++i) {
        if (smem)
          k_gemv<true><<<kRows / 8, 256, smem, s>>>(reinterpret_cast<const unsigned short*>(wt(i)), a(i), a(i + 1),
                                                    spans + i);
        else
          k_gemv<false><<<kRows / 8, 256, 0, s>>>(reinterpret_cast<const unsigned short*>(wt(i)), a(i), a(i + 1),
                                                  spans + i);
        k_norm<<<1, 256, 0, s>>>(a(i + 1), a(i + 2), reinterpret_cast<const float*>(wt(i) + kPage), spans + i);
      }
    });
  };
  std::printf("graph of [gemv, norm] pairs, us per pair:\n");
  std::printf("  gemv without shared memory            %7.2f\n", pairs(0));
  std::printf("  gemv with 160 KB shared memory        %7.2f\n", pairs(160 << 10));
  CK(cudaFuncSetAttribute(k_norm, cudaFuncAttributePreferredSharedMemoryCarveout, 100));
  std::printf("  the same, norm's carveout max shared  %7.2f\n", pairs(160 << 10));
  std::printf("  gemv without shared memory, same norm %7.2f\n", pairs(0));
  CK(cudaDeviceSynchronize());
  return 0;
}
