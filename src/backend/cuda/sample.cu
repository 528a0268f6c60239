// Launchers for the sampling kernel (kernels/sample.cuh: bf16 and f32 logits) and a decode run's
// step-graph ends (kernels/decode_run.cuh).
#include <atomic>
#include <string>

#include "backend/cuda/cuda_internal.h"
#include "backend/cuda/kernels/decode_run.cuh"
#include "backend/cuda/kernels/sample.cuh"

namespace atlas::cuda {

using namespace detail;

namespace {

template <class T>
void sample_impl(const SampleArgsT<T>& a) {
  const char* op = "sample";
  require(a.rows >= 0, op, "rows", "must be >= 0");
  // Errors are returned as -(code + 8 * index): the index must fit an int32.
  require(a.vocab > 0 && a.vocab < (1 << 27), op, "vocab", "must lie in (0, 2^27)");
  const int64_t st = a.stride ? a.stride : a.vocab;
  require(st >= a.vocab, op, "stride", "smaller than vocab");
  require(a.logits && a.params && a.out && a.workspace, op, "pointers",
          "logits, params, out and workspace must be set");
  if (a.rows == 0) return;
  launch(kern::sample_kernel<T>, unsigned(a.rows), kern::kSampleThreads, 0, stream_of(a.stream),
      a.logits, st, a.vocab, a.params, a.out, a.workspace);
  check_launch(op);
}

std::atomic<int64_t> g_embed_norm{0};  // embed_norm launches (tests)
std::atomic<int64_t> g_graph_root{0};  // graph_root launches (tests)

void check_run_inputs(const RunInputsArgs& a, const char* op) {
  require(a.batch > 0 && a.ring > 0 && a.param_ints >= 0, op, "batch", "batch and ring must be > 0");
  require(a.state && a.staged && a.prev && a.inputs, op, "pointers", "state, staged, prev and inputs must be set");
  require((a.params_staged == nullptr) == (a.params == nullptr), op, "params",
          "params_staged and params are both set or both null");
}

template <class T>
void embed_norm_impl(const EmbedNormArgsT<T>& a) {
  const char* op = "embed_norm";
  require(a.dim > 0 && a.dim <= kern::kWideDim, op, "dim", "must lie in (0, " + std::to_string(kern::kWideDim) + "]");
  require(a.vocab > 0, op, "vocab", "must be > 0");
  require(a.ids && a.embed && a.weight && a.x && a.h, op, "pointers", "ids, embed, weight, x and h must be set");
  require(a.h != a.x, op, "h", "must not alias x");
  launch(kern::embed_norm_kernel<T>, 1u, unsigned(kern::kWideThreads), 0, stream_of(a.stream), a.ids, a.embed,
         a.vocab, a.weight, a.x, a.h, a.dim, a.eps, error_flag());
  check_launch(op);
  g_embed_norm.fetch_add(1, std::memory_order_relaxed);
}

}  // namespace

void run_inputs(const RunInputsArgs& a) {
  const char* op = "run_inputs";
  check_run_inputs(a, op);
  launch(kern::run_inputs_kernel, 1u, unsigned(kern::kRunThreads), 0, stream_of(a.stream), a.state, a.staged,
         a.params_staged, a.prev, a.inputs, a.params, a.batch, a.param_ints, a.ring);
  check_launch(op);
}

void graph_root(Stream stream) {
  launch(kern::graph_root_kernel, 1u, 32u, 0, stream_of(stream));
  check_launch("graph_root");
  g_graph_root.fetch_add(1, std::memory_order_relaxed);
}
int64_t graph_root_launches() { return g_graph_root.load(); }

void embed_norm(const EmbedNormArgsT<uint16_t>& a) { embed_norm_impl(a); }
void embed_norm(const EmbedNormArgsT<float>& a) { embed_norm_impl(a); }
int64_t embed_norm_launches() { return g_embed_norm.load(); }

void run_outputs(const RunOutputsArgs& a) {
  const char* op = "run_outputs";
  require(a.batch > 0 && a.ring > 0, op, "batch", "batch and ring must be > 0");
  require(a.state && a.tokens && a.prev && a.out && a.err, op, "pointers",
          "state, tokens, prev, out and err must be set");
  launch(kern::run_outputs_kernel, 1u, unsigned(kern::kRunThreads), 0, stream_of(a.stream), a.state, a.tokens,
         static_cast<const int*>(error_flag()), a.prev, a.out, a.err, a.batch, a.ring);
  check_launch(op);
}

size_t sample_workspace_ints(int64_t rows, int64_t vocab) { return size_t(3 * rows * vocab); }
void sample(const SampleArgs& a) { sample_impl(a); }
void sample(const SampleArgsT<float>& a) { sample_impl(a); }

}  // namespace atlas::cuda
