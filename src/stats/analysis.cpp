// The analysis: per-source sufficient statistics, then blocks of statistics that are
// evaluated once with every source weighted 1 (the point estimate) and once per bootstrap
// replicate with the replicate's multiplicities. Point and replicates share one code path, so
// they cannot drift apart. Every replicate costs O(sources x experts) per condition.
#include "stats/analysis.h"

#include <cmath>
#include <functional>
#include <limits>
#include <map>

#include "core/error.h"
#include "stats/metrics.h"

namespace atlas::stats {

namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
const char* const kScopes[2] = {"full", "target"};
const char* const kKinds[2] = {"count", "weight"};
const char* const kAggs[2] = {"token", "prompt"};

// A group of sources a block of statistics ranges over: one domain, or all of them.
struct Group {
  std::string name;
  std::vector<uint32_t> strata;   // domains whose draws are concatenated
  std::vector<uint32_t> sources;  // their sources, domain by domain, in input order
};

// Appends statistics to out, and (point pass only) their descriptions to meta.
struct Sink {
  double* out = nullptr;               // replicate pass: a row of n values
  std::vector<double>* grow = nullptr;  // point pass: values appended here
  std::vector<ojson>* meta = nullptr;   // point pass: descriptions appended here
  std::vector<uint8_t>* resampled = nullptr;  // point pass: 0 for statistics without an interval
  bool resampling = true;                     // what put() records there
  size_t n = 0;
  template <class Describe>  // a callable returning the statistic's ojson description
  void put(double v, const Describe& describe) {
    if (grow)
      grow->push_back(v);
    else
      out[n] = v;
    ++n;
    if (meta) meta->push_back(describe());
    if (resampled) resampled->push_back(resampling);
  }
};

ojson null_if_nan(double v) { return std::isnan(v) ? ojson(nullptr) : ojson(v); }

// Weighted mean sum_s m_s x_s / sum_s m_s over sources with defined values.
double ratio(double num, double den) { return den > 0 ? num / den : kNaN; }

// ---- routing --------------------------------------------------------------------------------

struct RouteSuff {
  // [layer][source][condition][scope][kind][expert]: raw counts or weight sums, and their
  // per-source normalised form (the per-prompt distribution).
  size_t L = 0, S = 0, C = 0, E = 0, n_edges = 0;
  std::vector<double> raw{}, frac{}, total{};  // total: [l][s][c][scope][kind]
  // [layer][source][edge]: ordered matches, set matches, jaccard sum, aligned tokens.
  std::vector<double> agree{};
  size_t at(size_t l, size_t s, size_t c, size_t sc, size_t k) const { return (((l * S + s) * C + c) * 2 + sc) * 2 + k; }
};

RouteSuff route_sufficient(const AnalysisInput& in, const std::vector<const Cell*>& grid) {
  RouteSuff r{.L = in.layers.size(), .S = in.sources.size(), .C = in.conditions.size(), .E = in.experts,
              .n_edges = in.edges.size()};
  const size_t k = in.top_k;
  r.raw.assign(r.L * r.S * r.C * 4 * r.E, 0.0);
  r.frac.assign(r.raw.size(), 0.0);
  r.total.assign(r.L * r.S * r.C * 4, 0.0);
  r.agree.assign(r.L * r.S * r.n_edges * 4, 0.0);
#pragma omp parallel for schedule(dynamic) collapse(2)
  for (int64_t l = 0; l < int64_t(r.L); ++l)
    for (int64_t s = 0; s < int64_t(r.S); ++s) {
      for (size_t c = 0; c < r.C; ++c) {
        const Cell& cell = *grid[s * r.C + c];
        const size_t T = cell.tokens;
        for (size_t sc = 0; sc < 2; ++sc) {
          double* cnt = &r.raw[r.at(l, s, c, sc, 0) * r.E];
          double* wt = &r.raw[r.at(l, s, c, sc, 1) * r.E];
          for (size_t t = 0; t < T; ++t) {
            if (sc == 1 && !cell.target[t]) continue;
            const size_t base = (size_t(l) * T + t) * k;
            for (size_t j = 0; j < k; ++j) {
              cnt[cell.topk_ids[base + j]] += 1.0;
              wt[cell.topk_ids[base + j]] += double(cell.topk_weights[base + j]);
            }
          }
          for (size_t kind = 0; kind < 2; ++kind) {
            const size_t a = r.at(l, s, c, sc, kind);
            double tot = 0;
            for (size_t e = 0; e < r.E; ++e) tot += r.raw[a * r.E + e];
            r.total[a] = tot;
            for (size_t e = 0; e < r.E; ++e) r.frac[a * r.E + e] = tot > 0 ? r.raw[a * r.E + e] / tot : kNaN;
          }
        }
      }
      for (size_t e = 0; e < r.n_edges; ++e) {
        const Cell& a = *grid[s * r.C + in.edges[e].condition];
        const Cell& b = *grid[s * r.C + in.edges[e].reference];
        std::vector<size_t> ta, tb;  // i-th target token of a aligns with the i-th of b
        for (size_t t = 0; t < a.tokens; ++t)
          if (a.target[t]) ta.push_back(t);
        for (size_t t = 0; t < b.tokens; ++t)
          if (b.target[t]) tb.push_back(t);
        double* g = &r.agree[((size_t(l) * r.S + s) * r.n_edges + e) * 4];
        for (size_t i = 0; i < ta.size(); ++i) {
          const auto x = topk_agreement({&a.topk_ids[(size_t(l) * a.tokens + ta[i]) * k], k},
                                        {&b.topk_ids[(size_t(l) * b.tokens + tb[i]) * k], k});
          g[0] += x.ordered;
          g[1] += x.set;
          g[2] += x.jaccard;
          g[3] += 1;
        }
      }
    }
  for (size_t i = 0; i < r.total.size(); ++i)
    if (r.total[i] <= 0)
      fail(in.files.empty() ? "" : in.files[0].path, "cells",
           "a routed cell has no routed weight in one scope (source \"" + in.sources[(i / 4 / r.C) % r.S].id +
               "\"): per-prompt distributions need at least one token with positive weight");
  return r;
}

struct RouteCtx {
  const AnalysisInput& in;
  const RouteSuff& r;
  const AnalysisOptions& opt;
  // log k for k = 0..K (log 0 taken as 0): the token-weighted count distributions are integer
  // counts over a common total, so their JSD needs no logarithm per replicate (see jsd_counts).
  // Empty when K would be too large; the general path is used then.
  std::vector<double> log_int{};
};

// JSD in bits of p = a / T and q = b / T for integer counts a, b with the same total T:
// p_i log(p_i / m_i) = (a_i / T) (log a_i - log(a_i + b_i) + log 2), and zero when a_i == b_i
// (then p_i == m_i) or a_i == 0. Same definition as jensen_shannon_bits, other rounding.
double jsd_counts(const double* a, const double* b, double T, size_t E, const std::vector<double>& L) {
  constexpr double kLn2 = 0x1.62e42fefa39efp-1;
  double tp[256], tq[256], kp = 0, kq = 0;
  for (size_t base = 0; base < E; base += 256) {
    const size_t n = std::min<size_t>(256, E - base);
    for (size_t i = 0; i < n; ++i) {
      const size_t x = size_t(a[base + i]), y = size_t(b[base + i]);
      const double shared = L[x + y] - kLn2;
      tp[i] = x == 0 || x == y ? 0.0 : double(x) * (L[x] - shared);
      tq[i] = y == 0 || x == y ? 0.0 : double(y) * (L[y] - shared);
    }
    kp += lane_sum(tp, n);
    kq += lane_sum(tq, n);
  }
  return (0.5 * (kp / T) + 0.5 * (kq / T)) / kLn2;  // 1/T factored out of every term
}

// Whether an expert distribution of this scope and kind is resampled (otherwise it keeps its
// point value and gets no interval): the seeds report intervals for both scopes of the count
// loads; weighted-load intervals are opt-in (docs/stats.md, "What is resampled").
bool resampled_dist(const AnalysisOptions& opt, size_t sc, size_t kind) {
  return (sc == 1 || opt.bootstrap_full_scope) && (kind == 0 || opt.bootstrap_weighted);
}

// Multiplicity-weighted, unnormalised sums of one group's sources for one layer:
// token-pooled loads tok and their total tot, prompt-balanced sums pb of the per-source
// distributions, and the multiplicity total msum. Index [combo][condition][expert] with combo
// = scope * 2 + kind. A domain's sums depend on that domain's multiplicities only, so they are
// computed once per distinct multiplicity vector (see eval_routing_layer); the pooled group
// "all" adds the domains' sums in domain order.
struct RouteSums {
  std::vector<double> tok, pb, tot;
  double msum = 0;
  void zero(size_t C, size_t E) {
    tok.assign(4 * C * E, 0.0), pb.assign(4 * C * E, 0.0), tot.assign(4 * C, 0.0), msum = 0;
  }
};

// sums of the sources `src` (one domain, in input order) with multiplicities mult.
void domain_sums(const RouteCtx& x, size_t l, std::span<const uint32_t> src, std::span<const double> mult,
                 const bool selected[4], RouteSums& out) {
  const RouteSuff& r = x.r;
  const size_t C = r.C, E = r.E;
  out.zero(C, E);
  for (size_t i = 0; i < src.size(); ++i) out.msum += mult[i];
  for (size_t combo = 0; combo < 4; ++combo) {
    if (!selected[combo]) continue;
    const size_t sc = combo / 2, kind = combo % 2;
    for (size_t c = 0; c < C; ++c) {
      double* pt = &out.tok[(combo * C + c) * E];
      double* pp = &out.pb[(combo * C + c) * E];
      double& tt = out.tot[combo * C + c];
      for (size_t i = 0; i < src.size(); ++i) {
        const double m = mult[i];
        if (m == 0) continue;
        const size_t a = r.at(l, src[i], c, sc, kind);
        const double* raw = &r.raw[a * E];
        const double* fr = &r.frac[a * E];
        for (size_t e = 0; e < E; ++e) pt[e] += m * raw[e];
        for (size_t e = 0; e < E; ++e) pp[e] += m * fr[e];
        tt += m * r.total[a];
      }
    }
  }
}

// out += s, element by element, for the selected combos (the pooled group's sums, domain
// after domain).
void add_sums(const RouteSums& s, const bool selected[4], RouteSums& out) {
  const size_t CE = out.tok.size() / 4, C = out.tot.size() / 4;
  for (size_t combo = 0; combo < 4; ++combo) {
    if (!selected[combo]) continue;
    for (size_t i = combo * CE; i < (combo + 1) * CE; ++i) out.tok[i] += s.tok[i];
    for (size_t i = combo * CE; i < (combo + 1) * CE; ++i) out.pb[i] += s.pb[i];
    for (size_t i = combo * C; i < (combo + 1) * C; ++i) out.tot[i] += s.tot[i];
  }
  out.msum += s.msum;
}

// Every routing statistic of one group and layer from its sums; mult (aligned with
// group.sources) weights the per-source top-k agreement counts.
void group_routing_stats(const RouteCtx& x, size_t l, const Group& group, const RouteSums& sums,
                         std::span<const double> mult, const bool selected[4], Sink& sink) {
  const RouteSuff& r = x.r;
  const auto& in = x.in;
  const size_t C = r.C, E = r.E;
  // Normalised distributions: token-weighted by the pooled total, prompt-balanced by the
  // multiplicity total (the number of drawn sources).
  thread_local std::vector<double> tok, pb, cv, logs;
  tok.resize(4 * C * E), pb.resize(4 * C * E), cv.assign(C, 0.0), logs.assign(C * E, 0.0);
  for (size_t combo = 0; combo < 4; ++combo) {
    if (!selected[combo]) continue;
    for (size_t c = 0; c < C; ++c) {
      const size_t v = combo * C + c;
      for (size_t e = 0; e < E; ++e) tok[v * E + e] = sums.tok[v * E + e] / sums.tot[v];
      for (size_t e = 0; e < E; ++e) pb[v * E + e] = sums.pb[v * E + e] / sums.msum;
    }
  }
  for (size_t combo = 0; combo < 4; ++combo) {
    const size_t sc = combo / 2, kind = combo % 2;
    const bool sel = selected[combo];
    sink.resampling = resampled_dist(x.opt, sc, kind);
    for (size_t agg = 0; agg < 2; ++agg) {
      const std::vector<double>& P = agg == 0 ? tok : pb;
      auto dist = [&](uint32_t c) { return std::span<const double>(&P[(combo * C + c) * E], E); };
      const bool counts = agg == 0 && kind == 0 && !x.log_int.empty();
      // log p of every condition once, shared by the JSD of every edge.
      if (sel && !counts)
        for (size_t c = 0; c < C; ++c) log_or_zero(dist(uint32_t(c)), std::span<double>(&logs[c * E], E));
      auto logd = [&](uint32_t c) { return std::span<const double>(&logs[c * E], E); };
      auto key = [&](const char* metric) {
        return ojson{{"metric", metric}, {"layer", in.layers[l]}, {"domain", group.name}, {"scope", kScopes[sc]},
                     {"kind", kKinds[kind]}, {"aggregation", kAggs[agg]}};
      };
      for (size_t c = 0; c < C; ++c) {
        cv[c] = sel ? coefficient_of_variation(dist(uint32_t(c))) : kNaN;
        sink.put(cv[c], [&] {
          ojson k = key("cv");
          k["condition"] = in.conditions[c];
          return k;
        });
      }
      for (const Edge& e : in.edges) {
        const double tv = sel ? total_variation(dist(e.condition), dist(e.reference)) : kNaN;
        double js = kNaN;
        if (sel && counts) {
          const size_t va = combo * C + e.condition, vb = combo * C + e.reference;
          if (sums.tot[va] == sums.tot[vb]) {
            js = jsd_counts(&sums.tok[va * E], &sums.tok[vb * E], sums.tot[va], E, x.log_int);
          } else {  // different totals (full scope of conditions of different lengths)
            std::vector<double> la(E), lb(E);
            log_or_zero(dist(e.condition), la);
            log_or_zero(dist(e.reference), lb);
            js = jensen_shannon_bits(dist(e.condition), la, dist(e.reference), lb);
          }
        } else if (sel) {
          js = jensen_shannon_bits(dist(e.condition), logd(e.condition), dist(e.reference), logd(e.reference));
        }
        sink.put(tv, [&] {
          ojson k = key("tv");
          k["edge"] = e.name;
          return k;
        });
        sink.put(js, [&] {
          ojson k = key("jsd_bits");
          k["edge"] = e.name;
          return k;
        });
      }
      for (const Factorial& f : in.factorials) {
        const auto eff = factorial_effects(cv[f.cell[0][0]], cv[f.cell[1][0]], cv[f.cell[0][1]], cv[f.cell[1][1]]);
        double mod_a = kNaN, mod_b = kNaN;
        if (sel) {
          // TV of the A edge at B=1 minus at B=0, and of the B edge at A=1 minus at A=0.
          mod_a = total_variation(dist(f.cell[1][1]), dist(f.cell[0][1])) -
                  total_variation(dist(f.cell[1][0]), dist(f.cell[0][0]));
          mod_b = total_variation(dist(f.cell[1][1]), dist(f.cell[1][0])) -
                  total_variation(dist(f.cell[0][1]), dist(f.cell[0][0]));
        }
        const std::pair<const char*, double> vals[] = {{"cv_main_a", eff.main_a},
                                                       {"cv_main_b", eff.main_b},
                                                       {"cv_did", eff.did},
                                                       {"tv_a_edge_modulation", mod_a},
                                                       {"tv_b_edge_modulation", mod_b}};
        for (const auto& [name, v] : vals)
          sink.put(v, [&] {
            ojson k = key(name);
            k["factorial"] = f.name;
            return k;
          });
      }
    }
  }
  // Top-k agreement over aligned target tokens: a token-weighted rate, summed over the
  // group's sources in order.
  sink.resampling = true;
  for (size_t ei = 0; ei < in.edges.size(); ++ei) {
    double num[3] = {0, 0, 0}, den = 0;
    for (size_t i = 0; i < group.sources.size(); ++i) {
      const double m = mult[i];
      const double* a = &r.agree[((l * r.S + group.sources[i]) * r.n_edges + ei) * 4];
      for (int q = 0; q < 3; ++q) num[q] += m * a[q];
      den += m * a[3];
    }
    const char* names[3] = {"ordered_exact_rate", "set_exact_rate", "jaccard"};
    for (int q = 0; q < 3; ++q)
      sink.put(ratio(num[q], den), [&] {
        ojson k{{"metric", names[q]}, {"layer", in.layers[l]}, {"domain", group.name}, {"scope", "target"},
                {"edge", in.edges[ei].name}};
        if (q < 2) k["count"] = int64_t(num[q]);
        if (q < 2) k["tokens"] = int64_t(den);
        return k;
      });
  }
}

// Every group of one layer for the multiplicities mult of every source, domain by domain (the
// order of the pooled group): each domain's sums and statistics, then the pooled group's.
void eval_routing(const RouteCtx& x, size_t l, const std::vector<Group>& groups, std::span<const double> mult,
                  const bool selected[4], Sink& sink) {
  const size_t D = x.in.domains.size(), C = x.r.C, E = x.r.E;
  thread_local RouteSums dom, all;
  all.zero(C, E);
  size_t off = 0;
  for (size_t d = 0; d < D; ++d) {
    const size_t n = groups[d].sources.size();
    domain_sums(x, l, groups[d].sources, mult.subspan(off, n), selected, dom);
    group_routing_stats(x, l, groups[d], dom, mult.subspan(off, n), selected, sink);
    if (groups.size() > D) add_sums(dom, selected, all);
    off += n;
  }
  if (groups.size() > D) group_routing_stats(x, l, groups[D], all, mult, selected, sink);
}

// The routing block of one layer: the point values (every statistic, described) and, with
// draws, the percentile intervals. A replicate's statistics of domain d depend only on d's
// multiplicity vector, which takes few distinct values when the domain has few sources (4
// sources: at most 35 multisets), so they are evaluated once per distinct vector and their
// percentiles taken from (value, number of replicates) pairs; the pooled group "all" adds the
// cached domain sums and is evaluated per replicate. Same bits as evaluating every replicate
// from scratch (same code, same order of operations, and a percentile depends only on the
// sorted values): tests/stats compares the two paths.
void eval_routing_layer(const RouteCtx& x, size_t l, const std::vector<Group>& groups, const BootstrapDraws* draws,
                        const BootstrapConfig& cfg, ojson& rows) {
  const size_t D = x.in.domains.size(), C = x.r.C, E = x.r.E;
  const bool pooled = groups.size() > D;
  // Point pass: every scope and kind.
  const bool all_sel[4] = {true, true, true, true};
  size_t n_all = 0;
  for (size_t d = 0; d < D; ++d) n_all += groups[d].sources.size();
  const std::vector<double> ones(n_all, 1.0);
  std::vector<ojson> meta;
  std::vector<double> point_values;
  std::vector<uint8_t> resampled;
  Sink ps{.grow = &point_values, .meta = &meta, .resampled = &resampled};
  eval_routing(x, l, groups, ones, all_sel, ps);
  const size_t nv = ps.n;
  const size_t per_group = nv / groups.size();  // every group has the same statistics

  std::vector<Interval> ivs;
  const uint32_t R = draws ? draws->replicates() : 0;
  if (R > 0) {
    ivs.resize(nv);
    bool sel[4];
    for (size_t combo = 0; combo < 4; ++combo) sel[combo] = resampled_dist(x.opt, combo / 2, combo % 2);
    // Distinct multiplicity vectors per domain (in order of first draw), the sums and
    // statistics of each, and how many replicates drew it.
    struct DomainCache {
      std::vector<uint32_t> pattern_of;  // [R]
      std::vector<std::vector<double>> mult;
      std::vector<uint32_t> count;
      std::vector<RouteSums> sums;
      std::vector<double> stats;  // [pattern][per_group]
    };
    std::vector<DomainCache> cache(D);
    for (size_t d = 0; d < D; ++d) {
      DomainCache& dc = cache[d];
      std::map<std::vector<double>, uint32_t> index;
      std::vector<double> m(draws->units(d));
      dc.pattern_of.resize(R);
      for (uint32_t r = 0; r < R; ++r) {
        draws->multiplicity(d, r, m);
        auto [it, fresh] = index.emplace(m, uint32_t(dc.mult.size()));
        if (fresh) dc.mult.push_back(m), dc.count.push_back(0);
        dc.pattern_of[r] = it->second;
        ++dc.count[it->second];
      }
      const size_t P = dc.mult.size();
      dc.sums.resize(P);
      dc.stats.assign(P * per_group, kNaN);
#pragma omp parallel for schedule(dynamic)
      for (int64_t p = 0; p < int64_t(P); ++p) {
        domain_sums(x, l, groups[d].sources, dc.mult[p], sel, dc.sums[p]);
        Sink s{.out = &dc.stats[size_t(p) * per_group]};
        group_routing_stats(x, l, groups[d], dc.sums[p], dc.mult[p], sel, s);
      }
      // Domain intervals from (value, replicates) pairs.
#pragma omp parallel for schedule(static)
      for (int64_t j = 0; j < int64_t(per_group); ++j) {
        const size_t v = d * per_group + size_t(j);
        if (!resampled[v]) {
          ivs[v] = {.lo = kNaN, .hi = kNaN};
          continue;
        }
        std::vector<std::pair<double, uint32_t>> vc(P);
        for (size_t p = 0; p < P; ++p) vc[p] = {dc.stats[p * per_group + size_t(j)], dc.count[p]};
        ivs[v] = percentile_interval_counted(vc, cfg.level);
      }
    }
    if (pooled) {
      std::vector<double> reps(size_t(R) * per_group);  // [R][per_group] of the pooled group
#pragma omp parallel
      {
        RouteSums all;
        std::vector<double> mult(n_all);
#pragma omp for schedule(static)
        for (int64_t r = 0; r < int64_t(R); ++r) {
          all.zero(C, E);
          size_t off = 0;
          for (size_t d = 0; d < D; ++d) {
            const DomainCache& dc = cache[d];
            const uint32_t p = dc.pattern_of[size_t(r)];
            add_sums(dc.sums[p], sel, all);
            std::copy(dc.mult[p].begin(), dc.mult[p].end(), mult.begin() + off);
            off += dc.mult[p].size();
          }
          Sink s{.out = &reps[size_t(r) * per_group]};
          group_routing_stats(x, l, groups[D], all, mult, sel, s);
        }
      }
      const std::vector<uint8_t> only(resampled.begin() + D * per_group, resampled.end());
      const std::vector<Interval> pooled_ivs = percentile_intervals(reps, R, per_group, cfg, &only);
      std::copy(pooled_ivs.begin(), pooled_ivs.end(), ivs.begin() + D * per_group);
    }
  }
  for (size_t i = 0; i < nv; ++i) {
    ojson row = std::move(meta[i]);
    row["value"] = null_if_nan(point_values[i]);
    if (!ivs.empty() && ivs[i].valid > 0)
      row["ci"] = ojson::array({null_if_nan(ivs[i].lo), null_if_nan(ivs[i].hi)});
    else if (!ivs.empty())
      row["ci"] = nullptr;
    rows.push_back(std::move(row));
  }
}

// ---- hidden states ----------------------------------------------------------------------------

struct HiddenSuff {
  // [stage][source][edge][8]: dot, aa, bb, dd (pooled sums), cos sum, rel sum, defined rows,
  // exact rows; and rows.
  size_t St = 0, S = 0, n_edges = 0;
  std::vector<double> v{};
  std::vector<double> rows{};  // [source]
  double* at(size_t st, size_t s, size_t e) { return &v[((st * S + s) * n_edges + e) * 8]; }
  const double* at(size_t st, size_t s, size_t e) const { return &v[((st * S + s) * n_edges + e) * 8]; }
};

HiddenSuff hidden_sufficient(const AnalysisInput& in, const std::vector<const Cell*>& grid) {
  HiddenSuff h{.St = in.stages.size(), .S = in.sources.size(), .n_edges = in.edges.size()};
  h.v.assign(h.St * h.S * h.n_edges * 8, 0.0);
  h.rows.assign(h.S, 0.0);
  const size_t C = in.conditions.size(), H = in.hidden_dim;
  for (size_t s = 0; s < h.S; ++s) h.rows[s] = double(grid[s * C]->hidden.size() / (h.St * H));
#pragma omp parallel for schedule(dynamic) collapse(2)
  for (int64_t st = 0; st < int64_t(h.St); ++st)
    for (int64_t s = 0; s < int64_t(h.S); ++s)
      for (size_t e = 0; e < h.n_edges; ++e) {
        const Cell& a = *grid[s * C + in.edges[e].condition];
        const Cell& b = *grid[s * C + in.edges[e].reference];
        const size_t R = size_t(h.rows[s]);
        double* o = h.at(st, s, e);
        for (size_t row = 0; row < R; ++row) {
          const size_t off = (size_t(st) * R + row) * H;
          const RowPair p = compare_rows({&a.hidden[off], H}, {&b.hidden[off], H});
          o[0] += p.dot, o[1] += p.aa, o[2] += p.bb, o[3] += p.dd;
          const double cs = cosine(p), rl = relative_l2(p);
          if (!std::isnan(cs) && !std::isnan(rl)) o[4] += cs, o[5] += rl, o[6] += 1;
          o[7] += p.exact;
        }
      }
  return h;
}

void eval_hidden(const AnalysisInput& in, const HiddenSuff& h, const Group& g, std::span<const double> mult,
                 Sink& sink) {
  const size_t n = g.sources.size();
  for (size_t ei = 0; ei < in.edges.size(); ++ei)
    for (size_t st = 0; st < h.St; ++st) {
      double acc[8] = {0, 0, 0, 0, 0, 0, 0, 0}, rows = 0;
      for (size_t i = 0; i < n; ++i) {
        const double* o = h.at(st, g.sources[i], ei);
        for (int q = 0; q < 8; ++q) acc[q] += mult[i] * o[q];
        rows += mult[i] * h.rows[g.sources[i]];
      }
      auto key = [&](const char* metric) {
        return ojson{{"metric", metric}, {"stage", in.stages[st]}, {"domain", g.name}, {"edge", in.edges[ei].name}};
      };
      const double cos_p = (acc[1] > 0 && acc[2] > 0) ? acc[0] / std::sqrt(acc[1] * acc[2]) : kNaN;
      const double rel_p = acc[2] > 0 ? std::sqrt(acc[3]) / std::sqrt(acc[2]) : kNaN;
      sink.put(ratio(acc[4], acc[6]), [&] { return key("cosine_row_mean"); });
      sink.put(ratio(acc[5], acc[6]), [&] { return key("relative_l2_row_mean"); });
      sink.put(cos_p, [&] { return key("cosine_pooled"); });
      sink.put(rel_p, [&] { return key("relative_l2_pooled"); });
      sink.put(ratio(acc[7], rows), [&] {
        ojson k = key("exact_row_rate");
        k["exact_rows"] = int64_t(acc[7]);
        k["rows"] = int64_t(rows);
        return k;
      });
    }
}

// ---- outputs and tasks ------------------------------------------------------------------------

// Cells with generated ids by (source, condition, repeat).
using OutKey = std::tuple<uint32_t, uint32_t, std::string>;

struct OutputSuff {
  // [source][edge][kOutVals]: pairs, exact, prefix sum, distance sum, similarity sum; then over
  // the pairs where both cells have a correctness verdict: pairs, both correct, condition only,
  // reference only.
  size_t S = 0, n_edges = 0;
  bool correctness = false;  // some cell has a verdict: the correctness contrasts are reported
  std::vector<double> v{};
};
constexpr size_t kOutVals = 9;

OutputSuff output_sufficient(const AnalysisInput& in, const std::map<OutKey, const Cell*>& cells) {
  OutputSuff o{.S = in.sources.size(), .n_edges = in.edges.size()};
  o.v.assign(o.S * o.n_edges * kOutVals, 0.0);
  for (const auto& kv : cells) o.correctness |= kv.second->correct.has_value();
  for (const auto& [key, ca] : cells) {
    const auto [s, c, rep] = key;
    for (size_t e = 0; e < in.edges.size(); ++e) {
      if (in.edges[e].condition != c) continue;
      auto it = cells.find({s, in.edges[e].reference, rep});
      if (it == cells.end()) continue;
      const std::vector<int32_t>& a = *ca->generated;
      const std::vector<int32_t>& b = *it->second->generated;
      double* p = &o.v[(s * o.n_edges + e) * kOutVals];
      const size_t d = levenshtein(a, b), n = std::max(a.size(), b.size());
      p[0] += 1;
      p[1] += a == b;
      p[2] += double(common_prefix(a, b));
      p[3] += double(d);
      p[4] += n == 0 ? 1.0 : 1.0 - double(d) / double(n);
      const std::optional<bool>&ka = ca->correct, &kb = it->second->correct;
      if (ka && kb) {
        p[5] += 1;
        p[6] += *ka && *kb;
        p[7] += *ka && !*kb;
        p[8] += !*ka && *kb;
      }
    }
  }
  return o;
}

void eval_outputs(const AnalysisInput& in, const OutputSuff& o, const Group& g, std::span<const double> mult,
                  Sink& sink) {
  for (size_t e = 0; e < in.edges.size(); ++e) {
    double acc[kOutVals] = {};
    for (size_t i = 0; i < g.sources.size(); ++i)
      for (size_t q = 0; q < kOutVals; ++q) acc[q] += mult[i] * o.v[(g.sources[i] * o.n_edges + e) * kOutVals + q];
    auto key = [&](const char* metric) {
      return ojson{{"metric", metric}, {"domain", g.name}, {"edge", in.edges[e].name}};
    };
    sink.put(ratio(acc[1], acc[0]), [&] {
      ojson k = key("exact_rate");
      k["exact"] = int64_t(acc[1]);
      k["pairs"] = int64_t(acc[0]);
      return k;
    });
    sink.put(ratio(acc[2], acc[0]), [&] { return key("mean_common_prefix"); });
    sink.put(ratio(acc[3], acc[0]), [&] { return key("mean_levenshtein"); });
    sink.put(ratio(acc[4], acc[0]), [&] { return key("mean_token_similarity"); });
    if (!o.correctness) continue;
    // Paired correctness (seed 4.8 edges with the evaluator's verdicts): over (source, repeat)
    // pairs where both cells have a verdict, condition correct rate minus reference's.
    const double pairs = acc[5], both = acc[6], a_only = acc[7], b_only = acc[8];
    sink.put(ratio(a_only - b_only, pairs), [&] {
      ojson k = key("correct_rate_difference");
      k["pairs"] = int64_t(pairs);
      k["both_correct"] = int64_t(both);
      k["condition_only"] = int64_t(a_only);
      k["reference_only"] = int64_t(b_only);
      k["neither"] = int64_t(pairs - both - a_only - b_only);
      return k;
    });
    sink.put(ratio(both + a_only, pairs), [&] { return key("correct_rate_condition"); });
    sink.put(ratio(both + b_only, pairs), [&] { return key("correct_rate_reference"); });
  }
}

// Per-source task values: for each condition the mean over its repeats of generated length,
// EOS (0/1) and correctness (0/1, cells with a verdict only); for each edge the mean over
// paired repeats of the within-source difference (the source-blocked contrast).
struct TaskSuff {
  size_t S = 0, C = 0, n_edges = 0;
  std::vector<double> cond{};  // [s][c][3][2]: value sum, count
  std::vector<double> edge{};  // [s][e][3][2]
};

const char* const kTaskVars[3] = {"generated_length", "eos", "correct"};

TaskSuff task_sufficient(const AnalysisInput& in, const std::map<OutKey, const Cell*>& cells) {
  TaskSuff t{.S = in.sources.size(), .C = in.conditions.size(), .n_edges = in.edges.size()};
  t.cond.assign(t.S * t.C * 6, 0.0);
  t.edge.assign(t.S * t.n_edges * 6, 0.0);
  auto vars = [](const Cell& c, double out[3], bool has[3]) {
    out[0] = double(c.generated->size()), has[0] = true;
    has[1] = c.stop.has_value(), out[1] = has[1] && *c.stop == "eos";
    has[2] = c.correct.has_value(), out[2] = has[2] && *c.correct;
  };
  for (const auto& [key, ca] : cells) {
    const auto [s, c, rep] = key;
    double va[3];
    bool ha[3];
    vars(*ca, va, ha);
    for (int q = 0; q < 3; ++q)
      if (ha[q]) t.cond[((s * t.C + c) * 3 + q) * 2] += va[q], t.cond[((s * t.C + c) * 3 + q) * 2 + 1] += 1;
    for (size_t e = 0; e < in.edges.size(); ++e) {
      if (in.edges[e].condition != c) continue;
      auto it = cells.find({s, in.edges[e].reference, rep});
      if (it == cells.end()) continue;
      double vb[3];
      bool hb[3];
      vars(*it->second, vb, hb);
      for (int q = 0; q < 3; ++q)
        if (ha[q] && hb[q])
          t.edge[((s * t.n_edges + e) * 3 + q) * 2] += va[q] - vb[q], t.edge[((s * t.n_edges + e) * 3 + q) * 2 + 1] += 1;
    }
  }
  return t;
}

// Source-balanced means: sum_s m_s x_s / sum_s m_s over the sources where x_s is defined.
void eval_tasks(const AnalysisInput& in, const TaskSuff& t, const Group& g, std::span<const double> mult, Sink& sink) {
  auto mean_over = [&](const std::vector<double>& v, size_t stride, size_t j, int q) {
    double num = 0, den = 0;
    for (size_t i = 0; i < g.sources.size(); ++i) {
      const double* p = &v[((g.sources[i] * stride + j) * 3 + q) * 2];
      if (p[1] > 0) num += mult[i] * (p[0] / p[1]), den += mult[i];
    }
    return ratio(num, den);
  };
  for (size_t c = 0; c < t.C; ++c)
    for (int q = 0; q < 3; ++q)
      sink.put(mean_over(t.cond, t.C, c, q), [&] {
        return ojson{{"metric", std::string("mean_") + kTaskVars[q]}, {"domain", g.name}, {"condition", in.conditions[c]}};
      });
  for (size_t e = 0; e < t.n_edges; ++e)
    for (int q = 0; q < 3; ++q)
      sink.put(mean_over(t.edge, t.n_edges, e, q), [&] {
        return ojson{{"metric", std::string("source_blocked_") + kTaskVars[q]}, {"domain", g.name},
                     {"edge", in.edges[e].name}};
      });
}

// ---- driving blocks ---------------------------------------------------------------------------

using BlockEval = std::function<void(std::span<const double> mult, Sink& sink, bool point)>;

// Runs one block: the point pass (describing every statistic) and, when draws are given,
// the replicates; appends one record per statistic to rows.
void run_block(const Group& g, const BootstrapDraws* draws, const BootstrapConfig& cfg, const BlockEval& eval,
               ojson& rows) {
  std::vector<ojson> meta;
  std::vector<double> point_values;
  std::vector<uint8_t> resampled;
  const std::vector<double> ones(g.sources.size(), 1.0);
  Sink ps{.grow = &point_values, .meta = &meta, .resampled = &resampled};
  eval(ones, ps, true);
  const size_t nv = ps.n;
  std::vector<Interval> ivs;
  if (draws && draws->replicates() > 0)
    ivs = bootstrap_strata(
        *draws, g.strata, nv, cfg,
        [&](std::span<const double> mult, std::span<double> out) {
          Sink s{.out = out.data()};
          eval(mult, s, false);
        },
        &resampled);
  for (size_t i = 0; i < nv; ++i) {
    ojson row = std::move(meta[i]);
    row["value"] = null_if_nan(point_values[i]);
    if (!ivs.empty() && ivs[i].valid > 0)
      row["ci"] = ojson::array({null_if_nan(ivs[i].lo), null_if_nan(ivs[i].hi)});
    else if (!ivs.empty())
      row["ci"] = nullptr;
    rows.push_back(std::move(row));
  }
}

ojson bootstrap_settings(const BootstrapConfig& c, const char* unit) {
  return {{"replicates", c.replicates},
          {"seed", c.seed},
          {"level", c.level},
          {"unit", unit},
          {"resampling", "with replacement within each domain; one index draw per replicate serves every condition"},
          {"rng", "philox4x32-10: key = seed, counter = (draw j, lo32(replicate), hi32(replicate), domain index); "
                  "u = ((w0:w1) >> 11) * 2^-53; index = floor(u * n_domain)"},
          {"interval", "percentile, type 7 (linear interpolation between order statistics, numpy's default) at "
                       "(1-level)/2 and (1+level)/2 over the replicates with a defined value"}};
}

}  // namespace

ojson analyze(const AnalysisInput& in, const AnalysisOptions& opt) {
  const size_t S = in.sources.size(), C = in.conditions.size();
  // Groups: every domain, then all domains pooled (still resampled within domains).
  std::vector<Group> groups;
  for (uint32_t d = 0; d < in.domains.size(); ++d) {
    Group g{.name = in.domains[d], .strata = {d}, .sources = {}};
    for (uint32_t s = 0; s < S; ++s)
      if (in.sources[s].domain == d) g.sources.push_back(s);
    groups.push_back(g);
  }
  if (groups.size() > 1) {
    Group all{.name = "all", .strata = {}, .sources = {}};
    for (const Group& g : groups) {
      all.strata.push_back(g.strata[0]);
      all.sources.insert(all.sources.end(), g.sources.begin(), g.sources.end());
    }
    groups.push_back(all);
  }
  // Every source, domain by domain: the block that evaluates all groups of a layer at once.
  Group everything{.name = "", .strata = {}, .sources = {}};
  for (size_t d = 0; d < in.domains.size(); ++d) {
    everything.strata.push_back(uint32_t(d));
    everything.sources.insert(everything.sources.end(), groups[d].sources.begin(), groups[d].sources.end());
  }
  std::vector<uint32_t> units;
  for (size_t d = 0; d < in.domains.size(); ++d) units.push_back(uint32_t(groups[d].sources.size()));

  ojson out;
  out["format"] = "atlas-analysis-v1";
  ojson files = ojson::array();
  for (const auto& f : in.files) files.push_back({{"path", f.path}, {"sha256", f.sha256}});
  out["inputs"] = files;
  out["manifest_sha256"] = in.manifest_sha256.empty() ? ojson(nullptr) : ojson(in.manifest_sha256);
  out["settings"] = {{"bootstrap", bootstrap_settings(opt.bootstrap, "source")},
                     {"task_bootstrap", bootstrap_settings(opt.task_bootstrap, "source (task)")},
                     {"bootstrap_full_scope", opt.bootstrap_full_scope},
                     {"bootstrap_weighted", opt.bootstrap_weighted},
                     {"resampled_expert_distributions",
                      std::string("scope target") + (opt.bootstrap_full_scope ? " and full" : "") + ", kind count" +
                          (opt.bootstrap_weighted ? " and weight" : "") +
                          "; the others keep their point value with \"ci\": null. Every other statistic is resampled"}};
  out["definitions"] = {
      {"load", "per expert, the number of top-k selections (kind count) or the sum of gate weights (kind weight) "
               "over the tokens in scope, normalised to sum to 1"},
      {"token_weighted", "aggregation token: pool the selections of every token of every source, then normalise"},
      {"prompt_balanced", "aggregation prompt: normalise each source's load, then average the sources with equal weight"},
      {"cv", "population standard deviation / mean over the experts' loads"},
      {"tv", "1/2 sum_i |p_i - q_i|, p = condition, q = reference"},
      {"jsd_bits", "1/2 KL(p||m) + 1/2 KL(q||m) with m = (p+q)/2, log base 2 (range [0, 1])"},
      {"ordered_exact_rate", "fraction of aligned target tokens with the same ordered top-k expert list"},
      {"set_exact_rate", "fraction of aligned target tokens with the same top-k expert set"},
      {"jaccard", "mean over aligned target tokens of |A n B| / |A u B| of the top-k sets"},
      {"factorial", "cv_main_a = 1/2[(m10-m00)+(m11-m01)], cv_did = (m11-m01)-(m10-m00) with m_ab the CV at A=a, "
                    "B=b; tv_a_edge_modulation = TV(a1b1,a0b1) - TV(a1b0,a0b0)"},
      {"scope", "full: every input token; target: the cell's target tokens (exact target content); the i-th "
                "target token of every condition of a source are aligned"},
      {"cosine_row_mean", "mean over aligned target rows (all sources pooled) of a.b / (|a| |b|)"},
      {"cosine_pooled", "sum a.b / sqrt(sum |a|^2 sum |b|^2) over all aligned target rows, as one long vector"},
      {"relative_l2_row_mean", "mean over rows of |a-b| / |b|, b = the edge's reference condition"},
      {"relative_l2_pooled", "sqrt(sum |a-b|^2) / sqrt(sum |b|^2) over all aligned target rows"},
      {"exact_row_rate", "fraction of rows whose vectors are bitwise equal (float32 bits)"},
      {"min_cosine_stage", "the stage with the lowest cosine (first such stage on ties)"},
      {"outputs", "over (source, repeat) pairs of the edge: exact = identical id sequences; common prefix length; "
                  "Levenshtein distance over token ids; similarity = 1 - distance / max(len) (1 for two empty)"},
      {"tasks", "per source the mean over repeats, then the source-balanced mean over sources; source_blocked_* = "
                "mean over sources of the within-source mean over paired repeats of (condition - reference)"},
      {"summation", "sequential in index order (experts, tokens, sources in input order); logs via det_log"}};

  // Counts.
  ojson counts = {{"domains", in.domains.size()}, {"sources", S}, {"conditions", C}, {"cells", in.cells.size()}};
  ojson per_domain = ojson::object();
  for (size_t d = 0; d < in.domains.size(); ++d) per_domain[in.domains[d]] = groups[d].sources.size();
  counts["sources_per_domain"] = per_domain;
  out["counts"] = counts;
  // The comparisons analysed, and where they come from (declared, or the default).
  ojson edges = ojson::array(), facs = ojson::array();
  for (const Edge& e : in.edges)
    edges.push_back({{"name", e.name}, {"condition", in.conditions[e.condition]}, {"reference", in.conditions[e.reference]}});
  for (const Factorial& f : in.factorials)
    facs.push_back({{"name", f.name}, {"a", f.factor_a}, {"b", f.factor_b}, {"a0b0", in.conditions[f.cell[0][0]]},
                    {"a1b0", in.conditions[f.cell[1][0]]}, {"a0b1", in.conditions[f.cell[0][1]]},
                    {"a1b1", in.conditions[f.cell[1][1]]}});
  out["design"] = {{"origin", in.design_origin}, {"edges", edges}, {"factorials", facs}};
  if (!in.eval_join.is_null()) out["eval"] = in.eval_join;

  // ---- routing
  if (in.has_routes()) {
    std::vector<const Cell*> grid(S * C, nullptr);
    uint64_t decisions = 0, target_decisions = 0;
    for (const Cell& c : in.cells)
      if (!c.topk_ids.empty()) {
        grid[c.source * C + c.condition] = &c;
        decisions += c.topk_ids.size();
        size_t nt = 0;
        for (uint8_t m : c.target) nt += m;
        target_decisions += nt * in.layers.size() * in.top_k;
      }
    const RouteSuff r = route_sufficient(in, grid);
    const BootstrapDraws draws(opt.bootstrap, units);
    RouteCtx ctx{.in = in, .r = r, .opt = opt};
    // Largest possible pooled count: every domain's draws all landing on its largest source.
    double max_count = 0;
    for (size_t d = 0; d < in.domains.size(); ++d) {
      double biggest = 0;
      for (uint32_t s : groups[d].sources)
        for (size_t l = 0; l < r.L; ++l)
          for (size_t c = 0; c < C; ++c) biggest = std::max(biggest, r.total[r.at(l, s, c, 0, 0)]);
      max_count += double(groups[d].sources.size()) * biggest;
    }
    if (2 * max_count + 1 <= double(1 << 24)) {
      ctx.log_int.resize(size_t(2 * max_count) + 1);
      ctx.log_int[0] = 0;
      for (size_t k = 1; k < ctx.log_int.size(); ++k) ctx.log_int[k] = det_log(double(k));
    }
    ojson rows = ojson::array();
    for (size_t l = 0; l < r.L; ++l) {
      if (opt.share_domain_replicates) {
        eval_routing_layer(ctx, l, groups, &draws, opt.bootstrap, rows);
        continue;
      }
      // The straightforward path: every replicate evaluated from its multiplicities.
      run_block(everything, &draws, opt.bootstrap, [&](std::span<const double> m, Sink& s, bool point) {
        bool sel[4];
        for (size_t combo = 0; combo < 4; ++combo) sel[combo] = point || resampled_dist(opt, combo / 2, combo % 2);
        eval_routing(ctx, l, groups, m, sel, s);
      }, rows);
    }
    // Expert loads (token-weighted, not normalised) for bar charts: [layer][group][cond][scope].
    ojson loads = ojson::array();
    for (size_t l = 0; l < r.L; ++l)
      for (const Group& g : groups)
        for (size_t c = 0; c < C; ++c)
          for (size_t sc = 0; sc < 2; ++sc) {
            std::vector<double> cnt(r.E, 0.0), wt(r.E, 0.0);
            double tokens = 0;
            for (uint32_t s : g.sources) {
              for (size_t e = 0; e < r.E; ++e) cnt[e] += r.raw[r.at(l, s, c, sc, 0) * r.E + e];
              for (size_t e = 0; e < r.E; ++e) wt[e] += r.raw[r.at(l, s, c, sc, 1) * r.E + e];
              tokens += r.total[r.at(l, s, c, sc, 0)] / double(in.top_k);
            }
            std::vector<int64_t> icnt(cnt.begin(), cnt.end());
            loads.push_back({{"layer", in.layers[l]}, {"domain", g.name}, {"condition", in.conditions[c]},
                             {"scope", kScopes[sc]}, {"tokens", int64_t(tokens)}, {"load", icnt}, {"weighted_load", wt}});
          }
    out["routing"] = {{"layers", in.layers}, {"experts", in.experts}, {"top_k", in.top_k},
                      {"route_decisions", decisions}, {"target_route_decisions", target_decisions},
                      {"stats", rows}, {"loads", loads}};
  }

  // ---- hidden states
  if (in.has_hidden()) {
    std::vector<const Cell*> grid(S * C, nullptr);
    for (const Cell& c : in.cells)
      if (!c.hidden.empty()) grid[c.source * C + c.condition] = &c;
    const HiddenSuff h = hidden_sufficient(in, grid);
    const BootstrapDraws draws(opt.bootstrap, units);
    ojson rows = ojson::array();
    for (const Group& g : groups)
      run_block(g, &draws, opt.bootstrap, [&](std::span<const double> m, Sink& s, bool) {
        eval_hidden(in, h, g, m, s);
      }, rows);
    // Min-cosine stage per (domain, edge) for both cosine definitions.
    ojson minc = ojson::array();
    for (const char* metric : {"cosine_row_mean", "cosine_pooled"})
      for (const Group& g : groups)
        for (const Edge& e : in.edges) {
          double best = kNaN;
          std::string stage;
          for (const auto& row : rows)
            if (row["metric"] == metric && row["domain"] == g.name && row["edge"] == e.name && row["value"].is_number() &&
                (stage.empty() || row["value"].get<double>() < best)) {
              best = row["value"].get<double>();
              stage = row["stage"].get<std::string>();
            }
          minc.push_back({{"metric", metric}, {"domain", g.name}, {"edge", e.name},
                          {"stage", stage.empty() ? ojson(nullptr) : ojson(stage)}, {"value", null_if_nan(best)}});
        }
    out["hidden"] = {{"stages", in.stages}, {"hidden_dim", in.hidden_dim}, {"stats", rows}, {"min_cosine_stage", minc}};
  }

  // ---- outputs, ledgers, tasks
  std::map<OutKey, const Cell*> gen;
  for (const Cell& c : in.cells)
    if (c.generated) gen[{c.source, c.condition, c.repeat}] = &c;
  if (!gen.empty()) {
    const OutputSuff o = output_sufficient(in, gen);
    const BootstrapDraws draws(opt.bootstrap, units);
    ojson rows = ojson::array();
    for (const Group& g : groups)
      run_block(g, &draws, opt.bootstrap, [&](std::span<const double> m, Sink& s, bool) {
        eval_outputs(in, o, g, m, s);
      }, rows);
    // Uniqueness and ledgers (counts; no intervals). The terminal-state ledger appears when an
    // evaluator's verdicts were joined.
    ojson uniq = ojson::array(), ledgers = ojson::array();
    bool any_terminal = false;
    for (const auto& kv : gen) any_terminal |= kv.second->terminal.has_value();
    for (const Group& g : groups) {
      std::vector<bool> in_group(S, false);
      for (uint32_t s : g.sources) in_group[s] = true;
      for (size_t c = 0; c <= C; ++c) {  // c == C: every condition together
        std::vector<std::span<const int32_t>> seqs;
        int64_t eos = 0, length = 0, stop_missing = 0, ev_t = 0, ev_f = 0, ev_m = 0, co_t = 0, co_f = 0, co_m = 0;
        std::map<std::string, int64_t> terminal;  // sorted states: deterministic order
        double len_sum = 0;
        for (const auto& [key, cell] : gen) {
          if (!in_group[std::get<0>(key)] || (c < C && std::get<1>(key) != c)) continue;
          seqs.emplace_back(*cell->generated);
          len_sum += double(cell->generated->size());
          (!cell->stop ? stop_missing : *cell->stop == "eos" ? eos : length) += 1;
          (!cell->evaluable ? ev_m : *cell->evaluable ? ev_t : ev_f) += 1;
          (!cell->correct ? co_m : *cell->correct ? co_t : co_f) += 1;
          if (any_terminal) terminal[cell->terminal.value_or("unknown")] += 1;
        }
        const std::string cname = c < C ? in.conditions[c] : "all";
        uniq.push_back({{"domain", g.name}, {"condition", cname}, {"outputs", seqs.size()},
                        {"distinct", distinct_sequences(seqs)}});
        ledgers.push_back({{"domain", g.name},
                           {"condition", cname},
                           {"outputs", seqs.size()},
                           {"mean_generated_length", seqs.empty() ? ojson(nullptr) : ojson(len_sum / double(seqs.size()))},
                           {"stopping", {{"eos", eos}, {"length", length}, {"unknown", stop_missing}}},
                           {"evaluability", {{"evaluable", ev_t}, {"not_evaluable", ev_f}, {"unknown", ev_m}}},
                           {"correctness", {{"correct", co_t}, {"incorrect", co_f}, {"unknown", co_m}}}});
        if (any_terminal) {
          ojson tj = ojson::object();
          for (const auto& [k, n] : terminal) tj[k] = n;
          ledgers.back()["terminal"] = tj;
        }
      }
    }
    // Tasks: source-balanced means and source-blocked contrasts, with the task bootstrap.
    const TaskSuff t = task_sufficient(in, gen);
    const BootstrapDraws tdraws(opt.task_bootstrap, units);
    ojson trows = ojson::array();
    for (const Group& g : groups)
      run_block(g, &tdraws, opt.task_bootstrap, [&](std::span<const double> m, Sink& s, bool) {
        eval_tasks(in, t, g, m, s);
      }, trows);
    // Per-source directions of each source-blocked contrast.
    ojson blocked = ojson::array();
    for (size_t e = 0; e < in.edges.size(); ++e)
      for (int q = 0; q < 3; ++q)
        for (const Group& g : groups) {
          ojson per = ojson::array();
          int64_t up = 0, down = 0, zero = 0;
          for (uint32_t s : g.sources) {
            const double* p = &t.edge[((s * t.n_edges + e) * 3 + q) * 2];
            if (p[1] == 0) continue;
            const double v = p[0] / p[1];
            (v > 0 ? up : v < 0 ? down : zero) += 1;
            per.push_back({{"source", in.sources[s].id}, {"pairs", int64_t(p[1])}, {"value", v}});
          }
          blocked.push_back({{"edge", in.edges[e].name}, {"variable", kTaskVars[q]}, {"domain", g.name},
                             {"up", up}, {"down", down}, {"zero", zero}, {"sources", per}});
        }
    out["outputs"] = {{"stats", rows}, {"uniqueness", uniq}, {"ledgers", ledgers}};
    out["tasks"] = {{"stats", trows}, {"source_blocked", blocked}};
  }
  return out;
}

}  // namespace atlas::stats
