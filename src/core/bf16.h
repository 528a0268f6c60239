// bfloat16 <-> float32, with the rounding PyTorch uses (round to nearest, ties to even;
// NaN stays NaN). The bf16 compute mode keeps values in float32 storage and rounds them with
// round_bf16() at exactly the points where the official model rounds.
#pragma once

#include <bit>
#include <cstdint>
#include <type_traits>

namespace atlas {

inline float bf16_to_f32(uint16_t h) { return std::bit_cast<float>(uint32_t(h) << 16); }

inline uint16_t f32_to_bf16(float f) {
  uint32_t u = std::bit_cast<uint32_t>(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x40);  // quiet NaN
  u += 0x7fffu + ((u >> 16) & 1u);
  return uint16_t(u >> 16);
}

inline float round_bf16(float f) { return bf16_to_f32(f32_to_bf16(f)); }

// Storage-element helpers for code templated on the element type (uint16_t = bf16 bits, or
// float): widen to f32 (exact), and store an f32 (bf16: one rounding; f32: unchanged).
inline float elem_to_f32(uint16_t h) { return bf16_to_f32(h); }
inline float elem_to_f32(float f) { return f; }
template <class T>
T f32_to_elem(float f) {
  if constexpr (std::is_same_v<T, float>)
    return f;
  else
    return f32_to_bf16(f);
}

// IEEE half precision (F16 checkpoints).
float f16_to_f32(uint16_t h);
uint16_t f32_to_f16(float f);

}  // namespace atlas
