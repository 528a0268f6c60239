// Element types as safetensors names them.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

namespace atlas {

enum class DType : uint8_t { F32, F16, BF16, F64, I64, I32, I16, I8, U8, BOOL };

size_t dtype_size(DType t);
std::string_view dtype_name(DType t);                         // "F32", "BF16", ...
std::optional<DType> parse_dtype(std::string_view safetensors_name);

}  // namespace atlas
