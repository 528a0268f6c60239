// Evaluator of the chat-template language: statements, expressions, and the built-in filters,
// tests, globals and str/dict methods, each with the Python/Jinja semantics HF's renderer has.
#include <utf8proc.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <functional>

#include "core/error.h"
#include "text/template.h"
#include "text/template_ast.h"

namespace atlas::tmpl {
namespace {

using K = Value::Kind;

// An error with the position of the innermost node it passed through.
struct Located {
  std::string msg;
  int line, col;
};

[[noreturn]] void rt(const std::string& msg) { throw RuntimeError(msg); }

// Operations that Jinja's default Undefined refuses (arithmetic, attributes, calls).
[[noreturn]] void undefined_error(const Value& v) {
  rt(v.str_ref().empty() ? "value is undefined" : v.str_ref());
}

// ---- string helpers (Python str semantics) --------------------------------------------------

std::string cps_slice(const std::vector<char32_t>& c, size_t a, size_t b) {
  std::string out;
  for (size_t i = a; i < b && i < c.size(); ++i) utf8_append(out, c[i]);
  return out;
}

std::string py_strip(const std::string& s, const Value* chars, bool left, bool right) {
  auto c = utf8_decode(s);
  std::vector<char32_t> set;
  bool ws = !chars || chars->is_none() || chars->is_undefined();
  if (!ws) {
    if (!chars->is_string()) rt("strip arg must be None or str");
    set = utf8_decode(chars->str_ref());
  }
  auto strip_it = [&](char32_t ch) { return ws ? py_isspace(ch) : std::find(set.begin(), set.end(), ch) != set.end(); };
  size_t a = 0, b = c.size();
  if (left)
    while (a < b && strip_it(c[a])) ++a;
  if (right)
    while (b > a && strip_it(c[b - 1])) --b;
  return cps_slice(c, a, b);
}

// Python's str.upper/lower/title use Unicode's full case mappings (SpecialCasing.txt), where
// one character may become several (ß -> SS). utf8proc offers the simple mappings only, so the
// unconditional multi-character ones for Latin/Armenian letters and ligatures are listed here,
// plus the final-sigma rule of str.lower. (Greek letters with iota subscript keep the simple mapping.)
struct SpecialCase {
  char32_t c;
  const char32_t* upper;
  const char32_t* title;
};
const SpecialCase kSpecialCases[] = {
    {0x00DF, U"SS", U"Ss"},
    {0x0149, U"\u02BCN", U"\u02BCN"},
    {0x01F0, U"J\u030C", U"J\u030C"},
    {0x0587, U"\u0535\u0552", U"\u0535\u0582"},
    {0x1E96, U"H\u0331", U"H\u0331"},
    {0x1E97, U"T\u0308", U"T\u0308"},
    {0x1E98, U"W\u030A", U"W\u030A"},
    {0x1E99, U"Y\u030A", U"Y\u030A"},
    {0x1E9A, U"A\u02BE", U"A\u02BE"},
    {0xFB00, U"FF", U"Ff"},
    {0xFB01, U"FI", U"Fi"},
    {0xFB02, U"FL", U"Fl"},
    {0xFB03, U"FFI", U"Ffi"},
    {0xFB04, U"FFL", U"Ffl"},
    {0xFB05, U"ST", U"St"},
    {0xFB06, U"ST", U"St"},
    {0xFB13, U"\u0544\u0546", U"\u0544\u0576"},
    {0xFB14, U"\u0544\u0535", U"\u0544\u0565"},
    {0xFB15, U"\u0544\u053B", U"\u0544\u056B"},
    {0xFB16, U"\u054E\u0546", U"\u054E\u0576"},
    {0xFB17, U"\u0544\u053D", U"\u0544\u056D"},
};

bool is_cased(char32_t c) {
  auto cat = utf8proc_category(static_cast<utf8proc_int32_t>(c));
  return cat == UTF8PROC_CATEGORY_LU || cat == UTF8PROC_CATEGORY_LL || cat == UTF8PROC_CATEGORY_LT;
}

// mode: 0 lower, 1 upper, 2 title (for the first letter of a word)
void append_case(std::string& out, const std::vector<char32_t>& cps, size_t i, int mode) {
  char32_t c = cps[i];
  if (mode != 0) {
    for (auto& sc : kSpecialCases)
      if (sc.c == c) {
        for (const char32_t* p = mode == 1 ? sc.upper : sc.title; *p; ++p) utf8_append(out, *p);
        return;
      }
    auto m = mode == 1 ? utf8proc_toupper(static_cast<utf8proc_int32_t>(c)) : utf8proc_totitle(static_cast<utf8proc_int32_t>(c));
    utf8_append(out, static_cast<char32_t>(m));
    return;
  }
  if (c == 0x0130) {  // İ -> i + combining dot above
    out += "i\xCC\x87";
    return;
  }
  if (c == 0x03A3) {  // final sigma: after a cased letter and not before one
    bool before = false, after = false;
    for (size_t k = i; k-- > 0;)
      if (utf8proc_category(static_cast<utf8proc_int32_t>(cps[k])) != UTF8PROC_CATEGORY_MN) {
        before = is_cased(cps[k]);
        break;
      }
    for (size_t k = i + 1; k < cps.size(); ++k)
      if (utf8proc_category(static_cast<utf8proc_int32_t>(cps[k])) != UTF8PROC_CATEGORY_MN) {
        after = is_cased(cps[k]);
        break;
      }
    utf8_append(out, before && !after ? 0x03C2 : 0x03C3);
    return;
  }
  utf8_append(out, static_cast<char32_t>(utf8proc_tolower(static_cast<utf8proc_int32_t>(c))));
}

std::string map_case(const std::string& s, int mode) {  // 0 lower, 1 upper
  auto c = utf8_decode(s);
  std::string out;
  for (size_t i = 0; i < c.size(); ++i) append_case(out, c, i, mode);
  return out;
}

std::string py_title(const std::string& s) {
  auto c = utf8_decode(s);
  std::string out;
  bool prev_cased = false;
  for (size_t i = 0; i < c.size(); ++i) {
    append_case(out, c, i, prev_cased ? 0 : 2);
    prev_cased = is_cased(c[i]);
  }
  return out;
}

// str.capitalize (Python >= 3.8): title-case the first character, lower-case the rest.
std::string py_capitalize(const std::string& s) {
  auto c = utf8_decode(s);
  std::string out;
  for (size_t i = 0; i < c.size(); ++i) append_case(out, c, i, i == 0 ? 2 : 0);
  return out;
}

std::vector<std::string> py_split(const std::string& s, const Value* sep, int64_t maxsplit) {
  std::vector<std::string> out;
  if (!sep || sep->is_none()) {
    auto c = utf8_decode(s);
    size_t i = 0;
    while (i < c.size()) {
      while (i < c.size() && py_isspace(c[i])) ++i;
      if (i >= c.size()) break;
      if (maxsplit >= 0 && static_cast<int64_t>(out.size()) == maxsplit) {
        size_t e = c.size();
        while (e > i && py_isspace(c[e - 1])) --e;
        out.push_back(cps_slice(c, i, e));
        return out;
      }
      size_t j = i;
      while (j < c.size() && !py_isspace(c[j])) ++j;
      out.push_back(cps_slice(c, i, j));
      i = j;
    }
    return out;
  }
  if (!sep->is_string()) rt("must be str or None, not " + sep->type_name());
  const std::string& d = sep->str_ref();
  if (d.empty()) rt("empty separator");
  size_t pos = 0;
  for (;;) {
    if (maxsplit >= 0 && static_cast<int64_t>(out.size()) == maxsplit) break;
    size_t f = s.find(d, pos);
    if (f == std::string::npos) break;
    out.push_back(s.substr(pos, f - pos));
    pos = f + d.size();
  }
  out.push_back(s.substr(pos));
  return out;
}

std::string py_replace(const std::string& s, const std::string& old, const std::string& neu, int64_t count) {
  std::string out;
  if (old.empty()) {  // Python inserts `neu` around every code point
    auto c = utf8_decode(s);
    int64_t n = 0;
    for (size_t i = 0; i <= c.size(); ++i) {
      if (count < 0 || n < count) {
        out += neu;
        ++n;
      }
      if (i < c.size()) utf8_append(out, c[i]);
    }
    return out;
  }
  size_t pos = 0;
  int64_t n = 0;
  for (;;) {
    size_t f = (count < 0 || n < count) ? s.find(old, pos) : std::string::npos;
    if (f == std::string::npos) break;
    out.append(s, pos, f - pos);
    out += neu;
    pos = f + old.size();
    ++n;
  }
  out.append(s, pos, std::string::npos);
  return out;
}

// ---- conversions ------------------------------------------------------------------------------

int64_t to_index(const Value& v, const char* what) {
  if (!v.is_int()) rt(std::string(what) + " must be an integer, not " + v.type_name());
  return v.as_int();
}

const std::string& need_str(const Value& v, const char* what) {
  if (!v.is_string()) rt(std::string(what) + " must be a string, not " + v.type_name());
  return v.str_ref();
}

// Python iteration: list/tuple items, dict keys, str code points, Undefined -> nothing.
ValueList iterate(const Value& v) {
  switch (v.kind()) {
    case K::List:
    case K::Tuple: return v.items();
    case K::Dict: {
      ValueList out;
      for (auto& [k, _] : v.dict_ref().items) out.push_back(k);
      return out;
    }
    case K::String: {
      ValueList out;
      for (char32_t c : utf8_decode(v.str_ref())) {
        std::string s;
        utf8_append(s, c);
        out.emplace_back(std::move(s));
      }
      return out;
    }
    case K::Undefined: return {};
    default: rt("'" + v.type_name() + "' object is not iterable");
  }
}

int64_t py_len(const Value& v) {
  switch (v.kind()) {
    case K::String: return static_cast<int64_t>(utf8_length(v.str_ref()));
    case K::List:
    case K::Tuple: return static_cast<int64_t>(v.items().size());
    case K::Dict: return static_cast<int64_t>(v.dict_ref().items.size());
    case K::Undefined: return 0;
    default: rt("object of type '" + v.type_name() + "' has no len()");
  }
}

// Python ordering (<) for sort/min/max and comparisons.
int py_cmp(const Value& a, const Value& b, bool case_insensitive = false) {
  if (a.is_undefined()) undefined_error(a);
  if (b.is_undefined()) undefined_error(b);
  if (a.is_number() && b.is_number()) {
    if (a.kind() != K::Float && b.kind() != K::Float) return a.as_int() < b.as_int() ? -1 : a.as_int() > b.as_int();
    double x = a.as_float(), y = b.as_float();
    return x < y ? -1 : x > y ? 1 : 0;
  }
  if (a.is_string() && b.is_string()) {
    if (case_insensitive) {
      std::string x = map_case(a.str_ref(), 0), y = map_case(b.str_ref(), 0);
      return x < y ? -1 : x > y;
    }
    return a.str_ref() < b.str_ref() ? -1 : a.str_ref() > b.str_ref();
  }
  if (a.kind() == b.kind() && a.is_seq()) {
    auto &x = a.items(), &y = b.items();
    for (size_t i = 0; i < x.size() && i < y.size(); ++i) {
      if (x[i] == y[i]) continue;
      return py_cmp(x[i], y[i], case_insensitive);
    }
    return x.size() < y.size() ? -1 : x.size() > y.size();
  }
  rt("'<' not supported between instances of '" + a.type_name() + "' and '" + b.type_name() + "'");
}

Value str_method(const std::string& s, const std::string& name);
Value dict_method(const Value& d, const std::string& name);

// Jinja's environment.getattr: attribute first (methods), then item.
Value get_attr(const Value& obj, const std::string& name) {
  switch (obj.kind()) {
    case K::Undefined: undefined_error(obj);
    case K::Dict: {
      if (Value m = dict_method(obj, name); !m.is_undefined()) return m;
      if (const Value* v = obj.dict_ref().find(std::string_view(name))) return *v;
      return Value::undefined("'dict object' has no attribute '" + name + "'");
    }
    case K::Namespace: {
      if (const Value* v = obj.namespace_ref().find(std::string_view(name))) return *v;
      return Value::undefined("'Namespace object' has no attribute '" + name + "'");
    }
    case K::String: {
      if (Value m = str_method(obj.str_ref(), name); !m.is_undefined()) return m;
      break;
    }
    default: break;
  }
  return Value::undefined("'" + obj.type_name() + " object' has no attribute '" + name + "'");
}

// Jinja's environment.getitem: item first, then attribute for string keys.
Value get_item(const Value& obj, const Value& key) {
  switch (obj.kind()) {
    case K::Undefined: undefined_error(obj);
    case K::Dict:
      if (const Value* v = obj.dict_ref().find(key)) return *v;
      break;
    case K::List:
    case K::Tuple:
      if (key.is_int()) {
        int64_t n = static_cast<int64_t>(obj.items().size()), i = key.as_int();
        if (i < 0) i += n;
        if (i >= 0 && i < n) return obj.items()[i];
        return Value::undefined(obj.type_name() + " object has no element " + std::to_string(key.as_int()));
      }
      break;
    case K::String:
      if (key.is_int()) {
        auto c = utf8_decode(obj.str_ref());
        int64_t n = static_cast<int64_t>(c.size()), i = key.as_int();
        if (i < 0) i += n;
        if (i >= 0 && i < n) return Value(cps_slice(c, i, i + 1));
        return Value::undefined("str object has no element " + std::to_string(key.as_int()));
      }
      break;
    default: break;
  }
  if (key.is_string()) return get_attr(obj, key.str_ref());
  return Value::undefined("'" + obj.type_name() + " object' has no attribute " + key.repr());
}

// Python slice semantics over n elements.
std::vector<int64_t> slice_indices(int64_t n, const Value& a, const Value& b, const Value& c) {
  int64_t step = c.is_none() || c.is_undefined() ? 1 : to_index(c, "slice step");
  if (step == 0) rt("slice step cannot be zero");
  auto clamp = [&](const Value& v, int64_t dflt) {
    if (v.is_none() || v.is_undefined()) return dflt;
    int64_t i = to_index(v, "slice index");
    if (i < 0) i += n;
    if (step > 0) return std::clamp<int64_t>(i, 0, n);
    return std::clamp<int64_t>(i, -1, n - 1);
  };
  int64_t start = clamp(a, step > 0 ? 0 : n - 1), stop = clamp(b, step > 0 ? n : -1);
  std::vector<int64_t> idx;
  for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) idx.push_back(i);
  return idx;
}

Value do_slice(const Value& obj, const Value& a, const Value& b, const Value& c) {
  if (obj.is_undefined()) undefined_error(obj);
  if (obj.is_string()) {
    auto cps = utf8_decode(obj.str_ref());
    std::string out;
    for (int64_t i : slice_indices(static_cast<int64_t>(cps.size()), a, b, c)) utf8_append(out, cps[i]);
    return Value(std::move(out));
  }
  if (obj.is_seq()) {
    ValueList out;
    for (int64_t i : slice_indices(static_cast<int64_t>(obj.items().size()), a, b, c)) out.push_back(obj.items()[i]);
    return obj.kind() == K::Tuple ? Value::tuple(std::move(out)) : Value::list(std::move(out));
  }
  return Value::undefined("'" + obj.type_name() + "' object is not subscriptable");
}

// ---- arithmetic -------------------------------------------------------------------------------

Value int_result(__int128 v) {
  if (v > INT64_MAX || v < INT64_MIN) rt("integer overflow (atlas templates use 64-bit integers)");
  return Value(static_cast<int64_t>(v));
}

[[noreturn]] void bad_operands(const std::string& op, const Value& a, const Value& b) {
  if (a.is_undefined()) undefined_error(a);
  if (b.is_undefined()) undefined_error(b);
  rt("unsupported operand type(s) for " + op + ": '" + a.type_name() + "' and '" + b.type_name() + "'");
}

Value repeat(const Value& seq, int64_t n) {
  // Bounded like range(): 'x' * 10**11 is an error naming the template, not an out-of-memory exit.
  const uint64_t unit = seq.is_string() ? seq.str_ref().size() : seq.items().size();
  if (n > 0 && unit > 0 && uint64_t(n) > (seq.is_string() ? 10000000 : 100000) / unit)
    rt(seq.is_string() ? "repetition too big (the sandbox allows 10000000 characters)"
                       : "repetition too big (the sandbox allows 100000 items)");
  if (seq.is_string()) {
    std::string out;
    for (int64_t i = 0; i < n; ++i) out += seq.str_ref();
    return Value(std::move(out));
  }
  ValueList out;
  for (int64_t i = 0; i < n; ++i) out.insert(out.end(), seq.items().begin(), seq.items().end());
  return seq.kind() == K::Tuple ? Value::tuple(std::move(out)) : Value::list(std::move(out));
}

Value binary_op(const std::string& op, const Value& a, const Value& b) {
  if (op == "~") return Value(a.str() + b.str());
  bool nums = a.is_number() && b.is_number();
  bool ints = nums && a.kind() != K::Float && b.kind() != K::Float;
  if (op == "+") {
    if (ints) return int_result(static_cast<__int128>(a.as_int()) + b.as_int());
    if (nums) return Value(a.as_float() + b.as_float());
    if (a.is_string() && b.is_string()) return Value(a.str_ref() + b.str_ref());
    if (a.is_seq() && a.kind() == b.kind()) {
      ValueList out = a.items();
      out.insert(out.end(), b.items().begin(), b.items().end());
      return a.kind() == K::Tuple ? Value::tuple(std::move(out)) : Value::list(std::move(out));
    }
    if (a.is_string() && !b.is_undefined()) rt("can only concatenate str (not \"" + b.type_name() + "\") to str");
    bad_operands(op, a, b);
  }
  if (op == "-") {
    if (ints) return int_result(static_cast<__int128>(a.as_int()) - b.as_int());
    if (nums) return Value(a.as_float() - b.as_float());
    bad_operands(op, a, b);
  }
  if (op == "*") {
    if (ints) return int_result(static_cast<__int128>(a.as_int()) * b.as_int());
    if (nums) return Value(a.as_float() * b.as_float());
    if ((a.is_string() || a.is_seq()) && b.is_int()) return repeat(a, b.as_int());
    if ((b.is_string() || b.is_seq()) && a.is_int()) return repeat(b, a.as_int());
    bad_operands(op, a, b);
  }
  if (op == "%" && a.is_string()) rt("printf-style string formatting ('...' % args) is not supported by atlas's template subset");
  if (!nums) bad_operands(op, a, b);
  if (op == "/") {
    if (b.as_float() == 0) rt("division by zero");
    return Value(a.as_float() / b.as_float());
  }
  if (op == "//" || op == "%") {
    if (ints) {
      int64_t x = a.as_int(), y = b.as_int();
      if (y == 0) rt("integer division or modulo by zero");
      int64_t q = x / y, r = x % y;
      if (r != 0 && ((r < 0) != (y < 0))) {
        --q;
        r += y;
      }
      return op == "//" ? Value(q) : Value(r);
    }
    // Python's float divmod, signed zeros included.
    double x = a.as_float(), y = b.as_float();
    if (y == 0) rt("float division or modulo by zero");
    double mod = std::fmod(x, y);
    double div = (x - mod) / y;
    if (mod != 0) {
      if ((y < 0) != (mod < 0)) {
        mod += y;
        div -= 1.0;
      }
    } else {
      mod = std::copysign(0.0, y);
    }
    if (op == "%") return Value(mod);
    double fl;
    if (div != 0) {
      fl = std::floor(div);
      if (div - fl > 0.5) fl += 1.0;
    } else {
      fl = std::copysign(0.0, x / y);
    }
    return Value(fl);
  }
  if (op == "**") {
    if (ints && b.as_int() >= 0) {
      __int128 r = 1;
      for (int64_t i = 0; i < b.as_int(); ++i) {
        r *= a.as_int();
        if (r > INT64_MAX || r < INT64_MIN) rt("integer overflow (atlas templates use 64-bit integers)");
      }
      return Value(static_cast<int64_t>(r));
    }
    return Value(std::pow(a.as_float(), b.as_float()));
  }
  rt("unknown operator " + op);
}

bool contains(const Value& container, const Value& item) {
  switch (container.kind()) {
    case K::String:
      if (!item.is_string()) rt("'in <string>' requires string as left operand, not " + item.type_name());
      return container.str_ref().find(item.str_ref()) != std::string::npos;
    case K::List:
    case K::Tuple:
      for (auto& e : container.items())
        if (e == item) return true;
      return false;
    case K::Dict:
      if (item.is_seq() && item.kind() == K::List) rt("unhashable type: 'list'");
      if (item.is_dict()) rt("unhashable type: 'dict'");
      return container.dict_ref().find(item) != nullptr;
    case K::Undefined: return false;
    default: rt("argument of type '" + container.type_name() + "' is not iterable");
  }
}

bool compare(const std::string& op, const Value& a, const Value& b) {
  if (op == "==") return a == b;
  if (op == "!=") return !(a == b);
  if (op == "in") return contains(b, a);
  if (op == "notin") return !contains(b, a);
  if (!(a.is_number() && b.is_number()) && !(a.is_string() && b.is_string()) && !(a.is_seq() && a.kind() == b.kind())) {
    if (a.is_undefined()) undefined_error(a);
    if (b.is_undefined()) undefined_error(b);
    rt("'" + op + "' not supported between instances of '" + a.type_name() + "' and '" + b.type_name() + "'");
  }
  int c = py_cmp(a, b);
  if (op == "<") return c < 0;
  if (op == "<=") return c <= 0;
  if (op == ">") return c > 0;
  return c >= 0;
}

// ---- methods ------------------------------------------------------------------------------------

void arg_count(const CallArgs& a, size_t lo, size_t hi, const std::string& name) {
  size_t n = a.pos.size() + a.kw.size();
  if (n < lo || n > hi) rt(name + "() takes " + std::to_string(lo) + (hi != lo ? " to " + std::to_string(hi) : "") + " arguments (" + std::to_string(n) + " given)");
}

bool prefix_match(const std::string& s, const Value& p, bool suffix, const char* name) {
  auto one = [&](const Value& x) {
    const std::string& t = need_str(x, name);
    if (t.size() > s.size()) return false;
    return suffix ? s.compare(s.size() - t.size(), t.size(), t) == 0 : s.compare(0, t.size(), t) == 0;
  };
  if (p.kind() == K::Tuple) {
    for (auto& x : p.items())
      if (one(x)) return true;
    return false;
  }
  return one(p);
}

Value to_list_of_strings(const std::vector<std::string>& v) {
  ValueList out;
  for (auto& s : v) out.emplace_back(s);
  return Value::list(std::move(out));
}

bool all_chars(const std::string& s, const std::function<bool(char32_t)>& f) {
  auto c = utf8_decode(s);
  if (c.empty()) return false;
  for (char32_t x : c)
    if (!f(x)) return false;
  return true;
}

Value str_method(const std::string& s, const std::string& name) {
  auto bind = [&](auto fn) { return Value::function("str." + name, [s, name, fn](const CallArgs& a) { return fn(s, a, name); }); };
  using A = const CallArgs&;
  using S = const std::string&;
  if (name == "strip" || name == "lstrip" || name == "rstrip")
    return bind([](S s, A a, S n) {
      arg_count(a, 0, 1, n);
      return Value(py_strip(s, a.get(0, "chars"), n != "rstrip", n != "lstrip"));
    });
  if (name == "split" || name == "rsplit")
    return bind([](S s, A a, S n) {
      arg_count(a, 0, 2, n);
      const Value* mx = a.get(1, "maxsplit");
      int64_t maxsplit = mx ? to_index(*mx, "maxsplit") : -1;
      if (n == "rsplit" && maxsplit >= 0) {  // split from the right: reverse, split, reverse back
        auto c = utf8_decode(s);
        std::reverse(c.begin(), c.end());
        const Value* sep = a.get(0, "sep");
        Value rsep = sep && sep->is_string() ? [&] {
          auto d = utf8_decode(sep->str_ref());
          std::reverse(d.begin(), d.end());
          return Value(utf8_encode(d));
        }()
                                             : Value::none();
        auto parts = py_split(utf8_encode(c), sep && sep->is_string() ? &rsep : sep, maxsplit);
        std::reverse(parts.begin(), parts.end());
        for (auto& p : parts) {
          auto d = utf8_decode(p);
          std::reverse(d.begin(), d.end());
          p = utf8_encode(d);
        }
        return to_list_of_strings(parts);
      }
      return to_list_of_strings(py_split(s, a.get(0, "sep"), maxsplit));
    });
  if (name == "splitlines")
    return bind([](S s, A a, S n) {
      arg_count(a, 0, 0, n);
      std::vector<std::string> out;
      size_t pos = 0;
      while (pos < s.size()) {
        size_t e = s.find_first_of("\r\n", pos);
        if (e == std::string::npos) {
          out.push_back(s.substr(pos));
          break;
        }
        out.push_back(s.substr(pos, e - pos));
        pos = e + ((s[e] == '\r' && e + 1 < s.size() && s[e + 1] == '\n') ? 2 : 1);
      }
      return to_list_of_strings(out);
    });
  if (name == "startswith" || name == "endswith")
    return bind([](S s, A a, S n) {
      arg_count(a, 1, 1, n);
      return Value(prefix_match(s, a.pos.at(0), n == "endswith", n.c_str()));
    });
  if (name == "lower" || name == "upper" || name == "title" || name == "capitalize")
    return bind([](S s, A a, S n) {
      arg_count(a, 0, 0, n);
      if (n == "lower") return Value(map_case(s, 0));
      if (n == "upper") return Value(map_case(s, 1));
      if (n == "title") return Value(py_title(s));
      return Value(py_capitalize(s));
    });
  if (name == "replace")
    return bind([](S s, A a, S n) {
      arg_count(a, 2, 3, n);
      const Value* c = a.get(2, "count");
      return Value(py_replace(s, need_str(a.pos.at(0), "replace old"), need_str(a.pos.at(1), "replace new"),
                              c ? to_index(*c, "count") : -1));
    });
  if (name == "find" || name == "rfind" || name == "index" || name == "rindex" || name == "count")
    return bind([](S s, A a, S n) {
      arg_count(a, 1, 1, n);
      const std::string& t = need_str(a.pos.at(0), n.c_str());
      if (n == "count") {
        if (t.empty()) return Value(static_cast<int64_t>(utf8_length(s) + 1));
        int64_t k = 0;
        for (size_t p = s.find(t); p != std::string::npos; p = s.find(t, p + t.size())) ++k;
        return Value(k);
      }
      size_t p = (n == "find" || n == "index") ? s.find(t) : s.rfind(t);
      if (p == std::string::npos) {
        if (n == "index" || n == "rindex") rt("substring not found");
        return Value(int64_t{-1});
      }
      return Value(static_cast<int64_t>(utf8_length(std::string_view(s).substr(0, p))));
    });
  if (name == "join")
    return bind([](S s, A a, S n) {
      arg_count(a, 1, 1, n);
      std::string out;
      bool first = true;
      for (auto& e : iterate(a.pos.at(0))) {
        if (!first) out += s;
        first = false;
        out += need_str(e, "join item");
      }
      return Value(out);
    });
  if (name == "isdigit" || name == "isalpha" || name == "isalnum" || name == "isspace" || name == "islower" ||
      name == "isupper")
    return bind([](S s, A a, S n) {
      arg_count(a, 0, 0, n);
      auto cat = [](char32_t c) { return utf8proc_category(static_cast<utf8proc_int32_t>(c)); };
      auto alpha = [&](char32_t c) { auto k = cat(c); return k >= UTF8PROC_CATEGORY_LU && k <= UTF8PROC_CATEGORY_LO; };
      auto digit = [&](char32_t c) { return cat(c) == UTF8PROC_CATEGORY_ND; };
      if (n == "isdigit") return Value(all_chars(s, digit));
      if (n == "isalpha") return Value(all_chars(s, alpha));
      if (n == "isalnum") return Value(all_chars(s, [&](char32_t c) { return alpha(c) || digit(c); }));
      if (n == "isspace") return Value(all_chars(s, py_isspace));
      bool any_cased = false, ok = true;
      for (char32_t c : utf8_decode(s)) {
        if (!is_cased(c)) continue;
        any_cased = true;
        bool lower = cat(c) == UTF8PROC_CATEGORY_LL;
        if ((n == "islower") != lower) ok = false;
      }
      return Value(any_cased && ok);
    });
  return Value::undefined();
}

Value dict_method(const Value& d, const std::string& name) {
  if (name != "items" && name != "keys" && name != "values" && name != "get") return Value::undefined();
  return Value::function("dict." + name, [d, name](const CallArgs& a) -> Value {
    if (name == "get") {
      arg_count(a, 1, 2, name);
      const Value* v = d.dict_ref().find(a.pos.at(0));
      if (v) return *v;
      const Value* dflt = a.get(1, "default");
      return dflt ? *dflt : Value::none();
    }
    arg_count(a, 0, 0, name);
    ValueList out;
    for (auto& [k, v] : d.dict_ref().items) {
      if (name == "items")
        out.push_back(Value::tuple({k, v}));
      else
        out.push_back(name == "keys" ? k : v);
    }
    return Value::list(std::move(out));
  });
}

// ---- tests --------------------------------------------------------------------------------------

bool run_test(const std::string& name, const Value& v, const std::vector<Value>& args) {
  auto arg = [&](size_t i) -> const Value& {
    if (i >= args.size()) rt("test '" + name + "' needs an argument");
    return args[i];
  };
  if (name == "defined") return !v.is_undefined();
  if (name == "undefined") return v.is_undefined();
  if (name == "none") return v.is_none();
  if (name == "boolean") return v.is_bool();
  if (name == "true") return v.is_bool() && v.as_bool_raw();
  if (name == "false") return v.is_bool() && !v.as_bool_raw();
  if (name == "integer") return v.kind() == K::Int;
  if (name == "float") return v.kind() == K::Float;
  if (name == "number") return v.is_number();
  if (name == "string") return v.is_string();
  if (name == "mapping") return v.is_dict();
  if (name == "iterable") return v.is_string() || v.is_seq() || v.is_dict() || v.is_undefined();
  if (name == "sequence") return v.is_string() || v.is_seq() || v.is_dict() || v.is_undefined();
  if (name == "callable") return v.is_function();
  if (name == "sameas") return v.identical(arg(0));
  if (name == "escaped") return false;
  if (name == "odd" || name == "even") {
    int64_t x = to_index(v, name.c_str());
    return (x % 2 != 0) == (name == "odd");
  }
  if (name == "divisibleby") {
    int64_t d = to_index(arg(0), "divisibleby");
    if (d == 0) rt("integer division or modulo by zero");
    return to_index(v, "divisibleby") % d == 0;
  }
  if (name == "eq" || name == "equalto" || name == "==") return v == arg(0);
  if (name == "ne" || name == "!=") return !(v == arg(0));
  if (name == "lt" || name == "lessthan" || name == "<") return compare("<", v, arg(0));
  if (name == "le" || name == "<=") return compare("<=", v, arg(0));
  if (name == "gt" || name == "greaterthan" || name == ">") return compare(">", v, arg(0));
  if (name == "ge" || name == ">=") return compare(">=", v, arg(0));
  if (name == "in") return contains(arg(0), v);
  if (name == "lower" || name == "upper") {
    std::string s = v.str();
    return s == map_case(s, name == "lower" ? 0 : 1) && s != map_case(s, name == "lower" ? 1 : 0);
  }
  rt("unknown test '" + name + "'");
}

}  // namespace

// ---- the interpreter -----------------------------------------------------------------------------

namespace {

struct Frame {
  std::vector<std::pair<std::string, Value>> vars;
  Value* find(std::string_view n) {
    for (auto& [k, v] : vars)
      if (k == n) return &v;
    return nullptr;
  }
  void set(const std::string& n, Value v) {
    if (Value* p = find(n))
      *p = std::move(v);
    else
      vars.emplace_back(n, std::move(v));
  }
};

enum class Flow { Normal, Break, Continue };

class Interp {
 public:
  Interp(const Variables& vars) : vars_(vars) {
    frames_.push_back(&root_);
  }

  Flow exec_body(const Body& b, std::string& out) {
    for (auto& n : b) {
      Flow f = exec(*n, out);
      if (f != Flow::Normal) return f;
    }
    return Flow::Normal;
  }

  Value eval(const Expr& e) {
    try {
      return eval_inner(e);
    } catch (const RuntimeError& err) {
      throw Located{err.what(), e.line, e.col};
    }
  }

 private:
  Flow exec(const Node& n, std::string& out) {
    try {
      return exec_inner(n, out);
    } catch (const RuntimeError& err) {
      throw Located{err.what(), n.line, n.col};
    }
  }

  Value lookup(const std::string& name) {
    for (auto it = frames_.rbegin(); it != frames_.rend(); ++it)
      if (Value* v = (*it)->find(name)) return *v;
    if (auto it = vars_.find(name); it != vars_.end()) return it->second;
    if (Value g = global(name); !g.is_undefined()) return g;
    return Value::undefined("'" + name + "' is undefined");
  }

  void assign(const Node& n, const Value& v) {
    Frame& f = *frames_.back();
    if (!n.tuple_target) {
      f.set(n.targets[0], v);
      return;
    }
    ValueList items = iterate(v);
    if (items.size() != n.targets.size())
      rt("cannot unpack " + std::to_string(items.size()) + " values into " + std::to_string(n.targets.size()) + " names");
    for (size_t i = 0; i < items.size(); ++i) f.set(n.targets[i], items[i]);
  }

  Value apply_filters(const std::vector<ExprPtr>& filters, Value v) {
    for (auto& f : filters) {
      CallArgs a = eval_args(*f, 1);
      try {
        v = filter(f->name, v, a);
      } catch (const RuntimeError& err) {
        throw Located{err.what(), f->line, f->col};
      }
    }
    return v;
  }

  Flow exec_inner(const Node& n, std::string& out) {
    switch (n.k) {
      case Node::K::Text: out += n.text; return Flow::Normal;
      case Node::K::Output: {
        Value v = eval(*n.expr);
        // Python would print "<built-in method ... at 0x...>": an address, never meaningful text.
        if (v.is_function()) rt("cannot print the function '" + v.fn().name + "' (missing call parentheses?)");
        out += v.str();
        return Flow::Normal;
      }
      case Node::K::If:
        for (size_t i = 0; i < n.bodies.size(); ++i)
          if (i >= n.conds.size() || eval(*n.conds[i]).truthy()) return exec_body(n.bodies[i], out);
        return Flow::Normal;
      case Node::K::For: return exec_for(n, out);
      case Node::K::Set: {
        Value v = eval(*n.expr);
        if (!n.attr.empty()) {
          Value ns = lookup(n.targets[0]);
          if (!ns.is_namespace()) rt("cannot assign attribute on non-namespace object '" + n.targets[0] + "'");
          ns.namespace_ref().set(Value(n.attr), std::move(v));
        } else {
          assign(n, v);
        }
        return Flow::Normal;
      }
      case Node::K::SetBlock: {
        std::string s;
        exec_body(n.bodies[0], s);
        frames_.back()->set(n.targets[0], apply_filters(n.filters, Value(std::move(s))));
        return Flow::Normal;
      }
      case Node::K::FilterBlock: {
        std::string s;
        Flow f = exec_body(n.bodies[0], s);
        out += apply_filters(n.filters, Value(std::move(s))).str();
        return f;
      }
      case Node::K::With: {
        Frame f;
        for (size_t i = 0; i < n.targets.size(); ++i) f.set(n.targets[i], eval(*n.values[i]));
        frames_.push_back(&f);
        Flow r;
        try {
          r = exec_body(n.bodies[0], out);
        } catch (...) {
          frames_.pop_back();
          throw;
        }
        frames_.pop_back();
        return r;
      }
      case Node::K::Scope: return exec_body(n.bodies[0], out);
      case Node::K::Macro: {
        const Node* node = &n;
        frames_.back()->set(n.name, Value::function(n.name, [this, node](const CallArgs& a) { return call_macro(*node, a); }));
        return Flow::Normal;
      }
      case Node::K::Break:
      case Node::K::Continue:
        if (loop_depth_ == 0) rt(std::string("'") + (n.k == Node::K::Break ? "break" : "continue") + "' outside of a loop");
        return n.k == Node::K::Break ? Flow::Break : Flow::Continue;
    }
    return Flow::Normal;
  }

  Value call_macro(const Node& m, const CallArgs& a) {
    if (a.pos.size() > m.targets.size()) rt("macro '" + m.name + "' takes " + std::to_string(m.targets.size()) + " arguments");
    // Python stops runaway recursion with RecursionError; so does this, before the C++ stack ends.
    if (macro_depth_ >= 200) rt("maximum macro recursion depth (200) exceeded in '" + m.name + "'");
    struct DepthGuard {
      int& d;
      explicit DepthGuard(int& x) : d(x) { ++d; }
      ~DepthGuard() { --d; }
    } guard(macro_depth_);
    Frame local;
    size_t first_default = m.targets.size() - m.values.size();
    std::vector<Frame*> saved = frames_;
    frames_ = {&root_, &local};
    try {
      for (size_t i = 0; i < m.targets.size(); ++i) {
        const Value* v = a.get(i, m.targets[i]);
        if (v)
          local.set(m.targets[i], *v);
        else if (i >= first_default)
          local.set(m.targets[i], eval(*m.values[i - first_default]));
        else
          local.set(m.targets[i], Value::undefined("'" + m.targets[i] + "' is undefined"));
      }
      for (auto& [k, _] : a.kw)
        if (std::find(m.targets.begin(), m.targets.end(), k) == m.targets.end())
          rt("macro '" + m.name + "' takes no keyword argument '" + k + "'");
      std::string out;
      int depth = loop_depth_;
      loop_depth_ = 0;
      exec_body(m.bodies[0], out);
      loop_depth_ = depth;
      frames_ = saved;
      return Value(std::move(out));
    } catch (...) {
      frames_ = saved;
      throw;
    }
  }

  Flow exec_for(const Node& n, std::string& out) {
    Value seq = eval(*n.expr);
    ValueList items = iterate(seq);
    if (n.cond) {  // `for x in xs if cond`: filtered before loop.* is computed, as Jinja does
      ValueList kept;
      for (auto& it : items) {
        Frame f;
        frames_.push_back(&f);
        bool keep;
        try {
          assign(n, it);
          keep = eval(*n.cond).truthy();
        } catch (...) {
          frames_.pop_back();
          throw;
        }
        frames_.pop_back();
        if (keep) kept.push_back(it);
      }
      items = std::move(kept);
    }
    if (items.empty()) {
      if (n.bodies.size() > 1) return exec_body(n.bodies[1], out);
      return Flow::Normal;
    }
    int64_t len = static_cast<int64_t>(items.size());
    ++loop_depth_;
    Value outer_loop = lookup("loop");
    int64_t depth = outer_loop.is_dict() && outer_loop.dict_ref().find(std::string_view("depth"))
                        ? outer_loop.dict_ref().find(std::string_view("depth"))->as_int() + 1
                        : 1;
    try {
      for (int64_t i = 0; i < len; ++i) {
        Frame f;
        ValueDict loop;
        loop.items.reserve(13);
        auto put = [&](const char* k, Value v) { loop.items.emplace_back(Value(k), std::move(v)); };
        put("index", Value(i + 1));
        put("index0", Value(i));
        put("revindex", Value(len - i));
        put("revindex0", Value(len - i - 1));
        put("first", Value(i == 0));
        put("last", Value(i == len - 1));
        put("length", Value(len));
        put("depth", Value(depth));
        put("depth0", Value(depth - 1));
        put("previtem", i > 0 ? items[i - 1] : Value::undefined("there is no previous item"));
        put("nextitem", i + 1 < len ? items[i + 1] : Value::undefined("there is no next item"));
        put("cycle", Value::function("loop.cycle", [i](const CallArgs& a) {
              if (a.pos.empty()) rt("no items for cycling given");
              return a.pos[static_cast<size_t>(i) % a.pos.size()];
            }));
        f.set("loop", Value::dict(std::move(loop)));
        frames_.push_back(&f);
        Flow fl;
        try {
          assign(n, items[i]);
          fl = exec_body(n.bodies[0], out);
        } catch (...) {
          frames_.pop_back();
          throw;
        }
        frames_.pop_back();
        if (fl == Flow::Break) break;
      }
    } catch (...) {
      --loop_depth_;
      throw;
    }
    --loop_depth_;
    return Flow::Normal;
  }

  CallArgs eval_args(const Expr& e, size_t skip) {
    CallArgs a;
    for (size_t i = skip; i < e.args.size(); ++i) a.pos.push_back(eval(*e.args[i]));
    for (auto& [k, v] : e.kwargs) a.kw.emplace_back(k, eval(*v));
    return a;
  }

  Value eval_inner(const Expr& e) {
    switch (e.k) {
      case Expr::K::Literal: return e.lit;
      case Expr::K::Name: return lookup(e.name);
      case Expr::K::List:
      case Expr::K::Tuple: {
        ValueList l;
        for (auto& x : e.args) l.push_back(eval(*x));
        return e.k == Expr::K::List ? Value::list(std::move(l)) : Value::tuple(std::move(l));
      }
      case Expr::K::Dict: {
        ValueDict d;
        for (size_t i = 0; i + 1 < e.args.size(); i += 2) d.set(eval(*e.args[i]), eval(*e.args[i + 1]));
        return Value::dict(std::move(d));
      }
      case Expr::K::Attr: return get_attr(eval(*e.args[0]), e.name);
      case Expr::K::Item: return get_item(eval(*e.args[0]), eval(*e.args[1]));
      case Expr::K::Slice: {
        Value o = eval(*e.args[0]);
        auto part = [&](int i) { return e.args[i] ? eval(*e.args[i]) : Value::none(); };
        return do_slice(o, part(1), part(2), part(3));
      }
      case Expr::K::Call: {
        Value f = eval(*e.args[0]);
        CallArgs a = eval_args(e, 1);
        if (f.is_undefined()) {
          if (e.args[0]->k == Expr::K::Attr || e.args[0]->k == Expr::K::Name) {
            if (e.args[0]->k == Expr::K::Attr) {
              Value obj = eval(*e.args[0]->args[0]);
              rt("'" + obj.type_name() + "' object has no method '" + e.args[0]->name + "' in atlas's template subset");
            }
            rt("'" + e.args[0]->name + "' is undefined (unknown function)");
          }
          undefined_error(f);
        }
        if (!f.is_function()) rt("'" + f.type_name() + "' object is not callable");
        return f.fn().call(a);
      }
      case Expr::K::Filter: {
        Value v = eval(*e.args[0]);
        CallArgs a = eval_args(e, 1);
        return filter(e.name, v, a);
      }
      case Expr::K::Test: {
        if (!known_test(e.name)) rt("unknown test '" + e.name + "'");
        Value v = eval(*e.args[0]);
        CallArgs a = eval_args(e, 1);
        return Value(run_test(e.name, v, a.pos) != e.negated);
      }
      case Expr::K::Not: return Value(!eval(*e.args[0]).truthy());
      case Expr::K::Neg:
      case Expr::K::Pos: {
        Value v = eval(*e.args[0]);
        if (v.is_undefined()) undefined_error(v);
        if (!v.is_number()) rt("bad operand type for unary " + std::string(e.k == Expr::K::Neg ? "-" : "+") + ": '" + v.type_name() + "'");
        if (e.k == Expr::K::Pos) return v.kind() == K::Bool ? Value(v.as_int()) : v;
        if (v.kind() == K::Float) return Value(-v.as_float());
        return int_result(-static_cast<__int128>(v.as_int()));
      }
      case Expr::K::Binary: return binary_op(e.name, eval(*e.args[0]), eval(*e.args[1]));
      case Expr::K::And: {
        Value l = eval(*e.args[0]);
        return l.truthy() ? eval(*e.args[1]) : l;
      }
      case Expr::K::Or: {
        Value l = eval(*e.args[0]);
        return l.truthy() ? l : eval(*e.args[1]);
      }
      case Expr::K::Compare: {
        Value l = eval(*e.args[0]);
        for (size_t i = 0; i < e.ops.size(); ++i) {
          Value r = eval(*e.args[i + 1]);
          if (!compare(e.ops[i], l, r)) return Value(false);
          l = std::move(r);
        }
        return Value(true);
      }
      case Expr::K::Cond:
        if (eval(*e.args[0]).truthy()) return eval(*e.args[1]);
        return e.args[2] ? eval(*e.args[2]) : Value::undefined("the inline if-expression evaluated to false and no else section was defined");
    }
    rt("internal: unknown expression");
  }

  static bool known_test(const std::string& n) {
    static const char* names[] = {"defined", "undefined", "none", "boolean", "true", "false", "integer", "float",
                                  "number", "string", "mapping", "iterable", "sequence", "callable", "sameas",
                                  "escaped", "odd", "even", "divisibleby", "eq", "equalto", "==", "ne", "!=",
                                  "lt", "lessthan", "<", "le", "<=", "gt", "greaterthan", ">", "ge", ">=", "in",
                                  "lower", "upper"};
    for (const char* x : names)
      if (n == x) return true;
    return false;
  }

  // ---- globals ----

  static Value global(const std::string& name) {
    if (name == "raise_exception")
      return Value::function("raise_exception", [](const CallArgs& a) -> Value {
        rt("raise_exception: " + (a.pos.empty() ? std::string() : a.pos[0].str()));
      });
    if (name == "namespace")
      return Value::function("namespace", [](const CallArgs& a) {
        ValueDict d;
        for (auto& p : a.pos) {
          if (!p.is_dict()) rt("namespace() takes a mapping as positional argument");
          for (auto& [k, v] : p.dict_ref().items) d.set(k, v);
        }
        for (auto& [k, v] : a.kw) d.set(Value(k), v);
        return Value::namespace_(std::move(d));
      });
    if (name == "dict")
      return Value::function("dict", [](const CallArgs& a) {
        ValueDict d;
        for (auto& p : a.pos) {
          if (!p.is_dict()) rt("dict() takes a mapping as positional argument");
          for (auto& [k, v] : p.dict_ref().items) d.set(k, v);
        }
        for (auto& [k, v] : a.kw) d.set(Value(k), v);
        return Value::dict(std::move(d));
      });
    if (name == "strftime_now")  // HF's global: the current local time (pass date_string for reproducible prompts)
      return Value::function("strftime_now", [](const CallArgs& a) {
        if (a.pos.size() != 1 || !a.pos[0].is_string()) rt("strftime_now(format) takes one string");
        std::time_t now = std::time(nullptr);
        std::tm tm{};
        localtime_r(&now, &tm);
        char buf[512];
        size_t n = std::strftime(buf, sizeof buf, a.pos[0].str_ref().c_str(), &tm);
        return Value(std::string(buf, n));
      });
    if (name == "range")
      return Value::function("range", [](const CallArgs& a) {
        if (!a.kw.empty() || a.pos.empty() || a.pos.size() > 3) rt("range() takes 1 to 3 positional arguments");
        int64_t start = 0, stop, step = 1;
        if (a.pos.size() == 1) {
          stop = to_index(a.pos[0], "range stop");
        } else {
          start = to_index(a.pos[0], "range start");
          stop = to_index(a.pos[1], "range stop");
          if (a.pos.size() == 3) step = to_index(a.pos[2], "range step");
        }
        if (step == 0) rt("range() arg 3 must not be zero");
        ValueList out;
        for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) {
          if (out.size() >= 100000) rt("range too big (the sandbox allows 100000 items)");
          out.emplace_back(i);
        }
        return Value::list(std::move(out));
      });
    return Value::undefined();
  }

  // ---- filters ----

  Value attr_path(const Value& item, const Value& attribute) {
    if (attribute.is_int()) return get_item(item, attribute);
    Value v = item;
    std::string path = need_str(attribute, "attribute");
    size_t pos = 0;
    for (;;) {
      size_t d = path.find('.', pos);
      std::string part = path.substr(pos, d == std::string::npos ? std::string::npos : d - pos);
      bool numeric = !part.empty() && std::all_of(part.begin(), part.end(), [](char c) { return std::isdigit(static_cast<unsigned char>(c)); });
      v = get_item(v, numeric ? Value(static_cast<int64_t>(std::stoll(part))) : Value(part));
      if (d == std::string::npos) break;
      pos = d + 1;
    }
    return v;
  }

  Value select_like(const std::string& fname, const Value& v, const CallArgs& a, bool attr_form, bool keep_if) {
    size_t off = attr_form ? 1 : 0;
    if (attr_form && a.pos.empty()) rt(fname + " needs an attribute name");
    std::string test = a.pos.size() > off ? need_str(a.pos[off], "test name") : std::string();
    std::vector<Value> targs(a.pos.begin() + std::min(a.pos.size(), off + 1), a.pos.end());
    if (!test.empty() && !known_test(test)) rt("unknown test '" + test + "'");
    ValueList out;
    for (auto& item : iterate(v)) {
      Value x = attr_form ? attr_path(item, a.pos[0]) : item;
      bool ok = test.empty() ? x.truthy() : run_test(test, x, targs);
      if (ok == keep_if) out.push_back(item);
    }
    return Value::list(std::move(out));
  }

  Value filter(const std::string& name, const Value& v, const CallArgs& a) {
    auto arg = [&](size_t i, const char* kw) { return a.get(i, kw); };
    if (name == "default" || name == "d") {
      const Value* dv = arg(0, "default_value");
      const Value* boolean = arg(1, "boolean");
      bool use = v.is_undefined() || (boolean && boolean->truthy() && !v.truthy());
      return use ? (dv ? *dv : Value("")) : v;
    }
    if (name == "length" || name == "count") return Value(py_len(v));
    if (name == "string") return Value(v.str());
    if (name == "trim") return Value(py_strip(v.str(), arg(0, "chars"), true, true));
    if (name == "lower") return Value(map_case(v.str(), 0));
    if (name == "upper") return Value(map_case(v.str(), 1));
    if (name == "capitalize") return Value(py_capitalize(v.str()));
    if (name == "title") {
      std::string s = v.str(), out;
      auto c = utf8_decode(s);
      // Jinja splits on runs of [-\s({\[<] and capitalises each piece.
      auto sep = [](char32_t ch) { return ch == '-' || ch == '(' || ch == '{' || ch == '[' || ch == '<' || py_isspace(ch); };
      size_t i = 0;
      while (i < c.size()) {
        size_t j = i;
        bool is_sep = sep(c[i]);
        while (j < c.size() && sep(c[j]) == is_sep) ++j;
        std::string piece = cps_slice(c, i, j);
        out += is_sep ? piece : py_capitalize_upper_first(piece);
        i = j;
      }
      return Value(out);
    }
    if (name == "replace") {
      if (a.pos.size() < 2) rt("replace needs old and new");
      const Value* cnt = arg(2, "count");
      return Value(py_replace(v.str(), a.pos[0].str(), a.pos[1].str(), cnt && !cnt->is_none() ? to_index(*cnt, "count") : -1));
    }
    if (name == "join") {
      const Value* sep = arg(0, "d");
      const Value* attribute = arg(1, "attribute");
      std::string out;
      bool first = true;
      for (auto& e : iterate(v)) {
        if (!first && sep) out += sep->str();
        first = false;
        out += (attribute ? attr_path(e, *attribute) : e).str();
      }
      return Value(out);
    }
    if (name == "first") {
      ValueList l = iterate(v);
      return l.empty() ? Value::undefined("No first item, sequence was empty.") : l.front();
    }
    if (name == "last") {
      if (!v.is_seq() && !v.is_string() && !v.is_dict()) rt("'" + v.type_name() + "' object is not reversible");
      ValueList l = iterate(v);
      return l.empty() ? Value::undefined("No last item, sequence was empty.") : l.back();
    }
    if (name == "list") return Value::list(iterate(v));
    if (name == "reverse") {
      if (v.is_string()) {
        auto c = utf8_decode(v.str_ref());
        std::reverse(c.begin(), c.end());
        return Value(utf8_encode(c));
      }
      ValueList l = iterate(v);
      std::reverse(l.begin(), l.end());
      return Value::list(std::move(l));
    }
    if (name == "items") {
      if (v.is_undefined()) return Value::list();
      if (!v.is_dict()) rt("can only get item pairs from a mapping");
      ValueList out;
      for (auto& [k, x] : v.dict_ref().items) out.push_back(Value::tuple({k, x}));
      return Value::list(std::move(out));
    }
    if (name == "dictsort") {
      if (!v.is_dict()) rt("dictsort expects a mapping");
      const Value* cs = arg(0, "case_sensitive");
      const Value* by = arg(1, "by");
      const Value* rev = arg(2, "reverse");
      int pos = by && by->is_string() && by->str_ref() == "value" ? 1 : 0;
      ValueList out;
      for (auto& [k, x] : v.dict_ref().items) out.push_back(Value::tuple({k, x}));
      bool ci = !(cs && cs->truthy());
      std::stable_sort(out.begin(), out.end(), [&](const Value& x, const Value& y) {
        return py_cmp(x.items()[pos], y.items()[pos], ci) < 0;
      });
      if (rev && rev->truthy()) std::reverse(out.begin(), out.end());
      return Value::list(std::move(out));
    }
    if (name == "sort") {
      const Value* rev = arg(0, "reverse");
      const Value* cs = arg(1, "case_sensitive");
      const Value* attribute = arg(2, "attribute");
      ValueList l = iterate(v);
      bool ci = !(cs && cs->truthy());
      bool r = rev && rev->truthy();
      std::stable_sort(l.begin(), l.end(), [&](const Value& x, const Value& y) {
        Value kx = attribute ? attr_path(x, *attribute) : x, ky = attribute ? attr_path(y, *attribute) : y;
        int c = py_cmp(kx, ky, ci);
        return r ? c > 0 : c < 0;
      });
      return Value::list(std::move(l));
    }
    if (name == "unique") {
      ValueList out;
      for (auto& e : iterate(v)) {
        bool seen = false;
        for (auto& o : out)
          if (o.is_string() && e.is_string() ? map_case(o.str_ref(), 0) == map_case(e.str_ref(), 0) : o == e) seen = true;
        if (!seen) out.push_back(e);
      }
      return Value::list(std::move(out));
    }
    if (name == "min" || name == "max") {
      ValueList l = iterate(v);
      if (l.empty()) return Value::undefined("No aggregated item, sequence was empty.");
      Value best = l[0];
      for (auto& e : l) {
        int c = py_cmp(e, best, true);
        if (name == "min" ? c < 0 : c > 0) best = e;
      }
      return best;
    }
    if (name == "sum") {
      const Value* attribute = arg(0, "attribute");
      const Value* start = arg(1, "start");
      Value acc = start ? *start : Value(int64_t{0});
      for (auto& e : iterate(v)) acc = binary_op("+", acc, attribute ? attr_path(e, *attribute) : e);
      return acc;
    }
    if (name == "abs") {
      if (!v.is_number()) rt("bad operand type for abs(): '" + v.type_name() + "'");
      return v.kind() == K::Float ? Value(std::fabs(v.as_float())) : int_result(v.as_int() < 0 ? -static_cast<__int128>(v.as_int()) : v.as_int());
    }
    if (name == "int") {
      const Value* dflt = arg(0, "default");
      Value fallback = dflt ? *dflt : Value(int64_t{0});
      if (v.is_int()) return Value(v.as_int());
      auto from_double = [&](double d) {
        if (!(std::fabs(d) < 9.2233720368547758e18)) rt("integer too large for atlas templates (64-bit)");
        return Value(static_cast<int64_t>(std::trunc(d)));
      };
      if (v.kind() == K::Float) return std::isfinite(v.as_float()) ? from_double(v.as_float()) : fallback;
      if (v.is_string()) {
        std::string s = py_strip(v.str_ref(), nullptr, true, true);
        std::string t;
        for (char c : s)
          if (c != '_') t += c;
        try {
          size_t used = 0;
          long long x = std::stoll(t, &used, 10);
          if (used == t.size() && !t.empty()) return Value(static_cast<int64_t>(x));
          double d = std::stod(t, &used);
          if (used == t.size() && std::isfinite(d)) return from_double(d);
        } catch (const std::exception&) {
        }
      }
      return fallback;
    }
    if (name == "float") {
      const Value* dflt = arg(0, "default");
      Value fallback = dflt ? *dflt : Value(0.0);
      if (v.is_number()) return Value(v.as_float());
      if (v.is_string()) {
        std::string t = py_strip(v.str_ref(), nullptr, true, true);
        try {
          size_t used = 0;
          double d = std::stod(t, &used);
          if (used == t.size()) return Value(d);
        } catch (const std::exception&) {
        }
      }
      return fallback;
    }
    if (name == "round") {
      const Value* prec = arg(0, "precision");
      const Value* method = arg(1, "method");
      int64_t p = prec ? to_index(*prec, "precision") : 0;
      std::string m = method ? method->str() : "common";
      if (!v.is_number()) rt("round expects a number");
      if (v.is_int() && m == "common" && p >= 0) return Value(v.as_int());  // Python: round(int, n) is an int
      double x = v.as_float(), s = std::pow(10.0, static_cast<double>(p));
      if (m == "floor") return Value(std::floor(x * s) / s);
      if (m == "ceil") return Value(std::ceil(x * s) / s);
      if (m != "common") rt("round method must be 'common', 'ceil' or 'floor'");
      if (p < 0 || !std::isfinite(x)) return Value(std::nearbyint(x * s) / s);
      // Python's round(): the exact binary value rounded half-to-even, which is what glibc's
      // printf does for %.*f.
      char buf[512];
      std::snprintf(buf, sizeof buf, "%.*f", static_cast<int>(std::min<int64_t>(p, 300)), x);
      return Value(std::strtod(buf, nullptr));
    }
    if (name == "tojson") {
      JsonDumpOptions o;
      if (const Value* x = arg(0, "ensure_ascii")) o.ensure_ascii = x->truthy();
      if (const Value* x = arg(1, "indent"); x && !x->is_none()) o.indent = static_cast<int>(to_index(*x, "indent"));
      if (const Value* x = arg(2, "separators"); x && !x->is_none()) {
        if (!x->is_seq() || x->items().size() != 2) rt("separators must be a pair of strings");
        o.item_sep = need_str(x->items()[0], "separators");
        o.key_sep = need_str(x->items()[1], "separators");
      }
      if (const Value* x = arg(3, "sort_keys")) o.sort_keys = x->truthy();
      if (v.is_undefined()) undefined_error(v);
      return Value(json_dumps(v, o));
    }
    if (name == "map") {
      const Value* attribute = a.get(SIZE_MAX, "attribute");
      ValueList out;
      if (attribute) {
        const Value* dflt = a.get(SIZE_MAX, "default");
        for (auto& e : iterate(v)) {
          Value x = attr_path(e, *attribute);
          out.push_back(x.is_undefined() && dflt ? *dflt : x);
        }
      } else {
        if (a.pos.empty()) rt("map needs a filter name or attribute=");
        std::string f = need_str(a.pos[0], "filter name");
        CallArgs rest;
        rest.pos.assign(a.pos.begin() + 1, a.pos.end());
        rest.kw = a.kw;
        for (auto& e : iterate(v)) out.push_back(filter(f, e, rest));
      }
      return Value::list(std::move(out));
    }
    if (name == "select") return select_like(name, v, a, false, true);
    if (name == "reject") return select_like(name, v, a, false, false);
    if (name == "selectattr") return select_like(name, v, a, true, true);
    if (name == "rejectattr") return select_like(name, v, a, true, false);
    if (name == "attr") {  // Python getattr only: a dict's keys are not attributes
      if (a.pos.empty()) rt("attr needs a name");
      const std::string& n = need_str(a.pos[0], "attribute name");
      if (v.is_undefined()) undefined_error(v);
      Value m = v.is_dict() ? dict_method(v, n) : v.is_string() ? str_method(v.str_ref(), n) : Value::undefined();
      if (v.is_namespace()) m = get_attr(v, n);
      return m.is_undefined() ? Value::undefined("'" + v.type_name() + " object' has no attribute '" + n + "'") : m;
    }
    if (name == "safe") return v;
    if (name == "e" || name == "escape") {
      std::string out;
      for (char c : v.str()) {
        switch (c) {
          case '&': out += "&amp;"; break;
          case '<': out += "&lt;"; break;
          case '>': out += "&gt;"; break;
          case '"': out += "&#34;"; break;
          case '\'': out += "&#39;"; break;
          default: out += c;
        }
      }
      return Value(out);
    }
    if (name == "indent") {  // Jinja's indent: later lines only, unless first=True; blank lines only if blank=True
      const Value* width = arg(0, "width");
      const Value* first = arg(1, "first");
      const Value* blank = arg(2, "blank");
      std::string pad = width && width->is_string() ? width->str_ref() : std::string(width ? to_index(*width, "width") : 4, ' ');
      std::string s = v.str() + "\n";
      std::vector<std::string> lines;
      size_t pos = 0;
      while (pos < s.size()) {
        size_t e = s.find('\n', pos);
        lines.push_back(s.substr(pos, e - pos));
        pos = e + 1;
      }
      std::string out = lines[0];
      for (size_t i = 1; i < lines.size(); ++i)
        out += "\n" + ((blank && blank->truthy()) || !lines[i].empty() ? pad : std::string()) + lines[i];
      if (first && first->truthy()) out = pad + out;
      return Value(out);
    }
    if (name == "wordcount") return Value(static_cast<int64_t>(py_split(v.str(), nullptr, -1).size()));
    rt("unknown filter '" + name + "' (not in atlas's template subset)");
  }

  static std::string py_capitalize_upper_first(const std::string& s) {
    auto c = utf8_decode(s);
    std::string out;
    for (size_t i = 0; i < c.size(); ++i) append_case(out, c, i, i == 0 ? 1 : 0);
    return out;
  }

  const Variables& vars_;
  Frame root_;
  std::vector<Frame*> frames_;
  int loop_depth_ = 0;
  int macro_depth_ = 0;
};

}  // namespace

std::string Template::render(const Variables& vars) const {
  Interp in(vars);
  std::string out;
  try {
    in.exec_body(*body_, out);
  } catch (const Located& e) {
    fail(name_, "line " + std::to_string(e.line) + ", column " + std::to_string(e.col), e.msg);
  } catch (const RuntimeError& e) {
    fail(name_, {}, e.what());
  }
  return out;
}

}  // namespace atlas::tmpl
