#include "stats/bootstrap.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "core/error.h"
#include "decode/rng.h"
#include "stats/metrics.h"

namespace atlas::stats {

BootstrapDraws::BootstrapDraws(const BootstrapConfig& config, std::vector<uint32_t> units_per_stratum)
    : replicates_(config.replicates), units_(std::move(units_per_stratum)) {
  const decode::PhiloxKey key = decode::philox_key(config.seed);
  idx_.resize(units_.size());
  for (size_t d = 0; d < units_.size(); ++d) {
    const uint32_t n = units_[d];
    idx_[d].resize(size_t(replicates_) * n);
    for (uint32_t r = 0; r < replicates_; ++r) {
      for (uint32_t j = 0; j < n; ++j) {
        const decode::PhiloxPosition pos{.seed = config.seed, .stream = uint32_t(d), .step = r, .draw = j};
        const double u = decode::uniform_double(decode::philox4x32_10(decode::philox_counter(pos), key));
        idx_[d][size_t(r) * n + j] = std::min(uint32_t(u * double(n)), n - 1);  // u < 1, so < n anyway
      }
    }
  }
}

std::span<const uint32_t> BootstrapDraws::indices(size_t d, uint32_t r) const {
  return {idx_[d].data() + size_t(r) * units_[d], units_[d]};
}

void BootstrapDraws::multiplicity(size_t d, uint32_t r, std::span<double> out) const {
  for (double& m : out) m = 0;
  for (uint32_t i : indices(d, r)) out[i] += 1;
}

Interval percentile_interval(std::vector<double>& values, double level) {
  // Drop NaN in place (values is scratch for the caller).
  std::vector<double>& v = values;
  v.erase(std::remove_if(v.begin(), v.end(), [](double x) { return std::isnan(x); }), v.end());
  Interval iv{.lo = std::numeric_limits<double>::quiet_NaN(), .hi = std::numeric_limits<double>::quiet_NaN(),
              .valid = uint32_t(v.size())};
  if (v.empty()) return iv;
  iv.lo = percentile_type7(v, (1.0 - level) / 2.0);
  iv.hi = percentile_type7(v, (1.0 + level) / 2.0);
  return iv;
}

Interval percentile_interval_counted(std::vector<std::pair<double, uint32_t>>& v, double level) {
  v.erase(std::remove_if(v.begin(), v.end(), [](const auto& x) { return std::isnan(x.first) || x.second == 0; }), v.end());
  size_t n = 0;
  for (const auto& x : v) n += x.second;
  Interval iv{.lo = std::numeric_limits<double>::quiet_NaN(), .hi = std::numeric_limits<double>::quiet_NaN(),
              .valid = uint32_t(n)};
  if (n == 0) return iv;
  std::sort(v.begin(), v.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  // The k-th smallest (0-based) of the expanded list.
  auto order_stat = [&](size_t k) {
    size_t cum = 0;
    for (const auto& x : v) {
      cum += x.second;
      if (k < cum) return x.first;
    }
    return v.back().first;
  };
  // Type 7, as percentile_type7: x_lo + (h - lo) (x_lo+1 - x_lo), h = (n - 1) q.
  auto quantile = [&](double q) {
    const double h = double(n - 1) * q;
    const size_t lo = std::min(size_t(std::floor(h)), n - 1);
    const double xlo = order_stat(lo);
    if (lo + 1 >= n) return xlo;
    return xlo + (h - double(lo)) * (order_stat(lo + 1) - xlo);
  };
  iv.lo = quantile((1.0 - level) / 2.0);
  iv.hi = quantile((1.0 + level) / 2.0);
  return iv;
}

std::vector<Interval> bootstrap_strata(const BootstrapDraws& draws, std::span<const uint32_t> strata, size_t n_values,
                                        const BootstrapConfig& config, const StatEval& eval,
                                        const std::vector<uint8_t>* only) {
  const uint32_t R = draws.replicates();
  std::vector<Interval> out(n_values);
  if (R == 0 || n_values == 0) {
    for (auto& iv : out) iv.lo = iv.hi = std::numeric_limits<double>::quiet_NaN();
    return out;
  }
  std::vector<double> reps(size_t(R) * n_values);  // [R][n_values]
  size_t n_units = 0;
  for (uint32_t d : strata) n_units += draws.units(d);
#pragma omp parallel
  {
    std::vector<double> mult(n_units);
#pragma omp for schedule(static)
    for (int64_t r = 0; r < int64_t(R); ++r) {
      size_t off = 0;
      for (uint32_t d : strata) {
        draws.multiplicity(d, uint32_t(r), std::span<double>(mult.data() + off, draws.units(d)));
        off += draws.units(d);
      }
      eval(mult, std::span<double>(reps.data() + size_t(r) * n_values, n_values));
    }
  }
  return percentile_intervals(reps, R, n_values, config, only);
}

std::vector<Interval> percentile_intervals(const std::vector<double>& reps, uint32_t R, size_t n_values,
                                           const BootstrapConfig& config, const std::vector<uint8_t>* only) {
  std::vector<Interval> out(n_values);
  // Columns are gathered 8 at a time (one cache line of each row) before their percentiles.
  constexpr size_t kCols = 8;
  const int64_t n_chunks = int64_t((n_values + kCols - 1) / kCols);
#pragma omp parallel
  {
    std::vector<std::vector<double>> cols(kCols, std::vector<double>(R));
#pragma omp for schedule(dynamic)
    for (int64_t chunk = 0; chunk < n_chunks; ++chunk) {
      const size_t v0 = size_t(chunk) * kCols, nc = std::min(kCols, n_values - v0);
      for (auto& c : cols) c.resize(R);  // percentile_interval drops NaN from them
      bool any = false;
      for (size_t j = 0; j < nc; ++j) any |= !only || (*only)[v0 + j];
      if (!any) {  // nothing to resample in this chunk
        for (size_t j = 0; j < nc; ++j)
          out[v0 + j] = {.lo = std::numeric_limits<double>::quiet_NaN(), .hi = std::numeric_limits<double>::quiet_NaN()};
        continue;
      }
      for (uint32_t r = 0; r < R; ++r) {
        const double* row = &reps[size_t(r) * n_values + v0];
        for (size_t j = 0; j < nc; ++j) cols[j][r] = row[j];
      }
      for (size_t j = 0; j < nc; ++j)
        out[v0 + j] = (!only || (*only)[v0 + j])
                          ? percentile_interval(cols[j], config.level)
                          : Interval{.lo = std::numeric_limits<double>::quiet_NaN(),
                                     .hi = std::numeric_limits<double>::quiet_NaN()};
    }
  }
  return out;
}

}  // namespace atlas::stats
