// Device discovery: the suite says clearly whether it ran on a GPU.
#include <cstdio>

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

}  // namespace
}  // namespace atlas::cuda::test
