#include "io/checkpoint.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <set>

#include "core/error.h"
#include "core/file.h"
#include "core/sha256.h"

namespace atlas {
namespace fs = std::filesystem;

namespace {

constexpr const char* kIndexName = "model.safetensors.index.json";
constexpr const char* kSingleName = "model.safetensors";

std::string join(const std::string& dir, const std::string& name) { return (fs::path(dir) / name).string(); }

// The same "FILE: FIELD: what" shape as atlas::fail, for problems that are collected.
std::string msg(std::string_view file, std::string_view field, std::string_view what) {
  std::string m;
  if (!file.empty()) m.append(file).append(": ");
  if (!field.empty()) m.append(field).append(": ");
  m.append(what);
  return m;
}

std::string shape_str(const std::vector<int64_t>& s) {
  std::string o = "[";
  for (size_t i = 0; i < s.size(); ++i) o += (i ? ", " : "") + std::to_string(s[i]);
  return o + "]";
}

int64_t numel(const std::vector<int64_t>& s) {
  int64_t n = 1;
  for (int64_t d : s) n *= d;
  return n;
}

// A shard name from the index must stay inside the model directory.
bool safe_relative(const std::string& rel) {
  if (rel.empty() || rel[0] == '/') return false;
  for (const auto& part : fs::path(rel))
    if (part == "..") return false;
  return true;
}

struct Index {
  std::string path;
  std::vector<std::pair<std::string, std::string>> entries;  // tensor -> shard, in file order
  std::map<std::string, std::string> shard_of;
  std::vector<std::string> shards;  // distinct, in order of first appearance
  std::optional<int64_t> total_size;
};

Index read_index(const std::string& dir) {
  Index ix;
  ix.path = join(dir, kIndexName);
  // ordered_json: entries keep the file's order (the order shards were written in).
  ojson j;
  try {
    j = ojson::parse(read_file(ix.path));
  } catch (const ojson::parse_error& e) {
    fail(ix.path, {}, std::string("malformed JSON: ") + e.what());
  }
  if (!j.is_object()) fail(ix.path, {}, "expected a JSON object");
  if (!j.contains("weight_map") || !j["weight_map"].is_object())
    fail(ix.path, "weight_map", "missing or not an object of tensor -> shard file");
  if (j.contains("metadata") && !j["metadata"].is_null()) {
    const ojson& m = j["metadata"];
    if (!m.is_object()) fail(ix.path, "metadata", "must be an object");
    if (m.contains("total_size")) {
      if (!m["total_size"].is_number_integer() || m["total_size"].get<int64_t>() < 0)
        fail(ix.path, "metadata.total_size", "must be a non-negative integer, got " + m["total_size"].dump());
      ix.total_size = m["total_size"].get<int64_t>();
    }
  }
  std::set<std::string> seen;
  for (auto it = j["weight_map"].begin(); it != j["weight_map"].end(); ++it) {
    if (!it.value().is_string()) fail(ix.path, "weight_map." + it.key(), "shard file name must be a string");
    std::string shard = it.value().get<std::string>();
    if (!safe_relative(shard))
      fail(ix.path, "weight_map." + it.key(), "shard \"" + shard + "\" is not a path inside the model directory");
    ix.entries.emplace_back(it.key(), shard);
    ix.shard_of[it.key()] = shard;
    if (seen.insert(shard).second) ix.shards.push_back(shard);
  }
  return ix;
}

LayerRange resolve_layers(const ModelConfig& c, const CheckpointOptions& opts) {
  LayerRange r = opts.layers.value_or(LayerRange::all(c));
  if (r.first != 0 || r.last < r.first || r.last >= c.num_hidden_layers)
    fail("--layers", {}, "range " + std::to_string(r.first) + "-" + std::to_string(r.last) + " is outside 0-" +
                             std::to_string(c.num_hidden_layers - 1));
  return r;
}

std::optional<DType> torch_dtype_of(const std::string& config_path, std::string& problem) {
  json j = read_json_file(config_path);
  if (!j.contains("torch_dtype") || !j["torch_dtype"].is_string()) {
    problem = msg(config_path, "torch_dtype", "missing (needed to size tensors without their shards)");
    return std::nullopt;
  }
  std::string t = j["torch_dtype"].get<std::string>();
  if (t == "bfloat16") return DType::BF16;
  if (t == "float16") return DType::F16;
  if (t == "float32") return DType::F32;
  problem = msg(config_path, "torch_dtype", "unsupported value \"" + t + "\" (supported: bfloat16, float16, float32)");
  return std::nullopt;
}

bool is_float(DType t) { return t == DType::BF16 || t == DType::F16 || t == DType::F32; }

std::string human_bytes(double b) {
  char buf[32];
  if (b >= 1e9)
    std::snprintf(buf, sizeof buf, "%.2f GB", b / 1e9);
  else if (b >= 1e6)
    std::snprintf(buf, sizeof buf, "%.2f MB", b / 1e6);
  else
    std::snprintf(buf, sizeof buf, "%.1f kB", b / 1e3);
  return buf;
}

std::string human_count(double n) {
  char buf[32];
  if (n >= 1e9)
    std::snprintf(buf, sizeof buf, "%.2fB", n / 1e9);
  else if (n >= 1e6)
    std::snprintf(buf, sizeof buf, "%.2fM", n / 1e6);
  else if (n >= 1e3)
    std::snprintf(buf, sizeof buf, "%.1fk", n / 1e3);
  else
    std::snprintf(buf, sizeof buf, "%.0f", n);
  return buf;
}

}  // namespace

std::string layout_name(CheckpointLayout l) {
  switch (l) {
    case CheckpointLayout::Single: return "single";
    case CheckpointLayout::Sharded: return "sharded";
    case CheckpointLayout::IndexOnly: return "index-only";
  }
  return "?";
}

CheckpointLayout detect_layout(const std::string& dir) {
  if (!fs::is_directory(dir)) fail(dir, {}, "not a directory");
  bool single = file_exists(join(dir, kSingleName)), index = file_exists(join(dir, kIndexName));
  if (single && index)
    fail(dir, {}, std::string("holds both ") + kSingleName + " and " + kIndexName +
                      "; it is ambiguous which one is the checkpoint (remove one)");
  if (!single && !index) fail(dir, {}, std::string("no ") + kSingleName + " or " + kIndexName + " (not a model directory)");
  if (single) return CheckpointLayout::Single;
  Index ix = read_index(dir);
  for (const auto& s : ix.shards)
    if (file_exists(join(dir, s))) return CheckpointLayout::Sharded;
  return CheckpointLayout::IndexOnly;
}

ojson VerificationReport::to_json() const {
  ojson j;
  j["ok"] = ok;
  j["layout"] = layout_name(layout);
  j["weights_present"] = weights_present;
  j["expected_tensors"] = expected_tensors;
  j["total_tensors"] = total_tensors;
  j["total_bytes"] = total_bytes;
  ojson d = ojson::object();
  for (const auto& [name, t] : by_dtype) d[name] = {{"tensors", t.tensors}, {"params", t.params}, {"bytes", t.bytes}};
  j["by_dtype"] = d;
  j["index_total_size"] = index_total_size ? ojson(*index_total_size) : ojson(nullptr);
  j["index_total_matches"] = index_total_matches ? ojson(*index_total_matches) : ojson(nullptr);
  j["problems"] = problems;
  j["unexpected"] = unexpected;
  j["shards_opened"] = shards_opened;
  j["shards_skipped"] = shards_skipped;
  j["files_pinned"] = files_pinned;
  return j;
}

// ---- manifest ---------------------------------------------------------------------------

std::map<std::string, std::string> hash_directory(const std::string& dir, const std::string& exclude) {
  std::map<std::string, std::string> out;
  fs::path root(dir);
  std::error_code ec;
  fs::path excl;
  if (!exclude.empty()) {
    fs::path e(exclude);
    excl = fs::weakly_canonical(e.is_absolute() ? e : fs::current_path() / e, ec);
  }
  if (!fs::is_directory(root)) fail(dir, {}, "not a directory");
  for (auto it = fs::recursive_directory_iterator(root); it != fs::recursive_directory_iterator(); ++it) {
    std::string name = it->path().filename().string();
    // Hidden entries (.git, staging folders) and atlas temp files are not part of a model.
    if (!name.empty() && name[0] == '.') {
      if (it->is_directory()) it.disable_recursion_pending();
      continue;
    }
    if (name.find(".tmp-") != std::string::npos || !it->is_regular_file()) continue;
    if (!excl.empty() && fs::weakly_canonical(it->path(), ec) == excl) continue;
    out[fs::relative(it->path(), root).generic_string()] = sha256_file(it->path().string());
  }
  return out;
}

void verify_manifest(const std::string& dir, const std::string& manifest_path, VerificationReport& report) {
  json m = read_json_file(manifest_path);
  if (!m.is_object() || !m.contains("files") || !m["files"].is_object())
    fail(manifest_path, "files", "missing or not an object of relative path -> sha256");
  for (auto it = m["files"].begin(); it != m["files"].end(); ++it) {
    const std::string& rel = it.key();
    std::string field = "files." + rel;
    if (!safe_relative(rel)) fail(manifest_path, field, "path must be relative and stay inside the model directory");
    const json& v = it.value();
    if (!v.is_string() || v.get<std::string>().size() != 64 ||
        v.get<std::string>().find_first_not_of("0123456789abcdef") != std::string::npos)
      fail(manifest_path, field, "expected a lower-case hex SHA-256 (64 characters), got " + v.dump());
    std::string path = join(dir, rel);
    if (!fs::is_regular_file(path)) {
      report.add_problem(msg(path, "", "pinned by " + manifest_path + " but missing"));
      continue;
    }
    std::string got = sha256_file(path);
    if (got != v.get<std::string>()) {
      report.add_problem(msg(path, "sha256", "is " + got + " but " + manifest_path + " pins " + v.get<std::string>()));
      continue;
    }
    report.files_pinned.push_back(rel);
  }
}

// ---- index-only accounting -------------------------------------------------------------

VerificationReport verify_index_only(const std::string& dir, const CheckpointOptions& opts) {
  VerificationReport rep;
  rep.layout = CheckpointLayout::IndexOnly;
  rep.weights_present = false;
  const std::string config_path = join(dir, "config.json");
  ModelConfig cfg = ModelConfig::load(config_path);
  LayerRange layers = resolve_layers(cfg, opts);
  Index ix = read_index(dir);
  rep.index_total_size = ix.total_size;
  rep.shards_skipped = ix.shards;

  std::string dtype_problem;
  auto dt = torch_dtype_of(config_path, dtype_problem);
  if (!dt) rep.add_problem(dtype_problem);

  auto needed = expected_tensors(cfg, layers);
  rep.expected_tensors = int64_t(needed.size());
  std::set<std::string> all_names;
  for (const auto& t : expected_tensors(cfg, LayerRange::all(cfg))) all_names.insert(t.name);
  for (const auto& [name, shard] : ix.entries)
    if (!all_names.count(name)) rep.unexpected.push_back(name);

  for (const auto& t : needed) {
    if (!ix.shard_of.count(t.name)) {
      rep.add_problem(msg(ix.path, t.name, "missing from the index (config.json implies it, shape " + shape_str(t.shape) + ")"));
      continue;
    }
    if (!dt) continue;
    DtypeTotals& d = rep.by_dtype[std::string(dtype_name(*dt))];
    int64_t n = numel(t.shape), b = n * int64_t(dtype_size(*dt));
    d.tensors += 1;
    d.params += n;
    d.bytes += b;
    rep.total_tensors += 1;
    rep.total_bytes += b;
  }
  if (layers.is_full(cfg) && ix.total_size && dt && rep.problems.empty()) {
    if (!rep.unexpected.empty()) {
      rep.add_problem(msg(ix.path, "metadata.total_size",
                          "cannot be checked: " + std::to_string(rep.unexpected.size()) +
                              " tensors the config does not imply have unknown sizes without their shards"));
    } else {
      rep.index_total_matches = rep.total_bytes == *ix.total_size;
      if (!*rep.index_total_matches)
        rep.add_problem(msg(ix.path, "metadata.total_size",
                            "is " + std::to_string(*ix.total_size) + " but the config's tensors at " +
                                std::string(dtype_name(*dt)) + " hold " + std::to_string(rep.total_bytes) + " bytes"));
    }
  }
  if (!opts.manifest_path.empty()) verify_manifest(dir, opts.manifest_path, rep);
  return rep;
}

// ---- full / partial load ---------------------------------------------------------------

Checkpoint Checkpoint::open(const std::string& dir, const CheckpointOptions& opts) {
  Checkpoint ck;
  ck.dir_ = dir;
  CheckpointLayout layout = detect_layout(dir);
  ck.config_ = ModelConfig::load(join(dir, "config.json"));
  ck.layers_ = resolve_layers(ck.config_, opts);
  VerificationReport& rep = ck.report_;
  rep.layout = layout == CheckpointLayout::IndexOnly ? CheckpointLayout::Sharded : layout;

  const auto needed = expected_tensors(ck.config_, ck.layers_);
  rep.expected_tensors = int64_t(needed.size());
  std::set<std::string> all_names;
  for (const auto& t : expected_tensors(ck.config_, LayerRange::all(ck.config_))) all_names.insert(t.name);

  auto open_file = [&](const std::string& rel) -> std::shared_ptr<SafetensorsFile> {
    try {
      auto f = SafetensorsFile::open(join(dir, rel));
      rep.shards_opened.push_back(rel);
      ck.files_.push_back(f);
      return f;
    } catch (const Error& e) {
      rep.add_problem(e.what());
      return nullptr;
    }
  };
  // Tensors whose absence is already explained (index gap, missing or broken shard).
  std::set<std::string> accounted;

  if (layout == CheckpointLayout::Single) {
    if (auto f = open_file(kSingleName)) {
      for (const auto& t : f->tensors()) {
        ck.tensors_[t.name] = &t;
        if (!all_names.count(t.name)) rep.unexpected.push_back(t.name);
      }
    } else {
      for (const auto& t : needed) accounted.insert(t.name);  // the file's own error says it all
    }
  } else {
    Index ix = read_index(dir);
    rep.index_total_size = ix.total_size;
    for (const auto& [name, shard] : ix.entries)
      if (!all_names.count(name)) rep.unexpected.push_back(name);
    // Which shards to map: all of them for a full load (so index and shards can be checked
    // against each other completely), only those holding needed tensors for a layer range.
    std::set<std::string> wanted;
    for (const auto& t : needed) {
      auto it = ix.shard_of.find(t.name);
      if (it == ix.shard_of.end()) {
        rep.add_problem(msg(ix.path, t.name, "missing from the index (config.json implies it, shape " + shape_str(t.shape) + ")"));
        accounted.insert(t.name);
      } else {
        wanted.insert(it->second);
      }
    }
    const bool full = ck.layers_.is_full(ck.config_);
    bool all_opened = true;
    for (const auto& shard : ix.shards) {
      if (!full && !wanted.count(shard)) {
        rep.shards_skipped.push_back(shard);
        all_opened = false;
        continue;
      }
      std::vector<std::string> listed;
      for (const auto& [name, s] : ix.entries)
        if (s == shard) listed.push_back(name);
      std::string path = join(dir, shard);
      if (!file_exists(path)) {
        rep.add_problem(msg(path, {}, "missing shard (" + ix.path + " maps " + std::to_string(listed.size()) +
                                          " tensors to it, e.g. " + listed.front() + ")"));
        for (const auto& n : listed) accounted.insert(n);
        all_opened = false;
        continue;
      }
      auto f = open_file(shard);
      if (!f) {
        for (const auto& n : listed) accounted.insert(n);
        all_opened = false;
        continue;
      }
      for (const auto& n : listed) {
        if (!f->find(n)) {
          rep.add_problem(msg(path, n, "listed in " + ix.path + " but not in this shard"));
          accounted.insert(n);
        }
      }
      for (const auto& t : f->tensors()) {
        auto it = ix.shard_of.find(t.name);
        if (it == ix.shard_of.end()) {
          rep.add_problem(msg(path, t.name, "in this shard but not listed in " + ix.path));
        } else if (it->second != shard) {
          rep.add_problem(msg(path, t.name, "in this shard but " + ix.path + " maps it to " + it->second));
        } else {
          ck.tensors_[t.name] = &t;
        }
      }
    }
    if (ix.total_size && all_opened) {
      // Computed below once totals are known.
    } else if (ix.total_size) {
      ix.total_size.reset();  // a partial view cannot be compared with the whole index
    }
    // Totals over everything mapped.
    for (const auto& f : ck.files_)
      for (const auto& t : f->tensors()) {
        DtypeTotals& d = rep.by_dtype[std::string(dtype_name(t.dtype))];
        d.tensors += 1;
        d.params += t.numel();
        d.bytes += int64_t(t.nbytes);
        rep.total_tensors += 1;
        rep.total_bytes += int64_t(t.nbytes);
      }
    if (ix.total_size) {
      rep.index_total_matches = rep.total_bytes == *ix.total_size;
      if (!*rep.index_total_matches)
        rep.add_problem(msg(ix.path, "metadata.total_size",
                            "is " + std::to_string(*ix.total_size) + " but the shards hold " +
                                std::to_string(rep.total_bytes) + " tensor bytes"));
    }
  }
  if (layout == CheckpointLayout::Single)
    for (const auto& f : ck.files_)
      for (const auto& t : f->tensors()) {
        DtypeTotals& d = rep.by_dtype[std::string(dtype_name(t.dtype))];
        d.tensors += 1;
        d.params += t.numel();
        d.bytes += int64_t(t.nbytes);
        rep.total_tensors += 1;
        rep.total_bytes += int64_t(t.nbytes);
      }

  // Every needed tensor: present, float, exact shape.
  const std::string where = layout == CheckpointLayout::Single ? join(dir, kSingleName) : dir;
  for (const auto& t : needed) {
    if (accounted.count(t.name)) continue;
    auto it = ck.tensors_.find(t.name);
    if (it == ck.tensors_.end()) {
      if (layout == CheckpointLayout::Single)
        rep.add_problem(msg(where, t.name, "missing (config.json implies it, shape " + shape_str(t.shape) + ")"));
      continue;  // sharded: already reported as an index/shard disagreement
    }
    const TensorView& v = *it->second;
    if (!is_float(v.dtype))
      rep.add_problem(msg(v.file, t.name, "dtype " + std::string(dtype_name(v.dtype)) + ", expected BF16, F16 or F32"));
    if (v.shape != t.shape)
      rep.add_problem(msg(v.file, t.name, "shape " + shape_str(v.shape) + ", expected " + shape_str(t.shape) +
                                              " (from config.json)"));
  }

  if (!opts.manifest_path.empty()) verify_manifest(dir, opts.manifest_path, rep);

  if (!rep.ok && !opts.verify_only) {
    std::string m = rep.problems.front();
    if (rep.problems.size() > 1) m += " (and " + std::to_string(rep.problems.size() - 1) + " more problems)";
    throw Error(m);
  }
  return ck;
}

bool Checkpoint::has(const std::string& name) const { return tensors_.count(name) > 0; }

const TensorView& Checkpoint::tensor(const std::string& name) const {
  auto it = tensors_.find(name);
  if (it == tensors_.end()) {
    bool in_range = false;
    for (const auto& t : expected_tensors(config_, layers_)) in_range |= t.name == name;
    fail(dir_, name, in_range ? "tensor not loaded" : "tensor not in the loaded layer range or not in the checkpoint");
  }
  return *it->second;
}

std::map<std::string, std::string> Checkpoint::file_hashes() const {
  std::vector<std::string> rels = {"config.json"};
  if (file_exists(join(dir_, kIndexName))) rels.push_back(kIndexName);
  for (const auto& s : report_.shards_opened) rels.push_back(s);
  std::map<std::string, std::string> out;
  for (const auto& r : rels) {
    auto it = hash_cache_.find(r);
    if (it == hash_cache_.end()) it = hash_cache_.emplace(r, sha256_file(join(dir_, r))).first;
    out[r] = it->second;
  }
  return out;
}

std::string Checkpoint::summary_line() const {
  int64_t dense = 0, moe = 0;
  for (int64_t l = layers_.first; l <= layers_.last; ++l) (config_.is_moe_layer(l) ? moe : dense) += 1;
  int64_t params = 0;
  std::string dtypes;
  for (const auto& [name, t] : report_.by_dtype) {
    params += t.params;
    dtypes += (dtypes.empty() ? "" : "+") + name;
  }
  std::string layers = layers_.is_full(config_)
                           ? std::to_string(config_.num_hidden_layers) + " layers"
                           : "layers " + std::to_string(layers_.first) + "-" + std::to_string(layers_.last) + " of " +
                                 std::to_string(config_.num_hidden_layers);
  return config_.model_type + ": " + layers + " (" + std::to_string(dense) + " dense, " + std::to_string(moe) +
         " MoE), " + human_count(double(params)) + " params, " + human_bytes(double(report_.total_bytes)) + " (" +
         dtypes + ") in " + std::to_string(report_.total_tensors) + " tensors from " +
         std::to_string(report_.shards_opened.size()) + " file" + (report_.shards_opened.size() == 1 ? "" : "s");
}

}  // namespace atlas
