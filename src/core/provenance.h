// Provenance for artifacts: what produced them (deterministic: compared across reruns) and
// runtime facts (timings, host, threads: kept in a separate "runtime" section that no
// comparison reads).
#pragma once

#include <chrono>
#include <string>

#include "core/json.h"

namespace atlas {

ojson build_provenance();  // tool version, git commit, build type, compiler, build_flags

// Compile-time facts that can change numerics or checking, as this library was built:
// {"x86_avx2", "x86_fma", "fast_math", "fp_contract", "optimize", "ndebug", "openmp",
// "sanitizers", "cuda"}. Part of build_provenance().
ojson build_flags();

// Backend and device facts for an artifact's provenance: {"backend", "device"} and, for cuda,
// {"compute_capability", "sm_count", "total_memory_bytes"}. The CPU's device is the first
// "model name" of /proc/cpuinfo ("unknown" where there is none). Machine-specific: compare
// reports these with the rest of provenance but does not count them.
ojson device_provenance(const std::string& backend, int device = 0);  // device: the CUDA index

// SHA-256 of an artifact's deterministic result content: its compact dump (keys in written
// order) without "runtime", "provenance", "inputs" and "content_sha256". Provenance (build,
// device) and input records (file paths and file hashes, which pin other files' runtime
// sections too) describe how and from what the artifact was made, not what it holds, so a
// rerun on another machine or into another directory has the same content_sha256. The probe
// run (run.json), the evaluation (EVAL.json) and the analysis (analysis.json) all use it.
std::string artifact_content_sha256(const ojson& artifact);

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
