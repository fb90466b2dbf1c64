// flashext: facts about the current CUDA device that launch planning needs.
#pragma once

#include <cuda_runtime_api.h>

namespace flashext {

// Number of streaming multiprocessors of the current device, cached per device (queried once;
// no synchronisation, safe during CUDA-graph capture). Returns 0 when the query fails.
int current_device_sm_count();

}  // namespace flashext
