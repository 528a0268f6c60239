// Batched generation over the MLA latent KV cache.
//
// Rows are taken in input order in batches of `batch`, left-padded to the batch's longest
// prompt (positions count from each row's first real token, as transformers' generate does),
// prefilled in one call, then decoded one token per step. Every row has its own sampler and
// stop checker, so rows finish independently; a finished row is fed the pad id (or, in a decode
// run, its own tokens) until the batch ends, and nothing it computes is read. Because the forward pass is row-independent,
// a row's tokens and logits are the same alone or in any batch (tests/decode).
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "decode/sampler.h"
#include "decode/stop.h"
#include "model/intervene.h"
#include "model/model.h"

namespace atlas::decode {

struct PromptRow {
  std::string id;
  std::vector<int32_t> ids;
  SamplingParams sampling;  // per row: mode, temperature, top_p, top_k, seed/stream or CRN row key
};

struct GenerateOptions {
  int64_t max_new_tokens = 0;
  int64_t batch = 8;
  std::vector<int64_t> eos_ids;
  std::vector<std::string> stop_strings;
  int32_t pad_id = 0;
  AttentionForm prefill_attention = AttentionForm::Expanded;
  AttentionForm decode_attention = AttentionForm::Absorbed;
  // Decodes generated ids to text; empty when the model directory has no tokenizer.
  std::function<std::string(std::span<const int32_t>)> detokenize;
  // Called once per finished row, in input order (for streaming JSONL output).
  std::function<void(size_t index, const struct GeneratedRow&)> on_row;
  // Observes each row's logits at every step (index, step, logits[V]); for tests and audits.
  std::function<void(size_t index, int64_t step, std::span<const float> logits)> on_logits;
  bool progress = false;  // one stderr line per batch step with tokens/s and ETA
  // Where no live row needs its logits on the host (every live row greedy or drawn on the
  // device, no on_logits), the decode steps run as a DecodeRun (Model::start_decode) with this
  // many steps pushed beyond the one whose tokens are read next: the CUDA backend then never
  // waits for the host between steps. The tokens are the same for every value; 0 = one forward
  // call per step. At a batch's end the steps pushed ahead run unread (at most this many).
  int64_t decode_ahead = 1;
  // Hook edits run in every forward pass (the prompts', then each step's), TOKENS naming
  // positions in a row's prompt-then-generated sequence (model/intervene.h); with edits every
  // step is its own forward call (no DecodeRun). Null: none.
  atlas::Interventions* edits = nullptr;
  // Edits of single rows (a probe condition's): [rows.size()] or empty, null where a row has
  // none; each runs on its own row only, beside `edits`. Sibling rows of patch:@ edits
  // (Interventions::set_sibling_rows) index the batch, so such callers pass batch >= rows.size()
  // (checked).
  std::vector<atlas::Interventions*> row_edits;
};

struct GeneratedRow {
  std::string id;
  std::string prompt_sha256;        // ids_sha256 of the prompt ids
  std::vector<int32_t> ids;         // generated ids, including the EOS that stopped the row
  std::optional<std::string> text;  // decoded generated ids (special tokens skipped), if a tokenizer exists
  StopReason stop = StopReason::None;
  int64_t n_new = 0;                // == ids.size()
  std::string rng_state_sha256;     // before the row's first draw; empty for greedy
};

std::vector<GeneratedRow> generate(const Model& model, std::span<const PromptRow> rows,
                                   const GenerateOptions& opts);

}  // namespace atlas::decode
