// Per-token SHA-256 digests on the GPU (token_digests_bf16 / _f32, kernels/sha256.cuh) against
// OpenSSL on the host. The reference for a bf16 row is the SHA-256 of its exact float32
// widening (bits << 16) as little-endian bytes: the bytes the host hook path hashes
// (model/digest.h). Shapes cover every tail case of the SHA-256 padding (dim % 16 = 0, 1..13,
// 14 and 15 need a second tail block), M = 1, strided rows and an unaligned base (the scalar-load
// path), and special values (NaN, inf, -0, subnormals). Output buffers are poisoned and a guard
// row past the end must stay untouched. A failure prints the seed, shape, row and both digests.
#include <openssl/evp.h>

#include <cstdio>
#include <string>

#include "cuda_test_util.h"

namespace atlas::cuda::test {
namespace {

std::string hex32(const uint8_t* d) {
  static const char* k = "0123456789abcdef";
  std::string s;
  for (int i = 0; i < 32; ++i) {
    s += k[d[i] >> 4];
    s += k[d[i] & 15];
  }
  return s;
}

// OpenSSL's SHA-256 of n bytes (an independent implementation of the same function).
std::string openssl_sha256(const void* p, size_t n) {
  uint8_t d[32];
  unsigned len = 0;
  if (EVP_Digest(p, n, d, &len, EVP_sha256(), nullptr) != 1 || len != 32) return "openssl failure";
  return hex32(d);
}

// Random bf16 with special values sprinkled in: each must hash as its own bit pattern.
std::vector<uint16_t> bf16_with_specials(size_t n, std::mt19937& rng) {
  std::vector<uint16_t> v = random_bf16(n, rng, 4.0f);
  const uint16_t specials[] = {0x7fc0 /* NaN */, 0xffc1 /* -NaN, payload */, 0x7f80 /* inf */, 0xff80 /* -inf */,
                               0x8000 /* -0 */,  0x0000,                     0x0001 /* subnormal */, 0x807f};
  for (size_t i = 0; i < n; i += 37) v[i] = specials[(i / 37) % 8];
  return v;
}

struct Shape {
  int64_t rows;
  int dim;
  int64_t stride;  // elements between rows (>= dim)
  int offset;      // elements from the allocation's start to row 0 (1 = base not 16-byte aligned)
};

// Every (rows, dim) case, with a dense, a strided and an unaligned layout.
std::vector<Shape> shapes() {
  std::vector<Shape> out;
  const std::pair<int64_t, int> base[] = {{1, 1},    {1, 2048}, {1, 7},    {3, 13},   {4, 14},  {5, 15},
                                          {6, 16},   {7, 17},   {9, 30},   {9, 31},   {8, 32},  {33, 2049},
                                          {64, 2048}, {129, 100}, {1000, 64}, {257, 576}};
  for (auto [rows, dim] : base) {
    out.push_back({rows, dim, dim, 0});
    out.push_back({rows, dim, dim + 24, 0});  // strided: 48 extra bytes (bf16), still 16-byte rows
    out.push_back({rows, dim, dim + 3, 1});   // unaligned base and stride: scalar loads
  }
  return out;
}

class Digest : public CudaTest {};

TEST_F(Digest, Bf16RowsMatchOpenSslOfTheirFloat32Widening) {
  std::mt19937 rng(test_seed());
  SCOPED_TRACE(::testing::Message() << "seed " << test_seed());
  int64_t checked = 0;
  for (const Shape& s : shapes()) {
    SCOPED_TRACE(::testing::Message() << "rows " << s.rows << " dim " << s.dim << " stride " << s.stride << " offset "
                                      << s.offset);
    const size_t n = size_t(s.offset + (s.rows - 1) * s.stride + s.dim);
    const std::vector<uint16_t> x = bf16_with_specials(n, rng);
    DevBuf<uint16_t> dx(x);
    DevBuf<uint8_t> dout(size_t(s.rows + 1) * 32);  // poisoned 0xff; the last row is a guard
    token_digests_bf16({.x = dx.get() + s.offset, .row_stride = s.stride, .rows = s.rows, .dim = s.dim,
                        .out = dout.get()});
    synchronize();
    const std::vector<uint8_t> got = dout.download();
    int bad = 0;
    for (int64_t r = 0; r < s.rows; ++r) {
      std::vector<float> f(size_t(s.dim));
      for (int i = 0; i < s.dim; ++i) f[size_t(i)] = bf16_to_f32(x[size_t(s.offset + r * s.stride + i)]);
      const std::string want = openssl_sha256(f.data(), f.size() * 4);
      const std::string have = hex32(got.data() + r * 32);
      if (want != have && bad++ < 3) ADD_FAILURE() << "row " << r << ": device " << have << ", openssl " << want;
      ++checked;
    }
    EXPECT_EQ(bad, 0) << bad << " of " << s.rows << " rows differ";
    for (int i = 0; i < 32; ++i) ASSERT_EQ(got[size_t(s.rows * 32 + i)], 0xff) << "guard row written at byte " << i;
  }
  std::printf("[ info ] %lld bf16 token digests equal OpenSSL's\n", (long long)checked);
}

TEST_F(Digest, F32RowsMatchOpenSslAndWidenedBf16GivesTheSameDigest) {
  std::mt19937 rng(test_seed() + 1);
  SCOPED_TRACE(::testing::Message() << "seed " << test_seed() + 1);
  for (const Shape& s : shapes()) {
    SCOPED_TRACE(::testing::Message() << "rows " << s.rows << " dim " << s.dim << " stride " << s.stride << " offset "
                                      << s.offset);
    const size_t n = size_t(s.offset + (s.rows - 1) * s.stride + s.dim);
    const std::vector<uint16_t> xb = bf16_with_specials(n, rng);
    std::vector<float> xf = random_f32(n, rng, 10.0f);
    DevBuf<float> dxf(xf);
    DevBuf<uint8_t> dout(size_t(s.rows + 1) * 32);
    token_digests_f32({.x = dxf.get() + s.offset, .row_stride = s.stride, .rows = s.rows, .dim = s.dim, .out = dout.get()});
    synchronize();
    const std::vector<uint8_t> got = dout.download();
    int bad = 0;
    for (int64_t r = 0; r < s.rows; ++r) {
      const std::string want = openssl_sha256(xf.data() + s.offset + r * s.stride, size_t(s.dim) * 4);
      const std::string have = hex32(got.data() + r * 32);
      if (want != have && bad++ < 3) ADD_FAILURE() << "f32 row " << r << ": device " << have << ", openssl " << want;
    }
    EXPECT_EQ(bad, 0);
    for (int i = 0; i < 32; ++i) ASSERT_EQ(got[size_t(s.rows * 32 + i)], 0xff) << "guard row written at byte " << i;

    // The same values as bf16 on the device and widened to f32 on the host: identical digests
    // (what an f32 compute mode and the bf16 mode must agree on for equal values).
    for (size_t i = 0; i < n; ++i) xf[i] = bf16_to_f32(xb[i]);
    DevBuf<uint16_t> dxb(xb);
    DevBuf<float> dxw(xf);
    DevBuf<uint8_t> ob(size_t(s.rows) * 32), ow(size_t(s.rows) * 32);
    token_digests_bf16({.x = dxb.get() + s.offset, .row_stride = s.stride, .rows = s.rows, .dim = s.dim, .out = ob.get()});
    token_digests_f32({.x = dxw.get() + s.offset, .row_stride = s.stride, .rows = s.rows, .dim = s.dim, .out = ow.get()});
    synchronize();
    EXPECT_EQ(ob.download(), ow.download());
  }
}

// Each row's digest depends only on the row: digesting a sub-range of rows (as a smaller batch
// would) gives the same bytes as the corresponding part of the whole launch.
TEST_F(Digest, RowDigestDoesNotDependOnTheOtherRows) {
  std::mt19937 rng(test_seed() + 2);
  SCOPED_TRACE(::testing::Message() << "seed " << test_seed() + 2);
  const int64_t rows = 300;
  const int dim = 2048;
  const std::vector<uint16_t> x = random_bf16(size_t(rows * dim), rng);
  DevBuf<uint16_t> dx(x);
  DevBuf<uint8_t> all(size_t(rows) * 32), part(size_t(37) * 32);
  token_digests_bf16({.x = dx.get(), .rows = rows, .dim = dim, .out = all.get()});
  token_digests_bf16({.x = dx.get() + 101 * dim, .rows = 37, .dim = dim, .out = part.get()});
  synchronize();
  const std::vector<uint8_t> a = all.download(), p = part.download();
  EXPECT_TRUE(std::equal(p.begin(), p.end(), a.begin() + 101 * 32));
}

// Argument checks happen before any device call, so this runs without a GPU too.
TEST(DigestArgs, BadArgumentsNameTheOpAndField) {
  uint8_t out[32];
  const uint16_t x[4] = {};
  auto msg = [](auto fn) {
    try {
      fn();
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(msg([&] { token_digests_bf16({.x = x, .rows = 1, .dim = 0, .out = out}); }).find("token_digests_bf16: dim"),
            std::string::npos);
  EXPECT_NE(msg([&] { token_digests_bf16({.x = x, .row_stride = 2, .rows = 1, .dim = 4, .out = out}); })
                .find("row_stride"),
            std::string::npos);
  EXPECT_NE(msg([&] { token_digests_f32({.x = nullptr, .rows = 1, .dim = 4, .out = out}); }).find("token_digests_f32: pointers"),
            std::string::npos);
  EXPECT_NE(msg([&] { token_digests_bf16({.x = x, .rows = -1, .dim = 4, .out = out}); }).find("rows"), std::string::npos);
}

}  // namespace
}  // namespace atlas::cuda::test
