// Portable counter-based random numbers for sampling: Philox4x32-10, and the CRN tape.
//
// Philox4x32-10 (Salmon, Moraes, Dror, Shaw, "Parallel Random Numbers: As Easy as 1, 2, 3",
// SC11, 2011) maps a 128-bit counter (c0, c1, c2, c3) and a 64-bit key (k0, k1) to four
// 32-bit words. One round, with mulhilo(a, b) = (high 32 bits, low 32 bits) of the 64-bit
// product a*b:
//     (hi0, lo0) = mulhilo(0xD2511F53, c0)        (hi1, lo1) = mulhilo(0xCD9E8D57, c2)
//     (c0, c1, c2, c3) <- (hi1 ^ c1 ^ k0,  lo1,  hi0 ^ c3 ^ k1,  lo0)
// Ten rounds; between consecutive rounds the key is bumped by the Weyl constants
// k0 += 0x9E3779B9, k1 += 0xBB67AE85 (mod 2^32), so round r uses key + r*W.
// Only 32/64-bit unsigned integer arithmetic: the same words on every machine and backend.
//
// atlas's sampling stream (see docs/decoding.md):
//     key     = (lo32(seed), hi32(seed))
//     counter = (draw, lo32(step), hi32(step), stream)
// where step counts the row's sampling steps from 0, draw numbers the draws inside a step
// (the sampler uses draw 0 only) and stream is a caller-chosen row identity (not the batch
// position, so a row draws the same numbers alone or in any batch).
// From the output words (w0, w1, w2, w3):
//     uniform float  = (w0 >> 8) * 2^-24                              in [0, 1), 24 bits
//     uniform double = (((uint64(w0) << 32) | w1) >> 11) * 2^-53      in [0, 1), 53 bits
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>

namespace atlas::decode {

using PhiloxCounter = std::array<uint32_t, 4>;
using PhiloxKey = std::array<uint32_t, 2>;

// The raw block function (known-answer tested against the Random123 vectors).
PhiloxCounter philox4x32_10(PhiloxCounter counter, PhiloxKey key);

// Where one draw sits in atlas's stream.
struct PhiloxPosition {
  uint64_t seed = 0;
  uint32_t stream = 0;
  uint64_t step = 0;
  uint32_t draw = 0;
};

PhiloxKey philox_key(uint64_t seed);
PhiloxCounter philox_counter(const PhiloxPosition& pos);

float uniform_float(const PhiloxCounter& words);    // (w0 >> 8) * 2^-24
double uniform_double(const PhiloxCounter& words);  // ((w0:w1) >> 11) * 2^-53
inline double philox_uniform(const PhiloxPosition& pos) {
  return uniform_double(philox4x32_10(philox_counter(pos), philox_key(pos.seed)));
}

// SHA-256 (hex) of the generator state at pos:
//     "atlas-rng-state-v1:philox4x32-10" || u32le(k0) || u32le(k1) || u32le(c0..c3)
// The sampler records it for step 0, draw 0: the state before the row's first draw.
std::string philox_state_sha256(const PhiloxPosition& pos);

// ---- common random numbers (CRN tape) -----------------------------------------------------
// u_t for step t of the row named row_key on the tape tape_seed:
//     d   = SHA-256("atlas-crn-v1" || u64le(tape_seed) || u32le(len(row_key)) || row_key || u64le(t))
//     u_t = (u64le(d[0..8]) >> 11) * 2^-53                        a double in [0, 1)
// The pre-image holds nothing about the condition, so conditions sharing a tape and a row key
// share every u_t.
double crn_uniform(uint64_t tape_seed, std::string_view row_key, uint64_t t);

// SHA-256 (hex) of the tape state before step t:
//     "atlas-rng-state-v1:crn-sha256" || u64le(tape_seed) || u32le(len(row_key)) || row_key || u64le(t)
std::string crn_state_sha256(uint64_t tape_seed, std::string_view row_key, uint64_t t);

}  // namespace atlas::decode
