// Per-token digests and stage hashes (model/digest.h) and the digest observers of Hooks.
// Known answers come from Python's hashlib over struct.pack('<3f', ...) (computed outside atlas):
//   python3 -c "import hashlib,struct; ..."  (the commands are in the comments below).
#include <gtest/gtest.h>
#include <omp.h>

#include <cstring>
#include <map>
#include <random>

#include "core/error.h"
#include "core/sha256.h"
#include "model/deepseek_v2.h"
#include "model/digest.h"
#include "model/hooks.h"
#include "tiny_model.h"

using namespace atlas;

namespace {

std::string hex(const uint8_t* d, size_t n) {
  static const char* k = "0123456789abcdef";
  std::string s;
  for (size_t i = 0; i < n; ++i) {
    s += k[d[i] >> 4];
    s += k[d[i] & 15];
  }
  return s;
}

std::vector<float> random_rows(int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, 3.0f);
  std::vector<float> v(static_cast<size_t>(n));
  for (auto& x : v) x = nd(rng);
  return v;
}

}  // namespace

// rows = [[1.0, -2.5, 0.0], [3e-5, 65504.0, -0.0]]
// d = [hashlib.sha256(struct.pack('<3f', *r)).digest() for r in rows]; hashlib.sha256(b''.join(d))
TEST(Digest, KnownAnswerFromPythonHashlib) {
  const std::vector<float> x = {1.0f, -2.5f, 0.0f, 3.0e-5f, 65504.0f, -0.0f};
  const std::vector<uint8_t> d = token_digests(x.data(), 2, 3);
  ASSERT_EQ(d.size(), 64u);
  EXPECT_EQ(hex(d.data(), 32), "738e86d615200bd3391d7ae379779a8e4644bade56d93d0634aa07004fa697f3");
  EXPECT_EQ(hex(d.data() + 32, 32), "21fbd5cf95d8595c79c6710c466d0035bd3e157cba0c64b28e956bc594da412c");
  EXPECT_EQ(digest_chain_hex(d), "00a8e2f78e7dca596aa117bbc39a673bdce27940430b042651547f83aa0b7698");
  EXPECT_EQ(stage_sha256(x.data(), 2, 3), "00a8e2f78e7dca596aa117bbc39a673bdce27940430b042651547f83aa0b7698");
  // A sub-range needs only its digests: hashlib.sha256(d[1]).
  EXPECT_EQ(digest_chain_hex(std::span<const uint8_t>(d).subspan(32)),
            "f42f333289f8757801b96ed901ec9baed07cbc5cc7c7a19718fea700c8a38ade");
  // The empty range: SHA-256 of the empty string.
  EXPECT_EQ(digest_chain_hex({}), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
}

TEST(Digest, EachTokenIsTheSha256OfItsRowAndThreadsChangeNothing) {
  const int64_t T = 301, H = 67;
  const std::vector<float> x = random_rows(T * H, 11);
  const int saved = omp_get_max_threads();
  omp_set_num_threads(1);
  const std::vector<uint8_t> one = token_digests(x.data(), T, H);
  omp_set_num_threads(4);
  const std::vector<uint8_t> four = token_digests(x.data(), T, H);
  omp_set_num_threads(saved);
  EXPECT_EQ(one, four);
  for (int64_t t : {int64_t(0), int64_t(150), T - 1}) {
    const auto want = Sha256().update(x.data() + t * H, size_t(H) * 4).digest();
    EXPECT_EQ(0, std::memcmp(one.data() + t * 32, want.data(), 32)) << "token " << t;
  }
}

TEST(Digest, ChainRejectsAPartialDigest) {
  const std::vector<uint8_t> d(33, 0);
  EXPECT_THROW(digest_chain_hex(d), Error);
}

TEST(Hooks, DigestSubscriptionsAreCheckedAgainstTheCatalog) {
  Hooks h;
  auto noop = [](const HookDigests&) {};
  EXPECT_NO_THROW(h.add_digests("embed", noop));
  EXPECT_NO_THROW(h.add_digests("blocks.*.hook_resid_post", noop));
  EXPECT_NO_THROW(h.add_digests("blocks.12.attn.hook_q", noop));
  EXPECT_NO_THROW(h.add_digests("logits", noop));
  for (const char* bad : {"blocks.3.moe.hook_topk_ids", "blocks.*.moe.hook_topk_ids", "blocks.0.attn.hook_pattern",
                          "*", "blocks.*"}) {
    try {
      h.add_digests(bad, noop);
      ADD_FAILURE() << bad << " was accepted";
    } catch (const Error& e) {
      const std::string m = e.what();
      EXPECT_TRUE(m.find("hook blocks.{L}.moe.hook_topk_ids") != std::string::npos ||
                  m.find("hook blocks.{L}.attn.hook_pattern") != std::string::npos)
          << bad << ": " << m;
    }
  }
  EXPECT_TRUE(h.wants_digests("blocks.5.hook_resid_post"));
  EXPECT_FALSE(h.wants_tensor("blocks.5.hook_resid_post"));
  EXPECT_TRUE(h.wants("blocks.5.hook_resid_post"));
  EXPECT_FALSE(h.wants("blocks.5.hook_resid_mid"));
}

TEST(Hooks, FireDigestsTheTensorAfterTheTensorObservers) {
  const int64_t B = 2, T = 3, H = 5;
  std::vector<float> x = random_rows(B * T * H, 3);
  Hooks h;
  std::vector<std::string> order;
  h.add_digests("custom.*", [&](const HookDigests& d) {
    order.push_back("digests");
    EXPECT_EQ(d.name, "custom.hidden");
    EXPECT_EQ(d.layer, 4);
    EXPECT_EQ(d.rows, B);
    EXPECT_EQ(d.tokens, T);
    // Digests of what the tensor observer left: row 1 token 2 was overwritten.
    for (int64_t b = 0; b < B; ++b)
      for (int64_t t = 0; t < T; ++t) {
        const auto want = Sha256().update(x.data() + (b * T + t) * H, size_t(H) * 4).digest();
        EXPECT_EQ(0, std::memcmp(d.sha256 + (b * T + t) * 32, want.data(), 32)) << b << "," << t;
      }
    EXPECT_EQ(digest_chain_hex(d.row(1, 1, 3)), stage_sha256(x.data() + (T + 1) * H, 2, H));
    EXPECT_THROW(d.row(2, 0, 1), Error);
    EXPECT_THROW(d.row(0, 2, 4), Error);
  });
  // Added first, still called after the tensor observer, and sees what it wrote.
  h.add_reader("custom.hidden", [&](const HookTensor& t) {
    order.push_back("reader");
    EXPECT_EQ(t.f32()[(1 * T + 2) * H + 3], 3.0f);
  });
  h.add("custom.hidden", [&](HookTensor& t) {
    order.push_back("tensor");
    for (int64_t i = 0; i < H; ++i) t.f32()[(1 * T + 2) * H + i] = float(i);
  });
  EXPECT_TRUE(h.wants_tensor("custom.hidden") && h.wants_digests("custom.hidden") && h.wants_reader("custom.hidden"));
  HookTensor t{.name = "custom.hidden", .layer = 4, .dtype = DType::F32, .shape = {B, T, H}, .data = x.data()};
  h.fire(t);
  EXPECT_EQ(order, (std::vector<std::string>{"tensor", "reader", "digests"}));
  EXPECT_EQ(x[size_t((1 * T + 2) * H + 3)], 3.0f);

  // A hook outside the catalog is checked by what it holds: I32 values have no digests.
  std::vector<int32_t> ids(6);
  HookTensor bad{.name = "custom.ids", .layer = -1, .dtype = DType::I32, .shape = {1, 2, 3}, .data = ids.data()};
  try {
    h.fire(bad);
    ADD_FAILURE() << "digests of an I32 hook";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("hook custom.ids"), std::string::npos) << e.what();
  }
}

// Readers: wanted like the other kinds; fire_read (a backend's late delivery) calls the readers
// and the digest observers of the hook, never its tensor observers.
TEST(Hooks, FireReadCallsReadersThenDigestsButNoTensorObserver) {
  const int64_t B = 1, T = 2, H = 3;
  std::vector<float> x = random_rows(B * T * H, 5);
  Hooks h;
  EXPECT_TRUE(h.empty());
  std::vector<std::string> order;
  h.add_reader("blocks.*.hook_resid_post", [&](const HookTensor& t) {
    order.push_back("reader " + std::string(t.name));
    EXPECT_EQ(t.f32(), x.data());
  });
  EXPECT_FALSE(h.empty());
  EXPECT_TRUE(h.wants("blocks.2.hook_resid_post"));
  EXPECT_TRUE(h.wants_reader("blocks.2.hook_resid_post"));
  EXPECT_FALSE(h.wants_tensor("blocks.2.hook_resid_post"));
  EXPECT_FALSE(h.wants("blocks.2.hook_resid_mid"));
  h.add("blocks.2.hook_resid_post", [&](HookTensor&) { order.push_back("tensor"); });
  h.add_digests("blocks.2.hook_resid_post", [&](const HookDigests& d) {
    order.push_back("digests");
    EXPECT_EQ(digest_chain_hex(d.row(0, 0, T)), stage_sha256(x.data(), T, H));
  });
  const HookTensor t{.name = "blocks.2.hook_resid_post", .layer = 2, .dtype = DType::F32, .shape = {B, T, H},
                     .data = x.data()};
  h.fire_read(t);
  EXPECT_EQ(order, (std::vector<std::string>{"reader blocks.2.hook_resid_post", "digests"}));
}

// The CPU forward pass: digest observers see the digests of exactly the tensor a tensor
// observer sees, at every hidden stage, and a forward with only digest observers gives the
// same digests (and the same logits) as one with both kinds.
TEST(Hooks, CpuForwardDigestsEqualTheTensorsDigests) {
  ModelConfig cfg = ModelConfig::from_json(test_support::tiny_config_json(), "tiny");
  test_support::TinyWeights weights{cfg};
  DeepSeekV2 model(cfg, LayerRange::all(cfg), weights.source(), Compute::BF16);
  const std::vector<int32_t> ids = {1, 5, 9, 2, 7, 3, 4, 4, 60, 61};
  std::vector<int32_t> pos(ids.size());
  for (size_t i = 0; i < pos.size(); ++i) pos[i] = int32_t(i % 5);
  const std::vector<uint8_t> mask(ids.size(), 1);
  const ForwardInput in{.batch = 2, .tokens = 5, .ids = ids, .positions = pos, .mask = mask, .logits_rows = {}};
  const std::vector<std::string> names = {"embed", "blocks.0.hook_resid_post", "blocks.2.attn.hook_q", "final_norm"};
  std::map<std::string, std::vector<uint8_t>> from_tensor, both, only;
  Hooks h1, h2;
  for (const auto& n : names) {
    h1.add(n, [&, n](HookTensor& t) {
      const int64_t M = t.shape[0] * t.shape[1];
      from_tensor[n] = token_digests(t.f32(), M, t.numel() / M);
    });
    h1.add_digests(n, [&, n](const HookDigests& d) { both[n].assign(d.sha256, d.sha256 + d.rows * d.tokens * 32); });
    h2.add_digests(n, [&, n](const HookDigests& d) { only[n].assign(d.sha256, d.sha256 + d.rows * d.tokens * 32); });
  }
  const auto a = model.forward(in, &h1);
  const auto b = model.forward(in, &h2);
  EXPECT_EQ(a.logits, b.logits);
  ASSERT_EQ(from_tensor.size(), names.size());
  for (const auto& n : names) {
    EXPECT_EQ(from_tensor[n].size(), size_t(10 * 32)) << n;
    EXPECT_EQ(both[n], from_tensor[n]) << n;
    EXPECT_EQ(only[n], from_tensor[n]) << n;
  }
}
