// flashext: facts about the current CUDA device that launch planning needs.
#pragma once

#include <cuda_runtime_api.h>

#include <atomic>
#include <cstddef>

namespace flashext {

// A value that is a property of the device (an SM count, a kernel's occupancy), queried once per
// device: get(query) returns the current device's cached value, calling query(device) the first
// time. 0 (and nothing cached) when the device or the query fails. Host calls only, no
// synchronisation: safe during CUDA-graph capture.
class PerDeviceValue {
 public:
  template <typename Query>
  int get(Query&& query) {
    int device = 0;
    if (cudaGetDevice(&device) != cudaSuccess || device < 0) return 0;
    if (device < kMaxDevices) {
      const int cached = values_[device].load(std::memory_order_relaxed);
      if (cached > 0) return cached;
    }
    const int value = query(device);
    if (value > 0 && device < kMaxDevices) values_[device].store(value, std::memory_order_relaxed);
    return value;
  }

 private:
  static constexpr int kMaxDevices = 64;
  std::atomic<int> values_[kMaxDevices] = {};
};

// Number of streaming multiprocessors of the current device, cached per device (queried once;
// no synchronisation, safe during CUDA-graph capture). Returns 0 when the query fails.
int current_device_sm_count();

// The current device's compute capability major (9 on H100/H200), cached per device. Returns 0
// when the query fails.
int current_device_major();

// The most dynamic shared memory one block of the current device may opt into
// (cudaDevAttrMaxSharedMemoryPerBlockOptin: 227 KiB on sm_90, 163 on sm_80, 99 on sm_86/89),
// cached per device. Returns 0 when the query fails.
int current_device_max_smem_per_block();

// Shared memory per SM (cudaDevAttrMaxSharedMemoryPerMultiprocessor: 228 KiB on sm_90, 164 on
// sm_80, 100 on sm_86/89), cached per device. Returns 0 when the query fails.
int current_device_smem_per_sm();

// Lets `kernel` launch with `bytes` of dynamic shared memory: past the default 48 KiB a kernel
// must ask for it (cudaFuncAttributeMaxDynamicSharedMemorySize); below, nothing to do. A host call,
// no synchronisation: safe during CUDA-graph capture.
template <typename Kernel>
cudaError_t allow_dynamic_smem(Kernel kernel, size_t bytes) {
  if (bytes <= 48 * 1024) return cudaSuccess;
  return cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes));
}

}  // namespace flashext
