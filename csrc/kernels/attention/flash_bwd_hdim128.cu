// flashext FlashAttention backward, head dim 128 (fp16 and bf16): one translation unit per head
// dim so the builds run in parallel. Kernels: flash_bwd_kernel.cuh.
#include "flash_bwd_kernel.cuh"

namespace flashext {
namespace attention_detail {

template cudaError_t launch_flash_bwd<__half, 128>(const FlashBwdParams&, void*, cudaStream_t);
template cudaError_t launch_flash_bwd<__nv_bfloat16, 128>(const FlashBwdParams&, void*, cudaStream_t);

}  // namespace attention_detail
}  // namespace flashext
