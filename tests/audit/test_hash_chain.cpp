// Hash-chain links: records verify against the files they name, and any change is caught.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "audit/hash_chain.h"
#include "core/error.h"
#include "core/file.h"

using namespace atlas;
using namespace atlas::audit;
namespace fs = std::filesystem;

namespace {

const char* const kAbc = "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad";  // FIPS 180-2 "abc"

class HashChainTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("atlas_chain_" + std::to_string(::getpid()) + "_" +
                                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string put(const std::string& name, const std::string& text) {
    const std::string p = (dir_ / name).string();
    std::ofstream(p, std::ios::binary) << text;
    return p;
  }
  fs::path dir_;
};

TEST_F(HashChainTest, RecordOfAFileIsItsSha256AndSize) {
  const InputRecord r = input_record(put("a.txt", "abc"));
  EXPECT_EQ(r.sha256, kAbc);
  EXPECT_EQ(r.bytes.value_or(-1), 3);
  EXPECT_TRUE(all_ok(verify_inputs({r})));
}

TEST_F(HashChainTest, FlippedByteTruncationAndDeletionAreCaught) {
  const std::string a = put("a.txt", "abc"), b = put("b.txt", "abc"), c = put("c.txt", "abc");
  const std::vector<InputRecord> recs = {input_record(a), input_record(b), input_record(c),
                                         {.path = c, .sha256 = kAbc, .bytes = std::nullopt}};
  put("a.txt", "abd");  // one byte flipped, same size
  put("b.txt", "ab");   // truncated
  fs::remove(c);
  const auto checks = verify_inputs(recs);
  ASSERT_EQ(checks.size(), 4u);
  EXPECT_EQ(checks[0].status, LinkStatus::HashMismatch);
  EXPECT_NE(describe(checks[0]).find("CHANGED"), std::string::npos);
  EXPECT_EQ(checks[1].status, LinkStatus::SizeMismatch);
  EXPECT_EQ(checks[2].status, LinkStatus::Missing);
  EXPECT_EQ(checks[3].status, LinkStatus::Missing);
  EXPECT_FALSE(all_ok(checks));
  // Without a size pin a truncation is still a hash mismatch.
  const auto unpinned = verify_inputs({{.path = b, .sha256 = kAbc, .bytes = std::nullopt}});
  EXPECT_EQ(unpinned[0].status, LinkStatus::HashMismatch);
}

TEST_F(HashChainTest, RelativePathsResolveAgainstTheBaseDirectory) {
  put("x.json", "abc");
  const std::vector<InputRecord> recs = {{.path = "x.json", .sha256 = kAbc, .bytes = 3}};
  const auto checks = verify_inputs(recs, dir_.string());
  EXPECT_TRUE(all_ok(checks)) << describe(checks[0]);
  EXPECT_EQ(checks[0].resolved, (dir_ / "x.json").string());
}

TEST_F(HashChainTest, RecordsRoundTripThroughJsonAndMalformedOnesAreErrors) {
  const InputRecord r = input_record(put("a.txt", "abc"));
  const json arr = json::parse("[" + input_record_json(r).dump() + "]");
  const auto back = parse_input_records(arr, "art.json", "inputs");
  ASSERT_EQ(back.size(), 1u);
  EXPECT_EQ(back[0].path, r.path);
  EXPECT_EQ(back[0].sha256, kAbc);
  auto error_of = [](const json& j) {
    try {
      parse_input_records(j, "art.json", "inputs");
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_EQ(error_of(json::parse(R"({"path": "a"})")).rfind("art.json: inputs: expected an array", 0), 0u);
  EXPECT_NE(error_of(json::parse(R"([{"path": "a", "sha256": "XYZ"}])")).find("art.json: inputs[0].sha256"),
            std::string::npos);
  std::string upper(kAbc);
  upper[0] = 'B';
  EXPECT_NE(error_of(json::array({{{"path", "a"}, {"sha256", upper}}})).find("inputs[0].sha256"), std::string::npos);
  EXPECT_NE(error_of(json::array({json::parse(input_record_json(r).dump()), {{"sha256", kAbc}}})).find("inputs[1].path: missing"),
            std::string::npos);
  EXPECT_THROW(input_record((dir_ / "absent").string()), Error);
}

// An artifact that records its inputs relative to its own directory.
std::string artifact_with_inputs(const fs::path& path, const std::vector<std::string>& inputs) {
  ojson recs = ojson::array();
  for (const auto& in : inputs) recs.push_back(input_record_json(input_record(in, path.parent_path().string())));
  ojson j{{"kind", "test.artifact"}, {"inputs", recs}};
  std::ofstream(path, std::ios::binary) << j.dump(2) << "\n";
  return path.string();
}

TEST_F(HashChainTest, WalkFollowsLinksThroughArtifactsAndFindsAChangeTwoStepsBack) {
  fs::create_directories(dir_ / "eval");
  fs::create_directories(dir_ / "analysis");
  const std::string data = put("data.txt", "abc");
  const std::string run = artifact_with_inputs(dir_ / "run.json", {data});
  const std::string eval = artifact_with_inputs(dir_ / "eval" / "eval.json", {run});
  const std::string analysis = artifact_with_inputs(dir_ / "analysis" / "an.json", {eval, run});
  // Recorded paths are relative to the recording artifact's directory.
  EXPECT_EQ(json::parse(read_file(eval))["inputs"][0]["path"], "../run.json");
  // an->eval, an->run, eval->run, run->data (run.json is reached twice but walked once).
  auto links = walk_chain(analysis);
  ASSERT_EQ(links.size(), 4u);
  EXPECT_EQ(links[0].from, analysis);
  EXPECT_EQ(links[3].from, run);
  for (const auto& l : links) EXPECT_EQ(l.check.status, LinkStatus::Ok) << describe(l.check);

  put("data.txt", "abd");  // the raw data changes after the run
  links = walk_chain(analysis);
  int changed = 0;
  for (const auto& l : links)
    if (l.check.status != LinkStatus::Ok) {
      ++changed;
      EXPECT_EQ(l.from, run);
      EXPECT_EQ(fs::path(l.check.resolved).filename(), "data.txt");
    }
  EXPECT_EQ(changed, 1);
}

TEST_F(HashChainTest, WalkEndsOnACycleAndReportsTheBrokenLink) {
  // a records b; b is rewritten afterwards to record a: the a->b link no longer verifies, and
  // the walk still terminates.
  const std::string b = put("b.json", "{\"kind\": \"x\"}");
  const std::string a = artifact_with_inputs(dir_ / "a.json", {b});
  artifact_with_inputs(dir_ / "b.json", {a});
  const auto links = walk_chain(a);
  ASSERT_EQ(links.size(), 2u);
  EXPECT_EQ(links[0].check.status, LinkStatus::SizeMismatch);
  EXPECT_EQ(links[1].check.status, LinkStatus::Ok);  // b->a: a is unchanged
  EXPECT_THROW(walk_chain((dir_ / "absent.json").string()), Error);
}

}  // namespace
