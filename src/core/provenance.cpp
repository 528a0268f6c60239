#include "core/provenance.h"

#include <omp.h>
#include <sys/resource.h>
#include <unistd.h>

#include <ctime>

#include "atlas/build_info.h"

namespace atlas {

ojson build_provenance() {
  ojson j;
  j["tool"] = "atlas";
  j["version"] = ATLAS_VERSION;
  j["git_commit"] = ATLAS_GIT_COMMIT;
  j["build_type"] = ATLAS_BUILD_TYPE;
  j["compiler"] = ATLAS_CXX_COMPILER;
  return j;
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
