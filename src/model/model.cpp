#include "model/model.h"

#include "core/error.h"

namespace atlas {

std::string compute_name(Compute c) { return c == Compute::F32 ? "f32" : "bf16"; }

Compute parse_compute(const std::string& s) {
  if (s == "f32") return Compute::F32;
  if (s == "bf16") return Compute::BF16;
  fail("--compute", {}, "unknown value \"" + s + "\" (expected f32 or bf16)");
}

}  // namespace atlas
