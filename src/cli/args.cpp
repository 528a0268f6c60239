#include "cli/args.h"

#include <omp.h>

#include <charconv>

#include "core/error.h"

namespace atlas::cli {

std::vector<int32_t> parse_id_list(const std::string& flag, const std::string& text) {
  std::vector<int32_t> ids;
  size_t i = 0;
  while (i <= text.size()) {
    size_t j = text.find(',', i);
    if (j == std::string::npos) j = text.size();
    std::string item = text.substr(i, j - i);
    while (!item.empty() && item.front() == ' ') item.erase(item.begin());
    while (!item.empty() && item.back() == ' ') item.pop_back();
    int64_t v = 0;
    auto [p, ec] = std::from_chars(item.data(), item.data() + item.size(), v);
    if (item.empty() || ec != std::errc() || p != item.data() + item.size() || v < 0 || v > INT32_MAX)
      fail(flag, {}, "expected comma-separated non-negative token ids, got \"" + item + "\"");
    ids.push_back(int32_t(v));
    i = j + 1;
  }
  if (ids.empty()) fail(flag, {}, "no token ids given");
  return ids;
}

void set_threads(int n) {
  if (n > 0) omp_set_num_threads(n);
}

}  // namespace atlas::cli

#include "core/file.h"

namespace atlas::cli {
std::optional<Tokenizer> tokenizer_if_present(const std::string& model_dir) {
  if (!file_exists(model_dir + "/tokenizer.json")) return std::nullopt;
  return Tokenizer::load_dir(model_dir);
}
}  // namespace atlas::cli
