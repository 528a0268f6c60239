// atlas merge MANIFEST.json SHARD_DIR... --out DIR: joins the run artifacts of `atlas run
// --shard i/n`, checking that every cell of the manifest appears exactly once.
#include <cstdio>

#include "cli/command.h"
#include "probe/run.h"

namespace atlas::cli {
namespace {

struct MergeArgs {
  std::string manifest, out;
  std::vector<std::string> shards;
};

Registrar reg{{
    .name = "merge",
    .help = "Merge shard outputs of atlas run into one artifact (nothing missing, nothing doubled)",
    .setup =
        [](CLI::App& app) {
          static MergeArgs a;
          app.add_option("MANIFEST", a.manifest, "The manifest the shards ran")->required();
          app.add_option("SHARD_DIRS", a.shards, "Output directories of the shards")->required();
          app.add_option("--out", a.out, "Directory for the merged run.json")->required();
          app.callback([] {
            auto s = probe::merge_runs({.manifest = a.manifest, .shard_dirs = a.shards, .out_dir = a.out});
            std::printf("merge: %lld cells from %zu shards -> %s\ncontent sha256 %s\n", (long long)s.cells,
                        a.shards.size(), s.artifact.c_str(), s.content_sha256.c_str());
          });
        },
}};

}  // namespace
}  // namespace atlas::cli
