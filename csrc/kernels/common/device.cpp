#include "device.h"

namespace flashext {

int current_device_sm_count() {
  static PerDeviceValue sm_count;
  return sm_count.get([](int device) {
    int count = 0;
    return cudaDeviceGetAttribute(&count, cudaDevAttrMultiProcessorCount, device) == cudaSuccess ? count : 0;
  });
}

}  // namespace flashext
