// flashext build info from C++: which devices a FLASHEXT_CUDA_ARCHS spec serves (the run-time
// device check of every op relies on it) and what the build reports. Host-only: runs anywhere.
#include <gtest/gtest.h>

#include <string>

#include "flashext/common.h"

namespace {

using flashext::arch_supported;

TEST(BuildInfo, SassRunsOnSameMajorLaterMinor) {
  EXPECT_TRUE(arch_supported("80", 8, 0));
  EXPECT_TRUE(arch_supported("80", 8, 6));  // sm_80 code runs on 8.6 and 8.9
  EXPECT_TRUE(arch_supported("80", 8, 9));
  EXPECT_FALSE(arch_supported("86", 8, 0));
  EXPECT_FALSE(arch_supported("80", 9, 0));  // machine code does not cross majors
  EXPECT_FALSE(arch_supported("80", 7, 5));
  EXPECT_TRUE(arch_supported("8.0", 8, 6));
  EXPECT_TRUE(arch_supported("sm_80", 8, 6));
  EXPECT_TRUE(arch_supported("sm_120", 12, 0));
  EXPECT_FALSE(arch_supported("sm_120", 10, 0));
}

TEST(BuildInfo, ArchSpecificRunsOnExactlyThatCapability) {
  EXPECT_TRUE(arch_supported("90a", 9, 0));
  EXPECT_TRUE(arch_supported("9.0a", 9, 0));
  EXPECT_TRUE(arch_supported("sm_90a", 9, 0));
  EXPECT_FALSE(arch_supported("90a", 8, 0));
  EXPECT_FALSE(arch_supported("90a", 9, 1));
  EXPECT_FALSE(arch_supported("90a", 10, 0));
  EXPECT_TRUE(arch_supported("100a", 10, 0));
  EXPECT_TRUE(arch_supported("10.0a", 10, 0));
  EXPECT_FALSE(arch_supported("100a", 10, 3));
  EXPECT_FALSE(arch_supported("100f", 10, 3));
  EXPECT_FALSE(arch_supported("compute_90a", 10, 0));  // arch-specific PTX is not forward compatible
  EXPECT_TRUE(arch_supported("compute_90a", 9, 0));
}

TEST(BuildInfo, PtxRunsOnEveryLaterCapability) {
  EXPECT_TRUE(arch_supported("compute_80", 8, 0));
  EXPECT_TRUE(arch_supported("compute_80", 8, 6));
  EXPECT_TRUE(arch_supported("compute_80", 9, 0));  // the H200 JIT-compiles sm_80 kernels
  EXPECT_TRUE(arch_supported("compute_80", 12, 0));
  EXPECT_FALSE(arch_supported("compute_80", 7, 5));
  EXPECT_FALSE(arch_supported("compute_86", 8, 0));
  EXPECT_TRUE(arch_supported("COMPUTE_80", 9, 0));
}

TEST(BuildInfo, SassPlusPtx) {
  EXPECT_TRUE(arch_supported("80+PTX", 8, 6));
  EXPECT_TRUE(arch_supported("80+PTX", 9, 0));  // through the PTX
  EXPECT_TRUE(arch_supported("8.0+ptx", 10, 0));
  EXPECT_TRUE(arch_supported("sm_80+PTX", 9, 0));
  EXPECT_FALSE(arch_supported("80+PTX", 7, 5));
  EXPECT_FALSE(arch_supported("86+PTX", 8, 0));
}

TEST(BuildInfo, Lists) {
  EXPECT_TRUE(arch_supported("90a;80", 8, 6));
  EXPECT_TRUE(arch_supported("8.0 9.0a", 9, 0));
  EXPECT_TRUE(arch_supported("90a,compute_80", 12, 0));
  EXPECT_TRUE(arch_supported("sm_90a;sm_80;compute_80", 9, 0));  // the form setup.py and CMake pass
  EXPECT_FALSE(arch_supported("sm_90a;sm_80", 10, 0));
  EXPECT_TRUE(arch_supported(";; 80 ,", 8, 0));
}

TEST(BuildInfo, MalformedEntriesMatchNothing) {
  EXPECT_FALSE(arch_supported("", 9, 0));
  EXPECT_FALSE(arch_supported(nullptr, 9, 0));
  EXPECT_FALSE(arch_supported("9", 9, 0));
  EXPECT_FALSE(arch_supported("sm90", 9, 0));
  EXPECT_FALSE(arch_supported("90x", 9, 0));
  EXPECT_FALSE(arch_supported("9.0.0", 9, 0));
  EXPECT_FALSE(arch_supported("compute_80+PTX", 9, 0));
  EXPECT_FALSE(arch_supported("+PTX", 9, 0));
  EXPECT_TRUE(arch_supported("garbage;90a", 9, 0));  // a bad entry does not hide a good one
}

TEST(BuildInfo, ReportsWhatWasCompiled) {
  const std::string archs = flashext::compiled_cuda_archs();
  ASSERT_FALSE(archs.empty());
  bool serves_some_device = false;
  for (int major = 8; major <= 12; ++major)
    for (int minor = 0; minor <= 9; ++minor) serves_some_device |= arch_supported(archs.c_str(), major, minor);
  EXPECT_TRUE(serves_some_device) << "compiled_cuda_archs() = \"" << archs << "\" names no device";
  const std::string kernels = flashext::compiled_kernels();
  for (const char* name : {"add_gelu_fwd", "add_gelu_bwd", "bias_gelu_fwd", "bias_gelu_bwd", "flash_fwd"})
    EXPECT_NE(kernels.find(std::string(name) + "\n"), std::string::npos) << name;
}

}  // namespace
