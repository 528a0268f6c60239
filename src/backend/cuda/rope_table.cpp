// YaRN inverse frequencies and the bf16 cos/sin tables (spec section 3), on the host.
#include <cmath>
#include <numbers>

#include "backend/cuda/cuda_ops.h"
#include "core/bf16.h"
#include "core/error.h"

namespace atlas::cuda {

namespace {

// Python-side helpers of the official code, in double like Python floats.
double correction_dim(double rotations, int dim, double base, int max_pos) {
  return dim * std::log(max_pos / (rotations * 2.0 * std::numbers::pi)) / (2.0 * std::log(base));
}

double get_mscale(double scale, double mscale) {
  return scale <= 1.0 ? 1.0 : 0.1 * mscale * std::log(scale) + 1.0;
}

}  // namespace

std::vector<float> yarn_inv_freq(const YarnParams& p) {
  if (p.rope_dim <= 0 || p.rope_dim % 2) throw Error("cuda: yarn_inv_freq: rope_dim: must be even and > 0");
  if (!(p.theta > 1.0)) throw Error("cuda: yarn_inv_freq: rope_theta: must be > 1");
  if (!(p.factor > 0.0)) throw Error("cuda: yarn_inv_freq: factor: must be > 0");
  const int dim = p.rope_dim, half = dim / 2;
  double low = std::floor(correction_dim(p.beta_fast, dim, p.theta, p.original_max_position));
  double high = std::ceil(correction_dim(p.beta_slow, dim, p.theta, p.original_max_position));
  low = std::max(low, 0.0);
  high = std::min(high, double(dim - 1));
  if (low == high) high += 0.001;
  const float base = float(p.theta), factor = float(p.factor);
  const float range = float(high - low);
  std::vector<float> inv(half);
  for (int k = 0; k < half; ++k) {
    // torch: base ** (arange(0, dim, 2).float() / dim), all fp32.
    const float e = float(2 * k) / float(dim);
    const float pw = std::pow(base, e);
    const float f_extra = 1.0f / pw;
    const float f_inter = 1.0f / (factor * pw);
    float ramp = (float(k) - float(low)) / range;
    ramp = std::min(std::max(ramp, 0.0f), 1.0f);
    const float mask = 1.0f - ramp;  // inv_freq_mask (extrapolation weight)
    inv[k] = f_inter * (1.0f - mask) + f_extra * mask;
  }
  return inv;
}

RopeTable build_rope_table(const YarnParams& p, int max_positions) {
  if (max_positions <= 0) throw Error("cuda: build_rope_table: max_positions: must be > 0");
  const std::vector<float> inv = yarn_inv_freq(p);
  const int half = int(inv.size());
  const float amp = float(get_mscale(p.factor, p.mscale) / get_mscale(p.factor, p.mscale_all_dim));
  RopeTable t;
  t.max_positions = max_positions;
  t.half = half;
  t.cos.resize(size_t(max_positions) * half);
  t.sin.resize(size_t(max_positions) * half);
  for (int pos = 0; pos < max_positions; ++pos)
    for (int k = 0; k < half; ++k) {
      const float ang = float(pos) * inv[k];
      t.cos[size_t(pos) * half + k] = f32_to_bf16(std::cos(ang) * amp);
      t.sin[size_t(pos) * half + k] = f32_to_bf16(std::sin(ang) * amp);
    }
  return t;
}

}  // namespace atlas::cuda
