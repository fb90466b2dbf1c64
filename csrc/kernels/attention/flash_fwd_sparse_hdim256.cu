// flashext block-sparse FlashAttention forward, head dim 256 (fp16 and bf16): the plan kernel and
// flash_fwd_kernel's kSparse form, one translation unit per head dim. Kernels: flash_fwd_kernel.cuh.
#include "flash_fwd_kernel.cuh"

namespace flashext {
namespace attention_detail {

template int64_t sparse_plan_ints<256>(const FlashFwdParams&);
template cudaError_t launch_flash_fwd_sparse<__half, 256>(const FlashFwdParams&, void*, cudaStream_t);
template cudaError_t launch_flash_fwd_sparse<__nv_bfloat16, 256>(const FlashFwdParams&, void*, cudaStream_t);

}  // namespace attention_detail
}  // namespace flashext
