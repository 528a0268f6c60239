// Kernel timeline of any CUDA program, CUDA graphs included, through CUPTI's activity API: the
// driver loads this library at start when CUDA_INJECTION64_PATH names it, and every kernel's
// start / end (GPU ns), stream, graph and grid go to the file ATLAS_KERNEL_TRACE names, one
// line each (written to <file>.tmp, renamed at exit). Unlike Nsight Compute it neither serialises launches nor flushes caches, so the
// times are those of a real run (side stream overlap, warm L2, graph replays).
//   build/bench/cuda/libatlas_ktrace.so (the CMake target atlas_ktrace), or by hand:
//   g++ -O2 -shared -fPIC tools/profile/kernel_trace.cpp -I$CUDA/include -L$CUDA/lib64 -lcupti -o /tmp/libktrace.so
//   CUDA_INJECTION64_PATH=/tmp/libktrace.so ATLAS_KERNEL_TRACE=/tmp/k.txt atlas bench ...
//   python3 tools/profile/kernel_trace_summary.py /tmp/k.txt
#include <cupti.h>

#include <cstdio>
#include <cstdlib>
#include <cxxabi.h>
#include <mutex>
#include <string>

namespace {

// The trace goes to <path>.tmp and is renamed to <path> at exit: a run that dies leaves no
// file that looks like a whole trace.
std::FILE* g_out = nullptr;
std::string g_path;
std::mutex g_mu;
constexpr size_t kBufBytes = 8u << 20;

void CUPTIAPI buffer_requested(uint8_t** buffer, size_t* size, size_t* max_records) {
  *buffer = static_cast<uint8_t*>(std::aligned_alloc(8, kBufBytes));
  *size = kBufBytes;
  *max_records = 0;
}

std::string demangled(const char* name) {
  int status = 0;
  char* d = abi::__cxa_demangle(name, nullptr, nullptr, &status);
  std::string s = status == 0 && d ? d : name;
  std::free(d);
  // Template arguments make lines long and add nothing the grid does not say.
  const size_t lt = s.find('<');
  if (lt != std::string::npos) s = s.substr(0, lt);
  const size_t paren = s.find('(');
  if (paren != std::string::npos) s = s.substr(0, paren);
  for (char& c : s)
    if (c == ' ') c = '_';
  return s;
}

void CUPTIAPI buffer_completed(CUcontext, uint32_t, uint8_t* buffer, size_t, size_t valid) {
  CUpti_Activity* rec = nullptr;
  std::lock_guard<std::mutex> lock(g_mu);
  while (cuptiActivityGetNextRecord(buffer, valid, &rec) == CUPTI_SUCCESS) {
    if (rec->kind != CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL) continue;
    const auto* k = reinterpret_cast<const CUpti_ActivityKernel10*>(rec);
    if (g_out)
      std::fprintf(g_out, "%llu %llu %u %u %d %d %d %d %s\n", (unsigned long long)k->start,
                   (unsigned long long)k->end, k->streamId, k->graphId, k->gridX, k->gridY, k->gridZ, k->blockX,
                   demangled(k->name).c_str());
  }
  std::free(buffer);
}

void flush_at_exit() {
  cuptiActivityFlushAll(1);
  std::lock_guard<std::mutex> lock(g_mu);
  if (!g_out) return;
  const bool ok = std::fclose(g_out) == 0;
  g_out = nullptr;
  const std::string tmp = g_path + ".tmp";
  if (!ok || std::rename(tmp.c_str(), g_path.c_str()) != 0) {
    std::fprintf(stderr, "kernel_trace: could not finish %s (writing or renaming %s failed)\n", g_path.c_str(),
                 tmp.c_str());
    std::remove(tmp.c_str());
  }
}

}  // namespace

extern "C" int InitializeInjection(void) {
  const char* path = std::getenv("ATLAS_KERNEL_TRACE");
  g_path = path && *path ? path : "kernel_trace.txt";
  g_out = std::fopen((g_path + ".tmp").c_str(), "w");
  if (!g_out) {
    std::fprintf(stderr, "kernel_trace: cannot write %s.tmp (ATLAS_KERNEL_TRACE): no trace\n", g_path.c_str());
    return 0;
  }
  if (cuptiActivityRegisterCallbacks(buffer_requested, buffer_completed) != CUPTI_SUCCESS ||
      cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL) != CUPTI_SUCCESS) {
    std::fprintf(stderr, "kernel_trace: CUPTI activity setup failed: no trace\n");
    std::fclose(g_out);
    g_out = nullptr;
    std::remove((g_path + ".tmp").c_str());
    return 0;
  }
  std::atexit(flush_at_exit);
  return 1;
}
