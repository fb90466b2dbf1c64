#include "device.h"

#include <atomic>

namespace flashext {

namespace {
constexpr int kMaxDevices = 64;
std::atomic<int> g_sm_count[kMaxDevices];  // 0 = not yet queried
}  // namespace

int current_device_sm_count() {
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess || device < 0) return 0;
  if (device < kMaxDevices) {
    const int cached = g_sm_count[device].load(std::memory_order_relaxed);
    if (cached > 0) return cached;
  }
  int count = 0;
  if (cudaDeviceGetAttribute(&count, cudaDevAttrMultiProcessorCount, device) != cudaSuccess) {
    return 0;
  }
  if (device < kMaxDevices) g_sm_count[device].store(count, std::memory_order_relaxed);
  return count;
}

}  // namespace flashext
