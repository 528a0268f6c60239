// Stop criteria (src/decode/stop.h): EOS, the length cap, stop strings on the decoded text.
#include <gtest/gtest.h>

#include "core/error.h"
#include "decode/stop.h"

namespace atlas::decode {
namespace {

TEST(Stop, EosFiresOnAnyEosId) {
  StopChecker s({.eos_ids = {100001, 7}, .max_new_tokens = 10});
  EXPECT_EQ(s.update(5, "a"), StopReason::None);
  EXPECT_EQ(s.update(7, "a"), StopReason::Eos);
  EXPECT_EQ(s.n_new(), 2);
  EXPECT_EQ(stop_reason_name(s.reason()), "eos");
  EXPECT_THROW(s.update(5, "a"), Error);  // the row is finished
}

TEST(Stop, LengthCapAndEosPrecedence) {
  StopChecker s({.eos_ids = {0}, .max_new_tokens = 3});
  EXPECT_EQ(s.update(4, "x"), StopReason::None);
  EXPECT_EQ(s.update(4, "xx"), StopReason::None);
  EXPECT_EQ(s.update(4, "xxx"), StopReason::Length);
  EXPECT_EQ(stop_reason_name(StopReason::Length), "length");
  StopChecker e({.eos_ids = {0}, .max_new_tokens = 1});
  EXPECT_EQ(e.update(0, ""), StopReason::Eos);  // EOS on the last allowed token is natural
}

TEST(Stop, StopStringAcrossTokens) {
  StopChecker s({.eos_ids = {}, .max_new_tokens = 100, .stop_strings = {"\n\n", "Question:"}});
  EXPECT_EQ(s.update(1, "Hel"), StopReason::None);
  EXPECT_EQ(s.update(2, "Hello\n"), StopReason::None);
  EXPECT_EQ(s.update(3, "Hello\n\nWorld"), StopReason::StopString);
  ASSERT_TRUE(s.match().has_value());
  EXPECT_EQ(s.match()->string_index, 0u);
  EXPECT_EQ(s.match()->offset, 5u);
  EXPECT_EQ(stop_reason_name(s.reason()), "stop_string");
}

TEST(Stop, EarliestOfSeveralStopStringsInOneStep) {
  StopChecker s({.max_new_tokens = 100, .stop_strings = {"END", "Q:"}});
  EXPECT_EQ(s.update(1, "a Q: b END"), StopReason::StopString);
  EXPECT_EQ(s.match()->string_index, 1u);
  EXPECT_EQ(s.match()->offset, 2u);
}

TEST(Stop, TextRewrittenBehindItsEndIsRescanned) {
  // An incomplete UTF-8 sequence decodes as U+FFFD, then the next token completes it.
  const std::string grin = "\xF0\x9F\x98\x80";  // U+1F600
  StopChecker s({.max_new_tokens = 100, .stop_strings = {grin}});
  EXPECT_EQ(s.update(1, "abcdefgh\xEF\xBF\xBD"), StopReason::None);
  EXPECT_EQ(s.update(2, "abcdefgh" + grin), StopReason::StopString);
  EXPECT_EQ(s.match()->offset, 8u);
}

TEST(Stop, StopStringBeatsTheCapAndOldTextIsNotRematched) {
  StopChecker s({.max_new_tokens = 2, .stop_strings = {"##"}});
  EXPECT_EQ(s.update(1, "#"), StopReason::None);
  EXPECT_EQ(s.update(2, "##"), StopReason::StopString);
  StopChecker t({.max_new_tokens = 5, .stop_strings = {"zz"}});
  EXPECT_EQ(t.update(1, "z"), StopReason::None);
  EXPECT_EQ(t.update(2, "zaz"), StopReason::None);  // no "zz" anywhere
}

TEST(Stop, BadCriteriaThrow) {
  EXPECT_THROW(StopChecker({.max_new_tokens = 0}), Error);
  EXPECT_THROW(StopChecker({.max_new_tokens = -5}), Error);
  EXPECT_THROW(StopChecker({.max_new_tokens = 5, .stop_strings = {"ok", ""}}), Error);
}

}  // namespace
}  // namespace atlas::decode
