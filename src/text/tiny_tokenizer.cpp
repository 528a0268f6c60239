#include "text/tiny_tokenizer.h"

#include <filesystem>
#include <map>
#include <vector>

#include "core/error.h"
#include "core/file.h"
#include "core/json.h"
#include "text/tokenizer.h"
#include "text/unicode.h"

namespace atlas {

namespace {

// Merges are learned from this text (written for atlas). It only has to make common English
// words a few tokens long; anything else still encodes, byte by byte.
constexpr const char* kTrainingText = R"(The quick brown fox jumps over the lazy dog. The dog was not amused, and the fox ran away into the forest.
A language model reads text as a sequence of tokens. Each token is a small piece of a word, a whole word, or a single byte.
The tokenizer turns the text into numbers, the model turns the numbers into a distribution over the next token, and the
sampler picks one of them. When the model is small, the text it writes is not very good, but it is still text.
In the beginning there was the word, and the word was split into bytes, and the bytes were merged into pairs.
The most frequent pair of symbols is merged first. Then the counts are updated and the next pair is merged, again and again,
until there are enough tokens in the vocabulary. This is byte pair encoding, and it is how most models see the world.
What is the capital of France? The capital of France is Paris. What is two plus two? Two plus two is four.
Please answer the question in one sentence. I think that the answer is yes, but I am not sure that it is right.
She said that they would come back in the morning, when the weather was better and the roads were open again.
There are many experts in a mixture of experts model, and a router chooses which experts see each token.
Every layer has attention and a feed forward network. The attention looks at the tokens that came before.
It was the best of times, it was the worst of times, it was the age of wisdom, it was the age of foolishness.
We hold these truths to be self evident, that all people are created equal, with certain rights and duties.
Numbers like 1, 2, 3, 10, 42, 100, 2024 and 3.14 are split into groups of at most three digits.
User: Hello, who are you?
Assistant: I am a helpful assistant. How can I help you today?
User: Tell me a short story about a cat.
Assistant: Once upon a time, a small cat lived in a quiet house near the sea. Every morning she watched the boats,
and every evening she waited for the fishermen to come home with their nets full of fish.
The results are reported in a table, with the mean, the standard deviation and the number of runs for each setting.
If the input is the same, the output must be the same: every run is deterministic, and every file records where it came from.
)";

constexpr int kMaxMerges = kTinyTokenizerBos - 256;  // ids 256..999

// DeepSeek-V3's pre-tokenizer patterns (the tokenizer's own configuration data).
json deepseek_pre_tokenizer() {
  auto mk = [](const std::string& re) {
    return json{{"type", "Split"}, {"pattern", {{"Regex", re}}}, {"behavior", "Isolated"}, {"invert", false}};
  };
  return {{"type", "Sequence"},
          {"pretokenizers",
           json::array({mk(R"(\p{N}{1,3})"), mk("[\u4e00-\u9fa5\u3040-\u309f\u30a0-\u30ff]+"),
                        mk("[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+| "
                           "?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+"),
                        {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true}, {"use_regex", false}}})}};
}

// GPT-2 byte alphabet: printable Latin-1 bytes as themselves, the rest shifted to U+0100...
std::vector<std::string> byte_alphabet() {
  std::vector<std::string> a(256);
  int shifted = 0;
  for (int b = 0; b < 256; ++b) {
    bool printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
    utf8::append(a[size_t(b)], printable ? char32_t(b) : char32_t(256 + shifted++));
  }
  return a;
}

ojson added_token(int id, const char* content) {
  return ojson{{"id", id},          {"content", content}, {"single_word", false}, {"lstrip", false},
               {"rstrip", false},   {"normalized", false}, {"special", true}};
}

const char* kBos = "<\xEF\xBD\x9C" "begin\xE2\x96\x81of\xE2\x96\x81sentence\xEF\xBD\x9C>";  // <｜begin▁of▁sentence｜>
const char* kEos = "<\xEF\xBD\x9C" "end\xE2\x96\x81of\xE2\x96\x81sentence\xEF\xBD\x9C>";    // <｜end▁of▁sentence｜>

ojson build_tokenizer_json() {
  const std::vector<std::string> alpha = byte_alphabet();
  std::vector<std::string> tok_text(alpha);  // token text by id

  // Words of the training text, as the DeepSeek pre-tokenizer cuts them, with their counts.
  json boot_vocab = json::object();
  for (int b = 0; b < 256; ++b) boot_vocab[alpha[size_t(b)]] = b;
  json boot = {{"model", {{"type", "BPE"}, {"vocab", boot_vocab}, {"merges", json::array()}}},
               {"pre_tokenizer", deepseek_pre_tokenizer()}};
  Tokenizer bootstrap = Tokenizer::from_json(boot.dump(), {}, "tiny tokenizer bootstrap");
  std::map<std::string, int> word_count;
  for (auto& [w, span] : bootstrap.pre_tokenize(kTrainingText)) ++word_count[w];
  std::vector<std::vector<int>> words;
  std::vector<int> counts;
  for (auto& [w, c] : word_count) {
    std::vector<int> ids;
    for (unsigned char ch : w) ids.push_back(ch);
    words.push_back(std::move(ids));
    counts.push_back(c);
  }

  // Byte pair training: merge the most frequent adjacent pair (ties: smallest ids), repeat.
  ojson merges = ojson::array();
  for (int m = 0; m < kMaxMerges; ++m) {
    std::map<std::pair<int, int>, int> pairs;
    for (size_t w = 0; w < words.size(); ++w)
      for (size_t k = 0; k + 1 < words[w].size(); ++k) pairs[{words[w][k], words[w][k + 1]}] += counts[w];
    std::pair<int, int> best{-1, -1};
    int best_count = 1;  // a pair seen once is not worth a token
    for (auto& [p, c] : pairs)
      if (c > best_count) best = p, best_count = c;
    if (best.first < 0) break;
    int id = int(tok_text.size());
    tok_text.push_back(tok_text[size_t(best.first)] + tok_text[size_t(best.second)]);
    merges.push_back(tok_text[size_t(best.first)] + " " + tok_text[size_t(best.second)]);
    for (auto& w : words) {
      std::vector<int> out;
      for (size_t k = 0; k < w.size(); ++k) {
        if (k + 1 < w.size() && w[k] == best.first && w[k + 1] == best.second) {
          out.push_back(id);
          ++k;
        } else {
          out.push_back(w[k]);
        }
      }
      w = std::move(out);
    }
  }

  ojson vocab = ojson::object();
  for (size_t id = 0; id < tok_text.size(); ++id) vocab[tok_text[id]] = id;
  ojson model = {{"type", "BPE"},        {"dropout", nullptr},        {"unk_token", nullptr},
                 {"continuing_subword_prefix", nullptr}, {"end_of_word_suffix", nullptr}, {"fuse_unk", false},
                 {"byte_fallback", false}, {"ignore_merges", false}, {"vocab", vocab}, {"merges", merges}};
  ojson byte_level = {{"type", "ByteLevel"}, {"add_prefix_space", true}, {"trim_offsets", false}, {"use_regex", true}};
  return ojson{{"version", "1.0"},
               {"truncation", nullptr},
               {"padding", nullptr},
               {"added_tokens", ojson::array({added_token(kTinyTokenizerBos, kBos), added_token(kTinyTokenizerEos, kEos)})},
               {"normalizer", {{"type", "Sequence"}, {"normalizers", ojson::array()}}},
               {"pre_tokenizer", ojson::parse(deepseek_pre_tokenizer().dump())},
               {"post_processor", byte_level},
               {"decoder", byte_level},
               {"model", model}};
}

// DeepSeek-V2(-Lite)-Chat's chat template, verbatim from its tokenizer_config.json (model metadata).
constexpr const char* kDeepSeekV2ChatTemplate =
    "{% if not add_generation_prompt is defined %}{% set add_generation_prompt = false %}{% endif %}"
    "{{ bos_token }}{% for message in messages %}{% if message['role'] == 'user' %}"
    "{{ 'User: ' + message['content'] + '\n\n' }}{% elif message['role'] == 'assistant' %}"
    "{{ 'Assistant: ' + message['content'] + eos_token }}{% elif message['role'] == 'system' %}"
    "{{ message['content'] + '\n\n' }}{% endif %}{% endfor %}{% if add_generation_prompt %}"
    "{{ 'Assistant:' }}{% endif %}";

}  // namespace

std::string tiny_tokenizer_json() { return build_tokenizer_json().dump(1) + "\n"; }

std::string tiny_tokenizer_config_json() {
  auto tok = [](const char* content) {
    return ojson{{"__type", "AddedToken"}, {"content", content}, {"lstrip", false},
                 {"normalized", true},      {"rstrip", false},    {"single_word", false}};
  };
  ojson c = {{"add_bos_token", true},
             {"add_eos_token", false},
             {"bos_token", tok(kBos)},
             {"clean_up_tokenization_spaces", false},
             {"eos_token", tok(kEos)},
             {"legacy", true},
             {"model_max_length", 4096},
             {"pad_token", tok(kEos)},
             {"unk_token", nullptr},
             {"tokenizer_class", "LlamaTokenizerFast"},
             {"chat_template", kDeepSeekV2ChatTemplate}};
  return c.dump(2) + "\n";
}

void write_tiny_tokenizer(const std::string& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) fail(dir, "", "cannot create directory: " + ec.message());
  std::string tj = tiny_tokenizer_json(), tc = tiny_tokenizer_config_json();
  write_file_atomic(dir + "/tokenizer.json", tj);
  write_file_atomic(dir + "/tokenizer_config.json", tc);
}

}  // namespace atlas
