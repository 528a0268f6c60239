// report.md: the seed-style tables of an analysis (every number comes from analysis.json).
#include <cmath>
#include <cstdio>
#include <map>
#include <set>
#include <string>

#include "stats/analysis.h"

namespace atlas::stats {

namespace {

std::string num(const ojson& v, int digits = 4) {
  if (!v.is_number()) return "n/a";
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", digits, v.get<double>());
  return buf;
}

std::string with_ci(const ojson& row, int digits = 4) {
  std::string s = num(row["value"], digits);
  if (row.contains("ci") && row["ci"].is_array()) s += " [" + num(row["ci"][0], digits) + ", " + num(row["ci"][1], digits) + "]";
  return s;
}

bool match(const ojson& row, const std::map<std::string, std::string>& want) {
  for (const auto& [k, v] : want)
    if (!row.contains(k) || !row[k].is_string() || row[k].get<std::string>() != v) return false;
  return true;
}

// The summary group: "all" when there are several domains, else the only one.
std::string summary_group(const ojson& stats) {
  std::set<std::string> d;
  for (const auto& r : stats) d.insert(r["domain"].get<std::string>());
  return d.count("all") ? "all" : (d.empty() ? "" : *d.begin());
}

std::vector<std::string> ordered_values(const ojson& stats, const char* key) {
  std::vector<std::string> out;
  std::set<std::string> seen;
  for (const auto& r : stats)
    if (r.contains(key) && r[key].is_string() && seen.insert(r[key].get<std::string>()).second)
      out.push_back(r[key].get<std::string>());
  return out;
}

}  // namespace

std::string report_markdown(const ojson& a) {
  std::string md = "# atlas analysis\n\n";
  const ojson& bs = a["settings"]["bootstrap"];
  md += "Intervals: " + std::to_string(int(bs["level"].get<double>() * 100)) + "% percentile (type 7) over " +
        std::to_string(bs["replicates"].get<int64_t>()) + " paired source bootstraps within domain, seed " +
        std::to_string(bs["seed"].get<uint64_t>()) + ". Definitions: analysis.json `definitions`, docs/stats.md.\n\n";
  md += "Inputs:\n";
  for (const auto& f : a["inputs"]) md += "- `" + f["path"].get<std::string>() + "` sha256 `" + f["sha256"].get<std::string>() + "`\n";
  md += "\n";
  if (a.contains("design")) {
    const ojson& d = a["design"];
    md += "Edges (" + d["origin"].get<std::string>() + "):";
    for (const auto& e : d["edges"])
      md += " `" + e["name"].get<std::string>() + "` = " + e["condition"].get<std::string>() + " vs " +
            e["reference"].get<std::string>() + ";";
    md += "\n";
    for (const auto& f : d["factorials"])
      md += "Factorial `" + f["name"].get<std::string>() + "`: A = " + f["a"].get<std::string>() + ", B = " +
            f["b"].get<std::string>() + "; a0b0 " + f["a0b0"].get<std::string>() + ", a1b0 " +
            f["a1b0"].get<std::string>() + ", a0b1 " + f["a0b1"].get<std::string>() + ", a1b1 " +
            f["a1b1"].get<std::string>() + "\n";
    md += "\n";
  }

  if (a.contains("routing")) {
    const ojson& st = a["routing"]["stats"];
    md += "## Routing\n\n" + std::to_string(a["routing"]["route_decisions"].get<uint64_t>()) +
          " route decisions in the input, " + std::to_string(a["routing"]["target_route_decisions"].get<uint64_t>()) +
          " in the target scope.\n\n";
    const auto domains = ordered_values(st, "domain");
    const auto layers = ordered_values(st, "layer");
    for (const std::string& edge : ordered_values(st, "edge")) {
      for (const auto& [metric, agg, title] :
           {std::tuple{"tv", "prompt", "TV, target scope, prompt-balanced"},
            std::tuple{"tv", "token", "TV, target scope, token-weighted"},
            std::tuple{"ordered_exact_rate", "", "ordered top-k exact rate, aligned target tokens"}}) {
        md += "### " + edge + ": " + title + "\n\n| layer |";
        for (const auto& d : domains) md += " " + d + " |";
        md += "\n|---|";
        for (size_t i = 0; i < domains.size(); ++i) md += "---|";
        md += "\n";
        for (const auto& l : layers) {
          md += "| " + l + " |";
          for (const auto& d : domains) {
            std::map<std::string, std::string> want{{"metric", metric}, {"edge", edge}, {"layer", l}, {"domain", d},
                                                    {"scope", "target"}};
            if (*agg) want["aggregation"] = agg, want["kind"] = "count";
            std::string cell = "n/a";
            for (const auto& r : st)
              if (match(r, want)) cell = with_ci(r);
            md += " " + cell + " |";
          }
          md += "\n";
        }
        md += "\n";
      }
    }
  }

  if (a.contains("hidden")) {
    const ojson& st = a["hidden"]["stats"];
    const std::string g = summary_group(st);
    md += "## Hidden states (domain " + g + ", aligned target rows)\n\n";
    for (const std::string& edge : ordered_values(st, "edge")) {
      md += "### " + edge + "\n\n| stage | cosine (row mean) | relative L2 (row mean) | cosine (pooled) | exact rows |\n|---|---|---|---|---|\n";
      for (const std::string& stage : ordered_values(st, "stage")) {
        std::string c1 = "n/a", c2 = "n/a", c3 = "n/a", c4 = "n/a";
        for (const auto& r : st) {
          if (!match(r, {{"edge", edge}, {"stage", stage}, {"domain", g}})) continue;
          const std::string m = r["metric"].get<std::string>();
          if (m == "cosine_row_mean") c1 = with_ci(r, 5);
          if (m == "relative_l2_row_mean") c2 = with_ci(r, 5);
          if (m == "cosine_pooled") c3 = with_ci(r, 5);
          if (m == "exact_row_rate")
            c4 = std::to_string(r["exact_rows"].get<int64_t>()) + "/" + std::to_string(r["rows"].get<int64_t>());
        }
        md += "| " + stage + " | " + c1 + " | " + c2 + " | " + c3 + " | " + c4 + " |\n";
      }
      for (const auto& m : a["hidden"]["min_cosine_stage"])
        if (match(m, {{"edge", edge}, {"domain", g}}))
          md += "\nMin-cosine stage (" + m["metric"].get<std::string>() + "): " +
                (m["stage"].is_string() ? m["stage"].get<std::string>() : "n/a") + " at " + num(m["value"], 5) + "\n";
      md += "\n";
    }
  }

  if (a.contains("outputs")) {
    const ojson& st = a["outputs"]["stats"];
    md += "## Outputs\n\n| edge | domain | exact/pairs | mean common prefix | mean edit distance | similarity |\n"
          "|---|---|---|---|---|---|\n";
    for (const std::string& edge : ordered_values(st, "edge"))
      for (const std::string& d : ordered_values(st, "domain")) {
        std::string c[4] = {"n/a", "n/a", "n/a", "n/a"};
        for (const auto& r : st) {
          if (!match(r, {{"edge", edge}, {"domain", d}})) continue;
          const std::string m = r["metric"].get<std::string>();
          if (m == "exact_rate")
            c[0] = std::to_string(r["exact"].get<int64_t>()) + "/" + std::to_string(r["pairs"].get<int64_t>());
          if (m == "mean_common_prefix") c[1] = with_ci(r, 3);
          if (m == "mean_levenshtein") c[2] = with_ci(r, 3);
          if (m == "mean_token_similarity") c[3] = with_ci(r, 4);
        }
        md += "| " + edge + " | " + d + " | " + c[0] + " | " + c[1] + " | " + c[2] + " | " + c[3] + " |\n";
      }
    if (!ordered_values(st, "metric").empty()) {
      bool any = false;
      for (const auto& r : st) any |= r["metric"] == "correct_rate_difference";
      if (any) {
        md += "\n### Paired correctness\n\nOver (source, repeat) pairs where both cells have a verdict.\n\n"
              "| edge | domain | pairs | both / condition only / reference only / neither | condition - reference |\n"
              "|---|---|---|---|---|\n";
        for (const auto& r : st)
          if (r["metric"] == "correct_rate_difference")
            md += "| " + r["edge"].get<std::string>() + " | " + r["domain"].get<std::string>() + " | " +
                  std::to_string(r["pairs"].get<int64_t>()) + " | " + std::to_string(r["both_correct"].get<int64_t>()) +
                  " / " + std::to_string(r["condition_only"].get<int64_t>()) + " / " +
                  std::to_string(r["reference_only"].get<int64_t>()) + " / " + std::to_string(r["neither"].get<int64_t>()) +
                  " | " + with_ci(r, 4) + " |\n";
      }
    }
    md += "\n### Ledgers (kept apart)\n\n| domain | condition | outputs | distinct | EOS / cap / ? | evaluable / not / ? | "
          "correct / incorrect / ? | mean length |\n|---|---|---|---|---|---|---|---|\n";
    const ojson& u = a["outputs"]["uniqueness"];
    const ojson& lg = a["outputs"]["ledgers"];
    for (size_t i = 0; i < lg.size(); ++i) {
      const ojson& l = lg[i];
      auto trio = [](const ojson& o, const char* x, const char* y, const char* z) {
        return std::to_string(o[x].get<int64_t>()) + " / " + std::to_string(o[y].get<int64_t>()) + " / " +
               std::to_string(o[z].get<int64_t>());
      };
      md += "| " + l["domain"].get<std::string>() + " | " + l["condition"].get<std::string>() + " | " +
            std::to_string(l["outputs"].get<int64_t>()) + " | " + std::to_string(u[i]["distinct"].get<int64_t>()) + " | " +
            trio(l["stopping"], "eos", "length", "unknown") + " | " +
            trio(l["evaluability"], "evaluable", "not_evaluable", "unknown") + " | " +
            trio(l["correctness"], "correct", "incorrect", "unknown") + " | " + num(l["mean_generated_length"], 3) + " |\n";
    }
    md += "\n";
  }

  if (a.contains("tasks")) {
    const ojson& tb = a["settings"]["task_bootstrap"];
    md += "## Source-blocked contrasts\n\nWithin-source differences (condition - reference, mean over paired repeats); "
          "the domain value is the mean over sources with a " +
          std::to_string(tb["replicates"].get<int64_t>()) + "-replicate task bootstrap interval. No p-values.\n\n"
          "| edge | variable | domain | mean [interval] | up / down / zero |\n|---|---|---|---|---|\n";
    const ojson& st = a["tasks"]["stats"];
    for (const auto& b : a["tasks"]["source_blocked"]) {
      std::string v = "n/a";
      for (const auto& r : st)
        if (match(r, {{"edge", b["edge"].get<std::string>()}, {"domain", b["domain"].get<std::string>()},
                      {"metric", "source_blocked_" + b["variable"].get<std::string>()}}))
          v = with_ci(r, 3);
      md += "| " + b["edge"].get<std::string>() + " | " + b["variable"].get<std::string>() + " | " +
            b["domain"].get<std::string>() + " | " + v + " | " + std::to_string(b["up"].get<int64_t>()) + " / " +
            std::to_string(b["down"].get<int64_t>()) + " / " + std::to_string(b["zero"].get<int64_t>()) + " |\n";
    }
    md += "\n";
  }
  md += "Not claimed: bootstrap bands cover the selected sources under this run, not a population; "
        "cosine near 1 does not mean \"nearly identical\"; source-blocked directions carry no p-values.\n";
  return md;
}

}  // namespace atlas::stats
