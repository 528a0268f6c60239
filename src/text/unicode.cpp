#include "text/unicode.h"

namespace atlas::utf8 {

namespace {
// Number of bytes of a well-formed prefix of the sequence at s[i] and the length it should have.
// Follows Unicode Table 3-7 (well-formed byte sequences).
struct Probe {
  size_t valid = 0;   // bytes that are a valid prefix
  size_t needed = 0;  // full length the lead byte announces (0 for an invalid lead)
};

Probe probe(std::string_view s, size_t i) {
  auto b = [&](size_t k) { return static_cast<unsigned char>(s[i + k]); };
  const unsigned char c0 = b(0);
  if (c0 < 0x80) return {1, 1};
  size_t need = 0;
  unsigned char lo = 0x80, hi = 0xBF;  // range allowed for the second byte
  if (c0 >= 0xC2 && c0 <= 0xDF) {
    need = 2;
  } else if (c0 >= 0xE0 && c0 <= 0xEF) {
    need = 3;
    if (c0 == 0xE0) lo = 0xA0;  // no overlongs
    if (c0 == 0xED) hi = 0x9F;  // no surrogates
  } else if (c0 >= 0xF0 && c0 <= 0xF4) {
    need = 4;
    if (c0 == 0xF0) lo = 0x90;
    if (c0 == 0xF4) hi = 0x8F;  // <= U+10FFFF
  } else {
    return {0, 0};
  }
  size_t ok = 1;
  for (size_t k = 1; k < need; ++k) {
    if (i + k >= s.size()) break;
    const unsigned char c = b(k);
    const unsigned char l = k == 1 ? lo : 0x80, h = k == 1 ? hi : 0xBF;
    if (c < l || c > h) break;
    ++ok;
  }
  return {ok, need};
}
}  // namespace

size_t sequence_length(std::string_view s, size_t i) {
  Probe p = probe(s, i);
  return p.needed != 0 && p.valid == p.needed ? p.needed : 0;
}

size_t first_invalid(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    if (static_cast<unsigned char>(s[i]) < 0x80) {
      ++i;
      continue;
    }
    size_t n = sequence_length(s, i);
    if (n == 0) return i;
    i += n;
  }
  return std::string_view::npos;
}

char32_t decode_at(std::string_view s, size_t i, size_t* len) {
  const unsigned char c0 = static_cast<unsigned char>(s[i]);
  if (c0 < 0x80) {
    *len = 1;
    return c0;
  }
  size_t n = c0 >= 0xF0 ? 4 : c0 >= 0xE0 ? 3 : 2;
  char32_t cp = c0 & (0x7F >> n);
  for (size_t k = 1; k < n; ++k) cp = (cp << 6) | (static_cast<unsigned char>(s[i + k]) & 0x3F);
  *len = n;
  return cp;
}

void append(std::string& out, char32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

std::string lossy(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  size_t i = 0;
  while (i < s.size()) {
    Probe p = probe(s, i);
    if (p.needed != 0 && p.valid == p.needed) {
      out.append(s.data() + i, p.needed);
      i += p.needed;
    } else {
      out += "\xEF\xBF\xBD";
      i += p.valid == 0 ? 1 : p.valid;  // the maximal ill-formed subpart
    }
  }
  return out;
}

}  // namespace atlas::utf8
