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
  if (x < 0x1p-1022) return det_log_normal(x * 0x1p54) - 54.0 * kLn2Hi - 54.0 * kLn2Lo;  // subnormal
  return det_log_normal(x);
}

namespace {
constexpr size_t kChunk = 256;  // element-wise passes work on stack chunks of this size
}

double coefficient_of_variation(std::span<const double> load) {
  if (load.empty()) return kNaN;
  const double n = double(load.size());
  const double mean = lane_sum(load.data(), load.size()) / n;
  if (mean == 0) return kNaN;
  double ss = 0, t[kChunk];
  for (size_t base = 0; base < load.size(); base += kChunk) {
    const size_t m = std::min(kChunk, load.size() - base);
    for (size_t i = 0; i < m; ++i) t[i] = (load[base + i] - mean) * (load[base + i] - mean);
    ss += lane_sum(t, m);
  }
  return std::sqrt(ss / n) / mean;
}

double total_variation(std::span<const double> p, std::span<const double> q) {
  double s = 0, t[kChunk];
  for (size_t base = 0; base < p.size(); base += kChunk) {
    const size_t m = std::min(kChunk, p.size() - base);
    for (size_t i = 0; i < m; ++i) t[i] = std::fabs(p[base + i] - q[base + i]);
    s += lane_sum(t, m);
  }
  return 0.5 * s;
}

void log_or_zero(std::span<const double> x, std::span<double> out) {
  // Vectorised pass with det_log_normal on every normal positive value (others take log 1 = 0),
  // then a fix-up pass for the rare positive subnormals.
  // The select is done on bits (a floating-point comparison would become a branch): a zero
  // exponent field (0 or subnormal) gives the mask 0, which substitutes 1.0.
  for (size_t i = 0; i < x.size(); ++i) {
    const uint64_t bits = std::bit_cast<uint64_t>(x[i]);
    const uint64_t normal = ((((bits >> 52) & 0x7ff) + 0x7ff) >> 11);  // 1 if the exponent field is not 0
    const uint64_t mask = 0 - normal;
    out[i] = det_log_normal(std::bit_cast<double>((bits & mask) | (0x3ff0000000000000ull & ~mask)));
  }
  for (size_t i = 0; i < x.size(); ++i)
    if (x[i] > 0 && x[i] < 0x1p-1022) out[i] = det_log(x[i]);
}

double jensen_shannon_bits(std::span<const double> p, std::span<const double> logp, std::span<const double> q,
                           std::span<const double> logq) {
  // KL(P||M) + KL(Q||M) = sum p (log p - log m) + q (log q - log m), element-wise terms in
  // stack chunks, then lane sums. A zero p contributes p * (...) = 0 (its log is taken as 0).
  double kp = 0, kq = 0, m[kChunk], lm[kChunk], tp[kChunk], tq[kChunk];
  for (size_t base = 0; base < p.size(); base += kChunk) {
    const size_t n = std::min(kChunk, p.size() - base);
    for (size_t i = 0; i < n; ++i) m[i] = 0.5 * (p[base + i] + q[base + i]);
    log_or_zero({m, n}, {lm, n});
    for (size_t i = 0; i < n; ++i) {
      tp[i] = p[base + i] * (logp[base + i] - lm[i]);
      tq[i] = q[base + i] * (logq[base + i] - lm[i]);
    }
    kp += lane_sum(tp, n);
    kq += lane_sum(tq, n);
  }
  return (0.5 * kp + 0.5 * kq) / kLn2;
}

double jensen_shannon_bits(std::span<const double> p, std::span<const double> q) {
  std::vector<double> lp(p.size()), lq(q.size());
  log_or_zero(p, lp);
  log_or_zero(q, lq);
  return jensen_shannon_bits(p, lp, q, lq);
}

TopkAgreement topk_agreement(std::span<const int32_t> a, std::span<const int32_t> b) {
  TopkAgreement r;
  r.ordered = a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin());
  // Sorted, de-duplicated copies (on the stack for the usual small k).
  constexpr size_t kSmall = 32;
  int32_t abuf[kSmall], bbuf[kSmall];
  std::vector<int32_t> aheap, bheap;
  int32_t* pa = abuf;
  int32_t* pb = bbuf;
  if (a.size() > kSmall || b.size() > kSmall) {
    aheap.resize(a.size()), bheap.resize(b.size());
    pa = aheap.data(), pb = bheap.data();
  }
  std::copy(a.begin(), a.end(), pa);
  std::copy(b.begin(), b.end(), pb);
  std::sort(pa, pa + a.size());
  std::sort(pb, pb + b.size());
  const size_t na = size_t(std::unique(pa, pa + a.size()) - pa), nb = size_t(std::unique(pb, pb + b.size()) - pb);
  r.set = na == nb && std::equal(pa, pa + na, pb);
  size_t inter = 0, i = 0, j = 0;
  const std::span<const int32_t> sa(pa, na), sb(pb, nb);
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
