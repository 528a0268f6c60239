// Launchers for the row-wise and elementwise kernels: RMSNorm, RoPE, SiLU gate, add, router,
// MoE permutation / gather / combine. The templated ones run on bf16 (uint16_t) or f32 (the
// checking mode): one implementation per op, two public overloads.
#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <string>
#include <type_traits>
#include <utility>

#include "backend/cuda/cuda_internal.h"
#include "backend/cuda/kernels/argmax.cuh"
#include "backend/cuda/kernels/copy_rows.cuh"
#include "backend/cuda/kernels/elementwise.cuh"
#include "backend/cuda/kernels/l2_prefetch.cuh"
#include "backend/cuda/kernels/latent_cache.cuh"
#include "backend/cuda/kernels/moe.cuh"
#include "backend/cuda/kernels/rmsnorm.cuh"
#include "backend/cuda/kernels/router.cuh"

namespace atlas::cuda {

using namespace detail;

namespace detail {

bool wide_norm_setting(const char* value) { return switch_setting("ATLAS_WIDE_NORM", value, true); }

}  // namespace detail

namespace {

std::atomic<int64_t> g_dropped_sum_norms{0};  // add_rmsnorm launches with Sum::dropped (tests)
std::atomic<int64_t> g_argmax_run_outputs{0};  // argmax launches with run_outputs (tests)
std::atomic<int64_t> g_edit_rows{0};           // edit_rows launches (tests)

// The wide norms (one 1024-thread block per row) for few rows: a decode step's norms are single
// rows whose 256-thread blocks were instruction chains; many rows fill the GPU either way.
bool use_wide_norm(int rows, int dim) {
  static const bool on = wide_norm_setting(std::getenv("ATLAS_WIDE_NORM"));
  return on && rows <= kWideNormMaxRows && dim <= kern::kWideDim;
}

// One block per row: the wide kernel (kWideThreads) where use_wide_norm says so, else the
// 256-thread one; both take the same arguments.
template <class Wide, class Narrow, class... Args>
void launch_row_norm(int rows, int dim, Wide wide, Narrow narrow, cudaStream_t stream, Args&&... args) {
  if (use_wide_norm(rows, dim))
    launch(wide, unsigned(rows), kern::kWideThreads, 0, stream, std::forward<Args>(args)...);
  else
    launch(narrow, unsigned(rows), kern::kReduceThreads, 0, stream, std::forward<Args>(args)...);
}

template <class T>
void rmsnorm_impl(const RmsNormArgsT<T>& a) {
  const char* op = "rmsnorm";
  require(a.rows >= 0, op, "rows", "must be >= 0");
  require(a.dim > 0, op, "dim", "must be > 0");
  const int64_t xs = a.x_stride ? a.x_stride : a.dim, os = a.out_stride ? a.out_stride : a.dim;
  require(xs >= a.dim && os >= a.dim, op, "stride", "row stride smaller than dim");
  require(a.x && a.weight && a.out, op, "pointers", "x, weight and out must be set");
  if (a.rows == 0) return;
  // The kernel writes x only in its fused-add form.
  // ATLAS_RELEASE_FIRST=norm: the wide kernel releases the next launch first (kernels/pdl.cuh).
  static const bool rf = release_first(kRfNorm);
  const auto wide = rf ? kern::rmsnorm_wide_kernel<T, false, true> : kern::rmsnorm_wide_kernel<T, false, false>;
  launch_row_norm(a.rows, a.dim, wide, kern::rmsnorm_kernel<T, false>, stream_of(a.stream), a.x, nullptr, a.weight,
                  a.out, nullptr, a.dim, xs, os, a.eps);
  check_launch(op);
}

template <class T>
void add_rmsnorm_impl(const AddRmsNormArgsT<T>& a) {
  const char* op = "add_rmsnorm";
  require(a.rows >= 0, op, "rows", "must be >= 0");
  require(a.dim > 0, op, "dim", "must be > 0");
  require(a.x && a.y && a.weight && a.out, op, "pointers", "x, y, weight and out must be set");
  require(a.out != a.x && a.out != a.y, op, "out", "must not alias x or y");
  using Sum = typename AddRmsNormArgsT<T>::Sum;
  T* sum = a.x;
  if (a.sum == Sum::to_sum_out) {
    require(a.sum_out && a.sum_out != a.x && a.sum_out != a.y && a.sum_out != a.out, op, "sum_out",
            "must be set and must not alias x, y or out");
    sum = a.sum_out;
  } else if (a.sum == Sum::dropped) {
    sum = nullptr;
    g_dropped_sum_norms.fetch_add(1, std::memory_order_relaxed);
  } else {
    require(a.sum == Sum::in_place, op, "sum", "must be in_place, to_sum_out or dropped");
  }
  require(sum == a.x || use_wide_norm(a.rows, a.dim), op, "sum",
          "a sum out of place or dropped needs the wide kernel (rows <= " + std::to_string(kWideNormMaxRows) +
              ", dim <= " + std::to_string(kern::kWideDim) + ", ATLAS_WIDE_NORM not 0)");
  if (a.rows == 0) return;
  static const bool rf = release_first(kRfNorm);  // as rmsnorm_impl
  const auto wide = rf ? kern::rmsnorm_wide_kernel<T, true, true> : kern::rmsnorm_wide_kernel<T, true, false>;
  launch_row_norm(a.rows, a.dim, wide, kern::rmsnorm_kernel<T, true>, stream_of(a.stream), a.x, a.y, a.weight, a.out,
                  sum, a.dim, a.dim, a.dim, a.eps);
  check_launch(op);
}

template <class T>
kern::RopeJob<T> rope_job(const RopeArgsT<T>& a) {
  const char* op = "rope";
  require(a.rope_dim > 0 && a.rope_dim % 2 == 0, op, "rope_dim", "must be even and > 0");
  require(a.tokens >= 0 && a.heads > 0, op, "tokens/heads", "tokens >= 0, heads > 0");
  require(a.max_positions > 0, op, "max_positions", "must be > 0");
  require(a.x && a.positions && a.cos && a.sin, op, "pointers", "x, positions, cos, sin must be set");
  if (!a.out) return {a.x, a.x, a.heads, a.token_stride, a.head_stride, a.token_stride, a.head_stride};
  return {a.x, a.out, a.heads, a.token_stride, a.head_stride, a.out_token_stride ? a.out_token_stride : a.token_stride,
          a.out_head_stride ? a.out_head_stride : a.head_stride};
}

// b = null: one job.
template <class T>
void rope_impl(const RopeArgsT<T>& a, const RopeArgsT<T>* b) {
  const char* op = "rope";
  const kern::RopeJob<T> j0 = rope_job(a);
  kern::RopeJob<T> j1{nullptr, nullptr, 0, 0, 0, 0, 0};
  if (b) {
    j1 = rope_job(*b);
    require(b->tokens == a.tokens && b->rope_dim == a.rope_dim && b->positions == a.positions && b->cos == a.cos &&
                b->sin == a.sin && b->max_positions == a.max_positions && b->stream == a.stream,
            op, "second job", "must share tokens, rope_dim, positions, tables and stream with the first");
  }
  const int half = a.rope_dim / 2;
  const int64_t total = int64_t(a.tokens) * (j0.heads + j1.heads) * half;
  if (total == 0) return;
  launch(kern::rope_kernel<T>, blocks_for(total, 256), 256, 0, stream_of(a.stream),
      j0, j1, a.tokens, half, a.positions, a.cos, a.sin, a.max_positions, error_flag());
  check_launch(op);
}

template <class T>
void silu_gate_impl(const SiluGateArgsT<T>& a) {
  const char* op = "silu_gate";
  require(a.rows >= 0 && a.width > 0, op, "rows/width", "rows >= 0, width > 0");
  const int64_t st = a.in_stride ? a.in_stride : a.width;
  require(st >= a.width, op, "in_stride", "smaller than width");
  require(a.gate && a.up && a.out, op, "pointers", "gate, up and out must be set");
  const int64_t n = int64_t(a.rows) * a.width;
  if (n == 0) return;
  launch(kern::silu_gate_kernel<T>, blocks_for(n, 256), 256, 0, stream_of(a.stream), a.gate, a.up, a.out,
                                                                                  a.rows, a.width, st);
  check_launch(op);
}

template <class T>
void argmax_impl(const ArgmaxArgsT<T>& a) {
  const char* op = "argmax";
  require(a.rows >= 0, op, "rows", "must be >= 0");
  require(a.vocab > 0, op, "vocab", "must be > 0");
  const int64_t st = a.stride ? a.stride : a.vocab;
  require(st >= a.vocab, op, "stride", "smaller than vocab");
  require(a.logits && a.out, op, "pointers", "logits and out must be set");
  require(!a.counters == !a.partials, op, "counters", "counters and partials go together");
  require(!a.counters || a.rows <= 65535, op, "rows", "at most 65535 with counters (the grid's y)");
  kern::RunOut run{nullptr, nullptr, nullptr, nullptr, 1};
  if (const RunOutputsArgs* ro = a.run_outputs) {
    require(a.rows == 1 && ro->batch == 1, op, "run_outputs", "needs one row (the step's error flag is the row's)");
    require(ro->tokens == a.out, op, "run_outputs.tokens", "must be the argmax's out");
    require(ro->ring > 0 && ro->state && ro->prev && ro->out && ro->err, op, "run_outputs",
            "state, prev, out and err must be set, ring > 0");
    run = {ro->state, ro->prev, ro->out, ro->err, ro->ring};
  }
  if (a.rows == 0) return;
  if (a.counters)
    launch(kern::argmax_split_kernel<T>,
           dim3(unsigned((a.vocab + kern::kArgmaxSplitElems - 1) / kern::kArgmaxSplitElems), unsigned(a.rows)),
           kern::kArgmaxSplitThreads, 0, stream_of(a.stream), a.logits, a.out, a.vocab, st, a.counters,
           a.partials, error_flag(), run);
  else
    launch(kern::argmax_kernel<T>, unsigned(a.rows), kern::kArgmaxThreads, 0, stream_of(a.stream),
        a.logits, a.out, a.vocab, st, error_flag(), run);
  check_launch(op);
  if (run.prev) g_argmax_run_outputs.fetch_add(1, std::memory_order_relaxed);
}

}  // namespace

int64_t argmax_run_outputs_launches() { return g_argmax_run_outputs.load(); }
int64_t edit_rows_launches() { return g_edit_rows.load(); }

size_t argmax_partial_ints(int64_t rows, int64_t vocab) {
  return size_t(rows) * 2 * size_t((vocab + kern::kArgmaxSplitElems - 1) / kern::kArgmaxSplitElems);
}

namespace {

template <class T>
void copy_rows_impl(const CopyRowsArgsT<T>& a) {
  const char* op = "copy_rows";
  require(a.rows >= 0 && a.rows <= 0x7fffffff, op, "rows", "must be in [0, 2^31)");
  require(a.width > 0, op, "width", "must be > 0");
  const int64_t ss = a.src_stride ? a.src_stride : a.width, ds = a.dst_stride ? a.dst_stride : a.width;
  require(ss >= a.width && ds >= a.width, op, "stride", "row stride smaller than width");
  require(a.src_limit > 0 && a.dst_limit > 0, op, "limits", "src_limit and dst_limit must be > 0");
  require(a.src && a.dst, op, "pointers", "src and dst must be set");
  if (a.rows == 0) return;
  launch(kern::copy_rows_kernel<T>, unsigned(a.rows), 128, 0, stream_of(a.stream),
      a.src, a.dst, a.src_rows, a.dst_rows, a.width, ss, ds, a.src_limit, a.dst_limit, error_flag());
  check_launch(op);
}

template <class T>
void edit_rows_impl(const RowEditArgsT<T>& a) {
  const char* op = "edit_rows";
  require(a.n >= 0 && a.n <= 0x7fffffff, op, "n", "must be in [0, 2^31)");
  require(a.width > 0, op, "width", "must be > 0");
  require(a.limit > 0, op, "limit", "must be > 0");
  require(a.op == RowEditOp::Zero || a.op == RowEditOp::Scale || a.op == RowEditOp::Add, op, "op", "zero, scale or add");
  require(a.x && a.rows && (a.op != RowEditOp::Add || a.src), op, "pointers", "x, rows (and src for add) must be set");
  if (a.n == 0) return;
  g_edit_rows.fetch_add(1);
  launch(kern::edit_rows_kernel<T>, unsigned(a.n), 256, 0, stream_of(a.stream), a.x, a.limit, a.width, a.rows,
         int(a.op), a.factor, a.op == RowEditOp::Add ? a.src : nullptr, a.src_per_row ? 1 : 0, error_flag());
  check_launch(op);
}

}  // namespace

namespace detail {

// latent_to_cache's checks and kernel parameters (also gemm_with_latent's, gemm.cu).
template <class T>
kern::LatentCacheParams<T> latent_cache_params(const LatentCacheArgsT<T>& a) {
  const char* op = "latent_to_cache";
  require(a.tokens >= 0, op, "tokens", "must be >= 0");
  require(a.latent > 0, op, "latent", "must be > 0");
  require(a.rope_dim > 0 && a.rope_dim % 2 == 0, op, "rope_dim", "must be even and > 0");
  require(a.heads > 0, op, "heads", "must be > 0");
  const int64_t width = int64_t(a.latent) + a.rope_dim, ls = a.lat_stride ? a.lat_stride : width;
  require(ls >= width, op, "lat_stride", "smaller than latent + rope_dim");
  require(a.cache_rows > 0 && a.max_positions > 0, op, "limits", "cache_rows and max_positions must be > 0");
  require(a.lat && a.norm_weight && a.cache && a.dst_rows && a.q && a.q_out && a.positions && a.cos && a.sin, op,
          "pointers", "lat, norm_weight, cache, dst_rows, q, q_out, positions, cos and sin must be set");
  return {.lat = a.lat, .norm_w = a.norm_weight, .cache = a.cache, .dst_rows = a.dst_rows,
          .cache_rows = a.cache_rows, .lat_stride = ls, .latent = a.latent,
          .half = a.rope_dim / 2, .eps = a.eps, .q = a.q, .q_out = a.q_out,
          .heads = a.heads, .q_ts = a.q_token_stride, .q_hs = a.q_head_stride,
          .qo_ts = a.q_out_token_stride, .qo_hs = a.q_out_head_stride,
          .positions = a.positions, .cos_t = a.cos, .sin_t = a.sin,
          .max_positions = a.max_positions, .error_flag = error_flag(),
          // ATLAS_RELEASE_FIRST=latent (the wide kernel only)
          .release_first = release_first(kRfLatent) ? 1 : 0};
}
template kern::LatentCacheParams<uint16_t> latent_cache_params(const LatentCacheArgsT<uint16_t>&);
template kern::LatentCacheParams<float> latent_cache_params(const LatentCacheArgsT<float>&);

}  // namespace detail

namespace {

template <class T>
void latent_to_cache_impl(const LatentCacheArgsT<T>& a) {
  const kern::LatentCacheParams<T> p = latent_cache_params(a);
  if (a.tokens == 0) return;
  launch_row_norm(a.tokens, a.latent, kern::latent_cache_wide_kernel<T>, kern::latent_cache_kernel<T>,
                  stream_of(a.stream), p);
  check_launch("latent_to_cache");
}

template <class T>
void add_impl(const AddArgsT<T>& a) {
  const char* op = sizeof(T) == 2 ? "add_bf16" : "add_f32";
  require(a.n >= 0, op, "n", "must be >= 0");
  require(a.a && a.b && a.out, op, "pointers", "a, b and out must be set");
  if (a.n == 0) return;
  launch(kern::add_kernel<T>, blocks_for(a.n, 256), 256, 0, stream_of(a.stream), a.a, a.b, a.out, a.n);
  check_launch(op);
}

template <class T>
void moe_gather_impl(const MoeGatherArgsT<T>& a) {
  const char* op = "moe_gather";
  require(a.rows >= 0 && a.dim > 0, op, "rows/dim", "rows >= 0, dim > 0");
  require(a.x && a.sorted_token && a.x_sorted, op, "pointers", "x, sorted_token, x_sorted must be set");
  const int64_t n = int64_t(a.rows) * a.dim;
  if (n == 0) return;
  launch(kern::moe_gather_kernel<T>, blocks_for(n, 256), 256, 0, stream_of(a.stream), a.x, a.sorted_token,
                                                                                   a.x_sorted, a.rows, a.dim);
  check_launch(op);
}

template <class T>
void moe_combine_impl(const MoeCombineArgsT<T>& a) {
  const char* op = "moe_combine";
  require(a.tokens >= 0 && a.k > 0 && a.dim > 0, op, "tokens/k/dim", "tokens >= 0, k > 0, dim > 0");
  require(a.y_sorted && a.pair_slot && a.topk_weights && a.out, op, "pointers",
          "y_sorted, pair_slot, topk_weights, out must be set");
  require(!a.addend == !a.sum_out, op, "addend/sum_out", "set both or neither");
  const int64_t n = int64_t(a.tokens) * a.dim;
  if (n == 0) return;
  launch(kern::moe_combine_kernel<T>, blocks_for(n, 256), 256, 0, stream_of(a.stream),
      a.y_sorted, a.pair_slot, a.topk_weights, a.out, a.tokens, a.k, a.dim, a.addend, a.sum_out);
  check_launch(op);
}

template <class T>
void moe_combine_add_rmsnorm_impl(const MoeCombineNormArgsT<T>& a) {
  const char* op = "moe_combine_add_rmsnorm";
  require(a.tokens >= 0 && a.dim > 0, op, "tokens/dim", "tokens >= 0, dim > 0");
  require(a.k > 0 && a.k <= kern::kCombineMaxK, op, "k", "must be in 1-16");
  require(a.y_sorted && a.pair_slot && a.topk_weights && a.x && a.weight && a.out, op, "pointers",
          "y_sorted, pair_slot, topk_weights, x, weight and out must be set");
  require(a.out != a.x, op, "out", "must not alias x");
  if (a.tokens == 0) return;
  const auto a16 = [](const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; };
  const auto run = [&](auto kernel, int threads = kern::kReduceThreads) {
    launch(kernel, unsigned(a.tokens), threads, 0, stream_of(a.stream), a.y_sorted, a.pair_slot, a.topk_weights,
           a.k, a.addend, a.x, a.weight, a.out, a.dim, a.eps);
  };
  // The wide kernels (one 1024-thread block per token): bf16 rows of even width on 4-byte
  // boundaries take the paired one (ATLAS_MOE_COMBINE_PAIRS=0: the unpaired one; the same bits).
  // They release the next launch before their wait (kern::pdl_begin_rf; ATLAS_RELEASE_FIRST
  // names "combine" by default, session 27: 2303.5 vs 2334.7 us per step on the H200, s27-1): the
  // caller's next kernel is a GEMM that reads only weights before its own wait (moe(): the next
  // layer's q|kv_a or the LM head), whose blocks then stage them during the down GEMMs' tail.
  static const bool pairs_on = env_switch("ATLAS_MOE_COMBINE_PAIRS", true);
  static const bool rf = release_first(kRfCombine);
  const auto run_wide = [&](auto waits_first, auto releases_first) {
    rf ? run(releases_first, kern::kWideThreads) : run(waits_first, kern::kWideThreads);
  };
  const auto a4 = [](const void* p) { return (reinterpret_cast<uintptr_t>(p) & 3u) == 0; };
  const bool wide = a.k <= kern::kCombineStageK && use_wide_norm(a.tokens, a.dim);
  if (wide) {
    if constexpr (std::is_same_v<T, uint16_t>) {
      if (pairs_on && a.dim % 2 == 0 && a4(a.y_sorted) && a4(a.x) && a4(a.weight) && a4(a.out) &&
          (!a.addend || a4(a.addend))) {
        using namespace kern;
        if (a.k == 6)
          run_wide(moe_combine_add_rmsnorm_pairs_kernel<6, false>, moe_combine_add_rmsnorm_pairs_kernel<6, true>);
        else
          run_wide(moe_combine_add_rmsnorm_pairs_kernel<0, false>, moe_combine_add_rmsnorm_pairs_kernel<0, true>);
        check_launch(op);
        return;
      }
    }
    run_wide(kern::moe_combine_add_rmsnorm_wide_kernel<T, false>, kern::moe_combine_add_rmsnorm_wide_kernel<T, true>);
  } else if constexpr (std::is_same_v<T, uint16_t>) {
    const bool stage = a.k <= kern::kCombineStageK && a.dim <= kern::kCombineStageDim && a.dim % 8 == 0 &&
                       a16(a.y_sorted) && (!a.addend || a16(a.addend));
    stage ? run(kern::moe_combine_add_rmsnorm_kernel<T, true>) : run(kern::moe_combine_add_rmsnorm_kernel<T, false>);
  } else {
    run(kern::moe_combine_add_rmsnorm_kernel<T, false>);
  }
  check_launch(op);
}

}  // namespace

void moe_combine_add_rmsnorm(const MoeCombineNormArgsT<uint16_t>& a) { moe_combine_add_rmsnorm_impl(a); }
void moe_combine_add_rmsnorm(const MoeCombineNormArgsT<float>& a) { moe_combine_add_rmsnorm_impl(a); }
void rmsnorm(const RmsNormArgs& a) { rmsnorm_impl(a); }
void rmsnorm(const RmsNormArgsT<float>& a) { rmsnorm_impl(a); }
void add_rmsnorm(const AddRmsNormArgsT<uint16_t>& a) { add_rmsnorm_impl(a); }
void add_rmsnorm(const AddRmsNormArgsT<float>& a) { add_rmsnorm_impl(a); }
int64_t add_rmsnorm_dropped_sum_launches() { return g_dropped_sum_norms.load(); }
bool wide_row_norm(int rows, int dim) { return use_wide_norm(rows, dim); }
void rope_inplace(const RopeArgs& a) { rope_impl(a, static_cast<const RopeArgs*>(nullptr)); }
void rope_inplace(const RopeArgsT<float>& a) { rope_impl(a, static_cast<const RopeArgsT<float>*>(nullptr)); }
void rope2(const RopeArgs& a, const RopeArgs& b) { rope_impl(a, &b); }
void rope2(const RopeArgsT<float>& a, const RopeArgsT<float>& b) { rope_impl(a, &b); }
void silu_gate(const SiluGateArgs& a) { silu_gate_impl(a); }
void silu_gate(const SiluGateArgsT<float>& a) { silu_gate_impl(a); }
void argmax(const ArgmaxArgs& a) { argmax_impl(a); }
void argmax(const ArgmaxArgsT<float>& a) { argmax_impl(a); }
void copy_rows(const CopyRowsArgs& a) { copy_rows_impl(a); }
void copy_rows(const CopyRowsArgsT<float>& a) { copy_rows_impl(a); }
void edit_rows(const RowEditArgsT<uint16_t>& a) { edit_rows_impl(a); }
void edit_rows(const RowEditArgsT<float>& a) { edit_rows_impl(a); }
void latent_to_cache(const LatentCacheArgsT<uint16_t>& a) { latent_to_cache_impl(a); }
void latent_to_cache(const LatentCacheArgsT<float>& a) { latent_to_cache_impl(a); }
void add(const AddArgs& a) { add_impl(a); }
void add(const AddArgsT<float>& a) { add_impl(a); }
void moe_gather(const MoeGatherArgs& a) { moe_gather_impl(a); }
void moe_gather(const MoeGatherArgsT<float>& a) { moe_gather_impl(a); }
void moe_combine(const MoeCombineArgs& a) { moe_combine_impl(a); }
void moe_combine(const MoeCombineArgsT<float>& a) { moe_combine_impl(a); }

void l2_prefetch(const L2PrefetchArgs& a) {
  const char* op = "l2_prefetch";
  kern::L2PrefetchParams p;
  int64_t units = 0;
  const int64_t unit = a.how == L2PrefetchHow::bulk ? kern::kL2PrefetchPiece : kern::kL2PrefetchLine;
  for (int i = 0; i < kern::kL2PrefetchRanges; ++i) {
    if (a.bytes[i] == 0) continue;
    const std::string f = "ranges[" + std::to_string(i) + "]";
    require(a.ptr[i] != nullptr, op, f.c_str(), "bytes without a pointer");
    require(a.bytes[i] > 0 && a.bytes[i] % 128 == 0, op, f.c_str(),
            "bytes must be a positive multiple of 128, got " + std::to_string(a.bytes[i]));
    require(reinterpret_cast<uintptr_t>(a.ptr[i]) % 16 == 0, op, f.c_str(), "the base must be 16-byte aligned");
    p.base[p.ranges] = static_cast<const char*>(a.ptr[i]);
    p.bytes[p.ranges] = a.bytes[i];
    ++p.ranges;
    units += (a.bytes[i] + unit - 1) / unit;
  }
  require(a.blocks >= 0, op, "blocks", "must be >= 0");
  if (p.ranges == 0) return;
  p.how = (a.how == L2PrefetchHow::bulk ? 0 : 2) + (a.evict_last ? 1 : 0);
  // Bulk: one warp per block (a few threads issue the copy engine's requests); lines: 256 threads.
  const int threads = a.how == L2PrefetchHow::bulk ? 32 : 256;
  const int64_t want = (units + threads - 1) / threads;
  const int blocks = int(std::max<int64_t>(1, std::min<int64_t>(want, a.blocks > 0 ? a.blocks : 32)));
  launch(kern::l2_prefetch_kernel, unsigned(blocks), unsigned(threads), 0, stream_of(a.stream), p);
  check_launch(op);
}

namespace {

void check_router(const RouterArgs& a) {
  const char* op = "router";
  require(a.experts > 0 && a.experts <= kern::kRouterMaxExperts, op, "experts",
          "must be in [1, " + std::to_string(kern::kRouterMaxExperts) + "], got " + std::to_string(a.experts));
  require(a.k > 0 && a.k <= kern::kRouterMaxK && a.k <= a.experts, op, "k",
          "must be in [1, min(experts, " + std::to_string(kern::kRouterMaxK) + ")], got " + std::to_string(a.k));
  const bool grouped = a.method == TopkMethod::group_limited_greedy;
  if (grouped) {
    require(a.n_group > 0 && a.n_group <= kern::kRouterMaxGroups && a.experts % a.n_group == 0, op,
            "n_group", "must divide experts and be <= " + std::to_string(kern::kRouterMaxGroups));
    require(a.topk_group > 0 && a.topk_group <= a.n_group, op, "topk_group", "must be in [1, n_group]");
    require(a.k <= a.topk_group * (a.experts / a.n_group), op, "k", "more than the kept groups hold");
  }
  require(a.tokens >= 0, op, "tokens", "must be >= 0");
  require(a.logits && a.topk_ids && a.topk_weights, op, "pointers", "logits, topk_ids, topk_weights must be set");
}

void check_permute(const MoePermuteArgs& a) {
  const char* op = "moe_permute";
  require(a.experts > 0 && a.experts <= 1024, op, "experts", "must be in [1, 1024]");
  require(a.k > 0 && a.k <= kern::kMoeMaxK, op, "k", "must be in [1, 16]");
  require(a.tokens >= 0, op, "tokens", "must be >= 0");
  require(a.topk_ids && a.counts && a.offsets && a.sorted_token && a.pair_slot && a.workspace, op,
          "pointers", "topk_ids, counts, offsets, sorted_token, pair_slot, workspace must be set");
}

// The launches of router() and moe_permute() for checked arguments (moe_route's fallback has
// checked them already).
void launch_router(const RouterArgs& a) {
  const char* op = "router";
  if (a.tokens == 0) return;
  launch(kern::router_kernel, blocks_for(a.tokens, kern::kRouterWarps), 32 * kern::kRouterWarps, 0, stream_of(a.stream),
      a.logits, a.topk_ids, a.topk_weights, a.scores, a.tokens, a.experts, a.k,
      a.method == TopkMethod::group_limited_greedy ? 1 : 0,
      a.n_group, a.topk_group, a.norm_topk_prob ? 1 : 0, a.routed_scaling_factor);
  check_launch(op);
}

void launch_permute(const MoePermuteArgs& a) {
  const char* op = "moe_permute";
  cudaStream_t s = stream_of(a.stream);
  const int chunks = int((int64_t(a.tokens) + kern::kMoeChunk - 1) / kern::kMoeChunk);
  if (chunks == 1) {  // one launch instead of three (a decode step's routes)
    const size_t smem = size_t(2 + kern::kMoeChunk / 32) * size_t(a.experts) * sizeof(int32_t);  // <= 40 KB
    launch(kern::moe_permute_one_chunk_kernel, 1, kern::kMoeChunk, smem, s, a.topk_ids, a.tokens, a.k, a.experts,
           a.counts, a.offsets, a.sorted_token, a.pair_slot, error_flag());
    check_launch(op);
    return;
  }
  if (chunks > 0) {
    launch(kern::moe_count_kernel, chunks, kern::kMoeChunk, a.experts * sizeof(int32_t), s,
        a.topk_ids, a.tokens, a.k, a.experts, a.workspace, error_flag());
    check_launch(op);
  }
  const int scan_threads = ((a.experts + 31) / 32) * 32;
  launch(kern::moe_scan_kernel, 1, scan_threads, 0, s, a.workspace, chunks, a.experts, a.counts, a.offsets);
  check_launch(op);
  if (chunks > 0) {
    const size_t smem = size_t(1 + kern::kMoeChunk / 32) * size_t(a.experts) * sizeof(int32_t);  // <= 36 KB
    launch(kern::moe_scatter_kernel, chunks, kern::kMoeChunk, smem, s, a.topk_ids, a.tokens, a.k, a.experts,
                                                      a.workspace, a.sorted_token, a.pair_slot);
    check_launch(op);
  }
}

}  // namespace

size_t moe_permute_workspace_ints(int tokens, int experts) {
  const int64_t chunks = (int64_t(std::max(tokens, 0)) + kern::kMoeChunk - 1) / kern::kMoeChunk;
  return size_t(std::max<int64_t>(chunks, 1) * std::max(experts, 1));
}

void router(const RouterArgs& a) {
  check_router(a);
  launch_router(a);
}

void moe_permute(const MoePermuteArgs& a) {
  check_permute(a);
  launch_permute(a);
}

void moe_route(const RouterArgs& r, const MoePermuteArgs& p) {
  const char* op = "moe_route";
  detail::check_route(r, p, op);
  if (r.tokens < 1 || r.tokens > kMoeRouteFusedMaxTokens) {
    launch_router(r);
    launch_permute(p);
    return;
  }
  const kern::RoutePermuteParams q = detail::route_permute_params(r, p);
  // experts <= 256 (the router's bound): <= 10 KB, with the router's 16.5 KB of static scratch
  const size_t smem = size_t(2 + kern::kMoeChunk / 32) * size_t(r.experts) * sizeof(int32_t);
  launch(kern::route_permute_kernel, 1, kern::kMoeChunk, smem, stream_of(r.stream), q);
  check_launch(op);
}

namespace detail {
kern::RoutePermuteParams route_permute_params(const RouterArgs& r, const MoePermuteArgs& p) {
  return kern::RoutePermuteParams{.logits = r.logits,
                                   .ids = r.topk_ids,
                                   .weights = r.topk_weights,
                                   .scores = r.scores,
                                   .tokens = r.tokens,
                                   .E = r.experts,
                                   .k = r.k,
                                   .grouped = r.method == TopkMethod::group_limited_greedy ? 1 : 0,
                                   .n_group = r.n_group,
                                   .topk_group = r.topk_group,
                                   .norm_topk_prob = r.norm_topk_prob ? 1 : 0,
                                   .scaling = r.routed_scaling_factor,
                                   .counts = p.counts,
                                   .offsets = p.offsets,
                                   .sorted_token = p.sorted_token,
                                   .pair_slot = p.pair_slot,
                                   .error_flag = error_flag(),
                                   .release_first = release_first(kRfRoute) ? 1 : 0};  // ATLAS_RELEASE_FIRST=route
}

void check_route(const RouterArgs& r, const MoePermuteArgs& p, const char* op) {
  check_router(r);
  check_permute(p);
  require(p.topk_ids == r.topk_ids && p.tokens == r.tokens && p.k == r.k && p.experts == r.experts &&
              p.stream == r.stream,
          op, "permute", "must permute the router's topk_ids (the same tokens, k, experts and stream)");
}
}  // namespace detail

}  // namespace atlas::cuda
