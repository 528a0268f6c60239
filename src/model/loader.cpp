#include "model/loader.h"

#include "core/error.h"
#include "model/deepseek_v2.h"
#ifdef ATLAS_HAVE_CUDA
#include "backend/cuda/cuda_model.h"
#endif

namespace atlas {

std::unique_ptr<Model> load_model(const Checkpoint& ck, const ModelOptions& opts) {
  if (opts.backend == "cpu")
    return std::make_unique<DeepSeekV2>(ck.config(), ck.layers(),
                                        [&ck](const std::string& n) -> const TensorView& { return ck.tensor(n); },
                                        opts.compute);
  if (opts.backend == "cuda") {
#ifdef ATLAS_HAVE_CUDA
    return cuda::make_cuda_model(ck, {.compute = opts.compute, .device = opts.device, .batch_invariant = opts.batch_invariant});
#else
    fail("--backend", {}, "this atlas was built without CUDA (nvcc was not found at configure time); use --backend cpu");
#endif
  }
  fail("--backend", {}, "unknown value \"" + opts.backend + "\" (expected cpu or cuda)");
}

}  // namespace atlas
