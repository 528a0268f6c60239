// CPU references for the CUDA kernels (llm.c style: one per kernel, same argument structs,
// host pointers). They reproduce each kernel's order of fp32 operations, so tests/cuda can
// compare bit for bit wherever no transcendental function is involved (RMSNorm, RoPE, MoE
// combine, the invariant GEMM); where expf enters (SiLU, softmax) the CUDA and libm results
// may differ in the last fp32 bit and the tests state a tolerance.
#pragma once

#include <cstdint>

#include "backend/cuda/cuda_ops.h"

namespace atlas::cuda::ref {

// The kernels' fixed reduction order over 256 per-thread partials (kernels/common.cuh).
float block_sum_ref(const float* partials /* [256] */);

void rmsnorm(const RmsNormArgs& a);
void rope_inplace(const RopeArgs& a);  // cos/sin/positions on the host
void silu_gate(const SiluGateArgs& a);
void add_bf16(const AddArgs& a);
void router(const RouterArgs& a);
void moe_permute(const MoePermuteArgs& a);  // workspace unused
void moe_gather(const MoeGatherArgs& a);
void moe_combine(const MoeCombineArgs& a);
// The contract of a.impl (tensor_core: tiles, bf16 P; scalar: fp32 P); workspace unused.
void mla_decode(const MlaDecodeArgs& a);
void mla_decode_tensor_core(const MlaDecodeArgs& a);
void mla_decode_scalar(const MlaDecodeArgs& a);
// GEMM: the FMA-chain contract (acc = fma(x_k, w_k, acc), k ascending, one rounding), which
// GemmMode::fma_chain reproduces bit for bit; batch_invariant (tensor cores) and fast agree
// within tolerances the tests state. Strided batch: a loop over the products.
void gemm(const GemmArgs& a);
// Grouped: host pointers throughout (x_rows, offsets, w[g]); a loop over groups of the dense
// reference. Throws atlas::Error on offsets or x_rows the device would flag.
void grouped_gemm(const GroupedGemmArgs& a);
void copy_rows(const CopyRowsArgs& a);

}  // namespace atlas::cuda::ref
