// flashext FlashAttention forward: checks the params, picks the compiled head dim and dtype.
// The instantiations live in flash_fwd_hdim{64,128,256}.cu (block-sparse: flash_fwd_sparse_hdim*.cu).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "flashext/attention.h"

namespace flashext {
namespace attention_detail {
template <typename T, int kHeadDim>
cudaError_t launch_flash_fwd(const FlashFwdParams& p, cudaStream_t stream);
template <typename T, int kHeadDim>
cudaError_t launch_flash_fwd_sparse(const FlashFwdParams& p, void* workspace, cudaStream_t stream);
template <int kHeadDim>
int64_t sparse_plan_ints(const FlashFwdParams& p, int& stride);
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

template <typename T>
cudaError_t dispatch_sparse_head_dim(const FlashFwdParams& p, void* workspace, cudaStream_t stream) {
  using namespace attention_detail;
  switch (flash_fwd_kernel_head_dim(p.head_dim)) {
    case 64: return launch_flash_fwd_sparse<T, 64>(p, workspace, stream);
    case 128: return launch_flash_fwd_sparse<T, 128>(p, workspace, stream);
    case 256: return launch_flash_fwd_sparse<T, 256>(p, workspace, stream);
  }
  return cudaErrorInvalidValue;
}

bool fwd_params_ok(const FlashFwdParams& p) {
  return p.batch >= 0 && p.heads > 0 && p.heads_kv > 0 && p.heads % p.heads_kv == 0 && p.seqlen_q >= 0 &&
         p.seqlen_k >= 0 && flash_fwd_kernel_head_dim(p.head_dim) != 0 &&
         (p.cu_seqlens_q == nullptr) == (p.cu_seqlens_k == nullptr);
}
}  // namespace

cudaError_t run_flash_fwd(const FlashFwdParams& p, cudaStream_t stream) {
  if (!fwd_params_ok(p)) return cudaErrorInvalidValue;
  if (p.batch == 0 || p.seqlen_q == 0) return cudaSuccess;
  switch (p.dtype) {
    case DType::kFloat16: return dispatch_head_dim<__half>(p, stream);
    case DType::kBFloat16: return dispatch_head_dim<__nv_bfloat16>(p, stream);
    default: return cudaErrorInvalidValue;
  }
}

size_t flash_block_sparse_workspace_bytes(const FlashFwdParams& p) {
  using namespace attention_detail;
  int stride = 0;
  switch (flash_fwd_kernel_head_dim(p.head_dim)) {
    case 64: return size_t(sparse_plan_ints<64>(p, stride)) * sizeof(int);
    case 128: return size_t(sparse_plan_ints<128>(p, stride)) * sizeof(int);
    case 256: return size_t(sparse_plan_ints<256>(p, stride)) * sizeof(int);
  }
  return 0;
}

cudaError_t run_flash_block_sparse_fwd(const FlashFwdParams& p, void* workspace, cudaStream_t stream) {
  if (!fwd_params_ok(p) || p.cu_seqlens_q != nullptr || p.block_mask == nullptr || p.block_rows < 1 ||
      p.block_cols < 1 || (workspace == nullptr && flash_block_sparse_workspace_bytes(p) > 0)) {
    return cudaErrorInvalidValue;
  }
  if (p.batch == 0 || p.seqlen_q == 0) return cudaSuccess;
  switch (p.dtype) {
    case DType::kFloat16: return dispatch_sparse_head_dim<__half>(p, workspace, stream);
    case DType::kBFloat16: return dispatch_sparse_head_dim<__nv_bfloat16>(p, workspace, stream);
    default: return cudaErrorInvalidValue;
  }
}

}  // namespace flashext
