// The comparison engine: field-by-field comparison of two artifacts of one kind.
//
// Cells are aligned by id; the cells both artifacts hold are compared field by field (leaves of
// the JSON; arrays of scalars such as token ids are one field), each field counted in its
// family (the adapter's classify()). "runtime" never takes part. See docs/audit.md.
//
//   Comparison c = compare(load_artifact(a), load_artifact(b), {.ignore = {"text"}});
//   if (!c.identical()) ...
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "audit/artifact.h"

namespace atlas::audit {

struct CompareOptions {
  std::vector<std::string> ignore = {};  // field paths (dotted, as in the differences), with their subfields
  bool strict = false;              // informational fields (provenance) count as differences
  bool subset = false;              // A is a subset rerun of B: cells only in B do not count
};

struct FamilyCount {
  std::string family;
  int64_t exact = 0, total = 0;
  bool counted = true;  // false: reported only (provenance without --strict)
};

struct Difference {
  std::string cell;    // cell id (kTopId for top-level fields)
  std::string field;   // dotted path inside the cell
  std::string family;
  std::string a, b;    // the values as JSON ("(absent)" when missing), shortened when long
  std::string detail;  // for equal-length arrays: where the first element differs and how many do
  bool counted = true;
};

struct Comparison {
  std::string kind, cell_noun;
  int64_t cells_a = 0, cells_b = 0, shared = 0;
  std::vector<std::string> only_a, only_b;  // cell ids, artifact order
  bool order_differs = false;               // shared cells appear in another relative order
  bool subset = false;
  std::vector<FamilyCount> families;        // adapter order, then any other family
  std::vector<Difference> differences;      // artifact order: top level, then cells
  std::vector<std::string> not_compared;    // aggregate fields skipped because the cell sets differ
  std::vector<std::string> unused_ignores;  // --ignore patterns that matched no field

  int64_t counted_differences() const;
  bool identical() const;  // nothing counted differs and the coverage is what was asked for
};

// Kinds must match (different kinds are an error naming both files).
Comparison compare(const Artifact& a, const Artifact& b, const CompareOptions& opts = {});

// Human summary (what `atlas compare` prints); max_diffs bounds the listed differences.
std::string format_comparison(const Comparison& c, const Artifact& a, const Artifact& b, int64_t max_diffs);

// The comparison as an artifact ("kind": "atlas.compare"), naming its inputs by SHA-256 (hash-chain
// records, paths relative to inputs_relative_to when given: the directory the JSON goes to).
ojson comparison_json(const Comparison& c, const Artifact& a, const Artifact& b, const CompareOptions& opts,
                      const std::string& inputs_relative_to = {});

}  // namespace atlas::audit
