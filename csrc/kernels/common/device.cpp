#include "device.h"

#include <cstdlib>
#include <cstring>
#include <initializer_list>

#include "flashext/common.h"

namespace flashext {

namespace {
std::atomic<bool>& hopper_kernels_flag() {
  static std::atomic<bool> enabled{[] {
    const char* value = std::getenv("FLASHEXT_HOPPER");  // "0", "false", "off" or "no" turn them off
    if (value == nullptr) return true;
    for (const char* off : {"0", "false", "off", "no", "False", "OFF", "NO"}) {
      if (std::strcmp(value, off) == 0) return false;
    }
    return true;
  }()};
  return enabled;
}
}  // namespace

bool hopper_kernels_enabled() { return hopper_kernels_flag().load(std::memory_order_relaxed); }

bool set_hopper_kernels_enabled(bool enabled) { return hopper_kernels_flag().exchange(enabled); }

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
