#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <limits>

#include "core/bf16.h"
#include "core/dtype.h"
#include "core/error.h"
#include "core/file.h"
#include "core/json.h"
#include "core/progress.h"
#include "core/sha256.h"

using namespace atlas;

TEST(Bf16, RoundsToNearestEven) {
  EXPECT_EQ(f32_to_bf16(1.0f), 0x3f80);
  // 1 + 2^-8 is exactly halfway between bf16 1.0 and 1.0078125: ties go to even (1.0).
  EXPECT_EQ(f32_to_bf16(1.00390625f), 0x3f80);
  // 1 + 3*2^-8 is halfway between 1.0078125 (odd) and 1.015625 (even).
  EXPECT_EQ(f32_to_bf16(1.01171875f), 0x3f82);
  EXPECT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16(std::numeric_limits<float>::quiet_NaN()))));
  EXPECT_EQ(round_bf16(-2.5f), -2.5f);
  EXPECT_EQ(bf16_to_f32(f32_to_bf16(std::numeric_limits<float>::infinity())),
            std::numeric_limits<float>::infinity());
}

TEST(F16, RoundTripsRepresentableValues) {
  for (float v : {0.0f, 1.0f, -2.5f, 65504.0f, 6.103515625e-05f, 5.960464477539063e-08f})
    EXPECT_EQ(f16_to_f32(f32_to_f16(v)), v) << v;
  EXPECT_EQ(f32_to_f16(1.0f), 0x3c00);
  EXPECT_EQ(f32_to_f16(70000.0f), 0x7c00);
}

TEST(DType, ParsesSafetensorsNames) {
  EXPECT_EQ(parse_dtype("BF16"), DType::BF16);
  EXPECT_EQ(dtype_size(DType::F32), 4u);
  EXPECT_FALSE(parse_dtype("F8_E4M3").has_value());
}

TEST(Sha256, KnownVectors) {
  EXPECT_EQ(sha256_hex(""), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(sha256_hex("abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
}

TEST(Json, ErrorsNameFileAndField) {
  json j = json::parse(R"({"a": 1, "b": "x", "c": {"d": true}})");
  JsonReader r(j, "cfg.json");
  EXPECT_EQ(r.get<int>("a"), 1);
  try {
    r.get<int>("b");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("cfg.json: b: expected an integer"), std::string::npos) << e.what();
  }
  try {
    r.child("c").get<int>("e");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("cfg.json: c.e: missing field"), std::string::npos) << e.what();
  }
  EXPECT_THROW(parse_json("{bad", "x.json"), Error);
  // Malformed JSON: the position in the file's words, without the library's exception tag.
  try {
    parse_json("{\"a\": 1,\n", "x.json");
    FAIL();
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("x.json: malformed JSON: line 2, column 1: syntax error"), std::string::npos) << what;
    EXPECT_EQ(what.find("json.exception"), std::string::npos) << what;
  }
  try {
    parse_json("[1e999]", "big.json");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("big.json: malformed JSON: "), std::string::npos) << e.what();
  }
}

TEST(Progress, FormatsSecondsAsHoursMinutesSeconds) {
  EXPECT_EQ(format_hms(0), "0:00:00");
  EXPECT_EQ(format_hms(59.4), "0:00:59");
  EXPECT_EQ(format_hms(59.5), "0:01:00");
  EXPECT_EQ(format_hms(3725), "1:02:05");
  EXPECT_EQ(format_hms(-3), "0:00:00");
}

TEST(AtomicFile, LeavesNothingWithoutCommit) {
  auto dir = std::filesystem::temp_directory_path() / "atlas_atomic_test";
  std::filesystem::create_directories(dir);
  auto p = (dir / "out.txt").string();
  std::filesystem::remove(p);
  {
    AtomicFile f(p);
    f.write("partial");
  }
  EXPECT_FALSE(std::filesystem::exists(p));
  EXPECT_TRUE(std::filesystem::is_empty(dir));
  write_file_atomic(p, "done");
  EXPECT_EQ(read_file(p), "done");
  std::filesystem::remove_all(dir);
}

// A directory where a file is expected: one error naming it and what it is (fopen opens a
// directory; only its reads fail, which said a bare "read error").
TEST(ReadFile, ADirectoryIsNamedAsOne) {
  const auto dir = (std::filesystem::temp_directory_path() / "atlas_read_dir_test").string();
  std::filesystem::create_directories(dir);
  for (int which = 0; which < 2; ++which) {
    try {
      if (which == 0) (void)read_file(dir);
      else (void)sha256_file(dir);
      ADD_FAILURE() << "no error for a directory (" << which << ")";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(dir + ": is a directory, expected a file"), std::string::npos) << e.what();
    }
  }
  std::filesystem::remove_all(dir);
}
