// JSON Lines input for the evaluators: plain or gzip-compressed files, one object per line,
// errors that name the file and the line.
#pragma once

#include <string>
#include <vector>

#include "core/json.h"

namespace atlas::eval {

// The whole file, gunzipped when it is gzip (zlib reads plain files unchanged). A missing or
// truncated file is an atlas::Error naming the path.
std::string read_maybe_gz(const std::string& path);

struct JsonLine {
  size_t line = 0;  // 1-based line number in the file
  json value;       // always an object
};

// Non-empty lines; each must be a JSON object ("FILE: line N: ..." otherwise).
std::vector<JsonLine> read_jsonl(const std::string& path);

// "line N" for error fields.
inline std::string line_field(size_t line, const std::string& field = {}) {
  return "line " + std::to_string(line) + (field.empty() ? "" : ": " + field);
}

}  // namespace atlas::eval
