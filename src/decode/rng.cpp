#include "decode/rng.h"

#include "core/error.h"
#include "core/sha256.h"

namespace atlas::decode {

namespace {

constexpr uint32_t kPhiloxM0 = 0xD2511F53u, kPhiloxM1 = 0xCD9E8D57u;  // round multipliers
constexpr uint32_t kPhiloxW0 = 0x9E3779B9u, kPhiloxW1 = 0xBB67AE85u;  // Weyl key bumps

inline void mulhilo(uint32_t a, uint32_t b, uint32_t& hi, uint32_t& lo) {
  const uint64_t p = uint64_t(a) * uint64_t(b);
  hi = uint32_t(p >> 32);
  lo = uint32_t(p);
}

void put_u32le(std::string& s, uint32_t v) {
  for (int i = 0; i < 4; ++i) s.push_back(char((v >> (8 * i)) & 0xff));
}
void put_u64le(std::string& s, uint64_t v) {
  for (int i = 0; i < 8; ++i) s.push_back(char((v >> (8 * i)) & 0xff));
}

// "tape_seed || len || key || t": shared by the draw and the state hash so they cannot drift.
std::string crn_body(uint64_t tape_seed, std::string_view row_key, uint64_t t) {
  check(row_key.size() <= 0xffffffffu, {}, "crn_row_key", "longer than 2^32-1 bytes");
  std::string s;
  put_u64le(s, tape_seed);
  put_u32le(s, uint32_t(row_key.size()));
  s.append(row_key);
  put_u64le(s, t);
  return s;
}

}  // namespace

PhiloxCounter philox4x32_10(PhiloxCounter c, PhiloxKey k) {
  for (int round = 0; round < 10; ++round) {
    if (round > 0) {
      k[0] += kPhiloxW0;
      k[1] += kPhiloxW1;
    }
    uint32_t hi0, lo0, hi1, lo1;
    mulhilo(kPhiloxM0, c[0], hi0, lo0);
    mulhilo(kPhiloxM1, c[2], hi1, lo1);
    c = {hi1 ^ c[1] ^ k[0], lo1, hi0 ^ c[3] ^ k[1], lo0};
  }
  return c;
}

PhiloxKey philox_key(uint64_t seed) { return {uint32_t(seed), uint32_t(seed >> 32)}; }

PhiloxCounter philox_counter(const PhiloxPosition& pos) {
  return {pos.draw, uint32_t(pos.step), uint32_t(pos.step >> 32), pos.stream};
}

float uniform_float(const PhiloxCounter& w) { return float(w[0] >> 8) * 0x1p-24f; }

double uniform_double(const PhiloxCounter& w) {
  const uint64_t x = (uint64_t(w[0]) << 32) | w[1];
  return double(x >> 11) * 0x1p-53;
}

std::string philox_state_sha256(const PhiloxPosition& pos) {
  std::string s = "atlas-rng-state-v1:philox4x32-10";
  for (uint32_t k : philox_key(pos.seed)) put_u32le(s, k);
  for (uint32_t c : philox_counter(pos)) put_u32le(s, c);
  return sha256_hex(s);
}

double crn_uniform(uint64_t tape_seed, std::string_view row_key, uint64_t t) {
  const auto d = Sha256().update("atlas-crn-v1").update(crn_body(tape_seed, row_key, t)).digest();
  uint64_t x = 0;
  for (int i = 7; i >= 0; --i) x = (x << 8) | d[i];  // first 8 digest bytes, little-endian
  return double(x >> 11) * 0x1p-53;
}

std::string crn_state_sha256(uint64_t tape_seed, std::string_view row_key, uint64_t t) {
  return sha256_hex("atlas-rng-state-v1:crn-sha256" + crn_body(tape_seed, row_key, t));
}

}  // namespace atlas::decode
