// Launcher for the sampling kernel (kernels/sample.cuh): bf16 and f32 logits.
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

}  // namespace

void run_inputs(const RunInputsArgs& a) {
  const char* op = "run_inputs";
  require(a.batch > 0 && a.ring > 0 && a.param_ints >= 0, op, "batch", "batch and ring must be > 0");
  require(a.state && a.staged && a.prev && a.inputs, op, "pointers", "state, staged, prev and inputs must be set");
  require((a.params_staged == nullptr) == (a.params == nullptr), op, "params",
          "params_staged and params are both set or both null");
  launch(kern::run_inputs_kernel, 1u, unsigned(kern::kRunThreads), 0, stream_of(a.stream), a.state, a.staged,
         a.params_staged, a.prev, a.inputs, a.params, a.batch, a.param_ints, a.ring);
  check_launch(op);
}

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
