// When a generated row stops: EOS, the max_new_tokens cap, or a stop string.
//
// The caller feeds each generated token and the decoded text of ALL tokens generated so far
// (not the prompt). The text may change behind its end between calls (a byte-level token can
// complete a character that decoded as U+FFFD before), so the checker rescans from the first
// byte that differs from the previous call, backed up by the longest stop string minus one, so
// a stop string that straddles tokens is still found. A stop string fires at the first step
// whose decoded text contains it anywhere (like transformers' StopStringCriteria, which also
// matches strings that end inside the last token).
//
// Precedence when several fire at the same step: eos, then stop_string, then length (a natural
// stop is reported over the cap). The EOS token itself is part of the generated ids; whether
// it counts towards a length is the caller's convention (docs/decoding.md).
//
//   StopChecker stop({.eos_ids = {100001}, .max_new_tokens = 512, .stop_strings = {"\n\n"}});
//   for (...) { ids.push_back(tok); text = decode(ids);
//               if (stop.update(tok, text) != StopReason::None) break; }
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace atlas::decode {

enum class StopReason { None, Eos, Length, StopString };
std::string_view stop_reason_name(StopReason r);  // "" | "eos" | "length" | "stop_string"

struct StopCriteria {
  std::vector<int64_t> eos_ids{};           // any of these ends the row (may be empty)
  int64_t max_new_tokens = 0;               // > 0
  std::vector<std::string> stop_strings{};  // non-empty strings, matched on the decoded text
};

// Throws atlas::Error naming the field (max_new_tokens <= 0, an empty stop string).
void validate(const StopCriteria& c);

struct StopMatch {
  size_t string_index = 0;  // which entry of stop_strings
  size_t offset = 0;        // byte offset of the match in the decoded text
};

class StopChecker {
 public:
  explicit StopChecker(StopCriteria criteria);  // validates

  // Call once per generated token, after appending it; returns the reason if this token ends
  // the row. Calling again after a stop is an error.
  StopReason update(int64_t token, std::string_view decoded_text);

  int64_t n_new() const { return n_new_; }
  StopReason reason() const { return reason_; }
  // The earliest stop-string occurrence when reason() == StopString.
  const std::optional<StopMatch>& match() const { return match_; }

 private:
  StopCriteria c_;
  size_t longest_ = 0;
  int64_t n_new_ = 0;
  std::string prev_text_;
  StopReason reason_ = StopReason::None;
  std::optional<StopMatch> match_;
};

}  // namespace atlas::decode
