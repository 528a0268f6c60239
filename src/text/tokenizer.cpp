// Hugging Face tokenizer.json runtime. See tokenizer.h for the pipeline.
//
// Text travels as NormStr: the (possibly normalized) bytes plus, for each byte, the byte range
// of the original input it came from. Splitting never copies text: a Piece is a byte range of
// one NormStr. Only transformations (normalizers, Metaspace, ByteLevel's prefix space) make a new
// NormStr. Byte-level BPE runs on raw bytes: the vocabulary is keyed by the bytes each token
// stands for, so the GPT-2 byte-to-character mapping never has to be applied to the input.
#include "text/tokenizer.h"

#include <oniguruma.h>
#include <utf8proc.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <mutex>
#include <queue>
#include <unordered_map>

#include "core/error.h"
#include "core/file.h"
#include "core/json.h"
#include "text/unicode.h"

// Component structs are built with designated initializers naming only the fields that matter.
#pragma GCC diagnostic ignored "-Wmissing-field-initializers"

namespace atlas {

namespace {

// ---------------------------------------------------------------- GPT-2 byte <-> char map
// Printable Latin-1 bytes stand for themselves; the other 68 bytes are shifted to U+0100.. in
// byte order. This is the mapping every byte-level BPE vocabulary is written in.
struct ByteMap {
  char32_t to_char[256];
  std::unordered_map<char32_t, uint8_t> to_byte;
  ByteMap() {
    int next = 0;
    for (int b = 0; b < 256; ++b) {
      bool printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
      to_char[b] = printable ? char32_t(b) : char32_t(256 + next++);
      to_byte[to_char[b]] = uint8_t(b);
    }
  }
};
const ByteMap& byte_map() {
  static const ByteMap m;
  return m;
}

// Token text in the byte-level alphabet -> the bytes it stands for; nullopt when a character is
// outside the alphabet (such a token can never come out of byte-level BPE).
std::optional<std::string> byte_level_decode(std::string_view tok) {
  std::string out;
  size_t i = 0;
  const auto& m = byte_map();
  while (i < tok.size()) {
    size_t n = utf8::sequence_length(tok, i);
    if (n == 0) return std::nullopt;
    char32_t c = utf8::decode_at(tok, i, &n);
    auto it = m.to_byte.find(c);
    if (it == m.to_byte.end()) return std::nullopt;
    out += char(it->second);
    i += n;
  }
  return out;
}

// ---------------------------------------------------------------- Oniguruma
class Regex {
 public:
  Regex(const std::string& pattern, const std::string& file, const std::string& field) {
    static std::once_flag once;
    std::call_once(once, [] {
      OnigEncoding enc[] = {ONIG_ENCODING_UTF8};
      onig_initialize(enc, 1);
    });
    OnigErrorInfo einfo;
    const auto* p = reinterpret_cast<const OnigUChar*>(pattern.data());
    // The Oniguruma syntax (onig's default) is what Hugging Face tokenizers compiles with.
    int r = onig_new(&reg_, p, p + pattern.size(), ONIG_OPTION_CAPTURE_GROUP, ONIG_ENCODING_UTF8,
                     ONIG_SYNTAX_ONIGURUMA, &einfo);
    if (r != ONIG_NORMAL) {
      OnigUChar msg[ONIG_MAX_ERROR_MESSAGE_LEN];
      onig_error_code_to_str(msg, r, &einfo);
      fail(file, field, "bad regex '" + pattern + "': " + reinterpret_cast<char*>(msg));
    }
  }
  ~Regex() { onig_free(reg_); }
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;

  // Non-empty matches in s[b, e), as absolute byte ranges. The subject is exactly that range,
  // so look-arounds do not see past it (HF runs the regex on the split alone).
  void find_all(const std::string& s, uint32_t b, uint32_t e, std::vector<std::pair<uint32_t, uint32_t>>& out) const {
    thread_local OnigRegion* region = onig_region_new();
    const auto* str = reinterpret_cast<const OnigUChar*>(s.data()) + b;
    const auto* end = reinterpret_cast<const OnigUChar*>(s.data()) + e;
    const OnigUChar* start = str;
    while (start < end) {
      int r = onig_search(reg_, str, end, start, end, region, ONIG_OPTION_NONE);
      if (r < 0) break;
      uint32_t mb = b + uint32_t(region->beg[0]), me = b + uint32_t(region->end[0]);
      if (me > mb) {
        out.emplace_back(mb, me);
        start = str + (me - b);
      } else {
        // Empty match: step one character.
        size_t n = utf8::sequence_length(s, mb);
        start = str + (mb - b) + (n ? n : 1);
      }
    }
  }

 private:
  OnigRegex reg_ = nullptr;
};

// ---------------------------------------------------------------- normalized strings
// The alignment rules are Hugging Face's NormalizedString: every byte of a normalized character
// carries the original byte range of the character it replaced; a character inserted next to
// others shares the range of the one before it; a token's original span runs from its first
// byte's start to its last byte's end (not min/max: canonical reordering can leave the ranges
// out of order, and HF reports them as they fall).
struct NormStr {
  std::string s;
  std::vector<uint32_t> a0, a1;  // original byte range of each byte of s; empty = identity
  uint32_t base = 0;             // identity: byte i of s is original byte base + i. Also HF's
                                 // original_shift: where this string starts in the input.
  uint32_t o0(size_t i) const { return a0.empty() ? base + uint32_t(i) : a0[i]; }
  uint32_t o1(size_t i) const { return a1.empty() ? base + uint32_t(i) + 1 : a1[i]; }
};

inline size_t lead_len(unsigned char c) { return c < 0x80 ? 1 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4; }

// Original range of the character starting at byte i. An untransformed string maps each byte to
// itself, so the range is the first byte's start to the last byte's end: the whole character,
// as HF aligns every byte of an input character.
std::pair<uint32_t, uint32_t> char_align(const NormStr& n, size_t i) {
  return {n.o0(i), n.o1(i + lead_len(static_cast<unsigned char>(n.s[i])) - 1)};
}
// The character ending just before byte i (i > 0).
std::pair<uint32_t, uint32_t> char_align_before(const NormStr& n, size_t i) {
  size_t k = i - 1;
  while (k > 0 && utf8::is_continuation(static_cast<unsigned char>(n.s[k]))) --k;
  return char_align(n, k);
}

// Builds a new NormStr piece by piece: each emitted piece of text is aligned to an original range.
struct NormBuilder {
  NormStr out;
  void emit(std::string_view text, uint32_t ob, uint32_t oe) {
    out.s.append(text);
    out.a0.insert(out.a0.end(), text.size(), ob);
    out.a1.insert(out.a1.end(), text.size(), oe);
  }
  void emit(std::string_view text, std::pair<uint32_t, uint32_t> a) { emit(text, a.first, a.second); }
  // Copies src[b, e) keeping its alignment.
  void copy(const NormStr& src, size_t b, size_t e) {
    out.s.append(src.s, b, e - b);
    for (size_t i = b; i < e; ++i) {
      out.a0.push_back(src.o0(i));
      out.a1.push_back(src.o1(i));
    }
  }
};

// One character of a transformed string and how it relates to the characters it replaces, as
// HF's NormalizedString::transform takes them: 0 = replaces the next original character,
// +1 = inserted (takes the range of the character before it), -n = replaces the next
// character and removes the n after it.
struct CharChange {
  char32_t c;
  int32_t change;
};

// HF's transform over the whole string: the first `initial_removed` characters are dropped,
// then each item consumes and aligns as described above.
void transform(NormStr& ns, const std::vector<CharChange>& items, size_t initial_removed) {
  const std::string& s = ns.s;
  NormStr out{.base = ns.base};
  out.s.reserve(s.size() + 8);
  out.a0.reserve(s.size() + 8);
  out.a1.reserve(s.size() + 8);
  size_t pos = 0;
  auto drop = [&](size_t n) {
    for (; n > 0 && pos < s.size(); --n) pos += lead_len(static_cast<unsigned char>(s[pos]));
  };
  drop(initial_removed);
  for (const auto& [c, change] : items) {
    std::pair<uint32_t, uint32_t> a;
    if (change > 0) {
      // An insertion at the very start has nothing before it: HF gives it the empty range at
      // the start of the string.
      a = pos == 0 ? std::pair{ns.base, ns.base} : char_align_before(ns, pos);
    } else if (pos < s.size()) {
      a = char_align(ns, pos);
      drop(1);
      drop(size_t(-change));
    } else {
      // More replacing items than characters (never from the normalizers here): align to the end.
      a = s.empty() ? std::pair{ns.base, ns.base} : std::pair{char_align_before(ns, s.size()).second,
                                                               char_align_before(ns, s.size()).second};
    }
    size_t n0 = out.s.size();
    utf8::append(out.s, c);
    out.a0.insert(out.a0.end(), out.s.size() - n0, a.first);
    out.a1.insert(out.a1.end(), out.s.size() - n0, a.second);
  }
  ns = std::move(out);
}

// True when `items` leave the string as it is (same characters, one for one): the alignment
// then stays as it is too, and the common no-op case costs no rebuild.
bool is_identity(const std::string& s, const std::vector<CharChange>& items) {
  size_t pos = 0, len;
  for (const auto& [c, change] : items) {
    if (change != 0 || pos >= s.size() || utf8::decode_at(s, pos, &len) != c) return false;
    pos += len;
  }
  return pos == s.size();
}

uint8_t ccc(char32_t c) {
  return c < 0x300 ? 0 : uint8_t(utf8proc_get_property(utf8proc_int32_t(c))->combining_class);
}

// The primary composite of a starter and the character after it, if there is one. Every second
// character of a composition is a combining mark (U+0300 and up) or a Hangul vowel / trailing
// consonant, so the rest are rejected without asking utf8proc.
std::optional<char32_t> compose_pair(char32_t a, char32_t b) {
  if (b < 0x300 || b == 0x11A7) return std::nullopt;  // U+11A7 is T's base, not a T
  bool hangul_vt = (b >= 0x1161 && b <= 0x1175) || (b >= 0x11A8 && b <= 0x11C2);
  if (!hangul_vt) {
    auto cat = utf8proc_category(utf8proc_int32_t(b));
    if (cat != UTF8PROC_CATEGORY_MN && cat != UTF8PROC_CATEGORY_MC && cat != UTF8PROC_CATEGORY_ME) return std::nullopt;
  }
  utf8proc_int32_t buf[2] = {utf8proc_int32_t(a), utf8proc_int32_t(b)};
  // STABLE: composition exclusions (e.g. U+2ADC) are not composed, as the standard says.
  if (utf8proc_normalize_utf32(buf, 2, utf8proc_option_t(UTF8PROC_COMPOSE | UTF8PROC_STABLE)) == 1) return char32_t(buf[0]);
  return std::nullopt;
}

// Unicode normalization with HF's per-character changes (its unicode-normalization-alignments
// crate): decomposition gives the first character of each decomposition change 0 and the rest
// +1; canonical reordering moves characters with their changes; composition of a starter
// carrying change x with a character carrying y leaves one character carrying x + y - 1.
void normal_form_changes(const std::string& s, bool compose, bool compat, std::vector<CharChange>& out) {
  struct D {
    char32_t c;
    int32_t change;
    uint8_t ccc;
  };
  std::vector<D> d;
  d.reserve(s.size() + 8);
  const int opts = UTF8PROC_DECOMPOSE | (compat ? UTF8PROC_COMPAT : 0);
  for (size_t i = 0, len; i < s.size(); i += len) {
    char32_t c = utf8::decode_at(s, i, &len);
    if (c < 0x80) {
      d.push_back({c, 0, 0});
      continue;
    }
    utf8proc_int32_t buf[32];
    utf8proc_ssize_t n = utf8proc_decompose_char(utf8proc_int32_t(c), buf, 32, utf8proc_option_t(opts), nullptr);
    if (n < 0 || n > 32) fail("utf8proc: cannot decompose U+" + std::to_string(uint32_t(c)));
    for (utf8proc_ssize_t k = 0; k < n; ++k) d.push_back({char32_t(buf[k]), k ? 1 : 0, ccc(char32_t(buf[k]))});
  }
  // Canonical ordering: each run of non-starters sorted by combining class, stably.
  for (size_t i = 0; i < d.size();) {
    if (d[i].ccc == 0) {
      ++i;
      continue;
    }
    size_t j = i;
    while (j < d.size() && d[j].ccc != 0) ++j;
    if (j - i > 1) std::stable_sort(d.begin() + i, d.begin() + j, [](const D& x, const D& y) { return x.ccc < y.ccc; });
    i = j;
  }
  out.clear();
  out.reserve(d.size());
  if (!compose) {
    for (const D& x : d) out.push_back({x.c, x.change});
    return;
  }
  // Canonical composition, streaming: `composee` is the last starter, `blocked` the marks after
  // it that did not combine (emitted after it), `last_ccc` the class of the last of those.
  std::optional<CharChange> composee;
  std::vector<CharChange> blocked;
  int last_ccc = -1;
  auto flush = [&] {
    if (composee) out.push_back(*composee);
    out.insert(out.end(), blocked.begin(), blocked.end());
    blocked.clear();
    last_ccc = -1;
  };
  for (const D& x : d) {
    if (!composee) {
      if (x.ccc != 0) {
        out.push_back({x.c, x.change});
      } else {
        composee = CharChange{x.c, x.change};
      }
      continue;
    }
    if (last_ccc < 0 || last_ccc < x.ccc) {  // not blocked from the composee
      if (auto r = compose_pair(composee->c, x.c)) {
        composee = CharChange{*r, composee->change + x.change - 1};
        continue;
      }
    }
    if (x.ccc == 0) {
      flush();
      composee = CharChange{x.c, x.change};
    } else {
      blocked.push_back({x.c, x.change});
      last_ccc = x.ccc;
    }
  }
  flush();
}

// Rust's char::to_lowercase, which HF's Lowercase uses: the simple mapping, except U+0130 whose
// lowercase is two characters (the only unconditional multi-character lowercase mapping).
void lowercase_changes(const std::string& s, std::vector<CharChange>& out) {
  out.clear();
  for (size_t i = 0, len; i < s.size(); i += len) {
    char32_t c = utf8::decode_at(s, i, &len);
    if (c == 0x130) {
      out.push_back({U'i', 0});
      out.push_back({0x307, 1});
    } else {
      out.push_back({char32_t(utf8proc_tolower(utf8proc_int32_t(c))), 0});
    }
  }
}

bool is_unicode_whitespace(char32_t c) {
  if (c == ' ' || (c >= 0x09 && c <= 0x0D) || c == 0x85 || c == 0xA0 || c == 0x1680 || (c >= 0x2000 && c <= 0x200A) ||
      c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000)
    return true;
  return false;
}

// ---------------------------------------------------------------- components
enum class NormKind { NFC, NFD, NFKC, NFKD, Lowercase, Replace, Prepend, Strip };
struct Normalizer {
  NormKind kind;
  std::string pattern_string, content;  // Replace (string form), Prepend
  std::shared_ptr<Regex> pattern_regex;  // Replace (regex form)
  bool strip_left = false, strip_right = false;
};

enum class Behavior { Removed, Isolated, MergedWithPrevious, MergedWithNext, Contiguous };
enum class PreKind { Split, ByteLevel, Digits, Metaspace, Whitespace, WhitespaceSplit, Punctuation };
enum class PrependScheme { Always, First, Never };
struct PreTokenizer {
  PreKind kind;
  std::shared_ptr<Regex> regex;  // Split (regex), ByteLevel (use_regex), Whitespace, Punctuation, Digits
  std::string literal;           // Split with a String pattern
  Behavior behavior = Behavior::Isolated;
  bool invert = false;
  bool add_prefix_space = false;  // ByteLevel
  std::string replacement;        // Metaspace
  PrependScheme prepend = PrependScheme::Always;
  bool split = true;              // Metaspace
};

enum class DecKind { ByteLevel, Replace, Fuse, Strip, ByteFallback, Metaspace };
struct Decoder {
  DecKind kind;
  std::string pattern_string, content;
  std::shared_ptr<Regex> pattern_regex;
  std::string strip_char;
  int strip_start = 0, strip_stop = 0;
  std::string replacement;
  PrependScheme prepend = PrependScheme::Always;
};

struct TemplatePiece {
  bool is_sequence = false;           // $A
  std::vector<TokenId> special_ids;   // the special token's ids
};
struct PostProcessor {
  bool byte_level = false;
  bool trim_offsets = false;
  bool add_prefix_space = false;
  bool has_template = false;
  std::vector<TemplatePiece> single;
};

struct AddedToken {
  TokenId id;
  std::string content;
  bool single_word = false, lstrip = false, rstrip = false, normalized = false, special = false;
};

// Byte trie over added-token contents: longest match at a position.
class AddedMatcher {
 public:
  void add(const std::string& key, int token_index) {
    int node = 0;
    for (unsigned char c : key) {
      auto it = nodes_[node].next.find(c);
      if (it == nodes_[node].next.end()) {
        nodes_.push_back({});
        nodes_[node].next[c] = int(nodes_.size() - 1);
        node = int(nodes_.size() - 1);
      } else {
        node = it->second;
      }
    }
    if (nodes_[node].token < 0) nodes_[node].token = token_index;
    first_[static_cast<unsigned char>(key[0])] = true;
    empty_ = false;
  }
  bool empty() const { return empty_; }
  // Longest key starting at s[i]: (token index, length) or (-1, 0).
  std::pair<int, size_t> longest(std::string_view s, size_t i) const {
    if (!first_[static_cast<unsigned char>(s[i])]) return {-1, 0};
    int node = 0, best = -1;
    size_t best_len = 0;
    for (size_t k = i; k < s.size(); ++k) {
      auto it = nodes_[node].next.find(static_cast<unsigned char>(s[k]));
      if (it == nodes_[node].next.end()) break;
      node = it->second;
      if (nodes_[node].token >= 0) best = nodes_[node].token, best_len = k + 1 - i;
    }
    return {best, best_len};
  }

 private:
  struct Node {
    std::map<unsigned char, int> next;
    int token = -1;
  };
  std::vector<Node> nodes_{Node{}};
  bool first_[256] = {};
  bool empty_ = true;
};

struct Piece {
  uint32_t buf;   // index into the NormStr pool
  uint32_t b, e;  // byte range in that NormStr
  TokenId added = -1;
  bool special = false;
};

struct BpeToken {
  TokenId id;
  uint32_t len;       // bytes of the piece it covers
  uint32_t skip = 0;  // bytes before it that no token covers (characters dropped for lack of unk)
};

bool is_word_char(char32_t c) {
  // Unicode \w as Rust's regex defines it: alphabetic, marks, decimal numbers, connector punctuation.
  if (c < 0x80) return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
  auto cat = utf8proc_category(utf8proc_int32_t(c));
  switch (cat) {
    case UTF8PROC_CATEGORY_LU: case UTF8PROC_CATEGORY_LL: case UTF8PROC_CATEGORY_LT: case UTF8PROC_CATEGORY_LM:
    case UTF8PROC_CATEGORY_LO: case UTF8PROC_CATEGORY_MN: case UTF8PROC_CATEGORY_MC: case UTF8PROC_CATEGORY_ME:
    case UTF8PROC_CATEGORY_ND: case UTF8PROC_CATEGORY_NL: case UTF8PROC_CATEGORY_PC:
      return true;
    default:
      return false;
  }
}

}  // namespace

// ================================================================ the implementation
class TokenizerImpl {
 public:
  std::string file;  // for error messages

  // model
  std::unordered_map<std::string, TokenId> vocab;  // keyed in model space (raw bytes if byte-level)
  std::unordered_map<std::string, TokenId> vocab_text;  // keyed by token text as in the file
  std::vector<std::string> id_text;                 // token text by id ("" = hole)
  std::vector<bool> id_present;
  std::unordered_map<uint64_t, std::pair<int32_t, TokenId>> merges;  // (left,right) -> (rank, merged id)
  TokenId byte_ids[256];
  std::optional<TokenId> unk_id;
  bool fuse_unk = false, byte_fallback = false, ignore_merges = false;
  std::string cont_prefix, eow_suffix;
  bool byte_level = false;  // pre-tokenizer contains ByteLevel: the model sees raw bytes

  // pipeline
  std::vector<Normalizer> normalizers;
  std::vector<PreTokenizer> pretokenizers;
  std::vector<Decoder> decoders;
  bool has_decoder = false;
  PostProcessor post;
  std::vector<AddedToken> added;
  std::unordered_map<TokenId, size_t> added_by_id;
  AddedMatcher raw_matcher, norm_matcher;

  TokenizerConfig config;
  std::optional<TokenId> bos, eos, pad;

  // BPE cache: pre-token bytes -> tokens. Bounded; cleared when full (cheap and keeps the
  // common words hot again within a few sentences).
  mutable std::mutex cache_mu;
  struct StrHash {
    using is_transparent = void;
    size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
  };
  mutable std::unordered_map<std::string, std::vector<BpeToken>, StrHash, std::equal_to<>> cache;
  static constexpr size_t kCacheMax = 1 << 16;   // entries
  static constexpr size_t kCacheMaxWord = 256;    // bytes; longer pre-tokens are not cached

  // ------------------------------------------------------------ loading
  void load(const json& j);
  void load_model(const JsonReader& m);
  Normalizer parse_normalizer(const JsonReader& r);
  void parse_normalizers(const json& j, const std::string& field);
  void parse_pretokenizers(const json& j, const std::string& field);
  void parse_decoders(const json& j, const std::string& field);
  void parse_post(const json& j, const std::string& field);
  std::shared_ptr<Regex> parse_pattern(const JsonReader& r, const std::string& key, std::string* literal);

  // ------------------------------------------------------------ encoding
  Encoding encode(std::string_view text, const EncodeOptions& opt) const;
  NormStr normalize(std::string_view text, uint32_t base) const;
  void apply_normalizer(const Normalizer& n, NormStr& ns) const;
  void split_added(const AddedMatcher& m, const NormStr& ns, uint32_t buf, uint32_t b, uint32_t e,
                   std::vector<Piece>& out) const;
  void pre_tokenize(std::vector<NormStr>& pool, std::vector<Piece>& pieces) const;
  void bpe(std::string_view word, std::vector<BpeToken>& out) const;
  void bpe_uncached(std::string_view word, std::vector<BpeToken>& out) const;

  std::string decode(std::span<const TokenId> ids, const DecodeOptions& opt) const;
  std::vector<std::pair<std::string, Span>> pre_tokenize_strings(std::string_view text) const;
  std::optional<TokenId> lookup(std::string_view tok) const {
    auto it = vocab_text.find(std::string(tok));
    if (it != vocab_text.end()) return it->second;
    return std::nullopt;
  }
};

// ---------------------------------------------------------------- loading
std::shared_ptr<Regex> TokenizerImpl::parse_pattern(const JsonReader& r, const std::string& key,
                                                    std::string* literal) {
  JsonReader p = r.child(key);
  if (p.has("Regex")) return std::make_shared<Regex>(p.get<std::string>("Regex"), file, p.field("Regex"));
  if (p.has("String")) {
    *literal = p.get<std::string>("String");
    return nullptr;
  }
  fail(file, r.field(key), "expected {\"Regex\": ...} or {\"String\": ...}");
}

Normalizer TokenizerImpl::parse_normalizer(const JsonReader& r) {
  std::string type = r.get<std::string>("type");
  if (type == "NFC") return {.kind = NormKind::NFC};
  if (type == "NFD") return {.kind = NormKind::NFD};
  if (type == "NFKC") return {.kind = NormKind::NFKC};
  if (type == "NFKD") return {.kind = NormKind::NFKD};
  if (type == "Lowercase") return {.kind = NormKind::Lowercase};
  if (type == "Replace") {
    Normalizer n{.kind = NormKind::Replace};
    n.pattern_regex = parse_pattern(r, "pattern", &n.pattern_string);
    n.content = r.get<std::string>("content");
    return n;
  }
  if (type == "Prepend") return {.kind = NormKind::Prepend, .content = r.get<std::string>("prepend")};
  // Hugging Face serialises Strip as {"strip_left", "strip_right"} (both required; its Python
  // constructor's left/right keywords are not the file format).
  if (type == "Strip")
    return {.kind = NormKind::Strip, .strip_left = r.get<bool>("strip_left"), .strip_right = r.get<bool>("strip_right")};
  fail(file, r.field("type"), "unknown normalizer type '" + type + "'");
}

void TokenizerImpl::parse_normalizers(const json& j, const std::string& field) {
  if (j.is_null()) return;
  JsonReader r(j, file, field);
  if (r.get<std::string>("type") == "Sequence") {
    const json& list = r.raw("normalizers");
    if (!list.is_array()) fail(file, r.field("normalizers"), "expected an array");
    for (size_t i = 0; i < list.size(); ++i)
      parse_normalizers(list[i], r.field("normalizers") + "[" + std::to_string(i) + "]");
    return;
  }
  normalizers.push_back(parse_normalizer(r));
}

Behavior parse_behavior(const JsonReader& r) {
  std::string b = r.get_or<std::string>("behavior", "Isolated");
  if (b == "Removed") return Behavior::Removed;
  if (b == "Isolated") return Behavior::Isolated;
  if (b == "MergedWithPrevious") return Behavior::MergedWithPrevious;
  if (b == "MergedWithNext") return Behavior::MergedWithNext;
  if (b == "Contiguous") return Behavior::Contiguous;
  fail(r.file(), r.field("behavior"), "unknown split behavior '" + b + "'");
}

PrependScheme parse_prepend(const JsonReader& r) {
  if (!r.has_value("prepend_scheme")) {
    // Old files: add_prefix_space true/false.
    return r.get_or<bool>("add_prefix_space", true) ? PrependScheme::Always : PrependScheme::Never;
  }
  std::string s = r.get<std::string>("prepend_scheme");
  if (s == "always") return PrependScheme::Always;
  if (s == "first") return PrependScheme::First;
  if (s == "never") return PrependScheme::Never;
  fail(r.file(), r.field("prepend_scheme"), "unknown prepend_scheme '" + s + "'");
}

void TokenizerImpl::parse_pretokenizers(const json& j, const std::string& field) {
  if (j.is_null()) return;
  JsonReader r(j, file, field);
  std::string type = r.get<std::string>("type");
  if (type == "Sequence") {
    const json& list = r.raw("pretokenizers");
    if (!list.is_array()) fail(file, r.field("pretokenizers"), "expected an array");
    for (size_t i = 0; i < list.size(); ++i)
      parse_pretokenizers(list[i], r.field("pretokenizers") + "[" + std::to_string(i) + "]");
    return;
  }
  PreTokenizer p{.kind = PreKind::Split};
  if (type == "Split") {
    p.regex = parse_pattern(r, "pattern", &p.literal);
    p.behavior = parse_behavior(r);
    p.invert = r.get_or<bool>("invert", false);
  } else if (type == "ByteLevel") {
    p.kind = PreKind::ByteLevel;
    p.add_prefix_space = r.get_or<bool>("add_prefix_space", true);
    if (r.get_or<bool>("use_regex", true))
      p.regex = std::make_shared<Regex>(
          R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)", file, r.field("use_regex"));
    byte_level = true;
  } else if (type == "Digits") {
    p.kind = PreKind::Digits;
    bool individual = r.get_or<bool>("individual_digits", false);
    p.regex = std::make_shared<Regex>(individual ? "[0-9]" : "[0-9]+", file, r.field("type"));
  } else if (type == "Metaspace") {
    p.kind = PreKind::Metaspace;
    p.replacement = r.get_or<std::string>("replacement", "\xE2\x96\x81");
    p.prepend = parse_prepend(r);
    p.split = r.get_or<bool>("split", true);
  } else if (type == "Whitespace") {
    p.kind = PreKind::Whitespace;
    p.regex = std::make_shared<Regex>(R"(\w+|[^\w\s]+)", file, r.field("type"));
  } else if (type == "WhitespaceSplit") {
    p.kind = PreKind::WhitespaceSplit;
    p.regex = std::make_shared<Regex>(R"(\S+)", file, r.field("type"));
  } else if (type == "Punctuation") {
    p.kind = PreKind::Punctuation;
    p.behavior = parse_behavior(r);
    p.regex = std::make_shared<Regex>(R"(\p{P}|[!-/:-@\[-`{-~])", file, r.field("type"));
  } else {
    fail(file, r.field("type"), "unknown pre-tokenizer type '" + type + "'");
  }
  pretokenizers.push_back(std::move(p));
}

void TokenizerImpl::parse_decoders(const json& j, const std::string& field) {
  if (j.is_null()) return;
  has_decoder = true;
  JsonReader r(j, file, field);
  std::string type = r.get<std::string>("type");
  if (type == "Sequence") {
    const json& list = r.raw("decoders");
    if (!list.is_array()) fail(file, r.field("decoders"), "expected an array");
    for (size_t i = 0; i < list.size(); ++i)
      parse_decoders(list[i], r.field("decoders") + "[" + std::to_string(i) + "]");
    return;
  }
  Decoder d{.kind = DecKind::ByteLevel};
  if (type == "ByteLevel") {
  } else if (type == "Replace") {
    d.kind = DecKind::Replace;
    d.pattern_regex = parse_pattern(r, "pattern", &d.pattern_string);
    d.content = r.get<std::string>("content");
  } else if (type == "Fuse") {
    d.kind = DecKind::Fuse;
  } else if (type == "Strip") {
    d.kind = DecKind::Strip;
    d.strip_char = r.get<std::string>("content");
    d.strip_start = r.get_or<int>("start", 0);
    d.strip_stop = r.get_or<int>("stop", 0);
  } else if (type == "ByteFallback") {
    d.kind = DecKind::ByteFallback;
  } else if (type == "Metaspace") {
    d.kind = DecKind::Metaspace;
    d.replacement = r.get_or<std::string>("replacement", "\xE2\x96\x81");
    d.prepend = parse_prepend(r);
  } else {
    fail(file, r.field("type"), "unknown decoder type '" + type + "'");
  }
  decoders.push_back(std::move(d));
}

void TokenizerImpl::parse_post(const json& j, const std::string& field) {
  if (j.is_null()) return;
  JsonReader r(j, file, field);
  std::string type = r.get<std::string>("type");
  if (type == "Sequence") {
    const json& list = r.raw("processors");
    if (!list.is_array()) fail(file, r.field("processors"), "expected an array");
    for (size_t i = 0; i < list.size(); ++i) parse_post(list[i], r.field("processors") + "[" + std::to_string(i) + "]");
    return;
  }
  if (type == "ByteLevel") {
    post.byte_level = true;
    post.trim_offsets = r.get_or<bool>("trim_offsets", true);
    post.add_prefix_space = r.get_or<bool>("add_prefix_space", true);
    return;
  }
  if (type == "TemplateProcessing") {
    post.has_template = true;
    JsonReader specials = r.child("special_tokens");
    const json& single = r.raw("single");
    if (!single.is_array()) fail(file, r.field("single"), "expected an array");
    for (size_t i = 0; i < single.size(); ++i) {
      std::string f = r.field("single") + "[" + std::to_string(i) + "]";
      JsonReader item(single[i], file, f);
      if (item.has("Sequence")) {
        std::string id = item.child("Sequence").get<std::string>("id");
        if (id != "A") fail(file, f, "only sequence A is supported for single inputs");
        post.single.push_back({.is_sequence = true});
      } else if (item.has("SpecialToken")) {
        std::string name = item.child("SpecialToken").get<std::string>("id");
        if (!specials.has(name)) fail(file, specials.field(name), "special token used by the template is not defined");
        auto ids = specials.child(name).get<std::vector<TokenId>>("ids");
        post.single.push_back({.is_sequence = false, .special_ids = ids});
      } else {
        fail(file, f, "expected Sequence or SpecialToken");
      }
    }
    return;
  }
  fail(file, r.field("type"), "unknown post-processor type '" + type + "'");
}

void TokenizerImpl::load_model(const JsonReader& m) {
  std::string type = m.get_or<std::string>("type", "BPE");
  if (type != "BPE") fail(file, m.field("type"), "unsupported model type '" + type + "' (only BPE)");
  if (m.has_value("dropout") && m.raw("dropout").get<double>() != 0.0)
    fail(file, m.field("dropout"), "BPE dropout is not supported (encoding would not be deterministic)");
  const json& v = m.raw("vocab");
  if (!v.is_object()) fail(file, m.field("vocab"), "expected an object of token -> id");
  TokenId max_id = -1;
  for (auto it = v.begin(); it != v.end(); ++it) {
    if (!it.value().is_number_integer() || it.value().get<int64_t>() < 0)
      fail(file, m.field("vocab") + "." + it.key(), "expected a non-negative integer id");
    TokenId id = it.value().get<TokenId>();
    vocab_text[it.key()] = id;
    max_id = std::max(max_id, id);
  }
  id_text.assign(size_t(max_id + 1), {});
  id_present.assign(size_t(max_id + 1), false);
  for (auto& [t, id] : vocab_text) id_text[size_t(id)] = t, id_present[size_t(id)] = true;
  cont_prefix = m.get_or<std::string>("continuing_subword_prefix", "");
  eow_suffix = m.get_or<std::string>("end_of_word_suffix", "");
  fuse_unk = m.get_or<bool>("fuse_unk", false);
  byte_fallback = m.get_or<bool>("byte_fallback", false);
  ignore_merges = m.get_or<bool>("ignore_merges", false);
  if (auto u = m.get_optional<std::string>("unk_token")) {
    auto it = vocab_text.find(*u);
    if (it == vocab_text.end()) fail(file, m.field("unk_token"), "'" + *u + "' is not in the vocabulary");
    unk_id = it->second;
  }

  const json& mj = m.raw("merges");
  if (!mj.is_array()) fail(file, m.field("merges"), "expected an array");
  merges.reserve(mj.size() * 2);
  for (size_t i = 0; i < mj.size(); ++i) {
    std::string f = m.field("merges") + "[" + std::to_string(i) + "]";
    std::string a, b;
    const json& e = mj[i];
    if (e.is_string()) {
      const std::string& s = e.get_ref<const std::string&>();
      size_t sp = s.find(' ');
      if (sp == std::string::npos || s.find(' ', sp + 1) != std::string::npos)
        fail(file, f, "expected \"left right\", got '" + s + "'");
      a = s.substr(0, sp), b = s.substr(sp + 1);
    } else if (e.is_array() && e.size() == 2 && e[0].is_string() && e[1].is_string()) {
      a = e[0].get<std::string>(), b = e[1].get<std::string>();
    } else {
      fail(file, f, "expected \"left right\" or [\"left\", \"right\"]");
    }
    auto ia = vocab_text.find(a), ib = vocab_text.find(b);
    if (ia == vocab_text.end()) fail(file, f, "'" + a + "' is not in the vocabulary");
    if (ib == vocab_text.end()) fail(file, f, "'" + b + "' is not in the vocabulary");
    std::string merged = a + (cont_prefix.empty() || b.rfind(cont_prefix, 0) != 0 ? b : b.substr(cont_prefix.size()));
    auto im = vocab_text.find(merged);
    if (im == vocab_text.end()) fail(file, f, "merged token '" + merged + "' is not in the vocabulary");
    uint64_t key = (uint64_t(uint32_t(ia->second)) << 32) | uint32_t(ib->second);
    merges.emplace(key, std::make_pair(int32_t(i), im->second));  // the first (best) rank wins
  }
}

void TokenizerImpl::load(const json& j) {
  JsonReader r(j, file);
  if (!j.is_object()) fail(file, "", "expected a JSON object");
  if (!r.has_value("model")) fail(file, "model", "missing field");
  if (r.has_value("pre_tokenizer")) parse_pretokenizers(j["pre_tokenizer"], "pre_tokenizer");
  load_model(r.child("model"));
  if (r.has_value("normalizer")) parse_normalizers(j["normalizer"], "normalizer");
  if (r.has_value("post_processor")) parse_post(j["post_processor"], "post_processor");
  if (r.has_value("decoder")) parse_decoders(j["decoder"], "decoder");

  // Model-space vocabulary.
  std::fill(std::begin(byte_ids), std::end(byte_ids), -1);
  vocab.reserve(vocab_text.size());
  for (auto& [t, id] : vocab_text) {
    if (byte_level) {
      if (auto raw = byte_level_decode(t)) {
        vocab.emplace(*raw, id);
        if (raw->size() == 1) byte_ids[static_cast<unsigned char>((*raw)[0])] = id;
      }
    } else {
      vocab.emplace(t, id);
    }
  }

  if (r.has_value("added_tokens")) {
    const json& list = r.raw("added_tokens");
    if (!list.is_array()) fail(file, "added_tokens", "expected an array");
    for (size_t i = 0; i < list.size(); ++i) {
      JsonReader a(list[i], file, "added_tokens[" + std::to_string(i) + "]");
      AddedToken t{.id = a.get<TokenId>("id"), .content = a.get<std::string>("content"),
                   .single_word = a.get_or<bool>("single_word", false), .lstrip = a.get_or<bool>("lstrip", false),
                   .rstrip = a.get_or<bool>("rstrip", false), .normalized = a.get_or<bool>("normalized", false),
                   .special = a.get_or<bool>("special", false)};
      if (t.id < 0) fail(file, a.field("id"), "negative id");
      if (t.content.empty()) fail(file, a.field("content"), "empty added token");
      if (utf8::first_invalid(t.content) != std::string::npos) fail(file, a.field("content"), "not valid UTF-8");
      added_by_id[t.id] = added.size();
      if (size_t(t.id) >= id_text.size()) {
        id_text.resize(size_t(t.id) + 1);
        id_present.resize(size_t(t.id) + 1, false);
      }
      if (!id_present[size_t(t.id)]) id_text[size_t(t.id)] = t.content, id_present[size_t(t.id)] = true;
      added.push_back(std::move(t));
    }
    // Tokens with normalized=false are matched on the raw text; the others after normalization
    // (their content normalized the same way), as HF's added vocabulary does.
    for (size_t i = 0; i < added.size(); ++i) {
      if (added[i].normalized) {
        NormStr n = normalize(added[i].content, 0);
        if (!n.s.empty()) norm_matcher.add(n.s, int(i));
      } else {
        raw_matcher.add(added[i].content, int(i));
      }
    }
  }
}

// ---------------------------------------------------------------- normalization
void TokenizerImpl::apply_normalizer(const Normalizer& n, NormStr& ns) const {
  const std::string& s = ns.s;
  if (s.empty()) return;
  thread_local std::vector<CharChange> items;
  switch (n.kind) {
    case NormKind::NFC: case NormKind::NFD: case NormKind::NFKC: case NormKind::NFKD: {
      bool ascii = std::all_of(s.begin(), s.end(), [](char c) { return static_cast<unsigned char>(c) < 0x80; });
      if (ascii) return;  // every normal form leaves ASCII alone
      normal_form_changes(s, n.kind == NormKind::NFC || n.kind == NormKind::NFKC,
                          n.kind == NormKind::NFKC || n.kind == NormKind::NFKD, items);
      if (!is_identity(s, items)) transform(ns, items, 0);
      return;
    }
    case NormKind::Lowercase:
      lowercase_changes(s, items);
      if (!is_identity(s, items)) transform(ns, items, 0);
      return;
    case NormKind::Replace: {
      std::vector<std::pair<uint32_t, uint32_t>> m;
      if (n.pattern_regex) {
        n.pattern_regex->find_all(s, 0, uint32_t(s.size()), m);
      } else if (!n.pattern_string.empty()) {
        for (size_t p = s.find(n.pattern_string); p != std::string::npos; p = s.find(n.pattern_string, p + n.pattern_string.size()))
          m.emplace_back(uint32_t(p), uint32_t(p + n.pattern_string.size()));
      }
      if (m.empty()) return;
      // HF removes the match, then inserts the content: every inserted character takes the
      // range of the character before it, i.e. the match's last character.
      NormBuilder nb;
      nb.out.base = ns.base;
      size_t at = 0;
      for (auto [b, e] : m) {
        nb.copy(ns, at, b);
        if (!n.content.empty()) nb.emit(n.content, char_align_before(ns, e));
        at = e;
      }
      nb.copy(ns, at, s.size());
      ns = std::move(nb.out);
      return;
    }
    case NormKind::Prepend: {
      // HF: the first prepended character replaces the first character (taking its range), the
      // rest and that character are inserted after it (the same range).
      NormBuilder nb;
      nb.out.base = ns.base;
      nb.emit(n.content, char_align(ns, 0));
      nb.copy(ns, 0, s.size());
      ns = std::move(nb.out);
      return;
    }
    case NormKind::Strip: {
      // Leading and trailing Unicode White_Space characters go; the last kept character carries
      // the removal of the trailing ones (HF's change list). Checked against Hugging Face
      // tokenizers 0.22.2 (tests/text/test_tokenizer_hf_native.py): some older HF versions
      // compared character indices with the byte length and kept trailing whitespace after
      // multi-byte text; 0.22.2 strips it all, as here.
      size_t count = 0, lead = 0, trail = 0, len;
      std::vector<char32_t> cs;
      cs.reserve(s.size());
      for (size_t i = 0; i < s.size(); i += len) cs.push_back(utf8::decode_at(s, i, &len));
      count = cs.size();
      if (n.strip_left)
        while (lead < count && is_unicode_whitespace(cs[lead])) ++lead;
      if (n.strip_right)
        while (trail < count && is_unicode_whitespace(cs[count - 1 - trail])) ++trail;
      if (lead == 0 && trail == 0) return;
      const size_t cut = count - trail;
      items.clear();
      for (size_t i = 0; i < count; ++i) {
        if (i < lead || i >= cut) continue;
        items.push_back({cs[i], i + 1 == cut ? -int32_t(trail) : 0});
      }
      transform(ns, items, lead);
      return;
    }
  }
}

NormStr TokenizerImpl::normalize(std::string_view text, uint32_t base) const {
  NormStr ns{.s = std::string(text), .base = base};
  for (const auto& n : normalizers) apply_normalizer(n, ns);
  return ns;
}

// ---------------------------------------------------------------- added tokens
// Leftmost-longest matches of added tokens in ns[b, e); the rest becomes plain pieces.
void TokenizerImpl::split_added(const AddedMatcher& m, const NormStr& ns, uint32_t buf, uint32_t b, uint32_t e,
                                std::vector<Piece>& out) const {
  const std::string& s = ns.s;
  std::string_view view(s.data(), e);
  uint32_t plain_start = b;  // start of the pending plain text
  uint32_t i = b;
  auto char_before = [&](uint32_t pos, uint32_t lo) -> std::optional<char32_t> {
    if (pos <= lo) return std::nullopt;
    uint32_t k = pos - 1;
    while (k > lo && utf8::is_continuation(static_cast<unsigned char>(s[k]))) --k;
    size_t len;
    return utf8::decode_at(s, k, &len);
  };
  while (i < e) {
    auto [tok, len] = m.longest(view, i);
    if (tok < 0) {
      ++i;
      continue;
    }
    const AddedToken& t = added[size_t(tok)];
    uint32_t mb = i, me = i + uint32_t(len);
    if (t.single_word) {
      auto before = char_before(mb, b);
      size_t l2;
      bool after_word = me < e && is_word_char(utf8::decode_at(s, me, &l2));
      if ((before && is_word_char(*before)) || after_word) {
        i = me;  // the match is consumed but is not a token
        continue;
      }
    }
    if (t.lstrip) {
      while (mb > plain_start) {
        auto c = char_before(mb, plain_start);
        if (!c || !is_unicode_whitespace(*c)) break;
        uint32_t k = mb - 1;
        while (k > plain_start && utf8::is_continuation(static_cast<unsigned char>(s[k]))) --k;
        mb = k;
      }
    }
    if (t.rstrip) {
      size_t l2;
      while (me < e && is_unicode_whitespace(utf8::decode_at(s, me, &l2))) me += uint32_t(l2);
    }
    if (mb > plain_start) out.push_back({.buf = buf, .b = plain_start, .e = mb});
    out.push_back({.buf = buf, .b = mb, .e = me, .added = t.id, .special = t.special});
    plain_start = i = me;
  }
  if (e > plain_start) out.push_back({.buf = buf, .b = plain_start, .e = e});
}

// ---------------------------------------------------------------- pre-tokenization
namespace {
// Applies split behavior to the matches of one piece.
void split_piece(const Piece& p, const std::vector<std::pair<uint32_t, uint32_t>>& matches, Behavior behavior,
                 bool invert, std::vector<Piece>& out) {
  struct Seg {
    uint32_t b, e;
    bool match;
  };
  std::vector<Seg> segs;
  uint32_t at = p.b;
  for (auto [mb, me] : matches) {
    if (mb > at) segs.push_back({at, mb, invert});
    segs.push_back({mb, me, !invert});
    at = me;
  }
  if (p.e > at) segs.push_back({at, p.e, invert});
  std::vector<std::pair<uint32_t, uint32_t>> res;
  switch (behavior) {
    case Behavior::Removed:
      for (auto& s : segs)
        if (!s.match) res.emplace_back(s.b, s.e);
      break;
    case Behavior::Isolated:
      for (auto& s : segs) res.emplace_back(s.b, s.e);
      break;
    case Behavior::Contiguous: {
      // HF merges any two neighbours of the same kind: adjacent matches, and (with invert)
      // adjacent former matches, which are separate segments here.
      bool prev = false;
      for (auto& s : segs) {
        if (s.match == prev && !res.empty())
          res.back().second = s.e;
        else
          res.emplace_back(s.b, s.e);
        prev = s.match;
      }
      break;
    }
    case Behavior::MergedWithPrevious: {
      bool prev = false;
      for (auto& s : segs) {
        if (s.match && !prev && !res.empty())
          res.back().second = s.e;
        else
          res.emplace_back(s.b, s.e);
        prev = s.match;
      }
      break;
    }
    case Behavior::MergedWithNext: {
      bool prev = false;
      for (size_t k = segs.size(); k-- > 0;) {
        auto& s = segs[k];
        if (s.match && !prev && !res.empty())
          res.back().first = s.b;
        else
          res.emplace_back(s.b, s.e);
        prev = s.match;
      }
      std::reverse(res.begin(), res.end());
      break;
    }
  }
  for (auto [b, e] : res)
    if (e > b) out.push_back({.buf = p.buf, .b = b, .e = e});
}
}  // namespace

void TokenizerImpl::pre_tokenize(std::vector<NormStr>& pool, std::vector<Piece>& pieces) const {
  std::vector<Piece> next;
  std::vector<std::pair<uint32_t, uint32_t>> matches;
  for (const auto& pt : pretokenizers) {
    next.clear();
    next.reserve(pieces.size() * 2);
    for (const Piece& p : pieces) {
      if (p.added >= 0) {
        next.push_back(p);
        continue;
      }
      const std::string& s = pool[p.buf].s;
      matches.clear();
      switch (pt.kind) {
        case PreKind::Split:
          if (pt.regex) {
            pt.regex->find_all(s, p.b, p.e, matches);
          } else if (!pt.literal.empty()) {
            std::string_view v(s.data(), p.e);
            for (size_t k = v.find(pt.literal, p.b); k != std::string_view::npos; k = v.find(pt.literal, k + pt.literal.size()))
              matches.emplace_back(uint32_t(k), uint32_t(k + pt.literal.size()));
          }
          split_piece(p, matches, pt.behavior, pt.invert, next);
          break;
        case PreKind::Digits:
          pt.regex->find_all(s, p.b, p.e, matches);
          split_piece(p, matches, Behavior::Isolated, false, next);
          break;
        case PreKind::Punctuation:
          pt.regex->find_all(s, p.b, p.e, matches);
          split_piece(p, matches, pt.behavior, false, next);
          break;
        case PreKind::Whitespace:
        case PreKind::WhitespaceSplit:
          // Keep the matches only.
          pt.regex->find_all(s, p.b, p.e, matches);
          split_piece(p, matches, Behavior::Removed, true, next);
          break;
        case PreKind::ByteLevel: {
          Piece q = p;
          if (pt.add_prefix_space && s[p.b] != ' ') {
            // HF prepends: the space takes the first character's range.
            const NormStr& src = pool[p.buf];
            NormBuilder nb;
            nb.out.base = src.o0(p.b);
            nb.emit(" ", char_align(src, p.b));
            nb.copy(src, p.b, p.e);
            pool.push_back(std::move(nb.out));
            q = {.buf = uint32_t(pool.size() - 1), .b = 0, .e = uint32_t(pool.back().s.size())};
          }
          if (pt.regex) {
            pt.regex->find_all(pool[q.buf].s, q.b, q.e, matches);
            split_piece(q, matches, Behavior::Isolated, false, next);
          } else {
            next.push_back(q);
          }
          break;
        }
        case PreKind::Metaspace: {
          // HF: replace every space (the replacement takes the space's range), then prepend the
          // replacement unless the text now starts with it ("first": only for the split at
          // the very start of the input); the prepended one takes the first character's range.
          const NormStr& src = pool[p.buf];
          NormBuilder nb;
          nb.out.base = src.o0(p.b);
          for (uint32_t k = p.b; k < p.e; ++k) {
            if (s[k] == ' ')
              nb.emit(pt.replacement, char_align(src, k));
            else
              nb.copy(src, k, k + 1);
          }
          bool prepend = pt.prepend == PrependScheme::Always || (pt.prepend == PrependScheme::First && src.o0(p.b) == 0);
          if (prepend && nb.out.s.compare(0, pt.replacement.size(), pt.replacement) != 0) {
            NormBuilder pb;
            pb.out.base = nb.out.base;
            pb.emit(pt.replacement, char_align(nb.out, 0));
            pb.copy(nb.out, 0, nb.out.s.size());
            nb = std::move(pb);
          }
          pool.push_back(std::move(nb.out));
          Piece q{.buf = uint32_t(pool.size() - 1), .b = 0, .e = uint32_t(pool.back().s.size())};
          if (pt.split) {
            const std::string& t = pool[q.buf].s;
            for (size_t k = t.find(pt.replacement); k != std::string::npos; k = t.find(pt.replacement, k + pt.replacement.size()))
              matches.emplace_back(uint32_t(k), uint32_t(k + pt.replacement.size()));
            split_piece(q, matches, Behavior::MergedWithNext, false, next);
          } else {
            next.push_back(q);
          }
          break;
        }
      }
    }
    pieces.swap(next);
  }
}

// ---------------------------------------------------------------- BPE
void TokenizerImpl::bpe(std::string_view word, std::vector<BpeToken>& out) const {
  if (word.size() > kCacheMaxWord) {  // long runs are rare: do not let them fill the cache
    bpe_uncached(word, out);
    return;
  }
  {
    std::lock_guard<std::mutex> lock(cache_mu);
    auto it = cache.find(word);
    if (it != cache.end()) {
      out.insert(out.end(), it->second.begin(), it->second.end());
      return;
    }
  }
  std::vector<BpeToken> toks;
  bpe_uncached(word, toks);
  out.insert(out.end(), toks.begin(), toks.end());
  std::lock_guard<std::mutex> lock(cache_mu);
  if (cache.size() >= kCacheMax) cache.clear();
  cache.emplace(std::string(word), std::move(toks));
}

void TokenizerImpl::bpe_uncached(std::string_view word, std::vector<BpeToken>& out) const {
  if (ignore_merges && cont_prefix.empty() && eow_suffix.empty()) {
    auto it = vocab.find(std::string(word));
    if (it != vocab.end()) {
      out.push_back({it->second, uint32_t(word.size())});
      return;
    }
  }
  // Symbols: doubly linked list over the initial units (bytes, or characters).
  struct Sym {
    TokenId id;
    uint32_t len, skip;
    int prev, next;
  };
  std::vector<Sym> sym;
  sym.reserve(word.size());
  bool last_unk = false;
  uint32_t pending_skip = 0;
  auto push = [&](TokenId id, uint32_t len) {
    int k = int(sym.size());
    sym.push_back({id, len, pending_skip, k - 1, -1});
    pending_skip = 0;
    if (k > 0) sym[size_t(k - 1)].next = k;
  };
  // A character without token or unk_token is left out, as in HF: its neighbours become
  // adjacent and may merge. Its bytes are remembered so that offsets stay right.
  auto drop = [&](uint32_t len) {
    pending_skip += len;
    last_unk = false;
  };
  size_t i = 0;
  while (i < word.size()) {
    size_t len = 1;
    TokenId id = -1;
    if (byte_level) {
      id = byte_ids[static_cast<unsigned char>(word[i])];
    } else {
      len = utf8::sequence_length(word, i);
      if (len == 0) len = 1;
      std::string unit(word.substr(i, len));
      if (i > 0 && !cont_prefix.empty()) unit = cont_prefix + unit;
      if (i + len == word.size() && !eow_suffix.empty()) unit += eow_suffix;
      auto it = vocab.find(unit);
      if (it != vocab.end()) id = it->second;
    }
    if (id >= 0) {
      push(id, uint32_t(len));
      last_unk = false;
    } else if (byte_fallback) {
      bool all = true;
      std::vector<TokenId> bytes;
      for (size_t k = 0; k < len; ++k) {
        char name[8];
        std::snprintf(name, sizeof name, "<0x%02X>", static_cast<unsigned char>(word[i + k]));
        auto it = vocab.find(name);
        if (it == vocab.end()) {
          all = false;
          break;
        }
        bytes.push_back(it->second);
      }
      if (all) {
        for (size_t k = 0; k < bytes.size(); ++k) push(bytes[k], 1);
      } else if (unk_id) {
        push(*unk_id, uint32_t(len));
      } else {
        drop(uint32_t(len));
      }
      last_unk = false;
    } else if (unk_id) {
      if (fuse_unk && last_unk)
        sym.back().len += uint32_t(len);
      else
        push(*unk_id, uint32_t(len));
      last_unk = true;
    } else {
      // No token and no unk_token: Hugging Face leaves the character out, and so does atlas.
      drop(uint32_t(len));
    }
    i += len;
  }

  struct Cand {
    int32_t rank;
    int pos;
    TokenId merged;
    bool operator>(const Cand& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
  };
  std::priority_queue<Cand, std::vector<Cand>, std::greater<Cand>> heap;
  auto find_merge = [&](int a) -> const std::pair<int32_t, TokenId>* {
    int b = sym[size_t(a)].next;
    if (b < 0) return nullptr;
    auto it = merges.find((uint64_t(uint32_t(sym[size_t(a)].id)) << 32) | uint32_t(sym[size_t(b)].id));
    return it == merges.end() ? nullptr : &it->second;
  };
  for (int k = 0; k + 1 < int(sym.size()); ++k)
    if (auto m = find_merge(k)) heap.push({m->first, k, m->second});
  while (!heap.empty()) {
    Cand c = heap.top();
    heap.pop();
    Sym& s = sym[size_t(c.pos)];
    if (s.len == 0) continue;  // merged away
    auto m = find_merge(c.pos);
    if (!m || m->first != c.rank || m->second != c.merged) continue;  // stale
    int nx = s.next;
    s.id = c.merged;
    s.len += sym[size_t(nx)].skip + sym[size_t(nx)].len;
    sym[size_t(nx)].len = 0;
    s.next = sym[size_t(nx)].next;
    if (s.next >= 0) sym[size_t(s.next)].prev = c.pos;
    if (s.prev >= 0)
      if (auto pm = find_merge(s.prev)) heap.push({pm->first, s.prev, pm->second});
    if (auto nm = find_merge(c.pos)) heap.push({nm->first, c.pos, nm->second});
  }
  for (int k = sym.empty() ? -1 : 0; k >= 0; k = sym[size_t(k)].next)
    out.push_back({sym[size_t(k)].id, sym[size_t(k)].len, sym[size_t(k)].skip});
}

// ---------------------------------------------------------------- encode
Encoding TokenizerImpl::encode(std::string_view text, const EncodeOptions& opt) const {
  if (size_t bad = utf8::first_invalid(text); bad != std::string_view::npos)
    fail("input", "", "text is not valid UTF-8 (byte " + std::to_string(bad) + ")");
  if (text.size() >= (size_t(1) << 31)) fail("input", "", "text longer than 2 GiB");

  struct Tok {
    TokenId id;
    uint32_t ob, oe;
    bool special;
    std::string_view model_text;  // for offset trimming
  };
  std::vector<Tok> toks;
  toks.reserve(text.size() / 3 + 4);

  std::vector<NormStr> pool;
  pool.push_back({.s = std::string(text)});
  std::vector<Piece> top;
  if (!raw_matcher.empty())
    split_added(raw_matcher, pool[0], 0, 0, uint32_t(text.size()), top);
  else if (!text.empty())
    top.push_back({.buf = 0, .b = 0, .e = uint32_t(text.size())});

  std::vector<Piece> pieces;
  std::vector<BpeToken> bt;
  for (const Piece& tp : top) {
    if (tp.added >= 0) {
      toks.push_back({tp.added, tp.b, tp.e, tp.special, {}});
      continue;
    }
    pieces.clear();
    uint32_t buf = uint32_t(pool.size());
    pool.push_back(normalize(std::string_view(text).substr(tp.b, tp.e - tp.b), tp.b));
    if (pool[buf].s.empty()) continue;
    if (!norm_matcher.empty())
      split_added(norm_matcher, pool[buf], buf, 0, uint32_t(pool[buf].s.size()), pieces);
    else
      pieces.push_back({.buf = buf, .b = 0, .e = uint32_t(pool[buf].s.size())});
    pre_tokenize(pool, pieces);
    for (const Piece& p : pieces) {
      const NormStr& ns = pool[p.buf];
      if (p.added >= 0) {
        toks.push_back({p.added, ns.o0(p.b), ns.o1(p.e - 1), p.special, {}});
        continue;
      }
      bt.clear();
      bpe(std::string_view(ns.s).substr(p.b, p.e - p.b), bt);
      uint32_t at = p.b;
      for (const BpeToken& t : bt) {
        at += t.skip;  // characters left out (no token, no unk_token)
        toks.push_back({t.id, ns.o0(at), ns.o1(at + t.len - 1), false, {}});
        at += t.len;
      }
    }
  }

  // Original byte ranges -> code points, as HF's BytesToCharOffsetConverter: the start is the
  // character holding its byte; the end is the character holding byte `end` (the count at the
  // end of the text). An untransformed string aligns single bytes, so a byte-level token ending
  // inside a character is first widened to that character's end (HF aligns whole characters).
  // A start past the text (only an empty range at its end) has no character: HF leaves the
  // byte offsets as they are there.
  const size_t ncp_guess = text.size();
  std::vector<uint32_t> cp_at(text.size() + 1, 0);      // code point index of the character holding byte i
  std::vector<uint32_t> char_end(text.size() + 1, 0);   // end byte of that character
  std::vector<uint32_t> cp_byte;                         // code point -> its first byte (and the end)
  cp_byte.reserve(ncp_guess + 1);
  {
    uint32_t cp = 0;
    for (size_t i = 0; i < text.size();) {
      size_t len = lead_len(static_cast<unsigned char>(text[i]));
      cp_byte.push_back(uint32_t(i));
      for (size_t k = 0; k < len; ++k) cp_at[i + k] = cp, char_end[i + k] = uint32_t(i + len);
      i += len;
      ++cp;
    }
    cp_at[text.size()] = cp;
    char_end[text.size()] = uint32_t(text.size());
    cp_byte.push_back(uint32_t(text.size()));
  }
  struct CpTok {
    TokenId id;
    int64_t s, e;  // code points
    bool special;
    bool raw = false;  // HF kept byte offsets (no character at the start)
  };
  std::vector<CpTok> ctoks;
  ctoks.reserve(toks.size() + 2);
  for (const Tok& t : toks) {
    if (t.ob >= text.size()) {
      ctoks.push_back({t.id, t.ob, t.oe, t.special, true});
      continue;
    }
    uint32_t oe = t.oe > t.ob ? char_end[t.oe - 1] : t.oe;
    ctoks.push_back({t.id, cp_at[t.ob], cp_at[std::min<size_t>(oe, text.size())], t.special});
  }

  // Post-processing (only with add_special_tokens; offsets trimming always, as HF does). HF
  // trims after converting to code points, so the counts below are characters.
  if (post.byte_level && post.trim_offsets) {
    // Offsets leave out the spaces a token starts or ends with ("Ġ" = U+0120 is a space byte),
    // except the single space ByteLevel(add_prefix_space) put before the first word.
    auto is_space = [](char32_t c) { return c == 0x120 || is_unicode_whitespace(c); };
    for (size_t i = 0; i < ctoks.size(); ++i) {
      CpTok& t = ctoks[i];
      if (size_t(t.id) >= id_text.size()) continue;
      const std::string& s = id_text[size_t(t.id)];
      std::vector<char32_t> cs;
      for (size_t q = 0, len; q < s.size(); q += len) cs.push_back(utf8::decode_at(s, q, &len));
      int64_t lead = 0, trail = 0;
      while (lead < int64_t(cs.size()) && is_space(cs[size_t(lead)])) ++lead;
      while (trail < int64_t(cs.size()) && is_space(cs[cs.size() - 1 - size_t(trail)])) ++trail;
      if (lead == 1 && post.add_prefix_space && (i == 0 || t.s == 0)) lead = 0;
      if (lead) t.s = std::min(t.s + lead, t.e);
      if (trail && t.e >= trail) t.e = std::max(t.e - trail, t.s);
    }
  }
  std::vector<CpTok> final_toks;
  if (opt.add_special_tokens) {
    if (config.add_bos_token.has_value() || config.add_eos_token.has_value()) {
      if (config.add_bos_token.value_or(false) && bos) final_toks.push_back({*bos, 0, 0, true});
      final_toks.insert(final_toks.end(), ctoks.begin(), ctoks.end());
      if (config.add_eos_token.value_or(false) && eos) final_toks.push_back({*eos, 0, 0, true});
    } else if (post.has_template) {
      for (const auto& tp : post.single) {
        if (tp.is_sequence)
          final_toks.insert(final_toks.end(), ctoks.begin(), ctoks.end());
        else
          for (TokenId id : tp.special_ids) final_toks.push_back({id, 0, 0, true});
      }
    } else {
      final_toks = std::move(ctoks);
    }
  } else {
    final_toks = std::move(ctoks);
  }

  Encoding enc;
  enc.ids.reserve(final_toks.size());
  enc.offsets.reserve(final_toks.size());
  enc.byte_offsets.reserve(final_toks.size());
  enc.special.reserve(final_toks.size());
  const int64_t ncp = int64_t(cp_byte.size()) - 1;
  auto byte_of = [&](int64_t cp) -> int64_t { return cp_byte[size_t(std::clamp<int64_t>(cp, 0, ncp))]; };
  for (const CpTok& t : final_toks) {
    enc.ids.push_back(t.id);
    enc.special.push_back(t.special);
    enc.offsets.push_back({t.s, t.e});
    // The same span in bytes (whole characters).
    enc.byte_offsets.push_back(t.raw ? Span{t.s, t.e} : Span{byte_of(t.s), byte_of(t.e)});
  }
  return enc;
}

std::vector<std::pair<std::string, Span>> TokenizerImpl::pre_tokenize_strings(std::string_view text) const {
  if (size_t bad = utf8::first_invalid(text); bad != std::string_view::npos)
    fail("input", "", "text is not valid UTF-8 (byte " + std::to_string(bad) + ")");
  // Code point index of the character holding each byte (and the count at the end).
  std::vector<uint32_t> cp_at(text.size() + 1, 0);
  uint32_t cp = 0;
  for (size_t i = 0; i < text.size(); ++i) {
    if (i > 0 && !utf8::is_continuation(static_cast<unsigned char>(text[i]))) ++cp;
    cp_at[i] = cp;
  }
  cp_at[text.size()] = text.empty() ? 0 : cp + 1;
  std::vector<std::pair<std::string, Span>> out;
  std::vector<NormStr> pool;
  pool.push_back({.s = std::string(text)});
  std::vector<Piece> top;
  if (!raw_matcher.empty())
    split_added(raw_matcher, pool[0], 0, 0, uint32_t(text.size()), top);
  else if (!text.empty())
    top.push_back({.buf = 0, .b = 0, .e = uint32_t(text.size())});
  auto span_of = [&](uint32_t ob, uint32_t oe) -> Span {
    if (oe <= ob) return {cp_at[ob], cp_at[ob]};
    return {cp_at[ob], cp_at[oe - 1] + 1};
  };
  for (const Piece& tp : top) {
    if (tp.added >= 0) {
      out.push_back({std::string(text.substr(tp.b, tp.e - tp.b)), span_of(tp.b, tp.e)});
      continue;
    }
    uint32_t buf = uint32_t(pool.size());
    pool.push_back(normalize(text.substr(tp.b, tp.e - tp.b), tp.b));
    if (pool[buf].s.empty()) continue;
    std::vector<Piece> pieces;
    if (!norm_matcher.empty())
      split_added(norm_matcher, pool[buf], buf, 0, uint32_t(pool[buf].s.size()), pieces);
    else
      pieces.push_back({.buf = buf, .b = 0, .e = uint32_t(pool[buf].s.size())});
    pre_tokenize(pool, pieces);
    for (const Piece& p : pieces) {
      const NormStr& ns = pool[p.buf];
      out.push_back({ns.s.substr(p.b, p.e - p.b), span_of(ns.o0(p.b), ns.o1(p.e - 1))});
    }
  }
  return out;
}

// ---------------------------------------------------------------- decode
std::string TokenizerImpl::decode(std::span<const TokenId> ids, const DecodeOptions& opt) const {
  std::vector<std::string> toks;
  toks.reserve(ids.size());
  for (size_t i = 0; i < ids.size(); ++i) {
    TokenId id = ids[i];
    auto ai = added_by_id.find(id);
    if (ai != added_by_id.end()) {
      const AddedToken& t = added[ai->second];
      if (opt.skip_special_tokens && t.special) continue;
      toks.push_back(t.content);
      continue;
    }
    if (id < 0 || size_t(id) >= id_text.size() || !id_present[size_t(id)]) {
      if (opt.skip_unknown_ids) continue;
      fail("ids", "[" + std::to_string(i) + "]", "token id " + std::to_string(id) + " is not in the vocabulary");
    }
    toks.push_back(id_text[size_t(id)]);
  }
  if (!has_decoder) {
    std::string out;
    for (size_t i = 0; i < toks.size(); ++i) out += (i ? " " : "") + toks[i];
    return out;
  }
  for (const Decoder& d : decoders) {
    switch (d.kind) {
      case DecKind::ByteLevel: {
        std::string bytes;
        for (const auto& t : toks) {
          if (auto raw = byte_level_decode(t))
            bytes += *raw;
          else
            bytes += t;  // a token outside the byte alphabet (an added token) stays as it is
        }
        toks.assign(1, utf8::lossy(bytes));
        break;
      }
      case DecKind::Replace:
        for (auto& t : toks) {
          std::vector<std::pair<uint32_t, uint32_t>> m;
          if (d.pattern_regex)
            d.pattern_regex->find_all(t, 0, uint32_t(t.size()), m);
          else if (!d.pattern_string.empty())
            for (size_t p = t.find(d.pattern_string); p != std::string::npos; p = t.find(d.pattern_string, p + d.pattern_string.size()))
              m.emplace_back(uint32_t(p), uint32_t(p + d.pattern_string.size()));
          if (m.empty()) continue;
          std::string o;
          size_t at = 0;
          for (auto [b, e] : m) o.append(t, at, b - at), o += d.content, at = e;
          o.append(t, at);
          t = std::move(o);
        }
        break;
      case DecKind::Fuse: {
        std::string all;
        for (auto& t : toks) all += t;
        toks.assign(1, std::move(all));
        break;
      }
      case DecKind::Strip:
        for (auto& t : toks) {
          size_t b = 0, e = t.size();
          const std::string& c = d.strip_char;
          for (int k = 0; k < d.strip_start && !c.empty() && t.compare(b, c.size(), c) == 0; ++k) b += c.size();
          for (int k = 0; k < d.strip_stop && !c.empty() && e >= b + c.size() && t.compare(e - c.size(), c.size(), c) == 0; ++k)
            e -= c.size();
          t = t.substr(b, e - b);
        }
        break;
      case DecKind::ByteFallback: {
        std::vector<std::string> out;
        std::string pending;
        auto flush = [&] {
          if (pending.empty()) return;
          if (utf8::first_invalid(pending) == std::string::npos)
            out.push_back(pending);
          else
            for (size_t k = 0; k < pending.size(); ++k) out.push_back("\xEF\xBF\xBD");
          pending.clear();
        };
        for (auto& t : toks) {
          unsigned v;
          if (t.size() == 6 && t.compare(0, 3, "<0x") == 0 && t[5] == '>' && std::sscanf(t.c_str() + 3, "%2X", &v) == 1 &&
              std::isxdigit(static_cast<unsigned char>(t[3])) && std::isxdigit(static_cast<unsigned char>(t[4]))) {
            pending += char(v);
          } else {
            flush();
            out.push_back(t);
          }
        }
        flush();
        toks = std::move(out);
        break;
      }
      case DecKind::Metaspace:
        for (size_t i = 0; i < toks.size(); ++i) {
          std::string o;
          const std::string& t = toks[i];
          for (size_t p = 0; p < t.size();) {
            if (t.compare(p, d.replacement.size(), d.replacement) == 0)
              o += ' ', p += d.replacement.size();
            else
              o += t[p++];
          }
          if (i == 0 && d.prepend != PrependScheme::Never && !o.empty() && o[0] == ' ') o.erase(0, 1);
          toks[i] = std::move(o);
        }
        break;
    }
  }
  std::string out;
  for (auto& t : toks) out += t;
  if (opt.clean_up_tokenization_spaces) {
    // transformers' clean_up_tokenization.
    static const std::pair<const char*, const char*> rules[] = {
        {" .", "."}, {" ?", "?"}, {" !", "!"}, {" ,", ","}, {" ' ", "'"}, {" n't", "n't"},
        {" 'm", "'m"}, {" 's", "'s"}, {" 've", "'ve"}, {" 're", "'re"}};
    for (auto [from, to] : rules) {
      std::string o;
      std::string_view f(from);
      size_t at = 0;
      for (size_t p = out.find(f); p != std::string::npos; p = out.find(f, p + f.size())) {
        o.append(out, at, p - at);
        o += to;
        at = p + f.size();
      }
      o.append(out, at);
      out = std::move(o);
    }
  }
  return out;
}

// ================================================================ config
const std::string* TokenizerConfig::chat_template(std::string_view name) const {
  for (const auto& t : chat_templates)
    if (t.name == name) return &t.text;
  if (chat_templates.size() == 1 && name == "default") return &chat_templates[0].text;
  return nullptr;
}

TokenizerConfig parse_tokenizer_config(const std::string& text, const std::string& file) {
  json j = parse_json(text, file);
  if (!j.is_object()) fail(file, "", "expected a JSON object");
  JsonReader r(j, file);
  TokenizerConfig c;
  auto token = [&](const char* key) -> std::optional<std::string> {
    if (!r.has_value(key)) return std::nullopt;
    const json& v = j[key];
    if (v.is_string()) return v.get<std::string>();
    if (v.is_object()) return r.child(key).get<std::string>("content");
    fail(file, key, "expected a string or an object with \"content\", got " + v.dump());
  };
  c.bos_token = token("bos_token");
  c.eos_token = token("eos_token");
  c.pad_token = token("pad_token");
  c.unk_token = token("unk_token");
  c.add_bos_token = r.get_optional<bool>("add_bos_token");
  c.add_eos_token = r.get_optional<bool>("add_eos_token");
  c.clean_up_tokenization_spaces = r.get_or<bool>("clean_up_tokenization_spaces", false);
  c.tokenizer_class = r.get_or<std::string>("tokenizer_class", "");
  if (r.has_value("model_max_length")) c.model_max_length = r.get<double>("model_max_length");
  if (r.has_value("chat_template")) {
    const json& t = j["chat_template"];
    if (t.is_string()) {
      c.chat_templates.push_back({.name = "default", .text = t.get<std::string>()});
    } else if (t.is_array()) {
      for (size_t i = 0; i < t.size(); ++i) {
        JsonReader e(t[i], file, "chat_template[" + std::to_string(i) + "]");
        c.chat_templates.push_back({.name = e.get<std::string>("name"), .text = e.get<std::string>("template")});
      }
    } else {
      fail(file, "chat_template", "expected a string or a list of {name, template}");
    }
  }
  return c;
}

// ================================================================ public API
Tokenizer::Tokenizer(std::unique_ptr<TokenizerImpl> impl) : impl_(std::move(impl)) {}
Tokenizer::Tokenizer(Tokenizer&&) noexcept = default;
Tokenizer& Tokenizer::operator=(Tokenizer&&) noexcept = default;
Tokenizer::~Tokenizer() = default;

Tokenizer Tokenizer::from_json(const std::string& tokenizer_json, const std::string& config_json,
                               const std::string& origin) {
  auto impl = std::make_unique<TokenizerImpl>();
  impl->file = origin;
  impl->load(parse_json(tokenizer_json, origin));
  if (!config_json.empty()) {
    std::string cfile = origin;
    if (auto slash = cfile.rfind('/'); slash != std::string::npos)
      cfile = cfile.substr(0, slash + 1) + "tokenizer_config.json";
    else
      cfile = "tokenizer_config.json";
    impl->config = parse_tokenizer_config(config_json, cfile);
    auto resolve = [&](const std::optional<std::string>& tok, const char* field) -> std::optional<TokenId> {
      if (!tok) return std::nullopt;
      for (const auto& a : impl->added)
        if (a.content == *tok) return a.id;
      if (auto id = impl->lookup(*tok)) return id;
      fail(cfile, field, "token '" + *tok + "' is not in " + origin + " (vocab or added_tokens)");
    };
    impl->bos = resolve(impl->config.bos_token, "bos_token");
    impl->eos = resolve(impl->config.eos_token, "eos_token");
    impl->pad = resolve(impl->config.pad_token, "pad_token");
    resolve(impl->config.unk_token, "unk_token");
  }
  return Tokenizer(std::move(impl));
}

Tokenizer Tokenizer::load(const std::string& path) { return from_json(read_file(path), {}, path); }

Tokenizer Tokenizer::load_dir(const std::string& dir) {
  std::string base = dir.empty() || dir.back() == '/' ? dir : dir + "/";
  std::string tj = base + "tokenizer.json", tc = base + "tokenizer_config.json";
  if (!file_exists(tj)) fail(tj, "", "no tokenizer.json in model directory");
  std::string cfg = file_exists(tc) ? read_file(tc) : std::string();
  if (file_exists(tc) && cfg.empty()) fail(tc, "", "empty file");
  return from_json(read_file(tj), cfg, tj);
}

Encoding Tokenizer::encode(std::string_view text, const EncodeOptions& opt) const { return impl_->encode(text, opt); }
std::string Tokenizer::decode(std::span<const TokenId> ids, const DecodeOptions& opt) const {
  return impl_->decode(ids, opt);
}
std::vector<std::pair<std::string, Span>> Tokenizer::pre_tokenize(std::string_view text) const {
  return impl_->pre_tokenize_strings(text);
}
std::optional<TokenId> Tokenizer::token_to_id(std::string_view token) const {
  for (const auto& a : impl_->added)
    if (a.content == token) return a.id;
  return impl_->lookup(token);
}
std::optional<std::string> Tokenizer::id_to_token(TokenId id) const {
  auto ai = impl_->added_by_id.find(id);
  if (ai != impl_->added_by_id.end()) return impl_->added[ai->second].content;
  if (id < 0 || size_t(id) >= impl_->id_text.size() || !impl_->id_present[size_t(id)]) return std::nullopt;
  return impl_->id_text[size_t(id)];
}
bool Tokenizer::is_special(TokenId id) const {
  auto ai = impl_->added_by_id.find(id);
  return ai != impl_->added_by_id.end() && impl_->added[ai->second].special;
}
size_t Tokenizer::vocab_size() const { return impl_->id_text.size(); }
const TokenizerConfig& Tokenizer::config() const { return impl_->config; }
std::optional<TokenId> Tokenizer::bos_id() const { return impl_->bos; }
std::optional<TokenId> Tokenizer::eos_id() const { return impl_->eos; }
std::optional<TokenId> Tokenizer::pad_id() const { return impl_->pad; }

}  // namespace atlas
