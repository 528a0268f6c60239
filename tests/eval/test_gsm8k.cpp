// GSM8K: number normalisation, extraction order and method tags, strict metrics, and the
// gold of every test answer (skipped visibly when ../shared/data is absent).
#include <filesystem>
#include <gtest/gtest.h>

#include "core/file.h"
#include "eval/gsm8k.h"
#include "eval/jsonl.h"

namespace atlas::eval {
namespace {

namespace fs = std::filesystem;

TEST(Gsm8kNumbers, Normalisation) {
  struct Case {
    const char* in;
    const char* want;  // "" = no single number
  };
  const Case cases[] = {
      {"18", "18"},           {"18.", "18"},          {"$18", "18"},          {"$1,234", "1234"},
      {"1,234,567", "1234567"}, {"18.00", "18"},      {"18.50", "18.5"},      {"0.50", "0.5"},
      {"007", "7"},           {"-3", "-3"},           {"-$3.20", "-3.2"},     {"\xE2\x88\x92" "4", "-4"},
      {"-0", "0"},            {"50%", "50"},          {"12 dollars", "12"},   {"3/4", "0.75"},
      {"6/3", "2"},           {"2/6", "1/3"},         {"-1/8", "-0.125"},     {"\\frac{3}{4}", "0.75"},
      {"\\dfrac{10}{4}", "2.5"}, {"\\$5", "5"},       {"5\\%", "5"},          {"18 \\text{ eggs}", "18"},
      {"", ""},               {"no number", ""},      {"3 and 4", ""},        {"1,23", ""},
  };
  for (const Case& c : cases) {
    auto v = normalize_number(c.in);
    if (*c.want) {
      ASSERT_TRUE(v.has_value()) << c.in;
      EXPECT_EQ(*v, c.want) << c.in;
    } else {
      EXPECT_FALSE(v.has_value()) << c.in << " -> " << v.value_or("");
    }
  }
}

TEST(Gsm8kNumbers, BinaryMinusIsNotASign) {
  const auto nums = find_numbers("16-3-4 = 9, then -2");
  ASSERT_EQ(nums.size(), 5u);
  EXPECT_EQ(nums[0].value, "16");
  EXPECT_EQ(nums[1].value, "3");
  EXPECT_EQ(nums[3].value, "9");
  EXPECT_EQ(nums[4].value, "-2");
}

TEST(Gsm8kGold, AfterTheMarks) {
  EXPECT_EQ(parse_gold("She sells 9 eggs.\n#### 18").value(), "18");
  EXPECT_EQ(parse_gold("... #### 1,600").value(), "1600");
  EXPECT_EQ(parse_gold("#### -5").value(), "-5");
  EXPECT_FALSE(parse_gold("no marks here: 18").has_value());
  EXPECT_FALSE(parse_gold("####").has_value());
}

TEST(Gsm8kExtract, Table) {
  struct Case {
    const char* text;
    const char* method;
    const char* value;
  };
  const Case cases[] = {
      // \boxed wins over everything, and the last box counts.
      {"So 9 * 2 = 18. The answer is 17.\n\\boxed{18}", "boxed", "18"},
      {"First \\boxed{3}, corrected: \\boxed{4}", "boxed", "4"},
      {"\\boxed{\\$1,250.00}", "boxed", "1250"},
      {"\\boxed{\\frac{1}{2}}", "boxed", "0.5"},
      {"\\boxed{18 \\text{ dollars}}", "boxed", "18"},
      // A box without a single number falls through to the next method.
      {"\\boxed{x + 1}. The answer is 7.", "phrase", "7"},
      // Phrases, case-insensitive; the last one counts; first number after it on its line.
      {"The answer is 42.", "phrase", "42"},
      {"the answer is: $1,000", "phrase", "1000"},
      {"Answer: -7 degrees", "phrase", "-7"},
      {"Final Answer: 3.50", "phrase", "3.5"},
      {"The answer is 5 apples and 3 pears", "phrase", "5"},
      {"The answer is 10. Wait, recheck. The answer is 12.", "phrase", "12"},
      {"Janet has 16 - 3 - 4 = 9 eggs.\n#### 18", "phrase", "18"},
      {"The final answer is\n\n  24\n", "phrase", "24"},
      // A phrase followed by no number is skipped; an earlier one still counts.
      {"The answer is 8. My answer: unsure", "phrase", "8"},
      // A Markdown heading is not GSM8K's mark.
      {"#### Step 1\nAdd them: 2 + 3 = 5", "last_number", "5"},
      {"#### Step 1\nThe answer is 5.", "phrase", "5"},
      // Fallback: the last number, tagged.
      {"16 - 3 - 4 = 9 and 9 * 2 = 18 dollars.", "last_number", "18"},
      {"It costs $2,125.", "last_number", "2125"},
      {"She has -3 left", "last_number", "-3"},
      {"Half is 1/2", "last_number", "0.5"},
      {"no digits at all", "none", ""},
      {"", "none", ""},
  };
  for (const Case& c : cases) {
    const Extraction e = extract_answer(c.text);
    EXPECT_EQ(method_name(e.method), c.method) << c.text;
    EXPECT_EQ(e.value, c.value) << c.text;
  }
}

TEST(Gsm8kScore, StrictNeedsEosAndAMarker) {
  Gsm8kScore s = score_gsm8k("The answer is 18.", true, "18");
  EXPECT_TRUE(s.strict_complete);
  EXPECT_TRUE(s.exact);
  EXPECT_TRUE(s.matches_gold);

  s = score_gsm8k("The answer is 18.", false, "18");  // cut at the length cap
  EXPECT_FALSE(s.strict_complete);
  EXPECT_FALSE(s.exact);
  EXPECT_TRUE(s.matches_gold);

  s = score_gsm8k("so 9 * 2 = 18", true, "18");  // right, but only by the fallback
  EXPECT_FALSE(s.strict_complete);
  EXPECT_FALSE(s.exact);
  EXPECT_TRUE(s.matches_gold);

  s = score_gsm8k("\\boxed{17}", true, "18");
  EXPECT_TRUE(s.strict_complete);
  EXPECT_FALSE(s.exact);
  EXPECT_FALSE(s.matches_gold);

  s = score_gsm8k("I don't know", true, "18");
  EXPECT_FALSE(s.strict_complete);
  EXPECT_FALSE(s.matches_gold);
}

TEST(Gsm8kData, EveryTestGoldParses) {
  std::string path;
  for (fs::path p = ATLAS_SOURCE_DIR; p.has_parent_path() && p != p.parent_path(); p = p.parent_path())
    if (fs::exists(p / "shared/data/gsm8k/test.jsonl")) {
      path = (p / "shared/data/gsm8k/test.jsonl").string();
      break;
    }
  if (path.empty()) GTEST_SKIP() << "absent: ../shared/data/gsm8k/test.jsonl";
  const auto lines = read_jsonl(path);
  ASSERT_EQ(lines.size(), 1319u);
  size_t with_comma = 0;
  for (const auto& l : lines) {
    const std::string answer = l.value.at("answer").get<std::string>();
    const auto g = parse_gold(answer);
    ASSERT_TRUE(g.has_value()) << "line " << l.line;
    // Independent reading: the text after "####", spaces and commas removed, is an integer.
    std::string raw = answer.substr(answer.rfind("####") + 4);
    std::string digits;
    for (char c : raw)
      if (c != ' ' && c != ',' && c != '\n') digits += c;
    with_comma += raw.find(',') != std::string::npos;
    EXPECT_EQ(*g, digits) << "line " << l.line;
    // And the gold survives extraction from the reference solution itself.
    EXPECT_EQ(extract_answer(answer).value, *g) << "line " << l.line;
    EXPECT_EQ(method_name(extract_answer(answer).method), "phrase");
  }
  EXPECT_GT(with_comma, 0u);  // the file does use thousands separators
}

}  // namespace
}  // namespace atlas::eval
