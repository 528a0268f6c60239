// The CUDA backend's plain C++ API (issue 5): launchers over raw device pointers.
//
// This header includes no CUDA header, so code compiled by the host compiler alone (the CLI,
// the model, tests) can call it. bf16 tensors are uint16_t (the bit pattern, as in core/bf16.h),
// streams are an opaque `void*` (a cudaStream_t; nullptr = the default stream). Every launcher
// checks its arguments and the launch and throws atlas::Error with a message that names the op
// and the field at fault; nothing here fails silently.
//
// Each op has a CPU reference with the same argument struct in reference.h (host pointers);
// tests/cuda compares the two. Rounding contract: docs/cuda.md.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace atlas::cuda {

using Stream = void*;  // cudaStream_t

// ---- runtime ---------------------------------------------------------------------------
// Number of usable CUDA devices; 0 when there is no driver or no GPU (never throws).
int device_count();

struct DeviceInfo {
  std::string name;
  int cc_major = 0, cc_minor = 0;
  int sm_count = 0;
  size_t total_memory = 0;  // bytes
};
DeviceInfo device_info(int device = 0);

void* device_alloc(size_t bytes);  // cudaMalloc; throws with the size asked and free memory found
void device_free(void* p);
void copy_to_device(void* dst, const void* src, size_t bytes);
void copy_to_host(void* dst, const void* src, size_t bytes);
void device_memset(void* dst, int byte, size_t bytes);
void synchronize();
// Kernels that meet bad data only on the device (positions, expert ids, cache lengths) raise a
// device flag instead of trapping; this synchronises, reads and clears it, and throws
// atlas::Error naming the op and field. Call it wherever a host sync happens anyway.
void check_device_errors();

// Device-side timing for benchmarks: two CUDA events around work issued on `stream`.
class EventTimer {
 public:
  EventTimer();
  ~EventTimer();
  EventTimer(const EventTimer&) = delete;
  EventTimer& operator=(const EventTimer&) = delete;
  void start(Stream stream = nullptr);
  float stop_ms(Stream stream = nullptr);  // records the end event, waits for it, milliseconds

 private:
  void* begin_ = nullptr;
  void* end_ = nullptr;
};

// ---- RMSNorm (spec section 5) ------------------------------------------------------------
// out[t] = bf16(w * bf16(x[t] * 1/sqrt(mean(x[t]^2) + eps))), fp32 mean of squares in the fixed
// reduction order of docs/cuda.md (independent of rows, so batch invariant).
struct RmsNormArgs {
  const uint16_t* x = nullptr;       // [rows, dim] bf16, row stride x_stride
  const uint16_t* weight = nullptr;  // [dim] bf16
  uint16_t* out = nullptr;           // [rows, dim] bf16, row stride out_stride (may alias x)
  int rows = 0;
  int dim = 0;
  int64_t x_stride = 0;    // elements; 0 = dim
  int64_t out_stride = 0;  // elements; 0 = dim
  float eps = 1e-6f;
  Stream stream = nullptr;
};
void rmsnorm(const RmsNormArgs& a);

// ---- YaRN RoPE (spec section 3) ----------------------------------------------------------
struct YarnParams {
  int rope_dim = 64;  // rotated width; rope_dim/2 frequencies
  double theta = 10000.0;
  double factor = 40.0;
  int original_max_position = 4096;
  double beta_fast = 32.0;
  double beta_slow = 1.0;
  double mscale = 0.707;
  double mscale_all_dim = 0.707;
};
// inv_freq[k], k < rope_dim/2, fp32, as the official YaRN code computes it.
std::vector<float> yarn_inv_freq(const YarnParams& p);
// cos/sin tables [max_positions, rope_dim/2] as bf16 bits: fp32 angle fp32(p)*inv_freq[k],
// fp32 cos/sin times the amplitude mscale(factor, mscale)/mscale(factor, mscale_all_dim), then
// one rounding to bf16. Built on the host (bit-identical on every machine that has IEEE fp32
// cos/sin from the same libm) and uploaded once.
struct RopeTable {
  int max_positions = 0;
  int half = 0;
  std::vector<uint16_t> cos, sin;  // [max_positions, half]
};
RopeTable build_rope_table(const YarnParams& p, int max_positions);

// Rotates adjacent pairs (x[2k], x[2k+1]) of each head's rope slice in place by angle
// pos*inv_freq[k], with the official bf16 roundings:
//   x[2k]   = bf16(bf16(x[2k]*cos) - bf16(x[2k+1]*sin))
//   x[2k+1] = bf16(bf16(x[2k+1]*cos) + bf16(x[2k]*sin))
struct RopeArgs {
  uint16_t* x = nullptr;  // first rope element of token 0, head 0
  int tokens = 0;
  int heads = 0;
  int64_t token_stride = 0;  // elements between tokens
  int64_t head_stride = 0;   // elements between heads
  int rope_dim = 64;
  const int32_t* positions = nullptr;  // [tokens], each in [0, max_positions)
  const uint16_t* cos = nullptr;       // [max_positions, rope_dim/2] bf16 (device)
  const uint16_t* sin = nullptr;
  int max_positions = 0;
  Stream stream = nullptr;
};
void rope_inplace(const RopeArgs& a);

// ---- SiLU gate: out = bf16(bf16(silu(g)) * u) --------------------------------------------
struct SiluGateArgs {
  const uint16_t* gate = nullptr;  // [rows, width] bf16, row stride in_stride
  const uint16_t* up = nullptr;    // [rows, width] bf16, row stride in_stride
  uint16_t* out = nullptr;         // [rows, width] bf16, dense
  int rows = 0;
  int width = 0;
  int64_t in_stride = 0;  // 0 = width (lets gate/up be the two halves of one fused GEMM output)
  Stream stream = nullptr;
};
void silu_gate(const SiluGateArgs& a);

// ---- bf16 add: out = bf16(a + b) (residual stream, shared + routed) ----------------------
struct AddArgs {
  const uint16_t* a = nullptr;
  const uint16_t* b = nullptr;
  uint16_t* out = nullptr;  // may alias a or b
  int64_t n = 0;
  Stream stream = nullptr;
};
void add_bf16(const AddArgs& a);

// ---- router (spec section 4) --------------------------------------------------------------
// fp32 softmax over the experts, top-k, weights. Output in descending weight order, ties ->
// lower expert id. greedy: top-k of all scores. group_limited_greedy: group score = max of
// the group's scores; keep the topk_group best groups (ties -> lower group id), others 0.0;
// top-k of the masked scores. Weights: norm_topk_prob && k > 1 -> w / (sum w + 1e-20), else
// w * routed_scaling_factor.
enum class TopkMethod { greedy, group_limited_greedy };
struct RouterArgs {
  const float* logits = nullptr;  // [tokens, experts] fp32
  int32_t* topk_ids = nullptr;    // [tokens, k]
  float* topk_weights = nullptr;  // [tokens, k] fp32
  float* scores = nullptr;        // optional [tokens, experts] softmax probs (hooks); may be null
  int tokens = 0;
  int experts = 0;  // <= 256
  int k = 0;        // <= 16
  TopkMethod method = TopkMethod::greedy;
  int n_group = 1;
  int topk_group = 1;
  bool norm_topk_prob = false;
  float routed_scaling_factor = 1.0f;
  Stream stream = nullptr;
};
void router(const RouterArgs& a);

// ---- MoE token permutation ----------------------------------------------------------------
// Stable counting sort of the T*k (token, slot) pairs by expert: inside one expert the pairs
// are in ascending token order, so the layout depends only on the routes (never on timing).
// counts[e] = pairs routed to e; offsets = exclusive scan (offsets[E] = T*k);
// sorted_token[i] = token of the i-th pair in expert order; pair_slot[t*k+j] = its position.
struct MoePermuteArgs {
  const int32_t* topk_ids = nullptr;  // [tokens, k]
  int tokens = 0;
  int k = 0;
  int experts = 0;              // <= 1024
  int32_t* counts = nullptr;    // [experts]
  int32_t* offsets = nullptr;   // [experts + 1]
  int32_t* sorted_token = nullptr;  // [tokens * k]
  int32_t* pair_slot = nullptr;     // [tokens * k]
  int32_t* workspace = nullptr;     // moe_permute_workspace_ints(tokens, experts) int32
  Stream stream = nullptr;
};
size_t moe_permute_workspace_ints(int tokens, int experts);
void moe_permute(const MoePermuteArgs& a);

// x_sorted[i] = x[sorted_token[i]] (bf16 rows), the expert GEMMs' input.
struct MoeGatherArgs {
  const uint16_t* x = nullptr;  // [tokens, dim]
  const int32_t* sorted_token = nullptr;
  uint16_t* x_sorted = nullptr;  // [rows, dim]
  int rows = 0;                  // tokens * k
  int dim = 0;
  Stream stream = nullptr;
};
void moe_gather(const MoeGatherArgs& a);

// out[t] = bf16(sum_{j=0..k-1} w[t,j] * fp32(y_sorted[pair_slot[t*k+j]])): fp32 products and
// sum in the router's k order (a fixed order, one bf16 rounding at the end).
struct MoeCombineArgs {
  const uint16_t* y_sorted = nullptr;  // [tokens*k, dim] expert outputs in expert order
  const int32_t* pair_slot = nullptr;  // [tokens, k]
  const float* topk_weights = nullptr; // [tokens, k]
  uint16_t* out = nullptr;             // [tokens, dim]
  int tokens = 0;
  int k = 0;
  int dim = 0;
  Stream stream = nullptr;
};
void moe_combine(const MoeCombineArgs& a);

// ---- MLA decode attention, absorbed form (spec section 3) -----------------------------------
// One query token per row b: q[b] = [16 heads, 576] = [q~ (512) || q_pe (64)] bf16; the row's
// cache = latent_cache + b*cache_row_stride, [lengths[b], 576] = [c^ (512) || k_pe (64)] bf16.
// Per head: s_j = scale * (q . cache_j) (fp32), p = softmax_j(s) (fp32),
// out[b,h] = bf16(sum_j p_j * c^_j) [512]. The cache is cut into splits of a FIXED size
// (split_tokens, independent of batch size and of other rows), partials are merged in split
// order: a row's result depends only on its own q, cache and length (batch invariant).
struct MlaDecodeArgs {
  const uint16_t* q = nullptr;             // [rows, heads, 576] bf16
  const uint16_t* latent_cache = nullptr;  // row b at + b*cache_row_stride: [len_b, 576] bf16
  int64_t cache_row_stride = 0;            // elements
  const int32_t* lengths = nullptr;        // [rows] device, each in [1, max_length]
  int max_length = 0;                      // host bound used to size the grid and workspace
  uint16_t* out = nullptr;                 // [rows, heads, 512] bf16
  int rows = 0;
  int heads = 16;
  float scale = 0.0f;
  int split_tokens = 256;   // fixed; part of the numerics (changing it changes bits)
  float* workspace = nullptr;  // mla_decode_workspace_floats(...) fp32
  Stream stream = nullptr;
};
constexpr int kMlaLatent = 512, kMlaRope = 64, kMlaWidth = 576;
size_t mla_decode_workspace_floats(int rows, int heads, int max_length, int split_tokens);
void mla_decode(const MlaDecodeArgs& a);

// ---- GEMM: out[M,N] = x[M,K] . W[N,K]^T (PyTorch Linear layout) ----------------------------
// bf16 inputs, fp32 accumulation, bf16 or fp32 output (fp32 for the router logits: products of
// bf16 values are exact in fp32, so this equals the official fp32 GEMM on upcast operands).
//   batch_invariant: atlas's own tiled kernel; every output element is one fp32 FMA chain
//     over k = 0..K-1 in ascending order, whatever M, N or the tile a row lands in, so a row's
//     result is bit-identical for M = 1 or M = 128 (tests/cuda checks it).
//   fast: cuBLASLt (its heuristic's first algorithm); deterministic for a fixed shape, but the
//     algorithm may change with M, so rows are NOT guaranteed batch invariant.
//   cublaslt_pinned (experimental): the algorithm cuBLASLt's heuristic picks for M = 128 with
//     split-K forced to 1, reused for every M of that (N, K, out type). cuBLAS documents no
//     row invariance for this; tests/cuda measures whether it holds (docs/cuda.md).
enum class GemmMode { batch_invariant, fast, cublaslt_pinned };
enum class OutType { bf16, f32 };
struct GemmArgs {
  const uint16_t* x = nullptr;  // [M, K] bf16, row-major, dense
  const uint16_t* w = nullptr;  // [N, K] bf16, row-major, dense
  void* out = nullptr;          // [M, N] bf16 or fp32
  OutType out_type = OutType::bf16;
  int M = 0, N = 0, K = 0;
  GemmMode mode = GemmMode::batch_invariant;
  Stream stream = nullptr;
};
void gemm(const GemmArgs& a);

}  // namespace atlas::cuda
