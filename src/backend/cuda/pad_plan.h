// Padding computed once (the CUDA forward pass, cuda_model.cpp): which rows of a prefill's
// B x T a forward pass computes, and which row every other row is a copy of. Host code, no
// device: tested without a GPU (tests/cuda/test_cuda_pad_plan.cpp).
//
// A padding token's values depend on its id, its position, its visible length (the row's real
// tokens before it: attention reads the cache, where padding is never stored) and, when that
// length is > 0, its cache row; every other operation is per token. So padding tokens that agree
// on those compute the same bits, and one of them computed serves them all.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace atlas::cuda {

struct PadPlan {
  std::vector<int32_t> src_of;  // [B x T]: the computed row that row m is (or is a copy of)
  std::vector<int32_t> first;   // [rows()]: the flat row computed row r is taken from (ascending)
  int64_t rows() const { return int64_t(first.size()); }  // rows computed
};

// Every real row (mask != 0) is computed, in order; a padding row is a copy of the first padding
// row with the same (id, position, visible length, cache row if that length is > 0). The five
// spans hold one value per row (throws naming the field otherwise).
PadPlan plan_padding(std::span<const int32_t> ids, std::span<const int32_t> positions,
                     std::span<const int32_t> visible, std::span<const int32_t> cache_rows,
                     std::span<const uint8_t> mask);

}  // namespace atlas::cuda
