// GEMM: the batch-invariant tiled kernel and the cuBLASLt fast path.
#include <cublasLt.h>

#include <map>
#include <mutex>
#include <tuple>
#include <string>

#include "backend/cuda/cuda_internal.h"
#include "backend/cuda/kernels/gemm_invariant.cuh"

namespace atlas::cuda {

using namespace detail;

namespace {

void check_lt(cublasStatus_t st, const char* what) {
  if (st == CUBLAS_STATUS_SUCCESS) return;
  throw Error(std::string("cuda: gemm: ") + what + ": cuBLASLt status " + std::to_string(int(st)));
}

struct LtState {
  cublasLtHandle_t handle = nullptr;
  void* workspace = nullptr;
  size_t workspace_bytes = 32u << 20;  // cuBLAS's own recommendation for Hopper
};

LtState& lt() {
  static LtState s;
  static std::once_flag once;
  std::call_once(once, [] {
    check_lt(cublasLtCreate(&s.handle), "cublasLtCreate");
    check_cuda(cudaMalloc(&s.workspace, s.workspace_bytes), "gemm", "cudaMalloc(workspace)");
  });
  return s;
}

// The pinned algorithm per (N, K, out type), chosen once for M = kPinM.
constexpr int kPinM = 128;
struct PinKey {
  int N, K, out;
  bool operator<(const PinKey& o) const { return std::tie(N, K, out) < std::tie(o.N, o.K, o.out); }
};
std::mutex pin_mutex;
std::map<PinKey, cublasLtMatmulAlgo_t> pinned_algos;

// Row-major out[M,N] = x[M,K] . W[N,K]^T is column-major out'[N,M] = W'^T . x' with
// W' = [K,N] (ld K) and x' = [K,M] (ld K): op(A) = transpose(W'), op(B) = x'.
void gemm_cublaslt(const GemmArgs& a, bool pinned) {
  LtState& s = lt();
  const cudaDataType_t out_t = a.out_type == OutType::f32 ? CUDA_R_32F : CUDA_R_16BF;
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t la = nullptr, lb = nullptr, lc = nullptr;
  cublasLtMatmulPreference_t pref = nullptr;
  auto cleanup = [&] {
    if (pref) cublasLtMatmulPreferenceDestroy(pref);
    if (lc) cublasLtMatrixLayoutDestroy(lc);
    if (lb) cublasLtMatrixLayoutDestroy(lb);
    if (la) cublasLtMatrixLayoutDestroy(la);
    if (desc) cublasLtMatmulDescDestroy(desc);
  };
  try {
    check_lt(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F), "MatmulDescCreate");
    const cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
    check_lt(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)), "TRANSA");
    check_lt(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)), "TRANSB");
    check_lt(cublasLtMatrixLayoutCreate(&la, CUDA_R_16BF, a.K, a.N, a.K), "layout A");
    check_lt(cublasLtMatrixLayoutCreate(&lb, CUDA_R_16BF, a.K, a.M, a.K), "layout B");
    check_lt(cublasLtMatrixLayoutCreate(&lc, out_t, a.N, a.M, a.N), "layout C");
    check_lt(cublasLtMatmulPreferenceCreate(&pref), "PreferenceCreate");
    check_lt(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                  &s.workspace_bytes, sizeof(s.workspace_bytes)),
             "MAX_WORKSPACE_BYTES");
    cublasLtMatmulAlgo_t algo{};
    if (!pinned) {
      cublasLtMatmulHeuristicResult_t heur{};
      int found = 0;
      check_lt(cublasLtMatmulAlgoGetHeuristic(s.handle, desc, la, lb, lc, lc, pref, 1, &heur, &found),
               "AlgoGetHeuristic");
      if (found == 0) throw Error("cuda: gemm: cuBLASLt found no algorithm for M=" + std::to_string(a.M) +
                                  " N=" + std::to_string(a.N) + " K=" + std::to_string(a.K));
      algo = heur.algo;
    } else {
      std::lock_guard<std::mutex> lock(pin_mutex);
      const PinKey key{a.N, a.K, int(a.out_type)};
      auto it = pinned_algos.find(key);
      if (it == pinned_algos.end()) {
        cublasLtMatrixLayout_t lb_pin = nullptr, lc_pin = nullptr;
        check_lt(cublasLtMatrixLayoutCreate(&lb_pin, CUDA_R_16BF, a.K, kPinM, a.K), "layout B (pin)");
        check_lt(cublasLtMatrixLayoutCreate(&lc_pin, out_t, a.N, kPinM, a.N), "layout C (pin)");
        cublasLtMatmulHeuristicResult_t heur{};
        int found = 0;
        const cublasStatus_t st =
            cublasLtMatmulAlgoGetHeuristic(s.handle, desc, la, lb_pin, lc_pin, lc_pin, pref, 1, &heur, &found);
        cublasLtMatrixLayoutDestroy(lb_pin);
        cublasLtMatrixLayoutDestroy(lc_pin);
        check_lt(st, "AlgoGetHeuristic (pin)");
        if (found == 0) throw Error("cuda: gemm: cuBLASLt found no algorithm to pin for N=" +
                                    std::to_string(a.N) + " K=" + std::to_string(a.K));
        const int32_t one = 1;
        const uint32_t no_reduction = CUBLASLT_REDUCTION_SCHEME_NONE;
        check_lt(cublasLtMatmulAlgoConfigSetAttribute(&heur.algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &one, sizeof(one)),
                 "SPLITK_NUM");
        check_lt(cublasLtMatmulAlgoConfigSetAttribute(&heur.algo, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME,
                                                      &no_reduction, sizeof(no_reduction)),
                 "REDUCTION_SCHEME");
        it = pinned_algos.emplace(key, heur.algo).first;
      }
      algo = it->second;
      cublasLtMatmulHeuristicResult_t check{};
      check_lt(cublasLtMatmulAlgoCheck(s.handle, desc, la, lb, lc, lc, &algo, &check),
               "AlgoCheck: the pinned algorithm does not support this M");
    }
    const float alpha = 1.0f, beta = 0.0f;
    check_lt(cublasLtMatmul(s.handle, desc, &alpha, a.w, la, a.x, lb, &beta, a.out, lc, a.out, lc,
                            &algo, s.workspace, s.workspace_bytes, stream_of(a.stream)),
             "Matmul");
  } catch (...) {
    cleanup();
    throw;
  }
  cleanup();
}

}  // namespace

void gemm(const GemmArgs& a) {
  const char* op = "gemm";
  require(a.M >= 0 && a.N > 0 && a.K > 0, op, "shape",
          "need M >= 0, N > 0, K > 0; got M=" + std::to_string(a.M) + " N=" + std::to_string(a.N) +
              " K=" + std::to_string(a.K));
  require(a.x && a.w && a.out, op, "pointers", "x, w and out must be set");
  if (a.M == 0) return;
  if (a.mode != GemmMode::batch_invariant) {
    gemm_cublaslt(a, a.mode == GemmMode::cublaslt_pinned);
    return;
  }
  const dim3 grid((a.N + kern::kGemmBN - 1) / kern::kGemmBN, (a.M + kern::kGemmBM - 1) / kern::kGemmBM);
  if (a.out_type == OutType::f32)
    kern::gemm_invariant_kernel<true><<<grid, kern::kGemmThreads, 0, stream_of(a.stream)>>>(a.x, a.w, a.out,
                                                                                        a.M, a.N, a.K);
  else
    kern::gemm_invariant_kernel<false><<<grid, kern::kGemmThreads, 0, stream_of(a.stream)>>>(a.x, a.w, a.out,
                                                                                         a.M, a.N, a.K);
  check_launch(op);
}

}  // namespace atlas::cuda
