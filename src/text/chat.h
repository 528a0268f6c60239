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

// A model directory's chat template and the variables transformers renders it with. The one
// way `atlas render`, `atlas generate` and `atlas probe freeze` find a template, so the three
// render the same text for the same messages.
struct ChatTemplateSource {
  std::string text;    // the template source
  std::string origin;  // where it came from, for errors: "DIR/chat_template.jinja" or "DIR/tokenizer_config.json: chat_template"
  ChatOptions vars;    // bos_token, eos_token, and unk/pad/sep/cls/mask_token in `extra` (all
                       // that the config names), add_generation_prompt false
};

// The special-token variables of DIR/tokenizer_config.json (none when the file is absent).
// A token that is neither a string nor {"content": string} -> atlas::Error naming the field.
ChatOptions chat_template_variables(const std::string& model_dir);

// The template as transformers finds it: DIR/chat_template.jinja when present (the file
// transformers writes since 4.47, and prefers), else tokenizer_config.json's "chat_template" (a
// string, or the entry `name` of a list of named templates). A `name` other than "default"
// always comes from the list. Neither present -> atlas::Error naming the config's chat_template.
ChatTemplateSource load_chat_template(const std::string& model_dir, std::string_view name = "default");

}  // namespace atlas
