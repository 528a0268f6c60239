#include "eval/gsm8k.h"

#include <algorithm>
#include <cctype>
#include <numeric>

namespace atlas::eval {
namespace {

bool is_digit(char c) { return c >= '0' && c <= '9'; }
bool is_alnum(char c) { return std::isalnum(static_cast<unsigned char>(c)) != 0; }

// U+2212 MINUS SIGN, which models and LaTeX renderers sometimes produce.
constexpr std::string_view kUnicodeMinus = "\xE2\x88\x92";

std::string strip_leading_zeros(std::string s) {
  size_t i = s.find_first_not_of('0');
  return i == std::string::npos ? "0" : s.substr(i);
}

// Canonical decimal from sign, integer digits and fraction digits.
std::string canonical(bool negative, std::string int_part, std::string frac_part) {
  int_part = strip_leading_zeros(int_part);
  while (!frac_part.empty() && frac_part.back() == '0') frac_part.pop_back();
  std::string s = int_part;
  if (!frac_part.empty()) s += "." + frac_part;
  if (negative && s != "0") s = "-" + s;
  return s;
}

// a/b: the exact decimal when b (reduced) has only the factors 2 and 5, else "a/b" reduced.
std::string canonical_fraction(bool negative, const std::string& num_s, const std::string& den_s) {
  const std::string n0 = strip_leading_zeros(num_s), d0 = strip_leading_zeros(den_s);
  if (n0.size() > 18 || d0.size() > 18 || d0 == "0") {
    std::string s = n0 + "/" + d0;
    return negative && n0 != "0" ? "-" + s : s;
  }
  unsigned long long n = std::stoull(n0), d = std::stoull(d0);
  const unsigned long long g = std::gcd(n, d);
  n /= g;
  d /= g;
  unsigned long long rest = d;
  int twos = 0, fives = 0;
  while (rest % 2 == 0) rest /= 2, ++twos;
  while (rest % 5 == 0) rest /= 5, ++fives;
  const int k = std::max(twos, fives);
  if (rest == 1 && k <= 18) {
    unsigned __int128 scale = 1;
    for (int i = 0; i < k; ++i) scale *= 10;
    unsigned __int128 v = (unsigned __int128)n * (scale / d);
    std::string digits;
    do {
      digits.insert(digits.begin(), char('0' + int(v % 10)));
      v /= 10;
    } while (v);
    while (int(digits.size()) <= k) digits.insert(digits.begin(), '0');
    return canonical(negative, digits.substr(0, digits.size() - size_t(k)), digits.substr(digits.size() - size_t(k)));
  }
  std::string s = std::to_string(n) + "/" + std::to_string(d);
  return negative && n != 0 ? "-" + s : s;
}

// Replaces the LaTeX spellings models use around numbers with plain text:
// \frac{a}{b} / \dfrac{a}{b} -> a/b, \$ \% \, \! \text{..} removed (units), {} dropped.
std::string plain_math(std::string_view s) {
  std::string out;
  for (size_t i = 0; i < s.size();) {
    auto starts = [&](std::string_view p) { return s.substr(i, p.size()) == p; };
    if (starts("\\frac{") || starts("\\dfrac{") || starts("\\tfrac{")) {
      i = s.find('{', i) + 1;
      size_t a = s.find('}', i);
      if (a != std::string_view::npos && a + 1 < s.size() && s[a + 1] == '{') {
        size_t b = s.find('}', a + 2);
        if (b != std::string_view::npos) {
          out += " ";
          out += s.substr(i, a - i);
          out += "/";
          out += s.substr(a + 2, b - a - 2);
          out += " ";
          i = b + 1;
          continue;
        }
      }
      continue;
    }
    if (starts("\\text{") || starts("\\mathrm{") || starts("\\textbf{")) {
      size_t b = s.find('}', i);
      if (b == std::string_view::npos) break;
      out += " ";
      i = b + 1;
      continue;
    }
    if (starts("\\$") || starts("\\%") || starts("\\,") || starts("\\!") || starts("\\;")) {
      i += 2;
      continue;
    }
    if (s[i] == '{' || s[i] == '}') {
      ++i;
      continue;
    }
    out += s[i++];
  }
  return out;
}

// The first number in s (LaTeX spellings resolved), if any.
std::optional<std::string> first_number(std::string_view s) {
  const auto nums = find_numbers(plain_math(s));
  if (nums.empty()) return std::nullopt;
  return nums.front().value;
}

std::string lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = char(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

// The contents of every \boxed{...} (balanced braces), in order.
std::vector<std::string_view> boxed_contents(std::string_view s) {
  std::vector<std::string_view> out;
  size_t pos = 0;
  while ((pos = s.find("\\boxed{", pos)) != std::string_view::npos) {
    const size_t start = pos + 7;
    int depth = 1;
    size_t i = start;
    for (; i < s.size() && depth > 0; ++i) {
      if (s[i] == '{') ++depth;
      if (s[i] == '}') --depth;
    }
    if (depth == 0) out.push_back(s.substr(start, i - 1 - start));
    pos = start;
  }
  return out;
}

}  // namespace

std::vector<NumberSpan> find_numbers(std::string_view t) {
  std::vector<NumberSpan> out;
  size_t i = 0;
  while (i < t.size()) {
    const size_t begin = i;
    bool negative = false;
    size_t j = i;
    // A sign counts only where it cannot be a binary minus ("5-3" is not -3).
    const bool sign_ok = begin == 0 || !(is_alnum(t[begin - 1]) || t[begin - 1] == ')');
    if (t[j] == '-' && sign_ok) {
      negative = true;
      ++j;
    } else if (t.substr(j, 3) == kUnicodeMinus && sign_ok) {
      negative = true;
      j += 3;
    }
    if (j < t.size() && t[j] == '$') ++j;
    if (j >= t.size() || !is_digit(t[j]) || (j == i && i > 0 && (is_digit(t[i - 1]) || t[i - 1] == '.'))) {
      i = begin + 1;
      continue;
    }
    std::string int_part;
    while (j < t.size() && is_digit(t[j])) int_part += t[j++];
    // Thousands separators: ",ddd" groups not followed by another digit.
    while (j + 3 < t.size() && t[j] == ',' && is_digit(t[j + 1]) && is_digit(t[j + 2]) && is_digit(t[j + 3]) &&
           (j + 4 >= t.size() || !is_digit(t[j + 4]))) {
      int_part += t.substr(j + 1, 3);
      j += 4;
    }
    std::string frac_part, den;
    if (j + 1 < t.size() && t[j] == '.' && is_digit(t[j + 1])) {
      ++j;
      while (j < t.size() && is_digit(t[j])) frac_part += t[j++];
    } else if (j + 1 < t.size() && t[j] == '/' && is_digit(t[j + 1])) {
      ++j;
      while (j < t.size() && is_digit(t[j])) den += t[j++];
    }
    NumberSpan n;
    n.value = den.empty() ? canonical(negative, int_part, frac_part) : canonical_fraction(negative, int_part, den);
    n.begin = begin;
    n.end = j;
    out.push_back(std::move(n));
    i = j;
  }
  return out;
}

std::optional<std::string> normalize_number(std::string_view text) {
  const std::string t = plain_math(text);
  const auto nums = find_numbers(t);
  if (nums.size() != 1) return std::nullopt;
  // A number with a unit or a currency sign, not an expression: no operators anywhere, and
  // no letters before it ("x + 1" and "n=5" are not numbers; "18 dollars" and "$18" are).
  const std::string_view before = std::string_view(t).substr(0, nums[0].begin);
  const std::string_view after = std::string_view(t).substr(nums[0].end);
  auto has_op = [](std::string_view s) { return s.find_first_of("+*/=^<>") != std::string_view::npos; };
  if (has_op(before) || has_op(after)) return std::nullopt;
  for (char c : before)
    if (std::isalpha(static_cast<unsigned char>(c))) return std::nullopt;
  return nums.front().value;
}

std::optional<std::string> parse_gold(std::string_view answer) {
  const size_t p = answer.rfind("####");
  if (p == std::string_view::npos) return std::nullopt;
  return normalize_number(answer.substr(p + 4));
}

std::string_view method_name(ExtractMethod m) {
  switch (m) {
    case ExtractMethod::Boxed: return "boxed";
    case ExtractMethod::Phrase: return "phrase";
    case ExtractMethod::LastNumber: return "last_number";
    case ExtractMethod::None: return "none";
  }
  return "none";
}

Extraction extract_answer(std::string_view text) {
  // 1. \boxed{...}: the last one that holds exactly one number.
  const auto boxes = boxed_contents(text);
  for (auto it = boxes.rbegin(); it != boxes.rend(); ++it)
    if (auto v = normalize_number(*it)) return {.method = ExtractMethod::Boxed, .value = *v};

  // 2. An explicit answer phrase: the last occurrence that is followed by a number on its line
  // (or, when the rest of the line is empty, on the next non-empty line).
  static const std::string_view kPhrases[] = {"the answer is", "the final answer is", "answer:", "####"};
  const std::string low = lower(text);
  std::vector<size_t> ends;  // where the text after a phrase begins
  for (std::string_view ph : kPhrases)
    for (size_t p = low.find(ph); p != std::string::npos; p = low.find(ph, p + 1)) {
      const size_t e = p + ph.size();
      if (ph == "####") {
        // GSM8K's own mark is directly followed by the number; a Markdown heading
        // ("#### Step 1") is not an answer.
        const size_t q = text.find_first_not_of(" \t", e);
        if (q == std::string_view::npos) continue;
        const char c = text[q];
        if (!(is_digit(c) || c == '-' || c == '$' || text.substr(q, 3) == kUnicodeMinus)) continue;
      }
      ends.push_back(e);
    }
  std::sort(ends.rbegin(), ends.rend());
  for (size_t e : ends) {
    std::string_view rest = text.substr(e);
    size_t nl = rest.find('\n');
    std::string_view line = rest.substr(0, nl);
    if (line.find_first_not_of(" \t\r:*$") == std::string_view::npos && nl != std::string_view::npos) {
      std::string_view after = rest.substr(nl + 1);
      while (!after.empty()) {
        size_t n2 = after.find('\n');
        std::string_view l2 = after.substr(0, n2);
        if (l2.find_first_not_of(" \t\r") != std::string_view::npos) {
          line = l2;
          break;
        }
        if (n2 == std::string_view::npos) break;
        after = after.substr(n2 + 1);
      }
    }
    if (auto v = first_number(line)) return {.method = ExtractMethod::Phrase, .value = *v};
  }

  // 3. The last number anywhere: a diagnostic, never strict.
  const auto nums = find_numbers(plain_math(text));
  if (!nums.empty()) return {.method = ExtractMethod::LastNumber, .value = nums.back().value};
  return {};
}

Gsm8kScore score_gsm8k(std::string_view completion, bool stopped_at_eos, const std::string& gold) {
  Gsm8kScore s;
  s.extraction = extract_answer(completion);
  s.strict_complete = stopped_at_eos && s.extraction.explicit_marker();
  s.matches_gold = s.extraction.method != ExtractMethod::None && s.extraction.value == gold;
  s.exact = s.strict_complete && s.matches_gold;
  return s;
}

}  // namespace atlas::eval
