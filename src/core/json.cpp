#include "core/json.h"

#include "core/file.h"

namespace atlas {

json parse_json(const std::string& text, const std::string& file) {
  try {
    return json::parse(text);
  } catch (const json::exception& e) {  // parse_error, and out_of_range for a number like 1e999
    // what() is "[json.exception.parse_error.101] parse error at line 2, column 1: syntax error
    // ...": the library's tag and "parse error at" say nothing the caller's "malformed JSON" does not.
    std::string what = e.what();
    if (what.rfind("[json.exception.", 0) == 0)
      if (const size_t p = what.find("] "); p != std::string::npos) what.erase(0, p + 2);
    if (what.rfind("parse error at ", 0) == 0) what.erase(0, 15);
    fail(file, {}, "malformed JSON: " + what);
  }
}

json read_json_file(const std::string& path) { return parse_json(read_file(path), path); }

}  // namespace atlas
