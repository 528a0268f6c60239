// CPU kernels on raw pointers. Every reduction runs in a fixed order that depends only on
// the reduction length, never on the thread count or on which other rows share the call:
// a row's result is bit-identical whether it is computed alone or inside a batch.
#pragma once

#include <cstdint>

#include "core/dtype.h"

namespace atlas::cpu {

// A weight matrix as stored in the checkpoint, PyTorch Linear layout: W[N, K], y = x W^T.
struct Weight {
  DType dtype = DType::F32;  // F32, F16 or BF16; converted to f32 on the fly
  const void* data = nullptr;
  int64_t rows = 0;  // N (out features)
  int64_t cols = 0;  // K (in features)
};

// y[M, N] = x[M, K] . W[N, K]^T, fp32 accumulation, fixed order (8 interleaved partial sums
// combined pairwise). If round_output, each y is rounded to bf16 (a bf16 GEMM's output).
void linear(const float* x, int64_t M, const Weight& w, float* y, bool round_output);

// Row r of a weight as float32 (the embedding lookup).
void weight_row(const Weight& w, int64_t r, float* out);
// One element of a 1-D weight (norm scales) as float32.
void weight_vector(const Weight& w, float* out);  // w.rows elements (cols == 1)

// Round n values to bf16 in place.
void round_bf16_inplace(float* x, int64_t n);

// RMSNorm over rows of width n. f32 mode: y = x * rsqrt(mean(x^2) + eps) * w.
// bf16 mode (the official code): y = bf16(w * bf16(x * rsqrt(mean(x^2) + eps))).
void rmsnorm(const float* x, int64_t rows, int64_t n, const float* w, double eps, bool bf16, float* y);

// Fixed-order sum and dot product (the building blocks of the kernels above).
float dot_f32(const float* a, const float* b, int64_t n);

}  // namespace atlas::cpu
