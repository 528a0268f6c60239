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
