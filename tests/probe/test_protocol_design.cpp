// [[edge]] and [[factorial]] in protocol files: parsed, validated (errors name the protocol
// file and the field), and recorded in the resolved protocol only when declared.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "core/error.h"
#include "probe/protocol.h"

namespace atlas::probe {
namespace {
namespace fs = std::filesystem;

const char* kBase = R"(
[protocol]
name = "design-test"

[[corpus]]
domain = "english"
format = "inline"
texts = ["one text"]

[[condition]]
name = "s0_eos"

[[condition]]
name = "s1_eos"
system = true

[[condition]]
name = "s0_x"

[[condition]]
name = "s1_x"
system = true
)";

fs::path write_protocol(const std::string& extra) {
  static int n = 0;
  const fs::path p = fs::temp_directory_path() /
                     ("atlas-design-" + std::to_string(::getpid()) + "-" + std::to_string(n++) + ".toml");
  std::ofstream(p) << kBase << extra;
  return p;
}

std::string error_of(const std::string& extra) {
  const fs::path p = write_protocol(extra);
  std::string msg = "(no error)";
  try {
    load_protocol(p.string());
  } catch (const Error& e) {
    msg = e.what();
  }
  fs::remove(p);
  return msg;
}

const char* kFactorial = R"(
[[factorial]]
name = "system x token"
a = "system"
b = "token"
a0b0 = "s0_eos"
a1b0 = "s1_eos"
a0b1 = "s0_x"
a1b1 = "s1_x"
)";

TEST(ProtocolDesign, EdgesAndFactorialsAreReadAndRecorded) {
  const fs::path p = write_protocol(std::string(R"(
[[edge]]
name = "system@eos"
condition = "s1_eos"
reference = "s0_eos"

[[edge]]
condition = "s0_x"
reference = "s0_eos"
)") + kFactorial);
  const Protocol pr = load_protocol(p.string());
  fs::remove(p);
  ASSERT_EQ(pr.edges.size(), 2u);
  EXPECT_EQ(pr.edges[0].name, "system@eos");
  EXPECT_EQ(pr.edges[0].condition, "s1_eos");
  EXPECT_EQ(pr.edges[0].reference, "s0_eos");
  EXPECT_EQ(pr.edges[1].name, "s0_x vs s0_eos");  // the default name
  ASSERT_EQ(pr.factorials.size(), 1u);
  EXPECT_EQ(pr.factorials[0].a1b0, "s1_eos");
  EXPECT_EQ(pr.factorials[0].a0b1, "s0_x");
  const ojson j = pr.to_json();
  ASSERT_TRUE(j.contains("edges") && j.contains("factorials"));
  EXPECT_EQ(j["edges"][1]["reference"], "s0_eos");
  EXPECT_EQ(j["factorials"][0]["a1b1"], "s1_x");
  EXPECT_EQ(j["factorials"][0]["b"], "token");
}

TEST(ProtocolDesign, UndeclaredDesignLeavesTheResolvedProtocolAsBefore) {
  const fs::path p = write_protocol("");
  const Protocol pr = load_protocol(p.string());
  fs::remove(p);
  EXPECT_TRUE(pr.edges.empty() && pr.factorials.empty());
  const ojson j = pr.to_json();
  EXPECT_FALSE(j.contains("edges"));
  EXPECT_FALSE(j.contains("factorials"));
}

TEST(ProtocolDesign, BadDeclarationsNameFileAndField) {
  auto has = [](const std::string& msg, const std::string& want) {
    EXPECT_NE(msg.find(want), std::string::npos) << msg << "\n  expected: " << want;
    EXPECT_NE(msg.find("atlas-design-"), std::string::npos) << msg;  // the protocol file
  };
  has(error_of("[[edge]]\ncondition = \"s1_eos\"\nreference = \"s9\"\n"),
      "edge[0].reference: unknown condition 's9' (declared: s0_eos, s1_eos, s0_x, s1_x)");
  has(error_of("[[edge]]\ncondition = \"s1_eos\"\n"), "edge[0].reference: missing");
  has(error_of("[[edge]]\ncondition = \"s1_eos\"\nreference = \"s1_eos\"\n"),
      "edge[0].reference: an edge needs two different conditions");
  has(error_of("[[edge]]\ncondition = \"s1_eos\"\nreference = \"s0_eos\"\n"
               "[[edge]]\nname = \"again\"\ncondition = \"s1_eos\"\nreference = \"s0_eos\"\n"),
      "edge[1].condition: duplicates edge[0]");
  has(error_of("[[edge]]\nname = \"e\"\ncondition = \"s1_eos\"\nreference = \"s0_eos\"\n"
               "[[edge]]\nname = \"e\"\ncondition = \"s1_x\"\nreference = \"s0_x\"\n"),
      "edge[1].name: edge name 'e' already used by edge[0]");
  has(error_of("[[edge]]\ncondition = \"s1_eos\"\nreference = \"s0_eos\"\nweight = 2\n"), "edge[0].weight: unknown key");
  has(error_of("[[edges]]\ncondition = \"s1_eos\"\nreference = \"s0_eos\"\n"), "edges: unknown key");
  std::string f = kFactorial;
  has(error_of(f.replace(f.find("a1b1 = \"s1_x\""), 13, "a1b1 = \"s0_x\"")),
      "factorial[0].a1b1: condition 's0_x' is also a0b1");
  f = kFactorial;
  has(error_of(f.replace(f.find("a1b1 = \"s1_x\""), 13, "")), "factorial[0].a1b1: missing");
  f = kFactorial;
  has(error_of(f.replace(f.find("a0b0 = \"s0_eos\""), 15, "a0b0 = \"nope\"")), "factorial[0].a0b0: unknown condition 'nope'");
  f = kFactorial;
  has(error_of(f.replace(f.find("b = \"token\""), 11, "b = \"system\"")), "factorial[0].b: the two factors need different names");
  has(error_of(std::string(kFactorial) + kFactorial), "factorial[1].name: factorial name 'system x token' already used");
}

}  // namespace
}  // namespace atlas::probe
