// Chat templates: a list of messages -> the prompt text the model was trained on.
//
// Renders exactly what transformers' tokenizer.apply_chat_template(messages, tokenize=False, ...)
// returns: the template sees `messages`, `add_generation_prompt`, `tools` and `documents`
// (None unless given), the special-token strings (bos_token, eos_token, ... when the tokenizer
// has them) and any extra keyword arguments. Nothing is added around the template's output: in
// particular BOS is never prepended (the DeepSeek templates write {{ bos_token }} themselves), so
// tokenize the result with add_special_tokens = false.
//
//   atlas::ChatTemplate t(cfg.chat_template(), "DIR/tokenizer_config.json");
//   std::string prompt = t.apply(messages, {.bos_token = "<｜begin▁of▁sentence｜>",
//                                           .eos_token = "<｜end▁of▁sentence｜>",
//                                           .add_generation_prompt = true});
#pragma once

#include <optional>
#include <string>
#include <string_view>

#include "core/json.h"
#include "text/template.h"

namespace atlas {

struct ChatOptions {
  // Special-token strings; nullopt leaves the variable undefined (as HF does for a tokenizer
  // without that token, e.g. Qwen's bos_token).
  std::optional<std::string> bos_token, eos_token;
  bool add_generation_prompt = false;
  // Further template variables: tools, documents, enable_thinking, pad_token, date_string...
  // (an object; its keys override the ones above, except `messages`). Ordered, like messages:
  // `tojson` writes keys in insertion order, as Python dicts do.
  ojson extra = ojson::object();
};

class ChatTemplate {
 public:
  // Template syntax errors -> atlas::Error naming `origin`, line and column.
  explicit ChatTemplate(const std::string& source, const std::string& origin = "chat_template");

  // `messages`: an array of objects (normally {"role", "content"}); anything else -> atlas::Error
  // naming the offending element. Template errors (raise_exception included) -> atlas::Error.
  // Pass ojson when the template may print messages with tojson: nlohmann's json sorts keys,
  // Python keeps them in file order.
  std::string apply(const json& messages, const ChatOptions& opt = {}) const;
  std::string apply(const ojson& messages, const ChatOptions& opt = {}) const;

 private:
  std::string render(tmpl::Value messages, const ChatOptions& opt) const;
  tmpl::Template t_;
};

// tokenizer_config.json's "chat_template": a string, or a list of {"name", "template"} from
// which `name` is chosen. Missing name -> atlas::Error listing the available ones.
std::string select_chat_template(const json& field, const std::string& file, std::string_view name = "default");

// A special token in tokenizer_config.json: a string, an AddedToken object ({"content": ...}),
// or null/absent (nullopt).
std::optional<std::string> special_token_text(const json& config, const std::string& key, const std::string& file);

}  // namespace atlas
