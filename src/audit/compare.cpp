#include "audit/compare.h"

#include <algorithm>
#include <map>
#include <set>

#include "audit/hash_chain.h"
#include "core/provenance.h"
#include "core/sha256.h"

namespace atlas::audit {
namespace {

// Leaves of a JSON value with their dotted paths. Objects are descended into; arrays are
// descended into only when they hold objects (stages, history entries), so an array of scalars
// (token ids, a shape, per-expert loads) is one field, compared whole.
void flatten(const json& v, const std::string& path, std::vector<std::pair<std::string, const json*>>& out) {
  if (v.is_object() && !v.empty()) {
    for (auto it = v.begin(); it != v.end(); ++it)
      flatten(it.value(), path.empty() ? it.key() : path + "." + it.key(), out);
    return;
  }
  if (v.is_array() && std::any_of(v.begin(), v.end(), [](const json& e) { return e.is_object(); })) {
    for (size_t i = 0; i < v.size(); ++i) flatten(v[i], path + "[" + std::to_string(i) + "]", out);
    return;
  }
  out.emplace_back(path, &v);
}

// Cut at a UTF-8 character boundary: the pieces go into JSON, which must stay valid UTF-8.
std::string shorten(const std::string& s, size_t n = 96) {
  if (s.size() <= n) return s;
  size_t cut = n - 3;
  while (cut > 0 && (static_cast<unsigned char>(s[cut]) & 0xC0) == 0x80) --cut;
  return s.substr(0, cut) + "...";
}

// Where two equal-length arrays of scalars first differ, and in how many elements.
std::string array_detail(const json& a, const json& b) {
  if (!a.is_array() || !b.is_array() || a.size() != b.size()) {
    if (a.is_array() && b.is_array())
      return "lengths " + std::to_string(a.size()) + " vs " + std::to_string(b.size());
    return {};
  }
  int64_t n = 0;
  size_t first = 0;
  for (size_t i = 0; i < a.size(); ++i)
    if (a[i].dump() != b[i].dump()) {
      if (n++ == 0) first = i;
    }
  if (n == 0) return {};
  return "element [" + std::to_string(first) + "] of " + std::to_string(a.size()) + ": " + shorten(a[first].dump(), 40) +
         " vs " + shorten(b[first].dump(), 40) + " (" + std::to_string(n) + (n == 1 ? " element differs)" : " elements differ)");
}

struct Engine {
  const KindAdapter& kind;
  const CompareOptions& opts;
  bool same_cell_set;
  Comparison& out;
  std::map<std::string, FamilyCount> counts;
  std::set<std::string> used_ignores;
  std::set<std::string> not_compared;

  bool ignored(const std::string& field) {
    bool hit = false;
    for (const auto& p : opts.ignore)
      if (field_is(field, p)) {
        used_ignores.insert(p);
        hit = true;
      }
    return hit;
  }

  void cell(const std::string& id, const std::string& group, const json& va, const json& vb) {
    std::vector<std::pair<std::string, const json*>> fa, fb;
    flatten(va, {}, fa);
    flatten(vb, {}, fb);
    std::map<std::string, const json*> in_b(fb.begin(), fb.end());
    std::set<std::string> in_a;
    for (const auto& [f, v] : fa) {
      in_a.insert(f);
      auto it = in_b.find(f);
      field(id, group, f, v, it == in_b.end() ? nullptr : it->second);
    }
    for (const auto& [f, v] : fb)
      if (!in_a.count(f)) field(id, group, f, nullptr, v);
  }

  void field(const std::string& id, const std::string& group, const std::string& f, const json* a, const json* b) {
    if (ignored(f)) return;
    const FieldClass cls = kind.classify(group, f);
    if (cls.role == Role::Aggregate && !same_cell_set) {
      not_compared.insert(f);
      return;
    }
    FamilyCount& fc = counts[cls.family];
    fc.family = cls.family;
    fc.counted = cls.role != Role::Informational || opts.strict;
    ++fc.total;
    const std::string da = a ? a->dump() : "(absent)", db = b ? b->dump() : "(absent)";
    if (a && b && da == db) {
      ++fc.exact;
      return;
    }
    out.differences.push_back({.cell = id,
                               .field = f,
                               .family = cls.family,
                               .a = shorten(da),
                               .b = shorten(db),
                               .detail = a && b ? array_detail(*a, *b) : std::string(),
                               .counted = fc.counted});
  }
};

}  // namespace

int64_t Comparison::counted_differences() const {
  return std::count_if(differences.begin(), differences.end(), [](const Difference& d) { return d.counted; });
}

bool Comparison::identical() const {
  return counted_differences() == 0 && !order_differs && only_a.empty() && (subset || only_b.empty());
}

Comparison compare(const Artifact& a, const Artifact& b, const CompareOptions& opts) {
  if (a.kind != b.kind)
    fail(b.path, "kind", "is " + b.kind + " but " + a.path + " is " + a.kind + ": only artifacts of one kind compare");
  const KindAdapter& kind = adapter_for(a.kind, a.path);
  Comparison c;
  c.kind = a.kind;
  c.cell_noun = kind.cell_noun;
  c.subset = opts.subset;
  c.cells_a = int64_t(a.cells.size());
  c.cells_b = int64_t(b.cells.size());

  std::map<std::string, const Cell*> by_id_b;
  for (const auto& cell : b.cells) by_id_b[cell.id] = &cell;
  std::set<std::string> ids_a;
  std::vector<std::string> shared_in_a_order, shared_in_b_order;
  for (const auto& cell : a.cells) {
    ids_a.insert(cell.id);
    if (by_id_b.count(cell.id))
      shared_in_a_order.push_back(cell.id);
    else
      c.only_a.push_back(cell.id);
  }
  for (const auto& cell : b.cells) {
    if (ids_a.count(cell.id))
      shared_in_b_order.push_back(cell.id);
    else
      c.only_b.push_back(cell.id);
  }
  c.shared = int64_t(shared_in_a_order.size());
  c.order_differs = shared_in_a_order != shared_in_b_order;

  Engine e{.kind = kind, .opts = opts, .same_cell_set = c.only_a.empty() && c.only_b.empty(), .out = c,
           .counts = {}, .used_ignores = {}, .not_compared = {}};
  e.cell(kTopId, kTopGroup, a.top, b.top);
  for (const auto& cell : a.cells) {
    auto it = by_id_b.find(cell.id);
    if (it == by_id_b.end()) continue;
    if (cell.group != it->second->group) {
      // Same id, different cell type: a structural difference, counted as an identity field.
      const json ga = cell.group, gb = it->second->group;
      e.field(cell.id, cell.group, "(cell type)", &ga, &gb);
      continue;
    }
    e.cell(cell.id, cell.group, cell.value, it->second->value);
  }

  for (const auto& f : kind.families)
    if (auto it = e.counts.find(f); it != e.counts.end()) {
      c.families.push_back(it->second);
      e.counts.erase(it);
    }
  for (auto& [f, fc] : e.counts) c.families.push_back(fc);  // families the adapter did not list
  c.not_compared.assign(e.not_compared.begin(), e.not_compared.end());
  for (const auto& p : opts.ignore)
    if (!e.used_ignores.count(p)) c.unused_ignores.push_back(p);
  return c;
}

namespace {

std::string quoted_list(const std::vector<std::string>& ids, size_t max) {
  std::string s;
  for (size_t i = 0; i < ids.size() && i < max; ++i) s += (i ? ", " : "") + json(ids[i]).dump();
  if (ids.size() > max) s += ", ... (" + std::to_string(ids.size() - max) + " more)";
  return s;
}

std::string coverage_line(const Comparison& c) {
  const int64_t all = c.shared + int64_t(c.only_a.size()) + int64_t(c.only_b.size());
  std::string s = std::to_string(c.shared) + " of " + std::to_string(all) + " " + c.cell_noun + "s shared";
  if (!c.only_a.empty()) s += "; " + std::to_string(c.only_a.size()) + " only in A";
  if (!c.only_b.empty())
    s += "; " + std::to_string(c.only_b.size()) + " only in B" + (c.subset ? " (allowed: --subset)" : "");
  return s;
}

}  // namespace

std::string format_comparison(const Comparison& c, const Artifact& a, const Artifact& b, int64_t max_diffs) {
  std::string s;
  s += "compare " + c.kind + "\n  A: " + a.path + "\n  B: " + b.path + "\n";
  s += coverage_line(c) + "\n";
  size_t width = 0;
  for (const auto& f : c.families) width = std::max(width, f.family.size());
  for (const auto& f : c.families) {
    char line[256];
    if (f.counted)
      std::snprintf(line, sizeof line, "  %-*s %8lld / %lld\n", int(width), f.family.c_str(), (long long)f.exact,
                    (long long)f.total);
    else
      std::snprintf(line, sizeof line, "  %-*s %8lld / %-8lld  (reported, not counted; --strict counts it)\n",
                    int(width), f.family.c_str(), (long long)f.exact, (long long)f.total);
    s += line;
  }
  if (!c.not_compared.empty())
    s += "not compared (the " + c.cell_noun + " sets differ): " + quoted_list(c.not_compared, 20) + "\n";
  for (const auto& p : c.unused_ignores) s += "note: --ignore " + p + " matched no field\n";
  if (c.order_differs) s += "the shared " + c.cell_noun + "s appear in a different order\n";
  if (!c.differences.empty()) {
    const int64_t n = int64_t(c.differences.size());
    s += "differences: " + std::to_string(n);
    if (n > max_diffs) s += " (first " + std::to_string(max_diffs) + " listed)";
    s += "\n";
    for (int64_t i = 0; i < n && i < max_diffs; ++i) {
      const Difference& d = c.differences[size_t(i)];
      s += "  " + (d.cell == kTopId ? d.cell : c.cell_noun + " " + json(d.cell).dump()) + " " + d.field + " [" +
           d.family + "]: ";
      s += d.detail.empty() ? d.a + " vs " + d.b : d.detail;
      if (!d.counted) s += " (not counted)";
      s += "\n";
    }
  }
  if (!c.only_a.empty()) s += "only in A: " + quoted_list(c.only_a, 10) + "\n";
  if (!c.only_b.empty()) s += "only in B: " + quoted_list(c.only_b, 10) + "\n";
  s += c.identical() ? "IDENTICAL\n"
                     : "DIFFERENT (" + std::to_string(c.counted_differences()) + " field difference" +
                           (c.counted_differences() == 1 ? "" : "s") + ")\n";
  return s;
}

namespace {

// Hash-chain records (audit/hash_chain.h) of every file an artifact consists of.
void add_inputs(ojson& inputs, const std::string& role, const Artifact& a, const std::string& relative_to) {
  for (const auto& f : a.files) {
    ojson r{{"role", role}};
    r.update(input_record_json(input_record(f, relative_to)));
    inputs.push_back(std::move(r));
  }
}

}  // namespace

ojson comparison_json(const Comparison& c, const Artifact& a, const Artifact& b, const CompareOptions& opts,
                      const std::string& inputs_relative_to) {
  ojson j;
  j["kind"] = "atlas.compare";
  j["format_version"] = 1;
  j["provenance"] = build_provenance();
  j["compared"] = {{"a", {{"path", a.path}, {"kind", a.kind}}}, {"b", {{"path", b.path}, {"kind", b.kind}}}};
  j["inputs"] = ojson::array();
  add_inputs(j["inputs"], "a", a, inputs_relative_to);
  add_inputs(j["inputs"], "b", b, inputs_relative_to);
  j["options"] = {{"ignore", opts.ignore}, {"strict", opts.strict}, {"subset", opts.subset}};
  j["coverage"] = {{"cell_noun", c.cell_noun}, {"a", c.cells_a},           {"b", c.cells_b},
                   {"shared", c.shared},       {"only_a", c.only_a},       {"only_b", c.only_b},
                   {"order_differs", c.order_differs}};
  ojson fams = ojson::array();
  for (const auto& f : c.families)
    fams.push_back({{"family", f.family}, {"exact", f.exact}, {"total", f.total}, {"counted", f.counted}});
  j["families"] = fams;
  j["not_compared"] = c.not_compared;
  ojson diffs = ojson::array();
  for (const auto& d : c.differences) {
    ojson x{{"cell", d.cell}, {"field", d.field}, {"family", d.family}, {"a", d.a}, {"b", d.b}};
    if (!d.detail.empty()) x["detail"] = d.detail;
    x["counted"] = d.counted;
    diffs.push_back(std::move(x));
  }
  j["differences"] = diffs;
  j["counted_differences"] = c.counted_differences();
  j["identical"] = c.identical();
  return j;
}

}  // namespace atlas::audit
