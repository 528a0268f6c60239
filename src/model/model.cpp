#include "model/model.h"

#include <cmath>

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

void check_chain_input(const DecodeChainInput& in, const Cache& cache, int64_t vocab) {
  const int64_t B = in.batch, S = in.steps;
  if (B <= 0 || S <= 0) fail("decode_chain: empty batch or no steps");
  if (int64_t(in.first_ids.size()) != B) fail("decode_chain: first_ids must hold one id per row");
  if (int64_t(in.positions.size()) != S * B) fail("decode_chain: positions must hold steps x batch values");
  if (!in.sampling.empty() && int64_t(in.sampling.size()) != S * B)
    fail("decode_chain: sampling must hold steps x batch parameter sets, or none");
  if (cache.batch() != B) fail("decode_chain: kv cache batch size differs from the input's");
  if (cache.length() + S > cache.capacity())
    fail("kv cache: " + std::to_string(cache.length() + S) + " tokens exceed its capacity of " +
         std::to_string(cache.capacity()));
  for (int64_t b = 0; b < B; ++b) {
    const int32_t id = in.first_ids[size_t(b)];
    if (id < 0 || id >= vocab)
      fail("input ids", "row " + std::to_string(b), "token id " + std::to_string(id) +
                                                       " is outside the vocabulary (size " + std::to_string(vocab) + ")");
  }
}

std::vector<int32_t> Model::decode_chain(const DecodeChainInput& in, Cache& cache) const {
  check_chain_input(in, cache, config().vocab_size);
  const int64_t B = in.batch;
  std::vector<int32_t> ids(in.first_ids.begin(), in.first_ids.end()), out;
  out.reserve(size_t(in.steps * B));
  const std::vector<uint8_t> mask(size_t(B), 1), no_rows(size_t(B), 0);
  for (int64_t j = 0; j < in.steps; ++j) {
    const auto step = [&](auto span) { return span.empty() ? span : span.subspan(size_t(j * B), size_t(B)); };
    const ForwardOutput r = forward({.batch = B, .tokens = 1, .ids = ids, .positions = step(in.positions),
                                     .mask = mask, .logits_last_only = true, .logits_rows = no_rows,
                                     .attention = in.attention, .sampling = step(in.sampling)},
                                    cache);
    ids = r.greedy;
    out.insert(out.end(), ids.begin(), ids.end());
  }
  return out;
}

}  // namespace atlas
