#include "text/template_value.h"

#include "text/unicode.h"

#include <utf8proc.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>

namespace atlas::tmpl {

// ---- UTF-8 ------------------------------------------------------------------------------

void utf8_append(std::string& out, char32_t cp) { utf8::append(out, cp); }

// Lenient decoder: inputs come from nlohmann (validated UTF-8) or the template source; a stray
// byte decodes as itself so nothing is silently dropped.
std::vector<char32_t> utf8_decode(std::string_view s) {
  std::vector<char32_t> out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    unsigned char c = static_cast<unsigned char>(s[i]);
    int n = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 1;
    if (i + n > s.size()) n = 1;
    char32_t cp = n == 1 ? c : n == 2 ? (c & 0x1F) : n == 3 ? (c & 0x0F) : (c & 0x07);
    for (int k = 1; k < n; ++k) cp = (cp << 6) | (static_cast<unsigned char>(s[i + k]) & 0x3F);
    out.push_back(cp);
    i += n;
  }
  return out;
}

std::string utf8_encode(const std::vector<char32_t>& cps) {
  std::string out;
  out.reserve(cps.size());
  for (char32_t c : cps) utf8_append(out, c);
  return out;
}

size_t utf8_length(std::string_view s) {
  size_t n = 0;
  for (unsigned char c : s) n += (c & 0xC0) != 0x80;
  return n;
}

// Python str.isspace (and the `\s` class of Python's re on str patterns).
bool py_isspace(char32_t c) {
  if (c == ' ' || (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x1F)) return true;
  if (c < 0x80) return false;
  return c == 0x85 || c == 0xA0 || c == 0x1680 || (c >= 0x2000 && c <= 0x200A) || c == 0x2028 ||
         c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

// ---- containers ---------------------------------------------------------------------------

const Value* ValueDict::find(const Value& key) const {
  for (auto& [k, v] : items)
    if (k == key) return &v;
  return nullptr;
}

const Value* ValueDict::find(std::string_view key) const {
  for (auto& [k, v] : items)
    if (k.is_string() && k.str_ref() == key) return &v;
  return nullptr;
}

void ValueDict::set(Value key, Value value) {
  for (auto& [k, v] : items)
    if (k == key) {
      v = std::move(value);
      return;
    }
  items.emplace_back(std::move(key), std::move(value));
}

const Value* CallArgs::get(size_t i, std::string_view name) const {
  if (i < pos.size()) return &pos[i];
  for (auto& [k, v] : kw)
    if (k == name) return &v;
  return nullptr;
}

Value Value::list(ValueList items) {
  Value v(Kind::List);
  v.list_ = std::make_shared<ValueList>(std::move(items));
  return v;
}
Value Value::tuple(ValueList items) {
  Value v(Kind::Tuple);
  v.list_ = std::make_shared<ValueList>(std::move(items));
  return v;
}
Value Value::dict(ValueDict d) {
  Value v(Kind::Dict);
  v.dict_ = std::make_shared<ValueDict>(std::move(d));
  return v;
}
Value Value::namespace_(ValueDict d) {
  Value v(Kind::Namespace);
  v.dict_ = std::make_shared<ValueDict>(std::move(d));
  return v;
}
Value Value::function(std::string name, std::function<Value(const CallArgs&)> fn) {
  Value v(Kind::Function);
  v.fn_ = std::make_shared<Function>(Function{std::move(name), std::move(fn)});
  return v;
}

template <class J>
static Value value_from_json(const J& j) {
  switch (j.type()) {
    case J::value_t::null: return Value::none();
    case J::value_t::boolean: return Value(j.template get<bool>());
    case J::value_t::number_integer: return Value(j.template get<int64_t>());
    case J::value_t::number_unsigned: {
      auto u = j.template get<uint64_t>();
      if (u > static_cast<uint64_t>(INT64_MAX)) throw RuntimeError("integer too large: " + j.dump());
      return Value(static_cast<int64_t>(u));
    }
    case J::value_t::number_float: return Value(j.template get<double>());
    case J::value_t::string: return Value(j.template get<std::string>());
    case J::value_t::array: {
      ValueList l;
      l.reserve(j.size());
      for (auto& e : j) l.push_back(value_from_json(e));
      return Value::list(std::move(l));
    }
    case J::value_t::object: {
      ValueDict d;
      d.items.reserve(j.size());
      for (auto it = j.begin(); it != j.end(); ++it) d.items.emplace_back(Value(it.key()), value_from_json(it.value()));
      return Value::dict(std::move(d));
    }
    default: throw RuntimeError("unsupported JSON value: " + j.dump());
  }
}
Value Value::from_json(const json& j) { return value_from_json(j); }
Value Value::from_json(const ojson& j) { return value_from_json(j); }

// ---- Python semantics ---------------------------------------------------------------------

bool Value::truthy() const {
  switch (kind_) {
    case Kind::Undefined:
    case Kind::None: return false;
    case Kind::Bool:
    case Kind::Int: return i_ != 0;
    case Kind::Float: return f_ != 0.0;
    case Kind::String: return !s_.empty();
    case Kind::List:
    case Kind::Tuple: return !list_->empty();
    case Kind::Dict: return !dict_->items.empty();
    default: return true;
  }
}

std::string Value::type_name() const {
  switch (kind_) {
    case Kind::Undefined: return "Undefined";
    case Kind::None: return "NoneType";
    case Kind::Bool: return "bool";
    case Kind::Int: return "int";
    case Kind::Float: return "float";
    case Kind::String: return "str";
    case Kind::List: return "list";
    case Kind::Tuple: return "tuple";
    case Kind::Dict: return "dict";
    case Kind::Namespace: return "Namespace";
    case Kind::Function: return "function";
  }
  return "?";
}

std::string py_float_repr(double v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v < 0 ? "-inf" : "inf";
  char buf[64];
  auto res = std::to_chars(buf, buf + sizeof buf, v, std::chars_format::scientific);
  std::string sci(buf, res.ptr);
  std::string sign;
  if (sci[0] == '-') {
    sign = "-";
    sci.erase(0, 1);
  }
  size_t e = sci.find('e');
  std::string digits;
  for (size_t i = 0; i < e; ++i)
    if (sci[i] != '.') digits += sci[i];
  int exp10 = std::stoi(sci.substr(e + 1));
  while (digits.size() > 1 && digits.back() == '0') digits.pop_back();
  int decpt = exp10 + 1;  // position of the decimal point relative to the digits
  std::string out;
  if (decpt > -4 && decpt <= 16) {
    if (decpt <= 0) {
      out = "0." + std::string(-decpt, '0') + digits;
    } else if (decpt >= static_cast<int>(digits.size())) {
      out = digits + std::string(decpt - digits.size(), '0') + ".0";
    } else {
      out = digits.substr(0, decpt) + "." + digits.substr(decpt);
    }
  } else {
    out = digits.substr(0, 1);
    if (digits.size() > 1) out += "." + digits.substr(1);
    char eb[16];
    std::snprintf(eb, sizeof eb, "e%c%02d", exp10 < 0 ? '-' : '+', std::abs(exp10));
    out += eb;
  }
  return sign + out;
}

static bool py_isprintable(char32_t c) {
  if (c == ' ') return true;
  auto cat = utf8proc_category(static_cast<utf8proc_int32_t>(c));
  switch (cat) {
    case UTF8PROC_CATEGORY_CC:
    case UTF8PROC_CATEGORY_CF:
    case UTF8PROC_CATEGORY_CS:
    case UTF8PROC_CATEGORY_CO:
    case UTF8PROC_CATEGORY_CN:
    case UTF8PROC_CATEGORY_ZL:
    case UTF8PROC_CATEGORY_ZP:
    case UTF8PROC_CATEGORY_ZS: return false;
    default: return true;
  }
}

static std::string str_repr(const std::string& s) {
  bool has_sq = s.find('\'') != std::string::npos, has_dq = s.find('"') != std::string::npos;
  char q = has_sq && !has_dq ? '"' : '\'';
  std::string out(1, q);
  for (char32_t c : utf8_decode(s)) {
    if (c == static_cast<char32_t>(q) || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c == '\t') {
      out += "\\t";
    } else if (!py_isprintable(c)) {
      char b[16];
      if (c < 0x100)
        std::snprintf(b, sizeof b, "\\x%02x", static_cast<unsigned>(c));
      else if (c < 0x10000)
        std::snprintf(b, sizeof b, "\\u%04x", static_cast<unsigned>(c));
      else
        std::snprintf(b, sizeof b, "\\U%08x", static_cast<unsigned>(c));
      out += b;
    } else {
      utf8_append(out, c);
    }
  }
  out += q;
  return out;
}

std::string Value::str() const {
  switch (kind_) {
    case Kind::Undefined: return "";
    case Kind::String: return s_;
    default: return repr();
  }
}

std::string Value::repr() const {
  switch (kind_) {
    case Kind::Undefined: return "Undefined";
    case Kind::None: return "None";
    case Kind::Bool: return i_ ? "True" : "False";
    case Kind::Int: return std::to_string(i_);
    case Kind::Float: return py_float_repr(f_);
    case Kind::String: return str_repr(s_);
    case Kind::List:
    case Kind::Tuple: {
      bool t = kind_ == Kind::Tuple;
      std::string out = t ? "(" : "[";
      for (size_t i = 0; i < list_->size(); ++i) {
        if (i) out += ", ";
        out += (*list_)[i].repr();
      }
      if (t && list_->size() == 1) out += ",";
      return out + (t ? ")" : "]");
    }
    case Kind::Dict:
    case Kind::Namespace: {
      std::string out = "{";
      bool first = true;
      for (auto& [k, v] : dict_->items) {
        if (!first) out += ", ";
        first = false;
        out += k.repr() + ": " + v.repr();
      }
      out += "}";
      return kind_ == Kind::Namespace ? "<Namespace " + out + ">" : out;
    }
    case Kind::Function: return "<function " + fn_->name + ">";
  }
  return "";
}

bool Value::identical(const Value& o) const {
  if (kind_ != o.kind_) return false;
  switch (kind_) {
    case Kind::Undefined:
    case Kind::None: return true;
    case Kind::Bool:
    case Kind::Int: return i_ == o.i_;
    case Kind::Float: return f_ == o.f_;
    case Kind::String: return s_ == o.s_;
    case Kind::List:
    case Kind::Tuple: return list_ == o.list_;
    case Kind::Dict:
    case Kind::Namespace: return dict_ == o.dict_;
    case Kind::Function: return fn_ == o.fn_;
  }
  return false;
}

bool operator==(const Value& a, const Value& b) {
  using K = Value::Kind;
  if (a.is_number() && b.is_number()) {
    if (a.kind() != K::Float && b.kind() != K::Float) return a.as_int() == b.as_int();
    return a.as_float() == b.as_float();
  }
  if (a.kind() != b.kind()) return false;
  switch (a.kind()) {
    case K::Undefined:
    case K::None: return true;
    case K::String: return a.str_ref() == b.str_ref();
    case K::List:
    case K::Tuple: return a.items() == b.items();
    case K::Dict: {
      auto &x = a.dict_ref().items, &y = b.dict_ref().items;
      if (x.size() != y.size()) return false;
      for (auto& [k, v] : x) {
        const Value* w = b.dict_ref().find(k);
        if (!w || !(*w == v)) return false;
      }
      return true;
    }
    default: return a.identical(b);
  }
}

// ---- json.dumps ---------------------------------------------------------------------------

static void json_str(std::string& out, const std::string& s, bool ensure_ascii) {
  out += '"';
  for (char32_t c : utf8_decode(s)) {
    switch (c) {
      case '"': out += "\\\""; continue;
      case '\\': out += "\\\\"; continue;
      case '\n': out += "\\n"; continue;
      case '\r': out += "\\r"; continue;
      case '\t': out += "\\t"; continue;
      case '\b': out += "\\b"; continue;
      case '\f': out += "\\f"; continue;
      default: break;
    }
    char b[16];
    if (c < 0x20 || (ensure_ascii && c > 0x7E)) {
      if (c >= 0x10000) {
        char32_t v = c - 0x10000;
        std::snprintf(b, sizeof b, "\\u%04x\\u%04x", static_cast<unsigned>(0xD800 + (v >> 10)),
                      static_cast<unsigned>(0xDC00 + (v & 0x3FF)));
      } else {
        std::snprintf(b, sizeof b, "\\u%04x", static_cast<unsigned>(c));
      }
      out += b;
    } else {
      utf8_append(out, c);
    }
  }
  out += '"';
}

static std::string json_float(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v < 0 ? "-Infinity" : "Infinity";
  return py_float_repr(v);
}

static void json_dump(std::string& out, const Value& v, const JsonDumpOptions& o, int level) {
  using K = Value::Kind;
  auto newline = [&](int lvl) {
    if (o.indent >= 0) {
      out += '\n';
      out.append(static_cast<size_t>(o.indent) * lvl, ' ');
    }
  };
  switch (v.kind()) {
    case K::None: out += "null"; return;
    case K::Bool: out += v.as_bool_raw() ? "true" : "false"; return;
    case K::Int: out += std::to_string(v.as_int()); return;
    case K::Float: out += json_float(v.as_float()); return;
    case K::String: json_str(out, v.str_ref(), o.ensure_ascii); return;
    case K::List:
    case K::Tuple: {
      if (v.items().empty()) {
        out += "[]";
        return;
      }
      out += '[';
      bool first = true;
      for (auto& e : v.items()) {
        if (!first) out += o.item_sep;
        first = false;
        newline(level + 1);
        json_dump(out, e, o, level + 1);
      }
      newline(level);
      out += ']';
      return;
    }
    case K::Dict: {
      if (v.dict_ref().items.empty()) {
        out += "{}";
        return;
      }
      std::vector<std::pair<std::string, const Value*>> kv;
      for (auto& [k, e] : v.dict_ref().items) {
        std::string key;
        switch (k.kind()) {
          case K::String: key = k.str_ref(); break;
          case K::None: key = "null"; break;
          case K::Bool: key = k.as_bool_raw() ? "true" : "false"; break;
          case K::Int: key = std::to_string(k.as_int()); break;
          case K::Float: key = json_float(k.as_float()); break;
          default: throw RuntimeError("keys must be str, int, float, bool or None, not " + k.type_name());
        }
        kv.emplace_back(std::move(key), &e);
      }
      if (o.sort_keys)
        std::stable_sort(kv.begin(), kv.end(), [](auto& a, auto& b) { return a.first < b.first; });
      out += '{';
      bool first = true;
      for (auto& [k, e] : kv) {
        if (!first) out += o.item_sep;
        first = false;
        newline(level + 1);
        json_str(out, k, o.ensure_ascii);
        out += o.key_sep;
        json_dump(out, *e, o, level + 1);
      }
      newline(level);
      out += '}';
      return;
    }
    default: throw RuntimeError("Object of type " + v.type_name() + " is not JSON serializable");
  }
}

std::string json_dumps(const Value& v, const JsonDumpOptions& opt) {
  JsonDumpOptions o = opt;
  if (o.item_sep.empty()) o.item_sep = o.indent >= 0 ? "," : ", ";
  if (o.key_sep.empty()) o.key_sep = ": ";
  std::string out;
  json_dump(out, v, o, 0);
  return out;
}

}  // namespace atlas::tmpl
