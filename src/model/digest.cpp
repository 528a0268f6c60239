#include "model/digest.h"

#include <algorithm>
#include <bit>

#include "core/error.h"
#include "core/sha256.h"

namespace atlas {

// The definition names little-endian bytes; on a little-endian host that is the memory image.
static_assert(std::endian::native == std::endian::little, "token digests assume a little-endian host");

void token_digests(const float* x, int64_t tokens, int64_t H, uint8_t* out) {
  if (tokens < 0 || H < 0) fail("token_digests", "shape", "tokens and H must be >= 0");
  const size_t row_bytes = size_t(H) * sizeof(float);
  // Each token is independent: the digests are the same bits whatever the thread count.
#pragma omp parallel for schedule(static) if (tokens * H >= (1 << 16))
  for (int64_t t = 0; t < tokens; ++t) {
    const auto d = Sha256().update(x + t * H, row_bytes).digest();
    std::copy(d.begin(), d.end(), out + t * kTokenDigestBytes);
  }
}

std::vector<uint8_t> token_digests(const float* x, int64_t tokens, int64_t H) {
  std::vector<uint8_t> out(size_t(std::max<int64_t>(tokens, 0) * kTokenDigestBytes));
  token_digests(x, tokens, H, out.data());
  return out;
}

std::string digest_chain_hex(std::span<const uint8_t> digests) {
  if (digests.size() % kTokenDigestBytes != 0)
    fail("digest_chain_hex", "digests", std::to_string(digests.size()) + " bytes is not a whole number of 32-byte digests");
  return sha256_hex(digests.data(), digests.size());
}

std::string stage_sha256(const float* x, int64_t tokens, int64_t H) {
  return digest_chain_hex(token_digests(x, tokens, H));
}

}  // namespace atlas
