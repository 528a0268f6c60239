// atlas eval over a probe run: see run_eval.h and docs/eval.md.
#include "eval/run_eval.h"

#include <filesystem>
#include <map>

#include "audit/hash_chain.h"
#include "core/error.h"
#include "core/file.h"
#include "core/provenance.h"
#include "core/sha256.h"
#include "eval/gsm8k.h"
#include "probe/freeze.h"

namespace fs = std::filesystem;

namespace atlas::eval {
namespace {

struct DomainSpec {
  std::string format, path, file_sha256;
};

// One ledger: category -> count, in a fixed category order so that every category appears
// (a zero is information) and the bytes do not depend on which categories occurred.
struct Ledger {
  std::vector<std::string> order;
  std::map<std::string, int64_t> n;
  void add(const std::string& k) {
    if (!n.count(k)) fail("atlas eval", k, "internal: category not in the ledger");
    ++n[k];
  }
  ojson json() const {
    ojson j = ojson::object();
    for (const auto& k : order) j[k] = n.at(k);
    return j;
  }
};

struct Ledgers {
  Ledger stopping{{"eos", "length"}, {}}, terminal{{"final_marker", "no_marker", "parses", "syntax_error", "no_program", "no_text"}, {}},
      coverage{{"evaluated", "not_evaluated"}, {}}, correctness{{"correct", "incorrect", "not_evaluated"}, {}};
  int64_t cells = 0;
  Ledgers() {
    for (Ledger* l : {&stopping, &terminal, &coverage, &correctness})
      for (const auto& k : l->order) l->n[k] = 0;
  }
  void add(const ojson& cell) {
    ++cells;
    stopping.add(cell["stop"].get<std::string>());
    terminal.add(cell["terminal"]["state"].get<std::string>());
    coverage.add(cell["coverage"]["evaluated"].get<bool>() ? "evaluated" : "not_evaluated");
    correctness.add(cell["correctness"].get<std::string>());
  }
  ojson json() const {
    return {{"cells", cells},
            {"stopping", stopping.json()},
            {"terminal", terminal.json()},
            {"coverage", coverage.json()},
            {"correctness", correctness.json()}};
  }
};

std::string rel_dir(const std::string& out) {
  const fs::path p = fs::path(out).parent_path();
  return p.empty() ? "." : p.string();
}

}  // namespace

RunEvalSummary eval_run(const RunEvalOptions& o) {
  RuntimeClock clock;
  const json run = read_json_file(o.run);
  const JsonReader rr(run, o.run);
  if (rr.get<std::string>("kind") != "atlas.probe.run") fail(o.run, "kind", "not an atlas probe run artifact (atlas.probe.run)");
  const std::string mode = JsonReader(rr.raw("execution"), o.run, "execution").get<std::string>("mode");
  if (mode != "generate")
    fail(o.run, "execution.mode", "\"" + mode + "\": atlas eval needs a generate-mode run (a trace run has no generated text)");

  const ojson m = probe::load_manifest(o.manifest);
  if (m["manifest_sha256"].get<std::string>() != rr.get<std::string>("manifest_sha256"))
    fail(o.run, "manifest_sha256", "the run was made from another manifest than " + o.manifest);

  std::map<std::string, DomainSpec> domains;
  for (const auto& c : m["corpora"])
    domains[c["domain"].get<std::string>()] = {.format = c["format"].get<std::string>(),
                                               .path = c["path"].get<std::string>(),
                                               .file_sha256 = c["file_sha256"].get<std::string>()};
  std::map<std::string, std::string> gold;  // source_key -> gold (may be empty)
  for (const auto& s : m["sources"]) gold[s["key"].get<std::string>()] = s.value("gold", std::string());

  const json& cells = rr.raw("cells");
  if (!cells.is_array()) fail(o.run, "cells", "expected an array");

  // Pass 1: validate every cell and collect HumanEval candidates (one evaluator call for the run).
  std::map<std::string, std::vector<HumanEvalProblem>> corpora;  // path -> tasks
  std::map<std::string, std::map<std::string, const HumanEvalProblem*>> tasks;
  std::vector<std::string> corpus_inputs;
  std::vector<Candidate> cands;
  std::vector<size_t> cand_of(cells.size(), SIZE_MAX);
  std::vector<char> is_math(cells.size(), 0);
  for (size_t i = 0; i < cells.size(); ++i) {
    const JsonReader c(cells[i], o.run, "cells[" + std::to_string(i) + "]");
    const std::string domain = c.get<std::string>("domain");
    const auto d = domains.find(domain);
    if (d == domains.end()) fail(o.run, c.field("domain"), "\"" + domain + "\" is not a corpus of the manifest");
    const JsonReader res = c.child("result");
    const std::string stop = res.get<std::string>("stop");
    if (stop != "eos" && stop != "length") fail(o.run, res.field("stop"), "expected \"eos\" or \"length\", got \"" + stop + "\"");
    // text is null when a generated id has no token in the tokenizer (docs/probe.md): nothing to evaluate.
    const bool has_text = !res.raw("text").is_null();
    if (has_text) res.get<std::string>("text");
    is_math[i] = d->second.format == "gsm8k";
    if (d->second.format == "gsm8k") {
      const auto g = gold.find(c.get<std::string>("source_key"));
      if (g == gold.end() || g->second.empty())
        fail(o.manifest, "sources[" + c.get<std::string>("source_key") + "].gold",
             "no gold answer for " + c.get<std::string>("cell_id"));
    } else if (d->second.format == "humaneval") {
      const std::string& path = d->second.path;
      if (!corpora.count(path)) {
        if (!file_exists(path)) fail(path, "corpora[" + domain + "].path", "HumanEval corpus missing (tests are read from it)");
        if (sha256_file(path) != d->second.file_sha256)
          fail(path, "corpora[" + domain + "].file_sha256", "the corpus file changed since the manifest was frozen");
        corpora[path] = load_humaneval(path);
        for (const auto& t : corpora[path]) tasks[path][t.task_id] = &t;
        corpus_inputs.push_back(path);
      }
      const std::string id = c.get<std::string>("source_id");
      const auto t = tasks[path].find(id);
      if (t == tasks[path].end()) fail(path, c.field("source_id"), "task \"" + id + "\" not in the corpus");
      if (!has_text) continue;
      cand_of[i] = cands.size();
      cands.push_back({.problem = t->second, .completion = res.get<std::string>("text")});
    } else {
      fail(o.run, c.field("domain"),
           "no evaluator for domain \"" + domain + "\" (corpus format " + d->second.format +
               "); atlas eval scores gsm8k and humaneval corpora");
    }
  }

  EvalStats stats;
  std::vector<Outcome> outcomes;
  if (!cands.empty()) {
    probe_sandbox(o.humaneval.sandbox);  // fails clearly before any candidate runs
    outcomes = evaluate_humaneval(cands, o.humaneval, &stats);
  }

  Ledgers all;
  std::map<std::string, Ledgers> by_domain;
  ojson out_cells = ojson::array();
  for (size_t i = 0; i < cells.size(); ++i) {
    const json& c = cells[i];
    const json& res = c["result"];
    const std::string domain = c["domain"].get<std::string>();
    const std::string stop = res["stop"].get<std::string>();
    const bool has_text = !res["text"].is_null();
    const std::string text = has_text ? res["text"].get<std::string>() : std::string();
    ojson e;
    e["index"] = c.value("index", int64_t(i));
    e["cell_id"] = c["cell_id"];
    e["source_key"] = c["source_key"];
    e["source_id"] = c["source_id"];
    e["domain"] = domain;
    e["condition"] = c["condition"];
    e["seed"] = c.contains("seed") ? ojson(c["seed"]) : ojson(nullptr);
    e["text_sha256"] = has_text ? ojson(sha256_hex(text)) : ojson(nullptr);
    e["stop"] = stop;
    if (!has_text) {
      e["evaluator"] = is_math[i] ? "gsm8k" : "humaneval";
      e["terminal"] = {{"state", "no_text"}};
      e["coverage"] = {{"evaluated", false}, {"reason", "no text: a generated id has no token in the tokenizer"}};
      e["correctness"] = "not_evaluated";
    } else if (is_math[i]) {
      const std::string& g = gold.at(c["source_key"].get<std::string>());
      const Gsm8kScore s = score_gsm8k(text, stop == "eos", g);
      e["evaluator"] = "gsm8k";
      e["terminal"] = {{"state", s.extraction.explicit_marker() ? "final_marker" : "no_marker"},
                       {"method", method_name(s.extraction.method)}};
      const bool has = s.extraction.method != ExtractMethod::None;
      e["coverage"] = {{"evaluated", true}, {"reason", ""}};
      e["gsm8k"] = {{"gold", g},
                    {"extracted", has ? ojson(s.extraction.value) : ojson(nullptr)},
                    {"strict_complete", s.strict_complete},
                    {"exact", s.exact},
                    {"matches_gold", s.matches_gold}};
      e["correctness"] = s.exact ? "correct" : "incorrect";
    } else {
      const Candidate& cd = cands[cand_of[i]];
      const Outcome& out = outcomes[cand_of[i]];
      const Program p = build_program(*cd.problem, cd.completion);
      e["evaluator"] = "humaneval";
      const std::string state = !p.runnable ? "no_program" : out.verdict == Verdict::SyntaxError ? "syntax_error" : "parses";
      e["terminal"] = {{"state", state}, {"extraction", p.extraction}, {"reason", p.reason}};
      const bool executed = out.verdict != Verdict::NotRun && out.verdict != Verdict::SyntaxError;
      e["coverage"] = {{"evaluated", executed},
                       {"reason", executed ? std::string() : std::string(verdict_name(out.verdict)) +
                                                                 (p.reason.empty() ? "" : ": " + p.reason)}};
      e["humaneval"] = {{"task_id", cd.problem->task_id},
                        {"program_sha256", p.runnable ? ojson(sha256_hex(p.source)) : ojson(nullptr)},
                        {"result", verdict_name(out.verdict)},
                        {"exception", out.exception},
                        {"detail", out.detail}};
      e["correctness"] = !executed ? "not_evaluated" : out.verdict == Verdict::Passed ? "correct" : "incorrect";
    }
    all.add(e);
    by_domain[domain].add(e);
    out_cells.push_back(std::move(e));
  }

  const std::string base = rel_dir(o.out);
  ojson inputs = ojson::array();
  auto input = [&](const char* role, const std::string& path) {
    ojson r = {{"role", role}};
    r.update(audit::input_record_json(audit::input_record(path, base)));
    inputs.push_back(std::move(r));
  };
  input("run", o.run);
  input("manifest", o.manifest);
  for (const auto& p : corpus_inputs) input("corpus", p);

  ojson a;
  a["kind"] = "atlas.eval";
  a["format_version"] = 1;
  a["inputs"] = inputs;
  a["run"] = {{"manifest_sha256", m["manifest_sha256"]},
              {"content_sha256", run.contains("content_sha256") ? ojson(run["content_sha256"]) : ojson(nullptr)},
              {"protocol", run.contains("protocol") ? ojson(run["protocol"].value("name", "")) : ojson("")}};
  a["evaluators"] = {{"gsm8k", "strict: EOS and an explicit marker (boxed, phrase), equal to gold"},
                     {"humaneval", {{"harness_version", harness_version()}}}};
  ojson ld = all.json();
  ojson per = ojson::object();
  for (const auto& [k, l] : by_domain) per[k] = l.json();
  ld["by_domain"] = per;
  a["ledgers"] = ld;
  a["cells"] = out_cells;
  ojson prov = build_provenance();
  prov["manifest_sha256"] = m["manifest_sha256"];
  prov["protocol_sha256"] = m["protocol"]["sha256"];
  prov["run_content_sha256"] = a["run"]["content_sha256"];
  a["provenance"] = prov;
  a["content_sha256"] = artifact_content_sha256(a);
  ojson rt = runtime_section(clock);
  rt["humaneval"] = {{"candidates", stats.candidates},
                     {"unique_programs", stats.unique_programs},
                     {"executed", stats.executed},
                     {"cache_hits", stats.cache_hits},
                     {"workers", o.humaneval.workers}};
  a["runtime"] = rt;

  AtomicFile f(o.out);
  f.write(a.dump(1) + "\n");
  f.commit();
  return {.cells = all.cells,
          .evaluated = all.coverage.n.at("evaluated"),
          .correct = all.correctness.n.at("correct"),
          .ledgers = ld};
}

}  // namespace atlas::eval
