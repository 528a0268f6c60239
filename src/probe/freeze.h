// Freezing: a protocol -> a manifest of cells (token ids + verified contracts), before any model
// output exists. Needs the tokenizer (and chat template) only, never the weights.
//
// Selection: within each domain, sources are ranked by ascending SHA-256 of the bytes
//   salt 0x00 domain 0x00 source_id          (UTF-8, no terminator)
// and the first `per_domain` eligible ones are taken (eligible: not blank, not a WikiText
// heading, at least `min_tokens` tokens untruncated). A content length N > 0 keeps the first N
// tokens of the source (the text up to the end of the N-th token); 0 keeps the whole text.
//
// The manifest's own hash, manifest_sha256, is the SHA-256 of the manifest serialised compactly
// (nlohmann dump(), keys in written order, UTF-8) with the manifest_sha256 key removed.
#pragma once

#include <optional>
#include <string>

#include "core/json.h"
#include "model/config.h"

namespace atlas::probe {

struct FreezeOptions {
  std::string protocol;                 // PROTOCOL.toml
  std::string model_dir;                // overrides [model] dir when non-empty
  std::string data_root;                // overrides [data] root when non-empty
  std::optional<int64_t> per_domain;    // overrides [selection] per_domain (small test runs)
  std::string selection_reference;      // overrides [selection] reference when non-empty
  std::string manifest_dir;             // where the manifest goes: add:FILE paths are recorded
                                        // relative to it (run and audit resolve them there)
};

// Builds and verifies every cell; a broken contract -> atlas::Error naming the protocol and cell.
ojson freeze(const FreezeOptions& opts);

// SHA-256 as defined above.
std::string manifest_hash(const ojson& manifest);

// Reads a manifest and checks its kind and its own hash (a modified manifest is refused).
ojson load_manifest(const std::string& path);

// The files a manifest's hook edits read (add:FILE, `intervention_files`) are recorded relative
// to the manifest's directory (absolute ones as given): the directory relative paths start from
// ("": the working directory, for a manifest there), and a recorded path as found from here.
std::string manifest_files_base(const std::string& manifest_path);
std::string manifest_file_path(const std::string& files_base, const std::string& recorded);

// A trace protocol's `execution.layers` against a model's config (freeze, where the model
// directory has one, and run): the range, or one error naming `file` and `field` and the model.
LayerRange protocol_layers(const std::string& spec, const ModelConfig& cfg, const std::string& model_dir,
                           const std::string& file, const std::string& field);

}  // namespace atlas::probe
