#include "probe/freeze.h"

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <map>
#include <set>

#include "core/error.h"
#include "core/file.h"
#include "core/sha256.h"
#include "model/config.h"
#include "model/intervene.h"
#include "probe/corpus.h"
#include "probe/protocol.h"
#include "text/chat.h"
#include "text/tokenizer.h"

namespace atlas::probe {
namespace fs = std::filesystem;
namespace {

int64_t cp_len(std::string_view s) {
  int64_t n = 0;
  for (unsigned char c : s) n += (c & 0xC0) != 0x80;
  return n;
}

bool is_blank(const std::string& s) { return s.find_first_not_of(" \t\r\n\f\v") == std::string::npos; }

std::string rank_preimage(const std::string& salt, const std::string& domain, const std::string& id) {
  std::string s = salt;
  s.push_back('\0');
  s += domain;
  s.push_back('\0');
  s += id;
  return s;
}

// One rendering of a condition for one content: the official ids and where things are.
struct Rendering {
  std::vector<int32_t> ids;
  std::string text;                      // the rendered prompt (raw: bos_token + content)
  int64_t span_start = 0, span_end = 0;  // target content, code points of text
  int64_t interior_begin = 0, interior_end = 0;
  int64_t crossing = 0;
  std::map<std::string, int64_t> anchors;
  std::map<std::string, std::string> missing;  // anchor -> why it is absent
};

struct Content {
  int64_t requested = 0;      // N (0 = whole)
  std::vector<int32_t> ids;   // the source's first N tokens (encoded alone)
  std::string text;           // the text those tokens cover
};

struct Ctx {
  const Protocol& p;
  const Tokenizer& tok;
  std::optional<ChatTemplate> tmpl;
  ChatOptions vars;  // the template's variables (special tokens), from load_chat_template
  std::optional<std::string> bos_text, eos_text;
  int32_t bos = -1, eos = -1;
  std::string filler_user, filler_assistant;
  std::map<std::string, int32_t> edit_ids;
};

ojson messages_for(const Ctx& c, const ConditionSpec& cond, const std::string& content) {
  ojson m = ojson::array();
  if (cond.system) m.push_back({{"role", "system"}, {"content", c.p.system_text}});
  if (cond.history == "filler") {
    m.push_back({{"role", "user"}, {"content", c.filler_user}});
    m.push_back({{"role", "assistant"}, {"content", c.filler_assistant}});
  } else if (cond.history == "one_shot") {
    m.push_back({{"role", "user"}, {"content", c.p.one_shot_user}});
    m.push_back({{"role", "assistant"}, {"content", c.p.one_shot_assistant}});
  }
  m.push_back({{"role", "user"}, {"content", content}});
  return m;
}

std::string apply_template(const Ctx& c, const ConditionSpec& cond, const std::string& content) {
  ChatOptions opt = c.vars;
  opt.add_generation_prompt = cond.layout == "chat";
  return c.tmpl->apply(messages_for(c, cond, content), opt);
}

int64_t token_starting_at(const Encoding& e, int64_t cp) {
  for (size_t i = 0; i < e.ids.size(); ++i)
    if (e.offsets[i].start == cp && e.offsets[i].end > e.offsets[i].start) return int64_t(i);
  return -1;
}

Rendering render(const Ctx& c, const ConditionSpec& cond, const Content& content, const std::string& where) {
  Rendering r;
  if (cond.layout == "raw") {
    // BOS + the content's own token ids: nested prefixes stay exact token prefixes.
    r.ids.push_back(c.bos);
    r.ids.insert(r.ids.end(), content.ids.begin(), content.ids.end());
    r.text = c.bos_text.value_or("") + content.text;
    r.span_start = cp_len(c.bos_text.value_or(""));
    r.span_end = r.span_start + cp_len(content.text);
    r.interior_begin = 1;
    r.interior_end = 1 + int64_t(content.ids.size());
    r.anchors["bos"] = 0;
    for (const auto& a : anchor_names())
      if (a != "bos") r.missing[a] = "a raw layout has no chat structure";
    return r;
  }
  // Where the template puts the content: render with a sentinel, then check that the real
  // rendering is the same text with the content in the sentinel's place.
  static const std::string sentinel = "\x01\x02probe-target\x02\x01";
  const std::string with_sentinel = apply_template(c, cond, sentinel);
  const size_t pos = with_sentinel.find(sentinel);
  if (pos == std::string::npos || with_sentinel.find(sentinel, pos + 1) != std::string::npos)
    fail(c.p.path, where, "the chat template does not place the target content exactly once");
  const std::string prefix = with_sentinel.substr(0, pos), suffix = with_sentinel.substr(pos + sentinel.size());
  r.text = apply_template(c, cond, content.text);
  if (r.text != prefix + content.text + suffix)
    fail(c.p.path, where, "the chat template does not place the target content verbatim");
  r.span_start = cp_len(prefix);
  r.span_end = r.span_start + cp_len(content.text);
  const Encoding e = c.tok.encode(r.text, {.add_special_tokens = false});
  r.ids = e.ids;
  // Interior tokens: wholly inside the content span; tokens that overlap it partly cross the boundary.
  r.interior_begin = -1;
  for (size_t i = 0; i < e.ids.size(); ++i) {
    const Span s = e.offsets[i];
    const bool inside = s.start >= r.span_start && s.end <= r.span_end && s.end > s.start;
    const bool overlaps = s.start < r.span_end && s.end > r.span_start;
    if (inside) {
      if (r.interior_begin < 0) r.interior_begin = int64_t(i);
      else if (r.interior_end != int64_t(i)) fail(c.p.path, where, "interior tokens are not contiguous");
      r.interior_end = int64_t(i) + 1;
    } else if (overlaps) {
      ++r.crossing;
    }
  }
  if (r.interior_begin < 0) fail(c.p.path, where, "the target content has no interior token");

  if (!r.ids.empty() && r.ids[0] == c.bos) r.anchors["bos"] = 0;
  else r.missing["bos"] = "the rendering does not start with BOS";
  int64_t head = -1;
  if (prefix.size() >= c.p.user_prefix.size() && prefix.compare(prefix.size() - c.p.user_prefix.size(), std::string::npos, c.p.user_prefix) == 0) {
    head = token_starting_at(e, r.span_start - cp_len(c.p.user_prefix));
    if (head < 0) r.missing["target_role_head"] = "no token starts at the role marker before the target";
  } else {
    r.missing["target_role_head"] = "the template does not write user_prefix '" + c.p.user_prefix + "' before the target";
  }
  if (head >= 0) {
    r.anchors["target_role_head"] = head;
    // The delimiter: the last token wholly inside the role marker (":" of "User: ").
    int64_t delim = -1;
    for (int64_t i = head + 1; i < int64_t(e.ids.size()) && e.offsets[size_t(i)].end <= r.span_start; ++i)
      if (e.offsets[size_t(i)].end > e.offsets[size_t(i)].start) delim = i;
    if (delim > head) r.anchors["target_role_delim"] = delim;
    else r.missing["target_role_delim"] = "the role marker is a single token";
  } else {
    r.missing["target_role_delim"] = "no role marker head";
  }
  const int64_t limit = head >= 0 ? head : r.interior_begin;
  int64_t eos_pos = -1;
  for (int64_t i = 0; i < limit; ++i)
    if (r.ids[size_t(i)] == c.eos) eos_pos = i;
  if (eos_pos >= 0) r.anchors["history_eos"] = eos_pos;
  else r.missing["history_eos"] = "no assistant EOS before the target (condition without history?)";
  const size_t g = cond.layout == "chat" ? suffix.find(c.p.generation_prompt) : std::string::npos;
  if (g != std::string::npos) {
    const int64_t gs = r.span_end + cp_len(suffix.substr(0, g));
    const int64_t gh = token_starting_at(e, gs);
    if (gh >= 0) {
      r.anchors["gen_role_head"] = gh;
      const int64_t ge = gs + cp_len(c.p.generation_prompt);
      int64_t delim = -1;
      for (int64_t i = gh + 1; i < int64_t(e.ids.size()) && e.offsets[size_t(i)].end <= ge; ++i)
        if (e.offsets[size_t(i)].end > e.offsets[size_t(i)].start) delim = i;
      if (delim > gh) r.anchors["gen_role_delim"] = delim;
      else r.missing["gen_role_delim"] = "the generation prompt is a single token";
    } else {
      r.missing["gen_role_head"] = "no token starts at the generation prompt";
      r.missing["gen_role_delim"] = "no generation prompt head";
    }
  } else {
    r.missing["gen_role_head"] = "no generation prompt after the target (layout is not chat?)";
    r.missing["gen_role_delim"] = r.missing["gen_role_head"];
  }
  return r;
}

int64_t anchor_pos(const Rendering& r, const std::string& name, const std::string& file, const std::string& where) {
  auto it = r.anchors.find(name);
  if (it != r.anchors.end()) return it->second;
  auto m = r.missing.find(name);
  fail(file, where, "anchor " + name + " not found: " + (m != r.missing.end() ? m->second : "unknown anchor"));
}

// The files a manifest's add:FILE edits read: where the manifest goes, and each file's SHA-256 by
// the path the manifest records.
struct HookFiles {
  std::string manifest_dir;                 // FreezeOptions::manifest_dir ("": the working directory)
  std::map<std::string, std::string> pins;  // recorded path -> SHA-256
  // `path` (as found from here) relative to the manifest's directory, so that run and audit find
  // it there wherever the two travel together (".." where it lies outside).
  std::string relative_to_manifest(const std::string& path) const {
    const std::string rel = path_relative_to(path, manifest_dir.empty() ? "." : manifest_dir);
    return rel.empty() ? fs::absolute(path).lexically_normal().string() : rel;
  }
};

// A condition's hook edits with this cell's positions: TOKENS items naming an anchor (NAME,
// NAME+N, NAME-N) become its position (plus the offset), "target" the interior range A-B; numbers stay. Checked against the model's config
// where freeze has one (`cfg`), as run checks them again before anything is written.
// `sibling_tokens`: the token count of each condition's cell of the same source, for patch:@.
// add:FILE paths resolve against the protocol file's directory and are written relative to the
// manifest's (HookFiles; absolute ones stay as given); `files` collects each file's SHA-256 under
// that name (the manifest pins them; run checks them before anything runs).
std::vector<std::string> resolve_interventions(const ConditionSpec& cond, const Rendering& r, int64_t n_tokens,
                                               const std::map<std::string, int64_t>& sibling_tokens,
                                               const std::optional<std::pair<ModelConfig, LayerRange>>& model,
                                               bool generation, const std::string& file, const std::string& where,
                                               HookFiles& files) {
  std::vector<std::string> out;
  for (size_t k = 0; k < cond.interventions.size(); ++k) {
    std::string spec = cond.interventions[k];
    const std::string iw = where + ": interventions[" + std::to_string(k) + "]";
    if (const size_t add = spec.find("=add:"); add != std::string::npos) {
      const bool has_factor = spec.find('*', add) != std::string::npos;
      auto [path, factor] = split_add_payload(std::string_view(spec).substr(add + 5));
      std::string recorded = path;
      if (!fs::path(path).is_absolute()) {
        path = path_from(fs::path(file).parent_path().string(), path);
        recorded = files.relative_to_manifest(path);
      }
      if (!file_exists(path)) fail(file, iw, "'" + spec + "': " + path + " not found");
      if (!files.pins.count(recorded)) files.pins[recorded] = sha256_file(path);
      spec = spec.substr(0, add + 5) + recorded + (has_factor ? "*" + factor : "");
    }
    const size_t eq = spec.find('='), at = spec.find('@');
    if (at == std::string::npos || at > eq) {
      out.push_back(spec);
      continue;
    }
    std::string list;
    size_t a = at + 1;
    for (size_t b = a; b <= eq; ++b) {
      if (b < eq && spec[b] != ',') continue;
      const std::string item = spec.substr(a, b - a);
      std::string pos = item;
      if (item == "target") {
        if (r.interior_end <= r.interior_begin) fail(file, iw, "'" + spec + "': the cell has no target tokens");
        pos = std::to_string(r.interior_begin) + "-" + std::to_string(r.interior_end - 1);
      } else if (!item.empty() && !std::isdigit(static_cast<unsigned char>(item[0]))) {
        // An anchor, maybe offset (load_protocol checked the form): the position must be a token
        // of this cell.
        const AnchorRef ref = parse_anchor_ref(item).value();
        const int64_t p = anchor_pos(r, ref.name, file, iw) + ref.offset;
        if (p < 0 || p >= n_tokens)
          fail(file, iw, "'" + spec + "': " + item + " is position " + std::to_string(p) + ", outside the cell's " +
                             std::to_string(n_tokens) + " tokens");
        pos = std::to_string(p);
      }
      list += (list.empty() ? "" : ",") + pos;
      a = b + 1;
    }
    out.push_back(spec.substr(0, at) + "@" + list + spec.substr(eq));
  }
  // A sibling's row must hold every position the patch writes (every token: the same length).
  for (size_t k = 0; k < out.size(); ++k) {
    const size_t p = out[k].find("=patch:@");
    if (p == std::string::npos) continue;
    const std::string ref = out[k].substr(p + 8);
    const int64_t have = sibling_tokens.at(ref);
    const size_t at = out[k].find('@');
    const std::string kw = where + ": interventions[" + std::to_string(k) + "]";
    const int64_t last =  // the largest position named (a list, resolved above)
        at < p ? parse_token_list(std::string_view(out[k]).substr(at + 1, p - at - 1), file + ": " + kw + ": '" + out[k] + "'").back()
               : -1;
    if (at < p ? last >= have : have != n_tokens)
      fail(file, kw,
           "'" + out[k] + "': the " + ref + " cell has " + std::to_string(have) + " tokens; " +
               (at < p ? "position " + std::to_string(last) + " is not among them" : "patching every token needs " + std::to_string(n_tokens)));
  }
  if (model && !out.empty()) {
    try {
      const auto& [cfg, range] = *model;
      Interventions edits(out, cfg, range, range.last == cfg.num_hidden_layers - 1, true, files.manifest_dir);
      edits.check_tokens(n_tokens, "the cell's " + std::to_string(n_tokens) + " tokens");
      if (generation) edits.check_for_generation();
    } catch (const Error& e) {
      fail(file, where, e.what());
    }
  }
  return out;
}

int32_t resolve_to(const Tokenizer& tok, const std::string& to, int32_t bos, int32_t eos, const std::string& file,
                   const std::string& where) {
  if (to == "<bos>") return bos;
  if (to == "<eos>") return eos;
  // Ordinary tokens come from the tokenizer itself: the same protocol works on any vocabulary.
  auto ids = tok.encode_ids(to, {.add_special_tokens = false});
  if (ids.size() != 1) {
    std::string got;
    for (auto i : ids) {
      if (!got.empty()) got += ',';
      got += std::to_string(i);
    }
    fail(file, where, "edit target '" + to + "' must be exactly one token, the tokenizer gives [" + got + "]");
  }
  return ids[0];
}

Content make_content(const Tokenizer& tok, const Source& s, int64_t n) {
  Encoding e = tok.encode(s.text, {.add_special_tokens = false});
  Content c{.requested = n, .ids = {}, .text = {}};
  if (n == 0 || int64_t(e.ids.size()) <= n) {
    c.ids = e.ids;
    c.text = s.text;
  } else {
    c.ids.assign(e.ids.begin(), e.ids.begin() + n);
    c.text = s.text.substr(0, size_t(e.byte_offsets[size_t(n - 1)].end));
  }
  return c;
}

std::string join_ids_sha(const std::vector<int32_t>& v, int64_t a, int64_t b) {
  return ids_sha256(std::span<const int32_t>(v.data() + a, size_t(b - a)));
}

}  // namespace

std::string manifest_hash(const ojson& manifest) {
  ojson m = manifest;
  m.erase("manifest_sha256");
  return sha256_hex(m.dump());
}

ojson load_manifest(const std::string& path) {
  if (!file_exists(path)) fail(path, {}, "manifest not found");
  ojson m;
  try {
    m = ojson::parse(read_file(path));
  } catch (const std::exception& e) {
    fail(path, {}, std::string("malformed JSON: ") + e.what());
  }
  if (!m.is_object() || string_or_empty(m, "kind") != "atlas.probe.manifest") fail(path, "kind", "not an atlas probe manifest");
  if (!m.contains("manifest_sha256") || !m["manifest_sha256"].is_string()) fail(path, "manifest_sha256", "missing");
  if (manifest_hash(m) != m["manifest_sha256"].get<std::string>())
    fail(path, "manifest_sha256", "does not match the manifest's content (modified after freezing?)");
  return m;
}

LayerRange protocol_layers(const std::string& spec, const ModelConfig& cfg, const std::string& model_dir,
                           const std::string& file, const std::string& field) {
  try {
    return LayerRange::parse(spec, cfg);
  } catch (const Error& e) {
    fail(file, field, std::string(e.what()) + " (model " + model_dir + ")");
  }
}

namespace {

// A frozen manifest whose selection a protocol reuses ([selection] reference): its sources by
// domain in rank order. The manifest must be whole (its own hash) and its ranks per domain
// 0, 1, 2, ... in that order.
struct RefSource {
  std::string source_id, text_sha256, rank_sha;
  int64_t rank = 0;
};
struct Reference {
  std::string path, file_sha256, manifest_sha256, protocol;
  std::map<std::string, std::vector<RefSource>> by_domain;
};
Reference read_reference(const std::string& path) {
  const ojson j = load_manifest(path);  // a probe manifest, whole (its own hash)
  const auto str = [&](const ojson& o, const char* key, const std::string& where) {
    if (!o.is_object() || !o.contains(key) || !o[key].is_string()) fail(path, where + key, "missing or not a string");
    return o[key].get<std::string>();
  };
  Reference r{.path = path, .file_sha256 = sha256_file(path), .manifest_sha256 = str(j, "manifest_sha256", ""),
              .protocol = j.contains("protocol") ? str(j["protocol"], "name", "protocol.") : "", .by_domain = {}};
  if (!j.contains("sources") || !j["sources"].is_array()) fail(path, "sources", "missing or not an array");
  for (size_t i = 0; i < j["sources"].size(); ++i) {
    const ojson& s = j["sources"][i];
    const std::string w = "sources[" + std::to_string(i) + "].";
    if (!s.is_object() || !s.contains("rank") || !s["rank"].is_number_integer()) fail(path, w + "rank", "missing or not an integer");
    RefSource e{.source_id = str(s, "source_id", w), .text_sha256 = str(s, "text_sha256", w),
                .rank_sha = str(s, "rank_sha256", w), .rank = s["rank"].get<int64_t>()};
    auto& list = r.by_domain[str(s, "domain", w)];
    if (e.rank != int64_t(list.size()))
      fail(path, w + "rank", std::to_string(e.rank) + " where " + std::to_string(list.size()) + " comes next in its domain");
    list.push_back(std::move(e));
  }
  return r;
}

}  // namespace

ojson freeze(const FreezeOptions& o) {
  Protocol p = load_protocol(o.protocol);
  if (!o.model_dir.empty()) p.model_dir = o.model_dir;
  if (!o.data_root.empty()) p.data_root = o.data_root;
  if (o.per_domain) {
    if (*o.per_domain <= 0) fail("--per-domain", {}, "must be positive");
    p.per_domain = *o.per_domain;
  }
  if (!o.selection_reference.empty()) p.selection_reference = o.selection_reference;
  if (p.model_dir.empty()) fail(p.path, "model.dir", "no model directory (set it or pass --model)");
  // A trace's layer range against the model's config, where the directory has one (run checks
  // the range again, and that the config is the one recorded here): a range the model lacks fails
  // when freezing, not when the frozen manifest runs.
  std::optional<std::pair<ModelConfig, LayerRange>> model_cfg;  // where the directory has a config
  if (file_exists(p.model_dir + "/config.json")) {
    const ModelConfig cfg = ModelConfig::load(p.model_dir + "/config.json");
    model_cfg.emplace(cfg, p.mode == "trace" ? protocol_layers(p.layers, cfg, p.model_dir, p.path, "execution.layers")
                                             : LayerRange::all(cfg));
  }
  const std::string tok_json = p.model_dir + "/tokenizer.json";
  if (!file_exists(tok_json)) fail(tok_json, {}, "the model directory has no tokenizer.json (freezing needs the tokenizer)");
  const Tokenizer tok = Tokenizer::load_dir(p.model_dir);
  Ctx c{.p = p, .tok = tok, .tmpl = {}, .vars = {}, .bos_text = tok.config().bos_token,
        .eos_text = tok.config().eos_token, .bos = -1, .eos = -1, .filler_user = {}, .filler_assistant = {},
        .edit_ids = {}};
  const std::string cfg_file = p.model_dir + "/tokenizer_config.json";
  if (!tok.bos_id() || !tok.eos_id()) fail(cfg_file, "bos_token/eos_token", "the tokenizer needs BOS and EOS tokens");
  c.bos = *tok.bos_id();
  c.eos = *tok.eos_id();
  const bool need_template = std::any_of(p.conditions.begin(), p.conditions.end(), [](auto& x) { return x.layout != "raw"; });
  std::string template_sha;
  if (need_template) {
    // The loader atlas render and atlas generate use too (text/chat.h): same template, same variables.
    ChatTemplateSource src = load_chat_template(p.model_dir);
    c.tmpl.emplace(src.text, src.origin);
    c.vars = src.vars;
    template_sha = sha256_hex(src.text);
  }
  for (const auto& cond : p.conditions) {
    if (cond.system && p.system_text.empty()) fail(p.path, "blocks.system", "condition " + cond.name + " needs a system text");
    if (cond.history == "one_shot" && (p.one_shot_user.empty() || p.one_shot_assistant.empty()))
      fail(p.path, "blocks.one_shot_user", "condition " + cond.name + " needs the one-shot texts");
    for (size_t k = 0; k < cond.edits.size(); ++k)
      if (!cond.edits[k].to.empty())
        c.edit_ids[cond.edits[k].to] = resolve_to(tok, cond.edits[k].to, c.bos, c.eos, p.path,
                                                  "condition " + cond.name + ".edits[" + std::to_string(k) + "].to");
  }

  // Filler: the user turn is filler_token repeated filler_repeat times (space separated), the
  // reply is filler_token. With match_one_shot, the user count (and, only if no count fits,
  // a reply of 2..4 filler tokens) is chosen so the filler history has exactly the one-shot
  // history's token length: the smallest reply count first, then the smallest user count.
  auto filler_text = [&](int64_t n) {
    std::string s;
    for (int64_t i = 0; i < n; ++i) s += (i ? " " : "") + p.filler_token;
    return s;
  };
  int64_t filler_repeat = p.filler_repeat, reply_repeat = 1;
  if (p.filler_match_one_shot) {
    if (!c.tmpl) fail(p.path, "blocks.filler_repeat", "match_one_shot needs a chat template");
    auto hist_len = [&](const std::string& hist) {
      ConditionSpec probe{.name = "probe", .layout = "chat", .system = false, .history = hist, .group = {}, .edits = {}};
      return int64_t(tok.encode_ids(apply_template(c, probe, "q"), {.add_special_tokens = false}).size());
    };
    const int64_t want = hist_len("one_shot");
    filler_repeat = 0;
    for (int64_t a = 1; a <= 4 && !filler_repeat; ++a) {
      c.filler_assistant = filler_text(a);
      for (int64_t n = 1; n <= 256 && !filler_repeat; ++n) {
        c.filler_user = filler_text(n);
        if (hist_len("filler") == want) filler_repeat = n, reply_repeat = a;
      }
    }
    if (!filler_repeat)
      fail(p.path, "blocks.filler_repeat", "no repeat count makes the filler history as long as the one-shot history");
  }
  c.filler_user = filler_text(filler_repeat);
  c.filler_assistant = filler_text(reply_repeat);

  // Corpora and selection.
  ojson corpora = ojson::array(), selection = ojson::array(), sources_j = ojson::array();
  struct Picked {
    Source src;
    int64_t rank;
    std::string rank_sha;
    int64_t n_tokens;
  };
  std::vector<Picked> picked;
  const std::optional<Reference> ref =
      p.selection_reference.empty() ? std::nullopt : std::optional(read_reference(p.selection_reference));
  for (CorpusSpec spec : p.corpora) {
    if (spec.format != "inline" && !fs::path(spec.path).is_absolute())
      spec.path = (fs::path(p.data_root.empty() ? "." : p.data_root) / spec.path).lexically_normal().string();
    Corpus corpus = read_corpus(spec);
    corpora.push_back({{"domain", spec.domain}, {"format", spec.format}, {"path", spec.path}, {"member", spec.member},
                       {"file_sha256", corpus.file_sha256}, {"member_sha256", corpus.member_sha256},
                       {"records", corpus.sources.size()}});
    if (ref) {  // the reference manifest's sources of this domain, in its rank order
      static const std::vector<RefSource> none;
      const auto found = ref->by_domain.find(spec.domain);
      const auto& list = found == ref->by_domain.end() ? none : found->second;
      const std::string where = "sources of domain \"" + spec.domain + "\"";
      if (int64_t(list.size()) < p.per_domain)
        fail(ref->path, where, "the reference has " + std::to_string(list.size()) + ", the protocol asks for " +
                                   std::to_string(p.per_domain));
      std::map<std::string, size_t> by_id;
      for (size_t i = 0; i < corpus.sources.size(); ++i) by_id.emplace(corpus.sources[i].source_id, i);
      for (int64_t k = 0; k < p.per_domain; ++k) {
        const RefSource& r = list[size_t(k)];
        auto it = by_id.find(r.source_id);
        if (it == by_id.end())
          fail(ref->path, where, "source " + r.source_id + " (rank " + std::to_string(r.rank) + ") is not in " + spec.path);
        const Source& s = corpus.sources[it->second];
        // The same text, not only the same id (seed-system.md 2.4: chat reuse re-hashes it).
        if (s.text_sha256 != r.text_sha256)
          fail(ref->path, where, "source " + r.source_id + ": its text in " + spec.path + " hashes to " + s.text_sha256 +
                                     ", the reference recorded " + r.text_sha256);
        const int64_t n = int64_t(tok.encode_ids(s.text, {.add_special_tokens = false}).size());
        picked.push_back({.src = s, .rank = r.rank, .rank_sha = r.rank_sha, .n_tokens = n});
      }
      selection.push_back({{"domain", spec.domain}, {"considered", p.per_domain}, {"selected", p.per_domain},
                           {"excluded", {{"blank", 0}, {"heading", 0}, {"min_tokens", 0}}},
                           {"reference", {{"file_sha256", ref->file_sha256}, {"manifest_sha256", ref->manifest_sha256},
                                          {"protocol", ref->protocol}}}});
      continue;
    }
    std::vector<std::pair<std::string, size_t>> order;
    for (size_t i = 0; i < corpus.sources.size(); ++i)
      order.push_back({sha256_hex(rank_preimage(p.salt, spec.domain, corpus.sources[i].source_id)), i});
    std::sort(order.begin(), order.end());
    int64_t taken = 0, blank = 0, heading = 0, short_ = 0, considered = 0;
    for (const auto& [h, i] : order) {
      if (taken == p.per_domain) break;
      ++considered;
      const Source& s = corpus.sources[i];
      if (p.skip_blank && is_blank(s.text)) { ++blank; continue; }
      if (p.skip_headings && spec.format == "wikitext" && is_wikitext_heading(s.text)) { ++heading; continue; }
      const int64_t n = int64_t(tok.encode_ids(s.text, {.add_special_tokens = false}).size());
      if (n < p.min_tokens) { ++short_; continue; }
      picked.push_back({.src = s, .rank = taken, .rank_sha = h, .n_tokens = n});
      ++taken;
    }
    if (taken < p.per_domain)
      fail(spec.path.empty() ? p.path : spec.path, spec.domain,
           "only " + std::to_string(taken) + " eligible sources, the protocol asks for " + std::to_string(p.per_domain));
    selection.push_back({{"domain", spec.domain}, {"considered", considered}, {"selected", taken},
                         {"excluded", {{"blank", blank}, {"heading", heading}, {"min_tokens", short_}}}});
  }

  // Cells: source -> content length -> seed -> condition.
  ojson cells = ojson::array();
  std::vector<std::vector<size_t>> source_cells;  // per picked source
  std::map<std::string, int64_t> edit_hist;
  HookFiles intervention_files{.manifest_dir = o.manifest_dir};  // add:FILE path -> SHA-256
  int64_t crossing_total = 0, groups_checked = 0;
  const bool multi_n = p.content_tokens.size() > 1;
  std::vector<SeedSpec> seeds = p.seeds;
  if (seeds.empty()) seeds.push_back({.value = 0, .sources_per_domain = 0});
  const bool has_seeds = !p.seeds.empty();
  for (const Picked& pk : picked) {
    const Source& s = pk.src;
    const std::string key = s.domain + ":" + s.source_id;
    ojson contents = ojson::array();
    source_cells.emplace_back();
    std::map<std::string, std::vector<int32_t>> prev_by_cond;  // nested-prefix check
    for (int64_t n : p.content_tokens) {
      const Content content = make_content(tok, s, n);
      contents.push_back({{"content_tokens", n}, {"n_tokens", content.ids.size()}, {"text", content.text},
                          {"sha256", sha256_hex(content.text)}, {"ids_sha256", ids_sha256(content.ids)}});
      // Render every condition once (seeds repeat the same prompt).
      std::vector<Rendering> off;
      std::vector<std::vector<int32_t>> edited;
      std::vector<ojson> edits_j;
      for (const auto& cond : p.conditions) {
        const std::string where = "cell " + key + ":" + (multi_n ? "n" + std::to_string(n) + ":" : "") + cond.name;
        Rendering r = render(c, cond, content, where);
        std::vector<int32_t> ids = r.ids;
        ojson ej = ojson::array();
        std::set<int64_t> positions;
        for (size_t k = 0; k < cond.edits.size(); ++k) {
          const EditSpec& ed = cond.edits[k];
          const std::string ew = where + ": edits[" + std::to_string(k) + "]";
          const int64_t pos = anchor_pos(r, ed.anchor, p.path, ew);
          const int32_t nid = ed.to.empty() ? r.ids[size_t(anchor_pos(r, ed.to_anchor, p.path, ew))] : c.edit_ids.at(ed.to);
          if (nid == r.ids[size_t(pos)])
            fail(p.path, ew, "contract: the edit does not change the id at " + ed.anchor + " (both " + std::to_string(nid) + ")");
          if (!positions.insert(pos).second) fail(p.path, ew, "contract: two edits at position " + std::to_string(pos));
          if (pos >= r.interior_begin && pos < r.interior_end) fail(p.path, ew, "contract: the edit falls inside the target content");
          ids[size_t(pos)] = nid;
          ej.push_back({{"anchor", ed.anchor}, {"position", pos}, {"official_id", r.ids[size_t(pos)]}, {"new_id", nid}});
        }
        int64_t differing = 0;
        for (size_t i = 0; i < ids.size(); ++i) differing += ids[i] != r.ids[i];
        if (differing != int64_t(cond.edits.size()))
          fail(p.path, where, "contract: " + std::to_string(differing) + " ids differ from the official rendering, declared " +
                                  std::to_string(cond.edits.size()));
        off.push_back(std::move(r));
        edited.push_back(std::move(ids));
        edits_j.push_back(std::move(ej));
      }
      // Group contracts within this source and content length.
      const std::string where0 = "cell " + key + (multi_n ? ":n" + std::to_string(n) : "");
      std::map<std::string, size_t> group_first;
      for (size_t k = 0; k < p.conditions.size(); ++k) {
        const auto& cond = p.conditions[k];
        if (p.same_content_ids) {
          auto a = std::vector<int32_t>(edited[0].begin() + off[0].interior_begin, edited[0].begin() + off[0].interior_end);
          auto b = std::vector<int32_t>(edited[k].begin() + off[k].interior_begin, edited[k].begin() + off[k].interior_end);
          if (a != b)
            fail(p.path, where0 + ":" + cond.name,
                 "contract: target content ids differ from condition " + p.conditions[0].name);
        }
        if (cond.group.empty()) continue;
        auto [it, fresh] = group_first.try_emplace(cond.group, k);
        if (fresh) { ++groups_checked; continue; }
        const size_t f = it->second;
        if (edited[k].size() != edited[f].size())
          fail(p.path, where0 + ":" + cond.name,
               "contract: group " + cond.group + " needs equal length, " + std::to_string(edited[k].size()) + " vs " +
                   std::to_string(edited[f].size()) + " (" + p.conditions[f].name + ")");
        if (off[k].interior_begin != off[f].interior_begin)
          fail(p.path, where0 + ":" + cond.name, "contract: group " + cond.group + " needs the same target position");
      }
      for (const auto& q : p.equal_delta) {
        auto len = [&](const std::string& nm) {
          for (size_t k = 0; k < p.conditions.size(); ++k)
            if (p.conditions[k].name == nm) return int64_t(edited[k].size());
          return int64_t(0);
        };
        if (len(q[0]) - len(q[1]) != len(q[2]) - len(q[3]))
          fail(p.path, where0, "contract: equal_delta " + q[0] + "-" + q[1] + " (" + std::to_string(len(q[0]) - len(q[1])) +
                                   ") != " + q[2] + "-" + q[3] + " (" + std::to_string(len(q[2]) - len(q[3])) + ")");
      }
      if (p.nested_prefixes) {
        for (size_t k = 0; k < p.conditions.size(); ++k) {
          const auto& cur = p.conditions[k].layout == "raw"
                                ? edited[k]
                                : std::vector<int32_t>(edited[k].begin() + off[k].interior_begin,
                                                       edited[k].begin() + off[k].interior_end);
          auto& prev = prev_by_cond[p.conditions[k].name];
          if (!prev.empty() && (prev.size() > cur.size() || !std::equal(prev.begin(), prev.end(), cur.begin())))
            fail(p.path, where0 + ":" + p.conditions[k].name, "contract: the shorter prefix's ids are not a prefix of this one's");
          prev = cur;
        }
      }
      for (const SeedSpec& sd : seeds) {
        if (sd.sources_per_domain > 0 && pk.rank >= sd.sources_per_domain) continue;
        for (size_t k = 0; k < p.conditions.size(); ++k) {
          const auto& cond = p.conditions[k];
          const Rendering& r = off[k];
          std::string cid = key + ":" + (multi_n ? "n" + std::to_string(n) + ":" : "") +
                            (has_seeds ? "seed" + std::to_string(sd.value) + ":" : "") + cond.name;
          ojson cell;
          cell["index"] = cells.size();
          cell["cell_id"] = cid;
          cell["source_key"] = key;
          cell["source_id"] = s.source_id;
          cell["domain"] = s.domain;
          cell["rank"] = pk.rank;
          cell["content_tokens"] = n;
          cell["condition"] = cond.name;
          cell["layout"] = cond.layout;
          cell["system"] = cond.system;
          cell["history"] = cond.history;
          cell["group"] = cond.group;
          cell["seed"] = has_seeds ? ojson(sd.value) : ojson(nullptr);
          cell["batch"] = -1;
          cell["n_tokens"] = edited[k].size();
          cell["input_ids"] = edited[k];
          cell["prompt_sha256"] = ids_sha256(edited[k]);
          cell["official_prompt_sha256"] = ids_sha256(r.ids);
          cell["rendered_text_sha256"] = sha256_hex(r.text);
          cell["target_span"] = {r.span_start, r.span_end};
          cell["target_text_sha256"] = sha256_hex(content.text);
          cell["interior_token_range"] = {r.interior_begin, r.interior_end};
          cell["boundary_crossing"] = r.crossing;
          cell["target_ids_sha256"] = join_ids_sha(edited[k], r.interior_begin, r.interior_end);
          ojson an = ojson::object();
          for (const auto& a : anchor_names())
            if (r.anchors.count(a)) an[a] = r.anchors.at(a);
          cell["anchors"] = an;
          cell["edits"] = edits_j[k];
          // Only for conditions that declare hook edits (other manifests keep their bytes).
          if (!cond.interventions.empty()) {
            std::map<std::string, int64_t> sibling_tokens;
            for (size_t q = 0; q < p.conditions.size(); ++q) sibling_tokens[p.conditions[q].name] = int64_t(edited[q].size());
            cell["interventions"] = resolve_interventions(cond, r, int64_t(edited[k].size()), sibling_tokens, model_cfg,
                                                          p.mode == "generate", p.path, cid, intervention_files);
          }
          edit_hist[std::to_string(cond.edits.size())]++;
          crossing_total += r.crossing;
          source_cells.back().push_back(cells.size());
          cells.push_back(std::move(cell));
        }
      }
    }
    sources_j.push_back({{"key", key}, {"domain", s.domain}, {"source_id", s.source_id}, {"record", s.record},
                         {"rank", pk.rank}, {"rank_sha256", pk.rank_sha}, {"text_sha256", s.text_sha256},
                         {"n_tokens", pk.n_tokens}, {"gold", s.gold}, {"contents", contents}});
  }

  // Batches: sources_per_batch consecutive sources (all their cells) per batch, one batch per
  // seed with split_seeds. A shard unit is such a group of sources, so a source's journal is
  // always written by one process.
  ojson batches = ojson::array();
  const size_t spb = size_t(p.sources_per_batch);
  for (size_t g = 0; g * spb < source_cells.size(); ++g) {
    std::vector<std::pair<std::string, std::vector<size_t>>> parts;  // seed key -> cells
    for (size_t si = g * spb; si < std::min(source_cells.size(), (g + 1) * spb); ++si)
      for (size_t ci : source_cells[si]) {
        const std::string sk = p.split_seeds ? cells[ci]["seed"].dump() : "";
        auto it = std::find_if(parts.begin(), parts.end(), [&](auto& x) { return x.first == sk; });
        if (it == parts.end()) parts.push_back({sk, {ci}});
        else it->second.push_back(ci);
      }
    for (auto& [sk, members] : parts) {
      for (size_t ci : members) cells[ci]["batch"] = batches.size();
      batches.push_back({{"index", batches.size()}, {"unit", g}, {"cells", members}});
    }
  }

  ojson m;
  m["kind"] = "atlas.probe.manifest";
  m["format_version"] = 1;
  m["protocol"] = p.to_json();
  m["protocol"]["path"] = p.path;
  m["model"] = {{"dir", p.model_dir},
                {"config_sha256", file_exists(p.model_dir + "/config.json") ? ojson(sha256_file(p.model_dir + "/config.json")) : ojson(nullptr)},
                {"manifest", p.model_manifest}};
  m["tokenizer"] = {{"tokenizer_json_sha256", sha256_file(tok_json)},
                    {"tokenizer_config_sha256", file_exists(cfg_file) ? ojson(sha256_file(cfg_file)) : ojson(nullptr)},
                    {"chat_template_sha256", template_sha},
                    {"bos_id", c.bos},
                    {"eos_id", c.eos}};
  m["blocks"] = {{"system", p.system_text}, {"system_sha256", sha256_hex(p.system_text)},
                 {"one_shot_user", p.one_shot_user}, {"one_shot_assistant", p.one_shot_assistant},
                 {"filler_user", c.filler_user}, {"filler_assistant", c.filler_assistant}, {"filler_repeat", filler_repeat},
                 {"filler_reply_repeat", reply_repeat},
                 {"user_prefix", p.user_prefix}, {"generation_prompt", p.generation_prompt}};
  ojson eids = ojson::object();
  for (const auto& [k, v] : c.edit_ids) eids[k] = v;
  m["edit_ids"] = eids;
  m["corpora"] = corpora;
  m["selection"] = selection;
  m["sources"] = sources_j;
  ojson hist = ojson::object();
  for (const auto& [k, v] : edit_hist) hist[k] = v;
  m["contracts"] = {{"verified", true},
                    {"cells", cells.size()},
                    {"sources", picked.size()},
                    {"conditions", p.conditions.size()},
                    {"groups_checked", groups_checked},
                    {"cells_by_edit_count", hist},
                    {"boundary_crossing_total", crossing_total}};
  // The files hook edits read (add:FILE), by path relative to the manifest's directory: only
  // where there are any, so other manifests keep their bytes.
  if (!intervention_files.pins.empty()) {
    ojson f = ojson::object();
    for (const auto& [path, sha] : intervention_files.pins) f[path] = sha;
    m["intervention_files"] = f;
  }
  m["batches"] = batches;
  m["cells"] = cells;
  m["manifest_sha256"] = manifest_hash(m);
  return m;
}

std::string manifest_files_base(const std::string& manifest_path) {
  return fs::path(manifest_path).parent_path().string();
}

std::string manifest_file_path(const std::string& files_base, const std::string& recorded) {
  return files_base.empty() ? recorded : path_from(files_base, recorded);
}

}  // namespace atlas::probe
