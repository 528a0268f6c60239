#include "probe/corpus.h"

#include <zip.h>
#include <zlib.h>

#include <algorithm>
#include <string_view>

#include "core/error.h"
#include "core/file.h"
#include "core/json.h"
#include "core/sha256.h"

namespace atlas::probe {
namespace {

std::string read_gzip(const std::string& path) {
  if (!file_exists(path)) fail(path, {}, "corpus file not found");
  gzFile f = gzopen(path.c_str(), "rb");
  if (!f) fail(path, {}, "cannot open");
  std::string out;
  char buf[1 << 16];
  for (;;) {
    int n = gzread(f, buf, sizeof buf);
    if (n < 0) {
      int err = 0;
      std::string msg = gzerror(f, &err);
      gzclose(f);
      fail(path, {}, "gzip error: " + msg);
    }
    if (n == 0) break;
    out.append(buf, size_t(n));
  }
  gzclose(f);
  return out;
}

std::string read_zip_member(const std::string& path, const std::string& member) {
  if (!file_exists(path)) fail(path, {}, "corpus archive not found");
  int err = 0;
  zip_t* z = zip_open(path.c_str(), ZIP_RDONLY, &err);
  if (!z) fail(path, {}, "not a readable zip archive (libzip error " + std::to_string(err) + ")");
  zip_stat_t st;
  zip_stat_init(&st);
  if (zip_stat(z, member.c_str(), 0, &st) != 0) {
    zip_close(z);
    fail(path, member, "no such member in the archive");
  }
  zip_file_t* f = zip_fopen(z, member.c_str(), 0);
  if (!f) {
    zip_close(z);
    fail(path, member, "cannot open member");
  }
  std::string out(size_t(st.size), '\0');
  zip_int64_t n = zip_fread(f, out.data(), st.size);
  zip_fclose(f);
  zip_close(z);
  if (n < 0 || uint64_t(n) != st.size) fail(path, member, "short read");
  return out;
}

// Splits on '\n'; a final line without '\n' counts, a trailing empty piece does not.
std::vector<std::string_view> lines_of(const std::string& s) {
  std::vector<std::string_view> out;
  size_t start = 0;
  while (start < s.size()) {
    size_t nl = s.find('\n', start);
    if (nl == std::string::npos) nl = s.size();
    out.emplace_back(s.data() + start, nl - start);
    start = nl + 1;
  }
  return out;
}

std::string where_of(const CorpusSpec& spec, size_t lineno) {
  std::string w = spec.path;
  if (!spec.member.empty()) w += "!" + spec.member;
  return w + ":" + std::to_string(lineno);
}

std::string string_field(const json& j, const std::string& key, const std::string& where) {
  if (!j.is_object()) fail(where, {}, "expected a JSON object");
  if (!j.contains(key)) fail(where, key, "record without the expected field");
  if (!j.at(key).is_string()) fail(where, key, "expected a string");
  return j.at(key).get<std::string>();
}

// JSON-lines records (blank lines skipped but counted for line numbers).
template <class F>
void for_json_lines(const CorpusSpec& spec, const std::string& text, F&& fn) {
  auto lines = lines_of(text);
  int64_t record = 0;
  for (size_t i = 0; i < lines.size(); ++i) {
    std::string_view l = lines[i];
    if (!l.empty() && l.back() == '\r') l.remove_suffix(1);
    if (l.find_first_not_of(" \t") == std::string_view::npos) continue;
    const std::string where = where_of(spec, i + 1);
    json j = parse_json(std::string(l), where);
    fn(j, where, record++);
  }
}

Source make_source(const std::string& domain, std::string id, int64_t record, std::string text, std::string gold = {}) {
  Source s{.domain = domain, .source_id = std::move(id), .record = record, .text = std::move(text),
           .text_sha256 = {}, .gold = std::move(gold)};
  s.text_sha256 = sha256_hex(s.text);
  return s;
}

}  // namespace

bool is_corpus_format(const std::string& f) {
  return f == "humaneval" || f == "gsm8k" || f == "tnews" || f == "wikitext" || f == "inline";
}

bool is_wikitext_heading(const std::string& line) {
  // " = Title = ", " = = Section = = ": after trimming, starts with "= " and ends with " =".
  // (No std::regex: libstdc++'s is recursive and WikiText lines run to thousands of characters.)
  const size_t a = line.find_first_not_of(" \t\r");
  if (a == std::string::npos) return false;
  const size_t b = line.find_last_not_of(" \t\r");
  const std::string_view t(line.data() + a, b - a + 1);
  return t.size() >= 3 && t.substr(0, 2) == "= " && t.substr(t.size() - 2) == " =";
}

Corpus read_corpus(const CorpusSpec& spec) {
  Corpus c{.spec = spec, .file_sha256 = {}, .member_sha256 = {}, .sources = {}};
  const std::string& d = spec.domain;
  if (spec.format == "inline") {
    for (size_t i = 0; i < spec.texts.size(); ++i) c.sources.push_back(make_source(d, std::to_string(i), int64_t(i), spec.texts[i]));
    return c;
  }
  if (!is_corpus_format(spec.format)) fail(spec.path, "format", "unknown corpus format '" + spec.format + "'");
  if (spec.path.empty()) fail("corpora", d, "no path given");
  std::string text;
  if (spec.format == "humaneval") {
    text = read_gzip(spec.path);
  } else if (!spec.member.empty()) {
    text = read_zip_member(spec.path, spec.member);
    c.member_sha256 = sha256_hex(text);
  } else {
    if (!file_exists(spec.path)) fail(spec.path, {}, "corpus file not found");
    text = read_file(spec.path);
  }
  c.file_sha256 = sha256_file(spec.path);

  if (spec.format == "humaneval") {
    for_json_lines(spec, text, [&](const json& j, const std::string& where, int64_t rec) {
      c.sources.push_back(make_source(d, string_field(j, "task_id", where), rec, string_field(j, "prompt", where)));
    });
  } else if (spec.format == "gsm8k") {
    for_json_lines(spec, text, [&](const json& j, const std::string& where, int64_t rec) {
      std::string q = string_field(j, "question", where);
      std::string a = string_field(j, "answer", where);
      size_t p = a.rfind("####");
      if (p == std::string::npos) fail(where, "answer", "no '####' final answer");
      std::string gold = a.substr(p + 4);
      gold.erase(0, gold.find_first_not_of(" \t"));
      gold.erase(gold.find_last_not_of(" \t\r\n") + 1);
      c.sources.push_back(make_source(d, std::to_string(rec), rec, std::move(q), std::move(gold)));
    });
  } else if (spec.format == "tnews") {
    for_json_lines(spec, text, [&](const json& j, const std::string& where, int64_t rec) {
      std::string sentence = string_field(j, "sentence", where);
      std::string id = std::to_string(rec);
      if (j.contains("id")) {
        const json& v = j.at("id");
        if (v.is_number_integer()) id = std::to_string(v.get<int64_t>());
        else if (v.is_string()) id = v.get<std::string>();
        else fail(where, "id", "expected an integer or string");
      }
      std::string label;
      if (j.contains("label")) label = j.at("label").is_string() ? j.at("label").get<std::string>() : j.at("label").dump();
      c.sources.push_back(make_source(d, std::move(id), rec, std::move(sentence), std::move(label)));
    });
  } else if (spec.format == "wikitext") {
    auto lines = lines_of(text);
    for (size_t i = 0; i < lines.size(); ++i)
      c.sources.push_back(make_source(d, std::to_string(i), int64_t(i), std::string(lines[i])));
  }
  // Ids must be unique within a domain: ranking and journals key on them.
  std::vector<std::string> ids;
  for (const auto& s : c.sources) ids.push_back(s.source_id);
  std::sort(ids.begin(), ids.end());
  for (size_t i = 1; i < ids.size(); ++i)
    if (ids[i] == ids[i - 1]) fail(spec.path, "id", "duplicate source id '" + ids[i] + "'");
  return c;
}

}  // namespace atlas::probe
