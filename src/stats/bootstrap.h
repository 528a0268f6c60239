// Paired, stratified bootstrap over sources (seed-system.md 4.9) with portable index draws.
//
// Units (sources, or tasks) are resampled with replacement within their stratum (domain).
// One index draw per replicate serves every condition, layer, stage and metric: the pairing
// lives in the draws, which are a pure function of (seed, stratum, replicate, draw):
//     u     = uniform_double(philox4x32_10(counter = (j, lo32(r), hi32(r), d), key = seed))
//     index = floor(u * n_d)
// for draw j = 0..n_d-1 of replicate r = 0..R-1 in stratum d (its position in the declared
// domain order), with atlas's Philox4x32-10 stream (src/decode/rng.h). So intervals are the
// same on every machine and for every thread count, and tests can redraw them independently.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <vector>

namespace atlas::stats {

struct BootstrapConfig {
  uint32_t replicates = 2000;
  uint64_t seed = 20260729;
  double level = 0.95;  // two-sided percentile interval: quantiles (1-level)/2 and (1+level)/2
};

// All index draws of one bootstrap, precomputed (R x n_d small integers per stratum).
class BootstrapDraws {
 public:
  BootstrapDraws(const BootstrapConfig& config, std::vector<uint32_t> units_per_stratum);
  uint32_t replicates() const { return replicates_; }
  uint32_t units(size_t stratum) const { return units_[stratum]; }
  // The drawn unit indices of replicate r in stratum d, in draw order: [n_d].
  std::span<const uint32_t> indices(size_t stratum, uint32_t r) const;
  // How often each unit of stratum d was drawn in replicate r: out[n_d], summing to n_d.
  void multiplicity(size_t stratum, uint32_t r, std::span<double> out) const;

 private:
  uint32_t replicates_;
  std::vector<uint32_t> units_;
  std::vector<std::vector<uint32_t>> idx_;  // [d][r * n_d + j]
};

struct Interval {
  double lo = 0, hi = 0;
  uint32_t valid = 0;  // replicates with a defined (non-NaN) value
};

// Percentile interval (type 7 quantiles, see metrics.h) over the non-NaN values; NaN bounds
// when no replicate is defined. `values` is scratch: NaN are removed and the rest reordered.
Interval percentile_interval(std::vector<double>& values, double level);

// Evaluates a statistic vector for each replicate over the units of the given strata and
// returns the intervals. eval(mult, out) fills out[n_values] from the multiplicities of the
// strata's units, concatenated in the order given (one stratum for a domain, every stratum
// for the pooled "all", still resampled within each domain); it must be a pure
// function of its arguments (it is called from several OpenMP threads at once, each with its
// own out). Replicates run in parallel; each writes its own row, so the result does not
// depend on the thread count.
using StatEval = std::function<void(std::span<const double> mult, std::span<double> out)>;
// Values whose entry in `only` is 0 get no interval (NaN bounds, valid 0) and their
// percentiles are not computed (eval may leave them NaN); nullptr = every value.
// The same interval from distinct values with their multiplicities (value, count): equal to
// percentile_interval over the list with each value repeated count times. NaN values are
// left out; `values` is reordered.
Interval percentile_interval_counted(std::vector<std::pair<double, uint32_t>>& values, double level);

// Percentile intervals of the columns of reps ([R][n_values] replicate values, row-major);
// columns whose entry in `only` is 0 get NaN bounds (nullptr = every column).
std::vector<Interval> percentile_intervals(const std::vector<double>& reps, uint32_t R, size_t n_values,
                                           const BootstrapConfig& config, const std::vector<uint8_t>* only = nullptr);

std::vector<Interval> bootstrap_strata(const BootstrapDraws& draws, std::span<const uint32_t> strata, size_t n_values,
                                       const BootstrapConfig& config, const StatEval& eval,
                                       const std::vector<uint8_t>* only = nullptr);

}  // namespace atlas::stats
