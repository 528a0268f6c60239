// Builds a Model for a verified checkpoint on the chosen backend. The checkpoint must outlive
// the model (the CPU backend reads weights straight from its memory-mapped files).
#pragma once

#include <memory>
#include <string>

#include "io/checkpoint.h"
#include "model/model.h"

namespace atlas {

struct ModelOptions {
  std::string backend = "cpu";  // "cpu" | "cuda"
  Compute compute = Compute::F32;
  int device = 0;  // CUDA device index
  // CUDA only: false = the fast mode (cuBLASLt dense GEMMs, whose algorithm may change with the
  // batch size, so a row's bits may depend on its batch). The CPU backend is always invariant.
  bool batch_invariant = true;
};

std::unique_ptr<Model> load_model(const Checkpoint& ck, const ModelOptions& opts);

}  // namespace atlas
