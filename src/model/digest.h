// Per-token digests: the primitive behind every hidden-stage hash (probe runs, atlas trace,
// atlas bench's prefill trace, the audit's hidden-vector check).
//
// Definitions (docs/trace.md, "Stage hashes"):
//   token digest  = SHA-256 of one token's hidden vector as little-endian IEEE float32 bytes
//                   (the H floats an F32 HookTensor holds for that token; 4*H bytes);
//   stage hash    = SHA-256 of the concatenation of the 32-byte token digests of a token range
//                   [a, e) of one row, in token order (hex-encoded).
// A stage hash over a sub-range needs only the digests, never the vectors: a backend computes
// the [B*T][32] digests where the tensor lives (the CUDA backend on the device) and copies out
// 32 bytes per token instead of 4*H.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace atlas {

constexpr int64_t kTokenDigestBytes = 32;

// out[t*32 .. t*32+32) = SHA-256 of x[t*H .. t*H+H) as float32 LE bytes, for t < tokens.
// Parallel over tokens (OpenMP); the result does not depend on the thread count.
void token_digests(const float* x /* [tokens, H] */, int64_t tokens, int64_t H, uint8_t* out /* [tokens][32] */);
std::vector<uint8_t> token_digests(const float* x /* [tokens, H] */, int64_t tokens, int64_t H);

// SHA-256 (hex) of the concatenated digests: the stage hash of the tokens they belong to.
// digests.size() must be a multiple of 32 (an empty range hashes the empty string).
std::string digest_chain_hex(std::span<const uint8_t> digests);

// The stage hash of a whole [tokens, H] float32 tensor: digest_chain_hex(token_digests(...)).
std::string stage_sha256(const float* x /* [tokens, H] */, int64_t tokens, int64_t H);

}  // namespace atlas
