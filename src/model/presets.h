// Built-in model configurations for `atlas make-model`: checkpoints atlas creates itself.
//
//   tiny  the embedded default (README's main command): every DeepSeek-V2 feature on, ~1 MB
//   lite  exactly DeepSeek-V2-Lite's config.json (27 layers, 64 experts, 31.4 GB in bf16),
//         written as 4 shards like the released checkpoint: GPU benchmarks without downloads
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/json.h"

namespace atlas {

struct Preset {
  std::string name;
  json config;  // config.json content (json: keys sorted, as transformers writes them)
  // 0: one model.safetensors. Otherwise shards + index; a shard is closed as soon as it holds
  // at least this many bytes (with 8 GiB this reproduces the released Lite shard split).
  uint64_t max_shard_bytes = 0;
};

std::vector<std::string> preset_names();  // {"lite", "tiny"}
// The preset with its tensors stored as `dtype` (F32, F16 or BF16; config torch_dtype follows).
// Unknown names and dtypes are an atlas::Error naming --preset / --dtype.
Preset make_preset(const std::string& name, DType dtype = DType::BF16);

// "bfloat16" / "float16" / "float32" (config.json's torch_dtype), and back.
std::string torch_dtype_name(DType t);

}  // namespace atlas
