// The sampling contract of docs/decoding.md (section 3 and 4) as building blocks that compile
// both for the host and for the GPU (`__host__ __device__` under nvcc, plain inline C++
// elsewhere), plus a sequential host driver, sample_row(), that runs exactly the algorithm the
// CUDA kernel (backend/cuda/kernels/sample.cuh) runs in parallel.
//
// Why a second implementation next to decode::warp / inverse_cdf: those use nth_element and
// sorting, which do not map onto one thread block. This one is built from pieces whose
// parallel form is order-independent, so the kernel equals sample_row() by construction:
//   - exp_f32 with IEEE double + and * only (explicitly rounded intrinsics on the device);
//   - exact sums in an integer super-accumulator (carry-save 64-bit limbs, so the kernel can
//     add with shared-memory atomics in any order);
//   - top-k by radix select over an order-preserving key of the float bits (counts only);
//   - top-p by a radix search over the (s, id) order for the first token whose inclusive
//     exact cumulative probability does not round to <= float32(1 - p), with exact
//     per-bucket sums (a bisection on exact prefix sums, like the host code, just by digits);
//   - the draw as the float32 running sum over the survivors in ascending id.
// tests/decode/test_sample_core.cpp checks sample_row() against decode::warp + inverse_cdf
// (tokens, survivor ids, probabilities) over many random rows; tests/cuda checks the kernel
// against sample_row().
#pragma once

#include <bit>
#include <cmath>
#include <cstdint>
#include <vector>

#if defined(__CUDACC__)
#define ATLAS_HD __host__ __device__ __forceinline__
#else
#define ATLAS_HD inline
#endif

namespace atlas::sample_core {

// One row's parameters, as the contract forms them (32 bytes, the same layout on host and
// device: the CUDA backend uploads an array of these per step).
struct RowParams {
  double u = 0.0;               // the step's uniform in [0, 1) (RowSampler::uniform_at)
  float temperature = 1.0f;     // float32(T)
  float top_p_threshold = 0.0f; // float32(1.0 - top_p), 1 - top_p formed in double
  int64_t top_k = 0;            // 0 = off; >= V also off
  int32_t mode = 0;             // kGreedy: the row keeps its argmax; kSample: draw
  int32_t top_p_on = 0;         // top_p < 1
};
static_assert(sizeof(RowParams) == 32, "RowParams travels to the device as raw bytes");
constexpr int32_t kGreedy = 0, kSample = 1;

inline RowParams make_row_params(double temperature, double top_p, int64_t top_k, double u) {
  return {.u = u,
          .temperature = float(temperature),
          .top_p_threshold = float(1.0 - top_p),
          .top_k = top_k,
          .mode = kSample,
          .top_p_on = top_p < 1.0 ? 1 : 0};
}

// A row's result, one int32: the token (>= 0), or -(code + 8 * index) for bad logits, where
// index is the lowest offending token (0 for kNoFinite). decode_error() splits it.
enum ErrorCode : int32_t { kNanLogit = 1, kPosInfLogit = 2, kOverflow = 3, kNoFinite = 4 };
ATLAS_HD int32_t encode_error(int32_t code, int64_t index) { return -int32_t(code + 8 * index); }
inline const char* error_name(int32_t code) {
  switch (code) {
    case kNanLogit: return "NaN logit";
    case kPosInfLogit: return "+inf logit";
    case kOverflow: return "logit overflows to +inf after temperature";
    case kNoFinite: return "no finite logit (every token is -inf)";
  }
  return "unknown sampling error";
}

// ---- bit-exact scalar arithmetic (the device forms are the IEEE round-to-nearest intrinsics,
// so no contraction or fast-math can change them; the host builds with -ffp-contract=off) ----
ATLAS_HD uint32_t f2u(float f) {
#ifdef __CUDA_ARCH__
  return __float_as_uint(f);
#else
  return std::bit_cast<uint32_t>(f);
#endif
}
ATLAS_HD float u2f(uint32_t u) {
#ifdef __CUDA_ARCH__
  return __uint_as_float(u);
#else
  return std::bit_cast<float>(u);
#endif
}
ATLAS_HD double u2d(uint64_t u) {
#ifdef __CUDA_ARCH__
  return __longlong_as_double((long long)u);
#else
  return std::bit_cast<double>(u);
#endif
}
ATLAS_HD double dadd(double a, double b) {
#ifdef __CUDA_ARCH__
  return __dadd_rn(a, b);
#else
  return a + b;
#endif
}
ATLAS_HD double dsub(double a, double b) {
#ifdef __CUDA_ARCH__
  return __dsub_rn(a, b);
#else
  return a - b;
#endif
}
ATLAS_HD double dmul(double a, double b) {
#ifdef __CUDA_ARCH__
  return __dmul_rn(a, b);
#else
  return a * b;
#endif
}
ATLAS_HD double ddiv(double a, double b) {
#ifdef __CUDA_ARCH__
  return __ddiv_rn(a, b);
#else
  return a / b;
#endif
}
ATLAS_HD float fdiv(float a, float b) {
#ifdef __CUDA_ARCH__
  return __fdiv_rn(a, b);
#else
  return a / b;
#endif
}
ATLAS_HD float fsub(float a, float b) {
#ifdef __CUDA_ARCH__
  return __fsub_rn(a, b);
#else
  return a - b;
#endif
}
ATLAS_HD float fadd(float a, float b) {
#ifdef __CUDA_ARCH__
  return __fadd_rn(a, b);
#else
  return a + b;
#endif
}
ATLAS_HD float d2f(double d) {
#ifdef __CUDA_ARCH__
  return __double2float_rn(d);
#else
  return float(d);
#endif
}
ATLAS_HD double dfloor(double x) {
#ifdef __CUDA_ARCH__
  return ::floor(x);
#else
  return std::floor(x);
#endif
}
ATLAS_HD int clz32(uint32_t x) {  // x != 0
#ifdef __CUDA_ARCH__
  return __clz(x);
#else
  return std::countl_zero(x);
#endif
}

// decode::exp_f32, operation for operation (docs/decoding.md section 3).
ATLAS_HD float exp_f32(float x) {
  if (x < -104.0f) return 0.0f;
  const double kLog2e = 1.4426950408889634, kLn2Hi = 6.93147180369123816490e-01,
               kLn2Lo = 1.90821492927058770002e-10;
  const double xd = x;
  const double k = dfloor(dadd(dmul(xd, kLog2e), 0.5));
  const double r = dsub(dsub(xd, dmul(k, kLn2Hi)), dmul(k, kLn2Lo));
  // 1/13! .. 1/0! (the host code's constants; the compilers fold these divisions exactly).
  const double c[14] = {1.0 / 6227020800.0, 1.0 / 479001600.0, 1.0 / 39916800.0, 1.0 / 3628800.0, 1.0 / 362880.0,
                        1.0 / 40320.0,      1.0 / 5040.0,      1.0 / 720.0,      1.0 / 120.0,     1.0 / 24.0,
                        1.0 / 6.0,          1.0 / 2.0,         1.0,              1.0};
  double p = c[0];
  for (int i = 1; i < 14; ++i) p = dadd(dmul(p, r), c[i]);
  return d2f(dmul(p, u2d(uint64_t(int64_t(k) + 1023) << 52)));
}

// Order-preserving key of a non-NaN float, -0 folded onto +0 (they compare equal as floats,
// and the contract orders by float value, then id): a < b as floats <=> key(a) < key(b).
ATLAS_HD uint32_t order_key(float s) {
  uint32_t b = f2u(s);
  if ((b & 0x7fffffffu) == 0) b = 0;
  return (b >> 31) ? ~b : (b | 0x80000000u);
}
ATLAS_HD float key_value(uint32_t k) { return u2f((k >> 31) ? (k & 0x7fffffffu) : ~k); }
constexpr uint32_t kNegInfKey = 0x007fffffu;  // order_key(-inf): every finite key is larger

// ---- exact sums of non-negative float32 values below 2 -----------------------------------
// In units of 2^-149 (the smallest subnormal), a value is mant * 2^shift with shift <= 126.
// Carry-save: w[i] collects 32-bit pieces at weight 2^(32 i), so any number of additions in
// any order (including atomics) gives the same integer; n < 2^31 values keep every limb
// below 2^63. normalize() propagates the carries into 32-bit digits (6 x 32 = 192 bits >
// 150 + 31).
constexpr int kLimbs = 6;
struct Acc {
  uint64_t w[kLimbs];
};
struct Exact {
  uint32_t d[kLimbs];
};
// The two pieces of a float: lo at limb `limb`, hi at limb + 1 (either may be 0).
ATLAS_HD void acc_pieces(float v, int& limb, uint32_t& lo, uint32_t& hi) {
  const uint32_t bits = f2u(v), biased = bits >> 23, frac = bits & 0x7fffffu;
  const uint64_t mant = biased == 0 ? frac : (frac | 0x800000u);
  const int shift = biased == 0 ? 0 : int(biased) - 1;
  limb = shift / 32;
  const uint64_t x = mant << (shift % 32);
  lo = uint32_t(x);
  hi = uint32_t(x >> 32);
}
ATLAS_HD void acc_zero(Acc& a) {
  for (int i = 0; i < kLimbs; ++i) a.w[i] = 0;
}
ATLAS_HD void acc_add(Acc& a, float v) {  // v in [0, 2)
  int limb;
  uint32_t lo, hi;
  acc_pieces(v, limb, lo, hi);
  a.w[limb] += lo;
  a.w[limb + 1] += hi;
}
ATLAS_HD void acc_add(Acc& a, const Acc& b) {
  for (int i = 0; i < kLimbs; ++i) a.w[i] += b.w[i];
}
ATLAS_HD Exact normalize(const Acc& a) {
  Exact e;
  uint64_t carry = 0;
  for (int i = 0; i < kLimbs; ++i) {
    const uint64_t t = a.w[i] + carry;  // < 2^63 + 2^32
    e.d[i] = uint32_t(t);
    carry = t >> 32;
  }
  return e;
}
ATLAS_HD int cmp(const Exact& a, const Exact& b) {
  for (int i = kLimbs - 1; i >= 0; --i)
    if (a.d[i] != b.d[i]) return a.d[i] < b.d[i] ? -1 : 1;
  return 0;
}
ATLAS_HD Exact twice(const Exact& a) {  // a < 2^191
  Exact e;
  uint32_t carry = 0;
  for (int i = 0; i < kLimbs; ++i) {
    e.d[i] = (a.d[i] << 1) | carry;
    carry = a.d[i] >> 31;
  }
  return e;
}
ATLAS_HD bool exact_bit(const Exact& a, int pos) { return (a.d[pos / 32] >> (pos % 32)) & 1u; }
ATLAS_HD bool any_below(const Exact& a, int pos) {  // any set bit strictly below pos
  for (int i = 0; i < kLimbs && 32 * i < pos; ++i) {
    const int n = pos - 32 * i;
    const uint32_t m = n >= 32 ? 0xffffffffu : ((1u << n) - 1u);
    if (a.d[i] & m) return true;
  }
  return false;
}
ATLAS_HD uint64_t extract(const Exact& a, int lo, int n) {  // n <= 53 bits starting at bit lo
  uint64_t r = 0;
  for (int j = 0; j < n; ++j)
    if (exact_bit(a, lo + j)) r |= uint64_t(1) << j;
  return r;
}
ATLAS_HD double pow2(int e) { return u2d(uint64_t(e + 1023) << 52); }  // e in [-1022, 1023]
// Correctly rounded (to nearest, ties to even) double of the exact value.
ATLAS_HD double to_double(const Exact& a) {
  int top = -1;
  for (int i = kLimbs - 1; i >= 0 && top < 0; --i)
    if (a.d[i]) top = 32 * i + 31 - clz32(a.d[i]);
  if (top < 0) return 0.0;
  if (top < 53) return dmul(double(extract(a, 0, top + 1)), pow2(-149));  // exact
  const int s = top + 1 - 53;
  uint64_t m = extract(a, s, 53);
  if (exact_bit(a, s - 1) && (any_below(a, s - 1) || (m & 1))) ++m;  // 2^53 is still exact
  return dmul(double(m), pow2(s - 149));
}

// Top-p's test "float32(x) <= threshold" on an exact x, as an integer comparison:
// 2x < t + t' or (2x == t + t' and t's last mantissa bit is even), t' the next float above t.
struct TopPBound {
  Exact bound2;
  bool tie_down;
};
ATLAS_HD TopPBound make_bound(float threshold) {  // threshold in (0, 1]
  Acc a;
  acc_zero(a);
  acc_add(a, threshold);
  acc_add(a, u2f(f2u(threshold) + 1u));
  return {normalize(a), (f2u(threshold) & 1u) == 0};
}
ATLAS_HD bool removable(const Exact& x, const TopPBound& b) {
  const int c = cmp(twice(x), b.bound2);
  return c < 0 || (c == 0 && b.tie_down);
}

// ---- radix digits (8 bits, most significant first) over a key of `width` bits ------------
ATLAS_HD int radix_levels(int width) { return (width + 7) / 8; }
ATLAS_HD int radix_shift(int width, int level) { return 8 * (radix_levels(width) - 1 - level); }
ATLAS_HD uint32_t radix_digit(uint64_t key, int shift) { return uint32_t(key >> shift) & 0xffu; }
// key agrees with prefix on every digit above the one at `shift`.
ATLAS_HD bool radix_match(uint64_t key, uint64_t prefix, int shift) {
  const int hs = shift + 8;
  return hs >= 64 || (key >> hs) == (prefix >> hs);
}
ATLAS_HD int id_bits(int vocab) {  // bits of the largest id, vocab - 1
  int b = 0;
  while (b < 31 && (int64_t(1) << b) <= int64_t(vocab - 1)) ++b;
  return b;
}
// The top-p order (s ascending, id ascending) as one integer.
ATLAS_HD uint64_t composite(uint32_t key, int32_t id, int idbits) { return (uint64_t(key) << idbits) | uint32_t(id); }

// Top-k: the bucket (from the top) that holds the k_rem-th largest; k_rem becomes the rank
// inside it.
ATLAS_HD uint32_t topk_pick(const uint32_t* cnt, int64_t& k_rem) {
  for (int d = 255; d > 0; --d) {
    if (int64_t(cnt[d]) >= k_rem) return uint32_t(d);
    k_rem -= cnt[d];
  }
  return 0;
}

ATLAS_HD bool topk_active(int64_t top_k, int vocab) { return top_k > 0 && top_k < vocab; }

// ---- the host driver: the kernel's algorithm, sequentially --------------------------------
struct Survivors {
  std::vector<int32_t> ids;  // ascending id, probability > 0
  std::vector<float> probs;
};

// Draws one token from `x` ([vocab] float32 logits, bf16 rows widened exactly) with `p`
// (mode is ignored: this always samples). Returns the token or encode_error(...). With
// `out`, also the survivors and their float32 probabilities (decode::Distribution).
inline int32_t sample_row(const float* x, int vocab, const RowParams& p, Survivors* out = nullptr) {
  // 1. temperature and validation; keys of s (the -inf key for -inf).
  std::vector<uint32_t> key(size_t(vocab), 0);
  uint32_t max_key = 0;
  for (int i = 0; i < vocab; ++i) {
    const float xi = x[i];
    if (xi != xi) return encode_error(kNanLogit, i);
    if (xi == u2f(0x7f800000u)) return encode_error(kPosInfLogit, i);
    const float s = fdiv(xi, p.temperature);
    if (s == u2f(0x7f800000u)) return encode_error(kOverflow, i);
    key[size_t(i)] = order_key(s);
    if (key[size_t(i)] > max_key) max_key = key[size_t(i)];
  }
  if (max_key <= kNegInfKey) return encode_error(kNoFinite, 0);
  // 2. top-k: radix select of the k-th largest key, duplicates counted.
  uint32_t kth = 0;
  if (topk_active(p.top_k, vocab)) {
    int64_t k_rem = p.top_k;
    uint64_t prefix = 0;
    for (int level = 0; level < 4; ++level) {
      const int shift = radix_shift(32, level);
      uint32_t cnt[256] = {};
      for (int i = 0; i < vocab; ++i)
        if (radix_match(key[size_t(i)], prefix, shift)) ++cnt[radix_digit(key[size_t(i)], shift)];
      prefix |= uint64_t(topk_pick(cnt, k_rem)) << shift;
    }
    kth = uint32_t(prefix);
  }
  auto alive = [&](int i) { return key[size_t(i)] > kNegInfKey && key[size_t(i)] >= kth; };
  const float m = key_value(max_key);
  // exp(s - max) of the survivors so far and their exact sum.
  std::vector<float> e(size_t(vocab), 0.0f);
  Acc total;
  acc_zero(total);
  for (int i = 0; i < vocab; ++i)
    if (alive(i)) {
      e[size_t(i)] = exp_f32(fsub(key_value(key[size_t(i)]), m));
      acc_add(total, e[size_t(i)]);
    }
  double S = to_double(normalize(total));
  // 3. top-p: the cut is the smallest (s, id) whose inclusive exact cumulative probability
  // is not removable; everything from it up survives (or only the largest, if none).
  const int idbits = id_bits(vocab), width = 32 + idbits;
  uint64_t cut = 0;
  bool top_p = p.top_p_on != 0;
  if (top_p) {
    std::vector<float> prob(size_t(vocab), 0.0f);
    uint64_t max_comp = 0;
    for (int i = 0; i < vocab; ++i)
      if (alive(i)) {
        prob[size_t(i)] = d2f(ddiv(double(e[size_t(i)]), S));
        const uint64_t c = composite(key[size_t(i)], i, idbits);
        if (c > max_comp) max_comp = c;
      }
    const TopPBound bound = make_bound(p.top_p_threshold);
    Acc base;
    acc_zero(base);
    uint64_t prefix = 0;
    bool all_removable = false;
    for (int level = 0; level < radix_levels(width) && !all_removable; ++level) {
      const int shift = radix_shift(width, level);
      uint32_t cnt[256] = {};
      static thread_local Acc sums[256];
      for (auto& a : sums) acc_zero(a);
      for (int i = 0; i < vocab; ++i) {
        if (!alive(i)) continue;
        const uint64_t c = composite(key[size_t(i)], i, idbits);
        if (!radix_match(c, prefix, shift)) continue;
        const uint32_t d = radix_digit(c, shift);
        ++cnt[d];
        acc_add(sums[d], prob[size_t(i)]);
      }
      int pick = -1;
      Acc run = base;
      for (int d = 0; d < 256; ++d) {
        if (!cnt[d]) continue;
        Acc incl = run;
        acc_add(incl, sums[d]);
        if (!removable(normalize(incl), bound)) {
          pick = d;
          break;
        }
        run = incl;
      }
      if (pick < 0) {
        all_removable = true;  // only at level 0: deeper levels hold a non-removable token
      } else {
        base = run;
        prefix |= uint64_t(pick) << shift;
      }
    }
    cut = all_removable ? max_comp : prefix;
    // The survivors' own softmax sum.
    Acc kept;
    acc_zero(kept);
    for (int i = 0; i < vocab; ++i)
      if (alive(i) && composite(key[size_t(i)], i, idbits) >= cut) acc_add(kept, e[size_t(i)]);
    S = to_double(normalize(kept));
  }
  // 4. softmax over the survivors and the inverse-CDF draw in ascending id.
  float C = 0.0f;
  int32_t last = -1, token = -1;
  for (int i = 0; i < vocab; ++i) {
    if (!alive(i) || (top_p && composite(key[size_t(i)], i, idbits) < cut)) continue;
    const float q = d2f(ddiv(double(e[size_t(i)]), S));
    if (q <= 0.0f) continue;
    if (out) {
      out->ids.push_back(i);
      out->probs.push_back(q);
    }
    last = i;
    C = fadd(C, q);
    if (token < 0 && p.u < double(C)) {
      token = i;
      if (!out) break;
    }
  }
  return token >= 0 ? token : last;
}

}  // namespace atlas::sample_core
