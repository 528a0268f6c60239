#include "stats/direction.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "core/error.h"

namespace atlas::stats {
namespace {

// Run stage names (probe run: embed, layer.NN, final_norm) and the hooks whose values they are.
std::string hook_of_stage(const std::string& stage) {
  if (stage == "embed" || stage == "final_norm") return stage;
  if (stage.rfind("layer.", 0) == 0) return "blocks." + std::to_string(std::stoll(stage.substr(6))) + ".hook_resid_post";
  return "";
}

std::string list(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& x : v) s += (s.empty() ? "" : ", ") + x;
  return s;
}

}  // namespace

Direction mean_difference(const AnalysisInput& in, const DirectionOptions& o) {
  if (!in.has_hidden()) fail("runs", "hidden vectors", "none recorded (the protocol needs record_hidden_vectors = true)");
  Direction d;
  // The stage, by its run name or its hook name.
  size_t s = in.stages.size();
  for (size_t i = 0; i < in.stages.size(); ++i)
    if (in.stages[i] == o.stage || hook_of_stage(in.stages[i]) == o.stage) s = i;
  if (s == in.stages.size()) fail("--stage", {}, "no stage \"" + o.stage + "\" in the runs (" + list(in.stages) + ")");
  d.stage = in.stages[s];
  d.hook = hook_of_stage(d.stage);
  const auto cond = [&](const std::string& name, const char* flag) {
    auto it = std::find(in.conditions.begin(), in.conditions.end(), name);
    if (it == in.conditions.end()) fail(flag, {}, "no condition \"" + name + "\" in the runs (" + list(in.conditions) + ")");
    return uint32_t(it - in.conditions.begin());
  };
  const uint32_t a = cond(o.condition, "--condition"), b = cond(o.reference, "--reference");
  if (a == b) fail("--reference", {}, "the same condition as --condition");
  const size_t H = in.hidden_dim, S = in.stages.size();
  std::vector<double> sum_a(H, 0.0), sum_b(H, 0.0);
  for (const Cell& c : in.cells) {
    if ((c.condition != a && c.condition != b) || c.hidden.empty()) continue;
    const size_t R = c.hidden.size() / (S * H);
    std::vector<double>& sum = c.condition == a ? sum_a : sum_b;
    (c.condition == a ? d.cells_condition : d.cells_reference) += 1;
    (c.condition == a ? d.rows_condition : d.rows_reference) += int64_t(R);
    const float* rows = c.hidden.data() + s * R * H;
    for (size_t r = 0; r < R; ++r)
      for (size_t j = 0; j < H; ++j) sum[j] += double(rows[r * H + j]);
  }
  if (d.rows_condition == 0) fail("--condition", {}, "condition \"" + o.condition + "\" has no target rows");
  if (d.rows_reference == 0) fail("--reference", {}, "condition \"" + o.reference + "\" has no target rows");
  std::vector<double> diff(H);
  double sq = 0;
  for (size_t j = 0; j < H; ++j) {
    diff[j] = sum_a[j] / double(d.rows_condition) - sum_b[j] / double(d.rows_reference);
    sq += diff[j] * diff[j];
  }
  d.norm = std::sqrt(sq);
  if (o.normalize && d.norm == 0) fail("--normalize", {}, "the difference is zero: nothing to normalise");
  d.v.resize(H);
  for (size_t j = 0; j < H; ++j) d.v[j] = float(o.normalize ? diff[j] / d.norm : diff[j]);
  return d;
}

}  // namespace atlas::stats
