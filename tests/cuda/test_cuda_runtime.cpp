// Device discovery: the suite says clearly whether it ran on a GPU.
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "cuda_test_util.h"

namespace atlas::cuda::test {
namespace {

TEST(CudaRuntime, DeviceCountNeverThrows) {
  const int n = device_count();
  EXPECT_GE(n, 0);
  if (n == 0) std::printf("[ info ] no CUDA device: every GPU test below is skipped\n");
}

class Runtime : public CudaTest {};

TEST_F(Runtime, ReportsAHopperClassDevice) {
  const DeviceInfo d = device_info(0);
  std::printf("[ info ] device 0: %s, cc %d.%d, %d SMs, %.1f GiB\n", d.name.c_str(), d.cc_major, d.cc_minor,
              d.sm_count, double(d.total_memory) / (1 << 30));
  // atlas_cuda is built for sm_90 only; on anything older its kernels cannot launch.
  EXPECT_GE(d.cc_major, 9);
  EXPECT_GT(d.sm_count, 0);
}

TEST_F(Runtime, OversizedAllocationSaysWhatWasNeeded) {
  try {
    device_alloc(size_t(1) << 50);  // 1 PiB
    FAIL() << "no throw";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("needed 1125899906842624 bytes"), std::string::npos) << e.what();
  }
}

// ATLAS_GRAPH_EDGES=FILE (Graph::end): a captured graph of two kernels on one stream, launch
// overlap on, is listed as its node and edge counts and one edge line naming both kernels, with
// the programmatic type capture gives it; a FILE that cannot be written is one error naming the
// variable.
TEST_F(Runtime, GraphEdgesFileListsTheCapturedEdges) {
  const int64_t n = 1024;
  const std::vector<uint16_t> ones(size_t(n), 0x3f80);
  DevBuf<uint16_t> a(ones), x{size_t(n)}, y{size_t(n)};
  const Stream s = stream_create(StreamPriority::normal);
  const LaunchOverlap was = launch_overlap_mode();
  set_launch_overlap(true);
  const std::string path = (std::filesystem::temp_directory_path() / "atlas_graph_edges_test.txt").string();
  std::filesystem::remove(path);
  const auto capture = [&] {
    Graph g;
    g.begin(s);
    add({.a = a.get(), .b = a.get(), .out = x.get(), .n = n, .stream = s});
    add({.a = x.get(), .b = a.get(), .out = y.get(), .n = n, .stream = s});
    g.end(s);
  };
  setenv("ATLAS_GRAPH_EDGES", path.c_str(), 1);
  capture();
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  const std::string got = text.str();
  EXPECT_NE(got.find("graph: 2 nodes, 1 edges\n"), std::string::npos) << got;
  EXPECT_NE(got.find("  0 add"), std::string::npos) << got;
  EXPECT_NE(got.find(" -> 1 add"), std::string::npos) << got;
  EXPECT_NE(got.find("type 1 from_port 1 to_port 0"), std::string::npos) << got;
  setenv("ATLAS_GRAPH_EDGES", "/nonexistent-atlas-dir/edges.txt", 1);
  try {
    capture();
    ADD_FAILURE() << "no error for an unwritable ATLAS_GRAPH_EDGES";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("ATLAS_GRAPH_EDGES"), std::string::npos) << e.what();
  }
  unsetenv("ATLAS_GRAPH_EDGES");
  std::filesystem::remove(path);
  set_launch_overlap(was);
  stream_destroy(s);
}

// stream_wait_programmatic (session 43's capture form, session 44's explicit one, session 45's plain one; the model's
// ATLAS_COMBINE_QKV=event and ATLAS_ROUTER_NORM=1 rest on it), apart from the model: a waiting
// stream's kernel reads what a kernel of another stream wrote in a ProgrammaticEventScope, eagerly
// and replayed from a captured graph, launch overlap off and on, under each capture form. The
// writer's kernel is large (64 Mi elements, ~0.1 ms) and the buffer it writes starts as NaN (the
// poison), so a reader that ran ahead of it would read NaN. Captured waits add programmatic edges
// (counted); the replay gives the eager bits.
TEST_F(Runtime, ProgrammaticWaitOrdersTheWaitingStream) {
  const int64_t n = int64_t(1) << 26;
  const std::vector<uint16_t> ones(size_t(n), 0x3f80), twos(size_t(n), 0x4000);  // bf16 1.0, 2.0
  DevBuf<uint16_t> a(ones), b(twos);
  const Stream s = stream_create(StreamPriority::high), t = stream_create(StreamPriority::low);
  const Event fork = event_create(), join = event_create(), ev = event_create();
  const LaunchOverlap was = launch_overlap_mode();
  // x = a + b on s (the scope's launch), then y = x + a on t after the programmatic wait.
  const auto issue = [&](uint16_t* x, uint16_t* y) {
    stream_wait(t, s, fork);  // (t joins a capture on s before the recorded launch)
    {
      const ProgrammaticEventScope scope(ev);
      add({.a = a.get(), .b = b.get(), .out = x, .n = n, .stream = s});
    }
    stream_wait_programmatic(t, ev);
    add({.a = x, .b = a.get(), .out = y, .n = n, .stream = t});
    stream_wait(s, t, join);
  };
  for (bool overlap : {false, true})
    for (int edges : {0, 1, 2}) {
      SCOPED_TRACE(::testing::Message() << "overlap " << overlap << " edges " << edges);
      set_launch_overlap(overlap);
      set_capture_edges(edges);
      {  // eager
        DevBuf<uint16_t> x{size_t(n)}, y{size_t(n)};
        synchronize();  // (the poison's cudaMemset runs on the legacy stream)
        issue(x.get(), y.get());
        stream_synchronize(s);
        const std::vector<uint16_t> got = y.download();
        EXPECT_EQ(got, std::vector<uint16_t>(size_t(n), 0x4080)) << "eager";  // bf16 4.0 = (1 + 2) + 1
      }
      {  // captured, replayed twice
        DevBuf<uint16_t> x{size_t(n)}, y{size_t(n)};
        synchronize();
        const int64_t before = programmatic_capture_edges();
        Graph g;
        g.begin(s);
        issue(x.get(), y.get());
        g.end(s);
        EXPECT_EQ(programmatic_capture_edges(), before + 1);
        for (int r = 0; r < 2; ++r) {
          device_memset(x.get(), 0xff, size_t(n) * 2);  // NaN again: the replay must write it first
          device_memset(y.get(), 0xff, size_t(n) * 2);
          synchronize();  // (cudaMemset runs on the legacy stream, which s does not wait for)
          g.launch(s);
          stream_synchronize(s);
          EXPECT_EQ(y.download(), std::vector<uint16_t>(size_t(n), 0x4080)) << "replay " << r;
        }
      }
    }
  set_capture_edges(-1);
  set_launch_overlap(was);
  event_destroy(fork);
  event_destroy(join);
  event_destroy(ev);
  stream_destroy(s);
  stream_destroy(t);
}

}  // namespace
}  // namespace atlas::cuda::test
