// Launcher for MLA decode attention (absorbed form).
#include <string>

#include "backend/cuda/cuda_internal.h"
#include "backend/cuda/kernels/mla_decode.cuh"

namespace atlas::cuda {

using namespace detail;

static_assert(kMlaLatent == kern::kMlaLatentDim && kMlaWidth == kern::kMlaWidthDim);

size_t mla_decode_workspace_floats(int rows, int heads, int max_length, int split_tokens) {
  if (rows <= 0 || heads <= 0 || max_length <= 0 || split_tokens <= 0) return 1;
  const int64_t splits = (int64_t(max_length) + split_tokens - 1) / split_tokens;
  return size_t(int64_t(rows) * splits * heads * kern::kMlaPartial);
}

void mla_decode(const MlaDecodeArgs& a) {
  const char* op = "mla_decode";
  require(a.heads > 0 && a.heads <= kern::kMlaMaxHeads, op, "heads",
          "must be in [1, 16] for this kernel, got " + std::to_string(a.heads));
  require(a.split_tokens > 0 && a.split_tokens <= kern::kMlaThreads, op, "split_tokens",
          "must be in [1, 256], got " + std::to_string(a.split_tokens));
  require(a.rows >= 0, op, "rows", "must be >= 0");
  require(a.max_length > 0, op, "max_length", "must be > 0");
  require(a.cache_row_stride >= int64_t(a.max_length) * kMlaWidth || a.rows <= 1, op,
          "cache_row_stride", "smaller than max_length * 576");
  require(a.scale > 0.0f, op, "scale", "must be > 0");
  require(a.q && a.latent_cache && a.lengths && a.out && a.workspace, op, "pointers",
          "q, latent_cache, lengths, out, workspace must be set");
  if (a.rows == 0) return;
  cudaStream_t s = stream_of(a.stream);
  const int max_splits = (a.max_length + a.split_tokens - 1) / a.split_tokens;
  kern::mla_split_kernel<<<dim3(max_splits, a.rows), kern::kMlaThreads, 0, s>>>(
      a.q, a.latent_cache, a.cache_row_stride, a.lengths, a.max_length, a.heads, a.scale,
      a.split_tokens, max_splits, a.workspace, error_flag());
  check_launch(op);
  kern::mla_merge_kernel<<<a.rows, kern::kMlaThreads, 0, s>>>(a.workspace, a.lengths, a.max_length,
                                                              a.heads, a.split_tokens, max_splits, a.out);
  check_launch(op);
}

}  // namespace atlas::cuda
