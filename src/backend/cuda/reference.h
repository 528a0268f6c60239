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

// The f32 checking mode's kernels: the same contracts with every bf16 rounding point removed
// (fp32 loads, fp32 stores), in the same fp32 operation order as the bf16 references above.
void rmsnorm(const RmsNormArgsT<float>& a);
void rope_inplace(const RopeArgsT<float>& a);
void silu_gate(const SiluGateArgsT<float>& a);
void add(const AddArgsT<float>& a);
void moe_gather(const MoeGatherArgsT<float>& a);
void moe_combine(const MoeCombineArgsT<float>& a);
void copy_rows(const CopyRowsArgsT<float>& a);
void mla_decode_scalar(const MlaDecodeArgsT<float>& a);  // the scalar kernel's contract, f32 out
// Hook edits of listed rows (host pointers; throws on a row the device would flag).
void edit_rows(const RowEditArgsT<uint16_t>& a);
void edit_rows(const RowEditArgsT<float>& a);
// argmax of each row (ties to the lower id, NaN throws), for bf16 and f32 logits.
void argmax(const ArgmaxArgs& a);
void argmax(const ArgmaxArgsT<float>& a);
// The f32 GEMM's contract (acc = fma(x_k, w_k, acc), k ascending, no rounding), which
// gemm_f32 / grouped_gemm_f32 reproduce bit for bit. Grouped: host pointers throughout, throws
// atlas::Error on offsets or x_rows the device would flag.
void gemm_f32(const GemmF32Args& a);
void grouped_gemm_f32(const GroupedGemmF32Args& a);
// The pattern hook's probabilities (kernels/mla_pattern.cuh's contract; host pointers; expf vs
// libm may differ in the last bit). Throws atlas::Error on a length the device would flag.
void mla_pattern(const MlaPatternArgsT<uint16_t>& a);
void mla_pattern(const MlaPatternArgsT<float>& a);

}  // namespace atlas::cuda::ref
