// The per-kind adapters: how each artifact kind splits into top-level fields and cells, and
// which family each field belongs to. Adding a kind (probe run, evaluation, analysis) means
// adding one adapter to all_adapters() below; the engine needs nothing else.
#include <map>
#include <optional>

#include "audit/artifact.h"

namespace atlas::audit {
namespace {

// Families shared by every kind, in summary order.
const char* const kPromptHashes = "prompt hashes";
const char* const kTokenIds = "token ids";
const char* const kTexts = "texts";
const char* const kStopStates = "stop states";
const char* const kRngHashes = "RNG hashes";
const char* const kHiddenHashes = "hidden hashes";
const char* const kRouteHashes = "route hashes";
const char* const kStatistics = "derived statistics";
const char* const kIdentity = "identity fields";
const char* const kSettings = "settings";
const char* const kAggregates = "aggregates";
const char* const kProvenance = "provenance";
const char* const kInputs = "input files";
const char* const kVerdicts = "verdicts";
const char* const kLedgers = "ledgers";
const char* const kIntervals = "intervals";

bool one_of(const std::string& field, std::initializer_list<const char*> names) {
  for (const char* n : names)
    if (field_is(field, n)) return true;
  return false;
}

// Top-level rules every kind shares: provenance is reported, runtime never reaches here.
std::optional<FieldClass> common_top(const std::string& field) {
  if (field_is(field, "provenance")) return FieldClass{kProvenance, Role::Informational};
  // Input records pin other files by path and SHA-256; a rerun's inputs differ in their runtime
  // sections (hence file hashes) and locations, so they are reported like provenance. The
  // inputs' identities that matter are compared elsewhere (manifest_sha256, run.content_sha256).
  if (field_is(field, "inputs")) return FieldClass{kInputs, Role::Informational};
  return std::nullopt;
}

// ---- atlas.trace: cells are the hidden stages, the gates and the logits summary ------------

Artifact load_trace(const std::string& file, json doc, const std::string& rows_path) {
  if (!rows_path.empty()) fail(file, "kind", "atlas.trace is a single JSON file, not a JSONL sidecar");
  Artifact a;
  a.files = {file};
  doc.erase("runtime");
  for (const char* key : {"stages", "gates"}) {
    if (!doc.contains(key)) fail(file, key, "missing");
    if (!doc[key].is_array()) fail(file, key, "expected an array");
  }
  const json& stages = doc["stages"];
  for (size_t i = 0; i < stages.size(); ++i) {
    const std::string field = "stages[" + std::to_string(i) + "]";
    const json& s = stages[i];
    if (!s.is_object() || !s.contains("name") || !s["name"].is_string())
      fail(file, field + ".name", "expected a stage object with a string name");
    add_cell(a, {.id = s["name"].get<std::string>(), .group = "stage", .where = file + ": " + field, .value = s});
  }
  const json& gates = doc["gates"];
  for (size_t i = 0; i < gates.size(); ++i) {
    const std::string field = "gates[" + std::to_string(i) + "]";
    const json& g = gates[i];
    if (!g.is_object() || !g.contains("layer") || !g["layer"].is_number_integer())
      fail(file, field + ".layer", "expected a gate object with an integer layer");
    // Named as the --dump tensors are: router.{layer}.
    add_cell(a, {.id = "router." + std::to_string(g["layer"].get<int64_t>()), .group = "gate",
                 .where = file + ": " + field, .value = g});
  }
  if (doc.contains("logits")) {
    if (!doc["logits"].is_object()) fail(file, "logits", "expected an object");
    add_cell(a, {.id = "logits", .group = "logits", .where = file + ": logits", .value = doc["logits"]});
  }
  doc.erase("stages");
  doc.erase("gates");
  doc.erase("logits");
  a.top = std::move(doc);
  return a;
}

FieldClass classify_trace(const std::string& group, const std::string& f) {
  if (group == kTopGroup) {
    if (auto c = common_top(f)) return *c;
    if (field_is(f, "input.prompt_sha256")) return {kPromptHashes};
    if (field_is(f, "input.ids")) return {kTokenIds};
    if (field_is(f, "input.text")) return {kTexts};
    return {kSettings};
  }
  if (one_of(f, {"mean", "std", "min", "max", "l2", "load", "weighted_load"})) return {kStatistics};
  if (group == "gate" && one_of(f, {"topk_ids_sha256", "topk_weights_sha256", "logits_sha256"}))
    return {kRouteHashes};
  if (f == "sha256") return {kHiddenHashes};  // hidden stages and the final logits
  return {kIdentity};                         // name, hook, stage, layer, shape, dtype, tokens, k
}

// ---- atlas.generate: JSONL rows keyed by id, kind and settings in the .meta.json sidecar ----

Artifact load_generate(const std::string& file, json meta, const std::string& rows_path) {
  if (rows_path.empty()) fail(file, {}, "generation metadata without its rows file (expected next to it, without .meta.json)");
  Artifact a;
  a.files = {rows_path, file};
  meta.erase("runtime");
  for (auto& [row, where] : read_jsonl(rows_path)) {
    if (!row.contains("id")) fail(where, "id", "missing");
    std::string id;
    if (row["id"].is_string())
      id = row["id"].get<std::string>();
    else if (row["id"].is_number_integer())
      id = std::to_string(row["id"].get<int64_t>());
    else
      fail(where, "id", "expected a string or integer");
    add_cell(a, {.id = id, .group = "row", .where = where, .value = std::move(row)});
  }
  // The sidecar is written after the rows: a row count that disagrees means a cut-off or
  // mismatched file.
  if (meta.contains("rows")) {
    if (!meta["rows"].is_number_integer()) fail(file, "rows", "expected an integer");
    const int64_t want = meta["rows"].get<int64_t>();
    if (want != int64_t(a.cells.size()))
      fail(rows_path, {}, std::to_string(a.cells.size()) + " rows, but " + file + " says " + std::to_string(want) +
                              " (truncated or mismatched files)");
  }
  a.top = std::move(meta);
  return a;
}

FieldClass classify_generate(const std::string& group, const std::string& f) {
  if (group == kTopGroup) {
    if (auto c = common_top(f)) return *c;
    // Summaries of the whole row set: a subset rerun differs in them by construction.
    if (one_of(f, {"rows", "stops", "prompts_sha256"})) return {kAggregates, Role::Aggregate};
    return {kSettings};
  }
  if (f == "prompt_sha256") return {kPromptHashes};
  if (field_is(f, "ids")) return {kTokenIds};
  if (field_is(f, "text")) return {kTexts};
  if (one_of(f, {"stop", "n_new"})) return {kStopStates};
  if (f == "rng_state_sha256") return {kRngHashes};
  return {kIdentity};
}

// A single-JSON artifact whose "cells" array holds objects keyed by "cell_id" (probe runs,
// evaluations): every cell becomes one compared record, the rest of the document the top level.
Artifact load_cell_document(const std::string& file, json doc, const std::string& rows_path, const std::string& kind) {
  if (!rows_path.empty()) fail(file, "kind", kind + " is a single JSON file, not a JSONL sidecar");
  Artifact a;
  a.files = {file};
  doc.erase("runtime");
  if (!doc.contains("cells") || !doc["cells"].is_array()) fail(file, "cells", "missing or not an array");
  const json& cells = doc["cells"];
  for (size_t i = 0; i < cells.size(); ++i) {
    const std::string field = "cells[" + std::to_string(i) + "]";
    const json& c = cells[i];
    if (!c.is_object() || !c.contains("cell_id") || !c["cell_id"].is_string())
      fail(file, field + ".cell_id", "expected a cell object with a string cell_id");
    add_cell(a, {.id = c["cell_id"].get<std::string>(), .group = "cell", .where = file + ": " + field, .value = c});
  }
  doc.erase("cells");
  a.top = std::move(doc);
  return a;
}

// ---- atlas.probe.run (issue 6): cells keyed by cell_id (source x condition) -------------------
// Written from src/probe/run.cpp's format (format_version 1): top-level manifest/protocol/model
// fields, "cells" of manifest header fields plus a "result" (trace: stages and gates hashes;
// generate: generated ids, text, stop, RNG hash).

Artifact load_probe_run(const std::string& file, json doc, const std::string& rows_path) {
  return load_cell_document(file, std::move(doc), rows_path, "atlas.probe.run");
}

FieldClass classify_probe_run(const std::string& group, const std::string& f) {
  if (group == kTopGroup) {
    if (auto c = common_top(f)) return *c;
    // The manifest (hence its hash), the shard and the content hash describe the whole cell
    // set: a pre-registered subset rerun has its own.
    if (one_of(f, {"manifest_sha256", "content_sha256", "shard"})) return {kAggregates, Role::Aggregate};
    return {kSettings};
  }
  // Positions in the whole run (manifest index, batch number) change with the cell set.
  if (one_of(f, {"index", "batch"})) return {kAggregates, Role::Aggregate};
  if (one_of(f, {"prompt_sha256", "target_ids_sha256"})) return {kPromptHashes};
  if (one_of(f, {"input_ids", "result.generated_ids", "result.generated_ids_sha256"})) return {kTokenIds};
  if (field_is(f, "result.text")) return {kTexts};
  if (one_of(f, {"result.stop", "result.n_new"})) return {kStopStates};
  if (field_is(f, "result.rng_state_sha256")) return {kRngHashes};
  if (field_is(f, "result.stages")) {
    if (f.ends_with("_sha256")) return {kHiddenHashes};
    return {kIdentity};
  }
  if (field_is(f, "result.gates")) {
    if (f.ends_with("_sha256")) return {kRouteHashes};
    return {kIdentity};
  }
  if (field_is(f, "result.routes")) return {kRouteHashes};  // raw top-k ids and weights per token
  return {kIdentity};
}


// ---- atlas.eval (`atlas eval`, EVAL.json): cells keyed by cell_id ----------------------------

Artifact load_eval(const std::string& file, json doc, const std::string& rows_path) {
  if (!doc.contains("ledgers") || !doc["ledgers"].is_object()) fail(file, "ledgers", "missing or not an object");
  return load_cell_document(file, std::move(doc), rows_path, "atlas.eval");
}

FieldClass classify_eval(const std::string& group, const std::string& f) {
  if (group == kTopGroup) {
    if (auto c = common_top(f)) return *c;
    // Ledgers count the whole cell set; "run" names the run's manifest and content hashes.
    if (field_is(f, "ledgers")) return {kLedgers, Role::Aggregate};
    if (one_of(f, {"run", "content_sha256"})) return {kAggregates, Role::Aggregate};
    return {kSettings};
  }
  if (f == "index") return {kAggregates, Role::Aggregate};
  if (f == "text_sha256") return {kTexts};
  if (f == "stop") return {kStopStates};
  if (one_of(f, {"evaluator", "terminal", "coverage", "correctness", "gsm8k", "humaneval"})) return {kVerdicts};
  return {kIdentity};  // cell_id, source_key, source_id, domain, condition, seed
}

// ---- atlas.analysis (`atlas analyze`, analysis.json): one cell per reported statistic ---------
// Every array of objects inside a top-level section (routing.stats, routing.loads, hidden.stats,
// outputs.ledgers, tasks.source_blocked, ...) holds records; a record's id is the array's path
// and its coordinates (metric, layer, stage, domain, scope, kind, aggregation, condition, edge,
// factorial, variable), so the same statistic is found in the other analysis whatever the order.

const char* const kCoordinates[] = {"metric", "layer", "stage", "domain", "scope", "kind", "aggregation",
                                    "condition", "edge", "factorial", "variable"};

bool is_coordinate(const std::string& group, const std::string& key) {
  if (group == "hidden.min_cosine_stage" && key == "stage") return false;  // the result there
  for (const char* c : kCoordinates)
    if (key == c) return true;
  return false;
}

Artifact load_analysis(const std::string& file, json doc, const std::string& rows_path) {
  if (!rows_path.empty()) fail(file, "kind", "atlas.analysis is a single JSON file, not a JSONL sidecar");
  Artifact a;
  a.files = {file};
  doc.erase("runtime");
  if (!doc.contains("counts") || !doc["counts"].is_object()) fail(file, "counts", "missing or not an object");
  for (auto& [section, v] : doc.items()) {
    if (!v.is_object() || section == "settings" || section == "definitions" || section == "provenance" || section == "counts") continue;
    std::vector<std::string> moved;
    for (auto& [member, arr] : v.items()) {
      if (!arr.is_array() || arr.empty() || !arr[0].is_object()) continue;
      const std::string group = section + "." + member;
      std::map<std::string, int> seen;
      for (size_t i = 0; i < arr.size(); ++i) {
        const std::string field = group + "[" + std::to_string(i) + "]";
        if (!arr[i].is_object()) fail(file, field, "expected an object (a record)");
        std::string id = group;
        if (arr[i].contains("metric") && arr[i]["metric"].is_string()) id += " " + arr[i]["metric"].get<std::string>();
        for (const auto& [k, x] : arr[i].items())
          if (k != "metric" && is_coordinate(group, k)) id += " " + k + "=" + (x.is_string() ? x.get<std::string>() : x.dump());
        // Records without distinguishing coordinates keep their order as the last resort.
        if (const int n = seen[id]++; n > 0) id += " #" + std::to_string(n + 1);
        add_cell(a, {.id = id, .group = group, .where = file + ": " + field, .value = arr[i]});
      }
      moved.push_back(member);
    }
    for (const auto& m : moved) v.erase(m);
  }
  a.top = std::move(doc);
  return a;
}

FieldClass classify_analysis(const std::string& group, const std::string& f) {
  if (group == kTopGroup) {
    if (auto c = common_top(f)) return *c;
    if (one_of(f, {"manifest_sha256", "content_sha256", "counts", "routing.route_decisions",
                   "routing.target_route_decisions"}))
      return {kAggregates};
    return {kSettings};  // kind, format, settings, definitions, layers, stages, experts, top_k
  }
  const std::string key = f.substr(0, f.find_first_of(".["));
  if (is_coordinate(group, key)) return {kIdentity};
  if (key == "ci") return {kIntervals};
  if (group == "outputs.ledgers" && key == "stopping") return {kStopStates};
  return {kStatistics};  // value, loads, counts behind a rate, ledgers, per-source contrasts
}

}  // namespace

const std::vector<KindAdapter>& all_adapters() {
  static const std::vector<KindAdapter> adapters = {
      {.kind = "atlas.trace",
       .cell_noun = "cell",
       .families = {kPromptHashes, kTokenIds, kTexts, kHiddenHashes, kRouteHashes, kStatistics, kIdentity, kSettings,
                    kProvenance},
       .load = load_trace,
       .classify = classify_trace},
      {.kind = "atlas.generate",
       .cell_noun = "row",
       .families = {kPromptHashes, kTokenIds, kTexts, kStopStates, kRngHashes, kIdentity, kSettings, kAggregates,
                    kProvenance},
       .load = load_generate,
       .classify = classify_generate},
      {.kind = "atlas.probe.run",
       .cell_noun = "cell",
       .families = {kPromptHashes, kTokenIds, kTexts, kStopStates, kRngHashes, kHiddenHashes, kRouteHashes,
                    kIdentity, kSettings, kAggregates, kInputs, kProvenance},
       .load = load_probe_run,
       .classify = classify_probe_run},
      {.kind = "atlas.eval",
       .cell_noun = "cell",
       .families = {kTexts, kStopStates, kVerdicts, kIdentity, kSettings, kLedgers, kAggregates, kInputs, kProvenance},
       .load = load_eval,
       .classify = classify_eval},
      {.kind = "atlas.analysis",
       .cell_noun = "record",
       .families = {kStatistics, kIntervals, kStopStates, kIdentity, kSettings, kAggregates, kInputs, kProvenance},
       .load = load_analysis,
       .classify = classify_analysis},
  };
  return adapters;
}

}  // namespace atlas::audit
