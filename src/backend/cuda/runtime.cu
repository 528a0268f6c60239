// Runtime helpers of the CUDA backend: device discovery, memory, errors.
#include <cuda_runtime.h>

#include <mutex>
#include <string>

#include "backend/cuda/cuda_internal.h"

namespace atlas::cuda {
namespace detail {

void check_cuda(cudaError_t e, const char* op, const char* what) {
  if (e == cudaSuccess) return;
  throw Error(std::string("cuda: ") + op + ": " + what + ": " + cudaGetErrorName(e) + " (" +
              cudaGetErrorString(e) + ")");
}

void check_launch(const char* op) { check_cuda(cudaGetLastError(), op, "kernel launch"); }

void arg_error(const char* op, const char* field, const std::string& what) {
  throw Error(std::string("cuda: ") + op + ": " + field + ": " + what);
}

int* error_flag() {
  // One flag for the current device (atlas uses one GPU per process).
  static int* flag = nullptr;
  static std::once_flag once;
  std::call_once(once, [] {
    check_cuda(cudaMalloc(&flag, sizeof(int)), "error_flag", "cudaMalloc");
    check_cuda(cudaMemset(flag, 0, sizeof(int)), "error_flag", "cudaMemset");
  });
  return flag;
}

}  // namespace detail

using namespace detail;

int device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky "no driver / no device" error
    return 0;
  }
  return n;
}

DeviceInfo device_info(int device) {
  cudaDeviceProp p{};
  check_cuda(cudaGetDeviceProperties(&p, device), "device_info", "cudaGetDeviceProperties");
  return DeviceInfo{.name = p.name, .cc_major = p.major, .cc_minor = p.minor,
                    .sm_count = p.multiProcessorCount, .total_memory = p.totalGlobalMem};
}

void* device_alloc(size_t bytes) {
  void* p = nullptr;
  cudaError_t e = cudaMalloc(&p, bytes);
  if (e != cudaSuccess) {
    cudaGetLastError();
    size_t free_b = 0, total_b = 0;
    cudaMemGetInfo(&free_b, &total_b);
    throw Error("cuda: device_alloc: needed " + std::to_string(bytes) + " bytes, the device has " +
                std::to_string(free_b) + " free of " + std::to_string(total_b) + " (" +
                cudaGetErrorName(e) + ")");
  }
  return p;
}

void device_free(void* p) {
  if (p) check_cuda(cudaFree(p), "device_free", "cudaFree");
}

void copy_to_device(void* dst, const void* src, size_t bytes) {
  check_cuda(cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice), "copy_to_device", "cudaMemcpy");
}

void copy_to_host(void* dst, const void* src, size_t bytes) {
  check_cuda(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost), "copy_to_host", "cudaMemcpy");
}

void device_memset(void* dst, int byte, size_t bytes) {
  check_cuda(cudaMemset(dst, byte, bytes), "device_memset", "cudaMemset");
}

void synchronize() { check_cuda(cudaDeviceSynchronize(), "synchronize", "cudaDeviceSynchronize"); }

EventTimer::EventTimer() {
  cudaEvent_t a = nullptr, b = nullptr;
  check_cuda(cudaEventCreate(&a), "EventTimer", "cudaEventCreate");
  check_cuda(cudaEventCreate(&b), "EventTimer", "cudaEventCreate");
  begin_ = a;
  end_ = b;
}

EventTimer::~EventTimer() {
  cudaEventDestroy(static_cast<cudaEvent_t>(begin_));
  cudaEventDestroy(static_cast<cudaEvent_t>(end_));
}

void EventTimer::start(Stream stream) {
  check_cuda(cudaEventRecord(static_cast<cudaEvent_t>(begin_), stream_of(stream)), "EventTimer", "record");
}

float EventTimer::stop_ms(Stream stream) {
  check_cuda(cudaEventRecord(static_cast<cudaEvent_t>(end_), stream_of(stream)), "EventTimer", "record");
  check_cuda(cudaEventSynchronize(static_cast<cudaEvent_t>(end_)), "EventTimer", "synchronize");
  float ms = 0.0f;
  check_cuda(cudaEventElapsedTime(&ms, static_cast<cudaEvent_t>(begin_), static_cast<cudaEvent_t>(end_)),
             "EventTimer", "elapsed");
  return ms;
}

void check_device_errors() {
  synchronize();
  int v = 0;
  check_cuda(cudaMemcpy(&v, error_flag(), sizeof(int), cudaMemcpyDeviceToHost),
             "check_device_errors", "cudaMemcpy");
  if (v == 0) return;
  check_cuda(cudaMemset(error_flag(), 0, sizeof(int)), "check_device_errors", "cudaMemset");
  std::string what;
  if (v & 1) what += " rope: positions: a value outside [0, max_positions);";
  if (v & 2) what += " moe_permute: topk_ids: an expert id outside [0, experts);";
  if (v & 4) what += " mla_decode: lengths: a length outside [1, max_length];";
  throw Error("cuda: bad device data:" + what);
}

}  // namespace atlas::cuda
