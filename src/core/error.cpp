#include "core/error.h"

namespace atlas {

void fail(std::string_view file, std::string_view field, std::string_view what) {
  std::string m;
  if (!file.empty()) m.append(file).append(": ");
  if (!field.empty()) m.append(field).append(": ");
  m.append(what);
  throw Error(std::move(m));
}

}  // namespace atlas
