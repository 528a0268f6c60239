// Reading and validating "atlas-analysis-input-v1" files (format in docs/stats.md).
#include <cmath>
#include <map>
#include <set>

#include "core/error.h"
#include "core/file.h"
#include "core/sha256.h"
#include "stats/analysis.h"

namespace atlas::stats {

namespace {

constexpr const char* kFormat = "atlas-analysis-input-v1";

std::string idx(const std::string& field, size_t i) { return field + "[" + std::to_string(i) + "]"; }

// Layer and stage names may be written as numbers or strings.
std::vector<std::string> read_names(const JsonReader& r, const std::string& key) {
  const json& a = r.raw(key);
  if (!a.is_array() || a.empty()) fail(r.file(), r.field(key), "expected a non-empty array of names");
  std::vector<std::string> out;
  std::set<std::string> seen;
  for (size_t i = 0; i < a.size(); ++i) {
    std::string s;
    if (a[i].is_string())
      s = a[i].get<std::string>();
    else if (a[i].is_number_integer())
      s = std::to_string(a[i].get<int64_t>());
    else
      fail(r.file(), idx(r.field(key), i), "expected a string or an integer, got " + a[i].dump());
    if (s.empty() || !seen.insert(s).second) fail(r.file(), idx(r.field(key), i), "empty or repeated name");
    out.push_back(s);
  }
  return out;
}

uint32_t lookup(const std::map<std::string, uint32_t>& m, const std::string& name, const std::string& file,
                const std::string& field, const char* what) {
  auto it = m.find(name);
  if (it == m.end()) fail(file, field, std::string("unknown ") + what + " \"" + name + "\"");
  return it->second;
}

std::map<std::string, uint32_t> index_of(const std::vector<std::string>& names) {
  std::map<std::string, uint32_t> m;
  for (size_t i = 0; i < names.size(); ++i) m[names[i]] = uint32_t(i);
  return m;
}

const json& array_at(const json& v, const std::string& file, const std::string& field, size_t expect_size) {
  if (!v.is_array()) fail(file, field, "expected an array, got " + v.dump().substr(0, 60));
  if (expect_size != size_t(-1) && v.size() != expect_size)
    fail(file, field, "expected " + std::to_string(expect_size) + " entries, got " + std::to_string(v.size()));
  return v;
}

void read_routes(const JsonReader& cr, const AnalysisInput& in, Cell& c) {
  const JsonReader rr = cr.child("routes");
  const std::string& f = cr.file();
  const size_t L = in.layers.size(), k = in.top_k;
  const json& ids = array_at(rr.raw("topk_ids"), f, rr.field("topk_ids"), L);
  const json& ws = array_at(rr.raw("topk_weights"), f, rr.field("topk_weights"), L);
  const size_t T = ids[0].is_array() ? ids[0].size() : 0;
  if (T == 0) fail(f, rr.field("topk_ids[0]"), "expected a non-empty array of tokens");
  c.tokens = uint32_t(T);
  c.topk_ids.resize(L * T * k);
  c.topk_weights.resize(L * T * k);
  for (size_t l = 0; l < L; ++l) {
    const std::string fi = idx(rr.field("topk_ids"), l), fw = idx(rr.field("topk_weights"), l);
    const json& il = array_at(ids[l], f, fi, T);
    const json& wl = array_at(ws[l], f, fw, T);
    for (size_t t = 0; t < T; ++t) {
      const json& it = array_at(il[t], f, idx(fi, t), k);
      const json& wt = array_at(wl[t], f, idx(fw, t), k);
      for (size_t j = 0; j < k; ++j) {
        if (!it[j].is_number_integer()) fail(f, idx(idx(fi, t), j), "expected an expert id, got " + it[j].dump());
        const int64_t e = it[j].get<int64_t>();
        if (e < 0 || e >= int64_t(in.experts))
          fail(f, idx(idx(fi, t), j), "expert id " + std::to_string(e) + " outside [0, experts)");
        if (!wt[j].is_number()) fail(f, idx(idx(fw, t), j), "expected a number, got " + wt[j].dump());
        const double w = wt[j].get<double>();
        if (!std::isfinite(w)) fail(f, idx(idx(fw, t), j), "not finite");
        c.topk_ids[(l * T + t) * k + j] = int32_t(e);
        c.topk_weights[(l * T + t) * k + j] = float(w);
      }
    }
  }
}

// Target scope: target_range [start, end) (the probe manifests' interior_token_range) or a
// 0/1 target_mask over the T tokens; all tokens when neither is given.
void read_target(const JsonReader& cr, Cell& c) {
  const std::string& f = cr.file();
  c.target.assign(c.tokens, 1);
  if (cr.has_value("target_range") && cr.has_value("target_mask"))
    fail(f, cr.field("target_mask"), "give target_range or target_mask, not both");
  if (cr.has_value("target_range")) {
    const json& r = array_at(cr.raw("target_range"), f, cr.field("target_range"), 2);
    if (!r[0].is_number_integer() || !r[1].is_number_integer())
      fail(f, cr.field("target_range"), "expected [start, end) integers");
    const int64_t a = r[0].get<int64_t>(), b = r[1].get<int64_t>();
    if (a < 0 || b <= a || b > int64_t(c.tokens))
      fail(f, cr.field("target_range"),
           "expected 0 <= start < end <= " + std::to_string(c.tokens) + ", got [" + std::to_string(a) + ", " +
               std::to_string(b) + ")");
    for (uint32_t t = 0; t < c.tokens; ++t) c.target[t] = t >= a && t < b;
  } else if (cr.has_value("target_mask")) {
    const json& m = array_at(cr.raw("target_mask"), f, cr.field("target_mask"), c.tokens);
    size_t n = 0;
    for (size_t t = 0; t < c.tokens; ++t) {
      if (!m[t].is_number_integer() || (m[t] != 0 && m[t] != 1))
        fail(f, idx(cr.field("target_mask"), t), "expected 0 or 1");
      c.target[t] = m[t] == 1;
      n += c.target[t];
    }
    if (n == 0) fail(f, cr.field("target_mask"), "no token in the target scope");
  }
}

void read_hidden(const JsonReader& cr, AnalysisInput& in, Cell& c, uint32_t rows) {
  const std::string& f = cr.file();
  const std::string fh = cr.field("hidden");
  const json& h = array_at(cr.raw("hidden"), f, fh, in.stages.size());
  for (size_t s = 0; s < h.size(); ++s) {
    const json& rs = array_at(h[s], f, idx(fh, s), rows);
    for (size_t r = 0; r < rs.size(); ++r) {
      const std::string fr = idx(idx(fh, s), r);
      const json& row = array_at(rs[r], f, fr, in.hidden_dim == 0 ? size_t(-1) : in.hidden_dim);
      if (row.empty()) fail(f, fr, "empty hidden row");
      if (in.hidden_dim == 0) in.hidden_dim = uint32_t(row.size());
      for (size_t i = 0; i < row.size(); ++i) {
        if (!row[i].is_number()) fail(f, idx(fr, i), "expected a number, got " + row[i].dump());
        c.hidden.push_back(row[i].get<float>());
      }
    }
  }
}

Cell read_cell(const JsonReader& cr, AnalysisInput& in, const std::map<std::string, uint32_t>& src,
               const std::map<std::string, uint32_t>& cond, size_t i) {
  const std::string& f = cr.file();
  Cell c;
  c.id = cr.get_or<std::string>("cell_id", "cells[" + std::to_string(i) + "]");
  c.source = lookup(src, cr.get<std::string>("source"), f, cr.field("source"), "source");
  c.condition = lookup(cond, cr.get<std::string>("condition"), f, cr.field("condition"), "condition");
  if (cr.has_value("repeat")) {
    const json& r = cr.raw("repeat");
    if (r.is_string())
      c.repeat = r.get<std::string>();
    else if (r.is_number_integer())
      c.repeat = std::to_string(r.get<int64_t>());
    else
      fail(f, cr.field("repeat"), "expected a string or an integer");
  }
  if (cr.has_value("routes")) {
    if (!in.has_routes()) fail(f, cr.field("routes"), "routes given but the input declares no layers");
    read_routes(cr, in, c);
    read_target(cr, c);
  } else if (cr.has_value("target_range") || cr.has_value("target_mask")) {
    if (!cr.has_value("target_range")) fail(f, cr.field("target_mask"), "a target_mask needs routes");
    const json& r = array_at(cr.raw("target_range"), f, cr.field("target_range"), 2);
    if (!r[0].is_number_integer() || !r[1].is_number_integer() || r[1].get<int64_t>() <= r[0].get<int64_t>() ||
        r[0].get<int64_t>() < 0)
      fail(f, cr.field("target_range"), "expected [start, end) integers with start < end");
    c.tokens = uint32_t(r[1].get<int64_t>() - r[0].get<int64_t>());
    c.target.assign(c.tokens, 1);
  }
  if (cr.has_value("hidden")) {
    if (!in.has_hidden()) fail(f, cr.field("hidden"), "hidden rows given but the input declares no hidden_stages");
    uint32_t rows = 0;
    if (!c.target.empty()) {
      for (uint8_t m : c.target) rows += m;
    } else {
      const json& h = cr.raw("hidden");
      rows = h.is_array() && !h.empty() && h[0].is_array() ? uint32_t(h[0].size()) : 0;
      if (rows == 0) fail(f, cr.field("hidden"), "expected [stages][rows][hidden] with at least one row");
      c.tokens = rows;
      c.target.assign(rows, 1);
    }
    read_hidden(cr, in, c, rows);
  }
  if (cr.has_value("generated_ids")) {
    const json& g = array_at(cr.raw("generated_ids"), f, cr.field("generated_ids"), size_t(-1));
    std::vector<int32_t> ids;
    for (size_t t = 0; t < g.size(); ++t) {
      if (!g[t].is_number_integer()) fail(f, idx(cr.field("generated_ids"), t), "expected a token id");
      ids.push_back(int32_t(g[t].get<int64_t>()));
    }
    c.generated = std::move(ids);
  }
  if (cr.has_value("stop")) {
    const std::string s = cr.get<std::string>("stop");
    if (s != "eos" && s != "length") fail(f, cr.field("stop"), "expected \"eos\" or \"length\", got \"" + s + "\"");
    c.stop = s;
  }
  if (cr.has_value("evaluable")) c.evaluable = cr.get<bool>("evaluable");
  if (cr.has_value("correct")) c.correct = cr.get<bool>("correct");
  if (cr.has_value("terminal")) c.terminal = cr.get<std::string>("terminal");
  return c;
}

}  // namespace

AnalysisInput parse_analysis_input(const json& j, const std::string& file) {
  if (!j.is_object()) fail(file, {}, "expected a JSON object");
  const JsonReader r(j, file);
  const std::string fmt = r.get<std::string>("format");
  if (fmt != kFormat) fail(file, "format", "expected \"" + std::string(kFormat) + "\", got \"" + fmt + "\"");
  AnalysisInput in;
  in.manifest_sha256 = r.get_or<std::string>("manifest_sha256", "");
  if (r.has_value("layers")) {
    in.layers = read_names(r, "layers");
    in.experts = r.get<uint32_t>("experts");
    in.top_k = r.get<uint32_t>("top_k");
    if (in.experts == 0 || in.top_k == 0 || in.top_k > in.experts)
      fail(file, "top_k", "expected 0 < top_k <= experts");
  }
  if (r.has_value("hidden_stages")) in.stages = read_names(r, "hidden_stages");
  in.conditions = read_names(r, "conditions");
  const auto cond = index_of(in.conditions);

  // Sources and domains (declared order, or order of first appearance).
  const json& sa = r.raw("sources");
  if (!sa.is_array() || sa.empty()) fail(file, "sources", "expected a non-empty array");
  if (r.has_value("domains")) in.domains = read_names(r, "domains");
  const bool declared_domains = !in.domains.empty();
  std::map<std::string, uint32_t> dom = index_of(in.domains), src;
  for (size_t i = 0; i < sa.size(); ++i) {
    const JsonReader s(sa[i], file, idx("sources", i));
    const std::string id = s.get<std::string>("id"), d = s.get<std::string>("domain");
    if (id.empty() || src.count(id)) fail(file, s.field("id"), "empty or repeated source id \"" + id + "\"");
    if (!dom.count(d)) {
      if (declared_domains) fail(file, s.field("domain"), "domain \"" + d + "\" is not in domains");
      dom[d] = uint32_t(in.domains.size());
      in.domains.push_back(d);
    }
    src[id] = uint32_t(in.sources.size());
    in.sources.push_back({.id = id, .domain = dom[d]});
  }

  const json& ca = r.raw("cells");
  if (!ca.is_array() || ca.empty()) fail(file, "cells", "expected a non-empty array");
  for (size_t i = 0; i < ca.size(); ++i)
    in.cells.push_back(read_cell(JsonReader(ca[i], file, idx("cells", i)), in, src, cond, i));

  if (!r.has_value("edges")) in.design_origin = "the analysis input declares no edges";
  if (r.has_value("edges")) {
    const json& ea = array_at(r.raw("edges"), file, "edges", size_t(-1));
    for (size_t i = 0; i < ea.size(); ++i) {
      const JsonReader e(ea[i], file, idx("edges", i));
      Edge ed{.name = e.get<std::string>("name"),
              .condition = lookup(cond, e.get<std::string>("condition"), file, e.field("condition"), "condition"),
              .reference = lookup(cond, e.get<std::string>("reference"), file, e.field("reference"), "condition")};
      if (ed.condition == ed.reference) fail(file, e.field("reference"), "an edge needs two different conditions");
      in.edges.push_back(ed);
    }
  }
  if (r.has_value("factorials")) {
    const json& fa = array_at(r.raw("factorials"), file, "factorials", size_t(-1));
    for (size_t i = 0; i < fa.size(); ++i) {
      const JsonReader e(fa[i], file, idx("factorials", i));
      Factorial fc{.name = e.get<std::string>("name"), .factor_a = e.get<std::string>("a"),
                   .factor_b = e.get<std::string>("b")};
      const char* keys[2][2] = {{"a0b0", "a0b1"}, {"a1b0", "a1b1"}};
      std::set<uint32_t> distinct;
      for (int a = 0; a < 2; ++a)
        for (int b = 0; b < 2; ++b) {
          fc.cell[a][b] = lookup(cond, e.get<std::string>(keys[a][b]), file, e.field(keys[a][b]), "condition");
          distinct.insert(fc.cell[a][b]);
        }
      if (distinct.size() != 4) fail(file, e.field("a0b0"), "a factorial needs four different conditions");
      in.factorials.push_back(fc);
    }
  }
  return in;
}

AnalysisInput read_analysis_input(const std::vector<std::string>& paths, bool allow_mixed) {
  if (paths.empty()) fail("no input file given");
  AnalysisInput merged;
  for (size_t p = 0; p < paths.size(); ++p) {
    const std::string text = read_file(paths[p]);
    AnalysisInput in = parse_analysis_input(parse_json(text, paths[p]), paths[p]);
    const InputFile fi{.path = paths[p], .sha256 = sha256_hex(text)};
    if (p == 0) {
      merged = std::move(in);
      merged.files = {fi};
      continue;
    }
    const std::string& f = paths[p];
    if (in.manifest_sha256 != merged.manifest_sha256 && !allow_mixed)
      fail(f, "manifest_sha256",
           "inputs come from different manifests (\"" + in.manifest_sha256 + "\" here, \"" + merged.manifest_sha256 +
               "\" in " + paths[0] + "); pass --allow-mixed to analyse them together");
    if (in.layers != merged.layers) fail(f, "layers", "differs from " + paths[0]);
    if (in.experts != merged.experts || in.top_k != merged.top_k) fail(f, "experts", "differs from " + paths[0]);
    if (in.stages != merged.stages) fail(f, "hidden_stages", "differs from " + paths[0]);
    if (in.conditions != merged.conditions) fail(f, "conditions", "differs from " + paths[0]);
    if (in.hidden_dim && merged.hidden_dim && in.hidden_dim != merged.hidden_dim)
      fail(f, "cells", "hidden rows have a different width than in " + paths[0]);
    if (!merged.hidden_dim) merged.hidden_dim = in.hidden_dim;
    // Domains and sources: union by name; a source keeps its domain.
    auto dom = index_of(merged.domains);
    std::map<std::string, uint32_t> src;
    for (size_t i = 0; i < merged.sources.size(); ++i) src[merged.sources[i].id] = uint32_t(i);
    std::vector<uint32_t> src_map(in.sources.size());
    for (size_t i = 0; i < in.sources.size(); ++i) {
      const std::string& d = in.domains[in.sources[i].domain];
      if (!dom.count(d)) {
        dom[d] = uint32_t(merged.domains.size());
        merged.domains.push_back(d);
      }
      auto it = src.find(in.sources[i].id);
      if (it == src.end()) {
        src_map[i] = src[in.sources[i].id] = uint32_t(merged.sources.size());
        merged.sources.push_back({.id = in.sources[i].id, .domain = dom[d]});
      } else {
        if (merged.sources[it->second].domain != dom[d])
          fail(f, idx("sources", i), "source \"" + in.sources[i].id + "\" has another domain in " + paths[0]);
        src_map[i] = it->second;
      }
    }
    for (Cell& c : in.cells) {
      c.source = src_map[c.source];
      merged.cells.push_back(std::move(c));
    }
    // Edges and factorials: the union, by name (the same name must mean the same conditions).
    for (const Edge& e : in.edges) {
      bool found = false;
      for (const Edge& m : merged.edges)
        if (m.name == e.name) {
          if (m.condition != e.condition || m.reference != e.reference)
            fail(f, "edges", "edge \"" + e.name + "\" differs from " + paths[0]);
          found = true;
        }
      if (!found) merged.edges.push_back(e);
    }
    for (const Factorial& e : in.factorials) {
      bool found = false;
      for (const Factorial& m : merged.factorials)
        if (m.name == e.name) found = true;
      if (!found) merged.factorials.push_back(e);
    }
    merged.files.push_back(fi);
  }
  validate_analysis_input(merged);
  return merged;
}

void validate_analysis_input(const AnalysisInput& in) {
  const std::string f = in.files.empty() ? std::string() : in.files[0].path;
  const size_t S = in.sources.size(), C = in.conditions.size();
  // Every domain needs sources (a declared domain without any is an error, not a silent gap).
  std::vector<uint32_t> per_domain(in.domains.size(), 0);
  for (const Source& s : in.sources) ++per_domain.at(s.domain);
  for (size_t d = 0; d < in.domains.size(); ++d)
    if (per_domain[d] == 0) fail(f, "domains", "domain \"" + in.domains[d] + "\" has no sources");
  // Edges and factorials: in range, distinct names, no repeated (condition, reference) pair.
  for (size_t i = 0; i < in.edges.size(); ++i) {
    const Edge& e = in.edges[i];
    const std::string where = "edges[" + std::to_string(i) + "]";
    if (e.condition >= C || e.reference >= C) fail(f, where, "condition out of range");
    if (e.condition == e.reference) fail(f, where + ".reference", "an edge needs two different conditions");
    for (size_t k = 0; k < i; ++k) {
      if (in.edges[k].name == e.name) fail(f, where + ".name", "edge name \"" + e.name + "\" used twice");
      if (in.edges[k].condition == e.condition && in.edges[k].reference == e.reference)
        fail(f, where, "duplicates edge \"" + in.edges[k].name + "\" (" + in.conditions[e.condition] + " vs " +
                           in.conditions[e.reference] + ")");
    }
  }
  for (size_t i = 0; i < in.factorials.size(); ++i) {
    const Factorial& x = in.factorials[i];
    const std::string where = "factorials[" + std::to_string(i) + "]";
    std::set<uint32_t> cells;
    for (int a = 0; a < 2; ++a)
      for (int b = 0; b < 2; ++b) {
        if (x.cell[a][b] >= C) fail(f, where, "condition out of range");
        cells.insert(x.cell[a][b]);
      }
    if (cells.size() != 4) fail(f, where, "a factorial needs four different conditions");
    for (size_t k = 0; k < i; ++k)
      if (in.factorials[k].name == x.name) fail(f, where + ".name", "factorial name \"" + x.name + "\" used twice");
  }
  // Unique (source, condition, repeat).
  std::set<std::tuple<uint32_t, uint32_t, std::string>> seen;
  for (const Cell& c : in.cells) {
    if (c.source >= S || c.condition >= C) fail(f, c.id, "source or condition out of range");
    if (!seen.insert({c.source, c.condition, c.repeat}).second)
      fail(f, c.id,
           "a second cell for source \"" + in.sources[c.source].id + "\", condition \"" + in.conditions[c.condition] +
               "\", repeat \"" + c.repeat + "\"");
  }
  // Routes and hidden rows: a full grid, one cell per (source, condition), equal target counts.
  auto grid_check = [&](const char* what, auto has) {
    std::vector<const Cell*> grid(S * C, nullptr);
    bool any = false;
    for (const Cell& c : in.cells)
      if (has(c)) {
        any = true;
        if (grid[c.source * C + c.condition])
          fail(f, c.id, std::string("several cells with ") + what + " for one (source, condition); " + what +
                            " are analysed once per source and condition");
        grid[c.source * C + c.condition] = &c;
      }
    if (!any) return;
    for (size_t s = 0; s < S; ++s) {
      size_t n_target = size_t(-1);
      for (size_t c = 0; c < C; ++c) {
        const Cell* cell = grid[s * C + c];
        if (!cell)
          fail(f, "cells",
               std::string("no ") + what + " for source \"" + in.sources[s].id + "\", condition \"" + in.conditions[c] +
                   "\" (the analysis needs the full source x condition grid)");
        size_t n = 0;
        for (uint8_t m : cell->target) n += m;
        if (n_target == size_t(-1)) n_target = n;
        if (n != n_target)
          fail(f, cell->id,
               std::string("target scope has ") + std::to_string(n) + " tokens but " + std::to_string(n_target) +
                   " in another condition of source \"" + in.sources[s].id + "\" (target tokens must align)");
      }
    }
  };
  if (in.has_routes()) grid_check("routes", [](const Cell& c) { return !c.topk_ids.empty(); });
  if (in.has_hidden()) grid_check("hidden rows", [](const Cell& c) { return !c.hidden.empty(); });
}

}  // namespace atlas::stats
