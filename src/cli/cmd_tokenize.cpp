// atlas tokenize: text -> token ids and code-point offsets, one JSON object per input.
#include <cstdio>
#include <string>

#include "cli/command.h"
#include "core/error.h"
#include "core/file.h"
#include "core/json.h"
#include "text/tokenizer.h"

namespace {

void append_encoding(std::string& out, const atlas::Encoding& e) {
  out += "{\"ids\": [";
  for (size_t i = 0; i < e.ids.size(); ++i) {
    if (i) out += ", ";
    out += std::to_string(e.ids[i]);
  }
  out += "], \"offsets\": [";
  for (size_t i = 0; i < e.offsets.size(); ++i) {
    if (i) out += ", ";
    out += "[" + std::to_string(e.offsets[i].start) + ", " + std::to_string(e.offsets[i].end) + "]";
  }
  out += "]}\n";
}

atlas::cli::Registrar reg{{
    .name = "tokenize",
    .help = "Encode text with a model's tokenizer.json: one {\"ids\", \"offsets\"} JSON line per input",
    .setup =
        [](CLI::App& app) {
          static std::string model, text, input, field = "text";
          static bool special = false;
          app.add_option("--model", model, "Directory holding tokenizer.json (+ tokenizer_config.json)")->required();
          static CLI::Option* t = nullptr;
          t = app.add_option("--text", text, "Text to encode");
          auto* in = app.add_option("--input", input, "JSONL file: one object per line, text in --field");
          t->excludes(in);
          in->excludes(t);
          app.add_option("--field", field, "Field of each --input line holding the text")->capture_default_str();
          app.add_flag("--special", special,
                       "Add special tokens (BOS/EOS or the post-processor template), like add_special_tokens=True");
          app.callback([] {
            if (t->count() == 0 && input.empty()) atlas::fail("", "--text/--input", "give --text or --input");
            auto tok = atlas::Tokenizer::load_dir(model);
            atlas::EncodeOptions opt{.add_special_tokens = special};
            // Everything is encoded before anything is printed: a bad line leaves no partial output.
            std::string out;
            if (t->count() > 0) {
              append_encoding(out, tok.encode(text, opt));
            } else {
              std::string data = atlas::read_file(input);
              size_t line_no = 0, at = 0;
              while (at < data.size()) {
                size_t nl = data.find('\n', at);
                if (nl == std::string::npos) nl = data.size();
                std::string line = data.substr(at, nl - at);
                at = nl + 1;
                ++line_no;
                if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
                std::string where = input + ":" + std::to_string(line_no);
                atlas::json j = atlas::parse_json(line, where);
                atlas::JsonReader r(j, where);
                std::string s = r.get<std::string>(field);
                try {
                  append_encoding(out, tok.encode(s, opt));
                } catch (const atlas::Error& e) {
                  atlas::fail(where, field, e.what());
                }
              }
            }
            std::fwrite(out.data(), 1, out.size(), stdout);
          });
        },
}};

}  // namespace
