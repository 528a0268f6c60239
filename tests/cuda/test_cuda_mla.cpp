// MLA attention (absorbed form), decode and prefill: the tensor-core kernel against its CPU
// mirror and exact math, bit-exact invariances (batch, order, grouping of prefill queries,
// max_length, load path, repeated runs), and the scalar kernel as the on-device cross-check.
// Unused cache slots hold NaN: a kernel that lets one into a result (even with weight 0) fails.
#include <algorithm>
#include <cmath>
#include <numeric>

#include "backend/cuda/reference.h"
#include "cuda_test_util.h"
#include "mla_test_util.h"

namespace atlas::cuda::test {
namespace {

class Mla : public CudaTest {};

constexpr float kScale = 0.11472139f;  // spec section 3: 192^-1/2 * m^2 for Lite
constexpr uint16_t kNaN = 0x7fc1;      // bf16 quiet NaN: the poison of slots no query may read

struct Shape {
  int heads = 16, latent = kMlaLatent, rope = kMlaRope;
  int width() const { return latent + rope; }
};

// Queries over cache rows: q [Q, heads, width]; cache [n_rows, capacity, width]. Slots at or
// past the longest query of a row are NaN.
struct Problem {
  Shape sh;
  int capacity = 0;
  std::vector<uint16_t> q{}, cache{};
  std::vector<int32_t> lengths{};
  std::vector<int32_t> rows{};  // cache row per query; empty: query b reads row b
  int queries() const { return int(lengths.size()); }
  int row_of(int b) const { return rows.empty() ? b : rows[size_t(b)]; }
  int longest() const { return std::max(1, *std::max_element(lengths.begin(), lengths.end())); }
  const uint16_t* q_of(int b) const { return &q[size_t(b) * sh.heads * sh.width()]; }
  const uint16_t* cache_of(int b) const { return &cache[size_t(row_of(b)) * capacity * sh.width()]; }
};

Problem make_problem(std::mt19937& rng, Shape sh, std::vector<int32_t> lengths, std::vector<int32_t> rows,
                     int capacity) {
  Problem p{.sh = sh, .capacity = capacity, .lengths = std::move(lengths), .rows = std::move(rows)};
  const int W = sh.width();
  p.q = random_bf16(size_t(p.queries()) * sh.heads * W, rng, 0.5f);
  int n_rows = p.rows.empty() ? p.queries() : *std::max_element(p.rows.begin(), p.rows.end()) + 1;
  std::vector<int> filled(size_t(n_rows), 0);
  for (int b = 0; b < p.queries(); ++b) filled[size_t(p.row_of(b))] = std::max(filled[size_t(p.row_of(b))], p.lengths[size_t(b)]);
  p.cache.assign(size_t(n_rows) * capacity * W, kNaN);
  for (int r = 0; r < n_rows; ++r) {
    const auto vals = random_bf16(size_t(filled[size_t(r)]) * W, rng, 1.0f);
    std::copy(vals.begin(), vals.end(), p.cache.begin() + ptrdiff_t(size_t(r) * capacity * W));
  }
  return p;
}

struct Call {
  MlaImpl impl = MlaImpl::tensor_core;
  int queries_per_block = 0;
  int tile_buffers = 0;
  int tile_parallel = 0;
  int split = 256;
  int max_length = 0;     // 0: the longest query
  bool misalign = false;  // q and cache one element off 16-byte alignment: the element-load path
  bool stable_prefix = false;  // the cluster kernel's decode-step copy order (MlaDecodeArgs)
  int exchange = 0;            // MlaDecodeArgs::cluster_exchange
  int cluster_merge = 0;       // MlaDecodeArgs::cluster_merge
};

std::vector<uint16_t> run_gpu(const Problem& p, const Call& c = {}) {
  const Shape& sh = p.sh;
  const size_t off = c.misalign ? 1 : 0;
  std::vector<uint16_t> qb(off, 0), cb(off, 0);
  qb.insert(qb.end(), p.q.begin(), p.q.end());
  cb.insert(cb.end(), p.cache.begin(), p.cache.end());
  const int Q = p.queries(), max_length = c.max_length ? c.max_length : p.longest();
  DevBuf<uint16_t> dq(qb), dc(cb), dout(size_t(Q) * sh.heads * sh.latent);
  DevBuf<int32_t> dl(p.lengths), dr(p.rows.empty() ? std::vector<int32_t>{0} : p.rows);
  DevBuf<float> ws(mla_decode_workspace_floats(Q, sh.heads, max_length, c.split));
  mla_decode({.q = dq.get() + off, .latent_cache = dc.get() + off, .cache_row_stride = int64_t(p.capacity) * sh.width(),
              .lengths = dl.get(), .cache_rows = p.rows.empty() ? nullptr : dr.get(), .max_length = max_length,
              .out = dout.get(), .latent = sh.latent, .rope = sh.rope, .rows = Q, .heads = sh.heads, .scale = kScale,
              .split_tokens = c.split, .workspace = ws.get(), .impl = c.impl,
              .queries_per_block = c.queries_per_block, .tile_buffers = c.tile_buffers,
              .tile_parallel = c.tile_parallel, .cluster_exchange = c.exchange, .cluster_merge = c.cluster_merge,
              .stable_prefix = c.stable_prefix});
  check_device_errors();
  return dout.download();
}

std::vector<uint16_t> run_ref(const Problem& p, MlaImpl impl = MlaImpl::tensor_core, int split = 256) {
  std::vector<uint16_t> out(size_t(p.queries()) * p.sh.heads * p.sh.latent, 0x1234);
  ref::mla_decode({.q = p.q.data(), .latent_cache = p.cache.data(),
                   .cache_row_stride = int64_t(p.capacity) * p.sh.width(), .lengths = p.lengths.data(),
                   .cache_rows = p.rows.empty() ? nullptr : p.rows.data(), .max_length = p.capacity,
                   .out = out.data(), .latent = p.sh.latent, .rope = p.sh.rope, .rows = p.queries(),
                   .heads = p.sh.heads, .scale = kScale, .split_tokens = split, .impl = impl});
  return out;
}

std::vector<MlaExact> exact_all(const Problem& p) {
  std::vector<MlaExact> e;
  for (int b = 0; b < p.queries(); ++b)
    for (int h = 0; h < p.sh.heads; ++h)
      e.push_back(mla_exact(p.q_of(b) + size_t(h) * p.sh.width(), p.cache_of(b), p.lengths[size_t(b)], p.sh.width(),
                            p.sh.latent, kScale));
  return e;
}

// Query b alone: one row, its own cache copy cut to its length (capacity = length; a length-0
// query gets one NaN slot), no cache_rows, max_length = its length.
Problem alone(const Problem& p, int b) {
  const int len = p.lengths[size_t(b)], W = p.sh.width();
  Problem a{.sh = p.sh, .capacity = std::max(len, 1), .lengths = {len}};
  a.q.assign(p.q_of(b), p.q_of(b) + size_t(p.sh.heads) * W);
  a.cache.assign(p.cache_of(b), p.cache_of(b) + size_t(len) * W);
  if (len == 0) a.cache.assign(size_t(W), kNaN);
  return a;
}

size_t out_size(const Problem& p) { return size_t(p.sh.heads) * p.sh.latent; }

// got's query b equals want's query wb, bit for bit.
void expect_query_bits(const std::vector<uint16_t>& got, int b, const std::vector<uint16_t>& want, int wb, size_t n,
                       const char* what) {
  ASSERT_TRUE(std::equal(got.begin() + ptrdiff_t(size_t(b) * n), got.begin() + ptrdiff_t(size_t(b + 1) * n),
                         want.begin() + ptrdiff_t(size_t(wb) * n)))
      << what << ": query " << wb;
}

// The scalar kernel against its own mirror: only expf differs, so at most one bf16 ulp plus
// 1e-6 absolute (outputs that cancel to near zero), at most 1% of the elements differ at all.
void expect_close_to_scalar_ref(const std::vector<uint16_t>& got, const std::vector<uint16_t>& want) {
  ASSERT_EQ(got.size(), want.size());
  size_t differ = 0, bad = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const float g = bf(got[i]), w = bf(want[i]);
    if (!(std::abs(g - w) <= std::ldexp(std::abs(w), -7) + 1e-6f) && bad++ < 10)
      ADD_FAILURE() << i << ": " << g << " vs " << w;
    differ += got[i] != want[i];
  }
  EXPECT_LE(differ, got.size() / 100);
}

TEST_F(Mla, DecodeMatchesReferenceAndExactMath) {
  std::mt19937 rng(test_seed());
  SCOPED_TRACE(::testing::Message() << "seed " << test_seed());
  const Problem p = make_problem(rng, {}, {1, 2, 63, 64, 65, 100, 256, 257, 1000, 1500}, {}, 1500);
  const auto exact = exact_all(p);
  const auto got = run_gpu(p);
  expect_matches_tc_reference(got, run_ref(p), exact, p.sh.latent);
  expect_close_to_exact(got, exact, p.sh.latent, p.lengths, p.sh.heads);
  // The scalar kernel: its own contract (fp32 P), and exact math.
  const auto scalar = run_gpu(p, {.impl = MlaImpl::scalar});
  expect_close_to_scalar_ref(scalar, run_ref(p, MlaImpl::scalar));
  expect_close_to_exact(scalar, exact, p.sh.latent, p.lengths, p.sh.heads, /*p_rounded=*/false);
  // On-device cross-check of the two kernels (usable where exact math is not at hand): each
  // head within relative L2 5e-3 (the host simulation: <= 3e-3; the bf16 P is the difference).
  for (size_t qh = 0; qh < exact.size(); ++qh) {
    std::vector<double> s(size_t(p.sh.latent));
    for (size_t d = 0; d < s.size(); ++d) s[d] = bf(scalar[qh * s.size() + d]);
    EXPECT_LT(rel_l2(&got[qh * s.size()], s), 5e-3) << "query-head " << qh;
  }
}

// Split sizes other than 256 (not multiples of the 64-slot tile, and larger than 256).
TEST_F(Mla, OtherSplitSizesFollowTheContract) {
  std::mt19937 rng(test_seed());
  SCOPED_TRACE(::testing::Message() << "seed " << test_seed());
  const Problem p = make_problem(rng, {}, {1, 64, 65, 130, 300, 700}, {}, 700);
  const auto exact = exact_all(p);
  for (int split : {64, 100, 1000}) {
    SCOPED_TRACE(::testing::Message() << "split " << split);
    const auto got = run_gpu(p, {.split = split});
    expect_matches_tc_reference(got, run_ref(p, MlaImpl::tensor_core, split), exact, p.sh.latent);
    expect_close_to_exact(got, exact, p.sh.latent, p.lengths, p.sh.heads);
  }
}

// Decode: a row's output does not depend on the batch (alone, other rows, other positions),
// on max_length (a CUDA graph sized for the cache capacity), on the grouping of queries into
// blocks, on the load path, or on the run.
TEST_F(Mla, RowResultIsBatchInvariant) {
  std::mt19937 rng(test_seed());
  SCOPED_TRACE(::testing::Message() << "seed " << test_seed());
  const Problem p = make_problem(rng, {}, {700, 3, 511, 512, 513, 64, 299, 1, 0}, {}, 4096);
  const size_t n = out_size(p);
  const auto batch = run_gpu(p);
  for (int b = 0; b < p.queries(); ++b) expect_query_bits(run_gpu(alone(p, b)), 0, batch, b, n, "alone");
  for (size_t i = 8 * n; i < 9 * n; ++i) ASSERT_EQ(batch[i], 0) << "length 0 gives zeros";
  // Reversed order.
  Problem rev = p;
  const int Q = p.queries(), W = p.sh.width();
  for (int b = 0; b < Q; ++b) {
    const int src = Q - 1 - b;
    rev.lengths[size_t(b)] = p.lengths[size_t(src)];
    std::copy(p.q_of(src), p.q_of(src) + size_t(p.sh.heads) * W, rev.q.begin() + ptrdiff_t(size_t(b) * p.sh.heads * W));
    std::copy(p.cache_of(src), p.cache_of(src) + size_t(p.capacity) * W,
              rev.cache.begin() + ptrdiff_t(size_t(b) * p.capacity * W));
  }
  const auto r = run_gpu(rev);
  for (int b = 0; b < Q; ++b) expect_query_bits(r, Q - 1 - b, batch, b, n, "reversed");
  EXPECT_EQ(run_gpu(p, {.max_length = p.capacity}), batch) << "max_length = capacity";
  EXPECT_EQ(run_gpu(p, {.queries_per_block = 2}), batch) << "two queries (two cache rows) per block";
  EXPECT_EQ(run_gpu(p, {.queries_per_block = 4}), batch) << "four queries (four cache rows) per block";
  EXPECT_EQ(run_gpu(p, {.tile_buffers = 1}), batch) << "one cache tile buffer";
  EXPECT_EQ(run_gpu(p, {.tile_buffers = 2}), batch) << "two cache tile buffers";
  EXPECT_EQ(run_gpu(p, {.misalign = true}), batch) << "element loads instead of cp.async";
  EXPECT_EQ(run_gpu(p), batch) << "second run";
}

// Prefill: many queries per cache row with their causal lengths (padding queries of length 0
// first, lengths across the 64-slot tiles and the 256-slot splits). Each query's bits must not
// depend on which queries share its block: grouped in pairs or not, pairs shifted by one,
// queries shuffled, alone, max_length larger, either load path.
TEST_F(Mla, PrefillQueriesDoNotDependOnTheirNeighbours) {
  std::mt19937 rng(test_seed());
  SCOPED_TRACE(::testing::Message() << "seed " << test_seed());
  std::vector<int32_t> lengths, rows;
  auto add = [&](int row, int from, int to) {
    for (int l = from; l <= to; ++l) {
      lengths.push_back(l);
      rows.push_back(row);
    }
  };
  add(0, 0, 0);
  add(0, 0, 0);
  add(0, 0, 150);  // three padding queries, then the causal sequence 1..150
  add(1, 240, 272);
  add(2, 500, 520);
  add(2, 1030, 1030);
  const Problem p = make_problem(rng, {}, lengths, rows, 1100);
  const size_t n = out_size(p);
  const int Q = p.queries();
  const auto batch = run_gpu(p);  // auto: two queries per block (cache_rows is set)
  const auto exact = exact_all(p);
  expect_matches_tc_reference(batch, run_ref(p), exact, p.sh.latent);
  expect_close_to_exact(batch, exact, p.sh.latent, p.lengths, p.sh.heads);
  for (int b = 0; b < 3; ++b)
    for (size_t i = 0; i < n; ++i) ASSERT_EQ(batch[size_t(b) * n + i], 0) << "padding query " << b;

  EXPECT_EQ(run_gpu(p, {.queries_per_block = 1}), batch) << "one query per block";
  EXPECT_EQ(run_gpu(p, {.queries_per_block = 2}), batch) << "two queries per block";
  EXPECT_EQ(run_gpu(p, {.queries_per_block = 1, .tile_buffers = 1}), batch) << "one query, one tile buffer";
  EXPECT_EQ(run_gpu(p, {.queries_per_block = 2, .tile_buffers = 1}), batch) << "two queries, one tile buffer";
  EXPECT_EQ(run_gpu(p, {.queries_per_block = 4}), batch) << "four queries per block";
  EXPECT_EQ(run_gpu(p, {.max_length = p.capacity}), batch) << "max_length = capacity";
  EXPECT_EQ(run_gpu(p, {.misalign = true}), batch) << "element loads instead of cp.async";
  EXPECT_EQ(run_gpu(p), batch) << "second run";
  // Pairs shifted by one: an extra query in front.
  {
    Problem s = p;
    s.lengths.insert(s.lengths.begin(), 7);
    s.rows.insert(s.rows.begin(), 2);
    const auto extra = random_bf16(size_t(p.sh.heads) * p.sh.width(), rng, 0.5f);
    s.q.insert(s.q.begin(), extra.begin(), extra.end());
    const auto got = run_gpu(s);
    for (int b = 0; b < Q; ++b) expect_query_bits(got, b + 1, batch, b, n, "shifted");
  }
  // Shuffled queries (neighbours of other rows and lengths).
  {
    std::vector<int> perm(static_cast<size_t>(Q));
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), rng);
    Problem s = p;
    const size_t qn = size_t(p.sh.heads) * p.sh.width();
    for (int b = 0; b < Q; ++b) {
      s.lengths[size_t(b)] = p.lengths[size_t(perm[size_t(b)])];
      s.rows[size_t(b)] = p.rows[size_t(perm[size_t(b)])];
      std::copy(p.q_of(perm[size_t(b)]), p.q_of(perm[size_t(b)]) + qn, s.q.begin() + ptrdiff_t(size_t(b) * qn));
    }
    const auto got = run_gpu(s);
    for (int b = 0; b < Q; ++b) expect_query_bits(got, b, batch, perm[size_t(b)], n, "shuffled");
  }
  for (int b = 0; b < Q; ++b) expect_query_bits(run_gpu(alone(p, b)), 0, batch, b, n, "alone");
}

// The tiny models' shapes (heads 2-4, latent 16-32, rope 8-16, widths not multiples of 16),
// a width that is not a multiple of 8 (element loads), a latent not a multiple of 8, no rope.
TEST_F(Mla, SmallAndOddShapes) {
  std::mt19937 rng(test_seed());
  SCOPED_TRACE(::testing::Message() << "seed " << test_seed());
  const std::vector<Shape> shapes = {{2, 16, 16}, {4, 32, 16}, {4, 32, 8}, {3, 20, 6}, {1, 8, 0}, {16, 500, 60}};
  const std::vector<int32_t> lengths = {0, 1, 2, 3, 64, 65, 255, 256, 257, 300, 5, 6, 7, 200};
  const std::vector<int32_t> rows = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1};
  for (const Shape& sh : shapes) {
    SCOPED_TRACE(::testing::Message() << "heads " << sh.heads << " latent " << sh.latent << " rope " << sh.rope);
    const Problem p = make_problem(rng, sh, lengths, rows, 300);
    const size_t n = out_size(p);
    const auto batch = run_gpu(p);
    const auto exact = exact_all(p);
    expect_matches_tc_reference(batch, run_ref(p), exact, sh.latent);
    expect_close_to_exact(batch, exact, sh.latent, p.lengths, sh.heads);
    EXPECT_EQ(run_gpu(p, {.queries_per_block = 1}), batch);
    EXPECT_EQ(run_gpu(p, {.misalign = true}), batch);
    for (int b = 0; b < p.queries(); ++b) expect_query_bits(run_gpu(alone(p, b)), 0, batch, b, n, "alone");
    expect_close_to_scalar_ref(run_gpu(p, {.impl = MlaImpl::scalar}), run_ref(p, MlaImpl::scalar));
  }
}

// The tile-parallel kernel (a cluster of 4 blocks per split, one tile each in phase 1) against
// the walk (one block per split), bit for bit: lengths at and around every tile and split
// boundary, padded heads, latents that are not a multiple of 128 (blocks with few or no phase-2
// columns) or of 8, splits with fewer than 4 tiles, queries sharing cache rows, max_length past
// the longest query, repeated runs, the decode step's early copies.
TEST_F(Mla, TileParallelGivesTheBitsOfTheWalk) {
  if (!mla_tile_parallel_available()) GTEST_SKIP() << "no cluster launch on this GPU / build";
  std::mt19937 rng(test_seed());
  SCOPED_TRACE(::testing::Message() << "seed " << test_seed());
  const std::vector<int32_t> lengths = {1, 17, 63, 64, 65, 128, 129, 200, 255, 256, 257, 300, 511, 512, 513, 700, 0};
  for (const Shape& sh : std::vector<Shape>{{}, {5, 512, 64}, {16, 100, 12}, {4, 32, 16}, {2, 16, 16}, {3, 384, 0}}) {
    SCOPED_TRACE(::testing::Message() << "heads " << sh.heads << " latent " << sh.latent << " rope " << sh.rope);
    const Problem p = make_problem(rng, sh, lengths, {}, 720);
    const auto walk = run_gpu(p, {.tile_parallel = 1});
    // Each way the blocks exchange the row maxima and P (1 pull, 2 push, 3 async; session 36).
    for (const int x : {1, 2, 3}) {
      SCOPED_TRACE(::testing::Message() << "exchange " << x);
      EXPECT_EQ(run_gpu(p, {.tile_parallel = 2, .exchange = x}), walk);
      EXPECT_EQ(run_gpu(p, {.tile_parallel = 2, .max_length = p.capacity, .exchange = x}), walk)
          << "max_length = capacity";
      EXPECT_EQ(run_gpu(p, {.tile_parallel = 2, .exchange = x}), walk) << "second run";
      // A decode step's order: every slot but the newest copied first, then the newest and the
      // query (under launch overlap: before and after the wait; the model tests' overlap runs
      // take this order wherever their decode attention runs the cluster kernel).
      EXPECT_EQ(run_gpu(p, {.tile_parallel = 2, .stable_prefix = true, .exchange = x}), walk) << "stable prefix";
    }
  }
  // Queries sharing cache rows (one query per block: the decode form of a shared prompt).
  const Problem p = make_problem(rng, {}, {300, 64, 257, 1, 513, 40}, {0, 0, 1, 1, 2, 2}, 600);
  const auto walk = run_gpu(p, {.queries_per_block = 1, .tile_parallel = 1});
  for (const int x : {1, 2, 3})
    EXPECT_EQ(run_gpu(p, {.queries_per_block = 1, .tile_parallel = 2, .exchange = x}), walk)
        << "cache rows shared, exchange " << x;
}

// The pair merge (session 70, MlaDecodeArgs::cluster_merge): where max_length has at most two
// splits, the cluster kernel runs a query's two splits in one cluster of 8 blocks and merges them
// itself (no merge launch), length-0 queries' zeros included. Bit for bit against the walk with
// the merge launch and against the cluster kernel with it: lengths at and around every tile and
// split boundary up to 512, 0 (the poisoned output must be overwritten with zeros), the shapes of
// the tile-parallel test, two splits (clusters of 8) and one (clusters of 4), the decode step's
// early copies, a batch of 16 queries (16 clusters of 8), queries sharing cache rows, and the
// refusal where it cannot run.
TEST_F(Mla, PairMergeGivesTheBitsOfTheMergeLaunch) {
  if (!mla_tile_parallel_available()) GTEST_SKIP() << "no cluster launch on this GPU / build";
  std::mt19937 rng(test_seed());
  SCOPED_TRACE(::testing::Message() << "seed " << test_seed());
  constexpr int kAsync = 3;
  const std::vector<int32_t> lengths = {1, 17, 63, 64, 65, 128, 200, 255, 256, 257, 300, 320, 384, 449, 511, 512, 0};
  for (const Shape& sh : std::vector<Shape>{{}, {5, 512, 64}, {16, 100, 12}, {4, 32, 16}, {2, 16, 16}, {3, 384, 0}}) {
    SCOPED_TRACE(::testing::Message() << "heads " << sh.heads << " latent " << sh.latent << " rope " << sh.rope);
    const Problem p = make_problem(rng, sh, lengths, {}, 520);
    const auto walk = run_gpu(p, {.tile_parallel = 1});
    {  // two splits: clusters of (4, 2)
      const Call pair{.tile_parallel = 2, .max_length = 512, .exchange = kAsync, .cluster_merge = 2};
      Call merge_launch = pair;
      merge_launch.cluster_merge = 1;
      EXPECT_EQ(run_gpu(p, merge_launch), walk) << "the cluster kernel, then the merge launch";
      EXPECT_EQ(run_gpu(p, pair), walk);
      EXPECT_EQ(run_gpu(p, pair), walk) << "second run";
      Call early = pair;
      early.stable_prefix = true;
      EXPECT_EQ(run_gpu(p, early), walk) << "stable prefix";
      Call automatic = pair;
      automatic.cluster_merge = 0;
      automatic.tile_parallel = 0;
      EXPECT_EQ(run_gpu(p, automatic), walk) << "chosen automatically";
    }
    // One split (clusters of (4, 1)): the queries of up to 256 slots.
    Problem one = p;
    std::vector<size_t> keep;
    for (size_t b = 0; b < p.lengths.size(); ++b)
      if (p.lengths[b] <= 256) keep.push_back(b);
    one.lengths.clear();
    one.q.clear();
    const size_t qn = size_t(sh.heads) * sh.width();
    for (const size_t b : keep) {
      one.lengths.push_back(p.lengths[b]);
      one.q.insert(one.q.end(), p.q.begin() + ptrdiff_t(b * qn), p.q.begin() + ptrdiff_t((b + 1) * qn));
    }
    one.rows.clear();
    for (const size_t b : keep) one.rows.push_back(p.rows.empty() ? int32_t(b) : p.rows[b]);
    const auto one_walk = run_gpu(one, {.queries_per_block = 1, .tile_parallel = 1});
    EXPECT_EQ(run_gpu(one, {.queries_per_block = 1, .tile_parallel = 2, .max_length = 256, .exchange = kAsync,
                            .cluster_merge = 2}),
              one_walk)
        << "one split";
    // Where it cannot run: three splits, or another exchange.
    EXPECT_THROW(run_gpu(p, {.tile_parallel = 2, .max_length = 513, .exchange = kAsync, .cluster_merge = 2}), Error);
    EXPECT_THROW(run_gpu(p, {.tile_parallel = 2, .max_length = 512, .exchange = 1, .cluster_merge = 2}), Error);
  }
  // Queries sharing cache rows, and 16 queries at once (16 clusters of 8 blocks).
  const Problem shared = make_problem(rng, {}, {300, 64, 257, 1, 512, 0, 40, 256}, {0, 0, 1, 1, 2, 2, 3, 3}, 512);
  EXPECT_EQ(run_gpu(shared, {.queries_per_block = 1, .tile_parallel = 2, .max_length = 512, .exchange = kAsync,
                             .cluster_merge = 2}),
            run_gpu(shared, {.queries_per_block = 1, .tile_parallel = 1}))
      << "cache rows shared";
  std::vector<int32_t> many(16);
  for (int b = 0; b < 16; ++b) many[size_t(b)] = int32_t(1 + (b * 97) % 512);
  const Problem wide = make_problem(rng, {}, many, {}, 512);
  EXPECT_EQ(run_gpu(wide, {.tile_parallel = 2, .max_length = 512, .exchange = kAsync, .cluster_merge = 2}),
            run_gpu(wide, {.tile_parallel = 1}))
      << "16 queries";
}

// mla_decode_with_value (session 32, ATLAS_MLA_MERGE_VALUE; written before its first GPU run):
// the attention, then the value GEMM over o_lat with the split merge inside its launch, gives
// o_lat and the GEMM's output bit for bit as mla_decode() then gemm(). Queries of one split
// (o_lat from the attention kernel), of 2-3 splits (merged in the GEMM's blocks) and of length 0
// (zeros), 1 and 5 rows (several rows of one 16-row tile), V2-Lite's heads and latent with the
// value width 128 (4 tiles per head: four blocks merge the same items) and 32 (one tile); launch
// overlap off and on. Where it does not apply it launches nothing and returns false.
TEST_F(Mla, DecodeWithValueEqualsTheTwoCalls) {
  std::mt19937 rng(test_seed());
  SCOPED_TRACE(::testing::Message() << "seed " << test_seed());
  const LaunchOverlap was = launch_overlap_mode();
  const Shape sh{};
  for (const auto& lengths : {std::vector<int32_t>{700}, std::vector<int32_t>{300, 64, 0, 513, 256}}) {
    for (const int dv : {128, 32}) {
      SCOPED_TRACE(::testing::Message() << "rows " << lengths.size() << " dv " << dv);
      const Problem p = make_problem(rng, sh, lengths, {}, 720);
      const int Q = p.queries(), max_length = p.longest();
      DevBuf<uint16_t> dq(p.q), dc(p.cache), dw(random_bf16(size_t(sh.heads) * dv * sh.latent, rng, 0.05f));
      DevBuf<int32_t> dl(p.lengths);
      DevBuf<float> ws(mla_decode_workspace_floats(Q, sh.heads, max_length, 256));
      const auto attention = [&](DevBuf<uint16_t>& olat) {
        return MlaDecodeArgs{.q = dq.get(), .latent_cache = dc.get(),
                             .cache_row_stride = int64_t(p.capacity) * sh.width(), .lengths = dl.get(),
                             .max_length = max_length, .out = olat.get(), .latent = sh.latent, .rope = sh.rope,
                             .rows = Q, .heads = sh.heads, .scale = kScale, .workspace = ws.get(),
                             .queries_per_block = 1};
      };
      const auto value = [&](DevBuf<uint16_t>& olat, DevBuf<uint16_t>& out) {
        return GemmArgs{.x = olat.get(), .w = dw.get(), .out = out.get(), .M = Q, .N = dv, .K = sh.latent,
                        .x_stride = int64_t(sh.heads) * sh.latent, .out_stride = int64_t(sh.heads) * dv,
                        .batch = sh.heads, .x_batch_stride = sh.latent, .w_batch_stride = int64_t(dv) * sh.latent,
                        .out_batch_stride = dv};
      };
      const size_t n_olat = size_t(Q) * sh.heads * sh.latent, n_out = size_t(Q) * sh.heads * dv;
      DevBuf<uint16_t> olat_a(std::vector<uint16_t>(n_olat, 0x1234)), out_a(std::vector<uint16_t>(n_out, 0x1234));
      mla_decode(attention(olat_a));
      gemm(value(olat_a, out_a));
      check_device_errors();
      const auto want_olat = olat_a.download(), want_out = out_a.download();
      for (auto mode : {LaunchOverlap::off, LaunchOverlap::on}) {
        SCOPED_TRACE(::testing::Message() << "overlap " << int(mode));
        set_launch_overlap(mode);
        DevBuf<uint16_t> olat(std::vector<uint16_t>(n_olat, 0x1234)), out(std::vector<uint16_t>(n_out, 0x1234));
        const int64_t before = mla_merge_value_launches();
        ASSERT_TRUE(mla_decode_with_value(attention(olat), value(olat, out)));
        check_device_errors();
        EXPECT_EQ(mla_merge_value_launches(), before + 1);
        EXPECT_EQ(olat.download(), want_olat) << "o_lat";
        EXPECT_EQ(out.download(), want_out) << "the value GEMM's output";
      }
      set_launch_overlap(was);
      // Nothing launched where it does not apply.
      DevBuf<uint16_t> olat(std::vector<uint16_t>(n_olat, 0x1234)), out(std::vector<uint16_t>(n_out, 0x1234));
      const int64_t before = mla_merge_value_launches();
      MlaDecodeArgs scalar = attention(olat);
      scalar.impl = MlaImpl::scalar;
      EXPECT_FALSE(mla_decode_with_value(scalar, value(olat, out))) << "the scalar attention";
      DevBuf<uint16_t> other(n_olat);
      EXPECT_FALSE(mla_decode_with_value(attention(olat), value(other, out))) << "x is not o_lat";
      gemm_force_config(0);
      EXPECT_FALSE(mla_decode_with_value(attention(olat), value(olat, out))) << "a forced config";
      gemm_force_config(-1);
      EXPECT_EQ(mla_merge_value_launches(), before);
      EXPECT_EQ(olat.download(), std::vector<uint16_t>(n_olat, 0x1234)) << "a call that launched nothing wrote o_lat";
    }
  }
}

TEST_F(Mla, BadLengthIsReported) {
  std::mt19937 rng(test_seed());
  for (MlaImpl impl : {MlaImpl::tensor_core, MlaImpl::scalar}) {
    for (int32_t bad : {5, -1}) {
      Problem p = make_problem(rng, {}, {4}, {}, 4);
      p.lengths = {bad};
      EXPECT_THROW(run_gpu(p, {.impl = impl, .max_length = 4}), Error);
      check_device_errors();  // the flag was cleared by the throw
      if (impl == MlaImpl::tensor_core && mla_tile_parallel_available()) {
        EXPECT_THROW(run_gpu(p, {.tile_parallel = 2, .max_length = 4}), Error) << "tile-parallel kernel";
        check_device_errors();
      }
    }
  }
}

// Argument errors are caught on the host, before any device work (no GPU needed).
TEST(MlaArguments, BadSettingsNameTheirField) {
  uint16_t h[8] = {};
  int32_t len[1] = {1};
  float ws[1] = {};
  const MlaDecodeArgs base{.q = h, .latent_cache = h, .cache_row_stride = 8, .lengths = len, .max_length = 1,
                           .out = h, .latent = 4, .rope = 4, .rows = 1, .heads = 1, .scale = 1.0f, .workspace = ws};
  auto message = [](const MlaDecodeArgs& a) -> std::string {
    try {
      mla_decode(a);
    } catch (const Error& e) {
      return e.what();
    }
    return "no error";
  };
  MlaDecodeArgs a = base;
  a.queries_per_block = 3;
  EXPECT_NE(message(a).find("queries_per_block"), std::string::npos) << message(a);
  a = base;
  a.queries_per_block = 4;
  a.tile_buffers = 2;
  EXPECT_NE(message(a).find("tile_buffers"), std::string::npos) << message(a);
  a = base;
  a.impl = MlaImpl::scalar;
  a.split_tokens = 300;
  EXPECT_NE(message(a).find("split_tokens"), std::string::npos) << message(a);
  a = base;
  a.tile_buffers = 3;
  EXPECT_NE(message(a).find("tile_buffers"), std::string::npos) << message(a);
  a = base;
  a.tile_parallel = 3;
  EXPECT_NE(message(a).find("tile_parallel"), std::string::npos) << message(a);
  a = base;
  a.tile_parallel = 2;
  a.split_tokens = 128;  // the cluster covers 4 tiles of 64: 256 only
  EXPECT_NE(message(a).find("tile_parallel"), std::string::npos) << message(a);
  a = base;
  a.heads = 17;
  EXPECT_NE(message(a).find("heads"), std::string::npos) << message(a);
}

}  // namespace
}  // namespace atlas::cuda::test
