// Launchers for the per-token SHA-256 digests (kernels/sha256.cuh): bf16 and fp32 hidden rows.
#include <cstdint>

#include "backend/cuda/cuda_internal.h"
#include "backend/cuda/kernels/sha256.cuh"

namespace atlas::cuda {

using namespace detail;

namespace {

constexpr int kDigestThreads = 128;

template <class T>
void launch_digest(const TokenDigestArgsT<T>& a, const char* op) {
  require(a.rows >= 0, op, "rows", "must be >= 0");
  require(a.dim > 0, op, "dim", "must be > 0");
  const int64_t stride = a.row_stride ? a.row_stride : a.dim;
  require(stride >= a.dim, op, "row_stride", "smaller than dim");
  require(a.x && a.out, op, "pointers", "x and out must be set");
  if (a.rows == 0) return;
  // 16-byte loads need every full block of every row 16-byte aligned: the base, and a row
  // stride that is a whole number of 16-byte units (a block is 32 bytes of bf16, 64 of fp32).
  constexpr int64_t per16 = 16 / int64_t(sizeof(T));
  const bool vec = reinterpret_cast<uintptr_t>(a.x) % 16 == 0 && stride % per16 == 0;
  const int64_t blocks = (a.rows + kDigestThreads - 1) / kDigestThreads;
  require(blocks <= 0x7fffffff, op, "rows", "too many rows for one launch");
  launch(kern::token_digest_kernel<T>, unsigned(blocks), kDigestThreads, 0, stream_of(a.stream), a.x, stride, a.rows,
                                                                                             a.dim, vec, a.out);
  check_launch(op);
}

}  // namespace

void token_digests_bf16(const TokenDigestBf16Args& a) { launch_digest(a, "token_digests_bf16"); }
void token_digests_f32(const TokenDigestF32Args& a) { launch_digest(a, "token_digests_f32"); }

}  // namespace atlas::cuda
