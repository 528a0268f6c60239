// SHA-256 (OpenSSL EVP), hex-encoded. Used for file pins, tensor hashes and hash chains.
#pragma once

#include <cstddef>
#include <cstdint>
#include <array>
#include <memory>
#include <span>
#include <string>
#include <string_view>

namespace atlas {

class Sha256 {
 public:
  Sha256();
  ~Sha256();
  Sha256(const Sha256&) = delete;
  Sha256& operator=(const Sha256&) = delete;
  Sha256& update(const void* data, size_t n);
  Sha256& update(std::string_view s) { return update(s.data(), s.size()); }
  std::string hex();                       // finishes the hash
  std::array<uint8_t, 32> digest();        // finishes the hash

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

std::string sha256_hex(const void* data, size_t n);
inline std::string sha256_hex(std::string_view s) { return sha256_hex(s.data(), s.size()); }
std::string sha256_file(const std::string& path);  // streams the file; throws atlas::Error

}  // namespace atlas

namespace atlas {
// The hash of a token-id sequence used everywhere a prompt is identified (prompt_sha256):
// SHA-256 over the ids as consecutive 4-byte little-endian unsigned integers.
std::string ids_sha256(std::span<const int32_t> ids);
}  // namespace atlas
