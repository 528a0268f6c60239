// atlas bench --model DIR [--backend cuda] [--workload W]... [--mode M]... [--reference REF.json]
//             [--json OUT.json] [--save-prompts P.json] [--repeat N]
// Speed and memory of the engine on a model directory (issue 5's workloads, src/bench/bench.h),
// each figure beside the transformers figure measured on the same machine in the same session
// (tools/reference/bench_transformers.py writes REF.json from the prompts saved here).
#include <cstdio>

#include "bench/bench.h"
#include "cli/command.h"
#include "core/file.h"
#include "io/checkpoint.h"

namespace atlas::cli {
namespace {

struct BenchArgs {
  bench::BenchOptions o;
  std::string json_out, save_prompts;
};

std::string joined_argv() {
  std::string s;
  std::FILE* f = std::fopen("/proc/self/cmdline", "rb");
  if (!f) return "atlas bench";
  int c;
  while ((c = std::fgetc(f)) != EOF) s += c == 0 ? ' ' : char(c);
  std::fclose(f);
  while (!s.empty() && s.back() == ' ') s.pop_back();
  return s;
}

Registrar reg{{
    .name = "bench",
    .help = "Measure load, the 128x512 seed grid, a 128-prompt prefill trace, batch-1 decode and peak memory",
    .setup =
        [](CLI::App& app) {
          static BenchArgs a;
          app.add_option("--model", a.o.model_dir, "Model directory (full-size for the issue's figures)")->required();
          app.add_option("--backend", a.o.backend, "cuda or cpu")->capture_default_str();
          app.add_option("--device", a.o.device, "CUDA device index")->capture_default_str();
          app.add_option("--workload", a.o.workloads,
                         "load | seed-grid-128x512 | prefill-trace-128 | decode-b1 | peak-mem-128x1024 (repeat; "
                         "default all)");
          app.add_option("--mode", a.o.modes, "batch-invariant | fast (repeat; default both on cuda)");
          app.add_option("--reference", a.o.reference_path, "bench_transformers.py output for the same prompts");
          app.add_option("--json", a.json_out, "Write the records here (JSON list)");
          app.add_option("--save-prompts", a.save_prompts, "Write the grid prompts (JSON) for the reference script");
          app.add_option("--seed", a.o.seed, "Prompt seed")->capture_default_str();
          app.add_option("--grid-prompts", a.o.grid_prompts, "Rows of the seed grid")->capture_default_str();
          app.add_option("--grid-new-tokens", a.o.grid_new_tokens, "New tokens per row")->capture_default_str();
          app.add_option("--prompt-min", a.o.prompt_min,
                         "Shortest grid / traced-prefill prompt (lengths uniform in [min, max]; the issue's workloads: "
                         "200-300)")
              ->check(CLI::Range(int64_t(1), int64_t(1) << 20))
              ->capture_default_str();
          app.add_option("--prompt-max", a.o.prompt_max, "Longest grid / traced-prefill prompt")
              ->check(CLI::Range(int64_t(1), int64_t(1) << 20))
              ->capture_default_str();
          app.add_option("--decode-steps", a.o.decode_steps, "Batch-1 decode steps")->capture_default_str();
          app.add_option("--decode-ahead", a.o.decode_ahead,
                         "Batch-1 decode steps pushed ahead of the one read (as atlas generate; 0: one forward call "
                         "per step)")
              ->check(CLI::Range(int64_t(0), DecodeRun::kMaxPending - 1))
              ->capture_default_str();
          app.add_option("--mem-prefill", a.o.mem_prefill, "Prefill tokens of the memory workload")->capture_default_str();
          app.add_option("--mem-steps", a.o.mem_steps, "Decode steps of the memory workload")->capture_default_str();
          app.add_option("--repeat", a.o.repeat,
                         "Runs of each timed workload (grid, traced prefill, batch-1 decode) on the loaded model; "
                         "the record keeps the median and every run")
              ->check(CLI::Range(1, 1000))
              ->capture_default_str();
          app.add_option("--intervene", a.o.interventions,
                         "Hook edit for the grid, traced prefill and batch-1 decode (repeatable; as atlas generate "
                         "--intervene): each runs with and without the edits, detail.edit_cost their time ratio");
          app.callback([] {
            if (a.o.prompt_max < a.o.prompt_min)
              fail("--prompt-max", {}, "must be >= --prompt-min (" + std::to_string(a.o.prompt_min) + "), got " +
                                           std::to_string(a.o.prompt_max));
            a.o.command = joined_argv();
            a.o.progress = progress_enabled();
            if (!a.save_prompts.empty()) {
              const Checkpoint ck = Checkpoint::open(a.o.model_dir);
              const ojson j = bench::prompts_json(a.o, bench::make_prompts(a.o, ck.config().vocab_size));
              write_file_atomic(a.save_prompts, j.dump() + "\n");
              if (a.o.workloads.empty() && a.json_out.empty()) return;
            }
            const auto records = bench::run_bench(a.o);
            const ojson j = bench::to_json(records);
            for (const auto& r : j) {
              std::printf("%-20s %-16s atlas %10.3f %-6s", r["workload"].get<std::string>().c_str(),
                          r["mode"].get<std::string>().c_str(), r["atlas"].get<double>(),
                          r["unit"].get<std::string>().c_str());
              if (!r["reference"].is_null()) std::printf("  transformers %10.3f", r["reference"].get<double>());
              if (!r["speedup_vs_reference"].is_null())
                std::printf("  x%.1f", r["speedup_vs_reference"].get<double>());
              if (r.contains("fraction_of_bound")) std::printf("  %.0f%% of bound", 100 * r["fraction_of_bound"].get<double>());
              if (r["detail"].contains("edit_cost"))
                std::printf("  edits x%.2f the time", r["detail"]["edit_cost"].get<double>());
              std::printf("\n");
            }
            if (!a.json_out.empty()) write_file_atomic(a.json_out, j.dump(2) + "\n");
          });
        },
}};

}  // namespace
}  // namespace atlas::cli
