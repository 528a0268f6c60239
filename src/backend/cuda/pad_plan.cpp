#include "backend/cuda/pad_plan.h"

#include <array>
#include <map>
#include <string>

#include "core/error.h"

namespace atlas::cuda {

PadPlan plan_padding(std::span<const int32_t> ids, std::span<const int32_t> positions,
                     std::span<const int32_t> visible, std::span<const int32_t> cache_rows,
                     std::span<const uint8_t> mask) {
  const size_t M = mask.size();
  const auto same = [&](std::span<const int32_t> s, const char* field) {
    if (s.size() != M)
      throw Error("cuda: plan_padding: " + std::string(field) + " holds " + std::to_string(s.size()) + " values for " +
                  std::to_string(M) + " rows");
  };
  same(ids, "ids");
  same(positions, "positions");
  same(visible, "visible");
  same(cache_rows, "cache_rows");
  PadPlan p;
  p.src_of.resize(M);
  std::map<std::array<int32_t, 4>, int32_t> seen;  // padding key -> computed row
  for (size_t m = 0; m < M; ++m) {
    if (!mask[m]) {
      const std::array<int32_t, 4> key{ids[m], positions[m], visible[m], visible[m] > 0 ? cache_rows[m] : -1};
      const auto [it, fresh] = seen.emplace(key, int32_t(p.first.size()));
      p.src_of[m] = it->second;
      if (!fresh) continue;
    } else {
      p.src_of[m] = int32_t(p.first.size());
    }
    p.first.push_back(int32_t(m));
  }
  return p;
}

}  // namespace atlas::cuda
