// Provenance facts the audit relies on (issue 9: build flags, backend and device).
#include <gtest/gtest.h>

#include "core/provenance.h"

using namespace atlas;

TEST(AuditProvenance, BuildFlagsAreRecordedAndMatchTheProjectsPromises) {
  const ojson p = build_provenance();
  ASSERT_TRUE(p.contains("build_flags"));
  const ojson& f = p["build_flags"];
  // CMakeLists.txt promises no -ffast-math anywhere (bit-identical reruns, IEEE rounding).
  EXPECT_EQ(f["fast_math"], false);
  EXPECT_TRUE(f["sanitizers"].is_array());
#if defined(ATLAS_HAVE_CUDA)
  EXPECT_EQ(f["cuda"], true);
#else
  EXPECT_EQ(f["cuda"], false);
#endif
  // Deterministic: the same build records the same provenance every time.
  EXPECT_EQ(p.dump(), build_provenance().dump());
}

TEST(AuditProvenance, CpuDeviceIsNamed) {
  const ojson d = device_provenance("cpu");
  EXPECT_EQ(d["backend"], "cpu");
  ASSERT_TRUE(d["device"].is_string());
  EXPECT_FALSE(d["device"].get<std::string>().empty());
}

// content_sha256 identifies results: provenance, inputs and runtime (how, where and from which
// file bytes) stay out of it; every other key, and the key order, is in it.
TEST(AuditProvenance, ContentHashLeavesOutProvenanceInputsRuntime) {
  ojson a = {{"kind", "atlas.x"}, {"cells", {1, 2, 3}}};
  const std::string h = artifact_content_sha256(a);
  EXPECT_EQ(h.size(), 64u);
  ojson b = a;
  b["provenance"] = build_provenance();
  b["inputs"] = ojson::array({{{"path", "../m.json"}, {"sha256", std::string(64, 'a')}}});
  b["content_sha256"] = h;
  b["runtime"] = {{"seconds", 1.5}};
  EXPECT_EQ(artifact_content_sha256(b), h);
  ojson c = a;
  c["cells"][1] = 5;
  EXPECT_NE(artifact_content_sha256(c), h);
  const ojson reordered = {{"cells", {1, 2, 3}}, {"kind", "atlas.x"}};
  EXPECT_NE(artifact_content_sha256(reordered), h);
}
