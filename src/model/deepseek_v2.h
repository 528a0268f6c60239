// DeepSeek-V2 forward pass on the CPU: embedding, decoder layers (MLA attention, dense
// SwiGLU MLP or MoE), final norm, lm_head. One loop over layers, read top to bottom like the
// paper; every intermediate the experiments need is a named hook point (model/hooks.h).
//
// Two compute modes:
//   f32   fp32 arithmetic on the stored weights: the reference.
//   bf16  the official model's rounding points (architecture spec, "Precision and casts"):
//         bf16 residual stream and linear outputs, RMSNorm rounding twice, bf16 RoPE tables,
//         bf16 attention scores/probabilities, fp32 router, fp32 expert combine.
#pragma once

#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "backend/cpu/ops.h"
#include "io/safetensors.h"
#include "model/config.h"
#include "model/hooks.h"
#include "model/kv_cache.h"
#include "model/model.h"

namespace atlas {

// Where weights come from: a name -> tensor lookup (a Checkpoint, or tensors built in memory).
using WeightSource = std::function<const TensorView&(const std::string& name)>;

class DeepSeekV2 final : public Model {
 public:
  DeepSeekV2(const ModelConfig& config, const LayerRange& layers, const WeightSource& weights, Compute compute);

  const ModelConfig& config() const override { return cfg_; }
  const LayerRange& layers() const override { return layers_; }
  Compute compute() const override { return compute_; }
  bool has_head() const override { return has_head_; }
  std::string backend() const override { return "cpu"; }

  std::unique_ptr<Cache> make_cache(int64_t batch, int64_t capacity) const override;
  ForwardOutput forward(const ForwardInput& in, Cache& cache, const Hooks* hooks = nullptr) const override;
  using Model::forward;
  KVCache make_kv_cache(int64_t batch, int64_t capacity) const;
  ForwardOutput forward(const ForwardInput& in, KVCache& cache, const Hooks* hooks = nullptr) const;

 private:
  struct Mlp {  // SwiGLU: down(silu(gate x) * up x)
    cpu::Weight gate, up, down;  // [I,H], [I,H], [H,I]
  };
  struct Layer {
    std::vector<float> ln1, ln2;     // [H] input_layernorm, post_attention_layernorm
    cpu::Weight q;                   // [heads*(dn+dr), H]      (q_lora_rank null)
    cpu::Weight q_a, q_b;            // [q_lora, H], [heads*(dn+dr), q_lora]
    std::vector<float> q_a_ln;       // [q_lora]
    cpu::Weight kv_a;                // [dc+dr, H]  rows < dc: latent, rows >= dc: shared rope key
    std::vector<float> kv_a_ln;      // [dc]
    cpu::Weight kv_b;                // [heads*(dn+dv), dc]  per head: dn rows W_UK, then dv rows W_UV
    std::vector<float> kv_b_f32;     // kv_b as float32, for the absorbed form (converted once)
    cpu::Weight o;                   // [H, heads*dv]
    bool moe = false;
    Mlp dense;                       // dense layers
    cpu::Weight router;              // [E, H]
    std::vector<Mlp> experts;        // E routed experts, width moe_intermediate_size
    bool has_shared = false;
    Mlp shared;                      // width moe_intermediate_size * n_shared_experts
  };

  void attention(const Layer& L, int64_t li, const LayerHookNames& names, const ForwardInput& in, KVCache& cache,
                 int64_t past, const std::vector<float>& x, std::vector<float>& out, const Hooks* hooks) const;
  // Softmax over one query's visible keys (scores in p[0..qpos], masked keys skipped), in place;
  // returns false when no key is visible.
  bool softmax_visible(const KVCache& cache, int64_t b, int64_t qpos, float* p) const;
  // Per-row attention over the cache: heads_out [T, nh*dv] for row b.
  void attend_expanded(const Layer& L, int64_t li, const KVCache& cache, int64_t b, int64_t T, int64_t past,
                       const float* q, float* heads_out, float* pattern) const;
  void attend_absorbed(const Layer& L, int64_t li, const KVCache& cache, int64_t b, int64_t T, int64_t past,
                       const float* q, float* heads_out, float* pattern) const;
  void moe(const Layer& L, const LayerHookNames& names, int64_t B, int64_t T, const std::vector<float>& x,
           std::vector<float>& out, const Hooks* hooks) const;
  void mlp(const Mlp& m, int64_t M, const float* x, float* out) const;
  void route(int64_t M, const float* logits, int32_t* ids, float* weights) const;

  ModelConfig cfg_;
  LayerRange layers_;
  Compute compute_;
  bool bf16_;
  bool has_head_ = false;
  cpu::Weight embed_;  // [V, H]
  std::vector<float> final_ln_;
  cpu::Weight lm_head_;  // [V, H]
  std::vector<Layer> blocks_;
  std::vector<float> inv_freq_;
  float rope_amp_;
  float scale_;
};

}  // namespace atlas
