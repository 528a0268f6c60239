#include "model/kv_cache.h"

#include "core/error.h"

namespace atlas {

KVCache::KVCache(const ModelConfig& c, int64_t n_layers, int64_t batch, int64_t capacity)
    : n_layers_(n_layers), batch_(batch), capacity_(capacity), width_(c.latent_dim()) {
  data_.assign(size_t(n_layers * batch * capacity * width_), 0.0f);
  mask_.assign(size_t(batch * capacity), 0);
}

int64_t KVCache::append(int64_t T, const uint8_t* mask_bt) {
  if (length_ + T > capacity_)
    fail("kv cache: " + std::to_string(length_ + T) + " tokens exceed its capacity of " +
         std::to_string(capacity_));
  const int64_t start = length_;
  for (int64_t b = 0; b < batch_; ++b)
    for (int64_t t = 0; t < T; ++t) mask_[size_t(b * capacity_ + start + t)] = mask_bt[b * T + t];
  length_ += T;
  return start;
}

}  // namespace atlas
