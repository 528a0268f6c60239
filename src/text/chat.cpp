#include "text/chat.h"

#include "core/file.h"

namespace atlas {

ChatTemplate::ChatTemplate(const std::string& source, const std::string& origin)
    : t_(tmpl::Template::parse(source, origin)) {}

template <class J>
static tmpl::Value messages_value(const J& messages) {
  if (!messages.is_array()) fail("messages", "", "expected a JSON list of messages, got " + std::string(messages.type_name()));
  for (size_t i = 0; i < messages.size(); ++i)
    if (!messages[i].is_object())
      fail("messages", "[" + std::to_string(i) + "]", "expected an object like {\"role\": ..., \"content\": ...}");
  try {
    return tmpl::Value::from_json(messages);
  } catch (const tmpl::RuntimeError& e) {
    fail("messages", "", e.what());
  }
}

std::string ChatTemplate::apply(const json& messages, const ChatOptions& opt) const {
  return render(messages_value(messages), opt);
}
std::string ChatTemplate::apply(const ojson& messages, const ChatOptions& opt) const {
  return render(messages_value(messages), opt);
}

std::string ChatTemplate::render(tmpl::Value messages, const ChatOptions& opt) const {
  tmpl::Variables vars;
  // The keyword arguments transformers passes to template.render().
  if (opt.bos_token) vars["bos_token"] = tmpl::Value(*opt.bos_token);
  if (opt.eos_token) vars["eos_token"] = tmpl::Value(*opt.eos_token);
  vars["tools"] = tmpl::Value::none();
  vars["documents"] = tmpl::Value::none();
  vars["add_generation_prompt"] = tmpl::Value(opt.add_generation_prompt);
  if (!opt.extra.is_null()) {
    if (!opt.extra.is_object()) fail("chat template variables", "", "expected a JSON object");
    for (auto it = opt.extra.begin(); it != opt.extra.end(); ++it) {
      if (it.key() == "messages") continue;
      try {
        vars[it.key()] = tmpl::Value::from_json(it.value());
      } catch (const tmpl::RuntimeError& e) {
        fail("chat template variables", it.key(), e.what());
      }
    }
  }
  vars["messages"] = std::move(messages);
  return t_.render(vars);
}

std::string select_chat_template(const json& field, const std::string& file, std::string_view name) {
  if (field.is_string()) return field.get<std::string>();
  if (!field.is_array()) fail(file, "chat_template", "expected a string or a list of {name, template}");
  std::string names;
  for (size_t i = 0; i < field.size(); ++i) {
    const json& e = field[i];
    std::string where = "chat_template[" + std::to_string(i) + "]";
    if (!e.is_object() || !e.contains("name") || !e["name"].is_string() || !e.contains("template") ||
        !e["template"].is_string())
      fail(file, where, "expected {\"name\": string, \"template\": string}");
    if (e["name"].get<std::string>() == name) return e["template"].get<std::string>();
    names += (names.empty() ? "" : ", ") + e["name"].get<std::string>();
  }
  fail(file, "chat_template", "no template named '" + std::string(name) + "' (have: " + names + ")");
}

std::optional<std::string> special_token_text(const json& config, const std::string& key, const std::string& file) {
  if (!config.is_object() || !config.contains(key) || config[key].is_null()) return std::nullopt;
  const json& v = config[key];
  if (v.is_string()) return v.get<std::string>();
  if (v.is_object() && v.contains("content") && v["content"].is_string()) return v["content"].get<std::string>();
  fail(file, key, "expected a string or an object with a string \"content\"");
}

ChatOptions chat_template_variables(const std::string& model_dir) {
  ChatOptions vars;
  const std::string cfg_path = model_dir + "/tokenizer_config.json";
  if (!file_exists(cfg_path)) return vars;
  const json cfg = read_json_file(cfg_path);
  if (!cfg.is_object()) fail(cfg_path, "", "expected a JSON object");
  vars.bos_token = special_token_text(cfg, "bos_token", cfg_path);
  vars.eos_token = special_token_text(cfg, "eos_token", cfg_path);
  // transformers passes the whole special_tokens_map to the template.
  for (const char* k : {"unk_token", "pad_token", "sep_token", "cls_token", "mask_token"})
    if (auto t = special_token_text(cfg, k, cfg_path)) vars.extra[k] = *t;
  return vars;
}

ChatTemplateSource load_chat_template(const std::string& model_dir, std::string_view name) {
  ChatTemplateSource src{.text = {}, .origin = {}, .vars = chat_template_variables(model_dir)};
  const std::string cfg_path = model_dir + "/tokenizer_config.json";
  const std::string jinja_path = model_dir + "/chat_template.jinja";
  if (name == "default" && file_exists(jinja_path)) {
    src.text = read_file(jinja_path);
    src.origin = jinja_path;
    return src;
  }
  if (file_exists(cfg_path)) {
    const json cfg = read_json_file(cfg_path);
    if (cfg.contains("chat_template") && !cfg["chat_template"].is_null()) {
      src.text = select_chat_template(cfg["chat_template"], cfg_path, name);
      src.origin = cfg_path + ": chat_template";
      return src;
    }
    fail(cfg_path, "chat_template", "missing (and no chat_template.jinja next to it)");
  }
  fail(cfg_path, "chat_template", "file not found (and no chat_template.jinja in " + model_dir + ")");
}

}  // namespace atlas
