// A trace: what one forward pass of one sequence did, as the seed's full-depth trace
// records it. Hidden stages (embedding, every layer's output, the final norm), every gate's
// logits, top-k ids and weights, every layer's MLA latent, and the logits.
//
// TraceRecorder subscribes to the model's hooks, keeps copies, and produces
//  - tensors(): the --dump tensors, named  hidden.{s}  router.{l}.logits|topk_ids|topk_weights
//    mla.{l}.latent  logits  (see docs/trace.md for shapes);
//    and any hooks TraceOptions::record names, under the hook's own name;
//  - summary(): per stage shape/dtype/mean/std/min/max/L2 and the stage hash (model/digest.h),
//    per gate SHA-256 of the ordered ids and of the weights, and per-expert load and weighted load;
//    per recorded hook its shape, dtype and SHA-256.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "core/json.h"
#include "io/safetensors.h"
#include "model/model.h"
#include "model/hooks.h"

namespace atlas {

struct TraceOptions {
  bool keep_logits = true;   // logits are [T, V]: large for the real vocabulary
  bool keep_latents = true;
  // Further hooks to keep under their own names (exact names or globs; `atlas trace --record`),
  // after the standard tensors in firing order.
  std::vector<std::string> record;
};

// Each --record pattern must match a hook this run fires (errors name the pattern).
void check_record_patterns(const std::vector<std::string>& patterns, const ModelConfig& cfg, const LayerRange& layers);

class TraceRecorder {
 public:
  TraceRecorder(const Model& model, TraceOptions opts = {});
  // Subscribes to the hooks it needs. Expects a batch of one row.
  void attach(Hooks& hooks);

  std::vector<TensorToWrite> tensors() const;  // deterministic order: hidden, router, mla, logits
  ojson summary() const;                       // "stages" and "gates"

  struct Stored {
    std::string name;  // dump name
    DType dtype;
    std::vector<int64_t> shape;  // batch dimension dropped
    std::vector<float> f32;
    std::vector<int32_t> i32;
  };
  const Stored* find(const std::string& dump_name) const;
  // The hooks kept for TraceOptions::record, in firing order.
  std::vector<std::string> recorded_names() const;

 private:
  void keep(const std::string& dump_name, const HookTensor& t);
  const Model& model_;
  TraceOptions opts_;
  std::map<std::string, Stored> stored_;
  std::vector<std::string> order_;
};

// Summary statistics of a float tensor (double accumulation, fixed order).
ojson tensor_stats(const std::vector<float>& v, const std::vector<int64_t>& shape);

}  // namespace atlas
