// Shared helpers for the io tests: scratch directories and raw file surgery.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <string>

#include "core/error.h"
#include "core/file.h"

namespace atlas::testing {

// A fresh directory under the system temp dir, removed at the end of the test.
struct ScratchDir {
  std::filesystem::path path;
  explicit ScratchDir(const std::string& tag) {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    path = std::filesystem::temp_directory_path() /
           ("atlas_io_" + tag + "_" + (info ? std::string(info->name()) : "x") + "_" + std::to_string(::getpid()));
    std::filesystem::remove_all(path);
    std::filesystem::create_directories(path);
  }
  ~ScratchDir() { std::filesystem::remove_all(path); }
  std::string operator/(const std::string& rel) const { return (path / rel).string(); }
  std::string str() const { return path.string(); }
};

// Runs f, expects an atlas::Error whose message contains every one of `parts`.
template <class F>
void expect_error(F&& f, std::initializer_list<std::string> parts) {
  try {
    f();
    ADD_FAILURE() << "expected an atlas::Error";
  } catch (const Error& e) {
    std::string m = e.what();
    for (const auto& p : parts) EXPECT_NE(m.find(p), std::string::npos) << "message lacks \"" << p << "\": " << m;
  }
}

inline void truncate_by(const std::string& path, uintmax_t n) {
  auto size = std::filesystem::file_size(path);
  std::filesystem::resize_file(path, size - n);
}

}  // namespace atlas::testing
