// Decoding contracts over one float32 logits row: greedy, seeded sampling (Philox) and
// common-random-number (CRN) sampling. Pure functions of (logits, parameters, step), so a row
// draws the same token alone or in any batch, on any thread count. docs/decoding.md holds
// the full contract; the summary:
//
//   greedy   argmax of the raw logits, ties to the lower id; a NaN logit is an error.
//   warp     Hugging Face's warper order and conventions:
//              1. temperature  s = x / float32(T)                          (float32 division)
//              2. top-k (k>0)  keep s_i >= k-th largest s (duplicates counted), min 1 token
//              3. top-p (p<1)  order by (s ascending, id ascending); c_j = float32 of the exact
//                              cumulative probability; remove c_j <= float32(1 - p) (1 - p in
//                              double); the largest (last) token is always kept
//              4. softmax in float32 over the survivors; tokens whose probability is 0 are dropped
//   softmax  m = max s; e_i = exp_f32(s_i - m) (below); S = exact sum of the e_i rounded once to
//            double; p_i = float32(double(e_i) / S)
//   draw     inverse CDF over the survivors in ascending token id: the first token whose float32
//            running sum C (float32 additions in id order) satisfies u < C, compared in double;
//            if rounding leaves u >= C_total, the last survivor.
//   u        Seeded: philox_uniform({seed, stream, step, 0}) (rng.h); Crn: crn_uniform(tape
//            seed, row key, step). Both doubles in [0, 1) with 53 random bits.
//
// Example (one row of a batched decode loop):
//   RowSampler row({.mode = SamplingMode::Crn, .temperature = 0.3, .top_p = 0.95,
//                   .seed = tape, .crn_row_key = source_id});
//   record["rng_state_sha256"] = row.rng_state_sha256();   // before the first draw
//   int64_t tok = row.next(logits_row);                     // logits_row: [V] float32
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace atlas::decode {

enum class SamplingMode { Greedy, Seeded, Crn };
std::string_view mode_name(SamplingMode m);                  // "greedy" | "seeded" | "crn"
std::optional<SamplingMode> parse_mode(std::string_view s);

struct SamplingParams {
  SamplingMode mode = SamplingMode::Greedy;
  // Doubles, like the Python floats of transformers' GenerationConfig: 1 - top_p is formed in
  // double and only then rounded to float32 (float32(0.95) would move the threshold).
  double temperature = 1.0;  // > 0; unused by Greedy
  double top_p = 1.0;        // in [0, 1]; 1 = off
  int64_t top_k = 0;         // >= 0; 0 = off
  uint64_t seed = 0;         // Seeded: the Philox seed; Crn: the tape seed
  uint32_t stream = 0;       // Seeded: the row's identity in the Philox counter (not its batch slot)
  std::string crn_row_key{}; // Crn: the row's identity in the tape pre-image (e.g. the source id)
};

// Throws atlas::Error naming the offending field ("temperature", "top_p", "top_k", "crn_row_key").
void validate(const SamplingParams& p);

// argmax, ties to the lower id. Throws on an empty row or a NaN logit (torch.argmax would
// silently return the NaN's index; a NaN here means the forward pass is broken).
int64_t greedy_token(std::span<const float> logits);

// The distribution a sampling step draws from.
struct Distribution {
  std::vector<int64_t> ids;  // [n] survivors with probability > 0, ascending token id
  std::vector<float> probs;  // [n] their float32 probabilities (softmax over the survivors)
};

// exp(x) rounded to float32, for x <= 0, computed with IEEE double additions and multiplications
// only (no libm), so it gives the same bits on every IEEE-754 machine; it is the correctly
// rounded value except within ~1e-16 (relative) of a float32 rounding midpoint.
float exp_f32(float x);

// Temperature, top-k, top-p and softmax as above (mode, seed and row key are ignored).
// Throws on an empty row, a NaN or +inf logit, an overflow to +inf after temperature, or a row
// with no finite logit.
Distribution warp(std::span<const float> logits, const SamplingParams& p);

// The inverse-CDF draw above; u must lie in [0, 1).
int64_t inverse_cdf(const Distribution& d, double u);

// One row of a batched decode: holds the row's parameters and its step counter. next() takes
// the logits the model produced for this row's next position and returns the token; the step
// advances only on this row's own calls, so rows finish independently.
class RowSampler {
 public:
  explicit RowSampler(SamplingParams params);  // validates

  int64_t next(std::span<const float> logits);  // logits: [V] float32

  // The draw of this step was made elsewhere from uniform_at(step()) (device sampling,
  // sample_core.h: the same token next() would return): advance the step counter.
  void advance() { ++step_; }

  uint64_t step() const { return step_; }  // draws made so far
  // The uniform this row uses (or used) at `step`; throws for Greedy.
  double uniform_at(uint64_t step) const;
  // SHA-256 of the generator state before the row's first draw (rng.h documents the
  // pre-images); empty for Greedy, which draws nothing (write JSON null).
  const std::string& rng_state_sha256() const { return state_sha256_; }
  const SamplingParams& params() const { return params_; }

 private:
  SamplingParams params_;
  uint64_t step_ = 0;
  std::string state_sha256_;
};

}  // namespace atlas::decode
