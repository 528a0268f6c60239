// A Jinja2-subset interpreter for Hugging Face chat templates.
//
// Semantics are those of the environment transformers renders chat templates in:
//   jinja2.sandbox.ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
//                                                extensions=[loopcontrols, generation tracker])
// with the globals raise_exception(msg) and namespace(...), and HF's tojson filter
// (json.dumps with ensure_ascii=False). The subset covers the chat templates of DeepSeek-V2/V2.5/V3,
// Llama-3, Qwen and Mistral; anything outside it (extends, include, call blocks, recursive loops,
// unknown filters/tests/methods) is an atlas::Error naming the template line and column, never
// silently different text.
//
//   auto t = atlas::tmpl::Template::parse(source, "tokenizer_config.json:chat_template");
//   std::string s = t.render(vars);   // vars: name -> Value
#pragma once

#include <map>
#include <memory>
#include <string>

#include "text/template_value.h"

namespace atlas::tmpl {

struct Node;  // parsed statement (template_ast.h)

struct TemplateOptions {
  bool trim_blocks = true;     // drop the first newline after a block tag / comment
  bool lstrip_blocks = true;   // strip spaces/tabs before a block tag / comment at line start
  bool keep_trailing_newline = false;
};

using Variables = std::map<std::string, Value, std::less<>>;

class Template {
 public:
  // Syntax errors -> atlas::Error "NAME: line L, column C: what".
  static Template parse(const std::string& source, const std::string& name = "template",
                        const TemplateOptions& opt = {});
  // Runtime errors (raise_exception, undefined attribute of an undefined value, type errors,
  // unsupported filters...) -> atlas::Error naming the template line and column.
  std::string render(const Variables& vars) const;
  const std::string& name() const { return name_; }

 private:
  std::string name_;
  std::shared_ptr<const std::vector<std::unique_ptr<Node>>> body_;
};

}  // namespace atlas::tmpl
