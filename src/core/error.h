// Errors: one exception type whose message names the file and the field at fault.
//
// Every user-facing failure (bad checkpoint, bad JSON, bad flag) is an atlas::Error. The CLI
// prints its what() as a single line and exits non-zero; nothing else catches it.
#pragma once

#include <stdexcept>
#include <string>
#include <string_view>

namespace atlas {

class Error : public std::runtime_error {
 public:
  explicit Error(std::string message) : std::runtime_error(std::move(message)) {}
};

// "FILE: FIELD: what" (either part may be empty and is then left out).
[[noreturn]] void fail(std::string_view file, std::string_view field, std::string_view what);
[[noreturn]] inline void fail(std::string_view what) { fail({}, {}, what); }

// Throws unless cond holds; for internal invariants that user input can break.
inline void check(bool cond, std::string_view file, std::string_view field, std::string_view what) {
  if (!cond) fail(file, field, what);
}

}  // namespace atlas
