#include "core/provenance.h"

#include <omp.h>
#include <sys/resource.h>
#include <unistd.h>

#include <ctime>
#include <fstream>

#include "atlas/build_info.h"
#include "core/sha256.h"
#ifdef ATLAS_HAVE_CUDA
#include "backend/cuda/cuda_ops.h"
#endif

namespace atlas {

ojson build_provenance() {
  ojson j;
  j["tool"] = "atlas";
  j["version"] = ATLAS_VERSION;
  j["git_commit"] = ATLAS_GIT_COMMIT;
  j["build_type"] = ATLAS_BUILD_TYPE;
  j["compiler"] = ATLAS_CXX_COMPILER;
  j["build_flags"] = build_flags();
  return j;
}

namespace {
// Compile-time facts of this translation unit, which is built with the library's flags.
#if defined(__AVX2__)
constexpr bool kAvx2 = true;
#else
constexpr bool kAvx2 = false;
#endif
#if defined(__FMA__)
constexpr bool kFma = true;
#else
constexpr bool kFma = false;
#endif
#if defined(__FAST_MATH__)
constexpr bool kFastMath = true;
#else
constexpr bool kFastMath = false;
#endif
#if defined(__OPTIMIZE__)
constexpr bool kOptimize = true;
#else
constexpr bool kOptimize = false;
#endif
#if defined(NDEBUG)
constexpr bool kNdebug = true;
#else
constexpr bool kNdebug = false;
#endif
#if defined(_OPENMP)
constexpr int64_t kOpenmp = _OPENMP;
#else
constexpr int64_t kOpenmp = 0;
#endif
#if defined(ATLAS_HAVE_CUDA)
constexpr bool kCuda = true;
#else
constexpr bool kCuda = false;
#endif
}  // namespace

ojson build_flags() {
  ojson j;
#if defined(__x86_64__)
  j["x86_avx2"] = kAvx2;
  j["x86_fma"] = kFma;
  // GCC exposes no macro for -ffp-contract; the top-level CMakeLists.txt sets it off together
  // with -mavx2/-mfma on x86 (see the comment there).
  j["fp_contract"] = "off";
#else
  (void)kAvx2;
  (void)kFma;
#endif
  j["fast_math"] = kFastMath;
  j["optimize"] = kOptimize;
  j["ndebug"] = kNdebug;
  j["openmp"] = kOpenmp;  // the _OPENMP version date; 0 without OpenMP
  ojson san = ojson::array();
#if defined(__SANITIZE_ADDRESS__)
  san.push_back("address");
#endif
#if defined(__SANITIZE_THREAD__)
  san.push_back("thread");
#endif
  j["sanitizers"] = san;
  j["cuda"] = kCuda;
  return j;
}

ojson device_provenance(const std::string& backend, int device) {
  ojson j;
  j["backend"] = backend;
  if (backend == "cuda") {
#ifdef ATLAS_HAVE_CUDA
    const cuda::DeviceInfo d = cuda::device_info(device);
    j["device"] = d.name;
    j["device_index"] = device;
    j["compute_capability"] = std::to_string(d.cc_major) + "." + std::to_string(d.cc_minor);
    j["sm_count"] = d.sm_count;
    j["total_memory_bytes"] = int64_t(d.total_memory);
#else
    j["device"] = "unavailable (built without CUDA)";
#endif
    return j;
  }
  std::string model = "unknown";
  std::ifstream in("/proc/cpuinfo");
  for (std::string line; std::getline(in, line);)
    if (line.rfind("model name", 0) == 0) {
      if (auto colon = line.find(':'); colon != std::string::npos) {
        model = line.substr(colon + 1);
        model.erase(0, model.find_first_not_of(" \t"));
      }
      break;
    }
  j["device"] = model;
  return j;
}

std::string artifact_content_sha256(const ojson& artifact) {
  ojson c = artifact;
  for (const char* k : {"runtime", "provenance", "inputs", "content_sha256"}) c.erase(k);
  return sha256_hex(c.dump());
}

ojson runtime_section(const RuntimeClock& clock) {
  ojson j;
  char host[256] = {0};
  ::gethostname(host, sizeof host - 1);
  j["host"] = host;
  j["threads"] = omp_get_max_threads();
  std::time_t now = std::time(nullptr);
  char ts[32];
  std::strftime(ts, sizeof ts, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&now));
  j["finished_at"] = ts;
  j["seconds"] = clock.seconds();
  struct rusage ru {};
  ::getrusage(RUSAGE_SELF, &ru);
  j["peak_rss_bytes"] = int64_t(ru.ru_maxrss) * 1024;
  return j;
}

}  // namespace atlas
