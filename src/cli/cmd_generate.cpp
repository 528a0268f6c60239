// atlas generate: batched greedy / seeded / CRN decoding over prompts from a JSONL file.
//
// Input lines: {"id": ..., "ids": [...]} or {"id": ..., "messages": [...]} (rendered with the
// chat template and add_generation_prompt), optionally "seed" (seeded sampling: this row's
// Philox seed) and "crn_key" (CRN: the row key; default: the id).
// Output lines, in input order: {"id", "prompt_sha256", "ids", "text", "stop", "n_new",
// "rng_state_sha256"} ("text" only when the model directory has a tokenizer). A sidecar
// OUT.meta.json records provenance, parameters and a separate runtime section.
#include <cstdio>
#include <fstream>
#include <set>

#include "cli/args.h"
#include "cli/command.h"
#include "core/file.h"
#include "core/provenance.h"
#include "core/sha256.h"
#include "decode/generate.h"
#include "io/checkpoint.h"
#include "model/intervene.h"
#include "model/loader.h"
#include "text/chat.h"

namespace atlas::cli {
namespace {

struct GenerateArgs {
  std::string backend = "cpu", model, prompts, out, compute = "f32", decode_attention = "absorbed", manifest;
  int64_t max_new_tokens = 0, batch = 8, top_k = 0;
  int64_t decode_ahead = decode::GenerateOptions{}.decode_ahead;
  bool greedy = false, fast = false;
  int device = 0;
  std::optional<double> temperature, top_p;
  std::optional<uint64_t> seed, crn_tape;
  std::vector<std::string> stop, intervene;
  int threads = 0;
};

// The row's Philox stream: the first 4 bytes of SHA-256(id), so a row draws the same numbers
// whatever its position in the file or batch (subset reruns reproduce).
uint32_t stream_of(const std::string& id) {
  auto d = Sha256().update(id).digest();
  return uint32_t(d[0]) | uint32_t(d[1]) << 8 | uint32_t(d[2]) << 16 | uint32_t(d[3]) << 24;
}

std::string id_string(const json& v, const std::string& where) {
  if (v.is_string()) return v.get<std::string>();
  if (v.is_number_integer()) return std::to_string(v.get<int64_t>());
  fail(where, "id", "expected a string or integer");
}

void run_generate(const GenerateArgs& a) {
  RuntimeClock clock;
  set_threads(a.threads);
  if (a.max_new_tokens <= 0) fail("--max-new-tokens", {}, "must be positive, got " + std::to_string(a.max_new_tokens));
  if (a.batch <= 0) fail("--batch", {}, "must be positive");
  // Both outputs before any work: the rows are committed first, so a sidecar that cannot be
  // written would otherwise leave OUT behind without it.
  check_output_file("--out", a.out);
  check_output_file("--out", a.out + ".meta.json");
  // Sampling contract from the flags.
  decode::SamplingParams base;
  if (a.crn_tape) {
    if (a.greedy || a.seed) fail("--crn-tape", {}, "cannot be combined with --greedy or --seed");
    base.mode = decode::SamplingMode::Crn;
    base.seed = *a.crn_tape;
  } else if (a.temperature || a.top_p || a.top_k || a.seed) {
    if (a.greedy) fail("--greedy", {}, "cannot be combined with --temperature/--top-p/--top-k/--seed");
    if (!a.seed) fail("--seed", {}, "sampling needs a seed (or --crn-tape)");
    base.mode = decode::SamplingMode::Seeded;
    base.seed = *a.seed;
  }
  if (base.mode != decode::SamplingMode::Greedy) {
    base.temperature = a.temperature.value_or(1.0);
    base.top_p = a.top_p.value_or(1.0);
    base.top_k = a.top_k;
  }
  const Compute compute = parse_compute(a.compute);
  AttentionForm decode_form;
  if (a.decode_attention == "absorbed")
    decode_form = AttentionForm::Absorbed;
  else if (a.decode_attention == "expanded")
    decode_form = AttentionForm::Expanded;
  else
    fail("--decode-attention", {}, "expected absorbed or expanded");

  Checkpoint ck = Checkpoint::open(a.model, {.manifest_path = a.manifest});
  const ModelConfig& cfg = ck.config();
  std::optional<Tokenizer> tok = tokenizer_if_present(a.model);
  if (!a.stop.empty() && !tok) fail("--stop", {}, "stop strings need a tokenizer in the model directory");

  // Prompts.
  std::ifstream in(a.prompts);
  if (!in) fail(a.prompts, {}, "cannot open");
  std::vector<decode::PromptRow> rows;
  std::set<std::string> seen;  // ids key the output rows (atlas compare) and the sampling streams
  std::optional<std::pair<ChatTemplate, ChatOptions>> chat;  // for "messages" rows
  std::string line;
  for (int64_t lineno = 1; std::getline(in, line); ++lineno) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    const std::string where = a.prompts + ":" + std::to_string(lineno);
    json j = parse_json(line, where);
    if (!j.is_object()) fail(where, {}, "expected a JSON object");
    JsonReader r(j, where);
    decode::PromptRow row{.id = id_string(r.raw("id"), where), .ids = {}, .sampling = base};
    if (!seen.insert(row.id).second) fail(where, "id", "duplicate id \"" + row.id + "\"");
    if (r.has("ids")) {
      row.ids = ids_from_json(r.raw("ids"), where);
    } else if (r.has("messages")) {
      if (!tok) fail(where, "messages", "rendering messages needs tokenizer files in the model directory");
      // Loaded once, the way atlas render and probe freeze load it (text/chat.h).
      if (!chat) {
        ChatTemplateSource src = load_chat_template(a.model);
        chat.emplace(ChatTemplate(src.text, src.origin), src.vars);
        chat->second.add_generation_prompt = true;
      }
      // ojson keeps the keys in file order, as Python dicts do (templates may print tojson).
      const ojson messages = ojson::parse(line)["messages"];
      std::string text = chat->first.apply(messages, chat->second);
      // The template writes BOS itself: encode without adding special tokens again.
      row.ids = tok->encode_ids(text, {.add_special_tokens = false});
    } else {
      fail(where, {}, "needs \"ids\" or \"messages\"");
    }
    if (row.ids.empty()) fail(where, "ids", "empty prompt");
    if (base.mode == decode::SamplingMode::Seeded) {
      row.sampling.seed = r.has_value("seed") ? r.get<uint64_t>("seed") : *a.seed;
      row.sampling.stream = stream_of(row.id);
    } else if (base.mode == decode::SamplingMode::Crn) {
      row.sampling.crn_row_key = r.has_value("crn_key") ? r.get<std::string>("crn_key") : row.id;
    }
    rows.push_back(std::move(row));
  }
  if (rows.empty()) fail(a.prompts, {}, "no prompts");

  if (a.fast && a.backend != "cuda") fail("--fast", {}, "exists on the cuda backend only");
  // Hook edits, checked against the model before the load (model/intervene.h).
  Interventions edits(a.intervene, cfg, LayerRange::all(cfg), true);
  edits.check_for_generation();
  auto model_ptr =
      load_model(ck, {.backend = a.backend, .compute = compute, .device = a.device, .batch_invariant = !a.fast});
  const Model& model = *model_ptr;
  std::vector<int64_t> eos;
  if (cfg.eos_token_id) eos.push_back(*cfg.eos_token_id);
  decode::GenerateOptions opts{.max_new_tokens = a.max_new_tokens,
                               .batch = a.batch,
                               .eos_ids = eos,
                               .stop_strings = a.stop,
                               .pad_id = int32_t(cfg.eos_token_id.value_or(0)),
                               .decode_attention = decode_form,
                               .progress = progress_enabled(),
                               .decode_ahead = a.decode_ahead,
                               .edits = edits.empty() ? nullptr : &edits};
  if (tok)
    opts.detokenize = [&](std::span<const int32_t> ids) {
      // Generated ids the tokenizer lacks (the model's vocabulary may be larger) are left out
      // of the text, as transformers' decode does; the ids themselves are recorded exactly.
      return tok->decode(ids, {.skip_special_tokens = true, .skip_unknown_ids = true});
    };
  auto results = decode::generate(model, rows, opts);

  AtomicFile out(a.out);
  int64_t n_eos = 0, n_len = 0, n_stop = 0;
  for (const auto& g : results) {
    ojson j;
    j["id"] = g.id;
    j["prompt_sha256"] = g.prompt_sha256;
    j["ids"] = g.ids;
    if (g.text) j["text"] = *g.text;
    j["stop"] = std::string(decode::stop_reason_name(g.stop));
    j["n_new"] = g.n_new;
    j["rng_state_sha256"] = g.rng_state_sha256.empty() ? ojson(nullptr) : ojson(g.rng_state_sha256);
    out.write(j.dump() + "\n");
    n_eos += g.stop == decode::StopReason::Eos;
    n_len += g.stop == decode::StopReason::Length;
    n_stop += g.stop == decode::StopReason::StopString;
  }
  ojson meta;
  meta["kind"] = "atlas.generate";
  meta["format_version"] = 1;
  meta["provenance"] = build_provenance();
  meta["provenance"]["device"] = device_provenance(a.backend, a.device);  // reported, never compared
  meta["model"] = {{"config_sha256", sha256_file(a.model + "/config.json")}, {"config", cfg.to_json()},
                   // The pinned weight files (verified at load) stand for the weights.
                   {"manifest_sha256", a.manifest.empty() ? ojson(nullptr) : ojson(sha256_file(a.manifest))}};
  meta["backend"] = a.backend;
  meta["prompts_sha256"] = sha256_file(a.prompts);
  meta["compute"] = compute_name(compute);
  meta["batch_invariant"] = !a.fast;
  meta["decoding"] = {{"mode", std::string(decode::mode_name(base.mode))},
                      {"temperature", base.mode == decode::SamplingMode::Greedy ? ojson(nullptr) : ojson(base.temperature)},
                      {"top_p", base.mode == decode::SamplingMode::Greedy ? ojson(nullptr) : ojson(base.top_p)},
                      {"top_k", base.mode == decode::SamplingMode::Greedy ? ojson(nullptr) : ojson(base.top_k)},
                      {"seed", a.seed ? ojson(*a.seed) : ojson(nullptr)},
                      {"crn_tape", a.crn_tape ? ojson(*a.crn_tape) : ojson(nullptr)},
                      {"max_new_tokens", a.max_new_tokens},
                      {"eos_ids", eos},
                      {"stop_strings", a.stop},
                      {"decode_attention", a.decode_attention}};
  // Edits change what the rows mean: recorded with the decoding, absent when none.
  if (!edits.empty()) meta["interventions"] = edits.to_json();
  meta["rows"] = int64_t(results.size());
  meta["stops"] = {{"eos", n_eos}, {"length", n_len}, {"stop_string", n_stop}};
  meta["runtime"] = runtime_section(clock);
  meta["runtime"]["batch"] = a.batch;
  meta["runtime"]["decode_ahead"] = a.decode_ahead;
  const std::string meta_text = meta.dump(2) + "\n";
  out.commit();
  write_file_atomic(a.out + ".meta.json", meta_text);
  std::fprintf(stderr, "generate: %zu rows (eos %lld, length %lld, stop_string %lld) -> %s\n", results.size(),
               (long long)n_eos, (long long)n_len, (long long)n_stop, a.out.c_str());
}

Registrar reg{{
    .name = "generate",
    .help = "Batched greedy / sampled / common-random-number generation over a JSONL prompt file",
    .setup =
        [](CLI::App& app) {
          static GenerateArgs a;
          app.add_option("--model", a.model, "Model directory")->required();
          app.add_option("--prompts", a.prompts, "JSONL: {\"id\", \"ids\"} or {\"id\", \"messages\"} per line")
              ->required();
          app.add_option("--out", a.out, "Output JSONL (one line per prompt, input order)")->required();
          app.add_option("--max-new-tokens", a.max_new_tokens, "Length cap per row")->required();
          app.add_flag("--greedy", a.greedy, "Greedy decoding (the default)");
          app.add_option("--temperature", a.temperature, "Sampling temperature");
          app.add_option("--top-p", a.top_p, "Nucleus threshold (1 = off)");
          app.add_option("--top-k", a.top_k, "Top-k (0 = off)");
          app.add_option("--seed", a.seed, "Seeded sampling: Philox seed (rows may override with \"seed\")");
          app.add_option("--crn-tape", a.crn_tape, "Common-random-number tape seed (rows keyed by crn_key or id)");
          app.add_option("--stop", a.stop, "Stop string (repeatable; needs a tokenizer)");
          app.add_option("--batch", a.batch, "Rows per batch (results do not depend on it)")->capture_default_str();
          app.add_option("--decode-ahead", a.decode_ahead,
                         "Decode steps pushed ahead of the one read where no row needs its logits on the host "
                         "(results do not depend on it; 0: one forward call per step)")
              ->check(CLI::Range(int64_t(0), DecodeRun::kMaxPending - 1))
              ->capture_default_str();
          app.add_option("--backend", a.backend, "cpu or cuda")->capture_default_str();
          app.add_option("--device", a.device, "CUDA device index")->capture_default_str();
          app.add_option("--compute", a.compute, "f32 or bf16")->capture_default_str();
          app.add_option("--manifest", a.manifest, "Verify checkpoint files against this SHA-256 manifest (recorded)");
          app.add_flag("--fast", a.fast,
                       "cuda: cuBLASLt dense GEMMs (faster; a row's bits may then depend on its batch)");
          app.add_option("--decode-attention", a.decode_attention, "absorbed or expanded")->capture_default_str();
          app.add_option("--intervene", a.intervene,
                         "Edit a hook in every forward pass (repeatable): TARGET[@POSITIONS]=ACTION, e.g. "
                         "blocks.5.moe.experts.12=route-out (docs/trace.md, Interventions)");
          app.add_option("--threads", a.threads, "CPU threads (0 = all)");
          app.callback([] { run_generate(a); });
        },
}};

}  // namespace
}  // namespace atlas::cli
