// Hash-chain links: "this artifact was made from these files, with these SHA-256s".
//
// Every artifact that reads other artifacts records them as input records
// {"path", "sha256"[, "bytes"]} (atlas compare writes them under "inputs"). Verifying a link
// re-hashes the file now on disk; `atlas audit DIR` (issue 9) walks such links from the
// analysis back to the manifest.
//
//   auto recs = parse_input_records(doc["inputs"], "cmp.json", "inputs");
//   for (const auto& c : verify_inputs(recs, "runs/")) if (c.status != LinkStatus::Ok) ...
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "core/json.h"

namespace atlas::audit {

struct InputRecord {
  std::string path;               // as recorded (relative paths resolve against a base directory)
  std::string sha256;             // 64 lowercase hex digits
  std::optional<int64_t> bytes;   // optional size pin (a cheap first check)
};

enum class LinkStatus { Ok, Missing, SizeMismatch, HashMismatch };

struct LinkCheck {
  InputRecord record;
  std::string resolved;       // the file actually checked
  std::string actual_sha256;  // empty when missing
  int64_t actual_bytes = -1;  // -1 when missing
  LinkStatus status = LinkStatus::Ok;
};

// The record for a file as it is now. With relative_to, the recorded path is relative to that
// directory (an artifact records its inputs relative to its own directory, so a directory of
// artifacts can move as a whole).
InputRecord input_record(const std::string& path, const std::string& relative_to = {});
ojson input_record_json(const InputRecord& r);

// Reads an array of records; a malformed entry is an error naming FILE and FIELD[i].field.
std::vector<InputRecord> parse_input_records(const json& array, const std::string& file, const std::string& field);

// Re-hashes each record's file (relative paths against base_dir; "" = the working directory).
// Never throws for a missing or changed file: that is the check's result.
std::vector<LinkCheck> verify_inputs(const std::vector<InputRecord>& records, const std::string& base_dir = {});

bool all_ok(const std::vector<LinkCheck>& checks);

// Follows the links from an artifact: its "inputs" records (resolved against its directory) are
// verified, and every input that is itself a JSON artifact with "inputs" is followed in turn
// (each file once, so a cycle ends). A changed input is still followed when it parses, to
// report what lies behind it; one that does not parse is a leaf.
struct ChainLink {
  std::string from;  // the artifact that records the link
  LinkCheck check;
};
std::vector<ChainLink> walk_chain(const std::string& artifact_path);
std::string describe(const LinkCheck& c);  // one line: "ok PATH" or what is wrong

}  // namespace atlas::audit
