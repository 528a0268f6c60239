// atlas audit: see audit.h and docs/audit.md ("atlas audit DIR").
#include "audit/audit.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <functional>
#include <map>
#include <set>
#include <sstream>

#include "audit/hash_chain.h"
#include "core/error.h"
#include "core/file.h"
#include "core/provenance.h"
#include "core/sha256.h"
#include "io/safetensors.h"
#include "model/digest.h"
#include "probe/freeze.h"
#include "probe/run.h"

namespace atlas::audit {
namespace fs = std::filesystem;

int64_t AuditReport::count(CheckStatus s) const {
  return std::count_if(checks.begin(), checks.end(), [&](const AuditCheck& c) { return c.status == s; });
}

namespace {

// One artifact file as read: its bytes' hash and, when it parses, its JSON (ordered, so that
// content hashes are recomputed over the keys in written order).
struct Doc {
  std::string role, path, how;
  bool exists = false, parsed = false;
  std::string error;  // why it is unusable ("" when usable)
  std::string sha256;
  int64_t bytes = -1;
  ojson j;
  bool usable() const { return parsed && error.empty(); }
};

Doc read_doc(const std::string& role, const std::string& path, const std::string& how) {
  Doc d;
  d.role = role, d.path = path, d.how = how;
  std::error_code ec;
  if (path.empty() || !fs::is_regular_file(path, ec)) {
    d.error = path.empty() ? "not found" : "missing (" + path + ")";
    return d;
  }
  d.exists = true;
  const std::string text = read_file(path);
  d.sha256 = sha256_hex(text);
  d.bytes = int64_t(text.size());
  try {
    d.j = ojson::parse(text);
    d.parsed = true;
  } catch (const std::exception& e) {
    d.error = std::string("not valid JSON (truncated or damaged): ") + e.what();
    return d;
  }
  if (!d.j.is_object()) d.error = "not a JSON object";
  return d;
}

std::string short_hash(const std::string& h) { return h.size() > 12 ? h.substr(0, 12) + "…" : h; }

bool same_file(const std::string& a, const std::string& b) {
  std::error_code ec;
  return !a.empty() && !b.empty() && fs::exists(a, ec) && fs::exists(b, ec) && fs::equivalent(a, b, ec);
}

std::string dir_of(const std::string& path) {
  const std::string p = fs::path(path).parent_path().string();
  return p.empty() ? "." : p;
}

std::string num(int64_t v) { return std::to_string(v); }

// Collects checks; a check body that throws (a field missing, a wrong type) is a FAIL naming
// the check, never an abort of the whole audit.
class Checks {
 public:
  explicit Checks(AuditReport& r) : r_(r) {}
  void pass(const std::string& name, const std::string& detail, ojson numbers = ojson::object()) {
    r_.checks.push_back({.name = name, .status = CheckStatus::Pass, .detail = detail, .numbers = std::move(numbers)});
  }
  void fail(const std::string& name, const std::string& detail, ojson numbers = ojson::object()) {
    r_.checks.push_back({.name = name, .status = CheckStatus::Fail, .detail = detail, .numbers = std::move(numbers)});
  }
  void skip(const std::string& name, const std::string& detail) {
    r_.checks.push_back({.name = name, .status = CheckStatus::Skip, .detail = detail, .numbers = ojson::object()});
  }
  void verdict(const std::string& name, bool ok, const std::string& detail, ojson numbers = ojson::object()) {
    ok ? pass(name, detail, std::move(numbers)) : fail(name, detail, std::move(numbers));
  }
  void guarded(const std::string& name, const std::string& file, const std::function<void()>& body) {
    try {
      body();
    } catch (const std::exception& e) {
      fail(name, file + ": malformed: " + e.what());
    }
  }

 private:
  AuditReport& r_;
};

// ---- the artifacts' own hashes ----------------------------------------------------------------

void check_artifact(Checks& ck, Doc& d, const std::string& kind) {
  const std::string name = "artifact " + d.role;
  if (!d.exists) {
    ck.fail(name, d.role + " " + d.error);
    return;
  }
  if (!d.usable()) {
    ck.fail(name, d.path + ": " + d.error);
    return;
  }
  std::string got = d.j.contains("kind") && d.j["kind"].is_string() ? d.j["kind"].get<std::string>() : "";
  if (got.empty() && kind == "atlas.analysis" && d.j.value("format", "") == "atlas-analysis-v1") got = kind;
  if (got != kind) {
    d.error = "kind \"" + got + "\", expected \"" + kind + "\"";
    ck.fail(name, d.path + ": kind: " + (got.empty() ? "missing" : "\"" + got + "\"") + ", expected \"" + kind + "\"");
    return;
  }
  const std::string field = kind == "atlas.probe.manifest" ? "manifest_sha256" : "content_sha256";
  // From here on the artifact stays usable: the invariant checks below say where it changed.
  if (!d.j.contains(field) || !d.j[field].is_string()) {
    ck.fail(name, d.path + ": " + field + ": missing");
    return;
  }
  const std::string recorded = d.j[field].get<std::string>();
  const std::string actual = kind == "atlas.probe.manifest" ? probe::manifest_hash(d.j) : artifact_content_sha256(d.j);
  ojson n = {{"sha256", d.sha256}, {"bytes", d.bytes}, {field, recorded}};
  if (recorded != actual) {
    ck.fail(name, d.path + ": " + field + " " + short_hash(recorded) + " recorded, the content hashes to " + short_hash(actual) +
                      " (changed after it was written)", n);
    return;
  }
  ck.pass(name, d.path + ": " + kind + ", sha256 " + short_hash(d.sha256) + ", " + num(d.bytes) + " bytes, " + field +
                    " matches the content", n);
}

// ---- chain links ------------------------------------------------------------------------------

// FROM's input record for TO: the record with that role, or one that resolves to TO's file.
void check_link(Checks& ck, const Doc& from, const Doc& to, const std::string& role) {
  const std::string name = "chain " + from.role + " -> " + to.role;
  if (!from.usable() || !to.exists) {
    ck.skip(name, !from.usable() ? from.role + " unusable" : to.role + " missing");
    return;
  }
  if (!from.j.contains("inputs") || !from.j["inputs"].is_array()) {
    ck.fail(name, from.path + ": inputs: missing (the " + from.role + " names no input files by SHA-256)");
    return;
  }
  const json arr = json::parse(from.j["inputs"].dump());
  std::vector<InputRecord> recs;
  try {
    recs = parse_input_records(arr, from.path, "inputs");
  } catch (const std::exception& e) {
    ck.fail(name, e.what());
    return;
  }
  const std::string base = dir_of(from.path);
  std::optional<size_t> by_role, by_file;
  for (size_t i = 0; i < recs.size(); ++i) {
    if (!by_role && arr[i].value("role", "") == role) by_role = i;
    if (!by_file && same_file(path_from(base, recs[i].path), to.path)) by_file = i;
  }
  const std::optional<size_t> i = by_file ? by_file : by_role;
  if (!i) {
    ck.fail(name, from.path + ": inputs: no record of the " + to.role + " (" + to.path + ")");
    return;
  }
  const InputRecord& r = recs[*i];
  const std::string field = "inputs[" + num(int64_t(*i)) + "]";
  ojson n = {{"recorded_sha256", r.sha256}, {"actual_sha256", to.sha256}, {"recorded_path", r.path}};
  if (!by_file) {
    ck.fail(name, from.path + ": " + field + " names " + path_from(base, r.path) + ", not the audited " + to.role + " " + to.path, n);
    return;
  }
  if (r.sha256 != to.sha256) {
    std::string hint;
    // A rewrite with the same content (a --resume of a complete run rewrites runtime) differs
    // from a changed result: say which.
    if (to.usable() && from.role == "evaluation" && to.role == "run" && from.j.contains("run") &&
        from.j["run"].value("content_sha256", "") == to.j.value("content_sha256", ""))
      hint = "; its content_sha256 is still the one the evaluation read (the file was rewritten, e.g. its runtime)";
    ck.fail(name, from.path + ": " + field + ".sha256 " + short_hash(r.sha256) + " but " + to.path + " has " +
                      short_hash(to.sha256) + " (changed after the " + from.role + " was made" + hint + ")", n);
    return;
  }
  if (r.bytes && *r.bytes != to.bytes) {
    ck.fail(name, from.path + ": " + field + ".bytes " + num(*r.bytes) + " but the file has " + num(to.bytes), n);
    return;
  }
  ck.pass(name, from.path + " " + field + " names " + to.path + " by sha256 " + short_hash(r.sha256) + " (matches)", n);
}

// Every other input record of an artifact (HumanEval corpora, extra runs): present and unchanged.
void check_other_inputs(Checks& ck, const Doc& d, const std::vector<const Doc*>& known) {
  if (!d.usable() || !d.j.contains("inputs") || !d.j["inputs"].is_array()) return;
  std::vector<InputRecord> recs;
  try {
    recs = parse_input_records(json::parse(d.j["inputs"].dump()), d.path, "inputs");
  } catch (const std::exception&) {
    return;  // reported by check_link
  }
  std::vector<InputRecord> others;
  for (const auto& r : recs) {
    const std::string p = path_from(dir_of(d.path), r.path);
    if (std::none_of(known.begin(), known.end(), [&](const Doc* k) { return k && same_file(p, k->path); })) others.push_back(r);
  }
  if (others.empty()) return;
  const auto checks = verify_inputs(others, dir_of(d.path));
  std::string bad;
  for (const auto& c : checks)
    if (c.status != LinkStatus::Ok && bad.empty()) bad = describe(c);
  ck.verdict("chain " + d.role + " -> other inputs", bad.empty(),
             bad.empty() ? num(int64_t(checks.size())) + " more input files present and unchanged" : d.path + ": " + bad,
             {{"records", int64_t(checks.size())}});
}

// The hash an artifact records for another one's identity (manifest_sha256, content_sha256).
void check_named_hash(Checks& ck, const std::string& name, const Doc& from, const std::string& field, const std::string& recorded,
                      const std::string& actual, const std::string& what) {
  ck.verdict(name, recorded == actual,
             recorded == actual ? from.path + ": " + field + " " + short_hash(recorded) + " = the " + what
                                : from.path + ": " + field + " " + short_hash(recorded) + ", but the " + what + " is " +
                                      short_hash(actual));
}

// ---- invariants -------------------------------------------------------------------------------

const char* const kHeaderFields[] = {"index", "cell_id", "source_key", "source_id", "domain", "rank", "content_tokens",
                                     "condition", "layout", "system", "history", "group", "seed", "batch", "n_tokens",
                                     "input_ids", "prompt_sha256", "target_span", "interior_token_range",
                                     "boundary_crossing", "target_ids_sha256", "edits"};

// cells = sources x content lengths x seeds x conditions, in the manifest's cell order.
void check_cell_grid(Checks& ck, const Doc& man) {
  const std::string name = "cells = sources x conditions";
  ck.guarded(name, man.path, [&] {
    const ojson& p = man.j.at("protocol");
    const ojson& conds = p.at("conditions");
    const auto lengths = p.at("selection").at("content_tokens").get<std::vector<int64_t>>();
    const ojson& ex = p.at("execution");
    std::vector<std::pair<int64_t, int64_t>> seeds;  // value, sources_per_domain
    const bool has_seeds = ex.contains("seeds") && !ex["seeds"].empty();
    if (has_seeds)
      for (const auto& s : ex["seeds"]) seeds.push_back({s.at("value").get<int64_t>(), s.at("sources_per_domain").get<int64_t>()});
    else
      seeds.push_back({0, 0});
    std::vector<std::string> want;
    for (const auto& s : man.j.at("sources")) {
      const std::string key = s.at("key").get<std::string>();
      const int64_t rank = s.at("rank").get<int64_t>();
      for (int64_t n : lengths)
        for (const auto& [v, spd] : seeds) {
          if (spd > 0 && rank >= spd) continue;
          for (const auto& c : conds)
            want.push_back(key + ":" + (lengths.size() > 1 ? std::string("n") + num(n) + ":" : "") +
                           (has_seeds ? std::string("seed") + num(v) + ":" : "") + c.at("name").get<std::string>());
        }
    }
    const ojson& cells = man.j.at("cells");
    const int64_t S = int64_t(man.j["sources"].size()), C = int64_t(conds.size()), N = int64_t(lengths.size()),
                  K = int64_t(seeds.size()), M = int64_t(cells.size());
    ojson nums = {{"sources", S}, {"conditions", C}, {"content_lengths", N}, {"seeds", K},
                  {"expected_cells", int64_t(want.size())}, {"manifest_cells", M}};
    std::string formula = num(S) + " sources x " + num(C) + " conditions";
    if (N > 1) formula += " x " + num(N) + " content lengths";
    if (has_seeds) formula += " x seeds (" + num(K) + " declared, some for the first k sources only)";
    for (size_t i = 0; i < std::max(want.size(), cells.size()); ++i) {
      const std::string got = i < cells.size() ? cells[i].at("cell_id").get<std::string>() : "(none)";
      const std::string exp = i < want.size() ? want[i] : "(none)";
      if (got != exp || (i < cells.size() && cells[i].at("index").get<int64_t>() != int64_t(i))) {
        ck.fail(name, man.path + ": cells[" + num(int64_t(i)) + "] is " + got + ", the grid " + formula + " has " + exp +
                          " there (" + num(M) + " cells, grid " + num(int64_t(want.size())) + ")", nums);
        return;
      }
    }
    const ojson& ct = man.j.at("contracts");
    if (ct.at("cells").get<int64_t>() != M || ct.at("sources").get<int64_t>() != S || ct.at("conditions").get<int64_t>() != C) {
      ck.fail(name, man.path + ": contracts says " + ct["cells"].dump() + " cells, " + ct["sources"].dump() + " sources, " +
                        ct["conditions"].dump() + " conditions; the manifest holds " + num(M) + ", " + num(S) + ", " + num(C), nums);
      return;
    }
    ck.pass(name, formula + " = " + num(int64_t(want.size())) + " = manifest cells " + num(M) + " = contracts.cells", nums);
  });
}

// Edits per cell as the condition declares: exactly k positions differ from the official
// rendering (its hash is recorded), none inside the target, and group contracts hold.
void check_edits(Checks& ck, const Doc& man) {
  const std::string name = "edits as declared";
  ck.guarded(name, man.path, [&] {
    std::map<std::string, int64_t> declared;
    for (const auto& c : man.j.at("protocol").at("conditions")) declared[c.at("name").get<std::string>()] = int64_t(c.at("edits").size());
    std::map<std::string, int64_t> by_count;
    int64_t edits = 0;
    // (source, content length, seed, group) -> (length, target start) of the first cell.
    std::map<std::string, std::pair<std::pair<int64_t, int64_t>, std::string>> groups;
    for (const auto& c : man.j.at("cells")) {
      const std::string id = c.at("cell_id").get<std::string>();
      const std::string where = man.path + ": cell " + id;
      auto ids = c.at("input_ids").get<std::vector<int32_t>>();
      const auto range = c.at("interior_token_range").get<std::vector<int64_t>>();
      const ojson& ed = c.at("edits");
      const int64_t k = declared.at(c.at("condition").get<std::string>());
      if (int64_t(ed.size()) != k) {
        ck.fail(name, where + ": " + num(int64_t(ed.size())) + " edits, its condition declares " + num(k));
        return;
      }
      if (int64_t(ids.size()) != c.at("n_tokens").get<int64_t>() || ids_sha256(ids) != c.at("prompt_sha256").get<std::string>()) {
        ck.fail(name, where + ": input_ids do not match n_tokens / prompt_sha256");
        return;
      }
      std::set<int64_t> pos;
      std::vector<int32_t> official = ids;
      for (const auto& e : ed) {
        const int64_t p = e.at("position").get<int64_t>();
        const int32_t o = e.at("official_id").get<int32_t>(), nw = e.at("new_id").get<int32_t>();
        if (p < 0 || p >= int64_t(ids.size()) || !pos.insert(p).second || (p >= range[0] && p < range[1]) || ids[size_t(p)] != nw ||
            o == nw) {
          ck.fail(name, where + ": edit at position " + num(p) + " is out of range, repeated, inside the target, not applied, or a no-op");
          return;
        }
        official[size_t(p)] = o;
      }
      // Restoring the k edited ids must give the official rendering exactly: no other id differs.
      if (ids_sha256(official) != c.at("official_prompt_sha256").get<std::string>()) {
        ck.fail(name, where + ": restoring its " + num(k) + " edits does not give official_prompt_sha256 (other ids differ)");
        return;
      }
      const std::string grp = c.at("group").get<std::string>();
      if (!grp.empty()) {
        const std::string gk = c.at("source_key").get<std::string>() + "|" + c.at("content_tokens").dump() + "|" + c.at("seed").dump() + "|" + grp;
        const std::pair<int64_t, int64_t> shape{int64_t(ids.size()), range[0]};
        auto [it, fresh] = groups.try_emplace(gk, shape, id);
        if (!fresh && it->second.first != shape) {
          ck.fail(name, where + ": group " + grp + " needs the length and target position of " + it->second.second + " (" +
                            num(shape.first) + "/" + num(shape.second) + " vs " + num(it->second.first.first) + "/" +
                            num(it->second.first.second) + ")");
          return;
        }
      }
      by_count[num(k)]++;
      edits += k;
    }
    ojson hist = ojson::object();
    for (const auto& [k, v] : by_count) hist[k] = v;
    const ojson& want = man.j.at("contracts").at("cells_by_edit_count");
    if (json::parse(hist.dump()) != json::parse(want.dump())) {
      ck.fail(name, man.path + ": cells by edit count " + hist.dump() + ", contracts.cells_by_edit_count says " + want.dump());
      return;
    }
    ck.pass(name, num(int64_t(man.j["cells"].size())) + " cells, " + num(edits) + " edited ids, cells by edit count " + hist.dump() +
                      " = contracts; each cell differs from its official rendering in exactly its k edits; " +
                      num(int64_t(groups.size())) + " group(s) of equal length and target position",
            {{"edits", edits}, {"cells_by_edit_count", hist}});
  });
}

// The run's cells are the manifest's (all of them, or the shard's), in order, headers equal.
// The files hook edits read (add:FILE), where the manifest pins any: each as frozen, byte for
// byte, found relative to the manifest's directory as run finds it. A file not found there cannot
// be checked (a manifest copied without its files): said, not failed.
void check_intervention_files(Checks& ck, const Doc& man) {
  const std::string name = "hook-edit files = manifest's pins";
  ck.guarded(name, man.path, [&] {
    int64_t same = 0;
    std::vector<std::string> absent;
    const std::string base = probe::manifest_files_base(man.path);
    for (const auto& [recorded, sha] : man.j.at("intervention_files").items()) {
      const std::string path = probe::manifest_file_path(base, recorded);
      if (!file_exists(path)) {
        absent.push_back(path);
        continue;
      }
      if (const std::string now = sha256_file(path); now != sha.get<std::string>()) {
        ck.fail(name, path + ": sha256 " + now + ", the manifest pinned " + sha.get<std::string>());
        return;
      }
      ++same;
    }
    if (!absent.empty()) {
      ck.skip(name, num(same) + " files as pinned; not found here: " + absent.front() +
                        (absent.size() > 1 ? " and " + num(int64_t(absent.size()) - 1) + " more" : ""));
      return;
    }
    ck.pass(name, num(same) + " files as the manifest pinned them", {{"files", same}});
  });
}

void check_run_cells(Checks& ck, const Doc& man, const Doc& run) {
  const std::string name = "run cells = manifest cells";
  ck.guarded(name, run.path, [&] {
    const ojson& mc = man.j.at("cells");
    std::vector<int64_t> want;
    const ojson& shard = run.j.at("shard");
    if (shard.is_null()) {
      for (size_t i = 0; i < mc.size(); ++i) want.push_back(int64_t(i));
    } else {
      const int64_t si = shard.at("index").get<int64_t>(), sc = shard.at("count").get<int64_t>();
      for (const auto& b : man.j.at("batches"))
        if (b.at("unit").get<int64_t>() % sc == si)
          for (const auto& ci : b.at("cells")) want.push_back(ci.get<int64_t>());
      std::sort(want.begin(), want.end());
    }
    const ojson& rc = run.j.at("cells");
    ojson nums = {{"manifest_cells", int64_t(mc.size())}, {"expected", int64_t(want.size())}, {"run_cells", int64_t(rc.size())}};
    for (size_t i = 0; i < std::max(want.size(), rc.size()); ++i) {
      if (i >= rc.size()) {
        ck.fail(name, run.path + ": " + num(int64_t(rc.size())) + " cells, expected " + num(int64_t(want.size())) + "; first missing " +
                          mc[size_t(want[i])].at("cell_id").get<std::string>(), nums);
        return;
      }
      const std::string got = rc[i].at("cell_id").get<std::string>();
      if (i >= want.size() || mc[size_t(want[i])].at("cell_id") != rc[i].at("cell_id")) {
        ck.fail(name, run.path + ": cells[" + num(int64_t(i)) + "] is " + got + ", expected " +
                          (i < want.size() ? mc[size_t(want[i])]["cell_id"].get<std::string>() : std::string("no more cells")) +
                          " (" + num(int64_t(rc.size())) + " cells, expected " + num(int64_t(want.size())) + ")", nums);
        return;
      }
      for (const char* f : kHeaderFields)
        if (rc[i].at(f) != mc[size_t(want[i])].at(f)) {
          ck.fail(name, run.path + ": cell " + got + ": " + f + " differs from the manifest's", nums);
          return;
        }
      // Hook edits, where the cell's condition declares some: present in both or neither, equal.
      const ojson none;
      const ojson& ri = rc[i].contains("interventions") ? rc[i].at("interventions") : none;
      const ojson& mi = mc[size_t(want[i])].contains("interventions") ? mc[size_t(want[i])].at("interventions") : none;
      if (ri != mi) {
        ck.fail(name, run.path + ": cell " + got + ": interventions differ from the manifest's", nums);
        return;
      }
    }
    ck.pass(name, num(int64_t(rc.size())) + " cells" + (shard.is_null() ? " (every manifest cell once, in order)" : " (shard " + shard.dump() + ")") +
                      ", headers equal to the manifest's", nums);
  });
}

std::string float_bytes_sha(const std::vector<float>& v) { return sha256_hex(v.data(), v.size() * sizeof(float)); }

// Route decisions = sum over cells of tokens x gates x k, every gate hash re-derived from the
// recorded routes.
int64_t check_routes(Checks& ck, const Doc& run) {
  const std::string name = "route decisions = tokens x gates x k";
  int64_t decisions = -1;
  ck.guarded(name, run.path, [&] {
    const ojson& ex = run.j.at("execution");
    if (ex.at("mode") != "trace") {
      ck.skip(name, "a generate-mode run records no routes");
      return;
    }
    if (!ex.value("record_routes", false)) {
      ck.skip(name, "record_routes = false: the run holds gate hashes only");
      return;
    }
    int64_t tokens = 0, recorded = 0, hashes = 0, G = -1, k = -1;
    std::set<std::string> conditions;
    std::vector<int64_t> layers0;
    for (const auto& c : run.j.at("cells")) {
      const std::string where = run.path + ": cell " + c.at("cell_id").get<std::string>();
      const int64_t T = c.at("n_tokens").get<int64_t>();
      const auto range = c.at("interior_token_range").get<std::vector<int64_t>>();
      const ojson& gates = c.at("result").at("gates");
      const ojson& routes = c.at("result").at("routes");
      std::vector<int64_t> layers;
      for (const auto& g : gates) layers.push_back(g.at("layer").get<int64_t>());
      if (layers0.empty()) layers0 = layers;
      if (layers != layers0 || routes.size() != gates.size()) {
        ck.fail(name, where + ": its gates/routes cover other MoE layers than the first cell's");
        return;
      }
      conditions.insert(c.at("condition").get<std::string>());
      tokens += T;
      for (size_t l = 0; l < gates.size(); ++l) {
        const ojson& g = gates[l];
        const ojson& r = routes[l];
        const int64_t gk = g.at("k").get<int64_t>();
        if (k < 0) k = gk;
        if (gk != k || r.at("layer") != g.at("layer")) {
          ck.fail(name, where + ": gate " + g["layer"].dump() + ": k or layer differs");
          return;
        }
        const ojson& ti = r.at("topk_ids");
        const ojson& tw = r.at("topk_weights");
        if (int64_t(ti.size()) != T || int64_t(tw.size()) != T) {
          ck.fail(name, where + ": layer " + g["layer"].dump() + ": " + num(int64_t(ti.size())) + " route rows for " + num(T) + " tokens");
          return;
        }
        std::vector<int32_t> ids;
        std::vector<float> w;
        for (int64_t t = 0; t < T; ++t) {
          if (int64_t(ti[size_t(t)].size()) != k || int64_t(tw[size_t(t)].size()) != k) {
            ck.fail(name, where + ": layer " + g["layer"].dump() + " token " + num(t) + ": not " + num(k) + " experts");
            return;
          }
          for (const auto& x : ti[size_t(t)]) ids.push_back(x.get<int32_t>());
          for (const auto& x : tw[size_t(t)]) w.push_back(float(x.get<double>()));
        }
        recorded += int64_t(ids.size());
        const std::vector<int32_t> tids(ids.begin() + range[0] * k, ids.begin() + range[1] * k);
        const std::vector<float> tws(w.begin() + range[0] * k, w.begin() + range[1] * k);
        const std::pair<const char*, std::string> derived[] = {{"full_ids_sha256", ids_sha256(ids)},
                                                               {"full_weights_sha256", float_bytes_sha(w)},
                                                               {"target_ids_sha256", ids_sha256(tids)},
                                                               {"target_weights_sha256", float_bytes_sha(tws)}};
        for (const auto& [f, h] : derived) {
          if (g.at(f).get<std::string>() != h) {
            ck.fail(name, where + ": layer " + g["layer"].dump() + ": " + f + " does not match the recorded routes");
            return;
          }
          ++hashes;
        }
      }
      if (G < 0) G = int64_t(gates.size());
    }
    G = std::max<int64_t>(G, 0);
    const int64_t want = tokens * G * std::max<int64_t>(k, 0);
    ojson nums = {{"tokens", tokens}, {"cells", int64_t(run.j["cells"].size())}, {"conditions", int64_t(conditions.size())},
                  {"gates", G}, {"k", k}, {"expected", want}, {"recorded", recorded}, {"gate_hashes_rederived", hashes}};
    const std::string formula = num(tokens) + " tokens (" + num(int64_t(run.j["cells"].size())) + " cells over " +
                                num(int64_t(conditions.size())) + " conditions) x " + num(G) + " gates x k=" + num(k) + " = " + num(want);
    if (want != recorded) {
      ck.fail(name, formula + ", but " + num(recorded) + " decisions are recorded", nums);
      return;
    }
    decisions = recorded;
    ck.pass(name, formula + " = recorded " + num(recorded) + "; " + num(hashes) + " gate hashes re-derived from the routes", nums);
  });
  return decisions;
}

// Generate mode: ids hash, n_new, and the stop state agree with the ids.
std::map<std::string, int64_t> check_generations(Checks& ck, const Doc& run, const Doc& man) {
  const std::string name = "stop states re-derived";
  std::map<std::string, int64_t> stops;
  ck.guarded(name, run.path, [&] {
    const ojson& ex = run.j.at("execution");
    if (ex.at("mode") != "generate") {
      ck.skip(name, "a trace-mode run generates nothing");
      return;
    }
    const int32_t eos = man.usable() ? man.j.at("tokenizer").at("eos_id").get<int32_t>() : run.j.at("tokenizer").at("eos_id").get<int32_t>();
    const int64_t max_new = ex.at("max_new_tokens").get<int64_t>();
    for (const auto& c : run.j.at("cells")) {
      const std::string where = run.path + ": cell " + c.at("cell_id").get<std::string>();
      const ojson& r = c.at("result");
      const auto ids = r.at("generated_ids").get<std::vector<int32_t>>();
      const std::string stop = r.at("stop").get<std::string>();
      const bool ok = ids_sha256(ids) == r.at("generated_ids_sha256").get<std::string>() &&
                      r.at("n_new").get<int64_t>() == int64_t(ids.size()) &&
                      ((stop == "eos" && !ids.empty() && ids.back() == eos) ||
                       (stop == "length" && int64_t(ids.size()) == max_new && (ids.empty() || ids.back() != eos)));
      if (!ok) {
        ck.fail(name, where + ": stop \"" + stop + "\", n_new " + r["n_new"].dump() + ", " + num(int64_t(ids.size())) +
                          " ids: hash, count or stop state does not follow from the ids (eos " + num(eos) + ", max_new_tokens " + num(max_new) + ")");
        stops.clear();
        return;
      }
      stops[stop]++;
    }
    ck.pass(name, num(int64_t(run.j["cells"].size())) + " cells: eos " + num(stops["eos"]) + ", length " + num(stops["length"]) +
                      "; ids hashes, n_new and stop states follow from the generated ids",
            {{"eos", stops["eos"]}, {"length", stops["length"]}});
  });
  return stops;
}

// Journals: every run cell's line present exactly once with the run's result; every line's hash.
void check_journals(Checks& ck, const Doc& run, const std::string& dir) {
  const std::string name = "journal lines accounted for";
  const fs::path jdir = fs::path(dir) / "journal";
  if (!fs::is_directory(jdir)) {
    ck.skip(name, dir + " has no journal/ (a merged run: the journals stay in the shard directories)");
    return;
  }
  ck.guarded(name, run.path, [&] {
    std::vector<std::string> files;
    for (const auto& e : fs::directory_iterator(jdir))
      if (e.path().extension() == ".jsonl") files.push_back(e.path().string());
    std::sort(files.begin(), files.end());
    const std::string msha = run.j.at("manifest_sha256").get<std::string>();
    std::map<std::string, const ojson*> results;  // cell_id -> run result
    std::map<std::string, std::string> source_of;
    std::set<std::string> sources;
    for (const auto& c : run.j.at("cells")) {
      results[c.at("cell_id").get<std::string>()] = &c.at("result");
      source_of[c["cell_id"].get<std::string>()] = c.at("source_key").get<std::string>();
      sources.insert(c["source_key"].get<std::string>());
    }
    std::map<std::string, std::string> seen;  // cell_id -> where
    int64_t lines = 0;
    std::set<std::string> journaled_sources;
    for (const auto& f : files) {
      const std::string text = read_file(f);
      std::istringstream in(text);
      std::string line;
      int64_t lineno = 0, declared = -1;
      std::string source;
      if (!text.empty() && text.back() != '\n') {
        ck.fail(name, f + ": truncated (no final newline)");
        return;
      }
      while (std::getline(in, line)) {
        ++lineno;
        ++lines;
        const std::string where = f + ":" + num(lineno);
        ojson o;
        try {
          o = ojson::parse(line);
        } catch (const std::exception&) {
          ck.fail(name, where + ": not a JSON line");
          return;
        }
        ojson body = o;
        body.erase("line_sha256");
        if (!o.is_object() || !o.contains("line_sha256") || o["line_sha256"] != sha256_hex(body.dump())) {
          ck.fail(name, where + ": line_sha256 does not match the line");
          return;
        }
        if (lineno == 1) {
          if (string_or_empty(o, "kind") != "atlas.probe.journal" || string_or_empty(o, "manifest_sha256") != msha) {
            ck.fail(name, where + ": not a journal of this run's manifest");
            return;
          }
          source = o.at("source_key").get<std::string>();
          declared = o.at("cells").get<int64_t>();
          journaled_sources.insert(source);
          continue;
        }
        const std::string id = o.at("cell_id").get<std::string>();
        auto r = results.find(id);
        if (r == results.end() || source_of[id] != source) {
          ck.fail(name, where + ": cell " + id + " is not a cell of this run's source " + source);
          return;
        }
        if (auto [it, fresh] = seen.emplace(id, where); !fresh) {
          ck.fail(name, where + ": cell " + id + " journaled twice (first at " + it->second + ")");
          return;
        }
        if (o.at("result") != *r->second) {
          ck.fail(name, where + ": cell " + id + ": the journaled result differs from run.json's");
          return;
        }
      }
      if (declared != lineno - 1) {
        ck.fail(name, f + ": header declares " + num(declared) + " cells, the journal holds " + num(lineno - 1));
        return;
      }
    }
    ojson nums = {{"journals", int64_t(files.size())}, {"lines", lines}, {"run_cells", int64_t(results.size())},
                  {"journaled_cells", int64_t(seen.size())}, {"sources", int64_t(sources.size())}};
    if (seen.size() != results.size()) {
      std::string first;
      for (const auto& [id, r] : results)
        if (!seen.count(id)) {
          first = id;
          break;
        }
      ck.fail(name, num(int64_t(seen.size())) + " of " + num(int64_t(results.size())) + " run cells have a journal line; first missing " +
                        first + " (" + num(int64_t(files.size())) + " journals for " + num(int64_t(sources.size())) + " sources)", nums);
      return;
    }
    ck.pass(name, num(int64_t(files.size())) + " journals (one per source, " + num(int64_t(sources.size())) + " sources), " + num(lines) +
                      " lines = " + num(int64_t(files.size())) + " headers + " + num(int64_t(seen.size())) +
                      " cell lines: every run cell once, results equal to run.json, every line_sha256 matches", nums);
  });
}

// Hidden-vector side files: each stage's tensor has the stage's target_sha256 as its stage hash.
void check_hidden_vectors(Checks& ck, const Doc& run, const std::string& dir) {
  const std::string name = "hidden vectors = stage hashes";
  ck.guarded(name, run.path, [&] {
    const ojson& ex = run.j.at("execution");
    if (ex.at("mode") != "trace" || !ex.value("record_hidden_vectors", false)) {
      ck.skip(name, "record_hidden_vectors is off");
      return;
    }
    const fs::path hdir = fs::path(dir) / "hidden";
    std::map<std::string, const TensorView*> tensors;
    std::vector<std::shared_ptr<SafetensorsFile>> files;
    if (fs::is_directory(hdir))
      for (const auto& e : fs::directory_iterator(hdir))
        if (e.path().extension() == ".safetensors") {
          files.push_back(SafetensorsFile::open(e.path().string()));
          for (const auto& t : files.back()->tensors()) tensors[t.name] = &t;
        }
    int64_t n = 0;
    const auto find = [&](const std::string& tn) -> const TensorView* {
      auto it = tensors.find(tn);
      return it == tensors.end() ? nullptr : it->second;
    };
    for (const auto& c : run.j.at("cells")) {
      const std::string bad = probe::check_cell_vectors(c.at("result"), find, n);
      if (!bad.empty()) {
        ck.fail(name, hdir.string() + ": cell " + c["cell_id"].get<std::string>() + ": " + bad);
        return;
      }
    }
    ck.pass(name, num(n) + " tensors in " + num(int64_t(files.size())) + " files hash to their stages' target_sha256",
            {{"tensors", n}, {"files", int64_t(files.size())}});
  });
}

// EVAL.json: the cells are the run's, and every ledger is the count of its cells.
void check_ledgers(Checks& ck, const Doc& ev, const Doc& run, const std::map<std::string, int64_t>& run_stops) {
  const std::string name = "stop counts = ledger totals";
  ck.guarded(name, ev.path, [&] {
    const ojson& cells = ev.j.at("cells");
    const ojson& rc = run.j.at("cells");
    if (cells.size() != rc.size()) {
      ck.fail(name, ev.path + ": " + num(int64_t(cells.size())) + " evaluated cells, the run has " + num(int64_t(rc.size())));
      return;
    }
    // Recount every ledger from the cells, overall and per domain.
    const char* ledgers[] = {"stopping", "terminal", "coverage", "correctness"};
    std::map<std::string, std::map<std::string, std::map<std::string, int64_t>>> count;  // domain -> ledger -> category
    std::map<std::string, int64_t> per_domain;
    for (size_t i = 0; i < cells.size(); ++i) {
      const ojson& e = cells[i];
      const ojson& c = rc[i];
      const std::string id = e.at("cell_id").get<std::string>();
      if (e.at("cell_id") != c.at("cell_id") || e.at("stop") != c.at("result").at("stop")) {
        ck.fail(name, ev.path + ": cells[" + num(int64_t(i)) + "] (" + id + ") does not match the run's cell " +
                          c["cell_id"].get<std::string>() + " (id or stop)");
        return;
      }
      const ojson& text = c["result"].at("text");
      const ojson want = text.is_null() ? ojson(nullptr) : ojson(sha256_hex(text.get<std::string>()));
      if (e.at("text_sha256") != want) {
        ck.fail(name, ev.path + ": cell " + id + ": text_sha256 is not the run's text");
        return;
      }
      const std::string cats[] = {e["stop"].get<std::string>(), e.at("terminal").at("state").get<std::string>(),
                                  e.at("coverage").at("evaluated").get<bool>() ? "evaluated" : "not_evaluated",
                                  e.at("correctness").get<std::string>()};
      for (const std::string& d : {std::string("(all)"), e.at("domain").get<std::string>()}) {
        per_domain[d]++;
        for (int l = 0; l < 4; ++l) count[d][ledgers[l]][cats[l]]++;
      }
    }
    const ojson& L = ev.j.at("ledgers");
    auto compare_ledgers = [&](const ojson& led, const std::string& d, const std::string& field) -> bool {
      if (led.at("cells").get<int64_t>() != per_domain[d]) {
        ck.fail(name, ev.path + ": " + field + "cells is " + led["cells"].dump() + ", " + num(per_domain[d]) + " cells counted");
        return false;
      }
      for (const char* l : ledgers) {
        int64_t sum = 0;
        for (const auto& [cat, v] : led.at(l).items()) {
          sum += v.get<int64_t>();
          if (v.get<int64_t>() != count[d][l][cat]) {
            ck.fail(name, ev.path + ": " + field + l + "." + cat + " is " + v.dump() + ", the cells count " + num(count[d][l][cat]));
            return false;
          }
        }
        int64_t counted = 0;
        for (const auto& [cat, v] : count[d][l]) counted += v;
        if (sum != per_domain[d] || counted != sum) {
          ck.fail(name, ev.path + ": " + field + l + " totals " + num(sum) + " (a category outside the ledger?), " + num(per_domain[d]) + " cells");
          return false;
        }
      }
      return true;
    };
    if (!compare_ledgers(L, "(all)", "ledgers.")) return;
    int64_t domains = 0;
    for (const auto& [d, led] : L.at("by_domain").items()) {
      ++domains;
      if (!compare_ledgers(led, d, "ledgers.by_domain." + d + ".")) return;
    }
    if (domains + 1 != int64_t(per_domain.size())) {
      ck.fail(name, ev.path + ": ledgers.by_domain has " + num(domains) + " domains, the cells " + num(int64_t(per_domain.size()) - 1));
      return;
    }
    const ojson& st = L.at("stopping");
    ojson nums = {{"cells", int64_t(cells.size())}, {"eos", st.at("eos")}, {"length", st.at("length")}};
    auto rs = [&](const char* k) { auto it = run_stops.find(k); return it == run_stops.end() ? int64_t(0) : it->second; };
    if (!run_stops.empty() && (st["eos"].get<int64_t>() != rs("eos") || st["length"].get<int64_t>() != rs("length"))) {
      ck.fail(name, ev.path + ": ledgers.stopping eos " + st["eos"].dump() + " / length " + st["length"].dump() + ", the run's cells stop eos " +
                        num(rs("eos")) + " / length " + num(rs("length")), nums);
      return;
    }
    ck.pass(name, "run stops eos " + num(rs("eos")) + " + length " + num(rs("length")) + " = ledgers.stopping; all four ledgers (overall and " +
                      num(domains) + " domains) recount from the " + num(int64_t(cells.size())) + " evaluated cells, each cell once",
            nums);
  });
}

// analysis.json: its counts are the run's.
void check_analysis_counts(Checks& ck, const Doc& an, const Doc& run, const Doc& man, int64_t decisions,
                           const std::map<std::string, int64_t>& run_stops) {
  const std::string name = "analysis counts = run counts";
  ck.guarded(name, an.path, [&] {
    const ojson& c = an.j.at("counts");
    std::set<std::string> sources, conditions;
    for (const auto& x : run.j.at("cells")) {
      sources.insert(x.at("source_key").get<std::string>());
      conditions.insert(x.at("condition").get<std::string>());
    }
    const int64_t cells = int64_t(run.j["cells"].size());
    std::string diff;
    auto want = [&](const std::string& what, int64_t got, int64_t exp) {
      if (diff.empty() && got != exp) diff = what + " is " + num(got) + ", the run has " + num(exp);
    };
    want("counts.cells", c.at("cells").get<int64_t>(), cells);
    want("counts.sources", c.at("sources").get<int64_t>(), int64_t(sources.size()));
    want("counts.conditions", c.at("conditions").get<int64_t>(), int64_t(conditions.size()));
    if (man.usable() && run.j.at("shard").is_null())
      want("counts.sources (manifest)", c["sources"].get<int64_t>(), int64_t(man.j.at("sources").size()));
    std::string extra;
    if (an.j.contains("routing") && decisions >= 0) {
      want("routing.route_decisions", an.j["routing"].at("route_decisions").get<int64_t>(), decisions);
      extra += ", route decisions " + num(decisions);
    }
    if (an.j.contains("outputs") && !run_stops.empty()) {
      // Ledger rows per domain with condition "all" (the group "all" pools the domains again).
      int64_t eos = 0, length = 0;
      for (const auto& l : an.j["outputs"].at("ledgers"))
        if (l.at("condition") == "all" && l.at("domain") != "all") {
          eos += l.at("stopping").at("eos").get<int64_t>();
          length += l.at("stopping").at("length").get<int64_t>();
        }
      auto rs = [&](const char* k) { auto it = run_stops.find(k); return it == run_stops.end() ? int64_t(0) : it->second; };
      want("outputs.ledgers stopping eos", eos, rs("eos"));
      want("outputs.ledgers stopping length", length, rs("length"));
      extra += ", stops eos " + num(eos) + " / length " + num(length);
    }
    ojson nums = {{"cells", cells}, {"sources", int64_t(sources.size())}, {"conditions", int64_t(conditions.size())}};
    if (!diff.empty()) {
      ck.fail(name, an.path + ": " + diff, nums);
      return;
    }
    ck.pass(name, num(cells) + " cells, " + num(int64_t(sources.size())) + " sources, " + num(int64_t(conditions.size())) + " conditions" + extra +
                      " = the run's", nums);
  });
}

std::string analysis_file(const std::string& p) {
  std::error_code ec;
  return fs::is_directory(p, ec) ? (fs::path(p) / "analysis.json").string() : p;
}

}  // namespace

AuditReport audit_run_dir(const AuditOptions& o) {
  std::error_code ec;
  if (!fs::is_directory(o.dir, ec)) fail(o.dir, {}, "not a directory (atlas audit takes a probe run directory)");
  AuditReport rep;
  rep.dir = o.dir;
  Checks ck(rep);
  const fs::path dir(o.dir);

  // Discovery (docs/audit.md): the run is DIR/run.json; the others are named by flags, else
  // found at fixed places, else (the manifest) through the run's input record.
  Doc run = read_doc("run", (dir / "run.json").string(), "DIR/run.json");
  std::string mpath, mhow;
  if (!o.manifest.empty()) {
    mpath = o.manifest, mhow = "--manifest";
  } else if (file_exists((dir / "manifest.json").string())) {
    mpath = (dir / "manifest.json").string(), mhow = "DIR/manifest.json";
  } else if (run.usable() && run.j.contains("inputs") && run.j["inputs"].is_array()) {
    for (const auto& r : run.j["inputs"])
      if (r.is_object() && r.value("role", "") == "manifest" && r.contains("path") && r["path"].is_string()) {
        mpath = path_from(o.dir, r["path"].get<std::string>()), mhow = "run.json inputs (role manifest)";
        break;
      }
  }
  Doc man = read_doc("manifest", mpath, mhow);
  if (mpath.empty())
    man.error = mhow.empty() ? "not found: no --manifest, no DIR/manifest.json, and run.json records no manifest input"
                             : "not found: run.json's manifest input record has an empty path";

  std::optional<Doc> ev, an;
  if (!o.eval.empty()) ev = read_doc("evaluation", o.eval, "--eval");
  else if (file_exists((dir / "EVAL.json").string())) ev = read_doc("evaluation", (dir / "EVAL.json").string(), "DIR/EVAL.json");
  if (!o.analysis.empty()) an = read_doc("analysis", analysis_file(o.analysis), "--analysis");
  else if (file_exists((dir / "analysis" / "analysis.json").string()))
    an = read_doc("analysis", (dir / "analysis" / "analysis.json").string(), "DIR/analysis/analysis.json");

  // 1. Every artifact's own hash.
  check_artifact(ck, man, "atlas.probe.manifest");
  check_artifact(ck, run, "atlas.probe.run");
  if (ev) check_artifact(ck, *ev, "atlas.eval");
  else ck.skip("artifact evaluation", "none (no --eval, no DIR/EVAL.json)");
  if (an) check_artifact(ck, *an, "atlas.analysis");
  else ck.skip("artifact analysis", "none (no --analysis, no DIR/analysis/analysis.json)");

  // 2. The chain: each artifact names its inputs by the SHA-256 they have now.
  const bool run_ok = run.usable(), man_ok = man.usable();
  if (run_ok && man_ok) {
    check_link(ck, run, man, "manifest");
    check_named_hash(ck, "chain run -> manifest (manifest_sha256)", run, "manifest_sha256", string_or_empty(run.j, "manifest_sha256"),
                     string_or_empty(man.j, "manifest_sha256"), "manifest's manifest_sha256");
  } else {
    ck.skip("chain run -> manifest", "run or manifest unusable");
  }
  if (ev) {
    check_link(ck, *ev, run, "run");
    check_link(ck, *ev, man, "manifest");
    if (ev->usable() && run_ok)
      ck.guarded("chain evaluation -> run (content_sha256)", ev->path, [&] {
        check_named_hash(ck, "chain evaluation -> run (content_sha256)", *ev, "run.content_sha256",
                         ev->j.at("run").at("content_sha256").get<std::string>(), run.j.value("content_sha256", ""),
                         "run's content_sha256");
      });
    check_other_inputs(ck, *ev, {&run, &man});
  }
  if (an) {
    check_link(ck, *an, run, "run");
    if (ev) {
      // The analysis reads the evaluation only when it joins verdicts; then it must name it.
      bool names_eval = false;
      if (an->usable() && an->j.contains("inputs") && an->j["inputs"].is_array())
        for (const auto& r : an->j["inputs"])
          if (r.is_object() && (r.value("role", "") == "evaluation" ||
                                (r.contains("path") && r["path"].is_string() &&
                                 same_file(path_from(dir_of(an->path), r["path"].get<std::string>()), ev->path))))
            names_eval = true;
      if (names_eval) check_link(ck, *an, *ev, "evaluation");
      else ck.skip("chain analysis -> evaluation", "the analysis reads no evaluation (it names the run directly)");
    }
    if (an->usable() && man_ok)
      check_named_hash(ck, "chain analysis -> manifest (manifest_sha256)", *an, "manifest_sha256",
                       string_or_empty(an->j, "manifest_sha256"), string_or_empty(man.j, "manifest_sha256"), "manifest's manifest_sha256");
    check_other_inputs(ck, *an, {&run, &man, ev ? &*ev : nullptr});
  }

  // 3. Invariants, re-derived from the artifacts' contents.
  std::map<std::string, int64_t> stops;
  int64_t decisions = -1;
  if (man_ok) {
    check_cell_grid(ck, man);
    check_edits(ck, man);
    if (man.j.contains("intervention_files")) check_intervention_files(ck, man);
  }
  if (run_ok) {
    if (man_ok) check_run_cells(ck, man, run);
    decisions = check_routes(ck, run);
    stops = check_generations(ck, run, man);
    check_hidden_vectors(ck, run, o.dir);
    check_journals(ck, run, o.dir);
  }
  if (ev && ev->usable() && run_ok) check_ledgers(ck, *ev, run, stops);
  if (an && an->usable() && run_ok) check_analysis_counts(ck, *an, run, man, decisions, stops);

  for (const Doc* d : {&man, &run, ev ? &*ev : nullptr, an ? &*an : nullptr}) {
    if (!d) continue;
    std::string kind = d->parsed && d->j.is_object() ? string_or_empty(d->j, "kind") : "";
    rep.artifacts.push_back({.role = d->role, .path = d->path, .how = d->how, .kind = kind, .sha256 = d->sha256, .bytes = d->bytes});
  }
  return rep;
}

std::string format_audit(const AuditReport& r) {
  std::string s = "audit " + r.dir + "\n";
  char b[512];
  for (const auto& a : r.artifacts) {
    std::snprintf(b, sizeof b, "  %-10s %s", a.role.c_str(), a.path.empty() ? "(not found)" : a.path.c_str());
    s += b;
    if (!a.sha256.empty()) s += "  sha256 " + a.sha256 + "  " + std::to_string(a.bytes) + " bytes";
    s += "  [" + a.how + "]\n";
  }
  for (const auto& c : r.checks) {
    const char* st = c.status == CheckStatus::Pass ? "PASS" : c.status == CheckStatus::Fail ? "FAIL" : "SKIP";
    s += std::string(st) + "  " + c.name + ": " + c.detail + "\n";
  }
  s += (r.holds() ? "AUDIT HOLDS" : "AUDIT FAILS") + std::string(" (") + std::to_string(r.count(CheckStatus::Pass)) + " passed, " +
       std::to_string(r.count(CheckStatus::Fail)) + " failed, " + std::to_string(r.count(CheckStatus::Skip)) + " skipped)\n";
  return s;
}

ojson audit_json(const AuditReport& r) {
  ojson j;
  j["kind"] = "atlas.audit";
  j["format_version"] = 1;
  j["dir"] = r.dir;
  ojson arts = ojson::array();
  for (const auto& a : r.artifacts)
    arts.push_back({{"role", a.role}, {"path", a.path}, {"found_by", a.how}, {"kind", a.kind},
                    {"sha256", a.sha256.empty() ? ojson(nullptr) : ojson(a.sha256)}, {"bytes", a.bytes}});
  j["artifacts"] = arts;
  ojson checks = ojson::array();
  for (const auto& c : r.checks)
    checks.push_back({{"check", c.name},
                      {"status", c.status == CheckStatus::Pass ? "pass" : c.status == CheckStatus::Fail ? "fail" : "skip"},
                      {"detail", c.detail},
                      {"numbers", c.numbers}});
  j["checks"] = checks;
  j["passed"] = r.count(CheckStatus::Pass);
  j["failed"] = r.count(CheckStatus::Fail);
  j["skipped"] = r.count(CheckStatus::Skip);
  j["holds"] = r.holds();
  j["provenance"] = build_provenance();
  return j;
}

}  // namespace atlas::audit
