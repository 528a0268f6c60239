// Interventions: edits written into hook points during a forward pass, parsed from short specs
// (`atlas trace --intervene`), checked against the model before anything runs, and recorded
// in the artifact they produce.
//
//   SPEC    = TARGET [ "@" TOKENS ] "=" ACTION
//   TARGET  = a concrete hook name ("blocks.3.hook_resid_post", "embed"; `atlas hooks`)
//           | "blocks.L.moe.experts." E[,E...]         (routed experts of MoE layer L)
//   TOKENS  = N | A-B (inclusive), comma-separated; absent: every token
//   ACTION  on a hook:    zero | scale:F | patch:FILE | add:FILE[*F]
//           on experts:   zero        the experts are chosen as usual but contribute nothing
//                                     (their combine weights set to 0; the others unchanged)
//                         route-out   the experts cannot be chosen: their router logits are -inf
//                                     before the softmax and top-k, so each token's top-k comes
//                                     from the other experts and the weights are normalised over
//                                     those (the model's own routing, on either backend)
//
// patch:FILE copies the hook's values at the chosen tokens from a safetensors file: the tensor
// named as the hook, else the one `atlas trace --dump` writes for it (hidden.{s},
// router.{L}.*, mla.{L}.latent, logits), shaped [T', ...] with the hook's per-token shape,
// F32 (I32 for hook_topk_ids), at the same token positions. Activation patching: trace the
// clean input with --dump, then the edited input with --intervene 'HOOK@t=patch:clean.safetensors'.
// add:FILE[*F] adds F (default 1) times the file's tensor (found as for patch) to the hook's
// values at the chosen tokens, in double, rounded to F32 once: one vector of the hook's per-token
// shape for every token (a steering vector; in generation it needs no TOKENS and steers every
// pass), or [T', ...] rows by position as patch reads them.
// Route patching: patch both blocks.L.moe.hook_topk_ids and hook_topk_weights.
//
// Edits apply in the order given (two on one hook: the second sees the first's result); the
// trace's recorders see the edited values. Every edit must fire exactly once per forward pass
// (check_fired), so a spec that a backend skipped cannot pass silently.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/json.h"
#include "model/config.h"
#include "model/hooks.h"
#include "model/model.h"

namespace atlas {

class SafetensorsFile;

enum class InterventionAction { Zero, Scale, Patch, ExpertsZero, ExpertsRouteOut, PatchRow, Add };

struct Intervention {
  std::string spec;                // as given
  std::string hook;                // the hook it writes (experts: router logits or top-k weights)
  int64_t layer = -1;              // -1 for global hooks
  InterventionAction action = InterventionAction::Zero;
  std::vector<int64_t> tokens;     // ascending, unique; empty = every token
  double factor = 1;               // Scale, Add
  std::vector<int32_t> experts;    // Experts*: ascending, unique
  // Patch: the file as given, its SHA-256, the tensor read, and the tensor itself.
  std::string source_path, source_sha256, source_tensor;
  std::shared_ptr<const SafetensorsFile> source;
  bool source_per_position = true;  // [T', ...]: a row per position; Add may also give one [...] vector
  // PatchRow (probe protocols only, `patch:@CONDITION`): the values of the same source's cell of
  // that condition, its row in the same batch, at the same positions, as they stand in the pass.
  std::string source_condition;
};

// add:PAYLOAD = FILE[*F]: the file and the factor's text after the last '*' ("" without one).
std::pair<std::string, std::string> split_add_payload(std::string_view payload);

// TOKENS: "N" or "A-B" (inclusive) items, comma-separated, as ascending unique positions;
// errors are prefixed with `where`.
std::vector<int64_t> parse_token_list(std::string_view list, const std::string& where);

// The values each token of a [B, T, ...] hook holds (the dimensions after [B, T]), for this
// config; throws for hooks not laid out [B, T, ...] (attn.hook_pattern) and unknown names.
std::vector<int64_t> hook_token_shape(std::string_view hook, const ModelConfig& cfg);

// Every hook a forward pass over `layers` fires for this config, in firing order (the catalog's
// order within a layer): MoE hooks only on MoE layers, hook_shared_out only with shared
// experts, final_norm and logits only when the run reaches the last layer.
std::vector<std::string> fired_hook_names(const ModelConfig& cfg, const LayerRange& layers);

// The name `atlas trace --dump` gives a hook's tensor ("hidden.4" for blocks.3.hook_resid_post),
// or "" if the trace does not record that hook.
std::string trace_dump_name(std::string_view hook, const ModelConfig& cfg);

class Interventions {
 public:
  // Parses and checks every spec against the model (hook exists and fires for `layers`/`head`,
  // action fits the hook, patch sources open and match); errors name the spec ("--intervene
  // 'SPEC': ...").
  // `in_protocol`: a probe cell's edits, which may also patch from a sibling row.
  // `files_base`: the directory a relative patch:FILE / add:FILE path is relative to (a probe
  // manifest's, where freeze records them relative to it, so that a manifest moved with its files
  // still finds them); empty: the working directory. Errors and to_json() name the path so resolved.
  Interventions(const std::vector<std::string>& specs, const ModelConfig& cfg, const LayerRange& layers,
                bool has_head, bool in_protocol = false, const std::string& files_base = {});

  bool empty() const { return list_.empty(); }
  const std::vector<Intervention>& list() const { return list_; }

  // Before a forward pass over sequences of T tokens: every token index < T, every patch source
  // long enough (a patch of every token needs exactly T). `where` prefixes errors.
  void check_tokens(int64_t T, const std::string& where) const;
  // For `atlas generate`, where every forward pass (the prompt's, then each step's) runs the
  // edits and TOKENS are positions in a row's prompt-then-generated sequence: no edits of
  // `logits` (the draw may read them where they are made; edit final_norm instead), and a patch
  // names its tokens, each inside its source (a sibling row's too: it may stop first).
  void check_for_generation() const;
  // Subscribes the edits (tensor observers). The hooks stay valid while this object lives.
  void attach(Hooks& hooks);
  // Before each forward pass through the attached hooks: TOKENS name positions in the sequence
  // (in.positions: 0 = a row's first token, as a trace's token index and as a prompt's first
  // token in generation), padding (in.mask 0) is never edited, and the fire counts restart.
  // `rows` ([B], 1 = edit this row; empty = every row): edits that belong to some rows of a
  // batch only (a probe condition's), the others passing untouched.
  void begin_pass(const ForwardInput& in, std::span<const uint8_t> rows = {});
  // The batch rows `patch:@CONDITION` edits read, by condition (probe runs; set before the passes).
  void set_sibling_rows(std::map<std::string, int64_t> rows) { siblings_ = std::move(rows); }
  bool reads_siblings() const {
    for (const Intervention& iv : list_)
      if (iv.action == InterventionAction::PatchRow) return true;
    return false;
  }
  // After the forward pass: every edit fired exactly once.
  void check_fired() const;

  // What the artifact records: spec, hook, action, tokens, factor / experts / source.
  ojson to_json() const;

 private:
  std::vector<Intervention> list_;
  std::vector<int64_t> fired_;
  // The pass in progress (begin_pass): [B, T] positions and mask.
  int64_t pass_B_ = 0, pass_T_ = 0;
  std::vector<int32_t> pass_pos_;
  std::vector<uint8_t> pass_mask_, pass_rows_;
  std::map<std::string, int64_t> siblings_;
};

}  // namespace atlas
