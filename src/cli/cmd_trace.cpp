// atlas trace: one instrumented forward pass of one sequence; dumps hidden stages, router
// decisions, MLA latents and logits (safetensors) and/or a JSON summary with hashes.
#include <cstdio>

#include "cli/args.h"
#include "cli/command.h"
#include "core/file.h"
#include "core/provenance.h"
#include "core/sha256.h"
#include "io/checkpoint.h"
#include "model/loader.h"
#include "model/trace.h"

namespace atlas::cli {
namespace {

struct TraceArgs {
  std::string backend = "cpu", model, ids, text, compute = "f32", layers, dump, json_out, manifest;
  int threads = 0;
};

void run_trace(const TraceArgs& a) {
  RuntimeClock clock;
  set_threads(a.threads);
  const Compute compute = parse_compute(a.compute);
  const ModelConfig cfg0 = ModelConfig::load(a.model + "/config.json");
  const LayerRange range = LayerRange::parse(a.layers, cfg0);
  if (a.ids.empty() == a.text.empty()) fail("trace", {}, "give exactly one of --ids or --text");
  std::vector<int32_t> ids;
  if (!a.ids.empty()) ids = parse_id_list("--ids", a.ids);
  std::optional<Tokenizer> tok;
  if (!a.text.empty()) {
    tok = tokenizer_if_present(a.model);
    if (!tok) fail(a.model + "/tokenizer.json", {}, "--text needs a tokenizer in the model directory (or pass --ids)");
    // As transformers' tokenizer(text) does: special tokens added per the tokenizer's config
    // (DeepSeek: BOS first); special-token strings in the text are parsed as tokens.
    ids = tok->encode_ids(a.text, {.add_special_tokens = true});
    if (ids.empty()) fail("--text", {}, "the text encodes to no tokens");
  }
  for (int32_t id : ids)
    if (id >= cfg0.vocab_size)
      fail("--ids", {}, "token id " + std::to_string(id) + " is outside the vocabulary (size " +
                            std::to_string(cfg0.vocab_size) + ")");
  if (int64_t(ids.size()) > cfg0.max_position_embeddings)
    fail("--ids", {}, std::to_string(ids.size()) + " tokens exceed max_position_embeddings " +
                          std::to_string(cfg0.max_position_embeddings));

  Checkpoint ck = Checkpoint::open(a.model, {.layers = range, .manifest_path = a.manifest});
  auto model_ptr = load_model(ck, {.backend = a.backend, .compute = compute});
  const Model& model = *model_ptr;
  TraceRecorder rec(model);
  Hooks hooks;
  rec.attach(hooks);
  const int64_t T = int64_t(ids.size());
  std::vector<int32_t> pos(static_cast<size_t>(T));
  for (int64_t t = 0; t < T; ++t) pos[t] = int32_t(t);
  std::vector<uint8_t> mask(static_cast<size_t>(T), 1);
  model.forward({.batch = 1, .tokens = T, .ids = ids, .positions = pos, .mask = mask}, &hooks);

  ojson summary = rec.summary();
  ojson art;
  art["kind"] = "atlas.trace";
  art["format_version"] = 1;
  art["provenance"] = build_provenance();
  art["model"] = {{"config_sha256", sha256_file(a.model + "/config.json")},
                  {"config", ck.config().to_json()},
                  {"layers", std::to_string(range.first) + "-" + std::to_string(range.last)}};
  art["compute"] = compute_name(compute);
  art["input"] = {{"ids", ids}, {"tokens", T}, {"prompt_sha256", ids_sha256(ids)}};
  if (!a.text.empty()) art["input"]["text"] = a.text;
  art["stages"] = summary["stages"];
  art["gates"] = summary["gates"];
  if (summary.contains("logits")) art["logits"] = summary["logits"];
  art["runtime"] = runtime_section(clock);

  if (!a.dump.empty()) {
    write_safetensors(a.dump, rec.tensors(),
                      {{"format", "atlas.trace"}, {"compute", compute_name(compute)}, {"prompt_sha256", ids_sha256(ids)}});
  }
  if (!a.json_out.empty()) write_file_atomic(a.json_out, art.dump(2) + "\n");
  std::printf("trace: %lld tokens, %zu hidden stages, %zu gates, compute %s\n", (long long)T,
              summary["stages"].size(), summary["gates"].size(), compute_name(compute).c_str());
  if (!summary["stages"].empty()) {
    const auto& last = summary["stages"].back();
    std::printf("last stage %s: l2 %.6g  sha256 %s\n", last["name"].get<std::string>().c_str(),
                last["l2"].get<double>(), last["sha256"].get<std::string>().c_str());
  }
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
          app.add_option("--backend", a.backend, "cpu or cuda")->capture_default_str();
          app.add_option("--compute", a.compute, "f32 (reference) or bf16 (official rounding points)")
              ->capture_default_str();
          app.add_option("--layers", a.layers, "Run layers A-B only (A must be 0), e.g. 0-6");
          app.add_option("--dump", a.dump, "Write the traced tensors to this safetensors file");
          app.add_option("--json", a.json_out, "Write the trace summary (stats and SHA-256 per stage/gate)");
          app.add_option("--manifest", a.manifest, "Verify checkpoint files against this SHA-256 manifest");
          app.add_option("--threads", a.threads, "CPU threads (0 = all); results do not depend on it");
          app.callback([] { run_trace(a); });
        },
}};

}  // namespace
}  // namespace atlas::cli
