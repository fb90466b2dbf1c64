// flashext Hopper FlashAttention forward, version 0 (flash_fwd_sm90.cu): not yet dispatched to by
// run_flash_fwd; FlashFwdKernel.Sm90AgainstCpuReference (tests/cpp/test_attention.cpp) checks it
// against the CPU reference first.
// D = 128, dense batch, fp16 / bf16, seqlen_k > 0; every other FlashFwdParams option as run_flash_fwd.
#pragma once

#include <cuda_runtime_api.h>

#include "flashext/attention.h"

namespace flashext {

cudaError_t run_flash_fwd_sm90(const FlashFwdParams& params, cudaStream_t stream);

}  // namespace flashext
