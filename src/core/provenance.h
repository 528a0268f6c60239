// Provenance for artifacts: what produced them (deterministic: compared across reruns) and
// runtime facts (timings, host, threads: kept in a separate "runtime" section that no
// comparison reads).
#pragma once

#include <chrono>
#include <string>

#include "core/json.h"

namespace atlas {

ojson build_provenance();  // tool version, git commit, build type, compiler

class RuntimeClock {
 public:
  RuntimeClock() : start_(std::chrono::steady_clock::now()) {}
  double seconds() const {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  }

 private:
  std::chrono::steady_clock::time_point start_;
};

// {"host", "threads", "started_at" (UTC ISO-8601), "seconds", "peak_rss_bytes"}.
ojson runtime_section(const RuntimeClock& clock);

}  // namespace atlas
