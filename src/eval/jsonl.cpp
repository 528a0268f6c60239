#include "eval/jsonl.h"

#include <zlib.h>

#include <cerrno>
#include <cstring>

#include "core/error.h"
#include "core/file.h"

namespace atlas::eval {

std::string read_maybe_gz(const std::string& path) {
  if (!file_exists(path)) fail(path, {}, "cannot open: no such file");
  gzFile f = ::gzopen(path.c_str(), "rb");
  if (!f) fail(path, {}, std::string("cannot open: ") + std::strerror(errno));
  std::string out;
  char buf[1 << 16];
  for (;;) {
    int n = ::gzread(f, buf, sizeof buf);
    if (n < 0) {
      int code = 0;
      std::string msg = ::gzerror(f, &code);
      ::gzclose(f);
      fail(path, {}, "read error: " + msg);
    }
    if (n == 0) break;
    out.append(buf, size_t(n));
  }
  // gzread stops quietly at a truncated gzip stream; gzclose_r then reports Z_BUF_ERROR.
  int rc = ::gzclose_r(f);
  if (rc != Z_OK) fail(path, {}, "truncated or corrupt gzip stream");
  return out;
}

std::vector<JsonLine> read_jsonl(const std::string& path) {
  const std::string text = read_maybe_gz(path);
  std::vector<JsonLine> out;
  size_t start = 0, line = 0;
  while (start < text.size()) {
    size_t end = text.find('\n', start);
    if (end == std::string::npos) end = text.size();
    ++line;
    std::string_view s(text.data() + start, end - start);
    start = end + 1;
    if (s.find_first_not_of(" \t\r") == std::string_view::npos) continue;
    json j = json::parse(s, nullptr, false);
    if (j.is_discarded()) fail(path, line_field(line), "malformed JSON");
    if (!j.is_object()) fail(path, line_field(line), "expected a JSON object");
    out.push_back({.line = line, .value = std::move(j)});
  }
  return out;
}

}  // namespace atlas::eval
