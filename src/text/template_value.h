// The value type of the chat-template interpreter (a Jinja2 subset, see template.h).
//
// Values follow Python's data model as Jinja exposes it: None, bool, int, float, str, list,
// tuple, dict (insertion-ordered), plus Jinja's Undefined, namespace() objects and callables.
// Containers are shared (like Python references); only namespaces are ever mutated, because
// Hugging Face renders chat templates in an *immutable* sandbox.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/json.h"

namespace atlas::tmpl {

// Raised while rendering; the interpreter adds the template name, line and column before it
// reaches the caller as an atlas::Error.
struct RuntimeError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

class Value;
using ValueList = std::vector<Value>;

// Insertion-ordered mapping with Python key equality (1 == 1.0 == True). Linear lookup: chat
// messages and tool schemas have a handful of keys.
struct ValueDict {
  std::vector<std::pair<Value, Value>> items;
  const Value* find(const Value& key) const;
  const Value* find(std::string_view key) const;
  void set(Value key, Value value);
};

struct CallArgs {
  std::vector<Value> pos;
  std::vector<std::pair<std::string, Value>> kw;
  // Python-style binding: the i-th positional or the keyword `name`; nullptr when absent.
  const Value* get(size_t i, std::string_view name) const;
};

struct Function {
  std::string name;
  std::function<Value(const CallArgs&)> call;
};

class Value {
 public:
  enum class Kind { Undefined, None, Bool, Int, Float, String, List, Tuple, Dict, Namespace, Function };

  Value() = default;  // Undefined
  static Value undefined(std::string hint = {}) {
    Value v;
    v.s_ = std::move(hint);
    return v;
  }
  static Value none() { return Value(Kind::None); }
  Value(bool b) : kind_(Kind::Bool), i_(b) {}
  Value(int v) : kind_(Kind::Int), i_(v) {}
  Value(int64_t v) : kind_(Kind::Int), i_(v) {}
  Value(double v) : kind_(Kind::Float), f_(v) {}
  Value(std::string s) : kind_(Kind::String), s_(std::move(s)) {}
  Value(std::string_view s) : kind_(Kind::String), s_(s) {}
  Value(const char* s) : kind_(Kind::String), s_(s) {}
  static Value list(ValueList items = {});
  static Value tuple(ValueList items);
  static Value dict(ValueDict d = {});
  static Value namespace_(ValueDict d = {});
  static Value function(std::string name, std::function<Value(const CallArgs&)> fn);
  static Value from_json(const json& j);
  static Value from_json(const ojson& j);

  Kind kind() const { return kind_; }
  bool is_undefined() const { return kind_ == Kind::Undefined; }
  bool is_none() const { return kind_ == Kind::None; }
  bool is_bool() const { return kind_ == Kind::Bool; }
  bool is_int() const { return kind_ == Kind::Int || kind_ == Kind::Bool; }  // Python: bool is an int
  bool is_number() const { return is_int() || kind_ == Kind::Float; }
  bool is_string() const { return kind_ == Kind::String; }
  bool is_seq() const { return kind_ == Kind::List || kind_ == Kind::Tuple; }
  bool is_dict() const { return kind_ == Kind::Dict; }
  bool is_namespace() const { return kind_ == Kind::Namespace; }
  bool is_function() const { return kind_ == Kind::Function; }

  bool as_bool_raw() const { return i_ != 0; }
  int64_t as_int() const { return i_; }
  double as_float() const { return kind_ == Kind::Float ? f_ : static_cast<double>(i_); }
  const std::string& str_ref() const { return s_; }  // String contents, or the Undefined hint
  const ValueList& items() const { return *list_; }
  const ValueDict& dict_ref() const { return *dict_; }
  ValueDict& namespace_ref() const { return *dict_; }
  const Function& fn() const { return *fn_; }

  bool truthy() const;
  std::string type_name() const;  // Python's: "str", "int", "dict", "NoneType", ...
  std::string str() const;        // Python str(); Undefined -> ""
  std::string repr() const;       // Python repr()
  bool identical(const Value& o) const;  // `is sameas`

 private:
  explicit Value(Kind k) : kind_(k) {}
  Kind kind_ = Kind::Undefined;
  int64_t i_ = 0;
  double f_ = 0;
  std::string s_;
  std::shared_ptr<ValueList> list_;
  std::shared_ptr<ValueDict> dict_;
  std::shared_ptr<Function> fn_;
};

bool operator==(const Value& a, const Value& b);  // Python ==

// Python's float repr (shortest round-trip digits, '1e+16', '0.0001', 'inf').
std::string py_float_repr(double v);

struct JsonDumpOptions {
  bool ensure_ascii = false;  // HF's tojson default (json.dumps defaults to true)
  int indent = -1;            // < 0: one line
  std::string item_sep, key_sep;  // empty: json.dumps defaults for the indent setting
  bool sort_keys = false;
};
// Python json.dumps over a Value; Undefined, functions and namespaces -> RuntimeError.
std::string json_dumps(const Value& v, const JsonDumpOptions& opt);

// UTF-8 helpers with Python str semantics (indices in code points).
std::vector<char32_t> utf8_decode(std::string_view s);
std::string utf8_encode(const std::vector<char32_t>& cps);
void utf8_append(std::string& out, char32_t cp);
size_t utf8_length(std::string_view s);
bool py_isspace(char32_t c);

}  // namespace atlas::tmpl
