#include "core/dtype.h"

#include <array>
#include <utility>

namespace atlas {
namespace {
struct Entry {
  DType type;
  std::string_view name;
  size_t size;
};
constexpr std::array<Entry, 10> kTypes{{{DType::F32, "F32", 4},
                                        {DType::F16, "F16", 2},
                                        {DType::BF16, "BF16", 2},
                                        {DType::F64, "F64", 8},
                                        {DType::I64, "I64", 8},
                                        {DType::I32, "I32", 4},
                                        {DType::I16, "I16", 2},
                                        {DType::I8, "I8", 1},
                                        {DType::U8, "U8", 1},
                                        {DType::BOOL, "BOOL", 1}}};
}  // namespace

size_t dtype_size(DType t) { return kTypes[size_t(t)].size; }
std::string_view dtype_name(DType t) { return kTypes[size_t(t)].name; }

std::optional<DType> parse_dtype(std::string_view name) {
  for (const auto& e : kTypes)
    if (e.name == name) return e.type;
  return std::nullopt;
}

}  // namespace atlas
