// atlas render: a chat (JSON messages) through the model's chat template, exactly as
// transformers' apply_chat_template(tokenize=False) renders it.
//
//   atlas render --model DIR --messages chat.json [--add-generation-prompt]
//   atlas render --model DIR --messages chat.json --ids       ({"ids": [...]}: the rendered text
//                                                             tokenized with special tokens parsed
//                                                             and no BOS added: the template wrote it)
//   atlas render --model DIR --messages-jsonl cases.jsonl     (batch: one JSON result per line)
#include <cstdio>
#include <iostream>

#include "cli/command.h"
#include "core/file.h"
#include "core/json.h"
#include "text/chat.h"

// The tokenizer lives in its own part of src/text; --ids needs it and reports its absence otherwise.
#if __has_include("text/tokenizer.h")
#include "text/tokenizer.h"
#define ATLAS_RENDER_HAS_TOKENIZER 1
#endif

namespace {

// Messages keep their key order (tojson prints keys in file order, as Python does).
atlas::ojson parse_ordered(const std::string& text, const std::string& file) {
  try {
    return atlas::ojson::parse(text);
  } catch (const atlas::ojson::parse_error& e) {
    atlas::fail(file, "", std::string("malformed JSON: ") + e.what());
  }
}

struct RenderArgs {
  std::string model, messages, messages_jsonl, template_file, template_name = "default", vars;
  bool add_generation_prompt = false, ids = false;
};

struct LoadedTemplate {
  atlas::ChatTemplate tmpl;
  atlas::ChatOptions base;
};

LoadedTemplate load(const RenderArgs& a) {
  // The model's template and variables come from the one loader that generate and probe freeze
  // use too (text/chat.h); --template only swaps the template text.
  atlas::ChatTemplateSource src;
  if (!a.template_file.empty()) {
    src.text = atlas::read_file(a.template_file);
    src.origin = a.template_file;
    if (!a.model.empty()) src.vars = atlas::chat_template_variables(a.model);
  } else {
    src = atlas::load_chat_template(a.model, a.template_name);
  }
  atlas::ChatOptions base = src.vars;
  base.add_generation_prompt = a.add_generation_prompt;
  if (!a.vars.empty()) {
    atlas::ojson v = parse_ordered(a.vars, "--vars");
    if (!v.is_object()) atlas::fail("--vars", "", "expected a JSON object");
    for (auto it = v.begin(); it != v.end(); ++it) base.extra[it.key()] = it.value();
  }
  return {atlas::ChatTemplate(src.text, src.origin), base};
}

// A messages file holds a list, or an object with "messages" (and optionally
// "add_generation_prompt" and further template variables under "kwargs").
void split_case(const atlas::ojson& j, const std::string& file, const atlas::ChatOptions& base, atlas::ojson& messages,
                atlas::ChatOptions& opt) {
  opt = base;
  auto check_list = [&](const atlas::ojson& m) {
    if (!m.is_array()) atlas::fail(file, "messages", "expected a JSON list of messages");
    for (size_t i = 0; i < m.size(); ++i)
      if (!m[i].is_object())
        atlas::fail(file, "messages[" + std::to_string(i) + "]", "expected an object like {\"role\": ..., \"content\": ...}");
  };
  if (j.is_array()) {
    check_list(j);
    messages = j;
    return;
  }
  if (!j.is_object() || !j.contains("messages"))
    atlas::fail(file, "messages", "expected a JSON list of messages or an object with \"messages\"");
  check_list(j["messages"]);
  messages = j["messages"];
  if (j.contains("add_generation_prompt")) {
    if (!j["add_generation_prompt"].is_boolean()) atlas::fail(file, "add_generation_prompt", "expected a boolean");
    opt.add_generation_prompt = j["add_generation_prompt"].get<bool>();
  }
  if (j.contains("kwargs")) {
    if (!j["kwargs"].is_object()) atlas::fail(file, "kwargs", "expected an object");
    for (auto it = j["kwargs"].begin(); it != j["kwargs"].end(); ++it) opt.extra[it.key()] = it.value();
  }
}

void run(const RenderArgs& a) {
  LoadedTemplate t = load(a);
  if (!a.messages_jsonl.empty()) {
    // Batch mode for conformance tests: each line renders independently; a template error
    // becomes {"error": "..."} on that line so error paths can be compared too.
    std::string text = atlas::read_file(a.messages_jsonl), out;
    size_t pos = 0;
    int line_no = 0;
    while (pos < text.size()) {
      size_t e = text.find('\n', pos);
      std::string line = text.substr(pos, e == std::string::npos ? std::string::npos : e - pos);
      pos = e == std::string::npos ? text.size() : e + 1;
      ++line_no;
      if (line.empty()) continue;
      std::string where = a.messages_jsonl + ":" + std::to_string(line_no);
      atlas::ojson messages;
      atlas::ChatOptions opt;
      split_case(parse_ordered(line, where), where, t.base, messages, opt);
      try {
        out += atlas::json(t.tmpl.apply(messages, opt)).dump() + "\n";
      } catch (const atlas::Error& err) {
        out += atlas::json{{"error", err.what()}}.dump() + "\n";
      }
    }
    std::fwrite(out.data(), 1, out.size(), stdout);
    return;
  }
  atlas::ojson messages;
  atlas::ChatOptions opt;
  split_case(parse_ordered(atlas::read_file(a.messages), a.messages), a.messages, t.base, messages, opt);
  std::string s;
  try {
    s = t.tmpl.apply(messages, opt);
  } catch (const atlas::Error& e) {
    // The template decides which fields a message needs (as in transformers): its error names
    // the template's line and column; this names the messages it failed on too.
    atlas::fail(a.messages, {}, std::string("the chat template failed on these messages: ") + e.what());
  }
  if (a.ids) {
#ifdef ATLAS_RENDER_HAS_TOKENIZER
    if (a.model.empty()) atlas::fail("render", "--ids", "needs --model DIR with tokenizer.json");
    atlas::Tokenizer tok = atlas::Tokenizer::load_dir(a.model);
    // add_special_tokens = false: the template already wrote BOS; special-token strings in the
    // text are still matched as single tokens.
    std::vector<atlas::TokenId> ids = tok.encode_ids(s, {.add_special_tokens = false});
    std::string out = "{\"ids\": [";
    for (size_t i = 0; i < ids.size(); ++i) out += (i ? ", " : "") + std::to_string(ids[i]);
    out += "]}\n";
    std::fwrite(out.data(), 1, out.size(), stdout);
    return;
#else
    atlas::fail("render", "--ids", "this build has no tokenizer (src/text/tokenizer.h)");
#endif
  }
  std::fwrite(s.data(), 1, s.size(), stdout);  // exactly the rendered text, no newline added
}

atlas::cli::Registrar reg{{
    .name = "render",
    .help = "Render chat messages through a model's chat template (as HF apply_chat_template)",
    .setup =
        [](CLI::App& app) {
          static RenderArgs a;
          app.add_option("--model", a.model, "Directory holding tokenizer_config.json");
          auto* m = app.add_option("--messages", a.messages,
                                   "JSON file: a list of {role, content} or {\"messages\": [...]}");
          auto* b = app.add_option("--messages-jsonl", a.messages_jsonl,
                                   "Batch: one case per line (list, or {messages, add_generation_prompt, kwargs}); "
                                   "prints one JSON string (or {\"error\"}) per line");
          m->excludes(b);
          app.add_flag("--add-generation-prompt", a.add_generation_prompt, "Append the assistant prompt");
          app.add_flag("--ids", a.ids, "Print the token ids of the rendered text as {\"ids\": [...]} (no BOS added)")
              ->excludes(b);
          app.add_option("--template", a.template_file, "Template file to use instead of the model's");
          app.add_option("--template-name", a.template_name, "Named template when the config holds several")
              ->capture_default_str();
          app.add_option("--vars", a.vars, "Extra template variables as a JSON object (tools, enable_thinking, ...)");
          app.callback([] {
            if (a.messages.empty() && a.messages_jsonl.empty())
              atlas::fail("render", "--messages", "required (or --messages-jsonl)");
            if (a.model.empty() && a.template_file.empty())
              atlas::fail("render", "--model", "required (or --template FILE)");
            run(a);
          });
        },
}};

}  // namespace
