#include "audit/hash_chain.h"

#include <algorithm>
#include <filesystem>
#include <optional>
#include <set>

#include "core/error.h"
#include "core/file.h"
#include "core/sha256.h"

namespace atlas::audit {
namespace fs = std::filesystem;

InputRecord input_record(const std::string& path, const std::string& relative_to) {
  if (!fs::is_regular_file(path)) fail(path, {}, "cannot open (not a regular file)");
  std::string recorded = path;
  if (!relative_to.empty())
    recorded = path_relative_to(path, relative_to);
  return {.path = recorded, .sha256 = sha256_file(path), .bytes = int64_t(fs::file_size(path))};
}

ojson input_record_json(const InputRecord& r) {
  ojson j{{"path", r.path}, {"sha256", r.sha256}};
  if (r.bytes) j["bytes"] = *r.bytes;
  return j;
}

namespace {
bool is_sha256_hex(const std::string& s) {
  return s.size() == 64 &&
         std::all_of(s.begin(), s.end(), [](char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'); });
}
}  // namespace

std::vector<InputRecord> parse_input_records(const json& array, const std::string& file, const std::string& field) {
  if (!array.is_array()) fail(file, field, "expected an array of {\"path\", \"sha256\"} records");
  std::vector<InputRecord> out;
  for (size_t i = 0; i < array.size(); ++i) {
    const std::string prefix = field + "[" + std::to_string(i) + "]";
    JsonReader r(array[i], file, prefix);
    if (!array[i].is_object()) fail(file, prefix, "expected an object");
    InputRecord rec{.path = r.get<std::string>("path"), .sha256 = r.get<std::string>("sha256"),
                    .bytes = r.get_optional<int64_t>("bytes")};
    if (rec.path.empty()) fail(file, prefix + ".path", "empty");
    if (!is_sha256_hex(rec.sha256)) fail(file, prefix + ".sha256", "expected 64 lowercase hex digits, got \"" + rec.sha256 + "\"");
    if (rec.bytes && *rec.bytes < 0) fail(file, prefix + ".bytes", "negative");
    out.push_back(std::move(rec));
  }
  return out;
}

std::vector<LinkCheck> verify_inputs(const std::vector<InputRecord>& records, const std::string& base_dir) {
  std::vector<LinkCheck> out;
  for (const auto& rec : records) {
    LinkCheck c;
    c.record = rec;
    c.resolved = base_dir.empty() ? rec.path : path_from(base_dir, rec.path);
    std::error_code ec;
    if (!fs::is_regular_file(c.resolved, ec)) {
      c.status = LinkStatus::Missing;
    } else {
      c.actual_bytes = int64_t(fs::file_size(c.resolved, ec));
      c.actual_sha256 = sha256_file(c.resolved);
      if (rec.bytes && *rec.bytes != c.actual_bytes)
        c.status = LinkStatus::SizeMismatch;
      else if (c.actual_sha256 != rec.sha256)
        c.status = LinkStatus::HashMismatch;
    }
    out.push_back(std::move(c));
  }
  return out;
}

bool all_ok(const std::vector<LinkCheck>& checks) {
  return std::all_of(checks.begin(), checks.end(), [](const LinkCheck& c) { return c.status == LinkStatus::Ok; });
}

namespace {

// The "inputs" records of a JSON artifact, or nothing when the file is not one.
std::optional<std::vector<InputRecord>> inputs_of(const std::string& path) {
  std::error_code ec;
  if (!fs::is_regular_file(path, ec)) return std::nullopt;
  json doc;
  try {
    doc = json::parse(read_file(path));
  } catch (const json::exception&) {
    return std::nullopt;  // not JSON (a JSONL file, a tensor dump): a leaf
  }
  if (!doc.is_object() || !doc.contains("inputs")) return std::nullopt;
  return parse_input_records(doc["inputs"], path, "inputs");
}

}  // namespace

std::vector<ChainLink> walk_chain(const std::string& artifact_path) {
  std::vector<ChainLink> out;
  std::set<std::string> seen;
  std::vector<std::string> todo = {artifact_path};
  if (!fs::is_regular_file(artifact_path)) fail(artifact_path, {}, "cannot open");
  while (!todo.empty()) {
    const std::string path = todo.front();
    todo.erase(todo.begin());
    if (!seen.insert(fs::absolute(path).lexically_normal().string()).second) continue;
    const auto recs = inputs_of(path);
    if (!recs) continue;
    for (auto& c : verify_inputs(*recs, fs::path(path).parent_path().string())) {
      if (c.status != LinkStatus::Missing) todo.push_back(c.resolved);
      out.push_back({.from = path, .check = std::move(c)});
    }
  }
  return out;
}

std::string describe(const LinkCheck& c) {
  switch (c.status) {
    case LinkStatus::Ok: return "ok " + c.resolved + " sha256 " + c.actual_sha256;
    case LinkStatus::Missing: return "MISSING " + c.resolved + " (recorded sha256 " + c.record.sha256 + ")";
    case LinkStatus::SizeMismatch:
      return "CHANGED " + c.resolved + ": " + std::to_string(c.actual_bytes) + " bytes, recorded " +
             std::to_string(*c.record.bytes);
    case LinkStatus::HashMismatch:
      return "CHANGED " + c.resolved + ": sha256 " + c.actual_sha256 + ", recorded " + c.record.sha256;
  }
  return {};
}

}  // namespace atlas::audit
