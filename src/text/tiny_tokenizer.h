// A small byte-level BPE tokenizer written by atlas itself, for the embedded tiny checkpoint.
//
// Same shape as DeepSeek's: the DeepSeek-V3 pre-tokenizer (digits in groups of up to three,
// CJK runs, the word regex, then ByteLevel), 256 byte tokens (ids 0..255, id = byte value),
// merges learned deterministically from a built-in English text (ids 256..), and the DeepSeek
// special tokens <｜begin▁of▁sentence｜> = 1000 and <｜end▁of▁sentence｜> = 1001. Every id is below
// kTinyTokenizerVocab, so a model with that vocabulary size can embed any token it produces.
// tokenizer_config.json carries add_bos_token true and the DeepSeek-V2 chat template.
#pragma once

#include <string>

namespace atlas {

inline constexpr int kTinyTokenizerVocab = 1024;
inline constexpr int kTinyTokenizerBos = 1000;
inline constexpr int kTinyTokenizerEos = 1001;

// Writes DIR/tokenizer.json and DIR/tokenizer_config.json (atomically; DIR is created if needed).
// Byte-identical output on every call.
void write_tiny_tokenizer(const std::string& dir);

// The two files' contents, for callers that embed them elsewhere.
std::string tiny_tokenizer_json();
std::string tiny_tokenizer_config_json();

}  // namespace atlas
