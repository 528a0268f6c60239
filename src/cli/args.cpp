#include "cli/args.h"

#include <omp.h>

#include <charconv>
#include <filesystem>

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

std::vector<int32_t> ids_from_json(const json& ids, const std::string& where) {
  if (!ids.is_array()) fail(where, "ids", "expected an array of token ids");
  std::vector<int32_t> out;
  out.reserve(ids.size());
  for (const auto& v : ids) {
    if (!v.is_number_integer() || !json_integer_fits<int32_t>(v) || v.get<int64_t>() < 0)
      fail(where, "ids", "expected non-negative integer token ids, got " + v.dump());
    out.push_back(int32_t(v.get<int64_t>()));
  }
  return out;
}

void check_output_file(const std::string& flag, const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (fs::is_directory(path, ec)) fail(path, flag, "is a directory, expected a file name");
  const fs::path dir = fs::path(path).parent_path();
  if (!dir.empty() && !fs::is_directory(dir, ec)) fail(path, flag, "the directory " + dir.string() + " does not exist");
}

void set_threads(int n) {
  if (n < 0) fail("--threads", {}, "expected 0 (all cores) or a positive count, got " + std::to_string(n));
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
