// Probe protocols: one TOML file declares an experiment (docs/probe.md has the full format).
//
//   [protocol]  name, description, seed_section
//   [model]     dir, manifest                    (dir: overridable with --model)
//   [data]      root                             (overridable with --data)
//   [[corpus]]  domain, format, path, member, texts
//   [selection] salt, per_domain, min_tokens, content_tokens, skip_blank, skip_headings, reference
//   [blocks]    system, one_shot_user, one_shot_assistant, filler_token, filler_repeat,
//               user_prefix, generation_prompt
//   [[condition]] name, layout, system, history, group, edits = [{anchor, to | to_anchor}]
//   [[edge]]    name, condition, reference          (analysis: condition vs reference)
//   [[factorial]] name, a, b, a0b0, a1b0, a0b1, a1b1  (analysis: a 2x2 of conditions)
//   [contracts] same_content_ids, nested_prefixes, equal_delta
//   [execution] mode, layers, compute, record_routes, record_hidden, record_hidden_vectors,
//               max_new_tokens, sampling,
//               temperature, top_p, top_k, [[execution.seed]] value, sources_per_domain
//   [batching]  sources_per_batch, split_seeds
//
// Relative paths resolve against the protocol file's directory. Unknown keys, wrong types and
// unknown values are errors naming the file and the key.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "core/json.h"
#include "probe/corpus.h"

namespace atlas::probe {

struct EditSpec {
  std::string anchor;     // where: bos | history_eos | target_role_head | target_role_delim | gen_role_head | gen_role_delim
  std::string to;         // new token: "<bos>", "<eos>", or text that encodes to exactly one token
  std::string to_anchor;  // or: the id found at this anchor of the same official rendering
};

struct ConditionSpec {
  std::string name;
  std::string layout = "chat";  // raw (BOS + content ids) | user (template, no generation prompt) | chat (with it)
  bool system = false;
  std::string history = "none";  // none | filler | one_shot
  std::string group;             // cells of one source in one group: equal length and target position
  std::vector<EditSpec> edits;
  // Hook edits of the forward pass (model/intervene.h), TARGET[@TOKENS]=ACTION, where TOKENS
  // may also name an anchor (with an offset: "history_eos+1") or "target" (the cell's interior
  // tokens); freeze writes each cell's
  // edits with its own positions. No patch:FILE (patch:@CONDITION instead); add:FILE paths are
  // relative to the protocol file, pinned by SHA-256 in the manifest.
  std::vector<std::string> interventions;
};

// An edge of the analysis: metric(condition) against metric(reference) within each source
// (seed-system.md 4.6). The default name is "<condition> vs <reference>".
struct EdgeSpec {
  std::string name, condition, reference;
};

// A 2x2 factorial of conditions: factor A (levels 0/1) x factor B; a<i>b<j> names the
// condition at A = i, B = j (seed-system.md 4.6: main effects, DiD, edge modulations).
struct FactorialSpec {
  std::string name, factor_a, factor_b;
  std::string a0b0, a1b0, a0b1, a1b1;
};

struct SeedSpec {
  uint64_t value = 0;
  int64_t sources_per_domain = 0;  // 0: every selected source; k: the first k per domain
};

struct Protocol {
  std::string path, sha256;  // the file and the SHA-256 of its bytes
  std::string name, description, seed_section;
  std::string model_dir, model_manifest;
  std::string data_root;
  std::vector<CorpusSpec> corpora;  // domain order
  // selection
  std::string salt = "llm-atlas-probe-v1";
  int64_t per_domain = 32;
  int64_t min_tokens = 0;
  std::vector<int64_t> content_tokens{0};  // 0 = the whole text
  bool skip_blank = true, skip_headings = true;
  // A frozen manifest whose sources this protocol takes (seed-system.md 2.4, "chat reuse"):
  // per domain its first per_domain sources in its rank order, each text re-hashed against it;
  // salt, min_tokens and skip_* then select nothing. Empty: rank this protocol's own way.
  std::string selection_reference;
  // blocks
  std::string system_text, one_shot_user, one_shot_assistant;
  std::string filler_token = "x";
  int64_t filler_repeat = 9;          // user turn: filler_token repeated, space separated
  bool filler_match_one_shot = false;  // choose filler_repeat so the filler history has the one-shot's length
  std::string user_prefix = "User: ", generation_prompt = "Assistant:";
  std::vector<ConditionSpec> conditions;
  // analysis design: empty = not declared (the analysis then compares every condition with
  // the first); recorded in the manifest only when declared, so older manifests keep their hash
  std::vector<EdgeSpec> edges;
  std::vector<FactorialSpec> factorials;
  // contracts
  bool same_content_ids = true, nested_prefixes = false;
  std::vector<std::vector<std::string>> equal_delta;  // [a, b, c, d]: len(a)-len(b) == len(c)-len(d)
  // execution
  std::string mode = "trace", layers, compute = "bf16";
  bool record_routes = true, record_hidden = true;
  bool record_hidden_vectors = false;  // trace: target rows of every stage into DIR/hidden/*.safetensors
  int64_t max_new_tokens = 0;
  std::string sampling = "greedy";
  double temperature = 1.0, top_p = 1.0;
  int64_t top_k = 0;
  std::vector<SeedSpec> seeds;
  // batching
  int64_t sources_per_batch = 1;
  bool split_seeds = false;

  ojson to_json() const;  // the resolved protocol, recorded in the manifest
};

// Reads and validates PATH. Errors name the file and the key.
Protocol load_protocol(const std::string& path);

// Anchor names the renderer knows.
const std::vector<std::string>& anchor_names();

// A TOKENS item of a condition's hook edit that names an anchor: "NAME", "NAME+N" or "NAME-N"
// (N: up to 9 digits), as {NAME, offset}; nullopt for anything else (positions, ranges,
// "target", malformed offsets), whether or not NAME is a known anchor.
struct AnchorRef {
  std::string name;
  int64_t offset = 0;
};
std::optional<AnchorRef> parse_anchor_ref(const std::string& item);

}  // namespace atlas::probe
