// flashext FlashAttention forward: checks the params, picks the compiled head dim and dtype.
// The instantiations live in flash_fwd_hdim{64,128,256}.cu.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "flashext/attention.h"

namespace flashext {
namespace attention_detail {
template <typename T, int kHeadDim>
cudaError_t launch_flash_fwd(const FlashFwdParams& p, cudaStream_t stream);
}  // namespace attention_detail

int flash_fwd_kernel_head_dim(int head_dim) {
  if (head_dim <= 0 || head_dim % 8 != 0 || head_dim > 256) return 0;
  return head_dim <= 64 ? 64 : head_dim <= 128 ? 128 : 256;
}

namespace {
template <typename T>
cudaError_t dispatch_head_dim(const FlashFwdParams& p, cudaStream_t stream) {
  using namespace attention_detail;
  switch (flash_fwd_kernel_head_dim(p.head_dim)) {
    case 64: return launch_flash_fwd<T, 64>(p, stream);
    case 128: return launch_flash_fwd<T, 128>(p, stream);
    case 256: return launch_flash_fwd<T, 256>(p, stream);
  }
  return cudaErrorInvalidValue;
}
}  // namespace

cudaError_t run_flash_fwd(const FlashFwdParams& p, cudaStream_t stream) {
  if (p.batch < 0 || p.heads <= 0 || p.heads_kv <= 0 || p.heads % p.heads_kv != 0 || p.seqlen_q < 0 ||
      p.seqlen_k < 0 || flash_fwd_kernel_head_dim(p.head_dim) == 0 ||
      (p.cu_seqlens_q == nullptr) != (p.cu_seqlens_k == nullptr)) {
    return cudaErrorInvalidValue;
  }
  if (p.batch == 0 || p.seqlen_q == 0) return cudaSuccess;
  switch (p.dtype) {
    case DType::kFloat16: return dispatch_head_dim<__half>(p, stream);
    case DType::kBFloat16: return dispatch_head_dim<__nv_bfloat16>(p, stream);
    default: return cudaErrorInvalidValue;
  }
}

}  // namespace flashext
