// atlas detokenize: token ids -> text (the tokenizer's decoder), printed with a trailing newline.
#include <cstdio>
#include <string>
#include <vector>

#include "cli/command.h"
#include "core/error.h"
#include "text/tokenizer.h"

namespace {

std::vector<atlas::TokenId> parse_ids(const std::string& s) {
  std::vector<atlas::TokenId> ids;
  size_t at = 0;
  while (at <= s.size()) {
    size_t comma = s.find(',', at);
    if (comma == std::string::npos) comma = s.size();
    std::string item = s.substr(at, comma - at);
    size_t b = item.find_first_not_of(" \t"), e = item.find_last_not_of(" \t");
    if (b == std::string::npos) {
      if (s.find_first_not_of(" \t") == std::string::npos) break;  // "" -> no ids
      atlas::fail("", "--ids", "empty item in '" + s + "'");
    }
    item = item.substr(b, e - b + 1);
    size_t used = 0;
    long long v = 0;
    try {
      v = std::stoll(item, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used != item.size() || v < 0 || v > INT32_MAX) atlas::fail("", "--ids", "'" + item + "' is not a token id");
    ids.push_back(atlas::TokenId(v));
    at = comma + 1;
  }
  return ids;
}

atlas::cli::Registrar reg{{
    .name = "detokenize",
    .help = "Decode comma-separated token ids with a model's tokenizer.json",
    .setup =
        [](CLI::App& app) {
          static std::string model, ids;
          static bool skip = false;
          app.add_option("--model", model, "Directory holding tokenizer.json (+ tokenizer_config.json)")->required();
          app.add_option("--ids", ids, "Token ids, e.g. 1,2,3")->required();
          app.add_flag("--skip-special", skip, "Leave out special tokens (skip_special_tokens=True)");
          app.callback([] {
            auto tok = atlas::Tokenizer::load_dir(model);
            std::string text = tok.decode(parse_ids(ids), {.skip_special_tokens = skip});
            std::printf("%s\n", text.c_str());
          });
        },
}};

}  // namespace
