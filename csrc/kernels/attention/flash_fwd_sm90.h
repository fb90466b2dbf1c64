// flashext Hopper FlashAttention forward (flash_fwd_sm90.cu): not yet dispatched to by
// run_flash_fwd; FlashFwdKernel.Sm90AgainstCpuReference (tests/cpp/test_attention.cpp) and
// tests/test_attention_sm90.py (through the private op flashext::_flash_attn_fwd_sm90) check it
// against the references, and bench_attention times it as flashext_sm90.
// D = 128, dense batch, fp16 / bf16, seqlen_k > 0; every other FlashFwdParams option as run_flash_fwd.
#pragma once

#include <cuda_runtime_api.h>

#include "flashext/attention.h"

namespace flashext {

cudaError_t run_flash_fwd_sm90(const FlashFwdParams& params, cudaStream_t stream);

// Whether a GPU of this compute capability can run it from this build (sm_90 and sm_90a code).
bool flash_fwd_sm90_supported(int major, int minor);

}  // namespace flashext
