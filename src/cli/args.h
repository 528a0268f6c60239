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

#include <optional>

#include "text/tokenizer.h"

namespace atlas::cli {
// The model directory's tokenizer, if it has tokenizer.json (commands that take token ids work
// without one; text fields are then left out).
std::optional<Tokenizer> tokenizer_if_present(const std::string& model_dir);
}  // namespace atlas::cli
