// atlas make-model --preset tiny|lite [--seed N] [--dtype bf16|f16|f32] [--force] OUT_DIR:
// a DeepSeek-V2 checkpoint with deterministic synthetic weights (see io/synthetic.h for the
// exact generator). The directory appears whole or not at all, and is verified before that.
#include <cstdio>

#include "cli/command.h"
#include "core/error.h"
#include "io/checkpoint.h"
#include "io/synthetic.h"
#include "model/presets.h"

namespace {

atlas::DType parse_weight_dtype(const std::string& s) {
  if (s == "bf16") return atlas::DType::BF16;
  if (s == "f16") return atlas::DType::F16;
  if (s == "f32") return atlas::DType::F32;
  atlas::fail("--dtype", {}, "unsupported value \"" + s + "\" (supported: bf16, f16, f32)");
}

atlas::cli::Registrar reg{{
    .name = "make-model",
    .help = "Write a DeepSeek-V2 checkpoint with deterministic synthetic weights (presets: tiny, lite)",
    .setup =
        [](CLI::App& app) {
          struct Args {
            std::string preset = "tiny", dtype = "bf16", out;
            uint64_t seed = 0, max_shard_size = 0;
            bool force = false;
          };
          static Args a;
          app.add_option("--preset", a.preset,
                         "tiny: ~1 MB, every feature on (the embedded default); lite: DeepSeek-V2-Lite's exact "
                         "config, 4 shards, 31.4 GB")
              ->capture_default_str();
          app.add_option("--seed", a.seed, "Weight seed (same seed, same bytes)")->capture_default_str();
          app.add_option("--dtype", a.dtype, "Stored dtype: bf16, f16 or f32")->capture_default_str();
          app.add_option("--max-shard-size", a.max_shard_size,
                         "Shard the weights, closing a shard once it holds this many bytes (0: the preset's "
                         "default: tiny one file, lite 8 GiB)")
              ->capture_default_str();
          app.add_flag("--force", a.force, "Write into a non-empty OUT_DIR (replaces the model files there)");
          app.add_option("OUT_DIR", a.out, "Output directory")->required();
          app.callback([] {
            atlas::MakeModelOptions opts{
                .preset = a.preset, .seed = a.seed, .dtype = parse_weight_dtype(a.dtype), .max_shard_bytes = {},
                .progress = {}};
            if (atlas::cli::progress_enabled()) {
              opts.progress = [last = -1](uint64_t done, uint64_t total) mutable {
                if (total < 100'000'000) return;  // tiny: done before anyone could read it
                int pct = int(100 * done / total);
                if (pct == last) return;
                last = pct;
                std::fprintf(stderr, "\rmake-model: %3d%% of %.2f GB", pct, double(total) / 1e9);
                if (done == total) std::fprintf(stderr, "\n");
              };
            }
            if (a.max_shard_size) opts.max_shard_bytes = a.max_shard_size;
            atlas::Preset preset = atlas::make_preset(a.preset, opts.dtype);
            atlas::StagedModelDir out(a.out, a.force);
            atlas::write_model_files(out.staging(), preset, opts);
            // Extension point: tokenizer files for the preset are written into out.staging() here.
            std::string summary;
            {
              // What make-model writes must pass the same verification as any checkpoint.
              auto ck = atlas::Checkpoint::open(out.staging());
              summary = ck.summary_line();
            }
            out.commit();
            std::printf("wrote %s (preset %s, seed %llu, %s): %s\n", a.out.c_str(), a.preset.c_str(),
                        (unsigned long long)a.seed, a.dtype.c_str(), summary.c_str());
          });
        },
}};

}  // namespace
