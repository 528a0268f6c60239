#include "probe/run.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <set>
#include <sstream>

#include "audit/hash_chain.h"
#include "core/error.h"
#include "core/file.h"
#include "core/progress.h"
#include "core/provenance.h"
#include "core/sha256.h"
#include "decode/generate.h"
#include "io/checkpoint.h"
#include "io/safetensors.h"
#include "model/digest.h"
#include "model/intervene.h"
#include "model/loader.h"
#include "probe/freeze.h"
#include "text/tokenizer.h"

namespace atlas::probe {
namespace fs = std::filesystem;

ShardSpec parse_shard(const std::string& spec) {
  const size_t slash = spec.find('/');
  auto bad = [&]() -> ShardSpec { fail("--shard", {}, "expected i/n with 0 <= i < n, got '" + spec + "'"); };
  if (slash == std::string::npos) return bad();
  ShardSpec s;
  try {
    size_t a = 0, b = 0;
    s.index = std::stoll(spec.substr(0, slash), &a);
    s.count = std::stoll(spec.substr(slash + 1), &b);
    if (a != slash || b != spec.size() - slash - 1) return bad();
  } catch (const std::exception&) {
    return bad();
  }
  if (s.count <= 0 || s.index < 0 || s.index >= s.count) return bad();
  return s;
}

std::string artifact_content_hash(const ojson& a) { return artifact_content_sha256(a); }

std::string check_cell_vectors(const ojson& result, const std::function<const TensorView*(const std::string&)>& find,
                               int64_t& checked) {
  const std::string prefix = result.at("hidden_vectors").at("tensor_prefix").get<std::string>();
  for (const auto& s : result.at("stages")) {
    const std::string tn = prefix + s.at("name").get<std::string>();
    const TensorView* tv = find(tn);
    if (!tv) return "tensor " + tn + " missing";
    if (tv->dtype != DType::F32 || tv->shape.size() != 2)
      return tv->file + ": tensor " + tn + " is " + std::string(dtype_name(tv->dtype)) + " of rank " +
             std::to_string(tv->shape.size()) + ", expected F32 [tokens, hidden]";
    // Copied out first: a mapped tensor's data need not be 4-byte aligned.
    std::vector<float> rows(size_t(tv->numel()));
    if (tv->nbytes) std::memcpy(rows.data(), tv->data, tv->nbytes);
    if (stage_sha256(rows.data(), tv->shape[0], tv->shape[1]) != s.at("target_sha256").get<std::string>())
      return tv->file + ": tensor " + tn + " does not hash to the stage's target_sha256";
    ++checked;
  }
  return "";
}

namespace {

std::string line_hash(const ojson& j) {
  ojson c = j;
  c.erase("line_sha256");
  return sha256_hex(c.dump());
}

std::string journal_name(const std::string& source_key) {
  std::string s;
  for (char ch : source_key) s += (std::isalnum(static_cast<unsigned char>(ch)) || ch == '-' || ch == '.') ? ch : '_';
  return s + "-" + sha256_hex(source_key).substr(0, 12) + ".jsonl";
}

std::string stage_name(int64_t s, int64_t n_layers) {
  if (s == 0) return "embed";
  if (s == n_layers + 1) return "final_norm";
  char b[32];
  std::snprintf(b, sizeof b, "layer.%02lld", (long long)(s - 1));
  return b;
}

uint32_t stream_of(const std::string& key) {
  auto d = Sha256().update(key).digest();
  return uint32_t(d[0]) | uint32_t(d[1]) << 8 | uint32_t(d[2]) << 16 | uint32_t(d[3]) << 24;
}

// The cell fields an artifact repeats from the manifest (self-describing for later analysis).
ojson cell_header(const ojson& c) {
  ojson h;
  for (const char* k : {"index", "cell_id", "source_key", "source_id", "domain", "rank", "content_tokens", "condition",
                        "layout", "system", "history", "group", "seed", "batch", "n_tokens", "input_ids", "prompt_sha256", "target_span",
                        "interior_token_range", "boundary_crossing", "target_ids_sha256", "edits"})
    h[k] = c.at(k);
  if (c.contains("interventions")) h["interventions"] = c.at("interventions");  // (its conditions' hook edits)
  return h;
}

struct Journal {
  std::string path;
  std::map<int64_t, ojson> results;  // cell index -> result
};

// Reads and verifies a source's journal; a journal of another manifest or a broken line is an error.
Journal read_journal(const std::string& path, const std::string& manifest_sha, const std::string& source_key,
                     const std::vector<int64_t>& expected_cells, const ojson& cells) {
  Journal j{.path = path, .results = {}};
  std::istringstream in(read_file(path));
  std::string line;
  int64_t lineno = 0;
  bool header = false;
  while (std::getline(in, line)) {
    ++lineno;
    const std::string where = path + ":" + std::to_string(lineno);
    ojson o;
    try {
      o = ojson::parse(line);
    } catch (const std::exception&) {
      fail(where, {}, "malformed journal line");
    }
    if (!o.is_object() || !o.contains("line_sha256") || line_hash(o) != o["line_sha256"].get<std::string>())
      fail(where, "line_sha256", "journal line does not match its hash");
    if (!header) {
      if (string_or_empty(o, "kind") != "atlas.probe.journal") fail(where, "kind", "not an atlas probe journal");
      if (string_or_empty(o, "manifest_sha256") != manifest_sha)
        fail(where, "manifest_sha256", "this journal belongs to another manifest (" + string_or_empty(o, "manifest_sha256") + ")");
      if (string_or_empty(o, "source_key") != source_key) fail(where, "source_key", "journal of another source");
      header = true;
      continue;
    }
    const int64_t idx = o.value("index", int64_t(-1));
    if (std::find(expected_cells.begin(), expected_cells.end(), idx) == expected_cells.end() ||
        cells[size_t(idx)]["cell_id"] != o["cell_id"])
      fail(where, "cell_id", "cell is not one of this source's cells in the manifest");
    if (!j.results.emplace(idx, o["result"]).second) fail(where, "cell_id", "cell journaled twice");
  }
  if (!header) fail(path, {}, "empty journal");
  if (j.results.size() != expected_cells.size())
    fail(path, {}, "journal holds " + std::to_string(j.results.size()) + " of " + std::to_string(expected_cells.size()) + " cells");
  return j;
}

void write_journal(const std::string& path, const std::string& manifest_sha, const std::string& source_key,
                   const std::vector<int64_t>& cell_ids, const ojson& cells, const std::map<int64_t, ojson>& results) {
  AtomicFile f(path);
  ojson h;
  h["kind"] = "atlas.probe.journal";
  h["manifest_sha256"] = manifest_sha;
  h["source_key"] = source_key;
  h["cells"] = cell_ids.size();
  h["line_sha256"] = line_hash(h);
  f.write(h.dump() + "\n");
  for (int64_t ci : cell_ids) {
    ojson l;
    l["index"] = ci;
    l["cell_id"] = cells[size_t(ci)]["cell_id"];
    l["result"] = results.at(ci);
    l["line_sha256"] = line_hash(l);
    f.write(l.dump() + "\n");
  }
  f.commit();
}

std::vector<int32_t> ids_of(const ojson& c) { return c.at("input_ids").get<std::vector<int32_t>>(); }

// One trace batch: left-padded rows, hooks collect per row routes and stage hashes.
// Target rows of every stage for one cell: (tensor name suffix, [rows, H] values).
using CellVectors = std::vector<std::pair<std::string, std::vector<float>>>;

// A cell's hook edits (cells whose condition declares some), built and checked before the run.
using CellEdits = std::map<int64_t, std::unique_ptr<Interventions>>;

// The rows of batch row b's siblings (same source, seed and content length), by condition: what
// its patch:@CONDITION edits read.
std::map<std::string, int64_t> sibling_rows(const ojson& cells, const std::vector<int64_t>& members, int64_t b) {
  const ojson& c = cells[size_t(members[size_t(b)])];
  std::map<std::string, int64_t> out;
  for (size_t r = 0; r < members.size(); ++r) {
    const ojson& d = cells[size_t(members[r])];
    if (d["source_key"] == c["source_key"] && d["seed"] == c["seed"] && d["content_tokens"] == c["content_tokens"])
      out[d["condition"].get<std::string>()] = int64_t(r);
  }
  return out;
}

std::map<int64_t, ojson> run_trace_batch(const Model& model, const ojson& manifest, const std::vector<int64_t>& members,
                                         bool routes, bool hidden, bool vectors, std::map<int64_t, CellVectors>& vec_out,
                                         const CellEdits& cell_edits) {
  const ojson& cells = manifest["cells"];
  const int32_t pad = manifest["tokenizer"]["eos_id"].get<int32_t>();
  const int64_t B = int64_t(members.size());
  std::vector<std::vector<int32_t>> rows;
  int64_t T = 0;
  for (int64_t ci : members) {
    rows.push_back(ids_of(cells[size_t(ci)]));
    T = std::max<int64_t>(T, int64_t(rows.back().size()));
  }
  std::vector<int32_t> ids(size_t(B * T), pad), pos(size_t(B * T), 0);
  std::vector<uint8_t> mask(size_t(B * T), 0);
  for (int64_t b = 0; b < B; ++b) {
    const int64_t off = T - int64_t(rows[b].size());
    for (size_t t = 0; t < rows[b].size(); ++t) {
      ids[size_t(b * T + off) + t] = rows[b][t];
      pos[size_t(b * T + off) + t] = int32_t(t);
      mask[size_t(b * T + off) + t] = 1;
    }
  }
  struct RowOut {
    std::map<int64_t, std::vector<int32_t>> topk_ids;     // layer -> [len, k]
    std::map<int64_t, std::vector<float>> topk_weights;   // layer -> [len, k]
    std::map<int64_t, std::pair<std::string, std::string>> stages;  // stage -> (full, target) sha
    std::map<int64_t, std::vector<float>> target_rows;              // stage -> [interior, H] (vectors)
  };
  std::vector<RowOut> out(static_cast<size_t>(B));
  auto interior = [&](int64_t b) {
    const auto& r = cells[size_t(members[size_t(b)])]["interior_token_range"];
    return std::pair<int64_t, int64_t>(r[0].get<int64_t>(), r[1].get<int64_t>());
  };
  const ModelConfig& cfg = model.config();
  const int64_t n_layers = cfg.num_hidden_layers;
  Hooks hooks;
  // Stage hashes need only the per-token digests (model/digest.h): full = the row's real
  // tokens, target = its interior range. A backend digests where the tensor lives unless the
  // vectors are wanted too; then the tensor comes to the host and serves both.
  auto stage_hashes = [&](int64_t stage) {
    return [&, stage](const HookDigests& d) {
      for (int64_t b = 0; b < B; ++b) {
        const int64_t off = T - int64_t(rows[size_t(b)].size());
        auto [a, e] = interior(b);
        out[size_t(b)].stages[stage] = {digest_chain_hex(d.row(b, off, T)), digest_chain_hex(d.row(b, off + a, off + e))};
      }
    };
  };
  auto stage_vectors = [&](int64_t stage) {
    return [&, stage](const HookTensor& t) {
      const int64_t H = t.shape[2];
      for (int64_t b = 0; b < B; ++b) {
        const int64_t off = T - int64_t(rows[size_t(b)].size());
        const float* row = t.f32() + (b * T + off) * H;  // [len, H]
        auto [a, e] = interior(b);
        out[size_t(b)].target_rows[stage].assign(row + a * H, row + e * H);
      }
    };
  };
  auto stage = [&](const std::string& name, int64_t s) {
    if (hidden) hooks.add_digests(name, stage_hashes(s));
    if (vectors) hooks.add_reader(name, stage_vectors(s));
  };
  stage("embed", 0);
  for (int64_t l = model.layers().first; l <= model.layers().last; ++l) stage(LayerHookNames(l).resid_post, l + 1);
  if (model.has_head()) stage("final_norm", n_layers + 1);
  for (int64_t l = model.layers().first; l <= model.layers().last; ++l) {
    if (!cfg.is_moe_layer(l)) continue;
    LayerHookNames n(l);
    hooks.add_reader(n.topk_ids, [&, l](const HookTensor& t) {
      const int64_t k = t.shape[2];
      for (int64_t b = 0; b < B; ++b) {
        const int64_t len = int64_t(rows[size_t(b)].size()), off = T - len;
        const int32_t* p = t.i32() + (b * T + off) * k;
        out[size_t(b)].topk_ids[l].assign(p, p + len * k);
      }
    });
    hooks.add_reader(n.topk_weights, [&, l](const HookTensor& t) {
      const int64_t k = t.shape[2];
      for (int64_t b = 0; b < B; ++b) {
        const int64_t len = int64_t(rows[size_t(b)].size()), off = T - len;
        const float* p = t.f32() + (b * T + off) * k;
        out[size_t(b)].topk_weights[l].assign(p, p + len * k);
      }
    });
  }
  // Each edited cell's edits on its own row (tensor observers: the recorders read the edits).
  std::vector<std::pair<Interventions*, std::vector<uint8_t>>> edits;
  for (int64_t b = 0; b < B; ++b)
    if (auto it = cell_edits.find(members[size_t(b)]); it != cell_edits.end()) {
      std::vector<uint8_t> only(size_t(B), 0);
      only[size_t(b)] = 1;
      it->second->set_sibling_rows(sibling_rows(cells, members, b));
      it->second->attach(hooks);
      edits.emplace_back(it->second.get(), std::move(only));
    }
  const ForwardInput in{.batch = B, .tokens = T, .ids = ids, .positions = pos, .mask = mask, .logits_last_only = true};
  for (auto& [e, only] : edits) e->begin_pass(in, only);
  model.forward(in, &hooks);
  for (auto& [e, only] : edits) e->check_fired();

  std::map<int64_t, ojson> results;
  for (int64_t b = 0; b < B; ++b) {
    const RowOut& r = out[size_t(b)];
    auto [a, e] = interior(b);
    ojson res;
    res["mode"] = "trace";
    ojson gates = ojson::array(), rt = ojson::array();
    for (const auto& [l, tid] : r.topk_ids) {
      const auto& w = r.topk_weights.at(l);
      const int64_t len = int64_t(rows[size_t(b)].size()), k = int64_t(tid.size()) / std::max<int64_t>(len, 1);
      ojson g;
      g["layer"] = l;
      g["k"] = k;
      g["full_ids_sha256"] = ids_sha256(tid);
      g["full_weights_sha256"] = sha256_hex(w.data(), w.size() * sizeof(float));
      g["target_ids_sha256"] = ids_sha256(std::span<const int32_t>(tid.data() + a * k, size_t((e - a) * k)));
      g["target_weights_sha256"] = sha256_hex(w.data() + a * k, size_t((e - a) * k) * sizeof(float));
      gates.push_back(g);
      if (routes) {
        ojson ti = ojson::array(), tw = ojson::array();
        for (int64_t t = 0; t < len; ++t) {
          ti.push_back(std::vector<int32_t>(tid.begin() + t * k, tid.begin() + (t + 1) * k));
          tw.push_back(std::vector<float>(w.begin() + t * k, w.begin() + (t + 1) * k));
        }
        rt.push_back({{"layer", l}, {"topk_ids", ti}, {"topk_weights", tw}});
      }
    }
    res["gates"] = gates;
    if (routes) res["routes"] = rt;
    if (vectors) {
      CellVectors cv;
      for (const auto& [st, rowsv] : r.target_rows) cv.push_back({stage_name(st, n_layers), rowsv});
      vec_out[members[size_t(b)]] = std::move(cv);
      res["hidden_vectors"] = {{"tensor_prefix", "cell" + std::to_string(members[size_t(b)]) + "."},
                               {"hidden_size", cfg.hidden_size}};
    }
    if (hidden) {
      ojson st = ojson::array();
      for (const auto& [s, h] : r.stages)
        st.push_back({{"stage", s}, {"name", stage_name(s, n_layers)}, {"full_sha256", h.first}, {"target_sha256", h.second}});
      res["stages"] = st;
    }
    results[members[size_t(b)]] = std::move(res);
  }
  return results;
}

std::map<int64_t, ojson> run_generate_batch(const Model& model, const Tokenizer* tok, const ojson& manifest,
                                            const std::vector<int64_t>& members, const CellEdits& cell_edits) {
  const ojson& cells = manifest["cells"];
  const ojson& ex = manifest["protocol"]["execution"];
  const std::string mode = ex["sampling"].get<std::string>();
  const int32_t eos = manifest["tokenizer"]["eos_id"].get<int32_t>();
  std::vector<decode::PromptRow> rows;
  for (int64_t ci : members) {
    const ojson& c = cells[size_t(ci)];
    decode::SamplingParams sp;
    if (mode != "greedy") {
      sp.temperature = ex["temperature"].get<double>();
      sp.top_p = ex["top_p"].get<double>();
      sp.top_k = ex["top_k"].get<int64_t>();
      sp.seed = c["seed"].get<uint64_t>();
      if (mode == "seeded") {
        sp.mode = decode::SamplingMode::Seeded;
        // The row's Philox stream: its source and condition, never its batch slot.
        sp.stream = stream_of(c["source_key"].get<std::string>() + "|" + c["condition"].get<std::string>());
      } else {
        sp.mode = decode::SamplingMode::Crn;
        // The tape's pre-image holds the source, not the condition: conditions share u_t.
        sp.crn_row_key = c["source_key"].get<std::string>();
      }
    }
    rows.push_back({.id = c["cell_id"].get<std::string>(), .ids = ids_of(c), .sampling = sp});
  }
  decode::GenerateOptions go{.max_new_tokens = ex["max_new_tokens"].get<int64_t>(),
                             .batch = int64_t(rows.size()),
                             .eos_ids = {eos},
                             .stop_strings = {},
                             .pad_id = eos};
  for (size_t b = 0; b < members.size(); ++b) {
    auto it = cell_edits.find(members[b]);
    go.row_edits.push_back(it == cell_edits.end() ? nullptr : it->second.get());
    if (it != cell_edits.end()) it->second->set_sibling_rows(sibling_rows(cells, members, int64_t(b)));  // (one batch: go.batch)
  }
  if (std::all_of(go.row_edits.begin(), go.row_edits.end(), [](Interventions* e) { return e == nullptr; }))
    go.row_edits.clear();
  auto gen = decode::generate(model, rows, go);
  // Text as transformers decodes it: special tokens skipped, and ids the tokenizer lacks (a
  // model's vocabulary can be larger than its tokenizer's) left out; the ids are recorded
  // exactly. Same rule as `atlas generate`.
  auto text_of = [tok](const std::vector<int32_t>& ids) -> ojson {
    if (!tok) return nullptr;
    return tok->decode(ids, {.skip_special_tokens = true, .skip_unknown_ids = true});
  };
  std::map<int64_t, ojson> results;
  for (size_t i = 0; i < gen.size(); ++i) {
    const ojson& c = cells[size_t(members[i])];
    if (gen[i].prompt_sha256 != c["prompt_sha256"].get<std::string>())
      fail("run", c["cell_id"].get<std::string>(), "prompt hash differs from the manifest");
    ojson r;
    r["mode"] = "generate";
    r["sampling"] = {{"mode", mode},
                     {"seed", rows[i].sampling.mode == decode::SamplingMode::Greedy ? ojson(nullptr) : ojson(rows[i].sampling.seed)},
                     {"stream", rows[i].sampling.mode == decode::SamplingMode::Seeded ? ojson(rows[i].sampling.stream) : ojson(nullptr)},
                     {"crn_row_key", rows[i].sampling.mode == decode::SamplingMode::Crn ? ojson(rows[i].sampling.crn_row_key) : ojson(nullptr)}};
    r["generated_ids"] = gen[i].ids;
    r["generated_ids_sha256"] = ids_sha256(gen[i].ids);
    r["text"] = text_of(gen[i].ids);
    r["stop"] = std::string(decode::stop_reason_name(gen[i].stop));
    r["n_new"] = gen[i].n_new;
    r["rng_state_sha256"] = gen[i].rng_state_sha256.empty() ? ojson(nullptr) : ojson(gen[i].rng_state_sha256);
    results[members[i]] = std::move(r);
  }
  return results;
}

ojson artifact_head(const ojson& m, const ojson& model_info, const ojson& shard) {
  ojson a;
  a["kind"] = "atlas.probe.run";
  a["format_version"] = 1;
  a["manifest_sha256"] = m["manifest_sha256"];
  a["protocol"] = {{"name", m["protocol"]["name"]}, {"sha256", m["protocol"]["sha256"]},
                   {"seed_section", m["protocol"]["seed_section"]}};
  a["execution"] = m["protocol"]["execution"];
  a["model"] = model_info;
  a["tokenizer"] = m["tokenizer"];
  a["shard"] = shard;
  return a;
}

// What produced the run (docs/audit.md, "Provenance fields"): the build, the backend and its
// device, the compute mode, the model's pinned files, the protocol, the manifest and the seeds.
// Outside the content hash: a rerun with another build or on another device that gives the
// same results has the same content_sha256.
ojson run_provenance(const ojson& m, const std::string& backend, int device, const std::string& model_dir) {
  ojson p = build_provenance();
  p["device"] = device_provenance(backend, device);
  const ojson& ex = m["protocol"]["execution"];
  p["compute"] = ex["compute"];
  const std::string pin = m["model"]["manifest"].is_string() ? m["model"]["manifest"].get<std::string>() : "";
  p["model"] = {{"config_sha256", file_exists(model_dir + "/config.json") ? ojson(sha256_file(model_dir + "/config.json")) : ojson(nullptr)},
                {"manifest", pin},
                {"manifest_sha256", !pin.empty() && file_exists(pin) ? ojson(sha256_file(pin)) : ojson(nullptr)}};
  p["protocol_sha256"] = m["protocol"]["sha256"];
  p["manifest_sha256"] = m["manifest_sha256"];
  ojson seeds = ojson::array();
  if (ex.contains("seeds"))
    for (const auto& sd : ex["seeds"]) seeds.push_back(sd.is_object() ? sd.value("value", ojson(nullptr)) : sd);
  p["seeds"] = seeds;
  return p;
}

// The run's input record: the manifest file, relative to the run directory (hash-chain link).
ojson manifest_input(const std::string& manifest, const std::string& out_dir) {
  ojson r = {{"role", "manifest"}};
  r.update(audit::input_record_json(audit::input_record(manifest, out_dir)));
  return ojson::array({r});
}

}  // namespace

RunSummary run_manifest(const RunOptions& o) {
  RuntimeClock clock;
  const auto started = std::chrono::steady_clock::now();
  const ojson m = load_manifest(o.manifest);
  const std::string msha = m["manifest_sha256"].get<std::string>();
  const ojson& cells = m["cells"];
  const ojson& ex = m["protocol"]["execution"];
  const std::string model_dir = o.model_dir.empty() ? m["model"]["dir"].get<std::string>() : o.model_dir;

  // This shard's batches and sources.
  std::vector<int64_t> batch_ids;
  std::vector<std::string> source_order;
  std::map<std::string, std::vector<int64_t>> source_cells;
  for (const auto& b : m["batches"]) {
    if (b["unit"].get<int64_t>() % o.shard.count != o.shard.index) continue;
    batch_ids.push_back(b["index"].get<int64_t>());
    for (const auto& ci : b["cells"]) {
      const std::string key = cells[ci.get<size_t>()]["source_key"].get<std::string>();
      if (!source_cells.count(key)) source_order.push_back(key);
      source_cells[key].push_back(ci.get<int64_t>());
    }
  }
  for (auto& [k, v] : source_cells) std::sort(v.begin(), v.end());

  // The model's config against the manifest before anything is written: a bad range or another
  // config leaves no journal directory behind.
  const ModelConfig cfg0 = ModelConfig::load(model_dir + "/config.json");
  LayerRange range = LayerRange::all(cfg0);
  if (ex["mode"] == "trace")
    range = protocol_layers(ex["layers"].get<std::string>(), cfg0, model_dir, o.manifest, "protocol.execution.layers");
  if (!m["model"]["config_sha256"].is_null() &&
      sha256_file(model_dir + "/config.json") != m["model"]["config_sha256"].get<std::string>())
    fail(model_dir + "/config.json", "config_sha256", "differs from the one recorded when the manifest was frozen");
  // The files hook edits read (add:FILE) are the ones frozen, byte for byte, found where freeze
  // recorded them: relative to the manifest's directory (absolute paths as given).
  const std::string files_base = manifest_files_base(o.manifest);
  if (m.contains("intervention_files"))
    for (const auto& [recorded, sha] : m["intervention_files"].items()) {
      const std::string path = manifest_file_path(files_base, recorded);
      if (!file_exists(path)) fail(path, {}, "a hook edit's file of the manifest is not found");
      if (sha256_file(path) != sha.get<std::string>())
        fail(path, "sha256", "differs from the one recorded when the manifest was frozen (" + sha.get<std::string>() + ")");
    }
  // The cells' hook edits against the model, also before anything is written.
  CellEdits cell_edits;
  for (const auto& [key, members] : source_cells)
    for (int64_t ci : members) {
      const ojson& c = cells[size_t(ci)];
      if (!c.contains("interventions")) continue;
      try {
        auto e = std::make_unique<Interventions>(c["interventions"].get<std::vector<std::string>>(), cfg0, range,
                                                 range.last == cfg0.num_hidden_layers - 1, true, files_base);
        // patch:@CONDITION: the same source's cell of that condition (same seed and content
        // length) must run in this cell's batch, where its row is read.
        for (const Intervention& iv : e->list()) {
          if (iv.action != InterventionAction::PatchRow) continue;
          bool found = false;
          for (int64_t cj : source_cells.at(key)) {
            const ojson& d = cells[size_t(cj)];
            if (d["condition"].get<std::string>() != iv.source_condition || d["seed"] != c["seed"] ||
                d["content_tokens"] != c["content_tokens"])
              continue;
            if (d["batch"] != c["batch"]) fail("'" + iv.spec + "': the " + iv.source_condition + " cell runs in another batch");
            found = true;
          }
          if (!found) fail("'" + iv.spec + "': no " + iv.source_condition + " cell of this source");
        }
        e->check_tokens(c["n_tokens"].get<int64_t>(), "the cell's tokens");
        if (ex["mode"] != "trace") e->check_for_generation();
        cell_edits[ci] = std::move(e);
      } catch (const Error& err) {
        fail(o.manifest, c["cell_id"].get<std::string>(), err.what());
      }
    }

  // Directories are made when the first file goes into them: a run that fails before any
  // output (a bad --backend, weights that do not load) leaves no empty journal/ behind.
  const std::string jdir = o.out_dir + "/journal";
  if (fs::exists(o.out_dir) && !fs::is_directory(o.out_dir)) fail(o.out_dir, "--out", "exists and is not a directory");
  const bool have_jdir = fs::is_directory(jdir);
  std::map<int64_t, ojson> results;
  std::set<std::string> done;
  if (!o.resume && have_jdir) {
    for (const auto& e : fs::directory_iterator(jdir))
      if (e.path().extension() == ".jsonl")
        fail(e.path().string(), {}, "a journal already exists in --out; pass --resume to continue it, or use a fresh directory");
  }
  if (o.resume && have_jdir) {
    // Every journal in the directory must belong to this manifest, including sources of other shards.
    for (const auto& e : fs::directory_iterator(jdir)) {
      if (e.path().extension() != ".jsonl") continue;
      std::istringstream in(read_file(e.path().string()));
      std::string first;
      std::getline(in, first);
      const std::string where = e.path().string() + ":1";
      ojson h;
      try {
        h = ojson::parse(first);
      } catch (const std::exception&) {
        fail(where, {}, "malformed journal header");
      }
      if (!h.is_object() || !h.contains("line_sha256") || line_hash(h) != h["line_sha256"].get<std::string>())
        fail(where, "line_sha256", "journal line does not match its hash");
      if (string_or_empty(h, "manifest_sha256") != msha)
        fail(where, "manifest_sha256", "this journal belongs to another manifest (" + string_or_empty(h, "manifest_sha256") + ")");
    }
  }
  int64_t resumed = 0;
  for (const auto& key : source_order) {
    const std::string jp = jdir + "/" + journal_name(key);
    if (!o.resume || !file_exists(jp)) continue;
    Journal j = read_journal(jp, msha, key, source_cells[key], cells);
    for (auto& [ci, r] : j.results) results[ci] = std::move(r);
    done.insert(key);
    resumed += int64_t(source_cells[key].size());
  }

  int64_t total_cells = 0;
  for (const auto& [k, v] : source_cells) total_cells += int64_t(v.size());

  // The model: only when something is left to run.
  std::optional<Checkpoint> ck;
  std::unique_ptr<Model> model;
  std::optional<Tokenizer> tok;
  ojson model_info = {{"config_sha256", sha256_file(model_dir + "/config.json")},
                      {"layers", std::to_string(range.first) + "-" + std::to_string(range.last)},
                      {"compute", ex["compute"]},
                      {"backend", o.backend}};
  const bool vectors = ex.value("record_hidden_vectors", false);
  std::map<int64_t, CellVectors> pending_vectors;
  auto hidden_path = [&](const std::string& key) {
    std::string n = journal_name(key);
    return o.out_dir + "/hidden/" + n.substr(0, n.size() - 6) + ".safetensors";
  };
  if (vectors) {
    // A journaled source's side file: this manifest's and this source's, every row as the
    // journal's stage hashes say (a file truncated or rewritten since is refused, not reused).
    for (const auto& key : done) {
      const std::string hp = hidden_path(key);
      if (!file_exists(hp)) fail(hp, {}, "journaled source without its hidden-vector file");
      const auto file = SafetensorsFile::open(hp);
      const auto meta = [&](const char* k) {
        auto it = file->metadata().find(k);
        return it == file->metadata().end() ? std::string() : it->second;
      };
      if (meta("manifest_sha256") != msha || meta("source_key") != key)
        fail(hp, "__metadata__", "belongs to manifest " + meta("manifest_sha256") + ", source " + meta("source_key") +
                                     ", not this journal's (" + msha + ", " + key + ")");
      int64_t checked = 0;
      for (int64_t ci : source_cells[key]) {
        const std::string bad = check_cell_vectors(results.at(ci), [&](const std::string& n) { return file->find(n); }, checked);
        if (!bad.empty())
          fail(hp, cells[size_t(ci)]["cell_id"].get<std::string>(), bad + " (--resume: delete the source's journal to re-run it)");
      }
    }
  }
  int64_t tokens = 0, cells_run = 0;
  const char* abort_env = std::getenv("ATLAS_PROBE_ABORT_AFTER_SOURCES");  // test hook: simulates a kill
  int64_t journaled_now = 0;
  for (int64_t bi : batch_ids) {
    const ojson& b = m["batches"][size_t(bi)];
    std::vector<int64_t> members;
    bool pending = false;
    for (const auto& ci : b["cells"]) {
      members.push_back(ci.get<int64_t>());
      if (!results.count(ci.get<int64_t>())) pending = true;
    }
    if (!pending) continue;
    if (!model) {
      ck.emplace(Checkpoint::open(model_dir, {.layers = range, .manifest_path = m["model"]["manifest"].get<std::string>()}));
      model = load_model(*ck, {.backend = o.backend, .compute = parse_compute(ex["compute"].get<std::string>()),
                               .device = o.device});
      if (file_exists(model_dir + "/tokenizer.json")) tok.emplace(Tokenizer::load_dir(model_dir));
    }
    std::map<int64_t, ojson> br =
        ex["mode"] == "trace" ? run_trace_batch(*model, m, members, ex["record_routes"].get<bool>(), ex["record_hidden"].get<bool>(),
                                                vectors, pending_vectors, cell_edits)
                              : run_generate_batch(*model, tok ? &*tok : nullptr, m, members, cell_edits);
    for (auto& [ci, r] : br) {
      // A batch re-run for a source that was already journaled must reproduce it exactly.
      if (results.count(ci)) {
        if (results[ci] != r) fail(o.out_dir, cells[size_t(ci)]["cell_id"].get<std::string>(), "re-run differs from the journal");
        continue;
      }
      tokens += cells[size_t(ci)]["n_tokens"].get<int64_t>();
      if (r.contains("n_new")) tokens += r["n_new"].get<int64_t>();
      results[ci] = std::move(r);
      ++cells_run;
    }
    // Journal every source whose cells are now complete.
    for (const auto& key : source_order) {
      if (done.count(key)) continue;
      const auto& sc = source_cells[key];
      if (!std::all_of(sc.begin(), sc.end(), [&](int64_t ci) { return results.count(ci) > 0; })) continue;
      if (vectors) {
        // The side file first: the journal is what marks the source done.
        std::vector<TensorToWrite> tensors;
        for (int64_t ci : sc)
          for (const auto& [name, v] : pending_vectors.at(ci))
            tensors.push_back({.name = "cell" + std::to_string(ci) + "." + name, .dtype = DType::F32,
                               .shape = {int64_t(v.size()) / cfg0.hidden_size, cfg0.hidden_size}, .data = v.data()});
        fs::create_directories(o.out_dir + "/hidden");
        write_safetensors(hidden_path(key), tensors, {{"manifest_sha256", msha}, {"source_key", key}});
        for (int64_t ci : sc) pending_vectors.erase(ci);
      }
      fs::create_directories(jdir);
      write_journal(jdir + "/" + journal_name(key), msha, key, sc, cells, results);
      done.insert(key);
      ++journaled_now;
      if (abort_env && journaled_now >= std::atoll(abort_env)) {
        std::fprintf(stderr, "run: ATLAS_PROBE_ABORT_AFTER_SOURCES reached, stopping abruptly\n");
        std::_Exit(3);
      }
    }
    if (o.progress) {
      const double el = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
      const int64_t have = int64_t(results.size());
      const double rate = cells_run > 0 ? el / double(cells_run) : 0;
      std::fprintf(stderr, "run: cells %lld/%lld  %.0f tok/s  ETA %s\n", (long long)have, (long long)total_cells,
                   el > 0 ? double(tokens) / el : 0.0, format_hms(rate * double(total_cells - have)).c_str());
    }
  }

  ojson shard = o.sharded ? ojson({{"index", o.shard.index}, {"count", o.shard.count}}) : ojson(nullptr);
  fs::create_directories(o.out_dir);  // a shard without batches has written nothing before
  ojson a = artifact_head(m, model_info, shard);
  a["inputs"] = manifest_input(o.manifest, o.out_dir);
  a["provenance"] = run_provenance(m, o.backend, o.device, model_dir);
  ojson out_cells = ojson::array();
  std::vector<int64_t> order;
  for (const auto& [k, v] : source_cells) order.insert(order.end(), v.begin(), v.end());
  std::sort(order.begin(), order.end());
  for (int64_t ci : order) {
    ojson c = cell_header(cells[size_t(ci)]);
    c["result"] = results.at(ci);
    out_cells.push_back(std::move(c));
  }
  a["cells"] = out_cells;
  a["content_sha256"] = artifact_content_hash(a);
  a["runtime"] = runtime_section(clock);
  a["runtime"]["cells_run"] = cells_run;
  a["runtime"]["cells_resumed"] = resumed;
  a["runtime"]["tokens"] = tokens;
  a["runtime"]["model_dir"] = model_dir;
  RunSummary s{.cells = int64_t(order.size()), .cells_run = cells_run, .cells_resumed = resumed,
               .sources = int64_t(source_order.size()), .tokens = tokens, .artifact = o.out_dir + "/run.json",
               .content_sha256 = a["content_sha256"].get<std::string>()};
  write_file_atomic(s.artifact, a.dump(1) + "\n");
  return s;
}

RunSummary merge_runs(const MergeOptions& o) {
  RuntimeClock clock;
  const ojson m = load_manifest(o.manifest);
  const std::string msha = m["manifest_sha256"].get<std::string>();
  const size_t n = m["cells"].size();
  std::vector<ojson> by_index(n);
  std::vector<bool> seen(n, false);
  std::optional<ojson> head;
  std::set<int64_t> shard_ids;
  std::optional<int64_t> count;
  ojson runtimes = ojson::array();
  if (o.shard_dirs.empty()) fail("merge", {}, "no shard directories given");
  for (const auto& d : o.shard_dirs) {
    const std::string path = d + "/run.json";
    if (!file_exists(path)) fail(path, {}, "shard artifact not found");
    ojson a;
    try {
      a = ojson::parse(read_file(path));
    } catch (const std::exception& e) {
      fail(path, {}, std::string("malformed JSON: ") + e.what());
    }
    if (string_or_empty(a, "kind") != "atlas.probe.run") fail(path, "kind", "not an atlas probe run artifact");
    if (string_or_empty(a, "manifest_sha256") != msha) fail(path, "manifest_sha256", "shard of another manifest");
    if (a["content_sha256"] != artifact_content_hash(a)) fail(path, "content_sha256", "does not match the content");
    if (!a["shard"].is_object()) fail(path, "shard", "not a shard artifact (run with --shard i/n)");
    const int64_t si = a["shard"]["index"].get<int64_t>(), sc = a["shard"]["count"].get<int64_t>();
    if (count && *count != sc) fail(path, "shard.count", "shards of different splits");
    count = sc;
    if (!shard_ids.insert(si).second) fail(path, "shard.index", "shard " + std::to_string(si) + " given twice");
    ojson h = a;
    h.erase("cells");
    h.erase("runtime");
    h.erase("content_sha256");
    h["shard"] = nullptr;
    // Provenance (machine, build) and input paths (relative to each shard's directory) may
    // differ between shards; the merged artifact keeps the first shard's provenance and lists
    // every shard's under runtime.merged_from.
    ojson hc = h;
    hc.erase("provenance");
    hc.erase("inputs");
    if (head) {
      ojson hh = *head;
      hh.erase("provenance");
      hh.erase("inputs");
      if (hh != hc) fail(path, {}, "shard header differs from the first shard's (model, execution or tokenizer)");
    } else {
      head = h;
    }
    for (auto& c : a["cells"]) {
      const int64_t idx = c["index"].get<int64_t>();
      if (idx < 0 || size_t(idx) >= n || m["cells"][size_t(idx)]["cell_id"] != c["cell_id"])
        fail(path, c["cell_id"].dump(), "cell is not in the manifest");
      if (seen[size_t(idx)]) fail(path, c["cell_id"].get<std::string>(), "cell present in two shards");
      seen[size_t(idx)] = true;
      by_index[size_t(idx)] = c;
    }
    ojson rec = audit::input_record_json(audit::input_record(path, o.out_dir));
    runtimes.push_back({{"shard", a["shard"]}, {"artifact", rec},
                        {"provenance", a.contains("provenance") ? a["provenance"] : ojson(nullptr)},
                        {"runtime", a["runtime"]}});
  }
  int64_t missing = 0;
  std::string first_missing;
  for (size_t i = 0; i < n; ++i)
    if (!seen[i]) {
      if (!missing) first_missing = m["cells"][i]["cell_id"].get<std::string>();
      ++missing;
    }
  if (missing) fail(o.out_dir, "cells", std::to_string(missing) + " cells missing from the shards, first " + first_missing);
  ojson a = *head;
  a["inputs"] = manifest_input(o.manifest, o.out_dir);  // as an unsharded run's; the shards are in runtime
  a["cells"] = by_index;
  a["content_sha256"] = artifact_content_hash(a);
  a["runtime"] = runtime_section(clock);
  a["runtime"]["merged_from"] = runtimes;
  fs::create_directories(o.out_dir);
  RunSummary s{.cells = int64_t(n), .cells_run = 0, .cells_resumed = 0, .sources = 0, .tokens = 0,
               .artifact = o.out_dir + "/run.json", .content_sha256 = a["content_sha256"].get<std::string>()};
  write_file_atomic(s.artifact, a.dump(1) + "\n");
  return s;
}

}  // namespace atlas::probe
