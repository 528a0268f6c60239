// The comparison engine on small hand-written artifacts: each test plants one change and checks
// that exactly that change is found, in the right cell, field and family.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "audit/artifact.h"
#include "audit/compare.h"
#include "audit/hash_chain.h"
#include "core/error.h"
#include "core/sha256.h"

using namespace atlas;
using namespace atlas::audit;
namespace fs = std::filesystem;

namespace {

class AuditTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("atlas_audit_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string put(const std::string& name, const std::string& text) {
    const std::string p = (dir_ / name).string();
    std::ofstream(p, std::ios::binary) << text;
    return p;
  }

  // A generation artifact: rows (one JSON object each) plus its sidecar.
  std::string generation(const std::string& name, const std::vector<json>& rows, json meta_patch = json::object()) {
    std::string text;
    for (const auto& r : rows) text += r.dump() + "\n";
    json meta = {{"kind", "atlas.generate"},
                 {"format_version", 1},
                 {"provenance", {{"tool", "atlas"}, {"git_commit", "abc"}}},
                 {"decoding", {{"mode", "greedy"}, {"max_new_tokens", 4}}},
                 {"rows", int64_t(rows.size())},
                 {"stops", {{"eos", 0}, {"length", int64_t(rows.size())}}},
                 {"runtime", {{"seconds", 1.5}}}};
    meta.merge_patch(meta_patch);
    put(name + ".meta.json", meta.dump(2));
    return put(name, text);
  }

  static json row(const std::string& id, std::vector<int> ids) {
    return {{"id", id},   {"prompt_sha256", "p-" + id}, {"ids", ids},          {"text", "t-" + id},
            {"stop", "length"}, {"n_new", int64_t(ids.size())}, {"rng_state_sha256", nullptr}};
  }
  static std::vector<json> rows3() { return {row("a", {1, 2, 3}), row("b", {4, 5, 6, 7}), row("c", {8})}; }

  static json trace() {
    json stages = json::array(), gates = json::array();
    for (int s = 0; s < 3; ++s)
      stages.push_back({{"stage", s}, {"name", "hidden." + std::to_string(s)}, {"shape", {2, 4}},
                        {"mean", 0.5 * s}, {"l2", 1.0 + s}, {"sha256", "h" + std::to_string(s)}});
    for (int l = 1; l < 3; ++l)
      gates.push_back({{"layer", l}, {"k", 2}, {"topk_ids_sha256", "i" + std::to_string(l)},
                       {"topk_weights_sha256", "w" + std::to_string(l)}, {"load", {1, 3, 0, 0}}});
    return {{"kind", "atlas.trace"},
            {"provenance", {{"tool", "atlas"}, {"git_commit", "abc"}}},
            {"input", {{"ids", {5, 6}}, {"prompt_sha256", "p"}}},
            {"stages", stages},
            {"gates", gates},
            {"logits", {{"l2", 9.0}, {"sha256", "lg"}}},
            {"runtime", {{"host", "x"}}}};
  }
  std::string put_json(const std::string& name, const json& j) { return put(name, j.dump(2) + "\n"); }

  static const FamilyCount* family(const Comparison& c, const std::string& name) {
    for (const auto& f : c.families)
      if (f.family == name) return &f;
    return nullptr;
  }
  static std::vector<const Difference*> counted(const Comparison& c) {
    std::vector<const Difference*> v;
    for (const auto& d : c.differences)
      if (d.counted) v.push_back(&d);
    return v;
  }
  // The message of the atlas::Error that f throws ("" when it throws none).
  template <class F>
  static std::string error_of(F f) {
    try {
      f();
    } catch (const Error& e) {
      return e.what();
    }
    return "";
  }

  fs::path dir_;
};

TEST_F(AuditTest, IdenticalGenerationsCompareExactOutsideRuntime) {
  const auto a = generation("a.jsonl", rows3());
  const auto b = generation("b.jsonl", rows3(), {{"runtime", {{"seconds", 99.0}, {"host", "other"}}}});
  const Comparison c = compare(load_artifact(a), load_artifact(b));
  EXPECT_TRUE(c.identical());
  EXPECT_EQ(c.shared, 3);
  EXPECT_TRUE(c.differences.empty());
  // One value per row and family: 3 rows.
  for (const char* f : {"prompt hashes", "token ids", "texts", "RNG hashes"}) {
    ASSERT_NE(family(c, f), nullptr) << f;
    EXPECT_EQ(family(c, f)->exact, 3) << f;
    EXPECT_EQ(family(c, f)->total, 3) << f;
  }
  EXPECT_EQ(family(c, "stop states")->total, 6);  // stop and n_new per row
}

TEST_F(AuditTest, FindsAPlantedOneTokenChange) {
  auto rows = rows3();
  rows[1]["ids"][2] = 99;  // row b, generated token 2
  const Comparison c = compare(load_artifact(generation("a.jsonl", rows3())), load_artifact(generation("b.jsonl", rows)));
  EXPECT_FALSE(c.identical());
  auto d = counted(c);
  ASSERT_EQ(d.size(), 1u);
  EXPECT_EQ(d[0]->cell, "b");
  EXPECT_EQ(d[0]->field, "ids");
  EXPECT_EQ(d[0]->family, "token ids");
  EXPECT_NE(d[0]->detail.find("[2]"), std::string::npos) << d[0]->detail;
  EXPECT_NE(d[0]->detail.find("6 vs 99"), std::string::npos) << d[0]->detail;
  EXPECT_EQ(family(c, "token ids")->exact, 2);
  EXPECT_EQ(family(c, "token ids")->total, 3);
}

TEST_F(AuditTest, MissingFieldAndMissingRowAreDifferences) {
  auto rows = rows3();
  rows[0].erase("text");
  Comparison c = compare(load_artifact(generation("a.jsonl", rows3())), load_artifact(generation("b.jsonl", rows)));
  ASSERT_EQ(counted(c).size(), 1u);
  EXPECT_EQ(counted(c)[0]->field, "text");
  EXPECT_EQ(counted(c)[0]->b, "(absent)");

  auto fewer = rows3();
  fewer.erase(fewer.begin() + 1);  // row b missing in B
  c = compare(load_artifact(generation("c.jsonl", rows3())), load_artifact(generation("d.jsonl", fewer)));
  EXPECT_FALSE(c.identical());
  EXPECT_EQ(c.shared, 2);
  EXPECT_EQ(c.only_a, std::vector<std::string>{"b"});
  EXPECT_TRUE(c.only_b.empty());
}

TEST_F(AuditTest, SubsetRerunComparesSharedRowsAndSaysHowMany) {
  const std::vector<json> sub = {rows3()[0], rows3()[2]};
  const Artifact a = load_artifact(generation("sub.jsonl", sub));
  const Artifact b = load_artifact(generation("full.jsonl", rows3()));
  Comparison c = compare(a, b);
  EXPECT_EQ(c.shared, 2);
  EXPECT_EQ(c.only_b, std::vector<std::string>{"b"});
  EXPECT_FALSE(c.identical());  // without --subset a missing row counts
  EXPECT_TRUE(counted(c).empty());
  // rows and stops summarise the whole set: not compared across different sets.
  EXPECT_NE(std::find(c.not_compared.begin(), c.not_compared.end(), "rows"), c.not_compared.end());
  EXPECT_EQ(family(c, "token ids")->total, 2);
  c = compare(a, b, {.subset = true});
  EXPECT_TRUE(c.identical());
  const std::string text = format_comparison(c, a, b, 10);
  EXPECT_NE(text.find("2 of 3 rows shared; 1 only in B"), std::string::npos) << text;
  // The reverse (B a subset of A) is not what --subset allows.
  EXPECT_FALSE(compare(b, a, {.subset = true}).identical());
}

TEST_F(AuditTest, ProvenanceIsReportedButCountedOnlyWhenStrict) {
  const Artifact a = load_artifact(generation("a.jsonl", rows3()));
  const Artifact b = load_artifact(generation("b.jsonl", rows3(), {{"provenance", {{"git_commit", "def"}}}}));
  Comparison c = compare(a, b);
  EXPECT_TRUE(c.identical());
  ASSERT_EQ(c.differences.size(), 1u);
  EXPECT_EQ(c.differences[0].field, "provenance.git_commit");
  EXPECT_FALSE(c.differences[0].counted);
  c = compare(a, b, {.strict = true});
  EXPECT_FALSE(c.identical());
  EXPECT_EQ(c.counted_differences(), 1);
}

TEST_F(AuditTest, IgnoreLeavesOutAFieldAndItsSubfields) {
  auto rows = rows3();
  rows[2]["text"] = "changed";
  const Artifact a = load_artifact(generation("a.jsonl", rows3()));
  const Artifact b = load_artifact(generation("b.jsonl", rows, {{"decoding", {{"max_new_tokens", 8}}}}));
  EXPECT_EQ(compare(a, b).counted_differences(), 2);
  const Comparison c = compare(a, b, {.ignore = {"text", "decoding", "nosuchfield"}});
  EXPECT_TRUE(c.identical());
  EXPECT_EQ(family(c, "texts"), nullptr);
  EXPECT_EQ(c.unused_ignores, std::vector<std::string>{"nosuchfield"});
}

TEST_F(AuditTest, RowOrderIsPartOfTheArtifact) {
  auto rows = rows3();
  std::swap(rows[0], rows[2]);
  const Comparison c = compare(load_artifact(generation("a.jsonl", rows3())), load_artifact(generation("b.jsonl", rows)));
  EXPECT_TRUE(counted(c).empty());
  EXPECT_TRUE(c.order_differs);
  EXPECT_FALSE(c.identical());
}

TEST_F(AuditTest, TraceHashChangesLandInTheirFamilies) {
  const std::string a = put_json("a.json", trace());
  json t = trace();
  t["stages"][1]["sha256"] = "changed";
  t["gates"][0]["topk_weights_sha256"] = "changed";
  t["runtime"]["host"] = "elsewhere";
  const Comparison c = compare(load_artifact(a), load_artifact(put_json("b.json", t)));
  EXPECT_FALSE(c.identical());
  auto d = counted(c);
  ASSERT_EQ(d.size(), 2u);
  EXPECT_EQ(d[0]->cell, "hidden.1");
  EXPECT_EQ(d[0]->family, "hidden hashes");
  EXPECT_EQ(d[1]->cell, "router.1");
  EXPECT_EQ(d[1]->field, "topk_weights_sha256");
  EXPECT_EQ(d[1]->family, "route hashes");
  EXPECT_EQ(family(c, "hidden hashes")->total, 4);  // 3 stages + logits
  EXPECT_EQ(family(c, "route hashes")->total, 4);   // 2 gates x (ids, weights)
  EXPECT_EQ(family(c, "route hashes")->exact, 3);
}

TEST_F(AuditTest, TraceMissingGateIsReported) {
  json t = trace();
  t["gates"].erase(1);  // router.2 gone
  const Comparison c = compare(load_artifact(put_json("a.json", trace())), load_artifact(put_json("b.json", t)));
  EXPECT_EQ(c.only_a, std::vector<std::string>{"router.2"});
  EXPECT_FALSE(c.identical());
}

TEST_F(AuditTest, DifferentKindsAreAnError) {
  const std::string t = put_json("t.json", trace());
  const std::string g = generation("g.jsonl", rows3());
  const std::string msg = error_of([&] { compare(load_artifact(t), load_artifact(g)); });
  EXPECT_NE(msg.find("atlas.generate"), std::string::npos) << msg;
  EXPECT_NE(msg.find("atlas.trace"), std::string::npos) << msg;
  EXPECT_NE(msg.find(t), std::string::npos) << msg;
}

TEST_F(AuditTest, BadFilesAreErrorsNamingFileAndLine) {
  // JSONL cut off mid-line (no final newline).
  std::string g = generation("cut.jsonl", rows3());
  std::string text = row("a", {1}).dump() + "\n" + row("b", {2}).dump().substr(0, 20);
  put("cut.jsonl", text);
  EXPECT_NE(error_of([&] { load_artifact(g); }).find("cut.jsonl:2: truncated"), std::string::npos);
  // Malformed line with a newline.
  put("cut.jsonl", row("a", {1}).dump() + "\n{\"id\": \"b\", \"ids\": [1,\n");
  EXPECT_NE(error_of([&] { load_artifact(g); }).find("cut.jsonl:2: malformed JSON"), std::string::npos);
  // Whole lines missing: the sidecar's row count disagrees.
  put("cut.jsonl", row("a", {1}).dump() + "\n");
  EXPECT_NE(error_of([&] { load_artifact(g); }).find("1 rows, but"), std::string::npos);
  // Duplicate ids.
  g = generation("dup.jsonl", {row("a", {1}), row("a", {2})});
  EXPECT_NE(error_of([&] { load_artifact(g); }).find("dup.jsonl:2: id: duplicate id \"a\""), std::string::npos);
  // No sidecar.
  const std::string lone = put("lone.jsonl", row("a", {1}).dump() + "\n");
  EXPECT_NE(error_of([&] { load_artifact(lone); }).find("no sidecar"), std::string::npos);
  // Truncated JSON document.
  const std::string tj = put("t.json", trace().dump(2).substr(0, 100));
  EXPECT_NE(error_of([&] { load_artifact(tj); }).find(tj + ": malformed JSON"), std::string::npos);
  // No kind; unknown kind; missing file; malformed stage.
  EXPECT_NE(error_of([&] { load_artifact(put("k.json", "{\"a\": 1}")); }).find("kind: missing"), std::string::npos);
  EXPECT_NE(error_of([&] { load_artifact(put("u.json", "{\"kind\": \"atlas.nope\"}")); }).find("atlas.nope"),
            std::string::npos);
  EXPECT_NE(error_of([&] { load_artifact((dir_ / "absent.json").string()); }).find("absent.json"), std::string::npos);
  json t = trace();
  t["stages"][2].erase("name");
  EXPECT_NE(error_of([&] { load_artifact(put_json("s.json", t)); }).find("stages[2].name"), std::string::npos);
}

TEST_F(AuditTest, SidecarPathSelectsTheSameArtifact) {
  const std::string g = generation("g.jsonl", rows3());
  const Artifact a = load_artifact(g), b = load_artifact(g + ".meta.json");
  EXPECT_EQ(b.kind, "atlas.generate");
  EXPECT_EQ(b.cells.size(), 3u);
  EXPECT_TRUE(compare(a, b).identical());
}

TEST_F(AuditTest, ComparisonJsonNamesInputsByHash) {
  auto rows = rows3();
  rows[0]["stop"] = "eos";
  const Artifact a = load_artifact(generation("a.jsonl", rows3()));
  const Artifact b = load_artifact(generation("b.jsonl", rows));
  const ojson j = comparison_json(compare(a, b), a, b, {});
  EXPECT_EQ(j["kind"], "atlas.compare");
  EXPECT_EQ(j["identical"], false);
  ASSERT_EQ(j["inputs"].size(), 4u);  // rows and sidecar of each
  EXPECT_EQ(j["inputs"][2]["role"], "b");
  EXPECT_EQ(j["inputs"][2]["path"], b.files[0]);
  EXPECT_EQ(j["inputs"][2]["sha256"], sha256_file(b.files[0]));
  EXPECT_NE(j["inputs"][0]["sha256"], j["inputs"][2]["sha256"]);  // the rows differ
  // The records are hash-chain input records: they verify against the files.
  const auto checks = verify_inputs(parse_input_records(json::parse(j["inputs"].dump()), "cmp.json", "inputs"));
  EXPECT_TRUE(all_ok(checks));
  ASSERT_EQ(j["differences"].size(), 1u);
  EXPECT_EQ(j["differences"][0]["family"], "stop states");
}

// Shaped as src/probe/run.cpp writes a trace-mode run (format_version 1).
json probe_run(const std::vector<std::string>& ids, const std::string& manifest) {
  json cells = json::array();
  for (size_t i = 0; i < ids.size(); ++i) {
    json gates = json::array({{{"layer", 1}, {"k", 2}, {"full_ids_sha256", "fi" + ids[i]},
                               {"full_weights_sha256", "fw" + ids[i]}, {"target_ids_sha256", "ti" + ids[i]},
                               {"target_weights_sha256", "tw" + ids[i]}}});
    json stages = json::array({{{"stage", 0}, {"name", "hidden.0"}, {"full_sha256", "hf" + ids[i]},
                                {"target_sha256", "ht" + ids[i]}}});
    cells.push_back({{"index", int64_t(i)}, {"cell_id", ids[i]}, {"condition", "user"}, {"batch", int64_t(i / 2)},
                     {"input_ids", {1000, 5, 6}}, {"prompt_sha256", "p" + ids[i]},
                     {"result", {{"mode", "trace"}, {"gates", gates}, {"stages", stages}}}});
  }
  return {{"kind", "atlas.probe.run"}, {"format_version", 1}, {"manifest_sha256", manifest},
          {"protocol", {{"name", "x"}}}, {"shard", nullptr}, {"cells", cells},
          {"content_sha256", "c" + manifest}, {"runtime", {{"seconds", 1}}}};
}

TEST_F(AuditTest, ProbeRunCellsAlignByCellIdAndSubsetsIgnorePositions) {
  const std::string full = put_json("full.json", probe_run({"s0|user", "s1|user", "s2|user"}, "m-full"));
  json changed = probe_run({"s0|user", "s1|user", "s2|user"}, "m-full");
  changed["cells"][1]["result"]["gates"][0]["target_weights_sha256"] = "changed";
  Comparison c = compare(load_artifact(full), load_artifact(put_json("changed.json", changed)));
  ASSERT_EQ(counted(c).size(), 1u);
  EXPECT_EQ(counted(c)[0]->cell, "s1|user");
  EXPECT_EQ(counted(c)[0]->field, "result.gates[0].target_weights_sha256");
  EXPECT_EQ(counted(c)[0]->family, "route hashes");
  EXPECT_EQ(family(c, "hidden hashes")->total, 6);  // 3 cells x (full, target)
  // A subset rerun from its own manifest: other cell indices, batches and manifest hash.
  const std::string sub = put_json("sub.json", probe_run({"s2|user"}, "m-sub"));
  c = compare(load_artifact(sub), load_artifact(full), {.subset = true});
  EXPECT_TRUE(c.identical()) << format_comparison(c, load_artifact(sub), load_artifact(full), 10);
  EXPECT_EQ(c.shared, 1);
  EXPECT_EQ(c.only_b.size(), 2u);
  EXPECT_NE(std::find(c.not_compared.begin(), c.not_compared.end(), "index"), c.not_compared.end());
}

TEST_F(AuditTest, LongMultibyteValuesAreShortenedToValidUtf8) {
  std::string long_text = "x";  // shifts the characters so the cut lands inside one
  for (int i = 0; i < 100; ++i) long_text += "\xc3\xa9";  // U+00E9, two bytes each
  auto rows = rows3(), other = rows3();
  rows[0]["text"] = long_text + "a";
  other[0]["text"] = long_text + "b";
  const Artifact a = load_artifact(generation("a.jsonl", rows)), b = load_artifact(generation("b.jsonl", other));
  const Comparison c = compare(a, b);
  ASSERT_EQ(c.counted_differences(), 1);
  EXPECT_LT(c.differences[0].a.size(), long_text.size());
  EXPECT_EQ(c.differences[0].a.substr(c.differences[0].a.size() - 3), "...");
  // Serialising would throw on a split character.
  EXPECT_NO_THROW(comparison_json(c, a, b, {}).dump());
}

}  // namespace
