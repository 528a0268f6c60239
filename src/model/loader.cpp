#include "model/loader.h"

#include "core/error.h"
#include "model/deepseek_v2.h"

namespace atlas {

std::unique_ptr<Model> load_model(const Checkpoint& ck, const ModelOptions& opts) {
  if (opts.backend == "cpu")
    return std::make_unique<DeepSeekV2>(ck.config(), ck.layers(),
                                        [&ck](const std::string& n) -> const TensorView& { return ck.tensor(n); },
                                        opts.compute);
  if (opts.backend == "cuda") fail("--backend", {}, "this build has no CUDA forward pass yet (use --backend cpu)");
  fail("--backend", {}, "unknown value \"" + opts.backend + "\" (expected cpu or cuda)");
}

}  // namespace atlas
