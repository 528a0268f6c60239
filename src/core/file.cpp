#include "core/file.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include "core/error.h"

namespace atlas {

std::string read_file(const std::string& path) {
  FILE* f = std::fopen(path.c_str(), "rb");
  if (!f) fail(path, {}, std::string("cannot open: ") + std::strerror(errno));
  // fopen opens a directory too; only the first read fails (EISDIR): say so plainly.
  struct stat st;
  if (::fstat(::fileno(f), &st) == 0 && S_ISDIR(st.st_mode)) {
    std::fclose(f);
    fail(path, {}, "is a directory, expected a file");
  }
  std::string out;
  char buf[1 << 16];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, f)) > 0) out.append(buf, n);
  const int read_errno = errno;
  bool err = std::ferror(f);
  std::fclose(f);
  if (err) fail(path, {}, std::string("read error: ") + std::strerror(read_errno));
  return out;
}

bool file_exists(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0;
}

AtomicFile::AtomicFile(std::string path) : path_(std::move(path)) {
  tmp_ = path_ + ".tmp-" + std::to_string(::getpid());
  f_ = std::fopen(tmp_.c_str(), "wb");
  if (!f_) fail(path_, {}, std::string("cannot create: ") + std::strerror(errno));
}

AtomicFile::~AtomicFile() {
  if (f_) std::fclose(f_);
  if (!committed_) std::remove(tmp_.c_str());
}

void AtomicFile::write(const void* data, size_t n) {
  if (n && std::fwrite(data, 1, n, f_) != n) fail(path_, {}, std::string("write failed: ") + std::strerror(errno));
}

void AtomicFile::flush() {
  if (std::fflush(f_) != 0) fail(path_, {}, std::string("write failed: ") + std::strerror(errno));
}

void AtomicFile::commit() {
  flush();
  int rc = std::fclose(f_);
  f_ = nullptr;
  if (rc != 0) fail(path_, {}, std::string("write failed: ") + std::strerror(errno));
  if (std::rename(tmp_.c_str(), path_.c_str()) != 0)
    fail(path_, {}, std::string("cannot rename into place: ") + std::strerror(errno));
  committed_ = true;
}

void write_file_atomic(const std::string& path, std::string_view content) {
  AtomicFile f(path);
  f.write(content);
  f.commit();
}

std::string path_from(const std::string& base_dir, const std::string& path) {
  namespace fs = std::filesystem;
  if (path.empty() || fs::path(path).is_absolute()) return path;
  return (fs::path(base_dir) / path).lexically_normal().string();
}

std::string path_relative_to(const std::string& path, const std::string& dir) {
  namespace fs = std::filesystem;
  return fs::absolute(path).lexically_normal().lexically_relative(fs::absolute(dir).lexically_normal()).string();
}

}  // namespace atlas
