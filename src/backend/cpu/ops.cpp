#include "backend/cpu/ops.h"

#include <omp.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "core/bf16.h"
#include "core/error.h"

namespace atlas::cpu {
namespace {

// Eight interleaved partial sums, combined pairwise: the order depends on n only. The lane
// loop vectorises (lanes are independent), and -ffp-contract=off keeps mul and add separate
// so the result does not depend on whether the compiler chose FMA.
inline float dot8(const float* a, const float* b, int64_t n) {
  float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t k = 0;
  for (; k + 8 <= n; k += 8)
    for (int j = 0; j < 8; ++j) acc[j] += a[k + j] * b[k + j];
  for (int j = 0; k + j < n; ++j) acc[j] += a[k + j] * b[k + j];
  return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
}

void convert_row(const Weight& w, int64_t r, float* out) {
  const int64_t K = w.cols;
  switch (w.dtype) {
    case DType::F32:
      std::memcpy(out, static_cast<const float*>(w.data) + r * K, size_t(K) * 4);
      break;
    case DType::BF16: {
      const uint16_t* p = static_cast<const uint16_t*>(w.data) + r * K;
      for (int64_t k = 0; k < K; ++k) out[k] = bf16_to_f32(p[k]);
      break;
    }
    case DType::F16: {
      const uint16_t* p = static_cast<const uint16_t*>(w.data) + r * K;
      for (int64_t k = 0; k < K; ++k) out[k] = f16_to_f32(p[k]);
      break;
    }
    default:
      fail("cpu::linear: unsupported weight dtype " + std::string(dtype_name(w.dtype)));
  }
}

}  // namespace

float dot_f32(const float* a, const float* b, int64_t n) { return dot8(a, b, n); }

void weight_row(const Weight& w, int64_t r, float* out) { convert_row(w, r, out); }

void weight_vector(const Weight& w, float* out) {
  Weight flat = w;
  flat.cols = w.rows * w.cols;
  flat.rows = 1;
  convert_row(flat, 0, out);
}

void linear(const float* x, int64_t M, const Weight& w, float* y, bool round_output) {
  const int64_t N = w.rows, K = w.cols;
  // Blocks of weight rows are converted to f32 once and reused across the M inputs; each
  // output element is one dot8 over K, so tiling and threads never change its value.
  constexpr int64_t kBlock = 16;
  const int64_t nblocks = (N + kBlock - 1) / kBlock;
  // Threads only pay off past a few hundred thousand multiply-adds; the result is the same
  // either way.
  const bool parallel = M * N * K >= (int64_t(1) << 18);
#pragma omp parallel if (parallel)
  {
    std::vector<float> wbuf(size_t(kBlock * K));
#pragma omp for schedule(static)
    for (int64_t nb = 0; nb < nblocks; ++nb) {
      const int64_t n0 = nb * kBlock, n1 = std::min(N, n0 + kBlock);
      for (int64_t n = n0; n < n1; ++n) convert_row(w, n, wbuf.data() + (n - n0) * K);
      for (int64_t m = 0; m < M; ++m) {
        const float* xm = x + m * K;
        float* ym = y + m * N;
        for (int64_t n = n0; n < n1; ++n) {
          float v = dot8(xm, wbuf.data() + (n - n0) * K, K);
          ym[n] = round_output ? round_bf16(v) : v;
        }
      }
    }
  }
}

void round_bf16_inplace(float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) x[i] = round_bf16(x[i]);
}

void rmsnorm(const float* x, int64_t rows, int64_t n, const float* w, double eps, bool bf16, float* y) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * n;
    float* yr = y + r * n;
    // mean of squares in fp32, fixed order (torch: x.pow(2).mean(-1) in fp32).
    float ss = dot8(xr, xr, n);
    float var = ss / float(n);
    float inv = 1.0f / std::sqrt(var + float(eps));
    for (int64_t i = 0; i < n; ++i) {
      float v = xr[i] * inv;
      if (bf16) {
        yr[i] = round_bf16(w[i] * round_bf16(v));
      } else {
        yr[i] = w[i] * v;
      }
    }
  }
}

}  // namespace atlas::cpu
