// atlas direction RUN... --stage S --condition A --reference B --out V.safetensors [--normalize]
// A difference-of-means direction from probe runs' hidden vectors (src/stats/direction.h),
// written under the stage's hook name for `--intervene 'HOOK=add:V.safetensors*F'`.
#include <cstdio>

#include "cli/command.h"
#include "core/json.h"
#include "io/safetensors.h"
#include "stats/direction.h"
#include "stats/run_adapter.h"

namespace atlas::cli {
namespace {

struct DirectionArgs {
  std::vector<std::string> runs;
  std::string manifest, out;
  stats::DirectionOptions o;
};

Registrar reg{{
    .name = "direction",
    .help = "Mean hidden-state difference of two conditions at one stage of probe runs (a steering vector for add:FILE)",
    .setup =
        [](CLI::App& app) {
          static DirectionArgs a;
          app.add_option("runs", a.runs, "Probe run directories or their run.json (record_hidden_vectors; shards of one manifest)")
              ->required();
          app.add_option("--manifest", a.manifest, "The frozen manifest (checked against the runs)");
          app.add_option("--stage", a.o.stage, "Stage: embed, layer.NN, final_norm, or its hook (blocks.N.hook_resid_post)")
              ->required();
          app.add_option("--condition", a.o.condition, "The condition whose mean the direction points to")->required();
          app.add_option("--reference", a.o.reference, "The condition whose mean it points from")->required();
          app.add_flag("--normalize", a.o.normalize, "Scale the direction to unit L2 norm");
          app.add_option("--out", a.out, "Safetensors file to write (one F32 [hidden] tensor named as the hook)")->required();
          app.callback([] {
            const stats::AnalysisInput in = stats::read_run_artifacts({.runs = a.runs, .manifest = a.manifest});
            const stats::Direction d = stats::mean_difference(in, a.o);
            ojson runs = ojson::array();
            for (const auto& f : in.files) runs.push_back({{"path", f.path}, {"sha256", f.sha256}});
            const std::map<std::string, std::string> meta = {
                {"kind", "atlas.direction"},
                {"manifest_sha256", in.manifest_sha256},
                {"inputs", runs.dump()},
                {"stage", d.stage},
                {"condition", a.o.condition},
                {"reference", a.o.reference},
                {"cells", ojson{{"condition", d.cells_condition}, {"reference", d.cells_reference}}.dump()},
                {"rows", ojson{{"condition", d.rows_condition}, {"reference", d.rows_reference}}.dump()},
                {"norm", ojson(d.norm).dump()},
                {"normalized", a.o.normalize ? "true" : "false"}};
            write_safetensors(a.out, {{.name = d.hook, .dtype = DType::F32, .shape = {int64_t(d.v.size())}, .data = d.v.data()}},
                              meta);
            std::printf("direction %s: mean(%s) - mean(%s) at %s over %lld / %lld target rows (%lld / %lld cells), norm %.6g%s\n",
                        a.out.c_str(), a.o.condition.c_str(), a.o.reference.c_str(), d.stage.c_str(),
                        (long long)d.rows_condition, (long long)d.rows_reference, (long long)d.cells_condition,
                        (long long)d.cells_reference, d.norm, a.o.normalize ? " (written normalised)" : "");
            std::printf("add it back with: --intervene '%s=add:%s*F'\n", d.hook.c_str(), a.out.c_str());
          });
        },
}};

}  // namespace
}  // namespace atlas::cli
