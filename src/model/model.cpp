#include "model/model.h"

#include <algorithm>
#include <cmath>
#include <deque>

#include "core/error.h"

namespace atlas {

std::string compute_name(Compute c) { return c == Compute::F32 ? "f32" : "bf16"; }

Compute parse_compute(const std::string& s) {
  if (s == "f32") return Compute::F32;
  if (s == "bf16") return Compute::BF16;
  fail("--compute", {}, "unknown value \"" + s + "\" (expected f32 or bf16)");
}

std::vector<int32_t> greedy_rows(std::span<const float> logits, int64_t rows, int64_t vocab) {
  if (int64_t(logits.size()) < rows * vocab) fail("greedy_rows: logits shorter than rows x vocab");
  std::vector<int32_t> out(static_cast<size_t>(rows));
  for (int64_t r = 0; r < rows; ++r) {
    const float* x = logits.data() + r * vocab;
    int64_t best = 0;
    for (int64_t i = 0; i < vocab; ++i) {
      if (std::isnan(x[i])) fail("logits", "row " + std::to_string(r) + " token " + std::to_string(i), "NaN logit");
      if (x[i] > x[best]) best = i;  // strict: the first (lowest) id wins ties
    }
    out[size_t(r)] = int32_t(best);
  }
  return out;
}

void check_decode_start(const Cache& cache, std::span<const int32_t> first_ids, int64_t vocab) {
  const int64_t B = cache.batch();
  if (int64_t(first_ids.size()) != B)
    fail("decode run", "first_ids", "holds " + std::to_string(first_ids.size()) + " ids, the cache has " +
                                        std::to_string(B) + " rows");
  for (int64_t b = 0; b < B; ++b) {
    const int32_t id = first_ids[size_t(b)];
    if (id < 0 || id >= vocab)
      fail("input ids", "row " + std::to_string(b), "token id " + std::to_string(id) +
                                                       " is outside the vocabulary (size " + std::to_string(vocab) + ")");
  }
}

void check_decode_push(const Cache& cache, std::span<const int32_t> positions,
                       std::span<const sample_core::RowParams> sampling, int64_t pending) {
  const int64_t B = cache.batch();
  if (int64_t(positions.size()) != B)
    fail("decode run", "positions", "holds " + std::to_string(positions.size()) + " values, the cache has " +
                                        std::to_string(B) + " rows");
  if (!sampling.empty() && int64_t(sampling.size()) != B)
    fail("decode run", "sampling", "holds " + std::to_string(sampling.size()) + " parameter sets, need " +
                                       std::to_string(B) + " or none");
  if (pending >= DecodeRun::kMaxPending)
    fail("decode run", "push", std::to_string(pending) + " steps pushed and not popped (at most " +
                                   std::to_string(DecodeRun::kMaxPending) + ")");
  if (cache.length() + 1 > cache.capacity())
    fail("kv cache: " + std::to_string(cache.length() + 1) + " tokens exceed its capacity of " +
         std::to_string(cache.capacity()));
}

void check_step_positions(std::span<const int32_t> positions, int64_t batch, int64_t max_positions,
                          int64_t first_step) {
  for (size_t i = 0; i < positions.size(); ++i) {
    const int32_t p = positions[i];
    if (p < 0 || p >= max_positions)
      fail("input positions", "row " + std::to_string(int64_t(i) % batch) + " step " +
                                  std::to_string(first_step + int64_t(i) / batch),
           "position " + std::to_string(p) + " is outside [0, max_position_embeddings = " +
               std::to_string(max_positions) + ")");
  }
}

namespace {

// Model's run: each step a forward() call in push(), its tokens kept for pop().
class ForwardRun final : public DecodeRun {
 public:
  ForwardRun(const Model& m, Cache& c, std::span<const int32_t> first, AttentionForm a)
      : m_(m), c_(c), ids_(first.begin(), first.end()), attention_(a) {}
  void push(std::span<const int32_t> positions, std::span<const sample_core::RowParams> sampling) override {
    check_decode_push(c_, positions, sampling, pending());
    const int64_t B = c_.batch();
    const std::vector<uint8_t> mask(size_t(B), 1), no_rows(size_t(B), 0);
    const ForwardOutput r = m_.forward({.batch = B, .tokens = 1, .ids = ids_, .positions = positions, .mask = mask,
                                        .logits_last_only = true, .logits_rows = no_rows, .attention = attention_,
                                        .sampling = sampling},
                                       c_);
    ids_ = r.greedy;
    done_.push_back(r.greedy);
  }
  std::vector<int32_t> pop() override {
    if (done_.empty()) fail("decode run", "pop", "no pushed step left to pop");
    std::vector<int32_t> t = std::move(done_.front());
    done_.pop_front();
    return t;
  }
  int64_t pending() const override { return int64_t(done_.size()); }

 private:
  const Model& m_;
  Cache& c_;
  std::vector<int32_t> ids_;
  AttentionForm attention_;
  std::deque<std::vector<int32_t>> done_;
};

}  // namespace

std::unique_ptr<DecodeRun> Model::start_decode(Cache& cache, std::span<const int32_t> first_ids,
                                               AttentionForm attention) const {
  check_decode_start(cache, first_ids, config().vocab_size);
  if (!has_head()) fail("decode run: the model was loaded without its final layers (use all layers)");
  return std::make_unique<ForwardRun>(*this, cache, first_ids, attention);
}

std::vector<int32_t> Model::decode_chain(const DecodeChainInput& in, Cache& cache) const {
  const int64_t B = in.batch, S = in.steps;
  if (B != cache.batch()) fail("decode_chain: kv cache batch size differs from the input's");
  if (S <= 0) fail("decode_chain: no steps");
  if (int64_t(in.positions.size()) != S * B) fail("decode_chain: positions must hold steps x batch values");
  if (!in.sampling.empty() && int64_t(in.sampling.size()) != S * B)
    fail("decode_chain: sampling must hold steps x batch parameter sets, or none");
  if (cache.length() + S > cache.capacity())
    fail("kv cache: " + std::to_string(cache.length() + S) + " tokens exceed its capacity of " +
         std::to_string(cache.capacity()));
  // Every step's positions before the first runs (a push checks only its own): all or nothing.
  check_step_positions(in.positions, B, config().max_position_embeddings, 0);
  auto run = start_decode(cache, in.first_ids, in.attention);
  std::vector<int32_t> out;
  out.reserve(size_t(S * B));
  for (int64_t j0 = 0; j0 < S; j0 += DecodeRun::kMaxPending) {  // at most kMaxPending in flight
    const int64_t n = std::min(DecodeRun::kMaxPending, S - j0);
    for (int64_t j = j0; j < j0 + n; ++j)
      run->push(in.positions.subspan(size_t(j * B), size_t(B)),
                in.sampling.empty() ? in.sampling : in.sampling.subspan(size_t(j * B), size_t(B)));
    for (int64_t j = 0; j < n; ++j) {
      const std::vector<int32_t> t = run->pop();
      out.insert(out.end(), t.begin(), t.end());
    }
  }
  return out;
}

}  // namespace atlas
