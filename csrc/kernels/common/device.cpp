#include "device.h"

#include <cstdlib>
#include <initializer_list>
#include <strings.h>

#include "flashext/common.h"

namespace flashext {

namespace {
std::atomic<HopperKernels>& hopper_kernels_mode() {
  static std::atomic<HopperKernels> mode{[] {
    const char* value = std::getenv("FLASHEXT_HOPPER");  // "0", "false", "off", "no"; "always" (any case)
    if (value == nullptr) return HopperKernels::kWhereFaster;
    for (const char* off : {"0", "false", "off", "no"}) {
      if (strcasecmp(value, off) == 0) return HopperKernels::kOff;
    }
    return strcasecmp(value, "always") == 0 ? HopperKernels::kAlways : HopperKernels::kWhereFaster;
  }()};
  return mode;
}
}  // namespace

HopperKernels hopper_kernels() { return hopper_kernels_mode().load(std::memory_order_relaxed); }

HopperKernels set_hopper_kernels(HopperKernels mode) { return hopper_kernels_mode().exchange(mode); }

int current_device_sm_count() {
  static PerDeviceValue sm_count;
  return sm_count.get([](int device) {
    int count = 0;
    return cudaDeviceGetAttribute(&count, cudaDevAttrMultiProcessorCount, device) == cudaSuccess ? count : 0;
  });
}

int current_device_major() {
  static PerDeviceValue major;
  return major.get([](int device) {
    int value = 0;
    return cudaDeviceGetAttribute(&value, cudaDevAttrComputeCapabilityMajor, device) == cudaSuccess ? value : 0;
  });
}

int current_device_max_smem_per_block() {
  static PerDeviceValue bytes;
  return bytes.get([](int device) {
    int value = 0;
    return cudaDeviceGetAttribute(&value, cudaDevAttrMaxSharedMemoryPerBlockOptin, device) == cudaSuccess ? value : 0;
  });
}

int current_device_smem_per_sm() {
  static PerDeviceValue bytes;
  return bytes.get([](int device) {
    int value = 0;
    return cudaDeviceGetAttribute(&value, cudaDevAttrMaxSharedMemoryPerMultiprocessor, device) == cudaSuccess ? value
                                                                                                              : 0;
  });
}

}  // namespace flashext
