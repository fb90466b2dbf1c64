// flashext Hopper FlashAttention backward (flash_bwd_sm90.cu): kernels for D = 64 and 128,
// which take every head dim up to 128 (multiples of 8, on the next of them), dense or
// packed varlen batches, fp16 / bf16, full, causal or windowed attention, soft-cap, GQA, dQ added
// atomically or (deterministic) in key block order. The torch layer (csrc/torch/attention.cpp)
// calls it for the calls it takes on a Hopper GPU, run_flash_bwd (the FA2-design kernels) otherwise;
// FlashBwdKernel.Sm90AgainstCpuReference (tests/cpp/test_attention_backward.cpp) checks it against
// the CPU reference. It takes run_flash_bwd's params and workspace (flash_bwd_workspace_bytes).
#pragma once

#include <cuda_runtime_api.h>

#include "flashext/attention.h"

namespace flashext {

// Whether these params are ones the Hopper backward takes (the rest: cudaErrorInvalidValue from the
// run): the scope above, seqlen_q and seqlen_k > 0, varlen with both cu_seqlens and 0 < total_q,
// total_k ≤ INT32_MAX, and q, k, v, dout, dk, dv 16-byte aligned with strides of whole 16-byte
// chunks (its TMA maps).
bool flash_bwd_sm90_takes(const FlashBwdParams& params);

cudaError_t run_flash_bwd_sm90(const FlashBwdParams& params, void* workspace, cudaStream_t stream);

}  // namespace flashext
