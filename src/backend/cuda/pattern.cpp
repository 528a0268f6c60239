// Host side of the blocks.{L}.attn.hook_pattern hook on the CUDA backend: the device computes
// probabilities over each row's packed cache slots (padding is never stored); observers get the
// CPU backend's layout, [B, heads, T, Tk] over the timeline's token positions, with zeros for
// padding keys and for keys a query cannot see.
#include <string>

#include "backend/cuda/cuda_ops.h"
#include "core/error.h"

namespace atlas::cuda {

std::vector<float> pattern_to_timeline(const std::vector<float>& slot_probs, const std::vector<int32_t>& key_slot,
                                       const int32_t* qlen, int64_t B, int64_t T, int64_t heads, int64_t slots,
                                       int64_t Tk) {
  if (B < 0 || T < 0 || heads <= 0 || slots < 0 || Tk < T || int64_t(slot_probs.size()) != B * T * heads * slots ||
      int64_t(key_slot.size()) != B * Tk)
    throw Error("cuda: pattern_to_timeline: sizes disagree (B=" + std::to_string(B) + " T=" + std::to_string(T) +
                " heads=" + std::to_string(heads) + " slots=" + std::to_string(slots) + " Tk=" + std::to_string(Tk) +
                ")");
  std::vector<float> out(static_cast<size_t>(B * heads * T * Tk), 0.0f);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < T; ++t) {
      const int64_t m = b * T + t, visible = qlen[m];
      for (int64_t h = 0; h < heads; ++h) {
        const float* src = slot_probs.data() + (m * heads + h) * slots;
        float* dst = out.data() + ((b * heads + h) * T + t) * Tk;
        for (int64_t j = 0; j < Tk; ++j) {
          const int32_t s = key_slot[size_t(b * Tk + j)];
          if (s >= 0 && s < visible && s < slots) dst[j] = src[s];
        }
      }
    }
  return out;
}

}  // namespace atlas::cuda
