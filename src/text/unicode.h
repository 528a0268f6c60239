// Small UTF-8 helpers shared by the tokenizer pieces.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace atlas::utf8 {

// Length of the well-formed UTF-8 sequence starting at s[i] (1..4), or 0 when it is not one
// (bad lead byte, truncated, overlong, surrogate, > U+10FFFF).
size_t sequence_length(std::string_view s, size_t i);

// Index of the first byte that does not start a valid sequence, or npos when all is valid.
size_t first_invalid(std::string_view s);

// Decodes the (valid) sequence at s[i]; `len` receives its length.
char32_t decode_at(std::string_view s, size_t i, size_t* len);

void append(std::string& out, char32_t cp);

// Bytes to text the way Rust's String::from_utf8_lossy and WHATWG TextDecoder do: each maximal
// ill-formed subpart becomes one U+FFFD.
std::string lossy(std::string_view bytes);

inline bool is_continuation(unsigned char c) { return (c & 0xC0) == 0x80; }

}  // namespace atlas::utf8
