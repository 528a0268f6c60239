// Small parsers shared by CLI verbs.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace atlas::cli {

// "5,17,42" -> ids; a bad entry is an error naming the flag and the entry.
std::vector<int32_t> parse_id_list(const std::string& flag, const std::string& text);

// Sets the OpenMP thread count when n > 0 (results never depend on it).
void set_threads(int n);

}  // namespace atlas::cli
