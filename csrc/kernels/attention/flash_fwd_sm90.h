// flashext Hopper FlashAttention forward (flash_fwd_sm90.cu): flash_attention's and
// flash_attention_varlen's forward on sm_90 at head dims over 64, and at D <= 64 from 512 keys
// (the torch glue dispatches, csrc/torch/attention.cpp; run_flash_fwd stays
// the FA2-design kernel);
// FlashFwdKernel.Sm90AgainstCpuReference (tests/cpp/test_attention.cpp) and
// tests/test_attention_sm90.py (through the private op flashext::_flash_attn_fwd_sm90) check it
// against the references at every head dim it takes, and bench_attention times it as flashext_sm90.
// Kernels for D = 64, 128 and 256, which take every multiple of 8 up to 256 (as run_flash_fwd:
// flash_fwd_kernel_head_dim; the maps read the columns past the head dim as zeros, the epilogue
// stores O's own); dense or varlen, fp16 / bf16, seqlen_k > 0 (varlen: total_q, total_k > 0), no
// block mask, no zero strides (TMA maps); every other FlashFwdParams option as run_flash_fwd.
// Calls of 2^28 tiles or more (query blocks × heads × sequences; none through torch) run the
// FA2-design kernel instead (the tile walk's indices are 31-bit).
#pragma once

#include <cuda_runtime_api.h>

#include "flashext/attention.h"

namespace flashext {

cudaError_t run_flash_fwd_sm90(const FlashFwdParams& params, cudaStream_t stream);

// Whether a GPU of this compute capability can run it from this build (sm_90 and sm_90a code).
bool flash_fwd_sm90_supported(int major, int minor);

}  // namespace flashext
