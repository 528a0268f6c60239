// The MLA latent KV cache: per layer, per batch row and per token, the normalised latent
// (kv_lora_rank values) followed by the rotated shared rope key (qk_rope_head_dim values):
// 576 floats per token per layer for DeepSeek-V2-Lite, not the expanded per-head K/V.
//
// All rows share one timeline (left padding makes every row the same length, as
// transformers' generate does); a per-row key mask says which slots hold real tokens.
#pragma once

#include <cstdint>
#include <vector>

#include "model/config.h"
#include "model/model.h"

namespace atlas {

class KVCache final : public Cache {
 public:
  KVCache(const ModelConfig& c, int64_t n_layers, int64_t batch, int64_t capacity);

  int64_t batch() const override { return batch_; }
  int64_t capacity() const override { return capacity_; }
  int64_t length() const override { return length_; }  // tokens stored so far
  int64_t width() const { return width_; }    // kv_lora_rank + qk_rope_head_dim

  // Slot of (layer index within the loaded range, row, position).
  float* slot(int64_t layer, int64_t b, int64_t pos) {
    return data_.data() + ((layer * batch_ + b) * capacity_ + pos) * width_;
  }
  const float* slot(int64_t layer, int64_t b, int64_t pos) const {
    return data_.data() + ((layer * batch_ + b) * capacity_ + pos) * width_;
  }
  uint8_t key_mask(int64_t b, int64_t pos) const { return mask_[size_t(b * capacity_ + pos)]; }

  // Reserves T new positions with their key mask [B, T] (1 = real token) and returns the
  // first new position. The model then fills the slots of every layer.
  int64_t append(int64_t T, const uint8_t* mask_bt);
  void reset() { length_ = 0; }

 private:
  int64_t n_layers_, batch_, capacity_, width_, length_ = 0;
  std::vector<float> data_;
  std::vector<uint8_t> mask_;
};

}  // namespace atlas
