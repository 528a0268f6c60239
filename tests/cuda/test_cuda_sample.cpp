// The sampling kernel (kernels/sample.cuh) against decode/sample_core.h's sample_row() on the
// same widened logits: identical tokens (and identical error codes and indices) for random
// rows and parameters, bf16 and f32 logits, vocabularies from 1 to DeepSeek's 102400. The host
// test tests/decode/test_sample_core.cpp shows sample_row() == decode::RowSampler's contract,
// so together: device draw == host draw. Greedy-mode rows must be left untouched.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <limits>
#include <random>
#include <string>

#include "cuda_test_util.h"
#include "decode/sample_core.h"

namespace atlas::cuda::test {
namespace {

namespace sc = atlas::sample_core;
using Sample = CudaTest;
constexpr int32_t kUntouched = 0x7ffffff0;

struct Row {
  std::vector<float> x;  // widened logits (what the host sampler sees)
  sc::RowParams p;
  double T = 1, top_p = 1;
};

Row random_row(std::mt19937_64& g, int vocab, bool bf16) {
  std::uniform_real_distribution<double> U(0.0, 1.0);
  auto pick = [&](int n) { return int(g() % uint64_t(n)); };
  Row r;
  r.x.resize(size_t(vocab));
  const double spreads[] = {1e-3, 0.5, 3.0, 20.0, 300.0};
  const double spread = spreads[pick(5)];
  std::normal_distribution<double> N(pick(3) == 0 ? -50.0 : 0.0, spread);
  const bool few = pick(4) == 0;
  for (auto& v : r.x) {
    double d = N(g);
    if (few) d = std::round(d / spread * 2.0) * 0.25;  // ties
    v = bf16 ? bf16_to_f32(f32_to_bf16(float(d))) : float(d);
  }
  if (pick(3) == 0)
    for (int i = 0, n = 1 + pick(std::max(1, vocab / 3)); i < n; ++i)
      r.x[size_t(pick(vocab))] = -std::numeric_limits<float>::infinity();
  if (pick(6) == 0) r.x[size_t(pick(vocab))] = -0.0f;
  if (pick(40) == 0) r.x[size_t(pick(vocab))] = std::nanf("");
  if (pick(40) == 0) r.x[size_t(pick(vocab))] = std::numeric_limits<float>::infinity();
  const double temps[] = {1.0, 0.3, 0.7, 1.5, 1e-4, 1e4, 0.05};
  const double ps[] = {1.0, 0.95, 0.5, 0.0, 0.9999, U(g)};
  r.T = temps[pick(7)];
  r.top_p = ps[pick(6)];
  int64_t k = 0;
  switch (pick(6)) {
    case 0: k = 0; break;
    case 1: k = 1; break;
    case 2: k = vocab; break;
    case 3: k = vocab + 3; break;
    default: k = 1 + pick(std::min(vocab, 2000)); break;
  }
  double u = 0.0;
  switch (pick(5)) {
    case 0: u = 0.0; break;
    case 1: u = std::ldexp(1.0, -53) * double(1 + pick(1000)); break;
    case 2: u = 1.0 - std::ldexp(1.0, -53) * double(1 + pick(4)); break;
    default: u = std::ldexp(double(g() >> 11), -53); break;
  }
  r.p = sc::make_row_params(r.T, r.top_p, k, u);
  if (pick(8) == 0) r.p.mode = sc::kGreedy;  // must stay untouched
  return r;
}

std::string describe(int row, const Row& r) {
  char buf[256];
  std::snprintf(buf, sizeof buf, "row %d: V=%zu mode=%d T=%.17g top_p=%.17g top_k=%lld u=%.17g", row, r.x.size(),
                r.p.mode, r.T, r.top_p, (long long)r.p.top_k, r.p.u);
  return buf;
}

// One batch of `rows` rows through the kernel; every row compared with the host core.
void run_batch(uint64_t seed, int rows, int vocab, bool bf16) {
  std::mt19937_64 g(seed);
  std::vector<Row> batch;
  for (int r = 0; r < rows; ++r) batch.push_back(random_row(g, vocab, bf16));
  std::vector<sc::RowParams> params;
  for (const auto& r : batch) params.push_back(r.p);
  DevBuf<uint8_t> dparams(params.size() * sizeof(sc::RowParams));
  copy_to_device(dparams.get(), params.data(), params.size() * sizeof(sc::RowParams));
  DevBuf<int32_t> out(std::vector<int32_t>(size_t(rows), kUntouched));
  DevBuf<uint32_t> ws(sample_workspace_ints(rows, vocab));  // poisoned
  const auto* pp = reinterpret_cast<const sc::RowParams*>(dparams.get());
  if (bf16) {
    std::vector<uint16_t> h;
    for (const auto& r : batch)
      for (float v : r.x) h.push_back(f32_to_bf16(v));  // exact: the values are bf16 already
    DevBuf<uint16_t> d(h);
    sample(SampleArgs{.logits = d.get(), .params = pp, .out = out.get(), .workspace = ws.get(), .rows = rows,
                      .vocab = vocab});
    synchronize();
  } else {
    std::vector<float> h;
    for (const auto& r : batch) h.insert(h.end(), r.x.begin(), r.x.end());
    DevBuf<float> d(h);
    sample(SampleArgsT<float>{.logits = d.get(), .params = pp, .out = out.get(), .workspace = ws.get(),
                              .rows = rows, .vocab = vocab});
    synchronize();
  }
  const std::vector<int32_t> got = out.download();
  int bad = 0;
  for (int r = 0; r < rows; ++r) {
    const Row& row = batch[size_t(r)];
    const int32_t want = row.p.mode == sc::kSample ? sc::sample_row(row.x.data(), vocab, row.p) : kUntouched;
    if (got[size_t(r)] != want && ++bad <= 10)
      ADD_FAILURE() << (bf16 ? "bf16 " : "f32 ") << describe(r, row) << ": device " << got[size_t(r)]
                    << ", host core " << want << " (negative = -(code + 8 * index), code 1 NaN, 2 +inf, 3 overflow, "
                    << "4 no finite; " << kUntouched << " = untouched), seed " << seed;
  }
  EXPECT_EQ(bad, 0) << bad << " of " << rows << " rows differ";
}

TEST_F(Sample, SmallVocabulariesMatchTheHostCore) {
  const uint64_t seed = test_seed();
  int n = 0;
  for (int vocab : {1, 2, 3, 5, 16, 37, 257, 1000, 1025, 4099})
    for (bool bf16 : {true, false}) run_batch(seed + uint64_t(n++), 200, vocab, bf16);
}

TEST_F(Sample, DeepSeekVocabularyMatchesTheHostCore) {
  const uint64_t seed = test_seed();
  run_batch(seed, 48, 102400, true);
  run_batch(seed + 1, 16, 102400, false);
}

TEST_F(Sample, BadArgumentsAreRejected) {
  DevBuf<uint16_t> x(8);
  DevBuf<int32_t> out(1);
  DevBuf<uint32_t> ws(64);
  DevBuf<uint8_t> p(32);
  const auto* pp = reinterpret_cast<const sc::RowParams*>(p.get());
  EXPECT_THROW(sample(SampleArgs{.logits = x.get(), .params = pp, .out = out.get(), .workspace = ws.get(),
                                 .rows = 1, .vocab = 0}),
               Error);
  EXPECT_THROW(sample(SampleArgs{.logits = x.get(), .params = pp, .out = nullptr, .workspace = ws.get(),
                                 .rows = 1, .vocab = 8}),
               Error);
  EXPECT_THROW(sample(SampleArgs{.logits = x.get(), .params = pp, .out = out.get(), .workspace = ws.get(),
                                 .rows = 1, .vocab = 8, .stride = 4}),
               Error);
}

}  // namespace
}  // namespace atlas::cuda::test
