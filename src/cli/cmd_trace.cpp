// atlas trace: one instrumented forward pass of one sequence; dumps hidden stages, router
// decisions, MLA latents and logits (safetensors) and/or a JSON summary with hashes.
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <set>

#include "cli/args.h"
#include "cli/command.h"
#include "core/file.h"
#include "core/json.h"
#include "core/provenance.h"
#include "core/sha256.h"
#include "io/checkpoint.h"
#include "model/intervene.h"
#include "model/loader.h"
#include "model/trace.h"

namespace atlas::cli {
namespace {

struct TraceArgs {
  std::string backend = "cpu", model, ids, text, input, out_dir, compute = "f32", layers, dump, json_out, manifest,
      attention = "expanded";
  std::vector<std::string> intervene, record;
  int device = 0;
  int threads = 0;
};

// Checks one sequence against the model's vocabulary and context.
void check_ids(const std::vector<int32_t>& ids, const ModelConfig& cfg, const std::string& where) {
  if (ids.empty()) fail(where, {}, "no token ids");
  for (int32_t id : ids)
    if (id < 0 || id >= cfg.vocab_size)
      fail(where, {}, "token id " + std::to_string(id) + " is outside the vocabulary (size " +
                          std::to_string(cfg.vocab_size) + ")");
  if (int64_t(ids.size()) > cfg.max_position_embeddings)
    fail(where, {}, std::to_string(ids.size()) + " tokens exceed max_position_embeddings " +
                        std::to_string(cfg.max_position_embeddings));
}

struct Sequence {
  std::string id;  // --input only
  std::vector<int32_t> ids;
  std::string text;
};

// One forward of one sequence; writes its dump and/or JSON summary.
void trace_one(const Model& model, const Checkpoint& ck, const TraceArgs& a, Compute compute, const LayerRange& range,
               Interventions& edits, const Sequence& seq, const std::string& dump, const std::string& json_out,
               bool print) {
  RuntimeClock clock;
  const std::vector<int32_t>& ids = seq.ids;
  TraceRecorder rec(model, {.record = a.record});
  Hooks hooks;
  edits.attach(hooks);  // tensor observers: the recorders (readers) see the edited values
  rec.attach(hooks);
  const int64_t T = int64_t(ids.size());
  std::vector<int32_t> pos(static_cast<size_t>(T));
  for (int64_t t = 0; t < T; ++t) pos[t] = int32_t(t);
  std::vector<uint8_t> mask(static_cast<size_t>(T), 1);
  const AttentionForm form = a.attention == "absorbed" ? AttentionForm::Absorbed : AttentionForm::Expanded;
  const ForwardInput in{.batch = 1, .tokens = T, .ids = ids, .positions = pos, .mask = mask, .attention = form};
  edits.begin_pass(in);
  model.forward(in, &hooks);
  edits.check_fired();

  ojson summary = rec.summary();
  ojson art;
  art["kind"] = "atlas.trace";
  art["format_version"] = 1;
  art["provenance"] = build_provenance();
  art["provenance"]["device"] = device_provenance(a.backend, a.device);  // reported, never compared
  art["model"] = {{"config_sha256", sha256_file(a.model + "/config.json")},
                  {"config", ck.config().to_json()},
                  {"layers", std::to_string(range.first) + "-" + std::to_string(range.last)},
                  // The pinned weight files (verified at load) stand for the weights.
                  {"manifest_sha256", a.manifest.empty() ? ojson(nullptr) : ojson(sha256_file(a.manifest))}};
  art["backend"] = a.backend;
  art["compute"] = compute_name(compute);
  art["attention"] = a.backend == "cuda" ? "absorbed" : a.attention;  // the CUDA backend always absorbs
  art["input"] = {{"ids", ids}, {"tokens", T}, {"prompt_sha256", ids_sha256(ids)}};
  if (!seq.id.empty()) art["input"]["id"] = seq.id;
  if (!seq.text.empty()) art["input"]["text"] = seq.text;
  // Edits change what every later field means: recorded beside the input, absent when none.
  if (!edits.empty()) art["interventions"] = edits.to_json();
  art["stages"] = summary["stages"];
  art["gates"] = summary["gates"];
  if (summary.contains("logits")) art["logits"] = summary["logits"];
  if (summary.contains("recorded")) art["recorded"] = summary["recorded"];
  art["runtime"] = runtime_section(clock);

  if (!dump.empty()) {
    std::map<std::string, std::string> meta{
        {"format", "atlas.trace"}, {"compute", compute_name(compute)}, {"prompt_sha256", ids_sha256(ids)}};
    if (!edits.empty()) meta["interventions"] = edits.to_json().dump();
    write_safetensors(dump, rec.tensors(), meta);
  }
  if (!json_out.empty()) write_file_atomic(json_out, art.dump(2) + "\n");
  if (!print) return;
  std::printf("trace: %lld tokens, %zu hidden stages, %zu gates, compute %s", (long long)T, summary["stages"].size(),
              summary["gates"].size(), compute_name(compute).c_str());
  if (!edits.empty()) std::printf(", %zu interventions", edits.list().size());
  std::printf("\n");
  if (!summary["stages"].empty()) {
    const auto& last = summary["stages"].back();
    std::printf("last stage %s: l2 %.6g  sha256 %s\n", last["name"].get<std::string>().c_str(),
                last["l2"].get<double>(), last["sha256"].get<std::string>().c_str());
  }
}

void run_trace(const TraceArgs& a) {
  set_threads(a.threads);
  const Compute compute = parse_compute(a.compute);
  const ModelConfig cfg0 = ModelConfig::load(a.model + "/config.json");
  const LayerRange range = LayerRange::parse(a.layers, cfg0);
  if (a.attention != "expanded" && a.attention != "absorbed")
    fail("--attention", {}, "unknown value \"" + a.attention + "\" (expected expanded or absorbed)");
  if (!a.dump.empty()) check_output_file("--dump", a.dump);
  if (!a.json_out.empty()) check_output_file("--json", a.json_out);
  const int given = int(!a.ids.empty()) + int(!a.text.empty()) + int(!a.input.empty());
  if (given != 1) fail("trace", {}, "give exactly one of --ids, --text or --input");
  std::vector<Sequence> seqs;
  if (!a.input.empty()) {
    if (a.out_dir.empty()) fail("--out-dir", {}, "--input needs --out-dir (one dump and summary per line)");
    if (!a.dump.empty() || !a.json_out.empty()) fail("--dump", {}, "with --input, outputs go to --out-dir");
    std::ifstream f(a.input);
    if (!f) fail(a.input, {}, "cannot open");
    std::string line;
    std::set<std::string> seen;
    for (int n = 1; std::getline(f, line); ++n) {
      if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
      const std::string where = a.input + ":" + std::to_string(n);
      const json j = parse_json(line, where);
      JsonReader r(j, where);
      Sequence s{.id = r.get<std::string>("id"), .ids = ids_from_json(r.raw("ids"), where), .text = {}};
      if (s.id.empty() || s.id.find_first_of("/\\") != std::string::npos || s.id[0] == '.')
        fail(where, "id", "must be a non-empty file name (no '/', not starting with '.')");
      if (!seen.insert(s.id).second) fail(where, "id", "duplicate id \"" + s.id + "\"");
      check_ids(s.ids, cfg0, where);
      seqs.push_back(std::move(s));
    }
    if (seqs.empty()) fail(a.input, {}, "no sequences");
  } else {
    Sequence s;
    if (!a.ids.empty()) s.ids = parse_id_list("--ids", a.ids);
    if (!a.text.empty()) {
      auto tok = tokenizer_if_present(a.model);
      if (!tok) fail(a.model + "/tokenizer.json", {}, "--text needs a tokenizer in the model directory (or pass --ids)");
      // As transformers' tokenizer(text) does: special tokens added per the tokenizer's config
      // (DeepSeek: BOS first); special-token strings in the text are parsed as tokens.
      s.ids = tok->encode_ids(a.text, {.add_special_tokens = true});
      if (s.ids.empty()) fail("--text", {}, "the text encodes to no tokens");
      s.text = a.text;
    }
    check_ids(s.ids, cfg0, "--ids");
    seqs.push_back(std::move(s));
  }
  // Edits and recorded hooks are checked against the model and every sequence before the load.
  Interventions edits(a.intervene, cfg0, range, range.is_full(cfg0));
  for (const Sequence& s : seqs) edits.check_tokens(int64_t(s.ids.size()), s.id.empty() ? "--ids" : a.input + ": id " + s.id);
  check_record_patterns(a.record, cfg0, range);

  Checkpoint ck = Checkpoint::open(a.model, {.layers = range, .manifest_path = a.manifest});
  auto model_ptr = load_model(ck, {.backend = a.backend, .compute = compute, .device = a.device});
  if (a.input.empty()) {
    trace_one(*model_ptr, ck, a, compute, range, edits, seqs[0], a.dump, a.json_out, true);
    return;
  }
  // Every output name checked before any work (a missing --out-dir, made below, holds none).
  if (std::error_code ec; std::filesystem::is_directory(a.out_dir, ec))
    for (const Sequence& s : seqs)
      for (const char* ext : {".safetensors", ".json"}) check_output_file("--out-dir", a.out_dir + "/" + s.id + ext);
  std::filesystem::create_directories(a.out_dir);
  for (size_t i = 0; i < seqs.size(); ++i) {
    const std::string base = a.out_dir + "/" + seqs[i].id;
    // Each sequence's files are written whole (temp name, rename), so a failure at run time
    // (out of device memory, say) leaves the sequences before it complete: say which failed.
    try {
      trace_one(*model_ptr, ck, a, compute, range, edits, seqs[i], base + ".safetensors", base + ".json", false);
    } catch (const Error& e) {
      // Not half a pair: a dump written before its summary failed goes too.
      for (const char* ext : {".safetensors", ".json"})
        if (std::error_code ec; std::filesystem::is_regular_file(base + ext, ec)) std::filesystem::remove(base + ext, ec);
      fail(a.input, "id " + seqs[i].id,
           std::string(e.what()) + " (sequences before it: " + std::to_string(i) + ", complete in " + a.out_dir + ")");
    }
    if (progress_enabled()) std::fprintf(stderr, "\rtrace: %zu/%zu sequences", i + 1, seqs.size());
  }
  if (progress_enabled()) std::fprintf(stderr, "\n");
  std::printf("trace: %zu sequences -> %s\n", seqs.size(), a.out_dir.c_str());
}

Registrar reg{{
    .name = "trace",
    .help = "Run one instrumented forward pass and record hidden states, routes, latents, logits",
    .setup =
        [](CLI::App& app) {
          static TraceArgs a;
          app.add_option("--model", a.model, "Model directory (config.json + safetensors)")->required();
          app.add_option("--ids", a.ids, "Comma-separated token ids");
          app.add_option("--text", a.text, "Text to tokenize (needs tokenizer.json in the model directory)");
          app.add_option("--input", a.input, "JSONL of {\"id\", \"ids\"}: one trace per line, model loaded once");
          app.add_option("--out-dir", a.out_dir, "With --input: writes ID.safetensors and ID.json per line");
          app.add_option("--backend", a.backend, "cpu or cuda")->capture_default_str();
          app.add_option("--device", a.device, "CUDA device index")->capture_default_str();
          app.add_option("--compute", a.compute, "f32 (reference) or bf16 (official rounding points)")
              ->capture_default_str();
          app.add_option("--attention", a.attention,
                         "cpu: expanded (the official form) or absorbed (W_UK/W_UV folded, as decode runs); "
                         "cuda always absorbs")
              ->capture_default_str();
          app.add_option("--layers", a.layers, "Run layers A-B only (A must be 0), e.g. 0-6");
          app.add_option("--dump", a.dump, "Write the traced tensors to this safetensors file");
          app.add_option("--json", a.json_out, "Write the trace summary (stats and SHA-256 per stage/gate)");
          app.add_option("--intervene", a.intervene,
                         "Edit a hook during the pass (repeatable, applied in order): TARGET[@TOKENS]=ACTION, "
                         "e.g. blocks.3.hook_resid_post@5=patch:clean.safetensors, blocks.2.moe.experts.7=route-out, "
                         "blocks.3.hook_resid_post=add:direction.safetensors*4 "
                         "(docs/trace.md, Interventions)");
          app.add_option("--record", a.record,
                         "Also dump these hooks under their own names (repeatable; exact names or globs, e.g. "
                         "'blocks.*.attn.hook_out')");
          app.add_option("--manifest", a.manifest, "Verify checkpoint files against this SHA-256 manifest");
          app.add_option("--threads", a.threads, "CPU threads (0 = all); results do not depend on it");
          app.callback([] { run_trace(a); });
        },
}};

}  // namespace
}  // namespace atlas::cli
