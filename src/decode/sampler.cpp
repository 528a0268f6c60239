#include "decode/sampler.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <limits>
#include <utility>

#include "core/error.h"
#include "decode/rng.h"

namespace atlas::decode {

namespace {

// Exact sum of non-negative float32 values below 2 (probabilities and exp(s - max)), held as
// an integer count of 2^-149 (the smallest float32 subnormal). A value below 2 is < 2^150
// such units; 2^31 of them fit in 192 bits. Exact sums do not depend on the order of
// accumulation, which is what lets top-p find its cut without sorting the vocabulary.
class ExactSum {
 public:
  void add(float v) {
    const uint32_t bits = std::bit_cast<uint32_t>(v);
    const uint32_t biased = bits >> 23, frac = bits & 0x7fffffu;
    if (bits == 0) return;
    check((bits >> 31) == 0 && biased < 128, {}, "probabilities", "internal: value outside [0, 2)");
    const uint64_t mant = biased == 0 ? frac : (frac | 0x800000u);
    const int shift = biased == 0 ? 0 : int(biased) - 1;  // value = mant * 2^(shift - 149)
    const int limb = shift / 64, off = shift % 64;
    add_at(limb, mant << off);
    if (off > 40) add_at(limb + 1, mant >> (64 - off));  // the part that spills into the next limb
  }
  ExactSum& operator+=(const ExactSum& o) {
    uint64_t carry = 0;
    for (int i = 0; i < 3; ++i) {
      const uint64_t a = w_[i], sum = a + o.w_[i] + carry;
      carry = (sum < a || (carry && sum == a)) ? 1 : 0;
      w_[i] = sum;
    }
    return *this;
  }
  friend bool operator<(const ExactSum& a, const ExactSum& b) {
    for (int i = 2; i >= 0; --i)
      if (a.w_[i] != b.w_[i]) return a.w_[i] < b.w_[i];
    return false;
  }
  friend bool operator==(const ExactSum& a, const ExactSum& b) {
    return a.w_[0] == b.w_[0] && a.w_[1] == b.w_[1] && a.w_[2] == b.w_[2];
  }
  // Correctly rounded (to nearest, ties to even) conversion to a `bits`-bit significand.
  double round_to(int bits) const {
    int top = -1;
    for (int i = 2; i >= 0 && top < 0; --i)
      if (w_[i]) top = 64 * i + 63 - std::countl_zero(w_[i]);
    if (top < 0) return 0.0;
    if (top < bits) return std::ldexp(double(extract(0, top + 1)), -149);  // exact
    const int s = top + 1 - bits;                                         // bits dropped
    uint64_t m = extract(s, bits);
    const bool guard = bit(s - 1), sticky = any_below(s - 1);
    if (guard && (sticky || (m & 1))) ++m;  // m may become 2^bits: still exact in a double
    return std::ldexp(double(m), s - 149);
  }
  double to_double() const { return round_to(53); }

 private:
  void add_at(int limb, uint64_t v) {
    for (int i = limb; i < 3 && v; ++i) {
      const uint64_t before = w_[i];
      w_[i] += v;
      v = w_[i] < before ? 1 : 0;
    }
  }
  bool bit(int pos) const { return (w_[pos / 64] >> (pos % 64)) & 1; }
  bool any_below(int pos) const {  // any set bit strictly below pos
    for (int i = 0; i < 3; ++i) {
      if (64 * (i + 1) <= pos) {
        if (w_[i]) return true;
      } else {
        const int n = pos - 64 * i;
        if (n > 0 && (w_[i] & ((uint64_t(1) << n) - 1))) return true;
        return false;
      }
    }
    return false;
  }
  uint64_t extract(int lo, int n) const {  // n <= 64 bits starting at bit lo
    const int limb = lo / 64, off = lo % 64;
    uint64_t r = w_[limb] >> off;
    if (off && limb + 1 < 3) r |= w_[limb + 1] << (64 - off);
    return n == 64 ? r : r & ((uint64_t(1) << n) - 1);
  }
  uint64_t w_[3] = {0, 0, 0};
};

struct WarpScratch {
  std::vector<float> s, tmp, e, prob;
  std::vector<int32_t> alive;
  std::vector<char> keep;
  std::vector<std::pair<float, int32_t>> order;  // top-p's (s, index) array
};

std::string token_field(size_t i) { return "logits[" + std::to_string(i) + "]"; }

}  // namespace

// exp(x) rounded to float32 for x <= 0, with IEEE double additions and multiplications only
// (no libm), so every IEEE-754 machine computes the same bits (the build disables FMA
// contraction). Range reduction x = k ln2 + r, |r| <= ln2/2, with fdlibm's split ln2 (k * hi is
// exact), then a degree-13 Taylor polynomial (truncation error < 1e-17 relative): the double
// result is within a few double ulps of exp(x), so the float32 rounding is the correctly
// rounded one except within ~1e-16 of a float32 rounding midpoint.
float exp_f32(float x) {
  if (x < -104.0f) return 0.0f;  // exp(-104) < 2^-150: rounds to zero
  constexpr double kLog2e = 1.4426950408889634, kLn2Hi = 6.93147180369123816490e-01,
                   kLn2Lo = 1.90821492927058770002e-10;
  const double xd = x;
  const double k = std::floor(xd * kLog2e + 0.5);
  const double r = (xd - k * kLn2Hi) - k * kLn2Lo;
  double p = 1.0 / 6227020800.0;  // 1/13!
  constexpr double kInvFact[] = {1.0 / 479001600.0, 1.0 / 39916800.0, 1.0 / 3628800.0, 1.0 / 362880.0,
                                 1.0 / 40320.0,     1.0 / 5040.0,     1.0 / 720.0,     1.0 / 120.0,
                                 1.0 / 24.0,        1.0 / 6.0,        1.0 / 2.0,       1.0,
                                 1.0};  // 1/12! .. 1/0!
  for (double c : kInvFact) p = p * r + c;
  // p * 2^k with 2^k built from its bits (k in [-151, 1], a normal double): exact, and
  // cheaper than ldexp.
  return float(p * std::bit_cast<double>(uint64_t(int64_t(k) + 1023) << 52));
}

std::string_view mode_name(SamplingMode m) {
  switch (m) {
    case SamplingMode::Greedy: return "greedy";
    case SamplingMode::Seeded: return "seeded";
    case SamplingMode::Crn: return "crn";
  }
  return "?";
}

std::optional<SamplingMode> parse_mode(std::string_view s) {
  if (s == "greedy") return SamplingMode::Greedy;
  if (s == "seeded") return SamplingMode::Seeded;
  if (s == "crn") return SamplingMode::Crn;
  return std::nullopt;
}

namespace {
// The warper fields, which warp() checks whatever the mode.
void validate_warpers(const SamplingParams& p) {
  if (!(p.temperature > 0.0) || !std::isfinite(p.temperature))
    fail({}, "temperature", "must be a finite number > 0, got " + std::to_string(p.temperature));
  if (!(p.top_p >= 0.0 && p.top_p <= 1.0))
    fail({}, "top_p", "must lie in [0, 1], got " + std::to_string(p.top_p));
  if (p.top_k < 0) fail({}, "top_k", "must be >= 0 (0 = off), got " + std::to_string(p.top_k));
}
}  // namespace

void validate(const SamplingParams& p) {
  if (p.mode == SamplingMode::Greedy) return;
  validate_warpers(p);
  if (p.mode == SamplingMode::Crn && p.crn_row_key.empty())
    fail({}, "crn_row_key", "CRN sampling needs a row key (e.g. the source id)");
}

int64_t greedy_token(std::span<const float> logits) {
  check(!logits.empty(), {}, "logits", "empty row");
  size_t best = 0;
  for (size_t i = 0; i < logits.size(); ++i) {
    if (std::isnan(logits[i])) fail({}, token_field(i), "NaN logit");
    if (logits[i] > logits[best]) best = i;  // strict: the first (lowest) id wins ties
  }
  return int64_t(best);
}

Distribution warp(std::span<const float> logits, const SamplingParams& p) {
  const size_t V = logits.size();
  check(V > 0, {}, "logits", "empty row");
  check(V < (size_t(1) << 31), {}, "logits", "vocabulary larger than 2^31 - 1");
  validate_warpers(p);

  // 1. temperature, in float32 like torch's `scores / temperature` on a float32 tensor.
  const float t = float(p.temperature);
  // Per-thread scratch: a 100k-token row would otherwise allocate (and page-fault) ~2 MB per step.
  thread_local WarpScratch w;
  std::vector<float>& s = w.s;  // [V] scaled logits
  s.resize(V);
  bool any_finite = false;
  for (size_t i = 0; i < V; ++i) {
    const float x = logits[i];
    if (std::isnan(x)) fail({}, token_field(i), "NaN logit");
    if (x == std::numeric_limits<float>::infinity()) fail({}, token_field(i), "+inf logit");
    s[i] = x / t;
    if (s[i] == std::numeric_limits<float>::infinity())
      fail({}, token_field(i), "logit overflows to +inf at temperature " + std::to_string(p.temperature));
    any_finite = any_finite || std::isfinite(s[i]);
  }
  check(any_finite, {}, "logits", "no finite logit (every token is -inf)");

  // 2. top-k: the k-th largest value, duplicates counted (torch.topk(...)[0][..., -1]).
  float kth = -std::numeric_limits<float>::infinity();
  if (p.top_k > 0 && size_t(p.top_k) < V) {
    std::vector<float>& tmp = w.tmp;
    tmp.assign(s.begin(), s.end());
    std::nth_element(tmp.begin(), tmp.begin() + (p.top_k - 1), tmp.end(), std::greater<float>());
    kth = tmp[size_t(p.top_k - 1)];
  }
  // Survivors so far: s >= kth and finite (a -inf token has probability exactly 0).
  std::vector<int32_t>& alive = w.alive;  // ascending id
  alive.clear();
  float m = -std::numeric_limits<float>::infinity();
  for (size_t i = 0; i < V; ++i)
    if (s[i] >= kth && std::isfinite(s[i])) {
      alive.push_back(int32_t(i));
      m = std::max(m, s[i]);
    }

  // exp(s - max) once; both softmaxes reuse it (the max token survives every warper).
  std::vector<float>& e = w.e;  // [n_alive]
  e.resize(alive.size());
  for (size_t j = 0; j < alive.size(); ++j) e[j] = exp_f32(s[size_t(alive[j])] - m);

  // 3. top-p.
  std::vector<char>& keep = w.keep;  // [n_alive]
  keep.assign(alive.size(), 1);
  if (p.top_p < 1.0) {
    ExactSum total_e;
    for (float v : e) total_e.add(v);
    const double S = total_e.to_double();
    std::vector<float>& prob = w.prob;  // [n_alive]
    prob.resize(alive.size());
    for (size_t j = 0; j < alive.size(); ++j) prob[j] = float(double(e[j]) / S);
    const float threshold = float(1.0 - p.top_p);
    // float32(x) <= threshold  <=>  2x < t + t' or (2x == t + t' and t's last mantissa bit is
    // even, so the tie rounds down), with t' the next float32 above t: an integer comparison
    // instead of a rounding per probe of the bisection below.
    ExactSum bound2;  // t + t' in 2^-149 units = 2 * (their midpoint)
    bound2.add(threshold);
    bound2.add(std::nextafter(threshold, 2.0f));
    const bool tie_down = (std::bit_cast<uint32_t>(threshold) & 1u) == 0;
    auto removable = [&](const ExactSum& x) {
      ExactSum x2 = x;
      x2 += x;
      return x2 < bound2 || (tie_down && x2 == bound2);
    };
    // Remove the r smallest tokens in (s, id) order, r the largest value in [0, n-1] whose
    // prefix sum P(r) rounds to <= threshold (prefix sums only grow, so the predicate is
    // monotone and P(0) = 0 qualifies). Exact sums make P(r) independent of the order inside
    // the prefix, so a bisection with nth_element finds r in expected O(n) without sorting:
    // a[0, lo) are the lo smallest with exact sum sum_lo, a[end, n) are larger than a[lo, end),
    // and r lies in [lo, end].
    auto& a = w.order;  // [n] (s, index into alive): a strict total order, ties by id
    const size_t n = alive.size();
    a.resize(n);
    for (size_t j = 0; j < n; ++j) a[j] = {s[size_t(alive[j])], int32_t(j)};
    size_t lo = 0, end = n;
    ExactSum sum_lo;
    while (end - lo > 1) {
      const size_t mid = lo + (end - lo) / 2;  // lo < mid < end <= n, so mid <= n - 1
      std::nth_element(a.begin() + lo, a.begin() + mid, a.begin() + end);
      ExactSum sum_mid = sum_lo;
      for (size_t i = lo; i < mid; ++i) sum_mid.add(prob[size_t(a[i].second)]);
      if (removable(sum_mid)) {
        lo = mid;
        sum_lo = sum_mid;
      } else {
        end = mid;
      }
    }
    size_t r = lo;  // one candidate left: a[lo], the smallest of a[lo, n)
    if (end - lo == 1 && lo + 1 <= n - 1) {
      ExactSum with_it = sum_lo;
      with_it.add(prob[size_t(a[lo].second)]);
      if (removable(with_it)) r = lo + 1;
    }
    std::fill(keep.begin(), keep.end(), 0);
    for (size_t i = r; i < n; ++i) keep[size_t(a[i].second)] = 1;
  }

  // 4. softmax over the survivors, in ascending id order.
  ExactSum kept_e;
  for (size_t j = 0; j < alive.size(); ++j)
    if (keep[j]) kept_e.add(e[j]);
  const double S = kept_e.to_double();
  Distribution d;
  for (size_t j = 0; j < alive.size(); ++j) {
    if (!keep[j]) continue;
    const float q = float(double(e[j]) / S);
    if (q > 0.0f) {
      d.ids.push_back(alive[j]);
      d.probs.push_back(q);
    }
  }
  return d;
}

int64_t inverse_cdf(const Distribution& d, double u) {
  check(!d.ids.empty() && d.ids.size() == d.probs.size(), {}, "distribution", "empty or ragged");
  check(u >= 0.0 && u < 1.0, {}, "u", "must lie in [0, 1)");
  float c = 0.0f;
  for (size_t j = 0; j < d.ids.size(); ++j) {
    c += d.probs[j];
    if (u < double(c)) return d.ids[j];
  }
  return d.ids.back();  // float32 rounding left the total at or below u
}

RowSampler::RowSampler(SamplingParams params) : params_(std::move(params)) {
  validate(params_);
  if (params_.mode == SamplingMode::Seeded)
    state_sha256_ = philox_state_sha256({.seed = params_.seed, .stream = params_.stream, .step = 0, .draw = 0});
  else if (params_.mode == SamplingMode::Crn)
    state_sha256_ = crn_state_sha256(params_.seed, params_.crn_row_key, 0);
}

double RowSampler::uniform_at(uint64_t step) const {
  switch (params_.mode) {
    case SamplingMode::Seeded:
      return philox_uniform({.seed = params_.seed, .stream = params_.stream, .step = step, .draw = 0});
    case SamplingMode::Crn: return crn_uniform(params_.seed, params_.crn_row_key, step);
    case SamplingMode::Greedy: break;
  }
  fail({}, "mode", "greedy decoding draws no random numbers");
}

int64_t RowSampler::next(std::span<const float> logits) {
  const int64_t tok = params_.mode == SamplingMode::Greedy ? greedy_token(logits)
                                                           : inverse_cdf(warp(logits, params_), uniform_at(step_));
  ++step_;
  return tok;
}

}  // namespace atlas::decode
