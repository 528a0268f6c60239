// The CUDA implementation of Model (issue 5): DeepSeek-V2 on one GPU, bf16 weights and
// activations on the device, the rounding points of the CPU backend's bf16 mode.
//
// Host C++ only (includes cuda_ops.h, no CUDA header); compiled into atlas_lib when the build
// has CUDA. What it does:
//   - compute bf16, or f32 for checking (`--compute f32`): the same forward loop over f32
//     weights (checkpoint values widened exactly) and f32 activations, cache and logits, with no
//     bf16 rounding anywhere; f32 GEMMs are FMA chains (kernels/gemm_f32.cuh) and attention the
//     scalar MLA kernel. It should equal the CPU f32 mode (absorbed attention) within 1e-5
//     relative with identical routes (tests/cuda/model). It needs twice the bf16 memory, is
//     slow, and has no fast mode (--fast with f32 is an error);
//   - attention is always the absorbed form (q~ = W_UK^T q_nope, attention over the 576-wide
//     latent cache, W_UV after), for prefill and decode alike; ForwardInput::attention is a
//     CPU choice and is ignored here (both forms are the same math, different rounding);
//   - the cache stores only real tokens, packed per row, so padding costs nothing and a row's
//     cache is bit-identical whatever batch it is in;
//   - by default every GEMM is a batch-invariant kernel (the routed experts: one grouped launch
//     over every expert's contiguous rows, offsets read on the device): a row's logits are
//     bit-identical alone or in a batch (tests/cuda/model); the fast mode sends dense GEMMs of
//     more than 16 rows to cuBLASLt;
//   - hooks: every catalog name, attn.hook_pattern included (the official eager softmax,
//     kernels/mla_pattern.cuh); a tensor observer gets the tensor as f32 on the host and what it
//     changes is copied back, so interventions work; readers and digest observers are served
//     without stopping the GPU (asynchronous copies, device SHA-256 digests); untraced runs copy
//     nothing;
//   - logits are bf16 on the device (lm_head output, as the official bf16 model and the CPU
//     bf16 mode; f32 in the checking mode), returned as f32 only for the rows asked for; greedy
//     tokens come from a device argmax, sampled ones from the device sampler (bit-identical to
//     the host's), and decode runs replay a captured graph per step.
// docs/cuda.md ("The forward pass") walks through one layer's launches.
#pragma once

#include <memory>

#include "io/checkpoint.h"
#include "model/model.h"

namespace atlas::cuda {

struct CudaModelOptions {
  Compute compute = Compute::BF16;
  int device = 0;
  bool batch_invariant = true;  // false: dense GEMMs through cuBLASLt (see model/loader.h)
  // Replay decode steps (T = 1, no hooks) from a CUDA graph captured once per cache (store). The env
  // variable ATLAS_CUDA_GRAPHS=0 turns it off (for measuring what graphs save).
  bool graphs = true;
  // An ended cache's memory and captured graphs kept for the model's next cache of the same shape
  // (one, of at most 256 MiB: decodes at a few rows), whose decode steps then replay those graphs
  // from the first step instead of running one step eagerly and capturing again. The same bits.
  // Off: session 62's H100 (s62-1) ran the replayed graph ~2% slower per step in every later
  // cache (412.7 against 420-421 tok/s after the first token), more than the first token saves
  // (2.5 against 5-9 ms). The env variable ATLAS_CACHE_POOL (0 or 1) overrides this.
  bool cache_pool = false;
  // Early graphs (session 63): a prefill on a cache without a decode run's greedy step graph
  // captures it while the GPU runs the prefill (where the model has run a decode step of that
  // shape before: the launchers' one-time setup is done), so that the run's second step replays
  // it instead of capturing it with the GPU idle: batch-1 decode 419.0 / 419.2 against 417.8 /
  // 417.7 tok/s (s63-2, an H100; first token 3.2-3.7 against 4.6-5.8 ms), 495.0 against 493.9
  // on an H200 (s64-1). The run's first step still runs eagerly (s63-1: skipping it, with the
  // graph replayed from the first step, made every later step ~2% slower; ~1.2% on s64-1's
  // H200). The same bits. The env variable ATLAS_EARLY_GRAPHS (0 or 1) overrides this.
  bool early_graphs = true;
  // A prefill of more tokens (B x T) than this runs in chunks of whole time steps (same bits,
  // bounded working memory); hooked calls are never chunked.
  int64_t max_tokens_per_call = 8192;
  // Run each MoE layer's shared experts on a second stream, concurrently with the routing and
  // the routed experts, and a prefill's absorbed-query GEMM concurrently with the latent's cache
  // write (a decode step runs it with the cache write in one launch on the main stream,
  // ATLAS_ABSORB); the same kernels on the same inputs: the same bits. The env variable ATLAS_SIDE_STREAM=0
  // turns it off (for measuring what it saves).
  bool side_stream = true;
  // A prefill computes each distinct padding token once (the same id, position, visible length
  // and cache row compute the same values) and copies it to the others: the same bits in every
  // output and hook (the forward pass in cuda_model.cpp says when it applies). The env
  // variable ATLAS_PAD_DEDUP=0 turns it off (for measuring what it saves).
  bool pad_dedup = true;
  // The main stream (the critical path: router, routing, routed experts) at the device's highest
  // stream priority and the side stream at its lowest, so that when both have blocks waiting
  // for SMs the main stream's go first (captured graphs keep the priorities). Scheduling only:
  // the same bits. Session 16, H200: batch-1 decode 317-318 against 312 tok/s, the seed grid
  // 7.04 against 7.14 s. The env variable ATLAS_STREAM_PRIORITY=0 turns it off.
  bool stream_priority = true;
};

// Rows the last forward() of a CUDA model computed (B x T, or fewer where padding ran once);
// for tests. Throws for a model of another backend.
int64_t computed_rows(const Model& model);

// Uploads the checkpoint's weights (converted to bf16, or widened to f32 for Compute::F32) to
// the device. Throws atlas::Error when there is no GPU, when the device lacks memory (naming
// needed and free bytes and the compute type), or for f32 with batch_invariant = false.
std::unique_ptr<Model> make_cuda_model(const Checkpoint& ck, const CudaModelOptions& opts);

}  // namespace atlas::cuda
