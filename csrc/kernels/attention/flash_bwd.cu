// flashext FlashAttention backward: checks the params, picks the compiled head dim and dtype.
// The instantiations live in flash_bwd_hdim{64,128,256}.cu; the kernels in flash_bwd_kernel.cuh.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "dispatch.h"
#include "flash_bwd_kernel.cuh"
#include "flashext/attention.h"

namespace flashext {
namespace attention_detail {
template <typename T, int kHeadDim>
cudaError_t launch_flash_bwd(const FlashBwdParams& p, void* workspace, cudaStream_t stream);
}  // namespace attention_detail

size_t flash_bwd_workspace_bytes(const FlashBwdParams& p) {
  using namespace attention_detail;
  return with_kernel_head_dim(p.head_dim, size_t(0), [&](auto dim) { return bwd_workspace_bytes<decltype(dim)::value>(p); });
}

int flash_bwd_smem_bytes(int head_dim, int max_smem_per_block) {
  using namespace attention_detail;
  const int budget = max_smem_per_block > 0 ? max_smem_per_block : current_device_max_smem_per_block();
  return with_kernel_head_dim(head_dim, 0, [&](auto dim) { return bwd_smem_bytes<decltype(dim)::value>(budget); });
}

cudaError_t run_flash_bwd(const FlashBwdParams& p, void* workspace, cudaStream_t stream) {
  if (p.batch < 0 || p.heads <= 0 || p.heads_kv <= 0 || p.heads % p.heads_kv != 0 || p.seqlen_q < 0 ||
      p.seqlen_k < 0 || flash_fwd_kernel_head_dim(p.head_dim) == 0 || p.lse == nullptr ||
      (p.cu_seqlens_q == nullptr) != (p.cu_seqlens_k == nullptr) || (workspace == nullptr && flash_bwd_workspace_bytes(p) > 0)) {
    return cudaErrorInvalidValue;
  }
  if (p.batch == 0) return cudaSuccess;
  using namespace attention_detail;
  return with_16bit_type(p.dtype, cudaErrorInvalidValue, [&](auto type) {
    return with_kernel_head_dim(p.head_dim, cudaErrorInvalidValue, [&](auto dim) {
      return launch_flash_bwd<typename decltype(type)::type, decltype(dim)::value>(p, workspace, stream);
    });
  });
}

}  // namespace flashext
