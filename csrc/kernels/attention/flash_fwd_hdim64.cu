// flashext FlashAttention forward, head dim 64 (fp16 and bf16): one translation unit per head
// dim so the builds run in parallel. Kernel: flash_fwd_kernel.cuh.
#include "flash_fwd_kernel.cuh"

namespace flashext {
namespace attention_detail {

template cudaError_t launch_flash_fwd<__half, 64>(const FlashFwdParams&, cudaStream_t);
template cudaError_t launch_flash_fwd<__nv_bfloat16, 64>(const FlashFwdParams&, cudaStream_t);

}  // namespace attention_detail
}  // namespace flashext
