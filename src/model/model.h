// The backend-neutral model interface: what generation, traces and probes call. The CPU
// implementation is DeepSeekV2 (model/deepseek_v2.h); the CUDA one lives in backend/cuda.
// Both expose the same hook points and the same ForwardInput contract.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "decode/sample_core.h"
#include "model/config.h"
#include "model/hooks.h"

namespace atlas {

enum class Compute { F32, BF16 };
std::string compute_name(Compute c);
Compute parse_compute(const std::string& s);  // "f32" | "bf16", else atlas::Error naming --compute

// How attention reads the latent cache. Both are exact rewrites of the same math; they
// differ in rounding (reduction order), not in meaning.
//   Expanded  k_nope, v = kv_b(c) for every cached token, then per-head attention
//             (the official code's form; the reference for prefill and traces).
//   Absorbed  W_UK folded into the query, attention over the 576-wide latent itself
//             (MQA with one KV head), W_UV applied after: cheap per decode step.
enum class AttentionForm { Expanded, Absorbed };

// One forward call: B rows of T new tokens each, appended after whatever the cache holds.
struct ForwardInput {
  int64_t batch = 1;                   // B
  int64_t tokens = 0;                  // T
  std::span<const int32_t> ids;        // [B, T]; padding slots may hold any valid id
  std::span<const int32_t> positions;  // [B, T]: RoPE position of each token
  std::span<const uint8_t> mask;       // [B, T]: 1 = real token, 0 = padding (never attended to)
  bool logits_last_only = false;       // compute logits for the last token of each row only
  // With logits_last_only: the rows whose logits the caller will read ([B], 1 = read); empty =
  // every row. A backend may leave the other rows of ForwardOutput::logits zero (the CUDA
  // backend then copies only these rows off the device; greedy rows need just their token,
  // ForwardOutput::greedy). A wanted "logits" hook always gets every row.
  std::span<const uint8_t> logits_rows;
  AttentionForm attention = AttentionForm::Expanded;
  // Sampling where the logits are (Model::supports_device_sampling(); needs logits_last_only):
  // [B] per-row parameters or empty. A row in sample_core::kSample mode gets the token that
  // decode::RowSampler would draw from its logits with uniform `u` (bit-identical, the
  // contract of docs/decoding.md) in ForwardOutput::greedy; kGreedy rows keep their argmax.
  // Such a row's logits need not come to the host at all (leave it out of logits_rows).
  std::span<const sample_core::RowParams> sampling;
};

struct ForwardOutput {
  std::vector<float> logits;  // [B, T, V], or [B, V] with logits_last_only; empty if lm_head not loaded
  // With logits_last_only and lm_head loaded: each row's argmax over its logits (ties to the
  // lower id, after any "logits" hook wrote them), the greedy token. Same contract as
  // decode::greedy_token; a NaN logit is an error. Rows sampled on the device
  // (ForwardInput::sampling) hold their drawn token instead; bad logits are an error there too.
  std::vector<int32_t> greedy;  // [B]
};

// Decode steps that feed themselves, enqueued ahead of the caller (Model::start_decode): the
// run's first step gives each row first_ids[b], every later step the token the step before
// produced for it (its greedy argmax, or its drawn token where that step's sampling samples).
// Every token is a real one (mask 1). Each pushed step runs and is appended to the cache,
// whether or not its tokens are popped. The tokens are the bits of one forward() call per step
// (tokens = 1, logits_last_only, no logits rows, each fed the previous call's
// ForwardOutput::greedy); a backend may run pushed steps while the caller works on earlier
// steps' tokens (the CUDA one: graph replays fed on the device, no host round trip between
// steps), Model's own runs each step in push(). While a run lives, its cache takes no other
// forward() call or run (the CUDA backend refuses them: the run feeds its own last tokens).
class DecodeRun {
 public:
  static constexpr int64_t kMaxPending = 64;  // steps pushed and not yet popped, at most
  virtual ~DecodeRun() = default;  // waits for the pushed steps; tokens not popped are dropped
  // Enqueues the next step: positions [B] (each row's RoPE position), sampling [B] per-row
  // parameters (ForwardInput::sampling's meaning; needs Model::supports_device_sampling() where a
  // row samples) or empty (all greedy).
  virtual void push(std::span<const int32_t> positions, std::span<const sample_core::RowParams> sampling = {}) = 0;
  // The tokens [B] of the oldest pushed step not yet popped (waits for it). A drawn token that
  // is an error (negative, ForwardOutput::greedy's convention) is an error here.
  virtual std::vector<int32_t> pop() = 0;
  virtual int64_t pending() const = 0;
};

// S steps of one run (Model::decode_chain): push them all, pop them all.
struct DecodeChainInput {
  int64_t batch = 1;                   // B
  int64_t steps = 0;                   // S
  std::span<const int32_t> first_ids;  // [B]
  std::span<const int32_t> positions;  // [S, B]: RoPE position of row b's token at step j
  AttentionForm attention = AttentionForm::Absorbed;
  // [S, B] per-row parameters of each step, or empty: all greedy.
  std::span<const sample_core::RowParams> sampling;
};

// argmax of each of `rows` rows of `vocab` logits, ties to the lower id; throws on a NaN.
std::vector<int32_t> greedy_rows(std::span<const float> logits, int64_t rows, int64_t vocab);

// A backend's KV cache (opaque to callers; created by Model::make_cache).
class Cache {
 public:
  virtual ~Cache() = default;
  virtual int64_t batch() const = 0;
  virtual int64_t capacity() const = 0;
  virtual int64_t length() const = 0;  // tokens stored so far
};

// The checks every backend's start_decode / DecodeRun::push make (one error naming the field).
void check_decode_start(const Cache& cache, std::span<const int32_t> first_ids, int64_t vocab);
void check_decode_push(const Cache& cache, std::span<const int32_t> positions,
                       std::span<const sample_core::RowParams> sampling, int64_t pending);
// Every position of `positions` ([steps, batch], row-major) in [0, max_positions); the error names
// the row and the step (counted from first_step).
void check_step_positions(std::span<const int32_t> positions, int64_t batch, int64_t max_positions,
                          int64_t first_step);

class Model {
 public:
  virtual ~Model() = default;
  virtual const ModelConfig& config() const = 0;
  virtual const LayerRange& layers() const = 0;
  virtual Compute compute() const = 0;
  virtual bool has_head() const = 0;  // final norm + lm_head loaded (full layer range)
  virtual std::string backend() const = 0;  // "cpu" | "cuda"
  // Whether forward() honours ForwardInput::sampling (others reject a non-empty one).
  virtual bool supports_device_sampling() const { return false; }

  virtual std::unique_ptr<Cache> make_cache(int64_t batch, int64_t capacity) const = 0;
  // Runs the batch through the loaded layers, appending its latents to the cache.
  virtual ForwardOutput forward(const ForwardInput& in, Cache& cache, const Hooks* hooks = nullptr) const = 0;
  // A run of decode steps appended to the cache (DecodeRun), its first step fed first_ids [B].
  // This implementation runs each step as a forward() call inside push().
  virtual std::unique_ptr<DecodeRun> start_decode(Cache& cache, std::span<const int32_t> first_ids,
                                                  AttentionForm attention = AttentionForm::Absorbed) const;
  // S steps of one run: [S, B] tokens.
  std::vector<int32_t> decode_chain(const DecodeChainInput& in, Cache& cache) const;
  // Convenience: a fresh cache sized for this call alone.
  ForwardOutput forward(const ForwardInput& in, const Hooks* hooks = nullptr) const {
    auto cache = make_cache(in.batch, in.tokens);
    return forward(in, *cache, hooks);
  }
};

}  // namespace atlas
