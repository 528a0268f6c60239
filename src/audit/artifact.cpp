#include "audit/artifact.h"

#include <map>

#include "core/file.h"

namespace atlas::audit {

// Defined in kinds.cpp: one adapter per artifact kind. An explicit list rather than static
// self-registration, because the linker drops unreferenced objects of a static library.
const std::vector<KindAdapter>& all_adapters();

std::vector<std::string> known_kinds() {
  std::vector<std::string> k;
  for (const auto& a : all_adapters()) k.push_back(a.kind);
  return k;
}

const KindAdapter& adapter_for(const std::string& kind, const std::string& file) {
  for (const auto& a : all_adapters())
    if (a.kind == kind) return a;
  std::string known;
  for (const auto& k : known_kinds()) known += (known.empty() ? "" : ", ") + k;
  fail(file, "kind", "\"" + kind + "\" is not a kind atlas can compare (known: " + known + ")");
}

bool field_is(const std::string& field, const std::string& name) {
  if (field.size() < name.size() || field.compare(0, name.size(), name) != 0) return false;
  return field.size() == name.size() || field[name.size()] == '.' || field[name.size()] == '[';
}

void add_cell(Artifact& a, Cell c) {
  if (auto it = a.cell_index.find(c.id); it != a.cell_index.end())
    fail(c.where, "id", "duplicate id \"" + c.id + "\" (first at " + a.cells[it->second].where + ")");
  a.cell_index.emplace(c.id, a.cells.size());
  a.cells.push_back(std::move(c));
}

std::vector<std::pair<json, std::string>> read_jsonl(const std::string& path) {
  const std::string text = read_file(path);
  std::vector<std::pair<json, std::string>> out;
  size_t pos = 0;
  for (int64_t lineno = 1; pos < text.size(); ++lineno) {
    const size_t nl = text.find('\n', pos);
    const std::string where = path + ":" + std::to_string(lineno);
    if (nl == std::string::npos) fail(where, {}, "truncated: the last line has no newline");
    const std::string line = text.substr(pos, nl - pos);
    pos = nl + 1;
    if (line.find_first_not_of(" \t\r") == std::string::npos) fail(where, {}, "empty line");
    json j = parse_json(line, where);
    if (!j.is_object()) fail(where, {}, "expected a JSON object");
    out.emplace_back(std::move(j), where);
  }
  return out;
}

namespace {

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

std::string kind_of(const json& doc, const std::string& file) {
  if (!doc.is_object()) fail(file, {}, "expected a JSON object (an atlas artifact)");
  // analysis.json written before it carried "kind" names its format only.
  if (!doc.contains("kind") && doc.contains("format") && doc["format"] == "atlas-analysis-v1") return "atlas.analysis";
  if (!doc.contains("kind")) fail(file, "kind", "missing: not an atlas artifact");
  if (!doc["kind"].is_string()) fail(file, "kind", "expected a string, got " + doc["kind"].dump());
  return doc["kind"].get<std::string>();
}

}  // namespace

Artifact load_artifact(const std::string& path) {
  static const std::string kMeta = ".meta.json";
  std::string rows_path, doc_path;
  if (ends_with(path, kMeta) && file_exists(path.substr(0, path.size() - kMeta.size()))) {
    rows_path = path.substr(0, path.size() - kMeta.size());  // named the sidecar itself
    doc_path = path;
  } else if (file_exists(path + kMeta)) {
    rows_path = path;
    doc_path = path + kMeta;
  } else if (ends_with(path, ".jsonl")) {
    if (!file_exists(path)) fail(path, {}, "cannot open");
    fail(path, {}, "no sidecar " + path + kMeta + " (a JSONL artifact's kind is named by its sidecar)");
  } else {
    doc_path = path;
  }
  json doc = read_json_file(doc_path);
  const std::string kind = kind_of(doc, doc_path);
  const KindAdapter& k = adapter_for(kind, doc_path);
  Artifact a = k.load(doc_path, std::move(doc), rows_path);
  a.path = path;
  a.kind = kind;
  return a;
}

}  // namespace atlas::audit
