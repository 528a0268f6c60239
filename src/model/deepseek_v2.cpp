#include "model/deepseek_v2.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>

#include "core/bf16.h"
#include "core/error.h"
#include "model/rope.h"

namespace atlas {
namespace {

cpu::Weight as_weight(const TensorView& t) {
  if (t.shape.size() != 2) fail(t.file, t.name, "expected a 2-D weight");
  return {.dtype = t.dtype, .data = t.data, .rows = t.shape[0], .cols = t.shape[1]};
}

std::vector<float> as_vector(const TensorView& t) { return to_f32(t); }

// Fires a hook over a contiguous buffer; shape is given explicitly.
void fire(const Hooks* hooks, const std::string& name, int64_t layer, std::vector<int64_t> shape, float* data) {
  if (!hooks || !hooks->wants(name)) return;
  HookTensor t{.name = name, .layer = layer, .dtype = DType::F32, .shape = std::move(shape), .data = data};
  hooks->fire(t);
}

void add_residual(std::vector<float>& x, const std::vector<float>& y, bool bf16) {
  for (size_t i = 0; i < x.size(); ++i) x[i] = bf16 ? round_bf16(x[i] + y[i]) : x[i] + y[i];
}

}  // namespace

DeepSeekV2::DeepSeekV2(const ModelConfig& config, const LayerRange& layers, const WeightSource& w, Compute compute)
    : cfg_(config), layers_(layers), compute_(compute), bf16_(compute == Compute::BF16) {
  embed_ = as_weight(w("model.embed_tokens.weight"));
  for (int64_t l = layers.first; l <= layers.last; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    Layer L;
    L.ln1 = as_vector(w(p + "input_layernorm.weight"));
    L.ln2 = as_vector(w(p + "post_attention_layernorm.weight"));
    if (cfg_.q_lora_rank) {
      L.q_a = as_weight(w(p + "self_attn.q_a_proj.weight"));
      L.q_a_ln = as_vector(w(p + "self_attn.q_a_layernorm.weight"));
      L.q_b = as_weight(w(p + "self_attn.q_b_proj.weight"));
    } else {
      L.q = as_weight(w(p + "self_attn.q_proj.weight"));
    }
    L.kv_a = as_weight(w(p + "self_attn.kv_a_proj_with_mqa.weight"));
    L.kv_a_ln = as_vector(w(p + "self_attn.kv_a_layernorm.weight"));
    L.kv_b = as_weight(w(p + "self_attn.kv_b_proj.weight"));
    L.kv_b_f32.resize(size_t(L.kv_b.rows * L.kv_b.cols));
    for (int64_t r = 0; r < L.kv_b.rows; ++r) cpu::weight_row(L.kv_b, r, L.kv_b_f32.data() + r * L.kv_b.cols);
    L.o = as_weight(w(p + "self_attn.o_proj.weight"));
    auto load_mlp = [&](const std::string& q) {
      return Mlp{.gate = as_weight(w(q + "gate_proj.weight")),
                 .up = as_weight(w(q + "up_proj.weight")),
                 .down = as_weight(w(q + "down_proj.weight"))};
    };
    L.moe = cfg_.is_moe_layer(l);
    if (L.moe) {
      L.router = as_weight(w(p + "mlp.gate.weight"));
      for (int64_t e = 0; e < cfg_.n_routed_experts; ++e)
        L.experts.push_back(load_mlp(p + "mlp.experts." + std::to_string(e) + "."));
      L.has_shared = cfg_.n_shared_experts > 0;
      if (L.has_shared) L.shared = load_mlp(p + "mlp.shared_experts.");
    } else {
      L.dense = load_mlp(p + "mlp.");
    }
    blocks_.push_back(std::move(L));
  }
  has_head_ = layers.last == cfg_.num_hidden_layers - 1;
  if (has_head_) {
    final_ln_ = as_vector(w("model.norm.weight"));
    lm_head_ = cfg_.tie_word_embeddings ? embed_ : as_weight(w("lm_head.weight"));
  }
  inv_freq_ = rope_inv_freq(cfg_);
  rope_amp_ = float(cfg_.rope_amplitude());
  scale_ = float(cfg_.softmax_scale());
}

KVCache DeepSeekV2::make_kv_cache(int64_t batch, int64_t capacity) const {
  return KVCache(cfg_, layers_.count(), batch, capacity);
}

std::unique_ptr<Cache> DeepSeekV2::make_cache(int64_t batch, int64_t capacity) const {
  return std::make_unique<KVCache>(cfg_, layers_.count(), batch, capacity);
}

ForwardOutput DeepSeekV2::forward(const ForwardInput& in, Cache& cache, const Hooks* hooks) const {
  auto* kv = dynamic_cast<KVCache*>(&cache);
  if (!kv) fail("forward: the cache was not made by the CPU backend");
  return forward(in, *kv, hooks);
}

ForwardOutput DeepSeekV2::forward(const ForwardInput& in, KVCache& cache, const Hooks* hooks) const {
  const int64_t B = in.batch, T = in.tokens, M = B * T, H = cfg_.hidden_size, V = cfg_.vocab_size;
  if (B <= 0 || T <= 0) fail("forward: empty batch");
  if (!in.sampling.empty())  // generate() samples on the host for this backend
    fail("forward: the cpu backend does not sample in forward() (ForwardInput::sampling must be empty)");
  if (int64_t(in.ids.size()) != M || int64_t(in.positions.size()) != M || int64_t(in.mask.size()) != M)
    fail("forward: ids, positions and mask must each hold batch x tokens values");
  if (cache.batch() != B) fail("forward: kv cache batch size differs from the input's");
  const int64_t past = cache.append(T, in.mask.data());

  // Embedding lookup: x [M, H], the residual stream (bf16 values in bf16 mode, as stored).
  std::vector<float> x(static_cast<size_t>(M * H)), h(static_cast<size_t>(M * H)), y(static_cast<size_t>(M * H));
  for (int64_t m = 0; m < M; ++m) {
    const int32_t id = in.ids[m];
    if (id < 0 || id >= V)
      fail("input ids", "row " + std::to_string(m / T) + " token " + std::to_string(m % T),
           "token id " + std::to_string(id) + " is outside the vocabulary (size " + std::to_string(V) + ")");
    cpu::weight_row(embed_, id, x.data() + m * H);
  }
  fire(hooks, "embed", -1, {B, T, H}, x.data());

  for (int64_t li = 0; li < int64_t(blocks_.size()); ++li) {
    const Layer& L = blocks_[li];
    const int64_t l = layers_.first + li;
    const LayerHookNames names(l);
    // h = input_layernorm(x); x = x + attention(h)
    cpu::rmsnorm(x.data(), M, H, L.ln1.data(), cfg_.rms_norm_eps, bf16_, h.data());
    fire(hooks, names.ln1, l, {B, T, H}, h.data());
    attention(L, li, names, in, cache, past, h, y, hooks);
    fire(hooks, names.attn_out, l, {B, T, H}, y.data());
    add_residual(x, y, bf16_);
    fire(hooks, names.resid_mid, l, {B, T, H}, x.data());
    // h = post_attention_layernorm(x); x = x + mlp_or_moe(h)
    cpu::rmsnorm(x.data(), M, H, L.ln2.data(), cfg_.rms_norm_eps, bf16_, h.data());
    fire(hooks, names.ln2, l, {B, T, H}, h.data());
    if (L.moe)
      moe(L, names, B, T, h, y, hooks);
    else
      mlp(L.dense, M, h.data(), y.data());
    fire(hooks, names.mlp_out, l, {B, T, H}, y.data());
    add_residual(x, y, bf16_);
    fire(hooks, names.resid_post, l, {B, T, H}, x.data());
  }

  ForwardOutput out;
  if (!has_head_) return out;
  cpu::rmsnorm(x.data(), M, H, final_ln_.data(), cfg_.rms_norm_eps, bf16_, h.data());
  fire(hooks, "final_norm", -1, {B, T, H}, h.data());
  if (in.logits_last_only) {
    std::vector<float> last(static_cast<size_t>(B * H));
    for (int64_t b = 0; b < B; ++b)
      std::memcpy(last.data() + b * H, h.data() + (b * T + T - 1) * H, size_t(H) * sizeof(float));
    out.logits.resize(size_t(B * V));
    cpu::linear(last.data(), B, lm_head_, out.logits.data(), bf16_);
    fire(hooks, "logits", -1, {B, 1, V}, out.logits.data());
    out.greedy = greedy_rows(out.logits, B, V);
  } else {
    out.logits.resize(size_t(M * V));
    cpu::linear(h.data(), M, lm_head_, out.logits.data(), bf16_);
    fire(hooks, "logits", -1, {B, T, V}, out.logits.data());
  }
  return out;
}

// Multi-head latent attention, expanded form (as the official code computes it): queries
// from x, the new tokens' latents go into the cache, keys and values are re-expanded from
// every cached latent with kv_b, then causal softmax attention per head.
void DeepSeekV2::attention(const Layer& L, int64_t li, const LayerHookNames& names, const ForwardInput& in,
                           KVCache& cache, int64_t past, const std::vector<float>& x, std::vector<float>& out,
                           const Hooks* hooks) const {
  const int64_t B = in.batch, T = in.tokens, M = B * T;
  const int64_t nh = cfg_.num_attention_heads, dn = cfg_.qk_nope_head_dim, dr = cfg_.qk_rope_head_dim;
  const int64_t dv = cfg_.v_head_dim, dc = cfg_.kv_lora_rank, dq = dn + dr, W = dc + dr;
  const int64_t l = layers_.first + li;

  // q = x W_q^T  [M, nh*dq]  (or the LoRA path: q_b(rmsnorm(q_a x)))
  std::vector<float> q(static_cast<size_t>(M * nh * dq));
  if (cfg_.q_lora_rank) {
    const int64_t r = *cfg_.q_lora_rank;
    std::vector<float> qa(static_cast<size_t>(M * r)), qn(static_cast<size_t>(M * r));
    cpu::linear(x.data(), M, L.q_a, qa.data(), bf16_);
    cpu::rmsnorm(qa.data(), M, r, L.q_a_ln.data(), cfg_.rms_norm_eps, bf16_, qn.data());
    cpu::linear(qn.data(), M, L.q_b, q.data(), bf16_);
  } else {
    cpu::linear(x.data(), M, L.q, q.data(), bf16_);
  }
  fire(hooks, names.q, l, {B, T, nh, dq}, q.data());

  // latent = x W_kva^T  [M, dc+dr]: the compressed KV and the shared rope key, pre-norm/RoPE.
  std::vector<float> lat(static_cast<size_t>(M * W));
  cpu::linear(x.data(), M, L.kv_a, lat.data(), bf16_);
  fire(hooks, names.latent, l, {B, T, W}, lat.data());

  // Cache slot = [rmsnorm(c) | rope(k_pe)]; queries' rope parts are rotated at the same positions.
  std::vector<float> cs(static_cast<size_t>(dr));  // cos[dr/2], sin[dr/2]
  for (int64_t m = 0; m < M; ++m) {
    const int64_t b = m / T, t = m % T;
    float* slot = cache.slot(li, b, past + t);
    cpu::rmsnorm(lat.data() + m * W, 1, dc, L.kv_a_ln.data(), cfg_.rms_norm_eps, bf16_, slot);
    std::memcpy(slot + dc, lat.data() + m * W + dc, size_t(dr) * sizeof(float));
    rope_cos_sin(inv_freq_, rope_amp_, in.positions[m], bf16_, cs.data(), cs.data() + dr / 2);
    rope_rotate(slot + dc, dr, cs.data(), cs.data() + dr / 2, bf16_);
    for (int64_t hh = 0; hh < nh; ++hh)
      rope_rotate(q.data() + (m * nh + hh) * dq + dn, dr, cs.data(), cs.data() + dr / 2, bf16_);
  }
  if (hooks && hooks->wants(names.latent_norm)) {
    // Slots of one row are contiguous; rows are a capacity apart. Copy out, fire, copy back.
    std::vector<float> buf(static_cast<size_t>(M * W));
    for (int64_t b = 0; b < B; ++b)
      std::memcpy(buf.data() + b * T * W, cache.slot(li, b, past), size_t(T * W) * sizeof(float));
    fire(hooks, names.latent_norm, l, {B, T, W}, buf.data());
    for (int64_t b = 0; b < B; ++b)
      std::memcpy(cache.slot(li, b, past), buf.data() + b * T * W, size_t(T * W) * sizeof(float));
  }

  const int64_t Tk = past + T;
  const bool want_pattern = hooks && hooks->wants(names.pattern);
  std::vector<float> pattern(want_pattern ? static_cast<size_t>(B * nh * T * Tk) : 0);
  std::vector<float> heads(static_cast<size_t>(M * nh * dv));  // concat_h O_h  [M, nh*dv]
  for (int64_t b = 0; b < B; ++b) {
    const float* qb = q.data() + b * T * nh * dq;
    float* hb = heads.data() + b * T * nh * dv;
    float* pb = want_pattern ? pattern.data() + b * nh * T * Tk : nullptr;
    if (in.attention == AttentionForm::Absorbed)
      attend_absorbed(L, li, cache, b, T, past, qb, hb, pb);
    else
      attend_expanded(L, li, cache, b, T, past, qb, hb, pb);
  }
  if (want_pattern) fire(hooks, names.pattern, l, {B, nh, T, Tk}, pattern.data());
  cpu::linear(heads.data(), M, L.o, out.data(), bf16_);
}

bool DeepSeekV2::softmax_visible(const KVCache& cache, int64_t b, int64_t qpos, float* p) const {
  float mx = -INFINITY;
  bool any = false;
  for (int64_t j = 0; j <= qpos; ++j)
    if (cache.key_mask(b, j)) {
      mx = any ? std::max(mx, p[j]) : p[j];
      any = true;
    }
  if (!any) return false;
  float sum = 0.0f;
  for (int64_t j = 0; j <= qpos; ++j) {
    if (!cache.key_mask(b, j)) continue;
    p[j] = std::exp(p[j] - mx);
    sum += p[j];
  }
  for (int64_t j = 0; j <= qpos; ++j) {
    if (!cache.key_mask(b, j)) {
      p[j] = 0.0f;
      continue;
    }
    p[j] = p[j] / sum;
    if (bf16_) p[j] = round_bf16(p[j]);
  }
  return true;
}

// Expanded form: re-expand every cached latent of row b with kv_b, then per-head attention
// with 192-wide keys [k_nope_h | k_pe] (one dot product per score, as the official matmul).
void DeepSeekV2::attend_expanded(const Layer& L, int64_t li, const KVCache& cache, int64_t b, int64_t T,
                                 int64_t past, const float* q, float* heads, float* pattern) const {
  const int64_t nh = cfg_.num_attention_heads, dn = cfg_.qk_nope_head_dim, dr = cfg_.qk_rope_head_dim;
  const int64_t dv = cfg_.v_head_dim, dc = cfg_.kv_lora_rank, dq = dn + dr, Tk = past + T;
  std::vector<float> c(static_cast<size_t>(Tk * dc)), kv(static_cast<size_t>(Tk * nh * (dn + dv)));
  std::vector<float> K(static_cast<size_t>(nh * Tk * dq));
  for (int64_t j = 0; j < Tk; ++j) std::memcpy(c.data() + j * dc, cache.slot(li, b, j), size_t(dc) * sizeof(float));
  cpu::linear(c.data(), Tk, L.kv_b, kv.data(), bf16_);  // [Tk, nh*(dn+dv)]
  for (int64_t hh = 0; hh < nh; ++hh)
    for (int64_t j = 0; j < Tk; ++j) {
      float* kr = K.data() + (hh * Tk + j) * dq;
      std::memcpy(kr, kv.data() + j * nh * (dn + dv) + hh * (dn + dv), size_t(dn) * sizeof(float));
      std::memcpy(kr + dn, cache.slot(li, b, j) + dc, size_t(dr) * sizeof(float));
    }
#pragma omp parallel for collapse(2) schedule(static) if (nh * T * Tk * dq >= (1 << 16))
  for (int64_t hh = 0; hh < nh; ++hh)
    for (int64_t i = 0; i < T; ++i) {
      const int64_t qpos = past + i;
      const float* qi = q + (i * nh + hh) * dq;
      std::vector<float> p(static_cast<size_t>(Tk), 0.0f);
      for (int64_t j = 0; j <= qpos; ++j) {
        if (!cache.key_mask(b, j)) continue;
        float s = cpu::dot_f32(qi, K.data() + (hh * Tk + j) * dq, dq);
        p[j] = bf16_ ? round_bf16(round_bf16(s) * scale_) : s * scale_;
      }
      float* o = heads + (i * nh + hh) * dv;
      std::fill(o, o + dv, 0.0f);
      if (softmax_visible(cache, b, qpos, p.data())) {
        for (int64_t j = 0; j <= qpos; ++j) {  // O_h = P V_h, keys in order
          if (p[j] == 0.0f) continue;
          const float* vj = kv.data() + j * nh * (dn + dv) + hh * (dn + dv) + dn;
          for (int64_t d = 0; d < dv; ++d) o[d] += p[j] * vj[d];
        }
        if (bf16_) cpu::round_bf16_inplace(o, dv);
      }  // else: a padding query sees no key; its output is 0 and never read
      if (pattern) std::memcpy(pattern + (hh * T + i) * Tk, p.data(), size_t(Tk) * sizeof(float));
    }
}

// Absorbed form: q~_h = W_UK^h^T q_nope_h (512 wide), scores against the cached latent
// [c^ | k_pe] (576 wide, shared by all heads), o_lat = P c^, O_h = W_UV^h o_lat.
void DeepSeekV2::attend_absorbed(const Layer& L, int64_t li, const KVCache& cache, int64_t b, int64_t T,
                                 int64_t past, const float* q, float* heads, float* pattern) const {
  const int64_t nh = cfg_.num_attention_heads, dn = cfg_.qk_nope_head_dim, dr = cfg_.qk_rope_head_dim;
  const int64_t dv = cfg_.v_head_dim, dc = cfg_.kv_lora_rank, dq = dn + dr, W = dc + dr, Tk = past + T;
  const float* wkvb = L.kv_b_f32.data();  // [nh*(dn+dv), dc]
#pragma omp parallel for collapse(2) schedule(static) if (nh * T * (Tk + dn) * W >= (1 << 16))
  for (int64_t hh = 0; hh < nh; ++hh)
    for (int64_t i = 0; i < T; ++i) {
      const int64_t qpos = past + i;
      const float* qi = q + (i * nh + hh) * dq;
      std::vector<float> qt(static_cast<size_t>(W), 0.0f), p(static_cast<size_t>(Tk), 0.0f);
      std::vector<float> olat(static_cast<size_t>(dc), 0.0f);
      for (int64_t d = 0; d < dn; ++d) {  // q~ = sum_d q_nope[d] W_UK[d, :], d in order
        const float* wrow = wkvb + (hh * (dn + dv) + d) * dc;
        for (int64_t c = 0; c < dc; ++c) qt[c] += qi[d] * wrow[c];
      }
      if (bf16_) cpu::round_bf16_inplace(qt.data(), dc);
      std::memcpy(qt.data() + dc, qi + dn, size_t(dr) * sizeof(float));
      for (int64_t j = 0; j <= qpos; ++j) {
        if (!cache.key_mask(b, j)) continue;
        float s = cpu::dot_f32(qt.data(), cache.slot(li, b, j), W);
        p[j] = bf16_ ? round_bf16(round_bf16(s) * scale_) : s * scale_;
      }
      float* o = heads + (i * nh + hh) * dv;
      std::fill(o, o + dv, 0.0f);
      if (softmax_visible(cache, b, qpos, p.data())) {
        for (int64_t j = 0; j <= qpos; ++j) {
          if (p[j] == 0.0f) continue;
          const float* cj = cache.slot(li, b, j);
          for (int64_t c = 0; c < dc; ++c) olat[c] += p[j] * cj[c];
        }
        if (bf16_) cpu::round_bf16_inplace(olat.data(), dc);
        for (int64_t e = 0; e < dv; ++e) o[e] = cpu::dot_f32(wkvb + (hh * (dn + dv) + dn + e) * dc, olat.data(), dc);
        if (bf16_) cpu::round_bf16_inplace(o, dv);
      }
      if (pattern) std::memcpy(pattern + (hh * T + i) * Tk, p.data(), size_t(Tk) * sizeof(float));
    }
}

void DeepSeekV2::mlp(const Mlp& m, int64_t M, const float* x, float* out) const {
  const int64_t I = m.gate.rows;
  std::vector<float> g(static_cast<size_t>(M * I)), u(static_cast<size_t>(M * I));
  cpu::linear(x, M, m.gate, g.data(), bf16_);
  cpu::linear(x, M, m.up, u.data(), bf16_);
  for (size_t i = 0; i < g.size(); ++i) {
    float s = g[i] / (1.0f + std::exp(-g[i]));  // silu
    if (bf16_) s = round_bf16(s);
    float v = s * u[i];
    g[i] = bf16_ ? round_bf16(v) : v;
  }
  cpu::linear(g.data(), M, m.down, out, bf16_);
}

// Router: softmax over fp32 logits, top-k (greedy or group-limited), then either
// normalisation (norm_topk_prob, k > 1) or scaling by routed_scaling_factor. Output order:
// weight descending, ties to the lower expert id.
void DeepSeekV2::route(int64_t M, const float* logits, int32_t* ids, float* weights) const {
  const int64_t E = cfg_.n_routed_experts, k = cfg_.num_experts_per_tok;
  std::vector<float> p(static_cast<size_t>(E)), masked(static_cast<size_t>(E));
  std::vector<int32_t> order(static_cast<size_t>(E));
  for (int64_t m = 0; m < M; ++m) {
    const float* lg = logits + m * E;
    float mx = lg[0];
    for (int64_t e = 1; e < E; ++e) mx = std::max(mx, lg[e]);
    float sum = 0.0f;
    for (int64_t e = 0; e < E; ++e) sum += (p[e] = std::exp(lg[e] - mx));
    for (int64_t e = 0; e < E; ++e) p[e] /= sum;
    masked = p;
    if (cfg_.topk_method == TopkMethod::GroupLimitedGreedy) {
      const int64_t G = cfg_.n_group, per = E / G;
      std::vector<float> gscore(static_cast<size_t>(G));
      std::vector<int32_t> gorder(static_cast<size_t>(G));
      for (int64_t g = 0; g < G; ++g) gscore[g] = *std::max_element(p.begin() + g * per, p.begin() + (g + 1) * per);
      std::iota(gorder.begin(), gorder.end(), 0);
      std::stable_sort(gorder.begin(), gorder.end(), [&](int32_t a, int32_t c) { return gscore[a] > gscore[c]; });
      std::vector<uint8_t> keep(static_cast<size_t>(G), 0);
      for (int64_t g = 0; g < cfg_.topk_group; ++g) keep[gorder[g]] = 1;
      for (int64_t e = 0; e < E; ++e)
        if (!keep[e / per]) masked[e] = 0.0f;
    }
    std::iota(order.begin(), order.end(), 0);
    std::partial_sort(order.begin(), order.begin() + k, order.end(), [&](int32_t a, int32_t c) {
      return masked[a] != masked[c] ? masked[a] > masked[c] : a < c;
    });
    float* w = weights + m * k;
    for (int64_t j = 0; j < k; ++j) {
      ids[m * k + j] = order[j];
      w[j] = masked[order[j]];
    }
    if (k > 1 && cfg_.norm_topk_prob) {
      float denom = 0.0f;
      for (int64_t j = 0; j < k; ++j) denom += w[j];
      denom += 1e-20f;
      for (int64_t j = 0; j < k; ++j) w[j] /= denom;
    } else {
      for (int64_t j = 0; j < k; ++j) w[j] *= float(cfg_.routed_scaling_factor);
    }
  }
}

void DeepSeekV2::moe(const Layer& L, const LayerHookNames& names, int64_t B, int64_t T, const std::vector<float>& x,
                     std::vector<float>& out, const Hooks* hooks) const {
  const int64_t M = B * T, H = cfg_.hidden_size, E = cfg_.n_routed_experts, k = cfg_.num_experts_per_tok;
  const int64_t l = layers_.first + (&L - blocks_.data());
  // Router logits in fp32 on the (bf16-valued) input: the official code upcasts both operands.
  std::vector<float> logits(static_cast<size_t>(M * E));
  cpu::linear(x.data(), M, L.router, logits.data(), false);
  fire(hooks, names.router_logits, l, {B, T, E}, logits.data());
  std::vector<int32_t> ids(static_cast<size_t>(M * k));
  std::vector<float> w(static_cast<size_t>(M * k));
  route(M, logits.data(), ids.data(), w.data());
  if (hooks && hooks->wants(names.topk_ids)) {
    HookTensor t{.name = names.topk_ids, .layer = l, .dtype = DType::I32, .shape = {B, T, k}, .data = ids.data()};
    hooks->fire(t);
    for (int64_t i = 0; i < M * k; ++i)
      if (ids[i] < 0 || ids[i] >= E)
        fail("hook " + names.topk_ids, {}, "an observer wrote expert id " + std::to_string(ids[i]) + " (valid: 0-" +
                                               std::to_string(E - 1) + ")");
  }
  fire(hooks, names.topk_weights, l, {B, T, k}, w.data());

  // Dispatch: each expert runs once over the tokens routed to it, in ascending token order.
  // A token's result depends only on its own row (cpu::linear is row-independent), not on
  // which other tokens share the expert.
  std::vector<float> expert_out(static_cast<size_t>(M * k * H));
  std::vector<int64_t> slots;
  std::vector<float> xs, ys;
  for (int64_t e = 0; e < E; ++e) {
    slots.clear();
    for (int64_t i = 0; i < M * k; ++i)
      if (ids[i] == e) slots.push_back(i);
    if (slots.empty()) continue;
    const int64_t n = int64_t(slots.size());
    xs.resize(size_t(n * H));
    ys.resize(size_t(n * H));
    for (int64_t r = 0; r < n; ++r)
      std::memcpy(xs.data() + r * H, x.data() + (slots[r] / k) * H, size_t(H) * sizeof(float));
    mlp(L.experts[e], n, xs.data(), ys.data());
    for (int64_t r = 0; r < n; ++r)
      std::memcpy(expert_out.data() + slots[r] * H, ys.data() + r * H, size_t(H) * sizeof(float));
  }
  // Combine in fp32 in slot order, one bf16 rounding (official moe_infer).
  std::vector<float> routed(static_cast<size_t>(M * H), 0.0f);
  for (int64_t m = 0; m < M; ++m) {
    float* r = routed.data() + m * H;
    for (int64_t j = 0; j < k; ++j) {
      const float* eo = expert_out.data() + (m * k + j) * H;
      const float wj = w[m * k + j];
      for (int64_t d = 0; d < H; ++d) r[d] += eo[d] * wj;
    }
    if (bf16_) cpu::round_bf16_inplace(r, H);
  }
  fire(hooks, names.routed_out, l, {B, T, H}, routed.data());
  if (L.has_shared) {
    mlp(L.shared, M, x.data(), out.data());
    fire(hooks, names.shared_out, l, {B, T, H}, out.data());
    for (int64_t i = 0; i < M * H; ++i) out[i] = bf16_ ? round_bf16(routed[i] + out[i]) : routed[i] + out[i];
  } else {
    out = routed;
  }
}

}  // namespace atlas
