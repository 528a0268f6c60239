// Internals shared by the launchers (.cu files only): error checks and the device error flag.
#pragma once

#include <cuda_runtime.h>

#include <string>

#include "backend/cuda/cuda_ops.h"
#include "core/error.h"

namespace atlas::cuda::detail {

// Throws atlas::Error("cuda: <op>: <call>: <CUDA error text>") on failure.
void check_cuda(cudaError_t e, const char* op, const char* what);
// After a launch: picks up launch-configuration errors without synchronising.
void check_launch(const char* op);
// Argument checks: "cuda: <op>: <field>: <what>".
[[noreturn]] void arg_error(const char* op, const char* field, const std::string& what);
inline void require(bool ok, const char* op, const char* field, const std::string& what) {
  if (!ok) arg_error(op, field, what);
}

// One device int per device, set by kernels that find bad data they cannot reject on the host
// (out-of-range positions, expert ids, cache lengths); read by check_device_errors().
int* error_flag();

inline cudaStream_t stream_of(Stream s) { return static_cast<cudaStream_t>(s); }

// gemm.cu keeps per-stream scratch for sliced launches; stream_destroy() returns it (never throws).
void gemm_release_stream(cudaStream_t s) noexcept;

inline unsigned blocks_for(int64_t n, int threads) { return unsigned((n + threads - 1) / threads); }

}  // namespace atlas::cuda::detail
