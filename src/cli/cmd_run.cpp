// atlas run MANIFEST.json --out DIR [--resume] [--shard i/n] [--model DIR]: executes a frozen
// probe manifest (trace or generate), journaling each source, then writes DIR/run.json.
#include <cstdio>

#include "cli/args.h"
#include "cli/command.h"
#include "probe/run.h"

namespace atlas::cli {
namespace {

struct RunArgs {
  std::string manifest, out, model, shard, backend = "cpu";
  int device = 0;
  bool resume = false;
  int threads = 0;
};

Registrar reg{{
    .name = "run",
    .help = "Run a frozen probe manifest: batches, per-source journals (resumable, shardable), one artifact",
    .setup =
        [](CLI::App& app) {
          static RunArgs a;
          app.add_option("MANIFEST", a.manifest, "Manifest written by atlas freeze")->required();
          app.add_option("--out", a.out, "Output directory (journal/ and run.json)")->required();
          app.add_flag("--resume", a.resume, "Verify existing journals and run only what is missing");
          app.add_option("--shard", a.shard, "Run shard i of n (0 <= i < n): sources split by batch group");
          app.add_option("--model", a.model, "Model directory (overrides the manifest's)");
          app.add_option("--backend", a.backend, "cpu or cuda")->capture_default_str();
          app.add_option("--device", a.device, "CUDA device index")->capture_default_str();
          app.add_option("--threads", a.threads, "CPU threads (0 = all); results do not depend on it");
          app.callback([] {
            probe::RunOptions o{.manifest = a.manifest, .out_dir = a.out, .model_dir = a.model, .resume = a.resume,
                                .shard = {}, .sharded = !a.shard.empty(), .progress = progress_enabled(),
                                .backend = a.backend, .device = a.device};
            if (o.sharded) o.shard = probe::parse_shard(a.shard);  // before anything is written
            set_threads(a.threads);
            auto s = probe::run_manifest(o);
            std::printf("run: %lld cells (%lld run, %lld resumed from journals), %lld sources -> %s\n",
                        (long long)s.cells, (long long)s.cells_run, (long long)s.cells_resumed, (long long)s.sources,
                        s.artifact.c_str());
            std::printf("content sha256 %s\n", s.content_sha256.c_str());
          });
        },
}};

}  // namespace
}  // namespace atlas::cli
