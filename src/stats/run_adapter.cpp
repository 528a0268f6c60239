// Probe run artifacts -> AnalysisInput (rules in docs/stats.md, "Probe run artifacts").
#include "stats/run_adapter.h"

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <set>

#include "core/error.h"
#include "core/file.h"
#include "core/json.h"
#include "core/sha256.h"
#include "io/safetensors.h"

namespace atlas::stats {

namespace {
namespace fs = std::filesystem;

constexpr const char* kRunKind = "atlas.probe.run";

std::string at(const std::string& field, size_t i) { return field + "[" + std::to_string(i) + "]"; }

std::string run_json_path(const std::string& path) {
  return fs::is_directory(path) ? (fs::path(path) / "run.json").string() : path;
}

// Layer and seed labels are integers in the artifact; the analysis names them by strings.
std::string label(const json& v) { return v.is_string() ? v.get<std::string>() : v.dump(); }

// Every hidden-vector tensor of a run directory, by name (cellN.<stage>); the files stay mapped.
struct HiddenFiles {
  std::vector<std::shared_ptr<SafetensorsFile>> files;
  std::map<std::string, const TensorView*> tensors;
};

HiddenFiles open_hidden(const std::string& run_dir, const std::string& manifest_sha) {
  HiddenFiles h;
  const fs::path dir = fs::path(run_dir) / "hidden";
  if (!fs::is_directory(dir)) return h;
  std::vector<std::string> paths;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.path().extension() == ".safetensors") paths.push_back(e.path().string());
  std::sort(paths.begin(), paths.end());  // deterministic, independent of directory order
  for (const auto& p : paths) {
    auto f = SafetensorsFile::open(p);
    auto it = f->metadata().find("manifest_sha256");
    if (it == f->metadata().end() || it->second != manifest_sha)
      fail(p, "__metadata__.manifest_sha256", "does not match the run's manifest_sha256 " + manifest_sha);
    for (const auto& t : f->tensors())
      if (!h.tensors.emplace(t.name, &t).second) fail(p, t.name, "tensor also present in another hidden file");
    h.files.push_back(std::move(f));
  }
  return h;
}

uint32_t experts_from_config(const std::string& model_dir, const json& run, const std::string& file) {
  const std::string cfg = (fs::path(model_dir) / "config.json").string();
  if (!file_exists(cfg))
    fail(file, "runtime.model_dir",
         "model config " + cfg + " not found (the expert count comes from it); pass --model DIR");
  const std::string want = JsonReader(run, file).child("model").get_or<std::string>("config_sha256", "");
  if (!want.empty() && sha256_file(cfg) != want)
    fail(cfg, "config_sha256", "differs from the run's model.config_sha256 " + want + " (another model?)");
  const json c = read_json_file(cfg);
  const int64_t e = JsonReader(c, cfg).get_or<int64_t>("n_routed_experts", 0);
  if (e <= 0) fail(cfg, "n_routed_experts", "expected a positive expert count");
  return uint32_t(e);
}

struct Loaded {
  std::string path, dir, text;
  json j;
};

// A generate-mode cell of the runs, for the EVAL.json join.
struct GenCell {
  size_t cell = 0;          // index into AnalysisInput::cells
  std::string text_sha256;  // "" when the run's text is null
  std::string stop;
};

uint32_t condition_index(const AnalysisInput& in, const JsonReader& r, const std::string& key) {
  const std::string name = r.get<std::string>(key);
  for (uint32_t i = 0; i < in.conditions.size(); ++i)
    if (in.conditions[i] == name) return i;
  fail(r.file(), r.field(key), "unknown condition \"" + name + "\" (not in protocol.conditions)");
}

// protocol.edges / protocol.factorials of a frozen manifest (docs/probe.md), when declared.
void read_design(const json& manifest, const std::string& file, AnalysisInput& in) {
  const JsonReader p = JsonReader(manifest, file).child("protocol");
  if (p.has_value("edges")) {
    const json& ea = p.raw("edges");
    if (!ea.is_array()) fail(file, p.field("edges"), "expected an array");
    for (size_t i = 0; i < ea.size(); ++i) {
      const JsonReader e(ea[i], file, at(p.field("edges"), i));
      in.edges.push_back({.name = e.get<std::string>("name"),
                          .condition = condition_index(in, e, "condition"),
                          .reference = condition_index(in, e, "reference")});
    }
  }
  if (p.has_value("factorials")) {
    const json& fa = p.raw("factorials");
    if (!fa.is_array()) fail(file, p.field("factorials"), "expected an array");
    for (size_t i = 0; i < fa.size(); ++i) {
      const JsonReader e(fa[i], file, at(p.field("factorials"), i));
      Factorial f{.name = e.get<std::string>("name"), .factor_a = e.get<std::string>("a"), .factor_b = e.get<std::string>("b")};
      f.cell[0][0] = condition_index(in, e, "a0b0");
      f.cell[1][0] = condition_index(in, e, "a1b0");
      f.cell[0][1] = condition_index(in, e, "a0b1");
      f.cell[1][1] = condition_index(in, e, "a1b1");
      in.factorials.push_back(f);
    }
  }
}

// Joins the verdicts of EVAL.json files (`atlas eval RUN --manifest M`, docs/eval.md) into the
// cells: coverage.evaluated -> evaluable, correctness -> correct (not_evaluated: no verdict),
// terminal.state -> terminal. Checks that each file belongs to these runs (manifest and run
// content hashes) and judged the same text and stop as the run holds; with allow_mismatch the
// mismatches are counted in in.eval_join instead of refused.
void join_evals(const RunAdapterOptions& opt, AnalysisInput& in, const std::map<std::string, GenCell>& gen,
                const std::set<std::string>& run_contents) {
  const std::string hint = " (pass --allow-mixed to join it anyway)";
  std::set<std::string> judged;
  ojson files = ojson::array();
  int64_t mismatched_cells = 0;
  for (const std::string& path : opt.evals) {
    const std::string text = read_file(path);
    const json j = parse_json(text, path);
    const JsonReader r(j, path);
    if (r.get_or<std::string>("kind", "") != "atlas.eval") fail(path, "kind", "expected \"atlas.eval\" (an EVAL.json of atlas eval)");
    if (r.get<int64_t>("format_version") != 1) fail(path, "format_version", "expected 1");
    const JsonReader run = r.child("run");
    const std::string msha = run.get<std::string>("manifest_sha256");
    const std::string csha = run.has_value("content_sha256") ? run.get<std::string>("content_sha256") : "";
    const bool manifest_ok = msha == in.manifest_sha256, run_ok = run_contents.count(csha) > 0;
    if (!manifest_ok && !opt.allow_mismatch)
      fail(path, "run.manifest_sha256", "is " + msha + ", the runs' manifest is " + in.manifest_sha256 + hint);
    if (!run_ok && !opt.allow_mismatch)
      fail(path, "run.content_sha256",
           "\"" + csha + "\" is the content_sha256 of none of the run artifacts given (evaluated another run?)" + hint);
    const json& cells = r.raw("cells");
    if (!cells.is_array()) fail(path, "cells", "expected an array");
    int64_t joined = 0, mismatched = 0;
    for (size_t i = 0; i < cells.size(); ++i) {
      const JsonReader c(cells[i], path, at("cells", i));
      const std::string id = c.get<std::string>("cell_id");
      const auto g = gen.find(id);
      if (g == gen.end()) {
        if (!opt.allow_mismatch) fail(path, c.field("cell_id"), "\"" + id + "\" is not a generate-mode cell of the runs" + hint);
        ++mismatched;
        continue;
      }
      if (!judged.insert(id).second) fail(path, c.field("cell_id"), "\"" + id + "\" is judged by two EVAL.json entries");
      const json& ts = c.raw("text_sha256");
      const std::string tsha = ts.is_null() ? "" : c.get<std::string>("text_sha256");
      const std::string stop = c.get<std::string>("stop");
      if (tsha != g->second.text_sha256 || stop != g->second.stop) {
        if (!opt.allow_mismatch)
          fail(path, c.field(tsha != g->second.text_sha256 ? "text_sha256" : "stop"),
               "cell \"" + id + "\": the evaluated output is not the run's" + hint);
        ++mismatched;
      }
      Cell& cell = in.cells[g->second.cell];
      cell.evaluable = c.child("coverage").get<bool>("evaluated");
      const std::string verdict = c.get<std::string>("correctness");
      if (verdict == "correct" || verdict == "incorrect") cell.correct = verdict == "correct";
      else if (verdict != "not_evaluated")
        fail(path, c.field("correctness"), "expected correct, incorrect or not_evaluated, got \"" + verdict + "\"");
      cell.terminal = c.child("terminal").get<std::string>("state");
      ++joined;
    }
    mismatched_cells += mismatched;
    in.files.push_back({.path = path, .sha256 = sha256_hex(text)});
    files.push_back({{"path", path}, {"manifest_sha256_matches", manifest_ok}, {"run_content_sha256_matches", run_ok},
                     {"cells", cells.size()}, {"joined", joined}, {"mismatched", mismatched}});
  }
  in.eval_join = {{"files", files},
                  {"generated_cells", gen.size()},
                  {"cells_with_verdict_record", judged.size()},
                  {"cells_without_verdict_record", int64_t(gen.size()) - int64_t(judged.size())},
                  {"mismatched_cells", mismatched_cells},
                  {"allow_mismatch", opt.allow_mismatch},
                  {"mapping", "coverage.evaluated -> evaluable; correctness correct/incorrect -> correct, not_evaluated "
                              "-> no verdict; terminal.state -> terminal"}};
}

}  // namespace

bool is_run_artifact(const std::string& path) {
  if (fs::is_directory(path)) return file_exists((fs::path(path) / "run.json").string());
  std::ifstream f(path, std::ios::binary);
  if (!f) return false;
  std::string head(4096, '\0');
  f.read(head.data(), std::streamsize(head.size()));
  head.resize(size_t(f.gcount()));
  // The artifact's first key is "kind"; an analysis-input file starts with "format".
  const size_t k = head.find("\"kind\"");
  return k != std::string::npos && head.find(std::string("\"") + kRunKind + "\"", k) != std::string::npos;
}

AnalysisInput read_run_artifacts(const RunAdapterOptions& opt) {
  if (opt.runs.empty()) fail("no run artifact given");
  std::vector<Loaded> runs;
  for (const auto& p : opt.runs) {
    Loaded l;
    l.path = run_json_path(p);
    l.dir = fs::path(l.path).parent_path().string();
    if (l.dir.empty()) l.dir = ".";
    l.text = read_file(l.path);
    l.j = parse_json(l.text, l.path);
    const JsonReader r(l.j, l.path);
    if (r.get_or<std::string>("kind", "") != kRunKind) fail(l.path, "kind", std::string("expected \"") + kRunKind + "\"");
    if (r.get<int64_t>("format_version") != 1) fail(l.path, "format_version", "expected 1");
    runs.push_back(std::move(l));
  }

  AnalysisInput in;
  in.manifest_sha256 = JsonReader(runs[0].j, runs[0].path).get<std::string>("manifest_sha256");
  for (const auto& l : runs) {
    // Shards of one manifest only: edges and conditions come from that one manifest.
    if (JsonReader(l.j, l.path).get<std::string>("manifest_sha256") != in.manifest_sha256)
      fail(l.path, "manifest_sha256", "differs from " + runs[0].path + " (run artifacts of one manifest only)");
    in.files.push_back({.path = l.path, .sha256 = sha256_hex(l.text)});
  }

  // Conditions: the manifest's declared order when it is given, else first appearance in the
  // cells (the run keeps the manifest's cell order, so the same order for a complete run).
  json manifest;
  if (!opt.manifest.empty()) {
    const std::string text = read_file(opt.manifest);
    manifest = parse_json(text, opt.manifest);
    const JsonReader mr(manifest, opt.manifest);
    if (mr.get_or<std::string>("kind", "") != "atlas.probe.manifest")
      fail(opt.manifest, "kind", "not an atlas probe manifest");
    if (mr.get<std::string>("manifest_sha256") != in.manifest_sha256)
      fail(opt.manifest, "manifest_sha256", "is not the manifest of " + runs[0].path + " (" + in.manifest_sha256 + ")");
    const json& conds = mr.child("protocol").raw("conditions");
    if (!conds.is_array() || conds.empty()) fail(opt.manifest, "protocol.conditions", "expected a non-empty array");
    for (size_t i = 0; i < conds.size(); ++i)
      in.conditions.push_back(JsonReader(conds[i], opt.manifest, at("protocol.conditions", i)).get<std::string>("name"));
    read_design(manifest, opt.manifest, in);
    in.files.push_back({.path = opt.manifest, .sha256 = sha256_hex(text)});
  }
  const bool declared = !in.conditions.empty();
  std::map<std::string, uint32_t> cond, src, dom;
  for (size_t i = 0; i < in.conditions.size(); ++i) cond[in.conditions[i]] = uint32_t(i);

  std::set<std::string> layer_set;
  bool stages_set = false;
  std::map<std::string, GenCell> gen_cells;  // by cell_id, for the EVAL.json join
  std::set<std::string> run_contents;        // content_sha256 of every run artifact
  for (const auto& l : runs)
    if (l.j.contains("content_sha256") && l.j["content_sha256"].is_string())
      run_contents.insert(l.j["content_sha256"].get<std::string>());
  for (const auto& l : runs) {
    const std::string& f = l.path;
    const JsonReader r(l.j, f);
    const json& cells = r.raw("cells");
    if (!cells.is_array() || cells.empty()) fail(f, "cells", "expected a non-empty array");
    HiddenFiles hidden;
    bool hidden_opened = false;
    for (size_t i = 0; i < cells.size(); ++i) {
      const JsonReader cr(cells[i], f, at("cells", i));
      Cell c;
      c.id = cr.get<std::string>("cell_id");
      // source_key, not source_id: inline corpora number their texts per domain, so only the
      // key (domain-qualified) is unique across domains.
      const std::string sid = cr.get<std::string>("source_key"), d = cr.get<std::string>("domain");
      if (!dom.count(d)) {
        dom[d] = uint32_t(in.domains.size());
        in.domains.push_back(d);
      }
      auto sit = src.find(sid);
      if (sit == src.end()) {
        sit = src.emplace(sid, uint32_t(in.sources.size())).first;
        in.sources.push_back({.id = sid, .domain = dom[d]});
      } else if (in.sources[sit->second].domain != dom[d]) {
        fail(f, cr.field("domain"), "source_key \"" + sid + "\" appears with two domains");
      }
      c.source = sit->second;
      const std::string cn = cr.get<std::string>("condition");
      if (!cond.count(cn)) {
        if (declared) fail(f, cr.field("condition"), "condition \"" + cn + "\" is not in the manifest's protocol");
        cond[cn] = uint32_t(in.conditions.size());
        in.conditions.push_back(cn);
      }
      c.condition = cond[cn];

      const JsonReader res = cr.child("result");
      const std::string mode = res.get<std::string>("mode");
      // Generations repeat per sampling seed; edges pair cells of the same seed.
      if (mode == "generate" && cr.has_value("seed")) c.repeat = label(cr.raw("seed"));
      c.tokens = cr.get<uint32_t>("n_tokens");
      const json& ir = cr.raw("interior_token_range");
      if (!ir.is_array() || ir.size() != 2 || !ir[0].is_number_integer() || !ir[1].is_number_integer())
        fail(f, cr.field("interior_token_range"), "expected [begin, end)");
      const int64_t a = ir[0].get<int64_t>(), e = ir[1].get<int64_t>();
      if (a < 0 || e <= a || e > int64_t(c.tokens))
        fail(f, cr.field("interior_token_range"),
             "expected 0 <= begin < end <= n_tokens = " + std::to_string(c.tokens) + ", got [" + std::to_string(a) +
                 ", " + std::to_string(e) + ") (an empty target scope cannot be analysed)");

      if (res.has_value("routes")) {
        const json& rt = res.raw("routes");
        const std::string fr = res.field("routes");
        if (!rt.is_array() || rt.empty()) fail(f, fr, "expected one entry per MoE layer");
        if (in.layers.empty()) {
          for (size_t li = 0; li < rt.size(); ++li) {
            const std::string name = label(JsonReader(rt[li], f, at(fr, li)).raw("layer"));
            if (!layer_set.insert(name).second) fail(f, at(fr, li) + ".layer", "repeated layer " + name);
            in.layers.push_back(name);
          }
        }
        if (rt.size() != in.layers.size())
          fail(f, fr, "has " + std::to_string(rt.size()) + " layers, another cell " + std::to_string(in.layers.size()));
        const size_t T = c.tokens;
        for (size_t li = 0; li < rt.size(); ++li) {
          const JsonReader lr(rt[li], f, at(fr, li));
          if (label(lr.raw("layer")) != in.layers[li]) fail(f, lr.field("layer"), "expected layer " + in.layers[li]);
          const json& ids = lr.raw("topk_ids");
          const json& ws = lr.raw("topk_weights");
          if (!ids.is_array() || ids.size() != T || !ws.is_array() || ws.size() != T)
            fail(f, lr.field("topk_ids"), "expected " + std::to_string(T) + " token rows (n_tokens, no padding)");
          for (size_t t = 0; t < T; ++t) {
            if (!ids[t].is_array() || ids[t].empty() || !ws[t].is_array() || ws[t].size() != ids[t].size())
              fail(f, at(lr.field("topk_ids"), t), "expected k ids with k weights");
            if (in.top_k == 0) in.top_k = uint32_t(ids[t].size());
            if (ids[t].size() != in.top_k)
              fail(f, at(lr.field("topk_ids"), t), "expected top_k = " + std::to_string(in.top_k) + " ids");
            for (size_t q = 0; q < ids[t].size(); ++q) {
              if (!ids[t][q].is_number_integer() || !ws[t][q].is_number())
                fail(f, at(at(lr.field("topk_ids"), t), q), "expected an expert id and a weight");
              c.topk_ids.push_back(ids[t][q].get<int32_t>());
              c.topk_weights.push_back(ws[t][q].get<float>());
            }
          }
        }
        c.target.assign(T, 0);
        for (int64_t t = a; t < e; ++t) c.target[size_t(t)] = 1;
      }

      if (res.has_value("hidden_vectors")) {
        if (!hidden_opened) {
          hidden = open_hidden(l.dir, in.manifest_sha256);
          hidden_opened = true;
        }
        const std::string prefix = res.child("hidden_vectors").get<std::string>("tensor_prefix");
        const json& st = res.raw("stages");  // the stage list (record_hidden) names the tensors
        if (!st.is_array() || st.empty()) fail(f, res.field("stages"), "hidden vectors need the stage list");
        std::vector<std::string> names;
        for (size_t s = 0; s < st.size(); ++s)
          names.push_back(JsonReader(st[s], f, at(res.field("stages"), s)).get<std::string>("name"));
        if (!stages_set) {
          in.stages = names;
          stages_set = true;
        } else if (names != in.stages) {
          fail(f, res.field("stages"), "differs from another cell's stages");
        }
        const int64_t R = e - a;
        for (const auto& nm : names) {
          auto it = hidden.tensors.find(prefix + nm);
          if (it == hidden.tensors.end())
            fail(l.dir + "/hidden", prefix + nm, "hidden-vector tensor missing (cell " + c.id + ")");
          const TensorView& tv = *it->second;
          if (tv.dtype != DType::F32 || tv.shape.size() != 2 || tv.shape[0] != R || tv.shape[1] <= 0)
            fail(tv.file, tv.name, "expected float32 [" + std::to_string(R) + " interior tokens, hidden]");
          if (in.hidden_dim == 0) in.hidden_dim = uint32_t(tv.shape[1]);
          if (tv.shape[1] != int64_t(in.hidden_dim)) fail(tv.file, tv.name, "hidden size differs from another cell");
          const size_t n = size_t(R) * in.hidden_dim;
          const size_t off = c.hidden.size();
          c.hidden.resize(off + n);
          std::memcpy(c.hidden.data() + off, tv.data, n * sizeof(float));
        }
        if (c.target.empty()) {  // no routes: the rows are the whole (target) scope
          c.tokens = uint32_t(R);
          c.target.assign(size_t(R), 1);
        }
      }

      if (mode == "generate") {
        const json& g = res.raw("generated_ids");
        if (!g.is_array()) fail(f, res.field("generated_ids"), "expected an array of token ids");
        std::vector<int32_t> ids;
        for (size_t t = 0; t < g.size(); ++t) {
          if (!g[t].is_number_integer()) fail(f, at(res.field("generated_ids"), t), "expected a token id");
          ids.push_back(g[t].get<int32_t>());
        }
        c.generated = std::move(ids);
        const std::string s = res.get<std::string>("stop");
        if (s != "eos" && s != "length") fail(f, res.field("stop"), "expected \"eos\" or \"length\", got \"" + s + "\"");
        c.stop = s;
        if (!opt.evals.empty()) {  // what an EVAL.json verdict must have judged: this text and stop
          const json& tx = res.raw("text");
          if (!tx.is_null() && !tx.is_string()) fail(f, res.field("text"), "expected a string or null");
          gen_cells[c.id] = {.cell = in.cells.size(), .text_sha256 = tx.is_null() ? "" : sha256_hex(tx.get<std::string>()),
                             .stop = s};
        }
      }
      if (c.topk_ids.empty() && c.hidden.empty() && !c.generated)
        fail(f, cr.field("result"),
             "nothing to analyse: no routes (record_routes), hidden vectors (record_hidden_vectors) or generations");
      in.cells.push_back(std::move(c));
    }
  }

  if (in.has_routes()) {
    std::string md = opt.model_dir;
    const JsonReader r0(runs[0].j, runs[0].path);
    if (md.empty() && r0.has_value("runtime")) md = r0.child("runtime").get_or<std::string>("model_dir", "");
    if (md.empty() && !manifest.is_null()) md = JsonReader(manifest, opt.manifest).child("model").get_or<std::string>("dir", "");
    in.experts = experts_from_config(md, runs[0].j, runs[0].path);
    for (const Cell& c : in.cells)
      for (int32_t id : c.topk_ids)
        if (id < 0 || uint32_t(id) >= in.experts)
          fail(runs[0].path, c.id, "expert id " + std::to_string(id) + " outside [0, " + std::to_string(in.experts) + ")");
  }

  // Edges: the protocol's [[edge]] list (from --manifest); without one, every condition is
  // compared with the first (the official rendering, which protocols declare first).
  if (in.edges.empty()) {
    for (uint32_t k = 1; k < in.conditions.size(); ++k)
      in.edges.push_back({.name = in.conditions[k] + " vs " + in.conditions[0], .condition = k, .reference = 0});
    const std::string why = opt.manifest.empty() ? "no --manifest given (the run records no edge list)"
                                                 : "the manifest's protocol declares no [[edge]]";
    in.design_origin = "default: every condition vs the first condition (" + why + ")" +
                       (in.factorials.empty() ? "; no factorials" : "; factorials from the manifest's protocol");
  } else {
    in.design_origin = std::string("declared in the protocol ([[edge]]") +
                       (in.factorials.empty() ? ", no [[factorial]]" : ", [[factorial]]") + "), from the manifest " +
                       opt.manifest;
  }
  if (!opt.evals.empty()) join_evals(opt, in, gen_cells, run_contents);
  validate_analysis_input(in);
  return in;
}

}  // namespace atlas::stats
