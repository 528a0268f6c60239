// Runtime helpers of the CUDA backend: device discovery, memory, errors.
#include <cuda_runtime.h>
#include <cxxabi.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string>
#include <vector>

#include "backend/cuda/cuda_internal.h"
#include "backend/cuda/kernels/phase_clock.cuh"

namespace atlas::cuda {
namespace detail {

void check_cuda(cudaError_t e, const char* op, const char* what) {
  if (e == cudaSuccess) return;
  throw Error(std::string("cuda: ") + op + ": " + what + ": " + cudaGetErrorName(e) + " (" +
              cudaGetErrorString(e) + ")");
}

void check_launch(const char* op) { check_cuda(cudaGetLastError(), op, "kernel launch"); }

bool switch_setting(const char* name, const char* value, bool dflt) {
  const std::string v = value == nullptr ? "" : value;
  if (v.empty()) return dflt;
  if (v == "0") return false;
  if (v == "1") return true;
  throw Error(std::string("cuda: ") + name + ": expected 0 or 1, got '" + v + "'");
}

int device_connections_setting(const char* value) {
  const std::string v = value == nullptr ? "" : value;
  if (v.empty()) return kDeviceConnections;
  const bool digits = v.size() <= 2 && v.find_first_not_of("0123456789") == std::string::npos;
  const int n = digits ? std::stoi(v) : 0;
  if (n < 1 || n > 32)
    throw Error("cuda: CUDA_DEVICE_MAX_CONNECTIONS: expected a whole number of work queues from 1 to 32, got '" +
                v + "'");
  return n;
}

namespace {
// CUDA_DEVICE_MAX_CONNECTIONS: the driver reads it once, when it starts (the process's first CUDA
// call), so atlas sets its default during static initialization, ahead of main and of any call,
// and only where the caller did not set the variable (a given value, e.g. 8, CUDA's own default,
// is kept). Session 65: 32 hardware work queues ran batch-1 decode ~0.2% faster than CUDA's 8 on
// each of four H100s, alternated with 8 within each call (docs/cuda.md, the switch table).
const bool g_device_connections_given = [] {
  const bool given = std::getenv("CUDA_DEVICE_MAX_CONNECTIONS") != nullptr;
  if (!given) setenv("CUDA_DEVICE_MAX_CONNECTIONS", std::to_string(kDeviceConnections).c_str(), 0);
  return given;
}();

// -1: not decided yet; 0 / 1: off / on.
std::atomic<int> g_pdl{-1};
bool pdl_supported() {
  int dev = 0, major = 0;
  if (cudaGetDevice(&dev) != cudaSuccess ||
      cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess) {
    (void)cudaGetLastError();  // no device: every launch fails later with its own error
    return false;
  }
  return major >= 9;
}
}  // namespace

thread_local bool t_decode_step = false;  // inside a DecodeLaunchScope(true) on this thread
thread_local bool t_urgent = false;       // inside an UrgentLaunchScope(true) on this thread
thread_local bool t_plain = false;        // inside a PlainLaunchScope(true) on this thread
thread_local void* t_prog_event = nullptr;  // inside a ProgrammaticEventScope(event) on this thread
// Under stream capture, the graph node each programmatic event's launch made (and the capture it
// belongs to): stream_wait_programmatic's source. A few entries per thread (one event per model).
struct ProgrammaticNode {
  void* event;
  cudaGraphNode_t node;
  unsigned long long capture;
};
thread_local std::vector<ProgrammaticNode> t_prog_nodes;
std::atomic<int64_t> g_programmatic_edges{0};  // programmatic_capture_edges()
// ATLAS_CAPTURE_EDGES=explicit or plain (or the tests' override, -1: the variable): the capturing
// stream whose dependency set stream_wait_programmatic wrote out in full, so that its next launch
// goes without the launch-overlap attribute (take_edges_set; launch_clustered).
std::atomic<int> g_capture_edges_override{-1};
thread_local cudaStream_t t_edges_set = nullptr;
std::atomic<int64_t> g_plain_launches{0};

int capture_edges_setting(const char* value) {
  const std::string v = value ? value : "";
  if (v == "add") return 0;
  if (v == "explicit") return 1;
  if (v.empty() || v == "plain") return 2;
  throw Error("cuda: ATLAS_CAPTURE_EDGES: expected add, explicit or plain, got '" + v + "'");
}
bool take_edges_set(cudaStream_t stream) {
  if (t_edges_set == nullptr || t_edges_set != stream) return false;
  t_edges_set = nullptr;
  return true;
}

int pdl_setting(const char* value) {
  const std::string v = value ? value : "";
  if (v.empty() || v == "decode") return int(LaunchOverlap::decode);
  if (v == "0") return int(LaunchOverlap::off);
  if (v == "1") return int(LaunchOverlap::on);
  throw Error("cuda: ATLAS_PDL: expected 0, 1 or decode, got '" + v + "'");
}

unsigned release_first_setting(const char* value) {
  const std::string v = value ? value : "";
  if (v.empty()) return kRfCombine | kRfLatent | kRfNorm;  // session 27's best set (s27-3)
  if (v == "none") return 0;
  const std::pair<const char*, ReleaseFirstSite> sites[] = {{"combine", kRfCombine}, {"latent", kRfLatent},
                                                            {"attention", kRfAttention}, {"merge", kRfMerge},
                                                            {"norm", kRfNorm}, {"route", kRfRoute}};
  if (v == "all") {
    unsigned all = 0;
    for (const auto& s : sites) all |= s.second;
    return all;
  }
  unsigned set = 0;
  size_t at = 0;
  while (true) {
    const size_t end = std::min(v.find_first_of(",+", at), v.size());
    const std::string name = v.substr(at, end - at);
    unsigned bit = 0;
    for (const auto& s : sites)
      if (name == s.first) bit = s.second;
    if (bit == 0)
      throw Error("cuda: ATLAS_RELEASE_FIRST: expected none, all or a comma-separated list of combine, latent, "
                  "attention, merge, norm, route (or joined by +); got '" + v + "'");
    set |= bit;
    if (end == v.size()) return set;
    at = end + 1;
  }
}

bool release_first(ReleaseFirstSite site) {
  static const unsigned set = release_first_setting(std::getenv("ATLAS_RELEASE_FIRST"));
  return (set & site) != 0;
}

int mla_exchange_setting(const char* value) {
  const std::string v = value ? value : "";
  if (v == "pull") return 1;
  if (v == "push") return 2;
  if (v.empty() || v == "async") return 3;
  throw Error("cuda: ATLAS_MLA_EXCHANGE: expected pull, push or async, got '" + v + "'");
}

int mla_pair_release_setting(const char* value) {
  const std::string v = value ? value : "";
  if (v == "wait") return 0;
  if (v.empty() || v == "phase2") return 1;
  if (v == "epilogue") return 2;
  if (v == "exit") return 3;
  throw Error("cuda: ATLAS_MLA_PAIR_RELEASE: expected wait, phase2, epilogue or exit, got '" + v + "'");
}

std::string phase_clocks_setting(const char* value) {
  const std::string v = value ? value : "";
  if (v.empty() || v == "attention" || v == "cluster_gemm") return v;
  throw Error("cuda: ATLAS_PHASE_CLOCKS: expected attention or cluster_gemm (or unset), got '" + v + "'");
}

namespace {
struct PhaseClockSite {
  std::string site;
  std::vector<std::string> names;
  unsigned long long* sums = nullptr;
};
std::mutex g_clock_mutex;
std::vector<PhaseClockSite>* g_clock_sites = nullptr;  // leaked: read by the exit handler

// At exit (registered after the CUDA runtime's first use, so it runs before the runtime's own
// teardown): each site's mean cycles per phase and block, on stderr.
void report_phase_clocks() {
  std::lock_guard<std::mutex> lock(g_clock_mutex);
  int dev = 0, khz = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || cudaDeviceGetAttribute(&khz, cudaDevAttrClockRate, dev) != cudaSuccess)
    khz = 0;
  for (const PhaseClockSite& s : *g_clock_sites) {
    unsigned long long h[kern::kPhaseClockMax + 1] = {};
    if (cudaDeviceSynchronize() != cudaSuccess ||
        cudaMemcpy(h, s.sums, sizeof h, cudaMemcpyDeviceToHost) != cudaSuccess) {
      std::fprintf(stderr, "phase clocks of %s: could not be read back\n", s.site.c_str());
      continue;
    }
    std::fprintf(stderr, "phase clocks of %s: %llu blocks; mean cycles per block (us at the %d MHz clock rate)\n",
                 s.site.c_str(), h[0], khz / 1000);
    if (h[0] == 0) continue;
    double total = 0;
    for (size_t i = 0; i < s.names.size(); ++i) {
      const double c = double(h[i + 1]) / double(h[0]);
      total += c;
      std::fprintf(stderr, "  %10.1f  %7.3f  %s\n", c, khz ? c / (khz / 1000.0) : 0.0, s.names[i].c_str());
    }
    std::fprintf(stderr, "  %10.1f  %7.3f  (all)\n", total, khz ? total / (khz / 1000.0) : 0.0);
  }
}
}  // namespace

unsigned long long* phase_clock_sums(const char* site, const std::vector<std::string>& phases) {
  static const std::string wanted = phase_clocks_setting(std::getenv("ATLAS_PHASE_CLOCKS"));
  if (wanted != site) return nullptr;
  require(phases.size() < size_t(kern::kPhaseClockMax), "phase_clock_sums", "phases",
          "at most " + std::to_string(kern::kPhaseClockMax - 1) + " phases");
  std::lock_guard<std::mutex> lock(g_clock_mutex);
  if (g_clock_sites == nullptr) {
    g_clock_sites = new std::vector<PhaseClockSite>();
    std::atexit(report_phase_clocks);
  }
  for (const PhaseClockSite& s : *g_clock_sites)
    if (s.site == site) return s.sums;
  PhaseClockSite s{.site = site, .names = phases};
  const size_t bytes = sizeof(unsigned long long) * (kern::kPhaseClockMax + 1);
  check_cuda(cudaMalloc(&s.sums, bytes), "phase_clock_sums", "cudaMalloc");
  check_cuda(cudaMemset(s.sums, 0, bytes), "phase_clock_sums", "cudaMemset");
  g_clock_sites->push_back(s);
  return s.sums;
}

bool pdl_enabled() {
  int v = g_pdl.load(std::memory_order_relaxed);
  if (v < 0) {
    // First launch: ATLAS_PDL (default: decode steps only), where the device supports it.
    v = pdl_setting(std::getenv("ATLAS_PDL"));
    if (v && !pdl_supported()) v = 0;
    g_pdl.store(v, std::memory_order_relaxed);
  }
  const bool on = v == int(LaunchOverlap::on) || (v == int(LaunchOverlap::decode) && t_decode_step);
  if (on && t_plain) {
    g_plain_launches.fetch_add(1, std::memory_order_relaxed);
    return false;
  }
  return on;
}

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

bool device_connections_given() { return detail::g_device_connections_given; }

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

void set_device(int device) { check_cuda(cudaSetDevice(device), "set_device", "cudaSetDevice"); }

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

MemoryInfo memory_info() {
  MemoryInfo m;
  check_cuda(cudaMemGetInfo(&m.free, &m.total), "memory_info", "cudaMemGetInfo");
  return m;
}

void* host_alloc_pinned(size_t bytes) {
  void* p = nullptr;
  check_cuda(cudaMallocHost(&p, bytes), "host_alloc_pinned", "cudaMallocHost");
  return p;
}

void host_free_pinned(void* p) {
  if (p) check_cuda(cudaFreeHost(p), "host_free_pinned", "cudaFreeHost");
}

void copy_to_device_async(void* dst, const void* src, size_t bytes, Stream stream) {
  check_cuda(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, stream_of(stream)), "copy_to_device_async",
             "cudaMemcpyAsync");
}

void stream_synchronize(Stream stream) {
  check_cuda(cudaStreamSynchronize(stream_of(stream)), "stream_synchronize", "cudaStreamSynchronize");
}

void copy_2d(void* dst, size_t dst_pitch, const void* src, size_t src_pitch, size_t row_bytes, size_t rows,
             Stream stream) {
  if (rows == 0 || row_bytes == 0) return;
  check_cuda(cudaMemcpy2DAsync(dst, dst_pitch, src, src_pitch, row_bytes, rows, cudaMemcpyDeviceToDevice,
                               stream_of(stream)),
             "copy_2d", "cudaMemcpy2DAsync");
}

bool env_switch(const char* name, bool dflt) { return detail::switch_setting(name, std::getenv(name), dflt); }

ModelEnv model_env() {
  ModelEnv e;
  const auto value = [](const char* name) {
    const char* v = std::getenv(name);
    return std::string(v ? v : "");
  };
  const auto bad = [](const char* name, const std::string& what, const std::string& v) {
    throw Error(std::string("cuda: ") + name + ": " + what + ", got '" + v + "'");
  };
  if (const std::string v = value("ATLAS_MLA_PREFILL_QPB"); !v.empty()) {
    if (v != "1" && v != "2" && v != "4") bad("ATLAS_MLA_PREFILL_QPB", "expected 1, 2 or 4", v);
    e.mla_prefill_qpb = v[0] - '0';
  }
  e.mla_tile_parallel_off = !env_switch("ATLAS_MLA_TILE_PARALLEL", true);  // "0": off, "1": automatic
  if (const std::string v = value("ATLAS_ABSORB"); !v.empty()) {
    if (v != "side" && v != "before" && v != "after" && v != "fused")
      bad("ATLAS_ABSORB", "expected side, before, after or fused", v);
    e.absorb = v == "side" ? 0 : v == "before" ? 1 : v == "after" ? 2 : 3;  // unset: ModelEnv's "fused"
  }
  if (const std::string v = value("ATLAS_SHARED_FORK"); !v.empty()) {
    if (v != "norm" && v != "o_proj") bad("ATLAS_SHARED_FORK", "expected norm or o_proj", v);
    e.shared_fork_o_proj = v == "o_proj";
  }
  if (const std::string v = value("ATLAS_MOE_PREFETCH"); !v.empty()) {
    if (v != "none" && v != "routed" && v != "shared" && v != "both")
      bad("ATLAS_MOE_PREFETCH", "expected none, routed, shared or both", v);
    e.moe_prefetch = v == "routed" ? 1 : v == "shared" ? 2 : v == "both" ? 3 : 0;
  }
  if (const std::string v = value("ATLAS_MOE_PREFETCH_AT"); !v.empty()) {
    if (v.size() != 1 || v[0] < '0' || v[0] > '4') bad("ATLAS_MOE_PREFETCH_AT", "expected 0, 1, 2, 3 or 4", v);
    e.moe_prefetch_at = v[0] - '0';
  }
  if (const std::string v = value("ATLAS_L2_PREFETCH"); !v.empty()) {
    if (v != "none" && v != "gate_up" && v != "down" && v != "both")
      bad("ATLAS_L2_PREFETCH", "expected none, gate_up, down or both", v);
    e.l2_prefetch = v == "gate_up" ? 1 : v == "down" ? 2 : v == "both" ? 3 : 0;
  }
  if (const std::string v = value("ATLAS_L2_PREFETCH_HOW"); !v.empty()) {
    if (v != "bulk" && v != "bulk_last" && v != "line" && v != "line_last")
      bad("ATLAS_L2_PREFETCH_HOW", "expected bulk, bulk_last, line or line_last", v);
    e.l2_prefetch_how = v == "bulk" ? 0 : v == "bulk_last" ? 1 : v == "line" ? 2 : 3;
  }
  if (const std::string v = value("ATLAS_L2_PREFETCH_BLOCKS"); !v.empty()) {
    const bool digits = v.size() <= 4 && v.find_first_not_of("0123456789") == std::string::npos;
    if (!digits || std::stoi(v) < 1 || std::stoi(v) > 1024)
      bad("ATLAS_L2_PREFETCH_BLOCKS", "expected a whole number of blocks from 1 to 1024", v);
    e.l2_prefetch_blocks = std::stoi(v);
  }
  if (const std::string v = value("ATLAS_PREFILL_CHUNK_TOKENS"); !v.empty()) {
    const bool digits = v.size() <= 9 && v.find_first_not_of("0123456789") == std::string::npos;
    if (!digits || std::stoll(v) < 1)
      bad("ATLAS_PREFILL_CHUNK_TOKENS", "expected a whole number of tokens from 1 to 999999999", v);
    e.prefill_chunk_tokens = std::stoll(v);
  }
  return e;
}

void check_environment() {
  (void)model_env();
  (void)detail::gemm_stream_setting(std::getenv("ATLAS_GEMM_STREAM"));
  (void)detail::gemm_stream_grouped_setting(std::getenv("ATLAS_GEMM_STREAM_GROUPED"));
  (void)detail::gemm_stream_lean_setting(std::getenv("ATLAS_GEMM_STREAM_LEAN"));
  (void)detail::gemm_streamk_setting(std::getenv("ATLAS_GEMM_STREAMK"));
  (void)detail::gemm_streamk_grid_setting(std::getenv("ATLAS_GEMM_STREAMK_GRID"));
  (void)detail::gemm_stream_few_setting(std::getenv("ATLAS_GEMM_STREAM_FEW"));
  (void)detail::gemm_wide_gated_setting(std::getenv("ATLAS_GEMM_WIDE_GATED"));
  (void)detail::gemm_long_k_setting(std::getenv("ATLAS_GEMM_LONG_K"));
  (void)detail::gemm_grouped_many_setting(std::getenv("ATLAS_GEMM_GROUPED_MANY"));
  (void)detail::gemm_grouped_few_down_setting(std::getenv("ATLAS_GEMM_GROUPED_FEW_DOWN"));
  (void)detail::gemm_down_blocks_setting(std::getenv("ATLAS_GEMM_DOWN_BLOCKS_PER_SM"));
  (void)detail::combine_qkv_setting(std::getenv("ATLAS_COMBINE_QKV"));
  (void)detail::router_norm_setting(std::getenv("ATLAS_ROUTER_NORM"));
  (void)detail::capture_edges_setting(std::getenv("ATLAS_CAPTURE_EDGES"));
  (void)detail::gemm_splitk_setting(std::getenv("ATLAS_GEMM_SPLITK"));
  (void)detail::wide_norm_setting(std::getenv("ATLAS_WIDE_NORM"));
  (void)detail::pdl_setting(std::getenv("ATLAS_PDL"));
  (void)detail::release_first_setting(std::getenv("ATLAS_RELEASE_FIRST"));
  (void)detail::phase_clocks_setting(std::getenv("ATLAS_PHASE_CLOCKS"));
  (void)detail::block_stamps_setting(std::getenv("ATLAS_BLOCK_STAMPS"));
  (void)detail::mla_exchange_setting(std::getenv("ATLAS_MLA_EXCHANGE"));
  (void)detail::mla_pair_release_setting(std::getenv("ATLAS_MLA_PAIR_RELEASE"));
  (void)detail::device_connections_setting(std::getenv("CUDA_DEVICE_MAX_CONNECTIONS"));
  for (const char* name : {"ATLAS_GEMM_TMA", "ATLAS_GEMM_TMA_PERSISTENT", "ATLAS_SIDE_STREAM",
                           "ATLAS_PAD_DEDUP", "ATLAS_CUDA_GRAPHS", "ATLAS_STREAM_PRIORITY", "ATLAS_L2_EVICT_FIRST",
                           "ATLAS_GEMM_STAGE_EARLY", "ATLAS_FAST_SMALL_M", "ATLAS_GEMM_CLUSTER_EARLY", "ATLAS_GEMM_CLUSTER16", "ATLAS_GEMM_CLUSTER_PUSH",
                           "ATLAS_MLA_EARLY_CACHE", "ATLAS_GEMM_STREAM_BALANCE", "ATLAS_GEMM_TAILS",
                           "ATLAS_GEMM_STREAM_REGS", "ATLAS_ARGMAX_SPLIT", "ATLAS_MLA_MERGE_EARLY",
                           "ATLAS_MOE_COMBINE_PAIRS", "ATLAS_MLA_MERGE_VALUE", "ATLAS_MLA_PAIR_MERGE", "ATLAS_ROUTE_TAIL",
                           "ATLAS_SHARED_DOWN_FIRST", "ATLAS_SHARED_DOWN_WAIT", "ATLAS_MOE_SELF_ROUTE", "ATLAS_MOE_DOWN_EARLY",
                           "ATLAS_GEMM_TIGHT_TILES", "ATLAS_ROUTE_CLUSTER", "ATLAS_GEMM_WIDE_SPLITK4",
                           "ATLAS_COMBINE_DIRECT", "ATLAS_RUN_FUSED", "ATLAS_RUN_ROOT", "ATLAS_DEVICE_EDITS",
                           "ATLAS_CACHE_POOL", "ATLAS_EARLY_GRAPHS"})
    (void)env_switch(name, true);
}

void set_launch_overlap(LaunchOverlap mode) {
  detail::g_pdl.store(mode != LaunchOverlap::off && detail::pdl_supported() ? int(mode) : 0);
}
LaunchOverlap launch_overlap_mode() {
  (void)detail::pdl_enabled();  // (decides the mode at the first call)
  return LaunchOverlap(detail::g_pdl.load());
}
bool launch_overlap() { return detail::pdl_enabled(); }
DecodeLaunchScope::DecodeLaunchScope(bool decode) : was_(detail::t_decode_step) { detail::t_decode_step = decode; }
DecodeLaunchScope::~DecodeLaunchScope() { detail::t_decode_step = was_; }
UrgentLaunchScope::UrgentLaunchScope(bool urgent) : was_(detail::t_urgent) { detail::t_urgent = urgent; }
UrgentLaunchScope::~UrgentLaunchScope() { detail::t_urgent = was_; }
ProgrammaticEventScope::ProgrammaticEventScope(Event event) : was_(detail::t_prog_event) {
  detail::t_prog_event = event;
}
ProgrammaticEventScope::~ProgrammaticEventScope() { detail::t_prog_event = was_; }
void stream_wait_programmatic(Stream waiter, Event event) {
  cudaStream_t w = stream_of(waiter);
  if (!detail::stream_capturing(w)) {
    // (Eager. A launch of a capture under way records no event, so a waiter must have joined
    // that capture first: fork_side_programmatic's callers fork side_ before the launch.)
    check_cuda(cudaStreamWaitEvent(w, static_cast<cudaEvent_t>(event), 0), "stream_wait_programmatic",
               "cudaStreamWaitEvent");
    return;
  }
  // Under capture: a programmatic edge from the event's launch (noted by launch_clustered) to the
  // waiter's next node. Its port activates once every block of that launch has begun (as the
  // eager event's triggerAtBlockStart), and its type lets the next launch's launch-overlap wait
  // (griddepcontrol.wait) cover that launch's completion and memory.
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  unsigned long long id = 0;
  check_cuda(cudaStreamGetCaptureInfo(w, &status, &id), "stream_wait_programmatic", "cudaStreamGetCaptureInfo");
  const auto it = std::find_if(detail::t_prog_nodes.begin(), detail::t_prog_nodes.end(),
                               [&](const detail::ProgrammaticNode& p) { return p.event == event; });
  if (it == detail::t_prog_nodes.end() || it->capture != id)
    throw Error("cuda: stream_wait_programmatic: no launch recorded this event in the capture under way");
  // (Without launch overlap a plain edge: the waiter's launch then has no launch-overlap wait.
  // plain: a plain edge from the recorded launch, the waiter's other kernel dependencies
  // programmatic as in explicit: its next launch then starts only once the recorded launch has
  // ended, and overlaps only its own stream's kernel before it.)
  const bool overlap = detail::pdl_enabled();
  const int mode = capture_edges_mode();
  cudaGraphEdgeData edge = {};
  if (overlap && mode != 2) {
    edge.from_port = cudaGraphKernelNodePortLaunchCompletion;
    edge.type = cudaGraphDependencyTypeProgrammatic;
  }
  if (mode == 0) {
    // add: the edge beside the waiter's dependencies; the next launch's own launch-overlap
    // attribute makes capture turn those into programmatic edges as it always does (s45-2's
    // ATLAS_GRAPH_EDGES: capture rewrote this edge's port to the programmatic one).
    check_cuda(cudaStreamUpdateCaptureDependencies(w, &it->node, &edge, 1, cudaStreamAddCaptureDependencies),
               "stream_wait_programmatic", "cudaStreamUpdateCaptureDependencies");
  } else {
    // explicit (and plain): the waiter's whole dependency set written out with its edge data, the
    // edges from kernel nodes made programmatic where the next launch would carry the launch-overlap
    // attribute (as capture makes them: from the kernel's programmatic port, the trigger of
    // griddepcontrol.launch_dependents), and this edge added; the next launch on the waiter then
    // goes without the attribute (take_edges_set), so that capture adds it on exactly these edges.
    const cudaGraphNode_t* deps = nullptr;
    const cudaGraphEdgeData* edges = nullptr;
    size_t n = 0;
    check_cuda(cudaStreamGetCaptureInfo(w, &status, &id, nullptr, &deps, &edges, &n), "stream_wait_programmatic",
               "cudaStreamGetCaptureInfo");
    std::vector<cudaGraphNode_t> nodes(deps, deps + n);
    std::vector<cudaGraphEdgeData> data(n);
    bool have = false;
    for (size_t i = 0; i < n; ++i) {
      data[i] = edges != nullptr ? edges[i] : cudaGraphEdgeData{};
      if (nodes[i] == it->node) {  // (already a dependency: the programmatic edge replaces it)
        data[i] = edge;
        have = true;
        continue;
      }
      cudaGraphNodeType type = cudaGraphNodeTypeEmpty;
      check_cuda(cudaGraphNodeGetType(nodes[i], &type), "stream_wait_programmatic", "cudaGraphNodeGetType");
      if (overlap && type == cudaGraphNodeTypeKernel && data[i].type == cudaGraphDependencyTypeDefault) {
        data[i].from_port = cudaGraphKernelNodePortProgrammatic;
        data[i].type = cudaGraphDependencyTypeProgrammatic;
      }
    }
    if (!have) {
      nodes.push_back(it->node);
      data.push_back(edge);
    }
    check_cuda(cudaStreamUpdateCaptureDependencies(w, nodes.data(), data.data(), nodes.size(),
                                                   cudaStreamSetCaptureDependencies),
               "stream_wait_programmatic", "cudaStreamUpdateCaptureDependencies");
    detail::t_edges_set = w;
  }
  detail::g_programmatic_edges.fetch_add(1);
}
int64_t programmatic_capture_edges() { return detail::g_programmatic_edges.load(); }
void set_capture_edges(int mode) { detail::g_capture_edges_override.store(mode < 0 ? -1 : std::min(mode, 2)); }
int capture_edges_mode() {
  const int forced = detail::g_capture_edges_override.load();
  return forced >= 0 ? forced : detail::capture_edges_setting(std::getenv("ATLAS_CAPTURE_EDGES"));
}
PlainLaunchScope::PlainLaunchScope(bool plain) : was_(detail::t_plain) { detail::t_plain = plain; }
PlainLaunchScope::~PlainLaunchScope() { detail::t_plain = was_; }
int64_t plain_launches() { return detail::g_plain_launches.load(); }
namespace {
std::atomic<int64_t> g_urgent_launches{0};
}
int64_t urgent_launches() { return g_urgent_launches.load(); }
namespace {
// The device's value for `priority` (0 for normal; else from its range, e.g. 0 and -5:
// numerically lower is more urgent).
int priority_value(StreamPriority priority, const char* op) {
  if (priority == StreamPriority::normal) return 0;
  int least = 0, greatest = 0;
  check_cuda(cudaDeviceGetStreamPriorityRange(&least, &greatest), op, "cudaDeviceGetStreamPriorityRange");
  return priority == StreamPriority::high ? greatest : least;
}
}  // namespace
namespace detail {
void* programmatic_event() { return t_prog_event; }
bool stream_capturing(cudaStream_t stream) {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  check_cuda(cudaStreamIsCapturing(stream, &status), "stream_capturing", "cudaStreamIsCapturing");
  return status == cudaStreamCaptureStatusActive;
}
void note_programmatic_node(cudaStream_t stream, void* event) {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  unsigned long long id = 0;
  const cudaGraphNode_t* deps = nullptr;
  const cudaGraphEdgeData* edges = nullptr;  // (asked for: a query without it may fail as lossy)
  size_t n = 0;
  check_cuda(cudaStreamGetCaptureInfo(stream, &status, &id, nullptr, &deps, &edges, &n), "ProgrammaticEventScope",
             "cudaStreamGetCaptureInfo");
  // Right after a kernel launch the stream's next node depends on that launch's node alone.
  if (status != cudaStreamCaptureStatusActive || n != 1)
    throw Error("cuda: ProgrammaticEventScope: expected one capture dependency after the launch, found " +
                std::to_string(n));
  // Only this capture's entries are ever read (stream_wait_programmatic compares the ids): the
  // others go, so the list holds at most this capture's events.
  std::erase_if(t_prog_nodes, [&](const ProgrammaticNode& p) { return p.capture != id || p.event == event; });
  t_prog_nodes.push_back({.event = event, .node = deps[0], .capture = id});
}
int urgent_launch_priority() {
  if (!t_urgent) return 0;
  g_urgent_launches.fetch_add(1);  // called once per launch (launch_clustered)
  static const int greatest = priority_value(StreamPriority::high, "UrgentLaunchScope");
  return greatest;
}
}  // namespace detail

Stream stream_create(StreamPriority priority) {
  cudaStream_t s = nullptr;
  const int p = priority_value(priority, "stream_create");
  check_cuda(cudaStreamCreateWithPriority(&s, cudaStreamNonBlocking, p), "stream_create", "cudaStreamCreateWithPriority");
  return s;
}

void stream_destroy(Stream s) {
  if (!s) return;  // never throws: called from destructors
  gemm_release_stream(stream_of(s));
  cudaStreamDestroy(stream_of(s));
}

Event event_create() {
  cudaEvent_t e = nullptr;
  check_cuda(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "event_create", "cudaEventCreateWithFlags");
  return e;
}

void event_destroy(Event e) {
  if (e) cudaEventDestroy(static_cast<cudaEvent_t>(e));
}

void stream_wait(Stream waiter, Stream producer, Event event) {
  check_cuda(cudaEventRecord(static_cast<cudaEvent_t>(event), stream_of(producer)), "stream_wait", "cudaEventRecord");
  check_cuda(cudaStreamWaitEvent(stream_of(waiter), static_cast<cudaEvent_t>(event), 0), "stream_wait",
             "cudaStreamWaitEvent");
}

void event_record(Event event, Stream stream) {
  check_cuda(cudaEventRecord(static_cast<cudaEvent_t>(event), stream_of(stream)), "event_record", "cudaEventRecord");
}

bool event_done(Event event) {
  const cudaError_t e = cudaEventQuery(static_cast<cudaEvent_t>(event));
  if (e == cudaErrorNotReady) return false;
  check_cuda(e, "event_done", "cudaEventQuery");
  return true;
}

void event_synchronize(Event event) {
  check_cuda(cudaEventSynchronize(static_cast<cudaEvent_t>(event)), "event_synchronize", "cudaEventSynchronize");
}

void copy_to_host_async(void* dst, const void* src, size_t bytes, Stream stream) {
  check_cuda(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, stream_of(stream)), "copy_to_host_async",
             "cudaMemcpyAsync");
}

Graph::~Graph() { reset(); }

void Graph::reset() {
  if (exec_) cudaGraphExecDestroy(static_cast<cudaGraphExec_t>(exec_));
  if (graph_) cudaGraphDestroy(static_cast<cudaGraph_t>(graph_));
  exec_ = graph_ = nullptr;
}

void Graph::begin(Stream stream) {
  check_cuda(cudaStreamBeginCapture(stream_of(stream), cudaStreamCaptureModeThreadLocal), "graph", "begin capture");
}

namespace {
// A kernel node's name without its namespace and template arguments, and its grid:
// "gemm_cluster_combine_kernel(456,1,1)"; other nodes by their type's number.
std::string graph_node_label(cudaGraphNode_t node) {
  cudaGraphNodeType type = cudaGraphNodeTypeEmpty;
  if (cudaGraphNodeGetType(node, &type) != cudaSuccess) return "?";
  if (type != cudaGraphNodeTypeKernel) return "node-type-" + std::to_string(int(type));
  cudaKernelNodeParams p = {};
  const char* name = nullptr;
  if (cudaGraphKernelNodeGetParams(node, &p) != cudaSuccess || cudaFuncGetName(&name, p.func) != cudaSuccess ||
      name == nullptr)
    return "kernel";
  std::string n = name;
  int status = -1;
  if (char* d = abi::__cxa_demangle(name, nullptr, nullptr, &status)) {
    n = d;
    std::free(d);
  }
  if (const size_t lt = n.find('<'); lt != std::string::npos) n.resize(lt);
  if (const size_t lp = n.find('('); lp != std::string::npos) n.resize(lp);
  if (const size_t c = n.rfind("::"); c != std::string::npos) n = n.substr(c + 2);
  return n + "(" + std::to_string(p.gridDim.x) + "," + std::to_string(p.gridDim.y) + "," +
         std::to_string(p.gridDim.z) + ")";
}

// ATLAS_GRAPH_EDGES=FILE: every captured graph's edges appended to FILE, one line each in the
// order cudaGraphGetEdges gives them: "FROM -> TO", and for an edge with data its type and port
// (a diagnostic of what stream capture made of the launch-overlap attributes and programmatic
// waits; the timelines show only when kernels ran, not which edge held them).
void dump_graph_edges(cudaGraph_t g) {
  const char* path = std::getenv("ATLAS_GRAPH_EDGES");
  if (path == nullptr || *path == 0) return;
  size_t n = 0;
  check_cuda(cudaGraphGetEdges(g, nullptr, nullptr, nullptr, &n), "graph", "cudaGraphGetEdges");
  std::vector<cudaGraphNode_t> from(n), to(n);
  std::vector<cudaGraphEdgeData> data(n);
  check_cuda(cudaGraphGetEdges(g, from.data(), to.data(), data.data(), &n), "graph", "cudaGraphGetEdges");
  size_t nodes = 0;
  check_cuda(cudaGraphGetNodes(g, nullptr, &nodes), "graph", "cudaGraphGetNodes");
  // Nodes are numbered in the order first seen, so a node's lines can be followed.
  std::vector<cudaGraphNode_t> seen;
  auto id = [&](cudaGraphNode_t node) {
    const auto it = std::find(seen.begin(), seen.end(), node);
    if (it != seen.end()) return size_t(it - seen.begin());
    seen.push_back(node);
    return seen.size() - 1;
  };
  std::string text = "graph: " + std::to_string(nodes) + " nodes, " + std::to_string(n) + " edges\n";
  for (size_t i = 0; i < n; ++i) {
    // (Numbered one statement each: the operands of a + chain are evaluated in no fixed order, and
    // s45-4 numbered the edge's target first.)
    const size_t a = id(from[i]);
    const size_t b = id(to[i]);
    text += "  " + std::to_string(a) + " " + graph_node_label(from[i]) + " -> " + std::to_string(b) + " " +
            graph_node_label(to[i]);
    if (data[i].type != cudaGraphDependencyTypeDefault || data[i].from_port != 0 || data[i].to_port != 0)
      text += "  type " + std::to_string(int(data[i].type)) + " from_port " + std::to_string(int(data[i].from_port)) +
              " to_port " + std::to_string(int(data[i].to_port));
    text += "\n";
  }
  std::FILE* f = std::fopen(path, "a");
  if (f == nullptr) throw Error(std::string("cuda: ATLAS_GRAPH_EDGES: cannot append to '") + path + "'");
  const bool ok = std::fwrite(text.data(), 1, text.size(), f) == text.size();
  if (std::fclose(f) != 0 || !ok) throw Error(std::string("cuda: ATLAS_GRAPH_EDGES: cannot write '") + path + "'");
}
}  // namespace

namespace {
std::atomic<int64_t> g_graph_captures{0};
}  // namespace
int64_t graph_captures() { return g_graph_captures.load(); }

void Graph::end(Stream stream) {
  cudaGraph_t g = nullptr;
  check_cuda(cudaStreamEndCapture(stream_of(stream), &g), "graph", "end capture");
  graph_ = g;
  dump_graph_edges(g);
  cudaGraphExec_t e = nullptr;
  // Kernel nodes keep the priority of the stream they were captured from (stream_create): the
  // graph runs them so (a graph captured from default-priority streams runs as before).
  check_cuda(cudaGraphInstantiate(&e, g, cudaGraphInstantiateFlagUseNodePriority), "graph", "instantiate");
  exec_ = e;
  ++g_graph_captures;
}

void Graph::abort(Stream stream) {
  cudaGraph_t g = nullptr;
  cudaStreamEndCapture(stream_of(stream), &g);  // status ignored: the capture already failed
  if (g) cudaGraphDestroy(g);
  cudaGetLastError();
}

void Graph::launch(Stream stream) {
  check_cuda(cudaGraphLaunch(static_cast<cudaGraphExec_t>(exec_), stream_of(stream)), "graph", "launch");
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
  if (v & 4) what += " mla_decode: lengths: a length outside [0, max_length];";
  if (v & 8) what += " copy_rows: src_rows/dst_rows: a row index past the limit;";
  // Bits 16/32/64: kernels/gemm_mma.cuh (kErrGroupedOffsets, kErrGatherRows, kErrGroupWeight).
  if (v & 16) what += " grouped_gemm: offsets: not 0 = offsets[0] <= ... <= offsets[groups] <= max_rows;";
  if (v & 32) what += " grouped_gemm: x_rows: a row index negative or past x_rows_limit;";
  if (v & 64) what += " grouped_gemm: w: a group weight pointer null or not 16-byte aligned;";
  if (v & 128) what += " argmax: logits: NaN;";  // kernels/argmax.cuh
  if (v & 256) what += " mla_pattern: lengths: a length outside [0, slots];";  // kernels/mla_pattern.cuh
  throw Error("cuda: bad device data:" + what);
}

}  // namespace atlas::cuda
