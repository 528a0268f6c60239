// Hugging Face tokenizer.json (+ tokenizer_config.json), loaded and run without Python.
//
// Pipeline, in the order Hugging Face `tokenizers` runs it:
//   added tokens (raw text, longest first) -> normalizer -> added tokens marked normalized
//   -> pre-tokenizer -> BPE model (cached per pre-token) -> post-processor.
// Every token carries its span in the input, in Unicode code points (what HF's Python API
// reports) and in UTF-8 bytes. Both spans are whole code points: a byte-level token that holds
// only part of a multi-byte character reports the span of the whole character, as HF does.
//
//   auto tok = atlas::Tokenizer::load_dir("model/");     // tokenizer.json [+ tokenizer_config.json]
//   atlas::Encoding e = tok.encode("Hello", {.add_special_tokens = true});
//   std::string s = tok.decode(e.ids, {.skip_special_tokens = true});
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace atlas {

using TokenId = int32_t;

// [start, end) of one token in the input text.
struct Span {
  int64_t start = 0, end = 0;
  bool operator==(const Span&) const = default;
};

struct Encoding {
  std::vector<TokenId> ids;
  std::vector<Span> offsets;       // code points of the input; special tokens added by the
                                   // post-processor get {0, 0} like HF
  std::vector<Span> byte_offsets;  // the same spans in UTF-8 bytes
  std::vector<bool> special;       // token is a special added token (or was added by post-processing)
};

struct NamedChatTemplate {
  std::string name;  // "default", "tool_use", ...
  std::string text;
};

// tokenizer_config.json. Every field is optional in the file; absent -> empty / false / nullopt.
struct TokenizerConfig {
  std::optional<std::string> bos_token, eos_token, pad_token, unk_token;  // token text
  std::optional<bool> add_bos_token, add_eos_token;  // nullopt: not in the file (use tokenizer.json's post-processor)
  std::vector<NamedChatTemplate> chat_templates;     // the string form becomes one entry named "default"
  std::optional<double> model_max_length;            // files hold huge sentinels like 1e30: double, not int
  bool clean_up_tokenization_spaces = false;
  std::string tokenizer_class;

  // The template named "default" (or the only one); nullptr when the config has none.
  const std::string* chat_template(std::string_view name = "default") const;
};

struct EncodeOptions {
  // HF's add_special_tokens: run the post-processor (TemplateProcessing), or, when
  // tokenizer_config.json sets add_bos_token / add_eos_token, add those (what transformers'
  // LlamaTokenizerFast does). Special-token strings inside the text are always parsed as tokens.
  bool add_special_tokens = false;
};

struct DecodeOptions {
  bool skip_special_tokens = false;
  // Ids with no token (a model's vocabulary can be larger than its tokenizer's) are an error by
  // default; with this set they are left out, as HF tokenizers' decode does.
  bool skip_unknown_ids = false;
  // transformers' clean_up_tokenization (" ." -> "." ...); off by default so decode stays the
  // exact inverse that `tokenizers` gives.
  bool clean_up_tokenization_spaces = false;
};

class TokenizerImpl;

class Tokenizer {
 public:
  // tokenizer.json only. Malformed file / unknown component type -> atlas::Error naming file and field.
  static Tokenizer load(const std::string& tokenizer_json_path);
  // DIR/tokenizer.json plus DIR/tokenizer_config.json when present. A bos/eos/pad/unk token named
  // in the config that is not in the vocabulary -> atlas::Error naming the field.
  static Tokenizer load_dir(const std::string& dir);
  // From in-memory JSON texts (config may be empty). `origin` names the source in errors.
  static Tokenizer from_json(const std::string& tokenizer_json, const std::string& config_json = {},
                             const std::string& origin = "tokenizer.json");

  Tokenizer(Tokenizer&&) noexcept;
  Tokenizer& operator=(Tokenizer&&) noexcept;
  ~Tokenizer();

  // Invalid UTF-8 in `text` -> atlas::Error.
  Encoding encode(std::string_view text, const EncodeOptions& opt = {}) const;
  std::vector<TokenId> encode_ids(std::string_view text, const EncodeOptions& opt = {}) const {
    return encode(text, opt).ids;
  }
  // Ids outside the vocabulary -> atlas::Error. Invalid UTF-8 produced by byte tokens becomes U+FFFD.
  std::string decode(std::span<const TokenId> ids, const DecodeOptions& opt = {}) const;

  // The pre-tokens the model would see (HF's pre_tokenize_str, after normalization and added-token
  // splitting), each with its span in code points. Byte-level pre-tokens are given as raw text,
  // not in the byte-to-character alphabet. For inspection and tests.
  std::vector<std::pair<std::string, Span>> pre_tokenize(std::string_view text) const;

  std::optional<TokenId> token_to_id(std::string_view token) const;  // vocab or added token
  std::optional<std::string> id_to_token(TokenId id) const;
  bool is_special(TokenId id) const;  // added token with special=true
  size_t vocab_size() const;          // largest id + 1 over vocab and added tokens

  const TokenizerConfig& config() const;
  std::optional<TokenId> bos_id() const;  // config's bos_token resolved to an id
  std::optional<TokenId> eos_id() const;
  std::optional<TokenId> pad_id() const;

 private:
  explicit Tokenizer(std::unique_ptr<TokenizerImpl> impl);
  std::unique_ptr<TokenizerImpl> impl_;
};

// Parses tokenizer_config.json text (`file` names it in errors). Exposed for the template code.
TokenizerConfig parse_tokenizer_config(const std::string& text, const std::string& file);

}  // namespace atlas
