// plan_padding (host code, no GPU): which rows of a prefill the CUDA forward pass computes when
// padding runs once, and which computed row every row is a copy of.
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "backend/cuda/pad_plan.h"
#include "core/error.h"

namespace atlas::cuda::test {
namespace {

struct Rows {
  std::vector<int32_t> ids, pos, visible, row;
  std::vector<uint8_t> mask;
  void add(bool real, int32_t id, int32_t p, int32_t v, int32_t r) {
    ids.push_back(id);
    pos.push_back(p);
    visible.push_back(v);
    row.push_back(r);
    mask.push_back(real ? 1 : 0);
  }
  PadPlan plan() const { return plan_padding(ids, pos, visible, row, mask); }
};

// Every computed row is taken from a row with its own key, every real row is its own computed
// row, and computed rows keep the flat order.
void expect_consistent(const Rows& x, const PadPlan& p) {
  ASSERT_EQ(p.src_of.size(), x.mask.size());
    for (size_t r = 1; r < p.first.size(); ++r) EXPECT_LT(p.first[r - 1], p.first[r]) << "ascending";
  for (size_t m = 0; m < x.mask.size(); ++m) {
    const int32_t r = p.src_of[m];
    ASSERT_GE(r, 0);
    ASSERT_LT(r, p.rows());
    const size_t f = size_t(p.first[size_t(r)]);
    EXPECT_LE(f, m) << "a copy of an earlier (or the same) row";
    if (x.mask[m]) {
      EXPECT_EQ(f, m) << "real row " << m << " is computed";
      continue;
    }
    EXPECT_EQ(x.mask[f], 0) << "padding copies padding";
    EXPECT_EQ(x.ids[f], x.ids[m]);
    EXPECT_EQ(x.pos[f], x.pos[m]);
    EXPECT_EQ(x.visible[f], x.visible[m]);
    if (x.visible[m] > 0) {
      EXPECT_EQ(x.row[f], x.row[m]) << "a padding token that sees keys: its own row's";
    }
  }
}

TEST(PadPlan, LeftPaddingRunsOnce) {
  // Three rows of 5: 2, 0 and 4 padding tokens (id 0, position 0, nothing visible), then real.
  Rows x;
  for (int32_t b = 0; b < 3; ++b) {
    const int pad = b == 0 ? 2 : b == 1 ? 0 : 4;
    for (int32_t t = 0; t < 5; ++t)
      x.add(t >= pad, t < pad ? 0 : 100 + t, t < pad ? 0 : t - pad, t < pad ? 0 : t - pad + 1, b);
  }
  const PadPlan p = x.plan();
  EXPECT_EQ(p.rows(), 15 - 6 + 1) << "every real token and one padding row";
  expect_consistent(x, p);
  EXPECT_EQ(p.src_of[0], p.src_of[1]);
  EXPECT_EQ(p.src_of[0], p.src_of[10]) << "padding of other rows too (nothing visible: the row does not matter)";
}

TEST(PadPlan, PaddingThatSeesKeysStaysInItsRow) {
  // Right padding: after 2 real tokens the padding sees them (visible 2); two rows, two ids.
  Rows x;
  for (int32_t b = 0; b < 2; ++b) {
    x.add(true, 7, 0, 1, b);
    x.add(true, 8, 1, 2, b);
    for (int32_t t = 0; t < 4; ++t) x.add(false, t % 2, 0, 2, b);
  }
  const PadPlan p = x.plan();
  EXPECT_EQ(p.rows(), 4 + 2 * 2) << "real tokens, then one padding row per (row, id)";
  expect_consistent(x, p);
  EXPECT_EQ(p.src_of[2], p.src_of[4]);
  EXPECT_NE(p.src_of[2], p.src_of[3]) << "other id";
  EXPECT_NE(p.src_of[2], p.src_of[8]) << "other row";
}

TEST(PadPlan, WithoutPaddingEveryRowIsItself) {
  Rows x;
  for (int32_t t = 0; t < 6; ++t) x.add(true, 3, t, t + 1, 0);  // equal ids, but real
  const PadPlan p = x.plan();
  EXPECT_EQ(p.rows(), 6);
  for (int32_t m = 0; m < 6; ++m) EXPECT_EQ(p.src_of[size_t(m)], m);
  expect_consistent(x, p);
  const PadPlan empty = plan_padding({}, {}, {}, {}, {});
  EXPECT_EQ(empty.rows(), 0);
}

TEST(PadPlan, MismatchedSpansNameTheField) {
  Rows x;
  x.add(false, 0, 0, 0, 0);
  x.add(true, 1, 0, 1, 0);
  std::vector<int32_t> short_pos = {0};
  try {
    plan_padding(x.ids, short_pos, x.visible, x.row, x.mask);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("positions"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace atlas::cuda::test
