// atlas hooks [--filter GLOB] [--json]: the hook points a forward pass exposes.
#include <cstdio>

#include "cli/command.h"
#include "core/json.h"
#include "model/hooks.h"

namespace atlas::cli {
namespace {

Registrar reg{{
    .name = "hooks",
    .help = "List the model's hook points (names, shapes, when they fire)",
    .setup =
        [](CLI::App& app) {
          static std::string filter = "*";
          static bool as_json = false;
          app.add_option("--filter", filter, "Glob over hook names ('*' matches anything)")->capture_default_str();
          app.add_flag("--json", as_json, "Print as JSON");
          app.footer(
              "Names with {L} take a layer number (blocks.3.hook_resid_post). atlas trace --record keeps any of them; "
              "trace/generate --intervene edit them (all but attn.hook_pattern, which is read-only; docs/trace.md).");
          app.callback([] {
            ojson out = ojson::array();
            for (const auto& h : hook_catalog()) {
              if (!glob_match(filter, h.name)) continue;
              if (as_json)
                out.push_back({{"name", h.name}, {"shape", h.shape}, {"dtype", h.dtype}, {"when", h.when}});
              else
                std::printf("%-36s %-30s %-4s %s\n", h.name.c_str(), h.shape.c_str(), h.dtype.c_str(),
                            h.when.c_str());
            }
            if (as_json) std::printf("%s\n", out.dump(2).c_str());
          });
        },
}};

}  // namespace
}  // namespace atlas::cli
