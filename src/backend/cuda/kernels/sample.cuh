// Sampling on the device: one block of kSampleThreads threads per row draws the token of
// docs/decoding.md from the row's logits (bf16 widened exactly, or f32), bit-identical to
// decode::RowSampler on the host. The algorithm is decode/sample_core.h's sample_row(), step
// for step; only the loops are spread over the block:
//   - per-element math (temperature, keys, exp_f32, probabilities) is the core's __host__
//     __device__ code, so each element gets the same bits;
//   - counts and exact sums are integers (carry-save limbs), accumulated with shared-memory
//     atomics: the order does not matter. Each thread first sums a run of elements that fall
//     in the same bucket and flushes on a change, so the one dominant bucket of a level does
//     not serialise 100k atomics on one address;
//   - the bucket choices (top-k from the top, top-p from the bottom) are the core's decisions
//     on those exact histograms (top-p's scan over 256 buckets by one warp: an exact prefix
//     scan of the bucket sums across lanes, then the first lane with a non-removable bucket);
//   - the draw compacts each 1024-id chunk's survivors in id order (warp ballots) and one
//     thread adds their float32 probabilities in ascending id, chunk after chunk, so the
//     running sum is the host's sequence of float32 additions.
// Per-row global workspace: key [V] u32, e [V] f32, prob [V] f32 (L2-resident at V = 102400).
#pragma once

#include <cstdint>

#include "backend/cuda/kernels/common.cuh"
#include "decode/sample_core.h"

namespace atlas::cuda::kern {

namespace sc = atlas::sample_core;
constexpr int kSampleThreads = 1024;

// A run of elements in one bucket, flushed to the shared histogram when the bucket changes.
struct BucketRun {
  int d = -1;
  unsigned n = 0;
  sc::Acc acc;
  __device__ void flush(unsigned* cnt, unsigned long long (*sums)[sc::kLimbs], bool with_sums) {
    if (n) {
      atomicAdd(&cnt[d], n);
      if (with_sums)
        for (int l = 0; l < sc::kLimbs; ++l)
          if (acc.w[l]) atomicAdd(&sums[d][l], (unsigned long long)acc.w[l]);
    }
    n = 0;
    sc::acc_zero(acc);
  }
};

__device__ __forceinline__ void acc_flush(const sc::Acc& a, unsigned long long* dst) {
  for (int l = 0; l < sc::kLimbs; ++l)
    if (a.w[l]) atomicAdd(&dst[l], (unsigned long long)a.w[l]);
}

template <class T>
__global__ void __launch_bounds__(kSampleThreads)
    sample_kernel(const T* __restrict__ logits, int64_t stride, int vocab, const sc::RowParams* __restrict__ params,
                  int32_t* __restrict__ out, uint32_t* __restrict__ workspace) {
  pdl_begin();
  const int row = blockIdx.x, tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const sc::RowParams p = params[row];
  if (p.mode != sc::kSample) return;  // a greedy row keeps its argmax
  const T* x = logits + int64_t(row) * stride;
  uint32_t* key = workspace + int64_t(row) * 3 * vocab;
  float* e = reinterpret_cast<float*>(key + vocab);
  float* prob = e + vocab;

  __shared__ unsigned long long s_err, s_max_comp;
  __shared__ unsigned s_max_key;
  __shared__ unsigned s_cnt[256];
  __shared__ unsigned long long s_sums[256][sc::kLimbs];
  __shared__ unsigned long long s_tot[sc::kLimbs];
  __shared__ sc::Acc s_base;
  __shared__ long long s_krem;
  __shared__ int s_pick, s_found, s_last;
  __shared__ int s_wcount[kSampleThreads / 32];
  __shared__ float s_q[kSampleThreads];
  __shared__ int s_id[kSampleThreads];

  // 1. temperature, validation (the lowest offending index, as the host reports), keys.
  if (tid == 0) {
    s_err = ~0ull;
    s_max_key = 0;
    s_max_comp = 0;
    s_krem = p.top_k;
  }
  __syncthreads();
  {
    unsigned long long err = ~0ull;
    uint32_t mk = 0;
    const float inf = __int_as_float(0x7f800000);
    for (int i = tid; i < vocab; i += kSampleThreads) {
      const float xi = to_f32(x[i]);
      unsigned code = 0;
      if (xi != xi) {
        code = sc::kNanLogit;
      } else if (xi == inf) {
        code = sc::kPosInfLogit;
      } else {
        const float s = sc::fdiv(xi, p.temperature);
        if (s == inf) {
          code = sc::kOverflow;
        } else {
          const uint32_t k = sc::order_key(s);
          key[i] = k;
          mk = max(mk, k);
        }
      }
      if (code) err = min(err, (static_cast<unsigned long long>(i) << 3) | code);
    }
    if (err != ~0ull) atomicMin(&s_err, err);
    if (mk) atomicMax(&s_max_key, mk);
  }
  __syncthreads();
  if (s_err != ~0ull) {
    if (tid == 0) out[row] = sc::encode_error(int32_t(s_err & 7), int64_t(s_err >> 3));
    return;
  }
  if (s_max_key <= sc::kNegInfKey) {
    if (tid == 0) out[row] = sc::encode_error(sc::kNoFinite, 0);
    return;
  }

  // 2. top-k: radix select of the k-th largest key (duplicates counted), 4 levels of 8 bits.
  uint32_t kth = 0;
  if (sc::topk_active(p.top_k, vocab)) {
    uint64_t prefix = 0;
    for (int level = 0; level < 4; ++level) {
      const int shift = sc::radix_shift(32, level);
      if (tid < 256) s_cnt[tid] = 0;
      __syncthreads();
      BucketRun run;
      for (int i = tid; i < vocab; i += kSampleThreads) {
        const uint32_t k = key[i];
        if (!sc::radix_match(k, prefix, shift)) continue;
        const int d = int(sc::radix_digit(k, shift));
        if (d != run.d) {
          run.flush(s_cnt, s_sums, false);
          run.d = d;
        }
        ++run.n;
      }
      run.flush(s_cnt, s_sums, false);
      __syncthreads();
      if (tid == 0) {
        int64_t k_rem = s_krem;
        s_pick = int(sc::topk_pick(s_cnt, k_rem));
        s_krem = k_rem;
      }
      __syncthreads();
      prefix |= uint64_t(s_pick) << shift;
      __syncthreads();  // s_pick is rewritten at the next level
    }
    kth = uint32_t(prefix);
  }
  auto alive = [&](uint32_t k) { return k > sc::kNegInfKey && k >= kth; };
  const float m = sc::key_value(s_max_key);

  // exp(s - max) of the survivors so far and their exact sum.
  if (tid < sc::kLimbs) s_tot[tid] = 0;
  __syncthreads();
  {
    sc::Acc local;
    sc::acc_zero(local);
    for (int i = tid; i < vocab; i += kSampleThreads) {
      const uint32_t k = key[i];
      float ev = 0.0f;
      if (alive(k)) {
        ev = sc::exp_f32(sc::fsub(sc::key_value(k), m));
        sc::acc_add(local, ev);
      }
      e[i] = ev;
    }
    acc_flush(local, s_tot);
  }
  __syncthreads();
  sc::Acc tot;
  for (int l = 0; l < sc::kLimbs; ++l) tot.w[l] = s_tot[l];
  double S = sc::to_double(sc::normalize(tot));

  // 3. top-p: radix search over the (s, id) order for the cut.
  const bool top_p = p.top_p_on != 0;
  const int idbits = sc::id_bits(vocab), width = 32 + idbits;
  uint64_t cut = 0;
  if (top_p) {
    {
      unsigned long long mc = 0;
      for (int i = tid; i < vocab; i += kSampleThreads) {
        const uint32_t k = key[i];
        float pr = 0.0f;
        if (alive(k)) {
          pr = sc::d2f(sc::ddiv(double(e[i]), S));
          mc = max(mc, (unsigned long long)sc::composite(k, i, idbits));
        }
        prob[i] = pr;
      }
      if (mc) atomicMax(&s_max_comp, mc);
    }
    const sc::TopPBound bound = sc::make_bound(p.top_p_threshold);
    if (tid == 0) sc::acc_zero(s_base);
    uint64_t prefix = 0;
    bool all_removable = false;
    for (int level = 0; level < sc::radix_levels(width); ++level) {
      const int shift = sc::radix_shift(width, level);
      if (tid < 256) {
        s_cnt[tid] = 0;
        for (int l = 0; l < sc::kLimbs; ++l) s_sums[tid][l] = 0;
      }
      __syncthreads();
      BucketRun run;
      sc::acc_zero(run.acc);
      for (int i = tid; i < vocab; i += kSampleThreads) {
        const uint32_t k = key[i];
        if (!alive(k)) continue;
        const uint64_t c = sc::composite(k, i, idbits);
        if (!sc::radix_match(c, prefix, shift)) continue;
        const int d = int(sc::radix_digit(c, shift));
        if (d != run.d) {
          run.flush(s_cnt, s_sums, true);
          run.d = d;
        }
        ++run.n;
        sc::acc_add(run.acc, prob[i]);
      }
      run.flush(s_cnt, s_sums, true);
      __syncthreads();
      if (warp == 0) {
        // Lane L owns buckets 8L .. 8L+7; an exact exclusive scan of the lane sums across the
        // warp gives each lane base + (the sums of all lower buckets).
        sc::Acc mine, incl;
        sc::acc_zero(mine);
        for (int j = 0; j < 8; ++j)
          for (int l = 0; l < sc::kLimbs; ++l) mine.w[l] += s_sums[8 * lane + j][l];
        incl = mine;
        for (int off = 1; off < 32; off <<= 1)
          for (int l = 0; l < sc::kLimbs; ++l) {
            const uint64_t o = __shfl_up_sync(0xffffffffu, incl.w[l], off);
            if (lane >= off) incl.w[l] += o;
          }
        sc::Acc run_sum = s_base;
        for (int l = 0; l < sc::kLimbs; ++l) run_sum.w[l] += incl.w[l] - mine.w[l];
        int found = -1;
        for (int j = 0; j < 8 && found < 0; ++j) {
          const int d = 8 * lane + j;
          if (!s_cnt[d]) continue;
          sc::Acc with = run_sum;
          for (int l = 0; l < sc::kLimbs; ++l) with.w[l] += s_sums[d][l];
          if (!sc::removable(sc::normalize(with), bound))
            found = d;
          else
            run_sum = with;
        }
        const unsigned hits = __ballot_sync(0xffffffffu, found >= 0);
        if (hits == 0) {
          if (lane == 0) s_pick = -1;
        } else if (lane == __ffs(hits) - 1) {
          s_pick = found;
          s_base = run_sum;
        }
      }
      __syncthreads();
      const int pick = s_pick;
      __syncthreads();  // s_pick and the histograms are rewritten at the next level
      if (pick < 0) {
        all_removable = true;  // only at level 0: deeper levels hold a non-removable token
        break;
      }
      prefix |= uint64_t(pick) << shift;
    }
    cut = all_removable ? s_max_comp : prefix;
    // The survivors' own softmax sum.
    if (tid < sc::kLimbs) s_tot[tid] = 0;
    __syncthreads();
    sc::Acc local;
    sc::acc_zero(local);
    for (int i = tid; i < vocab; i += kSampleThreads) {
      const uint32_t k = key[i];
      if (alive(k) && sc::composite(k, i, idbits) >= cut) sc::acc_add(local, e[i]);
    }
    acc_flush(local, s_tot);
    __syncthreads();
    for (int l = 0; l < sc::kLimbs; ++l) tot.w[l] = s_tot[l];
    S = sc::to_double(sc::normalize(tot));
  }

  // 4. the draw: float32 running sum over the survivors in ascending id, u < C in double.
  if (tid == 0) {
    s_found = -1;
    s_last = -1;
  }
  float C = 0.0f;  // thread 0's running sum
  for (int base = 0; base < vocab; base += kSampleThreads) {
    const int i = base + tid;
    float q = 0.0f;
    if (i < vocab) {
      const uint32_t k = key[i];
      if (alive(k) && (!top_p || sc::composite(k, i, idbits) >= cut)) q = sc::d2f(sc::ddiv(double(e[i]), S));
    }
    const bool flag = q > 0.0f;
    const int n = __syncthreads_count(flag);
    if (n == 0) continue;
    const unsigned bal = __ballot_sync(0xffffffffu, flag);
    if (lane == 0) s_wcount[warp] = __popc(bal);
    __syncthreads();
    if (flag) {
      int pos = __popc(bal & ((1u << lane) - 1u));
      for (int w = 0; w < warp; ++w) pos += s_wcount[w];
      s_q[pos] = q;
      s_id[pos] = i;
    }
    __syncthreads();
    if (tid == 0) {
      for (int j = 0; j < n; ++j) {
        C = sc::fadd(C, s_q[j]);
        if (p.u < double(C)) {
          s_found = s_id[j];
          break;
        }
      }
      s_last = s_id[n - 1];
    }
    __syncthreads();
    if (s_found >= 0) break;
  }
  if (tid == 0) out[row] = s_found >= 0 ? s_found : s_last;
}

}  // namespace atlas::cuda::kern
