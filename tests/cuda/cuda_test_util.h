// Helpers for tests/cuda: device buffers, random bf16 data, the skip-without-GPU fixture.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <cstdlib>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "backend/cuda/cuda_ops.h"
#include "core/bf16.h"
#include "core/error.h"

namespace atlas::cuda::test {

// Every GPU test derives from this: without a device it skips with a visible reason.
class CudaTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (device_count() == 0) GTEST_SKIP() << "no CUDA device";
  }
};

// RAII device buffer of T.
template <class T>
class DevBuf {
 public:
  explicit DevBuf(size_t n) : n_(n), p_(static_cast<T*>(device_alloc(std::max<size_t>(n, 1) * sizeof(T)))) {
    // Poison: every test reads back only what the kernel must have written.
    device_memset(p_, 0xff, std::max<size_t>(n, 1) * sizeof(T));
  }
  explicit DevBuf(const std::vector<T>& h) : DevBuf(h.size()) { upload(h); }
  ~DevBuf() { device_free(p_); }
  DevBuf(const DevBuf&) = delete;
  DevBuf& operator=(const DevBuf&) = delete;
  T* get() const { return p_; }
  void upload(const std::vector<T>& h) { copy_to_device(p_, h.data(), h.size() * sizeof(T)); }
  std::vector<T> download() const {
    std::vector<T> h(n_);
    copy_to_host(h.data(), p_, n_ * sizeof(T));
    return h;
  }

 private:
  size_t n_;
  T* p_;
};

// A grouped GEMM's offsets [groups + 1]: the running sum of the rows per group, from 0.
inline std::vector<int32_t> group_offsets(const std::vector<int>& counts) {
  std::vector<int32_t> offsets(counts.size() + 1, 0);
  for (size_t g = 0; g < counts.size(); ++g) offsets[g + 1] = offsets[g] + counts[g];
  return offsets;
}

// n row indices drawn uniformly from [0, limit) in order (a grouped GEMM's gathered x rows).
inline std::vector<int32_t> random_rows(int n, int limit, std::mt19937& rng) {
  std::uniform_int_distribution<int> pick(0, limit - 1);
  std::vector<int32_t> rows(static_cast<size_t>(n));
  for (auto& r : rows) r = pick(rng);
  return rows;
}

// Fresh random inputs for every test, from a seed printed on failure.
inline std::vector<uint16_t> random_bf16(size_t n, std::mt19937& rng, float sigma = 1.0f) {
  std::normal_distribution<float> d(0.0f, sigma);
  std::vector<uint16_t> v(n);
  for (auto& x : v) x = f32_to_bf16(d(rng));
  return v;
}

inline std::vector<float> random_f32(size_t n, std::mt19937& rng, float sigma = 1.0f) {
  std::normal_distribution<float> d(0.0f, sigma);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

// Whether the work issued so far raised a device error (check_device_errors throws; it clears the
// flag for the next run).
inline bool device_error_raised() {
  try {
    check_device_errors();
  } catch (const Error&) {
    return true;
  }
  return false;
}

// The tests' random seed: ATLAS_TEST_SEED where set (to rerun a failure: every test prints its
// seed; not a decimal number below 2^32: the test using it fails naming the variable), else a
// fresh one per process.
inline uint32_t test_seed() {
  static const uint32_t s = [] {
    const char* v = std::getenv("ATLAS_TEST_SEED");
    if (v == nullptr || *v == '\0') return uint32_t(std::random_device{}());
    char* end = nullptr;
    const unsigned long long n = std::strtoull(v, &end, 10);
    if (*end != '\0' || n > 0xffffffffull || *v == '-')
      throw std::invalid_argument(std::string("ATLAS_TEST_SEED: expected a decimal seed below 2^32, got '") + v + "'");
    return uint32_t(n);
  }();
  return s;
}

// Distance in bf16 units in the last place between two finite bf16 values of the same sign
// (ordered integer view), used by the stated tolerances.
inline int bf16_ulp_diff(uint16_t a, uint16_t b) {
  auto ord = [](uint16_t h) { return (h & 0x8000) ? -int(h & 0x7fff) : int(h); };
  return std::abs(ord(a) - ord(b));
}

inline float bf(uint16_t h) { return bf16_to_f32(h); }

// Each value of `bad` makes `parse` (a setting's parser) throw an Error whose message contains
// every string of want(value): the variable's name and the value, at least.
template <class Parse, class Want>
void expect_each_rejected(Parse parse, std::initializer_list<const char*> bad, Want want) {
  for (const char* b : bad) {
    try {
      parse(b);
      ADD_FAILURE() << "no error for '" << b << "'";
    } catch (const Error& e) {
      for (const std::string& part : want(b)) EXPECT_NE(std::string(e.what()).find(part), std::string::npos) << e.what();
    }
  }
}

}  // namespace atlas::cuda::test
