// CPU references for the CUDA kernels; see reference.h. Built with -ffp-contract=off, so
// a * b + c is two roundings here exactly as in the kernels (built with --fmad=false);
// std::fma stands where a kernel writes __fmaf_rn.
#include "backend/cuda/reference.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <type_traits>
#include <vector>

#include "core/bf16.h"
#include "core/error.h"

namespace atlas::cuda::ref {

namespace {

float bf(uint16_t h) { return bf16_to_f32(h); }

// A bf16 rounding point of the official code for element type T (identity in f32); loads and
// stores use core/bf16.h's elem_to_f32 / f32_to_elem (the twins of kernels/common.cuh's).
template <class T>
float rnd(float f) {
  return elem_to_f32(f32_to_elem<T>(f));
}

// Halving tree over n (a power of two) values: v[i] += v[i + o] for o = n/2 .. 1.
float tree(float* v, int n) {
  for (int o = n / 2; o > 0; o >>= 1)
    for (int i = 0; i < o; ++i) v[i] = v[i] + v[i + o];
  return v[0];
}

}  // namespace

float block_sum_ref(const float* partials) {
  float warp[8];
  for (int w = 0; w < 8; ++w) {
    float v[32];
    std::copy(partials + 32 * w, partials + 32 * w + 32, v);
    warp[w] = tree(v, 32);
  }
  return tree(warp, 8);
}

namespace {

template <class T>
void rmsnorm_t(const RmsNormArgsT<T>& a) {
  const int64_t xs = a.x_stride ? a.x_stride : a.dim, os = a.out_stride ? a.out_stride : a.dim;
  std::vector<float> part(256);
  for (int r = 0; r < a.rows; ++r) {
    const T* x = a.x + r * xs;
    std::fill(part.begin(), part.end(), 0.0f);
    for (int i = 0; i < a.dim; ++i) {
      const float v = elem_to_f32(x[i]);
      part[i % 256] += v * v;
    }
    const float ss = block_sum_ref(part.data());
    const float rs = 1.0f / std::sqrt(ss / float(a.dim) + a.eps);
    for (int i = 0; i < a.dim; ++i) {
      const float y = rnd<T>(elem_to_f32(x[i]) * rs);
      a.out[r * os + i] = f32_to_elem<T>(elem_to_f32(a.weight[i]) * y);
    }
  }
}

template <class T>
void rope_t(const RopeArgsT<T>& a) {
  const int half = a.rope_dim / 2;
  for (int t = 0; t < a.tokens; ++t) {
    const int p = a.positions[t];
    if (p < 0 || p >= a.max_positions) throw Error("cuda::ref: rope: positions: out of range");
    for (int h = 0; h < a.heads; ++h)
      for (int k = 0; k < half; ++k) {
        T* r = a.x + t * a.token_stride + h * a.head_stride + 2 * k;
        const float c = elem_to_f32(a.cos[int64_t(p) * half + k]), s = elem_to_f32(a.sin[int64_t(p) * half + k]);
        const float x0 = elem_to_f32(r[0]), x1 = elem_to_f32(r[1]);
        const float even = rnd<T>(rnd<T>(x0 * c) - rnd<T>(x1 * s));
        const float odd = rnd<T>(rnd<T>(x1 * c) + rnd<T>(x0 * s));
        r[0] = f32_to_elem<T>(even);
        r[1] = f32_to_elem<T>(odd);
      }
  }
}

template <class T>
void silu_gate_t(const SiluGateArgsT<T>& a) {
  const int64_t stride = a.in_stride ? a.in_stride : a.width;
  for (int r = 0; r < a.rows; ++r)
    for (int c = 0; c < a.width; ++c) {
      const float g = elem_to_f32(a.gate[r * stride + c]), u = elem_to_f32(a.up[r * stride + c]);
      const float s = g / (1.0f + std::exp(-g));
      a.out[int64_t(r) * a.width + c] = f32_to_elem<T>(rnd<T>(s) * u);
    }
}

template <class T>
void add_t(const AddArgsT<T>& a) {
  for (int64_t i = 0; i < a.n; ++i) a.out[i] = f32_to_elem<T>(elem_to_f32(a.a[i]) + elem_to_f32(a.b[i]));
}

}  // namespace

void rmsnorm(const RmsNormArgs& a) { rmsnorm_t(a); }
void rmsnorm(const RmsNormArgsT<float>& a) { rmsnorm_t(a); }
void rope_inplace(const RopeArgs& a) { rope_t(a); }
void rope_inplace(const RopeArgsT<float>& a) { rope_t(a); }
void silu_gate(const SiluGateArgs& a) { silu_gate_t(a); }
void silu_gate(const SiluGateArgsT<float>& a) { silu_gate_t(a); }
void add_bf16(const AddArgs& a) { add_t(a); }
void add(const AddArgsT<float>& a) { add_t(a); }

void router(const RouterArgs& a) {
  const int E = a.experts, k = a.k;
  std::vector<float> p(E), cand(E);
  std::vector<char> taken(E);
  for (int t = 0; t < a.tokens; ++t) {
    const float* l = a.logits + int64_t(t) * E;
    float m = l[0];
    for (int e = 1; e < E; ++e) m = std::fmax(m, l[e]);
    float sum = 0.0f;
    for (int e = 0; e < E; ++e) {
      p[e] = std::exp(l[e] - m);
      sum += p[e];
    }
    for (int e = 0; e < E; ++e) p[e] = p[e] / sum;
    if (a.scores) std::copy(p.begin(), p.end(), a.scores + int64_t(t) * E);
    cand = p;
    if (a.method == TopkMethod::group_limited_greedy) {
      const int gs = E / a.n_group;
      std::vector<float> gscore(a.n_group);
      std::vector<char> keep(a.n_group, 0);
      for (int g = 0; g < a.n_group; ++g) gscore[g] = *std::max_element(&p[g * gs], &p[g * gs] + gs);
      for (int r = 0; r < a.topk_group; ++r) {
        int best = -1;
        for (int g = 0; g < a.n_group; ++g)
          if (!keep[g] && (best < 0 || gscore[g] > gscore[best])) best = g;
        keep[best] = 1;
      }
      for (int e = 0; e < E; ++e)
        if (!keep[e / gs]) cand[e] = 0.0f;
    }
    std::fill(taken.begin(), taken.end(), 0);
    std::vector<float> w(k);
    for (int j = 0; j < k; ++j) {
      int best = -1;
      for (int e = 0; e < E; ++e)
        if (!taken[e] && (best < 0 || cand[e] > cand[best])) best = e;
      taken[best] = 1;
      a.topk_ids[int64_t(t) * k + j] = best;
      w[j] = cand[best];
    }
    if (a.norm_topk_prob && k > 1) {
      float s = 0.0f;
      for (int j = 0; j < k; ++j) s += w[j];
      s += 1e-20f;
      for (int j = 0; j < k; ++j) w[j] = w[j] / s;
    } else {
      for (int j = 0; j < k; ++j) w[j] = w[j] * a.routed_scaling_factor;
    }
    std::copy(w.begin(), w.end(), a.topk_weights + int64_t(t) * k);
  }
}

void moe_permute(const MoePermuteArgs& a) {
  const int64_t pairs = int64_t(a.tokens) * a.k;
  int32_t pos = 0;
  for (int e = 0; e < a.experts; ++e) {
    a.offsets[e] = pos;
    for (int64_t i = 0; i < pairs; ++i) {
      if (a.topk_ids[i] != e) continue;
      a.sorted_token[pos] = int32_t(i / a.k);
      a.pair_slot[i] = pos;
      ++pos;
    }
    a.counts[e] = pos - a.offsets[e];
  }
  a.offsets[a.experts] = pos;
}

namespace {

template <class T>
void moe_gather_t(const MoeGatherArgsT<T>& a) {
  for (int r = 0; r < a.rows; ++r)
    std::copy(a.x + int64_t(a.sorted_token[r]) * a.dim, a.x + int64_t(a.sorted_token[r] + 1) * a.dim,
              a.x_sorted + int64_t(r) * a.dim);
}

template <class T>
void moe_combine_t(const MoeCombineArgsT<T>& a) {
  for (int t = 0; t < a.tokens; ++t)
    for (int c = 0; c < a.dim; ++c) {
      float acc = 0.0f;
      for (int j = 0; j < a.k; ++j)
        acc += a.topk_weights[t * a.k + j] * elem_to_f32(a.y_sorted[int64_t(a.pair_slot[t * a.k + j]) * a.dim + c]);
      a.out[int64_t(t) * a.dim + c] = f32_to_elem<T>(acc);
    }
}

}  // namespace

void moe_gather(const MoeGatherArgs& a) { moe_gather_t(a); }
void moe_gather(const MoeGatherArgsT<float>& a) { moe_gather_t(a); }
void moe_combine(const MoeCombineArgs& a) { moe_combine_t(a); }
void moe_combine(const MoeCombineArgsT<float>& a) { moe_combine_t(a); }

// The scalar kernel's contract (MlaImpl::scalar): fp32 P, one max / sum per split.
// Both MLA contracts end the same way: per head, the splits' partials (running max m, sum l,
// accumulator acc[D]) merged in ascending split order with exp(m_s - M) weights, out = acc/L.
// plus_zero: the tensor-core kernel writes exact zeros as +0 (bf16 only).
template <class T>
static void merge_splits(const std::vector<float>& ms, const std::vector<float>& ls, const std::vector<float>& acc,
                         int n_splits, int H, int D, T* out, bool plus_zero) {
  for (int h = 0; h < H; ++h) {
    float M = -std::numeric_limits<float>::infinity();
    for (int s = 0; s < n_splits; ++s) M = std::fmax(M, ms[size_t(s) * H + h]);
    std::vector<float> f(n_splits);
    float L = 0.0f;
    for (int s = 0; s < n_splits; ++s) {
      f[s] = std::exp(ms[size_t(s) * H + h] - M);
      L = std::fma(ls[size_t(s) * H + h], f[s], L);
    }
    for (int d = 0; d < D; ++d) {
      float o = 0.0f;
      for (int s = 0; s < n_splits; ++s) o = std::fma(acc[(size_t(s) * H + h) * D + d], f[s], o);
      if constexpr (std::is_same_v<T, float>) {
        out[h * D + d] = o / L;
      } else {
        const uint16_t v = f32_to_bf16(o / L);
        out[h * D + d] = plus_zero && v == 0x8000 ? uint16_t(0) : v;
      }
    }
  }
}

namespace {

template <class T>
void mla_decode_scalar_t(const MlaDecodeArgsT<T>& a) {
  const int H = a.heads, S = a.split_tokens, W = a.latent + a.rope, D = a.latent;
  for (int b = 0; b < a.rows; ++b) {
    const int len = a.lengths[b];
    if (len < 0 || len > a.max_length) throw Error("cuda::ref: mla_decode: lengths: out of range");
    if (len == 0) {  // no visible key: zeros
      std::fill(a.out + int64_t(b) * H * D, a.out + int64_t(b + 1) * H * D, T(0));
      continue;
    }
    const T* q = a.q + int64_t(b) * H * W;
    const int64_t crow = a.cache_rows ? a.cache_rows[b] : b;
    const T* cache = a.latent_cache + crow * a.cache_row_stride;
    const int n_splits = (len + S - 1) / S;
    // partials [split][head]: acc[512], m, l
    std::vector<float> acc(size_t(n_splits) * H * D), ms(size_t(n_splits) * H), ls(size_t(n_splits) * H);
    for (int s = 0; s < n_splits; ++s) {
      const int j0 = s * S, n = std::min(S, len - j0);
      std::vector<float> sc(size_t(H) * n);
      for (int j = 0; j < n; ++j)
        for (int h = 0; h < H; ++h) {
          float d_acc = 0.0f;
          for (int d = 0; d < W; ++d)
            d_acc = std::fma(elem_to_f32(q[h * W + d]), elem_to_f32(cache[int64_t(j0 + j) * W + d]), d_acc);
          sc[size_t(h) * n + j] = d_acc * a.scale;
        }
      for (int h = 0; h < H; ++h) {
        float* row = &sc[size_t(h) * n];
        float m = -std::numeric_limits<float>::infinity();
        for (int j = 0; j < n; ++j) m = std::fmax(m, row[j]);
        float lane[32] = {};
        for (int j = 0; j < n; ++j) {
          row[j] = std::exp(row[j] - m);
          lane[j % 32] += row[j];
        }
        ms[size_t(s) * H + h] = m;
        ls[size_t(s) * H + h] = tree(lane, 32);
        float* o = &acc[(size_t(s) * H + h) * D];
        for (int d = 0; d < D; ++d) {
          float v = 0.0f;
          for (int j = 0; j < n; ++j) v = std::fma(row[j], elem_to_f32(cache[int64_t(j0 + j) * W + d]), v);
          o[d] = v;
        }
      }
    }
    merge_splits(ms, ls, acc, n_splits, H, D, a.out + int64_t(b) * H * D, false);
  }
}

}  // namespace

void mla_decode_scalar(const MlaDecodeArgs& a) { mla_decode_scalar_t(a); }
void mla_decode_scalar(const MlaDecodeArgsT<float>& a) { mla_decode_scalar_t(a); }

// The tensor-core kernel's contract (kernels/mla_tc.cuh): 64-slot tiles inside each split,
// online softmax, P rounded to bf16 (l sums the rounded values in the kernel's fixed order),
// merge over the splits in ascending order, exact zeros written as +0.
void mla_decode_tensor_core(const MlaDecodeArgs& a) {
  constexpr int kTile = 64;
  const int H = a.heads, S = a.split_tokens, W = a.latent + a.rope, D = a.latent;
  const float inf = std::numeric_limits<float>::infinity();
  for (int b = 0; b < a.rows; ++b) {
    const int len = a.lengths[b];
    if (len < 0 || len > a.max_length) throw Error("cuda::ref: mla_decode: lengths: out of range");
    if (len == 0) {  // no visible key: zeros
      std::fill(a.out + int64_t(b) * H * D, a.out + int64_t(b + 1) * H * D, uint16_t(0));
      continue;
    }
    const uint16_t* q = a.q + int64_t(b) * H * W;
    const int64_t crow = a.cache_rows ? a.cache_rows[b] : b;
    const uint16_t* cache = a.latent_cache + crow * a.cache_row_stride;
    const int n_splits = (len + S - 1) / S;
    // partials [split][head]: acc[D], m, l
    std::vector<float> acc(size_t(n_splits) * H * D), ms(size_t(n_splits) * H), ls(size_t(n_splits) * H);
    for (int s = 0; s < n_splits; ++s) {
      const int j0 = s * S, j_end = std::min(j0 + S, len);
      for (int h = 0; h < H; ++h) {
        float m = -inf, l = 0.0f;
        float* o = &acc[(size_t(s) * H + h) * D];
        std::fill(o, o + D, 0.0f);
        for (int t0 = j0; t0 < j_end; t0 += kTile) {
          const int nv = std::min(kTile, j_end - t0);
          float sc[kTile], p[kTile] = {};
          float mx = -inf;
          for (int c = 0; c < nv; ++c) {
            float d_acc = 0.0f;
            for (int d = 0; d < W; ++d)
              d_acc = std::fma(bf(q[h * W + d]), bf(cache[int64_t(t0 + c) * W + d]), d_acc);
            sc[c] = d_acc * a.scale;
            mx = std::fmax(mx, sc[c]);
          }
          const float m_new = std::fmax(m, mx);
          const float m_use = m_new == -inf ? 0.0f : m_new;
          for (int c = 0; c < nv; ++c) p[c] = bf(f32_to_bf16(std::exp(sc[c] - m_use)));
          float quarter[4];
          for (int k = 0; k < 4; ++k) {
            quarter[k] = 0.0f;
            for (int i = 0; i < 16; ++i) quarter[k] = quarter[k] + p[16 * k + i];
          }
          const float tsum = (quarter[0] + quarter[1]) + (quarter[2] + quarter[3]);
          const float alpha = std::exp(m - m_use);
          l = std::fma(l, alpha, tsum);
          m = m_new;
          for (int d = 0; d < D; ++d) {
            float v = o[d] * alpha;
            for (int c = 0; c < nv; ++c) v = std::fma(p[c], bf(cache[int64_t(t0 + c) * W + d]), v);
            o[d] = v;
          }
        }
        ms[size_t(s) * H + h] = m;
        ls[size_t(s) * H + h] = l;
      }
    }
    merge_splits(ms, ls, acc, n_splits, H, D, a.out + int64_t(b) * H * D, true);
  }
}

void mla_decode(const MlaDecodeArgs& a) {
  if (a.impl == MlaImpl::scalar)
    mla_decode_scalar(a);
  else
    mla_decode_tensor_core(a);
}

void gemm(const GemmArgs& a) {
  const int64_t xs = a.x_stride ? a.x_stride : a.K, ws = a.w_stride ? a.w_stride : a.K;
  const int64_t os = a.out_stride ? a.out_stride : a.N;
  for (int b = 0; b < a.batch; ++b)
    for (int m = 0; m < a.M; ++m)
      for (int n = 0; n < a.N; ++n) {
        float acc = 0.0f;
        const uint16_t* x = a.x + b * a.x_batch_stride + int64_t(m) * xs;
        const uint16_t* w = a.w + b * a.w_batch_stride + int64_t(n) * ws;
        for (int k = 0; k < a.K; ++k) acc = std::fma(bf(x[k]), bf(w[k]), acc);
        const int64_t o = b * a.out_batch_stride + int64_t(m) * os + n;
        if (a.out_type == OutType::f32)
          static_cast<float*>(a.out)[o] = acc;
        else
          static_cast<uint16_t*>(a.out)[o] = f32_to_bf16(acc);
      }
}

void grouped_gemm(const GroupedGemmArgs& a) {
  const int64_t xs = a.x_stride ? a.x_stride : a.K, os = a.out_stride ? a.out_stride : a.N;
  const size_t elt = a.out_type == OutType::f32 ? 4 : 2;
  if (a.offsets[0] != 0) throw Error("cuda::ref: grouped_gemm: offsets[0] != 0");
  for (int g = 0; g < a.groups; ++g) {
    const int lo = a.offsets[g], hi = a.offsets[g + 1];
    if (hi < lo || hi > a.max_rows) throw Error("cuda::ref: grouped_gemm: offsets out of order or past max_rows");
    for (int r = lo; r < hi; ++r) {
      const int64_t src = a.x_rows ? a.x_rows[r] : r;
      if (src < 0 || (a.x_rows_limit > 0 && src >= a.x_rows_limit))
        throw Error("cuda::ref: grouped_gemm: x_rows entry out of range");
      gemm({.x = a.x + src * xs, .w = a.w[g], .out = static_cast<char*>(a.out) + size_t(r * os) * elt,
            .out_type = a.out_type, .M = 1, .N = a.N, .K = a.K, .w_stride = a.w_stride});
    }
  }
}

namespace {

template <class T>
void copy_rows_t(const CopyRowsArgsT<T>& a) {
  const int64_t ss = a.src_stride ? a.src_stride : a.width, ds = a.dst_stride ? a.dst_stride : a.width;
  for (int64_t i = 0; i < a.rows; ++i) {
    const int64_t s = a.src_rows ? a.src_rows[i] : i, d = a.dst_rows ? a.dst_rows[i] : i;
    if (s < 0 || d < 0) continue;
    if (s >= a.src_limit || d >= a.dst_limit) throw Error("cuda::ref: copy_rows: index out of range");
    std::copy(a.src + s * ss, a.src + s * ss + a.width, a.dst + d * ds);
  }
}

template <class T>
void edit_rows_t(const RowEditArgsT<T>& a) {
  for (int64_t i = 0; i < a.n; ++i) {
    const int64_t r = a.rows[i];
    if (r < 0 || r >= a.limit) throw Error("cuda::ref: edit_rows: row out of range");
    T* x = a.x + r * a.width;
    const float* s = a.op == RowEditOp::Add ? a.src + (a.src_per_row ? i * a.width : 0) : nullptr;
    for (int j = 0; j < a.width; ++j) {
      float v = 0.0f;
      if (a.op == RowEditOp::Scale) v = float(double(elem_to_f32(x[j])) * a.factor);
      if (a.op == RowEditOp::Add) v = float(double(elem_to_f32(x[j])) + a.factor * double(s[j]));
      x[j] = f32_to_elem<T>(v);
    }
  }
}

template <class T>
void argmax_t(const ArgmaxArgsT<T>& a) {
  const int64_t stride = a.stride ? a.stride : a.vocab;
  for (int r = 0; r < a.rows; ++r) {
    const T* row = a.logits + r * stride;
    int best = 0;
    for (int i = 0; i < a.vocab; ++i) {
      const float v = elem_to_f32(row[i]);
      if (v != v) throw Error("cuda::ref: argmax: logits: NaN in row " + std::to_string(r));
      if (v > elem_to_f32(row[best])) best = i;  // strict: the first (lowest) index of the maximum stays
    }
    a.out[r] = best;
  }
}

}  // namespace

void copy_rows(const CopyRowsArgs& a) { copy_rows_t(a); }
void copy_rows(const CopyRowsArgsT<float>& a) { copy_rows_t(a); }
void edit_rows(const RowEditArgsT<uint16_t>& a) { edit_rows_t(a); }
void edit_rows(const RowEditArgsT<float>& a) { edit_rows_t(a); }
void argmax(const ArgmaxArgs& a) { argmax_t(a); }
void argmax(const ArgmaxArgsT<float>& a) { argmax_t(a); }

void gemm_f32(const GemmF32Args& a) {
  const int64_t xs = a.x_stride ? a.x_stride : a.K, ws = a.w_stride ? a.w_stride : a.K;
  const int64_t os = a.out_stride ? a.out_stride : a.N;
  for (int b = 0; b < a.batch; ++b)
    for (int m = 0; m < a.M; ++m)
      for (int n = 0; n < a.N; ++n) {
        const float* x = a.x + b * a.x_batch_stride + int64_t(m) * xs;
        const float* w = a.w + b * a.w_batch_stride + int64_t(n) * ws;
        float acc = 0.0f;
        for (int k = 0; k < a.K; ++k) acc = std::fma(x[k], w[k], acc);
        a.out[b * a.out_batch_stride + int64_t(m) * os + n] = acc;
      }
}

void grouped_gemm_f32(const GroupedGemmF32Args& a) {
  const int64_t xs = a.x_stride ? a.x_stride : a.K, os = a.out_stride ? a.out_stride : a.N;
  if (a.offsets[0] != 0) throw Error("cuda::ref: grouped_gemm_f32: offsets[0] != 0");
  for (int g = 0; g < a.groups; ++g) {
    const int lo = a.offsets[g], hi = a.offsets[g + 1];
    if (hi < lo || hi > a.max_rows) throw Error("cuda::ref: grouped_gemm_f32: offsets out of order or past max_rows");
    for (int r = lo; r < hi; ++r) {
      const int64_t src = a.x_rows ? a.x_rows[r] : r;
      if (src < 0 || (a.x_rows_limit > 0 && src >= a.x_rows_limit))
        throw Error("cuda::ref: grouped_gemm_f32: x_rows entry out of range");
      gemm_f32({.x = a.x + src * xs, .w = a.w[g], .out = a.out + r * os, .M = 1, .N = a.N, .K = a.K,
                .w_stride = a.w_stride});
    }
  }
}

namespace {

template <class T>
void mla_pattern_t(const MlaPatternArgsT<T>& a) {
  std::vector<float> part(256);
  for (int qi = 0; qi < a.rows; ++qi) {
    const int len = a.lengths[qi];
    if (len < 0 || len > a.slots) throw Error("cuda::ref: mla_pattern: lengths: a length outside [0, slots]");
    const T* row = a.latent_cache + int64_t(a.cache_rows ? a.cache_rows[qi] : qi) * a.cache_row_stride;
    for (int h = 0; h < a.heads; ++h) {
      const T* q = a.q + (int64_t(qi) * a.heads + h) * a.width;
      float* o = a.out + (int64_t(qi) * a.heads + h) * a.slots;
      std::fill(o, o + a.slots, 0.0f);
      float mx = -std::numeric_limits<float>::infinity();
      for (int j = 0; j < len; ++j) {
        const T* c = row + int64_t(j) * a.width;
        float acc = 0.0f;
        for (int k = 0; k < a.width; ++k) acc = acc + elem_to_f32(q[k]) * elem_to_f32(c[k]);
        o[j] = rnd<T>(rnd<T>(acc) * a.scale);
        mx = std::max(mx, o[j]);
      }
      std::fill(part.begin(), part.end(), 0.0f);
      for (int j = 0; j < len; ++j) {
        o[j] = std::exp(o[j] - mx);
        part[size_t(j % 256)] += o[j];
      }
      const float sum = block_sum_ref(part.data());
      for (int j = 0; j < len; ++j) o[j] = rnd<T>(o[j] / sum);
    }
  }
}

}  // namespace

void mla_pattern(const MlaPatternArgsT<uint16_t>& a) { mla_pattern_t(a); }
void mla_pattern(const MlaPatternArgsT<float>& a) { mla_pattern_t(a); }

}  // namespace atlas::cuda::ref
