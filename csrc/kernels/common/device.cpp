#include "device.h"

namespace flashext {

int current_device_sm_count() {
  static PerDeviceValue sm_count;
  return sm_count.get([](int device) {
    int count = 0;
    return cudaDeviceGetAttribute(&count, cudaDevAttrMultiProcessorCount, device) == cudaSuccess ? count : 0;
  });
}

int current_device_max_smem_per_block() {
  static PerDeviceValue bytes;
  return bytes.get([](int device) {
    int value = 0;
    return cudaDeviceGetAttribute(&value, cudaDevAttrMaxSharedMemoryPerBlockOptin, device) == cudaSuccess ? value : 0;
  });
}

}  // namespace flashext
