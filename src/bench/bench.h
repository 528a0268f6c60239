// `atlas bench` (issue 5): the engine's speed and memory on a model directory, as records that
// name the reference they are compared with.
//
// Workloads (names and units fixed by the issue):
//   load                 s      Checkpoint::open + load_model, files already in the page cache
//   seed-grid-128x512    s      128 prompts of 200-300 tokens, 512 greedy new tokens each, EOS off,
//                               one batch of 128 through decode::generate (the real code path)
//   prefill-trace-128    s      the same 128 prompts, one forward, recording what a probe trace
//                               records: every gate's top-k ids and weights, and a SHA-256 of every
//                               row's hidden stage (embedding, each layer's output, final norm)
//   decode-b1            tok/s  one prompt of 256 tokens, then 256 greedy decode steps at batch 1,
//                               from the prompt's end to the last token (each run a new cache:
//                               the first token includes its eager step and the step graph's
//                               capture; detail.first_token_s and after_first_tok_s per run)
//   peak-mem-128x1024    GiB    device memory in use (total - free, sampled after every call) for
//                               128 rows x 1024 tokens: prefill of 1000, then 24 decode steps
// Each workload runs in the batch-invariant mode and, on cuda, the fast mode. The reference
// figure comes from tools/reference/bench_transformers.py run on the same checkpoint and prompts
// (its JSON is passed with --reference; null where none). Where that run happened is not
// something the bench can know: each record names the file (path, SHA-256) and carries the
// reference's own device and date, so a comparison against another session's run says so.
// Prompts: deterministic ids from a seed (bench_prompts), shared with the reference script
// through --save-prompts.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "core/json.h"
#include "decode/generate.h"

namespace atlas::bench {

struct BenchOptions {
  std::string model_dir;
  std::string backend = "cuda";
  int device = 0;  // CUDA device index
  std::vector<std::string> workloads;  // empty = all
  std::vector<std::string> modes;      // "batch-invariant" | "fast"; empty = both (cuda), invariant (cpu)
  std::string reference_path;          // bench_transformers.py output, optional
  std::string command;                 // the command line, recorded
  uint64_t seed = 0;
  // Scale knobs (defaults = the workloads; smaller values for smoke tests, recorded).
  int64_t grid_prompts = 128, grid_new_tokens = 512, prompt_min = 200, prompt_max = 300;
  int64_t decode_prompt = 256, decode_steps = 256;
  // decode-b1's steps pushed ahead of the one read (as atlas generate: GenerateOptions::
  // decode_ahead); 0: one forward() call per step, the loop of sessions 1-23.
  int64_t decode_ahead = decode::GenerateOptions{}.decode_ahead;
  int64_t mem_rows = 128, mem_prefill = 1000, mem_steps = 24;
  bool progress = false;
  // Timed workloads (grid, traced prefill, batch-1 decode) run this many times on the loaded
  // model; the record's figure is the median, detail.runs keeps every run's figure, and the
  // runs' fingerprints (tokens / stage hashes) must agree (detail.fingerprint_identical_across_runs).
  int repeat = 1;
  // Hook edits (`atlas bench --intervene`, model/intervene.h specs) for the three timed
  // workloads: each then runs with the edits (the record's figure) and without them, as many
  // times, in the same process (detail.unedited_*, detail.edit_cost = edited / unedited time).
  std::vector<std::string> interventions;
};

struct Record {
  std::string workload, mode, unit, gpu, commit, date, command;
  double atlas = 0;
  std::optional<double> reference;  // transformers (the --reference file), where it has the workload
  ojson reference_source;           // the --reference file: path, sha256, its device and date; null if none
  std::optional<double> bound;      // bandwidth bound where one applies (same unit)
  ojson detail;                     // workload facts (tokens, shapes, timings of parts)
  // Every ATLAS_* variable set in the bench's environment (name -> value; ATLAS_GIT_COMMIT is in
  // `commit`): the A/B switches of docs/cuda.md a record was measured under; and
  // CUDA_DEVICE_MAX_CONNECTIONS where set (a CUDA build sets 32 where the caller did not).
  ojson environment = ojson::object();
  ojson interventions;  // what --intervene ran (Interventions::to_json); null: none
};
// The ATLAS_* variables of this process's environment but ATLAS_GIT_COMMIT, and
// CUDA_DEVICE_MAX_CONNECTIONS, by name.
ojson atlas_environment();

// The grid's prompts: n rows of lengths in [min, max], ids in [16, vocab) (deterministic).
std::vector<std::vector<int32_t>> bench_prompts(uint64_t seed, int64_t n, int64_t min_len, int64_t max_len,
                                                int64_t vocab);

// Every prompt the workloads run: the grid's (also the prefill trace's), the batch-1 decode
// prompt and the memory workload's rows. One definition serves run_bench and --save-prompts.
struct BenchPrompts {
  std::vector<std::vector<int32_t>> grid;
  std::vector<int32_t> decode;
  std::vector<std::vector<int32_t>> mem;
};
BenchPrompts make_prompts(const BenchOptions& o, int64_t vocab);
// What --save-prompts writes for tools/reference/bench_transformers.py.
ojson prompts_json(const BenchOptions& o, const BenchPrompts& p);

const std::vector<std::string>& workload_names();
std::vector<Record> run_bench(const BenchOptions& opts);
ojson to_json(const std::vector<Record>& records);

}  // namespace atlas::bench
