// Small parsers shared by CLI verbs.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/json.h"

namespace atlas::cli {

// "5,17,42" -> ids; a bad entry is an error naming the flag and the entry.
std::vector<int32_t> parse_id_list(const std::string& flag, const std::string& text);

// The "ids" field of a JSONL line (WHERE is FILE:LINE): an array of integers in 0..INT32_MAX,
// else an error naming WHERE and "ids" (never a silent wrap or truncation).
std::vector<int32_t> ids_from_json(const json& ids, const std::string& where);

// An output file named by FLAG must be creatable: its directory exists and PATH is not a
// directory. Checked before any work, so a command with two outputs never writes the first and
// then fails on the second.
void check_output_file(const std::string& flag, const std::string& path);

// Sets the OpenMP thread count when n > 0 (results never depend on it); n < 0 is an error
// naming --threads.
void set_threads(int n);

}  // namespace atlas::cli

#include <optional>

#include "text/tokenizer.h"

namespace atlas::cli {
// The model directory's tokenizer, if it has tokenizer.json (commands that take token ids work
// without one; text fields are then left out).
std::optional<Tokenizer> tokenizer_if_present(const std::string& model_dir);
}  // namespace atlas::cli
