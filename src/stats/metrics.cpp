#include "stats/metrics.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <limits>
#include <set>

namespace atlas::stats {

namespace {
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
// ln 2 split so that e * kLn2Hi is exact for every binary exponent e (kLn2Hi has 32 trailing
// zero bits); kLn2Lo = ln 2 - kLn2Hi.
constexpr double kLn2Hi = 0x1.62e42feep-1;
constexpr double kLn2Lo = 0x1.a39ef35793c76p-33;
constexpr double kLn2 = 0x1.62e42fefa39efp-1;  // ln 2 rounded to nearest
}  // namespace

double det_log(double x) {
  if (!(x > 0) || !std::isfinite(x)) return kNaN;
  int e = 0;
  if (x < 0x1p-1022) {  // subnormal: scale into the normal range first
    x *= 0x1p54;
    e = -54;
  }
  const uint64_t bits = std::bit_cast<uint64_t>(x);
  e += int((bits >> 52) & 0x7ff) - 1023;
  double m = std::bit_cast<double>((bits & 0x000fffffffffffffull) | 0x3ff0000000000000ull);  // [1, 2)
  if (m > 0x1.6a09e667f3bcdp+0) {  // m > sqrt(2): use m/2 in [sqrt(1/2), 1) instead
    m *= 0.5;
    e += 1;
  }
  // log m = 2 atanh(s) = 2s (1 + z/3 + z^2/5 + ...), s = f / (2 + f), z = s^2, f = m - 1 (exact).
  // Since 2s = f - s f, log m = f - s (f - 2 z P(z)) with P = 1/3 + z/5 + ... + z^10/23: the
  // leading term f is exact and the correction is O(f^2), which keeps the error near 1/2 ulp.
  const double f = m - 1.0;
  const double s = f / (2.0 + f);
  const double z = s * s;
  double p = 1.0 / 23;
  p = p * z + 1.0 / 21;
  p = p * z + 1.0 / 19;
  p = p * z + 1.0 / 17;
  p = p * z + 1.0 / 15;
  p = p * z + 1.0 / 13;
  p = p * z + 1.0 / 11;
  p = p * z + 1.0 / 9;
  p = p * z + 1.0 / 7;
  p = p * z + 1.0 / 5;
  p = p * z + 1.0 / 3;
  const double log_m = f - s * (f - 2.0 * z * p);
  const double de = double(e);
  return de * kLn2Hi + (de * kLn2Lo + log_m);
}

double coefficient_of_variation(std::span<const double> load) {
  if (load.empty()) return kNaN;
  const double n = double(load.size());
  double sum = 0;
  for (double v : load) sum += v;
  const double mean = sum / n;
  if (mean == 0) return kNaN;
  double ss = 0;
  for (double v : load) ss += (v - mean) * (v - mean);
  return std::sqrt(ss / n) / mean;
}

double total_variation(std::span<const double> p, std::span<const double> q) {
  double s = 0;
  for (size_t i = 0; i < p.size(); ++i) s += std::fabs(p[i] - q[i]);
  return 0.5 * s;
}

double jensen_shannon_bits(std::span<const double> p, std::span<const double> q) {
  double kp = 0, kq = 0;  // KL(P||M), KL(Q||M) in nats
  for (size_t i = 0; i < p.size(); ++i) {
    const double m = 0.5 * (p[i] + q[i]);
    if (p[i] > 0) kp += p[i] * det_log(p[i] / m);
    if (q[i] > 0) kq += q[i] * det_log(q[i] / m);
  }
  return (0.5 * kp + 0.5 * kq) / kLn2;
}

TopkAgreement topk_agreement(std::span<const int32_t> a, std::span<const int32_t> b) {
  TopkAgreement r;
  r.ordered = a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin());
  std::vector<int32_t> sa(a.begin(), a.end()), sb(b.begin(), b.end());
  std::sort(sa.begin(), sa.end());
  sa.erase(std::unique(sa.begin(), sa.end()), sa.end());
  std::sort(sb.begin(), sb.end());
  sb.erase(std::unique(sb.begin(), sb.end()), sb.end());
  r.set = sa == sb;
  size_t inter = 0, i = 0, j = 0;
  while (i < sa.size() && j < sb.size()) {
    if (sa[i] == sb[j]) {
      ++inter, ++i, ++j;
    } else if (sa[i] < sb[j]) {
      ++i;
    } else {
      ++j;
    }
  }
  const size_t uni = sa.size() + sb.size() - inter;
  r.jaccard = uni == 0 ? 1.0 : double(inter) / double(uni);
  return r;
}

RowPair compare_rows(std::span<const float> a, std::span<const float> b) {
  RowPair r;
  r.exact = a.size() == b.size();
  for (size_t i = 0; i < a.size(); ++i) {
    const double x = a[i], y = b[i], d = x - y;
    r.dot += x * y;
    r.aa += x * x;
    r.bb += y * y;
    r.dd += d * d;
    if (std::bit_cast<uint32_t>(a[i]) != std::bit_cast<uint32_t>(b[i])) r.exact = false;
  }
  return r;
}

double cosine(const RowPair& r) {
  if (r.aa == 0 || r.bb == 0) return kNaN;
  return r.dot / std::sqrt(r.aa * r.bb);
}

double relative_l2(const RowPair& r) {
  if (r.bb == 0) return kNaN;
  return std::sqrt(r.dd) / std::sqrt(r.bb);
}

size_t common_prefix(std::span<const int32_t> a, std::span<const int32_t> b) {
  size_t n = std::min(a.size(), b.size()), i = 0;
  while (i < n && a[i] == b[i]) ++i;
  return i;
}

size_t levenshtein(std::span<const int32_t> a, std::span<const int32_t> b) {
  // prev[j] = distance(a[0..i), b[0..j)); cur is the next row.
  std::vector<size_t> prev(b.size() + 1), cur(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) prev[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    cur[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t sub = prev[j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1);
      cur[j] = std::min({sub, prev[j] + 1, cur[j - 1] + 1});
    }
    std::swap(prev, cur);
  }
  return prev[b.size()];
}

double token_similarity(std::span<const int32_t> a, std::span<const int32_t> b) {
  const size_t n = std::max(a.size(), b.size());
  if (n == 0) return 1.0;
  return 1.0 - double(levenshtein(a, b)) / double(n);
}

size_t distinct_sequences(const std::vector<std::span<const int32_t>>& seqs) {
  std::set<std::vector<int32_t>> seen;
  for (auto s : seqs) seen.emplace(s.begin(), s.end());
  return seen.size();
}

FactorialEffects factorial_effects(double m00, double m10, double m01, double m11) {
  return {.main_a = 0.5 * ((m10 - m00) + (m11 - m01)),
          .main_b = 0.5 * ((m01 - m00) + (m11 - m10)),
          .did = (m11 - m01) - (m10 - m00)};
}

double percentile_type7(std::vector<double>& v, double q) {
  if (v.empty()) return kNaN;
  const double h = double(v.size() - 1) * q;
  const size_t lo = std::min(size_t(std::floor(h)), v.size() - 1);
  std::nth_element(v.begin(), v.begin() + lo, v.end());
  const double xlo = v[lo];
  if (lo + 1 >= v.size()) return xlo;
  const double xhi = *std::min_element(v.begin() + lo + 1, v.end());
  return xlo + (h - double(lo)) * (xhi - xlo);
}

}  // namespace atlas::stats
