#include "decode/stop.h"

#include <algorithm>

#include "core/error.h"

namespace atlas::decode {

std::string_view stop_reason_name(StopReason r) {
  switch (r) {
    case StopReason::None: return "";
    case StopReason::Eos: return "eos";
    case StopReason::Length: return "length";
    case StopReason::StopString: return "stop_string";
  }
  return "";
}

void validate(const StopCriteria& c) {
  if (c.max_new_tokens <= 0)
    fail({}, "max_new_tokens", "must be > 0, got " + std::to_string(c.max_new_tokens));
  for (size_t i = 0; i < c.stop_strings.size(); ++i)
    if (c.stop_strings[i].empty()) fail({}, "stop_strings[" + std::to_string(i) + "]", "empty stop string");
}

StopChecker::StopChecker(StopCriteria criteria) : c_(std::move(criteria)) {
  validate(c_);
  for (const auto& s : c_.stop_strings) longest_ = std::max(longest_, s.size());
}

StopReason StopChecker::update(int64_t token, std::string_view text) {
  check(reason_ == StopReason::None, {}, "stop", "update() after the row already stopped");
  ++n_new_;
  if (std::find(c_.eos_ids.begin(), c_.eos_ids.end(), token) != c_.eos_ids.end())
    return reason_ = StopReason::Eos;

  if (!c_.stop_strings.empty()) {
    // Everything before `same` was scanned last time and is unchanged; a new match must end
    // at or after it, so it starts at or after same - (longest - 1).
    const size_t same =
        size_t(std::mismatch(prev_text_.begin(), prev_text_.end(), text.begin(), text.end()).first -
               prev_text_.begin());
    const size_t from = same >= longest_ - 1 ? same - (longest_ - 1) : 0;
    for (size_t i = 0; i < c_.stop_strings.size(); ++i) {
      const size_t at = text.find(c_.stop_strings[i], from);
      if (at != std::string_view::npos && (!match_ || at < match_->offset))
        match_ = StopMatch{.string_index = i, .offset = at};
    }
    prev_text_.assign(text);
    if (match_) return reason_ = StopReason::StopString;
  }
  if (n_new_ >= c_.max_new_tokens) return reason_ = StopReason::Length;
  return StopReason::None;
}

}  // namespace atlas::decode
