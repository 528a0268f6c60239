// Offsets after normalization: where each normalized character comes from, by Hugging Face's
// NormalizedString rules (as its documentation states them; the expected spans below are worked
// out by hand from those rules, not taken from atlas):
//   * a transformed character with change 0 takes the span of the input character it replaces,
//     and change -n also removes the n input characters after it;
//   * an inserted character (+1) takes the span of the input character before it;
//   * decompositions: the first character replaces, the rest are inserted; reordering carries
//     the changes along; a composition of x and y carries x + y - 1;
//   * a token's span runs from its first byte's start to its last byte's end.
// The tokenizer here is byte-level with no merges, so every normalized byte is one token and
// the offsets show the alignment of every normalized character.
#include <gtest/gtest.h>

#include "core/json.h"
#include "text/tokenizer.h"
#include "text/unicode.h"

namespace atlas {
namespace {

json byte_vocab() {
  json v = json::object();
  int shifted = 0;
  for (int b = 0; b < 256; ++b) {
    bool printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
    std::string s;
    utf8::append(s, printable ? char32_t(b) : char32_t(256 + shifted++));
    v[s] = b;
  }
  return v;
}

Tokenizer bytes_with(json norm, json pre = {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", false}},
                     json post = nullptr) {
  json model = {{"type", "BPE"}, {"vocab", byte_vocab()}, {"merges", json::array()}};
  json j = {{"version", "1.0"}, {"added_tokens", json::array()}, {"normalizer", norm}, {"pre_tokenizer", pre},
            {"post_processor", post}, {"decoder", nullptr}, {"model", model}};
  return Tokenizer::from_json(j.dump());
}

struct Aligned {
  std::string normalized;     // the text the model saw
  std::vector<Span> per_char; // span of each normalized character, in code points of the input
};

// Reads the encoding back as (normalized text, span per normalized character), checking that
// every byte of a character carries the same span.
Aligned aligned(const Tokenizer& t, const std::string& text) {
  Encoding e = t.encode(text);
  Aligned a;
  for (TokenId id : e.ids) a.normalized.push_back(char(id));
  size_t k = 0;
  while (k < a.normalized.size()) {
    size_t len = utf8::sequence_length(a.normalized, k);
    EXPECT_GT(len, 0u) << "normalized text is not UTF-8";
    if (len == 0) break;
    for (size_t q = 1; q < len; ++q) EXPECT_EQ(e.offsets[k + q], e.offsets[k]) << "bytes of one character differ";
    a.per_char.push_back(e.offsets[k]);
    k += len;
  }
  return a;
}

using Spans = std::vector<Span>;

TEST(TokenizerAlignment, NfcCompositionKeepsTheBaseCharactersSpan) {
  auto t = bytes_with({{"type", "NFC"}});
  // a + U+0308 compose into ä (change -1: a's span, the diaeresis removed); U+0301 has no
  // composite with ä and stays, with its own span. (The Qwen3 conformance case.)
  Aligned a = aligned(t, "a\u0308\u0301");
  EXPECT_EQ(a.normalized, "\u00E4\u0301");
  EXPECT_EQ(a.per_char, (Spans{{0, 1}, {2, 3}}));
  // Precomposed input stays as it is.
  a = aligned(t, "x\u00E9y");
  EXPECT_EQ(a.normalized, "x\u00E9y");
  EXPECT_EQ(a.per_char, (Spans{{0, 1}, {1, 2}, {2, 3}}));
  // Decomposed e + acute between two letters: é takes e's span, y keeps its own.
  a = aligned(t, "xe\u0301y");
  EXPECT_EQ(a.normalized, "x\u00E9y");
  EXPECT_EQ(a.per_char, (Spans{{0, 1}, {1, 2}, {3, 4}}));
  // Conjoining jamo compose twice (L+V, then LV+T): change -2 on the L's span.
  a = aligned(t, "\u1112\u1161\u11AB!");
  EXPECT_EQ(a.normalized, "\uD55C!");
  EXPECT_EQ(a.per_char, (Spans{{0, 1}, {3, 4}}));
}

TEST(TokenizerAlignment, NfdInsertsAndReorders) {
  auto t = bytes_with({{"type", "NFD"}});
  // é -> e (replaces) + U+0301 (inserted: the span of the character before it, é).
  Aligned a = aligned(t, "\u00E9t");
  EXPECT_EQ(a.normalized, "e\u0301t");
  EXPECT_EQ(a.per_char, (Spans{{0, 1}, {0, 1}, {1, 2}}));
  // q + dot above (230) + dot below (220): reordering swaps the marks but each keeps change 0,
  // so the first mark slot takes the first mark's span: dot below gets span 1, dot above span 2.
  a = aligned(t, "q\u0307\u0323");
  EXPECT_EQ(a.normalized, "q\u0323\u0307");
  EXPECT_EQ(a.per_char, (Spans{{0, 1}, {1, 2}, {2, 3}}));
  // A Hangul syllable becomes L V T, all on the syllable's span.
  a = aligned(t, "\uD55C");
  EXPECT_EQ(a.normalized, "\u1112\u1161\u11AB");
  EXPECT_EQ(a.per_char, (Spans{{0, 1}, {0, 1}, {0, 1}}));
}

TEST(TokenizerAlignment, NfkcCompatibilityForms) {
  auto t = bytes_with({{"type", "NFKC"}});
  // The ligature U+FB01 -> f (replaces) i (inserted): both on the ligature's span.
  Aligned a = aligned(t, "x\uFB01");
  EXPECT_EQ(a.normalized, "xfi");
  EXPECT_EQ(a.per_char, (Spans{{0, 1}, {1, 2}, {1, 2}}));
  // Full-width letters map one to one.
  a = aligned(t, "\uFF21\uFF22");
  EXPECT_EQ(a.normalized, "AB");
  EXPECT_EQ(a.per_char, (Spans{{0, 1}, {1, 2}}));
  // Half-width katakana KA + half-width voiced mark: NFKD gives U+30AB U+3099, which compose
  // across the two input characters into U+30AC (change -1: KA's span).
  a = aligned(t, "\uFF76\uFF9E");
  EXPECT_EQ(a.normalized, "\u30AC");
  EXPECT_EQ(a.per_char, (Spans{{0, 1}}));
  // NFKD of the ligature: the same two characters as NFKC.
  a = aligned(bytes_with({{"type", "NFKD"}}), "\uFB01");
  EXPECT_EQ(a.normalized, "fi");
  EXPECT_EQ(a.per_char, (Spans{{0, 1}, {0, 1}}));
}

TEST(TokenizerAlignment, LowercaseReplacePrependStrip) {
  // U+0130 lowercases to two characters (i + U+0307, Rust's char::to_lowercase): the second is inserted.
  Aligned a = aligned(bytes_with({{"type", "Lowercase"}}), "\u0130A");
  EXPECT_EQ(a.normalized, "i\u0307a");
  EXPECT_EQ(a.per_char, (Spans{{0, 1}, {0, 1}, {1, 2}}));
  // Replace removes the match and inserts the content: the content takes the span of the
  // match's last character.
  a = aligned(bytes_with({{"type", "Replace"}, {"pattern", {{"String", "aa"}}}, {"content", "b"}}), "aaac");
  EXPECT_EQ(a.normalized, "bac");
  EXPECT_EQ(a.per_char, (Spans{{1, 2}, {2, 3}, {3, 4}}));
  a = aligned(bytes_with({{"type", "Replace"}, {"pattern", {{"Regex", "[0-9]+"}}}, {"content", "<n>"}}), "x12y");
  EXPECT_EQ(a.normalized, "x<n>y");
  EXPECT_EQ(a.per_char, (Spans{{0, 1}, {2, 3}, {2, 3}, {2, 3}, {3, 4}}));
  // Prepend: the prefix takes the first character's span.
  a = aligned(bytes_with({{"type", "Prepend"}, {"prepend", "__"}}), "ab");
  EXPECT_EQ(a.normalized, "__ab");
  EXPECT_EQ(a.per_char, (Spans{{0, 1}, {0, 1}, {0, 1}, {1, 2}}));
  // Strip: the kept characters keep their spans.
  a = aligned(bytes_with({{"type", "Strip"}, {"strip_left", true}, {"strip_right", true}}), "  ab  ");
  EXPECT_EQ(a.normalized, "ab");
  EXPECT_EQ(a.per_char, (Spans{{2, 3}, {3, 4}}));
  // After a two-byte character every trailing space goes too (Hugging Face tokenizers 0.22.2
  // does so; some older versions compared character indices with the byte length).
  a = aligned(bytes_with({{"type", "Strip"}, {"strip_left", false}, {"strip_right", true}}), "\u00E9  ");
  EXPECT_EQ(a.normalized, "\u00E9");
  EXPECT_EQ(a.per_char, (Spans{{0, 1}}));
  // A sequence applies each step to the previous step's alignment.
  json seq = {{"type", "Sequence"}, {"normalizers", json::array({{{"type", "NFD"}}, {{"type", "Lowercase"}}})}};
  a = aligned(bytes_with(seq), "\u00C9X");
  EXPECT_EQ(a.normalized, "e\u0301x");
  EXPECT_EQ(a.per_char, (Spans{{0, 1}, {0, 1}, {1, 2}}));
}

TEST(TokenizerAlignment, PreTokenizerInsertionsTakeTheFirstCharactersSpan) {
  // ByteLevel's prefix space is prepended: it takes the first character's span (no trimming
  // without the ByteLevel post-processor).
  Aligned a = aligned(bytes_with(nullptr, {{"type", "ByteLevel"}, {"add_prefix_space", true}, {"use_regex", false}}), "ab");
  EXPECT_EQ(a.normalized, " ab");
  EXPECT_EQ(a.per_char, (Spans{{0, 1}, {0, 1}, {1, 2}}));
  // Metaspace replaces spaces first, then prepends only if the text does not already start
  // with the replacement.
  json char_model = {{"type", "BPE"}, {"vocab", {{"\u2581", 0}, {"a", 1}, {"b", 2}}}, {"merges", json::array()}};
  auto meta = [&](const char* scheme) {
    json pre = {{"type", "Metaspace"}, {"replacement", "\u2581"}, {"prepend_scheme", scheme}, {"split", false}};
    json j = {{"version", "1.0"}, {"added_tokens", json::array()}, {"normalizer", nullptr}, {"pre_tokenizer", pre},
              {"post_processor", nullptr}, {"decoder", nullptr}, {"model", char_model}};
    return Tokenizer::from_json(j.dump());
  };
  auto t = meta("always");
  Encoding e = t.encode("ab");
  EXPECT_EQ(e.ids, (std::vector<TokenId>{0, 1, 2}));
  EXPECT_EQ(e.offsets, (Spans{{0, 1}, {0, 1}, {1, 2}}));
  e = t.encode(" ab");
  EXPECT_EQ(e.ids, (std::vector<TokenId>{0, 1, 2}));  // one ▁: the space became it, nothing prepended
  EXPECT_EQ(e.offsets, (Spans{{0, 1}, {1, 2}, {2, 3}}));
  e = meta("never").encode("a b");
  EXPECT_EQ(e.ids, (std::vector<TokenId>{1, 0, 2}));
  EXPECT_EQ(e.offsets, (Spans{{0, 1}, {1, 2}, {2, 3}}));
}

TEST(TokenizerAlignment, ByteLevelTrimCountsCharactersAfterConversion) {
  // NFKC turns the ideographic space U+3000 (3 bytes) into ' '. The trimmed span of a token
  // that is just that space: HF trims in code points (after converting the offsets), so the
  // empty span sits after the one character, not inside it.
  json pre = {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", false}};
  json post = {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true}};
  auto t = bytes_with({{"type", "NFKC"}}, pre, post);
  Encoding e = t.encode("a\u3000b");
  ASSERT_EQ(e.ids, (std::vector<TokenId>{'a', ' ', 'b'}));
  EXPECT_EQ(e.offsets, (Spans{{0, 1}, {2, 2}, {2, 3}}));
  EXPECT_EQ(e.byte_offsets, (Spans{{0, 1}, {4, 4}, {4, 5}}));
}

}  // namespace
}  // namespace atlas
