// Artifacts as the audit engine sees them: a kind, top-level fields, and cells keyed by id.
//
// Every atlas artifact kind reduces to the same shape: a handful of top-level fields (what ran,
// with which settings and provenance) and a collection of cells, each with a stable id (a trace's
// stages and gates, a generation's rows; later a probe run's source x condition cells). A small
// per-kind adapter does that reduction and says which field family each field belongs to; the
// comparison engine (audit/compare.h) is generic over it. See docs/audit.md.
//
//   Artifact a = load_artifact("g.jsonl");        // kind from g.jsonl.meta.json
//   const KindAdapter& k = adapter_for(a.kind, a.path);
#pragma once

#include <functional>
#include <map>
#include <string>
#include <vector>

#include "core/json.h"

namespace atlas::audit {

struct Cell {
  std::string id;     // unique within the artifact: "hidden.3", "router.1", a generation row id
  std::string group;  // the adapter's cell type ("stage", "gate", "logits", "row"): picks field rules
  std::string where;  // "FILE" or "FILE:LINE", for messages
  json value;         // the cell's fields
};

struct Artifact {
  std::string path;                // the file named by the user
  std::vector<std::string> files;  // every file the artifact consists of (JSONL + sidecar), for hashing
  std::string kind;                // "atlas.trace", "atlas.generate", ...
  json top;                        // fields outside the cells, without "runtime"
  std::vector<Cell> cells;         // in artifact order, ids unique
  std::map<std::string, size_t> cell_index;  // id -> position in cells (kept by add_cell)
};

// How a field takes part in a comparison.
enum class Role {
  Result,         // counted: any difference makes the artifacts differ
  Aggregate,      // a summary over all cells (row counts, stop totals): compared only when both
                  // artifacts hold the same cell set, since a subset legitimately differs
  Informational,  // reported but not counted unless --strict (tool version, git commit)
};

struct FieldClass {
  std::string family;
  Role role = Role::Result;
};

// The top-level pseudo-cell's group and id.
inline constexpr const char* kTopGroup = "";
inline constexpr const char* kTopId = "(top level)";

struct KindAdapter {
  std::string kind;
  std::string cell_noun;               // "row", "cell": used in coverage lines
  std::vector<std::string> families;   // print order of the summary
  // Reads the artifact. doc: the parsed JSON (single-file kinds) or the parsed sidecar (JSONL
  // kinds, whose rows are in rows_path; empty for single-file kinds). doc_path names doc's file.
  std::function<Artifact(const std::string& doc_path, json doc, const std::string& rows_path)> load;
  // group: the cell's group (kTopGroup for top-level fields); field: the dotted path inside it.
  std::function<FieldClass(const std::string& group, const std::string& field)> classify;
};

// The adapter for a kind; an unknown kind is an error naming the file and the known kinds.
const KindAdapter& adapter_for(const std::string& kind, const std::string& file);
std::vector<std::string> known_kinds();

// Detects the kind and loads. A JSON artifact names its kind in "kind"; a JSONL artifact has a
// sidecar PATH.meta.json that does (PATH may also name the sidecar itself). Unreadable,
// truncated or malformed files, duplicate cell ids and missing fields are atlas::Errors naming
// the file (and line).
Artifact load_artifact(const std::string& path);

// Reads a JSONL file into (object, "FILE:LINE") pairs. Every line must be a JSON object and the
// file must end with a newline (a missing one means the writer was cut off).
std::vector<std::pair<json, std::string>> read_jsonl(const std::string& path);

// Helpers for adapters.
void add_cell(Artifact& a, Cell c);  // duplicate id -> error naming both places
bool field_is(const std::string& field, const std::string& name);  // name, or below it (name.x, name[i])

}  // namespace atlas::audit
