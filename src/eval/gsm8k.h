// GSM8K scoring: the gold number after "####", answer extraction in a fixed order with the
// method recorded, and the strict metrics (docs/eval.md).
//
// Numbers are compared as canonical strings (normalize_number): no thousands separators,
// currency signs or units, no trailing zeros after a decimal point, no final period, no
// leading '+' or leading zeros; a fraction a/b becomes its exact decimal when it has one
// (3/4 -> 0.75), otherwise stays a reduced fraction (2/6 -> 1/3).
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace atlas::eval {

// The canonical form of one number as written ("$1,234.50" -> "1234.5", "-3" -> "-3",
// "18." -> "18", "50%" -> "50", "\frac{3}{4}" is not a number here; "3/4" -> "0.75").
// nullopt when the text holds no number, more than one, an operator (+ * / = ^ < >) outside
// the number, or a letter before it (so "x + 1" and "n = 5" are not numbers).
std::optional<std::string> normalize_number(std::string_view text);

// Every number in the text, left to right, as (canonical value, raw span).
struct NumberSpan {
  std::string value;
  size_t begin = 0, end = 0;  // byte offsets of the raw text
};
std::vector<NumberSpan> find_numbers(std::string_view text);

// The gold answer: the number after the last "####". nullopt when there is none.
std::optional<std::string> parse_gold(std::string_view answer);

enum class ExtractMethod { Boxed, Phrase, LastNumber, None };
std::string_view method_name(ExtractMethod m);  // "boxed", "phrase", "last_number", "none"

struct Extraction {
  ExtractMethod method = ExtractMethod::None;
  std::string value;  // canonical number; empty when method is None
  // boxed and phrase are explicit markers; last_number is a diagnostic fallback only.
  bool explicit_marker() const { return method == ExtractMethod::Boxed || method == ExtractMethod::Phrase; }
};

// In order: the last \boxed{...} holding a number; else the last explicit answer phrase
// ("the answer is", "final answer:", "answer:", "####") followed by a number on its line (or
// the next non-empty line); else the last number anywhere (diagnostic).
Extraction extract_answer(std::string_view completion);

struct Gsm8kScore {
  Extraction extraction;
  bool strict_complete = false;  // stopped at EOS and the answer came from an explicit marker
  bool exact = false;            // strict_complete and equal to gold
  bool matches_gold = false;     // the extracted value (any method) equals gold: diagnostic
};

Gsm8kScore score_gsm8k(std::string_view completion, bool stopped_at_eos, const std::string& gold);

}  // namespace atlas::eval
