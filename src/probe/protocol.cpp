#include "probe/protocol.h"

#include <toml++/toml.h>

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <set>

#include "core/error.h"
#include "core/file.h"
#include "core/sha256.h"

namespace atlas::probe {
namespace fs = std::filesystem;

const std::vector<std::string>& anchor_names() {
  static const std::vector<std::string> names = {"bos", "history_eos", "target_role_head", "target_role_delim",
                                                 "gen_role_head", "gen_role_delim"};
  return names;
}

std::optional<AnchorRef> parse_anchor_ref(const std::string& item) {
  const size_t sign = item.find_first_of("+-");
  AnchorRef r{.name = item.substr(0, sign), .offset = 0};
  if (r.name.empty() || !std::all_of(r.name.begin(), r.name.end(), [](char c) { return std::islower(static_cast<unsigned char>(c)) || c == '_'; }))
    return std::nullopt;
  if (sign == std::string::npos) return r;
  const std::string digits = item.substr(sign + 1);
  if (digits.empty() || digits.size() > 9 ||
      !std::all_of(digits.begin(), digits.end(), [](char c) { return std::isdigit(static_cast<unsigned char>(c)); }))
    return std::nullopt;
  r.offset = std::stoll(digits) * (item[sign] == '-' ? -1 : 1);
  return r;
}

namespace {

std::vector<std::string> split_list(const std::string& s) {
  std::vector<std::string> out;
  size_t a = 0;
  for (size_t b; (b = s.find(',', a)) != std::string::npos; a = b + 1) out.push_back(s.substr(a, b - a));
  out.push_back(s.substr(a));
  return out;
}

// Typed access to one TOML table; every read marks the key as known, and finish() rejects the rest.
class Table {
 public:
  Table(const toml::table* t, std::string file, std::string prefix) : t_(t), file_(std::move(file)), prefix_(std::move(prefix)) {}

  std::string field(const std::string& k) const { return prefix_.empty() ? k : prefix_ + "." + k; }
  bool has(const std::string& k) {
    known_.insert(k);
    return t_ && t_->contains(k);
  }
  const toml::node* node(const std::string& k) {
    known_.insert(k);
    return t_ ? t_->get(k) : nullptr;
  }
  template <class T>
  void get(const std::string& k, T& out) {
    const toml::node* n = node(k);
    if (!n) return;
    if constexpr (std::is_same_v<T, bool>) {
      if (!n->is_boolean()) bad(k, "expected a boolean");
      out = n->as_boolean()->get();
    } else if constexpr (std::is_same_v<T, std::string>) {
      if (!n->is_string()) bad(k, "expected a string");
      out = n->as_string()->get();
    } else if constexpr (std::is_same_v<T, double>) {
      if (n->is_integer()) out = double(n->as_integer()->get());
      else if (n->is_floating_point()) out = n->as_floating_point()->get();
      else bad(k, "expected a number");
    } else {
      if (!n->is_integer()) bad(k, "expected an integer");
      out = T(n->as_integer()->get());
    }
  }
  std::string req_string(const std::string& k) {
    if (!has(k)) fail(file_, field(k), "missing");
    std::string s;
    get(k, s);
    return s;
  }
  std::vector<std::string> strings(const std::string& k) {
    std::vector<std::string> out;
    const toml::node* n = node(k);
    if (!n) return out;
    if (!n->is_array()) bad(k, "expected an array of strings");
    for (const auto& e : *n->as_array()) {
      if (!e.is_string()) bad(k, "expected an array of strings");
      out.push_back(e.as_string()->get());
    }
    return out;
  }
  const toml::array* array(const std::string& k) {
    const toml::node* n = node(k);
    if (!n) return nullptr;
    if (!n->is_array()) bad(k, "expected an array");
    return n->as_array();
  }
  Table sub(const std::string& k) {
    const toml::node* n = node(k);
    if (n && !n->is_table()) bad(k, "expected a table");
    return Table(n ? n->as_table() : nullptr, file_, field(k));
  }
  void finish() const {
    if (!t_) return;
    for (const auto& [k, v] : *t_)
      if (!known_.count(std::string(k.str()))) fail(file_, field(std::string(k.str())), "unknown key");
  }
  [[noreturn]] void bad(const std::string& k, const std::string& what) const { fail(file_, field(k), what); }
  const std::string& file() const { return file_; }

 private:
  const toml::table* t_;
  std::string file_, prefix_;
  std::set<std::string> known_;
};

std::string resolve(const std::string& base_dir, const std::string& p) { return path_from(base_dir, p); }

void one_of(const Table& t, const std::string& key, const std::string& v, std::initializer_list<const char*> allowed) {
  std::string list;
  for (const char* a : allowed) {
    if (v == a) return;
    list += (list.empty() ? "" : ", ") + std::string(a);
  }
  t.bad(key, "unknown value '" + v + "' (expected one of: " + list + ")");
}

// [[edge]] and [[factorial]]: the analysis design. Every name must be a declared condition;
// an edge needs two different conditions and may not repeat another edge (same pair, or
// same name); a factorial needs four different conditions and two factor names.
void read_design(Table& top, const std::string& path, Protocol& p) {
  auto known = [&](Table& t, const std::string& key, const std::string& name) {
    if (std::none_of(p.conditions.begin(), p.conditions.end(), [&](const ConditionSpec& c) { return c.name == name; })) {
      std::string list;
      for (const auto& c : p.conditions) list += (list.empty() ? "" : ", ") + c.name;
      t.bad(key, "unknown condition '" + name + "' (declared: " + list + ")");
    }
  };
  if (const toml::array* arr = top.array("edge")) {
    for (size_t i = 0; i < arr->size(); ++i) {
      const std::string where = "edge[" + std::to_string(i) + "]";
      if (!(*arr)[i].is_table()) fail(path, where, "expected a table {name, condition, reference}");
      Table t((*arr)[i].as_table(), path, where);
      EdgeSpec e;
      e.condition = t.req_string("condition");
      e.reference = t.req_string("reference");
      known(t, "condition", e.condition);
      known(t, "reference", e.reference);
      if (e.condition == e.reference) t.bad("reference", "an edge needs two different conditions");
      e.name = e.condition + " vs " + e.reference;
      t.get("name", e.name);
      if (e.name.empty()) t.bad("name", "must not be empty");
      for (size_t k = 0; k < p.edges.size(); ++k) {
        const EdgeSpec& o = p.edges[k];
        if (o.name == e.name) t.bad("name", "edge name '" + e.name + "' already used by edge[" + std::to_string(k) + "]");
        if (o.condition == e.condition && o.reference == e.reference)
          t.bad("condition", "duplicates edge[" + std::to_string(k) + "] ('" + o.name + "': " + e.condition + " vs " +
                                 e.reference + ")");
      }
      t.finish();
      p.edges.push_back(std::move(e));
    }
  }
  if (const toml::array* arr = top.array("factorial")) {
    for (size_t i = 0; i < arr->size(); ++i) {
      const std::string where = "factorial[" + std::to_string(i) + "]";
      if (!(*arr)[i].is_table()) fail(path, where, "expected a table {name, a, b, a0b0, a1b0, a0b1, a1b1}");
      Table t((*arr)[i].as_table(), path, where);
      FactorialSpec f;
      f.name = t.req_string("name");
      f.factor_a = t.req_string("a");
      f.factor_b = t.req_string("b");
      if (f.name.empty() || f.factor_a.empty() || f.factor_b.empty()) t.bad("name", "name, a and b must not be empty");
      if (f.factor_a == f.factor_b) t.bad("b", "the two factors need different names");
      std::string* cells[4] = {&f.a0b0, &f.a1b0, &f.a0b1, &f.a1b1};
      const char* keys[4] = {"a0b0", "a1b0", "a0b1", "a1b1"};
      for (int c = 0; c < 4; ++c) {
        *cells[c] = t.req_string(keys[c]);
        known(t, keys[c], *cells[c]);
        for (int o = 0; o < c; ++o)
          if (*cells[o] == *cells[c])
            t.bad(keys[c], "condition '" + *cells[c] + "' is also " + keys[o] + " (a 2x2 needs four different conditions)");
      }
      for (size_t k = 0; k < p.factorials.size(); ++k)
        if (p.factorials[k].name == f.name)
          t.bad("name", "factorial name '" + f.name + "' already used by factorial[" + std::to_string(k) + "]");
      t.finish();
      p.factorials.push_back(std::move(f));
    }
  }
}

}  // namespace

Protocol load_protocol(const std::string& path) {
  if (!file_exists(path)) fail(path, {}, "protocol file not found");
  const std::string text = read_file(path);
  toml::table root;
  try {
    root = toml::parse(text, path);
  } catch (const toml::parse_error& e) {
    fail(path, "line " + std::to_string(e.source().begin.line), std::string(e.description()));
  }
  Protocol p;
  p.path = path;
  p.sha256 = sha256_hex(text);
  const std::string base = fs::path(path).parent_path().string();
  Table top(&root, path, "");

  Table meta = top.sub("protocol");
  p.name = meta.req_string("name");
  meta.get("description", p.description);
  meta.get("seed_section", p.seed_section);
  meta.finish();

  Table model = top.sub("model");
  model.get("dir", p.model_dir);
  model.get("manifest", p.model_manifest);
  p.model_dir = resolve(base, p.model_dir);
  p.model_manifest = resolve(base, p.model_manifest);
  model.finish();

  Table data = top.sub("data");
  data.get("root", p.data_root);
  p.data_root = resolve(base, p.data_root);
  data.finish();

  if (const toml::array* arr = top.array("corpus")) {
    for (size_t i = 0; i < arr->size(); ++i) {
      const toml::node& n = (*arr)[i];
      if (!n.is_table()) fail(path, "corpus[" + std::to_string(i) + "]", "expected a table");
      Table c(n.as_table(), path, "corpus[" + std::to_string(i) + "]");
      CorpusSpec s;
      s.domain = c.req_string("domain");
      s.format = s.domain;
      c.get("format", s.format);
      if (!is_corpus_format(s.format)) c.bad("format", "unknown corpus format '" + s.format + "'");
      c.get("path", s.path);  // relative to the data root; resolved at freeze time
      c.get("member", s.member);
      s.texts = c.strings("texts");
      if (s.format == "inline" && s.texts.empty()) c.bad("texts", "an inline corpus needs texts");
      if (s.format != "inline" && s.path.empty()) c.bad("path", "missing");
      for (const auto& o : p.corpora)
        if (o.domain == s.domain) c.bad("domain", "domain '" + s.domain + "' declared twice");
      c.finish();
      p.corpora.push_back(std::move(s));
    }
  }
  if (p.corpora.empty()) fail(path, "corpus", "no corpus declared");

  Table sel = top.sub("selection");
  sel.get("salt", p.salt);
  sel.get("per_domain", p.per_domain);
  sel.get("min_tokens", p.min_tokens);
  sel.get("skip_blank", p.skip_blank);
  sel.get("skip_headings", p.skip_headings);
  sel.get("reference", p.selection_reference);
  p.selection_reference = resolve(base, p.selection_reference);
  if (const toml::array* ct = sel.array("content_tokens")) {
    p.content_tokens.clear();
    for (const auto& e : *ct) {
      if (!e.is_integer() || e.as_integer()->get() < 0) sel.bad("content_tokens", "expected non-negative integers");
      p.content_tokens.push_back(e.as_integer()->get());
    }
    if (p.content_tokens.empty()) sel.bad("content_tokens", "empty");
    if (!std::is_sorted(p.content_tokens.begin(), p.content_tokens.end()) ||
        std::adjacent_find(p.content_tokens.begin(), p.content_tokens.end()) != p.content_tokens.end())
      sel.bad("content_tokens", "must be strictly increasing");
  }
  if (p.per_domain <= 0) sel.bad("per_domain", "must be positive");
  sel.finish();

  Table blocks = top.sub("blocks");
  blocks.get("system", p.system_text);
  blocks.get("one_shot_user", p.one_shot_user);
  blocks.get("one_shot_assistant", p.one_shot_assistant);
  blocks.get("filler_token", p.filler_token);
  if (const toml::node* fr = blocks.node("filler_repeat")) {
    if (fr->is_string() && fr->as_string()->get() == "match_one_shot") p.filler_match_one_shot = true;
    // Bounded: no model's context holds more, and a huge count would only exhaust memory.
    else if (fr->is_integer() && fr->as_integer()->get() > 0 && fr->as_integer()->get() <= 1000000)
      p.filler_repeat = fr->as_integer()->get();
    else blocks.bad("filler_repeat", "expected a positive integer (at most 1000000) or \"match_one_shot\"");
  }
  blocks.get("user_prefix", p.user_prefix);
  blocks.get("generation_prompt", p.generation_prompt);
  blocks.finish();

  const toml::array* conds = top.array("condition");
  if (!conds || conds->empty()) fail(path, "condition", "no condition declared");
  for (size_t i = 0; i < conds->size(); ++i) {
    const std::string where = "condition[" + std::to_string(i) + "]";
    if (!(*conds)[i].is_table()) fail(path, where, "expected a table");
    Table c((*conds)[i].as_table(), path, where);
    ConditionSpec cs;
    cs.name = c.req_string("name");
    c.get("layout", cs.layout);
    one_of(c, "layout", cs.layout, {"raw", "user", "chat"});
    c.get("system", cs.system);
    c.get("history", cs.history);
    one_of(c, "history", cs.history, {"none", "filler", "one_shot"});
    if (cs.layout == "raw" && (cs.system || cs.history != "none"))
      c.bad("layout", "a raw condition has no system message or history");
    c.get("group", cs.group);
    if (const toml::array* ed = c.array("edits")) {
      for (size_t k = 0; k < ed->size(); ++k) {
        const std::string ew = "edits[" + std::to_string(k) + "]";
        if (!(*ed)[k].is_table()) c.bad(ew, "expected a table {anchor, to}");
        Table e((*ed)[k].as_table(), path, where + "." + ew);
        EditSpec es;
        es.anchor = e.req_string("anchor");
        e.get("to", es.to);
        e.get("to_anchor", es.to_anchor);
        const auto& an = anchor_names();
        if (std::find(an.begin(), an.end(), es.anchor) == an.end()) e.bad("anchor", "unknown anchor '" + es.anchor + "'");
        if (es.to.empty() == es.to_anchor.empty()) e.bad("to", "give exactly one of to / to_anchor");
        if (!es.to_anchor.empty() && std::find(an.begin(), an.end(), es.to_anchor) == an.end())
          e.bad("to_anchor", "unknown anchor '" + es.to_anchor + "'");
        e.finish();
        cs.edits.push_back(std::move(es));
      }
    }
    cs.interventions = c.strings("interventions");
    for (size_t k = 0; k < cs.interventions.size(); ++k) {
      const std::string& spec = cs.interventions[k];
      const std::string iw = "interventions[" + std::to_string(k) + "]";
      const size_t eq = spec.find('=');
      if (eq == std::string::npos) c.bad(iw, "'" + spec + "': expected TARGET[@TOKENS]=ACTION");
      if (spec.compare(eq + 1, 6, "patch:") == 0 && spec.compare(eq + 1, 7, "patch:@") != 0)
        c.bad(iw, "'" + spec + "': a protocol's edits patch from a sibling cell (patch:@CONDITION), not from files");
      if (spec.compare(eq + 1, 4, "add:") == 0 && (eq + 5 >= spec.size() || spec[eq + 5] == '*'))
        c.bad(iw, "'" + spec + "': add: needs a safetensors file (add:FILE or add:FILE*F)");
      if (const size_t at = spec.find('@'); at != std::string::npos && at < eq)
        for (const std::string& item : split_list(spec.substr(at + 1, eq - at - 1))) {
          if (item.empty() || std::isdigit(static_cast<unsigned char>(item[0])) || item == "target") continue;
          const auto ref = parse_anchor_ref(item);
          if (!ref || std::find(anchor_names().begin(), anchor_names().end(), ref->name) == anchor_names().end())
            c.bad(iw, "'" + spec + "': unknown token \"" + item +
                          "\" (a position, A-B, target, or an anchor with an optional +N / -N)");
        }
    }
    for (const auto& o : p.conditions)
      if (o.name == cs.name) c.bad("name", "condition '" + cs.name + "' declared twice");
    if (cs.name.find('/') != std::string::npos) c.bad("name", "must not contain '/'");
    c.finish();
    p.conditions.push_back(std::move(cs));
  }
  // patch:@CONDITION names a condition of this protocol (any order), not the condition itself.
  for (size_t i = 0; i < p.conditions.size(); ++i) {
    const ConditionSpec& cs = p.conditions[i];
    for (size_t k = 0; k < cs.interventions.size(); ++k) {
      const std::string& spec = cs.interventions[k];
      const size_t at = spec.find("=patch:@");
      if (at == std::string::npos) continue;
      const std::string ref = spec.substr(at + 8);
      const bool known = std::any_of(p.conditions.begin(), p.conditions.end(), [&](const ConditionSpec& o) { return o.name == ref; });
      if (!known || ref == cs.name)
        fail(path, "condition[" + std::to_string(i) + "].interventions[" + std::to_string(k) + "]",
             "'" + spec + "': " + (known ? "a cell cannot patch from itself" : "no condition named \"" + ref + "\""));
    }
  }

  read_design(top, path, p);

  Table con = top.sub("contracts");
  con.get("same_content_ids", p.same_content_ids);
  con.get("nested_prefixes", p.nested_prefixes);
  if (const toml::array* ed = con.array("equal_delta")) {
    for (const auto& e : *ed) {
      std::vector<std::string> q;
      if (e.is_array())
        for (const auto& s : *e.as_array())
          if (s.is_string()) q.push_back(s.as_string()->get());
      if (q.size() != 4) con.bad("equal_delta", "each entry is [a, b, c, d] (condition names)");
      for (const auto& n : q)
        if (std::none_of(p.conditions.begin(), p.conditions.end(), [&](const ConditionSpec& c) { return c.name == n; }))
          con.bad("equal_delta", "unknown condition '" + n + "'");
      p.equal_delta.push_back(q);
    }
  }
  con.finish();

  Table ex = top.sub("execution");
  ex.get("mode", p.mode);
  one_of(ex, "mode", p.mode, {"trace", "generate"});
  ex.get("layers", p.layers);
  ex.get("compute", p.compute);
  one_of(ex, "compute", p.compute, {"f32", "bf16"});
  ex.get("record_routes", p.record_routes);
  ex.get("record_hidden", p.record_hidden);
  ex.get("record_hidden_vectors", p.record_hidden_vectors);
  ex.get("max_new_tokens", p.max_new_tokens);
  ex.get("sampling", p.sampling);
  one_of(ex, "sampling", p.sampling, {"greedy", "seeded", "crn"});
  ex.get("temperature", p.temperature);
  ex.get("top_p", p.top_p);
  ex.get("top_k", p.top_k);
  if (const toml::array* sd = ex.array("seed")) {
    for (size_t i = 0; i < sd->size(); ++i) {
      if (!(*sd)[i].is_table()) ex.bad("seed", "expected [[execution.seed]] tables");
      Table s((*sd)[i].as_table(), path, "execution.seed[" + std::to_string(i) + "]");
      SeedSpec ss;
      s.get("value", ss.value);
      if (!s.has("value")) s.bad("value", "missing");
      s.get("sources_per_domain", ss.sources_per_domain);
      s.finish();
      p.seeds.push_back(ss);
    }
  }
  if (p.mode == "generate") {
    if (p.max_new_tokens <= 0) ex.bad("max_new_tokens", "generate mode needs a positive max_new_tokens");
    if (p.sampling != "greedy" && p.seeds.empty()) ex.bad("seed", "sampling needs at least one [[execution.seed]]");
    if (p.sampling == "greedy" && !p.seeds.empty()) ex.bad("seed", "greedy decoding takes no seeds");
  } else if (!p.seeds.empty()) {
    ex.bad("seed", "trace mode takes no seeds");
  }
  if (p.record_hidden_vectors && p.mode != "trace") ex.bad("record_hidden_vectors", "trace mode only");
  // The side files' rows are checked against the stage hashes (resume, audit): no rows without them.
  if (p.record_hidden_vectors && !p.record_hidden) ex.bad("record_hidden_vectors", "needs record_hidden = true (the stage hashes check the rows)");
  ex.finish();

  Table bt = top.sub("batching");
  bt.get("sources_per_batch", p.sources_per_batch);
  bt.get("split_seeds", p.split_seeds);
  if (p.sources_per_batch <= 0) bt.bad("sources_per_batch", "must be positive");
  bt.finish();
  top.finish();
  return p;
}

ojson Protocol::to_json() const {
  ojson j;
  j["name"] = name;
  j["description"] = description;
  j["seed_section"] = seed_section;
  j["sha256"] = sha256;
  ojson sel;
  sel["salt"] = salt;
  sel["per_domain"] = per_domain;
  sel["min_tokens"] = min_tokens;
  sel["content_tokens"] = content_tokens;
  sel["skip_blank"] = skip_blank;
  sel["skip_headings"] = skip_headings;
  if (!selection_reference.empty()) sel["reference"] = selection_reference;  // absent: older manifests keep their bytes
  j["selection"] = sel;
  ojson conds = ojson::array();
  for (const auto& c : conditions) {
    ojson e = ojson::array();
    for (const auto& ed : c.edits) {
      ojson x;
      x["anchor"] = ed.anchor;
      if (!ed.to.empty()) x["to"] = ed.to;
      else x["to_anchor"] = ed.to_anchor;
      e.push_back(x);
    }
    conds.push_back({{"name", c.name}, {"layout", c.layout}, {"system", c.system}, {"history", c.history},
                     {"group", c.group}, {"edits", e}});
    // Only when declared: a protocol without hook edits freezes to the bytes it always did.
    if (!c.interventions.empty()) conds.back()["interventions"] = c.interventions;
  }
  j["conditions"] = conds;
  // The analysis design, only when declared: a protocol without it freezes to the same
  // manifest (and manifest_sha256) as before edges and factorials existed.
  if (!edges.empty()) {
    ojson ea = ojson::array();
    for (const auto& e : edges) ea.push_back({{"name", e.name}, {"condition", e.condition}, {"reference", e.reference}});
    j["edges"] = ea;
  }
  if (!factorials.empty()) {
    ojson fa = ojson::array();
    for (const auto& f : factorials)
      fa.push_back({{"name", f.name}, {"a", f.factor_a}, {"b", f.factor_b}, {"a0b0", f.a0b0}, {"a1b0", f.a1b0},
                    {"a0b1", f.a0b1}, {"a1b1", f.a1b1}});
    j["factorials"] = fa;
  }
  j["contracts"] = {{"same_content_ids", same_content_ids}, {"nested_prefixes", nested_prefixes},
                    {"equal_delta", equal_delta}};
  ojson ex;
  ex["mode"] = mode;
  ex["layers"] = layers;
  ex["compute"] = compute;
  if (mode == "trace") {
    ex["record_routes"] = record_routes;
    ex["record_hidden"] = record_hidden;
    ex["record_hidden_vectors"] = record_hidden_vectors;
  } else {
    ex["max_new_tokens"] = max_new_tokens;
    ex["sampling"] = sampling;
    // Greedy leaves the sampling parameters unset, so nothing is "recorded but unused".
    ex["temperature"] = sampling == "greedy" ? ojson(nullptr) : ojson(temperature);
    ex["top_p"] = sampling == "greedy" ? ojson(nullptr) : ojson(top_p);
    ex["top_k"] = sampling == "greedy" ? ojson(nullptr) : ojson(top_k);
    ojson sd = ojson::array();
    for (const auto& s : seeds) sd.push_back({{"value", s.value}, {"sources_per_domain", s.sources_per_domain}});
    ex["seeds"] = sd;
  }
  j["execution"] = ex;
  j["batching"] = {{"sources_per_batch", sources_per_batch}, {"split_seeds", split_seeds}};
  return j;
}

}  // namespace atlas::probe
