// JSON access with errors that name the file and the field (nlohmann::json underneath).
//
//   JsonReader r(j, "config.json");
//   int h = r.get<int>("hidden_size");              // missing or wrong type -> atlas::Error
//   auto q = r.get_optional<int>("q_lora_rank");    // absent or null -> nullopt
#pragma once

#include <cstdint>
#include <limits>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <utility>

#include "core/error.h"

namespace atlas {

using json = nlohmann::json;
// Insertion-ordered object: artifacts keep their keys in the order the code writes them.
using ojson = nlohmann::ordered_json;

json parse_json(const std::string& text, const std::string& file);  // malformed -> atlas::Error
json read_json_file(const std::string& path);

// J[KEY] if J is an object whose KEY holds a string, else "" (where j.value(KEY, "") would throw
// nlohmann's type_error): for the kind checks of files that may not be what they claim.
template <class J>
std::string string_or_empty(const J& j, const std::string& key) {
  if (!j.is_object()) return {};
  const auto it = j.find(key);
  return it != j.end() && it->is_string() ? it->template get<std::string>() : std::string();
}

// Whether the JSON integer V is a value of the integer type T (read by its own signedness, so
// that neither 2^64-1 nor -1 passes for the other).
template <class T, class J>
bool json_integer_fits(const J& v) {
  return v.is_number_unsigned() ? std::in_range<T>(v.template get<uint64_t>())
                                : std::in_range<T>(v.template get<int64_t>());
}

class JsonReader {
 public:
  JsonReader(const json& j, std::string file, std::string prefix = {})
      : j_(j), file_(std::move(file)), prefix_(std::move(prefix)) {}

  bool has(const std::string& key) const { return j_.is_object() && j_.contains(key); }
  bool has_value(const std::string& key) const { return has(key) && !j_.at(key).is_null(); }
  std::string field(const std::string& key) const { return prefix_.empty() ? key : prefix_ + "." + key; }
  const json& raw(const std::string& key) const {
    if (!has(key)) fail(file_, field(key), "missing field");
    return j_.at(key);
  }
  JsonReader child(const std::string& key) const { return JsonReader(raw(key), file_, field(key)); }

  template <class T>
  T get(const std::string& key) const {
    const json& v = raw(key);
    return convert<T>(v, key);
  }
  template <class T>
  T get_or(const std::string& key, T dflt) const {
    return has_value(key) ? get<T>(key) : dflt;
  }
  template <class T>
  std::optional<T> get_optional(const std::string& key) const {
    if (!has_value(key)) return std::nullopt;
    return get<T>(key);
  }
  const std::string& file() const { return file_; }

 private:
  template <class T>
  T convert(const json& v, const std::string& key) const {
    if constexpr (std::is_same_v<T, bool>) {
      if (!v.is_boolean()) fail(file_, field(key), "expected a boolean, got " + v.dump());
    } else if constexpr (std::is_integral_v<T>) {
      if (!v.is_number_integer()) fail(file_, field(key), "expected an integer, got " + v.dump());
      // In range of T (nlohmann would wrap -1 to 2^64-1 or truncate 2^32+1 to 1 without a word).
      using L = std::numeric_limits<T>;
      if (!json_integer_fits<T>(v))
        fail(file_, field(key), "expected an integer from " + std::to_string(L::min()) + " to " +
                                    std::to_string(L::max()) + ", got " + v.dump());
    } else if constexpr (std::is_floating_point_v<T>) {
      if (!v.is_number()) fail(file_, field(key), "expected a number, got " + v.dump());
    } else if constexpr (std::is_same_v<T, std::string>) {
      if (!v.is_string()) fail(file_, field(key), "expected a string, got " + v.dump());
    }
    try {
      return v.get<T>();
    } catch (const std::exception& e) {
      fail(file_, field(key), e.what());
    }
  }

  const json& j_;
  std::string file_, prefix_;
};

}  // namespace atlas
