#include "model/rope.h"

#include <algorithm>
#include <cmath>

#include "core/bf16.h"

namespace atlas {

std::vector<float> rope_inv_freq(const ModelConfig& c) {
  const int64_t d = c.qk_rope_head_dim;
  const float base = float(c.rope_theta);
  std::vector<float> inv(static_cast<size_t>(d / 2));
  for (int64_t k = 0; k < d / 2; ++k) {
    float e = float(2 * k) / float(d);
    inv[k] = 1.0f / std::pow(base, e);
  }
  if (!c.rope_scaling) return inv;
  const auto& y = *c.rope_scaling;
  auto corr = [&](double rotations) {
    return (double(d) * std::log(double(y.original_max_position_embeddings) / (rotations * 2.0 * M_PI))) /
           (2.0 * std::log(c.rope_theta));
  };
  double low = std::max(std::floor(corr(y.beta_fast)), 0.0);
  double high = std::min(std::ceil(corr(y.beta_slow)), double(d - 1));
  if (low == high) high += 0.001;  // avoid a zero-width ramp
  const float factor = float(y.factor);
  for (int64_t k = 0; k < d / 2; ++k) {
    float ramp = (float(k) - float(low)) / (float(high) - float(low));
    ramp = std::clamp(ramp, 0.0f, 1.0f);
    float extra = inv[k];                                            // original frequency
    float inter = 1.0f / (factor * std::pow(base, float(2 * k) / float(d)));  // interpolated
    float mask = 1.0f - ramp;                                        // official: inv_freq_mask
    inv[k] = inter * (1.0f - mask) + extra * mask;
  }
  return inv;
}

void rope_cos_sin(const std::vector<float>& inv_freq, float amplitude, int64_t pos, bool bf16, float* cos_out,
                  float* sin_out) {
  const float t = float(pos);
  for (size_t k = 0; k < inv_freq.size(); ++k) {
    float a = t * inv_freq[k];
    float cv = float(std::cos(double(a))) * amplitude;
    float sv = float(std::sin(double(a))) * amplitude;
    cos_out[k] = bf16 ? round_bf16(cv) : cv;
    sin_out[k] = bf16 ? round_bf16(sv) : sv;
  }
}

void rope_rotate(float* x, int64_t dim, const float* cos, const float* sin, bool bf16) {
  for (int64_t k = 0; k < dim / 2; ++k) {
    float r0 = x[2 * k], r1 = x[2 * k + 1];
    if (bf16) {
      x[2 * k] = round_bf16(round_bf16(r0 * cos[k]) - round_bf16(r1 * sin[k]));
      x[2 * k + 1] = round_bf16(round_bf16(r1 * cos[k]) + round_bf16(r0 * sin[k]));
    } else {
      x[2 * k] = r0 * cos[k] - r1 * sin[k];
      x[2 * k + 1] = r1 * cos[k] + r0 * sin[k];
    }
  }
}

}  // namespace atlas
