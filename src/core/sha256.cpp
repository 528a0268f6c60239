#include "core/sha256.h"

#include <openssl/evp.h>
#include <sys/stat.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <vector>

#include "core/error.h"

namespace atlas {

struct Sha256::Impl {
  EVP_MD_CTX* ctx = nullptr;
};

Sha256::Sha256() : impl_(new Impl) {
  impl_->ctx = EVP_MD_CTX_new();
  if (!impl_->ctx || EVP_DigestInit_ex(impl_->ctx, EVP_sha256(), nullptr) != 1)
    fail("sha256: OpenSSL initialisation failed");
}

Sha256::~Sha256() { EVP_MD_CTX_free(impl_->ctx); }

Sha256& Sha256::update(const void* data, size_t n) {
  if (n) EVP_DigestUpdate(impl_->ctx, data, n);
  return *this;
}

std::array<uint8_t, 32> Sha256::digest() {
  std::array<uint8_t, 32> out{};
  unsigned int len = 0;
  EVP_DigestFinal_ex(impl_->ctx, out.data(), &len);
  return out;
}

std::string Sha256::hex() {
  static const char* kHex = "0123456789abcdef";
  auto d = digest();
  std::string s(64, '0');
  for (size_t i = 0; i < 32; ++i) {
    s[2 * i] = kHex[d[i] >> 4];
    s[2 * i + 1] = kHex[d[i] & 15];
  }
  return s;
}

std::string sha256_hex(const void* data, size_t n) { return Sha256().update(data, n).hex(); }

std::string sha256_file(const std::string& path) {
  FILE* f = std::fopen(path.c_str(), "rb");
  if (!f) fail(path, {}, std::string("cannot open: ") + std::strerror(errno));
  struct stat st;  // (fopen opens a directory too; only its reads fail)
  if (::fstat(::fileno(f), &st) == 0 && S_ISDIR(st.st_mode)) {
    std::fclose(f);
    fail(path, {}, "is a directory, expected a file");
  }
  Sha256 h;
  std::vector<char> buf(1 << 20);
  size_t n;
  while ((n = std::fread(buf.data(), 1, buf.size(), f)) > 0) h.update(buf.data(), n);
  bool err = std::ferror(f);
  std::fclose(f);
  if (err) fail(path, {}, "read error");
  return h.hex();
}

}  // namespace atlas

namespace atlas {
std::string ids_sha256(std::span<const int32_t> ids) {
  Sha256 h;
  for (int32_t id : ids) {
    uint32_t u = uint32_t(id);
    uint8_t b[4] = {uint8_t(u), uint8_t(u >> 8), uint8_t(u >> 16), uint8_t(u >> 24)};
    h.update(b, 4);
  }
  return h.hex();
}
}  // namespace atlas
