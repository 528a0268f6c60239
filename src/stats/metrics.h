// Metric primitives of the seed system (seed-system.md section 4), in double precision.
//
// Every sum has a fixed order (lane_sum below; sequential in index order elsewhere), so the
// same inputs give the same bits on every machine and thread count.
// Logarithms go through det_log (below), which uses only IEEE-754 +, -, *, / and bit
// manipulation, so results do not depend on the C library's log either. Definitions are in
// docs/stats.md; tests/stats/test_stats_vs_numpy.py checks them against numpy/scipy.
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

namespace atlas::stats {

// Natural logarithm of a positive finite double with an error below 1 ulp in practice (checked
// against std::log in the unit tests): x = 2^e * m with m in [sqrt(1/2), sqrt(2)),
// log m = 2 atanh(s), s = (m - 1) / (m + 1), as its odd series through s^23. Returns NaN for
// x <= 0 or non-finite x (callers never pass those).
double det_log(double x);

// The same function for a positive *normal* finite x, without checks or branches, inline so
// that loops over experts vectorise; det_log is this plus the checks and the subnormal
// scaling, so the two agree bit for bit on normal inputs.
inline double det_log_normal(double x) {
  const uint64_t bits = std::bit_cast<uint64_t>(x);
  const uint64_t mant = bits & 0x000fffffffffffffull;
  // big = 1 when the mantissa 1.f exceeds sqrt(2) (f > 0x6a09e667f3bcd), by integer carry
  // instead of a comparison: GCC turns comparisons here into branches, which stop the loops
  // that call this from vectorising. A big mantissa is halved into [sqrt(1/2), 1).
  const uint64_t big = (mant + ((1ull << 52) - 0x6a09e667f3bcdull - 1)) >> 52;
  const double m = std::bit_cast<double>(mant | (0x3ff0000000000000ull - (big << 52)));
  // The exponent as a double without an int64 -> double conversion: (2^52 + k) - 2^52.
  const double e = std::bit_cast<double>(0x4330000000000000ull | ((bits >> 52) + big)) - (0x1p52 + 1023.0);
  // log m = 2 atanh(s) = 2s (1 + z/3 + z^2/5 + ...), s = f / (2 + f), z = s^2, f = m - 1 (exact).
  // Since 2s = f - s f, log m = f - s (f - 2 z P(z)) with P = 1/3 + z/5 + ... + z^10/23: the
  // leading term f is exact and the correction is O(f^2), which keeps the error near 1/2 ulp.
  const double f = m - 1.0;
  const double s = f / (2.0 + f);
  const double z = s * s;
  // P by Estrin's scheme (independent sub-products instead of one long Horner chain, so the
  // evaluation is not latency-bound): c_j = 1 / (2j + 3) for z^j.
  const double z2 = z * z, z4 = z2 * z2, z8 = z4 * z4;
  const double a01 = 1.0 / 3 + (1.0 / 5) * z, a23 = 1.0 / 7 + (1.0 / 9) * z;
  const double a45 = 1.0 / 11 + (1.0 / 13) * z, a67 = 1.0 / 15 + (1.0 / 17) * z;
  const double a89 = 1.0 / 19 + (1.0 / 21) * z;
  const double p = (a01 + z2 * a23) + z4 * (a45 + z2 * a67) + z8 * (a89 + z2 * (1.0 / 23));
  const double log_m = f - s * (f - 2.0 * z * p);
  // ln 2 split so that e * hi is exact for every exponent (hi has 32 trailing zero bits).
  return e * 0x1.62e42feep-1 + (e * 0x1.a39ef35793c76p-33 + log_m);
}

// ---- summation ----------------------------------------------------------------------------
// The fixed summation order of every reduction over experts or elements: four interleaved
// partial sums (element i goes to lane i mod 4, each lane in index order), combined as
// (l0 + l1) + (l2 + l3). Deterministic and vectorisable (one 4-wide accumulator).
inline double lane_sum(const double* x, size_t n) {
  double l[4] = {0, 0, 0, 0};
  size_t i = 0;
  for (; i + 4 <= n; i += 4)
    for (int j = 0; j < 4; ++j) l[j] += x[i + j];
  for (int j = 0; i < n; ++i, ++j) l[j] += x[i];
  return (l[0] + l[1]) + (l[2] + l[3]);
}

// out[i] = log x[i] for x[i] > 0, and 0 for x[i] == 0 (0 log 0 = 0 in every use).
void log_or_zero(std::span<const double> x, std::span<double> out);

// ---- expert distributions (seed 4.1-4.4) ---------------------------------------------------
// Coefficient of variation of a load vector: population standard deviation / mean over its
// E entries (OPEN in the seed; population std chosen). Scale-free, so counts and the
// normalised distribution give the same value. NaN when the mean is 0.
double coefficient_of_variation(std::span<const double> load);

// Total variation distance 1/2 sum |p_i - q_i|. p and q are probability vectors.
double total_variation(std::span<const double> p, std::span<const double> q);

// Jensen-Shannon divergence in bits (log base 2, so it lies in [0, 1]):
//   1/2 sum_i p_i log2(p_i / m_i) + 1/2 sum_i q_i log2(q_i / m_i),  m = (p + q) / 2,
// with 0 log 0 = 0. Identical p and q give exactly 0 (m_i == p_i, log 1 == 0).
double jensen_shannon_bits(std::span<const double> p, std::span<const double> q);
// The same with log_or_zero(p) and log_or_zero(q) precomputed (shared across the edges of a
// condition): KL terms p_i (log p_i - log m_i), so identical p and q still give exactly 0.
double jensen_shannon_bits(std::span<const double> p, std::span<const double> logp, std::span<const double> q,
                           std::span<const double> logq);

// ---- top-k agreement of one aligned token (seed 4.5) ---------------------------------------
struct TopkAgreement {
  bool ordered = false;  // same expert ids in the same order
  bool set = false;      // same set of expert ids
  double jaccard = 0;    // |A n B| / |A u B| of the two id sets (1 when both are empty)
};
TopkAgreement topk_agreement(std::span<const int32_t> a, std::span<const int32_t> b);

// ---- hidden rows (seed 4.7) ----------------------------------------------------------------
// Sufficient statistics of one pair of rows a (condition) and b (reference): enough for both
// the per-row metrics and the pooled ones (see docs/stats.md).
struct RowPair {
  double dot = 0, aa = 0, bb = 0, dd = 0;  // sum a*b, sum a^2, sum b^2, sum (a-b)^2
  bool exact = false;                      // every element bitwise equal
};
RowPair compare_rows(std::span<const float> a, std::span<const float> b);
double cosine(const RowPair& r);           // dot / sqrt(aa * bb); NaN if either norm is 0
double relative_l2(const RowPair& r);      // sqrt(dd) / sqrt(bb); NaN if bb == 0

// ---- generated token ids (seed 4.8, 4.12) --------------------------------------------------
size_t common_prefix(std::span<const int32_t> a, std::span<const int32_t> b);
// Levenshtein distance with unit insert/delete/substitute costs; O(n*m) time, two rows.
size_t levenshtein(std::span<const int32_t> a, std::span<const int32_t> b);
// 1 - levenshtein / max(len a, len b); 1 when both are empty (two identical empty outputs).
double token_similarity(std::span<const int32_t> a, std::span<const int32_t> b);
// Number of distinct complete sequences.
size_t distinct_sequences(const std::vector<std::span<const int32_t>>& seqs);

// ---- 2x2 factorials (seed 4.6) -------------------------------------------------------------
// m_ab is the metric at A level a and B level b.
struct FactorialEffects {
  double main_a = 0;  // 1/2 [(m10 - m00) + (m11 - m01)]
  double main_b = 0;  // 1/2 [(m01 - m00) + (m11 - m10)]
  double did = 0;     // (m11 - m01) - (m10 - m00)
};
FactorialEffects factorial_effects(double m00, double m10, double m01, double m11);

// ---- percentiles ---------------------------------------------------------------------------
// Percentile of type 7 (Hyndman and Fan 1996; numpy's default "linear"): with the n values
// sorted ascending as x_0..x_{n-1}, h = (n - 1) q, the result is x_floor(h) + (h - floor(h)) *
// (x_floor(h)+1 - x_floor(h)). q in [0, 1]. `values` is reordered (partially sorted). NaN
// values must have been removed by the caller; an empty input gives NaN.
double percentile_type7(std::vector<double>& values, double q);

}  // namespace atlas::stats
