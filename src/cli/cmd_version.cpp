// atlas version [--json]: build provenance (the same fields every artifact records).
#include <cstdio>

#include "atlas/build_info.h"
#include "cli/command.h"
#include "core/json.h"

namespace {
atlas::cli::Registrar reg{{
    .name = "version",
    .help = "Print version and build provenance",
    .setup =
        [](CLI::App& app) {
          static bool as_json = false;
          app.add_flag("--json", as_json, "Print as JSON");
          app.callback([] {
            atlas::ojson j{{"version", ATLAS_VERSION},
                           {"git_commit", ATLAS_GIT_COMMIT},
                           {"build_type", ATLAS_BUILD_TYPE},
                           {"compiler", ATLAS_CXX_COMPILER}};
            if (as_json)
              std::printf("%s\n", j.dump(2).c_str());
            else
              std::printf("atlas %s (%s, %s, %s)\n", ATLAS_VERSION, ATLAS_GIT_COMMIT, ATLAS_BUILD_TYPE,
                          ATLAS_CXX_COMPILER);
          });
        },
}};
}  // namespace
