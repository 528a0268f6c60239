#include "model/model.h"

#include <cmath>

#include "core/error.h"

namespace atlas {

std::string compute_name(Compute c) { return c == Compute::F32 ? "f32" : "bf16"; }

Compute parse_compute(const std::string& s) {
  if (s == "f32") return Compute::F32;
  if (s == "bf16") return Compute::BF16;
  fail("--compute", {}, "unknown value \"" + s + "\" (expected f32 or bf16)");
}

std::vector<int32_t> greedy_rows(std::span<const float> logits, int64_t rows, int64_t vocab) {
  if (int64_t(logits.size()) < rows * vocab) fail("greedy_rows: logits shorter than rows x vocab");
  std::vector<int32_t> out(static_cast<size_t>(rows));
  for (int64_t r = 0; r < rows; ++r) {
    const float* x = logits.data() + r * vocab;
    int64_t best = 0;
    for (int64_t i = 0; i < vocab; ++i) {
      if (std::isnan(x[i])) fail("logits", "row " + std::to_string(r) + " token " + std::to_string(i), "NaN logit");
      if (x[i] > x[best]) best = i;  // strict: the first (lowest) id wins ties
    }
    out[size_t(r)] = int32_t(best);
  }
  return out;
}

}  // namespace atlas
