// Helpers for the MLA attention tests: exact math in double and the stated tolerances.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "cuda_test_util.h"

namespace atlas::cuda::test {

// Exact softmax attention of one head over `len` cache slots, in double:
// o[d] = sum_j p_j c_jd / sum_j p_j, and a[d] = sum_j p_j |c_jd| / sum_j p_j (the scale that
// bounds how far rounding the weights p_j can move o[d]).
struct MlaExact {
  std::vector<double> o, a;
};
inline MlaExact mla_exact(const uint16_t* q_head, const uint16_t* cache, int len, int width, int latent, double scale) {
  MlaExact r{std::vector<double>(size_t(latent), 0.0), std::vector<double>(size_t(latent), 0.0)};
  if (len == 0) return r;
  std::vector<double> s(static_cast<size_t>(len));
  for (int j = 0; j < len; ++j) {
    double acc = 0;
    for (int d = 0; d < width; ++d) acc += double(bf(q_head[d])) * bf(cache[size_t(j) * width + d]);
    s[size_t(j)] = acc * scale;
  }
  const double m = *std::max_element(s.begin(), s.end());
  double l = 0;
  for (auto& v : s) l += v = std::exp(v - m);
  for (int j = 0; j < len; ++j)
    for (int d = 0; d < latent; ++d) {
      const double c = bf(cache[size_t(j) * width + d]);
      r.o[size_t(d)] += s[size_t(j)] * c;
      r.a[size_t(d)] += s[size_t(j)] * std::abs(c);
    }
  for (int d = 0; d < latent; ++d) {
    r.o[size_t(d)] /= l;
    r.a[size_t(d)] /= l;
  }
  return r;
}

// Relative L2 distance of one head's bf16 output to the exact result.
inline double rel_l2(const uint16_t* got, const std::vector<double>& want) {
  double num = 0, den = 0;
  for (size_t d = 0; d < want.size(); ++d) {
    const double g = bf(got[d]);
    num += (g - want[d]) * (g - want[d]);
    den += want[d] * want[d];
  }
  return den > 0 ? std::sqrt(num / den) : std::sqrt(num);
}

// The tensor-core kernel against its CPU mirror (ref::mla_decode, same contract). The two
// differ only in the fp32 accumulation order of the two dot products (tensor core vs an fmaf
// chain) and in expf vs libm, i.e. in the last fp32 bits of the scores and sums. Consequences:
//  * rounding p to bf16 can land on the two sides of a rounding boundary for a few weights;
//    each such weight moves by one bf16 ulp (<= 2^-7 relative), so even if every weight moved,
//    the unrounded output would move by at most 2^-7 (a + |o|) (numerator and normaliser);
//  * the output rounding then adds at most one bf16 ulp (2^-7 |o|).
//  Per element: |got - want| <= 2^-6 |want| + 2^-7 a + 1e-6 (1e-6: fp32 noise near zero).
//  * Such flips are rare: in a host simulation of the contract with a tensor-core-like order
//    (16-term blocks summed exactly, then added), at most 0.9% of outputs differed at all, while
//    a kernel with another contract (fp32 P, the scalar kernel) differs in 9-35% of them. So at
//    most 5% may differ: this separates "same contract, other order" from "other contract".
// `exact` holds mla_exact() per (query, head), in the output's order.
inline void expect_matches_tc_reference(const std::vector<uint16_t>& got, const std::vector<uint16_t>& want,
                                        const std::vector<MlaExact>& exact, int latent) {
  ASSERT_EQ(got.size(), want.size());
  ASSERT_EQ(exact.size() * size_t(latent), got.size());
  size_t differ = 0, reported = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double g = bf(got[i]), w = bf(want[i]);
    const double a = exact[i / size_t(latent)].a[i % size_t(latent)];
    const double tol = std::ldexp(std::abs(w), -6) + std::ldexp(a, -7) + 1e-6;
    if (!(std::abs(g - w) <= tol) && reported++ < 10)
      ADD_FAILURE() << "element " << i << " (query-head " << i / size_t(latent) << ", column " << i % size_t(latent)
                    << "): " << g << " vs reference " << w << ", tolerance " << tol;
    differ += got[i] != want[i];
  }
  EXPECT_EQ(reported, 0u) << "elements outside the tolerance";
  EXPECT_LE(differ, got.size() / 20) << "more than 5% of the outputs differ from the reference";
}

// Distance to exact math, per element, a bound that holds by construction (u = 2^-8, the bf16
// unit roundoff): the output rounding moves o by <= u |o|; with bf16 weights (p_rounded, the
// tensor-core contract) each p_j is within u relative, which moves o by <= u (a + |o|); fp32
// arithmetic adds ~sqrt(len) 2^-24 a (allowed: 2^-16 a), and 1% slack covers second-order terms.
inline double mla_exact_tolerance(double o, double a, bool p_rounded) {
  return 1.01 * std::ldexp(std::abs(o) + (p_rounded ? a + std::abs(o) : 0.0), -8) + std::ldexp(a, -16) + 1e-6;
}

// Every element within mla_exact_tolerance(); and, for latent >= 128 (enough elements for a
// stable statistic), every (query, head) within relative L2 4e-3 of exact math: the bf16 weights
// and the bf16 output each cost ~1.6e-3 RMS (relative), the host simulation measured <= 2.5e-3.
inline void expect_close_to_exact(const std::vector<uint16_t>& got, const std::vector<MlaExact>& exact, int latent,
                                  const std::vector<int32_t>& lengths, int heads, bool p_rounded = true) {
  size_t reported = 0;
  for (size_t qh = 0; qh < exact.size(); ++qh) {
    const int len = lengths[qh / size_t(heads)];
    for (int d = 0; d < latent; ++d) {
      const double g = bf(got[qh * size_t(latent) + size_t(d)]), o = exact[qh].o[size_t(d)];
      const double tol = mla_exact_tolerance(o, exact[qh].a[size_t(d)], p_rounded);
      if (!(std::abs(g - o) <= tol) && reported++ < 10)
        ADD_FAILURE() << "query " << qh / size_t(heads) << " head " << qh % size_t(heads) << " column " << d
                      << " (length " << len << "): " << g << " vs exact " << o << ", tolerance " << tol;
    }
    if (len == 0 || latent < 128) continue;
    EXPECT_LT(rel_l2(&got[qh * size_t(latent)], exact[qh].o), 4e-3)
        << "query " << qh / size_t(heads) << " head " << qh % size_t(heads) << " length " << len;
  }
  EXPECT_EQ(reported, 0u) << "elements outside the exact-math tolerance";
}

}  // namespace atlas::cuda::test
