// Rotary position embedding for the rope part of MLA queries and keys, with YaRN scaling.
#pragma once

#include <cstdint>
#include <vector>

#include "model/config.h"

namespace atlas {

// inv_freq[k], k < qk_rope_head_dim/2, in fp32 as the official code computes it: plain
// 1/base^(2k/d), or under YaRN a ramp between the original and the factor-divided
// frequencies between the correction dims low = floor(corr(beta_fast)) and
// high = ceil(corr(beta_slow)), corr(r) = d ln(L0 / (2 pi r)) / (2 ln base).
std::vector<float> rope_inv_freq(const ModelConfig& c);

// cos/sin for one position: angle_k = fp32(pos) * inv_freq[k] in fp32, times the YaRN
// amplitude (1.0 for DeepSeek-V2), rounded to bf16 when bf16 is set (the official table is
// returned in the activation dtype).
void rope_cos_sin(const std::vector<float>& inv_freq, float amplitude, int64_t pos, bool bf16, float* cos_out,
                  float* sin_out);

// Rotates adjacent pairs (x[2k], x[2k+1]) by angle_k in place. This is the official
// de-interleave + rotate-half written back in the checkpoint's own (interleaved) order: the
// same permutation hits q and k, so q.k is unchanged. bf16 mode rounds x*cos, x*sin and
// their sum, as the official bf16 code does.
void rope_rotate(float* x, int64_t dim, const float* cos, const float* sin, bool bf16);

}  // namespace atlas
