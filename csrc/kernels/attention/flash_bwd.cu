// flashext FlashAttention backward: checks the params, picks the compiled head dim and dtype.
// The instantiations live in flash_bwd_hdim{64,128,256}.cu; the kernels in flash_bwd_kernel.cuh.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "flash_bwd_kernel.cuh"
#include "flashext/attention.h"

namespace flashext {
namespace attention_detail {
template <typename T, int kHeadDim>
cudaError_t launch_flash_bwd(const FlashBwdParams& p, void* workspace, cudaStream_t stream);
}  // namespace attention_detail

size_t flash_bwd_workspace_bytes(const FlashBwdParams& p) {
  using namespace attention_detail;
  return flash_fwd_kernel_head_dim(p.head_dim) == 0 ? 0 : bwd_workspace_bytes<64>(p);  // every head dim: kBlockM 64
}

int flash_bwd_smem_bytes(int head_dim, int max_smem_per_block) {
  using namespace attention_detail;
  const int budget = max_smem_per_block > 0 ? max_smem_per_block : current_device_max_smem_per_block();
  switch (flash_fwd_kernel_head_dim(head_dim)) {
    case 64: return bwd_smem_bytes<64>(budget);
    case 128: return bwd_smem_bytes<128>(budget);
    case 256: return bwd_smem_bytes<256>(budget);
  }
  return 0;
}

namespace {
template <typename T>
cudaError_t dispatch_head_dim(const FlashBwdParams& p, void* workspace, cudaStream_t stream) {
  using namespace attention_detail;
  switch (flash_fwd_kernel_head_dim(p.head_dim)) {
    case 64: return launch_flash_bwd<T, 64>(p, workspace, stream);
    case 128: return launch_flash_bwd<T, 128>(p, workspace, stream);
    case 256: return launch_flash_bwd<T, 256>(p, workspace, stream);
  }
  return cudaErrorInvalidValue;
}
}  // namespace

cudaError_t run_flash_bwd(const FlashBwdParams& p, void* workspace, cudaStream_t stream) {
  if (p.batch < 0 || p.heads <= 0 || p.heads_kv <= 0 || p.heads % p.heads_kv != 0 || p.seqlen_q < 0 ||
      p.seqlen_k < 0 || flash_fwd_kernel_head_dim(p.head_dim) == 0 || p.lse == nullptr ||
      (p.cu_seqlens_q == nullptr) != (p.cu_seqlens_k == nullptr) || (workspace == nullptr && flash_bwd_workspace_bytes(p) > 0)) {
    return cudaErrorInvalidValue;
  }
  if (p.batch == 0) return cudaSuccess;
  switch (p.dtype) {
    case DType::kFloat16: return dispatch_head_dim<__half>(p, workspace, stream);
    case DType::kBFloat16: return dispatch_head_dim<__nv_bfloat16>(p, workspace, stream);
    default: return cudaErrorInvalidValue;
  }
}

}  // namespace flashext
