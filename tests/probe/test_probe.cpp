// Unit tests for the probe library: shard specs, corpus readers on small files written here
// (plain, gzip via zlib, zip via libzip), WikiText headings, manifest hashing.
#include <gtest/gtest.h>
#include <zip.h>
#include <zlib.h>

#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "core/error.h"
#include "core/sha256.h"
#include "probe/corpus.h"
#include "probe/freeze.h"
#include "probe/protocol.h"
#include "probe/run.h"

namespace atlas::probe {
namespace {
namespace fs = std::filesystem;

fs::path temp_dir() {
  fs::path d = fs::temp_directory_path() / ("atlas-probe-unit-" + std::to_string(::getpid()));
  fs::create_directories(d);
  return d;
}

void write(const fs::path& p, const std::string& s) { std::ofstream(p, std::ios::binary) << s; }

TEST(ProbeShard, ParsesAndRejects) {
  auto s = parse_shard("1/4");
  EXPECT_EQ(s.index, 1);
  EXPECT_EQ(s.count, 4);
  for (const char* bad : {"4/4", "-1/4", "1", "1/0", "a/2", "1/2x", "/2", ""}) EXPECT_THROW(parse_shard(bad), Error) << bad;
}

// Hook-edit TOKENS items naming an anchor: NAME, NAME+N, NAME-N; anything else is not one.
TEST(ProbeProtocol, AnchorRefs) {
  const auto r = probe::parse_anchor_ref("history_eos");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->name, "history_eos");
  EXPECT_EQ(r->offset, 0);
  EXPECT_EQ(probe::parse_anchor_ref("gen_role_head+3")->offset, 3);
  EXPECT_EQ(probe::parse_anchor_ref("bos-12")->offset, -12);
  EXPECT_EQ(probe::parse_anchor_ref("bos-12")->name, "bos");
  for (const char* bad : {"", "12", "3-5", "+1", "bos+", "bos-x", "bos+1+2", "bos+1234567890", "Bos", "bos 1"})
    EXPECT_FALSE(probe::parse_anchor_ref(bad)) << bad;
}

TEST(ProbeCorpus, WikitextHeadings) {
  EXPECT_TRUE(is_wikitext_heading(" = Homarus gammarus = "));
  EXPECT_TRUE(is_wikitext_heading(" = = Description = = "));
  EXPECT_FALSE(is_wikitext_heading(" Homarus gammarus , known as the European lobster = common ."));
  EXPECT_FALSE(is_wikitext_heading(" "));
}

TEST(ProbeCorpus, GzipJsonlAndGold) {
  fs::path d = temp_dir();
  const std::string he = d / "he.jsonl.gz";
  gzFile f = gzopen(he.c_str(), "wb");
  const std::string lines =
      "{\"task_id\": \"HumanEval/0\", \"prompt\": \"def f():\\n\", \"canonical_solution\": \"x\", \"test\": \"t\", \"entry_point\": \"f\"}\n"
      "{\"task_id\": \"HumanEval/1\", \"prompt\": \"def g():\\n\", \"canonical_solution\": \"y\", \"test\": \"t\", \"entry_point\": \"g\"}\n";
  gzwrite(f, lines.data(), unsigned(lines.size()));
  gzclose(f);
  Corpus c = read_corpus({.domain = "code", .format = "humaneval", .path = he, .member = {}, .texts = {}});
  ASSERT_EQ(c.sources.size(), 2u);
  EXPECT_EQ(c.sources[1].source_id, "HumanEval/1");
  EXPECT_EQ(c.sources[1].text, "def g():\n");
  EXPECT_EQ(c.sources[1].text_sha256, sha256_hex(std::string("def g():\n")));

  const std::string gsm = d / "gsm.jsonl";
  write(gsm, "{\"question\": \"q0\", \"answer\": \"a\\n#### 1,234\"}\n\n{\"question\": \"q1\", \"answer\": \"#### 7\"}\n");
  Corpus g = read_corpus({.domain = "math", .format = "gsm8k", .path = gsm, .member = {}, .texts = {}});
  ASSERT_EQ(g.sources.size(), 2u);
  EXPECT_EQ(g.sources[0].gold, "1,234");
  EXPECT_EQ(g.sources[1].source_id, "1");
  write(gsm, "{\"question\": \"q0\", \"answer\": \"#### 1\"}\n{\"answer\": \"#### 2\"}\n");
  try {
    read_corpus({.domain = "math", .format = "gsm8k", .path = gsm, .member = {}, .texts = {}});
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(gsm + ":2"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("question"), std::string::npos) << e.what();
  }
  EXPECT_THROW(read_corpus({.domain = "math", .format = "gsm8k", .path = (d / "absent.jsonl").string(), .member = {}, .texts = {}}),
               Error);
  fs::remove_all(d);
}

TEST(ProbeCorpus, TnewsFromZipMemberWithoutIds) {
  fs::path d = temp_dir();
  const std::string zp = d / "t.zip";
  const std::string body = "{\"label\": \"102\", \"sentence\": \"甲\"}\n{\"label\": \"101\", \"sentence\": \"乙\"}\n";
  int err = 0;
  zip_t* z = zip_open(zp.c_str(), ZIP_CREATE | ZIP_TRUNCATE, &err);
  ASSERT_NE(z, nullptr);
  zip_source_t* src = zip_source_buffer(z, body.data(), body.size(), 0);
  ASSERT_GE(zip_file_add(z, "tnews_public/test.json", src, ZIP_FL_OVERWRITE), 0);
  ASSERT_EQ(zip_close(z), 0);
  Corpus c = read_corpus({.domain = "tnews", .format = "tnews", .path = zp, .member = "tnews_public/test.json", .texts = {}});
  ASSERT_EQ(c.sources.size(), 2u);
  EXPECT_EQ(c.sources[1].source_id, "1");  // no "id" field: the line index
  EXPECT_EQ(c.sources[1].text, "乙");
  EXPECT_EQ(c.member_sha256, sha256_hex(body));
  EXPECT_THROW(read_corpus({.domain = "tnews", .format = "tnews", .path = zp, .member = "nope.json", .texts = {}}), Error);
  fs::remove_all(d);
}

// add:FILE pins are recorded relative to the manifest's directory: run and audit join them to
// it (a manifest in the working directory: as recorded), absolute ones stay as given.
TEST(ProbeManifest, HookFilesResolveAgainstTheManifestsDirectory) {
  EXPECT_EQ(probe::manifest_files_base("runs/m.json"), "runs");
  EXPECT_EQ(probe::manifest_files_base("m.json"), "");
  EXPECT_EQ(probe::manifest_files_base("/data/exp/m.json"), "/data/exp");
  EXPECT_EQ(probe::manifest_file_path("runs", "steer/v.safetensors"), "runs/steer/v.safetensors");
  EXPECT_EQ(probe::manifest_file_path("/data/exp", "../vec/v.safetensors"), "/data/vec/v.safetensors");
  EXPECT_EQ(probe::manifest_file_path("", "steer/v.safetensors"), "steer/v.safetensors");
  EXPECT_EQ(probe::manifest_file_path("/data/exp", "/abs/v.safetensors"), "/abs/v.safetensors");
}

TEST(ProbeManifest, HashCoversEverythingButItself) {
  ojson m;
  m["kind"] = "atlas.probe.manifest";
  m["cells"] = ojson::array({{{"input_ids", {1, 2, 3}}}});
  m["manifest_sha256"] = manifest_hash(m);
  const std::string h = m["manifest_sha256"];
  ojson copy = m;
  copy.erase("manifest_sha256");
  EXPECT_EQ(h, sha256_hex(copy.dump()));
  m["cells"][0]["input_ids"][1] = 5;
  EXPECT_NE(manifest_hash(m), h);
}

}  // namespace
}  // namespace atlas::probe
