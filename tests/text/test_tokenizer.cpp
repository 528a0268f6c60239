// Tokenizer unit tests: each component on small hand-built tokenizer.json files whose expected
// output follows from the Hugging Face documentation of that component, plus error handling.
// Agreement with real tokenizers at scale is tests/text/test_tokenizer_conformance.py.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "core/error.h"
#include "core/json.h"
#include "text/tokenizer.h"
#include "text/unicode.h"

namespace atlas {
namespace {

// A BPE model over the given vocabulary/merges with the given pipeline parts (null when absent).
json tok_json(json vocab, json merges, json pre = nullptr, json norm = nullptr, json post = nullptr,
              json decoder = nullptr, json added = json::array(), json model_extra = json::object()) {
  json model = {{"type", "BPE"}, {"vocab", vocab}, {"merges", merges}};
  for (auto& [k, v] : model_extra.items()) model[k] = v;
  return {{"version", "1.0"},        {"added_tokens", added}, {"normalizer", norm}, {"pre_tokenizer", pre},
          {"post_processor", post},  {"decoder", decoder},    {"model", model}};
}

// Character vocabulary for a..z, space, '-', digits and a few more (ids in order).
json char_vocab(const std::string& extra = "") {
  json v = json::object();
  std::string chars = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ -!?,.0123456789'" + extra;
  int id = 0;
  for (char c : chars) v[std::string(1, c)] = id++;
  return v;
}

std::vector<std::string> pre_strings(const Tokenizer& t, const std::string& text) {
  std::vector<std::string> out;
  for (auto& [s, span] : t.pre_tokenize(text)) out.push_back(s);
  return out;
}

using Strs = std::vector<std::string>;

// ---------------------------------------------------------------------------------- Split
// The example of the HF docs: pattern "-" on "the-final--countdown".
TEST(TokenizerPre, SplitBehaviorsOnStringPattern) {
  auto make = [](const char* behavior) {
    json pre = {{"type", "Split"}, {"pattern", {{"String", "-"}}}, {"behavior", behavior}, {"invert", false}};
    return Tokenizer::from_json(tok_json(char_vocab(), json::array(), pre).dump());
  };
  const std::string s = "the-final--countdown";
  EXPECT_EQ(pre_strings(make("Removed"), s), (Strs{"the", "final", "countdown"}));
  EXPECT_EQ(pre_strings(make("Isolated"), s), (Strs{"the", "-", "final", "-", "-", "countdown"}));
  EXPECT_EQ(pre_strings(make("MergedWithPrevious"), s), (Strs{"the-", "final-", "-", "countdown"}));
  EXPECT_EQ(pre_strings(make("MergedWithNext"), s), (Strs{"the", "-final", "-", "-countdown"}));
  EXPECT_EQ(pre_strings(make("Contiguous"), s), (Strs{"the", "-", "final", "--", "countdown"}));
}

TEST(TokenizerPre, SplitRegexInvertKeepsMatchesAsTheSplitPoints) {
  // invert: the matches become the non-split parts; with Removed, only the matches are kept.
  json pre = {{"type", "Split"}, {"pattern", {{"Regex", "[a-z]+"}}}, {"behavior", "Removed"}, {"invert", true}};
  auto t = Tokenizer::from_json(tok_json(char_vocab(), json::array(), pre).dump());
  EXPECT_EQ(pre_strings(t, "ab, cd!e"), (Strs{"ab", "cd", "e"}));
  json pre2 = {{"type", "Split"}, {"pattern", {{"Regex", "[a-z]+"}}}, {"behavior", "Removed"}, {"invert", false}};
  auto t2 = Tokenizer::from_json(tok_json(char_vocab(), json::array(), pre2).dump());
  EXPECT_EQ(pre_strings(t2, "ab, cd!e"), (Strs{", ", "!"}));
}

TEST(TokenizerPre, SplitInvertWithEveryBehavior) {
  // invert swaps which parts count as the delimiter: on "ab, cd!e" with [a-z]+ inverted, the
  // delimiters are ", " and "!" (HF's behaviors then apply to those).
  auto make = [](const char* behavior) {
    json pre = {{"type", "Split"}, {"pattern", {{"Regex", "[a-z]+"}}}, {"behavior", behavior}, {"invert", true}};
    return Tokenizer::from_json(tok_json(char_vocab(), json::array(), pre).dump());
  };
  const std::string s = "ab, cd!e";
  EXPECT_EQ(pre_strings(make("Isolated"), s), (Strs{"ab", ", ", "cd", "!", "e"}));
  EXPECT_EQ(pre_strings(make("MergedWithPrevious"), s), (Strs{"ab, ", "cd!", "e"}));
  EXPECT_EQ(pre_strings(make("MergedWithNext"), s), (Strs{"ab", ", cd", "!e"}));
  EXPECT_EQ(pre_strings(make("Contiguous"), s), (Strs{"ab", ", ", "cd", "!", "e"}));
  // Contiguous merges adjacent delimiters only: "--" with "-" as the (non-inverted) pattern.
  json pre = {{"type", "Split"}, {"pattern", {{"String", "-"}}}, {"behavior", "Contiguous"}, {"invert", true}};
  auto t = Tokenizer::from_json(tok_json(char_vocab(), json::array(), pre).dump());
  // Inverted: the letters are the delimiters; the dashes between them stay apart from them.
  EXPECT_EQ(pre_strings(t, "a--b-c"), (Strs{"a", "--", "b", "-", "c"}));
}

TEST(TokenizerPre, OnigurumaFeaturesUsedByRealPatterns) {
  // \p{L}, \p{N}{1,3}, case-insensitive group, negative lookahead (?!\S) at the end of a split.
  json pre = {{"type", "Split"},
              {"pattern", {{"Regex", R"((?i:'s|'t)|\p{L}+|\p{N}{1,3}|\s+(?!\S)|\s+)"}}},
              {"behavior", "Isolated"},
              {"invert", false}};
  auto t = Tokenizer::from_json(tok_json(char_vocab(), json::array(), pre).dump());
  EXPECT_EQ(pre_strings(t, "IT'S 12345  ok"), (Strs{"IT", "'S", " ", "123", "45", " ", " ", "ok"}));
  EXPECT_EQ(pre_strings(t, "é中x"), (Strs{"é中x"}));
}

TEST(TokenizerPre, ByteLevelRegexAndPrefixSpace) {
  json pre = {{"type", "ByteLevel"}, {"add_prefix_space", true}, {"use_regex", true}};
  auto t = Tokenizer::from_json(tok_json(char_vocab(), json::array(), pre).dump());
  // GPT-2 split: words keep their leading space; of a run of spaces, the last one goes with the word.
  EXPECT_EQ(pre_strings(t, "Hello world's  test"), (Strs{" Hello", " world", "'s", " ", " test"}));
}

TEST(TokenizerPre, DigitsWhitespacePunctuationMetaspace) {
  auto with = [](json pre) { return Tokenizer::from_json(tok_json(char_vocab(), json::array(), pre).dump()); };
  EXPECT_EQ(pre_strings(with({{"type", "Digits"}, {"individual_digits", true}}), "ab123c"),
            (Strs{"ab", "1", "2", "3", "c"}));
  EXPECT_EQ(pre_strings(with({{"type", "Digits"}, {"individual_digits", false}}), "ab123c"), (Strs{"ab", "123", "c"}));
  EXPECT_EQ(pre_strings(with({{"type", "Whitespace"}}), "Hey man!! good?"), (Strs{"Hey", "man", "!!", "good", "?"}));
  EXPECT_EQ(pre_strings(with({{"type", "WhitespaceSplit"}}), "Hey  man!!\tx"), (Strs{"Hey", "man!!", "x"}));
  EXPECT_EQ(pre_strings(with({{"type", "Punctuation"}, {"behavior", "Isolated"}}), "Hey, you!"),
            (Strs{"Hey", ",", " you", "!"}));
  EXPECT_EQ(pre_strings(with({{"type", "Metaspace"}, {"replacement", "\u2581"}, {"prepend_scheme", "always"}, {"split", true}}),
                        "Hey friend"),
            (Strs{"\u2581Hey", "\u2581friend"}));
  EXPECT_EQ(pre_strings(with({{"type", "Metaspace"}, {"replacement", "\u2581"}, {"prepend_scheme", "never"}, {"split", false}}),
                        "Hey friend"),
            (Strs{"Hey\u2581friend"}));
  json seq = {{"type", "Sequence"},
              {"pretokenizers", json::array({{{"type", "WhitespaceSplit"}}, {{"type", "Digits"}, {"individual_digits", true}}})}};
  EXPECT_EQ(pre_strings(with(seq), "a12 b"), (Strs{"a", "1", "2", "b"}));
}

// ---------------------------------------------------------------------------------- normalizers
TEST(TokenizerNorm, UnicodeFormsLowercaseReplacePrependStrip) {
  auto with = [](json norm) {
    json pre = {{"type", "WhitespaceSplit"}};
    return Tokenizer::from_json(tok_json(char_vocab(), json::array(), pre, norm).dump());
  };
  EXPECT_EQ(pre_strings(with({{"type", "NFKC"}}), "\uFF26\uFF55\uFF4C\uFF4C \uFB01x"), (Strs{"Full", "fix"}));
  EXPECT_EQ(pre_strings(with({{"type", "NFC"}}), "e\u0301"), (Strs{"\u00E9"}));
  EXPECT_EQ(pre_strings(with({{"type", "NFD"}}), "\u00E9"), (Strs{"e\u0301"}));
  EXPECT_EQ(pre_strings(with({{"type", "NFKD"}}), "\uFB01"), (Strs{"fi"}));
  EXPECT_EQ(pre_strings(with({{"type", "Lowercase"}}), "HeLLo \u00C9"), (Strs{"hello", "\u00E9"}));
  EXPECT_EQ(pre_strings(with({{"type", "Replace"}, {"pattern", {{"String", "aa"}}}, {"content", "b"}}), "aaa caa"),
            (Strs{"ba", "cb"}));
  EXPECT_EQ(pre_strings(with({{"type", "Replace"}, {"pattern", {{"Regex", "[0-9]+"}}}, {"content", "#"}}), "x12y3"),
            (Strs{"x#y#"}));
  EXPECT_EQ(pre_strings(with({{"type", "Prepend"}, {"prepend", "_"}}), "ab"), (Strs{"_ab"}));
  json seq = {{"type", "Sequence"},
              {"normalizers", json::array({{{"type", "Strip"}, {"strip_left", true}, {"strip_right", false}}, {{"type", "Lowercase"}}})}};
  // Strip left only: the trailing spaces stay in the text (WhitespaceSplit drops them as a split).
  auto t = with(seq);
  auto pieces = t.pre_tokenize("  AB  ");
  ASSERT_EQ(pieces.size(), 1u);
  EXPECT_EQ(pieces[0].first, "ab");
  EXPECT_EQ(pieces[0].second, (Span{2, 4}));
}

TEST(TokenizerNorm, OffsetsPointIntoTheOriginalText) {
  // NFKC turns one code point (U+FB01 "ﬁ") into two; both tokens report the original character.
  json pre = {{"type", "WhitespaceSplit"}};
  auto t = Tokenizer::from_json(tok_json(char_vocab(), json::array(), pre, {{"type", "NFKC"}}).dump());
  Encoding e = t.encode("x \uFB01");
  ASSERT_EQ(e.ids.size(), 3u);
  EXPECT_EQ(e.offsets[0], (Span{0, 1}));
  EXPECT_EQ(e.offsets[1], (Span{2, 3}));
  EXPECT_EQ(e.offsets[2], (Span{2, 3}));
  EXPECT_EQ(e.byte_offsets[2], (Span{2, 5}));
}

// ---------------------------------------------------------------------------------- BPE model
TEST(TokenizerBpe, MergesApplyByRankNotPosition) {
  // "b c" outranks "a b": "abc" -> "a" "bc" although "a b" is leftmost.
  json v = {{"a", 0}, {"b", 1}, {"c", 2}, {"ab", 3}, {"bc", 4}, {"abc", 5}};
  auto t = Tokenizer::from_json(tok_json(v, json::array({"b c", "a b"})).dump());
  EXPECT_EQ(t.encode_ids("abc"), (std::vector<TokenId>{0, 4}));
  // The pair form of merges is the same thing.
  auto t2 = Tokenizer::from_json(tok_json(v, json::array({json::array({"b", "c"}), json::array({"a", "b"})})).dump());
  EXPECT_EQ(t2.encode_ids("abc"), (std::vector<TokenId>{0, 4}));
  // With "a b" first, then "ab c".
  auto t3 = Tokenizer::from_json(tok_json(v, json::array({"a b", "ab c"})).dump());
  EXPECT_EQ(t3.encode_ids("abc"), (std::vector<TokenId>{5}));
  EXPECT_EQ(t3.encode_ids("abcab"), (std::vector<TokenId>{5, 3}));
}

TEST(TokenizerBpe, IgnoreMergesTakesWholeWordsFromTheVocab) {
  json v = {{"a", 0}, {"b", 1}, {"c", 2}, {"ab", 3}, {"abc", 4}};
  json merges = json::array({"a b"});
  auto plain = Tokenizer::from_json(tok_json(v, merges).dump());
  EXPECT_EQ(plain.encode_ids("abc"), (std::vector<TokenId>{3, 2}));
  auto ignore = Tokenizer::from_json(tok_json(v, merges, nullptr, nullptr, nullptr, nullptr, json::array(),
                                              {{"ignore_merges", true}})
                                         .dump());
  EXPECT_EQ(ignore.encode_ids("abc"), (std::vector<TokenId>{4}));
}

TEST(TokenizerBpe, UnknownCharactersUseUnkOrByteFallback) {
  json v = {{"<unk>", 0}, {"a", 1}, {"<0xC3>", 2}, {"<0xA9>", 3}};
  auto unk = Tokenizer::from_json(
      tok_json(v, json::array(), nullptr, nullptr, nullptr, nullptr, json::array(), {{"unk_token", "<unk>"}}).dump());
  EXPECT_EQ(unk.encode_ids("a\u00E9\u00E9a"), (std::vector<TokenId>{1, 0, 0, 1}));
  auto fused = Tokenizer::from_json(tok_json(v, json::array(), nullptr, nullptr, nullptr, nullptr, json::array(),
                                             {{"unk_token", "<unk>"}, {"fuse_unk", true}})
                                        .dump());
  EXPECT_EQ(fused.encode_ids("a\u00E9\u00E9a"), (std::vector<TokenId>{1, 0, 1}));
  json dec = {{"type", "Sequence"}, {"decoders", json::array({{{"type", "ByteFallback"}}, {{"type", "Fuse"}}})}};
  auto bf = Tokenizer::from_json(tok_json(v, json::array(), nullptr, nullptr, nullptr, dec, json::array(),
                                          {{"unk_token", "<unk>"}, {"byte_fallback", true}})
                                     .dump());
  std::vector<TokenId> ids = bf.encode_ids("a\u00E9\u00F1");  // é has byte tokens; ñ does not -> unk
  EXPECT_EQ(ids, (std::vector<TokenId>{1, 2, 3, 0}));
  EXPECT_EQ(bf.decode(std::vector<TokenId>{1, 2, 3}), "a\u00E9");
  EXPECT_EQ(bf.decode(std::vector<TokenId>{2, 1}), "\uFFFDa");  // a lone lead byte is invalid UTF-8
}

TEST(TokenizerBpe, WithoutUnkTokenUnknownCharactersAreLeftOut) {
  // Hugging Face's BPE skips a character it has no token for when there is no unk_token; its
  // neighbours then merge as if adjacent. atlas's offsets still cover the skipped character.
  json v = {{"a", 0}, {"b", 1}, {"ab", 2}};
  auto t = Tokenizer::from_json(tok_json(v, json::array({"a b"})).dump());
  Encoding e = t.encode("a\u00E9b  b");
  EXPECT_EQ(e.ids, (std::vector<TokenId>{2, 1}));
  EXPECT_EQ(e.offsets[0], (Span{0, 3}));
  EXPECT_EQ(e.offsets[1], (Span{5, 6}));
}

TEST(TokenizerBpe, ByteLevelModelSeesBytesAndDecodesBack) {
  // Byte-level vocab: the 256 byte characters, plus merges for "Ġt" and "Ġthe"... written in
  // the GPT-2 alphabet ("Ġ" = space).
  json v = json::object();
  int id = 0;
  int shifted = 0;
  for (int b = 0; b < 256; ++b) {
    bool printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
    char32_t c = printable ? char32_t(b) : char32_t(256 + shifted++);
    std::string s;
    utf8::append(s, c);
    v[s] = id++;
  }
  v["\u0120t"] = id++;
  v["\u0120th"] = id++;
  v["\u0120the"] = id++;
  json merges = json::array({"\u0120 t", "\u0120t h", "\u0120th e"});
  json pre = {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}};
  json dec = {{"type", "ByteLevel"}};
  auto t = Tokenizer::from_json(tok_json(v, merges, pre, nullptr, nullptr, dec).dump());
  Encoding e = t.encode("a the \u00E9");
  // "a", " the", " ", then é as two byte tokens that both report the whole character.
  ASSERT_EQ(e.ids.size(), 5u);
  EXPECT_EQ(e.ids[1], 258);
  EXPECT_EQ(e.offsets[3], (Span{6, 7}));
  EXPECT_EQ(e.offsets[4], (Span{6, 7}));
  EXPECT_EQ(e.byte_offsets[4], (Span{6, 8}));
  EXPECT_EQ(t.decode(e.ids), "a the \u00E9");
}

TEST(TokenizerPost, ByteLevelTrimOffsetsDropsSpaces) {
  // Byte-level vocab of single bytes plus "Ġb"; trim_offsets removes the space from its span.
  json v = json::object();
  int id = 0, shifted = 0;
  for (int b = 0; b < 256; ++b) {
    bool printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
    std::string s;
    utf8::append(s, printable ? char32_t(b) : char32_t(256 + shifted++));
    v[s] = id++;
  }
  v["\u0120b"] = id++;  // 256
  json pre = {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}};
  auto make = [&](bool trim) {
    json post = {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", trim}};
    return Tokenizer::from_json(tok_json(v, json::array({"\u0120 b"}), pre, nullptr, post).dump());
  };
  Encoding plain = make(false).encode("a  b");
  ASSERT_EQ(plain.ids, (std::vector<TokenId>{'a', ' ', 256}));
  EXPECT_EQ(plain.offsets[2], (Span{2, 4}));
  Encoding trimmed = make(true).encode("a  b");
  EXPECT_EQ(trimmed.offsets[0], (Span{0, 1}));
  EXPECT_EQ(trimmed.offsets[1], (Span{2, 2}));  // a lone space token: empty span at its end
  EXPECT_EQ(trimmed.offsets[2], (Span{3, 4}));
}

// ---------------------------------------------------------------------------------- added tokens
TEST(TokenizerAdded, LongestFirstSpecialParsedAndStripFlags) {
  json added = json::array({
      {{"id", 100}, {"content", "<s>"}, {"special", true}, {"normalized", false}},
      {{"id", 101}, {"content", "<s>x"}, {"special", true}, {"normalized", false}},
      {{"id", 102}, {"content", "[L]"}, {"special", false}, {"lstrip", true}, {"normalized", false}},
      {{"id", 103}, {"content", "[R]"}, {"special", false}, {"rstrip", true}, {"normalized", false}},
      {{"id", 104}, {"content", "ab"}, {"special", false}, {"single_word", true}, {"normalized", false}},
  });
  json pre = {{"type", "WhitespaceSplit"}};
  auto t = Tokenizer::from_json(tok_json(char_vocab("<>[]"), json::array(), pre, nullptr, nullptr, nullptr, added).dump());
  std::vector<TokenId> ids = t.encode_ids("a<s>xb<s>");
  EXPECT_EQ(ids, (std::vector<TokenId>{0, 101, 1, 100}));
  Encoding e = t.encode("c  [L]d");  // lstrip swallows the spaces before [L]
  ASSERT_EQ(e.ids.size(), 3u);
  EXPECT_EQ(e.ids[1], 102);
  EXPECT_EQ(e.offsets[1], (Span{1, 6}));
  e = t.encode("[R]  d");
  EXPECT_EQ(e.ids[0], 103);
  EXPECT_EQ(e.offsets[0], (Span{0, 5}));
  // single_word: "ab" only as a whole word.
  EXPECT_EQ(t.encode_ids("ab cab"), (std::vector<TokenId>{104, 2, 0, 1}));
  EXPECT_TRUE(t.is_special(100));
  EXPECT_FALSE(t.is_special(102));
  EXPECT_EQ(t.decode(std::vector<TokenId>{100, 0}, {.skip_special_tokens = true}), "a");
}

// ---------------------------------------------------------------------------------- post-processing
TEST(TokenizerAdded, NormalizedTokensMatchAfterTheNormalizer) {
  // normalized=true: the token is looked for in the normalized text (its content normalized the
  // same way), so "AB" matches "ab" under Lowercase; its span is the original "AB".
  json added = json::array({{{"id", 100}, {"content", "ab"}, {"special", false}, {"normalized", true}},
                            {{"id", 101}, {"content", "CD"}, {"special", false}, {"normalized", false}}});
  auto t = Tokenizer::from_json(
      tok_json(char_vocab(), json::array(), nullptr, {{"type", "Lowercase"}}, nullptr, nullptr, added).dump());
  Encoding e = t.encode("xAB CD");
  const json v = char_vocab();
  EXPECT_EQ(e.ids, (std::vector<TokenId>{v["x"].get<TokenId>(), 100, v[" "].get<TokenId>(), 101}));
  EXPECT_EQ(e.offsets, (std::vector<Span>{{0, 1}, {1, 3}, {3, 4}, {4, 6}}));
  // normalized=false: matched on the raw text only, so "cd" is not the token.
  Encoding f = t.encode("cd");
  EXPECT_EQ(f.ids, (std::vector<TokenId>{v["c"].get<TokenId>(), v["d"].get<TokenId>()}));
}

TEST(TokenizerPost, TemplateProcessingOnlyWithSpecialTokens) {
  json added = json::array({{{"id", 90}, {"content", "[CLS]"}, {"special", true}}, {{"id", 91}, {"content", "[SEP]"}, {"special", true}}});
  json post = {{"type", "TemplateProcessing"},
               {"single", json::array({{{"SpecialToken", {{"id", "[CLS]"}, {"type_id", 0}}}},
                                       {{"Sequence", {{"id", "A"}, {"type_id", 0}}}},
                                       {{"SpecialToken", {{"id", "[SEP]"}, {"type_id", 0}}}}})},
               {"pair", json::array()},
               {"special_tokens", {{"[CLS]", {{"id", "[CLS]"}, {"ids", {90}}, {"tokens", {"[CLS]"}}}},
                                   {"[SEP]", {{"id", "[SEP]"}, {"ids", {91}}, {"tokens", {"[SEP]"}}}}}}};
  auto t = Tokenizer::from_json(tok_json(char_vocab(), json::array(), nullptr, nullptr, post, nullptr, added).dump());
  EXPECT_EQ(t.encode_ids("ab"), (std::vector<TokenId>{0, 1}));
  Encoding e = t.encode("ab", {.add_special_tokens = true});
  EXPECT_EQ(e.ids, (std::vector<TokenId>{90, 0, 1, 91}));
  EXPECT_EQ(e.offsets[0], (Span{0, 0}));
  EXPECT_EQ(e.offsets[2], (Span{1, 2}));
}

TEST(TokenizerPost, ConfigAddBosReplacesThePostProcessor) {
  json added = json::array({{{"id", 90}, {"content", "<bos>"}, {"special", true}}, {{"id", 91}, {"content", "<eos>"}, {"special", true}}});
  std::string tj = tok_json(char_vocab(), json::array(), nullptr, nullptr, nullptr, nullptr, added).dump();
  json cfg = {{"bos_token", {{"__type", "AddedToken"}, {"content", "<bos>"}}}, {"eos_token", "<eos>"},
              {"add_bos_token", true}, {"add_eos_token", true}};
  auto t = Tokenizer::from_json(tj, cfg.dump());
  EXPECT_EQ(t.encode_ids("a", {.add_special_tokens = true}), (std::vector<TokenId>{90, 0, 91}));
  EXPECT_EQ(t.encode_ids("a"), (std::vector<TokenId>{0}));
  EXPECT_EQ(t.bos_id(), 90);
  EXPECT_EQ(t.eos_id(), 91);
}

// ---------------------------------------------------------------------------------- decoders
TEST(TokenizerDecode, SentencePieceStyleDecoderChain) {
  json v = {{"\u2581He", 0}, {"llo", 1}, {"\u2581wor", 2}, {"ld", 3}, {"<0x21>", 4}};
  json dec = {{"type", "Sequence"},
              {"decoders", json::array({{{"type", "Replace"}, {"pattern", {{"String", "\u2581"}}}, {"content", " "}},
                                        {{"type", "ByteFallback"}},
                                        {{"type", "Fuse"}},
                                        {{"type", "Strip"}, {"content", " "}, {"start", 1}, {"stop", 0}}})}};
  auto t = Tokenizer::from_json(tok_json(v, json::array(), nullptr, nullptr, nullptr, dec).dump());
  EXPECT_EQ(t.decode(std::vector<TokenId>{0, 1, 2, 3, 4}), "Hello world!");
  json dec2 = {{"type", "Metaspace"}, {"replacement", "\u2581"}, {"prepend_scheme", "always"}};
  auto t2 = Tokenizer::from_json(tok_json(v, json::array(), nullptr, nullptr, nullptr, dec2).dump());
  EXPECT_EQ(t2.decode(std::vector<TokenId>{0, 1, 2, 3}), "Hello world");
  EXPECT_THROW(t2.decode(std::vector<TokenId>{7}), Error);
}

// ---------------------------------------------------------------------------------- config, errors
TEST(TokenizerConfigTest, ParsesTokensTemplatesAndLimits) {
  json cfg = {{"bos_token", {{"content", "<b>"}, {"lstrip", false}}},
              {"eos_token", "<e>"},
              {"pad_token", nullptr},
              {"add_bos_token", true},
              {"model_max_length", 1e30},
              {"chat_template", json::array({{{"name", "default"}, {"template", "A"}}, {{"name", "tool_use"}, {"template", "B"}}})}};
  TokenizerConfig c = parse_tokenizer_config(cfg.dump(), "tokenizer_config.json");
  EXPECT_EQ(c.bos_token, "<b>");
  EXPECT_EQ(c.eos_token, "<e>");
  EXPECT_FALSE(c.pad_token.has_value());
  EXPECT_EQ(c.add_bos_token, true);
  EXPECT_FALSE(c.add_eos_token.has_value());
  EXPECT_EQ(*c.chat_template(), "A");
  EXPECT_EQ(*c.chat_template("tool_use"), "B");
  EXPECT_EQ(c.chat_template("nope"), nullptr);
  EXPECT_DOUBLE_EQ(*c.model_max_length, 1e30);
  TokenizerConfig s = parse_tokenizer_config(R"({"chat_template": "T"})", "x");
  EXPECT_EQ(*s.chat_template(), "T");
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(TokenizerErrors, NameTheFileAndField) {
  EXPECT_NE(error_of([] { Tokenizer::from_json(R"({"added_tokens": []})"); }).find("model"), std::string::npos);
  json bad_pre = tok_json(char_vocab(), json::array(), {{"type", "Sentencepiece9"}});
  std::string m = error_of([&] { Tokenizer::from_json(bad_pre.dump()); });
  EXPECT_NE(m.find("pre_tokenizer.type"), std::string::npos) << m;
  EXPECT_NE(m.find("Sentencepiece9"), std::string::npos) << m;
  json bad_seq = tok_json(char_vocab(), json::array(),
                          {{"type", "Sequence"}, {"pretokenizers", json::array({{{"type", "Digits"}}, {{"type", "Nope"}}})}});
  m = error_of([&] { Tokenizer::from_json(bad_seq.dump()); });
  EXPECT_NE(m.find("pre_tokenizer.pretokenizers[1].type"), std::string::npos) << m;
  json unigram = tok_json(char_vocab(), json::array());
  unigram["model"]["type"] = "Unigram";
  EXPECT_NE(error_of([&] { Tokenizer::from_json(unigram.dump()); }).find("model.type"), std::string::npos);
  json bad_merge = tok_json(char_vocab(), json::array({"a zz"}));
  EXPECT_NE(error_of([&] { Tokenizer::from_json(bad_merge.dump()); }).find("model.merges[0]"), std::string::npos);
  EXPECT_NE(error_of([] { Tokenizer::from_json("{\"model\": "); }).find("tokenizer.json"), std::string::npos);
  // Unknown special token in the config.
  std::string tj = tok_json(char_vocab(), json::array()).dump();
  m = error_of([&] { Tokenizer::from_json(tj, R"({"bos_token": "<nope>"})", "dir/tokenizer.json"); });
  EXPECT_NE(m.find("dir/tokenizer_config.json: bos_token"), std::string::npos) << m;
  // Invalid UTF-8 input.
  auto t = Tokenizer::from_json(tj);
  m = error_of([&] { t.encode("ab\xC3(x"); });
  EXPECT_NE(m.find("UTF-8"), std::string::npos) << m;
  EXPECT_NE(m.find("byte 2"), std::string::npos) << m;
  EXPECT_NE(error_of([] { Tokenizer::load_dir("/nonexistent-dir"); }).find("tokenizer.json"), std::string::npos);
}

TEST(Utf8, ValidationAndLossyDecoding) {
  EXPECT_EQ(utf8::first_invalid("abc\u00E9\U0001F600"), std::string::npos);
  EXPECT_EQ(utf8::first_invalid("\xC0\xAF"), 0u);           // overlong
  EXPECT_EQ(utf8::first_invalid("a\xED\xA0\x80"), 1u);      // surrogate
  EXPECT_EQ(utf8::first_invalid("ab\xF4\x90\x80\x80"), 2u);  // > U+10FFFF
  EXPECT_EQ(utf8::lossy("a\xE2\x82z"), "a\uFFFDz");         // truncated sequence: one U+FFFD
  EXPECT_EQ(utf8::lossy("\xFF\xFE"), "\uFFFD\uFFFD");
}

// ---------------------------------------------------------------------------------- real tokenizer
std::string oracle_model(const char* name) {
  return std::string(ATLAS_SOURCE_DIR) + "/tools/oracle-js/node_modules/@lenml/tokenizer-" + name + "/models";
}

TEST(TokenizerReal, DeepSeekV3RoundTripAndBos) {
  std::string dir = oracle_model("deepseek_v3");
  if (!std::filesystem::exists(dir + "/tokenizer.json")) GTEST_SKIP() << "npm oracle not installed (tools/dev deps)";
  auto t = Tokenizer::load_dir(dir);
  for (std::string s : {"Hello, world!", "  leading and trailing  ", "中文和English混合 123456", "emoji 👨‍👩‍👧 e\u0301",
                        "tabs\tand\r\nCRLF", "<｜end▁of▁sentence｜> inside"}) {
    Encoding e = t.encode(s);
    EXPECT_EQ(t.decode(e.ids), s);
    ASSERT_EQ(e.offsets.size(), e.ids.size());
  }
  ASSERT_TRUE(t.bos_id().has_value());
  std::vector<TokenId> ids = t.encode_ids("hi", {.add_special_tokens = true});
  EXPECT_EQ(ids.front(), *t.bos_id());
  EXPECT_EQ(t.decode(ids, {.skip_special_tokens = true}), "hi");
  ASSERT_NE(t.config().chat_template(), nullptr);
}

}  // namespace
}  // namespace atlas
