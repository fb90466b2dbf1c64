// flashext: facts about the current CUDA device that launch planning needs.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>

namespace flashext {

// Number of streaming multiprocessors of the current device, cached per device (queried once;
// no synchronisation, safe during CUDA-graph capture). Returns 0 when the query fails.
int current_device_sm_count();

// Lets `kernel` launch with `bytes` of dynamic shared memory: past the default 48 KiB a kernel
// must ask for it (cudaFuncAttributeMaxDynamicSharedMemorySize); below, nothing to do. A host call,
// no synchronisation: safe during CUDA-graph capture.
template <typename Kernel>
cudaError_t allow_dynamic_smem(Kernel kernel, size_t bytes) {
  if (bytes <= 48 * 1024) return cudaSuccess;
  return cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes));
}

}  // namespace flashext
