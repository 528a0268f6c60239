#include "core/json.h"

#include "core/file.h"

namespace atlas {

json parse_json(const std::string& text, const std::string& file) {
  try {
    return json::parse(text);
  } catch (const json::exception& e) {  // parse_error, and out_of_range for a number like 1e999
    fail(file, {}, std::string("malformed JSON: ") + e.what());
  }
}

json read_json_file(const std::string& path) { return parse_json(read_file(path), path); }

}  // namespace atlas
