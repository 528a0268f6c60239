// Files: whole-file reads, and writes that never leave a partial output behind.
#pragma once

#include <cstdio>
#include <string>
#include <string_view>

namespace atlas {

std::string read_file(const std::string& path);  // throws atlas::Error naming the path
bool file_exists(const std::string& path);

// Writes to "PATH.tmp-PID" and renames onto PATH in commit(). If the writer is destroyed
// without commit() (an exception unwound past it), the temporary file is removed, so a
// failed command leaves no output file at all.
class AtomicFile {
 public:
  explicit AtomicFile(std::string path);
  ~AtomicFile();
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;

  void write(const void* data, size_t n);
  void write(std::string_view s) { write(s.data(), s.size()); }
  void flush();
  void commit();
  FILE* stream() { return f_; }
  const std::string& path() const { return path_; }

 private:
  std::string path_, tmp_;
  FILE* f_ = nullptr;
  bool committed_ = false;
};

// Convenience: atomically replace PATH with CONTENT.
void write_file_atomic(const std::string& path, std::string_view content);

// Paths recorded relative to a directory (a protocol's, a manifest's, an artifact's):
// `path` as found from `base_dir`: unchanged when empty or absolute, else base_dir / path, normalized.
std::string path_from(const std::string& base_dir, const std::string& path);
// `path` relative to `dir`, both taken absolute and normalized ("" where there is no such path).
std::string path_relative_to(const std::string& path, const std::string& dir);

}  // namespace atlas
